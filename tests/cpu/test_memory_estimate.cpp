// The preflight memory estimate (models/memory_estimate.h, flame_model_estimate_memory) on the CPU:
// parameter bytes exact (known full-size counts and tiny configs), the exact adapter sizes of
// diffusers' default targets, the estimate's behaviour (monotonic in batch and resolution, lower
// with checkpointing, a quantised base and offload), request errors, and the full-size table
// against FLAME's measured H200 peaks (bench/RESULTS.md T6), each within 15%.
#include <gtest/gtest.h>
#include <cmath>
#include <cstdio>
#include <string>
#include "flame.h"

namespace {

const char* kSdxlConfig =
    R"({"sample_size": 128, "in_channels": 4, "out_channels": 4,
        "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
        "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
        "block_out_channels": [320, 640, 1280], "layers_per_block": 2, "transformer_layers_per_block": [1, 2, 10],
        "attention_head_dim": [5, 10, 20], "cross_attention_dim": 2048, "use_linear_projection": true,
        "norm_num_groups": 32, "addition_embed_type": "text_time", "addition_time_embed_dim": 256,
        "projection_class_embeddings_input_dim": 2816})";
const char* kFluxDevConfig =
    R"({"patch_size": 1, "in_channels": 64, "num_layers": 19, "num_single_layers": 38, "attention_head_dim": 128,
        "num_attention_heads": 24, "joint_attention_dim": 4096, "pooled_projection_dim": 768, "guidance_embeds": true,
        "axes_dims_rope": [16, 56, 56]})";
const char* kSd35MediumConfig =
    R"({"sample_size": 128, "patch_size": 2, "in_channels": 16, "num_layers": 24, "attention_head_dim": 64,
        "num_attention_heads": 24, "joint_attention_dim": 4096, "caption_projection_dim": 1536,
        "pooled_projection_dim": 2048, "out_channels": 16, "pos_embed_max_size": 384,
        "dual_attention_layers": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], "qk_norm": "rms_norm"})";
const char* kTinyFluxConfig =
    R"({"num_layers": 2, "num_single_layers": 2, "attention_head_dim": 16, "num_attention_heads": 2,
        "joint_attention_dim": 32, "pooled_projection_dim": 16, "in_channels": 16, "axes_dims_rope": [4, 6, 6]})";
const char* kTinyUnetConfig =
    R"({"in_channels": 4, "out_channels": 4, "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D"],
        "up_block_types": ["CrossAttnUpBlock2D", "UpBlock2D"], "block_out_channels": [32, 64], "layers_per_block": 1,
        "transformer_layers_per_block": [1, 1], "attention_head_dim": [2, 4], "cross_attention_dim": 32,
        "use_linear_projection": true, "norm_num_groups": 8})";

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string request(const char* arch, const char* config, const std::string& extra) {
  return std::string("{\"architecture\": \"") + arch + "\", \"config\": " + config + (extra.empty() ? "" : ", ") + extra + "}";
}

flame_memory_estimate_t estimate_of(const std::string& req) {
  flame_memory_estimate_t e;
  e.struct_size = sizeof e;
  EXPECT_EQ(flame_model_estimate_memory(req.c_str(), &e), FLAME_OK) << flame_last_error_message() << "\n" << req;
  return e;
}

// The bench's LoRA rows: bf16, rank 16 (alpha 16, f32 A/B) on diffusers' default targets, AdamW.
const std::string kBenchLora = R"("options": {"dtype": "bf16"}, "lora": {"rank": 16, "alpha": 16})";

TEST(MemoryEstimate, ParameterCountsOfTheFullSizeModels) {
  // diffusers' sum(p.numel()) of the same configs (SDXL-base UNet 2,567,463,684; Flux-dev 11,901,408,320).
  EXPECT_EQ(estimate_of(request("UNet2DConditionModel", kSdxlConfig, kBenchLora)).parameter_count, 2567463684ull);
  EXPECT_EQ(estimate_of(request("FluxTransformer2DModel", kFluxDevConfig, kBenchLora)).parameter_count, 11901408320ull);
}

TEST(MemoryEstimate, WeightBytesFollowDtypeAndQuantize) {
  const flame_memory_estimate_t f32 = estimate_of(request("FluxTransformer2DModel", kTinyFluxConfig, ""));
  const flame_memory_estimate_t bf16 =
      estimate_of(request("FluxTransformer2DModel", kTinyFluxConfig, R"("options": {"dtype": "bf16"})"));
  EXPECT_EQ(f32.weights_bytes, 4 * f32.parameter_count);
  EXPECT_EQ(bf16.weights_bytes, 2 * bf16.parameter_count);
  // fp8: each linear weight 1 byte per element plus a 4-byte scale (per tensor) or 4 per row.
  const flame_memory_estimate_t q = estimate_of(request(
      "FluxTransformer2DModel", kTinyFluxConfig, R"("options": {"dtype": "bf16", "quantize": {"scale": "tensor"}})"));
  const flame_memory_estimate_t r = estimate_of(request(
      "FluxTransformer2DModel", kTinyFluxConfig, R"("options": {"dtype": "bf16", "quantize": {"scale": "row"}})"));
  EXPECT_LT(q.weights_bytes, bf16.weights_bytes);
  EXPECT_GT(q.weights_bytes, bf16.weights_bytes / 2);
  EXPECT_GT(r.weights_bytes, q.weights_bytes);  // [out, 1] scales instead of one
  // tiny Flux: the linear layers' weights hold every element but the norms' and biases'; per tensor:
  // bf16 bytes - fp8 bytes = linear elements - 4 per linear layer.
  const uint64_t linear_elements_minus_scales = bf16.weights_bytes - q.weights_bytes;
  EXPECT_GT(linear_elements_minus_scales, bf16.parameter_count / 2);
}

TEST(MemoryEstimate, Nf4WeightsAtHalfAByteWithBlockStatistics) {
  // Flux-dev: every linear layer's rows are multiples of 3072, so every block size divides them.
  auto bytes = [](const char* quantize) {
    return estimate_of(request("FluxTransformer2DModel", kFluxDevConfig,
                               std::string(R"("options": {"dtype": "bf16", "quantize": )") + quantize + "}"))
        .weights_bytes;
  };
  const uint64_t bf16 = estimate_of(request("FluxTransformer2DModel", kFluxDevConfig, R"("options": {"dtype": "bf16"})")).weights_bytes;
  const uint64_t b16 = bytes(R"({"dtype": "nf4", "block_size": 16, "double_quant": false})");
  const uint64_t b32 = bytes(R"({"dtype": "nf4", "block_size": 32, "double_quant": false})");
  // L linear elements: 2L bytes in bf16, L / 2 + 4 L / block without double quantisation, so
  // b16 - b32 = L / 8 and bf16 - b16 = 2L - L / 2 - L / 4 = 10 (L / 8).
  ASSERT_GT(b16, b32);
  const uint64_t eighth = b16 - b32, linear = 8 * eighth;
  EXPECT_EQ(bf16 - b16, 10 * eighth);
  EXPECT_GT(linear, bf16 / 2 * 9 / 10) << "Flux-dev's linear weights are most of its parameters";
  // the defaults (block 64, double quantisation): L / 2 + L / 64 (8-bit absmax) + 4 bytes per 256
  // blocks + 4 per layer, at most 0.3 of bf16's 2L
  const uint64_t dq = bytes(R"({"dtype": "nf4"})");
  const uint64_t other = bf16 - 2 * linear;
  const uint64_t linear_dq = dq - other;
  EXPECT_GE(linear_dq, linear / 2 + linear / 64 + linear / 64 / 256 * 4);
  EXPECT_LE(linear_dq, linear / 2 + linear / 64 + linear / 64 / 256 * 4 + 8 * 1000);  // < 1000 layers: a partial chunk and a mean each
  EXPECT_LE(static_cast<double>(linear_dq), 0.3 * static_cast<double>(2 * linear));
  EXPECT_LT(dq, bytes(R"({"dtype": "nf4", "double_quant": false})"));
}

TEST(MemoryEstimate, AdapterSizesOfDiffusersDefaultTargets) {
  // SDXL: to_q, to_k, to_v, to_out.0 of attn1 and attn2 in 10 blocks of width 640 and 60 of 1280
  // (cross-attention k / v from 2048): 16 x (224 C + 4096) per block.
  const flame_memory_estimate_t sdxl = estimate_of(request("UNet2DConditionModel", kSdxlConfig, kBenchLora));
  EXPECT_EQ(sdxl.trainable_count, 10ull * (224 * 640 + 65536) + 60ull * (224 * 1280 + 65536));
  EXPECT_EQ(sdxl.adapter_bytes, 4 * sdxl.trainable_count);
  EXPECT_EQ(sdxl.gradient_bytes, sdxl.adapter_bytes);
  EXPECT_EQ(sdxl.optimizer_bytes, 8 * sdxl.trainable_count);  // AdamW: two f32 moments
  // Flux-dev: 19 double blocks x (8 attention projections 16 x 6144 + 4 feed-forward layers
  // 16 x 15360) + 38 single blocks x 3 x 16 x 6144.
  const flame_memory_estimate_t flux = estimate_of(request("FluxTransformer2DModel", kFluxDevConfig, kBenchLora));
  EXPECT_EQ(flux.trainable_count, 19ull * (8 * 16 * 6144 + 4 * 16 * 15360) + 38ull * 3 * 16 * 6144);
  // rank_pattern and Lion.
  const flame_memory_estimate_t patterned = estimate_of(request(
      "FluxTransformer2DModel", kFluxDevConfig,
      R"("options": {"dtype": "bf16"}, "lora": {"rank": 16, "rank_pattern": {"ff.net.2": 32}}, "optimizer": "lion")"));
  EXPECT_EQ(patterned.trainable_count, flux.trainable_count + 19ull * 16 * 15360);
  EXPECT_EQ(patterned.optimizer_bytes, 4 * patterned.trainable_count);
  // 8-bit moments (flame_optimizer_set_state_bits): a byte per element and moment plus an f32 per 256.
  for (const char* name : {"adamw8bit", "lion8bit"}) {
    SCOPED_TRACE(name);
    const flame_memory_estimate_t q = estimate_of(request(
        "FluxTransformer2DModel", kFluxDevConfig,
        std::string(R"("options": {"dtype": "bf16"}, "lora": {"rank": 16}, "optimizer": ")") + name + "\""));
    const uint64_t moments = std::string(name) == "lion8bit" ? 1 : 2;
    EXPECT_EQ(q.trainable_count, flux.trainable_count);
    EXPECT_EQ(q.optimizer_bytes, moments * (q.trainable_count + 4 * ((q.trainable_count + 255) / 256)));
  }
  // LoKr (LyCORIS' factorization, factor -1): a [3072, 3072] projection is kron(W1 [48, 48],
  // W2 [64, 64]) with W2 low rank at rank 16 (16 < 64 / 2): 48 x 48 + 2 x 64 x 16 = 4352 elements; a
  // [12288, 3072] or [3072, 12288] feed-forward layer has W1 [96, 48] (or [48, 96]) and W2 [128, 64]
  // (or [64, 128]) as 128 x 16 + 16 x 64: 4608 + 3072 = 7680.
  const flame_memory_estimate_t lokr = estimate_of(request(
      "FluxTransformer2DModel", kFluxDevConfig, R"("options": {"dtype": "bf16"}, "lora": {"type": "lokr", "rank": 16})"));
  EXPECT_EQ(lokr.trainable_count, 19ull * (8 * 4352 + 4 * 7680) + 38ull * 3 * 4352);
  EXPECT_EQ(lokr.adapter_bytes, 4 * lokr.trainable_count);
  // decompose_both makes W1 low rank too where rank < max(a, b) / 2 (16 < 24 and 16 < 48):
  // [3072, 3072]: 2 x 48 x 16 + 2 x 64 x 16; feed-forward: (96 + 48) x 16 + (128 + 64) x 16.
  const flame_memory_estimate_t both = estimate_of(request(
      "FluxTransformer2DModel", kFluxDevConfig,
      R"("options": {"dtype": "bf16"}, "lora": {"type": "lokr", "rank": 16, "decompose_both": true})"));
  EXPECT_EQ(both.trainable_count, 19ull * (8 * 3584 + 4 * 5376) + 38ull * 3 * 3584);
  // A full fine-tune trains every parameter.
  const flame_memory_estimate_t full =
      estimate_of(request("FluxTransformer2DModel", kTinyFluxConfig, R"("options": {"dtype": "bf16"}, "lora": null)"));
  EXPECT_EQ(full.trainable_count, full.parameter_count);
  EXPECT_EQ(full.gradient_bytes, 2 * full.parameter_count);
  EXPECT_EQ(full.adapter_bytes, 0u);
}

TEST(MemoryEstimate, ActivationsGrowWithBatchAndResolutionAndShrinkWithCheckpointing) {
  for (const auto& model : {std::pair<const char*, const char*>{"UNet2DConditionModel", kTinyUnetConfig},
                            {"FluxTransformer2DModel", kTinyFluxConfig},
                            {"SD3Transformer2DModel", kSd35MediumConfig}}) {
    // Named copies, not structured bindings: C++17 lambdas cannot capture those (clang refuses).
    const char* const arch = model.first;
    const char* const config = model.second;
    SCOPED_TRACE(arch);
    auto act = [&](int b, int res, int ckpt) {
      const std::string extra = R"("options": {"dtype": "bf16"}, "batch": )" + std::to_string(b) +
                                ", \"height\": " + std::to_string(res) + ", \"width\": " + std::to_string(res) +
                                ", \"checkpointing\": " + std::to_string(ckpt) + ", \"text_tokens\": 16";
      return estimate_of(request(arch, config, extra));
    };
    const flame_memory_estimate_t base = act(1, 256, 0), b2 = act(2, 256, 0), big = act(1, 512, 0), ck = act(1, 256, 1);
    EXPECT_GT(b2.activation_bytes, base.activation_bytes);
    EXPECT_NEAR(static_cast<double>(b2.activation_bytes) / static_cast<double>(base.activation_bytes), 2.0, 0.01);
    EXPECT_GT(big.activation_bytes, 3 * base.activation_bytes);  // 4x the image tokens, 16 text tokens
    EXPECT_LT(ck.activation_bytes, base.activation_bytes);
    EXPECT_LT(act(1, 256, 2).activation_bytes, base.activation_bytes);
    EXPECT_EQ(ck.weights_bytes, base.weights_bytes);
    EXPECT_EQ(base.total_bytes, base.weights_bytes + base.adapter_bytes + base.gradient_bytes + base.optimizer_bytes +
                                    base.activation_bytes + base.workspace_bytes);
  }
}

TEST(MemoryEstimate, OffloadKeepsTheBudgetOrFails) {
  const std::string budget12 =
      R"("options": {"dtype": "bf16", "offload": {"budget_bytes": 12884901888}}, "lora": {"rank": 16}, "checkpointing": 1)";
  const flame_memory_estimate_t off = estimate_of(request("FluxTransformer2DModel", kFluxDevConfig, budget12));
  EXPECT_LE(off.weights_bytes, 12884901888ull);
  EXPECT_GT(off.weights_bytes, 10ull << 30);
  flame_memory_estimate_t e;
  e.struct_size = sizeof e;
  const std::string impossible = request("FluxTransformer2DModel", kFluxDevConfig,
                                         R"("options": {"dtype": "bf16", "offload": {"budget_bytes": 1000}})");
  EXPECT_EQ(flame_model_estimate_memory(impossible.c_str(), &e), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("cannot be met"), std::string::npos) << flame_last_error_message();
  EXPECT_EQ(e.total_bytes, 0u);
}

TEST(MemoryEstimate, BadRequestsFailNamingTheProblem) {
  flame_memory_estimate_t e;
  e.struct_size = sizeof e;
  auto fails = [&](const std::string& req, flame_status_t want, const char* piece) {
    e.total_bytes = 123;
    EXPECT_EQ(flame_model_estimate_memory(req.c_str(), &e), want) << req;
    EXPECT_NE(std::string(flame_last_error_message()).find(piece), std::string::npos) << flame_last_error_message();
    EXPECT_EQ(e.total_bytes, 0u);
  };
  fails("{", FLAME_ERROR_INVALID_ARGUMENT, "not valid JSON");
  fails(R"({"architecture": "CLIPTextModel"})", FLAME_ERROR_UNSUPPORTED, "CLIPTextModel");
  fails(request("FluxTransformer2DModel", kTinyFluxConfig, R"("batchsize": 2)"), FLAME_ERROR_INVALID_ARGUMENT, "batchsize");
  fails(request("FluxTransformer2DModel", kTinyFluxConfig, R"("batch": 0)"), FLAME_ERROR_INVALID_ARGUMENT, "batch");
  fails(request("FluxTransformer2DModel", kTinyFluxConfig, R"("height": 100)"), FLAME_ERROR_INVALID_ARGUMENT, "multiples of 8");
  fails(request("FluxTransformer2DModel", kTinyFluxConfig, R"("optimizer": "adagrad")"), FLAME_ERROR_INVALID_ARGUMENT, "adagrad");
  fails(request("FluxTransformer2DModel", kTinyFluxConfig, R"("lora": {"targets": ["nope"]})"), FLAME_ERROR_INVALID_ARGUMENT,
        "nope");
  fails(request("FluxTransformer2DModel", kTinyFluxConfig, R"("options": {"dtype": "f7"})"), FLAME_ERROR_INVALID_ARGUMENT, "dtype");
  fails(R"({"path": "/nonexistent/flame/model.safetensors"})", FLAME_ERROR_IO, "/nonexistent/flame/model.safetensors");
  e.struct_size = 8;
  EXPECT_EQ(flame_model_estimate_memory(request("FluxTransformer2DModel", kTinyFluxConfig, "").c_str(), &e),
            FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(flame_model_estimate_memory(nullptr, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
}

// The full-size rows against FLAME's measured peaks (bench/RESULTS.md T6, H200, peak_bytes_in_use
// over the timed steps, weights included). The factors of memory_estimate.h were fitted on SDXL B=1
// (the UNet) and Flux-dev B=1 / SD3.5-medium B=1 together (MMDiT); the other rows are predictions.
TEST(MemoryEstimate, FullSizeRowsWithinFifteenPercentOfMeasuredPeaks) {
  struct Row {
    const char* name;
    const char* arch;
    const char* config;
    std::string extra;
    double measured_gib;
  };
  const std::string lora = R"("lora": {"rank": 16, "alpha": 16})";
  const Row rows[] = {
      {"SDXL B=1", "UNet2DConditionModel", kSdxlConfig, kBenchLora, 10.20},
      {"SDXL B=4", "UNet2DConditionModel", kSdxlConfig, kBenchLora + R"(, "batch": 4)", 25.47},
      {"SDXL B=4 ckpt", "UNet2DConditionModel", kSdxlConfig, kBenchLora + R"(, "batch": 4, "checkpointing": 1)", 7.51},
      {"Flux-dev B=1 ckpt", "FluxTransformer2DModel", kFluxDevConfig, kBenchLora + R"(, "checkpointing": 1)", 25.14},
      {"Flux-dev B=1", "FluxTransformer2DModel", kFluxDevConfig, kBenchLora, 44.84},
      {"SD3.5-medium B=1", "SD3Transformer2DModel", kSd35MediumConfig, kBenchLora, 10.30},
      {"Flux-dev fp8 ckpt", "FluxTransformer2DModel", kFluxDevConfig,
       R"("options": {"dtype": "bf16", "quantize": {"dtype": "f8_e4m3", "scale": "tensor"}}, "checkpointing": 1, )" + lora,
       14.13},
      {"Flux-dev offload 12 GiB ckpt", "FluxTransformer2DModel", kFluxDevConfig,
       R"("options": {"dtype": "bf16", "offload": {"budget_bytes": 12884901888}}, "checkpointing": 1, )" + lora, 14.38},
  };
  std::printf("| row | weights | adapter+grad+optim | activations | estimate GiB | measured GiB | error |\n");
  for (const Row& r : rows) {
    const flame_memory_estimate_t e = estimate_of(request(r.arch, r.config, r.extra));
    const double est = static_cast<double>(e.total_bytes) / kGiB;
    const double err = est / r.measured_gib - 1;
    std::printf("| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %+.1f%% |\n", r.name, static_cast<double>(e.weights_bytes) / kGiB,
                static_cast<double>(e.adapter_bytes + e.gradient_bytes + e.optimizer_bytes) / kGiB,
                static_cast<double>(e.activation_bytes) / kGiB, est, r.measured_gib, 100 * err);
    EXPECT_LT(std::fabs(err), 0.15) << r.name << ": estimate " << est << " GiB, measured " << r.measured_gib;
  }
}

}  // namespace

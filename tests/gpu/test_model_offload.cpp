// Offload of frozen block weights (the model option "offload") through the C ABI, on a tiny Flux and
// a tiny SDXL UNet with a LoRA adapter:
//  - 3 AdamW steps with every block offloaded (the least budget the model accepts, read from the
//    error of a budget of 1 byte) give the same losses and LoRA parameters, bit for bit, as the
//    resident model (same kernels: the weights only come from a ring slot), with checkpointing on
//    in both; the offloaded model keeps fewer bytes on the device (after the steps and at the peak of
//    steps 2-3), and its base parameters still read back as they were written;
//  - without checkpointing the offloaded blocks are checkpointed anyway (losses equal within f32
//    rounding: the first step runs resident, its blocks not checkpointed);
//  - an offloaded parameter turned trainable fails at forward, and works again once frozen;
//  - bad options fail at creation with FLAME_ERROR_INVALID_ARGUMENT and no model.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>
#include "flame_test.h"
#include "model_test_handles.h"

namespace {

class ModelOffload : public GpuTest {};

const char* const kFlux =
    R"({"num_layers": 2, "num_single_layers": 4, "attention_head_dim": 16, "num_attention_heads": 2,
        "in_channels": 16, "joint_attention_dim": 24, "pooled_projection_dim": 20, "guidance_embeds": true,
        "axes_dims_rope": [4, 6, 6]})";
const char* const kUnetSdxl = R"({"block_out_channels": [32, 48, 64], "layers_per_block": 2,
  "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
  "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
  "transformer_layers_per_block": [1, 2, 3], "attention_head_dim": [1, 2, 4], "cross_attention_dim": 40,
  "use_linear_projection": true, "norm_num_groups": 8, "addition_embed_type": "text_time",
  "addition_time_embed_dim": 8, "projection_class_embeddings_input_dim": 72})";

struct Case {
  const char* arch;
  const char* config;
  const char* output;
  const char* first_block_weight;  // a parameter of the first block (offloaded with every block)
};

const Case kFluxCase{"FluxTransformer2DModel", kFlux, "sample", "transformer_blocks.0.attn.to_q.weight"};
const Case kUnetCase{"UNet2DConditionModel", kUnetSdxl, "sample", "down_blocks.0.resnets.0.conv1.weight"};

void make_inputs(flame_ctx_t ctx, const Case& c, ParamsHandle& in) { make_tiny_model_inputs(ctx, c.arch, in); }

uint64_t bytes_in_use(flame_ctx_t ctx) {
  flame_memory_stats_t s{};
  s.struct_size = sizeof s;
  EXPECT_EQ(flame_ctx_memory_stats(ctx, &s), FLAME_OK);
  return s.bytes_in_use;
}

uint64_t peak_bytes(flame_ctx_t ctx) {
  flame_memory_stats_t s{};
  s.struct_size = sizeof s;
  EXPECT_EQ(flame_ctx_memory_stats(ctx, &s), FLAME_OK);
  return s.peak_bytes_in_use;
}

// A model of c with options, deterministic base weights and a LoRA adapter (rank 4, non-zero B).
void make_adapted_model(flame_ctx_t ctx, const Case& c, const char* options, ModelHandle& m, ParamsHandle& adapter) {
  ASSERT_EQ(flame_model_create(ctx, c.arch, c.config, options, &m.m), FLAME_OK) << flame_last_error_message();
  ParamsHandle ps;
  ASSERT_EQ(flame_model_params(m.m, &ps.p), FLAME_OK);
  fill_list(ps.p, 12345, 0.2f);
  ASSERT_EQ(flame_model_add_lora(m.m, R"({"rank": 4, "alpha": 8})", &adapter.p), FLAME_OK) << flame_last_error_message();
  fill_list(adapter.p, 777, 0.3f);
}

// One step's forward and loss (sum of the output's squares); OUT loss.
flame_status_t forward_loss(flame_model_t m, const Case& c, flame_params_t in, T& loss) {
  ParamsHandle out;
  flame_status_t st = flame_model_forward(m, in, &out.p);
  if (st != FLAME_OK) return st;
  flame_tensor_t y = nullptr;
  st = flame_params_find(out.p, c.output, &y);
  if (st != FLAME_OK || !y) return st != FLAME_OK ? st : FLAME_ERROR_INTERNAL;
  T sq;
  st = flame_mul(y, y, sq.out());
  if (st != FLAME_OK) return st;
  return flame_sum_all(sq.h, loss.out());
}

struct Training {
  std::vector<float> losses;
  std::vector<std::vector<float>> lora;  // every adapter tensor after the steps
  std::vector<std::vector<float>> base;  // every base parameter after the steps
  uint64_t kept_bytes = 0;               // bytes in use after the steps, less those before the model
  uint64_t peak_late = 0;                // peak bytes of steps 2 and 3, less those before the model
};

void train(flame_ctx_t ctx, const Case& c, const char* options, int64_t checkpoint_every, Training& r) {
  const uint64_t before = bytes_in_use(ctx);
  {
    ModelHandle m;
    ParamsHandle adapter;
    make_adapted_model(ctx, c, options, m, adapter);
    ASSERT_EQ(flame_model_set_checkpointing(m.m, checkpoint_every), FLAME_OK);
    ParamsHandle in;
    make_inputs(ctx, c, in);
    int64_t n = 0;
    ASSERT_EQ(flame_params_count(adapter.p, &n), FLAME_OK);
    std::vector<flame_tensor_t> trainable(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(flame_params_tensor(adapter.p, i, &trainable[i]), FLAME_OK);
    }
    flame_optimizer_options_t o;
    ASSERT_EQ(flame_optimizer_options_init(&o, FLAME_OPTIMIZER_ADAMW), FLAME_OK);
    o.lr = 1e-2;
    flame_optimizer_t opt = nullptr;
    ASSERT_EQ(flame_optimizer_create(ctx, &o, trainable.data(), n, &opt), FLAME_OK) << flame_last_error_message();
    for (int step = 0; step < 3; ++step) {
      if (step == 1) {
        ASSERT_EQ(flame_ctx_reset_peak_memory(ctx), FLAME_OK);
      }
      T loss;
      ASSERT_EQ(forward_loss(m.m, c, in.p, loss), FLAME_OK) << flame_last_error_message();
      r.losses.push_back(host_of(loss.h).at(0));
      ASSERT_EQ(flame_backward(ctx, loss.h, nullptr, 0), FLAME_OK) << flame_last_error_message();
      ASSERT_EQ(flame_optimizer_step(opt), FLAME_OK) << flame_last_error_message();
      ASSERT_EQ(flame_optimizer_zero_grad(opt, 1), FLAME_OK);
    }
    r.peak_late = peak_bytes(ctx) - before;
    r.kept_bytes = bytes_in_use(ctx) - before;
    for (flame_tensor_t t : trainable) r.lora.push_back(host_of(t));
    ParamsHandle ps;
    ASSERT_EQ(flame_model_params(m.m, &ps.p), FLAME_OK);
    int64_t np = 0;
    ASSERT_EQ(flame_params_count(ps.p, &np), FLAME_OK);
    for (int64_t i = 0; i < np; ++i) {
      flame_tensor_t t = nullptr;
      ASSERT_EQ(flame_params_tensor(ps.p, i, &t), FLAME_OK);
      r.base.push_back(host_of(t));
    }
    flame_optimizer_release(opt);
  }
}

// The least budget_bytes the model accepts with every frozen block offloaded, read from the error of
// a budget of one byte (which changes nothing: the model keeps working resident).
uint64_t least_budget(flame_ctx_t ctx, const Case& c, int slots = 2) {
  ModelHandle m;
  ParamsHandle adapter;
  const std::string options = R"({"offload": {"budget_bytes": 1, "slots": )" + std::to_string(slots) + "}}";
  make_adapted_model(ctx, c, options.c_str(), m, adapter);
  ParamsHandle in;
  make_inputs(ctx, c, in);
  T loss;
  EXPECT_EQ(forward_loss(m.m, c, in.p, loss), FLAME_ERROR_INVALID_ARGUMENT);
  const std::string msg = flame_last_error_message();
  EXPECT_NE(msg.find("cannot be met"), std::string::npos) << msg;
  const size_t end = msg.find(" bytes stay on the device");
  EXPECT_NE(end, std::string::npos) << msg;
  if (end == std::string::npos) return 0;
  size_t begin = end;
  while (begin > 0 && msg[begin - 1] >= '0' && msg[begin - 1] <= '9') --begin;
  return std::strtoull(msg.substr(begin, end - begin).c_str(), nullptr, 10);
}

void check_case(flame_ctx_t ctx, const Case& c) {
  SCOPED_TRACE(c.arch);
  const uint64_t least = least_budget(ctx, c);
  ASSERT_GT(least, 0u);
  const std::string offload = R"({"offload": {"budget_bytes": )" + std::to_string(least) + "}}";

  Training warm, resident, offloaded;
  train(ctx, c, nullptr, 1, warm);  // kernels, GEMM plans and workspaces made before the measured runs
  train(ctx, c, offload.c_str(), 1, offloaded);
  train(ctx, c, nullptr, 1, resident);
  ASSERT_EQ(offloaded.losses.size(), 3u);
  ASSERT_EQ(resident.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(offloaded.losses[i], resident.losses[i]) << "step " << i;
  EXPECT_NE(resident.losses[2], resident.losses[0]) << "the steps changed nothing";
  ASSERT_EQ(offloaded.lora.size(), resident.lora.size());
  for (size_t i = 0; i < resident.lora.size(); ++i) EXPECT_EQ(offloaded.lora[i], resident.lora[i]) << "adapter tensor " << i;
  ASSERT_EQ(offloaded.base.size(), resident.base.size());
  for (size_t i = 0; i < resident.base.size(); ++i) EXPECT_EQ(offloaded.base[i], resident.base[i]) << "base parameter " << i;
  EXPECT_LT(offloaded.kept_bytes, resident.kept_bytes);
  EXPECT_LT(offloaded.peak_late, resident.peak_late);
  std::printf("[ offload  ] %s: device bytes after 3 steps %llu resident, %llu offloaded (budget %llu); peak of steps "
              "2-3 %llu / %llu\n",
              c.arch, static_cast<unsigned long long>(resident.kept_bytes),
              static_cast<unsigned long long>(offloaded.kept_bytes), static_cast<unsigned long long>(least),
              static_cast<unsigned long long>(resident.peak_late), static_cast<unsigned long long>(offloaded.peak_late));
}

TEST_F(ModelOffload, FluxLoraStepsMatchResidentBitForBit) { check_case(ctx, kFluxCase); }

TEST_F(ModelOffload, SdxlUnetLoraStepsMatchResidentBitForBit) { check_case(ctx, kUnetCase); }

// Checkpointing off: the offloaded blocks are checkpointed anyway, and training still matches (a
// ring of 3 slots).
TEST_F(ModelOffload, OffloadedBlocksAreCheckpointedWithoutThePolicy) {
  const uint64_t least = least_budget(ctx, kFluxCase, 3);
  ASSERT_GT(least, 0u);
  const std::string offload = R"({"offload": {"slots": 3, "budget_bytes": )" + std::to_string(least) + "}}";
  Training resident, offloaded;
  train(ctx, kFluxCase, nullptr, 0, resident);
  train(ctx, kFluxCase, offload.c_str(), 0, offloaded);
  ASSERT_EQ(offloaded.losses.size(), 3u);
  ASSERT_EQ(resident.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_NEAR(offloaded.losses[i], resident.losses[i], 1e-5 * std::fabs(resident.losses[i])) << "step " << i;
  EXPECT_LT(offloaded.kept_bytes, resident.kept_bytes);
}

TEST_F(ModelOffload, UnfrozenOffloadedParameterFailsAtUse) {
  ModelHandle m;
  ParamsHandle adapter;
  const std::string offload = R"({"offload": {"budget_bytes": )" + std::to_string(least_budget(ctx, kFluxCase)) + "}}";
  make_adapted_model(ctx, kFluxCase, offload.c_str(), m, adapter);
  ParamsHandle in;
  make_inputs(ctx, kFluxCase, in);
  T loss;
  ASSERT_EQ(forward_loss(m.m, kFluxCase, in.p, loss), FLAME_OK) << flame_last_error_message();  // learns, offloads
  ParamsHandle ps;
  ASSERT_EQ(flame_model_params(m.m, &ps.p), FLAME_OK);
  flame_tensor_t w = nullptr;
  ASSERT_EQ(flame_params_find(ps.p, kFluxCase.first_block_weight, &w), FLAME_OK);
  ASSERT_NE(w, nullptr);
  ASSERT_EQ(flame_tensor_set_requires_grad(w, 1), FLAME_OK);
  EXPECT_EQ(forward_loss(m.m, kFluxCase, in.p, loss), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("offload"), std::string::npos) << flame_last_error_message();
  ASSERT_EQ(flame_tensor_set_requires_grad(w, 0), FLAME_OK);
  EXPECT_EQ(forward_loss(m.m, kFluxCase, in.p, loss), FLAME_OK) << flame_last_error_message();
}

TEST_F(ModelOffload, BadOptionsFailAtCreation) {
  for (const char* bad : {R"({"offload": 5})", R"({"offload": {}})", R"({"offload": {"budget_bytes": -1}})",
                          R"({"offload": {"budget_bytes": 1.5}})", R"({"offload": {"budget_fraction": 1.5}})",
                          R"({"offload": {"budget_fraction": "half"}})",
                          R"({"offload": {"budget_bytes": 10, "budget_fraction": 0.5}})",
                          R"({"offload": {"budget_bytes": 10, "slots": 1}})", R"({"offload": {"budgetbytes": 10}})"}) {
    flame_model_t m = reinterpret_cast<flame_model_t>(1);
    EXPECT_EQ(flame_model_create(ctx, kFluxCase.arch, kFluxCase.config, bad, &m), FLAME_ERROR_INVALID_ARGUMENT) << bad;
    EXPECT_EQ(m, nullptr) << bad;
    EXPECT_NE(std::string(flame_last_error_message()).find("offload"), std::string::npos) << flame_last_error_message();
  }
}

}  // namespace

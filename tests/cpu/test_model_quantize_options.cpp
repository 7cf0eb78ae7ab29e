// The "quantize" model option and the names of quantised weights without a GPU
// (src/models/quantized_weights.h, quantized_files.h): parsing, defaults and errors that name the
// key (fp8 and NF4); the scale names and shapes; and the load plan of a ComfyUI "scaled fp8" Flux file (F8_E4M3
// weights, scale_weight scalars, the scaled_fp8 marker), which must be recognised as before.
#include <gtest/gtest.h>
#include <string>
#include <vector>
#include "core/error.h"
#include "model_configs.h"
#include "models/flux_keys.h"
#include "models/model.h"
#include "models/model_loader.h"
#include "models/quantized_files.h"
#include "models/quantized_weights.h"
#include "synthetic_checkpoint.h"

using namespace flame;
using namespace flame::models;

namespace {

// The status and message of parse_model_options(options).
std::pair<flame_status_t, std::string> parse_error(const nlohmann::json& options) {
  try {
    parse_model_options(options);
    return {FLAME_OK, ""};
  } catch (const Error& e) {
    return {e.status(), e.what()};
  }
}

TEST(ModelQuantizeOptions, OffUnlessAsked) {
  EXPECT_FALSE(parse_model_options(nullptr).quantize.enabled);
  EXPECT_FALSE(parse_model_options({{"dtype", "bf16"}}).quantize.enabled);
  EXPECT_FALSE(parse_model_options({{"quantize", nullptr}}).quantize.enabled);
  EXPECT_FALSE(parse_model_options({{"quantize", false}}).quantize.enabled);
}

TEST(ModelQuantizeOptions, DtypeAndScale) {
  const ModelOptions defaults = parse_model_options({{"dtype", "bf16"}, {"quantize", nlohmann::json::object()}});
  EXPECT_TRUE(defaults.quantize.enabled);
  EXPECT_EQ(defaults.quantize.dtype, FLAME_DTYPE_F8_E4M3);
  EXPECT_EQ(defaults.quantize.scale, QuantScale::PerTensor);
  EXPECT_EQ(defaults.param_dtype, FLAME_DTYPE_BF16);  // the other parameters keep "dtype"
  EXPECT_EQ(defaults.compute_dtype, FLAME_DTYPE_BF16);

  const ModelOptions row = parse_model_options({{"quantize", {{"dtype", "f8_e4m3"}, {"scale", "row"}}}});
  EXPECT_TRUE(row.quantize.enabled);
  EXPECT_EQ(row.quantize.scale, QuantScale::PerRow);
  const ModelOptions tensor = parse_model_options({{"quantize", {{"dtype", "float8_e4m3fn"}, {"scale", "tensor"}}}});
  EXPECT_EQ(tensor.quantize.scale, QuantScale::PerTensor);
}

TEST(ModelQuantizeOptions, ErrorsNameTheKey) {
  struct Bad {
    nlohmann::json options;
    const char* names;
  };
  const std::vector<Bad> bad = {
      {{{"quantize", "f8_e4m3"}}, "\"quantize\""},
      {{{"quantize", true}}, "\"quantize\""},
      {{{"quantize", {{"bits", 8}}}}, "quantize.bits"},
      {{{"quantize", {{"dtype", "f8_e5m2"}}}}, "quantize.dtype"},
      {{{"quantize", {{"dtype", "nf8"}}}}, "quantize.dtype"},
      {{{"quantize", {{"dtype", 8}}}}, "quantize.dtype"},
      {{{"quantize", {{"scale", "block"}}}}, "quantize.scale"},
      {{{"quantize", {{"scale", nullptr}}}}, "quantize.scale"},
      {{{"quantise", {{"scale", "row"}}}}, "quantise"},
  };
  for (const Bad& b : bad) {
    const auto [status, message] = parse_error(b.options);
    EXPECT_EQ(status, FLAME_ERROR_INVALID_ARGUMENT) << b.options.dump();
    EXPECT_NE(message.find(b.names), std::string::npos) << b.options.dump() << ": " << message;
  }
}

TEST(ModelQuantizeOptions, Nf4DefaultsAreBitsandbytesQLoRA) {
  // bitsandbytes' Linear4bit(quant_type="nf4", compress_statistics=True): blocks of 64, double quantisation.
  const ModelOptions nf4 = parse_model_options({{"dtype", "bf16"}, {"quantize", {{"dtype", "nf4"}}}});
  EXPECT_TRUE(nf4.quantize.enabled);
  EXPECT_TRUE(nf4.quantize.nf4());
  EXPECT_EQ(nf4.quantize.format, QuantFormat::Nf4);
  EXPECT_EQ(nf4.quantize.block_size, 64);
  EXPECT_TRUE(nf4.quantize.double_quant);
  EXPECT_EQ(nf4.param_dtype, FLAME_DTYPE_BF16);

  const ModelOptions custom =
      parse_model_options({{"quantize", {{"dtype", "nf4"}, {"block_size", 4096}, {"double_quant", false}}}});
  EXPECT_EQ(custom.quantize.block_size, 4096);
  EXPECT_FALSE(custom.quantize.double_quant);
  EXPECT_EQ(parse_model_options({{"quantize", {{"dtype", "nf4"}, {"block_size", 16}}}}).quantize.block_size, 16);
  EXPECT_FALSE(parse_model_options({{"quantize", {{"dtype", "f8_e4m3"}}}}).quantize.nf4());
}

TEST(ModelQuantizeOptions, Nf4ErrorsNameTheKey) {
  struct Bad {
    nlohmann::json quantize;
    const char* names;
  };
  const std::vector<Bad> bad = {
      {{{"dtype", "nf4"}, {"block_size", 63}}, "quantize.block_size"},
      {{{"dtype", "nf4"}, {"block_size", 8}}, "quantize.block_size"},
      {{{"dtype", "nf4"}, {"block_size", 8192}}, "quantize.block_size"},
      {{{"dtype", "nf4"}, {"block_size", 0}}, "quantize.block_size"},
      {{{"dtype", "nf4"}, {"block_size", -64}}, "quantize.block_size"},
      {{{"dtype", "nf4"}, {"block_size", "64"}}, "quantize.block_size"},
      {{{"dtype", "nf4"}, {"block_size", 64.0}}, "quantize.block_size"},
      {{{"dtype", "nf4"}, {"double_quant", "yes"}}, "quantize.double_quant"},
      {{{"dtype", "nf4"}, {"double_quant", 1}}, "quantize.double_quant"},
      {{{"dtype", "nf4"}, {"scale", "row"}}, "quantize.scale"},
      {{{"dtype", "f8_e4m3"}, {"block_size", 64}}, "quantize.block_size"},
      {{{"block_size", 64}}, "quantize.block_size"},  // the default dtype is fp8
      {{{"dtype", "f8_e4m3"}, {"double_quant", true}}, "quantize.double_quant"},
      {{{"dtype", "nf4"}, {"blocksize", 64}}, "quantize.blocksize"},
      {{{"dtype", "nf4"}, {"compress_statistics", true}}, "quantize.compress_statistics"},
      {{{"dtype", "NF4"}}, "quantize.dtype"},
  };
  for (const Bad& b : bad) {
    const nlohmann::json options = {{"quantize", b.quantize}};
    const auto [status, message] = parse_error(options);
    EXPECT_EQ(status, FLAME_ERROR_INVALID_ARGUMENT) << options.dump();
    EXPECT_NE(message.find(b.names), std::string::npos) << options.dump() << ": " << message;
  }
  // with "offload", as fp8
  EXPECT_EQ(parse_error({{"quantize", {{"dtype", "nf4"}}}, {"offload", {{"budget_bytes", 1 << 30}}}}).first,
            FLAME_ERROR_INVALID_ARGUMENT);
}

TEST(ModelQuantizeOptions, LoadRejectsBadNf4OptionsBeforeOpeningFiles) {
  try {
    plan_model_load("/nonexistent/flux.safetensors", {{"quantize", {{"dtype", "nf4"}, {"block_size", 48}}}});
    FAIL() << "a bad NF4 block size was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), FLAME_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("quantize.block_size"), std::string::npos) << e.what();
  }
}

TEST(ModelQuantizeOptions, ScaleNamesAndShapes) {
  EXPECT_EQ(scale_weight_name("transformer_blocks.0.attn.to_q.weight"), "transformer_blocks.0.attn.to_q.scale_weight");
  EXPECT_TRUE(is_scale_weight_name("proj_out.scale_weight"));
  EXPECT_FALSE(is_scale_weight_name("proj_out.weight"));
  EXPECT_FALSE(is_scale_weight_name("proj_out.bias"));
  EXPECT_THROW(scale_weight_name("proj_out.bias"), Error);
  EXPECT_EQ(scale_shape(QuantScale::PerTensor, {96, 32}), Shape{});
  EXPECT_EQ(scale_shape(QuantScale::PerRow, {96, 32}), Shape({96, 1}));

  EXPECT_EQ(stored_scale_key("double_blocks.0.img_attn.qkv.weight"), "double_blocks.0.img_attn.qkv.scale_weight");
  EXPECT_EQ(stored_scale_key("double_blocks.0.img_attn.qkv.bias"), "");
  EXPECT_EQ(stored_scale_key(".weight"), "");
  EXPECT_TRUE(is_ignorable_quantization_key("scaled_fp8"));
  EXPECT_TRUE(is_ignorable_quantization_key("model.diffusion_model.scaled_fp8"));
  EXPECT_TRUE(is_ignorable_quantization_key("final_layer.linear.scale_input"));
  EXPECT_FALSE(is_ignorable_quantization_key("final_layer.linear.scale_weight"));
  EXPECT_FALSE(is_ignorable_quantization_key("final_layer.linear.weight"));
}

// A ComfyUI scaled-fp8 Flux file: 2-D weights in F8_E4M3 with an f32 scalar scale_weight each,
// the rest in BF16, and the scaled_fp8 marker.
TEST(ModelQuantizeOptions, ScaledFp8FluxFilePlansAsFlux) {
  synth::TempDir dir;
  const FluxConfig c = models::testing::tiny_flux_config();
  std::vector<synth::Tensor> tensors;
  const std::string prefix = "model.diffusion_model.";
  for (const KeyShape& k : flux_original_tensors(c)) {
    const bool linear = k.shape.size() == 2 && !stored_scale_key(k.name).empty();
    tensors.push_back({prefix + k.name, linear ? "F8_E4M3" : "BF16", k.shape, {}});
    if (linear) tensors.push_back({prefix + stored_scale_key(k.name), "F32", {}, {}});
  }
  tensors.push_back({prefix + "scaled_fp8", "F8_E4M3", {2}, {}});
  const std::string path = dir.sub("flux1-dev-fp8-scaled.safetensors");
  synth::write_safetensors(path, tensors);

  const ModelLoadPlan plain = plan_model_load(path, nullptr);
  EXPECT_EQ(plain.architecture, "FluxTransformer2DModel");
  EXPECT_EQ(plain.config["num_layers"], c.num_layers);
  EXPECT_EQ(plain.options.param_dtype, FLAME_DTYPE_BF16);  // F8 files default to bf16
  EXPECT_FALSE(plain.options.quantize.enabled);
  EXPECT_EQ(plain.sources.size(), flux_diffusers_tensors(c).size());

  const ModelLoadPlan q = plan_model_load(path, {{"quantize", {{"scale", "row"}}}});
  EXPECT_EQ(q.architecture, "FluxTransformer2DModel");
  EXPECT_TRUE(q.options.quantize.enabled);
  EXPECT_EQ(q.options.quantize.scale, QuantScale::PerRow);
  EXPECT_TRUE(q.view.contains("double_blocks.0.img_attn.qkv.scale_weight"));
}

TEST(ModelQuantizeOptions, LoadRejectsBadOptionsBeforeOpeningFiles) {
  try {
    plan_model_load("/nonexistent/flux.safetensors", {{"quantize", {{"scale", "column"}}}});
    FAIL() << "a bad quantize option was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), FLAME_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("quantize.scale"), std::string::npos) << e.what();
  }
}

}  // namespace

// The original-layout save plan (src/models/original_layout.h) against the loader, without a GPU or
// weights: for every architecture at full size (the parameter lists of the real classes where
// tests/data/models has them, else of FLAME's model factories or key tables), the planned file's
// key list is written as a sparse safetensors file (header only, the data region a hole) and given
// to plan_model_load, which must find the same architecture and configuration as for the same
// parameters under their diffusers names, and read every parameter from exactly the piece the save
// plan wrote it to. Bad layouts fail with FLAME_ERROR_INVALID_ARGUMENT.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <unistd.h>
#include <fstream>
#include <map>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "core/error.h"
#include "models/checkpoint_files.h"
#include "models/clip_keys.h"
#include "models/flux_keys.h"
#include "models/model_loader.h"
#include "models/original_layout.h"
#include "models/sd3_keys.h"
#include "models/t5_keys.h"
#include "models/unet_blocks.h"
#include "models/unet_keys.h"
#include "models/vae_keys.h"
#include "synthetic_checkpoint.h"

using namespace flame;
using namespace flame::models;

namespace {

// A BF16 safetensors file of these names and shapes whose data region is a hole (ftruncate): a
// full-size Flux costs a header's worth of disk.
void write_sparse_safetensors(const std::string& path, const std::vector<KeyShape>& keys) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  uint64_t offset = 0;
  for (const KeyShape& k : keys) {
    uint64_t bytes = 2;
    for (int64_t d : k.shape) bytes *= static_cast<uint64_t>(d);
    header[k.name] = {{"dtype", "BF16"}, {"shape", k.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  while (text.size() % 8) text += ' ';
  std::string bytes(8, '\0');
  for (int b = 0; b < 8; ++b) bytes[b] = static_cast<char>((uint64_t(text.size()) >> (8 * b)) & 0xff);
  synth::write_text(path, bytes + text);
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(8 + text.size() + offset)), 0) << path;
}

std::vector<KeyShape> saved_keys(const OriginalSavePlan& plan) {
  std::vector<KeyShape> out;
  for (const OriginalTensor& t : plan.tensors) out.push_back({t.name, t.shape});
  return out;
}

std::vector<KeyShape> specs_keys(const ParamSpecs& specs) {
  std::vector<KeyShape> out;
  for (const ParamSpec& s : specs) out.push_back({s.name, s.shape});
  return out;
}

std::vector<KeyShape> reference_state_dict(const std::string& file) {
  std::ifstream f(std::string(FLAME_SOURCE_DIR) + "/tests/data/models/" + file);
  EXPECT_TRUE(f.good()) << file;
  nlohmann::json j;
  f >> j;
  std::vector<KeyShape> out;
  for (const auto& e : j["state_dict"]) out.push_back({e[0].get<std::string>(), e[1].get<std::vector<int64_t>>()});
  return out;
}

bool is_component_prefix(const std::string& p) {
  if (p.empty()) return true;
  for (const std::string& k : known_component_prefixes())
    if (k == p) return true;
  return false;
}

// Saves params of class_name in layout (on paper), loads the key list back, and checks the round trip.
void expect_round_trip(const std::string& class_name, const std::vector<KeyShape>& params, const std::string& layout) {
  SCOPED_TRACE(class_name + " in layout " + layout);
  const OriginalSavePlan plan = plan_original_save(class_name, params, layout);
  synth::TempDir dir;
  const std::string saved = dir.sub("saved.safetensors"), reference = dir.sub("diffusers.safetensors");
  write_sparse_safetensors(saved, saved_keys(plan));
  write_sparse_safetensors(reference, params);
  const ModelLoadPlan loaded = plan_model_load(saved, nullptr);
  const ModelLoadPlan expected = plan_model_load(reference, nullptr);
  EXPECT_EQ(loaded.architecture, class_name);
  EXPECT_EQ(loaded.config, expected.config);

  // Every parameter is read from the piece it was written to; every stored tensor is read.
  std::map<std::string, std::pair<const OriginalTensor*, const OriginalPiece*>> written;
  size_t pieces = 0;
  for (const OriginalTensor& t : plan.tensors)
    for (const OriginalPiece& p : t.pieces) {
      written[p.parameter] = {&t, &p};
      ++pieces;
    }
  ASSERT_EQ(pieces, params.size());
  ASSERT_EQ(written.size(), params.size());
  ASSERT_EQ(loaded.sources.size(), params.size());
  for (const KeyShape& param : params) {
    SCOPED_TRACE(param.name);
    ASSERT_TRUE(loaded.sources.count(param.name));
    const ParamSource& src = loaded.sources.at(param.name);
    const OriginalTensor& t = *written.at(param.name).first;
    const OriginalPiece& p = *written.at(param.name).second;
    ASSERT_GE(t.name.size(), src.key.size());
    EXPECT_EQ(t.name.substr(t.name.size() - src.key.size()), src.key);
    EXPECT_TRUE(is_component_prefix(t.name.substr(0, t.name.size() - src.key.size())));
    EXPECT_TRUE(loaded.view.contains(src.key));
    EXPECT_EQ(src.row_begin, p.row_begin);
    EXPECT_EQ(src.rows < 0 ? (t.shape.empty() ? 1 : t.shape[0]) : src.rows, p.rows);
    EXPECT_EQ(src.swap_halves, p.swap_halves);
    EXPECT_EQ(src.transposed, p.transposed);
  }
}

flame_status_t save_plan_status(const std::string& class_name, const std::vector<KeyShape>& params,
                                const std::string& layout) {
  try {
    plan_original_save(class_name, params, layout);
    return FLAME_OK;
  } catch (const Error& e) {
    return e.status();
  }
}

std::vector<KeyShape> sdxl_unet_params() {
  return specs_keys(unet2d_condition_param_specs(nlohmann::json{
      {"block_out_channels", {320, 640, 1280}},
      {"down_block_types", {"DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"}},
      {"up_block_types", {"CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"}},
      {"transformer_layers_per_block", {1, 2, 10}},
      {"attention_head_dim", {5, 10, 20}},
      {"cross_attention_dim", 2048},
      {"use_linear_projection", true},
      {"addition_embed_type", "text_time"},
      {"addition_time_embed_dim", 256},
      {"projection_class_embeddings_input_dim", 2816}}));
}

std::vector<KeyShape> clip_params(const ClipTextConfig& c) { return clip_parameter_table(c).diffusers_tensors(); }

TEST(OriginalLayoutSave, FluxDevFromTheRealClassAndSchnell) {
  const std::vector<KeyShape> dev = reference_state_dict("flux_dev_diffusers.json");
  expect_round_trip("FluxTransformer2DModel", dev, "original");
  expect_round_trip("FluxTransformer2DModel", dev, "comfyui");
  // flux1-dev.safetensors: BFL names, no prefix, fused QKV and linear1, in the BFL module order.
  const OriginalSavePlan plan = plan_original_save("FluxTransformer2DModel", dev, "original");
  EXPECT_EQ(plan.layout, "bfl");
  const std::vector<KeyShape> bfl = flux_original_tensors(FluxConfig{});
  ASSERT_EQ(plan.tensors.size(), bfl.size());
  for (size_t i = 0; i < bfl.size(); ++i) {
    EXPECT_EQ(plan.tensors[i].name, bfl[i].name);
    EXPECT_EQ(plan.tensors[i].shape, bfl[i].shape);
  }
  const OriginalTensor* linear1 = nullptr;
  for (const OriginalTensor& t : plan.tensors)
    if (t.name == "single_blocks.0.linear1.weight") linear1 = &t;
  ASSERT_TRUE(linear1);
  ASSERT_EQ(linear1->pieces.size(), 4u);
  EXPECT_EQ(linear1->pieces[0].parameter, "single_transformer_blocks.0.attn.to_q.weight");
  EXPECT_EQ(linear1->pieces[3].parameter, "single_transformer_blocks.0.proj_mlp.weight");
  FluxConfig schnell;
  schnell.guidance_embeds = false;
  expect_round_trip("FluxTransformer2DModel", flux_diffusers_tensors(schnell), "bfl");
}

TEST(OriginalLayoutSave, UNetSdxlAndSd15) {
  expect_round_trip("UNet2DConditionModel", sdxl_unet_params(), "original");
  const std::vector<KeyShape> sd15 = reference_state_dict("unet_sd15_diffusers.json");
  expect_round_trip("UNet2DConditionModel", sd15, "ldm");
  const OriginalSavePlan plan = plan_original_save("UNet2DConditionModel", sd15, "original");
  EXPECT_EQ(plan.layout, "sgm");
  EXPECT_EQ(plan.tensors.front().name.rfind("model.diffusion_model.", 0), 0u);
}

TEST(OriginalLayoutSave, SD3AndSD35) {
  expect_round_trip("SD3Transformer2DModel", sd3_parameter_table(sd3_medium_config()).diffusers_tensors(), "original");
  expect_round_trip("SD3Transformer2DModel", sd3_parameter_table(SD3Config{}).diffusers_tensors(), "sd3");
}

TEST(OriginalLayoutSave, AutoencoderKL4And16Channels) {
  expect_round_trip("AutoencoderKL", specs_keys(autoencoder_kl_param_specs(nlohmann::json::object())), "original");
  const std::vector<KeyShape> flux_vae = specs_keys(autoencoder_kl_param_specs(
      {{"latent_channels", 16}, {"use_quant_conv", false}, {"use_post_quant_conv", false}}));
  expect_round_trip("AutoencoderKL", flux_vae, "bfl");
  expect_round_trip("AutoencoderKL", flux_vae, "sgm");
}

TEST(OriginalLayoutSave, TextEncoders) {
  expect_round_trip("CLIPTextModel", clip_params(ClipTextConfig{}), "original");  // SDXL's CLIP-L
  expect_round_trip("CLIPTextModel", clip_params(ClipTextConfig{}), "sd3");
  expect_round_trip("CLIPTextModelWithProjection", clip_params(clip_bigg_config()), "original");  // OpenCLIP bigG
  expect_round_trip("CLIPTextModelWithProjection", clip_params(clip_bigg_config()), "sd3");      // clip_g
  const OriginalSavePlan bigg = plan_original_save("CLIPTextModelWithProjection", clip_params(clip_bigg_config()), "sgm");
  EXPECT_EQ(bigg.tensors.back().name, "conditioner.embedders.1.model.text_projection");
  EXPECT_TRUE(bigg.tensors.back().pieces.at(0).transposed);
  expect_round_trip("T5EncoderModel", t5_parameter_table(T5Config{}).diffusers_tensors(), "original");
  expect_round_trip("T5EncoderModel", t5_parameter_table(T5Config{}).diffusers_tensors(), "comfyui");
}

TEST(OriginalLayoutSave, LayoutsAndErrors) {
  EXPECT_EQ(original_layouts("FluxTransformer2DModel"), (std::vector<std::string>{"original", "bfl", "comfyui"}));
  EXPECT_TRUE(original_layouts("NoSuchModel").empty());
  const std::vector<KeyShape> flux = flux_diffusers_tensors(FluxConfig{});
  EXPECT_EQ(save_plan_status("FluxTransformer2DModel", flux, "sgm"), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(save_plan_status("FluxTransformer2DModel", flux, ""), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(save_plan_status("NoSuchModel", flux, "original"), FLAME_ERROR_INVALID_ARGUMENT);
  // CLIP with projection of a width SD3 files do not have: which prefix would be a guess.
  ClipTextConfig odd = clip_bigg_config();
  odd.hidden_size = 1024;
  odd.num_attention_heads = 16;
  EXPECT_EQ(save_plan_status("CLIPTextModelWithProjection", clip_params(odd), "sd3"), FLAME_ERROR_INVALID_ARGUMENT);
  // A width the loader cannot read back (CLIP detection assumes 64-wide heads).
  ClipTextConfig narrow;
  narrow.hidden_size = 40;
  narrow.num_attention_heads = 5;
  EXPECT_EQ(save_plan_status("CLIPTextModel", clip_params(narrow), "sgm"), FLAME_ERROR_INVALID_ARGUMENT);
  // Parameters of another class.
  EXPECT_EQ(save_plan_status("UNet2DConditionModel", flux, "sgm"), FLAME_ERROR_INVALID_ARGUMENT);
}

// The tiny configurations of tests/gpu/test_model_original_save.cpp (the GPU round trip with weights):
// their layouts are read back by the loader's detection too.
TEST(OriginalLayoutSave, TinyConfigsOfTheGpuTest) {
  FluxConfig flux;
  flux.in_channels = flux.out_channels = 16;
  flux.num_layers = flux.num_single_layers = 2;
  flux.attention_head_dim = 16;
  flux.num_attention_heads = 2;
  flux.joint_attention_dim = 24;
  flux.pooled_projection_dim = 20;
  flux.mlp_hidden_dim = 128;
  expect_round_trip("FluxTransformer2DModel", flux_diffusers_tensors(flux), "original");
  expect_round_trip("FluxTransformer2DModel", flux_diffusers_tensors(flux), "comfyui");
  expect_round_trip("UNet2DConditionModel",
                    specs_keys(unet2d_condition_param_specs(nlohmann::json::parse(R"({"block_out_channels": [32, 48, 64],
      "layers_per_block": 2, "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
      "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
      "transformer_layers_per_block": [1, 2, 3], "attention_head_dim": [1, 2, 4], "cross_attention_dim": 40,
      "use_linear_projection": true, "norm_num_groups": 8, "addition_embed_type": "text_time",
      "addition_time_embed_dim": 8, "projection_class_embeddings_input_dim": 72})"))),
                    "original");
  SD3Config sd3;
  sd3.in_channels = sd3.out_channels = 4;
  sd3.num_layers = 3;
  sd3.attention_head_dim = 8;
  sd3.num_attention_heads = 4;
  sd3.joint_attention_dim = 24;
  sd3.caption_projection_dim = 32;
  sd3.pooled_projection_dim = 20;
  sd3.pos_embed_max_size = 12;
  sd3.dual_attention_layers = {0, 2};
  expect_round_trip("SD3Transformer2DModel", sd3_parameter_table(sd3).diffusers_tensors(), "original");
  const std::string vae = R"({"block_out_channels": [16, 24, 32], "layers_per_block": 1,
      "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"],
      "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"], "norm_num_groups": 8, )";
  expect_round_trip("AutoencoderKL", specs_keys(autoencoder_kl_param_specs(nlohmann::json::parse(vae + R"("latent_channels": 4})"))),
                    "original");
  expect_round_trip("AutoencoderKL",
                    specs_keys(autoencoder_kl_param_specs(nlohmann::json::parse(
                        vae + R"("latent_channels": 16, "use_quant_conv": false, "use_post_quant_conv": false})"))),
                    "bfl");
  ClipTextConfig clip;
  clip.vocab_size = 100;
  clip.hidden_size = 64;
  clip.intermediate_size = 96;
  clip.num_hidden_layers = 2;
  clip.num_attention_heads = 1;
  clip.max_position_embeddings = 16;
  expect_round_trip("CLIPTextModel", clip_params(clip), "original");
  expect_round_trip("CLIPTextModel", clip_params(clip), "sd3");
  clip.hidden_size = 128;
  clip.intermediate_size = 160;
  clip.num_attention_heads = 2;
  clip.projection_dim = 48;
  clip.with_projection = true;
  expect_round_trip("CLIPTextModelWithProjection", clip_params(clip), "original");
  T5Config t5;
  t5.vocab_size = 100;
  t5.d_model = 32;
  t5.d_kv = 8;
  t5.d_ff = 48;
  t5.num_layers = 2;
  t5.num_heads = 4;
  t5.relative_attention_num_buckets = 8;
  expect_round_trip("T5EncoderModel", t5_parameter_table(t5).diffusers_tensors(), "original");
  expect_round_trip("T5EncoderModel", t5_parameter_table(t5).diffusers_tensors(), "comfyui");
}

}  // namespace

// The model layer's key tables against the real diffusers classes, without Python: the state_dict
// names, shapes and order of FluxTransformer2DModel (Flux-dev and a tiny config) and of
// UNet2DConditionModel (SD 1.5), written on the GPU machine by tests/models/check_model_keys.py
// (classes built on the meta device from reference/diffusers) into tests/data/models/; likewise
// SD3Transformer2DModel, AutoencoderKL, and transformers' CLIPTextModel(WithProjection) and
// T5EncoderModel. The references of those four families are generated after their tables were
// written: a test whose files are not there yet checks the ones that are and then skips, naming
// the missing files (the Flux and UNet references are required).
#include <gtest/gtest.h>
#include <fstream>
#include <functional>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "models/clip_keys.h"
#include "models/flux_keys.h"
#include "models/sd3_keys.h"
#include "models/t5_keys.h"
#include "models/unet_keys.h"
#include "models/vae_keys.h"

using namespace flame::models;

namespace {

nlohmann::json reference(const std::string& file) {
  std::ifstream f(std::string(FLAME_SOURCE_DIR) + "/tests/data/models/" + file);
  EXPECT_TRUE(f.good()) << file;
  nlohmann::json j;
  if (f.good()) f >> j;
  return j;
}

// FLAME's list against the class's: same length, then name and shape entry by entry.
void expect_same_list(const std::vector<KeyShape>& ours, const nlohmann::json& theirs) {
  ASSERT_TRUE(theirs.is_array());
  ASSERT_EQ(ours.size(), theirs.size());
  for (size_t i = 0; i < ours.size(); ++i) {
    ASSERT_EQ(ours[i].name, theirs[i][0].get<std::string>()) << "entry " << i;
    EXPECT_EQ(ours[i].shape, theirs[i][1].get<std::vector<int64_t>>()) << ours[i].name;
  }
}

FluxConfig flux_config(const nlohmann::json& c) {
  FluxConfig f;
  f.in_channels = c["in_channels"];
  f.out_channels = c["out_channels"];
  f.num_layers = c["num_layers"];
  f.num_single_layers = c["num_single_layers"];
  f.attention_head_dim = c["attention_head_dim"];
  f.num_attention_heads = c["num_attention_heads"];
  f.joint_attention_dim = c["joint_attention_dim"];
  f.pooled_projection_dim = c["pooled_projection_dim"];
  f.guidance_embeds = c["guidance_embeds"];
  f.mlp_hidden_dim = 4 * f.inner_dim();  // diffusers' Flux blocks: MLP ratio 4
  return f;
}

std::string reference_path(const std::string& file) {
  return std::string(FLAME_SOURCE_DIR) + "/tests/data/models/" + file;
}

// Checks FLAME's list for each reference file present (class name, then the list from the config it
// records); skips naming the files not generated yet.
void check_generated(const std::vector<std::string>& files, const std::string& class_prefix,
                     const std::function<std::vector<KeyShape>(const nlohmann::json&)>& ours) {
  std::string missing;
  for (const std::string& file : files) {
    SCOPED_TRACE(file);
    std::ifstream f(reference_path(file));
    if (!f.good()) {
      missing += " " + file;
      continue;
    }
    nlohmann::json j;
    f >> j;
    ASSERT_EQ(j.value("class", "").rfind(class_prefix, 0), 0u) << j.value("class", "");
    expect_same_list(ours(j), j["state_dict"]);
  }
  if (!missing.empty())
    GTEST_SKIP() << "not generated yet (tests/models/README.md: check_model_keys.py --write tests/data/models):"
                 << missing;
}

SD3Config sd3_config(const nlohmann::json& c) {
  SD3Config s;
  s.sample_size = c["sample_size"];
  s.patch_size = c["patch_size"];
  s.in_channels = c["in_channels"];
  s.num_layers = c["num_layers"];
  s.attention_head_dim = c["attention_head_dim"];
  s.num_attention_heads = c["num_attention_heads"];
  s.joint_attention_dim = c["joint_attention_dim"];
  s.caption_projection_dim = c["caption_projection_dim"];
  s.pooled_projection_dim = c["pooled_projection_dim"];
  s.out_channels = c["out_channels"];
  s.pos_embed_max_size = c["pos_embed_max_size"];
  s.dual_attention_layers = c["dual_attention_layers"].get<std::vector<int64_t>>();
  s.qk_norm = c["qk_norm"].is_null() ? "" : c["qk_norm"].get<std::string>();
  return s;
}

VAEConfig vae_config(const nlohmann::json& c) {
  VAEConfig v;
  v.in_channels = c["in_channels"];
  v.out_channels = c["out_channels"];
  v.block_out_channels = c["block_out_channels"].get<std::vector<int64_t>>();
  v.layers_per_block = c["layers_per_block"];
  v.latent_channels = c["latent_channels"];
  v.use_quant_conv = c["use_quant_conv"];
  v.use_post_quant_conv = c["use_post_quant_conv"];
  v.mid_block_add_attention = c["mid_block_add_attention"];
  return v;
}

ClipTextConfig clip_config(const nlohmann::json& j) {
  const nlohmann::json& c = j["config"];
  ClipTextConfig t;
  t.vocab_size = c["vocab_size"];
  t.hidden_size = c["hidden_size"];
  t.intermediate_size = c["intermediate_size"];
  t.num_hidden_layers = c["num_hidden_layers"];
  t.num_attention_heads = c["num_attention_heads"];
  t.max_position_embeddings = c["max_position_embeddings"];
  t.projection_dim = c["projection_dim"];
  t.with_projection = j["class"] == "CLIPTextModelWithProjection";
  return t;
}

T5Config t5_config(const nlohmann::json& c) {
  T5Config t;
  t.vocab_size = c["vocab_size"];
  t.d_model = c["d_model"];
  t.d_kv = c["d_kv"];
  t.d_ff = c["d_ff"];
  t.num_layers = c["num_layers"];
  t.num_heads = c["num_heads"];
  t.relative_attention_num_buckets = c["relative_attention_num_buckets"];
  t.feed_forward_proj = c["feed_forward_proj"];
  return t;
}

}  // namespace

TEST(ModelKeyReferences, FluxMatchesFluxTransformer2DModel) {
  for (const char* file : {"flux_dev_diffusers.json", "flux_tiny_diffusers.json"}) {
    SCOPED_TRACE(file);
    const nlohmann::json j = reference(file);
    ASSERT_EQ(j.value("class", ""), "FluxTransformer2DModel");
    expect_same_list(flux_diffusers_tensors(flux_config(j["config"])), j["state_dict"]);
  }
}

TEST(ModelKeyReferences, Sd15UNetMatchesUNet2DConditionModel) {
  const nlohmann::json j = reference("unet_sd15_diffusers.json");
  ASSERT_EQ(j.value("class", ""), "UNet2DConditionModel");
  std::vector<KeyShape> ours;
  for (const UNetParameter& p : unet_parameters(sd15_unet_config())) ours.push_back({p.diffusers_name, p.shape});
  expect_same_list(ours, j["state_dict"]);
}

TEST(ModelKeyReferences, SD3MatchesSD3Transformer2DModel) {
  check_generated({"sd3_sd35_medium_diffusers.json", "sd3_tiny_diffusers.json"}, "SD3Transformer2DModel",
                  [](const nlohmann::json& j) { return sd3_parameter_table(sd3_config(j["config"])).diffusers_tensors(); });
}

TEST(ModelKeyReferences, VAEMatchesAutoencoderKL) {
  check_generated({"vae_sdxl_diffusers.json", "vae_flux_diffusers.json", "vae_tiny_diffusers.json"}, "AutoencoderKL",
                  [](const nlohmann::json& j) { return vae_parameter_table(vae_config(j["config"])).diffusers_tensors(); });
}

TEST(ModelKeyReferences, ClipMatchesCLIPTextModel) {
  check_generated({"clip_l_transformers.json", "clip_bigg_transformers.json", "clip_tiny_transformers.json"},
                  "CLIPTextModel",
                  [](const nlohmann::json& j) { return clip_parameter_table(clip_config(j)).diffusers_tensors(); });
}

TEST(ModelKeyReferences, T5MatchesT5EncoderModel) {
  check_generated({"t5_xxl_transformers.json", "t5_tiny_transformers.json"}, "T5EncoderModel",
                  [](const nlohmann::json& j) { return t5_parameter_table(t5_config(j["config"])).diffusers_tensors(); });
}

// The model layer's key tables against the real diffusers classes, without Python: the state_dict
// names, shapes and order of FluxTransformer2DModel (Flux-dev and a tiny config) and of
// UNet2DConditionModel (SD 1.5), written on the GPU machine by tests/models/check_model_keys.py
// (classes built on the meta device from reference/diffusers) into tests/data/models/.
#include <gtest/gtest.h>
#include <fstream>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "models/flux_keys.h"
#include "models/unet_keys.h"

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

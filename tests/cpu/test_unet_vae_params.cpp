// The parameters the UNet2DConditionModel and AutoencoderKL models register (white-box,
// src/models/unet2d_condition.cpp, autoencoder_kl.cpp), without a GPU: the UNet's names, shapes and
// order equal the key table's diffusers names (unet_keys.h) for SDXL base, SD 1.5 and the tiny test
// config; the VAE's totals equal the real SDXL (4-channel) and Flux (16-channel) VAEs'; config
// errors name the key.
#include <gtest/gtest.h>
#include <functional>
#include <set>
#include <string>
#include <vector>
#include "core/error.h"
#include "model_configs.h"
#include "models/unet_blocks.h"
#include "models/unet_keys.h"

using namespace flame;
using namespace flame::models;

namespace {

// diffusers' config.json for the table's configuration.
nlohmann::json diffusers_config(const UNetConfig& c) {
  std::vector<std::string> down, up;
  for (bool a : c.down_block_has_attention) down.push_back(a ? "CrossAttnDownBlock2D" : "DownBlock2D");
  for (auto it = c.down_block_has_attention.rbegin(); it != c.down_block_has_attention.rend(); ++it)
    up.push_back(*it ? "CrossAttnUpBlock2D" : "UpBlock2D");
  nlohmann::json j = {{"in_channels", c.in_channels},
                      {"out_channels", c.out_channels},
                      {"block_out_channels", c.block_out_channels},
                      {"down_block_types", down},
                      {"up_block_types", up},
                      {"layers_per_block", c.layers_per_block},
                      {"transformer_layers_per_block", c.transformer_layers_per_block},
                      {"cross_attention_dim", c.cross_attention_dim},
                      {"use_linear_projection", c.use_linear_projection},
                      {"attention_head_dim", 8}};
  if (c.projection_class_embeddings_input_dim > 0) {
    j["addition_embed_type"] = "text_time";
    j["addition_time_embed_dim"] = 4;
    j["projection_class_embeddings_input_dim"] = c.projection_class_embeddings_input_dim;
  }
  return j;
}

void expect_table_order(const UNetConfig& c) {
  const std::vector<UNetParameter> table = unet_parameters(c);
  const ParamSpecs specs = unet2d_condition_param_specs(diffusers_config(c));
  ASSERT_EQ(specs.size(), table.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    SCOPED_TRACE(table[i].diffusers_name);
    EXPECT_EQ(specs[i].name, table[i].diffusers_name) << "at " << i;
    EXPECT_EQ(std::vector<int64_t>(specs[i].shape.begin(), specs[i].shape.end()), table[i].shape);
  }
}

int64_t total(const ParamSpecs& specs) {
  int64_t n = 0;
  for (const ParamSpec& s : specs) {
    int64_t e = 1;
    for (int64_t d : s.shape) e *= d;
    n += e;
  }
  return n;
}

flame_status_t status_of(const std::function<void()>& f, std::string* msg) {
  try {
    f();
    return FLAME_OK;
  } catch (const Error& e) {
    *msg = e.what();
    return e.status();
  }
}

}  // namespace

TEST(UNetModelParams, EqualTheKeyTableInOrder) {
  {
    SCOPED_TRACE("SDXL base");
    UNetConfig xl;  // the table's defaults: SDXL base
    nlohmann::json j = diffusers_config(xl);
    expect_table_order(xl);
    EXPECT_EQ(total(unet2d_condition_param_specs(j)), 2567463684);
  }
  {
    SCOPED_TRACE("SD 1.5");
    expect_table_order(sd15_unet_config());
  }
  {
    SCOPED_TRACE("tiny");
    expect_table_order(flame::models::testing::tiny_unet_config());
  }
}

TEST(UNetModelParams, DiffusersDefaultsAreSd15Shaped) {
  // diffusers' defaults: four blocks of 320..1280, cross-attention in the first three, 1280-wide text.
  const ParamSpecs s = unet2d_condition_param_specs(nlohmann::json::object());
  EXPECT_EQ(s.front().name, "conv_in.weight");
  EXPECT_EQ(s.back().name, "conv_out.bias");
  UNetConfig c = sd15_unet_config();
  c.cross_attention_dim = 1280;
  const ParamSpecs want = unet2d_condition_param_specs(diffusers_config(c));
  ASSERT_EQ(s.size(), want.size());
  EXPECT_EQ(total(s), total(want));
}

TEST(UNetModelParams, ConfigErrorsNameTheKey) {
  std::string msg;
  auto fails = [&](nlohmann::json j, const char* key) {
    SCOPED_TRACE(j.dump());
    EXPECT_EQ(status_of([&] { unet2d_condition_param_specs(j); }, &msg), FLAME_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(msg.find(key), std::string::npos) << msg;
  };
  fails({{"class_embed_type", "timestep"}}, "class_embed_type");
  fails({{"down_block_types", {"AttnDownBlock2D", "DownBlock2D", "DownBlock2D", "DownBlock2D"}}}, "AttnDownBlock2D");
  fails({{"block_out_channels", {320, 640}}}, "block_out_channels");
  fails({{"norm_num_groups", 48}}, "norm_num_groups");
  fails({{"attention_head_dim", {8, 8, 7, 8}}}, "heads");
  fails({{"transformer_layers_per_block", {{1, 2}, {1, 2}, {1, 2}, {1, 2}}}}, "transformer_layers_per_block");
  fails({{"addition_embed_type", "text_time"}}, "addition_time_embed_dim");
  fails({{"layers_per_block", "2"}}, "layers_per_block");
  fails({{"dropout", 0.1}}, "dropout");
}

TEST(AutoencoderKLParams, SdxlAndFluxTotalsAndNames) {
  const nlohmann::json sdxl = {
      {"block_out_channels", {128, 256, 512, 512}},
      {"down_block_types", {"DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"}},
      {"up_block_types", {"UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"}},
      {"layers_per_block", 2},
      {"latent_channels", 4},
      {"scaling_factor", 0.13025}};
  nlohmann::json flux = sdxl;
  flux["latent_channels"] = 16;
  flux["use_quant_conv"] = false;
  flux["use_post_quant_conv"] = false;
  flux["shift_factor"] = 0.1159;
  const ParamSpecs a = autoencoder_kl_param_specs(sdxl), b = autoencoder_kl_param_specs(flux);
  EXPECT_EQ(total(a), 83653863);  // SD 1.5 / SDXL's VAE
  EXPECT_EQ(total(b), 83819683);  // Flux's VAE
  EXPECT_EQ(a.size(), 248u);
  EXPECT_EQ(b.size(), 244u);
  std::set<std::string> names;
  for (const ParamSpec& s : a) EXPECT_TRUE(names.insert(s.name).second) << s.name;
  auto index = [&](const std::string& n) {
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i].name == n) return static_cast<int64_t>(i);
    return int64_t{-1};
  };
  // diffusers' order: the decoder's up_blocks are registered before its mid_block; the mid block's
  // attention before its resnets; quant convs last.
  EXPECT_EQ(a.front().name, "encoder.conv_in.weight");
  EXPECT_LT(index("encoder.mid_block.attentions.0.group_norm.weight"), index("encoder.mid_block.resnets.0.norm1.weight"));
  EXPECT_LT(index("decoder.up_blocks.3.resnets.2.conv2.bias"), index("decoder.mid_block.attentions.0.to_q.weight"));
  EXPECT_EQ(a[a.size() - 4].name, "quant_conv.weight");
  EXPECT_EQ(a.back().name, "post_quant_conv.bias");
  EXPECT_EQ(b.back().name, "decoder.conv_out.bias");
  const ParamSpec* shortcut = nullptr;
  for (const ParamSpec& s : a)
    if (s.name == "decoder.up_blocks.2.resnets.0.conv_shortcut.weight") shortcut = &s;
  ASSERT_NE(shortcut, nullptr);
  EXPECT_EQ(shortcut->shape, (Shape{256, 512, 1, 1}));
}

TEST(AutoencoderKLParams, ConfigErrorsNameTheKey) {
  std::string msg;
  auto fails = [&](nlohmann::json j, const char* key) {
    SCOPED_TRACE(j.dump());
    EXPECT_EQ(status_of([&] { autoencoder_kl_param_specs(j); }, &msg), FLAME_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(msg.find(key), std::string::npos) << msg;
  };
  fails({{"down_block_types", nlohmann::json::array({"AttnDownEncoderBlock2D"})}}, "down_block_types");
  fails({{"block_out_channels", {64, 96}}, {"down_block_types", nlohmann::json::array({"DownEncoderBlock2D"})}},
        "down_block_types");
  fails({{"norm_num_groups", 0}}, "norm_num_groups");
  fails({{"block_out_channels", nlohmann::json::array({48})}}, "norm_num_groups");
  fails({{"shift_factor", "x"}}, "shift_factor");
  fails({{"norm_type", "spatial"}}, "norm_type");
}

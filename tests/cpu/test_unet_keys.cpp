// UNet2DConditionModel checkpoint keys without weights (white-box, src/models/unet_keys.*): SDXL
// base and SD 1.5 tensor counts and parameter totals, SGM names against diffusers' converter
// (loaders/single_file_utils.py, convert_ldm_unet_checkpoint), detection of layout, prefix and
// configuration in both layouts (tiny, SDXL, SD 1.5, bundled with other components), and errors.
#include <gtest/gtest.h>
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>
#include "core/error.h"
#include "key_test_helpers.h"
#include "model_configs.h"
#include "models/unet_keys.h"

using namespace flame;
using namespace flame::models;

namespace {

using flame::models::testing::status_of;

UNetConfig tiny_unet() { return flame::models::testing::tiny_unet_config(); }

std::vector<KeyShape> keys_of(const UNetConfig& c, bool sgm, const std::string& prefix) {
  std::vector<KeyShape> out;
  for (const UNetParameter& p : unet_parameters(c)) out.push_back({prefix + (sgm ? p.original_name : p.diffusers_name), p.shape});
  return out;
}

flame_status_t detect_status(const std::vector<KeyShape>& keys, std::string* msg) {
  return status_of([&] { detect_unet_checkpoint(keys); }, msg);
}

void expect_same(const UNetConfig& a, const UNetConfig& b) {
  EXPECT_EQ(a.in_channels, b.in_channels);
  EXPECT_EQ(a.out_channels, b.out_channels);
  EXPECT_EQ(a.block_out_channels, b.block_out_channels);
  EXPECT_EQ(a.down_block_has_attention, b.down_block_has_attention);
  EXPECT_EQ(a.layers_per_block, b.layers_per_block);
  EXPECT_EQ(a.cross_attention_dim, b.cross_attention_dim);
  EXPECT_EQ(a.use_linear_projection, b.use_linear_projection);
  EXPECT_EQ(a.mid_block_has_attention, b.mid_block_has_attention);
  EXPECT_EQ(a.projection_class_embeddings_input_dim, b.projection_class_embeddings_input_dim);
  for (size_t i = 0; i < a.block_out_channels.size(); ++i)
    if (a.down_block_has_attention[i]) EXPECT_EQ(a.transformer_layers_per_block[i], b.transformer_layers_per_block[i]) << i;
}

}  // namespace

TEST(UNetKeys, SdxlAndSd15CountsAndParameterTotals) {
  const std::vector<UNetParameter> xl = unet_parameters(UNetConfig{});
  const std::vector<UNetParameter> v15 = unet_parameters(sd15_unet_config());
  auto total = [](const std::vector<UNetParameter>& ps) {
    int64_t n = 0;
    for (const UNetParameter& p : ps) {
      int64_t e = 1;
      for (int64_t d : p.shape) e *= d;
      n += e;
    }
    return n;
  };
  EXPECT_EQ(xl.size(), 1680u);
  EXPECT_EQ(total(xl), 2567463684);  // SDXL base's UNet
  EXPECT_EQ(v15.size(), 686u);
  EXPECT_EQ(total(v15), 859520964);  // SD 1.5's UNet
  for (const auto* ps : {&xl, &v15}) {
    std::set<std::string> d, o;
    for (const UNetParameter& p : *ps) {
      EXPECT_TRUE(d.insert(p.diffusers_name).second) << p.diffusers_name;
      EXPECT_TRUE(o.insert(p.original_name).second) << p.original_name;
    }
  }
}

TEST(UNetKeys, SgmNamesFollowDiffusersConverter) {
  struct Want {
    const char* diffusers;
    const char* sgm;
    std::vector<int64_t> shape;
  };
  const Want xl[] = {
      {"conv_in.weight", "input_blocks.0.0.weight", {320, 4, 3, 3}},
      {"time_embedding.linear_2.bias", "time_embed.2.bias", {1280}},
      {"add_embedding.linear_1.weight", "label_emb.0.0.weight", {1280, 2816}},
      {"down_blocks.0.resnets.1.conv1.weight", "input_blocks.2.0.in_layers.2.weight", {320, 320, 3, 3}},
      {"down_blocks.0.downsamplers.0.conv.weight", "input_blocks.3.0.op.weight", {320, 320, 3, 3}},
      {"down_blocks.1.resnets.0.conv_shortcut.weight", "input_blocks.4.0.skip_connection.weight", {640, 320, 1, 1}},
      {"down_blocks.1.resnets.0.time_emb_proj.weight", "input_blocks.4.0.emb_layers.1.weight", {640, 1280}},
      {"down_blocks.1.attentions.1.transformer_blocks.1.attn2.to_k.weight",
       "input_blocks.5.1.transformer_blocks.1.attn2.to_k.weight", {640, 2048}},
      {"down_blocks.2.attentions.0.proj_in.weight", "input_blocks.7.1.proj_in.weight", {1280, 1280}},
      {"down_blocks.2.attentions.1.transformer_blocks.9.ff.net.0.proj.weight",
       "input_blocks.8.1.transformer_blocks.9.ff.net.0.proj.weight", {10240, 1280}},
      {"mid_block.resnets.0.norm2.weight", "middle_block.0.out_layers.0.weight", {1280}},
      {"mid_block.attentions.0.transformer_blocks.9.norm3.bias", "middle_block.1.transformer_blocks.9.norm3.bias", {1280}},
      {"mid_block.resnets.1.conv2.bias", "middle_block.2.out_layers.3.bias", {1280}},
      {"up_blocks.0.resnets.0.conv1.weight", "output_blocks.0.0.in_layers.2.weight", {1280, 2560, 3, 3}},
      {"up_blocks.0.resnets.2.conv_shortcut.weight", "output_blocks.2.0.skip_connection.weight", {1280, 1920, 1, 1}},
      {"up_blocks.0.upsamplers.0.conv.weight", "output_blocks.2.2.conv.weight", {1280, 1280, 3, 3}},
      {"up_blocks.1.resnets.2.conv_shortcut.weight", "output_blocks.5.0.skip_connection.weight", {640, 960, 1, 1}},
      {"up_blocks.1.attentions.2.proj_out.bias", "output_blocks.5.1.proj_out.bias", {640}},
      {"up_blocks.2.resnets.0.norm1.weight", "output_blocks.6.0.in_layers.0.weight", {960}},
      {"up_blocks.2.resnets.2.conv_shortcut.weight", "output_blocks.8.0.skip_connection.weight", {320, 640, 1, 1}},
      {"conv_norm_out.bias", "out.0.bias", {320}},
      {"conv_out.weight", "out.2.weight", {4, 320, 3, 3}},
  };
  std::map<std::string, UNetParameter> by;
  for (const UNetParameter& p : unet_parameters(UNetConfig{})) by[p.diffusers_name] = p;
  for (const Want& w : xl) {
    SCOPED_TRACE(w.diffusers);
    ASSERT_TRUE(by.count(w.diffusers));
    EXPECT_EQ(by[w.diffusers].original_name, w.sgm);
    EXPECT_EQ(by[w.diffusers].shape, w.shape);
  }
  // SD 1.5: 1x1 convolution projections, no add_embedding, an up block without attention first.
  std::map<std::string, UNetParameter> v15;
  for (const UNetParameter& p : unet_parameters(sd15_unet_config())) v15[p.diffusers_name] = p;
  EXPECT_EQ(v15.count("add_embedding.linear_1.weight"), 0u);
  EXPECT_EQ(v15["up_blocks.0.upsamplers.0.conv.weight"].original_name, "output_blocks.2.1.conv.weight");
  EXPECT_EQ(v15["up_blocks.1.upsamplers.0.conv.weight"].original_name, "output_blocks.5.2.conv.weight");
  EXPECT_EQ(v15["down_blocks.0.attentions.0.proj_in.weight"].shape, (std::vector<int64_t>{320, 320, 1, 1}));
  EXPECT_EQ(v15["down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_v.weight"].shape,
            (std::vector<int64_t>{320, 768}));
  EXPECT_EQ(v15["down_blocks.2.downsamplers.0.conv.weight"].original_name, "input_blocks.9.0.op.weight");
}

TEST(UNetKeys, DetectsLayoutPrefixAndConfiguration) {
  for (const UNetConfig& cfg : {UNetConfig{}, sd15_unet_config(), tiny_unet()}) {
    for (bool sgm : {true, false}) {
      for (const std::string prefix : {"", "model.diffusion_model."}) {
        SCOPED_TRACE(std::string(sgm ? "SGM" : "diffusers") + " prefix '" + prefix + "' blocks " +
                     std::to_string(cfg.block_out_channels.size()));
        const std::vector<KeyShape> keys = keys_of(cfg, sgm, prefix);
        ASSERT_TRUE(is_unet_checkpoint(keys));
        const UNetCheckpoint ck = detect_unet_checkpoint(keys);
        EXPECT_EQ(ck.layout, sgm ? UNetLayout::Original : UNetLayout::Diffusers);
        EXPECT_EQ(ck.prefix, prefix);
        expect_same(ck.config, cfg);
      }
    }
  }
  // An SDXL single file also holds the text encoders and the VAE under their own prefixes.
  std::vector<KeyShape> bundled = keys_of(tiny_unet(), true, "model.diffusion_model.");
  bundled.push_back({"conditioner.embedders.0.transformer.text_model.embeddings.position_embedding.weight", {77, 768}});
  bundled.push_back({"first_stage_model.decoder.conv_in.weight", {512, 4, 3, 3}});
  EXPECT_EQ(detect_unet_checkpoint(bundled).config.block_out_channels, (std::vector<int64_t>{32, 64}));
}

TEST(UNetKeys, IncompleteOrContradictoryListsAreErrorsNamingTheKey) {
  const std::vector<KeyShape> good = keys_of(tiny_unet(), true, "model.diffusion_model.");
  std::string msg;
  EXPECT_FALSE(is_unet_checkpoint({{"double_blocks.0.img_attn.norm.key_norm.scale", {128}}}));
  EXPECT_EQ(detect_status({{"double_blocks.0.img_attn.norm.key_norm.scale", {128}}}, &msg), FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("not a UNet checkpoint"), std::string::npos) << msg;
  const std::string gone = "model.diffusion_model.output_blocks.1.1.transformer_blocks.1.attn1.to_v.weight";
  std::vector<KeyShape> missing;
  for (const KeyShape& k : good)
    if (k.name != gone) missing.push_back(k);
  ASSERT_EQ(missing.size() + 1, good.size());
  EXPECT_EQ(detect_status(missing, &msg), FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find(gone), std::string::npos) << msg;
  std::vector<KeyShape> wrong = good;
  for (KeyShape& k : wrong)
    if (k.name == "model.diffusion_model.middle_block.2.in_layers.2.weight") k.shape[1] = 63;
  EXPECT_EQ(detect_status(wrong, &msg), FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("middle_block.2.in_layers.2.weight"), std::string::npos) << msg;
  std::vector<KeyShape> bad_index = good;
  bad_index.push_back({"model.diffusion_model.input_blocks.x.0.op.weight", {32, 32, 3, 3}});
  EXPECT_EQ(detect_status(bad_index, &msg), FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("input_blocks.x"), std::string::npos) << msg;
  UNetConfig broken = tiny_unet();
  broken.transformer_layers_per_block = {1};
  EXPECT_THROW(unet_parameters(broken), Error);
}

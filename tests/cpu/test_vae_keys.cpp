// AutoencoderKL checkpoint keys without weights (white-box, src/models/vae_keys.*): SDXL and Flux
// VAE parameter totals, LDM names against diffusers' converter (convert_ldm_vae_checkpoint: reversed
// up blocks, nin_shortcut, the mid attention's 1x1 convolutions), detection of layout, prefix and
// configuration (quant convs present or absent) from both layouts, and errors.
#include <gtest/gtest.h>
#include <map>
#include <string>
#include <vector>
#include "core/error.h"
#include "key_test_helpers.h"
#include "model_configs.h"
#include "models/vae_keys.h"

using namespace flame;
using namespace flame::models;
using namespace flame::models::testing;

namespace {

std::vector<KeyShape> keys_of(const VAEConfig& c, bool ldm, const std::string& prefix) {
  return table_keys(vae_parameter_table(c), ldm, prefix);
}

flame_status_t detect_status(const std::vector<KeyShape>& keys, std::string* msg) {
  return status_of([&] { detect_vae_checkpoint(keys); }, msg);
}

}  // namespace

TEST(VAEKeys, SdxlAndFluxTotals) {
  const MappedTable xl = vae_parameter_table(VAEConfig{});
  const MappedTable flux = vae_parameter_table(flux_vae_config());
  EXPECT_EQ(parameter_total(xl), 83653863);    // SDXL's AutoencoderKL
  EXPECT_EQ(parameter_total(flux), 83819683);  // Flux's (and SD3's)
  EXPECT_EQ(xl.parameters.size(), 248u);
  EXPECT_EQ(flux.parameters.size(), 244u);
  EXPECT_EQ(xl.original.size(), xl.parameters.size());  // nothing fused
}

TEST(VAEKeys, LdmNamesFollowDiffusersConverter) {
  struct Want {
    const char* diffusers;
    const char* ldm;
    std::vector<int64_t> shape;
    std::vector<int64_t> stored;
  };
  const Want want[] = {
      {"encoder.conv_in.weight", "encoder.conv_in.weight", {128, 3, 3, 3}, {128, 3, 3, 3}},
      {"encoder.down_blocks.1.resnets.0.conv_shortcut.weight", "encoder.down.1.block.0.nin_shortcut.weight",
       {256, 128, 1, 1}, {256, 128, 1, 1}},
      {"encoder.down_blocks.2.downsamplers.0.conv.bias", "encoder.down.2.downsample.conv.bias", {512}, {512}},
      {"encoder.mid_block.attentions.0.group_norm.weight", "encoder.mid.attn_1.norm.weight", {512}, {512}},
      {"encoder.mid_block.attentions.0.to_q.weight", "encoder.mid.attn_1.q.weight", {512, 512}, {512, 512, 1, 1}},
      {"encoder.mid_block.attentions.0.to_out.0.weight", "encoder.mid.attn_1.proj_out.weight", {512, 512},
       {512, 512, 1, 1}},
      {"encoder.mid_block.resnets.1.conv2.weight", "encoder.mid.block_2.conv2.weight", {512, 512, 3, 3},
       {512, 512, 3, 3}},
      {"encoder.conv_norm_out.bias", "encoder.norm_out.bias", {512}, {512}},
      {"encoder.conv_out.weight", "encoder.conv_out.weight", {8, 512, 3, 3}, {8, 512, 3, 3}},
      {"decoder.conv_in.weight", "decoder.conv_in.weight", {512, 4, 3, 3}, {512, 4, 3, 3}},
      {"decoder.up_blocks.0.resnets.2.conv1.weight", "decoder.up.3.block.2.conv1.weight", {512, 512, 3, 3},
       {512, 512, 3, 3}},
      {"decoder.up_blocks.0.upsamplers.0.conv.weight", "decoder.up.3.upsample.conv.weight", {512, 512, 3, 3},
       {512, 512, 3, 3}},
      {"decoder.up_blocks.2.resnets.0.conv_shortcut.weight", "decoder.up.1.block.0.nin_shortcut.weight",
       {256, 512, 1, 1}, {256, 512, 1, 1}},
      {"decoder.up_blocks.3.resnets.0.norm1.weight", "decoder.up.0.block.0.norm1.weight", {256}, {256}},
      {"decoder.mid_block.attentions.0.to_v.bias", "decoder.mid.attn_1.v.bias", {512}, {512}},
      {"decoder.conv_norm_out.weight", "decoder.norm_out.weight", {128}, {128}},
      {"decoder.conv_out.weight", "decoder.conv_out.weight", {3, 128, 3, 3}, {3, 128, 3, 3}},
      {"quant_conv.weight", "quant_conv.weight", {8, 8, 1, 1}, {8, 8, 1, 1}},
      {"post_quant_conv.bias", "post_quant_conv.bias", {4}, {4}},
  };
  const MappedTable t = vae_parameter_table(VAEConfig{});
  std::map<std::string, MappedParameter> by;
  for (const MappedParameter& p : t.parameters) by[p.diffusers_name] = p;
  std::map<std::string, std::vector<int64_t>> stored;
  for (const KeyShape& k : t.original) stored[k.name] = k.shape;
  for (const Want& w : want) {
    SCOPED_TRACE(w.diffusers);
    ASSERT_TRUE(by.count(w.diffusers));
    EXPECT_EQ(by[w.diffusers].original_name, w.ldm);
    EXPECT_EQ(by[w.diffusers].shape, w.shape);
    EXPECT_EQ(stored[w.ldm], w.stored);
  }
  EXPECT_EQ(by.count("decoder.up_blocks.3.upsamplers.0.conv.weight"), 0u);
  EXPECT_EQ(by.count("encoder.down_blocks.3.downsamplers.0.conv.weight"), 0u);
  for (const MappedParameter& p : vae_parameter_table(flux_vae_config()).parameters)
    EXPECT_EQ(p.diffusers_name.find("quant_conv"), std::string::npos) << p.diffusers_name;
}

TEST(VAEKeys, DetectsLayoutPrefixAndConfiguration) {
  VAEConfig no_attention = flame::models::testing::tiny_vae_config();
  no_attention.mid_block_add_attention = false;
  no_attention.use_quant_conv = false;
  for (const VAEConfig& cfg : {flame::models::testing::tiny_vae_config(), no_attention, VAEConfig{}, flux_vae_config()}) {
    for (bool ldm : {true, false}) {
      for (const std::string prefix : {"", "first_stage_model.", "vae."}) {
        SCOPED_TRACE(std::string(ldm ? "LDM" : "diffusers") + " prefix '" + prefix + "' latent " +
                     std::to_string(cfg.latent_channels));
        const std::vector<KeyShape> keys = keys_of(cfg, ldm, prefix);
        ASSERT_TRUE(is_vae_checkpoint(keys));
        const VAECheckpoint ck = detect_vae_checkpoint(keys);
        EXPECT_EQ(ck.layout, ldm ? VAELayout::Original : VAELayout::Diffusers);
        EXPECT_EQ(ck.prefix, prefix);
        const VAEConfig& c = ck.config;
        EXPECT_EQ(c.in_channels, cfg.in_channels);
        EXPECT_EQ(c.out_channels, cfg.out_channels);
        EXPECT_EQ(c.block_out_channels, cfg.block_out_channels);
        EXPECT_EQ(c.layers_per_block, cfg.layers_per_block);
        EXPECT_EQ(c.latent_channels, cfg.latent_channels);
        EXPECT_EQ(c.use_quant_conv, cfg.use_quant_conv);
        EXPECT_EQ(c.use_post_quant_conv, cfg.use_post_quant_conv);
        EXPECT_EQ(c.mid_block_add_attention, cfg.mid_block_add_attention);
      }
    }
  }
  // Scaling factors are not weights: detection takes SDXL's for 4 latent channels, Flux's for 16.
  const VAEConfig flux = detect_vae_checkpoint(keys_of(flux_vae_config(), true, "")).config;
  EXPECT_DOUBLE_EQ(flux.scaling_factor, 0.3611);
  ASSERT_TRUE(flux.shift_factor.has_value());
  EXPECT_DOUBLE_EQ(*flux.shift_factor, 0.1159);
  const VAEConfig xl = detect_vae_checkpoint(keys_of(VAEConfig{}, true, "first_stage_model.")).config;
  EXPECT_DOUBLE_EQ(xl.scaling_factor, 0.13025);
  EXPECT_FALSE(xl.shift_factor.has_value());
  // An SDXL single file bundles the VAE with the UNet and text encoders.
  std::vector<KeyShape> bundled = keys_of(flame::models::testing::tiny_vae_config(), true, "first_stage_model.");
  bundled.push_back({"model.diffusion_model.input_blocks.0.0.weight", {320, 4, 3, 3}});
  EXPECT_EQ(detect_vae_checkpoint(bundled).prefix, "first_stage_model.");
}

TEST(VAEKeys, IncompleteOrContradictoryListsAreErrorsNamingTheKey) {
  const std::vector<KeyShape> good = keys_of(flame::models::testing::tiny_vae_config(), true, "first_stage_model.");
  std::string msg;
  EXPECT_FALSE(is_vae_checkpoint({{"encoder.conv_in.weight", {8, 3, 3, 3}}}));
  EXPECT_EQ(detect_status({{"encoder.conv_in.weight", {8, 3, 3, 3}}}, &msg), FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("not an AutoencoderKL checkpoint"), std::string::npos) << msg;
  const std::string gone = "first_stage_model.decoder.up.0.block.1.conv2.bias";
  std::vector<KeyShape> missing;
  for (const KeyShape& k : good)
    if (k.name != gone) missing.push_back(k);
  ASSERT_EQ(missing.size() + 1, good.size());
  EXPECT_EQ(detect_status(missing, &msg), FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find(gone), std::string::npos) << msg;
  // The mid attention stored as Linears [C, C] instead of 1x1 convolutions.
  std::vector<KeyShape> linear = good;
  for (KeyShape& k : linear)
    if (k.name == "first_stage_model.encoder.mid.attn_1.k.weight") k.shape = {16, 16};
  EXPECT_EQ(detect_status(linear, &msg), FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("encoder.mid.attn_1.k.weight"), std::string::npos) << msg;
  VAEConfig bad = flame::models::testing::tiny_vae_config();
  bad.block_out_channels.clear();
  EXPECT_THROW(vae_parameter_table(bad), Error);
}

TEST(VAEKeys, DiffusersOrderOfRegistration) {
  // Encoder and Decoder register their block list before the mid block; the mid block its attention
  // before its resnets; AutoencoderKL the quant convs last.
  std::vector<std::string> heads;
  for (const MappedParameter& p : vae_parameter_table(flame::models::testing::tiny_vae_config()).parameters) {
    size_t cut = p.diffusers_name.find('.');
    if (p.diffusers_name.rfind("encoder.", 0) == 0 || p.diffusers_name.rfind("decoder.", 0) == 0)
      cut = p.diffusers_name.find('.', cut + 1);
    const std::string head = p.diffusers_name.substr(0, cut);
    if (heads.empty() || heads.back() != head) heads.push_back(head);
  }
  const std::vector<std::string> want = {"encoder.conv_in", "encoder.down_blocks", "encoder.mid_block",
                                         "encoder.conv_norm_out", "encoder.conv_out", "decoder.conv_in",
                                         "decoder.up_blocks", "decoder.mid_block", "decoder.conv_norm_out",
                                         "decoder.conv_out", "quant_conv", "post_quant_conv"};
  EXPECT_EQ(heads, want);
  const MappedTable t = vae_parameter_table(flame::models::testing::tiny_vae_config());
  std::vector<std::string> mid;
  for (const MappedParameter& p : t.parameters)
    if (p.diffusers_name.rfind("encoder.mid_block.", 0) == 0 && p.diffusers_name.find(".weight") != std::string::npos)
      mid.push_back(p.diffusers_name.substr(18));
  const std::vector<std::string> want_mid = {
      "attentions.0.group_norm.weight", "attentions.0.to_q.weight", "attentions.0.to_k.weight",
      "attentions.0.to_v.weight",       "attentions.0.to_out.0.weight", "resnets.0.norm1.weight",
      "resnets.0.conv1.weight",         "resnets.0.norm2.weight",  "resnets.0.conv2.weight",
      "resnets.1.norm1.weight",         "resnets.1.conv1.weight",  "resnets.1.norm2.weight",
      "resnets.1.conv2.weight"};
  EXPECT_EQ(mid, want_mid);
}

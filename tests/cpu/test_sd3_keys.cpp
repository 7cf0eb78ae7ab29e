// SD3 / SD3.5 MMDiT checkpoint keys without weights (white-box, src/models/sd3_keys.*): parameter
// totals of SD3.5-medium and SD3-medium, the original names against diffusers' converter
// (convert_sd3_transformer_checkpoint_to_diffusers: fused qkv rows, the context-pre-only last block,
// swapped final halves), detection of layout, prefix and configuration from both layouts, and errors.
#include <gtest/gtest.h>
#include <map>
#include <string>
#include <vector>
#include "core/error.h"
#include "key_test_helpers.h"
#include "model_configs.h"
#include "models/clip_keys.h"
#include "models/sd3_keys.h"
#include "models/vae_keys.h"

using namespace flame;
using namespace flame::models;
using namespace flame::models::testing;

namespace {

std::vector<KeyShape> keys_of(const SD3Config& c, bool original, const std::string& prefix) {
  return table_keys(sd3_parameter_table(c), original, prefix);
}

flame_status_t detect_status(const std::vector<KeyShape>& keys, std::string* msg) {
  return status_of([&] { detect_sd3_checkpoint(keys); }, msg);
}

void expect_same(const SD3Config& a, const SD3Config& b) {
  EXPECT_EQ(a.patch_size, b.patch_size);
  EXPECT_EQ(a.in_channels, b.in_channels);
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.attention_head_dim, b.attention_head_dim);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.joint_attention_dim, b.joint_attention_dim);
  EXPECT_EQ(a.caption_projection_dim, b.caption_projection_dim);
  EXPECT_EQ(a.pooled_projection_dim, b.pooled_projection_dim);
  EXPECT_EQ(a.out_channels, b.out_channels);
  EXPECT_EQ(a.pos_embed_max_size, b.pos_embed_max_size);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
  EXPECT_EQ(a.dual_attention_layers, b.dual_attention_layers);
}

}  // namespace

TEST(SD3Keys, Sd35MediumAndSd3MediumTotals) {
  const MappedTable m35 = sd3_parameter_table(SD3Config{});
  const MappedTable m3 = sd3_parameter_table(sd3_medium_config());
  // Parameters plus the positional table (a persistent buffer in state_dict): SD3.5-medium
  // 2,243,171,520 + 384^2 x 1536, SD3-medium 2,028,328,000 + 192^2 x 1536.
  EXPECT_EQ(parameter_total(m35), 2243171520 + 384LL * 384 * 1536);
  EXPECT_EQ(parameter_total(m3), 2028328000 + 192LL * 192 * 1536);
  // keras_hub's SD3 presets count the MMDiT with CLIP-L (with projection), bigG and the 16-channel VAE:
  // 2,987,080,931 (SD3-medium) and 3,371,793,763 (SD3.5-medium), the positional tables included.
  ClipTextConfig clip_l;
  clip_l.with_projection = true;
  const int64_t others = parameter_total(clip_parameter_table(clip_l)) + parameter_total(clip_parameter_table(clip_bigg_config())) +
                         parameter_total(vae_parameter_table(sd3_vae_config()));
  EXPECT_EQ(parameter_total(m3) + others, 2987080931);
  EXPECT_EQ(parameter_total(m35) + others, 3371793763);
  EXPECT_EQ(m35.parameters.size(), 909u);
  EXPECT_EQ(m3.parameters.size(), 683u);
  // The 24 blocks' fused projections (x and context qkv), 13 dual attentions (attn2.qkv).
  int fused = 0;
  for (const KeyShape& k : m35.original)
    if (k.name.size() > 10 && k.name.compare(k.name.size() - 10, 10, "qkv.weight") == 0) ++fused;
  EXPECT_EQ(fused, 24 * 2 + 13);
}

TEST(SD3Keys, OriginalNamesFollowDiffusersConverter) {
  struct Want {
    const char* diffusers;
    const char* original;
    int64_t row_begin;
    std::vector<int64_t> shape;
    bool swap;
  };
  const int64_t d = 1536;
  const Want want[] = {
      {"pos_embed.pos_embed", "pos_embed", 0, {1, 384 * 384, d}, false},
      {"pos_embed.proj.weight", "x_embedder.proj.weight", 0, {d, 16, 2, 2}, false},
      {"time_text_embed.timestep_embedder.linear_1.weight", "t_embedder.mlp.0.weight", 0, {d, 256}, false},
      {"time_text_embed.text_embedder.linear_2.bias", "y_embedder.mlp.2.bias", 0, {d}, false},
      {"context_embedder.weight", "context_embedder.weight", 0, {d, 4096}, false},
      {"transformer_blocks.0.norm1.linear.weight", "joint_blocks.0.x_block.adaLN_modulation.1.weight", 0, {9 * d, d},
       false},
      {"transformer_blocks.13.norm1.linear.weight", "joint_blocks.13.x_block.adaLN_modulation.1.weight", 0, {6 * d, d},
       false},
      {"transformer_blocks.5.attn.to_k.weight", "joint_blocks.5.x_block.attn.qkv.weight", d, {d, d}, false},
      {"transformer_blocks.5.attn.to_v.bias", "joint_blocks.5.x_block.attn.qkv.bias", 2 * d, {d}, false},
      {"transformer_blocks.5.attn.add_q_proj.weight", "joint_blocks.5.context_block.attn.qkv.weight", 0, {d, d}, false},
      {"transformer_blocks.5.attn.norm_added_k.weight", "joint_blocks.5.context_block.attn.ln_k.weight", 0, {64},
       false},
      {"transformer_blocks.5.attn.to_add_out.weight", "joint_blocks.5.context_block.attn.proj.weight", 0, {d, d}, false},
      {"transformer_blocks.12.attn2.to_v.weight", "joint_blocks.12.x_block.attn2.qkv.weight", 2 * d, {d, d}, false},
      {"transformer_blocks.12.attn2.norm_q.weight", "joint_blocks.12.x_block.attn2.ln_q.weight", 0, {64}, false},
      {"transformer_blocks.12.ff.net.0.proj.weight", "joint_blocks.12.x_block.mlp.fc1.weight", 0, {4 * d, d}, false},
      {"transformer_blocks.22.ff_context.net.2.bias", "joint_blocks.22.context_block.mlp.fc2.bias", 0, {d}, false},
      {"transformer_blocks.23.norm1_context.linear.weight", "joint_blocks.23.context_block.adaLN_modulation.1.weight", 0,
       {2 * d, d}, true},
      {"norm_out.linear.bias", "final_layer.adaLN_modulation.1.bias", 0, {2 * d}, true},
      {"proj_out.weight", "final_layer.linear.weight", 0, {64, d}, false},
  };
  std::map<std::string, MappedParameter> by;
  for (const MappedParameter& p : sd3_parameter_table(SD3Config{}).parameters) by[p.diffusers_name] = p;
  for (const Want& w : want) {
    SCOPED_TRACE(w.diffusers);
    ASSERT_TRUE(by.count(w.diffusers));
    EXPECT_EQ(by[w.diffusers].original_name, w.original);
    EXPECT_EQ(by[w.diffusers].row_begin, w.row_begin);
    EXPECT_EQ(by[w.diffusers].shape, w.shape);
    EXPECT_EQ(by[w.diffusers].swap_halves, w.swap);
  }
  // The last block's text stream feeds the attention only; block 13 has no dual attention.
  for (const char* absent : {"transformer_blocks.23.attn.to_add_out.weight", "transformer_blocks.23.ff_context.net.2.bias",
                             "transformer_blocks.13.attn2.to_q.weight"})
    EXPECT_EQ(by.count(absent), 0u) << absent;
  // SD3-medium: no QK norms.
  for (const MappedParameter& p : sd3_parameter_table(sd3_medium_config()).parameters)
    EXPECT_EQ(p.diffusers_name.find("norm_q"), std::string::npos) << p.diffusers_name;
}

TEST(SD3Keys, DetectsLayoutPrefixAndConfiguration) {
  SD3Config plain = flame::models::testing::tiny_sd3_config();
  plain.qk_norm = "";
  plain.attention_head_dim = 64;
  plain.num_attention_heads = 1;
  plain.caption_projection_dim = 64;
  plain.dual_attention_layers.clear();
  for (const SD3Config& cfg : {flame::models::testing::tiny_sd3_config(), plain, SD3Config{}, sd3_medium_config()}) {
    for (bool original : {true, false}) {
      for (const std::string prefix : {"", "model.diffusion_model."}) {
        SCOPED_TRACE(std::string(original ? "original" : "diffusers") + " prefix '" + prefix + "' layers " +
                     std::to_string(cfg.num_layers));
        const std::vector<KeyShape> keys = keys_of(cfg, original, prefix);
        ASSERT_TRUE(is_sd3_checkpoint(keys));
        const SD3Checkpoint ck = detect_sd3_checkpoint(keys);
        EXPECT_EQ(ck.layout, original ? SD3Layout::Original : SD3Layout::Diffusers);
        EXPECT_EQ(ck.prefix, prefix);
        expect_same(ck.config, cfg);
      }
    }
  }
  // An SD3.5 single file also holds the text encoders and the VAE.
  std::vector<KeyShape> bundled = keys_of(flame::models::testing::tiny_sd3_config(), true, "model.diffusion_model.");
  bundled.push_back({"text_encoders.clip_l.transformer.text_model.final_layer_norm.weight", {768}});
  bundled.push_back({"first_stage_model.decoder.conv_in.weight", {512, 16, 3, 3}});
  EXPECT_EQ(detect_sd3_checkpoint(bundled).config.num_layers, 3);
}

TEST(SD3Keys, IncompleteOrContradictoryListsAreErrorsNamingTheKey) {
  const std::vector<KeyShape> good = keys_of(flame::models::testing::tiny_sd3_config(), true, "");
  std::string msg;
  EXPECT_FALSE(is_sd3_checkpoint({{"double_blocks.0.img_attn.norm.key_norm.scale", {128}}}));
  EXPECT_EQ(detect_status({{"double_blocks.0.img_attn.norm.key_norm.scale", {128}}}, &msg), FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("not an SD3 checkpoint"), std::string::npos) << msg;
  const std::string gone = "joint_blocks.1.context_block.mlp.fc2.bias";
  std::vector<KeyShape> missing;
  for (const KeyShape& k : good)
    if (k.name != gone) missing.push_back(k);
  ASSERT_EQ(missing.size() + 1, good.size());
  EXPECT_EQ(detect_status(missing, &msg), FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find(gone), std::string::npos) << msg;
  std::vector<KeyShape> wrong = good;
  for (KeyShape& k : wrong)
    if (k.name == "joint_blocks.2.x_block.attn.qkv.weight") k.shape[0] = 47;
  EXPECT_EQ(detect_status(wrong, &msg), FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("joint_blocks.2.x_block.attn.qkv.weight"), std::string::npos) << msg;
  std::vector<KeyShape> not_square = good;
  for (KeyShape& k : not_square)
    if (k.name == "pos_embed") k.shape[1] = 63;
  EXPECT_EQ(detect_status(not_square, &msg), FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("pos_embed"), std::string::npos) << msg;
  std::vector<KeyShape> empty_patch = good;  // would divide by the patch area
  for (KeyShape& k : empty_patch)
    if (k.name == "x_embedder.proj.weight") k.shape[2] = k.shape[3] = 0;
  EXPECT_EQ(detect_status(empty_patch, &msg), FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("x_embedder.proj.weight"), std::string::npos) << msg;
  std::vector<KeyShape> no_positions = good;
  for (KeyShape& k : no_positions)
    if (k.name == "pos_embed") k.shape[1] = 0;
  EXPECT_EQ(detect_status(no_positions, &msg), FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("pos_embed"), std::string::npos) << msg;
  std::vector<KeyShape> layer_norm = good;
  layer_norm.push_back({"joint_blocks.0.x_block.attn.ln_q.bias", {8}});
  EXPECT_EQ(detect_status(layer_norm, &msg), FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("ln_q.bias"), std::string::npos) << msg;
  SD3Config bad = flame::models::testing::tiny_sd3_config();
  bad.dual_attention_layers = {3};
  EXPECT_THROW(sd3_parameter_table(bad), Error);
  bad = flame::models::testing::tiny_sd3_config();
  bad.caption_projection_dim = 12;
  EXPECT_THROW(sd3_parameter_table(bad), Error);
  bad = flame::models::testing::tiny_sd3_config();
  bad.qk_norm = "layer_norm";
  EXPECT_THROW(sd3_parameter_table(bad), Error);
}

TEST(SD3Keys, DiffusersOrderOfRegistration) {
  const MappedTable t = sd3_parameter_table(flame::models::testing::tiny_sd3_config());
  ASSERT_GE(t.parameters.size(), 3u);
  EXPECT_EQ(t.parameters[0].diffusers_name, "pos_embed.pos_embed");  // PatchEmbed's own buffer before its proj
  EXPECT_EQ(t.parameters[1].diffusers_name, "pos_embed.proj.weight");
  EXPECT_EQ(t.parameters.back().diffusers_name, "proj_out.bias");
  auto block_weights = [&](const std::string& head) {
    std::vector<std::string> out;
    for (const MappedParameter& p : t.parameters)
      if (p.diffusers_name.rfind(head, 0) == 0 && p.diffusers_name.find(".weight") != std::string::npos)
        out.push_back(p.diffusers_name.substr(head.size()));
    return out;
  };
  // Block 0: dual attention (norm1 of 9 chunks, attn2); Attention registers add_k, add_v, then add_q.
  const std::vector<std::string> block0 = {
      "norm1.linear.weight", "norm1_context.linear.weight", "attn.norm_q.weight", "attn.norm_k.weight",
      "attn.to_q.weight", "attn.to_k.weight", "attn.to_v.weight", "attn.add_k_proj.weight", "attn.add_v_proj.weight",
      "attn.add_q_proj.weight", "attn.to_out.0.weight", "attn.to_add_out.weight", "attn.norm_added_q.weight",
      "attn.norm_added_k.weight", "attn2.norm_q.weight", "attn2.norm_k.weight", "attn2.to_q.weight",
      "attn2.to_k.weight", "attn2.to_v.weight", "attn2.to_out.0.weight", "ff.net.0.proj.weight", "ff.net.2.weight",
      "ff_context.net.0.proj.weight", "ff_context.net.2.weight"};
  EXPECT_EQ(block_weights("transformer_blocks.0."), block0);
  // The last block: context_pre_only.
  const std::vector<std::string> last = {
      "norm1.linear.weight", "norm1_context.linear.weight", "attn.norm_q.weight", "attn.norm_k.weight",
      "attn.to_q.weight", "attn.to_k.weight", "attn.to_v.weight", "attn.add_k_proj.weight", "attn.add_v_proj.weight",
      "attn.add_q_proj.weight", "attn.to_out.0.weight", "attn.norm_added_q.weight", "attn.norm_added_k.weight",
      "ff.net.0.proj.weight", "ff.net.2.weight"};
  EXPECT_EQ(block_weights("transformer_blocks.2."), last);
}

// Flux checkpoint keys without weights (white-box, src/models/flux_keys.*): the Black Forest Labs
// and diffusers tensor lists of Flux-dev, the parameter table against diffusers' converter
// (loaders/single_file_utils.py, convert_flux_transformer_checkpoint_to_diffusers), rows of every
// fused tensor covered exactly once, detection of layout, prefix and configuration from key lists
// (tiny and full-size), and the errors for incomplete or contradictory lists.
#include <gtest/gtest.h>
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>
#include "core/error.h"
#include "key_test_helpers.h"
#include "model_configs.h"
#include "models/flux_keys.h"

using namespace flame;
using namespace flame::models;
using flame::models::testing::element_count;
using flame::models::testing::status_of;
using flame::models::testing::with_prefix;

namespace {

// The shared tiny Flux without the guidance embedder (schnell's kind).
FluxConfig tiny_config() {
  FluxConfig c = flame::models::testing::tiny_flux_config();
  c.guidance_embeds = false;
  return c;
}

flame_status_t detect_status(const std::vector<KeyShape>& keys, std::string* msg) {
  return status_of([&] { detect_flux_checkpoint(keys); }, msg);
}

void expect_same_config(const FluxConfig& a, const FluxConfig& b) {
  EXPECT_EQ(a.in_channels, b.in_channels);
  EXPECT_EQ(a.out_channels, b.out_channels);
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.num_single_layers, b.num_single_layers);
  EXPECT_EQ(a.attention_head_dim, b.attention_head_dim);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.joint_attention_dim, b.joint_attention_dim);
  EXPECT_EQ(a.pooled_projection_dim, b.pooled_projection_dim);
  EXPECT_EQ(a.mlp_hidden_dim, b.mlp_hidden_dim);
  EXPECT_EQ(a.guidance_embeds, b.guidance_embeds);
}

}  // namespace

TEST(FluxKeys, FluxDevTensorCountsAndSizes) {
  const FluxConfig dev;  // the defaults are Flux-dev's
  const std::vector<KeyShape> bfl = flux_original_tensors(dev);
  const std::vector<KeyShape> diff = flux_diffusers_tensors(dev);
  // flux1-dev.safetensors holds 780 tensors; FluxTransformer2DModel's state_dict 1160 (19 double blocks
  // of 32, 38 single blocks of 14, 16 embedder and 4 output tensors).
  EXPECT_EQ(bfl.size(), 780u);
  EXPECT_EQ(diff.size(), 1160u);
  int64_t n_bfl = 0, n_diff = 0;
  for (const KeyShape& k : bfl) n_bfl += element_count(k.shape);
  for (const KeyShape& k : diff) n_diff += element_count(k.shape);
  EXPECT_EQ(n_bfl, n_diff);
  EXPECT_EQ(n_bfl, 11901408320);  // Flux-dev's 11.9 B parameters
  // Schnell has no guidance embedder: 4 tensors fewer.
  FluxConfig schnell;
  schnell.guidance_embeds = false;
  EXPECT_EQ(flux_original_tensors(schnell).size(), 776u);
  std::set<std::string> names;
  for (const KeyShape& k : diff) EXPECT_TRUE(names.insert(k.name).second) << "duplicate " << k.name;
}

TEST(FluxKeys, ParameterTableMatchesDiffusersConverter) {
  const FluxConfig dev;
  std::map<std::string, FluxParameter> by;
  for (const FluxParameter& p : flux_parameter_map(dev)) by[p.diffusers_name] = p;
  struct Want {
    const char* diffusers;
    const char* original;
    int64_t begin, rows;
    bool swap;
  };
  const Want wants[] = {
      {"time_text_embed.timestep_embedder.linear_1.weight", "time_in.in_layer.weight", 0, 3072, false},
      {"time_text_embed.guidance_embedder.linear_2.bias", "guidance_in.out_layer.bias", 0, 3072, false},
      {"time_text_embed.text_embedder.linear_1.weight", "vector_in.in_layer.weight", 0, 3072, false},
      {"context_embedder.weight", "txt_in.weight", 0, 3072, false},
      {"x_embedder.bias", "img_in.bias", 0, 3072, false},
      {"transformer_blocks.0.norm1.linear.weight", "double_blocks.0.img_mod.lin.weight", 0, 18432, false},
      {"transformer_blocks.18.norm1_context.linear.bias", "double_blocks.18.txt_mod.lin.bias", 0, 18432, false},
      {"transformer_blocks.3.attn.to_q.weight", "double_blocks.3.img_attn.qkv.weight", 0, 3072, false},
      {"transformer_blocks.3.attn.to_v.bias", "double_blocks.3.img_attn.qkv.bias", 6144, 3072, false},
      {"transformer_blocks.3.attn.add_k_proj.weight", "double_blocks.3.txt_attn.qkv.weight", 3072, 3072, false},
      {"transformer_blocks.7.attn.norm_added_q.weight", "double_blocks.7.txt_attn.norm.query_norm.scale", 0, 128, false},
      {"transformer_blocks.7.attn.norm_k.weight", "double_blocks.7.img_attn.norm.key_norm.scale", 0, 128, false},
      {"transformer_blocks.1.attn.to_out.0.weight", "double_blocks.1.img_attn.proj.weight", 0, 3072, false},
      {"transformer_blocks.1.attn.to_add_out.bias", "double_blocks.1.txt_attn.proj.bias", 0, 3072, false},
      {"transformer_blocks.2.ff.net.0.proj.weight", "double_blocks.2.img_mlp.0.weight", 0, 12288, false},
      {"transformer_blocks.2.ff_context.net.2.weight", "double_blocks.2.txt_mlp.2.weight", 0, 3072, false},
      {"single_transformer_blocks.0.norm.linear.weight", "single_blocks.0.modulation.lin.weight", 0, 9216, false},
      {"single_transformer_blocks.5.attn.to_k.weight", "single_blocks.5.linear1.weight", 3072, 3072, false},
      {"single_transformer_blocks.5.proj_mlp.bias", "single_blocks.5.linear1.bias", 9216, 12288, false},
      {"single_transformer_blocks.37.proj_out.weight", "single_blocks.37.linear2.weight", 0, 3072, false},
      {"single_transformer_blocks.37.attn.norm_q.weight", "single_blocks.37.norm.query_norm.scale", 0, 128, false},
      {"proj_out.weight", "final_layer.linear.weight", 0, 64, false},
      {"norm_out.linear.weight", "final_layer.adaLN_modulation.1.weight", 0, 6144, true},
      {"norm_out.linear.bias", "final_layer.adaLN_modulation.1.bias", 0, 6144, true},
  };
  for (const Want& w : wants) {
    SCOPED_TRACE(w.diffusers);
    auto it = by.find(w.diffusers);
    ASSERT_NE(it, by.end());
    EXPECT_EQ(it->second.original_name, w.original);
    EXPECT_EQ(it->second.row_begin, w.begin);
    EXPECT_EQ(it->second.rows, w.rows);
    EXPECT_EQ(it->second.swap_halves, w.swap);
  }
  // Shapes of the diffusers parameters that come from fused tensors.
  std::map<std::string, std::vector<int64_t>> shape;
  for (const KeyShape& k : flux_diffusers_tensors(dev)) shape[k.name] = k.shape;
  EXPECT_EQ(shape["single_transformer_blocks.0.proj_mlp.weight"], (std::vector<int64_t>{12288, 3072}));
  EXPECT_EQ(shape["single_transformer_blocks.0.proj_out.weight"], (std::vector<int64_t>{3072, 15360}));
  EXPECT_EQ(shape["transformer_blocks.0.attn.add_v_proj.bias"], (std::vector<int64_t>{3072}));
  EXPECT_EQ(shape["norm_out.linear.weight"], (std::vector<int64_t>{6144, 3072}));
}

TEST(FluxKeys, EveryOriginalRowBelongsToExactlyOneParameter) {
  for (const FluxConfig& cfg : {FluxConfig{}, tiny_config()}) {
    std::map<std::string, int64_t> rows;
    for (const KeyShape& k : flux_original_tensors(cfg)) rows[k.name] = k.shape[0];
    std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> covered;
    for (const FluxParameter& p : flux_parameter_map(cfg)) {
      ASSERT_TRUE(rows.count(p.original_name)) << p.diffusers_name << " lives in unknown " << p.original_name;
      covered[p.original_name].push_back({p.row_begin, p.rows});
    }
    ASSERT_EQ(covered.size(), rows.size());
    for (auto& c : covered) {
      std::sort(c.second.begin(), c.second.end());
      int64_t at = 0;
      for (const auto& r : c.second) {
        EXPECT_EQ(r.first, at) << c.first;
        EXPECT_GT(r.second, 0) << c.first;
        at = r.first + r.second;
      }
      EXPECT_EQ(at, rows[c.first]) << c.first;
    }
  }
}

TEST(FluxKeys, DiffusersOrderOfRegistration) {
  const std::vector<FluxParameter> map = flux_parameter_map(tiny_config());
  ASSERT_FALSE(map.empty());
  EXPECT_EQ(map.front().diffusers_name, "time_text_embed.timestep_embedder.linear_1.weight");
  EXPECT_EQ(map[1].diffusers_name, "time_text_embed.timestep_embedder.linear_1.bias");
  EXPECT_EQ(map.back().diffusers_name, "proj_out.bias");
  std::vector<std::string> block0;
  for (const FluxParameter& p : map)
    if (p.diffusers_name.rfind("transformer_blocks.0.", 0) == 0 && p.diffusers_name.find(".weight") != std::string::npos)
      block0.push_back(p.diffusers_name.substr(21));
  const std::vector<std::string> want = {
      "norm1.linear.weight", "norm1_context.linear.weight", "attn.norm_q.weight", "attn.norm_k.weight",
      "attn.to_q.weight", "attn.to_k.weight", "attn.to_v.weight", "attn.to_out.0.weight",
      "attn.norm_added_q.weight", "attn.norm_added_k.weight", "attn.add_q_proj.weight", "attn.add_k_proj.weight",
      "attn.add_v_proj.weight", "attn.to_add_out.weight", "ff.net.0.proj.weight", "ff.net.2.weight",
      "ff_context.net.0.proj.weight", "ff_context.net.2.weight"};
  EXPECT_EQ(block0, want);
}

TEST(FluxKeys, DetectsLayoutPrefixAndConfiguration) {
  for (const FluxConfig& cfg : {FluxConfig{}, tiny_config()}) {
    for (const std::string prefix : {"", "model.diffusion_model."}) {
      SCOPED_TRACE("prefix '" + prefix + "', width " + std::to_string(cfg.inner_dim()));
      const std::vector<KeyShape> bfl = with_prefix(flux_original_tensors(cfg), prefix);
      ASSERT_TRUE(is_flux_checkpoint(bfl));
      const FluxCheckpoint a = detect_flux_checkpoint(bfl);
      EXPECT_EQ(a.layout, FluxLayout::Original);
      EXPECT_EQ(a.prefix, prefix);
      expect_same_config(a.config, cfg);
      const std::vector<KeyShape> diff = with_prefix(flux_diffusers_tensors(cfg), prefix);
      ASSERT_TRUE(is_flux_checkpoint(diff));
      const FluxCheckpoint b = detect_flux_checkpoint(diff);
      EXPECT_EQ(b.layout, FluxLayout::Diffusers);
      EXPECT_EQ(b.prefix, prefix);
      expect_same_config(b.config, cfg);
    }
  }
  // Other components bundled in the same file are left alone.
  std::vector<KeyShape> bundled = flux_original_tensors(tiny_config());
  bundled.push_back({"vae.decoder.conv_in.weight", {4, 4, 3, 3}});
  EXPECT_EQ(detect_flux_checkpoint(bundled).config.num_layers, 2);
}

TEST(FluxKeys, IncompleteOrContradictoryListsAreErrorsNamingTheKey) {
  const std::vector<KeyShape> good = flux_original_tensors(tiny_config());
  std::string msg;
  // Not Flux at all.
  EXPECT_FALSE(is_flux_checkpoint({{"model.diffusion_model.input_blocks.0.0.weight", {320, 4, 3, 3}}}));
  EXPECT_EQ(detect_status({{"input_blocks.0.0.weight", {320, 4, 3, 3}}}, &msg), FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("not a Flux checkpoint"), std::string::npos) << msg;
  // A missing tensor.
  std::vector<KeyShape> missing = good;
  missing.erase(std::remove_if(missing.begin(), missing.end(),
                               [](const KeyShape& k) { return k.name == "single_blocks.1.linear2.bias"; }),
                missing.end());
  EXPECT_EQ(detect_status(missing, &msg), FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("single_blocks.1.linear2.bias"), std::string::npos) << msg;
  // A wrong shape.
  std::vector<KeyShape> wrong = good;
  for (KeyShape& k : wrong)
    if (k.name == "double_blocks.1.txt_attn.qkv.weight") k.shape[0] += 1;
  EXPECT_EQ(detect_status(wrong, &msg), FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("double_blocks.1.txt_attn.qkv.weight"), std::string::npos) << msg;
  // A gap in the block indices.
  std::vector<KeyShape> gap = good;
  for (KeyShape& k : gap)
    if (k.name.rfind("single_blocks.2.", 0) == 0) k.name.replace(0, 16, "single_blocks.4.");
  EXPECT_EQ(detect_status(gap, &msg), FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("single_blocks.2"), std::string::npos) << msg;
  // Widths that disagree (an inner width that is no multiple of the head width).
  std::vector<KeyShape> heads = good;
  for (KeyShape& k : heads)
    if (k.name == "double_blocks.0.img_attn.norm.query_norm.scale") k.shape[0] = 12;
  EXPECT_EQ(detect_status(heads, &msg), FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("head width"), std::string::npos) << msg;
  // A block index that is not a number.
  std::vector<KeyShape> bad_index = good;
  bad_index.push_back({"double_blocks.x.img_mod.lin.weight", {192, 32}});
  EXPECT_EQ(detect_status(bad_index, &msg), FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("double_blocks.x"), std::string::npos) << msg;
}

// CLIP and T5 text encoder checkpoint keys without weights (white-box, src/models/clip_keys.*,
// t5_keys.*): CLIP-L, bigG and T5-XXL parameter totals, OpenCLIP names against diffusers' converter
// (convert_open_clip_checkpoint: in_proj rows, transposed text_projection), detection of the
// encoders of SDXL and SD3.5 single files and diffusers folders, and errors.
#include <gtest/gtest.h>
#include <map>
#include <string>
#include <vector>
#include "core/error.h"
#include "key_test_helpers.h"
#include "model_configs.h"
#include "models/clip_keys.h"
#include "models/t5_keys.h"

using namespace flame;
using namespace flame::models;
using namespace flame::models::testing;

namespace {

std::vector<KeyShape> clip_keys(const ClipTextConfig& c, bool open_clip, const std::string& prefix) {
  return table_keys(clip_parameter_table(c), open_clip, prefix);
}

void expect_same(const ClipTextConfig& a, const ClipTextConfig& b) {
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.hidden_act, b.hidden_act);
  EXPECT_EQ(a.with_projection, b.with_projection);
  if (a.with_projection) EXPECT_EQ(a.projection_dim, b.projection_dim);
}

}  // namespace

TEST(ClipKeys, ClipLAndBigGTotals) {
  ClipTextConfig with_projection;
  with_projection.with_projection = true;
  EXPECT_EQ(parameter_total(clip_parameter_table(ClipTextConfig{})), 123060480);      // CLIP-L CLIPTextModel
  EXPECT_EQ(parameter_total(clip_parameter_table(with_projection)), 123060480 + 768 * 768);  // SD3's CLIP-L
  EXPECT_EQ(parameter_total(clip_parameter_table(clip_bigg_config())), 694659840);    // SDXL's text_encoder_2
  EXPECT_EQ(clip_parameter_table(ClipTextConfig{}).parameters.size(), 196u);
  EXPECT_EQ(clip_parameter_table(clip_bigg_config()).parameters.size(), 517u);
}

TEST(ClipKeys, OpenClipNamesFollowDiffusersConverter) {
  const MappedTable t = clip_parameter_table(clip_bigg_config());
  std::map<std::string, MappedParameter> by;
  for (const MappedParameter& p : t.parameters) by[p.diffusers_name] = p;
  std::map<std::string, std::vector<int64_t>> stored;
  for (const KeyShape& k : t.original) stored[k.name] = k.shape;
  auto check = [&](const std::string& d, const std::string& o, int64_t row, std::vector<int64_t> shape) {
    SCOPED_TRACE(d);
    ASSERT_TRUE(by.count(d));
    EXPECT_EQ(by[d].original_name, o);
    EXPECT_EQ(by[d].row_begin, row);
    EXPECT_EQ(by[d].shape, shape);
  };
  check("text_model.embeddings.token_embedding.weight", "token_embedding.weight", 0, {49408, 1280});
  check("text_model.embeddings.position_embedding.weight", "positional_embedding", 0, {77, 1280});
  check("text_model.encoder.layers.7.self_attn.q_proj.weight", "transformer.resblocks.7.attn.in_proj_weight", 0,
        {1280, 1280});
  check("text_model.encoder.layers.7.self_attn.k_proj.bias", "transformer.resblocks.7.attn.in_proj_bias", 1280, {1280});
  check("text_model.encoder.layers.7.self_attn.v_proj.weight", "transformer.resblocks.7.attn.in_proj_weight", 2560,
        {1280, 1280});
  check("text_model.encoder.layers.31.self_attn.out_proj.weight", "transformer.resblocks.31.attn.out_proj.weight", 0,
        {1280, 1280});
  check("text_model.encoder.layers.0.layer_norm1.bias", "transformer.resblocks.0.ln_1.bias", 0, {1280});
  check("text_model.encoder.layers.0.mlp.fc1.weight", "transformer.resblocks.0.mlp.c_fc.weight", 0, {5120, 1280});
  check("text_model.encoder.layers.0.mlp.fc2.weight", "transformer.resblocks.0.mlp.c_proj.weight", 0, {1280, 5120});
  check("text_model.encoder.layers.0.layer_norm2.weight", "transformer.resblocks.0.ln_2.weight", 0, {1280});
  check("text_model.final_layer_norm.weight", "ln_final.weight", 0, {1280});
  check("text_projection.weight", "text_projection", 0, {1280, 1280});
  EXPECT_TRUE(by["text_projection.weight"].transposed);
  EXPECT_EQ(stored["transformer.resblocks.7.attn.in_proj_weight"], (std::vector<int64_t>{3840, 1280}));
  // A non-square projection shows the transposition in the stored shape.
  const MappedTable tiny = clip_parameter_table(flame::models::testing::tiny_clip_config());
  EXPECT_EQ(tiny.diffusers_tensors().back().shape, (std::vector<int64_t>{48, 64}));
  EXPECT_EQ(tiny.original.back().shape, (std::vector<int64_t>{64, 48}));
}

TEST(ClipKeys, DetectsEncodersOfSingleFilesAndFolders) {
  ClipTextConfig clip_l_sd3;
  clip_l_sd3.with_projection = true;
  for (const ClipTextConfig& cfg : {flame::models::testing::tiny_clip_config(), ClipTextConfig{}, clip_bigg_config()}) {
    for (bool open_clip : {true, false}) {
      const std::string prefix = open_clip ? "conditioner.embedders.1.model." : "text_encoders.clip_g.transformer.";
      SCOPED_TRACE(std::string(open_clip ? "OpenCLIP" : "transformers") + " width " + std::to_string(cfg.hidden_size));
      if (open_clip && !cfg.with_projection) continue;  // OpenCLIP towers always store their projection
      const std::vector<KeyShape> keys = clip_keys(cfg, open_clip, prefix);
      ASSERT_TRUE(is_clip_checkpoint(keys));
      const std::vector<ClipCheckpoint> found = detect_clip_checkpoints(keys);
      ASSERT_EQ(found.size(), 1u);
      EXPECT_EQ(found[0].layout, open_clip ? ClipLayout::OpenCLIP : ClipLayout::Transformers);
      EXPECT_EQ(found[0].prefix, prefix);
      ClipTextConfig want = cfg;
      if (cfg.hidden_size == 64) want.hidden_act = "gelu";  // detection's rule for widths other than 768
      expect_same(found[0].config, want);
    }
  }
  // SDXL: CLIP-L in transformers names and bigG in OpenCLIP names, beside the UNet.
  std::vector<KeyShape> sdxl = clip_keys(ClipTextConfig{}, false, "conditioner.embedders.0.transformer.");
  for (const KeyShape& k : clip_keys(clip_bigg_config(), true, "conditioner.embedders.1.model.")) sdxl.push_back(k);
  sdxl.push_back({"conditioner.embedders.1.model.logit_scale", {}});
  sdxl.push_back({"model.diffusion_model.out.2.weight", {4, 320, 3, 3}});
  std::vector<ClipCheckpoint> found = detect_clip_checkpoints(sdxl);
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].prefix, "conditioner.embedders.0.transformer.");
  expect_same(found[0].config, ClipTextConfig{});
  EXPECT_EQ(found[1].prefix, "conditioner.embedders.1.model.");
  expect_same(found[1].config, clip_bigg_config());
  // SD3.5: both in transformers names, both with projections.
  std::vector<KeyShape> sd35 = clip_keys(clip_l_sd3, false, "text_encoders.clip_l.transformer.");
  for (const KeyShape& k : clip_keys(clip_bigg_config(), false, "text_encoders.clip_g.transformer.")) sd35.push_back(k);
  found = detect_clip_checkpoints(sd35);
  ASSERT_EQ(found.size(), 2u);
  expect_same(found[0].config, clip_l_sd3);
  expect_same(found[1].config, clip_bigg_config());
  EXPECT_EQ(detect_clip_checkpoint_at(sd35, "text_encoders.clip_g.transformer.").config.num_hidden_layers, 32);
  // A diffusers folder's text_encoder/ (no prefix).
  EXPECT_EQ(detect_clip_checkpoints(clip_keys(ClipTextConfig{}, false, ""))[0].prefix, "");
  EXPECT_EQ(detect_clip_checkpoint(sdxl).prefix, "conditioner.embedders.0.transformer.");
}

TEST(ClipKeys, IncompleteOrContradictoryListsAreErrorsNamingTheKey) {
  const std::string pre = "conditioner.embedders.1.model.";
  const std::vector<KeyShape> good = clip_keys(flame::models::testing::tiny_clip_config(), true, pre);
  std::string msg;
  EXPECT_FALSE(is_clip_checkpoint({{"shared.weight", {10, 4}}}));
  EXPECT_EQ(status_of([] { detect_clip_checkpoints({{"shared.weight", {10, 4}}}); }, &msg), FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("not a CLIP text encoder"), std::string::npos) << msg;
  EXPECT_EQ(status_of([&] { detect_clip_checkpoint_at(good, "cond_stage_model.model."); }, &msg),
            FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("cond_stage_model.model."), std::string::npos) << msg;
  const std::string gone = pre + "transformer.resblocks.1.mlp.c_proj.bias";
  std::vector<KeyShape> missing;
  for (const KeyShape& k : good)
    if (k.name != gone) missing.push_back(k);
  ASSERT_EQ(missing.size() + 1, good.size());
  EXPECT_EQ(status_of([&] { detect_clip_checkpoints(missing); }, &msg), FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find(gone), std::string::npos) << msg;
  std::vector<KeyShape> wrong = good;
  for (KeyShape& k : wrong)
    if (k.name == pre + "transformer.resblocks.0.attn.in_proj_weight") k.shape[0] = 64;
  EXPECT_EQ(status_of([&] { detect_clip_checkpoints(wrong); }, &msg), FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("in_proj_weight"), std::string::npos) << msg;
  std::vector<KeyShape> narrow = good;  // no 64-wide head fits
  for (KeyShape& k : narrow)
    if (k.name == pre + "token_embedding.weight") k.shape[1] = 0;
  EXPECT_EQ(status_of([&] { detect_clip_checkpoints(narrow); }, &msg), FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("token_embedding.weight"), std::string::npos) << msg;
  ClipTextConfig bad = flame::models::testing::tiny_clip_config();
  bad.num_attention_heads = 3;
  EXPECT_THROW(clip_parameter_table(bad), Error);
}

TEST(T5Keys, T5XxlTotalsAndNames) {
  const MappedTable t = t5_parameter_table(T5Config{});
  EXPECT_EQ(parameter_total(t), 4762310656);  // T5-XXL v1.1's encoder
  EXPECT_EQ(t.parameters.size(), 219u);
  std::map<std::string, std::vector<int64_t>> by;
  for (const MappedParameter& p : t.parameters) {
    EXPECT_EQ(p.original_name, p.diffusers_name);
    by[p.diffusers_name] = p.shape;
  }
  EXPECT_EQ(t.parameters.front().diffusers_name, "shared.weight");
  EXPECT_EQ(by["shared.weight"], (std::vector<int64_t>{32128, 4096}));
  EXPECT_EQ(by["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"], (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(by.count("encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"), 0u);
  EXPECT_EQ(by["encoder.block.23.layer.1.DenseReluDense.wi_1.weight"], (std::vector<int64_t>{10240, 4096}));
  EXPECT_EQ(by["encoder.block.23.layer.1.DenseReluDense.wo.weight"], (std::vector<int64_t>{4096, 10240}));
  EXPECT_EQ(by["encoder.block.5.layer.0.SelfAttention.o.weight"], (std::vector<int64_t>{4096, 4096}));
  EXPECT_EQ(by["encoder.final_layer_norm.weight"], (std::vector<int64_t>{4096}));
}

TEST(T5Keys, DetectsPrefixAndConfiguration) {
  T5Config relu = flame::models::testing::tiny_t5_config();
  relu.feed_forward_proj = "relu";
  for (const T5Config& cfg : {flame::models::testing::tiny_t5_config(), relu, T5Config{}}) {
    for (const std::string prefix : {"", "text_encoders.t5xxl.transformer."}) {
      SCOPED_TRACE(prefix + " " + cfg.feed_forward_proj + " width " + std::to_string(cfg.d_model));
      const std::vector<KeyShape> keys = with_prefix(t5_parameter_table(cfg).diffusers_tensors(), prefix);
      ASSERT_TRUE(is_t5_checkpoint(keys));
      const T5Checkpoint ck = detect_t5_checkpoint(keys);
      EXPECT_EQ(ck.prefix, prefix);
      EXPECT_EQ(ck.embedding_name, "shared.weight");
      const T5Config& c = ck.config;
      EXPECT_EQ(c.vocab_size, cfg.vocab_size);
      EXPECT_EQ(c.d_model, cfg.d_model);
      EXPECT_EQ(c.d_kv, cfg.d_kv);
      EXPECT_EQ(c.d_ff, cfg.d_ff);
      EXPECT_EQ(c.num_layers, cfg.num_layers);
      EXPECT_EQ(c.num_heads, cfg.num_heads);
      EXPECT_EQ(c.relative_attention_num_buckets, cfg.relative_attention_num_buckets);
      EXPECT_EQ(c.feed_forward_proj, cfg.feed_forward_proj);
    }
  }
  // The embedding stored under the tied name only.
  std::vector<KeyShape> tied = t5_parameter_table(flame::models::testing::tiny_t5_config()).diffusers_tensors();
  tied.front().name = "encoder.embed_tokens.weight";
  EXPECT_EQ(detect_t5_checkpoint(tied).embedding_name, "encoder.embed_tokens.weight");
}

TEST(T5Keys, IncompleteOrContradictoryListsAreErrorsNamingTheKey) {
  const std::vector<KeyShape> good = t5_parameter_table(flame::models::testing::tiny_t5_config()).diffusers_tensors();
  std::string msg;
  EXPECT_FALSE(is_t5_checkpoint({{"shared.weight", {10, 4}}}));
  EXPECT_EQ(status_of([] { detect_t5_checkpoint({{"shared.weight", {10, 4}}}); }, &msg), FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("not a T5 encoder checkpoint"), std::string::npos) << msg;
  for (const std::string gone : {"encoder.block.1.layer.1.DenseReluDense.wi_1.weight", "shared.weight"}) {
    std::vector<KeyShape> missing;
    for (const KeyShape& k : good)
      if (k.name != gone) missing.push_back(k);
    ASSERT_EQ(missing.size() + 1, good.size());
    EXPECT_EQ(status_of([&] { detect_t5_checkpoint(missing); }, &msg), FLAME_ERROR_INVALID_FORMAT);
    EXPECT_NE(msg.find(gone), std::string::npos) << msg;
  }
  std::vector<KeyShape> wrong = good;
  for (KeyShape& k : wrong)
    if (k.name == "encoder.block.0.layer.0.SelfAttention.q.weight") k.shape[0] = 30;
  EXPECT_EQ(status_of([&] { detect_t5_checkpoint(wrong); }, &msg), FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("SelfAttention.q.weight"), std::string::npos) << msg;
  T5Config bad = flame::models::testing::tiny_t5_config();
  bad.feed_forward_proj = "swish";
  EXPECT_THROW(t5_parameter_table(bad), Error);
}

TEST(ClipKeys, TransformersOrderOfRegistration) {
  const MappedTable t = clip_parameter_table(flame::models::testing::tiny_clip_config());
  std::vector<std::string> names;
  for (const MappedParameter& p : t.parameters) names.push_back(p.diffusers_name);
  ASSERT_GE(names.size(), 20u);
  EXPECT_EQ(names[0], "text_model.embeddings.token_embedding.weight");
  EXPECT_EQ(names[1], "text_model.embeddings.position_embedding.weight");
  // CLIPAttention registers k, v, q, out; the layer: self_attn, layer_norm1, mlp, layer_norm2.
  const std::vector<std::string> layer0 = {"self_attn.k_proj.weight", "self_attn.k_proj.bias",
                                           "self_attn.v_proj.weight", "self_attn.v_proj.bias",
                                           "self_attn.q_proj.weight", "self_attn.q_proj.bias",
                                           "self_attn.out_proj.weight", "self_attn.out_proj.bias",
                                           "layer_norm1.weight", "layer_norm1.bias",
                                           "mlp.fc1.weight", "mlp.fc1.bias",
                                           "mlp.fc2.weight", "mlp.fc2.bias",
                                           "layer_norm2.weight", "layer_norm2.bias"};
  for (size_t i = 0; i < layer0.size(); ++i) EXPECT_EQ(names[2 + i], "text_model.encoder.layers.0." + layer0[i]);
  EXPECT_EQ(names[names.size() - 3], "text_model.final_layer_norm.weight");
  EXPECT_EQ(names.back(), "text_projection.weight");
}

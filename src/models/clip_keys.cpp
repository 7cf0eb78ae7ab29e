// CLIP text encoder keys (see clip_keys.h): one builder walks CLIPTextModel(WithProjection) in
// transformers' order and names each parameter's OpenCLIP tensor; detection finds the encoders of a
// key list by their prefixes and reads each configuration back.
#include "models/clip_keys.h"
#include "core/error.h"

namespace flame::models {

namespace {

// Where single files and folders keep text encoders, transformers-named first.
const char* const kTransformersPrefixes[] = {"",
                                             "conditioner.embedders.0.transformer.",
                                             "cond_stage_model.transformer.",
                                             "text_encoders.clip_l.transformer.",
                                             "text_encoders.clip_g.transformer."};
const char* const kOpenClipPrefixes[] = {"conditioner.embedders.1.model.", "conditioner.embedders.0.model.",
                                         "cond_stage_model.model.", ""};

bool transformers_at(const KeyIndex& idx, const std::string& pre) {
  return idx.has(pre + "text_model.embeddings.token_embedding.weight") &&
         idx.has(pre + "text_model.final_layer_norm.weight");
}

bool open_clip_at(const KeyIndex& idx, const std::string& pre) {
  return idx.has(pre + "token_embedding.weight") && idx.has(pre + "transformer.resblocks.0.attn.in_proj_weight") &&
         idx.has(pre + "ln_final.weight");
}

MappedTable build_clip_table(const ClipTextConfig& c) {
  const int64_t C = c.hidden_size, I = c.intermediate_size;
  MappedTableBuilder b;
  b.same("text_model.embeddings.token_embedding.weight", "token_embedding.weight", {c.vocab_size, C});
  b.same("text_model.embeddings.position_embedding.weight", "positional_embedding", {c.max_position_embeddings, C});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string t = "text_model.encoder.layers." + std::to_string(i) + ".";
    const std::string o = "transformer.resblocks." + std::to_string(i) + ".";
    // CLIPAttention registers k, v, q, out; OpenCLIP's in_proj holds q, k, v.
    const char* const names[] = {"k_proj", "v_proj", "q_proj"};
    const int64_t thirds[] = {1, 2, 0};
    for (int j = 0; j < 3; ++j) {
      b.rows(t + "self_attn." + names[j] + ".weight", {C, C}, o + "attn.in_proj_weight", {3 * C, C}, thirds[j] * C);
      b.rows(t + "self_attn." + names[j] + ".bias", {C}, o + "attn.in_proj_bias", {3 * C}, thirds[j] * C);
    }
    b.weight_bias(t + "self_attn.out_proj", o + "attn.out_proj", {C, C});
    b.weight_bias(t + "layer_norm1", o + "ln_1", {C});
    b.weight_bias(t + "mlp.fc1", o + "mlp.c_fc", {I, C});
    b.weight_bias(t + "mlp.fc2", o + "mlp.c_proj", {C, I});
    b.weight_bias(t + "layer_norm2", o + "ln_2", {C});
  }
  b.weight_bias("text_model.final_layer_norm", "ln_final", {C});
  if (c.with_projection) b.transposed("text_projection.weight", "text_projection", {c.projection_dim, C});
  return b.take();
}

}  // namespace

ClipTextConfig clip_bigg_config() {
  ClipTextConfig c;
  c.hidden_size = 1280;
  c.intermediate_size = 5120;
  c.num_hidden_layers = 32;
  c.num_attention_heads = 20;
  c.hidden_act = "gelu";
  c.projection_dim = 1280;
  c.with_projection = true;
  return c;
}

MappedTable clip_parameter_table(const ClipTextConfig& cfg) {
  FLAME_CHECK(cfg.num_attention_heads > 0 && cfg.hidden_size > 0 && cfg.hidden_size % cfg.num_attention_heads == 0 &&
                  cfg.num_hidden_layers >= 1,
              FLAME_ERROR_INVALID_ARGUMENT, "CLIP text configuration: width ", cfg.hidden_size,
              " is not divisible into ", cfg.num_attention_heads, " heads, or no layers");
  return build_clip_table(cfg);
}

bool is_clip_checkpoint(const std::vector<KeyShape>& keys) {
  const KeyIndex idx(keys, "CLIP text");
  for (const char* p : kTransformersPrefixes)
    if (transformers_at(idx, p)) return true;
  for (const char* p : kOpenClipPrefixes)
    if (open_clip_at(idx, p)) return true;
  return false;
}

ClipCheckpoint detect_clip_checkpoint_at(const std::vector<KeyShape>& keys, const std::string& prefix) {
  const KeyIndex idx(keys, "CLIP text");
  ClipCheckpoint ck;
  ck.prefix = prefix;
  if (transformers_at(idx, prefix)) {
    ck.layout = ClipLayout::Transformers;
  } else if (open_clip_at(idx, prefix)) {
    ck.layout = ClipLayout::OpenCLIP;
  } else {
    fail(FLAME_ERROR_INVALID_FORMAT, "no CLIP text encoder under '", prefix, "': neither ", prefix,
         "text_model.embeddings.token_embedding.weight (transformers' names) nor ", prefix,
         "transformer.resblocks.0.attn.in_proj_weight (OpenCLIP's names)");
  }
  const bool open_clip = ck.layout == ClipLayout::OpenCLIP;
  const std::string& pre = prefix;
  ClipTextConfig& c = ck.config;
  const KeyShape& tokens =
      idx.need(pre + (open_clip ? "token_embedding.weight" : "text_model.embeddings.token_embedding.weight"), 2);
  c.vocab_size = tokens.shape[0];
  c.hidden_size = tokens.shape[1];
  c.max_position_embeddings =
      idx.need(pre + (open_clip ? "positional_embedding" : "text_model.embeddings.position_embedding.weight"), 2)
          .shape[0];
  const std::string layers = pre + (open_clip ? "transformer.resblocks." : "text_model.encoder.layers.");
  c.num_hidden_layers = idx.count_indices(layers);
  c.intermediate_size = idx.need(layers + (open_clip ? "0.mlp.c_fc.weight" : "0.mlp.fc1.weight"), 2).shape[0];
  FLAME_CHECK(c.hidden_size >= 64 && c.hidden_size % 64 == 0, FLAME_ERROR_INVALID_FORMAT, "CLIP text checkpoint: width ", c.hidden_size,
              " (", tokens.name, ") is not a multiple of the 64-wide heads");
  c.num_attention_heads = c.hidden_size / 64;
  c.hidden_act = open_clip || c.hidden_size != 768 ? "gelu" : "quick_gelu";
  const std::string projection = pre + (open_clip ? "text_projection" : "text_projection.weight");
  c.with_projection = idx.has(projection);
  c.projection_dim = c.with_projection ? idx.need(projection, 2).shape[open_clip ? 1 : 0] : c.hidden_size;
  const MappedTable table = clip_parameter_table(c);
  idx.expect_all(open_clip ? table.original : table.diffusers_tensors(), pre,
                 "a CLIP text encoder of " + std::to_string(c.num_hidden_layers) + " layers of width " +
                     std::to_string(c.hidden_size));
  return ck;
}

std::vector<ClipCheckpoint> detect_clip_checkpoints(const std::vector<KeyShape>& keys) {
  const KeyIndex idx(keys, "CLIP text");
  std::vector<ClipCheckpoint> out;
  for (const char* p : kTransformersPrefixes)
    if (transformers_at(idx, p)) out.push_back(detect_clip_checkpoint_at(keys, p));
  for (const char* p : kOpenClipPrefixes)
    if (open_clip_at(idx, p)) out.push_back(detect_clip_checkpoint_at(keys, p));
  FLAME_CHECK(!out.empty(), FLAME_ERROR_INVALID_FORMAT, "not a CLIP text encoder checkpoint: no "
              "text_model.embeddings.token_embedding.weight (transformers' names) or "
              "transformer.resblocks.0.attn.in_proj_weight (OpenCLIP's names) under any known prefix "
              "(none, conditioner.embedders.N.transformer. / .model., cond_stage_model., text_encoders.clip_l/g.)");
  return out;
}

ClipCheckpoint detect_clip_checkpoint(const std::vector<KeyShape>& keys) { return detect_clip_checkpoints(keys).front(); }

}  // namespace flame::models

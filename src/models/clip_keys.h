// CLIP text encoder checkpoints (transformers' CLIPTextModel / CLIPTextModelWithProjection: CLIP-L,
// OpenCLIP bigG): which layout a key list is in, the configuration its shapes imply, and the table
// between OpenCLIP's names and transformers' names.
//
// Two layouts exist. transformers' names (text_model.embeddings.*, text_model.encoder.layers.<i>.
// {self_attn.{q,k,v,out}_proj, layer_norm1, mlp.fc1/fc2, layer_norm2}, text_model.final_layer_norm,
// text_projection) are used by diffusers folders (text_encoder/, text_encoder_2/), SDXL single files
// for CLIP-L ("conditioner.embedders.0.transformer."), SD 1.5 ("cond_stage_model.transformer.") and
// SD3.5 single files ("text_encoders.clip_l.transformer.", "text_encoders.clip_g.transformer."): the
// stored names are the transformers names. OpenCLIP's names (SDXL's bigG under
// "conditioner.embedders.1.model.", the refiner's under "conditioner.embedders.0.model.", SD 2's under
// "cond_stage_model.model."): token_embedding, positional_embedding, transformer.resblocks.<i>.
// {ln_1, attn.in_proj_weight / in_proj_bias (q, k and v fused: [3C, C]), attn.out_proj, ln_2,
// mlp.c_fc, mlp.c_proj}, ln_final, and text_projection stored [C, projection] (applied as x @ P)
// where transformers' Linear holds [projection, C]: a transposition. The table follows diffusers'
// converter (loaders/single_file_utils.py, convert_open_clip_checkpoint).
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "models/mapped_keys.h"

namespace flame::models {

enum class ClipLayout { OpenCLIP, Transformers };

// CLIPTextConfig's fields that decide parameters (transformers' names; defaults: CLIP-L, as SDXL's
// and Flux's text_encoder/config.json).
struct ClipTextConfig {
  int64_t vocab_size = 49408;
  int64_t hidden_size = 768;
  int64_t intermediate_size = 3072;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t max_position_embeddings = 77;
  std::string hidden_act = "quick_gelu";
  int64_t projection_dim = 768;
  bool with_projection = false;  // CLIPTextModelWithProjection (text_projection) or CLIPTextModel
};

// OpenCLIP ViT-bigG/14's text tower as CLIPTextModelWithProjection (SDXL's text_encoder_2).
ClipTextConfig clip_bigg_config();

struct ClipCheckpoint {
  ClipLayout layout = ClipLayout::Transformers;
  std::string prefix;
  ClipTextConfig config;
};

// Every parameter of the model in transformers' order (named_parameters: the non-persistent
// position_ids buffer is no parameter), each with its OpenCLIP tensor (renamings, rows of the fused
// in_proj, the transposed projection). In the transformers layout the stored name is the parameter's
// own. Fails (FLAME_ERROR_INVALID_ARGUMENT) for a width not divisible by the head count.
MappedTable clip_parameter_table(const ClipTextConfig& cfg);

// Whether keys hold a CLIP text encoder under one of the prefixes named above (or none).
bool is_clip_checkpoint(const std::vector<KeyShape>& keys);

// The encoder whose keys start with prefix: the layout from its keys, the configuration from shapes
// (vocabulary and width from the token embedding, positions, layers by counting, MLP width, the
// projection by presence and shape). Not stored in weights: num_attention_heads is the width / 64
// (every CLIP text tower FLAME's models use has 64-wide heads); hidden_act is "gelu" for OpenCLIP
// names and transformers-named towers other than 768 wide (bigG), "quick_gelu" for 768 (OpenAI's
// CLIP-L). Fails (FLAME_ERROR_INVALID_FORMAT, naming the key) for no encoder there or a missing or
// misshapen tensor.
ClipCheckpoint detect_clip_checkpoint_at(const std::vector<KeyShape>& keys, const std::string& prefix);

// Every CLIP text encoder in keys (an SDXL or SD3.5 single file holds two), in the order of the known
// prefixes (transformers-named first). Fails (FLAME_ERROR_INVALID_FORMAT) when there is none.
std::vector<ClipCheckpoint> detect_clip_checkpoints(const std::vector<KeyShape>& keys);

// The first of detect_clip_checkpoints (the only one of a diffusers folder's text_encoder/).
ClipCheckpoint detect_clip_checkpoint(const std::vector<KeyShape>& keys);

}  // namespace flame::models

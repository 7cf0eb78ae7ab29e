// T5 encoder checkpoints (transformers' T5EncoderModel; T5-XXL v1.1 as Flux and SD3 use it): the
// parameter list and the configuration a key list's shapes imply.
//
// T5's names are the same in every layout users have (diffusers folders' text_encoder_2/ or
// text_encoder_3/, ComfyUI's t5xxl_*.safetensors, SD3.5 single files under
// "text_encoders.t5xxl.transformer."): shared (the token embedding; transformers ties
// encoder.embed_tokens to it, and some files store it under that name instead),
// encoder.block.<i>.layer.0.SelfAttention.{q,k,v,o} (no biases; block 0 alone also holds the
// relative position bias table relative_attention_bias [buckets, heads]), layer.0.layer_norm,
// layer.1.DenseReluDense.{wi_0,wi_1,wo} (v1.1's gated GELU; v1.0's plain ReLU has a single wi),
// layer.1.layer_norm, encoder.final_layer_norm. So the table maps every name to itself; what it adds
// is the list in transformers' order with shapes, and detection (diffusers' converter
// convert_sd3_t5_checkpoint_to_diffusers only strips the prefix).
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "models/mapped_keys.h"

namespace flame::models {

// T5Config's fields that decide parameters (transformers' names; defaults: T5-XXL v1.1).
struct T5Config {
  int64_t vocab_size = 32128;
  int64_t d_model = 4096;
  int64_t d_kv = 64;
  int64_t d_ff = 10240;
  int64_t num_layers = 24;
  int64_t num_heads = 64;
  int64_t relative_attention_num_buckets = 32;
  int64_t relative_attention_max_distance = 128;  // not stored in weights
  std::string feed_forward_proj = "gated-gelu";     // or "relu" (v1.0: one wi)

  bool is_gated() const { return feed_forward_proj.compare(0, 6, "gated-") == 0; }
};

struct T5Checkpoint {
  std::string prefix;  // "" or "text_encoders.t5xxl.transformer."
  std::string embedding_name = "shared.weight";  // or "encoder.embed_tokens.weight" (without the prefix)
  T5Config config;
};

// Every T5EncoderModel parameter in named_parameters order (the tied encoder.embed_tokens.weight is
// shared.weight and listed once), each stored under its own name. Fails
// (FLAME_ERROR_INVALID_ARGUMENT) for a feed_forward_proj other than relu, gelu, gated-gelu,
// gated-relu or gated-silu, or no layers.
MappedTable t5_parameter_table(const T5Config& cfg);

// Whether keys hold a T5 encoder (with or without the SD3.5 single-file prefix).
bool is_t5_checkpoint(const std::vector<KeyShape>& keys);

// The prefix and configuration from keys and shapes: d_model and vocabulary from the embedding, heads
// and buckets from the relative position bias table, d_kv from q's rows / heads, d_ff from wi_0 (or
// wi), layers by counting, gating by wi_0's presence (gated layers are taken as v1.1's "gated-gelu";
// relative_attention_max_distance stays 128). Fails (FLAME_ERROR_INVALID_FORMAT, naming the key) for
// a missing or misshapen tensor.
T5Checkpoint detect_t5_checkpoint(const std::vector<KeyShape>& keys);

}  // namespace flame::models

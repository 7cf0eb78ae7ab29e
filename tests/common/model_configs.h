// Small configurations of the model layer's architectures, shared by the CPU key tests and
// tests/models/flame_model_keys (whose JSON check_model_keys.py compares with diffusers' classes):
// the same tiny models on both sides. Header only.
#pragma once
#include "models/clip_keys.h"
#include "models/flux_keys.h"
#include "models/sd3_keys.h"
#include "models/t5_keys.h"
#include "models/unet_keys.h"
#include "models/vae_keys.h"

namespace flame::models::testing {

// A Flux transformer of 2 double and 3 single blocks, width 32 (2 heads of 16), MLP ratio 4.
inline FluxConfig tiny_flux_config() {
  FluxConfig c;
  c.in_channels = c.out_channels = 16;
  c.num_layers = 2;
  c.num_single_layers = 3;
  c.attention_head_dim = 16;
  c.num_attention_heads = 2;
  c.joint_attention_dim = 40;
  c.pooled_projection_dim = 24;
  c.mlp_hidden_dim = 128;
  return c;
}

// A UNet of two blocks (32 and 64 channels; cross-attention of depth 2 in the second), one layer a
// block, SDXL's text_time embedding over 40 inputs.
inline UNetConfig tiny_unet_config() {
  UNetConfig c;
  c.block_out_channels = {32, 64};
  c.down_block_has_attention = {false, true};
  c.transformer_layers_per_block = {1, 2};
  c.layers_per_block = 1;
  c.cross_attention_dim = 24;
  c.projection_class_embeddings_input_dim = 40;
  return c;
}

// An SD3.5-style MMDiT of 3 blocks, width 16 (2 heads of 8), RMS QK norms, dual attention in block 0,
// a positional table of 8x8.
inline SD3Config tiny_sd3_config() {
  SD3Config c;
  c.patch_size = 2;
  c.in_channels = c.out_channels = 4;
  c.num_layers = 3;
  c.attention_head_dim = 8;
  c.num_attention_heads = 2;
  c.joint_attention_dim = 12;
  c.caption_projection_dim = 16;
  c.pooled_projection_dim = 10;
  c.pos_embed_max_size = 8;
  c.sample_size = 16;
  c.qk_norm = "rms_norm";
  c.dual_attention_layers = {0};
  return c;
}

// An AutoencoderKL of two blocks (8 and 16 channels, 4 groups), one layer a block, 4 latent channels,
// SDXL-style quant convs.
inline VAEConfig tiny_vae_config() {
  VAEConfig c;
  c.block_out_channels = {8, 16};
  c.layers_per_block = 1;
  c.latent_channels = 4;
  c.norm_num_groups = 4;
  c.sample_size = 32;
  return c;
}

// A CLIP text encoder with projection: 2 layers of width 64 (one 64-wide head, as detection assumes),
// MLP 128, 16 positions, 100 tokens, projection 48.
inline ClipTextConfig tiny_clip_config() {
  ClipTextConfig c;
  c.vocab_size = 100;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 1;
  c.max_position_embeddings = 16;
  c.hidden_act = "gelu";
  c.projection_dim = 48;
  c.with_projection = true;
  return c;
}

// A gated-GELU T5 encoder of 2 blocks, width 32, 4 heads of 8, MLP 48, 8 position buckets.
inline T5Config tiny_t5_config() {
  T5Config c;
  c.vocab_size = 100;
  c.d_model = 32;
  c.d_kv = 8;
  c.d_ff = 48;
  c.num_layers = 2;
  c.num_heads = 4;
  c.relative_attention_num_buckets = 8;
  c.relative_attention_max_distance = 16;
  return c;
}

}  // namespace flame::models::testing

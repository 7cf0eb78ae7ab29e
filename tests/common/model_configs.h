// Small configurations of the model layer's architectures, shared by the CPU key tests and
// tests/models/flame_model_keys (whose JSON check_model_keys.py compares with diffusers' classes):
// the same tiny models on both sides. Header only.
#pragma once
#include "models/flux_keys.h"
#include "models/unet_keys.h"

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

}  // namespace flame::models::testing

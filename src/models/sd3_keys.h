// SD3 / SD3.5 MMDiT checkpoints (diffusers' SD3Transformer2DModel): which layout a key list is in,
// the configuration its shapes imply, and the table between Stability's original names and
// diffusers' names.
//
// Stability's single files (sd3.5_medium.safetensors, ...; ComfyUI repacks under
// "model.diffusion_model.") name the model MMDiT-style: pos_embed, x_embedder.proj, t_embedder.mlp,
// y_embedder.mlp, context_embedder, joint_blocks.<i>.{x_block,context_block}.{attn,attn2 (3.5 dual
// attention), adaLN_modulation.1, mlp.fc1/fc2}, final_layer. Each attention stores q, k and v fused
// (attn.qkv, [3 * inner, inner]); diffusers splits them into to_q / to_k / to_v (image stream) and
// add_q_proj / add_k_proj / add_v_proj (text stream). The last block's text stream only feeds the
// attention (context_pre_only: no output projection, no MLP) and its modulation, like the final
// layer's, is stored [shift; scale] where diffusers keeps [scale; shift]. Every diffusers parameter is
// therefore a range of rows of one stored tensor, possibly with its halves swapped. The table follows
// diffusers' converter (loaders/single_file_utils.py, convert_sd3_transformer_checkpoint_to_diffusers).
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "models/mapped_keys.h"

namespace flame::models {

enum class SD3Layout { Original, Diffusers };

// SD3Transformer2DModel's configuration (config.json names; defaults: SD3.5-medium).
struct SD3Config {
  int64_t sample_size = 128;  // not stored in weights (the default latent size)
  int64_t patch_size = 2;
  int64_t in_channels = 16;
  int64_t num_layers = 24;
  int64_t attention_head_dim = 64;
  int64_t num_attention_heads = 24;
  int64_t joint_attention_dim = 4096;     // T5-XXL / padded CLIP width
  int64_t caption_projection_dim = 1536;  // equal to the inner width in every SD3 model
  int64_t pooled_projection_dim = 2048;   // CLIP-L + bigG pooled outputs
  int64_t out_channels = 16;
  int64_t pos_embed_max_size = 384;
  std::string qk_norm = "rms_norm";  // "rms_norm" (SD3.5) or "" (SD3: none)
  std::vector<int64_t> dual_attention_layers{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};  // 3.5-medium

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
};

// SD3-medium (2.0): 24 blocks, no QK norm, no dual attention, positions up to 192.
SD3Config sd3_medium_config();

struct SD3Checkpoint {
  SD3Layout layout = SD3Layout::Original;
  std::string prefix;  // "" or "model.diffusion_model."
  SD3Config config;
};

// Every SD3Transformer2DModel parameter of this configuration in its state_dict order (the
// positional embedding buffer pos_embed.pos_embed included, as state_dict holds it), each a range of
// rows of one original tensor. Fails (FLAME_ERROR_INVALID_ARGUMENT) for an inconsistent
// configuration (caption_projection_dim other than the inner width, an unknown qk_norm, a dual
// attention layer out of range).
MappedTable sd3_parameter_table(const SD3Config& cfg);

// Whether keys hold an SD3 transformer (either layout, with or without the prefix).
bool is_sd3_checkpoint(const std::vector<KeyShape>& keys);

// The layout, prefix and configuration from keys and shapes: widths from the patch embedding,
// context embedder and pooled embedder, the patch size from the patch kernel, pos_embed_max_size as
// the square root of the positional table's length, the head width from the QK norm (64, as in
// every released SD3, when there is none), dual attention layers from the blocks that have attn2.
// sample_size stays at its default. Fails (FLAME_ERROR_INVALID_FORMAT, naming the key) when a tensor
// of the implied configuration is missing or has another shape.
SD3Checkpoint detect_sd3_checkpoint(const std::vector<KeyShape>& keys);

}  // namespace flame::models

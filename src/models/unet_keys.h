// UNet2DConditionModel checkpoints (SDXL base / refiner, SD 1.5): which layout a key list is in, the
// configuration its shapes imply, and the names of every parameter in both layouts.
//
// Stability's single files (sd_xl_base_1.0.safetensors, v1-5-pruned.safetensors) use the SGM / LDM
// names under "model.diffusion_model.": input_blocks.<i>.<j>, middle_block.<j>, output_blocks.<i>.<j>,
// time_embed, label_emb, out, with resnets named in_layers / emb_layers / out_layers /
// skip_connection. Diffusers' folders use down_blocks / mid_block / up_blocks with resnets and
// attentions. Unlike Flux nothing is fused: each diffusers parameter is exactly one stored tensor of
// the same shape, so the table is a renaming (diffusers' loaders/single_file_utils.py,
// convert_ldm_unet_checkpoint, is the reference this follows).
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "models/mapped_keys.h"

namespace flame::models {

// The part of diffusers' UNet2DConditionModel configuration that decides parameters (names and
// defaults as in its config.json; the defaults here are SDXL base's).
struct UNetConfig {
  int64_t in_channels = 4;
  int64_t out_channels = 4;
  std::vector<int64_t> block_out_channels{320, 640, 1280};
  std::vector<bool> down_block_has_attention{false, true, true};  // CrossAttnDownBlock2D vs DownBlock2D
  std::vector<int64_t> transformer_layers_per_block{1, 2, 10};   // per down block; mirrored for up blocks
  int64_t layers_per_block = 2;
  int64_t cross_attention_dim = 2048;
  bool use_linear_projection = true;  // proj_in / proj_out as Linear (SDXL) or 1x1 Conv2d (SD 1.5)
  bool mid_block_has_attention = true;
  // SDXL's "text_time" additional embedding: add_embedding over the pooled text embedding and the
  // six size / crop conditions (projection_class_embeddings_input_dim, 2816 for base, 2560 for the
  // refiner); 0: none (SD 1.5).
  int64_t projection_class_embeddings_input_dim = 2816;

  int64_t time_embed_dim() const { return 4 * block_out_channels.at(0); }
};

// SD 1.5's UNet (block_out_channels 320, 640, 1280, 1280; cross-attention in the first three blocks;
// 1x1 convolution projections; CLIP-L's 768-wide text).
UNetConfig sd15_unet_config();

enum class UNetLayout { Original, Diffusers };  // Original: the SGM / LDM names

struct UNetCheckpoint {
  UNetLayout layout = UNetLayout::Original;
  std::string prefix;  // "model.diffusion_model." in single files, "" in diffusers folders
  UNetConfig config;
};

// One parameter under both names, with its shape (the same in both layouts).
struct UNetParameter {
  std::string diffusers_name;
  std::string original_name;
  std::vector<int64_t> shape;
};

// Every parameter of the UNet in diffusers' state_dict order, with its SGM name.
std::vector<UNetParameter> unet_parameters(const UNetConfig& cfg);

// The same list as a MappedTable (every piece a whole tensor renamed), the form the loader and the
// original-layout save (original_layout.h) read in either direction.
MappedTable unet_parameter_table(const UNetConfig& cfg);

// Whether keys hold a UNet2DConditionModel (either layout; single files may hold other components
// under other prefixes).
bool is_unet_checkpoint(const std::vector<KeyShape>& keys);

// The layout, prefix and configuration from keys and shapes: channels from conv_in and the blocks'
// first convolutions, layers per block and transformer depths by counting, the cross-attention
// width from attn2.to_k, the projection kind from proj_in's rank, the additional embedding from
// label_emb / add_embedding. Fails (FLAME_ERROR_INVALID_FORMAT, naming the key) when a tensor of the
// implied configuration is missing or has another shape.
UNetCheckpoint detect_unet_checkpoint(const std::vector<KeyShape>& keys);

}  // namespace flame::models

// AutoencoderKL checkpoints (SDXL's 4-channel VAE, Flux's and SD3's 16-channel VAE): which layout a
// key list is in, the configuration its shapes imply, and the table between the LDM names and
// diffusers' names.
//
// The LDM layout (Stability's single files under "first_stage_model.", Black Forest Labs' ae.safetensors
// with no prefix, some repacks under "vae.") names the blocks encoder.down.<i>.block.<j>,
// encoder.down.<i>.downsample, {encoder,decoder}.mid.{block_1,attn_1,block_2}, decoder.up.<k>.block.<j>
// (k counts from the lowest resolution's other end: diffusers' up_blocks.<u> is up.<n-1-u>),
// decoder.up.<k>.upsample, norm_out, and resnet shortcuts nin_shortcut. The mid attention's q, k, v
// and proj_out are 1x1 convolutions, stored [C, C, 1, 1] where diffusers' Attention has Linears
// [C, C] (to_q, to_k, to_v, to_out.0): the same elements, a reshape. Nothing is fused. quant_conv and
// post_quant_conv exist in SDXL's VAE and not in Flux's or SD3's (use_quant_conv /
// use_post_quant_conv false). scaling_factor and shift_factor are configuration, not weights. The
// table follows diffusers' converter (loaders/single_file_utils.py, convert_ldm_vae_checkpoint).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>
#include "models/mapped_keys.h"

namespace flame::models {

enum class VAELayout { Original, Diffusers };  // Original: the LDM names

// AutoencoderKL's configuration (config.json names; defaults: SDXL's VAE). Every down block is a
// DownEncoderBlock2D and every up block an UpDecoderBlock2D.
struct VAEConfig {
  int64_t in_channels = 3;
  int64_t out_channels = 3;
  std::vector<int64_t> block_out_channels{128, 256, 512, 512};
  int64_t layers_per_block = 2;
  int64_t latent_channels = 4;
  int64_t norm_num_groups = 32;
  int64_t sample_size = 1024;
  double scaling_factor = 0.13025;
  std::optional<double> shift_factor;  // none for SDXL
  bool use_quant_conv = true;
  bool use_post_quant_conv = true;
  bool mid_block_add_attention = true;
  bool force_upcast = true;
};

// Flux's VAE (16 latent channels, scaling 0.3611, shift 0.1159, no quant convs).
VAEConfig flux_vae_config();
// SD3's VAE (16 latent channels, scaling 1.5305, shift 0.0609, no quant convs).
VAEConfig sd3_vae_config();

struct VAECheckpoint {
  VAELayout layout = VAELayout::Original;
  std::string prefix;  // "", "first_stage_model." or "vae."
  VAEConfig config;
};

// Every AutoencoderKL parameter of this configuration in its state_dict order with its LDM tensor
// (renamings, and the mid attentions' reshapes). Fails (FLAME_ERROR_INVALID_ARGUMENT) for an empty
// block list or no layer per block.
MappedTable vae_parameter_table(const VAEConfig& cfg);

// Whether keys hold an AutoencoderKL (either layout, under any of the prefixes above).
bool is_vae_checkpoint(const std::vector<KeyShape>& keys);

// The layout, prefix and configuration from keys and shapes: channels from the convolutions, block
// widths from each down block's first convolution, layers per block by counting, the latent width
// from decoder.conv_in, quant convs and mid attention by presence. Not stored in weights:
// norm_num_groups and sample_size stay at their defaults; scaling_factor / shift_factor are those of
// SDXL's VAE for 4 latent channels and Flux's for 16 (SD3's VAE has the same shapes as Flux's and
// other factors, SD 1.5's the same as SDXL's: pass them in the configuration where it matters).
// Fails (FLAME_ERROR_INVALID_FORMAT, naming the key) when a tensor of the implied configuration is
// missing or has another shape.
VAECheckpoint detect_vae_checkpoint(const std::vector<KeyShape>& keys);

}  // namespace flame::models

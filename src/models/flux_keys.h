// Flux transformer checkpoints: which layout a key list is in, the configuration its shapes imply,
// and the mapping between Black Forest Labs' original names and diffusers' names.
//
// FLAME's Flux model (flux_transformer.cpp) keeps its parameters under the diffusers names,
// unfused: to_q / to_k / to_v / add_*_proj / proj_mlp, as FluxTransformer2DModel.state_dict() holds
// them. The original (BFL) files store them fused: one QKV projection per stream of a double block,
// and one `linear1` per single block holding q, k, v and the MLP's input projection
// ([3 * inner + mlp_hidden, inner]); their final modulation has its two halves swapped ([shift;
// scale] where diffusers has [scale; shift]). Every diffusers parameter is therefore a range of rows
// of one original tensor, possibly with its halves swapped: flux_parameter_map lists them, and the
// two directions of conversion (loading a BFL file into the model's parameters, saving them in BFL
// layout) are that table read one way or the other. The mapping follows diffusers' own converter
// (loaders/single_file_utils.py, convert_flux_transformer_checkpoint_to_diffusers).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace flame::models {

struct MappedTable;  // mapped_keys.h (which includes this header for KeyShape)

// A tensor's name and shape as a checkpoint header lists them (no data needed).
struct KeyShape {
  std::string name;
  std::vector<int64_t> shape;
};

enum class FluxLayout { Original, Diffusers };

// FluxTransformer2DModel's configuration (diffusers' names and defaults: Flux-dev / schnell).
struct FluxConfig {
  int64_t in_channels = 64;          // packed latent channels (16 channels x 2 x 2 patches)
  int64_t out_channels = 64;
  int64_t num_layers = 19;           // double-stream blocks
  int64_t num_single_layers = 38;    // single-stream blocks
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 24;
  int64_t joint_attention_dim = 4096;   // T5 hidden size
  int64_t pooled_projection_dim = 768;  // CLIP-L pooled output
  int64_t mlp_hidden_dim = 12288;       // 4 x inner
  bool guidance_embeds = true;          // dev: true; schnell: false
  std::vector<int64_t> axes_dims_rope{16, 56, 56};

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
};

// Where a key list came from: its layout and the prefix every Flux key carries ("" or ComfyUI's
// "model.diffusion_model.").
struct FluxCheckpoint {
  FluxLayout layout = FluxLayout::Original;
  std::string prefix;
  FluxConfig config;
};

// Whether keys look like a Flux transformer (either layout, with or without a prefix).
bool is_flux_checkpoint(const std::vector<KeyShape>& keys);

// The layout, prefix and configuration of a Flux checkpoint from its keys and shapes: block counts
// from the highest block index, widths from the embedders' and QK norms' shapes, guidance_embeds
// from the guidance embedder's presence. axes_dims_rope is not stored in weights: the default stays.
// Fails (FLAME_ERROR_INVALID_FORMAT, naming the key) when a key every Flux checkpoint has is
// missing or a shape contradicts the others.
FluxCheckpoint detect_flux_checkpoint(const std::vector<KeyShape>& keys);

// One diffusers parameter as rows [row_begin, row_begin + rows) of an original tensor (dim 0; the
// other dims whole). swap_halves: the stored rows are [shift; scale] and diffusers' are [scale; shift].
struct FluxParameter {
  std::string diffusers_name;
  std::string original_name;
  int64_t row_begin = 0;
  int64_t rows = 0;
  bool swap_halves = false;
};

// Every parameter of a FluxTransformer2DModel of this configuration, in diffusers' order of
// registration, with the original tensor it lives in. The original tensors' names and row counts
// follow (flux_original_tensors).
std::vector<FluxParameter> flux_parameter_map(const FluxConfig& cfg);

// The original (BFL) tensors of this configuration with their shapes, in the order of the BFL
// module tree.
std::vector<KeyShape> flux_original_tensors(const FluxConfig& cfg);

// The diffusers parameters with their shapes (what FluxTransformer2DModel.state_dict() holds).
std::vector<KeyShape> flux_diffusers_tensors(const FluxConfig& cfg);

// The same table as the other families' MappedTable (mapped_keys.h; include it to call this): the
// original tensors in BFL order, the parameters in diffusers' order with their shapes and pieces. The
// loader reads it one way, the original-layout save (original_layout.h) the other.
MappedTable flux_parameter_table(const FluxConfig& cfg);

}  // namespace flame::models

// More neural-network ops (issue 5, second part), one source file per group:
//  - indexing: scatter, masked_select, repeat, repeat_interleave, pad (ops/indexing_extra.cpp,
//    kernel cuda/scatter.cuh);
//  - dropout (ops/dropout.cpp, kernel cuda/dropout.cuh);
//  - pooling: max_pool2d, avg_pool2d, adaptive_avg_pool2d (ops/pooling.cpp, kernels cuda/pool.cuh);
//  - upsampling: nearest and bilinear (ops/upsample.cpp, kernels cuda/upsample.cuh);
//  - rotary position embeddings (kernel cuda/rope.cuh) and timestep embeddings (ops/rope.cpp);
//  - composite blocks: GEGLU, adaLN modulation, SiLU-gated MLP (ops/nn_composites.cpp).
// Recorded nodes are the FLAME_NNOPS_OPS rows of tensor/op_list.h; their backward rules live with all
// others in autograd/backward_rules.cpp. Everything else here is a composition of recorded ops.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "tensor/tensor.h"

namespace flame::ops {

// ---- indexing (ops/indexing_extra.cpp) ----
// torch.scatter out of place; src at least index's size on every dim (only that part is read).
Tensor scatter(const Tensor& x, int dim, const Tensor& index, const Tensor& src);
// The recorded primitive: index (contiguous, the iteration shape) and src of index's shape.
Tensor scatter_index(const Tensor& x, int dim, const Tensor& index, const Tensor& src, const std::string& what);
// The elements of x where mask (bool, broadcast with x) is true, 1-D. Waits for the device (count).
Tensor masked_select(const Tensor& x, const Tensor& mask);
Tensor repeat(const Tensor& x, const std::vector<int64_t>& repeats);
// flatten: PyTorch's dim=None (x flattened first, dim ignored).
Tensor repeat_interleave(const Tensor& x, int64_t repeats, int dim, bool flatten);
enum class PadMode : int { Constant = 0, Reflect = 1, Replicate = 2 };  // values of flame_pad_mode_t
// pads: (left, right) of the last dim, then of the one before, ... (torch.nn.functional.pad).
Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, PadMode mode, double value);
// The recorded constant pad: x placed at offsets `lefts` (one per dim, >= 0) of a tensor of shape
// `shape` filled with value.
Tensor constant_pad(const Tensor& x, const std::vector<int64_t>& lefts, const Shape& shape, double value);
struct PadAttrs {  // node attributes of ConstantPad
  std::vector<int64_t> lefts;  // the left pad of each dim
};

// ---- dropout (ops/dropout.cpp) ----
// Identity (x itself) when !training or p == 0; x * 0 when p == 1; else draws from the context's
// generator and records a Dropout node.
Tensor dropout(const Tensor& x, double p, bool training);
// The recorded op: x times the keep mask of (seed, offset, p), scaled by 1 / (1 - p).
Tensor dropout_apply(const Tensor& x, uint64_t seed, uint64_t offset, double p);
struct DropoutAttrs {  // node attributes of Dropout: the mask's random stream and p
  uint64_t seed = 0, offset = 0;
  double p = 0;
};

// ---- pooling (ops/pooling.cpp) on [N, C, H, W] or [C, H, W] ----
struct Pool2dOptions {  // flame_pool2d_options_t without its struct_size
  int64_t kernel[2] = {1, 1}, stride[2] = {1, 1}, padding[2] = {0, 0}, dilation[2] = {1, 1};
  bool ceil_mode = false;
  bool count_include_pad = true;
  int64_t divisor_override = 0;  // 0: none
};
// The geometry of a recorded average pooling (fixed or adaptive windows), the node's attributes.
struct PoolParams {
  int64_t N = 0, C = 0, H = 0, W = 0, OH = 0, OW = 0;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
  bool count_include_pad = true;
  int64_t divisor = 0;
  bool adaptive = false;
};
Tensor max_pool2d(const Tensor& x, const Pool2dOptions& o);
Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& o);
Tensor adaptive_avg_pool2d(const Tensor& x, int64_t out_h, int64_t out_w);
// The recorded average pooling of x [N, C, H, W] and its adjoint (g [N, C, OH, OW] to [N, C, H, W]),
// each the other's backward.
Tensor avg_pool2d_apply(const Tensor& x, const PoolParams& p);
Tensor avg_pool2d_adjoint(const Tensor& g, const PoolParams& p);

// ---- upsampling (ops/upsample.cpp) of [N, C, H, W] ----
// The geometry of a recorded upsampling (the node's attributes): sizes and the caller's scale
// factors (0: none).
struct UpsampleParams {
  int64_t N = 0, C = 0, H = 0, W = 0, OH = 0, OW = 0;
  double scale_h = 0, scale_w = 0;
  bool bilinear = false, align_corners = false;
};
// out_h / out_w: > 0, or 0 for floor(in * scale); scale_h / scale_w: > 0, or 0 for none.
Tensor upsample2d(const Tensor& x, int64_t out_h, int64_t out_w, double scale_h, double scale_w, bool bilinear,
                  bool align_corners);
// The recorded upsampling and its adjoint (g [N, C, OH, OW] to [N, C, H, W]), each the other's backward.
Tensor upsample2d_apply(const Tensor& x, const UpsampleParams& p);
Tensor upsample2d_adjoint(const Tensor& g, const UpsampleParams& p);

// ---- positional embeddings (ops/rope.cpp) ----
struct RopeParams {  // also the node's attributes
  double theta = 10000;
  int64_t rotary_dim = 0;  // 0: the whole last dim
  int64_t offset = 0;      // positions offset + t when no ids are given
  bool interleaved = false;
  int seq_dim = -2;        // normalised by rope()
  bool inverse = false;    // rotate backwards (the backward)
};
// positions: null, or i64/i32 ids of shape [T] or [B, T].
Tensor rope(const Tensor& x, const Tensor& positions, RopeParams p);
// The recorded rotation (checked parameters, seq_dim normalised); its backward is itself inverted.
Tensor rope_apply(const Tensor& x, const Tensor& positions, const RopeParams& p);
// diffusers' get_timestep_embedding (a composition, f32).
Tensor timestep_embedding(const Tensor& timesteps, int64_t dim, double max_period, bool flip_sin_to_cos, double shift,
                          double scale);

// ---- composite blocks (ops/nn_composites.cpp): compositions, no nodes of their own ----
// x [..., 2 H] -> x[..., :H] * gelu(x[..., H:]) (tanh approximation when tanh_approx).
Tensor geglu(const Tensor& x, bool tanh_approx);
// x [N, ..., C] * (1 + scale) + shift with scale, shift [N, C] (either may be null).
Tensor adaln_modulate(const Tensor& x, const Tensor& shift, const Tensor& scale);
// (silu(x w1^T) * (x w3^T)) w2^T.
Tensor swiglu_mlp(const Tensor& x, const Tensor& w1, const Tensor& w3, const Tensor& w2);

// ---- every kernel instantiation these ops may launch (for the CPU kernel-compile test) ----
std::vector<std::string> scatter_instantiations();
std::vector<std::string> dropout_instantiations();
std::vector<std::string> pool_instantiations();
std::vector<std::string> upsample_instantiations();
std::vector<std::string> rope_instantiations();

}  // namespace flame::ops

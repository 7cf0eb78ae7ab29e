// Convolutions (FLAME_CONV_OPS of src/tensor/op_list.h; kernels in cuda/conv.cuh).
//
// Three recorded primitives share one geometry (ConvGeom) and are each other's backward:
//   conv_forward      y  = conv(x, w) + b                     (Conv2d)
//   conv_input_grad   dx = conv^T(dy, w) + b                  (ConvTranspose2d; conv_transpose2d too)
//   conv_weight_grad  dw = sum over n, ho, wo of dy (x) taps  (ConvWeightGrad)
// conv2d, conv_transpose2d and conv1d check PyTorch-style arguments and call them; conv1d is
// conv2d over a view with H = 1. Tensors are logical NCHW; channels-last inputs (dense NHWC
// strides) are read in place and give channels-last results, others go through an internal
// channels-last copy and give contiguous results (see conv.cpp). The kernels behind the primitives
// are cuDNN's when the context uses it (runtime/cudnn.h), else FLAME's (cuda/conv.cuh).
#pragma once
#include <string>
#include <vector>
#include "tensor/tensor.h"

namespace flame::ops {

// x [N, C, H, W], w [O, C / G, kh, kw], y [N, O, Ho, Wo]. ph / pw: the padding before the first
// row / column; the padding after follows from Ho / Wo (so 'same' padding may be asymmetric).
struct ConvGeom {
  int64_t N = 0, C = 0, H = 0, W = 0, O = 0, kh = 0, kw = 0, G = 1;
  int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1, Ho = 0, Wo = 0;
};  // also the attributes of the Conv2d, ConvTranspose2d and ConvWeightGrad nodes

// The arguments of flame_conv_options_t (PyTorch's names). conv1d uses element 0 of each pair.
struct ConvArgs {
  int64_t stride[2] = {1, 1}, padding[2] = {0, 0}, dilation[2] = {1, 1};
  int64_t groups = 1;
  int64_t output_padding[2] = {0, 0};
  bool same = false;
};

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const ConvArgs& a);
Tensor conv_transpose2d(const Tensor& x, const Tensor& w, const Tensor& b, const ConvArgs& a);
Tensor conv1d(const Tensor& x, const Tensor& w, const Tensor& b, const ConvArgs& a);

// ---- the recorded primitives (b may be null) ----
Tensor conv_forward(const Tensor& x, const Tensor& w, const Tensor& b, const ConvGeom& g);
// dy [N, O, Ho, Wo] -> [N, C, H, W], plus b [C].
Tensor conv_input_grad(const Tensor& dy, const Tensor& w, const Tensor& b, const ConvGeom& g);
// -> [O, C / G, kh, kw]; channels-last strides when channels_last (the weight's memory format).
Tensor conv_weight_grad(const Tensor& dy, const Tensor& x, const ConvGeom& g, bool channels_last);
// Sum of dy over dims 0, 2, 3 (f32 accumulation for f16/bf16), in dy's dtype.
Tensor conv_bias_grad(const Tensor& dy);
// A 4-D tensor laid out as dense NHWC that is not also plain contiguous.
bool is_channels_last(const Tensor& t);

// Every kernel instantiation the convolutions may launch (for the CPU kernel-compile test).
std::vector<std::string> conv_kernel_instantiations();

}  // namespace flame::ops

// Helpers shared by the 2-D spatial ops on [N, C, H, W] tensors (pooling, upsampling): the
// channels-last test, and outputs that keep the input's layout.
#pragma once
#include <string>
#include "ops/nn_rows.h"
#include "tensor/tensor.h"

namespace flame {

// 4-D tensors with the c stride 1 (and more than one channel) are channels-last.
inline bool spatial_channels_last(const Tensor& t) {
  return t->ndim() == 4 && t->shape[1] > 1 && t->strides[1] == 1 && !t->contiguous();
}

// A new [N, C, A, B] tensor, channels-last in memory when cl.
inline Tensor make_nchw(Context& ctx, const Shape& s, DType dt, bool cl) {
  if (!cl) return make_tensor(ctx, s, dt);
  Tensor base = make_tensor(ctx, {s[0], s[2], s[3], s[1]}, dt);
  return make_view(base, s, {s[2] * s[3] * s[1], 1, s[3] * s[1], s[1]}, 0);
}

}  // namespace flame

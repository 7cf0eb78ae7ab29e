// Helpers shared by the 2-D spatial ops on [N, C, H, W] tensors (pooling, upsampling): the
// channels-last test, outputs that keep the input's layout, and the 2x2-block kernels.
#pragma once
#include <string>
#include <vector>
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

// cuda/blocks2x2.cuh between small [N, C, H, W] and large [N, C, 2H, 2W], both dense in the layout cl
// (channels-last or NCHW): expand (small -> large: nearest upsampling by 2, or with quarter the
// backward of 2x2 average pooling) or sum (large -> small: the backward of nearest upsampling by 2, or
// with quarter 2x2 average pooling). False, with nothing launched, when the layouts or the size
// (2^31 elements and more) do not fit; the caller then runs its general kernel.
bool launch_blocks2x2(Context& ctx, bool expand, bool quarter, const Tensor& small, const Tensor& large, bool cl);
std::vector<std::string> blocks2x2_instantiations();

}  // namespace flame

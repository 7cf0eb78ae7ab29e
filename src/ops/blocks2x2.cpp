// Host side of cuda/blocks2x2.cuh: 2x2 blocks between dense tensors of one layout, for nearest
// upsampling by 2 (ops/upsample.cpp) and 2x2 average pooling with stride 2 (ops/pooling.cpp).
#include "ops/spatial.h"
#include <climits>
#include "runtime/context.h"
#include "runtime/kernel_key.h"

namespace flame {

namespace {

// <T, V, channels-last, times or over 4>
constexpr KernelTemplate kExpand{"blocks2x2.cuh", "flame::expand2x2", {TArg::Dtype, TArg::Int, TArg::Bool, TArg::Bool}};
constexpr KernelTemplate kSum{"blocks2x2.cuh", "flame::sum2x2", {TArg::Dtype, TArg::Int, TArg::Bool, TArg::Bool}};

// Whether t holds its [N, C, A, B] elements densely in the layout given.
bool dense_layout(const Tensor& t, bool cl) {
  const Shape& s = t->shape;
  const Strides want = cl ? Strides{s[2] * s[3] * s[1], 1, s[3] * s[1], s[1]} : Strides{s[1] * s[2] * s[3], s[2] * s[3], s[3], 1};
  return t->strides == want;
}

}  // namespace

bool launch_blocks2x2(Context& ctx, bool expand, bool quarter, const Tensor& small, const Tensor& large, bool cl) {
  if (large->numel() > INT32_MAX || !dense_layout(small, cl) || !dense_layout(large, cl)) return false;
  const int64_t inner = cl ? small->shape[1] : small->shape[3];  // the elements a vector runs along
  int v = static_cast<int>(16 / dtype_size(small->dtype));
  if (inner % v != 0 || (small->data() | large->data()) % 16 != 0) v = 1;
  CUdeviceptr src = expand ? small->data() : large->data(), dst = expand ? large->data() : small->data();
  unsigned nvec = static_cast<unsigned>(small->numel() / v), row_vecs = static_cast<unsigned>(inner / v);
  unsigned W = static_cast<unsigned>(small->shape[3]);
  void* args[] = {&src, &dst, &nvec, &row_vecs, &W};
  launch_flat(ctx, ctx.function(make_key(expand ? kExpand : kSum, small->dtype, v, cl, quarter)), nvec, args);
  return true;
}

std::vector<std::string> blocks2x2_instantiations() {
  std::vector<std::string> names;
  for (DType t : {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_F64})
    for (const KernelTemplate* k : {&kExpand, &kSum})
      for (int v : {1, static_cast<int>(16 / dtype_size(t))})
        for (bool cl : {false, true})
          for (bool quarter : {false, true}) names.push_back(kernel_name(make_key(*k, t, v, cl, quarter)));
  return names;
}

}  // namespace flame

// Dropout (host code: src/ops/dropout.cpp). Element e of the contiguous input is kept when its
// uniform number u(e) >= p and then multiplied by scale = 1 / (1 - p), else multiplied by 0 (so a
// dropped NaN or infinity gives NaN, as PyTorch's x * mask * scale). u(e) is the float of
// random.cuh's uniform draws: word e % 4 of Philox(seed, offset + e / 4), its top 24 bits. It depends
// only on (seed, offset, e), so the backward regenerates the forward's mask from the (seed, offset)
// in its graph node and applies this same kernel to the gradient: no mask is stored. One thread per
// Philox call (4 elements); VEC: one 4-element vector load and store (the host checks alignment).
#pragma once
#include "random.cuh"

namespace flame {

template <class T, bool VEC>
__global__ void dropout_kernel(const T* __restrict__ in, T* __restrict__ out, i64 n, u64 seed, u64 offset, float p,
                               double scale) {
  typedef compute_t<T> C;
  const C keep_scale = static_cast<C>(scale), drop_scale = C(0);
  const i64 groups = (n + 3) / 4;
  for (i64 g = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += static_cast<i64>(gridDim.x) * blockDim.x) {
    const u32x4 r = philox(seed, offset + static_cast<u64>(g));
    const i64 e0 = g * 4;
    if (VEC && e0 + 4 <= n) {
      const Vec<T, 4> v = *reinterpret_cast<const Vec<T, 4>*>(in + e0);
      Vec<T, 4> o;
#pragma unroll
      for (int k = 0; k < 4; ++k)
        o.v[k] = cast<T>(to_compute(v.v[k]) * (uniform_from<float>(word(r, k), 0u) >= p ? keep_scale : drop_scale));
      *reinterpret_cast<Vec<T, 4>*>(out + e0) = o;
    } else {
      for (int k = 0; k < 4 && e0 + k < n; ++k)
        out[e0 + k] = cast<T>(to_compute(in[e0 + k]) * (uniform_from<float>(word(r, k), 0u) >= p ? keep_scale : drop_scale));
    }
  }
}

}  // namespace flame

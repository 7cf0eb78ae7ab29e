// Rotary position embeddings (host code: src/ops/rope.cpp). x has any rank >= 2 and any strides; its
// last dim D holds one head's features, dim seq_dim the positions. The leading rotary_dim features
// rotate in pairs (i0, i1): (2i, 2i + 1) interleaved (GPT-J, Meta's llama) or (i, i + rotary_dim / 2)
// half-split (GPT-NeoX, Hugging Face's rotate_half), by the angle pos * theta^(-2i / rotary_dim):
//   y[i0] = x[i0] cos - x[i1] sin,   y[i1] = x[i1] cos + x[i0] sin;
// the other D - rotary_dim features pass through. pos is position_offset + t, or the position id at
// (dim 0 coordinate, t) when ids are given. The angle is formed and reduced modulo 2 pi in f64 (so
// long positions lose nothing to an f32 product) and its cos / sin taken in f32 for f32, f16 and
// bf16 (f64 for f64); the rotation is computed in that type. sign = -1 rotates backwards: the
// inverse, which is also the backward (the rotation is orthogonal). The output is contiguous.
#pragma once
#include "common.cuh"

namespace flame {

struct RopeLayout {  // mirrors src/ops/rope.cpp
  int ndim;           // dims of x; the last is D
  int seq_dim;        // the dim of the positions (not the last)
  i64 shape[8];
  i64 xs[8];          // strides of x
  i64 D, rd;          // head size; rotated features (even, <= D)
  i64 offset;         // without ids: pos = offset + t
  i64 ps_b, ps_t;     // strides of the ids over (dim 0, seq_dim); ps_b 0 for [T] ids
  double log2_theta;  // log2 of the frequency base
  int interleaved;
  int has_pos;
  float sign;         // +1 forward, -1 inverse
};

__device__ __forceinline__ void rope_sincos(double angle, float* s, float* c) {
  const double two_pi = 6.283185307179586476925286766559;
  const double r = angle - rint(angle * (1.0 / two_pi)) * two_pi;  // in [-pi, pi]
  sincosf(static_cast<float>(r), s, c);
}
__device__ __forceinline__ void rope_sincos(double angle, double* s, double* c) { sincos(angle, s, c); }

// One thread per rotated pair or passed-through feature: rows * (rd / 2 + D - rd) items.
template <class T, class I>
__global__ void rope_kernel(const T* __restrict__ x, T* __restrict__ y, const I* __restrict__ pos, i64 rows, RopeLayout L) {
  typedef compute_t<T> A;
  const i64 half = L.rd / 2, items = half + (L.D - L.rd), total = rows * items;
  const i64 sd = L.xs[L.ndim - 1];
  for (i64 e = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 r = e / items, k = e - r * items;
    i64 rem = r, off = 0, t = 0, b = 0;
    for (int d = L.ndim - 2; d >= 0; --d) {
      const i64 cd = rem % L.shape[d];
      rem /= L.shape[d];
      off += cd * L.xs[d];
      if (d == L.seq_dim) t = cd;
      if (d == 0) b = cd;
    }
    const T* xr = x + off;
    T* yr = y + r * L.D;
    if (k >= half) {  // a feature past rotary_dim
      const i64 j = L.rd + (k - half);
      yr[j] = xr[j * sd];
      continue;
    }
    const i64 i0 = L.interleaved ? 2 * k : k, i1 = L.interleaved ? 2 * k + 1 : k + half;
    const double p = L.has_pos ? static_cast<double>(pos[b * L.ps_b + t * L.ps_t]) : static_cast<double>(L.offset + t);
    const double inv_freq = exp2(-static_cast<double>(2 * k) / static_cast<double>(L.rd) * L.log2_theta);
    A s, c;
    rope_sincos(p * inv_freq, &s, &c);
    s *= static_cast<A>(L.sign);
    const A a0 = to_compute(xr[i0 * sd]), a1 = to_compute(xr[i1 * sd]);
    yr[i0] = cast<T>(a0 * c - a1 * s);
    yr[i1] = cast<T>(a1 * c + a0 * s);
  }
}

}  // namespace flame

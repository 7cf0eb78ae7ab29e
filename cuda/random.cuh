// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011) and index-generated tensors.
// Element e of a draw uses counter (offset + e / per_call) and word e % per_call of the result,
// so values depend only on (seed, offset, e): the same seed gives the same tensor on any GPU and
// any launch configuration.
#pragma once
#include "common.cuh"

namespace flame {

struct u32x4 { unsigned x, y, z, w; };

__device__ __forceinline__ u32x4 philox(u64 seed, u64 counter) {
  unsigned k0 = static_cast<unsigned>(seed), k1 = static_cast<unsigned>(seed >> 32);
  u32x4 c = {static_cast<unsigned>(counter), static_cast<unsigned>(counter >> 32), 0u, 0u};
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    unsigned hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
    unsigned hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
    c = {hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c;
}

__device__ __forceinline__ unsigned word(const u32x4& r, int i) { return i == 0 ? r.x : i == 1 ? r.y : i == 2 ? r.z : r.w; }

// Uniform in [0, 1) with as many random bits as the type resolves (so rounding never gives 1).
template <class T> __device__ __forceinline__ T uniform_from(unsigned a, unsigned b);
template <> __device__ __forceinline__ float uniform_from<float>(unsigned a, unsigned) { return (a >> 8) * 5.9604644775390625e-8f; }
template <> __device__ __forceinline__ double uniform_from<double>(unsigned a, unsigned b) {
  return ((static_cast<u64>(a) << 21) ^ (b >> 11)) * 1.1102230246251565e-16;
}
template <> __device__ __forceinline__ half_t uniform_from<half_t>(unsigned a, unsigned) { return to_half((a >> 21) * 4.8828125e-4f); }
template <> __device__ __forceinline__ bf16_t uniform_from<bf16_t>(unsigned a, unsigned) { return to_bf16((a >> 24) * 3.90625e-3f); }

// f64 uses two words per value, the other types one.
template <class T> struct words_per_value { static constexpr int value = 1; };
template <> struct words_per_value<double> { static constexpr int value = 2; };

template <class T>
__global__ void rand_uniform(T* out, i64 n, u64 seed, u64 offset) {
  constexpr int W = words_per_value<T>::value, per_call = 4 / W;
  i64 step = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 g = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; g * per_call < n; g += step) {
    u32x4 r = philox(seed, offset + static_cast<u64>(g));
#pragma unroll
    for (int k = 0; k < per_call; ++k) {
      i64 e = g * per_call + k;
      if (e < n) out[e] = uniform_from<T>(word(r, k * W), word(r, k * W + 1));
    }
  }
}

// Box-Muller on pairs of words: each Philox call gives 4 normals (2 for f64).
template <class T>
__global__ void rand_normal(T* out, i64 n, u64 seed, u64 offset) {
  typedef compute_t<T> C;
  typedef typename compute_type<C>::type F;  // float or double
  constexpr int W = words_per_value<T>::value, per_call = 4 / W;
  i64 step = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 g = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; g * per_call < n; g += step) {
    u32x4 r = philox(seed, offset + static_cast<u64>(g));
    F z[4];
    if constexpr (W == 1) {
      for (int p = 0; p < 2; ++p) {
        float u1 = ((word(r, 2 * p) >> 8) + 1) * 5.9604644775390625e-8f;  // (0, 1]: log stays finite
        float u2 = (word(r, 2 * p + 1) >> 8) * 5.9604644775390625e-8f;
        float rad = sqrtf(-2.0f * logf(u1));
        float s, c;
        sincospif(2.0f * u2, &s, &c);
        z[2 * p] = rad * c;
        z[2 * p + 1] = rad * s;
      }
    } else {
      double u1 = (((static_cast<u64>(r.x) << 21) ^ (r.y >> 11)) + 1) * 1.1102230246251565e-16;
      double u2 = ((static_cast<u64>(r.z) << 21) ^ (r.w >> 11)) * 1.1102230246251565e-16;
      double rad = sqrt(-2.0 * log(u1));
      double s, c;
      sincospi(2.0 * u2, &s, &c);
      z[0] = rad * c;
      z[1] = rad * s;
    }
#pragma unroll
    for (int k = 0; k < per_call; ++k) {
      i64 e = g * per_call + k;
      if (e < n) out[e] = cast<T>(z[k]);
    }
  }
}

template <class T>
__global__ void arange_kernel(T* out, i64 n, double start, double step) {
  for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<i64>(gridDim.x) * blockDim.x)
    out[i] = cast<T>(start + static_cast<double>(i) * step);
}

// Symmetric from both ends, as PyTorch, so that the last value is exactly `end`.
template <class T>
__global__ void linspace_kernel(T* out, i64 n, double start, double end, double step) {
  for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<i64>(gridDim.x) * blockDim.x)
    out[i] = cast<T>(i < n / 2 ? start + static_cast<double>(i) * step : end - static_cast<double>(n - 1 - i) * step);
}

}  // namespace flame

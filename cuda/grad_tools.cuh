// Fused multi-tensor gradient tools (src/toolkit/grad_tools.cpp) and the loss scaler's kernels
// (src/toolkit/grad_scaler.cpp). As for the optimizers, the host uploads one table of tensors and,
// per dtype, a table of chunks (one block each, kChunk elements), so that one launch covers a whole
// list of tensors. Partial results go to per-chunk slots and are combined in a fixed order by a
// second kernel, so results do not depend on scheduling (no atomics on values).
//   - norms: gt_sumsq (per-chunk sums of squares) -> gt_factor (per tensor target / (norm + eps))
//     -> gt_scale (g *= factor);
//   - statistics: gt_stats_partial (per chunk) -> gt_stats_final (per tensor and overall);
//   - Gaussian noise: gt_add_noise, element e of the list (counting across tensors) from Philox
//     counter offset + e, Box-Muller on its first two words (four for f64);
//   - loss scaling: amp_unscale (torch's _amp_foreach_non_finite_check_and_unscale_) and
//     amp_update_scale (torch's _amp_update_scale_), sync-free.
// f16/bf16 compute in f32; sums of squares accumulate in the compute type per thread and in double
// across threads and chunks; statistics accumulate in double.
#pragma once
#include "common.cuh"
#include "random.cuh"

namespace flame {

// Must match src/toolkit/grad_tools.h.
struct GtTensor {
  u64 ptr;
  i64 numel, first_chunk, n_chunks, rng_base;
};
struct GtChunk {
  i64 tensor, start, slot;  // slot: the chunk's index in the per-chunk partials
};
struct GtStats {
  double sum, sumsq, min, max, nan, inf;
};

struct DAdd { __device__ __forceinline__ double operator()(double a, double b) const { return a + b; } };
struct DMin { __device__ __forceinline__ double operator()(double a, double b) const { return a < b ? a : b; } };
struct DMax { __device__ __forceinline__ double operator()(double a, double b) const { return a > b ? a : b; } };
__device__ __forceinline__ double d_inf() { return __longlong_as_double(0x7ff0000000000000ll); }
__device__ __forceinline__ double d_nan() { return __longlong_as_double(0x7ff8000000000000ll); }

template <class T>
__global__ void gt_sumsq(const GtTensor* tensors, const GtChunk* chunks, i64 chunk, double* partial) {
  using C = compute_t<T>;
  __shared__ double smem[32];
  const GtChunk ck = chunks[blockIdx.x];
  const GtTensor t = tensors[ck.tensor];
  const T* g = reinterpret_cast<const T*>(t.ptr);
  const i64 end = ck.start + chunk < t.numel ? ck.start + chunk : t.numel;
  C acc = C(0);
  for (i64 i = ck.start + threadIdx.x; i < end; i += blockDim.x) {
    C x = to_compute(g[i]);
    acc += x * x;
  }
  double s = block_reduce(static_cast<double>(acc), DAdd(), smem);
  if (threadIdx.x == 0) partial[ck.slot] = s;
}

// One block per tensor: factor = target / (sqrt(sum of its partials) + eps).
__global__ void gt_factor(const GtTensor* tensors, const double* partial, double target, double eps, double* factor) {
  __shared__ double smem[32];
  const GtTensor t = tensors[blockIdx.x];
  double s = 0;
  for (i64 c = threadIdx.x; c < t.n_chunks; c += blockDim.x) s += partial[t.first_chunk + c];
  s = block_reduce(s, DAdd(), smem);
  if (threadIdx.x == 0) factor[blockIdx.x] = target / (sqrt(s) + eps);
}

template <class T>
__global__ void gt_scale(const GtTensor* tensors, const GtChunk* chunks, i64 chunk, const double* factor) {
  using C = compute_t<T>;
  const GtChunk ck = chunks[blockIdx.x];
  const GtTensor t = tensors[ck.tensor];
  T* g = reinterpret_cast<T*>(t.ptr);
  const C f = static_cast<C>(factor[ck.tensor]);
  const i64 end = ck.start + chunk < t.numel ? ck.start + chunk : t.numel;
  for (i64 i = ck.start + threadIdx.x; i < end; i += blockDim.x) g[i] = cast<T>(to_compute(g[i]) * f);
}

// Sum, sum of squares, min and max of the non-NaN values, NaN and Inf counts of one chunk.
template <class T>
__global__ void gt_stats_partial(const GtTensor* tensors, const GtChunk* chunks, i64 chunk, GtStats* partial) {
  __shared__ double smem[32];
  const GtChunk ck = chunks[blockIdx.x];
  const GtTensor t = tensors[ck.tensor];
  const T* g = reinterpret_cast<const T*>(t.ptr);
  const i64 end = ck.start + chunk < t.numel ? ck.start + chunk : t.numel;
  double sum = 0, sumsq = 0, lo = d_inf(), hi = -d_inf(), nan = 0, inf = 0;
  for (i64 i = ck.start + threadIdx.x; i < end; i += blockDim.x) {
    const double x = static_cast<double>(to_compute(g[i]));
    sum += x;
    sumsq += x * x;
    if (x != x) {
      nan += 1;
      continue;
    }
    if (x == d_inf() || x == -d_inf()) inf += 1;
    lo = DMin()(lo, x);
    hi = DMax()(hi, x);
  }
  GtStats r;
  r.sum = block_reduce(sum, DAdd(), smem);
  r.sumsq = block_reduce(sumsq, DAdd(), smem);
  r.min = block_reduce(lo, DMin(), smem);
  r.max = block_reduce(hi, DMax(), smem);
  r.nan = block_reduce(nan, DAdd(), smem);
  r.inf = block_reduce(inf, DAdd(), smem);
  if (threadIdx.x == 0) partial[ck.slot] = r;
}

// Block b < n_tensors combines tensor b's chunks, block n_tensors all chunks, into a row of out:
// L2 norm, min, max, mean, NaN count, Inf count (min and max over the non-NaN values; NaN when
// there is none; mean NaN for no elements).
__global__ void gt_stats_final(const GtTensor* tensors, i64 n_tensors, const GtStats* partial, i64 n_slots, double* out) {
  __shared__ double smem[32];
  i64 first = 0, count = n_slots, numel = 0;
  if (static_cast<i64>(blockIdx.x) < n_tensors) {
    const GtTensor t = tensors[blockIdx.x];
    first = t.first_chunk;
    count = t.n_chunks;
    numel = t.numel;
  } else {
    for (i64 k = 0; k < n_tensors; ++k) numel += tensors[k].numel;
  }
  double sum = 0, sumsq = 0, lo = d_inf(), hi = -d_inf(), nan = 0, inf = 0;
  for (i64 c = threadIdx.x; c < count; c += blockDim.x) {
    const GtStats p = partial[first + c];
    sum += p.sum;
    sumsq += p.sumsq;
    lo = DMin()(lo, p.min);
    hi = DMax()(hi, p.max);
    nan += p.nan;
    inf += p.inf;
  }
  sum = block_reduce(sum, DAdd(), smem);
  sumsq = block_reduce(sumsq, DAdd(), smem);
  lo = block_reduce(lo, DMin(), smem);
  hi = block_reduce(hi, DMax(), smem);
  nan = block_reduce(nan, DAdd(), smem);
  inf = block_reduce(inf, DAdd(), smem);
  if (threadIdx.x == 0) {
    const bool none = static_cast<double>(numel) == nan;  // no non-NaN value
    double* row = out + 6 * static_cast<i64>(blockIdx.x);
    row[0] = sqrt(sumsq);
    row[1] = none ? d_nan() : lo;
    row[2] = none ? d_nan() : hi;
    row[3] = numel ? sum / static_cast<double>(numel) : d_nan();
    row[4] = nan;
    row[5] = inf;
  }
}

// One standard normal from the Philox block of counter c (f32: 24-bit uniforms; f64: 53-bit).
template <class C> __device__ __forceinline__ C normal_from(const u32x4& r);
template <> __device__ __forceinline__ float normal_from<float>(const u32x4& r) {
  float u1 = ((r.x >> 8) + 1) * 5.9604644775390625e-8f;  // (0, 1]: log stays finite
  float u2 = (r.y >> 8) * 5.9604644775390625e-8f;
  float s, c;
  sincospif(2.0f * u2, &s, &c);
  return sqrtf(-2.0f * logf(u1)) * c;
}
template <> __device__ __forceinline__ double normal_from<double>(const u32x4& r) {
  double u1 = (((static_cast<u64>(r.x) << 21) ^ (r.y >> 11)) + 1) * 1.1102230246251565e-16;
  double u2 = ((static_cast<u64>(r.z) << 21) ^ (r.w >> 11)) * 1.1102230246251565e-16;
  double s, c;
  sincospi(2.0 * u2, &s, &c);
  return sqrt(-2.0 * log(u1)) * c;
}

template <class T>
__global__ void gt_add_noise(const GtTensor* tensors, const GtChunk* chunks, i64 chunk, double std_dev, u64 seed, u64 offset) {
  using C = compute_t<T>;
  const GtChunk ck = chunks[blockIdx.x];
  const GtTensor t = tensors[ck.tensor];
  T* g = reinterpret_cast<T*>(t.ptr);
  const C sd = static_cast<C>(std_dev);
  const i64 end = ck.start + chunk < t.numel ? ck.start + chunk : t.numel;
  for (i64 i = ck.start + threadIdx.x; i < end; i += blockDim.x) {
    const C z = normal_from<C>(philox(seed, offset + static_cast<u64>(t.rng_base + i)));
    g[i] = cast<T>(to_compute(g[i]) + sd * z);
  }
}

// g *= 1 / scale (the reciprocal taken in double, then rounded to f32, as torch), and *found_inf
// (and *found_any) = 1 when a value is not finite before scaling. Every writer stores the same 1.f.
template <class T>
__global__ void amp_unscale(const GtTensor* tensors, const GtChunk* chunks, i64 chunk, const float* scale, float* found_inf,
                            float* found_any) {
  using C = compute_t<T>;
  const GtChunk ck = chunks[blockIdx.x];
  const GtTensor t = tensors[ck.tensor];
  T* g = reinterpret_cast<T*>(t.ptr);
  const float inv = static_cast<float>(1.0 / static_cast<double>(*scale));
  const i64 end = ck.start + chunk < t.numel ? ck.start + chunk : t.numel;
  bool bad = false;
  for (i64 i = ck.start + threadIdx.x; i < end; i += blockDim.x) {
    const C v = to_compute(g[i]);
    bad |= v - v != C(0);  // NaN or +-Inf
    g[i] = cast<T>(inv == 1.f ? v : v * static_cast<C>(inv));
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) {
    *found_inf = 1.f;
    if (found_any) *found_any = 1.f;
  }
}

// One thread: back off on overflow, grow after growth_interval clean steps (if the grown scale is
// finite); the tracker counts clean steps since the last change.
__global__ void amp_update_scale(float* scale, int* growth_tracker, const float* found_inf, double growth, double backoff,
                                 i64 interval) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  if (*found_inf != 0.f) {
    *scale = static_cast<float>(static_cast<double>(*scale) * backoff);  // as torch: the product in double
    *growth_tracker = 0;
    return;
  }
  const int successful = *growth_tracker + 1;
  if (successful == interval) {
    const float grown = static_cast<float>(static_cast<double>(*scale) * growth);
    if (grown - grown == 0.f) *scale = grown;  // finite
    *growth_tracker = 0;
  } else {
    *growth_tracker = successful;
  }
}

}  // namespace flame

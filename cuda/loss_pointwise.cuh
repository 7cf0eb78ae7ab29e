// Fused mse_loss and l1_loss with reduction mean or sum. Host code: src/ops/loss_pointwise.cpp.
//
// Kind 0 is mse: f(d) = d^2, f'(d) = 2 d; kind 1 is l1: f(d) = |d|, f'(d) = sign(d) (sign(0) = 0; NaN
// stays NaN, as FLAME's Sign). d = a - b with a (input) and b (target) read in their own element
// types and converted to the accumulation type Acc: f32, or f64 when either operand is f64.
//
// Forward, two launches and no atomics (the same inputs on the same GPU give the same bits):
//   pwl_partial: block k sums f(d) over chunk k of the flat elements into partial[k] (Acc);
//   pwl_final:   one block sums the partials in a fixed order, multiplies by scale (1/N for mean,
//                1 for sum) and writes the 0-d loss in its dtype R.
// Backward, one launch: pwl_backward writes grad_a = f'(d) g scale in a's type and, where asked,
// grad_b = -grad_a in b's type (the host folds mse's 2 into scale). Either output pointer may be null.
//
// V elements of each operand move per access: 16 bytes of the narrower type, as 16-byte pieces of
// the wider one (at most two), when every pointer is aligned for it (the host checks; else V = 1).
#pragma once
#include "common.cuh"

namespace flame {

template <int Kind, class C> __device__ __forceinline__ C pwl_value(C d) {
  if constexpr (Kind == 0) return d * d;
  else return d < C(0) ? -d : d;
}
// f'(d) without mse's factor 2.
template <int Kind, class C> __device__ __forceinline__ C pwl_slope(C d) {
  if constexpr (Kind == 0) return d;
  else return is_nan(d) ? d : C((d > C(0)) - (d < C(0)));
}

// V elements of T as 16-byte (or smaller, for V * sizeof(T) < 16) aligned pieces.
template <class T, int V> struct PwlVec {
  static constexpr int W = static_cast<int>(16 / sizeof(T)) < V ? static_cast<int>(16 / sizeof(T)) : V;
  Vec<T, W> part[V / W];
};

template <class T, int V> __device__ __forceinline__ PwlVec<T, V> pwl_load(const T* __restrict__ p) {
  PwlVec<T, V> r;
#pragma unroll
  for (int k = 0; k < V / PwlVec<T, V>::W; ++k) r.part[k] = reinterpret_cast<const Vec<T, PwlVec<T, V>::W>*>(p)[k];
  return r;
}
template <class C, class T, int V> __device__ __forceinline__ C pwl_at(const PwlVec<T, V>& r, int i) {
  constexpr int W = PwlVec<T, V>::W;
  return static_cast<C>(to_compute(r.part[i / W].v[i % W]));
}
template <class T, int V, class C> __device__ __forceinline__ void pwl_store(T* __restrict__ p, const C (&x)[V], C sign) {
  constexpr int W = PwlVec<T, V>::W;
  PwlVec<T, V> r;
#pragma unroll
  for (int i = 0; i < V; ++i) r.part[i / W].v[i % W] = cast<T>(sign * x[i]);
#pragma unroll
  for (int k = 0; k < V / W; ++k) reinterpret_cast<Vec<T, W>*>(p)[k] = r.part[k];
}

template <class Acc> struct PwlAdd {
  __device__ __forceinline__ Acc operator()(Acc x, Acc y) const { return x + y; }
};

// Block k sums f(a - b) over elements [k chunk_len, (k + 1) chunk_len) of n; chunk_len is a multiple
// of V, so every chunk starts aligned. Two vectors of each operand in flight per thread.
template <int Kind, int V, class TA, class TB, class Acc>
__global__ void __launch_bounds__(256) pwl_partial(const TA* __restrict__ a, const TB* __restrict__ b, i64 n,
                                                   i64 chunk_len, Acc* __restrict__ partial) {
  __shared__ Acc smem[32];
  const i64 start = static_cast<i64>(blockIdx.x) * chunk_len;
  const i64 len = min(n - start, chunk_len);
  const TA* pa = a + start;
  const TB* pb = b + start;
  const i64 nv = len / V, bd = blockDim.x;
  Acc s0 = Acc(0), s1 = Acc(0);
  i64 j = threadIdx.x;
  for (; j + bd < nv; j += 2 * bd) {
    const PwlVec<TA, V> x0 = pwl_load<TA, V>(pa + j * V), x1 = pwl_load<TA, V>(pa + (j + bd) * V);
    const PwlVec<TB, V> y0 = pwl_load<TB, V>(pb + j * V), y1 = pwl_load<TB, V>(pb + (j + bd) * V);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      s0 += pwl_value<Kind>(pwl_at<Acc>(x0, k) - pwl_at<Acc>(y0, k));
      s1 += pwl_value<Kind>(pwl_at<Acc>(x1, k) - pwl_at<Acc>(y1, k));
    }
  }
  if (j < nv) {
    const PwlVec<TA, V> x0 = pwl_load<TA, V>(pa + j * V);
    const PwlVec<TB, V> y0 = pwl_load<TB, V>(pb + j * V);
#pragma unroll
    for (int k = 0; k < V; ++k) s0 += pwl_value<Kind>(pwl_at<Acc>(x0, k) - pwl_at<Acc>(y0, k));
  }
  for (i64 e = nv * V + threadIdx.x; e < len; e += bd)  // the last chunk's tail
    s0 += pwl_value<Kind>(static_cast<Acc>(to_compute(pa[e])) - static_cast<Acc>(to_compute(pb[e])));
  const Acc s = block_reduce(s0 + s1, PwlAdd<Acc>(), smem);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// One block: the loss from the chunks' partials (none for an empty input: 0, times scale).
template <class Acc, class R>
__global__ void pwl_final(const Acc* __restrict__ partial, i64 chunks, double scale, R* __restrict__ out) {
  __shared__ Acc smem[32];
  Acc s = Acc(0);
  for (i64 i = threadIdx.x; i < chunks; i += blockDim.x) s += partial[i];
  s = block_reduce(s, PwlAdd<Acc>(), smem);
  if (threadIdx.x == 0) out[0] = cast<R>(s * static_cast<Acc>(scale));
}

// grad_a = f'(a - b) g scale, grad_b = -grad_a; g is the loss's 0-d gradient in the loss dtype R.
template <int Kind, int V, class TA, class TB, class C>
__device__ __forceinline__ void pwl_grad_vec(const PwlVec<TA, V>& x, const PwlVec<TB, V>& y, C coef, TA* ga, TB* gb) {
  C v[V];
#pragma unroll
  for (int k = 0; k < V; ++k) v[k] = pwl_slope<Kind>(pwl_at<C>(x, k) - pwl_at<C>(y, k)) * coef;
  if (ga) pwl_store<TA, V>(ga, v, C(1));
  if (gb) pwl_store<TB, V>(gb, v, C(-1));
}

// Two vectors per thread per iteration, both loaded before either is used (as ew_contig).
template <int Kind, int V, class TA, class TB, class R>
__global__ void pwl_backward(const TA* __restrict__ a, const TB* __restrict__ b, const R* __restrict__ g, double scale,
                             i64 n, TA* __restrict__ ga, TB* __restrict__ gb) {
  typedef compute_t<R> C;
  const C coef = to_compute(g[0]) * static_cast<C>(scale);
  const i64 nthreads = static_cast<i64>(gridDim.x) * blockDim.x, nvec = n / V;
  i64 j = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; j + nthreads < nvec; j += 2 * nthreads) {
    const i64 i0 = j * V, i1 = (j + nthreads) * V;
    const PwlVec<TA, V> x0 = pwl_load<TA, V>(a + i0), x1 = pwl_load<TA, V>(a + i1);
    const PwlVec<TB, V> y0 = pwl_load<TB, V>(b + i0), y1 = pwl_load<TB, V>(b + i1);
    pwl_grad_vec<Kind, V>(x0, y0, coef, ga ? ga + i0 : ga, gb ? gb + i0 : gb);
    pwl_grad_vec<Kind, V>(x1, y1, coef, ga ? ga + i1 : ga, gb ? gb + i1 : gb);
  }
  if (j < nvec) {
    const i64 i0 = j * V;
    pwl_grad_vec<Kind, V>(pwl_load<TA, V>(a + i0), pwl_load<TB, V>(b + i0), coef, ga ? ga + i0 : ga, gb ? gb + i0 : gb);
  }
  for (i64 e = nvec * V + static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += nthreads) {
    const C v = pwl_slope<Kind>(static_cast<C>(to_compute(a[e])) - static_cast<C>(to_compute(b[e]))) * coef;
    if (ga) ga[e] = cast<TA>(v);
    if (gb) gb[e] = cast<TB>(-v);
  }
}

}  // namespace flame

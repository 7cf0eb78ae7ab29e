// Long rows (32-64 KiB of 16-byte vectors) of the dx-only layer_norm / rms_norm backward on sm_90:
// g and x stream through the TMA ring of ring.cuh (12 slots of a g and an x chunk in 192 KiB; a row
// of nch <= 9 chunks takes nch consecutive slots). The kernel it replaces there (norm_bwd_stream, one
// 1024-thread block per row) loads the next row only after its block is done with the previous one,
// and reads each row twice. (A forward built the same way measured slower than norm_fwd_block's
// three staged rows per SM: with one input per row, the consumers' passes and reductions of one row
// at a time set the pace.)
//
// The consumers keep the weight of their columns in registers for the whole kernel (kMaxChunks
// vectors, packed), wait on the full barriers in the first pass over a row, reduce over the 480
// consumer threads (named barrier 1), and release the slots as they write dx.
#pragma once
#include "norm.cuh"
#include "ring.cuh"

namespace flame {

#if __CUDA_ARCH__ >= 900
// The vectors of p (the weight) at this consumer thread's columns; untouched when p is null.
template <class T, int V>
__device__ __forceinline__ void load_own_columns(const T* p, i64 nvec, int nch, Words (&out)[ring::kMaxChunks]) {
  if (!p) return;
#pragma unroll
  for (int k = 0; k < ring::kMaxChunks; ++k) {
    const i64 i = static_cast<i64>(k) * ring::kChunkVecs + threadIdx.x;
    if (k < nch && i < nvec) out[k] = *reinterpret_cast<const Words*>(p + i * V);
  }
}
#endif

// dx of rows of D = nvec * V elements from g, x and the saved statistics, as norm_bwd_stream.
template <class T, int MODE>
__global__ void __launch_bounds__(ring::kThreads, 1) norm_bwd_ring(const T* __restrict__ g, const T* __restrict__ x,
                                                                  const T* __restrict__ w,
                                                                  const compute_t<T>* __restrict__ mean,
                                                                  const compute_t<T>* __restrict__ rstd,
                                                                  T* __restrict__ dx, i64 rows, i64 D) {
#if __CUDA_ARCH__ >= 900
  typedef compute_t<T> A;
  constexpr int V = 16 / sizeof(T), KM = ring::kMaxChunks;
  __shared__ A red[2 * 16];
  const Ring<2> r{smem_u32(ring_smem)};
  r.init();
  const i64 nvec = D / V;
  const int nch = static_cast<int>((nvec + ring::kChunkVecs - 1) / ring::kChunkVecs);
  if (threadIdx.x >= ring::kConsumers) {
    if (threadIdx.x == ring::kConsumers) r.produce({g, x}, rows, D * static_cast<i64>(sizeof(T)));
    return;
  }
  Words wv[KM];
  load_own_columns<T, V>(w, nvec, nch, wv);
  const A inv_d = A(1) / static_cast<A>(D);
  unsigned q0 = 0;
  for (i64 row = blockIdx.x; row < rows; row += gridDim.x, q0 += nch) {
    const A mu = MODE == kRmsNorm ? A(0) : mean[row], rs = rstd[row];
    A s[2] = {A(0), A(0)};  // sum(g w), sum(g w xhat)
#pragma unroll
    for (int k = 0; k < KM; ++k) {
      if (k < nch) {
        mbar_wait(r.full(q0 + k), Ring<2>::parity(q0 + k));
        if (static_cast<i64>(k) * ring::kChunkVecs + threadIdx.x < nvec) {
          A gs[V], xs[V], ws[V];
          r.template at<T, V>(q0 + k, 0, gs);
          r.template at<T, V>(q0 + k, 1, xs);
          if (w) unpack_words<T>(wv[k], ws);
#pragma unroll
          for (int j = 0; j < V; ++j) {
            const A gw = w ? gs[j] * ws[j] : gs[j];
            s[0] += gw;
            s[1] += gw * (xs[j] - mu) * rs;
          }
        }
      }
    }
    consumer_sum(s, red);
    const A ma = MODE == kRmsNorm ? A(0) : s[0] * inv_d, mb = s[1] * inv_d;
    T* dxr = dx + row * D;
#pragma unroll
    for (int k = 0; k < KM; ++k) {
      if (k < nch) {
        const i64 i = static_cast<i64>(k) * ring::kChunkVecs + threadIdx.x;
        if (i < nvec) {
          A gs[V], xs[V], ws[V];
          r.template at<T, V>(q0 + k, 0, gs);
          r.template at<T, V>(q0 + k, 1, xs);
          if (w) unpack_words<T>(wv[k], ws);
          Vec<T, V> o;
#pragma unroll
          for (int j = 0; j < V; ++j) {
            const A gw = w ? gs[j] * ws[j] : gs[j];
            o.v[j] = cast<T>(rs * (gw - ma - (xs[j] - mu) * rs * mb));
          }
          store_vec<T, V>(dxr + i * V, o);
        }
        r.release(q0 + k);
      }
    }
  }
#endif
}

}  // namespace flame

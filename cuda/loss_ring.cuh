// Cross-entropy from class indices with its gradient (ce_index_fwd_grad's work) for long rows on
// sm_90: each logits row streams through the TMA ring of ring.cuh (SLOTS chunks of 7.5 KiB) and
// stays in shared memory between the two passes, so it is read from DRAM once and the gradient pass
// reads shared memory instead of L2. The producer loads the next rows' chunks into the slots that
// the gradient pass releases, so an SM's loads of one row overlap its stores of the last. A row must
// fit in the ring (the host checks; 50304 f32 logits take 27 chunks, bf16 14). The host runs two
// blocks of 14 slots per SM, or one of 30 slots with two groups of consumer warps (G = 2): one
// group of 15 warps per block left bf16 rows bound by the per-element work (src/ops/loss.cpp).
//
// Per row: pass 1 over the chunks as they land (online max and sum of exp per thread, and with label
// smoothing the weighted sum of x - ref); the consumer threads merge their statistics; the thread
// holding the target's chunk writes the loss, weight and logsumexp; pass 2 writes the gradient
// (CeRowGrad, coef = 1 / *denom or 1) evict-first and releases each chunk. Rows whose target is
// ignore_index or out of range are not loaded: their gradient row is 0 (NaN and a device error report
// for a bad index).
#pragma once
#include "loss.cuh"
#include "ring.cuh"

namespace flame {

#if __CUDA_ARCH__ >= 900
// The row statistics merged over the NC consumer threads (named barrier 1), in every one of them;
// red holds one entry per consumer warp.
template <int NC, class A>
__device__ __forceinline__ RowStats<A> consumer_stats(RowStats<A> v, RowStats<A>* red) {
  v = rs_warp_reduce(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  asm volatile("bar.sync 1, %0;\n" ::"n"(NC) : "memory");  // the previous row's readers are done
  if (lane == 0) red[warp] = v;
  asm volatile("bar.sync 1, %0;\n" ::"n"(NC) : "memory");
  v = rs_warp_reduce(lane < NC / 32 ? red[lane] : rs_init<A>());
  v.m = __shfl_sync(0xffffffffu, v.m, 0);
  v.s = __shfl_sync(0xffffffffu, v.s, 0);
  v.wx = __shfl_sync(0xffffffffu, v.wx, 0);
  return v;
}
#endif

// The arguments of ce_index_fwd_grad (the accumulation type is f32: T is f32, f16 or bf16). SLOTS
// chunks in the ring, G groups of 480 consumer threads (group g takes the chunks k = g mod G of each
// row, so each chunk still has 15 readers) and one producer warp; (G * 480 + 32) threads and
// ring::Layout<1, SLOTS * kChunkBytes>::kSmemBytes of dynamic shared memory per block,
// kLossMaxSlots / SLOTS blocks per SM.
template <bool PLAIN, class T, class I, int SLOTS, int G>
__global__ void __launch_bounds__(G * ring::kConsumers + 32, ring::kLossMaxSlots / SLOTS)
    ce_index_fwd_grad_ring(const T* __restrict__ x, const I* __restrict__ target, const float* __restrict__ weight,
                           const float* __restrict__ wsum, const float* __restrict__ denom, i64 M, i64 C,
                           i64 ignore_index, double eps, float* __restrict__ loss, float* __restrict__ wrow,
                           float* __restrict__ lse, T* __restrict__ grad, DeviceErrorRecord* err,
                           unsigned int err_source) {
#if __CUDA_ARCH__ >= 900
  typedef float A;
  typedef Ring<1, SLOTS * ring::kChunkBytes> R;
  constexpr int V = 16 / sizeof(T), NC = G * ring::kConsumers;
  __shared__ RowStats<A> red[NC / 32];
  const R r{smem_u32(ring_smem)};
  r.init();
  if constexpr (PLAIN) weight = nullptr;
  const bool smooth = !PLAIN && eps != 0.0;
  const i64 nvec = C / V;
  const int nch = static_cast<int>((nvec + ring::kChunkVecs - 1) / ring::kChunkVecs);
  const int group = threadIdx.x / ring::kConsumers, lane = threadIdx.x % ring::kConsumers;  // lane: vector in a chunk
  auto skipped = [&](i64 t) { return t == ignore_index || t < 0 || t >= C; };
  if (threadIdx.x >= NC) {
    if (threadIdx.x == NC)
      r.produce({x}, M, C * static_cast<i64>(sizeof(T)), [&](i64 row) { return skipped(static_cast<i64>(target[row])); });
    return;
  }
  const A coef = denom ? A(1) / *denom : A(1), W = weight ? *wsum : static_cast<A>(C);
  unsigned q0 = 0;
  for (i64 row = blockIdx.x; row < M; row += gridDim.x) {
    const i64 t = static_cast<i64>(target[row]);
    T* gr = grad + row * C;
    if (skipped(t)) {  // nothing was loaded for this row
      const bool bad = ce_skip_row(t, row, C, ignore_index, threadIdx.x == 0, loss, wrow, lse, err, err_source);
      Vec<T, V> fill;
#pragma unroll
      for (int k = 0; k < V; ++k) fill.v[k] = cast<T>(bad ? l_nan<A>() : A(0));
      for (i64 i = threadIdx.x; i < nvec; i += NC) store_streaming(gr + i * V, fill);
      continue;
    }
    const T* chunk0 = reinterpret_cast<const T*>(ring_smem + (q0 % R::S) * ring::kChunkBytes);
    A ref = A(0);
    RowStats<A> st = rs_init<A>();
    if (smooth) {  // every group reads chunk 0's first logit (the slot is released after all have)
      mbar_wait(r.full(q0), R::parity(q0));
      ref = finite_or_zero(static_cast<A>(to_compute(chunk0[0])));
    }
    for (int k = group; k < nch; k += G) {
      mbar_wait(r.full(q0 + k), R::parity(q0 + k));
      const i64 i = static_cast<i64>(k) * ring::kChunkVecs + lane;
      if (i < nvec) {
        A xs[V];
        r.template at<T, V>(q0 + k, 0, xs, lane);
        rs_add(st, xs);
        if (smooth) {
#pragma unroll
          for (int j = 0; j < V; ++j) st.wx += (weight ? weight[i * V + j] : A(1)) * (xs[j] - ref);
        }
      }
    }
    st = consumer_stats<NC>(st, red);
    const A lg = m_log(st.s);  // lse - max: differences to lse are taken as (max - x) + lg, exactly
    const A wt = weight ? weight[t] : A(1);
    const int kt = static_cast<int>(t / (static_cast<i64>(V) * ring::kChunkVecs));
    if (threadIdx.x == (kt % G) * ring::kConsumers) {  // the target's logit from its chunk, which this warp holds yet
      const T* ct = reinterpret_cast<const T*>(ring_smem + ((q0 + kt) % R::S) * ring::kChunkBytes);
      ce_write_row(static_cast<A>(to_compute(ct[t - static_cast<i64>(kt) * V * ring::kChunkVecs])), row, st, lg, wt, W, ref,
                   eps, C, smooth, loss, wrow, lse);
    }
    const CeRowGrad<A> rg(coef, wt, W, eps, C, st.m + lg, t);
    for (int k = group; k < nch; k += G) {
      const i64 i = static_cast<i64>(k) * ring::kChunkVecs + lane;
      if (i < nvec) {
        A xs[V];
        r.template at<T, V>(q0 + k, 0, xs, lane);
        store_streaming(gr + i * V, rg.template vec<T>(i * V, xs, weight, smooth));
      }
      r.release(q0 + k);
    }
    q0 += nch;
  }
#endif
}

}  // namespace flame

// Device helpers of the sm_90a attention forward sdpa_fwd_tma (attention_tma.cuh; FlashAttention-3
// style, Shah et al., 2024): the P V product from P in A registers, O's rescale, and the barrier that
// keeps a wgmma wait behind the work it is meant to overlap. attention_tma.cuh includes this file and
// attention_tma_bwd.cuh includes that one. (This file also held sdpa_fwd_wg and sdpa_bwd_wg, whose math
// warps loaded their own tiles by cp.async; the TMA kernels replaced them.)
#pragma once
#include "attention.cuh"
#include "wgmma.cuh"

namespace flame {
namespace attn {

// Issues O += P V for one tile: BN / 16 products of k16, P in A registers, V the MN-major shared
// tile at sv (column blocks of 64 head dims, 16 KB apart). The caller fences, commits and waits.
template <class T, int D, int BN>
__device__ __forceinline__ void pv_product(float (&o)[D / 2], const unsigned (&pa)[BN / 16][4], unsigned sv) {
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    const u64 dv = wg_desc(sv + kk * 16 * 128, 128 * 128, 1024);
    wgmma_rs<T, D>(o, pa[kk], dv, 1);
  }
}

// ptxas hoists a wgmma wait (it has no operands) to the top of its basic block, which puts the wait for
// a product issued to run beside some work (P V beside the softmax) before that work
// and serialises the two. Called between the work and the wait: a barrier of this warpgroup (ids 1 and
// 2; 0 is __syncthreads) whose id depends on v, a value computed from all of the work's results that is
// >= 0 or NaN (so the id is always 1 + wg), cannot move above the work, and the wait stays behind it
// (SASS: WARPGROUP.DEPBAR after the last MUFU.EX2).
__device__ __forceinline__ void wg_barrier_after(float v, int wg) {
  asm volatile("bar.sync %0, 128;" ::"r"(1 + wg + (v < 0.f ? 2 : 0)) : "memory");
}

// O *= alpha of its row (two rows per lane: accumulators 4 j + e belong to row e / 2).
template <int NO>
__device__ __forceinline__ void rescale_o(float (&o)[NO], const float (&alpha)[2]) {
#pragma unroll
  for (int j = 0; j < NO / 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[4 * j + e] *= alpha[e >> 1];
}

}  // namespace attn
}  // namespace flame

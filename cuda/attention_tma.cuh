// Attention forward on sm_90a (wgmma), FlashAttention-3 structure (Shah et al., 2024) with a TMA
// producer: f16/bf16, head dim D = Dv of 64 or 128, no mask, no dropout, scale > 0 (the row max is taken
// over unscaled scores), causal or not; the parameters and output contract of sdpa_fwd (attention.cuh):
// O and lse2, which either backward reads. The host (src/ops/attention.cpp) describes q, k and v by 4-D
// tensor maps (an input no map takes, e.g. broadcast with a stride of 0, is copied dense first).
// Measured on an H200 at 8x16x2048x128 bf16: 0.50 ms against 0.69 for the cp.async kernel it replaced
// (sdpa_fwd_wg, whose math warps loaded their own tiles; bench/RESULTS.md).
//
// Per consumer warpgroup and key tile j of 128 keys: S_j = Q K_j^T by wgmma with Q and K from
// 128-byte-swizzled shared tiles (wgmma.cuh); causal and bounds masks and the online softmax in
// registers (a row's 128 scores live in one quad of lanes); P rounded to f16/bf16 straight from the S
// accumulators into A registers; O += P V by wgmma with V from shared memory (MN-major). The products
// overlap the softmax: iteration j issues S_j and then P_{j-1} V_{j-1}, waits for S_j only, computes its
// softmax while P_{j-1} V_{j-1} runs, and rescales O before the next products are issued.
//
// A block of three warpgroups (384 threads) takes 128 query rows of one (batch, head):
//   warpgroup 0, the producer, gives up registers (setmaxnreg.dec to 24); one thread loads Q once and
//     the K and V tiles of 128 keys by TMA (cp.async.bulk.tensor.4d, tensor maps over [B, H, L, D] with
//     the inputs' strides, boxes of 128 rows x 64 columns, SWIZZLE_128B: column block b of a tile at
//     + b x 128 rows x 128 bytes, 16-byte chunk c of row r at chunk c ^ (r % 8); rows past L zero-filled)
//     into a ring of NST stages;
//   warpgroups 1 and 2, the consumers, take 64 query rows each (setmaxnreg.inc to 240) and run the loop
//     above.
// Barriers (mbarrier, one 8-byte word each, after the tiles): Q full; per stage s K full / V full (count
// 1: the producer's arrive.expect_tx of the tile's bytes, completed by the TMA's complete_tx) and K empty
// / V empty (count 2: one thread of each consumer warpgroup arrives after the wgmma that read the stage
// is complete: K_j after S_j, V_j after P_j V_j). Tile j lives in stage j % NST; its full barrier
// completes for the (j / NST)-th time, so consumers wait parity (j / NST) & 1, and the producer refills
// stage s for tile j >= NST after the empty barrier's (j / NST - 1)-th completion. No block barrier in
// the key loop. Every TMA load is waited on by the consumers, so no copy is in flight when the block ends.
// Shared memory: Q, NST stages of K, NST of V (128 x D x 2 bytes each), the barriers, from a 1024-aligned
// base (the 128-byte swizzle repeats every 1024 bytes of address).
// FA3's ping-pong turns of the two consumers (named barriers around each one's products) measured no
// faster here (0.50 ms both) and are not built.
#pragma once
#include "attention_wg.cuh"
#include "mbarrier.cuh"

namespace flame {
namespace attn {

// A CUtensorMap of cuda.h as the device sees it: 128 opaque bytes, 64-byte aligned.
struct alignas(64) TmaDesc {
  u64 w[16];
};
struct TmaMaps {  // mirrors AttnTmaMaps in src/ops/attention.cpp
  TmaDesc q, k, v;
};

template <int D>
struct TmaFwdTile {
  static constexpr int kThreads = 384;               // producer warpgroup + two consumer warpgroups
  static constexpr int kBM = 128, kBN = 128;          // query rows per block, keys per tile
  static constexpr int kStages = D == 128 ? 2 : 3;    // K / V tiles in flight (shared memory bound)
  static constexpr int kTileBytes = 128 * D * 2;
  static constexpr int kBarOffset = (1 + 2 * kStages) * kTileBytes;          // Q, K stages, V stages
  static constexpr int kSmemBytes = kBarOffset + 8 * (1 + 4 * kStages) + 1024;  // barriers, alignment slack
};

#if FLAME_HAS_WGMMA
// The register split of the producer warpgroup (threads 0-127) and two consumer warpgroups:
// 128 x 24 + 256 x 240 <= 64K. is_producer() gives the producer's registers up and says which it is.
__device__ __forceinline__ bool is_producer() {
  if (threadIdx.x >= 128) return false;
  asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
  return true;
}
__device__ __forceinline__ void consumer_regs() { asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory"); }
// Box {c0 .. c0 + 63, c1 .. c1 + 127, c2, c3} of the tensor map into shared memory at dst, completing
// its bytes on the barrier bar (elements outside the tensor arrive as zeros and count too).
__device__ __forceinline__ void tma_load_4d(unsigned dst, const TmaDesc* map, unsigned bar, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<u64>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
__device__ __forceinline__ void tma_prefetch_desc(const TmaDesc* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<u64>(map)) : "memory");
}
// Prefetches every tensor map of a kernel's maps parameter (a struct of TmaDesc).
template <class Maps> __device__ __forceinline__ void tma_prefetch_all(const Maps& maps) {
#pragma unroll
  for (unsigned i = 0; i < sizeof(Maps) / sizeof(TmaDesc); ++i) tma_prefetch_desc(reinterpret_cast<const TmaDesc*>(&maps) + i);
}
#endif

template <class T, int D>
__global__ void __launch_bounds__(384, 1) sdpa_fwd_tma(const Params p, const __grid_constant__ TmaMaps maps) {
#if FLAME_HAS_WGMMA
  using Tile = TmaFwdTile<D>;
  constexpr int BM = Tile::kBM, BN = Tile::kBN, TB = Tile::kTileBytes, NST = Tile::kStages;
  constexpr int NS = BN / 2, NO = D / 2;  // accumulators per lane: S (64 x BN), O (64 x D)
  constexpr unsigned kBlock = 128 * 128;  // bytes of one 64-wide column block of a 128-row tile
  const unsigned base = (smem_u32(attn_smem) + 1023u) & ~1023u;
  const unsigned sQ = base, sK = base + TB, sV = base + (1 + NST) * TB;  // stage s of K / V at + s * TB
  const unsigned barQ = base + Tile::kBarOffset;
  const unsigned fullK = barQ + 8, fullV = fullK + 8 * NST, emptyK = fullV + 8 * NST, emptyV = emptyK + 8 * NST;

  const int mblocks = (p.Lq + BM - 1) / BM;
  const int bh = static_cast<int>(blockIdx.x / mblocks);  // as sdpa_fwd: one (batch, head) side by side,
  const int m0 = (mblocks - 1 - static_cast<int>(blockIdx.x % mblocks)) * BM;  // the longest rows first
  const int b = bh / p.H, h = bh % p.H;
  const int n_end = p.causal ? min(p.Lk, m0 + BM) : p.Lk;
  const int ntiles = (n_end + BN - 1) / BN;

  if (threadIdx.x == 0) {
    mbar_init(barQ, 1);
    for (int s = 0; s < NST; ++s) {
      mbar_init(fullK + 8 * s, 1);
      mbar_init(fullV + 8 * s, 1);
      mbar_init(emptyK + 8 * s, 2);  // one arrival per consumer warpgroup
      mbar_init(emptyV + 8 * s, 2);
    }
  }
  mbarriers_ready();

  if (is_producer()) {
    if (threadIdx.x == 0) {
      tma_prefetch_all(maps);
      mbar_expect_tx(barQ, TB);
#pragma unroll
      for (int cb = 0; cb < D / 64; ++cb) tma_load_4d(sQ + cb * kBlock, &maps.q, barQ, cb * 64, m0, h, b);
      for (int j = 0; j < ntiles; ++j) {
        const int s = j % NST;
        const unsigned ph = static_cast<unsigned>((j / NST) & 1) ^ 1u;  // parity of the (j / NST - 1)-th release
        if (j >= NST) mbar_wait(emptyK + 8 * s, ph);
        mbar_expect_tx(fullK + 8 * s, TB);
#pragma unroll
        for (int cb = 0; cb < D / 64; ++cb) tma_load_4d(sK + s * TB + cb * kBlock, &maps.k, fullK + 8 * s, cb * 64, j * BN, h, b);
        if (j >= NST) mbar_wait(emptyV + 8 * s, ph);
        mbar_expect_tx(fullV + 8 * s, TB);
#pragma unroll
        for (int cb = 0; cb < D / 64; ++cb) tma_load_4d(sV + s * TB + cb * kBlock, &maps.v, fullV + 8 * s, cb * 64, j * BN, h, b);
      }
    }
    return;
  }
  consumer_regs();

  const int wg = (threadIdx.x >> 7) - 1, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const bool leader = (threadIdx.x & 127) == 0;  // arrives on the empty barriers for its warpgroup
  const int wrow0 = m0 + wg * 64;               // the warpgroup's first query row
  const int row0 = wrow0 + warp * 16 + g;       // this lane's rows: row0 and row0 + 8

  const float c = p.scale_log2;  // > 0 (the host's condition): max of scaled scores = c * max of raw ones
  float o[NO], m_i[2] = {neg_inf(), neg_inf()}, l_i[2] = {0.f, 0.f};
  float alpha[2] = {1.f, 1.f};  // exp2(m_{j-1} - m_j) of the last softmax: O's rescale before P_j V_j
#pragma unroll
  for (int i = 0; i < NO; ++i) o[i] = 0.f;
  unsigned pa[BN / 16][4];  // P of the previous tile as A registers (columns 16 kk .. 16 kk + 15)

  mbar_wait(barQ, 0);  // also when ntiles == 0: the block must not end with Q's copy in flight
  for (int nb = 0; nb < ntiles; ++nb) {
    const int n0 = nb * BN, st = nb % NST, sp = (nb + NST - 1) % NST;  // stages of K_j and of V_{j-1}
    mbar_wait(fullK + 8 * st, static_cast<unsigned>((nb / NST) & 1));
    // O = alpha_{j-1} O + P_{j-1} V_{j-1}: the rescale comes before both products are issued (no wgmma in
    // flight), so that nothing after the softmax below touches O; ptxas would otherwise pull the wait for
    // P V up into the softmax to interleave the rescale with it.
    rescale_o(o, alpha);
    float s[NS];
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const unsigned off = (ks >> 2) * kBlock + (ks & 3) * 32;
      wgmma_ss_n128<T>(s, wg_desc(sQ + wg * 64 * 128 + off, 16, 1024), wg_desc(sK + st * TB + off, 16, 1024), ks > 0);
    }
    wg_commit();
    if (nb > 0) {
      mbar_wait(fullV + 8 * sp, static_cast<unsigned>(((nb - 1) / NST) & 1));
      pv_product<T, D, BN>(o, pa, sV + sp * TB);
      wg_commit();
    }
    if (nb > 0) wg_wait<1>();  // S is done; P_{j-1} V_{j-1} may still run
    else wg_wait<0>();
    wg_fence_operands(s);
    if (leader) mbar_arrive(emptyK + 8 * st);  // this warpgroup has read K_j

    if (n0 + BN > p.Lk || (p.causal && n0 + BN - 1 > wrow0)) {
#pragma unroll
      for (int i = 0; i < NS; ++i)
        if (out_of_bounds(p, row0 + ((i >> 1) & 1) * 8, n0 + (i >> 2) * 8 + 2 * t + (i & 1))) s[i] = neg_inf();
    }
    // Online softmax in the log2 domain, exp2(c s - c m) as one FMA and one MUFU op per score; a row's
    // columns live in the quad of lanes 4g .. 4g + 3.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mp[4] = {neg_inf(), neg_inf(), neg_inf(), neg_inf()};
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) mp[j & 3] = fmaxf(mp[j & 3], fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
      float mx = fmaxf(fmaxf(mp[0], mp[1]), fmaxf(mp[2], mp[3]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m_i[r], mx * c);
      const float mb = m_new == neg_inf() ? 0.f : m_new;  // all masked so far: exp2(-inf - 0) = 0, no NaN
      alpha[r] = fast_exp2(m_i[r] - mb);
      m_i[r] = m_new;
      float sp4[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float x = fast_exp2(fmaf(s[4 * j + 2 * r + e], c, -mb));
          s[4 * j + 2 * r + e] = x;
          sp4[(2 * j + e) & 3] += x;
        }
      l_i[r] = l_i[r] * alpha[r] + ((sp4[0] + sp4[1]) + (sp4[2] + sp4[3]));
    }
    wg_barrier_after(l_i[0] + l_i[1], wg);  // named barrier 1 + wg: keeps the wait below after the softmax
    wg_wait<0>();                           // P_{j-1} V_{j-1} is in O: now the P registers may change
    wg_fence_operands(o);
    if (nb > 0 && leader) mbar_arrive(emptyV + 8 * sp);  // this warpgroup has read V_{j-1}
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
      for (int e = 0; e < 4; ++e) pa[kk][e] = pack2<T>(s[8 * kk + 2 * e], s[8 * kk + 2 * e + 1]);
  }
  if (ntiles > 0) {  // the last tile's P V (its stage is not released: the producer has finished)
    const int sp = (ntiles - 1) % NST;
    mbar_wait(fullV + 8 * sp, static_cast<unsigned>(((ntiles - 1) / NST) & 1));
    rescale_o(o, alpha);
    pv_product<T, D, BN>(o, pa, sV + sp * TB);
    wg_commit();
    wg_wait<0>();
    wg_fence_operands(o);
  }

  float* lse = reinterpret_cast<float*>(p.lse) + static_cast<i64>(bh) * p.Lq;
  T* out = reinterpret_cast<T*>(p.o) + static_cast<i64>(bh) * p.Lq * p.Dv;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = l_i[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int i = row0 + r * 8;
    if (i >= p.Lq) continue;
    const bool live = l > 0.f;  // else every key of the row was masked: output 0
    const float inv = live ? 1.f / l : 0.f;
    if (t == 0) lse[i] = live ? m_i[r] + log2f(l) : pos_inf();
    T* row = out + static_cast<i64>(i) * p.Dv;
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      *reinterpret_cast<unsigned*>(row + j * 8 + 2 * t) = pack2<T>(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
  }
#else
  asm volatile("trap;");  // sm_90a only; the host never launches it elsewhere
#endif
}

}  // namespace attn
}  // namespace flame

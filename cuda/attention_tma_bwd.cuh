// Attention backward on sm_90a (wgmma), FlashAttention-3's backward structure (Shah et al., 2024) with a
// TMA producer: the backward of sdpa_fwd / sdpa_fwd_tma on sdpa_fwd_tma's conditions (f16/bf16, D = Dv
// of 64 or 128, no mask, no dropout, scale > 0; causal, Lq != Lk), after sdpa_bwd_delta (delta =
// rowsum(dO O)) and before sdpa_bwd_dq (dq = scale dq_acc), as sdpa_bwd (attention.cuh): dK (times
// scale) and dV stored, dQ added into dq_acc (f32). The host (src/ops/attention.cpp) describes q, k, v
// and dO by 4-D tensor maps (an input no map takes, e.g. broadcast with a stride of 0, is copied dense
// first). Measured on an H200 at 8x16x2048x128 bf16, forward and backward: 2.40-2.45 ms against 2.69-2.88
// with the cp.async kernel it replaced (sdpa_bwd_wg, whose math warps loaded their own tiles), causal
// 1.49-1.51 against 1.65.
//
// Per consumer warpgroup (64 keys) and query tile of 64:
//   S^T = K Q^T and dP^T = V dO^T by wgmma (A = its 64 keys, B = the 64 queries, both K-major);
//   P^T = exp2(scale log2(e) S^T - lse2), dS^T = P^T (dP^T - delta), in the accumulator registers
//     (P = 0 for rows past Lq);
//   dV += P^T dO and dK += dS^T Q by wgmma with P^T / dS^T as A registers and dO / Q MN-major;
//   dS^T also goes to shared memory ([128 keys][64 queries], swizzled), and after a named barrier
//   dQ = dS K by wgmma with both operands MN-major, added into dq_acc by vector reductions.
//
// A block of three warpgroups (384 threads) takes 128 keys of one (batch, head) and walks the query
// tiles of 64 (from (n0 / 64) 64 when causal):
//   warpgroup 0, the producer, gives up registers (setmaxnreg.dec to 24). Thread 0 loads K and V of the
//     block once (one barrier, kv) and per query tile Q and dO (boxes of 64 columns x 64 rows) by TMA
//     (128-byte swizzle, rows past Lq / Lk zero-filled) into stage it % NST of a ring. Warp 1 copies
//     lse2 and delta of the tile's 64 rows (f32, 256 bytes each) into the same stage with plain loads
//     and stores (0 past Lq) and arrives on the stage's full barrier, lane by lane. Not a bulk copy: cp.async.bulk needs a 16-byte aligned source, and
//     lse2 + bh Lq + m0 is one only when Lq % 4 == 0; nor read by the consumers from global memory: the
//     load latency would sit in the middle of their tile (16 values of each per lane).
//   warpgroups 1 and 2, the consumers (setmaxnreg.inc to 240), take 64 keys each and run the tile
//     above, dQ = dS K at D = 128 over head dims 64 w .. 64 w + 63 and all 128 keys (so reading the
//     other warpgroup's dS^T rows; D = 64: all head dims over its own keys), added into dq_acc.
// Barriers (mbarrier, 8 bytes each):
//   kv (count 1): the producer's arrive.expect_tx of 2 x 128 x D x 2 bytes, completed by the TMA.
//   full[s] (count 33): thread 0's arrive.expect_tx of Q's and dO's box bytes (2 x 64 x D x 2; the TMA
//     counts a box's full bytes, zero-filled rows included), and one arrival per lane of warp 1 after its
//     lse2 / delta stores (mbarrier.arrive releases them; the consumers' wait acquires them).
//   empty[s] (count 2): the leader thread of each consumer warpgroup arrives once the stage's last reader
//     is done: after the wg_wait<0> that completes dV += P^T dO and dK += dS^T Q (the last wgmmas that
//     read Q and dO; lse2 and delta were read before those products were issued, their values feed the
//     A registers). A wgmma is issued by all four warps of its warpgroup, so its completion covers every
//     warp's reads.
// Parities: query tile it lives in stage s = it % NST, whose full barrier completes for the (it / NST)-th
// time when the tile has landed: the consumers wait parity (it / NST) & 1. For it >= NST both producer
// actors (thread 0 and warp 1, each on its own) first wait the (it / NST - 1)-th completion of empty[s],
// parity ((it / NST) & 1) ^ 1, i.e. both consumers have released tile it - NST: the producer never
// overwrites a stage still read, and cannot run more than one phase ahead on any barrier (an arrival for
// tile it + NST needs the consumers' release of tile it, which needs full[s]'s phase of tile it complete).
// kv completes once: parity 0. Exit: the consumers wait kv and every tile's full barrier, so no TMA copy
// is in flight when the block ends (the producer warps return early; the last NST releases go unwaited).
// dS^T: two buffers, tile it in buffer it & 1. Written rows, fence.proxy.async, then a named barrier
// (D = 128: id 1 over the 256 consumer threads; D = 64: id 2 + w over warpgroup w's 128, which alone
// reads its rows), then the dQ wgmma. A warpgroup writes buffer b again at tile it + 2 only after passing
// tile it + 1's barrier, which the other warpgroup reaches after its dQ wgmma of tile it has completed
// (wg_wait<0>): one barrier per tile, no __syncthreads (only the one after the mbarrier initialisation).
// Shared memory from a 1024-aligned base (the 128-byte swizzle repeats every 1024 bytes): K, V (128 x D
// x 2 bytes each), NST stages of Q and of dO (64 x D x 2), dS^T twice (128 x 64 x 2), NST x 64 lse2 and
// delta, the barriers.
#pragma once
#include "attention_tma.cuh"

namespace flame {
namespace attn {

struct TmaBwdMaps {  // mirrors AttnTmaBwdMaps in src/ops/attention.cpp: K, V boxes of 128 rows, Q, dO of 64
  TmaDesc q, k, v, dout;
};

template <int D>
struct TmaBwdTile {
  static constexpr int kThreads = 384;              // producer warpgroup + two consumer warpgroups
  static constexpr int kBN = 128, kBM = 64;          // keys per block, queries per tile
  static constexpr int kStages = D == 128 ? 3 : 4;   // query tiles in flight (shared memory bound at D = 128)
  static constexpr int kKvBytes = 128 * D * 2, kQBytes = 64 * D * 2, kDsBytes = 128 * 64 * 2;
  static constexpr int kStatOffset = 2 * kKvBytes + 2 * kStages * kQBytes + 2 * kDsBytes;  // lse2, delta
  static constexpr int kBarOffset = kStatOffset + 2 * kStages * 64 * 4;
  static constexpr int kSmemBytes = kBarOffset + 8 * (1 + 2 * kStages) + 1024;  // barriers, alignment slack
};

template <class T, int D>
__global__ void __launch_bounds__(384, 1) sdpa_bwd_tma(const Params p, const __grid_constant__ TmaBwdMaps maps) {
#if FLAME_HAS_WGMMA
  using Tile = TmaBwdTile<D>;
  constexpr int BN = Tile::kBN, BM = Tile::kBM, NST = Tile::kStages;
  constexpr int KVB = Tile::kKvBytes, QB = Tile::kQBytes, DSB = Tile::kDsBytes;
  constexpr unsigned kKvBlock = 128 * 128, kQBlock = 64 * 128;  // bytes of one 64-wide column block
  const unsigned base = (smem_u32(attn_smem) + 1023u) & ~1023u;
  const unsigned sK = base, sV = sK + KVB, sQ = sV + KVB, sdO = sQ + NST * QB, sdS = sdO + NST * QB;  // stage s at + s QB
  float* sL = reinterpret_cast<float*>(attn_smem + (base + Tile::kStatOffset - smem_u32(attn_smem)));  // [NST][64]
  float* sDelta = sL + NST * BM;                                                                       // [NST][64]
  const unsigned barKV = base + Tile::kBarOffset, full = barKV + 8, empty = full + 8 * NST;  // stage s at + 8 s

  const int nblocks = (p.Lk + BN - 1) / BN;
  const int bh = static_cast<int>(blockIdx.x / nblocks);  // as sdpa_bwd: the key blocks of one (batch, head) side by side
  const int n0 = static_cast<int>(blockIdx.x % nblocks) * BN;
  const int b = bh / p.H, h = bh % p.H;
  const int m_begin = p.causal ? (n0 / BM) * BM : 0;  // causal: queries i >= j >= n0
  const int ntiles = p.Lq > m_begin ? (p.Lq - m_begin + BM - 1) / BM : 0;

  if (threadIdx.x == 0) {
    mbar_init(barKV, 1);
    for (int s = 0; s < NST; ++s) {
      mbar_init(full + 8 * s, 1 + 32);  // thread 0's expect_tx and warp 1's 32 lanes
      mbar_init(empty + 8 * s, 2);      // one arrival per consumer warpgroup
    }
  }
  mbarriers_ready();

  if (is_producer()) {
    if (threadIdx.x == 0) {
      tma_prefetch_all(maps);
      mbar_expect_tx(barKV, 2 * KVB);
#pragma unroll
      for (int cb = 0; cb < D / 64; ++cb) {
        tma_load_4d(sK + cb * kKvBlock, &maps.k, barKV, cb * 64, n0, h, b);
        tma_load_4d(sV + cb * kKvBlock, &maps.v, barKV, cb * 64, n0, h, b);
      }
      for (int it = 0; it < ntiles; ++it) {
        const int s = it % NST, m0 = m_begin + it * BM;
        if (it >= NST) mbar_wait(empty + 8 * s, static_cast<unsigned>((it / NST) & 1) ^ 1u);  // tile it - NST released
        mbar_expect_tx(full + 8 * s, 2 * QB);
#pragma unroll
        for (int cb = 0; cb < D / 64; ++cb) {
          tma_load_4d(sQ + s * QB + cb * kQBlock, &maps.q, full + 8 * s, cb * 64, m0, h, b);
          tma_load_4d(sdO + s * QB + cb * kQBlock, &maps.dout, full + 8 * s, cb * 64, m0, h, b);
        }
      }
    } else if ((threadIdx.x >> 5) == 1) {  // warp 1: lse2 and delta, rows lane and lane + 32 of each tile
      const int lane = threadIdx.x & 31;
      const float* lse = reinterpret_cast<const float*>(p.lse) + static_cast<i64>(bh) * p.Lq;
      const float* delta = reinterpret_cast<const float*>(p.delta) + static_cast<i64>(bh) * p.Lq;
      for (int it = 0; it < ntiles; ++it) {
        const int s = it % NST, m0 = m_begin + it * BM;
        const int r0 = m0 + lane, r1 = r0 + 32;
        const float l0 = r0 < p.Lq ? lse[r0] : 0.f, d0 = r0 < p.Lq ? delta[r0] : 0.f;  // loads before the wait
        const float l1 = r1 < p.Lq ? lse[r1] : 0.f, d1 = r1 < p.Lq ? delta[r1] : 0.f;
        if (it >= NST) mbar_wait(empty + 8 * s, static_cast<unsigned>((it / NST) & 1) ^ 1u);
        sL[s * BM + lane] = l0;
        sL[s * BM + lane + 32] = l1;
        sDelta[s * BM + lane] = d0;
        sDelta[s * BM + lane + 32] = d1;
        mbar_arrive(full + 8 * s);  // release: the stores above before the arrival
      }
    }
    return;
  }
  consumer_regs();

  const int wg = (threadIdx.x >> 7) - 1, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const bool leader = (threadIdx.x & 127) == 0;  // arrives on the empty barriers for its warpgroup
  const int krow = wg * 64 + warp * 16 + g;      // this lane's keys within the block: krow and krow + 8
  float* dq_acc = reinterpret_cast<float*>(p.dq_acc) + static_cast<i64>(bh) * p.Lq * p.D;

  const float c = p.scale_log2;  // > 0 (the host's condition)
  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;

  mbar_wait(barKV, 0);  // also when ntiles == 0: the block must not end with K's and V's copies in flight
  for (int it = 0; it < ntiles; ++it) {
    const int m0 = m_begin + it * BM, st = it % NST;
    const unsigned qs = sQ + st * QB, dos = sdO + st * QB, ds = sdS + static_cast<unsigned>(it & 1) * DSB;
    mbar_wait(full + 8 * st, static_cast<unsigned>((it / NST) & 1));  // Q, dO, lse2, delta of tile it

    // S^T = K Q^T, then dP^T = V dO^T behind it (m64 n64, D / 16 k-steps each).
    float s[32], dp[32];
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const unsigned ka = (ks >> 2) * kKvBlock + wg * 64 * 128 + (ks & 3) * 32, qa = (ks >> 2) * kQBlock + (ks & 3) * 32;
      wgmma_ss_n64<T, false>(s, wg_desc(sK + ka, 16, 1024), wg_desc(qs + qa, 16, 1024), ks > 0);
    }
    wg_commit();
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const unsigned ka = (ks >> 2) * kKvBlock + wg * 64 * 128 + (ks & 3) * 32, qa = (ks >> 2) * kQBlock + (ks & 3) * 32;
      wgmma_ss_n64<T, false>(dp, wg_desc(sV + ka, 16, 1024), wg_desc(dos + qa, 16, 1024), ks > 0);
    }
    wg_commit();
    wg_wait<1>();
    wg_fence_operands(s);

    // P^T (element e of column tile j: key krow + 8 (e >> 1), query 8 j + 2 t + (e & 1)), while dP^T runs.
    const float* L = sL + st * BM;
    const bool edge = n0 + BN > p.Lk || m0 + BM > p.Lq || (p.causal && n0 + BN - 1 > m0);
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int il = (i >> 2) * 8 + 2 * t + (i & 1);
      float x = s[i] * c;
      if (edge && (m0 + il >= p.Lq || out_of_bounds(p, m0 + il, n0 + krow + ((i >> 1) & 1) * 8))) x = neg_inf();  // P = 0
      s[i] = fast_exp2(x - L[il]);
    }
    wg_wait<0>();
    wg_fence_operands(dp);
    const float* Dl = sDelta + st * BM;
#pragma unroll
    for (int i = 0; i < 32; ++i) dp[i] = s[i] * (dp[i] - Dl[(i >> 2) * 8 + 2 * t + (i & 1)]);  // dS^T

    // P^T and dS^T as A registers (query columns 16 kk .. 16 kk + 15); dS^T also into buffer it & 1.
    unsigned pp[BM / 16][4], pd[BM / 16][4];
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        pp[kk][e] = pack2<T>(s[8 * kk + 2 * e], s[8 * kk + 2 * e + 1]);
        pd[kk][e] = pack2<T>(dp[8 * kk + 2 * e], dp[8 * kk + 2 * e + 1]);
        const int row = krow + (e & 1) * 8, j = 2 * kk + (e >> 1);  // key row, 8-query chunk
        const unsigned addr = ds + row * 128 + ((j ^ (row & 7)) << 4) + 4 * t;
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(pd[kk][e]) : "memory");
      }
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) {  // dV += P^T dO
      const u64 db = wg_desc(dos + kk * 16 * 128, kQBlock, 1024);
      wgmma_rs<T, D>(dv, pp[kk], db, 1);
    }
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) {  // dK += dS^T Q
      const u64 db = wg_desc(qs + kk * 16 * 128, kQBlock, 1024);
      wgmma_rs<T, D>(dk, pd[kk], db, 1);
    }
    wg_commit();
    fence_proxy_async_shared();  // this thread's dS^T stores, visible to wgmma's reads
    // dS^T rows of the readers are complete: both consumer warpgroups at D = 128, this one at D = 64.
    if constexpr (D == 128) asm volatile("bar.sync 1, 256;\n" ::: "memory");
    else if (wg == 0) asm volatile("bar.sync 2, 128;\n" ::: "memory");  // constant ids: ptxas reserves only 0, 2, 3
    else asm volatile("bar.sync 3, 128;\n" ::: "memory");
    wg_wait<0>();  // dV and dK are summed: Q and dO of the stage are read, the P^T / dS^T registers free
    wg_fence_operands(dv);
    wg_fence_operands(dk);
    if (leader) mbar_arrive(empty + 8 * st);  // this warpgroup is done with stage st

    // dQ = dS K: A = dS^T tile read as [queries x keys] (MN-major), B = K (MN-major, head dims contiguous).
    float dq[32];
    constexpr int KSTEPS = D == 128 ? BN / 16 : 64 / 16;
    const unsigned key0 = D == 128 ? 0u : static_cast<unsigned>(wg) * 64u;
    const unsigned kcol = D == 128 ? static_cast<unsigned>(wg) * kKvBlock : 0u;
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
      const unsigned r = (key0 + kk * 16) * 128;
      wgmma_ss_n64<T, true>(dq, wg_desc(ds + r, kQBlock, 1024), wg_desc(sK + kcol + r, kKvBlock, 1024), kk > 0);
    }
    wg_commit();
    wg_wait<0>();  // (before the next tile's barrier: the other warpgroup may then rewrite this buffer at it + 2)
    wg_fence_operands(dq);
    const int dcol = D == 128 ? wg * 64 : 0;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = m0 + warp * 16 + g + r * 8;
      if (i >= p.Lq) continue;
      float* row = dq_acc + static_cast<i64>(i) * p.D + dcol + 2 * t;
#pragma unroll
      for (int j = 0; j < 8; ++j) atomic_add2(row + 8 * j, dq[4 * j + 2 * r], dq[4 * j + 2 * r + 1]);
    }
  }

  T* dkp = reinterpret_cast<T*>(p.dk) + static_cast<i64>(bh) * p.Lk * p.D;
  T* dvp = reinterpret_cast<T*>(p.dv) + static_cast<i64>(bh) * p.Lk * p.Dv;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int j = n0 + krow + r * 8;
    if (j >= p.Lk) continue;
#pragma unroll
    for (int d = 0; d < D / 8; ++d) {
      const int col = d * 8 + 2 * t;
      *reinterpret_cast<unsigned*>(dkp + static_cast<i64>(j) * p.D + col) = pack2<T>(dk[4 * d + 2 * r] * p.scale, dk[4 * d + 2 * r + 1] * p.scale);
      *reinterpret_cast<unsigned*>(dvp + static_cast<i64>(j) * p.Dv + col) = pack2<T>(dv[4 * d + 2 * r], dv[4 * d + 2 * r + 1]);
    }
  }
#else
  asm volatile("trap;");  // sm_90a only; the host never launches it elsewhere
#endif
}

}  // namespace attn
}  // namespace flame

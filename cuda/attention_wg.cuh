// Attention forward on Hopper warpgroup tensor cores (sm_90a wgmma), FlashAttention-3 style (Shah et
// al., 2024) without warp specialisation: f16/bf16, head dim D = Dv of 64 or 128, no mask, no
// dropout, causal or not; the parameters and output contract of sdpa_fwd (attention.cuh), whose
// backward reads the same O and lse2.
//
// A block of two warpgroups (256 threads) takes 128 query rows of one (batch, head), 64 per
// warpgroup, and walks the key/value tiles of 128 keys: S = Q K^T by wgmma with Q and K from
// 128-byte-swizzled shared tiles (wgmma.cuh); causal and bounds masks and the online softmax in
// registers (a row's 128 scores live in one quad of lanes); P rounded to f16/bf16 straight from the
// S accumulators into A registers; O += P V by wgmma with V from shared memory (MN-major).
// Within a warpgroup the products overlap the softmax: iteration j issues S_j = Q K_j^T and then
// P_{j-1} V_{j-1}, waits for S_j only, computes its softmax while P_{j-1} V_{j-1} runs, and rescales
// O after that product is done. K and V tiles are double-buffered and copied by cp.async one
// iteration ahead. Shared memory: Q and two stages of K and V, 5 x 128 x D x 2 bytes (160 KB at
// D = 128), from a 1024-aligned base. The host takes this path for scale > 0 only (the row max is
// taken over unscaled scores).
#pragma once
#include "attention.cuh"
#include "wgmma.cuh"

namespace flame {
namespace attn {

template <int D>
struct WgFwdTile {
  static constexpr int kThreads = 256;  // two warpgroups of 64 query rows
  static constexpr int kBM = 128;       // query rows per block
  static constexpr int kBN = 128;       // keys per tile
  static constexpr int kTileBytes = 128 * D * 2;
  static constexpr int kSmemBytes = 5 * kTileBytes + 1024;  // Q, K x 2, V x 2, and slack to align to 1024
};

// Rows [r0, r0 + ROWS) of a row-major [L, D] matrix g (row stride rs, rows 16-byte aligned) into the
// 128-byte-swizzled shared tile at byte address s: column block b (64 wide) at s + b * ROWS * 128,
// row r at + r * 128 bytes, chunk c at chunk c ^ (r % 8). Rows >= L become zero.
template <class T, int ROWS, int D, int THREADS>
__device__ __forceinline__ void load_tile_sw128(unsigned s, const T* g, i64 rs, int r0, int L) {
  constexpr int CH = D / 8, ITERS = ROWS * CH / THREADS;
  static_assert(ROWS * CH % THREADS == 0, "whole rounds of 16-byte copies");
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int c = static_cast<int>(threadIdx.x) + it * THREADS, r = c / CH, ch = c % CH, row = r0 + r;
    const bool ok = row < L;
    const unsigned dst = s + (ch >> 3) * (ROWS * 128) + r * 128 + (((ch & 7) ^ (r & 7)) << 4);
    cp_async16(dst, ok ? g + row * rs + ch * 8 : g, ok ? 16 : 0);
  }
}

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

template <class T, int D>
__global__ void __launch_bounds__(256, 1) sdpa_fwd_wg(const Params p) {
  using Tile = WgFwdTile<D>;
  constexpr int BM = Tile::kBM, BN = Tile::kBN, TB = Tile::kTileBytes, THREADS = Tile::kThreads;
  constexpr int NS = BN / 2, NO = D / 2;  // accumulators per lane: S (64 x BN), O (64 x D)
  constexpr unsigned kBlock = 128 * 128;  // bytes of one 64-wide column block of a 128-row tile
  const unsigned base = (smem_u32(attn_smem) + 1023u) & ~1023u;
  const unsigned sQ = base, sK = base + TB, sV = base + 3 * TB;  // stage s of K / V at + s * TB

  const int mblocks = (p.Lq + BM - 1) / BM;
  const int bh = static_cast<int>(blockIdx.x / mblocks);  // as sdpa_fwd: one (batch, head) side by side,
  const int m0 = (mblocks - 1 - static_cast<int>(blockIdx.x % mblocks)) * BM;  // the longest rows first
  const int b = bh / p.H, h = bh % p.H;
  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wrow0 = m0 + wg * 64;               // the warpgroup's first query row
  const int row0 = wrow0 + warp * 16 + g;       // this lane's rows: row0 and row0 + 8
  const T* q = reinterpret_cast<const T*>(p.q) + b * p.q_sb + h * p.q_sh;
  const T* k = reinterpret_cast<const T*>(p.k) + b * p.k_sb + h * p.k_sh;
  const T* v = reinterpret_cast<const T*>(p.v) + b * p.v_sb + h * p.v_sh;

  const int n_end = p.causal ? min(p.Lk, m0 + BM) : p.Lk;
  const int ntiles = (n_end + BN - 1) / BN;
  load_tile_sw128<T, 128, D, THREADS>(sQ, q, p.q_sl, m0, p.Lq);
  if (ntiles > 0) load_tile_sw128<T, 128, D, THREADS>(sK, k, p.k_sl, 0, p.Lk);
  cp_async_commit();

  const float c = p.scale_log2;  // > 0 (the host's condition): max of scaled scores = c * max of raw ones
  float o[NO], m_i[2] = {neg_inf(), neg_inf()}, l_i[2] = {0.f, 0.f};
  float alpha[2] = {1.f, 1.f};  // exp2(m_{j-1} - m_j) of the last softmax: O's rescale before P_j V_j
#pragma unroll
  for (int i = 0; i < NO; ++i) o[i] = 0.f;
  unsigned pa[BN / 16][4];  // P of the previous tile as A registers (columns 16 kk .. 16 kk + 15)

  // Tile j: K_j was loaded in iteration j - 1 (stage j % 2), V_j is loaded in iteration j and used in
  // iteration j + 1, whose product P_j V_j runs on the tensor cores while the softmax of S_{j+1} runs
  // on the other units. A stage is refilled only after the barrier that follows its last product.
  for (int nb = 0; nb < ntiles; ++nb) {
    const int n0 = nb * BN;
    const unsigned cur = static_cast<unsigned>(nb & 1) * TB, prev = TB - cur;
    cp_async_wait<0>();
    fence_proxy_async_shared();  // this thread's cp.async writes, visible to wgmma's reads
    __syncthreads();             // K_j and V_{j-1} have landed; S_{j-1} and P_{j-2} V_{j-2} are done
    if (nb + 1 < ntiles) load_tile_sw128<T, 128, D, THREADS>(sK + prev, k, p.k_sl, n0 + BN, p.Lk);
    load_tile_sw128<T, 128, D, THREADS>(sV + cur, v, p.v_sl, n0, p.Lk);
    cp_async_commit();

    // O = alpha_{j-1} O + P_{j-1} V_{j-1}: the rescale comes before both products are issued (no wgmma in
    // flight), so that nothing after the softmax below touches O; ptxas would otherwise pull the wait for
    // P V up into the softmax to interleave the rescale with it.
    rescale_o(o, alpha);
    // S = Q K^T (D / 16 products of k16), then O += P_{j-1} V_{j-1} behind it.
    float s[NS];
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const unsigned off = (ks >> 2) * kBlock + (ks & 3) * 32;
      wgmma_ss_n128<T>(s, wg_desc(sQ + wg * 64 * 128 + off, 16, 1024), wg_desc(sK + cur + off, 16, 1024), ks > 0);
    }
    wg_commit();
    if (nb > 0) {
      pv_product<T, D, BN>(o, pa, sV + prev);
      wg_commit();
    }
    if (nb > 0) wg_wait<1>();  // S is done; P_{j-1} V_{j-1} may still run
    else wg_wait<0>();
    wg_fence_operands(s);

    if (n0 + BN > p.Lk || (p.causal && n0 + BN - 1 > wrow0)) {
#pragma unroll
      for (int i = 0; i < NS; ++i)
        if (out_of_bounds(p, row0 + ((i >> 1) & 1) * 8, n0 + (i >> 2) * 8 + 2 * t + (i & 1))) s[i] = neg_inf();
    }
    // Online softmax in the log2 domain, exp2(c s - c m) as one FMA and one MUFU op per score; a
    // row's columns live in the quad of lanes 4g .. 4g + 3.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mp[4] = {neg_inf(), neg_inf(), neg_inf(), neg_inf()};  // 4 independent chains (latency)
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) mp[j & 3] = fmaxf(mp[j & 3], fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
      float mx = fmaxf(fmaxf(mp[0], mp[1]), fmaxf(mp[2], mp[3]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m_i[r], mx * c);
      const float mb = m_new == neg_inf() ? 0.f : m_new;  // all masked so far: exp2(-inf - 0) = 0, no NaN
      alpha[r] = fast_exp2(m_i[r] - mb);
      m_i[r] = m_new;
      float sp[4] = {0.f, 0.f, 0.f, 0.f};  // this lane's part of the row sum; the quad adds them at the end
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float x = fast_exp2(fmaf(s[4 * j + 2 * r + e], c, -mb));
          s[4 * j + 2 * r + e] = x;
          sp[(2 * j + e) & 3] += x;
        }
      l_i[r] = l_i[r] * alpha[r] + ((sp[0] + sp[1]) + (sp[2] + sp[3]));
    }
    wg_barrier_after(l_i[0] + l_i[1], wg);
    wg_wait<0>();  // P_{j-1} V_{j-1} is in O: now the P registers may change
    wg_fence_operands(o);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
      for (int e = 0; e < 4; ++e) pa[kk][e] = pack2<T>(s[8 * kk + 2 * e], s[8 * kk + 2 * e + 1]);
  }
  if (ntiles > 0) {  // the last tile's P V
    cp_async_wait<0>();
    fence_proxy_async_shared();
    __syncthreads();
    rescale_o(o, alpha);
    pv_product<T, D, BN>(o, pa, sV + static_cast<unsigned>((ntiles - 1) & 1) * TB);
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
}

// ---------------------------------------------------------------- backward

// Backward of sdpa_fwd / sdpa_fwd_wg on the same conditions, after sdpa_bwd_delta (delta = rowsum(dO O))
// and before sdpa_bwd_dq (dq = scale dq_acc), as sdpa_bwd: a block of two warpgroups takes 128 keys
// of one (batch, head), 64 per warpgroup, with K and V resident in shared memory, and walks the query
// tiles of 64 (Q, dO, lse2 and delta in 3 stages, copied by cp.async two tiles ahead; P = 0 for rows past Lq). Per tile
// and warpgroup:
//   S^T = K Q^T and dP^T = V dO^T by wgmma (A = its 64 keys, B = the 64 queries, both K-major);
//   P^T = exp2(scale log2(e) S^T - lse2), dS^T = P^T (dP^T - delta), in the accumulator registers;
//   dV += P^T dO and dK += dS^T Q by wgmma with P^T / dS^T as A registers and dO / Q MN-major;
//   dS^T also goes to shared memory ([128 keys][64 queries], swizzled), and after a block barrier
//   dQ = dS K by wgmma with both operands MN-major: at D = 128 warpgroup w takes head dims
//   64 w .. 64 w + 63 over all 128 keys, at D = 64 all head dims over its own 64 keys; the result is
//   added into dq_acc (f32) by vector reductions.
// dK (times scale) and dV are stored at the end. Shared memory: K, V (128 x D), Q and dO (64 x D)
// twice, dS^T (16 KB), lse2 and delta twice, from a 1024-aligned base.
template <int D>
struct WgBwdTile {
  static constexpr int kThreads = 256;
  static constexpr int kBN = 128;  // keys per block
  static constexpr int kBM = 64;   // queries per tile
  static constexpr int kKvBytes = 128 * D * 2, kQBytes = 64 * D * 2, kDsBytes = 128 * 64 * 2;
  static constexpr int kStages = 3;  // query tiles in flight: the one in use and the next two
  static constexpr int kSmemBytes = 2 * kKvBytes + 2 * kStages * kQBytes + kDsBytes + 2 * kStages * 64 * 4 + 1024;
};

template <class T, int D>
__global__ void __launch_bounds__(256, 1) sdpa_bwd_wg(const Params p) {
  using Tile = WgBwdTile<D>;
  constexpr int BN = Tile::kBN, BM = Tile::kBM, THREADS = Tile::kThreads;
  constexpr int KVB = Tile::kKvBytes, QB = Tile::kQBytes;
  constexpr unsigned kKvBlock = 128 * 128, kQBlock = 64 * 128;  // bytes of one 64-wide column block
  const unsigned base = (smem_u32(attn_smem) + 1023u) & ~1023u;
  constexpr int NST = Tile::kStages;
  const unsigned sK = base, sV = sK + KVB, sQ = sV + KVB, sdO = sQ + NST * QB, sdS = sdO + NST * QB;  // Q, dO: stages
  float* sL = reinterpret_cast<float*>(attn_smem + (sdS + Tile::kDsBytes - smem_u32(attn_smem)));  // [NST][64]
  float* sDelta = sL + NST * BM;                                                                    // [NST][64]

  const int nblocks = (p.Lk + BN - 1) / BN;
  const int bh = static_cast<int>(blockIdx.x / nblocks);  // the key blocks of one (batch, head) side by side
  const int n0 = static_cast<int>(blockIdx.x % nblocks) * BN;
  const int b = bh / p.H, h = bh % p.H;
  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int krow = wg * 64 + warp * 16 + g;  // this lane's keys within the block: krow and krow + 8
  const BwdHead<T> hd = bwd_head<T>(p, b, h, bh);
  float* dq_acc = reinterpret_cast<float*>(p.dq_acc) + static_cast<i64>(bh) * p.Lq * p.D;

  auto load_query_tile = [&](int m0, int st) {  // Q, dO, lse2 and delta of queries m0 .. m0 + 63 into stage st
    load_tile_sw128<T, BM, D, THREADS>(sQ + st * QB, hd.q, p.q_sl, m0, p.Lq);
    load_tile_sw128<T, BM, D, THREADS>(sdO + st * QB, hd.dout, p.do_sl, m0, p.Lq);
    if (threadIdx.x < 2 * BM) {  // by cp.async too (no thread waits on a load here); rows past Lq read 0
      const int r = threadIdx.x & (BM - 1), in = m0 + r < p.Lq ? 4 : 0;
      const float* src = threadIdx.x < BM ? hd.lse : hd.delta;
      float* dst = (threadIdx.x < BM ? sL : sDelta) + st * BM + r;
      cp_async4(smem_u32(dst), in ? src + m0 + r : src, in);
    }
  };
  const int m_begin = p.causal ? (n0 / BM) * BM : 0;  // causal: queries i >= j >= n0
  load_tile_sw128<T, BN, D, THREADS>(sK, hd.k, p.k_sl, n0, p.Lk);
  load_tile_sw128<T, BN, D, THREADS>(sV, hd.v, p.v_sl, n0, p.Lk);
  if (m_begin < p.Lq) load_query_tile(m_begin, 0);
  cp_async_commit();
  if (m_begin + BM < p.Lq) load_query_tile(m_begin + BM, 1);
  cp_async_commit();  // one group per tile (empty past the end): cp_async_wait<1> below waits for tile it

  const float c = p.scale_log2;  // > 0 (the host's condition)
  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;

  for (int m0 = m_begin, it = 0; m0 < p.Lq; m0 += BM, ++it) {
    const int st = it % NST;
    const unsigned qs = sQ + st * QB, dos = sdO + st * QB;
    cp_async_wait<1>();  // tile it has landed (tile it + 1 may still be in flight)
    fence_proxy_async_shared();
    __syncthreads();  // ... for every thread; both warpgroups are done with the previous tile and dS^T
    if (m0 + 2 * BM < p.Lq) load_query_tile(m0 + 2 * BM, (it + 2) % NST);  // into the stage of tile it - 1
    cp_async_commit();

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
    wg_wait<0>();  // (ptxas hoists it above the exp2s; wg_barrier_after measured no faster here: the products are short)
    wg_fence_operands(dp);
    const float* Dl = sDelta + st * BM;
#pragma unroll
    for (int i = 0; i < 32; ++i) dp[i] = s[i] * (dp[i] - Dl[(i >> 2) * 8 + 2 * t + (i & 1)]);  // dS^T

    // P^T and dS^T as A registers (query columns 16 kk .. 16 kk + 15); dS^T also into shared memory.
    unsigned pp[BM / 16][4], pd[BM / 16][4];
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        pp[kk][e] = pack2<T>(s[8 * kk + 2 * e], s[8 * kk + 2 * e + 1]);
        pd[kk][e] = pack2<T>(dp[8 * kk + 2 * e], dp[8 * kk + 2 * e + 1]);
        const int row = krow + (e & 1) * 8, j = 2 * kk + (e >> 1);  // key row, 8-query chunk
        const unsigned addr = sdS + row * 128 + ((j ^ (row & 7)) << 4) + 4 * t;
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
    __syncthreads();             // dS^T of both warpgroups is complete
    wg_wait<0>();                // dV and dK are summed: the P^T / dS^T registers are free for dQ
    wg_fence_operands(dv);
    wg_fence_operands(dk);

    // dQ = dS K: A = dS^T tile read as [queries x keys] (MN-major), B = K (MN-major, head dims contiguous).
    // D = 128: this warpgroup's 64 head dims over all 128 keys; D = 64: all head dims over its own keys.
    float dq[32];
    constexpr int KSTEPS = D == 128 ? BN / 16 : 64 / 16;
    const unsigned key0 = D == 128 ? 0u : static_cast<unsigned>(wg) * 64u;
    const unsigned kcol = D == 128 ? static_cast<unsigned>(wg) * kKvBlock : 0u;
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
      const unsigned r = (key0 + kk * 16) * 128;
      wgmma_ss_n64<T, true>(dq, wg_desc(sdS + r, kQBlock, 1024), wg_desc(sK + kcol + r, kKvBlock, 1024), kk > 0);
    }
    wg_commit();
    wg_wait<0>();
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
  cp_async_wait<0>();

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
}

}  // namespace attn
}  // namespace flame

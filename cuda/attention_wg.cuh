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

// Rows [r0, r0 + 128) of a row-major [L, D] matrix g (row stride rs, rows 16-byte aligned) into the
// 128-byte-swizzled shared tile at byte address s: column block b (64 wide) at s + b * 16 KB, row r
// at + r * 128 bytes, chunk c at chunk c ^ (r % 8). Rows >= L become zero.
template <class T, int D, int THREADS>
__device__ __forceinline__ void load_tile_sw128(unsigned s, const T* g, i64 rs, int r0, int L) {
  constexpr int CH = D / 8, ROWS = 128, ITERS = ROWS * CH / THREADS;
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
    if constexpr (D == 128) wgmma_rs_n128<T>(o, pa[kk], dv, 1);
    else wgmma_rs_n64<T>(o, pa[kk], dv, 1);
  }
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
  load_tile_sw128<T, D, THREADS>(sQ, q, p.q_sl, m0, p.Lq);
  if (ntiles > 0) load_tile_sw128<T, D, THREADS>(sK, k, p.k_sl, 0, p.Lk);
  cp_async_commit();

  const float c = p.scale_log2;  // > 0 (the host's condition): max of scaled scores = c * max of raw ones
  float o[NO], m_i[2] = {neg_inf(), neg_inf()}, l_i[2] = {0.f, 0.f};
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
    if (nb + 1 < ntiles) load_tile_sw128<T, D, THREADS>(sK + prev, k, p.k_sl, n0 + BN, p.Lk);
    load_tile_sw128<T, D, THREADS>(sV + cur, v, p.v_sl, n0, p.Lk);
    cp_async_commit();

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
    float alpha[2];
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
    wg_wait<0>();  // P_{j-1} V_{j-1} is in O: now O and the P registers may change
    wg_fence_operands(o);
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[4 * j + e] *= alpha[e >> 1];
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
      for (int e = 0; e < 4; ++e) pa[kk][e] = pack2<T>(s[8 * kk + 2 * e], s[8 * kk + 2 * e + 1]);
  }
  if (ntiles > 0) {  // the last tile's P V
    cp_async_wait<0>();
    fence_proxy_async_shared();
    __syncthreads();
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

}  // namespace attn
}  // namespace flame

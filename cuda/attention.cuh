// Scaled-dot-product attention for f16/bf16 on tensor cores, FlashAttention-2 style (Dao, 2023):
// the [Lq, Lk] score matrix never leaves the chip.
//
// Forward (sdpa_fwd): a block of 4 warps takes 128 query rows of one (batch, head), 32 per warp, and
// walks the key/value tiles of 64 keys in order: S = Q K^T with mma.sync m16n8k16 (f32
// accumulators), scale and masks in the log2 domain, online softmax (running max m and sum l per
// row), P rounded to f16/bf16 straight from the accumulator registers into A fragments, O += P V.
// It writes O and, per row, lse2 = m + log2(l) (base 2, f32; +inf for a row with no key left,
// whose output is 0). K and V tiles arrive by cp.async while the other product runs (V during
// Q K^T, the next K during P V).
//
// Backward: sdpa_bwd_delta computes delta = rowsum(dO * O) and clears dq_acc; sdpa_bwd gives a block
// 64 keys (16 per warp) and walks the query tiles of 64: it recomputes S^T = K Q^T and P^T = exp2(S^T - lse2) and
// forms dP^T = V dO^T, dS^T = P^T (dP^T - delta), then dV += P^T dO and dK += dS^T Q in registers.
// dQ += dS K is summed over key blocks with f32 atomics into dq_acc (dS^T goes through shared memory
// for it), and sdpa_bwd_dq scales and rounds dq_acc at the end. With a mask gradient requested,
// dS is also written to an f32 [B, H, Lq, Lk] buffer.
//
// Head dims: the tile width D is 64, 80, 96 or 128; smaller (and odd) head dims are zero-padded
// into the tile (zero columns add nothing to Q K^T, and output columns past Dv are not stored).
// Shared rows are padded by 16 bytes, so the 8 row addresses of an ldmatrix hit distinct banks.
// Shared memory is addressed as 32-bit offsets from one base (per-lane base plus compile-time
// offsets), which keeps the unrolled ldmatrix addresses out of registers.
// Masks: causal (key j > query i masked, top-left aligned), a bool mask (true = attend) or an
// additive mask of the input dtype, read with any strides (0 for broadcast dims) into a shared
// tile of additive terms (0 / -inf for bool) per block step, so that the score loop only adds.
// Dropout keeps element (b, h, i, j) when Philox word (j % 4) of counter
// offset + (bh Lq + i) ceil(Lk / 4) + j / 4, shifted right by 8, is >= drop_threshold: the same
// decision in forward, backward and sdpa_dropout_keep (the composed path's mask), for a given
// seed and offset.
#pragma once
#include "common.cuh"
#include "mma.cuh"
#include "random.cuh"

namespace flame {
namespace attn {

struct Params {  // mirrors AttnParams in src/ops/attention.cpp: 8-byte fields first
  u64 q, k, v, o, lse, mask;                  // device addresses; o contiguous [B, H, Lq, Dv]
  u64 dout, dq, dk, dv, dq_acc, delta, ds;    // backward (dq, dk, dv contiguous; dq_acc, ds f32)
  i64 q_sb, q_sh, q_sl, k_sb, k_sh, k_sl, v_sb, v_sh, v_sl, do_sb, do_sh, do_sl;  // element strides
  i64 m_sb, m_sh, m_si, m_sj;                 // mask strides (0 for broadcast dims)
  u64 seed, offset;                           // Philox key and first counter (dropout)
  int B, H, Lq, Lk, D, Dv;
  int mask_kind;                              // 0 none, 1 bool, 2 additive (the inputs' dtype)
  int causal, vec;                            // vec: 16-byte loads (see load_tile)
  unsigned drop_threshold;                    // keep when (Philox word >> 8) >= this
  float scale, scale_log2, drop_scale;        // scale, scale * log2(e), 1 / (1 - p)
  int pad;
};

extern __shared__ __align__(16) unsigned char attn_smem[];

__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000); }
__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }

// ---------------------------------------------------------------- masks and dropout

// The mask of (b, h) as bytes; elements are then bytes (bool) or T (additive) at i * m_si + j * m_sj.
template <class T>
__device__ __forceinline__ const unsigned char* mask_base(const Params& p, int b, int h) {
  const i64 off = b * p.m_sb + h * p.m_sh;
  if (p.mask_kind == 2) return reinterpret_cast<const unsigned char*>(reinterpret_cast<const T*>(p.mask) + off);
  return reinterpret_cast<const unsigned char*>(p.mask) + off;
}

// The additive terms of the mask for rows [r0, r0 + ROWS) and keys [c0, c0 + COLS) into a shared
// [ROWS][PITCH] tile of T: the additive mask, or 0 / -inf for a bool mask; 0 outside [Lq, Lk).
template <class T, int ROWS, int COLS, int PITCH, int THREADS>
__device__ __forceinline__ void load_mask_tile(T* s, const Params& p, const unsigned char* mb, int r0, int c0) {
  const T zero = T{}, ninf = cast<T>(neg_inf());
  for (int e = threadIdx.x; e < ROWS * COLS; e += THREADS) {
    const int r = e / COLS, c = e % COLS, i = r0 + r, j = c0 + c;
    T x = zero;
    if (i < p.Lq && j < p.Lk) {
      const i64 off = i * p.m_si + j * p.m_sj;
      if (p.mask_kind == 1) x = mb[off] ? zero : ninf;
      else x = reinterpret_cast<const T*>(mb)[off];
    }
    s[r * PITCH + c] = x;
  }
}

// True where (i, j) takes no part whatever the mask says: keys past Lk, above the causal diagonal.
__device__ __forceinline__ bool out_of_bounds(const Params& p, int i, int j) { return j >= p.Lk || (p.causal && j > i); }

// The four Philox words that decide keys (j & ~3) .. (j & ~3) + 3 of query row i of bh.
__device__ __forceinline__ u32x4 drop_bits(const Params& p, int bh, int i, int j) {
  const u64 quads = static_cast<u64>((p.Lk + 3) >> 2);
  const u64 row = static_cast<u64>(bh) * static_cast<u64>(p.Lq) + static_cast<u64>(i);
  return philox(p.seed, p.offset + row * quads + static_cast<u64>(j >> 2));
}
__device__ __forceinline__ bool drop_keep(const Params& p, const u32x4& r, int j) {
  return (word(r, j & 3) >> 8) >= p.drop_threshold;
}

// ---------------------------------------------------------------- tiles

// Rows [r0, r0 + ROWS) of a row-major [L, cols] matrix g (row stride rs, unit column stride) into
// shared rows of PITCH elements, columns [0, DP); rows >= L and columns >= cols become zero.
// vec: 16-byte cp.async (cols, rs and g's address are multiples of 8 elements); else plain copies.
template <class T, int ROWS, int DP, int PITCH, int THREADS>
__device__ __forceinline__ void load_tile(T* s, const T* g, i64 rs, int r0, int L, int cols, bool vec) {
  const int tid = threadIdx.x;
  if (vec) {
    constexpr int CH = DP / 8;
    const unsigned su = smem_u32(s);
#pragma unroll 4
    for (int c = tid; c < ROWS * CH; c += THREADS) {
      const int r = c / CH, col = (c % CH) * 8, row = r0 + r;
      const bool ok = row < L && col < cols;
      cp_async16(su + static_cast<unsigned>((r * PITCH + col) * 2), ok ? g + row * rs + col : g, ok ? 16 : 0);
    }
  } else {
    for (int e = tid; e < ROWS * DP; e += THREADS) {
      const int r = e / DP, col = e % DP, row = r0 + r;
      s[r * PITCH + col] = (row < L && col < cols) ? g[row * rs + col] : T{};
    }
  }
}

// Stores two adjacent values of a row of n elements (columns col, col + 1; col even), skipping
// columns >= n; one 4-byte store when n is even (then the pair is aligned).
template <class T>
__device__ __forceinline__ void store_pair(T* row, int col, int n, float a, float b) {
  if ((n & 1) == 0 && col + 1 < n) {
    *reinterpret_cast<unsigned*>(row + col) = pack2<T>(a, b);
  } else {
    if (col < n) row[col] = cast<T>(a);
    if (col + 1 < n) row[col + 1] = cast<T>(b);
  }
}

// ---------------------------------------------------------------- forward

template <int D>
struct FwdTile {
  static constexpr int kThreads = 128;  // 4 warps, 32 query rows each (two m16 tiles)
  static constexpr int kBM = 128;
  static constexpr int kBN = 64;
  static constexpr int kPitch = D + 8;
  static constexpr int kMPitch = kBN + 8;  // rows of the mask tile
  static constexpr int kSmemBytes = (kBM + 2 * kBN) * kPitch * 2;
  static constexpr int kMaskBytes = kBM * kMPitch * 2;  // after the above, only with a mask
};

template <class T, int D, bool DROPOUT>
__global__ void __launch_bounds__(128) sdpa_fwd(const Params p) {
  using Tile = FwdTile<D>;
  constexpr int BM = Tile::kBM, BN = Tile::kBN, PITCH = Tile::kPitch, MP = Tile::kMPitch, THREADS = Tile::kThreads;
  constexpr int MT = 2, NT = BN / 8, DT = D / 8, KT = D / 16;
  T* sQ = reinterpret_cast<T*>(attn_smem);
  T* sK = sQ + BM * PITCH;
  T* sV = sK + BN * PITCH;
  T* sM = sV + BN * PITCH;

  const int mblocks = (p.Lq + BM - 1) / BM;
  // The blocks of one (batch, head) run side by side, so its K and V are read from DRAM about once
  // and then from L2; within it the longest (causal) rows first.
  const int bh = static_cast<int>(blockIdx.x / mblocks);
  const int m0 = (mblocks - 1 - static_cast<int>(blockIdx.x % mblocks)) * BM;
  const int b = bh / p.H, h = bh % p.H;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wrow = warp * 32;
  const bool vec = p.vec != 0;
  const T* q = reinterpret_cast<const T*>(p.q) + b * p.q_sb + h * p.q_sh;
  const T* k = reinterpret_cast<const T*>(p.k) + b * p.k_sb + h * p.k_sh;
  const T* v = reinterpret_cast<const T*>(p.v) + b * p.v_sb + h * p.v_sh;
  const unsigned char* mb = mask_base<T>(p, b, h);
  // Shared byte addresses of this lane's ldmatrix rows: A from row-major [m][k] (Q); B from
  // row-major [n][k] (K: two n8 tiles per x4); B from row-major [k][n] with .trans (V: two n8 tiles).
  const unsigned smem = smem_u32(attn_smem);
  const unsigned q_lane = smem + 2 * (((wrow + (lane & 15)) * PITCH) + (lane >> 4) * 8);
  const unsigned k_lane = smem + 2 * (BM * PITCH + ((((lane >> 4) << 3) + (lane & 7)) * PITCH) + ((lane >> 3) & 1) * 8);
  const unsigned v_lane = smem + 2 * ((BM + BN) * PITCH + (((lane & 7) + (((lane >> 3) & 1) << 3)) * PITCH) + (lane >> 4) * 8);

  const int n_end = p.causal ? min(p.Lk, m0 + BM) : p.Lk;  // causal: keys j <= i < m0 + BM
  const int ntiles = (n_end + BN - 1) / BN;
  load_tile<T, BM, D, PITCH, THREADS>(sQ, q, p.q_sl, m0, p.Lq, p.D, vec);
  if (ntiles > 0) load_tile<T, BN, D, PITCH, THREADS>(sK, k, p.k_sl, 0, p.Lk, p.D, vec);
  cp_async_commit();

  float o[MT][DT][4], m_i[MT][2], l_i[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int d = 0; d < DT; ++d)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][d][e] = 0.f;
    m_i[mt][0] = m_i[mt][1] = neg_inf();
    l_i[mt][0] = l_i[mt][1] = 0.f;
  }

  for (int nb = 0; nb < ntiles; ++nb) {
    const int n0 = nb * BN;
    cp_async_wait<0>();
    __syncthreads();  // K (and Q) have landed; every warp is done with the previous V and mask tile
    load_tile<T, BN, D, PITCH, THREADS>(sV, v, p.v_sl, n0, p.Lk, p.Dv, vec);
    cp_async_commit();
    if (p.mask_kind != 0) load_mask_tile<T, BM, BN, MP, THREADS>(sM, p, mb, m0, n0);

    float s[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < KT; ++ks) {
      unsigned a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) ldsm_x4(q_lane + 2 * (mt * 16 * PITCH + ks * 16), a[mt][0], a[mt][1], a[mt][2], a[mt][3]);
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        unsigned b0, b1, b2, b3;
        ldsm_x4(k_lane + 2 * (np * 16 * PITCH + ks * 16), b0, b1, b2, b3);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma16816<T>(s[mt][2 * np], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b0, b1);
          mma16816<T>(s[mt][2 * np + 1], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b2, b3);
        }
      }
    }
    if (p.mask_kind != 0) __syncthreads();  // the mask tile is complete

    // Scores in the log2 domain; the mask and bounds passes run only when needed (uniform branches
    // around whole loops, so the common case pays nothing per element).
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] *= p.scale_log2;
    if (p.mask_kind != 0) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            s[mt][nt][e] += to_float(sM[(wrow + mt * 16 + g + (e >> 1) * 8) * MP + nt * 8 + 2 * t + (e & 1)]) * kLog2e;
    }
    if (n0 + BN > p.Lk || (p.causal && n0 + BN - 1 > m0)) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (out_of_bounds(p, m0 + wrow + mt * 16 + g + (e >> 1) * 8, n0 + nt * 8 + 2 * t + (e & 1))) s[mt][nt][e] = neg_inf();
    }

    // Online softmax over this tile, row by row (a row's columns live in the 4 lanes of a quad).
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = neg_inf();
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * r], s[mt][nt][2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m_i[mt][r], mx);
        const float base = m_new == neg_inf() ? 0.f : m_new;  // all masked so far: exp2(-inf - 0) = 0, no NaN
        const float alpha = fast_exp2(m_i[mt][r] - base);
        m_i[mt][r] = m_new;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const float e = fast_exp2(s[mt][nt][2 * r + c] - base);
            s[mt][nt][2 * r + c] = e;
            sum += e;  // this lane's part of the row sum; the quad adds them up at the end
          }
        l_i[mt][r] = l_i[mt][r] * alpha + sum;
#pragma unroll
        for (int d = 0; d < DT; ++d) {
          o[mt][d][2 * r] *= alpha;
          o[mt][d][2 * r + 1] *= alpha;
        }
      }
    }
    if constexpr (DROPOUT) {  // l keeps the undropped sum; only P V sees the dropped P / (1 - p)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          // The keep bits of this lane's 2 NT elements of the row, from a rolled loop (one Philox
          // call per pair: j even, so j and j + 1 share one), then applied with constant indices.
          const int i = m0 + wrow + mt * 16 + g + r * 8;
          unsigned keep = 0;
#pragma unroll 1
          for (int nt = 0; nt < NT; ++nt) {
            const int j = n0 + nt * 8 + 2 * t;
            if (i >= p.Lq || j >= p.Lk) continue;  // P is 0 there already
            const u32x4 bits = drop_bits(p, bh, i, j);
            keep |= (drop_keep(p, bits, j) ? 1u : 0u) << (2 * nt);
            keep |= (drop_keep(p, bits, j + 1) ? 1u : 0u) << (2 * nt + 1);
          }
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            s[mt][nt][2 * r] *= (keep >> (2 * nt)) & 1u ? p.drop_scale : 0.f;
            s[mt][nt][2 * r + 1] *= (keep >> (2 * nt + 1)) & 1u ? p.drop_scale : 0.f;
          }
        }
    }

    cp_async_wait<0>();
    __syncthreads();  // V has landed; every warp is done with K
    if (nb + 1 < ntiles) load_tile<T, BN, D, PITCH, THREADS>(sK, k, p.k_sl, n0 + BN, p.Lk, p.D, vec);
    cp_async_commit();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      unsigned a[MT][4];  // P as A fragments: the C layout of n-tiles 2kk and 2kk+1 is the A layout
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        a[mt][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        a[mt][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        a[mt][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        a[mt][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < DT / 2; ++dp) {
        unsigned b0, b1, b2, b3;
        ldsm_x4_trans(v_lane + 2 * (kk * 16 * PITCH + dp * 16), b0, b1, b2, b3);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma16816<T>(o[mt][2 * dp], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b0, b1);
          mma16816<T>(o[mt][2 * dp + 1], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b2, b3);
        }
      }
    }
  }
  cp_async_wait<0>();  // nothing is left in flight when the block exits

  float* lse = reinterpret_cast<float*>(p.lse) + static_cast<i64>(bh) * p.Lq;
  T* out = reinterpret_cast<T*>(p.o) + static_cast<i64>(bh) * p.Lq * p.Dv;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = l_i[mt][r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int i = m0 + wrow + mt * 16 + g + r * 8;
      if (i >= p.Lq) continue;
      const bool live = l > 0.f;  // else every key of the row was masked: output 0
      const float inv = live ? 1.f / l : 0.f;
      if (t == 0) lse[i] = live ? m_i[mt][r] + log2f(l) : pos_inf();
      T* row = out + static_cast<i64>(i) * p.Dv;
#pragma unroll
      for (int d = 0; d < DT; ++d) store_pair<T>(row, d * 8 + 2 * t, p.Dv, o[mt][d][2 * r] * inv, o[mt][d][2 * r + 1] * inv);
    }
}

// ---------------------------------------------------------------- backward

// delta[bh, i] = sum_c dO[b, h, i, c] O[b, h, i, c].
//  - p.vec (16-byte aligned rows, Dv a multiple of 8) and Dv / 8 a power of two up to 32 (Dv 64, 128):
//    Dv / 8 lanes per row, 16 bytes each, and two rows per lane group in flight (H200, 8x16x2048x128
//    bf16: 57 us with one 8-byte load per lane of one row per warp, a third of the bandwidth);
//  - other p.vec rows: one warp per row, 8 bytes per lane; else one element per lane.
template <class T>
__global__ void sdpa_bwd_delta(const Params p) {
  const int lane = threadIdx.x & 31;
  const i64 rows = static_cast<i64>(p.B) * p.H * p.Lq;
  const i64 warps = static_cast<i64>(gridDim.x) * (blockDim.x >> 5);
  const i64 warp = static_cast<i64>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  auto dout_row = [&](i64 r) {
    const int bh = static_cast<int>(r / p.Lq), i = static_cast<int>(r % p.Lq), b = bh / p.H, h = bh % p.H;
    return reinterpret_cast<const T*>(p.dout) + b * p.do_sb + h * p.do_sh + i * p.do_sl;
  };
  float* delta = reinterpret_cast<float*>(p.delta);
  // Also clears row r of dq_acc (lanes `lig` of `group` lanes), which the backward kernel that follows
  // sums into (instead of a memset of its own).
  auto clear_row = [&](i64 r, int lig, int group) {
    float* acc = reinterpret_cast<float*>(p.dq_acc) + r * p.D;
    if (p.D % 4 == 0) {
      for (int c = lig; c < p.D / 4; c += group) reinterpret_cast<float4*>(acc)[c] = make_float4(0.f, 0.f, 0.f, 0.f);
    } else {
      for (int c = lig; c < p.D; c += group) acc[c] = 0.f;
    }
  };
  const int lpr = p.Dv / 8;  // lanes per row of the grouped path
  if (p.vec && lpr <= 32 && (lpr & (lpr - 1)) == 0) {
    const int rpw = 32 / lpr, c = (lane % lpr) * 8;  // rows per warp and step, this lane's columns
    for (i64 r0 = warp * 2 * rpw; r0 < rows; r0 += warps * 2 * rpw) {
      Vec<T, 8> ov[2], dv[2];
      float acc[2] = {0.f, 0.f};
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const i64 r = r0 + u * rpw + lane / lpr;
        if (r < rows) {
          ov[u] = *reinterpret_cast<const Vec<T, 8>*>(reinterpret_cast<const T*>(p.o) + r * p.Dv + c);
          dv[u] = *reinterpret_cast<const Vec<T, 8>*>(dout_row(r) + c);
          clear_row(r, lane % lpr, lpr);
        }
      }
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const i64 r = r0 + u * rpw + lane / lpr;
        if (r < rows) {
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[u] += to_float(ov[u].v[e]) * to_float(dv[u].v[e]);
        }
        for (int off = lpr / 2; off > 0; off >>= 1) acc[u] += __shfl_xor_sync(0xffffffffu, acc[u], off);
        if (r < rows && lane % lpr == 0) delta[r] = acc[u];
      }
    }
    return;
  }
  for (i64 r = warp; r < rows; r += warps) {
    const T* o = reinterpret_cast<const T*>(p.o) + r * p.Dv;
    const T* d = dout_row(r);
    clear_row(r, lane, 32);
    float acc = 0.f;
    if (p.vec) {
      for (int c = 4 * lane; c < p.Dv; c += 128) {
        const Vec<T, 4> ov = *reinterpret_cast<const Vec<T, 4>*>(o + c), dv = *reinterpret_cast<const Vec<T, 4>*>(d + c);
#pragma unroll
        for (int e = 0; e < 4; ++e) acc += to_float(ov.v[e]) * to_float(dv.v[e]);
      }
    } else {
      for (int c = lane; c < p.Dv; c += 32) acc += to_float(o[c]) * to_float(d[c]);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) delta[r] = acc;
  }
}

// What the backward kernels read of (batch b, head h), bh = b H + h. (dq_acc stays in the kernels:
// formed here, its offset changed how sdpa_bwd's dQ atomics are addressed, and its registers.)
template <class T>
struct BwdHead {
  const T *q, *k, *v, *dout;  // row i at i * p.q_sl (k_sl, v_sl, do_sl)
  const float *lse, *delta;   // [Lq]: lse2 and delta of each query row
};
template <class T>
__device__ __forceinline__ BwdHead<T> bwd_head(const Params& p, int b, int h, int bh) {
  return {reinterpret_cast<const T*>(p.q) + b * p.q_sb + h * p.q_sh,
          reinterpret_cast<const T*>(p.k) + b * p.k_sb + h * p.k_sh,
          reinterpret_cast<const T*>(p.v) + b * p.v_sb + h * p.v_sh,
          reinterpret_cast<const T*>(p.dout) + b * p.do_sb + h * p.do_sh,
          reinterpret_cast<const float*>(p.lse) + static_cast<i64>(bh) * p.Lq,
          reinterpret_cast<const float*>(p.delta) + static_cast<i64>(bh) * p.Lq};
}

template <int D>
struct BwdTile {
  static constexpr int kThreads = 128;  // 4 warps, 16 keys each
  static constexpr int kBN = 64;        // keys per block
  static constexpr int kBM = 64;        // queries per step
  static constexpr int kPitch = D + 8;
  static constexpr int kSPitch = kBM + 8;  // rows of dS^T in shared memory
  static constexpr int kMPitch = kBN + 8;  // rows (queries) of the mask tile
  static constexpr int kSmemBytes = (2 * kBN + 2 * kBM) * kPitch * 2 + kBN * kSPitch * 2 + 2 * kBM * 4;
  static constexpr int kMaskBytes = kBM * kMPitch * 2;  // after the above, only with a mask
};

template <class T, int D, bool DROPOUT>
__global__ void __launch_bounds__(128) sdpa_bwd(const Params p) {
  using Tile = BwdTile<D>;
  constexpr int BN = Tile::kBN, BM = Tile::kBM, PITCH = Tile::kPitch, SP = Tile::kSPitch, MP = Tile::kMPitch;
  constexpr int THREADS = Tile::kThreads;
  constexpr int NT = BM / 8, DT = D / 8, KT = D / 16, KQ = BM / 16, KN = BN / 16;
  constexpr int DCH = DT <= 12 ? DT : 8;  // dQ n-tiles per pass (bounds the accumulator registers)
  T* sK = reinterpret_cast<T*>(attn_smem);
  T* sV = sK + BN * PITCH;
  T* sQ = sV + BN * PITCH;
  T* sdO = sQ + BM * PITCH;
  T* sdS = sdO + BM * PITCH;  // [BN keys][SP]: dS^T of the current query tile
  float* sL = reinterpret_cast<float*>(sdS + BN * SP);
  float* sDelta = sL + BM;
  T* sM = reinterpret_cast<T*>(sDelta + BM);  // [BM queries][MP]: additive mask terms

  // The key blocks of one (batch, head) run side by side: Q, dO and the dQ accumulator stay in L2.
  const int nblocks = (p.Lk + BN - 1) / BN;
  const int bh = static_cast<int>(blockIdx.x / nblocks);
  const int n0 = static_cast<int>(blockIdx.x % nblocks) * BN;
  const int b = bh / p.H, h = bh % p.H;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int krow = warp * 16;  // this warp's keys within the block
  const bool vec = p.vec != 0;
  const BwdHead<T> hd = bwd_head<T>(p, b, h, bh);
  float* dq_acc = reinterpret_cast<float*>(p.dq_acc) + static_cast<i64>(bh) * p.Lq * p.D;
  float* ds_out = p.ds ? reinterpret_cast<float*>(p.ds) + static_cast<i64>(bh) * p.Lq * p.Lk : nullptr;
  const unsigned char* mb = mask_base<T>(p, b, h);
  // Shared byte addresses of this lane's ldmatrix rows (see sdpa_fwd): A from K / V rows of this
  // warp; B from Q / dO rows ([n][k]); B with .trans from dO / Q / K ([k][n]); dS as an A operand
  // from its transpose with .trans (matrix m: queries 8 (m & 1) .. +7, keys 8 (m >> 1) .. +7).
  const unsigned smem = smem_u32(attn_smem);
  const unsigned sK_u = smem, sV_u = sK_u + 2 * BN * PITCH, sQ_u = sV_u + 2 * BN * PITCH, sdO_u = sQ_u + 2 * BM * PITCH;
  const unsigned sdS_u = sdO_u + 2 * BM * PITCH;
  const unsigned a_lane = 2 * ((krow + (lane & 15)) * PITCH + (lane >> 4) * 8);
  const unsigned b_lane = 2 * (((((lane >> 4) << 3) + (lane & 7))) * PITCH + ((lane >> 3) & 1) * 8);
  const unsigned t_lane = 2 * (((lane & 7) + (((lane >> 3) & 1) << 3)) * PITCH + (lane >> 4) * 8);
  const unsigned s_lane = sdS_u + 2 * (((lane & 7) + ((lane >> 4) << 3)) * SP + warp * 16 + ((lane >> 3) & 1) * 8);

  auto load_query_tile = [&](int m0) {  // Q, dO, the row statistics and the mask of queries m0 .. m0 + BM
    load_tile<T, BM, D, PITCH, THREADS>(sQ, hd.q, p.q_sl, m0, p.Lq, p.D, vec);
    load_tile<T, BM, D, PITCH, THREADS>(sdO, hd.dout, p.do_sl, m0, p.Lq, p.Dv, vec);
    for (int r = threadIdx.x; r < BM; r += THREADS) {
      const bool in = m0 + r < p.Lq;
      sL[r] = in ? hd.lse[m0 + r] : pos_inf();  // P = 0 for rows past Lq
      sDelta[r] = in ? hd.delta[m0 + r] : 0.f;
    }
    if (p.mask_kind != 0) load_mask_tile<T, BM, BN, MP, THREADS>(sM, p, mb, m0, n0);
  };

  const int m_begin = p.causal ? (n0 / BM) * BM : 0;  // causal: queries i >= j >= n0
  load_tile<T, BN, D, PITCH, THREADS>(sK, hd.k, p.k_sl, n0, p.Lk, p.D, vec);
  load_tile<T, BN, D, PITCH, THREADS>(sV, hd.v, p.v_sl, n0, p.Lk, p.Dv, vec);
  if (m_begin < p.Lq) load_query_tile(m_begin);
  cp_async_commit();

  float dk[DT][4], dv[DT][4];
#pragma unroll
  for (int d = 0; d < DT; ++d)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[d][e] = dv[d][e] = 0.f;

  for (int m0 = m_begin; m0 < p.Lq; m0 += BM) {
    cp_async_wait<0>();
    __syncthreads();  // this query tile has landed; every warp is done with the previous dS^T

    // S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys and the BM queries.
    float st[NT][4], dpt[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[nt][e] = dpt[nt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < KT; ++ks) {
      unsigned ka[4], va[4];
      ldsm_x4(sK_u + a_lane + 2 * ks * 16, ka[0], ka[1], ka[2], ka[3]);
      ldsm_x4(sV_u + a_lane + 2 * ks * 16, va[0], va[1], va[2], va[3]);
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        unsigned b0, b1, b2, b3;
        ldsm_x4(sQ_u + b_lane + 2 * (np * 16 * PITCH + ks * 16), b0, b1, b2, b3);
        mma16816<T>(st[2 * np], ka[0], ka[1], ka[2], ka[3], b0, b1);
        mma16816<T>(st[2 * np + 1], ka[0], ka[1], ka[2], ka[3], b2, b3);
        ldsm_x4(sdO_u + b_lane + 2 * (np * 16 * PITCH + ks * 16), b0, b1, b2, b3);
        mma16816<T>(dpt[2 * np], va[0], va[1], va[2], va[3], b0, b1);
        mma16816<T>(dpt[2 * np + 1], va[0], va[1], va[2], va[3], b2, b3);
      }
    }

    // P^T (dropped: st), dS^T (dpt). Element e of n-tile nt: key j, query i.
    unsigned keep = 0;  // bit 4 nt + e: element e of n-tile nt survives dropout (a rolled loop)
    if constexpr (DROPOUT) {
#pragma unroll 1
      for (int x = 0; x < 4 * NT; ++x) {
        const int j = n0 + krow + g + ((x & 3) >> 1) * 8, i = m0 + (x >> 2) * 8 + 2 * t + (x & 1);
        if (i < p.Lq && j < p.Lk && drop_keep(p, drop_bits(p, bh, i, j), j)) keep |= 1u << x;
      }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[nt][e] *= p.scale_log2;
    if (p.mask_kind != 0) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          st[nt][e] += to_float(sM[(nt * 8 + 2 * t + (e & 1)) * MP + krow + g + (e >> 1) * 8]) * kLog2e;
    }
    if (n0 + BN > p.Lk || (p.causal && n0 + BN - 1 > m0)) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (out_of_bounds(p, m0 + nt * 8 + 2 * t + (e & 1), n0 + krow + g + (e >> 1) * 8)) st[nt][e] = neg_inf();
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int il = nt * 8 + 2 * t + (e & 1), i = m0 + il, j = n0 + krow + g + (e >> 1) * 8;
        const float x = st[nt][e];
        const float pv = fast_exp2(x - sL[il]);
        float dp = dpt[nt][e], pd = pv;
        if constexpr (DROPOUT) {
          const float z = (keep >> (nt * 4 + e)) & 1u ? p.drop_scale : 0.f;
          pd = pv * z;
          dp *= z;
        }
        const float ds = pv * (dp - sDelta[il]);
        st[nt][e] = pd;
        dpt[nt][e] = ds;
        if (ds_out && i < p.Lq && j < p.Lk) ds_out[static_cast<i64>(i) * p.Lk + j] = ds;
      }

    // dV += P^T dO and dK += dS^T Q (keys x queries times queries x d); the accumulator layout of
    // query n-tiles 2kq, 2kq+1 is the A layout of k-step kq.
#pragma unroll
    for (int kq = 0; kq < KQ; ++kq) {
      const unsigned pa0 = pack2<T>(st[2 * kq][0], st[2 * kq][1]), pa1 = pack2<T>(st[2 * kq][2], st[2 * kq][3]);
      const unsigned pa2 = pack2<T>(st[2 * kq + 1][0], st[2 * kq + 1][1]), pa3 = pack2<T>(st[2 * kq + 1][2], st[2 * kq + 1][3]);
      const unsigned sa0 = pack2<T>(dpt[2 * kq][0], dpt[2 * kq][1]), sa1 = pack2<T>(dpt[2 * kq][2], dpt[2 * kq][3]);
      const unsigned sa2 = pack2<T>(dpt[2 * kq + 1][0], dpt[2 * kq + 1][1]), sa3 = pack2<T>(dpt[2 * kq + 1][2], dpt[2 * kq + 1][3]);
#pragma unroll
      for (int dp = 0; dp < DT / 2; ++dp) {
        unsigned b0, b1, b2, b3;
        ldsm_x4_trans(sdO_u + t_lane + 2 * (kq * 16 * PITCH + dp * 16), b0, b1, b2, b3);
        mma16816<T>(dv[2 * dp], pa0, pa1, pa2, pa3, b0, b1);
        mma16816<T>(dv[2 * dp + 1], pa0, pa1, pa2, pa3, b2, b3);
        ldsm_x4_trans(sQ_u + t_lane + 2 * (kq * 16 * PITCH + dp * 16), b0, b1, b2, b3);
        mma16816<T>(dk[2 * dp], sa0, sa1, sa2, sa3, b0, b1);
        mma16816<T>(dk[2 * dp + 1], sa0, sa1, sa2, sa3, b2, b3);
      }
    }

    // dS^T to shared memory for dQ.
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int col = nt * 8 + 2 * t;
      *reinterpret_cast<unsigned*>(sdS + (krow + g) * SP + col) = pack2<T>(dpt[nt][0], dpt[nt][1]);
      *reinterpret_cast<unsigned*>(sdS + (krow + g + 8) * SP + col) = pack2<T>(dpt[nt][2], dpt[nt][3]);
    }
    __syncthreads();  // dS^T is complete; Q, dO, the statistics and the mask tile are free for the next tile
    if (m0 + BM < p.Lq) load_query_tile(m0 + BM);
    cp_async_commit();

    // dQ[queries 16 warp .. +15] += dS K over this block's keys, into dq_acc with atomics.
    const int i0 = m0 + warp * 16 + g, i1 = i0 + 8;
#pragma unroll
    for (int dc = 0; dc < DT; dc += DCH) {
      float acc[DCH][4];
#pragma unroll
      for (int d = 0; d < DCH; ++d)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[d][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < KN; ++kk) {
        unsigned a0, a1, a2, a3;
        ldsm_x4_trans(s_lane + 2 * kk * 16 * SP, a0, a1, a2, a3);
#pragma unroll
        for (int dp = 0; dp < DCH / 2; ++dp) {
          unsigned b0, b1, b2, b3;
          ldsm_x4_trans(sK_u + t_lane + 2 * (kk * 16 * PITCH + (dc + 2 * dp) * 8), b0, b1, b2, b3);
          mma16816<T>(acc[2 * dp], a0, a1, a2, a3, b0, b1);
          mma16816<T>(acc[2 * dp + 1], a0, a1, a2, a3, b2, b3);
        }
      }
      const bool pairs = (p.D & 1) == 0;  // (col, col + 1) both in range and 8-byte aligned
#pragma unroll
      for (int d = 0; d < DCH; ++d) {
        const int col = (dc + d) * 8 + 2 * t;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int i = r ? i1 : i0;
          if (i >= p.Lq || col >= p.D) continue;
          float* dst = dq_acc + static_cast<i64>(i) * p.D + col;
          if (pairs) {
            atomic_add2(dst, acc[d][2 * r], acc[d][2 * r + 1]);
          } else {
            atomicAdd(dst, acc[d][2 * r]);
            if (col + 1 < p.D) atomicAdd(dst + 1, acc[d][2 * r + 1]);
          }
        }
      }
    }
  }
  cp_async_wait<0>();

  T* dkp = reinterpret_cast<T*>(p.dk) + static_cast<i64>(bh) * p.Lk * p.D;
  T* dvp = reinterpret_cast<T*>(p.dv) + static_cast<i64>(bh) * p.Lk * p.Dv;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int j = n0 + krow + g + r * 8;
    if (j >= p.Lk) continue;
#pragma unroll
    for (int d = 0; d < DT; ++d) {
      const int col = d * 8 + 2 * t;
      store_pair<T>(dkp + static_cast<i64>(j) * p.D, col, p.D, dk[d][2 * r] * p.scale, dk[d][2 * r + 1] * p.scale);
      store_pair<T>(dvp + static_cast<i64>(j) * p.Dv, col, p.Dv, dv[d][2 * r], dv[d][2 * r + 1]);
    }
  }
}

// dq = scale * dq_acc, rounded to T: 4 elements per thread and access when D is a multiple of 4
// (both buffers are fresh allocations, 16-byte aligned), else one.
template <class T>
__global__ void sdpa_bwd_dq(const Params p) {
  const i64 n = static_cast<i64>(p.B) * p.H * p.Lq * p.D;
  const float* acc = reinterpret_cast<const float*>(p.dq_acc);
  T* dq = reinterpret_cast<T*>(p.dq);
  const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x, first = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p.D % 4 == 0) {
    for (i64 e = first; e < n / 4; e += stride) {
      const float4 a = reinterpret_cast<const float4*>(acc)[e];
      Vec<T, 4> o;
      o.v[0] = cast<T>(a.x * p.scale);
      o.v[1] = cast<T>(a.y * p.scale);
      o.v[2] = cast<T>(a.z * p.scale);
      o.v[3] = cast<T>(a.w * p.scale);
      reinterpret_cast<Vec<T, 4>*>(dq)[e] = o;
    }
  } else {
    for (i64 e = first; e < n; e += stride) dq[e] = cast<T>(acc[e] * p.scale);
  }
}

// The dropout keep mask as a bool [B, H, Lq, Lk] tensor at `out` (for the composed path): one
// Philox call per four keys.
__global__ void sdpa_dropout_keep(const Params p, u64 out) {
  const int quads = (p.Lk + 3) >> 2;
  const i64 n = static_cast<i64>(p.B) * p.H * p.Lq * quads;
  bool* keep = reinterpret_cast<bool*>(out);
  for (i64 e = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 row = e / quads;  // bh * Lq + i
    const int j0 = static_cast<int>(e % quads) * 4;
    const int bh = static_cast<int>(row / p.Lq), i = static_cast<int>(row % p.Lq);
    const u32x4 bits = drop_bits(p, bh, i, j0);
    for (int c = 0; c < 4 && j0 + c < p.Lk; ++c) keep[row * p.Lk + j0 + c] = drop_keep(p, bits, j0 + c);
  }
}

}  // namespace attn
}  // namespace flame

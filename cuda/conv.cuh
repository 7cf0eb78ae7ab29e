// Convolution kernels (driven by src/ops/conv.cpp). Every tensor here is channels-last and dense
// (NHWC); the host converts NCHW tensors and rearranges the weight first.
//
// A convolution is three implicit GEMMs over one geometry (ConvParams), with no im2col buffer:
//  - MODE 0, forward: dst[m, n] = sum_k src[m, k] B[n, k] where m = (image, row, column) of the
//    output, k = (kernel row r, kernel column s, channel c) with c fastest, and src[m, k] the input
//    pixel under tap (r, s) (0 in the padding), gathered from the input as the tile is loaded;
//  - MODE 1, input gradient (and conv_transpose2d): the same with src = dy and the tap relation
//    inverted: destination row h takes tap r from source row (h + pad - r * dilation) / stride when
//    that divides exactly;
//  - weight gradient: dW[o, k] = sum_m dy[m, o] src[m, k] with MODE 0 taps, the sum over m split
//    across blocks (split-K) into partial sums in the compute type that the host adds up.
// Per group g the channels are g * Kc + [0, Kc) of the source and g * Nc + [0, Nc) of the
// destination. B is the weight rearranged into [G][Nc][kh][kw][Kc], so both operands of the first
// two GEMMs are K-major and one k-tile of a row is contiguous memory whenever Kc % 8 == 0.
//
// Kernels: conv_mma / conv_wgrad_mma (f16, bf16; sm_80+): tensor cores through mma.sync m16n8k16
// with f32 accumulation; 128x128x32 block tiles, 4 warps of 64x64, a 4-stage cp.async pipeline
// into padded shared memory read by ldmatrix (.trans for the weight gradient, whose tiles are
// stored with the reduction dim as rows); VEC = 16-byte cp.async gathers (zero-filled outside the
// image), else element loads. conv_simt / conv_wgrad_simt (f32, f64): FFMA over 128x128x8 (f32) or
// 64x64x16 (f64) tiles.
// conv_direct / conv_wgrad_direct (any dtype): one thread per output element, for groups with few
// output channels (depthwise) where a GEMM tile would be mostly empty.
#pragma once
#include "common.cuh"

namespace flame {

struct ConvParams {  // mirrors ConvLaunch in src/ops/conv.cpp
  int N, Hs, Ws, Cs;     // source (NHWC)
  int Hd, Wd, Cd;        // destination positions and channels (NHWC); M = N * Hd * Wd
  int kh, kw, sh, sw, ph, pw, dh, dw;
  int G, Kc, Nc, K;      // groups; per group: reduction channels, output channels; K = kh * kw * Kc
  int splits;            // weight gradient: blocks along the reduction over m
  long long M, m_chunk;  // weight gradient: rows of m per split (a multiple of every tile depth)
};

namespace conv {

constexpr int kTile = 128, kBK = 32, kStages = 4;
// 4 warps of 64x64 (2 x 2) per 128x128 tile: per 16-deep step a warp loads 4 + 4 fragments with
// ldmatrix for 32 mma, which keeps shared-memory traffic below the tensor cores' pace.
constexpr int kWarpsM = 2, kWarpsN = 2, kThreads = 32 * kWarpsM * kWarpsN;
constexpr int kWarpM = kTile / kWarpsM, kWarpN = kTile / kWarpsN, kMI = kWarpM / 16, kNI = kWarpN / 8;
constexpr int kPitch = kBK + 8;     // K-major tiles: 80-byte rows put 8 ldmatrix rows on distinct banks
constexpr int kWPitch = kTile + 8;  // reduction-major tiles (weight gradient) and the epilogue tile

struct Pos {
  int n, p, q;
};
__device__ __forceinline__ Pos decompose(long long m, int Hd, int Wd) {
  Pos d;
  const long long t = m / Wd;
  d.q = static_cast<int>(m - t * Wd);
  d.n = static_cast<int>(t / Hd);
  d.p = static_cast<int>(t - static_cast<long long>(d.n) * Hd);
  return d;
}
// Moves a position `step` rows of m forward.
__device__ __forceinline__ void advance_pos(Pos& d, int step, const ConvParams& P) {
  d.q += step;
  while (d.q >= P.Wd) {
    d.q -= P.Wd;
    if (++d.p == P.Hd) {
      d.p = 0;
      ++d.n;
    }
  }
}

struct Tap {
  int r, s, c;  // kernel row, kernel column, channel within the group; r >= kh once k >= K
};
__device__ __forceinline__ Tap tap_of(int k, const ConvParams& P) {
  Tap t;
  const int rs = k / P.Kc;
  t.c = k - rs * P.Kc;
  t.r = rs / P.kw;
  t.s = rs - t.r * P.kw;
  return t;
}
__device__ __forceinline__ void advance(Tap& t, int step, const ConvParams& P) {
  t.c += step;
  while (t.c >= P.Kc) {
    t.c -= P.Kc;
    if (++t.s == P.kw) {
      t.s = 0;
      ++t.r;
    }
  }
}

// The source pixel (ps, qs) that tap (r, s) reads for destination position (p, q); false in the
// padding and, for MODE 1, where no source position maps onto (p, q) through that tap.
template <int MODE>
__device__ __forceinline__ bool tap_source(const ConvParams& P, int p, int q, int r, int s, int* ps, int* qs) {
  if constexpr (MODE == 0) {
    const int y = p * P.sh - P.ph + r * P.dh, x = q * P.sw - P.pw + s * P.dw;
    *ps = y;
    *qs = x;
    return y >= 0 && y < P.Hs && x >= 0 && x < P.Ws;
  } else {
    const int ty = p + P.ph - r * P.dh, tx = q + P.pw - s * P.dw;
    if (ty < 0 || tx < 0) return false;
    const int y = ty / P.sh, x = tx / P.sw;
    *ps = y;
    *qs = x;
    return y * P.sh == ty && x * P.sw == tx && y < P.Hs && x < P.Ws;
  }
}
// Element offset of pixel (n, y, x) of an NHWC tensor with H x W pixels of C channels.
__device__ __forceinline__ long long pixel(int n, int y, int x, int H, int W, int C) {
  return ((static_cast<long long>(n) * H + y) * W + x) * C;
}

// ---- tensor-core primitives (inline PTX, sm_80+) ----
__device__ __forceinline__ unsigned smem_u32(const void* p) {
  unsigned a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}
// 16 bytes global -> shared, asynchronously; zero-filled (nothing read) when !pred.
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool pred) {
  const int bytes = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// Four 8x8 matrices of 16-bit elements; lanes 8i..8i+7 give the row addresses of matrix i, and
// register i of lane l holds row l/4, columns 2(l%4), 2(l%4)+1 of matrix i (of its transpose with .trans).
__device__ __forceinline__ void ldsm_x4(unsigned addr, unsigned (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(unsigned addr, unsigned (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
// d (16x8, f32) += a (16x16, row-major) * b (16x8, column-major). Fragments (PTX ISA, mma.m16n8k16):
// with g = lane / 4, t = lane % 4: a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..], a[2] = A[g][2t+8..],
// a[3] = A[g+8][2t+8..]; b[0] = B[2t..2t+1][g], b[1] = B[2t+8..2t+9][g]; d[0..1] = D[g][2t..2t+1],
// d[2..3] = D[g+8][2t..2t+1].
template <class T> struct MmaKind;
template <> struct MmaKind<half_t> { static constexpr bool bf16 = false; };
template <> struct MmaKind<bf16_t> { static constexpr bool bf16 = true; };
template <class T>
__device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  if constexpr (MmaKind<T>::bf16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}
struct alignas(16) U4 {
  unsigned x, y, z, w;
};

}  // namespace conv

// ============================== tensor cores: forward and input gradient ==============================
// Grid: x = M tiles, y = groups * Nc tiles; kThreads threads; dynamic shared memory
// kStages * 2 * kTile * kPitch * 2 bytes (81920: two blocks fit an SM of sm_80 / sm_90).
template <class T, int MODE, bool VEC>
__global__ void __launch_bounds__(conv::kThreads, 2) conv_mma(ConvParams P, const T* __restrict__ src, const T* __restrict__ wb,
                                                              const T* __restrict__ bias, T* __restrict__ dst) {
  using namespace conv;
  extern __shared__ __align__(16) unsigned char conv_smem[];
  unsigned short* As = reinterpret_cast<unsigned short*>(conv_smem);  // [kStages][kTile rows m][kPitch]
  unsigned short* Bs = As + kStages * kTile * kPitch;                 // [kStages][kTile rows n][kPitch]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n_tiles = (P.Nc + kTile - 1) / kTile;
  const int g = blockIdx.y / n_tiles, n0 = (blockIdx.y - g * n_tiles) * kTile;
  const long long m0 = static_cast<long long>(blockIdx.x) * kTile;
  const int KT = (P.K + kBK - 1) / kBK;
  const unsigned short* srcg = reinterpret_cast<const unsigned short*>(src) + static_cast<long long>(g) * P.Kc;
  const unsigned short* wbg = reinterpret_cast<const unsigned short*>(wb) + (static_cast<long long>(g) * P.Nc + n0) * P.K;

  // Loader. VEC: 16-byte chunk lc (of kBK / 8 per row) of rows lr + i * kVecRowStep of both tiles;
  // element loads: the kBK / kTpr elements from lc * kSeg of row lr.
  constexpr int kChunksPerRow = kBK / 8, kVecRowStep = kThreads / kChunksPerRow;
  constexpr int kTpr = kThreads / kTile, kSeg = kBK / kTpr;  // element loads: threads per row, elements each
  constexpr int RPT = VEC ? kTile / kVecRowStep : 1;
  const int lr = VEC ? tid / kChunksPerRow : tid / kTpr, lc = VEC ? tid % kChunksPerRow : tid % kTpr;
  const int kseg = VEC ? 8 : kSeg;
  Pos pos[RPT];
  bool mrow[RPT], nrow[RPT];
#pragma unroll
  for (int i = 0; i < RPT; ++i) {
    const long long m = m0 + lr + i * kVecRowStep;
    mrow[i] = m < P.M;
    pos[i] = decompose(mrow[i] ? m : 0, P.Hd, P.Wd);
    nrow[i] = n0 + lr + i * kVecRowStep < P.Nc;
  }
  Tap tp = tap_of(lc * kseg, P);  // tap of this thread's first k in the next tile to load
  int kload = lc * kseg;

  auto load_tile = [&](int stage) {
    unsigned short* as = As + stage * kTile * kPitch;
    unsigned short* bs = Bs + stage * kTile * kPitch;
    if constexpr (VEC) {
#pragma unroll
      for (int i = 0; i < RPT; ++i) {
        const int row = lr + i * kVecRowStep;
        int ps = 0, qs = 0;
        const bool ok = mrow[i] && tp.r < P.kh && tap_source<MODE>(P, pos[i].p, pos[i].q, tp.r, tp.s, &ps, &qs);
        const unsigned short* a = ok ? srcg + pixel(pos[i].n, ps, qs, P.Hs, P.Ws, P.Cs) + tp.c : srcg;
        cp_async16(smem_u32(as + row * kPitch + lc * 8), a, ok);
        const bool bok = nrow[i] && kload < P.K;
        const unsigned short* b = bok ? wbg + static_cast<long long>(row) * P.K + kload : wbg;
        cp_async16(smem_u32(bs + row * kPitch + lc * 8), b, bok);
      }
    } else {
      Tap t = tp;
      const unsigned short* brow = wbg + static_cast<long long>(lr) * P.K;
#pragma unroll 4
      for (int j = 0; j < kSeg; ++j) {
        unsigned short av = 0, bv = 0;
        int ps = 0, qs = 0;
        if (mrow[0] && t.r < P.kh && tap_source<MODE>(P, pos[0].p, pos[0].q, t.r, t.s, &ps, &qs))
          av = srcg[pixel(pos[0].n, ps, qs, P.Hs, P.Ws, P.Cs) + t.c];
        if (nrow[0] && kload + j < P.K) bv = brow[kload + j];
        as[lr * kPitch + lc * kSeg + j] = av;
        bs[lr * kPitch + lc * kSeg + j] = bv;
        advance(t, 1, P);
      }
    }
    advance(tp, kBK, P);
    kload += kBK;
  };

  const int wm = (warp / kWarpsN) * kWarpM, wn = (warp % kWarpsN) * kWarpN;  // this warp's piece of the tile
  float acc[kMI][kNI][4];
#pragma unroll
  for (int i = 0; i < kMI; ++i)
#pragma unroll
    for (int j = 0; j < kNI; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

  auto compute = [&](int stage) {
    const unsigned as = smem_u32(As + stage * kTile * kPitch), bs = smem_u32(Bs + stage * kTile * kPitch);
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      unsigned af[kMI][4], bf[kNI][2];
#pragma unroll
      for (int mi = 0; mi < kMI; ++mi) {  // matrices: rows 0-7 / 8-15 at k 0-7, then at k 8-15
        const int row = wm + mi * 16 + (lane & 15), col = kk + (lane >> 4) * 8;
        ldsm_x4(as + (row * kPitch + col) * 2, af[mi]);
      }
#pragma unroll
      for (int nj = 0; nj < kNI / 2; ++nj) {  // matrices: n 0-7 at k 0-7, at k 8-15, then n 8-15 likewise
        const int row = wn + nj * 16 + (lane & 7) + (lane >> 4) * 8, col = kk + ((lane >> 3) & 1) * 8;
        unsigned r[4];
        ldsm_x4(bs + (row * kPitch + col) * 2, r);
        bf[2 * nj][0] = r[0];
        bf[2 * nj][1] = r[1];
        bf[2 * nj + 1][0] = r[2];
        bf[2 * nj + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
        for (int ni = 0; ni < kNI; ++ni) mma16816<T>(acc[mi][ni], af[mi], bf[ni]);
    }
  };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < KT) load_tile(s);
    cp_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    cp_wait<kStages - 2>();  // tile kt has landed (this thread's copies) ...
    __syncthreads();         // ... everyone's, and stage (kt - 1) % kStages is no longer read
    const int nk = kt + kStages - 1;
    if (nk < KT) load_tile(nk % kStages);
    cp_commit();
    compute(kt % kStages);
  }
  cp_wait<0>();
  __syncthreads();

  // Epilogue: (acc + bias) as T into a [kTile][kWPitch] tile over the pipeline's memory, then
  // 16-byte row pieces to dst (element stores at the edges or for unaligned channel counts).
  unsigned short* Ct = reinterpret_cast<unsigned short*>(conv_smem);
  const int gq = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int ni = 0; ni < kNI; ++ni) {
    const int col = wn + ni * 8 + tq * 2;
    float b0 = 0.f, b1 = 0.f;
    if (bias) {
      const long long bc = static_cast<long long>(g) * P.Nc + n0 + col;
      if (n0 + col < P.Nc) b0 = to_compute(bias[bc]);
      if (n0 + col + 1 < P.Nc) b1 = to_compute(bias[bc + 1]);
    }
#pragma unroll
    for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = wm + mi * 16 + gq + h * 8;
        Ct[row * kWPitch + col] = cast<T>(acc[mi][ni][2 * h] + b0).x;
        Ct[row * kWPitch + col + 1] = cast<T>(acc[mi][ni][2 * h + 1] + b1).x;
      }
  }
  __syncthreads();
  const bool vec_out = P.Cd % 8 == 0 && P.Nc % 8 == 0 && (reinterpret_cast<unsigned long long>(dst) & 15) == 0;
  unsigned short* dstg = reinterpret_cast<unsigned short*>(dst) + static_cast<long long>(g) * P.Nc;
#pragma unroll 4
  for (int i = 0; i < (kTile * kTile / 8) / kThreads; ++i) {
    const int c = tid + i * kThreads, row = c / (kTile / 8), ch = (c % (kTile / 8)) * 8;
    const long long m = m0 + row;
    const int col = n0 + ch;
    if (m >= P.M || col >= P.Nc) continue;
    unsigned short* d = dstg + m * P.Cd + col;
    const unsigned short* s = Ct + row * kWPitch + ch;
    if (vec_out && col + 8 <= P.Nc) {
      *reinterpret_cast<U4*>(d) = *reinterpret_cast<const U4*>(s);
    } else {
      for (int j = 0; j < 8 && col + j < P.Nc; ++j) d[j] = s[j];
    }
  }
}

// ============================== tensor cores: weight gradient ==============================
// out[split][g * Nc + o][k] (f32) = sum over the split's rows m of dy[m, g * Nc + o] * src[m, k].
// Grid: x = K tiles, y = Nc tiles, z = groups * splits; dynamic shared memory
// kStages * 2 * kBK * kWPitch * 2 bytes (69632). Both tiles are stored [m][o or k] (the layout of
// the tensors), so the fragments come from ldmatrix.trans.
template <class T, bool VEC>
__global__ void __launch_bounds__(conv::kThreads, 2) conv_wgrad_mma(ConvParams P, const T* __restrict__ src,
                                                                    const T* __restrict__ dy, float* __restrict__ out) {
  using namespace conv;
  extern __shared__ __align__(16) unsigned char conv_smem[];
  unsigned short* As = reinterpret_cast<unsigned short*>(conv_smem);  // [kStages][kBK rows m][kWPitch] of dy
  unsigned short* Bs = As + kStages * kBK * kWPitch;                  // [kStages][kBK rows m][kWPitch] of src taps
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int k0 = blockIdx.x * kTile, o0 = blockIdx.y * kTile;
  const int g = blockIdx.z / P.splits, split = blockIdx.z - g * P.splits;
  const long long mb = split * P.m_chunk, me = mb + P.m_chunk < P.M ? mb + P.m_chunk : P.M;
  const int KT = me > mb ? static_cast<int>((me - mb + kBK - 1) / kBK) : 0;
  const unsigned short* srcg = reinterpret_cast<const unsigned short*>(src) + static_cast<long long>(g) * P.Kc;
  const unsigned short* dyg = reinterpret_cast<const unsigned short*>(dy) + static_cast<long long>(g) * P.Nc + o0;

  // Loader. VEC: 16-byte chunk lc (of kTile / 8 per row) of rows lr + i * kVecRowStep; element
  // loads: kSeg elements from lc * kSeg of row lr.
  constexpr int kChunksPerRow = kTile / 8, kVecRowStep = kThreads / kChunksPerRow;
  constexpr int kTpr = kThreads / kBK, kSeg = kTile / kTpr;
  constexpr int RPT = VEC ? kBK / kVecRowStep : 1;
  const int lr = VEC ? tid / kChunksPerRow : tid / kTpr, lc = VEC ? tid % kChunksPerRow : tid % kTpr;
  const int kseg = VEC ? 8 : kSeg;
  const int kfirst = k0 + lc * kseg;  // this thread's first column of k (fixed for the whole loop)
  const Tap tfirst = tap_of(kfirst < P.K ? kfirst : 0, P);
  Pos pos[RPT];
#pragma unroll
  for (int i = 0; i < RPT; ++i) {
    const long long m = mb + lr + i * kVecRowStep;
    pos[i] = decompose(m < P.M ? m : 0, P.Hd, P.Wd);
  }
  long long mload = mb + lr;  // row m of this thread's first row in the next tile to load

  auto load_tile = [&](int stage) {
    unsigned short* as = As + stage * kBK * kWPitch;
    unsigned short* bs = Bs + stage * kBK * kWPitch;
    if constexpr (VEC) {
#pragma unroll
      for (int i = 0; i < RPT; ++i) {
        const int row = lr + i * kVecRowStep;
        const long long m = mload + i * kVecRowStep;
        const bool aok = m < me && o0 + lc * 8 < P.Nc;
        cp_async16(smem_u32(as + row * kWPitch + lc * 8), aok ? dyg + m * P.Cd + lc * 8 : dyg, aok);
        int ps = 0, qs = 0;
        const bool bok = m < me && kfirst < P.K &&
                         tap_source<0>(P, pos[i].p, pos[i].q, tfirst.r, tfirst.s, &ps, &qs);
        const unsigned short* b = bok ? srcg + pixel(pos[i].n, ps, qs, P.Hs, P.Ws, P.Cs) + tfirst.c : srcg;
        cp_async16(smem_u32(bs + row * kWPitch + lc * 8), b, bok);
        advance_pos(pos[i], kBK, P);
      }
    } else {
      const long long m = mload;
      const bool mok = m < me;
      Tap t = tfirst;
#pragma unroll 4
      for (int j = 0; j < kSeg; ++j) {
        unsigned short av = 0, bv = 0;
        if (mok && o0 + lc * kSeg + j < P.Nc) av = dyg[m * P.Cd + lc * kSeg + j];
        int ps = 0, qs = 0;
        if (mok && kfirst + j < P.K && tap_source<0>(P, pos[0].p, pos[0].q, t.r, t.s, &ps, &qs))
          bv = srcg[pixel(pos[0].n, ps, qs, P.Hs, P.Ws, P.Cs) + t.c];
        as[lr * kWPitch + lc * kSeg + j] = av;
        bs[lr * kWPitch + lc * kSeg + j] = bv;
        advance(t, 1, P);
      }
      advance_pos(pos[0], kBK, P);
    }
    mload += kBK;
  };

  const int wm = (warp / kWarpsN) * kWarpM, wn = (warp % kWarpsN) * kWarpN;  // rows o, columns k of this warp
  float acc[kMI][kNI][4];
#pragma unroll
  for (int i = 0; i < kMI; ++i)
#pragma unroll
    for (int j = 0; j < kNI; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

  auto compute = [&](int stage) {
    const unsigned as = smem_u32(As + stage * kBK * kWPitch), bs = smem_u32(Bs + stage * kBK * kWPitch);
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      unsigned af[kMI][4], bf[kNI][2];
      const int mat = lane >> 3;
#pragma unroll
      for (int mi = 0; mi < kMI; ++mi) {  // matrices (m rows x o columns): m 0-7 / o 0-7, o 8-15, then m 8-15
        const int row = kk + (lane & 7) + (mat >> 1) * 8, col = wm + mi * 16 + (mat & 1) * 8;
        ldsm_x4_trans(as + (row * kWPitch + col) * 2, af[mi]);
      }
#pragma unroll
      for (int nj = 0; nj < kNI / 2; ++nj) {  // matrices: m 0-7 / k 0-7, m 8-15 / k 0-7, then k 8-15 likewise
        const int row = kk + (lane & 7) + (mat & 1) * 8, col = wn + nj * 16 + (mat >> 1) * 8;
        unsigned r[4];
        ldsm_x4_trans(bs + (row * kWPitch + col) * 2, r);
        bf[2 * nj][0] = r[0];
        bf[2 * nj][1] = r[1];
        bf[2 * nj + 1][0] = r[2];
        bf[2 * nj + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
        for (int ni = 0; ni < kNI; ++ni) mma16816<T>(acc[mi][ni], af[mi], bf[ni]);
    }
  };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < KT) load_tile(s);
    cp_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    cp_wait<kStages - 2>();
    __syncthreads();
    const int nk = kt + kStages - 1;
    if (nk < KT) load_tile(nk % kStages);
    cp_commit();
    compute(kt % kStages);
  }
  cp_wait<0>();

  const int gq = lane >> 2, tq = lane & 3;
  float* outg = out + (static_cast<long long>(split) * P.G * P.Nc + static_cast<long long>(g) * P.Nc) * P.K;
#pragma unroll
  for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int o = o0 + wm + mi * 16 + gq + h * 8;
      if (o >= P.Nc) continue;
      float* orow = outg + static_cast<long long>(o) * P.K;
#pragma unroll
      for (int ni = 0; ni < kNI; ++ni) {
        const int k = k0 + wn + ni * 8 + tq * 2;
        if (k < P.K) orow[k] = acc[mi][ni][2 * h];
        if (k + 1 < P.K) orow[k + 1] = acc[mi][ni][2 * h + 1];
      }
    }
}

// ============================== SIMT (f32, f64): forward and input gradient ==============================
// Square tiles of BT = 16 * TM rows and columns, BK = 1024 / BT deep (f32: 128 x 128 x 8 with 8x8
// per thread; f64: 64 x 64 x 16 with 4x4, to stay within the registers); thread (ty, tx) =
// (tid / 16, tid % 16) accumulates rows ty * TM + [0, TM) and columns tx * TM + [0, TM), read from
// shared memory as TM-wide vectors. Grid: x = M tiles, y = groups * Nc tiles.
namespace conv {
template <class T> struct Simt {
  static constexpr int TM = sizeof(T) == 4 ? 8 : 4, BT = 16 * TM, BK = 1024 / BT, TPR = BK / 4;  // TPR: loader threads per row
};
// TM consecutive elements of a shared-memory row (16-byte aligned) into registers.
template <class T, int TM>
__device__ __forceinline__ void load_row(const T* p, T (&r)[TM]) {
  constexpr int V = 16 / sizeof(T);
#pragma unroll
  for (int i = 0; i < TM; i += V) {
    const Vec<T, V> v = *reinterpret_cast<const Vec<T, V>*>(p + i);
#pragma unroll
    for (int j = 0; j < V; ++j) r[i + j] = v.v[j];
  }
}
}  // namespace conv

template <class T, int MODE>
__global__ void __launch_bounds__(256, 2) conv_simt(ConvParams P, const T* __restrict__ src, const T* __restrict__ wb,
                                                 const T* __restrict__ bias, T* __restrict__ dst) {
  using namespace conv;
  constexpr int TM = Simt<T>::TM, BT = Simt<T>::BT, BK = Simt<T>::BK, TPR = Simt<T>::TPR;
  __shared__ __align__(16) T As[BK][BT + 4];
  __shared__ __align__(16) T Bs[BK][BT + 4];
  const int tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
  const int n_tiles = (P.Nc + BT - 1) / BT;
  const int g = blockIdx.y / n_tiles, n0 = (blockIdx.y - g * n_tiles) * BT;
  const long long m0 = static_cast<long long>(blockIdx.x) * BT;
  const T* srcg = src + static_cast<long long>(g) * P.Kc;
  // Loader: row lr of both tiles, 4 consecutive k from lk.
  const int lr = tid / TPR, lk = (tid % TPR) * 4;
  const bool mok = m0 + lr < P.M, nok = n0 + lr < P.Nc;
  const Pos pos = decompose(mok ? m0 + lr : 0, P.Hd, P.Wd);
  const T* brow = wb + (static_cast<long long>(g) * P.Nc + n0 + lr) * P.K;
  Tap tp = tap_of(lk, P);
  T acc[TM][TM];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TM; ++j) acc[i][j] = T(0);
  for (int k0 = 0; k0 < P.K; k0 += BK) {
    Tap t = tp;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      T av = T(0);
      int ps = 0, qs = 0;
      if (mok && t.r < P.kh && tap_source<MODE>(P, pos.p, pos.q, t.r, t.s, &ps, &qs))
        av = srcg[pixel(pos.n, ps, qs, P.Hs, P.Ws, P.Cs) + t.c];
      As[lk + j][lr] = av;
      const int k = k0 + lk + j;
      Bs[lk + j][lr] = nok && k < P.K ? brow[k] : T(0);
      advance(t, 1, P);
    }
    advance(tp, BK, P);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      T a[TM], b[TM];
      load_row<T, TM>(&As[kk][ty * TM], a);
      load_row<T, TM>(&Bs[kk][tx * TM], b);
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TM; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const long long m = m0 + ty * TM + i;
    if (m >= P.M) continue;
#pragma unroll
    for (int j = 0; j < TM; ++j) {
      const int col = n0 + tx * TM + j;
      if (col >= P.Nc) continue;
      const long long c = static_cast<long long>(g) * P.Nc + col;
      dst[m * P.Cd + c] = acc[i][j] + (bias ? bias[c] : T(0));
    }
  }
}

// ============================== SIMT (f32, f64): weight gradient ==============================
// out[split][g * Nc + o][k] (T) over BT x BT tiles of (o, k), BK rows of m per slice (Simt<T>).
// Grid: x = K tiles, y = Nc tiles, z = groups * splits.
template <class T>
__global__ void __launch_bounds__(256, 2) conv_wgrad_simt(ConvParams P, const T* __restrict__ src, const T* __restrict__ dy,
                                                       T* __restrict__ out) {
  using namespace conv;
  constexpr int TM = Simt<T>::TM, BT = Simt<T>::BT, BK = Simt<T>::BK, TPR = BT / 4;
  __shared__ __align__(16) T As[BK][BT + 4];
  __shared__ __align__(16) T Bs[BK][BT + 4];
  const int tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
  const int k0 = blockIdx.x * BT, o0 = blockIdx.y * BT;
  const int g = blockIdx.z / P.splits, split = blockIdx.z - g * P.splits;
  const long long mb = split * P.m_chunk, me = mb + P.m_chunk < P.M ? mb + P.m_chunk : P.M;
  const T* srcg = src + static_cast<long long>(g) * P.Kc;
  const T* dyg = dy + static_cast<long long>(g) * P.Nc + o0;
  // Loader: row lr (of m) of both tiles, 4 consecutive o (A) and k (B) from lq.
  const int lr = tid / TPR, lq = (tid % TPR) * 4;
  Tap taps[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) taps[j] = tap_of(k0 + lq + j < P.K ? k0 + lq + j : 0, P);
  Pos pos = decompose(mb + lr < P.M ? mb + lr : 0, P.Hd, P.Wd);
  T acc[TM][TM];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TM; ++j) acc[i][j] = T(0);
  for (long long ms = mb; ms < me; ms += BK) {
    const long long m = ms + lr;
    const bool mok = m < me;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      As[lr][lq + j] = mok && o0 + lq + j < P.Nc ? dyg[m * P.Cd + lq + j] : T(0);
      T bv = T(0);
      int ps = 0, qs = 0;
      if (mok && k0 + lq + j < P.K && tap_source<0>(P, pos.p, pos.q, taps[j].r, taps[j].s, &ps, &qs))
        bv = srcg[pixel(pos.n, ps, qs, P.Hs, P.Ws, P.Cs) + taps[j].c];
      Bs[lr][lq + j] = bv;
    }
    advance_pos(pos, BK, P);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      T a[TM], b[TM];
      load_row<T, TM>(&As[kk][ty * TM], a);
      load_row<T, TM>(&Bs[kk][tx * TM], b);
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TM; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
  T* outg = out + (static_cast<long long>(split) * P.G * P.Nc + static_cast<long long>(g) * P.Nc) * P.K;
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int o = o0 + ty * TM + i;
    if (o >= P.Nc) continue;
#pragma unroll
    for (int j = 0; j < TM; ++j) {
      const int k = k0 + tx * TM + j;
      if (k < P.K) outg[static_cast<long long>(o) * P.K + k] = acc[i][j];
    }
  }
}

// ============================== direct kernels (any dtype) ==============================
// One thread per destination element (grid-stride), accumulating its K products in the compute type.
template <class T, int MODE>
__global__ void __launch_bounds__(256) conv_direct(ConvParams P, const T* __restrict__ src, const T* __restrict__ wb,
                                                   const T* __restrict__ bias, T* __restrict__ dst) {
  using namespace conv;
  typedef compute_t<T> A;
  const long long total = P.M * P.Cd;
  for (long long e = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long m = e / P.Cd;
    const int ch = static_cast<int>(e - m * P.Cd), g = ch / P.Nc;  // ch = g * Nc + column
    const Pos d = decompose(m, P.Hd, P.Wd);
    const T* w = wb + static_cast<long long>(ch) * P.K;
    A acc = bias ? to_compute(bias[ch]) : A(0);
    for (int r = 0; r < P.kh; ++r)
      for (int s = 0; s < P.kw; ++s) {
        int ps = 0, qs = 0;
        if (!tap_source<MODE>(P, d.p, d.q, r, s, &ps, &qs)) continue;
        const T* sp = src + pixel(d.n, ps, qs, P.Hs, P.Ws, P.Cs) + static_cast<long long>(g) * P.Kc;
        const T* wp = w + (r * P.kw + s) * P.Kc;
        for (int c = 0; c < P.Kc; ++c) acc += static_cast<A>(to_compute(sp[c])) * static_cast<A>(to_compute(wp[c]));
      }
    dst[e] = cast<T>(acc);
  }
}

// out[split][o][k] (compute type) = the split's share of sum_m dy[m, o] src[m, tap k]: one thread
// per (split, k, o), o fastest so that a warp reads consecutive channels.
template <class T>
__global__ void __launch_bounds__(256) conv_wgrad_direct(ConvParams P, const T* __restrict__ src, const T* __restrict__ dy,
                                                         compute_t<T>* __restrict__ out) {
  using namespace conv;
  typedef compute_t<T> A;
  const long long O = static_cast<long long>(P.G) * P.Nc;
  const long long total = O * P.K * P.splits;
  for (long long e = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long o = e % O, rest = e / O;
    const int k = static_cast<int>(rest % P.K), split = static_cast<int>(rest / P.K);
    const int g = static_cast<int>(o / P.Nc);
    const Tap t = tap_of(k, P);
    const long long mb = split * P.m_chunk, me = mb + P.m_chunk < P.M ? mb + P.m_chunk : P.M;
    A acc = A(0);
    if (mb < me) {
      Pos d = decompose(mb, P.Hd, P.Wd);
      const T* sg = src + static_cast<long long>(g) * P.Kc + t.c;
      for (long long m = mb; m < me; ++m) {
        int ps = 0, qs = 0;
        if (tap_source<0>(P, d.p, d.q, t.r, t.s, &ps, &qs))
          acc += static_cast<A>(to_compute(dy[m * P.Cd + o])) * static_cast<A>(to_compute(sg[pixel(d.n, ps, qs, P.Hs, P.Ws, P.Cs)]));
        advance_pos(d, 1, P);
      }
    }
    out[(static_cast<long long>(split) * O + o) * P.K + k] = acc;
  }
}

}  // namespace flame

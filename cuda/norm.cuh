// Normalisation kernels: layer_norm, rms_norm and group_norm over contiguous rows, batch_norm over
// the channels of [N, C, HW]. Statistics and arithmetic in the compute type A (f32 for f16, bf16
// and f32; f64 for f64); mean and rstd = 1/sqrt(var + eps) are written per row (A) for backward.
//
// Row modes (MODE): kLayerNorm  y = (x - mean) * rstd * w[c] + b[c]    over the last D elements
//                   kRmsNorm    y = x * rstd * w[c], rstd = 1/sqrt(mean(x^2) + eps)
//                   kGroupNorm  rows are (n, group) of an [N, C, HW] tensor, D = (C / G) * HW, and
//                               the affine index is the channel: group * (C / G) + c / HW.
// With xhat = (x - mean) * rstd (x * rstd for RMS) and gw = g * w, backward is
//   dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat))     (no mean(gw) term for RMS)
//   dw = sum over rows of g * xhat,  db = sum over rows of g.
//
//  norm_fwd / norm_bwd       a row group (rows.cuh) holds a row in registers: one read of x (and
//                            of g) and one write per element. Backward keeps dw/db partial sums
//                            per thread in registers across all rows its row group handles
//                            (LN/RMS: a thread's columns are the same in every row) and writes
//                            them to partials [blocks * blockDim.y, D] ([blocks, D] for staged
//                            rows, summed over the row groups in shared memory), summed by the host; for
//                            GN it sums per channel in shared memory and writes [N, C]. CACHE =
//                            false re-reads g and x for the dx pass instead of caching them (long
//                            rows: the accumulators take the registers; the re-read hits L2).
//  norm_fwd_block<SMEM>      one row per block. SMEM (16-byte vectors; rows of 1-4 KiB, and up to 64
//                            KiB 2-byte rows from 4, f32 from 16, f64 from 32 KiB; ops/row_router.cpp):
//                            staged in shared memory by cp.async, so that the loads in flight hold
//                            no registers and many rows stay resident per
//                            SM (a register-cached row of 16384 floats allows one; short rows: 32
//                            one-warp blocks instead of 16 warps at 97 registers): one DRAM read
//                            and one write per element, and for LN/GN the statistics in one pass
//                            over shared memory (sums about a shift, bounded cancellation). Else
//                            (longer rows) every pass reads global memory.
//  norm_bwd_stream           rows too long for registers, and dx alone of rows of 32 KiB and more
//                            (the second pass hits L2; on sm_90, rows of 32-64 KiB in 16-byte
//                            vectors take norm_bwd_ring of norm_ring.cuh instead): one block per
//                            row, two passes, the first with 4 vectors of g and x per thread in
//                            flight; the host computes dw/db
//                            with tensor ops in that case.
//  bn_*                      batch_norm: per-channel partial sums (split over blocks when few
//                            channels have many elements), a per-channel finalize (statistics,
//                            running-stat update), and elementwise apply kernels.
#pragma once
#include "row_constants.cuh"
#include "rows.cuh"

namespace flame {

// kLayerNorm / kRmsNorm / kGroupNorm (MODE) and kRowGlobal / kRowRegs / kRowSmem (ROW): row_constants.cuh.

// xhat = (x - mean) * rstd. 2-byte types: one FMA, x * rstd + nm with nm = -mean * rstd; its rounding,
// 2^-24 |mean| / std, stays far below their 2^-9 (and 2-byte inputs hold no std much below
// |mean| / 2^10). The staged bf16 layer_norm kernels are issue-bound (ncu, H200: 0.78 instructions
// per element forward).
template <class T, class A>
__device__ __forceinline__ A norm_center(A x, A mean, A rs, A nm) {
  return sizeof(T) == 2 ? x * rs + nm : (x - mean) * rs;
}

// The first affine index of a row: GN rows (n, group) start at channel group * (C / G); 0 for LN/RMS.
template <int MODE>
__device__ __forceinline__ i64 affine_base(i64 row, i64 groups, i64 cg) {
  if constexpr (MODE == kGroupNorm) return (row % groups) * cg;
  else return 0;
}

// The weight/bias values of V consecutive elements starting at column c of a row whose affine
// index starts at base (affine_base). GN: one value per channel, loaded once per vector when HW is
// a multiple of V (the vector then lies in one channel).
template <int MODE, class T, int V>
__device__ __forceinline__ void load_affine(const T* p, i64 base, i64 c, const DivI64& hw, compute_t<T> (&out)[V]) {
  typedef compute_t<T> A;
  if (!p) {
#pragma unroll
    for (int j = 0; j < V; ++j) out[j] = A(1);
    return;
  }
  if constexpr (MODE == kGroupNorm) {
    i64 q = hw(c);  // channel within the group
    const T* pc = p + base;
    if ((hw.d & (V - 1)) == 0) {
      const A a = static_cast<A>(to_compute(pc[q]));
#pragma unroll
      for (int j = 0; j < V; ++j) out[j] = a;
    } else {
      i64 r = c - q * hw.d;  // position within the channel
#pragma unroll
      for (int j = 0; j < V; ++j) {
        out[j] = static_cast<A>(to_compute(pc[q]));
        if (++r == hw.d) { r = 0; ++q; }
      }
    }
  } else {
    unpack(load_vec<T, V>(p + c), out);
  }
}

template <class T, int MODE, int NV, int V>
__global__ void __launch_bounds__(kNormRowsMaxThreads) norm_fwd(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                                 T* __restrict__ y, compute_t<T>* __restrict__ mean_out,
                                                 compute_t<T>* __restrict__ rstd_out, i64 rows, i64 D, i64 groups, i64 hw,
                                                 double eps) {
  typedef compute_t<T> A;
  __shared__ A red[256];
  const i64 cg = D / hw;
  const DivI64 hdiv(hw);
  const i64 iters = row_iterations(rows);
  i64 row = first_row();
  for (i64 it = 0; it < iters; ++it, row += row_step()) {
    const bool live = row < rows;
    const T* xr = x + (live ? row : 0) * D;
    const i64 base = affine_base<MODE>(row, groups, cg);
    Vec<T, V> v[NV];
    A s = A(0);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      i64 c = (static_cast<i64>(k) * blockDim.x + threadIdx.x) * V;
      if (live && c < D) {
        v[k] = load_vec<T, V>(xr + c);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          A a = static_cast<A>(to_compute(v[k].v[j]));
          s += MODE == kRmsNorm ? a * a : a;
        }
      }
    }
    s = row_allreduce(s, RowSum(), red);
    A mean = A(0), var;
    if constexpr (MODE == kRmsNorm) {
      var = s / static_cast<A>(D);
    } else {  // two passes over the registers: sum((x - mean)^2) has no cancellation
      mean = s / static_cast<A>(D);
      A q = A(0);
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        i64 c = (static_cast<i64>(k) * blockDim.x + threadIdx.x) * V;
        if (live && c < D) {
#pragma unroll
          for (int j = 0; j < V; ++j) {
            A d = static_cast<A>(to_compute(v[k].v[j])) - mean;
            q += d * d;
          }
        }
      }
      var = row_allreduce(q, RowSum(), red) / static_cast<A>(D);
    }
    const A rs = m_rsqrt(var + static_cast<A>(eps));
    if (live && threadIdx.x == 0) {
      if (mean_out) mean_out[row] = mean;
      rstd_out[row] = rs;
    }
    T* yr = y + (live ? row : 0) * D;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      i64 c = (static_cast<i64>(k) * blockDim.x + threadIdx.x) * V;
      if (live && c < D) {
        A wv[V], bv[V];
        load_affine<MODE, T, V>(w, base, c, hdiv, wv);
        Vec<T, V> o;
        if (b) {
          load_affine<MODE, T, V>(b, base, c, hdiv, bv);
#pragma unroll
          for (int j = 0; j < V; ++j) o.v[j] = cast<T>((static_cast<A>(to_compute(v[k].v[j])) - mean) * rs * wv[j] + bv[j]);
        } else {
#pragma unroll
          for (int j = 0; j < V; ++j) o.v[j] = cast<T>((static_cast<A>(to_compute(v[k].v[j])) - mean) * rs * wv[j]);
        }
        store_vec<T, V>(yr + c, o);
      }
    }
  }
}

// Adds (vg, vb) to the per-channel sums of channel ch in shared memory (GN weight gradients).
// Warp-uniform channel (seg_aligned): one atomic per warp after a shuffle reduction.
template <class A>
__device__ __forceinline__ void gn_channel_add(A* sm, i64 cg, i64 ch, A vg, A vb, bool valid, bool warp_uniform) {
  if (warp_uniform) {
    for (int o = 16; o > 0; o >>= 1) {
      vg += __shfl_xor_sync(0xffffffffu, vg, o);
      vb += __shfl_xor_sync(0xffffffffu, vb, o);
    }
    if (valid && (threadIdx.x & 31) == 0) {
      atomicAdd(sm + ch, vg);
      atomicAdd(sm + cg + ch, vb);
    }
  } else if (valid) {
    atomicAdd(sm + ch, vg);
    atomicAdd(sm + cg + ch, vb);
  }
}

// dx (may be null), and the weight/bias gradient partials (dw_part/db_part may be null):
//   LN/RMS: [gridDim.x * blockDim.y, D], GN: [rows, C / G] = [N, C] (GN needs blockDim.y == 1 and
//   2 * (C / G) * sizeof(A) bytes of dynamic shared memory). seg_aligned (GN): HW is a multiple of
//   32 * V, so that the 32 vectors a warp holds for one k lie in one channel.
// WB = false (LN/RMS): no weight or bias gradient wanted, so no accumulators (fewer registers: a
// warp per row of 768-1024 floats instead of 192-256 threads).
// ROW: where the g and x rows wait between the two passes: kRowGlobal (re-read, hits L2), kRowRegs
// (registers), kRowSmem (LN/RMS, V * sizeof(T) == 16: shared memory, 2 * D * sizeof(T) bytes of
// dynamic shared memory per row group, filled by cp.async so that no register holds a load in flight).
template <class T, int MODE, int NV, int V, int ROW, bool WB>
__global__ void __launch_bounds__(kNormRowsMaxThreads) norm_bwd(const T* __restrict__ g, const T* __restrict__ x, const T* __restrict__ w,
                                                const compute_t<T>* __restrict__ mean, const compute_t<T>* __restrict__ rstd,
                                                T* __restrict__ dx, compute_t<T>* __restrict__ dw_part,
                                                compute_t<T>* __restrict__ db_part, i64 rows, i64 D, i64 groups, i64 hw,
                                                int seg_aligned) {
  typedef compute_t<T> A;
  __shared__ A red[8 * 64];  // row_allreduce2: 64 per row group, up to 8 row groups
  extern __shared__ __align__(16) unsigned char gn_smem_raw[];
  A* gsm = reinterpret_cast<A*>(gn_smem_raw);
  constexpr bool CACHE = ROW == kRowRegs, SMEM = ROW == kRowSmem;
  Vec<T, V>* sg = reinterpret_cast<Vec<T, V>*>(gn_smem_raw) + threadIdx.y * 2 * (D / V);  // SMEM: this row group's g
  Vec<T, V>* sx = sg + D / V;                                                               // and x
  const i64 cg = D / hw;
  const DivI64 hdiv(hw);
  const bool want_wb = dw_part != nullptr || db_part != nullptr;
  A dwa[NV][V], dba[NV][V];  // LN/RMS partial sums of g * xhat and g for this thread's columns
#pragma unroll
  for (int k = 0; k < NV; ++k)
#pragma unroll
    for (int j = 0; j < V; ++j) dwa[k][j] = dba[k][j] = A(0);
  if (MODE == kGroupNorm && want_wb) {
    for (i64 i = threadIdx.x; i < 2 * cg; i += blockDim.x) gsm[i] = A(0);
    __syncthreads();
  }
  const i64 iters = row_iterations(rows);
  i64 row = first_row();
  for (i64 it = 0; it < iters; ++it, row += row_step()) {
    const bool live = row < rows;
    const i64 off = (live ? row : 0) * D, base = affine_base<MODE>(row, groups, cg);
    const A mu = (MODE == kRmsNorm || !live) ? A(0) : mean[row];
    const A rs = live ? rstd[row] : A(0), nm = -mu * rs;
    Vec<T, V> gv[CACHE ? NV : 1], xv[CACHE ? NV : 1];
    if constexpr (SMEM) stage_own_vectors<T, V, NV>(sg, g + off, sx, x + off, live ? D / V : 0);
    A sa = A(0), sb = A(0);  // sum(gw), sum(gw * xhat)
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      i64 c = (static_cast<i64>(k) * blockDim.x + threadIdx.x) * V;
      const bool valid = live && c < D;
      A pg = A(0), pb = A(0);  // GN: this vector's contribution to its channel
      if (valid) {
        Vec<T, V> gk = SMEM ? sg[c / V] : load_vec<T, V>(g + off + c), xk = SMEM ? sx[c / V] : load_vec<T, V>(x + off + c);
        if constexpr (CACHE) { gv[k] = gk; xv[k] = xk; }
        A wv[V], gs[V], xs[V];
        load_affine<MODE, T, V>(w, base, c, hdiv, wv);
        unpack(gk, gs);
        unpack(xk, xs);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          A gj = gs[j];
          A xh = norm_center<T>(xs[j], mu, rs, nm);
          A gw = gj * wv[j];
          sa += gw;
          sb += gw * xh;
          if constexpr (MODE != kGroupNorm) {
            if constexpr (WB) {
              dwa[k][j] += gj * xh;
              dba[k][j] += gj;
            }
          } else if (want_wb && !seg_aligned) {
            gn_channel_add(gsm, cg, hdiv(c + j), gj * xh, gj, true, false);
          } else {
            pg += gj * xh;
            pb += gj;
          }
        }
      }
      if (MODE == kGroupNorm && want_wb && seg_aligned) gn_channel_add(gsm, cg, valid ? hdiv(c) : 0, pg, pb, valid, true);
    }
    if constexpr (MODE != kRmsNorm) row_allreduce2(sa, sb, red);
    else sb = row_allreduce(sb, RowSum(), red);
    const A inv_d = A(1) / static_cast<A>(D);
    const A ma = MODE == kRmsNorm ? A(0) : sa * inv_d, mb = sb * inv_d;
    const A nrmb = -rs * mb, nrma = -rs * ma;  // 2-byte dx: gw * rs + (xh * nrmb + nrma), two FMAs
    if (dx) {
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        i64 c = (static_cast<i64>(k) * blockDim.x + threadIdx.x) * V;
        if (live && c < D) {
          Vec<T, V> gk, xk;
          if constexpr (CACHE) { gk = gv[k]; xk = xv[k]; }
          else if constexpr (SMEM) { gk = sg[c / V]; xk = sx[c / V]; }
          else { gk = load_vec<T, V>(g + off + c); xk = load_vec<T, V>(x + off + c); }
          A wv[V], gs[V], xs[V];
          load_affine<MODE, T, V>(w, base, c, hdiv, wv);
          unpack(gk, gs);
          unpack(xk, xs);
#pragma unroll
          for (int j = 0; j < V; ++j) {
            const A xh = norm_center<T>(xs[j], mu, rs, nm), gw = gs[j] * wv[j];
            xs[j] = sizeof(T) == 2 ? gw * rs + (xh * nrmb + nrma) : rs * (gw - ma - xh * mb);
          }
          store_vec<T, V>(dx + off + c, pack<T>(xs));
        }
      }
    }
    if (MODE == kGroupNorm && want_wb) {  // flush this row's channel sums: [n, group * cg + i] = [row, i]
      __syncthreads();
      for (i64 i = threadIdx.x; i < cg; i += blockDim.x) {
        if (live) {
          if (dw_part) dw_part[row * cg + i] = gsm[i];
          if (db_part) db_part[row * cg + i] = gsm[cg + i];
        }
        gsm[i] = gsm[cg + i] = A(0);
      }
      __syncthreads();
    }
  }
  if constexpr (MODE != kGroupNorm && WB && SMEM) {
    // Staged rows: the row groups' sums meet in the shared memory that held the rows (D * blockDim.y
    // values of A fit in its 2 * D * blockDim.y of T), and the block writes one partial row, so the
    // partials are [gridDim.x, D] instead of [gridDim.x * blockDim.y, D] (a fifth of layer_norm's
    // backward traffic with weight gradients at rows of 768).
    A* sums = reinterpret_cast<A*>(gn_smem_raw);
    for (int pass = 0; pass < 2; ++pass) {
      A* out = pass ? db_part : dw_part;
      if (!out) continue;  // uniform
      __syncthreads();     // every row group is done with its staged rows (and with the previous pass)
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        const i64 c = (static_cast<i64>(k) * blockDim.x + threadIdx.x) * V;
        if (c < D) {
#pragma unroll
          for (int j = 0; j < V; ++j) sums[threadIdx.y * D + c + j] = pass ? dba[k][j] : dwa[k][j];
        }
      }
      __syncthreads();
      for (i64 col = static_cast<i64>(threadIdx.y) * blockDim.x + threadIdx.x; col < D; col += static_cast<i64>(blockDim.x) * blockDim.y) {
        A s = A(0);
        for (int y = 0; y < static_cast<int>(blockDim.y); ++y) s += sums[y * D + col];
        out[static_cast<i64>(blockIdx.x) * D + col] = s;
      }
    }
  } else if constexpr (MODE != kGroupNorm && WB) {
    const i64 slot = static_cast<i64>(blockIdx.x) * blockDim.y + threadIdx.y;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      i64 c = (static_cast<i64>(k) * blockDim.x + threadIdx.x) * V;
      if (c < D) {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          if (dw_part) dw_part[slot * D + c + j] = dwa[k][j];
          if (db_part) db_part[slot * D + c + j] = dba[k][j];
        }
      }
    }
  }
}

// ---------------- long rows, one per block: blockDim = (threads, 1) ----------------

// SMEM: the row is staged in dynamic shared memory (D * sizeof(T) bytes, V * sizeof(T) == 16) and
// read from there, by one pass for the statistics (shifted sums, below) and one for the output; else
// each of three passes reads global memory (the later ones mostly hit L2).
// Staged layer_norm / group_norm rows of 1-4 byte types keep to 40 registers, so that three blocks of
// 512 threads (three 64 KiB rows) stay resident per SM: the one-pass statistics took 42 without the
// bound (two blocks per SM), and bf16 rows took 62 before (H200, staged layer_norm forward: f32
// 2048 / 4096 / 8192 x 16384 0.78-0.82 / 0.79-0.88 / 0.85-0.91 -> 0.84 / 0.88-0.91 / 0.89-0.93 of copy,
// bf16 2048 / 4096 x 32768 0.66 / 0.70 -> 0.72 / 0.76). rms_norm (one pass already) keeps ptxas's own
// choice, a minimum of 0 blocks (bf16 rms rows measured slower under the bound: 0.85 -> 0.81), as do
// the streamed rows.
template <class T, int MODE, bool SMEM>
constexpr bool kStagedBound = SMEM && MODE != kRmsNorm && sizeof(T) <= 4;

template <class T, int MODE, int V, bool SMEM>
__global__ void __launch_bounds__(kStagedBound<T, MODE, SMEM> ? 512 : 1024, kStagedBound<T, MODE, SMEM> ? 3 : 0)
    norm_fwd_block(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                   compute_t<T>* __restrict__ mean_out, compute_t<T>* __restrict__ rstd_out, i64 rows, i64 D,
                   i64 groups, i64 hw, double eps) {
  typedef compute_t<T> A;
  __shared__ A red[64];
  extern __shared__ __align__(16) unsigned char row_smem[];
  const Vec<T, V>* srow = reinterpret_cast<const Vec<T, V>*>(row_smem);
  typedef typename pick_type<SMEM, int, i64>::type I;  // staged rows hold at most 4096 vectors
  const i64 cg = D / hw;
  const I nvec = static_cast<I>(D / V);  // V == 1 unless D is a multiple of V
  const DivI64 hdiv(hw);
  for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * D;
    const i64 base = affine_base<MODE>(row, groups, cg);
    if constexpr (SMEM) stage_row<T, V>(row_smem, xr, nvec);
    auto vec = [&](I i) { return SMEM ? srow[i] : load_vec<T, V>(xr + static_cast<i64>(i) * V); };
    A mean = A(0), var;
    if constexpr (MODE != kRmsNorm && SMEM) {
      // One pass over the staged row: sums of d = x - K and d^2 about a shift K, the mean of the
      // row's first m = 32 * V elements, which every warp computes alike (a butterfly gives every lane
      // the same sum). var = mean(d^2) - mean(d)^2 cancels (mean - K)^2 / var, and by Cauchy-Schwarz
      // |K - mean| <= sqrt(D / m) * std, so at most D / m <= 128 (rows of 64 KiB) of those units:
      // an f32 variance within ~1e-5 relative, where an unshifted sum of squares loses everything.
      // (The pass it saves, sum((x - mean)^2), and its block reduction lengthened every row.)
      const int lane = threadIdx.x & 31;
      const I m = nvec < 32 ? nvec : 32;
      A k = A(0);
      if (lane < m) {
        A xs[V];
        unpack(srow[lane], xs);
#pragma unroll
        for (int j = 0; j < V; ++j) k += xs[j];
      }
      for (int o = 16; o > 0; o >>= 1) k += __shfl_xor_sync(0xffffffffu, k, o);
      const A K = k / static_cast<A>(m * V);
      A s1 = A(0), s2 = A(0);
      for (I i = threadIdx.x; i < nvec; i += blockDim.x) {
        A xs[V];
        unpack(srow[i], xs);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          A d = xs[j] - K;
          s1 += d;
          s2 += d * d;
        }
      }
      row_allreduce2(s1, s2, red);
      const A dm = s1 / static_cast<A>(D);
      mean = K + dm;
      var = s2 / static_cast<A>(D) - dm * dm;
      var = var > A(0) ? var : A(0);
    } else {
      A s = A(0);
      for (I i = threadIdx.x; i < nvec; i += blockDim.x) {
        A xs[V];
        unpack(vec(i), xs);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          A a = xs[j];
          s += MODE == kRmsNorm ? a * a : a;
        }
      }
      s = row_allreduce(s, RowSum(), red);
      if constexpr (MODE == kRmsNorm) {
        var = s / static_cast<A>(D);
      } else {  // a second pass: sum((x - mean)^2) has no cancellation
        mean = s / static_cast<A>(D);
        A q = A(0);
        for (I i = threadIdx.x; i < nvec; i += blockDim.x) {
          A xs[V];
          unpack(vec(i), xs);
#pragma unroll
          for (int j = 0; j < V; ++j) {
            A d = xs[j] - mean;
            q += d * d;
          }
        }
        var = row_allreduce(q, RowSum(), red) / static_cast<A>(D);
      }
    }
    const A rs = m_rsqrt(var + static_cast<A>(eps));
    if (threadIdx.x == 0) {
      if (mean_out) mean_out[row] = mean;
      rstd_out[row] = rs;
    }
    T* yr = y + row * D;
    // LN/RMS: the weight and bias of U vectors are loaded (from L2: every row reads them) before any is
    // used; one vector at a time for GN (one value per channel) and for bounded 2-byte types (two
    // batches of 8 values spilled under the 40-register bound).
    constexpr int U = MODE == kGroupNorm || (kStagedBound<T, MODE, SMEM> && sizeof(T) == 2) ? 1 : 2;
    const A nm = -mean * rs;  // norm_center
    for (I i0 = threadIdx.x; i0 < nvec; i0 += U * static_cast<I>(blockDim.x)) {
      A wv[U][V], bv[U][V];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const I i = i0 + u * static_cast<I>(blockDim.x);
        if (i < nvec) {
          load_affine<MODE, T, V>(w, base, static_cast<i64>(i) * V, hdiv, wv[u]);
          if (b) load_affine<MODE, T, V>(b, base, static_cast<i64>(i) * V, hdiv, bv[u]);
#pragma unroll
          for (int j = 0; j < V; ++j)
            if (!b) bv[u][j] = A(0);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const I i = i0 + u * static_cast<I>(blockDim.x);
        if (i < nvec) {
          A xs[V];
          unpack(vec(i), xs);
#pragma unroll
          for (int j = 0; j < V; ++j) {
            const A xh = norm_center<T>(xs[j], mean, rs, nm);
            xs[j] = xh * wv[u][j] + bv[u][j];
          }
          store_vec<T, V>(yr + static_cast<i64>(i) * V, pack<T>(xs));
        }
      }
    }
    if constexpr (SMEM) __syncthreads();  // every thread is done with this row before the next one's copies land
  }
}

template <class T, int MODE, int V>
__global__ void __launch_bounds__(1024) norm_bwd_stream(const T* __restrict__ g, const T* __restrict__ x,
                                                        const T* __restrict__ w, const compute_t<T>* __restrict__ mean,
                                                        const compute_t<T>* __restrict__ rstd, T* __restrict__ dx, i64 rows,
                                                        i64 D, i64 groups, i64 hw) {
  typedef compute_t<T> A;
  __shared__ A red[256];
  const i64 cg = D / hw, step = static_cast<i64>(blockDim.x) * V;
  const DivI64 hdiv(hw);
  for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const i64 off = row * D, base = affine_base<MODE>(row, groups, cg);
    const A mu = MODE == kRmsNorm ? A(0) : mean[row], rs = rstd[row];
    A sa = A(0), sb = A(0);
    // U vectors of g and x per thread in flight (loaded before any is used; one at a time the pass
    // from DRAM was latency-bound: the dx-only layer_norm backward at 16384 floats reached ~0.66 of copy).
    constexpr int U = V >= 8 ? 2 : 4;  // 8 f32 values per vector of f16 / bf16: half as many (64 registers)
    for (i64 c0 = static_cast<i64>(threadIdx.x) * V; c0 < D; c0 += U * step) {
      Vec<T, V> gk[U], xk[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const i64 c = c0 + u * step;
        if (c < D) {
          gk[u] = load_vec<T, V>(g + off + c);
          xk[u] = load_vec<T, V>(x + off + c);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const i64 c = c0 + u * step;
        if (c < D) {
          A wv[V];
          load_affine<MODE, T, V>(w, base, c, hdiv, wv);
#pragma unroll
          for (int j = 0; j < V; ++j) {
            A gw = static_cast<A>(to_compute(gk[u].v[j])) * wv[j];
            sa += gw;
            sb += gw * (static_cast<A>(to_compute(xk[u].v[j])) - mu) * rs;
          }
        }
      }
    }
    if constexpr (MODE != kRmsNorm) row_allreduce2(sa, sb, red);
    else sb = row_allreduce(sb, RowSum(), red);
    const A inv_d = A(1) / static_cast<A>(D);
    const A ma = MODE == kRmsNorm ? A(0) : sa * inv_d, mb = sb * inv_d;
    for (i64 c = static_cast<i64>(threadIdx.x) * V; c < D; c += step) {
      Vec<T, V> gk = load_vec<T, V>(g + off + c), xk = load_vec<T, V>(x + off + c), o;
      A wv[V];
      load_affine<MODE, T, V>(w, base, c, hdiv, wv);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        A xh = (static_cast<A>(to_compute(xk.v[j])) - mu) * rs;
        o.v[j] = cast<T>(rs * (static_cast<A>(to_compute(gk.v[j])) * wv[j] - ma - xh * mb));
      }
      store_vec<T, V>(dx + off + c, o);
    }
  }
}

// ---------------- LN/RMS weight and bias gradients of long rows ----------------

// Partial column sums of the rows too long for the row kernels' accumulators (the streamed and ring
// dx kernels): thread (column vector i, split blockIdx.y) sums g * xhat and g over its split's rows,
// U rows' loads in flight, into dw_part / db_part[blockIdx.y, D] (either may be null); the host sums
// the splits. Reads g and x once more, in whole 16-byte vectors per row.
template <class T, int MODE, int V>
__global__ void __launch_bounds__(256) norm_wb_cols(const T* __restrict__ g, const T* __restrict__ x,
                                                    const compute_t<T>* __restrict__ mean,
                                                    const compute_t<T>* __restrict__ rstd,
                                                    compute_t<T>* __restrict__ dw_part, compute_t<T>* __restrict__ db_part,
                                                    i64 rows, i64 D, i64 rows_per_split) {
  typedef compute_t<T> A;
  constexpr int U = 4;
  const i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i * V >= D) return;
  const i64 r0 = static_cast<i64>(blockIdx.y) * rows_per_split, r1 = min(rows, r0 + rows_per_split);
  A dw[V], db[V];
#pragma unroll
  for (int j = 0; j < V; ++j) dw[j] = db[j] = A(0);
  for (i64 r = r0; r < r1; r += U) {
    Vec<T, V> gv[U], xv[U];
    A mu[U], rs[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (r + u < r1) {
        gv[u] = load_vec<T, V>(g + (r + u) * D + i * V);
        xv[u] = load_vec<T, V>(x + (r + u) * D + i * V);
        mu[u] = MODE == kRmsNorm ? A(0) : mean[r + u];
        rs[u] = rstd[r + u];
      }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (r + u < r1) {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const A gs = static_cast<A>(to_compute(gv[u].v[j]));
          dw[j] += gs * ((static_cast<A>(to_compute(xv[u].v[j])) - mu[u]) * rs[u]);
          db[j] += gs;
        }
      }
  }
  const i64 at = static_cast<i64>(blockIdx.y) * D + i * V;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    if (dw_part) dw_part[at + j] = dw[j];
    if (db_part) db_part[at + j] = db[j];
  }
}

// ---------------- batch_norm over [N, C, HW] (contiguous) ----------------

// Partial per-channel sums: block b reduces elements [ch * chunk_len, (ch + 1) * chunk_len) of the
// N * HW elements of channel c = b / chunks (ch = b % chunks) into part[b] = (s1, s2).
//   MODE kBnStatistics: s1 = sum(x - K), s2 = sum((x - K)^2), with K = the channel's first element
//                        (a shift that keeps s2 - s1^2 / n free of cancellation for offset data).
//   MODE kBnGradientSums: s1 = sum(g), s2 = sum(g * (x - mean[c])).
template <class T, int MODE>
__global__ void bn_reduce(const T* __restrict__ x, const T* __restrict__ g, const compute_t<T>* __restrict__ mean,
                          compute_t<T>* __restrict__ part, i64 C, i64 HW, i64 count, i64 chunks, i64 chunk_len) {
  typedef compute_t<T> A;
  __shared__ A red[32];
  for (i64 blk = blockIdx.x; blk < C * chunks; blk += gridDim.x) {
    const i64 c = blk / chunks, ch = blk % chunks;
    const i64 e1 = min(count, (ch + 1) * chunk_len);
    const A shift = MODE == kBnStatistics ? static_cast<A>(to_compute(x[c * HW])) : mean[c];
    A s1 = A(0), s2 = A(0);
    for (i64 e = ch * chunk_len + threadIdx.x; e < e1; e += blockDim.x) {
      const i64 n = e / HW, off = (n * C + c) * HW + (e - n * HW);
      A d = static_cast<A>(to_compute(x[off])) - shift;
      if (MODE == kBnStatistics) {
        s1 += d;
        s2 += d * d;
      } else {
        A gv = static_cast<A>(to_compute(g[off]));
        s1 += gv;
        s2 += gv * d;
      }
    }
    s1 = block_reduce(s1, [](A a, A b) { return a + b; }, red);
    s2 = block_reduce(s2, [](A a, A b) { return a + b; }, red);
    if (threadIdx.x == 0) {
      part[2 * blk] = s1;
      part[2 * blk + 1] = s2;
    }
  }
}

// One thread per channel: sums the chunks' partials. MODE kBnStatistics: mean, rstd (saved for backward) and
// the running statistics (unbiased variance, as PyTorch), when given, updated in place.
// MODE kBnGradientSums: sums[2c] = sum(g), sums[2c + 1] = sum(g * (x - mean)).
template <class T, int MODE>
__global__ void bn_finalize(const compute_t<T>* __restrict__ part, const T* __restrict__ x, compute_t<T>* __restrict__ out0,
                            compute_t<T>* __restrict__ out1, T* running_mean, i64 rm_stride, T* running_var,
                            i64 rv_stride, i64 C, i64 HW, i64 count, i64 chunks, double momentum, double eps) {
  typedef compute_t<T> A;
  for (i64 c = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; c < C; c += static_cast<i64>(gridDim.x) * blockDim.x) {
    A s1 = A(0), s2 = A(0);
    for (i64 k = 0; k < chunks; ++k) {
      s1 += part[2 * (c * chunks + k)];
      s2 += part[2 * (c * chunks + k) + 1];
    }
    if (MODE == kBnGradientSums) {
      out0[2 * c] = s1;
      out0[2 * c + 1] = s2;
      continue;
    }
    const A n = static_cast<A>(count);
    const A d = s1 / n;
    const A mean = static_cast<A>(to_compute(x[c * HW])) + d;
    A var = (s2 - s1 * d) / n;
    var = var > A(0) ? var : A(0);
    out0[c] = mean;
    out1[c] = m_rsqrt(var + static_cast<A>(eps));
    const A mom = static_cast<A>(momentum);
    if (running_mean) {
      A r = static_cast<A>(to_compute(running_mean[c * rm_stride]));
      running_mean[c * rm_stride] = cast<T>((A(1) - mom) * r + mom * mean);
    }
    if (running_var) {
      A r = static_cast<A>(to_compute(running_var[c * rv_stride]));
      running_var[c * rv_stride] = cast<T>((A(1) - mom) * r + mom * var * n / (n - A(1)));
    }
  }
}

// y = (x - mean[c]) * rstd[c] * w[c] + b[c] elementwise (w, b may be null).
template <class T>
__global__ void bn_apply(const T* __restrict__ x, T* __restrict__ y, const compute_t<T>* __restrict__ mean,
                         const compute_t<T>* __restrict__ rstd, const T* __restrict__ w, const T* __restrict__ b, i64 n,
                         i64 C, i64 HW) {
  typedef compute_t<T> A;
  for (i64 e = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 c = (e / HW) % C;
    A r = (static_cast<A>(to_compute(x[e])) - mean[c]) * rstd[c];
    if (w) r *= static_cast<A>(to_compute(w[c]));
    if (b) r += static_cast<A>(to_compute(b[c]));
    y[e] = cast<T>(r);
  }
}

// dx elementwise. TRAIN: dx = w rstd (g - sum_g / count - (x - mean) rstd^2 sum_gxc / count) with
// sums from bn_finalize<.., 1>; eval (statistics are constants): dx = g w rstd.
template <class T, bool TRAIN>
__global__ void bn_bwd_apply(const T* __restrict__ g, const T* __restrict__ x, T* __restrict__ dx,
                             const compute_t<T>* __restrict__ mean, const compute_t<T>* __restrict__ rstd,
                             const T* __restrict__ w, const compute_t<T>* __restrict__ sums, i64 n, i64 C, i64 HW, i64 count) {
  typedef compute_t<T> A;
  const A inv = A(1) / static_cast<A>(count);
  for (i64 e = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 c = (e / HW) % C;
    const A rs = rstd[c];
    A scale = w ? static_cast<A>(to_compute(w[c])) * rs : rs;
    A gv = static_cast<A>(to_compute(g[e]));
    if (TRAIN) {
      A xc = static_cast<A>(to_compute(x[e])) - mean[c];
      gv = gv - sums[2 * c] * inv - xc * rs * rs * sums[2 * c + 1] * inv;
    }
    dx[e] = cast<T>(scale * gv);
  }
}

}  // namespace flame

// Softmax and log-softmax, forward and backward, in the compute type A (f32 for f16/bf16/f32, f64
// for f64). Stable: exp(x - max) with the row maximum subtracted.
//
//  softmax_fwd / softmax_bwd   [rows, D] contiguous rows. A row group (rows.cuh) holds the row in
//                              registers (NV vectors of V per thread): one read and one write of
//                              global memory per element. Two all-reduces: max then sum (forward),
//                              sum(g * y) or sum(g) (backward).
//  softmax_fwd_smem            rows of 16-byte vectors of 1-4 KiB, and up to 64 KiB from 4 / 16 / 32
//                              KiB for 2- / 4- / 8-byte types (ops/row_router.cpp): one row per block
//                              staged in shared memory by cp.async (stage_row in rows.cuh), so that
//                              the loads in flight hold no registers: one read, one write.
//  softmax_fwd_stream / _bwd_stream
//                              rows too long for registers: a 1-D block per row, an online
//                              (max, sum) pass, then a pass that writes (the row is read twice).
//  softmax_cols_fwd / _bwd     [outer, D, inner] contiguous with inner > 1 (a dim that is not the
//                              last): one thread per (outer, inner) column walks D; adjacent threads
//                              read adjacent columns, so every access is coalesced.
//
// Backward: softmax dx = y * (g - sum(g * y)); log-softmax dx = g - exp(y) * sum(g).
#pragma once
#include "row_constants.cuh"
#include "rows.cuh"

namespace flame {

// exp(d) for d = x - max (or a log-softmax value) of rows of T. Rows of 2-byte types, rounded to 8 or
// 11 bits, take ex2.approx.ftz(d * log2(e)): MUFU.EX2 and one multiply where expf has ten instructions,
// at a relative error of ~1e-7 * |d| (d itself is exact near the maximum); results below 2^-126 flush
// to 0 (a softmax value under 1.2e-38). A bf16 row read at copy speed issues two exps per 4 bytes, and
// expf made instruction issue the limit of the staged bf16 forward (ncu, H200: issue slots 90% busy,
// DRAM 78%). With pack / unpack (common.cuh), bf16 softmax forward 65536 x 768 / 4096 and 8192 x 16384
// went 0.67 / 0.78 / 0.73 -> 0.88 / 0.97 / 0.93 of copy.
template <class T, class A>
__device__ __forceinline__ A softmax_exp(A d) {
  if constexpr (sizeof(T) == 2) return fast_exp2(d * kLog2e);
  else return m_exp(d);
}

template <class T, bool LOG, class A>
__device__ __forceinline__ A softmax_value(A x, A m, A inv_sum, A log_sum) {
  return LOG ? x - m - log_sum : softmax_exp<T>(x - m) * inv_sum;
}

template <class T, bool LOG, int NV, int V>
__global__ void __launch_bounds__(kSoftmaxFwdMaxThreads) softmax_fwd(const T* __restrict__ x, T* __restrict__ y, i64 rows, i64 D) {
  typedef compute_t<T> A;
  __shared__ A red[256];
  const i64 iters = row_iterations(rows);
  i64 row = first_row();
  for (i64 it = 0; it < iters; ++it, row += row_step()) {
    const bool live = row < rows;
    const T* xr = x + (live ? row : 0) * D;
    Vec<T, V> v[NV];
    A m = neg_infinity<A>();
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      i64 c = (static_cast<i64>(k) * blockDim.x + threadIdx.x) * V;
      if (live && c < D) {
        v[k] = load_vec<T, V>(xr + c);
#pragma unroll
        for (int j = 0; j < V; ++j) m = RowMax()(m, static_cast<A>(to_compute(v[k].v[j])));
      }
    }
    m = row_allreduce(m, RowMax(), red);
    A s = A(0);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      i64 c = (static_cast<i64>(k) * blockDim.x + threadIdx.x) * V;
      if (live && c < D) {
#pragma unroll
        for (int j = 0; j < V; ++j) s += softmax_exp<T>(static_cast<A>(to_compute(v[k].v[j])) - m);
      }
    }
    s = row_allreduce(s, RowSum(), red);
    const A inv = A(1) / s, ls = m_log(s);
    T* yr = y + (live ? row : 0) * D;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      i64 c = (static_cast<i64>(k) * blockDim.x + threadIdx.x) * V;
      if (live && c < D) {
        Vec<T, V> o;
#pragma unroll
        for (int j = 0; j < V; ++j) o.v[j] = cast<T>(softmax_value<T, LOG>(static_cast<A>(to_compute(v[k].v[j])), m, inv, ls));
        store_vec<T, V>(yr + c, o);
      }
    }
  }
}

// SMEM (V * sizeof(T) == 16): g and y wait between the passes in shared memory (2 * D * sizeof(T)
// bytes of dynamic shared memory per row group, filled by cp.async) instead of registers.
// A thread's vector index j in the row is an int (rows of fewer than 2^31 vectors): with 64-bit
// indices the register-cached kernel at rows of 16384 floats took 128 registers (H200: softmax
// fwd+bwd 2048x16384 f32 0.73 of copy; 104 registers now, 0.87).
template <class T, bool LOG, int NV, int V, bool SMEM>
__global__ void __launch_bounds__(kSoftmaxBwdMaxThreads) softmax_bwd(const T* __restrict__ g, const T* __restrict__ y, T* __restrict__ dx,
                                                   i64 rows, i64 D) {
  typedef compute_t<T> A;
  __shared__ A red[256];
  extern __shared__ __align__(16) unsigned char bwd_rows[];
  const int nvec = static_cast<int>(D / V);
  Vec<T, V>* sg = reinterpret_cast<Vec<T, V>*>(bwd_rows) + threadIdx.y * 2 * nvec;
  Vec<T, V>* sy = sg + nvec;
  const i64 iters = row_iterations(rows);
  i64 row = first_row();
  for (i64 it = 0; it < iters; ++it, row += row_step()) {
    const bool live = row < rows;
    const i64 off = (live ? row : 0) * D;
    Vec<T, V> gv[SMEM ? 1 : NV], yv[SMEM ? 1 : NV];
    if constexpr (SMEM) stage_own_vectors<T, V, NV>(sg, g + off, sy, y + off, live ? nvec : 0);
    auto gvec = [&](int k, int j) -> const Vec<T, V>& {
      if constexpr (SMEM) return sg[j];
      else return gv[k];
    };
    auto yvec = [&](int k, int j) -> const Vec<T, V>& {
      if constexpr (SMEM) return sy[j];
      else return yv[k];
    };
    A s = A(0);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int j = k * blockDim.x + threadIdx.x;  // vector j of the row
      const i64 c = static_cast<i64>(j) * V;
      if (live && j < nvec) {
        if constexpr (!SMEM) {
          gv[k] = load_vec<T, V>(g + off + c);
          yv[k] = load_vec<T, V>(y + off + c);
        }
        A gs[V], ys[V];
        unpack(gvec(k, j), gs);
        unpack(yvec(k, j), ys);
#pragma unroll
        for (int e = 0; e < V; ++e) s += LOG ? gs[e] : gs[e] * ys[e];
      }
    }
    s = row_allreduce(s, RowSum(), red);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int j = k * blockDim.x + threadIdx.x;
      const i64 c = static_cast<i64>(j) * V;
      if (live && j < nvec) {
        A gs[V], ys[V];
        unpack(gvec(k, j), gs);
        unpack(yvec(k, j), ys);
#pragma unroll
        for (int e = 0; e < V; ++e) gs[e] = LOG ? gs[e] - softmax_exp<T>(ys[e]) * s : ys[e] * (gs[e] - s);
        store_vec<T, V>(dx + off + c, pack<T>(gs));
      }
    }
  }
}

// ---------------- rows staged in shared memory: blockDim = (threads, 1), one row per block ----------------

// D / V vectors of 16 bytes in dynamic shared memory (D * sizeof(T) bytes); V * sizeof(T) == 16.
template <class T, bool LOG, int V>
__global__ void __launch_bounds__(512) softmax_fwd_smem(const T* __restrict__ x, T* __restrict__ y, i64 rows, i64 D) {
  typedef compute_t<T> A;
  __shared__ A red[32];
  extern __shared__ __align__(16) unsigned char row_smem[];
  const Vec<T, V>* srow = reinterpret_cast<const Vec<T, V>*>(row_smem);
  const int nvec = static_cast<int>(D / V);  // at most 64 KiB of row
  for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    stage_row<T, V>(row_smem, x + row * D, nvec);
    A m = neg_infinity<A>();
    for (int i = threadIdx.x; i < nvec; i += blockDim.x) {
      A xs[V];
      unpack(srow[i], xs);
#pragma unroll
      for (int j = 0; j < V; ++j) m = RowMax()(m, xs[j]);
    }
    m = row_allreduce(m, RowMax(), red);
    A s = A(0);
    for (int i = threadIdx.x; i < nvec; i += blockDim.x) {
      A xs[V];
      unpack(srow[i], xs);
#pragma unroll
      for (int j = 0; j < V; ++j) s += softmax_exp<T>(xs[j] - m);
    }
    s = row_allreduce(s, RowSum(), red);
    const A inv = A(1) / s, ls = m_log(s);
    T* yr = y + row * D;
    for (int i = threadIdx.x; i < nvec; i += blockDim.x) {
      A xs[V];
      unpack(srow[i], xs);
#pragma unroll
      for (int j = 0; j < V; ++j) xs[j] = softmax_value<T, LOG>(xs[j], m, inv, ls);
      store_vec<T, V>(yr + static_cast<i64>(i) * V, pack<T>(xs));
    }
    __syncthreads();  // every thread is done with this row before the next one's copies land
  }
}

// ---------------- rows too long for registers: blockDim = (threads, 1), one row per block ----------------

template <class T, bool LOG, int V>
__global__ void __launch_bounds__(1024) softmax_fwd_stream(const T* __restrict__ x, T* __restrict__ y, i64 rows, i64 D) {
  typedef compute_t<T> A;
  __shared__ A red[256];
  for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * D;
    // Online (max, sum): s is the sum of exp(x - m) over this thread's elements so far.
    A m = neg_infinity<A>(), s = A(0);
    for (i64 c = static_cast<i64>(threadIdx.x) * V; c < D; c += static_cast<i64>(blockDim.x) * V) {
      Vec<T, V> v = load_vec<T, V>(xr + c);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        A a = static_cast<A>(to_compute(v.v[j]));
        if (a > m) {  // a new maximum rescales the sum; exp(a - a) is NaN for a = +inf, as the max-shift gives
          s = s * softmax_exp<T>(m - a) + softmax_exp<T>(a - a);  // m = -inf at first: exp(-inf) = 0
          m = a;
        } else if (a != neg_infinity<A>()) {
          s += softmax_exp<T>(a - m);  // NaN inputs make s NaN, as they should
        }
      }
    }
    A M = row_allreduce(m, RowMax(), red);
    // A thread that saw only -inf adds nothing; one whose s is NaN (it saw a NaN but no finite
    // value, so m stayed -inf) must still make the row NaN, as PyTorch's max-shift does.
    s = row_allreduce(m == neg_infinity<A>() && !is_nan(s) ? A(0) : s * softmax_exp<T>(m - M), RowSum(), red);
    const A inv = A(1) / s, ls = m_log(s);
    T* yr = y + row * D;
    for (i64 c = static_cast<i64>(threadIdx.x) * V; c < D; c += static_cast<i64>(blockDim.x) * V) {
      Vec<T, V> v = load_vec<T, V>(xr + c), o;
#pragma unroll
      for (int j = 0; j < V; ++j) o.v[j] = cast<T>(softmax_value<T, LOG>(static_cast<A>(to_compute(v.v[j])), M, inv, ls));
      store_vec<T, V>(yr + c, o);
    }
  }
}

template <class T, bool LOG, int V>
__global__ void __launch_bounds__(1024) softmax_bwd_stream(const T* __restrict__ g, const T* __restrict__ y,
                                                           T* __restrict__ dx, i64 rows, i64 D) {
  typedef compute_t<T> A;
  __shared__ A red[256];
  for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const i64 off = row * D;
    A s = A(0);
    for (i64 c = static_cast<i64>(threadIdx.x) * V; c < D; c += static_cast<i64>(blockDim.x) * V) {
      Vec<T, V> gv = load_vec<T, V>(g + off + c), yv = load_vec<T, V>(y + off + c);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        A gj = static_cast<A>(to_compute(gv.v[j]));
        s += LOG ? gj : gj * static_cast<A>(to_compute(yv.v[j]));
      }
    }
    s = row_allreduce(s, RowSum(), red);
    for (i64 c = static_cast<i64>(threadIdx.x) * V; c < D; c += static_cast<i64>(blockDim.x) * V) {
      Vec<T, V> gv = load_vec<T, V>(g + off + c), yv = load_vec<T, V>(y + off + c), o;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        A gj = static_cast<A>(to_compute(gv.v[j])), yj = static_cast<A>(to_compute(yv.v[j]));
        o.v[j] = cast<T>(LOG ? gj - softmax_exp<T>(yj) * s : yj * (gj - s));
      }
      store_vec<T, V>(dx + off + c, o);
    }
  }
}

// ---------------- a dim that is not the last: [outer, D, inner], one thread per column ----------------

template <class T, bool LOG>
__global__ void softmax_cols_fwd(const T* __restrict__ x, T* __restrict__ y, i64 outer, i64 D, i64 inner) {
  typedef compute_t<T> A;
  const i64 n = outer * inner;
  for (i64 col = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; col < n; col += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 base = (col / inner) * D * inner + col % inner;
    A m = neg_infinity<A>(), s = A(0);
    for (i64 d = 0; d < D; ++d) {
      A a = static_cast<A>(to_compute(x[base + d * inner]));
      if (a > m) {
        s = s * softmax_exp<T>(m - a) + softmax_exp<T>(a - a);
        m = a;
      } else if (a != neg_infinity<A>()) {
        s += softmax_exp<T>(a - m);
      }
    }
    const A inv = A(1) / s, ls = m_log(s);
    for (i64 d = 0; d < D; ++d)
      y[base + d * inner] = cast<T>(softmax_value<T, LOG>(static_cast<A>(to_compute(x[base + d * inner])), m, inv, ls));
  }
}

template <class T, bool LOG>
__global__ void softmax_cols_bwd(const T* __restrict__ g, const T* __restrict__ y, T* __restrict__ dx, i64 outer, i64 D,
                                 i64 inner) {
  typedef compute_t<T> A;
  const i64 n = outer * inner;
  for (i64 col = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; col < n; col += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 base = (col / inner) * D * inner + col % inner;
    A s = A(0);
    for (i64 d = 0; d < D; ++d) {
      A gj = static_cast<A>(to_compute(g[base + d * inner]));
      s += LOG ? gj : gj * static_cast<A>(to_compute(y[base + d * inner]));
    }
    for (i64 d = 0; d < D; ++d) {
      const i64 o = base + d * inner;
      A gj = static_cast<A>(to_compute(g[o])), yj = static_cast<A>(to_compute(y[o]));
      dx[o] = cast<T>(LOG ? gj - softmax_exp<T>(yj) * s : yj * (gj - s));
    }
  }
}

}  // namespace flame

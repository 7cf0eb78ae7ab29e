// Loss kernels: cross-entropy from logits (class-index or class-probability targets, label
// smoothing, class weights) and nll_loss. Host code: src/ops/loss.cpp.
//
// Cross-entropy is fused. The forward kernel reads each logits row once, keeping an online
// (max, sum of exp) pair per thread that is merged across the row's threads, plus the few sums that
// label smoothing and probability targets need; it writes the row's loss, the row's weight and the
// row's logsumexp (in the accumulation type A: f32, or f64 for f64 logits). The backward kernel
// reads the row once more and writes the gradient
//     coef * (softmax(x) * a - target_distribution)
// so forward + backward move 3 x M x C elements: the logits twice, the gradient once.
// When the forward is recorded with class indices and a scalar reduction, ce_index_fwd_grad also
// writes the gradient for an upstream gradient of 1 (what loss.backward() seeds): each row is read
// from DRAM once, backwards, and again forwards for the gradient, from L2 (the host caps the rows
// in flight so that they fit), so forward + backward move 2 x M x C elements. On sm_90, rows too
// long for that to work well but short enough for shared memory go to ce_index_fwd_grad_smem,
// which reads each row from DRAM once into shared memory (bulk copies) and never again.
//
// Rows are handled by one warp (C <= 1024: several rows per block) or by one block (larger C).
// V elements move per access (16 bytes when the row length and pointers allow, else 1), and U such
// accesses are issued before they are used so that enough loads are in flight to saturate memory.
// Class indices are checked on the device: a bad one is reported through device_error.cuh and its
// row's loss and gradient are NaN.
#pragma once
#include "common.cuh"
#include "device_error.cuh"
#include "mma.cuh"

namespace flame {

// exp in f32 as one exp2 (the MUFU instruction) of a pre-scaled argument: the relative error stays
// near 1e-6 for the arguments that matter (x - max in [-30, 0]), and the kernel stays memory-bound.
__device__ __forceinline__ float l_exp(float x) { return exp2f(x * 1.4426950408889634f); }
__device__ __forceinline__ double l_exp(double x) { return exp(x); }

template <class A> __device__ __forceinline__ A l_neg_inf();
template <> __device__ __forceinline__ float l_neg_inf<float>() { return -__int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double l_neg_inf<double>() { return -__longlong_as_double(0x7ff0000000000000ll); }
template <class A> __device__ __forceinline__ A l_nan();
template <> __device__ __forceinline__ float l_nan<float>() { return __int_as_float(0x7fffffff); }
template <> __device__ __forceinline__ double l_nan<double>() { return __longlong_as_double(0x7ff8000000000000ll); }

// ---------------------------------------------------------------- row statistics

template <class A> struct RowStats {
  A m, s;     // running max and sum of exp(x - m)
  A wx;       // sum of w_c (x_c - ref): label smoothing
  A wt, wtx;  // sum of w_c t_c and of w_c t_c (x_c - ref): probability targets
};
// ref is the row's first logit (0 when it is not finite): sums of x taken relative to it keep their
// precision when all logits share a large offset.

template <class A> __device__ __forceinline__ RowStats<A> rs_init() { return {l_neg_inf<A>(), A(0), A(0), A(0), A(0)}; }

// exp(from - to) for to >= from, exact 1 when equal (also for two -inf: nothing was summed yet).
template <class A> __device__ __forceinline__ A rs_rescale(A from, A to) { return from == to ? A(1) : l_exp(from - to); }

template <class A> __device__ __forceinline__ void rs_merge(RowStats<A>& a, const RowStats<A>& b) {
  A m = b.m > a.m ? b.m : a.m;
  a.s = a.s * rs_rescale(a.m, m) + b.s * rs_rescale(b.m, m);
  a.m = m;
  a.wx += b.wx;
  a.wt += b.wt;
  a.wtx += b.wtx;
}

// Adds V logits to the (max, sum) pair with one rescale.
template <class A, int V> __device__ __forceinline__ void rs_add(RowStats<A>& st, const A (&x)[V]) {
  A vm = x[0];
#pragma unroll
  for (int k = 1; k < V; ++k) vm = x[k] > vm ? x[k] : vm;
  if (vm > st.m) {
    st.s *= rs_rescale(st.m, vm);
    st.m = vm;
  }
  if (st.m == l_neg_inf<A>()) {  // only -inf (or NaN) so far: exp(x - m) would be NaN for x = -inf
#pragma unroll
    for (int k = 0; k < V; ++k)
      if (is_nan(x[k])) st.s = x[k];  // NaN propagates to the loss, as in PyTorch
    return;
  }
#pragma unroll
  for (int k = 0; k < V; ++k) st.s += l_exp(x[k] - st.m);
}

template <class A> __device__ __forceinline__ RowStats<A> rs_shfl_down(const RowStats<A>& v, int o) {
  RowStats<A> r;
  r.m = __shfl_down_sync(0xffffffffu, v.m, o);
  r.s = __shfl_down_sync(0xffffffffu, v.s, o);
  r.wx = __shfl_down_sync(0xffffffffu, v.wx, o);
  r.wt = __shfl_down_sync(0xffffffffu, v.wt, o);
  r.wtx = __shfl_down_sync(0xffffffffu, v.wtx, o);
  return r;
}

template <class A> __device__ __forceinline__ RowStats<A> rs_warp_reduce(RowStats<A> v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    RowStats<A> other = rs_shfl_down(v, o);
    rs_merge(v, other);
  }
  return v;  // valid in lane 0
}

// The whole block works on one row; the result is valid in thread 0.
template <class A> __device__ RowStats<A> rs_block_reduce(RowStats<A> v, RowStats<A>* smem) {
  v = rs_warp_reduce(v);
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();  // smem may still be read for the previous row
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < nw ? smem[lane] : rs_init<A>();
    v = rs_warp_reduce(v);
  }
  return v;
}

// ---------------------------------------------------------------- rows to threads

struct RowGroup {
  i64 first, step;  // the group's first row and the distance to its next one
  int lane, size;   // this thread's place in the group and the group's size
};

template <bool WarpRow> __device__ __forceinline__ RowGroup row_group() {
  if constexpr (WarpRow) {
    int per_block = blockDim.x >> 5;
    return {static_cast<i64>(blockIdx.x) * per_block + (threadIdx.x >> 5), static_cast<i64>(gridDim.x) * per_block,
            static_cast<int>(threadIdx.x & 31), 32};
  } else {
    return {static_cast<i64>(blockIdx.x), static_cast<i64>(gridDim.x), static_cast<int>(threadIdx.x),
            static_cast<int>(blockDim.x)};
  }
}

template <bool WarpRow, class A> __device__ __forceinline__ RowStats<A> rs_reduce(const RowStats<A>& v, RowStats<A>* smem) {
  if constexpr (WarpRow) return rs_warp_reduce(v);
  else return rs_block_reduce(v, smem);
}

constexpr int kLossUnroll = 4;  // V-element accesses in flight per thread

template <class T, int V> __device__ __forceinline__ Vec<T, V> load_vec(const T* p) { return *reinterpret_cast<const Vec<T, V>*>(p); }

template <class A> __device__ __forceinline__ A finite_or_zero(A x) { return x - x == A(0) ? x : A(0); }

// Calls f(c, xs) for the accesses c0 + u * stride (u < kLossUnroll) of a row of C elements, all
// loads issued first (c: first column of V elements).
template <int V, class T, class A, class F>
__device__ __forceinline__ void row_chunk(const T* __restrict__ row, i64 C, i64 c0, i64 stride, F& f) {
  Vec<T, V> v[kLossUnroll];
#pragma unroll
  for (int u = 0; u < kLossUnroll; ++u)
    if (c0 + u * stride < C) v[u] = load_vec<T, V>(row + c0 + u * stride);
#pragma unroll
  for (int u = 0; u < kLossUnroll; ++u) {
    i64 c = c0 + u * stride;
    if (c < C) {
      A xs[V];
#pragma unroll
      for (int k = 0; k < V; ++k) xs[k] = static_cast<A>(to_compute(v[u].v[k]));
      f(c, xs);
    }
  }
}

// Calls f(c, xs) for the group's share of a row of C elements, V at a time (c: first column).
template <int V, class T, class A, class F>
__device__ __forceinline__ void for_row(const T* __restrict__ row, i64 C, const RowGroup& grp, F&& f) {
  const i64 stride = static_cast<i64>(grp.size) * V;
  for (i64 c0 = static_cast<i64>(grp.lane) * V; c0 < C; c0 += stride * kLossUnroll) row_chunk<V, T, A>(row, C, c0, stride, f);
}

// for_row with the chunks in reverse order: the row's start is then read last, and it is where the
// following forward pass over the same row begins, so that pass finds it in L2 (as llm.c does).
template <int V, class T, class A, class F>
__device__ __forceinline__ void for_row_reversed(const T* __restrict__ row, i64 C, const RowGroup& grp, F&& f) {
  const i64 stride = static_cast<i64>(grp.size) * V, chunk = stride * kLossUnroll, first = static_cast<i64>(grp.lane) * V;
  if (first >= C) return;
  for (i64 k = (C - 1 - first) / chunk; k >= 0; --k) row_chunk<V, T, A>(row, C, first + k * chunk, stride, f);
}

// A 16-byte store marked evict-first (st.global.cs): the gradient streams out without evicting the
// logits rows that wait in L2 for their second read. Other widths: a plain store.
template <class T, int V> __device__ __forceinline__ void store_streaming(T* p, const Vec<T, V>& v) {
  if constexpr (sizeof(Vec<T, V>) == 16) {
    const unsigned* u = reinterpret_cast<const unsigned*>(&v);
    asm volatile("st.global.cs.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(u[0]), "r"(u[1]), "r"(u[2]), "r"(u[3]) : "memory");
  } else {
    *reinterpret_cast<Vec<T, V>*>(p) = v;
  }
}

// ---------------------------------------------------------------- cross-entropy, class indices

// The row of an ignored or out-of-range target t (lane 0 writes): loss and weight 0, or NaN and a
// device error report for a bad index. Returns whether the index is bad.
template <class A>
__device__ __forceinline__ bool ce_skip_row(i64 t, i64 r, i64 C, i64 ignore_index, bool lane0, A* loss, A* wrow, A* lse,
                                            DeviceErrorRecord* err, unsigned int err_source) {
  const bool bad = t != ignore_index;
  if (lane0) {
    if (bad) report_bad_index(err, err_source, t, r, C);
    loss[r] = bad ? l_nan<A>() : A(0);
    wrow[r] = bad ? l_nan<A>() : A(0);
    lse[r] = A(0);
  }
  return bad;
}

// Adds the V logits xs of columns c.. to a row's statistics: (max, sum of exp), and with smoothing
// the sum of w_c (x_c - ref).
template <int V, class A>
__device__ __forceinline__ void ce_stats_add(RowStats<A>& st, i64 c, const A (&xs)[V], const A* weight, bool smooth, A ref) {
  rs_add(st, xs);
  if (smooth) {
#pragma unroll
    for (int k = 0; k < V; ++k) st.wx += (weight ? weight[c + k] : A(1)) * (xs[k] - ref);
  }
}

// The group's share of a row's statistics (ce_stats_add over its columns). REVERSED reads the row
// from its end (see for_row_reversed).
template <int V, bool REVERSED, class T, class A>
__device__ __forceinline__ RowStats<A> ce_row_stats(const T* xr, i64 C, const RowGroup& grp, const A* weight, bool smooth,
                                                    A ref) {
  RowStats<A> st = rs_init<A>();
  auto add = [&](i64 c, const A (&xs)[V]) { ce_stats_add(st, c, xs, weight, smooth, ref); };
  if constexpr (REVERSED) for_row_reversed<V, T, A>(xr, C, grp, add);
  else for_row<V, T, A>(xr, C, grp, add);
  return st;
}

// Lane 0 writes the row's loss (formula below), its target weight and its logsumexp st.m + lg.
template <class T, class A>
__device__ __forceinline__ void ce_write_row(const T* xr, i64 r, i64 t, const RowStats<A>& st, A lg, A wt, A W, A ref,
                                             double eps, i64 C, bool smooth, A* loss, A* wrow, A* lse) {
  const A xt = static_cast<A>(to_compute(xr[t]));
  A out = static_cast<A>(1.0 - eps) * wt * ((st.m - xt) + lg);
  if (smooth) out += static_cast<A>(eps / static_cast<double>(C)) * (W * ((st.m - ref) + lg) - st.wx);
  loss[r] = out;
  wrow[r] = wt;
  lse[r] = st.m + lg;
}

// Per row r with target t (not ignore_index), weights w (1 when weight is null), W = sum w
// (*wsum, or C), eps = label smoothing, lse = logsumexp of the row:
//   loss = (1 - eps) w_t (lse - x_t) + eps / C (W lse - sum_c w_c x_c);  wrow = w_t
// Ignored rows: loss 0 and wrow 0. Bad indices: NaN and a device error report.
template <int V, bool WarpRow, class T, class I, class A>
__global__ void ce_index_fwd(const T* __restrict__ x, const I* __restrict__ target, const A* __restrict__ weight,
                             const A* __restrict__ wsum, i64 M, i64 C, i64 ignore_index, double eps,
                             A* __restrict__ loss, A* __restrict__ wrow, A* __restrict__ lse,
                             DeviceErrorRecord* err, unsigned int err_source) {
  __shared__ RowStats<A> smem[32];
  const RowGroup grp = row_group<WarpRow>();
  const bool smooth = eps != 0.0;
  for (i64 r = grp.first; r < M; r += grp.step) {
    const i64 t = static_cast<i64>(target[r]);
    if (t == ignore_index || t < 0 || t >= C) {  // uniform over the group: no reduction below
      ce_skip_row(t, r, C, ignore_index, grp.lane == 0, loss, wrow, lse, err, err_source);
      continue;
    }
    const T* xr = x + r * C;
    const A ref = smooth ? finite_or_zero(static_cast<A>(to_compute(xr[0]))) : A(0);
    RowStats<A> st = rs_reduce<WarpRow>(ce_row_stats<V, false>(xr, C, grp, weight, smooth, ref), smem);
    if (grp.lane == 0) {
      const A lg = m_log(st.s);  // lse - max: differences to lse are taken as (max - x) + lg, exactly
      ce_write_row(xr, r, t, st, lg, weight ? weight[t] : A(1), weight ? *wsum : static_cast<A>(C), ref, eps, C, smooth,
                   loss, wrow, lse);
    }
  }
}

// One row's gradient coef (p_c a - (1 - eps) w_t [c == t] - eps / C w_c), p = softmax of the row,
// a = (1 - eps) w_t + eps W / C; coef: the row's upstream gradient over the reduction's divisor.
template <class A> struct CeRowGrad {
  A bt, bs, bW, a, l;  // the one-hot part, the uniform part per unit weight, bs W, bt + bW, logsumexp
  i64 t;
  __device__ __forceinline__ CeRowGrad(A coef, A wt, A W, double eps, i64 C, A lse, i64 target)
      : bt(static_cast<A>(1.0 - eps) * wt * coef), bs(static_cast<A>(eps / static_cast<double>(C)) * coef), bW(bs * W),
        a(bt + bW), l(lse), t(target) {}
  // The gradient at column c of logit x; wc: the weight of class c (read only with smoothing).
  __device__ __forceinline__ A operator()(i64 c, A x, A wc, bool smooth) const {
    if (c != t) return off_target(x, wc, smooth);
    // At the target p a - bt - w = (p - 1) bt + (p bW - w), with p - 1 from expm1: no cancellation
    // when p -> 1 (and exactly 0 for C = 1).
    return m_expm1(x - l) * bt + (l_exp(x - l) * bW - (smooth ? bs * wc : A(0)));
  }
  // The same at a column known not to be the target.
  __device__ __forceinline__ A off_target(A x, A wc, bool smooth) const { return l_exp(x - l) * a - (smooth ? bs * wc : A(0)); }
};

// The gradient of the V columns c.. of a row with logits xs, in T.
template <class T, int V, class A>
__device__ __forceinline__ Vec<T, V> ce_grad_vec(const CeRowGrad<A>& rg, i64 c, const A (&xs)[V], const A* weight,
                                                 bool smooth) {
  const bool has_target = rg.t >= c && rg.t < c + V;  // one test per vector, not per element
  Vec<T, V> o;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const A wc = smooth && weight ? weight[c + k] : A(1);
    o.v[k] = cast<T>(has_target ? rg(c + k, xs[k], wc, smooth) : rg.off_target(xs[k], wc, smooth));
  }
  return o;
}

template <bool Streaming, class T, int V> __device__ __forceinline__ void store_grad_vec(T* p, const Vec<T, V>& v) {
  if constexpr (Streaming) store_streaming(p, v);
  else *reinterpret_cast<Vec<T, V>*>(p) = v;
}

// Fills a gradient row of C elements with 0 (ignored target) or NaN (bad index). Its first element
// lies `off` elements past a V-element boundary (0 except for rows staged in shared memory, below):
// whole V-element vectors are single stores, the rest of a partial first or last vector element-wise.
template <int V, bool Streaming, class A, class T>
__device__ __forceinline__ void ce_fill_row(T* gr, i64 C, int off, const RowGroup& grp, bool bad) {
  const T e = cast<T>(bad ? l_nan<A>() : A(0));
  Vec<T, V> fill;
#pragma unroll
  for (int k = 0; k < V; ++k) fill.v[k] = e;
  const i64 nv = (C + off + V - 1) / V;
  for (i64 j = grp.lane; j < nv; j += grp.size) {
    const i64 c = j * V - off;
    if (c >= 0 && c + V <= C) {
      store_grad_vec<Streaming>(gr + c, fill);
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k)
        if (c + k >= 0 && c + k < C) gr[c + k] = e;
    }
  }
}

__device__ __forceinline__ bool ce_skipped(i64 t, i64 C, i64 ignore_index) { return t == ignore_index || t < 0 || t >= C; }

// The row loop of the kernels that write the gradient, rows handed out by row group. A row whose
// target t is ignored or out of range (uniform over the group: no reduction follows) gets a
// gradient row of 0 or NaN and then skip(r, t); every other row gets row(r, t).
template <int V, bool Streaming, class A, class T, class I, class Skip, class Row>
__device__ __forceinline__ void ce_grad_rows(const I* __restrict__ target, i64 M, i64 C, i64 ignore_index,
                                             T* __restrict__ grad, const RowGroup& grp, Skip&& skip, Row&& row) {
  for (i64 r = grp.first; r < M; r += grp.step) {
    const i64 t = static_cast<i64>(target[r]);
    if (ce_skipped(t, C, ignore_index)) {
      ce_fill_row<V, Streaming, A>(grad + r * C, C, 0, grp, t != ignore_index);
      skip(r, t);
    } else {
      row(r, t);
    }
  }
}

// grad[r, c] = CeRowGrad with coef = g[r * g_stride] * scale / (*denom when given).
template <int V, bool WarpRow, class T, class I, class A>
__global__ void ce_index_bwd(const T* __restrict__ x, const I* __restrict__ target, const A* __restrict__ weight,
                             const A* __restrict__ wsum, const A* __restrict__ lse, const A* __restrict__ g, i64 g_stride,
                             const A* __restrict__ denom, double scale, i64 M, i64 C, i64 ignore_index, double eps,
                             T* __restrict__ grad, DeviceErrorRecord* err, unsigned int err_source) {
  const RowGroup grp = row_group<WarpRow>();
  const bool smooth = eps != 0.0;
  ce_grad_rows<V, false, A>(
      target, M, C, ignore_index, grad, grp,
      [&](i64 r, i64 t) {
        if (t != ignore_index && grp.lane == 0) report_bad_index(err, err_source, t, r, C);
      },
      [&](i64 r, i64 t) {
        A coef = g[r * g_stride] * static_cast<A>(scale);
        if (denom) coef /= *denom;
        const CeRowGrad<A> rg(coef, weight ? weight[t] : A(1), weight ? *wsum : static_cast<A>(C), eps, C, lse[r], t);
        T* gr = grad + r * C;
        for_row<V, T, A>(x + r * C, C, grp, [&](i64 c, const A (&xs)[V]) {
          store_grad_vec<false>(gr + c, ce_grad_vec<T>(rg, c, xs, weight, smooth));
        });
      });
}

// ---------------------------------------------------------------- cross-entropy, class indices, with the gradient

// The weight of each row's target (0 when ignored, NaN for a bad index: reported by the main
// kernel), summed on the host side into the divisor of reduction mean before the main kernel runs.
template <class I, class A>
__global__ void ce_target_weight(const I* __restrict__ target, const A* __restrict__ weight, i64 M, i64 C, i64 ignore_index,
                                 A* __restrict__ wrow) {
  for (i64 r = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; r < M; r += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 t = static_cast<i64>(target[r]);
    wrow[r] = t == ignore_index ? A(0) : (t < 0 || t >= C) ? l_nan<A>() : weight ? weight[t] : A(1);
  }
}

// The group's combined statistics in every thread of the group.
template <bool WarpRow, class A> __device__ __forceinline__ RowStats<A> rs_reduce_all(const RowStats<A>& v, RowStats<A>* smem,
                                                                                   RowStats<A>* total) {
  RowStats<A> r = rs_reduce<WarpRow>(v, smem);
  if constexpr (WarpRow) {
    r.m = __shfl_sync(0xffffffffu, r.m, 0);
    r.s = __shfl_sync(0xffffffffu, r.s, 0);
    r.wx = __shfl_sync(0xffffffffu, r.wx, 0);
  } else {
    if (threadIdx.x == 0) *total = r;
    __syncthreads();  // the next row's writes to *total come after two more barriers (rs_block_reduce)
    r = *total;
  }
  return r;
}

// A row of the fused kernels after its statistics (st, in every thread of the group): lane 0 writes
// the row's loss, weight and logsumexp (ce_write_row); returns the row's gradient for an upstream
// gradient of 1: CeRowGrad with coef = 1 / *denom (reduction mean) or 1 (sum).
template <class T, class A>
__device__ __forceinline__ CeRowGrad<A> ce_seed_row(const T* xr, i64 r, i64 t, const RowStats<A>& st, A ref, const A* weight,
                                                    const A* wsum, const A* denom, double eps, i64 C, bool smooth, bool lane0,
                                                    A* loss, A* wrow, A* lse) {
  const A lg = m_log(st.s);  // lse - max: differences to lse are taken as (max - x) + lg, exactly
  const A wt = weight ? weight[t] : A(1);
  const A W = weight ? *wsum : static_cast<A>(C);
  if (lane0) ce_write_row(xr, r, t, st, lg, wt, W, ref, eps, C, smooth, loss, wrow, lse);
  return CeRowGrad<A>(denom ? A(1) / *denom : A(1), wt, W, eps, C, st.m + lg, t);
}

// ce_index_fwd, and in the same pass over each row the gradient for an upstream gradient of 1
// (ce_seed_row; the denominator of reduction mean was summed before this kernel). The first read
// of a row (for the statistics) runs backwards, the second (for the gradient) forwards from where
// the first ended; the gradient is stored evict-first.
template <int V, bool WarpRow, class T, class I, class A>
__global__ void __launch_bounds__(1024)
    ce_index_fwd_grad(const T* __restrict__ x, const I* __restrict__ target, const A* __restrict__ weight,
                      const A* __restrict__ wsum, const A* __restrict__ denom, i64 M, i64 C, i64 ignore_index, double eps,
                      A* __restrict__ loss, A* __restrict__ wrow, A* __restrict__ lse, T* __restrict__ grad,
                      DeviceErrorRecord* err, unsigned int err_source) {
  __shared__ RowStats<A> smem[32];
  __shared__ RowStats<A> total;
  const RowGroup grp = row_group<WarpRow>();
  const bool smooth = eps != 0.0;
  ce_grad_rows<V, true, A>(
      target, M, C, ignore_index, grad, grp,
      [&](i64 r, i64 t) { ce_skip_row(t, r, C, ignore_index, grp.lane == 0, loss, wrow, lse, err, err_source); },
      [&](i64 r, i64 t) {
        const T* xr = x + r * C;
        const A ref = smooth ? finite_or_zero(static_cast<A>(to_compute(xr[0]))) : A(0);
        const RowStats<A> st = rs_reduce_all<WarpRow>(ce_row_stats<V, true>(xr, C, grp, weight, smooth, ref), smem, &total);
        const CeRowGrad<A> rg =
            ce_seed_row(xr, r, t, st, ref, weight, wsum, denom, eps, C, smooth, grp.lane == 0, loss, wrow, lse);
        T* gr = grad + r * C;
        for_row<V, T, A>(xr, C, grp, [&](i64 c, const A (&xs)[V]) {
          store_grad_vec<true>(gr + c, ce_grad_vec<T>(rg, c, xs, weight, smooth));
        });
      });
}

// ---------------------------------------------------------------- the same, the row in shared memory (sm_90)

// ce_index_fwd_grad_smem computes what ce_index_fwd_grad does, for rows that fit in shared memory,
// reading each row from DRAM exactly once: into shared memory, by bulk asynchronous copies (the
// tensor memory accelerator, no registers held by loads in flight); both passes read it there. One
// block per row, persistent over the rows (the grid is what stays resident). A row arrives in
// kCeChunks bulk copies, each completing its own mbarrier, so that the statistics pass starts on
// chunk 0 while the later chunks are in flight. When the gradient pass is done with chunk k (a
// block barrier), thread 0 issues chunk k of the block's next row into the same place: the next
// row's read overlaps this row's gradient stores. A row with an ignored or bad target is not read.
//
// Alignment: x is 16-byte aligned (the host checks), so row r starts off = (r C) mod V elements past
// a 16-byte boundary (V elements per 16 bytes). The row sits in shared memory at the same offset:
// 16-byte vector j holds columns j V - off .. j V - off + V - 1. Bulk copies move the whole vectors
// inside the row; the columns of a partial first or last vector (off != 0, or C + off not a multiple
// of V) are read from global memory and their gradient stored element by element. grad (16-byte
// aligned too) has x's offsets, so a whole vector's gradient is one 16-byte evict-first store.

constexpr int kCeChunks = 8;  // bulk copies per row, one mbarrier each

// 16-byte vectors of the shared-memory row, the most any offset needs (host mirror: src/ops/loss.cpp).
__device__ __forceinline__ i64 ce_smem_vectors(i64 C, int V) { return (C + 2 * V - 2) / V; }

// Row r's place in shared memory (see above).
struct SmemRow {
  int off;     // elements between the 16-byte boundary before the row and its first element
  i64 nv;      // vectors that hold the row
  i64 b0, b1;  // the whole vectors [b0, b1), brought by bulk copy
  __device__ __forceinline__ SmemRow(i64 r, i64 C, int V)
      : off(static_cast<int>((r * C) % V)), nv((C + off + V - 1) / V), b0(off != 0 ? 1 : 0), b1((C + off) / V) {}
};

#if __CUDA_ARCH__ >= 900
// mbarrier and bulk copy (PTX ISA 8.0, sm_90): an mbarrier phase completes when its pending arrival
// (count 1: thread 0's arrive.expect_tx) has arrived and the bytes it expects have landed.
__device__ __forceinline__ void mbar_init(u64* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive_expect_tx(u64* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
// Waits until the phase of the given parity (0 for the barrier's first phase) has completed.
__device__ __forceinline__ void mbar_wait(u64* bar, unsigned parity) {
  unsigned done;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  } while (!done);
}
// bytes (a multiple of 16) from global src to shared dst (both 16-byte aligned), completing on bar.
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, unsigned bytes, u64* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}
// Orders this thread's earlier shared-memory accesses (and those it synchronised with) before later
// bulk copies: their writes must not overtake reads of the previous row.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
#endif

// Calls f(c, xs) for this thread's vectors j in [lo, hi) of a row staged in shared memory (xs: the
// V logits of columns c..), and f(c, x1) with one logit for each column of a partial vector, read
// from global memory (xr: the row there).
template <int V, class T, class A, class F>
__device__ __forceinline__ void ce_for_staged_vectors(const Vec<T, V>* srow, const T* xr, i64 C, const SmemRow& g, i64 lo,
                                                      i64 hi, F&& f) {
  for (i64 j = lo + threadIdx.x; j < hi; j += blockDim.x) {
    const i64 c = j * V - g.off;
    if (j >= g.b0 && j < g.b1) {
      const Vec<T, V> v = srow[j];
      A xs[V];
#pragma unroll
      for (int k = 0; k < V; ++k) xs[k] = static_cast<A>(to_compute(v.v[k]));
      f(c, xs);
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k)
        if (c + k >= 0 && c + k < C) {
          const A x1[1] = {static_cast<A>(to_compute(xr[c + k]))};
          f(c + k, x1);
        }
    }
  }
}

// ce_index_fwd_grad with the row staged in shared memory (see above): dynamic shared memory of
// ce_smem_vectors(C, V) * 16 bytes, V = 16 / sizeof(T); blockDim.x a multiple of 32. sm_90 and newer
// only (the host checks; on older GPUs it traps).
template <class T, class I, class A>
__global__ void __launch_bounds__(1024)
    ce_index_fwd_grad_smem(const T* __restrict__ x, const I* __restrict__ target, const A* __restrict__ weight,
                           const A* __restrict__ wsum, const A* __restrict__ denom, i64 M, i64 C, i64 ignore_index,
                           double eps, A* __restrict__ loss, A* __restrict__ wrow, A* __restrict__ lse,
                           T* __restrict__ grad, DeviceErrorRecord* err, unsigned int err_source) {
#if __CUDA_ARCH__ >= 900
  constexpr int V = 16 / static_cast<int>(sizeof(T));
  extern __shared__ __align__(128) unsigned char ce_row[];
  __shared__ RowStats<A> smem[32];
  __shared__ RowStats<A> total;
  __shared__ u64 bars[kCeChunks];
  const RowGroup grp = row_group<false>();
  const bool smooth = eps != 0.0;
  const i64 cs = (ce_smem_vectors(C, V) + kCeChunks - 1) / kCeChunks;  // vectors per chunk: fixed places for every row
  const Vec<T, V>* srow = reinterpret_cast<const Vec<T, V>*>(ce_row);
  // Thread 0: chunk k of row r (target t) into shared memory, nothing when the row is skipped; one
  // phase of bars[k] completes either way.
  auto issue = [&](i64 r, i64 t, int k) {
    const SmemRow g(r, C, V);
    const i64 lo = k * cs > g.b0 ? k * cs : g.b0, hi = (k + 1) * cs < g.b1 ? (k + 1) * cs : g.b1;
    const unsigned bytes = !ce_skipped(t, C, ignore_index) && hi > lo ? static_cast<unsigned>(hi - lo) * 16u : 0u;
    mbar_arrive_expect_tx(&bars[k], bytes);
    if (bytes) bulk_copy_g2s(ce_row + lo * 16, x + r * C - g.off + lo * V, bytes, &bars[k]);
  };
  if (threadIdx.x == 0) {
    for (int k = 0; k < kCeChunks; ++k) mbar_init(&bars[k], 1);
    mbar_init_fence();
  }
  __syncthreads();
  i64 r = blockIdx.x;
  i64 t = r < M ? static_cast<i64>(target[r]) : 0;
  if (threadIdx.x == 0 && r < M)
    for (int k = 0; k < kCeChunks; ++k) issue(r, t, k);
  for (unsigned parity = 0; r < M; parity ^= 1u) {  // each row completes one phase of every mbarrier
    const i64 rn = r + gridDim.x;
    const i64 tn = rn < M ? static_cast<i64>(target[rn]) : 0;
    const SmemRow g(r, C, V);
    const T* xr = x + r * C;
    T* gr = grad + r * C;
    if (ce_skipped(t, C, ignore_index)) {
      // This row reads no shared memory (the last row that did ended with a block barrier): the
      // next one may come now.
      if (threadIdx.x == 0 && rn < M)
        for (int k = 0; k < kCeChunks; ++k) issue(rn, tn, k);
      ce_skip_row(t, r, C, ignore_index, threadIdx.x == 0, loss, wrow, lse, err, err_source);
      ce_fill_row<V, true, A>(gr, C, g.off, grp, t != ignore_index);
    } else {
      const A ref = smooth ? finite_or_zero(static_cast<A>(to_compute(xr[0]))) : A(0);
      RowStats<A> st = rs_init<A>();
      for (int k = 0; k < kCeChunks; ++k) {
        mbar_wait(&bars[k], parity);  // every thread: the copy's writes become visible to the waiters
        const i64 hi = (k + 1) * cs < g.nv ? (k + 1) * cs : g.nv;
        ce_for_staged_vectors<V, T, A>(srow, xr, C, g, k * cs, hi,
                                       [&](i64 c, const auto& xs) { ce_stats_add(st, c, xs, weight, smooth, ref); });
      }
      st = rs_reduce_all<false>(st, smem, &total);
      const CeRowGrad<A> rg =
          ce_seed_row(xr, r, t, st, ref, weight, wsum, denom, eps, C, smooth, threadIdx.x == 0, loss, wrow, lse);
      for (int k = 0; k < kCeChunks; ++k) {
        const i64 hi = (k + 1) * cs < g.nv ? (k + 1) * cs : g.nv;
        ce_for_staged_vectors<V, T, A>(srow, xr, C, g, k * cs, hi, [&](i64 c, const auto& xs) {
          store_grad_vec<true>(gr + c, ce_grad_vec<T>(rg, c, xs, weight, smooth));  // one element: a plain store
        });
        __syncthreads();  // the block is done with chunk k
        if (threadIdx.x == 0 && rn < M) {
          fence_proxy_async();
          issue(rn, tn, k);
        }
      }
    }
    r = rn;
    t = tn;
  }
#else
  asm volatile("trap;");  // the host launches it on sm_90 and newer only
#endif
}

// ---------------------------------------------------------------- cross-entropy, class probabilities

// With t' = (1 - eps) t + eps / C and T = sum_c w_c t'_c (written to rowt for the backward):
//   loss = sum_c w_c t'_c (lse - x_c) = T lse - sum_c w_c t'_c x_c
template <int V, bool WarpRow, class T, class A>
__global__ void ce_prob_fwd(const T* __restrict__ x, const T* __restrict__ tgt, const A* __restrict__ weight,
                            const A* __restrict__ wsum, i64 M, i64 C, double eps, A* __restrict__ loss,
                            A* __restrict__ rowt, A* __restrict__ lse) {
  __shared__ RowStats<A> smem[32];
  const RowGroup grp = row_group<WarpRow>();
  const bool smooth = eps != 0.0;
  for (i64 r = grp.first; r < M; r += grp.step) {
    const T* xr = x + r * C;
    const T* tr = tgt + r * C;
    const A ref = finite_or_zero(static_cast<A>(to_compute(xr[0])));
    RowStats<A> st = rs_init<A>();
    for_row<V, T, A>(xr, C, grp, [&](i64 c, const A (&xs)[V]) {
      rs_add(st, xs);
      Vec<T, V> tv = load_vec<T, V>(tr + c);  // same offsets as x: the same alignment
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const A w = weight ? weight[c + k] : A(1);
        const A wt = w * static_cast<A>(to_compute(tv.v[k]));
        st.wt += wt;
        st.wtx += wt * (xs[k] - ref);
        if (smooth) st.wx += w * (xs[k] - ref);
      }
    });
    st = rs_reduce<WarpRow>(st, smem);
    if (grp.lane == 0) {
      const A lg = m_log(st.s);
      const A keep = static_cast<A>(1.0 - eps), spread = static_cast<A>(eps / static_cast<double>(C));
      const A W = weight ? *wsum : static_cast<A>(C);
      const A tsum = keep * st.wt + (smooth ? spread * W : A(0));
      loss[r] = tsum * ((st.m - ref) + lg) - (keep * st.wtx + (smooth ? spread * st.wx : A(0)));
      rowt[r] = tsum;
      lse[r] = st.m + lg;
    }
  }
}

// grad[r, c] = coef (p_c T_r - w_c t'_c), coef = g[r * g_stride] * scale.
template <int V, bool WarpRow, class T, class A>
__global__ void ce_prob_bwd(const T* __restrict__ x, const T* __restrict__ tgt, const A* __restrict__ weight,
                            const A* __restrict__ lse, const A* __restrict__ rowt, const T* __restrict__ g, i64 g_stride,
                            double scale, i64 M, i64 C, double eps, T* __restrict__ grad) {
  const RowGroup grp = row_group<WarpRow>();
  const A keep = static_cast<A>(1.0 - eps), spread = static_cast<A>(eps / static_cast<double>(C));
  for (i64 r = grp.first; r < M; r += grp.step) {
    const A coef = static_cast<A>(to_compute(g[r * g_stride])) * static_cast<A>(scale);
    const A a = rowt[r] * coef, l = lse[r];
    const T* tr = tgt + r * C;
    T* gr = grad + r * C;
    for_row<V, T, A>(x + r * C, C, grp, [&](i64 c, const A (&xs)[V]) {
      Vec<T, V> tv = load_vec<T, V>(tr + c);
      Vec<T, V> o;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const A w = weight ? weight[c + k] : A(1);
        const A tp = keep * static_cast<A>(to_compute(tv.v[k])) + spread;
        o.v[k] = cast<T>(l_exp(xs[k] - l) * a - coef * w * tp);
      }
      *reinterpret_cast<Vec<T, V>*>(gr + c) = o;
    });
  }
}

// ---------------------------------------------------------------- nll_loss

// loss[r] = -w_t x[r, t] (x: log-probabilities with any row and column strides); wrow[r] = w_t.
template <class T, class I, class A>
__global__ void nll_fwd(const T* __restrict__ x, i64 row_stride, i64 col_stride, const I* __restrict__ target,
                        const A* __restrict__ weight, i64 M, i64 C, i64 ignore_index, A* __restrict__ loss,
                        A* __restrict__ wrow, DeviceErrorRecord* err, unsigned int err_source) {
  for (i64 r = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; r < M; r += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 t = static_cast<i64>(target[r]);
    if (t == ignore_index) {
      loss[r] = A(0);
      wrow[r] = A(0);
    } else if (t < 0 || t >= C) {
      report_bad_index(err, err_source, t, r, C);
      loss[r] = l_nan<A>();
      wrow[r] = l_nan<A>();
    } else {
      const A w = weight ? weight[t] : A(1);
      loss[r] = -w * static_cast<A>(to_compute(x[r * row_stride + t * col_stride]));
      wrow[r] = w;
    }
  }
}

// grad[r, c] = -wrow[r] coef at c == t, else 0 (NaN on rows with a bad index); one thread per element.
template <class T, class I, class A>
__global__ void nll_bwd(const I* __restrict__ target, const A* __restrict__ wrow, const T* __restrict__ g, i64 g_stride,
                        const A* __restrict__ denom, i64 M, i64 C, i64 ignore_index, T* __restrict__ grad) {
  const i64 n = M * C;
  for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 r = i / C, c = i - r * C;
    const i64 t = static_cast<i64>(target[r]);
    A v = A(0);
    if (t != ignore_index) {
      if (t < 0 || t >= C) {
        v = l_nan<A>();  // reported by the forward
      } else if (c == t) {
        A coef = static_cast<A>(to_compute(g[r * g_stride]));
        if (denom) coef /= *denom;
        v = -wrow[r] * coef;
      }
    }
    grad[i] = cast<T>(v);
  }
}

}  // namespace flame

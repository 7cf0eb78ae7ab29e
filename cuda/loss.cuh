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
// in flight so that they fit; the second read and the gradient's stores are marked evict-first, so
// that they do not push out the rows still waiting), so forward + backward move 2 x M x C elements.
// PLAIN kernels (no class weights, no label smoothing) drop that code at compile time.
//
// Rows are handled by one warp (C <= 1024: several rows per block) or by one block (larger C).
// V elements move per access (16 bytes when the row length and pointers allow, else 1), and U such
// accesses are issued before they are used so that enough loads are in flight to saturate memory.
// Class indices are checked on the device: a bad one is reported through device_error.cuh and its
// row's loss and gradient are NaN.
#pragma once
#include "common.cuh"
#include "device_error.cuh"

namespace flame {

// exp in f32 as one exp2 (the MUFU instruction, flushing subnormal results to 0: exp2f's subnormal
// handling costs 3 more instructions per element) of a pre-scaled argument: the relative error stays
// near 1e-6 for the arguments that matter (x - max in [-30, 0]), and the kernel stays memory-bound.
__device__ __forceinline__ float l_exp(float x) { return fast_exp2(x * kLog2e); }
__device__ __forceinline__ double l_exp(double x) { return exp(x); }
// exp(x - m) as l_exp_from(x, l_scaled(m)) with m scaled once per row: in f32 one FFMA and the exp2
// per element (x log2(e) is exact inside the FFMA; the rounding of m log2(e) moves the result by a
// relative |m| 2^-24). For the gradient's softmax; the row sums keep x - m exact (see rs_add).
__device__ __forceinline__ float l_scaled(float m) { return m * kLog2e; }
__device__ __forceinline__ double l_scaled(double m) { return m; }
__device__ __forceinline__ float l_exp_from(float x, float m_scaled) { return fast_exp2(fmaf(x, kLog2e, -m_scaled)); }
__device__ __forceinline__ double l_exp_from(double x, double m) { return exp(x - m); }
__device__ __forceinline__ float l_max(float a, float b) { return fmaxf(a, b); }  // one FMNMX
__device__ __forceinline__ double l_max(double a, double b) { return fmax(a, b); }

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
  A vm = x[0];  // (a NaN is skipped here; it reaches the sum below, which propagates it)
#pragma unroll
  for (int k = 1; k < V; ++k) vm = l_max(vm, x[k]);
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
  for (int k = 0; k < V; ++k) st.s += l_exp(x[k] - st.m);  // x - m exact: the max adds exactly 1 (a 1-class row's loss is 0)
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

// The second and last read of a row's 16-byte vector (the gradient pass of ce_index_fwd_grad), marked
// evict-first in L2 and not kept in L1: the rows still waiting for that read stay in L2 (without the
// mark a third of them was read from DRAM twice at 8192 x 50304). Other widths: a plain load.
template <class T, int V> __device__ __forceinline__ Vec<T, V> load_vec_last(const T* p) {
  if constexpr (sizeof(Vec<T, V>) == 16) {
    u64 policy;  // (the eviction priority goes with a policy; the direct .L2::evict_first form is 32-byte only)
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    Vec<T, V> v;
    unsigned* u = reinterpret_cast<unsigned*>(&v);
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(u[0]), "=r"(u[1]), "=r"(u[2]), "=r"(u[3])
        : "l"(p), "l"(policy));
    return v;
  } else {
    return load_vec<T, V>(p);
  }
}

// Calls f(c, xs) for the accesses c0 + u * stride (u < kLossUnroll) of a row of C elements, all
// loads issued first (c: first column of V elements; LAST: load_vec_last). In-row offsets are ints
// (the host keeps C below 2^31 - 2^20): 64-bit ones cost the address arithmetic a third of the loop.
template <int V, class T, class A, bool LAST, class F>
__device__ __forceinline__ void row_chunk(const T* __restrict__ row, int C, int c0, int stride, F& f) {
  Vec<T, V> v[kLossUnroll];
#pragma unroll
  for (int u = 0; u < kLossUnroll; ++u)
    if (c0 + u * stride < C) v[u] = LAST ? load_vec_last<T, V>(row + c0 + u * stride) : load_vec<T, V>(row + c0 + u * stride);
#pragma unroll
  for (int u = 0; u < kLossUnroll; ++u) {
    const int c = c0 + u * stride;
    if (c < C) {
      A xs[V];
      unpack(v[u], xs);
      f(static_cast<i64>(c), xs);
    }
  }
}

// Calls f(c, xs) for the group's share of a row of C elements, V at a time (c: first column).
template <int V, class T, class A, bool LAST = false, class F>
__device__ __forceinline__ void for_row(const T* __restrict__ row, i64 C, const RowGroup& grp, F&& f) {
  const int n = static_cast<int>(C), stride = grp.size * V;
  for (int c0 = grp.lane * V; c0 < n; c0 += stride * kLossUnroll) row_chunk<V, T, A, LAST>(row, n, c0, stride, f);
}

// for_row with the chunks in reverse order: the row's start is then read last, and it is where the
// following forward pass over the same row begins, so that pass finds it in L2 (as llm.c does).
template <int V, class T, class A, class F>
__device__ __forceinline__ void for_row_reversed(const T* __restrict__ row, i64 C, const RowGroup& grp, F&& f) {
  const int n = static_cast<int>(C), stride = grp.size * V, chunk = stride * kLossUnroll, first = grp.lane * V;
  if (first >= n) return;
  for (int k = (n - 1 - first) / chunk; k >= 0; --k) row_chunk<V, T, A, false>(row, n, first + k * chunk, stride, f);
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

// The row loop of the class-index gradient kernels, over the group's rows r with target t and
// gradient row gr. An ignored or out-of-range t (uniform over the group) gets skip(r, t), which
// returns whether t is bad, and a gradient row of NaN (bad) or 0, stored evict-first when STREAM;
// any other t gets row(r, t, gr).
template <int V, bool STREAM, class A, class T, class I, class Skip, class Row>
__device__ __forceinline__ void ce_index_grad_rows(const RowGroup& grp, const I* target, i64 M, i64 C, i64 ignore_index,
                                                   T* grad, Skip&& skip, Row&& row) {
  const i64 stride = static_cast<i64>(grp.size) * V;
  for (i64 r = grp.first; r < M; r += grp.step) {
    const i64 t = static_cast<i64>(target[r]);
    T* gr = grad + r * C;
    if (t == ignore_index || t < 0 || t >= C) {
      const bool bad = skip(r, t);
      Vec<T, V> fill;
#pragma unroll
      for (int k = 0; k < V; ++k) fill.v[k] = cast<T>(bad ? l_nan<A>() : A(0));
      for (i64 c = static_cast<i64>(grp.lane) * V; c < C; c += stride) {
        if constexpr (STREAM) store_streaming(gr + c, fill);
        else *reinterpret_cast<Vec<T, V>*>(gr + c) = fill;
      }
      continue;
    }
    row(r, t, gr);
  }
}

// The group's share of a row's statistics: running max and sum of exp, and with smoothing the sum
// of w_c (x_c - ref). REVERSED reads the row from its end (see for_row_reversed).
template <int V, bool REVERSED, class T, class A>
__device__ __forceinline__ RowStats<A> ce_row_stats(const T* xr, i64 C, const RowGroup& grp, const A* weight, bool smooth,
                                                    A ref) {
  RowStats<A> st = rs_init<A>();
  auto add = [&](i64 c, const A (&xs)[V]) {
    rs_add(st, xs);
    if (smooth) {
#pragma unroll
      for (int k = 0; k < V; ++k) st.wx += (weight ? weight[c + k] : A(1)) * (xs[k] - ref);
    }
  };
  if constexpr (REVERSED) for_row_reversed<V, T, A>(xr, C, grp, add);
  else for_row<V, T, A>(xr, C, grp, add);
  return st;
}

// Lane 0 writes the row's loss (formula below), its target weight and its logsumexp st.m + lg.
// xt: the target's logit.
template <class A>
__device__ __forceinline__ void ce_write_row(A xt, i64 r, const RowStats<A>& st, A lg, A wt, A W, A ref,
                                             double eps, i64 C, bool smooth, A* loss, A* wrow, A* lse) {
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
// PLAIN (here and in the kernels below): no class weights and no label smoothing, known at compile
// time, which takes their code out of the per-element loops.
template <int V, bool WarpRow, bool PLAIN, class T, class I, class A>
__global__ void ce_index_fwd(const T* __restrict__ x, const I* __restrict__ target, const A* __restrict__ weight,
                             const A* __restrict__ wsum, i64 M, i64 C, i64 ignore_index, double eps,
                             A* __restrict__ loss, A* __restrict__ wrow, A* __restrict__ lse,
                             DeviceErrorRecord* err, unsigned int err_source) {
  __shared__ RowStats<A> smem[32];
  const RowGroup grp = row_group<WarpRow>();
  if constexpr (PLAIN) weight = nullptr;
  const bool smooth = !PLAIN && eps != 0.0;
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
      ce_write_row(static_cast<A>(to_compute(xr[t])), r, st, lg, weight ? weight[t] : A(1), weight ? *wsum : static_cast<A>(C),
                   ref, eps, C, smooth, loss, wrow, lse);
    }
  }
}

// One row's gradient coef (p_c a - (1 - eps) w_t [c == t] - eps / C w_c), p = softmax of the row,
// a = (1 - eps) w_t + eps W / C; coef: the row's upstream gradient over the reduction's divisor.
template <class A> struct CeRowGrad {
  A bt, bs, bW, a, l, ls;  // the one-hot part, the uniform part per unit weight, bs W, bt + bW, logsumexp, l_scaled(l)
  i64 t;
  __device__ __forceinline__ CeRowGrad(A coef, A wt, A W, double eps, i64 C, A lse, i64 target)
      : bt(static_cast<A>(1.0 - eps) * wt * coef), bs(static_cast<A>(eps / static_cast<double>(C)) * coef), bW(bs * W),
        a(bt + bW), l(lse), ls(l_scaled(lse)), t(target) {}
  // The gradient at a column other than the target, of logit x; wc: the weight of its class (read
  // only with smoothing).
  __device__ __forceinline__ A other(A x, A wc, bool smooth) const {
    return smooth ? l_exp_from(x, ls) * a - bs * wc : l_exp_from(x, ls) * a;
  }
  // At the target p a - bt - w = (p - 1) bt + (p bW - w), with p - 1 from expm1: no cancellation
  // when p -> 1 (and exactly 0 for C = 1).
  __device__ __forceinline__ A at_target(A x, A wc, bool smooth) const {
    return m_expm1(x - l) * bt + (l_exp(x - l) * bW - (smooth ? bs * wc : A(0)));
  }
  // The gradient of the V columns from c: other() for each, then the target's column (when among
  // them: one test per vector, not per element) once more.
  template <class T, int V>
  __device__ __forceinline__ Vec<T, V> vec(i64 c, const A (&xs)[V], const A* weight, bool smooth) const {
    Vec<T, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) o.v[k] = cast<T>(other(xs[k], smooth && weight ? weight[c + k] : A(1), smooth));
    if (static_cast<unsigned long long>(t - c) < static_cast<unsigned long long>(V)) {
#pragma unroll
      for (int k = 0; k < V; ++k)
        if (c + k == t) o.v[k] = cast<T>(at_target(xs[k], smooth && weight ? weight[c + k] : A(1), smooth));
    }
    return o;
  }
};

// grad[r, c] = CeRowGrad with coef = g[r * g_stride] * scale / (*denom when given). (Launch bounds:
// the host launches up to 512 threads, and f64 rows with weights would take 142 registers.)
template <int V, bool WarpRow, bool PLAIN, class T, class I, class A>
__global__ void __launch_bounds__(512) ce_index_bwd(const T* __restrict__ x, const I* __restrict__ target, const A* __restrict__ weight,
                             const A* __restrict__ wsum, const A* __restrict__ lse, const A* __restrict__ g, i64 g_stride,
                             const A* __restrict__ denom, double scale, i64 M, i64 C, i64 ignore_index, double eps,
                             T* __restrict__ grad, DeviceErrorRecord* err, unsigned int err_source) {
  const RowGroup grp = row_group<WarpRow>();
  if constexpr (PLAIN) weight = nullptr;
  const bool smooth = !PLAIN && eps != 0.0;
  auto skip = [&](i64 r, i64 t) {
    const bool bad = t != ignore_index;
    if (bad && grp.lane == 0) report_bad_index(err, err_source, t, r, C);
    return bad;
  };
  ce_index_grad_rows<V, false, A>(grp, target, M, C, ignore_index, grad, skip, [&](i64 r, i64 t, T* gr) {
    A coef = g[r * g_stride] * static_cast<A>(scale);
    if (denom) coef /= *denom;
    const CeRowGrad<A> rg(coef, weight ? weight[t] : A(1), weight ? *wsum : static_cast<A>(C), eps, C, lse[r], t);
    for_row<V, T, A>(x + r * C, C, grp, [&](i64 c, const A (&xs)[V]) {
      *reinterpret_cast<Vec<T, V>*>(gr + c) = rg.template vec<T>(c, xs, weight, smooth);
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

// ce_index_fwd, and in the same pass over each row the gradient for an upstream gradient of 1:
// grad[r] = CeRowGrad with coef = 1 / *denom (reduction mean; the denominator was summed before
// this kernel) or 1 (sum). The first read of a row (for the statistics) runs backwards, the second
// (for the gradient) forwards from where the first ended; the gradient is stored evict-first.
template <int V, bool WarpRow, bool PLAIN, class T, class I, class A>
__global__ void __launch_bounds__(1024)
    ce_index_fwd_grad(const T* __restrict__ x, const I* __restrict__ target, const A* __restrict__ weight,
                      const A* __restrict__ wsum, const A* __restrict__ denom, i64 M, i64 C, i64 ignore_index, double eps,
                      A* __restrict__ loss, A* __restrict__ wrow, A* __restrict__ lse, T* __restrict__ grad,
                      DeviceErrorRecord* err, unsigned int err_source) {
  __shared__ RowStats<A> smem[32];
  __shared__ RowStats<A> total;
  const RowGroup grp = row_group<WarpRow>();
  if constexpr (PLAIN) weight = nullptr;
  const bool smooth = !PLAIN && eps != 0.0;
  auto skip = [&](i64 r, i64 t) {  // uniform over the group: no reduction in this row
    return ce_skip_row(t, r, C, ignore_index, grp.lane == 0, loss, wrow, lse, err, err_source);
  };
  ce_index_grad_rows<V, true, A>(grp, target, M, C, ignore_index, grad, skip, [&](i64 r, i64 t, T* gr) {
    const T* xr = x + r * C;
    const A ref = smooth ? finite_or_zero(static_cast<A>(to_compute(xr[0]))) : A(0);
    const RowStats<A> st = rs_reduce_all<WarpRow>(ce_row_stats<V, true>(xr, C, grp, weight, smooth, ref), smem, &total);
    const A lg = m_log(st.s);  // lse - max: differences to lse are taken as (max - x) + lg, exactly
    const A wt = weight ? weight[t] : A(1);
    const A W = weight ? *wsum : static_cast<A>(C);
    if (grp.lane == 0) ce_write_row(static_cast<A>(to_compute(xr[t])), r, st, lg, wt, W, ref, eps, C, smooth, loss, wrow, lse);
    const CeRowGrad<A> rg(denom ? A(1) / *denom : A(1), wt, W, eps, C, st.m + lg, t);
    for_row<V, T, A, true>(xr, C, grp, [&](i64 c, const A (&xs)[V]) { store_streaming(gr + c, rg.template vec<T>(c, xs, weight, smooth)); });
  });
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

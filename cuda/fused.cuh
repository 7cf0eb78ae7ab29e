// Fused elementwise expressions (flame_fused_compile): the kernels that apply one generated
// expression to FLAME_FUSED_INPUTS operands in one pass over memory. The runtime compiles this file
// behind a prelude it generates from a parsed expression (src/ops/fused_expr.cpp):
//   #include "functors.cuh"   (the elementwise ops' functors, which the expression calls)
//   #define FLAME_FUSED_INPUTS n
//   namespace flame { template <class C> C fused_expr(const C* x) { ... } }
// All operands and the output have one element type T (the call casts first); the expression runs
// in compute_t<T> (f32 for f16/bf16, f64 for f64) and is rounded once to T. Three layouts, as the
// elementwise kernels: fused_contig (every operand dense, V elements per aligned vector access),
// fused_rows (dense output; each operand dense or broadcast along the last axis, any outer strides:
// x * (1 + scale) + shift with scale [N, 1, C]), fused_strided (any strides, 64-bit indexing).
#pragma once
#include "common.cuh"

#ifndef FLAME_FUSED_INPUTS
#error "cuda/fused.cuh needs the generated prelude (FLAME_FUSED_INPUTS and fused_expr)"
#endif

namespace flame {

constexpr int kFusedMaxOperands = 16;  // mirrors src/ops/fused.h
constexpr int kFusedMaxDims = 8;

struct FusedPtrs {
  const void* in[kFusedMaxOperands];
};

// The V results of the expression over V loaded elements of every operand (fused_contig, fused_rows).
template <int V, class T>
__device__ __forceinline__ Vec<T, V> fused_eval_vec(const Vec<T, V> (&in)[FLAME_FUSED_INPUTS]) {
  using C = compute_t<T>;
  Vec<T, V> o;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    C x[FLAME_FUSED_INPUTS];
#pragma unroll
    for (int k = 0; k < FLAME_FUSED_INPUTS; ++k) x[k] = to_compute(in[k].v[j]);
    o.v[j] = cast<T>(fused_expr<C>(x));
  }
  return o;
}

// V consecutive elements of every operand at element i, then V results.
template <int V, class T>
__device__ __forceinline__ Vec<T, V> fused_apply_vec(const FusedPtrs& p, i64 i) {
  Vec<T, V> in[FLAME_FUSED_INPUTS];
#pragma unroll
  for (int k = 0; k < FLAME_FUSED_INPUTS; ++k) in[k] = *reinterpret_cast<const Vec<T, V>*>(static_cast<const T*>(p.in[k]) + i);
  return fused_eval_vec<V, T>(in);
}

// Every operand dense: two vectors per thread per iteration, both loaded before either is stored
// (as ew_contig), then a scalar tail.
template <int V, class T>
__global__ void fused_contig(T* __restrict__ out, i64 n, FusedPtrs p) {
  using C = compute_t<T>;
  const i64 nthreads = static_cast<i64>(gridDim.x) * blockDim.x, nvec = n / V;
  i64 j = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; j + nthreads < nvec; j += 2 * nthreads) {
    const i64 i0 = j * V, i1 = (j + nthreads) * V;
    Vec<T, V> o0 = fused_apply_vec<V, T>(p, i0);
    Vec<T, V> o1 = fused_apply_vec<V, T>(p, i1);
    *reinterpret_cast<Vec<T, V>*>(out + i0) = o0;
    *reinterpret_cast<Vec<T, V>*>(out + i1) = o1;
  }
  if (j < nvec) *reinterpret_cast<Vec<T, V>*>(out + j * V) = fused_apply_vec<V, T>(p, j * V);
  for (i64 e = nvec * V + static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += nthreads) {
    C x[FLAME_FUSED_INPUTS];
#pragma unroll
    for (int k = 0; k < FLAME_FUSED_INPUTS; ++k) x[k] = to_compute(static_cast<const T*>(p.in[k])[e]);
    out[e] = cast<T>(fused_expr<C>(x));
  }
}

// A dense output [rows, cols] (after collapsing); operand k reads (row, c) at outer_k(row) + c * inner_k,
// inner_k 0 (broadcast along the row) or 1. V elements per thread along c (host: cols % V == 0 and
// aligned rows for every operand with inner 1).
struct FusedRowsLayout {
  int nd;  // outer axes, 0 to 7
  i64 shape[kFusedMaxDims - 1];
  i64 outer[kFusedMaxOperands][kFusedMaxDims - 1];
  i64 rows, cols;
  int inner[kFusedMaxOperands];
};
static_assert(sizeof(FusedRowsLayout) == 1040, "mirrors RowsLayout<kFusedMaxOperands> of src/ops/launch.h");

template <int V, class U, class T>
__device__ __forceinline__ void fused_rows_loop(T* __restrict__ out, const FusedPtrs& p, const FusedRowsLayout& L, U n, U vpr) {
  const RowDivider<U> row_of(vpr);
  for (U i = static_cast<U>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<U>(gridDim.x) * blockDim.x) {
    const U r = row_of(i);
    const i64 col = static_cast<i64>(i - r * vpr) * V;
    i64 off[FLAME_FUSED_INPUTS];
#pragma unroll
    for (int k = 0; k < FLAME_FUSED_INPUTS; ++k) off[k] = 0;
    rows_outer_offsets(r, L, off);
    Vec<T, V> in[FLAME_FUSED_INPUTS];
#pragma unroll
    for (int k = 0; k < FLAME_FUSED_INPUTS; ++k) {
      const T* q = static_cast<const T*>(p.in[k]) + off[k];
      if (L.inner[k]) {
        in[k] = *reinterpret_cast<const Vec<T, V>*>(q + col);
      } else {
        const T s = *q;
#pragma unroll
        for (int j = 0; j < V; ++j) in[k].v[j] = s;
      }
    }
    *reinterpret_cast<Vec<T, V>*>(out + static_cast<i64>(r) * L.cols + col) = fused_eval_vec<V, T>(in);
  }
}

template <int V, class T>
__global__ void fused_rows(T* __restrict__ out, FusedPtrs p, FusedRowsLayout L) {
  const i64 vpr = L.cols / V, n = L.rows * vpr;
  if (n <= 0x7fffffff)  // 32-bit indices, as ew_rows
    fused_rows_loop<V, unsigned>(out, p, L, static_cast<unsigned>(n), static_cast<unsigned>(vpr));
  else
    fused_rows_loop<V, i64>(out, p, L, n, vpr);
}

// Any strides (0 for broadcast, negative for flips); operand 0 of the strides is the output.
struct FusedStridedLayout {
  int ndim;
  i64 shape[kFusedMaxDims];
  i64 stride[kFusedMaxOperands + 1][kFusedMaxDims];
};
static_assert(sizeof(FusedStridedLayout) == 1160, "mirrors StridedLayout<kFusedMaxOperands> of src/ops/launch.h");

template <class T>
__global__ void fused_strided(T* out, i64 n, FusedPtrs p, FusedStridedLayout L) {
  using C = compute_t<T>;
  for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<i64>(gridDim.x) * blockDim.x) {
    i64 rem = i, o = 0, off[FLAME_FUSED_INPUTS];
#pragma unroll
    for (int k = 0; k < FLAME_FUSED_INPUTS; ++k) off[k] = 0;
    for (int d = L.ndim - 1; d >= 0; --d) {
      const i64 idx = rem % L.shape[d];
      rem /= L.shape[d];
      o += idx * L.stride[0][d];
#pragma unroll
      for (int k = 0; k < FLAME_FUSED_INPUTS; ++k) off[k] += idx * L.stride[k + 1][d];
    }
    C x[FLAME_FUSED_INPUTS];
#pragma unroll
    for (int k = 0; k < FLAME_FUSED_INPUTS; ++k) x[k] = to_compute(static_cast<const T*>(p.in[k])[off[k]]);
    out[o] = cast<T>(fused_expr<C>(x));
  }
}

}  // namespace flame

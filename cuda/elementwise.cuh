// Elementwise kernels: one functor per op (cuda/functors.cuh, the name in src/tensor/op_list.h), applied
// by generic kernels over 0 to 3 operands of any element types. ew_contig moves V elements per thread with
// aligned vector accesses (16 bytes for the widest operand) when every operand is dense; ew_rows
// does the same for a dense output whose operands are dense or broadcast along the last axis (any
// strides on the others: broadcasts, permuted outer axes); ew_tile
// transposes through shared memory when one operand's unit stride is not the output's; ew_strided
// handles any strides (broadcast 0, negative for flips) with 32- or 64-bit indexing.
// Functors compute in compute_t (f32 for f16/bf16) and the result is converted to the output type;
// Identity (copies and casts) converts each element directly (convert_element in common.cuh), so a
// same-dtype copy moves bits unchanged.
#pragma once
#include "functors.cuh"

namespace flame {

template <class Op, class A, class B, class C>
__device__ __forceinline__ auto apply(const Op& op, const A& a, const B& b, const C& c) {
  if constexpr (is_none<A>::value) return op();
  else if constexpr (is_none<B>::value) return op(to_compute(a));
  else if constexpr (is_none<C>::value) return op(to_compute(a), to_compute(b));
  else return op(to_compute(a), to_compute(b), to_compute(c));
}

// op on one element's operands, converted to R. Identity of one operand is a copy or a cast:
// convert_element (a same-type copy keeps the bits; f8 to f16 / bf16 keeps PyTorch's NaN bits).
template <class R, class Op, class A, class B, class C>
__device__ __forceinline__ R apply_to(const Op& op, const A& a, const B& b, const C& c) {
  if constexpr (is_same_type<Op, Identity>::value && !is_none<A>::value && is_none<B>::value) return convert_element<R>(a);
  else return cast<R>(apply(op, a, b, c));
}

// ---------------- dense operands ----------------
template <int V, class T> __device__ __forceinline__ Vec<T, V> load_vec(const T* p, i64 i) {
  Vec<T, V> v;
  if constexpr (!is_none<T>::value) v = *reinterpret_cast<const Vec<T, V>*>(p + i);
  return v;
}

template <int V, class Op, class R, class A, class B, class C>
__device__ __forceinline__ Vec<R, V> apply_vec(const Op& op, const Vec<A, V>& a, const Vec<B, V>& b, const Vec<C, V>& c) {
  Vec<R, V> o;
#pragma unroll
  for (int k = 0; k < V; ++k) o.v[k] = apply_to<R>(op, a.v[k], b.v[k], c.v[k]);
  return o;
}

// Two vectors per thread per iteration, both loaded before either is used: one load in flight per
// thread leaves about 6% of the bandwidth unused.
template <int V, class Op, class R, class A = None, class B = None, class C = None>
__global__ void ew_contig(Op op, R* __restrict__ out, i64 n, const A* __restrict__ a, const B* __restrict__ b,
                          const C* __restrict__ c) {
  const i64 nthreads = static_cast<i64>(gridDim.x) * blockDim.x, nvec = n / V;
  i64 j = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; j + nthreads < nvec; j += 2 * nthreads) {
    const i64 i0 = j * V, i1 = (j + nthreads) * V;
    Vec<A, V> a0 = load_vec<V>(a, i0), a1 = load_vec<V>(a, i1);
    Vec<B, V> b0 = load_vec<V>(b, i0), b1 = load_vec<V>(b, i1);
    Vec<C, V> c0 = load_vec<V>(c, i0), c1 = load_vec<V>(c, i1);
    *reinterpret_cast<Vec<R, V>*>(out + i0) = apply_vec<V, Op, R>(op, a0, b0, c0);
    *reinterpret_cast<Vec<R, V>*>(out + i1) = apply_vec<V, Op, R>(op, a1, b1, c1);
  }
  if (j < nvec) {
    const i64 i0 = j * V;
    *reinterpret_cast<Vec<R, V>*>(out + i0) =
        apply_vec<V, Op, R>(op, load_vec<V>(a, i0), load_vec<V>(b, i0), load_vec<V>(c, i0));
  }
  for (i64 e = nvec * V + static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += nthreads) {
    A xa; B xb; C xc;
    if constexpr (!is_none<A>::value) xa = a[e];
    if constexpr (!is_none<B>::value) xb = b[e];
    if constexpr (!is_none<C>::value) xc = c[e];
    out[e] = apply_to<R>(op, xa, xb, xc);
  }
}

// ---------------- any strides ----------------
constexpr int kMaxDims = 8;
struct StridedLayout {
  int ndim;
  i64 shape[kMaxDims];
  i64 stride[4][kMaxDims];  // operand 0 is the output, then a, b, c; in elements
};
static_assert(sizeof(StridedLayout) == 328, "mirrors StridedLayout<3> of src/ops/launch.h");

template <class Index, class Op, class R, class A = None, class B = None, class C = None>
__global__ void ew_strided(Op op, R* out, i64 n, const A* a, const B* b, const C* c, StridedLayout L) {
  Index step = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < static_cast<Index>(n); i += step) {
    Index rem = i;
    i64 o0 = 0, o1 = 0, o2 = 0, o3 = 0;
    for (int d = L.ndim - 1; d >= 0; --d) {
      Index size = static_cast<Index>(L.shape[d]);
      i64 idx = static_cast<i64>(rem % size);
      rem /= size;
      o0 += idx * L.stride[0][d];
      if constexpr (!is_none<A>::value) o1 += idx * L.stride[1][d];
      if constexpr (!is_none<B>::value) o2 += idx * L.stride[2][d];
      if constexpr (!is_none<C>::value) o3 += idx * L.stride[3][d];
    }
    A xa; B xb; C xc;
    if constexpr (!is_none<A>::value) xa = a[o1];
    if constexpr (!is_none<B>::value) xb = b[o2];
    if constexpr (!is_none<C>::value) xc = c[o3];
    out[o0] = apply_to<R>(op, xa, xb, xc);
  }
}

// ---------------- a dense output over rows: last axis dense or broadcast in every operand ----------------
// After collapsing, out is dense [..., cols] and operand k reads element (row, c) at
// offset_k(row) + c * inner_k, inner_k 0 (broadcast along the row) or 1, where offset_k walks the
// outer axes with any strides: bias adds, row scales, and copies or casts of views that permute
// the outer axes (a [B, H, T, D] attention output read as [B, T, H, D]). V elements per thread
// along c; the outer index is decomposed once per vector.
struct RowsLayout {
  int nd;              // outer axes, 0 to 7
  i64 shape[7];
  i64 outer[3][7];     // operand strides along the outer axes
  i64 rows, cols;
  int inner[3];        // 0 or 1
};
static_assert(sizeof(RowsLayout) == 264, "mirrors RowsLayout<3> of src/ops/launch.h");

template <int V, class T>
__device__ __forceinline__ Vec<T, V> load_row_vec(const T* p, i64 off, i64 c, int k, const RowsLayout& L) {
  Vec<T, V> v;
  if constexpr (!is_none<T>::value) {
    const T* q = p + off;
    if (L.inner[k]) {
      v = *reinterpret_cast<const Vec<T, V>*>(q + c);
    } else {
      T x = *q;
#pragma unroll
      for (int j = 0; j < V; ++j) v.v[j] = x;
    }
  }
  return v;
}

// The grid-stride loop of ew_rows over n = rows x cols / V vectors, with indices of type U.
template <int V, class U, class Op, class R, class A, class B, class C>
__device__ __forceinline__ void ew_rows_loop(Op op, R* __restrict__ out, const A* __restrict__ a, const B* __restrict__ b,
                                             const C* __restrict__ c, const RowsLayout& L, U n, U vpr) {
  const RowDivider<U> row_of(vpr);
  for (U i = static_cast<U>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<U>(gridDim.x) * blockDim.x) {
    const U r = row_of(i);
    const i64 col = static_cast<i64>(i - r * vpr) * V;
    i64 off[3] = {0, 0, 0};
    rows_outer_offsets(r, L, off);
    Vec<A, V> va = load_row_vec<V>(a, off[0], col, 0, L);
    Vec<B, V> vb = load_row_vec<V>(b, off[1], col, 1, L);
    Vec<C, V> vc = load_row_vec<V>(c, off[2], col, 2, L);
    Vec<R, V> vo;
#pragma unroll
    for (int k = 0; k < V; ++k) vo.v[k] = apply_to<R>(op, va.v[k], vb.v[k], vc.v[k]);
    *reinterpret_cast<Vec<R, V>*>(out + static_cast<i64>(r) * L.cols + col) = vo;
  }
}

template <int V, class Op, class R, class A = None, class B = None, class C = None>
__global__ void ew_rows(Op op, R* __restrict__ out, const A* __restrict__ a, const B* __restrict__ b,
                        const C* __restrict__ c, RowsLayout L) {
  const i64 vpr = L.cols / V, n = L.rows * vpr;  // host guarantees cols % V == 0 and aligned rows
  if (n <= 0x7fffffff)  // 32-bit indices (i + the grid stride stays below 2^32)
    ew_rows_loop<V, unsigned>(op, out, a, b, c, L, static_cast<unsigned>(n), static_cast<unsigned>(vpr));
  else
    ew_rows_loop<V, i64>(op, out, a, b, c, L, n, vpr);
}

// ---------------- one operand read across its unit stride (transpose-contiguous) ----------------
// out is dense; the operand's unit-stride axis is not the output's last axis, so a direct copy
// reads or writes 32 bytes per element. A 32x32 tile goes through shared memory: read along the
// operand's unit axis (`rows` here), written along the output's last axis (`cols`).
struct TileLayout {
  int nb;              // batch axes: every collapsed axis but the two tile axes
  i64 bshape[6];
  i64 bstride_out[6];
  i64 bstride_in[6];
  i64 rows, cols;
  i64 in_col_stride;   // the operand's stride along cols (along rows it is 1)
  i64 out_row_stride;  // the output's stride along rows (along cols it is 1)
};

template <class Op, class R, class A>
__global__ void ew_tile(Op op, R* __restrict__ out, const A* __restrict__ a, TileLayout L) {
  __shared__ R tile[32][33];  // +1 column: the transposed read hits 32 different banks
  const i64 tr = (L.rows + 31) / 32, tc = (L.cols + 31) / 32, per_batch = tr * tc;
  i64 nbatch = 1;
  for (int d = 0; d < L.nb; ++d) nbatch *= L.bshape[d];
  None none{};
  for (i64 t = blockIdx.x; t < nbatch * per_batch; t += gridDim.x) {
    i64 bi = t / per_batch, rem = t - bi * per_batch;
    const i64 r0 = (rem / tc) * 32, c0 = (rem % tc) * 32;
    i64 ob = 0, ib = 0;
    for (int d = L.nb - 1; d >= 0; --d) {
      i64 idx = bi % L.bshape[d];
      bi /= L.bshape[d];
      ob += idx * L.bstride_out[d];
      ib += idx * L.bstride_in[d];
    }
    for (int k = threadIdx.y; k < 32; k += blockDim.y) {
      i64 r = r0 + threadIdx.x, col = c0 + k;
      if (r < L.rows && col < L.cols) tile[k][threadIdx.x] = apply_to<R>(op, a[ib + r + col * L.in_col_stride], none, none);
    }
    __syncthreads();
    for (int k = threadIdx.y; k < 32; k += blockDim.y) {
      i64 r = r0 + k, col = c0 + threadIdx.x;
      if (r < L.rows && col < L.cols) out[ob + r * L.out_row_stride + col] = tile[threadIdx.x][k];
    }
    __syncthreads();
  }
}

}  // namespace flame

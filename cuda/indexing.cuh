// Indexing kernels: gather (torch.gather, and index_select / embedding through a broadcast index),
// scatter-add (torch.scatter_add / index_add, and the backward of the gathers) and one_hot.
// Host code: src/ops/indexing.cpp.
//
// Both gather and scatter walk an iteration shape (the index's logical shape; index_select and
// index_add see their 1-D index broadcast over it with stride 0) with one thread per element. Along
// `dim` the element at coordinate c goes to / comes from position index[c] of the data tensor; the
// other coordinates are the same in both. Indices are checked against [0, dim_size) on the device
// (device_error.cuh): a bad one reads as NaN (0 for integers) and is not scattered. An index equal
// to `skip` (embedding's padding_idx) is not scattered, and reads as 0 where zero_skip is set.
// Scatter-add accumulates with atomicAdd into an f32 buffer (f64 for f64, the type itself for i32
// and i64): the order of floating additions, and so the last bits of the result, may vary between
// runs, as in PyTorch's CUDA index_add_ / scatter_add_.
#pragma once
#include "common.cuh"
#include "device_error.cuh"

namespace flame {

struct IndexLayout {  // mirrors src/ops/indexing.cpp
  int ndim, dim;
  i64 shape[8];        // the iteration shape
  i64 idx_stride[8];   // strides of the index over it (0: broadcast)
  i64 data_stride[8];  // strides of the gathered-from / scattered-into tensor (coordinate dim unused)
  i64 other_stride[8]; // strides of the scatter source over the iteration shape (gather: unused)
  i64 dim_size;        // indices are valid in [0, dim_size)
};

template <class T> __device__ __forceinline__ T bad_read() { return T(0); }  // integers and bool
template <> __device__ __forceinline__ float bad_read<float>() { return __int_as_float(0x7fffffff); }
template <> __device__ __forceinline__ double bad_read<double>() { return __longlong_as_double(0x7ff8000000000000ll); }
template <> __device__ __forceinline__ half_t bad_read<half_t>() { half_t h; h.x = 0x7e00; return h; }
template <> __device__ __forceinline__ bf16_t bad_read<bf16_t>() { bf16_t h; h.x = 0x7fc0; return h; }
template <class T> __device__ __forceinline__ T zero_of() { return T(0); }
template <> __device__ __forceinline__ half_t zero_of<half_t>() { half_t h; h.x = 0; return h; }
template <> __device__ __forceinline__ bf16_t zero_of<bf16_t>() { bf16_t h; h.x = 0; return h; }

// Offsets of element e of the iteration shape: in the index, in the data (without dim) and in the
// scatter source.
__device__ __forceinline__ void index_offsets(i64 e, const IndexLayout& L, i64* idx_off, i64* data_off, i64* other_off) {
  i64 io = 0, dof = 0, oo = 0;
  for (int d = L.ndim - 1; d >= 0; --d) {
    i64 c = e % L.shape[d];
    e /= L.shape[d];
    io += c * L.idx_stride[d];
    oo += c * L.other_stride[d];
    if (d != L.dim) dof += c * L.data_stride[d];
  }
  *idx_off = io;
  *data_off = dof;
  *other_off = oo;
}

// out (contiguous, the iteration shape) = in gathered along dim.
template <class T, class I>
__global__ void gather_kernel(const T* __restrict__ in, T* __restrict__ out, const I* __restrict__ idx, i64 n, IndexLayout L,
                              i64 skip, int zero_skip, DeviceErrorRecord* err, unsigned int err_source) {
  for (i64 e = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += static_cast<i64>(gridDim.x) * blockDim.x) {
    i64 io, dof, oo;
    index_offsets(e, L, &io, &dof, &oo);
    const i64 k = static_cast<i64>(idx[io]);
    if (zero_skip && k == skip) {
      out[e] = zero_of<T>();
    } else if (k < 0 || k >= L.dim_size) {
      report_bad_index(err, err_source, k, io, L.dim_size);
      out[e] = bad_read<T>();
    } else {
      out[e] = in[dof + k * L.data_stride[L.dim]];
    }
  }
}

__device__ __forceinline__ void atomic_accumulate(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_accumulate(double* p, double v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_accumulate(int* p, int v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_accumulate(long long* p, long long v) {  // two's complement wraps alike
  atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
}

// acc (the data tensor's shape, accumulation type A) += alpha * src scattered along dim.
template <class S, class I, class A>
__global__ void scatter_add_kernel(A* acc, const S* __restrict__ src, const I* __restrict__ idx, i64 n, IndexLayout L, i64 skip,
                                   double alpha, DeviceErrorRecord* err, unsigned int err_source) {
  const A a = static_cast<A>(alpha);
  const bool scaled = alpha != 1.0;
  for (i64 e = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += static_cast<i64>(gridDim.x) * blockDim.x) {
    i64 io, dof, so;
    index_offsets(e, L, &io, &dof, &so);
    const i64 k = static_cast<i64>(idx[io]);
    if (k == skip) continue;
    if (k < 0 || k >= L.dim_size) {
      report_bad_index(err, err_source, k, io, L.dim_size);
      continue;
    }
    A v = static_cast<A>(to_compute(src[so]));
    atomic_accumulate(acc + dof + k * L.data_stride[L.dim], scaled ? v * a : v);
  }
}

// out[r, c] = (index[r] == c) as i64; index contiguous with n entries.
template <class I>
__global__ void one_hot_kernel(const I* __restrict__ idx, i64* __restrict__ out, i64 n, i64 classes, DeviceErrorRecord* err,
                               unsigned int err_source) {
  const i64 total = n * classes;
  for (i64 e = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 r = e / classes, c = e - r * classes;
    const i64 k = static_cast<i64>(idx[r]);
    if (c == 0 && (k < 0 || k >= classes)) report_bad_index(err, err_source, k, r, classes);
    out[e] = k == c ? 1 : 0;
  }
}

}  // namespace flame

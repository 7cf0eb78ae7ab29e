// 2x2 blocks between a small [N, C, H, W] tensor and a large [N, C, 2H, 2W] one, both dense in one
// layout (NCHW, or channels-last when CL), in vectors of V elements with two 32-bit divisions per
// vector (the general upsample / pool kernels spend per-element index arithmetic and ran at 0.17-0.31
// of copy):
//  - expand2x2: every element of the small tensor to its 2x2 block of the large one (nearest
//    upsampling by 2; with QUARTER, times 1/4: the backward of 2x2 average pooling with stride 2);
//  - sum2x2: every element of the small tensor = the sum of its 2x2 block (the backward of nearest
//    upsampling by 2; with QUARTER, over 4: 2x2 average pooling).
// Sums run in the compute type in the general kernels' order (row 2h then 2h + 1, column 2w then
// 2w + 1), and x / 4 = x * 0.25 exactly, so both paths agree bitwise.
// Vector e of the small tensor: NCHW: V columns of row r = e / (W / V) (rows over n, c, h), whose
// block is 2V columns of large rows 2r and 2r + 1; NHWC: V channels of pixel p = e / (C / V) (pixels
// over n, h, w), whose block is four pixels. row_vecs = W / V (NCHW) or C / V (NHWC); W the small
// tensor's width. The host keeps the large tensor below 2^31 elements.
#pragma once
#include "common.cuh"

namespace flame {

// The large tensor's vector index of block element (i, k) of small vector e (row or pixel r, vector j).
template <bool CL>
__device__ __forceinline__ unsigned block2x2_index(unsigned r, unsigned j, unsigned i, unsigned k, unsigned row_vecs,
                                                   const FastDivU32& div_w, unsigned W) {
  if constexpr (CL) {
    const unsigned nh = div_w(r), w = r - nh * W;  // pixel r = nh W + w
    return ((2 * nh + i) * 2 * W + 2 * w + k) * row_vecs + j;
  } else {  // k selects the first or second V of the 2V large columns
    return (2 * r + i) * 2 * row_vecs + 2 * j + k;
  }
}

// The geometry both kernels walk: small vector e is vector j of row (NCHW) or pixel (NHWC) r.
struct Blocks2x2 {
  unsigned row_vecs, W;
  FastDivU32 div_row, div_w;
  __device__ Blocks2x2(unsigned rv, unsigned w) : row_vecs(rv), W(w), div_row(rv), div_w(w) {}
  __device__ __forceinline__ void locate(unsigned e, unsigned* r, unsigned* j) const {
    *r = div_row(e);
    *j = e - *r * row_vecs;
  }
  template <bool CL>
  __device__ __forceinline__ unsigned index(unsigned r, unsigned j, unsigned t) const {  // block element t = 2 i + k
    return block2x2_index<CL>(r, j, t / 2, t % 2, row_vecs, div_w, W);
  }
};

template <class T, int V, bool CL, bool QUARTER>
__global__ void expand2x2(const T* __restrict__ small, T* __restrict__ large, unsigned nvec, unsigned row_vecs, unsigned W) {
  typedef compute_t<T> A;
  const Blocks2x2 geo(row_vecs, W);
  for (unsigned e = blockIdx.x * blockDim.x + threadIdx.x; e < nvec; e += gridDim.x * blockDim.x) {
    Vec<T, V> v = reinterpret_cast<const Vec<T, V>*>(small)[e];
    if constexpr (QUARTER) {
#pragma unroll
      for (int i = 0; i < V; ++i) v.v[i] = cast<T>(static_cast<A>(to_compute(v.v[i])) * A(0.25));
    }
    unsigned r, j;
    geo.locate(e, &r, &j);
    Vec<T, V> half[2];  // NHWC: the vector itself; NCHW: large columns 2V j .. + V - 1 and the next V
#pragma unroll
    for (int i = 0; i < V; ++i) {  // large column 2c and 2c + 1 hold small column c
      half[0].v[i] = CL ? v.v[i] : v.v[i / 2];
      half[1].v[i] = CL ? v.v[i] : v.v[(V + i) / 2];
    }
#pragma unroll
    for (unsigned q = 0; q < 4; ++q) reinterpret_cast<Vec<T, V>*>(large)[geo.index<CL>(r, j, q)] = half[q % 2];
  }
}

template <class T, int V, bool CL, bool QUARTER>
__global__ void sum2x2(const T* __restrict__ large, T* __restrict__ small, unsigned nvec, unsigned row_vecs, unsigned W) {
  typedef compute_t<T> A;
  const Blocks2x2 geo(row_vecs, W);
  for (unsigned e = blockIdx.x * blockDim.x + threadIdx.x; e < nvec; e += gridDim.x * blockDim.x) {
    unsigned r, j;
    geo.locate(e, &r, &j);
    Vec<T, V> q[4];  // block element (i, k) = q[2 i + k]
#pragma unroll
    for (unsigned t = 0; t < 4; ++t) q[t] = reinterpret_cast<const Vec<T, V>*>(large)[geo.index<CL>(r, j, t)];
    Vec<T, V> out;
#pragma unroll
    for (int c = 0; c < V; ++c) {
      A s = A(0);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          // NHWC: element c of pixel (i, k); NCHW: large column 2c + k of row i, in the first or second V
          const int col = 2 * c + k;
          s += static_cast<A>(to_compute(CL ? q[2 * i + k].v[c] : q[2 * i + col / V].v[col % V]));
        }
      out.v[c] = cast<T>(QUARTER ? s * A(0.25) : s);
    }
    reinterpret_cast<Vec<T, V>*>(small)[e] = out;
  }
}

}  // namespace flame

// Inclusive prefix sum along one axis: one block per row (every other axis), scanning the axis in
// tiles of blockDim.x elements with warp shuffles and carrying the running total between tiles.
#pragma once
#include "common.cuh"

namespace flame {

struct ScanLayout {
  int row_ndim;
  i64 row_shape[8];
  i64 row_in_stride[8];
  i64 row_out_stride[8];
  i64 len, in_stride, out_stride;  // the scanned axis
};

template <class T, class Acc, class R>
__global__ void cumsum_kernel(const T* in, R* out, i64 rows, ScanLayout L) {
  __shared__ Acc warp_tot[32];
  __shared__ Acc carry_s;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    i64 ib = 0, ob = 0, rem = row;
    for (int d = L.row_ndim - 1; d >= 0; --d) {
      i64 idx = rem % L.row_shape[d];
      rem /= L.row_shape[d];
      ib += idx * L.row_in_stride[d];
      ob += idx * L.row_out_stride[d];
    }
    Acc carry = Acc(0);
    for (i64 t = 0; t < L.len; t += blockDim.x) {
      i64 i = t + threadIdx.x;
      Acc v = i < L.len ? static_cast<Acc>(to_compute(in[ib + i * L.in_stride])) : Acc(0);
      for (int s = 1; s < 32; s <<= 1) {
        Acc u = __shfl_up_sync(0xffffffffu, v, s);
        if (lane >= s) v += u;
      }
      if (lane == 31) warp_tot[warp] = v;
      __syncthreads();
      if (warp == 0) {
        Acc w = lane < nw ? warp_tot[lane] : Acc(0);
        for (int s = 1; s < 32; s <<= 1) {
          Acc u = __shfl_up_sync(0xffffffffu, w, s);
          if (lane >= s) w += u;
        }
        if (lane < nw) warp_tot[lane] = w;  // inclusive prefix of warp totals
      }
      __syncthreads();
      Acc before = warp > 0 ? warp_tot[warp - 1] : Acc(0);
      if (i < L.len) out[ob + i * L.out_stride] = cast<R>(carry + before + v);
      if (threadIdx.x == 0) carry_s = carry + warp_tot[nw - 1];
      __syncthreads();
      carry = carry_s;
      __syncthreads();
    }
  }
}

}  // namespace flame

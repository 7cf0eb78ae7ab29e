// Scatter (torch.scatter, out of place; host code: src/ops/indexing_extra.cpp). The host copies the
// input into the output first; then one thread per element of the index writes src's element at its
// position along dim. The iteration shape, offsets and the device-side index check are those of
// indexing.cuh (IndexLayout: other_stride holds src's strides). A bad index is reported and its
// element not written. When an index repeats along dim, which write lands is unspecified (as in
// PyTorch on CUDA).
#pragma once
#include "indexing.cuh"

namespace flame {

template <class T, class I>
__global__ void scatter_kernel(T* out, const T* __restrict__ src, const I* __restrict__ idx, i64 n, IndexLayout L,
                               DeviceErrorRecord* err, unsigned int err_source) {
  for (i64 e = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += static_cast<i64>(gridDim.x) * blockDim.x) {
    i64 io, dof, so;
    index_offsets(e, L, &io, &dof, &so);
    const i64 k = static_cast<i64>(idx[io]);
    if (k < 0 || k >= L.dim_size) {
      report_bad_index(err, err_source, k, io, L.dim_size);
      continue;
    }
    out[dof + k * L.data_stride[L.dim]] = src[so];
  }
}

}  // namespace flame

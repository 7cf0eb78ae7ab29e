// Dequantisation of an fp8 tensor in one pass (host code: src/ops/quantized.cpp): out = q * scale
// with q stored in e4m3 or e5m2, scale f32 (one for the tensor, or one per row of `cols` elements),
// out in f32, f16, bf16 or f64. Each element is decoded and multiplied in f32 registers and rounded
// once to out's type: the same values as to_dtype(q, f32) * scale cast to out, without that f32
// temporary and its two extra passes over memory. Reads 1 byte and writes sizeof(T) per element.
#pragma once
#include "common.cuh"

namespace flame {

// V elements per thread and step: V = 8 (an 8-byte load of q, one vector store of out) when the
// host saw n and cols multiples of 8 and both pointers aligned to their vectors, else V = 1.
// per_row: scale has one value per row (a row is `cols` consecutive elements; with V = 8 a vector
// never straddles two rows); otherwise scale[0] scales every element.
template <class Q, class T, int V>
__global__ void dequantize_kernel(const Q* __restrict__ q, const float* __restrict__ scale, T* __restrict__ out, i64 n,
                                  i64 cols, int per_row) {
  const i64 vectors = n / V;
  const float tensor_scale = per_row ? 0.0f : scale[0];
  for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors;
       i += static_cast<i64>(gridDim.x) * blockDim.x) {
    const Vec<Q, V> qv = reinterpret_cast<const Vec<Q, V>*>(q)[i];
    const float s = per_row ? scale[(i * V) / cols] : tensor_scale;
    float xs[V];
#pragma unroll
    for (int k = 0; k < V; ++k) xs[k] = to_float(qv.v[k]) * s;
    reinterpret_cast<Vec<T, V>*>(out)[i] = pack<T, V>(xs);
  }
}

}  // namespace flame

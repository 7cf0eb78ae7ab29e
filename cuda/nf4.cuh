// NF4 (QLoRA's 4-bit NormalFloat) quantisation and dequantisation of frozen weights, bitsandbytes'
// blockwise format (host code: src/ops/nf4.cpp; constants shared with the host: nf4_constants.cuh).
//  - nf4_quantize_kernel: per block of `block` consecutive elements (one CUDA block each), absmax =
//    max |x| (f32), then each x * (1 / absmax) (f32, as bitsandbytes) to the nearest NF4 level, two
//    codes per byte (the first element in the high nibble).
//  - nf4_absmax_quantize_kernel: the double quantisation of the absmax values: v = absmax - mean
//    (the mean precomputed on the device), per block of 256 a scale s = max |v| and v * (1 / s)
//    to the nearest entry of the 8-bit dynamic code (bitsandbytes' dQuantize: its binary search and
//    midpoint rule).
//  - nf4_dequantize_kernel: out = level[code] * absmax, absmax read as stored (f32) or rebuilt as
//    code8[q] * s + mean (NESTED), each product rounded once in f32 (no fused multiply-add: the same
//    values as bitsandbytes' two dequantisation kernels), then to out's type. Reads half a byte (plus
//    the statistics) per element.
#pragma once
#include "common.cuh"
#include "nf4_constants.cuh"

namespace flame {

__constant__ float nf4_levels[16] = {FLAME_NF4_LEVELS};
__constant__ float nf4_thresholds[15] = {FLAME_NF4_THRESHOLDS};

// The NF4 code of a normalised value: the number of thresholds it exceeds (x > t, so a value equal
// to a threshold takes the lower code, and NaN code 0, as bitsandbytes' decision tree).
__device__ __forceinline__ unsigned nf4_code(float x) {
  unsigned c = 0;
#pragma unroll
  for (int k = 0; k < 15; ++k) c += x > nf4_thresholds[k] ? 1u : 0u;
  return c;
}

// The index of code's (sorted, 256 entries, code[127] the middle) nearest entry to x: bitsandbytes'
// dQuantize<0> (csrc/kernels.cu), a binary search then the midpoint of the two neighbours.
__device__ __forceinline__ unsigned char nearest_code_8bit(const float* code, float x) {
  int pivot = 127, upper_pivot = 255, lower_pivot = 0;
  float lower = -1.0f, upper = 1.0f, val = code[pivot];
  for (int i = 64; i > 0; i >>= 1) {
    if (x > val) {
      lower_pivot = pivot;
      lower = val;
      pivot += i;
    } else {
      upper_pivot = pivot;
      upper = val;
      pivot -= i;
    }
    val = code[pivot];
  }
  if (upper_pivot == 255) upper = code[upper_pivot];
  if (lower_pivot == 0) lower = code[lower_pivot];
  if (x > val) return static_cast<unsigned char>(x > (upper + val) * 0.5f ? upper_pivot : pivot);
  return static_cast<unsigned char>(x < (lower + val) * 0.5f ? lower_pivot : pivot);
}

// The largest |x| over the CUDA block (kNf4QuantizeThreads threads), in every thread. shared: one
// float per warp. Ends with a barrier, so shared may be reused after it.
__device__ __forceinline__ float block_abs_max(float m, float* shared) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  if ((threadIdx.x & 31) == 0) shared[threadIdx.x >> 5] = m;
  __syncthreads();
  m = shared[0];
#pragma unroll
  for (int w = 1; w < kNf4QuantizeThreads / 32; ++w) m = fmaxf(m, shared[w]);
  __syncthreads();
  return m;
}

// w: f32, `blocks` * `block` elements (block even); packed: blocks * block / 2 bytes; absmax: f32
// [blocks]. An all-zero block gets absmax 0 and the zero code (bitsandbytes would divide by 0).
__global__ void __launch_bounds__(kNf4QuantizeThreads)
    nf4_quantize_kernel(const float* __restrict__ w, unsigned char* __restrict__ packed, float* __restrict__ absmax,
                        i64 blocks, int block) {
  __shared__ float warp_max[kNf4QuantizeThreads / 32];
  for (i64 b = blockIdx.x; b < blocks; b += gridDim.x) {
    const float* x = w + b * block;
    float m = 0.0f;
    for (int i = threadIdx.x; i < block; i += blockDim.x) m = fmaxf(m, fabsf(x[i]));
    m = block_abs_max(m, warp_max);
    if (threadIdx.x == 0) absmax[b] = m;
    const float r = m > 0.0f ? 1.0f / m : 0.0f;
    unsigned char* out = packed + b * (block / 2);
    for (int i = threadIdx.x; i < block / 2; i += blockDim.x)
      out[i] = static_cast<unsigned char>((nf4_code(x[2 * i] * r) << 4) | nf4_code(x[2 * i + 1] * r));
  }
}

// absmax: f32 [n]; mean: f32, one value; code: f32 [256]; q: [n] bytes; scale: f32
// [ceil(n / kNf4NestedBlock)]. One CUDA block of kNf4QuantizeThreads threads per block of 256.
__global__ void __launch_bounds__(kNf4QuantizeThreads)
    nf4_absmax_quantize_kernel(const float* __restrict__ absmax, const float* __restrict__ mean,
                               const float* __restrict__ code, unsigned char* __restrict__ q, float* __restrict__ scale,
                               i64 n) {
  constexpr int kPerThread = kNf4NestedBlock / kNf4QuantizeThreads;
  __shared__ float warp_max[kNf4QuantizeThreads / 32];
  __shared__ float table[256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) table[i] = code[i];
  const float offset = mean[0];
  __syncthreads();
  const i64 chunks = (n + kNf4NestedBlock - 1) / kNf4NestedBlock;
  for (i64 c = blockIdx.x; c < chunks; c += gridDim.x) {
    float v[kPerThread];
    float m = 0.0f;
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const i64 i = c * kNf4NestedBlock + k * kNf4QuantizeThreads + threadIdx.x;
      v[k] = i < n ? absmax[i] - offset : 0.0f;
      m = fmaxf(m, fabsf(v[k]));
    }
    m = block_abs_max(m, warp_max);
    if (threadIdx.x == 0) scale[c] = m;
    const float r = m > 0.0f ? 1.0f / m : 0.0f;
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const i64 i = c * kNf4NestedBlock + k * kNf4QuantizeThreads + threadIdx.x;
      if (i < n) q[i] = nearest_code_8bit(table, v[k] * r);
    }
  }
}

// V bytes of packed (2V elements of out) per thread: V = 4 (a 4-byte load, one vector store) when
// the host saw the byte count a multiple of 4 and both pointers aligned to their vectors, else 1.
// block_shift = log2(block) (block a power of two >= 16, so a thread's bytes share one block).
// NESTED: absmax holds 8-bit codes into code, scaled per kNf4NestedBlock blocks by scale, plus
// mean[0]; otherwise absmax is f32 and scale, mean and code are unused.
template <class T, int NESTED, int V>
__global__ void nf4_dequantize_kernel(const unsigned char* __restrict__ packed, const void* __restrict__ absmax,
                                      const float* __restrict__ scale, const float* __restrict__ mean,
                                      const float* __restrict__ code, T* __restrict__ out, i64 bytes, int block_shift) {
  __shared__ float levels[16];  // shared, not __constant__: a warp reads 16 levels at once
  if (threadIdx.x < 16) levels[threadIdx.x] = nf4_levels[threadIdx.x];
  __syncthreads();
  const i64 vectors = bytes / V;
  const float offset = NESTED ? mean[0] : 0.0f;
  for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors;
       i += static_cast<i64>(gridDim.x) * blockDim.x) {
    const Vec<unsigned char, V> pv = reinterpret_cast<const Vec<unsigned char, V>*>(packed)[i];
    const i64 b = (i * V * 2) >> block_shift;
    float a;
    if (NESTED) {
      const unsigned char qa = static_cast<const unsigned char*>(absmax)[b];
      a = __fadd_rn(__fmul_rn(code[qa], scale[b / kNf4NestedBlock]), offset);
    } else {
      a = static_cast<const float*>(absmax)[b];
    }
    float xs[2 * V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      xs[2 * k] = __fmul_rn(levels[pv.v[k] >> 4], a);
      xs[2 * k + 1] = __fmul_rn(levels[pv.v[k] & 15], a);
    }
    reinterpret_cast<Vec<T, 2 * V>*>(out)[i] = pack<T, 2 * V>(xs);
  }
}

}  // namespace flame

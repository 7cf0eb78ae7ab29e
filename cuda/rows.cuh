// Helpers for row kernels (softmax.cuh, norm.cuh). A row of D elements belongs to the blockDim.x
// threads with the same threadIdx.y (a "row group": blockDim.x a multiple of 32, blockDim.y <= 8);
// block-strided loops hand out rows, so that every thread of a block runs the same number of
// iterations and may take part in __syncthreads even when its row is past the end.
//
// Register-cached kernels give thread t of a row group the vectors k * blockDim.x + t (k < NV) of V
// elements each: the group's loads of one k are adjacent in memory (coalesced), and with V elements
// of 16 bytes together they are single 128-bit accesses.
#pragma once
#include "common.cuh"
#include "mma.cuh"

namespace flame {

template <class T> __device__ __forceinline__ T neg_infinity();
template <> __device__ __forceinline__ float neg_infinity<float>() { return -__int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double neg_infinity<double>() { return -__longlong_as_double(0x7ff0000000000000ll); }

struct RowSum {
  template <class A> __device__ __forceinline__ A operator()(A a, A b) const { return a + b; }
  template <class A> __device__ __forceinline__ static A identity() { return A(0); }
};
struct RowMax {  // NaN is ignored here; it reaches the result through the sum that follows
  template <class A> __device__ __forceinline__ A operator()(A a, A b) const { return b > a ? b : a; }
  template <class A> __device__ __forceinline__ static A identity() { return neg_infinity<A>(); }
};

// Combines K values per thread over the blockDim.x threads of this row group and gives the results to
// all of them. smem: 32 * K entries per row group (blockDim.y * 32 * K in all). Every thread of the
// block must call it. After the warps' butterflies, every warp combines the nw <= 32 warp results by
// a second butterfly (one shared load per value) instead of reading all nw of them: at 512 threads
// the loop of 16 loads and adds per value cost two instructions per element of a bf16 row of 32 KiB.
template <int K, class A, class Op>
__device__ __forceinline__ void row_allreduce_n(A (&v)[K], Op op, A* smem) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = op(v[k], __shfl_xor_sync(0xffffffffu, v[k], o));
  if (blockDim.x == 32) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  A* s = smem + threadIdx.y * 32 * K;
  __syncthreads();  // the previous call's readers are done with smem
  if (lane == 0)
#pragma unroll
    for (int k = 0; k < K; ++k) s[k * 32 + warp] = v[k];
  __syncthreads();
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = lane < nw ? s[k * 32 + lane] : Op::template identity<A>();
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = op(v[k], __shfl_xor_sync(0xffffffffu, v[k], o));
}

// One value (smem: 32 entries per row group).
template <class A, class Op>
__device__ __forceinline__ A row_allreduce(A v, Op op, A* smem) {
  A a[1] = {v};
  row_allreduce_n<1>(a, op, smem);
  return a[0];
}

// Two sums at once (smem: 64 entries per row group).
template <class A>
__device__ __forceinline__ void row_allreduce2(A& a, A& b, A* smem) {
  A v[2] = {a, b};
  row_allreduce_n<2>(v, RowSum(), smem);
  a = v[0];
  b = v[1];
}

// V elements of T starting at p (aligned to V * sizeof(T) when V > 1).
template <class T, int V>
__device__ __forceinline__ Vec<T, V> load_vec(const T* p) {
  if constexpr (V == 1) {
    Vec<T, 1> r;
    r.v[0] = *p;
    return r;
  } else {
    return *reinterpret_cast<const Vec<T, V>*>(p);
  }
}
// p is global memory. 16-byte vectors go out as one st.global.v4.b32: as a struct copy, the compiler
// split some of them into 2- and 4-byte stores (ncu, H200, rms_norm backward of bf16 rows of 1024:
// twice the L2 write sectors, 0.53 of DRAM bandwidth against layer_norm's 0.73).
template <class T, int V>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, V>& v) {
  if constexpr (V == 1) {
    *p = v.v[0];
  } else if constexpr (sizeof(Vec<T, V>) == 16) {
    const unsigned* w = reinterpret_cast<const unsigned*>(&v);
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]) : "memory");
  } else {
    *reinterpret_cast<Vec<T, V>*>(p) = v;
  }
}

// Copies a row of nvec 16-byte vectors (V elements each) from global memory to shared memory by
// cp.async (the loads in flight hold no registers) and waits until the whole block's copies landed.
template <class T, int V>
__device__ __forceinline__ void stage_row(void* smem, const T* row, i64 nvec) {
  const unsigned base = smem_u32(smem);
  for (i64 i = threadIdx.x; i < nvec; i += blockDim.x) cp_async16(base + static_cast<unsigned>(i * 16), row + i * V, 16);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
}

// The register-free row cache of the backward row kernels: copies vectors k * blockDim.x + t (k <
// NV, the ones thread t reads, as in the register-cached kernels) of two rows (nvec vectors of V
// elements each; 0 for a row past the end) to shared memory by cp.async and waits for this thread's
// copies. A thread reads back only what it copied itself, so no barrier is needed.
template <class T, int V, int NV>
__device__ __forceinline__ void stage_own_vectors(Vec<T, V>* sa, const T* a, Vec<T, V>* sb, const T* b, i64 nvec) {
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const i64 i = static_cast<i64>(k) * blockDim.x + threadIdx.x;
    if (i < nvec) {
      cp_async16(smem_u32(sa + i), a + i * V, 16);
      cp_async16(smem_u32(sb + i), b + i * V, 16);
    }
  }
  cp_async_commit();
  cp_async_wait<0>();
}

// The first row handled by this block's row group in one step of the block-strided row loop.
__device__ __forceinline__ i64 first_row() { return static_cast<i64>(blockIdx.x) * blockDim.y + threadIdx.y; }
__device__ __forceinline__ i64 row_step() { return static_cast<i64>(gridDim.x) * blockDim.y; }
// Number of iterations of the row loop that every thread of the block runs (uniform).
__device__ __forceinline__ i64 row_iterations(i64 rows) {
  i64 per = static_cast<i64>(blockIdx.x) * blockDim.y;
  i64 step = row_step();
  return per >= rows ? 0 : (rows - per + step - 1) / step;
}

}  // namespace flame

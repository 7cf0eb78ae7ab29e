// Warp-level tensor-core and asynchronous-copy primitives for sm_80 and newer, as inline PTX (no
// CUDA headers): shared-memory addresses, 16-byte cp.async with zero fill, ldmatrix (plain and
// transposed) and mma.sync m16n8k16 with f16/bf16 inputs and f32 accumulators.
//
// Fragment layouts of mma.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating
// point type"), with g = lane / 4 and t = lane % 4:
//   A (16 x 16, row-major, 4 registers of 2 halves): a0a1 (row g, cols 2t, 2t+1), a2a3 (row g+8,
//     cols 2t, 2t+1), a4a5 (row g, cols 2t+8, 2t+9), a6a7 (row g+8, cols 2t+8, 2t+9).
//   B (16 x 8, "col": 2 registers): b0b1 (rows 2t, 2t+1, col g), b2b3 (rows 2t+8, 2t+9, col g).
//   C/D (16 x 8, f32, 4 registers): c0c1 (row g, cols 2t, 2t+1), c2c3 (row g+8, cols 2t, 2t+1).
// ldmatrix.x4 loads four 8x8 b16 matrices; lanes 8m..8m+7 give the row addresses of matrix m, and
// register m of lane l receives row l/4, cols 2(l%4), 2(l%4)+1 of matrix m (with .trans: rows
// 2(l%4), 2(l%4)+1 of col l/4, i.e. the transposed matrix). The lower address goes to the lower half.
#pragma once
#include "common.cuh"

namespace flame {

// The 32-bit shared-window address of a generic pointer into shared memory.
__device__ __forceinline__ unsigned smem_u32(const void* p) {
  unsigned r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}

// Copies `bytes` (0 or 16) bytes from global src to shared dst asynchronously and zero-fills the
// rest of the 16; with 0 nothing is read (src must still be a valid address).
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N committed groups of this thread are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// c += A B for one m16n8k16 tile; T is half_t or bf16_t.
template <class T>
__device__ __forceinline__ void mma16816(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                         unsigned b1) {
  if constexpr (is_bf16<T>::value) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// dst[0] += a, dst[1] += b in global memory, each element atomically (dst 8-byte aligned): one
// vector reduction on sm_90, two atomics before.
__device__ __forceinline__ void atomic_add2(float* dst, float a, float b) {
#if __CUDA_ARCH__ >= 900
  asm volatile("red.relaxed.gpu.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(dst), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(dst, a);
  atomicAdd(dst + 1, b);
#endif
}

}  // namespace flame

// Warpgroup tensor-core primitives of sm_90a (wgmma, PTX ISA "Asynchronous Warpgroup Level Matrix
// Multiply-Accumulate"), as inline PTX: shared-memory matrix descriptors for 128-byte swizzled tiles,
// the fence / commit / wait instructions, and m64nNk16 products with f32 accumulators, A from shared
// memory (SS) or from registers (RS). Four warps (a warpgroup) issue each product together.
//
// Accumulator layout of m64nN (per warp w of the warpgroup, g = lane / 4, t = lane % 4), the
// mma.m16n8 C layout repeated over N / 8 column tiles j: d[4j], d[4j+1] at row 16w + g, columns
// 8j + 2t, 8j + 2t + 1; d[4j+2], d[4j+3] at row 16w + g + 8. The A-from-registers layout of k16 is
// the mma.m16n8k16 A layout: so the accumulators of columns 16k..16k+15 packed in pairs
// (d[8k..8k+1], d[8k+2..3], d[8k+4..5], d[8k+6..7]) are the A operand of a following product.
//
// Shared tiles use the 128-byte swizzle: rows of 64 two-byte elements (128 bytes), 8 rows to a
// 1024-byte atom (1024-aligned), the 16-byte chunk c of row r stored at chunk c ^ (r % 8). A tile
// wider than 64 elements is stored as column blocks of 64, one after the other.
//   K-major operand (the 16 reduction elements contiguous: Q and K of Q K^T): start address at the
//     tile's row 0 plus 32 bytes per k16 step inside the block, SBO = 1024 (8 rows), LBO unused.
//   MN-major operand (N contiguous: V of P V): start address at reduction row 16 k, SBO = 1024
//     (8 reduction rows), LBO = the byte distance between 64-wide column blocks of N.
// Compiled for any arch (CI compiles every kernel for sm_80 and sm_90); the products exist only
// where NVRTC targets sm_90a, elsewhere they trap (the host never launches them there).
#pragma once
#include "mma.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FLAME_HAS_WGMMA 1
#else
#define FLAME_HAS_WGMMA 0
#endif

namespace flame {

// Shared-memory matrix descriptor: start address, LBO and SBO in 16-byte units, 128-byte swizzle.
__device__ __forceinline__ u64 wg_desc(unsigned smem_addr, unsigned lbo_bytes, unsigned sbo_bytes) {
  return static_cast<u64>((smem_addr & 0x3FFFFu) >> 4) | (static_cast<u64>((lbo_bytes >> 4) & 0x3FFFu) << 16) |
         (static_cast<u64>((sbo_bytes >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}

// Orders this thread's earlier register and shared-memory accesses before the warpgroup's next wgmma.
__device__ __forceinline__ void wg_fence() {
#if FLAME_HAS_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_commit() {
#if FLAME_HAS_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most N committed wgmma groups of the warpgroup are pending.
template <int N>
__device__ __forceinline__ void wg_wait() {
#if FLAME_HAS_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Generic-proxy writes to shared memory (st.shared, cp.async) made visible to wgmma's reads.
__device__ __forceinline__ void fence_proxy_async_shared() {
#if FLAME_HAS_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Keeps the compiler from moving accesses of v across a pending wgmma (v is its accumulator).
template <int N>
__device__ __forceinline__ void wg_fence_operands(float (&v)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(v[i])::"memory");
}

#define FLAME_WG_ACC32                                                                          \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define FLAME_WG_ACC64                                                                             \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "    \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "    \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "    \
  "%56, %57, %58, %59, %60, %61, %62, %63"
#define FLAME_WG_OUT4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define FLAME_WG_OUT16(i) FLAME_WG_OUT4(i), FLAME_WG_OUT4(i + 4), FLAME_WG_OUT4(i + 8), FLAME_WG_OUT4(i + 12)
#define FLAME_WG_OUT32 FLAME_WG_OUT16(0), FLAME_WG_OUT16(16)
#define FLAME_WG_OUT64 FLAME_WG_OUT32, FLAME_WG_OUT16(32), FLAME_WG_OUT16(48)

// scale_d 0: D = A B (the accumulators' old values are ignored); 1: D += A B.
// TR "0, 0": A and B K-major; "1, 1": both MN-major (transposed).
#define FLAME_WGMMA_SS(N, TY, ACC, OUT, IA, IB, IS, TR)                                                  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" IS ", 0;\n"                                          \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " {" ACC "}, %" IA ", %" IB \
               ", p, 1, 1, " TR ";\n}\n"                                                                 \
               : OUT                                                                                     \
               : "l"(da), "l"(db), "r"(scale_d))
#define FLAME_WGMMA_RS(N, TY, ACC, OUT, A0, A1, A2, A3, IB, IS)                                    \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" IS ", 0;\n"                                        \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " {" ACC "}, {%" A0 ", %" A1 \
               ", %" A2 ", %" A3 "}, %" IB ", p, 1, 1, 1;\n}\n"                                          \
               : OUT                                                                                   \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d))

// D[64 x 128] (+)= A B^T, A [64 x 16] and B [128 x 16] K-major in shared memory (descriptors da, db).
template <class T>
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], u64 da, u64 db, int scale_d) {
#if FLAME_HAS_WGMMA
  if constexpr (is_bf16<T>::value) FLAME_WGMMA_SS(128, "bf16", FLAME_WG_ACC64, FLAME_WG_OUT64, "64", "65", "66", "0, 0");
  else FLAME_WGMMA_SS(128, "f16", FLAME_WG_ACC64, FLAME_WG_OUT64, "64", "65", "66", "0, 0");
#else
  asm volatile("trap;");
#endif
}
// D[64 x 64] (+)= A B^T from shared memory; MN: both operands MN-major instead (A [16 x 64] stored
// with M contiguous, B [16 x 64] with N contiguous), i.e. D (+)= A^T B of the stored tiles.
template <class T, bool MN>
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], u64 da, u64 db, int scale_d) {
#if FLAME_HAS_WGMMA
  if constexpr (is_bf16<T>::value && MN) FLAME_WGMMA_SS(64, "bf16", FLAME_WG_ACC32, FLAME_WG_OUT32, "32", "33", "34", "1, 1");
  else if constexpr (is_bf16<T>::value) FLAME_WGMMA_SS(64, "bf16", FLAME_WG_ACC32, FLAME_WG_OUT32, "32", "33", "34", "0, 0");
  else if constexpr (MN) FLAME_WGMMA_SS(64, "f16", FLAME_WG_ACC32, FLAME_WG_OUT32, "32", "33", "34", "1, 1");
  else FLAME_WGMMA_SS(64, "f16", FLAME_WG_ACC32, FLAME_WG_OUT32, "32", "33", "34", "0, 0");
#else
  asm volatile("trap;");
#endif
}

// D[64 x N] (+)= A B for N = 64 or 128, A [64 x 16] from registers (a: this lane's four packed
// pairs), B [16 x N] MN-major in shared memory (descriptor db).
template <class T, int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const unsigned (&a)[4], u64 db, int scale_d) {
  static_assert(N == 64 || N == 128, "wgmma_rs: N is 64 or 128");
#if FLAME_HAS_WGMMA
  if constexpr (N == 128 && is_bf16<T>::value) FLAME_WGMMA_RS(128, "bf16", FLAME_WG_ACC64, FLAME_WG_OUT64, "64", "65", "66", "67", "68", "69");
  else if constexpr (N == 128) FLAME_WGMMA_RS(128, "f16", FLAME_WG_ACC64, FLAME_WG_OUT64, "64", "65", "66", "67", "68", "69");
  else if constexpr (is_bf16<T>::value) FLAME_WGMMA_RS(64, "bf16", FLAME_WG_ACC32, FLAME_WG_OUT32, "32", "33", "34", "35", "36", "37");
  else FLAME_WGMMA_RS(64, "f16", FLAME_WG_ACC32, FLAME_WG_OUT32, "32", "33", "34", "35", "36", "37");
#else
  asm volatile("trap;");
#endif
}

}  // namespace flame

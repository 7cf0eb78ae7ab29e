// Shared-memory mbarriers and 1-D bulk copies (TMA) for the sm_90 producer/consumer kernels
// (attention_tma*.cuh, norm_ring.cuh). A full barrier counts one arrival (the producer's
// arrive.expect_tx of a stage's bytes) and completes when the copies have delivered those bytes; an
// empty barrier counts the consumers' arrivals. A stage's barrier completes once per use, so the
// n-th use waits for parity n & 1. Defined only where NVRTC targets sm_90 or later (CI compiles every
// kernel for sm_80 too: kernels that use these guard their bodies the same way).
#pragma once
#include "mma.cuh"

namespace flame {

#if __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// One arrival that also raises the phase's expected transaction bytes (the TMA copies complete them).
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// After thread 0 has initialised the block's mbarriers: the initialisation is made visible to the TMA
// (the async proxy), then the block barrier lets every thread use them.
__device__ __forceinline__ void mbarriers_ready() {
  if (threadIdx.x == 0) asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  __syncthreads();
}
// Waits until the phase of the given parity has completed (acquire: the TMA's writes are visible).
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  unsigned done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
// An L2 policy for data read once: its lines are the first evicted.
__device__ __forceinline__ u64 l2_evict_first() {
  u64 policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from global src to shared dst,
// completing them on the barrier bar, with the L2 policy given.
__device__ __forceinline__ void bulk_load(unsigned dst, const void* src, unsigned bytes, unsigned bar, u64 policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}
#endif

}  // namespace flame

// A ring of shared-memory chunks that one producer thread fills by TMA bulk copies (mbarrier.cuh)
// ahead of 15 consumer warps, for sm_90 row kernels whose rows (one or more inputs of the same
// length) stream through a block that stays on its SM: norm_ring.cuh (layer_norm / rms_norm
// backward) and loss_ring.cuh (cross-entropy with its gradient). One block per SM takes rows
// blockIdx.x, + gridDim.x, ...; the producer runs up to a ring ahead of the arithmetic, across row
// boundaries, so the SM's loads never wait for a row's reduction.
//
// A chunk is 480 16-byte vectors of one input (7.5 KiB); consumer thread t owns vector t of every
// chunk, so its columns are the same in every row. A slot holds one chunk of each input. Chunk
// number q of the block (counted over its rows) lives in slot q % S; its full barrier completes for
// the (q / S)-th time, and the producer refills the slot after the empty barrier's (q / S - 1)-th
// completion (one arrival per consumer warp after the warp's last read of the slot). A row's chunks
// must fit in the ring (the host checks it) when the consumers read the row twice before releasing it.
#pragma once
#include "mbarrier.cuh"
#include "row_constants.cuh"

namespace flame {
namespace ring {

// The geometry (kConsumers, kChunkBytes, the slots and shared memory of a ring) is in
// row_constants.cuh, which the host's launch planning (src/ops/row_router.cpp) reads too.
template <int NIN, int RING_BYTES = kMaxRingBytes>
struct Layout {
  static constexpr int kSlots = slots_of(NIN, RING_BYTES);  // 12 for g and x in 192 KiB
  static constexpr int kRingBytes = chunk_bytes_of(NIN, RING_BYTES);
  static constexpr int kSmemBytes = smem_bytes_of(NIN, RING_BYTES);  // chunks, then a full and an empty barrier per slot
};

}  // namespace ring

// 16 bytes kept as four words: held across the row loop, 16-bit elements stay two to a register.
typedef Vec<unsigned, 4> Words;
template <class T, int V>
__device__ __forceinline__ void unpack_words(const Words& r, compute_t<T> (&xs)[V]) {
  unpack(reinterpret_cast<const Vec<T, V>&>(r), xs);
}

#if __CUDA_ARCH__ >= 900
extern __shared__ __align__(128) unsigned char ring_smem[];

template <int NIN, int RING_BYTES = ring::kMaxRingBytes>
struct Ring {
  typedef ring::Layout<NIN, RING_BYTES> L;
  static constexpr int S = L::kSlots;
  unsigned base;  // shared-window address of the first chunk
  __device__ unsigned full(unsigned q) const { return base + L::kRingBytes + 8 * (q % S); }
  __device__ unsigned empty(unsigned q) const { return full(q) + 8 * S; }
  __device__ static unsigned parity(unsigned q) { return (q / S) & 1; }
  // Thread 0 initialises the barriers; every thread of the block must call this.
  __device__ void init() const {
    if (threadIdx.x == 0)
      for (unsigned s = 0; s < S; ++s) {
        mbar_init(full(s), 1);
        mbar_init(empty(s), ring::kConsumers / 32);
      }
    mbarriers_ready();
  }
  // One thread: chunk after chunk of the rows of this block, NIN inputs of row_bytes per row; rows
  // for which skip(row) holds are not loaded (the consumers skip them too).
  template <class Skip>
  __device__ void produce(const void* const (&src)[NIN], i64 rows, i64 row_bytes, Skip&& skip) const {
    const u64 policy = l2_evict_first();  // every input is read once
    const int nch = static_cast<int>((row_bytes + ring::kChunkBytes - 1) / ring::kChunkBytes);
    unsigned q = 0;
    for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
      if (skip(row)) continue;
      for (int k = 0; k < nch; ++k, ++q) {
        if (q >= S) mbar_wait(empty(q), parity(q) ^ 1);  // the slot's previous use is released
        const i64 at = static_cast<i64>(k) * ring::kChunkBytes, left = row_bytes - at;
        const unsigned bytes = static_cast<unsigned>(left < ring::kChunkBytes ? left : ring::kChunkBytes);
        mbar_expect_tx(full(q), NIN * bytes);
#pragma unroll
        for (int i = 0; i < NIN; ++i)
          bulk_load(base + ((q % S) * NIN + i) * ring::kChunkBytes, static_cast<const char*>(src[i]) + row * row_bytes + at,
                    bytes, full(q), policy);
      }
    }
  }
  __device__ void produce(const void* const (&src)[NIN], i64 rows, i64 row_bytes) const {
    produce(src, rows, row_bytes, [](i64) { return false; });
  }
  // Vector v (consumer thread v's) of input i in chunk q, in the compute type.
  template <class T, int V>
  __device__ void at(unsigned q, int i, compute_t<T> (&xs)[V], int v = threadIdx.x) const {
    unpack_words<T>(reinterpret_cast<const Words*>(ring_smem + ((q % S) * NIN + i) * ring::kChunkBytes)[v], xs);
  }
  // The consumer warp is done with chunk q.
  __device__ void release(unsigned q) const {
    __syncwarp();
    if ((threadIdx.x & 31) == 0) mbar_arrive(empty(q));
  }
};

// Sums each of v[0..N) over the 480 consumer threads (named barrier 1: the producer warp takes no
// part); red holds N x 16 values (one per consumer warp). Every consumer thread gets the same sums.
template <int N, class A>
__device__ __forceinline__ void consumer_sum(A (&v)[N], A* red) {
#pragma unroll
  for (int n = 0; n < N; ++n)
    for (int o = 16; o > 0; o >>= 1) v[n] += __shfl_xor_sync(0xffffffffu, v[n], o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  asm volatile("bar.sync 1, %0;\n" ::"n"(ring::kConsumers) : "memory");  // the previous sum's readers are done
  if (lane == 0)
#pragma unroll
    for (int n = 0; n < N; ++n) red[n * 16 + warp] = v[n];
  asm volatile("bar.sync 1, %0;\n" ::"n"(ring::kConsumers) : "memory");
#pragma unroll
  for (int n = 0; n < N; ++n) {
    A s = red[n * 16];
    for (int w2 = 1; w2 < ring::kConsumers / 32; ++w2) s += red[n * 16 + w2];
    v[n] = s;
  }
}

#endif

}  // namespace flame

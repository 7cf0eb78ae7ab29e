// Long rows (32-64 KiB of 16-byte vectors) of the dx-only layer_norm / rms_norm backward on sm_90:
// g and x stream through a ring of shared-memory chunks that one producer thread fills by TMA bulk
// copies (mbarrier.cuh). One block per SM takes rows blockIdx.x, + gridDim.x, ...; the producer runs
// up to a ring ahead of the arithmetic, across row boundaries, so the SM's loads never wait for a
// row's reduction. The kernel it replaces there (norm_bwd_stream, one 1024-thread block per row) loads
// the next row only after its block is done with the previous one, and reads each row twice.
// (A forward built the same way measured slower than norm_fwd_block's three staged rows per SM: with
// one input per row, the consumers' passes and reductions of one row at a time set the pace.)
//
// A block: 15 consumer warps and one producer warp. A chunk is 480 vectors of one input (7.5 KiB);
// consumer thread t owns vector t of every chunk, so its columns are the same in every row and the
// weight of those columns stays in its registers for the whole kernel (kMaxChunks vectors, packed).
// A slot holds one chunk of each input: 12 slots of g and x in at most 192 KiB; a row of nch <= 9
// chunks takes nch consecutive slots. Chunk number q of the block (counted over its rows) lives in
// slot q % S; its full barrier completes for the (q / S)-th time, and the producer refills the slot
// after the empty barrier's (q / S - 1)-th completion (one arrival per consumer warp after the warp's
// last read of the slot). The consumers wait on the full barriers in the first pass over a row, reduce
// over the 480 consumer threads (named barrier 1), and release the slots as they write dx.
#pragma once
#include "mbarrier.cuh"
#include "norm.cuh"

namespace flame {
namespace ring {

// 15 consumer warps and one producer warp: 4 warps per SM sub-partition, so 128 registers per thread
// (a 17th warp would make it 5 on one and cap every thread at 96).
constexpr int kConsumers = 480;
constexpr int kThreads = kConsumers + 32;
constexpr int kChunkVecs = kConsumers;        // one 16-byte vector per consumer thread and input
constexpr int kChunkBytes = kChunkVecs * 16;  // 7.5 KiB
constexpr int kMaxChunks = 9;                 // rows of up to 64 KiB (4096 vectors)
constexpr int kMaxRingBytes = 192 * 1024;

template <int NIN>
struct Layout {
  static constexpr int kSlots = kMaxRingBytes / (NIN * kChunkBytes);  // 12 for g and x
  static constexpr int kRingBytes = kSlots * NIN * kChunkBytes;
  static constexpr int kSmemBytes = kRingBytes + 16 * kSlots;  // chunks, then a full and an empty barrier per slot
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

template <int NIN>
struct Ring {
  static constexpr int S = ring::Layout<NIN>::kSlots;
  unsigned base;  // shared-window address of the first chunk
  __device__ unsigned full(unsigned q) const { return base + ring::Layout<NIN>::kRingBytes + 8 * (q % S); }
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
  // One thread: chunk after chunk of the rows of this block, NIN inputs of row_bytes per row.
  __device__ void produce(const void* const (&src)[NIN], i64 rows, i64 row_bytes) const {
    const u64 policy = l2_evict_first();  // every input is read once
    const int nch = static_cast<int>((row_bytes + ring::kChunkBytes - 1) / ring::kChunkBytes);
    unsigned q = 0;
    for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
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
  // Consumer thread t's vector of input i in chunk q, in the compute type.
  template <class T, int V>
  __device__ void at(unsigned q, int i, compute_t<T> (&xs)[V]) const {
    unpack_words<T>(reinterpret_cast<const Words*>(ring_smem + ((q % S) * NIN + i) * ring::kChunkBytes)[threadIdx.x], xs);
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

// The vectors of p (the weight) at this consumer thread's columns; untouched when p is null.
template <class T, int V>
__device__ __forceinline__ void load_own_columns(const T* p, i64 nvec, int nch, Words (&out)[ring::kMaxChunks]) {
  if (!p) return;
#pragma unroll
  for (int k = 0; k < ring::kMaxChunks; ++k) {
    const i64 i = static_cast<i64>(k) * ring::kChunkVecs + threadIdx.x;
    if (k < nch && i < nvec) out[k] = *reinterpret_cast<const Words*>(p + i * V);
  }
}
#endif

// dx of rows of D = nvec * V elements from g, x and the saved statistics, as norm_bwd_stream.
template <class T, int MODE>
__global__ void __launch_bounds__(ring::kThreads, 1) norm_bwd_ring(const T* __restrict__ g, const T* __restrict__ x,
                                                                  const T* __restrict__ w,
                                                                  const compute_t<T>* __restrict__ mean,
                                                                  const compute_t<T>* __restrict__ rstd,
                                                                  T* __restrict__ dx, i64 rows, i64 D) {
#if __CUDA_ARCH__ >= 900
  typedef compute_t<T> A;
  constexpr int V = 16 / sizeof(T), KM = ring::kMaxChunks;
  __shared__ A red[2 * 16];
  const Ring<2> r{smem_u32(ring_smem)};
  r.init();
  const i64 nvec = D / V;
  const int nch = static_cast<int>((nvec + ring::kChunkVecs - 1) / ring::kChunkVecs);
  if (threadIdx.x >= ring::kConsumers) {
    if (threadIdx.x == ring::kConsumers) r.produce({g, x}, rows, D * static_cast<i64>(sizeof(T)));
    return;
  }
  Words wv[KM];
  load_own_columns<T, V>(w, nvec, nch, wv);
  const A inv_d = A(1) / static_cast<A>(D);
  unsigned q0 = 0;
  for (i64 row = blockIdx.x; row < rows; row += gridDim.x, q0 += nch) {
    const A mu = MODE == kRmsNorm ? A(0) : mean[row], rs = rstd[row];
    A s[2] = {A(0), A(0)};  // sum(g w), sum(g w xhat)
#pragma unroll
    for (int k = 0; k < KM; ++k) {
      if (k < nch) {
        mbar_wait(r.full(q0 + k), Ring<2>::parity(q0 + k));
        if (static_cast<i64>(k) * ring::kChunkVecs + threadIdx.x < nvec) {
          A gs[V], xs[V], ws[V];
          r.template at<T, V>(q0 + k, 0, gs);
          r.template at<T, V>(q0 + k, 1, xs);
          if (w) unpack_words<T>(wv[k], ws);
#pragma unroll
          for (int j = 0; j < V; ++j) {
            const A gw = w ? gs[j] * ws[j] : gs[j];
            s[0] += gw;
            s[1] += gw * (xs[j] - mu) * rs;
          }
        }
      }
    }
    consumer_sum(s, red);
    const A ma = MODE == kRmsNorm ? A(0) : s[0] * inv_d, mb = s[1] * inv_d;
    T* dxr = dx + row * D;
#pragma unroll
    for (int k = 0; k < KM; ++k) {
      if (k < nch) {
        const i64 i = static_cast<i64>(k) * ring::kChunkVecs + threadIdx.x;
        if (i < nvec) {
          A gs[V], xs[V], ws[V];
          r.template at<T, V>(q0 + k, 0, gs);
          r.template at<T, V>(q0 + k, 1, xs);
          if (w) unpack_words<T>(wv[k], ws);
          Vec<T, V> o;
#pragma unroll
          for (int j = 0; j < V; ++j) {
            const A gw = w ? gs[j] * ws[j] : gs[j];
            o.v[j] = cast<T>(rs * (gw - ma - (xs[j] - mu) * rs * mb));
          }
          store_vec<T, V>(dxr + i * V, o);
        }
        r.release(q0 + k);
      }
    }
  }
#endif
}

}  // namespace flame

// Constants of the row kernels that the host (src/ops/row_router.*) and the kernels (norm.cuh,
// softmax.cuh, ring.cuh, norm_ring.cuh, loss_ring.cuh) must agree on, in ONE place both include:
// the norm kinds and row-storage kinds that are template arguments, the launch bounds the host's
// block sizes must respect, and the TMA ring's geometry (chunk size, slots, shared-memory layout).
// Plain C++17 (constexpr, no device code, no includes): NVRTC compiles it inside the kernel sources
// and the host includes it as "cuda/row_constants.cuh". The host's static_asserts on these values
// live in src/ops/row_router.cpp.
#pragma once

namespace flame {

// The MODE template argument of the norm kernels (norm.cuh, norm_ring.cuh).
constexpr int kLayerNorm = 0, kRmsNorm = 1, kGroupNorm = 2;

// The ROW template argument of norm_bwd: where the g and x rows wait between its two passes.
// kRowGlobal: re-read (hits L2); kRowRegs: registers; kRowSmem: shared memory (staged rows).
constexpr int kRowGlobal = 0, kRowRegs = 1, kRowSmem = 2;

// The MODE template argument of batch_norm's channel passes (bn_reduce, bn_finalize): the forward
// statistics (mean, rstd, running statistics) or the backward sums (sum g, sum g (x - mean)).
constexpr int kBnStatistics = 0, kBnGradientSums = 1;

// __launch_bounds__ of the row kernels: the most threads the host may give one block.
constexpr int kNormRowsMaxThreads = 512;        // norm_fwd, norm_bwd
constexpr int kSoftmaxFwdMaxThreads = 1024;     // softmax_fwd
constexpr int kSoftmaxBwdMaxThreads = 512;      // softmax_bwd
constexpr int kStreamRowsMaxThreads = 1024;     // norm_fwd_block (streamed), *_stream
constexpr int kSmemRowsMaxThreads = 512;        // norm_fwd_block / softmax_fwd_smem (row in shared memory)

namespace ring {

// 15 consumer warps and one producer warp: 4 warps per SM sub-partition, so 128 registers per thread
// (a 17th warp would make it 5 on one and cap every thread at 96).
constexpr int kConsumers = 480;
constexpr int kThreads = kConsumers + 32;
constexpr int kChunkVecs = kConsumers;        // one 16-byte vector per consumer thread and input
constexpr int kChunkBytes = kChunkVecs * 16;  // 7.5 KiB
constexpr int kMaxRingBytes = 192 * 1024;
constexpr int kBarrierBytesPerSlot = 16;      // a full and an empty 8-byte mbarrier per slot

// The ring of NIN inputs in RING_BYTES: its slots, the bytes of its chunks, and the dynamic shared
// memory of a block (the chunks, then the barriers).
constexpr int slots_of(int nin, int ring_bytes) { return ring_bytes / (nin * kChunkBytes); }
constexpr int chunk_bytes_of(int nin, int ring_bytes) { return slots_of(nin, ring_bytes) * nin * kChunkBytes; }
constexpr int smem_bytes_of(int nin, int ring_bytes) {
  return chunk_bytes_of(nin, ring_bytes) + kBarrierBytesPerSlot * slots_of(nin, ring_bytes);
}

// norm_bwd_ring (g and x in the default ring): rows of up to 64 KiB (4096 vectors).
constexpr int kNormRingInputs = 2;
constexpr int kMaxChunks = 9;

// ce_index_fwd_grad_ring: at most 30 slots of one input (+ 16 bytes of barriers per slot: 225.5 KiB),
// kLossMaxSlots / SLOTS blocks per SM. Two shapes: 14 slots with one group of consumers (two blocks
// per SM) for rows of up to 14 chunks, else 30 slots with two groups.
constexpr int kLossMaxSlots = 30;
constexpr int kLossShortSlots = 14, kLossShortGroups = 1;
constexpr int kLossLongSlots = 30, kLossLongGroups = 2;

}  // namespace ring
}  // namespace flame

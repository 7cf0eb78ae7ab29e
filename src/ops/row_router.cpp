// The row-kernel router (see ops/row_router.h): plan_row_kernel and one planning function per
// family of row kernels. The measurements behind each threshold are noted where it is used.
#include "ops/row_router.h"
#include <algorithm>
#include <climits>

namespace flame {

// ---- the host's view of cuda/row_constants.cuh (the kernels include the same header) ----
static_assert(ring::kThreads == ring::kConsumers + 32, "ring blocks: the consumer warps and one producer warp");
static_assert(ring::kChunkBytes == 480 * 16, "a ring chunk is one 16-byte vector per consumer thread");
static_assert(ring::slots_of(ring::kNormRingInputs, ring::kMaxRingBytes) == 12,
              "norm_bwd_ring: 12 slots of a g and an x chunk in 192 KiB");
static_assert(ring::kMaxChunks * ring::kChunkVecs * 16 >= 64 * 1024,
              "norm_bwd_ring keeps kMaxChunks weight vectors per thread: rows of up to 64 KiB");
static_assert(norm_ring_smem_bytes() == 12 * 2 * 7680 + 12 * 16, "norm_bwd_ring's dynamic shared memory");
static_assert(ring::kLossLongSlots == ring::kLossMaxSlots && ring::kLossMaxSlots / ring::kLossShortSlots == 2,
              "ce_index_fwd_grad_ring: two blocks of the short ring per SM, one of the long ring");
static_assert(2 * ring::kLossShortSlots * (ring::kChunkBytes + ring::kBarrierBytesPerSlot) <= 228 * 1024 &&
                  ring::kLossLongSlots * (ring::kChunkBytes + ring::kBarrierBytesPerSlot) <= 227 * 1024,
              "the cross-entropy rings fit an sm_90 SM (228 KiB) and block (227 KiB)");
static_assert(ring::smem_bytes_of(1, ring::kLossShortSlots * ring::kChunkBytes) ==
                      ring::kLossShortSlots * (ring::kChunkBytes + ring::kBarrierBytesPerSlot) &&
                  ring::slots_of(1, ring::kLossLongSlots * ring::kChunkBytes) == ring::kLossLongSlots,
              "ce_index_fwd_grad_ring's Layout<1, SLOTS * kChunkBytes>: SLOTS slots of one chunk and their barriers");
static_assert(ring::kLossLongGroups * ring::kConsumers + 32 <= 1024, "ce_index_fwd_grad_ring's block");
static_assert(static_cast<int>(RowNorm::Layer) == kLayerNorm && static_cast<int>(RowNorm::Rms) == kRmsNorm &&
                  static_cast<int>(RowNorm::Group) == kGroupNorm,
              "RowNorm is the norm kernels' MODE");
static_assert(kRowThresholds.long_threads <= kSmemRowsMaxThreads && kRowThresholds.mid_max_threads <= kSmemRowsMaxThreads,
              "SharedRow blocks within the kernels' launch bounds");
static_assert(kRowThresholds.long_smem_max <= 227 * 1024 / 3, "long SharedRow rows: 3 resident per sm_90 SM");

namespace {

const RowThresholds& limits = kRowThresholds;

size_t row_bytes_of(const RowProblem& q) { return static_cast<size_t>(q.D) * dtype_size(q.dtype); }
bool full_vectors(const RowProblem& q) { return q.v * dtype_size(q.dtype) == 16; }

// What one thread keeps in registers per cached element: `arrays` tensors of the element type,
// `acc_arrays` accumulators of the compute type (norm backward), within `register_words` 32-bit
// registers; `max_threads` matches the kernel's __launch_bounds__.
struct RegisterBudget {
  int arrays = 1;
  int acc_arrays = 0;
  int register_words = 32;
  int max_threads = 1024;
  bool allow_no_cache = false;     // may drop the cache (re-read: RowPath::Global) to fit the accumulators
  bool one_row_per_block = false;  // group norm backward (its weight sums are per block)
  // Forward kernels: rows of 4-32 KiB get one block per row group instead of a persistent grid
  // (measured on an H200: 0.86 -> 0.93 of copy for layer_norm at 16384x4096; shorter rows and the
  // backward kernels do better persistent).
  bool spread_mid_rows = false;
  // Backward kernels: short rows and 2-byte middle rows (staged_bwd_rows) wait in shared memory
  // instead of registers between the two passes (RowPath::Staged); only accumulators then take registers.
  bool stage_short = false;
  int64_t resident_threads = limits.resident_threads;  // per SM, for the persistent grid
};

// ---- rows in shared memory ----
// Forward rows in 16-byte vectors staged in shared memory by cp.async, one row per block
// (stage_row in cuda/rows.cuh), so that the loads in flight hold no registers:
//  - short rows, more than 1 KiB and up to 4 KiB: a block of 32 threads (64 above 3 KiB) per row, up
//    to 32 resident per SM. On an H200 at 65536 rows of 768 f32 (inputs beyond L2): layer_norm 0.86 ->
//    0.93 of copy, rms_norm 0.88 -> 0.95, softmax 0.82 -> 0.95; rows of 256 measured worse (half a warp
//    idle), rows of 4096 floats stay register-cached (0.93). Measured no better (2026-11-28): a
//    persistent grid whose blocks stage their next row while working on this one (H100, bf16
//    65536x1024: layer_norm 0.93 -> 0.80, softmax 0.95 -> 0.80), two or four one-warp rows per
//    block (H100 +-0.01; H200 bf16 layer_norm +0.02, f32 softmax -0.08), and one-warp layer_norm
//    blocks without the 40-register bound (H200 bf16 65536x1024: 0.867 -> 0.846);
//  - middle rows, of 2-byte types from 4 KiB and of f32 from 16 KiB, up to 32 KiB: one thread per
//    `bytes_per_thread` of the row (a multiple of 32 threads, 64 to 512), 64 for layer_norm (more
//    threads for its two output terms; 128 measured 0.92 -> 0.85 at bf16 65536x4096), 128 for rms_norm,
//    softmax and group_norm (bf16 32x128x64x64, rows of 32 KiB: 0.53 -> 0.56, more rows resident). In registers
//    (one block per row group, up to 99 registers for 32 KiB) these rows ran at half the copy
//    bandwidth in bf16. H200, 2026-11-27, bf16 layer_norm / rms_norm / softmax forward: 65536x4096
//    0.55 / 0.77 / 0.53 -> 0.89 / 0.96 / 0.75, 8192x16384 0.45 / 0.52 / 0.51 -> 0.79 / 0.92 / 0.73; f32
//    4096x8192 0.81 / 0.86 / 0.78 -> 0.88 / 0.88 / 0.90 (f32 rows of 16 KiB measured the same either way);
//  - long rows, more than 32 KiB and up to 64 KiB: 512 threads; 64 KiB keeps 3 rows resident per SM
//    on sm_90 (227 KiB) and 2 on sm_80; layer_norm 2048x16384 0.69 -> 0.81 of copy, group_norm
//    32x128x64x64 0.49 -> 0.70, softmax 2048x16384 0.70 -> 0.88. Splitting these rows over a
//    thread-block cluster of 2-8 blocks (slices of 8-32 KiB exchanging partial sums through distributed
//    shared memory) measured slower, forward and backward (layer_norm 0.80 -> 0.49-0.64 of copy): a
//    cluster waits at each of its barriers for its slowest block while all its slices stay allocated.
//
// The short rows above. The backward kernels (norm_bwd / softmax_bwd) keep their two input rows in
// shared memory there instead of registers (H200 at 65536x768 f32: layer_norm fwd+bwd 0.80 -> 0.87 of
// copy; at 16384x768 0.69 -> 0.74).
bool short_shared_rows(const RowProblem& q) {
  const size_t bytes = row_bytes_of(q);
  return full_vectors(q) && bytes > limits.short_smem_min && bytes <= limits.short_smem_max;
}

// The rows whose forward runs SharedRow (see above; f64: long rows only).
bool shared_forward_rows(const RowProblem& q) {
  const size_t tsize = dtype_size(q.dtype), bytes = row_bytes_of(q);
  if (!full_vectors(q)) return false;
  const size_t mid_min = tsize == 2 ? limits.short_smem_max : (tsize == 4 ? limits.f32_mid_smem_min : limits.mid_smem_max);
  return short_shared_rows(q) || (bytes > mid_min && bytes <= limits.long_smem_max);
}

// The rows whose backward kernels stage g and x (or y) in shared memory: the short rows above, and
// middle rows of 2-byte types (more than 4 KiB, up to 32 KiB), whose register-cached row groups held
// up to 99 registers. H200, 2026-11-27, bf16 fwd+bwd(x) of layer_norm / rms_norm / softmax at
// 65536x4096: 0.80 / 0.89 / 0.82 -> 0.84 / 0.96 / 0.82 of copy; layer_norm 32768x8192 0.68 -> 0.85,
// softmax 8192x16384 0.73 -> 0.85; layer_norm with dweight/dbias 65536x3072 0.46 -> 0.62.
bool staged_backward_rows(const RowProblem& q) {
  const size_t bytes = row_bytes_of(q);
  return short_shared_rows(q) ||
         (dtype_size(q.dtype) == 2 && full_vectors(q) && bytes > limits.short_smem_max && bytes <= limits.mid_smem_max);
}

// Rows of 32-64 KiB in 16-byte vectors on sm_90 and later, where the dx-only layer_norm / rms_norm
// backward runs cuda/norm_ring.cuh: one block per SM streams its rows through a ring of shared-memory
// chunks that TMA bulk copies fill ahead of the arithmetic, across rows (H200, layer_norm fwd+bwd(x)
// 2048 / 4096 / 8192 x 16384 f32: 0.79 / 0.84 / 0.73 -> 0.83 / 0.86 / 0.88 of copy, against norm_bwd_stream).
bool norm_ring_rows(const RowProblem& q, const RowDevice& dev) {
  const size_t bytes = row_bytes_of(q);
  return dev.cc_major >= 9 && full_vectors(q) && bytes >= limits.mid_smem_max && bytes <= limits.long_smem_max;
}

// One row per block in shared memory (the forward kernels above).
RowPlan plan_shared_row(const RowProblem& q, unsigned bytes_per_thread) {
  RowPlan p;
  p.path = RowPath::SharedRow;
  p.v = q.v;
  const unsigned bytes = static_cast<unsigned>(row_bytes_of(q));
  unsigned& tpr = p.launch.threads_x;
  if (bytes <= limits.short_smem_max) tpr = bytes > limits.short_two_warps_above ? 64 : 32;
  else if (bytes <= limits.mid_smem_max)
    tpr = std::min(limits.mid_max_threads, std::max(limits.mid_min_threads, (bytes / bytes_per_thread + 31) / 32 * 32));
  else tpr = limits.long_threads;
  p.launch.grid = static_cast<unsigned>(std::min<int64_t>(q.rows, INT32_MAX));  // as many resident as shared memory allows
  p.launch.smem_bytes = bytes;
  p.launch.set_max_smem = true;
  return p;
}

// Streaming kernels: one block of up to 1024 threads per row.
RowPlan plan_stream(const RowProblem& q, const RowDevice& dev) {
  RowPlan p;
  p.path = RowPath::Stream;
  p.v = q.v;
  const int64_t vectors = (q.D + q.v - 1) / q.v;
  p.launch.threads_x = vectors >= limits.stream_big_vectors ? 1024 : (vectors >= limits.stream_mid_vectors ? 256 : 32);
  p.launch.grid = static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>(q.rows, static_cast<int64_t>(dev.sm_count) * limits.stream_blocks_per_sm)));
  return p;
}

// Register-cached row groups (or, when the row does not fit the budget, the streaming kernels).
RowPlan plan_register_rows(const RowProblem& q, const RowDevice& dev, RegisterBudget b) {
  const bool staged = b.stage_short && staged_backward_rows(q);
  if (staged) b.arrays = 0;  // the rows wait in shared memory
  RowPlan p;
  p.v = q.v;
  const int64_t vectors = (q.D + q.v - 1) / q.v;
  const size_t tsize = dtype_size(q.dtype), asize = q.dtype == FLAME_DTYPE_F64 ? 8 : 4;
  bool found = false, cached = true;
  // Prefer keeping the row cached, then one warp per row (no block barrier in the reductions; on an
  // H200 0.52 -> 0.71 of copy for layer_norm at 16384x768), then few threads per row (<= 256, then
  // 512), then few vectors. Intermediate widths (64, 128) measured no better.
  for (int cache = 1; cache >= (b.allow_no_cache ? 0 : 1) && !found; --cache) {
    for (int limit : {32, 256, 512, b.max_threads}) {
      if (limit > b.max_threads || found) continue;
      for (int nv : kRowVectorsPerThread) {
        const int64_t tpr = ((vectors + nv - 1) / nv + 31) / 32 * 32;
        const size_t bytes = (cache ? static_cast<size_t>(b.arrays) * nv * q.v * tsize : 0) +
                             static_cast<size_t>(b.acc_arrays) * nv * q.v * asize;
        if (tpr > limit || bytes > static_cast<size_t>(b.register_words) * 4) continue;
        p.nv = nv;
        p.launch.threads_x = static_cast<unsigned>(std::max<int64_t>(32, tpr));
        cached = cache != 0;
        found = true;
        break;
      }
    }
  }
  if (!found) return plan_stream(q, dev);
  p.path = staged ? RowPath::Staged : (cached ? RowPath::Registers : RowPath::Global);
  const unsigned tpr = p.launch.threads_x;
  const unsigned rpb = b.one_row_per_block ? 1 : std::max(1u, limits.block_rows_threads / tpr);  // short rows: <= 8 per block
  p.launch.threads_y = rpb;
  const int64_t groups = (q.rows + rpb - 1) / rpb;
  const int64_t per_sm = std::max<int64_t>(1, b.resident_threads / static_cast<int64_t>(tpr * rpb));
  p.launch.grid = static_cast<unsigned>(std::max<int64_t>(1, std::min(groups, static_cast<int64_t>(dev.sm_count) * per_sm)));
  const size_t bytes = row_bytes_of(q);
  if (b.spread_mid_rows && bytes >= limits.spread_min && bytes <= limits.spread_max)
    p.launch.grid = static_cast<unsigned>(std::min<int64_t>(groups, INT32_MAX));
  if (staged) {  // 2 rows of D per row group; the attribute every time: the 48 KiB default covers static +
                 // dynamic shared memory, and 48 KiB of rows plus the kernels' static red[] exceed it
    p.launch.smem_bytes = static_cast<unsigned>(2 * bytes * rpb);
    p.launch.set_max_smem = true;
  }
  return p;
}

// ---- norms ----

// Forward: the row in registers (launch bounds 512), or one row per block in shared memory.
RowPlan plan_norm_forward(const RowProblem& q, const RowDevice& dev) {
  if (shared_forward_rows(q))  // layer_norm: twice the threads per byte of rms_norm / group_norm
    return plan_shared_row(q, q.norm == RowNorm::Layer ? limits.layer_norm_bytes_per_thread : limits.bytes_per_thread);
  RegisterBudget b;
  b.arrays = 1;
  b.register_words = limits.fwd_register_words;
  b.max_threads = kNormRowsMaxThreads;
  b.spread_mid_rows = true;
  return plan_register_rows(q, dev, b);
}

// Backward (launch bounds 512): g and x, plus (LN/RMS, when dw or db is wanted) two accumulator
// arrays; GN keeps its weight sums in shared memory, one row per block. Short LN/RMS rows and 2-byte
// middle rows wait in shared memory.
//
// dx of LN/RMS rows of 32 KiB and more: two passes over global memory (the second hits L2) beat one
// row of g and x per SM in registers (H200, 2048x16384 f32: 0.66 -> 0.71 of copy for layer_norm
// fwd+bwd; 4096-wide rows measured worse streamed). Blocks of 1024 threads with 4 vectors of g and x
// each in flight (norm_bwd_stream) measured best: 0.84 at 4096x16384, against 0.77 with 512 threads
// and 0.81 with 512 threads that also batch the second pass. On sm_90, rows of 32-64 KiB in 16-byte
// vectors go through the TMA ring instead (norm_bwd_ring: each row read once, the next rows' loads
// in flight while one is reduced): 0.84 -> 0.86 at 4096x16384, 0.79 -> 0.83 at 2048. With dw / db
// too, dx takes the same path and norm_wb_cols sums the weight gradients in one more read of g and x
// (WeightGrads::Columns): layer_norm fwd+bwd(x, w, b) 2048 / 4096 / 8192 x 16384 0.53 / 0.61 / 0.65
// -> 0.59 / 0.63 / 0.66 of copy (5 passes counted) against norm_bwd's partials.
RowPlan plan_norm_backward(const RowProblem& q, const RowDevice& dev) {
  const bool group = q.norm == RowNorm::Group;
  const size_t asize = q.dtype == FLAME_DTYPE_F64 ? 8 : 4;
  RegisterBudget b;
  b.arrays = 2;
  b.acc_arrays = group || !q.need_weight_grads ? 0 : 2;
  b.register_words = limits.bwd_register_words;
  b.max_threads = kNormRowsMaxThreads;
  b.allow_no_cache = true;
  b.one_row_per_block = group;
  b.stage_short = !group;
  b.resident_threads = limits.norm_bwd_resident_threads;
  RowPlan p = plan_register_rows(q, dev, b);
  if (!group && row_bytes_of(q) >= limits.norm_bwd_stream_min) p = plan_stream(q, dev);
  const bool streamed = p.path == RowPath::Stream;
  const int64_t channels = q.D / q.hw;  // group norm: channels per group
  const bool kernel_wb =
      q.need_weight_grads && !streamed && (!group || 2 * static_cast<size_t>(channels) * asize <= limits.group_wsum_smem_max);
  p.weight_grads_template = group || kernel_wb;  // GN decides at run time (shared-memory sums)
  if (streamed && q.need_dx && !group && norm_ring_rows(q, dev)) {
    RowPlan r;
    r.path = RowPath::Ring;
    r.v = q.v;
    r.launch.threads_x = ring::kThreads;
    r.launch.grid = static_cast<unsigned>(std::min<int64_t>(q.rows, dev.sm_count));  // one block per SM
    r.launch.smem_bytes = norm_ring_smem_bytes();
    r.launch.set_max_smem = true;
    r.weight_grads_template = p.weight_grads_template;
    p = r;
  } else if (streamed) {
    if (!q.need_dx) p.path = RowPath::None;
  } else if (q.need_dx || kernel_wb) {
    if (group && kernel_wb) p.launch.smem_bytes = static_cast<unsigned>(2 * channels * asize);  // below 48 KiB
    if (!group && kernel_wb)  // partial sums: one row per row group, or per block for staged rows (norm_bwd sums those)
      p.partial_rows = static_cast<int64_t>(p.launch.grid) * (p.path == RowPath::Staged ? 1 : p.launch.threads_y);
    p.segment_aligned = group && q.hw % (32 * q.v) == 0;
  } else {
    p.path = RowPath::None;
  }
  if (!q.need_weight_grads) {
    p.weight_grads = WeightGrads::None;
  } else if (kernel_wb) {
    p.weight_grads = WeightGrads::InKernel;
  } else if (group) {
    p.weight_grads = WeightGrads::Composed;
  } else {  // column-vector blocks times enough row splits for 8 blocks per SM, then one sum over the splits
    p.weight_grads = WeightGrads::Columns;
    WeightGradColumns& c = p.columns;
    c.col_blocks = static_cast<unsigned>((q.D / q.v + limits.wgrad_col_threads - 1) / limits.wgrad_col_threads);
    const int64_t want = std::max<int64_t>(
        1, std::min<int64_t>((q.rows + limits.wgrad_rows_per_split - 1) / limits.wgrad_rows_per_split,
                             int64_t{dev.sm_count} * limits.wgrad_blocks_per_sm / c.col_blocks));
    c.rows_per_split = (q.rows + want - 1) / want;
    c.splits = (q.rows + c.rows_per_split - 1) / c.rows_per_split;  // every split has rows
  }
  return p;
}

// batch_norm: per-channel partial sums; a channel with many values and few channels (fewer than 2
// per SM) is split over blocks of about bn_chunk values, up to bn_chunks_per_sm blocks per SM in all.
RowPlan plan_batch_norm(const RowProblem& q, const RowDevice& dev) {
  RowPlan p;
  p.path = RowPath::Channels;
  ChannelSplit& s = p.channels;
  const int64_t C = q.rows, count = q.D;
  s.chunks = 1;
  s.chunk_len = count;
  if (C < 2 * static_cast<int64_t>(dev.sm_count) && count > limits.bn_split_min_count) {
    s.chunks = std::min<int64_t>((count + limits.bn_chunk - 1) / limits.bn_chunk,
                                 std::max<int64_t>(1, limits.bn_chunks_per_sm * dev.sm_count / C));
    s.chunk_len = (count + s.chunks - 1) / s.chunks;
    s.chunks = (count + s.chunk_len - 1) / s.chunk_len;
  }
  s.reduce_grid = static_cast<unsigned>(std::min<int64_t>(C * s.chunks, static_cast<int64_t>(dev.sm_count) * limits.bn_reduce_blocks_per_sm));
  s.finalize_grid = flat_blocks(dev, C);
  s.apply_grid = flat_blocks(dev, C * count);
  return p;
}

// ---- softmax ----

// dim last: rows (registers when the row fits, else streaming; forward rows in shared memory as the
// norms'). Another dim with enough columns (outer * inner): one thread per column. Few long columns:
// the op permutes the dim to the end and runs rows.
RowPlan plan_softmax(const RowProblem& q, const RowDevice& dev, bool forward) {
  RowPlan p;
  if (q.inner > 1 && q.rows * q.inner < limits.softmax_min_columns && q.D > limits.softmax_permute_min_dim) {
    p.path = RowPath::PermuteToRows;  // fewer (long) columns parallelise poorly in softmax_cols_*
    return p;
  }
  if (q.inner != 1) {
    p.path = RowPath::Columns;
    p.launch.threads_x = limits.flat_block;
    p.launch.grid = flat_blocks(dev, q.rows * q.inner);
    return p;
  }
  RegisterBudget b;
  if (forward) {  // the row in registers (launch bounds 1024: <= 64 registers, 32 for the row)
    if (shared_forward_rows(q)) return plan_shared_row(q, limits.bytes_per_thread);
    b.arrays = 1;
    b.register_words = limits.fwd_register_words;
    b.max_threads = kSoftmaxFwdMaxThreads;
    b.spread_mid_rows = true;
  } else {  // g and y (launch bounds 512: <= 128 registers, 64 for the rows), or staged rows
    b.arrays = 2;
    b.register_words = limits.bwd_register_words;
    b.max_threads = kSoftmaxBwdMaxThreads;
    b.stage_short = true;
  }
  return plan_register_rows(q, dev, b);
}

// ---- cross-entropy ----

// One warp per row up to ce_warp_max_classes classes (8 warps of a 256-thread block), else one
// block per row (512 threads from ce_wide_block_classes); a grid-stride loop beyond ce_max_grid.
RowPlan plan_ce_rows(const RowProblem& q) {
  RowPlan p;
  const bool warp = q.D <= limits.ce_warp_max_classes;
  p.path = warp ? RowPath::WarpPerRow : RowPath::BlockPerRow;
  p.v = q.v;
  const int64_t groups = warp ? (q.rows + 7) / 8 : q.rows;
  p.launch.threads_x = warp ? limits.ce_block : (q.D >= limits.ce_wide_block_classes ? limits.ce_wide_block : limits.ce_block);
  p.launch.grid = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(groups, limits.ce_max_grid)));
  return p;
}

// ce_index_fwd_grad reads each row twice: when L2 cannot hold every row the GPU can have in flight,
// the grid is capped (whole waves of SMs, the blocks stride over the rows) so that the rows in
// flight fit in half of L2 between the two reads (the other half for the gradient stream and
// everything else). One block row per SM gets 1024 threads, to keep enough loads in flight.
//
// Rows of 32 KiB up to the ring's 30 chunks, in 16-byte vectors, on sm_90 and later, with f32
// accumulation: the ring kernel reads each row from DRAM once and keeps it in shared memory between
// its two passes (ce_index_fwd_grad: the second read from L2). H200, 8192 x 50304 fwd+bwd: f32
// 1.30 -> 1.11 of the single-pass bound, bf16 1.30 -> 1.22. Rows of up to 14 chunks get two blocks
// of 14 slots per SM (two blocks of 15 exceed an SM's 228 KiB), whose phases overlap each other's;
// longer rows one block of 30 slots with two consumer groups. H200, fwd+bwd at 8192 x 50304 as a
// multiple of the single-pass bound: f32 (27 chunks) 1.12 with one group, 1.11 with two; bf16 (14
// chunks) 1.39 with one group of 30 slots, 1.23 with two, 1.22 with two blocks of 14; bf16 8192 x
// 32768 (9 chunks) 1.49 / 1.42 / 1.27.
RowPlan plan_ce_fused(const RowProblem& q, const RowDevice& dev) {
  const int64_t row_bytes = static_cast<int64_t>(row_bytes_of(q));
  if (dev.cc_major >= 9 && q.dtype != FLAME_DTYPE_F64 && full_vectors(q) && row_bytes >= static_cast<int64_t>(limits.ce_ring_min) &&
      row_bytes <= int64_t{ring::kLossMaxSlots} * ring::kChunkBytes) {
    RowPlan p;
    p.path = RowPath::Ring;
    p.v = q.v;
    const int64_t chunks = (row_bytes + ring::kChunkBytes - 1) / ring::kChunkBytes;
    const bool short_ring = chunks <= ring::kLossShortSlots;
    p.ring.slots = short_ring ? ring::kLossShortSlots : ring::kLossLongSlots;
    p.ring.groups = short_ring ? ring::kLossShortGroups : ring::kLossLongGroups;
    p.launch.threads_x = static_cast<unsigned>(p.ring.groups * ring::kConsumers + 32);
    const int64_t per_sm = ring::kLossMaxSlots / p.ring.slots;
    p.launch.grid = static_cast<unsigned>(std::min<int64_t>(q.rows, dev.sm_count * per_sm));
    // ring::Layout<1, SLOTS * kChunkBytes>::kSmemBytes of cuda/ring.cuh, which the kernel uses
    p.launch.smem_bytes = static_cast<unsigned>(ring::smem_bytes_of(1, p.ring.slots * ring::kChunkBytes));
    p.launch.set_max_smem = true;
    return p;
  }
  RowPlan p = plan_ce_rows(q);
  const bool warp = p.path == RowPath::WarpPerRow;
  const int64_t sms = std::max(1, dev.sm_count), rows_per_block = warp ? p.launch.threads_x / 32 : 1;
  const int64_t fit = dev.l2_bytes / 2 / row_bytes;  // rows
  const int64_t resident = sms * std::max<int64_t>(1, dev.max_threads_per_sm / p.launch.threads_x) * rows_per_block;
  if (fit >= resident) return p;
  const int64_t per_sm = std::max<int64_t>(1, fit / (sms * rows_per_block));  // blocks
  if (!warp && per_sm == 1) p.launch.threads_x = limits.ce_lone_block;
  p.launch.grid = static_cast<unsigned>(std::min<int64_t>(p.launch.grid, sms * per_sm));
  return p;
}

}  // namespace

unsigned flat_blocks(const RowDevice& device, int64_t work) {
  return static_cast<unsigned>(std::max<int64_t>(
      1, std::min<int64_t>((work + limits.flat_block - 1) / limits.flat_block, static_cast<int64_t>(device.sm_count) * limits.flat_blocks_per_sm)));
}

RowPlan plan_row_kernel(const RowProblem& q, const RowDevice& dev) {
  switch (q.op) {
    case RowOp::NormForward: return plan_norm_forward(q, dev);
    case RowOp::NormBackward: return plan_norm_backward(q, dev);
    case RowOp::SoftmaxForward: return plan_softmax(q, dev, true);
    case RowOp::SoftmaxBackward: return plan_softmax(q, dev, false);
    case RowOp::CrossEntropyRows: return plan_ce_rows(q);
    case RowOp::CrossEntropyFusedGrad: return plan_ce_fused(q, dev);
    case RowOp::BatchNormChannels: return plan_batch_norm(q, dev);
  }
  return RowPlan{};
}

}  // namespace flame

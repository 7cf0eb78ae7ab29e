// The row-kernel router: ONE function, plan_row_kernel, chooses how every row kernel of the norms
// (layer / rms / group norm forward and backward, batch_norm's channel passes), softmax /
// log_softmax (forward and backward) and cross-entropy runs, from the problem's shape, dtype and
// vector width and the device's properties, with the thresholds of ONE table (RowThresholds).
// It is a pure function (no Context, no driver): tests/cpu/test_row_router.cpp replays the table of
// decisions tests/data/row_routing.txt through it on the CPU.
//
// The kernels' paths (RowPath):
//  - Registers: register-cached row groups (tpr threads per row, nv vectors each, rpb rows per block);
//  - Global: norm_bwd re-reads its rows (hits L2) when the accumulators leave no registers for them;
//  - Staged: backward kernels keep their two input rows in shared memory (short rows, 2-byte middle rows);
//  - SharedRow: forward kernels take one row per block in shared memory, filled by cp.async;
//  - Stream: one block per row, several passes over global memory (too long for the above);
//  - Ring: sm_90 TMA ring of shared-memory chunks (cuda/ring.cuh): norm_bwd_ring, ce_index_fwd_grad_ring;
//  - Columns / PermuteToRows: softmax over a dim that is not the last one;
//  - WarpPerRow / BlockPerRow: cross-entropy rows; Channels: batch_norm.
// Where the thresholds come from (measurements, H100 / H200): the comments of RowThresholds and of
// row_router.cpp. Constants the kernels must agree on (launch bounds, ring geometry, template
// argument values) come from cuda/row_constants.cuh, which the kernels include too.
//
// How to route a new row kernel: add its RowOp, a case in plan_row_kernel that calls one planning
// function of row_router.cpp, its thresholds to RowThresholds, its launch in the op's file (which
// turns the RowPlan into a kernel key and a launch), and its cases to tests/cpu/tools/row_routing_dump.cpp;
// regenerate tests/data/row_routing.txt and explain the changed lines in the commit.
//
// Not to be confused with the ELEMENTWISE rows of ops/launch.h (plan_rows_layout / RowsLayout:
// strided operands of elementwise kernels seen as rows); those do no reduction along the row.
#pragma once
#include <cstddef>
#include <cstdint>
#include "core/dtype.h"
#include "cuda/row_constants.cuh"

namespace flame {

// The device properties routing reads (Context::cc_major / sm_count; the L2 size and the threads
// per SM only for CrossEntropyFusedGrad). H100 SXM / H200: sm_90, 132 SMs, 50 MiB L2, 2048 threads.
struct RowDevice {
  int cc_major = 0;
  int sm_count = 1;
  int64_t l2_bytes = 0;
  int max_threads_per_sm = 2048;
};

enum class RowOp {
  NormForward,            // norm_fwd / norm_fwd_block
  NormBackward,           // norm_bwd / norm_bwd_stream / norm_bwd_ring, and the weight-gradient path
  SoftmaxForward,         // softmax_fwd / softmax_fwd_smem / softmax_fwd_stream / softmax_cols_fwd
  SoftmaxBackward,        // softmax_bwd / softmax_bwd_stream / softmax_cols_bwd
  CrossEntropyRows,       // ce_index_fwd, ce_index_bwd, ce_prob_fwd, ce_prob_bwd
  CrossEntropyFusedGrad,  // ce_index_fwd_grad / ce_index_fwd_grad_ring (forward that writes the gradient)
  BatchNormChannels,      // bn_reduce / bn_finalize / bn_apply: rows = channels, D = values per channel
};

// The norm a NormForward / NormBackward problem computes; the value is the kernels' MODE argument.
enum class RowNorm : int { Layer = kLayerNorm, Rms = kRmsNorm, Group = kGroupNorm };

struct RowProblem {
  RowOp op = RowOp::NormForward;
  RowNorm norm = RowNorm::Layer;
  DType dtype = FLAME_DTYPE_F32;
  int64_t rows = 0;   // softmax: the elements before the dim (outer); batch_norm: channels
  int64_t D = 0;      // the reduced length (softmax: the dim; cross-entropy: classes; batch_norm: N * HW)
  int64_t inner = 1;  // softmax: the elements after the dim (1: the dim is last, rows)
  int64_t hw = 1;     // group norm: values per channel (the group's row holds D / hw channels)
  int v = 1;          // elements per 16-byte vector that every pointer and D allow (row_vector_width), else 1
  bool need_dx = true;             // NormBackward
  bool need_weight_grads = false;  // NormBackward: dw or db wanted (and a weight for dw)
};

enum class RowPath { None, Registers, Global, Staged, SharedRow, Stream, Ring, Columns, PermuteToRows, WarpPerRow,
                     BlockPerRow, Channels };

// How NormBackward gets dw / db: none wanted; partial sums in the row kernel (norm_bwd WB); a
// column kernel over g and x (norm_wb_cols, LN/RMS rows that stream); or tensor ops (group norm
// with too many channels per group for shared-memory sums).
enum class WeightGrads { None, InKernel, Columns, Composed };

// A launch: cuLaunchKernel(grid, threads_x, threads_y, smem_bytes); set_max_smem: the kernel's
// CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES is set to smem_bytes first (above the 48 KiB default).
struct RowLaunchShape {
  unsigned grid = 1;
  unsigned threads_x = 32;  // threads per row (one block row)
  unsigned threads_y = 1;   // rows per block
  unsigned smem_bytes = 0;
  bool set_max_smem = false;
};

struct WeightGradColumns {  // norm_wb_cols: column blocks x row splits
  unsigned col_blocks = 0;
  int64_t splits = 0, rows_per_split = 0;
};
struct CrossEntropyRing {  // ce_index_fwd_grad_ring<.., SLOTS, G>
  int slots = 0, groups = 0;
};
struct ChannelSplit {  // batch_norm: each channel's values in `chunks` blocks of chunk_len
  int64_t chunks = 1, chunk_len = 0;
  unsigned reduce_grid = 1, finalize_grid = 1, apply_grid = 1;
};

struct RowPlan {
  RowPath path = RowPath::None;
  int v = 1;   // elements per access
  int nv = 1;  // Registers / Staged / Global: vectors per thread (one of kRowVectorsPerThread)
  RowLaunchShape launch;
  // NormBackward
  bool weight_grads_template = false;  // norm_bwd's WB argument (group norm: always; it decides at run time)
  WeightGrads weight_grads = WeightGrads::None;
  int64_t partial_rows = 0;            // LN/RMS InKernel: rows of the [partial_rows, D] partial sums
  bool segment_aligned = false;        // group norm: hw is a multiple of 32 * v
  WeightGradColumns columns;
  CrossEntropyRing ring;  // CrossEntropyFusedGrad on Ring
  ChannelSplit channels;  // BatchNormChannels
};

// The register-cached kernels' NV instantiations.
constexpr int kRowVectorsPerThread[] = {1, 2, 4, 8};

// Every threshold of the router (bytes are of one row in the element type).
struct RowThresholds {
  // Rows in shared memory in 16-byte vectors (SharedRow forward, Staged backward): short rows,
  // middle rows (2-byte types from short_smem_max, f32 from f32_mid_smem_min, f64 long rows only),
  // long rows.
  size_t short_smem_min = 1024, short_smem_max = 4096;
  size_t short_two_warps_above = 3 * 1024;  // short SharedRow rows: 32 threads, 64 above this
  size_t f32_mid_smem_min = 16 * 1024;
  size_t mid_smem_max = 32 * 1024, long_smem_max = 64 * 1024;
  unsigned mid_min_threads = 64, mid_max_threads = 512, long_threads = 512;
  unsigned layer_norm_bytes_per_thread = 64, bytes_per_thread = 128;  // SharedRow middle rows (rms/group/softmax: 128)
  // Register-cached rows: 32-bit registers for the cached row (forward) or rows (backward).
  int fwd_register_words = 32, bwd_register_words = 64;
  unsigned block_rows_threads = 256;                // short rows: 256 / tpr rows per block
  int64_t resident_threads = 2048, norm_bwd_resident_threads = 1024;  // threads per SM of the persistent grid
  size_t spread_min = 4096, spread_max = 32 * 1024;  // forward rows with one block per row group (no persistent grid)
  // Streamed rows: 1024 threads from 4096 vectors, 256 from 256, else 32; 8 blocks per SM.
  int64_t stream_big_vectors = 4096, stream_mid_vectors = 256;
  int64_t stream_blocks_per_sm = 8;
  size_t norm_bwd_stream_min = 32 * 1024;  // LN/RMS backward rows from here stream (or ring on sm_90)
  size_t group_wsum_smem_max = 40 * 1024;  // GN in-kernel weight sums: 2 * channels * sizeof(A) bytes at most
  unsigned wgrad_col_threads = 256;         // norm_wb_cols: columns of vectors per block
  int64_t wgrad_rows_per_split = 8, wgrad_blocks_per_sm = 8;
  // Softmax over a dim that is not last: columns when there are enough of them, else permuted to rows.
  int64_t softmax_min_columns = 4096, softmax_permute_min_dim = 64;
  // Cross-entropy rows.
  int64_t ce_warp_max_classes = 1024, ce_wide_block_classes = 16384;
  unsigned ce_block = 256, ce_wide_block = 512, ce_lone_block = 1024;
  int64_t ce_max_grid = int64_t{1} << 20;
  size_t ce_ring_min = 32 * 1024;
  // batch_norm channel passes.
  int64_t bn_split_min_count = 8192, bn_chunk = 4096, bn_chunks_per_sm = 4, bn_reduce_blocks_per_sm = 64;
  // 1-D grid-stride launches (softmax columns, batch_norm finalize / apply, elementwise kernels).
  unsigned flat_block = 256;
  int64_t flat_blocks_per_sm = 32;
};
inline constexpr RowThresholds kRowThresholds{};

// The decision for one problem.
RowPlan plan_row_kernel(const RowProblem& problem, const RowDevice& device);

// Blocks of a 1-D grid-stride launch of kRowThresholds.flat_block threads over `work` items.
unsigned flat_blocks(const RowDevice& device, int64_t work);
// The ring shape and dynamic shared memory of norm_bwd_ring (kNormRingInputs inputs in the default ring).
constexpr unsigned norm_ring_smem_bytes() {
  return static_cast<unsigned>(ring::smem_bytes_of(ring::kNormRingInputs, ring::kMaxRingBytes));
}

}  // namespace flame

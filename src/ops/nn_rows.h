// Launch planning shared by the row kernels of cuda/softmax.cuh and cuda/norm.cuh (see cuda/rows.cuh):
// how many threads share a row (tpr), how many V-element vectors each holds in registers (nv), how
// many rows a block takes at once (rpb), or that the row is too long and the streaming kernel runs.
#pragma once
#include <string>
#include <vector>
#include "tensor/tensor.h"

namespace flame {

constexpr int kRowNvs[] = {1, 2, 4, 8};  // the register-cached kernels' NV instantiations

// What one thread keeps in registers per cached element: `arrays` tensors of the element type,
// `acc_arrays` accumulators of the compute type (norm backward), within `budget_words` 32-bit
// registers; `max_tpr` matches the kernel's __launch_bounds__.
struct RowBudget {
  int arrays = 1;
  int acc_arrays = 0;
  int budget_words = 32;
  int max_tpr = 1024;
  bool allow_no_cache = false;  // may drop the cache (re-read) to fit the accumulators
  bool one_row_per_block = false;
  // Forward kernels: rows of 4-32 KiB get one block per row group instead of a persistent grid
  // (measured on an H200: 0.86 -> 0.93 of copy for layer_norm at 16384x4096; shorter rows and the
  // backward kernels do better persistent).
  bool spread_mid_rows = false;
  // Backward kernels: short rows and 2-byte middle rows (staged_bwd_rows) wait in shared memory
  // instead of registers between the two passes (RowPlan::staged); only accumulators then take registers.
  bool stage_short = false;
};

struct RowPlan {
  bool stream = false;  // too long: one block per row, several passes
  bool cache = true;
  bool staged = false;  // backward kernels: the two input rows wait in shared memory (RowBudget::stage_short)
  int nv = 1, v = 1;
  unsigned tpr = 32, rpb = 1, grid = 1;
};

// The widest vector (16 bytes) when D and every pointer allow it, else 1.
int row_vector_width(DType dtype, int64_t D, const std::vector<CUdeviceptr>& ptrs);
// resident_threads: threads per SM assumed for the persistent grid.
RowPlan plan_rows(Context& ctx, int64_t rows, int64_t D, DType dtype, int v, const RowBudget& b,
                  int resident_threads = 2048);
// Streaming kernels: one block of up to 1024 threads per row.
RowPlan plan_stream(Context& ctx, int64_t rows, int64_t D, int v);

void launch_rows(Context& ctx, CUfunction f, const RowPlan& p, void** args, unsigned smem = 0);

// Forward rows in 16-byte vectors (v elements) staged in shared memory by cp.async, one row per
// block (stage_row in cuda/rows.cuh), so that the loads in flight hold no registers:
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
constexpr size_t kShortSmemMin = 1024, kShortSmemMax = 4096;
constexpr size_t kMidSmemMax = 32 * 1024, kLongSmemMax = 64 * 1024;  // middle rows up to 32 KiB, long rows to 64
bool smem_rows(DType dtype, int64_t D, int v);
// The short rows above. The backward kernels (norm_bwd / softmax_bwd) keep their two input rows in
// shared memory there instead of registers (H200 at 65536x768 f32: layer_norm fwd+bwd 0.80 -> 0.87 of
// copy; at 16384x768 0.69 -> 0.74).
bool short_smem_rows(DType dtype, int64_t D, int v);
// The rows whose backward kernels stage g and x (or y) in shared memory: the short rows above, and
// middle rows of 2-byte types (more than 4 KiB, up to 32 KiB), whose register-cached row groups held
// up to 99 registers. H200, 2026-11-27, bf16 fwd+bwd(x) of layer_norm / rms_norm / softmax at
// 65536x4096: 0.80 / 0.89 / 0.82 -> 0.84 / 0.96 / 0.82 of copy; layer_norm 32768x8192 0.68 -> 0.85,
// softmax 8192x16384 0.73 -> 0.85; layer_norm with dweight/dbias 65536x3072 0.46 -> 0.62.
bool staged_bwd_rows(DType dtype, int64_t D, int v);
// Launches a backward row kernel; a staged plan gets 2 rows of D elements per row group of shared memory.
void launch_bwd_rows(Context& ctx, CUfunction f, const RowPlan& p, int64_t D, DType dtype, void** args, unsigned smem = 0);
// Launches f (a kernel taking the row in dynamic shared memory) with one block per row (see above);
// bytes_per_thread sizes the blocks of middle rows.
void launch_smem_rows(Context& ctx, CUfunction f, int64_t rows, int64_t D, DType dtype, void** args,
                      unsigned bytes_per_thread);
// Rows of 32-64 KiB in 16-byte vectors on sm_90 and later, where the dx-only layer_norm / rms_norm
// backward runs cuda/norm_ring.cuh: one block per SM streams its rows through a ring of shared-memory
// chunks that TMA bulk copies fill ahead of the arithmetic, across rows (H200, layer_norm fwd+bwd(x)
// 2048 / 4096 / 8192 x 16384 f32: 0.79 / 0.84 / 0.73 -> 0.83 / 0.86 / 0.88 of copy, against norm_bwd_stream).
bool ring_rows(const Context& ctx, DType dtype, int64_t D, int v);
// Launches a ring kernel that reads `inputs` tensors' rows (2 for the backward: g and x).
void launch_ring_rows(Context& ctx, CUfunction f, int64_t rows, int inputs, void** args);
// A 1-D grid-stride launch (elementwise and per-column kernels).
void launch_flat(Context& ctx, CUfunction f, int64_t work, void** args);

// The compute type of dtype (f32 for f16/bf16/f32, f64 for f64).
DType acc_of(DType dtype);

}  // namespace flame

// Row-kernel launch planning (see ops/nn_rows.h).
#include "ops/nn_rows.h"
#include <algorithm>
#include <climits>
#include "core/error.h"

namespace flame {

int row_vector_width(DType dtype, int64_t D, const std::vector<CUdeviceptr>& ptrs) {
  int v = static_cast<int>(16 / dtype_size(dtype));
  if (D % v != 0) return 1;
  for (CUdeviceptr p : ptrs)
    if (p % 16 != 0) return 1;
  return v;
}

RowPlan plan_rows(Context& ctx, int64_t rows, int64_t D, DType dtype, int v, const RowBudget& b0, int resident_threads) {
  RowBudget b = b0;
  const bool staged = b.stage_short && staged_bwd_rows(dtype, D, v);
  if (staged) b.arrays = 0;  // the rows wait in shared memory
  RowPlan p;
  p.v = v;
  const int64_t chunks = (D + v - 1) / v;
  const size_t tsize = dtype_size(dtype), asize = dtype_size(acc_of(dtype));
  bool found = false;
  // Prefer keeping the row cached, then one warp per row (no block barrier in the reductions; on an
  // H200 0.52 -> 0.71 of copy for layer_norm at 16384x768), then few threads per row (<= 256, then
  // 512), then few vectors. Intermediate widths (64, 128) measured no better.
  for (int cache = 1; cache >= (b.allow_no_cache ? 0 : 1) && !found; --cache) {
    for (int limit : {32, 256, 512, b.max_tpr}) {
      if (limit > b.max_tpr || found) continue;
      for (int nv : kRowNvs) {
        int64_t tpr = ((chunks + nv - 1) / nv + 31) / 32 * 32;
        size_t bytes = (cache ? static_cast<size_t>(b.arrays) * nv * v * tsize : 0) +
                       static_cast<size_t>(b.acc_arrays) * nv * v * asize;
        if (tpr > limit || bytes > static_cast<size_t>(b.budget_words) * 4) continue;
        p.nv = nv;
        p.tpr = static_cast<unsigned>(std::max<int64_t>(32, tpr));
        p.cache = cache != 0;
        found = true;
        break;
      }
    }
  }
  if (!found) return plan_stream(ctx, rows, D, v);
  p.staged = staged;
  p.rpb = b.one_row_per_block ? 1 : std::max(1u, 256 / p.tpr);  // short rows: several per block (<= 8)
  int64_t groups = (rows + p.rpb - 1) / p.rpb;
  int64_t per_sm = std::max<int64_t>(1, resident_threads / static_cast<int64_t>(p.tpr * p.rpb));
  p.grid = static_cast<unsigned>(std::max<int64_t>(1, std::min(groups, static_cast<int64_t>(ctx.sm_count) * per_sm)));
  const size_t row_bytes = static_cast<size_t>(D) * tsize;
  if (b.spread_mid_rows && row_bytes >= 4096 && row_bytes <= 32768)
    p.grid = static_cast<unsigned>(std::min<int64_t>(groups, INT32_MAX));
  return p;
}

RowPlan plan_stream(Context& ctx, int64_t rows, int64_t D, int v) {
  RowPlan p;
  p.stream = true;
  p.v = v;
  int64_t chunks = (D + v - 1) / v;
  p.tpr = chunks >= 1024 * 4 ? 1024 : (chunks >= 256 ? 256 : 32);
  p.grid = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(rows, static_cast<int64_t>(ctx.sm_count) * 8)));
  return p;
}

void launch_rows(Context& ctx, CUfunction f, const RowPlan& p, void** args, unsigned smem) {
  ctx.check(ctx.drv.cuLaunchKernel(f, p.grid, 1, 1, p.tpr, p.rpb, 1, smem, ctx.stream, args, nullptr), "cuLaunchKernel");
}

bool short_smem_rows(DType dtype, int64_t D, int v) {
  const size_t row_bytes = static_cast<size_t>(D) * dtype_size(dtype);
  return v * dtype_size(dtype) == 16 && row_bytes > kShortSmemMin && row_bytes <= kShortSmemMax;
}

bool staged_bwd_rows(DType dtype, int64_t D, int v) {
  const size_t tsize = dtype_size(dtype), row_bytes = static_cast<size_t>(D) * tsize;
  return short_smem_rows(dtype, D, v) || (tsize == 2 && v * tsize == 16 && row_bytes > kShortSmemMax && row_bytes <= kMidSmemMax);
}

bool smem_rows(DType dtype, int64_t D, int v) {
  const size_t tsize = dtype_size(dtype), row_bytes = static_cast<size_t>(D) * tsize;
  if (v * tsize != 16) return false;
  // middle rows from here (f64: long rows only)
  const size_t lo = tsize == 2 ? kShortSmemMax : (tsize == 4 ? 16 * 1024 : kMidSmemMax);
  return short_smem_rows(dtype, D, v) || (row_bytes > lo && row_bytes <= kLongSmemMax);
}

void launch_bwd_rows(Context& ctx, CUfunction f, const RowPlan& p, int64_t D, DType dtype, void** args, unsigned smem) {
  if (p.staged) {  // the attribute every time: the 48 KiB default covers static + dynamic shared memory, and
                   // 48 KiB of rows plus the kernels' static red[] exceed it (CUDA_ERROR_INVALID_VALUE, measured)
    smem = static_cast<unsigned>(2 * static_cast<size_t>(D) * dtype_size(dtype) * p.rpb);
    ctx.check(ctx.drv.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(smem)),
              "cuFuncSetAttribute");
  }
  launch_rows(ctx, f, p, args, smem);
}

void launch_smem_rows(Context& ctx, CUfunction f, int64_t rows, int64_t D, DType dtype, void** args,
                      unsigned bytes_per_thread) {
  const unsigned bytes = static_cast<unsigned>(static_cast<size_t>(D) * dtype_size(dtype));
  RowPlan p;
  // Short rows: a block of one warp (two from 3 KiB on) per row, up to 32 blocks per SM; middle rows:
  // a thread per bytes_per_thread (whole warps: the block reductions assume them); long rows: 512.
  if (bytes <= kShortSmemMax) p.tpr = bytes > 3 * 1024 ? 64 : 32;
  else if (bytes <= kMidSmemMax) p.tpr = std::min(512u, std::max(64u, (bytes / bytes_per_thread + 31) / 32 * 32));
  else p.tpr = 512;
  ctx.check(ctx.drv.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(bytes)),
            "cuFuncSetAttribute");
  p.grid = static_cast<unsigned>(std::min<int64_t>(rows, INT32_MAX));  // as many resident as shared memory allows
  launch_rows(ctx, f, p, args, bytes);
}

bool ring_rows(const Context& ctx, DType dtype, int64_t D, int v) {
  const size_t row_bytes = static_cast<size_t>(D) * dtype_size(dtype);
  return ctx.cc_major >= 9 && v * dtype_size(dtype) == 16 && row_bytes >= kMidSmemMax && row_bytes <= kLongSmemMax;
}

void launch_ring_rows(Context& ctx, CUfunction f, int64_t rows, int inputs, void** args) {
  // Mirrors ring::Layout of cuda/norm_ring.cuh: chunks of 480 16-byte vectors per input, as many
  // slots as fit in 192 KiB, and two 8-byte barriers per slot.
  constexpr unsigned kThreads = 512, kChunkBytes = 480 * 16, kMaxRingBytes = 192 * 1024;
  const unsigned slots = kMaxRingBytes / (inputs * kChunkBytes);
  const unsigned smem = slots * inputs * kChunkBytes + 16 * slots;
  ctx.check(ctx.drv.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(smem)),
            "cuFuncSetAttribute");
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(rows, ctx.sm_count));  // one block per SM
  ctx.launch(f, grid, kThreads, args, smem);
}

void launch_flat(Context& ctx, CUfunction f, int64_t work, void** args) {
  constexpr unsigned block = 256;
  int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((work + block - 1) / block, static_cast<int64_t>(ctx.sm_count) * 32));
  ctx.launch(f, static_cast<unsigned>(blocks), block, args);
}

DType acc_of(DType dtype) { return dtype == FLAME_DTYPE_F64 ? FLAME_DTYPE_F64 : FLAME_DTYPE_F32; }

}  // namespace flame

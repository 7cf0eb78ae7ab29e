// The launch side of the row kernels (see ops/nn_rows.h; the decisions: ops/row_router.cpp).
#include "ops/nn_rows.h"
#include "core/error.h"

namespace flame {

int row_vector_width(DType dtype, int64_t D, const std::vector<CUdeviceptr>& ptrs) {
  int v = static_cast<int>(16 / dtype_size(dtype));
  if (D % v != 0) return 1;
  for (CUdeviceptr p : ptrs)
    if (p % 16 != 0) return 1;
  return v;
}

RowDevice row_device(Context& ctx, bool with_cache_props) {
  RowDevice d;
  d.cc_major = ctx.cc_major;
  d.sm_count = ctx.sm_count;
  if (with_cache_props) {
    int l2 = 0, threads = 0;
    ctx.check(ctx.drv.cuDeviceGetAttribute(&l2, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, ctx.device), "cuDeviceGetAttribute");
    ctx.check(ctx.drv.cuDeviceGetAttribute(&threads, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, ctx.device),
              "cuDeviceGetAttribute");
    d.l2_bytes = l2;
    d.max_threads_per_sm = threads;
  }
  return d;
}

void launch_row_plan(Context& ctx, CUfunction f, const RowPlan& p, void** args) {
  const RowLaunchShape& s = p.launch;
  if (s.set_max_smem)
    ctx.check(ctx.drv.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(s.smem_bytes)),
              "cuFuncSetAttribute");
  ctx.check(ctx.drv.cuLaunchKernel(f, s.grid, 1, 1, s.threads_x, s.threads_y, 1, s.smem_bytes, ctx.stream, args, nullptr),
            "cuLaunchKernel");
}

void launch_flat(Context& ctx, CUfunction f, int64_t work, void** args) {
  ctx.launch(f, flat_blocks(row_device(ctx), work), kRowThresholds.flat_block, args);
}

DType acc_of(DType dtype) { return dtype == FLAME_DTYPE_F64 ? FLAME_DTYPE_F64 : FLAME_DTYPE_F32; }

}  // namespace flame

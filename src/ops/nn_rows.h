// The launch side of the row kernels of cuda/norm.cuh, cuda/softmax.cuh and cuda/loss*.cuh: the
// routing decision itself is ops/row_router.h's plan_row_kernel (one function, one threshold table);
// this header gives it the device's properties and the pointers' vector width, and launches what
// it planned. Also the 1-D grid-stride launch of elementwise / per-column kernels (launch_flat).
//
// A row-kernel op: fill a RowProblem (op, norm, dtype, rows, D, v = row_vector_width(...)), call
// plan_row_kernel(problem, row_device(ctx)), make the kernel key from the plan's path / nv / v, and
// launch_row_plan.
#pragma once
#include <vector>
#include "ops/row_router.h"
#include "tensor/tensor.h"

namespace flame {

// The widest vector (16 bytes) when D and every pointer allow it, else 1.
int row_vector_width(DType dtype, int64_t D, const std::vector<CUdeviceptr>& ptrs);
// The context's device as the router sees it (compute capability, SMs). with_cache_props: also the
// L2 size and the threads per SM (two driver queries; only RowOp::CrossEntropyFusedGrad reads them).
RowDevice row_device(Context& ctx, bool with_cache_props = false);
// Launches f with the plan's shape: the dynamic shared memory attribute first when the plan asks
// for it (set every time: the 48 KiB default covers static + dynamic shared memory).
void launch_row_plan(Context& ctx, CUfunction f, const RowPlan& p, void** args);
// A 1-D grid-stride launch (elementwise and per-column kernels): flat_blocks of 256 threads.
void launch_flat(Context& ctx, CUfunction f, int64_t work, void** args);

// The compute type of dtype (f32 for f16/bf16/f32, f64 for f64).
DType acc_of(DType dtype);

}  // namespace flame

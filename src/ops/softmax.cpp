// softmax / log_softmax along any dim: the host side of cuda/softmax.cuh.
// The input is made contiguous and seen as [outer, D, inner]; the row-kernel router
// (ops/row_router.h, RowOp::SoftmaxForward / SoftmaxBackward) picks the kernel: dim last (inner 1):
// the row kernels (registers when the row fits, rows in shared memory, else streaming). Another dim
// with enough columns (outer * inner): one thread per column. Few long columns (PermuteToRows): the
// dim is permuted to the end and made contiguous, the row kernel runs, and the result is permuted
// back (the forward does this with recorded ops).
#include <algorithm>
#include "tensor/autograd_graph.h"
#include "core/error.h"
#include "ops/nn.h"
#include "ops/nn_rows.h"
#include "ops/ops.h"

namespace flame {

namespace {

// The kernels of cuda/softmax.cuh: <T, log, ...>.
using A = TArg;
constexpr KernelTemplate kFwdStream{"softmax.cuh", "flame::softmax_fwd_stream", {A::Dtype, A::Bool, A::Int}};  // v
constexpr KernelTemplate kFwd{"softmax.cuh", "flame::softmax_fwd", {A::Dtype, A::Bool, A::Int, A::Int}};      // nv, v
constexpr KernelTemplate kBwdStream{"softmax.cuh", "flame::softmax_bwd_stream", {A::Dtype, A::Bool, A::Int}};
constexpr KernelTemplate kBwd{"softmax.cuh", "flame::softmax_bwd", {A::Dtype, A::Bool, A::Int, A::Int, A::Bool}};  // nv, v, smem
constexpr KernelTemplate kFwdSmem{"softmax.cuh", "flame::softmax_fwd_smem", {A::Dtype, A::Bool, A::Int}};  // v
constexpr KernelTemplate kColsFwd{"softmax.cuh", "flame::softmax_cols_fwd", {A::Dtype, A::Bool}};
constexpr KernelTemplate kColsBwd{"softmax.cuh", "flame::softmax_cols_bwd", {A::Dtype, A::Bool}};

KernelKey smem_fwd_key(DType t, bool log, int v) { return make_key(kFwdSmem, t, log, v); }
KernelKey cols_key(bool fwd, DType t, bool log) { return make_key(fwd ? kColsFwd : kColsBwd, t, log); }
KernelKey fwd_key(DType t, bool log, const RowPlan& p) {
  switch (p.path) {
    case RowPath::Columns: return cols_key(true, t, log);
    case RowPath::SharedRow: return smem_fwd_key(t, log, p.v);
    case RowPath::Stream: return make_key(kFwdStream, t, log, p.v);
    default: return make_key(kFwd, t, log, p.nv, p.v);
  }
}
KernelKey bwd_key(DType t, bool log, const RowPlan& p) {
  switch (p.path) {
    case RowPath::Columns: return cols_key(false, t, log);
    case RowPath::Stream: return make_key(kBwdStream, t, log, p.v);
    default: return make_key(kBwd, t, log, p.nv, p.v, p.path == RowPath::Staged);
  }
}

void check_float(const Tensor& x, const char* what) {
  FLAME_CHECK(is_floating(x->dtype), FLAME_ERROR_DTYPE_MISMATCH, what, " needs a floating tensor, got ",
              dtype_name(x->dtype));
}

struct Geometry {
  int64_t outer = 1, D = 1, inner = 1;
};
Geometry geometry(const Tensor& x, int dim) {
  Geometry g;
  for (int d = 0; d < x->ndim(); ++d) {
    if (d < dim) g.outer *= x->shape[d];
    else if (d == dim) g.D = x->shape[d];
    else g.inner *= x->shape[d];
  }
  return g;
}

// The permutation moving dim to the end, and its inverse.
std::vector<int> to_last(int nd, int dim) {
  std::vector<int> p;
  for (int d = 0; d < nd; ++d)
    if (d != dim) p.push_back(d);
  p.push_back(dim);
  return p;
}
std::vector<int> from_last(int nd, int dim) {
  std::vector<int> p = to_last(nd, dim), inv(static_cast<size_t>(nd));
  for (int i = 0; i < nd; ++i) inv[static_cast<size_t>(p[static_cast<size_t>(i)])] = i;
  return inv;
}

// The router's plan for a softmax over geo (contiguous); v from the pointers of the row kernels.
RowPlan plan(Context& ctx, RowOp op, DType dtype, const Geometry& geo, const std::vector<CUdeviceptr>& ptrs) {
  RowProblem q;
  q.op = op;
  q.dtype = dtype;
  q.rows = geo.outer;
  q.D = geo.D;
  q.inner = geo.inner;
  q.v = geo.inner == 1 ? row_vector_width(dtype, geo.D, ptrs) : 1;
  return plan_row_kernel(q, row_device(ctx));
}

// y = softmax of contiguous x over rows of D (inner == 1) or over columns (inner > 1).
void launch_forward(const Tensor& x, const Tensor& y, const Geometry& geo, bool log, const RowPlan& p) {
  Context& ctx = x->ctx();
  CUdeviceptr xp = x->data(), yp = y->data();
  int64_t outer = geo.outer, D = geo.D, inner = geo.inner;
  void* row_args[] = {&xp, &yp, &outer, &D};
  void* col_args[] = {&xp, &yp, &outer, &D, &inner};
  launch_row_plan(ctx, ctx.function(fwd_key(x->dtype, log, p)), p, p.path == RowPath::Columns ? col_args : row_args);
}

void launch_backward(const Tensor& g, const Tensor& y, const Tensor& dx, const Geometry& geo, bool log, const RowPlan& p) {
  Context& ctx = y->ctx();
  CUdeviceptr gp = g->data(), yp = y->data(), dp = dx->data();
  int64_t outer = geo.outer, D = geo.D, inner = geo.inner;
  void* row_args[] = {&gp, &yp, &dp, &outer, &D};
  void* col_args[] = {&gp, &yp, &dp, &outer, &D, &inner};
  launch_row_plan(ctx, ctx.function(bwd_key(y->dtype, log, p)), p, p.path == RowPath::Columns ? col_args : row_args);
}

}  // namespace

Tensor ops::softmax(const Tensor& x0, int64_t dim0, bool log) {
  const char* what = log ? "log_softmax" : "softmax";
  check_float(x0, what);
  if (x0->ndim() == 0) {  // one element: softmax 1, log_softmax 0 (through the same kernel and graph)
    normalize_dim(dim0, 1);
    return reshape(softmax(reshape(x0, {1}), 0, log), {});
  }
  const int nd = x0->ndim(), dim = normalize_dim(dim0, nd);
  Tensor x = contiguous(x0);
  Geometry geo = geometry(x, dim);
  // The layout first (it does not depend on the pointers), the kernel once y exists.
  if (x->numel() > 0 && plan(x->ctx(), RowOp::SoftmaxForward, x->dtype, geo, {x->data()}).path == RowPath::PermuteToRows) {
    Tensor yt = softmax(contiguous(permute(x, to_last(nd, dim))), nd - 1, log);
    return contiguous(permute(yt, from_last(nd, dim)));
  }
  Tensor y = make_tensor(x->ctx(), x->shape, x->dtype);
  if (x->numel() > 0)
    launch_forward(x, y, geo, log, plan(x->ctx(), RowOp::SoftmaxForward, x->dtype, geo, {x->data(), y->data()}));
  if (auto node = record(log ? OpId::LogSoftmax : OpId::Softmax, {x}, {y})) {
    node->attributes = ops::DimAttrs{dim};
    node->saved.emplace_back(y, true);
  }
  return y;
}

Tensor ops::softmax_backward(const Tensor& g0, const Tensor& y0, int dim, bool log) {
  Tensor y = contiguous(y0), g = contiguous(g0);
  Tensor dx = make_tensor(y->ctx(), y->shape, y->dtype);
  if (y->numel() > 0) {
    const int nd = y->ndim();
    Geometry geo = geometry(y, dim);
    const RowPlan rp = plan(y->ctx(), RowOp::SoftmaxBackward, y->dtype, geo, {g->data(), y->data(), dx->data()});
    if (rp.path == RowPath::PermuteToRows) {
      std::vector<int> p = to_last(nd, dim);
      Tensor dt = softmax_backward(contiguous(permute(g, p)), contiguous(permute(y, p)), nd - 1, log);
      copy_into(dx, permute(dt, from_last(nd, dim)));
    } else {
      launch_backward(g, y, dx, geo, log, rp);
    }
  }
  record(OpId::SoftmaxBackward, {g, y}, {dx});
  return dx;
}

std::vector<std::string> ops::softmax_kernel_instantiations() {
  std::vector<std::string> v;
  for (DType t : {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_F64}) {
    for (bool log : {false, true}) {
      for (int vw : {1, static_cast<int>(16 / dtype_size(t))}) {
        RowPlan p;
        p.v = vw;
        for (int nv : kRowVectorsPerThread) {
          p.nv = nv;
          p.path = RowPath::Registers;
          v.push_back(kernel_name(fwd_key(t, log, p)));
          v.push_back(kernel_name(bwd_key(t, log, p)));
          if (vw > 1) {  // staged in shared memory: 16-byte vectors only
            p.path = RowPath::Staged;
            v.push_back(kernel_name(bwd_key(t, log, p)));
          }
        }
        p.path = RowPath::Stream;
        v.push_back(kernel_name(fwd_key(t, log, p)));
        v.push_back(kernel_name(bwd_key(t, log, p)));
      }
      v.push_back(kernel_name(smem_fwd_key(t, log, static_cast<int>(16 / dtype_size(t)))));
      v.push_back(kernel_name(cols_key(true, t, log)));
      v.push_back(kernel_name(cols_key(false, t, log)));
    }
  }
  return v;
}

}  // namespace flame

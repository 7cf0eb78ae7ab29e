// softmax / log_softmax along any dim: the host side of cuda/softmax.cuh.
// The input is made contiguous and seen as [outer, D, inner]. dim last (inner 1): the row kernels
// (registers when the row fits, else streaming). Another dim with enough columns (outer * inner):
// one thread per column. Few long columns: the dim is permuted to the end and made contiguous, the
// row kernel runs, and the result is permuted back (the forward does this with recorded ops).
#include <algorithm>
#include "autograd/graph.h"
#include "core/error.h"
#include "ops/nn.h"
#include "ops/nn_rows.h"
#include "ops/ops.h"

namespace flame {

namespace {

constexpr int64_t kMinColumns = 4096;  // fewer (long) columns parallelise poorly in softmax_cols_*

// The kernels of cuda/softmax.cuh: <T, log, ...>.
using A = TArg;
constexpr KernelTemplate kFwdStream{"softmax.cuh", "flame::softmax_fwd_stream", {A::Dtype, A::Bool, A::Int}};  // v
constexpr KernelTemplate kFwd{"softmax.cuh", "flame::softmax_fwd", {A::Dtype, A::Bool, A::Int, A::Int}};      // nv, v
constexpr KernelTemplate kBwdStream{"softmax.cuh", "flame::softmax_bwd_stream", {A::Dtype, A::Bool, A::Int}};
constexpr KernelTemplate kBwd{"softmax.cuh", "flame::softmax_bwd", {A::Dtype, A::Bool, A::Int, A::Int, A::Bool}};  // nv, v, smem
constexpr KernelTemplate kFwdSmem{"softmax.cuh", "flame::softmax_fwd_smem", {A::Dtype, A::Bool, A::Int}};  // v
constexpr KernelTemplate kColsFwd{"softmax.cuh", "flame::softmax_cols_fwd", {A::Dtype, A::Bool}};
constexpr KernelTemplate kColsBwd{"softmax.cuh", "flame::softmax_cols_bwd", {A::Dtype, A::Bool}};

KernelKey fwd_key(DType t, bool log, const RowPlan& p) {
  return p.stream ? make_key(kFwdStream, t, log, p.v) : make_key(kFwd, t, log, p.nv, p.v);
}
KernelKey bwd_key(DType t, bool log, const RowPlan& p) {
  return p.stream ? make_key(kBwdStream, t, log, p.v) : make_key(kBwd, t, log, p.nv, p.v, p.staged);
}
KernelKey smem_fwd_key(DType t, bool log, int v) { return make_key(kFwdSmem, t, log, v); }
KernelKey cols_key(bool fwd, DType t, bool log) { return make_key(fwd ? kColsFwd : kColsBwd, t, log); }

// Forward budget: the row in registers (launch bounds 1024: <= 64 registers, 32 for the row).
// Backward: g and y (launch bounds 512: <= 128 registers, 64 for the rows), or nothing in registers when
// short rows and 2-byte middle rows wait in shared memory (staged_bwd_rows).
RowBudget fwd_budget() { return RowBudget{1, 0, 32, 1024, false, false, true}; }
RowBudget bwd_budget() { return RowBudget{2, 0, 64, 512, false, false, false, true}; }

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

// y = softmax of contiguous x over rows of D (inner == 1) or over columns (inner > 1).
void launch_forward(const Tensor& x, const Tensor& y, const Geometry& geo, bool log) {
  Context& ctx = x->ctx();
  CUdeviceptr xp = x->data(), yp = y->data();
  if (geo.inner == 1) {
    int64_t rows = geo.outer;
    int v = row_vector_width(x->dtype, geo.D, {xp, yp});
    void* args[] = {&xp, &yp, &rows, const_cast<int64_t*>(&geo.D)};
    if (smem_rows(x->dtype, geo.D, v)) {
      launch_smem_rows(ctx, ctx.function(smem_fwd_key(x->dtype, log, v)), rows, geo.D, x->dtype, args, 128);
      return;
    }
    RowPlan p = plan_rows(ctx, rows, geo.D, x->dtype, v, fwd_budget());
    launch_rows(ctx, ctx.function(fwd_key(x->dtype, log, p)), p, args);
    return;
  }
  int64_t outer = geo.outer, D = geo.D, inner = geo.inner;
  void* args[] = {&xp, &yp, &outer, &D, &inner};
  launch_flat(ctx, ctx.function(cols_key(true, x->dtype, log)), outer * inner, args);
}

void launch_backward(const Tensor& g, const Tensor& y, const Tensor& dx, const Geometry& geo, bool log) {
  Context& ctx = y->ctx();
  CUdeviceptr gp = g->data(), yp = y->data(), dp = dx->data();
  if (geo.inner == 1) {
    int64_t rows = geo.outer;
    int v = row_vector_width(y->dtype, geo.D, {gp, yp, dp});
    RowPlan p = plan_rows(ctx, rows, geo.D, y->dtype, v, bwd_budget());
    void* args[] = {&gp, &yp, &dp, &rows, const_cast<int64_t*>(&geo.D)};
    launch_bwd_rows(ctx, ctx.function(bwd_key(y->dtype, log, p)), p, geo.D, y->dtype, args);
    return;
  }
  int64_t outer = geo.outer, D = geo.D, inner = geo.inner;
  void* args[] = {&gp, &yp, &dp, &outer, &D, &inner};
  launch_flat(ctx, ctx.function(cols_key(false, y->dtype, log)), outer * inner, args);
}

bool use_permuted(const Geometry& geo) { return geo.inner > 1 && geo.outer * geo.inner < kMinColumns && geo.D > 64; }

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
  if (x->numel() > 0 && use_permuted(geo)) {
    Tensor yt = softmax(contiguous(permute(x, to_last(nd, dim))), nd - 1, log);
    return contiguous(permute(yt, from_last(nd, dim)));
  }
  Tensor y = make_tensor(x->ctx(), x->shape, x->dtype);
  if (x->numel() > 0) launch_forward(x, y, geo, log);
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
    if (use_permuted(geo)) {
      std::vector<int> p = to_last(nd, dim);
      Tensor dt = softmax_backward(contiguous(permute(g, p)), contiguous(permute(y, p)), nd - 1, log);
      copy_into(dx, permute(dt, from_last(nd, dim)));
    } else {
      launch_backward(g, y, dx, geo, log);
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
        for (int nv : kRowNvs) {
          p.nv = nv;
          v.push_back(kernel_name(fwd_key(t, log, p)));
          v.push_back(kernel_name(bwd_key(t, log, p)));
          if (vw > 1) {  // staged in shared memory: 16-byte vectors only
            p.staged = true;
            v.push_back(kernel_name(bwd_key(t, log, p)));
            p.staged = false;
          }
        }
        p.stream = true;
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

// layer_norm, rms_norm, group_norm and batch_norm: argument checks, the host side of cuda/norm.cuh,
// and the recorded nodes. Saved per node: x, the weight (or nothing), mean (not for RMS), rstd;
// the attributes are ops::NormAttrs / ops::BatchNormAttrs (ops/nn.h).
//
// Row norms (layer/rms/group) run one kernel per direction (see cuda/norm.cuh); which one, and its
// launch, is the row-kernel router's decision (ops/row_router.h: RowOp::NormForward / NormBackward);
// this file turns the RowPlan into a kernel key and launches it. Their weight and bias gradients
// come back as per-block (LN/RMS) or per-(n, c) (GN) partial sums that one reduction over the
// partial rows finishes, or from norm_wb_cols / tensor ops (RowPlan::weight_grads). batch_norm:
// per-channel partial sums, a per-channel finalize, an elementwise apply; a channel with few values
// per block is split over blocks (RowOp::BatchNormChannels).
#include <algorithm>
#include <cmath>
#include "tensor/autograd_graph.h"
#include "core/error.h"
#include "ops/nn.h"
#include "ops/nn_rows.h"
#include "ops/ops.h"

namespace flame {

namespace {

RowNorm row_norm_of(ops::NormKind k) {
  return k == ops::NormKind::Layer ? RowNorm::Layer : (k == ops::NormKind::Rms ? RowNorm::Rms : RowNorm::Group);
}
int mode_of(RowNorm n) { return static_cast<int>(n); }  // the kernels' MODE (cuda/row_constants.cuh)
const char* kind_name(ops::NormKind k) {
  return k == ops::NormKind::Layer ? "layer_norm" : (k == ops::NormKind::Rms ? "rms_norm" : "group_norm");
}

// The kernels of cuda/norm.cuh: <T, MODE, ...> for the row norms, <T, ...> for batch_norm.
using A = TArg;
constexpr KernelTemplate kNormFwdBlock{"norm.cuh", "flame::norm_fwd_block", {A::Dtype, A::Int, A::Int, A::Bool}};  // v, smem
constexpr KernelTemplate kNormFwd{"norm.cuh", "flame::norm_fwd", {A::Dtype, A::Int, A::Int, A::Int}};  // nv, v
constexpr KernelTemplate kNormBwdStream{"norm.cuh", "flame::norm_bwd_stream", {A::Dtype, A::Int, A::Int}};  // v
constexpr KernelTemplate kNormBwd{"norm.cuh", "flame::norm_bwd",
                                  {A::Dtype, A::Int, A::Int, A::Int, A::Int, A::Bool}};  // nv, v, row, wb
constexpr KernelTemplate kNormWbCols{"norm.cuh", "flame::norm_wb_cols", {A::Dtype, A::Int, A::Int}};  // mode, v
constexpr KernelTemplate kNormBwdRing{"norm_ring.cuh", "flame::norm_bwd_ring", {A::Dtype, A::Int}};  // mode
constexpr KernelTemplate kBnReduce{"norm.cuh", "flame::bn_reduce", {A::Dtype, A::Int}};      // BnPass
constexpr KernelTemplate kBnFinalize{"norm.cuh", "flame::bn_finalize", {A::Dtype, A::Int}};  // BnPass
constexpr KernelTemplate kBnApply{"norm.cuh", "flame::bn_apply", {A::Dtype}};
constexpr KernelTemplate kBnBwdApply{"norm.cuh", "flame::bn_bwd_apply", {A::Dtype, A::Bool}};  // training

// One block per row (norm_fwd_block): in shared memory (RowPath::SharedRow), or streamed from global memory.
KernelKey block_fwd_key(DType t, RowNorm n, int v, bool smem) { return make_key(kNormFwdBlock, t, mode_of(n), v, smem); }
KernelKey fwd_key(DType t, RowNorm n, const RowPlan& p) {
  if (p.path == RowPath::SharedRow || p.path == RowPath::Stream) return block_fwd_key(t, n, p.v, p.path == RowPath::SharedRow);
  return make_key(kNormFwd, t, mode_of(n), p.nv, p.v);
}
// Where norm_bwd's rows wait between its two passes (its ROW argument).
int row_storage(RowPath path) {
  return path == RowPath::Staged ? kRowSmem : (path == RowPath::Registers ? kRowRegs : kRowGlobal);
}
KernelKey bwd_key(DType t, RowNorm n, const RowPlan& p, bool wb) {
  if (p.path == RowPath::Stream) return make_key(kNormBwdStream, t, mode_of(n), p.v);
  return make_key(kNormBwd, t, mode_of(n), p.nv, p.v, row_storage(p.path), wb);
}

void check_float(const Tensor& x, const char* op) {
  FLAME_CHECK(is_floating(x->dtype), FLAME_ERROR_DTYPE_MISMATCH, op, ": x must be a floating tensor, got ",
              dtype_name(x->dtype));
}
void check_eps(double eps, const char* op) {
  FLAME_CHECK(std::isfinite(eps) && eps >= 0, FLAME_ERROR_INVALID_ARGUMENT, op, ": eps must be finite and >= 0, got ", eps);
}
// weight / bias / running statistics: same context and dtype as x, the given shape.
void check_param(const Tensor& x, const Tensor& p, const Shape& want, const char* name, const char* op) {
  if (!p) return;
  FLAME_CHECK(&p->ctx() == &x->ctx(), FLAME_ERROR_INVALID_ARGUMENT, op, ": ", name, " belongs to another context");
  FLAME_CHECK(p->dtype == x->dtype, FLAME_ERROR_DTYPE_MISMATCH, op, ": ", name, " has dtype ", dtype_name(p->dtype),
              " but x has dtype ", dtype_name(x->dtype));
  FLAME_CHECK(p->shape == want, FLAME_ERROR_SHAPE_MISMATCH, op, ": ", name, " has shape ", shape_str(p->shape),
              ", expected ", shape_str(want));
}

struct FwdOut {
  Tensor y, mean, rstd;
};

FwdOut launch_norm_forward(RowNorm norm, const Tensor& x, const Tensor& w, const Tensor& b, const ops::NormGeometry& geo,
                           double eps) {
  Context& ctx = x->ctx();
  const DType acc = acc_of(x->dtype);
  FwdOut o;
  o.y = make_tensor(ctx, x->shape, x->dtype);
  if (norm != RowNorm::Rms) o.mean = make_tensor(ctx, {geo.rows}, acc);
  o.rstd = make_tensor(ctx, {geo.rows}, acc);
  if (x->numel() == 0) return o;
  CUdeviceptr xp = x->data(), wp = w ? w->data() : 0, bp = b ? b->data() : 0, yp = o.y->data();
  CUdeviceptr mp = o.mean ? o.mean->data() : 0, rp = o.rstd->data();
  std::vector<CUdeviceptr> ptrs = {xp, yp};
  if (norm != RowNorm::Group) ptrs.insert(ptrs.end(), {wp, bp});  // GN reads weight and bias per channel (scalar loads)
  RowProblem q;
  q.op = RowOp::NormForward;
  q.norm = norm;
  q.dtype = x->dtype;
  q.rows = geo.rows;
  q.D = geo.D;
  q.v = row_vector_width(x->dtype, geo.D, ptrs);
  const RowPlan p = plan_row_kernel(q, row_device(ctx));
  int64_t rows = geo.rows, D = geo.D, groups = geo.groups, hw = geo.hw;
  void* args[] = {&xp, &wp, &bp, &yp, &mp, &rp, &rows, &D, &groups, &hw, &eps};
  launch_row_plan(ctx, ctx.function(fwd_key(x->dtype, norm, p)), p, args);
  return o;
}

// GN weight and bias gradients from tensor ops (too many channels per group for shared-memory sums):
// xhat rebuilt from the saved statistics, in the compute type.
void composed_weight_grads(const ops::NormGeometry& geo, const Tensor& g, const Tensor& x, const Tensor& mean,
                           const Tensor& rstd, bool need_dw, bool need_db, ops::NormGrads* r) {
  using namespace ops;
  const DType acc = acc_of(x->dtype);
  Shape s3 = {geo.N, geo.groups, geo.D}, st = {geo.N, geo.groups, 1};
  Tensor xh = mul(sub(to_dtype(reshape(x, s3), acc), reshape(mean, st)), reshape(rstd, st));
  xh = reshape(xh, {geo.N, geo.C, geo.hw});
  Tensor gg = to_dtype(reshape(g, {geo.N, geo.C, geo.hw}), acc);
  if (need_dw) r->dw = to_dtype(sum(mul(gg, xh), {0, 2}, false), x->dtype);
  if (need_db) r->db = to_dtype(sum(gg, {0, 2}, false), x->dtype);
}

// LN/RMS weight and bias gradients of the streamed rows (norm_wb_cols): column-vector blocks of 256
// threads times enough row splits for 8 blocks per SM, then one sum over the splits' partials. (The
// composition it replaces made xhat and g * xhat as tensors: about twice the traffic.)
void column_weight_grads(Context& ctx, RowNorm norm, DType dt, const RowPlan& p, const ops::NormGeometry& geo,
                         CUdeviceptr gp, CUdeviceptr xp, CUdeviceptr mp, CUdeviceptr rp, bool need_dw, bool need_db,
                         ops::NormGrads* r) {
  using namespace ops;
  int64_t rows = geo.rows, D = geo.D, per_split = p.columns.rows_per_split;
  const int64_t splits = p.columns.splits;
  Tensor dwp = need_dw ? make_tensor(ctx, {splits, D}, acc_of(dt)) : nullptr;
  Tensor dbp = need_db ? make_tensor(ctx, {splits, D}, acc_of(dt)) : nullptr;
  CUdeviceptr dwpp = dwp ? dwp->data() : 0, dbpp = dbp ? dbp->data() : 0;
  void* args[] = {&gp, &xp, &mp, &rp, &dwpp, &dbpp, &rows, &D, &per_split};
  ctx.check(ctx.drv.cuLaunchKernel(ctx.function(make_key(kNormWbCols, dt, mode_of(norm), p.v)), p.columns.col_blocks,
                                   static_cast<unsigned>(splits), 1, kRowThresholds.wgrad_col_threads, 1, 1, 0, ctx.stream,
                                   args, nullptr),
            "cuLaunchKernel");
  if (dwp) r->dw = to_dtype(sum(dwp, {0}, false), dt);
  if (dbp) r->db = to_dtype(sum(dbp, {0}, false), dt);
}

Tensor record_norm(OpId op, const Tensor& x, const Tensor& w, const Tensor& b, bool has_bias_input, const FwdOut& o,
                   int64_t attr, double eps) {
  std::vector<Tensor> ins = {x, w};
  if (has_bias_input) ins.push_back(b);
  if (auto node = record(op, ins, {o.y})) {
    node->attributes = ops::NormAttrs{attr, w != nullptr, b != nullptr, eps};
    node->saved.emplace_back(x, false);
    if (w) node->saved.emplace_back(w, false);
    else node->saved.emplace_back();
    if (o.mean) node->saved.emplace_back(o.mean, false);
    else node->saved.emplace_back();
    node->saved.emplace_back(o.rstd, false);
  }
  return o.y;
}

}  // namespace

ops::NormGeometry ops::norm_geometry(NormKind kind, const Shape& shape, int64_t k_or_groups) {
  NormGeometry geo;
  const int nd = static_cast<int>(shape.size());
  if (kind == NormKind::Group) {
    geo.N = shape[0];
    geo.C = shape[1];
    for (int d = 2; d < nd; ++d) geo.hw *= shape[d];
    geo.groups = k_or_groups;
    geo.rows = geo.N * geo.groups;
    geo.D = (geo.C / geo.groups) * geo.hw;
    return geo;
  }
  geo.rows = 1;
  geo.D = 1;
  for (int d = 0; d < nd; ++d) (d < nd - k_or_groups ? geo.rows : geo.D) *= shape[d];
  return geo;
}

static Tensor row_norm(ops::NormKind kind, const Tensor& x0, const Shape& nshape, const Tensor& w0, const Tensor& b0,
                       double eps) {
  const char* op = kind_name(kind);
  check_float(x0, op);
  const int k = static_cast<int>(nshape.size());
  FLAME_CHECK(k >= 1, FLAME_ERROR_INVALID_ARGUMENT, op, ": normalized_shape must have at least one dim");
  FLAME_CHECK(k <= x0->ndim(), FLAME_ERROR_SHAPE_MISMATCH, op, ": normalized_shape ", shape_str(nshape),
              " has more dims than x ", shape_str(x0->shape));
  for (int i = 0; i < k; ++i)
    FLAME_CHECK(x0->shape[x0->ndim() - k + i] == nshape[i], FLAME_ERROR_SHAPE_MISMATCH, op, ": normalized_shape ",
                shape_str(nshape), " does not match the trailing dims of x ", shape_str(x0->shape));
  check_param(x0, w0, nshape, "weight", op);
  check_param(x0, b0, nshape, "bias", op);
  check_eps(eps, op);
  Tensor x = ops::contiguous(x0), w = w0 ? ops::contiguous(w0) : nullptr, b = b0 ? ops::contiguous(b0) : nullptr;
  ops::NormGeometry geo = ops::norm_geometry(kind, x->shape, k);
  FwdOut o = launch_norm_forward(row_norm_of(kind), x, w, b, geo, eps);
  return record_norm(kind == ops::NormKind::Layer ? OpId::LayerNorm : OpId::RmsNorm, x, w, b, kind == ops::NormKind::Layer,
                     o, k, eps);
}

Tensor ops::layer_norm(const Tensor& x, const Shape& nshape, const Tensor& w, const Tensor& b, double eps) {
  return row_norm(NormKind::Layer, x, nshape, w, b, eps);
}

Tensor ops::rms_norm(const Tensor& x, const Shape& nshape, const Tensor& w, double eps) {
  return row_norm(NormKind::Rms, x, nshape, w, nullptr, eps);
}

Tensor ops::group_norm(const Tensor& x0, int64_t groups, const Tensor& w0, const Tensor& b0, double eps, bool channels_last) {
  const char* op = "group_norm";
  check_float(x0, op);
  const int nd = x0->ndim();
  FLAME_CHECK(nd >= 2, FLAME_ERROR_SHAPE_MISMATCH, op, ": x must have a batch and a channel dim, got shape ",
              shape_str(x0->shape));
  const int64_t C = channels_last ? x0->shape[nd - 1] : x0->shape[1];
  FLAME_CHECK(groups > 0 && C % groups == 0, FLAME_ERROR_INVALID_ARGUMENT, op, ": num_groups ", groups,
              " must be positive and divide the ", C, " channels");
  check_param(x0, w0, {C}, "weight", op);
  check_param(x0, b0, {C}, "bias", op);
  check_eps(eps, op);
  if (channels_last && nd > 2) {  // [N, *, C] -> [N, C, *], normalise, and back to channels last
    std::vector<int> to_first = {0, nd - 1}, back = {0};
    for (int d = 1; d < nd - 1; ++d) to_first.push_back(d);
    for (int d = 2; d < nd; ++d) back.push_back(d);
    back.push_back(1);
    return contiguous(permute(group_norm(permute(x0, to_first), groups, w0, b0, eps, false), back));
  }
  Tensor x = contiguous(x0), w = w0 ? contiguous(w0) : nullptr, b = b0 ? contiguous(b0) : nullptr;
  NormGeometry geo = norm_geometry(NormKind::Group, x->shape, groups);
  FwdOut o = launch_norm_forward(RowNorm::Group, x, w, b, geo, eps);
  return record_norm(OpId::GroupNorm, x, w, b, true, o, groups, eps);
}

ops::NormGrads ops::norm_backward(NormKind kind, const NormGeometry& geo, const Tensor& g0, const Tensor& x,
                                  const Tensor& w, const Tensor& mean, const Tensor& rstd, bool need_dx, bool need_dw,
                                  bool need_db) {
  Context& ctx = x->ctx();
  const RowNorm norm = row_norm_of(kind);
  const DType dt = x->dtype, acc = acc_of(dt);
  const int64_t wlen = norm == RowNorm::Group ? geo.C : geo.D;  // dw/db come back flat: [C] or [D]
  need_dw = need_dw && w;
  Tensor g = contiguous(g0);
  NormGrads r;
  if (need_dx) r.dx = make_tensor(ctx, x->shape, dt);
  if (x->numel() == 0) {
    if (need_dw) r.dw = zeros(ctx, {wlen}, dt);
    if (need_db) r.db = zeros(ctx, {wlen}, dt);
  } else if (need_dx || need_dw || need_db) {
    CUdeviceptr gp = g->data(), xp = x->data(), wp = w ? w->data() : 0, dxp = need_dx ? r.dx->data() : 0;
    CUdeviceptr mp = mean ? mean->data() : 0, rp = rstd->data();
    std::vector<CUdeviceptr> ptrs = {gp, xp, dxp};
    if (norm != RowNorm::Group) ptrs.push_back(wp);
    RowProblem q;
    q.op = RowOp::NormBackward;
    q.norm = norm;
    q.dtype = dt;
    q.rows = geo.rows;
    q.D = geo.D;
    q.hw = geo.hw;
    q.v = row_vector_width(dt, geo.D, ptrs);
    q.need_dx = need_dx;
    q.need_weight_grads = need_dw || need_db;
    const RowPlan p = plan_row_kernel(q, row_device(ctx));
    const bool kernel_wb = p.weight_grads == WeightGrads::InKernel;
    int64_t rows = geo.rows, D = geo.D, groups = geo.groups, hw = geo.hw;
    if (p.path == RowPath::Ring) {
      void* args[] = {&gp, &xp, &wp, &mp, &rp, &dxp, &rows, &D};
      launch_row_plan(ctx, ctx.function(make_key(kNormBwdRing, dt, mode_of(norm))), p, args);
    } else if (p.path == RowPath::Stream) {
      void* args[] = {&gp, &xp, &wp, &mp, &rp, &dxp, &rows, &D, &groups, &hw};
      launch_row_plan(ctx, ctx.function(bwd_key(dt, norm, p, false)), p, args);
    } else if (p.path != RowPath::None) {
      // LN/RMS partial sums: RowPlan::partial_rows rows (one per row group, or per block for staged rows).
      Shape pshape = norm == RowNorm::Group ? Shape{geo.N, geo.C} : Shape{p.partial_rows, geo.D};
      Tensor dwp = kernel_wb && need_dw ? make_tensor(ctx, pshape, acc) : nullptr;
      Tensor dbp = kernel_wb && need_db ? make_tensor(ctx, pshape, acc) : nullptr;
      CUdeviceptr dwpp = dwp ? dwp->data() : 0, dbpp = dbp ? dbp->data() : 0;
      int seg_aligned = p.segment_aligned ? 1 : 0;
      void* args[] = {&gp, &xp, &wp, &mp, &rp, &dxp, &dwpp, &dbpp, &rows, &D, &groups, &hw, &seg_aligned};
      launch_row_plan(ctx, ctx.function(bwd_key(dt, norm, p, p.weight_grads_template)), p, args);
      if (dwp) r.dw = to_dtype(reshape(sum(dwp, {0}, false), {wlen}), dt);
      if (dbp) r.db = to_dtype(reshape(sum(dbp, {0}, false), {wlen}), dt);
    }
    if (p.weight_grads == WeightGrads::Columns)
      column_weight_grads(ctx, norm, dt, p, geo, gp, xp, mp, rp, need_dw, need_db, &r);
    else if (p.weight_grads == WeightGrads::Composed)
      composed_weight_grads(geo, g, x, mean, rstd, need_dw, need_db, &r);
  }
  std::vector<Tensor> outs;
  for (const Tensor& t : {r.dx, r.dw, r.db})
    if (t) outs.push_back(t);
  if (!outs.empty()) record(OpId::NormBackward, {g, x, w}, outs);
  return r;
}

// ---------------- batch_norm ----------------

namespace {

struct BnShape {
  int64_t N, C, HW, count;
};
BnShape bn_shape(const Tensor& x) {
  BnShape s{x->shape[0], x->shape[1], 1, 0};
  for (int d = 2; d < x->ndim(); ++d) s.HW *= x->shape[d];
  s.count = s.N * s.HW;
  return s;
}

// Per-channel sums (bn_reduce + bn_finalize). kBnStatistics: writes mean and rstd, updates the
// running statistics; kBnGradientSums: writes sums [C, 2] = (sum g, sum g (x - mean)). The split of
// each channel over blocks is the router's (RowOp::BatchNormChannels).
void bn_channel_pass(int pass, const Tensor& x, const Tensor& g, const Tensor& mean, const Tensor& out0,
                     const Tensor& out1, const Tensor& rm, const Tensor& rv, double momentum, double eps) {
  Context& ctx = x->ctx();
  BnShape s = bn_shape(x);
  const DType acc = acc_of(x->dtype);
  RowProblem q;
  q.op = RowOp::BatchNormChannels;
  q.dtype = x->dtype;
  q.rows = s.C;
  q.D = s.count;
  const RowPlan p = plan_row_kernel(q, row_device(ctx));
  int64_t chunks = p.channels.chunks, chunk_len = p.channels.chunk_len;
  Tensor part = make_tensor(ctx, {s.C * chunks * 2}, acc);
  CUdeviceptr xp = x->data(), gp = g ? g->data() : 0, mp = mean ? mean->data() : 0, pp = part->data();
  void* a1[] = {&xp, &gp, &mp, &pp, &s.C, &s.HW, &s.count, &chunks, &chunk_len};
  ctx.launch(ctx.function(make_key(kBnReduce, x->dtype, pass)), p.channels.reduce_grid, 256, a1);
  CUdeviceptr o0 = out0->data(), o1 = out1 ? out1->data() : 0, rmp = rm ? rm->data() : 0, rvp = rv ? rv->data() : 0;
  int64_t rms = rm ? rm->strides[0] : 0, rvs = rv ? rv->strides[0] : 0;
  void* a2[] = {&pp, &xp, &o0, &o1, &rmp, &rms, &rvp, &rvs, &s.C, &s.HW, &s.count, &chunks, &momentum, &eps};
  launch_flat(ctx, ctx.function(make_key(kBnFinalize, x->dtype, pass)), s.C, a2);
  if (rm) rm->storage->version++;  // updated in place
  if (rv) rv->storage->version++;
}

}  // namespace

Tensor ops::batch_norm(const Tensor& x0, const Tensor& rm, const Tensor& rv, const Tensor& w0, const Tensor& b0,
                       bool training, double momentum, double eps) {
  const char* op = "batch_norm";
  check_float(x0, op);
  FLAME_CHECK(x0->ndim() >= 2, FLAME_ERROR_SHAPE_MISMATCH, op, ": x must have a batch and a channel dim, got shape ",
              shape_str(x0->shape));
  const int64_t C = x0->shape[1];
  check_param(x0, w0, {C}, "weight", op);
  check_param(x0, b0, {C}, "bias", op);
  check_param(x0, rm, {C}, "running_mean", op);
  check_param(x0, rv, {C}, "running_var", op);
  FLAME_CHECK(!rm == !rv, FLAME_ERROR_INVALID_ARGUMENT, op, ": running_mean and running_var must both be given or both be NULL");
  FLAME_CHECK(training || rm, FLAME_ERROR_INVALID_ARGUMENT, op, ": eval mode (training 0) needs running_mean and running_var");
  FLAME_CHECK(!rm || (!requires_grad(*rm) && !requires_grad(*rv)), FLAME_ERROR_INVALID_ARGUMENT, op,
              ": running_mean and running_var are updated in place and must not require grad");
  check_eps(eps, op);
  FLAME_CHECK(std::isfinite(momentum), FLAME_ERROR_INVALID_ARGUMENT, op, ": momentum must be finite, got ", momentum);
  Tensor x = contiguous(x0), w = w0 ? contiguous(w0) : nullptr, b = b0 ? contiguous(b0) : nullptr;
  Context& ctx = x->ctx();
  BnShape s = bn_shape(x);
  const DType acc = acc_of(x->dtype);
  Tensor mean = make_tensor(ctx, {C}, acc), rstd = make_tensor(ctx, {C}, acc);
  // Everything that can fail comes before the in-place update of the running statistics.
  Tensor y = make_tensor(ctx, x->shape, x->dtype);
  CUfunction apply = ctx.function(make_key(kBnApply, x->dtype));
  if (training) {
    FLAME_CHECK(s.count > 1, FLAME_ERROR_INVALID_ARGUMENT, op, ": training needs more than one value per channel, got x of shape ",
                shape_str(x->shape));
    bn_channel_pass(kBnStatistics, x, nullptr, nullptr, mean, rstd, rm, rv, momentum, eps);
  } else {  // the running statistics, copied: later updates must not change what backward sees
    copy_into(mean, alias(rm));
    copy_into(rstd, alias(rv));
    rstd = unary(OpId::Rsqrt, add_scalar(rstd, eps));
  }
  if (x->numel() > 0) {
    CUdeviceptr xp = x->data(), yp = y->data(), mp = mean->data(), rp = rstd->data();
    CUdeviceptr wp = w ? w->data() : 0, bp = b ? b->data() : 0;
    int64_t n = x->numel();
    void* args[] = {&xp, &yp, &mp, &rp, &wp, &bp, &n, &s.C, &s.HW};
    launch_flat(ctx, apply, n, args);
  }
  if (auto node = record(OpId::BatchNorm, {x, w, b}, {y})) {
    node->attributes = ops::BatchNormAttrs{training, w != nullptr, b != nullptr, eps};
    node->saved.emplace_back(x, false);
    if (w) node->saved.emplace_back(w, false);
    else node->saved.emplace_back();
    node->saved.emplace_back(mean, false);
    node->saved.emplace_back(rstd, false);
  }
  return y;
}

ops::NormGrads ops::batch_norm_backward(const Tensor& g0, const Tensor& x, const Tensor& w, const Tensor& mean,
                                        const Tensor& rstd, bool training, bool need_dx, bool need_dw, bool need_db) {
  Context& ctx = x->ctx();
  const DType dt = x->dtype, acc = acc_of(dt);
  BnShape s = bn_shape(x);
  need_dw = need_dw && w;
  Tensor g = contiguous(g0);
  NormGrads r;
  if (need_dx) r.dx = make_tensor(ctx, x->shape, dt);
  if (x->numel() == 0) {
    if (need_dw) r.dw = zeros(ctx, {s.C}, dt);
    if (need_db) r.db = zeros(ctx, {s.C}, dt);
  } else {
    Tensor sums;
    if ((need_dx && training) || need_dw || need_db) {
      sums = make_tensor(ctx, {s.C, 2}, acc);
      bn_channel_pass(kBnGradientSums, x, g, mean, sums, nullptr, nullptr, nullptr, 0, 0);
    }
    if (need_dx) {
      CUdeviceptr gp = g->data(), xp = x->data(), dp = r.dx->data(), mp = mean->data(), rp = rstd->data();
      CUdeviceptr wp = w ? w->data() : 0, sp = sums ? sums->data() : 0;
      int64_t n = x->numel();
      void* args[] = {&gp, &xp, &dp, &mp, &rp, &wp, &sp, &n, &s.C, &s.HW, &s.count};
      launch_flat(ctx, ctx.function(make_key(kBnBwdApply, dt, training)), n, args);
    }
    if (need_dw) r.dw = to_dtype(mul(select(sums, 1, 1), rstd), dt);  // sum(g * xhat) = rstd * sum(g (x - mean))
    if (need_db) r.db = to_dtype(select(sums, 1, 0), dt);
  }
  std::vector<Tensor> outs;
  for (const Tensor& t : {r.dx, r.dw, r.db})
    if (t) outs.push_back(t);
  if (!outs.empty()) record(OpId::BatchNormBackward, {g, x, w}, outs);
  return r;
}

std::vector<std::string> ops::norm_kernel_instantiations() {
  std::vector<std::string> v;
  for (DType t : {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_F64}) {
    for (RowNorm n : {RowNorm::Layer, RowNorm::Rms, RowNorm::Group}) {
      const bool group = n == RowNorm::Group;
      for (int vw : {1, static_cast<int>(16 / dtype_size(t))}) {
        RowPlan p;
        p.v = vw;
        for (int nv : kRowVectorsPerThread) {
          p.nv = nv;
          p.path = RowPath::Registers;
          v.push_back(kernel_name(fwd_key(t, n, p)));
          // staged: LN/RMS with 16-byte vectors
          for (RowPath path : {RowPath::Global, RowPath::Registers, RowPath::Staged}) {
            if (path == RowPath::Staged && (group || vw == 1)) continue;
            p.path = path;
            v.push_back(kernel_name(bwd_key(t, n, p, true)));
            if (!group) v.push_back(kernel_name(bwd_key(t, n, p, false)));
          }
        }
        p.path = RowPath::Stream;
        v.push_back(kernel_name(fwd_key(t, n, p)));
        v.push_back(kernel_name(bwd_key(t, n, p, false)));
      }
      v.push_back(kernel_name(block_fwd_key(t, n, static_cast<int>(16 / dtype_size(t)), true)));
      if (!group) {
        for (int vw : {1, static_cast<int>(16 / dtype_size(t))}) v.push_back(kernel_name(make_key(kNormWbCols, t, mode_of(n), vw)));
        v.push_back(kernel_name(make_key(kNormBwdRing, t, mode_of(n))));
      }
    }
    for (int m : {kBnStatistics, kBnGradientSums}) {
      v.push_back(kernel_name(make_key(kBnReduce, t, m)));
      v.push_back(kernel_name(make_key(kBnFinalize, t, m)));
    }
    v.push_back(kernel_name(make_key(kBnApply, t)));
    v.push_back(kernel_name(make_key(kBnBwdApply, t, true)));
    v.push_back(kernel_name(make_key(kBnBwdApply, t, false)));
  }
  return v;
}

}  // namespace flame

// Losses. cross_entropy and nll_loss are fused ops (kernels in cuda/loss.cuh): their logits are
// brought to a contiguous [M, C] row layout (a free view for [N, C] contiguous logits; for
// [N, C, d1...] the class dim is moved last by a recorded permute + copy), one kernel computes the
// per-row losses and what backward needs (logsumexp and target weight per row, in the accumulation
// dtype A = f32, or f64 for f64), and the reduction is a sum of those rows. One graph node is
// recorded per call; its backward rule (autograd/backward_rules.cpp) runs the fused backward kernel,
// or the same formula written with FLAME ops when a graph of the backward is being built.
//
// With class indices and reduction mean or sum, a forward that records a node also writes the
// gradient for an upstream gradient of 1 (ce_index_fwd_grad: each row read from DRAM once; for mean
// the divisor is summed from the targets first; rows of 32-225 KiB on sm_90 stream through the TMA
// ring of cuda/loss_ring.cuh and wait in shared memory for the gradient pass). It is saved in the node, and the backward hands it
// out as it is when its gradient is the engine's own seed of ones (loss.backward()); any other
// upstream gradient runs the backward kernel as before (one rounding; the same traffic as scaling
// the saved gradient). Reduction none keeps the two-kernel path: its upstream is never the seed.
//
// Which kernel a row of logits takes (one warp or one block per row, the TMA ring) and its launch
// shape are the row-kernel router's (ops/row_router.h: RowOp::CrossEntropyRows / CrossEntropyFusedGrad).
//
// Class indices are checked on the device, not on the host (copying them to the host would stall
// the stream every step): an index out of range that is not ignore_index gives that row a NaN loss
// and is reported by the context's next synchronisation (Context::device_error_record).
//
// smooth_l1, huber and binary_cross_entropy_with_logits are compositions of FLAME ops; f16/bf16
// inputs are computed in f32 and the result is rounded once. mse_loss and l1_loss live in
// ops/loss_pointwise.cpp (fused for reduction mean and sum).
#include "ops/loss.h"
#include <algorithm>
#include <cmath>
#include "core/error.h"
#include "ops/nn_rows.h"
#include "ops/ops.h"

namespace flame {

namespace {

DType wide(DType d) { return (d == FLAME_DTYPE_F16 || d == FLAME_DTYPE_BF16) ? FLAME_DTYPE_F32 : d; }
int full_width(DType d) { return static_cast<int>(16 / dtype_size(d)); }

// The kernels of cuda/loss.cuh. Row kernels: <V, warp, T, [index type,] A>; nll: <T, index type, A>.
using K = TArg;
// <V, one warp per row, PLAIN (no class weights, no label smoothing), T, index type, A>
constexpr KernelTemplate kCeIndexFwd{"loss.cuh", "flame::ce_index_fwd", {K::Int, K::Bool, K::Bool, K::Dtype, K::Dtype, K::Dtype}};
constexpr KernelTemplate kCeIndexBwd{"loss.cuh", "flame::ce_index_bwd", {K::Int, K::Bool, K::Bool, K::Dtype, K::Dtype, K::Dtype}};
constexpr KernelTemplate kCeIndexFwdGrad{"loss.cuh", "flame::ce_index_fwd_grad",
                                         {K::Int, K::Bool, K::Bool, K::Dtype, K::Dtype, K::Dtype}};
// <PLAIN, T, index type>: rows that fit the TMA ring of cuda/loss_ring.cuh (sm_90, accumulation f32)
constexpr KernelTemplate kCeIndexFwdGradRing{"loss_ring.cuh", "flame::ce_index_fwd_grad_ring",
                                             {K::Bool, K::Dtype, K::Dtype, K::Int, K::Int}};  // <.., slots, groups>
constexpr KernelTemplate kCeProbFwd{"loss.cuh", "flame::ce_prob_fwd", {K::Int, K::Bool, K::Dtype, K::Dtype}};
constexpr KernelTemplate kCeProbBwd{"loss.cuh", "flame::ce_prob_bwd", {K::Int, K::Bool, K::Dtype, K::Dtype}};
constexpr KernelTemplate kNllFwd{"loss.cuh", "flame::nll_fwd", {K::Dtype, K::Dtype, K::Dtype}};
constexpr KernelTemplate kNllBwd{"loss.cuh", "flame::nll_bwd", {K::Dtype, K::Dtype, K::Dtype}};
constexpr KernelTemplate kCeTargetWeight{"loss.cuh", "flame::ce_target_weight", {K::Dtype, K::Dtype}};  // <index type, A>

// ---- launch plans of the row kernels (the router's) ----

// The router's plan for cross-entropy over [M, C] logits whose kernel reads and writes ptrs.
RowPlan plan_ce(Context& ctx, RowOp op, int64_t M, int64_t C, DType dt, const std::vector<CUdeviceptr>& ptrs) {
  RowProblem q;
  q.op = op;
  q.dtype = dt;
  q.rows = M;
  q.D = C;
  q.v = row_vector_width(dt, C, ptrs);  // 16-byte vectors when C and every pointer allow (rows then start aligned)
  return plan_row_kernel(q, row_device(ctx, op == RowOp::CrossEntropyFusedGrad));
}
bool warp_rows(const RowPlan& p) { return p.path == RowPath::WarpPerRow; }

// The shapes ce_index_fwd_grad_ring is instantiated with (cuda/row_constants.cuh).
struct CeRing { int slots, groups; };
constexpr CeRing kCeRings[] = {{ring::kLossShortSlots, ring::kLossShortGroups}, {ring::kLossLongSlots, ring::kLossLongGroups}};

KernelKey row_key(const KernelTemplate& k, int v, bool warp, DType t, DType a) { return make_key(k, v, warp, t, a); }
KernelKey row_key(const KernelTemplate& k, const RowPlan& p, DType t, DType a) { return row_key(k, p.v, warp_rows(p), t, a); }
KernelKey index_key(const KernelTemplate& k, int v, bool warp, bool plain, DType t, DType idx, DType a) {
  return make_key(k, v, warp, plain, t, idx, a);
}
KernelKey index_key(const KernelTemplate& k, const RowPlan& p, bool plain, DType t, DType idx, DType a) {
  return index_key(k, p.v, warp_rows(p), plain, t, idx, a);
}
KernelKey nll_key(const KernelTemplate& k, DType t, DType idx) { return make_key(k, t, idx, acc_of(t)); }

unsigned flat_grid(Context& ctx, int64_t n) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n + 255) / 256, int64_t{ctx.sm_count} * 32)));
}

// ---- argument checks and layout shared by cross_entropy and nll_loss ----

constexpr int64_t kMaxClasses = (int64_t{1} << 31) - (int64_t{1} << 20);  // int offsets in a row, with room for a stride

// The class count and the expected shape of class-index targets for logits of shape s.
void class_geometry(const char* op, const Tensor& x, int64_t* C, Shape* index_shape) {
  FLAME_CHECK(is_floating(x->dtype), FLAME_ERROR_DTYPE_MISMATCH, op, ": input must be floating, got ", dtype_name(x->dtype));
  FLAME_CHECK(x->ndim() >= 1, FLAME_ERROR_SHAPE_MISMATCH, op, ": input must have a class dim ([C], [N, C] or [N, C, d1, ...]), "
              "got a 0-d tensor");
  int cdim = x->ndim() == 1 ? 0 : 1;
  *C = x->shape[cdim];
  FLAME_CHECK(*C > 0, FLAME_ERROR_SHAPE_MISMATCH, op, ": input ", shape_str(x->shape), " has no classes (dim ", cdim, " is 0)");
  *index_shape = x->shape;
  index_shape->erase(index_shape->begin() + cdim);
}

// x as contiguous [M, C] rows: the class dim (1, or 0 for unbatched input) moved last. Recorded, so
// that gradients flow back through the permute and copy.
Tensor as_rows(const Tensor& x, int64_t C, bool need_contiguous) {
  Tensor t = x;
  if (x->ndim() > 2) {
    std::vector<int> p = {0};
    for (int d = 2; d < x->ndim(); ++d) p.push_back(d);
    p.push_back(1);
    t = ops::permute(x, p);
  }
  t = ops::reshape(t, {x->numel() / C, C});
  return need_contiguous ? ops::contiguous(t) : t;
}

void check_index_target(const char* op, const Tensor& target, const Shape& want) {
  FLAME_CHECK(target->dtype == FLAME_DTYPE_I64 || target->dtype == FLAME_DTYPE_I32, FLAME_ERROR_DTYPE_MISMATCH, op,
              ": class-index targets must be i64 or i32, got ", dtype_name(target->dtype));
  FLAME_CHECK(target->shape == want, FLAME_ERROR_SHAPE_MISMATCH, op, ": target has shape ", shape_str(target->shape),
              " but class indices for this input need shape ", shape_str(want));
}

// weight as a contiguous [C] tensor in the accumulation dtype; its gradient is not implemented
// (as in PyTorch), so a weight that requires grad is refused rather than silently dropped.
Tensor weight_acc(const char* op, const Tensor& w, int64_t C, DType a) {
  if (!w) return nullptr;
  FLAME_CHECK(is_floating(w->dtype), FLAME_ERROR_DTYPE_MISMATCH, op, ": weight must be floating, got ", dtype_name(w->dtype));
  FLAME_CHECK(w->ndim() == 1 && w->shape[0] == C, FLAME_ERROR_SHAPE_MISMATCH, op, ": weight has shape ", shape_str(w->shape),
              " but the input has ", C, " classes (expected [", C, "])");
  FLAME_CHECK(!(requires_grad(*w) && w->ctx().recording()), FLAME_ERROR_NOT_DIFFERENTIABLE, op,
              ": the gradient with respect to weight is not implemented (as in PyTorch); detach weight or clear its "
              "requires_grad");
  return ops::contiguous(ops::to_dtype(alias(w), a));
}

// The reduced loss from per-row losses in the accumulation dtype; denom (mean of class indices) is
// the sum of the rows' target weights, else the mean divides by the number of rows.
Tensor finish(const Tensor& rows, ops::Reduction red, const Tensor& denom, DType out) {
  DType a = rows->dtype;
  switch (red) {
    case ops::Reduction::None: return ops::to_dtype(rows, out);
    case ops::Reduction::Sum: return ops::to_dtype(ops::sum_as(rows, {}, false, a), out);
    case ops::Reduction::Mean: {
      Tensor s = ops::sum_as(rows, {}, false, a);
      if (denom) return ops::to_dtype(ops::div(s, denom), out);  // all ignored: 0 / 0 = NaN, as PyTorch
      int64_t m = rows->numel();
      return ops::to_dtype(ops::mul_scalar(s, m ? 1.0 / static_cast<double>(m) : std::nan("")), out);
    }
  }
  fail(FLAME_ERROR_INVALID_ARGUMENT, "invalid reduction");
}

void save_common(Node& node, const Tensor& weight, const Tensor& wsum, int64_t ignore_index, ops::Reduction red, int64_t C,
                 double eps) {
  if (weight) {
    node.saved.emplace_back(weight, false);
    node.saved.emplace_back(wsum, false);
  }
  node.attributes = ops::LossAttrs{ignore_index, red, weight != nullptr, C, eps, false};
}

// ---- the fused cross-entropy ops on [M, C] rows ----

// Forward and gradient in one kernel (see the top of this file); the node saves the gradient last.
Tensor ce_index_with_grad(const Tensor& x, const Tensor& target, const Tensor& weight, int64_t ignore_index, double eps,
                          ops::Reduction red, DType out_dtype) {
  Context& ctx = x->ctx();
  int64_t M = x->shape[0], C = x->shape[1];
  DType T = x->dtype, A = acc_of(T), I = target->dtype;
  Tensor wsum = weight ? ops::sum_as(weight, {}, false, A) : nullptr;
  Tensor loss = make_tensor(ctx, {M}, A), wrow = make_tensor(ctx, {M}, A), lse = make_tensor(ctx, {M}, A);
  Tensor grad = make_tensor(ctx, {M, C}, T);
  CUdeviceptr pt = target->data(), pw = weight ? weight->data() : 0, pr = wrow->data();
  Tensor denom;
  if (red == ops::Reduction::Mean) {  // the divisor first: the kernel scales the gradient by it
    if (M > 0) {
      void* args[] = {&pt, &pw, &M, &C, &ignore_index, &pr};
      ctx.launch(ctx.function(make_key(kCeTargetWeight, I, A)),
                 flat_grid(ctx, M), 256, args);
    }
    denom = ops::sum_as(wrow, {}, false, A);
  }
  if (M > 0) {
    const RowPlan p = plan_ce(ctx, RowOp::CrossEntropyFusedGrad, M, C, T, {x->data(), grad->data()});
    uint32_t src = 0;
    CUdeviceptr rec = ctx.device_error_record("cross_entropy: target index", &src);
    CUdeviceptr px = x->data(), ps = wsum ? wsum->data() : 0, pd = denom ? denom->data() : 0;
    CUdeviceptr pl = loss->data(), pe = lse->data(), pg = grad->data();
    void* args[] = {&px, &pt, &pw, &ps, &pd, &M, &C, &ignore_index, &eps, &pl, &pr, &pe, &pg, &rec, &src};
    const bool plain = !weight && eps == 0.0;
    const KernelKey key = p.path == RowPath::Ring ? make_key(kCeIndexFwdGradRing, plain, T, I, p.ring.slots, p.ring.groups)
                                                  : index_key(kCeIndexFwdGrad, p, plain, T, I, A);
    launch_row_plan(ctx, ctx.function(key), p, args);
  }
  Tensor out = finish(loss, red, denom, out_dtype);
  if (auto node = record(OpId::CrossEntropy, {x}, {out})) {
    node->saved.emplace_back(x, false);  // the backward kernel (other upstream gradients) and create_graph read it
    node->saved.emplace_back(target, false);
    node->saved.emplace_back(lse, false);
    node->saved.emplace_back(wrow, false);
    if (denom) node->saved.emplace_back(denom, false);
    save_common(*node, weight, wsum, ignore_index, red, C, eps);
    node->saved.emplace_back(grad, false);
    node->attrs<ops::LossAttrs>().saved_grad = true;
  }
  return out;
}

Tensor ce_index(const Tensor& x, const Tensor& target, const Tensor& weight, int64_t ignore_index, double eps,
                ops::Reduction red, DType out_dtype) {
  // record() below would make a node. The fused path holds the gradient from the forward to the
  // backward, which allocates one of that size anyway (8192 x 50304 bf16 on an H200: 0.51 ms fused,
  // 0.67 ms the two kernels).
  if (red != ops::Reduction::None && x->ctx().recording() && requires_grad(*x))
    return ce_index_with_grad(x, target, weight, ignore_index, eps, red, out_dtype);
  Context& ctx = x->ctx();
  int64_t M = x->shape[0], C = x->shape[1];
  DType T = x->dtype, A = acc_of(T), I = target->dtype;
  Tensor wsum = weight ? ops::sum_as(weight, {}, false, A) : nullptr;
  Tensor loss = make_tensor(ctx, {M}, A), wrow = make_tensor(ctx, {M}, A), lse = make_tensor(ctx, {M}, A);
  if (M > 0) {
    const RowPlan p = plan_ce(ctx, RowOp::CrossEntropyRows, M, C, T, {x->data()});
    uint32_t src = 0;
    CUdeviceptr rec = ctx.device_error_record("cross_entropy: target index", &src);
    CUdeviceptr px = x->data(), pt = target->data(), pw = weight ? weight->data() : 0, ps = wsum ? wsum->data() : 0;
    CUdeviceptr pl = loss->data(), pr = wrow->data(), pe = lse->data();
    void* args[] = {&px, &pt, &pw, &ps, &M, &C, &ignore_index, &eps, &pl, &pr, &pe, &rec, &src};
    launch_row_plan(ctx, ctx.function(index_key(kCeIndexFwd, p, !weight && eps == 0.0, T, I, A)), p, args);
  }
  Tensor denom = red == ops::Reduction::Mean ? ops::sum_as(wrow, {}, false, A) : nullptr;
  Tensor out = finish(loss, red, denom, out_dtype);
  if (auto node = record(OpId::CrossEntropy, {x}, {out})) {
    node->saved.emplace_back(x, false);
    node->saved.emplace_back(target, false);
    node->saved.emplace_back(lse, false);
    node->saved.emplace_back(wrow, false);
    if (denom) node->saved.emplace_back(denom, false);
    save_common(*node, weight, wsum, ignore_index, red, C, eps);
  }
  return out;
}

Tensor ce_probs(const Tensor& x, const Tensor& target, const Tensor& weight, double eps, ops::Reduction red) {
  Context& ctx = x->ctx();
  int64_t M = x->shape[0], C = x->shape[1];
  DType T = x->dtype, A = acc_of(T);
  Tensor wsum = weight ? ops::sum_as(weight, {}, false, A) : nullptr;
  Tensor loss = make_tensor(ctx, {M}, A), rowt = make_tensor(ctx, {M}, A), lse = make_tensor(ctx, {M}, A);
  if (M > 0) {
    const RowPlan p = plan_ce(ctx, RowOp::CrossEntropyRows, M, C, T, {x->data(), target->data()});
    CUdeviceptr px = x->data(), pt = target->data(), pw = weight ? weight->data() : 0, ps = wsum ? wsum->data() : 0;
    CUdeviceptr pl = loss->data(), pr = rowt->data(), pe = lse->data();
    void* args[] = {&px, &pt, &pw, &ps, &M, &C, &eps, &pl, &pr, &pe};
    launch_row_plan(ctx, ctx.function(row_key(kCeProbFwd, p, T, A)), p, args);
  }
  Tensor out = finish(loss, red, nullptr, T);
  if (auto node = record(OpId::CrossEntropyProbs, {x, target}, {out})) {
    node->saved.emplace_back(x, false);
    node->saved.emplace_back(target, false);
    node->saved.emplace_back(lse, false);
    node->saved.emplace_back(rowt, false);
    save_common(*node, weight, wsum, 0, red, C, eps);
  }
  return out;
}

// g as the kernels read it: the output dtype, and the element stride between rows (0 for a 0-d g).
Tensor grad_in(const Tensor& g, DType t, int64_t* stride) {
  Tensor r = g->dtype == t ? g : ops::to_dtype(g, t);
  *stride = r->ndim() == 0 ? 0 : r->strides[0];
  return r;
}

// ---- the compositions ----

Tensor reduce_loss(const Tensor& l, ops::Reduction r) {
  switch (r) {
    case ops::Reduction::None: return l;
    case ops::Reduction::Sum: return ops::sum(l, {}, false);
    case ops::Reduction::Mean: return ops::mean(l, {}, false);
  }
  fail(FLAME_ERROR_INVALID_ARGUMENT, "invalid reduction");
}

// input and target of an elementwise loss, checked and brought to the compute dtype; *out_dtype is
// the dtype of the result.
std::pair<Tensor, Tensor> loss_operands(const char* op, const Tensor& a, const Tensor& b, DType* out_dtype) {
  ops::check_loss_pair(op, a, b);
  *out_dtype = promote(a->dtype, b->dtype);
  DType cd = wide(*out_dtype);
  return {ops::to_dtype(a, cd), ops::to_dtype(b, cd)};
}

Tensor like(const Tensor& t, double v) { return ops::scalar(t->ctx(), v, t->dtype); }

}  // namespace

// ---------------------------------------------------------------- cross_entropy and nll_loss

Tensor ops::cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& weight, int64_t ignore_index,
                          double label_smoothing, Reduction reduction, bool f32_loss) {
  const char* op = "cross_entropy";
  FLAME_CHECK(&logits->ctx() == &target->ctx() && (!weight || &weight->ctx() == &logits->ctx()), FLAME_ERROR_INVALID_ARGUMENT,
              op, ": tensors belong to different contexts");
  FLAME_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, FLAME_ERROR_INVALID_ARGUMENT, op,
              ": label_smoothing must be in [0, 1], got ", label_smoothing);
  int64_t C = 0;
  Shape index_shape;
  class_geometry(op, logits, &C, &index_shape);
  FLAME_CHECK(C <= kMaxClasses, FLAME_ERROR_SHAPE_MISMATCH, op, ": input has ", C, " classes; at most ", kMaxClasses,
              " are supported (the kernels index within a row in 32 bits)");
  Tensor w = weight_acc(op, weight, C, acc_of(logits->dtype));
  if (is_floating(target->dtype)) {  // class probabilities, shaped like the logits
    FLAME_CHECK(target->shape == logits->shape, FLAME_ERROR_SHAPE_MISMATCH, op, ": class-probability target has shape ",
                shape_str(target->shape), " but the input has shape ", shape_str(logits->shape));
    Tensor x = f32_loss ? to_dtype(logits, acc_of(logits->dtype)) : logits;  // the probabilities kernels: one dtype
    Tensor out = ce_probs(as_rows(x, C, true), as_rows(to_dtype(target, x->dtype), C, true), w, label_smoothing,
                          reduction);
    return reduction == Reduction::None ? reshape(out, index_shape) : out;
  }
  check_index_target(op, target, index_shape);
  Tensor t = contiguous(reshape(alias(target), {target->numel()}));
  const DType out_dtype = f32_loss ? acc_of(logits->dtype) : logits->dtype;
  Tensor out = ce_index(as_rows(logits, C, true), t, w, ignore_index, label_smoothing, reduction, out_dtype);
  return reduction == Reduction::None ? reshape(out, index_shape) : out;
}

Tensor ops::nll_loss(const Tensor& log_probs, const Tensor& target, const Tensor& weight, int64_t ignore_index,
                     Reduction reduction) {
  const char* op = "nll_loss";
  FLAME_CHECK(&log_probs->ctx() == &target->ctx() && (!weight || &weight->ctx() == &log_probs->ctx()),
              FLAME_ERROR_INVALID_ARGUMENT, op, ": tensors belong to different contexts");
  int64_t C = 0;
  Shape index_shape;
  class_geometry(op, log_probs, &C, &index_shape);
  check_index_target(op, target, index_shape);
  Context& ctx = log_probs->ctx();
  DType T = log_probs->dtype, A = acc_of(T), I = target->dtype;
  Tensor w = weight_acc(op, weight, C, A);
  Tensor x = as_rows(log_probs, C, false);  // only M elements are read: any strides will do
  Tensor t = contiguous(reshape(alias(target), {target->numel()}));
  int64_t M = x->shape[0];
  Tensor loss = make_tensor(ctx, {M}, A), wrow = make_tensor(ctx, {M}, A);
  if (M > 0) {
    uint32_t src = 0;
    CUdeviceptr rec = ctx.device_error_record("nll_loss: target index", &src);
    CUdeviceptr px = x->data(), pt = t->data(), pw = w ? w->data() : 0, pl = loss->data(), pr = wrow->data();
    int64_t rs = x->strides[0], cs = x->strides[1];
    void* args[] = {&px, &rs, &cs, &pt, &pw, &M, &C, &ignore_index, &pl, &pr, &rec, &src};
    ctx.launch(ctx.function(nll_key(kNllFwd, T, I)), flat_grid(ctx, M), 256, args);
  }
  Tensor denom = reduction == Reduction::Mean ? sum_as(wrow, {}, false, A) : nullptr;
  Tensor out = finish(loss, reduction, denom, T);
  if (auto node = record(OpId::NllLoss, {x}, {out})) {
    node->saved.emplace_back(t, false);
    node->saved.emplace_back(wrow, false);
    if (denom) node->saved.emplace_back(denom, false);
    save_common(*node, nullptr, nullptr, ignore_index, reduction, C, 0.0);
  }
  return reduction == Reduction::None ? reshape(out, index_shape) : out;
}

ops::LossSaved ops::unpack_loss(Node& n) {
  LossSaved s;
  auto next = [&n, i = size_t{0}]() mutable { return n.saved.at(i++).unpack(n); };
  const LossAttrs& a = n.attrs<LossAttrs>();
  s.ignore_index = a.ignore_index;
  s.reduction = a.reduction;
  s.classes = a.classes;
  s.eps = a.eps;
  bool mean = s.reduction == Reduction::Mean;
  switch (n.op) {
    case OpId::CrossEntropy:
      s.x = next(); s.target = next(); s.lse = next(); s.wrow = next();
      if (mean) s.denom = next();
      break;
    case OpId::CrossEntropyProbs:
      s.x = next(); s.target = next(); s.lse = next(); s.rowt = next();
      break;
    case OpId::NllLoss:
      s.target = next(); s.wrow = next();
      if (mean) s.denom = next();
      break;
    default:
      fail(FLAME_ERROR_INTERNAL, "unpack_loss: ", op_name(n.op), " is not a loss");
  }
  if (a.has_weight) {
    s.weight = next();
    s.wsum = next();
  }
  if (a.saved_grad) s.grad = next();
  return s;
}

Tensor ops::cross_entropy_backward(const LossSaved& s, const Tensor& g0) {
  const Tensor& x = s.x;
  Context& ctx = x->ctx();
  int64_t M = x->shape[0], C = x->shape[1], gs = 0;
  DType T = x->dtype, A = acc_of(T), I = s.target->dtype;
  Tensor g = grad_in(g0, A, &gs);  // read in f32: an f32 loss of bf16 logits (autocast) keeps its gradient's digits
  Tensor grad = make_tensor(ctx, {M, C}, T);
  if (M == 0) return grad;
  const RowPlan p = plan_ce(ctx, RowOp::CrossEntropyRows, M, C, T, {x->data(), grad->data()});
  uint32_t src = 0;
  CUdeviceptr rec = ctx.device_error_record("cross_entropy: target index", &src);
  CUdeviceptr px = x->data(), pt = s.target->data(), pw = s.weight ? s.weight->data() : 0, ps = s.wsum ? s.wsum->data() : 0;
  CUdeviceptr pe = s.lse->data(), pg = g->data(), pd = s.denom ? s.denom->data() : 0, po = grad->data();
  double scale = 1.0, eps = s.eps;
  int64_t ignore = s.ignore_index;
  void* args[] = {&px, &pt, &pw, &ps, &pe, &pg, &gs, &pd, &scale, &M, &C, &ignore, &eps, &po, &rec, &src};
  launch_row_plan(ctx, ctx.function(index_key(kCeIndexBwd, p, !s.weight && eps == 0.0, T, I, A)), p, args);
  return grad;
}

Tensor ops::cross_entropy_probs_backward(const LossSaved& s, const Tensor& g0) {
  const Tensor& x = s.x;
  Context& ctx = x->ctx();
  int64_t M = x->shape[0], C = x->shape[1], gs = 0;
  DType T = x->dtype, A = acc_of(T);
  Tensor g = grad_in(g0, T, &gs);
  Tensor grad = make_tensor(ctx, {M, C}, T);
  if (M == 0) return grad;
  Tensor t = contiguous(alias(s.target));
  const RowPlan p = plan_ce(ctx, RowOp::CrossEntropyRows, M, C, T, {x->data(), t->data(), grad->data()});
  CUdeviceptr px = x->data(), pt = t->data(), pw = s.weight ? s.weight->data() : 0, pe = s.lse->data();
  CUdeviceptr pr = s.rowt->data(), pg = g->data(), po = grad->data();
  double scale = s.reduction == Reduction::Mean ? 1.0 / static_cast<double>(M) : 1.0, eps = s.eps;
  void* args[] = {&px, &pt, &pw, &pe, &pr, &pg, &gs, &scale, &M, &C, &eps, &po};
  launch_row_plan(ctx, ctx.function(row_key(kCeProbBwd, p, T, A)), p, args);
  return grad;
}

Tensor ops::nll_loss_backward(const LossSaved& s, const Tensor& g0, DType T) {
  Context& ctx = s.target->ctx();
  int64_t M = s.target->shape[0], C = s.classes, gs = 0;
  DType I = s.target->dtype;
  Tensor g = grad_in(g0, T, &gs);
  Tensor grad = make_tensor(ctx, {M, C}, T);
  if (M == 0) return grad;
  CUdeviceptr pt = s.target->data(), pr = s.wrow->data(), pg = g->data(), pd = s.denom ? s.denom->data() : 0;
  CUdeviceptr po = grad->data();
  int64_t ignore = s.ignore_index;
  void* args[] = {&pt, &pr, &pg, &gs, &pd, &M, &C, &ignore, &po};
  ctx.launch(ctx.function(nll_key(kNllBwd, T, I)), flat_grid(ctx, M * C), 256, args);
  return grad;
}

std::vector<std::string> ops::loss_instantiations() {
  std::vector<std::string> v;
  const DType floats[] = {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_F64};
  const DType indices[] = {FLAME_DTYPE_I64, FLAME_DTYPE_I32};
  for (DType t : floats) {
    DType a = acc_of(t);
    for (int width : {full_width(t), 1})
      for (bool warp : {true, false}) {
        for (const DType& i : indices) {
          for (bool plain : {false, true}) {
            v.push_back(kernel_name(index_key(kCeIndexFwd, width, warp, plain, t, i, a)));
            v.push_back(kernel_name(index_key(kCeIndexBwd, width, warp, plain, t, i, a)));
            v.push_back(kernel_name(index_key(kCeIndexFwdGrad, width, warp, plain, t, i, a)));
          }
        }
        v.push_back(kernel_name(row_key(kCeProbFwd, width, warp, t, a)));
        v.push_back(kernel_name(row_key(kCeProbBwd, width, warp, t, a)));
      }
    for (DType i : indices) {
      v.push_back(kernel_name(nll_key(kNllFwd, t, i)));
      v.push_back(kernel_name(nll_key(kNllBwd, t, i)));
    }
    if (t != FLAME_DTYPE_F64)
      for (const DType& i : indices)
        for (bool plain : {false, true})
          for (const CeRing& g : kCeRings) v.push_back(kernel_name(make_key(kCeIndexFwdGradRing, plain, t, i, g.slots, g.groups)));
    if (t == acc_of(t))  // once per accumulation dtype: its types are (index, accumulation)
      for (DType i : indices) v.push_back(kernel_name(make_key(kCeTargetWeight, i, t)));
  }
  return v;
}

// ---------------------------------------------------------------- compositions

void ops::check_loss_pair(const char* op, const Tensor& a, const Tensor& b) {
  FLAME_CHECK(&a->ctx() == &b->ctx(), FLAME_ERROR_INVALID_ARGUMENT, op, ": input and target belong to different contexts");
  FLAME_CHECK(is_floating(a->dtype) && is_floating(b->dtype), FLAME_ERROR_DTYPE_MISMATCH, op,
              ": input and target must be floating, got ", dtype_name(a->dtype), " and ", dtype_name(b->dtype));
  FLAME_CHECK(a->shape == b->shape, FLAME_ERROR_SHAPE_MISMATCH, op, ": input has shape ", shape_str(a->shape),
              " but target has shape ", shape_str(b->shape), " (they must match; expand the target explicitly to broadcast)");
}

// 0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta (beta 0: l1).
Tensor ops::smooth_l1_loss(const Tensor& input, const Tensor& target, double beta, Reduction reduction) {
  FLAME_CHECK(std::isfinite(beta) && beta >= 0, FLAME_ERROR_INVALID_ARGUMENT, "smooth_l1_loss: beta must be finite and >= 0, got ",
              beta);
  DType out = input->dtype;
  auto [a, b] = loss_operands("smooth_l1_loss", input, target, &out);
  Tensor d = sub(a, b), ad = abs(d);
  Tensor l = beta == 0 ? ad
                       : where(binary(OpId::Lt, ad, like(ad, beta)), mul_scalar(square(d), 0.5 / beta), add_scalar(ad, -0.5 * beta));
  return to_dtype(reduce_loss(l, reduction), out);
}

// 0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta).
Tensor ops::huber_loss(const Tensor& input, const Tensor& target, double delta, Reduction reduction) {
  FLAME_CHECK(std::isfinite(delta) && delta > 0, FLAME_ERROR_INVALID_ARGUMENT, "huber_loss: delta must be finite and > 0, got ",
              delta);
  DType out = input->dtype;
  auto [a, b] = loss_operands("huber_loss", input, target, &out);
  Tensor d = sub(a, b), ad = abs(d);
  Tensor l = where(binary(OpId::Lt, ad, like(ad, delta)), mul_scalar(square(d), 0.5), mul_scalar(add_scalar(ad, -0.5 * delta), delta));
  return to_dtype(reduce_loss(l, reduction), out);
}

// (1 - y) x + (1 + (pos_weight - 1) y) softplus(-x), times weight. softplus(-x) = -log(sigmoid(x)),
// computed without overflow, and its derivative -sigmoid(-x) is right at x = 0 too.
Tensor ops::binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target, const Tensor& weight,
                                             const Tensor& pos_weight, Reduction reduction) {
  const char* op = "binary_cross_entropy_with_logits";
  DType out = logits->dtype;
  auto [x, y] = loss_operands(op, logits, target, &out);
  const DType xd = x->dtype;  // C++17 lambdas cannot capture structured bindings (clang rejects it)
  auto operand = [&](const Tensor& w, const char* name) -> Tensor {
    if (!w) return nullptr;
    FLAME_CHECK(&w->ctx() == &logits->ctx(), FLAME_ERROR_INVALID_ARGUMENT, op, ": ", name, " belongs to another context");
    FLAME_CHECK(is_floating(w->dtype), FLAME_ERROR_DTYPE_MISMATCH, op, ": ", name, " must be floating, got ", dtype_name(w->dtype));
    FLAME_CHECK(w->ndim() <= logits->ndim() && broadcast_shapes(logits->shape, w->shape) == logits->shape,
                FLAME_ERROR_SHAPE_MISMATCH, op, ": ", name, " of shape ", shape_str(w->shape),
                " does not broadcast to the input's shape ", shape_str(logits->shape));
    return to_dtype(w, xd);
  };
  Tensor w = operand(weight, "weight"), pw = operand(pos_weight, "pos_weight");
  Tensor sp = unary(OpId::Softplus, neg(x), 1.0, 20.0);
  Tensor l = add(mul(unary(OpId::RsubScalar, y, 1.0), x), pw ? mul(add_scalar(mul(add_scalar(pw, -1.0), y), 1.0), sp) : sp);
  if (w) l = mul(l, w);
  return to_dtype(reduce_loss(l, reduction), out);
}

}  // namespace flame

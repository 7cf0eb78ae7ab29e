// mse_loss and l1_loss. With reduction mean or sum each is one graph node (MseLoss / L1Loss) over
// (input, target) with fused kernels (cuda/loss_pointwise.cuh): the forward reads both operands in
// their own dtypes (no casts, no f32 copies) in one reduction pass of block partials plus a one-block
// pass that sums them in a fixed order and scales (deterministic, no atomics); the backward rule
// (autograd/backward_rules.cpp) runs one elementwise kernel that writes the input's gradient and,
// where asked, the target's (its negation) directly in each operand's dtype, or composes the same
// formula of FLAME ops when a graph of the backward is being built.
// f16/bf16 compute in f32 and f64 in f64 (either operand f64); the loss has dtype
// promote(input, target). Non-contiguous operands are copied first (recorded, so their gradients
// flow back through the copy). Reduction none stays a composition: it is elementwise already.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include "core/error.h"
#include "ops/launch.h"
#include "ops/loss.h"
#include "ops/ops.h"

namespace flame {

namespace {

using ops::Reduction;

DType acc_of(DType d) { return d == FLAME_DTYPE_F64 ? FLAME_DTYPE_F64 : FLAME_DTYPE_F32; }
DType wide(DType d) { return (d == FLAME_DTYPE_F16 || d == FLAME_DTYPE_BF16) ? FLAME_DTYPE_F32 : d; }

using K = TArg;
// <kind (0 mse, 1 l1), V, input type, target type, accumulation type>
constexpr KernelTemplate kPartial{"loss_pointwise.cuh", "flame::pwl_partial", {K::Int, K::Int, K::Dtype, K::Dtype, K::Dtype}};
// <accumulation type, loss type>
constexpr KernelTemplate kFinal{"loss_pointwise.cuh", "flame::pwl_final", {K::Dtype, K::Dtype}};
// <kind, V, input type, target type, loss type>
constexpr KernelTemplate kBackward{"loss_pointwise.cuh", "flame::pwl_backward", {K::Int, K::Int, K::Dtype, K::Dtype, K::Dtype}};

constexpr unsigned kBlock = 256;  // threads of pwl_partial (its launch bound), pwl_final and pwl_backward

int kind_of(OpId op) { return op == OpId::MseLoss ? 0 : 1; }
const char* name_of(OpId op) { return op == OpId::MseLoss ? "mse_loss" : "l1_loss"; }

// Elements per access: 16 bytes of the narrower operand, at most 32 bytes (two accesses) of the wider.
int full_width(DType a, DType b) {
  const int lo = static_cast<int>(std::min(dtype_size(a), dtype_size(b))), hi = static_cast<int>(std::max(dtype_size(a), dtype_size(b)));
  return std::min(16 / lo, 32 / hi);
}
// full_width when every tensor starts on a boundary of that many of its elements, else 1.
int width_for(DType a, DType b, std::initializer_list<const Tensor*> ts) {
  const int v = full_width(a, b);
  for (const Tensor* t : ts)
    if (*t && (*t)->data() % (static_cast<CUdeviceptr>(v) * (*t)->elem_size()) != 0) return 1;
  return v;
}

// The factor of g in the gradient: mse's 2, and 1/N for mean (NaN for N = 0, as PyTorch's mean).
double grad_scale(OpId op, Reduction red, int64_t n) {
  double s = op == OpId::MseLoss ? 2.0 : 1.0;
  if (red == Reduction::Mean) s = n ? s / static_cast<double>(n) : std::nan("");
  return s;
}

Tensor fused_forward(OpId op, const Tensor& input, const Tensor& target, Reduction red) {
  Context& ctx = input->ctx();
  Tensor a = ops::contiguous(input), b = ops::contiguous(target);
  const DType R = promote(a->dtype, b->dtype), A = acc_of(R);
  const int kind = kind_of(op);
  const int64_t n = a->numel();
  Tensor out = make_tensor(ctx, {}, R);
  // Chunks of >= 8192 elements, at most 4 blocks per SM: one wave of short-lived blocks.
  const int v = width_for(a->dtype, b->dtype, {&a, &b});
  const int64_t sms = std::max(1, ctx.sm_count);
  int64_t chunks = std::max<int64_t>(1, std::min<int64_t>((n + 8191) / 8192, 4 * sms));
  const int64_t chunk_len = ((n + chunks - 1) / chunks + v - 1) / v * v;  // a multiple of v: chunks start aligned
  chunks = n ? (n + chunk_len - 1) / chunk_len : 0;
  Tensor partial = make_tensor(ctx, {std::max<int64_t>(chunks, 1)}, A);
  CUdeviceptr pa = a->data(), pb = b->data(), pp = partial->data(), po = out->data();
  int64_t nn = n, len = chunk_len;
  if (chunks > 0) {
    void* args[] = {&pa, &pb, &nn, &len, &pp};
    ctx.launch(ctx.function(make_key(kPartial, kind, v, a->dtype, b->dtype, A)), static_cast<unsigned>(chunks), kBlock, args);
  }
  double scale = red == Reduction::Mean ? (n ? 1.0 / static_cast<double>(n) : std::nan("")) : 1.0;
  void* fargs[] = {&pp, &chunks, &scale, &po};
  ctx.launch(ctx.function(make_key(kFinal, A, R)), 1, kBlock, fargs);
  if (auto node = record(op, {a, b}, {out})) {
    node->saved.emplace_back(a, false);
    node->saved.emplace_back(b, false);
    node->attributes = ops::PointwiseLossAttrs{red};
  }
  return out;
}

Tensor pointwise_loss(OpId op, const Tensor& input, const Tensor& target, Reduction red) {
  ops::check_loss_pair(name_of(op), input, target);
  if (red != Reduction::None) return fused_forward(op, input, target, red);
  const DType out = promote(input->dtype, target->dtype), cd = wide(out);
  Tensor d = ops::sub(ops::to_dtype(input, cd), ops::to_dtype(target, cd));
  return ops::to_dtype(op == OpId::MseLoss ? ops::square(d) : ops::abs(d), out);
}

}  // namespace

Tensor ops::mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  return pointwise_loss(OpId::MseLoss, input, target, reduction);
}

Tensor ops::l1_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  return pointwise_loss(OpId::L1Loss, input, target, reduction);
}

ops::PointwiseLossGrads ops::pointwise_loss_backward(OpId op, const Tensor& a, const Tensor& b, const Tensor& g0,
                                                     Reduction reduction, bool need_input, bool need_target) {
  Context& ctx = a->ctx();
  const DType R = promote(a->dtype, b->dtype);
  Tensor g = g0->dtype == R ? g0 : to_dtype(g0, R);  // the engine hands the output's dtype; others are cast
  PointwiseLossGrads r;
  if (need_input) r.input = make_tensor(ctx, a->shape, a->dtype);
  if (need_target) r.target = make_tensor(ctx, b->shape, b->dtype);
  int64_t n = a->numel();
  if (n == 0 || (!need_input && !need_target)) return r;
  Tensor sa = contiguous(a), sb = contiguous(b);  // saved contiguous: no copy
  const int v = width_for(sa->dtype, sb->dtype, {&sa, &sb, &r.input, &r.target});
  CUdeviceptr pa = sa->data(), pb = sb->data(), pg = g->data();
  CUdeviceptr pi = r.input ? r.input->data() : 0, pt = r.target ? r.target->data() : 0;
  double scale = grad_scale(op, reduction, n);
  void* args[] = {&pa, &pb, &pg, &scale, &n, &pi, &pt};
  // Two vectors per thread, the grid not capped (as launch_elementwise's dense kernels).
  const int64_t nvec = (n + v - 1) / v;
  const unsigned grid = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((nvec + 2 * kBlock - 1) / (2 * kBlock), 0x7fffffff)));
  ctx.launch(ctx.function(make_key(kBackward, kind_of(op), v, sa->dtype, sb->dtype, R)), grid, kBlock, args);
  return r;
}

std::vector<std::string> ops::pointwise_loss_instantiations() {
  std::vector<std::string> names;
  const DType floats[] = {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_F64};
  for (DType ta : floats)
    for (DType tb : floats) {
      const DType r = promote(ta, tb);
      for (int kind : {0, 1})
        for (int v : {full_width(ta, tb), 1}) {
          names.push_back(kernel_name(make_key(kPartial, kind, v, ta, tb, acc_of(r))));
          names.push_back(kernel_name(make_key(kBackward, kind, v, ta, tb, r)));
        }
    }
  for (DType r : floats) names.push_back(kernel_name(make_key(kFinal, acc_of(r), r)));
  return names;
}

}  // namespace flame

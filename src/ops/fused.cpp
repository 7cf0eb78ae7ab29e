// Fused elementwise functions: the call (promotion, broadcasting, one kernel, one node), the kernel
// choice (dense, rows, strided; with launch_elementwise's geometry and layout planners of
// ops/launch.h) and the derivative functions kept per input.
#include "ops/fused.h"
#include <cstddef>
#include "core/error.h"
#include "ops/launch.h"
#include "ops/ops.h"

namespace flame::ops {

namespace {

struct FusedPtrs {  // mirrors cuda/fused.cuh
  CUdeviceptr in[kFusedMaxOperands];
};
using FusedRowsLayout = RowsLayout<kFusedMaxOperands>;        // mirrors cuda/fused.cuh
using FusedStridedLayout = StridedLayout<kFusedMaxOperands>;  // mirrors cuda/fused.cuh
static_assert(offsetof(FusedRowsLayout, rows) == 960 && offsetof(FusedRowsLayout, inner) == 976 &&
                  sizeof(FusedRowsLayout) == 1040 && sizeof(FusedStridedLayout) == 1160,
              "the layouts of cuda/fused.cuh");

// The kernels of cuda/fused.cuh: <V, T> and <T>.
constexpr KernelTemplate kContig{"fused.cuh", "flame::fused_contig", {TArg::Int, TArg::Dtype}};
constexpr KernelTemplate kRows{"fused.cuh", "flame::fused_rows", {TArg::Int, TArg::Dtype}};
constexpr KernelTemplate kStrided{"fused.cuh", "flame::fused_strided", {TArg::Dtype}};

}  // namespace

std::vector<std::string> fused_instantiations(DType d) {
  const int v = vector_width(d, {});  // one element type for every operand
  return {kernel_name(make_key(kContig, v, d)), kernel_name(make_key(kContig, 1, d)), kernel_name(make_key(kRows, v, d)),
          kernel_name(make_key(kStrided, d))};
}

std::shared_ptr<FusedFn> FusedFn::compile(Context& ctx, const std::string& text, int n_inputs) {
  FLAME_CHECK(n_inputs >= 1 && n_inputs <= kFusedMaxInputs, FLAME_ERROR_INVALID_ARGUMENT, "n_inputs ", n_inputs,
              " is not in [1, ", kFusedMaxInputs, "]");
  return std::make_shared<FusedFn>(ctx, fused::simplify(fused::parse(text, n_inputs)), n_inputs);
}

FusedFn::FusedFn(Context& ctx, fused::Expr e, int n_inputs)
    : ctx_(ctx.shared_from_this()), expr_(std::move(e)), n_(n_inputs), grads_(static_cast<size_t>(n_inputs)) {
  FLAME_CHECK(n_ >= 1 && n_ <= kFusedMaxOperands, FLAME_ERROR_UNSUPPORTED, "a fused kernel takes at most ",
              kFusedMaxOperands, " operands (this derivative needs ", n_, ")");
  source_ = fused::device_source(expr_, n_);
}

const FusedFn::Grad& FusedFn::grad(int i) {
  auto& slot = grads_.at(static_cast<size_t>(i));
  if (slot) return *slot;
  auto d = std::make_unique<Grad>();
  std::vector<int> shift(static_cast<size_t>(n_));
  for (int k = 0; k < n_; ++k) shift[static_cast<size_t>(k)] = k + 1;
  // g * d expr / d x_i over (g, x0, ...): simplify folds the 1s and 0s of the chain rule away.
  d->expr = fused::simplify(fused::binary(fused::Op::Mul, fused::input(0), fused::remap_inputs(fused::derivative(expr_, i), shift)));
  d->uses = fused::inputs_used(d->expr);
  for (int u : d->uses)
    if (u > 0) d->reads.push_back(u - 1);
  if (!d->uses.empty() && !fused::is_input(d->expr, 0)) {
    std::vector<int> compact(static_cast<size_t>(n_ + 1), -1);
    for (size_t k = 0; k < d->uses.size(); ++k) compact[static_cast<size_t>(d->uses[k])] = static_cast<int>(k);
    d->fn = std::make_shared<FusedFn>(*ctx_, fused::remap_inputs(d->expr, compact), static_cast<int>(d->uses.size()));
  }
  slot = std::move(d);
  return *slot;
}

Tensor FusedFn::input_grad(int i, const Tensor& g, const std::vector<Tensor>& xs) {
  const Grad& d = grad(i);
  if (d.uses.empty()) return zeros(g->ctx(), g->shape, g->dtype);  // expr does not depend on x_i
  if (!d.fn) return g;                                               // d expr / d x_i = 1
  std::vector<Tensor> operands;
  for (int u : d.uses) {
    const Tensor& t = u == 0 ? g : xs.at(static_cast<size_t>(u - 1));
    FLAME_CHECK(t, FLAME_ERROR_INTERNAL, "fused backward: operand ", u, " was not saved");
    operands.push_back(t);
  }
  return d.fn->call(operands);
}

std::vector<Tensor> FusedFn::node_backward(Node& n, const Tensor& g) {
  std::vector<Tensor> xs(n.next.size());
  const std::vector<size_t>& slots = n.attrs<FusedAttrs>().saved_inputs;
  for (size_t k = 0; k < n.saved.size(); ++k) xs[slots.at(k)] = n.saved[k].unpack(n);
  std::vector<Tensor> out(n.next.size());
  for (size_t i = 0; i < out.size(); ++i)
    if (n.needs_input_grad(i)) out[i] = input_grad(static_cast<int>(i), g, xs);
  return out;
}

Tensor FusedFn::call(const std::vector<Tensor>& in) {
  FLAME_CHECK(static_cast<int>(in.size()) == n_, FLAME_ERROR_INVALID_ARGUMENT, "the function takes ", n_,
              " inputs, got ", in.size());
  DType common = in[0]->dtype;
  Shape shape = in[0]->shape;
  for (size_t k = 0; k < in.size(); ++k) {
    FLAME_CHECK(&in[k]->ctx() == ctx_.get(), FLAME_ERROR_INVALID_ARGUMENT, "inputs[", k,
                "] belongs to a different context than the function");
    if (k) {
      common = promote(common, in[k]->dtype);
      shape = broadcast_shapes(shape, in[k]->shape);
    }
  }
  const DType cd = is_floating(common) ? common : FLAME_DTYPE_F32;  // integers and bool compute in f32
  std::vector<Tensor> ins;
  for (const Tensor& t0 : in) {
    Tensor t = t0->dtype == cd ? t0 : to_dtype(t0, cd);
    if (t->shape != shape) t = expand(t, shape);
    ins.push_back(t);
  }
  Tensor out = make_tensor(*ctx_, shape, cd);
  launch(out, ins);
  if (auto node = record(OpId::Fused, ins, {out})) {
    node->backward = [fn = shared_from_this()](Node& n, const std::vector<Tensor>& gs) {
      FLAME_CHECK(gs.size() == 1 && gs[0], FLAME_ERROR_INTERNAL, "fused backward without its output's gradient");
      return fn->node_backward(n, gs[0]);
    };
    std::vector<bool> keep(ins.size(), false);  // only what the needed derivatives read
    for (int i = 0; i < n_; ++i)
      if (node->needs_input_grad(static_cast<size_t>(i)))
        for (int r : grad(i).reads) keep[static_cast<size_t>(r)] = true;
    FusedAttrs attrs;
    for (size_t k = 0; k < ins.size(); ++k)
      if (keep[k]) {
        node->saved.emplace_back(ins[k], false);
        attrs.saved_inputs.push_back(k);
      }
    node->attributes = std::move(attrs);
  }
  return out;
}

CUfunction FusedFn::function(const KernelKey& key) {
  auto it = functions_.find(key);
  if (it != functions_.end()) return it->second;
  CUfunction f = ctx_->function_by_name(key.tmpl->file, kernel_name(key), source_);
  functions_.emplace(key, f);
  return f;
}

void FusedFn::launch(const Tensor& out, const std::vector<Tensor>& ins) {
  Context& ctx = *ctx_;
  int64_t n = out->numel();
  if (n == 0) return;
  const DType dt = out->dtype;
  FusedPtrs p{};
  for (size_t k = 0; k < ins.size(); ++k) p.in[k] = ins[k]->data();
  CUdeviceptr o = out->data();
  const int v = vector_width(dt, {});
  bool dense = out->contiguous();
  for (const Tensor& t : ins) dense = dense && t->contiguous();
  if (dense) {
    const int w = vectors_aligned(out, ins, v) ? v : 1;
    void* args[] = {&o, &n, &p};
    ctx.launch(function(make_key(kContig, w, dt)), grid_for(ctx, (n + w - 1) / w), kLaunchBlock, args);
    return;
  }
  std::vector<Strides> strides = {out->strides};
  for (const Tensor& t : ins) strides.push_back(t->strides);
  CollapsedLayout c = collapse(out->shape, strides);
  // A dense output whose operands are dense or broadcast along the last axis (x + bias, adaLN).
  FusedRowsLayout R;
  if (plan_rows_layout(out, ins, c, v, &R)) {
    void* args[] = {&o, &p, &R};
    ctx.launch(function(make_key(kRows, v, dt)), grid_for(ctx, R.rows * (R.cols / v)), kLaunchBlock, args);
    return;
  }
  FusedStridedLayout L = plan_strided_layout<kFusedMaxOperands>(c);
  void* args[] = {&o, &n, &p, &L};
  ctx.launch(function(make_key(kStrided, dt)), grid_for(ctx, n), kLaunchBlock, args);
}

}  // namespace flame::ops

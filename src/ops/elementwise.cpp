// Elementwise ops: dtype rules from the op list's Kind column, saved tensors from its Saves column,
// broadcasting through explicit Expand nodes and promotion through explicit Cast nodes (so that no
// backward rule has to undo either), one kernel launch, one recorded node.
#include <cmath>
#include "core/error.h"
#include "ops/launch.h"
#include "ops/ops.h"

namespace flame {

namespace {

enum class Kind { MATH, ARITH, PRED, ROUND, CMP };

struct OpInfo {
  const char* functor;
  Kind kind;
  bool saves_input, saves_output;  // the row's Saves column: what the backward rule reads
};

OpInfo info(OpId op) {
  switch (op) {
#define FLAME_INFO(Id, name, K, B, S) case OpId::Id: return {#Id, Kind::K, saves_input(op), saves_output(op)};
    FLAME_ELEMENTWISE_OPS(FLAME_INFO)
#undef FLAME_INFO
    default:
      fail(FLAME_ERROR_INTERNAL, "op ", op_name(op), " is not elementwise");
  }
}

// The dtype an op computes in for input dtype d.
DType compute_dtype(OpId op, Kind k, DType d) {
  switch (k) {
    case Kind::MATH: return is_floating(d) ? d : FLAME_DTYPE_F32;
    case Kind::ARITH: case Kind::ROUND:
      FLAME_CHECK(d != FLAME_DTYPE_BOOL, FLAME_ERROR_DTYPE_MISMATCH, op_name(op),
                  " does not take bool tensors (convert with flame_to_dtype first)");
      return d;
    case Kind::PRED: case Kind::CMP: return d;
  }
  return d;
}

}  // namespace

bool elementwise_signature(OpId op, DType in, DType* compute, DType* out) {
  OpInfo i = info(op);
  try {
    *compute = compute_dtype(op, i.kind, in);
  } catch (const Error&) {
    return false;
  }
  if ((i.kind == Kind::PRED && (op == OpId::IsNan || op == OpId::IsInf) && !is_floating(*compute)) ||
      (i.kind == Kind::ROUND && !is_floating(*compute)))
    return false;  // answered without a kernel
  *out = (i.kind == Kind::PRED || i.kind == Kind::CMP) ? FLAME_DTYPE_BOOL : *compute;
  return true;
}

const char* elementwise_functor(OpId op) { return info(op).functor; }

Tensor ops::mask_as(const Tensor& mask, const Tensor& like) { return to_dtype(mask, like->dtype); }

Tensor ops::unary(OpId op, const Tensor& x0, double s0, double s1) {
  OpInfo in = info(op);
  DType cd = compute_dtype(op, in.kind, x0->dtype);
  // Scalar ops on integer tensors with a fractional scalar compute in f32, as PyTorch.
  if (in.kind == Kind::ARITH && is_integral(cd) && s0 != std::floor(s0) &&
      (op == OpId::AddScalar || op == OpId::SubScalar || op == OpId::MulScalar || op == OpId::RsubScalar || op == OpId::PowScalar))
    cd = FLAME_DTYPE_F32;
  if (op == OpId::PowScalar && is_integral(cd) && s0 < 0) cd = FLAME_DTYPE_F32;
  Context& ctx = x0->ctx();
  if (in.kind == Kind::PRED && (op == OpId::IsNan || op == OpId::IsInf) && !is_floating(cd))
    return full(ctx, x0->shape, FLAME_DTYPE_BOOL, 0.0);  // integers are never NaN or infinite
  if (in.kind == Kind::ROUND && !is_floating(cd)) return alias(x0);  // integers are already whole
  Tensor x = x0->dtype == cd ? x0 : to_dtype(x0, cd);
  DType out_dtype = in.kind == Kind::PRED ? FLAME_DTYPE_BOOL : cd;
  Tensor out = make_tensor(ctx, x->shape, out_dtype);
  launch_elementwise(in.functor, {s0, s1, 0}, out, {x});
  if (auto node = record(op, {x}, {out})) {
    node->attributes = ops::UnaryScalars{s0, s1};
    if (in.saves_input) node->saved.emplace_back(x, false);
    if (in.saves_output) node->saved.emplace_back(out, true);
  }
  return out;
}

Tensor ops::binary(OpId op, const Tensor& a0, const Tensor& b0) {
  OpInfo in = info(op);
  FLAME_CHECK(&a0->ctx() == &b0->ctx(), FLAME_ERROR_INVALID_ARGUMENT, op_name(op), ": tensors belong to different contexts");
  DType common = promote(a0->dtype, b0->dtype);
  DType cd = in.kind == Kind::CMP ? common : compute_dtype(op, in.kind, common);
  if (op == OpId::LogicalAnd || op == OpId::LogicalOr) cd = common;
  Shape shape = broadcast_shapes(a0->shape, b0->shape);
  Tensor a = a0->dtype == cd ? a0 : to_dtype(a0, cd);
  Tensor b = b0->dtype == cd ? b0 : to_dtype(b0, cd);
  if (a->shape != shape) a = expand(a, shape);
  if (b->shape != shape) b = expand(b, shape);
  DType out_dtype = in.kind == Kind::CMP ? FLAME_DTYPE_BOOL : cd;
  Tensor out = make_tensor(a->ctx(), shape, out_dtype);
  launch_elementwise(in.functor, {}, out, {a, b});
  if (auto node = record(op, {a, b}, {out})) {
    if (in.saves_input) {
      // Mul's gradient for one input reads only the other: an operand is kept only while the other
      // input needs a gradient (x * a frozen scale saves the scale, not x), as PyTorch's MulBackward.
      const bool mul = op == OpId::Mul;
      if (!mul || node->needs_input_grad(1)) node->saved.emplace_back(a, false);
      else node->saved.emplace_back();
      if (!mul || node->needs_input_grad(0)) node->saved.emplace_back(b, false);
      else node->saved.emplace_back();
    }
    if (in.saves_output) node->saved.emplace_back(out, true);
  }
  return out;
}

Tensor ops::where(const Tensor& c0, const Tensor& a0, const Tensor& b0) {
  FLAME_CHECK(c0->dtype == FLAME_DTYPE_BOOL, FLAME_ERROR_DTYPE_MISMATCH, "where: the condition must be bool, got ",
              dtype_name(c0->dtype));
  FLAME_CHECK(&a0->ctx() == &b0->ctx() && &a0->ctx() == &c0->ctx(), FLAME_ERROR_INVALID_ARGUMENT,
              "where: tensors belong to different contexts");
  DType dt = promote(a0->dtype, b0->dtype);
  Shape shape = broadcast_shapes(broadcast_shapes(c0->shape, a0->shape), b0->shape);
  Tensor a = a0->dtype == dt ? a0 : to_dtype(a0, dt);
  Tensor b = b0->dtype == dt ? b0 : to_dtype(b0, dt);
  Tensor c = c0->shape == shape ? c0 : expand(c0, shape);
  if (a->shape != shape) a = expand(a, shape);
  if (b->shape != shape) b = expand(b, shape);
  Tensor out = make_tensor(a->ctx(), shape, dt);
  launch_elementwise("Where", {}, out, {c, a, b});
  if (auto node = record(OpId::Where, {a, b}, {out})) node->saved.emplace_back(c, false);
  return out;
}

Tensor ops::to_dtype(const Tensor& t, DType dtype) {
  FLAME_CHECK(dtype_valid(dtype), FLAME_ERROR_INVALID_ARGUMENT, "invalid dtype ", static_cast<int>(dtype));
  if (t->dtype == dtype) return t;
  Tensor out = make_tensor(t->ctx(), t->shape, dtype);
  DeviceWorkCounters& counted = t->ctx().drv.counters;
  const uint64_t launches_before = counted.launches;
  launch_elementwise("Identity", {}, out, {t});
  counted.cast_kernels += counted.launches - launches_before;
  record(OpId::Cast, {t}, {out});
  return out;
}

Tensor ops::contiguous(const Tensor& t) {
  if (t->contiguous()) return t;
  return clone(t);
}

Tensor ops::clone(const Tensor& t) {
  Tensor out = make_tensor(t->ctx(), t->shape, t->dtype);
  copy_into(out, t);
  record(OpId::Copy, {t}, {out});
  return out;
}

void ops::copy_into(const Tensor& dst, const Tensor& src) {
  FLAME_CHECK(dst->shape == src->shape, FLAME_ERROR_SHAPE_MISMATCH, "copy: shapes ", shape_str(dst->shape), " and ",
              shape_str(src->shape), " differ");
  Context& ctx = dst->ctx();
  if (dst->dtype == src->dtype && dst->contiguous() && src->contiguous()) {
    size_t bytes = static_cast<size_t>(dst->numel()) * dst->elem_size();
    if (bytes) ctx.check(ctx.drv.cuMemcpyDtoDAsync(dst->data(), src->data(), bytes, ctx.stream), "cuMemcpyDtoDAsync");
  } else {
    launch_elementwise("Identity", {}, dst, {src});
  }
  dst->storage->version++;
}

void ops::fill_(const Tensor& dst, double value) {
  Context& ctx = dst->ctx();
  if (value == 0.0 && dst->contiguous() && !std::signbit(value)) {
    size_t bytes = static_cast<size_t>(dst->numel()) * dst->elem_size();
    if (bytes) ctx.check(ctx.drv.cuMemsetD8Async(dst->data(), 0, bytes, ctx.stream), "cuMemsetD8Async");
  } else {
    launch_elementwise("Fill", {value}, dst, {});
  }
  dst->storage->version++;
}

}  // namespace flame

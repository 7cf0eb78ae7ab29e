// GEGLU, adaLN modulation and the SiLU-gated MLP: compositions of recorded FLAME ops (views,
// elementwise ops, linear), with no kernel and no graph node of their own, so they are
// differentiable, to any order, through their parts.
#include "core/error.h"
#include "ops/nnops.h"
#include "ops/ops.h"

namespace flame {

namespace {

void check_float(const char* op, const char* name, const Tensor& t) {
  FLAME_CHECK(is_floating(t->dtype), FLAME_ERROR_DTYPE_MISMATCH, op, ": ", name, " must be floating, got ", dtype_name(t->dtype));
}

// p (a parameter of x's op): same context and dtype as x, the given shape.
void check_like(const char* op, const char* name, const Tensor& p, const Tensor& x, const Shape& want) {
  FLAME_CHECK(&p->ctx() == &x->ctx(), FLAME_ERROR_INVALID_ARGUMENT, op, ": ", name, " belongs to another context");
  FLAME_CHECK(p->dtype == x->dtype, FLAME_ERROR_DTYPE_MISMATCH, op, ": ", name, " has dtype ", dtype_name(p->dtype),
              " but x has ", dtype_name(x->dtype));
  FLAME_CHECK(p->shape == want, FLAME_ERROR_SHAPE_MISMATCH, op, ": ", name, " has shape ", shape_str(p->shape), ", expected ",
              shape_str(want));
}

}  // namespace

Tensor ops::geglu(const Tensor& x, bool tanh_approx) {
  const char* op = "geglu";
  check_float(op, "x", x);
  FLAME_CHECK(x->ndim() >= 1 && x->shape.back() % 2 == 0, FLAME_ERROR_SHAPE_MISMATCH, op,
              ": the last dim of x must have an even size (value and gate halves), got shape ", shape_str(x->shape));
  const int64_t h = x->shape.back() / 2;
  const int last = x->ndim() - 1;
  return mul(narrow(x, last, 0, h), unary(tanh_approx ? OpId::GeluTanh : OpId::Gelu, narrow(x, last, h, h)));
}

Tensor ops::adaln_modulate(const Tensor& x, const Tensor& shift, const Tensor& scale) {
  const char* op = "adaln_modulate";
  check_float(op, "x", x);
  FLAME_CHECK(x->ndim() >= 2, FLAME_ERROR_SHAPE_MISMATCH, op, ": x must be [N, ..., C], got shape ", shape_str(x->shape));
  const int nd = x->ndim();
  const int64_t N = x->shape[0], C = x->shape.back();
  if (shift) check_like(op, "shift", shift, x, {N, C});
  if (scale) check_like(op, "scale", scale, x, {N, C});
  Shape per_sample(static_cast<size_t>(nd), 1);  // [N, 1, ..., 1, C]: broadcast over the middle dims
  per_sample.front() = N;
  per_sample.back() = C;
  Tensor y = x;
  if (scale) y = mul(y, add_scalar(reshape(scale, per_sample), 1.0));
  if (shift) y = add(y, reshape(shift, per_sample));
  return scale || shift ? y : clone(x);
}

Tensor ops::swiglu_mlp(const Tensor& x, const Tensor& w1, const Tensor& w3, const Tensor& w2) {
  const char* op = "swiglu_mlp";
  check_float(op, "x", x);
  FLAME_CHECK(x->ndim() >= 1, FLAME_ERROR_SHAPE_MISMATCH, op, ": x must be [..., in], got a 0-d tensor");
  FLAME_CHECK(w1->ndim() == 2, FLAME_ERROR_SHAPE_MISMATCH, op, ": w1 must be [hidden, in], got shape ", shape_str(w1->shape));
  const int64_t in = x->shape.back(), hidden = w1->shape[0];
  check_like(op, "w1", w1, x, {hidden, in});
  check_like(op, "w3", w3, x, {hidden, in});
  FLAME_CHECK(w2->ndim() == 2, FLAME_ERROR_SHAPE_MISMATCH, op, ": w2 must be [out, hidden], got shape ", shape_str(w2->shape));
  check_like(op, "w2", w2, x, {w2->shape[0], hidden});
  Tensor gate = unary(OpId::Silu, linear(x, w1, nullptr, Activation::None));
  return linear(mul(gate, linear(x, w3, nullptr, Activation::None)), w2, nullptr, Activation::None);
}

}  // namespace flame

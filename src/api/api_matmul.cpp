// C entry points of the matrix products (ops/matmul.cpp).
#include "api/autocast.h"
#include "api/guard.h"
#include "ops/ops.h"

using namespace flame;

namespace {

template <class F>
flame_status_t product(const char* fn, flame_tensor_t a, flame_tensor_t b, flame_tensor_t* out, F&& f) {
  return api_call(fn, [&] {
    out_param(out, "out");
    const Tensor& x = unwrap(a, "a");
    const Tensor& y = unwrap(b, "b");
    FLAME_CHECK(&x->ctx() == &y->ctx(), FLAME_ERROR_INVALID_ARGUMENT, "a and b belong to different contexts");
    TensorScope s(x);
    *out = wrap(f(autocast_low(x), autocast_low(y)));
  });
}

}  // namespace

extern "C" {

FLAME_API flame_status_t flame_matmul(flame_tensor_t a, flame_tensor_t b, flame_tensor_t* out) {
  return product("flame_matmul", a, b, out, [](const Tensor& x, const Tensor& y) { return ops::matmul(x, y); });
}

FLAME_API flame_status_t flame_bmm(flame_tensor_t a, flame_tensor_t b, flame_tensor_t* out) {
  return product("flame_bmm", a, b, out, [](const Tensor& x, const Tensor& y) { return ops::bmm(x, y); });
}

FLAME_API flame_status_t flame_linear(flame_tensor_t x, flame_tensor_t weight, flame_tensor_t bias, int32_t activation,
                                      flame_tensor_t* out) {
  return api_call("flame_linear", [&] {
    out_param(out, "out");
    const Tensor& xt = unwrap(x, "x");
    const Tensor& wt = unwrap(weight, "weight");
    Tensor bt = bias ? unwrap(bias, "bias") : Tensor();
    FLAME_CHECK(activation >= FLAME_ACTIVATION_NONE && activation <= FLAME_ACTIVATION_GELU_TANH,
                FLAME_ERROR_INVALID_ARGUMENT, "activation ", activation, " is not a flame_activation_t value");
    FLAME_CHECK(&xt->ctx() == &wt->ctx() && (!bt || &bt->ctx() == &xt->ctx()), FLAME_ERROR_INVALID_ARGUMENT,
                "x, weight and bias belong to different contexts");
    TensorScope s(xt);
    *out = wrap(ops::linear(autocast_low(xt), autocast_low(wt), autocast_low(bt), static_cast<ops::Activation>(activation)));
  });
}

}  // extern "C"

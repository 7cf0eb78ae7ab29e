// C entry points of the matrix products (ops/matmul.cpp).
#include "api/autocast.h"
#include "api/guard.h"
#include "ops/ops.h"

using namespace flame;

extern "C" {

FLAME_API flame_status_t flame_matmul(flame_tensor_t a, flame_tensor_t b, flame_tensor_t* out) {
  return tensor_op("flame_matmul", {{a, "a"}, {b, "b"}}, out,
                   [](const Tensor& x, const Tensor& y) { return ops::matmul(autocast_low(x), autocast_low(y)); });
}

FLAME_API flame_status_t flame_bmm(flame_tensor_t a, flame_tensor_t b, flame_tensor_t* out) {
  return tensor_op("flame_bmm", {{a, "a"}, {b, "b"}}, out,
                   [](const Tensor& x, const Tensor& y) { return ops::bmm(autocast_low(x), autocast_low(y)); });
}

FLAME_API flame_status_t flame_linear(flame_tensor_t x, flame_tensor_t weight, flame_tensor_t bias, int32_t activation,
                                      flame_tensor_t* out) {
  return tensor_op("flame_linear", {{x, "x"}, {weight, "weight"}, {bias, "bias", true}}, out,
                   [&](const Tensor& xt, const Tensor& wt, const Tensor& bt) {
                     FLAME_CHECK(activation >= FLAME_ACTIVATION_NONE && activation <= FLAME_ACTIVATION_GELU_TANH,
                                 FLAME_ERROR_INVALID_ARGUMENT, "activation ", activation, " is not a flame_activation_t value");
                     return ops::linear(autocast_low(xt), autocast_low(wt), autocast_low(bt),
                                        static_cast<ops::Activation>(activation));
                   });
}

}  // extern "C"

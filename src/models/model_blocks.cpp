// Shared building blocks of the architectures (model_blocks.h).
#include "models/model_blocks.h"
#include "core/error.h"
#include "ops/ops.h"

namespace flame::models {

Tensor split_heads(const Tensor& x, int64_t heads) {
  FLAME_CHECK(x->ndim() == 3 && heads > 0 && x->shape[2] % heads == 0, FLAME_ERROR_INTERNAL,
              "split_heads: [B, T, H * D] expected");
  const int64_t B = x->shape[0], T = x->shape[1], D = x->shape[2] / heads;
  return ops::permute(ops::reshape(x, {B, T, heads, D}), {0, 2, 1, 3});
}

Tensor merge_heads(const Tensor& x) {
  FLAME_CHECK(x->ndim() == 4, FLAME_ERROR_INTERNAL, "merge_heads: [B, H, T, D] expected");
  const int64_t B = x->shape[0], H = x->shape[1], T = x->shape[2], D = x->shape[3];
  return ops::reshape(ops::permute(x, {0, 2, 1, 3}), {B, T, H * D});
}

bool known_activation(const std::string& n) {
  return n == "gelu" || n == "gelu_pytorch_tanh" || n == "gelu_new" || n == "gelu_tanh" || n == "quick_gelu" ||
         n == "silu" || n == "swish" || n == "relu";
}

Tensor activation(const std::string& n, const Tensor& x) {
  if (n == "gelu") return ops::unary(OpId::Gelu, x);
  if (n == "gelu_pytorch_tanh" || n == "gelu_new" || n == "gelu_tanh") return ops::unary(OpId::GeluTanh, x);
  if (n == "quick_gelu") return ops::mul(x, ops::unary(OpId::Sigmoid, ops::mul_scalar(x, 1.702)));
  if (n == "silu" || n == "swish") return ops::unary(OpId::Silu, x);
  if (n == "relu") return ops::unary(OpId::Relu, x);
  fail(FLAME_ERROR_INVALID_ARGUMENT, "unknown activation \"", n,
       "\" (known: gelu, gelu_pytorch_tanh, gelu_new, gelu_tanh, quick_gelu, silu, swish, relu)");
}

}  // namespace flame::models

// LoRA adapters (see lora.h): creation and validation, the recorded forward, merge and unmerge.
#include "toolkit/lora.h"
#include <cmath>
#include "tensor/autograd_graph.h"
#include "core/error.h"
#include "ops/ops.h"

namespace flame {

namespace {

DType adapter_dtype(DType base) { return base == FLAME_DTYPE_F64 ? FLAME_DTYPE_F64 : FLAME_DTYPE_F32; }

}  // namespace

Lora::Lora(const Tensor& weight, const Tensor& bias, int64_t rank, double alpha) : w_(weight), bias_(bias) {
  FLAME_CHECK(is_floating(weight->dtype), FLAME_ERROR_DTYPE_MISMATCH, "weight is ", dtype_name(weight->dtype),
              "; it must be floating");
  FLAME_CHECK(weight->ndim() == 2, FLAME_ERROR_SHAPE_MISMATCH, "weight must be [out, in], got ", shape_str(weight->shape));
  FLAME_CHECK(!requires_grad(*weight), FLAME_ERROR_INVALID_ARGUMENT,
              "weight requires grad: the base weight of a LoRA adapter is frozen (set requires_grad 0)");
  const int64_t out = weight->shape[0], in = weight->shape[1];
  FLAME_CHECK(out > 0 && in > 0, FLAME_ERROR_SHAPE_MISMATCH, "weight ", shape_str(weight->shape), " is empty");
  if (bias) {
    FLAME_CHECK(&bias->ctx() == &weight->ctx(), FLAME_ERROR_INVALID_ARGUMENT, "bias belongs to another context than weight");
    FLAME_CHECK(bias->dtype == weight->dtype, FLAME_ERROR_DTYPE_MISMATCH, "bias is ", dtype_name(bias->dtype),
                " but weight is ", dtype_name(weight->dtype));
    FLAME_CHECK(bias->shape == Shape{out}, FLAME_ERROR_SHAPE_MISMATCH, "bias must be [", out, "], got ",
                shape_str(bias->shape));
  }
  FLAME_CHECK(rank >= 1 && rank <= 65536, FLAME_ERROR_INVALID_ARGUMENT, "rank must be in [1, 65536], got ", rank);
  FLAME_CHECK(std::isfinite(alpha), FLAME_ERROR_INVALID_ARGUMENT, "alpha must be finite, got ", alpha);
  scale_ = alpha / static_cast<double>(rank);
  Context& c = weight->ctx();
  GradModeGuard off(c, c.mode.with_grad(false));  // the adapters' init is not recorded
  const DType ad = adapter_dtype(weight->dtype);
  // Kaiming-uniform with a = sqrt(5) (torch.nn.Linear's and peft's init of A): U(-1/sqrt(in), 1/sqrt(in)).
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  a_ = ops::add_scalar(ops::mul_scalar(ops::rand(c, {rank, in}, ad), 2 * bound), -bound);
  b_ = ops::zeros(c, {out, rank}, ad);
  autograd_meta(*a_).requires_grad = true;
  autograd_meta(*b_).requires_grad = true;
}

Tensor Lora::forward(const Tensor& x) {
  FLAME_CHECK(&x->ctx() == &w_->ctx(), FLAME_ERROR_INVALID_ARGUMENT, "x belongs to another context than the adapter");
  FLAME_CHECK(x->dtype == w_->dtype, FLAME_ERROR_DTYPE_MISMATCH, "x is ", dtype_name(x->dtype), " but the base weight is ",
              dtype_name(w_->dtype));
  Tensor y = ops::linear(x, w_, bias_, ops::Activation::None);
  if (merged()) return y;
  const DType ad = a_->dtype;
  Tensor h = ops::linear(ops::to_dtype(x, ad), a_, nullptr, ops::Activation::None);  // [..., r]
  Tensor d = ops::mul_scalar(ops::linear(h, b_, nullptr, ops::Activation::None), scale_);
  return ops::add(y, ops::to_dtype(d, w_->dtype));
}

void Lora::merge() {
  FLAME_CHECK(!merged(), FLAME_ERROR_INVALID_ARGUMENT, "the adapter is merged already");
  GradModeGuard off(ctx(), ctx().mode.with_grad(false));  // B A is not recorded
  Tensor original = ops::clone(alias(w_));
  Tensor delta = ops::mul_scalar(ops::mm(alias(b_), alias(a_)), scale_);  // [out, in] in the adapters' dtype
  Tensor merged = ops::add(ops::to_dtype(alias(w_), delta->dtype), delta);
  ops::copy_into(w_, merged);  // rounds once to W's dtype; bumps W's version
  original_ = std::move(original);
}

void Lora::unmerge() {
  FLAME_CHECK(merged(), FLAME_ERROR_INVALID_ARGUMENT, "the adapter is not merged");
  ops::copy_into(w_, original_);  // the exact weight of before merge()
  original_.reset();
}

}  // namespace flame

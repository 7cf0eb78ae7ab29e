// Autocast (flame_ctx_set_autocast), applied by the C entry points only: backward rules call the ops
// directly and are untouched. While a context's autocast dtype is set (bf16 or f16), the entry
// points of the matrix products (matmul, bmm, linear, convolutions, attention) convert their f32
// inputs to it, and those of softmax, the normalisations, the losses and sum/mean convert f16/bf16
// inputs to f32. Each conversion is a recorded cast, whose backward casts the gradient back, so
// parameters receive gradients in their own dtype. f64 and integer tensors are never converted.
// Two conversions happen without their kernels, with the same values: cross_entropy with class
// indices reads f16/bf16 logits directly (its kernels compute in f32; the loss is f32), and a
// linear's GEMMs write the f32 gradients of tensors cast for it (autograd/engine.cpp).
#pragma once
#include "ops/ops.h"
#include "runtime/context.h"

namespace flame {

// t, or t converted to the autocast dtype when autocast is on and t is f32 (null stays null).
inline Tensor autocast_low(const Tensor& t) {
  if (!t || t->ctx().mode.autocast < 0 || t->dtype != FLAME_DTYPE_F32) return t;
  return ops::to_dtype(t, static_cast<DType>(t->ctx().mode.autocast));
}

// t, or t converted to f32 when autocast is on and t is f16 or bf16 (null stays null).
inline Tensor autocast_f32(const Tensor& t) {
  if (!t || t->ctx().mode.autocast < 0 || (t->dtype != FLAME_DTYPE_F16 && t->dtype != FLAME_DTYPE_BF16)) return t;
  return ops::to_dtype(t, FLAME_DTYPE_F32);
}

}  // namespace flame

// LoRA adapters over a linear layer (Hu et al. 2021, as peft's LoraLayer): a frozen base weight W
// [out, in] (f32, f16, bf16 or f64) with optional bias, and trainable adapters A [r, in] (Kaiming-
// uniform, bound 1 / sqrt(in), from the context's generator) and B [out, r] (zeros) in f32 (f64 for
// an f64 base), scaled by alpha / r:
//   y = linear(x, W, bias) + cast(scale * linear(linear(cast(x), A), B))
// with the adapter path computed in the adapters' dtype and cast back to W's dtype, all recorded,
// so that gradients reach A and B (and x, bias when they require grad) but never W.
// merge() adds scale * B A to W in place (computed in f32, rounded once to W's dtype) after keeping
// a copy of W, which unmerge() writes back, so that merging never drifts the frozen weight.
#pragma once
#include "tensor/tensor.h"

namespace flame {

class Lora {
 public:
  Lora(const Tensor& weight, const Tensor& bias, int64_t rank, double alpha);
  Tensor forward(const Tensor& x);
  void merge();
  void unmerge();
  bool merged() const { return static_cast<bool>(original_); }
  const Tensor& a() const { return a_; }
  const Tensor& b() const { return b_; }
  Context& ctx() { return w_->ctx(); }

 private:
  Tensor w_, bias_, a_, b_, original_;  // original_: W before merge() (set while merged)
  double scale_;
};

}  // namespace flame

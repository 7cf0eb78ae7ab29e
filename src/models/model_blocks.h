// Building blocks the architectures share, as functions of tensors (the parameters come from the
// Model's store by name): attention head reshapes, the activations configs name, and the
// residual-stream helpers. Everything here is a composition of recorded FLAME ops, so gradients
// flow through it with no rules of its own.
#pragma once
#include <string>
#include "tensor/tensor.h"

namespace flame::models {

// x [B, T, H * D] -> [B, H, T, D] (a view where possible).
Tensor split_heads(const Tensor& x, int64_t heads);
// x [B, H, T, D] -> [B, T, H * D].
Tensor merge_heads(const Tensor& x);

// The activation a config names, as transformers' ACT2FN / diffusers' get_activation spell them:
// "gelu" (erf), "gelu_pytorch_tanh" / "gelu_new" / "gelu_tanh" (tanh approximation), "quick_gelu"
// (x * sigmoid(1.702 x)), "silu" / "swish", "relu". Unknown names: FLAME_ERROR_INVALID_ARGUMENT.
Tensor activation(const std::string& name, const Tensor& x);
// Whether activation() knows name (for config checks at construction).
bool known_activation(const std::string& name);

}  // namespace flame::models

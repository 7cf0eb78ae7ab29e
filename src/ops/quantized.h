// Frozen fp8 weights in the ops layer (issue 36, Memory; the model layer's option and file layout
// are models/quantized_weights.h): a weight W = q * scale stored as q in fp8 (e4m3, or e5m2 when a
// file holds one) with an f32 scale, one for the tensor or one per output row.
//  - dequantize: one kernel (cuda/dequantize.cuh) that reads q and the scale and writes W in the
//    compute dtype, computed in f32 and rounded once (the values of to_dtype(q, f32) * scale cast to
//    the dtype, without that f32 temporary). Not recorded: W is a constant of the graph.
//  - quantized_linear: y = x W^T + b, recorded as one QuantizedLinear node (tensor/op_list.h) that
//    saves q and its scale rather than W, and dequantises again in backward for the input gradient
//    (autograd/backward_rules.cpp). A frozen base's linear layer then keeps no compute-dtype copy of
//    its weight between forward (or a checkpoint's recompute) and backward: 1 byte per weight element
//    instead of 2 (bf16), at the price of one more dequantisation kernel per backward. q and scale
//    never get a gradient (they are constants of the node, as dequantize's result is).
#pragma once
#include <functional>
#include <string>
#include <vector>
#include "ops/ops.h"
#include "tensor/tensor.h"

namespace flame::ops {

// q (F8_E4M3 or F8_E5M2, any strides) times scale in dtype (f32, f16, bf16 or f64). scale is f32 and
// either holds one value (any shape of one element with at most q's dims: per tensor) or one per
// row of q (shape [q.shape[0], 1, ..., 1] with q's dims: per row). Errors (nothing written):
// FLAME_ERROR_DTYPE_MISMATCH (q not fp8, scale not f32, dtype not one of the four),
// FLAME_ERROR_SHAPE_MISMATCH (a scale of another shape), FLAME_ERROR_INVALID_ARGUMENT (another context).
Tensor dequantize(const Tensor& q, const Tensor& scale, DType dtype);
// The same into out (contiguous, q's shape, a float dtype as above): bumps out's version.
void dequantize_into(const Tensor& q, const Tensor& scale, const Tensor& out);

// act(x W^T + bias) for x [..., in] (f32, f16, bf16 or f64) and bias ([out] of x's dtype, or null),
// with W [out, in] = q * scale dequantised to x's dtype (q fp8 [out, in], scale as dequantize's). The
// GEMM and its fused epilogue are linear's (ops::linear2d_forward), so the output equals
// linear(x, dequantize(q, scale, x->dtype), bias, act). The recorded node reaches x and bias only; it
// saves q and scale, and as Linear does relu's output or gelu's pre-activation (with x and bias, which
// create_graph recomputes it from). Errors: dequantize's, and FLAME_ERROR_SHAPE_MISMATCH /
// DTYPE_MISMATCH for x or bias.
Tensor quantized_linear(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor& bias,
                        Activation act = Activation::None);

// act(x W^T + bias) for x [..., in_features] with W [out_features, in_features] = dequantize_weight(x's
// dtype), made for the forward only: the one recorded layer of every quantised base (quantized_linear,
// nf4_linear). Its node (op) reaches x and bias, saves weight_saved in order, then, as Linear does,
// relu's output or gelu's pre-activation followed by x and the bias. The callers check the arguments.
Tensor linear_over_dequantized(const Tensor& x, const std::function<Tensor(DType)>& dequantize_weight, int64_t in_features,
                               int64_t out_features, const Tensor& bias, Activation act, OpId op,
                               const std::vector<Tensor>& weight_saved);

// The kernel instantiations dequantize may launch (tests/cpu/test_kernels.cpp compiles them).
std::vector<std::string> dequantize_instantiations();

}  // namespace flame::ops

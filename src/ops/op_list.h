// THE op list. Each X-macro row names an op once; from these rows come the OpId enum, the op
// names used in messages, the generated C entry points (src/api/api_ops.cpp), the kernel
// instantiations checked by the CPU kernel test, and the rows the tests must cover.
//
// How to add an elementwise op: one row here, one functor of the same name in
// cuda/elementwise.cuh, one backward rule in src/autograd/backward_rules.cpp, one test row in
// tests/gpu (forward reference and gradient), one declaration in include/flame.h.
//
// Elementwise row: X(Functor, c_name, Kind)
//   Kind MATH:  floating math; integer/bool inputs compute in f32
//   Kind ARITH: keeps the input dtype (integers stay integers); bool input is an error
//   Kind PRED:  any dtype in, bool out (not differentiable)
//   Kind ROUND: floating or integer, keeps dtype; gradient is zero
#pragma once

// flame_<c_name>(t, out)
#define FLAME_UNARY_OPS(X)         \
  X(Neg, neg, ARITH)               \
  X(Abs, abs, ARITH)               \
  X(Exp, exp, MATH)                \
  X(Log, log, MATH)                \
  X(Log1p, log1p, MATH)            \
  X(Expm1, expm1, MATH)            \
  X(Sqrt, sqrt, MATH)              \
  X(Rsqrt, rsqrt, MATH)            \
  X(Sin, sin, MATH)                \
  X(Cos, cos, MATH)                \
  X(Tanh, tanh, MATH)              \
  X(Sigmoid, sigmoid, MATH)        \
  X(Relu, relu, ARITH)             \
  X(Silu, silu, MATH)              \
  X(Floor, floor, ROUND)           \
  X(Ceil, ceil, ROUND)             \
  X(Round, round, ROUND)           \
  X(Sign, sign, ARITH)             \
  X(Reciprocal, reciprocal, MATH)  \
  X(Square, square, ARITH)         \
  X(IsNan, isnan, PRED)            \
  X(IsInf, isinf, PRED)            \
  X(LogicalNot, logical_not, PRED)

// flame_<c_name>(t, double s, out): the scalar is ScalarArgs.s0
#define FLAME_SCALAR_OPS(X)          \
  X(AddScalar, add_scalar, ARITH)    \
  X(SubScalar, sub_scalar, ARITH)    \
  X(MulScalar, mul_scalar, ARITH)    \
  X(RsubScalar, rsub_scalar, ARITH)  \
  X(PowScalar, pow_scalar, ARITH)    \
  X(LeakyRelu, leaky_relu, MATH)     \
  X(Elu, elu, MATH)

// Elementwise ops with their own C signatures (written by hand in src/api/api_ops.cpp).
#define FLAME_SPECIAL_UNARY_OPS(X) \
  X(Gelu, gelu, MATH)              \
  X(GeluTanh, gelu_tanh, MATH)     \
  X(Softplus, softplus, MATH)      \
  X(Clamp, clamp, ARITH)

// Elementwise ops used only inside FLAME (backward rules); no C entry point.
#define FLAME_INTERNAL_UNARY_OPS(X) \
  X(GeluDeriv, gelu_deriv, MATH)    \
  X(GeluTanhDeriv, gelu_tanh_deriv, MATH)

// flame_<c_name>(a, b, out). Kind ARITH: promoted dtype; MATH: floating; CMP: bool result.
#define FLAME_BINARY_OPS(X)          \
  X(Add, add, ARITH)                 \
  X(Sub, sub, ARITH)                 \
  X(Mul, mul, ARITH)                 \
  X(Div, div, MATH)                  \
  X(Pow, pow, ARITH)                 \
  X(Maximum, maximum, ARITH)         \
  X(Minimum, minimum, ARITH)         \
  X(Eq, eq, CMP)                     \
  X(Ne, ne, CMP)                     \
  X(Lt, lt, CMP)                     \
  X(Le, le, CMP)                     \
  X(Gt, gt, CMP)                     \
  X(Ge, ge, CMP)                     \
  X(LogicalAnd, logical_and, CMP)    \
  X(LogicalOr, logical_or, CMP)

// Binary elementwise ops used only inside FLAME (fused backward steps); no C entry point.
#define FLAME_INTERNAL_BINARY_OPS(X) \
  X(GeluTanhBackward, gelu_tanh_backward, MATH)

// Graph nodes that are not plain elementwise functors: X(Id, name)
#define FLAME_STRUCTURAL_OPS(X) \
  X(Where, where)               \
  X(Cast, to_dtype)             \
  X(Copy, contiguous)           \
  X(Reshape, reshape)           \
  X(Permute, permute)           \
  X(Expand, expand)             \
  X(ViewSlice, view_slice)      \
  X(ViewScatter, view_scatter)  \
  X(Cat, cat)                   \
  X(Sum, sum)                   \
  X(Prod, prod)                 \
  X(Amax, max)                  \
  X(Amin, min)                  \
  X(ArgMax, argmax)             \
  X(ArgMin, argmin)             \
  X(CumSum, cumsum)             \
  X(Matmul, matmul)             \
  X(Linear, linear)

// ---- neural-network ops: softmax and normalisation (src/ops/softmax.cpp, src/ops/nn_norm.cpp) ----
// Fused forward kernels (cuda/softmax.cuh, cuda/norm.cuh) with C entry points in src/api/api_nn.cpp;
// each records one node whose rule calls a fused backward (below) or composes ops under create_graph.
#define FLAME_NN_OPS(X)          \
  X(Softmax, softmax)            \
  X(LogSoftmax, log_softmax)     \
  X(LayerNorm, layer_norm)       \
  X(RmsNorm, rms_norm)           \
  X(GroupNorm, group_norm)       \
  X(BatchNorm, batch_norm)
// Their fused backward kernels, called by the rules only when no graph is being built. They have no
// backward of their own: recording one fails (FLAME_ERROR_NOT_DIFFERENTIABLE) instead of dropping it.
#define FLAME_NN_INTERNAL_OPS(X)                \
  X(SoftmaxBackward, softmax_backward)         \
  X(NormBackward, norm_backward)               \
  X(BatchNormBackward, batch_norm_backward)

// ---- losses (src/ops/loss.cpp, kernels in cuda/loss.cuh) ----
// Fused loss ops with kernels of their own: X(Id, name). The other losses (smooth_l1, huber,
// binary_cross_entropy_with_logits, and mse / l1 with reduction none) are compositions of the ops
// above and need no row.
#define FLAME_LOSS_OPS(X)                      \
  X(CrossEntropy, cross_entropy)               \
  X(CrossEntropyProbs, cross_entropy_probs)    \
  X(NllLoss, nll_loss)                         \
  FLAME_POINTWISE_LOSS_OPS(X)
// mse_loss and l1_loss with reduction mean or sum (src/ops/loss_pointwise.cpp, kernels in
// cuda/loss_pointwise.cuh): one node over (input, target), differentiable to any order.
#define FLAME_POINTWISE_LOSS_OPS(X)            \
  X(MseLoss, mse_loss)                         \
  X(L1Loss, l1_loss)

// ---- indexing (src/ops/indexing.cpp, kernels in cuda/indexing.cuh) ----
// The two recorded primitives, each the other's backward: X(Id, name). index_select, embedding
// and index_add are these over a broadcast index; masked_fill is a where(); one_hot is not
// differentiable and records nothing.
#define FLAME_INDEXING_OPS(X) \
  X(Gather, gather)           \
  X(ScatterAdd, scatter_add)

// ---- convolution (src/ops/conv.cpp, kernels in cuda/conv.cuh) ----
// The three recorded primitives of conv2d / conv1d / conv_transpose2d: X(Id, name). Conv2d is
// y = conv(x, w) + b; ConvTranspose2d its adjoint in x (the input gradient, and conv_transpose2d);
// ConvWeightGrad its adjoint in w. Each one's backward is made of the other two (ops/conv.h).
#define FLAME_CONV_OPS(X)                 \
  X(Conv2d, conv2d)                       \
  X(ConvTranspose2d, conv_transpose2d)    \
  X(ConvWeightGrad, conv_weight_grad)
// ---- attention (src/ops/attention.cpp, kernels in cuda/attention.cuh) ----
// The fused f16/bf16 attention node (f32/f64 attention is composed of the ops above and records
// their nodes), and its fused backward, which has no backward of its own (create_graph composes
// the gradient of FLAME ops instead).
#define FLAME_ATTENTION_OPS(X) \
  X(Attention, scaled_dot_product_attention)
#define FLAME_ATTENTION_INTERNAL_OPS(X) \
  X(AttentionBackward, scaled_dot_product_attention_backward)
// ---- more neural-network ops (issue 5, second part; declared in src/ops/nnops.h) ----
// Recorded nodes, each with a backward rule written with FLAME ops: scatter and the constant pad
// (src/ops/indexing_extra.cpp, kernel in cuda/scatter.cuh; masked_select, repeat, repeat_interleave
// and the reflect and replicate pads are compositions and need no row); dropout (src/ops/dropout.cpp,
// cuda/dropout.cuh: its backward is itself with the same seed and offset); pooling
// (src/ops/pooling.cpp, cuda/pool.cuh: max_pool2d scatters to its argmax; average pooling, fixed or
// adaptive, and its adjoint are each other's backward); upsampling (src/ops/upsample.cpp,
// cuda/upsample.cuh: nearest or bilinear, and its adjoint, each the other's backward); rotary
// embeddings (src/ops/rope.cpp, cuda/rope.cuh: the backward rotates back; timestep embeddings are a
// composition and need no row).
#define FLAME_NNOPS_OPS(X)                    \
  X(Scatter, scatter)                         \
  X(ConstantPad, constant_pad)                \
  X(Dropout, dropout)                         \
  X(MaxPool2d, max_pool2d)                    \
  X(AvgPool2d, avg_pool2d)                    \
  X(AvgPool2dBackward, avg_pool2d_backward)   \
  X(Upsample2d, upsample2d)                   \
  X(Upsample2dBackward, upsample2d_backward)  \
  X(Rope, rope)
// ---- training toolkit (src/toolkit/checkpoint.cpp) ----
// Gradient checkpointing: one node per flame_checkpoint call, with one output per tensor the user's
// function returned; its backward re-runs the function and walks the rebuilt graph (the engine's
// multi-output path).
#define FLAME_TOOLKIT_OPS(X) \
  X(Checkpoint, checkpoint)
// ---- fused elementwise expressions (src/ops/fused.cpp, kernels in cuda/fused.cuh) ----
// One node per flame_fused_call; its payload is the compiled function, whose backward is one fused
// call per input (g * d expr / d x_i), so it is differentiable to any order.
#define FLAME_FUSED_OPS(X) \
  X(Fused, fused)

namespace flame {

enum class OpId : int {
#define FLAME_OP_ENUM(Id, name, ...) Id,
  FLAME_UNARY_OPS(FLAME_OP_ENUM) FLAME_SCALAR_OPS(FLAME_OP_ENUM) FLAME_SPECIAL_UNARY_OPS(FLAME_OP_ENUM)
  FLAME_INTERNAL_UNARY_OPS(FLAME_OP_ENUM)
  FLAME_BINARY_OPS(FLAME_OP_ENUM) FLAME_INTERNAL_BINARY_OPS(FLAME_OP_ENUM) FLAME_STRUCTURAL_OPS(FLAME_OP_ENUM)
  FLAME_NN_OPS(FLAME_OP_ENUM) FLAME_NN_INTERNAL_OPS(FLAME_OP_ENUM)
  FLAME_LOSS_OPS(FLAME_OP_ENUM) FLAME_INDEXING_OPS(FLAME_OP_ENUM)
  FLAME_CONV_OPS(FLAME_OP_ENUM)
  FLAME_ATTENTION_OPS(FLAME_OP_ENUM) FLAME_ATTENTION_INTERNAL_OPS(FLAME_OP_ENUM)
  FLAME_NNOPS_OPS(FLAME_OP_ENUM)
  FLAME_TOOLKIT_OPS(FLAME_OP_ENUM)
  FLAME_FUSED_OPS(FLAME_OP_ENUM)
#undef FLAME_OP_ENUM
  Count
};

constexpr int kNumOps = static_cast<int>(OpId::Count);
const char* op_name(OpId op);

}  // namespace flame

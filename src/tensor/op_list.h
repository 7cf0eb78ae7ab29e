// THE op list. Each X-macro row names an op once, with its backward and what that backward saves;
// from these rows come the OpId enum, the op names used in messages, the generated C entry points
// (src/api/api_ops.cpp), the backward-rule table (src/autograd/backward_rules.cpp), the saved-tensor
// tables of elementwise ops (src/ops/elementwise.cpp), the kernel instantiations checked by the CPU
// kernel test, and the rows the tests must cover (tests/cpu/test_op_coverage.cpp: every op has a
// rule or a mark; tests/gpu/test_op_coverage.cpp: every op has a gradient-check or
// not-differentiable row).
//
// Elementwise row: X(Functor, c_name, Kind, Backward, Saves)
//   Kind MATH:  floating math; integer/bool inputs compute in f32
//   Kind ARITH: keeps the input dtype (integers stay integers); bool input is an error
//   Kind PRED:  any dtype in, bool out (Backward NONDIFF)
//   Kind ROUND: floating or integer, keeps dtype; gradient is zero
//   Kind CMP:   binary, bool out (Backward NONDIFF)
// Other rows: X(Id, name, Backward); the op's forward saves what its rule reads (noted at the rule).
//   Backward RULE:       the rule `RULE(Id)` (function bw_<Id>) in src/autograd/backward_rules.cpp,
//                        written with FLAME ops; a RULE row without it does not compile (the rule
//                        table names bw_<Id>), and a rule without a RULE row is an unused function.
//   Backward NONDIFF:    bool or integer outputs: nothing to differentiate, no node is recorded.
//   Backward NOBACKWARD: a fused backward kernel (float output) called by rules outside create_graph;
//                        recording it with an input that requires grad fails
//                        (FLAME_ERROR_NOT_DIFFERENTIABLE) instead of dropping the gradient.
//   Saves (elementwise rows) NONE / INPUT / OUTPUT / BOTH: what ops::unary / ops::binary keep for
//                        the rule: the input(s) (unary: x; binary: a, b), then the output. Rules read
//                        them with saved_input(n, k) / saved_output(n), which fail on a tensor the
//                        row does not save.
//
// How to add an elementwise op with its gradient (e.g. a unary MATH op `foo`):
//   1. src/tensor/op_list.h: one row, X(Foo, foo, MATH, RULE, INPUT), in FLAME_UNARY_OPS (C entry point
//      flame_foo(t, out) generated in src/api/api_ops.cpp), FLAME_SCALAR_OPS (flame_foo(t, s, out);
//      the scalar is a.s0), FLAME_BINARY_OPS (flame_foo(a, b, out)) or FLAME_INTERNAL_*_OPS (no C
//      entry point).
//   2. cuda/functors.cuh: one functor of the same name, FLAME_UNARY(Foo, <expression in x>).
//   3. src/autograd/backward_rules.cpp: one rule, RULE(Foo) { return {mul(g, <FLAME ops of
//      saved_input(n, 0)>)}; } (an op the fused expressions also differentiate puts that formula in
//      src/ops/derivatives.h instead and calls it from both).
//   4. Tests: one gradient-check row covering "foo" in tests/gpu/test_gradcheck.cpp (host reference,
//      finite differences; a NONDIFF op gets a not-differentiable row there instead) and one forward
//      row of the same Kind in tests/gpu/test_ops_elementwise.cpp.
//   5. For an op with a C entry point: its declaration with documentation in include/flame.h (the
//      definition is generated from the row), its argument-validation row in
//      tests/common/arg_rows/core.cpp (FLAME_ARG_ROW(flame_foo, a.t("t"), a.out_t("out"));
//      ArgMatrix.EveryExportedFunctionHasARow fails without it), then
//      `python3 scripts/gen_bindings.py`, which regenerates the Rust and C# bindings from flame.h.
// The enum, name, C entry point, rule table, saves table and kernel instantiations follow from the
// row. tests/cpu/test_op_coverage.cpp fails until the rule reads what the Saves column says, and
// tests/gpu/test_op_coverage.cpp and ElementwiseOpList until the test rows exist.
#pragma once

// flame_<c_name>(t, out)
#define FLAME_UNARY_OPS(X)         \
  X(Neg, neg, ARITH, RULE, NONE)                       \
  X(Abs, abs, ARITH, RULE, INPUT)                      \
  X(Exp, exp, MATH, RULE, OUTPUT)                      \
  X(Log, log, MATH, RULE, INPUT)                       \
  X(Log1p, log1p, MATH, RULE, INPUT)                   \
  X(Expm1, expm1, MATH, RULE, OUTPUT)                  \
  X(Sqrt, sqrt, MATH, RULE, OUTPUT)                    \
  X(Rsqrt, rsqrt, MATH, RULE, OUTPUT)                  \
  X(Sin, sin, MATH, RULE, INPUT)                       \
  X(Cos, cos, MATH, RULE, INPUT)                       \
  X(Tanh, tanh, MATH, RULE, OUTPUT)                    \
  X(Sigmoid, sigmoid, MATH, RULE, OUTPUT)              \
  X(Relu, relu, ARITH, RULE, INPUT)                    \
  X(Silu, silu, MATH, RULE, INPUT)                     \
  X(Floor, floor, ROUND, RULE, NONE)                   \
  X(Ceil, ceil, ROUND, RULE, NONE)                     \
  X(Round, round, ROUND, RULE, NONE)                   \
  X(Sign, sign, ARITH, RULE, NONE)                     \
  X(Reciprocal, reciprocal, MATH, RULE, OUTPUT)        \
  X(Square, square, ARITH, RULE, INPUT)                \
  X(IsNan, isnan, PRED, NONDIFF, NONE)                 \
  X(IsInf, isinf, PRED, NONDIFF, NONE)                 \
  X(LogicalNot, logical_not, PRED, NONDIFF, NONE)     

// flame_<c_name>(t, double s, out): the scalar is ScalarArgs.s0
#define FLAME_SCALAR_OPS(X)          \
  X(AddScalar, add_scalar, ARITH, RULE, NONE)          \
  X(SubScalar, sub_scalar, ARITH, RULE, NONE)          \
  X(MulScalar, mul_scalar, ARITH, RULE, NONE)          \
  X(RsubScalar, rsub_scalar, ARITH, RULE, NONE)        \
  X(PowScalar, pow_scalar, ARITH, RULE, INPUT)         \
  X(LeakyRelu, leaky_relu, MATH, RULE, INPUT)          \
  X(Elu, elu, MATH, RULE, BOTH)                       

// Elementwise ops with their own C signatures (written by hand in src/api/api_ops.cpp).
#define FLAME_SPECIAL_UNARY_OPS(X) \
  X(Gelu, gelu, MATH, RULE, INPUT)                     \
  X(GeluTanh, gelu_tanh, MATH, RULE, INPUT)            \
  X(Softplus, softplus, MATH, RULE, INPUT)             \
  X(Clamp, clamp, ARITH, RULE, INPUT)                 

// Elementwise ops used only inside FLAME (backward rules); no C entry point.
#define FLAME_INTERNAL_UNARY_OPS(X) \
  X(GeluDeriv, gelu_deriv, MATH, RULE, INPUT)          \
  X(GeluTanhDeriv, gelu_tanh_deriv, MATH, RULE, INPUT)

// flame_<c_name>(a, b, out). Kind ARITH: promoted dtype; MATH: floating; CMP: bool result.
#define FLAME_BINARY_OPS(X)          \
  X(Add, add, ARITH, RULE, NONE)                       \
  X(Sub, sub, ARITH, RULE, NONE)                       \
  X(Mul, mul, ARITH, RULE, INPUT)                      \
  X(Div, div, MATH, RULE, BOTH)                        \
  X(Pow, pow, ARITH, RULE, BOTH)                       \
  X(Maximum, maximum, ARITH, RULE, INPUT)              \
  X(Minimum, minimum, ARITH, RULE, INPUT)              \
  X(Eq, eq, CMP, NONDIFF, NONE)                        \
  X(Ne, ne, CMP, NONDIFF, NONE)                        \
  X(Lt, lt, CMP, NONDIFF, NONE)                        \
  X(Le, le, CMP, NONDIFF, NONE)                        \
  X(Gt, gt, CMP, NONDIFF, NONE)                        \
  X(Ge, ge, CMP, NONDIFF, NONE)                        \
  X(LogicalAnd, logical_and, CMP, NONDIFF, NONE)       \
  X(LogicalOr, logical_or, CMP, NONDIFF, NONE)        

// Binary elementwise ops used only inside FLAME (fused backward steps); no C entry point.
#define FLAME_INTERNAL_BINARY_OPS(X) \
  X(GeluTanhBackward, gelu_tanh_backward, MATH, RULE, INPUT)

// Graph nodes that are not plain elementwise functors: X(Id, name)
#define FLAME_STRUCTURAL_OPS(X) \
  X(Where, where, RULE)                                \
  X(Cast, to_dtype, RULE)                              \
  X(Copy, contiguous, RULE)                            \
  X(Reshape, reshape, RULE)                            \
  X(Permute, permute, RULE)                            \
  X(Expand, expand, RULE)                              \
  X(ViewSlice, view_slice, RULE)                       \
  X(ViewScatter, view_scatter, RULE)                   \
  X(Cat, cat, RULE)                                    \
  X(Sum, sum, RULE)                                    \
  X(Prod, prod, RULE)                                  \
  X(Amax, max, RULE)                                   \
  X(Amin, min, RULE)                                   \
  X(ArgMax, argmax, NONDIFF)                           \
  X(ArgMin, argmin, NONDIFF)                           \
  X(CumSum, cumsum, RULE)                              \
  X(Matmul, matmul, RULE)                              \
  X(Linear, linear, RULE)                             

// ---- neural-network ops: softmax and normalisation (src/ops/softmax.cpp, src/ops/nn_norm.cpp) ----
// Fused forward kernels (cuda/softmax.cuh, cuda/norm.cuh) with C entry points in src/api/api_nn.cpp;
// each records one node whose rule calls a fused backward (below) or composes ops under create_graph.
#define FLAME_NN_OPS(X)          \
  X(Softmax, softmax, RULE)                            \
  X(LogSoftmax, log_softmax, RULE)                     \
  X(LayerNorm, layer_norm, RULE)                       \
  X(RmsNorm, rms_norm, RULE)                           \
  X(GroupNorm, group_norm, RULE)                       \
  X(BatchNorm, batch_norm, RULE)                      
// Their fused backward kernels, called by the rules only when no graph is being built. They have no
// backward of their own: recording one fails (FLAME_ERROR_NOT_DIFFERENTIABLE) instead of dropping it.
#define FLAME_NN_INTERNAL_OPS(X)                \
  X(SoftmaxBackward, softmax_backward, NOBACKWARD)     \
  X(NormBackward, norm_backward, NOBACKWARD)           \
  X(BatchNormBackward, batch_norm_backward, NOBACKWARD)

// ---- losses (src/ops/loss.cpp, kernels in cuda/loss.cuh) ----
// Fused loss ops with kernels of their own: X(Id, name). The other losses (smooth_l1, huber,
// binary_cross_entropy_with_logits, and mse / l1 with reduction none) are compositions of the ops
// above and need no row.
#define FLAME_LOSS_OPS(X)                      \
  X(CrossEntropy, cross_entropy, RULE)                 \
  X(CrossEntropyProbs, cross_entropy_probs, RULE)      \
  X(NllLoss, nll_loss, RULE)                           \
  FLAME_POINTWISE_LOSS_OPS(X)
// mse_loss and l1_loss with reduction mean or sum (src/ops/loss_pointwise.cpp, kernels in
// cuda/loss_pointwise.cuh): one node over (input, target), differentiable to any order.
#define FLAME_POINTWISE_LOSS_OPS(X)            \
  X(MseLoss, mse_loss, RULE)                           \
  X(L1Loss, l1_loss, RULE)                            

// ---- indexing (src/ops/indexing.cpp, kernels in cuda/indexing.cuh) ----
// The two recorded primitives, each the other's backward: X(Id, name). index_select, embedding
// and index_add are these over a broadcast index; masked_fill is a where(); one_hot is not
// differentiable and records nothing.
#define FLAME_INDEXING_OPS(X) \
  X(Gather, gather, RULE)                              \
  X(ScatterAdd, scatter_add, RULE)                    

// ---- convolution (src/ops/conv.cpp, kernels in cuda/conv.cuh) ----
// The three recorded primitives of conv2d / conv1d / conv_transpose2d: X(Id, name). Conv2d is
// y = conv(x, w) + b; ConvTranspose2d its adjoint in x (the input gradient, and conv_transpose2d);
// ConvWeightGrad its adjoint in w. Each one's backward is made of the other two (ops/conv.h).
#define FLAME_CONV_OPS(X)                 \
  X(Conv2d, conv2d, RULE)                              \
  X(ConvTranspose2d, conv_transpose2d, RULE)           \
  X(ConvWeightGrad, conv_weight_grad, RULE)           
// ---- attention (src/ops/attention.cpp, kernels in cuda/attention.cuh) ----
// The fused f16/bf16 attention node (f32/f64 attention is composed of the ops above and records
// their nodes), and its fused backward, which has no backward of its own (create_graph composes
// the gradient of FLAME ops instead).
#define FLAME_ATTENTION_OPS(X) \
  X(Attention, scaled_dot_product_attention, RULE)    
#define FLAME_ATTENTION_INTERNAL_OPS(X) \
  X(AttentionBackward, scaled_dot_product_attention_backward, NOBACKWARD)
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
  X(Scatter, scatter, RULE)                            \
  X(ConstantPad, constant_pad, RULE)                   \
  X(Dropout, dropout, RULE)                            \
  X(MaxPool2d, max_pool2d, RULE)                       \
  X(AvgPool2d, avg_pool2d, RULE)                       \
  X(AvgPool2dBackward, avg_pool2d_backward, RULE)      \
  X(Upsample2d, upsample2d, RULE)                      \
  X(Upsample2dBackward, upsample2d_backward, RULE)     \
  X(Rope, rope, RULE)                                 
// ---- training toolkit (src/toolkit/checkpoint.cpp) ----
// Gradient checkpointing: one node per flame_checkpoint call, with one output per tensor the user's
// function returned; its backward re-runs the function and walks the rebuilt graph (the engine's
// multi-output path).
#define FLAME_TOOLKIT_OPS(X) \
  X(Checkpoint, checkpoint, RULE)                     
// ---- parameter sharding of a model's blocks (src/models/param_sharding.cpp) ----
// One node per entry of a sharded block that records, with one output per parameter of the block:
// the gathered views of its parameters. Its backward (Node::backward) reduce-scatters their
// gradients into the block's gradient shard and returns nothing (the node has no inputs).
#define FLAME_MODEL_OPS(X) \
  X(ShardGather, shard_gather, RULE)                  
// ---- fused elementwise expressions (src/ops/fused.cpp, kernels in cuda/fused.cuh) ----
// One node per flame_fused_call, carrying its backward (Node::backward, bound to the compiled
// function): one fused call per input (g * d expr / d x_i), so it is differentiable to any order.
#define FLAME_FUSED_OPS(X) \
  X(Fused, fused, RULE)                               
// ---- the frozen fp8 base's linear layer (src/ops/quantized.cpp, kernel cuda/dequantize.cuh) ----
// y = x W^T + b with W = q * scale frozen in fp8: one node over (x, bias) that saves q and scale, not
// the dequantised W; its rule dequantises them again for the input gradient. No C entry point (the
// model layer's "quantize" option uses it). Nf4Linear: the same over an NF4 weight (src/ops/nf4.cpp,
// kernels cuda/nf4.cuh), saving the packed codes and their statistics.
#define FLAME_QUANTIZED_OPS(X) \
  X(QuantizedLinear, quantized_linear, RULE)          \
  X(Nf4Linear, nf4_linear, RULE)

// Every elementwise row (5 columns), then every other row (3 columns), in OpId order.
#define FLAME_ELEMENTWISE_OPS(X)                                                                  \
  FLAME_UNARY_OPS(X) FLAME_SCALAR_OPS(X) FLAME_SPECIAL_UNARY_OPS(X) FLAME_INTERNAL_UNARY_OPS(X) \
  FLAME_BINARY_OPS(X) FLAME_INTERNAL_BINARY_OPS(X)
#define FLAME_GRAPH_OPS(X)                                                                           \
  FLAME_STRUCTURAL_OPS(X) FLAME_NN_OPS(X) FLAME_NN_INTERNAL_OPS(X) FLAME_LOSS_OPS(X) FLAME_INDEXING_OPS(X) \
  FLAME_CONV_OPS(X) FLAME_ATTENTION_OPS(X) FLAME_ATTENTION_INTERNAL_OPS(X) FLAME_NNOPS_OPS(X)           \
  FLAME_TOOLKIT_OPS(X) FLAME_MODEL_OPS(X) FLAME_FUSED_OPS(X) FLAME_QUANTIZED_OPS(X)
#define FLAME_ALL_OPS(X) FLAME_ELEMENTWISE_OPS(X) FLAME_GRAPH_OPS(X)

namespace flame {

enum class OpId : int {
#define FLAME_OP_ENUM(Id, ...) Id,
  FLAME_ALL_OPS(FLAME_OP_ENUM)
#undef FLAME_OP_ENUM
  Count
};

constexpr int kNumOps = static_cast<int>(OpId::Count);
const char* op_name(OpId op);

// The Backward and Saves columns as values (see the top of this file).
enum class Backward { RULE, NONDIFF, NOBACKWARD };
enum class Saves { NONE, INPUT, OUTPUT, BOTH };

constexpr Backward op_backward(OpId op) {
  switch (op) {
#define FLAME_OP_BACKWARD_EW(Id, name, Kind, B, S) case OpId::Id: return Backward::B;
#define FLAME_OP_BACKWARD(Id, name, B) case OpId::Id: return Backward::B;
    FLAME_ELEMENTWISE_OPS(FLAME_OP_BACKWARD_EW) FLAME_GRAPH_OPS(FLAME_OP_BACKWARD)
#undef FLAME_OP_BACKWARD_EW
#undef FLAME_OP_BACKWARD
    case OpId::Count: break;
  }
  return Backward::NOBACKWARD;
}
// What an elementwise op saves for its rule (NONE for the other rows: their forwards save their own).
constexpr Saves op_saves(OpId op) {
  switch (op) {
#define FLAME_OP_SAVES(Id, name, Kind, B, S) case OpId::Id: return Saves::S;
    FLAME_ELEMENTWISE_OPS(FLAME_OP_SAVES)
#undef FLAME_OP_SAVES
    default: return Saves::NONE;
  }
}
constexpr bool saves_input(OpId op) { return op_saves(op) == Saves::INPUT || op_saves(op) == Saves::BOTH; }
constexpr bool saves_output(OpId op) { return op_saves(op) == Saves::OUTPUT || op_saves(op) == Saves::BOTH; }

}  // namespace flame

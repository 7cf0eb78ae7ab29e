// Losses (src/ops/loss.cpp, src/ops/loss_pointwise.cpp). cross_entropy and nll_loss are fused ops
// with kernels of their own (cuda/loss.cuh), and so are mse_loss and l1_loss with reduction mean or
// sum (cuda/loss_pointwise.cuh); their backward rules are in autograd/backward_rules.cpp. The others
// (and mse / l1 with reduction none) are compositions of FLAME ops, differentiable through their parts.
#pragma once
#include <vector>
#include "tensor/autograd_graph.h"
#include "tensor/tensor.h"

namespace flame::ops {

enum class Reduction { None = 0, Mean = 1, Sum = 2 };  // the values of flame_reduction_t

// weight may be null. Integer targets are class indices, floating targets class probabilities.
// f32_loss (autocast): the loss in f32 whatever the logits' dtype; f16/bf16 logits with class indices
// are read as they are (the kernels compute in f32), so nothing copies them to f32 first.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& weight, int64_t ignore_index,
                     double label_smoothing, Reduction reduction, bool f32_loss = false);
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const Tensor& weight, int64_t ignore_index,
                Reduction reduction);
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction);
Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction);
Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, double beta, Reduction reduction);
Tensor huber_loss(const Tensor& input, const Tensor& target, double delta, Reduction reduction);
// weight and pos_weight may be null.
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target, const Tensor& weight,
                                        const Tensor& pos_weight, Reduction reduction);

// ---- what the backward rules of the fused ops read back from their nodes ----
// Node layout (loss.cpp records it): inputs {x [M, C]} (+ {target [M, C]} for probabilities); the
// output is [M] (reduction none) or 0-d. A is the accumulation dtype (f32, or f64 for f64 logits).
struct LossSaved {
  Tensor x;           // the logits [M, C] (cross-entropy only)
  Tensor target;      // [M] class indices, or [M, C] probabilities
  Tensor weight;      // [C] in A, or null
  Tensor wsum;        // 0-d sum of weight in A (with weight)
  Tensor lse;         // [M] logsumexp of the rows in A (cross-entropy)
  Tensor wrow;        // [M] in A: the weight of each row's target, 0 when ignored (class indices)
  Tensor rowt;        // [M] in A: sum_c w_c t'_c (probabilities)
  Tensor denom;       // 0-d in A: the divisor of reduction mean (class indices), else null
  Tensor grad;        // [M, C] in x's dtype: the gradient for an upstream gradient of 1, when the forward wrote it
  int64_t ignore_index = -100;
  int64_t classes = 0;
  double eps = 0;     // label smoothing
  Reduction reduction = Reduction::Mean;
};
// Node attributes of CrossEntropy, CrossEntropyProbs and NllLoss.
struct LossAttrs {
  int64_t ignore_index = -100;
  Reduction reduction = Reduction::Mean;
  bool has_weight = false;  // weight and wsum are saved
  int64_t classes = 0;
  double eps = 0;
  bool saved_grad = false;  // the forward's gradient is saved last
};
LossSaved unpack_loss(Node& n);

// The fused backward kernels: the gradient of x given the gradient g of the node's output.
Tensor cross_entropy_backward(const LossSaved& s, const Tensor& g);
Tensor cross_entropy_probs_backward(const LossSaved& s, const Tensor& g);
Tensor nll_loss_backward(const LossSaved& s, const Tensor& g, DType x_dtype);

// The kernel names the loss ops can launch (for the CPU test that compiles every kernel).
std::vector<std::string> loss_instantiations();

// ---- mse_loss and l1_loss, reduction mean or sum (ops/loss_pointwise.cpp) ----
// Checks input and target of an elementwise loss (same context, floating, same shape); op names the
// loss in messages.
void check_loss_pair(const char* op, const Tensor& input, const Tensor& target);
// Node layout: op MseLoss or L1Loss, inputs {input, target} (contiguous; a non-contiguous argument
// went through a recorded copy), both saved; attributes PointwiseLossAttrs. The output is 0-d, in
// promote(input, target).
// The fused backward kernel: the gradients of input and target (each only where asked, else null;
// in its operand's dtype) for the gradient g of the node's output.
struct PointwiseLossAttrs {
  Reduction reduction = Reduction::Mean;
};
struct PointwiseLossGrads {
  Tensor input, target;
};
PointwiseLossGrads pointwise_loss_backward(OpId op, const Tensor& input, const Tensor& target, const Tensor& g,
                                           Reduction reduction, bool need_input, bool need_target);
std::vector<std::string> pointwise_loss_instantiations();

}  // namespace flame::ops

// Fused elementwise functions (flame_fused_compile / flame_fused_call): one parsed expression
// (ops/fused_expr.h) applied by one generated kernel (cuda/fused.cuh). A call broadcasts and
// promotes its inputs as the binary ops do (explicit Expand and Cast nodes) and records one Fused
// node, handing it its backward (Node::backward, which keeps the function alive): per input,
// another fused function of (g, x0, ...) computing g * d expr / d x_i, built once from the
// symbolic derivative and kept here; since that is a fused call too, gradients of any order work.
#pragma once
#include <cuda.h>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>
#include "tensor/autograd_graph.h"
#include "ops/fused_expr.h"
#include "runtime/kernel_key.h"
#include "tensor/tensor.h"

namespace flame::ops {

constexpr int kFusedMaxInputs = 8;     // FLAME_FUSED_MAX_INPUTS of flame.h
constexpr int kFusedMaxOperands = 16;  // operands of one kernel (cuda/fused.cuh); each order of derivative may add g

class FusedFn : public std::enable_shared_from_this<FusedFn> {
 public:
  // Parses text over n_inputs inputs (1 to kFusedMaxInputs) and simplifies it. No kernel is
  // compiled until a call needs one (per dtype and layout, through the context's cache).
  static std::shared_ptr<FusedFn> compile(Context& ctx, const std::string& text, int n_inputs);
  FusedFn(Context& ctx, fused::Expr e, int n_inputs);

  Context& ctx() const { return *ctx_; }
  int n_inputs() const { return n_; }
  const fused::Expr& expr() const { return expr_; }
  const std::string& source() const { return source_; }

  // expr applied elementwise to the broadcast inputs; floating inputs promote as binary ops,
  // integer and bool inputs compute in f32. Recorded (one Fused node) when an input requires grad.
  Tensor call(const std::vector<Tensor>& inputs);

  // The gradient of input i of a Fused node of this function: g * d expr / d x_i, with xs the
  // node's inputs (null where not saved). g itself when the derivative is 1, zeros when it is 0.
  Tensor input_grad(int i, const Tensor& g, const std::vector<Tensor>& xs);
  // The backward of a Fused node of this function (its Node::backward): the saved inputs
  // (FusedAttrs: which input each saved tensor is) and g give input_grad of every input that needs one.
  std::vector<Tensor> node_backward(Node& n, const Tensor& g);

 private:
  struct Grad {
    fused::Expr expr;              // over 0 = g, k + 1 = x_k, simplified
    std::vector<int> uses;         // the operands it reads, in that numbering
    std::shared_ptr<FusedFn> fn;   // over the used operands only; null for 0 and for g itself
    std::vector<int> reads;        // the x_k among uses
  };
  const Grad& grad(int i);
  void launch(const Tensor& out, const std::vector<Tensor>& ins);
  // Its kernels by key (no text argument), compiled behind this function's source on first use.
  CUfunction function(const KernelKey& key);

  std::shared_ptr<Context> ctx_;
  fused::Expr expr_;
  int n_;
  std::string source_;
  std::vector<std::unique_ptr<Grad>> grads_;
  std::unordered_map<KernelKey, CUfunction, KernelKeyHash> functions_;
};

struct FusedAttrs {  // node attributes of Fused
  std::vector<size_t> saved_inputs;  // the input number of each saved tensor
};
// The kernels a fused function may launch for element type dtype (tests/cpu/test_kernels.cpp).
std::vector<std::string> fused_instantiations(DType dtype);

}  // namespace flame::ops

// The op list's test coverage, in one test over every row of src/tensor/op_list.h: an op with a
// backward rule (Backward RULE) has a gradient-check row (finite differences, gradcheck.h) in some
// table of this suite, and an op marked NONDIFF has a not-differentiable row (test_gradcheck.cpp).
// Ops marked NOBACKWARD (fused backward kernels) are checked through the rules that call them, and
// the few differentiable ops that no finite-difference row can reach are listed with the test that
// checks their gradients (checked_elsewhere).
// Every table registers what it covers at static initialisation (gc::register_covers;
// FLAME_GRADCHECK_SUITES does it for its rows), so this test needs no GPU.
// The CPU half (every op has a rule or a mark) is tests/cpu/test_op_coverage.cpp.
#include <map>
#include <string>
#include <vector>

#include "../../src/tensor/op_list.h"
#include "gradcheck.h"

namespace {

struct ListedOp {
  std::string name;
  flame::Backward backward;
};

std::vector<ListedOp> listed_ops() {
  return {
#define OP_EW(Id, name, Kind, B, S) {#name, flame::Backward::B},
#define OP_GRAPH(Id, name, B) {#name, flame::Backward::B},
      FLAME_ELEMENTWISE_OPS(OP_EW) FLAME_GRAPH_OPS(OP_GRAPH)
#undef OP_EW
#undef OP_GRAPH
  };
}

// Differentiable ops whose gradients are checked by other tests than a finite-difference row, each
// with the test that does it. An entry here for an op that has a row fails the test too.
const std::map<std::string, std::string>& checked_elsewhere() {
  static const std::map<std::string, std::string> m = {
      {"gelu_tanh_deriv", "reached only at third order (a node of gelu_tanh_backward's rule); its formula, "
                          "gelu_tanh_second, is the one the gelu_tanh row's second-order check runs"},
      {"scaled_dot_product_attention", "f16/bf16 only: test_attention.cpp AttentionVsReference.ForwardAndGradients "
                                       "(host reference) and Attention.CreateGraphComposesTheBackwardAndDifferentiatesIt"},
      {"checkpoint", "test_checkpoint.cpp: the same gradients as without checkpointing, several outputs, hooks"},
      {"shard_gather", "test_zero3.cpp: a model trained with sharded parameters (ZeRO-3) equals the replicated run"},
      {"quantized_linear", "no C entry point (the fp8 base of the model layer): tests/gpu/models/test_quantized_linear.cpp "
                           "QuantizedOps.LinearEqualsLinearOverTheDequantizedWeight (x and bias gradients against "
                           "linear over the dequantised weight) and ...UnderCreateGraph; LoRA gradients through "
                           "models in test_model_quantized.cpp"},
      {"nf4_linear", "no C entry point (the NF4 base of the model layer): tests/gpu/models/test_nf4.cpp "
                     "Nf4Ops.LinearEqualsLinearOverTheDequantizedWeight (x and bias gradients against linear over the "
                     "dequantised weight) and ...UnderCreateGraph; LoRA gradients through models in test_model_nf4.cpp"},
  };
  return m;
}

TEST(OpCoverage, EveryOpHasAGradientCheckOrNotDifferentiableRow) {
  const std::vector<ListedOp> ops = listed_ops();
  ASSERT_EQ(ops.size(), static_cast<size_t>(flame::kNumOps));
  const auto& checked = gc::gradchecked_ops();
  const auto& nondiff = gc::not_differentiable_ops();
  for (const ListedOp& op : ops) {
    const bool c = checked.count(op.name) > 0, n = nondiff.count(op.name) > 0;
    switch (op.backward) {
      case flame::Backward::RULE:
        EXPECT_NE(c, checked_elsewhere().count(op.name) > 0)
            << "op '" << op.name << "' has a backward rule: it needs a gradient-check row (or, without one, an "
            << "entry in checked_elsewhere(), not both)";
        EXPECT_FALSE(n) << "op '" << op.name << "' has a backward rule but a not-differentiable row";
        break;
      case flame::Backward::NONDIFF:
        EXPECT_TRUE(n) << "op '" << op.name << "' is marked NONDIFF but has no not-differentiable row";
        EXPECT_FALSE(c) << "op '" << op.name << "' is marked NONDIFF but has a gradient-check row";
        break;
      case flame::Backward::NOBACKWARD:
        EXPECT_FALSE(c || n) << "op '" << op.name << "' is a fused backward kernel (NOBACKWARD) but has a row";
        break;
    }
  }
}

}  // namespace

// The op list's test coverage, in one test over every row of src/ops/op_list.h: an op with a
// backward rule (Backward RULE) has a gradient-check row (finite differences, gradcheck.h) in some
// table of this suite, and an op marked NONDIFF has a not-differentiable row (test_gradcheck.cpp).
// Ops marked NOBACKWARD (fused backward kernels) are checked through the rules that call them.
// Every table registers what it covers at static initialisation (gc::register_covers;
// FLAME_GRADCHECK_SUITES does it for its rows), so this test needs no GPU.
// The CPU half (every op has a rule or a mark) is tests/cpu/test_op_coverage.cpp.
#include <string>
#include <vector>

#include "../../src/ops/op_list.h"
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

TEST(OpCoverage, EveryOpHasAGradientCheckOrNotDifferentiableRow) {
  const std::vector<ListedOp> ops = listed_ops();
  ASSERT_EQ(ops.size(), static_cast<size_t>(flame::kNumOps));
  const auto& checked = gc::gradchecked_ops();
  const auto& nondiff = gc::not_differentiable_ops();
  for (const ListedOp& op : ops) {
    const bool c = checked.count(op.name) > 0, n = nondiff.count(op.name) > 0;
    switch (op.backward) {
      case flame::Backward::RULE:
        EXPECT_TRUE(c) << "op '" << op.name << "' has a backward rule but no gradient-check row";
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

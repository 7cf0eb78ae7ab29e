// Every op of FLAME_NNOPS_OPS (src/ops/op_list.h) has a gradient-check row in one of the topic test
// files (test_nn_indexing.cpp, test_dropout.cpp, test_pooling.cpp, test_upsample.cpp, test_rope.cpp),
// which register what they cover in nnops_cover.h. Needs no GPU.
#include "../../src/ops/op_list.h"
#include "nnops_cover.h"

namespace {

TEST(NnopsCoverage, EveryNnopsOpHasAGradientCheckRow) {
#define NNOPS_OP(Id, name) \
  EXPECT_TRUE(nnops::covered().count(#name)) << "op '" #name "' of FLAME_NNOPS_OPS has no gradient-check row";
  FLAME_NNOPS_OPS(NNOPS_OP)
#undef NNOPS_OP
}

}  // namespace

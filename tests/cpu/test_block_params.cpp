// White-box tests (no GPU) of what parameter sharding and offload plan from: the blocks a model's
// first forward learns (src/models/block_params.*), and the ZeRO options' stage 3 rules
// (validate_zero_options, src/toolkit/zero.cpp).
#include <gtest/gtest.h>
#include <string>
#include <vector>
#include "core/error.h"
#include "models/block_params.h"
#include "toolkit/zero.h"

using namespace flame;
using namespace flame::models;

namespace {

// A learning forward: block 0 reads a and b, block 1 reads c and a again (a becomes shared), e is
// read outside blocks, block 2 nests block 3 (the innermost owns what it reads).
void learning_forward(BlockParams& bp) {
  bp.begin_forward();
  bp.record_use("e");
  {
    BlockLearnScope s(bp, 0);
    bp.record_use("a");
    bp.record_use("b");
    bp.record_use("b");
  }
  {
    BlockLearnScope s(bp, 1);
    bp.record_use("c");
    bp.record_use("a");
  }
  {
    BlockLearnScope s(bp, 2);
    bp.record_use("f");
    BlockLearnScope inner(bp, 3);
    bp.record_use("g");
  }
  bp.end_forward();
}

TEST(BlockParams, LearnsOwnersInTheFirstForwardOnly) {
  BlockParams bp;
  EXPECT_FALSE(bp.learning());
  EXPECT_FALSE(bp.learnt());
  learning_forward(bp);
  EXPECT_TRUE(bp.learnt());
  EXPECT_FALSE(bp.learning());
  ASSERT_EQ(bp.blocks().size(), 4u);
  EXPECT_EQ(bp.blocks()[0].index, 0);
  EXPECT_EQ(bp.blocks()[3].index, 3);
  EXPECT_EQ(bp.owner("a"), -1) << "read by two blocks: shared";
  EXPECT_EQ(bp.owner("b"), 0);
  EXPECT_EQ(bp.owner("c"), 1);
  EXPECT_EQ(bp.owner("e"), -1) << "read outside blocks";
  EXPECT_EQ(bp.owner("f"), 2);
  EXPECT_EQ(bp.owner("g"), 3) << "the innermost block owns it";
  EXPECT_EQ(bp.owner("never read"), -1);
  EXPECT_EQ(bp.owned(bp.blocks()[0]), std::vector<std::string>{"b"});
  EXPECT_EQ(bp.owned(bp.blocks()[1]), std::vector<std::string>{"c"});
  // A later forward reads differently: nothing is learnt any more.
  bp.begin_forward();
  EXPECT_FALSE(bp.learning());
  {
    BlockLearnScope s(bp, 7);
    bp.record_use("b");
  }
  bp.end_forward();
  EXPECT_EQ(bp.blocks().size(), 4u);
  EXPECT_EQ(bp.owner("b"), 0);
}

TEST(BlockParams, AFailedForwardLearnsAfreshNextTime) {
  BlockParams bp;
  bp.begin_forward();
  {
    BlockLearnScope s(bp, 5);
    bp.record_use("x");
  }
  // no end_forward: the forward failed half-way
  EXPECT_FALSE(bp.learnt());
  learning_forward(bp);
  EXPECT_TRUE(bp.learnt());
  EXPECT_EQ(bp.owner("x"), -1) << "the failed forward's blocks are forgotten";
  EXPECT_EQ(bp.blocks().size(), 4u);
}

flame_status_t zero_status(const flame_zero_options_t& o, std::string* message = nullptr) {
  try {
    validate_zero_options(o);
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.status();
  }
  return FLAME_OK;
}

flame_zero_options_t defaults() {
  flame_zero_options_t o{};
  o.struct_size = sizeof o;
  o.stage = 1;
  o.broadcast_parameters = 1;
  o.gather_slots = 2;
  return o;
}

TEST(ZeroOptions, StageThreeNeedsAModelAndOnlyStageThreeTakesOne) {
  flame_model_t fake = reinterpret_cast<flame_model_t>(static_cast<uintptr_t>(0x40));  // never read here
  flame_zero_options_t o = defaults();
  EXPECT_EQ(zero_status(o), FLAME_OK);
  o.stage = 3;
  std::string msg;
  EXPECT_EQ(zero_status(o, &msg), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(msg.find("opts->model"), std::string::npos) << msg;
  o.model = fake;
  EXPECT_EQ(zero_status(o), FLAME_OK);
  o.stage = 2;
  EXPECT_EQ(zero_status(o, &msg), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(msg.find("stage 3 only"), std::string::npos) << msg;
  o.stage = 4;
  EXPECT_EQ(zero_status(o), FLAME_ERROR_INVALID_ARGUMENT);
  o.stage = 3;
  for (int32_t slots : {1, 0, -2, 65}) {
    o.gather_slots = slots;
    EXPECT_EQ(zero_status(o, &msg), FLAME_ERROR_INVALID_ARGUMENT) << slots;
    EXPECT_NE(msg.find("gather_slots"), std::string::npos) << msg;
  }
  o.gather_slots = 64;
  EXPECT_EQ(zero_status(o), FLAME_OK);
}

}  // namespace

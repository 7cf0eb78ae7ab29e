// White-box tests (no GPU) of what parameter sharding and offload plan from: the blocks a model's
// first forward learns (src/models/block_params.*), and the ZeRO options' stage 3 rules
// (validate_zero_options, src/toolkit/zero.cpp), the communication dtypes included.
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
  o.reduce_dtype = FLAME_ZERO_PARAM_DTYPE;
  o.gather_dtype = FLAME_ZERO_PARAM_DTYPE;
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

// Mixed precision of communication: reduce in the parameters' dtype, f32 or bf16 at every stage;
// gather in the parameters' dtype, or bf16 at stage 3 only; every other value refused by name.
TEST(ZeroOptions, CommunicationDtypes) {
  flame_model_t fake = reinterpret_cast<flame_model_t>(static_cast<uintptr_t>(0x40));  // never read here
  flame_zero_options_t o = defaults();
  std::string msg;
  for (int32_t stage : {1, 2, 3}) {
    o.stage = stage;
    o.model = stage == 3 ? fake : nullptr;
    for (int32_t d : {FLAME_ZERO_PARAM_DTYPE, static_cast<int32_t>(FLAME_DTYPE_F32), static_cast<int32_t>(FLAME_DTYPE_BF16)}) {
      o.reduce_dtype = d;
      EXPECT_EQ(zero_status(o, &msg), FLAME_OK) << "stage " << stage << ", reduce_dtype " << d << ": " << msg;
    }
    for (int32_t d : {static_cast<int32_t>(FLAME_DTYPE_F16), static_cast<int32_t>(FLAME_DTYPE_F64),
                      static_cast<int32_t>(FLAME_DTYPE_I32), static_cast<int32_t>(FLAME_DTYPE_U8), -2, 99}) {
      o.reduce_dtype = d;
      EXPECT_EQ(zero_status(o, &msg), FLAME_ERROR_INVALID_ARGUMENT) << "reduce_dtype " << d;
      EXPECT_NE(msg.find("reduce_dtype"), std::string::npos) << msg;
    }
    o.reduce_dtype = FLAME_ZERO_PARAM_DTYPE;
    o.gather_dtype = FLAME_DTYPE_BF16;
    if (stage == 3) {
      EXPECT_EQ(zero_status(o, &msg), FLAME_OK) << msg;
    } else {
      EXPECT_EQ(zero_status(o, &msg), FLAME_ERROR_INVALID_ARGUMENT) << "gather_dtype bf16 at stage " << stage;
      EXPECT_NE(msg.find("stage 3 only"), std::string::npos) << msg;
    }
    for (int32_t d : {static_cast<int32_t>(FLAME_DTYPE_F32), static_cast<int32_t>(FLAME_DTYPE_F16), -2, 7}) {
      o.gather_dtype = d;
      EXPECT_EQ(zero_status(o, &msg), FLAME_ERROR_INVALID_ARGUMENT) << "gather_dtype " << d;
      EXPECT_NE(msg.find("gather_dtype"), std::string::npos) << msg;
    }
    o.gather_dtype = FLAME_ZERO_PARAM_DTYPE;
  }
}

}  // namespace

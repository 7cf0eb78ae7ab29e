// flame-train's epoch batches (training_data.h, plan_epoch_batches): host logic only, on samples
// whose tensors are empty (no GPU): equal shapes together, at most batch_size each, every sample
// once per epoch, the same plan for the same (seed, epoch) and another for another epoch.
#include <gtest/gtest.h>

#include <algorithm>

#include "training_data.h"

using namespace flame_train;

namespace {

std::vector<TrainingSample> samples_of(const std::vector<std::array<int64_t, 3>>& shapes) {
  std::vector<TrainingSample> v(shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    v[i].height = shapes[i][0];
    v[i].width = shapes[i][1];
    v[i].tokens = shapes[i][2];
  }
  return v;
}

}  // namespace

TEST(TrainerBatches, GroupedBoundedCompleteAndDeterministic) {
  const std::vector<TrainingSample> s = samples_of(
      {{16, 16, 8}, {16, 24, 8}, {16, 16, 8}, {16, 16, 8}, {16, 24, 8}, {16, 16, 8}, {16, 16, 77}, {16, 16, 8}});
  const auto plan = plan_epoch_batches(s, 2, 42, 0);
  std::vector<size_t> seen;
  for (const auto& batch : plan) {
    ASSERT_FALSE(batch.empty());
    ASSERT_LE(batch.size(), 2u);
    for (size_t i : batch) {
      EXPECT_EQ(s[i].height, s[batch[0]].height);
      EXPECT_EQ(s[i].width, s[batch[0]].width);
      EXPECT_EQ(s[i].tokens, s[batch[0]].tokens);
      seen.push_back(i);
    }
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<size_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(plan.size(), 5u);  // five of 16x16x8: 3 batches; two of 16x24: 1; one of T 77: 1
  EXPECT_EQ(plan, plan_epoch_batches(s, 2, 42, 0));
  bool differs = false;
  for (uint64_t e = 1; e < 6 && !differs; ++e) differs = plan_epoch_batches(s, 2, 42, e) != plan;
  EXPECT_TRUE(differs);
}

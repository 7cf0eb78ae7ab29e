// flame-train's epoch batches (training_data.h, plan_epoch_batches): host logic only, on samples
// whose tensors are empty (no GPU): equal shapes together, at most batch_size each, every sample
// once per epoch, the same plan for the same (seed, epoch) and another for another epoch; and the
// data-parallel split of a global batch among the GPUs (global_batch.h, batch_noise.h's keys, LoRA
// dropout's generator seeds).
#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>

#include "batch_noise.h"
#include "config.h"
#include "global_batch.h"
#include "random.h"
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

// Data parallel (global_batch.h): each rank's part of a global batch is contiguous, the parts are
// disjoint and cover it in rank order, the places are the parts' offsets, and the loss scales make
// the ranks' average of scaled part means the global batch's mean (short batches included, where a
// rank may get nothing).
TEST(TrainerGlobalBatch, RankSharesSplitTheGlobalBatchExactly) {
  for (int world = 1; world <= 4; ++world) {
    for (size_t k = 0; k <= 9; ++k) {
      std::vector<size_t> global(k);
      for (size_t i = 0; i < k; ++i) global[i] = 100 + 7 * i;
      std::vector<size_t> joined;
      double scaled_means = 0, global_mean = 0;
      for (size_t i = 0; i < k; ++i) global_mean += static_cast<double>(global[i]) / static_cast<double>(k);
      for (int r = 0; r < world; ++r) {
        const RankShare s = rank_share(global, r, world);
        EXPECT_EQ(s.first_position, joined.size()) << "world " << world << " k " << k << " rank " << r;
        joined.insert(joined.end(), s.batch.begin(), s.batch.end());
        double mean = 0;
        for (size_t i : s.batch) mean += static_cast<double>(i) / static_cast<double>(s.batch.size());
        if (!s.batch.empty()) scaled_means += s.loss_scale * mean / world;
        if (s.batch.empty()) EXPECT_EQ(s.loss_scale, 0.0);
        EXPECT_EQ(rank_share(global, r, world).batch, s.batch);  // deterministic
      }
      EXPECT_EQ(joined, global) << "world " << world << " k " << k;
      if (k > 0) EXPECT_NEAR(scaled_means, global_mean, 1e-9) << "world " << world << " k " << k;
    }
  }
  // Equal parts: every scale exactly 1 (the single-GPU loss is unchanged bit for bit).
  const std::vector<size_t> four = {3, 1, 2, 0};
  EXPECT_EQ(rank_share(four, 1, 2).batch, (std::vector<size_t>{2, 0}));
  EXPECT_EQ(rank_share(four, 1, 2).first_position, 2u);
  EXPECT_EQ(rank_share(four, 1, 2).loss_scale, 1.0);
  EXPECT_EQ(rank_share(four, 0, 1).loss_scale, 1.0);
  // A short global batch of 3 on 2 GPUs: 1 and 2 samples, scales 2/3 and 4/3.
  const std::vector<size_t> three = {5, 6, 7};
  EXPECT_EQ(rank_share(three, 0, 2).batch, (std::vector<size_t>{5}));
  EXPECT_DOUBLE_EQ(rank_share(three, 0, 2).loss_scale, 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(rank_share(three, 1, 2).loss_scale, 4.0 / 3.0);
  EXPECT_THROW(rank_share(four, 2, 2), std::invalid_argument);
  EXPECT_THROW(rank_share(four, 0, 0), std::invalid_argument);
}

// The random-stream item of a sample depends on the micro-step and its place in the global batch
// only: sample 1 of rank 0's batch at place 0 and sample 0 of rank 1's batch at place 1 share it.
TEST(TrainerGlobalBatch, SampleKeysFollowTheGlobalPlace) {
  EXPECT_EQ(batch_sample_item(BatchPlace{5, 0, 0}, 1), batch_sample_item(BatchPlace{5, 0, 1}, 0));
  EXPECT_EQ(batch_sample_item(BatchPlace{5, 2, 3}, 1), 2u * 65536u + 4u);
  // The last position of the largest global batch stays below the next micro-step's first.
  EXPECT_LT(batch_sample_item(BatchPlace{5, 0, static_cast<uint64_t>(kMaxGlobalBatch) - 1}, 0),
            batch_sample_item(BatchPlace{5, 1, 0}, 0));
  EXPECT_NE(batch_sample_item(BatchPlace{5, 1, 0}, 0), batch_sample_item(BatchPlace{5, 0, 0}, 0));
}

// LoRA dropout's generator seed: two ranks of one micro-step (batches starting at 0 and at 2) draw
// different masks; the same place gives the same seed (a resumed run draws the same masks); the step,
// the micro-step and the run's seed each change it; and it is not the noise key of the same place.
TEST(TrainerGlobalBatch, DropoutSeedsDifferPerRankAndRepeatPerPlace) {
  const BatchPlace rank0{7, 1, 0}, rank1{7, 1, 2};
  EXPECT_NE(dropout_generator_seed(42, rank0), dropout_generator_seed(42, rank1));
  EXPECT_EQ(dropout_generator_seed(42, rank1), dropout_generator_seed(42, BatchPlace{7, 1, 2}));
  EXPECT_NE(dropout_generator_seed(42, rank0), dropout_generator_seed(42, BatchPlace{8, 1, 0}));
  EXPECT_NE(dropout_generator_seed(42, rank0), dropout_generator_seed(42, BatchPlace{7, 0, 0}));
  EXPECT_NE(dropout_generator_seed(42, rank0), dropout_generator_seed(43, rank0));
  EXPECT_NE(dropout_generator_seed(42, rank0),
            RandomStream(42, RandomPurpose::Noise, 7, batch_sample_item(rank0, 0)).next_u64());
}

// Checkpoints of ZeRO-3 training (flame_zero_save_shards, flame_zero_save_full, flame_zero_load):
// a tiny Flux transformer trained with its block parameters sharded over 2 ranks is saved as a
// shard set and as a gathered file; one rank with the model unsharded (stage 1) loads either and
// holds exactly the gathered parameters, and its next step on the same global batch equals the
// 2-rank sharded step within f32 rounding. The gathered file's param.<i> are the values
// flame_zero_gather_params returns.
// The same on one rank (stage 3 over a world of 1) runs on one GPU.
// Ranks run as in test_zero3.cpp. The 2-rank test skips with fewer than 2 GPUs unless
// FLAME_REQUIRE_GPUS=2.
//
// On a 2-GPU machine:
//   FLAME_REQUIRE_GPU=1 FLAME_REQUIRE_GPUS=2 ./build/tests/gpu/flame_gpu_tests --gtest_filter='Zero3Checkpoint*'
#include <unistd.h>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>
#include "flame_test.h"
#include "rank_test_helpers.h"
#include "model_test_handles.h"
#include "zero_test_helpers.h"

namespace {

void expect_close(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t k = 0; k < want.size() && bad < 5; ++k)
    if (!(std::fabs(got[k] - want[k]) <= 1e-6 + 1e-4 * std::fabs(want[k]))) {  // f32: summation orders
      ADD_FAILURE() << what << ": element " << k << " is " << got[k] << ", expected " << want[k];
      ++bad;
    }
}

constexpr int kSteps = 2;

// One training step of the global batch (2 parts) on rank `rank` of `world` (1 or 2): on 2 ranks
// rank r's part, on 1 rank both parts as two backwards of half the loss each.
void train_step(flame_ctx_t ctx, flame_model_t m, flame_optimizer_t opt, flame_zero_t zero, int world, int rank, int step) {
  zero_train_step(zero, opt, world, rank, [&](int part, double scale) { return flux_backward(ctx, m, part, step, scale); });
}

struct ShardedRun {
  std::vector<double> saved, next;  // rank 0's gathered parameters at the save and one step later
};

// Trains the model with stage 3 on `world` ranks for kSteps steps, saves the shard set dir/ck and
// the gathered file dir/full.safetensors, and steps once more.
ShardedRun train_sharded_and_save(int world, const std::string& dir) {
  ShardedRun out;
  RankWorld w(world);
  EXPECT_TRUE(w.ok());
  if (!w.ok()) return out;
  on_ranks(world, [&](int r) {
    flame_ctx_t ctx = w.ctxs[static_cast<size_t>(r)];
    ModelHandle m;
    ParamsHandle params;
    ASSERT_TRUE(make_flux_model(ctx, 12345, m, params));
    flame_optimizer_t opt = make_flux_adamw(ctx, params.p);
    ASSERT_NE(opt, nullptr) << flame_last_error_message();
    ASSERT_EQ(learning_forward(ctx, m.m), FLAME_OK) << flame_last_error_message();
    flame_zero_options_t o;
    flame_zero_options_init(&o);
    o.stage = 3;
    o.model = m.m;
    flame_zero_t zero = nullptr;
    ASSERT_EQ(flame_zero_create(w.comms[static_cast<size_t>(r)], opt, &o, &zero), FLAME_OK) << flame_last_error_message();
    for (int s = 0; s <= kSteps; ++s) {
      if (s == kSteps) {
        EXPECT_EQ(flame_zero_save_shards(zero, (dir + "/ck").c_str()), FLAME_OK) << flame_last_error_message();
        EXPECT_EQ(flame_zero_save_full(zero, (dir + "/full.safetensors").c_str()), FLAME_OK) << flame_last_error_message();
        ParamsHandle whole;
        EXPECT_EQ(flame_zero_gather_params(zero, &whole.p), FLAME_OK) << flame_last_error_message();
        if (r == 0 && whole.p) out.saved = values_of(whole.p);
      }
      train_step(ctx, m.m, opt, zero, world, r, s);
    }
    ParamsHandle whole;
    EXPECT_EQ(flame_zero_gather_params(zero, &whole.p), FLAME_OK) << flame_last_error_message();
    if (r == 0 && whole.p) out.next = values_of(whole.p);
    flame_zero_release(zero);
    flame_optimizer_release(opt);
  });
  return out;
}

// The gathered file holds what flame_zero_gather_params returned, parameter by parameter; one rank
// with the model unsharded (stage 1) loads the shard file `shard_file` and the gathered file, holds
// exactly the saved parameters and steps as the sharded run did.
void expect_resumes_unsharded(const std::string& dir, const std::string& shard_file, const ShardedRun& run) {
  ASSERT_FALSE(run.saved.empty());
  ASSERT_FALSE(run.next.empty());
  RankWorld one(1);
  ASSERT_TRUE(one.ok());
  flame_ctx_t ctx = one.ctxs[0];
  {
    flame_safetensors_t f = nullptr;
    ASSERT_EQ(flame_safetensors_load(ctx, (dir + "/full.safetensors").c_str(), &f), FLAME_OK) << flame_last_error_message();
    std::vector<double> file_values;
    for (int64_t i = 0;; ++i) {
      T t;
      if (flame_safetensors_get(f, ("param." + std::to_string(i)).c_str(), t.out()) != FLAME_OK) break;
      for (float x : host_of(t)) file_values.push_back(x);
    }
    EXPECT_EQ(file_values, run.saved);
    flame_safetensors_release(f);
  }
  for (const std::string& path : {dir + "/" + shard_file, dir + "/full.safetensors"}) {
    SCOPED_TRACE(path);
    ModelHandle m;
    ParamsHandle params;
    ASSERT_TRUE(make_flux_model(ctx, 777, m, params));  // other values: the load must replace them
    flame_optimizer_t opt = make_flux_adamw(ctx, params.p);
    flame_zero_options_t o;
    flame_zero_options_init(&o);
    flame_zero_t zero = nullptr;
    ASSERT_EQ(flame_zero_create(one.comms[0], opt, &o, &zero), FLAME_OK) << flame_last_error_message();
    EXPECT_EQ(flame_zero_load(zero, path.c_str()), FLAME_OK) << flame_last_error_message();
    int64_t count = -1;
    EXPECT_EQ(flame_optimizer_step_count(opt, &count), FLAME_OK);
    EXPECT_EQ(count, kSteps);
    EXPECT_EQ(values_of(params.p), run.saved) << "the loaded parameters must be the saved ones bit for bit";
    train_step(ctx, m.m, opt, zero, 1, 0, kSteps);
    expect_close(values_of(params.p), run.next, "the step after loading");
    flame_zero_release(zero);
    flame_optimizer_release(opt);
  }
}

std::string temp_dir() {
  char tmpl[] = "/tmp/flame_zero3_ckpt_XXXXXX";
  const char* d = mkdtemp(tmpl);
  return d ? std::string(d) : std::string("/tmp");
}

}  // namespace

TEST(Zero3Checkpoint, ShardedOnTwoRanksResumesUnshardedOnOne) {
  NEED_GPUS_AND_NCCL(2);
  const std::string dir = temp_dir();
  const ShardedRun run = train_sharded_and_save(2, dir);
  expect_resumes_unsharded(dir, "ck-1-of-2.safetensors", run);
}

// The same on one GPU: stage 3 on one rank (each block's shard is the whole block) saves a 1-file
// set and a gathered file, and the unsharded model resumes from either.
TEST(Zero3Checkpoint, ShardedOnOneRankResumesUnsharded) {
  NEED_GPUS_AND_NCCL(1);
  const std::string dir = temp_dir();
  const ShardedRun run = train_sharded_and_save(1, dir);
  expect_resumes_unsharded(dir, "ck-0-of-1.safetensors", run);
}

// One GPU: flame_zero_load into a running stage-3 helper whose blocks are still gathered (a
// forward after the last step leaves blocks in the ring) makes them stale: the loaded values are
// what the next forward computes with, so the step after the load repeats the step after the save.
// With gather_dtype bf16 the bf16 copies of the shards are made again from the loaded values too.
static void expect_load_into_running_helper(int32_t gather_dtype) {
  const std::string dir = temp_dir();
  RankWorld w(1);
  ASSERT_TRUE(w.ok());
  flame_ctx_t ctx = w.ctxs[0];
  ModelHandle m;
  ParamsHandle params;
  ASSERT_TRUE(make_flux_model(ctx, 12345, m, params));
  flame_optimizer_t opt = make_flux_adamw(ctx, params.p);
  ASSERT_NE(opt, nullptr) << flame_last_error_message();
  ASSERT_EQ(learning_forward(ctx, m.m), FLAME_OK) << flame_last_error_message();
  flame_zero_options_t o;
  flame_zero_options_init(&o);
  o.stage = 3;
  o.model = m.m;
  o.gather_dtype = gather_dtype;
  flame_zero_t zero = nullptr;
  ASSERT_EQ(flame_zero_create(w.comms[0], opt, &o, &zero), FLAME_OK) << flame_last_error_message();
  auto gathered = [&] {
    ParamsHandle whole;
    EXPECT_EQ(flame_zero_gather_params(zero, &whole.p), FLAME_OK) << flame_last_error_message();
    return whole.p ? values_of(whole.p) : std::vector<double>{};
  };
  for (int s = 0; s < kSteps; ++s) train_step(ctx, m.m, opt, zero, 1, 0, s);
  EXPECT_EQ(flame_zero_save_shards(zero, (dir + "/ck").c_str()), FLAME_OK) << flame_last_error_message();
  const std::vector<double> saved = gathered();
  train_step(ctx, m.m, opt, zero, 1, 0, kSteps);
  const std::vector<double> next = gathered();
  train_step(ctx, m.m, opt, zero, 1, 0, kSteps + 1);
  // A forward after the step (an evaluation, gradients off) leaves blocks of the current values
  // gathered in the ring; the load must not let the next forward reuse them.
  ASSERT_EQ(learning_forward(ctx, m.m), FLAME_OK) << flame_last_error_message();
  EXPECT_EQ(flame_zero_load(zero, (dir + "/ck-0-of-1.safetensors").c_str()), FLAME_OK) << flame_last_error_message();
  EXPECT_EQ(gathered(), saved) << "the loaded shards are the saved ones bit for bit";
  train_step(ctx, m.m, opt, zero, 1, 0, kSteps);
  expect_close(gathered(), next, "the step after loading into the running helper");
  flame_zero_release(zero);
  flame_optimizer_release(opt);
}

TEST(Zero3Checkpoint, LoadIntoARunningShardedModelGathersItsBlocksAgain) {
  NEED_GPUS_AND_NCCL(1);
  for (int32_t gather : {FLAME_ZERO_PARAM_DTYPE, static_cast<int32_t>(FLAME_DTYPE_BF16)}) {
    SCOPED_TRACE("gather_dtype " + std::to_string(gather));
    expect_load_into_running_helper(gather);
  }
}

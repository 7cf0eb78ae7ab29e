// Checkpoints of sharded training (flame_zero_save_full, flame_zero_save_shards, flame_zero_load):
// a shard set saved on 2 ranks loads on 1 and one saved on 1 loads on 2, giving the same parameters
// and the same next step; the gathered file holds the replicated run's parameters.
//
// Ranks run as in test_zero.cpp (rank_test_helpers.h): one context per GPU, one thread per rank, in one process. The same
// global batch is used whatever the world size: on 2 ranks rank r's rows, on 1 rank both ranks'
// rows as two backwards of half the loss each (the same averaged gradient). OneRankSavesAndLoads
// and OneRankRefuses... run on one GPU; the tests that use two ranks skip with fewer GPUs unless
// FLAME_REQUIRE_GPUS=2 (then they fail).
//
// On a 2-GPU machine:
//   FLAME_REQUIRE_GPU=1 FLAME_REQUIRE_GPUS=2 ./build/tests/gpu/flame_gpu_tests --gtest_filter='ZeroCheckpoint*'
#include <unistd.h>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>
#include "flame_test.h"
#include "rank_test_helpers.h"
#include "zero_test_helpers.h"

namespace {

// The MLP (zero_test_helpers.h) with 229 bf16 parameters (f32 master weights): on 2 ranks the
// shard boundary (115) cuts W1.
constexpr flame_dtype_t kDtype = FLAME_DTYPE_BF16;

// One training step of the global batch (2 parts) on rank `rank` of `world` (1 or 2).
void train_step(flame_ctx_t ctx, const Mlp& m, flame_optimizer_t opt, flame_zero_t zero, int world, int rank, int step) {
  zero_train_step(zero, opt, world, rank, [&](int part, double scale) { return mlp_backward(ctx, m, kDtype, part, step, scale); });
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t k = 0; k < want.size() && bad < 5; ++k)
    // bf16 parameters: another summation order of the averaged gradient may flip the last bit.
    if (!(std::fabs(got[k] - want[k]) <= 1e-3 + 8e-3 * std::fabs(want[k]))) {
      ADD_FAILURE() << what << ": element " << k << " is " << got[k] << ", expected " << want[k];
      ++bad;
    }
}

std::string temp_dir() {
  char tmpl[] = "/tmp/flame_zero_ckpt_XXXXXX";
  const char* d = mkdtemp(tmpl);
  return d ? std::string(d) : std::string("/tmp");
}

struct Trained {
  std::vector<double> saved;  // the parameters when the checkpoint was written (rank 0)
  std::vector<double> next;   // after one more step (rank 0)
};

// Trains `steps` steps on `world` ranks with `stage` (0: from the checkpoint `load` first, without
// training before it), saves (shards to prefix, gathered to full) after them, then one more step.
// With `load` set: loads it right after creation instead of training, checks the step count.
Trained run(int world, int stage, int steps, const std::string& load, const std::string& prefix, const std::string& full) {
  RankWorld w(world);
  EXPECT_TRUE(w.ok());
  Trained out;
  if (!w.ok()) return out;
  on_ranks(world, [&](int r) {
    flame_ctx_t ctx = w.ctxs[static_cast<size_t>(r)];
    Mlp m;
    ASSERT_TRUE(make_mlp(ctx, m, kDtype, load.empty() ? 0u : 50u));
    flame_optimizer_t opt = make_mlp_adamw(ctx, m, true);
    ASSERT_NE(opt, nullptr);
    flame_zero_options_t o;
    flame_zero_options_init(&o);
    o.stage = stage;
    flame_zero_t zero = nullptr;
    ASSERT_EQ(flame_zero_create(w.comms[static_cast<size_t>(r)], opt, &o, &zero), FLAME_OK) << flame_last_error_message();
    if (!load.empty()) {
      EXPECT_EQ(flame_zero_load(zero, load.c_str()), FLAME_OK) << flame_last_error_message();
      int64_t count = -1;
      EXPECT_EQ(flame_optimizer_step_count(opt, &count), FLAME_OK);
      EXPECT_EQ(count, steps);
    } else {
      for (int s = 0; s < steps; ++s) train_step(ctx, m, opt, zero, world, r, s);
    }
    if (!prefix.empty()) {
      EXPECT_EQ(flame_zero_save_shards(zero, prefix.c_str()), FLAME_OK) << flame_last_error_message();
    }
    if (!full.empty()) {
      EXPECT_EQ(flame_zero_save_full(zero, full.c_str()), FLAME_OK) << flame_last_error_message();
    }
    std::vector<double> saved = mlp_values(m);
    train_step(ctx, m, opt, zero, world, r, steps);
    std::vector<double> next = mlp_values(m);
    if (r == 0) {
      out.saved = saved;
      out.next = next;
    }
    flame_zero_release(zero);
    flame_optimizer_release(opt);
  });
  return out;
}

}  // namespace

// One GPU: saved on 1 rank (stage 2), loaded on 1 rank (stage 1) from the 1-file set and from the
// gathered file: the same parameters bit for bit, then the same step.
TEST(ZeroCheckpoint, OneRankSavesAndLoads) {
  NEED_GPUS_AND_NCCL(1);
  const std::string dir = temp_dir();
  const Trained saved = run(1, 2, 3, "", dir + "/ck", dir + "/full.safetensors");
  ASSERT_FALSE(saved.saved.empty());
  for (const std::string& path : {dir + "/ck-0-of-1.safetensors", dir + "/full.safetensors"}) {
    SCOPED_TRACE(path);
    const Trained loaded = run(1, 1, 3, path, "", "");
    EXPECT_EQ(loaded.saved, saved.saved) << "the loaded parameters must be the saved ones bit for bit";
    expect_close(loaded.next, saved.next, "the step after loading");
  }
}

// One GPU: a 1-rank file loaded into an optimizer of another kind, or a path that does not exist,
// is refused and changes neither the parameters nor the step count.
TEST(ZeroCheckpoint, OneRankRefusesAnotherOptimizerAndLeavesTheRunUnchanged) {
  NEED_GPUS_AND_NCCL(1);
  const std::string dir = temp_dir();
  run(1, 1, 1, "", dir + "/ck", "");
  RankWorld w(1);
  ASSERT_TRUE(w.ok());
  flame_ctx_t ctx = w.ctxs[0];
  Mlp m;
  ASSERT_TRUE(make_mlp(ctx, m, kDtype, 50));
  flame_optimizer_options_t oo;
  flame_optimizer_options_init(&oo, FLAME_OPTIMIZER_SGD);
  oo.lr = 0.02;
  oo.master_weights = 1;
  std::vector<flame_tensor_t> ps = m.params();
  flame_optimizer_t opt = nullptr;
  ASSERT_EQ(flame_optimizer_create(ctx, &oo, ps.data(), static_cast<int64_t>(ps.size()), &opt), FLAME_OK)
      << flame_last_error_message();
  flame_zero_options_t o;
  flame_zero_options_init(&o);
  flame_zero_t zero = nullptr;
  ASSERT_EQ(flame_zero_create(w.comms[0], opt, &o, &zero), FLAME_OK) << flame_last_error_message();
  const std::vector<double> before = mlp_values(m);
  EXPECT_EQ(flame_zero_load(zero, (dir + "/ck-0-of-1.safetensors").c_str()), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("adamw"), std::string::npos) << flame_last_error_message();
  EXPECT_EQ(mlp_values(m), before);
  int64_t count = -1;
  EXPECT_EQ(flame_optimizer_step_count(opt, &count), FLAME_OK);
  EXPECT_EQ(count, 0);
  EXPECT_EQ(flame_zero_load(zero, (dir + "/nothing.safetensors").c_str()), FLAME_ERROR_IO);
  EXPECT_EQ(mlp_values(m), before);
  flame_zero_release(zero);
  flame_optimizer_release(opt);
}

// Saved on 2 ranks (stage 2), loaded on 1 (stage 1): the same parameters, then the same step.
TEST(ZeroCheckpoint, TwoRanksSaveOneRankLoads) {
  NEED_GPUS_AND_NCCL(2);
  const std::string dir = temp_dir();
  const Trained two = run(2, 2, 3, "", dir + "/ck", dir + "/full.safetensors");
  ASSERT_FALSE(two.saved.empty());
  for (const std::string& path : {dir + "/ck-1-of-2.safetensors", dir + "/full.safetensors"}) {
    SCOPED_TRACE(path);
    const Trained one = run(1, 1, 3, path, "", "");
    EXPECT_EQ(one.saved, two.saved) << "the loaded parameters must be the saved ones bit for bit";
    expect_close(one.next, two.next, "the step after loading");
  }
}

// Saved on 1 rank, loaded on 2 (stage 2, and stage 1 from the gathered file).
TEST(ZeroCheckpoint, OneRankSavesTwoRanksLoad) {
  NEED_GPUS_AND_NCCL(2);
  const std::string dir = temp_dir();
  const Trained one = run(1, 1, 3, "", dir + "/ck", dir + "/full.safetensors");
  ASSERT_FALSE(one.saved.empty());
  const Trained two = run(2, 2, 3, dir + "/ck-0-of-1.safetensors", "", "");
  EXPECT_EQ(two.saved, one.saved);
  expect_close(two.next, one.next, "the step after loading (stage 2)");
  const Trained two_full = run(2, 1, 3, dir + "/full.safetensors", "", "");
  EXPECT_EQ(two_full.saved, one.saved);
  expect_close(two_full.next, one.next, "the step after loading (stage 1)");
}

// The gathered file of a 2-rank sharded run holds its parameters (which every rank holds after the
// all-gather) bit for bit, in their shapes, and the replicated run's within bf16 rounding; its
// master weights round to the parameters.
TEST(ZeroCheckpoint, GatheredFileHoldsTheParameters) {
  NEED_GPUS_AND_NCCL(2);
  const std::string dir = temp_dir();
  const std::string full = dir + "/full.safetensors";
  const Trained sharded = run(2, 2, 3, "", "", full);
  ASSERT_FALSE(sharded.saved.empty());
  // The replicated reference: one rank, the same global batch, no sharding at all.
  std::vector<double> replicated;
  {
    flame_ctx_t ctx = make_rank_ctx(0);
    ASSERT_NE(ctx, nullptr);
    {
      Mlp m;
      ASSERT_TRUE(make_mlp(ctx, m, kDtype, 0));
      flame_optimizer_t opt = make_mlp_adamw(ctx, m, true);
      for (int s = 0; s < 3; ++s) {
        for (int part = 0; part < 2; ++part) ASSERT_EQ(mlp_backward(ctx, m, kDtype, part, s, 0.5), FLAME_OK);
        ASSERT_EQ(flame_optimizer_step(opt), FLAME_OK) << flame_last_error_message();
        ASSERT_EQ(flame_optimizer_zero_grad(opt, 1), FLAME_OK);
      }
      replicated = mlp_values(m);
      flame_optimizer_release(opt);
    }
    flame_ctx_destroy(ctx);
  }
  flame_ctx_t ctx = make_rank_ctx(0);
  ASSERT_NE(ctx, nullptr);
  {
    flame_safetensors_t f = nullptr;
    ASSERT_EQ(flame_safetensors_load(ctx, full.c_str(), &f), FLAME_OK) << flame_last_error_message();
    std::vector<double> file_params;
    const std::vector<std::vector<int64_t>> shapes = {{kMlpHidden, kMlpIn}, {kMlpHidden}, {kMlpOut, kMlpHidden}, {kMlpOut}};
    for (int i = 0; i < 4; ++i) {
      const std::string name = "param." + std::to_string(i);
      T t, master, exp_avg;
      ASSERT_EQ(flame_safetensors_get(f, name.c_str(), t.out()), FLAME_OK) << flame_last_error_message();
      int32_t ndim = 0;
      int64_t shape[8];
      ASSERT_EQ(flame_tensor_ndim(t, &ndim), FLAME_OK);
      ASSERT_EQ(flame_tensor_shape(t, shape, 8), FLAME_OK);
      EXPECT_EQ(std::vector<int64_t>(shape, shape + ndim), shapes[static_cast<size_t>(i)]) << name;
      std::vector<double> v = to_doubles(t);
      file_params.insert(file_params.end(), v.begin(), v.end());
      ASSERT_EQ(flame_safetensors_get(f, ("master." + std::to_string(i)).c_str(), master.out()), FLAME_OK);
      ASSERT_EQ(flame_safetensors_get(f, ("state." + std::to_string(i) + ".exp_avg").c_str(), exp_avg.out()), FLAME_OK);
      T rounded;
      ASSERT_EQ(flame_to_dtype(master, kDtype, rounded.out()), FLAME_OK);
      EXPECT_EQ(to_doubles(rounded), v) << "master." << i << " must round to " << name;
    }
    EXPECT_EQ(file_params, sharded.saved);
    expect_close(file_params, replicated, "gathered file against the replicated run");
    flame_safetensors_release(f);
  }
  flame_ctx_destroy(ctx);
}

// A shard set with a file missing, or of another optimizer, is refused and changes nothing.
TEST(ZeroCheckpoint, RefusesIncompleteSetsAndLeavesTheRunUnchanged) {
  NEED_GPUS_AND_NCCL(2);
  const std::string dir = temp_dir();
  run(2, 2, 1, "", dir + "/ck", "");
  ASSERT_EQ(unlink((dir + "/ck-1-of-2.safetensors").c_str()), 0);
  RankWorld w(1);
  ASSERT_TRUE(w.ok());
  flame_ctx_t ctx = w.ctxs[0];
  Mlp m;
  ASSERT_TRUE(make_mlp(ctx, m, kDtype, 50));
  flame_optimizer_t opt = make_mlp_adamw(ctx, m, true);
  flame_zero_options_t o;
  flame_zero_options_init(&o);
  flame_zero_t zero = nullptr;
  ASSERT_EQ(flame_zero_create(w.comms[0], opt, &o, &zero), FLAME_OK) << flame_last_error_message();
  const std::vector<double> before = mlp_values(m);
  EXPECT_EQ(flame_zero_load(zero, (dir + "/ck-0-of-2.safetensors").c_str()), FLAME_ERROR_IO);
  EXPECT_EQ(mlp_values(m), before);
  int64_t count = -1;
  EXPECT_EQ(flame_optimizer_step_count(opt, &count), FLAME_OK);
  EXPECT_EQ(count, 0);
  EXPECT_EQ(flame_zero_load(zero, (dir + "/nothing.safetensors").c_str()), FLAME_ERROR_IO);
  flame_zero_release(zero);
  flame_optimizer_release(opt);
}

// flame-train data parallel (--gpus N, data_parallel.h) on two GPUs (label gpu; flame_trainer_gpu_tests):
// "two GPUs equal one with the same global batch". The Flux demo for 3 steps (seed 42):
//   two    --gpus 2 --training.batch_size=1   (a global batch of 2: one sample per GPU)
//   one    --gpus 1 --training.batch_size=2   (the same global batch of 2 on one GPU)
//   other  --gpus 1 --training.batch_size=1   (a control: global batch 1, other samples per step)
// Both runs of global batch 2 see the same samples in each step (plan_epoch_batches of size 2) with
// the same noise and timesteps (keyed by the place in the global batch: batch_noise.h), and the two
// ranks' averaged gradient is the one GPU's batch mean. What may differ is rounding only: the base is
// bf16, and a forward / backward of one sample runs GEMMs of other shapes (maybe other kernels, other
// summation orders) than one of two, so activations differ in the last bf16 bits (2^-8 relative);
// the adapter, its gradients and their all-reduce are f32. Hence:
//   - step 1's loss (the adapter's B is zero: the LoRA adds nothing yet, so the loss depends only on
//     the samples, their noise and timesteps) agrees within 2e-3 relative: a wrong noise or timestep
//     key or a wrong split of the global batch changes it by far more (the control's differs);
//   - steps 2 and 3 within 2e-2 relative, and every tensor of the final LoRA file within 5e-2
//     relative L2 (AdamW's first steps are close to lr * sign(gradient), so an element whose
//     gradient is within rounding of zero may step the other way: a few such elements, not more);
//   - the control's LoRA differs from the one GPU's by more than 4x that tolerance, so that the
//     comparison can fail.
// Both ranks end with the same adapter bits (flame-train compares their hashes and says so); rank 0
// alone writes: one JSONL log with one line per step, one LoRA file.
// Also: more GPUs than the machine has, and (two GPUs) no NCCL, are clear errors before any model loads.
// Skips without two GPUs or NCCL unless FLAME_REQUIRE_GPUS=2 (or FLAME_REQUIRE_GPU) makes that a failure.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "../gpu/rank_test_helpers.h"
#include "trainer_test_support.h"

namespace {

using flame_train_test::HostTensors;
using flame_train_test::logged_losses;
using flame_train_test::read_host_tensors;

constexpr int kSteps = 3;

flame_train_test::ProgramRun run_demo(const std::string& out, int gpus, int batch_size) {
  const std::string cmd = std::string("'") + FLAME_TRAIN_EXE + "' --demo --gpus " + std::to_string(gpus) +
                          " --training.batch_size=" + std::to_string(batch_size) +
                          " --training.max_train_steps=" + std::to_string(kSteps) + " --output.dir='" + out + "' 2>&1";
  return flame_train_test::run_shell(cmd);
}

// The largest relative L2 difference ||a - b|| / ||b|| over the tensors of two LoRA files (1e9 when
// their tensor names or sizes differ).
double max_relative_difference(const HostTensors& a, const HostTensors& b, std::string* worst) {
  if (a.values.size() != b.values.size()) return 1e9;
  double largest = 0;
  for (const auto& [name, want] : b.values) {
    const auto it = a.values.find(name);
    if (it == a.values.end() || it->second.size() != want.size()) return 1e9;
    double diff = 0, norm = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      diff += (static_cast<double>(it->second[i]) - want[i]) * (static_cast<double>(it->second[i]) - want[i]);
      norm += static_cast<double>(want[i]) * want[i];
    }
    const double rel = std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
    if (rel > largest) {
      largest = rel;
      *worst = name;
    }
  }
  return largest;
}

TEST(TrainerDataParallel, TwoGpusEqualOneWithTheSameGlobalBatch) {
  NEED_GPUS_AND_NCCL(2);
  flame_train_test::TempDir dir;
  const std::string two = dir.path() + "/two", one = dir.path() + "/one", other = dir.path() + "/other";
  const auto r2 = run_demo(two, 2, 1);
  ASSERT_EQ(r2.status, 0) << r2.output;
  EXPECT_NE(r2.output.find("data parallel: 2 GPUs"), std::string::npos) << r2.output;
  EXPECT_NE(r2.output.find("data parallel: the 2 ranks' adapters are identical"), std::string::npos) << r2.output;
  const auto r1 = run_demo(one, 1, 2);
  ASSERT_EQ(r1.status, 0) << r1.output;
  const auto rc = run_demo(other, 1, 1);
  ASSERT_EQ(rc.status, 0) << rc.output;

  const auto l2 = logged_losses(two + "/demo_lora.jsonl"), l1 = logged_losses(one + "/demo_lora.jsonl"),
             lc = logged_losses(other + "/demo_lora.jsonl");
  ASSERT_EQ(l2.size(), static_cast<size_t>(kSteps)) << "rank 0 alone logs, one line per step\n" << r2.output;
  ASSERT_EQ(l1.size(), static_cast<size_t>(kSteps)) << r1.output;
  ASSERT_EQ(lc.size(), static_cast<size_t>(kSteps)) << rc.output;
  for (int s = 0; s < kSteps; ++s) {
    const double want = l1[static_cast<size_t>(s)].second, got = l2[static_cast<size_t>(s)].second;
    std::printf("[ step %d ] loss: two GPUs %.7f, one GPU %.7f, control %.7f\n", s + 1, got, want,
                lc[static_cast<size_t>(s)].second);
    EXPECT_NEAR(got, want, (s == 0 ? 2e-3 : 2e-2) * std::fabs(want)) << "step " << s + 1;
  }

  const HostTensors a = read_host_tensors(two + "/demo_lora.safetensors"), b = read_host_tensors(one + "/demo_lora.safetensors"),
                    c = read_host_tensors(other + "/demo_lora.safetensors");
  ASSERT_TRUE(a.error.empty()) << a.error;
  ASSERT_TRUE(b.error.empty()) << b.error;
  ASSERT_TRUE(c.error.empty()) << c.error;
  ASSERT_FALSE(b.values.empty());
  std::string worst, worst_control;
  const double same = max_relative_difference(a, b, &worst);
  const double control = max_relative_difference(c, b, &worst_control);
  std::printf("[ lora ] largest relative L2 difference: two GPUs vs one %.3g (%s), control vs one %.3g (%s)\n", same,
              worst.c_str(), control, worst_control.c_str());
  EXPECT_LE(same, 5e-2) << worst;
  EXPECT_GT(control, 4 * 5e-2) << "the control run should differ: " << worst_control;
}

// More GPUs than the machine has: a clear error naming how many exist, exit status 1, no files
// (checked before NCCL is needed: any GPU machine runs it).
TEST(TrainerDataParallel, MoreGpusThanTheMachineHasIsAClearError) {
  const int have = device_count();
  if (have < 1) {
    if (flame_gpu_required() || required_gpus() > 0) FAIL() << "no GPU (FLAME_REQUIRE_GPU / FLAME_REQUIRE_GPUS set)";
    GTEST_SKIP() << "no GPU";
  }
  flame_train_test::TempDir dir;
  const auto r = run_demo(dir.path() + "/out", have + 1, 1);
  EXPECT_EQ(r.status, 1) << r.output;
  const std::string want = "this machine has " + std::to_string(have) + " GPU";
  EXPECT_NE(r.output.find(want), std::string::npos) << r.output;
  EXPECT_FALSE(std::ifstream(dir.path() + "/out/demo_lora.safetensors").good());
}

}  // namespace

namespace {

// Without NCCL (FLAME_NCCL_PATH naming a file that does not exist): a clear error naming NCCL and
// the loader's reason, exit status 1, before any model is loaded. Needs two GPUs (the GPU count is
// checked first), not NCCL.
TEST(TrainerDataParallel, WithoutNcclIsAClearError) {
  const int have = device_count();
  if (have < 2) {
    if (required_gpus() >= 2) FAIL() << "needs 2 GPUs (FLAME_REQUIRE_GPUS set), found " << have;
    GTEST_SKIP() << "needs 2 GPUs, found " << have;
  }
  flame_train_test::TempDir dir;
  const std::string cmd = std::string("FLAME_NCCL_PATH=/nonexistent/libnccl.so.2 '") + FLAME_TRAIN_EXE +
                          "' --demo --gpus 2 --training.max_train_steps=1 --output.dir='" + dir.path() + "/out' 2>&1";
  const auto r = flame_train_test::run_shell(cmd);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("trains through NCCL, which could not be loaded"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/libnccl.so.2"), std::string::npos) << r.output;  // the loader's reason
  EXPECT_EQ(r.output.find("training a"), std::string::npos) << "no model may be loaded\n" << r.output;
}

}  // namespace

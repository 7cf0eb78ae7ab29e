// flame-train, the program: --help, --dry-run, configuration and data errors (exit 1), and without
// a driver (FLAME_CUDA_DRIVER_PATH pointing nowhere) exit 2 with the library's message.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>

#include "config.h"
#include "image_writers.h"
#include "train_state.h"
#include "trainer_test_support.h"

using flame_train_test::ProgramRun;
using flame_train_test::TempDir;

namespace {

// Runs flame-train with args (each single-quoted for the shell) and no CUDA driver; output holds
// stdout and stderr together.
ProgramRun run_trainer(const std::vector<std::string>& args) {
  std::string cmd = "FLAME_CUDA_DRIVER_PATH=/nonexistent/libcuda.so.1 '" FLAME_TRAIN_EXE "'";
  for (const auto& a : args) {
    std::string quoted;
    for (char c : a) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    cmd += " '" + quoted + "'";
  }
  cmd += " 2>&1";
  return flame_train_test::run_shell(cmd);
}

// A model file and a folder with two images in different buckets.
struct TrainerFiles {
  TempDir dir;
  std::string model, data;
  TrainerFiles() {
    model = dir.file("model.safetensors");
    data = dir.file("images");
    flame_train_test::write_text(model, "{}");
    flame_train_test::write_png(data + "/4_thing/a.png", flame_train_test::pattern_image(300, 200));
    flame_train_test::write_text(data + "/4_thing/a.txt", "a thing, red");
    flame_train_test::write_jpeg(data + "/b.jpg", flame_train_test::pattern_image(200, 300));
  }
  std::vector<std::string> args(std::vector<std::string> extra) const {
    std::vector<std::string> a = {"--model.path=" + model, "--data.path=" + data, "--data.resolution=256",
                                  "--data.min_bucket_reso=128", "--data.max_bucket_reso=512",
                                  "--output.dir=" + dir.file("out")};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
};

}  // namespace

TEST(TrainerProgram, HelpExitsZeroAndListsKeys) {
  ProgramRun r = run_trainer({"--help"});
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("Usage: flame-train"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--data.keep_tokens (integer, default 0)"), std::string::npos) << r.output;
}

// A single-file model with a known family needs the caching stage's sources named: exit 1, before
// any GPU work, naming each key to set.
TEST(TrainerProgram, DryRunNamesMissingCachingStageSources) {
  TrainerFiles s;
  ProgramRun r = run_trainer(s.args({"--dry-run", "--model.arch=flux"}));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("model.vae is required"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("model.text_encoder_2 is required"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("model.tokenizer_dir is required"), std::string::npos) << r.output;
}

TEST(TrainerProgram, DryRunPrintsTheBucketPlan) {
  TrainerFiles s;
  ProgramRun r = run_trainer(s.args({"--dry-run", "--training.batch_size=2"}));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("images: 2 (1 without a caption file), samples per epoch with repeats: 5"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("batch size 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("samples 4  batches 2"), std::string::npos) << r.output;  // 4_thing's 3:2 bucket
  EXPECT_NE(r.output.find("warning:"), std::string::npos) << r.output;            // b.jpg has no caption
  // 5 samples: 4 in the 3:2 bucket (2 batches of 2), 1 in the 2:3 bucket (1 batch).
  EXPECT_NE(r.output.find("batches per epoch: 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("steps: 1000 x 1 batches (gradient accumulation) = 1000 batches, 333.3 epochs of 3 batches"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("dry run: configuration and data are valid"), std::string::npos) << r.output;
  // --gpus 2 with batch_size 1: the same global batches of 2 (data parallel), planned as above.
  ProgramRun two = run_trainer(s.args({"--dry-run", "--training.batch_size=1", "--gpus", "2"}));
  EXPECT_EQ(two.status, 0) << two.output;
  EXPECT_NE(two.output.find("data parallel: 2 GPUs x batch_size 1 = global batch 2"), std::string::npos) << two.output;
  EXPECT_NE(two.output.find("samples 4  batches 2"), std::string::npos) << two.output;
  EXPECT_NE(two.output.find("333.3 epochs of 3 batches"), std::string::npos) << two.output;
}

TEST(TrainerProgram, ConfigurationAndDataErrorsExitOneBeforeTheGpu) {
  TrainerFiles s;
  ProgramRun r = run_trainer(s.args({"--data.resoluton=512", "--network.dim=0"}));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("did you mean 'data.resolution'?"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("network.dim: 0 is out of range [1, 1024]"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("no GPU"), std::string::npos) << r.output;  // stopped before the context

  flame_train_test::write_text(s.data + "/broken.webp", "RIFF....WEBPjunk");
  r = run_trainer(s.args({}));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("data set errors"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("broken.webp: WebP"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("no GPU"), std::string::npos) << r.output;

  r = run_trainer({"--bogus"});
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("unknown option '--bogus'"), std::string::npos) << r.output;
}

TEST(TrainerProgram, WithoutADriverExitsTwoWithTheLibraryMessage) {
  TrainerFiles s;
  ProgramRun r = run_trainer(s.args({}));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("flame-train: no GPU available (FLAME_ERROR_NO_DRIVER)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/libcuda.so.1"), std::string::npos) << r.output;  // the library's text
}

TEST(TrainerProgram, DemoNeedsNoFiles) {
  ProgramRun dry = run_trainer({"--demo", "--dry-run", "--output.dir=/tmp"});
  EXPECT_EQ(dry.status, 0) << dry.output;
  EXPECT_NE(dry.output.find("demo: random data"), std::string::npos) << dry.output;
  ProgramRun r = run_trainer({"--demo", "--model.path=demo:sd3", "--output.dir=/tmp"});
  EXPECT_EQ(r.status, 2) << r.output;  // no driver here
  EXPECT_NE(r.output.find("no GPU available"), std::string::npos) << r.output;
  ProgramRun two = run_trainer({"--demo", "--gpus", "2", "--output.dir=/tmp"});  // data parallel: the same
  EXPECT_EQ(two.status, 2) << two.output;
  EXPECT_NE(two.output.find("no GPU available"), std::string::npos) << two.output;
  EXPECT_NE(two.output.find("/nonexistent/libcuda.so.1"), std::string::npos) << two.output;
  ProgramRun bad = run_trainer({"--demo", "--data.cache_file=/nonexistent/cache.safetensors", "--output.dir=/tmp"});
  EXPECT_EQ(bad.status, 1) << bad.output;
  EXPECT_NE(bad.output.find("data.cache_file: /nonexistent/cache.safetensors does not exist"), std::string::npos)
      << bad.output;
}

// --dry-run prints the library's memory estimate (CPU only: the demo model's architecture and config).
TEST(TrainerProgram, DryRunPrintsTheMemoryEstimate) {
  ProgramRun dry = run_trainer({"--demo", "--dry-run", "--output.dir=/tmp", "--training.batch_size=2"});
  EXPECT_EQ(dry.status, 0) << dry.output;
  EXPECT_NE(dry.output.find("memory estimate: "), std::string::npos) << dry.output;
  EXPECT_NE(dry.output.find(" GiB peak (weights "), std::string::npos) << dry.output;
  EXPECT_EQ(dry.output.find("not available"), std::string::npos) << dry.output;
  // An unreadable model file: reported, the dry run still checks the rest.
  TrainerFiles s;
  ProgramRun r = run_trainer(s.args({"--dry-run"}));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("memory estimate: not available: flame_model_estimate_memory failed"), std::string::npos)
      << r.output;
}

// training.resume is checked before any GPU work: a state of other settings is exit 1 (not 2, the
// no-driver status), naming the setting; a matching one gets as far as the GPU (exit 2 here).
TEST(TrainerProgram, ResumeIsCheckedBeforeTheGpu) {
  TempDir dir;
  const std::string out = dir.file("out"), state = out + "/demo_lora-state-step000002";
  ProgramRun r = run_trainer({"--demo", "--output.dir=" + out, "--resume", state});
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("training.resume: " + state + " does not exist"), std::string::npos) << r.output;

  flame_train_test::write_text(state + "/state.json", "{\"format\": \"flame-train-state\", \"version\": 1, \"step\": ");
  flame_train_test::write_text(state + "/adapter.safetensors", "x");
  flame_train_test::write_text(state + "/optimizer.safetensors", "x");
  r = run_trainer({"--demo", "--output.dir=" + out, "--resume", state});
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("state.json is not valid JSON"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("device"), std::string::npos) << r.output;

  const char* argv[] = {"flame-train", "--demo"};
  flame_train::TrainConfig config = flame_train::load_config(flame_train::parse_command_line(2, argv));
  config.output.dir = out;
  flame_train::TrainState saved;
  saved.step = 2;
  saved.epoch = 1;
  saved.next_batch = 1;
  flame_train_test::write_text(state + "/state.json", flame_train::state_document(saved, config, true).dump());
  r = run_trainer({"--demo", "--output.dir=" + out, "--network.dim=8", "--resume", state});
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("network.dim: 16 -> 8"), std::string::npos) << r.output;
  r = run_trainer({"--demo", "--output.dir=" + out, "--resume", state});
  EXPECT_EQ(r.status, 2) << r.output;  // accepted: stopped by the missing driver
}

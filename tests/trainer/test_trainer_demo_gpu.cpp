// flame-train end to end on a GPU (label gpu; flame_trainer_gpu_tests): `flame-train --demo` trains
// a tiny random-init model of each family for 60 steps on fixed random latents and embeddings, and
//  - every step has a JSONL line {"step", "loss", "lr", "ms"} with a finite loss;
//  - Flux (the demo's default) overfits: the mean loss of the last 10 steps is below 0.7 x that of
//    the first 10. For SD3 (whose sin-cos position table dominates the tiny model's hidden states)
//    and SDXL (whose tiny UNet reaches its output only through convolutions, which the adapter does
//    not target) the ratio is printed, and the run and the file are checked;
//  - the LoRA file exists and loads back (flame_model_load_lora) into a fresh model of the same
//    demo configuration, and an intermediate file is written by output.save_every_n_steps.
//  - sample images (sample.every_n_steps 30, two prompts, the demo's random-init VAE): a row of two
//    128 x 128 images at steps 30 and 60 in out/samples (PNG, or PPM in builds without codecs), with
//    pixels that vary and no warning about non-finite values; and SDXL's DDIM sampler the same way
//    in a 2-step run.
// Lion (TrainerLion): the Flux demo with optimizer.type=lion: the loss falls as with AdamW, the LoRA
// loads back, the state's optimizer file holds one moment (exp_avg) per tensor, no exp_avg_sq.
// Resume (TrainerResume, AdamW and Lion): a 6-step run against 3 steps, then --resume from the state
// saved at step 3: the logged losses, the final LoRA / EMA files and the final state are equal bit
// for bit. EMA
// (TrainerEma): each step's EMA equals the host's EMAModel update of the saved adapters. CUDA graphs
// (TrainerGraphs): a run replaying per-bucket graphs equals the eager run bit for bit (losses, LoRA
// and EMA files), also with two batch shapes under a cosine schedule; LoRA dropout makes the run
// eager and says so.
// Without a GPU the cases skip (exit 77 for CTest) unless FLAME_REQUIRE_GPU=1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ema.h"
#include "flame_test.h"
#include "model_setup.h"
#include "trainer_test_support.h"
#ifndef FLAME_TRAIN_NO_IMAGES
#include "images.h"
#endif

namespace {

class TrainerDemo : public GpuTest, public ::testing::WithParamInterface<const char*> {};

using DemoRun = flame_train_test::ProgramRun;

constexpr const char* kSampleOptions =
    " --sample.every_n_steps=30 --sample.prompts='[\"a red square\", \"a blue circle\"]'";

DemoRun run_demo(const std::string& family, const std::string& out_dir, const std::string& extra = kSampleOptions,
                 int steps = 60) {
  const std::string cmd = std::string("'") + FLAME_TRAIN_EXE + "' --demo --model.path=demo:" + family +
                          " --training.max_train_steps=" + std::to_string(steps) +
                          " --output.save_every_n_steps=30 --output.dir='" + out_dir + "'" + extra + " 2>&1";
  return flame_train_test::run_shell(cmd);
}

bool file_exists(const std::string& path) { return std::ifstream(path).good(); }

struct SampleFile {
  int width = 0, height = 0;
  std::vector<uint8_t> pixels;  // RGB
  std::string error;
};

#ifdef FLAME_TRAIN_NO_IMAGES
constexpr const char* kSampleExtension = ".ppm";
// A binary PPM as flame-train writes it: "P6\n<w> <h>\n255\n" then the pixels.
SampleFile read_sample(const std::string& path) {
  SampleFile f;
  std::ifstream in(path, std::ios::binary);
  std::string magic;
  int maxval = 0;
  if (!(in >> magic >> f.width >> f.height >> maxval) || magic != "P6" || maxval != 255) {
    f.error = path + ": not a P6 PPM of maxval 255";
    return f;
  }
  in.get();  // the single whitespace after maxval
  f.pixels.resize(static_cast<size_t>(f.width) * f.height * 3);
  in.read(reinterpret_cast<char*>(f.pixels.data()), static_cast<std::streamsize>(f.pixels.size()));
  if (in.gcount() != static_cast<std::streamsize>(f.pixels.size())) f.error = path + ": pixels cut short";
  return f;
}
#else
constexpr const char* kSampleExtension = ".png";
SampleFile read_sample(const std::string& path) {
  SampleFile f;
  try {
    flame_train::ImageRGB8 img = flame_train::decode_image(path);
    f.width = img.width;
    f.height = img.height;
    f.pixels = std::move(img.pixels);
  } catch (const std::exception& e) {
    f.error = e.what();
  }
  return f;
}
#endif

// The trained LoRA file loads onto a fresh bf16 demo model of family and holds parameters (their
// count into count).
void expect_lora_loads(flame_ctx_t ctx, const std::string& family, const std::string& lora, int64_t& count) {
  const char* architecture = nullptr;
  const char* config = flame_train::demo_model_config(family, &architecture);
  flame_model_t model = nullptr;
  ASSERT_EQ(flame_model_create(ctx, architecture, config, R"({"dtype": "bf16"})", &model), FLAME_OK)
      << flame_last_error_message();
  flame_params_t adapter = nullptr;
  EXPECT_EQ(flame_model_load_lora(model, lora.c_str(), nullptr, &adapter), FLAME_OK) << flame_last_error_message();
  count = 0;
  if (adapter) EXPECT_EQ(flame_params_count(adapter, &count), FLAME_OK);
  EXPECT_GT(count, 0);
  flame_params_release(adapter);
  flame_model_release(model);
}

// The sample row of step: two 128 x 128 images side by side, pixels that vary in each.
void expect_sample_row(const std::string& out, int step, const std::string& log) {
  char name[64];
  std::snprintf(name, sizeof name, "/samples/demo_lora-step%06d%s", step, kSampleExtension);
  const std::string path = out + name;
  ASSERT_TRUE(file_exists(path)) << path << "\n" << log;
  const SampleFile f = read_sample(path);
  ASSERT_TRUE(f.error.empty()) << f.error;
  EXPECT_EQ(f.width, 2 * 128) << path;
  EXPECT_EQ(f.height, 128) << path;
  for (int image = 0; image < 2; ++image) {
    int lo = 255, hi = 0;
    for (int y = 0; y < f.height; ++y)
      for (int x = image * 128; x < (image + 1) * 128; ++x)
        for (int c = 0; c < 3; ++c) {
          const int v = f.pixels[(static_cast<size_t>(y) * f.width + x) * 3 + c];
          lo = std::min(lo, v);
          hi = std::max(hi, v);
        }
    EXPECT_LT(lo, hi) << path << ": image " << image << " is constant";
  }
  EXPECT_EQ(log.find("non-finite"), std::string::npos) << log;
}

TEST_P(TrainerDemo, LossFallsAndTheLoraLoadsBack) {
  const std::string family = GetParam();
  flame_train_test::TempDir dir;
  ASSERT_FALSE(dir.path().empty()) << "mkdtemp failed";
  const std::string out = dir.path() + "/out";
  const DemoRun r = run_demo(family, out);
  ASSERT_EQ(r.status, 0) << r.output;

  std::ifstream log(out + "/demo_lora.jsonl");
  ASSERT_TRUE(log.good()) << r.output;
  std::vector<double> losses;
  std::string line;
  while (std::getline(log, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    ASSERT_EQ(j.at("step").get<int64_t>(), static_cast<int64_t>(losses.size()) + 1) << line;
    ASSERT_TRUE(j.contains("lr") && j.contains("ms")) << line;
    const double loss = j.at("loss").get<double>();
    ASSERT_TRUE(std::isfinite(loss)) << line;
    losses.push_back(loss);
  }
  ASSERT_EQ(losses.size(), 60u) << r.output;
  double first = 0, last = 0;
  for (int i = 0; i < 10; ++i) {
    first += losses[static_cast<size_t>(i)] / 10;
    last += losses[losses.size() - 10 + static_cast<size_t>(i)] / 10;
  }
  std::printf("[ %s ] mean loss of the first 10 steps %.5f, of the last 10 %.5f (ratio %.3f)\n", family.c_str(), first,
              last, last / first);
  if (family == "flux") EXPECT_LT(last, 0.7 * first) << r.output;

  EXPECT_TRUE(file_exists(out + "/demo_lora-step000030.safetensors")) << r.output;
  expect_sample_row(out, 30, r.output);
  expect_sample_row(out, 60, r.output);
  const std::string lora = out + "/demo_lora.safetensors";
  ASSERT_TRUE(file_exists(lora)) << r.output;
  int64_t count = 0;
  ASSERT_NO_FATAL_FAILURE(expect_lora_loads(ctx, family, lora, count));
}

INSTANTIATE_TEST_SUITE_P(Families, TrainerDemo, ::testing::Values("flux", "sd3", "sdxl"));

class TrainerDemoSampler : public GpuTest {};

TEST_F(TrainerDemoSampler, SdxlDdimWritesSamples) {
  flame_train_test::TempDir dir;
  ASSERT_FALSE(dir.path().empty()) << "mkdtemp failed";
  const std::string out = dir.path() + "/out";
  const DemoRun r = run_demo("sdxl", out,
                             " --sample.sampler=ddim --sample.steps=10 --sample.every_n_steps=1"
                             " --sample.prompts='[\"one\", \"two\"]'",
                             2);
  ASSERT_EQ(r.status, 0) << r.output;
  expect_sample_row(out, 1, r.output);
  expect_sample_row(out, 2, r.output);
}

}  // namespace

namespace {

using flame_train_test::logged_losses;
using flame_train_test::read_bytes;

using flame_train_test::HostTensors;
using flame_train_test::read_host_tensors;

class TrainerLion : public GpuTest {};

// optimizer.type=lion on the Flux demo (its default rate for Lion, a quarter of AdamW's): the loss
// falls as in the AdamW case (last 10 steps below 0.7 x the first 10), the LoRA loads back, and the
// final state's optimizer file holds Lion's single moment (exp_avg, no exp_avg_sq).
TEST_F(TrainerLion, FluxDemoLossFallsAndTheStateHoldsOneMoment) {
  flame_train_test::TempDir dir;
  ASSERT_FALSE(dir.path().empty()) << "mkdtemp failed";
  const std::string out = dir.path() + "/out";
  const DemoRun r = run_demo("flux", out, " --optimizer.type=lion --output.save_state_every_n_steps=60");
  ASSERT_EQ(r.status, 0) << r.output;
  const auto losses = logged_losses(out + "/demo_lora.jsonl");
  ASSERT_EQ(losses.size(), 60u) << r.output;
  double first = 0, last = 0;
  for (size_t i = 0; i < 10; ++i) {
    ASSERT_TRUE(std::isfinite(losses[i].second) && std::isfinite(losses[50 + i].second)) << r.output;
    first += losses[i].second / 10;
    last += losses[50 + i].second / 10;
  }
  std::printf("[ lion ] mean loss of the first 10 steps %.5f, of the last 10 %.5f (ratio %.3f)\n", first, last,
              last / first);
  EXPECT_LT(last, 0.7 * first) << r.output;

  const std::string lora = out + "/demo_lora.safetensors";
  ASSERT_TRUE(file_exists(lora)) << r.output;
  int64_t count = 0;
  ASSERT_NO_FATAL_FAILURE(expect_lora_loads(ctx, "flux", lora, count));

  const HostTensors state = read_host_tensors(out + "/demo_lora-state-step000060/optimizer.safetensors");
  ASSERT_TRUE(state.error.empty()) << state.error;
  size_t moments = 0;
  for (const auto& [name, values] : state.values) {
    EXPECT_EQ(name.find("exp_avg_sq"), std::string::npos) << name << ": Lion keeps one moment";
    if (name.size() > 8 && name.compare(name.size() - 8, 8, ".exp_avg") == 0) ++moments;
  }
  // One exp_avg per adapter tensor that received a gradient (a tensor never stepped has none).
  EXPECT_GT(moments, 0u);
  EXPECT_LE(static_cast<int64_t>(moments), count);
}

// The optimizer of the resume test: adamw, lion and adamw8bit (at network.dim 128, so that the demo's
// adapter tensors reach the 4096 elements from which moments are 8-bit).
class TrainerResume : public GpuTest, public ::testing::WithParamInterface<const char*> {};

// An uninterrupted 6-step run against one stopped after step 3 (its end saves the state) and resumed
// from that state folder in the same output folder: the log's losses, the final LoRA and EMA files
// and the final state's tensors are equal bit for bit.
TEST_P(TrainerResume, ResumedRunEqualsTheUninterruptedOne) {
  flame_train_test::TempDir dir;
  ASSERT_FALSE(dir.path().empty()) << "mkdtemp failed";
  const std::string whole = dir.path() + "/whole", parts = dir.path() + "/parts";
  const bool eight_bit = std::string(GetParam()) == "adamw8bit";
  const std::string options = std::string(" --output.save_state_every_n_steps=3 --training.ema_decay=0.9") +
                              " --optimizer.type=" + GetParam() + (eight_bit ? " --network.dim=128 --network.alpha=128" : "");
  const DemoRun a = run_demo("flux", whole, options, 6);
  ASSERT_EQ(a.status, 0) << a.output;
  const DemoRun first = run_demo("flux", parts, options, 3);
  ASSERT_EQ(first.status, 0) << first.output;
  const std::string state = parts + "/demo_lora-state-step000003";
  ASSERT_TRUE(file_exists(state + "/state.json")) << first.output;
  EXPECT_EQ(read_bytes(state + "/adapter.safetensors"), read_bytes(whole + "/demo_lora-state-step000003/adapter.safetensors"));
  const DemoRun second = run_demo("flux", parts, options + " --resume='" + state + "'", 6);
  ASSERT_EQ(second.status, 0) << second.output;
  EXPECT_NE(second.output.find("resuming from"), std::string::npos) << second.output;

  const auto expected = logged_losses(whole + "/demo_lora.jsonl"), resumed = logged_losses(parts + "/demo_lora.jsonl");
  ASSERT_EQ(expected.size(), 6u);
  ASSERT_EQ(resumed.size(), 6u) << second.output;
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(resumed[i].first, static_cast<int64_t>(i) + 1);
    EXPECT_EQ(resumed[i].second, expected[i].second) << "step " << i + 1;
  }
  for (const char* file : {"/demo_lora.safetensors", "/demo_lora-ema.safetensors",
                           "/demo_lora-state-step000006/adapter.safetensors",
                           "/demo_lora-state-step000006/optimizer.safetensors",
                           "/demo_lora-state-step000006/ema.safetensors"}) {
    const std::string want = read_bytes(whole + file);
    ASSERT_FALSE(want.empty()) << whole + file;
    EXPECT_TRUE(read_bytes(parts + file) == want) << file << " differs from the uninterrupted run's";
  }
  const auto rng = [](const std::string& folder) {
    return nlohmann::json::parse(read_bytes(folder + "/state.json")).at("rng");
  };
  EXPECT_EQ(rng(parts + "/demo_lora-state-step000006"), rng(whole + "/demo_lora-state-step000006"));
  const std::string optimizer_file = read_bytes(whole + "/demo_lora-state-step000006/optimizer.safetensors");
  EXPECT_EQ(optimizer_file.find("exp_avg_absmax") != std::string::npos, eight_bit) << "8-bit moments in the state";
}

INSTANTIATE_TEST_SUITE_P(Optimizers, TrainerResume, ::testing::Values("adamw", "lion", "adamw8bit"));

class TrainerEma : public GpuTest {};

// A 3-step run with ema_decay 0.9 and the state saved every step: each step's EMA equals the host's
// EMAModel update from the previous EMA and that step's adapter (decays 0, 2/11, 3/12), and the EMA
// LoRA file is a LoRA of the same layout that differs from the trained one.
TEST_F(TrainerEma, EmaFollowsTheAdapterAsTheHostRecomputes) {
  flame_train_test::TempDir dir;
  ASSERT_FALSE(dir.path().empty()) << "mkdtemp failed";
  const std::string out = dir.path() + "/out";
  const DemoRun r = run_demo("flux", out, " --output.save_state_every_n_steps=1 --training.ema_decay=0.9", 3);
  ASSERT_EQ(r.status, 0) << r.output;
  std::map<std::string, std::vector<float>> previous;
  for (int step = 1; step <= 3; ++step) {
    char folder[64];
    std::snprintf(folder, sizeof folder, "/demo_lora-state-step%06d", step);
    const HostTensors adapter = read_host_tensors(out + folder + "/adapter.safetensors");
    const HostTensors ema = read_host_tensors(out + folder + "/ema.safetensors");
    ASSERT_TRUE(adapter.error.empty()) << adapter.error;
    ASSERT_TRUE(ema.error.empty()) << ema.error;
    ASSERT_EQ(adapter.values.size(), ema.values.size());
    ASSERT_FALSE(adapter.values.empty());
    const double d = flame_train::ema_decay_at(0.9, false, step);
    bool differs = false;
    for (const auto& [name, p] : adapter.values) {
      ASSERT_TRUE(ema.values.count(name)) << name;
      const std::vector<float>& e = ema.values.at(name);
      ASSERT_EQ(e.size(), p.size()) << name;
      const bool f32 = adapter.dtypes.at(name) == "F32";
      for (size_t i = 0; i < p.size(); ++i) {
        const double s = step == 1 ? p[i] : previous.at(name)[i];
        const double want = s - (1.0 - d) * (s - p[i]);
        const double tol = f32 ? 1e-6 + 1e-6 * std::fabs(want) : 1e-3 + 1e-2 * std::fabs(want);
        ASSERT_NEAR(e[i], want, tol) << name << "[" << i << "] at step " << step;
        differs = differs || e[i] != p[i];
      }
    }
    if (step > 1) {
      EXPECT_TRUE(differs) << "the EMA equals the adapter at step " << step;
    }
    previous = ema.values;
  }
  const std::string lora = read_bytes(out + "/demo_lora.safetensors"), ema = read_bytes(out + "/demo_lora-ema.safetensors");
  ASSERT_FALSE(lora.empty());
  EXPECT_EQ(ema.size(), lora.size());  // the same names, shapes and metadata
  EXPECT_NE(ema, lora);
  const HostTensors lora_tensors = read_host_tensors(out + "/demo_lora.safetensors");
  const HostTensors ema_tensors = read_host_tensors(out + "/demo_lora-ema.safetensors");
  ASSERT_TRUE(lora_tensors.error.empty()) << lora_tensors.error;
  ASSERT_TRUE(ema_tensors.error.empty()) << ema_tensors.error;
  for (const auto& [name, v] : lora_tensors.values) EXPECT_TRUE(ema_tensors.values.count(name)) << name;
}

}  // namespace

// The memory options: the Flux demo on an fp8 base (model.quantize) and with its frozen blocks
// in host memory (model.offload_budget_gib at 85% of the weights' bytes: the tiny model's 4 blocks
// all move out, since the ring of 2 block-sized slots stays), against the bf16,
// resident run of the same seed: offload computes the same values (every step's loss equal up to
// rounding), the fp8 base starts within a few percent and learns as much.
class TrainerMemoryOptions : public GpuTest {};

static std::vector<double> demo_losses(const std::string& out) {
  std::vector<double> losses;
  std::ifstream log(out + "/demo_lora.jsonl");
  std::string line;
  while (std::getline(log, line)) losses.push_back(nlohmann::json::parse(line).at("loss").get<double>());
  return losses;
}

// Bytes of the demo model's parameters in bf16.
static uint64_t demo_weight_bytes(flame_ctx_t ctx, const std::string& family) {
  const char* architecture = nullptr;
  const char* config = flame_train::demo_model_config(family, &architecture);
  flame_model_t model = nullptr;
  EXPECT_EQ(flame_model_create(ctx, architecture, config, R"({"dtype": "bf16"})", &model), FLAME_OK);
  flame_params_t params = nullptr;
  uint64_t bytes = 0;
  if (model && flame_model_params(model, &params) == FLAME_OK) {
    int64_t n = 0;
    flame_params_count(params, &n);
    for (int64_t i = 0; i < n; ++i) {
      flame_tensor_t t = nullptr;
      int64_t numel = 0;
      flame_params_tensor(params, i, &t);
      flame_tensor_numel(t, &numel);
      bytes += static_cast<uint64_t>(numel) * 2;
    }
  }
  flame_params_release(params);
  flame_model_release(model);
  return bytes;
}

TEST_F(TrainerMemoryOptions, Fp8AndOffloadBasesTrainLikeTheBf16Base) {
  flame_train_test::TempDir dir;
  ASSERT_FALSE(dir.path().empty()) << "mkdtemp failed";
  const int steps = 40;
  const DemoRun plain = run_demo("flux", dir.path() + "/bf16", "", steps);
  ASSERT_EQ(plain.status, 0) << plain.output;
  const DemoRun fp8 = run_demo("flux", dir.path() + "/fp8", " --model.quantize=f8_e4m3", steps);
  ASSERT_EQ(fp8.status, 0) << fp8.output;
  const uint64_t weights = demo_weight_bytes(ctx, "flux");
  ASSERT_GT(weights, 0u);
  char budget[64];
  std::snprintf(budget, sizeof budget, " --model.offload_budget_gib=%.9f", 0.85 * static_cast<double>(weights) / 1073741824.0);
  const DemoRun offload = run_demo("flux", dir.path() + "/offload", budget, steps);
  ASSERT_EQ(offload.status, 0) << offload.output;

  const std::vector<double> a = demo_losses(dir.path() + "/bf16"), q = demo_losses(dir.path() + "/fp8"),
                            o = demo_losses(dir.path() + "/offload");
  ASSERT_EQ(a.size(), static_cast<size_t>(steps));
  ASSERT_EQ(q.size(), a.size()) << fp8.output;
  ASSERT_EQ(o.size(), a.size()) << offload.output;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(o[i], a[i], 1e-5 * std::fabs(a[i]) + 1e-7) << "step " << i + 1;
  EXPECT_NEAR(q[0], a[0], 0.05 * std::fabs(a[0])) << "the fp8 base's first loss";
  auto mean = [](const std::vector<double>& v, size_t from) {
    double s = 0;
    for (size_t i = from; i < from + 10; ++i) s += v[i] / 10;
    return s;
  };
  std::printf("[ flux ] first / last 10 steps: bf16 %.5f / %.5f, fp8 %.5f / %.5f, offload %.5f / %.5f\n", mean(a, 0),
              mean(a, a.size() - 10), mean(q, 0), mean(q, q.size() - 10), mean(o, 0), mean(o, o.size() - 10));
  EXPECT_LT(mean(q, q.size() - 10), 0.8 * mean(q, 0)) << "the fp8 base learns";
  EXPECT_LT(mean(q, q.size() - 10), 1.25 * mean(a, a.size() - 10)) << "as much as the bf16 base, about";
}

namespace {

class TrainerGraphs : public GpuTest {};

// training.cuda_graphs (the default) against the same run eager: 12 Flux demo steps with two
// micro-batches per step, clipping and the EMA; each bucket's first micro-batch and the first update
// run eagerly, later ones replay graphs whose inputs are refilled on the device. The replayed kernels
// are the eager ones on the same data, so the losses and the LoRA / EMA files are equal bit for bit.
TEST_F(TrainerGraphs, GraphStepsEqualEagerSteps) {
  flame_train_test::TempDir dir;
  ASSERT_FALSE(dir.path().empty()) << "mkdtemp failed";
  const std::string options =
      " --training.gradient_accumulation_steps=2 --optimizer.max_grad_norm=0.5 --training.ema_decay=0.9";
  const std::string graph_out = dir.path() + "/graph", eager_out = dir.path() + "/eager";
  const DemoRun graph = run_demo("flux", graph_out, options, 12);
  ASSERT_EQ(graph.status, 0) << graph.output;
  EXPECT_NE(graph.output.find("step: a CUDA graph per batch shape"), std::string::npos) << graph.output;
  EXPECT_EQ(graph.output.find("CUDA graphs off"), std::string::npos) << graph.output;
  const DemoRun eager = run_demo("flux", eager_out, options + " --training.cuda_graphs=false", 12);
  ASSERT_EQ(eager.status, 0) << eager.output;
  EXPECT_NE(eager.output.find("step: eager (training.cuda_graphs is false)"), std::string::npos) << eager.output;

  const auto g = logged_losses(graph_out + "/demo_lora.jsonl"), e = logged_losses(eager_out + "/demo_lora.jsonl");
  ASSERT_EQ(g.size(), 12u) << graph.output;
  ASSERT_EQ(e.size(), 12u) << eager.output;
  for (size_t i = 0; i < g.size(); ++i) EXPECT_EQ(g[i].second, e[i].second) << "step " << i + 1;
  for (const char* file : {"/demo_lora.safetensors", "/demo_lora-ema.safetensors"}) {
    const std::string want = read_bytes(eager_out + file);
    ASSERT_FALSE(want.empty()) << eager_out + file;
    EXPECT_TRUE(read_bytes(graph_out + file) == want) << file << " differs between graph and eager";
  }
}

// A latent cache (training_data.h's layout) for the Flux demo model with samples of two latent
// sizes, 16 x 16 and 16 x 24 (two buckets), smooth per-sample values; f32.
std::string write_two_bucket_flux_cache(flame_ctx_t ctx, const std::string& dir) {
  const int64_t channels = 4, tokens = 8, text_dim = 24, pooled_dim = 20;  // kDemoFlux: in_channels 16 / 2x2
  std::vector<std::string> names;
  std::vector<flame_tensor_t> handles;
  auto add = [&](const std::string& name, const std::vector<int64_t>& shape, float phase) {
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    std::vector<float> v(static_cast<size_t>(count));
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.5f * std::sin(0.37f * static_cast<float>(i) + phase);
    flame_tensor_t t = nullptr;
    EXPECT_EQ(flame_from_host(ctx, v.data(), v.size() * sizeof(float), shape.data(), static_cast<int32_t>(shape.size()),
                              FLAME_DTYPE_F32, &t),
              FLAME_OK);
    names.push_back(name);
    handles.push_back(t);
  };
  const int64_t widths[4] = {16, 24, 16, 24};
  for (int i = 0; i < 4; ++i) {
    const std::string n = std::to_string(i);
    add("latents." + n, {channels, 16, widths[i]}, static_cast<float>(i));
    add("prompt_embeds." + n, {tokens, text_dim}, 10.0f + static_cast<float>(i));
    add("pooled_prompt_embeds." + n, {pooled_dim}, 20.0f + static_cast<float>(i));
  }
  std::vector<const char*> name_ptrs;
  for (const std::string& n : names) name_ptrs.push_back(n.c_str());
  const char* metadata[] = {"flame_train_cache", "1", "family", "flux", "count", "4"};
  const std::string path = dir + "/two_buckets.safetensors";
  EXPECT_EQ(flame_safetensors_save(ctx, path.c_str(), name_ptrs.data(), handles.data(),
                                   static_cast<int64_t>(handles.size()), metadata, 3),
            FLAME_OK)
      << flame_last_error_message();
  for (flame_tensor_t t : handles) flame_tensor_release(t);
  return path;
}

// Two batch shapes (two graphs of micro-batches and the update's, replayed in turn from one pool)
// under a cosine schedule with warm-up (the learning rate set between replays), two micro-batches per
// step, clipping and the EMA: the run equals the eager one bit for bit.
TEST_F(TrainerGraphs, TwoBatchShapesWithCosineScheduleEqualEager) {
  flame_train_test::TempDir dir;
  ASSERT_FALSE(dir.path().empty()) << "mkdtemp failed";
  const std::string cache = write_two_bucket_flux_cache(ctx, dir.path());
  auto run = [&](const std::string& out, const std::string& extra) {
    const std::string cmd = std::string("'") + FLAME_TRAIN_EXE + "' --model.path=demo:flux --data.cache_file='" + cache +
                            "' --training.max_train_steps=12 --training.gradient_accumulation_steps=2"
                            " --optimizer.learning_rate=0.02 --optimizer.lr_scheduler=cosine"
                            " --optimizer.lr_warmup_steps=3 --optimizer.max_grad_norm=0.5 --training.ema_decay=0.9"
                            " --output.name=two --output.dir='" +
                            out + "'" + extra + " 2>&1";
    return flame_train_test::run_shell(cmd);
  };
  const std::string graph_out = dir.path() + "/graph", eager_out = dir.path() + "/eager";
  const DemoRun graph = run(graph_out, "");
  ASSERT_EQ(graph.status, 0) << graph.output;
  EXPECT_NE(graph.output.find("CUDA graphs: 3 (2 batch shapes and the update)"), std::string::npos) << graph.output;
  EXPECT_EQ(graph.output.find("CUDA graphs off"), std::string::npos) << graph.output;
  const DemoRun eager = run(eager_out, " --training.cuda_graphs=false");
  ASSERT_EQ(eager.status, 0) << eager.output;

  const auto g = logged_losses(graph_out + "/two.jsonl"), e = logged_losses(eager_out + "/two.jsonl");
  ASSERT_EQ(g.size(), 12u) << graph.output;
  ASSERT_EQ(e.size(), 12u) << eager.output;
  for (size_t i = 0; i < g.size(); ++i) EXPECT_EQ(g[i].second, e[i].second) << "step " << i + 1;
  for (const char* file : {"/two.safetensors", "/two-ema.safetensors"}) {
    const std::string want = read_bytes(eager_out + file);
    ASSERT_FALSE(want.empty()) << eager_out + file;
    EXPECT_TRUE(read_bytes(graph_out + file) == want) << file << " differs between graph and eager";
  }
}

// LoRA dropout draws random numbers inside the step: the run says so and trains eagerly.
TEST_F(TrainerGraphs, DropoutTrainsEagerly) {
  flame_train_test::TempDir dir;
  ASSERT_FALSE(dir.path().empty()) << "mkdtemp failed";
  const DemoRun r = run_demo("flux", dir.path() + "/out", " --network.dropout=0.1", 3);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("step: eager (network.dropout > 0"), std::string::npos) << r.output;
}

}  // namespace

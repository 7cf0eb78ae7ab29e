// flame-train: the program. It reads the configuration (config.h), scans the images and plans the
// buckets (dataset.h) and only then opens a FLAME context through the public C ABI (flame.h; the
// trainer never includes the library's internals), so every configuration or data error is reported
// before any GPU work, and a machine without a GPU gets the library's own message and exit status 2.
//
// Exit status: 0 success (or --help, --dry-run), 1 a configuration, data or FLAME error, 2 no GPU or
// no NVIDIA driver. The training itself is trainer.h's: from a latent cache (data.cache_file) or,
// with --demo, from random data in the model's shapes; a run from data.path first runs the caching
// stage (cache_writer.h: images -> latents, captions -> text embeddings, reused when unchanged).
#include <flame.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include "conditioning_sources.h"
#include "config.h"
#include "data_parallel.h"
#ifndef FLAME_TRAIN_NO_IMAGES
#include "dataset.h"
#endif
#include "flame_handles.h"
#include "memory_check.h"
#include "train_state.h"
#include "trainer.h"

namespace {

using namespace flame_train;

constexpr int kExitError = 1;
constexpr int kExitNoGpu = 2;
constexpr size_t kWarningsShown = 10;

void print_problems(const char* what, const std::vector<std::string>& problems) {
  std::fprintf(stderr, "flame-train: %s:\n", what);
  for (const auto& p : problems) std::fprintf(stderr, "  %s\n", p.c_str());
}

#ifndef FLAME_TRAIN_NO_IMAGES
void print_warnings(const Dataset& dataset) {
  for (size_t i = 0; i < dataset.warnings.size() && i < kWarningsShown; ++i)
    std::fprintf(stderr, "flame-train: warning: %s\n", dataset.warnings[i].c_str());
  if (dataset.warnings.size() > kWarningsShown)
    std::fprintf(stderr, "flame-train: warning: ... and %zu more\n", dataset.warnings.size() - kWarningsShown);
}

// Samples per global batch: training.batch_size on each of training.gpus GPUs (data_parallel.h).
int global_batch_size(const TrainConfig& config) { return config.training.batch_size * config.training.gpus; }

// "steps: 1000 x 2 batches (gradient accumulation) = 2000 batches, 66.7 epochs of 30 batches"
void print_schedule(const TrainConfig& config, const BucketPlan& plan) {
  const uint64_t per_epoch = batches_per_epoch(plan, global_batch_size(config));
  const uint64_t batches = static_cast<uint64_t>(config.training.max_train_steps) *
                           static_cast<uint64_t>(config.training.gradient_accumulation_steps);
  std::printf("steps: %lld x %d batches (gradient accumulation) = %llu batches, %.1f epochs of %llu batches\n",
              static_cast<long long>(config.training.max_train_steps), config.training.gradient_accumulation_steps,
              static_cast<unsigned long long>(batches),
              per_epoch ? static_cast<double>(batches) / static_cast<double>(per_epoch) : 0.0,
              static_cast<unsigned long long>(per_epoch));
}

#endif

// Opens the context; returns the exit status when it cannot (2: no GPU, 1: another error).
int open_context(const TrainConfig& config, flame_ctx_t* ctx) {
  flame_ctx_options_t opts;
  flame_ctx_options_init(&opts);
  opts.device = config.training.device;
  opts.seed = config.training.seed;
  flame_status_t st = flame_ctx_create(&opts, ctx);
  if (st == FLAME_ERROR_NO_DRIVER || st == FLAME_ERROR_NO_DEVICE) {
    std::fprintf(stderr, "flame-train: no GPU available (%s): %s\n", flame_status_string(st), flame_last_error_message());
    return kExitNoGpu;
  }
  if (st != FLAME_OK) {
    std::fprintf(stderr, "flame-train: flame_ctx_create failed (%s): %s\n", flame_status_string(st),
                 flame_last_error_message());
    return kExitError;
  }
  return 0;
}

#ifndef FLAME_TRAIN_NO_IMAGES
// The caching stage's VAE / text encoders / tokenizers (conditioning_sources.h), checked before any
// GPU work when the family is known (model.arch set; auto needs the checkpoint read on the GPU side).
int check_conditioning_sources(const TrainConfig& config) {
  if (config.model.arch == "auto") return 0;
  const ConditioningPaths paths{config.model.path,         config.model.vae,           config.model.text_encoder,
                                config.model.text_encoder_2, config.model.text_encoder_3, config.model.tokenizer_dir};
  std::vector<std::string> problems;
  resolve_conditioning_sources(config.model.arch, paths, problems);
  if (problems.empty()) return 0;
  print_problems("caching stage: missing VAE / text encoder / tokenizer sources", problems);
  return kExitError;
}

// Scans the images and prints the bucket plan; returns an exit status when the data are bad (1).
int check_data(const TrainConfig& config, bool dry_run) {
  const DataOptions data = data_options_of(config);
  Dataset dataset;
  try {
    dataset = scan_dataset(data);
  } catch (const DatasetError& e) {
    print_problems("data set errors", e.problems());
    return kExitError;
  }
  print_warnings(dataset);
  if (int rc = check_conditioning_sources(config)) return rc;
  const BucketPlan plan = plan_buckets(dataset, data.buckets);
  std::printf("%s", describe_plan(dataset, plan, global_batch_size(config)).c_str());
  if (config.training.gpus > 1)
    std::printf("data parallel: %d GPUs x batch_size %d = global batch %d (batches above are global)\n",
                config.training.gpus, config.training.batch_size, global_batch_size(config));
  print_schedule(config, plan);
  if (dry_run) std::printf("dry run: configuration and data are valid\n");
  return 0;
}

#else
// Built without the image libraries (FLAME_TRAINER_DEMO_ONLY): images cannot be read.
int check_data(const TrainConfig&, bool) {
  std::fprintf(stderr,
               "flame-train: this build has no image input (built without libpng / libjpeg / libwebp / "
               "SentencePiece / utf8proc): use --demo or data.cache_file\n");
  return kExitError;
}
#endif

// --dry-run: the library's estimate of a step's peak memory (memory_check.h), from the model's
// headers and config only. A model the estimate cannot read is reported, not fatal here: loading it
// reports the same problem when training starts.
int print_memory_estimate(const TrainConfig& config) {
  try {
    std::printf("%s\n", describe_memory_estimate(estimate_training_memory(config)).c_str());
  } catch (const FlameError& e) {
    std::printf("memory estimate: not available: %s\n", e.what());
  }
  return 0;
}

// training.gpus > 1 (data_parallel.h): too few GPUs or no NCCL is a clear error (exit 1), no GPU or
// driver exit 2, as on one GPU.
int train_data_parallel(const TrainConfig& config, bool demo, const TrainState* resume_from) {
  try {
    run_data_parallel_training(config, demo, resume_from);
  } catch (const FlameError& e) {
    const bool no_gpu = e.status() == FLAME_ERROR_NO_DEVICE || e.status() == FLAME_ERROR_NO_DRIVER;
    std::fprintf(stderr, "flame-train: %s%s\n", no_gpu ? "no GPU available: " : "", e.what());
    return no_gpu ? kExitNoGpu : kExitError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flame-train: %s\n", e.what());
    return kExitError;
  }
  return 0;
}

int run(int argc, char** argv) {
  CommandLine cmd;
  TrainConfig config;
  try {
    cmd = parse_command_line(argc, argv);
    if (cmd.help) {
      std::fputs(help_text().c_str(), stdout);
      return 0;
    }
    config = load_config(cmd);
  } catch (const ConfigError& e) {
    print_problems("configuration errors (see --help)", e.problems());
    return kExitError;
  }

  const bool from_images = !cmd.demo && config.data.cache_file.empty();
  if (from_images) {
    if (int rc = check_data(config, cmd.dry_run)) return rc;
  } else if (cmd.dry_run) {
    std::printf("dry run: configuration is valid (%s)\n", cmd.demo ? "demo: random data" : "data from the latent cache");
  }
  std::unique_ptr<TrainState> resume_from;  // training.resume: checked before any GPU work
  if (!config.training.resume.empty()) {
    try {
      resume_from = std::make_unique<TrainState>(read_train_state(config.training.resume, config, cmd.demo));
    } catch (const std::runtime_error& e) {
      std::fprintf(stderr, "flame-train: %s\n", e.what());
      return kExitError;
    }
  }
  if (cmd.dry_run) return print_memory_estimate(config);
  if (config.training.gpus > 1) return train_data_parallel(config, cmd.demo, resume_from.get());

  Context ctx;
  if (int rc = open_context(config, ctx.out())) return rc;
  char device[256] = {0};
  if (flame_ctx_device_name(ctx.get(), device, sizeof device) == FLAME_OK) std::printf("device: %s\n", device);
  try {
    run_training(ctx.get(), config, cmd.demo, resume_from.get());
  } catch (const FlameError& e) {
    std::fprintf(stderr, "flame-train: %s\n", e.what());
    return e.status() == FLAME_ERROR_NO_DEVICE || e.status() == FLAME_ERROR_NO_DRIVER ? kExitNoGpu : kExitError;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flame-train: %s\n", e.what());
    return kExitError;
  }
}

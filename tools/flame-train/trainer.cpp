// The training loop (see trainer.h): setup, one optimizer step, LoRA files and the JSONL log.
#include "trainer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <vector>

#include <nlohmann/json.hpp>

#ifndef FLAME_TRAIN_NO_IMAGES
#include "cache_writer.h"
#endif
#include "batch_noise.h"
#include "data_parallel.h"
#include "ema.h"
#include "flame_handles.h"
#include "global_batch.h"
#include "lr_schedule.h"
#include "memory_check.h"
#include "model_setup.h"
#include "objectives.h"
#include "optimizer_setup.h"
#include "progress.h"
#include "random.h"
#include "sample_images.h"
#include "step_graphs.h"
#include "tensor_helpers.h"
#include "training_step.h"
#include "train_state.h"
#include "training_data.h"

namespace flame_train {
namespace {

// The demo data set: a few fixed samples the adapter can overfit.
constexpr int kDemoSamples = 4;
constexpr int64_t kDemoLatentSide = 16;
constexpr int64_t kDemoTokens = 8;

std::string output_file(const TrainConfig& c, const std::string& suffix) {
  return c.output.dir + "/" + c.output.name + suffix;
}

// "-step000030" for an intermediate file, "" for the final one.
std::string step_suffix(int64_t steps_done, bool final) {
  if (final) return "";
  char suffix[32];
  std::snprintf(suffix, sizeof suffix, "-step%06lld", static_cast<long long>(steps_done));
  return suffix;
}

// Where the data order stands: the epochs planned so far (the current one is epoch - 1), its batches
// and the next of them.
struct DataPosition {
  uint64_t epoch = 0;
  std::vector<std::vector<size_t>> batches;
  size_t next_batch = 0;
};

struct Trainer {
  flame_ctx_t ctx = nullptr;
  const TrainConfig& config;       // what this run trains from (data.cache_file set by the caching stage)
  const TrainConfig& user_config;  // as given: the resumable state's settings fingerprint
  LoadedModel model;
  Objective objective;
  std::vector<TrainingSample> samples;
  Params adapter;
  Optimizer optimizer;
  LrSchedule schedule;
  std::unique_ptr<AdapterEma> ema;  // training.ema_decay > 0
  std::unique_ptr<StepGraphs> graphs;
  DataPosition data;
  // Data parallel (data_parallel.h): this rank; null on one GPU. next_batch returns the rank's part of
  // each global batch (global_batch.h), with its place and loss scale for batch_loss.
  DataParallelRank* dp = nullptr;
  RankShare share;

  Trainer(flame_ctx_t c, const TrainConfig& cfg, const TrainConfig& given) : ctx(c), config(cfg), user_config(given) {}

  // Samples per global batch: training.batch_size on each of the training.gpus GPUs.
  int global_batch_size() const { return config.training.batch_size * (dp ? dp->world() : 1); }

  // This rank's part of the next global batch of the data order (all of it on one GPU), planning the
  // next epoch when the current one is used up.
  const std::vector<size_t>& next_batch() {
    if (data.next_batch == data.batches.size()) {
      data.batches = plan_epoch_batches(samples, global_batch_size(), config.training.seed, data.epoch++);
      data.next_batch = 0;
    }
    share = rank_share(data.batches[data.next_batch++], dp ? dp->rank() : 0, dp ? dp->world() : 1);
    return share.batch;
  }

  // One optimizer step (0-based step): the accumulated batches, the update, the EMA; returns the mean
  // of the batches' weighted losses. Each micro-batch's draws run eagerly; its tensor work and the
  // update replay CUDA graphs where the step allows (step_graphs.h).
  double train_step(int64_t step) {
    double loss_sum = 0;
    for (int micro = 0; micro < config.training.gradient_accumulation_steps; ++micro) {
      const std::vector<size_t>& batch = next_batch();
      if (dp) dp->set_sync(micro + 1 == config.training.gradient_accumulation_steps);
      if (batch.empty()) continue;  // data parallel: no part of a short global batch for this rank
      // Noise and timesteps keyed by each sample's place in the global batch (batch_noise.h).
      const BatchPlace place{static_cast<uint64_t>(step), micro, share.first_position};
      const StepInputs in = draw_step_inputs(ctx, config, objective, samples, batch, place, share.loss_scale);
      // LoRA dropout's masks: this batch's own (each rank its own), whatever ran before (batch_noise.h)
      if (config.network.dropout > 0) seed_dropout_generator(ctx, config.training.seed, place);
      loss_sum += graphs->run_micro(in);
    }
    if (dp) dp->wait();  // the gradients averaged over the ranks, before clipping
    const double lr = config.optimizer.learning_rate * lr_multiplier(schedule, step);
    check(flame_optimizer_set_lr(optimizer.get(), -1, lr), "flame_optimizer_set_lr");
    graphs->run_update([&] { update(); });
    if (ema) ema->update(adapter.get(), step + 1);
    check(flame_ctx_synchronize(ctx), "flame_ctx_synchronize");
    return loss_sum / config.training.gradient_accumulation_steps;
  }

  void add_adapter(bool demo) {
    nlohmann::json lora = {{"rank", config.network.dim}, {"alpha", config.network.alpha},
                           {"dropout", config.network.dropout}};
    std::vector<std::string> targets = config.network.targets;
    // The demo's tiny random model can only reach its targets through the output projection: the
    // usual attention targets plus proj_out (and Flux's single-block MLP).
    if (targets.empty() && demo && model.shapes.family != ModelFamily::Sdxl) {
      targets = {"to_q", "to_k", "to_v", "to_out.0", "proj_out"};
      if (model.shapes.family == ModelFamily::Flux) targets.push_back("proj_mlp");
    }
    if (!targets.empty()) lora["targets"] = targets;
    check(flame_model_add_lora(model.model.get(), lora.dump().c_str(), adapter.out()), "flame_model_add_lora");
  }

  void make_optimizer() {
    const flame_optimizer_options_t o = adapter_optimizer_options(config);  // AdamW or Lion: optimizer_setup.h
    const flame_tensor_t* tensors = nullptr;
    int64_t n = 0;
    check(flame_params_count(adapter.get(), &n), "flame_params_count");
    check(flame_params_tensors(adapter.get(), &tensors), "flame_params_tensors");
    check(flame_optimizer_create(ctx, &o, tensors, n, optimizer.out()), "flame_optimizer_create");
    check(flame_optimizer_set_state_bits(optimizer.get(), optimizer_state_bits(config.optimizer.type)),
          "flame_optimizer_set_state_bits");
  }

  // Clipping, the optimizer step and the gradients zeroed (in place with graphs, which keep
  // accumulating into the same .grad memory; dropped otherwise).
  void update() {
    if (config.optimizer.max_grad_norm > 0) {
      const flame_tensor_t* tensors = nullptr;
      int64_t n = 0;
      check(flame_params_count(adapter.get(), &n), "flame_params_count");
      check(flame_params_tensors(adapter.get(), &tensors), "flame_params_tensors");
      check(flame_clip_grad_norm(ctx, tensors, n, config.optimizer.max_grad_norm, 2.0, 0, nullptr),
            "flame_clip_grad_norm");
    }
    check(flame_optimizer_step(optimizer.get()), "flame_optimizer_step");
    check(flame_optimizer_zero_grad(optimizer.get(), graphs->enabled() ? 0 : 1), "flame_optimizer_zero_grad");
  }

  void save_lora(const std::string& path) {
    const nlohmann::json options = {{"format", config.output.format},
                                    {"metadata", {{"ss_network_dim", std::to_string(config.network.dim)},
                                                  {"ss_network_alpha", std::to_string(config.network.alpha)},
                                                  {"flame_train_model", config.model.path}}}};
    check(flame_model_save_lora(model.model.get(), nullptr, path.c_str(), options.dump().c_str()), "flame_model_save_lora");
  }

  // The EMA's LoRA file: the shadow copied into the adapter in place, saved as the LoRA, the trained
  // adapter copied back (AdapterEma::with_shadow_in).
  void save_ema_lora(const std::string& path) {
    ema->with_shadow_in(adapter.get(), [&] { save_lora(path); });
  }

  // <name><suffix>.safetensors and, with the EMA, <name><suffix>-ema.safetensors; returns the first.
  std::string save_lora_files(const std::string& suffix) {
    const std::string path = output_file(config, suffix + ".safetensors");
    save_lora(path);
    if (ema) save_ema_lora(output_file(config, suffix + "-ema.safetensors"));
    return path;
  }

  std::string save_state(int64_t steps_done, bool demo) {
    TrainState state;
    state.step = steps_done;
    state.epoch = data.epoch;
    state.next_batch = data.next_batch;
    return save_train_state({ctx, adapter.get(), optimizer.get(), ema.get()}, user_config, demo, state);
  }

  // Restores the state that read_train_state accepted; returns the first step (0-based) to train.
  int64_t resume(const std::string& path, const TrainState& state) {
    load_train_state({ctx, adapter.get(), optimizer.get(), ema.get()}, path, state);
    data.epoch = state.epoch;
    data.batches = plan_epoch_batches(samples, global_batch_size(), config.training.seed, state.epoch - 1);
    if (state.next_batch > data.batches.size())
      throw std::runtime_error("training.resume " + path + ": next_batch " + std::to_string(state.next_batch) +
                               " is beyond the " + std::to_string(data.batches.size()) + " batches of epoch " +
                               std::to_string(state.epoch - 1) + " (the data changed?)");
    data.next_batch = static_cast<size_t>(state.next_batch);
    return state.step;
  }
};

// Model, data, objective, adapter, optimizer, EMA and schedule, as trainer.h describes (the memory
// check and the caching stage ran before: run_training).
void set_up(Trainer& t, bool demo) {
  const TrainConfig& config = t.config;
  t.model = load_training_model(t.ctx, config.model.path, config.model.arch, denoiser_model_options(config));
  if (demo) {
    t.samples = make_demo_samples(t.ctx, t.model.shapes, kDemoSamples, kDemoLatentSide, kDemoLatentSide, kDemoTokens,
                                  config.training.seed);
  } else {
    t.samples = load_latent_cache(t.ctx, config.data.cache_file, t.model.shapes);
  }
  t.objective = make_objective(config, t.model.shapes);
  check(flame_model_set_checkpointing(t.model.model.get(), config.training.gradient_checkpointing ? 1 : 0),
        "flame_model_set_checkpointing");
  check(flame_model_set_training(t.model.model.get(), 1), "flame_model_set_training");
  t.add_adapter(demo);
  t.make_optimizer();
  if (config.training.ema_decay > 0)
    t.ema = std::make_unique<AdapterEma>(t.ctx, t.adapter.get(), config.training.ema_decay, config.training.ema_warmup);
  t.graphs = std::make_unique<StepGraphs>(t.ctx, t.model.model.get(), t.adapter.get(), t.objective,
                                          config.training.gradient_accumulation_steps, graphs_blocker(config).empty());
  t.schedule = make_lr_schedule(config.optimizer.lr_scheduler, config.optimizer.lr_warmup_steps,
                                config.training.max_train_steps);
}

bool every(int64_t n, int64_t steps_done) { return n > 0 && steps_done % n == 0; }

// The files of a step: LoRA (and EMA) files, sample images, the state; final: the end of training.
void save_outputs(Trainer& t, SampleImages* sample_images, int64_t steps_done, bool final, bool demo) {
  const TrainConfig& c = t.config;
  if (final || every(c.output.save_every_n_steps, steps_done)) t.save_lora_files(step_suffix(steps_done, final));
  if (sample_images && (final || every(c.sample.every_n_steps, steps_done)))
    std::printf("samples: %s\n", sample_images->write(t.model.model.get(), steps_done).c_str());
  if (c.output.save_state_every_n_steps > 0 && (final || every(c.output.save_state_every_n_steps, steps_done)))
    std::printf("state: %s\n", t.save_state(steps_done, demo).c_str());
}

// Data parallel: every rank's adapter must hold the same bits at the end (data_parallel.h); rank 0
// says so, every rank throws otherwise.
void check_ranks_agree(DataParallelRank& dp, flame_ctx_t ctx, flame_params_t adapter) {
  if (!dp.adapters_identical(ctx, adapter))
    throw std::runtime_error("data parallel: the ranks' adapters differ after training (they must stay identical); "
                             "no final files written");
  if (dp.main()) std::printf("data parallel: the %d ranks' adapters are identical\n", dp.world());
}

// The step's JSON line (with the GPU memory at peak so far) and the progress line: on a terminal every
// step over the last one, else every 10 steps, the first and the last (progress.h).
void log_step(flame_ctx_t ctx, std::ofstream& log, Progress& progress, int64_t steps_done, double loss, double lr,
              double ms) {
  progress.record(steps_done, loss, ms);
  flame_memory_stats_t mem;
  mem.struct_size = sizeof mem;
  check(flame_ctx_memory_stats(ctx, &mem), "flame_ctx_memory_stats");
  log << nlohmann::json{{"step", steps_done}, {"loss", loss}, {"lr", lr}, {"ms", ms},
                        {"peak_gib", static_cast<double>(mem.peak_bytes_in_use) / 1073741824.0}}
             .dump()
      << "\n";
  log.flush();
  const std::string line = progress.line(lr, mem.bytes_in_use, mem.peak_bytes_in_use);
  if (::isatty(STDOUT_FILENO)) {
    std::printf("\r%s\x1b[K", line.c_str());
    std::fflush(stdout);
  } else if (progress.prints_in_log()) {
    std::printf("%s\n", line.c_str());
  }
  if (!std::isfinite(loss))
    throw std::runtime_error("step " + std::to_string(steps_done) +
                             ": the loss is not finite (NaN or infinite): training stopped (the files saved "
                             "before this step are kept; try a lower optimizer.learning_rate)");
}

}  // namespace

// The cache file to train from: data.cache_file, or the caching stage's (cache_writer.h), run before
// the denoiser is loaded so that the encoders and the VAE are gone when it is.
std::string training_cache_file(flame_ctx_t ctx, const TrainConfig& config) {
  if (!config.data.cache_file.empty()) return config.data.cache_file;
#ifdef FLAME_TRAIN_NO_IMAGES
  (void)ctx;
  throw std::runtime_error("no latent cache: this build has no image input, so it cannot run the caching stage; "
                           "give data.cache_file (see tools/flame-train/training_data.h) or run --demo");
#else
  return prepare_latent_cache(ctx, config);
#endif
}

TrainResult run_training(flame_ctx_t ctx, const TrainConfig& user_config, bool demo, const TrainState* resume_from,
                         DataParallelRank* dp) {
  const bool main = !dp || dp->main();  // data parallel: rank 0 alone writes files, logs and samples
  if (main && ::mkdir(user_config.output.dir.c_str(), 0777) != 0 && errno != EEXIST)
    throw std::runtime_error("cannot create " + user_config.output.dir);
  if (!dp) check_memory_estimate(ctx, user_config);  // memory_check.h: before any weight is read
  TrainConfig config = user_config;                  // data.cache_file: the cache this run trains from
  if (!demo) config.data.cache_file = dp ? dp->cache_file() : training_cache_file(ctx, user_config);
  Trainer t(ctx, config, user_config);
  set_up(t, demo);
  t.dp = dp;
  if (dp) dp->attach(t.adapter.get());  // rank 0's adapter on every rank
  std::unique_ptr<SampleImages> sample_images;  // sample.every_n_steps > 0: checked before the first step
  if (config.sample.every_n_steps > 0 && main)
    sample_images = std::make_unique<SampleImages>(ctx, config, t.model.shapes, demo, t.samples);

  TrainResult result;
  result.log_path = output_file(config, ".jsonl");
  int64_t first_step = 0;
  if (resume_from) {  // after every random draw of the set-up, so that the generator is the saved one
    first_step = t.resume(config.training.resume, *resume_from);
    if (main) {
      truncate_log_after(result.log_path, first_step);
      std::printf("resuming from %s at step %lld\n", config.training.resume.c_str(), static_cast<long long>(first_step + 1));
    }
  }
  std::ofstream log;
  if (main) {
    log.open(result.log_path, resume_from ? std::ios::app : std::ios::trunc);
    if (!log) throw std::runtime_error("cannot write " + result.log_path);
    std::printf("training a %s LoRA (rank %d) on %zu samples for %lld steps\n", family_name(t.model.shapes.family),
                config.network.dim, t.samples.size(), static_cast<long long>(config.training.max_train_steps));
  }
  if (main) {
    const std::string blocker = graphs_blocker(config);
    std::printf("step: %s\n", blocker.empty() ? "a CUDA graph per batch shape" : ("eager (" + blocker + ")").c_str());
  }

  Progress progress(config.training.max_train_steps, first_step);
  for (int64_t step = first_step; step < config.training.max_train_steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    double loss = t.train_step(step);
    if (dp) loss = dp->mean_over_ranks(ctx, loss);  // the global batch's mean (global_batch.h)
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (main) {
      log_step(ctx, log, progress, step + 1, loss, config.optimizer.learning_rate * lr_multiplier(t.schedule, step), ms);
    } else if (!std::isfinite(loss)) {  // rank 0 stops with the message (log_step)
      throw std::runtime_error("step " + std::to_string(step + 1) + ": the loss is not finite");
    }
    result.final_loss = loss;
    result.steps = step + 1;
    if (main && step + 1 < config.training.max_train_steps) save_outputs(t, sample_images.get(), step + 1, false, demo);
  }
  if (dp) check_ranks_agree(*dp, ctx, t.adapter.get());
  result.lora_path = output_file(config, ".safetensors");
  if (!main) return result;
  if (::isatty(STDOUT_FILENO)) std::printf("\n");  // end the progress line
  if (t.graphs->enabled() && t.graphs->graph_count() > 0)
    std::printf("CUDA graphs: %zu (%zu batch shape%s and the update)\n", t.graphs->graph_count(),
                t.graphs->bucket_count(), t.graphs->bucket_count() == 1 ? "" : "s");
  save_outputs(t, sample_images.get(), result.steps, true, demo);
  std::printf("saved %s (%s)\nlog: %s\n", result.lora_path.c_str(), config.output.format.c_str(), result.log_path.c_str());
  return result;
}

}  // namespace flame_train


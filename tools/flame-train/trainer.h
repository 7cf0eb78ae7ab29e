// The training loop of flame-train (issue 37), over the public C ABI only.
//
//   model      load_training_model (bf16), training mode, gradient checkpointing per the config;
//   adapter    flame_model_add_lora with network.dim / alpha / dropout / targets (the base frozen);
//   optimizer  AdamW or Lion (optimizer.type; optimizer_setup.h) over the adapter's tensors
//              (optimizer.learning_rate, beta1, beta2, weight_decay), its rate set before every step
//              from the schedule (lr_schedule.h);
//   data       the latent cache (training_data.h) or, with --demo, random data in the model's shapes;
//   a step     gradient_accumulation_steps batches, each: noise (flame_randn keyed per sample by
//              its place in the global batch, plus noise_offset times per-channel noise:
//              batch_noise.h), the objective's noisy input, target and per-sample weight
//              (objectives.h; Flux latents packed 2x2 as diffusers' _pack_latents with img_ids /
//              txt_ids), forward, weighted MSE divided by the accumulation count, backward; then
//              clipping (flame_clip_grad_norm, optimizer.max_grad_norm > 0), the optimizer step,
//              the gradients zeroed (training_step.h); with training.cuda_graphs (the default) each
//              batch shape's tensor work and the update replay CUDA graphs that share one memory
//              pool, the random draws made eagerly before each replay (step_graphs.h);
//   output     the LoRA (output.format, kohya by default) every output.save_every_n_steps steps as
//              <name>-step<N>.safetensors and at the end as <name>.safetensors in output.dir, and one
//              JSON line per step in <name>.jsonl: {"step", "loss", "lr", "ms"} (loss: the mean of
//              the step's batches' weighted losses; ms: the step's wall time, device included).
//              With training.ema_decay > 0 each LoRA file has a twin <name>[-step<N>]-ema.safetensors
//              in the same format holding the EMA of the adapter (ema.h), updated after every step.
//   samples    with sample.every_n_steps > 0, a row of sample images every that many steps and at the
//              end, in output.dir/samples (sample_images.h; the model in evaluation mode meanwhile).
//   data parallel  training.gpus > 1: data_parallel.h (global batch = batch_size x gpus).
//   state      with output.save_state_every_n_steps > 0, the resumable state every that many steps
//              and at the end (train_state.h); training.resume continues from one, the log's lines
//              after its step dropped, so that files and losses equal an uninterrupted run's.
#pragma once

#include <cstdint>
#include <string>

#include <flame.h>

#include "config.h"
#include "train_state.h"

namespace flame_train {

struct TrainResult {
  int64_t steps = 0;
  double final_loss = 0;
  std::string lora_path;  // the final LoRA file
  std::string log_path;   // the JSONL log
};

class DataParallelRank;  // data_parallel.h

// Runs the whole training on ctx. demo: random data in the model's shapes instead of the cache.
// resume_from: NULL for a fresh start, or what read_train_state returned for config.training.resume.
// dp: NULL on one GPU; else this rank of a data-parallel run (data_parallel.h, which calls this once
// per rank on its own thread): the memory check and the caching stage were done (dp's cache file),
// the step trains the rank's part of each global batch with averaged gradients, and only rank 0
// writes files, logs and samples.
// Throws FlameError (a library call failed) or std::runtime_error (bad data, files).
TrainResult run_training(flame_ctx_t ctx, const TrainConfig& config, bool demo, const TrainState* resume_from = nullptr,
                         DataParallelRank* dp = nullptr);

// The cache file to train from: data.cache_file, or the caching stage's (cache_writer.h) on ctx, run
// before the denoiser is loaded so that the encoders and the VAE are gone when it is. Throws without
// image input (FLAME_TRAIN_NO_IMAGES) when data.cache_file is empty.
std::string training_cache_file(flame_ctx_t ctx, const TrainConfig& config);

}  // namespace flame_train

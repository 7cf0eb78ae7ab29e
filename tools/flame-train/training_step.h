// One micro-batch of a training step, split in two so that the second half can be captured as a
// CUDA graph (step_graphs.h):
//   draw_step_inputs   everything random or data-dependent, run eagerly: the stacked latents and
//                      conditioning of the batch, the noise (flame_randn; noise_offset), and the
//                      objective's per-sample host draws (timestep, weight, the noisy-input and
//                      target coefficients) as small f32 tensors;
//   loss_and_backward  pure tensor work from those inputs: the noisy input and the target, Flux's
//                      2x2 packing, the forward, the weighted MSE divided by the accumulation count,
//                      the backward (gradients accumulate into the adapter's .grad).
// The objective's settings (Objective) are resolved once from the configuration and the model.
#pragma once

#include <cstdint>
#include <vector>

#include "batch_noise.h"
#include "config.h"
#include "flame_handles.h"
#include "model_setup.h"
#include "objectives.h"
#include "training_data.h"

namespace flame_train {

struct Objective {
  ModelFamily family = ModelFamily::Flux;
  FlowMatchOptions flow;
  PredictionType prediction = PredictionType::Epsilon;
  std::vector<double> alphas_cumprod;
  double min_snr_gamma = 0, noise_offset = 0, guidance = 1;
  bool guidance_embeds = false;
};

Objective make_objective(const TrainConfig& c, const ModelShapes& shapes);

// The tensors a micro-batch's loss is computed from (B samples of one bucket).
struct StepInputs {
  int64_t batch = 0, channels = 0, height = 0, width = 0, tokens = 0;  // B, latent C / H / W, text T
  Tensor x0, noise;                                // [B, C, H, W] f32
  Tensor noisy_a, noisy_b, target_a, target_b;     // [B, 1, 1, 1] f32: noisy = x0 a + noise b, ...
  Tensor timesteps, weights;                       // [B] f32
  Tensor embeds, pooled, time_ids;                 // the cache's stacked tensors (time_ids: SDXL)
  Tensor img_ids, txt_ids, guidance;               // Flux: RoPE ids, guidance [B] (if embedded)
  Tensor loss_scale;                               // [] f32: the loss is multiplied by it
};

// The inputs of a micro-batch at `place` (its step, micro-step and first position in the global
// batch): the noise and the timestep draws of each sample depend only on (training.seed, step, micro,
// position in the global batch) (batch_noise.h). loss_scale: this rank's share of a short global
// batch's mean under data parallel (global_batch.h), else 1.
StepInputs draw_step_inputs(flame_ctx_t ctx, const TrainConfig& config, const Objective& objective,
                            const std::vector<TrainingSample>& samples, const std::vector<size_t>& batch,
                            const BatchPlace& place, double loss_scale);

// Forward and backward of one micro-batch; returns the weighted loss times in.loss_scale (before the
// division by the accumulation count), a 0-d f32 tensor.
Tensor loss_and_backward(flame_ctx_t ctx, flame_model_t model, const Objective& objective, const StepInputs& in,
                         int accumulation_steps);

}  // namespace flame_train

// The samplers of flame-train's sample images (issue 37), over the public C ABI only: one image's
// latent denoised from seeded noise by the model being trained, as diffusers' pipelines do it
// (the host arithmetic is sampling_schedules.h's):
//   Flux  FluxPipeline: FlowMatchEulerDiscreteScheduler with the resolution-dependent shift, latents
//         packed 2x2 with img_ids / txt_ids, the guidance input = guidance_scale (guidance-distilled
//         models), no classifier-free guidance;
//   SD3   StableDiffusion3Pipeline: the same scheduler with shift 3.0 (or training.flow_shift when
//         set), classifier-free guidance when guidance_scale > 1 (negative and positive as one batch
//         of two, uncond + g (text - uncond));
//   SDXL  StableDiffusionXLPipeline: EulerDiscreteScheduler or DDIMScheduler ("leading" spacing),
//         the model's prediction type, size conditioning time_ids (H, W, 0, 0, H, W) in pixels,
//         classifier-free guidance as SD3.
// The starting noise comes from the context's generator reseeded with the given seed, and the
// generator's state is put back afterwards: samples do not disturb the training's random stream,
// and the same seed gives the same noise in every round. The caller puts the model in evaluation
// mode with grad mode off (InferenceScope).
#pragma once

#include <cstdint>

#include "flame_handles.h"
#include "model_setup.h"
#include "objectives.h"
#include "sampling_schedules.h"

namespace flame_train {

struct SamplerSettings {
  int steps = 20;
  double guidance_scale = 3.5;
  SdxlSampler sdxl_sampler = SdxlSampler::Euler;
  PredictionType prediction = PredictionType::Epsilon;  // SDXL
  double sd3_shift = 3.0;
  int64_t latent_height = 0, latent_width = 0;  // the sample's latent size
  int64_t pixel_height = 0, pixel_width = 0;    // its decoded size (SDXL's time_ids)
};

// One prompt's conditioning, BORROWED: embeds [T, D], pooled [P]; the negative ones (SDXL, SD3 with
// guidance_scale > 1) of the same shapes, or NULL for Flux.
struct PromptConditioning {
  flame_tensor_t embeds = nullptr, pooled = nullptr;
  flame_tensor_t negative_embeds = nullptr, negative_pooled = nullptr;
};

// The denoised latent [1, C, h, w] (f32, in the denoiser's scale: Flux's unpacked) of one prompt,
// from the noise of seed. Throws FlameError or std::runtime_error (a negative prompt missing where
// guidance needs one, shapes that differ).
Tensor sample_latent(flame_ctx_t ctx, flame_model_t model, const ModelShapes& shapes, const SamplerSettings& settings,
                     const PromptConditioning& prompt, uint64_t seed);

// Evaluation mode and grad mode off for the scope; on leaving, grad mode as it was and the model
// back in training mode when restore_training (errors on the way out are ignored: nothing to undo).
class InferenceScope {
 public:
  InferenceScope(flame_ctx_t ctx, flame_model_t model, bool restore_training);
  ~InferenceScope();
  InferenceScope(const InferenceScope&) = delete;
  InferenceScope& operator=(const InferenceScope&) = delete;

 private:
  flame_ctx_t ctx_;
  flame_model_t model_;
  bool restore_training_;
  int32_t previous_grad_ = 1;
};

// The context's generator reseeded with seed for the scope (flame_ctx_manual_seed); its previous
// state (seed and offset) is put back on leaving.
class ReseededGenerator {
 public:
  ReseededGenerator(flame_ctx_t ctx, uint64_t seed);
  ~ReseededGenerator();
  ReseededGenerator(const ReseededGenerator&) = delete;
  ReseededGenerator& operator=(const ReseededGenerator&) = delete;

 private:
  flame_ctx_t ctx_;
  uint64_t seed_ = 0, offset_ = 0;
};

}  // namespace flame_train

// What the denoiser trains on (flame-train): per image, its VAE latent and its text conditioning,
// held on the GPU for the whole run (they are small next to the model), grouped into batches of
// equal shapes.
//
// The latent cache file (written by the caching stage: VAE encode + text encoders; read here) is one
// safetensors file with metadata
//   "flame_train_cache": "1", "family": "flux" | "sdxl" | "sd3", "count": N (decimal)
// and, for every image i in 0 .. N-1 (i in decimal, no padding):
//   "latents.<i>"              [C, H, W] bf16 (or f32): the VAE posterior's mean, already scaled
//                              as the denoiser sees it: (mean - shift_factor) * scaling_factor
//                              (Flux: C 16, shift 0.1159, scale 0.3611; SD3: C 16, shift 0.0609,
//                              scale 1.5305; SDXL: C 4, scale 0.13025); H, W = pixels / 8
//   "prompt_embeds.<i>"        [T, D] bf16 (or f32): Flux: T5-XXL last hidden state (T 512, D 4096);
//                              SD3: CLIP-L and CLIP-G penultimate states concatenated on D, padded
//                              to 4096, then T5 along T (T 77 + 256, D 4096); SDXL: CLIP-L and
//                              CLIP-G penultimate states concatenated on D (T 77, D 2048)
//   "pooled_prompt_embeds.<i>" [P]: Flux: CLIP-L pooled (768); SD3: CLIP-L and CLIP-G pooled
//                              (2048); SDXL: CLIP-G's projected text_embeds (1280)
//   "time_ids.<i>"             [6] f32, SDXL only: original height, width, crop top, left, target
//                              height, width in pixels (add_time_ids)
//   "fingerprint"              metadata: cache_fingerprint.h's hash of every input and setting;
//                              the caching stage reuses the file when it matches, else rewrites it
// The sampler's conditioning (optional; metadata "sample_prompts": S, decimal, 0 or absent for none),
// for k in 0 .. S-1 over the configuration's sample.prompts in order:
//   "sample_prompt_embeds.<k>"        [T, D] as prompt_embeds
//   "sample_pooled_prompt_embeds.<k>" [P] as pooled_prompt_embeds
// and for SDXL and SD3 (classifier-free guidance), the empty prompt's, as diffusers' pipelines
// encode negative_prompt = "" (not zeroed; force_zeros_for_empty_prompt is not applied):
//   "negative_prompt_embeds"          [T, D]
//   "negative_pooled_prompt_embeds"   [P]
// Every shape is checked against the model (ModelShapes) when the file is read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flame_handles.h"
#include "model_setup.h"

namespace flame_train {

struct TrainingSample {
  Tensor latents;        // [C, H, W]
  Tensor prompt_embeds;  // [T, D]
  Tensor pooled;         // [P]
  Tensor time_ids;       // [6] f32 (SDXL), else empty
  int64_t height = 0, width = 0, tokens = 0;  // latent H, W and T
};

// Reads the cache file (format above) onto ctx. Throws std::runtime_error naming the file and the
// key for a missing key, a wrong family or a shape the model cannot take; FlameError for I/O.
std::vector<TrainingSample> load_latent_cache(flame_ctx_t ctx, const std::string& path, const ModelShapes& shapes);

// The sample prompts' conditioning of the cache file (format above): one entry per sample prompt;
// negatives empty for Flux (it samples with distilled guidance, without a negative prompt).
struct SampleConditioning {
  std::vector<Tensor> prompt_embeds;  // [T, D] per prompt
  std::vector<Tensor> pooled;         // [P] per prompt
  Tensor negative_prompt_embeds;      // [T, D], SDXL / SD3
  Tensor negative_pooled;             // [P], SDXL / SD3
};

// Reads the sample conditioning onto ctx; no prompts (and no negatives) when the file has metadata
// sample_prompts 0 or none. Throws like load_latent_cache (missing key, wrong family, bad shape).
SampleConditioning load_sample_conditioning(flame_ctx_t ctx, const std::string& path, const ModelShapes& shapes);

// The --demo data set: count samples of latent size height x width with tokens text tokens, in the
// model's shapes. Latents are smooth per-sample patterns (a sinusoid per channel plus an offset, std
// about 0.3), embeddings standard normal: fixed by seed, so that a run overfits them and the loss falls.
std::vector<TrainingSample> make_demo_samples(flame_ctx_t ctx, const ModelShapes& shapes, int count, int64_t height,
                                              int64_t width, int64_t tokens, uint64_t seed);

// Batches of sample indices for one epoch: samples of equal (H, W, T) together, at most batch_size
// per batch, order and membership shuffled by (seed, epoch) with RandomStream (BatchOrder).
std::vector<std::vector<size_t>> plan_epoch_batches(const std::vector<TrainingSample>& samples, int batch_size,
                                                    uint64_t seed, uint64_t epoch);

}  // namespace flame_train

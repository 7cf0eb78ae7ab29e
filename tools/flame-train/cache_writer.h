// The caching stage of flame-train (issue 37): the latent cache file (training_data.h's format)
// computed by flame-train itself from data.path, through FLAME's model C ABI, and reused across runs.
//
//   decide     the family (model.arch, demo:<family>, or a diffusers folder's model_index.json), the
//              sources (conditioning_sources.h), the plan (cache_plan.h) and the fingerprint
//              (cache_fingerprint.h: images, captions, settings, seed, sample prompts, every file of
//              the VAE, text encoders and tokenizers); a matching file is reused without loading any
//              encoder ("latent cache: reusing ..." on stdout);
//   text pass  each distinct text tokenized (CLIP BPE 77 tokens; T5 512 for Flux, 256 for SD3, as
//              diffusers' pipelines) and encoded one encoder at a time, each loaded in bf16, run with
//              grad mode off and released before the next:
//                Flux: CLIP-L pooler_output; T5 last_hidden_state
//                SDXL: CLIP-L and CLIP-G hidden_states[-2] concatenated on D; CLIP-G text_embeds
//                SD3:  CLIP-L and CLIP-G hidden_states[-2] concatenated on D, zero-padded to T5's
//                      width, then T5's last_hidden_state along T; pooled: both text_embeds
//              (no attention mask, as diffusers' pipelines call them);
//   image pass each distinct (image, crop, flip) loaded by load_batch (bucket, resize, crop, flip) and
//              encoded by the VAE: the posterior mean, (mean - shift_factor) * scaling_factor, bf16;
//              SDXL's time_ids from the original size, the crop and the bucket;
//   write      one flame_safetensors_save (atomic) into <output.dir>/latent_cache.safetensors with
//              the metadata fingerprint; all encoders and the VAE are released on return, so the
//              denoiser, loaded after this, never shares the GPU with them.
// Augmentations are frozen at their epoch-0 draw (one cache entry per sample, i.e. per repeat).
#pragma once

#include <string>
#include <vector>

#include "conditioning_sources.h"
#include "config.h"
#include "flame_handles.h"

namespace flame_train {

// The cache file of a run from data.path.
std::string latent_cache_path(const TrainConfig& config);

// The family ("flux" | "sdxl" | "sd3") from model.arch, a demo:<family> path or the diffusers
// folder's model_index.json "_class_name". Throws std::runtime_error when none says it.
std::string caching_family(const TrainConfig& config);

// Per text: prompt_embeds [T, D] and pooled [P] (bf16), in training_data.h's layout for family.
struct TextConditioning {
  std::vector<Tensor> embeds, pooled;
};

// Encodes texts with the family's encoders (sources.encoders, in the pipeline's order), loading and
// releasing one at a time. model_path: model.path (for bundled single files). Throws FlameError or
// std::runtime_error (a tokenizer that does not load, an encoder of an unexpected class).
TextConditioning encode_texts(flame_ctx_t ctx, const std::string& family, const ConditioningSources& sources,
                              const std::string& model_path, const std::vector<std::string>& texts);

// Runs the caching stage (above) for config and returns the cache file's path. Throws FlameError,
// std::runtime_error, DatasetError or CacheFileError (a file at the path that is not a cache).
std::string prepare_latent_cache(flame_ctx_t ctx, const TrainConfig& config);

}  // namespace flame_train

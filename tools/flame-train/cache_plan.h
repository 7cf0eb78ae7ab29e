// The caching stage's plan and reuse decision (flame-train), CPU only: what the encoders must see
// and whether an existing cache file can be used as it is.
//
// Plan: one cache entry per training sample (each repeat of an image is a sample, as in the bucket
// plan), with the augmentations of epoch 0 frozen into it: the caption after dropout / shuffling
// (process_caption with training.seed, epoch 0, the sample's id: what load_batch gives it), and the
// crop and flip load_batch draws for it. Captions are deduplicated: the text pass encodes each
// distinct text once (training captions, then the sample prompts, then "" as the negative for SDXL
// and SD3); images are deduplicated by (image, crop and flip keys): without random_crop / flip_aug all
// repeats of an image share one VAE encode.
//
// Reuse: the cache file's safetensors header is read on the CPU (no GPU, no tensor data): a
// flame-train cache (metadata flame_train_cache "1") of the same family and fingerprint is reused;
// one with another fingerprint or family is re-encoded (replaced); a file that is not a flame-train
// cache (not safetensors, a corrupt header, another program's file) is refused with an error, so that
// nothing the user owns is overwritten.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "dataset.h"

namespace flame_train {

struct CacheEntry {
  size_t image = 0;          // into Dataset::images
  uint64_t sample_id = 0;    // keys the augmentation draws (buckets.h Sample::id)
  size_t bucket = 0;         // into BucketPlan::buckets
  size_t caption = 0;        // into CachePlan::texts
  size_t latent = 0;         // into CachePlan::latents (entries sharing an encode share an index)
};

struct CachePlan {
  std::vector<CacheEntry> entries;          // in bucket-plan order; entry i is "latents.<i>" etc.
  std::vector<std::string> texts;           // distinct texts to encode
  std::vector<size_t> latents;              // per distinct latent: the first entry that needs it
  std::vector<size_t> sample_prompts;       // per sample prompt: its index in texts
  int64_t negative = -1;                    // the empty prompt's index in texts (SDXL / SD3), else -1
};

// The plan for dataset / plan under options (captions, flip, crop) and seed; sample_prompts in order;
// with_negative: also encode "" (SDXL, SD3).
CachePlan plan_cache(const Dataset& dataset, const BucketPlan& plan, const DataOptions& options, uint64_t seed,
                     const std::vector<std::string>& sample_prompts, bool with_negative);

// A safetensors file's "__metadata__" strings. Throws CacheFileError when the file cannot be read or
// is not a safetensors file (header length, JSON, metadata values that are not strings).
class CacheFileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
std::map<std::string, std::string> read_safetensors_metadata(const std::string& path);

enum class CacheAction { Encode, Reuse };

struct CacheDecision {
  CacheAction action = CacheAction::Encode;
  std::string reason;  // for the log: "no cache file yet", "the fingerprint changed", ...
};

// The decision for the cache file at path (see above). Throws CacheFileError to refuse a file that
// is not a flame-train cache.
CacheDecision decide_cache_use(const std::string& path, const std::string& family, const std::string& fingerprint);

}  // namespace flame_train

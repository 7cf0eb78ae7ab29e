// The latent cache's fingerprint (flame-train's caching stage): one hash of every input and setting
// that decides the cache file's contents, stored in the file's metadata ("fingerprint") so that a
// later run reuses the file when the hash matches and recomputes it (saying so) when it does not.
//
// Hashed, in this order, each field length-prefixed (so "ab" + "c" never equals "a" + "bc"):
//   format version; family; dtype; resolution and bucket options; caption options; flip / random
//   crop; the seed of the cached augmentation draws; the sample prompts (their conditioning is cached);
//   per image in dataset order: path, byte size, modification time (ns), caption, repeats;
//   per model file (denoiser, VAE, text encoders, tokenizer files; in the given order): path, byte
//   size, modification time (ns); a missing model file hashes as size -1, mtime 0.
// The hash is 64-bit FNV-1a, written as 16 lower-case hex digits: it detects changed inputs, it is
// not a security measure. Image sizes and mtimes come from the file system (std::filesystem), so a
// file rewritten with equal content but a new mtime invalidates the cache (kohya does the same).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dataset.h"

namespace flame_train {

struct CacheSettings {
  std::string family;  // "flux" | "sdxl" | "sd3"
  std::string dtype;   // the cache's tensor dtype ("bf16" | "f32")
  BucketOptions buckets;
  CaptionOptions captions;
  bool flip_aug = false;
  bool random_crop = false;
  uint64_t seed = 0;                        // training.seed: keys the cached caption / crop / flip draws
  std::vector<std::string> sample_prompts;  // sample.prompts, whose embeddings the cache holds
  std::vector<std::string> model_files;  // every file the conditioning comes from
};

// 64-bit FNV-1a over bytes, continuing from state (start with kFnvOffsetBasis).
constexpr uint64_t kFnvOffsetBasis = 0xcbf29ce484222325ull;
uint64_t fnv1a64(const void* bytes, size_t count, uint64_t state);

// The fingerprint of (dataset, settings) as 16 hex digits; reads only file sizes and mtimes.
std::string cache_fingerprint(const Dataset& dataset, const CacheSettings& settings);

}  // namespace flame_train

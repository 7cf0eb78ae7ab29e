// Deterministic random numbers for the data pipeline (flame-train).
//
// Every random decision (caption dropout, tag order, crop offset, flip, batch order) draws from a
// stream keyed by (seed, purpose, epoch, item): the same configuration gives the same data order
// and augmentations on every machine and standard library, whatever order the items are loaded in
// (the resumable-state and multi-GPU work of issue 37 relies on that). std::mt19937 plus the
// <random> distributions would not do: the distributions are implementation-defined.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace flame_train {

// What a stream is for; part of its key, so that two purposes never share numbers.
enum class RandomPurpose : uint64_t {
  CaptionDropout = 1,
  CaptionShuffle = 2,
  CaptionTagDropout = 3,
  Crop = 4,
  Flip = 5,
  BatchOrder = 6,
  Timestep = 7,  // the noise level of each sample of a training step
  DemoData = 8,  // the --demo data set
  Noise = 9,     // the Philox key of each sample's training noise (batch_noise.h)
  Dropout = 10,  // the Philox key of a micro-batch's LoRA dropout masks (batch_noise.h)
};

// splitmix64 stream: small, fast and statistically fine for shuffles and coin flips.
class RandomStream {
 public:
  RandomStream(uint64_t seed, RandomPurpose purpose, uint64_t epoch, uint64_t item);
  uint64_t next_u64();
  // Uniform in [0, 1) with 53 random bits.
  double next_unit();
  // Uniform integer in [0, bound) without modulo bias; bound 0 returns 0.
  uint64_t next_below(uint64_t bound);

 private:
  uint64_t state_;
};

// Fisher-Yates shuffle of v with the stream's numbers (the same permutation everywhere).
template <typename T>
void shuffle_with(std::vector<T>& v, RandomStream& rng) {
  for (size_t i = v.size(); i > 1; --i) {
    size_t j = static_cast<size_t>(rng.next_below(i));
    std::swap(v[i - 1], v[j]);
  }
}

}  // namespace flame_train

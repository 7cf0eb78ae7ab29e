// Deterministic random streams (see random.h).
#include "random.h"

namespace flame_train {
namespace {

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

RandomStream::RandomStream(uint64_t seed, RandomPurpose purpose, uint64_t epoch, uint64_t item) {
  // Chained mixing: each key part changes the whole state.
  uint64_t s = mix64(seed + 0x9e3779b97f4a7c15ULL);
  s = mix64(s ^ (static_cast<uint64_t>(purpose) * 0x9e3779b97f4a7c15ULL));
  s = mix64(s ^ (epoch + 0x632be59bd9b4e019ULL));
  s = mix64(s ^ (item + 0x85ebca6b0c2f1a53ULL));
  state_ = s;
}

uint64_t RandomStream::next_u64() {
  state_ += 0x9e3779b97f4a7c15ULL;
  return mix64(state_);
}

double RandomStream::next_unit() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

uint64_t RandomStream::next_below(uint64_t bound) {
  if (bound == 0) return 0;
  // Rejection of the top partial range: threshold = 2^64 mod bound.
  const uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    uint64_t r = next_u64();
    if (r >= threshold) return r % bound;
  }
}

}  // namespace flame_train

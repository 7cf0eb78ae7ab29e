// Implements cache_fingerprint.h: a length-prefixed field stream fed to FNV-1a 64.
#include "cache_fingerprint.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <system_error>

namespace flame_train {

uint64_t fnv1a64(const void* bytes, size_t count, uint64_t state) {
  const auto* data = static_cast<const unsigned char*>(bytes);
  for (size_t i = 0; i < count; ++i) {
    state ^= data[i];
    state *= 0x100000001b3ull;
  }
  return state;
}

namespace {

constexpr int kFingerprintVersion = 2;

class FieldHasher {
 public:
  void add(const std::string& text) {
    add_integer(static_cast<int64_t>(text.size()));
    state_ = fnv1a64(text.data(), text.size(), state_);
  }
  void add_integer(int64_t value) {
    unsigned char little_endian[8];
    for (int i = 0; i < 8; ++i) little_endian[i] = static_cast<unsigned char>(static_cast<uint64_t>(value) >> (8 * i));
    state_ = fnv1a64(little_endian, sizeof little_endian, state_);
  }
  void add_real(double value) {
    char text[32];
    std::snprintf(text, sizeof text, "%.17g", value);
    add(text);
  }
  // Path, byte size and modification time in ns; size -1 and time 0 when the file is missing.
  void add_file(const std::string& path) {
    add(path);
    std::error_code error;
    const auto size = std::filesystem::file_size(path, error);
    if (error) {
      add_integer(-1);
      add_integer(0);
      return;
    }
    const auto written = std::filesystem::last_write_time(path, error);
    add_integer(static_cast<int64_t>(size));
    add_integer(error ? 0
                      : static_cast<int64_t>(
                            std::chrono::duration_cast<std::chrono::nanoseconds>(written.time_since_epoch()).count()));
  }
  uint64_t value() const { return state_; }

 private:
  uint64_t state_ = kFnvOffsetBasis;
};

void add_settings(FieldHasher& hasher, const CacheSettings& settings) {
  hasher.add_integer(kFingerprintVersion);
  hasher.add(settings.family);
  hasher.add(settings.dtype);
  const BucketOptions& buckets = settings.buckets;
  for (int value : {buckets.enabled ? 1 : 0, buckets.resolution, buckets.min_side, buckets.max_side, buckets.step})
    hasher.add_integer(value);
  const CaptionOptions& captions = settings.captions;
  hasher.add_real(captions.dropout_rate);
  hasher.add_real(captions.tag_dropout_rate);
  hasher.add_integer(captions.shuffle ? 1 : 0);
  hasher.add_integer(captions.keep_tokens);
  hasher.add(captions.separator);
  hasher.add_integer(settings.flip_aug ? 1 : 0);
  hasher.add_integer(settings.random_crop ? 1 : 0);
  hasher.add_integer(static_cast<int64_t>(settings.seed));
  hasher.add_integer(static_cast<int64_t>(settings.sample_prompts.size()));
  for (const std::string& prompt : settings.sample_prompts) hasher.add(prompt);
}

}  // namespace

std::string cache_fingerprint(const Dataset& dataset, const CacheSettings& settings) {
  FieldHasher hasher;
  add_settings(hasher, settings);
  hasher.add_integer(static_cast<int64_t>(dataset.images.size()));
  for (const ImageEntry& image : dataset.images) {
    hasher.add_file(image.path);
    hasher.add(image.caption);
    hasher.add_integer(image.repeats);
  }
  hasher.add_integer(static_cast<int64_t>(settings.model_files.size()));
  for (const std::string& path : settings.model_files) hasher.add_file(path);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hasher.value()));
  return hex;
}

}  // namespace flame_train

// Implements cache_plan.h: the entry / text / latent plan and the header-only reuse decision.
#include "cache_plan.h"

#include <filesystem>
#include <fstream>
#include <utility>

#include <nlohmann/json.hpp>

namespace flame_train {
namespace {

// A safetensors header above this is not one flame-train writes (nor a sane file).
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

size_t text_index(std::vector<std::string>& texts, std::map<std::string, size_t>& seen, const std::string& text) {
  const auto found = seen.find(text);
  if (found != seen.end()) return found->second;
  texts.push_back(text);
  seen.emplace(text, texts.size() - 1);
  return texts.size() - 1;
}

}  // namespace

CachePlan plan_cache(const Dataset& dataset, const BucketPlan& plan, const DataOptions& options, uint64_t seed,
                     const std::vector<std::string>& sample_prompts, bool with_negative) {
  CachePlan out;
  std::map<std::string, size_t> seen_texts;
  std::map<std::pair<size_t, uint64_t>, size_t> seen_latents;  // (image, draw key) -> latent index
  const bool per_sample_pixels = options.random_crop || options.flip_aug;
  for (size_t b = 0; b < plan.members.size(); ++b)
    for (const Sample& sample : plan.members[b]) {
      CacheEntry e;
      e.image = sample.image;
      e.sample_id = sample.id;
      e.bucket = b;
      const std::string caption =
          process_caption(dataset.images.at(sample.image).caption, options.captions, seed, 0, sample.id);
      e.caption = text_index(out.texts, seen_texts, caption);
      const std::pair<size_t, uint64_t> key{sample.image, per_sample_pixels ? sample.id : 0};
      const auto found = seen_latents.find(key);
      if (found != seen_latents.end()) {
        e.latent = found->second;
      } else {
        e.latent = out.latents.size();
        out.latents.push_back(out.entries.size());
        seen_latents.emplace(key, e.latent);
      }
      out.entries.push_back(e);
    }
  for (const std::string& prompt : sample_prompts) out.sample_prompts.push_back(text_index(out.texts, seen_texts, prompt));
  if (with_negative) out.negative = static_cast<int64_t>(text_index(out.texts, seen_texts, ""));
  return out;
}

std::map<std::string, std::string> read_safetensors_metadata(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CacheFileError(path + ": cannot be read");
  unsigned char length_bytes[8];
  if (!in.read(reinterpret_cast<char*>(length_bytes), sizeof length_bytes))
    throw CacheFileError(path + ": not a safetensors file (shorter than its 8-byte header length)");
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | length_bytes[i];
  std::error_code error;
  const uint64_t file_size = std::filesystem::file_size(path, error);
  if (length == 0 || length > kMaxHeaderBytes || error || length > file_size - 8)
    throw CacheFileError(path + ": not a safetensors file (header length " + std::to_string(length) + ")");
  std::string header(static_cast<size_t>(length), '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(length)))
    throw CacheFileError(path + ": not a safetensors file (truncated header)");
  const nlohmann::json json = nlohmann::json::parse(header, nullptr, false);
  if (json.is_discarded() || !json.is_object())
    throw CacheFileError(path + ": not a safetensors file (its header is not a JSON object)");
  std::map<std::string, std::string> metadata;
  const auto found = json.find("__metadata__");
  if (found == json.end()) return metadata;
  if (!found->is_object()) throw CacheFileError(path + ": safetensors __metadata__ is not an object");
  for (const auto& [key, value] : found->items()) {
    if (!value.is_string()) throw CacheFileError(path + ": safetensors metadata '" + key + "' is not a string");
    metadata[key] = value.get<std::string>();
  }
  return metadata;
}

CacheDecision decide_cache_use(const std::string& path, const std::string& family, const std::string& fingerprint) {
  std::error_code error;
  if (!std::filesystem::exists(path, error)) return {CacheAction::Encode, "no cache file yet"};
  const std::map<std::string, std::string> metadata = read_safetensors_metadata(path);
  auto value = [&](const char* key) {
    const auto found = metadata.find(key);
    return found == metadata.end() ? std::string() : found->second;
  };
  if (value("flame_train_cache") != "1")
    throw CacheFileError(path + " is not a flame-train latent cache (no metadata flame_train_cache \"1\"): refusing "
                                "to overwrite it; move it away or set output.dir to another folder");
  if (value("family") != family)
    return {CacheAction::Encode, "the cache was made for a '" + value("family") + "' model, this one is " + family};
  if (value("fingerprint") != fingerprint)
    return {CacheAction::Encode, "inputs or settings changed (fingerprint " + value("fingerprint") + " -> " +
                                     fingerprint + ")"};
  return {CacheAction::Reuse, "fingerprint " + fingerprint + " matches"};
}

}  // namespace flame_train

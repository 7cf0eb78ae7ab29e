// Caption dropout, tag shuffling with fixed leading tags, tag dropout (see captions.h).
#include "captions.h"

#include "random.h"

namespace flame_train {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

std::string join_tags(const std::vector<std::string>& tags) {
  std::string out;
  for (size_t i = 0; i < tags.size(); ++i) {
    if (i) out += ", ";
    out += tags[i];
  }
  return out;
}

}  // namespace

std::vector<std::string> split_tags(const std::string& caption, const std::string& separator) {
  std::vector<std::string> tags;
  if (separator.empty()) {
    std::string t = trim(caption);
    if (!t.empty()) tags.push_back(t);
    return tags;
  }
  size_t start = 0;
  for (;;) {
    size_t pos = caption.find(separator, start);
    std::string t = trim(caption.substr(start, pos == std::string::npos ? std::string::npos : pos - start));
    if (!t.empty()) tags.push_back(std::move(t));
    if (pos == std::string::npos) break;
    start = pos + separator.size();
  }
  return tags;
}

std::string process_caption(const std::string& caption, const CaptionOptions& options, uint64_t seed,
                            uint64_t epoch, uint64_t item) {
  if (options.dropout_rate > 0.0) {
    RandomStream drop(seed, RandomPurpose::CaptionDropout, epoch, item);
    if (drop.next_unit() < options.dropout_rate) return "";
  }
  if (!options.shuffle && options.tag_dropout_rate <= 0.0) return trim(caption);

  std::vector<std::string> tags = split_tags(caption, options.separator);
  size_t fixed = options.keep_tokens > 0 ? static_cast<size_t>(options.keep_tokens) : 0;
  if (fixed > tags.size()) fixed = tags.size();
  std::vector<std::string> result(tags.begin(), tags.begin() + static_cast<std::ptrdiff_t>(fixed));
  std::vector<std::string> flexible(tags.begin() + static_cast<std::ptrdiff_t>(fixed), tags.end());
  if (options.shuffle) {
    RandomStream order(seed, RandomPurpose::CaptionShuffle, epoch, item);
    shuffle_with(flexible, order);
  }
  RandomStream tag_drop(seed, RandomPurpose::CaptionTagDropout, epoch, item);
  for (auto& tag : flexible) {
    if (options.tag_dropout_rate > 0.0 && tag_drop.next_unit() < options.tag_dropout_rate) continue;
    result.push_back(std::move(tag));
  }
  return join_tags(result);
}

}  // namespace flame_train

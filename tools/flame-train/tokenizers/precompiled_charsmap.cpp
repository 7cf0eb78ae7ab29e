// SentencePiece charsmap normalization as the tokenizers library applies it (see precompiled_charsmap.h).
#include "precompiled_charsmap.h"

#include "unicode_text.h"

#include <utf8proc.h>

#include <cstring>

namespace flame_train {
namespace {

// darts-clone unit layout: label in bits 0-7 (bit 31 set on value units), has_leaf bit 8, offset
// in bits 10-30 scaled by bit 9.
uint32_t unit_offset(uint32_t unit) { return (unit >> 10) << ((unit & (1u << 9)) >> 6); }
uint32_t unit_label(uint32_t unit) { return unit & ((1u << 31) | 0xFFu); }
bool unit_has_leaf(uint32_t unit) { return ((unit >> 8) & 1u) != 0; }
uint32_t unit_value(uint32_t unit) { return unit & ((1u << 31) - 1); }

bool read_varint(std::string_view b, size_t& at, uint64_t& out) {
  out = 0;
  for (int shift = 0; shift < 64 && at < b.size(); shift += 7) {
    auto byte = static_cast<uint8_t>(b[at++]);
    out |= static_cast<uint64_t>(byte & 0x7Fu) << shift;
    if (byte < 0x80) return true;
  }
  return false;
}

// Finds length-delimited field `field` of a protobuf message; nullopt when absent, false on
// malformed bytes. The last occurrence wins, as protobuf parsing does for a bytes field.
bool find_bytes_field(std::string_view msg, uint32_t field, std::optional<std::string_view>& out) {
  out.reset();
  size_t at = 0;
  while (at < msg.size()) {
    uint64_t key = 0, len = 0;
    if (!read_varint(msg, at, key)) return false;
    switch (key & 7u) {
      case 0:
        if (!read_varint(msg, at, len)) return false;
        break;
      case 1:
        if (msg.size() - at < 8) return false;
        at += 8;
        break;
      case 5:
        if (msg.size() - at < 4) return false;
        at += 4;
        break;
      case 2:
        if (!read_varint(msg, at, len) || len > msg.size() - at) return false;
        if ((key >> 3) == field) out = msg.substr(at, static_cast<size_t>(len));
        at += static_cast<size_t>(len);
        break;
      default:
        return false;
    }
  }
  return true;
}

}  // namespace

bool read_precompiled_charsmap(std::string_view model_proto, std::string& charsmap, std::string& error) {
  charsmap.clear();
  std::optional<std::string_view> spec, blob;
  if (!find_bytes_field(model_proto, 3, spec) || (spec && !find_bytes_field(*spec, 2, blob))) {
    error = "the SentencePiece model is not a well-formed protobuf message";
    return false;
  }
  if (blob) charsmap.assign(blob->data(), blob->size());
  return true;
}

bool PrecompiledCharsmap::parse(std::string_view blob, std::string& error) {
  units_.clear();
  replacements_.clear();
  if (blob.empty()) return true;
  uint32_t trie_bytes = 0;
  if (blob.size() < 4 || (std::memcpy(&trie_bytes, blob.data(), 4), trie_bytes % 4 != 0) ||
      trie_bytes > blob.size() - 4 || trie_bytes == 0) {
    error = "the SentencePiece model's precompiled_charsmap is truncated or malformed";
    return false;
  }
  units_.resize(trie_bytes / 4);
  std::memcpy(units_.data(), blob.data() + 4, trie_bytes);  // little-endian, as the file (x86/ARM hosts)
  replacements_.assign(blob.substr(4 + trie_bytes));
  return true;
}

std::vector<uint32_t> PrecompiledCharsmap::prefix_values(std::string_view key) const {
  std::vector<uint32_t> values;
  if (units_.empty()) return values;
  size_t node = unit_offset(units_[0]);
  for (char ch : key) {
    auto c = static_cast<uint8_t>(ch);
    if (c == 0) break;
    node ^= c;
    if (node >= units_.size() || unit_label(units_[node]) != c) break;
    uint32_t unit = units_[node];
    node ^= unit_offset(unit);
    if (node >= units_.size()) break;
    if (unit_has_leaf(unit)) values.push_back(unit_value(units_[node]));
  }
  return values;
}

std::optional<std::string_view> PrecompiledCharsmap::replacement_at(uint32_t offset) const {
  if (offset >= replacements_.size()) return std::nullopt;
  std::string_view rest = std::string_view(replacements_).substr(offset);
  return rest.substr(0, rest.find('\0'));
}

std::optional<std::string_view> PrecompiledCharsmap::shortest_prefix_replacement(std::string_view key) const {
  std::vector<uint32_t> values = prefix_values(key);
  if (values.empty()) return std::nullopt;
  return replacement_at(values.front());
}

std::string PrecompiledCharsmap::normalize(std::string_view text) const {
  if (units_.empty()) return std::string(text);
  std::u32string chars;
  std::string error;
  decode_utf8(text, chars, error);  // the caller validated the text
  std::string out;
  out.reserve(text.size());
  utf8proc_int32_t state = 0;
  for (size_t start = 0; start < chars.size();) {
    size_t end = start + 1;
    while (end < chars.size() &&
           !utf8proc_grapheme_break_stateful(static_cast<utf8proc_int32_t>(chars[end - 1]),
                                            static_cast<utf8proc_int32_t>(chars[end]), &state))
      ++end;
    std::string cluster = encode_utf8(std::u32string_view(chars).substr(start, end - start));
    std::optional<std::string_view> whole;
    if (cluster.size() < 6) whole = shortest_prefix_replacement(cluster);
    if (whole) {
      out += *whole;
    } else {
      for (size_t k = start; k < end; ++k) {
        std::string one;
        append_utf8(chars[k], one);
        // Keys are whole UTF-8 characters, so the only key that is a prefix of one is itself.
        std::optional<std::string_view> r = shortest_prefix_replacement(one);
        out += r ? std::string(*r) : one;
      }
    }
    start = end;
  }
  return out;
}

}  // namespace flame_train

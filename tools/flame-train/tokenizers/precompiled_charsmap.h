// The normalization rules inside a SentencePiece model (NormalizerSpec.precompiled_charsmap, e.g.
// T5's nmt_nfkc), applied the way the tokenizers library's Precompiled normalizer applies them,
// which transformers 5's T5Tokenizer uses in place of SentencePiece's own normalizer.
//
// The charsmap is [u32 trie size][darts-clone double-array trie over UTF-8 keys][NUL-terminated
// replacement strings]; a trie value is the offset of a key's replacement. SentencePiece rewrites
// the longest key found at each position. The tokenizers library works per extended grapheme
// cluster instead: a cluster shorter than 6 bytes whose start matches a key is replaced whole by
// the replacement of the shortest matching key (what follows that key in the cluster is dropped,
// so "e" + U+0301 + U+0301 becomes just "é"); otherwise each character is replaced on its own
// when it is a key. Running SentencePiece's normalizer over the result changes nothing more for
// NFKC-style maps (they are idempotent), so the tokenizer applies this first and then lets
// SentencePiece encode as usual.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flame_train {

class PrecompiledCharsmap {
 public:
  // Parses a charsmap blob. False and `error` set when it is truncated or inconsistent. An empty
  // blob is valid and maps nothing.
  bool parse(std::string_view blob, std::string& error);
  // `text` (valid UTF-8) rewritten as described above.
  std::string normalize(std::string_view text) const;

 private:
  std::optional<std::string_view> shortest_prefix_replacement(std::string_view key) const;
  // Offsets into replacements_ of the keys that are prefixes of `key`, shortest first.
  std::vector<uint32_t> prefix_values(std::string_view key) const;
  std::optional<std::string_view> replacement_at(uint32_t offset) const;

  std::vector<uint32_t> units_;
  std::string replacements_;
};

// The extracted NormalizerSpec.precompiled_charsmap of a serialized SentencePiece ModelProto
// (field 3, then its field 2); empty when the model has none. False and `error` set when the bytes
// are not a well-formed protobuf message.
bool read_precompiled_charsmap(std::string_view model_proto, std::string& charsmap, std::string& error);

}  // namespace flame_train

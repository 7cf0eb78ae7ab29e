// What the CLIP and T5 tokenizers share: the split of a text on special tokens, the
// tokenizer_config.json of a checkpoint folder, and truncation/padding into fixed-length rows.
//
// transformers 5 (the tokenizers library's added vocabulary) first cuts the raw text at every
// occurrence of a special token, spelled exactly ("<|endoftext|>", "</s>", "<extra_id_3>", SDXL
// tokenizer_2's pad "!", ...; special tokens are not normalized, so the match is case-sensitive):
// those become their ids directly and only the text between them reaches the model's own
// normalizer and tokenization. An added token with lstrip / rstrip also eats the whitespace
// (Unicode White_Space) on that side.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flame_train {

struct SpecialToken {
  std::string content;
  int32_t id = 0;
  bool lstrip = false;
  bool rstrip = false;
};

struct TextPiece {
  std::string text;
  int special = -1;  // index into the special token list, or -1 for ordinary text
};

// Cuts `text` (valid UTF-8) at the special tokens (leftmost match first, the longest at one
// position, as transformers' Trie does) and applies their lstrip/rstrip to the neighbouring text.
// Empty ordinary pieces are dropped.
std::vector<TextPiece> split_on_special_tokens(std::string_view text, const std::vector<SpecialToken>& specials);

// The fields of tokenizer_config.json (and special_tokens_map.json for tokens the first lacks)
// that the tokenizers use. A token may be written as a string or as {"content": ...}.
struct TokenizerConfig {
  std::optional<std::string> bos_token, eos_token, unk_token, pad_token;
  std::optional<int> model_max_length;
  std::optional<int> extra_ids;
};
// Missing files give an empty config (every field unset); an unreadable or malformed one is an error.
bool read_tokenizer_config(const std::filesystem::path& folder, TokenizerConfig& out, std::string& error);

// A tokenized prompt as the text encoders take it: `max_length` ids and the attention mask
// (1 for tokens, 0 for padding). `length` is the number of unpadded tokens.
struct TokenizedText {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> attention_mask;
  int length = 0;
};
// Right-pads `ids` (already truncated to at most max_length) with pad_id.
TokenizedText pad_to_length(std::vector<int32_t> ids, int max_length, int32_t pad_id);

}  // namespace flame_train

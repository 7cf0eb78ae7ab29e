// T5's SentencePiece tokenizer (Flux's tokenizer_2/, SD3's tokenizer_3/), id for id as
// transformers' slow T5Tokenizer called as diffusers does: tokenizer(prompt, padding="max_length",
// max_length=N, truncation=True) with N = 512 (Flux), 256 or 77 (SD3).
//
// Files: spiece.model (loaded with libsentencepiece) and optionally tokenizer_config.json /
// special_tokens_map.json: eos/unk/pad tokens (defaults </s>, <unk>, <pad>), extra_ids (100
// sentinels <extra_id_K>, id = pieces + extra_ids - 1 - K), legacy and add_prefix_space.
//
// legacy (transformers' default when the config does not say; Flux's config says true): each
// stretch of text between special tokens goes through SentencePiece as is (its add_dummy_prefix
// puts a "▁" in front). legacy=false: "▁" in the text becomes a space, "▁" is prepended when
// add_prefix_space, the model is loaded with add_dummy_prefix off, a stretch that starts with "▁"
// or " " is encoded behind the unk token text and those pieces dropped, and a lone leading "▁"
// before a special token is dropped: T5Tokenizer.tokenize/_tokenize. add_dummy_prefix is turned
// off as transformers does (a NormalizerSpec merged into the model proto), by appending the
// serialized field to the file's bytes: protobuf merges a repeated message field occurrence.
//
// Then: ids[:max_length-1] + </s> (not added when the ids already end with </s>), padded with
// the pad id (0 in T5's model), attention mask 1 on the unpadded part.
// A loaded tokenizer is immutable: its const methods may run from several threads at once.
#pragma once

#include "special_tokens.h"

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace flame_train {

struct T5Overrides {  // settings that replace the config's (tests; prompts never need them)
  std::optional<bool> legacy;
  std::optional<bool> add_prefix_space;
};

class T5Tokenizer {
 public:
  static std::unique_ptr<T5Tokenizer> load(const std::filesystem::path& folder, std::string& error,
                                           const T5Overrides& overrides = {});
  ~T5Tokenizer();

  // The ids of `text` (UTF-8) without </s>. False and `error` set on invalid UTF-8.
  bool tokenize(std::string_view text, std::vector<int32_t>& ids, std::string& error) const;
  // ids[:max_length-1] + </s>, padded to max_length (>= 1).
  bool encode(std::string_view text, int max_length, TokenizedText& out, std::string& error) const;

  int32_t eos_id() const { return specials_[0].id; }
  int32_t unk_id() const { return specials_[1].id; }
  int32_t pad_id() const { return specials_[2].id; }
  int model_max_length() const { return model_max_length_; }
  bool legacy() const { return legacy_; }
  int piece_count() const;

 private:
  T5Tokenizer();
  bool encode_pieces(const std::string& text, std::vector<std::string>& pieces, std::string& error) const;
  bool tokenize_stretch(const std::string& text, std::vector<std::string>& pieces, std::string& error) const;

  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::vector<SpecialToken> specials_;  // eos, unk, pad, then <extra_id_K>
  bool legacy_ = true;
  bool add_prefix_space_ = true;
  size_t unk_token_length_ = 0;  // pieces of the unk token's text (legacy=false only)
  int model_max_length_ = 512;
};

}  // namespace flame_train

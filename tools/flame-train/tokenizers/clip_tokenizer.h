// CLIP's byte-level BPE tokenizer, id for id as transformers 5's CLIPTokenizer (the
// tokenizers-backed class, the only one under that name since transformers 5, and what diffusers
// runs today) called as the diffusers pipelines call it: tokenizer(prompt, padding="max_length",
// max_length=77, truncation=True). transformers 4's slow Python class cleaned the text
// differently (dropped control characters, spaced out CJK ideographs, Python's str.lower());
// that behaviour is not reproduced.
//
// Files, from a checkpoint's tokenizer folder (tokenizer/, tokenizer_2/ of a diffusers pipeline):
// vocab.json (token -> id), merges.txt (first line skipped as transformers does, then at most
// 48,894 "a b" merges in rank order) and optionally tokenizer_config.json / special_tokens_map.json
// for the special tokens (defaults: <|startoftext|>, <|endoftext|> as EOS, UNK and PAD; SDXL's
// tokenizer_2 sets pad_token "!", id 0) and model_max_length.
//
// Encoding: special tokens in the raw text, spelled exactly (added tokens with normalized=false,
// so case-sensitive), become their ids; every special token is registered, even one already in
// the vocabulary such as SDXL's pad "!". The rest is normalized (clip_text.h), pre-tokenized, each piece's UTF-8 bytes mapped through
// bytes_to_unicode, BPE-merged with "</w>" on the last symbol, and looked up (a missing symbol
// gives the UNK id). Then BOS + tokens[:max-2] + EOS, padded with the PAD id; the attention mask
// marks the unpadded part.
//
// A loaded tokenizer is immutable: its const methods may run from several threads at once.
#pragma once

#include "special_tokens.h"

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace flame_train {

class ClipTokenizer {
 public:
  // Loads a tokenizer folder. nullptr and `error` set on a missing or malformed file, or when a
  // special token is not in the vocabulary.
  static std::unique_ptr<ClipTokenizer> load(const std::filesystem::path& folder, std::string& error);

  // The ids of `text` (UTF-8) without BOS/EOS. Stops once `limit` ids exist (tokens are produced
  // word by word, so the first `limit` are exact); a negative limit means all. False and `error`
  // set on invalid UTF-8.
  bool tokenize(std::string_view text, std::vector<int32_t>& ids, std::string& error, long limit = -1) const;

  // BOS + ids (truncated to max_length - 2) + EOS, padded to max_length (>= 2).
  bool encode(std::string_view text, int max_length, TokenizedText& out, std::string& error) const;

  int32_t bos_id() const { return specials_[0].id; }
  int32_t eos_id() const { return specials_[1].id; }
  int32_t unk_id() const { return specials_[2].id; }
  int32_t pad_id() const { return specials_[3].id; }
  int model_max_length() const { return model_max_length_; }
  size_t vocab_size() const { return encoder_.size(); }

 private:
  ClipTokenizer() = default;
  void bpe_word(const std::u32string& word, std::vector<int32_t>& ids) const;
  int32_t lookup(const std::string& token) const;

  std::unordered_map<std::string, int32_t> encoder_;
  std::unordered_map<std::string, int> merge_ranks_;  // key "first second"
  std::vector<SpecialToken> specials_;                // bos, eos, unk, pad
  int model_max_length_ = 77;
};

}  // namespace flame_train

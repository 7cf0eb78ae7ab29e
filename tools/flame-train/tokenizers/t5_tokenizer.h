// T5's SentencePiece tokenizer (Flux's tokenizer_2/, SD3's tokenizer_3/), id for id as
// transformers 5's T5Tokenizer (the tokenizers-backed class, the only one under that name since
// transformers 5, and what diffusers runs today) called as diffusers does:
// tokenizer(prompt, padding="max_length", max_length=N, truncation=True) with N = 512 (Flux),
// 256 or 77 (SD3).
//
// Files: spiece.model (loaded with libsentencepiece) and optionally tokenizer_config.json /
// special_tokens_map.json: eos/unk/pad tokens (defaults </s>, <unk>, <pad>), extra_ids (100
// sentinels <extra_id_K>, id = pieces + extra_ids - 1 - K). The config's legacy and
// add_prefix_space are ignored, as transformers 5 ignores them: every word gets its "▁", which
// is transformers 4's legacy behaviour (Flux's config says legacy=true anyway).
//
// transformers 5's pipeline: special tokens are cut out of the raw text (special_tokens.h); each
// stretch between them goes through the model's precompiled charsmap (precompiled_charsmap.h,
// applied per grapheme cluster as the tokenizers library does), is split on Unicode White_Space
// (WhitespaceSplit, so NEL U+0085 separates words although SentencePiece's own normalizer keeps
// it), each word gets a "▁" in front (Metaspace, prepend_scheme always) and the Unigram model
// picks the pieces. Here the first two steps are done by hand and the result (White_Space turned
// into plain spaces) is handed to SentencePiece, whose normalizer then changes nothing more and
// whose dummy prefix and whitespace handling give the same "▁" per word; its Viterbi is the
// Unigram model's.
//
// Then: ids[:max_length-1] + </s> (not added when the ids already end with </s>), padded with
// the pad id (0 in T5's model), attention mask 1 on the unpadded part.
// A loaded tokenizer is immutable: its const methods may run from several threads at once.
#pragma once

#include "precompiled_charsmap.h"
#include "special_tokens.h"

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace flame_train {

class T5Tokenizer {
 public:
  static std::unique_ptr<T5Tokenizer> load(const std::filesystem::path& folder, std::string& error);
  ~T5Tokenizer();

  // The ids of `text` (UTF-8) without </s>. False and `error` set on invalid UTF-8.
  bool tokenize(std::string_view text, std::vector<int32_t>& ids, std::string& error) const;
  // ids[:max_length-1] + </s>, padded to max_length (>= 1).
  bool encode(std::string_view text, int max_length, TokenizedText& out, std::string& error) const;

  int32_t eos_id() const { return specials_[0].id; }
  int32_t unk_id() const { return specials_[1].id; }
  int32_t pad_id() const { return specials_[2].id; }
  int model_max_length() const { return model_max_length_; }
  int piece_count() const;

 private:
  T5Tokenizer();
  // One stretch of text between special tokens: charsmap, White_Space -> " ", SentencePiece.
  bool encode_stretch(const std::string& text, std::vector<int32_t>& ids, std::string& error) const;

  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  PrecompiledCharsmap charsmap_;
  std::vector<SpecialToken> specials_;  // eos, unk, pad, then <extra_id_K>
  int model_max_length_ = 512;
};

}  // namespace flame_train

// T5 tokenization as transformers 5's T5Tokenizer does it, over libsentencepiece (see t5_tokenizer.h).
#include "t5_tokenizer.h"

#include "unicode_text.h"

#include <sentencepiece_processor.h>

#include <fstream>
#include <sstream>

namespace flame_train {

T5Tokenizer::T5Tokenizer() : sp_(new sentencepiece::SentencePieceProcessor()) {}
T5Tokenizer::~T5Tokenizer() = default;

int T5Tokenizer::piece_count() const { return sp_->GetPieceSize(); }

std::unique_ptr<T5Tokenizer> T5Tokenizer::load(const std::filesystem::path& folder, std::string& error) {
  std::unique_ptr<T5Tokenizer> tok(new T5Tokenizer());
  TokenizerConfig config;
  if (!read_tokenizer_config(folder, config, error)) return nullptr;
  tok->model_max_length_ = config.model_max_length.value_or(512);

  std::filesystem::path model_path = folder / "spiece.model";
  std::ifstream in(model_path, std::ios::binary);
  if (!in) {
    error = "cannot open " + model_path.string();
    return nullptr;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string model = ss.str();
  auto status = tok->sp_->LoadFromSerializedProto(model);
  if (!status.ok()) {
    error = model_path.string() + " is not a SentencePiece model: " + status.ToString();
    return nullptr;
  }
  std::string charsmap;
  if (!read_precompiled_charsmap(model, charsmap, error) || !tok->charsmap_.parse(charsmap, error)) {
    error = model_path.string() + ": " + error;
    return nullptr;
  }

  const int pieces = tok->sp_->GetPieceSize();
  const std::string names[3] = {config.eos_token.value_or("</s>"), config.unk_token.value_or("<unk>"),
                                config.pad_token.value_or("<pad>")};
  for (const std::string& name : names) {
    int id = tok->sp_->PieceToId(name);
    if (id < 0 || id >= pieces || tok->sp_->IdToPiece(id) != name) {
      error = model_path.string() + " has no piece \"" + name + "\" for a special token";
      return nullptr;
    }
    tok->specials_.push_back({name, id, false, false});
  }
  const int extra_ids = config.extra_ids.value_or(100);
  // Sentinels eat the White_Space around them (lstrip, rstrip, as transformers registered them
  // before version 5); words are split on White_Space anyway, so the ids are the same either way.
  for (int k = 0; k < extra_ids; ++k)
    tok->specials_.push_back({"<extra_id_" + std::to_string(k) + ">", pieces + extra_ids - 1 - k, true, true});
  return tok;
}

bool T5Tokenizer::encode_stretch(const std::string& text, std::vector<int32_t>& ids, std::string& error) const {
  std::u32string chars;
  decode_utf8(charsmap_.normalize(text), chars, error);  // the caller validated the text
  for (char32_t& c : chars)
    if (is_white_space(c)) c = U' ';  // WhitespaceSplit's separators; SentencePiece splits on ' '
  std::vector<int> piece_ids;
  auto status = sp_->Encode(encode_utf8(chars), &piece_ids);
  if (!status.ok()) {
    error = "SentencePiece could not encode the text: " + status.ToString();
    return false;
  }
  ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
  return true;
}

bool T5Tokenizer::tokenize(std::string_view text, std::vector<int32_t>& ids, std::string& error) const {
  ids.clear();
  std::u32string check;
  if (!decode_utf8(text, check, error)) return false;
  for (const TextPiece& stretch : split_on_special_tokens(text, specials_)) {
    if (stretch.special >= 0) {
      ids.push_back(specials_[static_cast<size_t>(stretch.special)].id);
      continue;
    }
    if (!encode_stretch(stretch.text, ids, error)) return false;
  }
  return true;
}

bool T5Tokenizer::encode(std::string_view text, int max_length, TokenizedText& out, std::string& error) const {
  if (max_length < 1) {
    error = "T5 max_length must be at least 1 (</s>), got " + std::to_string(max_length);
    return false;
  }
  std::vector<int32_t> ids;
  if (!tokenize(text, ids, error)) return false;
  if (ids.size() > static_cast<size_t>(max_length - 1)) ids.resize(static_cast<size_t>(max_length - 1));
  if (ids.empty() || ids.back() != eos_id()) ids.push_back(eos_id());  // _add_eos_if_not_present
  out = pad_to_length(std::move(ids), max_length, pad_id());
  return true;
}

}  // namespace flame_train

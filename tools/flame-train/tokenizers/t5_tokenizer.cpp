// T5 SentencePiece tokenization with transformers' special-token and legacy handling (see t5_tokenizer.h).
#include "t5_tokenizer.h"

#include "unicode_text.h"

#include <sentencepiece_processor.h>

#include <fstream>
#include <sstream>

namespace flame_train {

static const std::string kUnderline = "\xE2\x96\x81";  // U+2581, SentencePiece's word boundary

// ModelProto field 3 (normalizer_spec, length 2) holding NormalizerSpec field 3
// (add_dummy_prefix) = false. Appended to a serialized model, protobuf merges it into the spec.
static const std::string kNoDummyPrefix("\x1A\x02\x18\x00", 4);

T5Tokenizer::T5Tokenizer() : sp_(new sentencepiece::SentencePieceProcessor()) {}
T5Tokenizer::~T5Tokenizer() = default;

int T5Tokenizer::piece_count() const { return sp_->GetPieceSize(); }

std::unique_ptr<T5Tokenizer> T5Tokenizer::load(const std::filesystem::path& folder, std::string& error,
                                               const T5Overrides& overrides) {
  std::unique_ptr<T5Tokenizer> tok(new T5Tokenizer());
  TokenizerConfig config;
  if (!read_tokenizer_config(folder, config, error)) return nullptr;
  tok->legacy_ = overrides.legacy.value_or(config.legacy.value_or(true));
  tok->add_prefix_space_ = overrides.add_prefix_space.value_or(config.add_prefix_space.value_or(true));
  tok->model_max_length_ = config.model_max_length.value_or(512);

  std::filesystem::path model_path = folder / "spiece.model";
  std::ifstream in(model_path, std::ios::binary);
  if (!in) {
    error = "cannot open " + model_path.string();
    return nullptr;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  std::string model = ss.str();
  if (!tok->legacy_) model += kNoDummyPrefix;
  auto status = tok->sp_->LoadFromSerializedProto(model);
  if (!status.ok()) {
    error = model_path.string() + " is not a SentencePiece model: " + status.ToString();
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
  for (int k = 0; k < extra_ids; ++k)  // sentinels eat the whitespace around them (lstrip, rstrip)
    tok->specials_.push_back({"<extra_id_" + std::to_string(k) + ">", pieces + extra_ids - 1 - k, true, true});
  if (!tok->legacy_) {
    std::vector<std::string> unk_pieces;
    if (!tok->encode_pieces(names[1], unk_pieces, error)) return nullptr;
    tok->unk_token_length_ = unk_pieces.size();
  }
  return tok;
}

bool T5Tokenizer::encode_pieces(const std::string& text, std::vector<std::string>& pieces, std::string& error) const {
  pieces.clear();
  auto status = sp_->Encode(text, &pieces);
  if (!status.ok()) {
    error = "SentencePiece could not encode the text: " + status.ToString();
    return false;
  }
  return true;
}

// T5Tokenizer._tokenize of one stretch between special tokens.
bool T5Tokenizer::tokenize_stretch(const std::string& text, std::vector<std::string>& pieces, std::string& error) const {
  bool prefixed = text.compare(0, kUnderline.size(), kUnderline) == 0 || (!text.empty() && text[0] == ' ');
  if (legacy_ || !prefixed) return encode_pieces(text, pieces, error);
  if (!encode_pieces(specials_[1].content + text, pieces, error)) return false;
  if (pieces.size() >= unk_token_length_) pieces.erase(pieces.begin(), pieces.begin() + static_cast<long>(unk_token_length_));
  return true;
}

bool T5Tokenizer::tokenize(std::string_view text_in, std::vector<int32_t>& ids, std::string& error) const {
  ids.clear();
  std::u32string check;
  if (!decode_utf8(text_in, check, error)) return false;
  std::string text(text_in);
  if (!legacy_ && !text.empty()) {
    for (size_t at; (at = text.find(kUnderline)) != std::string::npos;) text.replace(at, kUnderline.size(), " ");
    if (add_prefix_space_) text = kUnderline + text;
  }
  struct Token {
    std::string piece;
    int special;
  };
  std::vector<Token> tokens;
  std::vector<std::string> pieces;
  for (const TextPiece& stretch : split_on_special_tokens(text, specials_)) {
    if (stretch.special >= 0) {
      tokens.push_back({stretch.text, stretch.special});
      continue;
    }
    if (!tokenize_stretch(stretch.text, pieces, error)) return false;
    for (std::string& p : pieces) tokens.push_back({std::move(p), -1});
  }
  if (!legacy_ && tokens.size() > 1 && tokens[0].special < 0 && tokens[0].piece == kUnderline && tokens[1].special >= 0)
    tokens.erase(tokens.begin());
  for (const Token& t : tokens)
    ids.push_back(t.special >= 0 ? specials_[static_cast<size_t>(t.special)].id : sp_->PieceToId(t.piece));
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

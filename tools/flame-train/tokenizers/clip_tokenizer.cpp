// CLIP BPE: file loading, byte mapping and merges (see clip_tokenizer.h).
#include "clip_tokenizer.h"

#include "clip_text.h"
#include "unicode_text.h"

#include <nlohmann/json.hpp>

#include <array>
#include <climits>
#include <fstream>
#include <sstream>

namespace flame_train {
namespace {

// transformers limits merges.txt to lines [1, 49152 - 256 - 2] (CLIP's vocabulary size).
constexpr int kMaxMerges = 49152 - 256 - 2;

// bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other 68 to U+0100 upwards.
const std::array<std::string, 256>& byte_symbols() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      append_utf8(static_cast<char32_t>(printable ? b : next++), t[static_cast<size_t>(b)]);
    }
    return t;
  }();
  return table;
}

bool read_file(const std::filesystem::path& path, std::string& out, std::string& error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error = "cannot open " + path.string();
    return false;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  out = ss.str();
  return true;
}

bool load_vocab(const std::filesystem::path& path, std::unordered_map<std::string, int32_t>& encoder,
                std::string& error) {
  std::string text;
  if (!read_file(path, text, error)) return false;
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || j.empty()) {
    error = path.string() + " is not a JSON object of token -> id";
    return false;
  }
  for (const auto& [token, id] : j.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      error = path.string() + ": the id of \"" + token + "\" is not an integer in [0, 2^31)";
      return false;
    }
    encoder.emplace(token, id.get<int32_t>());
  }
  return true;
}

// Python: read().strip().split("\n")[1:48895], each line split on whitespace. The first line is
// skipped whatever it holds (normally "#version: 0.2"); a blank line inside still takes a rank (its
// empty tuple never matches); a later duplicate pair takes the later rank, as dict(zip(...)) does.
bool load_merges(const std::filesystem::path& path, std::unordered_map<std::string, int>& ranks, std::string& error) {
  std::string text;
  if (!read_file(path, text, error)) return false;
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    bool blank = line.find_first_not_of(" \t\f\v") == std::string::npos;
    if (blank && lines.empty()) continue;  // strip() at the start
    lines.push_back(blank ? std::string() : line);
  }
  while (!lines.empty() && lines.back().empty()) lines.pop_back();  // strip() at the end
  for (size_t i = 1; i < lines.size() && static_cast<int>(i) <= kMaxMerges; ++i) {
    if (lines[i].empty()) continue;
    std::istringstream fields(lines[i]);
    std::string first, second, extra;
    if (!(fields >> first >> second) || (fields >> extra)) {
      error = path.string() + ": line " + std::to_string(i + 1) + " is not a merge \"a b\"";
      return false;
    }
    ranks[first + " " + second] = static_cast<int>(i - 1);
  }
  return true;
}

}  // namespace

std::unique_ptr<ClipTokenizer> ClipTokenizer::load(const std::filesystem::path& folder, std::string& error) {
  std::unique_ptr<ClipTokenizer> tok(new ClipTokenizer());
  TokenizerConfig config;
  if (!load_vocab(folder / "vocab.json", tok->encoder_, error) ||
      !load_merges(folder / "merges.txt", tok->merge_ranks_, error) ||
      !read_tokenizer_config(folder, config, error))
    return nullptr;
  const std::string names[4] = {config.bos_token.value_or("<|startoftext|>"),
                                config.eos_token.value_or("<|endoftext|>"),
                                config.unk_token.value_or("<|endoftext|>"),
                                config.pad_token.value_or("<|endoftext|>")};
  for (const std::string& name : names) {
    auto it = tok->encoder_.find(name);
    if (it == tok->encoder_.end()) {
      error = (folder / "vocab.json").string() + " lacks the special token \"" + name + "\"";
      return nullptr;
    }
    tok->specials_.push_back({name, it->second, false, false});
  }
  tok->model_max_length_ = config.model_max_length.value_or(77);
  return tok;
}

int32_t ClipTokenizer::lookup(const std::string& token) const {
  auto it = encoder_.find(token);
  return it == encoder_.end() ? unk_id() : it->second;
}

// BPE of one pre-tokenized word: repeatedly merge every occurrence (left to right, non-overlapping)
// of the adjacent pair with the lowest rank, until no adjacent pair has a rank. The tokenizers
// library's BPE (a priority queue of (rank, position)) reaches the same symbols.
void ClipTokenizer::bpe_word(const std::u32string& word, std::vector<int32_t>& ids) const {
  std::string utf8 = encode_utf8(word);
  std::vector<std::string> symbols;
  for (unsigned char b : utf8) symbols.push_back(byte_symbols()[b]);
  symbols.back() += "</w>";
  while (symbols.size() > 1) {
    int best_rank = INT_MAX;
    size_t best = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      auto it = merge_ranks_.find(symbols[i] + " " + symbols[i + 1]);
      if (it != merge_ranks_.end() && it->second < best_rank) {
        best_rank = it->second;
        best = i;
      }
    }
    if (best_rank == INT_MAX) break;
    const std::string first = symbols[best], second = symbols[best + 1];
    std::vector<std::string> merged;
    for (size_t i = 0; i < symbols.size();) {
      if (i + 1 < symbols.size() && symbols[i] == first && symbols[i + 1] == second) {
        merged.push_back(first + second);
        i += 2;
      } else {
        merged.push_back(symbols[i++]);
      }
    }
    symbols.swap(merged);
  }
  for (const std::string& s : symbols) ids.push_back(lookup(s));
}

bool ClipTokenizer::tokenize(std::string_view text, std::vector<int32_t>& ids, std::string& error, long limit) const {
  ids.clear();
  std::u32string check;
  if (!decode_utf8(text, check, error)) return false;
  for (const TextPiece& piece : split_on_special_tokens(text, specials_)) {
    if (limit >= 0 && static_cast<long>(ids.size()) >= limit) break;
    if (piece.special >= 0) {
      ids.push_back(specials_[static_cast<size_t>(piece.special)].id);
      continue;
    }
    std::u32string decoded;
    decode_utf8(piece.text, decoded, error);
    for (const std::u32string& word : clip_pre_tokenize(normalize_clip_text(decoded))) {
      if (limit >= 0 && static_cast<long>(ids.size()) >= limit) break;
      bpe_word(word, ids);
    }
  }
  if (limit >= 0 && static_cast<long>(ids.size()) > limit) ids.resize(static_cast<size_t>(limit));
  return true;
}

bool ClipTokenizer::encode(std::string_view text, int max_length, TokenizedText& out, std::string& error) const {
  if (max_length < 2) {
    error = "CLIP max_length must be at least 2 (BOS and EOS), got " + std::to_string(max_length);
    return false;
  }
  std::vector<int32_t> body;
  if (!tokenize(text, body, error, max_length - 2)) return false;
  std::vector<int32_t> ids;
  ids.reserve(static_cast<size_t>(max_length));
  ids.push_back(bos_id());
  ids.insert(ids.end(), body.begin(), body.end());
  ids.push_back(eos_id());
  out = pad_to_length(std::move(ids), max_length, pad_id());
  return true;
}

}  // namespace flame_train

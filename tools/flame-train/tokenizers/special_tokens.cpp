// Special-token splitting, tokenizer_config.json reading and padding (see special_tokens.h).
#include "special_tokens.h"

#include "unicode_text.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

namespace flame_train {

static size_t longest_special_at(std::string_view text, size_t pos, const std::vector<SpecialToken>& specials,
                                 int& which) {
  size_t best = 0;
  for (size_t k = 0; k < specials.size(); ++k) {
    const std::string& s = specials[k].content;
    if (!s.empty() && s.size() > best && text.compare(pos, s.size(), s) == 0) {
      best = s.size();
      which = static_cast<int>(k);
    }
  }
  return best;
}

static std::string strip_white_space(const std::string& s, bool left, bool right) {
  std::u32string u;
  std::string error;
  decode_utf8(s, u, error);  // the caller validated the whole text
  size_t b = 0, e = u.size();
  while (left && b < e && is_white_space(u[b])) ++b;
  while (right && e > b && is_white_space(u[e - 1])) --e;
  return encode_utf8(std::u32string_view(u).substr(b, e - b));
}

std::vector<TextPiece> split_on_special_tokens(std::string_view text, const std::vector<SpecialToken>& specials) {
  std::vector<TextPiece> pieces;
  size_t start = 0, pos = 0;
  while (pos < text.size()) {
    int which = -1;
    size_t len = longest_special_at(text, pos, specials, which);
    if (len == 0) {
      ++pos;  // byte steps are safe: a UTF-8 match can only start at a character boundary
      continue;
    }
    if (pos > start) pieces.push_back({std::string(text.substr(start, pos - start)), -1});
    pieces.push_back({specials[static_cast<size_t>(which)].content, which});
    pos += len;
    start = pos;
  }
  if (start < text.size()) pieces.push_back({std::string(text.substr(start)), -1});

  // lstrip eats the whitespace left of the token (the end of the previous piece), rstrip the
  // whitespace right of it, as the tokenizers library's added vocabulary does (Unicode
  // White_Space, Rust's char::is_whitespace).
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].special < 0) continue;
    const SpecialToken& tok = specials[static_cast<size_t>(pieces[i].special)];
    if (tok.rstrip && i + 1 < pieces.size() && pieces[i + 1].special < 0)
      pieces[i + 1].text = strip_white_space(pieces[i + 1].text, true, false);
    if (tok.lstrip && i > 0 && pieces[i - 1].special < 0)
      pieces[i - 1].text = strip_white_space(pieces[i - 1].text, false, true);
  }
  std::vector<TextPiece> kept;
  for (auto& p : pieces)
    if (p.special >= 0 || !p.text.empty()) kept.push_back(std::move(p));
  return kept;
}

static bool read_json_file(const std::filesystem::path& path, nlohmann::json& out, std::string& error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error = "cannot open " + path.string();
    return false;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  out = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (out.is_discarded() || !out.is_object()) {
    error = path.string() + " is not a JSON object";
    return false;
  }
  return true;
}

static bool token_field(const nlohmann::json& j, const char* key, std::optional<std::string>& out,
                        const std::filesystem::path& path, std::string& error) {
  if (out || !j.contains(key) || j[key].is_null()) return true;
  const nlohmann::json& v = j[key];
  if (v.is_string()) {
    out = v.get<std::string>();
  } else if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    out = v["content"].get<std::string>();
  } else {
    error = path.string() + ": \"" + key + "\" must be a string or an object with a string \"content\"";
    return false;
  }
  return true;
}

bool read_tokenizer_config(const std::filesystem::path& folder, TokenizerConfig& out, std::string& error) {
  out = TokenizerConfig{};
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"}) {
    std::filesystem::path path = folder / name;
    if (!std::filesystem::exists(path)) continue;
    nlohmann::json j;
    if (!read_json_file(path, j, error)) return false;
    if (!token_field(j, "bos_token", out.bos_token, path, error) ||
        !token_field(j, "eos_token", out.eos_token, path, error) ||
        !token_field(j, "unk_token", out.unk_token, path, error) ||
        !token_field(j, "pad_token", out.pad_token, path, error))
      return false;
    if (std::string(name) != "tokenizer_config.json") continue;
    // model_max_length is a huge number (1e30) in configs that set no limit: ignored then, like
    // any value outside [1, 10^6] (the tokenizer's default applies).
    if (j.contains("model_max_length") && j["model_max_length"].is_number_integer()) {
      int64_t n = j["model_max_length"].get<int64_t>();
      if (n >= 1 && n <= 1000000) out.model_max_length = static_cast<int>(n);
    }
    if (j.contains("extra_ids")) {
      if (!j["extra_ids"].is_number_integer() || j["extra_ids"].get<int64_t>() < 0 ||
          j["extra_ids"].get<int64_t>() > 100000) {
        error = path.string() + ": \"extra_ids\" must be an integer in [0, 100000]";
        return false;
      }
      out.extra_ids = j["extra_ids"].get<int>();
    }
  }
  return true;
}

TokenizedText pad_to_length(std::vector<int32_t> ids, int max_length, int32_t pad_id) {
  TokenizedText out;
  out.length = static_cast<int>(ids.size());
  out.attention_mask.assign(ids.size(), 1);
  out.attention_mask.resize(static_cast<size_t>(max_length), 0);
  out.input_ids = std::move(ids);
  out.input_ids.resize(static_cast<size_t>(max_length), pad_id);
  return out;
}

}  // namespace flame_train

// CLIP text normalization and pre-tokenization (see clip_text.h for the steps and why).
#include "clip_text.h"

#include "unicode_text.h"

#include <string_view>

namespace flame_train {

std::u32string normalize_clip_text(const std::u32string& text) {
  std::u32string composed = nfc(text);
  std::u32string collapsed;  // Replace(Regex(r"\s+"), " ")
  collapsed.reserve(composed.size());
  for (size_t i = 0; i < composed.size();) {
    if (!is_white_space(composed[i])) {
      collapsed.push_back(composed[i++]);
      continue;
    }
    while (i < composed.size() && is_white_space(composed[i])) ++i;
    collapsed.push_back(U' ');
  }
  return lowercase_each_char(collapsed);
}

static size_t match_literal(const std::u32string& s, size_t pos, std::u32string_view lit) {
  if (s.size() - pos < lit.size() || s.compare(pos, lit.size(), lit.data(), lit.size()) != 0) return 0;
  return lit.size();
}

std::vector<std::u32string> clip_pre_tokenize(const std::u32string& s) {
  static constexpr std::u32string_view kContractions[] = {U"'s", U"'t", U"'re", U"'ve", U"'m", U"'ll", U"'d"};
  std::vector<std::u32string> tokens;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t len = 0;
    for (std::u32string_view lit : kContractions)
      if ((len = match_literal(s, pos, lit)) != 0) break;
    if (len == 0) {
      CharClass cls = char_class(s[pos]);
      if (cls == CharClass::letter) {
        while (pos + len < s.size() && char_class(s[pos + len]) == CharClass::letter) ++len;
      } else if (cls == CharClass::number) {
        len = 1;
      } else if (!is_white_space(s[pos])) {
        while (pos + len < s.size() && char_class(s[pos + len]) == CharClass::other &&
               !is_white_space(s[pos + len]))
          ++len;
      }
    }
    if (len == 0) {
      ++pos;  // whitespace: no alternative matches here
      continue;
    }
    tokens.push_back(s.substr(pos, len));
    pos += len;
  }
  return tokens;
}

}  // namespace flame_train

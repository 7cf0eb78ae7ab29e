// CLIP text cleanup and pre-tokenization (see clip_text.h for the steps and why).
#include "clip_text.h"

#include "unicode_text.h"

#include <string_view>

namespace flame_train {

// BasicTokenizer._is_chinese_char: the CJK Unified Ideographs blocks (not kana or hangul).
static bool is_cjk_ideograph(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

static bool is_tab_or_newline(char32_t c) { return c == U'\t' || c == U'\n' || c == U'\r'; }

std::u32string clean_clip_text(const std::u32string& text) {
  std::u32string cleaned;  // _clean_text, then _tokenize_chinese_chars
  cleaned.reserve(text.size());
  for (char32_t c : text) {
    if (c == 0 || c == 0xFFFD || (!is_tab_or_newline(c) && is_category_c(c))) continue;
    if (c == U' ' || is_tab_or_newline(c) || is_category_zs(c)) {
      cleaned.push_back(U' ');
    } else if (is_cjk_ideograph(c)) {
      cleaned.push_back(U' ');
      cleaned.push_back(c);
      cleaned.push_back(U' ');
    } else {
      cleaned.push_back(c);
    }
  }
  std::u32string normalized = nfc(cleaned);
  std::u32string out;  // whitespace_tokenize, lower() per word, " ".join
  size_t i = 0;
  while (i < normalized.size()) {
    while (i < normalized.size() && is_python_space(normalized[i])) ++i;
    size_t start = i;
    while (i < normalized.size() && !is_python_space(normalized[i])) ++i;
    if (i == start) break;
    if (!out.empty()) out.push_back(U' ');
    out += python_lower(std::u32string_view(normalized).substr(start, i - start));
  }
  return out;
}

// Matches `lit` (lowercase ASCII) at `pos` case-insensitively as the regex module does: ASCII case,
// and U+017F (long s) folds to 's'. The cleaned text is lowercase already.
static size_t match_literal(const std::u32string& s, size_t pos, std::u32string_view lit) {
  if (s.size() - pos < lit.size()) return 0;
  for (size_t k = 0; k < lit.size(); ++k) {
    char32_t c = s[pos + k];
    if (c >= U'A' && c <= U'Z') c = c - U'A' + U'a';
    if (c == 0x17F) c = U's';
    if (c != lit[k]) return 0;
  }
  return lit.size();
}

std::vector<std::u32string> clip_pre_tokenize(const std::u32string& s) {
  static constexpr std::u32string_view kLiterals[] = {U"<|startoftext|>", U"<|endoftext|>", U"'s", U"'t",
                                                      U"'re", U"'ve", U"'m", U"'ll", U"'d"};
  std::vector<std::u32string> tokens;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t len = 0;
    for (std::u32string_view lit : kLiterals)
      if ((len = match_literal(s, pos, lit)) != 0) break;
    if (len == 0) {
      CharClass cls = char_class(s[pos]);
      if (cls == CharClass::letter) {
        while (pos + len < s.size() && char_class(s[pos + len]) == CharClass::letter) ++len;
      } else if (cls == CharClass::number) {
        len = 1;
      } else if (!is_python_space(s[pos])) {
        while (pos + len < s.size() && char_class(s[pos + len]) == CharClass::other &&
               !is_python_space(s[pos + len]))
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

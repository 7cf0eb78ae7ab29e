// UTF-8 and Unicode property helpers over utf8proc (see unicode_text.h for whose definitions they follow).
#include "unicode_text.h"

#include <utf8proc.h>

#include <cstdlib>

namespace flame_train {

bool decode_utf8(std::string_view text, std::u32string& out, std::string& error) {
  out.clear();
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    utf8proc_int32_t cp = 0;
    const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(text.data() + i);
    utf8proc_ssize_t n = utf8proc_iterate(p, static_cast<utf8proc_ssize_t>(text.size() - i), &cp);
    if (n <= 0 || cp < 0) {  // utf8proc rejects overlong forms, surrogates and > U+10FFFF
      error = "invalid UTF-8 at byte " + std::to_string(i) + " of the text";
      return false;
    }
    out.push_back(static_cast<char32_t>(cp));
    i += static_cast<size_t>(n);
  }
  return true;
}

void append_utf8(char32_t code_point, std::string& out) {
  utf8proc_uint8_t buf[4];
  utf8proc_ssize_t n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(code_point), buf);
  out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

std::string encode_utf8(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : text) append_utf8(c, out);
  return out;
}

static utf8proc_category_t category(char32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c));
}

CharClass char_class(char32_t c) {
  switch (category(c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO:
      return CharClass::letter;
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
      return CharClass::number;
    default:
      return CharClass::other;
  }
}

std::u32string nfc(std::u32string_view text) {
  std::string utf8 = encode_utf8(text);
  utf8proc_uint8_t* composed = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(utf8.data()),
                                    static_cast<utf8proc_ssize_t>(utf8.size()), &composed,
                                    static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return std::u32string(text);  // only on allocation failure: the input was valid
  std::u32string out;
  std::string error;
  decode_utf8(std::string_view(reinterpret_cast<const char*>(composed), static_cast<size_t>(n)), out, error);
  std::free(composed);
  return out;
}

bool is_white_space(char32_t c) {
  // Unicode White_Space (PropList.txt): what Oniguruma's \s and Rust's char::is_whitespace test.
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

std::u32string lowercase_each_char(std::u32string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (char32_t c : text) {
    if (c == 0x130) {  // the only unconditional multi-character lowercase mapping (SpecialCasing)
      out.push_back(U'i');
      out.push_back(0x307);
    } else {
      out.push_back(static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
    }
  }
  return out;
}

}  // namespace flame_train

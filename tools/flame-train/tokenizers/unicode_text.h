// Unicode helpers for the tokenizers: strict UTF-8 decoding, general categories, NFC and the
// lowercasing of Python's str.lower(). The tokenizers must reproduce what transformers does in
// Python, so these follow Python's definitions (str.isspace, str.lower with its Final_Sigma rule),
// not C's locale functions. Category and case data come from utf8proc (Debian's libutf8proc-dev,
// Unicode 15), chosen over ICU as far smaller for the few tables needed here.
#pragma once

#include <string>
#include <string_view>

namespace flame_train {

// Decodes UTF-8. Returns false (and sets `error`, with the byte offset) on invalid input:
// truncated or overlong sequences, surrogates, code points above U+10FFFF. Python strings cannot
// hold such text, so there is no reference behaviour to follow and the caller reports an error.
bool decode_utf8(std::string_view text, std::u32string& out, std::string& error);
void append_utf8(char32_t code_point, std::string& out);
std::string encode_utf8(std::u32string_view text);

enum class CharClass { letter, number, other };
CharClass char_class(char32_t c);     // \p{L}, \p{N} or neither
bool is_category_c(char32_t c);       // general category C* (Cc, Cf, Cs, Co, Cn)
bool is_category_zs(char32_t c);      // space separator
bool is_python_space(char32_t c);     // Python's str.isspace()

// Canonical composition (unicodedata.normalize("NFC", text)).
std::u32string nfc(std::u32string_view text);
// Python's str.lower() of `text`: full lowercase mapping (U+0130 -> "i" + U+0307) and the
// Final_Sigma rule for U+03A3, with Cased and Case_Ignorable derived from categories and case maps.
std::u32string python_lower(std::u32string_view text);

}  // namespace flame_train

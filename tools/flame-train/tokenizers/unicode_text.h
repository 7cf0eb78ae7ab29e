// Unicode helpers for the tokenizers: strict UTF-8 decoding, general categories, whitespace, NFC
// and per-character lowercasing. The tokenizers reproduce transformers 5 (its tokenizers-backed
// classes, written in Rust with Oniguruma regexes), so these follow those definitions (White_Space
// for \s, Rust's char::to_lowercase), not Python's or C's locale functions. Category and case data
// come from utf8proc (Debian's libutf8proc-dev, Unicode 15), chosen over ICU as far smaller for the
// few tables needed here.
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
bool is_white_space(char32_t c);      // Unicode White_Space: Oniguruma's \s, Rust's is_whitespace

// Canonical composition (unicodedata.normalize("NFC", text)).
std::u32string nfc(std::u32string_view text);
// Each character lowercased on its own, as the tokenizers library's Lowercase normalizer does
// (Rust's char::to_lowercase): the full mapping (U+0130 -> "i" + U+0307) but no context, so a
// final capital sigma becomes U+03C3, not U+03C2 as Python's str.lower() would give.
std::u32string lowercase_each_char(std::u32string_view text);

}  // namespace flame_train

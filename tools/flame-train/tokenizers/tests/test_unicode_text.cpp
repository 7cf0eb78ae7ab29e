// The Unicode helpers against Python's definitions (values worked out from Python's rules).
#include "unicode_text.h"

#include <gtest/gtest.h>

using namespace flame_train;

TEST(UnicodeText, DecodesAndRejectsInvalidUtf8) {
  std::u32string out;
  std::string error;
  ASSERT_TRUE(decode_utf8("a\xC3\xA9\xE6\x9D\xB1\xF0\x9F\x98\x80", out, error));
  EXPECT_EQ(out, (std::u32string{U'a', 0xE9, 0x6771, 0x1F600}));
  EXPECT_EQ(encode_utf8(out), "a\xC3\xA9\xE6\x9D\xB1\xF0\x9F\x98\x80");
  for (const char* bad : {"\xC3", "\xC0\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "ok\xFF"}) {
    EXPECT_FALSE(decode_utf8(bad, out, error)) << bad;
    EXPECT_NE(error.find("invalid UTF-8"), std::string::npos);
  }
  EXPECT_FALSE(decode_utf8("ok\xFF", out, error));
  EXPECT_NE(error.find("byte 2"), std::string::npos) << error;
}

TEST(UnicodeText, ClassesFollowUnicodeCategories) {
  EXPECT_EQ(char_class(U'a'), CharClass::letter);
  EXPECT_EQ(char_class(0x6771), CharClass::letter);   // CJK ideograph (Lo)
  EXPECT_EQ(char_class(0x2B0), CharClass::letter);    // modifier letter (Lm)
  EXPECT_EQ(char_class(U'7'), CharClass::number);
  EXPECT_EQ(char_class(0x2165), CharClass::number);   // roman numeral six (Nl)
  EXPECT_EQ(char_class(0xBD), CharClass::number);     // one half (No)
  EXPECT_EQ(char_class(0x301), CharClass::other);     // combining acute (Mn)
  EXPECT_EQ(char_class(0x1F600), CharClass::other);   // emoji (So)
  EXPECT_TRUE(is_white_space(0x3000));
  EXPECT_TRUE(is_white_space(0x85));
  EXPECT_FALSE(is_white_space(0x1C));                 // Python's isspace() says yes; \s does not
  EXPECT_FALSE(is_white_space(0x200B));
  EXPECT_TRUE(is_white_space(0x2029));
}

TEST(UnicodeText, NfcComposes) {
  EXPECT_EQ(nfc(U"e\u0301"), U"\u00e9");
  EXPECT_EQ(nfc(U"\u212B"), U"\u00c5");  // Angstrom sign -> A with ring (canonical singleton)
  EXPECT_EQ(nfc(U"\uFF21"), U"\uFF21");  // fullwidth A: compatibility only, kept by NFC
}

TEST(UnicodeText, LowerEachChar) {
  EXPECT_EQ(lowercase_each_char(U"HeLLo ÉÀ"), U"hello éà");
  EXPECT_EQ(lowercase_each_char(U"\u0130"), U"i\u0307");  // full mapping, as Rust's to_lowercase
  EXPECT_EQ(lowercase_each_char(U"ΟΔΟΣ"), U"οδοσ");         // no final-sigma rule
  EXPECT_EQ(lowercase_each_char(U"ΑΣ'"), U"ασ'");
}

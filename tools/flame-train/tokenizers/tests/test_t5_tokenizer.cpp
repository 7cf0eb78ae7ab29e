// T5 SentencePiece tokenizer on the small unigram model in data/t5 (400 pieces: <pad> 0, </s> 1,
// <unk> 2). Expected ids of plain text are what Debian's spm_encode prints for the same model
// (transformers 5's T5Tokenizer agrees on such text); special tokens, </s>, truncation and padding
// follow T5Tokenizer's rules and are checked by hand, and so are the two places where transformers
// 5 departs from SentencePiece (White_Space splitting, the charsmap per grapheme cluster).
#include "t5_tokenizer.h"

#include "test_helpers.h"

#include <gtest/gtest.h>

using namespace flame_train;
using flame_train::test::ScratchDir;
using Ids = std::vector<int32_t>;

namespace {

std::unique_ptr<T5Tokenizer> load_t5() {
  std::string error;
  auto tok = T5Tokenizer::load(test::data_dir() / "t5", error);
  EXPECT_TRUE(tok) << error;
  return tok;
}

Ids ids_of(const T5Tokenizer& tok, const std::string& text) {
  Ids ids;
  std::string error;
  EXPECT_TRUE(tok.tokenize(text, ids, error)) << error;
  return ids;
}

}  // namespace

TEST(T5Tokenizer, PlainTextIdsMatchSentencePiece) {
  auto tok = load_t5();
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->piece_count(), 400);
  EXPECT_EQ(tok->eos_id(), 1);
  EXPECT_EQ(tok->pad_id(), 0);
  EXPECT_EQ(tok->unk_id(), 2);
  EXPECT_EQ(tok->model_max_length(), 512);
  // spm_encode: "▁ A ▁photo ▁of ▁a ▁cat , ▁東京 ▁ 😀(unk) ▁café"
  EXPECT_EQ(ids_of(*tok, "A photo of a cat, \u6771\u4eac \U0001F600 caf\u00e9"),
            (Ids{4, 385, 153, 9, 168, 109, 3, 21, 4, 2, 126}));
  EXPECT_EQ(ids_of(*tok, "  a   cat  "), (Ids{168, 109}));  // SentencePiece folds whitespace
  EXPECT_EQ(ids_of(*tok, ""), Ids{});
}

TEST(T5Tokenizer, SpecialTokensInText) {
  auto tok = load_t5();
  ASSERT_TRUE(tok);
  EXPECT_EQ(ids_of(*tok, "a cat</s>"), (Ids{168, 109, 1}));
  EXPECT_EQ(ids_of(*tok, "<pad><unk>"), (Ids{0, 2}));
  // Sentinels: id = 400 + 100 - 1 - K. They eat the spaces around them; "photo" still gets its
  // "▁" (every word does): "▁photo".
  EXPECT_EQ(ids_of(*tok, "a cat <extra_id_0> photo"), (Ids{168, 109, 499, 153}));
  EXPECT_EQ(ids_of(*tok, "<extra_id_99><extra_id_10>"), (Ids{400, 489}));  // longest match
  EXPECT_NE(ids_of(*tok, "<extra_id_100>").size(), 1u);  // only 0..99 exist: plain text
}

TEST(T5Tokenizer, EncodeAppendsEosTruncatesAndPads) {
  auto tok = load_t5();
  ASSERT_TRUE(tok);
  TokenizedText out;
  std::string error;
  ASSERT_TRUE(tok->encode("a cat", 8, out, error)) << error;
  EXPECT_EQ(out.input_ids, (Ids{168, 109, 1, 0, 0, 0, 0, 0}));
  EXPECT_EQ(out.attention_mask, (Ids{1, 1, 1, 0, 0, 0, 0, 0}));
  EXPECT_EQ(out.length, 3);

  ASSERT_TRUE(tok->encode("a cat</s>", 8, out, error)) << error;  // no second </s>
  EXPECT_EQ(out.input_ids, (Ids{168, 109, 1, 0, 0, 0, 0, 0}));

  ASSERT_TRUE(tok->encode("", 4, out, error));
  EXPECT_EQ(out.input_ids, (Ids{1, 0, 0, 0}));

  std::string long_prompt;
  for (int i = 0; i < 600; ++i) long_prompt += "a cat ";
  for (int max_length : {512, 256, 77}) {
    ASSERT_TRUE(tok->encode(long_prompt, max_length, out, error)) << error;
    ASSERT_EQ(out.input_ids.size(), static_cast<size_t>(max_length));
    EXPECT_EQ(out.input_ids[0], 168);
    EXPECT_EQ(out.input_ids[static_cast<size_t>(max_length) - 2], max_length % 2 ? 109 : 168);
    EXPECT_EQ(out.input_ids.back(), 1);  // </s> kept after truncation
    EXPECT_EQ(out.attention_mask, Ids(static_cast<size_t>(max_length), 1));
  }
  EXPECT_FALSE(tok->encode("a", 0, out, error));
  EXPECT_NE(error.find("at least 1"), std::string::npos) << error;
  EXPECT_FALSE(tok->encode("\xE2\x96", 8, out, error));
  EXPECT_NE(error.find("invalid UTF-8"), std::string::npos) << error;
}

TEST(T5Tokenizer, Transformers5TextPreparation) {
  auto tok = load_t5();
  ASSERT_TRUE(tok);
  // NEL (U+0085) is White_Space: it separates words (SentencePiece alone gives <unk> for it).
  EXPECT_EQ(ids_of(*tok, "para\u0085nel"), ids_of(*tok, "para nel"));
  EXPECT_EQ(ids_of(*tok, "a\u2028cat\u3000"), (Ids{168, 109}));
  // e + two combining acutes is one cluster: "é" and nothing more (SentencePiece: "▁é" <unk>).
  EXPECT_EQ(ids_of(*tok, "e\u0301\u0301"), ids_of(*tok, "\u00e9"));
  EXPECT_EQ(ids_of(*tok, "cafe\u0301"), (Ids{126}));  // "▁café"
}

TEST(T5Tokenizer, FileErrorsAreClear) {
  std::string error;
  EXPECT_FALSE(T5Tokenizer::load("/nonexistent/t5", error));
  EXPECT_NE(error.find("/nonexistent/t5/spiece.model"), std::string::npos) << error;

  ScratchDir dir;
  dir.write("spiece.model", "not a model");
  EXPECT_FALSE(T5Tokenizer::load(dir.path(), error));
  EXPECT_NE(error.find("not a SentencePiece model"), std::string::npos) << error;

  std::filesystem::copy_file(test::data_dir() / "t5" / "spiece.model", dir.path() / "spiece.model",
                             std::filesystem::copy_options::overwrite_existing);
  dir.write("tokenizer_config.json", R"({"pad_token": "[PAD]"})");
  EXPECT_FALSE(T5Tokenizer::load(dir.path(), error));
  EXPECT_NE(error.find("[PAD]"), std::string::npos) << error;

  dir.write("tokenizer_config.json", R"({"extra_ids": -1})");
  EXPECT_FALSE(T5Tokenizer::load(dir.path(), error));
  EXPECT_NE(error.find("extra_ids"), std::string::npos) << error;

  dir.write("tokenizer_config.json", R"({"extra_ids": 0, "model_max_length": 256})");
  auto tok = T5Tokenizer::load(dir.path(), error);
  ASSERT_TRUE(tok) << error;
  EXPECT_EQ(tok->model_max_length(), 256);
  EXPECT_NE(ids_of(*tok, "<extra_id_0>").size(), 1u);  // no sentinels
}

// CLIP BPE on vocabularies whose ids can be worked out by hand. The byte symbols of a CLIP
// vocabulary come first, in bytes_to_unicode order: bytes '!'..'~' are ids 0..93, 0xA1..0xAC are
// 94..105, 0xAE..0xFF are 106..187, the other 68 bytes 188..255 in byte order; the same symbols with
// "</w>" are 256..511 ("a</w>" = 320, as in the real CLIP vocabulary). The hand vocabulary below
// adds six merges (ids 512..517) and the two special tokens (518, 519).
#include "clip_tokenizer.h"

#include "test_helpers.h"

#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

using namespace flame_train;
using flame_train::test::ScratchDir;

namespace {

std::string hand_vocab_json() {
  std::vector<int> order;
  for (int b = '!'; b <= '~'; ++b) order.push_back(b);
  for (int b = 0xA1; b <= 0xAC; ++b) order.push_back(b);
  for (int b = 0xAE; b <= 0xFF; ++b) order.push_back(b);
  int next = 256;
  std::vector<int> symbol(256, 0);
  for (int b : order) symbol[static_cast<size_t>(b)] = b;
  for (int b = 0; b < 256; ++b)
    if (std::find(order.begin(), order.end(), b) == order.end()) {
      symbol[static_cast<size_t>(b)] = next++;
      order.push_back(b);
    }
  nlohmann::json vocab = nlohmann::json::object();
  auto utf8 = [](int cp) {
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
  };
  int id = 0;
  for (int b : order) vocab[utf8(symbol[static_cast<size_t>(b)])] = id++;
  for (int b : order) vocab[utf8(symbol[static_cast<size_t>(b)]) + "</w>"] = id++;
  for (const char* merged : {"he", "ll", "hell", "hello</w>", "ca", "cat</w>", "<|startoftext|>", "<|endoftext|>"})
    vocab[merged] = id++;
  return vocab.dump();
}

const char* kHandMerges = "#version: 0.2\nh e\nl l\nhe ll\nhell o</w>\nc a\nca t</w>\n";

std::unique_ptr<ClipTokenizer> hand_tokenizer(const ScratchDir& dir, const std::string& config = "") {
  dir.write("vocab.json", hand_vocab_json());
  dir.write("merges.txt", kHandMerges);
  if (!config.empty()) dir.write("tokenizer_config.json", config);
  std::string error;
  auto tok = ClipTokenizer::load(dir.path(), error);
  EXPECT_TRUE(tok) << error;
  return tok;
}

std::vector<int32_t> ids_of(const ClipTokenizer& tok, const std::string& text) {
  std::vector<int32_t> ids;
  std::string error;
  EXPECT_TRUE(tok.tokenize(text, ids, error)) << error;
  return ids;
}

using Ids = std::vector<int32_t>;

}  // namespace

TEST(ClipTokenizer, HandVocabularyMergesAndSplits) {
  ScratchDir dir;
  auto tok = hand_tokenizer(dir);
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->bos_id(), 518);
  EXPECT_EQ(tok->eos_id(), 519);
  EXPECT_EQ(tok->pad_id(), 519);  // CLIP-L: pad with <|endoftext|>
  // h e l l o</w> -> he l l o</w> -> he ll o</w> -> hell o</w> -> hello</w>; ","; "cat"; "!"
  EXPECT_EQ(ids_of(*tok, "Hello, cat!"), (Ids{515, 256 + 11, 517, 256}));
  EXPECT_EQ(ids_of(*tok, "it's"), (Ids{72, 256 + 83, 6, 256 + 82}));       // "it" "'s"
  EXPECT_EQ(ids_of(*tok, "  A \t b\nC\u00a0"), (Ids{320, 321, 322}));      // whitespace, case
  // Controls and format characters are kept: each its own punctuation-class word, BPE over its
  // UTF-8 bytes (\x01 is byte symbol 189; U+200B is E2 80 8B).
  EXPECT_EQ(ids_of(*tok, "a\x01" "b\u200b"), (Ids{320, 256 + 189, 321, 158, 222, 256 + 233}));
  EXPECT_EQ(ids_of(*tok, "12"), (Ids{256 + 16, 256 + 17}));                // one digit per token
  EXPECT_EQ(ids_of(*tok, "!!"), (Ids{0, 256}));                            // one punctuation run
  EXPECT_EQ(ids_of(*tok, "\u00e9"), (Ids{127, 358}));                      // bytes C3 A9
  EXPECT_EQ(ids_of(*tok, "e\u0301"), (Ids{127, 358}));                     // NFC first
  EXPECT_EQ(ids_of(*tok, "\u6771\u6771"), (Ids{162, 251, 109, 162, 251, 365}));  // one \p{L}+ word
  EXPECT_EQ(ids_of(*tok, "a<|endoftext|>b"), (Ids{320, 519, 321}));        // special token in text
  // Special tokens match only as spelled: in another case they are text, "<|" "endoftext" "|>".
  EXPECT_EQ(ids_of(*tok, "<|ENDOFTEXT|>"), (Ids{27, 256 + 91, 68, 77, 67, 78, 69, 83, 68, 87, 256 + 83, 91, 256 + 29}));
  EXPECT_EQ(ids_of(*tok, ""), Ids{});
  EXPECT_EQ(ids_of(*tok, " \t\n"), Ids{});
}

TEST(ClipTokenizer, EncodeAddsSpecialTokensTruncatesAndPads) {
  ScratchDir dir;
  auto tok = hand_tokenizer(dir);
  ASSERT_TRUE(tok);
  TokenizedText out;
  std::string error;
  ASSERT_TRUE(tok->encode("hello cat", 77, out, error)) << error;
  ASSERT_EQ(out.input_ids.size(), 77u);
  ASSERT_EQ(out.attention_mask.size(), 77u);
  EXPECT_EQ(out.length, 4);
  EXPECT_EQ(Ids(out.input_ids.begin(), out.input_ids.begin() + 5), (Ids{518, 515, 517, 519, 519}));
  EXPECT_EQ(Ids(out.attention_mask.begin(), out.attention_mask.begin() + 5), (Ids{1, 1, 1, 1, 0}));
  EXPECT_EQ(out.input_ids.back(), 519);

  std::string long_prompt;
  for (int i = 0; i < 100; ++i) long_prompt += "a ";
  ASSERT_TRUE(tok->encode(long_prompt, 77, out, error)) << error;
  EXPECT_EQ(out.length, 77);
  EXPECT_EQ(out.input_ids.front(), 518);
  EXPECT_EQ(out.input_ids[75], 320);
  EXPECT_EQ(out.input_ids[76], 519);  // EOS kept after truncation
  EXPECT_EQ(out.attention_mask, Ids(77, 1));

  ASSERT_TRUE(tok->encode("", 77, out, error));
  EXPECT_EQ(out.length, 2);
  EXPECT_FALSE(tok->encode("a", 1, out, error));
  EXPECT_NE(error.find("at least 2"), std::string::npos) << error;
  EXPECT_FALSE(tok->encode("bad \xFF", 77, out, error));
  EXPECT_NE(error.find("invalid UTF-8"), std::string::npos) << error;
}

// SDXL's tokenizer_2 pads with "!" (id 0). "!" is then a special token of transformers'
// tokenizer: it is cut out of the text and maps to 0, not BPE'd to "!</w>" (256).
TEST(ClipTokenizer, PadTokenFromConfigIsSpecial) {
  ScratchDir dir;
  auto tok = hand_tokenizer(dir, R"({"pad_token": {"content": "!", "lstrip": false}, "model_max_length": 77})");
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->pad_id(), 0);
  EXPECT_EQ(ids_of(*tok, "cat!"), (Ids{517, 0}));
  TokenizedText out;
  std::string error;
  ASSERT_TRUE(tok->encode("cat", 6, out, error)) << error;
  EXPECT_EQ(out.input_ids, (Ids{518, 517, 519, 0, 0, 0}));
  EXPECT_EQ(out.attention_mask, (Ids{1, 1, 1, 0, 0, 0}));
}

TEST(ClipTokenizer, GeneratedVocabulariesLoad) {
  std::string error;
  auto clip_l = ClipTokenizer::load(test::data_dir() / "clip_l", error);
  ASSERT_TRUE(clip_l) << error;
  auto clip_g = ClipTokenizer::load(test::data_dir() / "clip_g", error);
  ASSERT_TRUE(clip_g) << error;
  EXPECT_EQ(clip_l->vocab_size(), 914u);
  EXPECT_EQ(clip_l->bos_id(), 912);
  EXPECT_EQ(clip_l->eos_id(), 913);
  EXPECT_EQ(clip_l->pad_id(), 913);
  EXPECT_EQ(clip_g->pad_id(), 0);
  EXPECT_EQ(clip_l->model_max_length(), 77);
  std::vector<int32_t> ids;
  ASSERT_TRUE(clip_l->tokenize("a photo", ids, error));
  EXPECT_EQ(ids.front(), 320);
  EXPECT_EQ(ids.size(), 2u);  // "photo</w>" is one of the learned merges
}

TEST(ClipTokenizer, FileErrorsAreClear) {
  std::string error;
  EXPECT_FALSE(ClipTokenizer::load("/nonexistent/clip", error));
  EXPECT_NE(error.find("/nonexistent/clip/vocab.json"), std::string::npos) << error;

  ScratchDir dir;
  dir.write("vocab.json", "[1, 2]");
  dir.write("merges.txt", kHandMerges);
  EXPECT_FALSE(ClipTokenizer::load(dir.path(), error));
  EXPECT_NE(error.find("not a JSON object"), std::string::npos) << error;

  dir.write("vocab.json", R"({"a": "x"})");
  EXPECT_FALSE(ClipTokenizer::load(dir.path(), error));
  EXPECT_NE(error.find("\"a\""), std::string::npos) << error;

  dir.write("vocab.json", hand_vocab_json());
  dir.write("merges.txt", "#version: 0.2\nh e x\n");
  EXPECT_FALSE(ClipTokenizer::load(dir.path(), error));
  EXPECT_NE(error.find("line 2"), std::string::npos) << error;

  dir.write("merges.txt", kHandMerges);
  dir.write("tokenizer_config.json", R"({"pad_token": "<pad>"})");
  EXPECT_FALSE(ClipTokenizer::load(dir.path(), error));
  EXPECT_NE(error.find("<pad>"), std::string::npos) << error;

  dir.write("tokenizer_config.json", R"({"pad_token": 3})");
  EXPECT_FALSE(ClipTokenizer::load(dir.path(), error));
  EXPECT_NE(error.find("pad_token"), std::string::npos) << error;

  dir.write("tokenizer_config.json", "{not json");
  EXPECT_FALSE(ClipTokenizer::load(dir.path(), error));
  EXPECT_NE(error.find("tokenizer_config.json"), std::string::npos) << error;
}

TEST(ClipTokenizer, MergesFileFollowsTransformersReading) {
  // The first line is skipped whatever it holds; CRLF line ends and trailing blank lines are fine.
  ScratchDir dir;
  dir.write("vocab.json", hand_vocab_json());
  dir.write("merges.txt", "c a\r\nh e\r\nl l\r\nhe ll\r\nhell o</w>\r\n\r\n\r\n");
  std::string error;
  auto tok = ClipTokenizer::load(dir.path(), error);
  ASSERT_TRUE(tok) << error;
  EXPECT_EQ(ids_of(*tok, "hello ca"), (Ids{515, 66, 256 + 64}));  // "c a" never loaded: c, a</w>
}

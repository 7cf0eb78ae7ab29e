// The SentencePiece charsmap normalization (precompiled_charsmap.h) on data/t5/spiece.model's
// nmt_nfkc map, and its errors on malformed bytes.
#include "precompiled_charsmap.h"

#include "test_helpers.h"

#include <gtest/gtest.h>

using namespace flame_train;

namespace {

PrecompiledCharsmap t5_charsmap() {
  std::ifstream in(test::data_dir() / "t5" / "spiece.model", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string blob, error;
  EXPECT_TRUE(read_precompiled_charsmap(ss.str(), blob, error)) << error;
  EXPECT_GT(blob.size(), 1000u);
  PrecompiledCharsmap map;
  EXPECT_TRUE(map.parse(blob, error)) << error;
  return map;
}

}  // namespace

TEST(PrecompiledCharsmap, NormalizesPerGraphemeCluster) {
  PrecompiledCharsmap map = t5_charsmap();
  EXPECT_EQ(map.normalize("plain text"), "plain text");
  EXPECT_EQ(map.normalize("cafe\u0301"), "caf\u00e9");            // NFKC composes
  EXPECT_EQ(map.normalize("\uFF21\uFF22"), "AB");                 // fullwidth -> ASCII
  // One cluster e + two acutes: replaced whole by the shortest matching key's replacement, the
  // second acute dropped (SentencePiece itself would keep it and give <unk>).
  EXPECT_EQ(map.normalize("e\u0301\u0301 x"), "\u00e9 x");
}

TEST(PrecompiledCharsmap, MalformedBytesAreErrors) {
  PrecompiledCharsmap map;
  std::string error;
  EXPECT_TRUE(map.parse("", error));  // no map: nothing changes
  EXPECT_EQ(map.normalize("e\u0301"), "e\u0301");
  EXPECT_FALSE(map.parse("ab", error));
  EXPECT_NE(error.find("precompiled_charsmap"), std::string::npos) << error;
  EXPECT_FALSE(map.parse(std::string("\x10\x00\x00\x00" "abcd", 8), error));  // trie longer than blob
  EXPECT_NE(error.find("precompiled_charsmap"), std::string::npos) << error;

  std::string blob;
  EXPECT_TRUE(read_precompiled_charsmap("", blob, error));
  EXPECT_TRUE(blob.empty());
  EXPECT_FALSE(read_precompiled_charsmap(std::string("\x1A\x7F", 2), blob, error));  // length past the end
  EXPECT_NE(error.find("protobuf"), std::string::npos) << error;
}

// Every case of data/reference_ids_transformers5.json: ids and attention masks from transformers
// 5.17's CLIPTokenizer / T5Tokenizer (the tokenizers-backed classes diffusers runs today) on the
// files in data/, written by make_reference_ids.py. 272 cases: 3 CLIP suites and 5 T5 suites of 34
// texts. A missing or malformed file is a failure, never a skip.
#include "clip_tokenizer.h"
#include "t5_tokenizer.h"

#include "test_helpers.h"

#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

using namespace flame_train;

namespace {

nlohmann::json load_reference() {
  std::ifstream in(test::data_dir() / "reference_ids_transformers5.json", std::ios::binary);
  EXPECT_TRUE(in) << "cannot open " << (test::data_dir() / "reference_ids_transformers5.json");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  EXPECT_TRUE(j.is_object() && j.contains("suites") && j["suites"].is_array()) << "malformed reference_ids_transformers5.json";
  return j;
}

// One suite: a tokenizer (folder + settings) and its cases. Returns the number of cases checked.
size_t check_suite(const nlohmann::json& suite) {
  const std::string kind = suite.at("kind").get<std::string>();
  const std::string folder = suite.at("folder").get<std::string>();
  const int max_length = suite.at("max_length").get<int>();
  std::string error;
  std::unique_ptr<ClipTokenizer> clip;
  std::unique_ptr<T5Tokenizer> t5;
  if (kind == "clip") {
    clip = ClipTokenizer::load(test::data_dir() / folder, error);
  } else {
    // The suite's legacy / add_prefix_space were passed to transformers 5, which ignores them:
    // its ids are the same in every T5 suite, and so are these.
    t5 = T5Tokenizer::load(test::data_dir() / folder, error);
  }
  EXPECT_TRUE(clip || t5) << folder << ": " << error;
  if (!clip && !t5) return 0;
  size_t checked = 0, matched = 0;
  for (const auto& c : suite.at("cases")) {
    const std::string text = c.at("text").get<std::string>();
    TokenizedText out;
    bool ok = clip ? clip->encode(text, max_length, out, error) : t5->encode(text, max_length, out, error);
    std::string where = suite.at("name").get<std::string>() + " on " + nlohmann::json(text).dump();
    EXPECT_TRUE(ok) << where << ": " << error;
    // The file holds the unpadded ids (make_reference_ids.py checked that transformers padded the
    // rest with pad_id and a 0 mask): the full rows are rebuilt here.
    std::vector<int32_t> ids = c.at("input_ids").get<std::vector<int32_t>>();
    std::vector<int32_t> mask(ids.size(), 1);
    ids.resize(static_cast<size_t>(max_length), suite.at("pad_id").get<int32_t>());
    mask.resize(static_cast<size_t>(max_length), 0);
    EXPECT_EQ(out.input_ids, ids) << where;
    EXPECT_EQ(out.attention_mask, mask) << where;
    ++checked;
    if (ok && out.input_ids == ids && out.attention_mask == mask) ++matched;
  }
  std::cout << suite.at("name").get<std::string>() << ": " << matched << " of " << checked << " cases match\n";
  return checked;
}

}  // namespace

TEST(ReferenceIds, MatchTransformers) {
  nlohmann::json ref = load_reference();
  if (!ref.is_object() || !ref.contains("suites")) return;  // the EXPECT above already failed
  size_t checked = 0;
  for (const auto& suite : ref["suites"]) checked += check_suite(suite);
  EXPECT_GT(checked, 0u) << "reference_ids_transformers5.json has no cases";
  std::cout << "checked " << checked << " reference cases (transformers "
            << ref.value("transformers_version", std::string("?")) << ")\n";
}

// The caching stage's plan and reuse decision (tools/flame-train/cache_plan.h), no GPU: which
// entries, texts and VAE encodes a data set needs (deduplicated, augmentations frozen at epoch 0),
// and whether an existing file is reused, re-encoded or refused (corrupt or foreign files); the
// family the caching stage encodes for (cache_writer.h's caching_family).
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "cache_plan.h"
#include "cache_writer.h"

namespace flame_train {
namespace {

namespace fs = std::filesystem;

ImageEntry image(const std::string& name, const std::string& caption, int repeats, int width, int height) {
  ImageEntry e;
  e.path = "/nonexistent/" + name;
  e.caption = caption;
  e.repeats = repeats;
  e.size = {width, height};
  return e;
}

struct PlanFixture {
  Dataset dataset;
  DataOptions options;
  PlanFixture() {
    options.buckets.resolution = 256;
    options.buckets.min_side = 128;
    options.buckets.max_side = 512;
    dataset.images = {image("a.png", "a cat", 2, 256, 256), image("b.png", "a cat", 1, 512, 256),
                      image("c.png", "a dog", 1, 256, 256)};
  }
  CachePlan plan(const std::vector<std::string>& prompts, bool negative) const {
    return plan_cache(dataset, plan_buckets(dataset, options.buckets), options, 42, prompts, negative);
  }
};

TEST(CachePlan, OneEntryPerSampleDistinctTextsAndSharedEncodes) {
  PlanFixture f;
  const CachePlan p = f.plan({}, false);
  ASSERT_EQ(p.entries.size(), 4u);  // a twice (repeats), b, c
  EXPECT_EQ(p.texts, (std::vector<std::string>{"a cat", "a dog"}));  // in first-use order
  EXPECT_EQ(p.latents.size(), 3u);  // the repeats of a share one VAE encode
  size_t a_entries = 0;
  for (const CacheEntry& e : p.entries) {
    EXPECT_EQ(f.dataset.images[e.image].caption, p.texts[e.caption]);
    EXPECT_EQ(p.entries[p.latents[e.latent]].image, e.image);
    if (e.image == 0) ++a_entries;
  }
  EXPECT_EQ(a_entries, 2u);
  EXPECT_EQ(p.negative, -1);
  EXPECT_TRUE(p.sample_prompts.empty());
}

TEST(CachePlan, AugmentationsGiveEachRepeatItsOwnEncode) {
  PlanFixture f;
  f.options.flip_aug = true;
  EXPECT_EQ(f.plan({}, false).latents.size(), 4u);
  f.options.flip_aug = false;
  f.options.random_crop = true;
  EXPECT_EQ(f.plan({}, false).latents.size(), 4u);
}

TEST(CachePlan, CaptionDropoutIsFrozenAtEpochZero) {
  PlanFixture f;
  f.options.captions.dropout_rate = 1.0;  // every caption becomes ""
  const CachePlan p = f.plan({}, true);
  EXPECT_EQ(p.texts, (std::vector<std::string>{""}));
  EXPECT_EQ(p.negative, 0);  // the empty prompt is encoded once, for both uses
}

TEST(CachePlan, SamplePromptsAndNegativeAreDeduplicatedWithCaptions) {
  PlanFixture f;
  const CachePlan p = f.plan({"a dog", "a bird"}, true);
  EXPECT_EQ(p.texts, (std::vector<std::string>{"a cat", "a dog", "a bird", ""}));
  EXPECT_EQ(p.sample_prompts, (std::vector<size_t>{1, 2}));
  EXPECT_EQ(p.negative, 3);
}

class CacheDecisionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    folder_ = fs::temp_directory_path() / ("flame_cache_decision_" +
                                           std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(folder_);
    fs::create_directories(folder_);
  }
  void TearDown() override { fs::remove_all(folder_); }
  std::string path() const { return (folder_ / "latent_cache.safetensors").string(); }
  // A safetensors file with header (JSON text) and 4 bytes of data.
  void write_header(const std::string& header) const {
    std::ofstream out(path(), std::ios::binary);
    const uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
    out << header;
    out.write("\0\0\0\0", 4);
  }
  void write_cache(const std::string& family, const std::string& fingerprint) const {
    write_header(R"({"__metadata__": {"flame_train_cache": "1", "family": ")" + family + R"(", "count": "1", "fingerprint": ")" +
                 fingerprint + R"("}, "x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})");
  }
  fs::path folder_;
};

TEST_F(CacheDecisionTest, NoFileEncodes) {
  EXPECT_EQ(decide_cache_use(path(), "flux", "0123456789abcdef").action, CacheAction::Encode);
}

TEST_F(CacheDecisionTest, SameFingerprintReusesAnyChangeReencodes) {
  write_cache("flux", "0123456789abcdef");
  EXPECT_EQ(decide_cache_use(path(), "flux", "0123456789abcdef").action, CacheAction::Reuse);
  const CacheDecision changed = decide_cache_use(path(), "flux", "fedcba9876543210");
  EXPECT_EQ(changed.action, CacheAction::Encode);
  EXPECT_NE(changed.reason.find("changed"), std::string::npos) << changed.reason;
  EXPECT_EQ(decide_cache_use(path(), "sdxl", "0123456789abcdef").action, CacheAction::Encode);
}

TEST_F(CacheDecisionTest, ForeignSafetensorsFileIsRefused) {
  write_header(R"({"__metadata__": {"format": "pt"}, "x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})");
  EXPECT_THROW(decide_cache_use(path(), "flux", "0123456789abcdef"), CacheFileError);
  write_header(R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})");
  EXPECT_THROW(decide_cache_use(path(), "flux", "0123456789abcdef"), CacheFileError);
}

TEST_F(CacheDecisionTest, CorruptFilesAreRefused) {
  std::ofstream(path(), std::ios::binary) << "short";
  EXPECT_THROW(decide_cache_use(path(), "flux", "0123456789abcdef"), CacheFileError);
  std::ofstream(path(), std::ios::binary) << std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) << "{}";
  EXPECT_THROW(decide_cache_use(path(), "flux", "0123456789abcdef"), CacheFileError);  // header length too large
  write_header("{not json");
  EXPECT_THROW(decide_cache_use(path(), "flux", "0123456789abcdef"), CacheFileError);
  write_header(R"({"__metadata__": {"flame_train_cache": 1}})");  // a metadata value that is not a string
  EXPECT_THROW(decide_cache_use(path(), "flux", "0123456789abcdef"), CacheFileError);
}

TEST_F(CacheDecisionTest, FamilyFromArchDemoPathOrPipelineIndex) {
  TrainConfig c;
  c.model.arch = "sdxl";
  c.model.path = "demo:flux";
  EXPECT_EQ(caching_family(c), "sdxl");
  c.model.arch = "auto";
  EXPECT_EQ(caching_family(c), "flux");
  c.model.path = folder_.string();
  EXPECT_THROW(caching_family(c), std::runtime_error);  // no model_index.json: set model.arch
  std::ofstream(folder_ / "model_index.json") << R"({"_class_name": "StableDiffusion3Pipeline"})";
  EXPECT_EQ(caching_family(c), "sd3");
  c.output.dir = "/out";
  EXPECT_EQ(latent_cache_path(c), "/out/latent_cache.safetensors");
}

}  // namespace
}  // namespace flame_train

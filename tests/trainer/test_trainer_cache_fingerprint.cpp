// The latent cache fingerprint (tools/flame-train/cache_fingerprint.h): equal inputs give equal
// fingerprints, and each input and setting that decides the cache's contents changes it.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "cache_fingerprint.h"

namespace flame_train {
namespace {

namespace fs = std::filesystem;

class CacheFingerprintTest : public ::testing::Test {
 protected:
  void SetUp() override {
    folder_ = fs::temp_directory_path() /
              ("flame_cache_fingerprint_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
               ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(folder_);
    fs::create_directories(folder_);
    write_file("a.png", "first image bytes");
    write_file("b.png", "second image");
    write_file("model.safetensors", "weights");
    dataset_.images = {entry("a.png", "a cat"), entry("b.png", "a dog")};
    settings_.family = "flux";
    settings_.dtype = "bf16";
    settings_.model_files = {path("model.safetensors")};
  }
  void TearDown() override { fs::remove_all(folder_); }

  std::string path(const std::string& name) const { return (folder_ / name).string(); }
  void write_file(const std::string& name, const std::string& content) const {
    std::ofstream(path(name), std::ios::binary) << content;
  }
  ImageEntry entry(const std::string& name, const std::string& caption) const {
    ImageEntry image;
    image.path = path(name);
    image.caption = caption;
    image.size = {64, 64};
    return image;
  }
  std::string fingerprint() const { return cache_fingerprint(dataset_, settings_); }

  fs::path folder_;
  Dataset dataset_;
  CacheSettings settings_;
};

TEST_F(CacheFingerprintTest, EqualInputsGiveEqualHexFingerprints) {
  const std::string first = fingerprint();
  EXPECT_EQ(first.size(), 16u);
  EXPECT_EQ(first.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(fingerprint(), first);
}

TEST_F(CacheFingerprintTest, ImageContentSizeAndMtimeChangeIt) {
  const std::string before = fingerprint();
  write_file("a.png", "first image bytes, longer");
  const std::string resized = fingerprint();
  EXPECT_NE(resized, before);
  fs::last_write_time(path("a.png"), fs::last_write_time(path("a.png")) + std::chrono::seconds(5));
  EXPECT_NE(fingerprint(), resized);
}

TEST_F(CacheFingerprintTest, CaptionsRepeatsAndImageListChangeIt) {
  const std::string before = fingerprint();
  dataset_.images[1].caption = "a dog, running";
  EXPECT_NE(fingerprint(), before);
  dataset_.images[1].caption = "a dog";
  dataset_.images[1].repeats = 3;
  EXPECT_NE(fingerprint(), before);
  dataset_.images[1].repeats = 1;
  dataset_.images.pop_back();
  EXPECT_NE(fingerprint(), before);
}

TEST_F(CacheFingerprintTest, FieldBoundariesAreUnambiguous) {
  dataset_.images[0].caption = "ab";
  dataset_.images[1].caption = "c";
  const std::string split_late = fingerprint();
  dataset_.images[0].caption = "a";
  dataset_.images[1].caption = "bc";
  EXPECT_NE(fingerprint(), split_late);
}

TEST_F(CacheFingerprintTest, EverySettingChangesIt) {
  const std::string before = fingerprint();
  const CacheSettings original = settings_;
  auto changed = [&](auto&& change) {
    settings_ = original;
    change(settings_);
    return fingerprint();
  };
  EXPECT_NE(changed([](CacheSettings& s) { s.family = "sd3"; }), before);
  EXPECT_NE(changed([](CacheSettings& s) { s.dtype = "f32"; }), before);
  EXPECT_NE(changed([](CacheSettings& s) { s.buckets.resolution = 512; }), before);
  EXPECT_NE(changed([](CacheSettings& s) { s.buckets.enabled = false; }), before);
  EXPECT_NE(changed([](CacheSettings& s) { s.buckets.step = 32; }), before);
  EXPECT_NE(changed([](CacheSettings& s) { s.buckets.min_side = 128; }), before);
  EXPECT_NE(changed([](CacheSettings& s) { s.buckets.max_side = 1024; }), before);
  EXPECT_NE(changed([](CacheSettings& s) { s.captions.dropout_rate = 0.1; }), before);
  EXPECT_NE(changed([](CacheSettings& s) { s.captions.tag_dropout_rate = 0.1; }), before);
  EXPECT_NE(changed([](CacheSettings& s) { s.captions.shuffle = true; }), before);
  EXPECT_NE(changed([](CacheSettings& s) { s.captions.keep_tokens = 1; }), before);
  EXPECT_NE(changed([](CacheSettings& s) { s.captions.separator = ";"; }), before);
  EXPECT_NE(changed([](CacheSettings& s) { s.flip_aug = true; }), before);
  EXPECT_NE(changed([](CacheSettings& s) { s.random_crop = true; }), before);
  EXPECT_NE(changed([](CacheSettings& s) { s.seed = 7; }), before);
  EXPECT_NE(changed([](CacheSettings& s) { s.sample_prompts.push_back("a cat"); }), before);
  EXPECT_EQ(changed([](CacheSettings&) {}), before);
}

TEST_F(CacheFingerprintTest, ModelFilesAndTheirChangesChangeIt) {
  const std::string before = fingerprint();
  write_file("vae.safetensors", "vae");
  settings_.model_files.push_back(path("vae.safetensors"));
  const std::string with_vae = fingerprint();
  EXPECT_NE(with_vae, before);
  write_file("vae.safetensors", "vae, retrained");
  EXPECT_NE(fingerprint(), with_vae);
  fs::remove(path("vae.safetensors"));
  const std::string missing = fingerprint();
  EXPECT_NE(missing, with_vae);
  EXPECT_EQ(fingerprint(), missing);  // a missing file hashes consistently
}

}  // namespace
}  // namespace flame_train

// Where the caching stage's encoders come from (tools/flame-train/conditioning_sources.h): diffusers
// subfolders, explicit keys overriding them, and for single files every missing key, path or
// tokenizer file reported with the key to set, before any GPU work.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "conditioning_sources.h"

namespace flame_train {
namespace {

namespace fs = std::filesystem;

class ConditioningSourcesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            (std::string("flame_conditioning_sources_") + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string touch(const std::string& relative) const {
    const fs::path p = root_ / relative;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << "x";
    return p.string();
  }
  void make_diffusers_folder(const std::string& name, const std::string& family) const {
    touch(name + "/vae/config.json");
    touch(name + "/text_encoder/config.json");
    touch(name + "/text_encoder_2/config.json");
    touch(name + "/tokenizer/vocab.json");
    touch(name + "/tokenizer/merges.txt");
    if (family == "flux") {
      touch(name + "/tokenizer_2/spiece.model");
    } else {
      touch(name + "/tokenizer_2/vocab.json");
      touch(name + "/tokenizer_2/merges.txt");
    }
    if (family == "sd3") {
      touch(name + "/text_encoder_3/config.json");
      touch(name + "/tokenizer_3/spiece.model");
    }
  }
  static bool mentions(const std::vector<std::string>& problems, const std::string& text) {
    return std::any_of(problems.begin(), problems.end(),
                       [&](const std::string& p) { return p.find(text) != std::string::npos; });
  }
  fs::path root_;
};

TEST_F(ConditioningSourcesTest, DiffusersFolderGivesSubfoldersPerFamily) {
  for (const std::string family : {"flux", "sdxl", "sd3"}) {
    make_diffusers_folder(family, family);
    ConditioningPaths paths;
    paths.model_path = (root_ / family).string();
    std::vector<std::string> problems;
    const ConditioningSources s = resolve_conditioning_sources(family, paths, problems);
    EXPECT_TRUE(problems.empty()) << family << ": " << (problems.empty() ? "" : problems[0]);
    EXPECT_EQ(s.vae, (root_ / family / "vae").string());
    ASSERT_EQ(s.encoders.size(), family == "sd3" ? 3u : 2u) << family;
    EXPECT_EQ(s.encoders[0].kind, TextEncoderKind::ClipL);
    EXPECT_EQ(s.encoders[1].kind, family == "flux" ? TextEncoderKind::T5 : TextEncoderKind::ClipG);
    EXPECT_EQ(s.encoders[1].model, (root_ / family / "text_encoder_2").string());
    EXPECT_EQ(s.encoders[1].tokenizer, (root_ / family / "tokenizer_2").string());
    if (family == "sd3") {
      EXPECT_EQ(s.encoders[2].kind, TextEncoderKind::T5);
    }
  }
}

TEST_F(ConditioningSourcesTest, ExplicitKeyOverridesTheSubfolder) {
  make_diffusers_folder("flux", "flux");
  ConditioningPaths paths;
  paths.model_path = (root_ / "flux").string();
  paths.vae = touch("ae.safetensors");
  std::vector<std::string> problems;
  const ConditioningSources s = resolve_conditioning_sources("flux", paths, problems);
  EXPECT_TRUE(problems.empty());
  EXPECT_EQ(s.vae, paths.vae);
}

TEST_F(ConditioningSourcesTest, SingleFileNeedsEveryKeyAndSaysWhich) {
  ConditioningPaths paths;
  paths.model_path = touch("flux1-dev.safetensors");
  std::vector<std::string> problems;
  resolve_conditioning_sources("flux", paths, problems);
  EXPECT_TRUE(mentions(problems, "model.vae is required"));
  EXPECT_TRUE(mentions(problems, "model.text_encoder is required"));
  EXPECT_TRUE(mentions(problems, "model.text_encoder_2 is required"));
  EXPECT_TRUE(mentions(problems, "model.tokenizer_dir is required"));
  EXPECT_FALSE(mentions(problems, "model.text_encoder_3"));
}

TEST_F(ConditioningSourcesTest, SingleFilesComfyStyleResolve) {
  ConditioningPaths paths;
  paths.model_path = touch("flux1-dev.safetensors");
  paths.vae = touch("ae.safetensors");
  paths.text_encoder = touch("clip_l.safetensors");
  paths.text_encoder_2 = touch("t5xxl.safetensors");
  paths.tokenizer_dir = (root_ / "tokenizers").string();
  touch("tokenizers/tokenizer/vocab.json");
  touch("tokenizers/tokenizer/merges.txt");
  touch("tokenizers/tokenizer_2/spiece.model");
  std::vector<std::string> problems;
  const ConditioningSources s = resolve_conditioning_sources("flux", paths, problems);
  EXPECT_TRUE(problems.empty()) << (problems.empty() ? "" : problems[0]);
  EXPECT_EQ(s.encoders[1].model, paths.text_encoder_2);
}

TEST_F(ConditioningSourcesTest, MissingPathsAndTokenizerFilesAreNamed) {
  make_diffusers_folder("sd3", "sdxl");  // lacks text_encoder_3 and tokenizer_3
  fs::remove(root_ / "sd3" / "tokenizer" / "merges.txt");
  ConditioningPaths paths;
  paths.model_path = (root_ / "sd3").string();
  paths.vae = (root_ / "nowhere.safetensors").string();
  std::vector<std::string> problems;
  resolve_conditioning_sources("sd3", paths, problems);
  EXPECT_TRUE(mentions(problems, "model.vae: " + paths.vae + " does not exist"));
  EXPECT_TRUE(mentions(problems, "model.text_encoder_3"));
  EXPECT_TRUE(mentions(problems, "has no merges.txt"));
  EXPECT_TRUE(mentions(problems, "tokenizer_3 does not exist"));
}

TEST_F(ConditioningSourcesTest, UnknownFamilyIsAProblem) {
  std::vector<std::string> problems;
  resolve_conditioning_sources("auto", ConditioningPaths{}, problems);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_TRUE(mentions(problems, "'auto'"));
}

}  // namespace
}  // namespace flame_train

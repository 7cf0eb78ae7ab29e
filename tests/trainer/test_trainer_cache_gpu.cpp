// The latent cache's sample conditioning on a GPU (label gpu; flame_trainer_gpu_tests): a cache
// file written here with flame_safetensors_save in training_data.h's layout is read back by
// load_sample_conditioning (count, shapes, negatives for SDXL, none for Flux), and a missing
// negative, a wrong width or a wrong family is a clear error. Without a GPU the cases skip unless
// FLAME_REQUIRE_GPU=1.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "flame_test.h"
#include "training_data.h"

namespace flame_train {
namespace {

class SampleConditioningGpu : public GpuTest {
 protected:
  // Writes a cache with metadata family and sample_prompts, and the named f32 tensors (zeros).
  std::string write_cache(const std::string& family, const std::string& sample_prompts,
                          const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors) {
    std::vector<T> holders;
    std::vector<flame_tensor_t> handles;
    std::vector<const char*> names;
    for (const auto& [name, shape] : tensors) {
      int64_t count = 1;
      for (int64_t d : shape) count *= d;
      std::vector<float> zeros(static_cast<size_t>(count), 0.0f);
      flame_tensor_t t = nullptr;
      EXPECT_EQ(flame_from_host(ctx, zeros.data(), zeros.size() * sizeof(float), shape.data(),
                                static_cast<int32_t>(shape.size()), FLAME_DTYPE_F32, &t),
                FLAME_OK);
      holders.emplace_back(t);
      handles.push_back(t);
      names.push_back(name.c_str());
    }
    std::vector<const char*> metadata = {"flame_train_cache", "1", "family", family.c_str(), "count", "1"};
    if (!sample_prompts.empty()) {
      metadata.push_back("sample_prompts");
      metadata.push_back(sample_prompts.c_str());
    }
    const std::string path = ::testing::TempDir() + "flame_sample_conditioning_" +
                             ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".safetensors";
    EXPECT_EQ(flame_safetensors_save(ctx, path.c_str(), names.data(), handles.data(), static_cast<int64_t>(handles.size()),
                                     metadata.data(), static_cast<int64_t>(metadata.size() / 2)),
              FLAME_OK)
        << flame_last_error_message();
    return path;
  }
  static ModelShapes sdxl_shapes() {
    ModelShapes shapes;
    shapes.family = ModelFamily::Sdxl;
    shapes.latent_channels = 4;
    shapes.text_dim = 64;
    shapes.pooled_dim = 32;
    return shapes;
  }
};

std::vector<int64_t> shape_of(const Tensor& t) {
  int32_t nd = 0;
  flame_tensor_ndim(t.get(), &nd);
  std::vector<int64_t> dims(static_cast<size_t>(nd));
  if (nd > 0) flame_tensor_shape(t.get(), dims.data(), nd);
  return dims;
}

TEST_F(SampleConditioningGpu, SdxlPromptsAndNegativesReadBack) {
  const std::string path = write_cache("sdxl", "2",
                                       {{"sample_prompt_embeds.0", {77, 64}},
                                        {"sample_pooled_prompt_embeds.0", {32}},
                                        {"sample_prompt_embeds.1", {77, 64}},
                                        {"sample_pooled_prompt_embeds.1", {32}},
                                        {"negative_prompt_embeds", {77, 64}},
                                        {"negative_pooled_prompt_embeds", {32}}});
  const SampleConditioning c = load_sample_conditioning(ctx, path, sdxl_shapes());
  ASSERT_EQ(c.prompt_embeds.size(), 2u);
  ASSERT_EQ(c.pooled.size(), 2u);
  EXPECT_EQ(shape_of(c.prompt_embeds[1]), (std::vector<int64_t>{77, 64}));
  EXPECT_EQ(shape_of(c.pooled[0]), (std::vector<int64_t>{32}));
  EXPECT_EQ(shape_of(c.negative_prompt_embeds), (std::vector<int64_t>{77, 64}));
  EXPECT_EQ(shape_of(c.negative_pooled), (std::vector<int64_t>{32}));
  std::remove(path.c_str());
}

TEST_F(SampleConditioningGpu, MissingNegativeWrongWidthAndFamilyAreErrors) {
  const std::string no_negative = write_cache(
      "sdxl", "1", {{"sample_prompt_embeds.0", {77, 64}}, {"sample_pooled_prompt_embeds.0", {32}}});
  EXPECT_THROW(load_sample_conditioning(ctx, no_negative, sdxl_shapes()), std::runtime_error);
  ModelShapes wider = sdxl_shapes();
  wider.text_dim = 128;
  const std::string complete = write_cache("sdxl", "1",
                                           {{"sample_prompt_embeds.0", {77, 64}},
                                            {"sample_pooled_prompt_embeds.0", {32}},
                                            {"negative_prompt_embeds", {77, 64}},
                                            {"negative_pooled_prompt_embeds", {32}}});
  EXPECT_THROW(load_sample_conditioning(ctx, complete, wider), std::runtime_error);
  ModelShapes flux = sdxl_shapes();
  flux.family = ModelFamily::Flux;
  EXPECT_THROW(load_sample_conditioning(ctx, complete, flux), std::runtime_error);
  std::remove(no_negative.c_str());
  std::remove(complete.c_str());
}

TEST_F(SampleConditioningGpu, FluxWithoutSamplePromptsIsEmpty) {
  const std::string path = write_cache("flux", "", {{"latents.0", {16, 2, 2}}});
  ModelShapes flux = sdxl_shapes();
  flux.family = ModelFamily::Flux;
  const SampleConditioning c = load_sample_conditioning(ctx, path, flux);
  EXPECT_TRUE(c.prompt_embeds.empty());
  EXPECT_TRUE(c.pooled.empty());
  EXPECT_EQ(c.negative_prompt_embeds.get(), nullptr);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace flame_train

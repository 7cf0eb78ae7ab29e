// The caching stage end to end on a GPU (label gpu; flame_trainer_gpu_tests, builds with image
// input): tiny random-init CLIP-L, T5 and VAE saved as diffusers folders (config.json + weights), the
// tokenizer test vocabularies, two generated PNGs with captions, and the demo Flux denoiser
// (model.path demo:flux, model.arch flux):
//  - run 1 encodes ("latent cache: encoding", the encoders loaded) and writes
//    out/latent_cache.safetensors; run 2 reuses it without loading any encoder and trains to the
//    same losses; a changed caption makes run 3 encode again;
//  - the cached T5 embeddings and CLIP pooled output equal a direct forward of the same tokens
//    through the saved encoders, and the latents have the VAE's shape (4 channels, pixels / 8);
//  - SDXL (demo:sdxl, tiny CLIP-L and CLIP-G): the concatenated penultimate states, CLIP-G's
//    text_embeds, the sample prompt's and the empty negative's conditioning, and the time ids;
//  - a file at the cache path that is not a flame-train cache is refused and left as it was;
//  - model.path a diffusers pipeline folder alone (the README walkthrough's form) trains end to end.
// Without a GPU the cases skip unless FLAME_REQUIRE_GPU=1.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "clip_tokenizer.h"
#include "flame_test.h"
#include "image_writers.h"
#include "model_setup.h"
#include "sample_images.h"
#include "t5_tokenizer.h"

namespace flame_train {
namespace {

namespace fs = std::filesystem;
using flame_train_test::ProgramRun;
using flame_train_test::TempDir;

const std::string kTokenizerData = std::string(FLAME_SOURCE_DIR) + "/tools/flame-train/tokenizers/tests/data";

flame_train_test::ProgramRun run_program(const std::string& config_path) {
  return flame_train_test::run_shell(std::string("'") + FLAME_TRAIN_EXE + "' --config '" + config_path + "' 2>&1");
}

std::vector<double> losses_of(const std::string& jsonl) {
  std::vector<double> losses;
  for (const auto& [step, loss] : flame_train_test::logged_losses(jsonl)) losses.push_back(loss);
  return losses;
}

std::vector<float> to_host_f32(flame_tensor_t t) {
  flame_tensor_t f = nullptr;
  EXPECT_EQ(flame_to_dtype(t, FLAME_DTYPE_F32, &f), FLAME_OK);
  int64_t numel = 0;
  EXPECT_EQ(flame_tensor_numel(f, &numel), FLAME_OK);
  std::vector<float> v(static_cast<size_t>(numel));
  EXPECT_EQ(flame_to_host(f, v.data(), v.size() * sizeof(float)), FLAME_OK);
  flame_tensor_release(f);
  return v;
}

std::vector<int64_t> shape_of(flame_tensor_t t) {
  int32_t nd = 0;
  flame_tensor_ndim(t, &nd);
  std::vector<int64_t> dims(static_cast<size_t>(nd));
  if (nd > 0) flame_tensor_shape(t, dims.data(), nd);
  return dims;
}

class CacheWriterGpu : public GpuTest {
 protected:
  // Creates architecture from config (random init, bf16) and saves it as a diffusers folder.
  void save_model(const std::string& architecture, const nlohmann::json& config, const std::string& folder,
                  const char* weights_file) {
    fs::create_directories(folder);
    flame_model_t model = nullptr;
    ASSERT_EQ(flame_model_create(ctx, architecture.c_str(), config.dump().c_str(), R"({"dtype": "bf16"})", &model),
              FLAME_OK)
        << flame_last_error_message();
    const char* full = nullptr;
    ASSERT_EQ(flame_model_config(model, &full), FLAME_OK);
    std::ofstream(folder + "/config.json") << full;
    ASSERT_EQ(flame_model_save(model, (folder + "/" + weights_file).c_str(), "diffusers"), FLAME_OK)
        << flame_last_error_message();
    flame_model_release(model);
  }

  void make_inputs(const TempDir& dir) {
    std::string error;
    const auto clip = ClipTokenizer::load(kTokenizerData + "/clip_l", error);
    ASSERT_TRUE(clip) << error;
    const auto t5 = T5Tokenizer::load(kTokenizerData + "/t5", error);
    ASSERT_TRUE(t5) << error;
    // The demo Flux takes T5 width 24 (joint_attention_dim) and CLIP pooled 20 (pooled_projection_dim).
    save_model("CLIPTextModel",
               {{"vocab_size", clip->vocab_size() + 8}, {"hidden_size", 20}, {"intermediate_size", 40},
                {"projection_dim", 20}, {"num_hidden_layers", 2}, {"num_attention_heads", 2},
                {"max_position_embeddings", 77}, {"eos_token_id", clip->eos_id()}},
               dir.file("clip_l"), "model.safetensors");
    save_model("T5EncoderModel",
               {{"vocab_size", t5->piece_count() + 128}, {"d_model", 24}, {"d_kv", 8}, {"d_ff", 48},
                {"num_layers", 2}, {"num_heads", 3}},
               dir.file("t5"), "model.safetensors");
    save_model("AutoencoderKL", nlohmann::json::parse(demo_vae_config(ModelFamily::Flux, 4)), dir.file("vae"),
               "diffusion_pytorch_model.safetensors");
    fs::create_directories(dir.file("tokenizers"));
    fs::copy(kTokenizerData + "/clip_l", dir.file("tokenizers/tokenizer"), fs::copy_options::recursive);
    fs::copy(kTokenizerData + "/t5", dir.file("tokenizers/tokenizer_2"), fs::copy_options::recursive);
    flame_train_test::write_png(dir.file("images/a.png"), flame_train_test::pattern_image(64, 64));
    flame_train_test::write_png(dir.file("images/b.png"), flame_train_test::pattern_image(64, 48));
    flame_train_test::write_text(dir.file("images/a.txt"), "a red square, Small");
    flame_train_test::write_text(dir.file("images/b.txt"), "a blue circle!");
    const nlohmann::json config = {
        {"model", {{"path", "demo:flux"}, {"arch", "flux"}, {"vae", dir.file("vae")}, {"text_encoder", dir.file("clip_l")},
                   {"text_encoder_2", dir.file("t5")}, {"tokenizer_dir", dir.file("tokenizers")}}},
        {"data", {{"path", dir.file("images")}, {"resolution", 64}, {"min_bucket_reso", 64}, {"max_bucket_reso", 128}}},
        {"training", {{"max_train_steps", 6}, {"seed", 3}}},
        {"optimizer", {{"learning_rate", 1e-3}}},
        {"output", {{"dir", dir.file("out")}, {"name", "cached"}}}};
    std::ofstream(dir.file("train.json")) << config.dump(2);
  }

  // SDXL: CLIP-L (width 16) and CLIP-G (width 24, projection 24) for the demo UNet (cross-attention
  // 40 = 16 + 24, text_embeds 24), the demo VAE with 4 channels, sample prompt "a cat".
  void make_sdxl_inputs(const TempDir& dir) {
    std::string error;
    const auto clip_l = ClipTokenizer::load(kTokenizerData + "/clip_l", error);
    const auto clip_g = ClipTokenizer::load(kTokenizerData + "/clip_g", error);
    ASSERT_TRUE(clip_l && clip_g) << error;
    auto clip_config = [](const ClipTokenizer& t, int width) {
      return nlohmann::json{{"vocab_size", t.vocab_size() + 8}, {"hidden_size", width}, {"intermediate_size", 2 * width},
                            {"projection_dim", 24}, {"num_hidden_layers", 2}, {"num_attention_heads", 2},
                            {"max_position_embeddings", 77}, {"eos_token_id", t.eos_id()}};
    };
    save_model("CLIPTextModel", clip_config(*clip_l, 16), dir.file("clip_l"), "model.safetensors");
    save_model("CLIPTextModelWithProjection", clip_config(*clip_g, 24), dir.file("clip_g"), "model.safetensors");
    save_model("AutoencoderKL", nlohmann::json::parse(demo_vae_config(ModelFamily::Sdxl, 4)), dir.file("vae"),
               "diffusion_pytorch_model.safetensors");
    fs::create_directories(dir.file("tokenizers"));
    fs::copy(kTokenizerData + "/clip_l", dir.file("tokenizers/tokenizer"), fs::copy_options::recursive);
    fs::copy(kTokenizerData + "/clip_g", dir.file("tokenizers/tokenizer_2"), fs::copy_options::recursive);
    flame_train_test::write_png(dir.file("images/a.png"), flame_train_test::pattern_image(64, 64));
    flame_train_test::write_png(dir.file("images/b.png"), flame_train_test::pattern_image(64, 48));
    flame_train_test::write_text(dir.file("images/a.txt"), "a red square, Small");
    flame_train_test::write_text(dir.file("images/b.txt"), "a blue circle!");
    const nlohmann::json config = {
        {"model", {{"path", "demo:sdxl"}, {"arch", "sdxl"}, {"vae", dir.file("vae")}, {"text_encoder", dir.file("clip_l")},
                   {"text_encoder_2", dir.file("clip_g")}, {"tokenizer_dir", dir.file("tokenizers")}}},
        {"data", {{"path", dir.file("images")}, {"resolution", 64}, {"min_bucket_reso", 64}, {"max_bucket_reso", 128}}},
        {"training", {{"max_train_steps", 3}, {"seed", 3}}},
        {"sample", {{"prompts", {"a cat"}}}},
        {"output", {{"dir", dir.file("out")}, {"name", "cached"}}}};
    std::ofstream(dir.file("train.json")) << config.dump(2);
  }

  // The saved encoder's output row 0 of name for ids, as f32 on the host.
  std::vector<float> direct_encode(const std::string& folder, const std::vector<int32_t>& ids32, const char* name) {
    flame_model_t model = nullptr;
    EXPECT_EQ(flame_model_load(ctx, folder.c_str(), R"({"dtype": "bf16"})", &model), FLAME_OK) << flame_last_error_message();
    const std::vector<int64_t> ids(ids32.begin(), ids32.end());
    const int64_t shape[2] = {1, static_cast<int64_t>(ids.size())};
    flame_tensor_t input = nullptr, row = nullptr, found = nullptr;
    flame_params_t inputs = nullptr, outputs = nullptr;
    EXPECT_EQ(flame_from_host(ctx, ids.data(), ids.size() * 8, shape, 2, FLAME_DTYPE_I64, &input), FLAME_OK);
    EXPECT_EQ(flame_params_create(ctx, &inputs), FLAME_OK);
    EXPECT_EQ(flame_params_add(inputs, "input_ids", input), FLAME_OK);
    EXPECT_EQ(flame_model_forward(model, inputs, &outputs), FLAME_OK) << flame_last_error_message();
    EXPECT_EQ(flame_params_find(outputs, name, &found), FLAME_OK);
    EXPECT_NE(found, nullptr);
    EXPECT_EQ(flame_select(found, 0, 0, &row), FLAME_OK);
    std::vector<float> v = to_host_f32(row);
    flame_tensor_release(row);
    flame_params_release(outputs);
    flame_params_release(inputs);
    flame_tensor_release(input);
    flame_model_release(model);
    return v;
  }

  std::vector<float> cached(const std::string& path, const std::string& key, std::vector<int64_t>* shape = nullptr) {
    flame_safetensors_t file = nullptr;
    EXPECT_EQ(flame_safetensors_load(ctx, path.c_str(), &file), FLAME_OK) << flame_last_error_message();
    flame_tensor_t t = nullptr;
    EXPECT_EQ(flame_safetensors_get(file, key.c_str(), &t), FLAME_OK) << key;
    if (shape) *shape = shape_of(t);
    std::vector<float> v = to_host_f32(t);
    flame_tensor_release(t);
    flame_safetensors_release(file);
    return v;
  }
};

void expect_equal(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) bad += a[i] != b[i];
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << a.size() << " values differ";
}

TEST_F(CacheWriterGpu, WritesReusesAndInvalidatesTheCache) {
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(make_inputs(dir));
  const ProgramRun first = run_program(dir.file("train.json"));
  ASSERT_EQ(first.status, 0) << first.output;
  EXPECT_NE(first.output.find("latent cache: encoding 2 texts and 2 images"), std::string::npos) << first.output;
  EXPECT_NE(first.output.find("loading text encoder"), std::string::npos) << first.output;
  const std::string cache = dir.file("out/latent_cache.safetensors");
  ASSERT_TRUE(fs::exists(cache));
  const std::vector<double> losses1 = losses_of(dir.file("out/cached.jsonl"));

  const ProgramRun second = run_program(dir.file("train.json"));
  ASSERT_EQ(second.status, 0) << second.output;
  EXPECT_NE(second.output.find("latent cache: reusing"), std::string::npos) << second.output;
  EXPECT_EQ(second.output.find("loading text encoder"), std::string::npos) << second.output;
  EXPECT_EQ(second.output.find("loading the VAE"), std::string::npos) << second.output;
  const std::vector<double> losses2 = losses_of(dir.file("out/cached.jsonl"));
  ASSERT_EQ(losses1.size(), 6u);
  ASSERT_EQ(losses2.size(), 6u);
  for (size_t i = 0; i < losses1.size(); ++i)
    EXPECT_NEAR(losses1[i], losses2[i], 1e-6 * std::max(1.0, std::fabs(losses1[i]))) << "step " << i + 1;

  // The cache's conditioning equals a direct encode of the same tokens (entry 0: a.png, sorted first).
  std::string error;
  const auto t5 = T5Tokenizer::load(dir.file("tokenizers/tokenizer_2"), error);
  const auto clip = ClipTokenizer::load(dir.file("tokenizers/tokenizer"), error);
  ASSERT_TRUE(t5 && clip) << error;
  TokenizedText t5_ids, clip_ids;
  ASSERT_TRUE(t5->encode("a red square, Small", 512, t5_ids, error)) << error;
  ASSERT_TRUE(clip->encode("a red square, Small", 77, clip_ids, error)) << error;
  std::vector<int64_t> embeds_shape, latent_shape;
  const std::vector<float> embeds = cached(cache, "prompt_embeds.0", &embeds_shape);
  EXPECT_EQ(embeds_shape, (std::vector<int64_t>{512, 24}));
  expect_equal(embeds, direct_encode(dir.file("t5"), t5_ids.input_ids, "last_hidden_state"), "T5 embeddings");
  expect_equal(cached(cache, "pooled_prompt_embeds.0"),
               direct_encode(dir.file("clip_l"), clip_ids.input_ids, "pooler_output"), "CLIP pooled");
  cached(cache, "latents.1", &latent_shape);
  EXPECT_EQ(latent_shape[0], 4);
  EXPECT_EQ(latent_shape[1] * 8 * latent_shape[2] * 8, 64 * 64) << "a bucket of 64 x 64 pixels";

  flame_train_test::write_text(dir.file("images/b.txt"), "a green circle");
  const ProgramRun third = run_program(dir.file("train.json"));
  ASSERT_EQ(third.status, 0) << third.output;
  EXPECT_NE(third.output.find("latent cache: encoding"), std::string::npos) << third.output;
}

// SDXL: prompt_embeds = [CLIP-L hidden_states[-2], CLIP-G hidden_states[-2]] on D, pooled = CLIP-G
// text_embeds, time_ids from the original size and the centre crop, the sample prompt and the empty
// negative prompt encoded too.
TEST_F(CacheWriterGpu, SdxlConcatenatesPenultimateStatesAndWritesTimeIds) {
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(make_sdxl_inputs(dir));
  const ProgramRun run = run_program(dir.file("train.json"));
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("latent cache: encoding 4 texts and 2 images"), std::string::npos) << run.output;
  const std::string cache = dir.file("out/latent_cache.safetensors");
  std::string error;
  const auto clip_l = ClipTokenizer::load(dir.file("tokenizers/tokenizer"), error);
  const auto clip_g = ClipTokenizer::load(dir.file("tokenizers/tokenizer_2"), error);
  ASSERT_TRUE(clip_l && clip_g) << error;
  auto check_text = [&](const std::string& text, const std::string& embeds_key, const std::string& pooled_key) {
    TokenizedText l_ids, g_ids;
    ASSERT_TRUE(clip_l->encode(text, 77, l_ids, error)) << error;
    ASSERT_TRUE(clip_g->encode(text, 77, g_ids, error)) << error;
    const std::vector<float> l = direct_encode(dir.file("clip_l"), l_ids.input_ids, "hidden_states.1");
    const std::vector<float> g = direct_encode(dir.file("clip_g"), g_ids.input_ids, "hidden_states.1");
    std::vector<float> expected;
    for (size_t t = 0; t < 77; ++t) {
      expected.insert(expected.end(), l.begin() + t * 16, l.begin() + (t + 1) * 16);
      expected.insert(expected.end(), g.begin() + t * 24, g.begin() + (t + 1) * 24);
    }
    std::vector<int64_t> shape;
    expect_equal(cached(cache, embeds_key, &shape), expected, embeds_key.c_str());
    EXPECT_EQ(shape, (std::vector<int64_t>{77, 40}));
    expect_equal(cached(cache, pooled_key), direct_encode(dir.file("clip_g"), g_ids.input_ids, "text_embeds"),
                 pooled_key.c_str());
  };
  check_text("a red square, Small", "prompt_embeds.0", "pooled_prompt_embeds.0");
  check_text("a cat", "sample_prompt_embeds.0", "sample_pooled_prompt_embeds.0");
  check_text("", "negative_prompt_embeds", "negative_pooled_prompt_embeds");
  // a.png 64 x 64: no crop; b.png 64 x 48 covers the 64 x 64 bucket at 85 x 64, centre crop left 10.
  EXPECT_EQ(cached(cache, "time_ids.0"), (std::vector<float>{64, 64, 0, 0, 64, 64}));
  EXPECT_EQ(cached(cache, "time_ids.1"), (std::vector<float>{48, 64, 0, 10, 64, 64}));
}

TEST_F(CacheWriterGpu, ForeignFileAtTheCachePathIsRefused) {
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(make_inputs(dir));
  fs::create_directories(dir.file("out"));
  flame_train_test::write_text(dir.file("out/latent_cache.safetensors"), "not a safetensors file");
  const ProgramRun run = run_program(dir.file("train.json"));
  EXPECT_EQ(run.status, 1) << run.output;
  EXPECT_NE(run.output.find("not a safetensors file"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("loading text encoder"), std::string::npos) << run.output;
  std::ifstream in(dir.file("out/latent_cache.safetensors"));
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "not a safetensors file");  // untouched
}

// The walkthrough's form: model.path a diffusers pipeline folder (model_index.json, transformer, vae,
// text_encoder, text_encoder_2, tokenizer, tokenizer_2) and nothing else about the model: the
// denoiser loads as the pipeline's transformer component, the caching stage finds the rest.
TEST_F(CacheWriterGpu, PipelineFolderAloneTrainsEndToEnd) {
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(make_inputs(dir));
  const std::string pipe = dir.file("FLUX.1-tiny");
  fs::create_directories(pipe);
  fs::rename(dir.file("vae"), pipe + "/vae");
  fs::rename(dir.file("clip_l"), pipe + "/text_encoder");
  fs::rename(dir.file("t5"), pipe + "/text_encoder_2");
  fs::rename(dir.file("tokenizers/tokenizer"), pipe + "/tokenizer");
  fs::rename(dir.file("tokenizers/tokenizer_2"), pipe + "/tokenizer_2");
  const char* architecture = nullptr;
  const char* config = demo_model_config("flux", &architecture);
  ASSERT_NO_FATAL_FAILURE(save_model(architecture, nlohmann::json::parse(config), pipe + "/transformer",
                                     "diffusion_pytorch_model.safetensors"));
  std::ofstream(pipe + "/model_index.json") << R"({"_class_name": "FluxPipeline", "transformer": ["diffusers", "FluxTransformer2DModel"],
    "vae": ["diffusers", "AutoencoderKL"], "text_encoder": ["transformers", "CLIPTextModel"],
    "text_encoder_2": ["transformers", "T5EncoderModel"], "tokenizer": ["transformers", "CLIPTokenizer"],
    "tokenizer_2": ["transformers", "T5TokenizerFast"]})";
  const nlohmann::json train = {
      {"model", {{"path", pipe}}},
      {"data", {{"path", dir.file("images")}, {"resolution", 64}, {"min_bucket_reso", 64}, {"max_bucket_reso", 128}}},
      {"training", {{"max_train_steps", 4}, {"seed", 3}}},
      {"optimizer", {{"learning_rate", 1e-3}}},
      {"output", {{"dir", dir.file("pipe_out")}, {"name", "piped"}}}};
  std::ofstream(dir.file("pipe.json")) << train.dump(2);
  const ProgramRun run = run_program(dir.file("pipe.json"));
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("latent cache: encoding 2 texts and 2 images"), std::string::npos) << run.output;
  const std::vector<double> losses = losses_of(dir.file("pipe_out/piped.jsonl"));
  ASSERT_EQ(losses.size(), 4u) << run.output;
  for (double l : losses) EXPECT_TRUE(std::isfinite(l));
  EXPECT_TRUE(fs::exists(dir.file("pipe_out/piped.safetensors"))) << run.output;
}

}  // namespace
}  // namespace flame_train

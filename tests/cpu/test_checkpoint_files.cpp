// CheckpointFiles without a GPU (white-box, src/models/checkpoint_files.*): every layout it opens
// (single file, diffusers / transformers model folders with one file or shards, pipeline folders
// with a component), prefix views of single files that hold several components, the index and
// model_index parsers, and every malformed, foreign or inconsistent input as a clear error naming
// the file and key. Reading to the GPU is tests/gpu/models/test_checkpoint_read.cpp.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <algorithm>
#include <string>
#include <vector>
#include "core/error.h"
#include "models/checkpoint_files.h"
#include "synthetic_checkpoint.h"

using namespace flame;
using namespace flame::models;

namespace {

const std::string kConfig = "{\"_class_name\": \"UNet2DConditionModel\", \"in_channels\": 4}";

std::vector<synth::Tensor> small_tensors() {
  return {{"b.weight", "F16", {3, 2}, {}}, {"a.weight", "F32", {4}, {}}, {"c.scale", "BF16", {}, {}}};
}

std::vector<std::string> names(const std::vector<KeyShape>& keys) {
  std::vector<std::string> v;
  for (const KeyShape& k : keys) v.push_back(k.name);
  return v;
}

// Runs f, expecting flame::Error with status whose message contains every piece of `parts`.
template <class F>
void expect_error(F f, flame_status_t status, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error; expected status " << status;
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), status) << e.what();
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "'" << p << "' not in: " << e.what();
  }
}

// A sharded diffusers folder: two shards and their index; weight_map_json replaces the map.
std::string sharded_folder(const synth::TempDir& dir, const std::string& name, const std::string& weight_map_json = "") {
  const std::string folder = dir.sub(name, true);
  synth::write_text(folder + "/config.json", kConfig);
  synth::write_safetensors(folder + "/diffusion_pytorch_model-00001-of-00002.safetensors",
                           {{"down.0.weight", "F32", {2, 3}, {}}, {"down.0.bias", "F32", {2}, {}}});
  synth::write_safetensors(folder + "/diffusion_pytorch_model-00002-of-00002.safetensors",
                           {{"up.0.weight", "BF16", {5, 1}, {}}});
  const std::string map = weight_map_json.empty()
                              ? "{\"down.0.weight\": \"diffusion_pytorch_model-00001-of-00002.safetensors\", "
                                "\"down.0.bias\": \"diffusion_pytorch_model-00001-of-00002.safetensors\", "
                                "\"up.0.weight\": \"diffusion_pytorch_model-00002-of-00002.safetensors\"}"
                              : weight_map_json;
  synth::write_text(folder + "/diffusion_pytorch_model.safetensors.index.json",
                    "{\"metadata\": {\"total_size\": 42}, \"weight_map\": " + map + "}");
  return folder;
}

const char* kSdxlModelIndex = R"({
  "_class_name": "StableDiffusionXLPipeline", "_diffusers_version": "0.19.0",
  "force_zeros_for_empty_prompt": true,
  "scheduler": ["diffusers", "EulerDiscreteScheduler"],
  "text_encoder": ["transformers", "CLIPTextModel"],
  "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
  "tokenizer": ["transformers", "CLIPTokenizer"],
  "unet": ["diffusers", "UNet2DConditionModel"],
  "vae": ["diffusers", "AutoencoderKL"],
  "safety_checker": [null, null]
})";

}  // namespace

// ---- layouts ----

TEST(CheckpointFiles, SingleFile) {
  synth::TempDir dir;
  const std::string path = dir.sub("m.safetensors");
  synth::write_safetensors(path, small_tensors());
  const CheckpointFiles cf = CheckpointFiles::open(path);
  EXPECT_EQ(cf.layout(), CheckpointLayout::SingleFile);
  EXPECT_EQ(cf.source(), path);
  EXPECT_EQ(cf.config_json(), "");
  EXPECT_EQ(names(cf.keys()), (std::vector<std::string>{"a.weight", "b.weight", "c.scale"}));
  EXPECT_EQ(cf.keys()[1].shape, (std::vector<int64_t>{3, 2}));
  EXPECT_TRUE(cf.keys()[2].shape.empty());
  EXPECT_EQ(cf.stored("b.weight").dtype_name, "F16");
  EXPECT_TRUE(cf.stored("b.weight").supported);
  EXPECT_EQ(cf.stored("b.weight").dtype, FLAME_DTYPE_F16);
  EXPECT_EQ(cf.stored("b.weight").bytes, 12u);
  EXPECT_EQ(cf.stored("c.scale").dtype, FLAME_DTYPE_BF16);
  EXPECT_EQ(cf.stored("a.weight").file, path);
  EXPECT_TRUE(cf.contains("a.weight"));
  EXPECT_FALSE(cf.contains("a"));
  EXPECT_TRUE(cf.component_prefixes().empty());
  EXPECT_EQ(cf.load_stats().bytes, 0u);
  EXPECT_EQ(cf.load_stats().gb_per_s(), 0.0);
}

TEST(CheckpointFiles, DiffusersModelFolder) {
  synth::TempDir dir;
  const std::string folder = dir.sub("unet", true);
  synth::write_text(folder + "/config.json", kConfig);
  synth::write_safetensors(folder + "/diffusion_pytorch_model.safetensors", small_tensors());
  const CheckpointFiles cf = CheckpointFiles::open(folder);
  EXPECT_EQ(cf.layout(), CheckpointLayout::ModelFolder);
  EXPECT_EQ(cf.source(), folder);
  EXPECT_EQ(cf.config_json(), kConfig);
  EXPECT_EQ(cf.keys().size(), 3u);
  EXPECT_EQ(cf.stored("c.scale").file, folder + "/diffusion_pytorch_model.safetensors");
  // A trailing slash names the same folder.
  EXPECT_EQ(CheckpointFiles::open(folder + "/").keys().size(), 3u);
}

TEST(CheckpointFiles, TransformersModelFolder) {
  synth::TempDir dir;
  const std::string folder = dir.sub("text_encoder", true);
  synth::write_text(folder + "/config.json", "{\"architectures\": [\"CLIPTextModel\"]}");
  synth::write_safetensors(folder + "/model.safetensors", small_tensors());
  const CheckpointFiles cf = CheckpointFiles::open(folder);
  EXPECT_EQ(cf.layout(), CheckpointLayout::ModelFolder);
  EXPECT_EQ(cf.stored("a.weight").file, folder + "/model.safetensors");
}

TEST(CheckpointFiles, ShardedFolder) {
  synth::TempDir dir;
  const std::string folder = sharded_folder(dir, "transformer");
  const CheckpointFiles cf = CheckpointFiles::open(folder);
  EXPECT_EQ(cf.layout(), CheckpointLayout::ShardedModelFolder);
  EXPECT_EQ(names(cf.keys()), (std::vector<std::string>{"down.0.bias", "down.0.weight", "up.0.weight"}));
  EXPECT_EQ(cf.stored("up.0.weight").file, folder + "/diffusion_pytorch_model-00002-of-00002.safetensors");
  EXPECT_EQ(cf.stored("up.0.weight").dtype, FLAME_DTYPE_BF16);
  EXPECT_EQ(cf.stored("down.0.bias").file, folder + "/diffusion_pytorch_model-00001-of-00002.safetensors");
}

TEST(CheckpointFiles, TransformersShardedFolder) {
  synth::TempDir dir;
  const std::string folder = dir.sub("text_encoder_3", true);
  synth::write_text(folder + "/config.json", "{}");
  synth::write_safetensors(folder + "/model-00001-of-00002.safetensors", {{"x", "F32", {1}, {}}});
  synth::write_safetensors(folder + "/model-00002-of-00002.safetensors", {{"y", "F32", {1}, {}}});
  synth::write_text(folder + "/model.safetensors.index.json",
                    "{\"weight_map\": {\"x\": \"model-00001-of-00002.safetensors\", \"y\": \"model-00002-of-00002.safetensors\"}}");
  const CheckpointFiles cf = CheckpointFiles::open(folder);
  EXPECT_EQ(cf.layout(), CheckpointLayout::ShardedModelFolder);
  EXPECT_EQ(names(cf.keys()), (std::vector<std::string>{"x", "y"}));
}

TEST(CheckpointFiles, ShardSymlinkedOutsideTheFolder) {
  // The Hugging Face cache links shards into ../../blobs: the name is plain, the target is elsewhere.
  synth::TempDir dir;
  const std::string folder = dir.sub("snap", true);
  dir.sub("blobs", true);
  synth::write_text(folder + "/config.json", "{}");
  synth::write_safetensors(dir.sub("blobs/abc"), {{"x", "F32", {1}, {}}});
  ASSERT_EQ(symlink("../blobs/abc", (folder + "/model.safetensors").c_str()), 0);
  EXPECT_EQ(CheckpointFiles::open(folder).keys().size(), 1u);
}

TEST(CheckpointFiles, PipelineComponents) {
  synth::TempDir dir;
  const std::string pipe = dir.path();
  synth::write_text(pipe + "/model_index.json", kSdxlModelIndex);
  for (const char* c : {"unet", "vae", "text_encoder", "text_encoder_2"}) {
    const std::string folder = dir.sub(c, true);
    synth::write_text(folder + "/config.json", std::string("{\"name\": \"") + c + "\"}");
    synth::write_safetensors(folder + (c[0] == 't' ? "/model.safetensors" : "/diffusion_pytorch_model.safetensors"),
                             {{std::string(c) + ".w", "F32", {2}, {}}});
  }
  for (const char* c : {"unet", "vae", "text_encoder", "text_encoder_2"}) {
    const CheckpointFiles cf = CheckpointFiles::open(pipe, c);
    EXPECT_EQ(cf.source(), pipe + "/" + c);
    EXPECT_EQ(names(cf.keys()), (std::vector<std::string>{std::string(c) + ".w"}));
    EXPECT_NE(cf.config_json().find(c), std::string::npos);
  }
  // The pipeline without a component: which ones it has.
  expect_error([&] { CheckpointFiles::open(pipe); }, FLAME_ERROR_INVALID_ARGUMENT,
               {"pipeline", "'text_encoder_2'", "'unet'", "'vae'"});
  // A component the pipeline does not list, or lists without a folder.
  expect_error([&] { CheckpointFiles::open(pipe, "transformer"); }, FLAME_ERROR_INVALID_ARGUMENT,
               {"model_index.json", "'transformer'", "'unet'"});
  expect_error([&] { CheckpointFiles::open(pipe, "safety_checker"); }, FLAME_ERROR_INVALID_ARGUMENT,
               {"'safety_checker'"});
  expect_error([&] { CheckpointFiles::open(pipe, "tokenizer"); }, FLAME_ERROR_IO, {"tokenizer", "not a folder"});
  expect_error([&] { CheckpointFiles::open(pipe, "scheduler"); }, FLAME_ERROR_IO, {"scheduler"});
  expect_error([&] { CheckpointFiles::open(pipe, "../unet"); }, FLAME_ERROR_INVALID_ARGUMENT, {"'../unet'"});
  expect_error([&] { CheckpointFiles::open(pipe, "."); }, FLAME_ERROR_INVALID_ARGUMENT, {"'.'"});
  // A component asked of a model folder or a single file.
  expect_error([&] { CheckpointFiles::open(pipe + "/unet", "vae"); }, FLAME_ERROR_INVALID_ARGUMENT,
               {"not a diffusers pipeline folder"});
  expect_error([&] { CheckpointFiles::open(pipe + "/unet/diffusion_pytorch_model.safetensors", "unet"); },
               FLAME_ERROR_INVALID_ARGUMENT, {"single file"});
}

// ---- prefix views ----

TEST(CheckpointFiles, SdxlSingleFileViews) {
  synth::TempDir dir;
  const std::string path = dir.sub("sd_xl_base_1.0.safetensors");
  synth::write_safetensors(path, {
      {"model.diffusion_model.input_blocks.0.0.weight", "F16", {4, 4, 3, 3}, {}},
      {"model.diffusion_model.time_embed.0.bias", "F16", {8}, {}},
      {"first_stage_model.decoder.conv_in.weight", "F32", {2, 4, 3, 3}, {}},
      {"conditioner.embedders.0.transformer.text_model.final_layer_norm.weight", "F16", {8}, {}},
      {"conditioner.embedders.1.model.text_projection", "F16", {8, 8}, {}},
      {"denoiser.sigmas", "F32", {10}, {}},
  });
  const CheckpointFiles cf = CheckpointFiles::open(path);
  EXPECT_EQ(cf.component_prefixes(),
            (std::vector<std::string>{"model.diffusion_model.", "first_stage_model.", "conditioner.embedders.0.transformer.",
                                      "conditioner.embedders.1.model."}));
  const CheckpointFiles unet = cf.with_prefix("model.diffusion_model.");
  EXPECT_EQ(names(unet.keys()), (std::vector<std::string>{"input_blocks.0.0.weight", "time_embed.0.bias"}));
  EXPECT_EQ(unet.keys()[0].shape, (std::vector<int64_t>{4, 4, 3, 3}));
  EXPECT_EQ(unet.stored("time_embed.0.bias").dtype, FLAME_DTYPE_F16);
  EXPECT_EQ(unet.stored("time_embed.0.bias").file, path);
  EXPECT_TRUE(unet.component_prefixes().empty());
  EXPECT_FALSE(unet.contains("model.diffusion_model.time_embed.0.bias"));
  const CheckpointFiles vae = cf.with_prefix("first_stage_model.");
  EXPECT_EQ(names(vae.keys()), (std::vector<std::string>{"decoder.conv_in.weight"}));
  EXPECT_EQ(vae.stored("decoder.conv_in.weight").dtype, FLAME_DTYPE_F32);
  EXPECT_EQ(names(cf.with_prefix("conditioner.embedders.1.model.").keys()), (std::vector<std::string>{"text_projection"}));
  // Views of views strip both prefixes; the error of a missing key names the whole key.
  const CheckpointFiles te1 = cf.with_prefix("conditioner.").with_prefix("embedders.0.transformer.");
  EXPECT_EQ(names(te1.keys()), (std::vector<std::string>{"text_model.final_layer_norm.weight"}));
  expect_error([&] { te1.stored("nope"); }, FLAME_ERROR_INVALID_ARGUMENT,
               {path, "'conditioner.embedders.0.transformer.nope'"});
  expect_error([&] { cf.with_prefix("text_encoders."); }, FLAME_ERROR_INVALID_ARGUMENT, {path, "'text_encoders.'"});
  EXPECT_EQ(cf.with_prefix("").keys().size(), cf.keys().size());
}

TEST(CheckpointFiles, Sd35AndComfyFluxPrefixes) {
  synth::TempDir dir;
  const std::string sd35 = dir.sub("sd3.5_medium.safetensors");
  synth::write_safetensors(sd35, {
      {"model.diffusion_model.x_embedder.proj.weight", "F16", {4, 16, 2, 2}, {}},
      {"first_stage_model.encoder.conv_in.bias", "F32", {4}, {}},
      {"text_encoders.clip_l.transformer.text_model.embeddings.position_ids", "I64", {1, 77}, {}},
      {"text_encoders.clip_g.transformer.text_projection.weight", "F16", {4, 4}, {}},
      {"text_encoders.t5xxl.transformer.shared.weight", "F16", {8, 4}, {}},
  });
  const CheckpointFiles cf = CheckpointFiles::open(sd35);
  EXPECT_EQ(cf.component_prefixes(),
            (std::vector<std::string>{"model.diffusion_model.", "first_stage_model.", "text_encoders.clip_l.transformer.",
                                      "text_encoders.clip_g.transformer.", "text_encoders.t5xxl.transformer."}));
  EXPECT_EQ(names(cf.with_prefix("text_encoders.t5xxl.transformer.").keys()), (std::vector<std::string>{"shared.weight"}));
  EXPECT_EQ(cf.with_prefix("text_encoders.clip_l.transformer.").stored("text_model.embeddings.position_ids").dtype,
            FLAME_DTYPE_I64);

  const std::string comfy = dir.sub("flux1-dev-comfy.safetensors");
  synth::write_safetensors(comfy, {{"model.diffusion_model.img_in.weight", "BF16", {6, 4}, {}},
                                   {"model.diffusion_model.img_in.bias", "BF16", {6}, {}}});
  const CheckpointFiles flux = CheckpointFiles::open(comfy);
  EXPECT_EQ(flux.component_prefixes(), (std::vector<std::string>{"model.diffusion_model."}));
  EXPECT_EQ(names(flux.with_prefix("model.diffusion_model.").keys()), (std::vector<std::string>{"img_in.bias", "img_in.weight"}));
  EXPECT_EQ(known_component_prefixes().size(), 7u);
}

// ---- the parsers ----

TEST(CheckpointFiles, ParseShardIndex) {
  const auto pairs = parse_shard_index(
      "{\"metadata\": {\"total_size\": 10, \"format\": \"pt\"}, \"weight_map\": {\"b\": \"s2.safetensors\", \"a\": \"s1.safetensors\"}}",
      "idx.json");
  ASSERT_EQ(pairs.size(), 2u);
  EXPECT_EQ(pairs[0], (std::pair<std::string, std::string>{"a", "s1.safetensors"}));
  EXPECT_EQ(pairs[1], (std::pair<std::string, std::string>{"b", "s2.safetensors"}));
  EXPECT_EQ(parse_shard_index("{\"weight_map\": {\"a\": \"s\"}}", "i").size(), 1u);
  const std::vector<std::pair<std::string, std::vector<std::string>>> bad{
      {"", {"invalid JSON"}},
      {"{\"weight_map\": {\"a\": \"s\"}", {"invalid JSON"}},
      {"[]", {"JSON object"}},
      {"{\"metadata\": {}}", {"no \"weight_map\""}},
      {"{\"weight_map\": []}", {"not an object"}},
      {"{\"weight_map\": {}}", {"empty"}},
      {"{\"weight_map\": {\"a\": 3}}", {"'a'", "not a string"}},
      {"{\"weight_map\": {\"a\": \"s\"}, \"metadata\": 5}", {"\"metadata\""}},
      {"{\"weight_map\": {\"a\": \"s\", \"a\": \"t\"}}", {"'a'", "twice"}},
      {"{\"weight_map\": {\"a\": \"s\"}, \"weight_map\": {\"b\": \"s\"}}", {"'weight_map'", "twice"}},
      {"{\"weight_map\": {\"a\": \"../x.safetensors\"}}", {"'a'", "'../x.safetensors'", "plain file name"}},
      {"{\"weight_map\": {\"a\": \"sub/x.safetensors\"}}", {"'sub/x.safetensors'"}},
      {"{\"weight_map\": {\"a\": \"/etc/passwd\"}}", {"'/etc/passwd'"}},
      {"{\"weight_map\": {\"a\": \"..\"}}", {"'..'"}},
      {"{\"weight_map\": {\"a\": \"\"}}", {"''"}},
      {"{\"weight_map\": {\"a\": \"x\\\\y\"}}", {"plain file name"}},
      {"{\"weight_map\": {\"a\": \"x\\u0000y\"}}", {"plain file name"}},
      {"{\"weight_map\": {\"a\": \"s\"}, \"m\": " + std::string(20, '[') + std::string(20, ']') + "}", {"deeper"}},
      {"{\"weight_map\": {\"a\": \"\xff\"}}", {"invalid JSON"}},
  };
  for (const auto& [text, parts] : bad) {
    SCOPED_TRACE(text);
    std::vector<std::string> want = parts;
    want.push_back("idx.json");
    const std::string json = text;  // a structured binding cannot be captured in C++17
    expect_error([&] { parse_shard_index(json, "idx.json"); }, FLAME_ERROR_INVALID_FORMAT, want);
  }
}

TEST(CheckpointFiles, ParseModelIndex) {
  const auto comps = parse_model_index(kSdxlModelIndex, "model_index.json");
  std::vector<std::string> got;
  for (const PipelineComponent& c : comps) got.push_back(c.name);
  EXPECT_EQ(got, (std::vector<std::string>{"scheduler", "text_encoder", "text_encoder_2", "tokenizer", "unet", "vae"}));
  EXPECT_EQ(comps[4].library, "diffusers");
  EXPECT_EQ(comps[4].class_name, "UNet2DConditionModel");
  EXPECT_TRUE(parse_model_index("{}", "m").empty());
  const std::vector<std::pair<std::string, std::vector<std::string>>> bad{
      {"{", {"invalid JSON"}},
      {"[\"unet\"]", {"JSON object"}},
      {"{\"unet\": [\"diffusers\"]}", {"'unet'", "pair"}},
      {"{\"unet\": [\"diffusers\", 3]}", {"'unet'", "strings"}},
      {"{\"unet\": [\"diffusers\", null]}", {"'unet'", "strings"}},
      {"{\"../unet\": [\"diffusers\", \"UNet2DConditionModel\"]}", {"'../unet'", "plain folder name"}},
      {"{\"a/b\": [\"diffusers\", \"X\"]}", {"'a/b'"}},
      {"{\"unet\": [\"a\", \"b\"], \"unet\": [\"c\", \"d\"]}", {"'unet'", "twice"}},
  };
  for (const auto& [text, parts] : bad) {
    SCOPED_TRACE(text);
    std::vector<std::string> want = parts;
    want.push_back("mi.json");
    const std::string json = text;  // a structured binding cannot be captured in C++17
    expect_error([&] { parse_model_index(json, "mi.json"); }, FLAME_ERROR_INVALID_FORMAT, want);
  }
}

// ---- errors of whole layouts ----

TEST(CheckpointFiles, MissingThings) {
  synth::TempDir dir;
  expect_error([&] { CheckpointFiles::open(dir.sub("nothing")); }, FLAME_ERROR_IO, {"nothing", "does not exist"});
  const std::string empty = dir.sub("empty", true);
  expect_error([&] { CheckpointFiles::open(empty); }, FLAME_ERROR_IO, {empty, "config.json"});
  const std::string no_weights = dir.sub("no_weights", true);
  synth::write_text(no_weights + "/config.json", "{}");
  synth::write_text(no_weights + "/diffusion_pytorch_model.bin", "pickle");
  synth::write_safetensors(no_weights + "/diffusion_pytorch_model.fp16.safetensors", small_tensors());
  expect_error([&] { CheckpointFiles::open(no_weights); }, FLAME_ERROR_IO,
               {no_weights, "no weights", "'diffusion_pytorch_model.bin'", "'diffusion_pytorch_model.fp16.safetensors'"});
  expect_error([&] { CheckpointFiles::open("/dev/null"); }, FLAME_ERROR_IO, {"/dev/null", "neither a file nor a folder"});
  const std::string config_folder = dir.sub("config_folder", true);
  dir.sub("config_folder/config.json", true);
  expect_error([&] { CheckpointFiles::open(config_folder); }, FLAME_ERROR_IO, {config_folder + "/config.json", "regular file"});
  const std::string no_config = dir.sub("no_config", true);
  synth::write_safetensors(no_config + "/diffusion_pytorch_model.safetensors", small_tensors());
  expect_error([&] { CheckpointFiles::open(no_config); }, FLAME_ERROR_IO, {no_config, "config.json"});
}

TEST(CheckpointFiles, BadConfig) {
  synth::TempDir dir;
  int n = 0;
  for (const std::string& text : {std::string("{\"a\": "), std::string("[1, 2]"), std::string("{\"a\": 1, \"a\": 2}"),
                                  std::string("")}) {
    SCOPED_TRACE(text);
    const std::string folder = dir.sub("m" + std::to_string(n++), true);
    synth::write_text(folder + "/config.json", text);
    synth::write_safetensors(folder + "/model.safetensors", small_tensors());
    expect_error([&] { CheckpointFiles::open(folder); }, FLAME_ERROR_INVALID_FORMAT, {folder + "/config.json"});
  }
}

TEST(CheckpointFiles, AmbiguousWeights) {
  synth::TempDir dir;
  const std::string folder = sharded_folder(dir, "t");
  synth::write_safetensors(folder + "/diffusion_pytorch_model.safetensors", small_tensors());
  expect_error([&] { CheckpointFiles::open(folder); }, FLAME_ERROR_INVALID_FORMAT,
               {folder, "ambiguous", "'diffusion_pytorch_model.safetensors'", "'diffusion_pytorch_model.safetensors.index.json'"});
}

TEST(CheckpointFiles, ForeignAndTruncatedFiles) {
  synth::TempDir dir;
  const std::string text = dir.sub("notes.safetensors");
  synth::write_text(text, "this is not a safetensors file at all");
  expect_error([&] { CheckpointFiles::open(text); }, FLAME_ERROR_INVALID_FORMAT, {text});
  const std::string empty = dir.sub("empty.safetensors");
  synth::write_text(empty, "");
  expect_error([&] { CheckpointFiles::open(empty); }, FLAME_ERROR_INVALID_FORMAT, {empty});
  std::string bytes = synth::safetensors_bytes(small_tensors());
  const std::string cut = dir.sub("cut.safetensors");
  synth::write_text(cut, bytes.substr(0, bytes.size() - 3));
  expect_error([&] { CheckpointFiles::open(cut); }, FLAME_ERROR_INVALID_FORMAT, {cut});
  // A truncated shard fails the whole folder, naming the shard.
  const std::string folder = sharded_folder(dir, "s");
  const std::string shard = folder + "/diffusion_pytorch_model-00002-of-00002.safetensors";
  bytes = synth::safetensors_bytes({{"up.0.weight", "BF16", {5, 1}, {}}});
  synth::write_text(shard, bytes.substr(0, bytes.size() - 1));
  expect_error([&] { CheckpointFiles::open(folder); }, FLAME_ERROR_INVALID_FORMAT, {shard});
  // A foreign index.
  const std::string folder2 = sharded_folder(dir, "s2");
  synth::write_text(folder2 + "/diffusion_pytorch_model.safetensors.index.json", "<html>rate limited</html>");
  expect_error([&] { CheckpointFiles::open(folder2); }, FLAME_ERROR_INVALID_FORMAT,
               {folder2 + "/diffusion_pytorch_model.safetensors.index.json", "invalid JSON"});
}

TEST(CheckpointFiles, LyingShardIndex) {
  synth::TempDir dir;
  const std::string s1 = "diffusion_pytorch_model-00001-of-00002.safetensors";
  const std::string s2 = "diffusion_pytorch_model-00002-of-00002.safetensors";
  struct Case {
    std::string map;
    flame_status_t status;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases{
      // A shard file that is not there.
      {"{\"down.0.weight\": \"" + s1 + "\", \"down.0.bias\": \"" + s1 + "\", \"up.0.weight\": \"missing.safetensors\"}",
       FLAME_ERROR_INVALID_FORMAT, {"'up.0.weight'", "'missing.safetensors'", "does not exist"}},
      // A key listed in the wrong shard.
      {"{\"down.0.weight\": \"" + s1 + "\", \"down.0.bias\": \"" + s2 + "\", \"up.0.weight\": \"" + s2 + "\"}",
       FLAME_ERROR_INVALID_FORMAT, {"'down.0.bias'", s2, "but it is in", s1}},
      // A key no shard holds.
      {"{\"down.0.weight\": \"" + s1 + "\", \"down.0.bias\": \"" + s1 + "\", \"up.0.weight\": \"" + s2 +
           "\", \"ghost\": \"" + s2 + "\"}",
       FLAME_ERROR_INVALID_FORMAT, {"'ghost'", "does not hold it"}},
      // A key a shard holds that the index does not list.
      {"{\"down.0.weight\": \"" + s1 + "\", \"up.0.weight\": \"" + s2 + "\"}", FLAME_ERROR_INVALID_FORMAT,
       {s1, "'down.0.bias'", "does not list"}},
      // Path traversal.
      {"{\"down.0.weight\": \"../" + s1 + "\"}", FLAME_ERROR_INVALID_FORMAT, {"'../" + s1 + "'", "plain file name"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].map);
    const std::string folder = sharded_folder(dir, "case" + std::to_string(i), cases[i].map);
    std::vector<std::string> parts = cases[i].parts;
    parts.push_back(folder);
    expect_error([&] { CheckpointFiles::open(folder); }, cases[i].status, parts);
  }
  // The same key in two shards.
  const std::string folder = sharded_folder(dir, "dup");
  synth::write_safetensors(folder + "/" + s2, {{"up.0.weight", "BF16", {5, 1}, {}}, {"down.0.bias", "F32", {2}, {}}});
  expect_error([&] { CheckpointFiles::open(folder); }, FLAME_ERROR_INVALID_FORMAT,
               {"'down.0.bias'", "two shards", folder + "/" + s1, folder + "/" + s2});
}

TEST(CheckpointFiles, BadModelIndex) {
  synth::TempDir dir;
  synth::write_text(dir.sub("model_index.json"), "{\"unet\": [\"diffusers\", \"UNet2DConditionModel\"], \"unet\": [1, 2]}");
  expect_error([&] { CheckpointFiles::open(dir.path(), "unet"); }, FLAME_ERROR_INVALID_FORMAT,
               {dir.sub("model_index.json"), "twice"});
  expect_error([&] { CheckpointFiles::open(dir.path()); }, FLAME_ERROR_INVALID_FORMAT, {dir.sub("model_index.json")});
}

// read_into's checks that come before any device work.
TEST(CheckpointFiles, ReadIntoChecksWithoutDevice) {
  synth::TempDir dir;
  const std::string path = dir.sub("m.safetensors");
  synth::write_safetensors(path, {{"odd", "C64", {2}, {}}, {"w", "F32", {4, 3}, {}}});
  const CheckpointFiles cf = CheckpointFiles::open(path);
  EXPECT_FALSE(cf.stored("odd").supported);
  EXPECT_EQ(cf.stored("odd").dtype_name, "C64");
  expect_error([&] { cf.read_into("odd", nullptr); }, FLAME_ERROR_UNSUPPORTED, {path, "'odd'", "C64"});
  expect_error([&] { cf.read_into("missing", nullptr); }, FLAME_ERROR_INVALID_ARGUMENT, {path, "'missing'"});
  expect_error([&] { cf.read_into("w", nullptr, 3, 2); }, FLAME_ERROR_INVALID_ARGUMENT, {path, "'w'", "[3, 5)", "4 rows"});
  expect_error([&] { cf.read_into("w", nullptr, -1); }, FLAME_ERROR_INVALID_ARGUMENT, {path, "'w'"});
  expect_error([&] { cf.read_into("w", nullptr, 5); }, FLAME_ERROR_INVALID_ARGUMENT, {path, "'w'"});
  expect_error([&] { cf.read_into("w", nullptr, 1, 2); }, FLAME_ERROR_INVALID_ARGUMENT, {path, "'w'", "null"});
  expect_error([&] { cf.with_prefix("w").read_into("", nullptr, 0, 9); }, FLAME_ERROR_INVALID_ARGUMENT, {path, "'w'"});
}

// flame-train: the configuration (defaults, JSON file, overrides, every kind of error, --help).
#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "config.h"
#include "image_writers.h"
#include "memory_check.h"
#include "model_setup.h"
#include "optimizer_setup.h"

using namespace flame_train;
using flame_train_test::has_problem;
using flame_train_test::TempDir;

namespace {

// A command line with a model file and a data folder that exist, plus extra arguments.
struct Fixture {
  TempDir dir;
  std::string model, data;
  Fixture() {
    model = dir.file("model.safetensors");
    data = dir.file("images");
    flame_train_test::write_text(model, "{}");
    flame_train_test::write_text(data + "/a.txt", "caption");
  }
  std::vector<std::string> args(std::vector<std::string> extra) const {
    std::vector<std::string> all = {"--model.path=" + model, "--data.path", data};
    all.insert(all.end(), extra.begin(), extra.end());
    return all;
  }
  CommandLine parse(std::vector<std::string> extra) const { return flame_train_test::command_line(args(extra)); }
  // The problems load_config reports for extra arguments (empty when it succeeds).
  std::vector<std::string> problems(std::vector<std::string> extra) const {
    return flame_train_test::config_problems(args(extra));
  }
};

}  // namespace

TEST(TrainerConfig, DefaultsAndOverrides) {
  Fixture f;
  TrainConfig c = load_config(f.parse({}));
  EXPECT_EQ(c.model.path, f.model);
  EXPECT_EQ(c.data.path, f.data);
  EXPECT_EQ(c.data.buckets.resolution, 1024);
  EXPECT_EQ(c.data.buckets.step, 64);
  EXPECT_EQ(c.training.batch_size, 1);
  EXPECT_EQ(c.training.seed, 42u);
  EXPECT_EQ(c.optimizer.type, "adamw");
  EXPECT_EQ(c.output.format, "kohya");
  EXPECT_TRUE(c.sample.prompts.empty());

  c = load_config(f.parse({"--data.resolution=512", "--data.max_bucket_reso", "1024", "--data.shuffle_caption=true",
                           "--optimizer.learning_rate=3e-4", "--sample.prompts=[\"a cat\", \"a dog\"]",
                           "--sample.every_n_steps=100", "--training.seed=9000000000000000000"}));
  EXPECT_EQ(c.data.buckets.resolution, 512);
  EXPECT_EQ(c.data.buckets.max_side, 1024);
  EXPECT_TRUE(c.data.captions.shuffle);
  EXPECT_DOUBLE_EQ(c.optimizer.learning_rate, 3e-4);
  EXPECT_EQ(c.sample.prompts, (std::vector<std::string>{"a cat", "a dog"}));
  EXPECT_EQ(c.training.seed, 9000000000000000000ull);
  c = load_config(f.parse({"--sample.prompts=one prompt, with a comma"}));
  EXPECT_EQ(c.sample.prompts, (std::vector<std::string>{"one prompt, with a comma"}));
}

TEST(TrainerConfig, FileThenOverridesWin) {
  Fixture f;
  const std::string file = f.dir.file("train.json");
  flame_train_test::write_text(file, R"({"data": {"resolution": 768, "flip_aug": true, "keep_tokens": 2},
    "network": {"dim": 32, "alpha": 8},
    "training": {"batch_size": 4}})");
  TrainConfig c = load_config(f.parse({"--config", file, "--training.batch_size=2"}));
  EXPECT_EQ(c.data.buckets.resolution, 768);
  EXPECT_TRUE(c.data.flip_aug);
  EXPECT_EQ(c.data.captions.keep_tokens, 2);
  EXPECT_EQ(c.network.dim, 32);
  EXPECT_DOUBLE_EQ(c.network.alpha, 8.0);  // an integer is a fine number
  EXPECT_EQ(c.training.batch_size, 2);     // the command line wins
  CommandLine cmd = f.parse({"--config=" + file, "--dry-run"});
  EXPECT_TRUE(cmd.dry_run);
  EXPECT_EQ(cmd.config_file, file);
}

// The caching stage's source keys: empty by default (model.path's subfolders), set by overrides.
TEST(TrainerConfig, CachingStageSourceKeys) {
  Fixture f;
  TrainConfig c = load_config(f.parse({}));
  EXPECT_TRUE(c.model.vae.empty());
  EXPECT_TRUE(c.model.tokenizer_dir.empty());
  c = load_config(f.parse({"--model.vae=ae.safetensors", "--model.text_encoder=clip_l.safetensors",
                           "--model.text_encoder_2=t5xxl.safetensors", "--model.text_encoder_3=t5.safetensors",
                           "--model.tokenizer_dir=tokenizers"}));
  EXPECT_EQ(c.model.vae, "ae.safetensors");
  EXPECT_EQ(c.model.text_encoder, "clip_l.safetensors");
  EXPECT_EQ(c.model.text_encoder_2, "t5xxl.safetensors");
  EXPECT_EQ(c.model.text_encoder_3, "t5.safetensors");
  EXPECT_EQ(c.model.tokenizer_dir, "tokenizers");
}

// The denoiser's memory options and the model options they make (model_setup.h), and the memory
// estimate's request built from the same options.
TEST(TrainerConfig, MemoryOptionsReachTheModelOptions) {
  Fixture f;
  TrainConfig c = load_config(f.parse({}));
  EXPECT_EQ(c.model.quantize, "none");
  EXPECT_EQ(nlohmann::json::parse(denoiser_model_options(c)), nlohmann::json::parse(R"({"dtype": "bf16"})"));
  c = load_config(f.parse({"--model.quantize=f8_e4m3", "--model.quantize_scale=row"}));
  EXPECT_EQ(nlohmann::json::parse(denoiser_model_options(c)),
            nlohmann::json::parse(R"({"dtype": "bf16", "quantize": {"dtype": "f8_e4m3", "scale": "row"}})"));
  EXPECT_EQ(nlohmann::json::parse(memory_estimate_request(c)).at("options"),
            nlohmann::json::parse(denoiser_model_options(c)));
  c = load_config(f.parse({"--model.offload_budget_gib=12"}));
  EXPECT_EQ(nlohmann::json::parse(denoiser_model_options(c)).at("offload").at("budget_bytes").get<uint64_t>(),
            uint64_t(12) << 30);
  // A pipeline folder's denoiser is its component.
  const std::string pipeline = f.dir.file("pipeline");
  flame_train_test::write_text(pipeline + "/model_index.json", R"({"_class_name": "FluxPipeline", "transformer": ["diffusers", "FluxTransformer2DModel"]})");
  c = load_config(f.parse({"--model.path=" + pipeline}));
  EXPECT_EQ(nlohmann::json::parse(denoiser_model_options(c)).at("component"), "transformer");
  flame_train_test::write_text(pipeline + "/model_index.json", R"({"_class_name": "StableDiffusionXLPipeline", "unet": ["diffusers", "UNet2DConditionModel"]})");
  EXPECT_EQ(nlohmann::json::parse(denoiser_model_options(c)).at("component"), "unet");
  EXPECT_TRUE(has_problem(f.problems({"--model.quantize=nf4"}), "\"nf4\" is not one of none, f8_e4m3"));
  EXPECT_TRUE(has_problem(f.problems({"--model.offload_budget_gib=-1"}), "out of range"));
  EXPECT_TRUE(has_problem(f.problems({"--model.quantize=f8_e4m3", "--model.offload_budget_gib=8"}),
                          "does not combine an fp8 base with offload"));
}

// The example in tools/flame-train (the README points at it) stays valid: only its paths, which
// name files a user has, are replaced.
TEST(TrainerConfig, TheShippedExampleLoads) {
  Fixture f;
  TrainConfig c = load_config(f.parse({"--config", FLAME_SOURCE_DIR "/tools/flame-train/example.json",
                                       "--model.path=" + f.model, "--data.path=" + f.data,
                                       "--output.dir=" + f.dir.file("out")}));
  EXPECT_EQ(c.optimizer.lr_scheduler, "cosine");
  EXPECT_EQ(c.sample.prompts.size(), 1u);
  EXPECT_EQ(c.output.name, "my_lora");
  EXPECT_EQ(c.data.captions.keep_tokens, 1);
}

TEST(TrainerConfig, UnknownKeysSuggestTheNearest) {
  Fixture f;
  EXPECT_TRUE(has_problem(f.problems({"--data.resoluton=512"}),
                          "unknown key 'data.resoluton' (did you mean 'data.resolution'?)"));
  EXPECT_TRUE(has_problem(f.problems({"--data.learning_rate=1"}), "(did you mean 'optimizer.learning_rate'?)"));
  EXPECT_TRUE(has_problem(f.problems({"--data.zzzzzzzzzzzz=1"}), "unknown key 'data.zzzzzzzzzzzz'"));
  // "path" is a key of model and of data: no single suggestion, no "did you mean".
  auto ambiguous = f.problems({"--sample.path=x"});
  EXPECT_TRUE(has_problem(ambiguous, "unknown key 'sample.path'"));
  EXPECT_FALSE(has_problem(ambiguous, "did you mean"));
  const std::string file = f.dir.file("bad.json");
  flame_train_test::write_text(file, R"({"optimiser": {"type": "adamw"}, "training": {"batchsize": 2}})");
  auto p = f.problems({"--config", file});
  EXPECT_TRUE(has_problem(p, "unknown group 'optimiser' (did you mean 'optimizer'?)"));
  EXPECT_TRUE(has_problem(p, "unknown key 'training.batchsize' (did you mean 'training.batch_size'?)"));
  EXPECT_EQ(p.size(), 2u);
}

TEST(TrainerConfig, TypesRangesAndChoices) {
  Fixture f;
  EXPECT_TRUE(has_problem(f.problems({"--data.resolution=big"}), "--data.resolution: 'big' is not an integer"));
  EXPECT_TRUE(has_problem(f.problems({"--data.resolution=100000"}), "data.resolution: 100000 is out of range [64, 8192]"));
  EXPECT_TRUE(has_problem(f.problems({"--optimizer.learning_rate=0"}), "out of range (0, 1]"));
  EXPECT_TRUE(has_problem(f.problems({"--data.caption_dropout_rate=1.5"}), "out of range [0, 1]"));
  EXPECT_TRUE(has_problem(f.problems({"--data.flip_aug=maybe"}), "'maybe' is not a boolean"));
  EXPECT_TRUE(has_problem(f.problems({"--optimizer.type=sgd"}), "\"sgd\" is not one of adamw, lion, adamw8bit, lion8bit"));
  EXPECT_TRUE(has_problem(f.problems({"--training.seed=-1"}), "out of range"));
  EXPECT_TRUE(has_problem(f.problems({"--sample.prompts=[1, 2]"}), "expected a list of strings"));
  const std::string file = f.dir.file("types.json");
  flame_train_test::write_text(file, R"({"data": {"resolution": 512.5, "flip_aug": "yes", "path": 3}})");
  auto p = f.problems({"--config", file});
  EXPECT_TRUE(has_problem(p, "data.resolution: expected an integer, got 512.5"));
  EXPECT_TRUE(has_problem(p, "data.flip_aug: expected true or false, got \"yes\""));
  EXPECT_TRUE(has_problem(p, "data.path: expected a string, got 3"));
  // All problems at once, not only the first.
  EXPECT_EQ(f.problems({"--data.resolution=1", "--network.dim=0", "--optimizer.type=x"}).size(), 3u);
}

TEST(TrainerConfig, PathsAndConsistency) {
  Fixture f;
  EXPECT_TRUE(has_problem(f.problems({"--model.path=" + f.dir.file("nope.safetensors")}), "nope.safetensors does not exist"));
  EXPECT_TRUE(has_problem(f.problems({"--data.path=" + f.model}), "is not a folder"));
  EXPECT_TRUE(has_problem(f.problems({"--output.dir=" + f.dir.file("a/b/c")}), "its parent folder"));
  EXPECT_TRUE(has_problem(f.problems({"--output.dir=" + f.model}), "exists and is not a folder"));
  EXPECT_TRUE(f.problems({"--output.dir=" + f.dir.file("new_output")}).empty());
  EXPECT_TRUE(has_problem(f.problems({"--data.resolution=4096"}), "must lie between data.min_bucket_reso"));
  EXPECT_TRUE(has_problem(f.problems({"--data.min_bucket_reso=300"}), "must be multiples of data.bucket_reso_steps"));
  EXPECT_TRUE(has_problem(f.problems({"--data.bucket_reso_steps=60"}), "not a multiple of 8"));
  EXPECT_TRUE(has_problem(f.problems({"--data.resolution=1004"}), "not a multiple of 8"));
  EXPECT_TRUE(f.problems({"--data.enable_bucket=false", "--data.resolution=4096"}).empty());
  EXPECT_TRUE(has_problem(f.problems({"--sample.every_n_steps=10"}), "sample.prompts is empty"));
  EXPECT_TRUE(has_problem(f.problems({"--optimizer.lr_warmup_steps=2000"}), "larger than training.max_train_steps"));
  EXPECT_TRUE(has_problem(f.problems({"--data.caption_extension=txt"}), "must start with a dot"));
  EXPECT_TRUE(has_problem(f.problems({"--output.name=a/b"}), "without '/'"));

  CommandLine none;  // nothing given: both required keys are reported
  try {
    load_config(none);
    ADD_FAILURE() << "no error without model.path and data.path";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(has_problem(e.problems(), "model.path: required"));
    EXPECT_TRUE(has_problem(e.problems(), "data.path: required"));
  }
  const std::string file = f.dir.file("broken.json");
  flame_train_test::write_text(file, "{\"data\": ");
  EXPECT_TRUE(has_problem(f.problems({"--config", file}), "not valid JSON"));
  EXPECT_TRUE(has_problem(f.problems({"--config", f.dir.file("absent.json")}), "cannot open the file"));
}

TEST(TrainerConfig, CommandLineErrors) {
  auto parse = [](std::vector<std::string> args) -> std::vector<std::string> {
    args.insert(args.begin(), "flame-train");
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    try {
      parse_command_line(static_cast<int>(argv.size()), argv.data());
      return {};
    } catch (const ConfigError& e) {
      return e.problems();
    }
  };
  EXPECT_TRUE(has_problem(parse({"--dryrun"}), "unknown option '--dryrun' (did you mean '--dry-run'?)"));
  EXPECT_TRUE(has_problem(parse({"stray"}), "unexpected argument 'stray'"));
  EXPECT_TRUE(has_problem(parse({"--config"}), "--config needs a file name"));
  EXPECT_TRUE(has_problem(parse({"--data.resolution"}), "--data.resolution needs a value"));
  EXPECT_TRUE(parse({"--help"}).empty());
}

TEST(TrainerConfig, HelpListsEveryKeyWithItsDefault) {
  const std::string help = help_text();
  const std::vector<std::string> keys = config_key_names();
  EXPECT_GE(keys.size(), 40u);
  for (const auto& k : keys) EXPECT_NE(help.find("--" + k + " ("), std::string::npos) << k;
  EXPECT_NE(help.find("--data.resolution (integer, default 1024)"), std::string::npos);
  EXPECT_NE(help.find("--model.path (string, required)"), std::string::npos);
  EXPECT_NE(help.find("one of adamw, lion"), std::string::npos);
  EXPECT_NE(help.find("0.99 for lion"), std::string::npos);  // optimizer.beta2 depends on optimizer.type
  for (const char* group : {"[model]", "[data]", "[network]", "[optimizer]", "[training]", "[sample]", "[output]"})
    EXPECT_NE(help.find(group), std::string::npos) << group;
}

TEST(TrainerConfig, DidYouMean) {
  EXPECT_EQ(did_you_mean("resolutoin", {"resolution", "repeats"}), "resolution");
  EXPECT_EQ(did_you_mean("completely_different", {"resolution", "repeats"}), "");
}

// Lion: accepted; beta2 0.99 unless set (in the file or on the command line), AdamW's 0.999 stays;
// the rate and weight decay are the user's; the optimizer options carry the kind and the values.
TEST(TrainerConfig, LionOptimizerAndItsDefaults) {
  Fixture f;
  TrainConfig c = load_config(f.parse({"--optimizer.type=lion"}));
  EXPECT_EQ(c.optimizer.type, "lion");
  EXPECT_EQ(c.optimizer.beta1, 0.9);
  EXPECT_EQ(c.optimizer.beta2, 0.99);
  EXPECT_EQ(c.optimizer.learning_rate, 1e-4);  // not scaled for Lion: the user's
  EXPECT_EQ(c.optimizer.weight_decay, 0.01);
  EXPECT_EQ(load_config(f.parse({})).optimizer.beta2, 0.999);
  EXPECT_EQ(load_config(f.parse({"--optimizer.type=lion", "--optimizer.beta2=0.98"})).optimizer.beta2, 0.98);
  EXPECT_EQ(load_config(f.parse({"--optimizer.type=adamw", "--optimizer.beta2=0.99"})).optimizer.beta2, 0.99);
  // A beta2 of 0.999 set explicitly stays 0.999 with Lion; from the file as from the command line.
  const std::string file = f.dir.file("lion.json");
  flame_train_test::write_text(file, R"({"optimizer": {"type": "lion", "beta2": 0.999, "weight_decay": 0.1}})");
  c = load_config(f.parse({"--config", file}));
  EXPECT_EQ(c.optimizer.beta2, 0.999);
  EXPECT_EQ(c.optimizer.weight_decay, 0.1);
  flame_train_test::write_text(file, R"({"optimizer": {"type": "lion"}})");
  EXPECT_EQ(load_config(f.parse({"--config", file})).optimizer.beta2, 0.99);
  EXPECT_EQ(load_config(f.parse({"--config", file, "--optimizer.type=adamw"})).optimizer.beta2, 0.999);

  flame_optimizer_options_t o = adapter_optimizer_options(load_config(
      f.parse({"--optimizer.type=lion", "--optimizer.learning_rate=3e-5", "--optimizer.weight_decay=0.2"})));
  EXPECT_EQ(o.kind, FLAME_OPTIMIZER_LION);
  EXPECT_EQ(o.lr, 3e-5);
  EXPECT_EQ(o.beta1, 0.9);
  EXPECT_EQ(o.beta2, 0.99);
  EXPECT_EQ(o.weight_decay, 0.2);
  o = adapter_optimizer_options(load_config(f.parse({})));
  EXPECT_EQ(o.kind, FLAME_OPTIMIZER_ADAMW);
  EXPECT_EQ(o.beta2, 0.999);
  EXPECT_THROW(optimizer_kind("sgd"), std::invalid_argument);

  // The memory estimate counts Lion's single moment.
  EXPECT_EQ(nlohmann::json::parse(memory_estimate_request(c)).at("optimizer"), "lion");
}

// adamw8bit and lion8bit: the same kinds with 8-bit moments; lion8bit takes Lion's beta2; the
// memory estimate is asked for the 8-bit optimizer by name.
TEST(TrainerConfig, EightBitOptimizers) {
  Fixture f;
  TrainConfig c = load_config(f.parse({"--optimizer.type=lion8bit"}));
  EXPECT_EQ(c.optimizer.beta2, 0.99);
  EXPECT_EQ(adapter_optimizer_options(c).kind, FLAME_OPTIMIZER_LION);
  EXPECT_EQ(optimizer_state_bits(c.optimizer.type), 8);
  EXPECT_EQ(nlohmann::json::parse(memory_estimate_request(c)).at("optimizer"), "lion8bit");
  c = load_config(f.parse({"--optimizer.type=adamw8bit"}));
  EXPECT_EQ(c.optimizer.beta2, 0.999);
  EXPECT_EQ(adapter_optimizer_options(c).kind, FLAME_OPTIMIZER_ADAMW);
  EXPECT_EQ(optimizer_state_bits(c.optimizer.type), 8);
  EXPECT_EQ(optimizer_state_bits("adamw"), 32);
  EXPECT_EQ(optimizer_state_bits("lion"), 32);
  EXPECT_TRUE(has_problem(f.problems({"--optimizer.type=AdamW8bit"}), "\"AdamW8bit\" is not one of"));
}

TEST(TrainerConfig, LionBadValues) {
  Fixture f;
  EXPECT_TRUE(has_problem(f.problems({"--optimizer.type=Lion"}), "\"Lion\" is not one of adamw, lion, adamw8bit, lion8bit"));
  EXPECT_TRUE(has_problem(f.problems({"--optimizer.type=lion", "--optimizer.beta1=1"}),
                          "optimizer.beta1: 1 is out of range (it must be below 1)"));
  EXPECT_TRUE(has_problem(f.problems({"--optimizer.type=lion", "--optimizer.beta2=1"}),
                          "optimizer.beta2: 1 is out of range (it must be below 1)"));
  EXPECT_TRUE(has_problem(f.problems({"--optimizer.type=lion", "--optimizer.beta2=1.5"}), "out of range [0, 1]"));
  EXPECT_TRUE(has_problem(f.problems({"--optimizer.type=lion", "--optimizer.weight_decay=-0.1"}), "out of range [0, 1]"));
  EXPECT_TRUE(has_problem(f.problems({"--optimizer.type=lion", "--optimizer.learning_rate=0"}), "out of range (0, 1]"));
  EXPECT_TRUE(has_problem(f.problems({"--optimizer.beta2=1"}), "optimizer.beta2: 1 is out of range"));  // AdamW too
}

// --gpus N is training.gpus; the help says that the global batch is batch_size x gpus.
TEST(TrainerConfig, GpusOptionAndGlobalBatch) {
  Fixture f;
  EXPECT_EQ(load_config(f.parse({})).training.gpus, 1);
  EXPECT_EQ(load_config(f.parse({"--gpus", "2"})).training.gpus, 2);
  EXPECT_EQ(load_config(f.parse({"--gpus=4"})).training.gpus, 4);
  EXPECT_EQ(load_config(f.parse({"--training.gpus=3"})).training.gpus, 3);
  EXPECT_TRUE(has_problem(f.problems({"--gpus=0"}), "training.gpus: 0 is out of range [1, 64]"));
  EXPECT_TRUE(has_problem(f.problems({"--gpus=two"}), "--training.gpus: 'two' is not an integer"));
  EXPECT_THROW(flame_train_test::command_line({"--gpus"}), ConfigError);
  // The global batch is bounded by the per-sample random streams' key (batch_noise.h).
  EXPECT_TRUE(f.problems({"--training.batch_size=1024", "--gpus=64"}).empty());
  EXPECT_TRUE(has_problem(f.problems({"--training.batch_size=1025", "--gpus=64"}),
                          "training.batch_size x training.gpus (1025 x 64) is larger than the largest global batch, 65536"));
  const std::string help = help_text();
  EXPECT_NE(help.find("--gpus N"), std::string::npos);
  EXPECT_NE(help.find("global batch is batch_size x training.gpus"), std::string::npos);
}

TEST(TrainerConfig, DemoDefaultsAndOverrides) {
  CommandLine cmd;
  cmd.demo = true;
  cmd.overrides = {{"training.max_train_steps", "7"}, {"training.timestep_sampling", "logit_normal"},
                   {"output.dir", "/tmp"}};
  const TrainConfig c = load_config(cmd);
  EXPECT_EQ(c.model.path, "demo:flux");
  EXPECT_EQ(c.data.path, "");
  EXPECT_EQ(c.training.max_train_steps, 7);  // the override wins over the demo's 60
  EXPECT_EQ(c.training.batch_size, 4);
  EXPECT_EQ(c.training.timestep_sampling, "logit_normal");
  EXPECT_EQ(c.optimizer.beta2, 0.999);
  EXPECT_EQ(c.optimizer.learning_rate, 2e-2);
  // The SDXL demo runs at its own rate; a rate given on the command line still wins.
  CommandLine sdxl = cmd;
  sdxl.overrides.push_back({"model.path", "demo:sdxl"});
  EXPECT_EQ(load_config(sdxl).model.path, "demo:sdxl");
  EXPECT_EQ(load_config(sdxl).optimizer.learning_rate, 5e-3);
  sdxl.overrides.push_back({"optimizer.learning_rate", "1e-3"});
  EXPECT_EQ(load_config(sdxl).optimizer.learning_rate, 1e-3);
  // Lion's demo rate is a quarter of AdamW's; beta2 its 0.99.
  CommandLine lion = cmd;
  lion.overrides.push_back({"optimizer.type", "lion"});
  EXPECT_EQ(load_config(lion).optimizer.learning_rate, 5e-3);
  EXPECT_EQ(load_config(lion).optimizer.beta2, 0.99);
  lion.overrides.push_back({"model.path", "demo:sdxl"});
  EXPECT_EQ(load_config(lion).optimizer.learning_rate, 1.25e-3);
  CommandLine bad = cmd;
  bad.overrides.push_back({"training.prediction_type", "sample"});
  try {
    load_config(bad);
    ADD_FAILURE() << "prediction_type 'sample' accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(e.problems().front().find("training.prediction_type"), std::string::npos) << e.problems().front();
  }
}

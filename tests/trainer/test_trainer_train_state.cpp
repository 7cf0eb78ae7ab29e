// flame-train: the resumable state on the host (train_state.h) and the EMA's decay schedule (ema.h):
// the new keys (output.save_state_every_n_steps, training.resume / --resume, training.ema_decay,
// training.ema_warmup) and their errors; state.json written by state_document and read back by
// read_train_state; every refusal (missing folder or file, invalid or truncated JSON, another
// format or version, other settings named key by key, nothing left to train); the log truncation.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config.h"
#include "ema.h"
#include "trainer_test_support.h"
#include "train_state.h"

using namespace flame_train;
using flame_train_test::has_problem;
using flame_train_test::TempDir;
using flame_train_test::write_text;

namespace {

CommandLine demo_command(std::vector<std::string> extra) {
  extra.insert(extra.begin(), "--demo");
  return flame_train_test::command_line(extra);
}

std::vector<std::string> problems_of(std::vector<std::string> extra) {
  extra.insert(extra.begin(), "--demo");
  return flame_train_test::config_problems(extra);
}

// The error message read_train_state throws, or "" when it accepts the folder.
std::string refusal(const std::string& path, const TrainConfig& config, bool demo = true) {
  try {
    read_train_state(path, config, demo);
    return "";
  } catch (const std::runtime_error& e) {
    return e.what();
  }
}

// A demo configuration writing into dir, and a complete state folder of step 3 for it.
struct StateFixture {
  TempDir dir;
  TrainConfig config;
  TrainState state;
  std::string folder;

  explicit StateFixture(std::vector<std::string> extra = {}) {
    extra.push_back("--output.dir=" + dir.file("out"));
    config = load_config(demo_command(extra));
    state.step = 3;
    state.epoch = 2;
    state.next_batch = 1;
    state.rng_seed = 42;
    state.rng_offset = 123456789012345ull;
    folder = state_folder(config, state.step);
    write_json(state_document(state, config, true));
    write_text(folder + "/" + kStateAdapterFile, "tensors");
    write_text(folder + "/" + kStateOptimizerFile, "tensors");
    if (config.training.ema_decay > 0) write_text(folder + "/" + kStateEmaFile, "tensors");
  }
  void write_json(const nlohmann::json& doc) const { write_text(folder + "/" + kStateJsonFile, doc.dump(2)); }
  nlohmann::json document() const { return state_document(state, config, true); }
};

}  // namespace

TEST(TrainerStateConfig, NewKeysDefaultsAndOverrides) {
  TrainConfig c = load_config(demo_command({}));
  EXPECT_EQ(c.output.save_state_every_n_steps, 0);
  EXPECT_EQ(c.training.ema_decay, 0.0);
  EXPECT_FALSE(c.training.ema_warmup);
  EXPECT_EQ(c.training.resume, "");
  TempDir dir;
  c = load_config(demo_command({"--output.save_state_every_n_steps=5", "--training.ema_decay=0.999",
                                "--training.ema_warmup=true", "--resume", dir.path()}));
  EXPECT_EQ(c.output.save_state_every_n_steps, 5);
  EXPECT_DOUBLE_EQ(c.training.ema_decay, 0.999);
  EXPECT_TRUE(c.training.ema_warmup);
  EXPECT_EQ(c.training.resume, dir.path());
  c = load_config(demo_command({"--resume=" + dir.path()}));
  EXPECT_EQ(c.training.resume, dir.path());
  c = load_config(demo_command({"--training.resume=" + dir.path()}));
  EXPECT_EQ(c.training.resume, dir.path());
}

TEST(TrainerStateConfig, BadValuesAreErrors) {
  EXPECT_TRUE(has_problem(problems_of({"--training.ema_decay=1"}), "training.ema_decay: 1.0 is out of range [0, 0.999999]"));
  EXPECT_TRUE(has_problem(problems_of({"--training.ema_decay=-0.5"}), "training.ema_decay"));
  EXPECT_TRUE(has_problem(problems_of({"--training.ema_decay=high"}), "--training.ema_decay: 'high' is not a number"));
  EXPECT_TRUE(has_problem(problems_of({"--training.ema_warmup=maybe"}), "training.ema_warmup"));
  EXPECT_TRUE(has_problem(problems_of({"--output.save_state_every_n_steps=-1"}), "output.save_state_every_n_steps"));
  EXPECT_TRUE(has_problem(problems_of({"--output.save_state_every_n_steps=2.5"}), "output.save_state_every_n_steps"));
  EXPECT_TRUE(has_problem(problems_of({"--resume=/nonexistent/state"}), "training.resume: /nonexistent/state does not exist"));
  TempDir dir;
  write_text(dir.file("file"), "x");
  EXPECT_TRUE(has_problem(problems_of({"--resume", dir.file("file")}), "is not a folder"));
  EXPECT_TRUE(has_problem(problems_of({"--training.ema_dekay=0.9"}), "did you mean 'training.ema_decay'"));
  try {
    demo_command({"--resume"});
    ADD_FAILURE() << "--resume without a value was accepted";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(has_problem(e.problems(), "--resume needs a state folder"));
  }
}

TEST(TrainerStateConfig, HelpListsTheKeys) {
  const std::string help = help_text();
  for (const char* key : {"--output.save_state_every_n_steps", "--training.resume", "--training.ema_decay",
                          "--training.ema_warmup", "--resume PATH"})
    EXPECT_NE(help.find(key), std::string::npos) << key;
}

TEST(TrainerState, FolderName) {
  TrainConfig c = load_config(demo_command({"--output.dir=/tmp/x", "--output.name=mine"}));
  EXPECT_EQ(state_folder(c, 30), "/tmp/x/mine-state-step000030");
  EXPECT_EQ(state_folder(c, 1234567), "/tmp/x/mine-state-step1234567");
}

TEST(TrainerState, StateJsonRoundTrip) {
  StateFixture f({"--training.ema_decay=0.99"});
  const TrainState s = read_train_state(f.folder, f.config, true);
  EXPECT_EQ(s.step, 3);
  EXPECT_EQ(s.epoch, 2u);
  EXPECT_EQ(s.next_batch, 1u);
  EXPECT_EQ(s.rng_seed, 42u);
  EXPECT_EQ(s.rng_offset, 123456789012345ull);
  // A run resumed for more steps, and output / sample settings that changed, are fine (constant rate).
  TrainConfig longer = f.config;
  longer.training.max_train_steps = 1000;
  longer.output.save_every_n_steps = 7;
  longer.sample.every_n_steps = 3;
  longer.training.resume = f.folder;
  EXPECT_EQ(refusal(f.folder, longer), "");
}

TEST(TrainerState, RefusesAMissingFolderOrFile) {
  StateFixture f;
  EXPECT_NE(refusal(f.dir.file("nothing"), f.config).find("not a state folder"), std::string::npos);
  std::filesystem::remove(f.folder + "/" + kStateOptimizerFile);
  EXPECT_NE(refusal(f.folder, f.config).find("optimizer.safetensors is missing"), std::string::npos);
  std::filesystem::remove(f.folder + "/" + kStateJsonFile);
  EXPECT_NE(refusal(f.folder, f.config).find("state.json is missing"), std::string::npos);
}

TEST(TrainerState, RefusesAMissingEmaWhenTheEmaIsOn) {
  StateFixture f({"--training.ema_decay=0.9"});
  EXPECT_EQ(refusal(f.folder, f.config), "");
  std::filesystem::remove(f.folder + "/" + kStateEmaFile);
  EXPECT_NE(refusal(f.folder, f.config).find("ema.safetensors is missing"), std::string::npos);
}

TEST(TrainerState, RefusesATruncatedOrInvalidStateJson) {
  StateFixture f;
  const std::string text = f.document().dump(2);
  write_text(f.folder + "/" + kStateJsonFile, text.substr(0, text.size() / 2));
  EXPECT_NE(refusal(f.folder, f.config).find("state.json is not valid JSON"), std::string::npos);
  write_text(f.folder + "/" + kStateJsonFile, "");
  EXPECT_NE(refusal(f.folder, f.config).find("state.json is not valid JSON"), std::string::npos);
  write_text(f.folder + "/" + kStateJsonFile, "[1, 2]");
  EXPECT_NE(refusal(f.folder, f.config).find("state.json is not valid JSON"), std::string::npos);
}

TEST(TrainerState, RefusesAnotherFormatOrVersion) {
  StateFixture f;
  nlohmann::json doc = f.document();
  doc["format"] = "kohya-state";
  f.write_json(doc);
  EXPECT_NE(refusal(f.folder, f.config).find("not a flame-train state (format 'kohya-state')"), std::string::npos);
  doc = f.document();
  doc["version"] = 2;
  f.write_json(doc);
  EXPECT_NE(refusal(f.folder, f.config).find("state version 2 is not supported"), std::string::npos);
}

TEST(TrainerState, RefusesMissingOrBadFields) {
  StateFixture f;
  for (const char* field : {"step", "epoch", "next_batch", "rng", "config"}) {
    nlohmann::json doc = f.document();
    doc.erase(field);
    f.write_json(doc);
    EXPECT_NE(refusal(f.folder, f.config).find(std::string("'") + field + "'"), std::string::npos) << field;
  }
  nlohmann::json doc = f.document();
  doc["step"] = -4;
  f.write_json(doc);
  EXPECT_NE(refusal(f.folder, f.config).find("'step' is missing or not a non-negative integer"), std::string::npos);
  doc = f.document();
  doc["rng"].erase("offset");
  f.write_json(doc);
  EXPECT_NE(refusal(f.folder, f.config).find("'offset'"), std::string::npos);
  doc = f.document();
  doc["step"] = 0;
  f.write_json(doc);
  EXPECT_NE(refusal(f.folder, f.config).find("not those of a saved step"), std::string::npos);
}

TEST(TrainerState, RefusesOtherSettingsNamingEach) {
  StateFixture f;
  TrainConfig other = f.config;
  other.network.dim = 8;
  other.optimizer.learning_rate = 0.5;
  const std::string msg = refusal(f.folder, other);
  EXPECT_NE(msg.find("saved with other settings"), std::string::npos) << msg;
  EXPECT_NE(msg.find("network.dim: 16 -> 8"), std::string::npos) << msg;
  EXPECT_NE(msg.find("optimizer.learning_rate: 0.02 -> 0.5"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("training.seed"), std::string::npos) << msg;

  TrainConfig ema = f.config;
  ema.training.ema_decay = 0.9;
  EXPECT_NE(refusal(f.folder, ema).find("training.ema_decay: 0.0 -> 0.9"), std::string::npos) << refusal(f.folder, ema);
  EXPECT_NE(refusal(f.folder, f.config, false).find("demo: true -> false"), std::string::npos);
  // The cosine schedule's rates depend on max_train_steps: then it is part of the settings.
  TrainConfig cosine = f.config;
  cosine.optimizer.lr_scheduler = "cosine";
  EXPECT_NE(refusal(f.folder, cosine).find("training.max_train_steps: (not saved) -> 60"), std::string::npos)
      << refusal(f.folder, cosine);
  // A setting the state holds that this configuration lacks.
  nlohmann::json doc = f.document();
  doc["config"]["network.rank_dropout"] = 0.1;
  f.write_json(doc);
  EXPECT_NE(refusal(f.folder, f.config).find("network.rank_dropout: 0.1 -> (not a setting now)"), std::string::npos);
}

TEST(TrainerState, RefusesAStateWithNothingLeftToTrain) {
  StateFixture f;
  TrainConfig done = f.config;
  done.training.max_train_steps = 3;
  EXPECT_NE(refusal(f.folder, done).find("not below training.max_train_steps (3)"), std::string::npos);
}

TEST(TrainerState, TruncatesTheLogAfterTheStep) {
  TempDir dir;
  const std::string log = dir.file("run.jsonl");
  write_text(log, "{\"step\": 1, \"loss\": 0.5}\n{\"step\": 2, \"loss\": 0.4}\n{\"step\": 3, \"loss\": 0.3}\n"
                  "{\"step\": 4, \"lo");
  truncate_log_after(log, 2);
  std::ifstream in(log);
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "{\"step\": 1, \"loss\": 0.5}\n{\"step\": 2, \"loss\": 0.4}\n");
  EXPECT_NO_THROW(truncate_log_after(dir.file("missing.jsonl"), 2));
}

TEST(TrainerEma, DecayScheduleAsDiffusersEmaModel) {
  // diffusers' EMAModel.get_decay: step = optimization_step - 1; 0 at step 0; then
  // min(decay, (1 + step) / (10 + step)), or with use_ema_warmup 1 - (1 + step)^(-2/3).
  EXPECT_EQ(ema_decay_at(0.999, false, 1), 0.0);
  EXPECT_EQ(ema_decay_at(0.999, true, 1), 0.0);
  EXPECT_DOUBLE_EQ(ema_decay_at(0.999, false, 2), 2.0 / 11.0);
  EXPECT_DOUBLE_EQ(ema_decay_at(0.999, false, 11), 11.0 / 20.0);
  EXPECT_DOUBLE_EQ(ema_decay_at(0.999, true, 2), 1.0 - std::pow(2.0, -2.0 / 3.0));
  EXPECT_DOUBLE_EQ(ema_decay_at(0.999, true, 100), 1.0 - std::pow(100.0, -2.0 / 3.0));
  EXPECT_DOUBLE_EQ(ema_decay_at(0.5, false, 1000), 0.5);  // capped at training.ema_decay
  EXPECT_DOUBLE_EQ(ema_decay_at(0.9, true, 100000), 0.9);
  double previous = 0;
  for (int64_t k = 1; k < 5000; k += 7) {
    const double d = ema_decay_at(0.9999, false, k);
    EXPECT_GE(d, previous) << k;
    EXPECT_LE(d, 0.9999);
    previous = d;
  }
}

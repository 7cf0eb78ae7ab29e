// flame-train's configuration: one table of keys (config.cpp, kConfigKeys) drives the JSON file,
// the command-line overrides, --help and the validation, so that the four can never disagree.
//
//   flame-train [--config FILE.json] [--group.key=value | --group.key value]... [--dry-run] [--demo]
//               [--resume PATH] [--gpus N] [--help]
//
// The file is JSON with kohya-like keys grouped as model / data / network / optimizer / training /
// sample / output, e.g. {"data": {"path": "img", "resolution": 1024}, "training": {"batch_size": 2}}.
// Overrides on the command line win over the file, the file over the defaults. Every problem (an
// unknown key, with the nearest known key as "did you mean"; a wrong type; a value out of range; a
// missing path; inconsistent values) is collected, and load_config throws one ConfigError that lists
// them all, before anything touches a GPU.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "buckets.h"
#include "captions.h"

namespace flame_train {

// The largest global batch (training.batch_size x training.gpus): the per-sample random streams
// (batch_noise.h) key a sample by micro-step x kMaxGlobalBatch + its position, so a larger batch
// would give two samples one stream. A configuration past it is refused.
constexpr int64_t kMaxGlobalBatch = 65536;

class ConfigError : public std::runtime_error {
 public:
  explicit ConfigError(const std::vector<std::string>& problems);
  const std::vector<std::string>& problems() const { return problems_; }

 private:
  std::vector<std::string> problems_;
};

struct TrainConfig {
  struct Model {
    std::string path;  // checkpoint file or diffusers folder
    std::string arch;  // auto | flux | sdxl | sd3
    // The caching stage's sources (conditioning_sources.h); empty: model.path's subfolder.
    std::string vae, text_encoder, text_encoder_2, text_encoder_3, tokenizer_dir;
    std::string quantize = "none";        // none | f8_e4m3: the frozen base in fp8
    std::string quantize_scale = "tensor";  // tensor | row
    double offload_budget_gib = 0;        // > 0: frozen blocks beyond this budget in host memory
  } model;
  struct Data {
    std::string path;
    std::string cache_file;  // latents and text embeddings (training_data.h); empty: none
    std::string caption_extension;
    int repeats = 1;  // for folders without the N_name prefix
    BucketOptions buckets;
    CaptionOptions captions;
    bool flip_aug = false;
    bool random_crop = false;
  } data;
  struct Network {
    int dim = 16;
    double alpha = 16.0;
    double dropout = 0.0;
    std::vector<std::string> targets;  // empty: the architecture's usual targets
  } network;
  struct Optimizer {
    std::string type;
    double learning_rate = 1e-4;
    double beta1 = 0.9, beta2 = 0.999;
    double weight_decay = 0.01;
    double max_grad_norm = 1.0;
    std::string lr_scheduler;
    int64_t lr_warmup_steps = 0;
  } optimizer;
  struct Training {
    uint64_t seed = 42;
    int batch_size = 1;
    int64_t max_train_steps = 1000;
    int gradient_accumulation_steps = 1;
    std::string mixed_precision;
    bool gradient_checkpointing = false;
    bool cuda_graphs = true;  // step_graphs.h, where the step allows it (graphs_blocker)
    bool ignore_memory_estimate = false;  // train even when the memory estimate exceeds the free memory
    int gpus = 1;
    int device = 0;
    // Objectives (objectives.h).
    std::string timestep_sampling;  // flow matching: uniform | logit_normal | sigmoid | mode
    double logit_mean = 0.0, logit_std = 1.0, mode_scale = 1.29;
    double flow_shift = 0.0;        // 0: Flux's resolution-dependent shift, SD3's 3.0; > 0: fixed
    std::string weighting_scheme;   // flow matching: none | sigma_sqrt | cosmap
    double guidance_scale = 3.5;    // Flux-dev's guidance input
    std::string prediction_type;    // SDXL: epsilon | v_prediction
    double min_snr_gamma = 0.0;     // SDXL: 0 off
    double noise_offset = 0.0;
    // EMA of the adapter (ema.h): 0 off.
    double ema_decay = 0.0;
    bool ema_warmup = false;
    std::string resume;  // a state folder (train_state.h); empty: a fresh start
  } training;
  struct Sample {
    int64_t every_n_steps = 0;
    std::vector<std::string> prompts;
    int steps = 20;
    double guidance_scale = 3.5;
    uint64_t seed = 0;           // prompt k's noise: seed + k, the same every round
    int64_t width = 0, height = 0;  // pixels; 0: the first training sample's size
    std::string sampler;         // SDXL: euler | ddim
  } sample;
  struct Output {
    std::string dir;
    std::string name;
    int64_t save_every_n_steps = 0;
    int64_t save_state_every_n_steps = 0;  // the resumable state (train_state.h); 0: never
    std::string format;  // kohya | peft
  } output;
};

// What the command line asked for, before the configuration is assembled.
struct CommandLine {
  std::string config_file;  // empty: none
  std::vector<std::pair<std::string, std::string>> overrides;  // (group.key, text) in order
  bool help = false;
  bool dry_run = false;
  // --demo: no files needed; model.path defaults to "demo:flux" (a tiny random-init model: also
  // demo:sdxl, demo:sd3), the data are random latents and embeddings, and the run is short.
  bool demo = false;
};

// Parses argv. Throws ConfigError for an argument that is not an option, an option without a
// value, or an unknown --flag (unknown --group.key overrides are reported by load_config).
CommandLine parse_command_line(int argc, const char* const* argv);

// Defaults, then the file, then the overrides; validated. Throws ConfigError.
TrainConfig load_config(const CommandLine& cmd);

// The --help text: usage, then every key with its type, default and allowed values.
std::string help_text();

// Every key as "group.key" (for tests and the help).
std::vector<std::string> config_key_names();

// The nearest of candidates to word by edit distance, or "" when none is close enough.
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace flame_train

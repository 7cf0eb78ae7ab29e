// The key table, file and override parsing, validation and --help (see config.h).
#include "config.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

namespace flame_train {
namespace {

using nlohmann::json;

enum class KeyType { Bool, Int, Float, String, StringList };
// What a string key must name on disk.
enum class PathRule { None, Exists, Directory, CreatableDirectory };

struct KeyDef {
  const char* name;  // group.key
  KeyType type;
  json default_value;  // null: required, no default
  const char* help;
  double min = 0, max = 0;  // numbers: inclusive range (when min < max)
  bool min_exclusive = false;
  std::vector<std::string> choices = {};  // strings: the allowed values (empty: any)
  PathRule path = PathRule::None;
};

constexpr double kMaxSeed = 9e18;  // below 2^63, exactly representable
constexpr double kLionBeta2 = 0.99;  // optimizer.beta2's default for Lion

const std::vector<KeyDef>& key_table() {
  static const std::vector<KeyDef> keys = {
      {"model.path", KeyType::String, nullptr,
       "base model: a checkpoint file or a diffusers folder (required), or demo:flux / demo:sdxl / demo:sd3 "
       "(a tiny random-init model)", 0, 0,
       false, {}, PathRule::Exists},
      {"model.arch", KeyType::String, "auto", "model family; auto reads it from the checkpoint", 0, 0, false,
       {"auto", "flux", "sdxl", "sd3"}},
      {"model.vae", KeyType::String, "",
       "caching stage: the VAE (file or diffusers folder); default: model.path's vae subfolder (required for a "
       "single-file model.path; may name model.path itself when it bundles the VAE)"},
      {"model.text_encoder", KeyType::String, "",
       "caching stage: CLIP-L (file or folder); default: model.path's text_encoder subfolder (required for a "
       "single file)"},
      {"model.text_encoder_2", KeyType::String, "",
       "caching stage: T5-XXL (Flux) or CLIP-G (SDXL, SD3); default: model.path's text_encoder_2 subfolder "
       "(required for a single file)"},
      {"model.text_encoder_3", KeyType::String, "",
       "caching stage, SD3: T5-XXL; default: model.path's text_encoder_3 subfolder (required for a single file)"},
      {"model.tokenizer_dir", KeyType::String, "",
       "caching stage: folder with diffusers' tokenizer, tokenizer_2 (, tokenizer_3) subfolders; default: "
       "model.path when it is a diffusers folder"},
      {"model.quantize", KeyType::String, "none",
       "frozen base in fp8: f8_e4m3 quantises every linear weight on the GPU while loading (about half the "
       "memory; the LoRA trains in bf16 beside it); none keeps bf16", 0, 0, false, {"none", "f8_e4m3"}},
      {"model.quantize_scale", KeyType::String, "tensor", "fp8 scale: one per weight tensor, or one per row", 0, 0,
       false, {"tensor", "row"}},
      {"model.offload_budget_gib", KeyType::Float, 0.0,
       "GiB of GPU memory for the base's weights: frozen blocks beyond it stay in pinned host memory and stream "
       "in ahead of use (0: everything on the GPU; not with model.quantize)", 0, 1e6},
      {"data.path", KeyType::String, nullptr,
       "folder of images (png, jpg, jpeg, webp) with same-name caption files; subfolders named N_name "
       "are repeated N times (required)", 0, 0, false, {}, PathRule::Directory},
      {"data.cache_file", KeyType::String, "",
       "latent cache (safetensors of latents and text embeddings; format in training_data.h): trains from it "
       "instead of data.path"},
      {"data.caption_extension", KeyType::String, ".txt", "extension of the caption files"},
      {"data.repeats", KeyType::Int, 1, "repeats of the images outside N_name folders", 1, 10000},
      {"data.resolution", KeyType::Int, 1024, "training resolution: buckets hold at most resolution^2 pixels", 64,
       8192},
      {"data.enable_bucket", KeyType::Bool, true, "aspect-ratio buckets (false: every image cropped square)"},
      {"data.min_bucket_reso", KeyType::Int, 256, "smallest bucket side", 64, 8192},
      {"data.max_bucket_reso", KeyType::Int, 2048, "largest bucket side", 64, 16384},
      {"data.bucket_reso_steps", KeyType::Int, 64, "bucket sides are multiples of this (a multiple of 8)", 8, 1024},
      {"data.caption_dropout_rate", KeyType::Float, 0.0, "probability of training on an empty caption", 0, 1},
      {"data.caption_tag_dropout_rate", KeyType::Float, 0.0, "probability of dropping each non-fixed tag", 0, 1},
      {"data.shuffle_caption", KeyType::Bool, false, "shuffle the comma-separated tags of each caption"},
      {"data.keep_tokens", KeyType::Int, 0, "leading tags that stay in place when shuffling", 0, 1000},
      {"data.caption_separator", KeyType::String, ",", "tag separator in captions"},
      {"data.flip_aug", KeyType::Bool, false, "mirror images left-right at random"},
      {"data.random_crop", KeyType::Bool, false, "crop at a random offset instead of the centre"},
      {"network.dim", KeyType::Int, 16, "LoRA rank", 1, 1024},
      {"network.alpha", KeyType::Float, 16.0, "LoRA alpha (scale = alpha / dim)", 0, 1e6, true},
      {"network.dropout", KeyType::Float, 0.0, "dropout on the LoRA path", 0, 0.999},
      {"network.targets", KeyType::StringList, json::array(),
       "module names the adapter targets (empty: the architecture's usual ones)"},
      {"optimizer.type", KeyType::String, "adamw",
       "adamw, or lion (Chen et al. 2023: the sign of an interpolated momentum, one moment per weight instead of "
       "two; usually wants a 3-10x smaller optimizer.learning_rate than AdamW, which flame-train does not apply "
       "for you); adamw8bit, lion8bit: the same with blockwise 8-bit moments (as bitsandbytes' AdamW8bit, "
       "Lion8bit), a quarter of the optimizer memory", 0, 0, false, {"adamw", "lion", "adamw8bit", "lion8bit"}},
      {"optimizer.learning_rate", KeyType::Float, 1e-4, "peak learning rate", 0, 1, true},
      {"optimizer.beta1", KeyType::Float, 0.9,
       "AdamW: first-moment decay; Lion: the interpolation of momentum and gradient whose sign is the update "
       "(below 1)", 0, 1},
      {"optimizer.beta2", KeyType::Float, 0.999,
       "AdamW: second-moment decay; Lion: the momentum's decay (below 1; when not set, 0.99 for lion, the "
       "default shown for adamw)", 0, 1},
      {"optimizer.weight_decay", KeyType::Float, 0.01,
       "decoupled weight decay for both (p *= 1 - lr * weight_decay before the update, as AdamW, the Lion paper "
       "and lion-pytorch)", 0, 1},
      {"optimizer.max_grad_norm", KeyType::Float, 1.0, "gradient clipping norm (0: off)", 0, 1e6},
      {"optimizer.lr_scheduler", KeyType::String, "constant", "schedule after the warm-up", 0, 0, false,
       {"constant", "constant_with_warmup", "cosine"}},
      {"optimizer.lr_warmup_steps", KeyType::Int, 0, "linear warm-up steps", 0, 1e9},
      {"training.seed", KeyType::Int, 42, "seed of every random choice (data order, augmentation, noise)", 0, kMaxSeed},
      {"training.batch_size", KeyType::Int, 1,
       "images per batch and GPU: the global batch is batch_size x training.gpus (as kohya / accelerate)", 1, 4096},
      {"training.max_train_steps", KeyType::Int, 1000, "optimizer steps", 1, 1e9},
      {"training.gradient_accumulation_steps", KeyType::Int, 1, "batches per optimizer step", 1, 4096},
      {"training.mixed_precision", KeyType::String, "bf16", "compute precision", 0, 0, false, {"bf16", "fp16", "fp32"}},
      {"training.gradient_checkpointing", KeyType::Bool, false, "recompute activations in backward"},
      {"training.cuda_graphs", KeyType::Bool, true,
       "replay each batch shape's step as a CUDA graph (eager with network.dropout > 0 or model.offload_budget_gib)"},
      {"training.ignore_memory_estimate", KeyType::Bool, false,
       "train even when the memory estimate exceeds the device's free memory"},
      {"training.gpus", KeyType::Int, 1,
       "GPUs trained data parallel in this process (also --gpus N; more than 1 needs NCCL): GPUs training.device "
       "and on, each training batch_size images of every global batch of batch_size x gpus, gradients averaged "
       "before clipping and the step; rank 0 writes the files, the log and the samples", 1, 64},
      {"training.device", KeyType::Int, 0, "first CUDA device ordinal", 0, 63},
      {"training.timestep_sampling", KeyType::String, "sigmoid", "flow matching (Flux, SD3): noise-level density", 0, 0,
       false, {"sigmoid", "logit_normal", "uniform", "mode"}},
      {"training.logit_mean", KeyType::Float, 0.0, "logit_normal: mean", -10, 10},
      {"training.logit_std", KeyType::Float, 1.0, "logit_normal: std; sigmoid: scale", 0, 100, true},
      {"training.mode_scale", KeyType::Float, 1.29, "mode: scale", -10, 10},
      {"training.flow_shift", KeyType::Float, 0.0,
       "flow matching: 0 = Flux's resolution-dependent shift or SD3's 3.0; > 0 a fixed shift", 0, 100},
      {"training.weighting_scheme", KeyType::String, "none", "flow matching: loss weighting", 0, 0, false,
       {"none", "sigma_sqrt", "cosmap"}},
      {"training.guidance_scale", KeyType::Float, 3.5,
       "Flux-dev: the guidance input while training (diffusers' train_dreambooth_lora_flux.py default)", 0, 100},
      {"training.prediction_type", KeyType::String, "epsilon", "SDXL: the model's target", 0, 0, false,
       {"epsilon", "v_prediction"}},
      {"training.min_snr_gamma", KeyType::Float, 0.0, "SDXL: min-SNR-gamma loss weighting (0: off)", 0, 1000},
      {"training.noise_offset", KeyType::Float, 0.0, "noise offset (per-channel noise added to the noise)", 0, 10},
      {"training.ema_decay", KeyType::Float, 0.0,
       "EMA of the adapter (0: off): also writes <output.name>-ema.safetensors beside each LoRA file", 0, 0.999999},
      {"training.ema_warmup", KeyType::Bool, false,
       "EMA decay min(ema_decay, 1 - (1 + s)^(-2/3)) instead of min(ema_decay, (1 + s) / (10 + s))"},
      {"training.resume", KeyType::String, "",
       "a state folder (<output.dir>/<output.name>-state-stepNNNNNN) to continue from, with the same settings "
       "(also --resume PATH)"},
      {"sample.every_n_steps", KeyType::Int, 0, "write sample images every N steps (0: never)", 0, 1e9},
      {"sample.prompts", KeyType::StringList, json::array(), "prompts of the sample images"},
      {"sample.steps", KeyType::Int, 20, "sampler steps", 1, 1000},
      {"sample.guidance_scale", KeyType::Float, 3.5, "guidance (Flux) or CFG scale (SDXL, SD3)", 0, 100},
      {"sample.seed", KeyType::Int, 0, "noise seed of the sample images (prompt k: seed + k)", 0, kMaxSeed},
      {"sample.width", KeyType::Int, 0, "sample width in pixels (0: the first training image's bucket)", 0, 16384},
      {"sample.height", KeyType::Int, 0, "sample height in pixels (0: the first training image's bucket)", 0, 16384},
      {"sample.sampler", KeyType::String, "euler", "SDXL sampler (Flux and SD3 use the flow-matching Euler sampler)",
       0, 0, false, {"euler", "ddim"}},
      {"output.dir", KeyType::String, "output", "folder for LoRA files, samples and state (created)", 0, 0, false, {},
       PathRule::CreatableDirectory},
      {"output.name", KeyType::String, "lora", "base name of the LoRA files"},
      {"output.save_every_n_steps", KeyType::Int, 0, "save the LoRA every N steps (0: only at the end)", 0, 1e9},
      {"output.save_state_every_n_steps", KeyType::Int, 0,
       "save the resumable state (adapter, optimizer, EMA, generator, data order, step) every N steps and at the end "
       "(0: never)", 0, 1e9},
      {"output.format", KeyType::String, "kohya", "LoRA file layout", 0, 0, false, {"kohya", "peft"}},
  };
  return keys;
}

const KeyDef* find_key(const std::string& name) {
  for (const auto& k : key_table())
    if (name == k.name) return &k;
  return nullptr;
}

std::vector<std::string> group_names() {
  std::vector<std::string> groups;
  for (const auto& k : key_table()) {
    std::string g = std::string(k.name).substr(0, std::string(k.name).find('.'));
    if (std::find(groups.begin(), groups.end(), g) == groups.end()) groups.push_back(g);
  }
  return groups;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// "unknown key 'data.resoluton' (did you mean 'data.resolution'?)"; a known key name under another
// group is suggested too ("data.learning_rate" -> "optimizer.learning_rate").
std::string unknown_key_message(const std::string& where, const std::string& name) {
  std::string msg = where + "unknown key '" + name + "'";
  std::string suggestion = did_you_mean(name, config_key_names());
  if (suggestion.empty()) {  // the same key name under exactly one other group
    const std::string leaf = name.substr(name.find('.') == std::string::npos ? 0 : name.find('.') + 1);
    int matches = 0;
    for (const auto& k : key_table()) {
      const std::string full = k.name;
      if (full.substr(full.find('.') + 1) == leaf) {
        suggestion = full;
        ++matches;
      }
    }
    if (matches != 1) suggestion.clear();
  }
  if (!suggestion.empty()) msg += " (did you mean '" + suggestion + "'?)";
  return msg;
}

std::string type_name(KeyType t) {
  switch (t) {
    case KeyType::Bool: return "boolean";
    case KeyType::Int: return "integer";
    case KeyType::Float: return "number";
    case KeyType::String: return "string";
    case KeyType::StringList: return "list of strings";
  }
  return "value";
}

std::string format_number(double v) {
  std::ostringstream s;
  s.precision(10);
  s << v;
  return s.str();
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

// Checks a JSON value against the key's type, range and choices; returns "" or the problem.
std::string check_value(const KeyDef& k, const json& v) {
  const std::string name = k.name;
  switch (k.type) {
    case KeyType::Bool:
      if (!v.is_boolean()) return name + ": expected true or false, got " + v.dump();
      return "";
    case KeyType::Int:
      if (!v.is_number_integer()) return name + ": expected an integer, got " + v.dump();
      break;
    case KeyType::Float:
      if (!v.is_number()) return name + ": expected a number, got " + v.dump();
      break;
    case KeyType::String:
      if (!v.is_string()) return name + ": expected a string, got " + v.dump();
      if (!k.choices.empty() &&
          std::find(k.choices.begin(), k.choices.end(), v.get<std::string>()) == k.choices.end())
        return name + ": " + v.dump() + " is not one of " + join(k.choices, ", ");
      return "";
    case KeyType::StringList:
      if (!v.is_array()) return name + ": expected a list of strings, got " + v.dump();
      for (const auto& e : v)
        if (!e.is_string()) return name + ": expected a list of strings, got the element " + e.dump();
      return "";
  }
  const double d = v.get<double>();
  if (k.min < k.max) {
    const bool below = k.min_exclusive ? !(d > k.min) : !(d >= k.min);
    if (below || !(d <= k.max) || !std::isfinite(d))
      return name + ": " + v.dump() + " is out of range " + (k.min_exclusive ? "(" : "[") + format_number(k.min) +
             ", " + format_number(k.max) + "]";
  }
  return "";
}

// Parses a command-line text as the key's type (a JSON value of that type), or returns false.
bool parse_override(const KeyDef& k, const std::string& text, json* out) {
  switch (k.type) {
    case KeyType::Bool:
      if (text == "true" || text == "1" || text == "yes" || text == "on") { *out = true; return true; }
      if (text == "false" || text == "0" || text == "no" || text == "off") { *out = false; return true; }
      return false;
    case KeyType::Int: {
      if (text.empty()) return false;
      errno = 0;
      char* end = nullptr;
      long long v = std::strtoll(text.c_str(), &end, 10);
      if (errno != 0 || *end != '\0') return false;
      *out = v;
      return true;
    }
    case KeyType::Float: {
      if (text.empty()) return false;
      errno = 0;
      char* end = nullptr;
      double v = std::strtod(text.c_str(), &end);
      if (errno != 0 || *end != '\0' || !std::isfinite(v)) return false;
      *out = v;
      return true;
    }
    case KeyType::String: *out = text; return true;
    case KeyType::StringList:
      // A JSON list, or one string (a single prompt).
      if (!text.empty() && text[0] == '[') {
        json parsed = json::parse(text, nullptr, false);
        if (parsed.is_discarded()) return false;
        *out = parsed;
        return true;
      }
      *out = json::array({text});
      return true;
  }
  return false;
}

using Values = std::map<std::string, json>;

void apply_file(const std::string& path, Values& values, std::vector<std::string>& problems) {
  std::ifstream in(path);
  if (!in) {
    problems.push_back("--config " + path + ": cannot open the file");
    return;
  }
  json doc;
  try {
    doc = json::parse(in);
  } catch (const json::parse_error& e) {
    problems.push_back(path + ": not valid JSON: " + e.what());
    return;
  }
  if (!doc.is_object()) {
    problems.push_back(path + ": the top level must be an object of groups (" + join(group_names(), ", ") + ")");
    return;
  }
  const std::vector<std::string> groups = group_names();
  for (auto g = doc.begin(); g != doc.end(); ++g) {
    if (std::find(groups.begin(), groups.end(), g.key()) == groups.end()) {
      std::string msg = path + ": unknown group '" + g.key() + "'";
      std::string s = did_you_mean(g.key(), groups);
      if (!s.empty()) msg += " (did you mean '" + s + "'?)";
      else if (find_key(g.key()) == nullptr) msg += " (groups: " + join(groups, ", ") + ")";
      problems.push_back(msg);
      continue;
    }
    if (!g.value().is_object()) {
      problems.push_back(path + ": group '" + g.key() + "' must be an object, got " + g.value().dump());
      continue;
    }
    for (auto kv = g.value().begin(); kv != g.value().end(); ++kv) {
      const std::string name = g.key() + "." + kv.key();
      const KeyDef* k = find_key(name);
      if (!k) {
        problems.push_back(unknown_key_message(path + ": ", name));
        continue;
      }
      std::string problem = check_value(*k, kv.value());
      if (!problem.empty()) problems.push_back(path + ": " + problem);
      else values[name] = kv.value();
    }
  }
}

void apply_overrides(const CommandLine& cmd, Values& values, std::vector<std::string>& problems) {
  for (const auto& [name, text] : cmd.overrides) {
    const KeyDef* k = find_key(name);
    if (!k) {
      problems.push_back(unknown_key_message("--", name));
      continue;
    }
    json v;
    if (!parse_override(*k, text, &v)) {
      const std::string type = type_name(k->type);
      problems.push_back("--" + name + ": '" + text + "' is not " + (type == "integer" ? "an " : "a ") + type);
      continue;
    }
    std::string problem = check_value(*k, v);
    if (!problem.empty()) problems.push_back("--" + problem);
    else values[name] = v;
  }
}

bool is_directory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string parent_directory(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  size_t slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : p.substr(0, slash);
}

// images_not_needed: an empty data.path is fine (--demo, or a run from data.cache_file).
void check_paths(const Values& values, bool images_not_needed, std::vector<std::string>& problems) {
  for (const auto& k : key_table()) {
    auto it = values.find(k.name);
    if (k.path == PathRule::None || it == values.end()) continue;
    const std::string p = it->second.get<std::string>();
    const std::string name = k.name;
    if (name == "model.path" && p.rfind("demo:", 0) == 0) continue;  // a built-in tiny model
    if (name == "data.path" && p.empty() && images_not_needed) continue;
    if (p.empty()) {
      problems.push_back(name + ": the path is empty");
    } else if (k.path == PathRule::Exists && !exists(p)) {
      problems.push_back(name + ": " + p + " does not exist");
    } else if (k.path == PathRule::Directory && !is_directory(p)) {
      problems.push_back(name + ": " + p + (exists(p) ? " is not a folder" : " does not exist"));
    } else if (k.path == PathRule::CreatableDirectory) {
      if (exists(p) && !is_directory(p)) problems.push_back(name + ": " + p + " exists and is not a folder");
      else if (!exists(p) && !is_directory(parent_directory(p)))
        problems.push_back(name + ": cannot create " + p + ": its parent folder " + parent_directory(p) +
                           " does not exist");
    }
  }
}

TrainConfig to_config(const Values& v) {
  auto s = [&](const char* k) { return v.at(k).get<std::string>(); };
  auto i = [&](const char* k) { return v.at(k).get<int64_t>(); };
  auto f = [&](const char* k) { return v.at(k).get<double>(); };
  auto b = [&](const char* k) { return v.at(k).get<bool>(); };
  TrainConfig c;
  c.model.path = s("model.path");
  c.model.arch = s("model.arch");
  c.model.vae = s("model.vae");
  c.model.text_encoder = s("model.text_encoder");
  c.model.text_encoder_2 = s("model.text_encoder_2");
  c.model.text_encoder_3 = s("model.text_encoder_3");
  c.model.tokenizer_dir = s("model.tokenizer_dir");
  c.model.quantize = s("model.quantize");
  c.model.quantize_scale = s("model.quantize_scale");
  c.model.offload_budget_gib = f("model.offload_budget_gib");
  c.data.path = s("data.path");
  c.data.cache_file = s("data.cache_file");
  c.data.caption_extension = s("data.caption_extension");
  c.data.repeats = static_cast<int>(i("data.repeats"));
  c.data.buckets.enabled = b("data.enable_bucket");
  c.data.buckets.resolution = static_cast<int>(i("data.resolution"));
  c.data.buckets.min_side = static_cast<int>(i("data.min_bucket_reso"));
  c.data.buckets.max_side = static_cast<int>(i("data.max_bucket_reso"));
  c.data.buckets.step = static_cast<int>(i("data.bucket_reso_steps"));
  c.data.captions.dropout_rate = f("data.caption_dropout_rate");
  c.data.captions.tag_dropout_rate = f("data.caption_tag_dropout_rate");
  c.data.captions.shuffle = b("data.shuffle_caption");
  c.data.captions.keep_tokens = static_cast<int>(i("data.keep_tokens"));
  c.data.captions.separator = s("data.caption_separator");
  c.data.flip_aug = b("data.flip_aug");
  c.data.random_crop = b("data.random_crop");
  c.network.dim = static_cast<int>(i("network.dim"));
  c.network.alpha = f("network.alpha");
  c.network.dropout = f("network.dropout");
  c.network.targets = v.at("network.targets").get<std::vector<std::string>>();
  c.optimizer.type = s("optimizer.type");
  c.optimizer.learning_rate = f("optimizer.learning_rate");
  c.optimizer.beta1 = f("optimizer.beta1");
  c.optimizer.beta2 = f("optimizer.beta2");
  c.optimizer.weight_decay = f("optimizer.weight_decay");
  c.optimizer.max_grad_norm = f("optimizer.max_grad_norm");
  c.optimizer.lr_scheduler = s("optimizer.lr_scheduler");
  c.optimizer.lr_warmup_steps = i("optimizer.lr_warmup_steps");
  c.training.seed = static_cast<uint64_t>(i("training.seed"));
  c.training.batch_size = static_cast<int>(i("training.batch_size"));
  c.training.max_train_steps = i("training.max_train_steps");
  c.training.gradient_accumulation_steps = static_cast<int>(i("training.gradient_accumulation_steps"));
  c.training.mixed_precision = s("training.mixed_precision");
  c.training.gradient_checkpointing = b("training.gradient_checkpointing");
  c.training.cuda_graphs = b("training.cuda_graphs");
  c.training.ignore_memory_estimate = b("training.ignore_memory_estimate");
  c.training.gpus = static_cast<int>(i("training.gpus"));
  c.training.device = static_cast<int>(i("training.device"));
  c.training.timestep_sampling = s("training.timestep_sampling");
  c.training.logit_mean = f("training.logit_mean");
  c.training.logit_std = f("training.logit_std");
  c.training.mode_scale = f("training.mode_scale");
  c.training.flow_shift = f("training.flow_shift");
  c.training.weighting_scheme = s("training.weighting_scheme");
  c.training.guidance_scale = f("training.guidance_scale");
  c.training.prediction_type = s("training.prediction_type");
  c.training.min_snr_gamma = f("training.min_snr_gamma");
  c.training.noise_offset = f("training.noise_offset");
  c.training.ema_decay = f("training.ema_decay");
  c.training.ema_warmup = b("training.ema_warmup");
  c.training.resume = s("training.resume");
  c.sample.every_n_steps = i("sample.every_n_steps");
  c.sample.prompts = v.at("sample.prompts").get<std::vector<std::string>>();
  c.sample.steps = static_cast<int>(i("sample.steps"));
  c.sample.guidance_scale = f("sample.guidance_scale");
  c.sample.seed = static_cast<uint64_t>(i("sample.seed"));
  c.sample.width = i("sample.width");
  c.sample.height = i("sample.height");
  c.sample.sampler = s("sample.sampler");
  c.output.dir = s("output.dir");
  c.output.name = s("output.name");
  c.output.save_every_n_steps = i("output.save_every_n_steps");
  c.output.save_state_every_n_steps = i("output.save_state_every_n_steps");
  c.output.format = s("output.format");
  return c;
}

// Rules between keys (each key is already valid on its own).
void check_consistency(const TrainConfig& c, std::vector<std::string>& problems) {
  const BucketOptions& b = c.data.buckets;
  if (b.step % 8 != 0)
    problems.push_back("data.bucket_reso_steps: " + std::to_string(b.step) + " is not a multiple of 8 (the VAE's factor)");
  if (b.resolution % 8 != 0)
    problems.push_back("data.resolution: " + std::to_string(b.resolution) + " is not a multiple of 8");
  if (b.enabled) {
    if (b.min_side > b.max_side)
      problems.push_back("data.min_bucket_reso (" + std::to_string(b.min_side) + ") is larger than data.max_bucket_reso (" +
                         std::to_string(b.max_side) + ")");
    if (b.resolution < b.min_side || b.resolution > b.max_side)
      problems.push_back("data.resolution (" + std::to_string(b.resolution) + ") must lie between data.min_bucket_reso (" +
                         std::to_string(b.min_side) + ") and data.max_bucket_reso (" + std::to_string(b.max_side) + ")");
    if (b.min_side % b.step != 0 || b.max_side % b.step != 0)
      problems.push_back("data.min_bucket_reso (" + std::to_string(b.min_side) + ") and data.max_bucket_reso (" +
                         std::to_string(b.max_side) + ") must be multiples of data.bucket_reso_steps (" +
                         std::to_string(b.step) + ")");
  }
  // The key table's ranges include 1; the optimizers (flame_optimizer_create) take betas in [0, 1).
  if (c.optimizer.beta1 >= 1) problems.push_back("optimizer.beta1: 1 is out of range (it must be below 1)");
  if (c.optimizer.beta2 >= 1) problems.push_back("optimizer.beta2: 1 is out of range (it must be below 1)");
  if (c.model.quantize != "none" && c.model.offload_budget_gib > 0)
    problems.push_back("model.quantize and model.offload_budget_gib: the library does not combine an fp8 base with "
                       "offload yet; choose one");
  if (c.data.caption_extension.empty() || c.data.caption_extension[0] != '.')
    problems.push_back("data.caption_extension: '" + c.data.caption_extension + "' must start with a dot (e.g. .txt)");
  if (!c.data.cache_file.empty() && !exists(c.data.cache_file))
    problems.push_back("data.cache_file: " + c.data.cache_file + " does not exist");
  if (c.data.captions.separator.empty()) problems.push_back("data.caption_separator: must not be empty");
  if (c.output.name.empty() || c.output.name.find('/') != std::string::npos)
    problems.push_back("output.name: '" + c.output.name + "' must be a non-empty file name without '/'");
  if (static_cast<int64_t>(c.training.batch_size) * c.training.gpus > kMaxGlobalBatch)
    problems.push_back("training.batch_size x training.gpus (" + std::to_string(c.training.batch_size) + " x " +
                       std::to_string(c.training.gpus) + ") is larger than the largest global batch, " +
                       std::to_string(kMaxGlobalBatch));
  if (c.optimizer.lr_warmup_steps > c.training.max_train_steps)
    problems.push_back("optimizer.lr_warmup_steps (" + std::to_string(c.optimizer.lr_warmup_steps) +
                       ") is larger than training.max_train_steps (" + std::to_string(c.training.max_train_steps) + ")");
  if (!c.training.resume.empty() && !is_directory(c.training.resume))
    problems.push_back("training.resume: " + c.training.resume +
                       (exists(c.training.resume) ? " is not a folder" : " does not exist") +
                       " (expected a state folder <output.dir>/<output.name>-state-stepNNNNNN)");
  if (c.sample.every_n_steps > 0 && c.sample.prompts.empty())
    problems.push_back("sample.every_n_steps is " + std::to_string(c.sample.every_n_steps) +
                       " but sample.prompts is empty: give at least one prompt");
  if ((c.sample.width == 0) != (c.sample.height == 0))
    problems.push_back("sample.width and sample.height: set both (pixels) or neither (the first training image's size)");
  if (c.sample.width % 8 != 0 || c.sample.height % 8 != 0)
    problems.push_back("sample.width x sample.height (" + std::to_string(c.sample.width) + "x" +
                       std::to_string(c.sample.height) + ") must be multiples of 8 (the VAE's factor)");
}

}  // namespace

ConfigError::ConfigError(const std::vector<std::string>& problems)
    : std::runtime_error(problems.empty() ? std::string("configuration error") : problems.front()),
      problems_(problems) {}

std::vector<std::string> config_key_names() {
  std::vector<std::string> names;
  for (const auto& k : key_table()) names.push_back(k.name);
  return names;
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  const size_t limit = std::max<size_t>(2, word.size() / 4);
  return best_distance <= limit ? best : "";
}

CommandLine parse_command_line(int argc, const char* const* argv) {
  CommandLine cmd;
  std::vector<std::string> problems;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      cmd.help = true;
    } else if (arg == "--dry-run") {
      cmd.dry_run = true;
    } else if (arg == "--demo") {
      cmd.demo = true;
    } else if (arg == "--resume" || arg.rfind("--resume=", 0) == 0) {  // training.resume
      if (arg != "--resume") cmd.overrides.emplace_back("training.resume", arg.substr(9));
      else if (i + 1 < argc) cmd.overrides.emplace_back("training.resume", argv[++i]);
      else problems.push_back("--resume needs a state folder (--resume PATH)");
    } else if (arg == "--gpus" || arg.rfind("--gpus=", 0) == 0) {  // training.gpus
      if (arg != "--gpus") cmd.overrides.emplace_back("training.gpus", arg.substr(7));
      else if (i + 1 < argc) cmd.overrides.emplace_back("training.gpus", argv[++i]);
      else problems.push_back("--gpus needs a number of GPUs (--gpus N)");
    } else if (arg == "--config" || arg.rfind("--config=", 0) == 0) {
      if (arg == "--config") {
        if (i + 1 >= argc) problems.push_back("--config needs a file name");
        else cmd.config_file = argv[++i];
      } else {
        cmd.config_file = arg.substr(9);
      }
    } else if (arg.rfind("--", 0) == 0 && arg.find('.') != std::string::npos) {
      const size_t eq = arg.find('=');
      std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
      if (eq != std::string::npos) {
        cmd.overrides.emplace_back(name, arg.substr(eq + 1));
      } else if (i + 1 < argc) {
        cmd.overrides.emplace_back(name, argv[++i]);
      } else {
        problems.push_back("--" + name + " needs a value (--" + name + "=VALUE)");
      }
    } else if (arg.rfind("--", 0) == 0) {
      std::string msg = "unknown option '" + arg + "'";
      std::string s = did_you_mean(arg, {"--help", "--dry-run", "--demo", "--config", "--resume", "--gpus"});
      if (!s.empty()) msg += " (did you mean '" + s + "'?)";
      else msg += " (options: --config FILE, --dry-run, --demo, --resume PATH, --gpus N, --help, --group.key=value)";
      problems.push_back(msg);
    } else {
      problems.push_back("unexpected argument '" + arg + "' (settings are --group.key=value, the file is --config FILE)");
    }
  }
  if (!problems.empty()) throw ConfigError(problems);
  return cmd;
}

// The --demo settings, taken before the file and the overrides (which still win): the tiny model of
// demo_path (demo:flux unless the file or the overrides name another), random data (no data.path), a
// short run at a rate that overfits them. SDXL's tiny UNet takes 5e-3: at 2e-2 its bf16 gradients
// overflowed after about 30 steps on the H200 (loss NaN from step 33), at 5e-3 and 1e-3 none did.
// With optimizer.type lion (named in the file or the overrides) the rate is 4x smaller: Lion's
// update is +-lr on every element, where AdamW's shrinks once the gradients stop agreeing.
void apply_demo_defaults(Values& values, const std::string& demo_path, bool lion) {
  values["model.path"] = demo_path;
  values["training.max_train_steps"] = 60;
  values["training.batch_size"] = 4;
  const double adamw_rate = demo_path == "demo:sdxl" ? 5e-3 : 2e-2;
  values["optimizer.learning_rate"] = lion ? adamw_rate / 4 : adamw_rate;
  values["network.dim"] = 16;
  values["network.alpha"] = 16.0;
  values["output.name"] = "demo_lora";
}

// optimizer.beta2 when neither the file nor the overrides set it: the optimizer's own default, 0.99
// for Lion (as FLAME_OPTIMIZER_LION, the Lion paper and lion-pytorch), the key table's 0.999 for AdamW.
void apply_optimizer_defaults(Values& values) {
  if (values.count("optimizer.beta2")) return;
  const auto type = values.find("optimizer.type");
  const bool lion = type != values.end() && type->second.is_string() &&
                    type->second.get<std::string>().compare(0, 4, "lion") == 0;  // lion, lion8bit
  values["optimizer.beta2"] = lion ? json(kLionBeta2) : find_key("optimizer.beta2")->default_value;
}

TrainConfig load_config(const CommandLine& cmd) {
  Values values;
  for (const auto& k : key_table())
    if (!k.default_value.is_null()) values[k.name] = k.default_value;
  values.erase("optimizer.beta2");  // its default depends on optimizer.type: apply_optimizer_defaults
  std::vector<std::string> problems;
  if (cmd.demo) {
    // The demo's defaults depend on the model the file or the overrides name: look first.
    Values named = values;
    std::vector<std::string> ignored;
    if (!cmd.config_file.empty()) apply_file(cmd.config_file, named, ignored);
    apply_overrides(cmd, named, ignored);
    const auto path = named.find("model.path");
    const bool demo_named = path != named.end() && path->second.is_string() &&
                            path->second.get<std::string>().rfind("demo:", 0) == 0;
    const auto type = named.find("optimizer.type");
    const bool lion = type != named.end() && type->second.is_string() &&
                      type->second.get<std::string>().compare(0, 4, "lion") == 0;  // lion, lion8bit
    apply_demo_defaults(values, demo_named ? path->second.get<std::string>() : "demo:flux", lion);
  }
  if (!cmd.config_file.empty()) apply_file(cmd.config_file, values, problems);
  apply_overrides(cmd, values, problems);
  apply_optimizer_defaults(values);
  // The images are not read by a demo run or a run from a latent cache.
  const bool images_not_needed = cmd.demo || (values.count("data.cache_file") && !values["data.cache_file"].get<std::string>().empty());
  if (images_not_needed && values.find("data.path") == values.end()) values["data.path"] = "";
  for (const auto& k : key_table())
    if (values.find(k.name) == values.end())
      problems.push_back(std::string(k.name) + ": required (set it in the file or with --" + k.name + "=...)");
  if (!problems.empty()) throw ConfigError(problems);  // the rest needs every value
  check_paths(values, images_not_needed, problems);
  TrainConfig config = to_config(values);
  check_consistency(config, problems);
  if (!problems.empty()) throw ConfigError(problems);
  return config;
}

std::string help_text() {
  std::ostringstream out;
  out << "Usage: flame-train [--config FILE.json] [--group.key=value]... [--dry-run] [--demo] [--resume PATH] [--gpus N]\n"
         "                   [--help]\n"
         "\n"
         "Trains a LoRA for Flux, SDXL or SD3 with FLAME. Settings come from the defaults, then the JSON\n"
         "file ({\"group\": {\"key\": value}}), then --group.key=value (or --group.key value) overrides.\n"
         "\n"
         "  --config FILE   JSON configuration file\n"
         "  --dry-run       check the configuration and the data, print the bucket plan, and exit\n"
         "  --demo          train on random data, by default a tiny random-init Flux (model.path demo:flux;\n"
         "                  also demo:sdxl, demo:sd3) for 60 steps: needs a GPU, no files\n"
         "  --resume PATH   continue from a state folder (training.resume; written by\n"
         "                  output.save_state_every_n_steps) with the same settings, bit for bit\n"
         "  --gpus N        data parallel on N GPUs of this machine (training.gpus): the global batch is\n"
         "                  training.batch_size x N, each GPU trains its part, gradients are averaged\n"
         "  --help          this text\n"
         "\n"
         "Exit status: 0 done, 1 a configuration, data or training error, 2 no GPU (or no driver).\n";
  std::string group;
  for (const auto& k : key_table()) {
    const std::string name = k.name;
    const std::string g = name.substr(0, name.find('.'));
    if (g != group) {
      out << "\n[" << g << "]\n";
      group = g;
    }
    std::string def = k.default_value.is_null() ? "required" : "default " + k.default_value.dump();
    out << "  --" << name << " (" << type_name(k.type) << ", " << def << ")\n      " << k.help;
    if (!k.choices.empty()) out << "; one of " << join(k.choices, ", ");
    if (k.min < k.max && (k.type == KeyType::Int || k.type == KeyType::Float))
      out << "; range " << (k.min_exclusive ? "(" : "[") << format_number(k.min) << ", " << format_number(k.max) << "]";
    out << "\n";
  }
  return out.str();
}

}  // namespace flame_train

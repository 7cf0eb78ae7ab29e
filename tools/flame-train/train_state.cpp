// The resumable state (see train_state.h): the fingerprint, state.json, and the folder's tensors.
#include "train_state.h"

#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <vector>

#include "ema.h"
#include "flame_handles.h"

namespace flame_train {
namespace {

using nlohmann::json;

constexpr const char* kFormat = "flame-train-state";
constexpr int kVersion = 1;

bool is_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool is_folder(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The differences between two fingerprints as "key: saved -> now".
std::vector<std::string> differences(const json& saved, const json& now) {
  std::vector<std::string> out;
  for (auto it = now.begin(); it != now.end(); ++it) {
    const auto s = saved.find(it.key());
    if (s == saved.end()) out.push_back(it.key() + ": (not saved) -> " + it.value().dump());
    else if (*s != it.value()) out.push_back(it.key() + ": " + s->dump() + " -> " + it.value().dump());
  }
  for (auto it = saved.begin(); it != saved.end(); ++it)
    if (!now.contains(it.key())) out.push_back(it.key() + ": " + it.value().dump() + " -> (not a setting now)");
  return out;
}

uint64_t read_u64(const json& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number_unsigned())
    throw std::runtime_error(where + ": '" + key + "' is missing or not a non-negative integer");
  return it->get<uint64_t>();
}

}  // namespace

json config_fingerprint(const TrainConfig& c, bool demo) {
  json f = {{"demo", demo},
            {"model.path", c.model.path},
            {"model.arch", c.model.arch},
            {"model.quantize", c.model.quantize},
            {"model.quantize_scale", c.model.quantize_scale},
            {"data.path", c.data.path},
            {"data.cache_file", c.data.cache_file},
            {"network.dim", c.network.dim},
            {"network.alpha", c.network.alpha},
            {"network.dropout", c.network.dropout},
            {"network.targets", c.network.targets},
            {"optimizer.type", c.optimizer.type},
            {"optimizer.learning_rate", c.optimizer.learning_rate},
            {"optimizer.beta1", c.optimizer.beta1},
            {"optimizer.beta2", c.optimizer.beta2},
            {"optimizer.weight_decay", c.optimizer.weight_decay},
            {"optimizer.max_grad_norm", c.optimizer.max_grad_norm},
            {"optimizer.lr_scheduler", c.optimizer.lr_scheduler},
            {"optimizer.lr_warmup_steps", c.optimizer.lr_warmup_steps},
            {"training.seed", c.training.seed},
            {"training.batch_size", c.training.batch_size},
            {"training.gradient_accumulation_steps", c.training.gradient_accumulation_steps},
            {"training.mixed_precision", c.training.mixed_precision},
            {"training.gpus", c.training.gpus},
            {"training.timestep_sampling", c.training.timestep_sampling},
            {"training.logit_mean", c.training.logit_mean},
            {"training.logit_std", c.training.logit_std},
            {"training.mode_scale", c.training.mode_scale},
            {"training.flow_shift", c.training.flow_shift},
            {"training.weighting_scheme", c.training.weighting_scheme},
            {"training.guidance_scale", c.training.guidance_scale},
            {"training.prediction_type", c.training.prediction_type},
            {"training.min_snr_gamma", c.training.min_snr_gamma},
            {"training.noise_offset", c.training.noise_offset},
            {"training.ema_decay", c.training.ema_decay},
            {"training.ema_warmup", c.training.ema_warmup}};
  if (c.optimizer.lr_scheduler == "cosine") f["training.max_train_steps"] = c.training.max_train_steps;
  return f;
}

json state_document(const TrainState& state, const TrainConfig& config, bool demo) {
  return {{"format", kFormat},
          {"version", kVersion},
          {"step", state.step},
          {"epoch", state.epoch},
          {"next_batch", state.next_batch},
          {"rng", {{"seed", state.rng_seed}, {"offset", state.rng_offset}}},
          {"config", config_fingerprint(config, demo)}};
}

std::string state_folder(const TrainConfig& c, int64_t step) {
  char suffix[64];
  std::snprintf(suffix, sizeof suffix, "-state-step%06lld", static_cast<long long>(step));
  return c.output.dir + "/" + c.output.name + suffix;
}

TrainState read_train_state(const std::string& path, const TrainConfig& config, bool demo) {
  const std::string where = "training.resume " + path;
  if (!is_folder(path))
    throw std::runtime_error(where + ": not a state folder (expected <output.dir>/<output.name>-state-stepNNNNNN/)");
  const std::string json_path = path + "/" + kStateJsonFile;
  std::ifstream in(json_path);
  if (!in) throw std::runtime_error(where + ": " + kStateJsonFile + " is missing (an incomplete or foreign folder)");
  json doc = json::parse(in, nullptr, false);
  if (doc.is_discarded() || !doc.is_object())
    throw std::runtime_error(where + ": " + kStateJsonFile + " is not valid JSON (the file is corrupt)");
  if (doc.value("format", "") != kFormat)
    throw std::runtime_error(where + ": " + kStateJsonFile + " is not a flame-train state (format '" +
                             doc.value("format", "") + "')");
  if (doc.value("version", -1) != kVersion)
    throw std::runtime_error(where + ": state version " + doc.value("version", json(nullptr)).dump() +
                             " is not supported (this flame-train reads version " + std::to_string(kVersion) + ")");
  TrainState s;
  s.step = static_cast<int64_t>(read_u64(doc, "step", where));
  s.epoch = read_u64(doc, "epoch", where);
  s.next_batch = read_u64(doc, "next_batch", where);
  const auto rng = doc.find("rng");
  if (rng == doc.end() || !rng->is_object()) throw std::runtime_error(where + ": 'rng' is missing");
  s.rng_seed = read_u64(*rng, "seed", where);
  s.rng_offset = read_u64(*rng, "offset", where);
  const auto saved = doc.find("config");
  if (saved == doc.end() || !saved->is_object()) throw std::runtime_error(where + ": 'config' is missing");
  const std::vector<std::string> diff = differences(*saved, config_fingerprint(config, demo));
  if (!diff.empty()) {
    std::string msg = where + ": the state was saved with other settings (saved -> now):";
    for (const auto& d : diff) msg += "\n    " + d;
    throw std::runtime_error(msg);
  }
  if (s.step < 1 || s.epoch < 1)
    throw std::runtime_error(where + ": step " + std::to_string(s.step) + " / epoch " + std::to_string(s.epoch) +
                             " are not those of a saved step");
  if (s.step >= config.training.max_train_steps)
    throw std::runtime_error(where + ": the state is at step " + std::to_string(s.step) +
                             ", not below training.max_train_steps (" + std::to_string(config.training.max_train_steps) +
                             "): nothing to train");
  std::vector<std::string> files = {kStateAdapterFile, kStateOptimizerFile};
  if (config.training.ema_decay > 0) files.push_back(kStateEmaFile);
  for (const auto& f : files)
    if (!is_file(path + "/" + f)) throw std::runtime_error(where + ": " + f + " is missing");
  return s;
}

std::string save_train_state(const StateHandles& h, const TrainConfig& config, bool demo, TrainState state) {
  check(flame_ctx_get_rng_state(h.ctx, &state.rng_seed, &state.rng_offset), "flame_ctx_get_rng_state");
  const std::string final_path = state_folder(config, state.step);
  const std::string tmp = final_path + ".tmp";
  std::error_code ec;
  std::filesystem::remove_all(tmp, ec);
  if (!std::filesystem::create_directory(tmp, ec)) throw std::runtime_error("cannot create " + tmp + ": " + ec.message());
  check(flame_params_save_safetensors(h.adapter, (tmp + "/" + kStateAdapterFile).c_str(), nullptr, 0),
        "flame_params_save_safetensors (adapter)");
  check(flame_optimizer_save_state(h.optimizer, (tmp + "/" + kStateOptimizerFile).c_str()), "flame_optimizer_save_state");
  if (h.ema) {
    Params shadow = h.ema->as_params();
    check(flame_params_save_safetensors(shadow.get(), (tmp + "/" + kStateEmaFile).c_str(), nullptr, 0),
          "flame_params_save_safetensors (EMA)");
  }
  const json doc = state_document(state, config, demo);
  {
    std::ofstream out(tmp + "/" + kStateJsonFile, std::ios::trunc);
    out << doc.dump(2) << "\n";
    if (!out.flush()) throw std::runtime_error("cannot write " + tmp + "/" + kStateJsonFile);
  }
  std::filesystem::remove_all(final_path, ec);
  std::filesystem::rename(tmp, final_path, ec);
  if (ec) throw std::runtime_error("cannot rename " + tmp + " to " + final_path + ": " + ec.message());
  return final_path;
}

void load_train_state(const StateHandles& h, const std::string& path, const TrainState& state) {
  check(flame_params_load_safetensors(h.adapter, (path + "/" + kStateAdapterFile).c_str(), 0),
        "flame_params_load_safetensors (the state's adapter)");
  check(flame_optimizer_load_state(h.optimizer, (path + "/" + kStateOptimizerFile).c_str()),
        "flame_optimizer_load_state");
  if (h.ema) {
    Params shadow = h.ema->as_params();
    check(flame_params_load_safetensors(shadow.get(), (path + "/" + kStateEmaFile).c_str(), 0),
          "flame_params_load_safetensors (the state's EMA)");
  }
  check(flame_ctx_set_rng_state(h.ctx, state.rng_seed, state.rng_offset), "flame_ctx_set_rng_state");
}

void truncate_log_after(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return;
  std::vector<std::string> kept;
  std::string line;
  while (std::getline(in, line)) {
    const json j = json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
    if (j["step"].get<int64_t>() <= step) kept.push_back(line);
  }
  in.close();
  std::ofstream out(path, std::ios::trunc);
  for (const auto& l : kept) out << l << "\n";
  if (!out.flush()) throw std::runtime_error("cannot write " + path);
}

}  // namespace flame_train

// flame-train's memory preflight (memory_check.h).
#include "memory_check.h"

#include <cstdio>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "flame_handles.h"
#include "model_setup.h"

namespace flame_train {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string gib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(bytes) / kGiB);
  return buf;
}

}  // namespace

std::string memory_estimate_request(const TrainConfig& config) {
  nlohmann::json r;
  if (is_demo_model_path(config.model.path)) {
    const char* architecture = nullptr;
    r["config"] = nlohmann::json::parse(demo_model_config(config.model.path.substr(5), &architecture));
    r["architecture"] = architecture;
  } else {
    r["path"] = config.model.path;
  }
  r["options"] = nlohmann::json::parse(denoiser_model_options(config));  // as the trainer loads it
  nlohmann::json lora = {{"rank", config.network.dim}, {"alpha", config.network.alpha}, {"dropout", config.network.dropout}};
  if (!config.network.targets.empty()) lora["targets"] = config.network.targets;
  r["lora"] = lora;
  r["batch"] = config.training.batch_size;
  r["height"] = config.data.buckets.resolution;
  r["width"] = config.data.buckets.resolution;
  r["checkpointing"] = config.training.gradient_checkpointing ? 1 : 0;
  r["optimizer"] = config.optimizer.type;  // adamw: two moments per weight, lion: one
  return r.dump();
}

flame_memory_estimate_t estimate_training_memory(const TrainConfig& config) {
  flame_memory_estimate_t e;
  e.struct_size = sizeof e;
  check(flame_model_estimate_memory(memory_estimate_request(config).c_str(), &e), "flame_model_estimate_memory");
  return e;
}

std::string describe_memory_estimate(const flame_memory_estimate_t& e) {
  return "memory estimate: " + gib(e.total_bytes) + " GiB peak (weights " + gib(e.weights_bytes) +
         ", adapter + gradients + optimizer " + gib(e.adapter_bytes + e.gradient_bytes + e.optimizer_bytes) +
         ", activations " + gib(e.activation_bytes) + ", workspace " + gib(e.workspace_bytes) + ")";
}

void check_memory_estimate(flame_ctx_t ctx, const TrainConfig& config) {
  flame_memory_estimate_t e;
  try {
    e = estimate_training_memory(config);
  } catch (const FlameError& error) {  // loading the model reports its own problem next
    std::fprintf(stderr, "flame-train: warning: no memory estimate: %s\n", error.what());
    return;
  }
  std::printf("%s\n", describe_memory_estimate(e).c_str());
  uint64_t free_bytes = 0, total_bytes = 0;
  check(flame_ctx_device_memory(ctx, &free_bytes, &total_bytes), "flame_ctx_device_memory");
  if (e.total_bytes <= free_bytes) return;
  const std::string what = "the memory estimate (" + gib(e.total_bytes) + " GiB) exceeds the device's free memory (" +
                           gib(free_bytes) + " of " + gib(total_bytes) + " GiB)";
  if (config.training.ignore_memory_estimate) {
    std::fprintf(stderr, "flame-train: warning: %s; training anyway (training.ignore_memory_estimate)\n", what.c_str());
    return;
  }
  throw std::runtime_error(what + ": lower training.batch_size or data.resolution, set training.gradient_checkpointing" +
                           std::string(config.training.gradient_checkpointing ? "" : " (off now)") +
                           ", free the GPU, or set training.ignore_memory_estimate to try anyway");
}

}  // namespace flame_train

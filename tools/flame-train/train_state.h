// Resumable training state of flame-train (issue 37): output.save_state_every_n_steps N > 0 writes,
// every N steps and at the end (as kohya's --save_state, which saves the state with each model and
// at the end), the folder <output.dir>/<output.name>-state-step<NNNNNN>/ holding
//   adapter.safetensors    the adapter's tensors under their names (flame_params_save_safetensors)
//   optimizer.safetensors  the optimizer's state (flame_optimizer_save_state)
//   ema.safetensors        the EMA shadow of the adapter (ema.h), when training.ema_decay > 0
//   state.json             {"format": "flame-train-state", "version": 1, "step", "epoch",
//                          "next_batch", "rng": {"seed", "offset"} (flame_ctx_get_rng_state),
//                          "config": the fingerprint below}
// written as "<folder>.tmp" and renamed, so a folder that exists is complete. The data order needs
// only (epoch, next_batch): every batch plan and every host draw comes from a RandomStream keyed by
// (seed, purpose, epoch or step, item) (random.h), which holds no state between draws; the LR
// schedule is a function of the step. training.resume (or --resume PATH) names such a folder: it is
// checked (read_train_state) before any GPU work, then the tensors, the optimizer and the generator
// are restored after the model and adapter are built, and training continues at step + 1, so that
// the files and the losses equal those of an uninterrupted run.
//
// The fingerprint holds every setting that changes the arithmetic of a step (model, data source,
// network, optimizer, seed, batch, objective, EMA; max_train_steps only for the cosine schedule,
// whose rates depend on it); output, sample, device and checkpointing settings may change.
#pragma once

#include <cstdint>
#include <string>

#include <flame.h>
#include <nlohmann/json.hpp>

#include "config.h"

namespace flame_train {

class AdapterEma;

struct TrainState {
  int64_t step = 0;         // optimizer steps done
  uint64_t epoch = 0;       // epochs planned so far (the current one is epoch - 1)
  uint64_t next_batch = 0;  // the next batch of the current epoch's plan
  uint64_t rng_seed = 0, rng_offset = 0;
};

inline constexpr const char* kStateAdapterFile = "adapter.safetensors";
inline constexpr const char* kStateOptimizerFile = "optimizer.safetensors";
inline constexpr const char* kStateEmaFile = "ema.safetensors";
inline constexpr const char* kStateJsonFile = "state.json";

nlohmann::json config_fingerprint(const TrainConfig& config, bool demo);

// The content of state.json for state (format, version, step, epoch, next_batch, rng, config).
nlohmann::json state_document(const TrainState& state, const TrainConfig& config, bool demo);

// <output.dir>/<output.name>-state-step<NNNNNN>
std::string state_folder(const TrainConfig& config, int64_t step);

// Reads and checks the state folder at path against the configuration, on the host only. Throws
// std::runtime_error naming path and the problem: a missing folder or file, state.json that is not
// valid JSON or lacks a field, another format or version, settings that differ from the saved ones
// (each listed as key: saved -> now), or a step not below training.max_train_steps.
TrainState read_train_state(const std::string& path, const TrainConfig& config, bool demo);

// The device side: what a state folder holds besides state.json.
struct StateHandles {
  flame_ctx_t ctx = nullptr;
  flame_params_t adapter = nullptr;
  flame_optimizer_t optimizer = nullptr;
  const AdapterEma* ema = nullptr;  // NULL: no EMA
};

// Writes the state folder (see above) for state.step; returns its path. The generator state is read
// from the context here (state.rng_* are ignored). Throws FlameError / std::runtime_error.
std::string save_train_state(const StateHandles& h, const TrainConfig& config, bool demo, TrainState state);

// Restores the adapter, the optimizer, the EMA and the generator from a folder read_train_state
// accepted. Throws FlameError / std::runtime_error.
void load_train_state(const StateHandles& h, const std::string& path, const TrainState& state);

// Keeps the lines of the JSONL log at path whose "step" is at most step (a resumed run appends the
// rest); a missing log is fine.
void truncate_log_after(const std::string& path, int64_t step);

}  // namespace flame_train

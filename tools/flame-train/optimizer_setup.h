// The adapter's optimizer as the configuration names it (optimizer.type): AdamW or Lion, both with
// decoupled weight decay (p *= 1 - lr * weight_decay before the update), betas and weight decay from
// optimizer.* (config.cpp gives Lion beta2 0.99 unless set), the learning rate the configuration's
// peak rate (the trainer sets each step's rate from the schedule). Lion keeps one moment per weight
// (exp_avg) where AdamW keeps two; the resumable state's optimizer file holds whichever the optimizer
// has (flame_optimizer_save_state), and a state of one type does not resume the other (train_state.h
// compares optimizer.type). adamw8bit and lion8bit (bitsandbytes' and kohya's AdamW8bit / Lion8bit)
// are the same optimizers with blockwise 8-bit moments (flame_optimizer_set_state_bits): about a
// quarter of the state memory.
#pragma once

#include <string>

#include <flame.h>

#include "config.h"

namespace flame_train {

// FLAME_OPTIMIZER_ADAMW for "adamw" and "adamw8bit", FLAME_OPTIMIZER_LION for "lion" and "lion8bit";
// throws std::invalid_argument for any other name (load_config admits only these).
flame_optimizer_kind_t optimizer_kind(const std::string& type);

// The width of the moments of optimizer.type: 8 for "adamw8bit" / "lion8bit", else 32.
int32_t optimizer_state_bits(const std::string& type);

// flame_optimizer_options_init's defaults for the kind, then optimizer.learning_rate, beta1, beta2 and
// weight_decay. Throws FlameError when the library refuses the kind, std::invalid_argument as above.
flame_optimizer_options_t adapter_optimizer_options(const TrainConfig& config);

}  // namespace flame_train

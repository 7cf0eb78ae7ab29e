// flame-train's memory preflight (issue 36 / 37): the library's estimate of a training step's peak
// (flame_model_estimate_memory, computed from the model's headers and config before any weight is
// read) for this run's model, batch, resolution, LoRA and checkpointing; printed by --dry-run and
// before training, and compared with the device's free memory so that a run that cannot fit stops
// with a clear message instead of failing minutes later (training.ignore_memory_estimate skips the
// refusal, for when the estimate is known to be pessimistic).
#pragma once

#include <string>

#include <flame.h>

#include "config.h"

namespace flame_train {

// The request JSON for this run: model.path (or the demo model's architecture and config) loaded as
// bf16, the network's LoRA options, training.batch_size at data.resolution^2 (the largest bucket's
// pixel count), gradient checkpointing every block or none, optimizer.type (AdamW: two moments,
// Lion: one).
std::string memory_estimate_request(const TrainConfig& config);

// The estimate for this run. Throws FlameError with the library's message when it cannot be made.
flame_memory_estimate_t estimate_training_memory(const TrainConfig& config);

// "memory estimate: 25.14 GiB peak (weights 22.17, adapter + gradients + optimizer 0.67, activations
// 2.27, workspace 0.03)".
std::string describe_memory_estimate(const flame_memory_estimate_t& e);

// Prints the estimate; throws std::runtime_error when it exceeds the free memory of ctx's device and
// the configuration does not set training.ignore_memory_estimate (the message says what to change).
// An estimate that cannot be made (a model file it cannot read) is a warning: the load that follows
// reports the problem itself.
void check_memory_estimate(flame_ctx_t ctx, const TrainConfig& config);

}  // namespace flame_train

// EMA of the LoRA adapter (flame-train, issue 37): training.ema_decay > 0 keeps a shadow copy of the
// adapter's tensors, updated after every optimizer step on the device with FLAME ops (no host round
// trip), as diffusers' EMAModel.step: shadow -= (1 - d) * (shadow - param), where for the k-th
// optimizer step (1-based) s = k - 1 and
//   d = 0                                  when s == 0 (the shadow becomes the parameter),
//   d = min(decay, (1 + s) / (10 + s))     training.ema_warmup false (diffusers' default),
//   d = min(decay, 1 - (1 + s)^(-2/3))     training.ema_warmup true (use_ema_warmup, inv_gamma 1,
//                                          power 2/3: diffusers' defaults).
// The shadow is saved as <name>-ema.safetensors in the LoRA's format (with_shadow_in copies it into
// the adapter for flame_model_save_lora) and is part of the resumable state (train_state.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <flame.h>

#include "flame_handles.h"

namespace flame_train {

// The decay of the optimization_step-th update (1-based), as EMAModel.get_decay (update_after_step 0,
// min_decay 0).
double ema_decay_at(double decay, bool warmup, int64_t optimization_step);

class AdapterEma {
 public:
  // A shadow copy (flame_clone) of every tensor of adapter, under the adapter's names.
  AdapterEma(flame_ctx_t ctx, flame_params_t adapter, double decay, bool warmup);
  // One update after the optimization_step-th optimizer step (1-based), grad mode off.
  void update(flame_params_t adapter, int64_t optimization_step);
  // The shadow tensors as a new list under the adapter's names (for saving and loading in place).
  Params as_params() const;
  // Runs use() with the shadow written into the adapter's tensors in place (flame_copy, grad mode
  // off), then writes the trained values back, also when use() throws (its exception is rethrown).
  void with_shadow_in(flame_params_t adapter, const std::function<void()>& use) const;

 private:
  flame_ctx_t ctx_;
  double decay_;
  bool warmup_;
  std::vector<std::string> names_;
  std::vector<Tensor> shadow_;
};

}  // namespace flame_train

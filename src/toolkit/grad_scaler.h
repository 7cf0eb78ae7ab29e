// Dynamic loss scaling, as torch.cuda.amp.GradScaler: the loss is multiplied by a scale before
// backward so that small f16 gradients do not underflow; the gradients are divided by it again
// (unscale) with a fused check for Inf/NaN; a step is skipped when the check found one, and
// update() backs the scale off after such a step or grows it after growth_interval clean ones.
//
// The scale, the growth tracker and the Inf flags live on the device, so scale(), unscale() and
// update() never wait for the GPU (update runs torch's _amp_update_scale_ as a one-thread kernel).
// step() waits once, to read its optimizer's Inf flag, exactly where torch's GradScaler.step does:
// the optimizer's step count, and with it Adam's bias correction, must not advance for a skipped
// step, and the count lives on the host.
#pragma once
#include <list>
#include <memory>
#include <vector>
#include "flame.h"
#include "tensor/tensor.h"

namespace flame {

class Optimizer;

void validate_grad_scaler_options(const flame_grad_scaler_options_t& o);

class GradScaler {
 public:
  GradScaler(Context& ctx, const flame_grad_scaler_options_t& o);
  // loss * scale, recorded (f32; f64 for an f64 loss); the loss itself when disabled.
  Tensor scale(const Tensor& loss);
  void unscale(const std::shared_ptr<Optimizer>& opt);
  void unscale_tensors(const std::vector<Tensor>& ts);
  // Unscales opt (unless done since the last update), then steps it unless an Inf/NaN was found.
  bool step(const std::shared_ptr<Optimizer>& opt);
  void update();
  double get_scale();  // waits
  // The Inf flag of everything unscaled since the last update (a copy: a 0-d f32 tensor, 0 or 1).
  Tensor found_inf();
  void get_state(double* scale, int64_t* growth_tracker);  // waits
  void set_state(double scale, int64_t growth_tracker);
  Context& ctx() { return *ctx_; }

 private:
  struct PerOptimizer {
    std::weak_ptr<Optimizer> opt;
    Tensor found_inf;  // 0-d f32
    bool unscaled = false, stepped = false;
  };
  PerOptimizer& state_of(const std::shared_ptr<Optimizer>& opt);

  std::shared_ptr<Context> ctx_;
  flame_grad_scaler_options_t o_;
  Tensor scale_, tracker_, found_any_;  // f32, i32, f32 (0-d)
  std::list<PerOptimizer> per_opt_;  // a list: references stay valid while others are erased
  bool checked_ = false;  // an Inf check ran since the last update
};

}  // namespace flame

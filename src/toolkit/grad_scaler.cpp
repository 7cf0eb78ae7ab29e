// The loss scaler (see grad_scaler.h); its kernels are amp_unscale and amp_update_scale in
// cuda/grad_tools.cuh, launched through toolkit/grad_tools.h.
#include "toolkit/grad_scaler.h"
#include <algorithm>
#include <cmath>
#include "tensor/autograd_graph.h"
#include "core/error.h"
#include "ops/ops.h"
#include "optim/optimizer.h"
#include "toolkit/grad_tools.h"

namespace flame {

void validate_grad_scaler_options(const flame_grad_scaler_options_t& o) {
  FLAME_CHECK(o.struct_size == sizeof(flame_grad_scaler_options_t), FLAME_ERROR_INVALID_ARGUMENT,
              "opts->struct_size must be sizeof(flame_grad_scaler_options_t) (call flame_grad_scaler_options_init)");
  FLAME_CHECK(std::isfinite(o.init_scale) && o.init_scale > 0 && o.init_scale <= 3.4e38, FLAME_ERROR_INVALID_ARGUMENT,
              "init_scale must be positive and finite in f32, got ", o.init_scale);
  FLAME_CHECK(std::isfinite(o.growth_factor) && o.growth_factor > 1, FLAME_ERROR_INVALID_ARGUMENT,
              "growth_factor must be finite and > 1, got ", o.growth_factor);
  FLAME_CHECK(o.backoff_factor > 0 && o.backoff_factor < 1, FLAME_ERROR_INVALID_ARGUMENT,
              "backoff_factor must be in (0, 1), got ", o.backoff_factor);
  FLAME_CHECK(o.growth_interval > 0 && o.growth_interval <= 2147483647, FLAME_ERROR_INVALID_ARGUMENT,
              "growth_interval must be in [1, 2^31 - 1], got ", o.growth_interval);
  FLAME_CHECK(o.enabled == 0 || o.enabled == 1, FLAME_ERROR_INVALID_ARGUMENT, "enabled must be 0 or 1, got ", o.enabled);
}

GradScaler::GradScaler(Context& ctx, const flame_grad_scaler_options_t& o) : ctx_(ctx.shared_from_this()), o_(o) {
  validate_grad_scaler_options(o);
  scale_ = ops::scalar(ctx, o.init_scale, FLAME_DTYPE_F32);
  tracker_ = ops::scalar(ctx, 0, FLAME_DTYPE_I32);
  found_any_ = ops::scalar(ctx, 0, FLAME_DTYPE_F32);
}

Tensor GradScaler::scale(const Tensor& loss) {
  FLAME_CHECK(&loss->ctx() == ctx_.get(), FLAME_ERROR_INVALID_ARGUMENT, "loss belongs to another context");
  FLAME_CHECK(is_floating(loss->dtype), FLAME_ERROR_DTYPE_MISMATCH, "loss is ", dtype_name(loss->dtype),
              "; it must be floating");
  if (!o_.enabled) return loss;
  // f16/bf16 losses are multiplied in f32: the default scale 2^16 does not fit in f16.
  const DType dt = loss->dtype == FLAME_DTYPE_F64 ? FLAME_DTYPE_F64 : FLAME_DTYPE_F32;
  Tensor s = alias(scale_);  // saved by the product: update() bumps its version
  if (dt == FLAME_DTYPE_F64) s = ops::to_dtype(s, dt);
  return ops::mul(ops::to_dtype(loss, dt), s);
}

GradScaler::PerOptimizer& GradScaler::state_of(const std::shared_ptr<Optimizer>& opt) {
  FLAME_CHECK(&opt->ctx() == ctx_.get(), FLAME_ERROR_INVALID_ARGUMENT, "opt belongs to another context than the scaler");
  per_opt_.remove_if([](const PerOptimizer& p) { return p.opt.expired(); });  // released optimizers
  for (PerOptimizer& p : per_opt_)
    if (p.opt.lock() == opt) return p;
  PerOptimizer p;
  p.opt = opt;
  p.found_inf = ops::scalar(*ctx_, 0, FLAME_DTYPE_F32);
  per_opt_.push_back(std::move(p));
  return per_opt_.back();
}

void GradScaler::unscale(const std::shared_ptr<Optimizer>& opt) {
  PerOptimizer& st = state_of(opt);
  if (!o_.enabled) return;
  FLAME_CHECK(!st.unscaled, FLAME_ERROR_INVALID_ARGUMENT,
              "unscale has already been called on this optimizer since the last update");
  FLAME_CHECK(!st.stepped, FLAME_ERROR_INVALID_ARGUMENT, "unscale is being called after step (call update first)");
  std::vector<Tensor> grads;
  for (OptimGroup& g : opt->groups())
    for (OptimParam& p : g.params)
      if (p.param->autograd && p.param->autograd->grad) grads.push_back(p.param->autograd->grad);
  toolkit::check_tensor_list(*ctx_, grads, "the gradients", true);
  toolkit::unscale(*ctx_, grads, scale_, st.found_inf, found_any_);
  st.unscaled = true;
  checked_ = true;
}

void GradScaler::unscale_tensors(const std::vector<Tensor>& ts) {
  toolkit::check_tensor_list(*ctx_, ts, "tensors", true);
  if (!o_.enabled) return;
  toolkit::unscale(*ctx_, ts, scale_, found_any_, nullptr);
  checked_ = true;
}

bool GradScaler::step(const std::shared_ptr<Optimizer>& opt) {
  PerOptimizer& st = state_of(opt);
  if (!o_.enabled) {
    opt->step();
    return true;
  }
  FLAME_CHECK(!st.stepped, FLAME_ERROR_INVALID_ARGUMENT, "step has already been called since the last update");
  if (!st.unscaled) unscale(opt);
  float found = 0;
  ops::to_host(st.found_inf, &found, sizeof found);  // the one synchronisation (as torch's step)
  const bool run = found == 0.0f;
  if (run) opt->step();
  st.stepped = true;
  return run;
}

void GradScaler::update() {
  if (!o_.enabled) return;
  FLAME_CHECK(checked_, FLAME_ERROR_INVALID_ARGUMENT,
              "no Inf checks were recorded since the last update (call step, unscale or unscale_tensors first)");
  toolkit::update_scale(*ctx_, scale_, tracker_, found_any_, o_.growth_factor, o_.backoff_factor, o_.growth_interval);
  ops::fill_(found_any_, 0.0);
  per_opt_.clear();
  checked_ = false;
}

double GradScaler::get_scale() { return o_.enabled ? ops::item(scale_) : 1.0; }

Tensor GradScaler::found_inf() { return ops::clone(alias(found_any_)); }

void GradScaler::get_state(double* scale, int64_t* growth_tracker) {
  *scale = ops::item(scale_);
  *growth_tracker = static_cast<int64_t>(ops::item(tracker_));
}

void GradScaler::set_state(double scale, int64_t growth_tracker) {
  FLAME_CHECK(std::isfinite(scale) && scale > 0 && scale <= 3.4e38, FLAME_ERROR_INVALID_ARGUMENT,
              "scale must be positive and finite in f32, got ", scale);
  FLAME_CHECK(growth_tracker >= 0 && growth_tracker < o_.growth_interval, FLAME_ERROR_INVALID_ARGUMENT,
              "growth_tracker must be in [0, growth_interval = ", o_.growth_interval, "), got ", growth_tracker);
  ops::fill_(scale_, scale);
  ops::fill_(tracker_, static_cast<double>(growth_tracker));
}

}  // namespace flame

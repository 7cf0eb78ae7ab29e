// EMA of the adapter (see ema.h): the decay schedule on the host, the update with FLAME ops.
#include "ema.h"

#include <algorithm>
#include <cmath>
#include <exception>

namespace flame_train {

double ema_decay_at(double decay, bool warmup, int64_t optimization_step) {
  const int64_t s = std::max<int64_t>(0, optimization_step - 1);
  if (s <= 0) return 0.0;
  const double sd = static_cast<double>(s);
  const double current = warmup ? 1.0 - std::pow(1.0 + sd, -2.0 / 3.0) : (1.0 + sd) / (10.0 + sd);
  return std::max(0.0, std::min(current, decay));
}

namespace {

// Grad mode off for a scope (the EMA is no part of any graph).
class NoGrad {
 public:
  explicit NoGrad(flame_ctx_t ctx) : ctx_(ctx) { check(flame_ctx_set_grad_enabled(ctx, 0, &previous_), "flame_ctx_set_grad_enabled"); }
  ~NoGrad() { flame_ctx_set_grad_enabled(ctx_, previous_, nullptr); }
  NoGrad(const NoGrad&) = delete;
  NoGrad& operator=(const NoGrad&) = delete;

 private:
  flame_ctx_t ctx_;
  int32_t previous_ = 1;
};

flame_tensor_t adapter_tensor(flame_params_t adapter, int64_t i) {
  flame_tensor_t t = nullptr;
  check(flame_params_tensor(adapter, i, &t), "flame_params_tensor");
  return t;
}

}  // namespace

AdapterEma::AdapterEma(flame_ctx_t ctx, flame_params_t adapter, double decay, bool warmup)
    : ctx_(ctx), decay_(decay), warmup_(warmup) {
  NoGrad no_grad(ctx);
  int64_t n = 0;
  check(flame_params_count(adapter, &n), "flame_params_count");
  for (int64_t i = 0; i < n; ++i) {
    const char* name = nullptr;
    check(flame_params_name(adapter, i, &name), "flame_params_name");
    names_.emplace_back(name);
    Tensor copy;
    check(flame_clone(adapter_tensor(adapter, i), copy.out()), "flame_clone");
    shadow_.push_back(std::move(copy));
  }
}

void AdapterEma::update(flame_params_t adapter, int64_t optimization_step) {
  NoGrad no_grad(ctx_);
  const double one_minus_decay = 1.0 - ema_decay_at(decay_, warmup_, optimization_step);
  for (size_t i = 0; i < shadow_.size(); ++i) {
    Tensor diff, step, next;  // shadow - (1 - d) * (shadow - param), as EMAModel's sub_
    check(flame_sub(shadow_[i].get(), adapter_tensor(adapter, static_cast<int64_t>(i)), diff.out()), "flame_sub");
    check(flame_mul_scalar(diff.get(), one_minus_decay, step.out()), "flame_mul_scalar");
    check(flame_sub(shadow_[i].get(), step.get(), next.out()), "flame_sub");
    shadow_[i] = std::move(next);
  }
}

Params AdapterEma::as_params() const {
  Params list;
  check(flame_params_create(ctx_, list.out()), "flame_params_create");
  for (size_t i = 0; i < shadow_.size(); ++i)
    check(flame_params_add(list.get(), names_[i].c_str(), shadow_[i].get()), "flame_params_add");
  return list;
}

void AdapterEma::with_shadow_in(flame_params_t adapter, const std::function<void()>& use) const {
  std::vector<Tensor> trained(shadow_.size());
  {
    NoGrad no_grad(ctx_);
    for (size_t i = 0; i < shadow_.size(); ++i) {
      flame_tensor_t t = adapter_tensor(adapter, static_cast<int64_t>(i));
      check(flame_clone(t, trained[i].out()), "flame_clone");
    }
    for (size_t i = 0; i < shadow_.size(); ++i)
      check(flame_copy(adapter_tensor(adapter, static_cast<int64_t>(i)), shadow_[i].get()), "flame_copy (EMA in)");
  }
  std::exception_ptr failure;
  try {
    use();
  } catch (...) {
    failure = std::current_exception();
  }
  NoGrad no_grad(ctx_);
  for (size_t i = 0; i < trained.size(); ++i)
    check(flame_copy(adapter_tensor(adapter, static_cast<int64_t>(i)), trained[i].get()), "flame_copy (adapter back)");
  if (failure) std::rethrow_exception(failure);
}

}  // namespace flame_train

// Optimizers over parameter groups (SGD, Adam, AdamW, Lion), each step one fused multi-tensor
// kernel launch per group and parameter dtype (cuda/optim.cuh). State lives in the optimizer:
// moments in the compute type (f32 for f16/bf16/f32 parameters) and, on request, f32 master
// weights for f16/bf16 parameters. Parameters are updated in place (their version counters move,
// as after any in-place write).
#pragma once
#include <memory>
#include <vector>
#include "flame.h"
#include "tensor/tensor.h"

namespace flame {

struct OptimParam {
  Tensor param;
  Tensor m, v, vmax, master;  // created at the first step that sees a gradient
};

struct OptimGroup {
  flame_optimizer_options_t opts;
  std::vector<OptimParam> params;
};

class Optimizer {
 public:
  Optimizer(Context& ctx, int32_t kind) : ctx_(ctx.shared_from_this()), kind_(kind) {}
  // Validates opts (same kind as the optimizer, finite non-negative values) and params (floating,
  // contiguous leaves of this context, no duplicates in the optimizer).
  void add_group(const flame_optimizer_options_t& opts, const std::vector<Tensor>& params);
  void step();
  void zero_grad(bool set_to_none);
  std::vector<OptimGroup>& groups() { return groups_; }
  int64_t step_count() const { return steps_; }
  Context& ctx() { return *ctx_; }

 private:
  std::shared_ptr<Context> ctx_;
  int32_t kind_;
  int64_t steps_ = 0;
  std::vector<OptimGroup> groups_;
};

void validate_optimizer_options(const flame_optimizer_options_t& o, int32_t kind);

}  // namespace flame

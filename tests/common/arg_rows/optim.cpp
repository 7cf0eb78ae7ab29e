// Argument-matrix rows (tests/common/arg_matrix.h) for the optimizers and the gradient tools.
// Parameters are param(): f32 2x3 leaves that require grad and have a .grad of ones, so steps and
// clipping do real work. a.opt is an SGD optimizer over one such parameter; released optimizers
// are not swept (flame_optimizer_release frees the handle).
#include "arg_matrix.h"

namespace {
using namespace argm;

FLAME_ARG_ROW(flame_optimizer_options_init, a.out<flame_optimizer_options_t>("opts"), FLAME_OPTIMIZER_ADAMW);
FLAME_ARG_ROW(flame_optimizer_create, a.ctx("ctx"), a.optim_opts("opts"), a.ts("params", {param()}), 1, a.out_opt("out"));
// A second group of the optimizer's kind (SGD) with a parameter of its own.
FLAME_ARG_ROW(flame_optimizer_add_param_group, a.opt("opt"), a.optim_opts("opts"), a.ts("params", {param()}), 1,
              a.opt_out<int32_t>("group"));
FLAME_ARG_ROW(flame_optimizer_step, a.opt("opt"));
FLAME_ARG_ROW(flame_optimizer_zero_grad, a.opt("opt"), 0);
FLAME_ARG_ROW(flame_optimizer_set_lr, a.opt("opt"), -1, 0.01);
FLAME_ARG_ROW(flame_optimizer_get_lr, a.opt("opt"), 0, a.out<double>("lr"));
FLAME_ARG_ROW(flame_optimizer_step_count, a.opt("opt"), a.out<int64_t>("steps"));
// 32: the width a.opt (SGD, no state) already has; 8 is refused for SGD (tests/gpu/test_optim_8bit.cpp).
FLAME_ARG_ROW(flame_optimizer_set_state_bits, a.opt("opt"), 32);
FLAME_ARG_VOID(flame_optimizer_release, a.release_opt("opt"));

FLAME_ARG_ROW(flame_clip_grad_norm, a.ctx("ctx"), a.ts("params", {param(), param()}), 2, 1.0, 2.0, 0,
              a.opt_out_t("total_norm"));
FLAME_ARG_ROW(flame_clip_grad_value, a.ctx("ctx"), a.ts("params", {param()}), 1, 0.5);

}  // namespace

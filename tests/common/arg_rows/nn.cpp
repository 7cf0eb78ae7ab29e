// Argument-matrix rows (tests/common/arg_matrix.h) for softmax and the normalisations. Optional
// tensors (weight, bias, running statistics) are given with the documented shapes; they may be
// NULL by contract, so the sweeps do not NULL them but do release them and take them from another
// context.
#include "arg_matrix.h"

namespace {
using namespace argm;

FLAME_ARG_ROW(flame_softmax, a.t("x"), 1, a.out_t("out"));
FLAME_ARG_ROW(flame_log_softmax, a.t("x"), -1, a.out_t("out"));
// Over the last dim of x [2, 3].
FLAME_ARG_ROW(flame_layer_norm, a.t("x"), a.in<int64_t>("normalized_shape", {3}), 1, a.opt_t("weight", sp({3})),
              a.opt_t("bias", sp({3})), 1e-5, a.out_t("out"));
FLAME_ARG_ROW(flame_rms_norm, a.t("x"), a.in<int64_t>("normalized_shape", {3}), 1, a.opt_t("weight", sp({3})), 1e-6,
              a.out_t("out"));
// x [N 2, C 4, 3] in 2 groups of 2 channels; weight and bias [C].
FLAME_ARG_ROW(flame_group_norm, a.t("x", sp({2, 4, 3})), 2, a.opt_t("weight", sp({4})), a.opt_t("bias", sp({4})), 1e-5, 0,
              a.out_t("out"));
// Training on x [N 2, C 3] (2 values per channel); running statistics [C] that do not require grad.
FLAME_ARG_ROW(flame_batch_norm, a.t("x"), a.opt_t("running_mean", sp({3})), a.opt_t("running_var", sp({3})),
              a.opt_t("weight", sp({3})), a.opt_t("bias", sp({3})), 1, 0.1, 1e-5, a.out_t("out"));

}  // namespace

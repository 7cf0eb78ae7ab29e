// Argument-matrix rows (tests/common/arg_matrix.h) for the losses. Spec tensors hold ones, so an
// i64 target [2] is class 1 of the 3 classes of logits [2, 3]: a valid index.
#include "arg_matrix.h"

namespace {
using namespace argm;

FLAME_ARG_ROW(flame_cross_entropy, a.t("logits"), a.t("target", sp({2}, FLAME_DTYPE_I64)), a.opt_t("weight", sp({3})), -100,
              0.1, FLAME_REDUCTION_MEAN, a.out_t("out"));
FLAME_ARG_ROW(flame_nll_loss, a.t("input"), a.t("target", sp({2}, FLAME_DTYPE_I64)), a.opt_t("weight", sp({3})), -100,
              FLAME_REDUCTION_MEAN, a.out_t("out"));
FLAME_ARG_ROW(flame_mse_loss, a.t("input"), a.t("target"), FLAME_REDUCTION_MEAN, a.out_t("out"));
FLAME_ARG_ROW(flame_l1_loss, a.t("input"), a.t("target"), FLAME_REDUCTION_SUM, a.out_t("out"));
FLAME_ARG_ROW(flame_smooth_l1_loss, a.t("input"), a.t("target"), 1.0, FLAME_REDUCTION_NONE, a.out_t("out"));
FLAME_ARG_ROW(flame_huber_loss, a.t("input"), a.t("target"), 1.0, FLAME_REDUCTION_MEAN, a.out_t("out"));
// Targets in [0, 1] (ones); weight broadcasts as the input's shape, pos_weight per class [3].
FLAME_ARG_ROW(flame_binary_cross_entropy_with_logits, a.t("logits"), a.t("target"), a.opt_t("weight"),
              a.opt_t("pos_weight", sp({3})), FLAME_REDUCTION_MEAN, a.out_t("out"));

}  // namespace

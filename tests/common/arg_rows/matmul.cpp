// Argument-matrix rows (tests/common/arg_matrix.h) for the matrix products: operands of matching
// inner sizes, f32 (default tensors are f32 2x3 of ones).
#include "arg_matrix.h"

namespace {
using namespace argm;

FLAME_ARG_ROW(flame_matmul, a.t("a"), a.t("b", sp({3, 2})), a.out_t("out"));
FLAME_ARG_ROW(flame_bmm, a.t("a", sp({2, 2, 3})), a.t("b", sp({2, 3, 2})), a.out_t("out"));
// x [2, 3], weight [4, 3], bias [4] (NULL by contract, so never NULLed by the sweeps).
FLAME_ARG_ROW(flame_linear, a.t("x"), a.t("weight", sp({4, 3})), a.opt_t("bias", sp({4})), FLAME_ACTIVATION_NONE,
              a.out_t("out"));

}  // namespace

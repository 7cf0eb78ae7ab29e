// Argument-matrix rows (tests/common/arg_matrix.h) for the convolutions: f32 x [N 1, C 2, 4, 4],
// weight [O 3, 2, 3, 3] (conv_transpose2d: [C_in 2, C_out 3, 3, 3]; conv1d: x [1, 2, 5], weight
// [3, 2, 3]), bias [3]. bias and opts may be NULL by contract, so the sweeps never NULL them: opts
// points at a static struct of defaults.
#include "arg_matrix.h"

namespace {
using namespace argm;

const flame_conv_options_t* conv_defaults() {
  static const flame_conv_options_t o = [] {
    flame_conv_options_t v;
    flame_conv_options_init(&v);
    return v;
  }();
  return &o;
}

FLAME_ARG_ROW(flame_conv_options_init, a.out<flame_conv_options_t>("opts"));
FLAME_ARG_ROW(flame_conv2d, a.t("x", sp({1, 2, 4, 4})), a.t("weight", sp({3, 2, 3, 3})), a.opt_t("bias", sp({3})),
              conv_defaults(), a.out_t("out"));
FLAME_ARG_ROW(flame_conv_transpose2d, a.t("x", sp({1, 2, 4, 4})), a.t("weight", sp({2, 3, 3, 3})), a.opt_t("bias", sp({3})),
              conv_defaults(), a.out_t("out"));
FLAME_ARG_ROW(flame_conv1d, a.t("x", sp({1, 2, 5})), a.t("weight", sp({3, 2, 3})), a.opt_t("bias", sp({3})),
              conv_defaults(), a.out_t("out"));

}  // namespace

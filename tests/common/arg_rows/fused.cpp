// Argument-matrix rows (tests/common/arg_matrix.h) for fused elementwise expressions: a.fused is
// "x0 * x1 + 1" over two inputs, called on two f32 [2, 3] tensors.
#include "arg_matrix.h"

namespace {
using namespace argm;

FLAME_ARG_ROW(flame_fused_compile, a.ctx("ctx"), a.str("expr", "x0 * (1 + x1) + x2"), 3, a.out_fused("out"));
FLAME_ARG_ROW(flame_fused_call, a.fused("fn"), a.ts("inputs", {sp(), sp()}), 2, a.out_t("out"));
FLAME_ARG_VOID(flame_fused_release, a.release_fused("fn"));

}  // namespace

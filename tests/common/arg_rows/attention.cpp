// Argument-matrix rows (tests/common/arg_matrix.h) for scaled-dot-product attention. q [1, 2, 3, 8],
// k [1, 2, 5, 8], v [1, 2, 5, 4] and a bool mask [3, 5] that broadcasts to [1, 2, 3, 5]; the mask
// and the options may be NULL by contract (no mask; the defaults), so the sweeps do not NULL them.
#include "arg_matrix.h"

namespace {
using namespace argm;

FLAME_ARG_ROW(flame_attention_options_init, a.out<flame_attention_options_t>("opts"));
FLAME_ARG_ROW(flame_scaled_dot_product_attention, a.t("q", sp({1, 2, 3, 8})), a.t("k", sp({1, 2, 5, 8})),
              a.t("v", sp({1, 2, 5, 4})), a.opt_t("mask", sp({3, 5}, FLAME_DTYPE_BOOL)), a.attention_opts("opts"),
              a.out_t("out"));

}  // namespace

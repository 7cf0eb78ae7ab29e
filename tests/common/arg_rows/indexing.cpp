// Argument-matrix rows (tests/common/arg_matrix.h) for the indexing ops. Spec tensors hold ones, so
// i64 index tensors select position 1, valid for the f32 [2, 3] inputs along either dim.
#include "arg_matrix.h"

namespace {
using namespace argm;

FLAME_ARG_ROW(flame_index_select, a.t("t"), 1, a.t("index", sp({2}, FLAME_DTYPE_I64)), a.out_t("out"));
FLAME_ARG_ROW(flame_gather, a.t("t"), 1, a.t("index", sp({2, 3}, FLAME_DTYPE_I64)), a.out_t("out"));
FLAME_ARG_ROW(flame_scatter_add, a.t("t"), 1, a.t("index", sp({2, 3}, FLAME_DTYPE_I64)), a.t("src"), a.out_t("out"));
FLAME_ARG_ROW(flame_index_add, a.t("t"), 1, a.t("index", sp({2}, FLAME_DTYPE_I64)), a.t("source", sp({2, 2})), 1.0,
              a.out_t("out"));
FLAME_ARG_ROW(flame_masked_fill, a.t("t"), a.t("mask", sp({2, 3}, FLAME_DTYPE_BOOL)), 0.5, a.out_t("out"));
FLAME_ARG_ROW(flame_one_hot, a.t("index", sp({2}, FLAME_DTYPE_I64)), 3, a.out_t("out"));
FLAME_ARG_ROW(flame_embedding, a.t("weight"), a.t("indices", sp({2}, FLAME_DTYPE_I64)), FLAME_NO_PADDING, a.out_t("out"));

}  // namespace

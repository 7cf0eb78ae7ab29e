// Argument-matrix rows (tests/common/arg_matrix.h) for the ops of the second part of issue 5
// (flame.h "Indexing: scatter, masked_select, repeat, pad" and the sections after it). Spec tensors
// hold ones, so i64 index tensors select position 1 and bool masks are all true.
#include "arg_matrix.h"

namespace {
using namespace argm;

flame_pool2d_options_t pool_opts(int64_t k) {
  flame_pool2d_options_t o;
  flame_pool2d_options_init(&o, k, k);
  return o;
}
flame_rope_options_t rope_opts() {
  flame_rope_options_t o;
  flame_rope_options_init(&o);
  return o;
}

// ---- indexing: t is f32 [2, 3]
FLAME_ARG_ROW(flame_scatter, a.t("t"), 1, a.t("index", sp({2, 2}, FLAME_DTYPE_I64)), a.t("src", sp({2, 2})), a.out_t("out"));
FLAME_ARG_ROW(flame_masked_select, a.t("t"), a.t("mask", sp({3}, FLAME_DTYPE_BOOL)), a.out_t("out"));
FLAME_ARG_ROW(flame_repeat, a.t("t"), a.in<int64_t>("repeats", {2, 1, 2}), 3, a.out_t("out"));
FLAME_ARG_ROW(flame_repeat_interleave, a.t("t"), 2, -1, a.out_t("out"));
FLAME_ARG_ROW(flame_pad, a.t("t"), a.in<int64_t>("pads", {1, 1, 0, 1}), 4, FLAME_PAD_REFLECT, 0.0, a.out_t("out"));

// ---- dropout
FLAME_ARG_ROW(flame_dropout, a.t("t"), 0.5, 1, a.out_t("out"));

// ---- pooling: x [N 1, C 2, 4, 4]
FLAME_ARG_ROW(flame_pool2d_options_init, a.out<flame_pool2d_options_t>("opts"), 2, 2);
FLAME_ARG_ROW(flame_max_pool2d, a.t("x", sp({1, 2, 4, 4})), a.in<flame_pool2d_options_t>("opts", {pool_opts(2)}), a.out_t("out"));
FLAME_ARG_ROW(flame_avg_pool2d, a.t("x", sp({1, 2, 4, 4})), a.in<flame_pool2d_options_t>("opts", {pool_opts(2)}), a.out_t("out"));
FLAME_ARG_ROW(flame_adaptive_avg_pool2d, a.t("x", sp({1, 2, 4, 4})), 3, 2, a.out_t("out"));

// ---- upsampling: x [N 1, C 2, 3, 3]
FLAME_ARG_ROW(flame_upsample_nearest2d, a.t("x", sp({1, 2, 3, 3})), 0, 0, 2.0, 2.0, a.out_t("out"));
FLAME_ARG_ROW(flame_upsample_bilinear2d, a.t("x", sp({1, 2, 3, 3})), 5, 7, 0.0, 0.0, 1, a.out_t("out"));

// ---- positional embeddings: x [B 1, H 2, T 4, D 6] with position ids [T] (ones); timesteps [3]
FLAME_ARG_ROW(flame_rope_options_init, a.out<flame_rope_options_t>("opts"));
FLAME_ARG_ROW(flame_rope, a.t("x", sp({1, 2, 4, 6})), a.opt_t("positions", sp({4}, FLAME_DTYPE_I64)),
              a.in<flame_rope_options_t>("opts", {rope_opts()}), a.out_t("out"));
FLAME_ARG_ROW(flame_timestep_embedding, a.t("timesteps", sp({3}, FLAME_DTYPE_I64)), 8, 10000.0, 1, 1.0, 1.0, a.out_t("out"));

// ---- composite blocks: x [2, 3, 4]; shift / scale [N 2, C 4]; MLP 4 -> 5 -> 6
FLAME_ARG_ROW(flame_geglu, a.t("x", sp({2, 3, 4})), 1, a.out_t("out"));
FLAME_ARG_ROW(flame_adaln_modulate, a.t("x", sp({2, 3, 4})), a.opt_t("shift", sp({2, 4})), a.opt_t("scale", sp({2, 4})),
              a.out_t("out"));
FLAME_ARG_ROW(flame_swiglu_mlp, a.t("x", sp({2, 3, 4})), a.t("w1", sp({5, 4})), a.t("w3", sp({5, 4})), a.t("w2", sp({6, 5})),
              a.out_t("out"));

}  // namespace

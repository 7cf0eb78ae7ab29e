// Argument-matrix rows (tests/common/arg_matrix.h) for the foundation's functions, in flame.h's
// order. The valid arguments must make the call succeed on a GPU (the GPU test checks that first):
// default tensors are f32 2x3 of ones; see Spec for the others.
#include <cmath>
#include "arg_matrix.h"

namespace {
using namespace argm;

// ---- version, status, errors, dtypes ----
FLAME_ARG_PURE(flame_version_string, flame_version_string() != nullptr);
FLAME_ARG_PURE(flame_abi_version, flame_abi_version() == FLAME_ABI_VERSION);
FLAME_ARG_PURE(flame_status_string, flame_status_string(static_cast<flame_status_t>(-7)) != nullptr &&
                                        flame_status_string(static_cast<flame_status_t>(9999)) != nullptr);
FLAME_ARG_PURE(flame_last_error_message, flame_last_error_message() != nullptr);
FLAME_ARG_VOID(flame_set_error_message, a.str("msg", "a message"));
FLAME_ARG_PURE(flame_dtype_size, flame_dtype_size(static_cast<flame_dtype_t>(99)) == 0 &&
                                     flame_dtype_size(static_cast<flame_dtype_t>(-1)) == 0);
FLAME_ARG_PURE(flame_dtype_name, std::strcmp(flame_dtype_name(static_cast<flame_dtype_t>(-1)), "unknown") == 0);

// ---- context ----
FLAME_ARG_ROW(flame_ctx_options_init, a.opts("opts"));
FLAME_ARG_ROW(flame_ctx_create, a.opt_opts("opts"), a.out_ctx("ctx"));
FLAME_ARG_VOID(flame_ctx_destroy, a.release_ctx("ctx"));
FLAME_ARG_ROW(flame_ctx_synchronize, a.ctx("ctx"));
FLAME_ARG_ROW(flame_ctx_device_name, a.ctx("ctx"), a.chars("buf", 64), 64);
FLAME_ARG_ROW(flame_ctx_compute_capability, a.ctx("ctx"), a.out<int32_t>("major"), a.out<int32_t>("minor"));
FLAME_ARG_ROW(flame_ctx_stream, a.ctx("ctx"), a.out<void*>("stream"));
FLAME_ARG_ROW(flame_device_count, a.out<int32_t>("count"));
FLAME_ARG_ROW(flame_ctx_memory_stats, a.ctx("ctx"), a.stats("stats"));
FLAME_ARG_ROW(flame_ctx_reset_peak_memory, a.ctx("ctx"));
FLAME_ARG_ROW(flame_ctx_device_memory, a.ctx("ctx"), a.opt_out<uint64_t>("free_bytes"), a.opt_out<uint64_t>("total_bytes"));
FLAME_ARG_ROW(flame_ctx_counters, a.ctx("ctx"), a.counters("counters"));
FLAME_ARG_ROW(flame_ctx_reset_counters, a.ctx("ctx"));
FLAME_ARG_ROW(flame_ctx_manual_seed, a.ctx("ctx"), 7);
FLAME_ARG_ROW(flame_ctx_get_rng_state, a.ctx("ctx"), a.out<uint64_t>("seed"), a.out<uint64_t>("offset"));
FLAME_ARG_ROW(flame_ctx_set_rng_state, a.ctx("ctx"), 1, 2);

// ---- tensor lifetime and queries ----
FLAME_ARG_ROW(flame_tensor_retain, a.t_retained("t"));
FLAME_ARG_VOID(flame_tensor_release, a.release_t("t"));
FLAME_ARG_ROW(flame_tensor_context, a.t("t"), a.out_ctx_borrowed("ctx"));
FLAME_ARG_ROW(flame_tensor_dtype, a.t("t"), a.out<flame_dtype_t>("dtype"));
FLAME_ARG_ROW(flame_tensor_ndim, a.t("t"), a.out<int32_t>("ndim"));
FLAME_ARG_ROW(flame_tensor_shape, a.t("t"), a.out<int64_t>("dims", FLAME_MAX_DIMS), FLAME_MAX_DIMS);
FLAME_ARG_ROW(flame_tensor_strides, a.t("t"), a.out<int64_t>("strides", FLAME_MAX_DIMS), FLAME_MAX_DIMS);
FLAME_ARG_ROW(flame_tensor_numel, a.t("t"), a.out<int64_t>("numel"));
FLAME_ARG_ROW(flame_tensor_is_contiguous, a.t("t"), a.out<int32_t>("contiguous"));
FLAME_ARG_ROW(flame_tensor_data_ptr, a.t("t"), a.out<void*>("ptr"));

// ---- creation ----
FLAME_ARG_ROW(flame_empty, a.ctx("ctx"), a.in<int64_t>("shape", {2, 3}), 2, FLAME_DTYPE_F32, a.out_t("out"));
FLAME_ARG_ROW(flame_zeros, a.ctx("ctx"), a.in<int64_t>("shape", {2, 3}), 2, FLAME_DTYPE_F32, a.out_t("out"));
FLAME_ARG_ROW(flame_ones, a.ctx("ctx"), a.in<int64_t>("shape", {2, 3}), 2, FLAME_DTYPE_F32, a.out_t("out"));
FLAME_ARG_ROW(flame_full, a.ctx("ctx"), a.in<int64_t>("shape", {2, 3}), 2, FLAME_DTYPE_F32, 1.5, a.out_t("out"));
FLAME_ARG_ROW(flame_arange, a.ctx("ctx"), 0.0, 5.0, 1.0, FLAME_DTYPE_F32, a.out_t("out"));
FLAME_ARG_ROW(flame_linspace, a.ctx("ctx"), 0.0, 1.0, 5, FLAME_DTYPE_F32, a.out_t("out"));
FLAME_ARG_ROW(flame_eye, a.ctx("ctx"), 3, 3, FLAME_DTYPE_F32, a.out_t("out"));
FLAME_ARG_ROW(flame_rand, a.ctx("ctx"), a.in<int64_t>("shape", {2, 3}), 2, FLAME_DTYPE_F32, a.out_t("out"));
FLAME_ARG_ROW(flame_randn, a.ctx("ctx"), a.in<int64_t>("shape", {2, 3}), 2, FLAME_DTYPE_F32, a.out_t("out"));
FLAME_ARG_ROW(flame_from_host, a.ctx("ctx"), a.buf("data", 24), 24, a.in<int64_t>("shape", {2, 3}), 2, FLAME_DTYPE_F32,
              a.out_t("out"));
FLAME_ARG_ROW(flame_to_host, a.t("t"), a.buf("data", 24), 24);
FLAME_ARG_ROW(flame_tensor_item, a.t("t", scalar()), a.out<double>("value"));

// ---- views and shape ops ----
FLAME_ARG_ROW(flame_reshape, a.t("t"), a.in<int64_t>("shape", {3, 2}), 2, a.out_t("out"));
FLAME_ARG_ROW(flame_view, a.t("t"), a.in<int64_t>("shape", {6}), 1, a.out_t("out"));
FLAME_ARG_ROW(flame_permute, a.t("t"), a.in<int32_t>("dims", {1, 0}), 2, a.out_t("out"));
FLAME_ARG_ROW(flame_transpose, a.t("t"), 0, 1, a.out_t("out"));
FLAME_ARG_ROW(flame_expand, a.t("t", sp({1, 3})), a.in<int64_t>("shape", {4, 3}), 2, a.out_t("out"));
FLAME_ARG_ROW(flame_squeeze, a.t("t", sp({1, 3})), 0, a.out_t("out"));
FLAME_ARG_ROW(flame_squeeze_all, a.t("t"), a.out_t("out"));
FLAME_ARG_ROW(flame_unsqueeze, a.t("t"), 0, a.out_t("out"));
FLAME_ARG_ROW(flame_narrow, a.t("t"), 1, 0, 2, a.out_t("out"));
FLAME_ARG_ROW(flame_slice, a.t("t"), 1, 0, 3, 2, a.out_t("out"));
FLAME_ARG_ROW(flame_select, a.t("t"), 0, 1, a.out_t("out"));
FLAME_ARG_ROW(flame_flip, a.t("t"), a.in<int32_t>("dims", {0}), 1, a.out_t("out"));
FLAME_ARG_ROW(flame_diagonal, a.t("t"), 0, 0, 1, a.out_t("out"));
FLAME_ARG_ROW(flame_contiguous, a.t("t"), a.out_t("out"));
FLAME_ARG_ROW(flame_clone, a.t("t"), a.out_t("out"));
FLAME_ARG_ROW(flame_to_dtype, a.t("t"), FLAME_DTYPE_F64, a.out_t("out"));
FLAME_ARG_ROW(flame_cat, a.ts("tensors", {sp(), sp()}), 2, 0, a.out_t("out"));
FLAME_ARG_ROW(flame_stack, a.ts("tensors", {sp(), sp()}), 2, 0, a.out_t("out"));
FLAME_ARG_ROW(flame_split, a.t("t"), 1, 0, a.outs("outs", 4), 4, a.out<int32_t>("count"));
FLAME_ARG_ROW(flame_split_sizes, a.t("t"), a.in<int64_t>("sizes", {1, 1}), 2, 0, a.outs("outs", 2));
FLAME_ARG_ROW(flame_chunk, a.t("t"), 2, 0, a.outs("outs", 4), 4, a.out<int32_t>("count"));
FLAME_ARG_ROW(flame_triu, a.t("t"), 0, a.out_t("out"));
FLAME_ARG_ROW(flame_tril, a.t("t"), 0, a.out_t("out"));

// ---- elementwise ----
FLAME_ARG_ROW(flame_add, a.t("a"), a.t("b"), a.out_t("out"));
FLAME_ARG_ROW(flame_sub, a.t("a"), a.t("b"), a.out_t("out"));
FLAME_ARG_ROW(flame_mul, a.t("a"), a.t("b"), a.out_t("out"));
FLAME_ARG_ROW(flame_div, a.t("a"), a.t("b"), a.out_t("out"));
FLAME_ARG_ROW(flame_pow, a.t("a"), a.t("b"), a.out_t("out"));
FLAME_ARG_ROW(flame_maximum, a.t("a"), a.t("b"), a.out_t("out"));
FLAME_ARG_ROW(flame_minimum, a.t("a"), a.t("b"), a.out_t("out"));
FLAME_ARG_ROW(flame_eq, a.t("a"), a.t("b"), a.out_t("out"));
FLAME_ARG_ROW(flame_ne, a.t("a"), a.t("b"), a.out_t("out"));
FLAME_ARG_ROW(flame_lt, a.t("a"), a.t("b"), a.out_t("out"));
FLAME_ARG_ROW(flame_le, a.t("a"), a.t("b"), a.out_t("out"));
FLAME_ARG_ROW(flame_gt, a.t("a"), a.t("b"), a.out_t("out"));
FLAME_ARG_ROW(flame_ge, a.t("a"), a.t("b"), a.out_t("out"));
FLAME_ARG_ROW(flame_logical_and, a.t("a"), a.t("b"), a.out_t("out"));
FLAME_ARG_ROW(flame_logical_or, a.t("a"), a.t("b"), a.out_t("out"));
FLAME_ARG_ROW(flame_logical_not, a.t("t"), a.out_t("out"));
FLAME_ARG_ROW(flame_where, a.t("cond", sp({2, 3}, FLAME_DTYPE_BOOL)), a.t("a"), a.t("b"), a.out_t("out"));
FLAME_ARG_ROW(flame_clamp, a.t("t"), -1.0, 1.0, a.out_t("out"));
FLAME_ARG_ROW(flame_add_scalar, a.t("t"), 2.0, a.out_t("out"));
FLAME_ARG_ROW(flame_sub_scalar, a.t("t"), 2.0, a.out_t("out"));
FLAME_ARG_ROW(flame_rsub_scalar, a.t("t"), 2.0, a.out_t("out"));
FLAME_ARG_ROW(flame_mul_scalar, a.t("t"), 2.0, a.out_t("out"));
FLAME_ARG_ROW(flame_div_scalar, a.t("t"), 2.0, a.out_t("out"));
FLAME_ARG_ROW(flame_pow_scalar, a.t("t"), 2.0, a.out_t("out"));
FLAME_ARG_ROW(flame_neg, a.t("t"), a.out_t("out"));
FLAME_ARG_ROW(flame_abs, a.t("t"), a.out_t("out"));
FLAME_ARG_ROW(flame_exp, a.t("t"), a.out_t("out"));
FLAME_ARG_ROW(flame_log, a.t("t"), a.out_t("out"));
FLAME_ARG_ROW(flame_log1p, a.t("t"), a.out_t("out"));
FLAME_ARG_ROW(flame_expm1, a.t("t"), a.out_t("out"));
FLAME_ARG_ROW(flame_sqrt, a.t("t"), a.out_t("out"));
FLAME_ARG_ROW(flame_rsqrt, a.t("t"), a.out_t("out"));
FLAME_ARG_ROW(flame_sin, a.t("t"), a.out_t("out"));
FLAME_ARG_ROW(flame_cos, a.t("t"), a.out_t("out"));
FLAME_ARG_ROW(flame_tanh, a.t("t"), a.out_t("out"));
FLAME_ARG_ROW(flame_sigmoid, a.t("t"), a.out_t("out"));
FLAME_ARG_ROW(flame_relu, a.t("t"), a.out_t("out"));
FLAME_ARG_ROW(flame_silu, a.t("t"), a.out_t("out"));
FLAME_ARG_ROW(flame_leaky_relu, a.t("t"), 0.01, a.out_t("out"));
FLAME_ARG_ROW(flame_elu, a.t("t"), 1.0, a.out_t("out"));
FLAME_ARG_ROW(flame_gelu, a.t("t"), 0, a.out_t("out"));
FLAME_ARG_ROW(flame_softplus, a.t("t"), 1.0, 20.0, a.out_t("out"));
FLAME_ARG_ROW(flame_floor, a.t("t"), a.out_t("out"));
FLAME_ARG_ROW(flame_ceil, a.t("t"), a.out_t("out"));
FLAME_ARG_ROW(flame_round, a.t("t"), a.out_t("out"));
FLAME_ARG_ROW(flame_sign, a.t("t"), a.out_t("out"));
FLAME_ARG_ROW(flame_reciprocal, a.t("t"), a.out_t("out"));
FLAME_ARG_ROW(flame_square, a.t("t"), a.out_t("out"));
FLAME_ARG_ROW(flame_isnan, a.t("t"), a.out_t("out"));
FLAME_ARG_ROW(flame_isinf, a.t("t"), a.out_t("out"));

// ---- reductions ----
FLAME_ARG_ROW(flame_sum, a.t("t"), a.in<int32_t>("dims", {0}), 1, 0, a.out_t("out"));
FLAME_ARG_ROW(flame_mean, a.t("t"), a.in<int32_t>("dims", {0}), 1, 0, a.out_t("out"));
FLAME_ARG_ROW(flame_prod, a.t("t"), a.in<int32_t>("dims", {0}), 1, 0, a.out_t("out"));
FLAME_ARG_ROW(flame_max, a.t("t"), a.in<int32_t>("dims", {0}), 1, 0, a.out_t("out"));
FLAME_ARG_ROW(flame_min, a.t("t"), a.in<int32_t>("dims", {0}), 1, 0, a.out_t("out"));
FLAME_ARG_ROW(flame_var, a.t("t"), a.in<int32_t>("dims", {0}), 1, 1.0, 0, a.out_t("out"));
FLAME_ARG_ROW(flame_std, a.t("t"), a.in<int32_t>("dims", {0}), 1, 1.0, 0, a.out_t("out"));
FLAME_ARG_ROW(flame_norm, a.t("t"), 2.0, a.in<int32_t>("dims", {0}), 1, 0, a.out_t("out"));
FLAME_ARG_ROW(flame_logsumexp, a.t("t"), a.in<int32_t>("dims", {0}), 1, 0, a.out_t("out"));
FLAME_ARG_ROW(flame_argmax, a.t("t"), 0, 0, a.out_t("out"));
FLAME_ARG_ROW(flame_argmin, a.t("t"), 0, 0, a.out_t("out"));
FLAME_ARG_ROW(flame_cumsum, a.t("t"), 0, a.out_t("out"));
FLAME_ARG_ROW(flame_sum_all, a.t("t"), a.out_t("out"));
FLAME_ARG_ROW(flame_max_all, a.t("t"), a.out_t("out"));
FLAME_ARG_ROW(flame_min_all, a.t("t"), a.out_t("out"));

// ---- autograd ----
FLAME_ARG_ROW(flame_tensor_set_requires_grad, a.t("t"), 1);
FLAME_ARG_ROW(flame_tensor_requires_grad, a.t("t"), a.out<int32_t>("requires_grad"));
FLAME_ARG_ROW(flame_tensor_is_leaf, a.t("t"), a.out<int32_t>("is_leaf"));
FLAME_ARG_ROW(flame_tensor_detach, a.t("t"), a.out_t("out"));
FLAME_ARG_ROW(flame_tensor_grad, a.t("t"), a.out_t("grad"));
FLAME_ARG_ROW(flame_tensor_set_grad, a.t("t"), a.opt_t("grad"));
FLAME_ARG_ROW(flame_tensor_zero_grad, a.t("t"));
FLAME_ARG_ROW(flame_tensor_retain_grad, a.t("t", grad_leaf()));
FLAME_ARG_ROW(flame_backward, a.ctx("ctx"), a.t("root", loss()), a.opt_t("grad", scalar()), 0);
FLAME_ARG_ROW(flame_grad, a.ctx("ctx"), a.ts("outputs", {loss()}), a.opt_ts("grad_outputs", {scalar()}), 1,
              a.ts("inputs", {loss_leaf()}), 1, 0, a.outs("results", 1));
FLAME_ARG_ROW(flame_ctx_set_grad_enabled, a.ctx("ctx"), 1, a.opt_out<int32_t>("previous"));
FLAME_ARG_ROW(flame_ctx_is_grad_enabled, a.ctx("ctx"), a.out<int32_t>("enabled"));
FLAME_ARG_ROW(flame_ctx_set_autocast, a.ctx("ctx"), static_cast<int32_t>(FLAME_DTYPE_BF16), a.opt_out<int32_t>("previous"));
FLAME_ARG_ROW(flame_ctx_set_log, a.ctx("ctx"), FLAME_LOG_WARNING, nullptr, nullptr);
FLAME_ARG_ROW(flame_ctx_get_autocast, a.ctx("ctx"), a.out<int32_t>("dtype"));
FLAME_ARG_ROW(flame_ctx_set_inference_mode, a.ctx("ctx"), 0, a.opt_out<int32_t>("previous"));
FLAME_ARG_ROW(flame_tensor_register_hook, a.t("t", grad_leaf()), a.fn("fn", &noop_hook), nullptr, nullptr,
              a.out_hook("hook"));
FLAME_ARG_ROW(flame_tensor_register_post_accumulate_grad_hook, a.t("t", grad_leaf()), a.fn("fn", &noop_post_hook),
              nullptr, nullptr, a.out_hook("hook"));
FLAME_ARG_VOID(flame_hook_remove, a.release_hook("hook"));

}  // namespace

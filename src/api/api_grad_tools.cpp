// C entry points of the fused gradient tools on tensor lists (toolkit/grad_tools.h).
#include <cmath>
#include "api/guard.h"
#include "api/toolkit_args.h"
#include "ops/ops.h"
#include "toolkit/grad_tools.h"

using namespace flame;

namespace {

// Locks ctx, checks it, and returns the tensors of the list (checked for the tools).
std::vector<Tensor> tool_list(Context& c, const flame_tensor_t* tensors, int64_t n, bool inplace) {
  std::vector<Tensor> ts = tensor_list(tensors, n, "tensors");
  toolkit::check_tensor_list(c, ts, "tensors", inplace);
  return ts;
}

void check_real(double v, const char* name) {
  FLAME_CHECK(std::isfinite(v) && v >= 0, FLAME_ERROR_INVALID_ARGUMENT, name, " must be finite and >= 0, got ", v);
}

}  // namespace

extern "C" {

FLAME_API flame_status_t flame_grad_normalize(flame_ctx_t ctx, const flame_tensor_t* tensors, int64_t n, double target_norm,
                                             double eps) {
  return api_call("flame_grad_normalize", [&] {
    Context& c = context_of(ctx);
    check_real(target_norm, "target_norm");
    check_real(eps, "eps");
    LiveScope scope(c);
    toolkit::normalize(c, tool_list(c, tensors, n, true), target_norm, eps);
  });
}

FLAME_API flame_status_t flame_grad_add_noise(flame_ctx_t ctx, const flame_tensor_t* tensors, int64_t n, double std_dev) {
  return api_call("flame_grad_add_noise", [&] {
    Context& c = context_of(ctx);
    check_real(std_dev, "std_dev");
    LiveScope scope(c);
    toolkit::add_noise(c, tool_list(c, tensors, n, true), std_dev);
  });
}

FLAME_API flame_status_t flame_grad_stats(flame_ctx_t ctx, const flame_tensor_t* tensors, int64_t n, flame_tensor_t* out) {
  return api_call("flame_grad_stats", [&] {
    out_param(out, "out");
    Context& c = context_of(ctx);
    LiveScope scope(c);
    *out = wrap(toolkit::stats(c, tool_list(c, tensors, n, false)));
  });
}

FLAME_API flame_status_t flame_grad_stats_host(flame_ctx_t ctx, const flame_tensor_t* tensors, int64_t n, double* values,
                                              int64_t capacity) {
  return api_call("flame_grad_stats_host", [&] {
    Context& c = context_of(ctx);
    FLAME_CHECK(values, FLAME_ERROR_INVALID_ARGUMENT, "values is NULL");
    FLAME_CHECK(n < 0 || capacity / toolkit::kStatColumns > n, FLAME_ERROR_INVALID_ARGUMENT, "capacity ", capacity,
                " holds fewer than n + 1 = ", n + 1, " rows of FLAME_STAT_COLUMNS values");
    LiveScope scope(c);
    Tensor s = toolkit::stats(c, tool_list(c, tensors, n, false));
    ops::to_host(s, values, static_cast<size_t>(s->numel()) * sizeof(double));
  });
}

}  // extern "C"

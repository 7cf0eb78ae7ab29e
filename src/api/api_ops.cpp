// C entry points of the elementwise ops (generated from the op list) and of the reductions.
#include <cmath>
#include "api/autocast.h"
#include "api/guard.h"
#include "ops/ops.h"

using namespace flame;

namespace {

std::vector<int> dims_arg(const int32_t* dims, int32_t n) {
  FLAME_CHECK(n >= 0 && n <= FLAME_MAX_DIMS, FLAME_ERROR_INVALID_ARGUMENT, "ndims ", n, " is not in [0, ", FLAME_MAX_DIMS, "]");
  FLAME_CHECK(dims || n == 0, FLAME_ERROR_INVALID_ARGUMENT, "dims is NULL");
  return std::vector<int>(dims, dims + n);
}

void check_finite(double v, const char* name) {
  FLAME_CHECK(std::isfinite(v), FLAME_ERROR_INVALID_ARGUMENT, name, " must be finite, got ", v);
}

}  // namespace

extern "C" {

#define FLAME_UNARY_ENTRY(Id, name, ...)                                                        \
  FLAME_API flame_status_t flame_##name(flame_tensor_t t, flame_tensor_t* out) {                \
    return tensor_op("flame_" #name, {{t, "t"}}, out, [](const Tensor& x) { return ops::unary(OpId::Id, x); }); \
  }
FLAME_UNARY_OPS(FLAME_UNARY_ENTRY)
#undef FLAME_UNARY_ENTRY

#define FLAME_SCALAR_ENTRY(Id, name, ...)                                                               \
  FLAME_API flame_status_t flame_##name(flame_tensor_t t, double s, flame_tensor_t* out) {              \
    return tensor_op("flame_" #name, {{t, "t"}}, out, [&](const Tensor& x) { return ops::unary(OpId::Id, x, s); });    \
  }
FLAME_SCALAR_OPS(FLAME_SCALAR_ENTRY)
#undef FLAME_SCALAR_ENTRY

#define FLAME_BINARY_ENTRY(Id, name, ...)                                                                  \
  FLAME_API flame_status_t flame_##name(flame_tensor_t a, flame_tensor_t b, flame_tensor_t* out) {         \
    return tensor_op("flame_" #name, {{a, "a"}, {b, "b"}}, out, [](const Tensor& x, const Tensor& y) { return ops::binary(OpId::Id, x, y); }); \
  }
FLAME_BINARY_OPS(FLAME_BINARY_ENTRY)
#undef FLAME_BINARY_ENTRY

FLAME_API flame_status_t flame_div_scalar(flame_tensor_t t, double s, flame_tensor_t* out) {
  return tensor_op("flame_div_scalar", {{t, "t"}}, out, [&](const Tensor& x) {
    Tensor f = is_floating(x->dtype) ? x : ops::to_dtype(x, FLAME_DTYPE_F32);  // true division
    return ops::unary(OpId::MulScalar, f, 1.0 / s);
  });
}
FLAME_API flame_status_t flame_gelu(flame_tensor_t t, int32_t approximate, flame_tensor_t* out) {
  return tensor_op("flame_gelu", {{t, "t"}}, out, [&](const Tensor& x) {
    FLAME_CHECK(approximate == 0 || approximate == 1, FLAME_ERROR_INVALID_ARGUMENT, "approximate must be 0 or 1, got ",
                approximate);
    return ops::unary(approximate ? OpId::GeluTanh : OpId::Gelu, x);
  });
}
FLAME_API flame_status_t flame_softplus(flame_tensor_t t, double beta, double threshold, flame_tensor_t* out) {
  return tensor_op("flame_softplus", {{t, "t"}}, out, [&](const Tensor& x) {
    check_finite(beta, "beta");
    FLAME_CHECK(beta != 0, FLAME_ERROR_INVALID_ARGUMENT, "beta must not be 0");
    return ops::unary(OpId::Softplus, x, beta, threshold);
  });
}
FLAME_API flame_status_t flame_clamp(flame_tensor_t t, double lo, double hi, flame_tensor_t* out) {
  return tensor_op("flame_clamp", {{t, "t"}}, out, [&](const Tensor& x) {
    FLAME_CHECK(!std::isnan(lo) && !std::isnan(hi), FLAME_ERROR_INVALID_ARGUMENT, "clamp bounds must not be NaN");
    FLAME_CHECK(lo <= hi, FLAME_ERROR_INVALID_ARGUMENT, "clamp: lo ", lo, " is above hi ", hi);
    return ops::unary(OpId::Clamp, x, lo, hi);
  });
}
FLAME_API flame_status_t flame_where(flame_tensor_t cond, flame_tensor_t a, flame_tensor_t b, flame_tensor_t* out) {
  return api_call("flame_where", [&] {
    out_param(out, "out");
    const Tensor& c = unwrap(cond, "cond");
    const Tensor& x = unwrap(a, "a");
    const Tensor& y = unwrap(b, "b");
    LiveScope s(x);
    *out = wrap(ops::where(c, x, y));
  });
}

// ---------------- reductions ----------------
#define FLAME_REDUCE_ENTRY(name, call)                                                                        \
  FLAME_API flame_status_t flame_##name(flame_tensor_t t, const int32_t* dims, int32_t ndims, int32_t keepdim, \
                                        flame_tensor_t* out) {                                                 \
    return tensor_op("flame_" #name, {{t, "t"}}, out, [&](const Tensor& x) { return call(x, dims_arg(dims, ndims), keepdim != 0); }); \
  }
// sum and mean run in f32 under autocast (api/autocast.h)
FLAME_REDUCE_ENTRY(sum, [](const Tensor& x, const std::vector<int32_t>& d, bool k) { return ops::sum(autocast_f32(x), d, k); })
FLAME_REDUCE_ENTRY(mean, [](const Tensor& x, const std::vector<int32_t>& d, bool k) { return ops::mean(autocast_f32(x), d, k); })
FLAME_REDUCE_ENTRY(prod, ops::prod)
FLAME_REDUCE_ENTRY(max, ops::amax)
FLAME_REDUCE_ENTRY(min, ops::amin)
FLAME_REDUCE_ENTRY(logsumexp, ops::logsumexp)
#undef FLAME_REDUCE_ENTRY

FLAME_API flame_status_t flame_var(flame_tensor_t t, const int32_t* dims, int32_t ndims, double correction, int32_t keepdim,
                                   flame_tensor_t* out) {
  return tensor_op("flame_var", {{t, "t"}}, out, [&](const Tensor& x) { return ops::var(x, dims_arg(dims, ndims), correction, keepdim != 0); });
}
FLAME_API flame_status_t flame_std(flame_tensor_t t, const int32_t* dims, int32_t ndims, double correction, int32_t keepdim,
                                   flame_tensor_t* out) {
  return tensor_op("flame_std", {{t, "t"}}, out, [&](const Tensor& x) { return ops::std(x, dims_arg(dims, ndims), correction, keepdim != 0); });
}
FLAME_API flame_status_t flame_norm(flame_tensor_t t, double p, const int32_t* dims, int32_t ndims, int32_t keepdim,
                                    flame_tensor_t* out) {
  return tensor_op("flame_norm", {{t, "t"}}, out, [&](const Tensor& x) { return ops::norm(x, p, dims_arg(dims, ndims), keepdim != 0); });
}
FLAME_API flame_status_t flame_argmax(flame_tensor_t t, int32_t dim, int32_t keepdim, flame_tensor_t* out) {
  return tensor_op("flame_argmax", {{t, "t"}}, out,
                   [&](const Tensor& x) { return ops::argmax(x, dim, dim == FLAME_DIM_ALL, keepdim != 0, true); });
}
FLAME_API flame_status_t flame_argmin(flame_tensor_t t, int32_t dim, int32_t keepdim, flame_tensor_t* out) {
  return tensor_op("flame_argmin", {{t, "t"}}, out,
                   [&](const Tensor& x) { return ops::argmax(x, dim, dim == FLAME_DIM_ALL, keepdim != 0, false); });
}
FLAME_API flame_status_t flame_cumsum(flame_tensor_t t, int32_t dim, flame_tensor_t* out) {
  return tensor_op("flame_cumsum", {{t, "t"}}, out, [&](const Tensor& x) { return ops::cumsum(x, dim); });
}
FLAME_API flame_status_t flame_sum_all(flame_tensor_t t, flame_tensor_t* out) {
  return tensor_op("flame_sum_all", {{t, "t"}}, out, [&](const Tensor& x) { return ops::sum(autocast_f32(x), {}, false); });
}
FLAME_API flame_status_t flame_max_all(flame_tensor_t t, flame_tensor_t* out) {
  return tensor_op("flame_max_all", {{t, "t"}}, out, [&](const Tensor& x) { return ops::amax(x, {}, false); });
}
FLAME_API flame_status_t flame_min_all(flame_tensor_t t, flame_tensor_t* out) {
  return tensor_op("flame_min_all", {{t, "t"}}, out, [&](const Tensor& x) { return ops::amin(x, {}, false); });
}

}  // extern "C"

// C entry points of the neural-network ops in ops/nn.h: softmax, log_softmax, layer_norm, rms_norm,
// group_norm, batch_norm. Argument checks that need the handles happen here (NULLs, contexts); the
// ops check shapes, dtypes and values.
#include <cmath>
#include "api/autocast.h"
#include "api/guard.h"
#include "ops/nn.h"

using namespace flame;

namespace {

// An optional tensor argument: NULL stays null; otherwise it must be valid and share x's context.
// Affine parameters follow x to f32 under autocast (`cast`); running statistics never do (they are
// updated in place).
Tensor optional_arg(flame_tensor_t h, const char* name, const Tensor& x, bool cast = true) {
  if (!h) return nullptr;
  const Tensor& t = unwrap(h, name);
  FLAME_CHECK(&t->ctx() == &x->ctx(), FLAME_ERROR_INVALID_ARGUMENT, name, " belongs to another context than x");
  return cast ? autocast_f32(t) : t;
}

Shape shape_arg(const int64_t* shape, int32_t n, const char* name) {
  FLAME_CHECK(n >= 1 && n <= FLAME_MAX_DIMS, FLAME_ERROR_INVALID_ARGUMENT, name, ": ", n, " dims is not in [1, ",
              FLAME_MAX_DIMS, "]");
  FLAME_CHECK(shape, FLAME_ERROR_INVALID_ARGUMENT, name, " is NULL");
  return Shape(shape, shape + n);
}

template <class F>
flame_status_t nn_call(const char* fn, flame_tensor_t x_handle, flame_tensor_t* out, F&& body) {
  return api_call(fn, [&] {
    out_param(out, "out");
    const Tensor& x = unwrap(x_handle, "x");
    TensorScope s(x);
    *out = wrap(body(autocast_f32(x)));
  });
}

}  // namespace

extern "C" {

FLAME_API flame_status_t flame_softmax(flame_tensor_t x, int32_t dim, flame_tensor_t* out) {
  return nn_call("flame_softmax", x, out, [&](const Tensor& t) { return ops::softmax(t, dim, false); });
}

FLAME_API flame_status_t flame_log_softmax(flame_tensor_t x, int32_t dim, flame_tensor_t* out) {
  return nn_call("flame_log_softmax", x, out, [&](const Tensor& t) { return ops::softmax(t, dim, true); });
}

FLAME_API flame_status_t flame_layer_norm(flame_tensor_t x, const int64_t* normalized_shape, int32_t ndims,
                                          flame_tensor_t weight, flame_tensor_t bias, double eps, flame_tensor_t* out) {
  return nn_call("flame_layer_norm", x, out, [&](const Tensor& t) {
    Shape ns = shape_arg(normalized_shape, ndims, "normalized_shape");
    return ops::layer_norm(t, ns, optional_arg(weight, "weight", t), optional_arg(bias, "bias", t), eps);
  });
}

FLAME_API flame_status_t flame_rms_norm(flame_tensor_t x, const int64_t* normalized_shape, int32_t ndims,
                                        flame_tensor_t weight, double eps, flame_tensor_t* out) {
  return nn_call("flame_rms_norm", x, out, [&](const Tensor& t) {
    Shape ns = shape_arg(normalized_shape, ndims, "normalized_shape");
    return ops::rms_norm(t, ns, optional_arg(weight, "weight", t), eps);
  });
}

FLAME_API flame_status_t flame_group_norm(flame_tensor_t x, int32_t num_groups, flame_tensor_t weight, flame_tensor_t bias,
                                          double eps, int32_t channels_last, flame_tensor_t* out) {
  return nn_call("flame_group_norm", x, out, [&](const Tensor& t) {
    FLAME_CHECK(channels_last == 0 || channels_last == 1, FLAME_ERROR_INVALID_ARGUMENT,
                "channels_last must be 0 or 1, got ", channels_last);
    return ops::group_norm(t, num_groups, optional_arg(weight, "weight", t), optional_arg(bias, "bias", t), eps,
                           channels_last != 0);
  });
}

FLAME_API flame_status_t flame_batch_norm(flame_tensor_t x, flame_tensor_t running_mean, flame_tensor_t running_var,
                                          flame_tensor_t weight, flame_tensor_t bias, int32_t training, double momentum,
                                          double eps, flame_tensor_t* out) {
  return nn_call("flame_batch_norm", x, out, [&](const Tensor& t) {
    return ops::batch_norm(t, optional_arg(running_mean, "running_mean", t, false),
                           optional_arg(running_var, "running_var", t, false),
                           optional_arg(weight, "weight", t), optional_arg(bias, "bias", t), training != 0, momentum, eps);
  });
}

}  // extern "C"

// C entry points of the neural-network ops in ops/nn.h: softmax, log_softmax, layer_norm, rms_norm,
// group_norm, batch_norm. Argument checks that need the handles happen here (NULLs, contexts); the
// ops check shapes, dtypes and values.
#include <cmath>
#include "api/autocast.h"
#include "api/guard.h"
#include "ops/nn.h"

using namespace flame;

namespace {

Shape shape_arg(const int64_t* shape, int32_t n, const char* name) {
  FLAME_CHECK(n >= 1 && n <= FLAME_MAX_DIMS, FLAME_ERROR_INVALID_ARGUMENT, name, ": ", n, " dims is not in [1, ",
              FLAME_MAX_DIMS, "]");
  FLAME_CHECK(shape, FLAME_ERROR_INVALID_ARGUMENT, name, " is NULL");
  return Shape(shape, shape + n);
}

}  // namespace

extern "C" {

FLAME_API flame_status_t flame_softmax(flame_tensor_t x, int32_t dim, flame_tensor_t* out) {
  return tensor_op("flame_softmax", {{x, "x"}}, out, [&](const Tensor& t) { return ops::softmax(autocast_f32(t), dim, false); });
}

FLAME_API flame_status_t flame_log_softmax(flame_tensor_t x, int32_t dim, flame_tensor_t* out) {
  return tensor_op("flame_log_softmax", {{x, "x"}}, out, [&](const Tensor& t) { return ops::softmax(autocast_f32(t), dim, true); });
}

FLAME_API flame_status_t flame_layer_norm(flame_tensor_t x, const int64_t* normalized_shape, int32_t ndims,
                                          flame_tensor_t weight, flame_tensor_t bias, double eps, flame_tensor_t* out) {
  return tensor_op("flame_layer_norm", {{x, "x"}, {weight, "weight", true}, {bias, "bias", true}}, out,
                   [&](const Tensor& t, const Tensor& w, const Tensor& b) {
    Shape ns = shape_arg(normalized_shape, ndims, "normalized_shape");
    return ops::layer_norm(autocast_f32(t), ns, autocast_f32(w), autocast_f32(b), eps);
  });
}

FLAME_API flame_status_t flame_rms_norm(flame_tensor_t x, const int64_t* normalized_shape, int32_t ndims,
                                        flame_tensor_t weight, double eps, flame_tensor_t* out) {
  return tensor_op("flame_rms_norm", {{x, "x"}, {weight, "weight", true}}, out, [&](const Tensor& t, const Tensor& w) {
    Shape ns = shape_arg(normalized_shape, ndims, "normalized_shape");
    return ops::rms_norm(autocast_f32(t), ns, autocast_f32(w), eps);
  });
}

FLAME_API flame_status_t flame_group_norm(flame_tensor_t x, int32_t num_groups, flame_tensor_t weight, flame_tensor_t bias,
                                          double eps, int32_t channels_last, flame_tensor_t* out) {
  return tensor_op("flame_group_norm", {{x, "x"}, {weight, "weight", true}, {bias, "bias", true}}, out,
                   [&](const Tensor& t, const Tensor& w, const Tensor& b) {
    FLAME_CHECK(channels_last == 0 || channels_last == 1, FLAME_ERROR_INVALID_ARGUMENT,
                "channels_last must be 0 or 1, got ", channels_last);
    return ops::group_norm(autocast_f32(t), num_groups, autocast_f32(w), autocast_f32(b), eps, channels_last != 0);
  });
}

FLAME_API flame_status_t flame_batch_norm(flame_tensor_t x, flame_tensor_t running_mean, flame_tensor_t running_var,
                                          flame_tensor_t weight, flame_tensor_t bias, int32_t training, double momentum,
                                          double eps, flame_tensor_t* out) {
  // Affine parameters follow x to f32 under autocast; the running statistics never do (they are
  // updated in place).
  return tensor_op("flame_batch_norm",
                   {{x, "x"}, {running_mean, "running_mean", true}, {running_var, "running_var", true},
                    {weight, "weight", true}, {bias, "bias", true}},
                   out, [&](const Tensor& t, const Tensor& rm, const Tensor& rv, const Tensor& w, const Tensor& b) {
                     return ops::batch_norm(autocast_f32(t), rm, rv, autocast_f32(w), autocast_f32(b), training != 0,
                                            momentum, eps);
                   });
}

}  // extern "C"

// C entry points of the losses (ops/loss.h): argument checks, then one call each.
#include <cmath>
#include "api/autocast.h"
#include "api/guard.h"
#include "ops/loss.h"

using namespace flame;

namespace {

ops::Reduction reduction_arg(flame_reduction_t r) {
  FLAME_CHECK(r == FLAME_REDUCTION_NONE || r == FLAME_REDUCTION_MEAN || r == FLAME_REDUCTION_SUM, FLAME_ERROR_INVALID_ARGUMENT,
              "reduction ", static_cast<int>(r), " is not FLAME_REDUCTION_NONE, _MEAN or _SUM");
  return static_cast<ops::Reduction>(r);
}

}  // namespace

extern "C" {

FLAME_API flame_status_t flame_cross_entropy(flame_tensor_t logits, flame_tensor_t target, flame_tensor_t weight,
                                             int64_t ignore_index, double label_smoothing, flame_reduction_t reduction,
                                             flame_tensor_t* out) {
  // Under autocast the f16/bf16 logits are not copied to f32: the kernels compute in f32 from them and
  // the loss comes back in f32, as if they had been (GPT-2's 8192 x 50304 head: a 1.6 GB copy saved).
  // The other tensors follow to f32 under autocast (api/autocast.h), as the losses compute there.
  return tensor_op("flame_cross_entropy", {{logits, "logits"}, {target, "target"}, {weight, "weight", true}}, out,
                   [&](const Tensor& x, const Tensor& t, const Tensor& w) {
                     FLAME_CHECK(std::isfinite(label_smoothing), FLAME_ERROR_INVALID_ARGUMENT, "label_smoothing must be finite");
                     return ops::cross_entropy(x, autocast_f32(t), autocast_f32(w), ignore_index, label_smoothing,
                                               reduction_arg(reduction), x->ctx().mode.autocast >= 0);
                   });
}

FLAME_API flame_status_t flame_nll_loss(flame_tensor_t input, flame_tensor_t target, flame_tensor_t weight,
                                        int64_t ignore_index, flame_reduction_t reduction, flame_tensor_t* out) {
  return tensor_op("flame_nll_loss", {{input, "input"}, {target, "target"}, {weight, "weight", true}}, out,
                   [&](const Tensor& x, const Tensor& t, const Tensor& w) {
                     return ops::nll_loss(autocast_f32(x), autocast_f32(t), autocast_f32(w), ignore_index,
                                          reduction_arg(reduction));
                   });
}

FLAME_API flame_status_t flame_mse_loss(flame_tensor_t input, flame_tensor_t target, flame_reduction_t reduction,
                                        flame_tensor_t* out) {
  return tensor_op("flame_mse_loss", {{input, "input"}, {target, "target"}}, out, [&](const Tensor& x, const Tensor& t) {
    return ops::mse_loss(autocast_f32(x), autocast_f32(t), reduction_arg(reduction));
  });
}

FLAME_API flame_status_t flame_l1_loss(flame_tensor_t input, flame_tensor_t target, flame_reduction_t reduction,
                                       flame_tensor_t* out) {
  return tensor_op("flame_l1_loss", {{input, "input"}, {target, "target"}}, out, [&](const Tensor& x, const Tensor& t) {
    return ops::l1_loss(autocast_f32(x), autocast_f32(t), reduction_arg(reduction));
  });
}

FLAME_API flame_status_t flame_smooth_l1_loss(flame_tensor_t input, flame_tensor_t target, double beta,
                                              flame_reduction_t reduction, flame_tensor_t* out) {
  return tensor_op("flame_smooth_l1_loss", {{input, "input"}, {target, "target"}}, out, [&](const Tensor& x, const Tensor& t) {
    return ops::smooth_l1_loss(autocast_f32(x), autocast_f32(t), beta, reduction_arg(reduction));
  });
}

FLAME_API flame_status_t flame_huber_loss(flame_tensor_t input, flame_tensor_t target, double delta,
                                          flame_reduction_t reduction, flame_tensor_t* out) {
  return tensor_op("flame_huber_loss", {{input, "input"}, {target, "target"}}, out, [&](const Tensor& x, const Tensor& t) {
    return ops::huber_loss(autocast_f32(x), autocast_f32(t), delta, reduction_arg(reduction));
  });
}

FLAME_API flame_status_t flame_binary_cross_entropy_with_logits(flame_tensor_t logits, flame_tensor_t target,
                                                                flame_tensor_t weight, flame_tensor_t pos_weight,
                                                                flame_reduction_t reduction, flame_tensor_t* out) {
  return tensor_op("flame_binary_cross_entropy_with_logits",
                   {{logits, "logits"}, {target, "target"}, {weight, "weight", true}, {pos_weight, "pos_weight", true}}, out,
                   [&](const Tensor& x, const Tensor& t, const Tensor& w, const Tensor& pw) {
                     return ops::binary_cross_entropy_with_logits(autocast_f32(x), autocast_f32(t), autocast_f32(w),
                                                                  autocast_f32(pw), reduction_arg(reduction));
                   });
}

}  // extern "C"

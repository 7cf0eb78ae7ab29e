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

// An optional tensor argument: NULL gives a null Tensor, anything else must be a live handle (in f32
// under autocast, as the losses compute there).
Tensor optional_arg(flame_tensor_t h, const char* name) { return h ? autocast_f32(unwrap(h, name)) : nullptr; }

void same_context(const Tensor& a, const Tensor& b, const char* name) {
  FLAME_CHECK(!b || &a->ctx() == &b->ctx(), FLAME_ERROR_INVALID_ARGUMENT, name, " belongs to another context");
}

// The common shape of the losses: two required tensors, optional ones, a reduction. keep_low_x: the
// first tensor is passed as it is (f16/bf16 under autocast too), f gets whether autocast is on.
template <class F>
flame_status_t loss_call(const char* fn, flame_tensor_t a, const char* a_name, flame_tensor_t b, const char* b_name,
                         flame_tensor_t* out, F&& f, bool keep_low_x = false) {
  return api_call(fn, [&] {
    out_param(out, "out");
    const Tensor& x = unwrap(a, a_name);
    const Tensor& y = unwrap(b, b_name);
    same_context(x, y, b_name);
    TensorScope s(x);
    *out = wrap(f(keep_low_x ? x : autocast_f32(x), autocast_f32(y), x->ctx().mode.autocast >= 0));
  });
}

}  // namespace

extern "C" {

FLAME_API flame_status_t flame_cross_entropy(flame_tensor_t logits, flame_tensor_t target, flame_tensor_t weight,
                                             int64_t ignore_index, double label_smoothing, flame_reduction_t reduction,
                                             flame_tensor_t* out) {
  // Under autocast the f16/bf16 logits are not copied to f32: the kernels compute in f32 from them and
  // the loss comes back in f32, as if they had been (GPT-2's 8192 x 50304 head: a 1.6 GB copy saved).
  return loss_call(
      "flame_cross_entropy", logits, "logits", target, "target", out,
      [&](const Tensor& x, const Tensor& t, bool autocast) {
        Tensor w = optional_arg(weight, "weight");
        same_context(x, w, "weight");
        FLAME_CHECK(std::isfinite(label_smoothing), FLAME_ERROR_INVALID_ARGUMENT, "label_smoothing must be finite");
        return ops::cross_entropy(x, t, w, ignore_index, label_smoothing, reduction_arg(reduction), autocast);
      },
      true);
}

FLAME_API flame_status_t flame_nll_loss(flame_tensor_t input, flame_tensor_t target, flame_tensor_t weight,
                                        int64_t ignore_index, flame_reduction_t reduction, flame_tensor_t* out) {
  return loss_call("flame_nll_loss", input, "input", target, "target", out, [&](const Tensor& x, const Tensor& t, bool) {
    Tensor w = optional_arg(weight, "weight");
    same_context(x, w, "weight");
    return ops::nll_loss(x, t, w, ignore_index, reduction_arg(reduction));
  });
}

FLAME_API flame_status_t flame_mse_loss(flame_tensor_t input, flame_tensor_t target, flame_reduction_t reduction,
                                        flame_tensor_t* out) {
  return loss_call("flame_mse_loss", input, "input", target, "target", out,
                   [&](const Tensor& x, const Tensor& t, bool) { return ops::mse_loss(x, t, reduction_arg(reduction)); });
}

FLAME_API flame_status_t flame_l1_loss(flame_tensor_t input, flame_tensor_t target, flame_reduction_t reduction,
                                       flame_tensor_t* out) {
  return loss_call("flame_l1_loss", input, "input", target, "target", out,
                   [&](const Tensor& x, const Tensor& t, bool) { return ops::l1_loss(x, t, reduction_arg(reduction)); });
}

FLAME_API flame_status_t flame_smooth_l1_loss(flame_tensor_t input, flame_tensor_t target, double beta,
                                              flame_reduction_t reduction, flame_tensor_t* out) {
  return loss_call("flame_smooth_l1_loss", input, "input", target, "target", out, [&](const Tensor& x, const Tensor& t, bool) {
    return ops::smooth_l1_loss(x, t, beta, reduction_arg(reduction));
  });
}

FLAME_API flame_status_t flame_huber_loss(flame_tensor_t input, flame_tensor_t target, double delta,
                                          flame_reduction_t reduction, flame_tensor_t* out) {
  return loss_call("flame_huber_loss", input, "input", target, "target", out, [&](const Tensor& x, const Tensor& t, bool) {
    return ops::huber_loss(x, t, delta, reduction_arg(reduction));
  });
}

FLAME_API flame_status_t flame_binary_cross_entropy_with_logits(flame_tensor_t logits, flame_tensor_t target,
                                                                flame_tensor_t weight, flame_tensor_t pos_weight,
                                                                flame_reduction_t reduction, flame_tensor_t* out) {
  return loss_call("flame_binary_cross_entropy_with_logits", logits, "logits", target, "target", out,
                   [&](const Tensor& x, const Tensor& t, bool) {
                     Tensor w = optional_arg(weight, "weight"), pw = optional_arg(pos_weight, "pos_weight");
                     same_context(x, w, "weight");
                     same_context(x, pw, "pos_weight");
                     return ops::binary_cross_entropy_with_logits(x, t, w, pw, reduction_arg(reduction));
                   });
}

}  // extern "C"

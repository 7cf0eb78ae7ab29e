// C entry points of the loss scaler (toolkit/grad_scaler.h). The handle owns a shared GradScaler;
// a released handle is emptied and parked in its context's dead_objects (as optimizers), so that
// passing it again reports FLAME_ERROR_INVALID_HANDLE while the context lives.
#include "api/guard.h"
#include "api/toolkit_args.h"
#include "optim/optimizer.h"
#include "toolkit/grad_scaler.h"

using namespace flame;

constexpr uint64_t kScalerMagic = 0xF1A3E5CA1E000001ull;

struct flame_grad_scaler_s {
  uint64_t magic;
  std::shared_ptr<GradScaler> s;
};

namespace {

GradScaler& unwrap_scaler(flame_grad_scaler_t s) {
  FLAME_CHECK(s, FLAME_ERROR_INVALID_ARGUMENT, "scaler is NULL");
  FLAME_CHECK(s->magic == kScalerMagic && s->s, FLAME_ERROR_INVALID_HANDLE,
              "scaler is not a live grad scaler (released already?)");
  return *s->s;
}

}  // namespace

extern "C" {

FLAME_API flame_status_t flame_grad_scaler_options_init(flame_grad_scaler_options_t* o) {
  return api_call("flame_grad_scaler_options_init", [&] {
    FLAME_CHECK(o, FLAME_ERROR_INVALID_ARGUMENT, "opts is NULL");
    *o = flame_grad_scaler_options_t{};
    o->struct_size = sizeof(flame_grad_scaler_options_t);
    o->init_scale = 65536.0;
    o->growth_factor = 2.0;
    o->backoff_factor = 0.5;
    o->growth_interval = 2000;
    o->enabled = 1;
  });
}

FLAME_API flame_status_t flame_grad_scaler_create(flame_ctx_t ctx, const flame_grad_scaler_options_t* opts,
                                                  flame_grad_scaler_t* out) {
  return api_call("flame_grad_scaler_create", [&] {
    out_param(out, "out");
    Context& c = context_of(ctx);
    flame_grad_scaler_options_t o;
    if (opts) {
      o = *opts;
    } else {
      flame_grad_scaler_options_init(&o);
    }
    validate_grad_scaler_options(o);
    LiveScope scope(c);
    *out = new flame_grad_scaler_s{kScalerMagic, std::make_shared<GradScaler>(c, o)};
  });
}

FLAME_API void flame_grad_scaler_release(flame_grad_scaler_t s) {
  if (!s || s->magic != kScalerMagic || !s->s) return;
  std::shared_ptr<Context> keep = s->s->ctx().shared_from_this();
  std::lock_guard<std::recursive_mutex> lock(keep->mutex);
  keep->bind();
  s->magic = kDeadMagic;
  s->s.reset();
  try {
    keep->dead_objects.push_back(std::shared_ptr<flame_grad_scaler_s>(s));
    if (keep->dead_objects.size() > 4096) keep->dead_objects.pop_front();
  } catch (...) {  // out of host memory: shared_ptr's constructor deleted the handle
  }
}

FLAME_API flame_status_t flame_grad_scaler_scale(flame_grad_scaler_t s, flame_tensor_t loss, flame_tensor_t* out) {
  if (out) *out = nullptr;
  return api_call("flame_grad_scaler_scale", [&] {
    GradScaler& g = unwrap_scaler(s);
    LiveScope live(g.ctx());
    out_param(out, "out");
    const Tensor& l = unwrap(loss, "loss");
    *out = same_or_wrap(loss, g.scale(l));
  });
}

FLAME_API flame_status_t flame_grad_scaler_unscale(flame_grad_scaler_t s, flame_optimizer_t opt) {
  return api_call("flame_grad_scaler_unscale", [&] {
    GradScaler& g = unwrap_scaler(s);
    LiveScope live(g.ctx());
    g.unscale(optimizer_ref(opt));
  });
}

FLAME_API flame_status_t flame_grad_scaler_unscale_tensors(flame_grad_scaler_t s, const flame_tensor_t* tensors, int64_t n) {
  return api_call("flame_grad_scaler_unscale_tensors", [&] {
    GradScaler& g = unwrap_scaler(s);
    LiveScope live(g.ctx());
    g.unscale_tensors(tensor_list(tensors, n, "tensors"));
  });
}

FLAME_API flame_status_t flame_grad_scaler_step(flame_grad_scaler_t s, flame_optimizer_t opt, int32_t* stepped) {
  if (stepped) *stepped = 0;
  return api_call("flame_grad_scaler_step", [&] {
    GradScaler& g = unwrap_scaler(s);
    LiveScope live(g.ctx());
    const bool ran = g.step(optimizer_ref(opt));
    if (stepped) *stepped = ran ? 1 : 0;
  });
}

FLAME_API flame_status_t flame_grad_scaler_update(flame_grad_scaler_t s) {
  return api_call("flame_grad_scaler_update", [&] {
    GradScaler& g = unwrap_scaler(s);
    LiveScope live(g.ctx());
    g.update();
  });
}

FLAME_API flame_status_t flame_grad_scaler_get_scale(flame_grad_scaler_t s, double* scale) {
  if (scale) *scale = 0;
  return api_call("flame_grad_scaler_get_scale", [&] {
    GradScaler& g = unwrap_scaler(s);
    LiveScope live(g.ctx());
    FLAME_CHECK(scale, FLAME_ERROR_INVALID_ARGUMENT, "scale is NULL");
    *scale = g.get_scale();
  });
}

FLAME_API flame_status_t flame_grad_scaler_found_inf(flame_grad_scaler_t s, flame_tensor_t* out) {
  if (out) *out = nullptr;
  return api_call("flame_grad_scaler_found_inf", [&] {
    GradScaler& g = unwrap_scaler(s);
    LiveScope live(g.ctx());
    out_param(out, "out");
    *out = wrap(g.found_inf());
  });
}

FLAME_API flame_status_t flame_grad_scaler_get_state(flame_grad_scaler_t s, double* scale, int64_t* growth_tracker) {
  return api_call("flame_grad_scaler_get_state", [&] {
    GradScaler& g = unwrap_scaler(s);
    LiveScope live(g.ctx());
    FLAME_CHECK(scale, FLAME_ERROR_INVALID_ARGUMENT, "scale is NULL");
    FLAME_CHECK(growth_tracker, FLAME_ERROR_INVALID_ARGUMENT, "growth_tracker is NULL");
    g.get_state(scale, growth_tracker);
  });
}

FLAME_API flame_status_t flame_grad_scaler_set_state(flame_grad_scaler_t s, double scale, int64_t growth_tracker) {
  return api_call("flame_grad_scaler_set_state", [&] {
    GradScaler& g = unwrap_scaler(s);
    LiveScope live(g.ctx());
    g.set_state(scale, growth_tracker);
  });
}

}  // extern "C"

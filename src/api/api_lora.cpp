// C entry points of the LoRA adapters (toolkit/lora.h). The handle owns a shared Lora; a released
// handle is emptied and parked in its context's dead_objects (as optimizers and loss scalers).
#include "api/guard.h"
#include "toolkit/lora.h"

using namespace flame;

constexpr uint64_t kLoraMagic = 0xF1A3E10EA0000001ull;

struct flame_lora_s {
  uint64_t magic;
  std::shared_ptr<Lora> l;
};

namespace {

Lora& unwrap_lora(flame_lora_t l) {
  FLAME_CHECK(l, FLAME_ERROR_INVALID_ARGUMENT, "lora is NULL");
  FLAME_CHECK(l->magic == kLoraMagic && l->l, FLAME_ERROR_INVALID_HANDLE, "lora is not a live LoRA adapter (released already?)");
  return *l->l;
}

}  // namespace

extern "C" {

FLAME_API flame_status_t flame_lora_create(flame_tensor_t weight, flame_tensor_t bias, int64_t rank, double alpha, flame_lora_t* out) {
  return api_call("flame_lora_create", [&] {
    out_param(out, "out");
    const Tensor& w = unwrap(weight, "weight");
    Tensor b = bias ? unwrap(bias, "bias") : Tensor();
    LiveScope scope(w);
    *out = new flame_lora_s{kLoraMagic, std::make_shared<Lora>(w, b, rank, alpha)};
  });
}

FLAME_API void flame_lora_release(flame_lora_t l) {
  if (!l || l->magic != kLoraMagic || !l->l) return;
  std::shared_ptr<Context> keep = l->l->ctx().shared_from_this();
  std::lock_guard<std::recursive_mutex> lock(keep->mutex);
  keep->bind();
  l->magic = kDeadMagic;
  l->l.reset();
  try {
    keep->dead_objects.push_back(std::shared_ptr<flame_lora_s>(l));
    if (keep->dead_objects.size() > 4096) keep->dead_objects.pop_front();
  } catch (...) {  // out of host memory: shared_ptr's constructor deleted the handle
  }
}

FLAME_API flame_status_t flame_lora_forward(flame_lora_t l, flame_tensor_t x, flame_tensor_t* out) {
  if (out) *out = nullptr;
  return api_call("flame_lora_forward", [&] {
    Lora& a = unwrap_lora(l);
    LiveScope live(a.ctx());
    out_param(out, "out");
    *out = wrap(a.forward(unwrap(x, "x")));
  });
}

FLAME_API flame_status_t flame_lora_adapters(flame_lora_t l, flame_tensor_t* a_out, flame_tensor_t* b_out) {
  if (a_out) *a_out = nullptr;
  if (b_out) *b_out = nullptr;
  return api_call("flame_lora_adapters", [&] {
    Lora& a = unwrap_lora(l);
    LiveScope live(a.ctx());
    out_param(a_out, "a");
    out_param(b_out, "b");
    *a_out = wrap(a.a());
    *b_out = wrap(a.b());
  });
}

FLAME_API flame_status_t flame_lora_merge(flame_lora_t l) {
  return api_call("flame_lora_merge", [&] {
    Lora& a = unwrap_lora(l);
    LiveScope live(a.ctx());
    a.merge();
  });
}

FLAME_API flame_status_t flame_lora_unmerge(flame_lora_t l) {
  return api_call("flame_lora_unmerge", [&] {
    Lora& a = unwrap_lora(l);
    LiveScope live(a.ctx());
    a.unmerge();
  });
}

FLAME_API flame_status_t flame_lora_is_merged(flame_lora_t l, int32_t* merged) {
  if (merged) *merged = 0;
  return api_call("flame_lora_is_merged", [&] {
    Lora& a = unwrap_lora(l);
    LiveScope live(a.ctx());
    FLAME_CHECK(merged, FLAME_ERROR_INVALID_ARGUMENT, "merged is NULL");
    *merged = a.merged() ? 1 : 0;
  });
}

}  // extern "C"

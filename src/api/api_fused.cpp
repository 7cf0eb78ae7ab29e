// C entry points of fused elementwise expressions (ops/fused.h). The handle owns a shared FusedFn
// (graph nodes share it too); a released handle is emptied and parked in its context's dead_objects
// (as LoRA adapters and loss scalers), so that using it again is detected.
#include "api/guard.h"
#include "ops/fused.h"

using namespace flame;

constexpr uint64_t kFusedMagic = 0xF1A3EF05ED000001ull;

struct flame_fused_s {
  uint64_t magic;
  std::shared_ptr<ops::FusedFn> f;
};

namespace {

ops::FusedFn& unwrap_fused(flame_fused_t fn) {
  FLAME_CHECK(fn, FLAME_ERROR_INVALID_ARGUMENT, "fn is NULL");
  FLAME_CHECK(fn->magic == kFusedMagic && fn->f, FLAME_ERROR_INVALID_HANDLE,
              "fn is not a live fused function (released already?)");
  return *fn->f;
}

}  // namespace

extern "C" {

FLAME_API flame_status_t flame_fused_compile(flame_ctx_t ctx, const char* expr, int32_t n_inputs, flame_fused_t* out) {
  return api_call("flame_fused_compile", [&] {
    out_param(out, "out");
    Context& c = context_of(ctx);
    FLAME_CHECK(expr, FLAME_ERROR_INVALID_ARGUMENT, "expr is NULL");
    ContextScope scope(c);
    *out = new flame_fused_s{kFusedMagic, ops::FusedFn::compile(c, expr, n_inputs)};
  });
}

FLAME_API flame_status_t flame_fused_call(flame_fused_t fn, const flame_tensor_t* inputs, int32_t n, flame_tensor_t* out) {
  return api_call("flame_fused_call", [&] {
    out_param(out, "out");
    ops::FusedFn& f = unwrap_fused(fn);
    FLAME_CHECK(inputs, FLAME_ERROR_INVALID_ARGUMENT, "inputs is NULL");
    FLAME_CHECK(n == f.n_inputs(), FLAME_ERROR_INVALID_ARGUMENT, "n is ", n, " but fn takes ", f.n_inputs(), " inputs");
    std::vector<Tensor> ts;
    for (int32_t k = 0; k < n; ++k) {
      const std::string name = "inputs[" + std::to_string(k) + "]";
      ts.push_back(unwrap(inputs[k], name.c_str()));
      FLAME_CHECK(&ts.back()->ctx() == &f.ctx(), FLAME_ERROR_INVALID_ARGUMENT, name,
                  " belongs to a different context than fn");
    }
    LiveScope scope(f.ctx());
    *out = wrap(f.call(ts));
  });
}

FLAME_API void flame_fused_release(flame_fused_t fn) {
  if (!fn || fn->magic != kFusedMagic || !fn->f) return;
  std::shared_ptr<Context> keep = fn->f->ctx().shared_from_this();
  std::lock_guard<std::recursive_mutex> lock(keep->mutex);
  keep->bind();
  fn->magic = kDeadMagic;
  fn->f.reset();
  try {
    keep->dead_objects.push_back(std::shared_ptr<flame_fused_s>(fn));
    if (keep->dead_objects.size() > 4096) keep->dead_objects.pop_front();
  } catch (...) {  // out of host memory: shared_ptr's constructor deleted the handle
  }
}

}  // extern "C"

// Tensor handles. A handle counts the caller's references to one Tensor. A released handle is
// marked dead and kept in its context's quarantine (the most recent 4096), so passing it again is
// reported as FLAME_ERROR_INVALID_HANDLE instead of touching freed memory, as long as the context
// lives. Handles are freed with the context. wrap() makes the handles FLAME calls return, recorded
// in the calling thread's innermost handle scope (api/api_scope.cpp); wrap_lent() those FLAME lends
// to callbacks and releases itself, never recorded.
#include "api/guard.h"

namespace flame {

constexpr size_t kQuarantine = 4096;

ContextHandles::~ContextHandles() {
  for (flame_tensor_s* h : dead) delete h;
}

ContextHandles& context_handles(Context& c) {
  if (!c.api_handles) c.api_handles = std::make_shared<ContextHandles>();
  return *static_cast<ContextHandles*>(c.api_handles.get());
}

ContextHandles* context_handles_if_any(Context& c) noexcept {
  return static_cast<ContextHandles*>(c.api_handles.get());
}

flame_tensor_t wrap_lent(Tensor t) {
  Context& ctx = t->ctx();
  {
    std::lock_guard<std::recursive_mutex> lock(ctx.mutex);
    context_handles(ctx);  // made now, so that retiring the handle later cannot fail
  }
  auto* h = new flame_tensor_s;
  ++ctx.live_tensors;
  h->magic = kTensorMagic;
  h->refs.store(1);
  h->t = std::move(t);
  return h;
}

flame_tensor_t wrap(Tensor t) {
  Context& ctx = t->ctx();
  flame_tensor_t h = wrap_lent(std::move(t));
  try {
    scope_record(ctx, h);  // api/api_scope.cpp: owned by the calling thread's innermost scope, if any
  } catch (...) {
    release_handle(h);
    throw;
  }
  return h;
}

const Tensor& unwrap_any(flame_tensor_t h, const char* arg) {
  FLAME_CHECK(h, FLAME_ERROR_INVALID_ARGUMENT, arg, " is NULL");
  FLAME_CHECK(h->magic == kTensorMagic && h->t, FLAME_ERROR_INVALID_HANDLE, arg,
              " is not a live tensor handle (released already?)");
  return h->t;
}

const Tensor& unwrap(flame_tensor_t h, const char* arg) {
  const Tensor& t = unwrap_any(h, arg);
  FLAME_CHECK(!holds_no_data(*t), FLAME_ERROR_INVALID_ARGUMENT, arg,
              " is a model parameter sharded over ranks (flame_zero_create stage 3): it holds no values of its own "
              "(flame_zero_gather_params gathers them)");
  return t;
}

void release_handle(flame_tensor_t h) noexcept {
  if (!h || h->magic != kTensorMagic) return;
  if (h->refs.fetch_sub(1) != 1) return;
  retire_handle(h);
}

void retire_handle(flame_tensor_t h) noexcept {
  std::shared_ptr<Context> keep = h->t->storage->ctx;  // the context outlives this function
  std::lock_guard<std::recursive_mutex> lock(keep->mutex);
  keep->bind();
  scope_forget(h);  // a handle its scope still owned: released by hand, its slot empties
  h->magic = kDeadMagic;
  h->t.reset();
  --keep->live_tensors;
  ContextHandles* handles = context_handles_if_any(*keep);  // made by wrap_lent
  if (!handles) {
    delete h;
    return;
  }
  try {
    handles->dead.push_back(h);
  } catch (...) {  // out of host memory: free it now (its reuse then goes undetected)
    delete h;
    return;
  }
  if (handles->dead.size() > kQuarantine) {
    delete handles->dead.front();
    handles->dead.pop_front();
  }
}

Context& context_of(flame_ctx_t ctx) {
  FLAME_CHECK(ctx, FLAME_ERROR_INVALID_ARGUMENT, "ctx is NULL");
  FLAME_CHECK(ctx->magic == kCtxMagic, FLAME_ERROR_INVALID_HANDLE, "ctx is not a live context (destroyed already?)");
  return *ctx->ctx;
}

}  // namespace flame

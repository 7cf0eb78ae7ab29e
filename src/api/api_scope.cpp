// C entry points: handle scopes (flame.h "Handle scopes").
//
// A scope is a vector of slots, one per handle it owns a reference of, in the order of making;
// each handle names its scope and slot (api/handles.h), so that a handle released by hand or kept leaves
// its slot empty in O(1) and ending the scope releases the non-empty slots. When more than half the
// slots of a large scope are empty, they are compacted (amortised O(1) per handle), so a long scope
// whose handles are released by hand does not grow without bound. The open scopes of each thread
// are a stack in the context's handle state (ContextHandles::open_scopes, api/handles.h); wrap()
// (api/handles.cpp) records a new handle in the innermost scope of the calling thread. Everything here runs under the context's lock.
//
// An ended scope is emptied, marked dead and parked in its context's dead_objects, so that passing
// it again reports FLAME_ERROR_INVALID_HANDLE while the context lives, as for other handles.
#include <algorithm>
#include <memory>
#include <thread>
#include <vector>
#include "api/guard.h"

namespace flame {
constexpr uint64_t kScopeMagic = 0xF1A3E5C0BE000001ull;
constexpr size_t kScopeDeadKept = 4096;   // as api_safetensors.cpp's dead_objects
constexpr size_t kScopeCompactMin = 256;  // slots below which a scope is never compacted
}  // namespace flame

struct flame_scope_s {
  uint64_t magic = flame::kDeadMagic;
  std::shared_ptr<flame::Context> ctx;  // held while open: the scope keeps its context alive
  std::thread::id thread;               // the thread that began it
  std::vector<flame_tensor_s*> slots;   // NULL where a handle was kept or released
  size_t held = 0;                      // non-NULL slots
};

using namespace flame;

namespace {

flame_scope_s& scope_of(flame_scope_t s) {
  FLAME_CHECK(s, FLAME_ERROR_INVALID_ARGUMENT, "scope is NULL");
  FLAME_CHECK(s->magic == kScopeMagic, FLAME_ERROR_INVALID_HANDLE, "scope is not an open scope (ended already?)");
  return *s;
}

void compact(flame_scope_s& s) {
  size_t n = 0;
  for (flame_tensor_s* h : s.slots) {
    if (!h) continue;
    h->scope_slot = n;
    s.slots[n++] = h;
  }
  s.slots.resize(n);
}

// Drops the reference h's scope owned, unless a concurrent release by hand already took the last
// one (that release then finishes the handle itself).
void release_scope_reference(flame_tensor_s* h) {
  int64_t r = h->refs.load();
  while (r > 0 && !h->refs.compare_exchange_weak(r, r - 1)) {
  }
  if (r == 1) retire_handle(h);
}

}  // namespace

namespace flame {

bool scope_open_here(Context& c) {
  std::lock_guard<std::recursive_mutex> lock(c.mutex);
  const ContextHandles* hs = context_handles_if_any(c);
  return hs && hs->open_scope_count != 0 && hs->open_scopes.count(std::this_thread::get_id()) != 0;
}

void scope_record(Context& c, flame_tensor_s* h) {
  std::lock_guard<std::recursive_mutex> lock(c.mutex);
  ContextHandles* hs = context_handles_if_any(c);
  if (!hs || hs->open_scope_count == 0) return;
  auto it = hs->open_scopes.find(std::this_thread::get_id());
  if (it == hs->open_scopes.end()) return;
  flame_scope_s* s = it->second.back();
  s->slots.push_back(h);  // may throw bad_alloc: the caller then releases h
  h->scope = s;
  h->scope_slot = s->slots.size() - 1;
  ++s->held;
}

void scope_forget(flame_tensor_s* h) noexcept {
  flame_scope_s* s = h->scope;
  if (!s) return;
  s->slots[h->scope_slot] = nullptr;
  h->scope = nullptr;
  --s->held;
  if (s->slots.size() >= kScopeCompactMin && s->held * 2 < s->slots.size()) compact(*s);
}

}  // namespace flame

extern "C" {

FLAME_API flame_status_t flame_scope_begin(flame_ctx_t ctx, flame_scope_t* scope) {
  return api_call("flame_scope_begin", [&] {
    out_param(scope, "scope");
    Context& c = context_of(ctx);
    std::lock_guard<std::recursive_mutex> lock(c.mutex);
    auto s = std::make_unique<flame_scope_s>();
    s->ctx = c.shared_from_this();
    s->thread = std::this_thread::get_id();
    ContextHandles& hs = context_handles(c);
    hs.open_scopes[s->thread].push_back(s.get());
    ++hs.open_scope_count;
    s->magic = kScopeMagic;
    *scope = s.release();
  });
}

FLAME_API flame_status_t flame_scope_end(flame_scope_t scope) {
  if (!scope) {
    clear_last_error();
    return FLAME_OK;
  }
  return api_call("flame_scope_end", [&] {
    flame_scope_s& s = scope_of(scope);
    std::shared_ptr<Context> keep = s.ctx;  // the context outlives this function
    Context& c = *keep;
    std::lock_guard<std::recursive_mutex> lock(c.mutex);
    ContextHandles& hs = context_handles(c);
    auto stack = hs.open_scopes.find(s.thread);
    FLAME_CHECK(stack != hs.open_scopes.end() && !stack->second.empty(), FLAME_ERROR_INTERNAL,
                "an open scope is missing from its thread's stack");
    const auto pos = std::find(stack->second.begin(), stack->second.end(), scope);
    FLAME_CHECK(pos != stack->second.end(), FLAME_ERROR_INTERNAL, "an open scope is missing from its thread's stack");
    const auto inner = stack->second.end() - pos - 1;
    FLAME_CHECK(inner == 0, FLAME_ERROR_INVALID_ARGUMENT, "scope is not the innermost scope of its thread: ", inner,
                " scope(s) begun after it are still open; end them first");
    // Allocate first (the parking place of the emptied handle); nothing below can fail.
    auto parked = std::make_shared<std::unique_ptr<flame_scope_s>>();
    c.dead_objects.push_back(nullptr);
    stack->second.pop_back();
    if (stack->second.empty()) hs.open_scopes.erase(stack);
    --hs.open_scope_count;
    std::vector<flame_tensor_s*> slots = std::move(s.slots);
    s.slots.clear();
    s.held = 0;
    s.magic = kDeadMagic;
    s.ctx.reset();
    parked->reset(scope);
    c.dead_objects.back() = std::move(parked);
    if (c.dead_objects.size() > kScopeDeadKept) c.dead_objects.pop_front();
    for (auto it = slots.rbegin(); it != slots.rend(); ++it) {
      flame_tensor_s* h = *it;
      if (!h) continue;
      h->scope = nullptr;
      release_scope_reference(h);
    }
  });
}

FLAME_API flame_status_t flame_scope_keep(flame_scope_t scope, flame_tensor_t t) {
  return api_call("flame_scope_keep", [&] {
    flame_scope_s& s = scope_of(scope);
    const Tensor& x = unwrap(t, "t");
    Context& c = *s.ctx;
    FLAME_CHECK(&x->ctx() == &c, FLAME_ERROR_INVALID_ARGUMENT, "t belongs to another context than scope");
    std::lock_guard<std::recursive_mutex> lock(c.mutex);
    FLAME_CHECK(t->scope == scope, FLAME_ERROR_INVALID_ARGUMENT,
                t->scope ? "t is held by another scope, not by scope"
                         : "t is not held by scope (made outside it, or kept or released already)");
    scope_forget(t);
  });
}

FLAME_API flame_status_t flame_scope_count(flame_scope_t scope, int64_t* count) {
  return api_call("flame_scope_count", [&] {
    auto* out = out_param(count, "count");
    flame_scope_s& s = scope_of(scope);
    std::lock_guard<std::recursive_mutex> lock(s.ctx->mutex);
    *out = static_cast<int64_t>(s.held);
  });
}

}  // extern "C"

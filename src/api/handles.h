// Tensor handles, the C ABI's view of a Tensor: only the API layer makes, reads and releases them
// (handles.cpp, api_scope.cpp). Layers below know tensors only; where they call user code, they
// take a C++ callable and the API layer adapts the C callback (lending handles) to it.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <thread>
#include <unordered_map>
#include <vector>
#include "flame.h"
#include "tensor/tensor.h"

// The C handle: a reference count of the caller's references to one Tensor. A handle made while a
// handle scope was open on the calling thread (api/api_scope.cpp) has one of its references owned
// by that scope: scope is the scope and scope_slot its index there (both guarded by the context's
// lock); NULL once the scope ended, kept it, or the handle died.
struct flame_tensor_s {
  uint64_t magic;
  std::atomic<int64_t> refs;
  flame::Tensor t;
  flame_scope_s* scope = nullptr;
  size_t scope_slot = 0;
};

namespace flame {
constexpr uint64_t kTensorMagic = 0xF1A3E7E450000001ull;

// The tensor-handle state of one context (Context::api_handles), guarded by the context's lock.
struct ContextHandles {
  // Released handles, kept readable (marked dead) so that passing one again is reported as
  // FLAME_ERROR_INVALID_HANDLE instead of touching freed memory: the most recent 4096, freed with
  // the context.
  std::deque<flame_tensor_s*> dead;
  // Handle scopes (api_scope.cpp): the scopes open on each thread, innermost last, and their total,
  // so that making a handle while none is open costs one comparison.
  std::unordered_map<std::thread::id, std::vector<flame_scope_s*>> open_scopes;
  size_t open_scope_count = 0;
  ContextHandles() = default;
  ContextHandles(const ContextHandles&) = delete;
  ContextHandles& operator=(const ContextHandles&) = delete;
  ~ContextHandles();
};
// The context's handle state, made on first use (may throw bad_alloc); null from the one that
// does not make it when none was made yet.
ContextHandles& context_handles(Context& c);
ContextHandles* context_handles_if_any(Context& c) noexcept;

// Wraps a tensor in a new handle (one reference) returned to the caller of an entry point: it is
// recorded in the calling thread's innermost handle scope of the tensor's context, if one is open.
flame_tensor_t wrap(Tensor t);
// A new handle FLAME lends to a callback and releases itself (never recorded in a scope).
flame_tensor_t wrap_lent(Tensor t);
// The tensor of a handle; throws FLAME_ERROR_INVALID_ARGUMENT (NULL) or _INVALID_HANDLE naming arg,
// and FLAME_ERROR_INVALID_ARGUMENT for a parameter whose values are sharded over ranks (it holds
// no memory: holds_no_data).
const Tensor& unwrap(flame_tensor_t h, const char* arg);
// The same without the sharded check: for entry points that read only a tensor's geometry and
// autograd flags (shape, dtype, requires_grad, ...), which a sharded parameter keeps.
const Tensor& unwrap_any(flame_tensor_t h, const char* arg);
void release_handle(flame_tensor_t h) noexcept;
// The end of a handle whose last reference went: empties its scope slot, parks it (handles.cpp).
void retire_handle(flame_tensor_t h) noexcept;
// Handle scopes (api/api_scope.cpp): whether one is open on the calling thread for c; records h
// in the innermost one (may throw bad_alloc); empties h's slot in its scope (context lock held).
bool scope_open_here(Context& c);
void scope_record(Context& c, flame_tensor_t h);
void scope_forget(flame_tensor_t h) noexcept;
}  // namespace flame

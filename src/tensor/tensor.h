// Tensors: a reference-counted Storage (device memory from the context's pool, plus the version
// counter that guards saved tensors against in-place writes) and a strided view of it. Views share
// the Storage. Strides are in elements and may be zero (broadcast) or negative (flip).
#pragma once
#include <cuda.h>
#include <atomic>
#include <functional>
#include <memory>
#include "core/dtype.h"
#include "core/shape.h"
#include "runtime/context.h"

namespace flame {

struct AutogradMeta;  // tensor/autograd_graph.h

struct Storage {
  std::shared_ptr<Context> ctx;
  CUdeviceptr ptr = 0;
  size_t bytes = 0;
  std::atomic<uint64_t> version{0};
  // Memory FLAME did not allocate (a DLPack import): not counted in the pool's statistics; the
  // destructor calls release_external instead of returning the memory to the pool.
  std::function<void()> release_external;
  Storage(std::shared_ptr<Context> c, size_t n);
  Storage(std::shared_ptr<Context> c, CUdeviceptr p, size_t n, std::function<void()> release);
  ~Storage();
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements
  Shape shape;
  Strides strides;
  DType dtype = FLAME_DTYPE_F32;
  std::unique_ptr<AutogradMeta> autograd;

  TensorImpl();
  ~TensorImpl();
  Context& ctx() const { return *storage->ctx; }
  int ndim() const { return static_cast<int>(shape.size()); }
  int64_t numel() const;
  size_t elem_size() const { return dtype_size(dtype); }
  bool contiguous() const { return is_contiguous(shape, strides); }
  CUdeviceptr data() const { return storage->ptr + static_cast<CUdeviceptr>(offset * static_cast<int64_t>(elem_size())); }
};

using Tensor = std::shared_ptr<TensorImpl>;

// A new contiguous tensor with fresh (uninitialised) memory.
Tensor make_tensor(Context& ctx, const Shape& shape, DType dtype);
// A view of base's storage with new geometry (no autograd history).
Tensor make_view(const Tensor& base, const Shape& shape, const Strides& strides, int64_t offset);
// The same storage and geometry without autograd history (detach).
Tensor alias(const Tensor& t);

}  // namespace flame

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
// Wraps a tensor in a new handle (one reference) returned to the caller of an entry point: it is
// recorded in the calling thread's innermost handle scope of the tensor's context, if one is open.
flame_tensor_t wrap(Tensor t);
// A new handle FLAME lends to a callback and releases itself (never recorded in a scope).
flame_tensor_t wrap_lent(Tensor t);
// The tensor of a handle; throws FLAME_ERROR_INVALID_ARGUMENT (NULL) or _INVALID_HANDLE naming arg.
const Tensor& unwrap(flame_tensor_t h, const char* arg);
void release_handle(flame_tensor_t h) noexcept;
// The end of a handle whose last reference went: empties its scope slot, parks it (handles.cpp).
void retire_handle(flame_tensor_t h) noexcept;
// Handle scopes (api/api_scope.cpp): whether one is open on the calling thread for c; records h
// in the innermost one (may throw bad_alloc); empties h's slot in its scope (context lock held).
bool scope_open_here(Context& c);
void scope_record(Context& c, flame_tensor_t h);
void scope_forget(flame_tensor_t h) noexcept;
}  // namespace flame

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
// A contiguous tensor of shape and dtype over storage, starting offset elements in (memory that
// FLAME did not allocate as one tensor: a slot of the model layer's weight offload ring). The
// extent must lie inside storage; FLAME_ERROR_INTERNAL otherwise.
Tensor make_tensor_over(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype, int64_t offset);
// The same storage and geometry without autograd history (detach).
Tensor alias(const Tensor& t);

// A parameter whose values live elsewhere (sharded over ranks: models/param_sharding.h) keeps its
// geometry over an empty Storage (no memory, null pointer). Such a tensor cannot be read or written.
std::shared_ptr<Storage> empty_storage(std::shared_ptr<Context> ctx);
inline bool holds_no_data(const TensorImpl& t) { return t.storage->ptr == 0 && t.storage->bytes == 0 && t.numel() > 0; }

}  // namespace flame

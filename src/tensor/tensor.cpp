#include "tensor/tensor.h"
#include "tensor/autograd_graph.h"
#include "core/error.h"

namespace flame {

Storage::Storage(std::shared_ptr<Context> c, size_t n) : ctx(std::move(c)), bytes(n) { ptr = ctx->allocate(n); }
Storage::Storage(std::shared_ptr<Context> c, CUdeviceptr p, size_t n, std::function<void()> release)
    : ctx(std::move(c)), ptr(p), bytes(n), release_external(std::move(release)) {}
Storage::~Storage() {
  if (!release_external) {
    ctx->deallocate(ptr, bytes);
    return;
  }
  try {
    release_external();
  } catch (...) {  // a destructor must not throw; the releaser reports nothing
  }
}

TensorImpl::TensorImpl() = default;
TensorImpl::~TensorImpl() = default;

int64_t TensorImpl::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

Tensor make_tensor(Context& ctx, const Shape& shape, DType dtype) {
  FLAME_CHECK(dtype_valid(dtype), FLAME_ERROR_INVALID_ARGUMENT, "invalid dtype ", static_cast<int>(dtype));
  FLAME_CHECK(shape.size() <= FLAME_MAX_DIMS, FLAME_ERROR_INVALID_ARGUMENT, "tensors have at most ", FLAME_MAX_DIMS,
              " dims, got ", shape.size());
  const size_t bytes = checked_shape_bytes(shape, dtype_size(dtype));
  auto t = std::make_shared<TensorImpl>();
  t->storage = std::make_shared<Storage>(ctx.shared_from_this(), bytes);  // storages keep the context alive
  t->shape = shape;
  t->strides = contiguous_strides(shape);
  t->dtype = dtype;
  if (ctx.mode.inference) autograd_meta(*t).is_inference = true;  // can never require grad
  return t;
}

Tensor make_view(const Tensor& base, const Shape& shape, const Strides& strides, int64_t offset) {
  // Every view passes the shared check (core/shape.h): its element count and the extent it reads
  // fit int64, so no kernel or size product downstream overflows (issue 32: expand to 2^80 elements).
  check_view_geometry(shape, strides, offset, base->elem_size());
  auto t = std::make_shared<TensorImpl>();
  t->storage = base->storage;
  t->shape = shape;
  t->strides = strides;
  t->offset = offset;
  t->dtype = base->dtype;
  return t;
}

std::shared_ptr<Storage> empty_storage(std::shared_ptr<Context> ctx) {
  return std::make_shared<Storage>(std::move(ctx), CUdeviceptr{0}, size_t{0}, [] {});
}

Tensor make_tensor_over(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype, int64_t offset) {
  const size_t elem = dtype_size(dtype);
  const size_t bytes = checked_shape_bytes(shape, elem);
  FLAME_CHECK(storage && offset >= 0 && static_cast<size_t>(offset) * elem + bytes <= storage->bytes, FLAME_ERROR_INTERNAL,
              "a tensor of ", bytes, " bytes at element ", offset, " does not fit its storage");
  auto t = std::make_shared<TensorImpl>();
  t->storage = std::move(storage);
  t->shape = shape;
  t->strides = contiguous_strides(shape);
  t->offset = offset;
  t->dtype = dtype;
  return t;
}

Tensor alias(const Tensor& t) { return make_view(t, t->shape, t->strides, t->offset); }

}  // namespace flame

// C entry points: tensor lifetime, queries, creation, host transfer, views and shape ops.
#include <cstring>
#include "api/guard.h"
#include "ops/ops.h"

using namespace flame;

namespace {

Shape shape_arg(const int64_t* dims, int32_t ndim, const char* name = "shape") {
  FLAME_CHECK(ndim >= 0 && ndim <= FLAME_MAX_DIMS, FLAME_ERROR_INVALID_ARGUMENT, "ndim ", ndim, " is not in [0, ",
              FLAME_MAX_DIMS, "]");
  FLAME_CHECK(dims || ndim == 0, FLAME_ERROR_INVALID_ARGUMENT, name, " is NULL");
  Shape s(dims, dims + ndim);
  return s;
}

std::vector<int> dims_arg(const int32_t* dims, int32_t n, const char* name = "dims") {
  FLAME_CHECK(n >= 0 && n <= FLAME_MAX_DIMS, FLAME_ERROR_INVALID_ARGUMENT, "the number of dims ", n, " is not in [0, ",
              FLAME_MAX_DIMS, "]");
  FLAME_CHECK(dims || n == 0, FLAME_ERROR_INVALID_ARGUMENT, name, " is NULL");
  return std::vector<int>(dims, dims + n);
}

DType dtype_arg(const flame_dtype_t& d) {  // by reference: see enum_arg
  const int32_t v = enum_arg(d);
  FLAME_CHECK(dtype_valid(v), FLAME_ERROR_INVALID_ARGUMENT, "dtype ", v, " is not a flame_dtype_t");
  return static_cast<DType>(v);
}

std::vector<Tensor> tensor_list(const flame_tensor_t* ts, int32_t n) {
  FLAME_CHECK(ts && n > 0, FLAME_ERROR_INVALID_ARGUMENT, "tensors is NULL or n is not positive");
  std::vector<Tensor> v;
  for (int32_t i = 0; i < n; ++i) {
    std::string name = "tensors[" + std::to_string(i) + "]";
    v.push_back(unwrap(ts[i], name.c_str()));
    FLAME_CHECK(&v.back()->ctx() == &v[0]->ctx(), FLAME_ERROR_INVALID_ARGUMENT, name, " belongs to another context");
  }
  return v;
}

}  // namespace

extern "C" {

FLAME_API flame_status_t flame_tensor_retain(flame_tensor_t t) {
  return api_call("flame_tensor_retain", [&] {
    unwrap_any(t, "t");
    t->refs.fetch_add(1);
  });
}

FLAME_API void flame_tensor_release(flame_tensor_t t) { release_handle(t); }

FLAME_API flame_status_t flame_tensor_context(flame_tensor_t t, flame_ctx_t* ctx) {
  return api_call("flame_tensor_context", [&] { auto* out_ = out_param(ctx, "ctx");
    *out_ = &unwrap_any(t, "t")->ctx().handle; });
}
FLAME_API flame_status_t flame_tensor_dtype(flame_tensor_t t, flame_dtype_t* dtype) {
  return api_call("flame_tensor_dtype", [&] {
    FLAME_CHECK(dtype, FLAME_ERROR_INVALID_ARGUMENT, "dtype is NULL");
    *dtype = unwrap_any(t, "t")->dtype;
  });
}
FLAME_API flame_status_t flame_tensor_ndim(flame_tensor_t t, int32_t* ndim) {
  return api_call("flame_tensor_ndim", [&] { auto* out_ = out_param(ndim, "ndim");
    *out_ = unwrap_any(t, "t")->ndim(); });
}
FLAME_API flame_status_t flame_tensor_shape(flame_tensor_t t, int64_t* dims, int32_t capacity) {
  return api_call("flame_tensor_shape", [&] {
    const Tensor& x = unwrap_any(t, "t");
    FLAME_CHECK(dims || x->ndim() == 0, FLAME_ERROR_INVALID_ARGUMENT, "dims is NULL");
    FLAME_CHECK(capacity >= x->ndim(), FLAME_ERROR_INVALID_ARGUMENT, "capacity ", capacity, " is below ndim ", x->ndim());
    for (int i = 0; i < x->ndim(); ++i) dims[i] = x->shape[i];
  });
}
FLAME_API flame_status_t flame_tensor_strides(flame_tensor_t t, int64_t* strides, int32_t capacity) {
  return api_call("flame_tensor_strides", [&] {
    const Tensor& x = unwrap_any(t, "t");
    FLAME_CHECK(strides || x->ndim() == 0, FLAME_ERROR_INVALID_ARGUMENT, "strides is NULL");
    FLAME_CHECK(capacity >= x->ndim(), FLAME_ERROR_INVALID_ARGUMENT, "capacity ", capacity, " is below ndim ", x->ndim());
    for (int i = 0; i < x->ndim(); ++i) strides[i] = x->strides[i];
  });
}
FLAME_API flame_status_t flame_tensor_numel(flame_tensor_t t, int64_t* numel) {
  return api_call("flame_tensor_numel", [&] { auto* out_ = out_param(numel, "numel");
    *out_ = unwrap_any(t, "t")->numel(); });
}
FLAME_API flame_status_t flame_tensor_is_contiguous(flame_tensor_t t, int32_t* contiguous) {
  return api_call("flame_tensor_is_contiguous", [&] { auto* out_ = out_param(contiguous, "contiguous");
    *out_ = unwrap_any(t, "t")->contiguous(); });
}
FLAME_API flame_status_t flame_tensor_data_ptr(flame_tensor_t t, void** ptr) {
  return api_call("flame_tensor_data_ptr", [&] {
    auto* out_ = out_param(ptr, "ptr");
    *out_ = reinterpret_cast<void*>(static_cast<uintptr_t>(unwrap(t, "t")->data()));
  });
}

// ---------------- creation ----------------
FLAME_API flame_status_t flame_empty(flame_ctx_t ctx, const int64_t* shape, int32_t ndim, flame_dtype_t dtype, flame_tensor_t* out) {
  return tensor_op("flame_empty", ctx, out, [&](Context& c) { return ops::empty(c, shape_arg(shape, ndim), dtype_arg(dtype)); });
}
FLAME_API flame_status_t flame_zeros(flame_ctx_t ctx, const int64_t* shape, int32_t ndim, flame_dtype_t dtype, flame_tensor_t* out) {
  return tensor_op("flame_zeros", ctx, out, [&](Context& c) { return ops::zeros(c, shape_arg(shape, ndim), dtype_arg(dtype)); });
}
FLAME_API flame_status_t flame_ones(flame_ctx_t ctx, const int64_t* shape, int32_t ndim, flame_dtype_t dtype, flame_tensor_t* out) {
  return tensor_op("flame_ones", ctx, out, [&](Context& c) { return ops::full(c, shape_arg(shape, ndim), dtype_arg(dtype), 1.0); });
}
FLAME_API flame_status_t flame_full(flame_ctx_t ctx, const int64_t* shape, int32_t ndim, flame_dtype_t dtype, double value,
                                    flame_tensor_t* out) {
  return tensor_op("flame_full", ctx, out, [&](Context& c) { return ops::full(c, shape_arg(shape, ndim), dtype_arg(dtype), value); });
}
FLAME_API flame_status_t flame_arange(flame_ctx_t ctx, double start, double end, double step, flame_dtype_t dtype, flame_tensor_t* out) {
  return tensor_op("flame_arange", ctx, out, [&](Context& c) { return ops::arange(c, start, end, step, dtype_arg(dtype)); });
}
FLAME_API flame_status_t flame_linspace(flame_ctx_t ctx, double start, double end, int64_t steps, flame_dtype_t dtype, flame_tensor_t* out) {
  return tensor_op("flame_linspace", ctx, out, [&](Context& c) { return ops::linspace(c, start, end, steps, dtype_arg(dtype)); });
}
FLAME_API flame_status_t flame_eye(flame_ctx_t ctx, int64_t n, int64_t m, flame_dtype_t dtype, flame_tensor_t* out) {
  return tensor_op("flame_eye", ctx, out, [&](Context& c) { return ops::eye(c, n, m, dtype_arg(dtype)); });
}
FLAME_API flame_status_t flame_rand(flame_ctx_t ctx, const int64_t* shape, int32_t ndim, flame_dtype_t dtype, flame_tensor_t* out) {
  return tensor_op("flame_rand", ctx, out, [&](Context& c) { return ops::rand(c, shape_arg(shape, ndim), dtype_arg(dtype)); });
}
FLAME_API flame_status_t flame_randn(flame_ctx_t ctx, const int64_t* shape, int32_t ndim, flame_dtype_t dtype, flame_tensor_t* out) {
  return tensor_op("flame_randn", ctx, out, [&](Context& c) { return ops::randn(c, shape_arg(shape, ndim), dtype_arg(dtype)); });
}
FLAME_API flame_status_t flame_from_host(flame_ctx_t ctx, const void* data, size_t nbytes, const int64_t* shape, int32_t ndim,
                                         flame_dtype_t dtype, flame_tensor_t* out) {
  return tensor_op("flame_from_host", ctx, out,
                   [&](Context& c) { return ops::from_host(c, data, nbytes, shape_arg(shape, ndim), dtype_arg(dtype)); });
}
FLAME_API flame_status_t flame_to_host(flame_tensor_t t, void* data, size_t nbytes) {
  return api_call("flame_to_host", [&] {
    const Tensor& x = unwrap(t, "t");
    LiveScope s(x);
    ops::to_host(x, data, nbytes);
  });
}
FLAME_API flame_status_t flame_tensor_item(flame_tensor_t t, double* value) {
  return api_call("flame_tensor_item", [&] {
    out_param(value, "value");
    const Tensor& x = unwrap(t, "t");
    LiveScope s(x);
    *value = ops::item(x);
  });
}

// ---------------- views and shape ops ----------------
FLAME_API flame_status_t flame_reshape(flame_tensor_t t, const int64_t* shape, int32_t ndim, flame_tensor_t* out) {
  return tensor_op("flame_reshape", {{t, "t"}}, out, [&](const Tensor& x) { return ops::reshape(x, shape_arg(shape, ndim)); });
}
FLAME_API flame_status_t flame_view(flame_tensor_t t, const int64_t* shape, int32_t ndim, flame_tensor_t* out) {
  return tensor_op("flame_view", {{t, "t"}}, out, [&](const Tensor& x) { return ops::view(x, shape_arg(shape, ndim)); });
}
FLAME_API flame_status_t flame_permute(flame_tensor_t t, const int32_t* dims, int32_t ndim, flame_tensor_t* out) {
  return tensor_op("flame_permute", {{t, "t"}}, out, [&](const Tensor& x) { return ops::permute(x, dims_arg(dims, ndim)); });
}
FLAME_API flame_status_t flame_transpose(flame_tensor_t t, int32_t d0, int32_t d1, flame_tensor_t* out) {
  return tensor_op("flame_transpose", {{t, "t"}}, out, [&](const Tensor& x) { return ops::transpose(x, d0, d1); });
}
FLAME_API flame_status_t flame_expand(flame_tensor_t t, const int64_t* shape, int32_t ndim, flame_tensor_t* out) {
  return tensor_op("flame_expand", {{t, "t"}}, out, [&](const Tensor& x) { return ops::expand(x, shape_arg(shape, ndim)); });
}
FLAME_API flame_status_t flame_squeeze(flame_tensor_t t, int32_t dim, flame_tensor_t* out) {
  return tensor_op("flame_squeeze", {{t, "t"}}, out, [&](const Tensor& x) { return ops::squeeze(x, dim); });
}
FLAME_API flame_status_t flame_squeeze_all(flame_tensor_t t, flame_tensor_t* out) {
  return tensor_op("flame_squeeze_all", {{t, "t"}}, out, [&](const Tensor& x) { return ops::squeeze_all(x); });
}
FLAME_API flame_status_t flame_unsqueeze(flame_tensor_t t, int32_t dim, flame_tensor_t* out) {
  return tensor_op("flame_unsqueeze", {{t, "t"}}, out, [&](const Tensor& x) { return ops::unsqueeze(x, dim); });
}
FLAME_API flame_status_t flame_narrow(flame_tensor_t t, int32_t dim, int64_t start, int64_t length, flame_tensor_t* out) {
  return tensor_op("flame_narrow", {{t, "t"}}, out, [&](const Tensor& x) { return ops::narrow(x, dim, start, length); });
}
FLAME_API flame_status_t flame_slice(flame_tensor_t t, int32_t dim, int64_t start, int64_t end, int64_t step, flame_tensor_t* out) {
  return tensor_op("flame_slice", {{t, "t"}}, out, [&](const Tensor& x) { return ops::slice(x, dim, start, end, step); });
}
FLAME_API flame_status_t flame_select(flame_tensor_t t, int32_t dim, int64_t index, flame_tensor_t* out) {
  return tensor_op("flame_select", {{t, "t"}}, out, [&](const Tensor& x) { return ops::select(x, dim, index); });
}
FLAME_API flame_status_t flame_flip(flame_tensor_t t, const int32_t* dims, int32_t ndims, flame_tensor_t* out) {
  return tensor_op("flame_flip", {{t, "t"}}, out, [&](const Tensor& x) { return ops::flip(x, dims_arg(dims, ndims)); });
}
FLAME_API flame_status_t flame_diagonal(flame_tensor_t t, int64_t offset, int32_t d1, int32_t d2, flame_tensor_t* out) {
  return tensor_op("flame_diagonal", {{t, "t"}}, out, [&](const Tensor& x) { return ops::diagonal(x, offset, d1, d2); });
}
FLAME_API flame_status_t flame_contiguous(flame_tensor_t t, flame_tensor_t* out) {
  return tensor_op("flame_contiguous", {{t, "t"}}, out, [&](const Tensor& x) { return ops::contiguous(x); });
}
FLAME_API flame_status_t flame_clone(flame_tensor_t t, flame_tensor_t* out) {
  return tensor_op("flame_clone", {{t, "t"}}, out, [&](const Tensor& x) { return ops::clone(x); });
}
FLAME_API flame_status_t flame_to_dtype(flame_tensor_t t, flame_dtype_t dtype, flame_tensor_t* out) {
  return tensor_op("flame_to_dtype", {{t, "t"}}, out, [&](const Tensor& x) { return ops::to_dtype(x, dtype_arg(dtype)); });
}
FLAME_API flame_status_t flame_triu(flame_tensor_t t, int64_t diagonal, flame_tensor_t* out) {
  return tensor_op("flame_triu", {{t, "t"}}, out, [&](const Tensor& x) { return ops::triangle(x, diagonal, true); });
}
FLAME_API flame_status_t flame_tril(flame_tensor_t t, int64_t diagonal, flame_tensor_t* out) {
  return tensor_op("flame_tril", {{t, "t"}}, out, [&](const Tensor& x) { return ops::triangle(x, diagonal, false); });
}

FLAME_API flame_status_t flame_cat(const flame_tensor_t* tensors, int32_t n, int32_t dim, flame_tensor_t* out) {
  return api_call("flame_cat", [&] {
    out_param(out, "out");
    auto v = tensor_list(tensors, n);
    LiveScope s(v[0]);
    *out = wrap(ops::cat(v, dim));
  });
}
FLAME_API flame_status_t flame_stack(const flame_tensor_t* tensors, int32_t n, int32_t dim, flame_tensor_t* out) {
  return api_call("flame_stack", [&] {
    out_param(out, "out");
    auto v = tensor_list(tensors, n);
    LiveScope s(v[0]);
    *out = wrap(ops::stack(v, dim));
  });
}

static void write_pieces(const std::vector<Tensor>& pieces, flame_tensor_t* outs) {
  for (size_t i = 0; i < pieces.size(); ++i) outs[i] = wrap(pieces[i]);
}

FLAME_API flame_status_t flame_split(flame_tensor_t t, int64_t split_size, int32_t dim, flame_tensor_t* outs, int32_t capacity,
                                     int32_t* count) {
  return api_call("flame_split", [&] {
    out_param(count, "count");
    const Tensor& x = unwrap(t, "t");
    FLAME_CHECK(outs, FLAME_ERROR_INVALID_ARGUMENT, "outs is NULL");
    FLAME_CHECK(split_size > 0, FLAME_ERROR_INVALID_ARGUMENT, "split_size must be positive, got ", split_size);
    LiveScope s(x);
    int d = normalize_dim(dim, x->ndim());
    std::vector<int64_t> sizes;
    for (int64_t left = x->shape[d]; left > 0; left -= split_size) sizes.push_back(std::min(left, split_size));
    if (sizes.empty()) sizes.push_back(0);
    FLAME_CHECK(static_cast<int64_t>(sizes.size()) <= capacity, FLAME_ERROR_INVALID_ARGUMENT, "capacity ", capacity,
                " is below the ", sizes.size(), " pieces");
    write_pieces(ops::split_sizes(x, sizes, d), outs);
    *count = static_cast<int32_t>(sizes.size());
  });
}

FLAME_API flame_status_t flame_split_sizes(flame_tensor_t t, const int64_t* sizes, int32_t n, int32_t dim, flame_tensor_t* outs) {
  return api_call("flame_split_sizes", [&] {
    const Tensor& x = unwrap(t, "t");
    FLAME_CHECK(outs && sizes && n > 0, FLAME_ERROR_INVALID_ARGUMENT, "outs or sizes is NULL, or n is not positive");
    for (int32_t i = 0; i < n; ++i) outs[i] = nullptr;
    LiveScope s(x);
    write_pieces(ops::split_sizes(x, std::vector<int64_t>(sizes, sizes + n), dim), outs);
  });
}

FLAME_API flame_status_t flame_chunk(flame_tensor_t t, int32_t chunks, int32_t dim, flame_tensor_t* outs, int32_t capacity,
                                     int32_t* count) {
  return api_call("flame_chunk", [&] {
    out_param(count, "count");
    const Tensor& x = unwrap(t, "t");
    FLAME_CHECK(outs, FLAME_ERROR_INVALID_ARGUMENT, "outs is NULL");
    FLAME_CHECK(chunks > 0, FLAME_ERROR_INVALID_ARGUMENT, "chunks must be positive, got ", chunks);
    LiveScope s(x);
    int d = normalize_dim(dim, x->ndim());
    int64_t size = x->shape[d], each = (size + chunks - 1) / chunks;
    std::vector<int64_t> sizes;
    if (each == 0) sizes.push_back(0);
    for (int64_t left = size; left > 0; left -= each) sizes.push_back(std::min(left, each));
    FLAME_CHECK(static_cast<int64_t>(sizes.size()) <= capacity, FLAME_ERROR_INVALID_ARGUMENT, "capacity ", capacity,
                " is below the ", sizes.size(), " pieces");
    write_pieces(ops::split_sizes(x, sizes, d), outs);
    *count = static_cast<int32_t>(sizes.size());
  });
}

}  // extern "C"

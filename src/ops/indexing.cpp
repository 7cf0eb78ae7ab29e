// Indexing ops. Two primitives have kernels (cuda/indexing.cuh) and graph nodes: gather_index
// (torch.gather over an index of any layout) and scatter_add_index (its adjoint, accumulating with
// atomics). index_select and index_add are the same primitives over their 1-D index broadcast along
// the other dims (a stride-0 view, nothing copied); embedding is index_select of rows whose
// padding_idx row gets no gradient; masked_fill is a where(); one_hot has a kernel of its own and is
// not differentiable. Indices are checked on the device (see ops/loss.cpp for why not on the host).
#include "ops/indexing.h"
#include <algorithm>
#include <cmath>
#include "tensor/autograd_graph.h"
#include "core/error.h"
#include "ops/ops.h"

namespace flame {

namespace {

struct IndexLayout {  // mirrors cuda/indexing.cuh
  int ndim, dim;
  int64_t shape[8];
  int64_t idx_stride[8];
  int64_t data_stride[8];
  int64_t other_stride[8];
  int64_t dim_size;
};

// The accumulation dtype of scatter-add: f32 for 16-bit floats, else the dtype itself.
DType scatter_acc(DType d) { return (d == FLAME_DTYPE_F16 || d == FLAME_DTYPE_BF16) ? FLAME_DTYPE_F32 : d; }
bool scatter_supported(DType d) { return is_floating(d) || d == FLAME_DTYPE_I32 || d == FLAME_DTYPE_I64; }

constexpr KernelTemplate kGather{"indexing.cuh", "flame::gather_kernel", {TArg::Dtype, TArg::Dtype}};  // <T, index>
constexpr KernelTemplate kScatterAdd{"indexing.cuh", "flame::scatter_add_kernel",
                                     {TArg::Dtype, TArg::Dtype, TArg::Dtype}};  // <T, index, acc>
constexpr KernelTemplate kOneHot{"indexing.cuh", "flame::one_hot_kernel", {TArg::Dtype}};  // <index>

KernelKey gather_key(DType t, DType i) { return make_key(kGather, t, i); }
KernelKey scatter_key(DType s, DType i) { return make_key(kScatterAdd, s, i, scatter_acc(s)); }
KernelKey one_hot_key(DType i) { return make_key(kOneHot, i); }

unsigned flat_grid(Context& ctx, int64_t n) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n + 255) / 256, int64_t{ctx.sm_count} * 32)));
}

// iteration shape = index's shape; data: the tensor indexed along dim; other: the scatter source.
IndexLayout layout(const Tensor& index, const Tensor& data, const Tensor& other, int dim) {
  IndexLayout L{};
  L.ndim = index->ndim();
  L.dim = dim;
  for (int d = 0; d < L.ndim; ++d) {
    L.shape[d] = index->shape[d];
    L.idx_stride[d] = index->strides[d];
    L.data_stride[d] = data->strides[d];
    L.other_stride[d] = other ? other->strides[d] : 0;
  }
  L.dim_size = data->shape[dim];
  return L;
}

void check_index_dtype(const char* op, const Tensor& index) {
  FLAME_CHECK(index->dtype == FLAME_DTYPE_I64 || index->dtype == FLAME_DTYPE_I32, FLAME_ERROR_DTYPE_MISMATCH, op,
              ": index must be i64 or i32, got ", dtype_name(index->dtype));
}

void same_context(const char* op, const Tensor& a, const Tensor& b) {
  FLAME_CHECK(&a->ctx() == &b->ctx(), FLAME_ERROR_INVALID_ARGUMENT, op, ": tensors belong to different contexts");
}

int data_dim(const char* op, const Tensor& x, int dim) {
  FLAME_CHECK(x->ndim() >= 1, FLAME_ERROR_INVALID_ARGUMENT, op, ": the input must have at least one dim");
  return normalize_dim(dim, x->ndim());
}

// index (same number of dims as x) fits x on every dim but dim.
void check_fits(const char* op, const Tensor& index, const Tensor& x, int dim) {
  FLAME_CHECK(index->ndim() == x->ndim(), FLAME_ERROR_SHAPE_MISMATCH, op, ": index has ", index->ndim(),
              " dims but the input has ", x->ndim());
  for (int d = 0; d < x->ndim(); ++d)
    FLAME_CHECK(d == dim || index->shape[d] <= x->shape[d], FLAME_ERROR_SHAPE_MISMATCH, op, ": index of shape ",
                shape_str(index->shape), " does not fit the input of shape ", shape_str(x->shape), " on dim ", d);
}

// A 1-D (or 0-d) index as a view of shape `shape`, varying along dim only.
Tensor broadcast_index(const char* op, const Tensor& index, const Shape& shape, int dim) {
  FLAME_CHECK(index->ndim() <= 1, FLAME_ERROR_SHAPE_MISMATCH, op, ": index must be 1-D, got shape ", shape_str(index->shape));
  Tensor flat = ops::contiguous(ops::reshape(alias(index), {index->numel()}));
  Strides st(shape.size(), 0);
  st[static_cast<size_t>(dim)] = 1;
  return make_view(flat, shape, st, flat->offset);
}

}  // namespace

// ---------------------------------------------------------------- the primitives

Tensor ops::gather_index(const Tensor& x, int dim, const Tensor& index, int64_t skip, bool zero_skip, const std::string& what) {
  Context& ctx = x->ctx();
  Tensor out = make_tensor(ctx, index->shape, x->dtype);
  int64_t n = out->numel();
  if (n > 0) {
    IndexLayout L = layout(index, x, nullptr, dim);
    uint32_t src = 0;
    CUdeviceptr rec = ctx.device_error_record(what, &src);
    CUdeviceptr pi = x->data(), po = out->data(), px = index->data();
    int zs = zero_skip ? 1 : 0;
    void* args[] = {&pi, &po, &px, &n, &L, &skip, &zs, &rec, &src};
    ctx.launch(ctx.function(gather_key(x->dtype, index->dtype)), flat_grid(ctx, n), 256, args);
  }
  if (auto node = record(OpId::Gather, {x}, {out})) {
    node->saved.emplace_back(index, false);
    node->attributes = ops::IndexAttrs{dim, skip, zero_skip, 1.0};
  }
  return out;
}

Tensor ops::scatter_add_index(const Tensor& x, int dim, const Tensor& index, const Tensor& src, int64_t skip, double alpha,
                              const std::string& what) {
  Context& ctx = x->ctx();
  DType A = scatter_acc(x->dtype);
  Tensor acc = make_tensor(ctx, x->shape, A);
  copy_into(acc, alias(x));  // the accumulator starts as x (in f32 for 16-bit floats)
  int64_t n = index->numel();
  if (n > 0) {
    IndexLayout L = layout(index, acc, src, dim);
    uint32_t esrc = 0;
    CUdeviceptr rec = ctx.device_error_record(what, &esrc);
    CUdeviceptr pa = acc->data(), ps = src->data(), pi = index->data();
    void* args[] = {&pa, &ps, &pi, &n, &L, &skip, &alpha, &rec, &esrc};
    ctx.launch(ctx.function(scatter_key(src->dtype, index->dtype)), flat_grid(ctx, n), 256, args);
  }
  Tensor out = to_dtype(acc, x->dtype);
  if (auto node = record(OpId::ScatterAdd, {x, src}, {out})) {
    node->saved.emplace_back(index, false);
    node->attributes = ops::IndexAttrs{dim, skip, false, alpha};
  }
  return out;
}

// ---------------------------------------------------------------- the ops

Tensor ops::gather(const Tensor& x, int dim0, const Tensor& index) {
  const char* op = "gather";
  same_context(op, x, index);
  check_index_dtype(op, index);
  int dim = data_dim(op, x, dim0);
  check_fits(op, index, x, dim);
  return gather_index(x, dim, contiguous(alias(index)), kNoIndex, false, "gather: index");
}

Tensor ops::index_select(const Tensor& x, int dim0, const Tensor& index) {
  const char* op = "index_select";
  same_context(op, x, index);
  check_index_dtype(op, index);
  int dim = data_dim(op, x, dim0);
  Shape shape = x->shape;
  shape[static_cast<size_t>(dim)] = index->numel();
  return gather_index(x, dim, broadcast_index(op, index, shape, dim), kNoIndex, false, "index_select: index");
}

Tensor ops::embedding(const Tensor& weight, const Tensor& indices, int64_t padding_idx) {
  const char* op = "embedding";
  same_context(op, weight, indices);
  check_index_dtype(op, indices);
  FLAME_CHECK(weight->ndim() == 2, FLAME_ERROR_SHAPE_MISMATCH, op, ": weight must be [num_embeddings, dim], got ",
              shape_str(weight->shape));
  FLAME_CHECK(indices->ndim() < FLAME_MAX_DIMS, FLAME_ERROR_INVALID_ARGUMENT, op, ": indices have too many dims");
  int64_t V = weight->shape[0], D = weight->shape[1];
  int64_t pad = padding_idx;
  if (pad != kNoIndex) {
    FLAME_CHECK(pad >= -V && pad < V, FLAME_ERROR_INVALID_ARGUMENT, op, ": padding_idx ", padding_idx,
                " is outside [", -V, ", ", V, ")");
    if (pad < 0) pad += V;
  }
  int64_t N = indices->numel();
  Tensor rows = gather_index(weight, 0, broadcast_index(op, reshape(alias(indices), {N}), {N, D}, 0), pad, false,
                             "embedding: index");
  Shape out_shape = indices->shape;
  out_shape.push_back(D);
  return reshape(rows, out_shape);
}

Tensor ops::scatter_add(const Tensor& x, int dim0, const Tensor& index, const Tensor& src) {
  const char* op = "scatter_add";
  same_context(op, x, index);
  same_context(op, x, src);
  check_index_dtype(op, index);
  FLAME_CHECK(scatter_supported(x->dtype), FLAME_ERROR_DTYPE_MISMATCH, op, ": the input must be floating, i32 or i64, got ",
              dtype_name(x->dtype));
  FLAME_CHECK(src->dtype == x->dtype, FLAME_ERROR_DTYPE_MISMATCH, op, ": src has dtype ", dtype_name(src->dtype),
              " but the input has ", dtype_name(x->dtype));
  int dim = data_dim(op, x, dim0);
  check_fits(op, index, x, dim);
  FLAME_CHECK(src->shape == index->shape, FLAME_ERROR_SHAPE_MISMATCH, op, ": src has shape ", shape_str(src->shape),
              " but index has shape ", shape_str(index->shape), " (they must match)");
  return scatter_add_index(x, dim, contiguous(alias(index)), src, kNoIndex, 1.0, "scatter_add: index");
}

Tensor ops::index_add(const Tensor& x, int dim0, const Tensor& index, const Tensor& source, double alpha) {
  const char* op = "index_add";
  same_context(op, x, index);
  same_context(op, x, source);
  check_index_dtype(op, index);
  FLAME_CHECK(scatter_supported(x->dtype), FLAME_ERROR_DTYPE_MISMATCH, op, ": the input must be floating, i32 or i64, got ",
              dtype_name(x->dtype));
  FLAME_CHECK(source->dtype == x->dtype, FLAME_ERROR_DTYPE_MISMATCH, op, ": source has dtype ", dtype_name(source->dtype),
              " but the input has ", dtype_name(x->dtype));
  FLAME_CHECK(std::isfinite(alpha) && (is_floating(x->dtype) || alpha == std::floor(alpha)), FLAME_ERROR_INVALID_ARGUMENT, op,
              ": alpha ", alpha, " must be finite (and whole for integer tensors)");
  int dim = data_dim(op, x, dim0);
  Shape want = x->shape;
  want[static_cast<size_t>(dim)] = index->numel();
  FLAME_CHECK(source->shape == want, FLAME_ERROR_SHAPE_MISMATCH, op, ": source has shape ", shape_str(source->shape),
              " but needs ", shape_str(want), " (the input's shape with dim ", dim, " of the index's length)");
  return scatter_add_index(x, dim, broadcast_index(op, index, want, dim), source, kNoIndex, alpha, "index_add: index");
}

Tensor ops::masked_fill(const Tensor& x, const Tensor& mask, double value) {
  const char* op = "masked_fill";
  same_context(op, x, mask);
  FLAME_CHECK(mask->dtype == FLAME_DTYPE_BOOL, FLAME_ERROR_DTYPE_MISMATCH, op, ": mask must be bool, got ", dtype_name(mask->dtype));
  FLAME_CHECK(mask->ndim() <= x->ndim() && broadcast_shapes(x->shape, mask->shape) == x->shape, FLAME_ERROR_SHAPE_MISMATCH, op,
              ": mask of shape ", shape_str(mask->shape), " does not broadcast to the input's shape ", shape_str(x->shape));
  FLAME_CHECK(std::isfinite(value) || is_floating(x->dtype), FLAME_ERROR_INVALID_ARGUMENT, op, ": ", value,
              " does not fit ", dtype_name(x->dtype));
  return where(mask, scalar(x->ctx(), value, x->dtype), x);
}

Tensor ops::one_hot(const Tensor& index, int64_t num_classes) {
  const char* op = "one_hot";
  check_index_dtype(op, index);
  FLAME_CHECK(index->ndim() < FLAME_MAX_DIMS, FLAME_ERROR_INVALID_ARGUMENT, op, ": index has too many dims");
  FLAME_CHECK(num_classes == -1 || num_classes >= 1, FLAME_ERROR_INVALID_ARGUMENT, op, ": num_classes must be >= 1 or -1, got ",
              num_classes);
  Context& ctx = index->ctx();
  Tensor idx = contiguous(alias(index));
  int64_t n = idx->numel();
  if (num_classes == -1) {  // max + 1, as PyTorch: this waits for the device
    FLAME_CHECK(n > 0, FLAME_ERROR_INVALID_ARGUMENT, op, ": cannot infer num_classes from an empty index");
    num_classes = static_cast<int64_t>(item(amax(idx, {}, false))) + 1;
    FLAME_CHECK(num_classes >= 1, FLAME_ERROR_INVALID_ARGUMENT, op, ": index values are negative (largest ", num_classes - 1, ")");
  }
  Shape shape = index->shape;
  shape.push_back(num_classes);
  Tensor out = make_tensor(ctx, shape, FLAME_DTYPE_I64);
  if (n > 0) {
    uint32_t src = 0;
    CUdeviceptr rec = ctx.device_error_record("one_hot: index", &src);
    CUdeviceptr pi = idx->data(), po = out->data();
    void* args[] = {&pi, &po, &n, &num_classes, &rec, &src};
    ctx.launch(ctx.function(one_hot_key(idx->dtype)), flat_grid(ctx, n * num_classes), 256, args);
  }
  return out;
}

std::vector<std::string> ops::indexing_instantiations() {
  std::vector<std::string> v;
  const DType all[] = {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_F64,
                       FLAME_DTYPE_I32, FLAME_DTYPE_I64, FLAME_DTYPE_U8,  FLAME_DTYPE_BOOL};
  for (DType i : {FLAME_DTYPE_I64, FLAME_DTYPE_I32}) {
    for (DType t : all) {
      v.push_back(kernel_name(gather_key(t, i)));
      if (scatter_supported(t)) v.push_back(kernel_name(scatter_key(t, i)));
    }
    v.push_back(kernel_name(one_hot_key(i)));
  }
  return v;
}

}  // namespace flame

// Joining and splitting: cat copies each input into a narrow view of the output (no kernel of its
// own); stack is unsqueeze + cat; split/chunk are narrow views; triu/tril are a where() over a
// mask built from two aranges, so they are differentiable through where.
#include "core/error.h"
#include "ops/ops.h"

namespace flame {

Tensor ops::cat(const std::vector<Tensor>& ts, int dim0) {
  FLAME_CHECK(!ts.empty(), FLAME_ERROR_INVALID_ARGUMENT, "cat: no tensors given");
  const Tensor& first = ts[0];
  int dim = normalize_dim(dim0, first->ndim());
  DType dt = first->dtype;
  Shape shape = first->shape;
  shape[dim] = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    const Tensor& t = ts[i];
    FLAME_CHECK(&t->ctx() == &first->ctx(), FLAME_ERROR_INVALID_ARGUMENT, "cat: tensors belong to different contexts");
    FLAME_CHECK(t->ndim() == first->ndim(), FLAME_ERROR_SHAPE_MISMATCH, "cat: tensor ", i, " has ", t->ndim(),
                " dims, tensor 0 has ", first->ndim());
    for (int d = 0; d < t->ndim(); ++d)
      FLAME_CHECK(d == dim || t->shape[d] == first->shape[d], FLAME_ERROR_SHAPE_MISMATCH, "cat: tensor ", i,
                  " has shape ", shape_str(t->shape), ", tensor 0 has ", shape_str(first->shape));
    shape[dim] = checked_size_add(shape[dim], t->shape[dim], "cat");
    dt = promote(dt, t->dtype);
  }
  checked_numel(shape, "cat");  // named here rather than by the allocation
  Tensor out = make_tensor(first->ctx(), shape, dt);
  int64_t off = 0;
  std::vector<Tensor> inputs;
  for (const auto& t : ts) {
    Shape vs = out->shape;
    vs[dim] = t->shape[dim];
    copy_into(make_view(out, vs, out->strides, out->offset + off * out->strides[dim]), t);
    off += t->shape[dim];
    inputs.push_back(t);
  }
  if (auto node = record(OpId::Cat, inputs, {out})) node->attributes = ops::DimAttrs{dim};
  return out;
}

Tensor ops::stack(const std::vector<Tensor>& ts, int dim) {
  FLAME_CHECK(!ts.empty(), FLAME_ERROR_INVALID_ARGUMENT, "stack: no tensors given");
  int d = normalize_dim(dim, ts[0]->ndim() + 1);
  for (size_t i = 0; i < ts.size(); ++i)
    FLAME_CHECK(ts[i]->shape == ts[0]->shape, FLAME_ERROR_SHAPE_MISMATCH, "stack: tensor ", i, " has shape ",
                shape_str(ts[i]->shape), ", tensor 0 has ", shape_str(ts[0]->shape));
  Shape out_shape = ts[0]->shape;
  out_shape.insert(out_shape.begin() + d, static_cast<int64_t>(ts.size()));
  checked_numel(out_shape, "stack");  // named as stack's, not as the cat it becomes
  std::vector<Tensor> us;
  for (const Tensor& t : ts) us.push_back(unsqueeze(t, d));
  return cat(us, d);
}

std::vector<Tensor> ops::split_sizes(const Tensor& t, const std::vector<int64_t>& sizes, int dim) {
  int d = normalize_dim(dim, t->ndim());
  int64_t total = 0;
  for (int64_t s : sizes) {
    FLAME_CHECK(s >= 0, FLAME_ERROR_INVALID_ARGUMENT, "split: negative size ", s);
    total += s;
  }
  FLAME_CHECK(total == t->shape[d], FLAME_ERROR_INVALID_ARGUMENT, "split: sizes sum to ", total, " but dim ", dim,
              " has size ", t->shape[d]);
  std::vector<Tensor> out;
  int64_t off = 0;
  for (int64_t s : sizes) {
    out.push_back(narrow(t, d, off, s));
    off += s;
  }
  return out;
}

Tensor ops::triangle(const Tensor& t, int64_t diagonal, bool upper) {
  FLAME_CHECK(t->ndim() >= 2, FLAME_ERROR_INVALID_ARGUMENT, upper ? "triu" : "tril", ": needs at least 2 dims, got ",
              t->ndim());
  Context& ctx = t->ctx();
  int64_t n = t->shape[t->ndim() - 2], m = t->shape[t->ndim() - 1];
  Tensor rows = unsqueeze(arange(ctx, 0, static_cast<double>(n), 1, FLAME_DTYPE_I64), 1);
  Tensor cols = arange(ctx, 0, static_cast<double>(m), 1, FLAME_DTYPE_I64);
  Tensor diff = sub(cols, add_scalar(rows, static_cast<double>(diagonal)));  // col - row - diagonal
  Tensor zero = scalar(ctx, 0, FLAME_DTYPE_I64);
  Tensor mask = binary(upper ? OpId::Ge : OpId::Le, diff, zero);
  return where(mask, t, scalar(ctx, 0, t->dtype));
}

}  // namespace flame

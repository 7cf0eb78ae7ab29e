// View ops: new geometry over the same storage, recorded as Reshape, Permute, Expand or
// ViewSlice nodes. ViewSlice covers narrow/slice/select/diagonal/flip through one ViewSpec whose
// backward (ViewScatter) writes the gradient into the same view of a zero tensor.
#include <algorithm>
#include "core/error.h"
#include "ops/ops.h"

namespace flame {

namespace {

Tensor record_view(OpId op, const Tensor& in, Tensor out) {
  record(op, {in}, {out});
  return out;
}

// Geometry of spec applied to (shape, strides, offset) of t.
Tensor apply_spec(const Tensor& t, const ViewSpec& s) {
  Shape shape = t->shape;
  Strides st = t->strides;
  int64_t off = t->offset;
  switch (s.kind) {
    case ViewSpec::Slice:
      off += s.start * st[s.dim];
      shape[s.dim] = s.length;
      // With two or more elements step < size, so the product stays within the view's extent; a
      // step past the dim (up to 2^63 - 1) would overflow it and is irrelevant for one element.
      if (s.length > 1) st[s.dim] *= s.step;
      break;
    case ViewSpec::Select:
      off += s.start * st[s.dim];
      shape.erase(shape.begin() + s.dim);
      st.erase(st.begin() + s.dim);
      break;
    case ViewSpec::Diagonal: {
      int64_t o = s.start;
      int64_t len = o >= 0 ? std::max<int64_t>(0, std::min(shape[s.dim], shape[s.dim2] - o))
                           : std::max<int64_t>(0, std::min(shape[s.dim] + o, shape[s.dim2]));
      if (len > 0) off += o >= 0 ? o * st[s.dim2] : -o * st[s.dim];
      int64_t dstride = st[s.dim] + st[s.dim2];
      int hi = std::max(s.dim, s.dim2), lo = std::min(s.dim, s.dim2);
      shape.erase(shape.begin() + hi);
      st.erase(st.begin() + hi);
      shape.erase(shape.begin() + lo);
      st.erase(st.begin() + lo);
      shape.push_back(len);
      st.push_back(dstride);
      break;
    }
    case ViewSpec::Flip:
      for (int d : s.dims) {
        if (shape[d] > 0) off += (shape[d] - 1) * st[d];
        st[d] = -st[d];
      }
      break;
  }
  return make_view(t, shape, st, off);
}

}  // namespace

Tensor ops::view_slice(const Tensor& t, const ViewSpec& spec) {
  Tensor out = apply_spec(t, spec);
  if (auto node = record(OpId::ViewSlice, {t}, {out})) node->view = spec;
  return out;
}

Tensor ops::view_scatter(const Tensor& g, const Shape& shape, const ViewSpec& spec) {
  Tensor out = zeros(g->ctx(), shape, g->dtype);
  copy_into(apply_spec(out, spec), g);
  if (auto node = record(OpId::ViewScatter, {g}, {out})) node->view = spec;
  return out;
}

Tensor ops::view(const Tensor& t, const Shape& requested) {
  Shape shape = infer_shape(requested, t->numel(), "view");
  FLAME_CHECK(shape.size() <= FLAME_MAX_DIMS, FLAME_ERROR_INVALID_ARGUMENT, "at most ", FLAME_MAX_DIMS, " dims");
  Strides st;
  FLAME_CHECK(view_strides(t->shape, t->strides, shape, &st), FLAME_ERROR_INVALID_ARGUMENT, "view: a tensor of shape ",
              shape_str(t->shape), " with these strides cannot be viewed as ", shape_str(shape), " (use reshape)");
  return record_view(OpId::Reshape, t, make_view(t, shape, st, t->offset));
}

Tensor ops::reshape(const Tensor& t, const Shape& requested) {
  Shape shape = infer_shape(requested, t->numel(), "reshape");
  Strides st;
  if (view_strides(t->shape, t->strides, shape, &st)) return view(t, shape);
  return view(clone(t), shape);
}

Tensor ops::permute(const Tensor& t, const std::vector<int>& dims0) {
  FLAME_CHECK(static_cast<int>(dims0.size()) == t->ndim(), FLAME_ERROR_INVALID_ARGUMENT, "permute: ", dims0.size(),
              " dims given for a tensor of ", t->ndim());
  std::vector<bool> seen(t->ndim(), false);
  Shape shape;
  Strides st;
  std::vector<int> dims;
  for (int d0 : dims0) {
    int d = normalize_dim(d0, t->ndim());
    FLAME_CHECK(!seen[d], FLAME_ERROR_INVALID_ARGUMENT, "permute: dim ", d0, " repeats");
    seen[d] = true;
    dims.push_back(d);
    shape.push_back(t->shape[d]);
    st.push_back(t->strides[d]);
  }
  Tensor out = make_view(t, shape, st, t->offset);
  if (auto node = record(OpId::Permute, {t}, {out})) node->attributes = ops::PermuteAttrs{dims};
  return out;
}

Tensor ops::transpose(const Tensor& t, int d0, int d1) {
  int a = normalize_dim(d0, t->ndim()), b = normalize_dim(d1, t->ndim());
  std::vector<int> dims(t->ndim());
  for (int i = 0; i < t->ndim(); ++i) dims[i] = i;
  std::swap(dims[a], dims[b]);
  return permute(t, dims);
}

Tensor ops::expand(const Tensor& t, const Shape& req) {
  FLAME_CHECK(req.size() >= t->shape.size(), FLAME_ERROR_SHAPE_MISMATCH, "expand: cannot expand ", shape_str(t->shape),
              " to fewer dims ", shape_str(req));
  FLAME_CHECK(req.size() <= FLAME_MAX_DIMS, FLAME_ERROR_INVALID_ARGUMENT, "at most ", FLAME_MAX_DIMS, " dims");
  size_t lead = req.size() - t->shape.size();
  Shape shape(req.size());
  Strides st(req.size());
  for (size_t i = 0; i < req.size(); ++i) {
    int64_t have = i < lead ? 1 : t->shape[i - lead];
    int64_t want = req[i] == -1 ? have : req[i];
    FLAME_CHECK(!(i < lead && req[i] == -1), FLAME_ERROR_INVALID_ARGUMENT, "expand: -1 is not allowed for new dims");
    FLAME_CHECK(want >= 0 && (have == want || have == 1), FLAME_ERROR_SHAPE_MISMATCH, "expand: cannot expand ",
                shape_str(t->shape), " to ", shape_str(req));
    shape[i] = want;
    st[i] = i < lead ? 0 : (have == want ? t->strides[i - lead] : 0);
  }
  checked_numel(shape, "expand");  // the only view op that adds elements: [2^40, 2^40] is refused here
  if (shape == t->shape) return t;
  return record_view(OpId::Expand, t, make_view(t, shape, st, t->offset));
}

Tensor ops::squeeze(const Tensor& t, int dim) {
  int d = normalize_dim(dim, t->ndim());
  FLAME_CHECK(t->shape[d] == 1, FLAME_ERROR_INVALID_ARGUMENT, "squeeze: dim ", dim, " has size ", t->shape[d], ", not 1");
  Shape s = t->shape;
  Strides st = t->strides;
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  return record_view(OpId::Reshape, t, make_view(t, s, st, t->offset));
}

Tensor ops::squeeze_all(const Tensor& t) {
  Shape s;
  Strides st;
  for (int d = 0; d < t->ndim(); ++d)
    if (t->shape[d] != 1) {
      s.push_back(t->shape[d]);
      st.push_back(t->strides[d]);
    }
  return record_view(OpId::Reshape, t, make_view(t, s, st, t->offset));
}

Tensor ops::unsqueeze(const Tensor& t, int dim) {
  int d = normalize_dim(dim, t->ndim() + 1);
  FLAME_CHECK(t->ndim() < FLAME_MAX_DIMS, FLAME_ERROR_INVALID_ARGUMENT, "at most ", FLAME_MAX_DIMS, " dims");
  Shape s = t->shape;
  Strides st = t->strides;
  // Any stride serves a size-1 dim; PyTorch's stride * size unless that overflows (a strided view
  // reaching near 2^63 elements), then 1.
  int64_t stride = 1;
  if (d < t->ndim() && __builtin_mul_overflow(t->strides[d], t->shape[d], &stride)) stride = 1;
  s.insert(s.begin() + d, 1);
  st.insert(st.begin() + d, stride);
  return record_view(OpId::Reshape, t, make_view(t, s, st, t->offset));
}

Tensor ops::narrow(const Tensor& t, int dim, int64_t start, int64_t length) {
  int d = normalize_dim(dim, t->ndim());
  int64_t size = t->shape[d];
  if (start < 0) start += size;
  FLAME_CHECK(start >= 0 && length >= 0 && start <= size && length <= size - start, FLAME_ERROR_INVALID_ARGUMENT,
              "narrow: start ", start, " and length ", length, " do not fit dim ", dim, " of size ", size);
  ViewSpec s;
  s.kind = ViewSpec::Slice;
  s.dim = d;
  s.start = start;
  s.length = length;
  return view_slice(t, s);
}

Tensor ops::slice(const Tensor& t, int dim, int64_t start, int64_t end, int64_t step) {
  int d = normalize_dim(dim, t->ndim());
  FLAME_CHECK(step > 0, FLAME_ERROR_INVALID_ARGUMENT, "slice: step must be positive, got ", step);
  int64_t size = t->shape[d];
  if (start < 0) start += size;
  if (end < 0) end += size;
  start = std::min(std::max<int64_t>(start, 0), size);
  end = std::min(std::max<int64_t>(end, start), size);
  ViewSpec s;
  s.kind = ViewSpec::Slice;
  s.dim = d;
  s.start = start;
  s.step = step;
  s.length = end > start ? (end - start - 1) / step + 1 : 0;  // no end - start + step: it overflows for huge steps
  return view_slice(t, s);
}

Tensor ops::select(const Tensor& t, int dim, int64_t index) {
  int d = normalize_dim(dim, t->ndim());
  int64_t size = t->shape[d];
  if (index < 0) index += size;
  FLAME_CHECK(index >= 0 && index < size, FLAME_ERROR_INVALID_ARGUMENT, "select: index ", index,
              " is out of range for dim ", dim, " of size ", size);
  ViewSpec s;
  s.kind = ViewSpec::Select;
  s.dim = d;
  s.start = index;
  return view_slice(t, s);
}

Tensor ops::flip(const Tensor& t, const std::vector<int>& dims) {
  ViewSpec s;
  s.kind = ViewSpec::Flip;
  for (int d0 : dims) {
    int d = normalize_dim(d0, t->ndim());
    FLAME_CHECK(std::find(s.dims.begin(), s.dims.end(), d) == s.dims.end(), FLAME_ERROR_INVALID_ARGUMENT, "flip: dim ",
                d0, " repeats");
    s.dims.push_back(d);
  }
  return view_slice(t, s);
}

Tensor ops::diagonal(const Tensor& t, int64_t offset, int d1, int d2) {
  ViewSpec s;
  s.kind = ViewSpec::Diagonal;
  s.dim = normalize_dim(d1, t->ndim(), "dim1");
  s.dim2 = normalize_dim(d2, t->ndim(), "dim2");
  FLAME_CHECK(s.dim != s.dim2, FLAME_ERROR_INVALID_ARGUMENT, "diagonal: dim1 and dim2 must differ");
  s.start = offset;
  return view_slice(t, s);
}

Tensor ops::sum_to(const Tensor& g, const Shape& shape) {
  if (g->shape == shape) return g;
  size_t lead = g->shape.size() - shape.size();
  std::vector<int> dims;
  for (size_t i = 0; i < g->shape.size(); ++i)
    if (i < lead || (shape[i - lead] == 1 && g->shape[i] != 1)) dims.push_back(static_cast<int>(i));
  Tensor s = dims.empty() ? g : sum(g, dims, true);
  return reshape(s, shape);
}

}  // namespace flame

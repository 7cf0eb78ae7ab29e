// scatter, masked_select, repeat, repeat_interleave and pad.
//  - scatter has a kernel (cuda/scatter.cuh) and a node (OpId::Scatter) whose rule is scatter of zeros
//    (the input's gradient) and gather (src's), so it is differentiable as often as needed.
//  - masked_select is a gather at the positions of the true elements, which a cumsum of the mask and
//    a scatter-add of their positions find on the device; only the count travels to the host.
//  - repeat / repeat_interleave view each repeated dim as [pre, 1, len, post] / [pre, len, 1, post],
//    expand the 1 and reshape (one copy per repeated dim); the Expand nodes sum the gradient.
//  - pad: CONSTANT is a node of its own (fill, then one copy of the input into the interior; the
//    rule narrows the gradient back), after negative amounts were cropped with narrow views.
//    REFLECT and REPLICATE are index_select along each padded dim with an index built on the host
//    (output position j reads input position m(j - left)), which also covers negative amounts.
#include <algorithm>
#include <cmath>
#include "tensor/autograd_graph.h"
#include "core/error.h"
#include "ops/indexing.h"
#include "ops/nn_rows.h"
#include "ops/nnops.h"
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

constexpr KernelTemplate kScatter{"scatter.cuh", "flame::scatter_kernel", {TArg::Dtype, TArg::Dtype}};  // <T, index>
KernelKey scatter_key(DType t, DType i) { return make_key(kScatter, t, i); }

void same_context(const char* op, const Tensor& a, const Tensor& b) {
  FLAME_CHECK(&a->ctx() == &b->ctx(), FLAME_ERROR_INVALID_ARGUMENT, op, ": tensors belong to different contexts");
}

void check_index_dtype(const char* op, const Tensor& index) {
  FLAME_CHECK(index->dtype == FLAME_DTYPE_I64 || index->dtype == FLAME_DTYPE_I32, FLAME_ERROR_DTYPE_MISMATCH, op,
              ": index must be i64 or i32, got ", dtype_name(index->dtype));
}

int64_t product(const Shape& s, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to; ++i) p *= s[i];
  return p;
}

// y with dim d repeated r times: tiled (interleave false) or element by element (true).
Tensor repeat_dim(const Tensor& y, int d, int64_t r, bool interleave) {
  const Shape& s = y->shape;
  const int64_t pre = product(s, 0, static_cast<size_t>(d)), len = s[static_cast<size_t>(d)];
  const int64_t post = product(s, static_cast<size_t>(d) + 1, s.size());
  Shape v = interleave ? Shape{pre, len, 1, post} : Shape{pre, 1, len, post};
  Shape e = interleave ? Shape{pre, len, r, post} : Shape{pre, r, len, post};
  Shape out = s;
  out[static_cast<size_t>(d)] = len * r;
  return ops::reshape(ops::expand(ops::reshape(y, v), e), out);
}

// The result of repeat / pad as a tensor of its own: a copy when it is still a view of x.
Tensor fresh(const Tensor& y, const Tensor& x) {
  if (!y->contiguous() || y->storage == x->storage) return ops::clone(y);
  return y;
}

}  // namespace

// ---------------------------------------------------------------- scatter

Tensor ops::scatter_index(const Tensor& x, int dim, const Tensor& index, const Tensor& src, const std::string& what) {
  Context& ctx = x->ctx();
  Tensor out = make_tensor(ctx, x->shape, x->dtype);
  copy_into(out, alias(x));
  int64_t n = index->numel();
  if (n > 0) {
    IndexLayout L{};
    L.ndim = index->ndim();
    L.dim = dim;
    for (int d = 0; d < L.ndim; ++d) {
      L.shape[d] = index->shape[d];
      L.idx_stride[d] = index->strides[d];
      L.data_stride[d] = out->strides[d];
      L.other_stride[d] = src->strides[d];
    }
    L.dim_size = out->shape[dim];
    uint32_t esrc = 0;
    CUdeviceptr rec = ctx.device_error_record(what, &esrc);
    CUdeviceptr po = out->data(), ps = src->data(), pi = index->data();
    void* args[] = {&po, &ps, &pi, &n, &L, &rec, &esrc};
    launch_flat(ctx, ctx.function(scatter_key(x->dtype, index->dtype)), n, args);
  }
  if (auto node = record(OpId::Scatter, {x, src}, {out})) {
    node->saved.emplace_back(index, false);
    node->attributes = ops::DimAttrs{dim};
  }
  return out;
}

Tensor ops::scatter(const Tensor& x, int dim0, const Tensor& index, const Tensor& src0) {
  const char* op = "scatter";
  same_context(op, x, index);
  same_context(op, x, src0);
  check_index_dtype(op, index);
  FLAME_CHECK(src0->dtype == x->dtype, FLAME_ERROR_DTYPE_MISMATCH, op, ": src has dtype ", dtype_name(src0->dtype),
              " but the input has ", dtype_name(x->dtype));
  FLAME_CHECK(x->ndim() >= 1, FLAME_ERROR_INVALID_ARGUMENT, op, ": the input must have at least one dim");
  const int dim = normalize_dim(dim0, x->ndim());
  FLAME_CHECK(index->ndim() == x->ndim(), FLAME_ERROR_SHAPE_MISMATCH, op, ": index has ", index->ndim(),
              " dims but the input has ", x->ndim());
  FLAME_CHECK(src0->ndim() == index->ndim(), FLAME_ERROR_SHAPE_MISMATCH, op, ": src has ", src0->ndim(),
              " dims but index has ", index->ndim());
  Tensor src = src0;
  for (int d = 0; d < x->ndim(); ++d) {
    FLAME_CHECK(d == dim || index->shape[d] <= x->shape[d], FLAME_ERROR_SHAPE_MISMATCH, op, ": index of shape ",
                shape_str(index->shape), " does not fit the input of shape ", shape_str(x->shape), " on dim ", d);
    FLAME_CHECK(index->shape[d] <= src0->shape[d], FLAME_ERROR_SHAPE_MISMATCH, op, ": src of shape ",
                shape_str(src0->shape), " is smaller than index of shape ", shape_str(index->shape), " on dim ", d);
    if (src->shape[d] != index->shape[d]) src = narrow(src, d, 0, index->shape[d]);  // a view: the gradient pads back
  }
  return scatter_index(x, dim, contiguous(alias(index)), src, "scatter: index");
}

// ---------------------------------------------------------------- masked_select

Tensor ops::masked_select(const Tensor& x, const Tensor& mask) {
  const char* op = "masked_select";
  same_context(op, x, mask);
  FLAME_CHECK(mask->dtype == FLAME_DTYPE_BOOL, FLAME_ERROR_DTYPE_MISMATCH, op, ": mask must be bool, got ",
              dtype_name(mask->dtype));
  Context& ctx = x->ctx();
  const Shape shape = broadcast_shapes(x->shape, mask->shape);
  const int64_t n = checked_numel(shape);
  Tensor flat = reshape(expand(x, shape), {n});
  Tensor src_pos = zeros(ctx, {0}, FLAME_DTYPE_I64);
  if (n > 0) {
    Tensor m = reshape(expand(mask, shape), {n});
    Tensor count_upto = cumsum(m, 0);  // i64: the number of true elements up to and including each
    const int64_t count = static_cast<int64_t>(item(select(count_upto, 0, n - 1)));  // waits for the device
    // Output position of each true element (its count - 1); -1 (skipped) for the false ones.
    Tensor pos = where(m, add_scalar(count_upto, -1), scalar(ctx, -1, FLAME_DTYPE_I64));
    src_pos = scatter_add_index(zeros(ctx, {count}, FLAME_DTYPE_I64), 0, pos, arange(ctx, 0, static_cast<double>(n), 1, FLAME_DTYPE_I64),
                                -1, 1.0, "masked_select: position");
  }
  return gather_index(flat, 0, src_pos, kNoIndex, false, "masked_select: position");
}

// ---------------------------------------------------------------- repeat, repeat_interleave

Tensor ops::repeat(const Tensor& x, const std::vector<int64_t>& reps) {
  const char* op = "repeat";
  const size_t k = reps.size(), nd = static_cast<size_t>(x->ndim());
  FLAME_CHECK(k >= nd, FLAME_ERROR_INVALID_ARGUMENT, op, ": ", k, " repeat counts for a tensor of ", nd,
              " dims (at least one per dim)");
  FLAME_CHECK(k <= FLAME_MAX_DIMS, FLAME_ERROR_INVALID_ARGUMENT, op, ": at most ", FLAME_MAX_DIMS, " repeat counts, got ", k);
  Shape s(k - nd, 1);
  s.insert(s.end(), x->shape.begin(), x->shape.end());
  Shape out_shape(k);
  for (size_t d = 0; d < k; ++d) {
    FLAME_CHECK(reps[d] >= 0, FLAME_ERROR_INVALID_ARGUMENT, op, ": repeat count ", reps[d], " of dim ", d, " is negative");
    out_shape[d] = checked_size_mul(s[d], reps[d], op);
  }
  checked_numel(out_shape, op);
  Tensor y = reshape(x, s);
  for (size_t d = 0; d < k; ++d)
    if (reps[d] != 1) y = repeat_dim(y, static_cast<int>(d), reps[d], false);
  return fresh(y, x);
}

Tensor ops::repeat_interleave(const Tensor& x, int64_t repeats, int dim0, bool flatten) {
  const char* op = "repeat_interleave";
  FLAME_CHECK(repeats >= 0, FLAME_ERROR_INVALID_ARGUMENT, op, ": repeats must be >= 0, got ", repeats);
  Tensor y = flatten ? reshape(x, {x->numel()}) : x;
  FLAME_CHECK(y->ndim() >= 1, FLAME_ERROR_INVALID_ARGUMENT, op, ": a 0-d tensor has no dim ", dim0,
              " (pass FLAME_DIM_ALL to flatten it)");
  const int dim = flatten ? 0 : normalize_dim(dim0, y->ndim());
  Shape out_shape = y->shape;
  out_shape[static_cast<size_t>(dim)] = checked_size_mul(out_shape[static_cast<size_t>(dim)], repeats, op);
  checked_numel(out_shape, op);
  return fresh(repeat_dim(y, dim, repeats, true), x);
}

// ---------------------------------------------------------------- pad

Tensor ops::constant_pad(const Tensor& x, const std::vector<int64_t>& lefts, const Shape& shape, double value) {
  Tensor out = full(x->ctx(), shape, x->dtype, value);
  int64_t off = out->offset;
  for (size_t d = 0; d < shape.size(); ++d) off += lefts[d] * out->strides[d];
  copy_into(make_view(out, x->shape, out->strides, off), x);
  if (auto node = record(OpId::ConstantPad, {x}, {out})) node->attributes = ops::PadAttrs{lefts};
  return out;
}

Tensor ops::pad(const Tensor& x, const std::vector<int64_t>& pads, PadMode mode, double value) {
  const char* op = "pad";
  const int nd = x->ndim();
  const size_t np = pads.size();
  FLAME_CHECK(np >= 2 && np % 2 == 0, FLAME_ERROR_INVALID_ARGUMENT, op, ": pads must hold a positive, even number of values, got ", np);
  const int k = static_cast<int>(np / 2);
  FLAME_CHECK(k <= nd, FLAME_ERROR_INVALID_ARGUMENT, op, ": ", np, " pad amounts for a tensor of ", nd, " dims");
  FLAME_CHECK(mode == PadMode::Constant || k <= 3, FLAME_ERROR_INVALID_ARGUMENT, op,
              ": reflect and replicate pad the last 1 to 3 dims (2, 4 or 6 amounts), got ", np);
  FLAME_CHECK(mode != PadMode::Constant || std::isfinite(value) || is_floating(x->dtype), FLAME_ERROR_INVALID_ARGUMENT, op,
              ": ", value, " does not fit ", dtype_name(x->dtype));
  Shape out_shape = x->shape;
  for (int i = 0; i < k; ++i) {
    const int d = nd - 1 - i;
    const int64_t n = x->shape[static_cast<size_t>(d)], l = pads[2 * static_cast<size_t>(i)], r = pads[2 * static_cast<size_t>(i) + 1];
    constexpr int64_t kMaxPad = int64_t{1} << 60;  // keeps the sum of the two amounts free of overflow
    FLAME_CHECK(l > -kMaxPad && l < kMaxPad && r > -kMaxPad && r < kMaxPad, FLAME_ERROR_INVALID_ARGUMENT, op,
                ": pad amounts (", l, ", ", r, ") of dim ", d, " are too large");
    FLAME_CHECK(std::max<int64_t>(0, -l) + std::max<int64_t>(0, -r) <= n, FLAME_ERROR_INVALID_ARGUMENT, op, ": negative pads (",
                l, ", ", r, ") remove more than the ", n, " elements of dim ", d);
    FLAME_CHECK(mode != PadMode::Reflect || (l < n && r < n), FLAME_ERROR_INVALID_ARGUMENT, op, ": reflect pads (", l, ", ",
                r, ") must be smaller than the size ", n, " of dim ", d);
    FLAME_CHECK(mode != PadMode::Replicate || n > 0 || (l <= 0 && r <= 0), FLAME_ERROR_INVALID_ARGUMENT, op,
                ": replicate cannot pad the empty dim ", d);
    const int64_t kept = n - std::max<int64_t>(0, -l) - std::max<int64_t>(0, -r);  // >= 0: the crops fit
    out_shape[static_cast<size_t>(d)] = checked_size_add(kept, std::max<int64_t>(0, l) + std::max<int64_t>(0, r), op);
  }
  checked_numel(out_shape, op);
  if (mode == PadMode::Constant) {
    Tensor y = x;
    std::vector<int64_t> lefts(static_cast<size_t>(nd), 0);
    bool grows = false;
    for (int i = 0; i < k; ++i) {
      const int d = nd - 1 - i;
      const int64_t l = pads[2 * static_cast<size_t>(i)], r = pads[2 * static_cast<size_t>(i) + 1];
      const int64_t cl = std::max<int64_t>(0, -l), cr = std::max<int64_t>(0, -r);
      if (cl || cr) y = narrow(y, d, cl, y->shape[static_cast<size_t>(d)] - cl - cr);  // negative amounts crop
      lefts[static_cast<size_t>(d)] = std::max<int64_t>(0, l);
      grows = grows || l > 0 || r > 0;
    }
    return grows ? constant_pad(y, lefts, out_shape, value) : fresh(y, x);
  }
  Context& ctx = x->ctx();
  Tensor y = x;
  for (int i = 0; i < k; ++i) {
    const int d = nd - 1 - i;
    const int64_t n = x->shape[static_cast<size_t>(d)], l = pads[2 * static_cast<size_t>(i)];
    const int64_t size = out_shape[static_cast<size_t>(d)];
    if (size == n && l == 0) continue;
    std::vector<int64_t> idx(static_cast<size_t>(size));
    for (int64_t j = 0; j < size; ++j) {
      int64_t m = j - l;
      if (mode == PadMode::Reflect) m = m < 0 ? -m : (m >= n ? 2 * (n - 1) - m : m);  // |l|, |r| < n: one reflection
      else m = std::min(std::max<int64_t>(m, 0), n - 1);
      idx[static_cast<size_t>(j)] = m;
    }
    Tensor it = from_host(ctx, idx.data(), idx.size() * sizeof(int64_t), {size}, FLAME_DTYPE_I64);
    y = index_select(y, d, it);
  }
  return fresh(y, x);
}

std::vector<std::string> ops::scatter_instantiations() {
  std::vector<std::string> v;
  for (DType i : {FLAME_DTYPE_I64, FLAME_DTYPE_I32})
    for (DType t : {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_F64, FLAME_DTYPE_I32, FLAME_DTYPE_I64,
                    FLAME_DTYPE_U8, FLAME_DTYPE_BOOL})
      v.push_back(kernel_name(scatter_key(t, i)));
  return v;
}

}  // namespace flame

// Reductions. sum, prod, amax, amin, argmax/argmin and cumsum are kernels (ops/launch.cpp);
// mean, var, std, norm and logsumexp are compositions, differentiable through their parts.
#include <algorithm>
#include <cmath>
#include "core/error.h"
#include "ops/launch.h"
#include "ops/ops.h"

namespace flame {

std::vector<int> ops::reduction_dims(const Tensor& t, const std::vector<int>& dims) {
  std::vector<int> r;
  if (dims.empty()) {
    for (int d = 0; d < t->ndim(); ++d) r.push_back(d);
    return r;
  }
  for (int d0 : dims) {
    int d = normalize_dim(d0, t->ndim());
    FLAME_CHECK(std::find(r.begin(), r.end(), d) == r.end(), FLAME_ERROR_INVALID_ARGUMENT, "dim ", d0,
                " appears twice in the reduction dims");
    r.push_back(d);
  }
  std::sort(r.begin(), r.end());
  return r;
}

Shape ops::reduced_shape(const Shape& shape, const std::vector<int>& rdims, bool keepdim) {
  Shape s;
  for (int d = 0; d < static_cast<int>(shape.size()); ++d) {
    bool red = std::find(rdims.begin(), rdims.end(), d) != rdims.end();
    if (!red) s.push_back(shape[d]);
    else if (keepdim) s.push_back(1);
  }
  return s;
}

static Tensor finish(const Tensor& kept, const Tensor& x, const std::vector<int>& rdims, bool keepdim) {
  if (keepdim) return kept;
  Shape s = ops::reduced_shape(x->shape, rdims, false);
  return make_view(kept, s, contiguous_strides(s), kept->offset);  // kept is contiguous
}

static Tensor reduce_op(OpId op, ReduceKind kind, const Tensor& x, const std::vector<int>& dims, bool keepdim,
                        DType out_dtype) {
  std::vector<int> rd = ops::reduction_dims(x, dims);
  Tensor out = finish(launch_reduce(x, rd, kind, out_dtype), x, rd, keepdim);
  if (auto node = record(op, {x}, {out})) {
    node->attributes = ops::ReduceAttrs{rd, keepdim};
    if (kind != ReduceKind::Sum) {
      node->saved.emplace_back(x, false);
      node->saved.emplace_back(out, true);
    }
  }
  return out;
}

Tensor ops::sum(const Tensor& x, const std::vector<int>& dims, bool keepdim) {
  return reduce_op(OpId::Sum, ReduceKind::Sum, x, dims, keepdim, sum_result_dtype(x->dtype));
}
Tensor ops::sum_as(const Tensor& x, const std::vector<int>& dims, bool keepdim, DType out_dtype) {
  return reduce_op(OpId::Sum, ReduceKind::Sum, x, dims, keepdim, out_dtype);
}
Tensor ops::prod(const Tensor& x, const std::vector<int>& dims, bool keepdim) {
  return reduce_op(OpId::Prod, ReduceKind::Prod, x, dims, keepdim, sum_result_dtype(x->dtype));
}
Tensor ops::amax(const Tensor& x, const std::vector<int>& dims, bool keepdim) {
  return reduce_op(OpId::Amax, ReduceKind::Max, x, dims, keepdim, x->dtype);
}
Tensor ops::amin(const Tensor& x, const std::vector<int>& dims, bool keepdim) {
  return reduce_op(OpId::Amin, ReduceKind::Min, x, dims, keepdim, x->dtype);
}

static int64_t count(const Tensor& x, const std::vector<int>& rd) {
  int64_t n = 1;
  for (int d : rd) n *= x->shape[d];
  return n;
}

static Tensor as_float(const Tensor& x) { return is_floating(x->dtype) ? x : ops::to_dtype(x, FLAME_DTYPE_F32); }
// f16/bf16 statistics are computed in f32 (a sum of squares overflows f16) and rounded once at the end.
static DType wide(DType d) { return (d == FLAME_DTYPE_F16 || d == FLAME_DTYPE_BF16) ? FLAME_DTYPE_F32 : d; }

Tensor ops::mean(const Tensor& x0, const std::vector<int>& dims, bool keepdim) {
  Tensor x = as_float(x0);
  int64_t n = count(x, reduction_dims(x, dims));
  Tensor s = sum_as(x, dims, keepdim, wide(x->dtype));  // accumulate and scale in f32, round once
  return to_dtype(mul_scalar(s, n ? 1.0 / static_cast<double>(n) : std::nan("")), x->dtype);
}

Tensor ops::var(const Tensor& x0, const std::vector<int>& dims, double correction, bool keepdim) {
  Tensor xf = as_float(x0);
  if (wide(xf->dtype) != xf->dtype) return to_dtype(var(to_dtype(xf, FLAME_DTYPE_F32), dims, correction, keepdim), xf->dtype);
  Tensor x = xf;
  int64_t n = count(x, reduction_dims(x, dims));
  Tensor centred = sub(x, mean(x, dims, true));
  double denom = static_cast<double>(n) - correction;
  return mul_scalar(sum(square(centred), dims, keepdim), denom > 0 ? 1.0 / denom : std::nan(""));
}

Tensor ops::std(const Tensor& x, const std::vector<int>& dims, double correction, bool keepdim) {
  return sqrt(var(x, dims, correction, keepdim));
}

Tensor ops::norm(const Tensor& x0, double p, const std::vector<int>& dims, bool keepdim) {
  Tensor x = as_float(x0);
  if (p == 2 && wide(x->dtype) != x->dtype) return to_dtype(norm(to_dtype(x, FLAME_DTYPE_F32), p, dims, keepdim), x->dtype);
  if (p == 2) return sqrt(sum(square(x), dims, keepdim));
  if (p == 1) return sum(abs(x), dims, keepdim);
  if (std::isinf(p) && p > 0) return amax(abs(x), dims, keepdim);
  fail(FLAME_ERROR_UNSUPPORTED, "norm: p must be 1, 2 or INFINITY, got ", p);
}

Tensor ops::logsumexp(const Tensor& x0, const std::vector<int>& dims, bool keepdim) {
  Tensor x = as_float(x0);
  if (wide(x->dtype) != x->dtype) return to_dtype(logsumexp(to_dtype(x, FLAME_DTYPE_F32), dims, keepdim), x->dtype);
  // Shift by the (detached) max for stability; the gradient does not depend on the shift.
  Tensor m = alias(amax(x, dims, true));
  Tensor finite = where(unary(OpId::IsInf, m), zeros(x->ctx(), {}, x->dtype), m);  // all -inf rows stay -inf
  Tensor s = log(sum(exp(sub(x, finite)), dims, true));
  Tensor r = add(s, finite);
  if (keepdim) return r;
  return reshape(r, reduced_shape(x->shape, reduction_dims(x, dims), false));
}

Tensor ops::argmax(const Tensor& x, int dim, bool all, bool keepdim, bool is_max) {
  if (all) {
    Tensor flat = reshape(alias(x), {x->numel()});
    Tensor r = launch_arg_reduce(flat, {0}, is_max);
    Shape s = keepdim ? Shape(x->ndim(), 1) : Shape{};
    return make_view(r, s, contiguous_strides(s), r->offset);
  }
  std::vector<int> rd = {normalize_dim(dim, x->ndim())};
  return finish(launch_arg_reduce(x, rd, is_max), x, rd, keepdim);
}

Tensor ops::cumsum(const Tensor& x, int dim0) {
  int dim = x->ndim() == 0 ? 0 : normalize_dim(dim0, x->ndim());
  if (x->ndim() == 0) return clone(x);
  Tensor out = launch_cumsum(x, dim, sum_result_dtype(x->dtype));
  if (auto node = record(OpId::CumSum, {x}, {out})) node->attributes = ops::DimAttrs{dim};
  return out;
}

}  // namespace flame

// Dequantisation and the linear layer over a frozen fp8 weight (ops/quantized.h; kernel:
// cuda/dequantize.cuh). quantized_linear computes its forward with linear's GEMM and epilogue
// (linear2d_forward) over a temporary dequantised weight, and records one QuantizedLinear node over
// (x, bias) that saves q and scale; the rule (autograd/backward_rules.cpp) dequantises them again.
#include "ops/quantized.h"
#include <tuple>
#include "core/error.h"
#include "ops/nn_rows.h"
#include "ops/ops.h"
#include "runtime/kernel_key.h"
#include "tensor/autograd_graph.h"

namespace flame {

namespace {

// <q dtype, out dtype, elements per thread>; q is a storage dtype (fp8), hence storage_dtypes.
constexpr KernelTemplate kDequantize{"dequantize.cuh", "flame::dequantize_kernel", {TArg::Dtype, TArg::Dtype, TArg::Int}, true};
constexpr int kVector = 8;  // elements per thread of the vector path (an 8-byte load of q)

bool is_f8(DType d) { return d == FLAME_DTYPE_F8_E4M3 || d == FLAME_DTYPE_F8_E5M2; }
bool is_compute_float(DType d) {
  return d == FLAME_DTYPE_F32 || d == FLAME_DTYPE_F16 || d == FLAME_DTYPE_BF16 || d == FLAME_DTYPE_F64;
}

// Checks q and scale as dequantize documents them; returns whether the scale is one per row.
bool check_quantized(const Tensor& q, const Tensor& scale, const char* op) {
  FLAME_CHECK(&q->ctx() == &scale->ctx(), FLAME_ERROR_INVALID_ARGUMENT, op, ": q and scale belong to different contexts");
  FLAME_CHECK(is_f8(q->dtype), FLAME_ERROR_DTYPE_MISMATCH, op, ": q must be F8_E4M3 or F8_E5M2, not ", dtype_name(q->dtype));
  FLAME_CHECK(scale->dtype == FLAME_DTYPE_F32, FLAME_ERROR_DTYPE_MISMATCH, op, ": the scale must be f32, not ",
              dtype_name(scale->dtype));
  if (scale->numel() == 1 && scale->ndim() <= q->ndim()) return false;
  bool per_row = q->ndim() >= 1 && scale->ndim() == q->ndim() && scale->shape[0] == q->shape[0];
  for (int d = 1; per_row && d < scale->ndim(); ++d) per_row = scale->shape[static_cast<size_t>(d)] == 1;
  FLAME_CHECK(per_row, FLAME_ERROR_SHAPE_MISMATCH, op, ": a scale of shape ", shape_str(scale->shape), " for q of shape ",
              shape_str(q->shape), " (one value, or one per row: [", q->ndim() ? q->shape[0] : 0, ", 1, ...] with q's dims)");
  return true;
}

KernelKey dequantize_key(DType q, DType out, int v) { return make_key(kDequantize, q, out, v); }

// The launch over contiguous q and out of the same shape.
void launch_dequantize(const Tensor& q, const Tensor& scale, const Tensor& out, bool per_row) {
  int64_t n = q->numel();
  if (n == 0) return;
  Context& ctx = q->ctx();
  int64_t cols = per_row ? n / q->shape[0] : n;
  const Tensor s = scale->contiguous() ? scale : ops::contiguous(scale);
  const int64_t out_vector_bytes = kVector * static_cast<int64_t>(out->elem_size());
  const bool vec = n % kVector == 0 && (!per_row || cols % kVector == 0) && q->data() % kVector == 0 &&
                   out->data() % static_cast<CUdeviceptr>(out_vector_bytes) == 0;
  const int v = vec ? kVector : 1;
  CUdeviceptr pq = q->data(), ps = s->data(), po = out->data();
  int32_t row_flag = per_row ? 1 : 0;
  void* args[] = {&pq, &ps, &po, &n, &cols, &row_flag};
  launch_flat(ctx, ctx.function(dequantize_key(q->dtype, out->dtype, v)), n / v, args);
}

}  // namespace

void ops::dequantize_into(const Tensor& q, const Tensor& scale, const Tensor& out) {
  const bool per_row = check_quantized(q, scale, "dequantize");
  FLAME_CHECK(&out->ctx() == &q->ctx(), FLAME_ERROR_INVALID_ARGUMENT, "dequantize: out belongs to another context");
  FLAME_CHECK(is_compute_float(out->dtype), FLAME_ERROR_DTYPE_MISMATCH, "dequantize: out must be f32, f16, bf16 or f64, not ",
              dtype_name(out->dtype));
  FLAME_CHECK(out->shape == q->shape && out->contiguous(), FLAME_ERROR_SHAPE_MISMATCH, "dequantize: out must be contiguous of q's shape ",
              shape_str(q->shape), ", got ", shape_str(out->shape), out->contiguous() ? "" : " (strided)");
  launch_dequantize(q->contiguous() ? q : contiguous(q), scale, out, per_row);
  out->storage->version++;
}

Tensor ops::dequantize(const Tensor& q, const Tensor& scale, DType dtype) {
  const bool per_row = check_quantized(q, scale, "dequantize");
  FLAME_CHECK(is_compute_float(dtype), FLAME_ERROR_DTYPE_MISMATCH, "dequantize: the result must be f32, f16, bf16 or f64, not ",
              dtype_name(dtype));
  Tensor out = make_tensor(q->ctx(), q->shape, dtype);
  launch_dequantize(q->contiguous() ? q : contiguous(q), scale, out, per_row);
  return out;
}

namespace {

// The recorded 2-D layer: x [R, in] (see linear_over_dequantized).
Tensor linear2d_over_dequantized(const Tensor& x, const std::function<Tensor(DType)>& dequantize_weight, const Tensor& bias,
                                 ops::Activation act, OpId op, const std::vector<Tensor>& weight_saved) {
  Context& ctx = x->ctx();
  const bool gelu = act == ops::Activation::GeluTanh;
  const bool keep_aux = gelu && ctx.recording() && (requires_grad(*x) || (bias && requires_grad(*bias)));
  Tensor out, aux;
  {
    const Tensor w = dequantize_weight(x->dtype);
    std::tie(out, aux) = ops::linear2d_forward(x, w, bias, act, keep_aux);
  }  // the dequantised weight goes here; the node keeps the quantised one
  if (auto node = record(op, {x, bias}, {out})) {
    node->attributes = ops::LinearAttrs{act, bias != nullptr, false};
    for (const Tensor& t : weight_saved) node->saved.emplace_back(t, false);
    if (act == ops::Activation::Relu) node->saved.emplace_back(out, true);
    if (gelu) {
      node->saved.emplace_back(aux, false);
      node->saved.emplace_back(x, false);
      if (bias) node->saved.emplace_back(bias, false);
    }
  }
  return out;
}

}  // namespace

Tensor ops::quantized_linear(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor& bias, Activation act) {
  check_quantized(q, scale, "quantized_linear");
  FLAME_CHECK(&x->ctx() == &q->ctx(), FLAME_ERROR_INVALID_ARGUMENT, "quantized_linear: x and the weight belong to different contexts");
  FLAME_CHECK(is_compute_float(x->dtype), FLAME_ERROR_DTYPE_MISMATCH, "quantized_linear: x must be f32, f16, bf16 or f64, not ",
              dtype_name(x->dtype));
  FLAME_CHECK(q->ndim() == 2, FLAME_ERROR_SHAPE_MISMATCH, "quantized_linear: the weight must be [out_features, in_features], got ",
              shape_str(q->shape));
  FLAME_CHECK(x->ndim() >= 1 && x->shape.back() == q->shape[1], FLAME_ERROR_SHAPE_MISMATCH, "quantized_linear: x ",
              shape_str(x->shape), " does not end in in_features ", q->shape[1]);
  if (bias) {
    FLAME_CHECK(&bias->ctx() == &x->ctx() && bias->dtype == x->dtype, FLAME_ERROR_DTYPE_MISMATCH,
                "quantized_linear: the bias must be ", dtype_name(x->dtype), " (x's dtype) of x's context, got ",
                dtype_name(bias->dtype));
    FLAME_CHECK(bias->ndim() == 1 && bias->shape[0] == q->shape[0], FLAME_ERROR_SHAPE_MISMATCH, "quantized_linear: bias ",
                shape_str(bias->shape), " must be [", q->shape[0], "]");
  }
  return linear_over_dequantized(x, [&](DType dtype) { return dequantize(q, scale, dtype); }, q->shape[1], q->shape[0],
                                 bias, act, OpId::QuantizedLinear, {q, scale});
}

Tensor ops::linear_over_dequantized(const Tensor& x, const std::function<Tensor(DType)>& dequantize_weight, int64_t in_features,
                                    int64_t out_features, const Tensor& bias, Activation act, OpId op,
                                    const std::vector<Tensor>& weight_saved) {
  if (x->ndim() == 2) return linear2d_over_dequantized(x, dequantize_weight, bias, act, op, weight_saved);
  Shape lead(x->shape.begin(), x->shape.end() - 1);
  int64_t rows = 1;
  for (int64_t s : lead) rows *= s;
  const Tensor out = linear2d_over_dequantized(reshape(x, {rows, in_features}), dequantize_weight, bias, act, op, weight_saved);
  lead.push_back(out_features);
  return reshape(out, lead);
}

std::vector<std::string> ops::dequantize_instantiations() {
  std::vector<std::string> v;
  for (DType q : {FLAME_DTYPE_F8_E4M3, FLAME_DTYPE_F8_E5M2})
    for (DType out : {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_F64})
      for (int w : {1, kVector}) v.push_back(kernel_name(dequantize_key(q, out, w)));
  return v;
}

}  // namespace flame

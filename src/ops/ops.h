// The internal op API. Every differentiable op here computes its result with a kernel (or as a
// view, or as a composition of other ops) and records its graph node through record(); backward
// rules are written with these same functions, so gradients are themselves differentiable.
#pragma once
#include <utility>
#include <vector>
#include "tensor/autograd_graph.h"
#include "tensor/op_list.h"
#include "tensor/tensor.h"

namespace flame::ops {

// ---- creation (never recorded) ----
Tensor empty(Context& ctx, const Shape& shape, DType dtype);
Tensor full(Context& ctx, const Shape& shape, DType dtype, double value);
Tensor zeros(Context& ctx, const Shape& shape, DType dtype);
Tensor zeros_like(const Tensor& t);
Tensor scalar(Context& ctx, double value, DType dtype);  // 0-d
Tensor arange(Context& ctx, double start, double end, double step, DType dtype);
Tensor linspace(Context& ctx, double start, double end, int64_t steps, DType dtype);
Tensor eye(Context& ctx, int64_t n, int64_t m, DType dtype);
Tensor rand(Context& ctx, const Shape& shape, DType dtype);
Tensor randn(Context& ctx, const Shape& shape, DType dtype);
Tensor from_host(Context& ctx, const void* data, size_t nbytes, const Shape& shape, DType dtype);
void to_host(const Tensor& t, void* data, size_t nbytes);
double item(const Tensor& t);
// Writes src (same shape) into dst, converting dtype, any strides; bumps dst's version. Not recorded.
void copy_into(const Tensor& dst, const Tensor& src);
void fill_(const Tensor& dst, double value);

// ---- elementwise ----
Tensor unary(OpId op, const Tensor& x, double s0 = 0, double s1 = 0);
// Node attributes of a recorded unary op: its scalars as passed to unary() (MulScalar's factor,
// PowScalar's exponent, LeakyRelu's slope, Elu's alpha, Softplus' beta and threshold, Clamp's bounds).
struct UnaryScalars {
  double s0 = 0, s1 = 0;
};
Tensor binary(OpId op, const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor to_dtype(const Tensor& t, DType dtype);
Tensor contiguous(const Tensor& t);
Tensor clone(const Tensor& t);

inline Tensor add(const Tensor& a, const Tensor& b) { return binary(OpId::Add, a, b); }
inline Tensor sub(const Tensor& a, const Tensor& b) { return binary(OpId::Sub, a, b); }
inline Tensor mul(const Tensor& a, const Tensor& b) { return binary(OpId::Mul, a, b); }
inline Tensor div(const Tensor& a, const Tensor& b) { return binary(OpId::Div, a, b); }
inline Tensor add_scalar(const Tensor& a, double s) { return unary(OpId::AddScalar, a, s); }
inline Tensor mul_scalar(const Tensor& a, double s) { return unary(OpId::MulScalar, a, s); }
inline Tensor neg(const Tensor& a) { return unary(OpId::Neg, a); }
inline Tensor exp(const Tensor& a) { return unary(OpId::Exp, a); }
inline Tensor log(const Tensor& a) { return unary(OpId::Log, a); }
inline Tensor sqrt(const Tensor& a) { return unary(OpId::Sqrt, a); }
inline Tensor square(const Tensor& a) { return unary(OpId::Square, a); }
inline Tensor abs(const Tensor& a) { return unary(OpId::Abs, a); }
// A bool tensor converted to `like`'s dtype (0/1), for masks in backward rules.
Tensor mask_as(const Tensor& mask, const Tensor& like);

// ---- views ----
Tensor reshape(const Tensor& t, const Shape& shape);
Tensor view(const Tensor& t, const Shape& shape);  // fails when no view exists
Tensor permute(const Tensor& t, const std::vector<int>& dims);
struct PermuteAttrs {  // node attributes of Permute: the normalised dims
  std::vector<int> dims;
};
Tensor transpose(const Tensor& t, int d0, int d1);
Tensor expand(const Tensor& t, const Shape& shape);
Tensor squeeze(const Tensor& t, int dim);
Tensor squeeze_all(const Tensor& t);
Tensor unsqueeze(const Tensor& t, int dim);
Tensor narrow(const Tensor& t, int dim, int64_t start, int64_t length);
Tensor slice(const Tensor& t, int dim, int64_t start, int64_t end, int64_t step);
Tensor select(const Tensor& t, int dim, int64_t index);
Tensor flip(const Tensor& t, const std::vector<int>& dims);
Tensor diagonal(const Tensor& t, int64_t offset, int d1, int d2);
// Applies a normalised ViewSpec (records ViewSlice) / scatters g into zeros of `shape` (ViewScatter).
Tensor view_slice(const Tensor& t, const ViewSpec& spec);
Tensor view_scatter(const Tensor& g, const Shape& shape, const ViewSpec& spec);
// Sums g down to shape (the backward of broadcasting).
Tensor sum_to(const Tensor& g, const Shape& shape);

// Node attributes of the ops recorded with one normalised dim (Cat, CumSum, Softmax, LogSoftmax, Scatter).
struct DimAttrs {
  int dim = 0;
};

// ---- joining and splitting ----
Tensor cat(const std::vector<Tensor>& ts, int dim);
Tensor stack(const std::vector<Tensor>& ts, int dim);
std::vector<Tensor> split_sizes(const Tensor& t, const std::vector<int64_t>& sizes, int dim);
Tensor triangle(const Tensor& t, int64_t diagonal, bool upper);

// ---- reductions (dims empty = all) ----
Tensor sum(const Tensor& t, const std::vector<int>& dims, bool keepdim);
// Sum with the result in out_dtype (f32 sums of f16/bf16 inputs without an f32 copy of the input).
Tensor sum_as(const Tensor& t, const std::vector<int>& dims, bool keepdim, DType out_dtype);
Tensor mean(const Tensor& t, const std::vector<int>& dims, bool keepdim);
Tensor prod(const Tensor& t, const std::vector<int>& dims, bool keepdim);
Tensor amax(const Tensor& t, const std::vector<int>& dims, bool keepdim);
Tensor amin(const Tensor& t, const std::vector<int>& dims, bool keepdim);
Tensor var(const Tensor& t, const std::vector<int>& dims, double correction, bool keepdim);
Tensor std(const Tensor& t, const std::vector<int>& dims, double correction, bool keepdim);
Tensor norm(const Tensor& t, double p, const std::vector<int>& dims, bool keepdim);
Tensor logsumexp(const Tensor& t, const std::vector<int>& dims, bool keepdim);
Tensor argmax(const Tensor& t, int dim, bool all, bool keepdim, bool is_max);
Tensor cumsum(const Tensor& t, int dim);
// The normalised, sorted reduction axes (all axes when dims is empty).
std::vector<int> reduction_dims(const Tensor& t, const std::vector<int>& dims);
Shape reduced_shape(const Shape& shape, const std::vector<int>& rdims, bool keepdim);
struct ReduceAttrs {  // node attributes of a recorded reduction
  std::vector<int> dims;  // reduction_dims()
  bool keepdim = false;
};

// ---- matrix products (ops/matmul.cpp, on cuBLASLt) ----
enum class Activation : int { None = 0, Relu = 1, GeluTanh = 2 };  // values of flame_activation_t
Tensor matmul(const Tensor& a, const Tensor& b);  // NumPy semantics
Tensor bmm(const Tensor& a, const Tensor& b);
// The recorded product of a [..., M, K] and b [..., K, N] with equal batch dims.
Tensor mm(const Tensor& a, const Tensor& b);
// act(x W^T + bias); bias may be null. Fused into the GEMM's epilogue where cuBLASLt can.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias, Activation act);
// linear's forward over x [R, in] without recording anything: act(x W^T + bias) and, with keep_aux and
// an activation, what a backward reads (gelu: the pre-activation; relu, when fused: its bit mask; else
// null). For ops that record their own node over the same GEMM and epilogue (quantized_linear).
std::pair<Tensor, Tensor> linear2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Activation act,
                                           bool keep_aux);
struct LinearAttrs {  // node attributes of Linear and QuantizedLinear
  Activation act = Activation::None;
  bool has_bias = false;
  bool has_relu_mask = false;  // the fused path saved relu's bit mask (last saved tensor)
};
// Gradients of W (dz^T x) and bias (column sums of dz) for dz [R, out], x [R, in]; one GEMM with a
// bias-gradient epilogue when both are wanted and no graph is being recorded. out: their dtype, dz's
// or (f16/bf16 dz, outside a recorded backward) f32, written by the GEMM itself.
std::pair<Tensor, Tensor> linear_weight_grad(const Tensor& dz, const Tensor& x, bool want_weight, bool want_bias,
                                             DType out);
// a [M, K] @ b [K, N] of f16/bf16 operands into an f32 result (f32 accumulation, no rounding to
// the operands' dtype); not recorded, so only for backward rules outside create_graph.
Tensor mm_wide(const Tensor& a, const Tensor& b);
// Cross-node fusion for backward: dz = (g W) * act'(pre) in one GEMM whose epilogue (DRELU / DGELU)
// reads the aux a producing Linear saved (relu: its bit mask; gelu: its pre-activation). g [R, out],
// w [out, in], aux for [R, in]. Returns false, having written nothing, when no epilogue fits (the
// caller runs the separate rules then). The producer's bias gradient then comes out of its
// weight-gradient GEMM (BGRADB), which measured faster than a BGRAD on this GEMM.
bool linear_input_grad_through_activation(const Tensor& g, const Tensor& w, Activation act, const Tensor& aux, Tensor* dz);

}  // namespace flame::ops

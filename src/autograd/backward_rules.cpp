// Every backward rule of FLAME, one per op of src/tensor/op_list.h, each written with FLAME ops so
// that it is itself recorded when create_graph asks for it (higher-order gradients).
// A rule gets the node (its saved tensors, attributes and input geometry) and the gradient of the
// node's output, and returns one gradient per input (null where none is needed). Broadcasting and
// dtype promotion are separate Expand and Cast nodes, so no rule undoes them.
// Which rule an op has is the Backward column of its row in src/tensor/op_list.h: the table at the end
// of the rules is generated from the rows (a RULE row names bw_<Id>, so a missing rule does not
// compile). What an elementwise op saves is the row's Saves column; its rule reads the saved tensors
// through saved_input / saved_output, which fail on a tensor the row does not save.
#include <algorithm>
#include <array>
#include <cmath>
#include "autograd/engine.h"
#include "tensor/autograd_graph.h"
#include "core/error.h"
#include "ops/attention.h"
#include "ops/nn.h"
#include "ops/indexing.h"
#include "ops/loss.h"
#include "ops/conv.h"
#include "ops/derivatives.h"
#include "ops/nnops.h"
#include "ops/ops.h"
#include "ops/nf4.h"
#include "ops/quantized.h"

namespace flame {

using namespace ops;
using Grads = std::vector<Tensor>;
using Rule = Grads (*)(Node&, const Tensor&);

namespace {

Tensor saved(Node& n, size_t i) { return n.saved.at(i).unpack(n); }
// An elementwise node's saved tensors, laid out by ops::unary / ops::binary from the row's Saves
// column: the inputs (when saved), then the output (when saved).
Tensor saved_input(Node& n, size_t k) {
  if (!saves_input(n.op)) fail(FLAME_ERROR_INTERNAL, "backward of ", op_name(n.op), " reads an input its row does not save");
  return saved(n, k);
}
Tensor saved_output(Node& n) {
  if (!saves_output(n.op)) fail(FLAME_ERROR_INTERNAL, "backward of ", op_name(n.op), " reads an output its row does not save");
  return saved(n, saves_input(n.op) ? n.inputs.size() : 0);
}
Tensor like_scalar(const Tensor& t, double v) { return scalar(t->ctx(), v, t->dtype); }
Tensor cmp(OpId op, const Tensor& x, double v) { return binary(op, x, like_scalar(x, v)); }
// The scalars of a unary op (UnaryScalars).
double s0(const Node& n) { return n.attrs<UnaryScalars>().s0; }
double s1(const Node& n) { return n.attrs<UnaryScalars>().s1; }
// The reduced axes stored by reductions, and g reshaped to keepdim geometry.
const std::vector<int>& rdims(const Node& n) { return n.attrs<ReduceAttrs>().dims; }
Tensor keep(const Node& n, const Tensor& g) {
  if (n.attrs<ReduceAttrs>().keepdim) return g;
  return reshape(g, reduced_shape(n.inputs[0].shape, rdims(n), true));
}
int dim_of(const Node& n) { return n.attrs<DimAttrs>().dim; }

// The algebra of ops/derivatives.h on tensors: each operation one FLAME op.
struct TensorMath {
  using Value = Tensor;
  Tensor mul(const Tensor& a, const Tensor& b) const { return ops::mul(a, b); }
  Tensor div(const Tensor& a, const Tensor& b) const { return ops::div(a, b); }
  Tensor neg(const Tensor& a) const { return ops::neg(a); }
  Tensor scale(const Tensor& a, double c) const { return mul_scalar(a, c); }
  Tensor rsub(const Tensor& a, double c) const { return unary(OpId::RsubScalar, a, c); }
  Tensor square(const Tensor& a) const { return ops::square(a); }
  Tensor pow(const Tensor& a, double c) const { return unary(OpId::PowScalar, a, c); }
  Tensor sin(const Tensor& a) const { return unary(OpId::Sin, a); }
  Tensor cos(const Tensor& a) const { return unary(OpId::Cos, a); }
  Tensor sign(const Tensor& a) const { return unary(OpId::Sign, a); }
  Tensor zero(const Tensor& g) const { return zeros_like(g); }
};
constexpr TensorMath kTensorMath{};
namespace d = derivatives;

#define RULE(Id) Grads bw_##Id(Node& n, const Tensor& g)

RULE(Neg) { return {neg(g)}; }
RULE(Abs) { return {d::abs(kTensorMath, g, saved_input(n, 0))}; }
RULE(Exp) { return {d::exp(kTensorMath, g, saved_output(n))}; }
RULE(Log) { return {d::log(kTensorMath, g, saved_input(n, 0))}; }
RULE(Log1p) { return {div(g, add_scalar(saved_input(n, 0), 1))}; }
RULE(Expm1) { return {mul(g, add_scalar(saved_output(n), 1))}; }
RULE(Sqrt) { return {d::sqrt(kTensorMath, g, saved_output(n))}; }
RULE(Rsqrt) { return {d::rsqrt(kTensorMath, g, saved_output(n))}; }
RULE(Sin) { return {d::sin(kTensorMath, g, saved_input(n, 0))}; }
RULE(Cos) { return {d::cos(kTensorMath, g, saved_input(n, 0))}; }
RULE(Tanh) { return {d::tanh(kTensorMath, g, saved_output(n))}; }
RULE(Sigmoid) { return {d::sigmoid(kTensorMath, g, saved_output(n))}; }
RULE(Relu) { return {mul(g, mask_as(cmp(OpId::Gt, saved_input(n, 0), 0), g))}; }
RULE(Silu) {  // d/dx x s(x) = s (1 + x (1 - s))
  Tensor x = saved_input(n, 0), s = unary(OpId::Sigmoid, x);
  return {mul(g, mul(s, add_scalar(mul(x, unary(OpId::RsubScalar, s, 1)), 1)))};
}
RULE(Floor) { return {zeros_like(g)}; }
RULE(Ceil) { return {zeros_like(g)}; }
RULE(Round) { return {zeros_like(g)}; }
RULE(Sign) { return {zeros_like(g)}; }
RULE(Reciprocal) { return {mul(g, neg(square(saved_output(n))))}; }
RULE(Square) { return {mul(g, mul_scalar(saved_input(n, 0), 2))}; }
RULE(AddScalar) { return {g}; }
RULE(SubScalar) { return {g}; }
RULE(MulScalar) { return {mul_scalar(g, s0(n))}; }
RULE(RsubScalar) { return {neg(g)}; }
RULE(PowScalar) {
  if (s0(n) == 0) return {zeros_like(g)};  // nothing saved is read
  return {d::pow_scalar(kTensorMath, g, saved_input(n, 0), s0(n))};
}
RULE(LeakyRelu) { return {where(cmp(OpId::Gt, saved_input(n, 0), 0), g, mul_scalar(g, s0(n)))}; }
RULE(Elu) { return {where(cmp(OpId::Gt, saved_input(n, 0), 0), g, mul(g, add_scalar(saved_output(n), s0(n))))}; }
RULE(Gelu) { return {mul(g, unary(OpId::GeluDeriv, saved_input(n, 0)))}; }
RULE(GeluDeriv) {  // d/dx (Phi + x phi) = phi (2 - x^2)
  Tensor x = saved_input(n, 0);
  Tensor phi = mul_scalar(exp(mul_scalar(square(x), -0.5)), 0.39894228040143267794);
  return {mul(g, mul(phi, unary(OpId::RsubScalar, square(x), 2)))};
}
RULE(GeluTanh) { return {binary(OpId::GeluTanhBackward, g, saved_input(n, 0))}; }
// gelu_tanh''(x): u = k (x + c x^3), t = tanh u: (1 - t^2) (u' + 0.5 x (u'' - 2 t u'^2))
Tensor gelu_tanh_second(const Tensor& x) {
  const double k = 0.79788456080286535588, c = 0.044715;
  Tensor x2 = square(x);
  Tensor t = unary(OpId::Tanh, mul_scalar(mul(x, add_scalar(mul_scalar(x2, c), 1)), k));
  Tensor du = mul_scalar(add_scalar(mul_scalar(x2, 3 * c), 1), k), ddu = mul_scalar(x, 6 * k * c);
  Tensor inner = add(du, mul(mul_scalar(x, 0.5), sub(ddu, mul(mul_scalar(t, 2), square(du)))));
  return mul(unary(OpId::RsubScalar, square(t), 1), inner);
}
RULE(GeluTanhDeriv) { return {mul(g, gelu_tanh_second(saved_input(n, 0)))}; }
RULE(GeluTanhBackward) {  // f(g, z) = g gelu'(z): df/dg = gelu'(z), df/dz = g gelu''(z)
  Tensor gin = saved_input(n, 0), z = saved_input(n, 1);
  return {n.needs_input_grad(0) ? mul(g, unary(OpId::GeluTanhDeriv, z)) : nullptr,
          n.needs_input_grad(1) ? mul(mul(g, gin), gelu_tanh_second(z)) : nullptr};
}
RULE(Softplus) {
  Tensor z = mul_scalar(saved_input(n, 0), s0(n));
  return {where(cmp(OpId::Gt, z, s1(n)), g, mul(g, unary(OpId::Sigmoid, z)))};
}
RULE(Clamp) {
  Tensor x = saved_input(n, 0);
  Tensor inside = binary(OpId::LogicalAnd, cmp(OpId::Ge, x, s0(n)), cmp(OpId::Le, x, s1(n)));
  return {where(inside, g, like_scalar(g, 0))};
}

RULE(Add) { return {g, g}; }
RULE(Sub) { return {g, n.needs_input_grad(1) ? neg(g) : nullptr}; }  // a - target: no kernel for the target
RULE(Mul) {
  return {n.needs_input_grad(0) ? mul(g, saved_input(n, 1)) : nullptr, n.needs_input_grad(1) ? mul(g, saved_input(n, 0)) : nullptr};
}
RULE(Div) {  // d(a/b)/db = -a/b^2 = -out/b
  Tensor b = saved_input(n, 1);
  return {n.needs_input_grad(0) ? div(g, b) : nullptr, n.needs_input_grad(1) ? neg(div(mul(g, saved_output(n)), b)) : nullptr};
}
RULE(Pow) {
  Tensor a = saved_input(n, 0), b = saved_input(n, 1);
  Tensor ga, gb;
  if (n.needs_input_grad(0)) ga = mul(g, mul(b, binary(OpId::Pow, a, add_scalar(b, -1))));
  if (n.needs_input_grad(1))  // 0^b has derivative 0 in b (PyTorch masks it the same way)
    gb = where(cmp(OpId::Eq, a, 0), like_scalar(g, 0), mul(mul(g, saved_output(n)), log(a)));
  return {ga, gb};
}
Grads max_min(Node& n, const Tensor& g, OpId wins) {  // ties split the gradient evenly, as PyTorch
  Tensor a = saved_input(n, 0), b = saved_input(n, 1);
  Tensor wa = add(mask_as(binary(wins, a, b), g), mul_scalar(mask_as(binary(OpId::Eq, a, b), g), 0.5));
  return {mul(g, wa), mul(g, unary(OpId::RsubScalar, wa, 1))};
}
RULE(Maximum) { return max_min(n, g, OpId::Gt); }
RULE(Minimum) { return max_min(n, g, OpId::Lt); }

RULE(Where) {
  Tensor c = saved(n, 0), z = like_scalar(g, 0);
  return {n.needs_input_grad(0) ? where(c, g, z) : nullptr, n.needs_input_grad(1) ? where(c, z, g) : nullptr};
}
RULE(Cast) { return {to_dtype(g, n.inputs[0].dtype)}; }
RULE(Copy) { return {g}; }
RULE(Reshape) { return {reshape(g, n.inputs[0].shape)}; }
RULE(Permute) {
  const std::vector<int>& dims = n.attrs<PermuteAttrs>().dims;
  std::vector<int> inv(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) inv[static_cast<size_t>(dims[i])] = static_cast<int>(i);
  return {permute(g, inv)};
}
RULE(Expand) { return {sum_to(g, n.inputs[0].shape)}; }
RULE(ViewSlice) { return {view_scatter(g, n.inputs[0].shape, n.view)}; }
RULE(ViewScatter) { return {view_slice(g, n.view)}; }
RULE(Cat) {
  const int dim = dim_of(n);
  Grads out;
  int64_t off = 0;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    int64_t len = n.inputs[i].shape[dim];
    if (n.needs_input_grad(i)) out.push_back(to_dtype(narrow(g, dim, off, len), n.inputs[i].dtype));
    else out.push_back(nullptr);
    off += len;
  }
  return out;
}
RULE(Sum) { return {to_dtype(expand(keep(n, g), n.inputs[0].shape), n.inputs[0].dtype)}; }
RULE(Prod) {  // handles zeros: with one zero in a group its gradient is the product of the rest
  Tensor x = saved(n, 0), out = keep(n, saved(n, 1)), gk = keep(n, g);
  const std::vector<int>& rd = rdims(n);
  Tensor is_zero = cmp(OpId::Eq, x, 0);
  Tensor nz_prod = prod(where(is_zero, like_scalar(x, 1), x), rd, true);
  Tensor zeros_in_group = sum(mask_as(is_zero, x), rd, true);
  // At a zero x_i the gradient is the product of the others: nz_prod with one zero in the group;
  // with two, x_k * nz_prod where x_k is the other zero (value 0, but its derivative is what
  // double backward needs), written as (sum of the zeros - x_i) * nz_prod; with more, 0.
  Tensor zero_sum = sum(where(is_zero, x, like_scalar(x, 0)), rd, true);
  Tensor two = mul(sub(zero_sum, x), nz_prod);
  Tensor at_zero = where(cmp(OpId::Eq, zeros_in_group, 1), nz_prod,
                         where(cmp(OpId::Eq, zeros_in_group, 2), two, like_scalar(x, 0)));
  Tensor safe_x = where(is_zero, like_scalar(x, 1), x);  // no 0/0, whose NaN would leak into double backward
  return {mul(gk, where(is_zero, at_zero, div(out, safe_x)))};
}
Grads amax_amin(Node& n, const Tensor& g) {  // the gradient is split evenly between ties (torch.amax)
  Tensor x = saved(n, 0), out = keep(n, saved(n, 1));
  Tensor hit = mask_as(binary(OpId::Eq, x, out), g);
  return {div(mul(hit, keep(n, g)), sum(hit, rdims(n), true))};
}
RULE(Amax) { return amax_amin(n, g); }
RULE(Amin) { return amax_amin(n, g); }
RULE(Matmul) {  // a [..., M, K] @ b [..., K, N]: ga = g b^T, gb = a^T g, as products of transposed views
  // (each operand is saved only when the other needs its gradient)
  const int r = static_cast<int>(n.inputs[0].shape.size()) - 2, c = r + 1;
  return {n.needs_input_grad(0) ? mm(g, transpose(saved(n, 1), r, c)) : nullptr,
          n.needs_input_grad(1) ? mm(transpose(saved(n, 0), r, c), g) : nullptr};
}
// Linear's gradients from dz, the gradient of its pre-activation z = x W^T + b. gx is null when
// `input_done` (fused into the next GEMM). wide[i]: input i's gradient in f32, written by the GEMM
// (f16/bf16 operands that autocast made from f32 tensors; engine.cpp skips those casts' backward).
Grads linear_grads_from_pre(Node& n, const Tensor& dz, bool input_done, const std::array<bool, 3>& wide = {}) {
  // x is saved only when dW is needed, W only when dx is (ops/matmul.cpp linear2d)
  Tensor x = n.needs_input_grad(1) ? saved(n, 0) : nullptr;
  Tensor w = n.needs_input_grad(0) && !input_done ? saved(n, 1) : nullptr;
  const DType narrow = dz->dtype, f32 = FLAME_DTYPE_F32;
  const bool wide_wb = n.needs_input_grad(1) ? wide[1] : wide[2];  // dW and db come out of one GEMM
  auto [gw, gb] = linear_weight_grad(dz, x, n.needs_input_grad(1), n.needs_input_grad(2), wide_wb ? f32 : narrow);
  if (gb && gb->dtype != (wide[2] ? f32 : narrow)) gb = to_dtype(gb, wide[2] ? f32 : narrow);
  Tensor gx;
  if (n.needs_input_grad(0) && !input_done) gx = wide[0] ? mm_wide(dz, w) : mm(dz, w);
  return {gx, gw, gb};
}
// dz = g act'(z) for y = act(z).
Tensor linear_pre_grad(Node& n, const Tensor& g) {
  const LinearAttrs& a = n.attrs<LinearAttrs>();
  const Activation act = a.act;
  if (act == Activation::Relu) return where(cmp(OpId::Gt, saved(n, 2), 0), g, like_scalar(g, 0));
  if (act == Activation::GeluTanh) {  // under create_graph, a pre-activation with history reaches x, W, b
    Tensor x = saved(n, 0), w = saved(n, 1);
    Tensor z = g->ctx().recording() ? linear(x, w, a.has_bias ? saved(n, 3) : nullptr, Activation::None) : saved(n, 2);
    return binary(OpId::GeluTanhBackward, g, z);
  }
  return g;
}
RULE(Linear) {  // y = act(z), z = x W^T + b: dz = g act'(z); gx = dz W; gW = dz^T x; gb = column sums of dz
  return linear_grads_from_pre(n, linear_pre_grad(n, g), false);
}
RULE(CumSum) {
  const int dim = dim_of(n);
  return {flip(cumsum(flip(g, {dim}), dim), {dim})};
}

// ---------------- neural-network ops (ops/nn.h): softmax and normalisation ----------------
// Without create_graph (the engine is not recording) each rule runs the op's fused backward kernel.
// With it, the same gradient is composed of FLAME ops, the statistics recomputed from x so that they
// are differentiated too; f16/bf16 are composed in f32 and the results cast back.

Tensor wide(const Tensor& t) {
  return t && (t->dtype == FLAME_DTYPE_F16 || t->dtype == FLAME_DTYPE_BF16) ? to_dtype(t, FLAME_DTYPE_F32) : t;
}
Tensor narrow_to(const Tensor& t, const TensorInfo& info) { return t ? to_dtype(reshape(t, info.shape), info.dtype) : t; }
std::vector<int> dims_except(int nd, const std::vector<int>& keep) {
  std::vector<int> d;
  for (int i = 0; i < nd; ++i)
    if (std::find(keep.begin(), keep.end(), i) == keep.end()) d.push_back(i);
  return d;
}
Tensor sum_over(const Tensor& t, const std::vector<int>& dims) { return dims.empty() ? t : sum(t, dims, false); }

// dx of y = xhat * w (+ b), xhat = (x - mean) * rstd over `dims` (centre false: RMS, xhat = x * rstd),
// given gw = g * w: rstd * (gw - mean(gw) - xhat * mean(gw * xhat)). Returns {dx, xhat}.
Grads composed_norm(const Tensor& x, const Tensor& gw, const std::vector<int>& dims, bool centre, double eps) {
  Tensor xc = centre ? sub(x, mean(x, dims, true)) : x;
  Tensor rstd = unary(OpId::Rsqrt, add_scalar(mean(square(xc), dims, true), eps));
  Tensor xhat = mul(xc, rstd);
  Tensor inner = sub(gw, mul(xhat, mean(mul(gw, xhat), dims, true)));
  if (centre) inner = sub(inner, mean(gw, dims, true));
  return {mul(rstd, inner), xhat};
}

// weight [C] as [1, C, 1, ...] for an [N, C, *] tensor of nd dims.
Tensor per_channel(const Tensor& w, int nd) {
  Shape s(static_cast<size_t>(nd), 1);
  s[1] = w->shape[0];
  return reshape(w, s);
}

Grads softmax_rule(Node& n, const Tensor& g, bool log) {
  Tensor y = saved(n, 0);
  const int dim = dim_of(n);
  if (!g->ctx().recording()) return {softmax_backward(g, y, dim, log)};
  if (log) return {sub(g, mul(exp(y), sum(g, {dim}, true)))};
  return {mul(y, sub(g, sum(mul(g, y), {dim}, true)))};
}
RULE(Softmax) { return softmax_rule(n, g, false); }
RULE(LogSoftmax) { return softmax_rule(n, g, true); }

// layer_norm / rms_norm (inputs x, weight[, bias]) and group_norm (inputs x, weight, bias); attributes
// NormAttrs. Saved: x, weight, mean, rstd.
Grads row_norm_rule(Node& n, const Tensor& g, NormKind kind) {
  const NormAttrs& a = n.attrs<NormAttrs>();
  Tensor x = saved(n, 0), w = a.has_weight ? saved(n, 1) : nullptr;
  const bool has_b = kind != NormKind::Rms && a.has_bias;
  const bool nx = n.needs_input_grad(0), nw = w && n.needs_input_grad(1), nb = has_b && n.needs_input_grad(2);
  Grads out(n.next.size());
  if (!g->ctx().recording()) {
    Tensor mu = kind == NormKind::Rms ? nullptr : saved(n, 2), rstd = saved(n, 3);
    NormGrads r = norm_backward(kind, norm_geometry(kind, x->shape, a.k_or_groups), g, x, w, mu, rstd, nx, nw, nb);
    out[0] = r.dx;
    if (nw) out[1] = narrow_to(r.dw, n.inputs[1]);
    if (nb) out[2] = narrow_to(r.db, n.inputs[2]);
    return out;
  }
  const int nd = x->ndim();
  const double eps = a.eps;
  Tensor xf = wide(x), gf = wide(g), wf = wide(w), xhat;
  std::vector<int> wdims;  // the dims dw and db sum over
  if (kind == NormKind::Group) {
    const int64_t N = x->shape[0], G = a.k_or_groups, D = N > 0 ? x->numel() / (N * G) : 0;
    Tensor gw = wf ? mul(gf, per_channel(wf, nd)) : gf;
    Grads r = composed_norm(reshape(xf, {N, G, D}), reshape(gw, {N, G, D}), {2}, true, eps);
    out[0] = nx ? to_dtype(reshape(r[0], x->shape), x->dtype) : nullptr;
    xhat = reshape(r[1], x->shape);
    wdims = dims_except(nd, {1});
  } else {
    const int k = static_cast<int>(a.k_or_groups);
    std::vector<int> dims;
    for (int d = nd - k; d < nd; ++d) dims.push_back(d);
    Grads r = composed_norm(xf, wf ? mul(gf, wf) : gf, dims, kind == NormKind::Layer, eps);
    out[0] = nx ? to_dtype(r[0], x->dtype) : nullptr;
    xhat = r[1];
    for (int d = 0; d < nd - k; ++d) wdims.push_back(d);
  }
  if (nw) out[1] = narrow_to(sum_over(mul(gf, xhat), wdims), n.inputs[1]);
  if (nb) out[2] = narrow_to(sum_over(gf, wdims), n.inputs[2]);
  return out;
}
RULE(LayerNorm) { return row_norm_rule(n, g, NormKind::Layer); }
RULE(RmsNorm) { return row_norm_rule(n, g, NormKind::Rms); }
RULE(GroupNorm) { return row_norm_rule(n, g, NormKind::Group); }

// batch_norm (inputs x, weight, bias; attributes BatchNormAttrs); saved x, weight, and
// the statistics used: batch mean/rstd (training, recomputed when composing) or running ones (eval,
// constants).
RULE(BatchNorm) {
  const BatchNormAttrs& a = n.attrs<BatchNormAttrs>();
  Tensor x = saved(n, 0), w = a.has_weight ? saved(n, 1) : nullptr;
  const bool training = a.training;
  const bool nx = n.needs_input_grad(0), nw = w && n.needs_input_grad(1), nb = a.has_bias && n.needs_input_grad(2);
  Tensor mu = saved(n, 2), rstd = saved(n, 3);
  if (!g->ctx().recording()) {
    NormGrads r = batch_norm_backward(g, x, w, mu, rstd, training, nx, nw, nb);
    return {r.dx, nw ? r.dw : nullptr, nb ? r.db : nullptr};
  }
  const int nd = x->ndim();
  std::vector<int> dims = dims_except(nd, {1});
  Tensor xf = wide(x), gf = wide(g), wf = wide(w);
  Tensor gw = wf ? mul(gf, per_channel(wf, nd)) : gf;
  Tensor dx, xhat;
  if (training) {
    Grads r = composed_norm(xf, gw, dims, true, a.eps);
    dx = r[0];
    xhat = r[1];
  } else {
    Tensor rs = per_channel(rstd, nd);
    xhat = mul(sub(xf, per_channel(mu, nd)), rs);
    dx = mul(gw, rs);
  }
  return {nx ? to_dtype(dx, x->dtype) : nullptr, nw ? narrow_to(sum(mul(gf, xhat), dims, false), n.inputs[1]) : nullptr,
          nb ? narrow_to(sum(gf, dims, false), n.inputs[2]) : nullptr};
}

// ---- losses (ops/loss.h) ----
// The fused backward kernel when no graph of the backward is being built; otherwise the same
// formula written with FLAME ops (softmax as exp(x - logsumexp x)), in the accumulation dtype, so
// that it can be differentiated again.

// The incoming gradient per row, as an [M, 1] column (reduction none) or 0-d, over the divisor of
// reduction mean (the target weights' sum for class indices, else the number of rows), in dtype a.
Tensor loss_coef(const LossSaved& s, const Tensor& g, DType a) {
  Tensor c = to_dtype(g, a);
  if (c->ndim() == 1) c = unsqueeze(c, 1);
  if (s.reduction != Reduction::Mean) return c;
  if (s.denom) return div(c, s.denom);
  int64_t rows = s.target->shape[0];
  return mul_scalar(c, rows ? 1.0 / static_cast<double>(rows) : std::nan(""));
}
// [M, C] bool: column c == target[r].
Tensor class_mask(const Tensor& target, int64_t classes) {
  Tensor cols = arange(target->ctx(), 0, static_cast<double>(classes), 1, FLAME_DTYPE_I64);
  return binary(OpId::Eq, unsqueeze(target, 1), cols);
}
Tensor log_softmax_rows(const Tensor& x) { return sub(x, logsumexp(x, {1}, true)); }
// [M, 1] bool: the rows whose target is not ignore_index. Ignored rows get a zero gradient through
// where() (not a product with a 0/1 mask: an all-ignored mean has an infinite coefficient).
Tensor valid_rows(const LossSaved& s) {
  Tensor ignore = scalar(s.target->ctx(), static_cast<double>(s.ignore_index), FLAME_DTYPE_I64);
  return unsqueeze(binary(OpId::Ne, s.target, ignore), 1);
}

RULE(CrossEntropy) {  // coef (softmax(x) a - (1 - eps) w_t onehot - eps / C w), a = (1 - eps) w_t + eps W / C
  LossSaved s = unpack_loss(n);
  if (!g->ctx().recording()) return {cross_entropy_backward(s, g)};
  Tensor x = to_dtype(s.x, s.lse->dtype);
  double keep = 1 - s.eps, spread = s.eps / static_cast<double>(s.classes);
  Tensor wt = unsqueeze(s.wrow, 1), w = s.weight ? s.weight : like_scalar(x, 1);
  Tensor W = s.weight ? s.wsum : like_scalar(x, static_cast<double>(s.classes));
  Tensor a = add(mul_scalar(wt, keep), mul_scalar(W, spread));
  Tensor b = add(mul(mask_as(class_mask(s.target, s.classes), x), mul_scalar(wt, keep)), mul_scalar(w, spread));
  Tensor gx = mul(loss_coef(s, g, x->dtype), sub(mul(exp(log_softmax_rows(x)), a), b));
  return {to_dtype(where(valid_rows(s), gx, like_scalar(x, 0)), s.x->dtype)};
}
RULE(CrossEntropyProbs) {  // x: coef (softmax(x) T - w t'), t: -(1 - eps) coef w log_softmax(x)
  LossSaved s = unpack_loss(n);
  bool graph = g->ctx().recording();
  DType a = s.lse->dtype;
  double keep = 1 - s.eps, spread = s.eps / static_cast<double>(s.classes);
  Tensor x = to_dtype(s.x, a), coef = loss_coef(s, g, a), w = s.weight ? s.weight : like_scalar(x, 1);
  Tensor gx, gt;
  if (n.needs_input_grad(0)) {
    if (!graph) {
      gx = cross_entropy_probs_backward(s, g);
    } else {
      Tensor wtp = mul(add_scalar(mul_scalar(to_dtype(s.target, a), keep), spread), w);
      gx = to_dtype(mul(coef, sub(mul(exp(log_softmax_rows(x)), sum(wtp, {1}, true)), wtp)), s.x->dtype);
    }
  }
  if (n.needs_input_grad(1)) {
    Tensor logp = graph ? log_softmax_rows(x) : sub(x, unsqueeze(s.lse, 1));
    gt = to_dtype(mul(mul_scalar(coef, -keep), mul(w, logp)), n.inputs[1].dtype);
  }
  return {gx, gt};
}
RULE(NllLoss) {  // -coef w_t at (r, target[r])
  LossSaved s = unpack_loss(n);
  DType dt = n.inputs[0].dtype;
  if (!g->ctx().recording()) return {nll_loss_backward(s, g, dt)};
  Tensor hit = binary(OpId::LogicalAnd, class_mask(s.target, s.classes), valid_rows(s));
  Tensor gx = neg(mul(loss_coef(s, g, s.wrow->dtype), unsqueeze(s.wrow, 1)));
  return {to_dtype(where(hit, gx, like_scalar(s.wrow, 0)), dt)};
}

// ---- indexing (ops/indexing.h): gather and scatter-add are each other's adjoint ----
RULE(Gather) {  // attributes IndexAttrs: dim, skip
  const TensorInfo& in = n.inputs[0];
  const IndexAttrs& a = n.attrs<IndexAttrs>();
  Tensor zero = zeros(g->ctx(), in.shape, in.dtype);
  return {scatter_add_index(zero, a.dim, saved(n, 0), g, a.skip, 1.0, "gather (backward): index")};
}
RULE(ScatterAdd) {  // attributes IndexAttrs: dim, skip, alpha. The source's gradient reads 0 where it was skipped.
  const IndexAttrs& a = n.attrs<IndexAttrs>();
  Tensor gs;
  if (n.needs_input_grad(1)) {
    gs = gather_index(g, a.dim, saved(n, 0), a.skip, true, "scatter_add (backward): index");
    if (a.alpha != 1.0) gs = mul_scalar(gs, a.alpha);
  }
  return {n.needs_input_grad(0) ? g : nullptr, gs};
}

// ---- convolution (ops/conv.h): each primitive's backward is made of the other two ----
// Conv2d (x, w, b; saved x, w):           dx = conv^T(g, w), dw = wgrad(g, x), db = sum g over N, H, W
// ConvTranspose2d (d, w, b; saved d, w):  z = conv^T(d, w) + b, so dd = conv(g, w), dw = wgrad(d, g), db = sum g
// ConvWeightGrad (d, x; saved d, x):      v = wgrad(d, x) is linear in each: dd = conv(x, g), dx = conv^T(d, g)
// The weight gradient keeps the weight's memory format (channels-last or not).
// Conv2d / ConvTranspose2d save their input only for the weight gradient (ops/conv.cpp record_conv).
RULE(Conv2d) {
  const ConvGeom& geo = n.attrs<ConvGeom>();
  Tensor w = saved(n, 1);
  return {n.needs_input_grad(0) ? conv_input_grad(g, w, nullptr, geo) : nullptr,
          n.needs_input_grad(1) ? conv_weight_grad(g, saved(n, 0), geo, is_channels_last(w)) : nullptr,
          n.needs_input_grad(2) ? conv_bias_grad(g) : nullptr};
}
RULE(ConvTranspose2d) {
  const ConvGeom& geo = n.attrs<ConvGeom>();
  Tensor w = saved(n, 1);
  return {n.needs_input_grad(0) ? conv_forward(g, w, nullptr, geo) : nullptr,
          n.needs_input_grad(1) ? conv_weight_grad(saved(n, 0), g, geo, is_channels_last(w)) : nullptr,
          n.needs_input_grad(2) ? conv_bias_grad(g) : nullptr};
}
RULE(ConvWeightGrad) {
  const ConvGeom& geo = n.attrs<ConvGeom>();
  Tensor d = saved(n, 0), x = saved(n, 1);
  return {n.needs_input_grad(0) ? conv_forward(x, g, nullptr, geo) : nullptr,
          n.needs_input_grad(1) ? conv_input_grad(d, g, nullptr, geo) : nullptr};
}

// ---- attention (ops/attention.h): inputs q, k, v, mask. The fused backward kernels, or the same
// gradients composed of ops under create_graph.
RULE(Attention) {
  AttentionSaved s = unpack_attention(n);
  const bool nm = n.needs_input_grad(3);
  AttentionGrads r = g->ctx().recording() ? attention_backward_composed(s, g, nm) : attention_backward(s, g, nm);
  return {n.needs_input_grad(0) ? r.dq : nullptr, n.needs_input_grad(1) ? r.dk : nullptr,
          n.needs_input_grad(2) ? r.dv : nullptr, nm ? r.dmask : nullptr};
}

// ---- more nn ops (ops/nnops.h) ----
RULE(Scatter) {  // attribute: dim. t: g with the scattered positions zeroed; src: g gathered at index
  const int dim = dim_of(n);
  Tensor index = saved(n, 0);
  Tensor gx, gs;
  if (n.needs_input_grad(0)) gx = scatter_index(g, dim, index, zeros(g->ctx(), index->shape, g->dtype), "scatter (backward): index");
  if (n.needs_input_grad(1)) gs = gather_index(g, dim, index, kNoIndex, false, "scatter (backward): index");
  return {gx, gs};
}
RULE(ConstantPad) {  // attributes: the left pad of each dim; the gradient is g's interior
  const std::vector<int64_t>& lefts = n.attrs<PadAttrs>().lefts;
  Tensor r = g;
  for (int d = 0; d < g->ndim(); ++d)
    if (r->shape[d] != n.inputs[0].shape[d]) r = narrow(r, d, lefts[static_cast<size_t>(d)], n.inputs[0].shape[d]);
  return {r};
}
RULE(Dropout) {  // the same mask (regenerated from seed, offset, p) and scale
  const DropoutAttrs& a = n.attrs<DropoutAttrs>();
  return {dropout_apply(g, a.seed, a.offset, a.p)};
}
RULE(MaxPool2d) {  // saved: the winners' flat indices h * W + w [N, C, OH, OW] (-1: none); g goes there
  const Shape& xs = n.inputs[0].shape;
  Tensor idx = saved(n, 0);
  const int64_t N = xs[0], C = xs[1], L = idx->shape[2] * idx->shape[3];
  Tensor dx = scatter_add_index(zeros(g->ctx(), {N, C, xs[2] * xs[3]}, g->dtype), 2, reshape(idx, {N, C, L}),
                                reshape(g, {N, C, L}), -1, 1.0, "max_pool2d (backward): index");
  return {reshape(dx, xs)};
}
RULE(AvgPool2d) { return {avg_pool2d_adjoint(g, n.attrs<PoolParams>())}; }
RULE(AvgPool2dBackward) { return {avg_pool2d_apply(g, n.attrs<PoolParams>())}; }
RULE(Upsample2d) { return {upsample2d_adjoint(g, n.attrs<UpsampleParams>())}; }
RULE(Upsample2dBackward) { return {upsample2d_apply(g, n.attrs<UpsampleParams>())}; }
RULE(Rope) {  // the rotation is orthogonal: its transpose rotates back (saved: the position ids, if given)
  RopeParams p = n.attrs<RopeParams>();
  p.inverse = !p.inverse;
  return {rope_apply(g, n.saved.empty() ? nullptr : saved(n, 0), p)};
}
// ---- ops that hand their backward in with the node (Node::backward, set when they record): gradient
// checkpointing (toolkit/checkpoint.cpp: re-run the function, walk the rebuilt graph) and fused
// expressions (ops/fused.cpp: per input, a fused function of g and the saved inputs) ----
Grads node_backward(Node& n, const Grads& gs) {
  if (!n.backward) fail(FLAME_ERROR_INTERNAL, "node of ", op_name(n.op), " was recorded without its backward");
  return n.backward(n, gs);
}
RULE(Checkpoint) { return node_backward(n, {g}); }
RULE(Fused) { return node_backward(n, {g}); }
RULE(ShardGather) { return node_backward(n, {g}); }

// ---- the frozen fp8 base's linear layer (ops/quantized.h; inputs {x, bias}; saved q, scale, then relu's
// output, or gelu's pre-activation, x and the bias, as ops/quantized.cpp lays them out) ----
RULE(QuantizedLinear) {  // y = act(z), z = x W^T + b, W = q * scale frozen: dz = g act'(z); gx = dz W (W dequantised again); gb = column sums of dz
  const LinearAttrs& a = n.attrs<LinearAttrs>();
  const Tensor q = saved(n, 0), s = saved(n, 1);
  Tensor dz = g;
  if (a.act == Activation::Relu) dz = where(cmp(OpId::Gt, saved(n, 2), 0), g, like_scalar(g, 0));
  if (a.act == Activation::GeluTanh) {  // under create_graph the pre-activation is recomputed with its history
    const Tensor z = g->ctx().recording()
                         ? quantized_linear(saved(n, 3), q, s, a.has_bias ? saved(n, 4) : nullptr, Activation::None)
                         : saved(n, 2);
    dz = binary(OpId::GeluTanhBackward, g, z);
  }
  Tensor gx, gb;
  if (n.needs_input_grad(0)) gx = mm(dz, dequantize(q, s, dz->dtype));
  if (n.needs_input_grad(1)) gb = linear_weight_grad(dz, nullptr, false, true, n.inputs[1].dtype).second;
  return {gx, gb};
}

// ---- the frozen NF4 base's linear layer (ops/nf4.h; inputs {x, bias}; saved packed, absmax, with double
// quantisation the nested scale, offset and code, then as QuantizedLinear: ops/nf4.cpp lays them out) ----
RULE(Nf4Linear) {  // as QuantizedLinear, with W = the NF4 weight dequantised again
  const LinearAttrs& a = n.attrs<LinearAttrs>();
  Nf4Weight w;
  w.packed = saved(n, 0);
  w.absmax = saved(n, 1);
  size_t k = 2;  // the first saved tensor after the weight's
  if (w.absmax->dtype == FLAME_DTYPE_U8) {
    w.nested_scale = saved(n, 2);
    w.nested_offset = saved(n, 3);
    w.nested_code = saved(n, 4);
    k = 5;
  }
  Tensor dz = g;
  if (a.act == Activation::Relu) dz = where(cmp(OpId::Gt, saved(n, k), 0), g, like_scalar(g, 0));
  if (a.act == Activation::GeluTanh) {  // under create_graph the pre-activation is recomputed with its history
    const Tensor z = g->ctx().recording() ? nf4_linear(saved(n, k + 1), w, a.has_bias ? saved(n, k + 2) : nullptr, Activation::None)
                                          : saved(n, k);
    dz = binary(OpId::GeluTanhBackward, g, z);
  }
  Tensor gx, gb;
  if (n.needs_input_grad(0)) gx = mm(dz, nf4_dequantize(w, dz->dtype));
  if (n.needs_input_grad(1)) gb = linear_weight_grad(dz, nullptr, false, true, n.inputs[1].dtype).second;
  return {gx, gb};
}

// ---- mse_loss / l1_loss with reduction mean or sum (ops/loss.h; inputs {input, target}, both saved;
// attributes PointwiseLossAttrs): the fused kernel, or under create_graph the same gradient composed of ops,
// g scale f'(input - target) for the input and its negation for the target, with f' = 2 d (mse) or
// sign d (l1) and scale 1/N for mean, computed in f32 for f16/bf16 ----
Grads pointwise_loss_rule(Node& n, const Tensor& g) {
  Tensor a = saved(n, 0), b = saved(n, 1);
  const Reduction red = n.attrs<PointwiseLossAttrs>().reduction;
  const bool na = n.needs_input_grad(0), nb = n.needs_input_grad(1);
  if (!g->ctx().recording()) {
    PointwiseLossGrads r = pointwise_loss_backward(n.op, a, b, g, red, na, nb);
    return {r.input, r.target};
  }
  const DType c = promote(a->dtype, b->dtype) == FLAME_DTYPE_F64 ? FLAME_DTYPE_F64 : FLAME_DTYPE_F32;
  const int64_t N = a->numel();
  double scale = n.op == OpId::MseLoss ? 2.0 : 1.0;
  if (red == Reduction::Mean) scale = N ? scale / static_cast<double>(N) : std::nan("");
  Tensor d = sub(to_dtype(a, c), to_dtype(b, c));
  Tensor gd = mul(n.op == OpId::MseLoss ? d : unary(OpId::Sign, d), mul_scalar(to_dtype(g, c), scale));
  return {na ? to_dtype(gd, a->dtype) : nullptr, nb ? to_dtype(neg(gd), b->dtype) : nullptr};
}
RULE(MseLoss) { return pointwise_loss_rule(n, g); }
RULE(L1Loss) { return pointwise_loss_rule(n, g); }

// The rule table, generated from the Backward column of every row of src/tensor/op_list.h.
constexpr std::array<Rule, kNumOps> make_rules() {
  std::array<Rule, kNumOps> r{};
#define FLAME_RULE_RULE(Id) r[static_cast<int>(OpId::Id)] = bw_##Id;
#define FLAME_RULE_NONDIFF(Id)
#define FLAME_RULE_NOBACKWARD(Id)
#define FLAME_RULE_EW(Id, name, Kind, B, S) FLAME_RULE_##B(Id)
#define FLAME_RULE_GRAPH(Id, name, B) FLAME_RULE_##B(Id)
  FLAME_ELEMENTWISE_OPS(FLAME_RULE_EW) FLAME_GRAPH_OPS(FLAME_RULE_GRAPH)
#undef FLAME_RULE_RULE
#undef FLAME_RULE_NONDIFF
#undef FLAME_RULE_NOBACKWARD
#undef FLAME_RULE_EW
#undef FLAME_RULE_GRAPH
  return r;
}
constexpr std::array<Rule, kNumOps> kRules = make_rules();

// ---- the engine's unit seed (engine.cpp): g is exactly 1, no hook saw it, no graph is recorded and
// the node's saved tensors are freed after the call. An op listed here may then hand out a gradient
// its forward computed; otherwise its rule runs. ----
// cross_entropy with class indices and a scalar reduction saved that gradient (ops/loss.cpp).
Grads seed_CrossEntropy(Node& n, const Tensor& g) {
  LossSaved s = unpack_loss(n);
  if (s.grad && !g->ctx().recording()) return {s.grad};
  return bw_CrossEntropy(n, g);
}
Rule seed_rule(OpId op) { return op == OpId::CrossEntropy ? seed_CrossEntropy : nullptr; }

}  // namespace

bool has_backward(OpId op) { return static_cast<int>(op) < kNumOps && kRules[static_cast<int>(op)] != nullptr; }

// Linear's backward with cross-node fusion of Linear -> activation -> Linear and of autocast's casts
// into the GEMMs (wide; engine.cpp decides when the graph allows either). `pre`: g is already n's pre-activation gradient. p, when not null, is the
// Linear whose activation produced n's input: n's dgrad GEMM then applies p's activation derivative
// in its epilogue (DGELU / DRELU), *p_dz receives p's pre-activation gradient and n's input gradient
// is returned null. Where no epilogue fits, *p_dz stays null and the gradients are the unfused ones.
Grads linear_backward(Node& n, const Tensor& g, bool pre, Node* p, Tensor* p_dz, const std::array<bool, 3>& wide) {
  Tensor dz = pre ? g : linear_pre_grad(n, g);
  if (p && n.needs_input_grad(0) && !g->ctx().recording() && p->op == OpId::Linear) {
    const Activation act = p->attrs<LinearAttrs>().act;
    Tensor aux;
    if (act == Activation::GeluTanh) aux = saved(*p, 2);
    if (act == Activation::Relu && p->attrs<LinearAttrs>().has_relu_mask) aux = saved(*p, p->saved.size() - 1);
    if (aux && linear_input_grad_through_activation(dz, saved(n, 1), act, aux, p_dz))
      return linear_grads_from_pre(n, dz, true, wide);
  }
  return linear_grads_from_pre(n, dz, false, wide);
}

// Nodes with several outputs get one gradient per output (null where none arrived).
Grads apply_backward_rule_multi(Node& n, const std::vector<Tensor>& gs) {
  if (n.backward) return n.backward(n, gs);
  fail(FLAME_ERROR_INTERNAL, "op ", op_name(n.op), " has ", n.num_outputs, " outputs but no backward for several");
}

// unit_seed: g is the engine's seed of ones, on the terms above seed_CrossEntropy.
Grads apply_backward_rule(Node& n, const Tensor& g, bool unit_seed) {
  Rule r = has_backward(n.op) ? kRules[static_cast<int>(n.op)] : nullptr;
  if (!r) fail(FLAME_ERROR_NOT_DIFFERENTIABLE, "op ", op_name(n.op), " has no backward rule");
  if (unit_seed)
    if (Rule sr = seed_rule(n.op)) return sr(n, g);
  return r(n, g);
}

}  // namespace flame

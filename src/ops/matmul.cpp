// Matrix products: matmul (NumPy semantics), bmm and linear (x W^T + b with a fused activation),
// all on cuBLASLt (runtime/blas.h).
//
// Row-major to column-major: a row-major [R, C] matrix is the column-major C x R matrix of the same
// memory, so D = A B (row-major) is computed as D^T = B^T A^T in column-major terms, which needs no
// copy: a row-major operand is passed untransposed, a transposed view (unit stride on its rows) as
// op T. Only operands that no layout can express (broadcast or negative strides inside the matrix,
// batch dims that do not collapse to one stride) are copied.
//
// Autograd: matmul's 1-D and broadcast batch handling are views and Expand nodes, so the one
// recorded product node (Matmul) sees equal batch shapes and its backward is two products with
// transposed views. A 2-D right operand is folded into the rows of the left one (one large GEMM,
// whose weight gradient then sums over the batch inside the GEMM).
#include <algorithm>
#include "core/error.h"
#include "ops/ops.h"
#include "runtime/blas.h"

namespace flame::ops {

namespace {

void check_operands(const Tensor& a, const Tensor& b, const char* an, const char* bn) {
  FLAME_CHECK(&a->ctx() == &b->ctx(), FLAME_ERROR_INVALID_ARGUMENT, an, " and ", bn, " belong to different contexts");
  FLAME_CHECK(a->dtype == b->dtype, FLAME_ERROR_DTYPE_MISMATCH, an, " is ", dtype_name(a->dtype), " but ", bn, " is ",
              dtype_name(b->dtype), " (convert one with flame_to_dtype)");
  DType d = a->dtype;
  check_compute_dtype(d, "matrix products");
  FLAME_CHECK(d == FLAME_DTYPE_F32 || d == FLAME_DTYPE_F64 || d == FLAME_DTYPE_F16 || d == FLAME_DTYPE_BF16,
              FLAME_ERROR_DTYPE_MISMATCH, "matrix products take f32, f64, f16 or bf16 tensors, not ", dtype_name(d));
}

// The column-major operand that represents X^T for a tensor X whose last two dims are [R, C], or
// false when no layout can (the caller copies X then).
bool matrix_operand(const Tensor& x, GemmOperand* op) {
  const int nd = x->ndim();
  const int64_t R = x->shape[nd - 2], C = x->shape[nd - 1];
  int64_t sr = x->strides[nd - 2], sc = x->strides[nd - 1];
  // The stride of a size-1 dim is arbitrary: pick the one that makes a layout valid.
  if (C == 1) sc = 1;
  if (R == 1) sr = sc == 1 ? std::max<int64_t>(C, 1) : 1;
  if (sc == 1 && sr >= std::max<int64_t>(C, 1)) {  // row-major: column-major C x R, ld sr
    *op = {x->data(), false, C, R, sr, 0};
    return true;
  }
  if (sr == 1 && sc >= std::max<int64_t>(R, 1)) {  // a transposed view: column-major R x C, used as op T
    *op = {x->data(), true, R, C, sc, 0};
    return true;
  }
  return false;
}

// The single batch stride of x's leading dims (0 when broadcast), or false when they do not collapse.
bool batch_stride(const Tensor& x, int64_t* stride) {
  const int nb = x->ndim() - 2;
  Shape bs(x->shape.begin(), x->shape.begin() + nb);
  Strides st(x->strides.begin(), x->strides.begin() + nb);
  *stride = 0;
  if (nb == 0) return true;
  CollapsedLayout l = collapse(bs, {st});
  if (l.shape.size() != 1) return false;
  *stride = l.shape[0] == 1 ? 0 : l.strides[0][0];
  return *stride >= 0;
}

// Describes x for the GEMM, copying it (an internal, unrecorded copy) when no layout expresses it.
GemmOperand operand(const Tensor& x, Tensor& keep_alive) {
  GemmOperand op;
  int64_t bstride = 0;
  if (!matrix_operand(x, &op) || !batch_stride(x, &bstride)) {
    keep_alive = contiguous(alias(x));
    matrix_operand(keep_alive, &op);
    batch_stride(keep_alive, &bstride);
  }
  op.batch_stride = bstride;
  return op;
}

int64_t batch_count(const Shape& s) {
  int64_t n = 1;
  for (size_t i = 0; i + 2 < s.size(); ++i) n *= s[i];
  return n;
}

// out (contiguous [..., M, N]) = a [..., M, K] @ b [..., K, N] with equal batch dims, on detached
// tensors. Returns false when the epilogue is unsupported (nothing was written then).
bool run_gemm(const Tensor& a, const Tensor& b, const Tensor& out, Epilogue epi, CUdeviceptr bias, CUdeviceptr aux,
              int64_t aux_ld) {
  const int nd = out->ndim();
  const int64_t M = out->shape[nd - 2], N = out->shape[nd - 1], K = a->shape[a->ndim() - 1];
  Tensor ka, kb;
  GemmCall c;
  c.dtype = a->dtype;
  c.d_f32 = out->dtype != a->dtype;  // an f32 result of f16/bf16 operands (mm_wide, linear_weight_grad)
  c.m = N;
  c.n = M;
  c.k = K;
  c.batch = batch_count(out->shape);
  FLAME_CHECK(c.batch <= INT32_MAX, FLAME_ERROR_INVALID_ARGUMENT, "matmul: batch count ", c.batch, " exceeds 2^31-1");
  c.a = operand(b, kb);  // D^T = B^T A^T
  c.b = operand(a, ka);
  c.d = out->data();
  c.ldd = std::max<int64_t>(N, 1);
  c.d_batch_stride = M * N;
  c.epilogue = epi;
  c.bias = bias;
  c.aux = aux;
  c.aux_ld = aux_ld;
  return blas(out->ctx()).gemm(c);
}

}  // namespace

// The core recorded product: a [..., M, K] @ b [..., K, N] with equal batch shapes.
Tensor mm(const Tensor& a, const Tensor& b) {
  const int nd = a->ndim();
  Shape shape(a->shape.begin(), a->shape.end() - 1);
  shape.push_back(b->shape[nd - 1]);
  Tensor out = make_tensor(a->ctx(), shape, a->dtype);
  if (out->numel() > 0) {
    if (a->shape[nd - 1] == 0) fill_(out, 0);  // an empty sum
    else run_gemm(alias(a), alias(b), out, Epilogue::None, 0, 0, 0);
  }
  if (auto node = record(OpId::Matmul, {a, b}, {out})) {
    // ga = g b^T reads b, gb = a^T g reads a: each operand is kept only for the other's gradient.
    if (node->needs_input_grad(1)) node->saved.emplace_back(a, false);
    else node->saved.emplace_back();
    if (node->needs_input_grad(0)) node->saved.emplace_back(b, false);
    else node->saved.emplace_back();
  }
  return out;
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_operands(a, b, "a", "b");
  FLAME_CHECK(a->ndim() >= 1 && b->ndim() >= 1, FLAME_ERROR_SHAPE_MISMATCH, "matmul needs tensors of at least 1 dim, got ",
              shape_str(a->shape), " and ", shape_str(b->shape));
  Tensor A = a->ndim() == 1 ? unsqueeze(a, 0) : a;  // [K] -> [1, K]
  Tensor B = b->ndim() == 1 ? unsqueeze(b, 1) : b;  // [K] -> [K, 1]
  const int na = A->ndim(), nb = B->ndim();
  const int64_t M = A->shape[na - 2], K = A->shape[na - 1], N = B->shape[nb - 1];
  FLAME_CHECK(B->shape[nb - 2] == K, FLAME_ERROR_SHAPE_MISMATCH, "matmul: ", shape_str(a->shape), " @ ",
              shape_str(b->shape), ": inner sizes ", K, " and ", B->shape[nb - 2], " differ");
  Shape ba(A->shape.begin(), A->shape.end() - 2), bb(B->shape.begin(), B->shape.end() - 2);
  Tensor out;
  Strides folded;
  const int64_t rows = batch_count(A->shape) * M;
  if (bb.empty() && !ba.empty() && view_strides(A->shape, A->strides, {rows, K}, &folded)) {
    // [..., M, K] @ [K, N]: one GEMM over all rows (its weight gradient sums the batch in the GEMM)
    Shape os = ba;
    os.push_back(M);
    os.push_back(N);
    out = reshape(mm(reshape(A, {rows, K}), B), os);
  } else {
    Shape bs = broadcast_shapes(ba, bb);
    Shape sa = bs, sb = bs;
    sa.insert(sa.end(), {M, K});
    sb.insert(sb.end(), {K, N});
    out = mm(A->shape == sa ? A : expand(A, sa), B->shape == sb ? B : expand(B, sb));
  }
  if (a->ndim() == 1) out = squeeze(out, out->ndim() - 2);
  if (b->ndim() == 1) out = squeeze(out, out->ndim() - 1);
  return out;
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  check_operands(a, b, "a", "b");
  FLAME_CHECK(a->ndim() == 3 && b->ndim() == 3, FLAME_ERROR_SHAPE_MISMATCH, "bmm takes two 3-D tensors, got ",
              shape_str(a->shape), " and ", shape_str(b->shape));
  FLAME_CHECK(a->shape[0] == b->shape[0] && a->shape[2] == b->shape[1], FLAME_ERROR_SHAPE_MISMATCH, "bmm: ",
              shape_str(a->shape), " @ ", shape_str(b->shape), " needs equal batch sizes and a's dim 2 == b's dim 1");
  return mm(a, b);
}

namespace {

// The epilogue for act(x W^T + b). When backward needs it, gelu keeps its pre-activation and relu a bit
// mask of its positive outputs (aux), which a later DGELU / DRELU epilogue reads.
Epilogue forward_epilogue(Activation act, bool has_bias, bool keep_aux) {
  switch (act) {
    case Activation::None: return has_bias ? Epilogue::Bias : Epilogue::None;
    case Activation::Relu:
      if (keep_aux) return has_bias ? Epilogue::ReluAuxBias : Epilogue::ReluAux;
      return has_bias ? Epilogue::ReluBias : Epilogue::Relu;
    case Activation::GeluTanh:
      if (keep_aux) return has_bias ? Epilogue::GeluAuxBias : Epilogue::GeluAux;
      return has_bias ? Epilogue::GeluBias : Epilogue::Gelu;
  }
  return Epilogue::None;
}

}  // namespace

std::pair<Tensor, Tensor> linear2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Activation act,
                                           bool keep_aux) {
  Context& ctx = x->ctx();
  const int64_t R = x->shape[0], O = w->shape[0];
  Tensor wt = transpose(alias(w), 0, 1);  // [in, out] view: the GEMM reads W as op T
  Tensor out = make_tensor(ctx, {R, O}, x->dtype);
  Tensor aux;  // gelu: the pre-activation; relu: the fused path's bit mask (see forward_epilogue)
  keep_aux = keep_aux && act != Activation::None;
  if (out->numel() > 0) {
    bool fused = false;
    const int64_t K = x->shape[1];
    if (K > 0) {
      Epilogue epi = forward_epilogue(act, static_cast<bool>(bias), keep_aux);
      int64_t aux_ld = 0;
      if (keep_aux && act == Activation::GeluTanh) {
        aux_ld = (O + 7) / 8 * 8;  // cuBLASLt wants the aux leading dim a multiple of 8
        aux = make_view(make_tensor(ctx, {R, aux_ld}, x->dtype), {R, O}, {aux_ld, 1}, 0);
      } else if (keep_aux) {
        aux_ld = (O + 127) / 128 * 128;  // relu's bit mask: ld in bits, a multiple of 128
        aux = make_tensor(ctx, {R, aux_ld / 8}, FLAME_DTYPE_U8);
        fill_(aux, 0);  // split-K kernels OR their bits into the mask (initcheck saw them read it)
      }
      fused = run_gemm(alias(x), wt, out, epi, bias ? bias->data() : 0, aux ? aux->data() : 0, aux_ld);
    }
    if (!fused) {  // the same result from separate kernels (unsupported epilogue, K = 0, or disabled)
      Tensor pre = out;
      if (K > 0) run_gemm(alias(x), wt, out, Epilogue::None, 0, 0, 0);
      else fill_(out, 0);
      if (bias) pre = add(out, alias(bias));
      aux = keep_aux && act == Activation::GeluTanh ? pre : nullptr;  // relu: no bit mask unfused
      if (act == Activation::None) out = pre;
      else out = unary(act == Activation::Relu ? OpId::Relu : OpId::GeluTanh, pre);
    }
  } else if (keep_aux && act == Activation::GeluTanh) {
    aux = make_tensor(ctx, {R, O}, x->dtype);
  }
  return {out, aux};
}

namespace {

// The core recorded linear: x [R, in], w [out, in], bias [out] or null.
Tensor linear2d(const Tensor& x, const Tensor& w, const Tensor& bias, Activation act) {
  const bool keep_aux = act != Activation::None && x->ctx().recording() &&
                        (requires_grad(*x) || requires_grad(*w) || (bias && requires_grad(*bias)));
  auto [out, aux] = linear2d_forward(x, w, bias, act, keep_aux);
  if (auto node = record(OpId::Linear, {x, w, bias}, {out})) {
    // saved: x, W, then relu's output (its mask) or gelu's pre-activation, then gelu's bias (double
    // backward recomputes the pre-activation from x, W and b, since aux carries no history), then
    // relu's bit mask when the fused path made one. x is read only by dW and W only by dx, so without
    // gelu an empty slot stands for the one no gradient needs: a frozen weight's layer keeps no copy
    // of its input (LoRA training of a frozen base), as PyTorch's addmm backward.
    const bool relu_mask = act == Activation::Relu && aux;
    const bool recompute = act == Activation::GeluTanh;
    node->attributes = ops::LinearAttrs{act, bias != nullptr, relu_mask};
    if (recompute || node->needs_input_grad(1)) node->saved.emplace_back(x, false);
    else node->saved.emplace_back();
    if (recompute || node->needs_input_grad(0)) node->saved.emplace_back(w, false);
    else node->saved.emplace_back();
    if (act == Activation::Relu) node->saved.emplace_back(out, true);
    if (act == Activation::GeluTanh) node->saved.emplace_back(aux, false);
    if (act == Activation::GeluTanh && bias) node->saved.emplace_back(bias, false);
    if (relu_mask) node->saved.emplace_back(aux, false);
  }
  return out;
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias, Activation act) {
  check_operands(x, w, "x", "weight");
  FLAME_CHECK(w->ndim() == 2, FLAME_ERROR_SHAPE_MISMATCH, "linear: weight must be [out_features, in_features], got ",
              shape_str(w->shape));
  FLAME_CHECK(x->ndim() >= 1 && x->shape.back() == w->shape[1], FLAME_ERROR_SHAPE_MISMATCH, "linear: x ",
              shape_str(x->shape), " does not end in in_features ", w->shape[1]);
  if (bias) {
    check_operands(x, bias, "x", "bias");
    FLAME_CHECK(bias->ndim() == 1 && bias->shape[0] == w->shape[0], FLAME_ERROR_SHAPE_MISMATCH, "linear: bias ",
                shape_str(bias->shape), " must be [", w->shape[0], "]");
  }
  const int64_t in = w->shape[1];
  Shape lead(x->shape.begin(), x->shape.end() - 1);
  int64_t rows = 1;
  for (int64_t s : lead) rows *= s;
  Tensor out = linear2d(x->ndim() == 2 ? x : reshape(x, {rows, in}), w, bias, act);
  if (x->ndim() == 2) return out;
  lead.push_back(w->shape[0]);
  return reshape(out, lead);
}

std::pair<Tensor, Tensor> linear_weight_grad(const Tensor& dz, const Tensor& x, bool want_weight, bool want_bias,
                                             DType out) {
  Tensor gw, gb;
  const bool wide = out != dz->dtype;  // f32 gradients of f16/bf16 operands, straight out of the GEMM
  if (!dz->ctx().recording() && want_weight && want_bias && dz->numel() > 0 && x->shape[1] > 0) {
    // dW = dz^T x with the bias gradient (column sums of dz) out of the same GEMM (BGRADB)
    Tensor w = make_tensor(dz->ctx(), {dz->shape[1], x->shape[1]}, out);
    Tensor b = make_tensor(dz->ctx(), {dz->shape[1]}, out);
    if (run_gemm(transpose(alias(dz), 0, 1), alias(x), w, Epilogue::BgradB, b->data(), 0, 0)) return {w, b};
  }
  if (want_weight) gw = wide ? mm_wide(transpose(dz, 0, 1), x) : matmul(transpose(dz, 0, 1), x);
  if (want_bias) {
    const DType acc = is_floating(dz->dtype) && dtype_size(dz->dtype) < 4 ? FLAME_DTYPE_F32 : dz->dtype;
    gb = to_dtype(sum_as(dz, {0}, false, acc), out);
  }
  return {gw, gb};
}

Tensor mm_wide(const Tensor& a, const Tensor& b) {
  FLAME_CHECK(!a->ctx().recording() && a->ndim() == 2 && b->ndim() == 2, FLAME_ERROR_INTERNAL,
              "mm_wide: 2-D operands, outside a recorded backward");
  Tensor out = make_tensor(a->ctx(), {a->shape[0], b->shape[1]}, FLAME_DTYPE_F32);
  if (out->numel() == 0) return out;
  if (a->shape[1] == 0) {
    fill_(out, 0);
    return out;
  }
  if (run_gemm(alias(a), alias(b), out, Epilogue::None, 0, 0, 0)) return out;
  return to_dtype(mm(a, b), FLAME_DTYPE_F32);  // no f32-output algorithm for this problem
}

bool linear_input_grad_through_activation(const Tensor& g, const Tensor& w, Activation act, const Tensor& aux, Tensor* dz) {
  if (act == Activation::None || !aux || g->numel() == 0 || w->shape[0] == 0) return false;
  const int64_t R = g->shape[0], in = w->shape[1];
  int64_t aux_ld = 0;
  if (act == Activation::GeluTanh) {  // the pre-activation [R, in], rows aux_ld elements apart
    if (aux->strides[1] != 1 && in > 1) return false;
    aux_ld = R > 1 ? aux->strides[0] : (in + 7) / 8 * 8;
    if (aux_ld % 8 != 0 || aux_ld < in) return false;
  } else {
    aux_ld = aux->shape[1] * 8;  // the bit mask made by linear2d: [R, ld / 8] bytes
  }
  Epilogue epi = act == Activation::GeluTanh ? Epilogue::DGelu : Epilogue::DRelu;
  Tensor d = make_tensor(g->ctx(), {R, in}, g->dtype);
  if (!run_gemm(alias(g), alias(w), d, epi, 0, aux->data(), aux_ld)) return false;
  *dz = d;
  return true;
}

}  // namespace flame::ops

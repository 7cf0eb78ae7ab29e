// Rotary position embeddings (kernel: cuda/rope.cuh) and sinusoidal timestep embeddings.
//  - rope records one Rope node; its rule is the same kernel rotating backwards (the rotation is
//    orthogonal, so its transpose is its inverse), recorded as Rope again: gradients of any order. The
//    position ids, when given, are saved in the node; the parameters are the node's attributes.
//  - timestep_embedding is diffusers' get_timestep_embedding composed of FLAME ops in f32, with the
//    operations in the same order and precision as PyTorch runs them on CUDA (so the results agree
//    to the last bit or nearly); being a composition it is differentiable in floating timesteps.
#include <cmath>
#include "tensor/autograd_graph.h"
#include "core/error.h"
#include "ops/nn_rows.h"
#include "ops/nnops.h"
#include "ops/ops.h"

namespace flame {

namespace {

struct RopeLayout {  // mirrors cuda/rope.cuh
  int32_t ndim;
  int32_t seq_dim;
  int64_t shape[8];
  int64_t xs[8];
  int64_t D, rd;
  int64_t offset;
  int64_t ps_b, ps_t;
  double log2_theta;
  int32_t interleaved;
  int32_t has_pos;
  float sign;
};

constexpr KernelTemplate kRope{"rope.cuh", "flame::rope_kernel", {TArg::Dtype, TArg::Dtype}};  // <T, position index>
KernelKey rope_key(DType t, DType i) { return make_key(kRope, t, i); }

}  // namespace

Tensor ops::rope_apply(const Tensor& x, const Tensor& positions, const RopeParams& p) {
  Context& ctx = x->ctx();
  Tensor y = make_tensor(ctx, x->shape, x->dtype);
  const int nd = x->ndim();
  const int64_t D = x->shape[static_cast<size_t>(nd - 1)];
  int64_t rows = D > 0 ? x->numel() / D : 0;
  if (rows > 0) {
    RopeLayout L{};
    L.ndim = nd;
    L.seq_dim = p.seq_dim;
    for (int d = 0; d < nd; ++d) {
      L.shape[d] = x->shape[static_cast<size_t>(d)];
      L.xs[d] = x->strides[static_cast<size_t>(d)];
    }
    L.D = D;
    L.rd = p.rotary_dim;
    L.offset = p.offset;
    if (positions) {
      L.has_pos = 1;
      L.ps_t = positions->strides.back();
      L.ps_b = positions->ndim() == 2 ? positions->strides[0] : 0;
    }
    L.log2_theta = std::log2(p.theta);
    L.interleaved = p.interleaved ? 1 : 0;
    L.sign = p.inverse ? -1.0f : 1.0f;
    CUdeviceptr px = x->data(), py = y->data(), pp = positions ? positions->data() : 0;
    void* args[] = {&px, &py, &pp, &rows, &L};
    const int64_t items = rows * (p.rotary_dim / 2 + D - p.rotary_dim);
    const DType idt = positions ? positions->dtype : FLAME_DTYPE_I64;
    launch_flat(ctx, ctx.function(rope_key(x->dtype, idt)), items, args);
  }
  if (auto node = record(OpId::Rope, {x}, {y})) {
    node->attributes = p;
    if (positions) node->saved.emplace_back(positions, false);
  }
  return y;
}

Tensor ops::rope(const Tensor& x, const Tensor& positions, RopeParams p) {
  const char* op = "rope";
  FLAME_CHECK(is_floating(x->dtype), FLAME_ERROR_DTYPE_MISMATCH, op, ": x must be floating, got ", dtype_name(x->dtype));
  FLAME_CHECK(x->ndim() >= 2, FLAME_ERROR_SHAPE_MISMATCH, op, ": x needs a position dim and a feature dim, got shape ",
              shape_str(x->shape));
  const int nd = x->ndim();
  const int64_t D = x->shape[static_cast<size_t>(nd - 1)];
  FLAME_CHECK(std::isfinite(p.theta) && p.theta > 0, FLAME_ERROR_INVALID_ARGUMENT, op, ": theta must be finite and > 0, got ", p.theta);
  if (p.rotary_dim == 0) p.rotary_dim = D;
  FLAME_CHECK(p.rotary_dim >= 2 && p.rotary_dim <= D && p.rotary_dim % 2 == 0, FLAME_ERROR_INVALID_ARGUMENT, op,
              ": rotary_dim ", p.rotary_dim, " must be even, >= 2 and at most the last dim's size ", D);
  FLAME_CHECK(p.seq_dim >= -nd && p.seq_dim < nd, FLAME_ERROR_INVALID_ARGUMENT, op, ": seq_dim ", p.seq_dim,
              " is out of range for ", nd, " dims");
  p.seq_dim = p.seq_dim < 0 ? p.seq_dim + nd : p.seq_dim;
  FLAME_CHECK(p.seq_dim != nd - 1, FLAME_ERROR_INVALID_ARGUMENT, op, ": seq_dim must not be the feature (last) dim");
  Tensor pos;
  if (positions) {
    FLAME_CHECK(&positions->ctx() == &x->ctx(), FLAME_ERROR_INVALID_ARGUMENT, op, ": positions belong to another context");
    FLAME_CHECK(positions->dtype == FLAME_DTYPE_I64 || positions->dtype == FLAME_DTYPE_I32, FLAME_ERROR_DTYPE_MISMATCH, op,
                ": positions must be i64 or i32, got ", dtype_name(positions->dtype));
    const int64_t T = x->shape[static_cast<size_t>(p.seq_dim)];
    const bool flat = positions->ndim() == 1 && positions->shape[0] == T;
    const bool batched = positions->ndim() == 2 && p.seq_dim != 0 && positions->shape[0] == x->shape[0] && positions->shape[1] == T;
    FLAME_CHECK(flat || batched, FLAME_ERROR_SHAPE_MISMATCH, op, ": positions of shape ", shape_str(positions->shape),
                " must be [T] or [B, T] with T = ", T, " (dim ", p.seq_dim, " of x) and B = ", x->shape[0], " (dim 0)");
    pos = alias(positions);
  }
  p.inverse = false;
  return rope_apply(x, pos, p);
}

// ---------------------------------------------------------------- timestep embedding

Tensor ops::timestep_embedding(const Tensor& t, int64_t dim, double max_period, bool flip_sin_to_cos, double shift,
                               double scale) {
  const char* op = "timestep_embedding";
  FLAME_CHECK(t->ndim() == 1, FLAME_ERROR_SHAPE_MISMATCH, op, ": timesteps must be 1-D, got shape ", shape_str(t->shape));
  FLAME_CHECK(t->dtype != FLAME_DTYPE_BOOL, FLAME_ERROR_DTYPE_MISMATCH, op, ": timesteps must be numbers, got bool");
  FLAME_CHECK(dim >= 1 && dim <= (int64_t{1} << 30), FLAME_ERROR_INVALID_ARGUMENT, op, ": dim must be in [1, 2^30], got ", dim);
  FLAME_CHECK(std::isfinite(max_period) && max_period > 0, FLAME_ERROR_INVALID_ARGUMENT, op,
              ": max_period must be finite and > 0, got ", max_period);
  FLAME_CHECK(std::isfinite(shift) && std::isfinite(scale), FLAME_ERROR_INVALID_ARGUMENT, op,
              ": downscale_freq_shift and scale must be finite");
  Context& ctx = t->ctx();
  const int64_t half = dim / 2;
  const DType f32 = FLAME_DTYPE_F32;
  // exponent = -log(max_period) * arange(half) / (half - shift), in f32; PyTorch divides a CUDA tensor
  // by a scalar as a product with the scalar's f32 reciprocal, and so does this.
  const float reciprocal = 1.0f / static_cast<float>(static_cast<double>(half) - shift);
  Tensor exponent = mul_scalar(mul_scalar(arange(ctx, 0, static_cast<double>(half), 1, f32), -std::log(max_period)),
                               static_cast<double>(reciprocal));
  Tensor emb = mul(unsqueeze(to_dtype(t, f32), 1), unsqueeze(exp(exponent), 0));  // [N, half]
  if (scale != 1.0) emb = mul_scalar(emb, scale);
  Tensor s = unary(OpId::Sin, emb), c = unary(OpId::Cos, emb);
  Tensor out = flip_sin_to_cos ? cat({c, s}, 1) : cat({s, c}, 1);
  if (dim % 2 == 1) out = pad(out, {0, 1}, PadMode::Constant, 0.0);
  return out;
}

std::vector<std::string> ops::rope_instantiations() {
  std::vector<std::string> v;
  for (DType t : {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_F64})
    for (DType i : {FLAME_DTYPE_I64, FLAME_DTYPE_I32}) v.push_back(kernel_name(rope_key(t, i)));
  return v;
}

}  // namespace flame

// Shared MMDiT pieces (mmdit_blocks.h).
#include "models/mmdit_blocks.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/shape.h"
#include "models/model_blocks.h"
#include "ops/nn.h"
#include "ops/nnops.h"

namespace flame::models {

Tensor plain_layer_norm(const Tensor& x, double eps) {
  return ops::layer_norm(x, {x->shape.back()}, nullptr, nullptr, eps);
}

Tensor modulate(const Tensor& x, const Tensor& shift, const Tensor& scale) {
  return ops::adaln_modulate(x, shift, scale);
}

Tensor gated(const Tensor& x, const Tensor& gate) {
  return ops::mul(ops::unsqueeze(gate, 1), x);
}

Tensor apply_rotary(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  FLAME_CHECK(x->ndim() == 4 && x->shape[3] % 2 == 0, FLAME_ERROR_INTERNAL, "apply_rotary: [B, H, S, D] expected");
  const int64_t B = x->shape[0], H = x->shape[1], S = x->shape[2], D = x->shape[3];
  FLAME_CHECK(cos->ndim() == 2 && cos->shape[0] == S && cos->shape[1] == D, FLAME_ERROR_SHAPE_MISMATCH,
              "rotary embedding of shape ", shape_str(cos->shape), " for ", S, " tokens of head dim ", D,
              " (the position ids must cover the text and image tokens)");
  const DType f32 = FLAME_DTYPE_F32;
  const Tensor xf = x->dtype == f32 ? x : ops::to_dtype(x, f32);
  const Tensor pairs = ops::reshape(xf, {B, H, S, D / 2, 2});
  const Tensor re = ops::narrow(pairs, 4, 0, 1), im = ops::narrow(pairs, 4, 1, 1);
  const Tensor rotated = ops::reshape(ops::cat({ops::neg(im), re}, 4), {B, H, S, D});
  const Tensor out = ops::add(ops::mul(xf, ops::reshape(cos, {1, 1, S, D})), ops::mul(rotated, ops::reshape(sin, {1, 1, S, D})));
  return x->dtype == f32 ? out : ops::to_dtype(out, x->dtype);
}

void MMDiTModel::add_linear(const std::string& name, int64_t out, int64_t in, bool bias) {
  add_param(name + ".weight", {out, in});
  if (bias) add_param(name + ".bias", {out});
}

void MMDiTModel::add_feed_forward(const std::string& prefix, int64_t dim, int64_t inner) {
  add_linear(prefix + ".net.0.proj", inner, dim);
  add_linear(prefix + ".net.2", dim, inner);
}

void MMDiTModel::add_two_layer_mlp(const std::string& prefix, int64_t hidden, int64_t in) {
  add_linear(prefix + ".linear_1", hidden, in);
  add_linear(prefix + ".linear_2", hidden, hidden);
}

Tensor MMDiTModel::lin(const Tensor& x, const std::string& name, ops::Activation act) const {
  const std::string bias = name + ".bias";
  return adapted_linear(x, name, param(name + ".weight"), params().find(bias) ? param(bias) : nullptr, act);
}

Tensor MMDiTModel::feed_forward(const Tensor& x, const std::string& prefix) const {
  return lin(lin(x, prefix + ".net.0.proj", ops::Activation::GeluTanh), prefix + ".net.2");
}

Tensor MMDiTModel::two_layer_mlp(const Tensor& x, const std::string& prefix) const {
  return lin(ops::unary(OpId::Silu, lin(x, prefix + ".linear_1")), prefix + ".linear_2");
}

std::vector<Tensor> MMDiTModel::modulation(const Tensor& temb, const std::string& linear, int64_t n) const {
  const Tensor emb = lin(ops::unary(OpId::Silu, temb), linear);
  const int64_t width = emb->shape[1] / n;
  return ops::split_sizes(emb, std::vector<int64_t>(static_cast<size_t>(n), width), 1);
}

Tensor MMDiTModel::ada_norm_continuous(const Tensor& x, const Tensor& temb, const std::string& linear, double eps) const {
  const std::vector<Tensor> m = modulation(temb, linear, 2);  // scale, shift
  return modulate(plain_layer_norm(x, eps), m[1], m[0]);
}

Tensor MMDiTModel::timestep_mlp(const Tensor& timesteps, const std::string& prefix) const {
  const Tensor proj = ops::timestep_embedding(timesteps, 256, 10000, true, 0, 1);
  return two_layer_mlp(as_compute_float(proj), prefix);
}

Tensor MMDiTModel::heads(const Tensor& x, const std::string& proj, const std::string& norm, int64_t num_heads,
                         double eps) const {
  const Tensor y = lin(x, proj);
  FLAME_CHECK(y->ndim() == 3 && y->shape[2] % num_heads == 0, FLAME_ERROR_INTERNAL, "heads: [B, T, H * D] expected");
  const int64_t B = y->shape[0], T = y->shape[1], D = y->shape[2] / num_heads;
  Tensor h = ops::reshape(y, {B, T, num_heads, D});
  if (!norm.empty()) h = ops::rms_norm(h, {D}, param(norm + ".weight"), eps);
  return ops::permute(h, {0, 2, 1, 3});
}

Tensor MMDiTModel::as_compute_float(const Tensor& t) const {
  if (is_floating(t->dtype)) return to_compute(t);
  FLAME_CHECK(t->dtype != FLAME_DTYPE_BOOL, FLAME_ERROR_INVALID_ARGUMENT, "a bool tensor where numbers are expected");
  return ops::to_dtype(t, options().compute_dtype);
}

Tensor MMDiTModel::per_sample(const NamedTensors& inputs, const std::string& name, int64_t batch) const {
  const Tensor& t = input(inputs, name);
  FLAME_CHECK(t->dtype != FLAME_DTYPE_BOOL, FLAME_ERROR_INVALID_ARGUMENT, "input \"", name, "\" must be numbers, not bool");
  if (t->ndim() == 0) return ops::contiguous(ops::expand(ops::reshape(t, {1}), {batch}));
  FLAME_CHECK(t->ndim() == 1 && (t->shape[0] == batch || t->shape[0] == 1), FLAME_ERROR_INVALID_ARGUMENT, "input \"",
              name, "\" must be [batch] (", batch, ") or a scalar, not ", shape_str(t->shape));
  return t->shape[0] == batch ? t : ops::contiguous(ops::expand(t, {batch}));
}

}  // namespace flame::models

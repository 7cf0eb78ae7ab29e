// The pieces the MMDiT transformers (Flux: flux_transformer.cpp; SD3 / SD3.5: sd3_transformer.cpp)
// share, as diffusers builds them: Linear layers by name, the FeedForward of "gelu-approximate",
// adaLN modulation (AdaLayerNormZero's chunks, AdaLayerNormContinuous), the timestep / pooled-text
// conditioning (CombinedTimestepTextProjEmbeddings and its guidance variant), attention heads with
// their QK RMS norms, and rotary embeddings applied as diffusers' apply_rotary_emb does with
// use_real_unbind_dim=-1 (interleaved pairs). Every function is a composition of recorded FLAME ops,
// so gradients (parameters, inputs, even position ids and timesteps) need no rules of their own.
#pragma once
#include <string>
#include <utility>
#include <vector>
#include "models/model.h"
#include "ops/ops.h"

namespace flame::models {

// LayerNorm without affine parameters (nn.LayerNorm(dim, elementwise_affine=False, eps)).
Tensor plain_layer_norm(const Tensor& x, double eps);
// x * (1 + scale[:, None]) + shift[:, None] for x [B, T, C], shift / scale [B, C].
Tensor modulate(const Tensor& x, const Tensor& shift, const Tensor& scale);
// gate[:, None] * x for x [B, T, C], gate [B, C].
Tensor gated(const Tensor& x, const Tensor& gate);
// diffusers' apply_rotary_emb(x, (cos, sin), use_real_unbind_dim=-1) on x [B, H, S, D] with cos /
// sin [S, D] (f32): out = x * cos + rotate(x) * sin, rotate pairing (x0, x1) -> (-x1, x0), computed
// in f32 and returned in x's dtype.
Tensor apply_rotary(const Tensor& x, const Tensor& cos, const Tensor& sin);

// A Model of the MMDiT family: registration and use of its layers by diffusers name.
class MMDiTModel : public Model {
 protected:
  using Model::Model;

  // Registers name.weight [out, in] and (with bias) name.bias [out].
  void add_linear(const std::string& name, int64_t out, int64_t in, bool bias = true);
  // FeedForward(dim, dim_out=dim, activation_fn="gelu-approximate"): net.0.proj, net.2.
  void add_feed_forward(const std::string& prefix, int64_t dim, int64_t inner);
  // TimestepEmbedding / PixArtAlphaTextProjection: linear_1 [hidden, in], linear_2 [hidden, hidden].
  void add_two_layer_mlp(const std::string& prefix, int64_t hidden, int64_t in);

  // x @ name.weight^T + name.bias (bias when registered), with act fused.
  Tensor lin(const Tensor& x, const std::string& name, ops::Activation act = ops::Activation::None) const;
  // net.2(gelu_tanh(net.0.proj(x))).
  Tensor feed_forward(const Tensor& x, const std::string& prefix) const;
  // linear_2(silu(linear_1(x))) (TimestepEmbedding, PixArtAlphaTextProjection with act_fn "silu").
  Tensor two_layer_mlp(const Tensor& x, const std::string& prefix) const;
  // linear(silu(temb)) split into n chunks along dim 1 (AdaLayerNormZero's emb.chunk(n, dim=1)).
  std::vector<Tensor> modulation(const Tensor& temb, const std::string& linear, int64_t n) const;
  // AdaLayerNormContinuous(elementwise_affine=False, norm_type="layer_norm"): scale, shift =
  // linear(silu(temb)).chunk(2); layer_norm(x) * (1 + scale) + shift.
  Tensor ada_norm_continuous(const Tensor& x, const Tensor& temb, const std::string& linear, double eps) const;
  // Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0) then the TimestepEmbedding prefix,
  // the sinusoid cast to compute dtype first (as diffusers casts it to the pooled projection's).
  Tensor timestep_mlp(const Tensor& timesteps, const std::string& prefix) const;
  // The projection name of x [B, T, C] split into heads [B, H, T, D], then RMS-normed over D with
  // norm.weight when norm is not empty.
  Tensor heads(const Tensor& x, const std::string& proj, const std::string& norm, int64_t num_heads, double eps) const;
  // A float input in compute dtype; integer inputs (timesteps given as i64) converted too.
  Tensor as_compute_float(const Tensor& t) const;
  // Input name as a 1-D tensor of batch entries (timestep, guidance): a 0-d tensor is broadcast
  // to batch, as diffusers' pipelines expand it.
  Tensor per_sample(const NamedTensors& inputs, const std::string& name, int64_t batch) const;
};

}  // namespace flame::models

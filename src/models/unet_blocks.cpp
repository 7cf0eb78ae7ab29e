// The shared convolutional blocks of the UNet and the VAE (unet_blocks.h).
#include "models/unet_blocks.h"
#include "core/error.h"
#include "models/model_blocks.h"
#include "ops/attention.h"
#include "ops/conv.h"
#include "ops/nn.h"
#include "ops/nnops.h"
#include "ops/ops.h"

namespace flame::models {

// ---- parameter declarations ----

void add_weight_bias_specs(ParamSpecs& s, const std::string& prefix, const Shape& weight) {
  s.push_back({prefix + ".weight", weight});
  s.push_back({prefix + ".bias", {weight[0]}});
}

void add_conv_specs(ParamSpecs& s, const std::string& prefix, int64_t out, int64_t in, int64_t kernel) {
  add_weight_bias_specs(s, prefix, {out, in, kernel, kernel});
}

void add_resnet_specs(ParamSpecs& s, const std::string& p, int64_t in, int64_t out, int64_t temb_channels) {
  add_weight_bias_specs(s, p + "norm1", {in});
  add_conv_specs(s, p + "conv1", out, in, 3);
  if (temb_channels > 0) add_weight_bias_specs(s, p + "time_emb_proj", {out, temb_channels});
  add_weight_bias_specs(s, p + "norm2", {out});
  add_conv_specs(s, p + "conv2", out, out, 3);
  if (in != out) add_conv_specs(s, p + "conv_shortcut", out, in, 1);
}

void add_transformer2d_specs(ParamSpecs& s, const std::string& p, int64_t ch, int64_t depth, int64_t cross_dim,
                             bool linear_projection) {
  const Shape proj = linear_projection ? Shape{ch, ch} : Shape{ch, ch, 1, 1};
  add_weight_bias_specs(s, p + "norm", {ch});
  add_weight_bias_specs(s, p + "proj_in", proj);
  for (int64_t k = 0; k < depth; ++k) {
    const std::string b = p + "transformer_blocks." + std::to_string(k) + ".";
    add_weight_bias_specs(s, b + "norm1", {ch});
    for (const char* w : {"attn1.to_q", "attn1.to_k", "attn1.to_v"}) s.push_back({b + w + ".weight", {ch, ch}});
    add_weight_bias_specs(s, b + "attn1.to_out.0", {ch, ch});
    add_weight_bias_specs(s, b + "norm2", {ch});
    s.push_back({b + "attn2.to_q.weight", {ch, ch}});
    s.push_back({b + "attn2.to_k.weight", {ch, cross_dim}});
    s.push_back({b + "attn2.to_v.weight", {ch, cross_dim}});
    add_weight_bias_specs(s, b + "attn2.to_out.0", {ch, ch});
    add_weight_bias_specs(s, b + "norm3", {ch});
    add_weight_bias_specs(s, b + "ff.net.0.proj", {8 * ch, ch});  // GEGLU: hidden and gate, 4 ch each
    add_weight_bias_specs(s, b + "ff.net.2", {ch, 4 * ch});
  }
  add_weight_bias_specs(s, p + "proj_out", proj);
}

void add_spatial_attention_specs(ParamSpecs& s, const std::string& p, int64_t ch) {
  add_weight_bias_specs(s, p + "group_norm", {ch});
  for (const char* w : {"to_q", "to_k", "to_v", "to_out.0"}) add_weight_bias_specs(s, p + w, {ch, ch});
}

// ---- ConvNetModel ----

void ConvNetModel::register_params(const ParamSpecs& specs) {
  for (const ParamSpec& s : specs) add_param(s.name, s.shape);
}

Tensor ConvNetModel::run_unit(const std::function<Tensor(const Tensor&, const Tensor&)>& unit, const Tensor& x,
                              const Tensor& extra) {
  const int64_t index = unit_index_++;
  if (!checkpointing().applies_to(index) && !block_scopes_needed()) return unit(x, extra);
  // run_block takes and returns as many tensors: the unit's result, and a copy of extra standing for
  // it (nothing reads that copy; extra's gradient comes through the result).
  if (!extra) {
    auto block = [unit](const std::vector<Tensor>& in) { return std::vector<Tensor>{unit(in[0], nullptr)}; };
    return run_block(index, block, {x})[0];
  }
  auto block = [unit](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{unit(in[0], in[1]), ops::clone(in[1])};
  };
  return run_block(index, block, {x, extra})[0];
}

Tensor ConvNetModel::conv(const Tensor& x, const std::string& p, int64_t stride, int64_t padding) const {
  ops::ConvArgs a;
  a.stride[0] = a.stride[1] = stride;
  a.padding[0] = a.padding[1] = padding;
  return ops::conv2d(x, param(p + ".weight"), param(p + ".bias"), a);
}

Tensor ConvNetModel::group_norm(const Tensor& x, const std::string& p, int64_t groups, double eps) const {
  return ops::group_norm(x, groups, param(p + ".weight"), param(p + ".bias"), eps, false);
}

Tensor ConvNetModel::linear(const Tensor& x, const std::string& p, bool bias) const {
  return adapted_linear(x, p, param(p + ".weight"), bias ? param(p + ".bias") : nullptr);
}

Tensor ConvNetModel::linear_weight(const std::string& p) const {
  Tensor w = param(p + ".weight");
  return w->ndim() == 4 ? ops::reshape(w, {w->shape[0], w->shape[1]}) : w;
}

Tensor ConvNetModel::resnet(const Tensor& x, const Tensor& temb_act, const std::string& p, const ResnetArgs& a) const {
  Tensor h = ops::unary(OpId::Silu, group_norm(x, p + "norm1", a.groups, a.eps));
  h = conv(h, p + "conv1", 1, 1);
  if (temb_act) {
    Tensor t = linear(temb_act, p + "time_emb_proj", true);  // [B, out]
    h = ops::add(h, ops::reshape(t, {t->shape[0], t->shape[1], 1, 1}));
  }
  h = ops::unary(OpId::Silu, group_norm(h, p + "norm2", a.groups, a.eps));
  h = conv(h, p + "conv2", 1, 1);
  const Tensor shortcut = params().find(p + "conv_shortcut.weight") ? conv(x, p + "conv_shortcut", 1, 0) : x;
  Tensor out = ops::add(shortcut, h);
  return a.output_scale_factor == 1.0 ? out : ops::mul_scalar(out, 1.0 / a.output_scale_factor);
}

Tensor ConvNetModel::attention(const Tensor& x, const Tensor& context, const std::string& p, int64_t heads,
                               bool qkv_bias, const Tensor& bias) const {
  Tensor q = split_heads(linear(x, p + "to_q", qkv_bias), heads);
  Tensor k = split_heads(linear(context, p + "to_k", qkv_bias), heads);
  Tensor v = split_heads(linear(context, p + "to_v", qkv_bias), heads);
  Tensor a = merge_heads(ops::scaled_dot_product_attention(q, k, v, bias, ops::AttentionOptions{}));
  return linear(a, p + "to_out.0", true);
}

Tensor ConvNetModel::transformer_block(const Tensor& x, const Tensor& context, const std::string& p, int64_t heads,
                                       const Tensor& context_bias) const {
  const int64_t C = x->shape[2];
  auto norm = [&](const Tensor& h, const char* name) {
    return ops::layer_norm(h, {C}, param(p + name + ".weight"), param(p + name + ".bias"), 1e-5);
  };
  Tensor n = norm(x, "norm1");
  Tensor h = ops::add(attention(n, n, p + "attn1.", heads, false, nullptr), x);
  h = ops::add(attention(norm(h, "norm2"), context, p + "attn2.", heads, false, context_bias), h);
  Tensor ff = ops::geglu(linear(norm(h, "norm3"), p + "ff.net.0.proj", true), false);
  return ops::add(linear(ff, p + "ff.net.2", true), h);
}

Tensor ConvNetModel::transformer2d(const Tensor& x, const Tensor& context, const std::string& p, const TransformerArgs& a,
                                   const Tensor& context_bias) {
  const int64_t B = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
  Tensor h = group_norm(x, p + "norm", a.groups, 1e-6);
  h = ops::reshape(ops::permute(h, {0, 2, 3, 1}), {B, H * W, C});
  h = adapted_linear(h, p + "proj_in", linear_weight(p + "proj_in"), param(p + "proj_in.bias"));
  for (int64_t k = 0; k < a.depth; ++k) {
    const std::string block = p + "transformer_blocks." + std::to_string(k) + ".";
    const int64_t heads = a.heads;
    h = run_unit([this, block, heads, context_bias](const Tensor& t, const Tensor& c) {
      return transformer_block(t, c, block, heads, context_bias);
    }, h, context);
  }
  h = adapted_linear(h, p + "proj_out", linear_weight(p + "proj_out"), param(p + "proj_out.bias"));
  h = ops::permute(ops::reshape(h, {B, H, W, C}), {0, 3, 1, 2});
  return ops::add(h, x);
}

Tensor ConvNetModel::spatial_attention(const Tensor& x, const std::string& p, int64_t groups, double eps) const {
  const int64_t B = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
  Tensor h = group_norm(x, p + "group_norm", groups, eps);
  h = ops::reshape(ops::permute(h, {0, 2, 3, 1}), {B, H * W, C});
  h = attention(h, h, p, 1, true, nullptr);
  h = ops::permute(ops::reshape(h, {B, H, W, C}), {0, 3, 1, 2});
  return ops::add(h, x);
}

Tensor ConvNetModel::downsample(const Tensor& x, const std::string& p, int64_t padding) const {
  if (padding == 0) return conv(ops::pad(x, {0, 1, 0, 1}, ops::PadMode::Constant, 0.0), p, 2, 0);
  return conv(x, p, 2, padding);
}

Tensor ConvNetModel::upsample(const Tensor& x, const std::string& p, int64_t out_h, int64_t out_w) const {
  Tensor up = out_h > 0 ? ops::upsample2d(x, out_h, out_w, 0, 0, false, false)
                        : ops::upsample2d(x, 0, 0, 2.0, 2.0, false, false);
  return conv(up, p, 1, 1);
}

// ---- config helpers ----

void require_config_value(const nlohmann::json& cfg, const char* key, const std::vector<nlohmann::json>& allowed,
                          const char* supported) {
  if (!cfg.is_object()) return;
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return;
  for (const auto& a : allowed)
    if (*it == a) return;
  fail(FLAME_ERROR_INVALID_ARGUMENT, "config: \"", key, "\" = ", it->dump(), " is not supported (", supported, ")");
}

std::vector<int64_t> config_ints_per_block(const nlohmann::json& cfg, const char* key, int64_t fallback, size_t n) {
  std::vector<int64_t> v = config_ints(cfg, key, {fallback});
  const bool scalar = !cfg.is_object() || !cfg.contains(key) || cfg[key].is_null() || cfg[key].is_number_integer();
  if (scalar) v.assign(n, v.at(0));
  FLAME_CHECK(v.size() == n, FLAME_ERROR_INVALID_ARGUMENT, "config: \"", key, "\" has ", v.size(),
              " entries; the model has ", n, " blocks");
  for (int64_t x : v)
    FLAME_CHECK(x > 0, FLAME_ERROR_INVALID_ARGUMENT, "config: \"", key, "\" entries must be positive, not ", x);
  return v;
}

}  // namespace flame::models

// UNet2DConditionModel as diffusers defines it (models/unets/unet_2d_condition.py) for SDXL base /
// refiner and SD 1.5, with its parameter names and forward:
//
//   emb = time_embedding(timestep sinusoid)  (+ add_embedding([text_embeds, sinusoids of time_ids])
//                                              for SDXL's addition_embed_type "text_time")
//   h = conv_in(sample); skips = [h]
//   down blocks (DownBlock2D / CrossAttnDownBlock2D): per layer resnet(h, emb) (then Transformer2DModel
//     over encoder_hidden_states), each output kept as a skip; Downsample2D but in the last block
//   mid block (UNetMidBlock2DCrossAttn): resnet, transformer, resnet
//   up blocks (UpBlock2D / CrossAttnUpBlock2D): per layer h = cat(h, skips.pop()) -> resnet
//     (-> transformer); Upsample2D but in the last block (to the skip's size when the sample's size
//     is not a multiple of 2^upsamplers, as diffusers' forward_upsample_size)
//   sample = conv_out(silu(conv_norm_out(h)))
//
// Inputs: sample [B, in_channels, H, W], timestep [B] / [1] / scalar (any number dtype),
// encoder_hidden_states [B, T, cross_attention_dim], and with "text_time" text_embeds [B, P] and
// time_ids [B, K] (P + K * addition_time_embed_dim = projection_class_embeddings_input_dim);
// optional encoder_attention_mask [B, T] (nonzero = attend; diffusers' -10000 bias). Output: sample.
// Config options diffusers offers beyond these models (class embeddings, other block types, dual /
// only cross-attention, dropout, ...) are rejected by name.
#include <string>
#include "core/error.h"
#include "core/shape.h"
#include "models/model_registry.h"
#include "models/unet_blocks.h"
#include "ops/nnops.h"
#include "ops/ops.h"

namespace flame::models {

namespace {

struct DownPlan {
  int64_t in, out, layers, depth, heads;
  bool attention, downsample;
};

struct UpPlan {
  int64_t prev, out, skip_last, layers, depth, heads;  // layers: resnets (the down block's + 1)
  bool attention, upsample;
};

struct UNet2DConfig {
  int64_t in_channels, out_channels, groups, cross_attention_dim, time_embed_dim, downsample_padding;
  int64_t addition_time_embed_dim, projection_class_embeddings_input_dim;
  double eps, freq_shift, mid_block_scale_factor;
  bool flip_sin_to_cos, center_input_sample, use_linear_projection, text_time, mid_block;
  std::vector<int64_t> block_out_channels, layers_per_block, transformer_layers_per_block, attention_head_dim;
  std::vector<std::string> down_block_types, up_block_types;
  nlohmann::json sample_size;
  std::vector<DownPlan> down;
  std::vector<UpPlan> up;

  static UNet2DConfig read(const nlohmann::json& c);
  nlohmann::json to_json() const;
  ParamSpecs specs() const;
};

std::vector<std::string> config_strings(const nlohmann::json& c, const char* key, const std::vector<std::string>& fallback) {
  if (!c.is_object() || !c.contains(key) || c[key].is_null()) return fallback;
  const nlohmann::json& v = c[key];
  FLAME_CHECK(v.is_array(), FLAME_ERROR_INVALID_ARGUMENT, "config: \"", key, "\" must be a list of strings");
  std::vector<std::string> out;
  for (const auto& e : v) {
    FLAME_CHECK(e.is_string(), FLAME_ERROR_INVALID_ARGUMENT, "config: \"", key, "\" must be a list of strings");
    out.push_back(e.get<std::string>());
  }
  return out;
}

UNet2DConfig UNet2DConfig::read(const nlohmann::json& c) {
  // Options of diffusers' class these models do not use: only their defaults are accepted.
  require_config_value(c, "only_cross_attention", {false}, "false only");
  require_config_value(c, "mid_block_only_cross_attention", {false}, "false only");
  require_config_value(c, "dual_cross_attention", {false}, "false only");
  require_config_value(c, "dropout", {0, 0.0}, "0 only");
  require_config_value(c, "act_fn", {"silu", "swish"}, "silu");
  require_config_value(c, "class_embed_type", {}, "none");
  require_config_value(c, "num_class_embeds", {}, "none");
  require_config_value(c, "encoder_hid_dim", {}, "none");
  require_config_value(c, "encoder_hid_dim_type", {}, "none");
  require_config_value(c, "addition_embed_type", {"text_time"}, "none or text_time");
  require_config_value(c, "num_attention_heads", {}, "none: diffusers reads the heads from attention_head_dim");
  require_config_value(c, "reverse_transformer_layers_per_block", {}, "none");
  require_config_value(c, "resnet_time_scale_shift", {"default"}, "default");
  require_config_value(c, "resnet_skip_time_act", {false}, "false");
  require_config_value(c, "resnet_out_scale_factor", {1, 1.0}, "1");
  require_config_value(c, "time_embedding_type", {"positional"}, "positional");
  require_config_value(c, "time_embedding_act_fn", {}, "none");
  require_config_value(c, "timestep_post_act", {}, "none");
  require_config_value(c, "time_cond_proj_dim", {}, "none");
  require_config_value(c, "conv_in_kernel", {3}, "3");
  require_config_value(c, "conv_out_kernel", {3}, "3");
  require_config_value(c, "attention_type", {"default"}, "default");
  require_config_value(c, "class_embeddings_concat", {false}, "false");
  require_config_value(c, "cross_attention_norm", {}, "none");
  require_config_value(c, "mid_block_type", {"UNetMidBlock2DCrossAttn"}, "UNetMidBlock2DCrossAttn or none");

  UNet2DConfig k;
  k.in_channels = config_int(c, "in_channels", 4);
  k.out_channels = config_int(c, "out_channels", 4);
  k.block_out_channels = config_ints(c, "block_out_channels", {320, 640, 1280, 1280});
  const size_t n = k.block_out_channels.size();
  FLAME_CHECK(n >= 1, FLAME_ERROR_INVALID_ARGUMENT, "config: \"block_out_channels\" is empty");
  k.down_block_types = config_strings(c, "down_block_types", {"CrossAttnDownBlock2D", "CrossAttnDownBlock2D",
                                                             "CrossAttnDownBlock2D", "DownBlock2D"});
  k.up_block_types = config_strings(c, "up_block_types", {"UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D",
                                                         "CrossAttnUpBlock2D"});
  FLAME_CHECK(k.down_block_types.size() == n && k.up_block_types.size() == n, FLAME_ERROR_INVALID_ARGUMENT,
              "config: down_block_types and up_block_types must have one entry per block_out_channels (", n, ")");
  for (const auto& t : k.down_block_types)
    FLAME_CHECK(t == "CrossAttnDownBlock2D" || t == "DownBlock2D", FLAME_ERROR_INVALID_ARGUMENT,
                "config: down block type \"", t, "\" is not supported (CrossAttnDownBlock2D, DownBlock2D)");
  for (const auto& t : k.up_block_types)
    FLAME_CHECK(t == "CrossAttnUpBlock2D" || t == "UpBlock2D", FLAME_ERROR_INVALID_ARGUMENT,
                "config: up block type \"", t, "\" is not supported (CrossAttnUpBlock2D, UpBlock2D)");
  k.mid_block = !(c.is_object() && c.contains("mid_block_type") && c["mid_block_type"].is_null());
  k.layers_per_block = config_ints_per_block(c, "layers_per_block", 2, n);
  k.transformer_layers_per_block = config_ints_per_block(c, "transformer_layers_per_block", 1, n);
  k.attention_head_dim = config_ints_per_block(c, "attention_head_dim", 8, n);
  k.cross_attention_dim = config_int(c, "cross_attention_dim", 1280);
  k.use_linear_projection = config_bool(c, "use_linear_projection", false);
  k.groups = config_int(c, "norm_num_groups", 32);
  k.eps = config_real(c, "norm_eps", 1e-5);
  k.flip_sin_to_cos = config_bool(c, "flip_sin_to_cos", true);
  k.freq_shift = config_real(c, "freq_shift", 0);
  k.center_input_sample = config_bool(c, "center_input_sample", false);
  k.downsample_padding = config_int(c, "downsample_padding", 1);
  k.mid_block_scale_factor = config_real(c, "mid_block_scale_factor", 1.0);
  k.time_embed_dim = config_int(c, "time_embedding_dim", 4 * k.block_out_channels[0]);
  k.text_time = config_string(c, "addition_embed_type", "") == "text_time";
  k.addition_time_embed_dim = config_int(c, "addition_time_embed_dim", 0);
  k.projection_class_embeddings_input_dim = config_int(c, "projection_class_embeddings_input_dim", 0);
  k.sample_size = c.is_object() && c.contains("sample_size") ? c["sample_size"] : nlohmann::json(nullptr);

  auto positive = [](int64_t v, const char* key) {
    FLAME_CHECK(v > 0, FLAME_ERROR_INVALID_ARGUMENT, "config: \"", key, "\" must be positive, not ", v);
  };
  positive(k.in_channels, "in_channels");
  positive(k.out_channels, "out_channels");
  positive(k.cross_attention_dim, "cross_attention_dim");
  positive(k.groups, "norm_num_groups");
  positive(k.time_embed_dim, "time_embedding_dim");
  FLAME_CHECK(k.eps > 0, FLAME_ERROR_INVALID_ARGUMENT, "config: \"norm_eps\" must be positive");
  FLAME_CHECK(k.mid_block_scale_factor != 0, FLAME_ERROR_INVALID_ARGUMENT, "config: \"mid_block_scale_factor\" is 0");
  FLAME_CHECK(k.downsample_padding >= 0, FLAME_ERROR_INVALID_ARGUMENT, "config: \"downsample_padding\" is negative");
  FLAME_CHECK(k.block_out_channels[0] % 2 == 0, FLAME_ERROR_INVALID_ARGUMENT,
              "config: block_out_channels[0] (the timestep sinusoid's width) must be even");
  for (size_t i = 0; i < n; ++i) {
    const int64_t ch = k.block_out_channels[i];
    positive(ch, "block_out_channels");
    FLAME_CHECK(ch % k.groups == 0, FLAME_ERROR_INVALID_ARGUMENT, "config: block_out_channels[", i, "] = ", ch,
                " is not a multiple of norm_num_groups ", k.groups);
    FLAME_CHECK(ch % k.attention_head_dim[i] == 0, FLAME_ERROR_INVALID_ARGUMENT, "config: block_out_channels[", i,
                "] = ", ch, " is not a multiple of its number of heads (attention_head_dim) ", k.attention_head_dim[i]);
    FLAME_CHECK(ch % k.attention_head_dim[n - 1 - i] == 0, FLAME_ERROR_INVALID_ARGUMENT, "config: block_out_channels[",
                i, "] = ", ch, " is not a multiple of its up block's number of heads ", k.attention_head_dim[n - 1 - i]);
  }
  if (k.text_time) {
    positive(k.addition_time_embed_dim, "addition_time_embed_dim");
    positive(k.projection_class_embeddings_input_dim, "projection_class_embeddings_input_dim");
  }

  // The blocks, as diffusers' __init__ derives them.
  const auto& ch = k.block_out_channels;
  for (size_t i = 0; i < n; ++i)
    k.down.push_back({i == 0 ? ch[0] : ch[i - 1], ch[i], k.layers_per_block[i], k.transformer_layers_per_block[i],
                      k.attention_head_dim[i], k.down_block_types[i] == "CrossAttnDownBlock2D", i + 1 < n});
  for (size_t i = 0; i < n; ++i) {
    const size_t r = n - 1 - i;  // reversed lists
    k.up.push_back({i == 0 ? ch[n - 1] : ch[r + 1], ch[r], ch[r == 0 ? 0 : r - 1], k.layers_per_block[r] + 1,
                    k.transformer_layers_per_block[r], k.attention_head_dim[r],
                    k.up_block_types[i] == "CrossAttnUpBlock2D", i + 1 < n});
  }
  // Up blocks consume the down path's outputs: conv_in's and one per down resnet and downsampler.
  int64_t produced = 1, consumed = 0;
  for (const auto& d : k.down) produced += d.layers + (d.downsample ? 1 : 0);
  for (const auto& u : k.up) consumed += u.layers;
  FLAME_CHECK(produced == consumed, FLAME_ERROR_INVALID_ARGUMENT, "config: the up blocks take ", consumed,
              " skip connections, the down blocks make ", produced, " (layers_per_block)");
  return k;
}

nlohmann::json UNet2DConfig::to_json() const {
  nlohmann::json j = {{"_class_name", "UNet2DConditionModel"},
                      {"in_channels", in_channels},
                      {"out_channels", out_channels},
                      {"center_input_sample", center_input_sample},
                      {"flip_sin_to_cos", flip_sin_to_cos},
                      {"freq_shift", freq_shift},
                      {"down_block_types", down_block_types},
                      {"mid_block_type", mid_block ? nlohmann::json("UNetMidBlock2DCrossAttn") : nlohmann::json(nullptr)},
                      {"up_block_types", up_block_types},
                      {"block_out_channels", block_out_channels},
                      {"layers_per_block", layers_per_block},
                      {"downsample_padding", downsample_padding},
                      {"mid_block_scale_factor", mid_block_scale_factor},
                      {"act_fn", "silu"},
                      {"norm_num_groups", groups},
                      {"norm_eps", eps},
                      {"cross_attention_dim", cross_attention_dim},
                      {"transformer_layers_per_block", transformer_layers_per_block},
                      {"attention_head_dim", attention_head_dim},
                      {"use_linear_projection", use_linear_projection},
                      {"time_embedding_dim", time_embed_dim},
                      {"sample_size", sample_size}};
  j["addition_embed_type"] = text_time ? nlohmann::json("text_time") : nlohmann::json(nullptr);
  j["addition_time_embed_dim"] = text_time ? nlohmann::json(addition_time_embed_dim) : nlohmann::json(nullptr);
  j["projection_class_embeddings_input_dim"] =
      text_time ? nlohmann::json(projection_class_embeddings_input_dim) : nlohmann::json(nullptr);
  return j;
}

std::string down_prefix(size_t i) { return "down_blocks." + std::to_string(i) + "."; }
std::string up_prefix(size_t i) { return "up_blocks." + std::to_string(i) + "."; }
std::string indexed(const std::string& p, const char* list, int64_t l) { return p + list + "." + std::to_string(l) + "."; }

ParamSpecs UNet2DConfig::specs() const {
  ParamSpecs s;
  const int64_t T = time_embed_dim, top = block_out_channels.back();
  add_conv_specs(s, "conv_in", block_out_channels[0], in_channels, 3);
  add_weight_bias_specs(s, "time_embedding.linear_1", {T, block_out_channels[0]});
  add_weight_bias_specs(s, "time_embedding.linear_2", {T, T});
  if (text_time) {
    add_weight_bias_specs(s, "add_embedding.linear_1", {T, projection_class_embeddings_input_dim});
    add_weight_bias_specs(s, "add_embedding.linear_2", {T, T});
  }
  for (size_t i = 0; i < down.size(); ++i) {
    const DownPlan& d = down[i];
    const std::string p = down_prefix(i);
    if (d.attention)
      for (int64_t l = 0; l < d.layers; ++l)
        add_transformer2d_specs(s, indexed(p, "attentions", l), d.out, d.depth, cross_attention_dim, use_linear_projection);
    for (int64_t l = 0; l < d.layers; ++l) add_resnet_specs(s, indexed(p, "resnets", l), l == 0 ? d.in : d.out, d.out, T);
    if (d.downsample) add_conv_specs(s, p + "downsamplers.0.conv", d.out, d.out, 3);
  }
  for (size_t i = 0; i < up.size(); ++i) {
    const UpPlan& u = up[i];
    const std::string p = up_prefix(i);
    if (u.attention)
      for (int64_t l = 0; l < u.layers; ++l)
        add_transformer2d_specs(s, indexed(p, "attentions", l), u.out, u.depth, cross_attention_dim, use_linear_projection);
    for (int64_t l = 0; l < u.layers; ++l) {
      const int64_t in = (l == 0 ? u.prev : u.out) + (l == u.layers - 1 ? u.skip_last : u.out);
      add_resnet_specs(s, indexed(p, "resnets", l), in, u.out, T);
    }
    if (u.upsample) add_conv_specs(s, p + "upsamplers.0.conv", u.out, u.out, 3);
  }
  if (mid_block) {
    add_transformer2d_specs(s, "mid_block.attentions.0.", top, transformer_layers_per_block.back(), cross_attention_dim,
                            use_linear_projection);
    add_resnet_specs(s, "mid_block.resnets.0.", top, top, T);
    add_resnet_specs(s, "mid_block.resnets.1.", top, top, T);
  }
  add_weight_bias_specs(s, "conv_norm_out", {block_out_channels[0]});
  add_conv_specs(s, "conv_out", out_channels, block_out_channels[0], 3);
  return s;
}

class UNet2DConditionModel : public ConvNetModel {
 public:
  UNet2DConditionModel(Context& ctx, UNet2DConfig cfg, const ModelOptions& options)
      : ConvNetModel(ctx, "UNet2DConditionModel", cfg.to_json(), options), cfg_(std::move(cfg)) {
    register_params(cfg_.specs());
  }

  std::vector<std::string> required_inputs() const override {
    std::vector<std::string> r{"sample", "timestep", "encoder_hidden_states"};
    if (cfg_.text_time) r.insert(r.end(), {"text_embeds", "time_ids"});
    return r;
  }
  std::vector<std::string> optional_inputs() const override { return {"encoder_attention_mask"}; }

 protected:
  NamedTensors run(const NamedTensors& inputs) override {
    begin_units();
    Tensor x = to_compute(input(inputs, "sample"));
    FLAME_CHECK(x->ndim() == 4 && x->shape[1] == cfg_.in_channels && is_floating(x->dtype), FLAME_ERROR_INVALID_ARGUMENT,
                "sample must be a float [batch, ", cfg_.in_channels, ", height, width] tensor, not ", shape_str(x->shape));
    const int64_t B = x->shape[0];
    const Tensor context = to_compute(input(inputs, "encoder_hidden_states"));
    FLAME_CHECK(context->ndim() == 3 && context->shape[0] == B && context->shape[2] == cfg_.cross_attention_dim &&
                    is_floating(context->dtype),
                FLAME_ERROR_INVALID_ARGUMENT, "encoder_hidden_states must be a float [", B, ", tokens, ",
                cfg_.cross_attention_dim, "] tensor, not ", shape_str(context->shape));
    const Tensor bias = context_bias(inputs, B, context->shape[1]);
    const Tensor temb = ops::unary(OpId::Silu, embedding(inputs, B));
    if (cfg_.center_input_sample) x = ops::add_scalar(ops::mul_scalar(x, 2.0), -1.0);

    const int64_t ups = static_cast<int64_t>(cfg_.up.size()) - 1, factor = int64_t{1} << ups;
    const bool forward_upsample_size = x->shape[2] % factor != 0 || x->shape[3] % factor != 0;
    x = conv(x, "conv_in", 1, 1);
    std::vector<Tensor> skips{x};
    for (size_t i = 0; i < cfg_.down.size(); ++i) {
      const DownPlan& d = cfg_.down[i];
      for (int64_t l = 0; l < d.layers; ++l) {
        x = resnet_unit(x, temb, indexed(down_prefix(i), "resnets", l), 1.0);
        if (d.attention)
          x = transformer2d(x, context, indexed(down_prefix(i), "attentions", l), transformer_args(d.heads, d.depth), bias);
        skips.push_back(x);
      }
      if (d.downsample) {
        x = downsample(x, down_prefix(i) + "downsamplers.0.conv", cfg_.downsample_padding);
        skips.push_back(x);
      }
    }
    if (cfg_.mid_block) {
      const double scale = cfg_.mid_block_scale_factor;
      x = resnet_unit(x, temb, "mid_block.resnets.0.", scale);
      x = transformer2d(x, context, "mid_block.attentions.0.",
                        transformer_args(cfg_.attention_head_dim.back(), cfg_.transformer_layers_per_block.back()), bias);
      x = resnet_unit(x, temb, "mid_block.resnets.1.", scale);
    }
    for (size_t i = 0; i < cfg_.up.size(); ++i) {
      const UpPlan& u = cfg_.up[i];
      for (int64_t l = 0; l < u.layers; ++l) {
        x = ops::cat({x, skips.back()}, 1);
        skips.pop_back();
        x = resnet_unit(x, temb, indexed(up_prefix(i), "resnets", l), 1.0);
        if (u.attention)
          x = transformer2d(x, context, indexed(up_prefix(i), "attentions", l), transformer_args(u.heads, u.depth), bias);
      }
      if (u.upsample) {
        const int64_t oh = forward_upsample_size ? skips.back()->shape[2] : 0;
        const int64_t ow = forward_upsample_size ? skips.back()->shape[3] : 0;
        x = upsample(x, up_prefix(i) + "upsamplers.0.conv", oh, ow);
      }
    }
    x = ops::unary(OpId::Silu, group_norm(x, "conv_norm_out", cfg_.groups, cfg_.eps));
    return {{"sample", conv(x, "conv_out", 1, 1)}};
  }

 private:
  // diffusers' encoder_attention_mask [B, T] (nonzero = attend) as its additive bias of the
  // cross-attention scores, (1 - mask) * -10000, shaped [B, 1, 1, T]; null without a mask.
  Tensor context_bias(const NamedTensors& inputs, int64_t B, int64_t T) const {
    const Tensor* m = optional_input(inputs, "encoder_attention_mask");
    if (!m) return nullptr;
    FLAME_CHECK((*m)->ndim() == 2 && (*m)->shape[0] == B && (*m)->shape[1] == T, FLAME_ERROR_INVALID_ARGUMENT,
                "encoder_attention_mask must be [", B, ", ", T, "] like encoder_hidden_states' tokens, not ",
                shape_str((*m)->shape));
    Tensor keep = ops::to_dtype(*m, options().compute_dtype);
    return ops::reshape(ops::mul_scalar(ops::add_scalar(ops::neg(keep), 1.0), -10000.0), {B, 1, 1, T});
  }

  TransformerArgs transformer_args(int64_t heads, int64_t depth) const {
    TransformerArgs a;
    a.heads = heads;
    a.depth = depth;
    a.groups = cfg_.groups;
    a.linear_projection = cfg_.use_linear_projection;
    return a;
  }

  Tensor resnet_unit(const Tensor& x, const Tensor& temb, const std::string& prefix, double scale) {
    ResnetArgs a;
    a.groups = cfg_.groups;
    a.eps = cfg_.eps;
    a.output_scale_factor = scale;
    return run_unit([this, prefix, a](const Tensor& h, const Tensor& t) { return resnet(h, t, prefix, a); }, x, temb);
  }

  // diffusers' Timesteps (a sinusoid, f32) then TimestepEmbedding; with "text_time", plus
  // add_embedding over [text_embeds, sinusoids of time_ids]. Returns emb [B, time_embed_dim].
  Tensor embedding(const NamedTensors& inputs, int64_t B) const {
    Tensor t = input(inputs, "timestep");
    FLAME_CHECK(t->dtype != FLAME_DTYPE_BOOL && (t->ndim() == 0 || (t->ndim() == 1 && (t->shape[0] == 1 || t->shape[0] == B))),
                FLAME_ERROR_INVALID_ARGUMENT, "timestep must be a number, [1] or [", B, "], not ", shape_str(t->shape));
    t = ops::contiguous(ops::expand(ops::reshape(t, {t->ndim() == 0 ? 1 : t->shape[0]}), {B}));
    Tensor sinusoid = ops::timestep_embedding(t, cfg_.block_out_channels[0], 10000, cfg_.flip_sin_to_cos, cfg_.freq_shift, 1.0);
    Tensor emb = mlp(to_compute(sinusoid), "time_embedding");
    if (!cfg_.text_time) return emb;
    const Tensor text = to_compute(input(inputs, "text_embeds"));
    const Tensor ids = input(inputs, "time_ids");
    FLAME_CHECK(text->ndim() == 2 && text->shape[0] == B && is_floating(text->dtype), FLAME_ERROR_INVALID_ARGUMENT,
                "text_embeds must be a float [", B, ", pooled width] tensor, not ", shape_str(text->shape));
    FLAME_CHECK(ids->ndim() == 2 && ids->shape[0] == B && ids->dtype != FLAME_DTYPE_BOOL, FLAME_ERROR_INVALID_ARGUMENT,
                "time_ids must be a [", B, ", conditions] tensor of numbers, not ", shape_str(ids->shape));
    const int64_t K = ids->shape[1], D = cfg_.addition_time_embed_dim;
    FLAME_CHECK(text->shape[1] + K * D == cfg_.projection_class_embeddings_input_dim, FLAME_ERROR_INVALID_ARGUMENT,
                "text_embeds width ", text->shape[1], " plus ", K, " time_ids of ", D,
                " sinusoid channels each must equal projection_class_embeddings_input_dim ",
                cfg_.projection_class_embeddings_input_dim);
    Tensor time = ops::timestep_embedding(ops::reshape(ops::contiguous(ids), {B * K}), D, 10000, cfg_.flip_sin_to_cos,
                                          cfg_.freq_shift, 1.0);
    Tensor added = ops::cat({text, to_compute(ops::reshape(time, {B, K * D}))}, 1);
    return ops::add(emb, mlp(added, "add_embedding"));
  }

  // TimestepEmbedding: linear_2(silu(linear_1(x))).
  Tensor mlp(const Tensor& x, const std::string& prefix) const {
    return linear(ops::unary(OpId::Silu, linear(x, prefix + ".linear_1", true)), prefix + ".linear_2", true);
  }

  UNet2DConfig cfg_;
};

}  // namespace

ParamSpecs unet2d_condition_param_specs(const nlohmann::json& config) { return UNet2DConfig::read(config).specs(); }

std::shared_ptr<Model> create_unet2d_condition_model(Context& ctx, const nlohmann::json& config, const ModelOptions& options) {
  return std::make_shared<UNet2DConditionModel>(ctx, UNet2DConfig::read(config), options);
}

}  // namespace flame::models

// AutoencoderKL as diffusers defines it (models/autoencoders/autoencoder_kl.py, vae.py): the VAE of
// SD 1.5 / SDXL (4 latent channels, with quant_conv / post_quant_conv) and of Flux / SD3 (16
// channels, use_quant_conv / use_post_quant_conv false), with diffusers' parameter names.
//
//   encode: Encoder (conv_in, DownEncoderBlock2Ds of resnets with a right/bottom-padded stride-2
//           downsampler but in the last, UNetMidBlock2D = resnet, single-head attention over
//           positions, resnet; GroupNorm eps 1e-6, silu, conv_out to 2 * latent_channels), then
//           quant_conv; the DiagonalGaussianDistribution's parameters: mean and logvar (clamped to
//           [-30, 20]) are the two channel halves
//   decode: post_quant_conv, Decoder (conv_in, mid block, UpDecoderBlock2Ds of layers_per_block + 1
//           resnets with a nearest x2 upsampler but in the last, GroupNorm, silu, conv_out)
//
// Forward runs either or both: input "sample" [B, in_channels, H, W] gives "latent_mean" and
// "latent_logvar" [B, latent_channels, H / f, W / f] (f = 2^(blocks - 1); odd sizes round down)
// (sampling is the user's: mean + exp(logvar / 2) * noise); input "latent_sample"
// [B, latent_channels, h, w] gives "sample" [B, out_channels, h * f, w * f]. scaling_factor and
// shift_factor are config values the caller applies ((latent - shift) * scale), as in diffusers.
#include <string>
#include "core/error.h"
#include "core/shape.h"
#include "models/model_registry.h"
#include "models/unet_blocks.h"
#include "ops/ops.h"

namespace flame::models {

namespace {

struct VaeConfig {
  int64_t in_channels, out_channels, latent_channels, layers_per_block, groups;
  std::vector<int64_t> block_out_channels;
  bool use_quant_conv, use_post_quant_conv, mid_attention;
  nlohmann::json passthrough;  // config values FLAME keeps for the user (scaling_factor, ...)

  static VaeConfig read(const nlohmann::json& c);
  nlohmann::json to_json() const;
  ParamSpecs specs() const;
  size_t blocks() const { return block_out_channels.size(); }
};

void require_each(const nlohmann::json& c, const char* key, const char* type) {
  if (!c.is_object() || !c.contains(key) || c[key].is_null()) return;
  FLAME_CHECK(c[key].is_array(), FLAME_ERROR_INVALID_ARGUMENT, "config: \"", key, "\" must be a list of strings");
  for (const auto& e : c[key])
    FLAME_CHECK(e == type, FLAME_ERROR_INVALID_ARGUMENT, "config: \"", key, "\" entry ", e.dump(),
                " is not supported (", type, ")");
}

VaeConfig VaeConfig::read(const nlohmann::json& c) {
  require_config_value(c, "act_fn", {"silu", "swish"}, "silu");
  require_config_value(c, "norm_type", {"group"}, "group");
  require_each(c, "down_block_types", "DownEncoderBlock2D");
  require_each(c, "up_block_types", "UpDecoderBlock2D");
  VaeConfig k;
  k.in_channels = config_int(c, "in_channels", 3);
  k.out_channels = config_int(c, "out_channels", 3);
  k.latent_channels = config_int(c, "latent_channels", 4);
  k.layers_per_block = config_int(c, "layers_per_block", 1);
  k.groups = config_int(c, "norm_num_groups", 32);
  k.block_out_channels = config_ints(c, "block_out_channels", {64});
  k.use_quant_conv = config_bool(c, "use_quant_conv", true);
  k.use_post_quant_conv = config_bool(c, "use_post_quant_conv", true);
  k.mid_attention = config_bool(c, "mid_block_add_attention", true);
  for (const char* key : {"in_channels", "out_channels", "latent_channels", "layers_per_block", "norm_num_groups"}) {
    const int64_t v = config_int(c, key, 1);
    FLAME_CHECK(v > 0, FLAME_ERROR_INVALID_ARGUMENT, "config: \"", key, "\" must be positive, not ", v);
  }
  FLAME_CHECK(!k.block_out_channels.empty(), FLAME_ERROR_INVALID_ARGUMENT, "config: \"block_out_channels\" is empty");
  for (const char* key : {"down_block_types", "up_block_types"})
    if (c.is_object() && c.contains(key) && c[key].is_array())
      FLAME_CHECK(c[key].size() == k.blocks(), FLAME_ERROR_INVALID_ARGUMENT, "config: \"", key, "\" has ",
                  c[key].size(), " entries; block_out_channels has ", k.blocks());
  for (int64_t ch : k.block_out_channels)
    FLAME_CHECK(ch > 0 && ch % k.groups == 0, FLAME_ERROR_INVALID_ARGUMENT, "config: block_out_channels entry ", ch,
                " is not a positive multiple of norm_num_groups ", k.groups);
  // Kept as given (with diffusers' defaults) for the user: the latent scaling FLAME does not apply.
  k.passthrough = {{"scaling_factor", config_real(c, "scaling_factor", 0.18215)},
                   {"shift_factor", nullptr},
                   {"latents_mean", nullptr},
                   {"latents_std", nullptr},
                   {"force_upcast", config_bool(c, "force_upcast", true)},
                   {"sample_size", 32}};
  for (const char* key : {"shift_factor", "latents_mean", "latents_std", "sample_size"})
    if (c.is_object() && c.contains(key)) k.passthrough[key] = c[key];
  if (!k.passthrough["shift_factor"].is_null()) config_real(c, "shift_factor", 0);  // a number or null
  return k;
}

nlohmann::json VaeConfig::to_json() const {
  nlohmann::json j = {{"_class_name", "AutoencoderKL"},
                      {"in_channels", in_channels},
                      {"out_channels", out_channels},
                      {"down_block_types", std::vector<std::string>(blocks(), "DownEncoderBlock2D")},
                      {"up_block_types", std::vector<std::string>(blocks(), "UpDecoderBlock2D")},
                      {"block_out_channels", block_out_channels},
                      {"layers_per_block", layers_per_block},
                      {"act_fn", "silu"},
                      {"latent_channels", latent_channels},
                      {"norm_num_groups", groups},
                      {"use_quant_conv", use_quant_conv},
                      {"use_post_quant_conv", use_post_quant_conv},
                      {"mid_block_add_attention", mid_attention}};
  j.update(passthrough);
  return j;
}

void add_mid_block_specs(ParamSpecs& s, const std::string& p, int64_t ch, bool attention) {
  if (attention) add_spatial_attention_specs(s, p + "attentions.0.", ch);
  add_resnet_specs(s, p + "resnets.0.", ch, ch, 0);
  add_resnet_specs(s, p + "resnets.1.", ch, ch, 0);
}

std::string block_prefix(const char* part, const char* list, size_t i) {
  return std::string(part) + "." + list + "." + std::to_string(i) + ".";
}

ParamSpecs VaeConfig::specs() const {
  ParamSpecs s;
  const auto& ch = block_out_channels;
  const size_t n = blocks();
  const int64_t L = latent_channels;
  add_conv_specs(s, "encoder.conv_in", ch[0], in_channels, 3);
  for (size_t i = 0; i < n; ++i) {
    const std::string p = block_prefix("encoder", "down_blocks", i);
    for (int64_t l = 0; l < layers_per_block; ++l)
      add_resnet_specs(s, p + "resnets." + std::to_string(l) + ".", l == 0 ? (i == 0 ? ch[0] : ch[i - 1]) : ch[i], ch[i], 0);
    if (i + 1 < n) add_conv_specs(s, p + "downsamplers.0.conv", ch[i], ch[i], 3);
  }
  add_mid_block_specs(s, "encoder.mid_block.", ch[n - 1], mid_attention);
  add_weight_bias_specs(s, "encoder.conv_norm_out", {ch[n - 1]});
  add_conv_specs(s, "encoder.conv_out", 2 * L, ch[n - 1], 3);

  add_conv_specs(s, "decoder.conv_in", ch[n - 1], L, 3);
  for (size_t i = 0; i < n; ++i) {
    const std::string p = block_prefix("decoder", "up_blocks", i);
    const int64_t prev = ch[n - (i == 0 ? 1 : i)], out = ch[n - 1 - i];
    for (int64_t l = 0; l <= layers_per_block; ++l)
      add_resnet_specs(s, p + "resnets." + std::to_string(l) + ".", l == 0 ? prev : out, out, 0);
    if (i + 1 < n) add_conv_specs(s, p + "upsamplers.0.conv", out, out, 3);
  }
  add_mid_block_specs(s, "decoder.mid_block.", ch[n - 1], mid_attention);
  add_weight_bias_specs(s, "decoder.conv_norm_out", {ch[0]});
  add_conv_specs(s, "decoder.conv_out", out_channels, ch[0], 3);
  if (use_quant_conv) add_conv_specs(s, "quant_conv", 2 * L, 2 * L, 1);
  if (use_post_quant_conv) add_conv_specs(s, "post_quant_conv", L, L, 1);
  return s;
}

class AutoencoderKLModel : public ConvNetModel {
 public:
  AutoencoderKLModel(Context& ctx, VaeConfig cfg, const ModelOptions& options)
      : ConvNetModel(ctx, "AutoencoderKL", cfg.to_json(), options), cfg_(std::move(cfg)) {
    register_params(cfg_.specs());
  }

  std::vector<std::string> required_inputs() const override { return {}; }
  std::vector<std::string> optional_inputs() const override { return {"sample", "latent_sample"}; }

 protected:
  NamedTensors run(const NamedTensors& inputs) override {
    const Tensor* image = optional_input(inputs, "sample");
    const Tensor* latent = optional_input(inputs, "latent_sample");
    FLAME_CHECK(image || latent, FLAME_ERROR_INVALID_ARGUMENT,
                "AutoencoderKL takes \"sample\" (to encode), \"latent_sample\" (to decode) or both");
    begin_units();
    NamedTensors out;
    if (image) {
      Tensor h = encode(checked(*image, "sample", cfg_.in_channels));
      const int64_t L = cfg_.latent_channels;
      out.emplace_back("latent_mean", ops::contiguous(ops::narrow(h, 1, 0, L)));
      out.emplace_back("latent_logvar", ops::unary(OpId::Clamp, ops::narrow(h, 1, L, L), -30.0, 20.0));
    }
    if (latent) out.emplace_back("sample", decode(checked(*latent, "latent_sample", cfg_.latent_channels)));
    return out;
  }

 private:
  Tensor checked(const Tensor& t, const char* name, int64_t channels) const {
    FLAME_CHECK(t->ndim() == 4 && t->shape[1] == channels && is_floating(t->dtype), FLAME_ERROR_INVALID_ARGUMENT, name,
                " must be a float [batch, ", channels, ", height, width] tensor, not ", shape_str(t->shape));
    return to_compute(t);
  }

  Tensor resnet_unit(const Tensor& x, const std::string& prefix) {
    ResnetArgs a;
    a.groups = cfg_.groups;
    a.eps = 1e-6;
    return run_unit([this, prefix, a](const Tensor& h, const Tensor&) { return resnet(h, nullptr, prefix, a); }, x, nullptr);
  }

  Tensor mid_block(const Tensor& x, const std::string& p) {
    Tensor h = resnet_unit(x, p + "resnets.0.");
    if (cfg_.mid_attention) {
      const std::string attn = p + "attentions.0.";
      const int64_t groups = cfg_.groups;
      h = run_unit([this, attn, groups](const Tensor& t, const Tensor&) { return spatial_attention(t, attn, groups, 1e-6); },
                   h, nullptr);
    }
    return resnet_unit(h, p + "resnets.1.");
  }

  Tensor head(const Tensor& x, const std::string& p) const {
    return conv(ops::unary(OpId::Silu, group_norm(x, p + "conv_norm_out", cfg_.groups, 1e-6)), p + "conv_out", 1, 1);
  }

  Tensor encode(const Tensor& sample) {
    const size_t n = cfg_.blocks();
    Tensor h = conv(sample, "encoder.conv_in", 1, 1);
    for (size_t i = 0; i < n; ++i) {
      const std::string p = block_prefix("encoder", "down_blocks", i);
      for (int64_t l = 0; l < cfg_.layers_per_block; ++l) h = resnet_unit(h, p + "resnets." + std::to_string(l) + ".");
      if (i + 1 < n) h = downsample(h, p + "downsamplers.0.conv", 0);
    }
    h = head(mid_block(h, "encoder.mid_block."), "encoder.");
    return cfg_.use_quant_conv ? conv(h, "quant_conv", 1, 0) : h;
  }

  Tensor decode(const Tensor& z) {
    const size_t n = cfg_.blocks();
    Tensor h = cfg_.use_post_quant_conv ? conv(z, "post_quant_conv", 1, 0) : z;
    h = mid_block(conv(h, "decoder.conv_in", 1, 1), "decoder.mid_block.");
    for (size_t i = 0; i < n; ++i) {
      const std::string p = block_prefix("decoder", "up_blocks", i);
      for (int64_t l = 0; l <= cfg_.layers_per_block; ++l) h = resnet_unit(h, p + "resnets." + std::to_string(l) + ".");
      if (i + 1 < n) h = upsample(h, p + "upsamplers.0.conv", 0, 0);
    }
    return head(h, "decoder.");
  }

  VaeConfig cfg_;
};

}  // namespace

ParamSpecs autoencoder_kl_param_specs(const nlohmann::json& config) { return VaeConfig::read(config).specs(); }

std::shared_ptr<Model> create_autoencoder_kl(Context& ctx, const nlohmann::json& config, const ModelOptions& options) {
  return std::make_shared<AutoencoderKLModel>(ctx, VaeConfig::read(config), options);
}

}  // namespace flame::models

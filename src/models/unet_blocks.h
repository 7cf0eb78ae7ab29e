// The convolutional building blocks diffusers' UNet2DConditionModel and AutoencoderKL share, with
// diffusers' parameter names and arithmetic (models/resnet.py, transformers/transformer_2d.py,
// attention.py, attention_processor.py):
//
//   ResnetBlock2D          norm1 -> silu -> conv1 (+ time_emb_proj(silu(temb))) -> norm2 -> silu ->
//                          conv2, plus the input (through the 1x1 conv_shortcut when widths differ),
//                          divided by output_scale_factor
//   Transformer2DModel     GroupNorm (eps 1e-6) -> proj_in (Linear, or the 1x1 Conv2d, which is the
//                          same map of each position's channels) -> BasicTransformerBlocks -> proj_out
//                          -> + input
//   BasicTransformerBlock  x += attn1(norm1(x)); x += attn2(norm2(x), context); x += ff(norm3(x)),
//                          LayerNorms eps 1e-5, to_q / to_k / to_v without bias, GEGLU feed-forward
//   Attention over positions (the VAE's mid block): group_norm -> to_q / to_k / to_v (with bias),
//                          one head -> to_out.0 -> + input
//   Downsample2D / Upsample2D  conv 3x3 stride 2 (VAE: padded right / bottom by one first);
//                          nearest x2 (or to a given size) then conv 3x3
//
// Parameters are declared first as ParamSpecs (names and shapes, no memory: the CPU tests compare
// them with the key tables), then allocated in that order by ConvNetModel::register_params, the base
// of both models. Checkpointed units (resnets, transformer blocks, the VAE attention) run through
// ConvNetModel::run_unit, which numbers them in execution order for the checkpoint policy.
#pragma once
#include <functional>
#include <string>
#include <vector>
#include "models/model.h"

namespace flame::models {

struct ParamSpec {
  std::string name;
  Shape shape;
};
using ParamSpecs = std::vector<ParamSpec>;

// ---- parameter declarations (diffusers' registration order) ----
void add_weight_bias_specs(ParamSpecs& s, const std::string& prefix, const Shape& weight);  // prefix.weight, prefix.bias
void add_conv_specs(ParamSpecs& s, const std::string& prefix, int64_t out, int64_t in, int64_t kernel);
// temb_channels 0: no time_emb_proj (the VAE's resnets).
void add_resnet_specs(ParamSpecs& s, const std::string& prefix, int64_t in, int64_t out, int64_t temb_channels);
void add_transformer2d_specs(ParamSpecs& s, const std::string& prefix, int64_t channels, int64_t depth,
                             int64_t cross_attention_dim, bool linear_projection);
void add_spatial_attention_specs(ParamSpecs& s, const std::string& prefix, int64_t channels);

// A Model made of the blocks above.
class ConvNetModel : public Model {
 public:
  using Model::Model;

 protected:
  void register_params(const ParamSpecs& specs);

  // Restarts the checkpoint numbering (call at the start of run()).
  void begin_units() { unit_index_ = 0; }
  // Runs unit(x, extra) as the next checkpointable block; extra (the time embedding or the text
  // context) may be null. unit must capture by value (see Model::run_block).
  Tensor run_unit(const std::function<Tensor(const Tensor&, const Tensor&)>& unit, const Tensor& x, const Tensor& extra);

  Tensor conv(const Tensor& x, const std::string& prefix, int64_t stride, int64_t padding) const;
  Tensor group_norm(const Tensor& x, const std::string& prefix, int64_t groups, double eps) const;
  Tensor linear(const Tensor& x, const std::string& prefix, bool bias) const;

  struct ResnetArgs {
    int64_t groups = 32;
    double eps = 1e-6;
    double output_scale_factor = 1.0;
  };
  // temb_act: silu(temb) [B, temb_channels], or null.
  Tensor resnet(const Tensor& x, const Tensor& temb_act, const std::string& prefix, const ResnetArgs& a) const;

  struct TransformerArgs {
    int64_t heads = 1;
    int64_t depth = 1;
    int64_t groups = 32;
    bool linear_projection = true;
  };
  // x [B, C, H, W], context [B, T, cross_attention_dim]; each BasicTransformerBlock is a unit.
  // context_bias: null, or an additive [B, 1, 1, T] bias of the cross-attention scores.
  Tensor transformer2d(const Tensor& x, const Tensor& context, const std::string& prefix, const TransformerArgs& a,
                       const Tensor& context_bias);
  // One BasicTransformerBlock on tokens [B, HW, C].
  Tensor transformer_block(const Tensor& x, const Tensor& context, const std::string& prefix, int64_t heads,
                           const Tensor& context_bias) const;
  // The VAE mid block's single-head attention over the positions of x [B, C, H, W].
  Tensor spatial_attention(const Tensor& x, const std::string& prefix, int64_t groups, double eps) const;

  // Downsample2D: padding 1 (the UNet), or 0: padded by one on the right and bottom first (the VAE).
  Tensor downsample(const Tensor& x, const std::string& prefix, int64_t padding) const;
  // Upsample2D: nearest to out_h x out_w (0: twice the size), then its 3x3 conv.
  Tensor upsample(const Tensor& x, const std::string& prefix, int64_t out_h, int64_t out_w) const;

 private:
  // prefix.weight of a Linear, or of a 1x1 Conv2d viewed as one.
  Tensor linear_weight(const std::string& prefix) const;
  Tensor attention(const Tensor& x, const Tensor& context, const std::string& prefix, int64_t heads, bool qkv_bias,
                   const Tensor& bias) const;

  int64_t unit_index_ = 0;
};

// Checks that a config value lies in a set: absent, null, or equal to one of allowed (JSON
// equality); else FLAME_ERROR_INVALID_ARGUMENT naming the key and what is supported.
void require_config_value(const nlohmann::json& cfg, const char* key, const std::vector<nlohmann::json>& allowed,
                          const char* supported);
// An int or a list of ints of length n (an int repeats); FLAME_ERROR_INVALID_ARGUMENT otherwise.
std::vector<int64_t> config_ints_per_block(const nlohmann::json& cfg, const char* key, int64_t fallback, size_t n);

// The parameters (names, shapes, order) create_model gives these classes for config, without
// allocating them (for the CPU tests against the key tables). Config errors as create_model's.
ParamSpecs unet2d_condition_param_specs(const nlohmann::json& config);  // unet2d_condition.cpp
ParamSpecs autoencoder_kl_param_specs(const nlohmann::json& config);    // autoencoder_kl.cpp

}  // namespace flame::models

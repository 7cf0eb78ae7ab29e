// FluxTransformer2DModel as diffusers defines it (transformer_flux.py; Flux.1-dev with
// guidance_embeds, Flux.1-schnell without), with diffusers' parameter names, unfused (to_q / to_k /
// to_v, proj_mlp; loading Black Forest Labs' fused files splits them through flux_keys.h's table):
//
//   x = x_embedder(hidden_states); c = context_embedder(encoder_hidden_states)
//   temb = timestep_embedder(sinusoid(1000 t)) [+ guidance_embedder(sinusoid(1000 g))]
//          + text_embedder(pooled_projections)
//   (cos, sin) = 3-axis RoPE of cat(txt_ids, img_ids): axis a rotates its axes_dims_rope[a] channels
//                of each head by position ids[:, a] at frequencies theta^(-2j / d_a), pairs interleaved
//   num_layers double-stream blocks: each stream adaLN-zero modulated, joint attention over
//     [text; image] with QK RMS norms and RoPE, separate output projections and MLPs
//   num_single_layers single-stream blocks over [text; image]: parallel attention and MLP, one proj_out
//   sample = proj_out(AdaLayerNormContinuous(x, temb))
//
// Every block runs through run_block (doubles 0..num_layers-1, then singles) so checkpointing applies.
// Blocks take and return (image, text, temb, cos, sin): the conditioning passes through unchanged,
// as run_block wants as many outputs as inputs and the gradients of temb / cos / sin must reach
// their producers through the block's inputs.
#include <cmath>
#include <string>
#include <vector>
#include "core/error.h"
#include "core/shape.h"
#include "models/mmdit_blocks.h"
#include "models/model_blocks.h"
#include "models/model_registry.h"
#include "ops/attention.h"
#include "ops/nn.h"

namespace flame::models {

namespace {

struct FluxTransformerConfig {
  int64_t patch_size, in_channels, out_channels, num_layers, num_single_layers, attention_head_dim,
      num_attention_heads, joint_attention_dim, pooled_projection_dim;
  bool guidance_embeds;
  std::vector<int64_t> axes_dims_rope;

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }

  static FluxTransformerConfig read(const nlohmann::json& c) {
    FluxTransformerConfig k;
    k.patch_size = config_int(c, "patch_size", 1);
    k.in_channels = config_int(c, "in_channels", 64);
    k.out_channels = config_int(c, "out_channels", k.in_channels);
    k.num_layers = config_int(c, "num_layers", 19);
    k.num_single_layers = config_int(c, "num_single_layers", 38);
    k.attention_head_dim = config_int(c, "attention_head_dim", 128);
    k.num_attention_heads = config_int(c, "num_attention_heads", 24);
    k.joint_attention_dim = config_int(c, "joint_attention_dim", 4096);
    k.pooled_projection_dim = config_int(c, "pooled_projection_dim", 768);
    k.guidance_embeds = config_bool(c, "guidance_embeds", false);
    k.axes_dims_rope = config_ints(c, "axes_dims_rope", {16, 56, 56});
    auto positive = [](int64_t v, const char* key) {
      FLAME_CHECK(v > 0, FLAME_ERROR_INVALID_ARGUMENT, "config: \"", key, "\" must be positive, not ", v);
    };
    positive(k.patch_size, "patch_size");
    positive(k.in_channels, "in_channels");
    positive(k.out_channels, "out_channels");
    positive(k.attention_head_dim, "attention_head_dim");
    positive(k.num_attention_heads, "num_attention_heads");
    positive(k.joint_attention_dim, "joint_attention_dim");
    positive(k.pooled_projection_dim, "pooled_projection_dim");
    FLAME_CHECK(k.num_layers >= 0 && k.num_single_layers >= 0, FLAME_ERROR_INVALID_ARGUMENT,
                "config: \"num_layers\" and \"num_single_layers\" must not be negative");
    int64_t rope_dims = 0;
    for (int64_t d : k.axes_dims_rope) {
      FLAME_CHECK(d > 0 && d % 2 == 0, FLAME_ERROR_INVALID_ARGUMENT, "config: \"axes_dims_rope\" entries must be even and positive, not ", d);
      rope_dims += d;
    }
    FLAME_CHECK(!k.axes_dims_rope.empty() && rope_dims == k.attention_head_dim, FLAME_ERROR_INVALID_ARGUMENT,
                "config: \"axes_dims_rope\" must add up to attention_head_dim ", k.attention_head_dim, ", not ", rope_dims);
    return k;
  }

  nlohmann::json to_json() const {
    return {{"_class_name", "FluxTransformer2DModel"},
            {"patch_size", patch_size},
            {"in_channels", in_channels},
            {"out_channels", out_channels},
            {"num_layers", num_layers},
            {"num_single_layers", num_single_layers},
            {"attention_head_dim", attention_head_dim},
            {"num_attention_heads", num_attention_heads},
            {"joint_attention_dim", joint_attention_dim},
            {"pooled_projection_dim", pooled_projection_dim},
            {"guidance_embeds", guidance_embeds},
            {"axes_dims_rope", axes_dims_rope}};
  }
};

constexpr double kRopeTheta = 10000;
constexpr double kNormEps = 1e-6;  // the blocks' LayerNorms, QK RMS norms and norm_out

class FluxTransformer : public MMDiTModel {
 public:
  FluxTransformer(Context& ctx, const FluxTransformerConfig& cfg, const ModelOptions& options)
      : MMDiTModel(ctx, "FluxTransformer2DModel", cfg.to_json(), options), cfg_(cfg) {
    const int64_t D = cfg.inner_dim(), hd = cfg.attention_head_dim, mlp = 4 * D;
    // diffusers' registration order: time_text_embed, context_embedder, x_embedder, the blocks,
    // norm_out, proj_out.
    add_two_layer_mlp("time_text_embed.timestep_embedder", D, 256);
    if (cfg.guidance_embeds) add_two_layer_mlp("time_text_embed.guidance_embedder", D, 256);
    add_two_layer_mlp("time_text_embed.text_embedder", D, cfg.pooled_projection_dim);
    add_linear("context_embedder", D, cfg.joint_attention_dim);
    add_linear("x_embedder", D, cfg.in_channels);
    for (int64_t i = 0; i < cfg.num_layers; ++i) {
      const std::string p = double_prefix(i);
      add_linear(p + "norm1.linear", 6 * D, D);
      add_linear(p + "norm1_context.linear", 6 * D, D);
      add_param(p + "attn.norm_q.weight", {hd});
      add_param(p + "attn.norm_k.weight", {hd});
      for (const char* proj : {"to_q", "to_k", "to_v", "to_out.0"}) add_linear(p + "attn." + proj, D, D);
      add_param(p + "attn.norm_added_q.weight", {hd});
      add_param(p + "attn.norm_added_k.weight", {hd});
      for (const char* proj : {"add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"}) add_linear(p + "attn." + proj, D, D);
      add_feed_forward(p + "ff", D, mlp);
      add_feed_forward(p + "ff_context", D, mlp);
    }
    for (int64_t i = 0; i < cfg.num_single_layers; ++i) {
      const std::string p = single_prefix(i);
      add_linear(p + "norm.linear", 3 * D, D);
      add_linear(p + "proj_mlp", mlp, D);
      add_linear(p + "proj_out", D, D + mlp);
      add_param(p + "attn.norm_q.weight", {hd});
      add_param(p + "attn.norm_k.weight", {hd});
      for (const char* proj : {"to_q", "to_k", "to_v"}) add_linear(p + "attn." + proj, D, D);
    }
    add_linear("norm_out.linear", 2 * D, D);
    add_linear("proj_out", cfg.patch_size * cfg.patch_size * cfg.out_channels, D);
  }

  std::vector<std::string> required_inputs() const override {
    std::vector<std::string> r{"hidden_states", "encoder_hidden_states", "pooled_projections", "timestep", "img_ids", "txt_ids"};
    if (cfg_.guidance_embeds) r.push_back("guidance");
    return r;
  }
  std::vector<std::string> optional_inputs() const override { return {}; }

 protected:
  NamedTensors run(const NamedTensors& inputs) override {
    const Tensor& hs_in = input(inputs, "hidden_states");
    const Tensor& enc_in = input(inputs, "encoder_hidden_states");
    const Tensor& pooled_in = input(inputs, "pooled_projections");
    check_float3(hs_in, "hidden_states", cfg_.in_channels);
    check_float3(enc_in, "encoder_hidden_states", cfg_.joint_attention_dim);
    const int64_t B = hs_in->shape[0], L = hs_in->shape[1], T = enc_in->shape[1];
    FLAME_CHECK(enc_in->shape[0] == B, FLAME_ERROR_INVALID_ARGUMENT, "encoder_hidden_states has batch ", enc_in->shape[0],
                ", hidden_states ", B);
    FLAME_CHECK(is_floating(pooled_in->dtype) && pooled_in->ndim() == 2 && pooled_in->shape[0] == B &&
                    pooled_in->shape[1] == cfg_.pooled_projection_dim,
                FLAME_ERROR_INVALID_ARGUMENT, "pooled_projections must be float [", B, ", ", cfg_.pooled_projection_dim,
                "], not ", shape_str(pooled_in->shape));
    const Tensor img_ids = position_ids(inputs, "img_ids", L), txt_ids = position_ids(inputs, "txt_ids", T);

    Tensor hs = lin(to_compute(hs_in), "x_embedder");
    // diffusers: timestep.to(hidden_states.dtype) * 1000 (and the same for guidance).
    Tensor temb = timestep_mlp(ops::mul_scalar(as_compute_float(per_sample(inputs, "timestep", B)), 1000),
                               "time_text_embed.timestep_embedder");
    if (cfg_.guidance_embeds)
      temb = ops::add(temb, timestep_mlp(ops::mul_scalar(as_compute_float(per_sample(inputs, "guidance", B)), 1000),
                                         "time_text_embed.guidance_embedder"));
    temb = ops::add(temb, two_layer_mlp(to_compute(pooled_in), "time_text_embed.text_embedder"));
    Tensor enc = lin(to_compute(enc_in), "context_embedder");
    const auto [cos, sin] = rope_tables(ops::cat({txt_ids, img_ids}, 0));

    std::vector<Tensor> state{hs, enc, temb, cos, sin};
    for (int64_t i = 0; i < cfg_.num_layers; ++i) {
      auto block = [this, i](const std::vector<Tensor>& x) { return double_block(i, x); };
      state = run_block(i, block, state);
    }
    for (int64_t i = 0; i < cfg_.num_single_layers; ++i) {
      auto block = [this, i](const std::vector<Tensor>& x) { return single_block(i, x); };
      state = run_block(cfg_.num_layers + i, block, state);
    }
    Tensor out = lin(ada_norm_continuous(state[0], temb, "norm_out.linear", kNormEps), "proj_out");
    return {{"sample", out}};
  }

 private:
  static std::string double_prefix(int64_t i) { return "transformer_blocks." + std::to_string(i) + "."; }
  static std::string single_prefix(int64_t i) { return "single_transformer_blocks." + std::to_string(i) + "."; }

  static void check_float3(const Tensor& t, const char* name, int64_t channels) {
    FLAME_CHECK(is_floating(t->dtype) && t->ndim() == 3 && t->shape[2] == channels && t->shape[1] > 0,
                FLAME_ERROR_INVALID_ARGUMENT, "input \"", name, "\" must be float [batch, tokens, ", channels, "], not ",
                shape_str(t->shape), " ", dtype_name(t->dtype));
  }

  // ids [n, axes] (or diffusers' deprecated [batch, n, axes], of which the first is used) as f32,
  // as FluxPosEmbed's ids.float().
  Tensor position_ids(const NamedTensors& inputs, const char* name, int64_t n) const {
    Tensor t = input(inputs, name);
    if (t->ndim() == 3) t = ops::select(t, 0, 0);
    const int64_t axes = static_cast<int64_t>(cfg_.axes_dims_rope.size());
    FLAME_CHECK(t->ndim() == 2 && t->shape[0] == n && t->shape[1] == axes && t->dtype != FLAME_DTYPE_BOOL,
                FLAME_ERROR_INVALID_ARGUMENT, "input \"", name, "\" must be [", n, ", ", axes,
                "] position ids (one row per token, one column per axes_dims_rope entry), not ", shape_str(t->shape));
    return t->dtype == FLAME_DTYPE_F32 ? t : ops::to_dtype(t, FLAME_DTYPE_F32);
  }

  // FluxPosEmbed(theta=10000, axes_dims_rope) of ids [S, axes] f32: cos, sin [S, head_dim] f32,
  // each frequency repeated for the two channels of its pair.
  std::pair<Tensor, Tensor> rope_tables(const Tensor& ids) const {
    std::vector<Tensor> angles;
    for (size_t a = 0; a < cfg_.axes_dims_rope.size(); ++a) {
      const int64_t d = cfg_.axes_dims_rope[a];
      std::vector<float> freqs(static_cast<size_t>(d));
      for (int64_t j = 0; j < d / 2; ++j) {
        const float f = static_cast<float>(1.0 / std::pow(kRopeTheta, static_cast<double>(2 * j) / static_cast<double>(d)));
        freqs[static_cast<size_t>(2 * j)] = freqs[static_cast<size_t>(2 * j + 1)] = f;
      }
      const Tensor f = ops::from_host(ctx(), freqs.data(), freqs.size() * sizeof(float), {1, d}, FLAME_DTYPE_F32);
      angles.push_back(ops::mul(ops::narrow(ids, 1, static_cast<int64_t>(a), 1), f));
    }
    const Tensor angle = ops::cat(angles, 1);
    return {ops::unary(OpId::Cos, angle), ops::unary(OpId::Sin, angle)};
  }

  // Joint attention of q / k / v [B, H, S, D] (already concatenated) with RoPE: [B, S, H * D].
  Tensor rotary_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cos, const Tensor& sin) const {
    return merge_heads(ops::scaled_dot_product_attention(apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v,
                                                         nullptr, ops::AttentionOptions{}));
  }

  // FluxTransformerBlock: x = {image, text, temb, cos, sin}.
  std::vector<Tensor> double_block(int64_t i, const std::vector<Tensor>& x) const {
    const std::string p = double_prefix(i);
    const int64_t H = cfg_.num_attention_heads;
    const Tensor &hs = x[0], &enc = x[1], &temb = x[2], &cos = x[3], &sin = x[4];
    const int64_t T = enc->shape[1], L = hs->shape[1];
    // shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp (AdaLayerNormZero).
    const std::vector<Tensor> m = modulation(temb, p + "norm1.linear", 6);
    const std::vector<Tensor> c = modulation(temb, p + "norm1_context.linear", 6);
    const Tensor nh = modulate(plain_layer_norm(hs, kNormEps), m[0], m[1]);
    const Tensor ne = modulate(plain_layer_norm(enc, kNormEps), c[0], c[1]);
    const Tensor q = ops::cat({heads(ne, p + "attn.add_q_proj", p + "attn.norm_added_q", H, kNormEps),
                               heads(nh, p + "attn.to_q", p + "attn.norm_q", H, kNormEps)}, 2);
    const Tensor k = ops::cat({heads(ne, p + "attn.add_k_proj", p + "attn.norm_added_k", H, kNormEps),
                               heads(nh, p + "attn.to_k", p + "attn.norm_k", H, kNormEps)}, 2);
    const Tensor v = ops::cat({heads(ne, p + "attn.add_v_proj", "", H, kNormEps), heads(nh, p + "attn.to_v", "", H, kNormEps)}, 2);
    const std::vector<Tensor> a = ops::split_sizes(rotary_attention(q, k, v, cos, sin), {T, L}, 1);

    Tensor h = ops::add(hs, gated(lin(a[1], p + "attn.to_out.0"), m[2]));
    h = ops::add(h, gated(feed_forward(modulate(plain_layer_norm(h, kNormEps), m[3], m[4]), p + "ff"), m[5]));
    Tensor e = ops::add(enc, gated(lin(a[0], p + "attn.to_add_out"), c[2]));
    e = ops::add(e, gated(feed_forward(modulate(plain_layer_norm(e, kNormEps), c[3], c[4]), p + "ff_context"), c[5]));
    return {h, e, temb, cos, sin};
  }

  // FluxSingleTransformerBlock over [text; image]: x = {image, text, temb, cos, sin}.
  std::vector<Tensor> single_block(int64_t i, const std::vector<Tensor>& x) const {
    const std::string p = single_prefix(i);
    const int64_t H = cfg_.num_attention_heads;
    const Tensor &temb = x[2], &cos = x[3], &sin = x[4];
    const int64_t T = x[1]->shape[1], L = x[0]->shape[1];
    const Tensor joint = ops::cat({x[1], x[0]}, 1);
    const std::vector<Tensor> m = modulation(temb, p + "norm.linear", 3);  // shift, scale, gate
    const Tensor n = modulate(plain_layer_norm(joint, kNormEps), m[0], m[1]);
    const Tensor mlp = lin(n, p + "proj_mlp", ops::Activation::GeluTanh);
    const Tensor a = rotary_attention(heads(n, p + "attn.to_q", p + "attn.norm_q", H, kNormEps),
                                      heads(n, p + "attn.to_k", p + "attn.norm_k", H, kNormEps),
                                      heads(n, p + "attn.to_v", "", H, kNormEps), cos, sin);
    const Tensor out = ops::add(joint, gated(lin(ops::cat({a, mlp}, 2), p + "proj_out"), m[2]));
    const std::vector<Tensor> parts = ops::split_sizes(out, {T, L}, 1);
    return {parts[1], parts[0], temb, cos, sin};
  }

  FluxTransformerConfig cfg_;
};

}  // namespace

std::shared_ptr<Model> create_flux_transformer(Context& ctx, const nlohmann::json& config, const ModelOptions& options) {
  return std::make_shared<FluxTransformer>(ctx, FluxTransformerConfig::read(config), options);
}

}  // namespace flame::models

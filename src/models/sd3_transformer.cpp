// SD3Transformer2DModel as diffusers defines it (transformer_sd3.py, JointTransformerBlock of
// attention.py): the MMDiT of Stable Diffusion 3 and, with qk_norm "rms_norm" and
// dual_attention_layers, of SD3.5 (MMDiT-X), with diffusers' parameter names:
//
//   x = PatchEmbed(hidden_states): Conv2d(patch, stride patch), flattened to tokens, plus the
//       pos_embed_max_size^2 sin-cos table (a buffer, `pos_embed.pos_embed`) cropped to the centre
//   temb = timestep_embedder(sinusoid(timestep)) + text_embedder(pooled_projections)
//   c = context_embedder(encoder_hidden_states)
//   per block: adaLN-zero modulated image and text streams, joint attention over [image; text]
//     (optionally QK RMS-normed); in dual-attention layers (SD35AdaLayerNormZeroX) a second,
//     image-only attention (attn2) on its own modulation; gated MLPs. The last block is
//     context_pre_only: the text stream is only read (AdaLayerNormContinuous, no to_add_out / MLP).
//   sample = unpatchify(proj_out(AdaLayerNormContinuous(x, temb)))   [B, out_channels, H, W]
//
// `pos_embed.pos_embed` is a parameter of the store (it is in the state_dict) that does not require
// grad, as it is a buffer in diffusers; initialize() computes it as get_2d_sincos_pos_embed does.
// Blocks run through run_block (index = layer) taking and returning (image, text, temb).
#include <cmath>
#include <string>
#include <vector>
#include "tensor/autograd_graph.h"
#include "core/error.h"
#include "core/shape.h"
#include "models/mmdit_blocks.h"
#include "models/model_blocks.h"
#include "models/model_registry.h"
#include "ops/attention.h"
#include "ops/conv.h"
#include "ops/nn.h"

namespace flame::models {

namespace {

struct SD3Config {
  int64_t sample_size, patch_size, in_channels, num_layers, attention_head_dim, num_attention_heads,
      joint_attention_dim, caption_projection_dim, pooled_projection_dim, out_channels, pos_embed_max_size;
  std::vector<int64_t> dual_attention_layers;
  std::string qk_norm;  // "" (none) or "rms_norm"

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  bool dual(int64_t layer) const {
    for (int64_t l : dual_attention_layers)
      if (l == layer) return true;
    return false;
  }

  static SD3Config read(const nlohmann::json& c) {
    SD3Config k;
    k.sample_size = config_int(c, "sample_size", 128);
    k.patch_size = config_int(c, "patch_size", 2);
    k.in_channels = config_int(c, "in_channels", 16);
    k.num_layers = config_int(c, "num_layers", 18);
    k.attention_head_dim = config_int(c, "attention_head_dim", 64);
    k.num_attention_heads = config_int(c, "num_attention_heads", 18);
    k.joint_attention_dim = config_int(c, "joint_attention_dim", 4096);
    k.caption_projection_dim = config_int(c, "caption_projection_dim", 1152);
    k.pooled_projection_dim = config_int(c, "pooled_projection_dim", 2048);
    k.out_channels = config_int(c, "out_channels", 16);
    k.pos_embed_max_size = config_int(c, "pos_embed_max_size", 96);
    k.dual_attention_layers = config_ints(c, "dual_attention_layers", {});
    k.qk_norm = config_string(c, "qk_norm", "");
    auto positive = [](int64_t v, const char* key) {
      FLAME_CHECK(v > 0, FLAME_ERROR_INVALID_ARGUMENT, "config: \"", key, "\" must be positive, not ", v);
    };
    positive(k.sample_size, "sample_size");
    positive(k.patch_size, "patch_size");
    positive(k.in_channels, "in_channels");
    positive(k.num_layers, "num_layers");
    positive(k.attention_head_dim, "attention_head_dim");
    positive(k.num_attention_heads, "num_attention_heads");
    positive(k.joint_attention_dim, "joint_attention_dim");
    positive(k.pooled_projection_dim, "pooled_projection_dim");
    positive(k.out_channels, "out_channels");
    positive(k.pos_embed_max_size, "pos_embed_max_size");
    FLAME_CHECK(k.caption_projection_dim == k.inner_dim(), FLAME_ERROR_INVALID_ARGUMENT,
                "config: \"caption_projection_dim\" ", k.caption_projection_dim,
                " must equal num_attention_heads * attention_head_dim = ", k.inner_dim(),
                " (the joint blocks take the projected captions at the transformer's width)");
    FLAME_CHECK(k.inner_dim() % 4 == 0, FLAME_ERROR_INVALID_ARGUMENT,
                "config: num_attention_heads * attention_head_dim must be a multiple of 4 (2-D sin-cos embedding)");
    FLAME_CHECK(k.qk_norm.empty() || k.qk_norm == "rms_norm", FLAME_ERROR_INVALID_ARGUMENT, "config: qk_norm \"",
                k.qk_norm, "\" is not supported (null or \"rms_norm\", as SD3 and SD3.5 use)");
    for (int64_t l : k.dual_attention_layers)
      FLAME_CHECK(l >= 0 && l < k.num_layers, FLAME_ERROR_INVALID_ARGUMENT, "config: \"dual_attention_layers\" entry ", l,
                  " is not a layer (0..", k.num_layers - 1, ")");
    return k;
  }

  nlohmann::json to_json() const {
    return {{"_class_name", "SD3Transformer2DModel"},
            {"sample_size", sample_size},
            {"patch_size", patch_size},
            {"in_channels", in_channels},
            {"num_layers", num_layers},
            {"attention_head_dim", attention_head_dim},
            {"num_attention_heads", num_attention_heads},
            {"joint_attention_dim", joint_attention_dim},
            {"caption_projection_dim", caption_projection_dim},
            {"pooled_projection_dim", pooled_projection_dim},
            {"out_channels", out_channels},
            {"pos_embed_max_size", pos_embed_max_size},
            {"dual_attention_layers", dual_attention_layers},
            {"qk_norm", qk_norm.empty() ? nlohmann::json(nullptr) : nlohmann::json(qk_norm)}};
  }
};

constexpr double kNormEps = 1e-6;  // every LayerNorm / RMSNorm of the model

class SD3Transformer : public MMDiTModel {
 public:
  SD3Transformer(Context& ctx, const SD3Config& cfg, const ModelOptions& options)
      : MMDiTModel(ctx, "SD3Transformer2DModel", cfg.to_json(), options), cfg_(cfg) {
    const int64_t D = cfg.inner_dim(), M = cfg.pos_embed_max_size, P = cfg.patch_size;
    Tensor table = add_param("pos_embed.pos_embed", {1, M * M, D});
    autograd_meta(*table).requires_grad = false;  // a buffer in diffusers
    add_param("pos_embed.proj.weight", {D, cfg.in_channels, P, P});
    add_param("pos_embed.proj.bias", {D});
    add_two_layer_mlp("time_text_embed.timestep_embedder", D, 256);
    add_two_layer_mlp("time_text_embed.text_embedder", D, cfg.pooled_projection_dim);
    add_linear("context_embedder", cfg.caption_projection_dim, cfg.joint_attention_dim);
    for (int64_t i = 0; i < cfg.num_layers; ++i) add_block(i);
    add_linear("norm_out.linear", 2 * D, D);
    add_linear("proj_out", P * P * cfg.out_channels, D);
  }

  std::vector<std::string> required_inputs() const override {
    return {"hidden_states", "encoder_hidden_states", "pooled_projections", "timestep"};
  }
  std::vector<std::string> optional_inputs() const override { return {}; }

  void initialize() override {
    Model::initialize();
    const std::vector<float> table = sincos_table();
    ops::copy_into(params().get("pos_embed.pos_embed"),
                   ops::from_host(ctx(), table.data(), table.size() * sizeof(float),
                                  {1, cfg_.pos_embed_max_size * cfg_.pos_embed_max_size, cfg_.inner_dim()}, FLAME_DTYPE_F32));
  }

 protected:
  NamedTensors run(const NamedTensors& inputs) override {
    const Tensor& x_in = input(inputs, "hidden_states");
    const Tensor& enc_in = input(inputs, "encoder_hidden_states");
    const Tensor& pooled_in = input(inputs, "pooled_projections");
    const int64_t P = cfg_.patch_size, M = cfg_.pos_embed_max_size;
    FLAME_CHECK(is_floating(x_in->dtype) && x_in->ndim() == 4 && x_in->shape[1] == cfg_.in_channels,
                FLAME_ERROR_INVALID_ARGUMENT, "input \"hidden_states\" must be float [batch, ", cfg_.in_channels,
                ", height, width], not ", shape_str(x_in->shape));
    const int64_t B = x_in->shape[0], h = x_in->shape[2] / P, w = x_in->shape[3] / P;
    FLAME_CHECK(x_in->shape[2] % P == 0 && x_in->shape[3] % P == 0 && h > 0 && w > 0, FLAME_ERROR_INVALID_ARGUMENT,
                "hidden_states' height and width (", x_in->shape[2], ", ", x_in->shape[3],
                ") must be positive multiples of patch_size ", P);
    FLAME_CHECK(h <= M && w <= M, FLAME_ERROR_INVALID_ARGUMENT, "hidden_states is ", h, " x ", w,
                " patches; pos_embed_max_size allows at most ", M, " x ", M);
    FLAME_CHECK(is_floating(enc_in->dtype) && enc_in->ndim() == 3 && enc_in->shape[0] == B &&
                    enc_in->shape[2] == cfg_.joint_attention_dim && enc_in->shape[1] > 0,
                FLAME_ERROR_INVALID_ARGUMENT, "input \"encoder_hidden_states\" must be float [", B, ", tokens, ",
                cfg_.joint_attention_dim, "], not ", shape_str(enc_in->shape));
    FLAME_CHECK(is_floating(pooled_in->dtype) && pooled_in->ndim() == 2 && pooled_in->shape[0] == B &&
                    pooled_in->shape[1] == cfg_.pooled_projection_dim,
                FLAME_ERROR_INVALID_ARGUMENT, "input \"pooled_projections\" must be float [", B, ", ",
                cfg_.pooled_projection_dim, "], not ", shape_str(pooled_in->shape));

    Tensor hs = ops::add(patch_embed(to_compute(x_in)), cropped_pos_embed(h, w));
    const Tensor temb = ops::add(timestep_mlp(as_compute_float(per_sample(inputs, "timestep", B)),
                                              "time_text_embed.timestep_embedder"),
                                 two_layer_mlp(to_compute(pooled_in), "time_text_embed.text_embedder"));
    const Tensor enc = lin(to_compute(enc_in), "context_embedder");

    std::vector<Tensor> state{hs, enc, temb};
    for (int64_t i = 0; i < cfg_.num_layers; ++i) {
      auto block = [this, i](const std::vector<Tensor>& x) { return joint_block(i, x); };
      state = run_block(i, block, state);
    }
    const Tensor y = lin(ada_norm_continuous(state[0], temb, "norm_out.linear", kNormEps), "proj_out");
    // unpatchify: [B, h * w, P * P * C] -> [B, h, w, P, P, C] -> "nhwpqc->nchpwq" -> [B, C, h P, w P].
    const int64_t C = cfg_.out_channels;
    const Tensor patches = ops::permute(ops::reshape(y, {B, h, w, P, P, C}), {0, 5, 1, 3, 2, 4});
    return {{"sample", ops::reshape(patches, {B, C, h * P, w * P})}};
  }

 private:
  static std::string block_prefix(int64_t i) { return "transformer_blocks." + std::to_string(i) + "."; }

  void add_attention(const std::string& a, bool joint, bool context_pre_only) {
    const int64_t D = cfg_.inner_dim(), hd = cfg_.attention_head_dim;
    const bool qk = !cfg_.qk_norm.empty();
    // diffusers' Attention registration order.
    if (qk) {
      add_param(a + "norm_q.weight", {hd});
      add_param(a + "norm_k.weight", {hd});
    }
    for (const char* proj : {"to_q", "to_k", "to_v"}) add_linear(a + proj, D, D);
    if (joint)
      for (const char* proj : {"add_k_proj", "add_v_proj", "add_q_proj"}) add_linear(a + proj, D, D);
    add_linear(a + "to_out.0", D, D);
    if (joint && !context_pre_only) add_linear(a + "to_add_out", D, D);
    if (joint && qk) {
      add_param(a + "norm_added_q.weight", {hd});
      add_param(a + "norm_added_k.weight", {hd});
    }
  }

  void add_block(int64_t i) {
    const std::string p = block_prefix(i);
    const int64_t D = cfg_.inner_dim();
    const bool pre_only = i == cfg_.num_layers - 1;
    add_linear(p + "norm1.linear", (cfg_.dual(i) ? 9 : 6) * D, D);
    add_linear(p + "norm1_context.linear", (pre_only ? 2 : 6) * D, D);
    add_attention(p + "attn.", true, pre_only);
    if (cfg_.dual(i)) add_attention(p + "attn2.", false, false);
    add_feed_forward(p + "ff", D, 4 * D);
    if (!pre_only) add_feed_forward(p + "ff_context", D, 4 * D);
  }

  // Conv2d(kernel = stride = patch) then flatten(2).transpose(1, 2): [B, h * w, D].
  Tensor patch_embed(const Tensor& x) const {
    ops::ConvArgs args;
    args.stride[0] = args.stride[1] = cfg_.patch_size;
    const Tensor y = ops::conv2d(x, param("pos_embed.proj.weight"), param("pos_embed.proj.bias"), args);
    const int64_t B = y->shape[0], D = y->shape[1];
    return ops::transpose(ops::reshape(y, {B, D, y->shape[2] * y->shape[3]}), 1, 2);
  }

  // PatchEmbed.cropped_pos_embed: the centre h x w window of the M x M table, [1, h * w, D].
  Tensor cropped_pos_embed(int64_t h, int64_t w) const {
    const int64_t M = cfg_.pos_embed_max_size, D = cfg_.inner_dim();
    const int64_t top = (M - h) / 2, left = (M - w) / 2;
    const Tensor grid = ops::reshape(param("pos_embed.pos_embed"), {1, M, M, D});
    return ops::reshape(ops::narrow(ops::narrow(grid, 1, top, h), 2, left, w), {1, h * w, D});
  }

  // get_2d_sincos_pos_embed(D, M, base_size = sample_size / patch_size, interpolation_scale = 1):
  // token (i, j) holds [sin, cos](grid_w[j] * omega), then [sin, cos](grid_h[i] * omega), with
  // omega_k = 10000^(-k / (D / 4)) and grid[j] = j / (M / base_size) computed in f32.
  std::vector<float> sincos_table() const {
    const int64_t M = cfg_.pos_embed_max_size, D = cfg_.inner_dim(), quarter = D / 4;
    const double base = static_cast<double>(cfg_.sample_size / cfg_.patch_size);
    const float step = static_cast<float>(static_cast<double>(M) / base);
    std::vector<float> out(static_cast<size_t>(M * M * D));
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < M; ++j) {
        float* row = &out[static_cast<size_t>((i * M + j) * D)];
        const double coords[2] = {static_cast<double>(static_cast<float>(j) / step),
                                  static_cast<double>(static_cast<float>(i) / step)};
        for (int half = 0; half < 2; ++half)
          for (int64_t k = 0; k < quarter; ++k) {
            const double omega = 1.0 / std::pow(10000.0, static_cast<double>(k) / static_cast<double>(quarter));
            const double angle = coords[half] * omega;
            row[half * 2 * quarter + k] = static_cast<float>(std::sin(angle));
            row[half * 2 * quarter + quarter + k] = static_cast<float>(std::cos(angle));
          }
      }
    return out;
  }

  // The attention projections of one stream as heads [B, H, T, D] (QK-normed when configured).
  Tensor stream_heads(const Tensor& x, const std::string& a, const char* proj, const char* norm) const {
    const std::string n = (norm && !cfg_.qk_norm.empty()) ? a + norm : std::string();
    return heads(x, a + proj, n, cfg_.num_attention_heads, kNormEps);
  }

  Tensor self_attention(const Tensor& x, const std::string& a) const {
    const Tensor o = ops::scaled_dot_product_attention(stream_heads(x, a, "to_q", "norm_q"), stream_heads(x, a, "to_k", "norm_k"),
                                                       stream_heads(x, a, "to_v", nullptr), nullptr, ops::AttentionOptions{});
    return lin(merge_heads(o), a + "to_out.0");
  }

  // JointTransformerBlock: x = {image, text, temb}.
  std::vector<Tensor> joint_block(int64_t i, const std::vector<Tensor>& x) const {
    const std::string p = block_prefix(i), a = p + "attn.";
    const bool pre_only = i == cfg_.num_layers - 1, dual = cfg_.dual(i);
    const Tensor &hs = x[0], &enc = x[1], &temb = x[2];
    const int64_t L = hs->shape[1], T = enc->shape[1];
    // shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp[, shift_msa2, scale_msa2, gate_msa2].
    const std::vector<Tensor> m = modulation(temb, p + "norm1.linear", dual ? 9 : 6);
    const Tensor normed = plain_layer_norm(hs, kNormEps);
    const Tensor nh = modulate(normed, m[0], m[1]);
    std::vector<Tensor> c;
    Tensor ne;
    if (pre_only) {
      ne = ada_norm_continuous(enc, temb, p + "norm1_context.linear", kNormEps);
    } else {
      c = modulation(temb, p + "norm1_context.linear", 6);
      ne = modulate(plain_layer_norm(enc, kNormEps), c[0], c[1]);
    }
    const Tensor q = ops::cat({stream_heads(nh, a, "to_q", "norm_q"), stream_heads(ne, a, "add_q_proj", "norm_added_q")}, 2);
    const Tensor k = ops::cat({stream_heads(nh, a, "to_k", "norm_k"), stream_heads(ne, a, "add_k_proj", "norm_added_k")}, 2);
    const Tensor v = ops::cat({stream_heads(nh, a, "to_v", nullptr), stream_heads(ne, a, "add_v_proj", nullptr)}, 2);
    const std::vector<Tensor> o =
        ops::split_sizes(merge_heads(ops::scaled_dot_product_attention(q, k, v, nullptr, ops::AttentionOptions{})), {L, T}, 1);

    Tensor h = ops::add(hs, gated(lin(o[0], a + "to_out.0"), m[2]));
    if (dual) h = ops::add(h, gated(self_attention(modulate(normed, m[6], m[7]), p + "attn2."), m[8]));
    h = ops::add(h, gated(feed_forward(modulate(plain_layer_norm(h, kNormEps), m[3], m[4]), p + "ff"), m[5]));
    if (pre_only) return {h, enc, temb};  // the text stream ends here; it passes through unused
    Tensor e = ops::add(enc, gated(lin(o[1], a + "to_add_out"), c[2]));
    e = ops::add(e, gated(feed_forward(modulate(plain_layer_norm(e, kNormEps), c[3], c[4]), p + "ff_context"), c[5]));
    return {h, e, temb};
  }

  SD3Config cfg_;
};

}  // namespace

std::shared_ptr<Model> create_sd3_transformer(Context& ctx, const nlohmann::json& config, const ModelOptions& options) {
  return std::make_shared<SD3Transformer>(ctx, SD3Config::read(config), options);
}

}  // namespace flame::models

// CLIP text encoders as transformers defines them: CLIPTextModel (CLIP-L, the text encoder of SD 1.5,
// SDXL and Flux) and CLIPTextModelWithProjection (OpenCLIP bigG as SDXL's second encoder, CLIP-L /
// bigG in SD3), with transformers' parameter names and forward semantics:
//
//   h = token_embedding[input_ids] + position_embedding[position_ids]
//   per layer: h += self_attn(layer_norm1(h)) (causal, plus attention_mask), h += mlp(layer_norm2(h))
//   last_hidden_state = final_layer_norm(h)
//   pooler_output = last_hidden_state at the end-of-text token (argmax of the ids when
//                   eos_token_id == 2, transformers' legacy rule, else the first eos_token_id)
//   text_embeds = text_projection(pooler_output)            (WithProjection only)
//
// Outputs: last_hidden_state, pooler_output, text_embeds (WithProjection), and hidden_states.<i> for
// i in 0..num_hidden_layers (transformers' output_hidden_states tuple: the embeddings, then every
// layer's output before the final norm; SDXL reads hidden_states.<L-1>, the penultimate layer).
#include <string>
#include "core/error.h"
#include "models/model_blocks.h"
#include "models/model_registry.h"
#include "ops/attention.h"
#include "ops/indexing.h"
#include "ops/nn.h"
#include "ops/ops.h"

namespace flame::models {

namespace {

struct ClipTextConfig {
  int64_t vocab_size, hidden_size, intermediate_size, projection_dim, num_hidden_layers, num_attention_heads;
  int64_t max_position_embeddings, eos_token_id;
  std::string hidden_act;
  double layer_norm_eps;

  static ClipTextConfig read(const nlohmann::json& c) {
    ClipTextConfig k;
    k.vocab_size = config_int(c, "vocab_size", 49408);
    k.hidden_size = config_int(c, "hidden_size", 512);
    k.intermediate_size = config_int(c, "intermediate_size", 2048);
    k.projection_dim = config_int(c, "projection_dim", 512);
    k.num_hidden_layers = config_int(c, "num_hidden_layers", 12);
    k.num_attention_heads = config_int(c, "num_attention_heads", 8);
    k.max_position_embeddings = config_int(c, "max_position_embeddings", 77);
    k.eos_token_id = config_int(c, "eos_token_id", 49407);
    k.hidden_act = config_string(c, "hidden_act", "quick_gelu");
    k.layer_norm_eps = config_real(c, "layer_norm_eps", 1e-5);
    auto positive = [](int64_t v, const char* key) {
      FLAME_CHECK(v > 0, FLAME_ERROR_INVALID_ARGUMENT, "config: \"", key, "\" must be positive, not ", v);
    };
    positive(k.vocab_size, "vocab_size");
    positive(k.hidden_size, "hidden_size");
    positive(k.intermediate_size, "intermediate_size");
    positive(k.projection_dim, "projection_dim");
    positive(k.num_hidden_layers, "num_hidden_layers");
    positive(k.num_attention_heads, "num_attention_heads");
    positive(k.max_position_embeddings, "max_position_embeddings");
    FLAME_CHECK(k.hidden_size % k.num_attention_heads == 0, FLAME_ERROR_INVALID_ARGUMENT,
                "config: hidden_size ", k.hidden_size, " is not a multiple of num_attention_heads ",
                k.num_attention_heads);
    FLAME_CHECK(known_activation(k.hidden_act), FLAME_ERROR_INVALID_ARGUMENT, "config: unknown hidden_act \"",
                k.hidden_act, "\"");
    FLAME_CHECK(k.layer_norm_eps > 0, FLAME_ERROR_INVALID_ARGUMENT, "config: layer_norm_eps must be positive");
    return k;
  }

  nlohmann::json to_json(bool with_projection) const {
    return {{"architectures", {with_projection ? "CLIPTextModelWithProjection" : "CLIPTextModel"}},
            {"model_type", "clip_text_model"},
            {"vocab_size", vocab_size},
            {"hidden_size", hidden_size},
            {"intermediate_size", intermediate_size},
            {"projection_dim", projection_dim},
            {"num_hidden_layers", num_hidden_layers},
            {"num_attention_heads", num_attention_heads},
            {"max_position_embeddings", max_position_embeddings},
            {"eos_token_id", eos_token_id},
            {"hidden_act", hidden_act},
            {"layer_norm_eps", layer_norm_eps}};
  }
};

class ClipTextModel : public Model {
 public:
  ClipTextModel(Context& ctx, const ClipTextConfig& cfg, bool with_projection, const ModelOptions& options)
      : Model(ctx, with_projection ? "CLIPTextModelWithProjection" : "CLIPTextModel", cfg.to_json(with_projection),
              options),
        cfg_(cfg),
        with_projection_(with_projection) {
    const int64_t D = cfg.hidden_size, F = cfg.intermediate_size;
    add_param("text_model.embeddings.token_embedding.weight", {cfg.vocab_size, D});
    add_param("text_model.embeddings.position_embedding.weight", {cfg.max_position_embeddings, D});
    for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
      const std::string p = layer_prefix(i);
      for (const char* proj : {"k_proj", "v_proj", "q_proj", "out_proj"}) {
        add_param(p + "self_attn." + proj + ".weight", {D, D});
        add_param(p + "self_attn." + proj + ".bias", {D});
      }
      add_param(p + "layer_norm1.weight", {D});
      add_param(p + "layer_norm1.bias", {D});
      add_param(p + "mlp.fc1.weight", {F, D});
      add_param(p + "mlp.fc1.bias", {F});
      add_param(p + "mlp.fc2.weight", {D, F});
      add_param(p + "mlp.fc2.bias", {D});
      add_param(p + "layer_norm2.weight", {D});
      add_param(p + "layer_norm2.bias", {D});
    }
    add_param("text_model.final_layer_norm.weight", {D});
    add_param("text_model.final_layer_norm.bias", {D});
    if (with_projection) add_param("text_projection.weight", {cfg.projection_dim, D});
  }

  std::vector<std::string> required_inputs() const override { return {"input_ids"}; }
  bool is_embedding(const std::string& module) const override {
    return module == "text_model.embeddings.token_embedding" || module == "text_model.embeddings.position_embedding";
  }
  std::vector<std::string> optional_inputs() const override { return {"attention_mask", "position_ids"}; }

 protected:
  NamedTensors run(const NamedTensors& inputs) override {
    const Tensor& ids = input(inputs, "input_ids");
    FLAME_CHECK(ids->ndim() == 2 && (ids->dtype == FLAME_DTYPE_I64 || ids->dtype == FLAME_DTYPE_I32),
                FLAME_ERROR_INVALID_ARGUMENT, "input_ids must be [batch, tokens] of i64 or i32");
    const int64_t B = ids->shape[0], T = ids->shape[1];
    FLAME_CHECK(T >= 1 && T <= cfg_.max_position_embeddings, FLAME_ERROR_INVALID_ARGUMENT, "input_ids has ", T,
                " tokens; the model takes 1 to ", cfg_.max_position_embeddings);
    Tensor positions;
    if (const Tensor* p = optional_input(inputs, "position_ids")) {
      positions = *p;
    } else {
      positions = ops::arange(ctx(), 0, static_cast<double>(T), 1, FLAME_DTYPE_I64);
    }
    Tensor h = ops::add(ops::embedding(param("text_model.embeddings.token_embedding.weight"), ids, ops::kNoIndex),
                        ops::embedding(param("text_model.embeddings.position_embedding.weight"), positions, ops::kNoIndex));
    const Tensor mask = attention_mask(inputs, B, T);

    NamedTensors out;
    out.emplace_back("hidden_states.0", h);
    for (int64_t i = 0; i < cfg_.num_hidden_layers; ++i) {
      auto block = [this, i, mask](const std::vector<Tensor>& x) { return std::vector<Tensor>{layer(i, x[0], mask)}; };
      h = run_block(i, block, {h})[0];
      out.emplace_back("hidden_states." + std::to_string(i + 1), h);
    }
    const int64_t D = cfg_.hidden_size;
    Tensor last = ops::layer_norm(h, {D}, param("text_model.final_layer_norm.weight"),
                                  param("text_model.final_layer_norm.bias"), cfg_.layer_norm_eps);
    Tensor pooled = pool(last, ids);
    NamedTensors result{{"last_hidden_state", last}, {"pooler_output", pooled}};
    if (with_projection_) result.emplace_back("text_embeds", adapted_linear(pooled, "text_projection", param("text_projection.weight"), nullptr));
    for (auto& o : out) result.push_back(std::move(o));
    return result;
  }

 private:
  static std::string layer_prefix(int64_t i) { return "text_model.encoder.layers." + std::to_string(i) + "."; }

  Tensor lin(const Tensor& x, const std::string& name) const {
    return adapted_linear(x, name, param(name + ".weight"), param(name + ".bias"));
  }

  // Null for the plain causal mask; else a bool [B, 1, T, T] mask: causal and the key kept by
  // attention_mask (nonzero = attend), as transformers combines its two additive masks.
  Tensor attention_mask(const NamedTensors& inputs, int64_t B, int64_t T) const {
    const Tensor* m = optional_input(inputs, "attention_mask");
    if (!m) return nullptr;
    FLAME_CHECK((*m)->ndim() == 2 && (*m)->shape[0] == B && (*m)->shape[1] == T, FLAME_ERROR_INVALID_ARGUMENT,
                "attention_mask must be [batch, tokens] like input_ids");
    Tensor keep = ops::binary(OpId::Ne, *m, ops::scalar(ctx(), 0, (*m)->dtype));
    Tensor ones = ops::full(ctx(), {T, T}, FLAME_DTYPE_F32, 1.0);
    Tensor causal = ops::binary(OpId::Ne, ops::triangle(ones, 0, false), ops::scalar(ctx(), 0, FLAME_DTYPE_F32));
    return ops::binary(OpId::LogicalAnd, ops::reshape(causal, {1, 1, T, T}), ops::reshape(keep, {B, 1, 1, T}));
  }

  Tensor layer(int64_t i, const Tensor& h, const Tensor& mask) const {
    const std::string p = layer_prefix(i);
    const int64_t D = cfg_.hidden_size, H = cfg_.num_attention_heads;
    Tensor x = ops::layer_norm(h, {D}, param(p + "layer_norm1.weight"), param(p + "layer_norm1.bias"), cfg_.layer_norm_eps);
    Tensor q = split_heads(lin(x, p + "self_attn.q_proj"), H);
    Tensor k = split_heads(lin(x, p + "self_attn.k_proj"), H);
    Tensor v = split_heads(lin(x, p + "self_attn.v_proj"), H);
    ops::AttentionOptions ao;
    ao.causal = !mask;
    Tensor a = merge_heads(ops::scaled_dot_product_attention(q, k, v, mask, ao));
    Tensor h1 = ops::add(h, lin(a, p + "self_attn.out_proj"));
    x = ops::layer_norm(h1, {D}, param(p + "layer_norm2.weight"), param(p + "layer_norm2.bias"), cfg_.layer_norm_eps);
    x = lin(activation(cfg_.hidden_act, lin(x, p + "mlp.fc1")), p + "mlp.fc2");
    return ops::add(h1, x);
  }

  // last [B, T, D] at each row's end-of-text position.
  Tensor pool(const Tensor& last, const Tensor& ids) const {
    const int64_t B = last->shape[0], D = last->shape[2];
    Tensor key = ids;
    if (cfg_.eos_token_id != 2)
      key = ops::to_dtype(ops::binary(OpId::Eq, ids, ops::scalar(ctx(), static_cast<double>(cfg_.eos_token_id), ids->dtype)),
                          FLAME_DTYPE_I32);
    Tensor at = ops::argmax(key, 1, false, false, true);  // [B], the first maximum
    Tensor index = ops::contiguous(ops::expand(ops::reshape(ops::to_dtype(at, FLAME_DTYPE_I64), {B, 1, 1}), {B, 1, D}));
    return ops::reshape(ops::gather(last, 1, index), {B, D});
  }

  ClipTextConfig cfg_;
  bool with_projection_;
};

}  // namespace

std::shared_ptr<Model> create_clip_text_model(Context& ctx, const nlohmann::json& config, const ModelOptions& options) {
  return std::make_shared<ClipTextModel>(ctx, ClipTextConfig::read(config), false, options);
}

std::shared_ptr<Model> create_clip_text_model_with_projection(Context& ctx, const nlohmann::json& config,
                                                              const ModelOptions& options) {
  return std::make_shared<ClipTextModel>(ctx, ClipTextConfig::read(config), true, options);
}

}  // namespace flame::models

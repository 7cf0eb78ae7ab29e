// T5EncoderModel as transformers defines it (T5-XXL v1.1: the text encoder of Flux and SD3), with
// its parameter names and forward semantics:
//
//   h = shared[input_ids]
//   per block: h += o(attention(q(n), k(n), v(n)) + position_bias)      n = rms(h) * layer_norm
//              h += wo(act(wi_0(n)) * wi_1(n))   (gated-*; "relu": wo(relu(wi(n))))  n = rms(h) * layer_norm
//   last_hidden_state = rms(h) * final_layer_norm
//
// T5 attention does not scale the scores. The position bias is block 0's relative_attention_bias
// embedding of the bucketed relative positions ([heads] per (query, key) pair), shared by every
// block, plus -inf-like entries (the dtype's lowest value) where attention_mask is 0. The buckets are
// integers that depend only on the sequence length: computed on the host, as transformers computes
// them (bidirectional: half the buckets for each sign, exact below max_exact, logarithmic above).
// The bias enters scaled_dot_product_attention as an additive mask, whose gradient reaches
// relative_attention_bias.
//
// The embedding is one parameter, "shared.weight" (transformers ties encoder.embed_tokens to it).
#include <cmath>
#include <limits>
#include <string>
#include <vector>
#include "core/error.h"
#include "models/model_blocks.h"
#include "models/model_registry.h"
#include "ops/attention.h"
#include "ops/indexing.h"
#include "ops/nn.h"
#include "ops/ops.h"

namespace flame::models {

namespace {

struct T5Config {
  int64_t vocab_size, d_model, d_kv, d_ff, num_layers, num_heads, relative_attention_num_buckets,
      relative_attention_max_distance;
  double layer_norm_epsilon;
  std::string feed_forward_proj;  // "gated-gelu", "relu", "gated-silu", ...
  std::string dense_act;          // the activation feed_forward_proj names
  bool gated = false;

  static T5Config read(const nlohmann::json& c) {
    T5Config k;
    k.vocab_size = config_int(c, "vocab_size", 32128);
    k.d_model = config_int(c, "d_model", 512);
    k.d_kv = config_int(c, "d_kv", 64);
    k.d_ff = config_int(c, "d_ff", 2048);
    k.num_layers = config_int(c, "num_layers", 6);
    k.num_heads = config_int(c, "num_heads", 8);
    k.relative_attention_num_buckets = config_int(c, "relative_attention_num_buckets", 32);
    k.relative_attention_max_distance = config_int(c, "relative_attention_max_distance", 128);
    k.layer_norm_epsilon = config_real(c, "layer_norm_epsilon", 1e-6);
    k.feed_forward_proj = config_string(c, "feed_forward_proj", "relu");
    for (const char* key : {"vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads",
                            "relative_attention_num_buckets", "relative_attention_max_distance"}) {
      FLAME_CHECK(config_int(c, key, 1) > 0, FLAME_ERROR_INVALID_ARGUMENT, "config: \"", key, "\" must be positive");
    }
    FLAME_CHECK(k.relative_attention_num_buckets >= 4, FLAME_ERROR_INVALID_ARGUMENT,
                "config: relative_attention_num_buckets must be at least 4");
    FLAME_CHECK(k.layer_norm_epsilon > 0, FLAME_ERROR_INVALID_ARGUMENT, "config: layer_norm_epsilon must be positive");
    // transformers: "gated-<act>" or "<act>"; "gated-gelu" means gelu_new (the tanh approximation).
    std::string act = k.feed_forward_proj;
    if (act.rfind("gated-", 0) == 0) {
      k.gated = true;
      act = act.substr(6);
    }
    if (act == "gelu" && k.gated) act = "gelu_new";
    FLAME_CHECK(known_activation(act), FLAME_ERROR_INVALID_ARGUMENT, "config: feed_forward_proj \"",
                k.feed_forward_proj, "\" names an unknown activation");
    k.dense_act = act;
    return k;
  }

  nlohmann::json to_json() const {
    return {{"architectures", {"T5EncoderModel"}},
            {"model_type", "t5"},
            {"vocab_size", vocab_size},
            {"d_model", d_model},
            {"d_kv", d_kv},
            {"d_ff", d_ff},
            {"num_layers", num_layers},
            {"num_heads", num_heads},
            {"relative_attention_num_buckets", relative_attention_num_buckets},
            {"relative_attention_max_distance", relative_attention_max_distance},
            {"layer_norm_epsilon", layer_norm_epsilon},
            {"feed_forward_proj", feed_forward_proj}};
  }
};

// transformers' T5Attention._relative_position_bucket with bidirectional=True, for key - query.
int64_t relative_position_bucket(int64_t relative_position, int64_t num_buckets, int64_t max_distance) {
  num_buckets /= 2;
  int64_t bucket = relative_position > 0 ? num_buckets : 0;
  const int64_t n = relative_position < 0 ? -relative_position : relative_position;
  const int64_t max_exact = num_buckets / 2;
  if (n < max_exact) return bucket + n;
  // The same float32 arithmetic as transformers (log of a float ratio, truncated toward zero).
  const float large = static_cast<float>(max_exact) +
                      std::log(static_cast<float>(n) / static_cast<float>(max_exact)) /
                          std::log(static_cast<float>(max_distance) / static_cast<float>(max_exact)) *
                          static_cast<float>(num_buckets - max_exact);
  const int64_t if_large = std::min<int64_t>(static_cast<int64_t>(large), num_buckets - 1);
  return bucket + if_large;
}

class T5EncoderModel : public Model {
 public:
  T5EncoderModel(Context& ctx, const T5Config& cfg, const ModelOptions& options)
      : Model(ctx, "T5EncoderModel", cfg.to_json(), options), cfg_(cfg) {
    const int64_t D = cfg.d_model, I = cfg.num_heads * cfg.d_kv, F = cfg.d_ff;
    add_param("shared.weight", {cfg.vocab_size, D});
    for (int64_t i = 0; i < cfg.num_layers; ++i) {
      const std::string p = block_prefix(i);
      for (const char* proj : {"q", "k", "v"}) add_param(p + "layer.0.SelfAttention." + proj + ".weight", {I, D});
      add_param(p + "layer.0.SelfAttention.o.weight", {D, I});
      if (i == 0)
        add_param(p + "layer.0.SelfAttention.relative_attention_bias.weight",
                  {cfg.relative_attention_num_buckets, cfg.num_heads});
      add_param(p + "layer.0.layer_norm.weight", {D});
      if (cfg.gated) {
        add_param(p + "layer.1.DenseReluDense.wi_0.weight", {F, D});
        add_param(p + "layer.1.DenseReluDense.wi_1.weight", {F, D});
      } else {
        add_param(p + "layer.1.DenseReluDense.wi.weight", {F, D});
      }
      add_param(p + "layer.1.DenseReluDense.wo.weight", {D, F});
      add_param(p + "layer.1.layer_norm.weight", {D});
    }
    add_param("encoder.final_layer_norm.weight", {D});
  }

  std::vector<std::string> required_inputs() const override { return {"input_ids"}; }
  bool is_embedding(const std::string& module) const override {
    return module == "shared" || module.find("relative_attention_bias") != std::string::npos;
  }
  std::vector<std::string> optional_inputs() const override { return {"attention_mask"}; }

  void initialize() override {
    // transformers' T5 init (factor 1): embeddings N(0, 1), q N(0, (d_model d_kv)^-1/2), k / v / wi
    // N(0, d_model^-1/2), o N(0, (heads d_kv)^-1/2), wo N(0, d_ff^-1/2), bias table N(0, d_model^-1/2),
    // norms 1.
    const double D = static_cast<double>(cfg_.d_model), kv = static_cast<double>(cfg_.d_kv);
    const double I = static_cast<double>(cfg_.num_heads * cfg_.d_kv), F = static_cast<double>(cfg_.d_ff);
    for (size_t i = 0; i < params().size(); ++i) {
      const std::string& n = params().names()[i];
      const Tensor& p = params().tensors()[i];
      auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
      double stddev = 1.0;
      if (has("layer_norm")) {
        ops::fill_(p, 1.0);
        continue;
      }
      if (has("SelfAttention.q.")) stddev = 1.0 / std::sqrt(D * kv);
      else if (has("SelfAttention.k.") || has("SelfAttention.v.") || has("DenseReluDense.wi")) stddev = 1.0 / std::sqrt(D);
      else if (has("SelfAttention.o.")) stddev = 1.0 / std::sqrt(I);
      else if (has("DenseReluDense.wo")) stddev = 1.0 / std::sqrt(F);
      else if (has("relative_attention_bias")) stddev = 1.0 / std::sqrt(D);
      ops::copy_into(p, ops::mul_scalar(ops::randn(ctx(), p->shape, FLAME_DTYPE_F32), stddev));
    }
  }

 protected:
  NamedTensors run(const NamedTensors& inputs) override {
    const Tensor& ids = input(inputs, "input_ids");
    FLAME_CHECK(ids->ndim() == 2 && (ids->dtype == FLAME_DTYPE_I64 || ids->dtype == FLAME_DTYPE_I32),
                FLAME_ERROR_INVALID_ARGUMENT, "input_ids must be [batch, tokens] of i64 or i32");
    const int64_t B = ids->shape[0], T = ids->shape[1];
    FLAME_CHECK(T >= 1, FLAME_ERROR_INVALID_ARGUMENT, "input_ids has no tokens");
    Tensor h = ops::embedding(param("shared.weight"), ids, ops::kNoIndex);
    const Tensor bias = position_bias(inputs, B, T);
    for (int64_t i = 0; i < cfg_.num_layers; ++i) {
      // The bias is an input of every block (not captured) so that its gradient reaches the table
      // through checkpointed blocks too.
      auto block = [this, i](const std::vector<Tensor>& x) { return std::vector<Tensor>{layer(i, x[0], x[1])}; };
      std::vector<Tensor> out = run_block(i, block, {h, bias}, 1);
      h = out[0];
    }
    Tensor last = ops::rms_norm(h, {cfg_.d_model}, param("encoder.final_layer_norm.weight"), cfg_.layer_norm_epsilon);
    return {{"last_hidden_state", last}};
  }

 private:
  static std::string block_prefix(int64_t i) { return "encoder.block." + std::to_string(i) + "."; }

  Tensor lin(const Tensor& x, const std::string& name) const {
    return adapted_linear(x, name.substr(0, name.size() - 7), param(name), nullptr);  // module: name less ".weight"
  }

  // [1 or B, heads, T, T] in the compute dtype: the relative position bias, plus the dtype's lowest
  // value at keys attention_mask zeroes.
  Tensor position_bias(const NamedTensors& inputs, int64_t B, int64_t T) const {
    std::vector<int64_t> buckets(static_cast<size_t>(T * T));
    for (int64_t q = 0; q < T; ++q)
      for (int64_t k = 0; k < T; ++k)
        buckets[static_cast<size_t>(q * T + k)] =
            relative_position_bucket(k - q, cfg_.relative_attention_num_buckets, cfg_.relative_attention_max_distance);
    Tensor index = ops::from_host(ctx(), buckets.data(), buckets.size() * sizeof(int64_t), {T, T}, FLAME_DTYPE_I64);
    Tensor table = param("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight");
    Tensor bias = ops::unsqueeze(ops::permute(ops::embedding(table, index, ops::kNoIndex), {2, 0, 1}), 0);  // [1, H, T, T]
    const Tensor* m = optional_input(inputs, "attention_mask");
    if (!m) return bias;
    FLAME_CHECK((*m)->ndim() == 2 && (*m)->shape[0] == B && (*m)->shape[1] == T, FLAME_ERROR_INVALID_ARGUMENT,
                "attention_mask must be [batch, tokens] like input_ids");
    const DType d = options().compute_dtype;
    double lowest = -std::numeric_limits<float>::max();
    if (d == FLAME_DTYPE_F64) lowest = -std::numeric_limits<double>::max();
    else if (d == FLAME_DTYPE_F16) lowest = -65504.0;
    else if (d == FLAME_DTYPE_BF16) lowest = -3.3895313892515355e38;
    // transformers: (1 - mask) * lowest, added to the bias.
    Tensor keep = ops::to_dtype(ops::binary(OpId::Ne, *m, ops::scalar(ctx(), 0, (*m)->dtype)), d);
    Tensor additive = ops::mul_scalar(ops::unary(OpId::RsubScalar, keep, 1.0), lowest);
    return ops::add(bias, ops::reshape(additive, {B, 1, 1, T}));
  }

  Tensor layer(int64_t i, const Tensor& h, const Tensor& bias) const {
    const std::string p = block_prefix(i);
    const int64_t D = cfg_.d_model, H = cfg_.num_heads;
    const double eps = cfg_.layer_norm_epsilon;
    Tensor x = ops::rms_norm(h, {D}, param(p + "layer.0.layer_norm.weight"), eps);
    Tensor q = split_heads(lin(x, p + "layer.0.SelfAttention.q.weight"), H);
    Tensor k = split_heads(lin(x, p + "layer.0.SelfAttention.k.weight"), H);
    Tensor v = split_heads(lin(x, p + "layer.0.SelfAttention.v.weight"), H);
    ops::AttentionOptions ao;
    ao.scale = 1.0;  // T5 does not scale the scores
    Tensor a = merge_heads(ops::scaled_dot_product_attention(q, k, v, bias, ao));
    Tensor h1 = ops::add(h, lin(a, p + "layer.0.SelfAttention.o.weight"));
    x = ops::rms_norm(h1, {D}, param(p + "layer.1.layer_norm.weight"), eps);
    Tensor f;
    if (cfg_.gated)
      f = ops::mul(activation(cfg_.dense_act, lin(x, p + "layer.1.DenseReluDense.wi_0.weight")),
                   lin(x, p + "layer.1.DenseReluDense.wi_1.weight"));
    else
      f = activation(cfg_.dense_act, lin(x, p + "layer.1.DenseReluDense.wi.weight"));
    return ops::add(h1, lin(f, p + "layer.1.DenseReluDense.wo.weight"));
  }

  T5Config cfg_;
};

}  // namespace

std::shared_ptr<Model> create_t5_encoder_model(Context& ctx, const nlohmann::json& config, const ModelOptions& options) {
  return std::make_shared<T5EncoderModel>(ctx, T5Config::read(config), options);
}

}  // namespace flame::models

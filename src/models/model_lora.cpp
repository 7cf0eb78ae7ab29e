// LoRA adapters on a model's linear layers: options, creation and the adapter's term (model_lora.h).
#include "models/model_lora.h"
#include <cmath>
#include "core/error.h"
#include "models/model.h"
#include "ops/nnops.h"
#include "ops/ops.h"
#include "ops/quantized.h"
#include "runtime/context.h"
#include "tensor/autograd_graph.h"

namespace flame::models {

namespace {

int64_t rank_value(const nlohmann::json& v, const std::string& key) {
  FLAME_CHECK(v.is_number_integer(), FLAME_ERROR_INVALID_ARGUMENT, "LoRA options: \"", key, "\" must be an integer");
  const int64_t r = v.get<int64_t>();
  FLAME_CHECK(r >= 1 && r <= 65536, FLAME_ERROR_INVALID_ARGUMENT, "LoRA options: \"", key, "\" is ", r,
              ", not in [1, 65536]");
  return r;
}

double finite_value(const nlohmann::json& v, const std::string& key) {
  FLAME_CHECK(v.is_number(), FLAME_ERROR_INVALID_ARGUMENT, "LoRA options: \"", key, "\" must be a number");
  const double d = v.get<double>();
  FLAME_CHECK(std::isfinite(d), FLAME_ERROR_INVALID_ARGUMENT, "LoRA options: \"", key, "\" must be finite");
  return d;
}

// The value of the most specific (longest) pattern that matches module, or fallback.
template <typename V>
V pattern_value(const std::vector<std::pair<std::string, V>>& patterns, const std::string& module, V fallback) {
  size_t best = 0;
  V value = fallback;
  for (const auto& [pattern, v] : patterns)
    if (pattern.size() > best && lora_target_matches(module, pattern)) {
      best = pattern.size();
      value = v;
    }
  return value;
}

// torch.nn.init.kaiming_uniform_(a = sqrt(5)) of a [rows, fan_in] tensor: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
Tensor kaiming_uniform(Context& ctx, int64_t rows, int64_t fan_in, DType dtype) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  return ops::to_dtype(
      ops::add_scalar(ops::mul_scalar(ops::rand(ctx, {rows, fan_in}, FLAME_DTYPE_F32), 2 * bound), -bound), dtype);
}

// A new LoKr module on m, initialised as LyCORIS' LokrModule (model_lora.h).
LoraModule create_lokr_module(Context& ctx, const LoraCandidate& m, int64_t rank, double alpha,
                              const LoraAdapterOptions& options) {
  const LokrShape ls = lokr_shape(m.out_features, m.in_features, rank, options.lokr_factor, options.lokr_decompose_both);
  LoraModule lm;
  lm.module = m.module;
  lm.alpha = alpha;
  lm.lokr_rank = rank;
  const DType d = options.dtype;
  if (ls.w1_low_rank) {
    lm.lokr_w1_a = kaiming_uniform(ctx, ls.w1_rows, rank, d);
    lm.lokr_w1_b = kaiming_uniform(ctx, rank, ls.w1_cols, d);
  } else {
    lm.lokr_w1 = kaiming_uniform(ctx, ls.w1_rows, ls.w1_cols, d);
  }
  if (ls.w2_low_rank) {
    lm.lokr_w2_a = kaiming_uniform(ctx, ls.w2_rows, rank, d);
    lm.lokr_w2_b = ops::zeros(ctx, {rank, ls.w2_cols}, d);
  } else {
    lm.lokr_w2 = ops::zeros(ctx, {ls.w2_rows, ls.w2_cols}, d);
  }
  for (const auto& [f, t] : lm.lokr_factors()) autograd_meta(*t).requires_grad = true;
  return lm;
}

}  // namespace

LoraAdapterOptions parse_lora_adapter_options(const nlohmann::json& options) {
  LoraAdapterOptions o;
  if (options.is_null()) return o;
  FLAME_CHECK(options.is_object(), FLAME_ERROR_INVALID_ARGUMENT, "LoRA options must be a JSON object");
  static const char* const kKeys[] = {"name", "targets",     "preset",     "rank",   "alpha", "rank_pattern",
                                      "alpha_pattern", "init", "dropout", "dtype", "freeze_base", "multiplier", "dora",
                                      "type",    "factor",        "decompose_both"};
  for (auto it = options.begin(); it != options.end(); ++it) {
    bool known = false;
    for (const char* k : kKeys) known = known || it.key() == k;
    FLAME_CHECK(known, FLAME_ERROR_INVALID_ARGUMENT, "LoRA options: unknown key \"", it.key(),
                "\" (known: name, targets, preset, rank, alpha, rank_pattern, alpha_pattern, init, dropout, dtype, "
                "freeze_base, multiplier, dora, type, factor, decompose_both)");
  }
  if (options.contains("name")) {
    FLAME_CHECK(options["name"].is_string() && !options["name"].get<std::string>().empty(),
                FLAME_ERROR_INVALID_ARGUMENT, "LoRA options: \"name\" must be a non-empty string");
    o.name = options["name"].get<std::string>();
  }
  if (options.contains("targets")) {
    const auto& t = options["targets"];
    FLAME_CHECK(t.is_array(), FLAME_ERROR_INVALID_ARGUMENT, "LoRA options: \"targets\" must be an array of strings");
    for (const auto& s : t) {
      FLAME_CHECK(s.is_string() && !s.get<std::string>().empty(), FLAME_ERROR_INVALID_ARGUMENT,
                  "LoRA options: \"targets\" must hold non-empty strings");
      o.targets.push_back(s.get<std::string>());
    }
  }
  if (options.contains("preset")) {
    const auto& p = options["preset"];
    FLAME_CHECK(p.is_string() && (p == "diffusers" || p == "kohya"), FLAME_ERROR_INVALID_ARGUMENT,
                "LoRA options: \"preset\" must be \"diffusers\" or \"kohya\"");
    o.kohya_preset = p == "kohya";
  }
  if (options.contains("rank")) o.rank = rank_value(options["rank"], "rank");
  o.alpha = options.contains("alpha") ? finite_value(options["alpha"], "alpha") : static_cast<double>(o.rank);
  for (const char* key : {"rank_pattern", "alpha_pattern"}) {
    if (!options.contains(key)) continue;
    const auto& p = options[key];
    FLAME_CHECK(p.is_object(), FLAME_ERROR_INVALID_ARGUMENT, "LoRA options: \"", key, "\" must be an object");
    for (auto it = p.begin(); it != p.end(); ++it) {
      const std::string k = std::string(key) + "." + it.key();
      if (std::string(key) == "rank_pattern") o.rank_pattern.emplace_back(it.key(), rank_value(it.value(), k));
      else o.alpha_pattern.emplace_back(it.key(), finite_value(it.value(), k));
    }
  }
  if (options.contains("init")) {
    FLAME_CHECK(options["init"].is_string(), FLAME_ERROR_INVALID_ARGUMENT, "LoRA options: \"init\" must be a string");
    o.init = options["init"].get<std::string>();
    FLAME_CHECK(o.init == "kaiming" || o.init == "gaussian", FLAME_ERROR_INVALID_ARGUMENT, "LoRA options: \"init\" is \"",
                o.init, "\", not kaiming or gaussian");
  }
  if (options.contains("dropout")) {
    o.dropout = finite_value(options["dropout"], "dropout");
    FLAME_CHECK(o.dropout >= 0 && o.dropout < 1, FLAME_ERROR_INVALID_ARGUMENT, "LoRA options: \"dropout\" must be in [0, 1)");
  }
  if (options.contains("dtype")) {
    FLAME_CHECK(options["dtype"].is_string(), FLAME_ERROR_INVALID_ARGUMENT, "LoRA options: \"dtype\" must be a string");
    o.dtype = float_dtype_from_name(options["dtype"].get<std::string>(), "dtype");
  }
  if (options.contains("freeze_base")) {
    FLAME_CHECK(options["freeze_base"].is_boolean(), FLAME_ERROR_INVALID_ARGUMENT,
                "LoRA options: \"freeze_base\" must be true or false");
    o.freeze_base = options["freeze_base"].get<bool>();
  }
  if (options.contains("multiplier")) o.multiplier = finite_value(options["multiplier"], "multiplier");
  if (options.contains("dora")) {
    FLAME_CHECK(options["dora"].is_boolean(), FLAME_ERROR_INVALID_ARGUMENT, "LoRA options: \"dora\" must be true or false");
    o.dora = options["dora"].get<bool>();
  }
  if (options.contains("type")) {
    const auto& t = options["type"];
    FLAME_CHECK(t.is_string() && (t == "lora" || t == "lokr"), FLAME_ERROR_INVALID_ARGUMENT,
                "LoRA options: \"type\" must be \"lora\" or \"lokr\"");
    o.lokr = t == "lokr";
  }
  if (options.contains("factor")) {
    const auto& f = options["factor"];
    FLAME_CHECK(f.is_number_integer() && (f.get<int64_t>() == -1 || f.get<int64_t>() >= 1), FLAME_ERROR_INVALID_ARGUMENT,
                "LoRA options: \"factor\" must be -1 or a positive integer");
    o.lokr_factor = f.get<int64_t>();
  }
  if (options.contains("decompose_both")) {
    FLAME_CHECK(options["decompose_both"].is_boolean(), FLAME_ERROR_INVALID_ARGUMENT,
                "LoRA options: \"decompose_both\" must be true or false");
    o.lokr_decompose_both = options["decompose_both"].get<bool>();
  }
  FLAME_CHECK(o.lokr || (!options.contains("factor") && !options.contains("decompose_both")), FLAME_ERROR_INVALID_ARGUMENT,
              "LoRA options: \"factor\" and \"decompose_both\" are LoKr's (\"type\": \"lokr\")");
  FLAME_CHECK(!o.lokr || !o.dora, FLAME_ERROR_INVALID_ARGUMENT, "LoRA options: \"dora\" with \"type\": \"lokr\" is not supported");
  FLAME_CHECK(!o.lokr || o.init == "kaiming", FLAME_ERROR_INVALID_ARGUMENT,
              "LoRA options: \"init\" \"", o.init, "\" with \"type\": \"lokr\"; LoKr initialises as LyCORIS (\"kaiming\")");
  return o;
}

const LoraModule* LoraAdapter::find(const std::string& module) const {
  for (const LoraModule& m : modules)
    if (m.module == module) return &m;
  return nullptr;
}

std::vector<std::pair<LokrFactor, Tensor>> LoraModule::lokr_factors() const {
  std::vector<std::pair<LokrFactor, Tensor>> out;
  if (lokr_w1) out.emplace_back(LokrFactor::W1, lokr_w1);
  if (lokr_w1_a) out.emplace_back(LokrFactor::W1A, lokr_w1_a);
  if (lokr_w1_b) out.emplace_back(LokrFactor::W1B, lokr_w1_b);
  if (lokr_w2) out.emplace_back(LokrFactor::W2, lokr_w2);
  if (lokr_w2_a) out.emplace_back(LokrFactor::W2A, lokr_w2_a);
  if (lokr_w2_b) out.emplace_back(LokrFactor::W2B, lokr_w2_b);
  return out;
}

LokrShape LoraModule::lokr_shape() const {
  LokrShape s;
  s.w1_low_rank = lokr_w1 == nullptr;
  s.w2_low_rank = lokr_w2 == nullptr;
  s.w1_rows = lokr_w1 ? lokr_w1->shape[0] : lokr_w1_a->shape[0];
  s.w1_cols = lokr_w1 ? lokr_w1->shape[1] : lokr_w1_b->shape[1];
  s.w2_rows = lokr_w2 ? lokr_w2->shape[0] : lokr_w2_a->shape[0];
  s.w2_cols = lokr_w2 ? lokr_w2->shape[1] : lokr_w2_b->shape[1];
  return s;
}

std::vector<std::pair<std::string, Tensor>> LoraAdapter::named_tensors() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const LoraModule& m : modules) {
    if (m.is_lokr()) {
      for (const auto& [f, t] : m.lokr_factors()) out.emplace_back(m.module + "." + lokr_factor_name(f), t);
      continue;
    }
    out.emplace_back(m.module + ".lora_A.weight", m.down);
    out.emplace_back(m.module + ".lora_B.weight", m.up);
    if (m.magnitude) out.emplace_back(m.module + ".lora_magnitude_vector", m.magnitude);
  }
  return out;
}

std::shared_ptr<LoraAdapter> create_lora_adapter(Context& ctx, const std::vector<LoraCandidate>& modules,
                                                 const std::vector<std::string>& targets,
                                                 const LoraAdapterOptions& options) {
  FLAME_CHECK(!targets.empty(), FLAME_ERROR_INVALID_ARGUMENT, "LoRA: no target modules");
  for (const std::string& t : targets) {
    bool any = false;
    for (const LoraCandidate& m : modules) any = any || lora_target_matches(m.module, t);
    FLAME_CHECK(any, FLAME_ERROR_INVALID_ARGUMENT, "LoRA target \"", t, "\" matches no linear layer of the model");
  }
  auto adapter = std::make_shared<LoraAdapter>();
  adapter->name = options.name;
  adapter->multiplier = options.multiplier;
  adapter->dropout = options.dropout;
  for (const LoraCandidate& m : modules) {
    bool selected = false;
    for (const std::string& t : targets) selected = selected || lora_target_matches(m.module, t);
    if (!selected) continue;
    const int64_t rank = pattern_value(options.rank_pattern, m.module, options.rank);
    const double alpha = pattern_value(options.alpha_pattern, m.module, options.alpha);
    if (options.lokr) {
      adapter->modules.push_back(create_lokr_module(ctx, m, rank, alpha, options));
      continue;
    }
    LoraModule lm;
    lm.module = m.module;
    lm.alpha = alpha;
    if (options.init == "gaussian") {
      lm.down = ops::to_dtype(ops::mul_scalar(ops::randn(ctx, {rank, m.in_features}, FLAME_DTYPE_F32), 1.0 / rank),
                              options.dtype);
    } else {  // torch.nn.Linear's and peft's Kaiming-uniform (a = sqrt(5)): U(-1/sqrt(in), 1/sqrt(in))
      const double bound = 1.0 / std::sqrt(static_cast<double>(m.in_features));
      lm.down = ops::to_dtype(
          ops::add_scalar(ops::mul_scalar(ops::rand(ctx, {rank, m.in_features}, FLAME_DTYPE_F32), 2 * bound), -bound),
          options.dtype);
    }
    lm.up = ops::zeros(ctx, {m.out_features, rank}, options.dtype);
    autograd_meta(*lm.down).requires_grad = true;  // fresh results of untracked ops: leaves now
    autograd_meta(*lm.up).requires_grad = true;
    adapter->modules.push_back(std::move(lm));
  }
  return adapter;
}

namespace {

// Grad mode off and autocast off for a scope: DoRA's norms and merges are plain f32 arithmetic.
GradMode untracked_f32(const Context& ctx) {
  GradMode m = ctx.mode.with_grad(false);
  m.autocast = -1;
  return m;
}

Tensor as_f32(const Tensor& t) { return t->dtype == FLAME_DTYPE_F32 ? t : ops::to_dtype(t, FLAME_DTYPE_F32); }

// W + scale * B A in f32 [out, in] (untracked: the caller holds an untracked_f32 mode).
Tensor adapted_weight_f32(const Tensor& weight, const LoraModule& m) {
  return ops::add(as_f32(weight), ops::mul_scalar(ops::mm(as_f32(m.up), as_f32(m.down)), m.scale()));
}

// peft's DoRA term (model_lora.h), without the multiplier.
Tensor dora_term(const LoraAdapter& adapter, const LoraModule& m, const Tensor& x, const LoraBaseLinear& base,
                 bool training) {
  const DType d = x->dtype;
  const Tensor a = m.down->dtype == d ? m.down : ops::to_dtype(m.down, d);
  const Tensor b = m.up->dtype == d ? m.up : ops::to_dtype(m.up, d);
  const bool dropped = training && adapter.dropout > 0;
  const Tensor in = dropped ? ops::dropout(x, adapter.dropout, true) : x;
  const Tensor lora = ops::linear(ops::mul_scalar(ops::linear(in, a, nullptr, ops::Activation::None), m.scale()), b,
                                  nullptr, ops::Activation::None);
  const Tensor norm = dora_row_norms(base.weight, m);  // detached, as peft's weight_norm.detach()
  const Tensor mag_norm_scale = ops::to_dtype(ops::div(as_f32(m.magnitude), norm), d);  // [out], reaches m
  Tensor base_result;
  if (dropped && base.nf4.packed) base_result = ops::nf4_linear(in, base.nf4, nullptr);
  else if (dropped && base.quantized) base_result = ops::quantized_linear(in, base.quantized, base.scale, nullptr);
  else if (dropped) base_result = ops::linear(in, base.weight, nullptr, ops::Activation::None);
  else base_result = base.bias ? ops::sub(base.output, base.bias) : base.output;
  return ops::add(ops::mul(ops::add_scalar(mag_norm_scale, -1.0), base_result), ops::mul(mag_norm_scale, lora));
}

Tensor in_dtype(const Tensor& t, DType d) { return t->dtype == d ? t : ops::to_dtype(t, d); }

// x [N, ..., k] times (a @ b)^T, or w^T when whole: (x b^T) a^T, the low-rank product never formed.
Tensor apply_factor(const Tensor& x, const Tensor& whole, const Tensor& a, const Tensor& b) {
  const DType d = x->dtype;
  if (whole) return ops::linear(x, in_dtype(whole, d), nullptr, ops::Activation::None);
  return ops::linear(ops::linear(x, in_dtype(b, d), nullptr, ops::Activation::None), in_dtype(a, d), nullptr,
                     ops::Activation::None);
}

// multiplier * scale * kron(W1, W2) x' (model_lora.h): X [N, b, d] -> X W2^T [N, b, c] -> transposed
// [N, c, b] -> times W1^T [N, c, a] -> transposed [N, a, c] = rows i * c + k of the product.
Tensor lokr_term(const LoraAdapter& adapter, const LoraModule& m, const Tensor& x, bool training) {
  const LokrShape ls = m.lokr_shape();
  const Tensor in = training && adapter.dropout > 0 ? ops::dropout(x, adapter.dropout, true) : x;
  const int64_t features = ls.w1_cols * ls.w2_cols;
  FLAME_CHECK(x->ndim() >= 1 && x->shape.back() == features, FLAME_ERROR_INVALID_ARGUMENT, "LoKr module ", m.module,
              ": input of ", x->shape.back(), " features, expected ", features);
  const int64_t n = features == 0 ? 0 : x->numel() / features;
  const Tensor xs = ops::reshape(in, {n, ls.w1_cols, ls.w2_cols});
  const Tensor z = apply_factor(xs, m.lokr_w2, m.lokr_w2_a, m.lokr_w2_b);                     // [N, b, c]
  const Tensor zt = ops::mul_scalar(ops::contiguous(ops::transpose(z, 1, 2)), adapter.multiplier * m.scale());  // [N, c, b]
  const Tensor y = apply_factor(zt, m.lokr_w1, m.lokr_w1_a, m.lokr_w1_b);                     // [N, c, a]
  Shape out_shape = x->shape;
  out_shape.back() = ls.w1_rows * ls.w2_rows;
  return ops::reshape(ops::contiguous(ops::transpose(y, 1, 2)), out_shape);
}

}  // namespace

Tensor lokr_kron_f32(const LoraModule& m) {
  Context& ctx = (m.lokr_w1 ? m.lokr_w1 : m.lokr_w1_a)->ctx();
  GradModeGuard guard(ctx, untracked_f32(ctx));
  const LokrShape ls = m.lokr_shape();
  const Tensor w1 = m.lokr_w1 ? as_f32(m.lokr_w1) : ops::mm(as_f32(m.lokr_w1_a), as_f32(m.lokr_w1_b));
  const Tensor w2 = m.lokr_w2 ? as_f32(m.lokr_w2) : ops::mm(as_f32(m.lokr_w2_a), as_f32(m.lokr_w2_b));
  // kron(W1, W2)[i c + k, j d + l] = W1[i, j] W2[k, l]: [a, 1, b, 1] * [1, c, 1, d] -> [a, c, b, d]
  const Tensor p = ops::mul(ops::reshape(w1, {ls.w1_rows, 1, ls.w1_cols, 1}), ops::reshape(w2, {1, ls.w2_rows, 1, ls.w2_cols}));
  return ops::reshape(p, {ls.w1_rows * ls.w2_rows, ls.w1_cols * ls.w2_cols});
}

Tensor dora_row_norms(const Tensor& weight, const LoraModule& m) {
  GradModeGuard guard(weight->ctx(), untracked_f32(weight->ctx()));
  return ops::norm(adapted_weight_f32(weight, m), 2.0, {1}, false);
}

Tensor lora_delta(const LoraAdapter& adapter, const LoraModule& m, const Tensor& x, const LoraBaseLinear& base,
                  bool training) {
  if (m.is_lokr()) return lokr_term(adapter, m, x, training);
  if (m.magnitude) {
    const Tensor t = dora_term(adapter, m, x, base, training);
    return adapter.multiplier == 1.0 ? t : ops::mul_scalar(t, adapter.multiplier);
  }
  const DType d = x->dtype;
  const Tensor a = m.down->dtype == d ? m.down : ops::to_dtype(m.down, d);
  const Tensor b = m.up->dtype == d ? m.up : ops::to_dtype(m.up, d);
  const Tensor in = training && adapter.dropout > 0 ? ops::dropout(x, adapter.dropout, true) : x;
  const Tensor h = ops::mul_scalar(ops::linear(in, a, nullptr, ops::Activation::None), adapter.multiplier * m.scale());
  return ops::linear(h, b, nullptr, ops::Activation::None);
}

Tensor merged_lora_weight(const LoraAdapter& adapter, const LoraModule& m, const Tensor& weight) {
  GradModeGuard guard(weight->ctx(), untracked_f32(weight->ctx()));
  const Tensor w = as_f32(weight);
  if (m.is_lokr()) return ops::add(w, ops::mul_scalar(lokr_kron_f32(m), adapter.multiplier * m.scale()));
  if (!m.magnitude)
    return ops::add(w, ops::mul_scalar(ops::mm(as_f32(m.up), as_f32(m.down)), adapter.multiplier * m.scale()));
  const Tensor adapted = adapted_weight_f32(weight, m);
  const Tensor factor = ops::unsqueeze(ops::div(as_f32(m.magnitude), ops::norm(adapted, 2.0, {1}, false)), 1);  // [out, 1]
  const Tensor dora = ops::mul(factor, adapted);
  if (adapter.multiplier == 1.0) return dora;
  return ops::add(w, ops::mul_scalar(ops::sub(dora, w), adapter.multiplier));
}

}  // namespace flame::models

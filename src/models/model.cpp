// Model, ParamStore, the config readers and the registry of architectures (model.h).
#include "models/model.h"
#include <algorithm>
#include <cmath>
#include "tensor/autograd_graph.h"
#include "core/error.h"
#include "models/lora_format.h"
#include "models/model_registry.h"
#include "ops/ops.h"
#include "models/param_sharding.h"
#include "ops/quantized.h"
#include "toolkit/checkpoint.h"

namespace flame::models {

DType float_dtype_from_name(const std::string& s, const char* key) {
  static const std::pair<const char*, DType> kNames[] = {
      {"f32", FLAME_DTYPE_F32},   {"float32", FLAME_DTYPE_F32}, {"f16", FLAME_DTYPE_F16},
      {"float16", FLAME_DTYPE_F16}, {"bf16", FLAME_DTYPE_BF16}, {"bfloat16", FLAME_DTYPE_BF16},
      {"f64", FLAME_DTYPE_F64},   {"float64", FLAME_DTYPE_F64},
  };
  for (const auto& [name, d] : kNames)
    if (s == name) return d;
  fail(FLAME_ERROR_INVALID_ARGUMENT, "options: \"", key, "\" is \"", s,
              "\", not one of f32, f16, bf16, f64 (or float32, float16, bfloat16, float64)");
}

ModelOptions parse_model_options(const nlohmann::json& options) {
  ModelOptions o;
  if (options.is_null()) return o;
  FLAME_CHECK(options.is_object(), FLAME_ERROR_INVALID_ARGUMENT, "options must be a JSON object");
  for (auto it = options.begin(); it != options.end(); ++it) {
    const std::string& k = it.key();
    FLAME_CHECK(k == "dtype" || k == "compute_dtype" || k == "quantize" || k == "offload" || k == "architecture" ||
                    k == "config" || k == "component",
                FLAME_ERROR_INVALID_ARGUMENT, "options: unknown key \"", k,
                "\" (known: dtype, compute_dtype, quantize, offload, architecture, config, component)");
  }
  bool compute_given = false;
  if (options.contains("dtype")) {
    FLAME_CHECK(options["dtype"].is_string(), FLAME_ERROR_INVALID_ARGUMENT, "options: \"dtype\" must be a string");
    o.param_dtype = float_dtype_from_name(options["dtype"].get<std::string>(), "dtype");
  }
  if (options.contains("compute_dtype")) {
    FLAME_CHECK(options["compute_dtype"].is_string(), FLAME_ERROR_INVALID_ARGUMENT,
                "options: \"compute_dtype\" must be a string");
    o.compute_dtype = float_dtype_from_name(options["compute_dtype"].get<std::string>(), "compute_dtype");
    compute_given = true;
  }
  if (!compute_given) o.compute_dtype = o.param_dtype;
  if (options.contains("quantize")) o.quantize = parse_weight_quantization(options["quantize"]);
  if (options.contains("offload")) o.offload = parse_offload_options(options["offload"]);
  FLAME_CHECK(!(o.quantize.enabled && o.offload.enabled), FLAME_ERROR_INVALID_ARGUMENT,
              "options: \"quantize\" and \"offload\" together are not supported yet");
  return o;
}

// ---- ParamStore ----

Tensor ParamStore::add(Context& ctx, const std::string& name, const Shape& shape, DType dtype, bool requires_grad) {
  FLAME_CHECK(!index_.count(name), FLAME_ERROR_INTERNAL, "parameter ", name, " registered twice");
  Tensor t = ops::empty(ctx, shape, dtype);
  autograd_meta(*t).requires_grad = requires_grad;
  insert(name, t);
  return t;
}

void ParamStore::insert(const std::string& name, const Tensor& t) {
  FLAME_CHECK(!index_.count(name), FLAME_ERROR_INTERNAL, "parameter ", name, " registered twice");
  index_.emplace(name, names_.size());
  names_.push_back(name);
  tensors_.push_back(t);
}

const Tensor* ParamStore::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const Tensor& ParamStore::get(const std::string& name) const {
  const Tensor* t = find(name);
  FLAME_CHECK(t, FLAME_ERROR_INTERNAL, "the model has no parameter ", name);
  return *t;
}

// ---- Model ----

Model::Model(Context& ctx, std::string class_name, nlohmann::json config, const ModelOptions& options)
    : config_(std::move(config)), ctx_(ctx.shared_from_this()), class_name_(std::move(class_name)), options_(options) {
  auto is_float = [](DType d) {
    return d == FLAME_DTYPE_F32 || d == FLAME_DTYPE_F16 || d == FLAME_DTYPE_BF16 || d == FLAME_DTYPE_F64;
  };
  FLAME_CHECK(is_float(options_.compute_dtype), FLAME_ERROR_INVALID_ARGUMENT, "compute dtype ",
              dtype_name(options_.compute_dtype), " is not a float dtype FLAME computes in");
  if (options_.offload.enabled) offload_ = std::make_shared<WeightOffload>(ctx, options_.offload);
}

namespace {
// The module of a "<module>.weight" name, or "" for any other name.
std::string weight_module(const std::string& name) {
  const std::string suffix = ".weight";
  if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) return {};
  return name.substr(0, name.size() - suffix.size());
}
}  // namespace

Tensor Model::add_param(const std::string& name, const Shape& shape) {
  const WeightQuantization& q = options_.quantize;
  const std::string module = shape.size() == 2 ? weight_module(name) : std::string();
  if (!q.enabled || module.empty() || is_embedding(module)) return params_.add(*ctx_, name, shape, options_.param_dtype);
  if (q.nf4()) return add_nf4_param(name, module, shape);
  Tensor w = params_.add(*ctx_, name, shape, q.dtype, false);
  const std::string scale = scale_weight_name(name);
  params_.add(*ctx_, scale, scale_shape(q.scale, shape), FLAME_DTYPE_F32, false);
  quantized_.emplace(name, scale);
  return w;
}

namespace {
// The statistics' names of an NF4 weight (bitsandbytes' state-dict names beside "<module>.weight").
std::string nf4_absmax_name(const std::string& weight) { return weight + ".absmax"; }
std::string nf4_nested_scale_name(const std::string& weight) { return weight + ".nested_absmax"; }
std::string nf4_nested_offset_name(const std::string& weight) { return weight + ".nested_offset"; }

// Checks that block_size divides the row length of the linear layer module ([out, in]).
void check_nf4_rows(const WeightQuantization& q, const std::string& module, const Shape& shape) {
  FLAME_CHECK(shape.size() == 2 && shape[1] % q.block_size == 0, FLAME_ERROR_INVALID_ARGUMENT, "options: \"quantize.block_size\" ",
              q.block_size, " does not divide the row length of the linear layer ", module, " ", shape_str(shape),
              " (NF4 blocks stay within a row: pick a smaller power of two)");
}
}  // namespace

Tensor Model::add_nf4_param(const std::string& name, const std::string& module, const Shape& shape) {
  const WeightQuantization& q = options_.quantize;
  check_nf4_rows(q, module, shape);
  if (q.double_quant && !nf4_code_) nf4_code_ = ops::nf4_dynamic_map(*ctx_);
  const ops::Nf4Weight w = ops::nf4_empty(*ctx_, shape[0], shape[1], q.block_size, q.double_quant ? nf4_code_ : nullptr);
  Nf4Names names{nf4_absmax_name(name), std::string(), std::string()};
  params_.insert(name, w.packed);
  params_.insert(names.absmax, w.absmax);
  if (q.double_quant) {
    names.nested_scale = nf4_nested_scale_name(name);
    names.nested_offset = nf4_nested_offset_name(name);
    params_.insert(names.nested_scale, w.nested_scale);
    params_.insert(names.nested_offset, w.nested_offset);
  }
  nf4_.emplace(name, names);
  return w.packed;
}

ops::Nf4Weight Model::nf4_weight(const std::string& weight_name) const {
  auto it = nf4_.find(weight_name);
  FLAME_CHECK(it != nf4_.end(), FLAME_ERROR_INTERNAL, weight_name, " is not an NF4 weight of ", class_name_);
  ops::Nf4Weight w;
  w.packed = params_.get(weight_name);
  w.absmax = params_.get(it->second.absmax);
  if (!it->second.nested_scale.empty()) {
    w.nested_scale = params_.get(it->second.nested_scale);
    w.nested_offset = params_.get(it->second.nested_offset);
    w.nested_code = nf4_code_;
  }
  return w;
}

ops::Nf4Weight Model::fetched_nf4(const std::string& weight_name) const {
  ops::Nf4Weight w = nf4_weight(weight_name);
  const Nf4Names& names = nf4_.at(weight_name);
  w.packed = fetched(weight_name, w.packed);
  w.absmax = fetched(names.absmax, w.absmax);
  if (w.double_quant()) {
    w.nested_scale = fetched(names.nested_scale, w.nested_scale);
    w.nested_offset = fetched(names.nested_offset, w.nested_offset);
  }
  return w;
}

Shape Model::logical_shape(const std::string& name) const {
  const Tensor& t = params_.get(name);
  if (!is_nf4_weight(name)) return t->shape;
  return {t->shape[0], t->shape[1] * 2};
}

Tensor Model::fetched(const std::string& name, const Tensor& stored) const {
  block_params_.record_use(name);  // the first forward learns which block reads it
  // an offloaded block's weight: a view of the offload ring's slot while its block runs (weight_offload.h);
  // a sharded block's: a view of its gathered parameters (param_sharding.h)
  if (offload_) return offload_->use(name, stored);
  if (sharding_) return sharding_->use(name, stored);
  return stored;
}

void Model::check_not_sharded(const char* what) const {
  FLAME_CHECK(!sharding_, FLAME_ERROR_INVALID_ARGUMENT, "cannot ", what, ": the model's block parameters are sharded over ranks "
              "(flame_zero_create stage 3) and hold no memory on their own (flame_zero_gather_params gathers them)");
}

Tensor Model::param(const std::string& name) const {
  const Tensor w = fetched(name, params_.get(name));
  // a quantised linear weight as stored (F8): adapted_linear runs it through ops::quantized_linear
  if (!quantized_.empty() && quantized_.count(name)) return w;
  if (!nf4_.empty() && nf4_.count(name)) return w;  // NF4's packed codes: adapted_linear runs ops::nf4_linear
  return w->dtype == options_.compute_dtype ? w : ops::to_dtype(w, options_.compute_dtype);
}

const Tensor* Model::quantization_scale(const std::string& weight_name) const {
  auto it = quantized_.find(weight_name);
  return it == quantized_.end() ? nullptr : params_.find(it->second);
}

bool Model::is_quantization_scale(const std::string& name) const {
  if (!nf4_.empty())
    for (const char* suffix : {".absmax", ".nested_absmax", ".nested_offset"}) {  // "<module>.weight<suffix>"
      const size_t n = std::char_traits<char>::length(suffix);
      if (name.size() > n && name.compare(name.size() - n, n, suffix) == 0 && nf4_.count(name.substr(0, name.size() - n)))
        return true;
    }
  if (quantized_.empty() || !is_scale_weight_name(name)) return false;
  const std::string weight = name.substr(0, name.size() - std::char_traits<char>::length(".scale_weight")) + ".weight";
  return quantized_.count(weight) != 0;
}

void Model::quantize_linear_weights(const WeightQuantization& q) {
  FLAME_CHECK(q.enabled && !options_.quantize.enabled && quantized_.empty() && nf4_.empty(), FLAME_ERROR_INTERNAL,
              "quantize_linear_weights on a model that is quantised already, or without a quantisation");
  std::vector<std::string> linear;
  for (const LoraCandidate& l : linear_modules()) {
    if (q.nf4()) check_nf4_rows(q, l.module, {l.out_features, l.in_features});  // before anything changes
    linear.push_back(l.module + ".weight");
  }
  std::sort(linear.begin(), linear.end());
  std::vector<std::string> names = params_.names();
  std::vector<Tensor> tensors = params_.tensors();
  params_ = ParamStore();
  if (q.nf4()) options_.quantize = q;  // add_nf4_param reads the block size and double quantisation
  for (size_t i = 0; i < names.size(); ++i) {
    if (!std::binary_search(linear.begin(), linear.end(), names[i])) {
      params_.insert(names[i], tensors[i]);
      continue;
    }
    if (q.nf4()) {
      const Tensor full = tensors[i];
      tensors[i].reset();
      add_nf4_param(names[i], weight_module(names[i]), full->shape);
      ops::nf4_quantize_into(full, nf4_weight(names[i]));  // the full-precision weight goes after this
      continue;
    }
    Tensor w = ops::empty(*ctx_, tensors[i]->shape, q.dtype);
    Tensor s = ops::empty(*ctx_, scale_shape(q.scale, tensors[i]->shape), FLAME_DTYPE_F32);
    quantize_into(tensors[i], w, s);
    tensors[i].reset();  // the full-precision weight goes as soon as its quantisation exists
    const std::string scale = scale_weight_name(names[i]);
    params_.insert(names[i], w);
    params_.insert(scale, s);
    quantized_.emplace(names[i], scale);
  }
  options_.quantize = q;
}

void Model::check_quantized_weights() const {
  if (!options_.quantize.enabled) return;
  const std::vector<LoraCandidate> linear = linear_modules();
  FLAME_CHECK(linear.size() == quantized_.size() + nf4_.size(), FLAME_ERROR_INTERNAL, class_name_, " quantised ",
              quantized_.size() + nf4_.size(), " weights but has ", linear.size(), " linear layers");
  for (const LoraCandidate& l : linear)
    FLAME_CHECK(quantized_.count(l.module + ".weight") || nf4_.count(l.module + ".weight"), FLAME_ERROR_INTERNAL, class_name_,
                ": the linear layer ", l.module, " was not quantised");
}

std::vector<LoraCandidate> Model::linear_modules() const {
  std::vector<LoraCandidate> out;
  const std::string suffix = ".weight";
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string& n = params_.names()[i];
    const Tensor& t = params_.tensors()[i];
    if (t->ndim() != 2 || n.size() <= suffix.size() || n.compare(n.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string module = n.substr(0, n.size() - suffix.size());
    const int64_t in = is_nf4_weight(n) ? t->shape[1] * 2 : t->shape[1];  // NF4: two codes per byte
    if (!is_embedding(module)) out.push_back({module, in, t->shape[0]});
  }
  return out;
}

std::vector<std::string> Model::default_lora_targets(bool kohya) const {
  return models::default_lora_targets(class_name_, config_, kohya ? LoraTargetConvention::Kohya : LoraTargetConvention::DiffusersScripts);
}

const LoraAdapter* Model::find_lora_adapter(const std::string& name) const {
  for (const auto& a : adapters_)
    if (a->name == name) return a.get();
  return nullptr;
}

// A LoKr module of an adapter being added: its factors make a [out, in] product on ctx.
static void check_lokr_module(const LoraModule& m, const LoraCandidate& target, const Context* ctx) {
  FLAME_CHECK(!m.down && !m.up && !m.magnitude && m.lokr_rank >= 1 && (m.lokr_w1 ? !m.lokr_w1_a && !m.lokr_w1_b : m.lokr_w1_a && m.lokr_w1_b) &&
                  (m.lokr_w2 ? !m.lokr_w2_a && !m.lokr_w2_b : m.lokr_w2_a && m.lokr_w2_b),
              FLAME_ERROR_INVALID_ARGUMENT, "LoRA module ", m.module,
              ": a LoKr holds lokr_w1 or lokr_w1_a / _b, and lokr_w2 or lokr_w2_a / _b, nothing else");
  for (const auto& [f, t] : m.lokr_factors())
    FLAME_CHECK(t->ndim() == 2 && &t->ctx() == ctx, FLAME_ERROR_INVALID_ARGUMENT, "LoRA module ", m.module, ": ",
                lokr_factor_name(f), " must be a 2-D tensor of the model's context");
  const LokrShape s = m.lokr_shape();
  const bool inner = (!m.lokr_w1_a || m.lokr_w1_a->shape[1] == m.lokr_w1_b->shape[0]) &&
                     (!m.lokr_w2_a || m.lokr_w2_a->shape[1] == m.lokr_w2_b->shape[0]);
  FLAME_CHECK(inner && s.w1_rows * s.w2_rows == target.out_features && s.w1_cols * s.w2_cols == target.in_features,
              FLAME_ERROR_INVALID_ARGUMENT, "LoRA module ", m.module, ": LoKr factors W1 [", s.w1_rows, ", ", s.w1_cols,
              "] and W2 [", s.w2_rows, ", ", s.w2_cols, "] do not make its weight [", target.out_features, ", ",
              target.in_features, "]");
}

void Model::add_lora_adapter(std::shared_ptr<LoraAdapter> adapter) {
  FLAME_CHECK(adapter && !adapter->name.empty(), FLAME_ERROR_INVALID_ARGUMENT, "LoRA adapter without a name");
  FLAME_CHECK(!find_lora_adapter(adapter->name), FLAME_ERROR_INVALID_ARGUMENT, "the model has a LoRA adapter \"",
              adapter->name, "\" already");
  const std::vector<LoraCandidate> linear = linear_modules();
  for (const LoraModule& m : adapter->modules) {
    const LoraCandidate* target = nullptr;
    for (const LoraCandidate& l : linear)
      if (l.module == m.module) target = &l;
    FLAME_CHECK(target, FLAME_ERROR_INVALID_ARGUMENT, "LoRA module ", m.module, " is not a linear layer of ", class_name_);
    if (m.is_lokr()) {
      check_lokr_module(m, *target, ctx_.get());
      continue;
    }
    FLAME_CHECK(m.down && m.up && m.down->ndim() == 2 && m.up->ndim() == 2 && m.down->shape[1] == target->in_features &&
                    m.up->shape[0] == target->out_features && m.up->shape[1] == m.down->shape[0],
                FLAME_ERROR_INVALID_ARGUMENT, "LoRA module ", m.module, ": A must be [rank, ", target->in_features,
                "] and B [", target->out_features, ", rank]");
    FLAME_CHECK(&m.down->ctx() == ctx_.get() && &m.up->ctx() == ctx_.get(), FLAME_ERROR_INVALID_ARGUMENT,
                "LoRA module ", m.module, " belongs to another context");
    FLAME_CHECK(!m.magnitude || (m.magnitude->ndim() == 1 && m.magnitude->shape[0] == target->out_features &&
                                 &m.magnitude->ctx() == ctx_.get()),
                FLAME_ERROR_INVALID_ARGUMENT, "LoRA module ", m.module, ": DoRA's magnitude must be [",
                target->out_features, "] of the model's context");
  }
  adapters_.push_back(std::move(adapter));
}

void Model::remove_lora_adapter(const std::string& name) {
  for (auto it = adapters_.begin(); it != adapters_.end(); ++it)
    if ((*it)->name == name) {
      adapters_.erase(it);
      return;
    }
  fail(FLAME_ERROR_INVALID_ARGUMENT, "the model has no LoRA adapter \"", name, "\"");
}

const LoraAdapter& add_lora(Model& m, const LoraAdapterOptions& options) {
  FLAME_CHECK(!m.find_lora_adapter(options.name), FLAME_ERROR_INVALID_ARGUMENT, "the model has a LoRA adapter \"",
              options.name, "\" already");
  const std::vector<std::string> targets = options.targets.empty() ? m.default_lora_targets(options.kohya_preset) : options.targets;
  std::shared_ptr<LoraAdapter> adapter = create_lora_adapter(m.ctx(), m.linear_modules(), targets, options);
  if (options.dora)  // peft's DoraLinearLayer.update_layer: m = ||W + scale B A||_row (B = 0: ||W||_row)
    for (LoraModule& lm : adapter->modules) {
      // the weight's value: an fp8 base's weight (quantize option) through its scale
      lm.magnitude = ops::to_dtype(dora_row_norms(weight_value_f32(m, lm.module + ".weight"), lm), options.dtype);
      autograd_meta(*lm.magnitude).requires_grad = true;
    }
  m.add_lora_adapter(adapter);
  if (options.freeze_base)
    for (const Tensor& p : m.params().tensors()) autograd_meta(*p).requires_grad = false;
  return *adapter;
}

void merge_lora(Model& m, const std::string& name) {
  const std::shared_ptr<LoraAdapter>* found = nullptr;
  for (const auto& a : m.lora_adapters())
    if (a->name == name) found = &a;
  FLAME_CHECK(found, FLAME_ERROR_INVALID_ARGUMENT, "the model has no LoRA adapter \"", name, "\"");
  const std::shared_ptr<LoraAdapter> adapter = *found;
  std::vector<Tensor> weights;
  for (const LoraModule& lm : adapter->modules) {
    const Tensor* w = m.params().find(lm.module + ".weight");
    FLAME_CHECK(w, FLAME_ERROR_INVALID_ARGUMENT, "LoRA module ", lm.module, " has no weight in ", m.class_name());
    FLAME_CHECK(!m.is_nf4_weight(lm.module + ".weight"), FLAME_ERROR_INVALID_ARGUMENT, "LoRA merge: the weight of ", lm.module,
                " is a frozen NF4 base (\"quantize\": {\"dtype\": \"nf4\"}), which a merge cannot write without "
                "quantising the adapter into it; merge into a model loaded without \"quantize\", or keep the adapter beside it");
    const DType d = (*w)->dtype;
    FLAME_CHECK(d == FLAME_DTYPE_F32 || d == FLAME_DTYPE_BF16 || d == FLAME_DTYPE_F16 || d == FLAME_DTYPE_F64,
                FLAME_ERROR_INVALID_ARGUMENT, "LoRA merge: the weight of ", lm.module, " is ", dtype_name(d),
                ", not a float dtype a merge can write");
    weights.push_back(*w);
  }
  // One module at a time (f32 temporaries of one weight). A device failure part way leaves the
  // modules merged so far merged and out of the adapter, so the model computes the same function.
  size_t done = 0;
  try {
    for (; done < adapter->modules.size(); ++done) {
      const Tensor merged = merged_lora_weight(*adapter, adapter->modules[done], weights[done]);
      ops::copy_into(weights[done], ops::to_dtype(merged, weights[done]->dtype));
    }
  } catch (...) {
    adapter->modules.erase(adapter->modules.begin(), adapter->modules.begin() + static_cast<std::ptrdiff_t>(done));
    throw;
  }
  m.remove_lora_adapter(name);
}

namespace {
Tensor activate(const Tensor& y, ops::Activation act) {
  switch (act) {
    case ops::Activation::None: return y;
    case ops::Activation::Relu: return ops::unary(OpId::Relu, y);
    case ops::Activation::GeluTanh: return ops::unary(OpId::GeluTanh, y);
  }
  fail(FLAME_ERROR_INTERNAL, "unknown activation of a linear layer");
}
}  // namespace

Tensor weight_value_f32(const Model& m, const std::string& weight_name) {
  const Tensor& w = m.params().get(weight_name);
  if (m.is_nf4_weight(weight_name)) return ops::nf4_dequantize(m.nf4_weight(weight_name), FLAME_DTYPE_F32);
  if (const Tensor* scale = m.quantization_scale(weight_name)) return dequantize(w, *scale, FLAME_DTYPE_F32);
  return w;
}

Tensor Model::adapted_linear(const Tensor& x, const std::string& module, const Tensor& weight, const Tensor& bias,
                             ops::Activation act) const {
  std::vector<std::pair<const LoraAdapter*, const LoraModule*>> terms;
  bool dora = false;
  for (const auto& a : adapters_)
    if (const LoraModule* m = a->find(module)) {
      terms.emplace_back(a.get(), m);
      dora = dora || m->magnitude;
    }
  // A quantised weight arrives as stored (param()): the layer keeps it, not a dequantised copy, for backward.
  const bool quantized = weight->dtype == FLAME_DTYPE_F8_E4M3 || weight->dtype == FLAME_DTYPE_F8_E5M2;
  Tensor scale;  // fetched as the weight was: an offloaded or sharded block's scale lives in its slot
  if (quantized) {
    auto it = quantized_.find(module + ".weight");
    if (it != quantized_.end()) scale = fetched(it->second, params_.get(it->second));
  }
  FLAME_CHECK(!quantized || scale, FLAME_ERROR_INTERNAL, "the F8 weight of ", module, " is not a quantised parameter of ",
              class_name_);
  // An NF4 weight arrives as its packed codes (param()); its statistics are fetched beside it.
  const bool nf4 = !nf4_.empty() && weight->dtype == FLAME_DTYPE_U8 && is_nf4_weight(module + ".weight");
  ops::Nf4Weight nf4_base;
  if (nf4) {
    nf4_base = fetched_nf4(module + ".weight");
    nf4_base.packed = weight;
  }
  if (terms.empty()) {
    if (nf4) return ops::nf4_linear(x, nf4_base, bias, act);
    return scale ? ops::quantized_linear(x, weight, scale, bias, act) : ops::linear(x, weight, bias, act);
  }
  LoraBaseLinear base_linear;
  base_linear.bias = bias;
  if (nf4) {
    base_linear.nf4 = nf4_base;
    if (dora) base_linear.weight = ops::nf4_dequantize(nf4_base, options_.compute_dtype);
    base_linear.output = ops::nf4_linear(x, nf4_base, bias);
  } else if (scale) {
    base_linear.quantized = weight;
    base_linear.scale = scale;
    // DoRA's norms read the weight's value: dequantised here as param() did before, for this call only
    if (dora) base_linear.weight = dequantize(weight, scale, options_.compute_dtype);
    base_linear.output = ops::quantized_linear(x, weight, scale, bias);
  } else {
    base_linear.weight = weight;
    base_linear.output = ops::linear(x, weight, bias, ops::Activation::None);
  }
  Tensor y = base_linear.output;
  for (const auto& [adapter, m] : terms) y = ops::add(y, lora_delta(*adapter, *m, x, base_linear, training_));
  return activate(y, act);
}

Tensor Model::to_compute(const Tensor& t) const {
  if (!t || t->dtype == options_.compute_dtype || !is_floating(t->dtype)) return t;
  return ops::to_dtype(t, options_.compute_dtype);
}

const Tensor& Model::input(const NamedTensors& inputs, const std::string& name) {
  const Tensor* t = optional_input(inputs, name);
  FLAME_CHECK(t, FLAME_ERROR_INVALID_ARGUMENT, "input \"", name, "\" is missing");
  return *t;
}

const Tensor* Model::optional_input(const NamedTensors& inputs, const std::string& name) {
  for (const auto& [n, t] : inputs)
    if (n == name) return &t;
  return nullptr;
}

NamedTensors Model::forward(const NamedTensors& inputs) {
  const std::vector<std::string> required = required_inputs(), optional = optional_inputs();
  auto listed = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& n : v) s += (s.empty() ? "" : ", ") + n;
    return s.empty() ? std::string("none") : s;
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string& n = inputs[i].first;
    const bool known = std::count(required.begin(), required.end(), n) || std::count(optional.begin(), optional.end(), n);
    FLAME_CHECK(known, FLAME_ERROR_INVALID_ARGUMENT, class_name_, " takes no input \"", n, "\" (required: ",
                listed(required), "; optional: ", listed(optional), ")");
    for (size_t j = 0; j < i; ++j)
      FLAME_CHECK(inputs[j].first != n, FLAME_ERROR_INVALID_ARGUMENT, "input \"", n, "\" is given twice");
    FLAME_CHECK(inputs[i].second, FLAME_ERROR_INVALID_ARGUMENT, "input \"", n, "\" is NULL");
    FLAME_CHECK(&inputs[i].second->ctx() == ctx_.get(), FLAME_ERROR_INVALID_ARGUMENT, "input \"", n,
                "\" belongs to another context");
  }
  for (const auto& n : required) input(inputs, n);
  block_params_.begin_forward();
  NamedTensors out = run(inputs);
  block_params_.end_forward();
  if (offload_) offload_->end_forward(block_params_, params_.names(), params_.tensors());
  return out;
}

void Model::initialize() {
  // Linear / conv weights N(0, 0.02) (transformers' initializer_range), norm scales 1, biases and
  // everything else 0: the distributions the reference classes use, up to their per-layer scales.
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string& name = params_.names()[i];
    const Tensor& p = params_.tensors()[i];
    auto ends_with = [&](const char* s) {
      const size_t n = std::char_traits<char>::length(s);
      return name.size() >= n && name.compare(name.size() - n, n, s) == 0;
    };
    const bool is_norm = name.find("norm") != std::string::npos || name.find("ln_") != std::string::npos;
    if (ends_with(".bias")) {
      ops::fill_(p, 0.0);
    } else if (is_norm && p->ndim() == 1) {
      ops::fill_(p, 1.0);
    } else {
      Tensor r = ops::mul_scalar(ops::randn(*ctx_, p->shape, FLAME_DTYPE_F32), 0.02);
      ops::copy_into(p, r);
    }
  }
}

std::vector<Tensor> Model::run_block(int64_t block_index,
                                     const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& block,
                                     const std::vector<Tensor>& inputs, int32_t n_outputs) {
  if (n_outputs < 0) n_outputs = static_cast<int32_t>(inputs.size());
  BlockLearnScope learn(block_params_, block_index);
  if ((offload_ && offload_->fetch()) || sharding_) return run_fetched_block(block_index, block, inputs, n_outputs);
  if (!checkpoint_.applies_to(block_index) || !ctx_->mode.grad_enabled) {
    std::vector<Tensor> out = block(inputs);
    FLAME_CHECK(static_cast<int32_t>(out.size()) == n_outputs, FLAME_ERROR_INTERNAL, "a block returned ", out.size(),
                " tensors, not ", n_outputs);
    return out;
  }
  // The recomputation may run after forward() returned: the function keeps the model (whose
  // parameters the block reads) alive, and checks the block's output count again.
  std::shared_ptr<const Model> keep = shared_from_this();
  CheckpointFunction fn = [keep, block, n_outputs](const std::vector<Tensor>& x) {
    std::vector<Tensor> out = block(x);
    FLAME_CHECK(static_cast<int32_t>(out.size()) == n_outputs, FLAME_ERROR_INTERNAL, "a block returned ", out.size(),
                " tensors, not ", n_outputs);
    return out;
  };
  return checkpoint(*ctx_, std::move(fn), inputs);
}

std::vector<Tensor> Model::run_fetched_block(int64_t block_index,
                                             const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& block,
                                             const std::vector<Tensor>& inputs, int32_t n_outputs) {
  // The block's body runs inside a fetch scope (its weights fetched into a ring slot or gathered);
  // a fetched block is checkpointed whenever a graph is recorded, so that its forward keeps no
  // weight and its recompute in backward (grad mode on) fetches them again, in reverse order.
  std::shared_ptr<BlockFetch> fetch = offload_ ? offload_->fetch() : nullptr;
  std::shared_ptr<ParamSharding> sharding = sharding_;
  auto body = [fetch, sharding, block, block_index, n_outputs](const std::vector<Tensor>& x, bool recompute) {
    std::vector<Tensor> out;
    if (sharding) {
      ShardedBlockScope scope(*sharding, block_index, recompute);
      out = block(x);
    } else {
      FetchedBlockScope scope(*fetch, block_index, recompute);
      out = block(x);
    }
    FLAME_CHECK(static_cast<int32_t>(out.size()) == n_outputs, FLAME_ERROR_INTERNAL, "a block returned ", out.size(),
                " tensors, not ", n_outputs);
    return out;
  };
  const bool fetched_block = sharding ? sharding->shards(block_index) : fetch->fetches(block_index);
  const bool checkpointed = checkpoint_.applies_to(block_index) || fetched_block;
  if (!checkpointed || !ctx_->mode.grad_enabled) return body(inputs, false);
  std::shared_ptr<const Model> keep = shared_from_this();
  CheckpointFunction fn = [keep, body](const std::vector<Tensor>& x) { return body(x, keep->ctx().mode.grad_enabled); };
  return checkpoint(*ctx_, std::move(fn), inputs);
}

// ---- config readers ----

namespace {
const nlohmann::json* config_value(const nlohmann::json& cfg, const char* key) {
  if (!cfg.is_object()) return nullptr;
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return nullptr;
  return &*it;
}
}  // namespace

int64_t config_int(const nlohmann::json& cfg, const char* key, int64_t fallback) {
  const nlohmann::json* v = config_value(cfg, key);
  if (!v) return fallback;
  FLAME_CHECK(v->is_number_integer(), FLAME_ERROR_INVALID_ARGUMENT, "config: \"", key, "\" must be an integer");
  return v->get<int64_t>();
}

double config_real(const nlohmann::json& cfg, const char* key, double fallback) {
  const nlohmann::json* v = config_value(cfg, key);
  if (!v) return fallback;
  FLAME_CHECK(v->is_number(), FLAME_ERROR_INVALID_ARGUMENT, "config: \"", key, "\" must be a number");
  return v->get<double>();
}

bool config_bool(const nlohmann::json& cfg, const char* key, bool fallback) {
  const nlohmann::json* v = config_value(cfg, key);
  if (!v) return fallback;
  FLAME_CHECK(v->is_boolean(), FLAME_ERROR_INVALID_ARGUMENT, "config: \"", key, "\" must be true or false");
  return v->get<bool>();
}

std::string config_string(const nlohmann::json& cfg, const char* key, const std::string& fallback) {
  const nlohmann::json* v = config_value(cfg, key);
  if (!v) return fallback;
  FLAME_CHECK(v->is_string(), FLAME_ERROR_INVALID_ARGUMENT, "config: \"", key, "\" must be a string");
  return v->get<std::string>();
}

std::vector<int64_t> config_ints(const nlohmann::json& cfg, const char* key, const std::vector<int64_t>& fallback) {
  const nlohmann::json* v = config_value(cfg, key);
  if (!v) return fallback;
  std::vector<int64_t> out;
  if (v->is_number_integer()) return {v->get<int64_t>()};
  FLAME_CHECK(v->is_array(), FLAME_ERROR_INVALID_ARGUMENT, "config: \"", key, "\" must be a list of integers");
  for (const auto& e : *v) {
    FLAME_CHECK(e.is_number_integer(), FLAME_ERROR_INVALID_ARGUMENT, "config: \"", key,
                "\" must be a list of integers");
    out.push_back(e.get<int64_t>());
  }
  return out;
}

// ---- registry ----

std::vector<std::string> model_class_names() {
  std::vector<std::string> names;
  for (const ModelFactory& f : model_factories()) names.push_back(f.class_name);
  return names;
}

std::shared_ptr<Model> create_model(Context& ctx, const std::string& class_name, const nlohmann::json& config,
                                    const ModelOptions& options) {
  FLAME_CHECK(config.is_null() || config.is_object(), FLAME_ERROR_INVALID_ARGUMENT, "config must be a JSON object");
  for (const ModelFactory& f : model_factories())
    if (class_name == f.class_name) {
      std::shared_ptr<Model> m = f.create(ctx, config, options);
      m->check_quantized_weights();
      return m;
    }
  std::string known;
  for (const auto& n : model_class_names()) known += (known.empty() ? "" : ", ") + n;
  fail(FLAME_ERROR_INVALID_ARGUMENT, "unknown architecture \"", class_name, "\" (known: ", known, ")");
}

std::shared_ptr<Model> create_initialized_model(Context& ctx, const std::string& class_name, const nlohmann::json& config,
                                                const ModelOptions& options) {
  ModelOptions full = options;
  full.quantize = WeightQuantization{};
  std::shared_ptr<Model> m = create_model(ctx, class_name, config, full);
  m->initialize();
  if (options.quantize.enabled) m->quantize_linear_weights(options.quantize);
  return m;
}

}  // namespace flame::models

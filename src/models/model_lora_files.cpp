// LoRA files of a model's adapters: lora_format.h's plans executed with tensors (model_lora_files.h).
#include "models/model_lora_files.h"
#include <cmath>
#include "core/error.h"
#include "models/checkpoint_files.h"
#include "ops/ops.h"
#include "tensor/autograd_graph.h"

namespace flame::models {

std::string default_lora_component(const Model& m) {
  const std::string& c = m.class_name();
  if (c == "UNet2DConditionModel") return "unet";
  if (c == "FluxTransformer2DModel" || c == "SD3Transformer2DModel") return "transformer";
  if (c == "AutoencoderKL") return "vae";
  if (c == "CLIPTextModel") return "text_encoder";
  return "text_encoder_2";  // CLIPTextModelWithProjection; T5EncoderModel in Flux pipelines
}

namespace {

const nlohmann::json& checked_object(const nlohmann::json& options, const std::vector<std::string>& keys) {
  if (options.is_null()) return options;
  FLAME_CHECK(options.is_object(), FLAME_ERROR_INVALID_ARGUMENT, "LoRA file options must be a JSON object");
  for (auto it = options.begin(); it != options.end(); ++it) {
    bool known = false;
    std::string list;
    for (const std::string& k : keys) {
      known = known || it.key() == k;
      list += (list.empty() ? "" : ", ") + k;
    }
    FLAME_CHECK(known, FLAME_ERROR_INVALID_ARGUMENT, "LoRA file options: unknown key \"", it.key(), "\" (known: ", list, ")");
  }
  return options;
}

std::string string_option(const nlohmann::json& o, const char* key) {
  FLAME_CHECK(o[key].is_string(), FLAME_ERROR_INVALID_ARGUMENT, "LoRA file options: \"", key, "\" must be a string");
  return o[key].get<std::string>();
}

// Rows [begin, begin + n) and, for 2-D, columns [col, col + cols) of t: a view.
Tensor block_of(const Tensor& t, int64_t row, int64_t rows, int64_t col, int64_t cols) {
  return ops::narrow(ops::narrow(t, 0, row, rows), 1, col, cols);
}

// x with the two halves of its rows exchanged (a new tensor).
Tensor swap_row_halves(const Tensor& x) {
  const int64_t h = x->shape[0] / 2;
  FLAME_CHECK(x->shape[0] % 2 == 0, FLAME_ERROR_INTERNAL, "swapping the halves of an odd row count");
  return ops::cat({ops::narrow(x, 0, h, h), ops::narrow(x, 0, 0, h)}, 0);
}

// A DoRA magnitude piece's values [rows] in f32: the module's magnitude, or the row norms of its
// weight with the adapter's LoRA on it (W alone when the adapter does not cover it).
Tensor magnitude_piece(const Model& model, const LoraAdapter& adapter, const LoraTensorPiece& p) {
  const LoraModule* m = adapter.find(p.module);
  Tensor v;
  if (!p.adapted_row_norms) {
    FLAME_CHECK(m && m->magnitude, FLAME_ERROR_INTERNAL, "the LoRA save plan names DoRA module ", p.module,
                " the adapter lacks");
    v = ops::to_dtype(m->magnitude, FLAME_DTYPE_F32);
  } else if (m) {
    v = dora_row_norms(weight_value_f32(model, p.module + ".weight"), *m);  // an fp8 base through its scale
  } else {
    const Tensor w = weight_value_f32(model, p.module + ".weight");
    v = ops::norm(ops::to_dtype(w, FLAME_DTYPE_F32), 2.0, {1}, false);
  }
  return p.swap_halves ? swap_row_halves(v) : v;
}

// The stored tensor of a save plan, built from the adapter's modules.
Tensor build_stored(const Model& model, const LoraAdapter& adapter, const LoraStoredTensor& s, DType dtype) {
  Context& ctx = model.ctx();
  if (s.kind == LoraTensorKind::Alpha) return ops::scalar(ctx, s.alpha, FLAME_DTYPE_F32);
  Shape shape(s.shape.begin(), s.shape.end());
  Tensor out = ops::zeros(ctx, shape, dtype);
  if (s.kind == LoraTensorKind::Lokr) {
    for (const LoraTensorPiece& p : s.pieces) {
      const LoraModule* m = adapter.find(p.module);
      FLAME_CHECK(m && m->is_lokr(), FLAME_ERROR_INTERNAL, "the LoRA save plan names LoKr module ", p.module, " the adapter lacks");
      Tensor factor;
      for (const auto& [f, t] : m->lokr_factors())
        if (f == s.factor) factor = t;
      FLAME_CHECK(factor && factor->shape == out->shape, FLAME_ERROR_INTERNAL, "LoKr module ", p.module, ": no ",
                  lokr_factor_name(s.factor), " of the planned shape");
      if (p.scale != 1.0) factor = ops::mul_scalar(ops::to_dtype(factor, FLAME_DTYPE_F32), p.scale);
      ops::copy_into(out, ops::to_dtype(factor, dtype));
    }
    return out;
  }
  if (s.kind == LoraTensorKind::Magnitude) {
    const Tensor rows = ops::reshape(out, {shape[0]});
    for (const LoraTensorPiece& p : s.pieces)
      ops::copy_into(ops::narrow(rows, 0, p.row_begin, p.rows), ops::to_dtype(magnitude_piece(model, adapter, p), dtype));
    return out;
  }
  for (const LoraTensorPiece& p : s.pieces) {
    const LoraModule* m = adapter.find(p.module);
    FLAME_CHECK(m, FLAME_ERROR_INTERNAL, "the LoRA save plan names module ", p.module, " the adapter lacks");
    if (s.kind == LoraTensorKind::Down) {
      ops::copy_into(ops::narrow(out, 0, p.row_begin, p.rows), ops::to_dtype(m->down, dtype));
    } else {
      Tensor up = p.swap_halves ? swap_row_halves(m->up) : m->up;
      if (p.scale != 1.0) up = ops::mul_scalar(ops::to_dtype(up, FLAME_DTYPE_F32), p.scale);
      ops::copy_into(block_of(out, p.row_begin, p.rows, p.col_begin, p.cols), ops::to_dtype(up, dtype));
    }
  }
  return out;
}

// The value of a file's 0-d (or [1]) alpha tensor.
double read_alpha(const CheckpointFiles& file, const std::string& path, const std::string& key, Context& ctx) {
  Tensor a = ops::empty(ctx, {1}, FLAME_DTYPE_F64);
  file.read_into(key, a);
  double value = 0;
  ops::to_host(a, &value, sizeof value);
  FLAME_CHECK(std::isfinite(value), FLAME_ERROR_INVALID_FORMAT, path, ": ", key, " is not finite");
  return value;
}

// A LoKr module of a load plan: its factors as stored, alpha from the file (scale 1 without one, and
// always when both factors are whole, as LyCORIS and ComfyUI).
LoraModule read_lokr_module(const CheckpointFiles& file, const std::string& path, const LoraModuleSource& src,
                            const LoraLoadOptions& options, Context& ctx) {
  LoraModule lm;
  lm.module = src.module;
  lm.lokr_rank = src.rank;
  lm.alpha = src.alpha_key.empty() ? src.alpha : read_alpha(file, path, src.alpha_key, ctx);
  for (const auto& [f, key] : src.lokr_keys) {
    const std::vector<int64_t> dims = src.lokr_shape.factor_shape(f, src.rank);
    Tensor t = ops::empty(ctx, Shape(dims.begin(), dims.end()), options.dtype);
    file.read_into(key, t);
    autograd_meta(*t).requires_grad = options.trainable;
    switch (f) {
      case LokrFactor::W1: lm.lokr_w1 = t; break;
      case LokrFactor::W1A: lm.lokr_w1_a = t; break;
      case LokrFactor::W1B: lm.lokr_w1_b = t; break;
      case LokrFactor::W2: lm.lokr_w2 = t; break;
      case LokrFactor::W2A: lm.lokr_w2_a = t; break;
      case LokrFactor::W2B: lm.lokr_w2_b = t; break;
    }
  }
  return lm;
}

}  // namespace

LoraFileOptions parse_lora_file_options(const nlohmann::json& options) {
  LoraFileOptions o;
  const nlohmann::json& j = checked_object(options, {"format", "component", "dtype", "metadata"});
  if (j.is_null()) return o;
  if (j.contains("format")) {
    const std::string f = string_option(j, "format");
    FLAME_CHECK(f == "kohya" || f == "peft" || f == "diffusers", FLAME_ERROR_INVALID_ARGUMENT,
                "LoRA file options: \"format\" is \"", f, "\", not kohya or peft (diffusers)");
    o.format = f == "kohya" ? LoraFileFormat::Kohya : LoraFileFormat::Peft;
  }
  if (j.contains("component")) o.component = string_option(j, "component");
  if (j.contains("dtype")) o.dtype = float_dtype_from_name(string_option(j, "dtype"), "dtype");
  if (j.contains("metadata")) {
    FLAME_CHECK(j["metadata"].is_object(), FLAME_ERROR_INVALID_ARGUMENT, "LoRA file options: \"metadata\" must be an object");
    for (auto it = j["metadata"].begin(); it != j["metadata"].end(); ++it) {
      FLAME_CHECK(it.value().is_string(), FLAME_ERROR_INVALID_ARGUMENT, "LoRA file options: metadata \"", it.key(),
                  "\" must be a string");
      o.metadata[it.key()] = it.value().get<std::string>();
    }
  }
  return o;
}

LoraFileContents lora_file_contents(const Model& m, const LoraAdapter& adapter, const LoraFileOptions& options) {
  std::vector<LoraModuleShape> shapes;
  for (const LoraModule& lm : adapter.modules)
    FLAME_CHECK(!lm.magnitude || adapter.multiplier == 1.0, FLAME_ERROR_INVALID_ARGUMENT, "LoRA adapter \"", adapter.name,
                "\" has DoRA modules and multiplier ", adapter.multiplier,
                ": a file's alpha cannot express a DoRA multiplier (merge it, or save with multiplier 1)");
  for (const LoraModule& lm : adapter.modules) {
    if (lm.is_lokr()) {
      LoraModuleShape s;
      s.module = lm.module;
      s.rank = lm.rank();
      s.lokr_shape = lm.lokr_shape();
      s.in_features = s.lokr_shape.w1_cols * s.lokr_shape.w2_cols;
      s.out_features = s.lokr_shape.w1_rows * s.lokr_shape.w2_rows;
      s.alpha = lm.scale() * adapter.multiplier * static_cast<double>(lm.rank());  // alpha / rank = the file's scale
      s.lokr = true;
      shapes.push_back(std::move(s));
      continue;
    }
    shapes.push_back({lm.module, lm.rank(), lm.down->shape[1], lm.up->shape[0], lm.alpha * adapter.multiplier, lm.magnitude != nullptr});
  }
  const std::string component = options.component.empty() ? default_lora_component(m) : options.component;
  const LoraSavePlan plan = plan_lora_save(m.class_name(), m.config(), component, shapes, options.format);
  LoraFileContents out;
  for (const LoraStoredTensor& s : plan.tensors) out.tensors.emplace_back(s.key, build_stored(m, adapter, s, options.dtype));
  std::map<std::string, std::string> metadata = plan.metadata;
  for (const auto& [k, v] : options.metadata) metadata[k] = v;
  out.metadata.assign(metadata.begin(), metadata.end());
  return out;
}

LoraLoadOptions parse_lora_load_options(const nlohmann::json& options) {
  LoraLoadOptions o;
  const nlohmann::json& j = checked_object(options, {"name", "component", "multiplier", "dtype", "trainable"});
  if (j.is_null()) return o;
  if (j.contains("name")) {
    o.name = string_option(j, "name");
    FLAME_CHECK(!o.name.empty(), FLAME_ERROR_INVALID_ARGUMENT, "LoRA file options: \"name\" is empty");
  }
  if (j.contains("component")) o.component = string_option(j, "component");
  if (j.contains("multiplier")) {
    FLAME_CHECK(j["multiplier"].is_number() && std::isfinite(j["multiplier"].get<double>()), FLAME_ERROR_INVALID_ARGUMENT,
                "LoRA file options: \"multiplier\" must be a finite number");
    o.multiplier = j["multiplier"].get<double>();
  }
  if (j.contains("dtype")) o.dtype = float_dtype_from_name(string_option(j, "dtype"), "dtype");
  if (j.contains("trainable")) {
    FLAME_CHECK(j["trainable"].is_boolean(), FLAME_ERROR_INVALID_ARGUMENT, "LoRA file options: \"trainable\" must be true or false");
    o.trainable = j["trainable"].get<bool>();
  }
  return o;
}

std::shared_ptr<LoraAdapter> read_lora_file(const Model& m, const std::string& path, const LoraLoadOptions& options) {
  const CheckpointFiles file = CheckpointFiles::open(path);
  const std::string component = options.component.empty() ? default_lora_component(m) : options.component;
  const LoraLoadPlan plan = plan_lora_load(m.class_name(), m.config(), component, file.keys(), file.metadata());
  FLAME_CHECK(!plan.modules.empty(), FLAME_ERROR_INVALID_FORMAT, path, " holds no LoRA for the ", component, " (",
              m.class_name(), ")");
  Context& ctx = m.ctx();
  auto adapter = std::make_shared<LoraAdapter>();
  adapter->name = options.name;
  adapter->multiplier = options.multiplier;
  for (const LoraModuleSource& src : plan.modules) {
    if (src.lokr) {
      adapter->modules.push_back(read_lokr_module(file, path, src, options, ctx));
      continue;
    }
    LoraModule lm;
    lm.module = src.module;
    lm.down = ops::empty(ctx, {src.rank, src.in_features}, options.dtype);
    file.read_into(src.down.key, lm.down, src.down.row_begin, src.down.rows);
    Tensor up = ops::empty(ctx, {src.out_features, src.rank}, options.dtype);
    file.read_into(src.up.key, up, src.up.row_begin, src.up.rows);
    lm.up = src.up.swap_halves ? swap_row_halves(up) : up;
    lm.alpha = src.alpha;
    if (!src.magnitude.key.empty()) {
      Tensor magnitude = ops::empty(ctx, {src.out_features}, options.dtype);
      file.read_into(src.magnitude.key, magnitude, src.magnitude.row_begin, src.magnitude.rows);
      lm.magnitude = src.magnitude.swap_halves ? swap_row_halves(magnitude) : magnitude;
      autograd_meta(*lm.magnitude).requires_grad = options.trainable;
    }
    if (!src.alpha_key.empty()) lm.alpha = read_alpha(file, path, src.alpha_key, ctx);
    autograd_meta(*lm.down).requires_grad = options.trainable;
    autograd_meta(*lm.up).requires_grad = options.trainable;
    adapter->modules.push_back(std::move(lm));
  }
  // The model's module order (plan order is the file's key order).
  const std::vector<LoraCandidate> order = m.linear_modules();
  std::vector<LoraModule> sorted;
  for (const LoraCandidate& c : order)
    for (LoraModule& lm : adapter->modules)
      if (lm.module == c.module) sorted.push_back(std::move(lm));
  FLAME_CHECK(sorted.size() == adapter->modules.size(), FLAME_ERROR_INVALID_FORMAT, path,
              " has a LoRA for a module that is not a linear layer of ", m.class_name());
  adapter->modules = std::move(sorted);
  return adapter;
}

}  // namespace flame::models

// C entry points: models (flame.h "Models").
//
// A flame_model_t owns one models::Model (src/models/model.h) and a reference to its context.
// Parameters and forward outputs leave as flame_params_t lists (api/params_list.h), inputs arrive as
// one. JSON arguments are parsed with nlohmann-json; a parse error is FLAME_ERROR_INVALID_ARGUMENT
// naming the argument and the byte where it failed. A released model is emptied, marked dead and
// parked in its context's dead_objects, so that passing it again reports FLAME_ERROR_INVALID_HANDLE.
#include <memory>
#include <optional>
#include <string>
#include <nlohmann/json.hpp>
#include "api/guard.h"
#include "api/params_list.h"
#include "api/safetensors_files.h"
#include "api/toolkit_args.h"
#include "models/model.h"
#include "models/model_loader.h"
#include "models/model_lora_files.h"
#include "models/original_layout.h"
#include "models/quantized_files.h"
#include "ops/ops.h"

namespace flame {
constexpr uint64_t kModelMagic = 0xF1A3E30DE1000001ull;
constexpr size_t kModelDeadKept = 4096;
}  // namespace flame

struct flame_model_s {
  uint64_t magic = flame::kDeadMagic;
  std::shared_ptr<flame::Context> ctx;
  std::shared_ptr<flame::models::Model> model;
  std::string architecture;
  std::string config_text;
};

using namespace flame;

namespace {

flame_model_s& model_of(flame_model_t m) {
  FLAME_CHECK(m, FLAME_ERROR_INVALID_ARGUMENT, "model is NULL");
  FLAME_CHECK(m->magic == kModelMagic, FLAME_ERROR_INVALID_HANDLE, "model is not a live model (released already?)");
  return *m;
}

// The parameters an original layout places (a quantised model's scales are added by
// models::original_scales beside the weights they scale).
std::vector<models::KeyShape> param_shapes(const models::Model& model) {
  const models::ParamStore& store = model.params();
  std::vector<models::KeyShape> out;
  for (size_t i = 0; i < store.size(); ++i)
    if (!model.is_quantization_scale(store.names()[i])) out.push_back({store.names()[i], store.tensors()[i]->shape});
  return out;
}

// One stored tensor of an original-layout file from the parameters: each piece (transposed, halves
// exchanged, reshaped to its rows' shape as the plan says) concatenated along dim 0 on the device.
Tensor stored_tensor(const models::ParamStore& store, const models::OriginalTensor& st) {
  std::vector<Tensor> parts;
  for (const models::OriginalPiece& p : st.pieces) {
    Tensor t = store.get(p.parameter);
    if (p.transposed) t = ops::transpose(t, 0, 1);
    if (p.swap_halves) {
      const int64_t h = t->shape[0] / 2;
      t = ops::cat({ops::narrow(t, 0, h, h), ops::narrow(t, 0, 0, h)}, 0);
    }
    Shape rows_shape = st.shape;
    if (!rows_shape.empty()) rows_shape[0] = p.rows;
    if (t->shape != rows_shape) t = ops::reshape(ops::contiguous(t), rows_shape);
    parts.push_back(t);
  }
  return parts.size() == 1 ? parts.front() : ops::cat(parts, 0);
}

// The plan's tensors, then the scales of quantised weights (ComfyUI's "<module>.scale_weight").
void save_original_layout(Context& c, const std::string& path, const models::Model& model,
                          const models::OriginalSavePlan& plan, const std::vector<models::OriginalScale>& scales) {
  const models::ParamStore& store = model.params();
  GradMode no_grad = c.mode;
  no_grad.grad_enabled = false;
  GradModeGuard guard(c, no_grad);
  std::vector<st::TensorEntry> entries(plan.tensors.size() + scales.size());
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    entries[i].name = plan.tensors[i].name;
    entries[i].dtype = store.get(plan.tensors[i].pieces.at(0).parameter)->dtype;
    entries[i].shape = plan.tensors[i].shape;
  }
  for (size_t k = 0; k < scales.size(); ++k) {
    st::TensorEntry& e = entries[plan.tensors.size() + k];
    e.name = scales[k].name;
    e.dtype = FLAME_DTYPE_F32;
    e.shape = scales[k].shape;
  }
  save_safetensors_streamed(
      c, path, entries,
      [&](size_t i) {
        return i < plan.tensors.size() ? stored_tensor(store, plan.tensors[i])
                                       : models::original_scale_tensor(model, plan, scales[i - plan.tensors.size()]);
      },
      {{"format", "pt"}, {"flame_layout", plan.layout}});
}

nlohmann::json json_arg(const char* text, const char* name) {
  if (!text) return nlohmann::json();
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail(FLAME_ERROR_INVALID_ARGUMENT, name, " is not valid JSON (byte ", e.byte, ")");
  }
}

}  // namespace

std::shared_ptr<models::Model> flame::model_ref(flame_model_t m, const char* arg) {
  FLAME_CHECK(m, FLAME_ERROR_INVALID_ARGUMENT, arg, " is NULL");
  FLAME_CHECK(m->magic == kModelMagic && m->model, FLAME_ERROR_INVALID_HANDLE, arg, " is not a live model (released already?)");
  return m->model;
}

extern "C" {

FLAME_API flame_status_t flame_model_known_architectures(const char** names) {
  return api_call("flame_model_known_architectures", [&] {
    auto* out = out_param(names, "names");
    static const std::string kNames = nlohmann::json(models::model_class_names()).dump();
    *out = kNames.c_str();
  });
}

FLAME_API flame_status_t flame_model_create(flame_ctx_t ctx, const char* architecture, const char* config_json,
                                            const char* options_json, flame_model_t* model) {
  return api_call("flame_model_create", [&] {
    out_param(model, "model");
    Context& c = context_of(ctx);
    FLAME_CHECK(architecture, FLAME_ERROR_INVALID_ARGUMENT, "architecture is NULL");
    const nlohmann::json config = json_arg(config_json, "config_json");
    const nlohmann::json options = json_arg(options_json, "options_json");
    const models::ModelOptions o = models::parse_model_options(options);
    ContextScope scope(c);
    c.check_alive();
    auto m = std::make_unique<flame_model_s>();
    m->ctx = c.shared_from_this();
    m->model = models::create_initialized_model(c, architecture, config, o);
    m->architecture = m->model->class_name();
    m->config_text = m->model->config().dump();
    m->magic = kModelMagic;
    *model = m.release();
  });
}

FLAME_API flame_status_t flame_model_load(flame_ctx_t ctx, const char* path, const char* options_json, flame_model_t* model) {
  return api_call("flame_model_load", [&] {
    out_param(model, "model");
    Context& c = context_of(ctx);
    FLAME_CHECK(path, FLAME_ERROR_INVALID_ARGUMENT, "path is NULL");
    const nlohmann::json options = json_arg(options_json, "options_json");
    ContextScope scope(c);
    c.check_alive();
    c.forbid_in_capture("loading a model");
    auto m = std::make_unique<flame_model_s>();
    m->ctx = c.shared_from_this();
    m->model = models::load_model(c, path, options);
    m->architecture = m->model->class_name();
    m->config_text = m->model->config().dump();
    m->magic = kModelMagic;
    *model = m.release();
  });
}

FLAME_API void flame_model_release(flame_model_t model) {
  if (!model || model->magic != kModelMagic) return;
  std::shared_ptr<Context> keep = std::move(model->ctx);  // the context outlives this function
  std::lock_guard<std::recursive_mutex> lock(keep->mutex);
  model->magic = kDeadMagic;
  model->model.reset();
  try {
    keep->dead_objects.push_back(std::shared_ptr<flame_model_s>(model));
    if (keep->dead_objects.size() > kModelDeadKept) keep->dead_objects.pop_front();
  } catch (...) {  // out of host memory: shared_ptr's constructor deleted the handle
  }
}

FLAME_API flame_status_t flame_model_architecture(flame_model_t model, const char** name) {
  return api_call("flame_model_architecture", [&] {
    auto* out = out_param(name, "name");
    *out = model_of(model).architecture.c_str();
  });
}

FLAME_API flame_status_t flame_model_config(flame_model_t model, const char** config_json) {
  return api_call("flame_model_config", [&] {
    auto* out = out_param(config_json, "config_json");
    *out = model_of(model).config_text.c_str();
  });
}

FLAME_API flame_status_t flame_model_params(flame_model_t model, flame_params_t* params) {
  return api_call("flame_model_params", [&] {
    out_param(params, "params");
    flame_model_s& m = model_of(model);
    const models::ParamStore& store = m.model->params();
    std::vector<std::pair<std::string, Tensor>> entries;
    entries.reserve(store.size());
    for (size_t i = 0; i < store.size(); ++i) entries.emplace_back(store.names()[i], store.tensors()[i]);
    *params = make_params_list(*m.ctx, entries);
  });
}

FLAME_API flame_status_t flame_model_forward(flame_model_t model, flame_params_t inputs, flame_params_t* outputs) {
  return api_call("flame_model_forward", [&] {
    out_param(outputs, "outputs");
    flame_model_s& m = model_of(model);
    const models::NamedTensors in = params_list_entries(inputs, "inputs");
    ContextScope scope(*m.ctx);
    m.ctx->check_alive();
    const models::NamedTensors out = m.model->forward(in);
    *outputs = make_params_list(*m.ctx, out);
  });
}

FLAME_API flame_status_t flame_model_save(flame_model_t model, const char* path, const char* layout) {
  return api_call("flame_model_save", [&] {
    flame_model_s& m = model_of(model);
    m.model->check_not_sharded("save the model");
    FLAME_CHECK(path, FLAME_ERROR_INVALID_ARGUMENT, "path is NULL");
    FLAME_CHECK(!m.model->options().quantize.nf4(), FLAME_ERROR_INVALID_ARGUMENT,
                "flame_model_save: the model's base is NF4 (\"quantize\": {\"dtype\": \"nf4\"}), which FLAME does not write "
                "to files; load the original checkpoint with the same option instead (or save only the LoRA adapters)");
    const std::string kind = layout ? layout : "diffusers";
    const models::ParamStore& store = m.model->params();
    // The plan first: a bad layout fails before the device is touched.
    std::optional<models::OriginalSavePlan> original;
    std::vector<models::OriginalScale> scales;
    if (kind != "diffusers") {
      original = models::plan_original_save(m.model->class_name(), param_shapes(*m.model), kind);
      scales = models::original_scales(*m.model, *original);
    }
    ContextScope scope(*m.ctx);
    m.ctx->check_alive();
    m.ctx->forbid_in_capture("writing a safetensors file");
    if (!original) {
      save_safetensors(*m.ctx, path, store.names(), store.tensors(), {{"format", "pt"}});
      return;
    }
    save_original_layout(*m.ctx, path, *m.model, *original, scales);
  });
}

FLAME_API flame_status_t flame_model_set_training(flame_model_t model, int32_t training) {
  return api_call("flame_model_set_training", [&] { model_of(model).model->set_training(training != 0); });
}

FLAME_API flame_status_t flame_model_set_checkpointing(flame_model_t model, int64_t every_n_blocks) {
  return api_call("flame_model_set_checkpointing", [&] {
    flame_model_s& m = model_of(model);
    FLAME_CHECK(every_n_blocks >= 0, FLAME_ERROR_INVALID_ARGUMENT, "every_n_blocks is ", every_n_blocks,
                "; 0 (off) or a positive block interval expected");
    models::CheckpointPolicy p;
    p.every_n_blocks = every_n_blocks;
    m.model->set_checkpointing(p);
  });
}

FLAME_API flame_status_t flame_model_add_lora(flame_model_t model, const char* options_json, flame_params_t* adapter_params) {
  return api_call("flame_model_add_lora", [&] {
    flame_params_t* out = out_param(adapter_params, "adapter_params");
    flame_model_s& m = model_of(model);
    m.model->check_not_sharded("add a LoRA adapter (add adapters before sharding)");
    const models::LoraAdapterOptions o = models::parse_lora_adapter_options(json_arg(options_json, "options_json"));
    ContextScope scope(*m.ctx);
    m.ctx->check_alive();
    m.ctx->forbid_in_capture("creating a LoRA adapter");
    const models::LoraAdapter& adapter = models::add_lora(*m.model, o);
    try {
      *out = make_params_list(*m.ctx, adapter.named_tensors());
    } catch (...) {  // nothing half-done: the adapter goes again (the base stays frozen if asked)
      m.model->remove_lora_adapter(o.name);
      throw;
    }
  });
}

FLAME_API flame_status_t flame_model_lora_params(flame_model_t model, const char* name, flame_params_t* adapter_params) {
  return api_call("flame_model_lora_params", [&] {
    flame_params_t* out = out_param(adapter_params, "adapter_params");
    flame_model_s& m = model_of(model);
    const std::string n = name ? name : "default";
    const models::LoraAdapter* adapter = m.model->find_lora_adapter(n);
    FLAME_CHECK(adapter, FLAME_ERROR_INVALID_ARGUMENT, "the model has no LoRA adapter \"", n, "\"");
    *out = make_params_list(*m.ctx, adapter->named_tensors());
  });
}

FLAME_API flame_status_t flame_model_save_lora(flame_model_t model, const char* name, const char* path,
                                               const char* options_json) {
  return api_call("flame_model_save_lora", [&] {
    flame_model_s& m = model_of(model);
    FLAME_CHECK(path, FLAME_ERROR_INVALID_ARGUMENT, "path is NULL");
    const std::string n = name ? name : "default";
    const models::LoraFileOptions o = models::parse_lora_file_options(json_arg(options_json, "options_json"));
    const models::LoraAdapter* adapter = m.model->find_lora_adapter(n);
    FLAME_CHECK(adapter, FLAME_ERROR_INVALID_ARGUMENT, "the model has no LoRA adapter \"", n, "\"");
    ContextScope scope(*m.ctx);
    m.ctx->check_alive();
    m.ctx->forbid_in_capture("writing a safetensors file");
    const models::LoraFileContents contents = models::lora_file_contents(*m.model, *adapter, o);
    std::vector<std::string> names;
    std::vector<Tensor> tensors;
    for (const auto& [k, t] : contents.tensors) {
      names.push_back(k);
      tensors.push_back(t);
    }
    save_safetensors(*m.ctx, path, names, tensors, contents.metadata);
  });
}

FLAME_API flame_status_t flame_model_load_lora(flame_model_t model, const char* path, const char* options_json,
                                               flame_params_t* adapter_params) {
  return api_call("flame_model_load_lora", [&] {
    flame_params_t* out = out_param(adapter_params, "adapter_params");
    flame_model_s& m = model_of(model);
    m.model->check_not_sharded("load a LoRA adapter (add adapters before sharding)");
    FLAME_CHECK(path, FLAME_ERROR_INVALID_ARGUMENT, "path is NULL");
    const models::LoraLoadOptions o = models::parse_lora_load_options(json_arg(options_json, "options_json"));
    FLAME_CHECK(!m.model->find_lora_adapter(o.name), FLAME_ERROR_INVALID_ARGUMENT, "the model has a LoRA adapter \"",
                o.name, "\" already");
    ContextScope scope(*m.ctx);
    m.ctx->check_alive();
    m.ctx->forbid_in_capture("loading a LoRA file");
    std::shared_ptr<models::LoraAdapter> adapter = models::read_lora_file(*m.model, path, o);
    m.model->add_lora_adapter(adapter);
    try {
      *out = make_params_list(*m.ctx, adapter->named_tensors());
    } catch (...) {
      m.model->remove_lora_adapter(o.name);
      throw;
    }
  });
}

FLAME_API flame_status_t flame_model_remove_lora(flame_model_t model, const char* name) {
  return api_call("flame_model_remove_lora", [&] {
    flame_model_s& m = model_of(model);
    m.model->remove_lora_adapter(name ? name : "default");
  });
}

FLAME_API flame_status_t flame_model_merge_lora(flame_model_t model, const char* name) {
  return api_call("flame_model_merge_lora", [&] {
    flame_model_s& m = model_of(model);
    m.model->check_not_sharded("merge a LoRA adapter");
    const std::string n = name ? name : "default";
    FLAME_CHECK(m.model->find_lora_adapter(n), FLAME_ERROR_INVALID_ARGUMENT, "the model has no LoRA adapter \"", n, "\"");
    ContextScope scope(*m.ctx);
    m.ctx->check_alive();
    m.ctx->forbid_in_capture("merging a LoRA adapter");
    models::merge_lora(*m.model, n);
  });
}

}  // extern "C"

// The model layer's common ground: a Model is an architecture (diffusers' or transformers' class)
// built from FLAME ops, holding its parameters under the reference implementation's names
// (state_dict order), run by name: forward takes and returns named tensors, with the names the
// reference's forward() uses ("sample", "timestep", "encoder_hidden_states", "input_ids", ...).
//
// Parameters are ordinary leaf tensors that require grad (freeze them with flame_set_requires_grad),
// so optimizers, hooks, LoRA and safetensors work on them unchanged (with the "quantize" option the
// linear layers' weights are frozen F8 tensors with scales beside them: quantized_weights.h). Every architecture registers
// here by its class name (create_model) with a factory that reads its config.json. Each family's
// forward lives in its own file (clip_text.cpp, ...); the building blocks they share (linear, norms,
// attention heads) are in model_blocks.h.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>
#include <nlohmann/json.hpp>
#include "models/block_params.h"
#include "models/model_lora.h"
#include "models/quantized_weights.h"
#include "ops/nf4.h"
#include "models/weight_offload.h"
#include "ops/ops.h"
#include "tensor/tensor.h"

namespace flame::models {

class ParamSharding;  // param_sharding.h

using NamedTensor = std::pair<std::string, Tensor>;
using NamedTensors = std::vector<NamedTensor>;

// How parameters are kept and computed with. Parameters are stored in param_dtype; each use casts
// them to compute_dtype when the two differ (storage dtypes such as F8 upcast at use). Inputs in
// other float dtypes are cast to compute_dtype by the model.
// With quantize enabled, the linear layers' weights (linear_modules()) are stored in F8 with a
// scale beside them (quantized_weights.h), or in NF4 (ops/nf4.h), and the rest in param_dtype.
struct ModelOptions {
  DType param_dtype = FLAME_DTYPE_F32;
  DType compute_dtype = FLAME_DTYPE_F32;
  WeightQuantization quantize;
  OffloadOptions offload;  // weight_offload.h; disabled unless the options name it
};

// Parses {"dtype": "bf16", "compute_dtype": "bf16", "quantize": {...}, "offload": {...}} (all
// optional; compute_dtype defaults to dtype; quantize as parse_weight_quantization, offload as
// parse_offload_options). Unknown keys or values fail with FLAME_ERROR_INVALID_ARGUMENT.
ModelOptions parse_model_options(const nlohmann::json& options);
// "f32" / "float32", "f16" / "float16", "bf16" / "bfloat16", "f64" / "float64"; anything else fails
// with FLAME_ERROR_INVALID_ARGUMENT naming the options key.
DType float_dtype_from_name(const std::string& name, const char* key);

// The parameters of a model in registration order, names unique.
class ParamStore {
 public:
  // A new uninitialised parameter (a leaf that requires grad unless told otherwise) called name.
  Tensor add(Context& ctx, const std::string& name, const Shape& shape, DType dtype, bool requires_grad = true);
  // Registers an existing tensor as the parameter called name (a name in use: FLAME_ERROR_INTERNAL).
  void insert(const std::string& name, const Tensor& t);
  const Tensor& get(const std::string& name) const;  // FLAME_ERROR_INTERNAL when absent
  const Tensor* find(const std::string& name) const;
  size_t size() const { return names_.size(); }
  const std::vector<std::string>& names() const { return names_; }
  const std::vector<Tensor>& tensors() const { return tensors_; }

 private:
  std::vector<std::string> names_;
  std::vector<Tensor> tensors_;
  std::unordered_map<std::string, size_t> index_;
};

// Gradient checkpointing of a model's repeated blocks: 0 off, 1 every block, n every n-th block.
struct CheckpointPolicy {
  int64_t every_n_blocks = 0;
  bool applies_to(int64_t block_index) const { return every_n_blocks > 0 && block_index % every_n_blocks == 0; }
};

class Model : public std::enable_shared_from_this<Model> {
 public:
  Model(Context& ctx, std::string class_name, nlohmann::json config, const ModelOptions& options);
  virtual ~Model() = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  Context& ctx() const { return *ctx_; }
  const std::string& class_name() const { return class_name_; }
  // The configuration in config.json form, with every default the model assumed filled in.
  const nlohmann::json& config() const { return config_; }
  const ModelOptions& options() const { return options_; }
  ParamStore& params() { return params_; }
  const ParamStore& params() const { return params_; }

  bool training() const { return training_; }
  void set_training(bool on) { training_ = on; }
  const CheckpointPolicy& checkpointing() const { return checkpoint_; }
  void set_checkpointing(const CheckpointPolicy& p) { checkpoint_ = p; }

  // The names forward() requires and the ones it also accepts, for errors and documentation.
  virtual std::vector<std::string> required_inputs() const = 0;
  virtual std::vector<std::string> optional_inputs() const = 0;
  // Runs the model. Checks that every required input is present and no unknown name is given
  // (FLAME_ERROR_INVALID_ARGUMENT naming it), then calls run().
  NamedTensors forward(const NamedTensors& inputs);

  // The linear layers (every 2-D "<module>.weight" that is not an embedding), in parameter order.
  std::vector<LoraCandidate> linear_modules() const;
  // The modules LoRA adapts when no targets are given: the defaults of diffusers' training scripts
  // for the architecture, or with kohya of sd-scripts' (lora_format.h default_lora_targets).
  std::vector<std::string> default_lora_targets(bool kohya) const;

  // LoRA adapters (model_lora.h), applied in every forward by adapted_linear in the order added.
  const std::vector<std::shared_ptr<LoraAdapter>>& lora_adapters() const { return adapters_; }
  const LoraAdapter* find_lora_adapter(const std::string& name) const;
  // Adds an adapter whose modules are linear layers of this model with matching shapes (a name in
  // use, an unknown module or a shape that is not [rank, in] / [out, rank]: FLAME_ERROR_INVALID_ARGUMENT).
  void add_lora_adapter(std::shared_ptr<LoraAdapter> adapter);
  void remove_lora_adapter(const std::string& name);  // FLAME_ERROR_INVALID_ARGUMENT when absent

  // The scale parameter ("<module>.scale_weight") of an fp8-quantised weight called weight_name;
  // null when that weight is not quantised in fp8 (or absent).
  const Tensor* quantization_scale(const std::string& weight_name) const;
  // Whether name is the scale parameter of an fp8-quantised weight, or a statistic of an NF4 weight.
  bool is_quantization_scale(const std::string& name) const;
  // Whether weight_name is an NF4 weight ("quantize": {"dtype": "nf4"}): its parameter holds the
  // packed codes (U8 [out, in / 2]) and its statistics sit beside it as "<module>.weight.absmax" and,
  // with double quantisation, "<module>.weight.nested_absmax" and "<module>.weight.nested_offset"
  // (bitsandbytes' state-dict names).
  bool is_nf4_weight(const std::string& weight_name) const { return nf4_.count(weight_name) != 0; }
  // The NF4 weight called weight_name as stored (its tensors, not fetched); FLAME_ERROR_INTERNAL
  // when it is not one.
  ops::Nf4Weight nf4_weight(const std::string& weight_name) const;
  // The shape the parameter called name stands for: [out, in] for an NF4 weight, else its shape.
  Shape logical_shape(const std::string& name) const;
  // Replaces every linear weight (stored in param_dtype, already initialised) by its quantisation q
  // (quantize_into, one weight at a time, each freed once quantised) with its scale parameter right
  // after it, and records q in options(). For a new model (flame_model_create); the model must not
  // be quantised yet (FLAME_ERROR_INTERNAL). On an error the model is left half converted: drop it.
  void quantize_linear_weights(const WeightQuantization& q);
  // Checks that exactly the linear modules' weights are quantised (FLAME_ERROR_INTERNAL otherwise):
  // run by create_model once an architecture registered its parameters.
  void check_quantized_weights() const;

  // Which parameters each block reads, learnt in the model's first forward (block_params.h).
  const BlockParams& block_params() const { return block_params_; }
  // Parameter sharding over ranks (param_sharding.h; ZeRO-3), installed once by ParamSharding::shard.
  void set_sharding(std::shared_ptr<ParamSharding> s) { sharding_ = std::move(s); }
  bool sharded() const { return sharding_ != nullptr; }
  // Fails with FLAME_ERROR_INVALID_ARGUMENT naming what when the model's block parameters are
  // sharded over ranks (their tensors hold no memory: reading or writing them is impossible).
  void check_not_sharded(const char* what) const;

  // Fills every parameter with the reference class's default initialisation distribution family
  // (normal weights, unit norm scales, zero biases; documented per model), drawn from the context's
  // generator. Used by flame_model_create.
  virtual void initialize();

 protected:
  // Inputs checked by forward(): look them up with input() / optional_input().
  virtual NamedTensors run(const NamedTensors& inputs) = 0;
  static const Tensor& input(const NamedTensors& inputs, const std::string& name);
  static const Tensor* optional_input(const NamedTensors& inputs, const std::string& name);
  // The parameter called name in compute_dtype (a recorded cast when the storage dtype differs). A
  // quantised linear weight comes back as stored (F8) for adapted_linear, the one place it goes.
  Tensor param(const std::string& name) const;
  // linear(x, weight, bias) (bias may be null) plus the term of every LoRA adapter on module, then act:
  // the one way an architecture runs a linear layer, so that adapters reach all of them. A quantised
  // weight (F8, from param()) runs through ops::quantized_linear with its scale: the graph keeps the
  // F8 weight for the input gradient, not a dequantised copy (ops/quantized.h).
  Tensor adapted_linear(const Tensor& x, const std::string& module, const Tensor& weight, const Tensor& bias,
                        ops::Activation act = ops::Activation::None) const;
  // Whether every block must run through run_block, checkpointed or not: while the first forward
  // learns which parameters each block reads, and when block weights are fetched (the "offload"
  // option, parameter sharding).
  bool block_scopes_needed() const { return block_params_.learning() || offload_ || sharding_; }
  // Embedding tables among the 2-D "<module>.weight" parameters (not linear layers).
  virtual bool is_embedding(const std::string& module) const { (void)module; return false; }
  // A float input cast to compute_dtype (unchanged when it already is).
  Tensor to_compute(const Tensor& t) const;
  // A new parameter in param_dtype; with options().quantize enabled, a linear layer's weight (2-D,
  // "<module>.weight", not an embedding) is made in F8, frozen, with its frozen f32 scale parameter
  // "<module>.scale_weight" registered right after it; with "nf4" its packed codes and statistics
  // (add_nf4_param; a block size that does not divide its rows: FLAME_ERROR_INVALID_ARGUMENT).
  Tensor add_param(const std::string& name, const Shape& shape);
  // Runs block(x...) under the checkpoint policy for block index i: through toolkit checkpointing
  // when the policy selects it and a graph is being recorded, else directly. A checkpointed block
  // runs again during backward, possibly after forward() returned: it must capture everything by
  // value (tensors, indices; never references to locals). run_block keeps the model alive for it.
  // block must return n_outputs tensors (-1: as many as it takes). A block whose weights are
  // fetched (offloaded to host memory, or sharded over ranks) is always checkpointed while a graph
  // is recorded.
  std::vector<Tensor> run_block(int64_t block_index, const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& block,
                                const std::vector<Tensor>& inputs, int32_t n_outputs = -1);

  nlohmann::json config_;

 private:
  // run_block for a block whose weights are fetched (offloaded or sharded; model.cpp).
  std::vector<Tensor> run_fetched_block(int64_t block_index,
                                        const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& block,
                                        const std::vector<Tensor>& inputs, int32_t n_outputs);
  // The tensor computed with for the stored parameter name: the fetched weights while its block
  // runs (offload ring, sharded gather), else stored.
  Tensor fetched(const std::string& name, const Tensor& stored) const;

  std::shared_ptr<Context> ctx_;
  std::string class_name_;
  ModelOptions options_;
  ParamStore params_;
  bool training_ = false;
  CheckpointPolicy checkpoint_;
  std::vector<std::shared_ptr<LoraAdapter>> adapters_;
  std::unordered_map<std::string, std::string> quantized_;  // quantised weight name -> its scale's name
  // An NF4 weight's statistics (is_nf4_weight); nested_scale and nested_offset empty without double
  // quantisation.
  struct Nf4Names {
    std::string absmax, nested_scale, nested_offset;
  };
  std::unordered_map<std::string, Nf4Names> nf4_;  // NF4 weight name -> its statistics' names
  Tensor nf4_code_;  // the 8-bit dynamic map the double-quantised absmax codes index (ops::nf4_dynamic_map)
  // Registers the NF4 weight name of shape [out, in] (module: its layer) and its statistics.
  Tensor add_nf4_param(const std::string& name, const std::string& module, const Shape& shape);
  // The NF4 weight called weight_name as the forward uses it (fetched, as param() fetches).
  ops::Nf4Weight fetched_nf4(const std::string& weight_name) const;
  std::shared_ptr<WeightOffload> offload_;  // null unless options_.offload.enabled
  mutable BlockParams block_params_;        // learnt by param() and run_block in the first forward
  std::shared_ptr<ParamSharding> sharding_;  // null unless sharded over ranks
};

// The value of m's weight called weight_name in f32 when quantised (dequantised, not recorded), else
// the stored tensor itself: what DoRA's norms read.
Tensor weight_value_f32(const Model& m, const std::string& weight_name);

// A new LoRA adapter on m made from options (the model's default targets when options.targets is
// empty), added to m; with options.freeze_base every parameter of m stops requiring grad. Nothing
// changes on an error (a name in use, a target matching nothing, a bad option).
const LoraAdapter& add_lora(Model& m, const LoraAdapterOptions& options);

// Folds the adapter called name into m's weights, W = merged_lora_weight (model_lora.h) computed in
// f32 on the device and stored in the weight's dtype, then removes the adapter (later forwards give
// the same output, up to that rounding). Other adapters on the same modules stay (a DoRA adapter's
// norm then follows the merged weight, as in peft). Errors: no adapter of that name, a weight of a
// dtype other than f32 / bf16 / f16 / f64 (FLAME_ERROR_INVALID_ARGUMENT, nothing changed); a device
// failure part way leaves the modules merged so far merged and removed from the adapter.
void merge_lora(Model& m, const std::string& name);

// The architectures create_model knows, by class name ("CLIPTextModel", ...), in a stable order.
std::vector<std::string> model_class_names();

// A new model of class_name with config (config.json's object; missing keys take the class's
// defaults), its parameters allocated in options.param_dtype and NOT initialised. Unknown class:
// FLAME_ERROR_INVALID_ARGUMENT listing the known ones; a config value of the wrong type or out of range:
// FLAME_ERROR_INVALID_ARGUMENT naming the key.
std::shared_ptr<Model> create_model(Context& ctx, const std::string& class_name, const nlohmann::json& config,
                                    const ModelOptions& options);
// create_model and initialize (flame_model_create): with options.quantize enabled, the model is
// made and initialised in param_dtype, then its linear weights are quantised one by one.
std::shared_ptr<Model> create_initialized_model(Context& ctx, const std::string& class_name, const nlohmann::json& config,
                                                const ModelOptions& options);

// Config reading shared by the factories: key's value, or fallback when absent or null; a value of
// another type fails with FLAME_ERROR_INVALID_ARGUMENT naming the key.
int64_t config_int(const nlohmann::json& cfg, const char* key, int64_t fallback);
double config_real(const nlohmann::json& cfg, const char* key, double fallback);
bool config_bool(const nlohmann::json& cfg, const char* key, bool fallback);
std::string config_string(const nlohmann::json& cfg, const char* key, const std::string& fallback);
std::vector<int64_t> config_ints(const nlohmann::json& cfg, const char* key, const std::vector<int64_t>& fallback);

}  // namespace flame::models

// Loading a model from the files users have (flame_model_load): opens them (checkpoint_files.h),
// picks the component, finds the architecture and configuration (config.json, or the tensors' names
// and shapes of a single file, or the caller's options), builds the model (model.h) and copies every
// parameter from its stored tensor, renaming / splitting / swapping as the original layout needs
// (flux_keys.h, unet_keys.h). Every parameter must be found with its shape, and every stored tensor
// must be used (buffers the reference classes do not load, such as CLIP's position_ids, excepted):
// otherwise FLAME_ERROR_INVALID_FORMAT names the file and the key, and no model is returned.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <nlohmann/json.hpp>
#include "models/checkpoint_files.h"
#include "models/model.h"

namespace flame::models {

// Where one parameter comes from: rows [row_begin, row_begin + rows) of key's dim 0 (rows -1: all),
// the two halves exchanged when swap_halves, stored transposed ([in, out] for [out, in]) when
// transposed.
struct ParamSource {
  std::string key;
  int64_t row_begin = 0;
  int64_t rows = -1;
  bool swap_halves = false;
  bool transposed = false;
};

// Everything flame_model_load decides before it touches the GPU: the architecture, its config, the
// model options, each parameter's source (parameters not listed are stored under their own names,
// a tied alias, or transformers 5's CLIPTextModel names), and the view of the files they are read
// from (the component's prefix stripped).
struct ModelLoadPlan {
  std::string architecture;
  nlohmann::json config;
  ModelOptions options;
  std::map<std::string, ParamSource> sources;
  CheckpointFiles view;
};

// Reads a parameter's source into dst (any shape of the same element count for plain sources; any
// dtype, converted on the GPU): the rows asked for, halves exchanged, transposed, as src says.
void read_parameter(const CheckpointFiles& view, const ParamSource& src, const Tensor& dst);

// Opens path and plans the load (no GPU needed): the errors of flame_model_load about files,
// options, components and unknown architectures come from here.
ModelLoadPlan plan_model_load(const std::string& path, const nlohmann::json& options);

// options: the flame_model_load options object (dtype, compute_dtype, quantize, architecture,
// config, component), already parsed as JSON (null: none). With "quantize", each linear weight is
// read into its quantised form (quantized_files.h): quantised on the GPU from a temporary of that one
// tensor, or taken as stored from an F8_E4M3 file with its scale.
std::shared_ptr<Model> load_model(Context& ctx, const std::string& path, const nlohmann::json& options);

}  // namespace flame::models

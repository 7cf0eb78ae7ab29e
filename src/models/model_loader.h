// Loading a model from the files users have (flame_model_load): opens them (checkpoint_files.h),
// picks the component, finds the architecture and configuration (config.json, or the tensors' names
// and shapes of a single file, or the caller's options), builds the model (model.h) and copies every
// parameter from its stored tensor, renaming / splitting / swapping as the original layout needs
// (flux_keys.h, unet_keys.h). Every parameter must be found with its shape, and every stored tensor
// must be used (buffers the reference classes do not load, such as CLIP's position_ids, excepted):
// otherwise FLAME_ERROR_INVALID_FORMAT names the file and the key, and no model is returned.
#pragma once
#include <memory>
#include <string>
#include <nlohmann/json.hpp>
#include "models/model.h"

namespace flame::models {

// options: the flame_model_load options object (dtype, compute_dtype, architecture, config,
// component), already parsed as JSON (null: none).
std::shared_ptr<Model> load_model(Context& ctx, const std::string& path, const nlohmann::json& options);

}  // namespace flame::models

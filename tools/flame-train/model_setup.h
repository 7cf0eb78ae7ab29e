// The denoiser a run trains (flame-train): loaded from the user's file with flame_model_load
// ({"dtype": "bf16"}) or, for model.path "demo:flux" / "demo:sdxl" / "demo:sd3", made by
// flame_model_create from a built-in tiny configuration in the real class (random init), so that
// the whole loop runs on a GPU without files. ModelShapes are the sizes the inputs must have,
// read from the model's complete configuration (flame_model_config), for the cache check and the
// demo's random data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config.h"
#include "flame_handles.h"

namespace flame_train {

enum class ModelFamily { Flux, Sdxl, Sd3 };

const char* family_name(ModelFamily f);  // "flux" | "sdxl" | "sd3"

struct ModelShapes {
  ModelFamily family = ModelFamily::Flux;
  int64_t latent_channels = 0;  // of the VAE latent [C, H, W] (Flux: in_channels / 4)
  int64_t text_dim = 0;         // prompt_embeds [T, text_dim]
  int64_t pooled_dim = 0;       // pooled_prompt_embeds [pooled_dim]
  bool guidance_embeds = false; // Flux-dev: the guidance input
  int64_t latent_multiple = 2;  // latent H and W must be multiples of this (patching / downsampling)
};

// True for "demo:<family>" model paths.
bool is_demo_model_path(const std::string& path);

// The tiny configuration JSON of a demo family name ("flux", "sdxl", "sd3"); throws
// std::invalid_argument for another name.
const char* demo_model_config(const std::string& family, const char** architecture);

struct LoadedModel {
  Model model;
  ModelShapes shapes;
};

// The denoiser's model options (flame_model_load): bf16, the component of a diffusers pipeline folder
// ("transformer" or "unet", from its model_index.json), and the configuration's memory options
// (model.quantize: "quantize"; model.offload_budget_gib: "offload"), as a JSON object.
std::string denoiser_model_options(const TrainConfig& config);

// Loads (or, for demo paths, creates) the model with options (denoiser_model_options). arch: the
// configuration's model.arch ("auto" or a family that must match what was loaded). Throws
// FlameError or std::runtime_error.
LoadedModel load_training_model(flame_ctx_t ctx, const std::string& path, const std::string& arch,
                                const std::string& options);

// flame_model_load's options for one component (the VAE, a text encoder) at source:
// {"dtype": "bf16"}, plus "component" (diffusers' slot name: "vae", "text_encoder", ...) when source
// is model_path itself (a single file bundling components) or a diffusers pipeline folder.
std::string component_load_options(const std::string& source, const std::string& model_path,
                                   const std::string& component);

// Shapes from an architecture name and its complete configuration JSON. Throws std::runtime_error
// for an architecture flame-train does not train.
ModelShapes shapes_from_config(const std::string& architecture, const std::string& config_json);

}  // namespace flame_train

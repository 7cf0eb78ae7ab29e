// The architectures create_model (model.h) can build, one factory per class, each defined in its
// family's file. Adding an architecture: write its Model subclass and factory, declare the factory
// here and list it in model_factories() (model_registry.cpp).
#pragma once
#include <memory>
#include <vector>
#include "models/model.h"

namespace flame::models {

using ModelFactoryFn = std::shared_ptr<Model> (*)(Context& ctx, const nlohmann::json& config, const ModelOptions& options);

struct ModelFactory {
  const char* class_name;  // the diffusers / transformers class: "CLIPTextModel"
  ModelFactoryFn create;
};

// Every factory, in a stable order.
const std::vector<ModelFactory>& model_factories();

// ---- factories (one file per family) ----
std::shared_ptr<Model> create_clip_text_model(Context& ctx, const nlohmann::json& config, const ModelOptions& options);
std::shared_ptr<Model> create_clip_text_model_with_projection(Context& ctx, const nlohmann::json& config,
                                                              const ModelOptions& options);
std::shared_ptr<Model> create_t5_encoder_model(Context& ctx, const nlohmann::json& config, const ModelOptions& options);

std::shared_ptr<Model> create_unet2d_condition_model(Context& ctx, const nlohmann::json& config, const ModelOptions& options);
std::shared_ptr<Model> create_autoencoder_kl(Context& ctx, const nlohmann::json& config, const ModelOptions& options);
std::shared_ptr<Model> create_flux_transformer(Context& ctx, const nlohmann::json& config, const ModelOptions& options);
std::shared_ptr<Model> create_sd3_transformer(Context& ctx, const nlohmann::json& config, const ModelOptions& options);

}  // namespace flame::models

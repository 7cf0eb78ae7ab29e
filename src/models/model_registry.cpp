// The list of architectures (model_registry.h).
#include "models/model_registry.h"

namespace flame::models {

const std::vector<ModelFactory>& model_factories() {
  static const std::vector<ModelFactory> kFactories = {
      {"CLIPTextModel", create_clip_text_model},
      {"CLIPTextModelWithProjection", create_clip_text_model_with_projection},
      {"T5EncoderModel", create_t5_encoder_model},
      {"UNet2DConditionModel", create_unet2d_condition_model},
      {"AutoencoderKL", create_autoencoder_kl},
      {"FluxTransformer2DModel", create_flux_transformer},
      {"SD3Transformer2DModel", create_sd3_transformer},
  };
  return kFactories;
}

}  // namespace flame::models

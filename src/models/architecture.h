// Which model architectures a checkpoint's key list holds, over every family FLAME knows (Flux, SD3,
// the UNet, AutoencoderKL, CLIP text encoders, T5), and the diffusers / transformers class that
// defines each. A single file may bundle several models under their own prefixes (an SDXL file: the
// UNet, CLIP-L, bigG and the VAE): detect_components lists them all; detect_architecture names the
// one a user loading "the model" means (the denoiser when there is one).
#pragma once
#include <optional>
#include <string>
#include <vector>
#include "models/flux_keys.h"  // KeyShape

namespace flame::models {

enum class Architecture {
  FluxTransformer,         // diffusers FluxTransformer2DModel
  UNet2DCondition,         // diffusers UNet2DConditionModel
  SD3Transformer,          // diffusers SD3Transformer2DModel
  AutoencoderKL,           // diffusers AutoencoderKL
  CLIPText,                // transformers CLIPTextModel
  CLIPTextWithProjection,  // transformers CLIPTextModelWithProjection
  T5Encoder,               // transformers T5EncoderModel
};

// The class name in its library ("FluxTransformer2DModel", ..., "T5EncoderModel").
const char* architecture_class_name(Architecture a);
// "diffusers" or "transformers".
const char* architecture_library(Architecture a);
// The architecture of a class name (config.json's "_class_name" or "architectures"), if known.
std::optional<Architecture> architecture_from_class_name(const std::string& name);

// One model found in a key list: its architecture and the prefix its keys carry.
struct ArchitectureComponent {
  Architecture architecture;
  std::string prefix;
};

// Every model in keys: the denoiser (Flux, SD3 or UNet) first, then the VAE, the CLIP text encoders
// (in their prefixes' order) and T5. A model whose keys are recognised but incomplete or misshapen
// is an error (FLAME_ERROR_INVALID_FORMAT, naming the key); an empty result means nothing is known.
std::vector<ArchitectureComponent> detect_components(const std::vector<KeyShape>& keys);

// The first of detect_components. Fails (FLAME_ERROR_INVALID_FORMAT) when keys hold no known model,
// naming a few of the keys it saw.
Architecture detect_architecture(const std::vector<KeyShape>& keys);

}  // namespace flame::models

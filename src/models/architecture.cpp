// Architecture names and detection over all families (see architecture.h): each family's own
// is_*/detect_* decides; this file only orders them and names the classes.
#include "models/architecture.h"
#include <sstream>
#include "core/error.h"
#include "models/clip_keys.h"
#include "models/sd3_keys.h"
#include "models/t5_keys.h"
#include "models/unet_keys.h"
#include "models/vae_keys.h"

namespace flame::models {

namespace {

struct ClassName {
  Architecture architecture;
  const char* name;
  const char* library;
};

const ClassName kClassNames[] = {
    {Architecture::FluxTransformer, "FluxTransformer2DModel", "diffusers"},
    {Architecture::UNet2DCondition, "UNet2DConditionModel", "diffusers"},
    {Architecture::SD3Transformer, "SD3Transformer2DModel", "diffusers"},
    {Architecture::AutoencoderKL, "AutoencoderKL", "diffusers"},
    {Architecture::CLIPText, "CLIPTextModel", "transformers"},
    {Architecture::CLIPTextWithProjection, "CLIPTextModelWithProjection", "transformers"},
    {Architecture::T5Encoder, "T5EncoderModel", "transformers"},
};

const ClassName& class_of(Architecture a) {
  for (const ClassName& c : kClassNames)
    if (c.architecture == a) return c;
  fail(FLAME_ERROR_INVALID_ARGUMENT, "unknown architecture value ", static_cast<int>(a));
}

}  // namespace

const char* architecture_class_name(Architecture a) { return class_of(a).name; }

const char* architecture_library(Architecture a) { return class_of(a).library; }

std::optional<Architecture> architecture_from_class_name(const std::string& name) {
  for (const ClassName& c : kClassNames)
    if (name == c.name) return c.architecture;
  return std::nullopt;
}

std::vector<ArchitectureComponent> detect_components(const std::vector<KeyShape>& keys) {
  std::vector<ArchitectureComponent> out;
  if (is_flux_checkpoint(keys)) out.push_back({Architecture::FluxTransformer, detect_flux_checkpoint(keys).prefix});
  if (is_sd3_checkpoint(keys)) out.push_back({Architecture::SD3Transformer, detect_sd3_checkpoint(keys).prefix});
  if (is_unet_checkpoint(keys)) out.push_back({Architecture::UNet2DCondition, detect_unet_checkpoint(keys).prefix});
  if (is_vae_checkpoint(keys)) out.push_back({Architecture::AutoencoderKL, detect_vae_checkpoint(keys).prefix});
  if (is_clip_checkpoint(keys))
    for (const ClipCheckpoint& c : detect_clip_checkpoints(keys))
      out.push_back({c.config.with_projection ? Architecture::CLIPTextWithProjection : Architecture::CLIPText,
                     c.prefix});
  if (is_t5_checkpoint(keys)) out.push_back({Architecture::T5Encoder, detect_t5_checkpoint(keys).prefix});
  return out;
}

Architecture detect_architecture(const std::vector<KeyShape>& keys) {
  const std::vector<ArchitectureComponent> found = detect_components(keys);
  if (!found.empty()) return found.front().architecture;
  std::ostringstream seen;
  for (size_t i = 0; i < keys.size() && i < 3; ++i) seen << (i ? ", " : "") << keys[i].name;
  if (keys.size() > 3) seen << ", ... (" << keys.size() << " tensors)";
  fail(FLAME_ERROR_INVALID_FORMAT, "unknown model architecture: the keys (", keys.empty() ? "none" : seen.str(),
       ") match none of Flux, SD3, UNet2DCondition, AutoencoderKL, CLIP text or T5");
}

}  // namespace flame::models

// LoRA files of a model's adapters: the key plans of lora_format.h executed with tensors. Writing
// builds the file's tensors (stacked downs, block-diagonal ups of fused original modules, kohya's
// alphas) and its metadata; the caller writes them (the API layer owns the safetensors writer).
// Reading maps the file (checkpoint_files.h), plans it against the model and makes a new adapter
// whose modules hold exactly the stored delta W = alpha / rank * up @ down (a LoKr's factors as
// stored, lora_format.h).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>
#include "models/lora_format.h"
#include "models/model.h"

namespace flame::models {

// The pipeline slot a model fills by default: "unet" (UNet2DConditionModel), "transformer" (Flux,
// SD3), "vae", "text_encoder" (CLIPTextModel), "text_encoder_2" (CLIPTextModelWithProjection, and
// T5EncoderModel as Flux pipelines place it; SD3's T5 is "text_encoder_3": pass it).
std::string default_lora_component(const Model& m);

struct LoraFileOptions {
  LoraFileFormat format = LoraFileFormat::Kohya;
  std::string component;  // empty: default_lora_component
  DType dtype = FLAME_DTYPE_F32;  // of the stored down / up tensors (alphas are f32 0-d tensors)
  std::map<std::string, std::string> metadata;  // extra entries, written over the plan's
};
// Reads flame_model_save_lora's options JSON: {"format": "kohya" | "peft", "component": string,
// "dtype": "f32" | "bf16" | "f16", "metadata": {string: string}}; unknown keys and bad values:
// FLAME_ERROR_INVALID_ARGUMENT naming the key.
LoraFileOptions parse_lora_file_options(const nlohmann::json& options);

struct LoraFileContents {
  std::vector<std::pair<std::string, Tensor>> tensors;  // in file order
  std::vector<std::pair<std::string, std::string>> metadata;
};
// The tensors and metadata of adapter's file in options' format (new tensors; the adapter is read,
// not changed). DoRA modules store their magnitudes (lora_format.h). Errors: those of plan_lora_save
// (a module the format cannot express names it); an adapter with DoRA modules and a multiplier other
// than 1 (FLAME_ERROR_INVALID_ARGUMENT: a file's alpha scales B A, not DoRA's interpolation).
LoraFileContents lora_file_contents(const Model& m, const LoraAdapter& adapter, const LoraFileOptions& options);

struct LoraLoadOptions {
  std::string name = "default";
  std::string component;  // empty: default_lora_component
  double multiplier = 1.0;
  DType dtype = FLAME_DTYPE_F32;  // of the adapter's tensors
  bool trainable = false;          // the tensors require grad (to go on training a saved adapter)
};
// {"name", "component", "multiplier", "dtype", "trainable"}: as LoraAdapterOptions' keys.
LoraLoadOptions parse_lora_load_options(const nlohmann::json& options);

// A new adapter (not yet added to m) holding the LoRA file at path for m's component. Keys of other
// components in the file are skipped (a kohya file with the UNet and both text encoders loads into
// each model in turn). Errors: FLAME_ERROR_IO (the file), FLAME_ERROR_INVALID_FORMAT (a key the
// model has no module for, shapes that contradict it, a file holding nothing for the component:
// each names the file and key), those of reading tensors.
std::shared_ptr<LoraAdapter> read_lora_file(const Model& m, const std::string& path, const LoraLoadOptions& options);

}  // namespace flame::models

// Saving a model in the original single-file layouts (flame_model_save's layouts other than
// "diffusers"): the exact inverse of what the loader (model_loader.h) reads. The plan is worked out
// on the CPU from the model's parameter list alone: the family's key table (flux_keys.h,
// unet_keys.h, sd3_keys.h, vae_keys.h, clip_keys.h, t5_keys.h: one MappedTable each, the same one
// the loader reads the other way) gives every stored tensor and the pieces of parameters that fill
// it, in row order. Executing the plan (api/api_model.cpp) concatenates the pieces on the GPU.
//
// Layouts (by class; "original" is the first listed, the layout of the usual single file):
//   FluxTransformer2DModel   "bfl": Black Forest Labs' names, no prefix (flux1-dev.safetensors);
//                            "comfyui": the same names under "model.diffusion_model.".
//   UNet2DConditionModel     "sgm" / "ldm": SGM / LDM names under "model.diffusion_model."
//                            (sd_xl_base_1.0 and v1-5-pruned use the same names).
//   SD3Transformer2DModel    "sd3": MMDiT names under "model.diffusion_model." (sd3.5_*.safetensors).
//   AutoencoderKL            "sgm" / "ldm": LDM names under "first_stage_model."; "bfl": the same names
//                            without prefix (ae.safetensors).
//   CLIPTextModel            "sgm": transformers names under "conditioner.embedders.0.transformer."
//                            (SDXL's CLIP-L); "sd3": under "text_encoders.clip_l.transformer.".
//   CLIPTextModelWithProjection  "sgm": OpenCLIP names under "conditioner.embedders.1.model." (SDXL's
//                            bigG: fused in_proj, text_projection transposed); "sd3": transformers
//                            names under "text_encoders.clip_l.transformer." (width 768) or
//                            "text_encoders.clip_g.transformer." (width 1280; other widths: an error,
//                            the prefix would be a guess).
//   T5EncoderModel           "sd3": transformers names under "text_encoders.t5xxl.transformer." (SD3.5
//                            single files); "comfyui": the same names without prefix (t5xxl_*.safetensors).
// A layout the class does not have, or a model whose parameters the layout cannot hold (a shape the
// loader's detection would not read back, such as a CLIP width that is no multiple of 64): FLAME_ERROR_
// INVALID_ARGUMENT naming the layout and the class.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "models/flux_keys.h"  // KeyShape

namespace flame::models {

// One parameter's share of a stored tensor: rows [row_begin, row_begin + rows) of it (dim 0, the
// other dims whole) hold the parameter, transposed first when `transposed` (a 2-D [out, in] stored
// [in, out]), its two halves exchanged when `swap_halves`, and reshaped to the stored rows' shape
// (trailing 1-sized dims, e.g. a Linear's [C, C] stored as a 1x1 convolution's [C, C, 1, 1]).
struct OriginalPiece {
  std::string parameter;
  std::vector<int64_t> parameter_shape;
  int64_t row_begin = 0;
  int64_t rows = 0;
  bool swap_halves = false;
  bool transposed = false;
};

// A tensor of the file: its full name (prefix included), its shape, and the pieces that tile its rows
// in order.
struct OriginalTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<OriginalPiece> pieces;
};

struct OriginalSavePlan {
  std::string layout;  // the explicit name ("bfl", "sgm", ...), "original" resolved
  std::vector<OriginalTensor> tensors;
};

// The layout names class_name accepts, "original" first (empty for an unknown class).
std::vector<std::string> original_layouts(const std::string& class_name);

// The tensors of the file that holds parameters (the model's (name, shape) list, as its ParamStore
// has them) of class_name in layout. Every parameter is in exactly one piece and every stored row is
// covered once; otherwise FLAME_ERROR_INTERNAL (a key table disagreeing with the model).
OriginalSavePlan plan_original_save(const std::string& class_name, const std::vector<KeyShape>& parameters,
                                    const std::string& layout);

}  // namespace flame::models

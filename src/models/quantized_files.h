// Quantised weights in checkpoint files (quantized_weights.h has the layout): reading a linear
// weight into a model (quantised or not) whatever the file stores, and the scale tensors of the
// original single-file layouts when a quantised model is saved.
//
// ComfyUI's "scaled fp8" convention: a weight stored as F8_E4M3 under "<module>.weight" may have a
// scale "<module>.scale_weight" (f32, a scalar; here also one per row, [rows] or [rows, 1]) with
// W = weight * scale_weight; without one the scale is 1. Its files also carry a "scaled_fp8" marker
// tensor and, for its FP8 matmul, "<module>.scale_input" scalars: the loader skips both.
//
// Reading a weight (read_weight):
//   - into a quantised parameter: an F8_E4M3 tensor is taken as stored with its scale (never
//     re-quantised: bit for bit what the file holds); any other dtype is read into a temporary f32
//     copy of that one tensor (dequantised first when it is a scaled F8 of another kind), then
//     quantised on the GPU (quantize_into). A scale stored per row loads into a per-tensor parameter
//     only when all its rows for the parameter are equal (checked on the host: loading waits anyway),
//     else FLAME_ERROR_INVALID_ARGUMENT asks for "scale": "row"; a per-tensor one fills every row.
//   - into an NF4 weight (Model::is_nf4_weight): whatever the file stores is read into a temporary
//     f32 copy of that one weight (a scaled F8 one dequantised first), then quantised on the GPU
//     (ops::nf4_quantize_into).
//   - into a parameter of a float dtype: a scaled F8 weight is dequantised (weight * scale_weight,
//     rounded once to the parameter's dtype); anything else is read as before (read_parameter).
#pragma once
#include <string>
#include <vector>
#include "models/model.h"
#include "models/model_loader.h"
#include "models/original_layout.h"

namespace flame::models {

// "<module>.scale_weight" for a stored "<module>.weight"; "" for other keys.
std::string stored_scale_key(const std::string& weight_key);
// ComfyUI's "scaled_fp8" marker (alone or ending a prefixed key) and "*.scale_input" keys.
bool is_ignorable_quantization_key(const std::string& key);

// Reads parameter `name` of model (dst, its tensor) from src as described above; returns the scale
// key it read ("" when none), which the caller counts as used. Errors name the file and the key:
// FLAME_ERROR_INVALID_FORMAT (a scale that is neither a scalar nor one per row of its weight, a
// per-row scale of a transposed source), FLAME_ERROR_INVALID_ARGUMENT (per-row scales that differ,
// read into a per-tensor model), and read_into's.
std::string read_weight(const Model& model, const CheckpointFiles& view, const ParamSource& src, const std::string& name,
                        const Tensor& dst);

// A scale tensor of an original-layout file: its name ("<stored weight less .weight>.scale_weight")
// and the stored tensor whose pieces it scales.
struct OriginalScale {
  std::string name;
  std::vector<int64_t> shape;  // {} (one piece, per-tensor) or {rows, 1}
  size_t tensor = 0;           // index into the plan's tensors
};

// The scales an original-layout plan of model needs: one per stored tensor made of quantised
// weights. A tensor of one piece with a per-tensor scale keeps it as a scalar (ComfyUI reads it); a
// fused tensor (e.g. Flux's qkv) or per-row scales get a [rows, 1] column, each piece's scale over
// its rows (exact, and read back by flame_model_load; ComfyUI reads scalars only). Errors:
// FLAME_ERROR_INVALID_ARGUMENT (a quantised piece stored transposed with per-row scales, or under a
// name without ".weight"), FLAME_ERROR_INTERNAL (quantised and plain pieces in one tensor).
std::vector<OriginalScale> original_scales(const Model& model, const OriginalSavePlan& plan);
// The values of s (f32, on the device) from the model's scale parameters.
Tensor original_scale_tensor(const Model& model, const OriginalSavePlan& plan, const OriginalScale& s);

}  // namespace flame::models

// A quantised frozen base (issue 36, Memory): the weights of a model's linear layers stored in
// fp8 e4m3 with an f32 scale, so that W = weight * scale_weight, dequantised to the compute dtype
// at each use (Model::param) and never trained. The layout is ComfyUI's "scaled fp8" one: the F8
// tensor keeps the weight's name ("<module>.weight") and its scale sits beside it as
// "<module>.scale_weight", a 0-d tensor (a scale per tensor: amax / 448) or an [out, 1] column (a
// scale per output row), so that weight * scale_weight broadcasts in PyTorch as here.
//
// This file holds the option ("quantize" of the model options), the names, and the two tensor
// operations: quantize_into (any float weight -> F8 + scale, on the GPU, not recorded) and
// dequantize (F8 + scale -> the compute dtype, computed in f32 and rounded once). A model's linear
// layer runs over its quantised weight through ops::quantized_linear (ops/quantized.h), which saves
// the F8 weight and its scale for backward rather than a dequantised copy (Model::adapted_linear).
#pragma once
#include <string>
#include <nlohmann/json.hpp>
#include "core/dtype.h"
#include "tensor/tensor.h"

namespace flame::models {

enum class QuantScale { PerTensor, PerRow };
// The format of a quantised base: fp8 with a scale (this file), or NF4 (ops/nf4.h: packed 4-bit
// codes with an absmax per block, optionally double-quantised).
enum class QuantFormat { Fp8, Nf4 };

// The model option {"quantize": {"dtype": "f8_e4m3", "scale": "tensor" | "row"}} or
// {"quantize": {"dtype": "nf4", "block_size": 64, "double_quant": true}}.
struct WeightQuantization {
  bool enabled = false;
  QuantFormat format = QuantFormat::Fp8;
  DType dtype = FLAME_DTYPE_F8_E4M3;  // fp8 only
  QuantScale scale = QuantScale::PerTensor;  // fp8 only
  int64_t block_size = 64;    // NF4 only: elements per absmax, a power of two in [16, 4096]
  bool double_quant = true;   // NF4 only: the absmax values in 8 bits (bitsandbytes' compress_statistics)
  bool nf4() const { return enabled && format == QuantFormat::Nf4; }
};

// Parses the value of the "quantize" key: null or false (off), or an object whose keys are all
// optional: "dtype" ("f8_e4m3", the default; "float8_e4m3fn" is accepted too; or "nf4"), for fp8
// "scale" ("tensor", the default, or "row"), for NF4 "block_size" (an integer, a power of two in
// [16, 4096], default 64) and "double_quant" (a boolean, default true). Anything else, or a key of
// the other format, fails with FLAME_ERROR_INVALID_ARGUMENT naming the key ("quantize",
// "quantize.dtype", "quantize.scale", "quantize.block_size", "quantize.double_quant" or the unknown
// "quantize.<key>").
WeightQuantization parse_weight_quantization(const nlohmann::json& value);

// The largest finite e4m3 value: a per-tensor scale is amax / kF8E4M3Max.
constexpr double kF8E4M3Max = 448.0;

// "<module>.scale_weight" for "<module>.weight" (weight_name must end with ".weight").
std::string scale_weight_name(const std::string& weight_name);
// Whether name is a "<module>.scale_weight".
bool is_scale_weight_name(const std::string& name);
// The scale's shape for a weight of weight_shape ([out, in]): {} per tensor, {out, 1} per row.
Shape scale_shape(QuantScale scale, const Shape& weight_shape);

// Quantises w (any float dtype, [out, in]) into q (F8 e4m3, same shape) and scale (f32 of
// scale_shape): scale = max(amax(|w|), 1e-12) / 448 over the tensor or each row, q = e4m3(w / scale)
// rounded to nearest even. Runs on the GPU without recording; bumps q's and scale's versions.
void quantize_into(const Tensor& w, const Tensor& q, const Tensor& scale);

// q (F8) * scale (f32, 0-d or [out, 1]) in dtype: computed in f32, rounded once to dtype, by one
// kernel for an fp8 q (ops::dequantize; any other q dtype is composed of ops). Computed without recording (the quantised weights are frozen: no gradient reaches q or scale even if one
// was asked for), so the result is a constant of the graph; the linear layer that uses it still
// passes gradients to its input and to the LoRA adapters beside it.
Tensor dequantize(const Tensor& q, const Tensor& scale, DType dtype);

}  // namespace flame::models

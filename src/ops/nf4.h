// Frozen NF4 weights in the ops layer (issue 36, Memory; the model layer's option is
// models/quantized_weights.h): QLoRA's 4-bit NormalFloat in bitsandbytes' blockwise layout
// (Linear4bit / Params4bit, quant_type "nf4"). A weight W [out, in] is cut into blocks of
// block_size consecutive elements (row-major; block_size divides in, so a block stays in its row);
// each block keeps absmax = max |w| and every element the code of the NF4 level nearest to
// w / absmax (cuda/nf4_constants.cuh has the 16 levels), two codes per byte. With double
// quantisation (bitsandbytes' compress_statistics) the absmax values themselves are stored in 8
// bits: their mean is subtracted, and each block of 256 gets an f32 scale and codes into the 8-bit
// dynamic map (nf4_dynamic_map_values): 0.5 byte per weight plus 1/block_size byte plus 4 bytes per
// 256 blocks, against 2 for bf16.
//  - nf4_quantize_into: W (any float dtype) into an Nf4Weight's tensors, on the GPU, not recorded.
//  - nf4_dequantize: one kernel (cuda/nf4.cuh) back to the compute dtype, each value rounded once.
//  - nf4_linear: y = act(x W^T + b) recorded as one Nf4Linear node (tensor/op_list.h) that saves the
//    packed weight and its statistics, not W, and dequantises again in backward for the input
//    gradient (autograd/backward_rules.cpp), as quantized_linear does for fp8.
#pragma once
#include <array>
#include <string>
#include <vector>
#include "ops/ops.h"
#include "tensor/tensor.h"

namespace flame::ops {

// The tensors of one NF4 weight of logical shape [out, in].
struct Nf4Weight {
  Tensor packed;         // U8 [out, in / 2]: codes, the first element of each pair in the high nibble
  Tensor absmax;         // F32 [blocks], or U8 [blocks] (codes into nested_code) with double quantisation
  Tensor nested_scale;   // F32 [ceil(blocks / 256)]: double quantisation only, else null
  Tensor nested_offset;  // F32 []: the mean subtracted before the second quantisation (or null)
  Tensor nested_code;    // F32 [256]: the 8-bit code the absmax codes index (or null)

  bool double_quant() const { return nested_code != nullptr; }
  int64_t out_features() const { return packed->shape[0]; }
  int64_t in_features() const { return packed->shape[1] * 2; }
  int64_t block_size() const { return packed->numel() * 2 / absmax->numel(); }
};

// The NF4 levels in code order (bitsandbytes' table; cuda/nf4_constants.cuh).
std::array<float, 16> nf4_levels();
// bitsandbytes' create_dynamic_map(signed=True) (functional.py): 256 sorted values in [-1, 1],
// computed here in f32 as its torch code does (linspace(0.1, 1) fractions times powers of ten).
std::array<float, 256> nf4_dynamic_map_values();
// nf4_dynamic_map_values on ctx's device (F32 [256]), the nested_code of double-quantised weights.
Tensor nf4_dynamic_map(Context& ctx);

// The tensors of an NF4 weight of shape [out, in] on ctx, uninitialised. nested_code: the dynamic
// map to index (nf4_dynamic_map), or null for no double quantisation. block_size must be a power
// of two in [16, 4096] that divides in (FLAME_ERROR_INVALID_ARGUMENT otherwise).
Nf4Weight nf4_empty(Context& ctx, int64_t out, int64_t in, int64_t block_size, const Tensor& nested_code);

// Quantises w ([out, in], f32, f16, bf16 or f64) into dst (made by nf4_empty for that shape):
// absmax per block, codes, and with double quantisation the absmax codes, scales and mean. Runs on
// the GPU without recording; bumps the versions of dst's tensors. Errors (nothing written):
// FLAME_ERROR_SHAPE_MISMATCH / DTYPE_MISMATCH for w or dst's tensors.
void nf4_quantize_into(const Tensor& w, const Nf4Weight& dst);

// W of weight in dtype (f32, f16, bf16 or f64), [out, in], not recorded (W is a constant of the
// graph). Errors: FLAME_ERROR_DTYPE_MISMATCH (dtype), FLAME_ERROR_SHAPE_MISMATCH (inconsistent tensors).
Tensor nf4_dequantize(const Nf4Weight& weight, DType dtype);

// act(x W^T + bias) for x [..., in] (f32, f16, bf16 or f64), bias ([out] of x's dtype, or null), W
// the weight dequantised to x's dtype: equals linear(x, nf4_dequantize(weight, x->dtype), bias,
// act). The recorded node reaches x and bias only and saves the weight's tensors (as
// quantized_linear saves q and scale). Errors: nf4_dequantize's, FLAME_ERROR_SHAPE_MISMATCH /
// DTYPE_MISMATCH for x or bias.
Tensor nf4_linear(const Tensor& x, const Nf4Weight& weight, const Tensor& bias, Activation act = Activation::None);

// The kernel instantiations the functions above may launch (tests/cpu/test_kernels.cpp compiles them).
std::vector<std::string> nf4_instantiations();

}  // namespace flame::ops

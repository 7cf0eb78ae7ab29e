// Element types: sizes, names, the promotion lattice and the matching device type names used to
// instantiate NVRTC kernels. f16/bf16 are stored as 16-bit patterns on the host, f8 as 8-bit ones.
// The f8 dtypes are storage dtypes: kernels other than conversions and fills refuse them
// (check_compute_dtype, called where kernel names are spelled and by the library paths).
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include "flame.h"

namespace flame {

using DType = flame_dtype_t;
constexpr int kNumDTypes = 10;

bool dtype_valid(int d);
size_t dtype_size(DType d);
const char* dtype_name(DType d);
bool is_floating(DType d);
bool is_integral(DType d);  // integers and bool
// f8_e4m3 and f8_e5m2: floating, but only created, copied, converted and moved (flame.h).
bool is_storage_only(DType d);
// Throws FLAME_ERROR_UNSUPPORTED for a storage-only dtype: "<what> does not take f8_e4m3 ...".
void check_compute_dtype(DType d, const char* what);
// The C++ type the kernels use for d ("float", "flame::half_t", ...).
const char* device_type(DType d);
// NumPy-like promotion: bool < u8 < i32 < i64 < f16,bf16 < f32 < f64; f16 with bf16 gives f32.
// An f8 dtype promotes only with itself (FLAME_ERROR_UNSUPPORTED otherwise, as PyTorch).
DType promote(DType a, DType b);
// The dtype reductions accumulate sums in: i64 for integers and bool, else the input dtype.
DType sum_result_dtype(DType d);

// Host conversions for 16-bit floats (round to nearest even).
uint16_t float_to_half_bits(float f);
float half_bits_to_float(uint16_t h);
uint16_t float_to_bf16_bits(float f);
float bf16_bits_to_float(uint16_t h);
// Host conversions for the f8 dtypes, bit for bit as PyTorch's c10::Float8_e4m3fn / Float8_e5m2
// (round to nearest even; e4m3: beyond the range and infinities give NaN; e5m2: infinity).
uint8_t float_to_f8_e4m3_bits(float f);
float f8_e4m3_bits_to_float(uint8_t b);
uint8_t float_to_f8_e5m2_bits(float f);
float f8_e5m2_bits_to_float(uint8_t b);
// Reads one element of dtype d at p as double, and writes v converted to d at p.
double load_as_double(const void* p, DType d);
void store_from_double(void* p, DType d, double v);

}  // namespace flame

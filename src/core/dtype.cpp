#include "core/dtype.h"
#include <cmath>
#include "core/error.h"

namespace flame {

bool dtype_valid(int d) { return d >= 0 && d < kNumDTypes; }

size_t dtype_size(DType d) {
  switch (d) {
    case FLAME_DTYPE_F32: case FLAME_DTYPE_I32: return 4;
    case FLAME_DTYPE_F16: case FLAME_DTYPE_BF16: return 2;
    case FLAME_DTYPE_F64: case FLAME_DTYPE_I64: return 8;
    case FLAME_DTYPE_U8: case FLAME_DTYPE_BOOL: case FLAME_DTYPE_F8_E4M3: case FLAME_DTYPE_F8_E5M2: return 1;
  }
  return 0;
}

const char* dtype_name(DType d) {
  switch (d) {
    case FLAME_DTYPE_F32: return "f32";
    case FLAME_DTYPE_F16: return "f16";
    case FLAME_DTYPE_BF16: return "bf16";
    case FLAME_DTYPE_F64: return "f64";
    case FLAME_DTYPE_I32: return "i32";
    case FLAME_DTYPE_I64: return "i64";
    case FLAME_DTYPE_U8: return "u8";
    case FLAME_DTYPE_BOOL: return "bool";
    case FLAME_DTYPE_F8_E4M3: return "f8_e4m3";
    case FLAME_DTYPE_F8_E5M2: return "f8_e5m2";
  }
  return "unknown";
}

bool is_floating(DType d) {
  return d == FLAME_DTYPE_F32 || d == FLAME_DTYPE_F16 || d == FLAME_DTYPE_BF16 || d == FLAME_DTYPE_F64 ||
         is_storage_only(d);
}
bool is_integral(DType d) { return dtype_valid(d) && !is_floating(d); }
bool is_storage_only(DType d) { return d == FLAME_DTYPE_F8_E4M3 || d == FLAME_DTYPE_F8_E5M2; }

void check_compute_dtype(DType d, const char* what) {
  FLAME_CHECK(!is_storage_only(d), FLAME_ERROR_UNSUPPORTED, what, " does not take ", dtype_name(d),
              " tensors: the f8 dtypes are storage dtypes (create, copy, convert, save, load); convert to "
              "f32, f16 or bf16 with flame_to_dtype first");
}

const char* device_type(DType d) {
  switch (d) {
    case FLAME_DTYPE_F32: return "float";
    case FLAME_DTYPE_F16: return "flame::half_t";
    case FLAME_DTYPE_BF16: return "flame::bf16_t";
    case FLAME_DTYPE_F64: return "double";
    case FLAME_DTYPE_I32: return "int";
    case FLAME_DTYPE_I64: return "long long";
    case FLAME_DTYPE_U8: return "unsigned char";
    case FLAME_DTYPE_BOOL: return "bool";
    case FLAME_DTYPE_F8_E4M3: return "flame::f8_e4m3_t";
    case FLAME_DTYPE_F8_E5M2: return "flame::f8_e5m2_t";
  }
  return "void";
}

static int rank(DType d) {
  switch (d) {
    case FLAME_DTYPE_BOOL: return 0;
    case FLAME_DTYPE_U8: return 1;
    case FLAME_DTYPE_I32: return 2;
    case FLAME_DTYPE_I64: return 3;
    case FLAME_DTYPE_F16: case FLAME_DTYPE_BF16: return 4;
    case FLAME_DTYPE_F32: return 5;
    case FLAME_DTYPE_F64: return 6;
    case FLAME_DTYPE_F8_E4M3: case FLAME_DTYPE_F8_E5M2: return 4;  // never compared: promote refuses them
  }
  return -1;
}

DType promote(DType a, DType b) {
  if (a == b) return a;
  FLAME_CHECK(!is_storage_only(a) && !is_storage_only(b), FLAME_ERROR_UNSUPPORTED, "no dtype promotion of ",
              dtype_name(a), " with ", dtype_name(b), ": the f8 dtypes are storage dtypes; convert both to one dtype "
              "(f32, f16 or bf16) with flame_to_dtype first");
  if ((a == FLAME_DTYPE_F16 && b == FLAME_DTYPE_BF16) || (a == FLAME_DTYPE_BF16 && b == FLAME_DTYPE_F16))
    return FLAME_DTYPE_F32;
  return rank(a) >= rank(b) ? a : b;
}

DType sum_result_dtype(DType d) { return is_integral(d) ? FLAME_DTYPE_I64 : d; }

uint16_t float_to_half_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return static_cast<uint16_t>(sign | (absx > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (absx < 0x38800000u) {                                              // subnormal half
    float af;
    std::memcpy(&af, &absx, 4);
    uint32_t m = static_cast<uint32_t>(std::nearbyint(af * 16777216.0f));  // units of 2^-24
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t mant = absx & 0x7fffffu;
  uint32_t exp = (absx >> 23) - 112;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
  return static_cast<uint16_t>(sign | h);
}

float half_bits_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -f : f;
  }
  // Infinity, or NaN quiet with its sign and payload (as PyTorch's fp16_ieee_to_fp32_value and the
  // device's half_to_float_keep_nan).
  uint32_t x = exp == 31 ? (sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u))
                         : (sign | ((exp + 112) << 23) | (mant << 13));
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t float_to_bf16_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

float bf16_bits_to_float(uint16_t h) {
  uint32_t x = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

// ---------------- f8 ----------------
// The same semantics as PyTorch's c10 conversions (torch/headeronly/util/Float8_e4m3fn.h and
// Float8_e5m2.h), written as integer arithmetic on the f32 bits so that the device code
// (cuda/common.cuh) can mirror it line for line.

namespace {

uint32_t float_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return x;
}
float bits_float(uint32_t x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

// sig / 2^shift rounded to nearest, ties to even (shift >= 1).
uint32_t shift_round_even(uint32_t sig, int shift) {
  if (shift >= 32) return 0;  // sig < 2^24: far below half a unit
  const uint32_t q = sig >> shift, rem = sig & ((1u << shift) - 1), half = 1u << (shift - 1);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

// The unsigned f8 code nearest to the finite magnitude with f32 bits a (ties to even), for an f8
// format of mbits mantissa bits and exponent bias `bias`, without an upper limit: a carry past the
// largest exponent gives the next code up, which the callers turn into NaN or infinity.
uint32_t f8_magnitude_code(uint32_t a, int mbits, int bias) {
  const int e = static_cast<int>(a >> 23);              // biased f32 exponent; 0: f32 subnormal
  const int e_eff = e ? e : 1;
  const uint32_t frac = a & 0x7fffffu;
  if (e_eff - 127 < 1 - bias) {  // below the f8 normal range: units of the smallest subnormal
    const uint32_t sig = frac | (e ? 0x800000u : 0u);  // a = sig * 2^(e_eff - 150)
    return shift_round_even(sig, (1 - bias - mbits) - (e_eff - 150));
  }
  const uint32_t head = (static_cast<uint32_t>(e - 127 + bias) << mbits) | (frac >> (23 - mbits));
  const uint32_t rest = frac & ((1u << (23 - mbits)) - 1), half = 1u << (22 - mbits);
  return head + ((rest > half || (rest == half && (head & 1u))) ? 1u : 0u);
}

}  // namespace

uint8_t float_to_f8_e4m3_bits(float f) {
  const uint32_t x = float_bits(f), a = x & 0x7fffffffu;
  const uint8_t sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  if (a >= 0x43f00000u) return static_cast<uint8_t>(sign | 0x7fu);  // >= 480, infinities, NaN: NaN
  return static_cast<uint8_t>(sign | f8_magnitude_code(a, 3, 7));     // 0x7f (rounded past 448): NaN
}

float f8_e4m3_bits_to_float(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24, e = (b >> 3) & 0xfu, m = b & 7u;
  if ((b & 0x7fu) == 0x7fu) return bits_float(sign | 0x7ff00000u);  // NaN (PyTorch's pattern)
  if (e == 0) return std::copysign(std::ldexp(static_cast<float>(m), -9), sign ? -1.0f : 1.0f);
  return bits_float(sign | ((e + 120u) << 23) | (m << 20));
}

uint8_t float_to_f8_e5m2_bits(float f) {
  const uint32_t x = float_bits(f), a = x & 0x7fffffffu;
  const uint8_t sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);   // NaN
  if (a >= 0x47800000u) return static_cast<uint8_t>(sign | 0x7cu);  // >= 65536 and infinities: infinity
  return static_cast<uint8_t>(sign | f8_magnitude_code(a, 2, 15));  // 0x7c (rounded past 57344): infinity
}

float f8_e5m2_bits_to_float(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24, e = (b >> 2) & 0x1fu, m = b & 3u;
  // Infinity, or NaN quiet with its sign and payload (c10 decodes the f16 whose top byte this is).
  if (e == 31) return bits_float(sign | 0x7f800000u | (m << 21) | (m ? 0x400000u : 0u));
  if (e == 0) return std::copysign(std::ldexp(static_cast<float>(m), -16), sign ? -1.0f : 1.0f);
  return bits_float(sign | ((e + 112u) << 23) | (m << 21));
}

double load_as_double(const void* p, DType d) {
  switch (d) {
    case FLAME_DTYPE_F32: { float v; std::memcpy(&v, p, 4); return v; }
    case FLAME_DTYPE_F16: { uint16_t v; std::memcpy(&v, p, 2); return half_bits_to_float(v); }
    case FLAME_DTYPE_BF16: { uint16_t v; std::memcpy(&v, p, 2); return bf16_bits_to_float(v); }
    case FLAME_DTYPE_F64: { double v; std::memcpy(&v, p, 8); return v; }
    case FLAME_DTYPE_I32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case FLAME_DTYPE_I64: { int64_t v; std::memcpy(&v, p, 8); return static_cast<double>(v); }
    case FLAME_DTYPE_U8: return *static_cast<const uint8_t*>(p);
    case FLAME_DTYPE_BOOL: return *static_cast<const uint8_t*>(p) ? 1.0 : 0.0;
    case FLAME_DTYPE_F8_E4M3: return f8_e4m3_bits_to_float(*static_cast<const uint8_t*>(p));
    case FLAME_DTYPE_F8_E5M2: return f8_e5m2_bits_to_float(*static_cast<const uint8_t*>(p));
  }
  return 0.0;
}

void store_from_double(void* p, DType d, double v) {
  switch (d) {
    case FLAME_DTYPE_F32: { float x = static_cast<float>(v); std::memcpy(p, &x, 4); return; }
    case FLAME_DTYPE_F16: { uint16_t x = float_to_half_bits(static_cast<float>(v)); std::memcpy(p, &x, 2); return; }
    case FLAME_DTYPE_BF16: { uint16_t x = float_to_bf16_bits(static_cast<float>(v)); std::memcpy(p, &x, 2); return; }
    case FLAME_DTYPE_F64: std::memcpy(p, &v, 8); return;
    case FLAME_DTYPE_I32: { int32_t x = static_cast<int32_t>(v); std::memcpy(p, &x, 4); return; }
    case FLAME_DTYPE_I64: { int64_t x = static_cast<int64_t>(v); std::memcpy(p, &x, 8); return; }
    case FLAME_DTYPE_U8: *static_cast<uint8_t*>(p) = static_cast<uint8_t>(v); return;
    case FLAME_DTYPE_BOOL: *static_cast<uint8_t*>(p) = v != 0.0; return;
    case FLAME_DTYPE_F8_E4M3: *static_cast<uint8_t*>(p) = float_to_f8_e4m3_bits(static_cast<float>(v)); return;
    case FLAME_DTYPE_F8_E5M2: *static_cast<uint8_t*>(p) = float_to_f8_e5m2_bits(static_cast<float>(v)); return;
  }
}

}  // namespace flame

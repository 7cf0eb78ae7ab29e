#include "core/dtype.h"
#include <cmath>

namespace flame {

bool dtype_valid(int d) { return d >= 0 && d < kNumDTypes; }

size_t dtype_size(DType d) {
  switch (d) {
    case FLAME_DTYPE_F32: case FLAME_DTYPE_I32: return 4;
    case FLAME_DTYPE_F16: case FLAME_DTYPE_BF16: return 2;
    case FLAME_DTYPE_F64: case FLAME_DTYPE_I64: return 8;
    case FLAME_DTYPE_U8: case FLAME_DTYPE_BOOL: return 1;
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
  }
  return "unknown";
}

bool is_floating(DType d) {
  return d == FLAME_DTYPE_F32 || d == FLAME_DTYPE_F16 || d == FLAME_DTYPE_BF16 || d == FLAME_DTYPE_F64;
}
bool is_integral(DType d) { return dtype_valid(d) && !is_floating(d); }

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
  }
  return -1;
}

DType promote(DType a, DType b) {
  if (a == b) return a;
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
  uint32_t x = exp == 31 ? (sign | 0x7f800000u | (mant << 13)) : (sign | ((exp + 112) << 23) | (mant << 13));
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
  }
}

}  // namespace flame

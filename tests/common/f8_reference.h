// An independent float64 reference of the f8 dtypes (FLAME_DTYPE_F8_E4M3 / _E5M2, PyTorch's
// float8_e4m3fn / float8_e5m2): decoding from the fields with ldexp, and encoding by choosing the
// nearest of all 256 decoded values (ties to the even code), not by bit manipulation as the library
// does (src/core/dtype.cpp, cuda/common.cuh). Both sides of the tests use it: the CPU tests against
// the host conversions, the GPU tests against the conversion kernels. Values to encode are floats:
// PyTorch rounds f64 to f32 before converting, and so does FLAME.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace f8ref {

struct Format {
  int mbits;           // mantissa bits
  int bias;            // exponent bias
  bool ieee_specials;  // e5m2: exponent all ones is infinity / NaN; e4m3fn: only 0x7F/0xFF are NaN
  const char* name;
};
constexpr Format kE4M3{3, 7, false, "f8_e4m3"};
constexpr Format kE5M2{2, 15, true, "f8_e5m2"};

inline bool is_nan_code(const Format& f, uint8_t c) {
  const uint8_t mag = c & 0x7f;
  if (!f.ieee_specials) return mag == 0x7f;
  return (mag >> f.mbits) == (0x7f >> f.mbits) && (mag & ((1 << f.mbits) - 1)) != 0;
}
inline bool is_inf_code(const Format& f, uint8_t c) { return f.ieee_specials && (c & 0x7f) == 0x7c; }

// The value of code c (NaN for NaN codes, +-inf for e5m2's infinities).
inline double decode(const Format& f, uint8_t c) {
  const double sign = (c & 0x80) ? -1.0 : 1.0;
  if (is_nan_code(f, c)) return std::nan("");
  if (is_inf_code(f, c)) return sign * INFINITY;
  const int e = (c & 0x7f) >> f.mbits, m = c & ((1 << f.mbits) - 1);
  if (e == 0) return sign * std::ldexp(static_cast<double>(m), 1 - f.bias - f.mbits);
  return sign * std::ldexp(static_cast<double>((1 << f.mbits) + m), e - f.bias - f.mbits);
}

// The largest finite code's magnitude (0x7E for e4m3: 448; 0x7B for e5m2: 57344).
inline uint8_t max_finite_code(const Format& f) { return f.ieee_specials ? 0x7b : 0x7e; }

// PyTorch's .to(float8): nearest, ties to the even code; past the largest finite value (where the
// next code up would be nearer, or a tie that the even code wins) e4m3 gives NaN and e5m2
// infinity; infinities likewise; NaN gives 0x7F with the input's sign.
inline uint8_t encode(const Format& f, float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const uint8_t sign = (bits >> 24) & 0x80;
  const uint8_t overflow = f.ieee_specials ? 0x7c : 0x7f;
  if (std::isnan(x)) return sign | 0x7f;
  if (std::isinf(x)) return sign | overflow;
  const double a = std::fabs(static_cast<double>(x));
  const uint8_t top = max_finite_code(f);
  // The code past the top as a value: the top's spacing continued (480 for e4m3, 65536 for e5m2).
  const double past_top = 2 * decode(f, top) - decode(f, top - 1);
  if (a >= past_top) return sign | overflow;  // nearer the code past the top than any finite one
  uint8_t best = 0;
  double best_d = a;
  for (int c = 1; c <= top + 1; ++c) {
    const double v = c == top + 1 ? past_top : decode(f, static_cast<uint8_t>(c));
    const double d = std::fabs(v - a);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = static_cast<uint8_t>(c);
      best_d = d;
    }
  }
  if (best == top + 1) return sign | overflow;
  return sign | best;
}

// ---- The exact bits of PyTorch's CPU casts (c10), where the value alone does not fix them ----
// NaN bits: c10 decodes e4m3fn NaN to sign | 0x7FF00000 (fp8e4m3fn_to_fp32_value ORs the all-ones
// exponent into the rebiased 0x7F); e5m2 as the f16 it is the top byte of, and f16 to f32 keeps
// the NaN's sign and payload and sets the quiet bit (fp16_ieee_to_fp32_value's multiply, or the
// hardware conversion); f32 to f64 (C++) keeps sign and payload; f32 to f16 gives sign | 0x7E00
// (fp16_ieee_from_fp32_value); f32 to bf16 gives 0x7FC0 for every NaN (round_to_nearest_even).

inline uint32_t bits32(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
inline uint64_t bits64(double d) {
  uint64_t b;
  std::memcpy(&b, &d, 8);
  return b;
}
inline float float_of(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// An f16 bit pattern's value from its fields (NaN with the pattern's sign).
inline float half_value(uint16_t h) {
  const float sign = (h & 0x8000) ? -1.0f : 1.0f;
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 31) return m ? std::copysign(std::numeric_limits<float>::quiet_NaN(), sign) : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -24);
  return sign * std::ldexp(static_cast<float>(1024 + m), e - 25);
}
// PyTorch's f16 -> f32 bits.
inline uint32_t torch_half_to_f32_bits(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16, m = h & 0x3ff;
  if ((h & 0x7c00) == 0x7c00 && m) return sign | 0x7fc00000u | (m << 13);
  return bits32(half_value(h));
}

// PyTorch's f8 -> f32 bits of code c.
inline uint32_t torch_f32_bits(const Format& f, uint8_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x80) << 24;
  if (is_nan_code(f, c)) return f.ieee_specials ? torch_half_to_f32_bits(static_cast<uint16_t>(c << 8)) : sign | 0x7ff00000u;
  return bits32(static_cast<float>(decode(f, c)));  // exact; -0.0 for 0x80
}
// PyTorch's f8 -> f64 bits of code c (through the f32 value).
inline uint64_t torch_f64_bits(const Format& f, uint8_t c) {
  const uint32_t b = torch_f32_bits(f, c);
  if (!is_nan_code(f, c)) return bits64(decode(f, c));
  return (static_cast<uint64_t>(b & 0x80000000u) << 32) | 0x7ff0000000000000ull |
         (static_cast<uint64_t>(b & 0x7fffffu) << 29);
}
// PyTorch's f8 -> f16 bits of code c: every f8 value is exact in f16.
inline uint16_t torch_f16_bits(const Format& f, uint8_t c) {
  const uint16_t sign = static_cast<uint16_t>((c & 0x80) << 8);
  if (is_nan_code(f, c)) return sign | 0x7e00;
  const double a = std::fabs(decode(f, c));
  if (std::isinf(a)) return sign | 0x7c00;
  if (a == 0) return sign;
  int e = 0;
  const double frac = std::frexp(a, &e);  // a = frac * 2^e, frac in [0.5, 1)
  if (e - 1 < -14) return sign | static_cast<uint16_t>(std::ldexp(a, 24));  // an f16 subnormal
  return sign | static_cast<uint16_t>(((e - 1 + 15) << 10) | static_cast<int>(std::ldexp(frac, 11) - 1024));
}
// PyTorch's f8 -> bf16 bits of code c: every f8 value is exact in bf16.
inline uint16_t torch_bf16_bits(const Format& f, uint8_t c) {
  if (is_nan_code(f, c)) return 0x7fc0;
  return static_cast<uint16_t>(bits32(static_cast<float>(decode(f, c))) >> 16);
}

// Floats that exercise every rule of both formats: zeros, the smallest subnormals and the ties
// around them, the subnormal/normal boundary, ties to even between normals, the largest values,
// the ties and values just past them, infinities and NaN, each with both signs.
inline std::vector<float> edge_values() {
  std::vector<float> v = {0.0f, 1.0f, 1.5f, 0.1f, 3.14159f, 1.0625f, 1.125f, 1.1875f, 1.25f, 1.375f,
                          // e4m3: subnormal unit 2^-9, min normal 2^-6, max 448, overflow tie 464
                          std::ldexp(1.0f, -9), std::ldexp(1.0f, -10), std::ldexp(3.0f, -11), std::ldexp(1.5f, -9),
                          std::ldexp(2.5f, -9), std::ldexp(1.0f, -6), std::ldexp(7.5f, -9), std::ldexp(15.0f, -10),
                          std::ldexp(1.0f, -11), 240.0f, 248.0f, 256.0f, 272.0f, 288.0f, 416.0f, 432.0f, 440.0f,
                          448.0f, 456.0f, 463.99f, 464.0f, 464.01f, 479.99f, 480.0f, 500.0f, 1000.0f, 65504.0f,
                          // e5m2: subnormal unit 2^-16, min normal 2^-14, max 57344, overflow tie 61440
                          std::ldexp(1.0f, -16), std::ldexp(1.0f, -17), std::ldexp(3.0f, -17), std::ldexp(1.0f, -14),
                          std::ldexp(3.5f, -16), std::ldexp(1.0f, -18), 1.125f * 4, 1.375f * 8, 49152.0f, 53248.0f,
                          57344.0f, 59392.0f, 61439.99f, 61440.0f, 61441.0f, 65535.0f, 65536.0f, 1.0e6f, 3.0e38f,
                          std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(), INFINITY, NAN};
  const size_t n = v.size();
  for (size_t i = 0; i < n; ++i) v.push_back(-v[i]);
  return v;
}

}  // namespace f8ref

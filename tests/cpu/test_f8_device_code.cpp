// The device code of the f8 casts (cuda/common.cuh: convert_element, the f8 encoders and decoders
// and the NaN-keeping widenings) compiled for the host and run over every f8 code and every class
// of input, against the PyTorch bit tables of tests/common/f8_reference.h, which are written from
// the formats' definitions and c10's rules, not from this code. The casts are integer arithmetic,
// so the host runs the same expressions as the GPU; what cannot run here are the PTX conversions
// (cvt.f32.f16 and friends, swallowed below), so only paths that avoid them are called: f8 to and
// from every dtype but finite f16 sources, and f16 NaN sources (which must not reach cvt.f32.f16:
// it canonicalises every NaN to 0x7FFFFFFF, the H200 failure this test guards against).
// The header is included inside a namespace of its own, with host stand-ins for the CUDA
// built-ins it names; a new built-in in common.cuh needs a stand-in here.
#include <gtest/gtest.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include "f8_reference.h"

namespace f8_device_code {

inline unsigned __float_as_uint(float f) { return f8ref::bits32(f); }
inline float __uint_as_float(unsigned u) { return f8ref::float_of(u); }
inline long long __double_as_longlong(double d) { return static_cast<long long>(f8ref::bits64(d)); }
inline double __longlong_as_double(long long u) {
  double d;
  std::memcpy(&d, &u, 8);
  return d;
}
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline unsigned __umulhi(unsigned a, unsigned b) {
  return static_cast<unsigned>((static_cast<unsigned long long>(a) * b) >> 32);
}
inline int __clz(int x) { return x ? __builtin_clz(static_cast<unsigned>(x)) : 32; }
template <class T> T __shfl_down_sync(unsigned, T v, int) { return v; }
inline void __syncthreads() {}
struct Dim3 { unsigned x, y, z; };
[[maybe_unused]] constexpr Dim3 threadIdx{0, 0, 0}, blockIdx{0, 0, 0}, blockDim{1, 1, 1}, gridDim{1, 1, 1};

#define __device__
#define __global__
#define __forceinline__ inline
#define asm(...) ((void)0)
#if defined(__clang__)
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wuninitialized"
#pragma clang diagnostic ignored "-Wunused-function"
#pragma clang diagnostic ignored "-Wunused-parameter"
#else
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#endif
#include "../../cuda/common.cuh"
#if defined(__clang__)
#pragma clang diagnostic pop
#else
#pragma GCC diagnostic pop
#endif
#undef asm
#undef __forceinline__
#undef __global__
#undef __device__

}  // namespace f8_device_code

namespace {

namespace dev = f8_device_code::flame;
using f8ref::bits32;
using f8ref::bits64;

bool is_f16_nan(uint32_t b) { return (b & 0x7c00) == 0x7c00 && (b & 0x3ff) != 0; }

template <class Q>
void check_format(const f8ref::Format& f) {
  SCOPED_TRACE(f.name);
  // Decoding: every code to f32, f64, f16 and bf16, bit for bit.
  for (int c = 0; c < 256; ++c) {
    const Q q{static_cast<unsigned char>(c)};
    const uint8_t code = static_cast<uint8_t>(c);
    EXPECT_EQ(bits32(dev::convert_element<float>(q)), f8ref::torch_f32_bits(f, code)) << "code " << c << " to f32";
    EXPECT_EQ(bits64(dev::convert_element<double>(q)), f8ref::torch_f64_bits(f, code)) << "code " << c << " to f64";
    EXPECT_EQ(dev::convert_element<dev::half_t>(q).x, f8ref::torch_f16_bits(f, code)) << "code " << c << " to f16";
    EXPECT_EQ(dev::convert_element<dev::bf16_t>(q).x, f8ref::torch_bf16_bits(f, code)) << "code " << c << " to bf16";
  }
  // Encoding f32 and f64 (casts) and f64 fill values: the edge values, both NaN signs among them.
  for (float x : f8ref::edge_values()) {
    const int want = f8ref::encode(f, x);
    EXPECT_EQ(int(dev::convert_element<Q>(x).x), want) << "f32 " << x << " (0x" << std::hex << bits32(x) << ")";
    EXPECT_EQ(int(dev::convert_element<Q>(static_cast<double>(x)).x), want) << "f64 " << x;
    EXPECT_EQ(int(dev::cast<Q>(static_cast<double>(x)).x), want) << "fill " << x;
  }
  EXPECT_EQ(int(dev::cast<Q>(std::copysign(NAN, -1.0)).x), 0xff) << "fill -NaN";
  EXPECT_EQ(int(dev::cast<Q>(std::copysign(NAN, 1.0)).x), 0x7f) << "fill NaN";
  // Random f32 bit patterns (every exponent, NaN payloads of both signs).
  std::mt19937 rng(35);
  for (int i = 0; i < 200000 && !testing::Test::HasFailure(); ++i) {
    const float x = f8ref::float_of(static_cast<uint32_t>(rng()));
    EXPECT_EQ(int(dev::convert_element<Q>(x).x), int(f8ref::encode(f, x))) << "f32 0x" << std::hex << bits32(x);
  }
  // Every bf16 pattern, and every f16 NaN pattern (finite f16 goes through cvt.f32.f16).
  for (uint32_t b = 0; b < 65536 && !testing::Test::HasFailure(); ++b) {
    const dev::bf16_t bf{static_cast<unsigned short>(b)};
    EXPECT_EQ(int(dev::convert_element<Q>(bf).x), int(f8ref::encode(f, f8ref::float_of(b << 16)))) << "bf16 0x" << std::hex << b;
    if (!is_f16_nan(b)) continue;
    const dev::half_t h{static_cast<unsigned short>(b)};
    EXPECT_EQ(int(dev::convert_element<Q>(h).x), (b & 0x8000) ? 0xff : 0x7f) << "f16 NaN 0x" << std::hex << b;
  }
}

TEST(F8DeviceCode, EveryCodeDecodesAndEncodesAsPyTorch) {
  check_format<dev::f8_e4m3_t>(f8ref::kE4M3);
  check_format<dev::f8_e5m2_t>(f8ref::kE5M2);
}

TEST(F8DeviceCode, F8ToF8GoesThroughTheF32Value) {
  for (int c = 0; c < 256; ++c) {
    const dev::f8_e4m3_t a{static_cast<unsigned char>(c)};
    const dev::f8_e5m2_t b{static_cast<unsigned char>(c)};
    const float va = f8ref::float_of(f8ref::torch_f32_bits(f8ref::kE4M3, static_cast<uint8_t>(c)));
    const float vb = f8ref::float_of(f8ref::torch_f32_bits(f8ref::kE5M2, static_cast<uint8_t>(c)));
    EXPECT_EQ(int(dev::convert_element<dev::f8_e5m2_t>(a).x), int(f8ref::encode(f8ref::kE5M2, va))) << "e4m3 " << c;
    EXPECT_EQ(int(dev::convert_element<dev::f8_e4m3_t>(b).x), int(f8ref::encode(f8ref::kE4M3, vb))) << "e5m2 " << c;
    EXPECT_EQ(int(dev::convert_element<dev::f8_e4m3_t>(a).x), c) << "a same-dtype copy keeps the byte";
  }
}

// f16 NaN to f32 / f64 keeps its sign and payload, quiet (PyTorch's fp16_ieee_to_fp32_value), and
// f32 NaN to f64 likewise (C++'s float to double): no canonical NaN.
TEST(F8DeviceCode, NaNWideningsKeepSignAndPayload) {
  for (uint32_t b = 0; b < 65536; ++b) {
    if (!is_f16_nan(b)) continue;
    const dev::half_t h{static_cast<unsigned short>(b)};
    const uint32_t want = f8ref::torch_half_to_f32_bits(static_cast<uint16_t>(b));
    EXPECT_EQ(bits32(dev::convert_element<float>(h)), want) << "f16 0x" << std::hex << b;
    EXPECT_EQ(bits64(dev::convert_element<double>(h)), bits64(static_cast<double>(f8ref::float_of(want))))
        << "f16 0x" << std::hex << b;
    if (testing::Test::HasFailure()) return;
  }
  for (uint32_t f : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff812345u, 0xfff00000u}) {
    const uint64_t want = (static_cast<uint64_t>(f & 0x80000000u) << 32) | 0x7ff8000000000000ull |
                          (static_cast<uint64_t>(f & 0x7fffffu) << 29);
    EXPECT_EQ(bits64(dev::convert_element<double>(f8ref::float_of(f))), want) << "f32 0x" << std::hex << f;
  }
}

}  // namespace

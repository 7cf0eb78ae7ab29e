// The f8 storage dtypes on the host: the conversions of src/core/dtype.cpp against the float64
// reference of tests/common/f8_reference.h (every code decoded; the edge values, every f16 and bf16
// value and random floats encoded), the dtype tables (size, name, device type, promotion), and the
// refusals that keep compute kernels away from f8 (kernel_name, the elementwise launcher).
#include <gtest/gtest.h>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include "core/dtype.h"
#include "core/error.h"
#include "f8_reference.h"
#include "io/safetensors.h"
#include "ops/launch.h"
#include "runtime/kernel_key.h"

using namespace flame;

namespace {

struct HostF8 {
  const f8ref::Format& fmt;
  DType dtype;
  uint8_t (*encode)(float);
  float (*decode)(uint8_t);
};
const HostF8 kFormats[] = {{f8ref::kE4M3, FLAME_DTYPE_F8_E4M3, float_to_f8_e4m3_bits, f8_e4m3_bits_to_float},
                           {f8ref::kE5M2, FLAME_DTYPE_F8_E5M2, float_to_f8_e5m2_bits, f8_e5m2_bits_to_float}};

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// Expects the host encoding of x to be the reference's, bit for bit.
void expect_encodes(const HostF8& h, float x) {
  const uint8_t want = f8ref::encode(h.fmt, x), got = h.encode(x);
  EXPECT_EQ(int(got), int(want)) << h.fmt.name << " of " << x << " (bits 0x" << std::hex << bits_of(x) << ")";
}

flame_status_t status_of(const std::function<void()>& f, std::string* msg = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (msg) *msg = e.what();
    return e.status();
  }
  return FLAME_OK;
}

}  // namespace

TEST(F8, DecodesEveryCode) {
  for (const HostF8& h : kFormats) {
    for (int c = 0; c < 256; ++c) {
      const double want = f8ref::decode(h.fmt, static_cast<uint8_t>(c));
      const float got = h.decode(static_cast<uint8_t>(c));
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << h.fmt.name << " code " << c;
        EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << h.fmt.name << " NaN code " << c << " keeps its sign";
      } else {
        EXPECT_EQ(static_cast<double>(got), want) << h.fmt.name << " code " << c;
        EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << h.fmt.name << " code " << c;  // -0 included
      }
    }
  }
  // The documented landmarks.
  EXPECT_EQ(f8_e4m3_bits_to_float(0x7e), 448.0f);
  EXPECT_EQ(f8_e4m3_bits_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(f8_e4m3_bits_to_float(0x08), std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(f8_e4m3_bits_to_float(0x7f)) && std::isnan(f8_e4m3_bits_to_float(0xff)));
  EXPECT_EQ(f8_e4m3_bits_to_float(0x78), 256.0f) << "e4m3fn has no infinity: exponent 15 is finite";
  EXPECT_EQ(f8_e5m2_bits_to_float(0x7b), 57344.0f);
  EXPECT_EQ(f8_e5m2_bits_to_float(0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(f8_e5m2_bits_to_float(0x7c), INFINITY);
  EXPECT_EQ(f8_e5m2_bits_to_float(0xfc), -INFINITY);
  EXPECT_EQ(bits_of(f8_e4m3_bits_to_float(0x7f)), 0x7ff00000u) << "PyTorch's NaN pattern";
}

TEST(F8, EncodesEdgeValues) {
  for (const HostF8& h : kFormats)
    for (float x : f8ref::edge_values()) expect_encodes(h, x);
  // The documented rules, spelled out.
  EXPECT_EQ(float_to_f8_e4m3_bits(448.0f), 0x7e);
  EXPECT_EQ(float_to_f8_e4m3_bits(464.0f), 0x7e) << "the tie rounds to even 448";
  EXPECT_EQ(float_to_f8_e4m3_bits(464.5f), 0x7f) << "past the tie: NaN, not saturated";
  EXPECT_EQ(float_to_f8_e4m3_bits(-1000.0f), 0xff);
  EXPECT_EQ(float_to_f8_e4m3_bits(INFINITY), 0x7f);
  EXPECT_EQ(float_to_f8_e4m3_bits(-0.0f), 0x80);
  EXPECT_EQ(float_to_f8_e4m3_bits(std::ldexp(1.0f, -10)), 0x00) << "half the smallest subnormal: ties to even 0";
  EXPECT_EQ(float_to_f8_e4m3_bits(std::ldexp(3.0f, -10)), 0x02) << "1.5 units: ties to even 2";
  EXPECT_EQ(float_to_f8_e5m2_bits(57344.0f), 0x7b);
  EXPECT_EQ(float_to_f8_e5m2_bits(61440.0f), 0x7c) << "the tie rounds to even: infinity";
  EXPECT_EQ(float_to_f8_e5m2_bits(61439.0f), 0x7b);
  EXPECT_EQ(float_to_f8_e5m2_bits(-INFINITY), 0xfc);
  EXPECT_EQ(float_to_f8_e5m2_bits(NAN), 0x7f);
  EXPECT_EQ(float_to_f8_e5m2_bits(-NAN), 0xff);
}

TEST(F8, EncodesEveryHalfAndBfloat16Value) {
  for (const HostF8& h : kFormats) {
    for (uint32_t b = 0; b < 65536; ++b) {
      expect_encodes(h, half_bits_to_float(static_cast<uint16_t>(b)));
      expect_encodes(h, bf16_bits_to_float(static_cast<uint16_t>(b)));
      if (HasFailure()) return;  // one message per kind of mistake is enough
    }
  }
}

TEST(F8, EncodesRandomFloatsAndMidpoints) {
  const uint64_t seed = std::random_device()();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (const HostF8& h : kFormats) {
    for (int i = 0; i < 100000 && !HasFailure(); ++i) expect_encodes(h, from_bits(static_cast<uint32_t>(rng())));
    // Every midpoint between neighbouring codes, and the floats on either side of it.
    for (int c = 0; c < 0x7f && !HasFailure(); ++c) {
      const double lo = f8ref::decode(h.fmt, static_cast<uint8_t>(c)), hi = f8ref::decode(h.fmt, static_cast<uint8_t>(c + 1));
      if (!std::isfinite(lo) || !std::isfinite(hi)) continue;
      const float mid = static_cast<float>((lo + hi) / 2);
      for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
        expect_encodes(h, x);
        expect_encodes(h, -x);
      }
    }
  }
}

TEST(F8, EveryValueRoundTrips) {
  for (const HostF8& h : kFormats) {
    for (int c = 0; c < 256; ++c) {
      const uint8_t code = static_cast<uint8_t>(c);
      const uint8_t back = h.encode(h.decode(code));
      const int want = f8ref::is_nan_code(h.fmt, code) ? ((c & 0x80) | 0x7f) : c;  // NaN: the canonical code
      EXPECT_EQ(int(back), want) << h.fmt.name << " code " << c;
    }
  }
}

TEST(F8, LoadsAndStoresThroughDouble) {
  for (const HostF8& h : kFormats) {
    for (double v : {0.0, -2.5, 0.3, 1e-9, 300.0, 60000.0, 1e300}) {
      uint8_t b = 0xaa;
      store_from_double(&b, h.dtype, v);
      EXPECT_EQ(int(b), int(h.encode(static_cast<float>(v)))) << h.fmt.name << " " << v << ": through f32, as PyTorch";
      const double back = load_as_double(&b, h.dtype);
      if (std::isnan(back)) {
        EXPECT_TRUE(f8ref::is_nan_code(h.fmt, b));
      } else {
        EXPECT_EQ(back, f8ref::decode(h.fmt, b));
      }
    }
  }
}

TEST(F8, DtypeTables) {
  for (const HostF8& h : kFormats) {
    EXPECT_TRUE(dtype_valid(h.dtype));
    EXPECT_EQ(dtype_size(h.dtype), 1u);
    EXPECT_STREQ(dtype_name(h.dtype), h.fmt.name);
    EXPECT_TRUE(is_floating(h.dtype));
    EXPECT_FALSE(is_integral(h.dtype));
    EXPECT_TRUE(is_storage_only(h.dtype));
    EXPECT_EQ(promote(h.dtype, h.dtype), h.dtype);
    for (DType other : {FLAME_DTYPE_F32, FLAME_DTYPE_BF16, FLAME_DTYPE_BOOL, FLAME_DTYPE_I64}) {
      std::string msg;
      EXPECT_EQ(status_of([&] { promote(h.dtype, other); }, &msg), FLAME_ERROR_UNSUPPORTED) << dtype_name(other);
      EXPECT_NE(msg.find(h.fmt.name), std::string::npos) << msg;
      EXPECT_EQ(status_of([&] { promote(other, h.dtype); }), FLAME_ERROR_UNSUPPORTED) << dtype_name(other);
    }
  }
  EXPECT_EQ(status_of([] { promote(FLAME_DTYPE_F8_E4M3, FLAME_DTYPE_F8_E5M2); }), FLAME_ERROR_UNSUPPORTED);
  EXPECT_STREQ(device_type(FLAME_DTYPE_F8_E4M3), "flame::f8_e4m3_t");
  EXPECT_STREQ(device_type(FLAME_DTYPE_F8_E5M2), "flame::f8_e5m2_t");
  EXPECT_STREQ(st::format_dtype_name(FLAME_DTYPE_F8_E4M3), "F8_E4M3");
  EXPECT_STREQ(st::format_dtype_name(FLAME_DTYPE_F8_E5M2), "F8_E5M2");
  for (DType d : {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_F64, FLAME_DTYPE_I32, FLAME_DTYPE_I64,
                  FLAME_DTYPE_U8, FLAME_DTYPE_BOOL}) {
    EXPECT_FALSE(is_storage_only(d));
    EXPECT_EQ(status_of([&] { check_compute_dtype(d, "x"); }), FLAME_OK);
  }
}

TEST(F8, ComputeKernelsRefuseF8) {
  // Any template without storage_dtypes: refused when its name is spelled (before any compile).
  static constexpr KernelTemplate kReduce{"reduce.cuh", "flame::reduce_general",
                                          {TArg::Text, TArg::Dtype, TArg::Dtype, TArg::Dtype}};
  for (DType d : {FLAME_DTYPE_F8_E4M3, FLAME_DTYPE_F8_E5M2}) {
    std::string msg;
    EXPECT_EQ(status_of([&] { kernel_name(make_key(kReduce, "SumOp", d, FLAME_DTYPE_F32, FLAME_DTYPE_F32)); }, &msg),
              FLAME_ERROR_UNSUPPORTED);
    EXPECT_NE(msg.find("flame::reduce_general"), std::string::npos) << msg;
    EXPECT_NE(msg.find(dtype_name(d)), std::string::npos) << msg;
    EXPECT_NE(msg.find("flame_to_dtype"), std::string::npos) << msg;
    EXPECT_EQ(status_of([&] { kernel_name(make_key(kReduce, "SumOp", FLAME_DTYPE_F32, FLAME_DTYPE_F32, d)); }),
              FLAME_ERROR_UNSUPPORTED);
    // The elementwise kernels take f8 for conversions and fills only.
    EXPECT_EQ(status_of([&] { elementwise_instantiations("Add", d, {d, d}); }, &msg), FLAME_ERROR_UNSUPPORTED);
    EXPECT_NE(msg.find("Add"), std::string::npos) << msg;
    EXPECT_EQ(status_of([&] { elementwise_instantiations("Exp", FLAME_DTYPE_F32, {d}); }), FLAME_ERROR_UNSUPPORTED);
    EXPECT_EQ(status_of([&] { elementwise_instantiations("Where", d, {FLAME_DTYPE_BOOL, d, d}); }), FLAME_ERROR_UNSUPPORTED);
    for (DType other : {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_F64, FLAME_DTYPE_I64, FLAME_DTYPE_BOOL}) {
      EXPECT_EQ(status_of([&] { elementwise_instantiations("Identity", d, {other}); }), FLAME_OK) << dtype_name(other);
      EXPECT_EQ(status_of([&] { elementwise_instantiations("Identity", other, {d}); }), FLAME_OK) << dtype_name(other);
    }
    EXPECT_EQ(status_of([&] { elementwise_instantiations("Fill", d, {}); }), FLAME_OK);
  }
}

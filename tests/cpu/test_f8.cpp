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
      EXPECT_EQ(bits_of(got), f8ref::torch_f32_bits(h.fmt, static_cast<uint8_t>(c)))
          << h.fmt.name << " code " << c << ": PyTorch's f32 bits (NaN: sign, payload, quiet bit)";
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

// Every f16 and bf16 pattern: the host's widening to f32 (the first step of FLAME's f16 / bf16 to
// f8, as of PyTorch's) encoded, against the reference's encoding of the pattern's value taken from
// its fields (so a NaN's sign comes from the pattern, not from the widening under test).
TEST(F8, EncodesEveryHalfAndBfloat16Value) {
  for (const HostF8& h : kFormats) {
    for (uint32_t b = 0; b < 65536; ++b) {
      const uint16_t p = static_cast<uint16_t>(b);
      const float half = f8ref::half_value(p), bf16 = f8ref::float_of(b << 16);
      EXPECT_EQ(int(h.encode(half_bits_to_float(p))), int(f8ref::encode(h.fmt, half)))
          << h.fmt.name << " of the f16 0x" << std::hex << b;
      EXPECT_EQ(int(h.encode(bf16_bits_to_float(p))), int(f8ref::encode(h.fmt, bf16)))
          << h.fmt.name << " of the bf16 0x" << std::hex << b;
      if (HasFailure()) return;  // one message per kind of mistake is enough
    }
  }
  // The NaN signs spelled out: PyTorch's torch.tensor([-nan], dtype=f16).to(float8_*) is 0xFF.
  for (uint16_t nan16 : {uint16_t{0xfe00}, uint16_t{0xfc01}, uint16_t{0xffff}}) {
    EXPECT_EQ(float_to_f8_e4m3_bits(half_bits_to_float(nan16)), 0xff) << std::hex << nan16;
    EXPECT_EQ(float_to_f8_e5m2_bits(half_bits_to_float(nan16)), 0xff) << std::hex << nan16;
    EXPECT_EQ(float_to_f8_e4m3_bits(half_bits_to_float(nan16 & 0x7fff)), 0x7f) << std::hex << nan16;
    EXPECT_EQ(float_to_f8_e5m2_bits(half_bits_to_float(nan16 & 0x7fff)), 0x7f) << std::hex << nan16;
  }
}

// f16 to f32 as PyTorch's (and the device's half_to_float_keep_nan): exact values, and a NaN keeps
// its sign and payload and comes out quiet.
TEST(F8, HalfWidensAsPyTorchBitForBit) {
  for (uint32_t b = 0; b < 65536; ++b) {
    EXPECT_EQ(bits_of(half_bits_to_float(static_cast<uint16_t>(b))), f8ref::torch_half_to_f32_bits(static_cast<uint16_t>(b)))
        << "f16 0x" << std::hex << b;
    if (HasFailure()) return;
  }
  EXPECT_EQ(bits_of(half_bits_to_float(0xfe00)), 0xffc00000u);
  EXPECT_EQ(bits_of(half_bits_to_float(0x7c01)), 0x7fc02000u) << "a signalling NaN comes out quiet";
}

// The reference's PyTorch bit tables against values fixed by hand (the tables feed the GPU tests).
TEST(F8, ReferenceBitTablesLandmarks) {
  using namespace f8ref;
  EXPECT_EQ(torch_f32_bits(kE4M3, 0xff), 0xfff00000u);
  EXPECT_EQ(torch_f32_bits(kE5M2, 0x7d), 0x7fe00000u);
  EXPECT_EQ(torch_f32_bits(kE5M2, 0xfe), 0xffc00000u);
  EXPECT_EQ(torch_f32_bits(kE5M2, 0xfc), 0xff800000u);
  EXPECT_EQ(torch_f32_bits(kE4M3, 0x80), 0x80000000u);
  EXPECT_EQ(torch_f64_bits(kE4M3, 0xff), 0xfffe000000000000ull);
  EXPECT_EQ(torch_f64_bits(kE5M2, 0x7f), 0x7ffc000000000000ull);
  EXPECT_EQ(torch_f64_bits(kE4M3, 0x38), 0x3ff0000000000000ull);  // 1.0
  EXPECT_EQ(torch_f16_bits(kE4M3, 0x7e), 0x5f00);                  // 448
  EXPECT_EQ(torch_f16_bits(kE4M3, 0x01), 0x1800);                  // 2^-9
  EXPECT_EQ(torch_f16_bits(kE4M3, 0xff), 0xfe00);
  for (int c = 0; c < 256; ++c)  // e5m2 is the top byte of an f16
    if (!is_nan_code(kE5M2, static_cast<uint8_t>(c))) EXPECT_EQ(torch_f16_bits(kE5M2, static_cast<uint8_t>(c)), c << 8) << c;
  EXPECT_EQ(torch_bf16_bits(kE4M3, 0xff), 0x7fc0);
  EXPECT_EQ(torch_bf16_bits(kE4M3, 0xb8), 0xbf80);  // -1.0
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

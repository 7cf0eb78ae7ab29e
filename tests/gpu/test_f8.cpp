// The f8 storage dtypes on the GPU, through the public C ABI: the conversion kernels against the
// float64 reference of tests/common/f8_reference.h (every one of the 256 codes of each format
// decoded to f32/f64/f16/bf16, bit for bit as PyTorch's CPU casts, NaN signs included; edge
// values, random bit patterns and the values of f16/bf16 inputs encoded from f32/f64/f16/bf16,
// -NaN to 0xFF; dense, vectorised, transposed and strided layouts), creation (NaN fills keep their
// sign), host round trips, same-dtype copies that keep every byte (f16 / bf16 NaN bits too), f8 to
// f8 and integer casts, safetensors and DLPack, and the refusals: compute ops on f8 fail with
// FLAME_ERROR_UNSUPPORTED naming the function and the dtype, leaving *out NULL.
#include <unistd.h>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>
#include FLAME_DLPACK_HEADER
#include "f8_reference.h"
#include "flame_test.h"

namespace {

struct Fmt {
  const f8ref::Format& ref;
  flame_dtype_t dtype;
};
const Fmt kFmts[] = {{f8ref::kE4M3, FLAME_DTYPE_F8_E4M3}, {f8ref::kE5M2, FLAME_DTYPE_F8_E5M2}};

T upload(flame_ctx_t ctx, const void* data, size_t bytes, std::vector<int64_t> shape, flame_dtype_t dt) {
  T t;
  EXPECT_EQ(flame_from_host(ctx, data, bytes, shape.data(), static_cast<int32_t>(shape.size()), dt, t.out()), FLAME_OK)
      << flame_last_error_message();
  return t;
}

template <class E>
std::vector<E> download(flame_tensor_t t, size_t n) {
  std::vector<E> v(n);
  EXPECT_EQ(flame_to_host(t, v.data(), n * sizeof(E)), FLAME_OK) << flame_last_error_message();
  return v;
}

T convert(flame_tensor_t t, flame_dtype_t dt) {
  T r;
  EXPECT_EQ(flame_to_dtype(t, dt, r.out()), FLAME_OK) << flame_last_error_message();
  return r;
}

std::vector<uint8_t> all_codes() {
  std::vector<uint8_t> c(256);
  for (int i = 0; i < 256; ++i) c[i] = static_cast<uint8_t>(i);
  return c;
}

// f32 values equal to the reference's (NaN matches NaN; the sign of zero and NaN counts). NaN keeps
// the code's sign unless nan_positive (bf16: PyTorch's c10::BFloat16 makes every NaN 0x7FC0).
void expect_decoded(const Fmt& f, const std::vector<uint8_t>& codes, const std::vector<float>& got, const std::string& how,
                    bool nan_positive = false) {
  ASSERT_EQ(codes.size(), got.size());
  for (size_t i = 0; i < codes.size(); ++i) {
    const double want = f8ref::decode(f.ref, codes[i]);
    bool negative = (codes[i] & 0x80) != 0;
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got[i])) << f.ref.name << " code " << int(codes[i]) << " " << how;
      negative = negative && !nan_positive;
    } else {
      EXPECT_EQ(static_cast<double>(got[i]), want) << f.ref.name << " code " << int(codes[i]) << " " << how;
    }
    EXPECT_EQ(std::signbit(got[i]), negative) << f.ref.name << " code " << int(codes[i]) << " " << how;
  }
}

// codes equal to the reference encodings of xs.
void expect_encoded(const Fmt& f, const std::vector<float>& xs, const std::vector<uint8_t>& got, const std::string& how) {
  ASSERT_EQ(xs.size(), got.size());
  int failures = 0;
  for (size_t i = 0; i < xs.size() && failures < 20; ++i) {
    const uint8_t want = f8ref::encode(f.ref, xs[i]);
    if (got[i] != want) {
      ++failures;
      ADD_FAILURE() << f.ref.name << " of " << xs[i] << " " << how << ": got 0x" << std::hex << int(got[i]) << ", want 0x"
                    << int(want);
    }
  }
}

// Random f32 bit patterns (every exponent, NaN and infinity included), plus values near the f8
// ranges so that most of them do not just overflow.
std::vector<float> random_floats(std::mt19937_64& rng, size_t n) {
  std::vector<float> v(n);
  std::uniform_real_distribution<float> near(-70000.0f, 70000.0f), small(-1.0f, 1.0f);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t b = static_cast<uint32_t>(rng());
    switch (i % 3) {
      case 0: std::memcpy(&v[i], &b, 4); break;
      case 1: v[i] = near(rng) / static_cast<float>(1u << (b % 24)); break;
      default: v[i] = std::ldexp(small(rng), -static_cast<int>(b % 20)); break;
    }
  }
  return v;
}

class F8 : public GpuTest {};

TEST_F(F8, DecodesEveryCodeToEveryFloatDtype) {
  const std::vector<uint8_t> codes = all_codes();
  std::vector<uint32_t> f32_bits;
  std::vector<uint64_t> f64_bits;
  std::vector<uint16_t> h_bits;
  for (const Fmt& f : kFmts) {
    T q = upload(ctx, codes.data(), codes.size(), {256}, f.dtype);
    for (flame_dtype_t d : {FLAME_DTYPE_F32, FLAME_DTYPE_F64, FLAME_DTYPE_F16, FLAME_DTYPE_BF16}) {
      // Every f8 value is exact in each of them, so going on to f32 loses nothing.
      T wide = convert(q, d);
      T back = convert(wide, FLAME_DTYPE_F32);
      expect_decoded(f, codes, download<float>(back, 256), std::string("via ") + flame_dtype_name(d),
                     d == FLAME_DTYPE_BF16);
      // Every code's bits as PyTorch's CPU conversion (f8ref's tables from c10's rules): NaN keeps
      // its sign in f32 / f64 / f16 (f16 0x7E00 | sign; e5m2 NaN quiet in f32), bf16 NaN is 0x7FC0.
      if (d == FLAME_DTYPE_F32) f32_bits = download<uint32_t>(wide, 256);
      if (d == FLAME_DTYPE_F64) f64_bits = download<uint64_t>(wide, 256);
      if (d == FLAME_DTYPE_F16 || d == FLAME_DTYPE_BF16) h_bits = download<uint16_t>(wide, 256);
      for (int c = 0; c < 256; ++c) {
        const uint8_t code = static_cast<uint8_t>(c);
        const std::string what = std::string(f.ref.name) + " code " + std::to_string(c) + " to " + flame_dtype_name(d);
        switch (d) {
          case FLAME_DTYPE_F32: EXPECT_EQ(f32_bits[c], f8ref::torch_f32_bits(f.ref, code)) << what; break;
          case FLAME_DTYPE_F64: EXPECT_EQ(f64_bits[c], f8ref::torch_f64_bits(f.ref, code)) << what; break;
          case FLAME_DTYPE_F16: EXPECT_EQ(h_bits[c], f8ref::torch_f16_bits(f.ref, code)) << what; break;
          default: EXPECT_EQ(h_bits[c], f8ref::torch_bf16_bits(f.ref, code)) << what; break;
        }
      }
    }
    // A strided source (flipped view) and a transposed one take the strided and tile kernels.
    int32_t dim0 = 0;
    T flipped;
    FLAME_ASSERT_OK(flame_flip(q, &dim0, 1, flipped.out()));
    std::vector<uint8_t> rev(codes.rbegin(), codes.rend());
    expect_decoded(f, rev, download<float>(convert(flipped, FLAME_DTYPE_F32), 256), "flipped");
    T q2 = upload(ctx, codes.data(), codes.size(), {8, 32}, f.dtype), qt;
    FLAME_ASSERT_OK(flame_transpose(q2, 0, 1, qt.out()));
    std::vector<uint8_t> tcodes(256);
    for (int r = 0; r < 32; ++r)
      for (int c = 0; c < 8; ++c) tcodes[r * 8 + c] = codes[c * 32 + r];
    expect_decoded(f, tcodes, download<float>(convert(qt, FLAME_DTYPE_F32), 256), "transposed");
  }
}

TEST_F(F8, EncodesEdgeAndRandomValuesFromF32AndF64) {
  std::mt19937_64 rng(20261128);
  std::vector<float> xs = f8ref::edge_values();
  const size_t n_edge = xs.size();
  std::vector<float> more = random_floats(rng, (1 << 18) + 5);  // odd length: vector body and tail
  xs.insert(xs.end(), more.begin(), more.end());
  std::vector<double> xd(xs.begin(), xs.end());
  const int64_t n = static_cast<int64_t>(xs.size());
  T t32 = upload(ctx, xs.data(), xs.size() * 4, {n}, FLAME_DTYPE_F32);
  T t64 = upload(ctx, xd.data(), xd.size() * 8, {n}, FLAME_DTYPE_F64);
  for (const Fmt& f : kFmts) {
    expect_encoded(f, xs, download<uint8_t>(convert(t32, f.dtype), xs.size()), "from f32");
    expect_encoded(f, xs, download<uint8_t>(convert(t64, f.dtype), xs.size()), "from f64");
    // Edge values in a transposed layout: the tile kernel writes f8.
    T e = upload(ctx, xs.data(), n_edge / 2 * 2 * 4, {2, static_cast<int64_t>(n_edge / 2)}, FLAME_DTYPE_F32), et;
    FLAME_ASSERT_OK(flame_transpose(e, 0, 1, et.out()));
    std::vector<float> ex(n_edge / 2 * 2);
    for (size_t r = 0; r < n_edge / 2; ++r)
      for (size_t c = 0; c < 2; ++c) ex[r * 2 + c] = xs[c * (n_edge / 2) + r];
    expect_encoded(f, ex, download<uint8_t>(convert(et, f.dtype), ex.size()), "from a transposed f32");
  }
}

TEST_F(F8, EncodesFromF16AndBf16) {
  // Every 16-bit pattern: its value taken from its fields on the host (a NaN with the pattern's
  // sign: PyTorch's f16 -> f8 of -NaN is 0xFF) is what the reference encodes. FLAME's widening to
  // f32 (the first step of the encoding, as PyTorch's) must give PyTorch's bits: the value, or
  // for NaN the sign and payload, quiet (cvt.f32.f16 alone would give 0x7FFFFFFF).
  std::vector<uint16_t> bits(65536);
  for (int i = 0; i < 65536; ++i) bits[i] = static_cast<uint16_t>(i);
  for (flame_dtype_t half : {FLAME_DTYPE_F16, FLAME_DTYPE_BF16}) {
    const bool is_f16 = half == FLAME_DTYPE_F16;
    T h = upload(ctx, bits.data(), bits.size() * 2, {65536}, half);
    std::vector<float> xs(65536);
    for (int i = 0; i < 65536; ++i)
      xs[i] = is_f16 ? f8ref::half_value(bits[i]) : f8ref::float_of(static_cast<uint32_t>(bits[i]) << 16);
    const std::vector<uint32_t> wide = download<uint32_t>(convert(h, FLAME_DTYPE_F32), 65536);
    int failures = 0;
    for (int i = 0; i < 65536 && failures < 20; ++i) {
      const uint32_t want = is_f16 ? f8ref::torch_half_to_f32_bits(bits[i]) : static_cast<uint32_t>(bits[i]) << 16;
      if (wide[i] != want && ++failures)
        ADD_FAILURE() << flame_dtype_name(half) << " 0x" << std::hex << bits[i] << " to f32: got 0x" << wide[i]
                      << ", want 0x" << want;
    }
    for (const Fmt& f : kFmts)
      expect_encoded(f, xs, download<uint8_t>(convert(h, f.dtype), 65536), std::string("from ") + flame_dtype_name(half));
  }
}

TEST_F(F8, ConvertsBetweenF8FormatsAndIntegers) {
  const std::vector<uint8_t> codes = all_codes();
  for (const Fmt& from : kFmts) {
    T q = upload(ctx, codes.data(), 256, {256}, from.dtype);
    for (const Fmt& to : kFmts) {
      if (&to == &from) {  // the same dtype: t itself, every byte as it was (NaN payloads included)
        EXPECT_EQ(download<uint8_t>(convert(q, to.dtype), 256), codes) << from.ref.name;
        continue;
      }
      std::vector<float> values(256);
      for (int c = 0; c < 256; ++c) values[c] = static_cast<float>(f8ref::decode(from.ref, static_cast<uint8_t>(c)));
      for (int c = 0; c < 256; ++c)
        if (std::isnan(values[c])) values[c] = std::copysign(NAN, (c & 0x80) ? -1.0f : 1.0f);
      expect_encoded(to, values, download<uint8_t>(convert(q, to.dtype), 256),
                     std::string("from ") + from.ref.name);
    }
  }
  // Integers and bool go through f32, as PyTorch.
  const std::vector<int64_t> ints = {0, 1, -3, 17, 300, 465, -100000};
  const std::vector<int32_t> i32(ints.begin(), ints.end());
  T ti = upload(ctx, ints.data(), ints.size() * 8, {7}, FLAME_DTYPE_I64);
  for (const Fmt& f : kFmts) {
    std::vector<float> xs(ints.begin(), ints.end());
    T q = convert(ti, f.dtype);
    expect_encoded(f, xs, download<uint8_t>(q, 7), "from i64");
    // Back to i32: the f8 values truncated (finite ones; e4m3's NaN is left out).
    std::vector<int32_t> back = download<int32_t>(convert(q, FLAME_DTYPE_I32), 7);
    std::vector<uint8_t> qc = download<uint8_t>(q, 7);
    for (size_t i = 0; i < 7; ++i) {
      const double v = f8ref::decode(f.ref, qc[i]);
      if (std::isfinite(v)) {
        EXPECT_EQ(back[i], static_cast<int32_t>(v)) << f.ref.name << " " << ints[i];
      }
    }
  }
}

TEST_F(F8, CreationAndHostRoundTrip) {
  const int64_t shape[] = {3, 5};
  for (const Fmt& f : kFmts) {
    SCOPED_TRACE(f.ref.name);
    T z, o, full, big, eye, e;
    FLAME_ASSERT_OK(flame_empty(ctx, shape, 2, f.dtype, e.out()));
    flame_dtype_t dt;
    FLAME_ASSERT_OK(flame_tensor_dtype(e, &dt));
    EXPECT_EQ(dt, f.dtype);
    FLAME_ASSERT_OK(flame_zeros(ctx, shape, 2, f.dtype, z.out()));
    FLAME_ASSERT_OK(flame_ones(ctx, shape, 2, f.dtype, o.out()));
    FLAME_ASSERT_OK(flame_full(ctx, shape, 2, f.dtype, -2.75, full.out()));
    FLAME_ASSERT_OK(flame_full(ctx, shape, 2, f.dtype, 1.0e6, big.out()));
    FLAME_ASSERT_OK(flame_eye(ctx, 3, 4, f.dtype, eye.out()));
    for (uint8_t b : download<uint8_t>(z, 15)) EXPECT_EQ(b, 0);
    for (uint8_t b : download<uint8_t>(o, 15)) EXPECT_EQ(b, f8ref::encode(f.ref, 1.0f));
    for (uint8_t b : download<uint8_t>(full, 15)) EXPECT_EQ(b, f8ref::encode(f.ref, -2.75f));
    for (uint8_t b : download<uint8_t>(big, 15)) EXPECT_EQ(b, f8ref::encode(f.ref, 1.0e6f)) << "NaN / inf, not saturated";
    // A NaN fill keeps its sign (the f64 scalar's sign bit, not whatever cvt.rn.f32.f64 makes of it).
    for (double nan : {std::copysign(NAN, 1.0), std::copysign(NAN, -1.0)}) {
      T fn;
      FLAME_ASSERT_OK(flame_full(ctx, shape, 2, f.dtype, nan, fn.out()));
      for (uint8_t b : download<uint8_t>(fn, 15)) EXPECT_EQ(b, std::signbit(nan) ? 0xff : 0x7f) << "full(" << nan << ")";
    }
    std::vector<uint8_t> ey = download<uint8_t>(eye, 12);
    for (int i = 0; i < 12; ++i) EXPECT_EQ(ey[i], (i / 4 == i % 4) ? f8ref::encode(f.ref, 1.0f) : 0) << i;
    double item = 0;
    T one;
    FLAME_ASSERT_OK(flame_full(ctx, nullptr, 0, f.dtype, 0.3, one.out()));
    FLAME_ASSERT_OK(flame_tensor_item(one, &item));
    EXPECT_EQ(item, f8ref::decode(f.ref, f8ref::encode(f.ref, 0.3f)));
    // Bytes in, the same bytes out; clone and a contiguous copy of a view keep them.
    const std::vector<uint8_t> codes = all_codes();
    T q = upload(ctx, codes.data(), 256, {16, 16}, f.dtype), c, qt, qtc;
    EXPECT_EQ(download<uint8_t>(q, 256), codes);
    FLAME_ASSERT_OK(flame_clone(q, c.out()));
    EXPECT_EQ(download<uint8_t>(c, 256), codes);
    FLAME_ASSERT_OK(flame_transpose(q, 0, 1, qt.out()));
    FLAME_ASSERT_OK(flame_contiguous(qt, qtc.out()));
    std::vector<uint8_t> tc = download<uint8_t>(qtc, 256);
    for (int r = 0; r < 16; ++r)
      for (int k = 0; k < 16; ++k) EXPECT_EQ(tc[r * 16 + k], codes[k * 16 + r]);
    // The strided kernel (a flipped view) and the rows kernel (a view permuting the outer axes).
    int32_t dim0 = 0;
    T q1 = upload(ctx, codes.data(), 256, {256}, f.dtype), flipped, fc;
    FLAME_ASSERT_OK(flame_flip(q1, &dim0, 1, flipped.out()));
    FLAME_ASSERT_OK(flame_contiguous(flipped, fc.out()));
    EXPECT_EQ(download<uint8_t>(fc, 256), std::vector<uint8_t>(codes.rbegin(), codes.rend()));
    T q3 = upload(ctx, codes.data(), 256, {4, 4, 16}, f.dtype), perm, pc;
    FLAME_ASSERT_OK(flame_transpose(q3, 0, 1, perm.out()));
    FLAME_ASSERT_OK(flame_contiguous(perm, pc.out()));
    std::vector<uint8_t> pb = download<uint8_t>(pc, 256);
    for (int a = 0; a < 4; ++a)
      for (int b = 0; b < 4; ++b)
        for (int k = 0; k < 16; ++k) EXPECT_EQ(pb[(a * 4 + b) * 16 + k], codes[(b * 4 + a) * 16 + k]);
    // Not computed on: rand of an f8 dtype is refused.
    T r;
    FLAME_EXPECT_STATUS(flame_rand(ctx, shape, 2, f.dtype, r.out()), FLAME_ERROR_UNSUPPORTED);
    EXPECT_EQ(r.h, nullptr);
  }
}

// The copy kernels move the bits of a same-dtype copy without converting through f32, for every
// dtype: f16 / bf16 NaN payloads and signs survive as f8's do (PyTorch copies bytes).
TEST_F(F8, SameDtypeCopiesOfF16AndBf16KeepNaNBits) {
  std::vector<uint16_t> bits(1024);
  for (int i = 0; i < 1024; ++i) bits[i] = static_cast<uint16_t>(i * 64 + 1);  // NaNs with payloads among them
  for (flame_dtype_t d : {FLAME_DTYPE_F16, FLAME_DTYPE_BF16}) {
    T h = upload(ctx, bits.data(), bits.size() * 2, {32, 32}, d), ht, hc;
    FLAME_ASSERT_OK(flame_transpose(h, 0, 1, ht.out()));
    FLAME_ASSERT_OK(flame_contiguous(ht, hc.out()));
    const std::vector<uint16_t> got = download<uint16_t>(hc, 1024);
    for (int r = 0; r < 32; ++r)
      for (int c = 0; c < 32; ++c) EXPECT_EQ(got[r * 32 + c], bits[c * 32 + r]) << flame_dtype_name(d) << " " << r << "," << c;
  }
}

TEST_F(F8, ComputeOpsRefuseF8) {
  const std::vector<uint8_t> codes = all_codes();
  const float ones[4] = {1, 1, 1, 1};
  T x32 = upload(ctx, ones, sizeof ones, {2, 2}, FLAME_DTYPE_F32);
  for (const Fmt& f : kFmts) {
    SCOPED_TRACE(f.ref.name);
    T a = upload(ctx, codes.data(), 4, {2, 2}, f.dtype), b = upload(ctx, codes.data() + 4, 4, {2, 2}, f.dtype);
    auto refused = [&](flame_status_t st, const char* fn) {
      EXPECT_EQ(st, FLAME_ERROR_UNSUPPORTED) << fn << ": " << flame_last_error_message();
      const std::string msg = flame_last_error_message();
      EXPECT_NE(msg.find(fn), std::string::npos) << msg;
      EXPECT_NE(msg.find(f.ref.name), std::string::npos) << msg;
    };
    T o;
    refused(flame_add(a, b, o.out()), "flame_add");
    EXPECT_EQ(o.h, nullptr);
    refused(flame_exp(a, o.out()), "flame_exp");
    EXPECT_EQ(o.h, nullptr);
    refused(flame_sum(a, nullptr, 0, 0, o.out()), "flame_sum");
    EXPECT_EQ(o.h, nullptr);
    refused(flame_matmul(a, b, o.out()), "flame_matmul");
    EXPECT_EQ(o.h, nullptr);
    T empty;  // empty tensors need no kernel, and are refused all the same
    const int64_t zero = 0;
    FLAME_ASSERT_OK(flame_zeros(ctx, &zero, 1, f.dtype, empty.out()));
    refused(flame_sum(empty, nullptr, 0, 0, o.out()), "flame_sum");
    EXPECT_EQ(o.h, nullptr);
    refused(flame_exp(empty, o.out()), "flame_exp");
    EXPECT_EQ(o.h, nullptr);
    refused(flame_add(a, x32, o.out()), "flame_add");  // no promotion with f8
    EXPECT_EQ(o.h, nullptr);
    flame_tensor_t pair[2] = {a, x32};
    refused(flame_cat(pair, 2, 0, o.out()), "flame_cat");
    EXPECT_EQ(o.h, nullptr);
    // Nothing changed: the inputs still hold their bytes.
    EXPECT_EQ(download<uint8_t>(a, 4), std::vector<uint8_t>(codes.begin(), codes.begin() + 4));
    // Same-dtype cat only copies: allowed.
    flame_tensor_t same[2] = {a, b};
    FLAME_ASSERT_OK(flame_cat(same, 2, 0, o.out()));
    EXPECT_EQ(download<uint8_t>(o, 8), std::vector<uint8_t>(codes.begin(), codes.begin() + 8));
  }
}

TEST_F(F8, SafetensorsRoundTrip) {
  const std::vector<uint8_t> codes = all_codes();
  std::string path = (std::getenv("TMPDIR") ? std::string(std::getenv("TMPDIR")) : std::string("/tmp")) + "/flame-f8-XXXXXX";
  std::vector<char> buf(path.begin(), path.end());
  buf.push_back('\0');
  const int fd = mkstemp(buf.data());
  ASSERT_GE(fd, 0);
  close(fd);
  path = buf.data();
  T e4 = upload(ctx, codes.data(), 256, {16, 16}, FLAME_DTYPE_F8_E4M3);
  T e5 = upload(ctx, codes.data(), 256, {256}, FLAME_DTYPE_F8_E5M2);
  const char* names[] = {"w_e4m3", "w_e5m2"};
  const flame_tensor_t ts[] = {e4, e5};
  FLAME_ASSERT_OK(flame_safetensors_save(ctx, path.c_str(), names, ts, 2, nullptr, 0));
  // The header names the format's dtypes.
  FILE* fp = std::fopen(path.c_str(), "rb");
  ASSERT_NE(fp, nullptr);
  uint64_t hlen = 0;
  ASSERT_EQ(std::fread(&hlen, 8, 1, fp), 1u);
  std::string header(hlen, '\0');
  ASSERT_EQ(std::fread(&header[0], 1, hlen, fp), hlen);
  std::fclose(fp);
  EXPECT_NE(header.find("\"dtype\":\"F8_E4M3\""), std::string::npos) << header;
  EXPECT_NE(header.find("\"dtype\":\"F8_E5M2\""), std::string::npos) << header;
  flame_safetensors_t file = nullptr;
  FLAME_ASSERT_OK(flame_safetensors_load(ctx, path.c_str(), &file));
  for (int i = 0; i < 2; ++i) {
    flame_dtype_t dt;
    int32_t nd = 0;
    FLAME_ASSERT_OK(flame_safetensors_info(file, names[i], &dt, nullptr, 0, &nd));
    EXPECT_EQ(dt, i == 0 ? FLAME_DTYPE_F8_E4M3 : FLAME_DTYPE_F8_E5M2);
    T back;
    FLAME_ASSERT_OK(flame_safetensors_get(file, names[i], back.out()));
    EXPECT_EQ(download<uint8_t>(back, 256), codes) << names[i];
  }
  flame_safetensors_release(file);
  std::remove(path.c_str());
}

TEST_F(F8, DlpackExportAndImport) {
  const std::vector<uint8_t> codes = all_codes();
  for (const Fmt& f : kFmts) {
    T q = upload(ctx, codes.data(), 256, {4, 64}, f.dtype);
    DLManagedTensor* m = nullptr;
    FLAME_ASSERT_OK(flame_tensor_to_dlpack(q, &m));
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(m->dl_tensor.dtype.code, f.dtype == FLAME_DTYPE_F8_E4M3 ? 10 : 12) << "kDLFloat8_e4m3fn / kDLFloat8_e5m2";
    EXPECT_EQ(m->dl_tensor.dtype.bits, 8);
    EXPECT_EQ(m->dl_tensor.dtype.lanes, 1);
    T back;
    FLAME_ASSERT_OK(flame_tensor_from_dlpack(ctx, m, back.out()));
    flame_dtype_t dt;
    FLAME_ASSERT_OK(flame_tensor_dtype(back, &dt));
    EXPECT_EQ(dt, f.dtype);
    EXPECT_EQ(download<uint8_t>(back, 256), codes);
  }
}

}  // namespace

// Host reference helpers for FLAME's GPU forward tests. Everything here uses only the public C ABI
// (flame.h) and tests/common/flame_test.h:
//  - f16 / bf16 bit conversions (round to nearest even) and rounding of doubles to any dtype,
//  - HT: a tiny host strided tensor of doubles that carries a FLAME dtype, with the view ops the
//    tests need as references (permute, slice, flip, diagonal, expand, ...),
//  - upload / download between HT and FLAME tensors, queries of shape / strides / pointers,
//  - broadcasting maps, dtype promotion as documented in flame.h,
//  - random fills (never all zero) from a fresh seed that SCOPED_TRACE prints on failure,
//  - comparison with a tolerance per dtype.
#pragma once
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>
#include "f8_reference.h"
#include "flame_test.h"

namespace href {

// ============================== dtypes ==============================

constexpr flame_dtype_t kAllDtypes[] = {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_F64,
                                        FLAME_DTYPE_I32, FLAME_DTYPE_I64, FLAME_DTYPE_U8,  FLAME_DTYPE_BOOL};
constexpr flame_dtype_t kFloatDtypes[] = {FLAME_DTYPE_F32, FLAME_DTYPE_F64, FLAME_DTYPE_F16, FLAME_DTYPE_BF16};
constexpr flame_dtype_t kIntDtypes[] = {FLAME_DTYPE_I32, FLAME_DTYPE_I64, FLAME_DTYPE_U8};

inline bool is_float(flame_dtype_t d) {
  return d == FLAME_DTYPE_F32 || d == FLAME_DTYPE_F64 || d == FLAME_DTYPE_F16 || d == FLAME_DTYPE_BF16;
}
inline bool is_int(flame_dtype_t d) { return d == FLAME_DTYPE_I32 || d == FLAME_DTYPE_I64 || d == FLAME_DTYPE_U8; }
inline bool is_half(flame_dtype_t d) { return d == FLAME_DTYPE_F16 || d == FLAME_DTYPE_BF16; }

inline size_t dsize(flame_dtype_t d) {
  switch (d) {
    case FLAME_DTYPE_F32: case FLAME_DTYPE_I32: return 4;
    case FLAME_DTYPE_F16: case FLAME_DTYPE_BF16: return 2;
    case FLAME_DTYPE_F64: case FLAME_DTYPE_I64: return 8;
    case FLAME_DTYPE_U8: case FLAME_DTYPE_BOOL: case FLAME_DTYPE_F8_E4M3: case FLAME_DTYPE_F8_E5M2: return 1;
  }
  return 0;
}
inline const char* dname(flame_dtype_t d) {
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

// Promotion as flame.h documents: bool < u8 < i32 < i64 < f16,bf16 < f32 < f64; f16 with bf16 -> f32.
inline int promo_rank(flame_dtype_t d) {
  switch (d) {
    case FLAME_DTYPE_BOOL: return 0;
    case FLAME_DTYPE_U8: return 1;
    case FLAME_DTYPE_I32: return 2;
    case FLAME_DTYPE_I64: return 3;
    case FLAME_DTYPE_F16: case FLAME_DTYPE_BF16: return 4;
    case FLAME_DTYPE_F32: return 5;
    case FLAME_DTYPE_F64: return 6;
    case FLAME_DTYPE_F8_E4M3: case FLAME_DTYPE_F8_E5M2: return -1;  // storage only: never promoted
  }
  return -1;
}
inline flame_dtype_t promote(flame_dtype_t a, flame_dtype_t b) {
  if (a == b) return a;
  if (is_half(a) && is_half(b)) return FLAME_DTYPE_F32;
  return promo_rank(a) >= promo_rank(b) ? a : b;
}
// Result dtype of a math function (Kind MATH): floating inputs keep their dtype, others give f32.
inline flame_dtype_t math_dtype(flame_dtype_t d) { return is_float(d) ? d : FLAME_DTYPE_F32; }

// ============================== 16-bit floats ==============================

inline uint32_t f2u(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float u2f(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline uint16_t f32_to_f16_bits(float f) {
  const uint32_t x = f2u(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return sign | 0x7e00u;          // NaN
  if (ax >= 0x477ff000u) return sign | 0x7c00u;         // >= 65520 rounds to infinity
  if (ax >= 0x38800000u) {                               // normal half (>= 2^-14)
    uint32_t e = (ax >> 23) - 127 + 15, m = ax & 0x7fffffu;
    uint32_t r = (e << 10) | (m >> 13), rem = m & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  if (ax <= 0x33000000u) return sign;                    // <= 2^-25 rounds to zero
  uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u, shift = 126 - e;
  uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (r & 1u))) ++r;
  return static_cast<uint16_t>(sign | r);
}
inline float f16_bits_to_f32(uint16_t h) {
  const float s = (h & 0x8000u) ? -1.0f : 1.0f;
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0) return s * std::ldexp(static_cast<float>(m), -24);
  if (e == 31) return m ? std::numeric_limits<float>::quiet_NaN() : s * std::numeric_limits<float>::infinity();
  return s * std::ldexp(static_cast<float>(1024 + m), e - 25);
}
inline uint16_t f32_to_bf16_bits(float f) {
  const uint32_t u = f2u(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float bf16_bits_to_f32(uint16_t h) { return u2f(static_cast<uint32_t>(h) << 16); }

// The value of v once stored in dtype d (C conversion semantics: floats round to nearest even,
// f16/bf16 through f32 as the device does; integers truncate toward zero and wrap; bool is v != 0).
// Integer targets expect v in range of int64 (the tests never convert out-of-range floats).
inline double round_to(double v, flame_dtype_t d) {
  switch (d) {
    case FLAME_DTYPE_F64: return v;
    case FLAME_DTYPE_F32: return static_cast<double>(static_cast<float>(v));
    case FLAME_DTYPE_F16: return f16_bits_to_f32(f32_to_f16_bits(static_cast<float>(v)));
    case FLAME_DTYPE_BF16: return bf16_bits_to_f32(f32_to_bf16_bits(static_cast<float>(v)));
    case FLAME_DTYPE_I64: return static_cast<double>(static_cast<int64_t>(v));
    case FLAME_DTYPE_I32:
      return static_cast<double>(static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(static_cast<int64_t>(v)))));
    case FLAME_DTYPE_U8: return static_cast<double>(static_cast<uint8_t>(static_cast<uint64_t>(static_cast<int64_t>(v))));
    case FLAME_DTYPE_BOOL: return v != 0.0 ? 1.0 : 0.0;
    case FLAME_DTYPE_F8_E4M3: return f8ref::decode(f8ref::kE4M3, f8ref::encode(f8ref::kE4M3, static_cast<float>(v)));
    case FLAME_DTYPE_F8_E5M2: return f8ref::decode(f8ref::kE5M2, f8ref::encode(f8ref::kE5M2, static_cast<float>(v)));
  }
  return v;
}

// Row-major values <-> the bytes flame_from_host / flame_to_host exchange.
inline std::vector<unsigned char> encode(const std::vector<double>& v, flame_dtype_t d) {
  const size_t es = dsize(d);
  std::vector<unsigned char> out(v.size() * es);
  for (size_t i = 0; i < v.size(); ++i) {
    unsigned char* p = out.data() + i * es;
    const double x = v[i];
    switch (d) {
      case FLAME_DTYPE_F32: { float f = static_cast<float>(x); std::memcpy(p, &f, 4); break; }
      case FLAME_DTYPE_F64: std::memcpy(p, &x, 8); break;
      case FLAME_DTYPE_F16: { uint16_t h = f32_to_f16_bits(static_cast<float>(x)); std::memcpy(p, &h, 2); break; }
      case FLAME_DTYPE_BF16: { uint16_t h = f32_to_bf16_bits(static_cast<float>(x)); std::memcpy(p, &h, 2); break; }
      case FLAME_DTYPE_I32: { int32_t k = static_cast<int32_t>(round_to(x, d)); std::memcpy(p, &k, 4); break; }
      case FLAME_DTYPE_I64: { int64_t k = static_cast<int64_t>(x); std::memcpy(p, &k, 8); break; }
      case FLAME_DTYPE_U8: *p = static_cast<uint8_t>(round_to(x, d)); break;
      case FLAME_DTYPE_BOOL: *p = x != 0.0 ? 1 : 0; break;
      case FLAME_DTYPE_F8_E4M3: *p = f8ref::encode(f8ref::kE4M3, static_cast<float>(x)); break;
      case FLAME_DTYPE_F8_E5M2: *p = f8ref::encode(f8ref::kE5M2, static_cast<float>(x)); break;
    }
  }
  return out;
}
inline std::vector<double> decode(const unsigned char* bytes, size_t n, flame_dtype_t d) {
  const size_t es = dsize(d);
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char* p = bytes + i * es;
    switch (d) {
      case FLAME_DTYPE_F32: { float f; std::memcpy(&f, p, 4); v[i] = f; break; }
      case FLAME_DTYPE_F64: std::memcpy(&v[i], p, 8); break;
      case FLAME_DTYPE_F16: { uint16_t h; std::memcpy(&h, p, 2); v[i] = f16_bits_to_f32(h); break; }
      case FLAME_DTYPE_BF16: { uint16_t h; std::memcpy(&h, p, 2); v[i] = bf16_bits_to_f32(h); break; }
      case FLAME_DTYPE_I32: { int32_t k; std::memcpy(&k, p, 4); v[i] = k; break; }
      case FLAME_DTYPE_I64: { int64_t k; std::memcpy(&k, p, 8); v[i] = static_cast<double>(k); break; }
      case FLAME_DTYPE_U8: v[i] = *p; break;
      case FLAME_DTYPE_BOOL: v[i] = *p; break;  // raw byte: anything but 0/1 shows up as a mismatch
      case FLAME_DTYPE_F8_E4M3: v[i] = f8ref::decode(f8ref::kE4M3, *p); break;
      case FLAME_DTYPE_F8_E5M2: v[i] = f8ref::decode(f8ref::kE5M2, *p); break;
    }
  }
  return v;
}

// ============================== shapes ==============================

using Shape = std::vector<int64_t>;

inline int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t x : s) n *= x;
  return n;
}
inline Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) { st[i] = acc; acc *= std::max<int64_t>(s[i], 1); }
  return st;
}
inline std::string to_string(const Shape& s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? "," : "") << s[i];
  o << "]";
  return o.str();
}
// NumPy broadcasting; ok=false when the shapes cannot broadcast.
inline Shape broadcast_shapes(const Shape& a, const Shape& b, bool* ok = nullptr) {
  const size_t n = std::max(a.size(), b.size());
  Shape r(n);
  if (ok) *ok = true;
  for (size_t i = 0; i < n; ++i) {
    int64_t x = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t y = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (x == y || y == 1) r[i] = x;
    else if (x == 1) r[i] = y;
    else { if (ok) *ok = false; r[i] = x; }
  }
  return r;
}
inline int norm_dim(int64_t d, size_t ndim) { return static_cast<int>(d < 0 ? d + static_cast<int64_t>(ndim) : d); }

// Calls f(index) for every multi-index of shape in row-major order.
template <class F>
void for_each_index(const Shape& shape, F f) {
  const int64_t n = numel_of(shape);
  Shape idx(shape.size(), 0);
  for (int64_t k = 0; k < n; ++k) {
    f(static_cast<const Shape&>(idx));
    for (size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

// ============================== HT: host strided tensor ==============================

struct HT {
  flame_dtype_t dtype = FLAME_DTYPE_F64;
  Shape shape, strides;
  int64_t offset = 0;
  std::shared_ptr<std::vector<double>> data = std::make_shared<std::vector<double>>();

  HT() = default;
  HT(Shape s, flame_dtype_t d, double fill = 0.0) : dtype(d), shape(std::move(s)) {
    strides = contiguous_strides(shape);
    data = std::make_shared<std::vector<double>>(static_cast<size_t>(numel_of(shape)), fill);
  }
  static HT from_values(Shape s, flame_dtype_t d, const std::vector<double>& v) {
    HT t(std::move(s), d);
    for (size_t i = 0; i < v.size() && i < t.data->size(); ++i) (*t.data)[i] = round_to(v[i], d);
    return t;
  }
  int ndim() const { return static_cast<int>(shape.size()); }
  int64_t numel() const { return numel_of(shape); }
  int64_t pos(const Shape& idx) const {
    int64_t p = offset;
    for (size_t i = 0; i < idx.size(); ++i) p += idx[i] * strides[i];
    return p;
  }
  double at(const Shape& idx) const { return (*data)[static_cast<size_t>(pos(idx))]; }
  double& at(const Shape& idx) { return (*data)[static_cast<size_t>(pos(idx))]; }
  // Row-major values (a copy).
  std::vector<double> values() const {
    std::vector<double> v;
    v.reserve(static_cast<size_t>(numel()));
    for_each_index(shape, [&](const Shape& i) { v.push_back(at(i)); });
    return v;
  }
  HT contiguous() const { return from_values(shape, dtype, values()); }
  HT as(flame_dtype_t d) const {  // converted copy
    std::vector<double> v = values();
    return from_values(shape, d, v);
  }

  // ---- views (same semantics as the FLAME ops of the same names) ----
  HT permute(const std::vector<int>& dims) const {
    HT r = *this;
    for (size_t i = 0; i < dims.size(); ++i) {
      int d = norm_dim(dims[i], shape.size());
      r.shape[i] = shape[d];
      r.strides[i] = strides[d];
    }
    return r;
  }
  HT transpose(int a, int b) const {
    std::vector<int> p(shape.size());
    for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<int>(i);
    std::swap(p[norm_dim(a, shape.size())], p[norm_dim(b, shape.size())]);
    return permute(p);
  }
  // Python slicing start:end:step (step > 0), with clamping and negative bounds.
  HT slice(int dim, int64_t start, int64_t end, int64_t step) const {
    int d = norm_dim(dim, shape.size());
    const int64_t n = shape[d];
    if (start < 0) start += n;
    if (end < 0) end += n;
    start = std::min(std::max<int64_t>(start, 0), n);
    end = std::min(std::max<int64_t>(end, 0), n);
    HT r = *this;
    r.shape[d] = end > start ? (end - start + step - 1) / step : 0;
    r.offset += start * strides[d];
    r.strides[d] = strides[d] * step;
    return r;
  }
  HT narrow(int dim, int64_t start, int64_t length) const { return slice(dim, start, start + length, 1); }
  HT select(int dim, int64_t index) const {
    int d = norm_dim(dim, shape.size());
    HT r = *this;
    r.offset += index * strides[d];
    r.shape.erase(r.shape.begin() + d);
    r.strides.erase(r.strides.begin() + d);
    return r;
  }
  HT flip(const std::vector<int>& dims) const {
    HT r = *this;
    for (int dd : dims) {
      int d = norm_dim(dd, shape.size());
      if (r.shape[d] > 0) r.offset += (r.shape[d] - 1) * r.strides[d];
      r.strides[d] = -r.strides[d];
    }
    return r;
  }
  HT diagonal(int64_t off, int d1, int d2) const {
    d1 = norm_dim(d1, shape.size());
    d2 = norm_dim(d2, shape.size());
    HT r;
    r.dtype = dtype;
    r.data = data;
    r.offset = offset;
    int64_t len;
    if (off >= 0) {
      len = std::max<int64_t>(std::min(shape[d1], shape[d2] - off), 0);
      if (len > 0) r.offset += off * strides[d2];
    } else {
      len = std::max<int64_t>(std::min(shape[d1] + off, shape[d2]), 0);
      if (len > 0) r.offset += -off * strides[d1];
    }
    for (int i = 0; i < ndim(); ++i)
      if (i != d1 && i != d2) { r.shape.push_back(shape[i]); r.strides.push_back(strides[i]); }
    r.shape.push_back(len);
    r.strides.push_back(strides[d1] + strides[d2]);
    return r;
  }
  HT expand(const Shape& to) const {
    HT r = *this;
    const size_t lead = to.size() - shape.size();
    r.shape = to;
    r.strides.assign(to.size(), 0);
    for (size_t i = 0; i < shape.size(); ++i) {
      if (to[lead + i] == -1) r.shape[lead + i] = shape[i];
      r.strides[lead + i] = shape[i] == 1 && r.shape[lead + i] != 1 ? 0 : strides[i];
    }
    return r;
  }
  HT unsqueeze(int dim) const {
    int d = dim < 0 ? dim + ndim() + 1 : dim;
    HT r = *this;
    r.shape.insert(r.shape.begin() + d, 1);
    r.strides.insert(r.strides.begin() + d, 1);
    return r;
  }
  HT reshape(const Shape& s) const {  // always via row-major values
    Shape to = s;
    int64_t known = 1, neg = -1;
    for (size_t i = 0; i < to.size(); ++i) {
      if (to[i] == -1) neg = static_cast<int64_t>(i);
      else known *= to[i];
    }
    if (neg >= 0) to[static_cast<size_t>(neg)] = known ? numel() / known : 0;
    return from_values(to, dtype, values());
  }
};

// A scalar (0-d) HT.
inline HT scalar(double v, flame_dtype_t d) { return HT::from_values({}, d, {v}); }

// Elementwise maps with broadcasting; f computes in double on the stored values and the result is
// rounded to out_dtype.
template <class F>
HT map1(const HT& a, flame_dtype_t out_dtype, F f) {
  HT r(a.shape, out_dtype);
  const std::vector<double> v = a.values();
  for (size_t k = 0; k < v.size(); ++k) (*r.data)[k] = round_to(f(v[k]), out_dtype);
  return r;
}
inline Shape bcast_index(const Shape& out_idx, const Shape& shape) {
  Shape i(shape.size());
  const size_t lead = out_idx.size() - shape.size();
  for (size_t d = 0; d < shape.size(); ++d) i[d] = shape[d] == 1 ? 0 : out_idx[lead + d];
  return i;
}
template <class F>
HT map2(const HT& a, const HT& b, flame_dtype_t out_dtype, F f) {
  HT r(broadcast_shapes(a.shape, b.shape), out_dtype);
  if (a.shape == b.shape) {  // fast path: no broadcasting
    const std::vector<double> va = a.values(), vb = b.values();
    for (size_t k = 0; k < va.size(); ++k) (*r.data)[k] = round_to(f(va[k], vb[k]), out_dtype);
    return r;
  }
  size_t k = 0;
  for_each_index(r.shape, [&](const Shape& i) {
    (*r.data)[k++] = round_to(f(a.at(bcast_index(i, a.shape)), b.at(bcast_index(i, b.shape))), out_dtype);
  });
  return r;
}
template <class F>
HT map3(const HT& a, const HT& b, const HT& c, flame_dtype_t out_dtype, F f) {
  HT r(broadcast_shapes(broadcast_shapes(a.shape, b.shape), c.shape), out_dtype);
  size_t k = 0;
  for_each_index(r.shape, [&](const Shape& i) {
    (*r.data)[k++] = round_to(
        f(a.at(bcast_index(i, a.shape)), b.at(bcast_index(i, b.shape)), c.at(bcast_index(i, c.shape))), out_dtype);
  });
  return r;
}

// ============================== random ==============================

// A fresh seed per call; FLAME_TEST_SEED=<n> in the environment replays a failing run.
inline uint64_t fresh_seed() {
  if (const char* s = std::getenv("FLAME_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  std::random_device rd;
  uint64_t t = static_cast<uint64_t>(std::chrono::high_resolution_clock::now().time_since_epoch().count());
  return ((static_cast<uint64_t>(rd()) << 32) ^ rd() ^ t) & 0xffffffffffffull;
}
using Rng = std::mt19937_64;

// Declares `Rng name` seeded freshly, and traces the seed so that failures print it.
#define HREF_RNG(name)                                                                      \
  const uint64_t name##_seed = ::href::fresh_seed();                                        \
  SCOPED_TRACE(::testing::Message() << "seed " << name##_seed << " (FLAME_TEST_SEED="       \
                                    << name##_seed << " replays)");                         \
  ::href::Rng name(name##_seed)

// Where random values come from. Floating dtypes draw uniformly from [lo, hi] (sym: the
// magnitude from [lo, hi] with a random sign); integer dtypes draw integers from [ilo, ihi]
// (u8 clipped at 0; sym: random sign); bool draws 0/1. reject(x) rejects a value (after rounding).
struct Domain {
  double lo = -3, hi = 3;
  int64_t ilo = -20, ihi = 20;
  bool sym = false;
  bool integral = false;  // floating dtypes draw integers from [ilo, ihi] too (ties, zeros)
  std::function<bool(double)> reject;
};

inline double draw(Rng& rng, const Domain& dom, flame_dtype_t d) {
  for (int tries = 0;; ++tries) {
    double x;
    if (d == FLAME_DTYPE_BOOL) {
      x = static_cast<double>(rng() & 1u);
    } else if (is_int(d) || dom.integral) {
      int64_t lo = dom.ilo, hi = dom.ihi;
      if (d == FLAME_DTYPE_U8) { lo = std::max<int64_t>(lo, 0); hi = std::min<int64_t>(hi, 255); }
      x = static_cast<double>(std::uniform_int_distribution<int64_t>(lo, std::max(lo, hi))(rng));
      if (dom.sym && d != FLAME_DTYPE_U8 && (rng() & 1u)) x = -x;
    } else {
      x = std::uniform_real_distribution<double>(dom.lo, dom.hi)(rng);
      if (dom.sym && (rng() & 1u)) x = -x;
      x = round_to(x, d);
    }
    if (!dom.reject || !dom.reject(x) || tries > 1000) return x;
  }
}

// A contiguous random HT; never all zero when the domain allows a nonzero value.
inline HT random(Rng& rng, const Shape& shape, flame_dtype_t d, const Domain& dom = Domain()) {
  HT t(shape, d);
  bool nonzero = false;
  for (double& x : *t.data) { x = draw(rng, dom, d); nonzero |= x != 0.0; }
  if (!nonzero && !t.data->empty()) {
    for (int i = 0; i < 64 && (*t.data)[0] == 0.0; ++i) (*t.data)[0] = draw(rng, dom, d);
    if ((*t.data)[0] == 0.0 && (d == FLAME_DTYPE_BOOL || (is_int(d) && dom.ihi >= 1))) (*t.data)[0] = 1.0;
  }
  return t;
}
inline HT random(Rng& rng, const Shape& shape, flame_dtype_t d, double lo, double hi) {
  Domain dom;
  dom.lo = lo; dom.hi = hi;
  dom.ilo = static_cast<int64_t>(std::ceil(lo));
  dom.ihi = static_cast<int64_t>(std::floor(hi));
  return random(rng, shape, d, dom);
}

// ============================== FLAME <-> host ==============================

inline flame_dtype_t dtype_of(flame_tensor_t t) {
  flame_dtype_t d = FLAME_DTYPE_F32;
  EXPECT_EQ(flame_tensor_dtype(t, &d), FLAME_OK);
  return d;
}
inline Shape shape_of(flame_tensor_t t) {
  int32_t nd = -1;
  EXPECT_EQ(flame_tensor_ndim(t, &nd), FLAME_OK);
  if (nd < 0) return {};
  Shape s(static_cast<size_t>(nd));
  int64_t buf[FLAME_MAX_DIMS] = {0};
  EXPECT_EQ(flame_tensor_shape(t, buf, FLAME_MAX_DIMS), FLAME_OK);
  for (int i = 0; i < nd; ++i) s[static_cast<size_t>(i)] = buf[i];
  return s;
}
inline Shape strides_of(flame_tensor_t t) {
  int32_t nd = -1;
  EXPECT_EQ(flame_tensor_ndim(t, &nd), FLAME_OK);
  if (nd < 0) return {};
  Shape s(static_cast<size_t>(nd));
  int64_t buf[FLAME_MAX_DIMS] = {0};
  EXPECT_EQ(flame_tensor_strides(t, buf, FLAME_MAX_DIMS), FLAME_OK);
  for (int i = 0; i < nd; ++i) s[static_cast<size_t>(i)] = buf[i];
  return s;
}
inline int64_t numel_of(flame_tensor_t t) {
  int64_t n = -1;
  EXPECT_EQ(flame_tensor_numel(t, &n), FLAME_OK);
  return n;
}
inline bool is_contiguous(flame_tensor_t t) {
  int32_t c = -1;
  EXPECT_EQ(flame_tensor_is_contiguous(t, &c), FLAME_OK);
  return c == 1;
}
inline uintptr_t ptr_of(flame_tensor_t t) {
  void* p = nullptr;
  EXPECT_EQ(flame_tensor_data_ptr(t, &p), FLAME_OK);
  return reinterpret_cast<uintptr_t>(p);
}

// Uploads h (any strides: its row-major values) as a new contiguous tensor of h.dtype.
inline T upload(flame_ctx_t ctx, const HT& h) {
  std::vector<unsigned char> bytes = encode(h.values(), h.dtype);
  static unsigned char dummy = 0;  // a valid pointer for 0 bytes
  T t;
  flame_status_t st = flame_from_host(ctx, bytes.empty() ? &dummy : bytes.data(), bytes.size(), h.shape.data(),
                                      static_cast<int32_t>(h.shape.size()), h.dtype, t.out());
  EXPECT_EQ(st, FLAME_OK) << "flame_from_host " << to_string(h.shape) << " " << dname(h.dtype) << ": "
                          << flame_last_error_message();
  return t;
}
// Downloads t as a contiguous HT with t's shape and dtype.
inline HT download(flame_tensor_t t) {
  HT h(shape_of(t), dtype_of(t));
  std::vector<unsigned char> bytes(static_cast<size_t>(h.numel()) * dsize(h.dtype) + 1);
  flame_status_t st = flame_to_host(t, bytes.data(), bytes.size() - 1);
  EXPECT_EQ(st, FLAME_OK) << "flame_to_host: " << flame_last_error_message();
  std::vector<double> v = decode(bytes.data(), static_cast<size_t>(h.numel()), h.dtype);
  *h.data = v;
  return h;
}
inline double item(flame_tensor_t t) {
  double v = std::nan("");
  flame_status_t st = flame_tensor_item(t, &v);
  EXPECT_EQ(st, FLAME_OK) << "flame_tensor_item: " << flame_last_error_message();
  return v;
}

// ============================== comparison ==============================

struct Tol {
  double rtol, atol;
};
// Default tolerance for results stored in dtype d and computed with the dtype's compute type.
inline Tol tol_for(flame_dtype_t d) {
  switch (d) {
    case FLAME_DTYPE_F64: return {1e-10, 1e-12};
    case FLAME_DTYPE_F32: return {2e-5, 2e-6};
    case FLAME_DTYPE_F16: return {1e-2, 1e-3};
    case FLAME_DTYPE_BF16: return {1e-2, 1e-3};
    default: return {0, 0};  // integers and bool: exact
  }
}

inline bool close_enough(double a, double e, const Tol& t) {
  if (std::isnan(e)) return std::isnan(a);
  if (std::isinf(e)) return a == e;
  if (std::isnan(a) || std::isinf(a)) return false;
  return std::fabs(a - e) <= t.atol + t.rtol * std::fabs(e);
}

// Compares shape, dtype and values (row-major) of actual against expected.
inline ::testing::AssertionResult all_close(const HT& actual, const HT& expected, Tol tol) {
  if (actual.shape != expected.shape)
    return ::testing::AssertionFailure() << "shape " << to_string(actual.shape) << ", expected "
                                         << to_string(expected.shape);
  if (actual.dtype != expected.dtype)
    return ::testing::AssertionFailure() << "dtype " << dname(actual.dtype) << ", expected " << dname(expected.dtype);
  const std::vector<double> a = actual.values(), e = expected.values();
  int64_t bad = 0;
  std::ostringstream msg;
  msg.precision(17);
  for (size_t i = 0; i < a.size(); ++i) {
    if (close_enough(a[i], e[i], tol)) continue;
    if (bad < 8) msg << "\n  [" << i << "] got " << a[i] << ", expected " << e[i];
    ++bad;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << a.size() << " elements differ (dtype " << dname(actual.dtype)
                                       << ", rtol " << tol.rtol << ", atol " << tol.atol << ", shape "
                                       << to_string(actual.shape) << "):" << msg.str();
}
inline ::testing::AssertionResult all_close(const HT& actual, const HT& expected) {
  return all_close(actual, expected, tol_for(expected.dtype));
}
// Downloads t and compares.
inline ::testing::AssertionResult matches(flame_tensor_t t, const HT& expected, Tol tol) {
  if (!t) return ::testing::AssertionFailure() << "NULL tensor";
  return all_close(download(t), expected, tol);
}
inline ::testing::AssertionResult matches(flame_tensor_t t, const HT& expected) {
  return matches(t, expected, tol_for(expected.dtype));
}

// Strides compared ignoring dims of size <= 1 (any stride is valid there).
inline ::testing::AssertionResult strides_match(flame_tensor_t t, const Shape& expected) {
  const Shape s = shape_of(t), st = strides_of(t);
  if (st.size() != expected.size())
    return ::testing::AssertionFailure() << "ndim " << st.size() << ", expected " << expected.size();
  for (size_t i = 0; i < st.size(); ++i)
    if (s[i] > 1 && st[i] != expected[i])
      return ::testing::AssertionFailure() << "strides " << to_string(st) << ", expected " << to_string(expected)
                                           << " (shape " << to_string(s) << ")";
  return ::testing::AssertionSuccess();
}

// A non-NULL garbage handle to preset OUT parameters with: failures must overwrite it with NULL.
inline flame_tensor_t sentinel() { return reinterpret_cast<flame_tensor_t>(static_cast<uintptr_t>(0x10)); }

}  // namespace href

// Expects `call` (whose last argument is &out for a flame_tensor_t out preset to the sentinel)
// to fail with `status` and leave out NULL.
#define HREF_EXPECT_FAIL(status, out, call)                                                          \
  do {                                                                                               \
    out = ::href::sentinel();                                                                        \
    flame_status_t st_ = (call);                                                                     \
    EXPECT_EQ(st_, status) << #call << " -> " << flame_status_string(st_) << ": "                    \
                           << flame_last_error_message();                                            \
    EXPECT_EQ(out, nullptr) << #call << " left its OUT handle non-NULL after failing";               \
    if (st_ == FLAME_OK && out && out != ::href::sentinel()) flame_tensor_release(out);              \
    out = nullptr;                                                                                   \
  } while (0)

// As HREF_EXPECT_FAIL for calls whose exact error code flame.h leaves open: any failure passes.
#define HREF_EXPECT_ANY_FAIL(out, call)                                                              \
  do {                                                                                               \
    out = ::href::sentinel();                                                                        \
    flame_status_t st_ = (call);                                                                     \
    EXPECT_NE(st_, FLAME_OK) << #call << " succeeded but should fail";                              \
    EXPECT_EQ(out, nullptr) << #call << " left its OUT handle non-NULL";                             \
    if (st_ == FLAME_OK && out && out != ::href::sentinel()) flame_tensor_release(out);              \
    out = nullptr;                                                                                   \
  } while (0)

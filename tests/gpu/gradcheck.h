// gradcheck.h - host float64 references and a table-driven gradient checker for FLAME's autograd.
//
// A Row names one differentiable op (or op form): its FLAME forward through the public C ABI and a
// host reference in float64. The checker draws fresh random inputs, runs the op on the GPU, builds
// loss = sum_k sum(out_k * w_k) with random weights w_k, calls flame_backward and compares every
// input's .grad with central finite differences of the host reference, in float64 on the host.
// f64 runs use a tight tolerance, f32 a relative ~1e-3 one, f16/bf16 loose ones. A second-order
// mode (f64) differentiates the backward itself (create_graph) with respect to both the inputs and
// the incoming gradient, which checks that the backward rules are differentiable.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "f8_reference.h"
#include "flame_test.h"

namespace gc {

// ------------------------------------------------------------------ 16-bit floats on the host

inline uint32_t f2u(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float u2f(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f2u(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) { return u2f(static_cast<uint32_t>(h) << 16); }

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
  if (exp == 0) {
    float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return u2f(sign | 0x7f800000u | (man << 13));
  return u2f(sign | ((exp + 112) << 23) | (man << 13));
}
inline uint16_t f32_to_f16(float f) {
  uint32_t u = f2u(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00;                 // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00;                // overflow (>= 65520) -> inf
  if (a < 0x38800000u) {                                     // subnormal or zero in f16
    float m = std::fabs(f) * 16777216.0f;                    // units of 2^-24
    return sign | static_cast<uint16_t>(std::nearbyint(m));  // default rounding: nearest even
  }
  uint32_t e = (a >> 23) - 112, man = a & 0x7fffffu;
  uint32_t h = (e << 10) | (man >> 13);
  uint32_t rest = man & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return sign | static_cast<uint16_t>(h);
}

inline bool is_floating(flame_dtype_t d) {
  return d == FLAME_DTYPE_F32 || d == FLAME_DTYPE_F64 || d == FLAME_DTYPE_F16 || d == FLAME_DTYPE_BF16;
}

// ------------------------------------------------------------------ host tensors (row-major)

using Shape = std::vector<int64_t>;

struct HT {
  Shape shape;
  std::vector<double> v;
  HT() = default;
  explicit HT(Shape s, double fill = 0.0) : shape(std::move(s)), v(static_cast<size_t>(numel_of(shape)), fill) {}
  static int64_t numel_of(const Shape& s) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    return n;
  }
  int64_t numel() const { return numel_of(shape); }
  int ndim() const { return static_cast<int>(shape.size()); }
};

inline Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (int i = static_cast<int>(s.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

inline int norm_dim(int64_t d, int nd) { return static_cast<int>(d < 0 ? d + nd : d); }

inline std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? "," : "") << s[i];
  os << "]";
  return os.str();
}

// Calls f(index_vector, linear_index) for every element of shape in row-major order.
template <class F>
inline void for_each_index(const Shape& s, F f) {
  int64_t n = HT::numel_of(s);
  std::vector<int64_t> idx(s.size(), 0);
  for (int64_t lin = 0; lin < n; ++lin) {
    f(idx, lin);
    for (int d = static_cast<int>(s.size()) - 1; d >= 0; --d) {
      if (++idx[d] < s[d]) break;
      idx[d] = 0;
    }
  }
}

// A strided view of x's row-major storage, materialised.
inline HT view(const HT& x, int64_t offset, const Shape& shape, const Shape& strides) {
  HT out(shape);
  for_each_index(shape, [&](const std::vector<int64_t>& idx, int64_t lin) {
    int64_t p = offset;
    for (size_t d = 0; d < idx.size(); ++d) p += idx[d] * strides[d];
    out.v[lin] = x.v[p];
  });
  return out;
}

inline HT reshape(const HT& x, Shape s) {
  int64_t known = 1, neg = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] < 0) neg = static_cast<int64_t>(i);
    else known *= s[i];
  }
  if (neg >= 0) s[neg] = known ? x.numel() / known : 0;
  HT out = x;
  out.shape = s;
  return out;
}

inline HT permute(const HT& x, const std::vector<int>& dims) {
  Shape st = contiguous_strides(x.shape), ns, nst;
  for (int d : dims) {
    int dd = norm_dim(d, x.ndim());
    ns.push_back(x.shape[dd]);
    nst.push_back(st[dd]);
  }
  return view(x, 0, ns, nst);
}

inline HT transpose(const HT& x, int a, int b) {
  std::vector<int> p(x.ndim());
  std::iota(p.begin(), p.end(), 0);
  std::swap(p[norm_dim(a, x.ndim())], p[norm_dim(b, x.ndim())]);
  return permute(x, p);
}

inline Shape broadcast_shapes(const std::vector<Shape>& shapes) {
  size_t nd = 0;
  for (auto& s : shapes) nd = std::max(nd, s.size());
  Shape out(nd, 1);
  for (auto& s : shapes) {
    for (size_t i = 0; i < s.size(); ++i) {
      int64_t& o = out[nd - s.size() + i];
      if (s[i] != 1) o = s[i];
    }
  }
  return out;
}

inline HT expand(const HT& x, const Shape& shape) {
  Shape st = contiguous_strides(x.shape), nst(shape.size(), 0);
  size_t off = shape.size() - x.shape.size();
  for (size_t i = 0; i < x.shape.size(); ++i) nst[off + i] = x.shape[i] == 1 ? 0 : st[i];
  return view(x, 0, shape, nst);
}

inline HT unary(const HT& x, const std::function<double(double)>& f) {
  HT o = x;
  for (auto& e : o.v) e = f(e);
  return o;
}

inline HT binary(const HT& a, const HT& b, const std::function<double(double, double)>& f) {
  Shape s = broadcast_shapes({a.shape, b.shape});
  HT ea = expand(a, s), eb = expand(b, s), o(s);
  for (size_t i = 0; i < o.v.size(); ++i) o.v[i] = f(ea.v[i], eb.v[i]);
  return o;
}

inline HT ternary(const HT& a, const HT& b, const HT& c, const std::function<double(double, double, double)>& f) {
  Shape s = broadcast_shapes({a.shape, b.shape, c.shape});
  HT ea = expand(a, s), eb = expand(b, s), ec = expand(c, s), o(s);
  for (size_t i = 0; i < o.v.size(); ++i) o.v[i] = f(ea.v[i], eb.v[i], ec.v[i]);
  return o;
}

// Reduces dims (empty: all) with fn over the gathered elements.
inline HT reduce(const HT& x, std::vector<int> dims, bool keepdim,
                 const std::function<double(const std::vector<double>&)>& fn) {
  int nd = x.ndim();
  std::vector<bool> red(nd, dims.empty());
  for (int d : dims) red[norm_dim(d, nd)] = true;
  Shape kshape(nd), oshape;
  for (int i = 0; i < nd; ++i) {
    kshape[i] = red[i] ? 1 : x.shape[i];
    if (!red[i] || keepdim) oshape.push_back(kshape[i]);
  }
  Shape kst = contiguous_strides(kshape);
  std::vector<std::vector<double>> groups(static_cast<size_t>(HT::numel_of(kshape)));
  for_each_index(x.shape, [&](const std::vector<int64_t>& idx, int64_t lin) {
    int64_t g = 0;
    for (int d = 0; d < nd; ++d) g += (red[d] ? 0 : idx[d]) * kst[d];
    groups[g].push_back(x.v[lin]);
  });
  HT out(oshape);
  for (size_t g = 0; g < groups.size(); ++g) out.v[g] = fn(groups[g]);
  return out;
}

inline double r_sum(const std::vector<double>& e) { double s = 0; for (double x : e) s += x; return s; }
inline double r_mean(const std::vector<double>& e) { return r_sum(e) / static_cast<double>(e.size()); }
inline double r_prod(const std::vector<double>& e) { double s = 1; for (double x : e) s *= x; return s; }
inline double r_max(const std::vector<double>& e) { return *std::max_element(e.begin(), e.end()); }
inline double r_min(const std::vector<double>& e) { return *std::min_element(e.begin(), e.end()); }
inline double r_var(const std::vector<double>& e, double corr) {
  double m = r_mean(e), s = 0;
  for (double x : e) s += (x - m) * (x - m);
  return s / (static_cast<double>(e.size()) - corr);
}
inline double r_norm(const std::vector<double>& e, double p) {
  if (std::isinf(p)) { double m = 0; for (double x : e) m = std::max(m, std::fabs(x)); return m; }
  double s = 0;
  for (double x : e) s += std::pow(std::fabs(x), p);
  return std::pow(s, 1.0 / p);
}
inline double r_logsumexp(const std::vector<double>& e) {
  double m = r_max(e), s = 0;
  for (double x : e) s += std::exp(x - m);
  return m + std::log(s);
}

inline HT cat(const std::vector<HT>& xs, int dim) {
  int nd = xs[0].ndim();
  dim = norm_dim(dim, nd);
  Shape s = xs[0].shape;
  s[dim] = 0;
  for (auto& x : xs) s[dim] += x.shape[dim];
  HT out(s);
  int64_t off = 0;
  for (auto& x : xs) {
    for_each_index(x.shape, [&](const std::vector<int64_t>& idx, int64_t lin) {
      std::vector<int64_t> o = idx;
      o[dim] += off;
      int64_t p = 0;
      Shape st = contiguous_strides(s);
      for (int d = 0; d < nd; ++d) p += o[d] * st[d];
      out.v[p] = x.v[lin];
    });
    off += x.shape[dim];
  }
  return out;
}

inline HT unsqueeze(const HT& x, int dim) {
  Shape s = x.shape;
  dim = norm_dim(dim, x.ndim() + 1);
  s.insert(s.begin() + dim, 1);
  return reshape(x, s);
}

inline HT stack(const std::vector<HT>& xs, int dim) {
  std::vector<HT> u;
  for (auto& x : xs) u.push_back(unsqueeze(x, dim));
  return cat(u, dim);
}

// Python-style slice of one dim with step > 0 (start/end already in range).
inline HT slice(const HT& x, int dim, int64_t start, int64_t end, int64_t step) {
  dim = norm_dim(dim, x.ndim());
  Shape st = contiguous_strides(x.shape), s = x.shape, nst = st;
  s[dim] = end > start ? (end - start + step - 1) / step : 0;
  nst[dim] = st[dim] * step;
  return view(x, start * st[dim], s, nst);
}

inline HT select(const HT& x, int dim, int64_t index) {
  dim = norm_dim(dim, x.ndim());
  if (index < 0) index += x.shape[dim];
  Shape st = contiguous_strides(x.shape), s = x.shape;
  int64_t off = index * st[dim];
  s.erase(s.begin() + dim);
  st.erase(st.begin() + dim);
  return view(x, off, s, st);
}

inline HT flip(const HT& x, const std::vector<int>& dims) {
  Shape st = contiguous_strides(x.shape);
  int64_t off = 0;
  for (int d : dims) {
    int dd = norm_dim(d, x.ndim());
    off += (x.shape[dd] - 1) * st[dd];
    st[dd] = -st[dd];
  }
  return view(x, off, x.shape, st);
}

inline HT diagonal(const HT& x, int64_t offset, int d1, int d2) {
  int nd = x.ndim();
  d1 = norm_dim(d1, nd);
  d2 = norm_dim(d2, nd);
  Shape st = contiguous_strides(x.shape), s, nst;
  for (int i = 0; i < nd; ++i)
    if (i != d1 && i != d2) { s.push_back(x.shape[i]); nst.push_back(st[i]); }
  int64_t off = 0, len;
  if (offset >= 0) { off = offset * st[d2]; len = std::min(x.shape[d1], x.shape[d2] - offset); }
  else { off = -offset * st[d1]; len = std::min(x.shape[d1] + offset, x.shape[d2]); }
  s.push_back(std::max<int64_t>(len, 0));
  nst.push_back(st[d1] + st[d2]);
  return view(x, off, s, nst);
}

inline HT tri(const HT& x, int64_t diag, bool upper) {
  HT o = x;
  int nd = x.ndim();
  for_each_index(x.shape, [&](const std::vector<int64_t>& idx, int64_t lin) {
    int64_t i = idx[nd - 2], j = idx[nd - 1];
    bool keep = upper ? (j - i >= diag) : (j - i <= diag);
    if (!keep) o.v[lin] = 0;
  });
  return o;
}

inline HT cumsum(const HT& x, int dim) {
  dim = norm_dim(dim, x.ndim());
  HT o = x;
  Shape st = contiguous_strides(x.shape);
  for_each_index(x.shape, [&](const std::vector<int64_t>& idx, int64_t lin) {
    if (idx[dim] > 0) o.v[lin] += o.v[lin - st[dim]];
  });
  return o;
}

// ------------------------------------------------------------------ scalar math references

// NumPy matmul: 1-D operands become a row / column vector whose dim is dropped; batch dims broadcast.
inline HT matmul(const HT& a0, const HT& b0) {
  HT a = a0.ndim() == 1 ? reshape(a0, {1, a0.shape[0]}) : a0;
  HT b = b0.ndim() == 1 ? reshape(b0, {b0.shape[0], 1}) : b0;
  const int64_t M = a.shape[a.ndim() - 2], K = a.shape[a.ndim() - 1], N = b.shape[b.ndim() - 1];
  Shape ba(a.shape.begin(), a.shape.end() - 2), bb(b.shape.begin(), b.shape.end() - 2);
  Shape bs = broadcast_shapes({ba, bb});
  Shape sa = bs, sb = bs, so = bs;
  sa.insert(sa.end(), {M, K});
  sb.insert(sb.end(), {K, N});
  so.insert(so.end(), {M, N});
  HT ea = expand(a, sa), eb = expand(b, sb), o(so);
  const int64_t batch = HT::numel_of(bs);
  for (int64_t q = 0; q < batch; ++q)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += ea.v[(q * M + i) * K + k] * eb.v[(q * K + k) * N + j];
        o.v[(q * M + i) * N + j] = acc;
      }
  Shape fs = bs;
  if (a0.ndim() != 1) fs.push_back(M);
  if (b0.ndim() != 1) fs.push_back(N);
  return reshape(o, fs);
}

inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double gelu(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
inline double gelu_tanh(double x) {
  const double k = std::sqrt(2.0 / 3.14159265358979323846);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}
inline double softplus(double x, double beta, double threshold) {
  return beta * x > threshold ? x : std::log1p(std::exp(beta * x)) / beta;
}
inline double sign(double x) { return x > 0 ? 1.0 : (x < 0 ? -1.0 : 0.0); }
inline double round_half_even(double x) { return std::nearbyint(x); }

// ------------------------------------------------------------------ device transfer

inline size_t dsize(flame_dtype_t d) { return flame_dtype_size(d); }

// Uploads x as dtype (values converted; bool as 0/1).
inline flame_status_t upload(flame_ctx_t ctx, const HT& x, flame_dtype_t dt, flame_tensor_t* out) {
  size_t n = static_cast<size_t>(x.numel());
  std::vector<unsigned char> buf(n * dsize(dt) + 1);
  for (size_t i = 0; i < n; ++i) {
    double e = x.v[i];
    unsigned char* p = buf.data() + i * dsize(dt);
    switch (dt) {
      case FLAME_DTYPE_F32: { float f = static_cast<float>(e); std::memcpy(p, &f, 4); break; }
      case FLAME_DTYPE_F64: std::memcpy(p, &e, 8); break;
      case FLAME_DTYPE_F16: { uint16_t h = f32_to_f16(static_cast<float>(e)); std::memcpy(p, &h, 2); break; }
      case FLAME_DTYPE_BF16: { uint16_t h = f32_to_bf16(static_cast<float>(e)); std::memcpy(p, &h, 2); break; }
      case FLAME_DTYPE_I32: { int32_t k = static_cast<int32_t>(e); std::memcpy(p, &k, 4); break; }
      case FLAME_DTYPE_I64: { int64_t k = static_cast<int64_t>(e); std::memcpy(p, &k, 8); break; }
      case FLAME_DTYPE_U8: *p = static_cast<unsigned char>(e); break;
      case FLAME_DTYPE_BOOL: *p = e != 0 ? 1 : 0; break;
      case FLAME_DTYPE_F8_E4M3: *p = f8ref::encode(f8ref::kE4M3, static_cast<float>(e)); break;
      case FLAME_DTYPE_F8_E5M2: *p = f8ref::encode(f8ref::kE5M2, static_cast<float>(e)); break;
    }
  }
  return flame_from_host(ctx, buf.data(), n * dsize(dt), x.shape.empty() ? nullptr : x.shape.data(),
                         static_cast<int32_t>(x.shape.size()), dt, out);
}

// Downloads t (any dtype and strides) into a float64 host tensor.
inline flame_status_t download(flame_tensor_t t, HT* out) {
  flame_dtype_t dt;
  int32_t nd;
  flame_status_t st;
  if ((st = flame_tensor_dtype(t, &dt)) != FLAME_OK) return st;
  if ((st = flame_tensor_ndim(t, &nd)) != FLAME_OK) return st;
  Shape s(static_cast<size_t>(nd));
  if (nd > 0 && (st = flame_tensor_shape(t, s.data(), nd)) != FLAME_OK) return st;
  *out = HT(s);
  size_t n = static_cast<size_t>(out->numel());
  std::vector<unsigned char> buf(n * dsize(dt) + 1);
  if ((st = flame_to_host(t, buf.data(), n * dsize(dt))) != FLAME_OK) return st;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char* p = buf.data() + i * dsize(dt);
    double& e = out->v[i];
    switch (dt) {
      case FLAME_DTYPE_F32: { float f; std::memcpy(&f, p, 4); e = f; break; }
      case FLAME_DTYPE_F64: std::memcpy(&e, p, 8); break;
      case FLAME_DTYPE_F16: { uint16_t h; std::memcpy(&h, p, 2); e = f16_to_f32(h); break; }
      case FLAME_DTYPE_BF16: { uint16_t h; std::memcpy(&h, p, 2); e = bf16_to_f32(h); break; }
      case FLAME_DTYPE_I32: { int32_t k; std::memcpy(&k, p, 4); e = k; break; }
      case FLAME_DTYPE_I64: { int64_t k; std::memcpy(&k, p, 8); e = static_cast<double>(k); break; }
      case FLAME_DTYPE_U8: e = *p; break;
      case FLAME_DTYPE_BOOL: e = *p ? 1.0 : 0.0; break;
      case FLAME_DTYPE_F8_E4M3: e = f8ref::decode(f8ref::kE4M3, *p); break;
      case FLAME_DTYPE_F8_E5M2: e = f8ref::decode(f8ref::kE5M2, *p); break;
    }
  }
  return FLAME_OK;
}

inline flame_dtype_t dtype_of(flame_tensor_t t) {
  flame_dtype_t d = FLAME_DTYPE_BOOL;
  flame_tensor_dtype(t, &d);
  return d;
}

inline Shape shape_of(flame_tensor_t t) {
  int32_t nd = 0;
  flame_tensor_ndim(t, &nd);
  Shape s(static_cast<size_t>(nd));
  if (nd > 0) flame_tensor_shape(t, s.data(), nd);
  return s;
}

// ------------------------------------------------------------------ input domains

// Values drawn uniformly from [lo, hi), rejecting those within min_dist of any kink; with
// half_grid the kinks are all multiples of 0.5 (floor/ceil/round); grid_offset >= 0 draws
// floor(u) + grid_offset + U(-0.1, 0.1) so that two inputs from grids 0.25 and 0.75 never meet.
struct Domain {
  double lo = -2.0, hi = 2.0;
  std::vector<double> kinks;
  double min_dist = 0.0;
  bool half_grid = false;
  double grid_offset = -1.0;
  bool boolean = false;

  double draw(std::mt19937_64& rng) const {
    std::uniform_real_distribution<double> u(lo, hi);
    if (boolean) return std::uniform_int_distribution<int>(0, 1)(rng);
    for (int tries = 0; tries < 100000; ++tries) {
      double x = u(rng);
      if (grid_offset >= 0) return std::floor(x) + grid_offset + std::uniform_real_distribution<double>(-0.1, 0.1)(rng);
      bool ok = true;
      for (double k : kinks) ok = ok && std::fabs(x - k) >= min_dist;
      if (half_grid) ok = ok && std::fabs(2 * x - std::nearbyint(2 * x)) >= 2 * min_dist;
      if (ok) return x;
    }
    return lo;
  }
};

inline Domain uni(double lo = -2, double hi = 2) { Domain d; d.lo = lo; d.hi = hi; return d; }
inline Domain away(double lo, double hi, std::vector<double> kinks, double min_dist = 0.1) {
  Domain d = uni(lo, hi);
  d.kinks = std::move(kinks);
  d.min_dist = min_dist;
  return d;
}
inline Domain away0(double lo = -2, double hi = 2, double min_dist = 0.1) { return away(lo, hi, {0.0}, min_dist); }
inline Domain halfgrid(double lo = -3, double hi = 3) { Domain d = uni(lo, hi); d.half_grid = true; d.min_dist = 0.1; return d; }
inline Domain grid(double offset) { Domain d = uni(-2, 2); d.grid_offset = offset; return d; }
inline Domain boolean() { Domain d; d.boolean = true; return d; }

struct In {
  Shape shape;
  Domain dom = uni();
  bool noncontig = false;  // the leaf is a transposed (or strided) view
  bool grad = true;        // requires grad (floating inputs only)
};

inline In in(Shape s, Domain d = uni()) { In i; i.shape = std::move(s); i.dom = std::move(d); return i; }
inline In nc(Shape s, Domain d = uni()) { In i = in(std::move(s), std::move(d)); i.noncontig = true; return i; }
inline In cond(Shape s) { In i = in(std::move(s), boolean()); i.grad = false; return i; }

using Tensors = std::vector<flame_tensor_t>;
using FlameFn = std::function<flame_status_t(const Tensors& in, flame_dtype_t dt, std::vector<T>& out)>;
using RefFn = std::function<std::vector<HT>(const std::vector<HT>& in)>;

struct Case {
  std::vector<In> ins;
  std::function<void(std::vector<HT>&)> fixup;  // optional edit of the drawn inputs
  Case(std::vector<In> i, std::function<void(std::vector<HT>&)> f = nullptr) : ins(std::move(i)), fixup(std::move(f)) {}
};

struct Row {
  std::string name;
  std::vector<std::string> covers;  // the op-list c_names this row exercises
  std::vector<Case> cases;
  FlameFn fwd;
  RefFn ref;
  double tol_scale = 1.0;
  bool low_precision = false;  // also run in f16 and bf16
  bool second_order = true;    // run the create_graph (double backward) check in f64
};

// The differentiable table and the non-differentiable one (defined in test_gradcheck.cpp).
struct NdRow {
  std::string name;
  std::vector<std::string> covers;
  int n_inputs;
  std::function<flame_status_t(const Tensors& in, flame_tensor_t* out)> fn;
};

// ------------------------------------------------------------------ tolerances

inline double tol_for(flame_dtype_t d) {
  switch (d) {
    case FLAME_DTYPE_F64: return 1e-6;
    case FLAME_DTYPE_F32: return 1e-3;
    case FLAME_DTYPE_F16: return 1e-2;
    case FLAME_DTYPE_BF16: return 5e-2;
    default: return 0;
  }
}
// Relative tolerance of a result computed in f32 (f64 for f64) and rounded to d once: the fused
// loss kernels' checks at scale (test_loss.cpp, test_loss_pointwise.cpp).
inline double rounded_rtol(flame_dtype_t d) {
  switch (d) {
    case FLAME_DTYPE_F64: return 1e-9;
    case FLAME_DTYPE_F32: return 1e-4;
    case FLAME_DTYPE_F16: return 4e-3;
    default: return 1.6e-2;
  }
}

// |got - want| <= tol * (|want| + max(1, max|want|) * atol_frac) elementwise; on failure describes the
// worst element.
inline ::testing::AssertionResult close(const HT& got, const HT& want, double tol, const std::string& what,
                                        double atol_frac = 0.1) {
  if (got.shape != want.shape)
    return ::testing::AssertionFailure() << what << ": shape " << shape_str(got.shape) << " != expected "
                                         << shape_str(want.shape);
  double scale = 1.0;
  for (double w : want.v) scale = std::max(scale, std::fabs(w));
  double worst = 0;
  size_t wi = 0;
  bool bad = false;
  for (size_t i = 0; i < want.v.size(); ++i) {
    double err = std::fabs(got.v[i] - want.v[i]);
    double lim = tol * (std::fabs(want.v[i]) + atol_frac * scale);
    if (!(err <= lim)) {  // also catches NaN
      bad = true;
      double r = err / lim;
      if (!(r <= worst)) { worst = r; wi = i; }
    }
  }
  if (!bad) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os << what << ": element " << wi << " of " << shape_str(want.shape) << " is " << got.v[wi] << ", expected "
     << want.v[wi] << " (tol " << tol << ")\n  got:     ";
  for (size_t i = 0; i < std::min<size_t>(got.v.size(), 24); ++i) os << got.v[i] << " ";
  os << "\n  expected: ";
  for (size_t i = 0; i < std::min<size_t>(want.v.size(), 24); ++i) os << want.v[i] << " ";
  return ::testing::AssertionFailure() << os.str();
}

// ------------------------------------------------------------------ finite differences (host, f64)

// sum_k sum(ref(x)_k * w_k)
inline double weighted_loss(const RefFn& ref, const std::vector<HT>& x, const std::vector<HT>& w) {
  std::vector<HT> y = ref(x);
  double s = 0;
  for (size_t k = 0; k < y.size() && k < w.size(); ++k)
    for (size_t i = 0; i < y[k].v.size(); ++i) s += y[k].v[i] * w[k].v[i];
  return s;
}

// Central differences of weighted_loss with respect to input j.
inline HT fd_grad(const RefFn& ref, std::vector<HT> x, const std::vector<HT>& w, size_t j, double eps = 1e-6) {
  HT g(x[j].shape);
  for (size_t i = 0; i < x[j].v.size(); ++i) {
    double x0 = x[j].v[i], h = eps * std::max(1.0, std::fabs(x0));
    x[j].v[i] = x0 + h;
    double lp = weighted_loss(ref, x, w);
    x[j].v[i] = x0 - h;
    double lm = weighted_loss(ref, x, w);
    x[j].v[i] = x0;
    g.v[i] = (lp - lm) / (2 * h);
  }
  return g;
}

// ------------------------------------------------------------------ building inputs on the device

// Creates the leaf for logical values x: contiguous, or a non-contiguous view (transpose of the last
// two dims, or a stride-2 slice for 1-d). The view itself is the leaf (its base never requires grad).
inline flame_status_t make_leaf(flame_ctx_t ctx, const HT& x, flame_dtype_t dt, bool noncontig, T* out) {
  if (!noncontig || x.ndim() == 0) return upload(ctx, x, dt, out->out());
  T base;
  flame_status_t st;
  if (x.ndim() >= 2) {
    HT b = transpose(x, -1, -2);  // materialised: the storage of the transposed layout
    if ((st = upload(ctx, b, dt, base.out())) != FLAME_OK) return st;
    return flame_transpose(base, -1, -2, out->out());
  }
  HT b(Shape{2 * x.shape[0]}, 7.0);
  for (int64_t k = 0; k < x.shape[0]; ++k) b.v[2 * k] = x.v[k];
  if ((st = upload(ctx, b, dt, base.out())) != FLAME_OK) return st;
  return flame_slice(base, 0, 0, 2 * x.shape[0], 2, out->out());
}

inline std::string dtname(flame_dtype_t d) { return flame_dtype_name(d); }

// The seed of the random inputs: FLAME_GRADCHECK_SEED or a fresh one per process.
inline uint64_t seed() {
  static uint64_t s = [] {
    const char* e = std::getenv("FLAME_GRADCHECK_SEED");
    if (e && *e) return static_cast<uint64_t>(std::strtoull(e, nullptr, 10));
    return (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  }();
  return s;
}

inline std::vector<HT> draw_inputs(const Case& c, std::mt19937_64& rng) {
  std::vector<HT> xs;
  for (const In& i : c.ins) {
    HT h(i.shape);
    for (auto& e : h.v) e = i.dom.draw(rng);
    xs.push_back(std::move(h));
  }
  if (c.fixup) c.fixup(xs);
  return xs;
}

inline HT random_weights(const Shape& s, std::mt19937_64& rng) {
  HT w(s);
  std::uniform_real_distribution<double> u(0.5, 1.5);
  for (auto& e : w.v) e = u(rng) * (std::uniform_int_distribution<int>(0, 1)(rng) ? 1 : -1);
  return w;
}

// ------------------------------------------------------------------ the first-order check

// Runs one case of row in dtype dt. Uses gtest assertions; call under SCOPED_TRACE.
inline void check_case(flame_ctx_t ctx, const Row& row, const Case& c, flame_dtype_t dt, std::mt19937_64& rng) {
  std::vector<HT> xs = draw_inputs(c, rng);
  std::vector<T> leaves(xs.size());
  Tensors raw;
  for (size_t j = 0; j < xs.size(); ++j) {
    const In& spec = c.ins[j];
    flame_dtype_t idt = spec.dom.boolean ? FLAME_DTYPE_BOOL : dt;
    FLAME_ASSERT_OK(make_leaf(ctx, xs[j], idt, spec.noncontig, &leaves[j]));
    FLAME_ASSERT_OK(download(leaves[j], &xs[j]));  // the values the device really holds (rounded)
    if (spec.grad && is_floating(idt)) FLAME_ASSERT_OK(flame_tensor_set_requires_grad(leaves[j], 1));
    raw.push_back(leaves[j]);
  }
  std::vector<T> outs;
  FLAME_ASSERT_OK(row.fwd(raw, dt, outs));
  std::vector<HT> want = row.ref(xs);
  ASSERT_EQ(outs.size(), want.size()) << "number of outputs";

  // Forward values and the loss sum_k sum(out_k * w_k).
  std::vector<HT> ws;
  T loss;
  double tol = tol_for(dt) * row.tol_scale;
  // f16/bf16: a broadcast input's gradient sums rounded products, so allow more absolute error.
  const double atol_frac = (dt == FLAME_DTYPE_F16 || dt == FLAME_DTYPE_BF16) ? 0.5 : 0.1;
  for (size_t k = 0; k < outs.size(); ++k) {
    flame_dtype_t odt = dtype_of(outs[k]);
    double otol = std::max(tol, tol_for(odt) * row.tol_scale);
    HT got;
    FLAME_ASSERT_OK(download(outs[k], &got));
    EXPECT_TRUE(close(got, want[k], otol, "forward output " + std::to_string(k), atol_frac));
    int32_t rg = 0;
    FLAME_ASSERT_OK(flame_tensor_requires_grad(outs[k], &rg));
    EXPECT_EQ(rg, 1) << "output " << k << " should require grad";
    HT w = random_weights(want[k].shape, rng);
    T wt, prod, part;
    FLAME_ASSERT_OK(upload(ctx, w, odt, wt.out()));
    FLAME_ASSERT_OK(download(wt, &w));
    ws.push_back(w);
    FLAME_ASSERT_OK(flame_mul(outs[k], wt, prod.out()));
    FLAME_ASSERT_OK(flame_sum_all(prod, part.out()));
    if (!loss.h) {
      loss = std::move(part);
    } else {
      T acc;
      FLAME_ASSERT_OK(flame_add(loss, part, acc.out()));
      loss = std::move(acc);
    }
  }
  FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));

  for (size_t j = 0; j < xs.size(); ++j) {
    const In& spec = c.ins[j];
    if (!spec.grad || spec.dom.boolean) continue;
    T g;
    FLAME_ASSERT_OK(flame_tensor_grad(leaves[j], g.out()));
    ASSERT_NE(g.h, nullptr) << "input " << j << " has no .grad after backward";
    EXPECT_EQ(dtype_of(g), dt) << "gradient dtype of input " << j;
    HT got;
    FLAME_ASSERT_OK(download(g, &got));
    HT ref = fd_grad(row.ref, xs, ws, j);
    EXPECT_TRUE(close(got, ref, tol, "gradient of input " + std::to_string(j), atol_frac));
  }
}

// ------------------------------------------------------------------ the second-order check (f64)

// g = J^T u (create_graph), loss2 = sum(g * v); d loss2/du = J v (finite differences along v) and
// d loss2/dx = d/dx [sum(fd_grad(x; u) * v)] (nested finite differences).
inline void check_second_order(flame_ctx_t ctx, const Row& row, const Case& c, std::mt19937_64& rng) {
  const flame_dtype_t dt = FLAME_DTYPE_F64;
  std::vector<HT> xs = draw_inputs(c, rng);
  std::vector<T> leaves(xs.size());
  Tensors raw, gin;
  std::vector<size_t> gidx;
  for (size_t j = 0; j < xs.size(); ++j) {
    const In& spec = c.ins[j];
    flame_dtype_t idt = spec.dom.boolean ? FLAME_DTYPE_BOOL : dt;
    FLAME_ASSERT_OK(make_leaf(ctx, xs[j], idt, spec.noncontig, &leaves[j]));
    if (spec.grad && !spec.dom.boolean) {
      FLAME_ASSERT_OK(flame_tensor_set_requires_grad(leaves[j], 1));
      gin.push_back(leaves[j]);
      gidx.push_back(j);
    }
    raw.push_back(leaves[j]);
  }
  std::vector<T> outs;
  FLAME_ASSERT_OK(row.fwd(raw, dt, outs));
  std::vector<HT> y = row.ref(xs);
  ASSERT_EQ(outs.size(), y.size());

  std::vector<HT> us, vs;
  std::vector<T> ut(outs.size()), g(gin.size()), vt(gin.size());
  Tensors outs_raw, us_raw;
  for (size_t k = 0; k < outs.size(); ++k) {
    us.push_back(random_weights(y[k].shape, rng));
    FLAME_ASSERT_OK(upload(ctx, us[k], dtype_of(outs[k]), ut[k].out()));  // e.g. to_dtype gives f32
    FLAME_ASSERT_OK(download(ut[k], &us[k]));
    FLAME_ASSERT_OK(flame_tensor_set_requires_grad(ut[k], 1));
    outs_raw.push_back(outs[k]);
    us_raw.push_back(ut[k]);
  }
  std::vector<flame_tensor_t> gres(gin.size(), nullptr);
  FLAME_ASSERT_OK(flame_grad(ctx, outs_raw.data(), us_raw.data(), static_cast<int32_t>(outs.size()), gin.data(),
                             static_cast<int32_t>(gin.size()),
                             FLAME_BACKWARD_CREATE_GRAPH | FLAME_BACKWARD_RETAIN_GRAPH, gres.data()));
  for (size_t j = 0; j < gin.size(); ++j) g[j] = T(gres[j]);

  T loss2;
  for (size_t j = 0; j < gin.size(); ++j) {
    ASSERT_NE(g[j].h, nullptr);
    vs.push_back(random_weights(xs[gidx[j]].shape, rng));
    FLAME_ASSERT_OK(upload(ctx, vs[j], dt, vt[j].out()));
    T prod, part;
    FLAME_ASSERT_OK(flame_mul(g[j], vt[j], prod.out()));
    FLAME_ASSERT_OK(flame_sum_all(prod, part.out()));
    if (!loss2.h) {
      loss2 = std::move(part);
    } else {
      T acc;
      FLAME_ASSERT_OK(flame_add(loss2, part, acc.out()));
      loss2 = std::move(acc);
    }
  }
  Tensors wrt = gin;
  wrt.insert(wrt.end(), us_raw.begin(), us_raw.end());
  std::vector<flame_tensor_t> res(wrt.size(), nullptr);
  flame_tensor_t l2 = loss2;
  FLAME_ASSERT_OK(flame_grad(ctx, &l2, nullptr, 1, wrt.data(), static_cast<int32_t>(wrt.size()), FLAME_GRAD_ALLOW_UNUSED,
                             res.data()));
  std::vector<T> held;
  for (auto r : res) held.emplace_back(r);

  const double tol = 1e-5 * row.tol_scale;
  // d loss2 / d u_k = (J v)_k: central differences along v.
  {
    const double h = 1e-6;
    std::vector<HT> xp = xs, xm = xs;
    for (size_t j = 0; j < gidx.size(); ++j)
      for (size_t i = 0; i < xs[gidx[j]].v.size(); ++i) {
        xp[gidx[j]].v[i] += h * vs[j].v[i];
        xm[gidx[j]].v[i] -= h * vs[j].v[i];
      }
    std::vector<HT> yp = row.ref(xp), ym = row.ref(xm);
    for (size_t k = 0; k < outs.size(); ++k) {
      HT want(y[k].shape), got(y[k].shape);
      for (size_t i = 0; i < want.v.size(); ++i) want.v[i] = (yp[k].v[i] - ym[k].v[i]) / (2 * h);
      if (held[gin.size() + k].h) FLAME_ASSERT_OK(download(held[gin.size() + k], &got));
      EXPECT_TRUE(close(got, want, tol, "d(grad . v)/d(grad_output " + std::to_string(k) + ")"));
    }
  }
  // d loss2 / d x_j: nested central differences (NULL result = zero).
  auto inner = [&](const std::vector<HT>& x) {
    double s = 0;
    for (size_t j = 0; j < gidx.size(); ++j) {
      HT gj = fd_grad(row.ref, x, us, gidx[j], 1e-4);
      for (size_t i = 0; i < gj.v.size(); ++i) s += gj.v[i] * vs[j].v[i];
    }
    return s;
  };
  // Rounding in the nested differences: each weighted loss carries ~eps * sum|y u|, divided by both steps
  // and summed over the inner terms |v|; an exactly zero second derivative (conv's bias) reads as that
  // noise, which the comparison's floor must allow for (4x margin).
  double abs_loss = 0, vsum = 0;
  {
    std::vector<HT> y0 = row.ref(xs);
    for (size_t k = 0; k < y0.size() && k < us.size(); ++k)
      for (size_t i = 0; i < y0[k].v.size(); ++i) abs_loss += std::fabs(y0[k].v[i] * us[k].v[i]);
    for (const HT& vj : vs)
      for (double e : vj.v) vsum += std::fabs(e);
  }
  for (size_t j = 0; j < gidx.size(); ++j) {
    HT want(xs[gidx[j]].shape), got(xs[gidx[j]].shape);
    std::vector<HT> x = xs;
    double hmin = 1.0;
    for (size_t i = 0; i < want.v.size(); ++i) {
      double x0 = x[gidx[j]].v[i], h = 1e-4 * std::max(1.0, std::fabs(x0));
      hmin = std::min(hmin, h);
      x[gidx[j]].v[i] = x0 + h;
      double lp = inner(x);
      x[gidx[j]].v[i] = x0 - h;
      double lm = inner(x);
      x[gidx[j]].v[i] = x0;
      want.v[i] = (lp - lm) / (2 * h);
    }
    if (held[j].h) FLAME_ASSERT_OK(download(held[j], &got));
    const double tol2 = 1e-4 * row.tol_scale, noise = 4 * 2.2e-16 * abs_loss * vsum / (1e-4 * hmin);
    double scale = 1.0;
    for (double w : want.v) scale = std::max(scale, std::fabs(w));
    EXPECT_TRUE(close(got, want, tol2, "second derivative wrt input " + std::to_string(gidx[j]),
                      std::max(0.1, noise / (tol2 * scale))));
  }
}

// ---- the parameterised suites over a table of rows (FLAME_GRADCHECK_SUITES below)

struct Param {
  size_t row;
  flame_dtype_t dt;
};

// f64 and f32 for every row, f16 and bf16 too for low_precision rows.
inline std::vector<Param> first_order_params(const std::vector<Row>& rows) {
  std::vector<Param> p;
  for (size_t i = 0; i < rows.size(); ++i) {
    p.push_back({i, FLAME_DTYPE_F64});
    p.push_back({i, FLAME_DTYPE_F32});
    if (rows[i].low_precision) {
      p.push_back({i, FLAME_DTYPE_F16});
      p.push_back({i, FLAME_DTYPE_BF16});
    }
  }
  return p;
}

inline std::vector<size_t> second_order_params(const std::vector<Row>& rows) {
  std::vector<size_t> p;
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i].second_order) p.push_back(i);
  return p;
}

// The seed of one case: the run's seed, a per-table salt, the row name, the dtype and the case.
inline uint64_t case_seed(uint64_t salt, const std::string& name, int dt, size_t c) {
  uint64_t h = seed() ^ salt;
  for (char ch : name) h = (h ^ static_cast<unsigned char>(ch)) * 0x100000001b3ull;
  return h ^ (static_cast<uint64_t>(dt) << 40) ^ (static_cast<uint64_t>(c) << 48);
}

inline std::string case_trace(const Row& row, const char* what, size_t c) {
  std::ostringstream t;
  t << row.name << " " << what << " case " << c << " (inputs";
  for (const In& i : row.cases[c].ins) t << " " << shape_str(i.shape) << (i.noncontig ? "nc" : "");
  t << ") FLAME_GRADCHECK_SEED=" << seed();
  return t.str();
}

inline void run_first_order(flame_ctx_t ctx, const Row& row, flame_dtype_t dt, uint64_t salt) {
  for (size_t c = 0; c < row.cases.size(); ++c) {
    SCOPED_TRACE(case_trace(row, dtname(dt).c_str(), c));
    std::mt19937_64 rng(case_seed(salt, row.name, dt, c));
    check_case(ctx, row, row.cases[c], dt, rng);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// ---- coverage of the op list (tests/gpu/test_op_coverage.cpp): the c_names that gradient-check rows
// and not-differentiable rows exercise, registered at static initialisation by every table
// (FLAME_GRADCHECK_SUITES registers its rows itself).
inline std::set<std::string>& gradchecked_ops() {
  static std::set<std::string> s;
  return s;
}
inline std::set<std::string>& not_differentiable_ops() {
  static std::set<std::string> s;
  return s;
}
// Returns true (for a namespace-scope `const bool`).
inline bool register_covers(const std::vector<Row>& rows) {
  for (const Row& r : rows) gradchecked_ops().insert(r.covers.begin(), r.covers.end());
  return true;
}
inline bool register_covers(const std::vector<NdRow>& rows) {
  for (const NdRow& r : rows) not_differentiable_ops().insert(r.covers.begin(), r.covers.end());
  return true;
}

inline void run_second_order(flame_ctx_t ctx, const Row& row, uint64_t salt) {
  for (size_t c = 0; c < row.cases.size(); ++c) {
    SCOPED_TRACE(case_trace(row, "f64 second order", c));
    std::mt19937_64 rng(case_seed(salt, row.name, 99, c));
    check_second_order(ctx, row, row.cases[c], rng);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

}  // namespace gc

// Defines the first-order suite `First` (test names <row>_<dtype>) and the second-order suite
// `Second` (rows with second_order) under the instantiation prefix `Prefix`, over the table
// returned by rows_fn(); `salt` keeps the tables' random inputs apart. The rows' covers count for
// the op-list coverage test (gc::register_covers).
#define FLAME_GRADCHECK_SUITES(Prefix, First, Second, rows_fn, salt)                                       \
  const bool Prefix##_covers_registered = gc::register_covers(rows_fn());                                 \
  class First : public GpuTest, public ::testing::WithParamInterface<gc::Param> {};                        \
  TEST_P(First, MatchesHostFiniteDifferences) {                                                            \
    gc::run_first_order(ctx, rows_fn()[GetParam().row], GetParam().dt, salt);                              \
  }                                                                                                        \
  INSTANTIATE_TEST_SUITE_P(Prefix, First, ::testing::ValuesIn(gc::first_order_params(rows_fn())),          \
                           [](const ::testing::TestParamInfo<gc::Param>& info) {                           \
                             return rows_fn()[info.param.row].name + "_" + flame_dtype_name(info.param.dt); \
                           });                                                                             \
  class Second : public GpuTest, public ::testing::WithParamInterface<size_t> {};                          \
  TEST_P(Second, CreateGraphMatchesHostFiniteDifferences) { gc::run_second_order(ctx, rows_fn()[GetParam()], salt); } \
  INSTANTIATE_TEST_SUITE_P(Prefix, Second, ::testing::ValuesIn(gc::second_order_params(rows_fn())),        \
                           [](const ::testing::TestParamInfo<size_t>& info) { return rows_fn()[info.param].name; })


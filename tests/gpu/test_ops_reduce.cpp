// Forward tests of flame.h "Reductions" against float64 host references: single, several, all
// and negative dims, keepdim, non-contiguous inputs, every dtype each op takes, empty inputs,
// ties and NaN for argmax/argmin, long scans, big reductions (2^24 elements) and, in
// ReductionsLarge, one reduction over more than 2^31 elements.
#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <string>
#include <vector>
#include "host_ref.h"

using namespace href;

namespace {

// ---------------------------------------------------------------------------------------------
// host reference: group the elements of x by output position

struct Groups {
  Shape out_shape;
  std::vector<std::vector<double>> g;
};

std::vector<int> normalize(const std::vector<int>& dims, size_t nd) {
  std::vector<int> r;
  if (dims.empty()) {
    for (size_t i = 0; i < nd; ++i) r.push_back(static_cast<int>(i));
  } else {
    for (int d : dims) r.push_back(norm_dim(d, nd));
  }
  std::sort(r.begin(), r.end());
  return r;
}

Groups group(const HT& x, const std::vector<int>& dims_in, bool keepdim) {
  const size_t nd = x.shape.size();
  const std::vector<int> dims = normalize(dims_in, nd);
  std::vector<bool> red(nd, false);
  for (int d : dims) red[static_cast<size_t>(d)] = true;
  Groups G;
  for (size_t d = 0; d < nd; ++d) {
    if (!red[d]) G.out_shape.push_back(x.shape[d]);
    else if (keepdim) G.out_shape.push_back(1);
  }
  G.g.resize(static_cast<size_t>(numel_of(G.out_shape)));
  const Shape ost = contiguous_strides(G.out_shape);
  for_each_index(x.shape, [&](const Shape& i) {
    int64_t o = 0;
    size_t k = 0;
    for (size_t d = 0; d < nd; ++d) {
      if (!red[d]) o += i[d] * ost[k++];
      else if (keepdim) ++k;
    }
    G.g[static_cast<size_t>(o)].push_back(x.at(i));
  });
  return G;
}

using RedFn = std::function<double(const std::vector<double>&)>;

double r_sum(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }
double r_abs_sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += std::fabs(x);
  return s;
}
double r_mean(const std::vector<double>& v) { return v.empty() ? std::nan("") : r_sum(v) / double(v.size()); }
double r_prod(const std::vector<double>& v) {
  double p = 1;
  for (double x : v) p *= x;
  return p;
}
double r_max(const std::vector<double>& v) {
  double m = -INFINITY;
  for (double x : v) {
    if (std::isnan(x)) return x;
    m = std::max(m, x);
  }
  return m;
}
double r_min(const std::vector<double>& v) {
  double m = INFINITY;
  for (double x : v) {
    if (std::isnan(x)) return x;
    m = std::min(m, x);
  }
  return m;
}
double r_var(const std::vector<double>& v, double correction) {
  const double m = r_mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return s / (double(v.size()) - correction);
}
double r_norm(const std::vector<double>& v, double p) {
  if (std::isinf(p)) {
    double m = 0;
    for (double x : v) m = std::max(m, std::fabs(x));
    return m;
  }
  double s = 0;
  for (double x : v) s += std::pow(std::fabs(x), p);
  return std::pow(s, 1.0 / p);
}
double r_lse(const std::vector<double>& v) {
  const double m = r_max(v);
  double s = 0;
  for (double x : v) s += std::exp(x - m);
  return m + std::log(s);
}
double r_argmax(const std::vector<double>& v) {  // first maximum; NaN counts as the maximum
  size_t best = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    if (std::isnan(v[i])) return double(i);
    if (v[i] > v[best]) best = i;
  }
  return double(best);
}
double r_argmin(const std::vector<double>& v) {
  size_t best = 0;
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] < v[best]) best = i;
  return double(best);
}

// Expected value and an error scale (the magnitude a f32 accumulator's rounding is relative to).
struct Expect {
  HT value;
  std::vector<double> scale;
};
Expect reduce_ref(const HT& x, const std::vector<int>& dims, bool keepdim, flame_dtype_t out, const RedFn& f,
                  const RedFn& scale) {
  Groups G = group(x, dims, keepdim);
  Expect e{HT(G.out_shape, out), std::vector<double>(G.g.size())};
  for (size_t k = 0; k < G.g.size(); ++k) {
    (*e.value.data)[k] = round_to(f(G.g[k]), out);
    e.scale[k] = scale ? scale(G.g[k]) : 0.0;
  }
  return e;
}

// |got - want| <= atol + rtol |want| + acc * scale
::testing::AssertionResult close_scaled(flame_tensor_t t, const Expect& e, double rtol, double atol, double acc) {
  if (!t) return ::testing::AssertionFailure() << "NULL tensor";
  HT got = download(t);
  if (got.shape != e.value.shape)
    return ::testing::AssertionFailure() << "shape " << to_string(got.shape) << ", expected " << to_string(e.value.shape);
  if (got.dtype != e.value.dtype)
    return ::testing::AssertionFailure() << "dtype " << dname(got.dtype) << ", expected " << dname(e.value.dtype);
  const std::vector<double>& a = *got.data;
  const std::vector<double>& w = *e.value.data;
  int bad = 0;
  std::ostringstream msg;
  msg.precision(17);
  for (size_t i = 0; i < a.size(); ++i) {
    if (close_enough(a[i], w[i], Tol{rtol, atol + acc * e.scale[i]})) continue;
    if (bad < 8) msg << "\n  [" << i << "] got " << a[i] << ", expected " << w[i] << " (scale " << e.scale[i] << ")";
    ++bad;
  }
  if (!bad) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << a.size() << " differ (" << dname(got.dtype) << "):" << msg.str();
}

// f32 accumulation error relative to the magnitude summed; f64 accumulates in f64.
double acc_eps(flame_dtype_t d) { return d == FLAME_DTYPE_F64 ? 1e-13 : 3e-6; }

// A device tensor with logical shape `shape`: contiguous, or a full reversal of dims of a
// contiguous tensor (so every axis has an unusual stride), or flipped.
struct Dev {
  T t;
  HT h;
};
enum class Lay { CONTIG, REVERSED, FLIPPED };
Dev make_dev(flame_ctx_t ctx, Rng& rng, const Shape& shape, flame_dtype_t d, const Domain& dm, Lay lay) {
  Dev r;
  const int nd = static_cast<int>(shape.size());
  if (nd < 2 && lay == Lay::REVERSED) lay = Lay::FLIPPED;
  if (nd < 1) lay = Lay::CONTIG;
  Shape base = shape;
  if (lay == Lay::REVERSED) std::reverse(base.begin(), base.end());
  HT hb = random(rng, base, d, dm);
  T tb = upload(ctx, hb);
  std::vector<int32_t> dims(static_cast<size_t>(nd));
  std::vector<int> hd(static_cast<size_t>(nd));
  switch (lay) {
    case Lay::CONTIG:
      r.t = std::move(tb);
      r.h = hb;
      break;
    case Lay::REVERSED:
      for (int i = 0; i < nd; ++i) dims[static_cast<size_t>(i)] = hd[static_cast<size_t>(i)] = nd - 1 - i;
      EXPECT_EQ(flame_permute(tb, dims.data(), nd, r.t.out()), FLAME_OK) << flame_last_error_message();
      r.h = hb.permute(hd).contiguous();
      break;
    case Lay::FLIPPED:
      for (int i = 0; i < nd; ++i) dims[static_cast<size_t>(i)] = hd[static_cast<size_t>(i)] = i;
      EXPECT_EQ(flame_flip(tb, dims.data(), nd, r.t.out()), FLAME_OK) << flame_last_error_message();
      r.h = hb.flip(hd).contiguous();
      break;
  }
  return r;
}

const char* lay_name(Lay l) { return l == Lay::CONTIG ? "contiguous" : l == Lay::REVERSED ? "dims reversed" : "flipped"; }

using RedCall = std::function<flame_status_t(flame_tensor_t, const int32_t*, int32_t, int32_t, flame_tensor_t*)>;

struct RedOp {
  std::string name;
  RedCall call;
  RedFn ref, scale;
  bool ints;          // integer / bool inputs (result dtype: i64 for sums, the input's for max/min)
  bool sum_like;      // integer inputs give i64
  Domain dom;
  double rtol_mult;   // multiplies the dtype's rtol
};

Domain dom_of(double lo, double hi, int64_t ilo = -20, int64_t ihi = 20) {
  Domain d;
  d.lo = lo; d.hi = hi; d.ilo = ilo; d.ihi = ihi;
  return d;
}

const std::vector<RedOp>& red_ops() {
  static const std::vector<RedOp> ops = [] {
    std::vector<RedOp> o;
    auto mean_abs = [](const std::vector<double>& v) { return v.empty() ? 0.0 : r_abs_sum(v) / double(v.size()); };
    auto sq_sum = [](const std::vector<double>& v) {
      double s = 0;
      for (double x : v) s += x * x;
      return s;
    };
    o.push_back({"sum", flame_sum, r_sum, r_abs_sum, true, true, dom_of(-3, 3), 1});
    o.push_back({"mean", flame_mean, r_mean, mean_abs, false, false, dom_of(-3, 3), 1});
    o.push_back({"prod", flame_prod, r_prod, nullptr, false, false, dom_of(0.85, 1.15), 5});
    o.push_back({"max", flame_max, r_max, nullptr, true, false, dom_of(-3, 3), 1});
    o.push_back({"min", flame_min, r_min, nullptr, true, false, dom_of(-3, 3), 1});
    for (double c : {0.0, 1.0}) {
      const std::string cs = c == 0 ? "0" : "1";
      o.push_back({"var_correction" + cs,
                   [c](flame_tensor_t t, const int32_t* d, int32_t n, int32_t k, flame_tensor_t* out) {
                     return flame_var(t, d, n, c, k, out);
                   },
                   [c](const std::vector<double>& v) { return r_var(v, c); },
                   [sq_sum](const std::vector<double>& v) { return 4 * sq_sum(v) / double(v.size()); }, false, false,
                   dom_of(-1, 3), 5});
      o.push_back({"std_correction" + cs,
                   [c](flame_tensor_t t, const int32_t* d, int32_t n, int32_t k, flame_tensor_t* out) {
                     return flame_std(t, d, n, c, k, out);
                   },
                   [c](const std::vector<double>& v) { return std::sqrt(r_var(v, c)); },
                   [sq_sum](const std::vector<double>& v) { return 4 * std::sqrt(sq_sum(v) / double(v.size())); }, false,
                   false, dom_of(-1, 3), 5});
    }
    for (double p : {1.0, 2.0, double(INFINITY)}) {
      const std::string ps = std::isinf(p) ? "inf" : p == 1 ? "1" : "2";
      o.push_back({"norm_p" + ps,
                   [p](flame_tensor_t t, const int32_t* d, int32_t n, int32_t k, flame_tensor_t* out) {
                     return flame_norm(t, p, d, n, k, out);
                   },
                   [p](const std::vector<double>& v) { return r_norm(v, p); },
                   [p](const std::vector<double>& v) { return r_norm(v, p); }, false, false, dom_of(-3, 3), 1});
    }
    o.push_back({"logsumexp", flame_logsumexp, r_lse, [](const std::vector<double>& v) { return r_lse(v) + 1; }, false,
                 false, dom_of(-3, 3), 1});
    return o;
  }();
  return ops;
}

struct DimCase {
  std::vector<int> dims;  // empty: all (passed as NULL, 0)
  bool explicit_all;      // pass every dim explicitly instead of NULL
};
const DimCase kDimCases[] = {
    {{}, false}, {{0, 1, 2}, true}, {{0}, false}, {{1}, false}, {{2}, false},
    {{-1}, false}, {{0, 2}, false}, {{-1, -3}, false}, {{1, 2}, false}, {{2, 0}, false},
};

std::string dims_label(const DimCase& c) {
  if (c.dims.empty()) return "all (NULL)";
  std::string s = "{";
  for (size_t i = 0; i < c.dims.size(); ++i) s += (i ? "," : "") + std::to_string(c.dims[i]);
  return s + "}";
}

class Reduce : public GpuTest, public ::testing::WithParamInterface<int> {};

TEST_P(Reduce, Forward) {
  const RedOp& op = red_ops()[static_cast<size_t>(GetParam())];
  SCOPED_TRACE("op " + op.name);
  HREF_RNG(rng);
  const Shape shape = {5, 6, 7};
  for (flame_dtype_t d : kAllDtypes) {
    if (!is_float(d) && !op.ints) continue;
    if (d == FLAME_DTYPE_BOOL && !op.sum_like) continue;
    SCOPED_TRACE(std::string("dtype ") + dname(d));
    const flame_dtype_t od = (!is_float(d) && op.sum_like) ? FLAME_DTYPE_I64 : d;
    const double rtol = tol_for(od).rtol * op.rtol_mult, atol = tol_for(od).atol;
    for (Lay lay : {Lay::CONTIG, Lay::REVERSED}) {
      Dev x = make_dev(ctx, rng, shape, d, op.dom, lay);
      ASSERT_NE(x.t.h, nullptr);
      for (const DimCase& c : kDimCases) {
        for (int keep : {0, 1}) {
          SCOPED_TRACE(std::string(lay_name(lay)) + ", dims " + dims_label(c) + ", keepdim " + std::to_string(keep));
          std::vector<int32_t> dims(c.dims.begin(), c.dims.end());
          T out;
          flame_status_t st = c.dims.empty() ? op.call(x.t, nullptr, 0, keep, out.out())
                                             : op.call(x.t, dims.data(), static_cast<int32_t>(dims.size()), keep, out.out());
          ASSERT_EQ(st, FLAME_OK) << flame_status_string(st) << ": " << flame_last_error_message();
          Expect e = reduce_ref(x.h, c.dims, keep != 0, od, op.ref, op.scale);
          EXPECT_TRUE(close_scaled(out, e, rtol, atol, is_float(d) ? acc_eps(d) : 0.0));
        }
      }
    }
    // long rows and long columns (one block per output vs one lane per output; reduce_flat's dense
    // rows, whole tensors of reduce_flat in BigSums and AllReductionsGiveZeroDim); sums over the rows of
    // dense [rows, columns] blocks in 16-byte vectors (reduce_tall): two passes over row chunks, one
    // pass over 32 column slices, a partly filled last slice
    for (const auto& sc : std::vector<std::pair<Shape, int>>{
             {{3, 5000}, 1}, {{5000, 3}, 0}, {{2, 70000}, -1}, {{6000, 48}, 0}, {{40, 4096}, 0}, {{300, 1032}, 0},
             {{300, 1032}, 1}, {{400, 5001}, -1}, {{3, 100003}, -1}}) {  // dense rows of reduce_flat (misaligned rows)
      SCOPED_TRACE("shape " + to_string(sc.first) + " dim " + std::to_string(sc.second));
      Dev x = make_dev(ctx, rng, sc.first, d, op.dom, Lay::CONTIG);
      const int32_t dim = sc.second;
      T out;
      FLAME_ASSERT_OK(op.call(x.t, &dim, 1, 0, out.out()));
      if (op.name == "prod") continue;  // products of thousands of factors under/overflow
      Expect e = reduce_ref(x.h, {sc.second}, false, od, op.ref, op.scale);
      EXPECT_TRUE(close_scaled(out, e, rtol, atol, is_float(d) ? acc_eps(d) : 0.0));
    }
    {  // the whole of a tensor of more than 8192 elements, odd length (reduce_flat's grid-spaced tiles)
      SCOPED_TRACE("all of [7, 3001]");
      Dev x = make_dev(ctx, rng, {7, 3001}, d, op.dom, Lay::CONTIG);
      T out;
      FLAME_ASSERT_OK(op.call(x.t, nullptr, 0, 0, out.out()));
      if (op.name != "prod") {
        Expect e = reduce_ref(x.h, {}, false, od, op.ref, op.scale);
        EXPECT_TRUE(close_scaled(out, e, rtol, atol, is_float(d) ? acc_eps(d) : 0.0));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, Reduce, ::testing::Range(0, static_cast<int>(red_ops().size())),
                         [](const ::testing::TestParamInfo<int>& i) { return red_ops()[static_cast<size_t>(i.param)].name; });

// ---------------------------------------------------------------------------------------------

class Reductions : public GpuTest {};

TEST_F(Reductions, IntegerAndBoolSumsGiveI64) {
  HREF_RNG(rng);
  for (flame_dtype_t d : {FLAME_DTYPE_I32, FLAME_DTYPE_I64, FLAME_DTYPE_U8, FLAME_DTYPE_BOOL}) {
    SCOPED_TRACE(dname(d));
    Dev x = make_dev(ctx, rng, {33, 65}, d, dom_of(0, 0, -1000000, 1000000), Lay::REVERSED);
    T s, sa, c;
    const int32_t dim = 1;
    FLAME_ASSERT_OK(flame_sum(x.t, &dim, 1, 0, s.out()));
    EXPECT_EQ(dtype_of(s), FLAME_DTYPE_I64);
    EXPECT_TRUE(matches(s, reduce_ref(x.h, {1}, false, FLAME_DTYPE_I64, r_sum, nullptr).value));
    FLAME_ASSERT_OK(flame_sum_all(x.t, sa.out()));
    EXPECT_EQ(dtype_of(sa), FLAME_DTYPE_I64);
    EXPECT_EQ(shape_of(sa), Shape{});
    EXPECT_EQ(item(sa), r_sum(x.h.values()));
    T mx, mn;
    if (d != FLAME_DTYPE_BOOL) {
      FLAME_ASSERT_OK(flame_max_all(x.t, mx.out()));
      FLAME_ASSERT_OK(flame_min_all(x.t, mn.out()));
      EXPECT_EQ(dtype_of(mx), d);
      EXPECT_EQ(item(mx), r_max(x.h.values()));
      EXPECT_EQ(item(mn), r_min(x.h.values()));
    }
  }
  // i64 sums stay exact beyond 2^53's neighbourhood of doubles
  const int64_t v[] = {(1LL << 60) + 1, 3, -5, (1LL << 40)};
  const int64_t s4[] = {4};
  T x, s;
  FLAME_ASSERT_OK(flame_from_host(ctx, v, sizeof(v), s4, 1, FLAME_DTYPE_I64, x.out()));
  FLAME_ASSERT_OK(flame_sum_all(x, s.out()));
  int64_t got = 0;
  FLAME_ASSERT_OK(flame_to_host(s, &got, sizeof(got)));
  EXPECT_EQ(got, (1LL << 60) + 1 + 3 - 5 + (1LL << 40));
}

TEST_F(Reductions, AllReductionsGiveZeroDim) {
  HREF_RNG(rng);
  for (flame_dtype_t d : kFloatDtypes) {
    SCOPED_TRACE(dname(d));
    Dev x = make_dev(ctx, rng, {7, 9, 3}, d, dom_of(-3, 3), Lay::FLIPPED);
    const std::vector<double> v = x.h.values();
    T s, mx, mn;
    FLAME_ASSERT_OK(flame_sum_all(x.t, s.out()));
    FLAME_ASSERT_OK(flame_max_all(x.t, mx.out()));
    FLAME_ASSERT_OK(flame_min_all(x.t, mn.out()));
    for (flame_tensor_t t : {s.h, mx.h, mn.h}) {
      EXPECT_EQ(shape_of(t), Shape{});
      EXPECT_EQ(dtype_of(t), d);
    }
    EXPECT_TRUE(close_enough(item(s), round_to(r_sum(v), d), Tol{tol_for(d).rtol, tol_for(d).atol + acc_eps(d) * r_abs_sum(v)}));
    EXPECT_EQ(item(mx), r_max(v));
    EXPECT_EQ(item(mn), r_min(v));
    // a 0-d input
    Dev z = make_dev(ctx, rng, {}, d, dom_of(-3, 3), Lay::CONTIG);
    T zs, zm;
    FLAME_ASSERT_OK(flame_sum_all(z.t, zs.out()));
    FLAME_ASSERT_OK(flame_sum(z.t, nullptr, 0, 0, zm.out()));
    EXPECT_EQ(item(zs), z.h.values()[0]);
    EXPECT_EQ(item(zm), z.h.values()[0]);
  }
}

TEST_F(Reductions, HalfPrecisionAccumulatesInF32) {
  // 4096 values of 1 + 2^-10 in bf16/f16: an accumulator in the 16-bit type would stall.
  for (flame_dtype_t d : {FLAME_DTYPE_F16, FLAME_DTYPE_BF16}) {
    SCOPED_TRACE(dname(d));
    const double v = d == FLAME_DTYPE_F16 ? 0.0999755859375 : 0.10009765625;  // exactly representable
    const int64_t shp[] = {4096};
    T x, s, m;
    FLAME_ASSERT_OK(flame_full(ctx, shp, 1, d, v, x.out()));
    FLAME_ASSERT_OK(flame_sum_all(x, s.out()));
    FLAME_ASSERT_OK(flame_mean(x, nullptr, 0, 0, m.out()));
    EXPECT_NEAR(item(s), 4096 * v, 4096 * v * 4e-3);
    EXPECT_NEAR(item(m), v, v * 4e-3);
  }
}

TEST_F(Reductions, EmptyInputs) {
  const int64_t shp[] = {0, 3};
  for (flame_dtype_t d : {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_F64}) {
    SCOPED_TRACE(dname(d));
    T x;
    FLAME_ASSERT_OK(flame_zeros(ctx, shp, 2, d, x.out()));
    const int32_t d0 = 0, d1 = 1;
    T s, p, m, sa, c;
    FLAME_ASSERT_OK(flame_sum(x, &d0, 1, 0, s.out()));
    EXPECT_TRUE(matches(s, HT({3}, d, 0.0)));
    FLAME_ASSERT_OK(flame_prod(x, &d0, 1, 0, p.out()));
    EXPECT_TRUE(matches(p, HT({3}, d, 1.0)));
    FLAME_ASSERT_OK(flame_mean(x, &d0, 1, 0, m.out()));
    EXPECT_TRUE(matches(m, HT({3}, d, std::nan(""))));
    FLAME_ASSERT_OK(flame_sum_all(x, sa.out()));
    EXPECT_EQ(item(sa), 0.0);
    FLAME_ASSERT_OK(flame_sum(x, &d1, 1, 0, s.out()));  // reducing a non-empty axis of an empty tensor
    EXPECT_EQ(shape_of(s), Shape{0});
    FLAME_ASSERT_OK(flame_cumsum(x, 0, c.out()));
    EXPECT_EQ(shape_of(c), (Shape{0, 3}));
    flame_tensor_t bad;
    HREF_EXPECT_ANY_FAIL(bad, flame_max(x, &d0, 1, 0, &bad));
    HREF_EXPECT_ANY_FAIL(bad, flame_min(x, &d0, 1, 0, &bad));
    HREF_EXPECT_ANY_FAIL(bad, flame_argmax(x, 0, 0, &bad));
    HREF_EXPECT_ANY_FAIL(bad, flame_argmin(x, FLAME_DIM_ALL, 0, &bad));
    HREF_EXPECT_ANY_FAIL(bad, flame_max_all(x, &bad));
    HREF_EXPECT_ANY_FAIL(bad, flame_min_all(x, &bad));
    T ok;
    FLAME_ASSERT_OK(flame_max(x, &d1, 1, 0, ok.out()));  // the reduced axis (3) is not empty
    EXPECT_EQ(shape_of(ok), Shape{0});
  }
}

TEST_F(Reductions, NanPropagates) {
  const float nan = std::nanf("");
  const float v[] = {1, nan, 3, -2, 5, 0};
  const int64_t shp[] = {2, 3};
  T x;
  FLAME_ASSERT_OK(flame_from_host(ctx, v, sizeof(v), shp, 2, FLAME_DTYPE_F32, x.out()));
  const int32_t d1 = 1;
  T mx, mn, s, am, mall;
  FLAME_ASSERT_OK(flame_max(x, &d1, 1, 0, mx.out()));
  EXPECT_TRUE(matches(mx, HT::from_values({2}, FLAME_DTYPE_F32, {std::nan(""), 5})));
  FLAME_ASSERT_OK(flame_min(x, &d1, 1, 0, mn.out()));
  EXPECT_TRUE(matches(mn, HT::from_values({2}, FLAME_DTYPE_F32, {std::nan(""), -2})));
  FLAME_ASSERT_OK(flame_sum(x, &d1, 1, 0, s.out()));
  EXPECT_TRUE(matches(s, HT::from_values({2}, FLAME_DTYPE_F32, {std::nan(""), 3})));
  FLAME_ASSERT_OK(flame_argmax(x, 1, 0, am.out()));
  EXPECT_TRUE(matches(am, HT::from_values({2}, FLAME_DTYPE_I64, {1, 1})));
  FLAME_ASSERT_OK(flame_argmax(x, FLAME_DIM_ALL, 0, am.out()));
  EXPECT_EQ(item(am), 1.0);
  FLAME_ASSERT_OK(flame_max_all(x, mall.out()));
  EXPECT_TRUE(std::isnan(item(mall)));
}

TEST_F(Reductions, ArgmaxArgmin) {
  HREF_RNG(rng);
  Domain ties;
  ties.lo = -3; ties.hi = 3; ties.ilo = -3; ties.ihi = 3; ties.integral = true;  // many ties
  for (flame_dtype_t d : {FLAME_DTYPE_F32, FLAME_DTYPE_F64, FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_I32,
                          FLAME_DTYPE_I64, FLAME_DTYPE_U8}) {
    SCOPED_TRACE(dname(d));
    for (Lay lay : {Lay::CONTIG, Lay::REVERSED, Lay::FLIPPED}) {
      SCOPED_TRACE(lay_name(lay));
      Dev x = make_dev(ctx, rng, {4, 9, 5}, d, ties, lay);
      for (int dim : {0, 1, 2, -1, -3}) {
        for (int keep : {0, 1}) {
          SCOPED_TRACE("dim " + std::to_string(dim) + " keepdim " + std::to_string(keep));
          T amax, amin;
          FLAME_ASSERT_OK(flame_argmax(x.t, dim, keep, amax.out()));
          FLAME_ASSERT_OK(flame_argmin(x.t, dim, keep, amin.out()));
          EXPECT_EQ(dtype_of(amax), FLAME_DTYPE_I64);
          EXPECT_TRUE(matches(amax, reduce_ref(x.h, {dim}, keep != 0, FLAME_DTYPE_I64, r_argmax, nullptr).value));
          EXPECT_TRUE(matches(amin, reduce_ref(x.h, {dim}, keep != 0, FLAME_DTYPE_I64, r_argmin, nullptr).value));
        }
      }
      T amax, amin;
      FLAME_ASSERT_OK(flame_argmax(x.t, FLAME_DIM_ALL, 0, amax.out()));
      FLAME_ASSERT_OK(flame_argmin(x.t, FLAME_DIM_ALL, 0, amin.out()));
      EXPECT_EQ(shape_of(amax), Shape{});
      EXPECT_EQ(dtype_of(amax), FLAME_DTYPE_I64);
      EXPECT_EQ(item(amax), r_argmax(x.h.values())) << "index into the row-major flattening";
      EXPECT_EQ(item(amin), r_argmin(x.h.values()));
    }
  }
  // long rows with the maximum in the tail, and ties across thread boundaries
  for (int64_t n : {4097, 100000}) {
    std::vector<float> v(static_cast<size_t>(n), 1.0f);
    v[static_cast<size_t>(n - 3)] = 2.0f;
    v[static_cast<size_t>(n - 1)] = 2.0f;
    v[static_cast<size_t>(n / 2)] = 0.5f;
    v[static_cast<size_t>(n / 2 + 7)] = 0.5f;
    T x, am, an;
    FLAME_ASSERT_OK(flame_from_host(ctx, v.data(), v.size() * 4, &n, 1, FLAME_DTYPE_F32, x.out()));
    FLAME_ASSERT_OK(flame_argmax(x, 0, 0, am.out()));
    FLAME_ASSERT_OK(flame_argmin(x, FLAME_DIM_ALL, 0, an.out()));
    EXPECT_EQ(item(am), double(n - 3));
    EXPECT_EQ(item(an), double(n / 2));
  }
  Dev x = make_dev(ctx, rng, {3, 4}, FLAME_DTYPE_F32, ties, Lay::CONTIG);
  flame_tensor_t bad;
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_argmax(x.t, 2, 0, &bad));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_argmin(x.t, -3, 0, &bad));
}

TEST_F(Reductions, Cumsum) {
  HREF_RNG(rng);
  auto cumsum_ref = [](const HT& x, int dim, flame_dtype_t out, std::vector<double>* scale) {
    const int d = norm_dim(dim, x.shape.size());
    HT r(x.shape, out);
    scale->assign(static_cast<size_t>(x.numel()), 0.0);
    const Shape st = contiguous_strides(x.shape);
    std::vector<double> acc(static_cast<size_t>(x.numel())), mag(static_cast<size_t>(x.numel()));
    size_t k = 0;
    for_each_index(x.shape, [&](const Shape& i) {
      double prev = 0, pmag = 0;
      if (i[static_cast<size_t>(d)] > 0) {
        prev = acc[k - static_cast<size_t>(st[static_cast<size_t>(d)])];
        pmag = mag[k - static_cast<size_t>(st[static_cast<size_t>(d)])];
      }
      acc[k] = prev + x.at(i);
      mag[k] = pmag + std::fabs(x.at(i));
      (*r.data)[k] = round_to(acc[k], out);
      (*scale)[k] = mag[k];
      ++k;
    });
    return r;
  };
  struct C { Shape shape; int dim; };
  const C cases[] = {{{3, 5000}, 1}, {{3, 5000}, -1}, {{5000, 3}, 0}, {{4, 7, 33}, 1}, {{4097}, 0}, {{1}, 0},
                     {{2, 3, 4}, -3}, {{20000}, 0}};
  for (flame_dtype_t d : kAllDtypes) {
    SCOPED_TRACE(dname(d));
    const flame_dtype_t od = is_float(d) ? d : FLAME_DTYPE_I64;
    for (const C& c : cases) {
      for (Lay lay : {Lay::CONTIG, Lay::REVERSED}) {
        SCOPED_TRACE("shape " + to_string(c.shape) + " dim " + std::to_string(c.dim) + " " + lay_name(lay));
        Dev x = make_dev(ctx, rng, c.shape, d, dom_of(-3, 3, -1000, 1000), lay);
        T out;
        FLAME_ASSERT_OK(flame_cumsum(x.t, c.dim, out.out()));
        EXPECT_EQ(dtype_of(out), od);
        Expect e;
        e.value = cumsum_ref(x.h, c.dim, od, &e.scale);
        EXPECT_TRUE(close_scaled(out, e, tol_for(od).rtol, tol_for(od).atol, is_float(d) ? acc_eps(d) : 0.0));
      }
    }
  }
  Dev x = make_dev(ctx, rng, {3, 4}, FLAME_DTYPE_F32, Domain(), Lay::CONTIG);
  flame_tensor_t bad;
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_cumsum(x.t, 2, &bad));
  FLAME_EXPECT_STATUS(flame_cumsum(x.t, 0, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
}

TEST_F(Reductions, ArgumentErrors) {
  HREF_RNG(rng);
  Dev x = make_dev(ctx, rng, {3, 4, 5}, FLAME_DTYPE_F32, Domain(), Lay::CONTIG);
  flame_tensor_t bad;
  const int32_t oob[] = {3}, oobn[] = {-4}, dup[] = {1, 1}, dupn[] = {2, -1};
  for (const RedOp& op : red_ops()) {
    SCOPED_TRACE(op.name);
    HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, op.call(x.t, oob, 1, 0, &bad));
    HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, op.call(x.t, oobn, 1, 0, &bad));
    HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, op.call(x.t, dup, 2, 0, &bad));
    HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, op.call(x.t, dupn, 2, 0, &bad));
    HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, op.call(x.t, nullptr, 2, 0, &bad));
    HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, op.call(nullptr, nullptr, 0, 0, &bad));
    FLAME_EXPECT_STATUS(op.call(x.t, nullptr, 0, 0, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  }
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_sum_all(nullptr, &bad));
  FLAME_EXPECT_STATUS(flame_sum_all(x.t, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_argmax(x.t, 3, 0, &bad));
}

// ---------------------------------------------------------------------------------------------
// Big reductions (2^24 elements).

TEST_F(Reductions, BigSums) {
  HREF_RNG(rng);
  const int64_t n = int64_t(1) << 24;
  {
    // f64 multiples of 1/8: every partial sum is exact, so the result must be exact.
    std::vector<double> v(static_cast<size_t>(n));
    std::uniform_int_distribution<int> k(-80, 80);
    long double s = 0;
    for (double& x : v) { x = k(rng) / 8.0; s += x; }
    T x, sa, rows, cols;
    FLAME_ASSERT_OK(flame_from_host(ctx, v.data(), v.size() * 8, &n, 1, FLAME_DTYPE_F64, x.out()));
    FLAME_ASSERT_OK(flame_sum_all(x, sa.out()));
    EXPECT_EQ(item(sa), static_cast<double>(s));
    const int64_t shp[] = {4096, 4096};
    T m;
    FLAME_ASSERT_OK(flame_reshape(x, shp, 2, m.out()));
    const int32_t d0 = 0, d1 = 1;
    FLAME_ASSERT_OK(flame_sum(m, &d1, 1, 0, rows.out()));
    FLAME_ASSERT_OK(flame_sum(m, &d0, 1, 0, cols.out()));
    HT hr = download(rows), hc = download(cols);
    for (int64_t i = 0; i < 4096; i += 511) {
      double r = 0, c = 0;
      for (int64_t j = 0; j < 4096; ++j) { r += v[static_cast<size_t>(i * 4096 + j)]; c += v[static_cast<size_t>(j * 4096 + i)]; }
      EXPECT_EQ((*hr.data)[static_cast<size_t>(i)], r) << "row " << i;
      EXPECT_EQ((*hc.data)[static_cast<size_t>(i)], c) << "column " << i;
    }
  }
  {
    // u8: the sum (up to 255 * 2^24) needs the i64 accumulator; max and argmax over 2^24.
    std::vector<uint8_t> v(static_cast<size_t>(n));
    for (uint8_t& x : v) x = static_cast<uint8_t>(rng() % 200);
    const int64_t where = n - 12345;
    v[static_cast<size_t>(where)] = 250;  // the one maximum, far into the tail
    int64_t s = 0;
    for (uint8_t x : v) s += x;
    T x, sa, mx, am;
    FLAME_ASSERT_OK(flame_from_host(ctx, v.data(), v.size(), &n, 1, FLAME_DTYPE_U8, x.out()));
    FLAME_ASSERT_OK(flame_sum_all(x, sa.out()));
    FLAME_ASSERT_OK(flame_max_all(x, mx.out()));
    FLAME_ASSERT_OK(flame_argmax(x, FLAME_DIM_ALL, 0, am.out()));
    int64_t got = -1;
    FLAME_ASSERT_OK(flame_to_host(sa, &got, 8));
    EXPECT_EQ(got, s);
    EXPECT_EQ(item(mx), 250.0);
    EXPECT_EQ(item(am), double(where));
  }
  {
    // f32 / bf16 / f16 uniform in [0, 1): relative tolerance
    std::vector<double> v(static_cast<size_t>(n));
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (flame_dtype_t d : {FLAME_DTYPE_F32, FLAME_DTYPE_BF16, FLAME_DTYPE_F16}) {
      SCOPED_TRACE(dname(d));
      double s = 0;
      for (double& x : v) { x = round_to(u(rng), d); s += x; }
      const std::vector<unsigned char> bytes = encode(v, d);
      T x, sa, mean;
      FLAME_ASSERT_OK(flame_from_host(ctx, bytes.data(), bytes.size(), &n, 1, d, x.out()));
      FLAME_ASSERT_OK(flame_mean(x, nullptr, 0, 0, mean.out()));
      EXPECT_NEAR(item(mean), s / double(n), s / double(n) * (d == FLAME_DTYPE_F32 ? 1e-5 : 1e-2));
      if (d != FLAME_DTYPE_F16) {  // the sum (~8e6) is beyond f16's range
        FLAME_ASSERT_OK(flame_sum_all(x, sa.out()));
        EXPECT_NEAR(item(sa), s, s * (d == FLAME_DTYPE_F32 ? 1e-5 : 1e-2));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// More than 2^31 elements: 64-bit indexing in elementwise kernels, reductions and copies.

class ReductionsLarge : public GpuTest {};

TEST_F(ReductionsLarge, MoreThan2Pow31Elements) {
  const int64_t n = (int64_t(1) << 31) + 7;
  T ones, three, two;
  FLAME_ASSERT_OK(flame_ones(ctx, &n, 1, FLAME_DTYPE_U8, ones.out()));
  FLAME_ASSERT_OK(flame_add_scalar(ones, 2.0, three.out()));
  auto check_slice = [&](flame_tensor_t t, int64_t start, int64_t len, uint8_t want) {
    SCOPED_TRACE("elements " + std::to_string(start) + ".." + std::to_string(start + len - 1));
    T s;
    FLAME_ASSERT_OK(flame_narrow(t, 0, start, len, s.out()));
    std::vector<uint8_t> h(static_cast<size_t>(len), 0);
    FLAME_ASSERT_OK(flame_to_host(s, h.data(), h.size()));
    for (int64_t i = 0; i < len; ++i) EXPECT_EQ(h[static_cast<size_t>(i)], want) << "element " << start + i;
  };
  check_slice(three, 0, 16, 3);
  check_slice(three, (int64_t(1) << 31) - 9, 16, 3);  // across the 2^31 boundary
  check_slice(three, n - 16, 16, 3);
  T s3;
  FLAME_ASSERT_OK(flame_sum_all(three, s3.out()));
  EXPECT_EQ(dtype_of(s3), FLAME_DTYPE_I64);
  int64_t got = 0;
  FLAME_ASSERT_OK(flame_to_host(s3, &got, sizeof(got)));
  EXPECT_EQ(got, 3 * n);
  three = T();
  FLAME_ASSERT_OK(flame_add(ones, ones, two.out()));
  check_slice(two, n - 16, 16, 2);
  check_slice(two, (int64_t(1) << 31) - 3, 6, 2);
  T s2, m2;
  FLAME_ASSERT_OK(flame_sum_all(two, s2.out()));
  FLAME_ASSERT_OK(flame_to_host(s2, &got, sizeof(got)));
  EXPECT_EQ(got, 2 * n);
  FLAME_ASSERT_OK(flame_max_all(two, m2.out()));
  EXPECT_EQ(item(m2), 2.0);
  // a strided view over the whole range (step 2): elementwise with 64-bit strided indexing
  T odd, odd3, so;
  FLAME_ASSERT_OK(flame_slice(two, 0, 1, n, 2, odd.out()));
  FLAME_ASSERT_OK(flame_add_scalar(odd, 1.0, odd3.out()));
  FLAME_ASSERT_OK(flame_sum_all(odd3, so.out()));
  FLAME_ASSERT_OK(flame_to_host(so, &got, sizeof(got)));
  EXPECT_EQ(got, 3 * (n / 2));  // odd indices 1, 3, ..., n - 2
}

}  // namespace

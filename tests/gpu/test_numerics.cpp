// Numerical hygiene (issue 12): NaN and infinities propagate as in PyTorch, nothing clamps them
// silently. References are computed on the host in double with PyTorch's definitions:
//  - softmax / log_softmax: m = max of the row (NaN if any element is NaN), exp(x - m) / sum, so a
//    NaN or +inf anywhere, or a row of only -inf, gives a row of NaN; -inf elements give 0 (-inf);
//  - sum, mean: IEEE sums (inf + -inf = NaN); max/min (amax/amin): NaN wins; logsumexp: shift by
//    the max unless it is infinite (torch.logsumexp), so [inf, 1] -> inf and [-inf, -inf] -> -inf;
//  - activations keep NaN (relu(NaN) = NaN) and map infinities as their formulas do;
//  - maximum/minimum: a NaN in either argument wins; clamp(NaN) = NaN;
//  - integer division: FLAME's only division is true division (flame_div, flame_div_scalar give
//    f32 for integers, as torch.div), so an integer divided by 0 is +-inf and 0 / 0 is NaN, never
//    an integer garbage value.
// Softmax runs through each of its kernels: row in registers (short rows), the streaming row kernel
// (D = 100001), the column kernel (dim 0 of [7, 4096]) and the permuted path (dim 0 of [100, 8]).
// Out-of-range indices (gather, index_select, embedding, ...) are errors reported at the next
// synchronisation: tests/gpu/test_indexing.cpp.
#include <cmath>
#include <functional>
#include <string>
#include <vector>
#include "host_ref.h"

using namespace href;

namespace {

const double kNan = std::nan(""), kInf = INFINITY;

class Numerics : public GpuTest {};

// PyTorch's softmax / log_softmax of one row, in double.
std::vector<double> softmax_row(const std::vector<double>& x, bool log) {
  double m = -kInf;
  bool nan = false;
  for (double v : x) {
    if (std::isnan(v)) nan = true;
    else m = std::max(m, v);
  }
  if (nan) m = kNan;
  double s = 0;
  for (double v : x) s += std::exp(v - m);
  std::vector<double> y;
  for (double v : x) y.push_back(log ? v - m - std::log(s) : std::exp(v - m) / s);
  return y;
}

// The reference along `dim` of a 2-D tensor.
HT softmax_ref(const HT& h, int dim, bool log) {
  HT r(h.shape, h.dtype);
  const int64_t R = h.shape[0], C = h.shape[1];
  if (dim == 1) {
    for (int64_t i = 0; i < R; ++i) {
      std::vector<double> row;
      for (int64_t j = 0; j < C; ++j) row.push_back(h.at({i, j}));
      std::vector<double> y = softmax_row(row, log);
      for (int64_t j = 0; j < C; ++j) r.at({i, j}) = round_to(y[size_t(j)], h.dtype);
    }
  } else {
    for (int64_t j = 0; j < C; ++j) {
      std::vector<double> col;
      for (int64_t i = 0; i < R; ++i) col.push_back(h.at({i, j}));
      std::vector<double> y = softmax_row(col, log);
      for (int64_t i = 0; i < R; ++i) r.at({i, j}) = round_to(y[size_t(i)], h.dtype);
    }
  }
  return r;
}

// Rows with special values; each is 7 long.
const std::vector<std::vector<double>> kSpecialRows = {
    {1, kNan, 3, -2, 5, 0, 1},                  // NaN: all NaN
    {kInf, 1, 2, 3, 4, 5, 6},                   // +inf: all NaN (exp(inf - inf))
    {-kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf},  // only -inf: all NaN
    {-kInf, 0, 1, -kInf, 2, 3, -kInf},          // -inf elements: 0, the rest normal
    {-kInf, -kInf, -kInf, -kInf, -kInf, -kInf, 5},      // one finite: one-hot
    {1e4, -1e4, 0, 2, -3, 1e4, 7},              // large finite: no overflow, no NaN
};

void check_softmax(flame_ctx_t ctx, const HT& h, int dim, const char* what) {
  for (bool log : {false, true}) {
    SCOPED_TRACE(std::string(what) + (log ? " log_softmax" : " softmax"));
    T x = upload(ctx, h), y;
    FLAME_ASSERT_OK(log ? flame_log_softmax(x, dim, y.out()) : flame_softmax(x, dim, y.out()));
    EXPECT_TRUE(matches(y, softmax_ref(h, dim, log)));
  }
}

}  // namespace

TEST_F(Numerics, SoftmaxPropagatesNanAndInfinityOnEveryKernel) {
  for (flame_dtype_t d : kFloatDtypes) {
    SCOPED_TRACE(dname(d));
    // registers: [6, 7] along dim 1
    HT rows(Shape{6, 7}, d);
    for (int64_t i = 0; i < 6; ++i)
      for (int64_t j = 0; j < 7; ++j) rows.at({i, j}) = round_to(kSpecialRows[size_t(i)][size_t(j)], d);
    check_softmax(ctx, rows, 1, "register rows");

    // streaming rows: D = 100001 (odd: one element per load, 1024 threads a row, so thread 0 reads
    // only even positions). Row 0: -inf at even positions except a NaN at 0, finite odd positions:
    // the thread that holds the NaN sees no finite value, and the NaN must still reach the whole row.
    // Row 1: one +inf among finite values. Row 2: finite with -inf at even positions.
    const int64_t D = 100001;
    HT longr(Shape{3, D}, d);
    for (int64_t j = 0; j < D; ++j) {
      const double f = round_to(3.0 * std::sin(double(j)), d);
      longr.at({0, j}) = j == 0 ? kNan : (j % 2 == 0 ? -kInf : f);
      longr.at({1, j}) = j == 54321 ? kInf : f;
      longr.at({2, j}) = j % 2 == 0 ? -kInf : f;
    }
    check_softmax(ctx, longr, 1, "streaming rows");

    // columns: dim 0 of [7, 4096]; column j holds special row j % 6
    HT cols(Shape{7, 4096}, d);
    for (int64_t i = 0; i < 7; ++i)
      for (int64_t j = 0; j < 4096; ++j) cols.at({i, j}) = round_to(kSpecialRows[size_t(j % 6)][size_t(i)], d);
    check_softmax(ctx, cols, 0, "columns");

    // permuted: dim 0 of [100, 8] (few long columns): NaN, +inf, all -inf, some -inf, finite
    HT perm(Shape{100, 8}, d);
    for (int64_t i = 0; i < 100; ++i)
      for (int64_t j = 0; j < 8; ++j) {
        double f = round_to(std::cos(double(i * 8 + j)), d);
        double v = f;
        if (j == 0 && i == 37) v = kNan;
        if (j == 1 && i == 99) v = kInf;
        if (j == 2) v = -kInf;
        if (j == 3 && i % 3 == 0) v = -kInf;
        perm.at({i, j}) = v;
      }
    check_softmax(ctx, perm, 0, "permuted columns");
  }
}

TEST_F(Numerics, ReductionsPropagateNanAndInfinity) {
  // Each row: [NaN among finite], [inf and -inf], [inf among finite], [only -inf], [finite], [NaN, inf, -inf]
  const std::vector<std::vector<double>> rows = {
      {1, kNan, 3, -2, 5}, {kInf, -kInf, 1, 2, 3}, {kInf, 1, 2, 3, 4}, {-kInf, -kInf, -kInf, -kInf, -kInf},
      {1.5, -2.5, 3, 0.25, -1}, {kNan, kInf, -kInf, 0, 1}};
  const int32_t d1 = 1;
  for (flame_dtype_t d : kFloatDtypes) {
    SCOPED_TRACE(dname(d));
    HT h(Shape{6, 5}, d);
    for (int64_t i = 0; i < 6; ++i)
      for (int64_t j = 0; j < 5; ++j) h.at({i, j}) = round_to(rows[size_t(i)][size_t(j)], d);
    T x = upload(ctx, h);
    const flame_dtype_t acc = d;  // f16/bf16 accumulate in f32 but return their own dtype (as torch.sum)
    HT want_sum(Shape{6}, acc), want_mean(Shape{6}, acc), want_max(Shape{6}, d), want_min(Shape{6}, d),
        want_lse(Shape{6}, d);
    for (int64_t i = 0; i < 6; ++i) {
      double s = 0, mx = -kInf, mn = kInf;
      bool nan = false;
      for (int64_t j = 0; j < 5; ++j) {
        double v = h.at({i, j});
        s += v;
        nan = nan || std::isnan(v);
        mx = std::max(mx, v);
        mn = std::min(mn, v);
      }
      if (nan) mx = mn = kNan;
      const double shift = std::isinf(mx) ? 0.0 : mx;  // torch.logsumexp
      double e = 0;
      for (int64_t j = 0; j < 5; ++j) e += std::exp(h.at({i, j}) - shift);
      want_sum.at({i}) = round_to(s, acc);
      want_mean.at({i}) = round_to(s / 5, acc);
      want_max.at({i}) = mx;
      want_min.at({i}) = mn;
      want_lse.at({i}) = round_to(std::log(e) + shift, d);
    }
    T s, m, mx, mn, lse, all;
    FLAME_ASSERT_OK(flame_sum(x, &d1, 1, 0, s.out()));
    EXPECT_TRUE(matches(s, want_sum)) << "sum";
    FLAME_ASSERT_OK(flame_mean(x, &d1, 1, 0, m.out()));
    EXPECT_TRUE(matches(m, want_mean)) << "mean";
    FLAME_ASSERT_OK(flame_max(x, &d1, 1, 0, mx.out()));
    EXPECT_TRUE(matches(mx, want_max)) << "max (amax)";
    FLAME_ASSERT_OK(flame_min(x, &d1, 1, 0, mn.out()));
    EXPECT_TRUE(matches(mn, want_min)) << "min (amin)";
    FLAME_ASSERT_OK(flame_logsumexp(x, &d1, 1, 0, lse.out()));
    EXPECT_TRUE(matches(lse, want_lse)) << "logsumexp";
    FLAME_ASSERT_OK(flame_max_all(x, all.out()));
    EXPECT_TRUE(std::isnan(item(all))) << "max_all";
    FLAME_ASSERT_OK(flame_min_all(x, all.out()));
    EXPECT_TRUE(std::isnan(item(all))) << "min_all";
    FLAME_ASSERT_OK(flame_sum_all(x, all.out()));
    EXPECT_TRUE(std::isnan(item(all))) << "sum_all";
    // rows 1..4 only (no NaN): max_all is +inf, min_all -inf, sum_all NaN (inf + -inf)
    T part, pmax, pmin, psum;
    FLAME_ASSERT_OK(flame_narrow(x, 0, 1, 4, part.out()));
    FLAME_ASSERT_OK(flame_max_all(part, pmax.out()));
    EXPECT_EQ(item(pmax), kInf);
    FLAME_ASSERT_OK(flame_min_all(part, pmin.out()));
    EXPECT_EQ(item(pmin), -kInf);
    FLAME_ASSERT_OK(flame_sum_all(part, psum.out()));
    EXPECT_TRUE(std::isnan(item(psum)));
  }
}

TEST_F(Numerics, ActivationsAndBinaryOpsKeepNan) {
  const std::vector<double> v = {kNan, kInf, -kInf, 1.5, -0.0, 0.0, -2.5};
  using Op = std::function<flame_status_t(flame_tensor_t, flame_tensor_t*)>;
  struct Case { const char* name; Op op; std::function<double(double)> ref; };
  const std::vector<Case> cases = {
      {"relu", [](flame_tensor_t x, flame_tensor_t* o) { return flame_relu(x, o); },
       [](double t) { return std::isnan(t) ? t : (t > 0 ? t : 0.0); }},
      {"leaky_relu", [](flame_tensor_t x, flame_tensor_t* o) { return flame_leaky_relu(x, 0.125, o); },
       [](double t) { return t > 0 ? t : 0.125 * t; }},
      {"elu", [](flame_tensor_t x, flame_tensor_t* o) { return flame_elu(x, 1.0, o); },
       [](double t) { return t > 0 ? t : std::expm1(t); }},
      {"sigmoid", [](flame_tensor_t x, flame_tensor_t* o) { return flame_sigmoid(x, o); },
       [](double t) { return 1.0 / (1.0 + std::exp(-t)); }},
      {"tanh", [](flame_tensor_t x, flame_tensor_t* o) { return flame_tanh(x, o); }, [](double t) { return std::tanh(t); }},
      {"softplus", [](flame_tensor_t x, flame_tensor_t* o) { return flame_softplus(x, 1.0, 20.0, o); },
       [](double t) { return t > 20 ? t : std::log1p(std::exp(t)); }},
      {"sqrt", [](flame_tensor_t x, flame_tensor_t* o) { return flame_sqrt(x, o); }, [](double t) { return std::sqrt(t); }},
      {"log", [](flame_tensor_t x, flame_tensor_t* o) { return flame_log(x, o); }, [](double t) { return std::log(t); }},
      {"square", [](flame_tensor_t x, flame_tensor_t* o) { return flame_square(x, o); }, [](double t) { return t * t; }},
      {"floor", [](flame_tensor_t x, flame_tensor_t* o) { return flame_floor(x, o); }, [](double t) { return std::floor(t); }},
      {"neg", [](flame_tensor_t x, flame_tensor_t* o) { return flame_neg(x, o); }, [](double t) { return -t; }},
  };
  // NaN in only the first argument of gelu/silu: their infinite limits differ between formulas.
  const std::vector<Case> nan_only = {
      {"gelu", [](flame_tensor_t x, flame_tensor_t* o) { return flame_gelu(x, 0, o); }, nullptr},
      {"gelu tanh", [](flame_tensor_t x, flame_tensor_t* o) { return flame_gelu(x, 1, o); }, nullptr},
      {"silu", [](flame_tensor_t x, flame_tensor_t* o) { return flame_silu(x, o); }, nullptr},
  };
  for (flame_dtype_t d : kFloatDtypes) {
    SCOPED_TRACE(dname(d));
    HT h = HT::from_values({7}, d, v);
    T x = upload(ctx, h);
    for (const Case& c : cases) {
      T o;
      FLAME_ASSERT_OK(c.op(x, o.out()));
      EXPECT_TRUE(matches(o, map1(h, d, c.ref))) << c.name;
    }
    for (const Case& c : nan_only) {
      T o;
      FLAME_ASSERT_OK(c.op(x, o.out()));
      EXPECT_TRUE(std::isnan(download(o).values()[0])) << c.name << "(NaN)";
    }
    // maximum / minimum: NaN in either argument wins, also broadcast
    HT other = HT::from_values({7}, d, {0, kNan, 1, kNan, 0, -kInf, kInf});
    T y = upload(ctx, other), o;
    auto pmax = [](double a, double b) { return std::isnan(a) || std::isnan(b) ? kNan : std::max(a, b); };
    auto pmin = [](double a, double b) { return std::isnan(a) || std::isnan(b) ? kNan : std::min(a, b); };
    FLAME_ASSERT_OK(flame_maximum(x, y, o.out()));
    EXPECT_TRUE(matches(o, map2(h, other, d, pmax))) << "maximum";
    FLAME_ASSERT_OK(flame_maximum(y, x, o.out()));
    EXPECT_TRUE(matches(o, map2(other, h, d, pmax))) << "maximum, swapped";
    FLAME_ASSERT_OK(flame_minimum(x, y, o.out()));
    EXPECT_TRUE(matches(o, map2(h, other, d, pmin))) << "minimum";
    FLAME_ASSERT_OK(flame_minimum(y, x, o.out()));
    EXPECT_TRUE(matches(o, map2(other, h, d, pmin))) << "minimum, swapped";
    HT nan_scalar = scalar(kNan, d);
    T sn = upload(ctx, nan_scalar);
    FLAME_ASSERT_OK(flame_maximum(x, sn, o.out()));  // broadcast NaN: all NaN
    EXPECT_TRUE(matches(o, HT(Shape{7}, d, kNan))) << "maximum with a NaN scalar";
    FLAME_ASSERT_OK(flame_clamp(x, 0.0, 1.0, o.out()));
    EXPECT_TRUE(matches(o, map1(h, d, [](double t) { return std::isnan(t) ? t : std::min(1.0, std::max(0.0, t)); })))
        << "clamp";
  }
}

TEST_F(Numerics, IntegerDivisionByZeroIsTrueDivision) {
  for (flame_dtype_t d : kIntDtypes) {
    SCOPED_TRACE(dname(d));
    const bool is_signed = d != FLAME_DTYPE_U8;
    HT a = HT::from_values({4}, d, {is_signed ? -7.0 : 9.0, 0, 5, 3});
    HT b = HT::from_values({4}, d, {0, 0, 0, 2});
    T ta = upload(ctx, a), tb = upload(ctx, b), q, qs;
    FLAME_ASSERT_OK(flame_div(ta, tb, q.out()));
    EXPECT_TRUE(matches(q, HT::from_values({4}, FLAME_DTYPE_F32, {is_signed ? -kInf : kInf, kNan, kInf, 1.5})))
        << "flame_div: true division in f32, as torch.div";
    FLAME_ASSERT_OK(flame_div_scalar(ta, 0.0, qs.out()));
    EXPECT_TRUE(matches(qs, HT::from_values({4}, FLAME_DTYPE_F32, {is_signed ? -kInf : kInf, kNan, kInf, kInf})))
        << "flame_div_scalar by 0";
  }
}

// Forward tests of flame.h "Creation": empty/zeros/ones/full in every dtype, arange, linspace,
// eye, rand/randn (range, moments, reproducibility through the RNG state), from_host/to_host
// round trips and size checks, item(); plus the dtype, status and version queries.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>
#include "host_ref.h"

using namespace href;

namespace {

class Creation : public GpuTest {};

TEST(CreationQueries, DtypesStatusVersion) {
  for (flame_dtype_t d : kAllDtypes) {
    EXPECT_EQ(flame_dtype_size(d), dsize(d)) << dname(d);
    EXPECT_STREQ(flame_dtype_name(d), dname(d));
  }
  EXPECT_EQ(flame_dtype_size(static_cast<flame_dtype_t>(99)), 0u);
  EXPECT_STREQ(flame_dtype_name(static_cast<flame_dtype_t>(99)), "unknown");
  EXPECT_STREQ(flame_status_string(FLAME_OK), "FLAME_OK");
  EXPECT_STREQ(flame_status_string(FLAME_ERROR_SHAPE_MISMATCH), "FLAME_ERROR_SHAPE_MISMATCH");
  EXPECT_NE(flame_status_string(static_cast<flame_status_t>(1234)), nullptr);
  EXPECT_EQ(flame_abi_version(), FLAME_ABI_VERSION);
  const std::string v = std::to_string(FLAME_VERSION_MAJOR) + "." + std::to_string(FLAME_VERSION_MINOR) + "." +
                        std::to_string(FLAME_VERSION_PATCH);
  EXPECT_EQ(std::string(flame_version_string()), v);
}

TEST_F(Creation, EmptyZerosOnesFullEveryDtype) {
  const std::vector<Shape> shapes = {{}, {1}, {7}, {3, 5}, {2, 3, 4}, {0}, {4, 0, 2}, {4097}};
  for (flame_dtype_t d : kAllDtypes) {
    SCOPED_TRACE(dname(d));
    const double full_value = d == FLAME_DTYPE_BOOL ? 1.0 : d == FLAME_DTYPE_U8 ? 200.0 : is_int(d) ? -7.0 : 3.25;
    for (const Shape& s : shapes) {
      SCOPED_TRACE("shape " + to_string(s));
      const int32_t nd = static_cast<int32_t>(s.size());
      const int64_t* sp = s.empty() ? nullptr : s.data();
      T e, z, o, f;
      FLAME_ASSERT_OK(flame_empty(ctx, sp, nd, d, e.out()));
      FLAME_ASSERT_OK(flame_zeros(ctx, sp, nd, d, z.out()));
      FLAME_ASSERT_OK(flame_ones(ctx, sp, nd, d, o.out()));
      FLAME_ASSERT_OK(flame_full(ctx, sp, nd, d, full_value, f.out()));
      for (flame_tensor_t t : {e.h, z.h, o.h, f.h}) {
        EXPECT_EQ(shape_of(t), s);
        EXPECT_EQ(dtype_of(t), d);
        EXPECT_EQ(numel_of(t), numel_of(s));
        EXPECT_TRUE(is_contiguous(t));
        EXPECT_TRUE(strides_match(t, contiguous_strides(s)));
      }
      EXPECT_EQ(download(e).numel(), numel_of(s));  // readable
      EXPECT_TRUE(matches(z, HT(s, d, 0.0)));
      EXPECT_TRUE(matches(o, HT(s, d, 1.0)));
      EXPECT_TRUE(matches(f, HT(s, d, round_to(full_value, d))));
    }
  }
  // fill values that round in the dtype
  const int64_t s3[] = {3};
  T f;
  FLAME_ASSERT_OK(flame_full(ctx, s3, 1, FLAME_DTYPE_F16, 0.1, f.out()));
  EXPECT_TRUE(matches(f, HT({3}, FLAME_DTYPE_F16, round_to(0.1, FLAME_DTYPE_F16)), Tol{0, 0}));
  FLAME_ASSERT_OK(flame_full(ctx, s3, 1, FLAME_DTYPE_BF16, -1.0 / 3.0, f.out()));
  EXPECT_TRUE(matches(f, HT({3}, FLAME_DTYPE_BF16, round_to(-1.0 / 3.0, FLAME_DTYPE_BF16)), Tol{0, 0}));
  FLAME_ASSERT_OK(flame_full(ctx, s3, 1, FLAME_DTYPE_F64, 1.0 / 3.0, f.out()));
  EXPECT_TRUE(matches(f, HT({3}, FLAME_DTYPE_F64, 1.0 / 3.0), Tol{0, 0}));
  FLAME_ASSERT_OK(flame_full(ctx, s3, 1, FLAME_DTYPE_I64, 1e15 + 1, f.out()));
  EXPECT_TRUE(matches(f, HT({3}, FLAME_DTYPE_I64, 1e15 + 1), Tol{0, 0}));
  FLAME_ASSERT_OK(flame_full(ctx, s3, 1, FLAME_DTYPE_F32, INFINITY, f.out()));
  EXPECT_TRUE(matches(f, HT({3}, FLAME_DTYPE_F32, INFINITY)));
  FLAME_ASSERT_OK(flame_full(ctx, s3, 1, FLAME_DTYPE_BOOL, 0.5, f.out()));  // nonzero is true
  EXPECT_TRUE(matches(f, HT({3}, FLAME_DTYPE_BOOL, 1.0)));
}

TEST_F(Creation, ShapeErrors) {
  flame_tensor_t bad;
  const int64_t neg[] = {3, -1}, huge[] = {int64_t(1) << 40, int64_t(1) << 40}, over[] = {INT64_MAX / 2, 4};
  const int64_t nine[] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_zeros(ctx, neg, 2, FLAME_DTYPE_F32, &bad));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_empty(ctx, huge, 2, FLAME_DTYPE_F32, &bad));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_ones(ctx, over, 2, FLAME_DTYPE_F64, &bad));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_zeros(ctx, nine, 9, FLAME_DTYPE_F32, &bad));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_zeros(ctx, nullptr, 2, FLAME_DTYPE_F32, &bad));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_zeros(ctx, neg, -1, FLAME_DTYPE_F32, &bad));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_zeros(nullptr, neg, 1, FLAME_DTYPE_F32, &bad));
  HREF_EXPECT_ANY_FAIL(bad, flame_zeros(ctx, neg, 1, static_cast<flame_dtype_t>(42), &bad));
  FLAME_EXPECT_STATUS(flame_zeros(ctx, neg, 1, FLAME_DTYPE_F32, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  // FLAME_MAX_DIMS dims are fine
  const int64_t eight[] = {1, 2, 1, 2, 1, 2, 1, 2};
  T ok;
  FLAME_ASSERT_OK(flame_ones(ctx, eight, 8, FLAME_DTYPE_F32, ok.out()));
  EXPECT_EQ(numel_of(ok), 16);
}

TEST_F(Creation, Arange) {
  struct C { double start, end, step; flame_dtype_t d; std::vector<double> want; };
  const C cases[] = {
      {0, 10, 1, FLAME_DTYPE_I64, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
      {0, 10, 3, FLAME_DTYPE_I32, {0, 3, 6, 9}},
      {5, -5, -1.5, FLAME_DTYPE_F32, {5, 3.5, 2, 0.5, -1, -2.5, -4}},
      {0, 1, 0.125, FLAME_DTYPE_F64, {0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875}},
      {-2, 2.5, 0.5, FLAME_DTYPE_F16, {-2, -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2}},
      {1, 4, 1, FLAME_DTYPE_BF16, {1, 2, 3}},
      {3, 3, 1, FLAME_DTYPE_F32, {}},
      {10, 0, -3, FLAME_DTYPE_I64, {10, 7, 4, 1}},
      {0, 5, 1, FLAME_DTYPE_U8, {0, 1, 2, 3, 4}},
  };
  for (const C& c : cases) {
    SCOPED_TRACE("arange(" + std::to_string(c.start) + ", " + std::to_string(c.end) + ", " + std::to_string(c.step) +
                 ") " + dname(c.d));
    T t;
    FLAME_ASSERT_OK(flame_arange(ctx, c.start, c.end, c.step, c.d, t.out()));
    EXPECT_TRUE(matches(t, HT::from_values({static_cast<int64_t>(c.want.size())}, c.d, c.want)));
  }
  // many values: start + i * step
  T t;
  FLAME_ASSERT_OK(flame_arange(ctx, -3.0, 1.05, 0.1, FLAME_DTYPE_F64, t.out()));
  HT h = download(t);
  ASSERT_EQ(h.shape, Shape{41});
  for (int64_t i = 0; i < 41; ++i) EXPECT_NEAR((*h.data)[static_cast<size_t>(i)], -3.0 + 0.1 * double(i), 1e-12) << i;
  FLAME_ASSERT_OK(flame_arange(ctx, 0, 100000, 1, FLAME_DTYPE_F32, t.out()));
  h = download(t);
  ASSERT_EQ(h.shape, Shape{100000});
  for (int64_t i = 0; i < 100000; i += 997) EXPECT_EQ((*h.data)[static_cast<size_t>(i)], double(i));
  EXPECT_EQ(h.data->back(), 99999.0);
  flame_tensor_t bad;
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_arange(ctx, 0, 1, 0, FLAME_DTYPE_F32, &bad));
  HREF_EXPECT_ANY_FAIL(bad, flame_arange(ctx, 0, NAN, 1, FLAME_DTYPE_F32, &bad));
}

TEST_F(Creation, Linspace) {
  for (flame_dtype_t d : {FLAME_DTYPE_F32, FLAME_DTYPE_F64, FLAME_DTYPE_F16, FLAME_DTYPE_BF16}) {
    SCOPED_TRACE(dname(d));
    T t;
    FLAME_ASSERT_OK(flame_linspace(ctx, -1.0, 3.7, 0, d, t.out()));
    EXPECT_EQ(shape_of(t), Shape{0});
    FLAME_ASSERT_OK(flame_linspace(ctx, -1.0, 3.7, 1, d, t.out()));
    EXPECT_TRUE(matches(t, HT::from_values({1}, d, {-1.0})));
    FLAME_ASSERT_OK(flame_linspace(ctx, -1.0, 3.7, 2, d, t.out()));
    EXPECT_TRUE(matches(t, HT::from_values({2}, d, {-1.0, 3.7})));
    for (int64_t steps : {5, 1001}) {
      SCOPED_TRACE("steps " + std::to_string(steps));
      FLAME_ASSERT_OK(flame_linspace(ctx, -1.0, 3.7, steps, d, t.out()));
      HT want({steps}, d);
      for (int64_t i = 0; i < steps; ++i)
        (*want.data)[static_cast<size_t>(i)] = round_to(-1.0 + 4.7 * double(i) / double(steps - 1), d);
      EXPECT_TRUE(matches(t, want, Tol{tol_for(d).rtol, 1e-5 + tol_for(d).atol * 4}));
      HT got = download(t);
      EXPECT_EQ(got.data->front(), round_to(-1.0, d)) << "first == start";
      EXPECT_EQ(got.data->back(), round_to(3.7, d)) << "last == end exactly";
    }
    FLAME_ASSERT_OK(flame_linspace(ctx, 2.0, -2.0, 9, d, t.out()));  // decreasing
    EXPECT_TRUE(matches(t, HT::from_values({9}, d, {2, 1.5, 1, 0.5, 0, -0.5, -1, -1.5, -2})));
  }
  flame_tensor_t bad;
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_linspace(ctx, 0, 1, -1, FLAME_DTYPE_F32, &bad));
}

TEST_F(Creation, Eye) {
  struct C { int64_t n, m; };
  for (flame_dtype_t d : kAllDtypes) {
    SCOPED_TRACE(dname(d));
    for (C c : {C{3, 5}, C{4, 2}, C{1, 1}, C{6, 6}, C{0, 3}, C{3, 0}, C{65, 33}}) {
      SCOPED_TRACE(std::to_string(c.n) + "x" + std::to_string(c.m));
      T t;
      FLAME_ASSERT_OK(flame_eye(ctx, c.n, c.m, d, t.out()));
      HT want({c.n, c.m}, d);
      for (int64_t i = 0; i < std::min(c.n, c.m); ++i) want.at({i, i}) = 1.0;
      EXPECT_TRUE(matches(t, want));
    }
  }
  flame_tensor_t bad;
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_eye(ctx, -1, 3, FLAME_DTYPE_F32, &bad));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_eye(ctx, 3, -2, FLAME_DTYPE_F32, &bad));
}

// ---------------------------------------------------------------------------------------------
// random numbers

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / double(v.size());
}
double std_of(const std::vector<double>& v) {
  const double m = mean_of(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / double(v.size()));
}

TEST_F(Creation, RandUniform) {
  const int64_t n = 1000003;  // odd: the tail of a Philox call's four words
  for (flame_dtype_t d : kFloatDtypes) {
    SCOPED_TRACE(dname(d));
    T t;
    FLAME_ASSERT_OK(flame_rand(ctx, &n, 1, d, t.out()));
    EXPECT_EQ(dtype_of(t), d);
    HT h = download(t);
    double lo = 1, hi = 0;
    for (double x : *h.data) { lo = std::min(lo, x); hi = std::max(hi, x); }
    EXPECT_GE(lo, 0.0);
    EXPECT_LT(hi, 1.0);
    EXPECT_LT(lo, 0.01);
    EXPECT_GT(hi, 0.99 - (d == FLAME_DTYPE_BF16 ? 0.01 : 0.0));
    EXPECT_NEAR(mean_of(*h.data), 0.5, 0.005);
    EXPECT_NEAR(std_of(*h.data), std::sqrt(1.0 / 12.0), 0.005);
    // a histogram of 10 bins is flat
    std::vector<int64_t> bins(10, 0);
    for (double x : *h.data) ++bins[std::min<size_t>(9, static_cast<size_t>(x * 10))];
    for (int b = 0; b < 10; ++b) EXPECT_NEAR(double(bins[b]) / double(n), 0.1, d == FLAME_DTYPE_BF16 ? 0.01 : 0.004) << b;
  }
  flame_tensor_t bad;
  for (flame_dtype_t d : {FLAME_DTYPE_I32, FLAME_DTYPE_I64, FLAME_DTYPE_U8, FLAME_DTYPE_BOOL}) {
    HREF_EXPECT_FAIL(FLAME_ERROR_DTYPE_MISMATCH, bad, flame_rand(ctx, &n, 1, d, &bad));
    HREF_EXPECT_FAIL(FLAME_ERROR_DTYPE_MISMATCH, bad, flame_randn(ctx, &n, 1, d, &bad));
  }
}

TEST_F(Creation, RandNormal) {
  const int64_t n = 1000001;
  for (flame_dtype_t d : kFloatDtypes) {
    SCOPED_TRACE(dname(d));
    T t;
    FLAME_ASSERT_OK(flame_randn(ctx, &n, 1, d, t.out()));
    EXPECT_EQ(dtype_of(t), d);
    HT h = download(t);
    for (double x : *h.data) ASSERT_TRUE(std::isfinite(x));
    EXPECT_NEAR(mean_of(*h.data), 0.0, 0.01);
    EXPECT_NEAR(std_of(*h.data), 1.0, 0.01);
    int64_t within1 = 0, within2 = 0;
    for (double x : *h.data) { within1 += std::fabs(x) < 1; within2 += std::fabs(x) < 2; }
    EXPECT_NEAR(double(within1) / double(n), 0.6827, 0.01);
    EXPECT_NEAR(double(within2) / double(n), 0.9545, 0.01);
  }
}

TEST_F(Creation, RandomStateReplays) {
  const int64_t shp[] = {3, 1001};
  for (flame_dtype_t d : kFloatDtypes) {
    SCOPED_TRACE(dname(d));
    FLAME_ASSERT_OK(flame_ctx_manual_seed(ctx, 42));
    uint64_t seed = 0, off0 = 99, off1 = 0, off2 = 0;
    FLAME_ASSERT_OK(flame_ctx_get_rng_state(ctx, &seed, &off0));
    EXPECT_EQ(seed, 42u);
    T a, b, c, e, f;
    FLAME_ASSERT_OK(flame_rand(ctx, shp, 2, d, a.out()));
    FLAME_ASSERT_OK(flame_ctx_get_rng_state(ctx, &seed, &off1));
    EXPECT_GT(off1, off0) << "a draw advances the offset";
    FLAME_ASSERT_OK(flame_rand(ctx, shp, 2, d, c.out()));  // next draw differs
    FLAME_ASSERT_OK(flame_ctx_get_rng_state(ctx, &seed, &off2));
    EXPECT_GT(off2, off1);
    FLAME_ASSERT_OK(flame_ctx_manual_seed(ctx, 42));
    FLAME_ASSERT_OK(flame_rand(ctx, shp, 2, d, b.out()));  // same seed, same values
    const HT ha = download(a), hb = download(b), hc = download(c);
    EXPECT_TRUE(all_close(hb, ha, Tol{0, 0}));
    int64_t same = 0;
    for (size_t i = 0; i < ha.data->size(); ++i) same += (*ha.data)[i] == (*hc.data)[i];
    EXPECT_LT(same, static_cast<int64_t>(ha.data->size() / 10)) << "consecutive draws must differ";
    // set_rng_state replays from any point
    FLAME_ASSERT_OK(flame_ctx_set_rng_state(ctx, 42, off1));
    FLAME_ASSERT_OK(flame_rand(ctx, shp, 2, d, e.out()));
    EXPECT_TRUE(all_close(download(e), hc, Tol{0, 0}));
    // another seed gives other values
    FLAME_ASSERT_OK(flame_ctx_manual_seed(ctx, 43));
    FLAME_ASSERT_OK(flame_rand(ctx, shp, 2, d, f.out()));
    const HT hf = download(f);
    same = 0;
    for (size_t i = 0; i < ha.data->size(); ++i) same += (*ha.data)[i] == (*hf.data)[i];
    EXPECT_LT(same, static_cast<int64_t>(ha.data->size() / 10));
    // randn replays too
    T n1, n2;
    FLAME_ASSERT_OK(flame_ctx_manual_seed(ctx, 7));
    FLAME_ASSERT_OK(flame_randn(ctx, shp, 2, d, n1.out()));
    FLAME_ASSERT_OK(flame_ctx_manual_seed(ctx, 7));
    FLAME_ASSERT_OK(flame_randn(ctx, shp, 2, d, n2.out()));
    EXPECT_TRUE(all_close(download(n2), download(n1), Tol{0, 0}));
  }
  // two contexts with the same seed option draw the same tensors
  flame_ctx_options_t o;
  FLAME_ASSERT_OK(flame_ctx_options_init(&o));
  o.seed = 987654321;
  flame_ctx_t c1 = nullptr, c2 = nullptr;
  FLAME_ASSERT_OK(flame_ctx_create(&o, &c1));
  FLAME_ASSERT_OK(flame_ctx_create(&o, &c2));
  {
    T r1, r2;
    FLAME_ASSERT_OK(flame_randn(c1, shp, 2, FLAME_DTYPE_F32, r1.out()));
    FLAME_ASSERT_OK(flame_randn(c2, shp, 2, FLAME_DTYPE_F32, r2.out()));
    EXPECT_TRUE(all_close(download(r2), download(r1), Tol{0, 0}));
    uint64_t seed = 0, off = 0;
    FLAME_ASSERT_OK(flame_ctx_get_rng_state(c1, &seed, &off));
    EXPECT_EQ(seed, 987654321u);
  }
  flame_ctx_destroy(c1);
  flame_ctx_destroy(c2);
  FLAME_EXPECT_STATUS(flame_ctx_get_rng_state(ctx, nullptr, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
}

TEST_F(Creation, RandOfViewsAndEmpty) {
  const int64_t e[] = {0, 5};
  T t;
  FLAME_ASSERT_OK(flame_rand(ctx, e, 2, FLAME_DTYPE_F32, t.out()));
  EXPECT_EQ(numel_of(t), 0);
  FLAME_ASSERT_OK(flame_randn(ctx, nullptr, 0, FLAME_DTYPE_F64, t.out()));
  EXPECT_EQ(shape_of(t), Shape{});
  EXPECT_TRUE(std::isfinite(item(t)));
}

// ---------------------------------------------------------------------------------------------
// host transfers

TEST_F(Creation, HostRoundTripEveryDtype) {
  HREF_RNG(rng);
  for (flame_dtype_t d : kAllDtypes) {
    SCOPED_TRACE(dname(d));
    for (Shape s : {Shape{}, Shape{1}, Shape{1023}, Shape{5, 7, 3}}) {
      SCOPED_TRACE(to_string(s));
      const size_t bytes = static_cast<size_t>(numel_of(s)) * dsize(d);
      std::vector<unsigned char> in(bytes), out(bytes, 0xAB);
      for (size_t i = 0; i < bytes; ++i) in[i] = static_cast<unsigned char>(rng());
      if (d == FLAME_DTYPE_BOOL)
        for (unsigned char& b : in) b &= 1;  // bool is one byte 0/1
      T t;
      FLAME_ASSERT_OK(flame_from_host(ctx, in.data(), bytes, s.empty() ? nullptr : s.data(), static_cast<int32_t>(s.size()), d, t.out()));
      EXPECT_EQ(shape_of(t), s);
      EXPECT_EQ(dtype_of(t), d);
      FLAME_ASSERT_OK(flame_to_host(t, out.data(), bytes));
      EXPECT_EQ(std::memcmp(in.data(), out.data(), bytes), 0) << "bytes differ after a round trip (f16/bf16 NaN patterns included)";
    }
  }
}

TEST_F(Creation, ToHostOfViewsIsRowMajor) {
  HREF_RNG(rng);
  HT h = random(rng, {4, 6}, FLAME_DTYPE_I32, Domain());
  T x = upload(ctx, h);
  T xt, sl, fl;
  FLAME_ASSERT_OK(flame_transpose(x, 0, 1, xt.out()));
  EXPECT_TRUE(matches(xt, h.transpose(0, 1)));
  FLAME_ASSERT_OK(flame_slice(x, 1, 1, 6, 2, sl.out()));
  EXPECT_TRUE(matches(sl, h.slice(1, 1, 6, 2)));
  const int32_t both[] = {0, 1};
  FLAME_ASSERT_OK(flame_flip(xt, both, 2, fl.out()));
  EXPECT_TRUE(matches(fl, h.transpose(0, 1).flip({0, 1})));
  std::vector<int32_t> raw(24);
  FLAME_ASSERT_OK(flame_to_host(xt, raw.data(), raw.size() * 4));
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 4; ++j) EXPECT_EQ(raw[static_cast<size_t>(i * 4 + j)], h.at({j, i}));
}

TEST_F(Creation, HostTransferErrors) {
  const float v[6] = {1, 2, 3, 4, 5, 6};
  const int64_t s[] = {2, 3};
  flame_tensor_t bad;
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_from_host(ctx, v, sizeof(v) - 4, s, 2, FLAME_DTYPE_F32, &bad));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_from_host(ctx, v, sizeof(v) + 4, s, 2, FLAME_DTYPE_F32, &bad));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_from_host(ctx, v, sizeof(v), s, 2, FLAME_DTYPE_F64, &bad));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_from_host(ctx, nullptr, sizeof(v), s, 2, FLAME_DTYPE_F32, &bad));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_from_host(nullptr, v, sizeof(v), s, 2, FLAME_DTYPE_F32, &bad));
  T t;
  FLAME_ASSERT_OK(flame_from_host(ctx, v, sizeof(v), s, 2, FLAME_DTYPE_F32, t.out()));
  float out[7] = {0};
  FLAME_EXPECT_STATUS(flame_to_host(t, out, sizeof(float) * 5), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_to_host(t, out, sizeof(float) * 7), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_to_host(t, nullptr, sizeof(float) * 6), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_to_host(nullptr, out, sizeof(float) * 6), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_ASSERT_OK(flame_to_host(t, out, sizeof(float) * 6));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(out[i], v[i]);
  EXPECT_EQ(out[6], 0.0f) << "to_host wrote past nbytes";
}

TEST_F(Creation, Item) {
  struct C { flame_dtype_t d; std::vector<unsigned char> bytes; double want; };
  auto bytes_of = [](const void* p, size_t n) {
    const unsigned char* b = static_cast<const unsigned char*>(p);
    return std::vector<unsigned char>(b, b + n);
  };
  const float f = -2.5f;
  const double g = 1.0 / 3.0;
  const int64_t big = (int64_t(1) << 40) + 3;
  const int32_t i = -123456;
  const uint8_t u = 250, bo = 1;
  const uint16_t h = f32_to_f16_bits(0.333f), bf = f32_to_bf16_bits(-7.25f);
  const C cases[] = {
      {FLAME_DTYPE_F32, bytes_of(&f, 4), -2.5},
      {FLAME_DTYPE_F64, bytes_of(&g, 8), 1.0 / 3.0},
      {FLAME_DTYPE_I64, bytes_of(&big, 8), double(big)},
      {FLAME_DTYPE_I32, bytes_of(&i, 4), -123456.0},
      {FLAME_DTYPE_U8, bytes_of(&u, 1), 250.0},
      {FLAME_DTYPE_BOOL, bytes_of(&bo, 1), 1.0},
      {FLAME_DTYPE_F16, bytes_of(&h, 2), f16_bits_to_f32(h)},
      {FLAME_DTYPE_BF16, bytes_of(&bf, 2), -7.25},
  };
  for (const C& c : cases) {
    SCOPED_TRACE(dname(c.d));
    T t0, t1;
    FLAME_ASSERT_OK(flame_from_host(ctx, c.bytes.data(), c.bytes.size(), nullptr, 0, c.d, t0.out()));
    const int64_t s11[] = {1, 1};
    FLAME_ASSERT_OK(flame_from_host(ctx, c.bytes.data(), c.bytes.size(), s11, 2, c.d, t1.out()));
    double v = 0;
    FLAME_ASSERT_OK(flame_tensor_item(t0, &v));
    EXPECT_EQ(v, c.want);
    FLAME_ASSERT_OK(flame_tensor_item(t1, &v));
    EXPECT_EQ(v, c.want);
  }
  // an element of a view
  const float arr[] = {1, 2, 3, 4, 5, 6};
  const int64_t s6[] = {6};
  T x, el;
  FLAME_ASSERT_OK(flame_from_host(ctx, arr, sizeof(arr), s6, 1, FLAME_DTYPE_F32, x.out()));
  FLAME_ASSERT_OK(flame_narrow(x, 0, 4, 1, el.out()));
  EXPECT_EQ(item(el), 5.0);
  double v = 0;
  FLAME_EXPECT_STATUS(flame_tensor_item(x, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(flame_tensor_item(x, &v), FLAME_OK) << "item of 6 elements must fail";
  T e;
  const int64_t s0[] = {0};
  FLAME_ASSERT_OK(flame_zeros(ctx, s0, 1, FLAME_DTYPE_F32, e.out()));
  EXPECT_NE(flame_tensor_item(e, &v), FLAME_OK) << "item of 0 elements must fail";
}

}  // namespace

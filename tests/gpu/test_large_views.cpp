// Reductions of the largest legal broadcast views (issue 32). A few host values are expanded to
// views of more than 2^31 and 2^32 elements (they read a few bytes: every broadcast dim has stride
// 0), and sum, mean, max, min and argmax over all elements and over each dim must give the exact
// answer (64-bit indexing all the way: a 32-bit count or offset would wrap, stop early or loop), in
// well under a second. Values are small integers, so that every f64 result and the f32 results
// below 2^24 are exact; f32 totals past 2^24 are checked to a relative 1e-5 (each thread sums
// integers exactly below 2^24; only the last levels of the trees round, ~1e-6 at most).
// Also: a reshape of such a view is a view, and the probe's reshape to [4] is refused.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>
#include "flame_test.h"

namespace {

constexpr int64_t p(int n) { return int64_t{1} << n; }

class LargeViews : public GpuTest {
 protected:
  // A contiguous tensor of `shape` holding `values` (converted from f64 on the device).
  T from_values(const std::vector<double>& values, std::vector<int64_t> shape, flame_dtype_t d) {
    T f64, out;
    EXPECT_EQ(flame_from_host(ctx, values.data(), values.size() * sizeof(double), shape.data(),
                              static_cast<int32_t>(shape.size()), FLAME_DTYPE_F64, f64.out()),
              FLAME_OK)
        << flame_last_error_message();
    if (d == FLAME_DTYPE_F64) return f64;
    EXPECT_EQ(flame_to_dtype(f64, d, out.out()), FLAME_OK) << flame_last_error_message();
    return out;
  }
  T expand(flame_tensor_t t, std::vector<int64_t> shape) {
    T out;
    EXPECT_EQ(flame_expand(t, shape.data(), static_cast<int32_t>(shape.size()), out.out()), FLAME_OK)
        << flame_last_error_message();
    return out;
  }
  // fn(t, dims, ndims, keepdim 0, out): flame_sum, flame_mean, flame_max, flame_min.
  using Reduce = flame_status_t (*)(flame_tensor_t, const int32_t*, int32_t, int32_t, flame_tensor_t*);
  T reduce(Reduce fn, flame_tensor_t t, std::vector<int32_t> dims) {
    T out;
    EXPECT_EQ(fn(t, dims.empty() ? nullptr : dims.data(), static_cast<int32_t>(dims.size()), 0, out.out()), FLAME_OK)
        << flame_last_error_message();
    return out;
  }
  // The values of t (any dtype) as f64 on the host.
  std::vector<double> host(flame_tensor_t t) {
    std::vector<double> v;
    if (!t) return v;
    int64_t n = 0;
    EXPECT_EQ(flame_tensor_numel(t, &n), FLAME_OK);
    T f64;
    EXPECT_EQ(flame_to_dtype(t, FLAME_DTYPE_F64, f64.out()), FLAME_OK) << flame_last_error_message();
    v.resize(static_cast<size_t>(n));
    EXPECT_EQ(flame_to_host(f64, v.data(), v.size() * sizeof(double)), FLAME_OK) << flame_last_error_message();
    return v;
  }
  double item(flame_tensor_t t) {
    std::vector<double> v = host(t);
    EXPECT_EQ(v.size(), 1u);
    return v.empty() ? std::nan("") : v[0];
  }
  std::vector<int64_t> shape_of(flame_tensor_t t) {
    int64_t d[8] = {0};
    int32_t nd = 0;
    EXPECT_EQ(flame_tensor_ndim(t, &nd), FLAME_OK);
    EXPECT_EQ(flame_tensor_shape(t, d, 8), FLAME_OK);
    return std::vector<int64_t>(d, d + nd);
  }
  // Seconds that a second sum_all of t takes (the first one compiled the kernels).
  double timed_sum_all(flame_tensor_t t) {
    T warm, s;
    EXPECT_EQ(flame_sum_all(t, warm.out()), FLAME_OK);
    EXPECT_EQ(flame_ctx_synchronize(ctx), FLAME_OK);
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(flame_sum_all(t, s.out()), FLAME_OK);
    EXPECT_EQ(flame_ctx_synchronize(ctx), FLAME_OK);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

// f32 totals past 2^24 (see the top of the file); exact values elsewhere.
void expect_close(double got, double want, flame_dtype_t d, const std::string& what) {
  if (d == FLAME_DTYPE_F64) EXPECT_EQ(got, want) << what;
  else EXPECT_NEAR(got, want, 1e-5 * std::fabs(want)) << what;
}

const char* name(flame_dtype_t d) { return d == FLAME_DTYPE_F64 ? "f64" : "f32"; }

// [1, 1024] (v_j = j % 4) as [2^22 + 3, 1024]: 2^32 + 3072 elements, rows above 2^22.
TEST_F(LargeViews, RowsViewPast2p32Elements) {
  const int64_t R = p(22) + 3, C = 1024;
  std::vector<double> v(C);
  for (int64_t j = 0; j < C; ++j) v[static_cast<size_t>(j)] = static_cast<double>(j % 4);
  const double row_sum = 1536;  // 256 * (0 + 1 + 2 + 3)
  for (flame_dtype_t d : {FLAME_DTYPE_F32, FLAME_DTYPE_F64}) {
    SCOPED_TRACE(name(d));
    T base = from_values(v, {1, C}, d);
    T x = expand(base, {R, C});
    ASSERT_NE(x.h, nullptr);
    int64_t n = 0;
    FLAME_ASSERT_OK(flame_tensor_numel(x, &n));
    EXPECT_EQ(n, R * C);

    T all;
    FLAME_ASSERT_OK(flame_sum_all(x, all.out()));
    expect_close(item(all), static_cast<double>(R) * row_sum, d, "sum_all");
    expect_close(item(reduce(flame_sum, x, {})), static_cast<double>(R) * row_sum, d, "sum over both dims");
    EXPECT_NEAR(item(reduce(flame_mean, x, {})), 1.5, d == FLAME_DTYPE_F64 ? 1e-12 : 1e-5) << "mean";
    EXPECT_EQ(item(reduce(flame_max, x, {})), 3.0) << "max";
    EXPECT_EQ(item(reduce(flame_min, x, {})), 0.0) << "min";

    // Over dim 0: R * v_j <= 3R < 2^24, exact in f32 too.
    std::vector<double> s0 = host(reduce(flame_sum, x, {0}));
    ASSERT_EQ(s0.size(), static_cast<size_t>(C));
    std::vector<double> m0 = host(reduce(flame_mean, x, {0})), x0 = host(reduce(flame_max, x, {0}));
    T am;
    FLAME_ASSERT_OK(flame_argmax(x, 0, 0, am.out()));
    std::vector<double> a0 = host(am);
    ASSERT_EQ(a0.size(), static_cast<size_t>(C));
    for (int64_t j = 0; j < C; ++j) {
      const size_t k = static_cast<size_t>(j);
      ASSERT_EQ(s0[k], static_cast<double>(R) * v[k]) << "sum dim 0, column " << j;
      ASSERT_NEAR(m0[k], v[k], 1e-6) << "mean dim 0, column " << j;
      ASSERT_EQ(x0[k], v[k]) << "max dim 0, column " << j;
      ASSERT_EQ(a0[k], 0.0) << "argmax dim 0 (ties: the first), column " << j;
    }
    // Over dim 1: R results of 1536 and 3.
    std::vector<double> s1 = host(reduce(flame_sum, x, {1})), x1 = host(reduce(flame_max, x, {-1}));
    ASSERT_EQ(s1.size(), static_cast<size_t>(R));
    ASSERT_EQ(x1.size(), static_cast<size_t>(R));
    for (int64_t i = 0; i < R; ++i) {
      ASSERT_EQ(s1[static_cast<size_t>(i)], row_sum) << "sum dim 1, row " << i;
      ASSERT_EQ(x1[static_cast<size_t>(i)], 3.0) << "max dim 1, row " << i;
    }
    const double secs = timed_sum_all(x);
    std::printf("[LargeViews] sum_all of a %s [%lld, %lld] broadcast view: %.1f ms\n", name(d),
                static_cast<long long>(R), static_cast<long long>(C), secs * 1e3);
    EXPECT_LT(secs, 2.0) << "a reduction of a broadcast view must not crawl";
  }
}

// [1, 1, 1024] as [2^11, 2^11 + 1, 1024] (2^32 + 2^21 elements): a view as [-1, 1024] merges the
// two broadcast dims without a copy; reductions over dim pairs; the probe's reshape to [4] fails.
TEST_F(LargeViews, ThreeDimViewAndItsReshape) {
  const int64_t A = p(11), B = p(11) + 1, C = 1024;
  std::vector<double> v(C);
  for (int64_t j = 0; j < C; ++j) v[static_cast<size_t>(j)] = static_cast<double>(j % 4);
  for (flame_dtype_t d : {FLAME_DTYPE_F32, FLAME_DTYPE_F64}) {
    SCOPED_TRACE(name(d));
    T base = from_values(v, {1, 1, C}, d);
    T x = expand(base, {A, B, C});
    ASSERT_NE(x.h, nullptr);
    const int64_t shape2[] = {-1, C};
    T y;
    FLAME_ASSERT_OK(flame_view(x, shape2, 2, y.out()));  // a view: no 16 GiB copy
    EXPECT_EQ(shape_of(y), (std::vector<int64_t>{A * B, C}));
    T yr;
    FLAME_ASSERT_OK(flame_reshape(x, shape2, 2, yr.out()));
    EXPECT_EQ(shape_of(yr), (std::vector<int64_t>{A * B, C}));
    T all;
    FLAME_ASSERT_OK(flame_sum_all(y, all.out()));
    expect_close(item(all), static_cast<double>(A * B) * 1536, d, "sum_all of the reshaped view");
    expect_close(item(reduce(flame_sum, x, {})), static_cast<double>(A * B) * 1536, d, "sum of the 3-d view");

    std::vector<double> s01 = host(reduce(flame_sum, x, {0, 1}));  // A * B * v_j <= 3 * 4196352 < 2^24
    ASSERT_EQ(s01.size(), static_cast<size_t>(C));
    for (int64_t j = 0; j < C; ++j)
      ASSERT_EQ(s01[static_cast<size_t>(j)], static_cast<double>(A * B) * v[static_cast<size_t>(j)]) << "column " << j;
    std::vector<double> s02 = host(reduce(flame_sum, x, {0, 2}));  // A * 1536 each
    ASSERT_EQ(s02.size(), static_cast<size_t>(B));
    for (int64_t i = 0; i < B; ++i) ASSERT_EQ(s02[static_cast<size_t>(i)], static_cast<double>(A) * 1536) << "dim-1 index " << i;
    std::vector<double> x12 = host(reduce(flame_max, x, {1, 2}));
    ASSERT_EQ(x12.size(), static_cast<size_t>(A));
    for (int64_t i = 0; i < A; ++i) ASSERT_EQ(x12[static_cast<size_t>(i)], 3.0) << "dim-0 index " << i;

    // The probe: an expand whose count wrapped to 4 was reshaped to [4]. Now the count is exact.
    const int64_t four[] = {4};
    T bad;
    FLAME_EXPECT_STATUS(flame_reshape(x, four, 1, bad.out()), FLAME_ERROR_SHAPE_MISMATCH);
    EXPECT_EQ(bad.h, nullptr);
    EXPECT_NE(std::string(flame_last_error_message()).find(std::to_string(A * B * C)), std::string::npos)
        << flame_last_error_message();
  }
}

// [3] = {1, 2, 4} as [2^31 + 1, 3]: 6442450947 elements, a reduced dim longer than 2^31.
TEST_F(LargeViews, ColumnsLongerThan2p31) {
  const int64_t R = p(31) + 1;
  const std::vector<double> v = {1, 2, 4};
  for (flame_dtype_t d : {FLAME_DTYPE_F32, FLAME_DTYPE_F64}) {
    SCOPED_TRACE(name(d));
    T base = from_values(v, {3}, d);
    T x = expand(base, {R, 3});
    ASSERT_NE(x.h, nullptr);
    T all;
    FLAME_ASSERT_OK(flame_sum_all(x, all.out()));
    expect_close(item(all), static_cast<double>(R) * 7, d, "sum_all");
    EXPECT_NEAR(item(reduce(flame_mean, x, {})), 7.0 / 3.0, d == FLAME_DTYPE_F64 ? 1e-12 : 1e-5) << "mean";
    EXPECT_EQ(item(reduce(flame_max, x, {})), 4.0) << "max";
    EXPECT_EQ(item(reduce(flame_min, x, {})), 1.0) << "min";
    std::vector<double> s0 = host(reduce(flame_sum, x, {0})), x0 = host(reduce(flame_max, x, {0}));
    std::vector<double> n0 = host(reduce(flame_min, x, {0})), m0 = host(reduce(flame_mean, x, {0}));
    T am;
    FLAME_ASSERT_OK(flame_argmin(x, 0, 0, am.out()));
    std::vector<double> a0 = host(am);
    ASSERT_EQ(s0.size(), 3u);
    ASSERT_EQ(a0.size(), 3u);
    for (size_t j = 0; j < 3; ++j) {
      expect_close(s0[j], static_cast<double>(R) * v[j], d, "sum dim 0, column " + std::to_string(j));
      EXPECT_NEAR(m0[j], v[j], d == FLAME_DTYPE_F64 ? 1e-12 : 1e-5 * v[j]) << "mean dim 0, column " << j;
      EXPECT_EQ(x0[j], v[j]) << "max dim 0, column " << j;
      EXPECT_EQ(n0[j], v[j]) << "min dim 0, column " << j;
      EXPECT_EQ(a0[j], 0.0) << "argmin dim 0 (ties: the first), column " << j;
    }
    const double secs = timed_sum_all(x);
    std::printf("[LargeViews] sum_all of a %s [%lld, 3] broadcast view: %.1f ms\n", name(d), static_cast<long long>(R),
                secs * 1e3);
    EXPECT_LT(secs, 2.0);
  }
}

// [1] as [2^33 + 5]: one broadcast dim of 8589934597 elements. 0.5 each: an exact f64 sum.
TEST_F(LargeViews, OneDimPast2p33) {
  const int64_t N = p(33) + 5;
  for (flame_dtype_t d : {FLAME_DTYPE_F32, FLAME_DTYPE_F64}) {
    SCOPED_TRACE(name(d));
    T base = from_values({0.5}, {1}, d);
    T x = expand(base, {N});
    ASSERT_NE(x.h, nullptr);
    T all;
    FLAME_ASSERT_OK(flame_sum_all(x, all.out()));
    expect_close(item(all), static_cast<double>(N) * 0.5, d, "sum_all");
    expect_close(item(reduce(flame_sum, x, {0})), static_cast<double>(N) * 0.5, d, "sum dim 0");
    EXPECT_NEAR(item(reduce(flame_mean, x, {})), 0.5, d == FLAME_DTYPE_F64 ? 1e-12 : 1e-5) << "mean";
    EXPECT_EQ(item(reduce(flame_max, x, {0})), 0.5) << "max";
    // A view of the view: [2^33 + 5] as [2^33 + 5, 1] and a slice of it keep the count exact.
    const int64_t col[] = {-1, 1};
    T y;
    FLAME_ASSERT_OK(flame_view(x, col, 2, y.out()));
    EXPECT_EQ(shape_of(y), (std::vector<int64_t>{N, 1}));
    T half;
    FLAME_ASSERT_OK(flame_slice(y, 0, 0, N, 2, half.out()));  // every other element: (N + 1) / 2
    EXPECT_EQ(shape_of(half), (std::vector<int64_t>{(N + 1) / 2, 1}));
    expect_close(item(reduce(flame_sum, half, {})), static_cast<double>((N + 1) / 2) * 0.5, d, "sum of the slice");
    const double secs = timed_sum_all(x);
    std::printf("[LargeViews] sum_all of a %s [%lld] broadcast view: %.1f ms\n", name(d), static_cast<long long>(N),
                secs * 1e3);
    EXPECT_LT(secs, 2.0);
  }
}

// Size arithmetic of the other view ops at the int64 edge: a slice step of 2^63 - 1 (its length was
// end - start + step - 1, which overflowed) and an unsqueeze of such a slice.
TEST_F(LargeViews, SliceStepsNearInt64Max) {
  T x = from_values({10, 11, 12, 13, 14}, {5}, FLAME_DTYPE_F32);
  T s;
  FLAME_ASSERT_OK(flame_slice(x, 0, 1, 5, INT64_MAX, s.out()));
  EXPECT_EQ(shape_of(s), (std::vector<int64_t>{1}));
  EXPECT_EQ(host(s), (std::vector<double>{11}));
  T u;
  FLAME_ASSERT_OK(flame_unsqueeze(s, 1, u.out()));
  EXPECT_EQ(shape_of(u), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(host(u), (std::vector<double>{11}));
  T e;
  FLAME_ASSERT_OK(flame_slice(x, 0, 5, 5, INT64_MAX - 1, e.out()));
  EXPECT_EQ(shape_of(e), (std::vector<int64_t>{0}));
  // A broadcast view sliced with a huge step keeps one exact element.
  T big = expand(x, {p(40), 5});
  T b;
  FLAME_ASSERT_OK(flame_slice(big, 0, 3, p(40), INT64_MAX, b.out()));
  EXPECT_EQ(shape_of(b), (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(host(b), (std::vector<double>{10, 11, 12, 13, 14}));
}

}  // namespace

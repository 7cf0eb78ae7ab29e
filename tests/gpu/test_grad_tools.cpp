// The fused gradient tools on tensor lists against host float64 references: per-tensor
// normalisation, Gaussian noise (values recomputed on the host from a host Philox4x32-10, so the
// documented counter mapping is checked, and the generator's offset), statistics per tensor and
// overall with NaN and Inf (device and host forms agree); mixed dtypes, a strided view, a tensor
// spanning two chunks, an empty and an all-zero tensor in one list; use from a post-accumulate hook
// and a tensor hook; version bumps; bad input changes nothing.
#include <cmath>
#include <limits>
#include <vector>
#include "host_ref.h"

using namespace href;

namespace {

class GradTools : public GpuTest {};

// ---- host Philox4x32-10 and the normal of cuda/grad_tools.cuh ----
struct U4 {
  uint32_t x, y, z, w;
};
U4 philox(uint64_t seed, uint64_t counter) {
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  U4 c = {static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0u, 0u};
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = uint64_t{0xD2511F53u} * c.x, p1 = uint64_t{0xCD9E8D57u} * c.z;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c = {hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c;
}
double normal(const U4& r, bool f64) {
  const double pi = 3.14159265358979323846;
  if (!f64) {
    const double u1 = ((r.x >> 8) + 1) * 5.9604644775390625e-8, u2 = (r.y >> 8) * 5.9604644775390625e-8;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * pi * u2);
  }
  const double u1 = static_cast<double>(((static_cast<uint64_t>(r.x) << 21) ^ (r.y >> 11)) + 1) * 1.1102230246251565e-16;
  const double u2 = static_cast<double>((static_cast<uint64_t>(r.z) << 21) ^ (r.w >> 11)) * 1.1102230246251565e-16;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * pi * u2);
}

// A list of test tensors: mixed dtypes, two chunks, a transposed view, empty, all zero.
struct List {
  std::vector<T> owners;           // what keeps the memory (the base of the view)
  std::vector<T> items;            // the list passed to FLAME
  std::vector<HT> values;          // host copies of the items' values (row-major over the item)
  std::vector<flame_tensor_t> raw;
};
List make_list(flame_ctx_t ctx, Rng& rng, double lo, double hi) {
  List l;
  auto add = [&](HT v) {
    l.items.push_back(upload(ctx, v));
    l.values.push_back(v);
  };
  add(random(rng, {33, 7}, FLAME_DTYPE_F32, lo, hi));
  add(random(rng, {70000}, FLAME_DTYPE_F32, lo, hi));  // two chunks of 65536
  add(random(rng, {129}, FLAME_DTYPE_F64, lo, hi));
  add(random(rng, {300}, FLAME_DTYPE_F16, lo, hi));
  add(random(rng, {4, 50}, FLAME_DTYPE_BF16, lo, hi));
  add(HT({0}, FLAME_DTYPE_F32));
  add(HT({17}, FLAME_DTYPE_F32, 0.0));
  // a [7, 5] view (transpose) of a [5, 7] tensor
  HT base = random(rng, {5, 7}, FLAME_DTYPE_F32, lo, hi);
  l.owners.push_back(upload(ctx, base));
  T view;
  EXPECT_EQ(flame_transpose(l.owners.back(), 0, 1, view.out()), FLAME_OK);
  EXPECT_FALSE(is_contiguous(view));
  l.items.push_back(std::move(view));
  l.values.push_back(base.transpose(0, 1).contiguous());
  for (const T& t : l.items) l.raw.push_back(t);
  return l;
}

TEST_F(GradTools, NormalizeMatchesTheHost) {
  HREF_RNG(rng);
  for (double target : {1.0, 0.25}) {
    SCOPED_TRACE(::testing::Message() << "target " << target);
    List l = make_list(ctx, rng, -2, 2);
    const double eps = 1e-6;
    FLAME_ASSERT_OK(flame_grad_normalize(ctx, l.raw.data(), static_cast<int64_t>(l.raw.size()), target, eps));
    for (size_t k = 0; k < l.items.size(); ++k) {
      const HT& v = l.values[k];
      double ss = 0;
      for (double x : v.values()) ss += x * x;
      const double f = target / (std::sqrt(ss) + eps);
      HT want = map1(v, v.dtype, [&](double x) { return x * f; });
      EXPECT_TRUE(matches(l.items[k], want, tol_for(v.dtype))) << "tensor " << k;
    }
  }
}

TEST_F(GradTools, NoiseIsThePhiloxStreamOfTheContext) {
  HREF_RNG(rng);
  List l = make_list(ctx, rng, -1, 1);
  const double sd = 0.5;
  uint64_t seed = 0, offset = 0, seed2 = 0, offset2 = 0;
  FLAME_ASSERT_OK(flame_ctx_get_rng_state(ctx, &seed, &offset));
  FLAME_ASSERT_OK(flame_grad_add_noise(ctx, l.raw.data(), static_cast<int64_t>(l.raw.size()), sd));
  FLAME_ASSERT_OK(flame_ctx_get_rng_state(ctx, &seed2, &offset2));
  uint64_t total = 0;
  for (const HT& v : l.values) total += static_cast<uint64_t>(v.numel());
  EXPECT_EQ(seed2, seed);
  EXPECT_EQ(offset2, offset + total);
  uint64_t e = offset;
  for (size_t k = 0; k < l.items.size(); ++k) {
    const HT& v = l.values[k];
    const bool f64 = v.dtype == FLAME_DTYPE_F64;
    std::vector<double> noise;
    HT want = map1(v, v.dtype, [&](double x) {
      const double z = normal(philox(seed, e++), f64);
      noise.push_back(z);
      return x + sd * z;
    });
    // f32 device math (logf, sincospif) is within a few ulps of the host's double math.
    Tol tol = v.dtype == FLAME_DTYPE_F64 ? Tol{1e-12, 1e-12} : v.dtype == FLAME_DTYPE_F32 ? Tol{2e-6, 4e-6} : tol_for(v.dtype);
    EXPECT_TRUE(matches(l.items[k], want, tol)) << "tensor " << k;
    if (v.numel() == 70000) {  // the noise itself looks standard normal
      double m = 0, s2 = 0;
      for (double z : noise) m += z;
      m /= static_cast<double>(noise.size());
      for (double z : noise) s2 += (z - m) * (z - m);
      EXPECT_NEAR(m, 0.0, 0.02);
      EXPECT_NEAR(std::sqrt(s2 / static_cast<double>(noise.size())), 1.0, 0.02);
    }
  }
  // Replaying the generator state replays the noise.
  HT z({1000}, FLAME_DTYPE_F32, 0.0);
  T a = upload(ctx, z), b = upload(ctx, z);
  flame_tensor_t ra = a, rb = b;
  FLAME_ASSERT_OK(flame_ctx_set_rng_state(ctx, 7, 123));
  FLAME_ASSERT_OK(flame_grad_add_noise(ctx, &ra, 1, 1.0));
  FLAME_ASSERT_OK(flame_ctx_set_rng_state(ctx, 7, 123));
  FLAME_ASSERT_OK(flame_grad_add_noise(ctx, &rb, 1, 1.0));
  EXPECT_TRUE(all_close(download(a), download(b), Tol{0, 0}));
}

// Host statistics of one value list: norm, min, max, mean, NaN count, Inf count.
std::vector<double> host_stats(const std::vector<double>& v) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  double sum = 0, ss = 0, lo = inf, hi = -inf, nans = 0, infs = 0;
  for (double x : v) {
    sum += x;
    ss += x * x;
    if (std::isnan(x)) { ++nans; continue; }
    if (std::isinf(x)) ++infs;
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  const bool none = nans == static_cast<double>(v.size());
  return {std::sqrt(ss), none ? nan : lo, none ? nan : hi, v.empty() ? nan : sum / static_cast<double>(v.size()), nans, infs};
}

TEST_F(GradTools, StatisticsPerTensorAndOverall) {
  HREF_RNG(rng);
  List l = make_list(ctx, rng, -3, 3);
  // Non-finite values in two tensors: NaN and +Inf in the f32 one, -Inf in the bf16 one.
  auto poke = [&](size_t k, std::vector<std::pair<size_t, double>> at) {
    for (auto& p : at) (*l.values[k].data)[p.first] = p.second;
    l.items[k] = upload(ctx, l.values[k]);
    l.raw[k] = l.items[k];
  };
  poke(0, {{3, std::nan("")}, {100, INFINITY}, {101, std::nan("")}});
  poke(4, {{0, -INFINITY}});
  const int64_t n = static_cast<int64_t>(l.raw.size());
  T dev;
  FLAME_ASSERT_OK(flame_grad_stats(ctx, l.raw.data(), n, dev.out()));
  EXPECT_EQ(dtype_of(dev), FLAME_DTYPE_F64);
  EXPECT_EQ(shape_of(dev), (Shape{n + 1, FLAME_STAT_COLUMNS}));
  std::vector<double> host(static_cast<size_t>((n + 1) * FLAME_STAT_COLUMNS));
  FLAME_ASSERT_OK(flame_grad_stats_host(ctx, l.raw.data(), n, host.data(), static_cast<int64_t>(host.size())));
  const std::vector<double> got = download(dev).values();
  std::vector<double> all;
  for (int64_t k = 0; k <= n; ++k) {
    std::vector<double> v;
    if (k < n) {
      v = l.values[static_cast<size_t>(k)].values();
      all.insert(all.end(), v.begin(), v.end());
    } else {
      v = all;
    }
    const std::vector<double> want = host_stats(v);
    for (int c = 0; c < FLAME_STAT_COLUMNS; ++c) {
      const size_t i = static_cast<size_t>(k * FLAME_STAT_COLUMNS + c);
      EXPECT_TRUE(close_enough(got[i], want[static_cast<size_t>(c)], Tol{1e-12, 1e-12}))
          << "row " << k << " column " << c << ": got " << got[i] << ", expected " << want[static_cast<size_t>(c)];
      EXPECT_TRUE(close_enough(host[i], got[i], Tol{0, 0})) << "host form, row " << k << " column " << c;
    }
  }
  EXPECT_EQ(got[static_cast<size_t>(n * FLAME_STAT_COLUMNS + FLAME_STAT_NAN_COUNT)], 2.0);
  EXPECT_EQ(got[static_cast<size_t>(n * FLAME_STAT_COLUMNS + FLAME_STAT_INF_COUNT)], 2.0);
  // An empty list: one row; capacity too small: nothing written.
  double one[FLAME_STAT_COLUMNS] = {7, 7, 7, 7, 7, 7};
  FLAME_ASSERT_OK(flame_grad_stats_host(ctx, nullptr, 0, one, FLAME_STAT_COLUMNS));
  EXPECT_EQ(one[FLAME_STAT_NORM], 0.0);
  EXPECT_TRUE(std::isnan(one[FLAME_STAT_MIN]) && std::isnan(one[FLAME_STAT_MEAN]));
  EXPECT_EQ(one[FLAME_STAT_NAN_COUNT], 0.0);
  double small[FLAME_STAT_COLUMNS] = {7, 7, 7, 7, 7, 7};
  FLAME_EXPECT_STATUS(flame_grad_stats_host(ctx, l.raw.data(), 1, small, FLAME_STAT_COLUMNS), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(small[0], 7.0);
}

// A post-accumulate hook normalising .grad in place, and a tensor hook returning a normalised copy.
flame_status_t normalize_post_hook(void*, flame_tensor_t leaf) {
  flame_ctx_t c = nullptr;
  flame_tensor_t g = nullptr;
  flame_status_t st = flame_tensor_context(leaf, &c);
  if (st == FLAME_OK) st = flame_tensor_grad(leaf, &g);
  if (st == FLAME_OK) st = flame_grad_normalize(c, &g, 1, 1.0, 0.0);
  flame_tensor_release(g);
  return st;
}
flame_status_t normalize_copy_hook(void*, flame_tensor_t grad, flame_tensor_t* replacement) {
  flame_ctx_t c = nullptr;
  flame_status_t st = flame_tensor_context(grad, &c);
  if (st == FLAME_OK) st = flame_clone(grad, replacement);
  if (st == FLAME_OK) st = flame_grad_normalize(c, replacement, 1, 2.0, 0.0);
  return st;
}

TEST_F(GradTools, UsableFromHooks) {
  HREF_RNG(rng);
  const HT cv = random(rng, {100}, FLAME_DTYPE_F32, 0.5, 2);
  double norm = 0;
  for (double x : cv.values()) norm += x * x;
  norm = std::sqrt(norm);
  T c = upload(ctx, cv);
  for (int which = 0; which < 2; ++which) {
    SCOPED_TRACE(which ? "tensor hook" : "post-accumulate hook");
    T x = upload(ctx, HT({100}, FLAME_DTYPE_F32, 1.0)), y, loss, g;
    FLAME_ASSERT_OK(flame_tensor_set_requires_grad(x, 1));
    flame_hook_t h = nullptr;
    if (which == 0) FLAME_ASSERT_OK(flame_tensor_register_post_accumulate_grad_hook(x, normalize_post_hook, nullptr, nullptr, &h));
    else FLAME_ASSERT_OK(flame_tensor_register_hook(x, normalize_copy_hook, nullptr, nullptr, &h));
    FLAME_ASSERT_OK(flame_mul(x, c, y.out()));
    FLAME_ASSERT_OK(flame_sum_all(y, loss.out()));
    FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
    FLAME_ASSERT_OK(flame_tensor_grad(x, g.out()));
    const double scale = which == 0 ? 1.0 : 2.0;
    EXPECT_TRUE(matches(g, map1(cv, FLAME_DTYPE_F32, [&](double v) { return v * scale / norm; })));
    flame_hook_remove(h);
  }
}

TEST_F(GradTools, WritesBumpVersionsAndBadInputChangesNothing) {
  // A tensor saved for backward, then normalised: backward reports the in-place change.
  T w = upload(ctx, HT({4}, FLAME_DTYPE_F32, 1.0)), s = upload(ctx, HT({4}, FLAME_DTYPE_F32, 3.0)), y, loss;
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(w, 1));
  FLAME_ASSERT_OK(flame_mul(w, s, y.out()));  // saves s for w's gradient
  FLAME_ASSERT_OK(flame_sum_all(y, loss.out()));
  flame_tensor_t rs = s;
  FLAME_ASSERT_OK(flame_grad_normalize(ctx, &rs, 1, 1.0, 0.0));
  EXPECT_TRUE(matches(s, HT({4}, FLAME_DTYPE_F32, 0.5)));
  FLAME_EXPECT_STATUS(flame_backward(ctx, loss, nullptr, 0), FLAME_ERROR_INPLACE_MODIFIED);

  const HT v = HT::from_values({4}, FLAME_DTYPE_F32, {1, -2, 3, -4});
  T a = upload(ctx, v), i32 = upload(ctx, HT({4}, FLAME_DTYPE_I32, 1.0)), leaf = upload(ctx, v), ex, other_t;
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(leaf, 1));
  const int64_t big[] = {3, 4};
  FLAME_ASSERT_OK(flame_expand(a, big, 2, ex.out()));
  flame_ctx_t other = nullptr;
  flame_ctx_options_t o;
  flame_ctx_options_init(&o);
  FLAME_ASSERT_OK(flame_ctx_create(&o, &other));
  other_t = upload(other, v);
  struct Case {
    const char* what;
    std::vector<flame_tensor_t> list;
    flame_status_t status;
  };
  const Case cases[] = {
      {"integer tensor", {a, i32}, FLAME_ERROR_DTYPE_MISMATCH},
      {"requires grad", {a, leaf}, FLAME_ERROR_INVALID_ARGUMENT},
      {"twice", {a, a}, FLAME_ERROR_INVALID_ARGUMENT},
      {"broadcast view", {ex}, FLAME_ERROR_INVALID_ARGUMENT},
      {"other context", {a, other_t}, FLAME_ERROR_INVALID_ARGUMENT},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    FLAME_EXPECT_STATUS(flame_grad_normalize(ctx, k.list.data(), static_cast<int64_t>(k.list.size()), 1.0, 1e-6), k.status);
    FLAME_EXPECT_STATUS(flame_grad_add_noise(ctx, k.list.data(), static_cast<int64_t>(k.list.size()), 1.0), k.status);
    EXPECT_TRUE(matches(a, v, Tol{0, 0}));
  }
  flame_tensor_t ra = a;
  FLAME_EXPECT_STATUS(flame_grad_normalize(ctx, &ra, 1, -1.0, 1e-6), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_grad_normalize(ctx, &ra, 1, 1.0, NAN), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_grad_add_noise(ctx, &ra, 1, INFINITY), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_grad_add_noise(ctx, nullptr, 1, 1.0), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_grad_add_noise(ctx, &ra, -1, 1.0), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(matches(a, v, Tol{0, 0}));
  // Statistics only read: a leaf that requires grad and a broadcast view are fine there.
  flame_tensor_t readable[2] = {leaf, ex};
  T st;
  FLAME_ASSERT_OK(flame_grad_stats(ctx, readable, 2, st.out()));
  std::vector<double> sv = download(st).values();
  EXPECT_NEAR(sv[FLAME_STAT_NORM], std::sqrt(30.0), 1e-12);
  EXPECT_NEAR(sv[FLAME_STAT_COLUMNS + FLAME_STAT_NORM], std::sqrt(90.0), 1e-12);
  // Gradient mode off: a leaf that requires grad may be edited.
  int32_t prev = 1;
  FLAME_ASSERT_OK(flame_ctx_set_grad_enabled(ctx, 0, &prev));
  flame_tensor_t rl = leaf;
  FLAME_EXPECT_STATUS(flame_grad_normalize(ctx, &rl, 1, 1.0, 0.0), FLAME_OK);
  FLAME_ASSERT_OK(flame_ctx_set_grad_enabled(ctx, prev, nullptr));
  other_t = T();
  flame_ctx_destroy(other);
}

}  // namespace

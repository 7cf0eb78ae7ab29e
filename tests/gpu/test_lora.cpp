// LoRA adapters against host float64 references, for f32, bf16 and f16 base weights: the
// initialisation (A uniform in +-1/sqrt(in) from the context's generator, B zero, so a new adapter
// is the base layer), the forward with non-zero B, gradients reaching only A and B (with their
// values), merge equal to the unmerged forward within the rounding of the base dtype, unmerge
// restoring the weight bit for bit; bad input.
#include <cmath>
#include <vector>
#include "host_ref.h"

using namespace href;

namespace {

class Lora : public GpuTest {};

// y[n][o] = sum_k x[n][k] w[o][k] (+ bias[o]) for x [N, K], w [O, K].
std::vector<double> host_linear(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>* bias,
                                int64_t n, int64_t k, int64_t o) {
  std::vector<double> y(static_cast<size_t>(n * o));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < o; ++j) {
      double s = bias ? (*bias)[static_cast<size_t>(j)] : 0.0;
      for (int64_t q = 0; q < k; ++q) s += x[static_cast<size_t>(i * k + q)] * w[static_cast<size_t>(j * k + q)];
      y[static_cast<size_t>(i * o + j)] = s;
    }
  return y;
}
std::vector<double> transpose(const std::vector<double>& m, int64_t rows, int64_t cols) {
  std::vector<double> t(m.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) t[static_cast<size_t>(j * rows + i)] = m[static_cast<size_t>(i * cols + j)];
  return t;
}
double unit_roundoff(flame_dtype_t d) {
  return d == FLAME_DTYPE_BF16 ? std::ldexp(1.0, -8) : d == FLAME_DTYPE_F16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -24);
}

// Sets a leaf f32 tensor to `value` through an SGD step (lr 1, gradient -value, from zero).
void assign_from_zero(flame_ctx_t ctx, flame_tensor_t leaf, const HT& value) {
  HT neg = map1(value, value.dtype, [](double v) { return -v; });
  T g = upload(ctx, neg);
  ASSERT_EQ(flame_tensor_set_grad(leaf, g), FLAME_OK);
  flame_optimizer_options_t o;
  ASSERT_EQ(flame_optimizer_options_init(&o, FLAME_OPTIMIZER_SGD), FLAME_OK);
  o.lr = 1.0;
  flame_optimizer_t opt = nullptr;
  ASSERT_EQ(flame_optimizer_create(ctx, &o, &leaf, 1, &opt), FLAME_OK) << flame_last_error_message();
  ASSERT_EQ(flame_optimizer_step(opt), FLAME_OK);
  ASSERT_EQ(flame_optimizer_zero_grad(opt, 1), FLAME_OK);
  flame_optimizer_release(opt);
}

TEST_F(Lora, ForwardGradientsMergeAndUnmerge) {
  HREF_RNG(rng);
  const int64_t n = 5, in = 12, out = 7, rank = 3;
  const double alpha = 6.0, scale = alpha / rank;
  for (flame_dtype_t dt : {FLAME_DTYPE_F32, FLAME_DTYPE_BF16, FLAME_DTYPE_F16}) {
    SCOPED_TRACE(dname(dt));
    const HT wh = random(rng, {out, in}, dt, -1, 1), bh = random(rng, {out}, dt, -1, 1), xh = random(rng, {n, in}, dt, -1, 1);
    T w = upload(ctx, wh), b = upload(ctx, bh), x = upload(ctx, xh);
    flame_lora_t lora = nullptr;
    FLAME_ASSERT_OK(flame_lora_create(w, b, rank, alpha, &lora));
    T a, bm;
    FLAME_ASSERT_OK(flame_lora_adapters(lora, a.out(), bm.out()));
    EXPECT_EQ(dtype_of(a), FLAME_DTYPE_F32);
    EXPECT_EQ(shape_of(a), (Shape{rank, in}));
    EXPECT_EQ(shape_of(bm), (Shape{out, rank}));
    const std::vector<double> av = download(a).values();
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    double lo = 1, hi = -1;
    for (double v : av) lo = std::min(lo, v), hi = std::max(hi, v);
    EXPECT_GE(lo, -bound * (1 + 1e-6));  // f32 rounding of the bound
    EXPECT_LE(hi, bound * (1 + 1e-6));
    EXPECT_GT(hi - lo, bound);  // spread over the interval, not constant
    EXPECT_TRUE(matches(bm, HT({out, rank}, FLAME_DTYPE_F32, 0.0), Tol{0, 0}));
    int32_t rg = 0;
    FLAME_ASSERT_OK(flame_tensor_requires_grad(a, &rg));
    EXPECT_EQ(rg, 1);

    // B = 0: the base layer.
    const std::vector<double> base = host_linear(xh.values(), wh.values(), nullptr, n, in, out);
    std::vector<double> base_b = base;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < out; ++j) base_b[static_cast<size_t>(i * out + j)] += bh.values()[static_cast<size_t>(j)];
    T y0;
    FLAME_ASSERT_OK(flame_lora_forward(lora, x, y0.out()));
    EXPECT_TRUE(matches(y0, HT::from_values({n, out}, dt, base_b), tol_for(dt)));

    // Non-zero B; y = base + scale * (x A^T) B^T.
    const HT bv = random(rng, {out, rank}, FLAME_DTYPE_F32, -1, 1);
    assign_from_zero(ctx, bm, bv);
    const std::vector<double> h = host_linear(xh.values(), av, nullptr, n, in, rank);  // [n, r]
    const std::vector<double> d = host_linear(h, bv.values(), nullptr, n, rank, out);  // [n, out]
    std::vector<double> want(base_b.size());
    for (size_t i = 0; i < want.size(); ++i) want[i] = base_b[i] + scale * d[i];
    T y;
    FLAME_ASSERT_OK(flame_lora_forward(lora, x, y.out()));
    EXPECT_EQ(dtype_of(y), dt);
    EXPECT_TRUE(matches(y, HT::from_values({n, out}, dt, want), dt == FLAME_DTYPE_F32 ? Tol{1e-5, 1e-5} : Tol{2e-2, 2e-2}));

    // Gradients of sum(y * r): only A and B get them.
    const HT rh = random(rng, {n, out}, dt, -1, 1);
    T r = upload(ctx, rh), yr, loss;
    FLAME_ASSERT_OK(flame_mul(y, r, yr.out()));
    FLAME_ASSERT_OK(flame_sum_all(yr, loss.out()));
    FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
    T gw, gb, gx, ga, gbm;
    FLAME_ASSERT_OK(flame_tensor_grad(w, gw.out()));
    FLAME_ASSERT_OK(flame_tensor_grad(b, gb.out()));
    FLAME_ASSERT_OK(flame_tensor_grad(x, gx.out()));
    EXPECT_EQ(gw.h, nullptr);
    EXPECT_EQ(gb.h, nullptr);
    EXPECT_EQ(gx.h, nullptr);
    FLAME_ASSERT_OK(flame_tensor_grad(a, ga.out()));
    FLAME_ASSERT_OK(flame_tensor_grad(bm, gbm.out()));
    ASSERT_NE(ga.h, nullptr);
    ASSERT_NE(gbm.h, nullptr);
    // dB = scale g^T h [out, r]; dA = scale (g B)^T x [r, in], with g = r (the gradient of y).
    const std::vector<double> g = rh.values(), gt = transpose(g, n, out), ht = transpose(h, n, rank);
    const std::vector<double> db = host_linear(gt, ht, nullptr, out, n, rank);
    const std::vector<double> gB = host_linear(g, transpose(bv.values(), out, rank), nullptr, n, out, rank);  // [n, r]
    const std::vector<double> da = host_linear(transpose(gB, n, rank), transpose(xh.values(), n, in), nullptr, rank, n, in);
    std::vector<double> db_s(db.size()), da_s(da.size());
    for (size_t i = 0; i < db.size(); ++i) db_s[i] = scale * db[i];
    for (size_t i = 0; i < da.size(); ++i) da_s[i] = scale * da[i];
    EXPECT_TRUE(matches(gbm, HT::from_values({out, rank}, FLAME_DTYPE_F32, db_s), Tol{1e-4, 1e-5}));
    EXPECT_TRUE(matches(ga, HT::from_values({rank, in}, FLAME_DTYPE_F32, da_s), Tol{1e-4, 1e-5}));

    // Merged: the same output within the rounding of the merged weight and of the two outputs.
    const HT y_unmerged = download(y);
    FLAME_ASSERT_OK(flame_lora_merge(lora));
    int32_t merged = 0;
    FLAME_ASSERT_OK(flame_lora_is_merged(lora, &merged));
    EXPECT_EQ(merged, 1);
    FLAME_EXPECT_STATUS(flame_lora_merge(lora), FLAME_ERROR_INVALID_ARGUMENT);
    const std::vector<double> wm = download(w).values();
    T ym;
    FLAME_ASSERT_OK(flame_lora_forward(lora, x, ym.out()));
    const std::vector<double> got = download(ym).values(), ref = y_unmerged.values(), xv = xh.values();
    // Rounding of the unmerged output (base, adapter path, sum) and of the merged weight and output:
    // 2u (S + |b| + |base| + |adapter| + 2|y|), S = sum |x| |W merged|, plus f32 accumulation.
    const double u = unit_roundoff(dt);
    int bad = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < out; ++j) {
        double sum_xw = 0;
        for (int64_t q = 0; q < in; ++q) sum_xw += std::fabs(xv[static_cast<size_t>(i * in + q)] * wm[static_cast<size_t>(j * in + q)]);
        const size_t k = static_cast<size_t>(i * out + j);
        const double mag = sum_xw + std::fabs(bh.values()[static_cast<size_t>(j)]) + std::fabs(base_b[k]) +
                           std::fabs(scale * d[k]) + 2 * std::fabs(ref[k]);
        if (std::fabs(got[k] - ref[k]) > 2 * u * mag + 16 * std::ldexp(1.0, -24) * (sum_xw + 1)) {
          if (bad++ < 5) ADD_FAILURE() << "[" << i << "," << j << "] merged " << got[k] << " vs unmerged " << ref[k];
        }
      }
    EXPECT_EQ(bad, 0);
    // The merged weight is W + scale B A, rounded once.
    std::vector<double> wref = wh.values();
    for (int64_t o = 0; o < out; ++o)
      for (int64_t q = 0; q < in; ++q) {
        double s = 0;
        for (int64_t k = 0; k < rank; ++k) s += bv.values()[static_cast<size_t>(o * rank + k)] * av[static_cast<size_t>(k * in + q)];
        wref[static_cast<size_t>(o * in + q)] += scale * s;
      }
    EXPECT_TRUE(matches(w, HT::from_values({out, in}, dt, wref), dt == FLAME_DTYPE_F32 ? Tol{1e-6, 1e-6} : tol_for(dt)));

    // Unmerged: the weight exactly as before, and the unmerged output again.
    FLAME_ASSERT_OK(flame_lora_unmerge(lora));
    EXPECT_TRUE(matches(w, wh, Tol{0, 0}));
    FLAME_EXPECT_STATUS(flame_lora_unmerge(lora), FLAME_ERROR_INVALID_ARGUMENT);
    FLAME_ASSERT_OK(flame_lora_is_merged(lora, &merged));
    EXPECT_EQ(merged, 0);
    T y2;
    FLAME_ASSERT_OK(flame_lora_forward(lora, x, y2.out()));
    EXPECT_TRUE(matches(y2, y_unmerged, tol_for(dt)));
    flame_lora_release(lora);
  }
}

TEST_F(Lora, InitialisationFollowsTheContextGenerator) {
  T w = upload(ctx, HT({4, 9}, FLAME_DTYPE_BF16, 0.5));
  flame_lora_t l1 = nullptr, l2 = nullptr;
  FLAME_ASSERT_OK(flame_ctx_set_rng_state(ctx, 42, 1000));
  FLAME_ASSERT_OK(flame_lora_create(w, nullptr, 2, 2.0, &l1));
  FLAME_ASSERT_OK(flame_ctx_set_rng_state(ctx, 42, 1000));
  FLAME_ASSERT_OK(flame_lora_create(w, nullptr, 2, 2.0, &l2));
  T a1, b1, a2, b2;
  FLAME_ASSERT_OK(flame_lora_adapters(l1, a1.out(), b1.out()));
  FLAME_ASSERT_OK(flame_lora_adapters(l2, a2.out(), b2.out()));
  EXPECT_TRUE(matches(a1, download(a2), Tol{0, 0}));
  // A 3-D input: leading dims kept.
  T x = upload(ctx, HT({2, 3, 9}, FLAME_DTYPE_BF16, 1.0)), y;
  FLAME_ASSERT_OK(flame_lora_forward(l1, x, y.out()));
  EXPECT_EQ(shape_of(y), (Shape{2, 3, 4}));
  EXPECT_TRUE(matches(y, HT({2, 3, 4}, FLAME_DTYPE_BF16, 4.5), Tol{0, 0}));  // B = 0, no bias
  flame_lora_release(l1);
  flame_lora_release(l2);
}

TEST_F(Lora, BadInputIsRejected) {
  T w = upload(ctx, HT({4, 3}, FLAME_DTYPE_F32, 1.0)), b = upload(ctx, HT({4}, FLAME_DTYPE_F32, 0.0));
  T w1 = upload(ctx, HT({4}, FLAME_DTYPE_F32, 1.0)), wi = upload(ctx, HT({4, 3}, FLAME_DTYPE_I32, 1.0));
  T wg = upload(ctx, HT({4, 3}, FLAME_DTYPE_F32, 1.0)), b5 = upload(ctx, HT({5}, FLAME_DTYPE_F32, 0.0));
  T b16 = upload(ctx, HT({4}, FLAME_DTYPE_BF16, 0.0));
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(wg, 1));
  flame_lora_t l = reinterpret_cast<flame_lora_t>(0x10);
  auto expect = [&](flame_status_t st, flame_tensor_t weight, flame_tensor_t bias, int64_t rank, double alpha) {
    l = reinterpret_cast<flame_lora_t>(0x10);
    FLAME_EXPECT_STATUS(flame_lora_create(weight, bias, rank, alpha, &l), st);
    EXPECT_EQ(l, nullptr);
  };
  expect(FLAME_ERROR_INVALID_ARGUMENT, wg, b, 2, 1.0);
  expect(FLAME_ERROR_SHAPE_MISMATCH, w1, nullptr, 2, 1.0);
  expect(FLAME_ERROR_DTYPE_MISMATCH, wi, nullptr, 2, 1.0);
  expect(FLAME_ERROR_SHAPE_MISMATCH, w, b5, 2, 1.0);
  expect(FLAME_ERROR_DTYPE_MISMATCH, w, b16, 2, 1.0);
  expect(FLAME_ERROR_INVALID_ARGUMENT, w, b, 0, 1.0);
  expect(FLAME_ERROR_INVALID_ARGUMENT, w, b, 2, NAN);
  FLAME_ASSERT_OK(flame_lora_create(w, b, 2, 1.0, &l));
  T x16 = upload(ctx, HT({2, 3}, FLAME_DTYPE_BF16, 1.0)), x4 = upload(ctx, HT({2, 4}, FLAME_DTYPE_F32, 1.0));
  flame_tensor_t y = nullptr;
  HREF_EXPECT_FAIL(FLAME_ERROR_DTYPE_MISMATCH, y, flame_lora_forward(l, x16, &y));
  HREF_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, y, flame_lora_forward(l, x4, &y));
  flame_tensor_t a = href::sentinel(), bb = href::sentinel();
  FLAME_EXPECT_STATUS(flame_lora_adapters(l, &a, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(a, nullptr);
  flame_lora_release(l);
  FLAME_EXPECT_STATUS(flame_lora_adapters(l, &a, &bb), FLAME_ERROR_INVALID_HANDLE);
  EXPECT_EQ(a, nullptr);
  EXPECT_EQ(bb, nullptr);
  flame_lora_release(nullptr);
}

}  // namespace

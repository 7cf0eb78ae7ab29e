// Matrix products (flame_matmul, flame_bmm, flame_linear) against float64 host references: every
// floating dtype, all four transpose combinations (transposed views, never copied), odd and
// unaligned sizes (1, 7, 33, 1000), empty dims and K = 0, batched and broadcast operands, 1-D
// operands; gradients against the analytic host formulas; linear's fused epilogues against the
// separate-kernel path of a context created with FLAME_DISABLE_EPILOGUES=1; bad input.
// Finite-difference and second-order checks of the same ops are rows of test_gradcheck.cpp.
#include <cmath>
#include <cstdlib>
#include <vector>
#include "host_ref.h"

using namespace href;

namespace {

// Row-major host matrices in double, with batch.
struct Mat {
  int64_t batch = 1, rows = 0, cols = 0;
  std::vector<double> v;
  double at(int64_t q, int64_t i, int64_t j) const { return v[static_cast<size_t>((q * rows + i) * cols + j)]; }
};

Mat host_mm(const Mat& a, const Mat& b, bool a_shared = false, bool b_shared = false) {
  Mat o{std::max(a.batch, b.batch), a.rows, b.cols, {}};
  o.v.assign(static_cast<size_t>(o.batch * o.rows * o.cols), 0.0);
  for (int64_t q = 0; q < o.batch; ++q)
    for (int64_t i = 0; i < a.rows; ++i)
      for (int64_t j = 0; j < b.cols; ++j) {
        double s = 0;
        for (int64_t k = 0; k < a.cols; ++k) s += a.at(a_shared ? 0 : q, i, k) * b.at(b_shared ? 0 : q, k, j);
        o.v[static_cast<size_t>((q * o.rows + i) * o.cols + j)] = s;
      }
  return o;
}

Mat transpose(const Mat& a) {
  Mat t{a.batch, a.cols, a.rows, std::vector<double>(a.v.size())};
  for (int64_t q = 0; q < a.batch; ++q)
    for (int64_t i = 0; i < a.rows; ++i)
      for (int64_t j = 0; j < a.cols; ++j) t.v[static_cast<size_t>((q * a.cols + j) * a.rows + i)] = a.at(q, i, j);
  return t;
}

Mat random_mat(Rng& rng, int64_t batch, int64_t rows, int64_t cols, flame_dtype_t dt) {
  HT h = random(rng, {batch * rows * cols}, dt, -1.0, 1.0);
  return {batch, rows, cols, h.values()};
}

// A FLAME tensor holding m ([rows, cols], or [batch, rows, cols] when batched), stored transposed
// (a transposed view of a [cols, rows] tensor) when trans.
T upload_mat(flame_ctx_t ctx, const Mat& m, flame_dtype_t dt, bool trans, bool batched) {
  const Mat& stored = trans ? transpose(m) : m;
  Shape s = batched ? Shape{stored.batch, stored.rows, stored.cols} : Shape{stored.rows, stored.cols};
  T t = upload(ctx, HT::from_values(s, dt, stored.v));
  if (!trans) return t;
  T v;
  EXPECT_EQ(flame_transpose(t, -1, -2, v.out()), FLAME_OK) << flame_last_error_message();
  return v;
}

// |got - want| <= rtol |want| + atol, where atol grows with the reduction length K (accumulation
// error of products of values in [-1, 1]).
Tol gemm_tol(flame_dtype_t dt, int64_t K, bool tf32 = false) {
  const double k = static_cast<double>(std::max<int64_t>(K, 1));
  switch (dt) {
    case FLAME_DTYPE_F64: return {1e-12, 1e-13 * k};
    case FLAME_DTYPE_F32: return tf32 ? Tol{2e-3, 2e-3 * std::sqrt(k)} : Tol{1e-5, 2e-7 * k};
    case FLAME_DTYPE_F16: return {2e-3, 2e-3 + 2e-7 * k};
    case FLAME_DTYPE_BF16: return {1e-2, 1e-2 + 2e-7 * k};
    default: return {0, 0};
  }
}

::testing::AssertionResult mat_close(flame_tensor_t t, const Mat& want, flame_dtype_t dt, Tol tol) {
  HT got = download(t);
  std::vector<double> g = got.values();
  if (g.size() != want.v.size())
    return ::testing::AssertionFailure() << "size " << g.size() << ", expected " << want.v.size();
  int bad = 0;
  std::ostringstream msg;
  for (size_t i = 0; i < g.size(); ++i) {
    double w = round_to(want.v[i], dt);
    if (std::fabs(g[i] - w) <= tol.atol + tol.rtol * std::fabs(w)) continue;
    if (bad++ < 6) msg << "\n  [" << i << "] got " << g[i] << ", expected " << w;
  }
  if (!bad) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << g.size() << " differ (" << dname(dt) << ")" << msg.str();
}

Shape sizes_of(flame_tensor_t t) { return shape_of(t); }

class Matmul : public GpuTest {};

struct Dims3 {
  int64_t m, k, n;
};

TEST_F(Matmul, AllDtypesTransposesAndOddSizes) {
  HREF_RNG(rng);
  const Dims3 dims[] = {{1, 1, 1}, {7, 33, 1}, {1, 7, 33}, {33, 7, 1000}, {1000, 33, 7}, {64, 64, 64}, {13, 1000, 5}};
  for (flame_dtype_t dt : kFloatDtypes) {
    for (const Dims3& d : dims) {
      Mat a = random_mat(rng, 1, d.m, d.k, dt), b = random_mat(rng, 1, d.k, d.n, dt);
      Mat want = host_mm(a, b);
      for (int ta = 0; ta < 2; ++ta)
        for (int tb = 0; tb < 2; ++tb) {
          SCOPED_TRACE(::testing::Message() << dname(dt) << " " << d.m << "x" << d.k << "x" << d.n << " ta " << ta << " tb " << tb);
          T A = upload_mat(ctx, a, dt, ta, false), B = upload_mat(ctx, b, dt, tb, false), C;
          FLAME_ASSERT_OK(flame_matmul(A, B, C.out()));
          EXPECT_EQ(sizes_of(C), (Shape{d.m, d.n}));
          EXPECT_TRUE(is_contiguous(C));
          EXPECT_EQ(dtype_of(C), dt);
          EXPECT_TRUE(mat_close(C, want, dt, gemm_tol(dt, d.k)));
        }
    }
  }
}

TEST_F(Matmul, UnalignedOffsetsAndLeadingDims) {
  // Operands that start at odd element offsets and have odd leading dims (narrowed views): the
  // heuristic must pick algorithms that accept the alignment.
  HREF_RNG(rng);
  for (flame_dtype_t dt : {FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_F32}) {
    Mat big_a = random_mat(rng, 1, 37, 41, dt), big_b = random_mat(rng, 1, 41, 29, dt);
    T A0 = upload_mat(ctx, big_a, dt, false, false), B0 = upload_mat(ctx, big_b, dt, false, false), A, B, C;
    FLAME_ASSERT_OK(flame_narrow(A0, 1, 1, 33, A.out()));  // [37, 33], offset 1, ld 41
    FLAME_ASSERT_OK(flame_narrow(B0, 0, 3, 33, B.out()));  // [33, 29], offset 3*29
    FLAME_ASSERT_OK(flame_matmul(A, B, C.out()));
    Mat a{1, 37, 33, {}}, b{1, 33, 29, {}};
    for (int64_t i = 0; i < 37; ++i)
      for (int64_t k = 0; k < 33; ++k) a.v.push_back(big_a.at(0, i, k + 1));
    for (int64_t k = 0; k < 33; ++k)
      for (int64_t j = 0; j < 29; ++j) b.v.push_back(big_b.at(0, k + 3, j));
    EXPECT_TRUE(mat_close(C, host_mm(a, b), dt, gemm_tol(dt, 33))) << dname(dt);
  }
}

TEST_F(Matmul, EmptyDimsAndZeroK) {
  for (flame_dtype_t dt : kFloatDtypes) {
    T a = upload(ctx, HT({0, 4}, dt)), b = upload(ctx, HT({4, 3}, dt, 1.0)), c;
    FLAME_ASSERT_OK(flame_matmul(a, b, c.out()));
    EXPECT_EQ(sizes_of(c), (Shape{0, 3}));
    T a2 = upload(ctx, HT({5, 0}, dt)), b2 = upload(ctx, HT({0, 3}, dt)), c2;
    FLAME_ASSERT_OK(flame_matmul(a2, b2, c2.out()));  // an empty sum: zeros
    EXPECT_TRUE(matches(c2, HT({5, 3}, dt, 0.0)));
    T a3 = upload(ctx, HT({2, 0, 4}, dt)), b3 = upload(ctx, HT({2, 4, 3}, dt, 1.0)), c3;
    FLAME_ASSERT_OK(flame_bmm(a3, b3, c3.out()));
    EXPECT_EQ(sizes_of(c3), (Shape{2, 0, 3}));
  }
}

TEST_F(Matmul, TF32OnlyWhenTheContextOptsIn) {
  // IEEE f32 is exact for products of small integers summed below 2^24; TF32 rounds inputs to 10
  // mantissa bits, which 2049 = 2^11 + 1 does not survive.
  T a = upload(ctx, HT({1, 1}, FLAME_DTYPE_F32, 2049.0)), b = upload(ctx, HT({1, 1}, FLAME_DTYPE_F32, 1.0)), c;
  FLAME_ASSERT_OK(flame_matmul(a, b, c.out()));
  EXPECT_EQ(item(c), 2049.0);
  flame_ctx_options_t o;
  flame_ctx_options_init(&o);
  o.allow_tf32 = 1;
  flame_ctx_t tctx = nullptr;
  FLAME_ASSERT_OK(flame_ctx_create(&o, &tctx));
  {
    HREF_RNG(rng);
    Mat am = random_mat(rng, 1, 256, 512, FLAME_DTYPE_F32), bm = random_mat(rng, 1, 512, 128, FLAME_DTYPE_F32);
    T A = upload_mat(tctx, am, FLAME_DTYPE_F32, false, false), B = upload_mat(tctx, bm, FLAME_DTYPE_F32, true, false), C;
    FLAME_ASSERT_OK(flame_matmul(A, B, C.out()));
    EXPECT_TRUE(mat_close(C, host_mm(am, bm), FLAME_DTYPE_F32, gemm_tol(FLAME_DTYPE_F32, 512, true)));
  }
  flame_ctx_destroy(tctx);
}

// The default context times cuBLASLt's candidates for products of >= 2^30 multiply-adds
// (autotune); gemm_heuristic_only takes the heuristic's first choice. Both agree with float64 host
// dot products on 2000 sampled entries, twice in a row (the second call runs the cached, tuned
// plan), for M = N = K = 1024 and a rectangular GPT-2-like shape.
TEST_F(Matmul, AutotunedAndHeuristicOnlyContextsAgree) {
  flame_ctx_options_t o;
  flame_ctx_options_init(&o);
  o.gemm_heuristic_only = 1;
  flame_ctx_t hctx = nullptr;
  FLAME_ASSERT_OK(flame_ctx_create(&o, &hctx));
  HREF_RNG(rng);
  const Dims3 dims[] = {{1024, 1024, 1024}, {2048, 768, 1000}};
  for (flame_dtype_t dt : {FLAME_DTYPE_F32, FLAME_DTYPE_BF16, FLAME_DTYPE_F16}) {
    for (const Dims3& d : dims) {
      Mat am = random_mat(rng, 1, d.m, d.k, dt), bm = random_mat(rng, 1, d.k, d.n, dt);
      std::vector<std::pair<int64_t, int64_t>> at;
      for (int s = 0; s < 2000; ++s) at.emplace_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(d.m)), static_cast<int64_t>(rng() % static_cast<uint64_t>(d.n)));
      const Tol tol = gemm_tol(dt, d.k);
      for (flame_ctx_t c : {ctx, hctx}) {
        SCOPED_TRACE(::testing::Message() << dname(dt) << " " << d.m << "x" << d.k << "x" << d.n << (c == ctx ? " autotuned" : " heuristic only"));
        T A = upload_mat(c, am, dt, false, false), B = upload_mat(c, bm, dt, true, false);
        for (int call = 0; call < 2; ++call) {
          T C;
          FLAME_ASSERT_OK(flame_matmul(A, B, C.out()));
          std::vector<double> got = download(C).values();
          int bad = 0;
          for (auto [i, j] : at) {
            double want = 0;
            for (int64_t k = 0; k < d.k; ++k) want += am.at(0, i, k) * bm.at(0, k, j);
            want = round_to(want, dt);
            const double g = got[static_cast<size_t>(i * d.n + j)];
            if (std::fabs(g - want) > tol.atol + tol.rtol * std::fabs(want) && bad++ < 4)
              ADD_FAILURE() << "call " << call << " [" << i << "," << j << "] got " << g << ", expected " << want;
          }
          EXPECT_EQ(bad, 0);
        }
      }
    }
  }
  flame_ctx_destroy(hctx);
}

// ---------------------------------------------------------------- batches, broadcasting, 1-D

struct BatchCase {
  Shape a, b, out;
};

// NumPy matmul on HT (row-major values), for the batched cases.
HT host_matmul(const HT& a0, const HT& b0) {
  Shape sa = a0.shape, sb = b0.shape;
  if (sa.size() == 1) sa.insert(sa.begin(), 1);
  if (sb.size() == 1) sb.push_back(1);
  const int64_t M = sa[sa.size() - 2], K = sa.back(), N = sb.back();
  Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  Shape bs = broadcast_shapes(ba, bb);
  Shape out = bs;
  if (a0.shape.size() > 1) out.push_back(M);
  if (b0.shape.size() > 1) out.push_back(N);
  HT o(out, FLAME_DTYPE_F64);
  std::vector<double> av = a0.values(), bv = b0.values();
  const int64_t nb = numel_of(bs);
  Shape bi(bs.size());
  for (int64_t q = 0; q < nb; ++q) {
    int64_t r = q;
    for (int d = static_cast<int>(bs.size()) - 1; d >= 0; --d) { bi[d] = r % bs[d]; r /= bs[d]; }
    auto base = [&](const Shape& bshape, int64_t mat) {  // broadcast batch index -> matrix offset
      int64_t off = 0;
      for (size_t d = 0; d < bshape.size(); ++d) {
        int64_t i = bi[bs.size() - bshape.size() + d];
        off = off * bshape[d] + (bshape[d] == 1 ? 0 : i);
      }
      return off * mat;
    };
    const int64_t oa = base(ba, M * K), ob = base(bb, K * N);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += av[oa + i * K + k] * bv[ob + k * N + j];
        (*o.data)[static_cast<size_t>((q * M + i) * N + j)] = s;
      }
  }
  return o;
}

TEST_F(Matmul, BatchedBroadcastAndVectors) {
  HREF_RNG(rng);
  const BatchCase cases[] = {
      {{2, 3, 4}, {2, 4, 5}, {2, 3, 5}},    {{2, 3, 4}, {4, 5}, {2, 3, 5}},    {{3, 4}, {2, 4, 5}, {2, 3, 5}},
      {{2, 1, 3, 4}, {3, 4, 2}, {2, 3, 3, 2}}, {{4}, {2, 4, 5}, {2, 5}},       {{2, 3, 4}, {4}, {2, 3}},
      {{4}, {4}, {}},                        {{1, 7}, {7, 1}, {1, 1}},          {{2, 1, 3, 4}, {1, 5, 4, 2}, {2, 5, 3, 2}},
      {{6, 33, 7}, {7, 1000}, {6, 33, 1000}}};
  for (flame_dtype_t dt : kFloatDtypes) {
    for (const BatchCase& c : cases) {
      SCOPED_TRACE(::testing::Message() << dname(dt) << " " << to_string(c.a) << " @ " << to_string(c.b));
      HT a = random(rng, c.a, dt, -1, 1), b = random(rng, c.b, dt, -1, 1);
      T A = upload(ctx, a), B = upload(ctx, b), C;
      FLAME_ASSERT_OK(flame_matmul(A, B, C.out()));
      EXPECT_EQ(sizes_of(C), c.out);
      HT want = host_matmul(a, b);
      Mat w{1, 1, want.numel(), want.values()};
      EXPECT_TRUE(mat_close(C, w, dt, gemm_tol(dt, c.a.back())));
    }
  }
}

TEST_F(Matmul, PermutedAndTransposedBatchesNeedNoCopy) {
  // a: a permuted view [2, 3, 4] of a [3, 2, 4] tensor (batch stride 4, row stride 8); b: the
  // transpose of [2, 5, 4]. Neither is copied: the call allocates only its output.
  HREF_RNG(rng);
  const flame_dtype_t dt = FLAME_DTYPE_F32;
  HT a0 = random(rng, {3, 2, 4}, dt, -1, 1), b0 = random(rng, {2, 5, 4}, dt, -1, 1);
  T A0 = upload(ctx, a0), B0 = upload(ctx, b0), A, B, C, warm;
  const int32_t perm[3] = {1, 0, 2};
  FLAME_ASSERT_OK(flame_permute(A0, perm, 3, A.out()));
  FLAME_ASSERT_OK(flame_transpose(B0, 1, 2, B.out()));
  FLAME_ASSERT_OK(flame_matmul(A, B, warm.out()));  // creates the cuBLASLt workspace
  FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));
  flame_memory_stats_t before{}, after{};
  before.struct_size = after.struct_size = sizeof(flame_memory_stats_t);
  FLAME_ASSERT_OK(flame_ctx_reset_peak_memory(ctx));
  FLAME_ASSERT_OK(flame_ctx_memory_stats(ctx, &before));
  FLAME_ASSERT_OK(flame_matmul(A, B, C.out()));
  FLAME_ASSERT_OK(flame_ctx_memory_stats(ctx, &after));
  EXPECT_LE(after.peak_bytes_in_use - before.bytes_in_use, 2u * 3u * 5u * 4u + 512u) << "an operand was copied";
  HT ah(Shape{2, 3, 4}, dt), bh(Shape{2, 4, 5}, dt);
  for (int64_t q = 0; q < 2; ++q)
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t k = 0; k < 4; ++k) ah.at({q, i, k}) = a0.at({i, q, k});
  for (int64_t q = 0; q < 2; ++q)
    for (int64_t k = 0; k < 4; ++k)
      for (int64_t j = 0; j < 5; ++j) bh.at({q, k, j}) = b0.at({q, j, k});
  HT want = host_matmul(ah, bh);
  EXPECT_TRUE(mat_close(C, Mat{1, 1, want.numel(), want.values()}, dt, gemm_tol(dt, 4)));
}

// ---------------------------------------------------------------- gradients

// loss = sum(C * G) for a random G: dA = G B^T, dB = A^T G (summed over broadcast batches).
TEST_F(Matmul, GradientsMatchTheHostFormulas) {
  HREF_RNG(rng);
  struct G { Shape a, b; bool ta, tb; };
  const G cases[] = {{{33, 7}, {7, 1000}, false, false}, {{7, 33}, {33, 5}, true, true}, {{4, 33, 7}, {7, 9}, false, true},
                     {{9, 7}, {3, 7, 5}, true, false},   {{3, 9, 7}, {3, 7, 5}, false, false}};
  for (flame_dtype_t dt : kFloatDtypes) {
    for (const G& c : cases) {
      SCOPED_TRACE(::testing::Message() << dname(dt) << " " << to_string(c.a) << " @ " << to_string(c.b) << " ta " << c.ta
                                        << " tb " << c.tb);
      const int64_t ab = c.a.size() == 3 ? c.a[0] : 1, bb = c.b.size() == 3 ? c.b[0] : 1;
      const int64_t M = c.a[c.a.size() - 2], K = c.a.back(), N = c.b.back();
      Mat a = random_mat(rng, ab, M, K, dt), b = random_mat(rng, bb, K, N, dt);
      T A = upload_mat(ctx, a, dt, c.ta, c.a.size() == 3), B = upload_mat(ctx, b, dt, c.tb, c.b.size() == 3), C;
      FLAME_ASSERT_OK(flame_tensor_set_requires_grad(A, 1));
      FLAME_ASSERT_OK(flame_tensor_set_requires_grad(B, 1));
      FLAME_ASSERT_OK(flame_matmul(A, B, C.out()));
      const int64_t ob = std::max(ab, bb);
      Mat g = random_mat(rng, ob, M, N, dt);
      T Gt = upload_mat(ctx, g, dt, false, ob > 1 || c.a.size() == 3 || c.b.size() == 3);
      FLAME_ASSERT_OK(flame_backward(ctx, C, Gt, 0));
      Mat ga = host_mm(g, transpose(b), false, bb == 1), gb = host_mm(transpose(a), g, ab == 1, false);
      auto sum_batches = [](const Mat& m) {
        Mat s{1, m.rows, m.cols, std::vector<double>(static_cast<size_t>(m.rows * m.cols), 0.0)};
        for (int64_t q = 0; q < m.batch; ++q)
          for (size_t i = 0; i < s.v.size(); ++i) s.v[i] += m.v[static_cast<size_t>(q) * s.v.size() + i];
        return s;
      };
      if (ab == 1) ga = sum_batches(ga);
      if (bb == 1) gb = sum_batches(gb);
      T dA, dB;
      FLAME_ASSERT_OK(flame_tensor_grad(A, dA.out()));
      FLAME_ASSERT_OK(flame_tensor_grad(B, dB.out()));
      EXPECT_EQ(sizes_of(dA), sizes_of(A));
      EXPECT_EQ(sizes_of(dB), sizes_of(B));
      EXPECT_TRUE(mat_close(dA, ga, dt, gemm_tol(dt, N * ob)));
      EXPECT_TRUE(mat_close(dB, gb, dt, gemm_tol(dt, M * ob)));
    }
  }
}

// ---------------------------------------------------------------- linear and its epilogues

double gelu_tanh(double x) { return 0.5 * x * (1 + std::tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x))); }
double gelu_tanh_deriv(double x) {
  const double k = 0.79788456080286535588, t = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}

struct LinearResult {
  HT y, gx, gw, gb;
};

// Runs linear forward and backward (loss = sum(y * G)) in ctx and downloads everything.
LinearResult run_linear(flame_ctx_t c, const HT& x, const HT& w, const HT* b, const HT& g, int act) {
  LinearResult r;
  T X = upload(c, x), W = upload(c, w), B, Y, G = upload(c, g);
  if (b) B = upload(c, *b);
  EXPECT_EQ(flame_tensor_set_requires_grad(X, 1), FLAME_OK);
  EXPECT_EQ(flame_tensor_set_requires_grad(W, 1), FLAME_OK);
  if (b) {
    EXPECT_EQ(flame_tensor_set_requires_grad(B, 1), FLAME_OK);
  }
  flame_status_t st = flame_linear(X, W, b ? B.h : nullptr, act, Y.out());
  EXPECT_EQ(st, FLAME_OK) << flame_last_error_message();
  if (st != FLAME_OK) return r;
  r.y = download(Y);
  EXPECT_EQ(flame_backward(c, Y, G, 0), FLAME_OK) << flame_last_error_message();
  T gx, gw, gb;
  EXPECT_EQ(flame_tensor_grad(X, gx.out()), FLAME_OK);
  EXPECT_EQ(flame_tensor_grad(W, gw.out()), FLAME_OK);
  r.gx = download(gx);
  r.gw = download(gw);
  if (b) {
    EXPECT_EQ(flame_tensor_grad(B, gb.out()), FLAME_OK);
    r.gb = download(gb);
  }
  return r;
}

// Host float64 linear forward and backward. relu_mask_from (may be NULL): the device's relu output,
// whose zeros decide relu's mask where a pre-activation within rounding of 0 could flip it.
LinearResult host_linear(const HT& x, const HT& w, const HT* b, const HT& g, int act, const HT* relu_mask_from = nullptr) {
  const int64_t O = w.shape[0], I = w.shape[1], R = x.numel() / I;
  std::vector<double> xv = x.values(), wv = w.values(), gv = g.values(), bv = b ? b->values() : std::vector<double>();
  const std::vector<double> mask = relu_mask_from ? relu_mask_from->values() : std::vector<double>();
  std::vector<double> z(static_cast<size_t>(R * O)), y(z.size()), dz(z.size());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t o = 0; o < O; ++o) {
      double s = b ? bv[o] : 0.0;
      for (int64_t i = 0; i < I; ++i) s += xv[r * I + i] * wv[o * I + i];
      const size_t p = static_cast<size_t>(r * O + o);
      z[p] = s;
      y[p] = act == FLAME_ACTIVATION_RELU ? std::max(s, 0.0) : act == FLAME_ACTIVATION_GELU_TANH ? gelu_tanh(s) : s;
      const bool on = mask.empty() ? s > 0 : mask[p] > 0;
      double d = act == FLAME_ACTIVATION_RELU ? (on ? 1.0 : 0.0) : act == FLAME_ACTIVATION_GELU_TANH ? gelu_tanh_deriv(s) : 1.0;
      dz[p] = gv[p] * d;
    }
  LinearResult h;
  Shape ys = x.shape;
  ys.back() = O;
  h.y = HT::from_values(ys, FLAME_DTYPE_F64, y);
  std::vector<double> gx(static_cast<size_t>(R * I), 0.0), gw(static_cast<size_t>(O * I), 0.0), gb(static_cast<size_t>(O), 0.0);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t o = 0; o < O; ++o) {
      const double d = dz[static_cast<size_t>(r * O + o)];
      gb[o] += d;
      for (int64_t i = 0; i < I; ++i) {
        gx[r * I + i] += d * wv[o * I + i];
        gw[o * I + i] += d * xv[r * I + i];
      }
    }
  h.gx = HT::from_values(x.shape, FLAME_DTYPE_F64, gx);
  h.gw = HT::from_values(w.shape, FLAME_DTYPE_F64, gw);
  h.gb = HT::from_values({O}, FLAME_DTYPE_F64, gb);
  return h;
}

// Tolerance for results that went through a rounded intermediate (dz in f16/bf16 before a GEMM).
Tol chain_tol(flame_dtype_t dt, int64_t K) {
  const double r = std::sqrt(static_cast<double>(std::max<int64_t>(K, 1)));
  switch (dt) {
    case FLAME_DTYPE_F64: return {1e-7, 1e-9 * r};  // gelu's 1 + tanh(u) cancels for negative inputs
    case FLAME_DTYPE_F32: return {1e-4, 1e-5 * r};
    case FLAME_DTYPE_F16: return {4e-3, 3e-3 * r};
    default: return {2e-2, 2e-2 * r};
  }
}

::testing::AssertionResult near(const HT& got, const HT& want, flame_dtype_t dt, Tol tol, const char* what) {
  Mat w{1, 1, want.numel(), want.values()};
  std::vector<double> g = got.values();
  if (got.shape != want.shape)
    return ::testing::AssertionFailure() << what << ": shape " << to_string(got.shape) << ", expected " << to_string(want.shape);
  int bad = 0;
  std::ostringstream msg;
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::fabs(g[i] - w.v[i]) <= tol.atol + tol.rtol * std::fabs(w.v[i])) continue;
    if (bad++ < 6) msg << "\n  [" << i << "] got " << g[i] << ", expected " << w.v[i];
  }
  if (!bad) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << g.size() << " differ (" << dname(dt) << ")" << msg.str();
}

// A context whose matrix products never use cuBLASLt epilogues (the separate-kernel path).
flame_ctx_t unfused_context() {
  setenv("FLAME_DISABLE_EPILOGUES", "1", 1);
  flame_ctx_options_t o;
  flame_ctx_options_init(&o);
  flame_ctx_t c = nullptr;
  flame_status_t st = flame_ctx_create(&o, &c);
  unsetenv("FLAME_DISABLE_EPILOGUES");
  EXPECT_EQ(st, FLAME_OK) << flame_last_error_message();
  return c;
}

class Linear : public GpuTest {};

TEST_F(Linear, FusedAndUnfusedPathsMatchTheHostReference) {
  HREF_RNG(rng);
  flame_ctx_t plain = unfused_context();
  ASSERT_NE(plain, nullptr);
  struct S { Shape x; int64_t out; };
  const S shapes[] = {{{3, 11, 40}, 24}, {{50, 33}, 7}, {{5, 1}, 8}, {{1000, 64}, 1000}};
  for (flame_dtype_t dt : kFloatDtypes) {
    for (const S& sh : shapes) {
      const int64_t in = sh.x.back();
      HT xa = random(rng, sh.x, dt, -1, 1), wa = random(rng, {sh.out, in}, dt, -1, 1), ba = random(rng, {sh.out}, dt, -1, 1);
      Shape ys = sh.x;
      ys.back() = sh.out;
      HT g = random(rng, ys, dt, -1, 1);
      // relu: small x and W with |b| >= 1 keep the pre-activation away from 0, where rounding the
      // separate-kernel path's GEMM output (f16/bf16) may flip the mask against the host's.
      HT xs = random(rng, sh.x, dt, -0.1, 0.1), ws = random(rng, {sh.out, in}, dt, -0.1 / std::sqrt(in / 10.0 + 1), 0.1 / std::sqrt(in / 10.0 + 1));
      HT bs = random(rng, {sh.out}, dt, 1.0, 2.0);
      for (double& v : *bs.data) v = (&v - bs.data->data()) % 2 ? -v : v;
      for (int act = 0; act <= 2; ++act) {
        const HT& x = act == 1 ? xs : xa;
        const HT& w = act == 1 ? ws : wa;
        const HT& b = act == 1 ? bs : ba;
        for (int with_bias = 0; with_bias <= 1; ++with_bias) {
          SCOPED_TRACE(::testing::Message() << dname(dt) << " x " << to_string(sh.x) << " out " << sh.out << " act " << act
                                            << " bias " << with_bias);
          const HT* bp = with_bias ? &b : nullptr;
          const int64_t R = x.numel() / in;
          for (flame_ctx_t c : {ctx, plain}) {
            SCOPED_TRACE(c == ctx ? "fused" : "unfused");
            LinearResult got = run_linear(c, x, w, bp, g, act);
            // Without a bias a relu pre-activation can sit within rounding of 0: take the mask the
            // device computed (its y) so that one flipped element does not fail a correct backward.
            LinearResult want = host_linear(x, w, bp, g, act, act == FLAME_ACTIVATION_RELU ? &got.y : nullptr);
            EXPECT_TRUE(near(got.y, want.y, dt, chain_tol(dt, in), "y"));
            EXPECT_TRUE(near(got.gx, want.gx, dt, chain_tol(dt, sh.out), "grad x"));
            EXPECT_TRUE(near(got.gw, want.gw, dt, chain_tol(dt, R), "grad weight"));
            if (bp) {
              EXPECT_TRUE(near(got.gb, want.gb, dt, chain_tol(dt, R), "grad bias"));
            }
          }
        }
      }
    }
  }
  flame_ctx_destroy(plain);
}

// ---- cross-node fusion: Linear -> activation -> Linear
// The second layer's dgrad GEMM applies the first layer's DGELU / DRELU (+ BGRAD) in its epilogue
// (autograd/engine.cpp). Checked against the host chain rule, on both contexts, for a 3-D input
// (reshapes between the layers), a three-layer chain (a fused pre-activation gradient fused again),
// and with a hook or retain_grad on the hidden output, where fusing would be wrong.

struct Layer {
  HT w, b;
  int act;
};

// Runs the chain x -> layers, loss = sum(y * G); `observe` 1 puts a hook doubling the first hidden
// gradient, 2 retains that gradient (returned in `hidden_grad`). Returns grad x, then grad W and b
// of each layer.
std::vector<HT> run_chain(flame_ctx_t c, const HT& x, const std::vector<Layer>& layers, const HT& g, int observe,
                          HT* hidden_grad) {
  std::vector<HT> out;
  T X = upload(c, x);
  EXPECT_EQ(flame_tensor_set_requires_grad(X, 1), FLAME_OK);
  std::vector<T> W, B, H;
  std::vector<flame_hook_t> hooks;
  flame_tensor_t cur = X;  // borrowed: the input of the next layer
  for (size_t l = 0; l < layers.size(); ++l) {
    W.push_back(upload(c, layers[l].w));
    B.push_back(upload(c, layers[l].b));
    EXPECT_EQ(flame_tensor_set_requires_grad(W.back(), 1), FLAME_OK);
    EXPECT_EQ(flame_tensor_set_requires_grad(B.back(), 1), FLAME_OK);
    T y;
    EXPECT_EQ(flame_linear(cur, W.back(), B.back(), layers[l].act, y.out()), FLAME_OK) << flame_last_error_message();
    if (l == 0 && observe == 1) {
      auto doubler = [](void*, flame_tensor_t gr, flame_tensor_t* rep) { return flame_mul_scalar(gr, 2.0, rep); };
      flame_hook_t hook = nullptr;
      EXPECT_EQ(flame_tensor_register_hook(y, doubler, nullptr, nullptr, &hook), FLAME_OK) << flame_last_error_message();
      hooks.push_back(hook);
    }
    if (l == 0 && observe == 2) {
      EXPECT_EQ(flame_tensor_retain_grad(y), FLAME_OK);
    }
    H.push_back(std::move(y));
    cur = H.back();
  }
  T G = upload(c, g);
  EXPECT_EQ(flame_backward(c, cur, G, 0), FLAME_OK) << flame_last_error_message();
  T gx;
  EXPECT_EQ(flame_tensor_grad(X, gx.out()), FLAME_OK);
  out.push_back(download(gx));
  for (size_t l = 0; l < layers.size(); ++l) {
    T gw, gb;
    EXPECT_EQ(flame_tensor_grad(W[l], gw.out()), FLAME_OK);
    EXPECT_EQ(flame_tensor_grad(B[l], gb.out()), FLAME_OK);
    out.push_back(download(gw));
    out.push_back(download(gb));
  }
  for (flame_hook_t h : hooks) flame_hook_remove(h);
  if (observe == 2) {
    T hg;
    EXPECT_EQ(flame_tensor_grad(H[0], hg.out()), FLAME_OK);
    *hidden_grad = download(hg);
  }
  return out;
}

// The same chain on the host in float64 (the hidden values rounded to dt, as the device stores them).
std::vector<HT> host_chain(const HT& x, const std::vector<Layer>& layers, const HT& g, flame_dtype_t dt, double hook_scale,
                           HT* hidden_grad) {
  std::vector<HT> ins{x};
  for (size_t l = 0; l + 1 < layers.size(); ++l) {
    HT y = host_linear(ins.back(), layers[l].w, &layers[l].b, HT::from_values(ins.back().shape, FLAME_DTYPE_F64,
                       std::vector<double>(static_cast<size_t>(ins.back().numel()), 0.0)), layers[l].act).y;
    for (double& v : *y.data) v = round_to(v, dt);  // the device stores the hidden output in dt
    ins.push_back(y);
  }
  std::vector<HT> grads(1 + 2 * layers.size());
  HT up = g;
  for (size_t l = layers.size(); l-- > 0;) {
    HT in = ins[l];
    if (l == 0 && hidden_grad) *hidden_grad = up;
    if (l == 0 && hook_scale != 1.0)
      for (double& v : *up.data) v *= hook_scale;
    LinearResult r = host_linear(in, layers[l].w, &layers[l].b, up, layers[l].act);
    grads[1 + 2 * l] = r.gw;
    grads[2 + 2 * l] = r.gb;
    up = r.gx;
  }
  grads[0] = up;
  return grads;
}

TEST_F(Linear, ActivationGradientsFuseAcrossLayers) {
  HREF_RNG(rng);
  flame_ctx_t plain = unfused_context();
  ASSERT_NE(plain, nullptr);
  struct Case { std::vector<int> acts; int observe; };
  const Case cases[] = {{{2, 0}, 0}, {{2, 2, 0}, 0}, {{1, 0}, 0}, {{1, 2, 1}, 0}, {{2, 0}, 1}, {{2, 0}, 2}, {{1, 0}, 2}};
  const int64_t dims[] = {40, 72, 56, 24};  // in, then each layer's out (not multiples of 128: a padded relu mask)
  for (flame_dtype_t dt : kFloatDtypes) {
    for (const Case& cs : cases) {
      SCOPED_TRACE(::testing::Message() << dname(dt) << " acts " << cs.acts[0] << cs.acts[1] << " observe " << cs.observe);
      const Shape xs{3, 11, dims[0]};  // a 3-D input: reshapes sit between the layers
      // Small inputs and weights, biases of magnitude 1..2 with alternating signs: relu's
      // pre-activations stay away from 0, where rounding could flip the mask against the host's.
      HT x = random(rng, xs, dt, -0.1, 0.1);
      std::vector<Layer> layers;
      for (size_t l = 0; l < cs.acts.size(); ++l) {
        const int64_t in = dims[l], out = dims[l + 1];
        const double ws = 0.3 / std::sqrt(static_cast<double>(in));
        HT b = random(rng, {out}, dt, 1.0, 2.0);
        for (double& v : *b.data) v = (&v - b.data->data()) % 2 ? -v : v;
        layers.push_back({random(rng, {out, in}, dt, -ws, ws), b, cs.acts[l]});
      }
      Shape ys = xs;
      ys.back() = dims[cs.acts.size()];
      HT g = random(rng, ys, dt, -1, 1);
      HT want_hidden, got_hidden;
      std::vector<HT> want = host_chain(x, layers, g, dt, cs.observe == 1 ? 2.0 : 1.0, cs.observe == 2 ? &want_hidden : nullptr);
      for (flame_ctx_t c : {ctx, plain}) {
        SCOPED_TRACE(c == ctx ? "fused" : "unfused");
        std::vector<HT> got = run_chain(c, x, layers, g, cs.observe, &got_hidden);
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) {
          // grad x and grad W sum over out features / rows; 3 chained roundings in f16/bf16
          const int64_t K = i == 0 ? dims[1] : 33 * 4;
          EXPECT_TRUE(near(got[i], want[i], dt, chain_tol(dt, K), i == 0 ? "grad x" : i % 2 ? "grad weight" : "grad bias"))
              << "gradient " << i;
        }
        if (cs.observe == 2) {
          EXPECT_TRUE(near(got_hidden, want_hidden, dt, chain_tol(dt, dims[2]), "retained hidden grad"));
        }
      }
    }
  }
  flame_ctx_destroy(plain);
}

TEST_F(Linear, BadInputIsRejectedWithNoOutput) {
  T x = upload(ctx, HT({4, 3}, FLAME_DTYPE_F32, 1.0)), w = upload(ctx, HT({5, 3}, FLAME_DTYPE_F32, 1.0));
  T b = upload(ctx, HT({5}, FLAME_DTYPE_F32, 1.0)), b_bad = upload(ctx, HT({4}, FLAME_DTYPE_F32, 1.0));
  T w16 = upload(ctx, HT({5, 3}, FLAME_DTYPE_F16, 1.0)), w_bad = upload(ctx, HT({5, 4}, FLAME_DTYPE_F32, 1.0));
  T w3 = upload(ctx, HT({1, 5, 3}, FLAME_DTYPE_F32, 1.0)), xi = upload(ctx, HT({4, 3}, FLAME_DTYPE_I32, 1.0));
  flame_tensor_t out = sentinel();
  FLAME_EXPECT_STATUS(flame_linear(x, w, b_bad, 0, &out), FLAME_ERROR_SHAPE_MISMATCH);
  EXPECT_EQ(out, nullptr);
  FLAME_EXPECT_STATUS(flame_linear(x, w_bad, b, 0, &out), FLAME_ERROR_SHAPE_MISMATCH);
  FLAME_EXPECT_STATUS(flame_linear(x, w3, nullptr, 0, &out), FLAME_ERROR_SHAPE_MISMATCH);
  FLAME_EXPECT_STATUS(flame_linear(x, w16, nullptr, 0, &out), FLAME_ERROR_DTYPE_MISMATCH);
  FLAME_EXPECT_STATUS(flame_linear(xi, w, nullptr, 0, &out), FLAME_ERROR_DTYPE_MISMATCH);
  FLAME_EXPECT_STATUS(flame_linear(x, w, b, 3, &out), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_linear(x, w, b, -1, &out), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_linear(nullptr, w, b, 0, &out), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_linear(x, nullptr, b, 0, &out), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_linear(x, w, b, 0, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);
}

TEST_F(Matmul, BadInputIsRejectedWithNoOutput) {
  T a = upload(ctx, HT({4, 3}, FLAME_DTYPE_F32, 1.0)), b = upload(ctx, HT({4, 3}, FLAME_DTYPE_F32, 1.0));
  T b16 = upload(ctx, HT({3, 2}, FLAME_DTYPE_BF16, 1.0)), ai = upload(ctx, HT({4, 3}, FLAME_DTYPE_I64, 1.0));
  T bi = upload(ctx, HT({3, 2}, FLAME_DTYPE_I64, 1.0)), s = upload(ctx, HT({}, FLAME_DTYPE_F32, 1.0));
  T a3 = upload(ctx, HT({2, 4, 3}, FLAME_DTYPE_F32, 1.0)), b3 = upload(ctx, HT({3, 3, 2}, FLAME_DTYPE_F32, 1.0));
  T c3 = upload(ctx, HT({3, 4, 3}, FLAME_DTYPE_F32, 1.0)), d3 = upload(ctx, HT({2, 3, 5}, FLAME_DTYPE_F32, 1.0));
  flame_tensor_t out = sentinel();
  FLAME_EXPECT_STATUS(flame_matmul(a, b, &out), FLAME_ERROR_SHAPE_MISMATCH);
  EXPECT_EQ(out, nullptr);
  FLAME_EXPECT_STATUS(flame_matmul(a, b16, &out), FLAME_ERROR_DTYPE_MISMATCH);
  FLAME_EXPECT_STATUS(flame_matmul(ai, bi, &out), FLAME_ERROR_DTYPE_MISMATCH);
  FLAME_EXPECT_STATUS(flame_matmul(s, a, &out), FLAME_ERROR_SHAPE_MISMATCH);
  FLAME_EXPECT_STATUS(flame_matmul(a3, b3, &out), FLAME_ERROR_SHAPE_MISMATCH);  // batch 2 vs 3
  FLAME_EXPECT_STATUS(flame_bmm(a3, c3, &out), FLAME_ERROR_SHAPE_MISMATCH);
  FLAME_EXPECT_STATUS(flame_bmm(a, b, &out), FLAME_ERROR_SHAPE_MISMATCH);
  FLAME_EXPECT_STATUS(flame_matmul(nullptr, b, &out), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_matmul(a, b, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);
  T ok;
  FLAME_ASSERT_OK(flame_bmm(a3, d3, ok.out()));
  EXPECT_EQ(sizes_of(ok), (Shape{2, 4, 5}));
}

TEST_F(Matmul, OperandsFromAnotherContextAreRejected) {
  flame_ctx_options_t o;
  flame_ctx_options_init(&o);
  flame_ctx_t other = nullptr;
  FLAME_ASSERT_OK(flame_ctx_create(&o, &other));
  {
    T a = upload(ctx, HT({2, 2}, FLAME_DTYPE_F32, 1.0)), b = upload(other, HT({2, 2}, FLAME_DTYPE_F32, 1.0));
    flame_tensor_t out = sentinel();
    FLAME_EXPECT_STATUS(flame_matmul(a, b, &out), FLAME_ERROR_INVALID_ARGUMENT);
    FLAME_EXPECT_STATUS(flame_linear(a, b, nullptr, 0, &out), FLAME_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(out, nullptr);
  }
  flame_ctx_destroy(other);
}

}  // namespace

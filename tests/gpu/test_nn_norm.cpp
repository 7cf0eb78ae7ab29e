// Softmax, log_softmax, layer_norm, rms_norm, group_norm and batch_norm (FLAME_NN_OPS of
// src/tensor/op_list.h) through the C ABI:
//  - forward and first-order backward against float64 host references on fresh random inputs, for
//    f32, f64, f16 and bf16, contiguous and transposed inputs, and row lengths that exercise every
//    kernel path (1, 7, 33, 1000, 2500, 4097, 5000, 9000, 16384, 24576, 40000; many short rows; many long rows; columns of a
//    middle dim);
//  - gradients against finite differences (gradcheck.h), first order in every dtype and second
//    order (create_graph, composed backward) in f64;
//  - batch_norm's running statistics, and bad arguments (status, NULL result, nothing changed).
// Reproduce a failure with FLAME_GRADCHECK_SEED=<seed printed in the failure>.
#include <cmath>
#include <set>

#include "gradcheck.h"

using namespace gc;

namespace {

constexpr flame_dtype_t kDtypes[] = {FLAME_DTYPE_F32, FLAME_DTYPE_F64, FLAME_DTYPE_F16, FLAME_DTYPE_BF16};

// ------------------------------------------------------------------ host references (float64)

struct Geo {  // x seen as [outer, D, inner]
  int64_t outer = 1, D = 1, inner = 1;
};
Geo geo_of(const Shape& s, int dim) {
  Geo g;
  for (int d = 0; d < static_cast<int>(s.size()); ++d) (d < dim ? g.outer : (d == dim ? g.D : g.inner)) *= s[d];
  return g;
}

HT ref_softmax(const HT& x, int dim0, bool log) {
  if (x.ndim() == 0) return HT({}, log ? 0.0 : 1.0);
  int dim = norm_dim(dim0, x.ndim());
  Geo g = geo_of(x.shape, dim);
  HT y(x.shape);
  for (int64_t o = 0; o < g.outer; ++o)
    for (int64_t i = 0; i < g.inner; ++i) {
      auto at = [&](int64_t d) { return (o * g.D + d) * g.inner + i; };
      double m = -INFINITY, s = 0;
      for (int64_t d = 0; d < g.D; ++d) m = std::max(m, x.v[at(d)]);
      for (int64_t d = 0; d < g.D; ++d) s += std::exp(x.v[at(d)] - m);
      for (int64_t d = 0; d < g.D; ++d) y.v[at(d)] = log ? x.v[at(d)] - m - std::log(s) : std::exp(x.v[at(d)] - m) / s;
    }
  return y;
}

// dx of softmax / log_softmax from the output y and the incoming gradient gr.
HT ref_softmax_grad(const HT& y, const HT& gr, int dim, bool log) {
  Geo g = geo_of(y.shape, norm_dim(dim, y.ndim()));
  HT dx(y.shape);
  for (int64_t o = 0; o < g.outer; ++o)
    for (int64_t i = 0; i < g.inner; ++i) {
      auto at = [&](int64_t d) { return (o * g.D + d) * g.inner + i; };
      double s = 0;
      for (int64_t d = 0; d < g.D; ++d) s += log ? gr.v[at(d)] : gr.v[at(d)] * y.v[at(d)];
      for (int64_t d = 0; d < g.D; ++d)
        dx.v[at(d)] = log ? gr.v[at(d)] - std::exp(y.v[at(d)]) * s : y.v[at(d)] * (gr.v[at(d)] - s);
    }
  return dx;
}

// A normalisation over sets of elements of x ("rows", given as element indices), with an affine
// index per element (-1: no affine). Gives y and, for an incoming gradient gr, dx, dw, db.
struct NormSets {
  std::vector<std::vector<int64_t>> sets;
  std::vector<int64_t> widx;  // per element of x
  int64_t wlen = 0;
  bool centre = true;
};
struct NormRef {
  HT y, dx, dw, db;
};

NormRef ref_norm(const NormSets& ns, const HT& x, const HT* w, const HT* b, double eps, const HT* gr,
                 const std::vector<double>* fixed_mean = nullptr, const std::vector<double>* fixed_var = nullptr) {
  NormRef r{HT(x.shape), HT(x.shape), HT({ns.wlen}), HT({ns.wlen})};
  for (size_t s = 0; s < ns.sets.size(); ++s) {
    const auto& e = ns.sets[s];
    const double n = static_cast<double>(e.size());
    double mean = 0, var = 0;
    if (fixed_mean) {
      mean = (*fixed_mean)[s];
      var = (*fixed_var)[s];
    } else {
      if (ns.centre)
        for (int64_t i : e) mean += x.v[i] / n;
      for (int64_t i : e) var += (x.v[i] - mean) * (x.v[i] - mean) / n;
    }
    const double rstd = 1.0 / std::sqrt(var + eps);
    double sgw = 0, sgwx = 0;
    for (int64_t i : e) {
      double xh = (x.v[i] - mean) * rstd, wv = w ? w->v[ns.widx[i]] : 1.0;
      r.y.v[i] = xh * wv + (b ? b->v[ns.widx[i]] : 0.0);
      if (!gr) continue;
      double gw = gr->v[i] * wv;
      sgw += gw;
      sgwx += gw * xh;
      r.dw.v[ns.widx[i]] += gr->v[i] * xh;
      r.db.v[ns.widx[i]] += gr->v[i];
    }
    if (!gr) continue;
    for (int64_t i : e) {
      double xh = (x.v[i] - mean) * rstd, gw = gr->v[i] * (w ? w->v[ns.widx[i]] : 1.0);
      if (fixed_mean) r.dx.v[i] = rstd * gw;  // eval batch_norm: constant statistics
      else r.dx.v[i] = rstd * (gw - (ns.centre ? sgw / n : 0.0) - xh * sgwx / n);
    }
  }
  return r;
}

// Last k dims of shape: rows of D consecutive elements, affine index = position in the row.
NormSets row_sets(const Shape& shape, int k, bool centre) {
  NormSets ns;
  int64_t D = 1, n = HT::numel_of(shape);
  for (int d = static_cast<int>(shape.size()) - k; d < static_cast<int>(shape.size()); ++d) D *= shape[d];
  ns.wlen = D;
  ns.centre = centre;
  ns.widx.resize(static_cast<size_t>(n));
  for (int64_t r = 0; D > 0 && r < n / D; ++r) {
    ns.sets.emplace_back();
    for (int64_t j = 0; j < D; ++j) {
      ns.sets.back().push_back(r * D + j);
      ns.widx[r * D + j] = j;
    }
  }
  return ns;
}

// [N, C, *] (channels_last: [N, *, C]) in groups of C / G channels; affine index = channel.
NormSets group_sets(const Shape& shape, int64_t G, bool channels_last) {
  NormSets ns;
  const int nd = static_cast<int>(shape.size());
  const int64_t N = shape[0], C = channels_last ? shape[nd - 1] : shape[1];
  int64_t hw = 1;
  for (int d = 1; d < nd; ++d)
    if (d != (channels_last ? nd - 1 : 1)) hw *= shape[d];
  ns.wlen = C;
  ns.widx.resize(static_cast<size_t>(HT::numel_of(shape)));
  ns.sets.assign(static_cast<size_t>(N * G), {});
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t s = 0; s < hw; ++s) {
        int64_t i = channels_last ? (n * hw + s) * C + c : (n * C + c) * hw + s;
        ns.sets[static_cast<size_t>(n * G + c / (C / G))].push_back(i);
        ns.widx[i] = c;
      }
  return ns;
}

// [N, C, *] per channel.
NormSets channel_sets(const Shape& shape) {
  NormSets ns;
  const int64_t N = shape[0], C = shape[1];
  int64_t hw = 1;
  for (size_t d = 2; d < shape.size(); ++d) hw *= shape[d];
  ns.wlen = C;
  ns.widx.resize(static_cast<size_t>(HT::numel_of(shape)));
  ns.sets.assign(static_cast<size_t>(C), {});
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t s = 0; s < hw; ++s) {
        int64_t i = (n * C + c) * hw + s;
        ns.sets[static_cast<size_t>(c)].push_back(i);
        ns.widx[i] = c;
      }
  return ns;
}

// Fixed running statistics for batch_norm tests (the same values in every library call and reference).
HT running_mean0(int64_t C) {
  HT h({C});
  for (int64_t c = 0; c < C; ++c) h.v[c] = 0.3 * std::sin(1.0 + static_cast<double>(c));
  return h;
}
HT running_var0(int64_t C) {
  HT h({C});
  for (int64_t c = 0; c < C; ++c) h.v[c] = 0.6 + 0.5 * std::cos(static_cast<double>(c)) * std::cos(static_cast<double>(c));
  return h;
}

// ------------------------------------------------------------------ comparison

struct Tol {
  double rtol, atol;  // |got - want| <= rtol |want| + atol max |want|
};
Tol fwd_tol(flame_dtype_t d) {
  switch (d) {
    case FLAME_DTYPE_F64: return {1e-9, 1e-11};
    case FLAME_DTYPE_F32: return {1e-4, 1e-6};
    case FLAME_DTYPE_F16: return {2e-3, 1e-3};  // small softmax outputs are f16 subnormals (spacing 6e-8)
    default: return {1e-2, 1e-3};
  }
}
Tol bwd_tol(flame_dtype_t d) {
  switch (d) {
    case FLAME_DTYPE_F64: return {1e-8, 1e-10};
    case FLAME_DTYPE_F32: return {2e-4, 1e-4};  // tiny groups amplify f32 rounding by rstd (up to 1/sqrt(eps))
    case FLAME_DTYPE_F16: return {5e-3, 2e-3};
    default: return {3e-2, 1e-2};
  }
}

::testing::AssertionResult near(const HT& got, const HT& want, Tol t, const std::string& what) {
  if (got.shape != want.shape)
    return ::testing::AssertionFailure() << what << ": shape " << shape_str(got.shape) << ", expected " << shape_str(want.shape);
  double scale = 0;
  for (double w : want.v) scale = std::max(scale, std::fabs(w));
  // Gradients of tiny groups (one or two elements) are differences of O(1) terms that cancel to ~0:
  // their error is relative to the O(1) scale of the inputs, not to the small result.
  if (scale < 1) scale = 1;
  int64_t bad = 0;
  std::ostringstream os;
  for (size_t i = 0; i < want.v.size(); ++i) {
    double err = std::fabs(got.v[i] - want.v[i]);
    if (err <= t.rtol * std::fabs(want.v[i]) + t.atol * scale) continue;  // NaN fails too
    if (bad++ < 6) os << "\n  [" << i << "] " << got.v[i] << ", expected " << want.v[i];
  }
  if (!bad) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << want.v.size() << " elements off (shape "
                                       << shape_str(want.shape) << ")" << os.str();
}

HT random_ht(const Shape& s, std::mt19937_64& rng, double lo = -2, double hi = 2) {
  HT h(s);
  std::uniform_real_distribution<double> u(lo, hi);
  for (auto& e : h.v) e = u(rng);
  return h;
}

std::string trace(const std::string& what, flame_dtype_t dt, const Shape& s, bool nc) {
  return what + " " + flame_dtype_name(dt) + " " + shape_str(s) + (nc ? " (transposed input)" : "") +
         " FLAME_GRADCHECK_SEED=" + std::to_string(gc::seed());
}

uint64_t seed_for(const std::string& name) {
  uint64_t h = gc::seed() ^ 0x51ed2701ull;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

class NnTest : public GpuTest {
 public:
  // Uploads x (leaf; transposed storage when nc), returns the values the device holds.
  HT leaf(const HT& x, flame_dtype_t dt, bool nc, T* out, bool grad = true) {
    HT held;
    EXPECT_EQ(make_leaf(ctx, x, dt, nc, out), FLAME_OK) << flame_last_error_message();
    EXPECT_EQ(download(*out, &held), FLAME_OK);
    if (grad) {
      EXPECT_EQ(flame_tensor_set_requires_grad(*out, 1), FLAME_OK);
    }
    return held;
  }
  HT param(const HT& p, flame_dtype_t dt, T* out) { return leaf(p, dt, false, out); }
  // layer_norm over [64, d]: dweight and dbias with x not requiring grad.
  void weight_grads_only(int64_t d);
  // d(sum(y * gr))/d(inputs) through flame_grad (no create_graph: the fused kernels).
  std::vector<HT> grads(flame_tensor_t y, const HT& gr, flame_dtype_t dt, const std::vector<flame_tensor_t>& wrt,
                        HT* gr_held) {
    T gt;
    EXPECT_EQ(upload(ctx, gr, dt, gt.out()), FLAME_OK);
    EXPECT_EQ(download(gt, gr_held), FLAME_OK);
    std::vector<flame_tensor_t> res(wrt.size(), nullptr);
    flame_tensor_t gh = gt;
    flame_status_t st = flame_grad(ctx, &y, &gh, 1, wrt.data(), static_cast<int32_t>(wrt.size()), 0, res.data());
    EXPECT_EQ(st, FLAME_OK) << flame_last_error_message();
    std::vector<HT> out;
    for (auto r : res) {
      T held(r);
      HT h;
      if (r) {
        EXPECT_EQ(download(r, &h), FLAME_OK);
      }
      out.push_back(h);
    }
    return out;
  }
};

// ------------------------------------------------------------------ softmax / log_softmax vs host

struct SoftmaxCase {
  Shape shape;
  int dim;
  bool nc;
};

TEST_F(NnTest, SoftmaxForwardAndBackwardMatchHost) {
  const std::vector<SoftmaxCase> cases = {
      {{3, 1}, -1, false},      {{5, 7}, 1, false},      {{4, 33}, -1, true},     {{3, 1000}, 1, false},
      {{2, 5000}, -1, true},    {{2, 4097}, 1, false},   {{2, 16384}, 1, false},  {{1, 40000}, 1, false},
      {{3000, 64}, -1, false},  {{20000, 8}, 1, false},  {{5, 4}, 0, false},      {{4, 6, 5}, 1, false},
      {{70, 100, 64}, 1, false}, {{2, 3000, 3}, 1, false}, {{6, 3, 5}, 0, true},   {{}, 0, false},
      {{4, 0, 3}, 1, false},   {{3, 9000}, 1, false},   {{3, 24576}, -1, false},  // shared-memory rows
      {{4500, 300}, -1, false},  // short staged rows (f32), more rows than one pass of the persistent grid
      {{600, 2500}, -1, false}};  // middle staged rows of f16/bf16 (64 threads per row), many blocks
  std::mt19937_64 rng(seed_for("softmax"));
  for (bool log : {false, true}) {
    for (flame_dtype_t dt : kDtypes) {
      for (const auto& c : cases) {
        SCOPED_TRACE(trace(std::string(log ? "log_softmax" : "softmax") + " dim " + std::to_string(c.dim), dt, c.shape, c.nc));
        T x;
        HT xh = leaf(random_ht(c.shape, rng, -4, 4), dt, c.nc && c.shape.size() >= 2, &x);
        T y;
        FLAME_ASSERT_OK((log ? flame_log_softmax : flame_softmax)(x, c.dim, y.out()));
        EXPECT_EQ(dtype_of(y), dt);
        HT got, want = ref_softmax(xh, c.dim, log);
        FLAME_ASSERT_OK(download(y, &got));
        EXPECT_TRUE(near(got, want, fwd_tol(dt), "forward"));
        if (c.shape.empty()) continue;
        HT gr = random_ht(c.shape, rng), gr_held;
        std::vector<HT> g = grads(y, gr, dt, {x}, &gr_held);
        // The backward reads the output the device holds (rounded to dt).
        EXPECT_TRUE(near(g[0], ref_softmax_grad(got, gr_held, c.dim, log), bwd_tol(dt), "gradient"));
      }
    }
  }
}

TEST_F(NnTest, SoftmaxRowsStayStableForLargeAndInfiniteInputs) {
  HT x({2, 4});
  x.v = {1000, 1001, 1002, -INFINITY, -INFINITY, 5, -INFINITY, 7};
  T xt, y, ly;
  FLAME_ASSERT_OK(upload(ctx, x, FLAME_DTYPE_F32, xt.out()));
  FLAME_ASSERT_OK(flame_softmax(xt, -1, y.out()));
  FLAME_ASSERT_OK(flame_log_softmax(xt, -1, ly.out()));
  HT got, lgot;
  FLAME_ASSERT_OK(download(y, &got));
  FLAME_ASSERT_OK(download(ly, &lgot));
  EXPECT_TRUE(near(got, ref_softmax(x, -1, false), {1e-5, 1e-7}, "softmax"));
  for (size_t i : {size_t{0}, size_t{1}, size_t{2}, size_t{5}, size_t{7}})
    EXPECT_NEAR(lgot.v[i], ref_softmax(x, -1, true).v[i], 1e-4) << i;
  EXPECT_EQ(lgot.v[3], -INFINITY);
}

TEST_F(NnTest, GradientOfSumThroughExpandedGradientIsZero) {
  // sum_all's backward hands an expanded (stride 0) gradient to softmax / layer_norm.
  std::mt19937_64 rng(seed_for("sum"));
  HT xv = random_ht({6, 50}, rng);
  T x, y, s;
  FLAME_ASSERT_OK(upload(ctx, xv, FLAME_DTYPE_F32, x.out()));
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(x, 1));
  const int64_t ns[1] = {50};
  for (int which = 0; which < 2; ++which) {
    SCOPED_TRACE(which ? "layer_norm" : "softmax");
    if (which) FLAME_ASSERT_OK(flame_layer_norm(x, ns, 1, nullptr, nullptr, 1e-5, y.out()));
    else FLAME_ASSERT_OK(flame_softmax(x, 1, y.out()));
    FLAME_ASSERT_OK(flame_sum_all(y, s.out()));
    flame_tensor_t res = nullptr, sh = s, xh = x;
    FLAME_ASSERT_OK(flame_grad(ctx, &sh, nullptr, 1, &xh, 1, 0, &res));
    T held(res);
    HT g;
    FLAME_ASSERT_OK(download(res, &g));
    for (double v : g.v) ASSERT_NEAR(v, 0.0, 1e-5);
  }
}

// ------------------------------------------------------------------ layer_norm / rms_norm vs host

struct RowNormCase {
  Shape shape;
  int k;
  bool nc;
};
const std::vector<RowNormCase>& row_norm_cases() {
  static const std::vector<RowNormCase> c = {
      {{3, 1}, 1, false},     {{5, 7}, 1, false},     {{4, 33}, 1, true},       {{3, 1000}, 1, false},
      {{2, 5000}, 1, true},   {{2, 4097}, 1, false},  {{2, 16384}, 1, false},   {{1, 40000}, 1, false},
      {{3000, 64}, 1, false}, {{20000, 8}, 1, false}, {{3, 4, 50}, 2, false},   {{3, 4, 50}, 2, true},
      {{0, 16}, 1, false},    {{3, 9000}, 1, false},  {{3, 24576}, 1, false},   // shared-memory rows (f32, f16/bf16)
      {{4500, 300}, 1, false},   // short staged rows (f32), more rows than one pass of the persistent grid
      {{150, 16384}, 1, false},  // sm_90 ring rows (f32 and f16/bf16), more rows than SMs: several per block
      {{290, 8200}, 1, false},   // ring rows of f32 with a last chunk of 130 vectors
      {{290, 4100}, 1, false},   // ring rows of f64
      {{70, 12289}, 1, false},   // streamed rows in single elements: norm_wb_cols with V = 1
      {{600, 2500}, 1, false}};  // middle staged rows of f16/bf16 (96 threads per row for LN), many blocks
  return c;
}

void row_norm_test(NnTest* t, bool rms) {
  std::mt19937_64 rng(seed_for(rms ? "rms" : "layer"));
  for (flame_dtype_t dt : kDtypes) {
    for (const auto& c : row_norm_cases()) {
      for (int affine = 0; affine < 3; ++affine) {  // 0: none, 1: weight (and bias), 2: bias only (layer_norm)
        if (rms && affine == 2) continue;
        SCOPED_TRACE(trace(std::string(rms ? "rms_norm" : "layer_norm") + " affine " + std::to_string(affine), dt,
                           c.shape, c.nc));
        Shape ns(c.shape.end() - c.k, c.shape.end());
        T x, w, b, y;
        HT xh = t->leaf(random_ht(c.shape, rng, -1, 3), dt, c.nc, &x);
        HT wh, bh;
        if (affine == 1) wh = t->param(random_ht(ns, rng, 0.5, 1.5), dt, &w);
        if (affine >= 1 && !rms) bh = t->param(random_ht(ns, rng), dt, &b);
        const double eps = 1e-5;
        if (rms) FLAME_ASSERT_OK(flame_rms_norm(x, ns.data(), c.k, w, eps, y.out()));
        else FLAME_ASSERT_OK(flame_layer_norm(x, ns.data(), c.k, w, b, eps, y.out()));
        HT gr = random_ht(c.shape, rng), gr_held, got;
        std::vector<flame_tensor_t> wrt = {x};
        if (w.h) wrt.push_back(w);
        if (b.h) wrt.push_back(b);
        FLAME_ASSERT_OK(download(y, &got));
        std::vector<HT> g = t->grads(y, gr, dt, wrt, &gr_held);
        NormRef r = ref_norm(row_sets(c.shape, c.k, !rms), xh, w.h ? &wh : nullptr, b.h ? &bh : nullptr, eps, &gr_held);
        EXPECT_TRUE(near(got, r.y, fwd_tol(dt), "forward"));
        // rms_norm over one element: dx = rstd g w (1 - xhat^2) is O(eps), all cancellation: f64 only.
        if (!(rms && ns == Shape{1} && dt != FLAME_DTYPE_F64)) {
          EXPECT_TRUE(near(g[0], r.dx, bwd_tol(dt), "dx"));
        }
        size_t k = 1;
        if (w.h) {
          EXPECT_TRUE(near(g[k++], reshape(r.dw, ns), bwd_tol(dt), "dweight"));
        }
        if (b.h) {
          EXPECT_TRUE(near(g[k++], reshape(r.db, ns), bwd_tol(dt), "dbias"));
        }
      }
    }
  }
}

TEST_F(NnTest, LayerNormForwardAndBackwardMatchHost) { row_norm_test(this, false); }
TEST_F(NnTest, RmsNormForwardAndBackwardMatchHost) { row_norm_test(this, true); }

// Rows far from zero: a common offset (the mean's digits must not cancel its spread), and rows whose
// first 32 vectors (the shift of the one-pass statistics of staged rows, cuda/norm.cuh) sit 20 above
// the rest, which puts the shift ~9 standard deviations from the mean. Staged short (768), register
// (4096), staged long (16384) and streamed (24576) rows; group_norm rows of 16384 staged.
TEST_F(NnTest, RowNormStatisticsHoldForRowsFarFromZero) {
  std::mt19937_64 rng(seed_for("offset"));
  for (flame_dtype_t dt : {FLAME_DTYPE_F32, FLAME_DTYPE_F64}) {
    for (int64_t d : {int64_t{768}, int64_t{4096}, int64_t{16384}, int64_t{24576}}) {
      for (int skew = 0; skew < 2; ++skew) {
        SCOPED_TRACE(trace(std::string("layer_norm ") + (skew ? "first vectors raised" : "offset 100"), dt, {4, d}, false));
        const Shape s = {4, d}, ns = {d};
        HT xv = random_ht(s, rng, -1, 3);
        for (int64_t r = 0; r < 4; ++r)
          for (int64_t c = 0; c < d; ++c) xv.v[r * d + c] += skew ? (c < 128 ? 20.0 : 0.0) : 100.0;
        T x, w, b, y;
        HT xh = leaf(xv, dt, false, &x, false);
        HT wh = param(random_ht(ns, rng, 0.5, 1.5), dt, &w), bh = param(random_ht(ns, rng), dt, &b);
        FLAME_ASSERT_OK(flame_layer_norm(x, ns.data(), 1, w, b, 1e-5, y.out()));
        HT got;
        FLAME_ASSERT_OK(download(y, &got));
        NormRef r = ref_norm(row_sets(s, 1, true), xh, &wh, &bh, 1e-5, nullptr);
        // atol: the f32 mean of values near 100 is itself rounded by up to 4e-6
        EXPECT_TRUE(near(got, r.y, {fwd_tol(dt).rtol, dt == FLAME_DTYPE_F32 ? 2e-5 : fwd_tol(dt).atol}, "forward"));
      }
    }
    SCOPED_TRACE(trace("group_norm offset 100", dt, {2, 16, 64, 64}, false));
    HT xv = random_ht({2, 16, 64, 64}, rng, -1, 3);
    for (double& v : xv.v) v += 100.0;
    T x, y;
    HT xh = leaf(xv, dt, false, &x, false);
    FLAME_ASSERT_OK(flame_group_norm(x, 4, nullptr, nullptr, 1e-5, 0, y.out()));
    HT got;
    FLAME_ASSERT_OK(download(y, &got));
    NormRef r = ref_norm(group_sets({2, 16, 64, 64}, 4, false), xh, nullptr, nullptr, 1e-5, nullptr);
    EXPECT_TRUE(near(got, r.y, {fwd_tol(dt).rtol, dt == FLAME_DTYPE_F32 ? 2e-5 : fwd_tol(dt).atol}, "forward"));
  }
}

// Row kernels (96) and streamed rows (16384: norm_wb_cols) with no dx.
TEST_F(NnTest, LayerNormWeightGradientWithoutInputGradient) {
  for (int64_t d : {int64_t{96}, int64_t{16384}}) {
    SCOPED_TRACE("D " + std::to_string(d));
    weight_grads_only(d);
  }
}

void NnTest::weight_grads_only(int64_t d) {
  std::mt19937_64 rng(seed_for("wonly"));
  const Shape s = {64, d}, ns = {d};
  T x, w, b, y;
  HT xh = leaf(random_ht(s, rng), FLAME_DTYPE_F32, false, &x, /*grad=*/false);
  HT wh = param(random_ht(ns, rng), FLAME_DTYPE_F32, &w), bh = param(random_ht(ns, rng), FLAME_DTYPE_F32, &b);
  FLAME_ASSERT_OK(flame_layer_norm(x, ns.data(), 1, w, b, 1e-5, y.out()));
  HT gr = random_ht(s, rng), gr_held;
  std::vector<HT> g = grads(y, gr, FLAME_DTYPE_F32, {w, b}, &gr_held);
  NormRef r = ref_norm(row_sets(s, 1, true), xh, &wh, &bh, 1e-5, &gr_held);
  EXPECT_TRUE(near(g[0], r.dw, bwd_tol(FLAME_DTYPE_F32), "dweight"));
  EXPECT_TRUE(near(g[1], r.db, bwd_tol(FLAME_DTYPE_F32), "dbias"));
}

// ------------------------------------------------------------------ group_norm vs host

TEST_F(NnTest, GroupNormForwardAndBackwardMatchHost) {
  struct Case {
    Shape shape;
    int64_t G;
    bool channels_last, nc;
  };
  const std::vector<Case> cases = {
      {{2, 6}, 2, false, false},          {{3, 6, 7}, 3, false, false},      {{2, 8, 5, 5}, 4, false, true},
      {{2, 32, 8, 8}, 8, false, false},   {{2, 16, 64, 64}, 4, false, false}, {{1, 4, 100, 100}, 1, false, false},
      {{2, 64, 7, 7}, 32, false, false},  {{2, 5, 5, 8}, 4, true, false},    {{3, 7, 6}, 2, true, true},
      {{2, 3, 4, 6}, 6, true, false},     {{0, 4, 3}, 2, false, false},      {{2, 12}, 3, true, false},
      {{2, 16, 48, 48}, 2, false, false},  // rows of 18432: shared memory in f16/bf16
      {{2, 6, 40, 40}, 2, false, false},  // rows of 4800: middle staged rows (160 threads in bf16, 320 in f32)
      {{2, 8, 6, 6}, 2, false, false},    // HW = 36: 16-byte vectors of f16 / bf16 span two channels
      {{1, 2, 256, 300}, 1, false, false}};  // HW = 76800 >= 2^16: channel index by division
  std::mt19937_64 rng(seed_for("group"));
  for (flame_dtype_t dt : kDtypes) {
    for (const auto& c : cases) {
      for (bool affine : {true, false}) {
        SCOPED_TRACE(trace("group_norm G " + std::to_string(c.G) + (c.channels_last ? " channels_last" : "") +
                               (affine ? " affine" : ""), dt, c.shape, c.nc));
        const int64_t C = c.channels_last ? c.shape.back() : c.shape[1];
        T x, w, b, y;
        HT xh = leaf(random_ht(c.shape, rng, -1, 3), dt, c.nc, &x);
        HT wh, bh;
        if (affine) {
          wh = param(random_ht({C}, rng, 0.5, 1.5), dt, &w);
          bh = param(random_ht({C}, rng), dt, &b);
        }
        FLAME_ASSERT_OK(flame_group_norm(x, static_cast<int32_t>(c.G), w, b, 1e-5, c.channels_last ? 1 : 0, y.out()));
        HT gr = random_ht(c.shape, rng), gr_held, got;
        std::vector<flame_tensor_t> wrt = {x};
        if (affine) wrt.insert(wrt.end(), {w, b});
        FLAME_ASSERT_OK(download(y, &got));
        std::vector<HT> g = grads(y, gr, dt, wrt, &gr_held);
        NormRef r = ref_norm(group_sets(c.shape, c.G, c.channels_last), xh, affine ? &wh : nullptr, affine ? &bh : nullptr,
                             1e-5, &gr_held);
        EXPECT_TRUE(near(got, r.y, fwd_tol(dt), "forward"));
        EXPECT_TRUE(near(g[0], r.dx, bwd_tol(dt), "dx"));
        if (affine) {
          EXPECT_TRUE(near(g[1], r.dw, bwd_tol(dt), "dweight"));
          EXPECT_TRUE(near(g[2], r.db, bwd_tol(dt), "dbias"));
        }
      }
    }
  }
}

// ------------------------------------------------------------------ batch_norm vs host

TEST_F(NnTest, BatchNormForwardBackwardAndRunningStatsMatchHost) {
  // (Sets of two values normalise to +-1 whatever x is: their dx is O(eps), all cancellation; avoided.)
  const std::vector<Shape> shapes = {{4, 3}, {2, 5, 7}, {3, 4, 6, 6}, {8, 2, 64, 64}, {16, 300}, {3, 3, 1, 1}};
  std::mt19937_64 rng(seed_for("batch"));
  for (flame_dtype_t dt : kDtypes) {
    for (const Shape& s : shapes) {
      for (int training : {1, 0}) {
        for (bool nc : {false, true}) {
          if (nc && s.size() < 3) continue;
          SCOPED_TRACE(trace(std::string("batch_norm ") + (training ? "training" : "eval"), dt, s, nc));
          const int64_t C = s[1];
          const double momentum = 0.1, eps = 1e-5;
          T x, w, b, rm, rv, y;
          HT xh = leaf(random_ht(s, rng, -1, 3), dt, nc, &x);
          HT wh = param(random_ht({C}, rng, 0.5, 1.5), dt, &w), bh = param(random_ht({C}, rng), dt, &b);
          HT rm0, rv0;
          FLAME_ASSERT_OK(upload(ctx, running_mean0(C), dt, rm.out()));
          FLAME_ASSERT_OK(upload(ctx, running_var0(C), dt, rv.out()));
          FLAME_ASSERT_OK(download(rm, &rm0));
          FLAME_ASSERT_OK(download(rv, &rv0));
          FLAME_ASSERT_OK(flame_batch_norm(x, rm, rv, w, b, training, momentum, eps, y.out()));
          NormSets ns = channel_sets(s);
          HT gr = random_ht(s, rng), gr_held, got;
          FLAME_ASSERT_OK(download(y, &got));
          std::vector<HT> g = grads(y, gr, dt, {x, w, b}, &gr_held);
          NormRef r = training ? ref_norm(ns, xh, &wh, &bh, eps, &gr_held)
                               : ref_norm(ns, xh, &wh, &bh, eps, &gr_held, &rm0.v, &rv0.v);
          EXPECT_TRUE(near(got, r.y, fwd_tol(dt), "forward"));
          EXPECT_TRUE(near(g[0], r.dx, bwd_tol(dt), "dx"));
          EXPECT_TRUE(near(g[1], r.dw, bwd_tol(dt), "dweight"));
          EXPECT_TRUE(near(g[2], r.db, bwd_tol(dt), "dbias"));
          // Running statistics: updated with the batch mean and the unbiased variance, or untouched.
          HT rm1, rv1, want_m = rm0, want_v = rv0;
          FLAME_ASSERT_OK(download(rm, &rm1));
          FLAME_ASSERT_OK(download(rv, &rv1));
          if (training) {
            for (int64_t c = 0; c < C; ++c) {
              const auto& e = ns.sets[static_cast<size_t>(c)];
              double n = static_cast<double>(e.size()), m = 0, v = 0;
              for (int64_t i : e) m += xh.v[i] / n;
              for (int64_t i : e) v += (xh.v[i] - m) * (xh.v[i] - m) / (n - 1);
              want_m.v[c] = (1 - momentum) * rm0.v[c] + momentum * m;
              want_v.v[c] = (1 - momentum) * rv0.v[c] + momentum * v;
            }
          }
          EXPECT_TRUE(near(rm1, want_m, fwd_tol(dt), "running_mean"));
          EXPECT_TRUE(near(rv1, want_v, fwd_tol(dt), "running_var"));
        }
      }
    }
  }
}

TEST_F(NnTest, BatchNormTrainingWithoutRunningStats) {
  std::mt19937_64 rng(seed_for("bn_nostats"));
  const Shape s = {5, 3, 4};
  T x, y;
  HT xh = leaf(random_ht(s, rng), FLAME_DTYPE_F32, false, &x);
  FLAME_ASSERT_OK(flame_batch_norm(x, nullptr, nullptr, nullptr, nullptr, 1, 0.1, 1e-5, y.out()));
  HT got, gr = random_ht(s, rng), gr_held;
  FLAME_ASSERT_OK(download(y, &got));
  std::vector<HT> g = grads(y, gr, FLAME_DTYPE_F32, {x}, &gr_held);
  NormRef r = ref_norm(channel_sets(s), xh, nullptr, nullptr, 1e-5, &gr_held);
  EXPECT_TRUE(near(got, r.y, fwd_tol(FLAME_DTYPE_F32), "forward"));
  EXPECT_TRUE(near(g[0], r.dx, bwd_tol(FLAME_DTYPE_F32), "dx"));
}

// ------------------------------------------------------------------ gradcheck (finite differences)

using Dims = std::vector<int32_t>;

FlameFn one(std::function<flame_status_t(const Tensors&, flame_dtype_t, flame_tensor_t*)> f) {
  return [f](const Tensors& in, flame_dtype_t dt, std::vector<T>& out) {
    out.emplace_back();
    return f(in, dt, out.back().out());
  };
}
RefFn one_ref(std::function<HT(const std::vector<HT>&)> f) {
  return [f](const std::vector<HT>& x) { return std::vector<HT>{f(x)}; };
}

// Running statistics for the batch_norm rows: fresh tensors of the fixed values on every call.
flame_status_t bn_call(const Tensors& in, flame_dtype_t dt, int training, flame_tensor_t* out) {
  int64_t C = shape_of(in[0])[1];
  T rm, rv;
  flame_ctx_t ctx = nullptr;
  flame_status_t st = flame_tensor_context(in[0], &ctx);
  if (st != FLAME_OK) return st;
  if ((st = upload(ctx, running_mean0(C), dt, rm.out())) != FLAME_OK) return st;
  if ((st = upload(ctx, running_var0(C), dt, rv.out())) != FLAME_OK) return st;
  return flame_batch_norm(in[0], rm, rv, in.size() > 1 ? in[1] : nullptr, in.size() > 2 ? in[2] : nullptr, training, 0.1,
                          1e-5, out);
}
HT bn_ref(const std::vector<HT>& x, bool training) {
  int64_t C = x[0].shape[1];
  HT rm = running_mean0(C), rv = running_var0(C);
  const HT* w = x.size() > 1 ? &x[1] : nullptr;
  const HT* b = x.size() > 2 ? &x[2] : nullptr;
  if (training) return ref_norm(channel_sets(x[0].shape), x[0], w, b, 1e-5, nullptr).y;
  return ref_norm(channel_sets(x[0].shape), x[0], w, b, 1e-5, nullptr, &rm.v, &rv.v).y;
}

std::vector<Row> build_rows() {
  std::vector<Row> rows;
  auto add = [&rows](std::string name, std::string covers, std::vector<Case> cases, FlameFn f, RefFn r) -> Row& {
    Row row;
    row.name = std::move(name);
    row.covers = {std::move(covers)};
    row.cases = std::move(cases);
    row.fwd = std::move(f);
    row.ref = std::move(r);
    rows.push_back(std::move(row));
    return rows.back();
  };
  for (bool log : {false, true}) {
    std::string nm = log ? "log_softmax" : "softmax";
    for (int dim : {-1, 0, 1}) {
      std::vector<Case> cases = dim == -1 ? std::vector<Case>{{{in({3, 5}, uni(-3, 3))}}, {{nc({4, 6}, uni(-3, 3))}}, {{in({}, uni())}}}
                                          : std::vector<Case>{{{in({3, 4, 2}, uni(-3, 3))}}, {{nc({2, 3, 4}, uni(-3, 3))}}};
      std::string name = nm + (dim == -1 ? "_last" : "_dim" + std::to_string(dim));
      Row& r = add(name, nm, cases, one([log, dim](const Tensors& x, flame_dtype_t, flame_tensor_t* o) {
                     return (log ? flame_log_softmax : flame_softmax)(x[0], dim, o);
                   }),
                   one_ref([log, dim](const std::vector<HT>& x) { return ref_softmax(x[0], dim, log); }));
      r.low_precision = dim == -1;
    }
  }
  // layer_norm: with weight and bias, weight only, bias only, neither; over 1 and 2 dims.
  struct Ln {
    const char* name;
    bool w, b;
  };
  for (Ln v : {Ln{"layer_norm_affine", true, true}, Ln{"layer_norm_weight", true, false}, Ln{"layer_norm_bias", false, true},
               Ln{"layer_norm_plain", false, false}}) {
    std::vector<Case> cases;
    for (int form = 0; form < 3; ++form) {  // [3, 6] over [6]; transposed [4, 5]; [2, 3, 4] over [3, 4]
      Shape s = form == 0 ? Shape{3, 6} : (form == 1 ? Shape{4, 5} : Shape{2, 3, 4});
      Shape ns = form == 2 ? Shape{3, 4} : Shape{s.back()};
      std::vector<In> ins = {form == 1 ? nc(s) : in(s)};
      if (v.w) ins.push_back(in(ns, uni(0.5, 1.5)));
      if (v.b) ins.push_back(in(ns));
      cases.emplace_back(ins);
    }
    if (v.w && v.b) {  // x not requiring grad: only weight and bias get gradients
      In x = in({3, 6});
      x.grad = false;
      cases.emplace_back(std::vector<In>{x, in({6}, uni(0.5, 1.5)), in({6})});
    }
    bool w = v.w, b = v.b;
    Row& r = add(v.name, "layer_norm", cases, one([w, b](const Tensors& x, flame_dtype_t, flame_tensor_t* o) {
                   Shape s = shape_of(x[0]);
                   Shape ns = s.size() == 3 ? Shape{s[1], s[2]} : Shape{s.back()};
                   flame_tensor_t wt = w ? x[1] : nullptr, bt = b ? x[w ? 2 : 1] : nullptr;
                   return flame_layer_norm(x[0], ns.data(), static_cast<int32_t>(ns.size()), wt, bt, 1e-5, o);
                 }),
                 one_ref([w, b](const std::vector<HT>& x) {
                   int k = x[0].ndim() == 3 ? 2 : 1;
                   return ref_norm(row_sets(x[0].shape, k, true), x[0], w ? &x[1] : nullptr, b ? &x[w ? 2 : 1] : nullptr, 1e-5,
                                   nullptr).y;
                 }));
    r.low_precision = w && b;
  }
  for (bool w : {true, false}) {
    std::vector<Case> cases;
    for (int form = 0; form < 2; ++form) {
      Shape s = form == 0 ? Shape{3, 6} : Shape{4, 5};
      std::vector<In> ins = {form == 1 ? nc(s) : in(s)};
      if (w) ins.push_back(in({s.back()}, uni(0.5, 1.5)));
      cases.emplace_back(ins);
    }
    Row& r = add(w ? "rms_norm_weight" : "rms_norm_plain", "rms_norm", cases,
                 one([w](const Tensors& x, flame_dtype_t, flame_tensor_t* o) {
                   int64_t ns = shape_of(x[0]).back();
                   return flame_rms_norm(x[0], &ns, 1, w ? x[1] : nullptr, 1e-5, o);
                 }),
                 one_ref([w](const std::vector<HT>& x) {
                   return ref_norm(row_sets(x[0].shape, 1, false), x[0], w ? &x[1] : nullptr, nullptr, 1e-5, nullptr).y;
                 }));
    r.low_precision = w;
  }
  for (bool cl : {false, true}) {
    // [2, 4, 3] with 2 groups (channels last: [2, 3, 4]); transposed; no spatial dims, where a group of
    // 4 channels (not 2: two close values make 1/var blow up the second derivative's finite differences).
    std::vector<Case> cases = {{{cl ? in({2, 3, 4}) : in({2, 4, 3}), in({4}, uni(0.5, 1.5)), in({4})}},
                               {{cl ? nc({2, 3, 4}) : nc({2, 4, 3}), in({4}, uni(0.5, 1.5)), in({4})}},
                               {{in({3, 8}), in({8}, uni(0.5, 1.5)), in({8})}}};
    Row& r = add(cl ? "group_norm_channels_last" : "group_norm", "group_norm", cases,
                 one([cl](const Tensors& x, flame_dtype_t, flame_tensor_t* o) {
                   return flame_group_norm(x[0], 2, x[1], x[2], 1e-5, cl ? 1 : 0, o);
                 }),
                 one_ref([cl](const std::vector<HT>& x) {
                   bool last = cl && x[0].ndim() > 2;
                   return ref_norm(group_sets(x[0].shape, 2, last), x[0], &x[1], &x[2], 1e-5, nullptr).y;
                 }));
    r.low_precision = !cl;
  }
  for (int training : {1, 0}) {
    std::vector<Case> cases = {{{in({3, 2, 2}), in({2}, uni(0.5, 1.5)), in({2})}},
                               {{nc({4, 3}), in({3}, uni(0.5, 1.5)), in({3})}},
                               {{in({2, 2, 3})}}};
    Row& r = add(training ? "batch_norm_training" : "batch_norm_eval", "batch_norm", cases,
                 one([training](const Tensors& x, flame_dtype_t dt, flame_tensor_t* o) { return bn_call(x, dt, training, o); }),
                 one_ref([training](const std::vector<HT>& x) { return bn_ref(x, training != 0); }));
    r.low_precision = training != 0;
  }
  return rows;
}

const std::vector<Row>& rows() {
  static const std::vector<Row> r = build_rows();
  return r;
}

TEST(NnGradCheckTable, RowNamesAreUnique) {  // every op of the list has a row: test_op_coverage.cpp
  std::set<std::string> seen;
  for (const Row& r : rows()) EXPECT_TRUE(seen.insert(r.name).second) << "duplicate row " << r.name;
}

// Finite differences in every dtype a row claims; create_graph: the composed backward, differentiated
// again (f64).
FLAME_GRADCHECK_SUITES(Nn, NnGradCheck, NnGradGradCheck, rows, 0x6a09e667f3bcc909ull);

// ------------------------------------------------------------------ bad arguments

// Expects `call` (its last argument &out, preset to a non-NULL sentinel) to fail with `status` and
// leave out NULL.
#define NN_EXPECT_FAIL(status, call)                                                                \
  do {                                                                                              \
    out = reinterpret_cast<flame_tensor_t>(static_cast<uintptr_t>(0x10));                          \
    flame_status_t st_ = (call);                                                                    \
    EXPECT_EQ(st_, status) << #call << " -> " << flame_status_string(st_) << ": " << flame_last_error_message(); \
    EXPECT_EQ(out, nullptr) << #call << " left its OUT handle non-NULL";                           \
    if (st_ == FLAME_OK && out) flame_tensor_release(out);                                          \
    out = nullptr;                                                                                  \
  } while (0)

TEST_F(NnTest, BadArgumentsGiveClearStatusAndNoOutput) {
  HT xv({2, 3, 4}, 0.5);
  xv.v[3] = 1.5;
  T x, xi, w4, w3, wf64, b4, x1;
  FLAME_ASSERT_OK(upload(ctx, xv, FLAME_DTYPE_F32, x.out()));
  FLAME_ASSERT_OK(upload(ctx, xv, FLAME_DTYPE_I32, xi.out()));
  FLAME_ASSERT_OK(upload(ctx, HT({4}, 1.0), FLAME_DTYPE_F32, w4.out()));
  FLAME_ASSERT_OK(upload(ctx, HT({3}, 1.0), FLAME_DTYPE_F32, w3.out()));
  FLAME_ASSERT_OK(upload(ctx, HT({4}, 1.0), FLAME_DTYPE_F64, wf64.out()));
  FLAME_ASSERT_OK(upload(ctx, HT({4}, 0.0), FLAME_DTYPE_F32, b4.out()));
  FLAME_ASSERT_OK(upload(ctx, HT({5}, 1.0), FLAME_DTYPE_F32, x1.out()));
  flame_tensor_t out = nullptr;
  const int64_t ns4[1] = {4}, ns3[1] = {3}, ns34[2] = {3, 4}, ns2345[4] = {1, 2, 3, 4};

  // softmax / log_softmax
  NN_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, flame_softmax(x, 3, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, flame_softmax(x, -4, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, flame_log_softmax(x, 7, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_DTYPE_MISMATCH, flame_softmax(xi, 0, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_DTYPE_MISMATCH, flame_log_softmax(xi, 0, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, flame_softmax(nullptr, 0, &out));
  EXPECT_EQ(flame_softmax(x, 0, nullptr), FLAME_ERROR_INVALID_ARGUMENT);

  // layer_norm / rms_norm
  NN_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, flame_layer_norm(x, ns3, 1, nullptr, nullptr, 1e-5, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, flame_layer_norm(x, ns2345, 4, nullptr, nullptr, 1e-5, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, flame_layer_norm(x, ns4, 0, nullptr, nullptr, 1e-5, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, flame_layer_norm(x, nullptr, 1, nullptr, nullptr, 1e-5, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, flame_layer_norm(x, ns4, 1, w3, nullptr, 1e-5, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, flame_layer_norm(x, ns34, 2, w4, nullptr, 1e-5, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, flame_layer_norm(x, ns4, 1, w4, w3, 1e-5, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_DTYPE_MISMATCH, flame_layer_norm(x, ns4, 1, wf64, nullptr, 1e-5, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_DTYPE_MISMATCH, flame_layer_norm(xi, ns4, 1, nullptr, nullptr, 1e-5, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, flame_layer_norm(x, ns4, 1, w4, b4, -1.0, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, flame_layer_norm(x, ns4, 1, w4, b4, NAN, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, flame_layer_norm(nullptr, ns4, 1, w4, b4, 1e-5, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, flame_rms_norm(x, ns3, 1, nullptr, 1e-5, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, flame_rms_norm(x, ns4, 1, w3, 1e-5, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_DTYPE_MISMATCH, flame_rms_norm(x, ns4, 1, wf64, 1e-5, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_DTYPE_MISMATCH, flame_rms_norm(xi, ns4, 1, nullptr, 1e-5, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, flame_rms_norm(x, ns4, 9, nullptr, 1e-5, &out));

  // group_norm on [2, 3, 4]: C = 3 (channels last: C = 4)
  NN_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, flame_group_norm(x, 2, nullptr, nullptr, 1e-5, 0, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, flame_group_norm(x, 0, nullptr, nullptr, 1e-5, 0, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, flame_group_norm(x, -3, nullptr, nullptr, 1e-5, 0, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, flame_group_norm(x, 3, nullptr, nullptr, 1e-5, 1, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, flame_group_norm(x, 3, nullptr, nullptr, 1e-5, 2, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, flame_group_norm(x, 3, w4, nullptr, 1e-5, 0, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, flame_group_norm(x, 2, w3, nullptr, 1e-5, 1, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_DTYPE_MISMATCH, flame_group_norm(x, 2, wf64, nullptr, 1e-5, 1, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, flame_group_norm(x1, 1, nullptr, nullptr, 1e-5, 0, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_DTYPE_MISMATCH, flame_group_norm(xi, 3, nullptr, nullptr, 1e-5, 0, &out));

  // batch_norm on [2, 3, 4]: C = 3; running statistics untouched by every failing call
  T rm, rv, rm4, rvf64, rmg, one_val;
  FLAME_ASSERT_OK(upload(ctx, HT({3}, 0.25), FLAME_DTYPE_F32, rm.out()));
  FLAME_ASSERT_OK(upload(ctx, HT({3}, 2.0), FLAME_DTYPE_F32, rv.out()));
  FLAME_ASSERT_OK(upload(ctx, HT({4}, 0.0), FLAME_DTYPE_F32, rm4.out()));
  FLAME_ASSERT_OK(upload(ctx, HT({3}, 1.0), FLAME_DTYPE_F64, rvf64.out()));
  FLAME_ASSERT_OK(upload(ctx, HT({3}, 0.0), FLAME_DTYPE_F32, rmg.out()));
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(rmg, 1));
  FLAME_ASSERT_OK(upload(ctx, HT({1, 3}, 1.0), FLAME_DTYPE_F32, one_val.out()));
  T empty_batch;
  FLAME_ASSERT_OK(flame_zeros(ctx, std::vector<int64_t>{0, 3, 4}.data(), 3, FLAME_DTYPE_F32, empty_batch.out()));
  NN_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, flame_batch_norm(x, rm, nullptr, nullptr, nullptr, 1, 0.1, 1e-5, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, flame_batch_norm(x, nullptr, rv, nullptr, nullptr, 1, 0.1, 1e-5, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, flame_batch_norm(x, nullptr, nullptr, nullptr, nullptr, 0, 0.1, 1e-5, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, flame_batch_norm(one_val, rm, rv, nullptr, nullptr, 1, 0.1, 1e-5, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, flame_batch_norm(empty_batch, rm, rv, nullptr, nullptr, 1, 0.1, 1e-5, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, flame_batch_norm(x, rm4, rv, nullptr, nullptr, 1, 0.1, 1e-5, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_DTYPE_MISMATCH, flame_batch_norm(x, rm, rvf64, nullptr, nullptr, 1, 0.1, 1e-5, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, flame_batch_norm(x, rmg, rv, nullptr, nullptr, 1, 0.1, 1e-5, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, flame_batch_norm(x, rm, rv, w4, nullptr, 1, 0.1, 1e-5, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, flame_batch_norm(x, rm, rv, nullptr, b4, 1, 0.1, 1e-5, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, flame_batch_norm(x, rm, rv, nullptr, nullptr, 1, NAN, 1e-5, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, flame_batch_norm(x, rm, rv, nullptr, nullptr, 1, 0.1, -1e-5, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, flame_batch_norm(x1, rm, rv, nullptr, nullptr, 1, 0.1, 1e-5, &out));
  NN_EXPECT_FAIL(FLAME_ERROR_DTYPE_MISMATCH, flame_batch_norm(xi, rm, rv, nullptr, nullptr, 1, 0.1, 1e-5, &out));
  HT rmv, rvv;
  FLAME_ASSERT_OK(download(rm, &rmv));
  FLAME_ASSERT_OK(download(rv, &rvv));
  for (double v : rmv.v) EXPECT_EQ(v, 0.25);
  for (double v : rvv.v) EXPECT_EQ(v, 2.0);

  // Tensors of another context.
  bool skip = false;
  std::string why;
  flame_ctx_t other = flame_test_context(&skip, &why);
  ASSERT_NE(other, nullptr) << why;
  {
    T w_other, rm_other;
    FLAME_ASSERT_OK(upload(other, HT({4}, 1.0), FLAME_DTYPE_F32, w_other.out()));
    FLAME_ASSERT_OK(upload(other, HT({3}, 0.0), FLAME_DTYPE_F32, rm_other.out()));
    NN_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, flame_layer_norm(x, ns4, 1, w_other, nullptr, 1e-5, &out));
    NN_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, flame_layer_norm(x, ns4, 1, w4, w_other, 1e-5, &out));
    NN_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, flame_rms_norm(x, ns4, 1, w_other, 1e-5, &out));
    NN_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, flame_group_norm(x, 2, w_other, nullptr, 1e-5, 1, &out));
    NN_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, flame_batch_norm(x, rm_other, rv, nullptr, nullptr, 1, 0.1, 1e-5, &out));
  }
  flame_ctx_destroy(other);
}

}  // namespace

// GPU tests of max_pool2d, avg_pool2d and adaptive_avg_pool2d (flame.h "Pooling"; src/ops/pooling.cpp,
// cuda/pool.cuh):
//  - PoolGradCheck / PoolGradGradCheck: kernel sizes, strides, padding, dilation, ceil_mode,
//    count_include_pad, divisor_override, adaptive sizes (down, up, global), unbatched, transposed and
//    channels-last inputs: forward against host float64 references, gradients against finite
//    differences (f64, f32; f16/bf16 for a subset), second order (create_graph) in f64. Max-pool
//    inputs are permutations of a 1/16 grid: no ties, exact in every dtype;
//  - PoolOps: ties go to the first maximum in scan order, NaN propagates and takes the gradient,
//    all--inf windows; channels-last in gives channels-last out; empty batches; a diffusion-sized
//    average pool in bf16; option defaults; bad arguments.
// Reproduce a failure with FLAME_GRADCHECK_SEED=<seed printed in the failure>.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "gradcheck.h"

using namespace gc;

namespace {

// ------------------------------------------------------------------ host references

struct PoolOpt {
  int64_t k[2] = {2, 2}, s[2] = {2, 2}, p[2] = {0, 0}, d[2] = {1, 1};
  bool ceil = false, cip = true;
  int64_t div = 0;
};
PoolOpt popt(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph = 0, int64_t pw = 0) {
  PoolOpt o;
  o.k[0] = kh;
  o.k[1] = kw;
  o.s[0] = sh;
  o.s[1] = sw;
  o.p[0] = ph;
  o.p[1] = pw;
  return o;
}

int64_t floordiv(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
int64_t out_size(int64_t in, int64_t k, int64_t p, int64_t s, int64_t d, bool ceil) {
  int64_t o = floordiv(in + 2 * p - d * (k - 1) - 1 + (ceil ? s - 1 : 0), s) + 1;
  if (ceil && (o - 1) * s >= in + p) --o;
  return o;
}

// x [N, C, H, W] or [C, H, W] as (N, C, H, W) sizes.
void dims4(const HT& x, int64_t* N, int64_t* C, int64_t* H, int64_t* W) {
  const bool b = x.ndim() == 4;
  *N = b ? x.shape[0] : 1;
  *C = x.shape[b ? 1 : 0];
  *H = x.shape[b ? 2 : 1];
  *W = x.shape[b ? 3 : 2];
}
Shape out_shape(const HT& x, int64_t OH, int64_t OW) {
  Shape s = x.shape;
  s[s.size() - 2] = OH;
  s[s.size() - 1] = OW;
  return s;
}

HT max_pool_ref(const HT& x, const PoolOpt& o) {
  int64_t N, C, H, W;
  dims4(x, &N, &C, &H, &W);
  const int64_t OH = out_size(H, o.k[0], o.p[0], o.s[0], o.d[0], o.ceil), OW = out_size(W, o.k[1], o.p[1], o.s[1], o.d[1], o.ceil);
  HT y(out_shape(x, OH, OW));
  for (int64_t nc = 0; nc < N * C; ++nc)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        double m = -INFINITY;
        bool any = false;
        for (int64_t i = 0; i < o.k[0]; ++i)
          for (int64_t j = 0; j < o.k[1]; ++j) {
            const int64_t h = oh * o.s[0] - o.p[0] + i * o.d[0], w = ow * o.s[1] - o.p[1] + j * o.d[1];
            if (h < 0 || h >= H || w < 0 || w >= W) continue;
            const double v = x.v[(nc * H + h) * W + w];
            if (!any || v > m || std::isnan(v)) m = v;
            any = true;
          }
        y.v[(nc * OH + oh) * OW + ow] = m;
      }
  return y;
}

HT avg_pool_ref(const HT& x, const PoolOpt& o) {
  int64_t N, C, H, W;
  dims4(x, &N, &C, &H, &W);
  const int64_t OH = out_size(H, o.k[0], o.p[0], o.s[0], 1, o.ceil), OW = out_size(W, o.k[1], o.p[1], o.s[1], 1, o.ceil);
  HT y(out_shape(x, OH, OW));
  for (int64_t nc = 0; nc < N * C; ++nc)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        int64_t h0 = oh * o.s[0] - o.p[0], w0 = ow * o.s[1] - o.p[1];
        int64_t h1 = std::min(h0 + o.k[0], H + o.p[0]), w1 = std::min(w0 + o.k[1], W + o.p[1]);
        const int64_t padded = (h1 - h0) * (w1 - w0);
        h0 = std::max<int64_t>(h0, 0);
        w0 = std::max<int64_t>(w0, 0);
        h1 = std::min(h1, H);
        w1 = std::min(w1, W);
        double s = 0;
        for (int64_t h = h0; h < h1; ++h)
          for (int64_t w = w0; w < w1; ++w) s += x.v[(nc * H + h) * W + w];
        const int64_t div = o.div > 0 ? o.div : (o.cip ? padded : (h1 - h0) * (w1 - w0));
        y.v[(nc * OH + oh) * OW + ow] = (h0 >= h1 || w0 >= w1) ? 0.0 : s / static_cast<double>(div);
      }
  return y;
}

HT adaptive_ref(const HT& x, int64_t OH, int64_t OW) {
  int64_t N, C, H, W;
  dims4(x, &N, &C, &H, &W);
  HT y(out_shape(x, OH, OW));
  for (int64_t nc = 0; nc < N * C; ++nc)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        const int64_t h0 = static_cast<int64_t>(std::floor(static_cast<double>(oh * H) / OH));
        const int64_t h1 = static_cast<int64_t>(std::ceil(static_cast<double>((oh + 1) * H) / OH));
        const int64_t w0 = static_cast<int64_t>(std::floor(static_cast<double>(ow * W) / OW));
        const int64_t w1 = static_cast<int64_t>(std::ceil(static_cast<double>((ow + 1) * W) / OW));
        double s = 0;
        for (int64_t h = h0; h < h1; ++h)
          for (int64_t w = w0; w < w1; ++w) s += x.v[(nc * H + h) * W + w];
        y.v[(nc * OH + oh) * OW + ow] = s / static_cast<double>((h1 - h0) * (w1 - w0));
      }
  return y;
}

// ------------------------------------------------------------------ calling FLAME

flame_pool2d_options_t flame_opts(const PoolOpt& o) {
  flame_pool2d_options_t f;
  flame_pool2d_options_init(&f, o.k[0], o.k[1]);
  for (int i = 0; i < 2; ++i) {
    f.stride[i] = o.s[i];
    f.padding[i] = o.p[i];
    f.dilation[i] = o.d[i];
  }
  f.ceil_mode = o.ceil ? 1 : 0;
  f.count_include_pad = o.cip ? 1 : 0;
  f.divisor_override = o.div;
  return f;
}

// A channels-last copy of x [N, C, H, W] (same values; C stride 1), through recorded ops.
flame_status_t channels_last_of(flame_tensor_t x, T* out) {
  const int32_t to_nhwc[4] = {0, 2, 3, 1}, to_nchw[4] = {0, 3, 1, 2};
  T a, b;
  flame_status_t st = flame_permute(x, to_nhwc, 4, a.out());
  if (st == FLAME_OK) st = flame_contiguous(a, b.out());
  if (st == FLAME_OK) st = flame_permute(b, to_nchw, 4, out->out());
  return st;
}

enum class Kind { Max, Avg, Adaptive };

// Input k becomes a random permutation of (i - n / 2) / 16: no ties, exact in f16 and bf16 (n <= 256).
std::function<void(std::vector<HT>&)> perm_grid(size_t k) {
  return [k](std::vector<HT>& xs) {
    HT& h = xs[k];
    std::vector<size_t> order(h.v.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return h.v[a] < h.v[b]; });
    const double half = static_cast<double>(h.v.size() / 2);
    for (size_t r = 0; r < order.size(); ++r) h.v[order[r]] = (static_cast<double>(r) - half) / 16.0;
  };
}

Row pool_row(std::string name, Kind kind, In x, PoolOpt o, bool cl, int64_t OH = 0, int64_t OW = 0) {
  Row r;
  r.name = std::move(name);
  r.covers = {kind == Kind::Max ? "max_pool2d" : "avg_pool2d", kind == Kind::Max ? "max_pool2d" : "avg_pool2d_backward"};
  r.cases = {Case({x}, kind == Kind::Max ? perm_grid(0) : nullptr)};
  r.fwd = [kind, o, cl, OH, OW](const Tensors& in, flame_dtype_t, std::vector<T>& out) {
    T xcl;
    flame_tensor_t x = in[0];
    if (cl) {
      flame_status_t st = channels_last_of(in[0], &xcl);
      if (st != FLAME_OK) return st;
      x = xcl;
    }
    const flame_pool2d_options_t f = flame_opts(o);
    out.emplace_back();
    if (kind == Kind::Max) return flame_max_pool2d(x, &f, out.back().out());
    if (kind == Kind::Avg) return flame_avg_pool2d(x, &f, out.back().out());
    return flame_adaptive_avg_pool2d(x, OH, OW, out.back().out());
  };
  r.ref = [kind, o, OH, OW](const std::vector<HT>& x) {
    if (kind == Kind::Max) return std::vector<HT>{max_pool_ref(x[0], o)};
    if (kind == Kind::Avg) return std::vector<HT>{avg_pool_ref(x[0], o)};
    return std::vector<HT>{adaptive_ref(x[0], OH, OW)};
  };
  return r;
}

const std::vector<Row>& rows() {
  static const std::vector<Row> table = [] {
    std::vector<Row> v;
    auto last = [&v]() -> Row& { return v.back(); };
    // ---- max
    v.push_back(pool_row("max_k3_s2_p1", Kind::Max, in({2, 3, 7, 6}), popt(3, 3, 2, 2, 1, 1), false));
    last().low_precision = true;
    v.push_back(pool_row("max_k2_s2_channels_last", Kind::Max, in({2, 4, 6, 6}), popt(2, 2, 2, 2), true));
    last().low_precision = true;
    PoolOpt dil = popt(3, 3, 2, 2, 1, 1);
    dil.d[0] = dil.d[1] = 2;
    dil.ceil = true;
    v.push_back(pool_row("max_dilation2_ceil", Kind::Max, in({1, 2, 9, 8}), dil, false));
    v.push_back(pool_row("max_unbatched_nc", Kind::Max, nc({3, 5, 6}), popt(2, 3, 2, 1, 1, 1), false));
    PoolOpt ceil = popt(3, 3, 2, 2);
    ceil.ceil = true;
    v.push_back(pool_row("max_ceil_partial_window", Kind::Max, in({1, 2, 6, 6}), ceil, false));
    // ---- avg
    v.push_back(pool_row("avg_k2_s2", Kind::Avg, in({2, 3, 6, 8}), popt(2, 2, 2, 2), false));
    last().low_precision = true;
    PoolOpt ex = popt(3, 3, 2, 2, 1, 1);
    ex.cip = false;
    v.push_back(pool_row("avg_k3_s2_p1_exclude_pad", Kind::Avg, in({1, 2, 7, 7}), ex, false));
    PoolOpt inc = popt(3, 3, 2, 2, 1, 1);
    inc.ceil = true;
    v.push_back(pool_row("avg_k3_s2_p1_ceil", Kind::Avg, in({1, 2, 6, 5}), inc, false));
    PoolOpt dv = popt(2, 2, 1, 2);
    dv.div = 3;
    v.push_back(pool_row("avg_divisor_override_channels_last", Kind::Avg, in({1, 3, 4, 6}), dv, true));
    last().low_precision = true;
    v.push_back(pool_row("avg_unbatched_nc", Kind::Avg, nc({2, 5, 6}), popt(3, 2, 2, 2, 1, 0), false));
    v.push_back(pool_row("avg_k2_s2_channels_last", Kind::Avg, in({2, 8, 6, 8}), popt(2, 2, 2, 2), true));  // 2x2 blocks
    last().low_precision = true;
    // ---- adaptive
    v.push_back(pool_row("adaptive_7x5_to_3x2", Kind::Adaptive, in({2, 3, 7, 5}), PoolOpt(), false, 3, 2));
    last().low_precision = true;
    v.push_back(pool_row("adaptive_up_3x3_to_4x5_nc", Kind::Adaptive, nc({1, 2, 3, 3}), PoolOpt(), false, 4, 5));
    v.push_back(pool_row("adaptive_global_channels_last", Kind::Adaptive, in({2, 4, 5, 5}), PoolOpt(), true, 1, 1));
    v.push_back(pool_row("adaptive_unbatched", Kind::Adaptive, in({2, 6, 4}), PoolOpt(), false, 4, 3));
    v.push_back(pool_row("adaptive_halves_6x8_to_3x4", Kind::Adaptive, in({2, 3, 6, 8}), PoolOpt(), false, 3, 4));  // 2x2 blocks
    return v;
  }();
  return table;
}

FLAME_GRADCHECK_SUITES(Pooling, PoolGradCheck, PoolGradGradCheck, rows, 0x94d049bb133111ebull);

// ------------------------------------------------------------------ direct tests

class PoolOps : public GpuTest {
 protected:
  // x.grad after backward of sum(max_pool2d(x) * w) with w = ones.
  HT max_grad(const HT& x, const PoolOpt& o, HT* y) {
    T xt, out, loss, g;
    EXPECT_EQ(upload(ctx, x, FLAME_DTYPE_F32, xt.out()), FLAME_OK);
    EXPECT_EQ(flame_tensor_set_requires_grad(xt, 1), FLAME_OK);
    const flame_pool2d_options_t f = flame_opts(o);
    EXPECT_EQ(flame_max_pool2d(xt, &f, out.out()), FLAME_OK) << flame_last_error_message();
    EXPECT_EQ(download(out, y), FLAME_OK);
    EXPECT_EQ(flame_sum_all(out, loss.out()), FLAME_OK);
    EXPECT_EQ(flame_backward(ctx, loss, nullptr, 0), FLAME_OK) << flame_last_error_message();
    EXPECT_EQ(flame_tensor_grad(xt, g.out()), FLAME_OK);
    HT h;
    EXPECT_EQ(download(g, &h), FLAME_OK);
    return h;
  }
};

TEST_F(PoolOps, TiesGoToTheFirstMaximumInScanOrder) {
  HT x(Shape{1, 1, 4, 4}, 2.0), y;
  HT g = max_grad(x, popt(2, 2, 2, 2), &y);
  HT want(x.shape);
  for (int64_t oh = 0; oh < 2; ++oh)
    for (int64_t ow = 0; ow < 2; ++ow) want.v[(2 * oh) * 4 + 2 * ow] = 1;  // the top-left of each window
  EXPECT_TRUE(close(g, want, 0, "2x2 windows"));
  // Overlapping 3x3 windows, stride 1, padding 1: each output's gradient lands on its window's first
  // element inside the input; the atomics add them up.
  HT g2 = max_grad(x, popt(3, 3, 1, 1, 1, 1), &y);
  HT want2(x.shape);
  for (int64_t oh = 0; oh < 4; ++oh)
    for (int64_t ow = 0; ow < 4; ++ow) want2.v[std::max<int64_t>(oh - 1, 0) * 4 + std::max<int64_t>(ow - 1, 0)] += 1;
  EXPECT_TRUE(close(g2, want2, 0, "3x3 windows, stride 1"));
}

TEST_F(PoolOps, NanPropagatesAndTakesTheGradient) {
  HT x(Shape{1, 1, 2, 4});
  x.v = {1, NAN, 3, 4, NAN, 0, -INFINITY, -INFINITY};
  HT y;
  HT g = max_grad(x, popt(2, 2, 2, 2), &y);
  ASSERT_EQ(y.v.size(), 2u);
  EXPECT_TRUE(std::isnan(y.v[0])) << "NaN propagates";
  EXPECT_EQ(y.v[1], 4.0);
  HT want(x.shape);
  want.v[4] = 1;  // the last NaN of the first window in scan order (PyTorch's rule)
  want.v[3] = 1;
  EXPECT_TRUE(close(g, want, 0, "gradient of NaN windows"));
  HT z(Shape{1, 1, 2, 2}, -INFINITY), yz;
  HT gz = max_grad(z, popt(2, 2, 2, 2), &yz);
  EXPECT_TRUE(std::isinf(yz.v[0]) && yz.v[0] < 0);
  HT wz(z.shape);
  wz.v[0] = 1;  // an all--inf window: the first element
  EXPECT_TRUE(close(gz, wz, 0, "all--inf window"));
}

TEST_F(PoolOps, ChannelsLastInputGivesChannelsLastOutput) {
  std::mt19937_64 rng(gc::seed() ^ 31);
  std::uniform_real_distribution<double> u(-2, 2);
  HT x(Shape{2, 5, 8, 6});
  for (double& e : x.v) e = u(rng);
  T xt, xcl;
  FLAME_ASSERT_OK(upload(ctx, x, FLAME_DTYPE_F32, xt.out()));
  FLAME_ASSERT_OK(channels_last_of(xt, &xcl));
  const flame_pool2d_options_t f = flame_opts(popt(3, 3, 2, 2, 1, 1));
  for (int which = 0; which < 3; ++which) {
    SCOPED_TRACE(which);
    T a, b;
    auto call = [&](flame_tensor_t in, T* o) {
      if (which == 0) return flame_max_pool2d(in, &f, o->out());
      if (which == 1) return flame_avg_pool2d(in, &f, o->out());
      return flame_adaptive_avg_pool2d(in, 3, 4, o->out());
    };
    FLAME_ASSERT_OK(call(xt, &a));
    FLAME_ASSERT_OK(call(xcl, &b));
    int64_t st[4];
    FLAME_ASSERT_OK(flame_tensor_strides(b, st, 4));
    const Shape s = shape_of(b);
    EXPECT_EQ(st[1], 1) << "channels-last result";
    EXPECT_EQ(st[3], s[1]);
    EXPECT_EQ(st[2], s[3] * s[1]);
    int32_t contiguous = 0;
    FLAME_ASSERT_OK(flame_tensor_is_contiguous(a, &contiguous));
    EXPECT_EQ(contiguous, 1) << "NCHW input: contiguous result";
    HT ha, hb;
    FLAME_ASSERT_OK(download(a, &ha));
    FLAME_ASSERT_OK(download(b, &hb));
    EXPECT_TRUE(close(hb, ha, 1e-6, "same values in both layouts"));
  }
}

TEST_F(PoolOps, EmptyBatch) {
  const int64_t s[4] = {0, 3, 6, 6};
  T x, a, b, c, loss;
  FLAME_ASSERT_OK(flame_zeros(ctx, s, 4, FLAME_DTYPE_F32, x.out()));
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(x, 1));
  const flame_pool2d_options_t f = flame_opts(popt(2, 2, 2, 2));
  FLAME_ASSERT_OK(flame_max_pool2d(x, &f, a.out()));
  FLAME_ASSERT_OK(flame_avg_pool2d(x, &f, b.out()));
  FLAME_ASSERT_OK(flame_adaptive_avg_pool2d(x, 2, 5, c.out()));
  EXPECT_EQ(shape_of(a), (Shape{0, 3, 3, 3}));
  EXPECT_EQ(shape_of(b), (Shape{0, 3, 3, 3}));
  EXPECT_EQ(shape_of(c), (Shape{0, 3, 2, 5}));
  FLAME_ASSERT_OK(flame_sum_all(a, loss.out()));
  FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
}

// The diffusion downsampling shape in bf16 (f32 accumulation) and a 3x3 stride-2 max pool in f32.
TEST_F(PoolOps, DiffusionSizes) {
  std::mt19937_64 rng(gc::seed() ^ 37);
  std::uniform_real_distribution<double> u(-3, 3);
  HT x(Shape{2, 64, 32, 32});
  for (double& e : x.v) e = u(rng);
  T xb, xf, a, b;
  FLAME_ASSERT_OK(upload(ctx, x, FLAME_DTYPE_BF16, xb.out()));
  HT xr;
  FLAME_ASSERT_OK(download(xb, &xr));
  const flame_pool2d_options_t avg = flame_opts(popt(2, 2, 2, 2)), mx = flame_opts(popt(3, 3, 2, 2, 1, 1));
  FLAME_ASSERT_OK(flame_avg_pool2d(xb, &avg, a.out()));
  HT ha;
  FLAME_ASSERT_OK(download(a, &ha));
  EXPECT_TRUE(close(ha, avg_pool_ref(xr, popt(2, 2, 2, 2)), 8e-3, "avg_pool2d 2x2 bf16"));
  FLAME_ASSERT_OK(upload(ctx, x, FLAME_DTYPE_F32, xf.out()));
  FLAME_ASSERT_OK(download(xf, &xr));
  FLAME_ASSERT_OK(flame_max_pool2d(xf, &mx, b.out()));
  HT hb;
  FLAME_ASSERT_OK(download(b, &hb));
  EXPECT_TRUE(close(hb, max_pool_ref(xr, popt(3, 3, 2, 2, 1, 1)), 0, "max_pool2d 3x3 s2 p1 f32"));
}

TEST_F(PoolOps, OptionsInitSetsPyTorchDefaults) {
  flame_pool2d_options_t o;
  std::memset(&o, 0x5a, sizeof o);
  FLAME_ASSERT_OK(flame_pool2d_options_init(&o, 3, 2));
  EXPECT_EQ(o.struct_size, sizeof o);
  EXPECT_EQ(o.kernel_size[0], 3);
  EXPECT_EQ(o.kernel_size[1], 2);
  EXPECT_EQ(o.stride[0], 3) << "stride defaults to the kernel size";
  EXPECT_EQ(o.stride[1], 2);
  EXPECT_EQ(o.padding[0], 0);
  EXPECT_EQ(o.padding[1], 0);
  EXPECT_EQ(o.dilation[0], 1);
  EXPECT_EQ(o.dilation[1], 1);
  EXPECT_EQ(o.ceil_mode, 0);
  EXPECT_EQ(o.count_include_pad, 1);
  EXPECT_EQ(o.divisor_override, 0);
  FLAME_EXPECT_STATUS(flame_pool2d_options_init(nullptr, 2, 2), FLAME_ERROR_INVALID_ARGUMENT);
}

TEST_F(PoolOps, BadArgumentsGiveTheDocumentedStatusAndNoOutput) {
  const int64_t s4[4] = {1, 2, 5, 5}, s2[2] = {5, 5}, s5[5] = {1, 1, 2, 5, 5}, s0c[4] = {1, 0, 5, 5}, small[4] = {1, 1, 2, 2};
  T x, x2, x5, x0c, xi, xs;
  FLAME_ASSERT_OK(flame_ones(ctx, s4, 4, FLAME_DTYPE_F32, x.out()));
  FLAME_ASSERT_OK(flame_ones(ctx, s2, 2, FLAME_DTYPE_F32, x2.out()));
  FLAME_ASSERT_OK(flame_ones(ctx, s5, 5, FLAME_DTYPE_F32, x5.out()));
  FLAME_ASSERT_OK(flame_ones(ctx, s0c, 4, FLAME_DTYPE_F32, x0c.out()));
  FLAME_ASSERT_OK(flame_ones(ctx, s4, 4, FLAME_DTYPE_I32, xi.out()));
  FLAME_ASSERT_OK(flame_ones(ctx, small, 4, FLAME_DTYPE_F32, xs.out()));
  auto with = [](std::function<void(flame_pool2d_options_t&)> f) {
    flame_pool2d_options_t o;
    flame_pool2d_options_init(&o, 2, 2);
    f(o);
    return o;
  };
  const flame_pool2d_options_t good = with([](flame_pool2d_options_t&) {});
  const flame_pool2d_options_t bad_size = with([](flame_pool2d_options_t& o) { o.struct_size = 8; });
  const flame_pool2d_options_t k0 = with([](flame_pool2d_options_t& o) { o.kernel_size[1] = 0; });
  const flame_pool2d_options_t s0 = with([](flame_pool2d_options_t& o) { o.stride[0] = 0; });
  const flame_pool2d_options_t d0 = with([](flame_pool2d_options_t& o) { o.dilation[0] = 0; });
  const flame_pool2d_options_t pbig = with([](flame_pool2d_options_t& o) { o.padding[0] = 2; });
  const flame_pool2d_options_t pneg = with([](flame_pool2d_options_t& o) { o.padding[1] = -1; });
  const flame_pool2d_options_t k3 = with([](flame_pool2d_options_t& o) { o.kernel_size[0] = o.kernel_size[1] = 3; });
  const flame_pool2d_options_t ceil2 = with([](flame_pool2d_options_t& o) { o.ceil_mode = 2; });
  const flame_pool2d_options_t cip5 = with([](flame_pool2d_options_t& o) { o.count_include_pad = 5; });
  const flame_pool2d_options_t dil2 = with([](flame_pool2d_options_t& o) { o.dilation[1] = 2; });
  const flame_pool2d_options_t divneg = with([](flame_pool2d_options_t& o) { o.divisor_override = -1; });
  struct Bad {
    const char* what;
    flame_status_t want;
    std::function<flame_status_t(flame_tensor_t*)> call;
  };
  const std::vector<Bad> bad = {
      {"NULL x", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_max_pool2d(nullptr, &good, o); }},
      {"NULL opts", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_avg_pool2d(x, nullptr, o); }},
      {"struct_size", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_max_pool2d(x, &bad_size, o); }},
      {"kernel 0", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_max_pool2d(x, &k0, o); }},
      {"stride 0", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_avg_pool2d(x, &s0, o); }},
      {"dilation 0", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_max_pool2d(x, &d0, o); }},
      {"padding above half", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_max_pool2d(x, &pbig, o); }},
      {"padding negative", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_avg_pool2d(x, &pneg, o); }},
      {"output too small", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_max_pool2d(xs, &k3, o); }},
      {"ceil_mode 2", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_max_pool2d(x, &ceil2, o); }},
      {"count_include_pad 5", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_avg_pool2d(x, &cip5, o); }},
      {"avg dilation", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_avg_pool2d(x, &dil2, o); }},
      {"divisor negative", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_avg_pool2d(x, &divneg, o); }},
      {"2-D x", FLAME_ERROR_SHAPE_MISMATCH, [&](flame_tensor_t* o) { return flame_max_pool2d(x2, &good, o); }},
      {"5-D x", FLAME_ERROR_SHAPE_MISMATCH, [&](flame_tensor_t* o) { return flame_avg_pool2d(x5, &good, o); }},
      {"no channels", FLAME_ERROR_SHAPE_MISMATCH, [&](flame_tensor_t* o) { return flame_adaptive_avg_pool2d(x0c, 2, 2, o); }},
      {"integer x", FLAME_ERROR_DTYPE_MISMATCH, [&](flame_tensor_t* o) { return flame_max_pool2d(xi, &good, o); }},
      {"adaptive negative", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_adaptive_avg_pool2d(x, -1, 2, o); }},
  };
  for (const Bad& b : bad) {
    flame_tensor_t out = reinterpret_cast<flame_tensor_t>(static_cast<uintptr_t>(0x10));
    flame_status_t st = b.call(&out);
    EXPECT_EQ(st, b.want) << b.what << ": " << flame_status_string(st) << " " << flame_last_error_message();
    EXPECT_EQ(out, nullptr) << b.what;
    if (st == FLAME_OK && out) flame_tensor_release(out);
  }
  FLAME_EXPECT_STATUS(flame_max_pool2d(x, &good, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
}

}  // namespace

// conv2d, conv_transpose2d and conv1d (FLAME_CONV_OPS of src/tensor/op_list.h) through the C ABI:
//  - forward and the gradients of x, weight and bias against float64 host references computed
//    from the values the device holds (rounded inputs), in f32, f64, f16 and bf16, for strides,
//    padding, 'same' (odd, even and dilated kernels), dilation, groups, depthwise, with and without
//    bias, 1x1 / 3x3 / 5x5 and rectangular kernels, odd sizes, NCHW, channels-last and transposed
//    (strided) inputs, channels-last weights, and shapes large enough for several tiles, a
//    software-pipelined reduction and a split weight-gradient reduction;
//  - the memory format of results (channels-last in, channels-last out) and of weight gradients;
//  - conv2d also on a context created with FLAME_DISABLE_CUDNN=1 (FLAME's kernels where cuDNN is
//    installed; test_conv_cudnn.cpp compares the two paths);
//  - finite differences (gradcheck.h): first order in f64 and f32, second order (create_graph) in f64;
//  - bad arguments: the documented status, a NULL result and a message naming the argument.
// Reproduce a failure with FLAME_GRADCHECK_SEED=<seed printed in the failure>.
#include <cmath>
#include <set>

#include "cudnn_pair.h"
#include "gradcheck.h"

using namespace gc;

namespace {

constexpr flame_dtype_t kDtypes[] = {FLAME_DTYPE_F32, FLAME_DTYPE_F64, FLAME_DTYPE_F16, FLAME_DTYPE_BF16};

// ------------------------------------------------------------------ host references (float64)

// The geometry of conv(x, w): x [N, C, H, W], w [O, C / G, kh, kw], y [N, O, Ho, Wo]; ph / pw is
// the padding before the first row / column (the padding after follows from Ho / Wo).
struct Geo {
  int64_t N, C, H, W, O, kh, kw, G, sh, sw, ph, pw, dh, dw, Ho, Wo;
};

// The PyTorch-style options of one call (converted to flame_conv_options_t by opts()).
struct Args {
  int64_t stride[2] = {1, 1}, padding[2] = {0, 0}, dilation[2] = {1, 1}, groups = 1, output_padding[2] = {0, 0};
  int32_t same = 0;
  flame_conv_options_t opts() const {
    flame_conv_options_t o;
    EXPECT_EQ(flame_conv_options_init(&o), FLAME_OK);
    for (int i = 0; i < 2; ++i) {
      o.stride[i] = stride[i];
      o.padding[i] = padding[i];
      o.dilation[i] = dilation[i];
      o.output_padding[i] = output_padding[i];
    }
    o.groups = groups;
    o.padding_same = same;
    return o;
  }
};
Args args(std::vector<int64_t> s, std::vector<int64_t> p, std::vector<int64_t> d, int64_t g = 1, int32_t same = 0,
          std::vector<int64_t> op = {0, 0}) {
  Args a;
  for (int i = 0; i < 2; ++i) {
    a.stride[i] = s[i];
    a.padding[i] = p[i];
    a.dilation[i] = d[i];
    a.output_padding[i] = op[i];
  }
  a.groups = g;
  a.same = same;
  return a;
}

// torch.nn.functional.conv2d's geometry for x, w of these shapes.
Geo conv_geo(const Shape& x, const Shape& w, const Args& a) {
  Geo g{x[0], x[1], x[2], x[3], w[0], w[2], w[3], a.groups, a.stride[0], a.stride[1], 0, 0, a.dilation[0], a.dilation[1], 0, 0};
  if (a.same) {
    g.ph = g.dh * (g.kh - 1) / 2;  // PyTorch: total // 2 before, the rest after
    g.pw = g.dw * (g.kw - 1) / 2;
    g.Ho = g.H;
    g.Wo = g.W;
  } else {
    g.ph = a.padding[0];
    g.pw = a.padding[1];
    g.Ho = (g.H + 2 * g.ph - g.dh * (g.kh - 1) - 1) / g.sh + 1;
    g.Wo = (g.W + 2 * g.pw - g.dw * (g.kw - 1) - 1) / g.sw + 1;
  }
  return g;
}
// torch.nn.functional.conv_transpose2d as the convolution it is the adjoint of: its output is that
// convolution's input [N, C_out, H_out, W_out], its input that convolution's output.
Geo convt_geo(const Shape& x, const Shape& w, const Args& a) {
  Geo g{x[0], w[1] * a.groups, 0, 0, x[1], w[2], w[3], a.groups, a.stride[0], a.stride[1], a.padding[0], a.padding[1],
        a.dilation[0], a.dilation[1], x[2], x[3]};
  g.H = (g.Ho - 1) * g.sh - 2 * g.ph + g.dh * (g.kh - 1) + a.output_padding[0] + 1;
  g.W = (g.Wo - 1) * g.sw - 2 * g.pw + g.dw * (g.kw - 1) + a.output_padding[1] + 1;
  return g;
}

int64_t at4(const Shape& s, int64_t a, int64_t b, int64_t c, int64_t d) { return ((a * s[1] + b) * s[2] + c) * s[3] + d; }

// f(y index, x index, w index) for every product term y[n, o, p, q] += x[n, c, ih, iw] * w[o, c', r, s].
template <class F>
void for_each_term(const Geo& g, F f) {
  const int64_t Cg = g.C / g.G, Og = g.O / g.G;
  const Shape ys = {g.N, g.O, g.Ho, g.Wo}, xs = {g.N, g.C, g.H, g.W}, ws = {g.O, Cg, g.kh, g.kw};
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t o = 0; o < g.O; ++o)
      for (int64_t p = 0; p < g.Ho; ++p)
        for (int64_t q = 0; q < g.Wo; ++q)
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t r = 0; r < g.kh; ++r)
              for (int64_t s = 0; s < g.kw; ++s) {
                const int64_t ih = p * g.sh - g.ph + r * g.dh, iw = q * g.sw - g.pw + s * g.dw;
                if (ih < 0 || ih >= g.H || iw < 0 || iw >= g.W) continue;
                f(at4(ys, n, o, p, q), at4(xs, n, (o / Og) * Cg + c, ih, iw), at4(ws, o, c, r, s));
              }
}

// y = conv(x, w) + b
HT ref_conv(const HT& x, const HT& w, const HT* b, const Geo& g) {
  HT y({g.N, g.O, g.Ho, g.Wo});
  if (b)
    for (int64_t i = 0; i < y.numel(); ++i) y.v[i] = b->v[(i / (g.Ho * g.Wo)) % g.O];
  for_each_term(g, [&](int64_t yi, int64_t xi, int64_t wi) { y.v[yi] += x.v[xi] * w.v[wi]; });
  return y;
}
// Gradients of sum(conv(x, w) * gy).
void ref_conv_grads(const HT& x, const HT& w, const HT& gy, const Geo& g, HT* dx, HT* dw, HT* db) {
  *dx = HT(x.shape);
  *dw = HT(w.shape);
  *db = HT({g.O});
  for_each_term(g, [&](int64_t yi, int64_t xi, int64_t wi) {
    dx->v[xi] += gy.v[yi] * w.v[wi];
    dw->v[wi] += gy.v[yi] * x.v[xi];
  });
  for (int64_t i = 0; i < gy.numel(); ++i) db->v[(i / (g.Ho * g.Wo)) % g.O] += gy.v[i];
}
// z = conv_transpose(x, w) + b: every term of the convolution g, scattered the other way.
HT ref_convt(const HT& x, const HT& w, const HT* b, const Geo& g) {
  HT z({g.N, g.C, g.H, g.W});
  if (b)
    for (int64_t i = 0; i < z.numel(); ++i) z.v[i] = b->v[(i / (g.H * g.W)) % g.C];
  for_each_term(g, [&](int64_t xi, int64_t zi, int64_t wi) { z.v[zi] += x.v[xi] * w.v[wi]; });
  return z;
}
void ref_convt_grads(const HT& x, const HT& w, const HT& gz, const Geo& g, HT* dx, HT* dw, HT* db) {
  *dx = HT(x.shape);
  *dw = HT(w.shape);
  *db = HT({g.C});
  for_each_term(g, [&](int64_t xi, int64_t zi, int64_t wi) {
    dx->v[xi] += gz.v[zi] * w.v[wi];
    dw->v[wi] += gz.v[zi] * x.v[xi];
  });
  for (int64_t i = 0; i < gz.numel(); ++i) db->v[(i / (g.H * g.W)) % g.C] += gz.v[i];
}

// ------------------------------------------------------------------ comparison and helpers

using cudnn_pair::Tol;  // |got - want| <= rtol |want| + atol max(1, max |want|)
Tol tol(flame_dtype_t d) {
  switch (d) {
    case FLAME_DTYPE_F64: return {1e-10, 1e-12};
    case FLAME_DTYPE_F32: return {1e-4, 2e-5};
    case FLAME_DTYPE_F16: return {4e-3, 2e-3};  // one f16 rounding of the result (2^-11) plus f32 sums
    default: return {1.6e-2, 8e-3};             // bf16: one rounding (2^-8) plus f32 sums
  }
}

::testing::AssertionResult near(const HT& got, const HT& want, Tol t, const std::string& what) {
  return cudnn_pair::agree(got, want, t, what, "got", "expected");
}

Shape strides_of(flame_tensor_t t) {
  Shape s = shape_of(t), st(s.size());
  if (!s.empty()) {
    EXPECT_EQ(flame_tensor_strides(t, st.data(), static_cast<int32_t>(st.size())), FLAME_OK);
  }
  return st;
}
// Whether t has the strides of a dense tensor whose dims are stored in `order` (slowest first);
// size-1 dims may have any stride.
bool dense_in_order(flame_tensor_t t, const std::vector<int>& order) {
  Shape s = shape_of(t), st = strides_of(t);
  int64_t expect = 1;
  for (size_t k = order.size(); k-- > 0;) {
    const int d = order[k];
    if (s[d] != 1 && st[d] != expect) return false;
    expect *= s[d];
  }
  return true;
}
// Channels-last order of a 3-D or 4-D tensor: N, spatial dims, C.
std::vector<int> cl_order(size_t nd) { return nd == 3 ? std::vector<int>{0, 2, 1} : std::vector<int>{0, 2, 3, 1}; }
std::vector<int> plain_order(size_t nd) {
  std::vector<int> o(nd);
  for (size_t i = 0; i < nd; ++i) o[i] = static_cast<int>(i);
  return o;
}

HT random_ht(const Shape& s, std::mt19937_64& rng, double lo = -1, double hi = 1) {
  HT h(s);
  std::uniform_real_distribution<double> u(lo, hi);
  for (auto& e : h.v) e = u(rng);
  return h;
}

uint64_t seed_for(const std::string& name) {
  uint64_t h = gc::seed() ^ 0xc0417ull;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

// Memory layouts of a leaf: contiguous, channels-last (NHWC memory permuted to NCHW), or a
// transposed view of its last two dims.
enum class Layout { Plain, ChannelsLast, Transposed };
const char* layout_name(Layout l) { return l == Layout::Plain ? "NCHW" : (l == Layout::ChannelsLast ? "channels-last" : "transposed"); }

class ConvTest : public GpuTest {
 public:
  // Uploads x as a leaf in layout l (which requires grad) and returns the values the device holds.
  HT leaf(const HT& x, flame_dtype_t dt, Layout l, T* out, bool grad = true) {
    if (l == Layout::ChannelsLast) {
      std::vector<int> to = cl_order(x.shape.size()), back(to.size());
      for (size_t i = 0; i < to.size(); ++i) back[static_cast<size_t>(to[i])] = static_cast<int>(i);
      T base;
      EXPECT_EQ(upload(ctx, permute(x, to), dt, base.out()), FLAME_OK);
      std::vector<int32_t> b32(back.begin(), back.end());
      EXPECT_EQ(flame_permute(base, b32.data(), static_cast<int32_t>(b32.size()), out->out()), FLAME_OK) << flame_last_error_message();
    } else {
      EXPECT_EQ(make_leaf(ctx, x, dt, l == Layout::Transposed, out), FLAME_OK) << flame_last_error_message();
    }
    HT held;
    EXPECT_EQ(download(*out, &held), FLAME_OK);
    if (grad) {
      EXPECT_EQ(flame_tensor_set_requires_grad(*out, 1), FLAME_OK);
    }
    return held;
  }
  // d(sum(y * gr))/d(wrt) through flame_grad; gr_held: gr as the device holds it.
  std::vector<HT> grads(flame_tensor_t y, const HT& gr, flame_dtype_t dt, const std::vector<flame_tensor_t>& wrt, HT* gr_held,
                        std::vector<T>* keep = nullptr) {
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
        EXPECT_EQ(dtype_of(r), dt);
      }
      out.push_back(h);
      if (keep) keep->push_back(std::move(held));
    }
    return out;
  }
};

std::string trace(const std::string& what, flame_dtype_t dt) {
  return what + " " + flame_dtype_name(dt) + " FLAME_GRADCHECK_SEED=" + std::to_string(gc::seed());
}

// ------------------------------------------------------------------ conv2d vs host

struct Conv2dCase {
  std::string name;
  Shape x, w;
  Args a;
  bool bias;
  Layout xl;
  bool w_cl = false;  // channels-last weight
};

std::vector<Conv2dCase> conv2d_cases() {
  const Args d = Args();
  return {
      {"3x3", {2, 3, 7, 6}, {4, 3, 3, 3}, d, true, Layout::Plain},
      {"3x3_pad1_cl", {2, 8, 9, 7}, {16, 8, 3, 3}, args({1, 1}, {1, 1}, {1, 1}), true, Layout::ChannelsLast},
      {"1x1_nobias", {2, 16, 5, 3}, {24, 16, 1, 1}, d, false, Layout::Plain},
      {"1x1_cl_weight_cl", {1, 32, 4, 5}, {32, 32, 1, 1}, d, true, Layout::ChannelsLast, true},
      {"5x5_stride2_pad2", {2, 5, 11, 9}, {17, 5, 5, 5}, args({2, 2}, {2, 2}, {1, 1}), true, Layout::Plain},
      {"stride2_downsample_cl", {2, 32, 10, 9}, {32, 32, 3, 3}, args({2, 2}, {1, 1}, {1, 1}), true, Layout::ChannelsLast},
      {"rect_kernel_stride21_pad12", {1, 4, 8, 7}, {20, 4, 2, 3}, args({2, 1}, {1, 2}, {1, 1}), true, Layout::Transposed},
      {"dilation2", {2, 6, 9, 10}, {18, 6, 3, 3}, args({1, 1}, {2, 1}, {2, 2}), true, Layout::Plain},
      {"dilation_stride_mixed", {1, 8, 13, 11}, {16, 8, 3, 2}, args({3, 2}, {0, 3}, {2, 3}), false, Layout::ChannelsLast},
      {"same_3x3", {2, 8, 6, 7}, {16, 8, 3, 3}, args({1, 1}, {0, 0}, {1, 1}, 1, 1), true, Layout::Plain},
      {"same_even_2x4", {1, 4, 5, 6}, {16, 4, 2, 4}, args({1, 1}, {9, 9}, {1, 1}, 1, 1), true, Layout::ChannelsLast},
      {"same_dilated_even", {1, 3, 7, 8}, {16, 3, 4, 2}, args({1, 1}, {0, 0}, {2, 3}, 1, 1), true, Layout::Plain},
      {"groups2", {2, 32, 6, 5}, {32, 16, 3, 3}, args({1, 1}, {1, 1}, {1, 1}, 2), true, Layout::ChannelsLast},
      {"groups4_odd", {1, 12, 7, 7}, {64, 3, 3, 3}, args({1, 1}, {1, 1}, {1, 1}, 4), true, Layout::Plain},
      {"groups_small_out", {2, 8, 5, 6}, {8, 2, 3, 3}, args({1, 1}, {1, 1}, {1, 1}, 4), true, Layout::ChannelsLast},
      {"depthwise_3x3", {2, 8, 7, 6}, {8, 1, 3, 3}, args({1, 1}, {1, 1}, {1, 1}, 8), true, Layout::ChannelsLast},
      {"depthwise_mult2_stride2", {1, 6, 9, 8}, {12, 1, 5, 5}, args({2, 2}, {2, 2}, {1, 1}, 6), false, Layout::Plain},
      {"tiny_channels_first_layer", {2, 3, 12, 10}, {32, 3, 3, 3}, args({1, 1}, {1, 1}, {1, 1}), true, Layout::ChannelsLast},
      {"channels_20_24", {1, 20, 8, 9}, {24, 20, 3, 3}, args({1, 1}, {1, 1}, {1, 1}), true, Layout::Plain},
      {"single_pixel", {3, 16, 1, 1}, {16, 16, 1, 1}, d, true, Layout::Plain},
      // several tiles in m and n, 18 pipelined k slices, a split weight-gradient reduction
      {"tiles_cl", {2, 64, 18, 20}, {160, 64, 3, 3}, args({1, 1}, {1, 1}, {1, 1}), true, Layout::ChannelsLast},
      {"tiles_nchw", {4, 32, 32, 32}, {64, 32, 3, 3}, args({1, 1}, {1, 1}, {1, 1}), true, Layout::Plain},
  };
}

void conv2d_test(ConvTest* t, const Conv2dCase& c, flame_dtype_t dt, std::mt19937_64& rng) {
  SCOPED_TRACE(trace("conv2d " + c.name + " " + layout_name(c.xl) + (c.w_cl ? " (channels-last weight)" : ""), dt));
  T x, w, b, y;
  HT xh = t->leaf(random_ht(c.x, rng), dt, c.xl, &x);
  HT wh = t->leaf(random_ht(c.w, rng), dt, c.w_cl ? Layout::ChannelsLast : Layout::Plain, &w);
  HT bh;
  if (c.bias) bh = t->leaf(random_ht({c.w[0]}, rng), dt, Layout::Plain, &b);
  const flame_conv_options_t o = c.a.opts();
  FLAME_ASSERT_OK(flame_conv2d(x, w, b, &o, y.out()));
  const Geo g = conv_geo(c.x, c.w, c.a);
  EXPECT_EQ(dtype_of(y), dt);
  const bool cl_out = c.xl == Layout::ChannelsLast || c.w_cl;
  EXPECT_TRUE(dense_in_order(y, cl_out ? cl_order(4) : plain_order(4)))
      << "result strides " << shape_str(strides_of(y)) << " for shape " << shape_str(shape_of(y));
  HT got;
  FLAME_ASSERT_OK(download(y, &got));
  EXPECT_TRUE(near(got, ref_conv(xh, wh, c.bias ? &bh : nullptr, g), tol(dt), "forward"));
  std::vector<flame_tensor_t> wrt = {x, w};
  if (c.bias) wrt.push_back(b);
  HT gr_held;
  std::vector<T> keep;
  std::vector<HT> gs = t->grads(y, random_ht(got.shape, rng), dt, wrt, &gr_held, &keep);
  HT dx, dw, db;
  ref_conv_grads(xh, wh, gr_held, g, &dx, &dw, &db);
  EXPECT_TRUE(near(gs[0], dx, tol(dt), "dx"));
  EXPECT_TRUE(near(gs[1], dw, tol(dt), "dweight"));
  if (c.bias) {
    EXPECT_TRUE(near(gs[2], db, tol(dt), "dbias"));
  }
  // The weight gradient keeps the weight's memory format.
  EXPECT_TRUE(dense_in_order(keep[1], c.w_cl ? cl_order(4) : plain_order(4))) << "weight gradient strides "
                                                                                 << shape_str(strides_of(keep[1]));
}

TEST_F(ConvTest, Conv2dForwardAndGradientsMatchHost) {
  for (flame_dtype_t dt : kDtypes)
    for (const Conv2dCase& c : conv2d_cases()) {
      std::mt19937_64 rng(seed_for(c.name + flame_dtype_name(dt)));
      conv2d_test(this, c, dt, rng);
      if (HasFatalFailure()) return;
    }
}

// The same cases on a context created with FLAME_DISABLE_CUDNN=1, so that FLAME's own kernels meet
// the host reference also where cuDNN is installed (the test above then runs through cuDNN).
TEST_F(ConvTest, Conv2dFlameKernelsMatchHostWithCudnnOff) {
  flame_ctx_t off = cudnn_pair::cudnn_off_context();
  ASSERT_NE(off, nullptr);
  std::swap(ctx, off);  // leaf() and grads() use ctx
  for (flame_dtype_t dt : {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_BF16})
    for (const Conv2dCase& c : conv2d_cases()) {
      std::mt19937_64 rng(seed_for("off" + c.name + flame_dtype_name(dt)));
      conv2d_test(this, c, dt, rng);
      if (HasFatalFailure()) break;
    }
  std::swap(ctx, off);
  int32_t version = -1;
  uint64_t n = 1;
  EXPECT_EQ(flame_ctx_cudnn_info(off, &version, &n), FLAME_OK);
  EXPECT_EQ(version, 0);
  EXPECT_EQ(n, 0u);
  flame_ctx_destroy(off);
}

TEST_F(ConvTest, UnetLikeBf16ChannelsLastConv) {
  // A UNet-style 3x3 conv large enough for full 128x128 tiles on both sides and many k slices.
  Conv2dCase c{"unet_3x3", {1, 128, 16, 16}, {256, 128, 3, 3}, args({1, 1}, {1, 1}, {1, 1}), true, Layout::ChannelsLast};
  std::mt19937_64 rng(seed_for("unet"));
  conv2d_test(this, c, FLAME_DTYPE_BF16, rng);
}

// ------------------------------------------------------------------ conv_transpose2d vs host

struct ConvTCase {
  std::string name;
  Shape x, w;  // x [N, C_in, H, W], w [C_in, C_out / groups, kh, kw]
  Args a;
  bool bias;
  Layout xl;
};

std::vector<ConvTCase> convt_cases() {
  return {
      {"basic", {2, 4, 5, 4}, {4, 3, 3, 3}, Args(), true, Layout::Plain},
      {"upsample_stride2_outpad1_cl", {2, 16, 5, 6}, {16, 32, 3, 3}, args({2, 2}, {1, 1}, {1, 1}, 1, 0, {1, 1}), true,
       Layout::ChannelsLast},
      {"stride2_k4_pad1", {1, 32, 4, 3}, {32, 16, 4, 4}, args({2, 2}, {1, 1}, {1, 1}), false, Layout::Plain},
      {"groups2_dilation", {2, 8, 4, 5}, {8, 10, 3, 2}, args({1, 2}, {1, 0}, {2, 1}, 2, 0, {1, 1}), true, Layout::Transposed},
      {"groups_many_out", {1, 32, 3, 4}, {32, 24, 3, 3}, args({2, 3}, {1, 2}, {1, 1}, 2, 0, {1, 2}), true, Layout::ChannelsLast},
      {"depthwise", {2, 6, 5, 5}, {6, 1, 3, 3}, args({2, 2}, {1, 1}, {1, 1}, 6, 0, {1, 0}), true, Layout::Plain},
      {"1x1", {2, 24, 3, 5}, {24, 40, 1, 1}, Args(), true, Layout::ChannelsLast},
  };
}

TEST_F(ConvTest, ConvTranspose2dForwardAndGradientsMatchHost) {
  for (flame_dtype_t dt : kDtypes)
    for (const ConvTCase& c : convt_cases()) {
      SCOPED_TRACE(trace("conv_transpose2d " + c.name + " " + layout_name(c.xl), dt));
      std::mt19937_64 rng(seed_for("t" + c.name + flame_dtype_name(dt)));
      T x, w, b, y;
      HT xh = leaf(random_ht(c.x, rng), dt, c.xl, &x);
      HT wh = leaf(random_ht(c.w, rng), dt, Layout::Plain, &w);
      const Geo g = convt_geo(c.x, c.w, c.a);
      HT bh;
      if (c.bias) bh = leaf(random_ht({g.C}, rng), dt, Layout::Plain, &b);
      const flame_conv_options_t o = c.a.opts();
      FLAME_ASSERT_OK(flame_conv_transpose2d(x, w, b, &o, y.out()));
      EXPECT_TRUE(dense_in_order(y, c.xl == Layout::ChannelsLast ? cl_order(4) : plain_order(4)));
      HT got;
      FLAME_ASSERT_OK(download(y, &got));
      EXPECT_TRUE(near(got, ref_convt(xh, wh, c.bias ? &bh : nullptr, g), tol(dt), "forward"));
      std::vector<flame_tensor_t> wrt = {x, w};
      if (c.bias) wrt.push_back(b);
      HT gr_held;
      std::vector<HT> gs = grads(y, random_ht(got.shape, rng), dt, wrt, &gr_held);
      HT dx, dw, db;
      ref_convt_grads(xh, wh, gr_held, g, &dx, &dw, &db);
      EXPECT_TRUE(near(gs[0], dx, tol(dt), "dx"));
      EXPECT_TRUE(near(gs[1], dw, tol(dt), "dweight"));
      if (c.bias) {
        EXPECT_TRUE(near(gs[2], db, tol(dt), "dbias"));
      }
      if (HasFatalFailure()) return;
    }
}

// ------------------------------------------------------------------ conv1d vs host

TEST_F(ConvTest, Conv1dForwardAndGradientsMatchHost) {
  struct C1 {
    std::string name;
    Shape x, w;  // [N, C, L], [O, C / groups, k]
    Args a;      // element 0 of each pair
    bool bias;
    Layout xl;
  };
  const std::vector<C1> cases = {
      {"k3", {2, 4, 11}, {8, 4, 3}, Args(), true, Layout::Plain},
      {"stride2_pad1_cl", {3, 16, 9}, {24, 16, 3}, args({2, 1}, {1, 0}, {1, 1}), true, Layout::ChannelsLast},
      {"same_even_dilated", {1, 6, 10}, {16, 6, 4}, args({1, 1}, {0, 0}, {2, 1}, 1, 1), false, Layout::Transposed},
      {"groups3", {2, 9, 7}, {18, 3, 5}, args({1, 1}, {2, 0}, {1, 1}, 3), true, Layout::Plain},
  };
  for (flame_dtype_t dt : kDtypes)
    for (const C1& c : cases) {
      SCOPED_TRACE(trace("conv1d " + c.name + " " + layout_name(c.xl), dt));
      std::mt19937_64 rng(seed_for("1d" + c.name + flame_dtype_name(dt)));
      T x, w, b, y;
      HT xh = leaf(random_ht(c.x, rng), dt, c.xl, &x);
      HT wh = leaf(random_ht(c.w, rng), dt, Layout::Plain, &w);
      HT bh;
      if (c.bias) bh = leaf(random_ht({c.w[0]}, rng), dt, Layout::Plain, &b);
      const flame_conv_options_t o = c.a.opts();
      FLAME_ASSERT_OK(flame_conv1d(x, w, b, &o, y.out()));
      // A transposed [N, C, L] leaf has channel stride 1: it is channels-last too.
      EXPECT_TRUE(dense_in_order(y, c.xl != Layout::Plain ? cl_order(3) : plain_order(3)));
      // The reference: conv2d over [N, C, 1, L] with the pairs' element 0 on the width.
      Args a2 = args({1, c.a.stride[0]}, {0, c.a.padding[0]}, {1, c.a.dilation[0]}, c.a.groups, c.a.same);
      const Shape x4 = {c.x[0], c.x[1], 1, c.x[2]}, w4 = {c.w[0], c.w[1], 1, c.w[2]};
      const Geo g = conv_geo(x4, w4, a2);
      HT want = ref_conv(reshape(xh, x4), reshape(wh, w4), c.bias ? &bh : nullptr, g), got;
      FLAME_ASSERT_OK(download(y, &got));
      EXPECT_TRUE(near(got, reshape(want, {g.N, g.O, g.Wo}), tol(dt), "forward"));
      std::vector<flame_tensor_t> wrt = {x, w};
      if (c.bias) wrt.push_back(b);
      HT gr_held;
      std::vector<HT> gs = grads(y, random_ht(got.shape, rng), dt, wrt, &gr_held);
      HT dx, dw, db;
      ref_conv_grads(reshape(xh, x4), reshape(wh, w4), reshape(gr_held, {g.N, g.O, 1, g.Wo}), g, &dx, &dw, &db);
      EXPECT_TRUE(near(gs[0], reshape(dx, c.x), tol(dt), "dx"));
      EXPECT_TRUE(near(gs[1], reshape(dw, c.w), tol(dt), "dweight"));
      if (c.bias) {
        EXPECT_TRUE(near(gs[2], db, tol(dt), "dbias"));
      }
      if (HasFatalFailure()) return;
    }
}

// ------------------------------------------------------------------ options, layouts, edge cases

TEST_F(ConvTest, NullOptionsMeanDefaults) {
  std::mt19937_64 rng(seed_for("defaults"));
  T x, w, y0, y1;
  HT xh = leaf(random_ht({1, 2, 5, 5}, rng), FLAME_DTYPE_F32, Layout::Plain, &x, false);
  HT wh = leaf(random_ht({3, 2, 3, 3}, rng), FLAME_DTYPE_F32, Layout::Plain, &w, false);
  flame_conv_options_t o;
  FLAME_ASSERT_OK(flame_conv_options_init(&o));
  EXPECT_EQ(o.struct_size, sizeof(flame_conv_options_t));
  EXPECT_EQ(o.stride[0], 1);
  EXPECT_EQ(o.dilation[1], 1);
  EXPECT_EQ(o.groups, 1);
  EXPECT_EQ(o.padding[0], 0);
  EXPECT_EQ(o.output_padding[1], 0);
  EXPECT_EQ(o.padding_same, 0);
  FLAME_ASSERT_OK(flame_conv2d(x, w, nullptr, nullptr, y0.out()));
  FLAME_ASSERT_OK(flame_conv2d(x, w, nullptr, &o, y1.out()));
  HT a, b;
  FLAME_ASSERT_OK(download(y0, &a));
  FLAME_ASSERT_OK(download(y1, &b));
  EXPECT_EQ(a.shape, (Shape{1, 3, 3, 3}));
  EXPECT_EQ(a.v, b.v);
  EXPECT_TRUE(near(a, ref_conv(xh, wh, nullptr, conv_geo(xh.shape, wh.shape, Args())), tol(FLAME_DTYPE_F32), "forward"));
  // An older caller's struct: only the fields up to padding_same are read.
  o.struct_size = offsetof(flame_conv_options_t, padding_same) + sizeof(int32_t);
  FLAME_ASSERT_OK(flame_conv2d(x, w, nullptr, &o, y1.out()));
}

TEST_F(ConvTest, EmptyBatchGivesEmptyResultAndZeroWeightGradient) {
  T x, w, b, y;
  FLAME_ASSERT_OK(flame_zeros(ctx, std::vector<int64_t>{0, 4, 5, 5}.data(), 4, FLAME_DTYPE_F32, x.out()));
  FLAME_ASSERT_OK(upload(ctx, HT({16, 4, 3, 3}, 0.5), FLAME_DTYPE_F32, w.out()));
  FLAME_ASSERT_OK(upload(ctx, HT({16}, 0.5), FLAME_DTYPE_F32, b.out()));
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(x, 1));
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(w, 1));
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(b, 1));
  FLAME_ASSERT_OK(flame_conv2d(x, w, b, nullptr, y.out()));
  EXPECT_EQ(shape_of(y), (Shape{0, 16, 3, 3}));
  T s;
  FLAME_ASSERT_OK(flame_sum_all(y, s.out()));
  FLAME_ASSERT_OK(flame_backward(ctx, s, nullptr, 0));
  T gw, gb;
  FLAME_ASSERT_OK(flame_tensor_grad(w, gw.out()));
  FLAME_ASSERT_OK(flame_tensor_grad(b, gb.out()));
  HT hw, hb;
  FLAME_ASSERT_OK(download(gw, &hw));
  FLAME_ASSERT_OK(download(gb, &hb));
  for (double v : hw.v) EXPECT_EQ(v, 0.0);
  for (double v : hb.v) EXPECT_EQ(v, 0.0);
}

TEST_F(ConvTest, GradientsAccumulateIntoLeavesThroughBackward) {
  // The same conv twice: .grad of weight is twice one conv's gradient (nothing dropped, nothing doubled).
  std::mt19937_64 rng(seed_for("accumulate"));
  T x, w, y1, y2, s1, s2, s;
  HT xh = leaf(random_ht({1, 16, 6, 6}, rng), FLAME_DTYPE_F64, Layout::ChannelsLast, &x);
  HT wh = leaf(random_ht({16, 16, 3, 3}, rng), FLAME_DTYPE_F64, Layout::Plain, &w);
  FLAME_ASSERT_OK(flame_conv2d(x, w, nullptr, nullptr, y1.out()));
  FLAME_ASSERT_OK(flame_conv2d(x, w, nullptr, nullptr, y2.out()));
  FLAME_ASSERT_OK(flame_sum_all(y1, s1.out()));
  FLAME_ASSERT_OK(flame_sum_all(y2, s2.out()));
  FLAME_ASSERT_OK(flame_add(s1, s2, s.out()));
  FLAME_ASSERT_OK(flame_backward(ctx, s, nullptr, 0));
  T gw;
  FLAME_ASSERT_OK(flame_tensor_grad(w, gw.out()));
  HT got, dx, dw, db;
  FLAME_ASSERT_OK(download(gw, &got));
  const Geo g = conv_geo(xh.shape, wh.shape, Args());
  ref_conv_grads(xh, wh, HT({g.N, g.O, g.Ho, g.Wo}, 2.0), g, &dx, &dw, &db);
  EXPECT_TRUE(near(got, dw, tol(FLAME_DTYPE_F64), "accumulated dweight"));
}

// ------------------------------------------------------------------ bad arguments

#define CONV_EXPECT_FAIL(status, word, call)                                                               \
  do {                                                                                                     \
    out = reinterpret_cast<flame_tensor_t>(static_cast<uintptr_t>(0x10));                                 \
    flame_status_t st_ = (call);                                                                           \
    EXPECT_EQ(st_, status) << #call << " -> " << flame_status_string(st_) << ": " << flame_last_error_message(); \
    EXPECT_EQ(out, nullptr) << #call << " left its OUT handle non-NULL";                                  \
    EXPECT_NE(std::string(flame_last_error_message()).find(word), std::string::npos)                        \
        << #call << ": the message should name " << word << ": " << flame_last_error_message();            \
    if (st_ == FLAME_OK && out) flame_tensor_release(out);                                                 \
    out = nullptr;                                                                                         \
  } while (0)

TEST_F(ConvTest, BadArgumentsGiveClearStatusAndNoOutput) {
  T x, x3, xi, x0, w, w3, wbad, w64, b, b2d, bbad, bf16, wt, bt;
  FLAME_ASSERT_OK(upload(ctx, HT({2, 4, 6, 6}, 0.5), FLAME_DTYPE_F32, x.out()));
  FLAME_ASSERT_OK(upload(ctx, HT({2, 4, 6}, 0.5), FLAME_DTYPE_F32, x3.out()));
  FLAME_ASSERT_OK(upload(ctx, HT({2, 4, 6, 6}, 1.0), FLAME_DTYPE_I32, xi.out()));
  FLAME_ASSERT_OK(flame_zeros(ctx, std::vector<int64_t>{2, 0, 6, 6}.data(), 4, FLAME_DTYPE_F32, x0.out()));
  FLAME_ASSERT_OK(upload(ctx, HT({8, 4, 3, 3}, 0.5), FLAME_DTYPE_F32, w.out()));
  FLAME_ASSERT_OK(upload(ctx, HT({8, 4, 3}, 0.5), FLAME_DTYPE_F32, w3.out()));
  FLAME_ASSERT_OK(upload(ctx, HT({8, 3, 3, 3}, 0.5), FLAME_DTYPE_F32, wbad.out()));
  FLAME_ASSERT_OK(upload(ctx, HT({8, 4, 3, 3}, 0.5), FLAME_DTYPE_F64, w64.out()));
  FLAME_ASSERT_OK(upload(ctx, HT({8}, 0.5), FLAME_DTYPE_F32, b.out()));
  FLAME_ASSERT_OK(upload(ctx, HT({1, 8}, 0.5), FLAME_DTYPE_F32, b2d.out()));
  FLAME_ASSERT_OK(upload(ctx, HT({9}, 0.5), FLAME_DTYPE_F32, bbad.out()));
  FLAME_ASSERT_OK(upload(ctx, HT({8}, 0.5), FLAME_DTYPE_BF16, bf16.out()));
  FLAME_ASSERT_OK(upload(ctx, HT({4, 2, 3, 3}, 0.5), FLAME_DTYPE_F32, wt.out()));  // transposed: [C_in 4, C_out 2]
  FLAME_ASSERT_OK(upload(ctx, HT({2}, 0.5), FLAME_DTYPE_F32, bt.out()));
  flame_tensor_t out = nullptr;
  auto opt = [](std::function<void(flame_conv_options_t&)> f) {
    flame_conv_options_t o;
    flame_conv_options_init(&o);
    f(o);
    return o;
  };
  const flame_conv_options_t o_stride0 = opt([](flame_conv_options_t& o) { o.stride[1] = 0; });
  const flame_conv_options_t o_dil0 = opt([](flame_conv_options_t& o) { o.dilation[0] = 0; });
  const flame_conv_options_t o_padneg = opt([](flame_conv_options_t& o) { o.padding[0] = -1; });
  const flame_conv_options_t o_g0 = opt([](flame_conv_options_t& o) { o.groups = 0; });
  const flame_conv_options_t o_g3 = opt([](flame_conv_options_t& o) { o.groups = 3; });
  const flame_conv_options_t o_g2 = opt([](flame_conv_options_t& o) { o.groups = 2; });
  const flame_conv_options_t o_same_s2 = opt([](flame_conv_options_t& o) { o.padding_same = 1; o.stride[0] = 2; });
  const flame_conv_options_t o_same_bad = opt([](flame_conv_options_t& o) { o.padding_same = 3; });
  const flame_conv_options_t o_same = opt([](flame_conv_options_t& o) { o.padding_same = 1; });
  const flame_conv_options_t o_outpad = opt([](flame_conv_options_t& o) { o.output_padding[0] = 1; });
  const flame_conv_options_t o_outpad_big = opt([](flame_conv_options_t& o) { o.stride[0] = 2; o.output_padding[0] = 2; });
  const flame_conv_options_t o_outpad_neg = opt([](flame_conv_options_t& o) { o.output_padding[1] = -1; });
  const flame_conv_options_t o_size0 = opt([](flame_conv_options_t& o) { o.struct_size = 0; });
  const flame_conv_options_t o_huge = opt([](flame_conv_options_t& o) { o.padding[1] = int64_t{1} << 40; });
  const flame_conv_options_t o_dil_big = opt([](flame_conv_options_t& o) { o.dilation[0] = 4; });  // 9 > 6 rows

  CONV_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, "x", flame_conv2d(x3, w, b, nullptr, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, "weight", flame_conv2d(x, w3, b, nullptr, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, "weight", flame_conv2d(x, wbad, b, nullptr, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, "bias", flame_conv2d(x, w, bbad, nullptr, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, "bias", flame_conv2d(x, w, b2d, nullptr, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, "channels", flame_conv2d(x0, w, b, nullptr, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_DTYPE_MISMATCH, "weight", flame_conv2d(x, w64, b, nullptr, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_DTYPE_MISMATCH, "bias", flame_conv2d(x, w, bf16, nullptr, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_DTYPE_MISMATCH, "x", flame_conv2d(xi, w, b, nullptr, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, "stride", flame_conv2d(x, w, b, &o_stride0, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, "dilation", flame_conv2d(x, w, b, &o_dil0, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, "padding", flame_conv2d(x, w, b, &o_padneg, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, "padding", flame_conv2d(x, w, b, &o_huge, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, "groups", flame_conv2d(x, w, b, &o_g0, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, "groups", flame_conv2d(x, w, b, &o_g3, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, "weight", flame_conv2d(x, w, b, &o_g2, &out));  // needs [O, 2, kh, kw]
  CONV_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, "padding_same", flame_conv2d(x, w, b, &o_same_s2, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, "padding_same", flame_conv2d(x, w, b, &o_same_bad, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, "output_padding", flame_conv2d(x, w, b, &o_outpad, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, "struct_size", flame_conv2d(x, w, b, &o_size0, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, "empty", flame_conv2d(x, w, b, &o_dil_big, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, "x", flame_conv2d(nullptr, w, b, nullptr, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, "weight", flame_conv2d(x, nullptr, b, nullptr, &out));
  EXPECT_EQ(flame_conv2d(x, w, b, nullptr, nullptr), FLAME_ERROR_INVALID_ARGUMENT);

  // conv_transpose2d: x [2, 4, 6, 6], weight [4, 2, 3, 3] -> C_out 2
  CONV_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, "weight", flame_conv_transpose2d(x, w, nullptr, nullptr, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, "bias", flame_conv_transpose2d(x, wt, b, nullptr, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, "output_padding", flame_conv_transpose2d(x, wt, bt, &o_outpad, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, "output_padding", flame_conv_transpose2d(x, wt, bt, &o_outpad_big, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, "output_padding", flame_conv_transpose2d(x, wt, bt, &o_outpad_neg, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, "padding_same", flame_conv_transpose2d(x, wt, bt, &o_same, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, "groups", flame_conv_transpose2d(x, wt, bt, &o_g3, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, "x", flame_conv_transpose2d(x3, wt, bt, nullptr, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_DTYPE_MISMATCH, "x", flame_conv_transpose2d(xi, wt, bt, nullptr, &out));

  // conv1d: x [2, 4, 6], weight [8, 4, 3]
  CONV_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, "x", flame_conv1d(x, w3, b, nullptr, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, "weight", flame_conv1d(x3, w, b, nullptr, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, "bias", flame_conv1d(x3, w3, bbad, nullptr, &out));
  CONV_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, "padding", flame_conv1d(x3, w3, b, &o_padneg, &out));
  {  // conv1d reads element 0 of each pair: a bad element 1 is ignored
    T y;
    FLAME_ASSERT_OK(flame_conv1d(x3, w3, b, &o_stride0, y.out()));
    EXPECT_EQ(shape_of(y), (Shape{2, 8, 4}));
  }

  // Tensors of another context.
  flame_ctx_t other = nullptr;
  flame_ctx_options_t co;
  flame_ctx_options_init(&co);
  co.kernel_cache_dir = "";
  FLAME_ASSERT_OK(flame_ctx_create(&co, &other));
  {
    T wo;
    FLAME_ASSERT_OK(upload(other, HT({8, 4, 3, 3}, 0.5), FLAME_DTYPE_F32, wo.out()));
    CONV_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, "context", flame_conv2d(x, wo, b, nullptr, &out));
  }
  flame_ctx_destroy(other);
}

// ------------------------------------------------------------------ gradcheck (finite differences)

FlameFn one(std::function<flame_status_t(const Tensors&, flame_dtype_t, flame_tensor_t*)> f) {
  return [f](const Tensors& in, flame_dtype_t dt, std::vector<T>& out) {
    out.emplace_back();
    return f(in, dt, out.back().out());
  };
}
RefFn one_ref(std::function<HT(const std::vector<HT>&)> f) {
  return [f](const std::vector<HT>& x) { return std::vector<HT>{f(x)}; };
}

// x as channels-last through differentiable FLAME ops (a permuted copy, permuted back).
flame_status_t channels_last_view(flame_tensor_t x, T* out) {
  T nhwc, c;
  const int32_t to[4] = {0, 2, 3, 1}, back[4] = {0, 3, 1, 2};
  flame_status_t st = flame_permute(x, to, 4, nhwc.out());
  if (st == FLAME_OK) st = flame_contiguous(nhwc, c.out());
  if (st == FLAME_OK) st = flame_permute(c, back, 4, out->out());
  return st;
}

enum class Kind { Conv2d, ConvT, Conv1d };

Row conv_row(const std::string& name, Kind kind, std::vector<Case> cases, Args a, bool bias, bool cl = false) {
  Row r;
  r.name = name;
  // conv1d is conv2d over a unit height; every second-order check runs the rules of the nodes the
  // first backward records: ConvTranspose2d and ConvWeightGrad (of Conv2d), Conv2d and ConvWeightGrad
  // (of ConvTranspose2d).
  r.covers = {kind == Kind::ConvT ? "conv_transpose2d" : "conv2d", "conv_weight_grad"};
  r.cases = std::move(cases);
  r.fwd = one([=](const Tensors& x, flame_dtype_t, flame_tensor_t* o) {
    const flame_conv_options_t opts = a.opts();
    flame_tensor_t b = bias ? x[2] : nullptr;
    if (kind == Kind::ConvT) return flame_conv_transpose2d(x[0], x[1], b, &opts, o);
    if (kind == Kind::Conv1d) return flame_conv1d(x[0], x[1], b, &opts, o);
    if (!cl) return flame_conv2d(x[0], x[1], b, &opts, o);
    T xc;
    flame_status_t st = channels_last_view(x[0], &xc);
    return st == FLAME_OK ? flame_conv2d(xc, x[1], b, &opts, o) : st;
  });
  r.ref = one_ref([=](const std::vector<HT>& x) {
    const HT* b = bias ? &x[2] : nullptr;
    if (kind == Kind::ConvT) return ref_convt(x[0], x[1], b, convt_geo(x[0].shape, x[1].shape, a));
    if (kind == Kind::Conv1d) {
      const Shape& xs = x[0].shape;
      const Shape& ws = x[1].shape;
      const Shape x4 = {xs[0], xs[1], 1, xs[2]}, w4 = {ws[0], ws[1], 1, ws[2]};
      Args a2 = args({1, a.stride[0]}, {0, a.padding[0]}, {1, a.dilation[0]}, a.groups, a.same);
      const Geo g = conv_geo(x4, w4, a2);
      return reshape(ref_conv(reshape(x[0], x4), reshape(x[1], w4), b, g), {g.N, g.O, g.Wo});
    }
    return ref_conv(x[0], x[1], b, conv_geo(x[0].shape, x[1].shape, a));
  });
  return r;
}

std::vector<Row> build_rows() {
  std::vector<Row> rows;
  rows.push_back(conv_row("conv2d", Kind::Conv2d, {{{in({2, 3, 5, 4}), in({4, 3, 3, 2}), in({4})}}, {{nc({1, 2, 4, 5}), in({3, 2, 2, 2}), in({3})}}},
                          Args(), true));
  rows.push_back(conv_row("conv2d_channels_last", Kind::Conv2d, {{{in({1, 4, 4, 5}), in({16, 4, 3, 3}), in({16})}}},
                          args({1, 1}, {1, 1}, {1, 1}), true, true));
  // 16 output channels reach the tensor-core kernels in f16/bf16, but the nested finite differences
  // of the second-order check sum ~600 inputs' noise (~4e-5 against an exact 0 for the bias) and take
  // 75 s: second order runs on the small channels-last row below instead.
  rows.back().second_order = false;
  rows.push_back(conv_row("conv2d_channels_last_small", Kind::Conv2d, {{{in({1, 2, 3, 4}), in({4, 2, 3, 3}), in({4})}}},
                          args({1, 1}, {1, 1}, {1, 1}), true, true));
  rows.push_back(conv_row("conv2d_stride_pad_dilation", Kind::Conv2d, {{{in({1, 2, 7, 6}), in({3, 2, 3, 3})}}},
                          args({2, 1}, {1, 2}, {1, 2}), false));
  rows.push_back(conv_row("conv2d_groups", Kind::Conv2d, {{{in({1, 4, 4, 4}), in({6, 2, 3, 3}), in({6})}}},
                          args({1, 1}, {1, 1}, {1, 1}, 2), true));
  rows.push_back(conv_row("conv2d_depthwise", Kind::Conv2d, {{{in({2, 3, 4, 4}), in({3, 1, 3, 3}), in({3})}}},
                          args({2, 1}, {1, 1}, {1, 1}, 3), true));
  rows.push_back(conv_row("conv2d_same_even_dilated", Kind::Conv2d, {{{in({1, 2, 4, 5}), in({2, 2, 2, 4})}}},
                          args({1, 1}, {0, 0}, {2, 1}, 1, 1), false));
  rows.push_back(conv_row("conv_transpose2d", Kind::ConvT, {{{in({1, 3, 3, 3}), in({3, 2, 3, 3}), in({2})}}},
                          args({2, 2}, {1, 1}, {1, 1}, 1, 0, {1, 1}), true));
  rows.push_back(conv_row("conv_transpose2d_groups", Kind::ConvT, {{{in({2, 4, 2, 3}), in({4, 2, 2, 3}), in({4})}}},
                          args({1, 2}, {0, 1}, {2, 1}, 2, 0, {1, 1}), true));
  rows.push_back(conv_row("conv1d", Kind::Conv1d, {{{in({2, 3, 7}), in({4, 3, 3}), in({4})}}}, args({2, 1}, {1, 0}, {1, 1}),
                          true));
  rows.push_back(conv_row("conv1d_same_groups", Kind::Conv1d, {{{in({1, 4, 6}), in({4, 2, 4})}}},
                          args({1, 1}, {0, 0}, {2, 1}, 2, 1), false));
  return rows;
}

const std::vector<Row>& rows() {
  static const std::vector<Row> r = build_rows();
  return r;
}

const bool kCovered = gc::register_covers(rows());  // for the op-list coverage test (test_op_coverage.cpp)

TEST(ConvGradCheckTable, RowNamesAreUniqueAndEveryOpIsCovered) {
  std::set<std::string> seen;
  for (const Row& r : rows()) EXPECT_TRUE(seen.insert(r.name).second) << "duplicate row " << r.name;
  // Conv2d and ConvTranspose2d are called directly; ConvWeightGrad is the weight gradient of both,
  // and every primitive appears in the others' second-order checks.
  EXPECT_TRUE(seen.count("conv2d") && seen.count("conv_transpose2d") && seen.count("conv1d"));
}

struct Param {
  size_t row;
  flame_dtype_t dt;
};
std::vector<Param> first_order_params() {
  std::vector<Param> p;
  for (size_t i = 0; i < rows().size(); ++i)
    for (flame_dtype_t dt : {FLAME_DTYPE_F64, FLAME_DTYPE_F32}) p.push_back({i, dt});
  return p;
}

class ConvGradCheck : public GpuTest, public ::testing::WithParamInterface<Param> {};

TEST_P(ConvGradCheck, MatchesHostFiniteDifferences) {
  const Row& row = rows()[GetParam().row];
  const flame_dtype_t dt = GetParam().dt;
  for (size_t c = 0; c < row.cases.size(); ++c) {
    SCOPED_TRACE(row.name + " " + flame_dtype_name(dt) + " case " + std::to_string(c) +
                 " FLAME_GRADCHECK_SEED=" + std::to_string(gc::seed()));
    std::mt19937_64 rng(seed_for(row.name + flame_dtype_name(dt) + std::to_string(c)));
    check_case(ctx, row, row.cases[c], dt, rng);
    if (HasFatalFailure()) return;
  }
}
INSTANTIATE_TEST_SUITE_P(Conv, ConvGradCheck, ::testing::ValuesIn(first_order_params()),
                         [](const ::testing::TestParamInfo<Param>& i) {
                           return rows()[i.param.row].name + "_" + flame_dtype_name(i.param.dt);
                         });

// create_graph: the backward (input and weight gradients are convolutions too) differentiated again.
class ConvGradGradCheck : public GpuTest, public ::testing::WithParamInterface<size_t> {};

TEST_P(ConvGradGradCheck, CreateGraphMatchesHostFiniteDifferences) {
  const Row& row = rows()[GetParam()];
  for (size_t c = 0; c < row.cases.size(); ++c) {
    SCOPED_TRACE(row.name + " second order case " + std::to_string(c) + " FLAME_GRADCHECK_SEED=" + std::to_string(gc::seed()));
    std::mt19937_64 rng(seed_for(row.name + "gg" + std::to_string(c)));
    check_second_order(ctx, row, row.cases[c], rng);
    if (HasFatalFailure()) return;
  }
}
INSTANTIATE_TEST_SUITE_P(Conv, ConvGradGradCheck, ::testing::ValuesIn(gc::second_order_params(rows())),
                         [](const ::testing::TestParamInfo<size_t>& i) { return rows()[i.param].name; });

}  // namespace

// GPU tests of upsample_nearest2d and upsample_bilinear2d (flame.h "Upsampling"; src/ops/upsample.cpp,
// cuda/upsample.cuh):
//  - UpsampleGradCheck / UpsampleGradGradCheck: integer and non-integer scale factors, explicit sizes
//    (up and down), align_corners both ways, transposed and channels-last inputs: forward against host
//    references that repeat PyTorch's index arithmetic (f32 for nearest, as on the device), gradients
//    against finite differences (f64, f32; f16/bf16 for a subset), second order in f64;
//  - UpsampleOps: nearest x2 forward and backward (2x2 block sums) at a diffusion-like size in f32
//    and bf16; the backward is deterministic (bit-identical runs); channels-last in gives
//    channels-last out; empty batches; bad arguments.
// Reproduce a failure with FLAME_GRADCHECK_SEED=<seed printed in the failure>.
#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "gradcheck.h"

using namespace gc;

namespace {

// ------------------------------------------------------------------ host references

struct Up {
  int64_t oh = 0, ow = 0;  // 0: from the scale
  double sh = 0, sw = 0;   // 0: none
  bool bilinear = false, align = false;
};
Up nearest(int64_t oh, int64_t ow, double sh = 0, double sw = 0) {
  Up u;
  u.oh = oh;
  u.ow = ow;
  u.sh = sh;
  u.sw = sw;
  return u;
}
Up bilinear(int64_t oh, int64_t ow, bool align, double sh = 0, double sw = 0) {
  Up u = nearest(oh, ow, sh, sw);
  u.bilinear = true;
  u.align = align;
  return u;
}

int64_t up_size(int64_t in, int64_t out, double scale) {
  return out > 0 ? out : static_cast<int64_t>(std::floor(static_cast<double>(in) * scale));
}

// PyTorch's CUDA nearest index, in f32 as the device computes it.
int64_t nearest_src(int64_t dst, int64_t in, int64_t out, double user) {
  const float scale = user > 0 ? static_cast<float>(1.0 / user) : static_cast<float>(in) / static_cast<float>(out);
  const volatile float prod = static_cast<float>(dst) * scale;  // one f32 rounding, as the device
  return std::min(static_cast<int64_t>(std::floor(prod)), in - 1);
}

// Bilinear row and weight of the upper row, in f64.
int64_t linear_row(int64_t dst, int64_t in, int64_t out, double user, bool align, double* l, int64_t* p) {
  double scale = align ? (out > 1 ? static_cast<double>(in - 1) / static_cast<double>(out - 1) : 0.0)
                       : (user > 0 ? 1.0 / user : static_cast<double>(in) / static_cast<double>(out));
  double src = align ? scale * static_cast<double>(dst) : std::max(scale * (static_cast<double>(dst) + 0.5) - 0.5, 0.0);
  const int64_t h0 = std::min(static_cast<int64_t>(src), in - 1);
  *l = std::min(std::max(src - static_cast<double>(h0), 0.0), 1.0);
  *p = h0 < in - 1 ? 1 : 0;
  return h0;
}

HT upsample_ref(const HT& x, const Up& u) {
  const int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  const int64_t OH = up_size(H, u.oh, u.sh), OW = up_size(W, u.ow, u.sw);
  HT y(Shape{N, C, OH, OW});
  for (int64_t nc = 0; nc < N * C; ++nc)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        const double* plane = x.v.data() + nc * H * W;
        double r;
        if (!u.bilinear) {
          r = plane[nearest_src(oh, H, OH, u.sh) * W + nearest_src(ow, W, OW, u.sw)];
        } else {
          double lh, lw;
          int64_t ph, pw;
          const int64_t h0 = linear_row(oh, H, OH, u.sh, u.align, &lh, &ph), w0 = linear_row(ow, W, OW, u.sw, u.align, &lw, &pw);
          auto at = [&](int64_t h, int64_t w) { return plane[h * W + w]; };
          r = (1 - lh) * ((1 - lw) * at(h0, w0) + lw * at(h0, w0 + pw)) + lh * ((1 - lw) * at(h0 + ph, w0) + lw * at(h0 + ph, w0 + pw));
        }
        y.v[(nc * OH + oh) * OW + ow] = r;
      }
  return y;
}

// ------------------------------------------------------------------ calling FLAME

flame_status_t call_upsample(flame_tensor_t x, const Up& u, flame_tensor_t* out) {
  if (u.bilinear) return flame_upsample_bilinear2d(x, u.oh, u.ow, u.sh, u.sw, u.align ? 1 : 0, out);
  return flame_upsample_nearest2d(x, u.oh, u.ow, u.sh, u.sw, out);
}

flame_status_t channels_last_of(flame_tensor_t x, T* out) {
  const int32_t to_nhwc[4] = {0, 2, 3, 1}, to_nchw[4] = {0, 3, 1, 2};
  T a, b;
  flame_status_t st = flame_permute(x, to_nhwc, 4, a.out());
  if (st == FLAME_OK) st = flame_contiguous(a, b.out());
  if (st == FLAME_OK) st = flame_permute(b, to_nchw, 4, out->out());
  return st;
}

Row up_row(std::string name, In x, Up u, bool cl = false) {
  Row r;
  r.name = std::move(name);
  r.covers = {"upsample2d", "upsample2d_backward"};
  r.cases = {Case({x})};
  r.fwd = [u, cl](const Tensors& in, flame_dtype_t, std::vector<T>& out) {
    T xcl;
    flame_tensor_t x = in[0];
    if (cl) {
      flame_status_t st = channels_last_of(in[0], &xcl);
      if (st != FLAME_OK) return st;
      x = xcl;
    }
    out.emplace_back();
    return call_upsample(x, u, out.back().out());
  };
  r.ref = [u](const std::vector<HT>& x) { return std::vector<HT>{upsample_ref(x[0], u)}; };
  return r;
}

const std::vector<Row>& rows() {
  static const std::vector<Row> table = [] {
    std::vector<Row> v;
    auto last = [&v]() -> Row& { return v.back(); };
    v.push_back(up_row("nearest_x2", in({2, 3, 4, 5}), nearest(0, 0, 2, 2)));
    last().low_precision = true;
    v.push_back(up_row("nearest_size_5x7_from_3x4", in({1, 2, 3, 4}), nearest(5, 7)));
    v.push_back(up_row("nearest_scale_1p7x2p5_nc", nc({1, 2, 5, 4}), nearest(0, 0, 1.7, 2.5)));
    v.push_back(up_row("nearest_down_7x6_to_3x4", in({1, 2, 7, 6}), nearest(3, 4)));
    v.push_back(up_row("nearest_size_and_scale", in({1, 2, 3, 3}), nearest(7, 5, 2.5, 1.5)));
    v.push_back(up_row("nearest_x2_channels_last", in({2, 4, 3, 3}), nearest(0, 0, 2, 2), true));
    last().low_precision = true;
    v.push_back(up_row("bilinear_x2", in({2, 3, 4, 5}), bilinear(0, 0, false, 2, 2)));
    last().low_precision = true;
    v.push_back(up_row("bilinear_align_size_5x7", in({1, 2, 3, 4}), bilinear(5, 7, true)));
    v.push_back(up_row("bilinear_size_7x5_nc", nc({1, 2, 4, 3}), bilinear(7, 5, false)));
    v.push_back(up_row("bilinear_down_7x6_to_3x4", in({1, 2, 7, 6}), bilinear(3, 4, false)));
    v.push_back(up_row("bilinear_align_down_7x6_to_3x4", in({1, 2, 7, 6}), bilinear(3, 4, true)));
    v.push_back(up_row("bilinear_scale_1p5_channels_last", in({1, 3, 4, 4}), bilinear(0, 0, false, 1.5, 1.5), true));
    last().low_precision = true;
    v.push_back(up_row("bilinear_align_to_one_row", in({1, 1, 3, 4}), bilinear(1, 6, true)));
    return v;
  }();
  return table;
}

FLAME_GRADCHECK_SUITES(Upsample, UpsampleGradCheck, UpsampleGradGradCheck, rows, 0xbf58476d1ce4e5b9ull);

// ------------------------------------------------------------------ direct tests

class UpsampleOps : public GpuTest {};

// Nearest x2 at a diffusion-like size, NCHW and channels-last (the vector kernels of dense tensors):
// each output is its source, each input gradient the sum of its 2x2 block of output gradients; bf16
// sums in f32 and rounds once.
TEST_F(UpsampleOps, NearestX2ForwardAndBackwardAtSize) {
  std::mt19937_64 rng(gc::seed() ^ 41);
  std::uniform_real_distribution<double> u(-2, 2);
  const int64_t N = 2, C = 32, H = 32, W = 32;
  HT x(Shape{N, C, H, W}), g(Shape{N, C, 2 * H, 2 * W});
  for (double& e : x.v) e = u(rng);
  for (double& e : g.v) e = u(rng);
  for (int cl = 0; cl < 2; ++cl) {
    for (flame_dtype_t dt : {FLAME_DTYPE_F32, FLAME_DTYPE_BF16, FLAME_DTYPE_F16}) {
      SCOPED_TRACE(std::string(dtname(dt)) + (cl ? " channels-last" : " NCHW"));
      T xt, gt, xcl, gcl, y;
      FLAME_ASSERT_OK(upload(ctx, x, dt, xt.out()));
      FLAME_ASSERT_OK(upload(ctx, g, dt, gt.out()));
      HT xr, gr;
      FLAME_ASSERT_OK(download(xt, &xr));
      FLAME_ASSERT_OK(download(gt, &gr));
      flame_tensor_t xi = xt.h, gi = gt.h;
      if (cl) {
        FLAME_ASSERT_OK(channels_last_of(xt, &xcl));
        FLAME_ASSERT_OK(channels_last_of(gt, &gcl));
        xi = xcl.h;
        gi = gcl.h;
      }
      FLAME_ASSERT_OK(flame_tensor_set_requires_grad(xi, 1));
      FLAME_ASSERT_OK(flame_upsample_nearest2d(xi, 0, 0, 2.0, 2.0, y.out()));
      HT hy;
      FLAME_ASSERT_OK(download(y, &hy));
      EXPECT_TRUE(close(hy, upsample_ref(xr, nearest(0, 0, 2, 2)), 0, "forward copies"));
      flame_tensor_t outs[] = {y.h}, gouts[] = {gi}, ins[] = {xi}, res[1] = {nullptr};
      FLAME_ASSERT_OK(flame_grad(ctx, outs, gouts, 1, ins, 1, FLAME_BACKWARD_RETAIN_GRAPH, res));
      T d1(res[0]);
      FLAME_ASSERT_OK(flame_grad(ctx, outs, gouts, 1, ins, 1, 0, res));
      T d2(res[0]);
      HT h1, h2, want(x.shape);
      FLAME_ASSERT_OK(download(d1, &h1));
      FLAME_ASSERT_OK(download(d2, &h2));
      EXPECT_EQ(h1.v, h2.v) << "the backward is deterministic (no atomics)";
      for (int64_t nc = 0; nc < N * C; ++nc)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t w = 0; w < W; ++w) {
            double s = 0;
            for (int64_t i = 0; i < 2; ++i)
              for (int64_t j = 0; j < 2; ++j) s += gr.v[(nc * 2 * H + 2 * h + i) * 2 * W + 2 * w + j];
            want.v[(nc * H + h) * W + w] = s;
          }
      EXPECT_TRUE(close(h1, want, dt == FLAME_DTYPE_F32 ? 1e-6 : 8e-3, "2x2 block sums"));
    }
  }
}

TEST_F(UpsampleOps, ChannelsLastInputGivesChannelsLastOutput) {
  std::mt19937_64 rng(gc::seed() ^ 43);
  std::uniform_real_distribution<double> u(-2, 2);
  HT x(Shape{2, 5, 4, 6});
  for (double& e : x.v) e = u(rng);
  T xt, xcl;
  FLAME_ASSERT_OK(upload(ctx, x, FLAME_DTYPE_F32, xt.out()));
  FLAME_ASSERT_OK(channels_last_of(xt, &xcl));
  for (const Up& up : {nearest(0, 0, 2, 2), bilinear(7, 9, false), bilinear(7, 9, true)}) {
    T a, b;
    FLAME_ASSERT_OK(call_upsample(xt, up, a.out()));
    FLAME_ASSERT_OK(call_upsample(xcl, up, b.out()));
    int64_t st[4];
    FLAME_ASSERT_OK(flame_tensor_strides(b, st, 4));
    const Shape s = shape_of(b);
    EXPECT_EQ(st[1], 1);
    EXPECT_EQ(st[3], s[1]);
    int32_t contiguous = 0;
    FLAME_ASSERT_OK(flame_tensor_is_contiguous(a, &contiguous));
    EXPECT_EQ(contiguous, 1);
    HT ha, hb;
    FLAME_ASSERT_OK(download(a, &ha));
    FLAME_ASSERT_OK(download(b, &hb));
    EXPECT_TRUE(close(hb, ha, 1e-6, "same values in both layouts"));
  }
}

TEST_F(UpsampleOps, EmptyBatch) {
  const int64_t s[4] = {0, 3, 4, 4};
  T x, a, b, loss;
  FLAME_ASSERT_OK(flame_zeros(ctx, s, 4, FLAME_DTYPE_F32, x.out()));
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(x, 1));
  FLAME_ASSERT_OK(flame_upsample_nearest2d(x, 8, 0, 0, 2.0, a.out()));
  FLAME_ASSERT_OK(flame_upsample_bilinear2d(x, 5, 5, 0, 0, 0, b.out()));
  EXPECT_EQ(shape_of(a), (Shape{0, 3, 8, 8}));
  EXPECT_EQ(shape_of(b), (Shape{0, 3, 5, 5}));
  FLAME_ASSERT_OK(flame_sum_all(b, loss.out()));
  FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
}

TEST_F(UpsampleOps, BadArgumentsGiveTheDocumentedStatusAndNoOutput) {
  const int64_t s4[4] = {1, 2, 3, 3}, s3[3] = {2, 3, 3}, s0c[4] = {1, 0, 3, 3};
  T x, x3, x0c, xi;
  FLAME_ASSERT_OK(flame_ones(ctx, s4, 4, FLAME_DTYPE_F32, x.out()));
  FLAME_ASSERT_OK(flame_ones(ctx, s3, 3, FLAME_DTYPE_F32, x3.out()));
  FLAME_ASSERT_OK(flame_ones(ctx, s0c, 4, FLAME_DTYPE_F32, x0c.out()));
  FLAME_ASSERT_OK(flame_ones(ctx, s4, 4, FLAME_DTYPE_U8, xi.out()));
  struct Bad {
    const char* what;
    flame_status_t want;
    std::function<flame_status_t(flame_tensor_t*)> call;
  };
  const std::vector<Bad> bad = {
      {"NULL x", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_upsample_nearest2d(nullptr, 6, 6, 0, 0, o); }},
      {"3-D x", FLAME_ERROR_SHAPE_MISMATCH, [&](flame_tensor_t* o) { return flame_upsample_nearest2d(x3, 6, 6, 0, 0, o); }},
      {"no channels", FLAME_ERROR_SHAPE_MISMATCH, [&](flame_tensor_t* o) { return flame_upsample_bilinear2d(x0c, 6, 6, 0, 0, 0, o); }},
      {"integer x", FLAME_ERROR_DTYPE_MISMATCH, [&](flame_tensor_t* o) { return flame_upsample_nearest2d(xi, 6, 6, 0, 0, o); }},
      {"no size nor scale", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_upsample_nearest2d(x, 0, 6, 0, 0, o); }},
      {"negative size", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_upsample_nearest2d(x, -6, 6, 0, 0, o); }},
      {"negative scale", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_upsample_bilinear2d(x, 6, 6, -2, 0, 0, o); }},
      {"NaN scale", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_upsample_nearest2d(x, 0, 0, NAN, 2, o); }},
      {"infinite scale", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_upsample_nearest2d(x, 0, 0, INFINITY, 2, o); }},
      {"output rounds to 0", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_upsample_nearest2d(x, 0, 0, 0.2, 2, o); }},
      {"output too large", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_upsample_nearest2d(x, 0, 0, 1e12, 2, o); }},
      {"align_corners 2", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_upsample_bilinear2d(x, 6, 6, 0, 0, 2, o); }},
  };
  for (const Bad& b : bad) {
    flame_tensor_t out = reinterpret_cast<flame_tensor_t>(static_cast<uintptr_t>(0x10));
    flame_status_t st = b.call(&out);
    EXPECT_EQ(st, b.want) << b.what << ": " << flame_status_string(st) << " " << flame_last_error_message();
    EXPECT_EQ(out, nullptr) << b.what;
    if (st == FLAME_OK && out) flame_tensor_release(out);
  }
  FLAME_EXPECT_STATUS(flame_upsample_nearest2d(x, 6, 6, 0, 0, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
}

}  // namespace

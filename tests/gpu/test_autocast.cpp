// Autocast (flame_ctx_set_autocast): the setting nests and rejects other dtypes; under bf16 or f16
// autocast, linear/matmul take f32 inputs in the low dtype and layer_norm/sum take low inputs in f32,
// and the whole graph (values and every gradient, which come back in the leaves' own dtypes) equals
// the same graph written with explicit flame_to_dtype calls and autocast off; f64 is never converted.
// The linear's gradients folded into f32 GEMM results match the casts' backward kernels.
#include <tuple>
#include <vector>
#include "host_ref.h"

using namespace href;

namespace {

class Autocast : public GpuTest {};

TEST_F(Autocast, SettingNestsAndRejectsOtherDtypes) {
  int32_t v = 0, prev = 0;
  FLAME_ASSERT_OK(flame_ctx_get_autocast(ctx, &v));
  EXPECT_EQ(v, FLAME_AUTOCAST_OFF);
  FLAME_ASSERT_OK(flame_ctx_set_autocast(ctx, FLAME_DTYPE_BF16, &prev));
  EXPECT_EQ(prev, FLAME_AUTOCAST_OFF);
  FLAME_ASSERT_OK(flame_ctx_set_autocast(ctx, FLAME_DTYPE_F16, &prev));
  EXPECT_EQ(prev, FLAME_DTYPE_BF16);
  for (int32_t bad : {static_cast<int32_t>(FLAME_DTYPE_F32), static_cast<int32_t>(FLAME_DTYPE_F64), 99, -2}) {
    FLAME_EXPECT_STATUS(flame_ctx_set_autocast(ctx, bad, &prev), FLAME_ERROR_INVALID_ARGUMENT);
  }
  FLAME_ASSERT_OK(flame_ctx_get_autocast(ctx, &v));
  EXPECT_EQ(v, FLAME_DTYPE_F16);  // unchanged by the rejected calls
  FLAME_ASSERT_OK(flame_ctx_set_autocast(ctx, FLAME_DTYPE_BF16, nullptr));
  FLAME_ASSERT_OK(flame_ctx_set_autocast(ctx, FLAME_AUTOCAST_OFF, nullptr));
  FLAME_ASSERT_OK(flame_ctx_get_autocast(ctx, &v));
  EXPECT_EQ(v, FLAME_AUTOCAST_OFF);
}

struct Outcome {
  HT y, loss, gx, gw, gb, gn;
  flame_dtype_t y_dtype, loss_dtype;
};

// y = linear(x, W, b) -> gelu-free; z = layer_norm(y) * n; loss = sum(z). With `autocast` the casts
// come from the context; without, they are written out.
// `observe`: retain_grad on the explicit casts' outputs, which keeps the engine from writing the
// linear's gradients in f32 straight out of its GEMMs (the casts' backward kernels run instead).
Outcome run(flame_ctx_t ctx, const HT& x, const HT& w, const HT& b, const HT& n, flame_dtype_t low, bool autocast,
            bool observe = false) {
  Outcome r;
  T X = upload(ctx, x), W = upload(ctx, w), B = upload(ctx, b), N = upload(ctx, n);
  for (flame_tensor_t t : {X.h, W.h, B.h, N.h}) EXPECT_EQ(flame_tensor_set_requires_grad(t, 1), FLAME_OK);
  T y, z, loss;
  const int64_t ns[1] = {w.shape[0]};
  if (autocast) {
    EXPECT_EQ(flame_ctx_set_autocast(ctx, low, nullptr), FLAME_OK);
    EXPECT_EQ(flame_linear(X, W, B, FLAME_ACTIVATION_NONE, y.out()), FLAME_OK) << flame_last_error_message();
    EXPECT_EQ(flame_layer_norm(y, ns, 1, N, nullptr, 1e-5, z.out()), FLAME_OK) << flame_last_error_message();
    EXPECT_EQ(flame_sum_all(z, loss.out()), FLAME_OK);
    EXPECT_EQ(flame_ctx_set_autocast(ctx, FLAME_AUTOCAST_OFF, nullptr), FLAME_OK);
  } else {
    T xl, wl, bl, y32, n32;
    EXPECT_EQ(flame_to_dtype(X, low, xl.out()), FLAME_OK);
    EXPECT_EQ(flame_to_dtype(W, low, wl.out()), FLAME_OK);
    EXPECT_EQ(flame_to_dtype(B, low, bl.out()), FLAME_OK);
    if (observe)
      for (flame_tensor_t t : {xl.h, wl.h, bl.h}) EXPECT_EQ(flame_tensor_retain_grad(t), FLAME_OK);
    EXPECT_EQ(flame_linear(xl, wl, bl, FLAME_ACTIVATION_NONE, y.out()), FLAME_OK);
    EXPECT_EQ(flame_to_dtype(y, FLAME_DTYPE_F32, y32.out()), FLAME_OK);
    EXPECT_EQ(flame_layer_norm(y32, ns, 1, N, nullptr, 1e-5, z.out()), FLAME_OK);
    EXPECT_EQ(flame_sum_all(z, loss.out()), FLAME_OK);
  }
  r.y_dtype = dtype_of(y);
  r.loss_dtype = dtype_of(loss);
  r.y = download(y);
  r.loss = download(loss);
  EXPECT_EQ(flame_backward(ctx, loss, nullptr, 0), FLAME_OK) << flame_last_error_message();
  T gx, gw, gb, gn;
  EXPECT_EQ(flame_tensor_grad(X, gx.out()), FLAME_OK);
  EXPECT_EQ(flame_tensor_grad(W, gw.out()), FLAME_OK);
  EXPECT_EQ(flame_tensor_grad(B, gb.out()), FLAME_OK);
  EXPECT_EQ(flame_tensor_grad(N, gn.out()), FLAME_OK);
  r.gx = download(gx);
  r.gw = download(gw);
  r.gb = download(gb);
  r.gn = download(gn);
  return r;
}

// x [rows, in], W [out, in], b [out] and the norm weight n [out], all f32.
struct Inputs {
  HT x, w, b, n;
};
template <class Rng>
Inputs inputs(Rng& rng, int64_t rows, int64_t in, int64_t out) {
  return {random(rng, {rows, in}, FLAME_DTYPE_F32, -1, 1), random(rng, {out, in}, FLAME_DTYPE_F32, -0.3, 0.3),
          random(rng, {out}, FLAME_DTYPE_F32, -1, 1), random(rng, {out}, FLAME_DTYPE_F32, 0.5, 1.5)};
}

void expect_same(const HT& a, const HT& b, const char* what) {
  EXPECT_EQ(a.dtype, b.dtype) << what;
  EXPECT_EQ(a.shape, b.shape) << what;
  EXPECT_EQ(a.values(), b.values()) << what;
}

TEST_F(Autocast, MatchesExplicitCastsWithGradientsInTheLeavesDtypes) {
  HREF_RNG(rng);
  for (flame_dtype_t low : {FLAME_DTYPE_BF16, FLAME_DTYPE_F16}) {
    SCOPED_TRACE(dname(low));
    const Inputs in = inputs(rng, 33, 40, 24);
    Outcome a = run(ctx, in.x, in.w, in.b, in.n, low, true), e = run(ctx, in.x, in.w, in.b, in.n, low, false);
    EXPECT_EQ(a.y_dtype, low);
    EXPECT_EQ(a.loss_dtype, FLAME_DTYPE_F32);
    expect_same(a.y, e.y, "linear output");
    expect_same(a.loss, e.loss, "loss");
    for (const HT* g : {&a.gx, &a.gw, &a.gb, &a.gn}) EXPECT_EQ(g->dtype, FLAME_DTYPE_F32);
    expect_same(a.gx, e.gx, "grad x");
    expect_same(a.gw, e.gw, "grad W");
    expect_same(a.gb, e.gb, "grad b");
    expect_same(a.gn, e.gn, "grad of the norm weight");
  }
}

// The linear's f32 gradients come out of its GEMMs (f32 results of low operands) when nothing observes
// the casts in between, else out of low GEMMs and the casts' backward: equal up to the low rounding.
TEST_F(Autocast, CastsFoldedIntoTheGemmsMatchTheCastKernels) {
  HREF_RNG(rng);
  for (flame_dtype_t low : {FLAME_DTYPE_BF16, FLAME_DTYPE_F16}) {
    SCOPED_TRACE(dname(low));
    const Inputs in = inputs(rng, 130, 72, 48);
    Outcome folded = run(ctx, in.x, in.w, in.b, in.n, low, false), cast = run(ctx, in.x, in.w, in.b, in.n, low, false, true);
    expect_same(folded.loss, cast.loss, "loss");
    const Tol tol = tol_for(low);
    for (auto [f, c, what] : {std::make_tuple(&folded.gx, &cast.gx, "grad x"), std::make_tuple(&folded.gw, &cast.gw, "grad W"),
                              std::make_tuple(&folded.gb, &cast.gb, "grad b")}) {
      EXPECT_EQ(f->dtype, FLAME_DTYPE_F32) << what;
      EXPECT_TRUE(all_close(*f, *c, tol)) << what;
    }
    expect_same(folded.gn, cast.gn, "grad of the norm weight");
  }
}

// cross_entropy under autocast reads f16/bf16 logits as they are and returns an f32 loss: the loss and
// the logits' gradient (in their dtype) agree with an explicit cast to f32 first, for every reduction.
TEST_F(Autocast, CrossEntropyOfLowLogitsMatchesCastingThemFirst) {
  HREF_RNG(rng);
  for (flame_dtype_t low : {FLAME_DTYPE_BF16, FLAME_DTYPE_F16}) {
    for (flame_reduction_t red : {FLAME_REDUCTION_MEAN, FLAME_REDUCTION_SUM, FLAME_REDUCTION_NONE}) {
      SCOPED_TRACE(std::string(dname(low)) + " reduction " + std::to_string(static_cast<int>(red)));
      HT x = random(rng, {37, 300}, low, -4, 4);
      std::vector<int64_t> tv(37);
      for (size_t i = 0; i < tv.size(); ++i) tv[i] = static_cast<int64_t>(rng() % 300);
      tv[5] = -100;  // ignored
      const int64_t tn = 37;
      T tgt;
      FLAME_ASSERT_OK(flame_from_host(ctx, tv.data(), tv.size() * 8, &tn, 1, FLAME_DTYPE_I64, tgt.out()));
      // a non-trivial upstream gradient (not representable in bf16) reaches the logits intact
      const HT g = random(rng, red == FLAME_REDUCTION_NONE ? Shape{37} : Shape{}, FLAME_DTYPE_F32, 0.3, 0.7);
      HT got_loss, want_loss, got_grad, want_grad;
      for (bool autocast : {true, false}) {
        T X = upload(ctx, x), loss, seed, gx;
        FLAME_ASSERT_OK(flame_tensor_set_requires_grad(X, 1));
        if (autocast) {
          FLAME_ASSERT_OK(flame_ctx_set_autocast(ctx, low, nullptr));
          FLAME_ASSERT_OK(flame_cross_entropy(X, tgt, nullptr, -100, 0.1, red, loss.out()));
          FLAME_ASSERT_OK(flame_ctx_set_autocast(ctx, FLAME_AUTOCAST_OFF, nullptr));
        } else {
          T x32;
          FLAME_ASSERT_OK(flame_to_dtype(X, FLAME_DTYPE_F32, x32.out()));
          FLAME_ASSERT_OK(flame_cross_entropy(x32, tgt, nullptr, -100, 0.1, red, loss.out()));
        }
        EXPECT_EQ(dtype_of(loss), FLAME_DTYPE_F32);
        T G = upload(ctx, g);
        FLAME_ASSERT_OK(flame_backward(ctx, loss, G, 0));
        FLAME_ASSERT_OK(flame_tensor_grad(X, gx.out()));
        EXPECT_EQ(dtype_of(gx), low);
        (autocast ? got_loss : want_loss) = download(loss);
        (autocast ? got_grad : want_grad) = download(gx);
      }
      EXPECT_TRUE(all_close(got_loss, want_loss, tol_for(FLAME_DTYPE_F32))) << "loss";
      EXPECT_TRUE(all_close(got_grad, want_grad, tol_for(low))) << "grad of the logits";
    }
  }
}

TEST_F(Autocast, LeavesF64AndLowPrecisionProductsAlone) {
  HREF_RNG(rng);
  FLAME_ASSERT_OK(flame_ctx_set_autocast(ctx, FLAME_DTYPE_BF16, nullptr));
  T a64 = upload(ctx, random(rng, {5, 6}, FLAME_DTYPE_F64, -1, 1)), b64 = upload(ctx, random(rng, {6, 3}, FLAME_DTYPE_F64, -1, 1));
  T c64;
  FLAME_ASSERT_OK(flame_matmul(a64, b64, c64.out()));
  EXPECT_EQ(dtype_of(c64), FLAME_DTYPE_F64);
  T ah = upload(ctx, random(rng, {5, 6}, FLAME_DTYPE_F16, -1, 1)), bh = upload(ctx, random(rng, {6, 3}, FLAME_DTYPE_F16, -1, 1));
  T ch, s;
  FLAME_ASSERT_OK(flame_matmul(ah, bh, ch.out()));
  EXPECT_EQ(dtype_of(ch), FLAME_DTYPE_F16);  // a low input stays as it is for products
  FLAME_ASSERT_OK(flame_softmax(ch, -1, s.out()));
  EXPECT_EQ(dtype_of(s), FLAME_DTYPE_F32);  // and goes to f32 for softmax
  FLAME_ASSERT_OK(flame_ctx_set_autocast(ctx, FLAME_AUTOCAST_OFF, nullptr));
  T s2;
  FLAME_ASSERT_OK(flame_softmax(ch, -1, s2.out()));
  EXPECT_EQ(dtype_of(s2), FLAME_DTYPE_F16);
}

}  // namespace

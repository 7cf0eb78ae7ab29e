// The loss scaler against a host simulation of torch.cuda.amp.GradScaler over a real training loop
// with f16 parameters: scaled backward (the default scale 2^16 overflows f16 gradients at once, as
// in torch), unscale, skipped steps on Inf/NaN (the optimizer's step count stays), back-off, growth
// after growth_interval clean steps; unscale_tensors and found_inf; state get/set; the disabled
// pass-through; the call-order errors.
#include <cmath>
#include <vector>
#include "host_ref.h"

using namespace href;

namespace {

class GradScaler : public GpuTest {
 protected:
  flame_grad_scaler_t make(double init, int64_t interval, int32_t enabled = 1) {
    flame_grad_scaler_options_t o;
    EXPECT_EQ(flame_grad_scaler_options_init(&o), FLAME_OK);
    o.init_scale = init;
    o.growth_interval = interval;
    o.enabled = enabled;
    flame_grad_scaler_t s = nullptr;
    EXPECT_EQ(flame_grad_scaler_create(ctx, &o, &s), FLAME_OK) << flame_last_error_message();
    return s;
  }
};

float f16(float x) { return static_cast<float>(round_to(x, FLAME_DTYPE_F16)); }

TEST_F(GradScaler, DefaultsAndScaledLoss) {
  flame_grad_scaler_options_t o;
  FLAME_ASSERT_OK(flame_grad_scaler_options_init(&o));
  EXPECT_EQ(o.struct_size, sizeof(flame_grad_scaler_options_t));
  EXPECT_EQ(o.init_scale, 65536.0);
  EXPECT_EQ(o.growth_factor, 2.0);
  EXPECT_EQ(o.backoff_factor, 0.5);
  EXPECT_EQ(o.growth_interval, 2000);
  EXPECT_EQ(o.enabled, 1);
  flame_grad_scaler_t s = nullptr;
  FLAME_ASSERT_OK(flame_grad_scaler_create(ctx, nullptr, &s));
  double scale = 0;
  FLAME_ASSERT_OK(flame_grad_scaler_get_scale(s, &scale));
  EXPECT_EQ(scale, 65536.0);
  // scaled = 2^16 * sum(x * c), recorded: d scaled / dx = 2^16 c.
  T x = upload(ctx, HT::from_values({3}, FLAME_DTYPE_F32, {1, 2, 3})), c = upload(ctx, HT::from_values({3}, FLAME_DTYPE_F32, {0.5, -1, 2}));
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(x, 1));
  T y, loss, scaled, g;
  FLAME_ASSERT_OK(flame_mul(x, c, y.out()));
  FLAME_ASSERT_OK(flame_sum_all(y, loss.out()));
  FLAME_ASSERT_OK(flame_grad_scaler_scale(s, loss, scaled.out()));
  EXPECT_EQ(dtype_of(scaled), FLAME_DTYPE_F32);
  EXPECT_EQ(item(scaled), 65536.0 * 4.5);
  FLAME_ASSERT_OK(flame_backward(ctx, scaled, nullptr, 0));
  FLAME_ASSERT_OK(flame_tensor_grad(x, g.out()));
  EXPECT_TRUE(matches(g, HT::from_values({3}, FLAME_DTYPE_F32, {32768, -65536, 131072}), Tol{0, 0}));
  // An f64 loss stays f64; an f16 loss is multiplied in f32.
  T l64 = upload(ctx, scalar(1.5, FLAME_DTYPE_F64)), l16 = upload(ctx, scalar(1.5, FLAME_DTYPE_F16)), s64, s16;
  FLAME_ASSERT_OK(flame_grad_scaler_scale(s, l64, s64.out()));
  FLAME_ASSERT_OK(flame_grad_scaler_scale(s, l16, s16.out()));
  EXPECT_EQ(dtype_of(s64), FLAME_DTYPE_F64);
  EXPECT_EQ(dtype_of(s16), FLAME_DTYPE_F32);
  EXPECT_EQ(item(s16), 98304.0);
  T li = upload(ctx, scalar(1, FLAME_DTYPE_I32));
  flame_tensor_t bad = nullptr;
  HREF_EXPECT_FAIL(FLAME_ERROR_DTYPE_MISMATCH, bad, flame_grad_scaler_scale(s, li, &bad));
  flame_grad_scaler_release(s);
  flame_grad_scaler_release(nullptr);
}

// Host model of one training step of the loop below (torch's GradScaler with SGD).
struct HostScaler {
  double scale;
  int64_t tracker = 0, interval;
};

TEST_F(GradScaler, TrainingLoopMatchesTorchSemantics) {
  HREF_RNG(rng);
  const int64_t n = 64, interval = 3;
  const double lr = 0.01;
  HT xh = random(rng, {n}, FLAME_DTYPE_F16, -1, 1);
  T x = upload(ctx, xh);
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(x, 1));
  flame_optimizer_options_t oo;
  FLAME_ASSERT_OK(flame_optimizer_options_init(&oo, FLAME_OPTIMIZER_SGD));
  oo.lr = lr;
  flame_tensor_t raw = x;
  flame_optimizer_t opt = nullptr;
  FLAME_ASSERT_OK(flame_optimizer_create(ctx, &oo, &raw, 1, &opt));
  flame_grad_scaler_t s = make(65536.0, interval);
  HostScaler hs{65536.0, 0, interval};
  std::vector<double> w = xh.values();
  int64_t applied = 0;
  for (int step = 0; step < 12; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step << ", scale " << hs.scale);
    // Gradients c (|c| <= 1); a NaN at steps 5 and 9 forces skips later on.
    HT c = random(rng, {n}, FLAME_DTYPE_F16, -1, 1);
    if (step == 5 || step == 9) (*c.data)[7] = std::nan("");
    T ct = upload(ctx, c), y, loss, scaled;
    FLAME_ASSERT_OK(flame_mul(x, ct, y.out()));
    FLAME_ASSERT_OK(flame_sum_all(y, loss.out()));
    FLAME_ASSERT_OK(flame_grad_scaler_scale(s, loss, scaled.out()));
    FLAME_ASSERT_OK(flame_backward(ctx, scaled, nullptr, 0));
    // Host: the gradient reaching x is f16(f16(scale) * c); a non-finite one skips the step.
    const float sc16 = f16(static_cast<float>(hs.scale));
    const float inv = static_cast<float>(1.0 / hs.scale);
    std::vector<double> cv = c.values(), gh(static_cast<size_t>(n));
    bool found = false;
    for (size_t i = 0; i < cv.size(); ++i) {
      const float g = f16(sc16 * static_cast<float>(cv[i]));
      found |= !std::isfinite(g);
      gh[i] = f16(g * inv);
    }
    FLAME_ASSERT_OK(flame_grad_scaler_unscale(s, opt));
    T fi;
    FLAME_ASSERT_OK(flame_grad_scaler_found_inf(s, fi.out()));
    EXPECT_EQ(item(fi), found ? 1.0 : 0.0);
    if (!found) {  // the unscaled gradient
      T g;
      FLAME_ASSERT_OK(flame_tensor_grad(x, g.out()));
      EXPECT_TRUE(matches(g, HT::from_values({n}, FLAME_DTYPE_F16, gh), Tol{0, 0}));
    }
    int32_t stepped = -1;
    FLAME_ASSERT_OK(flame_grad_scaler_step(s, opt, &stepped));
    EXPECT_EQ(stepped, found ? 0 : 1);
    if (!found) {
      ++applied;
      for (size_t i = 0; i < w.size(); ++i) w[i] = f16(static_cast<float>(w[i]) - static_cast<float>(lr) * static_cast<float>(gh[i]));
    }
    FLAME_ASSERT_OK(flame_grad_scaler_update(s));
    if (found) {
      hs.scale = static_cast<float>(hs.scale * 0.5);
      hs.tracker = 0;
    } else if (++hs.tracker == hs.interval) {
      hs.scale = static_cast<float>(hs.scale * 2.0);
      hs.tracker = 0;
    }
    double got_scale = 0;
    int64_t got_tracker = -1;
    FLAME_ASSERT_OK(flame_grad_scaler_get_state(s, &got_scale, &got_tracker));
    EXPECT_EQ(got_scale, hs.scale);
    EXPECT_EQ(got_tracker, hs.tracker);
    // One f16 ulp: the device may fuse w - lr * g into one rounding.
    EXPECT_TRUE(matches(x, HT::from_values({n}, FLAME_DTYPE_F16, w), Tol{1e-3, 1e-4}));
    FLAME_ASSERT_OK(flame_optimizer_zero_grad(opt, 1));
  }
  int64_t count = 0;
  FLAME_ASSERT_OK(flame_optimizer_step_count(opt, &count));
  EXPECT_EQ(count, applied);
  EXPECT_LT(applied, 12);  // the first step (2^16 overflows f16) and the NaN steps were skipped
  EXPECT_GE(applied, 6);
  flame_grad_scaler_release(s);
  flame_optimizer_release(opt);
}

TEST_F(GradScaler, UnscaleTensorsAndFoundInf) {
  flame_grad_scaler_t s = make(1024.0, 2000);
  T a = upload(ctx, HT::from_values({3}, FLAME_DTYPE_F32, {1024, 2048, -512})),
    b = upload(ctx, HT::from_values({2}, FLAME_DTYPE_BF16, {4096, 256}));
  flame_tensor_t list[2] = {a, b};
  FLAME_ASSERT_OK(flame_grad_scaler_unscale_tensors(s, list, 2));
  EXPECT_TRUE(matches(a, HT::from_values({3}, FLAME_DTYPE_F32, {1, 2, -0.5}), Tol{0, 0}));
  EXPECT_TRUE(matches(b, HT::from_values({2}, FLAME_DTYPE_BF16, {4, 0.25}), Tol{0, 0}));
  T fi;
  FLAME_ASSERT_OK(flame_grad_scaler_found_inf(s, fi.out()));
  EXPECT_EQ(item(fi), 0.0);
  T c = upload(ctx, HT::from_values({2}, FLAME_DTYPE_F32, {1, INFINITY}));
  flame_tensor_t lc = c;
  FLAME_ASSERT_OK(flame_grad_scaler_unscale_tensors(s, &lc, 1));
  FLAME_ASSERT_OK(flame_grad_scaler_found_inf(s, fi.out()));
  EXPECT_EQ(item(fi), 1.0);
  FLAME_ASSERT_OK(flame_grad_scaler_update(s));  // backs off
  double scale = 0;
  FLAME_ASSERT_OK(flame_grad_scaler_get_scale(s, &scale));
  EXPECT_EQ(scale, 512.0);
  FLAME_ASSERT_OK(flame_grad_scaler_found_inf(s, fi.out()));
  EXPECT_EQ(item(fi), 0.0);  // forgotten by update
  flame_grad_scaler_release(s);
}

TEST_F(GradScaler, GrowthStopsBeforeF32Overflow) {
  flame_grad_scaler_t s = make(3.0e38, 1);
  T a = upload(ctx, HT({2}, FLAME_DTYPE_F32, 1.0));
  flame_tensor_t la = a;
  FLAME_ASSERT_OK(flame_grad_scaler_unscale_tensors(s, &la, 1));
  FLAME_ASSERT_OK(flame_grad_scaler_update(s));
  double scale = 0;
  int64_t tracker = -1;
  FLAME_ASSERT_OK(flame_grad_scaler_get_state(s, &scale, &tracker));
  EXPECT_EQ(scale, static_cast<double>(3.0e38f));  // 6e38 is not finite in f32: kept
  EXPECT_EQ(tracker, 0);
  FLAME_ASSERT_OK(flame_grad_scaler_set_state(s, 8.0, 0));
  FLAME_ASSERT_OK(flame_grad_scaler_get_scale(s, &scale));
  EXPECT_EQ(scale, 8.0);
  flame_grad_scaler_release(s);
}

TEST_F(GradScaler, CallOrderErrorsAndBadOptions) {
  T p = upload(ctx, HT({2}, FLAME_DTYPE_F32, 1.0)), gt = upload(ctx, HT({2}, FLAME_DTYPE_F32, 8.0));
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(p, 1));
  FLAME_ASSERT_OK(flame_tensor_set_grad(p, gt));
  flame_optimizer_options_t oo;
  FLAME_ASSERT_OK(flame_optimizer_options_init(&oo, FLAME_OPTIMIZER_SGD));
  flame_tensor_t raw = p;
  flame_optimizer_t opt = nullptr;
  FLAME_ASSERT_OK(flame_optimizer_create(ctx, &oo, &raw, 1, &opt));
  flame_grad_scaler_t s = make(4.0, 10);
  FLAME_EXPECT_STATUS(flame_grad_scaler_update(s), FLAME_ERROR_INVALID_ARGUMENT);  // no check yet
  FLAME_ASSERT_OK(flame_grad_scaler_unscale(s, opt));
  FLAME_EXPECT_STATUS(flame_grad_scaler_unscale(s, opt), FLAME_ERROR_INVALID_ARGUMENT);
  T g;
  FLAME_ASSERT_OK(flame_tensor_grad(p, g.out()));
  EXPECT_TRUE(matches(g, HT({2}, FLAME_DTYPE_F32, 2.0), Tol{0, 0}));  // unscaled once only
  int32_t stepped = -1;
  FLAME_ASSERT_OK(flame_grad_scaler_step(s, opt, &stepped));
  EXPECT_EQ(stepped, 1);
  FLAME_EXPECT_STATUS(flame_grad_scaler_step(s, opt, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_grad_scaler_unscale(s, opt), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_ASSERT_OK(flame_grad_scaler_update(s));
  FLAME_ASSERT_OK(flame_grad_scaler_step(s, opt, nullptr));  // a new iteration may step again
  FLAME_ASSERT_OK(flame_grad_scaler_update(s));
  FLAME_EXPECT_STATUS(flame_grad_scaler_set_state(s, -1.0, 0), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_grad_scaler_set_state(s, 1.0, 10), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_grad_scaler_set_state(s, INFINITY, 0), FLAME_ERROR_INVALID_ARGUMENT);
  // An optimizer of another context.
  flame_ctx_t other = nullptr;
  flame_ctx_options_t co;
  flame_ctx_options_init(&co);
  FLAME_ASSERT_OK(flame_ctx_create(&co, &other));
  {
    T q = upload(other, HT({2}, FLAME_DTYPE_F32, 1.0));
    FLAME_ASSERT_OK(flame_tensor_set_requires_grad(q, 1));
    flame_tensor_t rq = q;
    flame_optimizer_t o2 = nullptr;
    FLAME_ASSERT_OK(flame_optimizer_create(other, &oo, &rq, 1, &o2));
    FLAME_EXPECT_STATUS(flame_grad_scaler_unscale(s, o2), FLAME_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flame_last_error_message()).find("context"), std::string::npos);
    flame_optimizer_release(o2);
  }
  flame_ctx_destroy(other);
  // Bad options.
  flame_grad_scaler_options_t o;
  FLAME_ASSERT_OK(flame_grad_scaler_options_init(&o));
  flame_grad_scaler_t bad = reinterpret_cast<flame_grad_scaler_t>(0x10);
  auto expect_bad = [&](void (*edit)(flame_grad_scaler_options_t&)) {
    flame_grad_scaler_options_t b = o;
    edit(b);
    FLAME_EXPECT_STATUS(flame_grad_scaler_create(ctx, &b, &bad), FLAME_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(bad, nullptr);
  };
  expect_bad([](flame_grad_scaler_options_t& b) { b.init_scale = 0; });
  expect_bad([](flame_grad_scaler_options_t& b) { b.init_scale = 1e39; });
  expect_bad([](flame_grad_scaler_options_t& b) { b.growth_factor = 1.0; });
  expect_bad([](flame_grad_scaler_options_t& b) { b.backoff_factor = 1.0; });
  expect_bad([](flame_grad_scaler_options_t& b) { b.growth_interval = 0; });
  expect_bad([](flame_grad_scaler_options_t& b) { b.enabled = 2; });
  expect_bad([](flame_grad_scaler_options_t& b) { b.struct_size = 8; });
  // A released scaler is detected.
  flame_grad_scaler_release(s);
  FLAME_EXPECT_STATUS(flame_grad_scaler_update(s), FLAME_ERROR_INVALID_HANDLE);
  flame_optimizer_release(opt);
}

TEST_F(GradScaler, DisabledIsAPassThrough) {
  T p = upload(ctx, HT({2}, FLAME_DTYPE_F32, 1.0)), gt = upload(ctx, HT({2}, FLAME_DTYPE_F32, 0.5));
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(p, 1));
  FLAME_ASSERT_OK(flame_tensor_set_grad(p, gt));
  flame_optimizer_options_t oo;
  FLAME_ASSERT_OK(flame_optimizer_options_init(&oo, FLAME_OPTIMIZER_SGD));
  oo.lr = 1.0;
  flame_tensor_t raw = p;
  flame_optimizer_t opt = nullptr;
  FLAME_ASSERT_OK(flame_optimizer_create(ctx, &oo, &raw, 1, &opt));
  flame_grad_scaler_t s = make(65536.0, 10, 0);
  T loss = upload(ctx, scalar(3.0, FLAME_DTYPE_F16)), out;
  FLAME_ASSERT_OK(flame_grad_scaler_scale(s, loss, out.out()));
  EXPECT_EQ(out.h, loss.h);  // the loss itself
  FLAME_ASSERT_OK(flame_grad_scaler_unscale(s, opt));
  int32_t stepped = -1;
  FLAME_ASSERT_OK(flame_grad_scaler_step(s, opt, &stepped));
  EXPECT_EQ(stepped, 1);
  EXPECT_TRUE(matches(p, HT({2}, FLAME_DTYPE_F32, 0.5), Tol{0, 0}));  // the gradient was not divided
  FLAME_ASSERT_OK(flame_grad_scaler_update(s));
  double scale = 0;
  FLAME_ASSERT_OK(flame_grad_scaler_get_scale(s, &scale));
  EXPECT_EQ(scale, 1.0);
  flame_grad_scaler_release(s);
  flame_optimizer_release(opt);
}

}  // namespace

// Autograd semantics through the C ABI: the seed example, accumulation, .grad management,
// retain_graph / create_graph, flame_grad, detach, grad and inference modes, freezing, errors,
// retain_grad, tensor hooks and post-accumulate hooks, graph freeing and two contexts in two threads.
// Gradient values of every op are checked in test_gradcheck.cpp.
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "flame_test.h"

namespace {

#define CHECK_OK(expr)                                                                          \
  do {                                                                                          \
    flame_status_t s_ = (expr);                                                                 \
    if (s_ != FLAME_OK)                                                                         \
      ADD_FAILURE() << #expr << " -> " << flame_status_string(s_) << ": " << flame_last_error_message(); \
  } while (0)

using Vals = std::vector<double>;
using Shape = std::vector<int64_t>;

// A tensor from host values (f32 or f64), optionally requiring grad.
T make(flame_ctx_t ctx, const Vals& v, Shape shape, bool requires_grad = false, flame_dtype_t dt = FLAME_DTYPE_F32) {
  T out;
  if (dt == FLAME_DTYPE_F64) {
    CHECK_OK(flame_from_host(ctx, v.data(), v.size() * 8, shape.empty() ? nullptr : shape.data(),
                             static_cast<int32_t>(shape.size()), dt, out.out()));
  } else {
    std::vector<float> f(v.begin(), v.end());
    CHECK_OK(flame_from_host(ctx, f.data(), f.size() * 4, shape.empty() ? nullptr : shape.data(),
                             static_cast<int32_t>(shape.size()), FLAME_DTYPE_F32, out.out()));
  }
  if (requires_grad) CHECK_OK(flame_tensor_set_requires_grad(out, 1));
  return out;
}

// Host values of a floating tensor (converted through f64 on the device side when needed).
Vals values(flame_tensor_t t) {
  if (!t) {
    ADD_FAILURE() << "values(NULL)";
    return {};
  }
  int64_t n = 0;
  CHECK_OK(flame_tensor_numel(t, &n));
  flame_dtype_t dt = FLAME_DTYPE_F32;
  CHECK_OK(flame_tensor_dtype(t, &dt));
  T f64;
  if (dt != FLAME_DTYPE_F64) {
    CHECK_OK(flame_to_dtype(t, FLAME_DTYPE_F64, f64.out()));
    t = f64;
  }
  Vals v(static_cast<size_t>(n));
  CHECK_OK(flame_to_host(t, v.data(), v.size() * 8));
  return v;
}

void expect_vals(flame_tensor_t t, const Vals& want, double tol = 1e-5, const char* what = "") {
  Vals got = values(t);
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << what << " element " << i;
}

T grad_of(flame_tensor_t t) {
  T g;
  CHECK_OK(flame_tensor_grad(t, g.out()));
  return g;
}

int32_t requires_grad(flame_tensor_t t) {
  int32_t r = -1;
  CHECK_OK(flame_tensor_requires_grad(t, &r));
  return r;
}

int32_t is_leaf(flame_tensor_t t) {
  int32_t r = -1;
  CHECK_OK(flame_tensor_is_leaf(t, &r));
  return r;
}

T mul(flame_tensor_t a, flame_tensor_t b) { T o; CHECK_OK(flame_mul(a, b, o.out())); return o; }
T add(flame_tensor_t a, flame_tensor_t b) { T o; CHECK_OK(flame_add(a, b, o.out())); return o; }
T sum(flame_tensor_t a) { T o; CHECK_OK(flame_sum_all(a, o.out())); return o; }
T mean(flame_tensor_t a) { T o; CHECK_OK(flame_mean(a, nullptr, 0, 0, o.out())); return o; }
T scale(flame_tensor_t a, double s) { T o; CHECK_OK(flame_mul_scalar(a, s, o.out())); return o; }

flame_memory_stats_t mem(flame_ctx_t ctx) {
  flame_memory_stats_t s;
  std::memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  CHECK_OK(flame_ctx_memory_stats(ctx, &s));
  return s;
}

using Autograd = GpuTest;

// create_graph is always combined with retain_graph here: the recorded backward refers to the
// forward's intermediates, whose nodes a later walk needs (PyTorch's retain_graph=create_graph).
constexpr uint32_t kCreate = FLAME_BACKWARD_CREATE_GRAPH | FLAME_BACKWARD_RETAIN_GRAPH;

// ------------------------------------------------------------------ basics

TEST_F(Autograd, SeedExample) {
  T x = make(ctx, {2, 3}, {2}, true);
  T y = mul(x, x);
  T loss = sum(y);
  EXPECT_EQ(is_leaf(x), 1);
  EXPECT_EQ(is_leaf(y), 0);
  EXPECT_EQ(requires_grad(y), 1);
  EXPECT_EQ(requires_grad(loss), 1);
  FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
  T g = grad_of(x);
  ASSERT_NE(g.h, nullptr);
  expect_vals(g, {4, 6});
  flame_dtype_t dt;
  FLAME_ASSERT_OK(flame_tensor_dtype(g, &dt));
  EXPECT_EQ(dt, FLAME_DTYPE_F32);
  // A non-leaf keeps no .grad unless retain_grad was called.
  EXPECT_EQ(grad_of(y).h, nullptr);
}

TEST_F(Autograd, GradAccumulatesOverBackwardCalls) {
  T x = make(ctx, {2, 3}, {2}, true);
  for (int step = 1; step <= 2; ++step) {
    T loss = sum(mul(x, x));
    FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
    expect_vals(grad_of(x), {4.0 * step, 6.0 * step});
  }
  FLAME_ASSERT_OK(flame_tensor_zero_grad(x));
  expect_vals(grad_of(x), {0, 0});
  T loss = sum(mul(x, x));
  FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
  expect_vals(grad_of(x), {4, 6});
}

// The engine hands its gradient buffer to .grad when nothing else holds it, and copies it otherwise:
// a gradient shared by two leaves (z = a + b gives both the same buffer), a broadcast gradient
// (sum's backward expands a scalar), and one a hook's caller still holds must each stay private.
TEST_F(Autograd, GradBuffersStayPrivateToTheirLeaf) {
  T a = make(ctx, {1, 2, 3, 4}, {4}, true), b = make(ctx, {5, 6, 7, 8}, {4}, true);
  T loss = sum(mul(add(a, b), make(ctx, {1, 1, 1, 1}, {4}, false)));
  FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
  expect_vals(grad_of(a), {1, 1, 1, 1});
  expect_vals(grad_of(b), {1, 1, 1, 1});
  T loss2 = sum(scale(a, 2));  // sum's gradient is a stride-0 expand of one element
  FLAME_ASSERT_OK(flame_backward(ctx, loss2, nullptr, 0));
  expect_vals(grad_of(a), {3, 3, 3, 3}, 1e-5, "a after the second backward");
  expect_vals(grad_of(b), {1, 1, 1, 1}, 1e-5, "b must not see a's accumulation");
  T x = make(ctx, {1, 2, 3}, {3}, true);
  T loss3 = sum(add(x, x));  // both of Add's gradients are the same buffer, for the same leaf
  FLAME_ASSERT_OK(flame_backward(ctx, loss3, nullptr, 0));
  expect_vals(grad_of(x), {2, 2, 2});
  T loss4 = sum(x);
  FLAME_ASSERT_OK(flame_backward(ctx, loss4, nullptr, 0));
  expect_vals(grad_of(x), {3, 3, 3});
}

// Slices of one tensor (split, narrow, select, overlapping or not) send their gradients into one
// buffer of the sliced tensor; mixed with a gradient that reaches it directly.
TEST_F(Autograd, GradientsOfSlicesOfOneTensorSum) {
  Vals xv(24);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = 0.25 * double(i) - 2;
  T x = make(ctx, xv, {6, 4}, true);
  T y = scale(x, 1.0);  // a non-leaf: its gradient buffer is the engine's
  T a, b, c, r;
  FLAME_ASSERT_OK(flame_narrow(y, 0, 0, 4, a.out()));     // rows 0-3
  FLAME_ASSERT_OK(flame_narrow(y, 0, 2, 4, b.out()));     // rows 2-5: overlaps a
  FLAME_ASSERT_OK(flame_select(y, 1, 3, c.out()));        // column 3
  T loss = sum(add(add(sum(scale(a, 2)), sum(scale(b, 3))), add(sum(scale(c, 5)), sum(mul(y, y)))));
  FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
  Vals want(24);
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 4; ++j)
      want[size_t(i * 4 + j)] = (i < 4 ? 2 : 0) + (i >= 2 ? 3 : 0) + (j == 3 ? 5 : 0) + 2 * xv[size_t(i * 4 + j)];
  expect_vals(grad_of(x), want);
}

TEST_F(Autograd, GradGetSetZeroClear) {
  T x = make(ctx, {1, 2, 3}, {3}, true);
  EXPECT_EQ(grad_of(x).h, nullptr) << "no .grad before any backward";
  FLAME_ASSERT_OK(flame_tensor_zero_grad(x));  // no gradient: nothing to fill
  EXPECT_EQ(grad_of(x).h, nullptr);

  T g = make(ctx, {10, 20, 30}, {3});
  FLAME_ASSERT_OK(flame_tensor_set_grad(x, g));
  expect_vals(grad_of(x), {10, 20, 30});

  T wrong_shape = make(ctx, {1, 2}, {2});
  EXPECT_NE(flame_tensor_set_grad(x, wrong_shape), FLAME_OK);
  T wrong_dtype = make(ctx, {1, 2, 3}, {3}, false, FLAME_DTYPE_F64);
  EXPECT_NE(flame_tensor_set_grad(x, wrong_dtype), FLAME_OK);
  expect_vals(grad_of(x), {10, 20, 30}, 1e-6, "a rejected set_grad changes nothing");

  // backward accumulates onto the gradient that was set.
  T loss = sum(scale(x, 2.0));
  FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
  expect_vals(grad_of(x), {12, 22, 32});

  FLAME_ASSERT_OK(flame_tensor_zero_grad(x));
  expect_vals(grad_of(x), {0, 0, 0});
  FLAME_ASSERT_OK(flame_tensor_set_grad(x, nullptr));
  EXPECT_EQ(grad_of(x).h, nullptr);

  FLAME_EXPECT_STATUS(flame_tensor_grad(x, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  flame_tensor_t out = reinterpret_cast<flame_tensor_t>(1);
  FLAME_EXPECT_STATUS(flame_tensor_grad(nullptr, &out), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr) << "OUT handles are NULL on failure";
}

TEST_F(Autograd, ExplicitGradForNonScalarRoot) {
  T x = make(ctx, {2, 3}, {2}, true);
  T y = mul(x, x);
  T gy = make(ctx, {1, 0.5}, {2});
  FLAME_ASSERT_OK(flame_backward(ctx, y, gy, 0));
  expect_vals(grad_of(x), {4, 3});
}

TEST_F(Autograd, BackwardErrors) {
  T x = make(ctx, {2, 3}, {2}, true);
  T y = mul(x, x);
  EXPECT_NE(flame_backward(ctx, y, nullptr, FLAME_BACKWARD_RETAIN_GRAPH), FLAME_OK)
      << "NULL grad for a root with 2 elements must fail";
  EXPECT_STRNE(flame_last_error_message(), "");
  T wrong = make(ctx, {1, 1, 1}, {3});
  EXPECT_NE(flame_backward(ctx, y, wrong, FLAME_BACKWARD_RETAIN_GRAPH), FLAME_OK) << "grad of the wrong shape";
  EXPECT_STRNE(flame_last_error_message(), "");
  T wrong_dt = make(ctx, {1, 1}, {2}, false, FLAME_DTYPE_F64);
  EXPECT_NE(flame_backward(ctx, y, wrong_dt, FLAME_BACKWARD_RETAIN_GRAPH), FLAME_OK) << "grad of the wrong dtype";
  EXPECT_EQ(grad_of(x).h, nullptr) << "failed backward calls leave .grad alone";

  T c = make(ctx, {1, 2}, {2});
  T s = sum(c);
  EXPECT_NE(flame_backward(ctx, s, nullptr, 0), FLAME_OK) << "root does not require grad";
  FLAME_EXPECT_STATUS(flame_backward(ctx, nullptr, nullptr, 0), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_backward(nullptr, s, nullptr, 0), FLAME_ERROR_INVALID_ARGUMENT);

  // After all of that the graph of y still works.
  T gy = make(ctx, {1, 1}, {2});
  FLAME_ASSERT_OK(flame_backward(ctx, y, gy, 0));
  expect_vals(grad_of(x), {4, 6});
}

TEST_F(Autograd, OnlyFloatingTensorsCanRequireGrad) {
  int32_t iv[3] = {1, 2, 3};
  int64_t shape[1] = {3};
  T i;
  FLAME_ASSERT_OK(flame_from_host(ctx, iv, sizeof iv, shape, 1, FLAME_DTYPE_I32, i.out()));
  EXPECT_NE(flame_tensor_set_requires_grad(i, 1), FLAME_OK);
  EXPECT_EQ(requires_grad(i), 0);
  FLAME_EXPECT_STATUS(flame_tensor_set_requires_grad(i, 0), FLAME_OK);
  T b;
  FLAME_ASSERT_OK(flame_gt(i, i, b.out()));
  EXPECT_NE(flame_tensor_set_requires_grad(b, 1), FLAME_OK);
  for (flame_dtype_t dt : {FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_F64}) {
    T f;
    FLAME_ASSERT_OK(flame_ones(ctx, shape, 1, dt, f.out()));
    FLAME_EXPECT_STATUS(flame_tensor_set_requires_grad(f, 1), FLAME_OK);
  }
}

TEST_F(Autograd, NonDifferentiableOutputOnInputThatRequiresGrad) {
  T x = make(ctx, {1, 5, 2, 0}, {2, 2}, true);
  T am;
  FLAME_ASSERT_OK(flame_argmax(x, 1, 0, am.out()));
  EXPECT_EQ(requires_grad(am), 0);
  int64_t idx[2] = {0, 0};
  FLAME_ASSERT_OK(flame_to_host(am, idx, sizeof idx));
  EXPECT_EQ(idx[0], 1);
  EXPECT_EQ(idx[1], 0);
  T cmp;
  FLAME_ASSERT_OK(flame_gt(x, x, cmp.out()));
  EXPECT_EQ(requires_grad(cmp), 0);
  // x still trains through other paths.
  T loss = sum(mul(x, x));
  FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
  expect_vals(grad_of(x), {2, 10, 4, 0});
}

TEST_F(Autograd, RetainGradOnNonLeaf) {
  T x = make(ctx, {1, 2}, {2}, true);
  T y = mul(x, x);
  EXPECT_EQ(is_leaf(y), 0);
  FLAME_ASSERT_OK(flame_tensor_retain_grad(y));
  T z = scale(y, 3.0);
  T loss = sum(z);
  FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
  T gy = grad_of(y);
  ASSERT_NE(gy.h, nullptr);
  expect_vals(gy, {3, 3});
  expect_vals(grad_of(x), {6, 12});
  EXPECT_EQ(grad_of(z).h, nullptr);
}

// ------------------------------------------------------------------ graphs

TEST_F(Autograd, RetainGraphAllowsSecondBackward) {
  T x = make(ctx, {2, 3}, {2}, true);
  T loss = sum(mul(x, x));
  FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, FLAME_BACKWARD_RETAIN_GRAPH));
  FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
  expect_vals(grad_of(x), {8, 12});
}

TEST_F(Autograd, SecondBackwardWithoutRetainGraphIsAnError) {
  T x = make(ctx, {2, 3}, {2}, true);
  T loss = sum(mul(x, x));  // mul saves its inputs
  FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
  FLAME_EXPECT_STATUS(flame_backward(ctx, loss, nullptr, 0), FLAME_ERROR_GRAPH_FREED);
  EXPECT_STRNE(flame_last_error_message(), "");
  expect_vals(grad_of(x), {4, 6}, 1e-5, "the failed backward added nothing");
  // flame_grad through the freed graph fails the same way.
  flame_tensor_t r = nullptr;
  flame_tensor_t lh = loss, xh = x;
  FLAME_EXPECT_STATUS(flame_grad(ctx, &lh, nullptr, 1, &xh, 1, 0, &r), FLAME_ERROR_GRAPH_FREED);
  EXPECT_EQ(r, nullptr);
  // A fresh forward works.
  T loss2 = sum(mul(x, x));
  FLAME_ASSERT_OK(flame_backward(ctx, loss2, nullptr, 0));
  expect_vals(grad_of(x), {8, 12});
}

// d/dx of the gradient of sum(f(x)), computed two ways: flame_grad twice, and
// backward(create_graph) then backward of sum(x.grad).
void second_order(flame_ctx_t ctx, const Vals& xv, const std::function<T(flame_tensor_t)>& f, const Vals& d1,
                  const Vals& d2, flame_dtype_t dt) {
  {
    T x = make(ctx, xv, {static_cast<int64_t>(xv.size())}, true, dt);
    T y = sum(f(x));
    flame_tensor_t yh = y, xh = x, g = nullptr;
    FLAME_ASSERT_OK(flame_grad(ctx, &yh, nullptr, 1, &xh, 1, kCreate, &g));
    T gt(g);
    expect_vals(gt, d1, 1e-5, "first derivative");
    EXPECT_EQ(requires_grad(gt), 1) << "create_graph gives a gradient with history";
    T gs = sum(gt);
    flame_tensor_t gsh = gs, g2 = nullptr;
    FLAME_ASSERT_OK(flame_grad(ctx, &gsh, nullptr, 1, &xh, 1, 0, &g2));
    T g2t(g2);
    expect_vals(g2t, d2, 1e-5, "second derivative (flame_grad)");
    EXPECT_EQ(grad_of(x).h, nullptr) << "flame_grad leaves .grad alone";
  }
  {
    T x = make(ctx, xv, {static_cast<int64_t>(xv.size())}, true, dt);
    T y = sum(f(x));
    FLAME_ASSERT_OK(flame_backward(ctx, y, nullptr, kCreate));
    T g = grad_of(x);
    ASSERT_NE(g.h, nullptr);
    expect_vals(g, d1, 1e-5, "x.grad after create_graph");
    FLAME_ASSERT_OK(flame_tensor_set_grad(x, nullptr));
    T gs = sum(g);
    FLAME_ASSERT_OK(flame_backward(ctx, gs, nullptr, 0));
    expect_vals(grad_of(x), d2, 1e-5, "second derivative (backward)");
  }
}

TEST_F(Autograd, CreateGraphSecondDerivatives) {
  const Vals xv = {-1.5, -0.3, 0.7, 1.9};
  Vals d1, d2;
  for (flame_dtype_t dt : {FLAME_DTYPE_F64, FLAME_DTYPE_F32}) {
    SCOPED_TRACE(flame_dtype_name(dt));
    // x^3: 3x^2, 6x
    d1.clear(); d2.clear();
    for (double x : xv) { d1.push_back(3 * x * x); d2.push_back(6 * x); }
    second_order(ctx, xv, [](flame_tensor_t x) { T o; CHECK_OK(flame_pow_scalar(x, 3.0, o.out())); return o; }, d1, d2, dt);
    // x*x*x through mul: same derivatives, saved inputs that require grad
    second_order(ctx, xv, [](flame_tensor_t x) { return mul(mul(x, x), x); }, d1, d2, dt);
    // sin: cos, -sin
    d1.clear(); d2.clear();
    for (double x : xv) { d1.push_back(std::cos(x)); d2.push_back(-std::sin(x)); }
    second_order(ctx, xv, [](flame_tensor_t x) { T o; CHECK_OK(flame_sin(x, o.out())); return o; }, d1, d2, dt);
    // exp: exp, exp
    d1.clear(); d2.clear();
    for (double x : xv) { d1.push_back(std::exp(x)); d2.push_back(std::exp(x)); }
    second_order(ctx, xv, [](flame_tensor_t x) { T o; CHECK_OK(flame_exp(x, o.out())); return o; }, d1, d2, dt);
    // tanh: 1 - t^2, -2 t (1 - t^2)
    d1.clear(); d2.clear();
    for (double x : xv) {
      double t = std::tanh(x);
      d1.push_back(1 - t * t);
      d2.push_back(-2 * t * (1 - t * t));
    }
    second_order(ctx, xv, [](flame_tensor_t x) { T o; CHECK_OK(flame_tanh(x, o.out())); return o; }, d1, d2, dt);
    // log: 1/x, -1/x^2 (positive inputs)
    const Vals pv = {0.5, 1.0, 2.0, 3.0};
    d1.clear(); d2.clear();
    for (double x : pv) { d1.push_back(1 / x); d2.push_back(-1 / (x * x)); }
    second_order(ctx, pv, [](flame_tensor_t x) { T o; CHECK_OK(flame_log(x, o.out())); return o; }, d1, d2, dt);
  }
}

TEST_F(Autograd, CreateGraphMixedPartials) {
  // f = sum(x * x * y): df/dx = 2xy, df/dy = x^2; d/dx sum(df/dx) = 2y, d/dy sum(df/dx) = 2x.
  T x = make(ctx, {1, -2, 3}, {3}, true, FLAME_DTYPE_F64);
  T y = make(ctx, {0.5, 4, -1}, {3}, true, FLAME_DTYPE_F64);
  T f = sum(mul(mul(x, x), y));
  flame_tensor_t fh = f, in[2] = {x, y}, g[2] = {nullptr, nullptr};
  FLAME_ASSERT_OK(flame_grad(ctx, &fh, nullptr, 1, in, 2, kCreate, g));
  T gx(g[0]), gy(g[1]);
  expect_vals(gx, {1.0, -16, -6});
  expect_vals(gy, {1, 4, 9});
  T s = sum(gx);
  flame_tensor_t sh = s, h[2] = {nullptr, nullptr};
  FLAME_ASSERT_OK(flame_grad(ctx, &sh, nullptr, 1, in, 2, 0, h));
  T hx(h[0]), hy(h[1]);
  expect_vals(hx, {1, 8, -2});
  expect_vals(hy, {2, -4, 6});
  // A gradient penalty: loss = sum(gx^2) -> d/dy = 2 gx * 2x^2... checked at one element:
  // gx_i = 2 x_i y_i, d/dy_i sum(gx^2) = 2 gx_i * 2 x_i = 8 x_i^2 y_i.
  T x2 = make(ctx, {1, -2, 3}, {3}, true, FLAME_DTYPE_F64);
  T y2 = make(ctx, {0.5, 4, -1}, {3}, true, FLAME_DTYPE_F64);
  T f2 = sum(mul(mul(x2, x2), y2));
  flame_tensor_t f2h = f2, x2h = x2, g2 = nullptr;
  FLAME_ASSERT_OK(flame_grad(ctx, &f2h, nullptr, 1, &x2h, 1, kCreate, &g2));
  T g2t(g2);
  T pen = sum(mul(g2t, g2t));
  FLAME_ASSERT_OK(flame_backward(ctx, pen, nullptr, 0));
  expect_vals(grad_of(y2), {8 * 1 * 0.5, 8 * 4 * 4, 8 * 9 * -1.0});
  // d/dx_i sum(gx^2) = 2 gx_i * 2 y_i = 8 x_i y_i^2
  expect_vals(grad_of(x2), {8 * 1 * 0.25, 8 * -2 * 16.0, 8 * 3 * 1.0});
}

TEST_F(Autograd, FlameGradDoesNotTouchDotGrad) {
  T x = make(ctx, {1, 2}, {2}, true);
  T y = make(ctx, {3, 4}, {2}, true);
  {
    T loss = sum(mul(x, x));
    flame_tensor_t lh = loss, in = x, r = nullptr;
    FLAME_ASSERT_OK(flame_grad(ctx, &lh, nullptr, 1, &in, 1, 0, &r));
    T rt(r);
    expect_vals(rt, {2, 4});
    EXPECT_EQ(requires_grad(rt), 0) << "without create_graph the result has no history";
    EXPECT_EQ(grad_of(x).h, nullptr);
  }
  {  // y is not reached: error without ALLOW_UNUSED, results stay NULL
    T loss = sum(mul(x, x));
    flame_tensor_t lh = loss, in[2] = {x, y}, r[2] = {reinterpret_cast<flame_tensor_t>(1), reinterpret_cast<flame_tensor_t>(1)};
    EXPECT_NE(flame_grad(ctx, &lh, nullptr, 1, in, 2, FLAME_BACKWARD_RETAIN_GRAPH, r), FLAME_OK);
    EXPECT_STRNE(flame_last_error_message(), "");
    EXPECT_EQ(r[0], nullptr);
    EXPECT_EQ(r[1], nullptr);
    FLAME_ASSERT_OK(flame_grad(ctx, &lh, nullptr, 1, in, 2, FLAME_GRAD_ALLOW_UNUSED, r));
    T r0(r[0]), r1(r[1]);
    expect_vals(r0, {2, 4});
    EXPECT_EQ(r1.h, nullptr) << "an unused input gives NULL with ALLOW_UNUSED";
  }
  {  // several outputs, weighted by grad_outputs (one NULL means ones)
    T o1 = mul(x, y);     // d/dx = y
    T o2 = sum(mul(x, x));  // d/dx = 2x
    T w1 = make(ctx, {2, -1}, {2});
    flame_tensor_t outs[2] = {o1, o2}, gos[2] = {w1, nullptr}, in = x, r = nullptr;
    FLAME_ASSERT_OK(flame_grad(ctx, outs, gos, 2, &in, 1, 0, &r));
    T rt(r);
    expect_vals(rt, {2 * 3 + 2, -1 * 4 + 4});
  }
  EXPECT_EQ(grad_of(x).h, nullptr);
  EXPECT_EQ(grad_of(y).h, nullptr);
}

TEST_F(Autograd, DetachSharesStorageAndHasNoHistory) {
  T x = make(ctx, {1, 2, 3}, {3}, true);
  T d;
  FLAME_ASSERT_OK(flame_tensor_detach(x, d.out()));
  EXPECT_EQ(requires_grad(d), 0);
  EXPECT_EQ(is_leaf(d), 1);
  void *px = nullptr, *pd = nullptr;
  FLAME_ASSERT_OK(flame_tensor_data_ptr(x, &px));
  FLAME_ASSERT_OK(flame_tensor_data_ptr(d, &pd));
  EXPECT_EQ(px, pd);
  // Gradient flows only through the x path of x * detach(x).
  T loss = sum(mul(x, d));
  FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
  expect_vals(grad_of(x), {1, 2, 3});
  EXPECT_EQ(grad_of(d).h, nullptr);
  // Detaching a non-leaf cuts the graph.
  T y = mul(x, x);
  T yd;
  FLAME_ASSERT_OK(flame_tensor_detach(y, yd.out()));
  EXPECT_EQ(requires_grad(yd), 0);
  EXPECT_EQ(is_leaf(yd), 1);
  T z = mul(yd, yd);
  EXPECT_EQ(requires_grad(z), 0);
  expect_vals(yd, {1, 4, 9});
}

// ------------------------------------------------------------------ modes

TEST_F(Autograd, NoGradNests) {
  int32_t en = -1, prev = -1, prev2 = -1;
  FLAME_ASSERT_OK(flame_ctx_is_grad_enabled(ctx, &en));
  EXPECT_EQ(en, 1) << "grad mode is on by default";
  T x = make(ctx, {1, 2}, {2}, true);
  FLAME_ASSERT_OK(flame_ctx_set_grad_enabled(ctx, 0, &prev));
  EXPECT_EQ(prev, 1);
  {
    T y = mul(x, x);
    EXPECT_EQ(requires_grad(y), 0);
    EXPECT_EQ(is_leaf(y), 1);
    FLAME_ASSERT_OK(flame_ctx_set_grad_enabled(ctx, 0, &prev2));
    EXPECT_EQ(prev2, 0);
    FLAME_ASSERT_OK(flame_ctx_set_grad_enabled(ctx, 1, nullptr));  // enable_grad inside no_grad
    T z = mul(x, x);
    EXPECT_EQ(requires_grad(z), 1);
    FLAME_ASSERT_OK(flame_ctx_set_grad_enabled(ctx, prev2, nullptr));
    FLAME_ASSERT_OK(flame_ctx_is_grad_enabled(ctx, &en));
    EXPECT_EQ(en, 0);
    T w = mul(x, x);
    EXPECT_EQ(requires_grad(w), 0);
  }
  FLAME_ASSERT_OK(flame_ctx_set_grad_enabled(ctx, prev, nullptr));
  FLAME_ASSERT_OK(flame_ctx_is_grad_enabled(ctx, &en));
  EXPECT_EQ(en, 1);
  T y = mul(x, x);
  EXPECT_EQ(requires_grad(y), 1);
  EXPECT_EQ(requires_grad(x), 1) << "no_grad does not change requires_grad of leaves";
}

TEST_F(Autograd, GradModeIsPerContext) {
  bool skip = false;
  std::string why;
  flame_ctx_t other = flame_test_context(&skip, &why);
  ASSERT_NE(other, nullptr) << why;
  FLAME_ASSERT_OK(flame_ctx_set_grad_enabled(ctx, 0, nullptr));
  int32_t en = -1;
  FLAME_ASSERT_OK(flame_ctx_is_grad_enabled(other, &en));
  EXPECT_EQ(en, 1);
  {
    T x = make(other, {1, 2}, {2}, true);
    T y = mul(x, x);
    EXPECT_EQ(requires_grad(y), 1);
  }
  FLAME_ASSERT_OK(flame_ctx_set_grad_enabled(ctx, 1, nullptr));
  flame_ctx_destroy(other);
}

TEST_F(Autograd, InferenceModeRecordsNothingAndNests) {
  T x = make(ctx, {1, 2}, {2}, true);
  int32_t prev = -1, prev2 = -1;
  FLAME_ASSERT_OK(flame_ctx_set_inference_mode(ctx, 1, &prev));
  EXPECT_EQ(prev, 0);
  T made_inside = make(ctx, {5, 6}, {2});
  {
    T y = mul(x, x);
    EXPECT_EQ(requires_grad(y), 0);
    EXPECT_EQ(is_leaf(y), 1);
    EXPECT_NE(flame_tensor_set_requires_grad(made_inside, 1), FLAME_OK)
        << "a tensor made in inference mode can never require grad";
    FLAME_ASSERT_OK(flame_ctx_set_inference_mode(ctx, 1, &prev2));
    EXPECT_EQ(prev2, 1);
    FLAME_ASSERT_OK(flame_ctx_set_inference_mode(ctx, prev2, nullptr));
    T z = mul(x, x);
    EXPECT_EQ(requires_grad(z), 0);
  }
  FLAME_ASSERT_OK(flame_ctx_set_inference_mode(ctx, prev, nullptr));
  EXPECT_NE(flame_tensor_set_requires_grad(made_inside, 1), FLAME_OK) << "not even after inference mode ends";
  EXPECT_EQ(requires_grad(made_inside), 0);
  T y = mul(x, x);
  EXPECT_EQ(requires_grad(y), 1);
  T loss = sum(y);
  FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
  expect_vals(grad_of(x), {2, 4});
}

// ------------------------------------------------------------------ freezing

// One step of loss = sum((x * W) * A) with W frozen or not; returns bytes_in_use after backward
// minus bytes_in_use before the forward, with the forward's handles released before backward.
uint64_t freeze_step(flame_ctx_t ctx, bool freeze_w, T* w_grad, T* a_grad) {
  const int64_t n = 512;
  T x, W, A;
  int64_t shape[2] = {n, n};
  CHECK_OK(flame_randn(ctx, shape, 2, FLAME_DTYPE_F32, x.out()));
  CHECK_OK(flame_randn(ctx, shape, 2, FLAME_DTYPE_F32, W.out()));
  CHECK_OK(flame_randn(ctx, shape, 2, FLAME_DTYPE_F32, A.out()));
  CHECK_OK(flame_tensor_set_requires_grad(A, 1));
  if (!freeze_w) CHECK_OK(flame_tensor_set_requires_grad(W, 1));
  CHECK_OK(flame_ctx_synchronize(ctx));
  uint64_t before = mem(ctx).bytes_in_use;
  T loss;
  {
    T h = mul(x, W);
    if (freeze_w) {
      EXPECT_EQ(requires_grad(h), 0) << "nothing to record when no input requires grad";
    }
    T o = mul(h, A);
    loss = sum(o);
  }
  CHECK_OK(flame_backward(ctx, loss, nullptr, 0));
  loss = T();
  CHECK_OK(flame_ctx_synchronize(ctx));
  uint64_t after = mem(ctx).bytes_in_use;
  CHECK_OK(flame_tensor_grad(W, w_grad->out()));
  CHECK_OK(flame_tensor_grad(A, a_grad->out()));
  return after - before;
}

TEST_F(Autograd, FrozenParametersGetNoGradAndNoBuffers) {
  const uint64_t grad_bytes = 512ull * 512 * 4;
  T wg, ag;
  uint64_t frozen = freeze_step(ctx, true, &wg, &ag);
  EXPECT_EQ(wg.h, nullptr) << "a frozen parameter gets no .grad";
  ASSERT_NE(ag.h, nullptr);
  EXPECT_GE(frozen, grad_bytes);
  EXPECT_LT(frozen, grad_bytes + grad_bytes / 2) << "only A.grad should remain after backward";
  T wg2, ag2;
  uint64_t trained = freeze_step(ctx, false, &wg2, &ag2);
  EXPECT_NE(wg2.h, nullptr);
  EXPECT_GE(trained, 2 * grad_bytes);
  // Memory in backward: the frozen forward saved nothing for W, so its peak is lower.
}

// ------------------------------------------------------------------ hooks

struct HookState {
  int calls = 0;
  int destroyed = 0;
  double factor = 1.0;  // the replacement gradient is grad * factor (1: keep)
  bool fail = false;
  std::vector<Vals> seen;
};

void destroy_state(void* p) { static_cast<HookState*>(p)->destroyed++; }

flame_status_t tensor_hook(void* ud, flame_tensor_t grad, flame_tensor_t* replacement) {
  auto* s = static_cast<HookState*>(ud);
  s->calls++;
  s->seen.push_back(values(grad));
  if (s->fail) {
    flame_set_error_message("my hook failed");
    return FLAME_ERROR_INVALID_ARGUMENT;
  }
  if (s->factor == 1.0) return FLAME_OK;  // keep the gradient (*replacement stays NULL)
  return flame_mul_scalar(grad, s->factor, replacement);
}

flame_status_t clip_post_hook(void* ud, flame_tensor_t leaf) {
  auto* s = static_cast<HookState*>(ud);
  s->calls++;
  flame_tensor_t g = nullptr, c = nullptr;
  flame_status_t st = flame_tensor_grad(leaf, &g);
  if (st != FLAME_OK) return st;
  if (!g) {
    flame_set_error_message("post-accumulate hook found no .grad");
    return FLAME_ERROR_INTERNAL;
  }
  s->seen.push_back(values(g));
  st = flame_clamp(g, -s->factor, s->factor, &c);
  flame_tensor_release(g);
  if (st != FLAME_OK) return st;
  st = flame_tensor_set_grad(leaf, c);
  flame_tensor_release(c);
  return st;
}

flame_status_t halve_post_hook(void* ud, flame_tensor_t leaf) {
  static_cast<HookState*>(ud)->calls++;
  flame_tensor_t g = nullptr, h = nullptr;
  flame_status_t st = flame_tensor_grad(leaf, &g);
  if (st != FLAME_OK) return st;
  st = flame_mul_scalar(g, 0.5, &h);
  flame_tensor_release(g);
  if (st != FLAME_OK) return st;
  st = flame_tensor_set_grad(leaf, h);
  flame_tensor_release(h);
  return st;
}

flame_status_t failing_post_hook(void* ud, flame_tensor_t) {
  static_cast<HookState*>(ud)->calls++;
  flame_set_error_message("my post hook failed");
  return FLAME_ERROR_IO;
}

using Hooks = GpuTest;

TEST_F(Hooks, ReplaceAndKeep) {
  T x = make(ctx, {2, 3}, {2}, true);
  HookState scale2, keep;
  scale2.factor = 2.0;
  flame_hook_t h1 = nullptr, h2 = nullptr;
  FLAME_ASSERT_OK(flame_tensor_register_hook(x, tensor_hook, &scale2, destroy_state, &h1));
  FLAME_ASSERT_OK(flame_tensor_register_hook(x, tensor_hook, &keep, destroy_state, &h2));
  ASSERT_NE(h1, nullptr);
  T loss = sum(mul(x, x));
  FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
  EXPECT_EQ(scale2.calls, 1);
  EXPECT_EQ(keep.calls, 1);
  ASSERT_EQ(scale2.seen.size(), 1u);
  EXPECT_EQ(scale2.seen[0], (Vals{4, 6})) << "the first hook sees the incoming gradient";
  ASSERT_EQ(keep.seen.size(), 1u);
  EXPECT_EQ(keep.seen[0], (Vals{8, 12})) << "hooks run in registration order on the replaced gradient";
  expect_vals(grad_of(x), {8, 12});
  EXPECT_EQ(scale2.destroyed, 0);
  flame_hook_remove(h1);
  EXPECT_EQ(scale2.destroyed, 1);
  flame_hook_remove(h2);
  EXPECT_EQ(keep.destroyed, 1);
  EXPECT_EQ(scale2.destroyed, 1);
}

TEST_F(Hooks, OnNonLeaf) {
  T x = make(ctx, {1, 2}, {2}, true);
  T y = mul(x, x);  // dy/dx = 2x
  HookState s;
  s.factor = 3.0;
  flame_hook_t h = nullptr;
  FLAME_ASSERT_OK(flame_tensor_register_hook(y, tensor_hook, &s, destroy_state, &h));
  T loss = sum(scale(y, 0.5));
  FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
  EXPECT_EQ(s.calls, 1);
  ASSERT_EQ(s.seen.size(), 1u);
  EXPECT_EQ(s.seen[0], (Vals{0.5, 0.5}));
  expect_vals(grad_of(x), {3 * 0.5 * 2 * 1, 3 * 0.5 * 2 * 2});
  EXPECT_EQ(grad_of(y).h, nullptr);
  flame_hook_remove(h);
  EXPECT_EQ(s.destroyed, 1);
}

TEST_F(Hooks, FailingHookStopsBackwardAndTheNextStepWorks) {
  T x = make(ctx, {2, 3}, {2}, true);
  T other = make(ctx, {1, 1}, {2}, true);
  HookState s;
  s.fail = true;
  flame_hook_t h = nullptr;
  FLAME_ASSERT_OK(flame_tensor_register_hook(x, tensor_hook, &s, destroy_state, &h));
  {
    T loss = sum(mul(x, x));
    FLAME_EXPECT_STATUS(flame_backward(ctx, loss, nullptr, 0), FLAME_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flame_last_error_message()).find("my hook failed"), std::string::npos)
        << "message: " << flame_last_error_message();
    EXPECT_EQ(grad_of(x).h, nullptr) << "the failed hook's gradient was not accumulated";
  }
  {  // on a non-leaf, the failure is reported the same way
    T y = mul(other, other);
    HookState f;
    f.fail = true;
    flame_hook_t hy = nullptr;
    FLAME_ASSERT_OK(flame_tensor_register_hook(y, tensor_hook, &f, destroy_state, &hy));
    T loss = sum(y);
    FLAME_EXPECT_STATUS(flame_backward(ctx, loss, nullptr, 0), FLAME_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flame_last_error_message()).find("my hook failed"), std::string::npos);
    EXPECT_EQ(grad_of(other).h, nullptr);
    flame_hook_remove(hy);
    EXPECT_EQ(f.destroyed, 1);
  }
  // The next training step: same hook, now succeeding.
  s.fail = false;
  for (int step = 0; step < 2; ++step) {
    FLAME_ASSERT_OK(flame_tensor_set_grad(x, nullptr));
    FLAME_ASSERT_OK(flame_tensor_set_grad(other, nullptr));
    T loss = add(sum(mul(x, x)), sum(mul(other, x)));
    FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
    expect_vals(grad_of(x), {2 * 2 + 1, 2 * 3 + 1});
    expect_vals(grad_of(other), {2, 3});
  }
  EXPECT_EQ(s.calls, 3);
  flame_hook_remove(h);
  EXPECT_EQ(s.destroyed, 1);
}

TEST_F(Hooks, PostAccumulateHooksEditGradInPlace) {
  T x = make(ctx, {0.1, 2, -3}, {3}, true);
  HookState clip;
  clip.factor = 1.0;  // clip to [-1, 1]
  flame_hook_t h = nullptr;
  FLAME_ASSERT_OK(flame_tensor_register_post_accumulate_grad_hook(x, clip_post_hook, &clip, destroy_state, &h));
  T loss = sum(mul(x, x));  // grad 2x = [0.2, 4, -6]
  FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
  EXPECT_EQ(clip.calls, 1);
  ASSERT_EQ(clip.seen.size(), 1u);
  expect_vals(grad_of(x), {0.2, 1, -1});
  // Second step: the hook sees the accumulated gradient ([0.2,1,-1] + [0.2,4,-6]).
  T loss2 = sum(mul(x, x));
  FLAME_ASSERT_OK(flame_backward(ctx, loss2, nullptr, 0));
  ASSERT_EQ(clip.seen.size(), 2u);
  EXPECT_NEAR(clip.seen[1][0], 0.4, 1e-6);
  EXPECT_NEAR(clip.seen[1][1], 5.0, 1e-6);
  EXPECT_NEAR(clip.seen[1][2], -7.0, 1e-6);
  expect_vals(grad_of(x), {0.4, 1, -1});
  flame_hook_remove(h);
  EXPECT_EQ(clip.destroyed, 1);

  // A multiplying hook, registered after a tensor hook: the tensor hook runs first.
  T y = make(ctx, {1, 2}, {2}, true);
  HookState dbl, half;
  dbl.factor = 2.0;
  flame_hook_t th = nullptr, ph = nullptr;
  FLAME_ASSERT_OK(flame_tensor_register_post_accumulate_grad_hook(y, halve_post_hook, &half, destroy_state, &ph));
  FLAME_ASSERT_OK(flame_tensor_register_hook(y, tensor_hook, &dbl, destroy_state, &th));
  T l3 = sum(mul(y, y));  // 2y = [2, 4] -> x2 -> [4, 8] accumulated -> halved [2, 4]
  FLAME_ASSERT_OK(flame_backward(ctx, l3, nullptr, 0));
  EXPECT_EQ(half.calls, 1);
  expect_vals(grad_of(y), {2, 4});
  flame_hook_remove(th);
  flame_hook_remove(ph);
  EXPECT_EQ(dbl.destroyed, 1);
  EXPECT_EQ(half.destroyed, 1);
}

// A leaf with a post-accumulate hook gets .grad and runs the hook as soon as its gradient is complete
// during the walk, before the walk reaches leaves deeper in the graph (what lets data-parallel
// all-reduces overlap the rest of backward); leaves without such hooks are updated after the walk.
struct WalkOrder {
  flame_tensor_t deep = nullptr, plain = nullptr;  // a (hooked, deeper) and c (no hook) below
  int calls = 0;
  bool deep_had_grad = true, plain_had_grad = true;
};
flame_status_t record_walk_order(void* user_data, flame_tensor_t) {
  auto* w = static_cast<WalkOrder*>(user_data);
  ++w->calls;
  flame_tensor_t g = nullptr;
  flame_tensor_grad(w->deep, &g);
  w->deep_had_grad = g != nullptr;
  flame_tensor_release(g);
  g = nullptr;
  flame_tensor_grad(w->plain, &g);
  w->plain_had_grad = g != nullptr;
  flame_tensor_release(g);
  return FLAME_OK;
}
flame_status_t no_op_post_hook(void*, flame_tensor_t) { return FLAME_OK; }

TEST_F(Hooks, PostAccumulateHooksRunDuringTheWalk) {
  T a = make(ctx, {0.5, -1}, {2}, true), b = make(ctx, {2, 3}, {2}, true), c = make(ctx, {1.5, 0.25}, {2}, true);
  WalkOrder w;
  w.deep = a;
  w.plain = c;
  flame_hook_t hb = nullptr, ha = nullptr;
  FLAME_ASSERT_OK(flame_tensor_register_post_accumulate_grad_hook(b, record_walk_order, &w, nullptr, &hb));
  FLAME_ASSERT_OK(flame_tensor_register_post_accumulate_grad_hook(a, no_op_post_hook, nullptr, nullptr, &ha));
  // loss = sum(((a * c) * a) * b): b's gradient is complete after the first backward node, a's and
  // c's only further down.
  T loss = sum(mul(mul(mul(a, c), a), b));
  FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
  EXPECT_EQ(w.calls, 1);
  EXPECT_FALSE(w.deep_had_grad) << "b's hook ran after the walk reached a";
  EXPECT_FALSE(w.plain_had_grad) << "c (no post hook) was updated before the walk ended";
  expect_vals(grad_of(b), {0.5 * 1.5 * 0.5, 1 * 0.25 * 1});  // a*c*a
  expect_vals(grad_of(a), {2 * 0.5 * 1.5 * 2, 2 * -1 * 0.25 * 3});  // 2 a c b
  expect_vals(grad_of(c), {0.25 * 2, 1 * 3});  // a^2 b
  flame_hook_remove(hb);
  flame_hook_remove(ha);
}

TEST_F(Hooks, PostAccumulateHookOnNonLeafIsAnError) {
  T x = make(ctx, {1, 2}, {2}, true);
  T y = mul(x, x);
  HookState s;
  flame_hook_t h = reinterpret_cast<flame_hook_t>(1);
  EXPECT_NE(flame_tensor_register_post_accumulate_grad_hook(y, clip_post_hook, &s, destroy_state, &h), FLAME_OK);
  EXPECT_EQ(h, nullptr);
  EXPECT_EQ(s.destroyed, 0) << "a hook that was never registered is not destroyed";
  EXPECT_NE(flame_tensor_register_hook(x, nullptr, &s, destroy_state, &h), FLAME_OK) << "fn NULL";
  FLAME_EXPECT_STATUS(flame_tensor_register_hook(x, tensor_hook, &s, destroy_state, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
}

TEST_F(Hooks, FailingPostAccumulateHook) {
  T x = make(ctx, {1, 2}, {2}, true);
  HookState s;
  flame_hook_t h = nullptr;
  FLAME_ASSERT_OK(flame_tensor_register_post_accumulate_grad_hook(x, failing_post_hook, &s, destroy_state, &h));
  T loss = sum(mul(x, x));
  FLAME_EXPECT_STATUS(flame_backward(ctx, loss, nullptr, 0), FLAME_ERROR_IO);
  EXPECT_NE(std::string(flame_last_error_message()).find("my post hook failed"), std::string::npos);
  EXPECT_EQ(s.calls, 1);
  flame_hook_remove(h);
  EXPECT_EQ(s.destroyed, 1);
  FLAME_ASSERT_OK(flame_tensor_set_grad(x, nullptr));
  T loss2 = sum(mul(x, x));
  FLAME_ASSERT_OK(flame_backward(ctx, loss2, nullptr, 0));
  expect_vals(grad_of(x), {2, 4});
  EXPECT_EQ(s.calls, 1);
}

TEST_F(Hooks, DestroyRunsExactlyOnce) {
  HookState a, b, c;
  flame_hook_t ha = nullptr, hb = nullptr, hc = nullptr;
  {
    T x = make(ctx, {1, 2}, {2}, true);
    FLAME_ASSERT_OK(flame_tensor_register_hook(x, tensor_hook, &a, destroy_state, &ha));
    FLAME_ASSERT_OK(flame_tensor_register_hook(x, tensor_hook, &b, destroy_state, &hb));
    FLAME_ASSERT_OK(flame_tensor_register_post_accumulate_grad_hook(x, clip_post_hook, &c, destroy_state, &hc));
    flame_hook_remove(ha);  // removed while the tensor lives
    EXPECT_EQ(a.destroyed, 1);
    EXPECT_EQ(b.destroyed, 0);
    EXPECT_EQ(c.destroyed, 0);
  }  // x released: the remaining hooks go with it
  EXPECT_EQ(a.destroyed, 1);
  EXPECT_EQ(b.destroyed, 1);
  EXPECT_EQ(c.destroyed, 1);
  flame_hook_remove(hb);  // frees the handle only
  flame_hook_remove(hc);
  EXPECT_EQ(b.destroyed, 1);
  EXPECT_EQ(c.destroyed, 1);
  flame_hook_remove(nullptr);  // no-op
  // destroy may be NULL.
  T y = make(ctx, {1}, {1}, true);
  HookState d;
  flame_hook_t hd = nullptr;
  FLAME_ASSERT_OK(flame_tensor_register_hook(y, tensor_hook, &d, nullptr, &hd));
  flame_hook_remove(hd);
  EXPECT_EQ(d.destroyed, 0);
}

TEST_F(Hooks, HookOnNonLeafDestroyedWhenEverythingGoes) {
  HookState s;
  flame_hook_t h = nullptr;
  {
    T x = make(ctx, {1, 2}, {2}, true);
    T y = mul(x, x);
    FLAME_ASSERT_OK(flame_tensor_register_hook(y, tensor_hook, &s, destroy_state, &h));
    T loss = sum(y);
    FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
    EXPECT_EQ(s.calls, 1);
    EXPECT_EQ(s.destroyed, 0);
  }
  EXPECT_EQ(s.destroyed, 1) << "the hook goes with its tensor";
  flame_hook_remove(h);
  EXPECT_EQ(s.destroyed, 1);
}

TEST_F(Hooks, RemovedMidTrainingStopsBeingCalled) {
  T w = make(ctx, {0.5, -0.5}, {2}, true);
  T xin = make(ctx, {1, 2}, {2});
  HookState s;
  s.factor = 10.0;
  flame_hook_t h = nullptr;
  FLAME_ASSERT_OK(flame_tensor_register_hook(w, tensor_hook, &s, destroy_state, &h));
  for (int step = 0; step < 4; ++step) {
    FLAME_ASSERT_OK(flame_tensor_set_grad(w, nullptr));
    T loss = sum(mul(w, xin));  // grad = xin
    FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
    if (step < 2) {
      expect_vals(grad_of(w), {10, 20});
    } else {
      expect_vals(grad_of(w), {1, 2});
    }
    if (step == 1) {
      flame_hook_remove(h);
      EXPECT_EQ(s.destroyed, 1);
    }
  }
  EXPECT_EQ(s.calls, 2);
  EXPECT_EQ(s.destroyed, 1);
}

// ------------------------------------------------------------------ graph freeing

TEST_F(Autograd, MemoryReturnsToBaselineAfterBackwardAndRelease) {
  FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));
  const flame_memory_stats_t base = mem(ctx);
  const int64_t n = 1 << 20;  // 4 MiB of f32
  const uint64_t bytes = static_cast<uint64_t>(n) * 4;
  {
    T x;
    FLAME_ASSERT_OK(flame_randn(ctx, &n, 1, FLAME_DTYPE_F32, x.out()));
    FLAME_ASSERT_OK(flame_tensor_set_requires_grad(x, 1));
    for (int step = 0; step < 3; ++step) {
      T loss;
      {
        T a = mul(x, x);
        T e;
        FLAME_ASSERT_OK(flame_tanh(a, e.out()));
        T s;
        FLAME_ASSERT_OK(flame_sin(e, s.out()));
        loss = mean(s);
      }  // intermediates live on only inside the graph
      FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
      FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));
      const flame_memory_stats_t after = mem(ctx);
      // x, x.grad and a scalar: the saved tensors are gone although loss is still held.
      EXPECT_LE(after.bytes_in_use, base.bytes_in_use + 2 * bytes + bytes / 4) << "step " << step;
    }
    FLAME_ASSERT_OK(flame_tensor_set_grad(x, nullptr));
  }
  FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));
  const flame_memory_stats_t end = mem(ctx);
  EXPECT_EQ(end.bytes_in_use, base.bytes_in_use);
  EXPECT_EQ(end.live_tensors, base.live_tensors);
}

TEST_F(Autograd, ReleasingTheRootWithoutBackwardFreesTheGraph) {
  FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));
  const flame_memory_stats_t base = mem(ctx);
  {
    const int64_t n = 1 << 18;
    T x;
    FLAME_ASSERT_OK(flame_randn(ctx, &n, 1, FLAME_DTYPE_F32, x.out()));
    FLAME_ASSERT_OK(flame_tensor_set_requires_grad(x, 1));
    T loss = sum(mul(mul(x, x), x));
    // retain_graph keeps everything; releasing the handles frees it.
    FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, FLAME_BACKWARD_RETAIN_GRAPH));
    T y = mul(x, x);  // a graph never walked
  }
  FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));
  const flame_memory_stats_t end = mem(ctx);
  EXPECT_EQ(end.bytes_in_use, base.bytes_in_use);
  EXPECT_EQ(end.live_tensors, base.live_tensors);
}

// ------------------------------------------------------------------ two contexts, two threads

// Linear regression with SGD: pred = sum(X * w, dim 1) + b, loss = mean((pred - y)^2).
// Returns the status of the first failure; *out gets w then b.
flame_status_t train(flame_ctx_t ctx, int steps, Vals* out) {
  const int64_t n = 64, d = 4;
  Vals X(n * d), Y(n);
  for (int64_t i = 0; i < n; ++i) {
    double yv = 0.3;
    for (int64_t j = 0; j < d; ++j) {
      X[i * d + j] = std::sin(0.37 * static_cast<double>(i * d + j) + 0.1);
      yv += X[i * d + j] * (0.5 * static_cast<double>(j) - 0.7);
    }
    Y[i] = yv;
  }
  std::vector<float> Xf(X.begin(), X.end()), Yf(Y.begin(), Y.end());
  flame_status_t st;
#define TRY(expr) \
  if ((st = (expr)) != FLAME_OK) return st
  T xt, yt, w, b;
  const int64_t xs[2] = {n, d}, ws[1] = {d};
  TRY(flame_from_host(ctx, Xf.data(), Xf.size() * 4, xs, 2, FLAME_DTYPE_F32, xt.out()));
  TRY(flame_from_host(ctx, Yf.data(), Yf.size() * 4, &n, 1, FLAME_DTYPE_F32, yt.out()));
  TRY(flame_zeros(ctx, ws, 1, FLAME_DTYPE_F32, w.out()));
  TRY(flame_zeros(ctx, nullptr, 0, FLAME_DTYPE_F32, b.out()));
  for (int s = 0; s < steps; ++s) {
    TRY(flame_tensor_set_requires_grad(w, 1));
    TRY(flame_tensor_set_requires_grad(b, 1));
    T xw, pred0, pred, diff, sq, loss;
    const int32_t dim1 = 1;
    TRY(flame_mul(xt, w, xw.out()));
    TRY(flame_sum(xw, &dim1, 1, 0, pred0.out()));
    TRY(flame_add(pred0, b, pred.out()));
    TRY(flame_sub(pred, yt, diff.out()));
    TRY(flame_square(diff, sq.out()));
    TRY(flame_mean(sq, nullptr, 0, 0, loss.out()));
    TRY(flame_backward(ctx, loss, nullptr, 0));
    T gw, gb, nw, nb, sw, sb;
    TRY(flame_tensor_grad(w, gw.out()));
    TRY(flame_tensor_grad(b, gb.out()));
    if (!gw.h || !gb.h) return FLAME_ERROR_INTERNAL;
    int32_t prev = 0;
    TRY(flame_ctx_set_grad_enabled(ctx, 0, &prev));
    TRY(flame_mul_scalar(gw, 0.1, sw.out()));
    TRY(flame_mul_scalar(gb, 0.1, sb.out()));
    TRY(flame_sub(w, sw, nw.out()));
    TRY(flame_sub(b, sb, nb.out()));
    TRY(flame_ctx_set_grad_enabled(ctx, prev, nullptr));
    w = std::move(nw);
    b = std::move(nb);
  }
  std::vector<float> wf(d), bf(1);
  TRY(flame_to_host(w, wf.data(), wf.size() * 4));
  TRY(flame_to_host(b, bf.data(), 4));
#undef TRY
  out->assign(wf.begin(), wf.end());
  out->push_back(bf[0]);
  return FLAME_OK;
}

TEST_F(Autograd, TwoContextsInTwoThreadsTrainIndependently) {
  const int steps = 30;
  Vals seq;
  FLAME_ASSERT_OK(train(ctx, steps, &seq));
  ASSERT_EQ(seq.size(), 5u);
  for (double p : seq) EXPECT_TRUE(std::isfinite(p));
  EXPECT_NE(seq[4], 0.0) << "training moved b";

  Vals r[2];
  flame_status_t st[2] = {FLAME_ERROR_INTERNAL, FLAME_ERROR_INTERNAL};
  std::string err[2];
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      bool skip = false;
      std::string why;
      flame_ctx_t c = flame_test_context(&skip, &why, 1000 + i);
      if (!c) {
        err[i] = why;
        return;
      }
      st[i] = train(c, steps, &r[i]);
      if (st[i] != FLAME_OK) err[i] = flame_last_error_message();
      flame_ctx_destroy(c);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(st[i], FLAME_OK) << "thread " << i << ": " << err[i];
    ASSERT_EQ(r[i].size(), seq.size());
    for (size_t k = 0; k < seq.size(); ++k) EXPECT_NEAR(r[i][k], seq[k], 1e-5) << "thread " << i << " param " << k;
  }
}

}  // namespace

// Fused elementwise expressions (flame_fused_compile / flame_fused_call): forward values against a
// float64 host reference of the same expression for the four float dtypes and every kernel layout
// (dense, misaligned, broadcast rows, strided), results equal to the same math run as separate FLAME
// ops (gelu-tanh, adaLN modulation) within a few ulps, gradients of every order through the
// project's gradient checker (first order in all dtypes, create_graph in f64) and up to the fourth
// derivative, promotion, and the documented errors.
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>
#include "gradcheck.h"

using namespace gc;

namespace {

const char* kGeluTanh = "0.5 * x0 * (1 + tanh(0.7978845608028654 * (x0 + 0.044715 * x0 * x0 * x0)))";
const char* kAdaln = "x0 * (1 + x1) + x2";

// Compiles expr, calls it on inputs and releases the function (the graph keeps what it needs).
flame_status_t fused(const char* expr, const Tensors& in, T* out) {
  flame_ctx_t ctx = nullptr;
  flame_status_t st = flame_tensor_context(in[0], &ctx);
  if (st != FLAME_OK) return st;
  flame_fused_t f = nullptr;
  if ((st = flame_fused_compile(ctx, expr, static_cast<int32_t>(in.size()), &f)) != FLAME_OK) return st;
  st = flame_fused_call(f, in.data(), static_cast<int32_t>(in.size()), out->out());
  flame_fused_release(f);
  return st;
}

FlameFn fused_fwd(const char* expr) {
  return [expr](const Tensors& in, flame_dtype_t, std::vector<T>& out) {
    out.emplace_back();
    return fused(expr, in, &out.back());
  };
}

// Elementwise f over the broadcast inputs, in float64.
using F = std::function<double(const double*)>;
HT host_eval(const std::vector<HT>& xs, const F& f) {
  std::vector<Shape> shapes;
  for (const HT& x : xs) shapes.push_back(x.shape);
  Shape s = broadcast_shapes(shapes);
  std::vector<HT> e;
  for (const HT& x : xs) e.push_back(expand(x, s));
  HT o(s);
  std::vector<double> v(xs.size());
  for (size_t i = 0; i < o.v.size(); ++i) {
    for (size_t k = 0; k < xs.size(); ++k) v[k] = e[k].v[i];
    o.v[i] = f(v.data());
  }
  return o;
}
RefFn ref_of(F f) {
  return [f](const std::vector<HT>& xs) { return std::vector<HT>{host_eval(xs, f)}; };
}

double adaln(const double* x) { return x[0] * (1 + x[1]) + x[2]; }
double gelu_ref(const double* x) { return gelu_tanh(x[0]); }
const char* kMix =
    "sigmoid(x0) * x1 - log(1 + x1 * x1) + sqrt(2 + sin(x0)) / (3 + cos(x0 * x1)) + rsqrt(1.5 + x0 * x0) * erf(x1) "
    "+ pow(2 + x1, -1.5) + exp(-x0 * x0)";
double mix(const double* x) {
  const double a = x[0], b = x[1];
  return sigmoid(a) * b - std::log(1 + b * b) + std::sqrt(2 + std::sin(a)) / (3 + std::cos(a * b)) +
         std::erf(b) / std::sqrt(1.5 + a * a) + std::pow(2 + b, -1.5) + std::exp(-a * a);
}
const char* kKinks = "abs(x0) * max(x0, x1) - min(x0, x1) * sign(x1) + pow(x0, 3)";
double kinks(const double* x) {
  const double a = x[0], b = x[1];
  return std::fabs(a) * std::max(a, b) - std::min(a, b) * sign(b) + a * a * a;
}
const char* kDiv = "x0 / x1 + x0 * x2";
double divide(const double* x) { return x[0] / x[1] + x[0] * x[2]; }

Row row(std::string name, const char* expr, F f, std::vector<Case> cases, bool low_precision) {
  Row r;
  r.name = std::move(name);
  r.covers = {"fused"};
  r.cases = std::move(cases);
  r.fwd = fused_fwd(expr);
  r.ref = ref_of(std::move(f));
  r.low_precision = low_precision;
  return r;
}

const std::vector<Row>& rows() {
  static const std::vector<Row> table = [] {
    std::vector<Row> v;
    v.push_back(row("fused_gelu_tanh", kGeluTanh, gelu_ref, {Case({in({3, 5}, uni(-3, 3))}), Case({nc({4, 6}, uni(-3, 3))})}, true));
    // adaLN: x [N, T, C], scale [N, 1, C], shift [C]; and all three the same shape, x transposed.
    v.push_back(row("fused_adaln", kAdaln, adaln,
                    {Case({in({2, 3, 4}), in({2, 1, 4}), in({4})}), Case({nc({3, 4}), in({3, 4}), in({3, 4})})}, true));
    // x1 >= -1.5 keeps pow(2 + x1, -1.5) <= 2.8: near its pole the loss grows to ~1e3 and the f64
    // finite differences' rounding (1e-16 * loss / h) reaches the 1e-6 tolerance (a seed hit it).
    v.push_back(row("fused_math_mix", kMix, mix,
                    {Case({in({3, 4}), nc({3, 4}, uni(-1.5, 2))}), Case({in({2, 3}), in({3}, uni(-1.5, 2))})}, false));
    // Away from the kinks of abs and sign (0) and of max/min (x0 = x1): the grids never meet.
    v.push_back(row("fused_kinks", kKinks, kinks, {Case({in({3, 4}, grid(0.25)), in({3, 4}, grid(0.75))})}, false));
    // A 0-d input, a strided 1-d input and a positive divisor.
    v.push_back(row("fused_div_scalar_strided", kDiv, divide, {Case({in({2, 3}), nc({3}, uni(0.5, 2)), in({})})}, false));
    return v;
  }();
  return table;
}

}  // namespace

FLAME_GRADCHECK_SUITES(Fused, FusedGradCheck, FusedGradGradCheck, rows, 0x5bd1e9955bd1e995ull);

namespace {

class FusedTest : public GpuTest {
 protected:
  // Uploads host values as dtype dt and reads back what the device holds (rounded).
  void make(HT* x, flame_dtype_t dt, T* t) {
    ASSERT_EQ(upload(ctx, *x, dt, t->out()), FLAME_OK) << flame_last_error_message();
    ASSERT_EQ(download(*t, x), FLAME_OK) << flame_last_error_message();
  }
  HT random(Shape s, double lo, double hi, uint64_t seed) {
    std::mt19937_64 rng(seed ^ gc::seed());
    std::uniform_real_distribution<double> u(lo, hi);
    HT x(std::move(s));
    for (double& e : x.v) {
      e = u(rng);
      if (e == 0) e = 0.5;
    }
    return x;
  }
  uint64_t live() {
    flame_memory_stats_t s;
    s.struct_size = sizeof s;
    flame_ctx_memory_stats(ctx, &s);
    return s.live_tensors;
  }
};

// The rounding unit of dt (half the spacing of values in [1, 2)).
double unit(flame_dtype_t dt) {
  switch (dt) {
    case FLAME_DTYPE_F64: return std::ldexp(1.0, -53);
    case FLAME_DTYPE_F32: return std::ldexp(1.0, -24);
    case FLAME_DTYPE_F16: return std::ldexp(1.0, -11);
    default: return std::ldexp(1.0, -8);
  }
}

// |got - want| <= ulps * unit * scale_i elementwise; scale defaults to |want| + 1e-3.
::testing::AssertionResult within(const HT& got, const HT& want, const HT* scale, double bound, const std::string& what) {
  if (got.shape != want.shape) return ::testing::AssertionFailure() << what << ": shape " << shape_str(got.shape);
  for (size_t i = 0; i < want.v.size(); ++i) {
    const double s = scale ? scale->v[i] : std::fabs(want.v[i]) + 1e-3;
    if (!(std::fabs(got.v[i] - want.v[i]) <= bound * s))
      return ::testing::AssertionFailure() << what << ": element " << i << " is " << got.v[i] << ", expected "
                                           << want.v[i] << " (bound " << bound * s << ")";
  }
  return ::testing::AssertionSuccess();
}

const flame_dtype_t kFloats[] = {FLAME_DTYPE_F32, FLAME_DTYPE_F64, FLAME_DTYPE_F16, FLAME_DTYPE_BF16};

// The expression's value rounds once to the output dtype: within about one unit of the float64
// value (f32/f64: a few units for the math functions in between).
double forward_bound(flame_dtype_t dt) {
  return (dt == FLAME_DTYPE_F32 || dt == FLAME_DTYPE_F64 ? 64 : 2) * unit(dt);
}

}  // namespace

TEST_F(FusedTest, ForwardMatchesFloat64InEveryDtypeAndLayout) {
  struct Layout {
    const char* name;
    std::vector<Shape> shapes;
  };
  // adaLN over [B, T, C] with scale [B, 1, C] and shift [C]: C = 64 takes the rows kernel, C = 5 the
  // strided one; all dense: the vector kernel; then the scalar tail of an odd count.
  const std::vector<Layout> layouts = {{"rows [2,3,64]+[2,1,64]+[64]", {{2, 3, 64}, {2, 1, 64}, {64}}},
                                       {"strided [2,3,5]+[2,1,5]+[5]", {{2, 3, 5}, {2, 1, 5}, {5}}},
                                       {"dense [4,33]", {{4, 33}, {4, 33}, {4, 33}}},
                                       {"dense odd [1001]", {{1001}, {1001}, {1001}}},
                                       {"0-d scale [7,16]+[]+[16]", {{7, 16}, {}, {16}}}};
  for (flame_dtype_t dt : kFloats) {
    for (const Layout& l : layouts) {
      SCOPED_TRACE(std::string(flame_dtype_name(dt)) + " " + l.name);
      std::vector<HT> xs;
      std::vector<T> ts(3);
      for (size_t k = 0; k < 3; ++k) {
        xs.push_back(random(l.shapes[k], -2, 2, 11 + k));
        make(&xs[k], dt, &ts[k]);
      }
      T out;
      FLAME_ASSERT_OK(fused(kAdaln, {ts[0], ts[1], ts[2]}, &out));
      EXPECT_EQ(dtype_of(out), dt);
      HT got, want = host_eval(xs, adaln);
      FLAME_ASSERT_OK(download(out, &got));
      HT scale = host_eval(xs, [](const double* x) { return std::fabs(x[0] * (1 + x[1])) + std::fabs(x[2]) + 1e-3; });
      EXPECT_TRUE(within(got, want, &scale, forward_bound(dt), "adaln"));
    }
    SCOPED_TRACE(flame_dtype_name(dt));
    // Every function of the grammar, on a transposed (non-contiguous) input and a broadcast row.
    HT a = random({6, 8}, -1.5, 1.5, 21), b = random({8}, -1.5, 1.5, 22);
    T ta, tat, tb, out;
    HT at = transpose(a, 0, 1);  // stored [8, 6], read through a transposed view as [6, 8]
    make(&at, dt, &ta);
    FLAME_ASSERT_OK(flame_transpose(ta, 0, 1, tat.out()));
    FLAME_ASSERT_OK(download(tat, &a));
    make(&b, dt, &tb);
    FLAME_ASSERT_OK(fused(kMix, {tat, tb}, &out));
    HT got;
    FLAME_ASSERT_OK(download(out, &got));
    HT want = host_eval({a, b}, mix);
    HT scale(want.shape, 8.0);  // the sum of the terms' magnitudes is below 8
    EXPECT_TRUE(within(got, want, &scale, forward_bound(dt), "math mix"));
  }
}

TEST_F(FusedTest, LargeDenseAndMisalignedInputs) {
  // 2^23 + 3 elements (more vectors than the capped grid has threads, 32 per SM x 256): the
  // two-vectors-per-thread loop, its single-vector remainder and the scalar tail; then the same data
  // through a view one element in (misaligned: scalar accesses).
  const int64_t n = (int64_t{1} << 23) + 3;
  HT x = random({n + 1}, -4, 4, 31);
  T base, view, out, out2;
  make(&x, FLAME_DTYPE_F32, &base);
  FLAME_ASSERT_OK(flame_narrow(base, 0, 0, n, view.out()));
  FLAME_ASSERT_OK(fused(kGeluTanh, {view}, &out));
  HT got;
  FLAME_ASSERT_OK(download(out, &got));
  HT xv({n});
  xv.v.assign(x.v.begin(), x.v.end() - 1);
  HT want = host_eval({xv}, gelu_ref);
  HT scale = host_eval({xv}, [](const double* v) { return std::fabs(v[0]) + 1e-3; });
  EXPECT_TRUE(within(got, want, &scale, 16 * unit(FLAME_DTYPE_F32), "aligned"));
  FLAME_ASSERT_OK(flame_narrow(base, 0, 1, n, view.out()));
  FLAME_ASSERT_OK(fused(kGeluTanh, {view}, &out2));
  FLAME_ASSERT_OK(download(out2, &got));
  xv.v.assign(x.v.begin() + 1, x.v.end());
  want = host_eval({xv}, gelu_ref);
  scale = host_eval({xv}, [](const double* v) { return std::fabs(v[0]) + 1e-3; });
  EXPECT_TRUE(within(got, want, &scale, 16 * unit(FLAME_DTYPE_F32), "misaligned"));
}

// gelu-tanh and adaLN fused give what the same math as separate FLAME ops gives (f32, f64: the same
// roundings but for FMA contraction, so a few units); in f16/bf16 the composite rounds after every
// op, the fused result once: it is checked against float64 to one unit instead.
TEST_F(FusedTest, GeluTanhAndAdalnEqualTheCompositeOfOps) {
  for (flame_dtype_t dt : kFloats) {
    SCOPED_TRACE(flame_dtype_name(dt));
    HT x = random({16, 96}, -4, 4, 41), s = random({4, 1, 96}, -1, 1, 42), sh = random({4, 1, 96}, -1, 1, 43);
    T tx, ts, tsh;
    make(&x, dt, &tx);
    make(&s, dt, &ts);
    make(&sh, dt, &tsh);
    // gelu-tanh as ops: 0.5 x (1 + tanh(k (x + c x^3)))
    T x2, x3, cx3, inner, u, t, onep, h, comp, fz;
    FLAME_ASSERT_OK(flame_mul(tx, tx, x2.out()));
    FLAME_ASSERT_OK(flame_mul(x2, tx, x3.out()));
    FLAME_ASSERT_OK(flame_mul_scalar(x3, 0.044715, cx3.out()));
    FLAME_ASSERT_OK(flame_add(tx, cx3, inner.out()));
    FLAME_ASSERT_OK(flame_mul_scalar(inner, 0.7978845608028654, u.out()));
    FLAME_ASSERT_OK(flame_tanh(u, t.out()));
    FLAME_ASSERT_OK(flame_add_scalar(t, 1.0, onep.out()));
    FLAME_ASSERT_OK(flame_mul(tx, onep, h.out()));
    FLAME_ASSERT_OK(flame_mul_scalar(h, 0.5, comp.out()));
    FLAME_ASSERT_OK(fused(kGeluTanh, {tx}, &fz));
    HT got, want, scale = host_eval({x}, [](const double* v) { return std::fabs(v[0]) + 1e-30; });
    FLAME_ASSERT_OK(download(fz, &got));
    if (dt == FLAME_DTYPE_F32 || dt == FLAME_DTYPE_F64) {
      FLAME_ASSERT_OK(download(comp, &want));
      EXPECT_TRUE(within(got, want, &scale, 16 * unit(dt), "gelu-tanh fused vs composite"));
    } else {
      want = host_eval({x}, gelu_ref);
      HT mag = host_eval({x}, [](const double* v) { return std::fabs(gelu_tanh(v[0])) + 1e-4; });
      EXPECT_TRUE(within(got, want, &mag, 2 * unit(dt), "gelu-tanh fused vs float64"));
    }
    // adaLN: x [4, 4, 96] (the same values) with scale and shift [4, 1, 96]: x * (1 + scale) + shift
    T xr, one_s, prod, ada, fa;
    const int64_t shape3[] = {4, 4, 96};
    FLAME_ASSERT_OK(flame_reshape(tx, shape3, 3, xr.out()));
    FLAME_ASSERT_OK(flame_add_scalar(ts, 1.0, one_s.out()));
    FLAME_ASSERT_OK(flame_mul(xr, one_s, prod.out()));
    FLAME_ASSERT_OK(flame_add(prod, tsh, ada.out()));
    FLAME_ASSERT_OK(fused(kAdaln, {xr, ts, tsh}, &fa));
    HT ga, ca, xh, sh_h, s_h;
    FLAME_ASSERT_OK(download(fa, &ga));
    FLAME_ASSERT_OK(download(xr, &xh));
    FLAME_ASSERT_OK(download(ts, &s_h));
    FLAME_ASSERT_OK(download(tsh, &sh_h));
    HT mag = host_eval({xh, s_h, sh_h}, [](const double* v) { return std::fabs(v[0] * (1 + v[1])) + std::fabs(v[2]) + 1e-30; });
    if (dt == FLAME_DTYPE_F32 || dt == FLAME_DTYPE_F64) {
      FLAME_ASSERT_OK(download(ada, &ca));
      EXPECT_TRUE(within(ga, ca, &mag, 4 * unit(dt), "adaln fused vs composite"));
    } else {
      EXPECT_TRUE(within(ga, host_eval({xh, s_h, sh_h}, adaln), &mag, 2 * unit(dt), "adaln fused vs float64"));
    }
  }
}

// The backward of the fused gelu-tanh equals flame_gelu(approximate = 1)'s in f32.
TEST_F(FusedTest, GeluTanhGradientEqualsFlameGelu) {
  HT x = random({8, 40}, -4, 4, 51), w = random({8, 40}, -1, 1, 52);
  std::vector<HT> grads;
  for (int use_fused : {1, 0}) {
    T tx, tw, y, p, loss, g;
    make(&x, FLAME_DTYPE_F32, &tx);
    make(&w, FLAME_DTYPE_F32, &tw);
    FLAME_ASSERT_OK(flame_tensor_set_requires_grad(tx, 1));
    if (use_fused) FLAME_ASSERT_OK(fused(kGeluTanh, {tx}, &y));
    else FLAME_ASSERT_OK(flame_gelu(tx, 1, y.out()));
    FLAME_ASSERT_OK(flame_mul(y, tw, p.out()));
    FLAME_ASSERT_OK(flame_sum_all(p, loss.out()));
    FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
    FLAME_ASSERT_OK(flame_tensor_grad(tx, g.out()));
    HT h;
    FLAME_ASSERT_OK(download(g, &h));
    grads.push_back(h);
  }
  HT scale = host_eval({x}, [](const double* v) { return std::fabs(v[0]) + 1.0; });
  EXPECT_TRUE(within(grads[0], grads[1], &scale, 64 * unit(FLAME_DTYPE_F32), "fused vs flame_gelu gradient"));
}

// d^k/dx^k x^4 for k = 1..4 through create_graph: 4x^3, 12x^2, 24x, 24.
TEST_F(FusedTest, FourthOrderDerivative) {
  HT x = random({64}, -2, 2, 61);
  T tx;
  make(&x, FLAME_DTYPE_F64, &tx);
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(tx, 1));
  T y;
  FLAME_ASSERT_OK(fused("x0 * x0 * x0 * x0", {tx}, &y));
  const std::function<double(double)> want[] = {[](double v) { return 4 * v * v * v; }, [](double v) { return 12 * v * v; },
                                                [](double v) { return 24 * v; }, [](double) { return 24.0; }};
  T cur = std::move(y);
  for (int k = 0; k < 4; ++k) {
    SCOPED_TRACE("order " + std::to_string(k + 1));
    T s, g;
    FLAME_ASSERT_OK(flame_sum_all(cur, s.out()));
    flame_tensor_t sh = s, xh = tx;
    FLAME_ASSERT_OK(flame_grad(ctx, &sh, nullptr, 1, &xh, 1, FLAME_BACKWARD_CREATE_GRAPH, g.out()));
    HT got;
    FLAME_ASSERT_OK(download(g, &got));
    HT ref = x;
    for (double& e : ref.v) e = want[k](e);
    EXPECT_TRUE(close(got, ref, 1e-12, "derivative"));
    cur = std::move(g);
  }
}

TEST_F(FusedTest, UnusedInputsGetZeroAndIdentityGradients) {
  HT a = random({3, 4}, -1, 1, 71), b = random({4}, -1, 1, 72);
  T ta, tb, y, loss, ga, gb;
  make(&a, FLAME_DTYPE_F32, &ta);
  make(&b, FLAME_DTYPE_F32, &tb);
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(ta, 1));
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(tb, 1));
  FLAME_ASSERT_OK(fused("x0 + 0 * x1", {ta, tb}, &y));  // simplified to x0: x1 unused
  FLAME_ASSERT_OK(flame_sum_all(y, loss.out()));
  FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
  FLAME_ASSERT_OK(flame_tensor_grad(ta, ga.out()));
  FLAME_ASSERT_OK(flame_tensor_grad(tb, gb.out()));
  HT ha, hb;
  FLAME_ASSERT_OK(download(ga, &ha));
  FLAME_ASSERT_OK(download(gb, &hb));
  EXPECT_TRUE(close(ha, HT({3, 4}, 1.0), 0, "d/dx0"));
  EXPECT_TRUE(close(hb, HT({4}, 0.0), 0, "d/dx1 (unused)"));
}

TEST_F(FusedTest, PromotionAndGradMode) {
  HT a({2, 3}, 3.0), b({3}, 2.0);
  T ti, th, tb, y;
  FLAME_ASSERT_OK(upload(ctx, a, FLAME_DTYPE_I32, ti.out()));
  FLAME_ASSERT_OK(upload(ctx, b, FLAME_DTYPE_F16, th.out()));
  FLAME_ASSERT_OK(upload(ctx, b, FLAME_DTYPE_BOOL, tb.out()));
  FLAME_ASSERT_OK(fused("x0 / x1", {ti, th}, &y));
  EXPECT_EQ(dtype_of(y), FLAME_DTYPE_F16);  // i32 with f16 promotes to f16
  HT h;
  FLAME_ASSERT_OK(download(y, &h));
  EXPECT_TRUE(close(h, HT({2, 3}, 1.5), 0, "i32 / f16"));
  T y2;
  FLAME_ASSERT_OK(fused("x0 / x1", {ti, ti}, &y2));
  EXPECT_EQ(dtype_of(y2), FLAME_DTYPE_F32);  // integers compute in f32
  T y3;
  FLAME_ASSERT_OK(fused("x0 * 2 + x1", {ti, tb}, &y3));
  FLAME_ASSERT_OK(download(y3, &h));
  EXPECT_TRUE(close(h, HT({2, 3}, 7.0), 0, "i32 with bool"));
  // An input that requires grad is recorded; with grad mode off nothing is.
  T tf, y4, y5;
  FLAME_ASSERT_OK(upload(ctx, b, FLAME_DTYPE_F32, tf.out()));
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(tf, 1));
  FLAME_ASSERT_OK(fused("exp(x0)", {tf}, &y4));
  int32_t rg = 0;
  FLAME_ASSERT_OK(flame_tensor_requires_grad(y4, &rg));
  EXPECT_EQ(rg, 1);
  int32_t prev = 0;
  FLAME_ASSERT_OK(flame_ctx_set_grad_enabled(ctx, 0, &prev));
  FLAME_ASSERT_OK(fused("exp(x0)", {tf}, &y5));
  FLAME_ASSERT_OK(flame_tensor_requires_grad(y5, &rg));
  EXPECT_EQ(rg, 0);
  FLAME_ASSERT_OK(flame_ctx_set_grad_enabled(ctx, prev, nullptr));
}

TEST_F(FusedTest, ReleasedFunctionKeepsItsGraphDifferentiable) {
  HT a = random({5}, -1, 1, 81);
  T ta, y, loss, g;
  make(&a, FLAME_DTYPE_F64, &ta);
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(ta, 1));
  flame_fused_t f = nullptr;
  FLAME_ASSERT_OK(flame_fused_compile(ctx, "sin(x0) * x0", 1, &f));
  flame_tensor_t in = ta;
  FLAME_ASSERT_OK(flame_fused_call(f, &in, 1, y.out()));
  flame_fused_release(f);
  flame_fused_release(f);  // released again: detected, nothing happens
  flame_tensor_t out = reinterpret_cast<flame_tensor_t>(static_cast<uintptr_t>(0x40));
  FLAME_EXPECT_STATUS(flame_fused_call(f, &in, 1, &out), FLAME_ERROR_INVALID_HANDLE);
  EXPECT_EQ(out, nullptr);
  FLAME_ASSERT_OK(flame_sum_all(y, loss.out()));
  FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
  FLAME_ASSERT_OK(flame_tensor_grad(ta, g.out()));
  HT got, want = a;
  FLAME_ASSERT_OK(download(g, &got));
  for (double& e : want.v) e = std::cos(e) * e + std::sin(e);
  EXPECT_TRUE(close(got, want, 1e-12, "d/dx sin(x) x"));
}

TEST_F(FusedTest, ErrorsReturnTheDocumentedStatusAndNoOutput) {
  flame_fused_t f = reinterpret_cast<flame_fused_t>(static_cast<uintptr_t>(0x40));
  FLAME_EXPECT_STATUS(flame_fused_compile(ctx, "x0 + * 2", 1, &f), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(f, nullptr);
  EXPECT_NE(std::string(flame_last_error_message()).find("column 6"), std::string::npos) << flame_last_error_message();
  FLAME_EXPECT_STATUS(flame_fused_compile(ctx, "x1", 1, &f), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(f, nullptr);
  FLAME_EXPECT_STATUS(flame_fused_compile(ctx, "pow(x0, x0)", 1, &f), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_fused_compile(ctx, "x0", 0, &f), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_fused_compile(ctx, "x0", FLAME_FUSED_MAX_INPUTS + 1, &f), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(f, nullptr);

  FLAME_ASSERT_OK(flame_fused_compile(ctx, "x0 * x1", 2, &f));
  HT a({2, 3}, 1.0), b({4}, 1.0);
  T ta, tb;
  FLAME_ASSERT_OK(upload(ctx, a, FLAME_DTYPE_F32, ta.out()));
  FLAME_ASSERT_OK(upload(ctx, b, FLAME_DTYPE_F32, tb.out()));
  const uint64_t before = live();
  flame_tensor_t ins[3] = {ta, tb, ta};
  flame_tensor_t out = reinterpret_cast<flame_tensor_t>(static_cast<uintptr_t>(0x40));
  FLAME_EXPECT_STATUS(flame_fused_call(f, ins, 1, &out), FLAME_ERROR_INVALID_ARGUMENT);  // wrong count
  EXPECT_EQ(out, nullptr);
  FLAME_EXPECT_STATUS(flame_fused_call(f, ins, 3, &out), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);
  FLAME_EXPECT_STATUS(flame_fused_call(f, ins, 2, &out), FLAME_ERROR_SHAPE_MISMATCH);  // [2,3] with [4]
  EXPECT_EQ(out, nullptr);
  flame_tensor_t with_null[2] = {ta, nullptr};
  FLAME_EXPECT_STATUS(flame_fused_call(f, with_null, 2, &out), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("inputs[1]"), std::string::npos) << flame_last_error_message();
  EXPECT_EQ(out, nullptr);
  EXPECT_EQ(live(), before) << "a failed call left tensors behind";
  flame_fused_release(f);
}

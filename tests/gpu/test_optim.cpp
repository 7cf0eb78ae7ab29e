// Optimizers and gradient tools against host float64 implementations of torch.optim's formulas:
// several steps with fresh random gradients for SGD (momentum, dampening, nesterov, weight decay),
// Adam (L2, amsgrad), AdamW, Lion, maximize; f32 and f64 parameters, bf16 with f32 master weights
// and stochastic rounding; parameter groups, learning-rate changes, zero_grad, skipped parameters;
// clip_grad_norm / clip_grad_value; bad input.
#include <cmath>
#include <vector>
#include "host_ref.h"

using namespace href;

namespace {

struct HostOpt {
  flame_optimizer_options_t o;
  std::vector<double> w, m, v, vmax;
  // Lion: elements whose interpolated momentum c was within tie_eps (relative) of 0 at some step. The
  // device's sign of c, rounded in the parameter dtype, may differ from this float64 one there (a
  // step of 2 * lr apart; f32, seed 195298970771625: 1 of 70000 elements).
  std::vector<char> tie;
  double tie_eps = 0;
  int64_t t = 0;
  bool fresh = true;
  void step(const std::vector<double>& grad) {
    ++t;
    const double bc1 = 1 - std::pow(o.beta1, static_cast<double>(t)), bc2 = 1 - std::pow(o.beta2, static_cast<double>(t));
    if (m.empty()) m.assign(w.size(), 0.0), v.assign(w.size(), 0.0), vmax.assign(w.size(), 0.0), tie.assign(w.size(), 0);
    for (size_t i = 0; i < w.size(); ++i) {
      double g = o.maximize ? -grad[i] : grad[i];
      double x = w[i];
      if (o.kind == FLAME_OPTIMIZER_SGD) {
        if (o.weight_decay != 0) g += o.weight_decay * x;
        if (o.momentum > 0) {
          double buf = fresh ? g : o.momentum * m[i] + (1 - o.dampening) * g;
          m[i] = buf;
          g = o.nesterov ? g + o.momentum * buf : buf;
        }
        x -= o.lr * g;
      } else if (o.kind == FLAME_OPTIMIZER_LION) {
        double c = o.beta1 * m[i] + (1 - o.beta1) * g;
        if (std::fabs(c) <= tie_eps * (std::fabs(o.beta1 * m[i]) + std::fabs((1 - o.beta1) * g))) tie[i] = 1;
        x *= 1 - o.lr * o.weight_decay;
        x -= o.lr * ((c > 0) - (c < 0));
        m[i] = o.beta2 * m[i] + (1 - o.beta2) * g;
      } else {
        if (o.kind == FLAME_OPTIMIZER_ADAM && o.weight_decay != 0) g += o.weight_decay * x;
        if (o.kind == FLAME_OPTIMIZER_ADAMW) x *= 1 - o.lr * o.weight_decay;
        m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
        v[i] = o.beta2 * v[i] + (1 - o.beta2) * g * g;
        double vi = v[i];
        if (o.amsgrad) vi = vmax[i] = std::max(vmax[i], vi);
        x -= o.lr / bc1 * m[i] / (std::sqrt(vi) / std::sqrt(bc2) + o.eps);
      }
      w[i] = x;
    }
    fresh = false;
  }
};

struct Variant {
  const char* name;
  int32_t kind;
  void (*edit)(flame_optimizer_options_t&);
};

const Variant kVariants[] = {
    {"sgd", FLAME_OPTIMIZER_SGD, [](flame_optimizer_options_t& o) { o.lr = 0.1; }},
    {"sgd_momentum_wd", FLAME_OPTIMIZER_SGD, [](flame_optimizer_options_t& o) { o.lr = 0.05; o.momentum = 0.9; o.dampening = 0.1; o.weight_decay = 0.01; }},
    {"sgd_nesterov_maximize", FLAME_OPTIMIZER_SGD, [](flame_optimizer_options_t& o) { o.lr = 0.05; o.momentum = 0.8; o.nesterov = 1; o.maximize = 1; }},
    {"adam_l2", FLAME_OPTIMIZER_ADAM, [](flame_optimizer_options_t& o) { o.lr = 0.01; o.weight_decay = 0.1; }},
    {"adam_amsgrad", FLAME_OPTIMIZER_ADAM, [](flame_optimizer_options_t& o) { o.lr = 0.01; o.amsgrad = 1; }},
    {"adamw", FLAME_OPTIMIZER_ADAMW, [](flame_optimizer_options_t& o) { o.lr = 0.01; o.weight_decay = 0.1; }},
    {"adamw_amsgrad", FLAME_OPTIMIZER_ADAMW, [](flame_optimizer_options_t& o) { o.lr = 0.02; o.amsgrad = 1; o.beta1 = 0.8; }},
    {"lion", FLAME_OPTIMIZER_LION, [](flame_optimizer_options_t& o) { o.lr = 0.003; o.weight_decay = 0.5; }},
};

class Optim : public GpuTest {};

void set_grad(flame_ctx_t ctx, flame_tensor_t p, const HT& g) {
  T gt = upload(ctx, g);
  ASSERT_EQ(flame_tensor_set_grad(p, gt), FLAME_OK) << flame_last_error_message();
}

TEST_F(Optim, StepsMatchTheHostFormulas) {
  HREF_RNG(rng);
  const Shape shapes[] = {{33, 7}, {1000}, {70000}};  // the last spans two chunks
  for (flame_dtype_t dt : {FLAME_DTYPE_F32, FLAME_DTYPE_F64}) {
    for (const Variant& var : kVariants) {
      SCOPED_TRACE(::testing::Message() << var.name << " " << dname(dt));
      flame_optimizer_options_t o;
      FLAME_ASSERT_OK(flame_optimizer_options_init(&o, var.kind));
      var.edit(o);
      std::vector<T> params;
      std::vector<HostOpt> host;
      std::vector<flame_tensor_t> raw;
      for (const Shape& s : shapes) {
        HT w = random(rng, s, dt, -1, 1);
        params.push_back(upload(ctx, w));
        FLAME_ASSERT_OK(flame_tensor_set_requires_grad(params.back(), 1));
        raw.push_back(params.back());
        host.push_back({o, w.values(), {}, {}, {}});
        host.back().tie_eps = dt == FLAME_DTYPE_F32 ? 1e-6 : 1e-14;
      }
      flame_optimizer_t opt = nullptr;
      FLAME_ASSERT_OK(flame_optimizer_create(ctx, &o, raw.data(), static_cast<int64_t>(raw.size()), &opt));
      for (int step = 0; step < 5; ++step) {
        for (size_t k = 0; k < params.size(); ++k) {
          HT g = random(rng, shapes[k], dt, -1, 1);
          set_grad(ctx, params[k], g);
          host[k].step(g.values());
        }
        FLAME_ASSERT_OK(flame_optimizer_step(opt));
      }
      int64_t steps = 0;
      FLAME_ASSERT_OK(flame_optimizer_step_count(opt, &steps));
      EXPECT_EQ(steps, 5);
      for (size_t k = 0; k < params.size(); ++k) {
        std::vector<double> w = host[k].w;
        if (var.kind == FLAME_OPTIMIZER_LION) {  // a sign tie may go either way: one step of 2 * lr
          const std::vector<double> got = download(params[k]).values();
          for (size_t i = 0; i < w.size(); ++i)
            if (host[k].tie[i] && std::fabs(got[i] - w[i]) <= 2 * o.lr * 1.001) w[i] = got[i];
        }
        HT want = HT::from_values(shapes[k], dt, w);
        // Lion's sign steps are exact; Adam's denominators amplify f32 rounding near v = 0.
        EXPECT_TRUE(matches(params[k], want, dt == FLAME_DTYPE_F64 ? Tol{1e-11, 1e-12} : Tol{2e-5, 2e-6})) << "param " << k;
      }
      flame_optimizer_release(opt);
    }
  }
}

TEST_F(Optim, Bf16ParametersWithMasterWeights) {
  HREF_RNG(rng);
  flame_optimizer_options_t o;
  FLAME_ASSERT_OK(flame_optimizer_options_init(&o, FLAME_OPTIMIZER_ADAMW));
  o.lr = 1e-3;
  o.master_weights = 1;
  HT w = random(rng, {4096}, FLAME_DTYPE_BF16, -1, 1);
  T p = upload(ctx, w);
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(p, 1));
  flame_tensor_t raw = p;
  flame_optimizer_t opt = nullptr;
  FLAME_ASSERT_OK(flame_optimizer_create(ctx, &o, &raw, 1, &opt));
  HostOpt host{o, w.values(), {}, {}, {}};
  for (int step = 0; step < 20; ++step) {  // updates of ~1e-3 are below bf16's resolution near 1
    HT g = random(rng, {4096}, FLAME_DTYPE_BF16, -1, 1);
    set_grad(ctx, p, g);
    host.step(g.values());
    FLAME_ASSERT_OK(flame_optimizer_step(opt));
  }
  // The parameter is the master (updated in f32, matching the f64 host to f32 accuracy) rounded.
  HT got = download(p);
  std::vector<double> gv = got.values();
  int bad = 0;
  for (size_t i = 0; i < gv.size(); ++i) {
    double want = host.w[i];
    if (std::fabs(gv[i] - want) > std::fabs(want) * 0.0079 + 1e-4) ++bad;  // within one bf16 ulp (2^-7 relative)
  }
  EXPECT_EQ(bad, 0);
  flame_optimizer_release(opt);
}

TEST_F(Optim, StochasticRoundingIsUnbiased) {
  // 1 + 2^-9 lies a quarter of the way from bf16 1 to the next value 1 + 2^-7.
  const int64_t n = 1 << 20;
  T p = upload(ctx, HT({n}, FLAME_DTYPE_BF16, 1.0));
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(p, 1));
  flame_optimizer_options_t o;
  FLAME_ASSERT_OK(flame_optimizer_options_init(&o, FLAME_OPTIMIZER_SGD));
  o.lr = 1.0;
  o.master_weights = 1;
  o.stochastic_rounding = 1;
  flame_tensor_t raw = p;
  flame_optimizer_t opt = nullptr;
  FLAME_ASSERT_OK(flame_optimizer_create(ctx, &o, &raw, 1, &opt));
  set_grad(ctx, p, HT({n}, FLAME_DTYPE_BF16, -std::ldexp(1.0, -9)));
  FLAME_ASSERT_OK(flame_optimizer_step(opt));
  std::vector<double> v = download(p).values();
  int64_t up = 0, other = 0;
  for (double x : v) {
    if (x == 1.0078125) ++up;
    else if (x != 1.0) ++other;
  }
  EXPECT_EQ(other, 0);
  EXPECT_NEAR(static_cast<double>(up) / n, 0.25, 0.005);
  flame_optimizer_release(opt);
}

TEST_F(Optim, GroupsLearningRatesZeroGradAndSkippedParameters) {
  T a = upload(ctx, HT({3}, FLAME_DTYPE_F32, 1.0)), b = upload(ctx, HT({2}, FLAME_DTYPE_F32, 1.0));
  T c = upload(ctx, HT({2}, FLAME_DTYPE_F32, 5.0));
  for (flame_tensor_t t : {a.h, b.h, c.h}) FLAME_ASSERT_OK(flame_tensor_set_requires_grad(t, 1));
  flame_optimizer_options_t o;
  FLAME_ASSERT_OK(flame_optimizer_options_init(&o, FLAME_OPTIMIZER_SGD));
  o.lr = 0.5;
  flame_tensor_t g0[1] = {a}, g1[2] = {b, c};
  flame_optimizer_t opt = nullptr;
  FLAME_ASSERT_OK(flame_optimizer_create(ctx, &o, g0, 1, &opt));
  o.lr = 0.25;
  int32_t group = -7;
  FLAME_ASSERT_OK(flame_optimizer_add_param_group(opt, &o, g1, 2, &group));
  EXPECT_EQ(group, 1);
  set_grad(ctx, a, HT({3}, FLAME_DTYPE_F32, 1.0));
  set_grad(ctx, b, HT({2}, FLAME_DTYPE_F32, 1.0));  // c has no gradient: skipped
  FLAME_ASSERT_OK(flame_optimizer_step(opt));
  EXPECT_TRUE(matches(a, HT({3}, FLAME_DTYPE_F32, 0.5)));
  EXPECT_TRUE(matches(b, HT({2}, FLAME_DTYPE_F32, 0.75)));
  EXPECT_TRUE(matches(c, HT({2}, FLAME_DTYPE_F32, 5.0)));
  FLAME_ASSERT_OK(flame_optimizer_set_lr(opt, -1, 0.1));
  double lr = 0;
  FLAME_ASSERT_OK(flame_optimizer_get_lr(opt, 1, &lr));
  EXPECT_EQ(lr, 0.1);
  FLAME_ASSERT_OK(flame_optimizer_zero_grad(opt, 0));
  T ga;
  FLAME_ASSERT_OK(flame_tensor_grad(a, ga.out()));
  ASSERT_NE(ga.h, nullptr);
  EXPECT_TRUE(matches(ga, HT({3}, FLAME_DTYPE_F32, 0.0)));
  FLAME_ASSERT_OK(flame_optimizer_zero_grad(opt, 1));
  T gb;
  FLAME_ASSERT_OK(flame_tensor_grad(b, gb.out()));
  EXPECT_EQ(gb.h, nullptr);
  FLAME_ASSERT_OK(flame_optimizer_step(opt));  // no gradients: nothing moves
  EXPECT_TRUE(matches(a, HT({3}, FLAME_DTYPE_F32, 0.5)));
  FLAME_EXPECT_STATUS(flame_optimizer_set_lr(opt, 2, 0.1), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_optimizer_set_lr(opt, 0, -1.0), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_optimizer_get_lr(opt, -1, &lr), FLAME_ERROR_INVALID_ARGUMENT);
  flame_optimizer_release(opt);
  flame_optimizer_release(nullptr);
}

TEST_F(Optim, BadInputIsRejected) {
  T p = upload(ctx, HT({3}, FLAME_DTYPE_F32, 1.0)), pi = upload(ctx, HT({3}, FLAME_DTYPE_I32, 1.0)), q;
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(p, 1));
  FLAME_ASSERT_OK(flame_mul_scalar(p, 2.0, q.out()));  // not a leaf
  flame_optimizer_options_t o;
  FLAME_ASSERT_OK(flame_optimizer_options_init(&o, FLAME_OPTIMIZER_ADAMW));
  FLAME_EXPECT_STATUS(flame_optimizer_options_init(&o, 9), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_ASSERT_OK(flame_optimizer_options_init(&o, FLAME_OPTIMIZER_ADAMW));
  flame_optimizer_t opt = reinterpret_cast<flame_optimizer_t>(0x10);
  flame_tensor_t dup[2] = {p, p}, nonleaf[1] = {q}, ints[1] = {pi};
  FLAME_EXPECT_STATUS(flame_optimizer_create(ctx, &o, dup, 2, &opt), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(opt, nullptr);
  FLAME_EXPECT_STATUS(flame_optimizer_create(ctx, &o, nonleaf, 1, &opt), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_optimizer_create(ctx, &o, ints, 1, &opt), FLAME_ERROR_DTYPE_MISMATCH);
  FLAME_EXPECT_STATUS(flame_optimizer_create(ctx, &o, nullptr, 1, &opt), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_optimizer_create(ctx, nullptr, dup, 1, &opt), FLAME_ERROR_INVALID_ARGUMENT);
  flame_optimizer_options_t bad = o;
  bad.lr = -1;
  FLAME_EXPECT_STATUS(flame_optimizer_create(ctx, &bad, dup, 1, &opt), FLAME_ERROR_INVALID_ARGUMENT);
  bad = o;
  bad.beta2 = 1.0;
  FLAME_EXPECT_STATUS(flame_optimizer_create(ctx, &bad, dup, 1, &opt), FLAME_ERROR_INVALID_ARGUMENT);
  bad = o;
  bad.struct_size = 8;
  FLAME_EXPECT_STATUS(flame_optimizer_create(ctx, &bad, dup, 1, &opt), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_ASSERT_OK(flame_optimizer_create(ctx, &o, dup, 1, &opt));
  flame_optimizer_options_t sgd;
  FLAME_ASSERT_OK(flame_optimizer_options_init(&sgd, FLAME_OPTIMIZER_SGD));
  T r = upload(ctx, HT({2}, FLAME_DTYPE_F32, 1.0));
  flame_tensor_t other[1] = {r};
  FLAME_EXPECT_STATUS(flame_optimizer_add_param_group(opt, &sgd, other, 1, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_optimizer_add_param_group(opt, &o, dup, 1, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  set_grad(ctx, p, HT({3}, FLAME_DTYPE_F32, 1.0));
  FLAME_ASSERT_OK(flame_optimizer_step(opt));
  flame_optimizer_release(opt);
  FLAME_EXPECT_STATUS(flame_optimizer_step(nullptr), FLAME_ERROR_INVALID_ARGUMENT);
}

TEST_F(Optim, ClipGradNormAndValue) {
  HREF_RNG(rng);
  for (double norm_type : {2.0, 1.0, static_cast<double>(INFINITY)}) {
    SCOPED_TRACE(::testing::Message() << "norm " << norm_type);
    std::vector<T> ps;
    std::vector<flame_tensor_t> raw;
    std::vector<HT> gs;
    double acc = 0;
    for (const Shape& s : {Shape{33, 7}, Shape{1000}, Shape{5}}) {
      ps.push_back(upload(ctx, HT(s, FLAME_DTYPE_F32, 1.0)));
      FLAME_ASSERT_OK(flame_tensor_set_requires_grad(ps.back(), 1));
      raw.push_back(ps.back());
      gs.push_back(random(rng, s, FLAME_DTYPE_F32, -1, 1));
      set_grad(ctx, ps.back(), gs.back());
      for (double x : gs.back().values())
        acc = norm_type == 2 ? acc + x * x : norm_type == 1 ? acc + std::fabs(x) : std::max(acc, std::fabs(x));
    }
    const double total = norm_type == 2 ? std::sqrt(acc) : acc;
    const double max_norm = total / 4;
    T tn;
    FLAME_ASSERT_OK(flame_clip_grad_norm(ctx, raw.data(), 3, max_norm, norm_type, 1, tn.out()));
    EXPECT_NEAR(item(tn), total, total * 1e-5);
    const double coef = std::min(1.0, max_norm / (total + 1e-6));
    for (size_t k = 0; k < ps.size(); ++k) {
      T g;
      FLAME_ASSERT_OK(flame_tensor_grad(ps[k], g.out()));
      HT want(gs[k].shape, FLAME_DTYPE_F32);
      std::vector<double> v = gs[k].values();
      for (size_t i = 0; i < v.size(); ++i) (*want.data)[i] = round_to(v[i] * coef, FLAME_DTYPE_F32);
      EXPECT_TRUE(matches(g, want, Tol{1e-5, 1e-7}));
    }
  }
  // clip by value, and a non-finite norm with error_if_nonfinite changes nothing
  T p = upload(ctx, HT({4}, FLAME_DTYPE_F32, 1.0));
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(p, 1));
  set_grad(ctx, p, HT::from_values({4}, FLAME_DTYPE_F32, {-3, 0.5, 2, -0.25}));
  flame_tensor_t raw = p;
  FLAME_ASSERT_OK(flame_clip_grad_value(ctx, &raw, 1, 1.0));
  T g;
  FLAME_ASSERT_OK(flame_tensor_grad(p, g.out()));
  EXPECT_TRUE(matches(g, HT::from_values({4}, FLAME_DTYPE_F32, {-1, 0.5, 1, -0.25})));
  set_grad(ctx, p, HT::from_values({4}, FLAME_DTYPE_F32, {1, NAN, 2, 3}));
  FLAME_EXPECT_STATUS(flame_clip_grad_norm(ctx, &raw, 1, 1.0, 2.0, 1, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  T g2;
  FLAME_ASSERT_OK(flame_tensor_grad(p, g2.out()));
  std::vector<double> v = download(g2).values();
  EXPECT_EQ(v[0], 1.0);
  EXPECT_EQ(v[3], 3.0);
  FLAME_EXPECT_STATUS(flame_clip_grad_norm(ctx, &raw, 1, 1.0, 3.0, 0, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_clip_grad_value(ctx, &raw, 1, -1.0), FLAME_ERROR_INVALID_ARGUMENT);
}

}  // namespace

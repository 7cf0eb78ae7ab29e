// GPU tests of mse_loss and l1_loss (flame.h "Losses"; src/ops/loss_pointwise.cpp, fused for reduction
// mean and sum by cuda/loss_pointwise.cuh), against float64 host references computed from the values
// the device really holds:
//  - PointwiseLoss.EverySizeDtypePairAndReduction: forward and the gradients of input and/or target
//    (the target alone too) for f32, f16, bf16, f64 and mixed input/target dtypes (bf16 input with an
//    f32 target, as the MLP benchmark), sizes 1, 7, 1000 and 1000003 (not multiples of any vector
//    width), reductions none (the composition), mean and sum;
//  - non-contiguous operands (transposed and strided views), empty inputs, deterministic results, no
//    f32 copies of a bf16 input (peak memory), the fused backward against the one composed of ops
//    under create_graph;
//  - PointwiseLossGradCheck / PointwiseLossGradGradCheck: gradcheck.h rows (odd sizes, 0-d, views)
//    against finite differences, first order in every dtype and second order (create_graph) in f64.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gradcheck.h"

using namespace gc;

namespace {

constexpr int NONE = FLAME_REDUCTION_NONE, MEAN = FLAME_REDUCTION_MEAN, SUM = FLAME_REDUCTION_SUM;
constexpr flame_dtype_t F32 = FLAME_DTYPE_F32, F16 = FLAME_DTYPE_F16, BF16 = FLAME_DTYPE_BF16, F64 = FLAME_DTYPE_F64;

using LossFn = flame_status_t (*)(flame_tensor_t, flame_tensor_t, flame_reduction_t, flame_tensor_t*);
LossFn loss_fn(int kind) { return kind == 0 ? flame_mse_loss : flame_l1_loss; }
const char* kind_name(int kind) { return kind == 0 ? "mse" : "l1"; }

// f(d) and f'(d) of mse (kind 0) and l1 (kind 1); sign(0) = 0.
double f_of(int kind, double d) { return kind == 0 ? d * d : std::fabs(d); }
double df_of(int kind, double d) { return kind == 0 ? 2 * d : gc::sign(d); }

// FLAME's promotion of two floating dtypes (core/dtype.cpp).
flame_dtype_t promoted(flame_dtype_t a, flame_dtype_t b) {
  if (a == b) return a;
  if (a == F64 || b == F64) return F64;
  return F32;  // f32 with anything narrower, and f16 with bf16
}

// Absolute part of the tolerance, relative to the largest reference value: 16-bit gradients of a mean
// over many elements have subnormal f16 elements near d = 0.
double atol_frac_for(flame_dtype_t dt) { return dt == F16 || dt == BF16 ? 1e-2 : 1e-3; }

HT random_ht(const Shape& s, std::mt19937_64& rng, double lo, double hi) {
  HT h(s);
  std::uniform_real_distribution<double> u(lo, hi);
  for (double& e : h.v) e = u(rng);
  return h;
}

struct Config {
  int kind = 0, red = MEAN;
  flame_dtype_t ta = F32, tb = F32;
  Shape shape;
  bool need_input = true, need_target = false;
  bool nc_input = false, nc_target = false;
  bool create_graph = false;
  std::string str() const {
    return std::string(kind_name(kind)) + " red " + std::to_string(red) + " " + dtname(ta) + "/" + dtname(tb) + " " +
           shape_str(shape) + (nc_input ? " input-view" : "") + (nc_target ? " target-view" : "") +
           (need_input ? " grad-input" : "") + (need_target ? " grad-target" : "") + (create_graph ? " create_graph" : "");
  }
};

class PointwiseLoss : public GpuTest {
 protected:
  // Runs the loss and the gradients for config c; checks them against the host reference. *grads
  // (optional) receives the gradients (input first) as downloaded.
  void check(const Config& c, std::mt19937_64& rng, std::vector<HT>* grads = nullptr) {
    SCOPED_TRACE(c.str());
    const flame_dtype_t rt = promoted(c.ta, c.tb);
    const double lim = rt == F16 ? 0.05 : 2.0;  // an f16 sum of 10^6 terms stays below 65504
    HT a = random_ht(c.shape, rng, -lim, lim), b = random_ht(c.shape, rng, -lim, lim);
    T at, bt, loss;
    FLAME_ASSERT_OK(make_leaf(ctx, a, c.ta, c.nc_input, &at));
    FLAME_ASSERT_OK(download(at, &a));  // the values the device holds
    FLAME_ASSERT_OK(make_leaf(ctx, b, c.tb, c.nc_target, &bt));
    FLAME_ASSERT_OK(download(bt, &b));
    if (c.need_input) FLAME_ASSERT_OK(flame_tensor_set_requires_grad(at, 1));
    if (c.need_target) FLAME_ASSERT_OK(flame_tensor_set_requires_grad(bt, 1));
    FLAME_ASSERT_OK(loss_fn(c.kind)(at, bt, static_cast<flame_reduction_t>(c.red), loss.out()));
    EXPECT_EQ(dtype_of(loss), rt);

    const int64_t n = a.numel();
    HT want = c.red == NONE ? HT(c.shape) : HT(Shape{});
    double s = 0;
    for (int64_t i = 0; i < n; ++i) {
      double v = f_of(c.kind, a.v[i] - b.v[i]);
      if (c.red == NONE) want.v[i] = v;
      else s += v;
    }
    if (c.red != NONE) want.v[0] = c.red == SUM ? s : s / static_cast<double>(n);
    HT got;
    FLAME_ASSERT_OK(download(loss, &got));
    EXPECT_TRUE(close(got, want, rounded_rtol(rt), "loss", atol_frac_for(rt)));

    // Upstream gradient: random for none; for mean about n, so that the gradients are O(1) (f16: finite).
    HT gout = c.red == NONE ? random_ht(c.shape, rng, -1, 1)
                            : HT(Shape{}, c.red == SUM ? 0.75 : 0.75 * std::min<double>(static_cast<double>(n), rt == F16 ? 3e4 : 1e7));
    T gt;
    FLAME_ASSERT_OK(upload(ctx, gout, rt, gt.out()));
    FLAME_ASSERT_OK(download(gt, &gout));
    std::vector<flame_tensor_t> wrt;
    if (c.need_input) wrt.push_back(at);
    if (c.need_target) wrt.push_back(bt);
    std::vector<flame_tensor_t> res(wrt.size(), nullptr);
    flame_tensor_t o = loss.h, g = gt.h;
    FLAME_ASSERT_OK(flame_grad(ctx, &o, &g, 1, wrt.data(), static_cast<int32_t>(wrt.size()),
                               c.create_graph ? FLAME_BACKWARD_CREATE_GRAPH : 0, res.data()));
    std::vector<T> held;
    for (flame_tensor_t r : res) held.emplace_back(r);
    HT ra(c.shape), rb(c.shape);
    for (int64_t i = 0; i < n; ++i) {
      double coef = c.red == NONE ? gout.v[i] : (c.red == MEAN ? gout.v[0] / static_cast<double>(n) : gout.v[0]);
      ra.v[i] = df_of(c.kind, a.v[i] - b.v[i]) * coef;
      rb.v[i] = -ra.v[i];
    }
    size_t k = 0;
    for (int j = 0; j < 2; ++j) {
      if (!(j == 0 ? c.need_input : c.need_target)) continue;
      const flame_dtype_t dt = j == 0 ? c.ta : c.tb;
      ASSERT_NE(held[k].h, nullptr);
      EXPECT_EQ(dtype_of(held[k]), dt) << "gradient dtype of " << (j == 0 ? "input" : "target");
      HT gh;
      FLAME_ASSERT_OK(download(held[k], &gh));
      EXPECT_TRUE(close(gh, j == 0 ? ra : rb, rounded_rtol(dt), j == 0 ? "gradient of input" : "gradient of target",
                        atol_frac_for(dt)));
      if (grads) grads->push_back(gh);
      ++k;
    }
  }

  // A bf16 input that requires grad and an f32 target of shape s, uniform in [-3, 3), drawn from
  // seed() ^ salt (the MLP benchmark's pair of dtypes).
  void bf16_input_f32_target(const Shape& s, uint64_t salt, T& at, T& bt) {
    std::mt19937_64 rng(gc::seed() ^ salt);
    HT a = random_ht(s, rng, -3, 3), b = random_ht(s, rng, -3, 3);
    FLAME_ASSERT_OK(upload(ctx, a, BF16, at.out()));
    FLAME_ASSERT_OK(upload(ctx, b, F32, bt.out()));
    FLAME_ASSERT_OK(flame_tensor_set_requires_grad(at, 1));
  }
};

struct Pair {
  flame_dtype_t a, b;
};
const Pair kPairs[] = {{F32, F32},  {F16, F16}, {BF16, BF16}, {F64, F64}, {BF16, F32},
                       {F32, BF16}, {F16, F32}, {BF16, F16},  {F16, F64}, {F64, F32}};

TEST_F(PointwiseLoss, EverySizeDtypePairAndReduction) {
  std::mt19937_64 rng(gc::seed() ^ 101);
  const int64_t sizes[] = {1, 7, 1000, 1000003};
  int mode = 0;
  for (const Pair& p : kPairs)
    for (int64_t size : sizes)
      for (int kind : {0, 1})
        for (int red : {NONE, MEAN, SUM}) {
          if (red == NONE && size > 1000) continue;  // the composition: elementwise already
          Config c;
          c.kind = kind;
          c.red = red;
          c.ta = p.a;
          c.tb = p.b;
          c.shape = size == 1000 ? Shape{8, 125} : Shape{size};
          c.need_input = mode % 3 != 2;  // input only, both, target only
          c.need_target = mode % 3 != 0;
          ++mode;
          check(c, rng);
          if (HasFatalFailure()) return;
        }
}

TEST_F(PointwiseLoss, NonContiguousOperands) {
  std::mt19937_64 rng(gc::seed() ^ 103);
  for (const Pair& p : {Pair{BF16, F32}, Pair{F32, F32}, Pair{F64, F64}, Pair{F16, BF16}})
    for (int kind : {0, 1})
      for (int red : {MEAN, SUM, NONE})
        for (int views = 1; views < 4; ++views)  // input, target, both
          for (const Shape& s : {Shape{37, 29}, Shape{1001}}) {
            Config c;
            c.kind = kind;
            c.red = red;
            c.ta = p.a;
            c.tb = p.b;
            c.shape = s;  // 2-d: a transposed view; 1-d: a stride-2 slice
            c.nc_input = views & 1;
            c.nc_target = views & 2;
            c.need_target = views == 3;
            check(c, rng);
            if (HasFatalFailure()) return;
          }
}

// Empty inputs: none gives an empty loss, sum 0, mean NaN (as PyTorch); the gradients are empty.
TEST_F(PointwiseLoss, EmptyInputs) {
  for (int kind : {0, 1})
    for (const Shape& s : {Shape{0}, Shape{3, 0}}) {
      SCOPED_TRACE(std::string(kind_name(kind)) + " " + shape_str(s));
      T a, b;
      FLAME_ASSERT_OK(flame_zeros(ctx, s.data(), static_cast<int32_t>(s.size()), BF16, a.out()));
      FLAME_ASSERT_OK(flame_zeros(ctx, s.data(), static_cast<int32_t>(s.size()), F32, b.out()));
      FLAME_ASSERT_OK(flame_tensor_set_requires_grad(a, 1));
      FLAME_ASSERT_OK(flame_tensor_set_requires_grad(b, 1));
      T none, mean, sum;
      FLAME_ASSERT_OK(loss_fn(kind)(a, b, FLAME_REDUCTION_NONE, none.out()));
      FLAME_ASSERT_OK(loss_fn(kind)(a, b, FLAME_REDUCTION_MEAN, mean.out()));
      FLAME_ASSERT_OK(loss_fn(kind)(a, b, FLAME_REDUCTION_SUM, sum.out()));
      EXPECT_EQ(shape_of(none), s);
      double m = 0, v = 1;
      FLAME_ASSERT_OK(flame_tensor_item(mean, &m));
      FLAME_ASSERT_OK(flame_tensor_item(sum, &v));
      EXPECT_TRUE(std::isnan(m));
      EXPECT_EQ(v, 0.0);
      for (flame_tensor_t l : {mean.h, sum.h}) {
        flame_tensor_t wrt[2] = {a.h, b.h}, res[2] = {nullptr, nullptr};
        FLAME_ASSERT_OK(flame_grad(ctx, &l, nullptr, 1, wrt, 2, 0, res));
        T ga(res[0]), gb(res[1]);
        ASSERT_NE(ga.h, nullptr);
        ASSERT_NE(gb.h, nullptr);
        EXPECT_EQ(shape_of(ga), s);
        EXPECT_EQ(dtype_of(ga), BF16);
        EXPECT_EQ(dtype_of(gb), F32);
      }
    }
}

// A fixed reduction order: the same call gives the same bits.
TEST_F(PointwiseLoss, Deterministic) {
  const Shape s = {1024, 1031};
  T at, bt;
  ASSERT_NO_FATAL_FAILURE(bf16_input_f32_target(s, 107, at, bt));
  for (int kind : {0, 1}) {
    std::vector<uint16_t> bits[2];
    double vals[2];
    for (int k = 0; k < 2; ++k) {
      T loss;
      FLAME_ASSERT_OK(loss_fn(kind)(at, bt, FLAME_REDUCTION_MEAN, loss.out()));
      FLAME_ASSERT_OK(flame_tensor_item(loss, &vals[k]));
      flame_tensor_t o = loss.h, in = at.h, res = nullptr;
      FLAME_ASSERT_OK(flame_grad(ctx, &o, nullptr, 1, &in, 1, 0, &res));
      T r(res);
      bits[k].resize(static_cast<size_t>(HT::numel_of(s)));
      FLAME_ASSERT_OK(flame_to_host(r, bits[k].data(), bits[k].size() * 2));
    }
    EXPECT_EQ(vals[0], vals[1]) << kind_name(kind);
    EXPECT_TRUE(bits[0] == bits[1]) << kind_name(kind);
  }
}

// The forward reads a bf16 input and an f32 target as they are (no f32 copy of the input, no
// elementwise intermediate), and the backward writes the bf16 gradient directly (no f32 gradient).
TEST_F(PointwiseLoss, NoCopiesOfTheOperands) {
  const Shape s = {1024, 1024};
  const uint64_t input_bytes = 1024 * 1024 * 2;
  T at, bt;
  ASSERT_NO_FATAL_FAILURE(bf16_input_f32_target(s, 109, at, bt));
  for (int kind : {0, 1}) {
    SCOPED_TRACE(kind_name(kind));
    flame_memory_stats_t before{}, fwd{}, bwd{};
    before.struct_size = fwd.struct_size = bwd.struct_size = sizeof(flame_memory_stats_t);
    FLAME_ASSERT_OK(flame_ctx_reset_peak_memory(ctx));
    FLAME_ASSERT_OK(flame_ctx_memory_stats(ctx, &before));
    T loss;
    FLAME_ASSERT_OK(loss_fn(kind)(at, bt, FLAME_REDUCTION_MEAN, loss.out()));
    FLAME_ASSERT_OK(flame_ctx_memory_stats(ctx, &fwd));
    EXPECT_LT(fwd.peak_bytes_in_use - before.bytes_in_use, input_bytes / 8) << "forward workspace";
    FLAME_ASSERT_OK(flame_ctx_reset_peak_memory(ctx));
    FLAME_ASSERT_OK(flame_ctx_memory_stats(ctx, &before));
    flame_tensor_t o = loss.h, in = at.h, res = nullptr;
    FLAME_ASSERT_OK(flame_grad(ctx, &o, nullptr, 1, &in, 1, 0, &res));
    T r(res);
    FLAME_ASSERT_OK(flame_ctx_memory_stats(ctx, &bwd));
    EXPECT_EQ(dtype_of(r), BF16);
    // The bf16 gradient itself, and no f32 one (twice its size) on the way.
    EXPECT_LT(bwd.peak_bytes_in_use - before.bytes_in_use, input_bytes + input_bytes / 8) << "backward";
  }
}

// Under create_graph the rule composes the gradient of FLAME ops; it matches the fused kernel.
TEST_F(PointwiseLoss, FusedAndComposedBackwardAgree) {
  const Pair pairs[] = {{BF16, F32}, {F16, F16}, {F32, F64}, {F32, F32}};
  for (const Pair& p : pairs)
    for (int kind : {0, 1})
      for (int red : {MEAN, SUM}) {
        std::vector<HT> got[2];
        for (int graph = 0; graph < 2; ++graph) {
          std::mt19937_64 rng(gc::seed() ^ 113);  // the same inputs both times
          Config c;
          c.kind = kind;
          c.red = red;
          c.ta = p.a;
          c.tb = p.b;
          c.shape = {33, 65};
          c.need_target = true;
          c.create_graph = graph == 1;
          check(c, rng, &got[graph]);
          if (HasFatalFailure()) return;
        }
        ASSERT_EQ(got[0].size(), got[1].size());
        for (size_t j = 0; j < got[0].size(); ++j)
          EXPECT_TRUE(close(got[1][j], got[0][j], rounded_rtol(j == 0 ? p.a : p.b),
                            "composed vs fused gradient " + std::to_string(j), atol_frac_for(j == 0 ? p.a : p.b)))
              << kind_name(kind) << " " << dtname(p.a) << "/" << dtname(p.b) << " red " << red;
      }
}

// ------------------------------------------------------------------ gradient-check rows

Row pw_row(std::string name, int kind, int red, std::vector<Case> cases, bool low_precision) {
  Row r;
  r.name = std::move(name);
  r.covers = {kind == 0 ? "mse_loss" : "l1_loss"};
  r.cases = std::move(cases);
  r.fwd = [kind, red](const Tensors& in, flame_dtype_t, std::vector<T>& out) {
    out.emplace_back();
    return loss_fn(kind)(in[0], in[1], static_cast<flame_reduction_t>(red), out.back().out());
  };
  r.ref = [kind, red](const std::vector<HT>& x) {
    HT l = gc::binary(x[0], x[1], [kind](double a, double b) { return f_of(kind, a - b); });
    HT out(Shape{});
    for (double v : l.v) out.v[0] += v;
    if (red == MEAN) out.v[0] /= static_cast<double>(l.v.size());
    return std::vector<HT>{out};
  };
  r.low_precision = low_precision;
  return r;
}

const std::vector<Row>& rows() {
  static const std::vector<Row> table = [] {
    std::vector<Row> v;
    // l1: grids 0.25 and 0.75 keep |input - target| away from the kink at 0.
    const Domain ga = grid(0.25), gb = grid(0.75);
    v.push_back(pw_row("pw_mse_sum_odd", 0, SUM, {Case({in({7}), in({7})}), Case({in({3, 5}), nc({3, 5})})}, true));
    v.push_back(pw_row("pw_mse_mean_0d", 0, MEAN, {Case({in({}), in({})})}, false));
    v.push_back(pw_row("pw_mse_mean_views", 0, MEAN, {Case({nc({5, 3}), nc({5, 3})}), Case({nc({9}), in({9})})}, true));
    v.push_back(pw_row("pw_l1_mean_views", 1, MEAN, {Case({nc({5, 3}, ga), in({5, 3}, gb)}), Case({in({9}, ga), nc({9}, gb)})},
                       true));
    v.push_back(pw_row("pw_l1_sum_odd", 1, SUM, {Case({in({7}, ga), in({7}, gb)}), Case({in({}, ga), in({}, gb)})}, true));
    return v;
  }();
  return table;
}

FLAME_GRADCHECK_SUITES(PointwiseLosses, PointwiseLossGradCheck, PointwiseLossGradGradCheck, rows, 0x2545f4914f6cdd1dull);

}  // namespace

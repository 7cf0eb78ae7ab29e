// GPU tests of flame_dropout (flame.h "Dropout"; src/ops/dropout.cpp, cuda/dropout.cuh):
//  - DropoutGradCheck / DropoutGradGradCheck: with the generator's state pinned, the forward matches a
//    host float64 reference that runs Philox4x32-10 itself (so the documented mask is checked bit for
//    bit), gradients match finite differences (f64, f32, f16, bf16; contiguous and strided inputs),
//    and second order (create_graph) in f64;
//  - DropoutOps: determinism per (seed, offset) and the offset advance; keep-rate statistics on 2^20
//    elements; the backward applies the forward's mask (grad == w * out / x) even after other random
//    draws moved the generator, also under create_graph; the same mask for every dtype and layout;
//    identity (training 0, p 0), zeros (p 1); bad arguments.
// Reproduce a failure with FLAME_GRADCHECK_SEED=<seed printed in the failure>.
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "gradcheck.h"

using namespace gc;

namespace {

// ------------------------------------------------------------------ host Philox (cuda/random.cuh)

struct U4 {
  uint32_t w[4];
};

U4 philox(uint64_t seed, uint64_t counter) {
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  uint32_t x = static_cast<uint32_t>(counter), y = static_cast<uint32_t>(counter >> 32), z = 0, w = 0;
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = uint64_t{0xD2511F53u} * x, p1 = uint64_t{0xCD9E8D57u} * z;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    const uint32_t nx = hi1 ^ y ^ k0, ny = lo1, nz = hi0 ^ w ^ k1, nw = lo0;
    x = nx;
    y = ny;
    z = nz;
    w = nw;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return U4{{x, y, z, w}};
}

// flame.h: element e is kept when (word e % 4 of Philox(seed, offset + e / 4)) >> 8, over 2^24, >= p.
std::vector<bool> keep_mask(uint64_t seed, uint64_t offset, int64_t n, double p) {
  std::vector<bool> m(static_cast<size_t>(n));
  const float pf = static_cast<float>(p);
  for (int64_t e = 0; e < n; ++e) {
    const U4 r = philox(seed, offset + static_cast<uint64_t>(e / 4));
    const float u = static_cast<float>(r.w[e % 4] >> 8) * 5.9604644775390625e-8f;
    m[static_cast<size_t>(e)] = u >= pf;
  }
  return m;
}

HT dropout_ref(const HT& x, uint64_t seed, uint64_t offset, double p) {
  std::vector<bool> m = keep_mask(seed, offset, x.numel(), p);
  HT y = x;
  for (size_t i = 0; i < y.v.size(); ++i) y.v[i] = m[i] ? x.v[i] / (1.0 - p) : 0.0;
  return y;
}

// ------------------------------------------------------------------ the gradcheck table

constexpr uint64_t kSeed = 0x5eed5eedull, kOffset = 37;

Row dropout_row(std::string name, std::vector<Case> cases, double p) {
  Row r;
  r.name = std::move(name);
  r.covers = {"dropout"};
  r.cases = std::move(cases);
  r.fwd = [p](const Tensors& in, flame_dtype_t, std::vector<T>& out) {
    flame_ctx_t c = nullptr;
    flame_status_t st = flame_tensor_context(in[0], &c);
    if (st == FLAME_OK) st = flame_ctx_set_rng_state(c, kSeed, kOffset);  // the reference knows the mask
    if (st != FLAME_OK) return st;
    out.emplace_back();
    return flame_dropout(in[0], p, 1, out.back().out());
  };
  r.ref = [p](const std::vector<HT>& x) { return std::vector<HT>{dropout_ref(x[0], kSeed, kOffset, p)}; };
  r.low_precision = true;
  return r;
}

const std::vector<Row>& rows() {
  static const std::vector<Row> table = {
      dropout_row("dropout_p03", {Case({in({3, 5})}), Case({nc({4, 3})}), Case({nc({7})})}, 0.3),
      dropout_row("dropout_p075_3d", {Case({in({2, 3, 5})}), Case({nc({2, 5, 3})})}, 0.75),
  };
  return table;
}

const bool kCovered = gc::register_covers(rows());  // for the op-list coverage test

struct Param {
  size_t row;
  flame_dtype_t dt;
};

std::vector<Param> params() {
  std::vector<Param> p;
  for (size_t i = 0; i < rows().size(); ++i)
    for (flame_dtype_t dt : {FLAME_DTYPE_F64, FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_BF16}) p.push_back({i, dt});
  return p;
}

uint64_t case_seed(const std::string& name, int dt, size_t c) {
  uint64_t h = gc::seed() ^ 0xd1b54a32d192ed03ull;
  for (char ch : name) h = (h ^ static_cast<unsigned char>(ch)) * 0x100000001b3ull;
  return h ^ (static_cast<uint64_t>(dt) << 40) ^ (static_cast<uint64_t>(c) << 48);
}

class DropoutGradCheck : public GpuTest, public ::testing::WithParamInterface<Param> {};

TEST_P(DropoutGradCheck, MatchesHostPhiloxAndFiniteDifferences) {
  EXPECT_TRUE(kCovered);
  const Row& row = rows()[GetParam().row];
  const flame_dtype_t dt = GetParam().dt;
  for (size_t c = 0; c < row.cases.size(); ++c) {
    SCOPED_TRACE(row.name + " " + dtname(dt) + " case " + std::to_string(c) + " FLAME_GRADCHECK_SEED=" +
                 std::to_string(gc::seed()));
    std::mt19937_64 rng(case_seed(row.name, dt, c));
    check_case(ctx, row, row.cases[c], dt, rng);
    if (HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Dropout, DropoutGradCheck, ::testing::ValuesIn(params()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return rows()[info.param.row].name + "_" + flame_dtype_name(info.param.dt);
                         });

class DropoutGradGradCheck : public GpuTest, public ::testing::WithParamInterface<size_t> {};

TEST_P(DropoutGradGradCheck, CreateGraphMatchesHostFiniteDifferences) {
  const Row& row = rows()[GetParam()];
  for (size_t c = 0; c < row.cases.size(); ++c) {
    SCOPED_TRACE(row.name + " f64 second order, case " + std::to_string(c) + " FLAME_GRADCHECK_SEED=" +
                 std::to_string(gc::seed()));
    std::mt19937_64 rng(case_seed(row.name, 99, c));
    check_second_order(ctx, row, row.cases[c], rng);
    if (HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Dropout, DropoutGradGradCheck, ::testing::Range<size_t>(0, rows().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) { return rows()[info.param].name; });

// ------------------------------------------------------------------ direct tests

// Uniform values in +-[0.5, 2): never zero, so out / x recovers the mask times the scale.
HT nonzero_values(const Shape& s, std::mt19937_64& rng) {
  HT h(s);
  std::uniform_real_distribution<double> u(0.5, 2.0);
  for (double& e : h.v) e = u(rng) * (rng() & 1 ? 1 : -1);
  return h;
}

class DropoutOps : public GpuTest {
 protected:
  void rng_state(uint64_t* seed, uint64_t* offset) { ASSERT_EQ(flame_ctx_get_rng_state(ctx, seed, offset), FLAME_OK); }
};

TEST_F(DropoutOps, DeterministicPerSeedAndOffsetAndAdvancesTheOffset) {
  std::mt19937_64 rng(gc::seed() ^ 1);
  const int64_t n = 1001;  // not a multiple of 4
  HT x = nonzero_values({n}, rng);
  T xt, a, b, c, d;
  FLAME_ASSERT_OK(upload(ctx, x, FLAME_DTYPE_F32, xt.out()));
  FLAME_ASSERT_OK(flame_ctx_set_rng_state(ctx, 42, 1000));
  FLAME_ASSERT_OK(flame_dropout(xt, 0.4, 1, a.out()));
  uint64_t seed = 0, offset = 0;
  rng_state(&seed, &offset);
  EXPECT_EQ(seed, 42u);
  EXPECT_EQ(offset, 1000u + (n + 3) / 4) << "one counter per 4 elements";
  FLAME_ASSERT_OK(flame_dropout(xt, 0.4, 1, b.out()));  // the next counters: another mask
  FLAME_ASSERT_OK(flame_ctx_set_rng_state(ctx, 42, 1000));
  FLAME_ASSERT_OK(flame_dropout(xt, 0.4, 1, c.out()));  // replayed
  FLAME_ASSERT_OK(flame_ctx_set_rng_state(ctx, 43, 1000));
  FLAME_ASSERT_OK(flame_dropout(xt, 0.4, 1, d.out()));  // another seed
  HT ha, hb, hc, hd;
  FLAME_ASSERT_OK(download(a, &ha));
  FLAME_ASSERT_OK(download(b, &hb));
  FLAME_ASSERT_OK(download(c, &hc));
  FLAME_ASSERT_OK(download(d, &hd));
  EXPECT_EQ(ha.v, hc.v) << "same seed and offset: the same output, bit for bit";
  EXPECT_NE(ha.v, hb.v);
  EXPECT_NE(ha.v, hd.v);
  HT want = dropout_ref(x, 42, 1000, 0.4);
  for (size_t i = 0; i < want.v.size(); ++i) EXPECT_EQ(ha.v[i] == 0.0, want.v[i] == 0.0) << "mask element " << i;
}

TEST_F(DropoutOps, KeepRateStatistics) {
  const int64_t n = int64_t{1} << 20;
  const int64_t shape[1] = {n};
  for (double p : {0.1, 0.5, 0.9}) {
    SCOPED_TRACE("p = " + std::to_string(p));
    T ones, out, count;
    FLAME_ASSERT_OK(flame_ones(ctx, shape, 1, FLAME_DTYPE_F32, ones.out()));
    FLAME_ASSERT_OK(flame_dropout(ones, p, 1, out.out()));
    HT h;
    FLAME_ASSERT_OK(download(out, &h));
    const float scale = static_cast<float>(1.0 / (1.0 - p));
    int64_t kept = 0, bad = 0;
    for (double e : h.v) {
      if (e == 0.0) continue;
      ++kept;
      bad += e != static_cast<double>(1.0f * scale);
    }
    EXPECT_EQ(bad, 0) << "kept elements are x * 1 / (1 - p)";
    const double rate = static_cast<double>(kept) / static_cast<double>(n), sigma = std::sqrt(p * (1 - p) / static_cast<double>(n));
    EXPECT_NEAR(rate, 1.0 - p, 6 * sigma) << "keep rate " << rate;
    // Neighbouring elements are independent: pairs (e, e + 1) both kept at rate (1 - p)^2.
    int64_t both = 0;
    for (size_t i = 0; i + 1 < h.v.size(); i += 2) both += h.v[i] != 0.0 && h.v[i + 1] != 0.0;
    const double pairs = static_cast<double>(n / 2), q = (1 - p) * (1 - p);
    EXPECT_NEAR(static_cast<double>(both) / pairs, q, 6 * std::sqrt(q * (1 - q) / pairs));
  }
}

// grad_x of sum(dropout(x) * w) is w * mask * scale = w * out / x, and the backward regenerates the
// mask from the node even when other draws moved the generator in between.
TEST_F(DropoutOps, BackwardUsesTheForwardMask) {
  std::mt19937_64 rng(gc::seed() ^ 2);
  for (flame_dtype_t dt : {FLAME_DTYPE_F32, FLAME_DTYPE_F64, FLAME_DTYPE_F16, FLAME_DTYPE_BF16}) {
    SCOPED_TRACE(dtname(dt));
    HT x = nonzero_values({37, 29}, rng), w = nonzero_values({37, 29}, rng);
    T xt, wt, out, other;
    FLAME_ASSERT_OK(upload(ctx, x, dt, xt.out()));
    FLAME_ASSERT_OK(download(xt, &x));
    FLAME_ASSERT_OK(upload(ctx, w, dt, wt.out()));
    FLAME_ASSERT_OK(download(wt, &w));
    FLAME_ASSERT_OK(flame_tensor_set_requires_grad(xt, 1));
    FLAME_ASSERT_OK(flame_tensor_set_requires_grad(wt, 1));
    FLAME_ASSERT_OK(flame_dropout(xt, 0.35, 1, out.out()));
    const int64_t shape[2] = {37, 29};
    FLAME_ASSERT_OK(flame_rand(ctx, shape, 2, FLAME_DTYPE_F32, other.out()));  // moves the generator
    flame_tensor_t outs[] = {out.h}, gouts[] = {wt.h}, ins[] = {xt.h}, res[1] = {nullptr};
    FLAME_ASSERT_OK(flame_grad(ctx, outs, gouts, 1, ins, 1, FLAME_BACKWARD_CREATE_GRAPH | FLAME_BACKWARD_RETAIN_GRAPH, res));
    T g(res[0]);
    HT ho, hg;
    FLAME_ASSERT_OK(download(out, &ho));
    FLAME_ASSERT_OK(download(g, &hg));
    HT want(x.shape);
    int64_t kept = 0;
    for (size_t i = 0; i < x.v.size(); ++i) {
      want.v[i] = w.v[i] * ho.v[i] / x.v[i];
      kept += ho.v[i] != 0.0;
    }
    EXPECT_GT(kept, 0);
    EXPECT_LT(kept, x.numel());
    EXPECT_TRUE(close(hg, want, tol_for(dt), "grad == w * out / x"));
    // Second order: d/dw sum(grad * v) = v * out / x (the same mask once more).
    HT v = nonzero_values(x.shape, rng);
    T vt, prod, loss;
    FLAME_ASSERT_OK(upload(ctx, v, dt, vt.out()));
    FLAME_ASSERT_OK(download(vt, &v));
    FLAME_ASSERT_OK(flame_mul(g, vt, prod.out()));
    FLAME_ASSERT_OK(flame_sum_all(prod, loss.out()));
    flame_tensor_t l = loss.h, win[] = {wt.h}, res2[1] = {nullptr};
    FLAME_ASSERT_OK(flame_grad(ctx, &l, nullptr, 1, win, 1, 0, res2));
    T gw(res2[0]);
    HT hgw;
    FLAME_ASSERT_OK(download(gw, &hgw));
    for (size_t i = 0; i < x.v.size(); ++i) want.v[i] = v.v[i] * ho.v[i] / x.v[i];
    EXPECT_TRUE(close(hgw, want, tol_for(dt), "second order: v * out / x"));
  }
}

TEST_F(DropoutOps, SameMaskForEveryDtypeAndLayout) {
  std::mt19937_64 rng(gc::seed() ^ 3);
  HT x = nonzero_values({6, 9}, rng);
  std::vector<double> first;
  for (flame_dtype_t dt : {FLAME_DTYPE_F32, FLAME_DTYPE_F64, FLAME_DTYPE_F16, FLAME_DTYPE_BF16}) {
    for (bool transposed : {false, true}) {
      SCOPED_TRACE(dtname(dt) + (transposed ? " transposed" : ""));
      T base, xt, out;
      if (transposed) {  // the same logical [6, 9] values stored as a [9, 6] tensor
        FLAME_ASSERT_OK(upload(ctx, transpose(x, 0, 1), dt, base.out()));
        FLAME_ASSERT_OK(flame_transpose(base, 0, 1, xt.out()));
      } else {
        FLAME_ASSERT_OK(upload(ctx, x, dt, xt.out()));
      }
      FLAME_ASSERT_OK(flame_ctx_set_rng_state(ctx, 7, 3));
      FLAME_ASSERT_OK(flame_dropout(xt, 0.5, 1, out.out()));
      HT h;
      FLAME_ASSERT_OK(download(out, &h));
      std::vector<double> zero(h.v.size());
      for (size_t i = 0; i < h.v.size(); ++i) zero[i] = h.v[i] == 0.0;
      if (first.empty()) first = zero;
      EXPECT_EQ(zero, first) << "the mask depends on (seed, offset, element) only";
    }
  }
}

TEST_F(DropoutOps, IdentityWhenNotTrainingOrPZeroAndZerosForPOne) {
  HT x(Shape{2, 3});
  x.v = {1, -2, 3, INFINITY, 5, -6};
  T xt, a, b, c;
  FLAME_ASSERT_OK(upload(ctx, x, FLAME_DTYPE_F32, xt.out()));
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(xt, 1));
  uint64_t s0 = 0, o0 = 0, s1 = 0, o1 = 0;
  rng_state(&s0, &o0);
  FLAME_ASSERT_OK(flame_dropout(xt, 0.5, 0, a.out()));
  FLAME_ASSERT_OK(flame_dropout(xt, 0.0, 1, b.out()));
  rng_state(&s1, &o1);
  EXPECT_EQ(o1, o0) << "no counters reserved";
  EXPECT_EQ(a.h, xt.h) << "training 0: the input itself";
  EXPECT_EQ(b.h, xt.h) << "p 0: the input itself";
  FLAME_ASSERT_OK(flame_dropout(xt, 1.0, 1, c.out()));
  HT h;
  FLAME_ASSERT_OK(download(c, &h));
  EXPECT_EQ(h.v[0], 0.0);
  EXPECT_EQ(h.v[5], 0.0);
  EXPECT_TRUE(std::isnan(h.v[3])) << "inf * 0, as PyTorch";
  T loss, g;
  FLAME_ASSERT_OK(flame_sum_all(c, loss.out()));
  FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
  FLAME_ASSERT_OK(flame_tensor_grad(xt, g.out()));
  HT hg;
  FLAME_ASSERT_OK(download(g, &hg));
  EXPECT_TRUE(close(hg, HT(Shape{2, 3}, 0.0), 0, "p 1: zero gradient"));
}

TEST_F(DropoutOps, BadArgumentsGiveTheDocumentedStatusAndNoOutput) {
  const int64_t s[2] = {2, 3};
  T x, xi;
  FLAME_ASSERT_OK(flame_ones(ctx, s, 2, FLAME_DTYPE_F32, x.out()));
  FLAME_ASSERT_OK(flame_ones(ctx, s, 2, FLAME_DTYPE_I32, xi.out()));
  uint64_t s0 = 0, o0 = 0, s1 = 0, o1 = 0;
  rng_state(&s0, &o0);
  struct Bad {
    const char* what;
    flame_status_t want;
    std::function<flame_status_t(flame_tensor_t*)> call;
  };
  const std::vector<Bad> bad = {
      {"NULL t", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_dropout(nullptr, 0.5, 1, o); }},
      {"p negative", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_dropout(x, -0.1, 1, o); }},
      {"p above 1", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_dropout(x, 1.5, 1, o); }},
      {"p NaN", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_dropout(x, NAN, 0, o); }},
      {"integer t", FLAME_ERROR_DTYPE_MISMATCH, [&](flame_tensor_t* o) { return flame_dropout(xi, 0.5, 1, o); }},
  };
  for (const Bad& b : bad) {
    flame_tensor_t out = reinterpret_cast<flame_tensor_t>(static_cast<uintptr_t>(0x10));
    flame_status_t st = b.call(&out);
    EXPECT_EQ(st, b.want) << b.what << ": " << flame_status_string(st) << " " << flame_last_error_message();
    EXPECT_EQ(out, nullptr) << b.what;
    if (st == FLAME_OK && out) flame_tensor_release(out);
  }
  FLAME_EXPECT_STATUS(flame_dropout(x, 0.5, 1, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  rng_state(&s1, &o1);
  EXPECT_EQ(o1, o0) << "failed calls reserve no counters";
}

}  // namespace

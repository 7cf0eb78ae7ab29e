// GPU tests of flame_rope and flame_timestep_embedding (flame.h "Positional embeddings";
// src/ops/rope.cpp, cuda/rope.cuh):
//  - RopeGradCheck / RopeGradGradCheck: half-split and interleaved layouts, [B, H, T, D] and
//    [B, T, H, D] inputs, partial rotary_dim, a strided feature dim, i32/i64 position ids ([T] and
//    [B, T]), position offsets and bases: forward against a float64 host implementation, gradients
//    against finite differences (f64, f32; f16/bf16 for a subset), second order in f64;
//  - RopeOps: long positions (offsets of thousands) stay accurate in f32; the backward is the inverse
//    rotation (grad of |rope(x)|^2 / 2 is x); ids equal to offset + t match the offset; bad arguments;
//  - TimestepEmbedding: diffusers' get_timestep_embedding (flip, shift, scale, odd dims, integer and
//    floating timesteps), its gradient in floating timesteps, bad arguments.
// Reproduce a failure with FLAME_GRADCHECK_SEED=<seed printed in the failure>.
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "gradcheck.h"

using namespace gc;

namespace {

// ------------------------------------------------------------------ host references

struct Rope {
  double theta = 10000;
  int64_t rd = 0, offset = 0;
  bool interleaved = false;
  int seq_dim = -2;
};

// x of any rank; pos: null, [T] or [B, T] values.
HT rope_ref(const HT& x, const HT* pos, const Rope& o, bool inverse = false) {
  const int nd = x.ndim(), sd = o.seq_dim < 0 ? o.seq_dim + nd : o.seq_dim;
  const int64_t D = x.shape.back(), rd = o.rd ? o.rd : D, half = rd / 2;
  HT y = x;
  const Shape lead(x.shape.begin(), x.shape.end() - 1);
  for_each_index(lead, [&](const std::vector<int64_t>& c, int64_t row) {
    const int64_t t = c[static_cast<size_t>(sd)], b = c[0];
    double p = static_cast<double>(o.offset + t);
    if (pos) p = pos->ndim() == 1 ? pos->v[static_cast<size_t>(t)] : pos->v[static_cast<size_t>(b * pos->shape[1] + t)];
    const double* xr = x.v.data() + row * D;
    double* yr = y.v.data() + row * D;
    for (int64_t i = 0; i < half; ++i) {
      const double ang = p * std::pow(o.theta, -2.0 * static_cast<double>(i) / static_cast<double>(rd));
      const double cs = std::cos(ang), sn = (inverse ? -1 : 1) * std::sin(ang);
      const int64_t i0 = o.interleaved ? 2 * i : i, i1 = o.interleaved ? 2 * i + 1 : i + half;
      yr[i0] = xr[i0] * cs - xr[i1] * sn;
      yr[i1] = xr[i1] * cs + xr[i0] * sn;
    }
  });
  return y;
}

flame_rope_options_t rope_opts(const Rope& o) {
  flame_rope_options_t f;
  flame_rope_options_init(&f);
  f.theta = o.theta;
  f.rotary_dim = o.rd;
  f.position_offset = o.offset;
  f.interleaved = o.interleaved ? 1 : 0;
  f.seq_dim = o.seq_dim;
  return f;
}

// diffusers' get_timestep_embedding in float64.
HT timestep_ref(const HT& t, int64_t dim, double max_period, bool flip, double shift, double scale) {
  const int64_t N = t.numel(), half = dim / 2;
  HT out(Shape{N, dim});
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < half; ++i) {
      const double f = std::exp(-std::log(max_period) * static_cast<double>(i) / (static_cast<double>(half) - shift));
      const double a = scale * t.v[static_cast<size_t>(n)] * f;
      out.v[static_cast<size_t>(n * dim + (flip ? half : 0) + i)] = std::sin(a);
      out.v[static_cast<size_t>(n * dim + (flip ? 0 : half) + i)] = std::cos(a);
    }
  return out;
}

// ------------------------------------------------------------------ the gradcheck table

// pos_kind: 0 none, 1 [T] ids (input 1), 2 [B, T] ids (input 1); idt: the ids' dtype.
Row rope_row(std::string name, In x, Rope o, int pos_kind = 0, flame_dtype_t idt = FLAME_DTYPE_I64) {
  Row r;
  r.name = std::move(name);
  r.covers = {"rope"};
  std::vector<In> ins = {x};
  if (pos_kind) {
    const int nd = static_cast<int>(x.shape.size());
    const int64_t T = x.shape[static_cast<size_t>(o.seq_dim < 0 ? o.seq_dim + nd : o.seq_dim)];
    In p = in(pos_kind == 1 ? Shape{T} : Shape{x.shape[0], T}, uni(0, 40));
    p.grad = false;
    ins.push_back(p);
  }
  r.cases = {Case(ins, pos_kind ? std::function<void(std::vector<HT>&)>([](std::vector<HT>& xs) {
                                    for (double& e : xs[1].v) e = std::floor(e);
                                  })
                                : nullptr)};
  r.fwd = [o, pos_kind, idt](const Tensors& in, flame_dtype_t, std::vector<T>& out) {
    T ids;
    if (pos_kind) {
      flame_status_t st = flame_to_dtype(in[1], idt, ids.out());
      if (st != FLAME_OK) return st;
    }
    const flame_rope_options_t f = rope_opts(o);
    out.emplace_back();
    return flame_rope(in[0], pos_kind ? ids.h : nullptr, &f, out.back().out());
  };
  r.ref = [o, pos_kind](const std::vector<HT>& x) { return std::vector<HT>{rope_ref(x[0], pos_kind ? &x[1] : nullptr, o)}; };
  return r;
}

Rope ropt(bool interleaved, int seq_dim, int64_t rd = 0, int64_t offset = 0, double theta = 10000) {
  Rope o;
  o.interleaved = interleaved;
  o.seq_dim = seq_dim;
  o.rd = rd;
  o.offset = offset;
  o.theta = theta;
  return o;
}

const std::vector<Row>& rows() {
  static const std::vector<Row> table = [] {
    std::vector<Row> v;
    auto last = [&v]() -> Row& { return v.back(); };
    v.push_back(rope_row("rope_half_split_bhtd", in({2, 3, 5, 8}), ropt(false, -2)));
    last().low_precision = true;
    v.push_back(rope_row("rope_interleaved_bthd", in({2, 5, 3, 8}), ropt(true, 1)));
    last().low_precision = true;
    v.push_back(rope_row("rope_partial_strided_features", nc({2, 4, 6, 10}), ropt(false, -2, 6)));
    v.push_back(rope_row("rope_interleaved_partial", in({1, 2, 4, 12}), ropt(true, 2, 8, 3)));
    v.push_back(rope_row("rope_ids_i32_batched", in({2, 3, 4, 6}), ropt(true, -2), 2, FLAME_DTYPE_I32));
    v.push_back(rope_row("rope_ids_i64_flat_bthd", in({2, 4, 3, 6}), ropt(false, -3), 1, FLAME_DTYPE_I64));
    last().low_precision = true;
    v.push_back(rope_row("rope_offset_theta", in({1, 2, 3, 4}), ropt(false, -2, 0, 100, 500)));
    v.push_back(rope_row("rope_2d", in({5, 6}), ropt(true, 0)));
    return v;
  }();
  return table;
}

FLAME_GRADCHECK_SUITES(Rope, RopeGradCheck, RopeGradGradCheck, rows, 0x2127599bf4325c37ull);

// ------------------------------------------------------------------ direct tests

HT random_ht(const Shape& s, std::mt19937_64& rng, double lo = -2, double hi = 2) {
  HT h(s);
  std::uniform_real_distribution<double> u(lo, hi);
  for (double& e : h.v) e = u(rng);
  return h;
}

class RopeOps : public GpuTest {};

// Positions in the thousands: the angle is formed in f64, so f32 results stay at f32 rounding.
TEST_F(RopeOps, LongPositionsStayAccurateInF32) {
  std::mt19937_64 rng(gc::seed() ^ 51);
  for (bool interleaved : {false, true}) {
    SCOPED_TRACE(interleaved ? "interleaved" : "half-split");
    const HT x = random_ht({2, 4, 64, 64}, rng);
    const Rope o = ropt(interleaved, -2, 0, 4000);
    T xt, y;
    FLAME_ASSERT_OK(upload(ctx, x, FLAME_DTYPE_F32, xt.out()));
    HT xr;
    FLAME_ASSERT_OK(download(xt, &xr));
    const flame_rope_options_t f = rope_opts(o);
    FLAME_ASSERT_OK(flame_rope(xt, nullptr, &f, y.out()));
    HT got;
    FLAME_ASSERT_OK(download(y, &got));
    EXPECT_TRUE(close(got, rope_ref(xr, nullptr, o), 1e-5, "f32 at positions 4000..4063"));
  }
}

// The rotation is orthogonal: the gradient of |rope(x)|^2 / 2 is R^T R x = x (the backward rotates back).
TEST_F(RopeOps, BackwardIsTheInverseRotation) {
  std::mt19937_64 rng(gc::seed() ^ 53);
  for (flame_dtype_t dt : {FLAME_DTYPE_F32, FLAME_DTYPE_BF16}) {
    SCOPED_TRACE(dtname(dt));
    const HT x = random_ht({2, 3, 16, 8}, rng);
    T xt, y, sq, loss, g;
    FLAME_ASSERT_OK(upload(ctx, x, dt, xt.out()));
    HT xr;
    FLAME_ASSERT_OK(download(xt, &xr));
    FLAME_ASSERT_OK(flame_tensor_set_requires_grad(xt, 1));
    const flame_rope_options_t f = rope_opts(ropt(true, -2, 6, 7));
    FLAME_ASSERT_OK(flame_rope(xt, nullptr, &f, y.out()));
    FLAME_ASSERT_OK(flame_square(y, sq.out()));
    FLAME_ASSERT_OK(flame_sum_all(sq, loss.out()));
    FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
    FLAME_ASSERT_OK(flame_tensor_grad(xt, g.out()));
    HT hg;
    FLAME_ASSERT_OK(download(g, &hg));
    HT want = xr;
    for (double& e : want.v) e *= 2;
    EXPECT_TRUE(close(hg, want, dt == FLAME_DTYPE_BF16 ? 3e-2 : 1e-5, "grad of |rope(x)|^2 is 2x"));
  }
}

TEST_F(RopeOps, IdsEqualToOffsetPlusTMatchTheOffset) {
  std::mt19937_64 rng(gc::seed() ^ 55);
  const HT x = random_ht({2, 6, 2, 8}, rng);  // [B, T, H, D]
  HT ids(Shape{6});
  for (int64_t t = 0; t < 6; ++t) ids.v[static_cast<size_t>(t)] = static_cast<double>(123 + t);
  T xt, it, a, b;
  FLAME_ASSERT_OK(upload(ctx, x, FLAME_DTYPE_F32, xt.out()));
  FLAME_ASSERT_OK(upload(ctx, ids, FLAME_DTYPE_I32, it.out()));
  const flame_rope_options_t with_offset = rope_opts(ropt(false, -3, 0, 123)), plain = rope_opts(ropt(false, -3));
  FLAME_ASSERT_OK(flame_rope(xt, nullptr, &with_offset, a.out()));
  FLAME_ASSERT_OK(flame_rope(xt, it, &plain, b.out()));
  HT ha, hb;
  FLAME_ASSERT_OK(download(a, &ha));
  FLAME_ASSERT_OK(download(b, &hb));
  EXPECT_EQ(ha.v, hb.v);
}

TEST_F(RopeOps, OptionsInitDefaults) {
  flame_rope_options_t o;
  std::memset(&o, 0x5a, sizeof o);
  FLAME_ASSERT_OK(flame_rope_options_init(&o));
  EXPECT_EQ(o.struct_size, sizeof o);
  EXPECT_EQ(o.theta, 10000.0);
  EXPECT_EQ(o.rotary_dim, 0);
  EXPECT_EQ(o.position_offset, 0);
  EXPECT_EQ(o.interleaved, 0);
  EXPECT_EQ(o.seq_dim, -2);
}

TEST_F(RopeOps, BadArgumentsGiveTheDocumentedStatusAndNoOutput) {
  const int64_t s4[4] = {2, 3, 4, 6}, s4odd[4] = {2, 3, 4, 5}, s1[1] = {6}, ps[1] = {4}, ps_bad[1] = {5}, pb[2] = {2, 4};
  T x, xodd, x1, xi, ids, ids_bad, idsf, idsb;
  FLAME_ASSERT_OK(flame_ones(ctx, s4, 4, FLAME_DTYPE_F32, x.out()));
  FLAME_ASSERT_OK(flame_ones(ctx, s4odd, 4, FLAME_DTYPE_F32, xodd.out()));
  FLAME_ASSERT_OK(flame_ones(ctx, s1, 1, FLAME_DTYPE_F32, x1.out()));
  FLAME_ASSERT_OK(flame_ones(ctx, s4, 4, FLAME_DTYPE_I32, xi.out()));
  FLAME_ASSERT_OK(flame_zeros(ctx, ps, 1, FLAME_DTYPE_I64, ids.out()));
  FLAME_ASSERT_OK(flame_zeros(ctx, ps_bad, 1, FLAME_DTYPE_I64, ids_bad.out()));
  FLAME_ASSERT_OK(flame_zeros(ctx, ps, 1, FLAME_DTYPE_F32, idsf.out()));
  FLAME_ASSERT_OK(flame_zeros(ctx, pb, 2, FLAME_DTYPE_I64, idsb.out()));
  auto with = [](std::function<void(flame_rope_options_t&)> f) {
    flame_rope_options_t o;
    flame_rope_options_init(&o);
    f(o);
    return o;
  };
  const flame_rope_options_t good = with([](flame_rope_options_t&) {});
  const flame_rope_options_t small = with([](flame_rope_options_t& o) { o.struct_size = 8; });
  const flame_rope_options_t theta0 = with([](flame_rope_options_t& o) { o.theta = 0; });
  const flame_rope_options_t theta_nan = with([](flame_rope_options_t& o) { o.theta = NAN; });
  const flame_rope_options_t rd_odd = with([](flame_rope_options_t& o) { o.rotary_dim = 3; });
  const flame_rope_options_t rd_big = with([](flame_rope_options_t& o) { o.rotary_dim = 8; });
  const flame_rope_options_t seq_last = with([](flame_rope_options_t& o) { o.seq_dim = -1; });
  const flame_rope_options_t seq_far = with([](flame_rope_options_t& o) { o.seq_dim = 4; });
  const flame_rope_options_t seq0 = with([](flame_rope_options_t& o) { o.seq_dim = 0; });
  const flame_rope_options_t inter2 = with([](flame_rope_options_t& o) { o.interleaved = 2; });
  struct Bad {
    const char* what;
    flame_status_t want;
    std::function<flame_status_t(flame_tensor_t*)> call;
  };
  const std::vector<Bad> bad = {
      {"NULL x", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_rope(nullptr, nullptr, &good, o); }},
      {"NULL opts", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_rope(x, nullptr, nullptr, o); }},
      {"struct_size", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_rope(x, nullptr, &small, o); }},
      {"theta 0", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_rope(x, nullptr, &theta0, o); }},
      {"theta NaN", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_rope(x, nullptr, &theta_nan, o); }},
      {"rotary_dim odd", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_rope(x, nullptr, &rd_odd, o); }},
      {"rotary_dim above D", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_rope(x, nullptr, &rd_big, o); }},
      {"odd D", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_rope(xodd, nullptr, &good, o); }},
      {"seq_dim last", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_rope(x, nullptr, &seq_last, o); }},
      {"seq_dim out of range", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_rope(x, nullptr, &seq_far, o); }},
      {"interleaved 2", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_rope(x, nullptr, &inter2, o); }},
      {"1-D x", FLAME_ERROR_SHAPE_MISMATCH, [&](flame_tensor_t* o) { return flame_rope(x1, nullptr, &good, o); }},
      {"integer x", FLAME_ERROR_DTYPE_MISMATCH, [&](flame_tensor_t* o) { return flame_rope(xi, nullptr, &good, o); }},
      {"float ids", FLAME_ERROR_DTYPE_MISMATCH, [&](flame_tensor_t* o) { return flame_rope(x, idsf, &good, o); }},
      {"ids length", FLAME_ERROR_SHAPE_MISMATCH, [&](flame_tensor_t* o) { return flame_rope(x, ids_bad, &good, o); }},
      {"[B, T] ids with seq_dim 0", FLAME_ERROR_SHAPE_MISMATCH, [&](flame_tensor_t* o) { return flame_rope(x, idsb, &seq0, o); }},
  };
  for (const Bad& b : bad) {
    flame_tensor_t out = reinterpret_cast<flame_tensor_t>(static_cast<uintptr_t>(0x10));
    flame_status_t st = b.call(&out);
    EXPECT_EQ(st, b.want) << b.what << ": " << flame_status_string(st) << " " << flame_last_error_message();
    EXPECT_EQ(out, nullptr) << b.what;
    if (st == FLAME_OK && out) flame_tensor_release(out);
  }
  T ok;
  FLAME_ASSERT_OK(flame_rope(x, ids, &good, ok.out()));
  FLAME_ASSERT_OK(flame_rope(x, idsb, &good, ok.out()));
  FLAME_EXPECT_STATUS(flame_rope(x, nullptr, &good, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_rope_options_init(nullptr), FLAME_ERROR_INVALID_ARGUMENT);
}

// ------------------------------------------------------------------ timestep embeddings

class TimestepEmbedding : public GpuTest {};

TEST_F(TimestepEmbedding, MatchesDiffusers) {
  HT t(Shape{5});
  t.v = {0, 1, 17, 500, 999};
  struct Form {
    int64_t dim;
    double max_period, shift, scale;
    bool flip;
  };
  for (const Form& f : {Form{320, 10000, 1, 1, true}, Form{256, 10000, 0, 1, false}, Form{7, 100, 1, 2, false},
                        Form{1, 10000, 1, 1, true}}) {
    SCOPED_TRACE("dim " + std::to_string(f.dim) + " flip " + std::to_string(f.flip) + " shift " + std::to_string(f.shift));
    for (flame_dtype_t dt : {FLAME_DTYPE_I64, FLAME_DTYPE_F32, FLAME_DTYPE_BF16}) {
      T tt, out;
      FLAME_ASSERT_OK(upload(ctx, t, dt, tt.out()));
      HT held;  // the timesteps as stored (bf16 rounds 999 to 1000)
      FLAME_ASSERT_OK(download(tt, &held));
      FLAME_ASSERT_OK(flame_timestep_embedding(tt, f.dim, f.max_period, f.flip ? 1 : 0, f.shift, f.scale, out.out()));
      EXPECT_EQ(dtype_of(out), FLAME_DTYPE_F32);
      HT got;
      FLAME_ASSERT_OK(download(out, &got));
      const HT want = timestep_ref(held, f.dim, f.max_period, f.flip, f.shift, f.scale);
      ASSERT_EQ(got.shape, want.shape);
      double worst = 0;
      for (size_t i = 0; i < got.v.size(); ++i) worst = std::max(worst, std::fabs(got.v[i] - want.v[i]));
      // f32 angles of up to ~2000 carry an absolute rounding of ~1e-4, as in diffusers.
      EXPECT_LT(worst, 3e-4) << "largest difference from the float64 formula";
    }
  }
}

TEST_F(TimestepEmbedding, GradientInFloatingTimesteps) {
  HT t(Shape{3});
  t.v = {0.5, 3.25, 11.0};
  const int64_t dim = 16, half = 8;
  T tt, out, loss, g;
  FLAME_ASSERT_OK(upload(ctx, t, FLAME_DTYPE_F32, tt.out()));
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(tt, 1));
  FLAME_ASSERT_OK(flame_timestep_embedding(tt, dim, 10000, 0, 1, 1, out.out()));
  FLAME_ASSERT_OK(flame_sum_all(out, loss.out()));
  FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
  FLAME_ASSERT_OK(flame_tensor_grad(tt, g.out()));
  HT hg, want(Shape{3});
  FLAME_ASSERT_OK(download(g, &hg));
  for (int64_t n = 0; n < 3; ++n)
    for (int64_t i = 0; i < half; ++i) {  // d/dt (sin(t f) + cos(t f)) = f (cos - sin)
      const double f = std::exp(-std::log(10000.0) * static_cast<double>(i) / (half - 1.0)), a = t.v[n] * f;
      want.v[n] += f * (std::cos(a) - std::sin(a));
    }
  EXPECT_TRUE(close(hg, want, 1e-4, "d embedding / d t"));
}

TEST_F(TimestepEmbedding, BadArgumentsGiveTheDocumentedStatusAndNoOutput) {
  const int64_t s1[1] = {4}, s2[2] = {2, 2};
  T t, t2, tb;
  FLAME_ASSERT_OK(flame_ones(ctx, s1, 1, FLAME_DTYPE_I64, t.out()));
  FLAME_ASSERT_OK(flame_ones(ctx, s2, 2, FLAME_DTYPE_F32, t2.out()));
  FLAME_ASSERT_OK(flame_ones(ctx, s1, 1, FLAME_DTYPE_BOOL, tb.out()));
  struct Bad {
    const char* what;
    flame_status_t want;
    std::function<flame_status_t(flame_tensor_t*)> call;
  };
  const std::vector<Bad> bad = {
      {"NULL", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_timestep_embedding(nullptr, 8, 1e4, 0, 1, 1, o); }},
      {"2-D", FLAME_ERROR_SHAPE_MISMATCH, [&](flame_tensor_t* o) { return flame_timestep_embedding(t2, 8, 1e4, 0, 1, 1, o); }},
      {"bool", FLAME_ERROR_DTYPE_MISMATCH, [&](flame_tensor_t* o) { return flame_timestep_embedding(tb, 8, 1e4, 0, 1, 1, o); }},
      {"dim 0", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_timestep_embedding(t, 0, 1e4, 0, 1, 1, o); }},
      {"max_period 0", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_timestep_embedding(t, 8, 0, 0, 1, 1, o); }},
      {"max_period NaN", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_timestep_embedding(t, 8, NAN, 0, 1, 1, o); }},
      {"flip 2", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_timestep_embedding(t, 8, 1e4, 2, 1, 1, o); }},
      {"shift inf", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_timestep_embedding(t, 8, 1e4, 0, INFINITY, 1, o); }},
  };
  for (const Bad& b : bad) {
    flame_tensor_t out = reinterpret_cast<flame_tensor_t>(static_cast<uintptr_t>(0x10));
    flame_status_t st = b.call(&out);
    EXPECT_EQ(st, b.want) << b.what << ": " << flame_status_string(st) << " " << flame_last_error_message();
    EXPECT_EQ(out, nullptr) << b.what;
    if (st == FLAME_OK && out) flame_tensor_release(out);
  }
}

}  // namespace

// flame_scaled_dot_product_attention through the C ABI, against the float64 host reference of
// attention_ref.h computed from the values the device holds (rounded inputs):
//  - forward and the gradients of q, k, v (and of an additive mask) for f16 and bf16 (the fused
//    kernels) and f32 / f64 (the composed path), head dims 64, 80, 96, 128 and 40 (plus 8, 33 and 160),
//    with causal masks (Lq below and above Lk), bool and additive masks of broadcast shapes, a
//    custom scale, cross-attention, strided q / k / v viewed from packed projections (aligned and
//    not), Dv != D, rows whose keys are all masked, Lk = 0;
//  - dropout: reproducible for a seed, different across seeds, the documented RNG advance, a keep
//    fraction within a statistical bound, the same mask in forward and backward (V = identity
//    reveals it; gradients match a reference built from it) and across dtypes, p = 0 = no dropout;
//  - the composed backward under create_graph (second order);
//  - a 16384-token sequence whose extra memory stays O(S);
//  - bad arguments: documented status, NULL result, the RNG untouched;
//  - FLAME's own kernels on compute capability 9.0: the TMA forward and backward (cases tma_*) over
//    several key and query tiles, and their route for inputs no tensor map describes (a dense copy
//    first): q, k, v broadcast over the heads (broadcast_heads_copied_*) and an upstream gradient
//    broadcast over the heads (dout_broadcast_heads_copied).
// Reproduce a failure with FLAME_GRADCHECK_SEED=<seed printed in the failure>.
#include <cmath>
#include <cstring>
#include <functional>
#include <set>
#include <string>

#include "attention_ref.h"
#include "cudnn_pair.h"
#include "gradcheck.h"

using namespace gc;

namespace {

double fwd_tol(flame_dtype_t d) {
  switch (d) {
    case FLAME_DTYPE_F16: return 4e-3;
    case FLAME_DTYPE_BF16: return 2.5e-2;
    case FLAME_DTYPE_F32: return 2e-4;
    default: return 1e-10;
  }
}
double grad_tol(flame_dtype_t d) {
  switch (d) {
    case FLAME_DTYPE_F16: return 1e-2;
    case FLAME_DTYPE_BF16: return 4e-2;
    case FLAME_DTYPE_F32: return 5e-4;
    default: return 1e-9;
  }
}

// |got - want| <= tol * max(max |want|, 1e-3) everywhere (NaN fails).
::testing::AssertionResult near(const std::vector<double>& got, const std::vector<double>& want, double tol,
                                const std::string& what) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << what << ": " << got.size() << " elements, expected " << want.size();
  double scale = 1e-3;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  size_t worst = 0;
  double wr = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double r = std::fabs(got[i] - want[i]) / scale;
    if (!(r <= wr)) {
      wr = r;
      worst = i;
    }
  }
  if (wr <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": element " << worst << " is " << got[worst] << ", expected "
                                       << want[worst] << " (error " << wr << " of max |expected| " << scale
                                       << ", tolerance " << tol << ")";
}

double uniform(std::mt19937_64& rng, double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); }

HT random_ht(std::mt19937_64& rng, Shape s, double lo, double hi) {
  HT h(std::move(s));
  for (auto& e : h.v) e = uniform(rng, lo, hi);
  return h;
}

// A [B, H, L, E] input and the values the device holds (after rounding to its dtype).
struct Input {
  T t;
  HT val;
};

// layout 0: contiguous. 1: the heads of a packed projection [B, L, C] (columns off .. off + H E),
// reshaped to [B, L, H, E] and transposed to [B, H, L, E] (as split from a qkv projection); with
// C and off multiples of 8 elements. 2: the same with 3 extra columns in front (unaligned rows).
// 3: [B, 1, L, E] expanded over the heads (stride 0; for q too, which then has equal heads).
void make_input(flame_ctx_t ctx, std::mt19937_64& rng, int64_t B, int64_t H, int64_t L, int64_t E, flame_dtype_t dt,
                int layout, double amp, Input* in) {
  if (layout == 0) {
    HT h = random_ht(rng, {B, H, L, E}, -amp, amp);
    FLAME_ASSERT_OK(upload(ctx, h, dt, in->t.out()));
  } else if (layout == 3) {
    HT h = random_ht(rng, {B, 1, L, E}, -amp, amp);
    T one;
    FLAME_ASSERT_OK(upload(ctx, h, dt, one.out()));
    const int64_t full[4] = {B, H, L, E};
    FLAME_ASSERT_OK(flame_expand(one, full, 4, in->t.out()));
  } else {
    const int64_t off = layout == 1 ? 8 : 3, C = off + H * E + 8;
    HT packed = random_ht(rng, {B, L, C}, -amp, amp);
    T base, nar, r;
    FLAME_ASSERT_OK(upload(ctx, packed, dt, base.out()));
    FLAME_ASSERT_OK(flame_narrow(base, 2, off, H * E, nar.out()));
    const int64_t split[4] = {B, L, H, E};
    FLAME_ASSERT_OK(flame_view(nar, split, 4, r.out()));
    FLAME_ASSERT_OK(flame_transpose(r, 1, 2, in->t.out()));
    int32_t contiguous = 1;
    FLAME_ASSERT_OK(flame_tensor_is_contiguous(in->t, &contiguous));
    ASSERT_EQ(contiguous, 0) << "the view input should be strided";
  }
  FLAME_ASSERT_OK(download(in->t, &in->val));
}

// The element of a mask of shape ms (broadcast to [B, H, Lq, Lk]) that (b, h, i, j) reads.
double mask_at(const HT& m, int64_t b, int64_t h, int64_t i, int64_t j) {
  const int64_t idx4[4] = {b, h, i, j};
  const int nd = m.ndim(), lead = 4 - nd;
  int64_t lin = 0;
  for (int d = 0; d < nd; ++d) lin = lin * m.shape[d] + (m.shape[d] == 1 ? 0 : idx4[lead + d]);
  return m.v[static_cast<size_t>(lin)];
}

// ds [B, H, Lq, Lk] summed over the dims a mask of shape ms broadcasts.
std::vector<double> sum_to_mask(const std::vector<double>& ds, const Shape& full, const Shape& ms) {
  HT m(ms);
  const int lead = 4 - static_cast<int>(ms.size());
  for_each_index(full, [&](const std::vector<int64_t>& idx, int64_t lin) {
    int64_t t = 0;
    for (size_t d = 0; d < ms.size(); ++d) t = t * ms[d] + (ms[d] == 1 ? 0 : idx[lead + d]);
    m.v[static_cast<size_t>(t)] += ds[static_cast<size_t>(lin)];
  });
  return m.v;
}

std::vector<double> grad_of(flame_tensor_t t) {
  T g;
  EXPECT_EQ(flame_tensor_grad(t, g.out()), FLAME_OK) << flame_last_error_message();
  if (!g.h) {
    ADD_FAILURE() << "no .grad after backward";
    return {};
  }
  HT h;
  EXPECT_EQ(download(g, &h), FLAME_OK);
  return h.v;
}

// ------------------------------------------------------------------ forward and gradients

enum class Mask { None, Bool, Additive };

struct Case {
  std::string name;
  flame_dtype_t dt = FLAME_DTYPE_F16;
  int64_t B = 2, H = 3, Lq = 37, Lk = 45, D = 64, Dv = 64;
  bool causal = false;
  double scale = 0;
  Mask mask = Mask::None;
  Shape mshape;
  bool mask_grad = false;
  int64_t dead_row = -1;  // a query row whose keys the mask excludes (mshape has the Lq dim)
  int layout = 0;         // make_input's layouts
  bool own_kernels = false;  // on a context without cuDNN (else cuDNN may take f16/bf16 without a mask)
  bool dout_broadcast = false;  // backward from the output with a gradient broadcast over the heads (stride 0)
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> cases() {
  std::vector<Case> v;
  auto add = [&v](Case c, const std::string& what) {
    c.name = std::string(flame_dtype_name(c.dt)) + "_D" + std::to_string(c.D) + "_" + what;
    v.push_back(c);
  };
  for (flame_dtype_t dt : {FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_F32}) {
    for (int64_t D : {64, 80, 96, 128, 40}) {
      Case c;
      c.dt = dt;
      c.D = c.Dv = D;
      add(c, "plain");
      Case cc = c;
      cc.causal = true;
      add(cc, "causal");
      cc.Lq = 45;
      cc.Lk = 37;
      add(cc, "causal_more_queries");
      Case bm = c;
      bm.mask = Mask::Bool;
      bm.mshape = {c.B, 1, c.Lq, c.Lk};
      bm.scale = 0.3;
      add(bm, "bool_mask_scale");
      Case am = c;
      am.mask = Mask::Additive;
      am.mshape = {1, c.H, 1, c.Lk};
      am.mask_grad = true;
      am.causal = true;
      add(am, "additive_mask_grad_causal");
      Case vw = c;
      vw.layout = 1;
      vw.Lq = 29;
      vw.Lk = 130;
      vw.mask = Mask::Bool;
      vw.mshape = {vw.Lq, vw.Lk};
      add(vw, "views_cross_bool_mask");
      Case od = c;
      od.layout = 2;
      od.Dv = 24;
      od.Lq = 130;
      od.Lk = 77;
      od.causal = true;
      add(od, "unaligned_views_dv24");
      Case dr = c;
      dr.mask = (D == 80 || D == 128) ? Mask::Bool : Mask::Additive;
      dr.mshape = {c.B, c.H, c.Lq, c.Lk};
      dr.dead_row = 5;
      add(dr, "row_fully_masked");
      if (D == 64 || D == 128) {  // several key and query tiles of FLAME's kernels (sm_90a: 128 keys / queries)
        Case mt = c;
        mt.own_kernels = true;
        mt.layout = 1;
        mt.Lq = 300;
        mt.Lk = 260;
        add(mt, "views_multi_tile");
        mt.causal = true;
        mt.Lq = 260;
        mt.Lk = 300;
        add(mt, "views_multi_tile_causal");
      }
    }
    for (int64_t D : {8, 33, 160}) {  // small, odd and over-128 head dims
      Case c;
      c.dt = dt;
      c.D = c.Dv = D;
      c.causal = D == 33;
      add(c, "plain");
    }
  }
  // FLAME's own kernels, where compute capability 9.0 runs the TMA forward sdpa_fwd_tma and backward
  // sdpa_bwd_tma (elsewhere these repeat cases above): several key tiles (5 at Lk 600: the forward's K / V
  // stages wrap and their barrier phases flip) and query tiles (10 at Lq 600: the backward's Q / dO stages
  // wrap several times), partial tiles, causal with Lq above and below Lk (key blocks past Lq have no
  // query tile: dK = dV = 0), a custom scale, contiguous inputs and strided views; and inputs no tensor
  // map describes, copied dense first: q, k, v broadcast over the heads (a stride of 0), and the upstream
  // gradient dO broadcast over the heads.
  for (flame_dtype_t dt : {FLAME_DTYPE_F16, FLAME_DTYPE_BF16})
    for (int64_t D : {64, 128}) {
      Case c;
      c.dt = dt;
      c.D = c.Dv = D;
      c.own_kernels = true;
      Case kt = c;
      kt.Lq = 300, kt.Lk = 600;
      add(kt, "tma_plain_5_key_tiles");
      Case qt = c;
      qt.Lq = 600, qt.Lk = 300;
      add(qt, "tma_plain_10_query_tiles");
      Case cv = c;
      cv.layout = 1, cv.causal = true, cv.Lq = 260, cv.Lk = 300;
      add(cv, "tma_views_causal");
      cv.Lq = 600, cv.Lk = 260;
      add(cv, "tma_views_causal_more_queries");
      Case cm = c;
      cm.causal = true, cm.Lq = 300, cm.Lk = 130;
      add(cm, "tma_causal_more_queries");
      cm.Lq = 130, cm.Lk = 300;
      add(cm, "tma_causal_fewer_queries");
      Case cs = c;
      cs.layout = 1, cs.scale = 0.3, cs.Lq = 37, cs.Lk = 45;
      add(cs, "tma_views_short_scale");
      Case cb = c;
      cb.layout = 3, cb.causal = true, cb.Lq = 260, cb.Lk = 300;
      add(cb, "broadcast_heads_copied_causal");
      Case cd = c;
      cd.dout_broadcast = true, cd.Lq = 200, cd.Lk = 150;
      add(cd, "dout_broadcast_heads_copied");
    }
  for (int64_t D : {40, 64}) {  // f64: the composed path
    Case c;
    c.dt = FLAME_DTYPE_F64;
    c.D = c.Dv = D;
    add(c, "plain");
    c.mask = Mask::Additive;
    c.mshape = {c.Lq, c.Lk};
    c.mask_grad = true;
    c.causal = true;
    add(c, "additive_mask_grad_causal");
  }
  return v;
}

class AttentionVsReference : public GpuTest, public ::testing::WithParamInterface<Case> {};

uint64_t case_seed(const std::string& name) {
  uint64_t h = gc::seed() ^ 0x2545F4914F6CDD1Dull;
  for (char ch : name) h = (h ^ static_cast<unsigned char>(ch)) * 0x100000001b3ull;
  return h;
}

TEST_P(AttentionVsReference, ForwardAndGradients) {
  const Case& c = GetParam();
  SCOPED_TRACE(c.name + " FLAME_GRADCHECK_SEED=" + std::to_string(gc::seed()));
  struct OwnContext {  // destroyed after the tensors below
    flame_ctx_t c;
    ~OwnContext() {
      if (c) flame_ctx_destroy(c);
    }
  } own{c.own_kernels ? cudnn_pair::cudnn_off_context() : nullptr};
  flame_ctx_t ctx = own.c ? own.c : this->ctx;  // the test's context from here on
  ASSERT_NE(ctx, nullptr);
  std::mt19937_64 rng(case_seed(c.name));
  Input q, k, v;
  make_input(ctx, rng, c.B, c.H, c.Lq, c.D, c.dt, c.layout, 1.5, &q);
  make_input(ctx, rng, c.B, c.H, c.Lk, c.D, c.dt, c.layout, 1.5, &k);
  make_input(ctx, rng, c.B, c.H, c.Lk, c.Dv, c.dt, c.layout, 1.0, &v);
  if (HasFatalFailure()) return;
  for (Input* in : {&q, &k, &v}) FLAME_ASSERT_OK(flame_tensor_set_requires_grad(in->t, 1));

  T mask;
  HT mval;
  const double ninf = -INFINITY;
  if (c.mask != Mask::None) {
    mval = HT(c.mshape);
    for (auto& e : mval.v)
      e = c.mask == Mask::Bool ? (uniform(rng, 0, 1) < 0.8 ? 1.0 : 0.0) : uniform(rng, -2, 1);
    if (c.dead_row >= 0)
      for_each_index(c.mshape, [&](const std::vector<int64_t>& idx, int64_t lin) {
        if (idx[idx.size() - 2] == c.dead_row) mval.v[static_cast<size_t>(lin)] = c.mask == Mask::Bool ? 0.0 : ninf;
      });
    FLAME_ASSERT_OK(upload(ctx, mval, c.mask == Mask::Bool ? FLAME_DTYPE_BOOL : c.dt, mask.out()));
    FLAME_ASSERT_OK(download(mask, &mval));
    if (c.mask_grad) FLAME_ASSERT_OK(flame_tensor_set_requires_grad(mask, 1));
  }

  flame_attention_options_t o;
  FLAME_ASSERT_OK(flame_attention_options_init(&o));
  o.flags = c.causal ? FLAME_ATTENTION_CAUSAL : 0;
  o.scale = c.scale;
  T out;
  FLAME_ASSERT_OK(flame_scaled_dot_product_attention(q.t, k.t, v.t, mask.h, &o, out.out()));
  EXPECT_EQ(shape_of(out), (Shape{c.B, c.H, c.Lq, c.Dv}));
  EXPECT_EQ(dtype_of(out), c.dt);
  int32_t contiguous = 0;
  FLAME_ASSERT_OK(flame_tensor_is_contiguous(out, &contiguous));
  EXPECT_EQ(contiguous, 1);

  aref::Problem pr;
  pr.B = c.B, pr.H = c.H, pr.Lq = c.Lq, pr.Lk = c.Lk, pr.D = c.D, pr.Dv = c.Dv;
  pr.q = q.val.v, pr.k = k.val.v, pr.v = v.val.v;
  pr.causal = c.causal;
  pr.scale = c.scale;
  if (c.mask == Mask::Bool) pr.bias = [&](int64_t b, int64_t h, int64_t i, int64_t j) { return mask_at(mval, b, h, i, j) != 0 ? 0.0 : ninf; };
  if (c.mask == Mask::Additive) pr.bias = [&](int64_t b, int64_t h, int64_t i, int64_t j) { return mask_at(mval, b, h, i, j); };
  aref::Forward f = aref::forward(pr);
  HT got;
  FLAME_ASSERT_OK(download(out, &got));
  EXPECT_TRUE(near(got.v, f.out, fwd_tol(c.dt), "output"));
  if (c.dead_row >= 0) {
    for (int64_t bh = 0; bh < c.B * c.H; ++bh)
      for (int64_t e = 0; e < c.Dv; ++e)
        ASSERT_EQ(got.v[static_cast<size_t>((bh * c.Lq + c.dead_row) * c.Dv + e)], 0.0) << "a fully masked row gives zeros";
  }

  // loss = sum(out * w): the backward gets dO = w, dense; or, with dout_broadcast, dO = w itself as a
  // [B, 1, Lq, Dv] tensor expanded over the heads (stride 0), given to flame_backward as out's gradient.
  HT w;
  if (c.dout_broadcast) {
    HT w1 = random_ht(rng, {c.B, 1, c.Lq, c.Dv}, -1, 1);
    T one, wt;
    FLAME_ASSERT_OK(upload(ctx, w1, c.dt, one.out()));
    const int64_t full[4] = {c.B, c.H, c.Lq, c.Dv};
    FLAME_ASSERT_OK(flame_expand(one, full, 4, wt.out()));
    FLAME_ASSERT_OK(download(wt, &w));
    FLAME_ASSERT_OK(flame_backward(ctx, out, wt, 0));
  } else {
    w = random_ht(rng, {c.B, c.H, c.Lq, c.Dv}, -1, 1);
    T wt, prod, loss;
    FLAME_ASSERT_OK(upload(ctx, w, c.dt, wt.out()));
    FLAME_ASSERT_OK(download(wt, &w));
    FLAME_ASSERT_OK(flame_mul(out, wt, prod.out()));
    FLAME_ASSERT_OK(flame_sum_all(prod, loss.out()));
    FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
  }
  aref::Grads g = aref::backward(pr, f, w.v);
  const double gt = grad_tol(c.dt);
  EXPECT_TRUE(near(grad_of(q.t), g.dq, gt, "dq"));
  EXPECT_TRUE(near(grad_of(k.t), g.dk, gt, "dk"));
  EXPECT_TRUE(near(grad_of(v.t), g.dv, gt, "dv"));
  if (c.mask_grad) {
    EXPECT_TRUE(near(grad_of(mask), sum_to_mask(g.ds, {c.B, c.H, c.Lq, c.Lk}, c.mshape), gt, "dmask"));
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, AttentionVsReference, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

using Attention = GpuTest;

constexpr flame_dtype_t kAllFloat[] = {FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_F32, FLAME_DTYPE_F64};

flame_status_t attend(flame_tensor_t q, flame_tensor_t k, flame_tensor_t v, flame_tensor_t mask, uint32_t flags,
                      double scale, double p, T* out) {
  flame_attention_options_t o;
  flame_attention_options_init(&o);
  o.flags = flags;
  o.scale = scale;
  o.dropout_p = p;
  return flame_scaled_dot_product_attention(q, k, v, mask, &o, out->out());
}

TEST_F(Attention, OptionsInitGivesTheDefaults) {
  flame_attention_options_t o;
  std::memset(&o, 0x5a, sizeof o);
  FLAME_ASSERT_OK(flame_attention_options_init(&o));
  EXPECT_EQ(o.struct_size, sizeof(flame_attention_options_t));
  EXPECT_EQ(o.flags, 0u);
  EXPECT_EQ(o.scale, 0.0);
  EXPECT_EQ(o.dropout_p, 0.0);
  FLAME_EXPECT_STATUS(flame_attention_options_init(nullptr), FLAME_ERROR_INVALID_ARGUMENT);
}

TEST_F(Attention, NullOptionsAndZeroDropoutEqualTheDefaults) {
  std::mt19937_64 rng(case_seed("defaults"));
  for (flame_dtype_t dt : kAllFloat) {
    SCOPED_TRACE(flame_dtype_name(dt));
    Input q, k, v;
    make_input(ctx, rng, 1, 2, 20, 64, dt, 0, 1.5, &q);
    make_input(ctx, rng, 1, 2, 33, 64, dt, 0, 1.5, &k);
    make_input(ctx, rng, 1, 2, 33, 64, dt, 0, 1.0, &v);
    T a, b;
    FLAME_ASSERT_OK(flame_scaled_dot_product_attention(q.t, k.t, v.t, nullptr, nullptr, a.out()));
    FLAME_ASSERT_OK(attend(q.t, k.t, v.t, nullptr, 0, 0.0, 0.0, &b));
    HT ha, hb;
    FLAME_ASSERT_OK(download(a, &ha));
    FLAME_ASSERT_OK(download(b, &hb));
    EXPECT_EQ(ha.v, hb.v);
    uint64_t seed0, off0, seed1, off1;
    FLAME_ASSERT_OK(flame_ctx_get_rng_state(ctx, &seed0, &off0));
    FLAME_ASSERT_OK(attend(q.t, k.t, v.t, nullptr, 0, 0.0, 0.0, &b));
    FLAME_ASSERT_OK(flame_ctx_get_rng_state(ctx, &seed1, &off1));
    EXPECT_EQ(off0, off1) << "no dropout draws no random numbers";
  }
}

TEST_F(Attention, NoKeysGiveZeros) {
  std::mt19937_64 rng(case_seed("nokeys"));
  for (flame_dtype_t dt : kAllFloat) {
    SCOPED_TRACE(flame_dtype_name(dt));
    Input q, k, v;
    make_input(ctx, rng, 2, 2, 9, 64, dt, 0, 1.5, &q);
    make_input(ctx, rng, 2, 2, 0, 64, dt, 0, 1.5, &k);
    make_input(ctx, rng, 2, 2, 0, 48, dt, 0, 1.0, &v);
    for (Input* in : {&q, &k, &v}) FLAME_ASSERT_OK(flame_tensor_set_requires_grad(in->t, 1));
    T out, loss;
    FLAME_ASSERT_OK(attend(q.t, k.t, v.t, nullptr, FLAME_ATTENTION_CAUSAL, 0.0, 0.5, &out));
    EXPECT_EQ(shape_of(out), (Shape{2, 2, 9, 48}));
    HT h;
    FLAME_ASSERT_OK(download(out, &h));
    for (double x : h.v) {
      ASSERT_EQ(x, 0.0);
    }
    FLAME_ASSERT_OK(flame_sum_all(out, loss.out()));
    FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
    for (double x : grad_of(q.t)) {
      ASSERT_EQ(x, 0.0);
    }
    EXPECT_TRUE(grad_of(k.t).empty());
  }
}

TEST_F(Attention, LastDimNotContiguousIsCopied) {
  std::mt19937_64 rng(case_seed("lastdim"));
  for (flame_dtype_t dt : {FLAME_DTYPE_BF16, FLAME_DTYPE_F32}) {
    // q is the transpose of a [B, H, D, L] tensor: unit stride on L, not on D
    HT qt = random_ht(rng, {1, 2, 64, 21}, -1.5, 1.5);
    T qb, q;
    FLAME_ASSERT_OK(upload(ctx, qt, dt, qb.out()));
    FLAME_ASSERT_OK(flame_transpose(qb, 2, 3, q.out()));
    Input k, v;
    make_input(ctx, rng, 1, 2, 30, 64, dt, 0, 1.5, &k);
    make_input(ctx, rng, 1, 2, 30, 64, dt, 0, 1.0, &v);
    HT qv;
    FLAME_ASSERT_OK(download(q, &qv));
    T out;
    FLAME_ASSERT_OK(attend(q, k.t, v.t, nullptr, 0, 0.0, 0.0, &out));
    aref::Problem pr;
    pr.B = 1, pr.H = 2, pr.Lq = 21, pr.Lk = 30, pr.D = 64, pr.Dv = 64;
    pr.q = qv.v, pr.k = k.val.v, pr.v = v.val.v;
    HT got;
    FLAME_ASSERT_OK(download(out, &got));
    EXPECT_TRUE(near(got.v, aref::forward(pr).out, fwd_tol(dt), "output"));
  }
}

// ------------------------------------------------------------------ dropout

struct DropRun {
  HT out;
  uint64_t offset_before = 0, offset_after = 0;
};

// Attention with V = identity (Lk == Dv): out[i, j] = P[i, j] * z[i, j], which reveals the mask.
class AttentionDropout : public GpuTest {
 protected:
  static constexpr int64_t B = 2, H = 3, Lq = 64, Lk = 64;
  void SetUp() override {
    GpuTest::SetUp();
    if (!ctx) return;
    std::mt19937_64 rng(case_seed("dropout"));
    qv = random_ht(rng, {B, H, Lq, 64}, -0.3, 0.3);  // small scores: P near 1 / Lk, far from 0
    kv = random_ht(rng, {B, H, Lk, 64}, -0.3, 0.3);
  }
  void run(flame_dtype_t dt, uint64_t seed, uint64_t offset, double p, DropRun* r, std::vector<T>* keep = nullptr) {
    T q, k, v, out;
    HT eye(Shape{B, H, Lk, Lk});
    for_each_index(eye.shape, [&](const std::vector<int64_t>& idx, int64_t lin) { eye.v[static_cast<size_t>(lin)] = idx[2] == idx[3]; });
    FLAME_ASSERT_OK(upload(ctx, qv, dt, q.out()));
    FLAME_ASSERT_OK(upload(ctx, kv, dt, k.out()));
    FLAME_ASSERT_OK(upload(ctx, eye, dt, v.out()));
    FLAME_ASSERT_OK(flame_ctx_set_rng_state(ctx, seed, offset));
    FLAME_ASSERT_OK(flame_ctx_get_rng_state(ctx, &seed, &r->offset_before));
    FLAME_ASSERT_OK(attend(q, k, v, nullptr, 0, 0.0, p, &out));
    FLAME_ASSERT_OK(flame_ctx_get_rng_state(ctx, &seed, &r->offset_after));
    FLAME_ASSERT_OK(download(out, &r->out));
    if (keep) {
      keep->push_back(std::move(q));
      keep->push_back(std::move(k));
      keep->push_back(std::move(v));
      keep->push_back(std::move(out));
    }
  }
  // The probabilities P of the rounded inputs in dtype dt.
  std::vector<double> probs(flame_dtype_t dt) {
    aref::Problem pr;
    pr.B = B, pr.H = H, pr.Lq = Lq, pr.Lk = Lk, pr.D = 64, pr.Dv = 1;
    pr.q = qv.v, pr.k = kv.v;
    for (auto& x : pr.q) x = round(x, dt);
    for (auto& x : pr.k) x = round(x, dt);
    pr.v.assign(static_cast<size_t>(B * H * Lk), 0.0);
    return aref::forward(pr).p;
  }
  static double round(double x, flame_dtype_t dt) {
    if (dt == FLAME_DTYPE_F16) return f16_to_f32(f32_to_f16(static_cast<float>(x)));
    if (dt == FLAME_DTYPE_BF16) return bf16_to_f32(f32_to_bf16(static_cast<float>(x)));
    if (dt == FLAME_DTYPE_F32) return static_cast<float>(x);
    return x;
  }
  // Classifies out / (P / (1 - p)) as kept (1) or dropped (0); fails on anything else.
  std::vector<int> mask_of(const DropRun& r, flame_dtype_t dt, double p) {
    std::vector<double> P = probs(dt);
    std::vector<int> m(P.size());
    for (size_t i = 0; i < P.size(); ++i) {
      const double ratio = r.out.v[i] * (1 - p) / P[i];
      if (std::fabs(ratio - 1) < 0.05) m[i] = 1;
      else if (r.out.v[i] == 0) m[i] = 0;
      else {
        ADD_FAILURE() << "element " << i << " is " << r.out.v[i] << ": neither 0 nor P / (1 - p) = " << P[i] / (1 - p);
        return {};
      }
    }
    return m;
  }
  HT qv, kv;
};

TEST_F(AttentionDropout, SameSeedSameOutputOtherSeedOtherOutput) {
  for (flame_dtype_t dt : kAllFloat) {
    SCOPED_TRACE(flame_dtype_name(dt));
    DropRun a, b, c;
    run(dt, 7, 100, 0.3, &a);
    run(dt, 7, 100, 0.3, &b);
    run(dt, 8, 100, 0.3, &c);
    if (HasFatalFailure()) return;
    EXPECT_EQ(a.out.v, b.out.v);
    EXPECT_NE(a.out.v, c.out.v);
    // one Philox counter per four keys of each row
    EXPECT_EQ(a.offset_after - a.offset_before, static_cast<uint64_t>(B * H * Lq * ((Lk + 3) / 4)));
  }
}

TEST_F(AttentionDropout, KeepFractionAndTheSameMaskInEveryDtype) {
  const double p = 0.3;
  std::vector<int> first;
  for (flame_dtype_t dt : kAllFloat) {
    SCOPED_TRACE(flame_dtype_name(dt));
    DropRun r;
    run(dt, 42, 12345, p, &r);
    if (HasFatalFailure()) return;
    std::vector<int> m = mask_of(r, dt, p);
    ASSERT_FALSE(m.empty());
    double kept = 0;
    for (int x : m) kept += x;
    const double n = static_cast<double>(m.size()), frac = kept / n, sigma = std::sqrt(p * (1 - p) / n);
    EXPECT_NEAR(frac, 1 - p, 5 * sigma) << "keep fraction over " << n << " weights";
    if (first.empty()) first = m;
    else EXPECT_EQ(m, first) << "the keep decisions depend on the seed and offset only";
  }
}

TEST_F(AttentionDropout, BackwardAppliesTheForwardMask) {
  const double p = 0.25;
  for (flame_dtype_t dt : kAllFloat) {
    SCOPED_TRACE(flame_dtype_name(dt));
    DropRun r;
    std::vector<T> held;
    run(dt, 5, 777, p, &r, &held);
    if (HasFatalFailure()) return;
    std::vector<int> m = mask_of(r, dt, p);
    ASSERT_FALSE(m.empty());
    // The same call again with the same RNG state, now differentiating q, k, v.
    T& q = held[0];
    T& k = held[1];
    T& v = held[2];
    for (T* t : {&q, &k, &v}) FLAME_ASSERT_OK(flame_tensor_set_requires_grad(*t, 1));
    FLAME_ASSERT_OK(flame_ctx_set_rng_state(ctx, 5, 777));
    T out, wt, prod, loss;
    FLAME_ASSERT_OK(attend(q, k, v, nullptr, 0, 0.0, p, &out));
    HT again;
    FLAME_ASSERT_OK(download(out, &again));
    EXPECT_EQ(again.v, r.out.v);
    std::mt19937_64 rng(case_seed("dropout_w"));
    HT w = random_ht(rng, {B, H, Lq, Lk}, -1, 1);
    FLAME_ASSERT_OK(upload(ctx, w, dt, wt.out()));
    FLAME_ASSERT_OK(download(wt, &w));
    FLAME_ASSERT_OK(flame_mul(out, wt, prod.out()));
    FLAME_ASSERT_OK(flame_sum_all(prod, loss.out()));
    FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
    aref::Problem pr;
    pr.B = B, pr.H = H, pr.Lq = Lq, pr.Lk = Lk, pr.D = 64, pr.Dv = Lk;
    HT hq, hk, hv;
    FLAME_ASSERT_OK(download(q, &hq));
    FLAME_ASSERT_OK(download(k, &hk));
    FLAME_ASSERT_OK(download(v, &hv));
    pr.q = hq.v, pr.k = hk.v, pr.v = hv.v;
    pr.z.resize(m.size());
    for (size_t i = 0; i < m.size(); ++i) pr.z[i] = m[i] ? 1.0 / (1.0 - p) : 0.0;
    aref::Forward f = aref::forward(pr);
    EXPECT_TRUE(near(again.v, f.out, fwd_tol(dt), "output"));
    aref::Grads g = aref::backward(pr, f, w.v);
    EXPECT_TRUE(near(grad_of(q), g.dq, grad_tol(dt), "dq"));
    EXPECT_TRUE(near(grad_of(k), g.dk, grad_tol(dt), "dk"));
    EXPECT_TRUE(near(grad_of(v), g.dv, grad_tol(dt), "dv"));
  }
}

// ------------------------------------------------------------------ create_graph

TEST_F(Attention, CreateGraphComposesTheBackwardAndDifferentiatesIt) {
  std::mt19937_64 rng(case_seed("create_graph"));
  HT qh = random_ht(rng, {1, 2, 19, 64}, -1.5, 1.5), kh = random_ht(rng, {1, 2, 23, 64}, -1.5, 1.5);
  HT vh = random_ht(rng, {1, 2, 23, 64}, -1, 1), wh = random_ht(rng, {1, 2, 19, 64}, -1, 1);
  HT rh = random_ht(rng, {1, 2, 19, 64}, -1, 1);
  // d/dv sum(r * dq), dq = d sum(w * out) / dq, in bf16 (kernel forward, composed backward) and f32
  std::vector<double> first_fused, first_graph[2], second[2];
  int run = 0;
  for (flame_dtype_t dt : {FLAME_DTYPE_BF16, FLAME_DTYPE_F32}) {
    SCOPED_TRACE(flame_dtype_name(dt));
    T q, k, v, w, r, out, wo, loss, dq_h, rd, second_loss;
    HT vals;
    for (auto [ht, t] : {std::pair<HT*, T*>{&qh, &q}, {&kh, &k}, {&vh, &v}, {&wh, &w}, {&rh, &r}}) {
      FLAME_ASSERT_OK(upload(ctx, *ht, dt, t->out()));
      FLAME_ASSERT_OK(download(*t, ht));  // both runs use the bf16-rounded values
    }
    for (T* t : {&q, &k, &v}) FLAME_ASSERT_OK(flame_tensor_set_requires_grad(*t, 1));
    FLAME_ASSERT_OK(attend(q, k, v, nullptr, FLAME_ATTENTION_CAUSAL, 0.0, 0.0, &out));
    FLAME_ASSERT_OK(flame_mul(out, w, wo.out()));
    FLAME_ASSERT_OK(flame_sum_all(wo, loss.out()));
    flame_tensor_t inputs[1] = {q}, res[1] = {nullptr};
    flame_tensor_t l = loss;
    if (dt == FLAME_DTYPE_BF16) {  // the fused first-order gradient, for comparison
      FLAME_ASSERT_OK(flame_grad(ctx, &l, nullptr, 1, inputs, 1, FLAME_BACKWARD_RETAIN_GRAPH, res));
      T held(res[0]);
      HT h;
      FLAME_ASSERT_OK(download(held, &h));
      first_fused = h.v;
    }
    FLAME_ASSERT_OK(flame_grad(ctx, &l, nullptr, 1, inputs, 1, FLAME_BACKWARD_CREATE_GRAPH | FLAME_BACKWARD_RETAIN_GRAPH, res));
    dq_h = T(res[0]);
    int32_t rg = 0;
    FLAME_ASSERT_OK(flame_tensor_requires_grad(dq_h, &rg));
    EXPECT_EQ(rg, 1) << "under create_graph the gradient is differentiable";
    HT h;
    FLAME_ASSERT_OK(download(dq_h, &h));
    first_graph[run] = h.v;
    FLAME_ASSERT_OK(flame_mul(dq_h, r, rd.out()));
    FLAME_ASSERT_OK(flame_sum_all(rd, second_loss.out()));
    flame_tensor_t l2 = second_loss, wrt[1] = {v}, res2[1] = {nullptr};
    FLAME_ASSERT_OK(flame_grad(ctx, &l2, nullptr, 1, wrt, 1, 0, res2));
    T held2(res2[0]);
    ASSERT_NE(held2.h, nullptr);
    FLAME_ASSERT_OK(download(held2, &h));
    second[run] = h.v;
    ++run;
  }
  EXPECT_TRUE(near(first_graph[0], first_fused, grad_tol(FLAME_DTYPE_BF16), "bf16 dq: composed vs fused"));
  EXPECT_TRUE(near(first_graph[0], first_graph[1], grad_tol(FLAME_DTYPE_BF16), "dq: bf16 vs f32"));
  EXPECT_TRUE(near(second[0], second[1], 2 * grad_tol(FLAME_DTYPE_BF16), "second order: bf16 vs f32"));
}

// ------------------------------------------------------------------ long sequences

TEST_F(Attention, LongSequenceNeedsMemoryLinearInItsLength) {
  const int64_t S = 16384, D = 64;
  std::mt19937_64 rng(case_seed("long"));
  for (flame_dtype_t dt : {FLAME_DTYPE_BF16, FLAME_DTYPE_F16}) {
    for (uint32_t flags : {0u, static_cast<uint32_t>(FLAME_ATTENTION_CAUSAL)}) {
      SCOPED_TRACE(std::string(flame_dtype_name(dt)) + (flags ? " causal" : ""));
      Input q, k, v;
      make_input(ctx, rng, 1, 1, S, D, dt, 0, 1.5, &q);
      make_input(ctx, rng, 1, 1, S, D, dt, 0, 1.5, &k);
      make_input(ctx, rng, 1, 1, S, D, dt, 0, 1.0, &v);
      for (Input* in : {&q, &k, &v}) FLAME_ASSERT_OK(flame_tensor_set_requires_grad(in->t, 1));
      T ones;
      const int64_t shape[4] = {1, 1, S, D};
      FLAME_ASSERT_OK(flame_ones(ctx, shape, 4, dt, ones.out()));
      FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));
      flame_memory_stats_t before{}, after{};
      before.struct_size = after.struct_size = sizeof(flame_memory_stats_t);
      FLAME_ASSERT_OK(flame_ctx_reset_peak_memory(ctx));
      FLAME_ASSERT_OK(flame_ctx_memory_stats(ctx, &before));
      {
        T out;
        FLAME_ASSERT_OK(attend(q.t, k.t, v.t, nullptr, flags, 0.0, 0.0, &out));
        flame_tensor_t o = out, go = ones, res[3] = {nullptr, nullptr, nullptr};
        flame_tensor_t ins[3] = {q.t, k.t, v.t};
        FLAME_ASSERT_OK(flame_grad(ctx, &o, &go, 1, ins, 3, 0, res));
        std::vector<T> grads;
        for (auto* r : res) grads.emplace_back(r);
        FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));
        FLAME_ASSERT_OK(flame_ctx_memory_stats(ctx, &after));
        // Rows 0, 1, S/2 and S-1 of the output against the reference.
        HT got;
        FLAME_ASSERT_OK(download(out, &got));
        for (int64_t i : {int64_t{0}, int64_t{1}, S / 2, S - 1}) {
          aref::Problem pr;
          pr.Lq = 1, pr.Lk = flags ? i + 1 : S, pr.D = D, pr.Dv = D;
          pr.q.assign(q.val.v.begin() + i * D, q.val.v.begin() + (i + 1) * D);
          pr.k.assign(k.val.v.begin(), k.val.v.begin() + pr.Lk * D);
          pr.v.assign(v.val.v.begin(), v.val.v.begin() + pr.Lk * D);
          pr.scale = 1.0 / std::sqrt(static_cast<double>(D));
          std::vector<double> row(got.v.begin() + i * D, got.v.begin() + (i + 1) * D);
          EXPECT_TRUE(near(row, aref::forward(pr).out, fwd_tol(dt), "row " + std::to_string(i)));
        }
        for (const T& g : grads) {
          HT h;
          FLAME_ASSERT_OK(download(g, &h));
          for (double x : h.v) {
            ASSERT_TRUE(std::isfinite(x));
          }
        }
      }
      // q, k, v, out, the gradients and the kernels' O(S) buffers: far below the S x S scores.
      const uint64_t extra = after.peak_bytes_in_use - before.bytes_in_use;
      const uint64_t scores = static_cast<uint64_t>(S) * S;  // even one byte per score
      EXPECT_LT(extra, 64ull << 20) << "peak extra memory " << extra << " bytes";
      EXPECT_LT(extra, scores / 4);
    }
  }
}

// ------------------------------------------------------------------ bad arguments

TEST_F(Attention, BadArgumentsFailWithTheDocumentedStatusAndChangeNothing) {
  auto make = [&](Shape s, flame_dtype_t dt) {
    T t;
    EXPECT_EQ(flame_zeros(ctx, s.data(), static_cast<int32_t>(s.size()), dt, t.out()), FLAME_OK);
    return t;
  };
  T q = make({2, 3, 5, 8}, FLAME_DTYPE_F16), k = make({2, 3, 7, 8}, FLAME_DTYPE_F16), v = make({2, 3, 7, 4}, FLAME_DTYPE_F16);
  T q3 = make({3, 5, 8}, FLAME_DTYPE_F16), kB = make({1, 3, 7, 8}, FLAME_DTYPE_F16), kH = make({2, 2, 7, 8}, FLAME_DTYPE_F16);
  T kD = make({2, 3, 7, 6}, FLAME_DTYPE_F16), vL = make({2, 3, 6, 4}, FLAME_DTYPE_F16), k32 = make({2, 3, 7, 8}, FLAME_DTYPE_F32);
  T qi = make({2, 3, 5, 8}, FLAME_DTYPE_I32), ki = make({2, 3, 7, 8}, FLAME_DTYPE_I32), vi = make({2, 3, 7, 4}, FLAME_DTYPE_I32);
  T q0 = make({2, 3, 5, 0}, FLAME_DTYPE_F16), k0 = make({2, 3, 7, 0}, FLAME_DTYPE_F16);
  T mshape = make({5, 6}, FLAME_DTYPE_BOOL), mbig = make({2, 3, 5, 7, 1}, FLAME_DTYPE_BOOL), mdt = make({5, 7}, FLAME_DTYPE_F32);
  T mint = make({5, 7}, FLAME_DTYPE_I64), mok = make({5, 7}, FLAME_DTYPE_BOOL);
  flame_ctx_t other = nullptr;
  {
    bool skip;
    std::string why;
    other = flame_test_context(&skip, &why);
    ASSERT_NE(other, nullptr) << why;
  }
  T kother;
  {
    const int64_t s[4] = {2, 3, 7, 8};
    FLAME_ASSERT_OK(flame_zeros(other, s, 4, FLAME_DTYPE_F16, kother.out()));
  }
  flame_attention_options_t ok;
  flame_attention_options_init(&ok);
  auto opts = [&](auto edit) {
    flame_attention_options_t o = ok;
    edit(o);
    return o;
  };
  const flame_attention_options_t small = opts([](auto& o) { o.struct_size = sizeof(flame_attention_options_t) - 8; });
  const flame_attention_options_t huge = opts([](auto& o) { o.struct_size = 8192; });
  const flame_attention_options_t flags = opts([](auto& o) { o.flags = 6; });
  const flame_attention_options_t nan_scale = opts([](auto& o) { o.scale = NAN; });
  const flame_attention_options_t inf_scale = opts([](auto& o) { o.scale = INFINITY; });
  const flame_attention_options_t p1 = opts([](auto& o) { o.dropout_p = 1.0; });
  const flame_attention_options_t pneg = opts([](auto& o) { o.dropout_p = -0.1; });
  const flame_attention_options_t pnan = opts([](auto& o) { o.dropout_p = NAN; });
  struct Bad {
    const char* what;
    flame_tensor_t q, k, v, mask;
    const flame_attention_options_t* o;
    flame_status_t status;
    const char* names;  // a word the message must contain
  };
  const Bad bad[] = {
      {"q NULL", nullptr, k, v, nullptr, &ok, FLAME_ERROR_INVALID_ARGUMENT, "q"},
      {"k NULL", q, nullptr, v, nullptr, &ok, FLAME_ERROR_INVALID_ARGUMENT, "k"},
      {"v NULL", q, k, nullptr, nullptr, &ok, FLAME_ERROR_INVALID_ARGUMENT, "v"},
      {"q 3-D", q3, k, v, nullptr, &ok, FLAME_ERROR_SHAPE_MISMATCH, "q"},
      {"batch differs", q, kB, v, nullptr, &ok, FLAME_ERROR_SHAPE_MISMATCH, "k"},
      {"heads differ", q, kH, v, nullptr, &ok, FLAME_ERROR_SHAPE_MISMATCH, "k"},
      {"head dim differs", q, kD, v, nullptr, &ok, FLAME_ERROR_SHAPE_MISMATCH, "head dim"},
      {"v keys differ", q, k, vL, nullptr, &ok, FLAME_ERROR_SHAPE_MISMATCH, "v"},
      {"head dim 0", q0, k0, v, nullptr, &ok, FLAME_ERROR_SHAPE_MISMATCH, "head dim"},
      {"mixed dtypes", q, k32, v, nullptr, &ok, FLAME_ERROR_DTYPE_MISMATCH, "k"},
      {"integer inputs", qi, ki, vi, nullptr, &ok, FLAME_ERROR_DTYPE_MISMATCH, "q"},
      {"mask shape", q, k, v, mshape, &ok, FLAME_ERROR_SHAPE_MISMATCH, "mask"},
      {"mask rank", q, k, v, mbig, &ok, FLAME_ERROR_SHAPE_MISMATCH, "mask"},
      {"mask dtype f32", q, k, v, mdt, &ok, FLAME_ERROR_DTYPE_MISMATCH, "mask"},
      {"mask dtype i64", q, k, v, mint, &ok, FLAME_ERROR_DTYPE_MISMATCH, "mask"},
      {"k of another context", q, kother, v, nullptr, &ok, FLAME_ERROR_INVALID_ARGUMENT, "k"},
      {"struct_size small", q, k, v, nullptr, &small, FLAME_ERROR_INVALID_ARGUMENT, "struct_size"},
      {"struct_size huge", q, k, v, nullptr, &huge, FLAME_ERROR_INVALID_ARGUMENT, "struct_size"},
      {"unknown flags", q, k, v, nullptr, &flags, FLAME_ERROR_INVALID_ARGUMENT, "flags"},
      {"scale NaN", q, k, v, nullptr, &nan_scale, FLAME_ERROR_INVALID_ARGUMENT, "scale"},
      {"scale inf", q, k, v, nullptr, &inf_scale, FLAME_ERROR_INVALID_ARGUMENT, "scale"},
      {"dropout_p 1", q, k, v, mok, &p1, FLAME_ERROR_INVALID_ARGUMENT, "dropout_p"},
      {"dropout_p negative", q, k, v, nullptr, &pneg, FLAME_ERROR_INVALID_ARGUMENT, "dropout_p"},
      {"dropout_p NaN", q, k, v, nullptr, &pnan, FLAME_ERROR_INVALID_ARGUMENT, "dropout_p"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.what);
    uint64_t s0, o0, s1, o1;
    FLAME_ASSERT_OK(flame_ctx_get_rng_state(ctx, &s0, &o0));
    flame_tensor_t out = reinterpret_cast<flame_tensor_t>(static_cast<uintptr_t>(0x40));
    FLAME_EXPECT_STATUS(flame_scaled_dot_product_attention(b.q, b.k, b.v, b.mask, b.o, &out), b.status);
    EXPECT_EQ(out, nullptr);
    const std::string msg = flame_last_error_message();
    EXPECT_NE(msg.find("flame_scaled_dot_product_attention"), std::string::npos) << msg;
    EXPECT_NE(msg.find(b.names), std::string::npos) << msg;
    FLAME_ASSERT_OK(flame_ctx_get_rng_state(ctx, &s1, &o1));
    EXPECT_EQ(o0, o1);
  }
  FLAME_EXPECT_STATUS(flame_scaled_dot_product_attention(q, k, v, nullptr, &ok, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  // a valid call with a mask that broadcasts and dropout works
  const flame_attention_options_t drop = opts([](auto& o) { o.dropout_p = 0.5; });
  T out;
  FLAME_EXPECT_STATUS(flame_scaled_dot_product_attention(q, k, v, mok, &drop, out.out()), FLAME_OK);
  kother = T();
  flame_ctx_destroy(other);
}

}  // namespace

// The cuDNN path of flame_scaled_dot_product_attention (src/runtime/cudnn_sdpa.cpp) against FLAME's
// own kernels, through the C ABI. Every test needs a context that uses cuDNN and skips, saying so,
// where libcudnn.so.9 does not load in this process; a context that does not use it although the
// library loads fails.
//  - the output and the gradients of q, k, v from a cuDNN context and from a context created with
//    FLAME_DISABLE_CUDNN=1 agree within the dtype's tolerance: f16 and bf16, causal and not, head
//    dims 64 and 128, batch and heads > 1, a custom scale, cross-attention with Lq below and above Lk,
//    GPT-2-style q / k / v viewed from one [B, S, 3 H D] projection and transposed (their gradient is
//    that projection's), head dim 80, and head dim 100 (not cuDNN's: FLAME's kernels in both contexts);
//  - flame_ctx_cudnn_attention_info: each supported forward and its backward are counted once (so
//    the fast path cannot silently be off), masks, dropout, f32 and head dim 100 are not, the disabled
//    context counts nothing, and cuDNN's workspaces go back to the pool.
// Reproduce a failure with FLAME_GRADCHECK_SEED=<seed printed in the failure>; FLAME_CUDNN_LOG=1
// prints why cuDNN refused a shape.
#include <dlfcn.h>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "cudnn_pair.h"

using namespace gc;
using cudnn_pair::agree;
using cudnn_pair::Tol;
using cudnn_pair::cudnn_off_context;

namespace {

// ------------------------------------------------------------------ contexts

struct Counts {
  uint64_t fwd = 0, bwd = 0;
};
Counts counts(flame_ctx_t ctx) {
  Counts c;
  EXPECT_EQ(flame_ctx_cudnn_attention_info(ctx, &c.fwd, &c.bwd), FLAME_OK) << flame_last_error_message();
  return c;
}

// ctx (uses cuDNN) and plain (FLAME_DISABLE_CUDNN=1). Skips when cuDNN is not installed.
class CudnnAttention : public cudnn_pair::CudnnPair {
 protected:
  CudnnAttention() : CudnnPair("attention calls") {}
  void SetUp() override {
    CudnnPair::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    int32_t major = 0, minor = 0;
    ASSERT_EQ(flame_ctx_compute_capability(ctx, &major, &minor), FLAME_OK);
    if (major < 8) GTEST_SKIP() << "cuDNN's fused attention needs sm_80+";
    const Counts off = counts(plain);
    EXPECT_EQ(off.fwd + off.bwd, 0u);
  }
};

// ------------------------------------------------------------------ cases

struct Case {
  std::string name;
  int64_t B, H, Sq, Sk, D;
  bool causal;
  bool packed;         // q, k, v: heads of one [B, S, 3 H D] projection, viewed and transposed
  double scale;        // 0: 1 / sqrt(D)
  bool cudnn;          // cuDNN takes it (D % 8 == 0 and D <= 128; head dim 100 is not)
};

std::vector<Case> cases() {
  return {
      {"d64_b2_h4", 2, 4, 128, 128, 64, false, false, 0, true},
      {"d64_b2_h4_causal", 2, 4, 128, 128, 64, true, false, 0, true},
      {"d128_b2_h3_causal", 2, 3, 96, 96, 128, true, false, 0, true},
      {"d128_b1_h2_scale", 1, 2, 77, 77, 128, false, false, 0.3, true},
      {"cross_lq_below_lk", 2, 2, 40, 72, 64, false, false, 0, true},
      {"cross_lq_below_lk_causal", 2, 2, 40, 72, 64, true, false, 0, true},
      {"cross_lq_above_lk_causal", 2, 2, 80, 48, 64, true, false, 0, true},
      {"gpt2_qkv_views_causal", 2, 4, 64, 64, 64, true, true, 0, true},
      {"gpt2_qkv_views_d128", 1, 2, 100, 100, 128, false, true, 0, true},
      {"d80_causal", 2, 2, 64, 64, 80, true, false, 0, true},
      {"d100_fallback", 2, 2, 64, 64, 100, true, false, 0, false},  // D % 8 != 0: FLAME's kernels
  };
}

// Two roundings of the dtype plus f32 sums apart (the gradients: twice that, longer sums).
Tol tol(flame_dtype_t d, bool grad) {
  const double k = grad ? 2.0 : 1.0;
  if (d == FLAME_DTYPE_F16) return {8e-3 * k, 4e-3 * k};
  return {3.2e-2 * k, 1.6e-2 * k};  // bf16
}

HT random_ht(const Shape& s, std::mt19937_64& rng, double amp) {
  HT h(s);
  std::uniform_real_distribution<double> u(-amp, amp);
  for (double& v : h.v) v = u(rng);
  return h;
}

uint64_t seed_for(const std::string& name) {
  uint64_t h = gc::seed() ^ 0xa77eull;
  for (char ch : name) h = (h ^ static_cast<unsigned char>(ch)) * 0x100000001b3ull;
  return h;
}

// Host inputs of one case: separate q, k, v, or one packed projection.
struct Inputs {
  HT q, k, v, qkv, gout;
};
Inputs make_inputs(const Case& c, std::mt19937_64& rng) {
  Inputs in;
  if (c.packed) {
    in.qkv = random_ht({c.B, c.Sq, 3 * c.H * c.D}, rng, 1.5);
  } else {
    in.q = random_ht({c.B, c.H, c.Sq, c.D}, rng, 1.5);
    in.k = random_ht({c.B, c.H, c.Sk, c.D}, rng, 1.5);
    in.v = random_ht({c.B, c.H, c.Sk, c.D}, rng, 1.0);
  }
  in.gout = random_ht({c.B, c.H, c.Sq, c.D}, rng, 1.0);
  return in;
}

// The output and the gradients of sum(out * gout): of q, k, v, or of the packed projection.
struct Outcome {
  HT out, dq, dk, dv, dqkv;
  bool out_rows_dense = false;  // out permuted to [B, Sq, H, D] is contiguous (q's memory order)
};

flame_status_t attend(const Case& c, flame_tensor_t q, flame_tensor_t k, flame_tensor_t v, T* out) {
  flame_attention_options_t o;
  flame_attention_options_init(&o);
  o.flags = c.causal ? FLAME_ATTENTION_CAUSAL : 0;
  o.scale = c.scale;
  return flame_scaled_dot_product_attention(q, k, v, nullptr, &o, out->out());
}

// Head j of the packed [B, S, 3 H D] projection as [B, H, S, D] (strided, not contiguous).
void head_view(flame_tensor_t qkv, const Case& c, int j, T* out) {
  T nar, r;
  FLAME_ASSERT_OK(flame_narrow(qkv, 2, j * c.H * c.D, c.H * c.D, nar.out()));
  const int64_t split[4] = {c.B, c.Sq, c.H, c.D};
  FLAME_ASSERT_OK(flame_view(nar, split, 4, r.out()));
  FLAME_ASSERT_OK(flame_transpose(r, 1, 2, out->out()));
  int32_t contiguous = 1;
  FLAME_ASSERT_OK(flame_tensor_is_contiguous(*out, &contiguous));
  ASSERT_EQ(contiguous, 0) << "the packed views should be strided";
}

void run(flame_ctx_t ctx, const Case& c, flame_dtype_t dt, const Inputs& in, Outcome* r) {
  T q, k, v, base, out, g;
  if (c.packed) {
    FLAME_ASSERT_OK(upload(ctx, in.qkv, dt, base.out()));
    FLAME_ASSERT_OK(flame_tensor_set_requires_grad(base, 1));
    head_view(base, c, 0, &q);
    head_view(base, c, 1, &k);
    head_view(base, c, 2, &v);
    if (::testing::Test::HasFatalFailure()) return;
  } else {
    FLAME_ASSERT_OK(upload(ctx, in.q, dt, q.out()));
    FLAME_ASSERT_OK(upload(ctx, in.k, dt, k.out()));
    FLAME_ASSERT_OK(upload(ctx, in.v, dt, v.out()));
    for (flame_tensor_t t : {q.h, k.h, v.h}) FLAME_ASSERT_OK(flame_tensor_set_requires_grad(t, 1));
  }
  FLAME_ASSERT_OK(attend(c, q, k, v, &out));
  FLAME_ASSERT_OK(download(out, &r->out));
  {
    const int32_t bshd[4] = {0, 2, 1, 3};
    T rows;
    int32_t dense = 0;
    FLAME_ASSERT_OK(flame_permute(out, bshd, 4, rows.out()));
    FLAME_ASSERT_OK(flame_tensor_is_contiguous(rows, &dense));
    r->out_rows_dense = dense != 0;
  }
  FLAME_ASSERT_OK(upload(ctx, in.gout, dt, g.out()));
  flame_tensor_t oh = out, gh = g;
  if (c.packed) {
    flame_tensor_t wrt = base, res = nullptr;
    FLAME_ASSERT_OK(flame_grad(ctx, &oh, &gh, 1, &wrt, 1, 0, &res));
    T d(res);
    FLAME_ASSERT_OK(download(d, &r->dqkv));
  } else {
    flame_tensor_t wrt[3] = {q, k, v}, res[3] = {nullptr, nullptr, nullptr};
    FLAME_ASSERT_OK(flame_grad(ctx, &oh, &gh, 1, wrt, 3, 0, res));
    T dq(res[0]), dk(res[1]), dv(res[2]);
    FLAME_ASSERT_OK(download(dq, &r->dq));
    FLAME_ASSERT_OK(download(dk, &r->dk));
    FLAME_ASSERT_OK(download(dv, &r->dv));
  }
}

uint64_t bytes_in_use(flame_ctx_t ctx) {
  flame_memory_stats_t m;
  m.struct_size = sizeof m;
  EXPECT_EQ(flame_ctx_memory_stats(ctx, &m), FLAME_OK);
  return m.bytes_in_use;
}

// ------------------------------------------------------------------ tests

TEST_F(CudnnAttention, MatchesFlameKernelsForwardAndGradients) {
  for (flame_dtype_t dt : {FLAME_DTYPE_F16, FLAME_DTYPE_BF16})
    for (const Case& c : cases()) {
      const std::string name = c.name + " " + flame_dtype_name(dt);
      SCOPED_TRACE(name + " FLAME_GRADCHECK_SEED=" + std::to_string(gc::seed()));
      std::mt19937_64 rng(seed_for(name));
      const Inputs in = make_inputs(c, rng);
      Outcome a, b;
      run(ctx, c, dt, in, &a);
      if (HasFatalFailure()) return;
      run(plain, c, dt, in, &b);
      if (HasFatalFailure()) return;
      EXPECT_TRUE(agree(a.out, b.out, tol(dt, false), "forward"));
      // cuDNN writes the output in q's memory order: heads split from qkv merge back without a copy
      if (c.packed && c.cudnn && c.H > 1) EXPECT_TRUE(a.out_rows_dense) << "output of packed q in [B, S, H, D] memory";
      if (c.packed) {
        EXPECT_TRUE(agree(a.dqkv, b.dqkv, tol(dt, true), "d qkv projection"));
      } else {
        EXPECT_TRUE(agree(a.dq, b.dq, tol(dt, true), "dq"));
        EXPECT_TRUE(agree(a.dk, b.dk, tol(dt, true), "dk"));
        EXPECT_TRUE(agree(a.dv, b.dv, tol(dt, true), "dv"));
      }
    }
  const Counts off = counts(plain);
  EXPECT_EQ(off.fwd + off.bwd, 0u) << "FLAME_DISABLE_CUDNN=1 must keep attention off cuDNN";
}

// One forward and one backward through cuDNN per supported call; none for what it does not cover.
TEST_F(CudnnAttention, IsUsedAndCountsEveryAttention) {
  const uint64_t held = bytes_in_use(ctx);
  for (flame_dtype_t dt : {FLAME_DTYPE_BF16, FLAME_DTYPE_F16})
    for (const Case& c : cases()) {
      SCOPED_TRACE(c.name + " " + flame_dtype_name(dt));
      std::mt19937_64 rng(seed_for(c.name + "count"));
      const Inputs in = make_inputs(c, rng);
      for (int rep = 0; rep < 2; ++rep) {  // the second call reuses the plans and counts again
        const Counts before = counts(ctx);
        Outcome r;
        run(ctx, c, dt, in, &r);
        if (HasFatalFailure()) return;
        const Counts after = counts(ctx);
        const uint64_t want = c.cudnn ? 1 : 0;
        EXPECT_EQ(after.fwd - before.fwd, want) << "forward attentions through cuDNN (FLAME_CUDNN_LOG=1 says why not)";
        EXPECT_EQ(after.bwd - before.bwd, want) << "backward attentions through cuDNN (FLAME_CUDNN_LOG=1 says why not)";
      }
    }
  EXPECT_EQ(bytes_in_use(ctx), held) << "cuDNN's workspaces go back to the pool";

  // Not cuDNN's: a mask, dropout, f32.
  std::mt19937_64 rng(seed_for("others"));
  const HT qh = random_ht({1, 2, 32, 64}, rng, 1.0);
  T q, k, v, mask, out;
  FLAME_ASSERT_OK(upload(ctx, qh, FLAME_DTYPE_BF16, q.out()));
  FLAME_ASSERT_OK(upload(ctx, qh, FLAME_DTYPE_BF16, k.out()));
  FLAME_ASSERT_OK(upload(ctx, qh, FLAME_DTYPE_BF16, v.out()));
  const Counts before = counts(ctx);
  const int64_t ms[2] = {32, 32};
  FLAME_ASSERT_OK(flame_ones(ctx, ms, 2, FLAME_DTYPE_BOOL, mask.out()));
  FLAME_ASSERT_OK(flame_scaled_dot_product_attention(q, k, v, mask, nullptr, out.out()));
  flame_attention_options_t o;
  flame_attention_options_init(&o);
  o.dropout_p = 0.25;
  FLAME_ASSERT_OK(flame_scaled_dot_product_attention(q, k, v, nullptr, &o, out.out()));
  T q32, k32, v32;
  FLAME_ASSERT_OK(upload(ctx, qh, FLAME_DTYPE_F32, q32.out()));
  FLAME_ASSERT_OK(upload(ctx, qh, FLAME_DTYPE_F32, k32.out()));
  FLAME_ASSERT_OK(upload(ctx, qh, FLAME_DTYPE_F32, v32.out()));
  FLAME_ASSERT_OK(flame_scaled_dot_product_attention(q32, k32, v32, nullptr, nullptr, out.out()));
  const Counts after = counts(ctx);
  EXPECT_EQ(after.fwd, before.fwd);
  EXPECT_EQ(after.bwd, before.bwd);
}

TEST(CudnnAttentionInfo, NullArgumentsAndDisabledContext) {
  FLAME_GPU_CONTEXT(ctx);
  uint64_t f = 0, b = 0;
  FLAME_EXPECT_STATUS(flame_ctx_cudnn_attention_info(nullptr, &f, &b), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_ctx_cudnn_attention_info(ctx, nullptr, &b), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("forward"), std::string::npos) << flame_last_error_message();
  FLAME_EXPECT_STATUS(flame_ctx_cudnn_attention_info(ctx, &f, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("backward"), std::string::npos) << flame_last_error_message();
  flame_ctx_destroy(ctx);
  // A context created with FLAME_DISABLE_CUDNN=1 runs attention on FLAME's kernels and counts nothing.
  flame_ctx_t off = cudnn_off_context();
  ASSERT_NE(off, nullptr);
  {
    T q, out;
    const int64_t s[4] = {1, 2, 16, 64};
    FLAME_ASSERT_OK(flame_ones(off, s, 4, FLAME_DTYPE_BF16, q.out()));
    FLAME_ASSERT_OK(flame_scaled_dot_product_attention(q, q, q, nullptr, nullptr, out.out()));
    HT oh;
    FLAME_ASSERT_OK(download(out, &oh));
    for (double v : oh.v) EXPECT_EQ(v, 1.0);  // the mean of equal values
    f = b = 7;
    FLAME_EXPECT_STATUS(flame_ctx_cudnn_attention_info(off, &f, &b), FLAME_OK);
    EXPECT_EQ(f, 0u);
    EXPECT_EQ(b, 0u);
  }
  flame_ctx_destroy(off);
}

}  // namespace

// The cuDNN path of the convolutions (src/runtime/cudnn.h) against FLAME's own kernels, through the
// C ABI. Every test needs a context that uses cuDNN and skips, saying so, where libcudnn.so.9 does
// not load in this process; a context that does not use it although the library loads fails.
//  - forward results and the gradients of x, weight and bias from a cuDNN context and from a context
//    created with FLAME_DISABLE_CUDNN=1 agree within the dtype's tolerance (two roundings), with the
//    same memory format (strides), for 3x3 'same', stride 2, dilation, groups, depthwise, 1x1, a
//    geometry cuDNN cannot express (even 'same' kernel: both run FLAME's kernels), conv_transpose2d
//    and conv1d; NCHW and channels-last; f32, f16, bf16;
//  - flame_ctx_cudnn_info: the forward, input-gradient and weight-gradient convolutions are counted
//    (so the fast path cannot silently be off), f64 and inexpressible geometries are not, and the
//    disabled context reports version 0;
//  - two runs through cuDNN give the same bits; second-order gradients through it match.
// Reproduce a failure with FLAME_GRADCHECK_SEED=<seed printed in the failure>.
#include <dlfcn.h>
#include <cmath>
#include <cstdlib>

#include "cudnn_pair.h"

using namespace gc;
using cudnn_pair::agree;
using cudnn_pair::Tol;
using cudnn_pair::cudnn_off_context;

namespace {

// ------------------------------------------------------------------ contexts

uint64_t cudnn_count(flame_ctx_t ctx) {
  int32_t version = 0;
  uint64_t n = 0;
  EXPECT_EQ(flame_ctx_cudnn_info(ctx, &version, &n), FLAME_OK) << flame_last_error_message();
  return n;
}

// ctx (uses cuDNN) and plain (FLAME_DISABLE_CUDNN=1). Skips when cuDNN is not installed.
class CudnnConv : public cudnn_pair::CudnnPair {
 protected:
  CudnnConv() : CudnnPair("the convolutions") {}
};

// ------------------------------------------------------------------ cases

enum class Op { Conv2d, ConvT, Conv1d };

struct Case {
  std::string name;
  Op op;
  Shape x, w;     // conv2d: [N, C, H, W], [O, C / G, kh, kw]; conv_transpose2d: [N, C_in, H, W], [C_in, C_out / G, kh, kw]; conv1d: 3-D
  int64_t bias;   // bias length, 0 for none
  std::vector<int64_t> stride, padding, dilation, output_padding;
  int64_t groups;
  int32_t same;
  flame_conv_options_t opts() const {
    flame_conv_options_t o;
    EXPECT_EQ(flame_conv_options_init(&o), FLAME_OK);
    for (size_t i = 0; i < 2; ++i) {
      o.stride[i] = stride[i];
      o.padding[i] = padding[i];
      o.dilation[i] = dilation[i];
      o.output_padding[i] = output_padding[i];
    }
    o.groups = groups;
    o.padding_same = same;
    return o;
  }
};

Case c2(std::string name, Shape x, Shape w, int64_t bias, std::vector<int64_t> s, std::vector<int64_t> p,
        std::vector<int64_t> d, int64_t g = 1, int32_t same = 0) {
  return {std::move(name), Op::Conv2d, std::move(x), std::move(w), bias, s, p, d, {0, 0}, g, same};
}

std::vector<Case> cases() {
  return {
      c2("3x3_same_pad", {2, 16, 9, 8}, {32, 16, 3, 3}, 32, {1, 1}, {1, 1}, {1, 1}),
      c2("3x3_padding_same", {1, 24, 7, 10}, {16, 24, 3, 3}, 0, {1, 1}, {0, 0}, {1, 1}, 1, 1),
      c2("stride2", {2, 16, 11, 10}, {24, 16, 3, 3}, 24, {2, 2}, {1, 1}, {1, 1}),
      c2("dilation2", {1, 8, 12, 11}, {16, 8, 3, 3}, 16, {1, 1}, {2, 2}, {2, 2}),
      c2("groups4", {2, 32, 7, 6}, {32, 8, 3, 3}, 32, {1, 1}, {1, 1}, {1, 1}, 4),
      c2("depthwise", {2, 16, 8, 8}, {16, 1, 3, 3}, 16, {1, 1}, {1, 1}, {1, 1}, 16),
      c2("1x1", {2, 64, 5, 7}, {48, 64, 1, 1}, 48, {1, 1}, {0, 0}, {1, 1}),
      c2("rect_stride21", {1, 8, 9, 8}, {16, 8, 2, 3}, 0, {2, 1}, {1, 2}, {1, 1}),
      // 'same' with an even kernel pads asymmetrically: cuDNN cannot express it (FLAME's kernels on both)
      c2("same_even_kernel_fallback", {1, 8, 6, 7}, {16, 8, 2, 4}, 16, {1, 1}, {0, 0}, {1, 1}, 1, 1),
      {"conv_transpose2d_up2", Op::ConvT, {2, 16, 5, 6}, {16, 8, 3, 3}, 8, {2, 2}, {1, 1}, {1, 1}, {1, 1}, 1, 0},
      {"conv_transpose2d_groups2", Op::ConvT, {1, 16, 4, 5}, {16, 12, 3, 3}, 24, {1, 1}, {1, 1}, {1, 1}, {0, 0}, 2, 0},
      {"conv1d_k3", Op::Conv1d, {2, 16, 20}, {24, 16, 3}, 24, {1, 1}, {1, 1}, {1, 1}, {0, 0}, 1, 0},
      {"conv1d_stride2_groups2", Op::Conv1d, {2, 16, 17}, {32, 8, 5}, 0, {2, 1}, {2, 0}, {1, 1}, {0, 0}, 2, 0},
  };
}

// Two approximations of the same values, each within one rounding of the dtype plus f32 sums.
Tol tol(flame_dtype_t d) {
  switch (d) {
    case FLAME_DTYPE_F32: return {2e-4, 4e-5};
    case FLAME_DTYPE_F16: return {8e-3, 4e-3};
    default: return {3.2e-2, 1.6e-2};  // bf16
  }
}

// The memory layout: strides, with 0 for axes of size 1 (their stride never addresses memory, so
// [C,1,3,3] with strides 9,9,3,1 and 9,1,3,1 is the same layout).
Shape strides(flame_tensor_t t) {
  Shape s = shape_of(t), st(s.size());
  if (!s.empty()) {
    EXPECT_EQ(flame_tensor_strides(t, st.data(), static_cast<int32_t>(st.size())), FLAME_OK);
  }
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] == 1) st[i] = 0;
  return st;
}

// Uploads h as dtype dt: contiguous, or channels-last (dense with the channel dim fastest) for a
// 3-D / 4-D tensor when cl.
void put(flame_ctx_t ctx, const HT& h, flame_dtype_t dt, bool cl, T* out, bool grad) {
  const size_t nd = h.shape.size();
  if (cl && nd >= 3) {
    const std::vector<int> to = nd == 4 ? std::vector<int>{0, 2, 3, 1} : std::vector<int>{0, 2, 1};
    const std::vector<int32_t> back = nd == 4 ? std::vector<int32_t>{0, 3, 1, 2} : std::vector<int32_t>{0, 2, 1};
    T base;
    ASSERT_EQ(upload(ctx, permute(h, to), dt, base.out()), FLAME_OK) << flame_last_error_message();
    ASSERT_EQ(flame_permute(base, back.data(), static_cast<int32_t>(nd), out->out()), FLAME_OK) << flame_last_error_message();
  } else {
    ASSERT_EQ(upload(ctx, h, dt, out->out()), FLAME_OK) << flame_last_error_message();
  }
  if (grad) {
    ASSERT_EQ(flame_tensor_set_requires_grad(*out, 1), FLAME_OK);
  }
}

// The op's output and the gradients of sum(out * gy) with respect to x, weight and bias.
struct Outcome {
  HT y, dx, dw, db;
  Shape y_strides, dx_strides, dw_strides;
};

flame_status_t call(const Case& c, flame_tensor_t x, flame_tensor_t w, flame_tensor_t b, flame_tensor_t* out) {
  const flame_conv_options_t o = c.opts();
  if (c.op == Op::ConvT) return flame_conv_transpose2d(x, w, b, &o, out);
  if (c.op == Op::Conv1d) return flame_conv1d(x, w, b, &o, out);
  return flame_conv2d(x, w, b, &o, out);
}

void run(flame_ctx_t ctx, const Case& c, flame_dtype_t dt, bool cl, const HT& xh, const HT& wh, const HT& bh,
         uint64_t gy_seed, Outcome* r) {
  T x, w, b, y;
  put(ctx, xh, dt, cl, &x, true);
  put(ctx, wh, dt, cl, &w, true);
  if (c.bias) put(ctx, bh, dt, false, &b, true);
  ASSERT_EQ(call(c, x, w, b, y.out()), FLAME_OK) << flame_last_error_message();
  ASSERT_EQ(download(y, &r->y), FLAME_OK);
  r->y_strides = strides(y);
  std::mt19937_64 rng(gy_seed);  // the same upstream gradient in both contexts
  HT gh(r->y.shape);
  std::uniform_real_distribution<double> u(-1, 1);
  for (double& v : gh.v) v = u(rng);
  T gy;
  put(ctx, gh, dt, cl, &gy, false);
  std::vector<flame_tensor_t> wrt = {x, w};
  if (c.bias) wrt.push_back(b);
  std::vector<flame_tensor_t> res(wrt.size(), nullptr);
  flame_tensor_t yh = y, gyh = gy;
  ASSERT_EQ(flame_grad(ctx, &yh, &gyh, 1, wrt.data(), static_cast<int32_t>(wrt.size()), 0, res.data()), FLAME_OK)
      << flame_last_error_message();
  T dx(res[0]), dw(res[1]), db(c.bias ? res[2] : nullptr);
  ASSERT_EQ(download(dx, &r->dx), FLAME_OK);
  ASSERT_EQ(download(dw, &r->dw), FLAME_OK);
  if (c.bias) {
    ASSERT_EQ(download(db, &r->db), FLAME_OK);
  }
  r->dx_strides = strides(dx);
  r->dw_strides = strides(dw);
}

HT random_ht(const Shape& s, std::mt19937_64& rng) {
  HT h(s);
  std::uniform_real_distribution<double> u(-1, 1);
  for (double& v : h.v) v = u(rng);
  return h;
}

uint64_t seed_for(const std::string& name) {
  uint64_t h = gc::seed() ^ 0xcd17ull;
  for (char ch : name) h = (h ^ static_cast<unsigned char>(ch)) * 0x100000001b3ull;
  return h;
}

// ------------------------------------------------------------------ tests

TEST_F(CudnnConv, MatchesFlameKernelsForwardAndGradients) {
  for (flame_dtype_t dt : {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_BF16})
    for (const Case& c : cases())
      for (bool cl : {false, true}) {
        const std::string name = c.name + (cl ? " channels-last " : " NCHW ") + flame_dtype_name(dt);
        SCOPED_TRACE(name + " FLAME_GRADCHECK_SEED=" + std::to_string(gc::seed()));
        std::mt19937_64 rng(seed_for(name));
        const int64_t bias_n = c.bias;
        const HT xh = random_ht(c.x, rng), wh = random_ht(c.w, rng), bh = random_ht({bias_n}, rng);
        const uint64_t gy_seed = rng();
        Outcome a, b;
        run(ctx, c, dt, cl, xh, wh, bh, gy_seed, &a);
        if (HasFatalFailure()) return;
        run(plain, c, dt, cl, xh, wh, bh, gy_seed, &b);
        if (HasFatalFailure()) return;
        EXPECT_TRUE(agree(a.y, b.y, tol(dt), "forward"));
        EXPECT_TRUE(agree(a.dx, b.dx, tol(dt), "dx"));
        EXPECT_TRUE(agree(a.dw, b.dw, tol(dt), "dweight"));
        if (c.bias) {
          EXPECT_TRUE(agree(a.db, b.db, tol(dt), "dbias"));
        }
        EXPECT_EQ(a.y_strides, b.y_strides) << "result memory format";
        EXPECT_EQ(a.dx_strides, b.dx_strides) << "input gradient memory format";
        EXPECT_EQ(a.dw_strides, b.dw_strides) << "weight gradient memory format";
      }
  EXPECT_EQ(cudnn_count(plain), 0u);
}

// The forward, input-gradient and weight-gradient convolution of one forward + backward: 3 each.
TEST_F(CudnnConv, IsUsedAndCountsEveryConvolution) {
  struct Use {
    Case c;
    flame_dtype_t dt;
    bool cl;
    uint64_t expected;
  };
  const std::vector<Use> uses = {
      {c2("bf16_cl_3x3", {4, 64, 16, 16}, {64, 64, 3, 3}, 64, {1, 1}, {1, 1}, {1, 1}), FLAME_DTYPE_BF16, true, 3},
      {c2("f16_cl_stride2", {2, 32, 12, 12}, {64, 32, 3, 3}, 0, {2, 2}, {1, 1}, {1, 1}), FLAME_DTYPE_F16, true, 3},
      {c2("f32_nchw_3x3", {2, 32, 16, 16}, {32, 32, 3, 3}, 32, {1, 1}, {1, 1}, {1, 1}), FLAME_DTYPE_F32, false, 3},
      {{"bf16_cl_transpose", Op::ConvT, {2, 32, 8, 8}, {32, 16, 3, 3}, 16, {2, 2}, {1, 1}, {1, 1}, {1, 1}, 1, 0},
       FLAME_DTYPE_BF16, true, 3},
      {{"bf16_conv1d", Op::Conv1d, {2, 32, 40}, {32, 32, 3}, 32, {1, 1}, {1, 1}, {1, 1}, {0, 0}, 1, 0}, FLAME_DTYPE_BF16, false, 3},
      // f64 and an asymmetric 'same' padding stay on FLAME's kernels
      {c2("f64_nchw", {1, 8, 6, 6}, {8, 8, 3, 3}, 8, {1, 1}, {1, 1}, {1, 1}), FLAME_DTYPE_F64, false, 0},
      {c2("bf16_same_even", {1, 16, 6, 7}, {16, 16, 2, 2}, 0, {1, 1}, {0, 0}, {1, 1}, 1, 1), FLAME_DTYPE_BF16, true, 0},
  };
  for (const Use& u : uses) {
    SCOPED_TRACE(u.c.name);
    std::mt19937_64 rng(seed_for(u.c.name));
    const HT xh = random_ht(u.c.x, rng), wh = random_ht(u.c.w, rng), bh = random_ht({u.c.bias}, rng);
    const uint64_t before = cudnn_count(ctx);
    Outcome r;
    run(ctx, u.c, u.dt, u.cl, xh, wh, bh, rng(), &r);
    if (HasFatalFailure()) return;
    EXPECT_EQ(cudnn_count(ctx) - before, u.expected) << "convolutions run through cuDNN";
  }
  // The same call again builds no new plan but still counts.
  std::mt19937_64 rng(seed_for("again"));
  const Case& c = uses[0].c;
  const HT xh = random_ht(c.x, rng), wh = random_ht(c.w, rng), bh = random_ht({c.bias}, rng);
  const uint64_t before = cudnn_count(ctx);
  Outcome r;
  run(ctx, c, FLAME_DTYPE_BF16, true, xh, wh, bh, rng(), &r);
  EXPECT_EQ(cudnn_count(ctx) - before, 3u);
}

uint64_t bytes_in_use(flame_ctx_t ctx) {
  flame_memory_stats_t m;
  m.struct_size = sizeof m;
  EXPECT_EQ(flame_ctx_memory_stats(ctx, &m), FLAME_OK);
  return m.bytes_in_use;
}

// Also: cuDNN's workspaces go back to the pool (bytes in use return to where they were).
TEST_F(CudnnConv, RepeatedRunsGiveIdenticalBits) {
  const Case c = c2("det", {4, 64, 12, 12}, {64, 64, 3, 3}, 64, {1, 1}, {1, 1}, {1, 1});
  const uint64_t held = bytes_in_use(ctx);
  for (flame_dtype_t dt : {FLAME_DTYPE_BF16, FLAME_DTYPE_F32}) {
    SCOPED_TRACE(flame_dtype_name(dt));
    std::mt19937_64 rng(seed_for(std::string("det") + flame_dtype_name(dt)));
    const HT xh = random_ht(c.x, rng), wh = random_ht(c.w, rng), bh = random_ht({c.bias}, rng);
    const uint64_t gy_seed = rng();
    Outcome a, b;
    run(ctx, c, dt, dt == FLAME_DTYPE_BF16, xh, wh, bh, gy_seed, &a);
    run(ctx, c, dt, dt == FLAME_DTYPE_BF16, xh, wh, bh, gy_seed, &b);
    if (HasFatalFailure()) return;
    EXPECT_EQ(a.y.v, b.y.v);
    EXPECT_EQ(a.dx.v, b.dx.v);
    EXPECT_EQ(a.dw.v, b.dw.v);
    EXPECT_EQ(a.db.v, b.db.v);
  }
  EXPECT_EQ(bytes_in_use(ctx), held);
}

// d/dw and d/dgy of sum(dx * v), dx = d sum(conv(x, w) * gy) / dx built with create_graph: the
// backward's convolutions differentiated again, through cuDNN in f32, against FLAME's kernels.
TEST_F(CudnnConv, SecondOrderGradientsMatchFlameKernels) {
  const Case c = c2("gg", {2, 8, 7, 6}, {16, 8, 3, 3}, 0, {1, 1}, {1, 1}, {1, 1});
  std::mt19937_64 rng(seed_for("gg"));
  const HT xh = random_ht(c.x, rng), wh = random_ht(c.w, rng), gyh = random_ht({2, 16, 7, 6}, rng),
           vh = random_ht(c.x, rng);
  auto second = [&](flame_ctx_t cx, HT* d2w, HT* d2gy) {
    T x, w, gy, v, y;
    put(cx, xh, FLAME_DTYPE_F32, false, &x, true);
    put(cx, wh, FLAME_DTYPE_F32, false, &w, true);
    put(cx, gyh, FLAME_DTYPE_F32, false, &gy, true);
    put(cx, vh, FLAME_DTYPE_F32, false, &v, false);
    ASSERT_EQ(call(c, x, w, nullptr, y.out()), FLAME_OK) << flame_last_error_message();
    flame_tensor_t yh = y, gh = gy, xin = x;
    flame_tensor_t dx_h = nullptr;
    ASSERT_EQ(flame_grad(cx, &yh, &gh, 1, &xin, 1, FLAME_BACKWARD_CREATE_GRAPH, &dx_h), FLAME_OK)
        << flame_last_error_message();
    T dx(dx_h), dv, s;
    ASSERT_EQ(flame_mul(dx, v, dv.out()), FLAME_OK);
    ASSERT_EQ(flame_sum_all(dv, s.out()), FLAME_OK);
    flame_tensor_t sh = s, ins[2] = {w, gy}, outs[2] = {nullptr, nullptr};
    ASSERT_EQ(flame_grad(cx, &sh, nullptr, 1, ins, 2, 0, outs), FLAME_OK) << flame_last_error_message();
    T a(outs[0]), b(outs[1]);
    ASSERT_EQ(download(a, d2w), FLAME_OK);
    ASSERT_EQ(download(b, d2gy), FLAME_OK);
  };
  HT w1, g1, w2, g2;
  const uint64_t before = cudnn_count(ctx);
  second(ctx, &w1, &g1);
  if (HasFatalFailure()) return;
  EXPECT_GT(cudnn_count(ctx), before);
  second(plain, &w2, &g2);
  if (HasFatalFailure()) return;
  EXPECT_TRUE(agree(w1, w2, tol(FLAME_DTYPE_F32), "d2 / dweight"));
  EXPECT_TRUE(agree(g1, g2, tol(FLAME_DTYPE_F32), "d2 / dgy"));
}

TEST(CudnnInfo, NullArgumentsAndDisabledContext) {
  FLAME_GPU_CONTEXT(ctx);
  int32_t version = 0;
  uint64_t n = 0;
  FLAME_EXPECT_STATUS(flame_ctx_cudnn_info(nullptr, &version, &n), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_ctx_cudnn_info(ctx, nullptr, &n), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("version"), std::string::npos) << flame_last_error_message();
  FLAME_EXPECT_STATUS(flame_ctx_cudnn_info(ctx, &version, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("convolutions"), std::string::npos) << flame_last_error_message();
  flame_ctx_destroy(ctx);
  // A context created with FLAME_DISABLE_CUDNN=1 never loads cuDNN, and its convolutions still work.
  flame_ctx_t off = cudnn_off_context();
  ASSERT_NE(off, nullptr);
  {
    T x, w, y;
    ASSERT_EQ(upload(off, HT({1, 4, 5, 5}, 0.5), FLAME_DTYPE_BF16, x.out()), FLAME_OK);
    ASSERT_EQ(upload(off, HT({8, 4, 3, 3}, 0.25), FLAME_DTYPE_BF16, w.out()), FLAME_OK);
    ASSERT_EQ(flame_conv2d(x, w, nullptr, nullptr, y.out()), FLAME_OK) << flame_last_error_message();
    HT yh;
    ASSERT_EQ(download(y, &yh), FLAME_OK);
    for (double v : yh.v) EXPECT_EQ(v, 4 * 9 * 0.125);  // exact in bf16
    version = -1;
    n = 7;
    FLAME_EXPECT_STATUS(flame_ctx_cudnn_info(off, &version, &n), FLAME_OK);
    EXPECT_EQ(version, 0);
    EXPECT_EQ(n, 0u);
  }
  flame_ctx_destroy(off);
}

}  // namespace

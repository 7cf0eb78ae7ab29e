// Distributed training over NCCL (flame.h "Distributed"): communicators, collectives against host
// references, data parallelism against gradient accumulation on one GPU, and failures that must
// reach every rank instead of hanging.
//
// Ranks run in one process: one context per GPU, one thread per rank (NCCL needs the ranks driven
// concurrently); Dist2.OneProcessPerGpu runs them as two processes (this binary re-executed). World-size-1 tests run on any GPU. Two-GPU tests skip on a machine with fewer GPUs,
// unless FLAME_REQUIRE_GPUS=2 (or more) is set: then the missing GPU is a failure. Without NCCL the
// tests skip, unless FLAME_REQUIRE_GPU=1 or FLAME_REQUIRE_GPUS is set.
//
// On a 2-GPU machine: FLAME_REQUIRE_GPUS=2 ./build/tests/gpu/flame_gpu_tests --gtest_filter='Dist*'
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>
#include "flame_test.h"
#include "rank_test_helpers.h"

extern char** environ;

namespace {




flame_ctx_t make_ctx(int device, uint64_t seed = 1234) {
  flame_ctx_options_t o;
  flame_ctx_options_init(&o);
  o.device = device;
  o.seed = seed;
  o.gemm_heuristic_only = 1;  // the same GEMM algorithm in every context: comparable results
  flame_ctx_t c = nullptr;
  return flame_ctx_create(&o, &c) == FLAME_OK ? c : nullptr;
}

flame_comm_options_t comm_opts(int64_t timeout_ms) {
  flame_comm_options_t o;
  flame_comm_options_init(&o);
  o.timeout_ms = timeout_ms;
  return o;
}

// A world of `world` ranks on GPUs 0..world-1: contexts made here, communicators made concurrently
// by one thread per rank, then body(rank, ctx, comm) on each rank's thread.
struct World {
  std::vector<flame_ctx_t> ctxs;
  std::vector<flame_comm_t> comms;
  ~World();
};


World::~World() {  // communicators are released on every rank concurrently, as they are created
  on_ranks(static_cast<int>(comms.size()), [&](int r) { flame_comm_release(comms[static_cast<size_t>(r)]); });
  for (flame_ctx_t c : ctxs) flame_ctx_destroy(c);
}

bool make_world(World& w, int world, int64_t timeout_ms = 60000) {
  for (int r = 0; r < world; ++r) {
    w.ctxs.push_back(make_ctx(r, 1000 + static_cast<uint64_t>(r)));
    if (!w.ctxs.back()) {
      ADD_FAILURE() << "context on GPU " << r << ": " << flame_last_error_message();
      return false;
    }
  }
  flame_comm_id_t id;
  flame_status_t st = flame_comm_unique_id(w.ctxs[0], &id);
  if (st != FLAME_OK) {
    ADD_FAILURE() << "flame_comm_unique_id: " << flame_last_error_message();
    return false;
  }
  w.comms.assign(static_cast<size_t>(world), nullptr);
  const flame_comm_options_t o = comm_opts(timeout_ms);
  std::vector<flame_status_t> sts(static_cast<size_t>(world));
  std::vector<std::string> msgs(static_cast<size_t>(world));
  on_ranks(world, [&](int r) {
    sts[r] = flame_comm_create(w.ctxs[r], &id, r, world, &o, &w.comms[r]);
    msgs[r] = flame_last_error_message();
  });
  for (int r = 0; r < world; ++r)
    if (sts[r] != FLAME_OK) {
      ADD_FAILURE() << "flame_comm_create rank " << r << ": " << flame_status_string(sts[r]) << " " << msgs[r];
      return false;
    }
  return true;
}

// ---- tensors and host values (from_doubles / to_doubles: rank_test_helpers.h; the values are small
// integers, exact in every dtype) ----

std::vector<int64_t> shape_of(flame_tensor_t t) {
  int32_t nd = 0;
  flame_tensor_ndim(t, &nd);
  std::vector<int64_t> s(static_cast<size_t>(nd));
  if (nd) flame_tensor_shape(t, s.data(), nd);
  return s;
}

// Rank r's data: integers in [-8, 8] (sums of two stay exact in f16 and bf16).
std::vector<double> rank_values(int r, size_t n, uint32_t salt) {
  std::mt19937 g(1234u + 7919u * static_cast<uint32_t>(r) + salt);
  std::uniform_int_distribution<int> u(-8, 8);
  std::vector<double> v(n);
  for (double& x : v) {
    x = u(g);
    if (x == 0) x = 1;  // non-zero inputs
  }
  return v;
}

double reduce_ref(int32_t op, const std::vector<double>& xs, bool integer) {
  double s = 0, mx = -INFINITY, mn = INFINITY;
  for (double x : xs) {
    s += x;
    mx = std::max(mx, x);
    mn = std::min(mn, x);
  }
  switch (op) {
    case FLAME_REDUCE_SUM: return s;
    case FLAME_REDUCE_AVG: return integer ? std::trunc(s / xs.size()) : s / static_cast<double>(xs.size());
    case FLAME_REDUCE_MAX: return mx;
    default: return mn;
  }
}

// ================= world size 1 (any GPU) =================

TEST(Dist, UnsupportedWithoutNccl) {
  FLAME_GPU_CONTEXT(ctx);
  setenv("FLAME_NCCL_PATH", "/nonexistent/libnccl.so.2", 1);
  flame_comm_id_t id;
  id.internal[0] = 0x5a;
  FLAME_EXPECT_STATUS(flame_comm_unique_id(ctx, &id), FLAME_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(flame_last_error_message()).find("NCCL"), std::string::npos) << flame_last_error_message();
  EXPECT_EQ(id.internal[0], 0) << "the id is cleared on failure";
  flame_comm_id_t zero{};
  flame_comm_t comm = reinterpret_cast<flame_comm_t>(0x1);
  FLAME_EXPECT_STATUS(flame_comm_create(ctx, &zero, 0, 1, nullptr, &comm), FLAME_ERROR_UNSUPPORTED);
  EXPECT_EQ(comm, nullptr);
  flame_comm_t comms[1] = {reinterpret_cast<flame_comm_t>(0x1)};
  FLAME_EXPECT_STATUS(flame_comm_create_group(&ctx, 1, nullptr, comms), FLAME_ERROR_UNSUPPORTED);
  EXPECT_EQ(comms[0], nullptr);
  unsetenv("FLAME_NCCL_PATH");
  flame_ctx_destroy(ctx);
}

TEST(Dist, World1CollectivesAndArgumentErrors) {
  NEED_GPUS_AND_NCCL(1);
  World w;
  ASSERT_TRUE(make_world(w, 1));
  flame_ctx_t ctx = w.ctxs[0];
  flame_comm_t comm = w.comms[0];
  int32_t rank = -1, size = -1;
  FLAME_ASSERT_OK(flame_comm_rank(comm, &rank));
  FLAME_ASSERT_OK(flame_comm_size(comm, &size));
  EXPECT_EQ(rank, 0);
  EXPECT_EQ(size, 1);

  const std::vector<double> v = rank_values(0, 12, 1);
  for (int32_t op : {FLAME_REDUCE_SUM, FLAME_REDUCE_AVG, FLAME_REDUCE_MAX, FLAME_REDUCE_MIN}) {
    T t(from_doubles(ctx, v, {3, 4}, FLAME_DTYPE_F32));
    FLAME_ASSERT_OK(flame_comm_all_reduce(comm, t, op));
    FLAME_ASSERT_OK(flame_comm_synchronize(comm));
    EXPECT_EQ(to_doubles(t), v) << "op " << op;
  }
  {
    T t(from_doubles(ctx, v, {3, 4}, FLAME_DTYPE_BF16)), g, s;
    FLAME_ASSERT_OK(flame_comm_broadcast(comm, t, 0));
    FLAME_ASSERT_OK(flame_comm_all_gather(comm, t, g.out()));
    FLAME_ASSERT_OK(flame_comm_reduce_scatter(comm, t, FLAME_REDUCE_SUM, s.out()));
    FLAME_ASSERT_OK(flame_comm_synchronize(comm));
    EXPECT_EQ(to_doubles(t), v);
    EXPECT_EQ(to_doubles(g), v);
    EXPECT_EQ(shape_of(g), (std::vector<int64_t>{3, 4}));
    EXPECT_EQ(to_doubles(s), v);
  }

  // ---- argument errors: nothing changes ----
  T x(from_doubles(ctx, v, {3, 4}, FLAME_DTYPE_F32));
  FLAME_EXPECT_STATUS(flame_comm_all_reduce(comm, x, 7), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_comm_broadcast(comm, x, 1), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_comm_broadcast(comm, x, -1), FLAME_ERROR_INVALID_ARGUMENT);
  T xi(from_doubles(ctx, v, {3, 4}, FLAME_DTYPE_I32));
  FLAME_EXPECT_STATUS(flame_comm_all_reduce(comm, xi, FLAME_REDUCE_AVG), FLAME_ERROR_DTYPE_MISMATCH);
  T xb(from_doubles(ctx, v, {3, 4}, FLAME_DTYPE_BOOL));
  FLAME_EXPECT_STATUS(flame_comm_all_reduce(comm, xb, FLAME_REDUCE_MAX), FLAME_ERROR_DTYPE_MISMATCH);
  T xt;
  FLAME_ASSERT_OK(flame_transpose(x, 0, 1, xt.out()));
  FLAME_EXPECT_STATUS(flame_comm_all_reduce(comm, xt, FLAME_REDUCE_SUM), FLAME_ERROR_INVALID_ARGUMENT);
  T s0;
  FLAME_EXPECT_STATUS(flame_comm_reduce_scatter(comm, T(from_doubles(ctx, {2.0}, {}, FLAME_DTYPE_F32)), FLAME_REDUCE_SUM, s0.out()),
                      FLAME_ERROR_SHAPE_MISMATCH);
  EXPECT_EQ(s0.h, nullptr);
  T leaf(from_doubles(ctx, v, {3, 4}, FLAME_DTYPE_F32)), g;
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(leaf, 1));
  FLAME_EXPECT_STATUS(flame_comm_all_reduce(comm, leaf, FLAME_REDUCE_SUM), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_comm_all_gather(comm, leaf, g.out()), FLAME_ERROR_NOT_DIFFERENTIABLE);
  EXPECT_EQ(g.h, nullptr);
  int32_t prev = 1;
  FLAME_ASSERT_OK(flame_ctx_set_grad_enabled(ctx, 0, &prev));
  FLAME_EXPECT_STATUS(flame_comm_all_reduce(comm, leaf, FLAME_REDUCE_SUM), FLAME_OK);  // grad mode off: allowed
  FLAME_ASSERT_OK(flame_ctx_set_grad_enabled(ctx, prev, nullptr));
  // A tensor of another context.
  flame_ctx_t other = make_ctx(0);
  ASSERT_NE(other, nullptr);
  {
    T y(from_doubles(other, v, {3, 4}, FLAME_DTYPE_F32));
    FLAME_EXPECT_STATUS(flame_comm_all_reduce(comm, y, FLAME_REDUCE_SUM), FLAME_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flame_last_error_message()).find("context"), std::string::npos);
  }
  flame_ctx_destroy(other);
  FLAME_ASSERT_OK(flame_comm_synchronize(comm));
  EXPECT_EQ(to_doubles(x), v);

  // ---- creation arguments ----
  flame_comm_id_t id{};
  flame_comm_t bad = nullptr;
  FLAME_EXPECT_STATUS(flame_comm_create(ctx, &id, 1, 1, nullptr, &bad), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_comm_create(ctx, &id, 0, 0, nullptr, &bad), FLAME_ERROR_INVALID_ARGUMENT);
  flame_comm_options_t o = comm_opts(0);
  FLAME_EXPECT_STATUS(flame_comm_create(ctx, &id, 0, 1, &o, &bad), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(bad, nullptr);
}

TEST(Dist, World1CreateGroup) {
  NEED_GPUS_AND_NCCL(1);
  flame_ctx_t ctx = make_ctx(0);
  ASSERT_NE(ctx, nullptr);
  flame_comm_t comm = nullptr;
  FLAME_ASSERT_OK(flame_comm_create_group(&ctx, 1, nullptr, &comm));
  const std::vector<double> v = rank_values(0, 6, 2);
  {
    T t(from_doubles(ctx, v, {6}, FLAME_DTYPE_F64));
    FLAME_ASSERT_OK(flame_comm_all_reduce(comm, t, FLAME_REDUCE_SUM));
    FLAME_ASSERT_OK(flame_comm_synchronize(comm));
    EXPECT_EQ(to_doubles(t), v);
  }
  flame_ctx_t twice[2] = {ctx, ctx};
  flame_comm_t two[2] = {nullptr, nullptr};
  FLAME_EXPECT_STATUS(flame_comm_create_group(twice, 2, nullptr, two), FLAME_ERROR_INVALID_ARGUMENT);
  flame_comm_release(comm);
  flame_comm_release(comm);  // released: detected, nothing happens
  int32_t r = 0;
  FLAME_EXPECT_STATUS(flame_comm_rank(comm, &r), FLAME_ERROR_INVALID_HANDLE);
  flame_ctx_destroy(ctx);
}

// ---- a small MLP: y = W2 relu(W1 x + b1) + b2, mse loss ----
constexpr int kIn = 8, kHidden = 16, kOut = 4;

struct Mlp {
  T w1, b1, w2, b2;
  std::vector<flame_tensor_t> params() const { return {w1.h, b1.h, w2.h, b2.h}; }
};

std::vector<double> init_values(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<double> d(0.0, 0.3);
  std::vector<double> v(n);
  for (double& x : v) x = d(g);
  return v;
}

// The model on ctx, from the fixed initial values, or from `garbage` values (another rank's model
// before the broadcast of flame_dp_create).
bool make_mlp(flame_ctx_t ctx, Mlp& m, bool garbage = false) {
  auto make = [&](T& t, std::vector<int64_t> shape, uint32_t seed) {
    size_t n = 1;
    for (int64_t s : shape) n *= static_cast<size_t>(s);
    std::vector<double> v = garbage ? std::vector<double>(n, 0.25) : init_values(n, seed);
    t = T(from_doubles(ctx, v, shape, FLAME_DTYPE_F32));
    return t.h && flame_tensor_set_requires_grad(t, 1) == FLAME_OK;
  };
  return make(m.w1, {kHidden, kIn}, 1) && make(m.b1, {kHidden}, 2) && make(m.w2, {kOut, kHidden}, 3) && make(m.b2, {kOut}, 4);
}

// loss = scale * mse(mlp(x), y); backward.
flame_status_t forward_backward(flame_ctx_t ctx, const Mlp& m, const std::vector<double>& x, const std::vector<double>& y,
                                int64_t rows, double scale) {
  T xs(from_doubles(ctx, x, {rows, kIn}, FLAME_DTYPE_F32)), ys(from_doubles(ctx, y, {rows, kOut}, FLAME_DTYPE_F32));
  T h, out, loss, scaled;
  flame_status_t st;
  if ((st = flame_linear(xs, m.w1, m.b1, FLAME_ACTIVATION_RELU, h.out())) != FLAME_OK) return st;
  if ((st = flame_linear(h, m.w2, m.b2, FLAME_ACTIVATION_NONE, out.out())) != FLAME_OK) return st;
  if ((st = flame_mse_loss(out, ys, FLAME_REDUCTION_MEAN, loss.out())) != FLAME_OK) return st;
  if ((st = flame_mul_scalar(loss, scale, scaled.out())) != FLAME_OK) return st;
  return flame_backward(ctx, scaled, nullptr, 0);
}

flame_optimizer_t make_sgd(flame_ctx_t ctx, const Mlp& m) {
  flame_optimizer_options_t o;
  flame_optimizer_options_init(&o, FLAME_OPTIMIZER_SGD);
  o.lr = 0.1;
  o.momentum = 0.9;
  std::vector<flame_tensor_t> ps = m.params();
  flame_optimizer_t opt = nullptr;
  flame_optimizer_create(ctx, &o, ps.data(), static_cast<int64_t>(ps.size()), &opt);
  return opt;
}

std::vector<double> all_params(const Mlp& m) {
  std::vector<double> all;
  for (flame_tensor_t p : m.params()) {
    std::vector<double> v = to_doubles(p);
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

std::vector<double> batch(size_t rows, size_t cols, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> v(rows * cols);
  for (double& x : v) x = u(g);
  return v;
}

std::vector<double> rows_of(const std::vector<double>& v, size_t cols, size_t first, size_t count) {
  return std::vector<double>(v.begin() + static_cast<std::ptrdiff_t>(first * cols),
                             v.begin() + static_cast<std::ptrdiff_t>((first + count) * cols));
}

TEST(Dist, World1DataParallelGradientsAreLocalGradients) {
  NEED_GPUS_AND_NCCL(1);
  World w;
  ASSERT_TRUE(make_world(w, 1));
  flame_ctx_t ctx = w.ctxs[0];
  Mlp m, ref;
  ASSERT_TRUE(make_mlp(ctx, m));
  ASSERT_TRUE(make_mlp(ctx, ref));
  flame_dp_options_t o;
  FLAME_ASSERT_OK(flame_dp_options_init(&o));
  EXPECT_EQ(o.bucket_bytes, uint64_t{64} << 20);
  o.bucket_bytes = 256;  // several buckets for this small model
  std::vector<flame_tensor_t> ps = m.params();
  flame_dp_t dp = nullptr;
  FLAME_ASSERT_OK(flame_dp_create(w.comms[0], ps.data(), 4, &o, &dp));
  const size_t B = 6;
  const std::vector<double> x = batch(2 * B, kIn, 11), y = batch(2 * B, kOut, 12);
  // Accumulation: micro-step 1 without sync, micro-step 2 with sync.
  FLAME_ASSERT_OK(flame_dp_set_sync(dp, 0));
  FLAME_ASSERT_OK(forward_backward(ctx, m, rows_of(x, kIn, 0, B), rows_of(y, kOut, 0, B), B, 0.5));
  FLAME_ASSERT_OK(flame_dp_wait(dp));  // sync off: nothing
  FLAME_ASSERT_OK(flame_dp_set_sync(dp, 1));
  FLAME_ASSERT_OK(forward_backward(ctx, m, rows_of(x, kIn, B, B), rows_of(y, kOut, B, B), B, 0.5));
  FLAME_ASSERT_OK(flame_dp_wait(dp));
  FLAME_ASSERT_OK(forward_backward(ctx, ref, rows_of(x, kIn, 0, B), rows_of(y, kOut, 0, B), B, 0.5));
  FLAME_ASSERT_OK(forward_backward(ctx, ref, rows_of(x, kIn, B, B), rows_of(y, kOut, B, B), B, 0.5));
  for (size_t i = 0; i < 4; ++i) {
    T g, gr;
    FLAME_ASSERT_OK(flame_tensor_grad(m.params()[i], g.out()));
    FLAME_ASSERT_OK(flame_tensor_grad(ref.params()[i], gr.out()));
    ASSERT_NE(g.h, nullptr);
    std::vector<double> a = to_doubles(g), b = to_doubles(gr);
    ASSERT_EQ(a.size(), b.size());
    for (size_t k = 0; k < a.size(); ++k) EXPECT_NEAR(a[k], b[k], 1e-6 + 1e-5 * std::fabs(b[k])) << "param " << i << " elem " << k;
  }
  // A second backward with sync on before flame_dp_wait: the hook reports it.
  FLAME_ASSERT_OK(forward_backward(ctx, m, rows_of(x, kIn, 0, B), rows_of(y, kOut, 0, B), B, 1.0));
  FLAME_EXPECT_STATUS(forward_backward(ctx, m, rows_of(x, kIn, 0, B), rows_of(y, kOut, 0, B), B, 1.0),
                      FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("flame_dp_wait"), std::string::npos) << flame_last_error_message();
  FLAME_ASSERT_OK(flame_dp_wait(dp));
  flame_dp_release(dp);
  flame_dp_release(dp);  // released: detected, nothing happens
  FLAME_EXPECT_STATUS(flame_dp_wait(dp), FLAME_ERROR_INVALID_HANDLE);
  // After release the hooks are gone: backward twice works.
  FLAME_ASSERT_OK(forward_backward(ctx, m, rows_of(x, kIn, 0, B), rows_of(y, kOut, 0, B), B, 1.0));
  FLAME_ASSERT_OK(forward_backward(ctx, m, rows_of(x, kIn, 0, B), rows_of(y, kOut, 0, B), B, 1.0));

  // Bad parameter lists.
  T plain(from_doubles(ctx, {1, 2, 3}, {3}, FLAME_DTYPE_F32)), nonleaf;
  flame_dp_t bad = nullptr;
  FLAME_EXPECT_STATUS(flame_dp_create(w.comms[0], &plain.h, 1, nullptr, &bad), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_ASSERT_OK(flame_mul_scalar(m.w1, 2.0, nonleaf.out()));
  FLAME_EXPECT_STATUS(flame_dp_create(w.comms[0], &nonleaf.h, 1, nullptr, &bad), FLAME_ERROR_INVALID_ARGUMENT);
  flame_tensor_t twice[2] = {m.w1.h, m.w1.h};
  FLAME_EXPECT_STATUS(flame_dp_create(w.comms[0], twice, 2, nullptr, &bad), FLAME_ERROR_INVALID_ARGUMENT);
  o.bucket_bytes = 0;
  FLAME_EXPECT_STATUS(flame_dp_create(w.comms[0], ps.data(), 4, &o, &bad), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(bad, nullptr);
}

// ================= two GPUs =================

TEST(Dist2, CollectivesMatchHostReference) {
  NEED_GPUS_AND_NCCL(2);
  World w;
  ASSERT_TRUE(make_world(w, 2));
  const int world = 2;
  const std::vector<int64_t> shape{4, 6};
  const size_t n = 24;
  for (flame_dtype_t d : {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_F64, FLAME_DTYPE_I32, FLAME_DTYPE_I64}) {
    SCOPED_TRACE(flame_dtype_name(d));
    const bool integer = d == FLAME_DTYPE_I32 || d == FLAME_DTYPE_I64;
    std::vector<std::vector<double>> in;
    for (int r = 0; r < world; ++r) in.push_back(rank_values(r, n, static_cast<uint32_t>(d)));
    on_ranks(world, [&](int r) {
      flame_ctx_t ctx = w.ctxs[r];
      flame_comm_t comm = w.comms[r];
      for (int32_t op : {FLAME_REDUCE_SUM, FLAME_REDUCE_AVG, FLAME_REDUCE_MAX, FLAME_REDUCE_MIN}) {
        if (integer && op == FLAME_REDUCE_AVG) continue;
        T t(from_doubles(ctx, in[r], shape, d));
        EXPECT_EQ(flame_comm_all_reduce(comm, t, op), FLAME_OK) << flame_last_error_message();
        EXPECT_EQ(flame_comm_synchronize(comm), FLAME_OK) << flame_last_error_message();
        std::vector<double> got = to_doubles(t);
        ASSERT_EQ(got.size(), n);
        for (size_t k = 0; k < n; ++k)
          EXPECT_EQ(got[k], reduce_ref(op, {in[0][k], in[1][k]}, integer)) << "rank " << r << " op " << op << " elem " << k;
      }
      {  // broadcast from rank 1
        T t(from_doubles(ctx, in[r], shape, d));
        EXPECT_EQ(flame_comm_broadcast(comm, t, 1), FLAME_OK) << flame_last_error_message();
        EXPECT_EQ(flame_comm_synchronize(comm), FLAME_OK);
        EXPECT_EQ(to_doubles(t), in[1]) << "rank " << r;
      }
      {  // all_gather of a strided input: rank 0's transpose, then rank 1's
        T t(from_doubles(ctx, in[r], shape, d)), tt, g;
        EXPECT_EQ(flame_transpose(t, 0, 1, tt.out()), FLAME_OK);
        EXPECT_EQ(flame_comm_all_gather(comm, tt, g.out()), FLAME_OK) << flame_last_error_message();
        EXPECT_EQ(flame_comm_synchronize(comm), FLAME_OK);
        EXPECT_EQ(shape_of(g), (std::vector<int64_t>{12, 4}));
        std::vector<double> got = to_doubles(g), want;
        for (int q = 0; q < world; ++q)
          for (int64_t i = 0; i < 6; ++i)
            for (int64_t j = 0; j < 4; ++j) want.push_back(in[q][static_cast<size_t>(j * 6 + i)]);
        EXPECT_EQ(got, want) << "rank " << r;
      }
      {  // reduce_scatter (sum): rank r gets rows [2r, 2r+2) of the sum
        T t(from_doubles(ctx, in[r], shape, d)), s;
        EXPECT_EQ(flame_comm_reduce_scatter(comm, t, FLAME_REDUCE_SUM, s.out()), FLAME_OK) << flame_last_error_message();
        EXPECT_EQ(flame_comm_synchronize(comm), FLAME_OK);
        EXPECT_EQ(shape_of(s), (std::vector<int64_t>{2, 6}));
        std::vector<double> got = to_doubles(s);
        ASSERT_EQ(got.size(), 12u);
        for (size_t k = 0; k < 12; ++k) {
          const size_t e = static_cast<size_t>(r) * 12 + k;
          EXPECT_EQ(got[k], in[0][e] + in[1][e]) << "rank " << r << " elem " << k;
        }
      }
    });
  }
}

TEST(Dist2, CreateGroupFromOneThread) {
  NEED_GPUS_AND_NCCL(2);
  flame_ctx_t ctxs[2] = {make_ctx(0), make_ctx(1)};
  ASSERT_NE(ctxs[0], nullptr);
  ASSERT_NE(ctxs[1], nullptr);
  flame_comm_t comms[2] = {nullptr, nullptr};
  flame_comm_options_t o = comm_opts(60000);
  FLAME_ASSERT_OK(flame_comm_create_group(ctxs, 2, &o, comms));
  int32_t r1 = -1;
  FLAME_ASSERT_OK(flame_comm_rank(comms[1], &r1));
  EXPECT_EQ(r1, 1);
  on_ranks(2, [&](int r) {
    T t(from_doubles(ctxs[r], {static_cast<double>(r + 1), 10.0}, {2}, FLAME_DTYPE_F32));
    EXPECT_EQ(flame_comm_all_reduce(comms[r], t, FLAME_REDUCE_SUM), FLAME_OK) << flame_last_error_message();
    EXPECT_EQ(flame_comm_synchronize(comms[r]), FLAME_OK) << flame_last_error_message();
    EXPECT_EQ(to_doubles(t), (std::vector<double>{3.0, 20.0}));
  });
  on_ranks(2, [&](int r) { flame_comm_release(comms[r]); });  // releases wait for peers: concurrently
  flame_ctx_destroy(ctxs[0]);
  flame_ctx_destroy(ctxs[1]);
}

// 2 GPUs x batch B (each rank in two micro-steps of B/2, sync off on the first) must train the
// same parameters as 1 GPU with batch B accumulated twice (rank 0's rows, then rank 1's).
TEST(Dist2, DataParallelMatchesGradientAccumulation) {
  NEED_GPUS_AND_NCCL(2);
  const size_t B = 8, H = B / 2;
  const int steps = 3;
  std::vector<std::vector<double>> xs, ys;  // per step: 2B rows (rank 0's B, then rank 1's B)
  for (int s = 0; s < steps; ++s) {
    xs.push_back(batch(2 * B, kIn, 100 + static_cast<uint32_t>(s)));
    ys.push_back(batch(2 * B, kOut, 200 + static_cast<uint32_t>(s)));
  }

  // Reference: one GPU, batch B accumulated twice.
  std::vector<double> want;
  {
    flame_ctx_t ctx = make_ctx(0);
    ASSERT_NE(ctx, nullptr);
    {
      Mlp m;
      ASSERT_TRUE(make_mlp(ctx, m));
      flame_optimizer_t opt = make_sgd(ctx, m);
      ASSERT_NE(opt, nullptr);
      for (int s = 0; s < steps; ++s) {
        for (size_t half = 0; half < 2; ++half)
          FLAME_ASSERT_OK(forward_backward(ctx, m, rows_of(xs[s], kIn, half * B, B), rows_of(ys[s], kOut, half * B, B), B, 0.5));
        FLAME_ASSERT_OK(flame_optimizer_step(opt));
        FLAME_ASSERT_OK(flame_optimizer_zero_grad(opt, 1));
      }
      want = all_params(m);
      flame_optimizer_release(opt);
    }
    flame_ctx_destroy(ctx);
  }

  World w;
  ASSERT_TRUE(make_world(w, 2));
  std::vector<std::vector<double>> got(2);
  on_ranks(2, [&](int r) {
    flame_ctx_t ctx = w.ctxs[r];
    Mlp m;
    ASSERT_TRUE(make_mlp(ctx, m, /*garbage=*/r != 0));  // rank 1 starts elsewhere: the broadcast fixes it
    flame_dp_options_t o;
    flame_dp_options_init(&o);
    o.bucket_bytes = 512;  // several buckets, launched during backward
    std::vector<flame_tensor_t> ps = m.params();
    flame_dp_t dp = nullptr;
    ASSERT_EQ(flame_dp_create(w.comms[r], ps.data(), 4, &o, &dp), FLAME_OK) << flame_last_error_message();
    flame_optimizer_t opt = make_sgd(ctx, m);
    ASSERT_NE(opt, nullptr);
    for (int s = 0; s < steps; ++s) {
      for (size_t micro = 0; micro < 2; ++micro) {
        EXPECT_EQ(flame_dp_set_sync(dp, micro == 1 ? 1 : 0), FLAME_OK);
        const size_t first = static_cast<size_t>(r) * B + micro * H;
        EXPECT_EQ(forward_backward(ctx, m, rows_of(xs[s], kIn, first, H), rows_of(ys[s], kOut, first, H), H, 0.5), FLAME_OK)
            << flame_last_error_message();
      }
      EXPECT_EQ(flame_dp_wait(dp), FLAME_OK) << flame_last_error_message();
      EXPECT_EQ(flame_optimizer_step(opt), FLAME_OK);
      EXPECT_EQ(flame_optimizer_zero_grad(opt, 1), FLAME_OK);
    }
    got[r] = all_params(m);
    flame_optimizer_release(opt);
    flame_dp_release(dp);
  });
  ASSERT_EQ(got[0].size(), want.size());
  EXPECT_EQ(got[0], got[1]) << "both ranks hold the same parameters";
  for (size_t k = 0; k < want.size(); ++k) EXPECT_NEAR(got[0][k], want[k], 1e-5 + 1e-4 * std::fabs(want[k])) << "elem " << k;
}

// A rank whose model differs makes every rank fail, quickly (no timeout needed), and the
// communicator stays usable.
TEST(Dist2, MismatchedParametersFailOnEveryRank) {
  NEED_GPUS_AND_NCCL(2);
  World w;
  ASSERT_TRUE(make_world(w, 2, /*timeout_ms=*/20000));
  std::vector<flame_status_t> st(2, FLAME_OK), st_local(2, FLAME_OK);
  std::vector<std::string> msg(2);
  const auto start = std::chrono::steady_clock::now();
  on_ranks(2, [&](int r) {
    const int64_t cols = r == 0 ? 4 : 3;  // rank 1's weight is [4, 3], rank 0's [4, 4]
    T wgt(from_doubles(w.ctxs[r], std::vector<double>(static_cast<size_t>(4 * cols), 1.0), {4, cols}, FLAME_DTYPE_F32));
    flame_tensor_set_requires_grad(wgt, 1);
    flame_dp_t dp = reinterpret_cast<flame_dp_t>(0x1);
    st[r] = flame_dp_create(w.comms[r], &wgt.h, 1, nullptr, &dp);
    msg[r] = flame_last_error_message();
    EXPECT_EQ(dp, nullptr);
    // A rank whose own check fails (a parameter that does not require grad): the others learn it.
    T plain(from_doubles(w.ctxs[r], {1.0, 2.0}, {2}, FLAME_DTYPE_F32));
    if (r == 0) flame_tensor_set_requires_grad(plain, 1);
    st_local[r] = flame_dp_create(w.comms[r], &plain.h, 1, nullptr, &dp);
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r], FLAME_ERROR_SHAPE_MISMATCH) << "rank " << r << ": " << msg[r];
    EXPECT_NE(msg[r].find("rank"), std::string::npos) << msg[r];
    EXPECT_EQ(st_local[r], FLAME_ERROR_INVALID_ARGUMENT) << "rank " << r;
  }
  EXPECT_LT(secs, 15.0) << "the mismatch is found by one exchange, not by the timeout";
  on_ranks(2, [&](int r) {  // still usable
    T t(from_doubles(w.ctxs[r], {1.0}, {1}, FLAME_DTYPE_F32));
    EXPECT_EQ(flame_comm_all_reduce(w.comms[r], t, FLAME_REDUCE_SUM), FLAME_OK) << flame_last_error_message();
    EXPECT_EQ(flame_comm_synchronize(w.comms[r]), FLAME_OK) << flame_last_error_message();
    EXPECT_EQ(to_doubles(t), std::vector<double>{2.0});
  });
}

// A rank that fails before its collective (a bad argument) leaves its peer waiting: the peer's
// wait times out, aborts the communicator and reports FLAME_ERROR_CUDA instead of hanging.
TEST(Dist2, PeerFailureTimesOutAndAborts) {
  NEED_GPUS_AND_NCCL(2);
  World w;
  ASSERT_TRUE(make_world(w, 2, /*timeout_ms=*/3000));
  std::vector<flame_status_t> st(2, FLAME_OK);
  std::vector<std::string> msg(2);
  std::vector<double> secs(2, 0.0);
  on_ranks(2, [&](int r) {
    const auto start = std::chrono::steady_clock::now();
    T t(from_doubles(w.ctxs[r], std::vector<double>(1024, 1.0), {1024}, r == 0 ? FLAME_DTYPE_F32 : FLAME_DTYPE_BOOL));
    st[r] = flame_comm_all_reduce(w.comms[r], t, FLAME_REDUCE_SUM);  // rank 1: bool, refused locally
    if (st[r] == FLAME_OK) st[r] = flame_comm_synchronize(w.comms[r]);
    msg[r] = flame_last_error_message();
    secs[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
  EXPECT_EQ(st[1], FLAME_ERROR_DTYPE_MISMATCH) << msg[1];
  EXPECT_EQ(st[0], FLAME_ERROR_CUDA) << msg[0];
  EXPECT_NE(msg[0].find("timed out"), std::string::npos) << msg[0];
  EXPECT_LT(secs[0], 30.0);
  // The aborted communicator refuses further work with the reason; the context still works.
  T t(from_doubles(w.ctxs[0], {1.0}, {1}, FLAME_DTYPE_F32));
  FLAME_EXPECT_STATUS(flame_comm_all_reduce(w.comms[0], t, FLAME_REDUCE_SUM), FLAME_ERROR_CUDA);
  EXPECT_NE(std::string(flame_last_error_message()).find("aborted"), std::string::npos);
  FLAME_EXPECT_STATUS(flame_ctx_synchronize(w.ctxs[0]), FLAME_OK);
  EXPECT_EQ(to_doubles(t), std::vector<double>{1.0});
}

}  // namespace

// ---- one process per GPU: the test re-executes this binary as rank 0 and rank 1 ----
// The parent makes the id and writes its bytes to a file (an application would use MPI, a socket or
// a shared file system); each child creates a context on the GPU of its rank, joins with
// flame_comm_create, all-reduces [rank + 1] * 1000 and checks the sum 3, then exits 0.
namespace {

constexpr const char* kRankEnv = "FLAME_TEST_DIST_RANK";
constexpr const char* kIdEnv = "FLAME_TEST_DIST_ID_FILE";

int dist_child_main(int rank, const char* id_file) {
  auto fail = [&](const char* what, flame_status_t st) {
    std::fprintf(stderr, "[dist child %d] %s: %s: %s\n", rank, what, flame_status_string(st), flame_last_error_message());
    return 1;
  };
  flame_comm_id_t id;
  std::ifstream in(id_file, std::ios::binary);
  if (!in.read(reinterpret_cast<char*>(&id), sizeof id)) {
    std::fprintf(stderr, "[dist child %d] cannot read %s\n", rank, id_file);
    return 1;
  }
  flame_ctx_t ctx = make_ctx(rank);
  if (!ctx) return fail("flame_ctx_create", FLAME_ERROR_NO_DEVICE);
  flame_comm_t comm = nullptr;
  flame_comm_options_t o;
  flame_comm_options_init(&o);
  o.timeout_ms = 60000;
  flame_status_t st = flame_comm_create(ctx, &id, rank, 2, &o, &comm);
  if (st != FLAME_OK) return fail("flame_comm_create", st);
  const int64_t shape[] = {1000};
  flame_tensor_t t = nullptr;
  if ((st = flame_full(ctx, shape, 1, FLAME_DTYPE_F32, rank + 1.0, &t)) != FLAME_OK) return fail("flame_full", st);
  if ((st = flame_comm_all_reduce(comm, t, FLAME_REDUCE_SUM)) != FLAME_OK) return fail("flame_comm_all_reduce", st);
  if ((st = flame_comm_synchronize(comm)) != FLAME_OK) return fail("flame_comm_synchronize", st);
  std::vector<float> v(1000);
  if ((st = flame_to_host(t, v.data(), v.size() * sizeof(float))) != FLAME_OK) return fail("flame_to_host", st);
  int wrong = 0;
  for (float x : v) wrong += x != 3.0f;
  flame_tensor_release(t);
  flame_comm_release(comm);
  flame_ctx_destroy(ctx);
  if (wrong) std::fprintf(stderr, "[dist child %d] %d of 1000 sums are not 3\n", rank, wrong);
  return wrong ? 1 : 0;
}

// The child's work instead of the test program when the parent test started this process.
const bool g_dist_child_ran = [] {
  const char* r = std::getenv(kRankEnv);
  const char* f = std::getenv(kIdEnv);
  if (r && f) {
    std::fflush(stdout);
    int rc = dist_child_main(std::atoi(r), f);
    std::fflush(stderr);
    std::_Exit(rc);
  }
  return false;
}();

pid_t spawn_rank(int rank, const std::string& id_file, std::string* why) {
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) { *why = "readlink /proc/self/exe failed"; return -1; }
  exe[n] = '\0';
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e)
    if (std::strncmp(*e, "FLAME_TEST_DIST_", 16) != 0) env.emplace_back(*e);
  env.push_back(std::string(kRankEnv) + "=" + std::to_string(rank));
  env.push_back(std::string(kIdEnv) + "=" + id_file);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(&e[0]);
  envp.push_back(nullptr);
  char* argv[] = {exe, nullptr};
  pid_t pid = 0;
  int err = posix_spawn(&pid, exe, nullptr, nullptr, argv, envp.data());
  if (err != 0) { *why = std::string("posix_spawn: ") + std::strerror(err); return -1; }
  return pid;
}

}  // namespace

TEST(Dist2, OneProcessPerGpu) {
  ASSERT_FALSE(g_dist_child_ran);
  NEED_GPUS_AND_NCCL(2);
  flame_ctx_t ctx = make_ctx(0);
  ASSERT_NE(ctx, nullptr) << flame_last_error_message();
  flame_comm_id_t id;
  ASSERT_EQ(flame_comm_unique_id(ctx, &id), FLAME_OK) << flame_last_error_message();
  const std::string id_file = "/tmp/flame_test_dist_id_" + std::to_string(getpid());
  {
    std::ofstream out(id_file, std::ios::binary);
    out.write(reinterpret_cast<const char*>(&id), sizeof id);
    ASSERT_TRUE(out.good()) << "cannot write " << id_file;
  }
  std::string why;
  pid_t pids[2];
  for (int r = 0; r < 2; ++r) {
    pids[r] = spawn_rank(r, id_file, &why);
    ASSERT_GT(pids[r], 0) << why;
  }
  for (int r = 0; r < 2; ++r) {
    int status = 0;
    ASSERT_EQ(waitpid(pids[r], &status, 0), pids[r]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "rank " << r << (WIFEXITED(status) ? " exited " + std::to_string(WEXITSTATUS(status)) : " died of a signal")
        << " (its [dist child] lines above say why)";
  }
  std::remove(id_file.c_str());
  flame_ctx_destroy(ctx);
}


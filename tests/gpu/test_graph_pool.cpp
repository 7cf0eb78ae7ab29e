// CUDA graphs sharing one private memory pool (flame_graph_capture_begin_shared): one MLP training
// step (linear-gelu-linear, MSE, AdamW, zero_grad to none) captured at two batch sizes, as
// flame-train captures one graph per aspect-ratio bucket. (a) The two graphs replayed alternately
// give bit for bit the parameters and losses of the same eager steps in the same order (FLAME is
// deterministic: same kernels, same cuBLASLt algorithm, same order), (c) each loss read right after
// its own graph's replay; (b) the second capture grows the pool's reserved bytes by much less when
// it shares the first graph's pool than with a pool of its own; (d) releasing the first graph leaves
// the second replayable and correct, and releasing both gives the memory back; (e) bad arguments.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include "host_ref.h"

using namespace href;

namespace {

class GraphPool : public GpuTest {};

std::vector<float> random_floats(Rng& rng, size_t n, float lo = -2.0f, float hi = 2.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

T from_floats(flame_ctx_t ctx, const std::vector<float>& v, std::vector<int64_t> shape) {
  T t;
  EXPECT_EQ(flame_from_host(ctx, v.data(), v.size() * sizeof(float), shape.data(), static_cast<int32_t>(shape.size()),
                            FLAME_DTYPE_F32, t.out()),
            FLAME_OK)
      << flame_last_error_message();
  return t;
}

std::vector<float> floats(flame_tensor_t t) {
  std::vector<float> v(static_cast<size_t>(numel_of(t)));
  EXPECT_EQ(flame_to_host(t, v.data(), v.size() * sizeof(float)), FLAME_OK) << flame_last_error_message();
  return v;
}

void expect_bitwise(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << " from the graphs, " << want[i] << " eagerly";
      return;
    }
}

flame_memory_stats_t memory_stats(flame_ctx_t ctx) {
  flame_memory_stats_t s{sizeof(flame_memory_stats_t), 0, 0, 0, 0};
  EXPECT_EQ(flame_ctx_synchronize(ctx), FLAME_OK) << flame_last_error_message();
  EXPECT_EQ(flame_ctx_memory_stats(ctx, &s), FLAME_OK) << flame_last_error_message();
  return s;
}

// ---- the model: x -> linear(in, hidden) + gelu -> linear(hidden, out), MSE against t ----

struct Dims {
  int64_t in, hidden, out;
};

struct Mlp {
  T w1, b1, w2, b2;
  std::vector<flame_tensor_t> params() const { return {w1, b1, w2, b2}; }
};

std::vector<std::vector<float>> random_init(Rng& rng, Dims d) {
  return {random_floats(rng, static_cast<size_t>(d.hidden * d.in), -0.1f, 0.1f),
          random_floats(rng, static_cast<size_t>(d.hidden), -0.1f, 0.1f),
          random_floats(rng, static_cast<size_t>(d.out * d.hidden), -0.1f, 0.1f),
          random_floats(rng, static_cast<size_t>(d.out), -0.1f, 0.1f)};
}

Mlp make_mlp(flame_ctx_t ctx, const std::vector<std::vector<float>>& init, Dims d) {
  Mlp m;
  m.w1 = from_floats(ctx, init[0], {d.hidden, d.in});
  m.b1 = from_floats(ctx, init[1], {d.hidden});
  m.w2 = from_floats(ctx, init[2], {d.out, d.hidden});
  m.b2 = from_floats(ctx, init[3], {d.out});
  for (flame_tensor_t p : m.params()) EXPECT_EQ(flame_tensor_set_requires_grad(p, 1), FLAME_OK);
  return m;
}

flame_optimizer_t make_adamw(flame_ctx_t ctx, const Mlp& m) {
  flame_optimizer_options_t o;
  EXPECT_EQ(flame_optimizer_options_init(&o, FLAME_OPTIMIZER_ADAMW), FLAME_OK);
  o.lr = 3e-3;
  o.weight_decay = 0.05;
  std::vector<flame_tensor_t> p = m.params();
  flame_optimizer_t opt = nullptr;
  EXPECT_EQ(flame_optimizer_create(ctx, &o, p.data(), 4, &opt), FLAME_OK) << flame_last_error_message();
  return opt;
}

// Forward, backward, optimizer step, zero_grad to none; the loss (new reference) in *loss.
flame_status_t train_step(flame_ctx_t ctx, const Mlp& m, flame_optimizer_t opt, flame_tensor_t x, flame_tensor_t t,
                          flame_tensor_t* loss) {
  T h, y;
  flame_status_t st;
  if ((st = flame_linear(x, m.w1, m.b1, FLAME_ACTIVATION_GELU_TANH, h.out())) != FLAME_OK) return st;
  if ((st = flame_linear(h, m.w2, m.b2, FLAME_ACTIVATION_NONE, y.out())) != FLAME_OK) return st;
  if ((st = flame_mse_loss(y, t, FLAME_REDUCTION_MEAN, loss)) != FLAME_OK) return st;
  if ((st = flame_backward(ctx, *loss, nullptr, 0)) != FLAME_OK) return st;
  if ((st = flame_optimizer_step(opt)) != FLAME_OK) return st;
  return flame_optimizer_zero_grad(opt, 1);
}

// One batch size: the static input tensors a graph reads, and the data of each step.
struct Bucket {
  int64_t batch;
  T x, t;
  std::vector<std::vector<float>> xs, ts;  // per step
};

Bucket make_bucket(flame_ctx_t ctx, Rng& rng, Dims d, int64_t batch, int steps) {
  Bucket b;
  b.batch = batch;
  for (int s = 0; s < steps; ++s) {
    b.xs.push_back(random_floats(rng, static_cast<size_t>(batch * d.in)));
    b.ts.push_back(random_floats(rng, static_cast<size_t>(batch * d.out)));
  }
  b.x = from_floats(ctx, b.xs[0], {batch, d.in});
  b.t = from_floats(ctx, b.ts[0], {batch, d.out});
  return b;
}

// The same buckets (same data) with static inputs on another context or for another model.
Bucket copy_bucket(flame_ctx_t ctx, const Bucket& src, Dims d) {
  Bucket b;
  b.batch = src.batch;
  b.xs = src.xs;
  b.ts = src.ts;
  b.x = from_floats(ctx, b.xs[0], {b.batch, d.in});
  b.t = from_floats(ctx, b.ts[0], {b.batch, d.out});
  return b;
}

void load_step(const Bucket& b, size_t step) {
  FLAME_ASSERT_OK(flame_copy_from_host(b.x, b.xs[step].data(), b.xs[step].size() * sizeof(float)));
  FLAME_ASSERT_OK(flame_copy_from_host(b.t, b.ts[step].data(), b.ts[step].size() * sizeof(float)));
}

// Captures one training step on bucket b into *g, in share's pool (NULL: a pool of its own).
void capture_step(flame_ctx_t ctx, const Mlp& m, flame_optimizer_t opt, const Bucket& b, flame_graph_t share, T* loss,
                  flame_graph_t* g) {
  FLAME_ASSERT_OK(flame_graph_capture_begin_shared(ctx, share));
  flame_status_t st = train_step(ctx, m, opt, b.x, b.t, loss->out());
  flame_status_t end = flame_graph_capture_end(ctx, g);
  ASSERT_EQ(st, FLAME_OK) << flame_last_error_message();
  ASSERT_EQ(end, FLAME_OK) << flame_last_error_message();
  ASSERT_NE(*g, nullptr);
}

// An eager step on the bucket's step `step`; its loss.
std::vector<float> eager_step(flame_ctx_t ctx, const Mlp& m, flame_optimizer_t opt, const Bucket& b, size_t step) {
  load_step(b, step);
  T loss;
  EXPECT_EQ(train_step(ctx, m, opt, b.x, b.t, loss.out()), FLAME_OK) << flame_last_error_message();
  return loss ? floats(loss) : std::vector<float>();
}

// A replay of g on the bucket's step `step`; the loss read right after it (before any other graph
// of the pool replays, as flame.h asks).
std::vector<float> replay_step(flame_graph_t g, const Bucket& b, size_t step, flame_tensor_t loss) {
  load_step(b, step);
  EXPECT_EQ(flame_graph_replay(g), FLAME_OK) << flame_last_error_message();
  return floats(loss);
}

std::vector<std::vector<float>> host_params(const Mlp& m) {
  std::vector<std::vector<float>> v;
  for (flame_tensor_t p : m.params()) v.push_back(floats(p));
  return v;
}

void expect_same_params(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& want,
                        const std::vector<std::vector<float>>& init) {
  const char* names[] = {"w1", "b1", "w2", "b2"};
  for (size_t i = 0; i < 4; ++i) {
    expect_bitwise(got[i], want[i], names[i]);
    EXPECT_NE(got[i], init[i]) << names[i] << " did not move";
  }
}

TEST_F(GraphPool, AlternatingBucketGraphsEqualEagerSteps) {
  HREF_RNG(rng);
  const Dims d{32, 96, 16};
  const size_t rounds = 4;
  const std::vector<std::vector<float>> init = random_init(rng, d);
  Bucket big = make_bucket(ctx, rng, d, 48, static_cast<int>(rounds));
  Bucket small = make_bucket(ctx, rng, d, 20, static_cast<int>(rounds));

  // Eager first: each product shape times its cuBLASLt candidates here, and the captures reuse the
  // choice, so both arms run the same algorithms.
  Mlp me = make_mlp(ctx, init, d);
  flame_optimizer_t oe = make_adamw(ctx, me);
  std::vector<std::vector<float>> eager_losses;
  for (size_t r = 0; r < rounds; ++r) {
    eager_losses.push_back(eager_step(ctx, me, oe, big, r));
    eager_losses.push_back(eager_step(ctx, me, oe, small, r));
  }

  Mlp mg = make_mlp(ctx, init, d);
  flame_optimizer_t og = make_adamw(ctx, mg);
  Bucket gbig = copy_bucket(ctx, big, d), gsmall = copy_bucket(ctx, small, d);
  T loss_big, loss_small;
  flame_graph_t g_big = nullptr, g_small = nullptr;
  ASSERT_NO_FATAL_FAILURE(capture_step(ctx, mg, og, gbig, nullptr, &loss_big, &g_big));
  ASSERT_NO_FATAL_FAILURE(capture_step(ctx, mg, og, gsmall, g_big, &loss_small, &g_small));
  for (size_t r = 0; r < rounds; ++r) {
    const std::string round = " (round " + std::to_string(r) + ")";
    expect_bitwise(replay_step(g_big, gbig, r, loss_big), eager_losses[2 * r], "loss of the batch-48 graph" + round);
    expect_bitwise(replay_step(g_small, gsmall, r, loss_small), eager_losses[2 * r + 1],
                   "loss of the batch-20 graph" + round);
  }
  int64_t count = -1;
  FLAME_EXPECT_STATUS(flame_optimizer_step_count(og, &count), FLAME_OK);
  EXPECT_EQ(count, static_cast<int64_t>(2 * rounds));
  expect_same_params(host_params(mg), host_params(me), init);
  flame_graph_release(g_small);
  flame_graph_release(g_big);
  flame_optimizer_release(og);
  flame_optimizer_release(oe);
}

// ---- memory: large intermediates ([batch, hidden] f32, 24 to 32 MiB each) ----

const Dims kWide{256, 4096, 256};

// bytes_reserved growth of capturing the small bucket's step after the big one's, in a fresh
// context, sharing the big graph's pool or not.
uint64_t second_capture_growth(flame_ctx_t ctx, bool shared) {
  HREF_RNG(rng);
  const std::vector<std::vector<float>> init = random_init(rng, kWide);
  Mlp m = make_mlp(ctx, init, kWide);
  flame_optimizer_t opt = make_adamw(ctx, m);
  Bucket big = make_bucket(ctx, rng, kWide, 2048, 1), small = make_bucket(ctx, rng, kWide, 1536, 1);
  EXPECT_EQ(flame_graph_capture_begin(ctx), FLAME_OK);  // makes the cuBLASLt handle and workspace
  EXPECT_EQ(flame_graph_capture_end(ctx, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  T loss_big, loss_small;
  flame_graph_t g_big = nullptr, g_small = nullptr;
  capture_step(ctx, m, opt, big, nullptr, &loss_big, &g_big);
  const flame_memory_stats_t before = memory_stats(ctx);
  capture_step(ctx, m, opt, small, shared ? g_big : nullptr, &loss_small, &g_small);
  const flame_memory_stats_t after = memory_stats(ctx);
  EXPECT_EQ(flame_graph_replay(g_big), FLAME_OK) << flame_last_error_message();
  EXPECT_EQ(flame_graph_replay(g_small), FLAME_OK) << flame_last_error_message();
  EXPECT_TRUE(std::isfinite(floats(loss_small)[0]));
  flame_graph_release(g_small);
  flame_graph_release(g_big);
  flame_optimizer_release(opt);
  return after.bytes_reserved - before.bytes_reserved;
}

TEST_F(GraphPool, SharingAPoolCostsMuchLessThanASecondPool) {
  FLAME_GPU_CONTEXT(other);
  const uint64_t own = second_capture_growth(ctx, false);
  const uint64_t shared = second_capture_growth(other, true);
  flame_ctx_destroy(other);
  std::printf("[GraphPool] second capture: +%.1f MiB reserved with its own pool, +%.1f MiB sharing the first's\n",
              own / 1048576.0, shared / 1048576.0);
  // The small step's intermediates are several [1536, 4096] f32 tensors of 24 MiB each.
  EXPECT_GT(own, uint64_t(40) << 20) << "the case does not measure what it means to";
  EXPECT_LT(shared, own / 2) << "the shared capture did not reuse the first graph's intermediates";
}

TEST_F(GraphPool, ReleasingOneGraphLeavesTheOtherAndBothGiveTheMemoryBack) {
  HREF_RNG(rng);
  const std::vector<std::vector<float>> init = random_init(rng, kWide);
  Mlp mg = make_mlp(ctx, init, kWide);
  flame_optimizer_t og = make_adamw(ctx, mg);
  Bucket big = make_bucket(ctx, rng, kWide, 2048, 1), small = make_bucket(ctx, rng, kWide, 1536, 3);
  FLAME_ASSERT_OK(flame_graph_capture_begin(ctx));  // the cuBLASLt handle and workspace
  FLAME_EXPECT_STATUS(flame_graph_capture_end(ctx, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  const flame_memory_stats_t start = memory_stats(ctx);

  // Graphs first (no eager step before): the captures pin cuBLASLt's heuristic choice per shape,
  // and the eager reference below runs with the same one.
  T loss_big, loss_small;
  flame_graph_t g_big = nullptr, g_small = nullptr;
  ASSERT_NO_FATAL_FAILURE(capture_step(ctx, mg, og, big, nullptr, &loss_big, &g_big));
  ASSERT_NO_FATAL_FAILURE(capture_step(ctx, mg, og, small, g_big, &loss_small, &g_small));
  const uint64_t graphs_reserved = memory_stats(ctx).bytes_reserved - start.bytes_reserved;
  std::vector<std::vector<float>> losses;
  losses.push_back(replay_step(g_big, big, 0, loss_big));
  losses.push_back(replay_step(g_small, small, 0, loss_small));
  flame_graph_release(g_big);  // the small graph still uses the pool
  losses.push_back(replay_step(g_small, small, 1, loss_small));
  losses.push_back(replay_step(g_small, small, 2, loss_small));
  const std::vector<std::vector<float>> graph_params = host_params(mg);
  flame_graph_release(g_small);
  loss_big = T();
  loss_small = T();
  flame_optimizer_release(og);  // its moments were made during the first capture
  const flame_memory_stats_t released = memory_stats(ctx);
  EXPECT_EQ(released.bytes_in_use, start.bytes_in_use);
  EXPECT_EQ(released.live_tensors, start.live_tensors);

  // The pool went back to the context's memory: capturing the big step again, on its own, needs
  // next to nothing new (a leaked pool would make it reserve the big step's memory once more).
  {
    flame_optimizer_t o2 = make_adamw(ctx, mg);
    T l;
    flame_graph_t g = nullptr;
    ASSERT_NO_FATAL_FAILURE(capture_step(ctx, mg, o2, big, nullptr, &l, &g));
    const uint64_t again = memory_stats(ctx).bytes_reserved - released.bytes_reserved;
    std::printf("[GraphPool] two shared graphs reserved %.1f MiB; after releasing them, a new capture %.1f MiB\n",
                graphs_reserved / 1048576.0, again / 1048576.0);
    EXPECT_GT(graphs_reserved, uint64_t(64) << 20);
    EXPECT_LT(again, graphs_reserved / 4) << "the released graphs' pool was not given back";
    flame_graph_release(g);
    flame_optimizer_release(o2);
  }

  // The same steps eagerly, from the same initial parameters.
  Mlp me = make_mlp(ctx, init, kWide);
  flame_optimizer_t oe = make_adamw(ctx, me);
  const std::vector<float> e0 = eager_step(ctx, me, oe, big, 0);
  expect_bitwise(losses[0], e0, "loss of the big graph");
  for (size_t s = 0; s < 3; ++s)
    expect_bitwise(losses[s + 1], eager_step(ctx, me, oe, small, s), "loss of the small graph, step " + std::to_string(s));
  expect_same_params(graph_params, host_params(me), init);
  flame_optimizer_release(oe);
}

TEST_F(GraphPool, BadArgumentsChangeNothing) {
  const int64_t shape[] = {64};
  T x;
  FLAME_ASSERT_OK(flame_ones(ctx, shape, 1, FLAME_DTYPE_F32, x.out()));
  auto capture_double = [&](flame_ctx_t c, flame_tensor_t in, flame_graph_t share, T* y, flame_graph_t* g) {
    FLAME_ASSERT_OK(flame_graph_capture_begin_shared(c, share));
    flame_status_t st = flame_mul_scalar(in, 2.0, y->out());
    FLAME_ASSERT_OK(flame_graph_capture_end(c, g));
    FLAME_ASSERT_OK(st);
  };
  T y;
  flame_graph_t g = nullptr;
  ASSERT_NO_FATAL_FAILURE(capture_double(ctx, x, nullptr, &y, &g));

  FLAME_EXPECT_STATUS(flame_graph_capture_begin_shared(nullptr, g), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_GPU_CONTEXT(other);
  T xo, yo;
  flame_graph_t go = nullptr;
  FLAME_ASSERT_OK(flame_ones(other, shape, 1, FLAME_DTYPE_F32, xo.out()));
  ASSERT_NO_FATAL_FAILURE(capture_double(other, xo, nullptr, &yo, &go));
  FLAME_EXPECT_STATUS(flame_graph_capture_begin_shared(ctx, go), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("share_pool_with"), std::string::npos) << flame_last_error_message();
  flame_graph_release(go);
  FLAME_EXPECT_STATUS(flame_graph_capture_begin_shared(ctx, go), FLAME_ERROR_INVALID_HANDLE);  // released
  EXPECT_NE(std::string(flame_last_error_message()).find("share_pool_with"), std::string::npos) << flame_last_error_message();
  yo = T();
  xo = T();
  flame_ctx_destroy(other);

  // None of them began a capture: there is nothing to end, and g replays as before.
  FLAME_EXPECT_STATUS(flame_graph_capture_end(ctx, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_ASSERT_OK(flame_graph_replay(g));
  for (float v : floats(y)) ASSERT_EQ(v, 2.0f);

  // A nested begin fails (and, as any failed call during a capture, aborts the capture).
  FLAME_ASSERT_OK(flame_graph_capture_begin(ctx));
  FLAME_EXPECT_STATUS(flame_graph_capture_begin_shared(ctx, g), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_graph_capture_end(ctx, nullptr), FLAME_ERROR_INVALID_ARGUMENT);

  // A graph sharing g's pool after all that, and g released before it: both still work.
  T z;
  flame_graph_t g2 = nullptr;
  ASSERT_NO_FATAL_FAILURE(capture_double(ctx, y, g, &z, &g2));
  flame_graph_release(g);
  FLAME_ASSERT_OK(flame_graph_replay(g2));
  for (float v : floats(z)) ASSERT_EQ(v, 4.0f);
  flame_graph_release(g2);
}

}  // namespace

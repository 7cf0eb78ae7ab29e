// CUDA graph capture and replay (flame_graph_*): a replay computes bit for bit what the same calls
// compute eagerly, for (a) a chain of elementwise ops on a static input refilled between replays,
// (b) MLP training steps with AdamW and a learning rate changed between steps (zero_grad inside
// the capture, both set_to_none and filling with zeros), (c) allocations freed and reused inside a
// capture, (d) flame_copy refilling a static input from the device inside and outside a graph;
// and the error paths: calls a graph cannot hold fail with FLAME_ERROR_UNSUPPORTED, abort
// the capture (capture_end returns that error) and leave the context working.
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>
#include "host_ref.h"

using namespace href;

namespace {

class Graph : public GpuTest {};

std::vector<float> random_floats(Rng& rng, size_t n, float lo = -2.0f, float hi = 2.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) {
    do x = d(rng);
    while (x == 0.0f);
  }
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

// Bitwise equality of two f32 vectors, reporting the first difference.
void expect_bitwise(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << " after replay, " << want[i] << " eagerly";
      return;
    }
}

// y = exp(-relu(x * 1.5 + 0.25)) * x + c (c a tensor): six kernels, four temporaries.
flame_status_t chain(flame_tensor_t x, flame_tensor_t c, flame_tensor_t* y) {
  T a, b, d, e, f;
  flame_status_t st;
  if ((st = flame_mul_scalar(x, 1.5, a.out())) != FLAME_OK) return st;
  if ((st = flame_add_scalar(a, 0.25, b.out())) != FLAME_OK) return st;
  if ((st = flame_relu(b, d.out())) != FLAME_OK) return st;
  if ((st = flame_mul_scalar(d, -1.0, e.out())) != FLAME_OK) return st;
  if ((st = flame_exp(e, f.out())) != FLAME_OK) return st;
  T g;
  if ((st = flame_mul(f, x, g.out())) != FLAME_OK) return st;
  return flame_add(g, c, y);
}

TEST_F(Graph, ElementwiseChainReplayEqualsEager) {
  HREF_RNG(rng);
  const size_t n = 3000;
  T x = from_floats(ctx, random_floats(rng, n), {static_cast<int64_t>(n)});
  T c = from_floats(ctx, random_floats(rng, n), {static_cast<int64_t>(n)});
  // Captured first: the kernels are compiled and loaded during the capture.
  FLAME_ASSERT_OK(flame_graph_capture_begin(ctx));
  T y;
  flame_status_t st = chain(x, c, y.out());
  flame_graph_t g = nullptr;
  flame_status_t end = flame_graph_capture_end(ctx, &g);
  ASSERT_EQ(st, FLAME_OK) << flame_last_error_message();
  ASSERT_EQ(end, FLAME_OK) << flame_last_error_message();
  ASSERT_NE(g, nullptr);
  std::vector<float> previous;
  for (int batch = 0; batch < 3; ++batch) {
    std::vector<float> xs = random_floats(rng, n);
    FLAME_ASSERT_OK(flame_copy_from_host(x, xs.data(), xs.size() * sizeof(float)));
    FLAME_ASSERT_OK(flame_graph_replay(g));
    std::vector<float> replayed = floats(y);
    T ye;
    FLAME_ASSERT_OK(chain(x, c, ye.out()));
    expect_bitwise(replayed, floats(ye), "chain");
    EXPECT_NE(replayed, previous) << "the replay did not read the new batch";
    previous = replayed;
    // The host formula, as a check that the eager result itself is right.
    std::vector<float> cs = floats(c);
    for (size_t i = 0; i < n; i += 97) {
      const double b = std::max(0.0, 1.5 * xs[i] + 0.25);
      EXPECT_NEAR(replayed[i], std::exp(-b) * xs[i] + cs[i], 1e-5 * (1 + std::fabs(cs[i]))) << i;
    }
  }
  // The graph goes; the tensor made during the capture stays valid with the last replay's values.
  flame_graph_release(g);
  expect_bitwise(floats(y), previous, "output after flame_graph_release");
  FLAME_EXPECT_STATUS(flame_graph_replay(g), FLAME_ERROR_INVALID_HANDLE);
}

// Split reductions (a few outputs over many elements: blocks of chunks whose last one finishes the
// output through a completion counter that it resets): the counters are first made during the capture,
// and every replay, like every eager call, must find them back at zero. A full sum and the sums of
// two rows of 300000, replayed over new data, bitwise equal to the eager results.
TEST_F(Graph, SplitReductionReplaysEqualEager) {
  HREF_RNG(rng);
  const int64_t cols = 300000;
  T x = from_floats(ctx, random_floats(rng, 2 * cols), {2, cols});
  const int32_t last = 1;
  FLAME_ASSERT_OK(flame_graph_capture_begin(ctx));
  T all, rows;
  flame_status_t st1 = flame_sum_all(x, all.out());
  flame_status_t st2 = flame_sum(x, &last, 1, 0, rows.out());
  flame_graph_t g = nullptr;
  flame_status_t end = flame_graph_capture_end(ctx, &g);
  ASSERT_EQ(st1, FLAME_OK) << flame_last_error_message();
  ASSERT_EQ(st2, FLAME_OK) << flame_last_error_message();
  ASSERT_EQ(end, FLAME_OK) << flame_last_error_message();
  for (int batch = 0; batch < 3; ++batch) {
    std::vector<float> xs = random_floats(rng, 2 * cols);
    FLAME_ASSERT_OK(flame_copy_from_host(x, xs.data(), xs.size() * sizeof(float)));
    FLAME_ASSERT_OK(flame_graph_replay(g));
    T all_e, rows_e;
    FLAME_ASSERT_OK(flame_sum_all(x, all_e.out()));
    FLAME_ASSERT_OK(flame_sum(x, &last, 1, 0, rows_e.out()));
    expect_bitwise(floats(all), floats(all_e), "sum_all");
    expect_bitwise(floats(rows), floats(rows_e), "sum(dim=1)");
    double r0 = 0, r1 = 0;
    for (int64_t i = 0; i < cols; ++i) {
      r0 += xs[static_cast<size_t>(i)];
      r1 += xs[static_cast<size_t>(cols + i)];
    }
    const std::vector<float> got = floats(rows);
    EXPECT_NEAR(got[0], r0, 1e-5 * cols);
    EXPECT_NEAR(got[1], r1, 1e-5 * cols);
    EXPECT_NEAR(floats(all)[0], r0 + r1, 2e-5 * cols);
  }
  flame_graph_release(g);
}

// A two-layer MLP with bias and relu, mean squared error; parameters in f32.
struct Mlp {
  T w1, b1, w2, b2;
  std::vector<flame_tensor_t> params() const { return {w1, b1, w2, b2}; }
};

Mlp make_mlp(flame_ctx_t ctx, const std::vector<std::vector<float>>& init, int64_t in, int64_t hidden, int64_t out) {
  Mlp m;
  m.w1 = from_floats(ctx, init[0], {hidden, in});
  m.b1 = from_floats(ctx, init[1], {hidden});
  m.w2 = from_floats(ctx, init[2], {out, hidden});
  m.b2 = from_floats(ctx, init[3], {out});
  for (flame_tensor_t p : m.params()) EXPECT_EQ(flame_tensor_set_requires_grad(p, 1), FLAME_OK);
  return m;
}

// forward + backward; the loss (new reference) in *loss.
flame_status_t forward_backward(flame_ctx_t ctx, const Mlp& m, flame_tensor_t x, flame_tensor_t target, flame_tensor_t* loss) {
  T h, y;
  flame_status_t st;
  if ((st = flame_linear(x, m.w1, m.b1, FLAME_ACTIVATION_RELU, h.out())) != FLAME_OK) return st;
  if ((st = flame_linear(h, m.w2, m.b2, FLAME_ACTIVATION_NONE, y.out())) != FLAME_OK) return st;
  if ((st = flame_mse_loss(y, target, FLAME_REDUCTION_MEAN, loss)) != FLAME_OK) return st;
  return flame_backward(ctx, *loss, nullptr, 0);
}

// Zero_grad modes: set to none at the end of a step, or fill with zeros at its start (the
// gradients then exist before the capture, from a warm-up backward).
enum class ZeroGrad { NoneAtEnd, ZerosAtStart };

flame_status_t train_step(flame_ctx_t ctx, const Mlp& m, flame_optimizer_t opt, flame_tensor_t x, flame_tensor_t target,
                          ZeroGrad z, flame_tensor_t* loss) {
  flame_status_t st;
  if (z == ZeroGrad::ZerosAtStart && (st = flame_optimizer_zero_grad(opt, 0)) != FLAME_OK) return st;
  if ((st = forward_backward(ctx, m, x, target, loss)) != FLAME_OK) return st;
  if ((st = flame_optimizer_step(opt)) != FLAME_OK) return st;
  if (z == ZeroGrad::NoneAtEnd) return flame_optimizer_zero_grad(opt, 1);
  return FLAME_OK;
}

void run_mlp_training(flame_ctx_t ctx, ZeroGrad z) {
  HREF_RNG(rng);
  const int64_t batch = 48, in = 40, hidden = 72, out = 24;
  const int steps = 5;
  const double lrs[steps] = {3e-3, 2e-3, 5e-3, 1e-3, 4e-3};
  std::vector<std::vector<float>> init = {random_floats(rng, hidden * in, -0.2f, 0.2f), random_floats(rng, hidden, -0.1f, 0.1f),
                                          random_floats(rng, out * hidden, -0.2f, 0.2f), random_floats(rng, out, -0.1f, 0.1f)};
  std::vector<std::vector<float>> xs, ts;
  for (int s = 0; s < steps; ++s) {
    xs.push_back(random_floats(rng, batch * in));
    ts.push_back(random_floats(rng, batch * out));
  }
  flame_optimizer_options_t o;
  ASSERT_EQ(flame_optimizer_options_init(&o, FLAME_OPTIMIZER_ADAMW), FLAME_OK);
  o.lr = 1.0;  // replaced by set_lr before every step
  o.weight_decay = 0.05;

  // Eager: static input tensors refilled per step, as in the graph arm.
  Mlp me = make_mlp(ctx, init, in, hidden, out);
  T xe = from_floats(ctx, xs[0], {batch, in}), te = from_floats(ctx, ts[0], {batch, out});
  flame_optimizer_t oe = nullptr;
  std::vector<flame_tensor_t> pe = me.params();
  ASSERT_EQ(flame_optimizer_create(ctx, &o, pe.data(), 4, &oe), FLAME_OK) << flame_last_error_message();
  if (z == ZeroGrad::ZerosAtStart) {  // warm-up backward: the gradients exist before the first step
    T l;
    FLAME_ASSERT_OK(forward_backward(ctx, me, xe, te, l.out()));
  }
  std::vector<std::vector<float>> eager_losses;
  for (int s = 0; s < steps; ++s) {
    FLAME_ASSERT_OK(flame_copy_from_host(xe, xs[s].data(), xs[s].size() * sizeof(float)));
    FLAME_ASSERT_OK(flame_copy_from_host(te, ts[s].data(), ts[s].size() * sizeof(float)));
    FLAME_ASSERT_OK(flame_optimizer_set_lr(oe, -1, lrs[s]));
    T loss;
    FLAME_ASSERT_OK(train_step(ctx, me, oe, xe, te, z, loss.out()));
    eager_losses.push_back(floats(loss));
  }

  // Graph: the same weights, one capture, then a replay per step.
  Mlp mg = make_mlp(ctx, init, in, hidden, out);
  T xg = from_floats(ctx, xs[0], {batch, in}), tg = from_floats(ctx, ts[0], {batch, out});
  flame_optimizer_t og = nullptr;
  std::vector<flame_tensor_t> pg = mg.params();
  ASSERT_EQ(flame_optimizer_create(ctx, &o, pg.data(), 4, &og), FLAME_OK) << flame_last_error_message();
  if (z == ZeroGrad::ZerosAtStart) {
    T l;
    FLAME_ASSERT_OK(forward_backward(ctx, mg, xg, tg, l.out()));
  }
  FLAME_ASSERT_OK(flame_optimizer_set_lr(og, -1, lrs[0]));
  FLAME_ASSERT_OK(flame_graph_capture_begin(ctx));
  T loss;
  flame_status_t st = train_step(ctx, mg, og, xg, tg, z, loss.out());
  flame_graph_t g = nullptr;
  flame_status_t end = flame_graph_capture_end(ctx, &g);
  ASSERT_EQ(st, FLAME_OK) << flame_last_error_message();
  ASSERT_EQ(end, FLAME_OK) << flame_last_error_message();
  int64_t count = -1;
  FLAME_ASSERT_OK(flame_optimizer_step_count(og, &count));
  EXPECT_EQ(count, 0) << "capturing a step must not count as a step";
  for (int s = 0; s < steps; ++s) {
    FLAME_ASSERT_OK(flame_copy_from_host(xg, xs[s].data(), xs[s].size() * sizeof(float)));
    FLAME_ASSERT_OK(flame_copy_from_host(tg, ts[s].data(), ts[s].size() * sizeof(float)));
    FLAME_ASSERT_OK(flame_optimizer_set_lr(og, -1, lrs[s]));
    FLAME_ASSERT_OK(flame_graph_replay(g));
    expect_bitwise(floats(loss), eager_losses[static_cast<size_t>(s)], "loss");
  }
  FLAME_ASSERT_OK(flame_optimizer_step_count(og, &count));
  EXPECT_EQ(count, steps);
  const char* names[] = {"w1", "b1", "w2", "b2"};
  for (size_t i = 0; i < 4; ++i) {
    std::vector<float> got = floats(pg[i]), want = floats(pe[i]), start = init[i];
    expect_bitwise(got, want, names[i]);
    EXPECT_NE(got, start) << names[i] << " did not move";
  }
  // Eager steps after the replays continue the same sequence (step count and state on the device).
  FLAME_ASSERT_OK(flame_optimizer_set_lr(oe, -1, 2.5e-3));
  FLAME_ASSERT_OK(flame_optimizer_set_lr(og, -1, 2.5e-3));
  {
    T l1, l2;
    FLAME_ASSERT_OK(train_step(ctx, me, oe, xe, te, z, l1.out()));
    FLAME_ASSERT_OK(train_step(ctx, mg, og, xg, tg, z, l2.out()));
    for (size_t i = 0; i < 4; ++i) expect_bitwise(floats(pg[i]), floats(pe[i]), "after an eager step following the replays");
  }
  flame_graph_release(g);
  flame_optimizer_release(oe);
  flame_optimizer_release(og);
}

TEST_F(Graph, MlpAdamWTrainingStepsZeroGradToNone) { run_mlp_training(ctx, ZeroGrad::NoneAtEnd); }
TEST_F(Graph, MlpAdamWTrainingStepsZeroGradFill) { run_mlp_training(ctx, ZeroGrad::ZerosAtStart); }

TEST_F(Graph, AllocationsFreedAndReusedInsideTheCapture) {
  HREF_RNG(rng);
  const size_t n = 4096;
  std::vector<float> xs = random_floats(rng, n), ks = random_floats(rng, n);
  T x = from_floats(ctx, xs, {static_cast<int64_t>(n)});
  // The first capture makes the cuBLASLt handle and workspace (kept by the context): an empty
  // capture first, so that the statistics below compare like with like.
  FLAME_ASSERT_OK(flame_graph_capture_begin(ctx));
  FLAME_EXPECT_STATUS(flame_graph_capture_end(ctx, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  flame_memory_stats_t before{sizeof(flame_memory_stats_t), 0, 0, 0, 0};
  FLAME_ASSERT_OK(flame_ctx_memory_stats(ctx, &before));
  FLAME_ASSERT_OK(flame_graph_capture_begin(ctx));
  T z, w, k;
  uintptr_t freed = 0, reused = 0;
  auto body = [&]() -> flame_status_t {
    flame_status_t st;
    T y1;
    if ((st = flame_mul_scalar(x, 2.0, y1.out())) != FLAME_OK) return st;
    if ((st = flame_add_scalar(y1, 1.0, z.out())) != FLAME_OK) return st;  // z = 2x + 1, kept
    freed = ptr_of(y1);
    y1 = T();  // freed inside the capture: its block goes back to the capture's pool
    T y2;
    if ((st = flame_mul_scalar(x, 5.0, y2.out())) != FLAME_OK) return st;  // same size: that block again
    reused = ptr_of(y2);
    // A constant made during the capture (copied once, now).
    if ((st = flame_from_host(ctx, ks.data(), n * sizeof(float), std::vector<int64_t>{static_cast<int64_t>(n)}.data(), 1,
                              FLAME_DTYPE_F32, k.out())) != FLAME_OK)
      return st;
    T s;
    if ((st = flame_add(y2, z, s.out())) != FLAME_OK) return st;
    return flame_mul(s, k, w.out());  // w = (5x + 2x + 1) * k, kept
  };
  flame_status_t st = body();
  flame_graph_t g = nullptr;
  flame_status_t end = flame_graph_capture_end(ctx, &g);
  ASSERT_EQ(st, FLAME_OK) << flame_last_error_message();
  ASSERT_EQ(end, FLAME_OK) << flame_last_error_message();
  EXPECT_EQ(reused, freed) << "a block freed during the capture serves the next allocation of its size";
  for (int round = 0; round < 3; ++round) {
    xs = random_floats(rng, n);
    FLAME_ASSERT_OK(flame_copy_from_host(x, xs.data(), n * sizeof(float)));
    FLAME_ASSERT_OK(flame_graph_replay(g));
    T ze, y2e, se, we;
    FLAME_ASSERT_OK(flame_mul_scalar(x, 2.0, y2e.out()));
    FLAME_ASSERT_OK(flame_add_scalar(y2e, 1.0, ze.out()));
    FLAME_ASSERT_OK(flame_mul_scalar(x, 5.0, y2e.out()));
    FLAME_ASSERT_OK(flame_add(y2e, ze, se.out()));
    FLAME_ASSERT_OK(flame_mul(se, k, we.out()));
    expect_bitwise(floats(z), floats(ze), "z (its temporary's block was reused later in the capture)");
    expect_bitwise(floats(w), floats(we), "w");
    const double want7 = (7.0 * xs[7] + 1.0) * ks[7];  // f32 rounding of three steps, at most a few ulp of the terms
    EXPECT_NEAR(floats(w)[7], want7, 1e-5 * (1.0 + 7.0 * std::fabs(xs[7])) * std::fabs(ks[7]) + 1e-6);
  }
  // Everything goes back: graph, then the kept tensors (freed once both let go).
  flame_graph_release(g);
  z = T();
  w = T();
  k = T();
  flame_memory_stats_t after{sizeof(flame_memory_stats_t), 0, 0, 0, 0};
  FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));
  FLAME_ASSERT_OK(flame_ctx_memory_stats(ctx, &after));
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
  EXPECT_EQ(after.live_tensors, before.live_tensors);
}

// Runs `illegal` inside a capture: it must fail with `status`, capture_end must return the same
// status and no graph, and the context must compute correctly afterwards.
void expect_aborted_capture(flame_ctx_t ctx, flame_tensor_t x, const char* what, flame_status_t status,
                            const std::function<flame_status_t()>& illegal) {
  SCOPED_TRACE(what);
  FLAME_ASSERT_OK(flame_graph_capture_begin(ctx));
  T before;
  EXPECT_EQ(flame_mul_scalar(x, 3.0, before.out()), FLAME_OK) << flame_last_error_message();
  EXPECT_EQ(illegal(), status) << flame_last_error_message();
  flame_graph_t g = reinterpret_cast<flame_graph_t>(static_cast<uintptr_t>(0x40));
  EXPECT_EQ(flame_graph_capture_end(ctx, &g), status) << flame_last_error_message();
  EXPECT_EQ(g, nullptr);
  EXPECT_NE(std::string(flame_last_error_message()).find("aborted"), std::string::npos) << flame_last_error_message();
  // Usable again: no capture in progress, eager work runs and reads back.
  FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));
  T y;
  FLAME_ASSERT_OK(flame_add_scalar(x, 1.0, y.out()));
  std::vector<float> xs = floats(x), ys = floats(y);
  for (size_t i = 0; i < xs.size(); ++i) ASSERT_EQ(ys[i], xs[i] + 1.0f) << i;
  FLAME_EXPECT_STATUS(flame_graph_capture_end(ctx, &g), FLAME_ERROR_INVALID_ARGUMENT);  // nothing to end
}

TEST_F(Graph, IllegalCallsAbortTheCaptureAndLeaveTheContextUsable) {
  HREF_RNG(rng);
  T x = from_floats(ctx, random_floats(rng, 256), {256});
  std::vector<float> host(256);
  expect_aborted_capture(ctx, x, "to_host", FLAME_ERROR_UNSUPPORTED,
                         [&] { return flame_to_host(x, host.data(), host.size() * sizeof(float)); });
  expect_aborted_capture(ctx, x, "item", FLAME_ERROR_UNSUPPORTED, [&] {
    T s;
    double v = 0;
    flame_status_t st = flame_select(x, 0, 5, s.out());  // a view: nothing is queued
    return st != FLAME_OK ? st : flame_tensor_item(s, &v);
  });
  expect_aborted_capture(ctx, x, "synchronize", FLAME_ERROR_UNSUPPORTED, [&] { return flame_ctx_synchronize(ctx); });
  expect_aborted_capture(ctx, x, "copy_from_host", FLAME_ERROR_UNSUPPORTED,
                         [&] { return flame_copy_from_host(x, host.data(), host.size() * sizeof(float)); });
  expect_aborted_capture(ctx, x, "rand", FLAME_ERROR_UNSUPPORTED, [&] {
    T r;
    const int64_t shape[] = {16};
    return flame_rand(ctx, shape, 1, FLAME_DTYPE_F32, r.out());
  });
  expect_aborted_capture(ctx, x, "nested begin", FLAME_ERROR_INVALID_ARGUMENT, [&] { return flame_graph_capture_begin(ctx); });
  // An ordinary argument error aborts the capture too.
  expect_aborted_capture(ctx, x, "shape mismatch", FLAME_ERROR_SHAPE_MISMATCH, [&] {
    T y, s;
    const int64_t shape[] = {3};
    flame_status_t st = flame_zeros(ctx, shape, 1, FLAME_DTYPE_F32, y.out());
    return st != FLAME_OK ? st : flame_add(x, y, s.out());
  });
  // Replaying a graph inside another capture.
  FLAME_ASSERT_OK(flame_graph_capture_begin(ctx));
  T y;
  FLAME_ASSERT_OK(flame_mul_scalar(x, 2.0, y.out()));
  flame_graph_t g = nullptr;
  FLAME_ASSERT_OK(flame_graph_capture_end(ctx, &g));
  expect_aborted_capture(ctx, x, "replay", FLAME_ERROR_UNSUPPORTED, [&] { return flame_graph_replay(g); });
  FLAME_ASSERT_OK(flame_graph_replay(g));  // and it still replays afterwards
  std::vector<float> xs = floats(x), ys = floats(y);
  for (size_t i = 0; i < xs.size(); ++i) ASSERT_EQ(ys[i], 2.0f * xs[i]) << i;
  flame_graph_release(g);
}

TEST_F(Graph, BadArguments) {
  FLAME_EXPECT_STATUS(flame_graph_capture_end(ctx, nullptr), FLAME_ERROR_INVALID_ARGUMENT);  // not capturing
  // out NULL still ends (and discards) a capture in progress.
  FLAME_ASSERT_OK(flame_graph_capture_begin(ctx));
  FLAME_EXPECT_STATUS(flame_graph_capture_end(ctx, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));
  // flame_copy_from_host: size, NULL data, strided destination.
  const int64_t shape[] = {4, 6};
  T x;
  FLAME_ASSERT_OK(flame_zeros(ctx, shape, 2, FLAME_DTYPE_F32, x.out()));
  std::vector<float> host(24, 1.5f);
  FLAME_EXPECT_STATUS(flame_copy_from_host(x, host.data(), 23 * sizeof(float)), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_copy_from_host(x, nullptr, 24 * sizeof(float)), FLAME_ERROR_INVALID_ARGUMENT);
  T xt;
  FLAME_ASSERT_OK(flame_transpose(x, 0, 1, xt.out()));
  FLAME_EXPECT_STATUS(flame_copy_from_host(xt, host.data(), 24 * sizeof(float)), FLAME_ERROR_INVALID_ARGUMENT);
  for (float v : floats(x)) ASSERT_EQ(v, 0.0f) << "a rejected copy wrote";
  FLAME_ASSERT_OK(flame_copy_from_host(x, host.data(), 24 * sizeof(float)));
  for (float v : floats(x)) ASSERT_EQ(v, 1.5f);
}

// flame_copy: the device-side static-input refill. Eagerly: a transposed f32 source into a bf16
// destination converts and gathers; a broadcast (expanded) source fills; then inside a capture the
// copy is a node of the graph, so each replay reads the source's current contents.
TEST_F(Graph, CopyConvertsGathersAndReplaysInsideAGraph) {
  Rng rng(11);
  const std::vector<float> host = random_floats(rng, 24);
  T src = from_floats(ctx, host, {4, 6});
  T src_t, dst_bf16, back;
  FLAME_ASSERT_OK(flame_transpose(src, 0, 1, src_t.out()));  // [6, 4], strided
  const int64_t shape64[] = {6, 4};
  FLAME_ASSERT_OK(flame_zeros(ctx, shape64, 2, FLAME_DTYPE_BF16, dst_bf16.out()));
  FLAME_ASSERT_OK(flame_copy(dst_bf16, src_t));
  FLAME_ASSERT_OK(flame_to_dtype(dst_bf16, FLAME_DTYPE_F32, back.out()));
  const std::vector<float> got = floats(back);
  for (int r = 0; r < 6; ++r)
    for (int c = 0; c < 4; ++c) {
      const float want = host[static_cast<size_t>(c * 6 + r)];
      ASSERT_NEAR(got[static_cast<size_t>(r * 4 + c)], want, std::fabs(want) * (1.0f / 128)) << r << "," << c;
    }
  // A broadcast source: one row expanded over four.
  T row = from_floats(ctx, {1, 2, 3, 4, 5, 6}, {1, 6}), rows, dst;
  const int64_t expanded[] = {4, 6};
  FLAME_ASSERT_OK(flame_expand(row, expanded, 2, rows.out()));
  FLAME_ASSERT_OK(flame_zeros(ctx, expanded, 2, FLAME_DTYPE_F32, dst.out()));
  FLAME_ASSERT_OK(flame_copy(dst, rows));
  const std::vector<float> filled = floats(dst);
  for (size_t i = 0; i < filled.size(); ++i) ASSERT_EQ(filled[i], static_cast<float>(i % 6 + 1));

  // Captured: y = chain(static_x); static_x is refilled from a device tensor between replays.
  T static_x = from_floats(ctx, host, {4, 6}), c = from_floats(ctx, random_floats(rng, 24), {4, 6});
  T batch;
  FLAME_ASSERT_OK(flame_zeros(ctx, expanded, 2, FLAME_DTYPE_F32, batch.out()));
  T y;
  FLAME_ASSERT_OK(flame_graph_capture_begin(ctx));
  FLAME_ASSERT_OK(flame_copy(static_x, batch));
  FLAME_ASSERT_OK(chain(static_x, c, y.out()));
  flame_graph_t g = nullptr;
  FLAME_ASSERT_OK(flame_graph_capture_end(ctx, &g));
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> next = random_floats(rng, 24);
    T fresh = from_floats(ctx, next, {4, 6});
    FLAME_ASSERT_OK(flame_copy(batch, fresh));  // eager, in stream order before the replay
    FLAME_ASSERT_OK(flame_graph_replay(g));
    T ref;
    FLAME_ASSERT_OK(chain(fresh, c, ref.out()));
    expect_bitwise(floats(y), floats(ref), "copy refilled inside the graph");
  }
  flame_graph_release(g);
}

TEST_F(Graph, CopyRefusesBadArgumentsAndWritesNothing) {
  const int64_t shape[] = {4, 6}, other[] = {6, 4};
  T dst, src, wrong, dst_t;
  FLAME_ASSERT_OK(flame_zeros(ctx, shape, 2, FLAME_DTYPE_F32, dst.out()));
  FLAME_ASSERT_OK(flame_ones(ctx, shape, 2, FLAME_DTYPE_F32, src.out()));
  FLAME_ASSERT_OK(flame_ones(ctx, other, 2, FLAME_DTYPE_F32, wrong.out()));
  FLAME_EXPECT_STATUS(flame_copy(nullptr, src), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_copy(dst, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_copy(dst, wrong), FLAME_ERROR_SHAPE_MISMATCH);
  FLAME_ASSERT_OK(flame_transpose(wrong, 0, 1, dst_t.out()));  // [4, 6] strided destination
  FLAME_EXPECT_STATUS(flame_copy(dst_t, src), FLAME_ERROR_INVALID_ARGUMENT);
  // Partial overlap: rows 0-2 into rows 1-3 of the same storage.
  T big, lo, hi;
  const int64_t five[] = {5, 6};
  FLAME_ASSERT_OK(flame_zeros(ctx, five, 2, FLAME_DTYPE_F32, big.out()));
  FLAME_ASSERT_OK(flame_narrow(big, 0, 0, 4, lo.out()));
  FLAME_ASSERT_OK(flame_narrow(big, 0, 1, 4, hi.out()));
  FLAME_EXPECT_STATUS(flame_copy(hi, lo), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_ASSERT_OK(flame_copy(lo, lo));  // itself: a no-op
  // A parameter: only with grad mode off.
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(dst, 1));
  FLAME_EXPECT_STATUS(flame_copy(dst, src), FLAME_ERROR_INVALID_ARGUMENT);
  for (float v : floats(dst)) ASSERT_EQ(v, 0.0f) << "a rejected copy wrote";
  int32_t previous = 0;
  FLAME_ASSERT_OK(flame_ctx_set_grad_enabled(ctx, 0, &previous));
  FLAME_ASSERT_OK(flame_copy(dst, src));
  FLAME_ASSERT_OK(flame_ctx_set_grad_enabled(ctx, previous, nullptr));
  for (float v : floats(dst)) ASSERT_EQ(v, 1.0f);
  // Another context's tensor.
  flame_ctx_t other_ctx = nullptr;
  FLAME_ASSERT_OK(flame_ctx_create(nullptr, &other_ctx));
  T foreign;
  FLAME_ASSERT_OK(flame_ones(other_ctx, shape, 2, FLAME_DTYPE_F32, foreign.out()));
  FLAME_EXPECT_STATUS(flame_copy(src, foreign), FLAME_ERROR_INVALID_ARGUMENT);
  foreign = T();
  flame_ctx_destroy(other_ctx);
}

TEST(GraphContext, DestroyingTheContextDuringACaptureDiscardsIt) {
  FLAME_GPU_CONTEXT(c);
  const int64_t shape[] = {8};
  flame_tensor_t x = nullptr;
  ASSERT_EQ(flame_ones(c, shape, 1, FLAME_DTYPE_F32, &x), FLAME_OK);
  ASSERT_EQ(flame_graph_capture_begin(c), FLAME_OK) << flame_last_error_message();
  flame_tensor_t y = nullptr;
  ASSERT_EQ(flame_mul_scalar(x, 2.0, &y), FLAME_OK) << flame_last_error_message();
  flame_ctx_destroy(c);  // the tensors keep the context alive; the capture is gone
  std::vector<float> v(8);
  ASSERT_EQ(flame_to_host(x, v.data(), v.size() * sizeof(float)), FLAME_OK) << flame_last_error_message();
  EXPECT_EQ(v[3], 1.0f);
  flame_tensor_release(y);
  flame_tensor_release(x);
}

}  // namespace

// The optimizer applied inside backward (bench/optimizer_in_backward.h, flame_bench_model_step
// --optimizer-in-backward): one AdamW per adapter tensor, stepped from its post-accumulate-grad hook,
// which then drops the gradient.
//  - On a tiny Flux with a LoRA and every block checkpointed (so that the hooks fire inside the
//    recompute walks), 3 steps equal 3 steps of the normal path (one AdamW, step and zero_grad after
//    backward), eagerly and with steps 2 and 3 replayed from a captured CUDA graph; every hook fires
//    exactly once per backward and every per-tensor optimizer counts 3 steps.
//  - The peak over steps 2 and 3 (flame_ctx_memory_stats) drops by at least half the adapter's
//    gradient bytes. The normal path holds every gradient at the end of backward (its peak is at
//    least weights + state + all gradients); in backward at most the gradient being stepped is held
//    beside the activations, which the tiny model keeps far below the gradients (rank 64 on 32-wide
//    layers with 17 tokens), so the drop is the gradients' bytes less one gradient and those
//    activations; half is a margin for them.
//  - The engine's ordering: a parameter read twice in one walk gets its hook once, after both
//    contributions (equal to one AdamW step on the summed gradient); one read by two checkpointed
//    segments (two walks) gets it twice, which the hook refuses (FLAME_ERROR_UNSUPPORTED).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>
#include "../../bench/optimizer_in_backward.h"
#include "flame_test.h"
#include "model_test_handles.h"

namespace {

class ModelLoraOptimizerInBackward : public GpuTest {};

const char* const kFlux = kTinyFluxConfig;
const char* const kLora = R"({"rank": 64, "alpha": 32})";
constexpr int kSteps = 3;

struct OibHandle {
  OptimizerInBackward* p = nullptr;
  ~OibHandle() { oib_release(p); }
};
struct OptimizerHandle {
  flame_optimizer_t p = nullptr;
  ~OptimizerHandle() { flame_optimizer_release(p); }
};
struct GraphHandle {
  flame_graph_t p = nullptr;
  ~GraphHandle() { flame_graph_release(p); }
};

// Deterministic values (a sine with a phase per tensor) times scale into every tensor of list.
void fill_list(flame_params_t list, float scale, float phase) {
  int64_t count = 0;
  ASSERT_EQ(flame_params_count(list, &count), FLAME_OK);
  for (int64_t i = 0; i < count; ++i) {
    flame_tensor_t t = nullptr;
    int64_t n = 0;
    ASSERT_EQ(flame_params_tensor(list, i, &t), FLAME_OK);
    ASSERT_EQ(flame_tensor_numel(t, &n), FLAME_OK);
    std::vector<float> v(static_cast<size_t>(n));
    for (size_t k = 0; k < v.size(); ++k) v[k] = scale * std::sin(0.37f * static_cast<float>(k) + phase + 1.3f * static_cast<float>(i));
    ASSERT_EQ(flame_copy_from_host(t, v.data(), v.size() * sizeof(float)), FLAME_OK) << flame_last_error_message();
  }
}

// forward, loss = sum(sample^2), backward (the hooks run inside it in the in-backward mode).
flame_status_t forward_backward(flame_ctx_t ctx, flame_model_t m, flame_params_t in) {
  ParamsHandle out;
  flame_status_t st = flame_model_forward(m, in, &out.p);
  if (st != FLAME_OK) return st;
  flame_tensor_t y = nullptr;
  if ((st = flame_params_find(out.p, "sample", &y)) != FLAME_OK) return st;
  if (!y) return FLAME_ERROR_INVALID_ARGUMENT;
  T sq, loss;
  if ((st = flame_mul(y, y, sq.out())) != FLAME_OK) return st;
  if ((st = flame_sum_all(sq, loss.out())) != FLAME_OK) return st;
  return flame_backward(ctx, loss, nullptr, 0);
}

struct Outcome {
  std::vector<std::vector<float>> initial, final;  // the adapter's values before and after the steps
  uint64_t peak = 0;                               // peak_bytes_in_use over steps 2 .. kSteps
  uint64_t grad_bytes = 0, largest_grad = 0;       // the adapter's gradients: all, and the largest one
};

// One step after the forward and backward: the normal path's update, or the in-backward bookkeeping
// (every adapter tensor stepped once, no gradient left).
void finish_step(OptimizerInBackward* oib, flame_optimizer_t opt, int64_t n_adapter) {
  if (oib) {
    int64_t stepped = -1;
    oib_end_backward(oib, &stepped);
    EXPECT_EQ(stepped, n_adapter) << "every adapter tensor's hook must step it exactly once per backward";
    return;
  }
  FLAME_ASSERT_OK(flame_optimizer_step(opt));
  FLAME_ASSERT_OK(flame_optimizer_zero_grad(opt, 1));
}

// kSteps LoRA steps of the tiny Flux (every block checkpointed), the optimizer in backward or not;
// with graph, steps 2 .. kSteps are replays of one captured step.
void train(flame_ctx_t ctx, bool in_backward, bool graph, Outcome* r) {
  ModelHandle m;
  ASSERT_EQ(flame_model_create(ctx, "FluxTransformer2DModel", kFlux, nullptr, &m.m), FLAME_OK) << flame_last_error_message();
  {
    ParamsHandle base;
    ASSERT_EQ(flame_model_params(m.m, &base.p), FLAME_OK);
    fill_list(base.p, 0.2f, 0.0f);
  }
  FLAME_ASSERT_OK(flame_model_set_checkpointing(m.m, 1));
  FLAME_ASSERT_OK(flame_model_set_training(m.m, 1));
  ParamsHandle adapter, in;
  ASSERT_EQ(flame_model_add_lora(m.m, kLora, &adapter.p), FLAME_OK) << flame_last_error_message();
  fill_list(adapter.p, 0.1f, 0.5f);  // B != 0: every tensor gets a nonzero gradient
  make_tiny_model_inputs(ctx, "FluxTransformer2DModel", in);

  int64_t n = 0;
  const flame_tensor_t* list = nullptr;
  ASSERT_EQ(flame_params_count(adapter.p, &n), FLAME_OK);
  ASSERT_EQ(flame_params_tensors(adapter.p, &list), FLAME_OK);
  ASSERT_GT(n, 8);
  for (int64_t i = 0; i < n; ++i) {
    int64_t numel = 0;
    flame_dtype_t dtype = FLAME_DTYPE_F64;
    ASSERT_EQ(flame_tensor_numel(list[i], &numel), FLAME_OK);
    ASSERT_EQ(flame_tensor_dtype(list[i], &dtype), FLAME_OK);
    ASSERT_EQ(dtype, FLAME_DTYPE_F32);
    const uint64_t bytes = static_cast<uint64_t>(numel) * sizeof(float);
    r->grad_bytes += bytes;
    r->largest_grad = std::max(r->largest_grad, bytes);
    r->initial.push_back(host_of(list[i]));
  }

  flame_optimizer_options_t oo;
  FLAME_ASSERT_OK(flame_optimizer_options_init(&oo, FLAME_OPTIMIZER_ADAMW));
  oo.lr = 1e-2;
  OibHandle oib;
  OptimizerHandle opt;
  if (in_backward)
    FLAME_ASSERT_OK(oib_create(ctx, &oo, list, n, &oib.p));
  else
    FLAME_ASSERT_OK(flame_optimizer_create(ctx, &oo, list, n, &opt.p));

  // Step 1, eager (it makes the optimizers' state).
  FLAME_ASSERT_OK(forward_backward(ctx, m.m, in.p));
  finish_step(oib.p, opt.p, n);
  for (int64_t i = 0; i < n; ++i) {
    T g;
    FLAME_ASSERT_OK(flame_tensor_grad(list[i], g.out()));
    EXPECT_EQ(g.h, nullptr) << "adapter tensor " << i << " kept a gradient after the step";
  }
  FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));
  FLAME_ASSERT_OK(flame_ctx_reset_peak_memory(ctx));

  GraphHandle g;
  if (graph) {
    FLAME_ASSERT_OK(flame_graph_capture_begin(ctx));
    const flame_status_t st = forward_backward(ctx, m.m, in.p);
    if (st == FLAME_OK) {
      finish_step(oib.p, opt.p, n);
    } else if (oib.p) {
      oib_end_backward(oib.p, nullptr);
    }
    FLAME_ASSERT_OK(flame_graph_capture_end(ctx, &g.p));
    ASSERT_EQ(st, FLAME_OK);
    for (int s = 1; s < kSteps; ++s) FLAME_ASSERT_OK(flame_graph_replay(g.p));
  } else {
    for (int s = 1; s < kSteps; ++s) {
      FLAME_ASSERT_OK(forward_backward(ctx, m.m, in.p));
      finish_step(oib.p, opt.p, n);
    }
  }
  FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));
  flame_memory_stats_t mem;
  mem.struct_size = sizeof mem;
  FLAME_ASSERT_OK(flame_ctx_memory_stats(ctx, &mem));
  r->peak = mem.peak_bytes_in_use;
  for (int64_t i = 0; i < n; ++i) r->final.push_back(host_of(list[i]));

  if (oib.p)  // the captured hooks' steps count once per replay
    for (int64_t i = 0; i < n; ++i) {
      int64_t steps = 0;
      FLAME_ASSERT_OK(flame_optimizer_step_count(oib.p->slots[i].opt, &steps));
      EXPECT_EQ(steps, kSteps) << "adapter tensor " << i;
    }
  flame_graph_release(g.p);  // before the optimizers whose state it updates
  g.p = nullptr;
}

// max |a - b| / max |b| over all tensors.
double rel_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t t = 0; t < a.size() && t < b.size(); ++t) {
    EXPECT_EQ(a[t].size(), b[t].size());
    for (size_t i = 0; i < a[t].size() && i < b[t].size(); ++i) {
      num = std::max(num, std::fabs(static_cast<double>(a[t][i]) - b[t][i]));
      den = std::max(den, std::fabs(static_cast<double>(b[t][i])));
    }
  }
  return den > 0 ? num / den : num;
}

void compare_with_normal_path(flame_ctx_t ctx, bool graph) {
  SCOPED_TRACE(graph ? "CUDA graph" : "eager");
  Outcome normal, in_backward;
  train(ctx, false, graph, &normal);
  if (::testing::Test::HasFatalFailure()) return;
  train(ctx, true, graph, &in_backward);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_GT(rel_diff(normal.final, normal.initial), 1e-3) << "the steps changed nothing";
  // The same gradients and the same per-element AdamW: equal up to rounding (bit-equal expected).
  EXPECT_LE(rel_diff(in_backward.final, normal.final), 1e-6);
  const double saved = static_cast<double>(normal.peak) - static_cast<double>(in_backward.peak);
  EXPECT_GE(saved, 0.5 * static_cast<double>(normal.grad_bytes))
      << "peak " << normal.peak << " B normally, " << in_backward.peak << " B with the optimizer in backward; adapter gradients "
      << normal.grad_bytes << " B (largest " << normal.largest_grad << " B)";
}

TEST_F(ModelLoraOptimizerInBackward, EqualsNormalStepsWithLowerPeakEager) { compare_with_normal_path(ctx, false); }

TEST_F(ModelLoraOptimizerInBackward, EqualsNormalStepsWithLowerPeakInCudaGraph) { compare_with_normal_path(ctx, true); }

// The in-backward steps replayed from a graph equal the normal path's eager steps: a graph that
// replayed nothing (both paths alike) would fail here, not above.
TEST_F(ModelLoraOptimizerInBackward, GraphEqualsEager) {
  Outcome eager, graph;
  train(ctx, false, false, &eager);
  if (HasFatalFailure()) return;
  train(ctx, true, true, &graph);
  if (HasFatalFailure()) return;
  EXPECT_LE(rel_diff(graph.final, eager.final), 1e-6);
}

// ---- the engine's ordering ----

#define CK(expr)                     \
  do {                               \
    flame_status_t st_ = (expr);     \
    if (st_ != FLAME_OK) return st_; \
  } while (0)

// out = tanh(in @ w), w through user_data (not an input: the checkpoint's inner walk delivers it).
flame_status_t tanh_matmul_fn(void* w, const flame_tensor_t* in, int32_t n_in, flame_tensor_t* out, int32_t n_out) {
  if (n_in != 1 || n_out != 1) return FLAME_ERROR_INVALID_ARGUMENT;
  T z;
  CK(flame_matmul(in[0], static_cast<flame_tensor_t>(w), z.out()));
  return flame_tanh(z, out);
}

T leaf(flame_ctx_t ctx, const std::vector<int64_t>& shape, float scale, bool requires_grad) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  T t(host_tensor(ctx, shape, ramp(static_cast<size_t>(n), scale)));
  if (requires_grad) {
    EXPECT_EQ(flame_tensor_set_requires_grad(t, 1), FLAME_OK);
  }
  return t;
}

// loss = sum(tanh(tanh(x @ w) @ w)): w read twice in one walk, or (checkpointed) in two walks.
flame_status_t two_uses(flame_ctx_t ctx, flame_tensor_t x, flame_tensor_t w, bool checkpointed) {
  T h1, h2, loss;
  if (checkpointed) {
    CK(flame_checkpoint(ctx, tanh_matmul_fn, w, nullptr, &x, 1, h1.out(), 1));
    flame_tensor_t h = h1;
    CK(flame_checkpoint(ctx, tanh_matmul_fn, w, nullptr, &h, 1, h2.out(), 1));
  } else {
    CK(tanh_matmul_fn(w, &x, 1, h1.out(), 1));
    flame_tensor_t h = h1;
    CK(tanh_matmul_fn(w, &h, 1, h2.out(), 1));
  }
  CK(flame_sum_all(h2, loss.out()));
  return flame_backward(ctx, loss, nullptr, 0);
}

TEST_F(ModelLoraOptimizerInBackward, HookFiresOnceAfterAllContributionsOfAWalk) {
  T x = leaf(ctx, {3, 4}, 1.0f, false);
  T w = leaf(ctx, {4, 4}, 0.5f, true), w_ref = leaf(ctx, {4, 4}, 0.5f, true);
  flame_optimizer_options_t oo;
  FLAME_ASSERT_OK(flame_optimizer_options_init(&oo, FLAME_OPTIMIZER_ADAMW));
  oo.lr = 0.1;
  OibHandle oib;
  OptimizerHandle ref;
  flame_tensor_t wh = w;
  flame_tensor_t wr = w_ref;
  FLAME_ASSERT_OK(oib_create(ctx, &oo, &wh, 1, &oib.p));
  FLAME_ASSERT_OK(flame_optimizer_create(ctx, &oo, &wr, 1, &ref.p));
  for (int s = 0; s < 2; ++s) {
    FLAME_ASSERT_OK(two_uses(ctx, x, w, false));
    int64_t stepped = 0;
    oib_end_backward(oib.p, &stepped);
    EXPECT_EQ(stepped, 1);
    FLAME_ASSERT_OK(two_uses(ctx, x, w_ref, false));
    FLAME_ASSERT_OK(flame_optimizer_step(ref.p));
    FLAME_ASSERT_OK(flame_optimizer_zero_grad(ref.p, 1));
  }
  const std::vector<float> a = host_of(w), b = host_of(w_ref), w0 = ramp(16, 0.5f);
  double diff = 0, moved = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    moved = std::max(moved, std::fabs(static_cast<double>(b[i]) - w0[i]));
  }
  EXPECT_GT(moved, 1e-3);
  EXPECT_LE(diff, 1e-6) << "the hook stepped before the second contribution arrived";
}

TEST_F(ModelLoraOptimizerInBackward, RefusesAParameterReadByTwoCheckpointedWalks) {
  T x = leaf(ctx, {3, 4}, 1.0f, false);
  T w = leaf(ctx, {4, 4}, 0.5f, true);
  flame_optimizer_options_t oo;
  FLAME_ASSERT_OK(flame_optimizer_options_init(&oo, FLAME_OPTIMIZER_ADAMW));
  OibHandle oib;
  flame_tensor_t wh = w;
  FLAME_ASSERT_OK(oib_create(ctx, &oo, &wh, 1, &oib.p));
  const flame_status_t st = two_uses(ctx, x, w, true);
  EXPECT_EQ(st, FLAME_ERROR_UNSUPPORTED) << flame_last_error_message();
  EXPECT_NE(std::string(flame_last_error_message()).find("ran twice in one backward"), std::string::npos)
      << flame_last_error_message();
  int64_t stepped = 0;
  oib_end_backward(oib.p, &stepped);
  EXPECT_EQ(stepped, 1);  // the first walk's step (on a partial gradient: why the second is refused)
}

}  // namespace

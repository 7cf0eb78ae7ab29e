// Gradient checkpointing through C callbacks: a deep MLP with dropout (flame_rand masks) gives
// bit-identical gradients (parameters reached through user_data, and the input) with and without
// checkpointing, and a peak memory lower by a measured amount; a block with two outputs, parameters
// passed as inputs, flame_grad and a hook on an output; the RNG state is replayed and restored;
// errors from the callback in forward and in backward; destroy runs exactly once; the unsupported
// cases (flame_grad with a parameter hidden in user_data, create_graph) fail cleanly.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>
#include "host_ref.h"

using namespace href;

namespace {

class Checkpoint : public GpuTest {};

// ---- a small MLP written against the C ABI ----
struct Mlp {
  std::vector<T> w, b;  // [D, D], [D]
  double p = 0.1;       // dropout probability
};

#define CK(expr)                            \
  do {                                      \
    flame_status_t st_ = (expr);            \
    if (st_ != FLAME_OK) return st_;        \
  } while (0)

// h -> dropout(relu(linear(h, w, b))) with a mask from flame_rand; *out a new reference.
flame_status_t layer(flame_ctx_t ctx, flame_tensor_t h, flame_tensor_t w, flame_tensor_t b, double p, flame_tensor_t* out) {
  T z, r, u, keep, thr, mask, m;
  CK(flame_linear(h, w, b, FLAME_ACTIVATION_NONE, z.out()));
  CK(flame_relu(z, r.out()));
  int64_t shape[2] = {0, 0};
  CK(flame_tensor_shape(r, shape, 2));
  CK(flame_rand(ctx, shape, 2, FLAME_DTYPE_F32, u.out()));
  CK(flame_full(ctx, nullptr, 0, FLAME_DTYPE_F32, p, thr.out()));
  CK(flame_ge(u, thr, keep.out()));
  CK(flame_to_dtype(keep, FLAME_DTYPE_F32, mask.out()));
  CK(flame_mul(r, mask, m.out()));
  return flame_mul_scalar(m, 1.0 / (1.0 - p), out);
}

struct Segment {
  Mlp* mlp;
  int first, count;
  int* destroyed;
};
flame_status_t segment_fn(void* ud, const flame_tensor_t* inputs, int32_t n_inputs, flame_tensor_t* outputs, int32_t n_outputs) {
  const Segment& s = *static_cast<const Segment*>(ud);
  if (n_inputs != 1 || n_outputs != 1) return FLAME_ERROR_INVALID_ARGUMENT;
  flame_ctx_t ctx = nullptr;
  CK(flame_tensor_context(inputs[0], &ctx));
  T h;
  CK(flame_tensor_retain(inputs[0]));
  h.h = inputs[0];
  for (int i = s.first; i < s.first + s.count; ++i) {
    T next;
    CK(layer(ctx, h, s.mlp->w[static_cast<size_t>(i)], s.mlp->b[static_cast<size_t>(i)], s.mlp->p, next.out()));
    h = std::move(next);
  }
  outputs[0] = h.h;
  h.h = nullptr;
  return FLAME_OK;
}
void count_destroy(void* ud) { ++*static_cast<Segment*>(ud)->destroyed; }

uint64_t peak(flame_ctx_t ctx) {
  flame_memory_stats_t s;
  std::memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  EXPECT_EQ(flame_ctx_memory_stats(ctx, &s), FLAME_OK);
  return s.peak_bytes_in_use;
}

std::vector<unsigned char> bytes_of(flame_tensor_t t) {
  std::vector<unsigned char> v(static_cast<size_t>(numel_of(t)) * dsize(dtype_of(t)));
  EXPECT_EQ(flame_to_host(t, v.data(), v.size()), FLAME_OK);
  return v;
}

TEST_F(Checkpoint, DeepMlpSameGradientsLessMemory) {
  HREF_RNG(rng);
  const int64_t batch = 4096, width = 256;
  const int layers = 8, per_segment = 2;
  Mlp mlp;
  const double bound = 1.0 / std::sqrt(static_cast<double>(width));
  for (int i = 0; i < layers; ++i) {
    mlp.w.push_back(upload(ctx, random(rng, {width, width}, FLAME_DTYPE_F32, -bound, bound)));
    mlp.b.push_back(upload(ctx, random(rng, {width}, FLAME_DTYPE_F32, -0.1, 0.1)));
    FLAME_ASSERT_OK(flame_tensor_set_requires_grad(mlp.w.back(), 1));
    FLAME_ASSERT_OK(flame_tensor_set_requires_grad(mlp.b.back(), 1));
  }
  T x = upload(ctx, random(rng, {batch, width}, FLAME_DTYPE_F32, -1, 1));
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(x, 1));
  std::vector<flame_tensor_t> leaves = {x};
  for (int i = 0; i < layers; ++i) leaves.push_back(mlp.w[static_cast<size_t>(i)]), leaves.push_back(mlp.b[static_cast<size_t>(i)]);

  int destroyed = 0;
  std::vector<Segment> segs;
  for (int s = 0; s < layers / per_segment; ++s) segs.push_back({&mlp, s * per_segment, per_segment, &destroyed});
  std::vector<std::vector<unsigned char>> grads[2];
  uint64_t peaks[2] = {0, 0}, offsets[2] = {0, 0};
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE(run ? "checkpointed" : "plain");
    FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));
    FLAME_ASSERT_OK(flame_ctx_set_rng_state(ctx, 99, 0));
    FLAME_ASSERT_OK(flame_ctx_reset_peak_memory(ctx));
    {
      T h;
      FLAME_ASSERT_OK(flame_tensor_retain(x));
      h.h = x;
      if (run == 0) {
        for (int i = 0; i < layers; ++i) {
          T next;
          FLAME_ASSERT_OK(layer(ctx, h, mlp.w[static_cast<size_t>(i)], mlp.b[static_cast<size_t>(i)], mlp.p, next.out()));
          h = std::move(next);
        }
      } else {
        for (Segment& s : segs) {
          T next;
          flame_tensor_t in = h;
          FLAME_ASSERT_OK(flame_checkpoint(ctx, segment_fn, &s, count_destroy, &in, 1, next.out(), 1));
          h = std::move(next);
        }
      }
      T sq, sum, loss;
      FLAME_ASSERT_OK(flame_mul(h, h, sq.out()));
      FLAME_ASSERT_OK(flame_sum_all(sq, sum.out()));
      FLAME_ASSERT_OK(flame_mul_scalar(sum, 1.0 / static_cast<double>(batch * width), loss.out()));
      FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
      FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));
      peaks[run] = peak(ctx);
      uint64_t seed = 0;
      FLAME_ASSERT_OK(flame_ctx_get_rng_state(ctx, &seed, &offsets[run]));
    }
    for (flame_tensor_t l : leaves) {
      T g;
      FLAME_ASSERT_OK(flame_tensor_grad(l, g.out()));
      ASSERT_NE(g.h, nullptr);
      grads[run].push_back(bytes_of(g));
      FLAME_ASSERT_OK(flame_tensor_set_grad(l, nullptr));
    }
  }
  // Identical gradients, bit for bit: same masks (the RNG state was replayed), same kernels.
  for (size_t k = 0; k < leaves.size(); ++k) EXPECT_TRUE(grads[0][k] == grads[1][k]) << "leaf " << k << " differs";
  // The recomputation replays the generator and restores it: the same offset after both runs.
  EXPECT_EQ(offsets[0], offsets[1]);
  // Plain: 8 layers x 4 saved activations of 4 MiB; checkpointed: 4 segment inputs, and 2 layers
  // rebuilt at a time. Expect at least 8 activations (32 MiB) less at the peak.
  const double mib = 1024.0 * 1024.0;
  std::printf("[Checkpoint] peak memory: plain %.1f MiB, checkpointed %.1f MiB, saved %.1f MiB\n", peaks[0] / mib,
              peaks[1] / mib, (static_cast<double>(peaks[0]) - static_cast<double>(peaks[1])) / mib);
  EXPECT_GT(peaks[0], peaks[1] + (uint64_t{32} << 20));
  // The graph is gone: every segment's destroy ran once.
  EXPECT_EQ(destroyed, layers / per_segment);
}

// ---- a block with two outputs and its parameters as inputs: y1 = tanh(x w^T), y2 = y1 * y1 ----
flame_status_t two_outputs(void*, const flame_tensor_t* in, int32_t n_in, flame_tensor_t* out, int32_t n_out) {
  if (n_in != 2 || n_out != 2) return FLAME_ERROR_INVALID_ARGUMENT;
  T z;
  CK(flame_linear(in[0], in[1], nullptr, FLAME_ACTIVATION_NONE, z.out()));
  CK(flame_tanh(z, &out[0]));
  return flame_mul(out[0], out[0], &out[1]);
}
flame_status_t double_hook(void*, flame_tensor_t g, flame_tensor_t* replacement) { return flame_mul_scalar(g, 2.0, replacement); }

// loss = sum(y1) + sum(y2 * c); gradients of x and w through flame_grad or flame_backward.
void two_output_grads(flame_ctx_t ctx, bool ckpt, bool use_grad, bool hook, flame_tensor_t x, flame_tensor_t w, flame_tensor_t c,
                      std::vector<std::vector<unsigned char>>* out) {
  T y[2], s1, p2, s2, loss;
  if (ckpt) {
    flame_tensor_t in[2] = {x, w};
    flame_tensor_t o[2] = {nullptr, nullptr};
    ASSERT_EQ(flame_checkpoint(ctx, two_outputs, nullptr, nullptr, in, 2, o, 2), FLAME_OK) << flame_last_error_message();
    y[0].h = o[0];
    y[1].h = o[1];
  } else {
    flame_tensor_t in[2] = {x, w};
    flame_tensor_t o[2] = {nullptr, nullptr};
    ASSERT_EQ(two_outputs(nullptr, in, 2, o, 2), FLAME_OK);
    y[0].h = o[0];
    y[1].h = o[1];
  }
  flame_hook_t h = nullptr;
  if (hook) {
    ASSERT_EQ(flame_tensor_register_hook(y[1], double_hook, nullptr, nullptr, &h), FLAME_OK);
  }
  ASSERT_EQ(flame_sum_all(y[0], s1.out()), FLAME_OK);
  ASSERT_EQ(flame_mul(y[1], c, p2.out()), FLAME_OK);
  ASSERT_EQ(flame_sum_all(p2, s2.out()), FLAME_OK);
  ASSERT_EQ(flame_add(s1, s2, loss.out()), FLAME_OK);
  if (use_grad) {
    flame_tensor_t ins[2] = {x, w}, res[2] = {nullptr, nullptr};
    flame_tensor_t root = loss;
    ASSERT_EQ(flame_grad(ctx, &root, nullptr, 1, ins, 2, 0, res), FLAME_OK) << flame_last_error_message();
    for (flame_tensor_t r : res) {
      out->push_back(bytes_of(r));
      flame_tensor_release(r);
    }
  } else {
    ASSERT_EQ(flame_backward(ctx, loss, nullptr, 0), FLAME_OK) << flame_last_error_message();
    for (flame_tensor_t l : {x, w}) {
      T g;
      ASSERT_EQ(flame_tensor_grad(l, g.out()), FLAME_OK);
      out->push_back(bytes_of(g));
      ASSERT_EQ(flame_tensor_set_grad(l, nullptr), FLAME_OK);
    }
  }
  flame_hook_remove(h);
}

TEST_F(Checkpoint, TwoOutputsParametersAsInputsGradAndHooks) {
  HREF_RNG(rng);
  T x = upload(ctx, random(rng, {16, 8}, FLAME_DTYPE_F32, -1, 1)), w = upload(ctx, random(rng, {5, 8}, FLAME_DTYPE_F32, -1, 1));
  T c = upload(ctx, random(rng, {16, 5}, FLAME_DTYPE_F32, -1, 1));
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(x, 1));
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(w, 1));
  for (bool use_grad : {false, true})
    for (bool hook : {false, true}) {
      SCOPED_TRACE(::testing::Message() << (use_grad ? "flame_grad" : "flame_backward") << (hook ? ", hook on y2" : ""));
      std::vector<std::vector<unsigned char>> plain, ckpt;
      two_output_grads(ctx, false, use_grad, hook, x, w, c, &plain);
      two_output_grads(ctx, true, use_grad, hook, x, w, c, &ckpt);
      ASSERT_EQ(plain.size(), 2u);
      ASSERT_EQ(ckpt.size(), 2u);
      // y1 feeds two branches, whose gradients the two walks may sum in another order: last-bit
      // differences are allowed here (the MLP test, a chain, is bit-exact).
      for (size_t k = 0; k < 2; ++k) {
        ASSERT_EQ(plain[k].size(), ckpt[k].size());
        std::vector<float> a(plain[k].size() / 4), b(a.size());
        std::memcpy(a.data(), plain[k].data(), plain[k].size());
        std::memcpy(b.data(), ckpt[k].data(), ckpt[k].size());
        for (size_t i = 0; i < a.size(); ++i)
          EXPECT_NEAR(a[i], b[i], 1e-6 * (1 + std::fabs(a[i]))) << (k ? "w" : "x") << "[" << i << "]";
      }
    }
}

// ---- errors, call counts, graph lifetime ----
struct Probe {
  int calls = 0, destroyed = 0;
  int fail_on_call = 0;             // 1: the first call fails, 2: the second (backward)
  flame_status_t status = FLAME_ERROR_SHAPE_MISMATCH;
  bool null_output = false, reshape_in_backward = false;
  flame_tensor_t param = nullptr;   // multiplies the input when set (a parameter hidden in user_data)
};
flame_status_t probe_fn(void* ud, const flame_tensor_t* in, int32_t, flame_tensor_t* out, int32_t) {
  Probe& p = *static_cast<Probe*>(ud);
  ++p.calls;
  if (p.calls == p.fail_on_call) {
    flame_set_error_message("the block refused its input");
    return p.status;
  }
  if (p.null_output) return FLAME_OK;
  T y;
  if (p.param) CK(flame_mul(in[0], p.param, y.out()));
  else CK(flame_mul(in[0], in[0], y.out()));
  if (p.reshape_in_backward && p.calls == 2) {
    const int64_t flat[1] = {-1};
    return flame_reshape(y, flat, 1, &out[0]);
  }
  out[0] = y.h;
  y.h = nullptr;
  return FLAME_OK;
}
void probe_destroy(void* ud) { ++static_cast<Probe*>(ud)->destroyed; }

TEST_F(Checkpoint, ErrorsLifetimeAndUnsupportedCases) {
  const HT xv = HT::from_values({2, 3}, FLAME_DTYPE_F32, {1, 2, 3, -1, -2, 0.5});
  T x = upload(ctx, xv);
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(x, 1));
  flame_tensor_t in = x;
  auto sum_backward = [&](flame_tensor_t y, uint32_t flags) {
    T s;
    EXPECT_EQ(flame_sum_all(y, s.out()), FLAME_OK);
    return flame_backward(ctx, s, nullptr, flags);
  };
  {  // the block fails in forward: its status and message, outputs NULL, destroy once
    Probe p;
    p.fail_on_call = 1;
    flame_tensor_t out = href::sentinel();
    FLAME_EXPECT_STATUS(flame_checkpoint(ctx, probe_fn, &p, probe_destroy, &in, 1, &out, 1), FLAME_ERROR_SHAPE_MISMATCH);
    const std::string msg = flame_last_error_message();
    EXPECT_NE(msg.find("flame_checkpoint"), std::string::npos) << msg;
    EXPECT_NE(msg.find("the block refused its input"), std::string::npos) << msg;
    EXPECT_EQ(out, nullptr);
    EXPECT_EQ(p.destroyed, 1);
  }
  {  // the block fails in backward: the status reaches flame_backward; nothing accumulated
    Probe p;
    p.fail_on_call = 2;
    p.status = FLAME_ERROR_OUT_OF_MEMORY;
    T y;
    FLAME_ASSERT_OK(flame_checkpoint(ctx, probe_fn, &p, probe_destroy, &in, 1, y.out(), 1));
    FLAME_EXPECT_STATUS(sum_backward(y, 0), FLAME_ERROR_OUT_OF_MEMORY);
    EXPECT_NE(std::string(flame_last_error_message()).find("the block refused its input"), std::string::npos);
    T g;
    FLAME_ASSERT_OK(flame_tensor_grad(x, g.out()));
    EXPECT_EQ(g.h, nullptr);
    EXPECT_EQ(p.destroyed, 0);
    y = T();  // the graph goes with the output
    EXPECT_EQ(p.destroyed, 1);
  }
  {  // a NULL output; an output of another shape in backward
    Probe p;
    p.null_output = true;
    flame_tensor_t out = href::sentinel();
    FLAME_EXPECT_STATUS(flame_checkpoint(ctx, probe_fn, &p, probe_destroy, &in, 1, &out, 1), FLAME_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(out, nullptr);
    EXPECT_EQ(p.destroyed, 1);
    Probe q;
    q.reshape_in_backward = true;
    T y;
    FLAME_ASSERT_OK(flame_checkpoint(ctx, probe_fn, &q, probe_destroy, &in, 1, y.out(), 1));
    FLAME_EXPECT_STATUS(sum_backward(y, 0), FLAME_ERROR_INVALID_ARGUMENT);
  }
  {  // retain_graph: two walks, each re-running the block; without it the second is GRAPH_FREED
    Probe p;
    T y;
    FLAME_ASSERT_OK(flame_checkpoint(ctx, probe_fn, &p, probe_destroy, &in, 1, y.out(), 1));
    EXPECT_EQ(p.calls, 1);
    FLAME_ASSERT_OK(sum_backward(y, FLAME_BACKWARD_RETAIN_GRAPH));
    FLAME_ASSERT_OK(sum_backward(y, 0));
    EXPECT_EQ(p.calls, 3);
    FLAME_EXPECT_STATUS(sum_backward(y, 0), FLAME_ERROR_GRAPH_FREED);
    T g;
    FLAME_ASSERT_OK(flame_tensor_grad(x, g.out()));
    EXPECT_TRUE(matches(g, map1(xv, FLAME_DTYPE_F32, [](double v) { return 4 * v; })));  // 2 x 2x
    FLAME_ASSERT_OK(flame_tensor_set_grad(x, nullptr));
  }
  {  // create_graph through a checkpoint, flame_grad with a parameter hidden in user_data
    Probe p;
    T y, s;
    FLAME_ASSERT_OK(flame_checkpoint(ctx, probe_fn, &p, probe_destroy, &in, 1, y.out(), 1));
    FLAME_EXPECT_STATUS(sum_backward(y, FLAME_BACKWARD_CREATE_GRAPH | FLAME_BACKWARD_RETAIN_GRAPH), FLAME_ERROR_UNSUPPORTED);
    Probe q;  // declared before y2: the node's destroy writes into it
    T w = upload(ctx, HT({2, 3}, FLAME_DTYPE_F32, 3.0)), y2, s2;
    FLAME_ASSERT_OK(flame_tensor_set_requires_grad(w, 1));
    q.param = w;
    FLAME_ASSERT_OK(flame_checkpoint(ctx, probe_fn, &q, probe_destroy, &in, 1, y2.out(), 1));
    FLAME_ASSERT_OK(flame_sum_all(y2, s2.out()));
    flame_tensor_t root = s2, res = href::sentinel();
    FLAME_EXPECT_STATUS(flame_grad(ctx, &root, nullptr, 1, &in, 1, FLAME_BACKWARD_RETAIN_GRAPH, &res), FLAME_ERROR_UNSUPPORTED);
    // flame_backward reaches the hidden parameter: d sum(x w) / dw = x, / dx = w.
    FLAME_ASSERT_OK(flame_backward(ctx, s2, nullptr, 0));
    T gw, gx;
    FLAME_ASSERT_OK(flame_tensor_grad(w, gw.out()));
    FLAME_ASSERT_OK(flame_tensor_grad(x, gx.out()));
    EXPECT_TRUE(matches(gw, xv));
    EXPECT_TRUE(matches(gx, HT({2, 3}, FLAME_DTYPE_F32, 3.0)));
    FLAME_ASSERT_OK(flame_tensor_set_grad(x, nullptr));
  }
  {  // grad mode off: nothing recorded, destroy before the call returns
    Probe p;
    int32_t prev = 1, rg = 1;
    FLAME_ASSERT_OK(flame_ctx_set_grad_enabled(ctx, 0, &prev));
    T y;
    FLAME_ASSERT_OK(flame_checkpoint(ctx, probe_fn, &p, probe_destroy, &in, 1, y.out(), 1));
    FLAME_ASSERT_OK(flame_ctx_set_grad_enabled(ctx, prev, nullptr));
    EXPECT_EQ(p.destroyed, 1);
    FLAME_ASSERT_OK(flame_tensor_requires_grad(y, &rg));
    EXPECT_EQ(rg, 0);
    EXPECT_TRUE(matches(y, map1(xv, FLAME_DTYPE_F32, [](double v) { return v * v; })));
  }
  {  // bad arguments: destroy still runs once
    Probe p;
    flame_tensor_t out[2] = {href::sentinel(), href::sentinel()};
    FLAME_EXPECT_STATUS(flame_checkpoint(ctx, nullptr, &p, probe_destroy, &in, 1, out, 1), FLAME_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(out[0], nullptr);
    FLAME_EXPECT_STATUS(flame_checkpoint(ctx, probe_fn, &p, probe_destroy, &in, 1, out, 0), FLAME_ERROR_INVALID_ARGUMENT);
    FLAME_EXPECT_STATUS(flame_checkpoint(ctx, probe_fn, &p, probe_destroy, nullptr, 1, out, 1), FLAME_ERROR_INVALID_ARGUMENT);
    FLAME_EXPECT_STATUS(flame_checkpoint(nullptr, probe_fn, &p, probe_destroy, &in, 1, out, 1), FLAME_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(p.destroyed, 4);
    EXPECT_EQ(p.calls, 0);
  }
}

}  // namespace

// The two models the ZeRO GPU tests train (test_zero.cpp, test_zero_checkpoint.cpp,
// test_zero_comm_dtype.cpp, test_zero3.cpp, test_zero3_checkpoint.cpp), in one place so that
// every test trains exactly the same thing:
//  - a small MLP y = W2 relu(W1 x + b1) + b2 of 229 parameters (on 2 ranks the shard boundary,
//    115, cuts W1) for stages 1 and 2, with its seeded data (uniform);
//  - a tiny Flux transformer of 2 double and 4 single blocks (width 32, kFlux): 6 sharded blocks
//    for stage 3, with deterministic parameters and per-part, per-step inputs.
// Plus the ZeRO training step over a global batch of 2 parts (zero_train_step). What each test
// checks, and its tolerances, stay in the test files.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>
#include "flame_test.h"
#include "model_test_handles.h"
#include "rank_test_helpers.h"

// ---- the MLP ----

// n values uniform in [-scale, scale] from seed (the same on every rank and in every run).
inline std::vector<double> uniform(size_t n, uint32_t seed, double scale) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> u(-scale, scale);
  std::vector<double> v(n);
  for (double& x : v) x = u(g);
  return v;
}

constexpr int64_t kMlpIn = 8, kMlpHidden = 16, kMlpOut = 5, kMlpRows = 6;

struct Mlp {
  T w1, b1, w2, b2;
  std::vector<flame_tensor_t> params() const { return {w1.h, b1.h, w2.h, b2.h}; }
};

// The MLP's parameters of dtype d, requiring gradients; seed_offset != 0 gives other initial values.
inline bool make_mlp(flame_ctx_t ctx, Mlp& m, flame_dtype_t d, uint32_t seed_offset = 0) {
  auto make = [&](T& t, std::vector<int64_t> shape, uint32_t seed) {
    size_t n = 1;
    for (int64_t s : shape) n *= static_cast<size_t>(s);
    t = T(from_doubles(ctx, uniform(n, seed + seed_offset, 0.4), shape, d));
    return t.h && flame_tensor_set_requires_grad(t, 1) == FLAME_OK;
  };
  return make(m.w1, {kMlpHidden, kMlpIn}, 1) && make(m.b1, {kMlpHidden}, 2) && make(m.w2, {kMlpOut, kMlpHidden}, 3) &&
         make(m.b2, {kMlpOut}, 4);
}

// Every parameter value of the MLP, in order.
inline std::vector<double> mlp_values(const Mlp& m) {
  std::vector<double> all;
  for (flame_tensor_t p : m.params()) {
    std::vector<double> v = to_doubles(p);
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

// AdamW (lr 0.02, weight decay 0.05; f32 master weights with `master`) over the MLP's parameters;
// null on failure.
inline flame_optimizer_t make_mlp_adamw(flame_ctx_t ctx, const Mlp& m, bool master) {
  flame_optimizer_options_t o;
  flame_optimizer_options_init(&o, FLAME_OPTIMIZER_ADAMW);
  o.lr = 0.02;
  o.weight_decay = 0.05;
  o.master_weights = master ? 1 : 0;
  std::vector<flame_tensor_t> ps = m.params();
  flame_optimizer_t opt = nullptr;
  flame_optimizer_create(ctx, &o, ps.data(), static_cast<int64_t>(ps.size()), &opt);
  return opt;
}

// Backward of `scale` times the MSE loss of batch part `part` (of 2) of step `step`, data of dtype d.
inline flame_status_t mlp_backward(flame_ctx_t ctx, const Mlp& m, flame_dtype_t d, int part, int step, double scale) {
  const uint32_t seed = 1000u * static_cast<uint32_t>(step) + 10u * static_cast<uint32_t>(part);
  T x(from_doubles(ctx, uniform(kMlpRows * kMlpIn, seed, 1.0), {kMlpRows, kMlpIn}, d));
  T y(from_doubles(ctx, uniform(kMlpRows * kMlpOut, seed + 1, 1.0), {kMlpRows, kMlpOut}, d));
  T h, out, loss, scaled;
  flame_status_t st;
  if ((st = flame_linear(x, m.w1, m.b1, FLAME_ACTIVATION_RELU, h.out())) != FLAME_OK) return st;
  if ((st = flame_linear(h, m.w2, m.b2, FLAME_ACTIVATION_NONE, out.out())) != FLAME_OK) return st;
  if ((st = flame_mse_loss(out, y, FLAME_REDUCTION_MEAN, loss.out())) != FLAME_OK) return st;
  if ((st = flame_mul_scalar(loss, scale, scaled.out())) != FLAME_OK) return st;
  return flame_backward(ctx, scaled, nullptr, 0);
}

// ---- the tiny Flux transformer ----

// 6 sharded blocks; the embedders, norm_out and proj_out are read outside blocks and stay whole.
const char* const kFlux =
    R"({"num_layers": 2, "num_single_layers": 4, "attention_head_dim": 16, "num_attention_heads": 2,
        "in_channels": 16, "joint_attention_dim": 24, "pooled_projection_dim": 20, "guidance_embeds": true,
        "axes_dims_rope": [4, 6, 6]})";

// Deterministic parameter values from seed (the same on every rank and in every run), as in
// test_model_offload.cpp.
inline void fill_flux_params(flame_model_t m, uint32_t seed) {
  ParamsHandle list;
  ASSERT_EQ(flame_model_params(m, &list.p), FLAME_OK);
  int64_t count = 0;
  ASSERT_EQ(flame_params_count(list.p, &count), FLAME_OK);
  uint32_t state = seed;
  for (int64_t i = 0; i < count; ++i) {
    flame_tensor_t t = nullptr;
    ASSERT_EQ(flame_params_tensor(list.p, i, &t), FLAME_OK);
    int64_t n = 0;
    ASSERT_EQ(flame_tensor_numel(t, &n), FLAME_OK);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) {
      state = state * 1664525u + 1013904223u;
      x = (static_cast<float>(state >> 8) / 16777216.0f - 0.5f) * 0.2f;
    }
    ASSERT_EQ(flame_copy_from_host(t, v.data(), v.size() * sizeof(float)), FLAME_OK) << flame_last_error_message();
  }
}

// The tiny Flux transformer with fill_flux_params(seed) and activation checkpointing on, and its
// parameter list in params; false, with a test failure added, when a call fails.
inline bool make_flux_model(flame_ctx_t ctx, uint32_t seed, ModelHandle& m, ParamsHandle& params) {
  if (flame_model_create(ctx, "FluxTransformer2DModel", kFlux, nullptr, &m.m) != FLAME_OK) {
    ADD_FAILURE() << "flame_model_create: " << flame_last_error_message();
    return false;
  }
  fill_flux_params(m.m, seed);
  if (flame_model_set_checkpointing(m.m, 1) != FLAME_OK || flame_model_params(m.m, &params.p) != FLAME_OK) {
    ADD_FAILURE() << flame_last_error_message();
    return false;
  }
  return true;
}

// The inputs of batch part `part` (on 2 ranks: rank `part`'s data) at step `step`.
inline void make_flux_inputs(flame_ctx_t ctx, int part, int step, ParamsHandle& in) {
  ASSERT_EQ(flame_params_create(ctx, &in.p), FLAME_OK);
  const float phase = 0.3f + 0.9f * static_cast<float>(part) + 0.4f * static_cast<float>(step);
  auto add = [&](const char* name, flame_tensor_t t) {
    ASSERT_EQ(flame_params_add(in.p, name, t), FLAME_OK);
    flame_tensor_release(t);
  };
  add("hidden_states", host_tensor(ctx, {1, 12, 16}, ramp(12 * 16, 1.0f, phase)));
  add("encoder_hidden_states", host_tensor(ctx, {1, 5, 24}, ramp(5 * 24, 1.0f, phase + 1.0f)));
  add("pooled_projections", host_tensor(ctx, {1, 20}, ramp(20, 1.0f, phase + 2.0f)));
  add("timestep", host_tensor(ctx, {1}, {0.25f + 0.2f * static_cast<float>(part)}));
  add("guidance", host_tensor(ctx, {1}, {3.5f}));
  add("img_ids", host_tensor(ctx, {12, 3}, flux_img_ids()));
  add("txt_ids", host_tensor(ctx, {5, 3}, std::vector<float>(15, 0.0f)));
}

// forward, `scale` times the mse against a fixed target, backward.
inline flame_status_t flux_backward(flame_ctx_t ctx, flame_model_t m, int part, int step, double scale) {
  ParamsHandle in, out;
  make_flux_inputs(ctx, part, step, in);
  flame_status_t st = flame_model_forward(m, in.p, &out.p);
  if (st != FLAME_OK) return st;
  flame_tensor_t sample = nullptr;
  if ((st = flame_params_find(out.p, "sample", &sample)) != FLAME_OK) return st;
  T target(host_tensor(ctx, {1, 12, 16}, ramp(12 * 16, 0.5f, 2.2f))), l, scaled;
  if ((st = flame_mse_loss(sample, target, FLAME_REDUCTION_MEAN, l.out())) != FLAME_OK) return st;
  if ((st = flame_mul_scalar(l, scale, scaled.out())) != FLAME_OK) return st;
  return flame_backward(ctx, scaled, nullptr, 0);
}

// One forward with gradients off: the model learns which parameters each block reads.
inline flame_status_t learning_forward(flame_ctx_t ctx, flame_model_t m) {
  ParamsHandle in, out;
  make_flux_inputs(ctx, 0, 0, in);
  int32_t prev = 1;
  flame_ctx_set_grad_enabled(ctx, 0, &prev);
  const flame_status_t st = flame_model_forward(m, in.p, &out.p);
  flame_ctx_set_grad_enabled(ctx, prev, nullptr);
  return st;
}

// AdamW (lr 0.01, weight decay 0.05) over every tensor of params; null on failure.
inline flame_optimizer_t make_flux_adamw(flame_ctx_t ctx, flame_params_t params) {
  flame_optimizer_options_t o;
  flame_optimizer_options_init(&o, FLAME_OPTIMIZER_ADAMW);
  o.lr = 0.01;
  o.weight_decay = 0.05;
  const flame_tensor_t* ts = nullptr;
  int64_t n = 0;
  flame_params_count(params, &n);
  flame_params_tensors(params, &ts);
  flame_optimizer_t opt = nullptr;
  flame_optimizer_create(ctx, &o, ts, n, &opt);
  return opt;
}

// Every value of every (f32) parameter of list, in order.
inline std::vector<double> values_of(flame_params_t list) {
  std::vector<double> all;
  int64_t count = 0;
  EXPECT_EQ(flame_params_count(list, &count), FLAME_OK);
  for (int64_t i = 0; i < count; ++i) {
    flame_tensor_t t = nullptr;
    EXPECT_EQ(flame_params_tensor(list, i, &t), FLAME_OK);
    for (float x : host_of(t)) all.push_back(x);
  }
  return all;
}

// ---- the training step ----

// One ZeRO training step of a global batch of 2 parts on rank `rank` of `world` (1 or 2): on 2
// ranks backward(rank, 1.0), on one rank backward(part, 0.5) for both parts; then flame_zero_step
// and zero_grad (failures are test failures).
inline void zero_train_step(flame_zero_t zero, flame_optimizer_t opt, int world, int rank,
                            const std::function<flame_status_t(int part, double scale)>& backward) {
  if (world == 2) {
    EXPECT_EQ(backward(rank, 1.0), FLAME_OK) << flame_last_error_message();
  } else {
    for (int part = 0; part < 2; ++part) EXPECT_EQ(backward(part, 0.5), FLAME_OK) << flame_last_error_message();
  }
  EXPECT_EQ(flame_zero_step(zero, nullptr), FLAME_OK) << flame_last_error_message();
  EXPECT_EQ(flame_optimizer_zero_grad(opt, 1), FLAME_OK);
}

// Owners of the model ABI's handles for the GPU tests of models (test_model_lora.cpp,
// test_model_lokr.cpp, test_model_original_save.cpp, test_model_offload.cpp, test_model_quantized.cpp,
// test_model_lora_optimizer_in_backward.cpp): a model, a named-tensor list, a float tensor's values on
// the host, the tiny Flux and CLIP configs, random fills, host comparisons, a sum-of-squares backward,
// and the inputs of the tiny model configs those tests share (make_tiny_model_inputs).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>
#include "flame_test.h"

struct ModelHandle {
  flame_model_t m = nullptr;
  ~ModelHandle() { flame_model_release(m); }
};

struct ParamsHandle {
  flame_params_t p = nullptr;
  ~ParamsHandle() { flame_params_release(p); }
};

// The values of an f32 tensor (a failed copy is a test failure).
inline std::vector<float> host_of(flame_tensor_t t) {
  int64_t n = 0;
  EXPECT_EQ(flame_tensor_numel(t, &n), FLAME_OK);
  std::vector<float> v(static_cast<size_t>(n));
  EXPECT_EQ(flame_to_host(t, v.data(), v.size() * sizeof(float)), FLAME_OK) << flame_last_error_message();
  return v;
}

// An f32 tensor of shape from host values (a failed copy is a test failure; then null).
inline flame_tensor_t host_tensor(flame_ctx_t ctx, const std::vector<int64_t>& shape, const std::vector<float>& v) {
  flame_tensor_t t = nullptr;
  EXPECT_EQ(flame_from_host(ctx, v.data(), v.size() * sizeof(float), shape.data(), static_cast<int32_t>(shape.size()),
                            FLAME_DTYPE_F32, &t),
            FLAME_OK);
  return t;
}

// A tiny Flux (2 double-stream and 2 single-stream blocks) and a tiny CLIP text model
// (q/k/v/out_proj [64, 64], fc1 [96, 64]).
inline constexpr const char* kTinyFluxConfig =
    R"({"num_layers": 2, "num_single_layers": 2, "attention_head_dim": 16, "num_attention_heads": 2,
        "in_channels": 16, "joint_attention_dim": 24, "pooled_projection_dim": 20, "guidance_embeds": true,
        "axes_dims_rope": [4, 6, 6]})";
inline constexpr const char* kTinyClipConfig =
    R"({"vocab_size": 100, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
      "num_attention_heads": 1, "max_position_embeddings": 16})";

// Uniform values in [-scale / 2, scale / 2) into every tensor of list (f32), from a linear
// congruential generator started at seed and running through the list in order.
inline void fill_list(flame_params_t list, uint32_t seed, float scale) {
  int64_t count = 0;
  ASSERT_EQ(flame_params_count(list, &count), FLAME_OK);
  uint32_t state = seed;
  for (int64_t i = 0; i < count; ++i) {
    flame_tensor_t t = nullptr;
    ASSERT_EQ(flame_params_tensor(list, i, &t), FLAME_OK);
    int64_t n = 0;
    ASSERT_EQ(flame_tensor_numel(t, &n), FLAME_OK);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) {
      state = state * 1664525u + 1013904223u;
      x = (static_cast<float>(state >> 8) / 16777216.0f - 0.5f) * scale;
    }
    ASSERT_EQ(flame_copy_from_host(t, v.data(), v.size() * sizeof(float)), FLAME_OK) << flame_last_error_message();
  }
}

// The names of list's tensors, in order.
inline std::vector<std::string> names_of(flame_params_t list) {
  int64_t n = 0;
  EXPECT_EQ(flame_params_count(list, &n), FLAME_OK);
  std::vector<std::string> out;
  for (int64_t i = 0; i < n; ++i) {
    const char* name = nullptr;
    EXPECT_EQ(flame_params_name(list, i, &name), FLAME_OK);
    out.push_back(name);
  }
  return out;
}

// A tensor's shape.
inline std::vector<int64_t> shape_of(flame_tensor_t t) {
  int32_t nd = 0;
  EXPECT_EQ(flame_tensor_ndim(t, &nd), FLAME_OK);
  std::vector<int64_t> s(static_cast<size_t>(nd));
  if (nd > 0) {
    EXPECT_EQ(flame_tensor_shape(t, s.data(), nd), FLAME_OK);
  }
  return s;
}

inline std::vector<double> to_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

// max |a - b| / max |b| (max |a - b| when b is all zero), in double; sizes must match.
template <typename A, typename B>
double rel_diff(const std::vector<A>& a, const std::vector<B>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return den > 0 ? num / den : num;
}

// The output named output of one forward, on the host (a failure is a test failure; then empty).
inline std::vector<float> forward_output(flame_model_t m, const char* output, flame_params_t in) {
  ParamsHandle out;
  EXPECT_EQ(flame_model_forward(m, in, &out.p), FLAME_OK) << flame_last_error_message();
  flame_tensor_t y = nullptr;
  EXPECT_EQ(flame_params_find(out.p, output, &y), FLAME_OK);
  if (!y) return {};
  return host_of(y);
}

// loss = sum(y * y) of one forward (y: the output named output), backward into the leaves.
inline void backward_sum_squares(flame_ctx_t ctx, flame_model_t m, const char* output, flame_params_t in) {
  ParamsHandle out;
  ASSERT_EQ(flame_model_forward(m, in, &out.p), FLAME_OK) << flame_last_error_message();
  flame_tensor_t y = nullptr;
  ASSERT_EQ(flame_params_find(out.p, output, &y), FLAME_OK);
  T sq, loss;
  ASSERT_EQ(flame_mul(y, y, sq.out()), FLAME_OK);
  ASSERT_EQ(flame_sum_all(sq.h, loss.out()), FLAME_OK);
  ASSERT_EQ(flame_backward(ctx, loss.h, nullptr, 0), FLAME_OK) << flame_last_error_message();
}

// t's gradient on the host (a missing gradient is a test failure; then empty).
inline std::vector<double> grad_of(flame_tensor_t t) {
  T g;
  EXPECT_EQ(flame_tensor_grad(t, g.out()), FLAME_OK);
  EXPECT_NE(g.h, nullptr);
  if (!g.h) return {};
  return to_double(host_of(g.h));
}

// n smooth, deterministic values in [-scale, scale]; another phase gives other values (the
// multi-rank tests: each rank its own inputs).
inline std::vector<float> ramp(size_t n, float scale, float phase = 0.3f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::sin(0.7f * static_cast<float>(i) + phase) * scale;
  return v;
}

// The img_ids of the tiny Flux configs' 12 image tokens: a 4 x 3 grid, (0, row, column) each.
inline std::vector<float> flux_img_ids() {
  std::vector<float> ids(12 * 3, 0.0f);
  for (int r = 0; r < 12; ++r) {
    ids[r * 3 + 1] = static_cast<float>(r / 3);
    ids[r * 3 + 2] = static_cast<float>(r % 3);
  }
  return ids;
}

// The forward inputs of the tests' tiny configs, owned by the new list in: Flux (12 image tokens of
// 16 channels, 5 text tokens of 24, pooled 20), the UNet (4 x 16 x 16 latents, 7 text tokens of 40,
// text_embeds 24, SDXL's 6 time ids), anything else a text encoder (6 token ids).
inline void make_tiny_model_inputs(flame_ctx_t ctx, const std::string& arch, ParamsHandle& in) {
  ASSERT_EQ(flame_params_create(ctx, &in.p), FLAME_OK);
  auto add = [&](const char* name, flame_tensor_t t) {
    ASSERT_EQ(flame_params_add(in.p, name, t), FLAME_OK);
    flame_tensor_release(t);
  };
  if (arch == "FluxTransformer2DModel") {
    add("hidden_states", host_tensor(ctx, {1, 12, 16}, ramp(12 * 16, 1.0f)));
    add("encoder_hidden_states", host_tensor(ctx, {1, 5, 24}, ramp(5 * 24, 1.0f)));
    add("pooled_projections", host_tensor(ctx, {1, 20}, ramp(20, 1.0f)));
    add("timestep", host_tensor(ctx, {1}, {0.5f}));
    add("guidance", host_tensor(ctx, {1}, {3.5f}));
    add("img_ids", host_tensor(ctx, {12, 3}, flux_img_ids()));
    add("txt_ids", host_tensor(ctx, {5, 3}, std::vector<float>(15, 0.0f)));
  } else if (arch == "UNet2DConditionModel") {
    add("sample", host_tensor(ctx, {1, 4, 16, 16}, ramp(4 * 16 * 16, 1.0f)));
    add("timestep", host_tensor(ctx, {1}, {10.0f}));
    add("encoder_hidden_states", host_tensor(ctx, {1, 7, 40}, ramp(7 * 40, 1.0f)));
    add("text_embeds", host_tensor(ctx, {1, 24}, ramp(24, 1.0f)));
    add("time_ids", host_tensor(ctx, {1, 6}, {16, 16, 0, 0, 16, 16}));
  } else {
    const std::vector<int64_t> ids = {3, 17, 42, 8, 99, 5};
    const int64_t shape[2] = {1, 6};
    flame_tensor_t t = nullptr;
    ASSERT_EQ(flame_from_host(ctx, ids.data(), ids.size() * sizeof(int64_t), shape, 2, FLAME_DTYPE_I64, &t), FLAME_OK);
    add("input_ids", t);
  }
}

// Owners of the model ABI's handles for the GPU tests of models (test_model_lora.cpp,
// test_model_original_save.cpp, test_model_offload.cpp, test_model_quantized.cpp): a model, a
// named-tensor list, a float tensor's values on the host, and the inputs of the tiny model configs
// those tests share (make_tiny_model_inputs).
#pragma once
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

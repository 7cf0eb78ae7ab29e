// Owners of the model ABI's handles for the GPU tests of models (test_model_lora.cpp,
// test_model_original_save.cpp): a model, a named-tensor list, and a float tensor's values on the host.
#pragma once
#include <cstdint>
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

// Hooks are C++ callables inside FLAME (src/tensor/autograd_graph.h) that the API layer adapts from
// the C callbacks (src/api/api_autograd.cpp). A callback may remove its own hook while it runs:
// destroy then runs exactly once, during that call, the backward goes on unchanged, and the hook
// is never called again.
#include <vector>

#include "flame_test.h"

namespace {

struct SelfRemovingHook {
  flame_hook_t handle = nullptr;
  int calls = 0;
  int destroyed = 0;
  int destroyed_during_call = -1;  // destroyed as seen right after flame_hook_remove inside the hook
};

void count_destroy(void* ud) { static_cast<SelfRemovingHook*>(ud)->destroyed++; }

void remove_self(SelfRemovingHook* s) {
  s->calls++;
  flame_hook_remove(s->handle);
  s->handle = nullptr;
  s->destroyed_during_call = s->destroyed;
}

flame_status_t tensor_hook(void* ud, flame_tensor_t, flame_tensor_t*) {
  remove_self(static_cast<SelfRemovingHook*>(ud));
  return FLAME_OK;  // keep the gradient
}

flame_status_t post_hook(void* ud, flame_tensor_t) {
  remove_self(static_cast<SelfRemovingHook*>(ud));
  return FLAME_OK;
}

std::vector<float> grad_values(flame_tensor_t x) {
  T g;
  EXPECT_EQ(flame_tensor_grad(x, g.out()), FLAME_OK) << flame_last_error_message();
  std::vector<float> v(2, -1.0f);
  if (g.h) {
    EXPECT_EQ(flame_to_host(g, v.data(), v.size() * sizeof(float)), FLAME_OK) << flame_last_error_message();
  }
  return v;
}

// loss = sum(x * x): d loss / dx = 2x, run twice.
void backward_twice(flame_ctx_t ctx, flame_tensor_t x, std::vector<float>* first, std::vector<float>* second) {
  for (std::vector<float>* out : {first, second}) {
    ASSERT_EQ(flame_tensor_set_grad(x, nullptr), FLAME_OK) << flame_last_error_message();
    T y, loss;
    ASSERT_EQ(flame_mul(x, x, y.out()), FLAME_OK) << flame_last_error_message();
    ASSERT_EQ(flame_sum_all(y, loss.out()), FLAME_OK) << flame_last_error_message();
    ASSERT_EQ(flame_backward(ctx, loss, nullptr, 0), FLAME_OK) << flame_last_error_message();
    *out = grad_values(x);
  }
}

using HookSelfRemoval = GpuTest;

TEST_F(HookSelfRemoval, TensorHookRemovesItselfWhileItRuns) {
  const float xv[2] = {1.0f, 2.0f};
  const int64_t shape[1] = {2};
  T x;
  ASSERT_EQ(flame_from_host(ctx, xv, sizeof xv, shape, 1, FLAME_DTYPE_F32, x.out()), FLAME_OK);
  ASSERT_EQ(flame_tensor_set_requires_grad(x, 1), FLAME_OK);
  SelfRemovingHook s;
  ASSERT_EQ(flame_tensor_register_hook(x, tensor_hook, &s, count_destroy, &s.handle), FLAME_OK)
      << flame_last_error_message();
  std::vector<float> g1, g2;
  backward_twice(ctx, x, &g1, &g2);
  EXPECT_EQ(s.calls, 1);
  EXPECT_EQ(s.destroyed, 1);
  EXPECT_EQ(s.destroyed_during_call, 1);
  EXPECT_EQ(g1, (std::vector<float>{2.0f, 4.0f}));
  EXPECT_EQ(g2, (std::vector<float>{2.0f, 4.0f}));
}

TEST_F(HookSelfRemoval, PostAccumulateHookRemovesItselfWhileItRuns) {
  const float xv[2] = {3.0f, -1.0f};
  const int64_t shape[1] = {2};
  T x;
  ASSERT_EQ(flame_from_host(ctx, xv, sizeof xv, shape, 1, FLAME_DTYPE_F32, x.out()), FLAME_OK);
  ASSERT_EQ(flame_tensor_set_requires_grad(x, 1), FLAME_OK);
  SelfRemovingHook s;
  ASSERT_EQ(flame_tensor_register_post_accumulate_grad_hook(x, post_hook, &s, count_destroy, &s.handle), FLAME_OK)
      << flame_last_error_message();
  std::vector<float> g1, g2;
  backward_twice(ctx, x, &g1, &g2);
  EXPECT_EQ(s.calls, 1);
  EXPECT_EQ(s.destroyed, 1);
  EXPECT_EQ(s.destroyed_during_call, 1);
  EXPECT_EQ(g1, (std::vector<float>{6.0f, -2.0f}));
  EXPECT_EQ(g2, (std::vector<float>{6.0f, -2.0f}));
}

}  // namespace

// Shared helpers for FLAME's GoogleTest suites that use only the public C ABI.
// GpuTest creates a context per test; without a GPU the test is skipped, unless the environment
// sets FLAME_REQUIRE_GPU=1, in which case the missing GPU is a failure.
#pragma once
#include <gtest/gtest.h>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>
#include "flame.h"

#define FLAME_ASSERT_OK(expr)                                                                   \
  do {                                                                                          \
    flame_status_t st_ = (expr);                                                                \
    ASSERT_EQ(st_, FLAME_OK) << #expr << " -> " << flame_status_string(st_) << ": "            \
                             << flame_last_error_message();                                     \
  } while (0)

#define FLAME_EXPECT_STATUS(expr, status)                                                      \
  do {                                                                                          \
    flame_status_t st_ = (expr);                                                                \
    EXPECT_EQ(st_, status) << #expr << " -> " << flame_status_string(st_) << ": "              \
                           << flame_last_error_message();                                       \
  } while (0)

inline bool flame_gpu_required() {
  const char* v = std::getenv("FLAME_REQUIRE_GPU");
  return v && std::strcmp(v, "1") == 0;
}

// Creates a context; on failure returns nullptr and sets *skip when the test should be skipped
// (no GPU and FLAME_REQUIRE_GPU unset) and *why to the reason.
inline flame_ctx_t flame_test_context(bool* skip, std::string* why, uint64_t seed = 1234) {
  flame_ctx_options_t o;
  flame_ctx_options_init(&o);
  o.seed = seed;
  flame_ctx_t ctx = nullptr;
  flame_status_t st = flame_ctx_create(&o, &ctx);
  *skip = false;
  if (st == FLAME_OK) return ctx;
  *why = std::string(flame_status_string(st)) + ": " + flame_last_error_message();
  *skip = (st == FLAME_ERROR_NO_DRIVER || st == FLAME_ERROR_NO_DEVICE) && !flame_gpu_required();
  return nullptr;
}

// Use in a test body: FLAME_GPU_CONTEXT(ctx); declares flame_ctx_t ctx or skips / fails.
#define FLAME_GPU_CONTEXT(name)                                              \
  bool name##_skip = false;                                                  \
  std::string name##_why;                                                    \
  flame_ctx_t name = flame_test_context(&name##_skip, &name##_why);          \
  if (!name && name##_skip) GTEST_SKIP() << "no GPU: " << name##_why;        \
  ASSERT_NE(name, nullptr) << "cannot create a context: " << name##_why

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    bool skip = false;
    std::string why;
    ctx = flame_test_context(&skip, &why);
    if (!ctx && skip) GTEST_SKIP() << "no GPU: " << why;
    ASSERT_NE(ctx, nullptr) << "cannot create a context: " << why;
  }
  void TearDown() override {
    if (ctx) flame_ctx_destroy(ctx);
  }
  flame_ctx_t ctx = nullptr;
};

// RAII holder for a tensor handle.
struct T {
  flame_tensor_t h = nullptr;
  T() = default;
  explicit T(flame_tensor_t t) : h(t) {}
  T(const T&) = delete;
  T& operator=(const T&) = delete;
  T(T&& o) noexcept : h(o.h) { o.h = nullptr; }
  T& operator=(T&& o) noexcept { std::swap(h, o.h); return *this; }
  ~T() { flame_tensor_release(h); }
  flame_tensor_t* out() { flame_tensor_release(h); h = nullptr; return &h; }
  operator flame_tensor_t() const { return h; }
};

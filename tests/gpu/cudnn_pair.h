// Shared by the tests that compare FLAME's cuDNN paths with its own kernels (test_conv_cudnn.cpp,
// test_attention_cudnn.cpp): a fixture holding a context that uses cuDNN (ctx) and one created with
// FLAME_DISABLE_CUDNN=1 (plain), skipping where libcudnn.so.9 is not installed (and failing where it
// loads but the context does not use it), and the element-wise agreement check of two results
// (which test_conv.cpp also uses against its host references, with its cuDNN-off context).
#pragma once
#include <dlfcn.h>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>

#include "gradcheck.h"

namespace cudnn_pair {

// Whether this process can load cuDNN the way FLAME does (kept loaded: FLAME may use it too).
inline bool cudnn_loadable() {
  const char* p = std::getenv("FLAME_CUDNN_PATH");
  return dlopen(p && *p ? p : "libcudnn.so.9", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE) != nullptr;
}

// Why cudnnCreate fails in this process (called on this thread, where a FLAME context is current),
// for the message of a test that finds the library loadable but unused.
inline std::string cudnn_create_status() {
  const char* p = std::getenv("FLAME_CUDNN_PATH");
  void* lib = dlopen(p && *p ? p : "libcudnn.so.9", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!lib) return "dlopen failed";
  using Create = int (*)(void**);
  using Describe = const char* (*)(int);
  using Version = size_t (*)();
  auto create = reinterpret_cast<Create>(dlsym(lib, "cudnnCreate"));
  auto describe = reinterpret_cast<Describe>(dlsym(lib, "cudnnGetErrorString"));
  auto version = reinterpret_cast<Version>(dlsym(lib, "cudnnGetVersion"));
  if (!create || !describe || !version) return "cudnnCreate, cudnnGetErrorString or cudnnGetVersion missing";
  void* handle = nullptr;
  const int st = create(&handle);  // the handle is left to the process (a diagnostic path only)
  return "cuDNN " + std::to_string(version()) + ", cudnnCreate: " + describe(st);
}

inline flame_ctx_t cudnn_off_context() {
  setenv("FLAME_DISABLE_CUDNN", "1", 1);
  flame_ctx_options_t o;
  flame_ctx_options_init(&o);
  flame_ctx_t c = nullptr;
  const flame_status_t st = flame_ctx_create(&o, &c);
  unsetenv("FLAME_DISABLE_CUDNN");
  EXPECT_EQ(st, FLAME_OK) << flame_last_error_message();
  return c;
}

// ctx (uses cuDNN) and plain (FLAME_DISABLE_CUDNN=1). `uses` names what runs FLAME's kernels only
// when cuDNN is missing (the skip message).
class CudnnPair : public GpuTest {
 protected:
  explicit CudnnPair(const char* uses) : uses_(uses) {}
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    int32_t version = -1;
    uint64_t n = 1;
    ASSERT_EQ(flame_ctx_cudnn_info(ctx, &version, &n), FLAME_OK) << flame_last_error_message();  // loads cuDNN
    if (version == 0) {
      ASSERT_FALSE(cudnn_loadable()) << "libcudnn.so.9 loads in this process, but the context does not use it ("
                                      << cudnn_create_status() << ")";
      GTEST_SKIP() << "libcudnn.so.9 is not installed: " << uses_ << " run FLAME's kernels only";
    }
    EXPECT_GE(version, 90000);
    EXPECT_LT(version, 100000);
    plain = cudnn_off_context();
    ASSERT_NE(plain, nullptr);
    int32_t off_version = -1;
    ASSERT_EQ(flame_ctx_cudnn_info(plain, &off_version, &n), FLAME_OK) << flame_last_error_message();
    EXPECT_EQ(off_version, 0) << "FLAME_DISABLE_CUDNN=1 at creation must keep the context off cuDNN";
    EXPECT_EQ(n, 0u);
  }
  void TearDown() override {
    if (plain) flame_ctx_destroy(plain);
    GpuTest::TearDown();
  }
  flame_ctx_t plain = nullptr;

 private:
  const char* uses_;
};

// |a - b| <= rtol |b| + atol max(1, max |b|), element by element.
struct Tol {
  double rtol, atol;
};

// got against want within t; a failure names up to 6 elements as got_name and want_name values
// (cuDNN against FLAME's kernels here; test_conv.cpp: a result against its host reference).
inline ::testing::AssertionResult agree(const gc::HT& got, const gc::HT& want, Tol t, const std::string& what,
                                        const char* got_name = "cuDNN", const char* want_name = "FLAME's kernels") {
  if (got.shape != want.shape)
    return ::testing::AssertionFailure() << what << ": shape " << gc::shape_str(got.shape) << " vs "
                                         << gc::shape_str(want.shape);
  double scale = 1;
  for (double w : want.v) scale = std::max(scale, std::fabs(w));
  int64_t bad = 0;
  std::ostringstream os;
  for (size_t i = 0; i < want.v.size(); ++i) {
    const double err = std::fabs(got.v[i] - want.v[i]);
    if (err <= t.rtol * std::fabs(want.v[i]) + t.atol * scale) continue;  // NaN fails too
    if (bad++ < 6) os << "\n  [" << i << "] " << got_name << " " << got.v[i] << ", " << want_name << " " << want.v[i];
  }
  if (!bad) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << want.v.size() << " elements differ (shape "
                                       << gc::shape_str(want.shape) << ", scale " << scale << ")" << os.str();
}

}  // namespace cudnn_pair

// The C ABI contract, exercised through the shared library libflame.so exactly as a user links it.
// These tests need no GPU: the CMake test registration sets FLAME_CUDA_DRIVER_PATH to a missing
// file, and so does a static initialiser below, so that even on a GPU machine the driver never
// loads in this process and context creation must fail cleanly.
//
// What is checked: version and ABI numbers; enum values (append-only) and struct layouts (frozen
// for LP64); flame_status_string / flame_dtype_size / flame_dtype_name for every value and for
// out-of-range ones; flame_ctx_options_init defaults; flame_ctx_create and flame_device_count
// without a driver; NULL handles and NULL OUT pointers for (nearly) every function, with OUT
// handles set to NULL and a message that names the function; *_release(NULL) no-ops; the error
// message is per thread and "" after a success; flame_set_error_message.
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "flame_test.h"

namespace {

const char* const kNoDriver = "/nonexistent/libcuda.so.1";

// Force "no driver" before any test runs, whatever the environment says.
const bool g_forced_no_driver = [] {
  setenv("FLAME_CUDA_DRIVER_PATH", kNoDriver, 1);
  return true;
}();

// An OUT value that a failing call must overwrite with NULL. Never passed as an input.
flame_tensor_t sentinel_tensor() { return reinterpret_cast<flame_tensor_t>(static_cast<uintptr_t>(0x40)); }
flame_ctx_t sentinel_ctx() { return reinterpret_cast<flame_ctx_t>(static_cast<uintptr_t>(0x40)); }
flame_hook_t sentinel_hook() { return reinterpret_cast<flame_hook_t>(static_cast<uintptr_t>(0x40)); }

bool contains(const char* haystack, const char* needle) {
  return haystack && needle && std::strstr(haystack, needle) != nullptr;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

// ============================== Numbers that are ABI ==============================

// Enum values are explicit and append-only: changing one breaks every compiled caller.
static_assert(FLAME_OK == 0 && FLAME_ERROR_INVALID_ARGUMENT == 1 && FLAME_ERROR_INVALID_HANDLE == 2 &&
                  FLAME_ERROR_SHAPE_MISMATCH == 3 && FLAME_ERROR_DTYPE_MISMATCH == 4 &&
                  FLAME_ERROR_OUT_OF_MEMORY == 5 && FLAME_ERROR_NO_DRIVER == 6 && FLAME_ERROR_NO_DEVICE == 7 &&
                  FLAME_ERROR_CUDA == 8 && FLAME_ERROR_KERNEL_COMPILE == 9 &&
                  FLAME_ERROR_NOT_DIFFERENTIABLE == 10 && FLAME_ERROR_IO == 11 && FLAME_ERROR_UNSUPPORTED == 12 &&
                  FLAME_ERROR_INTERNAL == 13 && FLAME_ERROR_CONTEXT_FAILED == 14 &&
                  FLAME_ERROR_INVALID_FORMAT == 15 && FLAME_ERROR_GRAPH_FREED == 16 &&
                  FLAME_ERROR_INPLACE_MODIFIED == 17,
              "flame_status_t values are frozen");
static_assert(FLAME_DTYPE_F32 == 0 && FLAME_DTYPE_F16 == 1 && FLAME_DTYPE_BF16 == 2 && FLAME_DTYPE_F64 == 3 &&
                  FLAME_DTYPE_I32 == 4 && FLAME_DTYPE_I64 == 5 && FLAME_DTYPE_U8 == 6 && FLAME_DTYPE_BOOL == 7 &&
                  FLAME_DTYPE_F8_E4M3 == 8 && FLAME_DTYPE_F8_E5M2 == 9,
              "flame_dtype_t values are frozen");
static_assert(FLAME_BACKWARD_RETAIN_GRAPH == 1 && FLAME_BACKWARD_CREATE_GRAPH == 2 && FLAME_GRAD_ALLOW_UNUSED == 4,
              "backward flags are frozen");
static_assert(FLAME_PARAMS_LOAD_ALLOW_MISSING == 1 && FLAME_PARAMS_LOAD_ALLOW_UNEXPECTED == 2 &&
                  FLAME_PARAMS_LOAD_NON_STRICT == 3 && FLAME_PARAMS_LOAD_CONVERT_DTYPE == 4,
              "parameter-list load flags are frozen");
static_assert(FLAME_MAX_DIMS == 8, "FLAME_MAX_DIMS is frozen");
static_assert(FLAME_DIM_ALL == INT32_MIN, "FLAME_DIM_ALL is INT32_MIN");
static_assert(sizeof(flame_status_t) == 4 && sizeof(flame_dtype_t) == 4, "enums are 32-bit");

#if defined(__LP64__)
// Struct layouts on LP64 (x86-64, aarch64). Fields may only be appended.
static_assert(offsetof(flame_ctx_options_t, struct_size) == 0, "layout");
static_assert(offsetof(flame_ctx_options_t, device) == 8, "layout");
static_assert(offsetof(flame_ctx_options_t, seed) == 16, "layout");
static_assert(offsetof(flame_ctx_options_t, kernel_cache_dir) == 24, "layout");
static_assert(offsetof(flame_ctx_options_t, memory_limit) == 32, "layout");
static_assert(offsetof(flame_ctx_options_t, allow_tf32) == 40, "layout");
static_assert(offsetof(flame_ctx_options_t, gemm_heuristic_only) == 44, "layout");
// Frozen at 48 bytes: flame_ctx_options_init of a program built against this header writes 48 bytes
// (packaging/ABI.md: a struct that has an init function does not grow; new settings get a setter).
static_assert(sizeof(flame_ctx_options_t) == 48, "layout");
static_assert(offsetof(flame_memory_stats_t, struct_size) == 0, "layout");
static_assert(offsetof(flame_memory_stats_t, bytes_in_use) == 8, "layout");
static_assert(offsetof(flame_memory_stats_t, bytes_reserved) == 16, "layout");
static_assert(offsetof(flame_memory_stats_t, peak_bytes_in_use) == 24, "layout");
static_assert(offsetof(flame_memory_stats_t, live_tensors) == 32, "layout");
static_assert(offsetof(flame_ctx_counters_t, struct_size) == 0, "layout");
static_assert(offsetof(flame_ctx_counters_t, launches) == 8, "layout");
static_assert(offsetof(flame_ctx_counters_t, cast_kernels) == 16, "layout");
static_assert(offsetof(flame_ctx_counters_t, host_syncs) == 24, "layout");
static_assert(offsetof(flame_ctx_counters_t, driver_allocations) == 32, "layout");
#endif

// ============================== Version ==============================

TEST(Version, StringMatchesMacros) {
  const char* v = flame_version_string();
  ASSERT_NE(v, nullptr);
  std::string expected = std::to_string(FLAME_VERSION_MAJOR) + "." + std::to_string(FLAME_VERSION_MINOR) + "." +
                         std::to_string(FLAME_VERSION_PATCH);
  EXPECT_EQ(std::string(v), expected);
  EXPECT_EQ(flame_version_string(), v) << "a static string: the same pointer every time";
}

TEST(Version, AbiMatchesMacro) { EXPECT_EQ(flame_abi_version(), FLAME_ABI_VERSION); }

// ============================== Status strings ==============================

#define FLAME_ALL_STATUSES(X)                                                                            \
  X(FLAME_OK) X(FLAME_ERROR_INVALID_ARGUMENT) X(FLAME_ERROR_INVALID_HANDLE) X(FLAME_ERROR_SHAPE_MISMATCH) \
  X(FLAME_ERROR_DTYPE_MISMATCH) X(FLAME_ERROR_OUT_OF_MEMORY) X(FLAME_ERROR_NO_DRIVER)                    \
  X(FLAME_ERROR_NO_DEVICE) X(FLAME_ERROR_CUDA) X(FLAME_ERROR_KERNEL_COMPILE)                            \
  X(FLAME_ERROR_NOT_DIFFERENTIABLE) X(FLAME_ERROR_IO) X(FLAME_ERROR_UNSUPPORTED) X(FLAME_ERROR_INTERNAL) \
  X(FLAME_ERROR_CONTEXT_FAILED) X(FLAME_ERROR_INVALID_FORMAT) X(FLAME_ERROR_GRAPH_FREED)                 \
  X(FLAME_ERROR_INPLACE_MODIFIED)

struct StatusName {
  flame_status_t status;
  const char* name;
};
#define FLAME_STATUS_ENTRY(s) {s, #s},
const StatusName kStatuses[] = {FLAME_ALL_STATUSES(FLAME_STATUS_ENTRY)};
#undef FLAME_STATUS_ENTRY

TEST(StatusString, EveryValueHasItsOwnName) {
  std::set<std::string> seen;
  for (const StatusName& s : kStatuses) {
    const char* str = flame_status_string(s.status);
    ASSERT_NE(str, nullptr) << s.name;
    EXPECT_STREQ(str, s.name);
    EXPECT_NE(lower(str).find("unknown"), 0u) << s.name << " -> " << str;
    EXPECT_TRUE(seen.insert(str).second) << "duplicate status string " << str;
  }
  EXPECT_EQ(seen.size(), sizeof kStatuses / sizeof kStatuses[0]);
}

TEST(StatusString, OutOfRangeIsSane) {
  std::set<std::string> names;
  for (const StatusName& s : kStatuses) names.insert(s.name);
  for (int v : {-1, 18, 100, 9999, INT32_MAX, INT32_MIN}) {
    const char* str = flame_status_string(static_cast<flame_status_t>(v));
    ASSERT_NE(str, nullptr) << v;
    EXPECT_GT(std::strlen(str), 0u) << v;
    EXPECT_EQ(names.count(str), 0u) << v << " must not be named like a real status: " << str;
  }
}

// ============================== dtypes ==============================

TEST(Dtype, SizesAndNames) {
  struct D {
    flame_dtype_t dt;
    size_t size;
    const char* name;
  };
  const D all[] = {{FLAME_DTYPE_F32, 4, "f32"}, {FLAME_DTYPE_F16, 2, "f16"}, {FLAME_DTYPE_BF16, 2, "bf16"},
                   {FLAME_DTYPE_F64, 8, "f64"}, {FLAME_DTYPE_I32, 4, "i32"}, {FLAME_DTYPE_I64, 8, "i64"},
                   {FLAME_DTYPE_U8, 1, "u8"},   {FLAME_DTYPE_BOOL, 1, "bool"}, {FLAME_DTYPE_F8_E4M3, 1, "f8_e4m3"},
                   {FLAME_DTYPE_F8_E5M2, 1, "f8_e5m2"}};
  std::set<std::string> names;
  for (const D& d : all) {
    EXPECT_EQ(flame_dtype_size(d.dt), d.size) << d.name;
    ASSERT_NE(flame_dtype_name(d.dt), nullptr) << d.name;
    EXPECT_STREQ(flame_dtype_name(d.dt), d.name);
    names.insert(flame_dtype_name(d.dt));
  }
  EXPECT_EQ(names.size(), 10u);
}

TEST(Dtype, UnknownValues) {
  for (int v : {-1, 10, 99, INT32_MAX}) {
    // A prvalue: reading an out-of-range value from an enum object is UB in C++ (UBSan says so).
    auto dt = [v] { return static_cast<flame_dtype_t>(v); };
    EXPECT_EQ(flame_dtype_size(dt()), 0u) << v;
    ASSERT_NE(flame_dtype_name(dt()), nullptr) << v;
    EXPECT_STREQ(flame_dtype_name(dt()), "unknown") << v;
  }
}

// ============================== Context options ==============================

TEST(CtxOptions, InitSetsDefaults) {
  flame_ctx_options_t o;
  std::memset(&o, 0xAB, sizeof o);
  FLAME_ASSERT_OK(flame_ctx_options_init(&o));
  EXPECT_EQ(o.struct_size, sizeof(flame_ctx_options_t));
  EXPECT_EQ(o.device, 0);
  EXPECT_EQ(o.seed, 0u);
  EXPECT_EQ(o.kernel_cache_dir, nullptr);
  EXPECT_EQ(o.memory_limit, 0u);
  EXPECT_EQ(o.allow_tf32, 0);
  EXPECT_EQ(o.gemm_heuristic_only, 0);
}

TEST(CtxOptions, InitNull) {
  FLAME_EXPECT_STATUS(flame_ctx_options_init(nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_ctx_options_init")) << flame_last_error_message();
}

// ============================== No driver ==============================

TEST(NoDriver, EnvironmentIsForced) {
  ASSERT_TRUE(g_forced_no_driver);
  ASSERT_STREQ(std::getenv("FLAME_CUDA_DRIVER_PATH"), kNoDriver);
}

TEST(NoDriver, CtxCreateFailsCleanly) {
  for (int attempt = 0; attempt < 2; ++attempt) {  // a second try must fail the same way, not crash
    flame_ctx_t ctx = sentinel_ctx();
    flame_status_t st = flame_ctx_create(nullptr, &ctx);
    EXPECT_TRUE(st == FLAME_ERROR_NO_DRIVER || st == FLAME_ERROR_NO_DEVICE)
        << "attempt " << attempt << ": " << flame_status_string(st) << ": " << flame_last_error_message();
    EXPECT_EQ(ctx, nullptr);
    const std::string msg = flame_last_error_message();
    EXPECT_NE(msg.find("flame_ctx_create"), std::string::npos) << msg;
    EXPECT_NE(lower(msg).find("driver"), std::string::npos) << "the message should say what is missing: " << msg;
  }
}

TEST(NoDriver, CtxCreateWithOptions) {
  flame_ctx_options_t o;
  FLAME_ASSERT_OK(flame_ctx_options_init(&o));
  o.device = 3;
  o.kernel_cache_dir = "";
  flame_ctx_t ctx = sentinel_ctx();
  flame_status_t st = flame_ctx_create(&o, &ctx);
  EXPECT_TRUE(st == FLAME_ERROR_NO_DRIVER || st == FLAME_ERROR_NO_DEVICE) << flame_status_string(st);
  EXPECT_EQ(ctx, nullptr);
}

TEST(NoDriver, CtxCreateFromSeveralThreads) {
  std::vector<std::thread> threads;
  std::vector<int> ok(8, 0);
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([i, &ok] {
      flame_ctx_t ctx = sentinel_ctx();
      flame_status_t st = flame_ctx_create(nullptr, &ctx);
      ok[i] = (st == FLAME_ERROR_NO_DRIVER || st == FLAME_ERROR_NO_DEVICE) && ctx == nullptr &&
              contains(flame_last_error_message(), "flame_ctx_create");
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(ok[i]) << "thread " << i;
}

TEST(NoDriver, DeviceCount) {
  int32_t n = -1;
  flame_status_t st = flame_device_count(&n);
  EXPECT_EQ(st, FLAME_ERROR_NO_DRIVER) << flame_status_string(st) << ": " << flame_last_error_message();
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_device_count")) << flame_last_error_message();
}

TEST(NoDriver, CtxCreateBadArguments) {
  FLAME_EXPECT_STATUS(flame_ctx_create(nullptr, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_ctx_create")) << flame_last_error_message();
  flame_ctx_options_t o;
  FLAME_ASSERT_OK(flame_ctx_options_init(&o));
  o.struct_size = 0;  // not filled by flame_ctx_options_init
  flame_ctx_t ctx = sentinel_ctx();
  FLAME_EXPECT_STATUS(flame_ctx_create(&o, &ctx), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ctx, nullptr);
  FLAME_EXPECT_STATUS(flame_device_count(nullptr), FLAME_ERROR_INVALID_ARGUMENT);
}

// ============================== Error messages ==============================

TEST(ErrorMessage, EmptyAfterSuccess) {
  FLAME_EXPECT_STATUS(flame_tensor_retain(nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_STRNE(flame_last_error_message(), "");
  flame_ctx_options_t o;
  FLAME_ASSERT_OK(flame_ctx_options_init(&o));
  ASSERT_NE(flame_last_error_message(), nullptr);
  EXPECT_STREQ(flame_last_error_message(), "");
}

TEST(ErrorMessage, SetByCallbacks) {
  flame_set_error_message("my hook refused: lr too large");
  EXPECT_STREQ(flame_last_error_message(), "my hook refused: lr too large");
  flame_set_error_message(nullptr);
  ASSERT_NE(flame_last_error_message(), nullptr);
  EXPECT_STREQ(flame_last_error_message(), "");
  std::string long_text(10000, 'x');
  flame_set_error_message(long_text.c_str());
  EXPECT_EQ(std::string(flame_last_error_message()), long_text);
  flame_set_error_message(nullptr);
}

TEST(ErrorMessage, PerThread) {
  FLAME_EXPECT_STATUS(flame_add(nullptr, nullptr, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  const std::string mine = flame_last_error_message();
  ASSERT_NE(mine.find("flame_add"), std::string::npos) << mine;

  std::string fresh_thread_sees = "not run";
  std::thread([&] { fresh_thread_sees = flame_last_error_message(); }).join();
  EXPECT_EQ(fresh_thread_sees, "") << "a new thread starts with no error";

  // Several threads fail in different functions at once; each sees its own message.
  const char* names[] = {"flame_exp", "flame_log", "flame_sqrt", "flame_relu"};
  std::vector<int> ok(4, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([i, &names, &ok] {
      int good = 1;
      for (int rep = 0; rep < 200; ++rep) {
        flame_tensor_t out = nullptr;
        flame_status_t st = FLAME_OK;
        switch (i) {
          case 0: st = flame_exp(nullptr, &out); break;
          case 1: st = flame_log(nullptr, &out); break;
          case 2: st = flame_sqrt(nullptr, &out); break;
          default: st = flame_relu(nullptr, &out); break;
        }
        const char* msg = flame_last_error_message();
        bool named = msg && std::strstr(msg, names[i]) != nullptr;
        good &= st == FLAME_ERROR_INVALID_ARGUMENT && out == nullptr && named;
      }
      ok[i] = good;
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(ok[i]) << names[i];
  EXPECT_EQ(std::string(flame_last_error_message()), mine) << "other threads do not touch this thread's message";
}

// ============================== NULL is a no-op for release ==============================

TEST(NullRelease, AllAreNoOps) {
  flame_tensor_release(nullptr);
  flame_ctx_destroy(nullptr);
  flame_hook_remove(nullptr);
  SUCCEED();
}

// ============================== NULL handles and NULL OUT pointers ==============================
// For each function that returns a tensor: with a NULL input handle it must return
// FLAME_ERROR_INVALID_ARGUMENT, set *out to NULL and name itself in the message; with a NULL OUT
// pointer it must return FLAME_ERROR_INVALID_ARGUMENT as well.

struct OutCase {
  const char* name;
  std::function<flame_status_t(flame_tensor_t*)> call;
};

// Each case (called with NULL or released handles) must fail with FLAME_ERROR_INVALID_ARGUMENT, set
// *out to NULL, name the function in the message, and reject out == NULL as well.
static void expect_null_rejections(const std::vector<OutCase>& cases) {
  for (const OutCase& c : cases) {
    flame_tensor_t out = sentinel_tensor();
    EXPECT_EQ(c.call(&out), FLAME_ERROR_INVALID_ARGUMENT) << c.name;
    EXPECT_EQ(out, nullptr) << c.name << " must set *out to NULL on failure";
    EXPECT_TRUE(contains(flame_last_error_message(), c.name)) << c.name << ": " << flame_last_error_message();
    EXPECT_EQ(c.call(nullptr), FLAME_ERROR_INVALID_ARGUMENT) << c.name << " with out == NULL";
  }
}

static std::vector<OutCase> tensor_out_cases() {
  static const int64_t shape[] = {2, 3};
  static const int32_t dims[] = {0};
  static const int32_t perm[] = {1, 0};
  static const float host[6] = {0, 1, 2, 3, 4, 5};
  flame_ctx_t c = nullptr;
  flame_tensor_t t = nullptr;
  std::vector<OutCase> v = {
      // creation with a NULL context
      {"flame_empty", [=](flame_tensor_t* o) { return flame_empty(c, shape, 2, FLAME_DTYPE_F32, o); }},
      {"flame_zeros", [=](flame_tensor_t* o) { return flame_zeros(c, shape, 2, FLAME_DTYPE_F32, o); }},
      {"flame_ones", [=](flame_tensor_t* o) { return flame_ones(c, shape, 2, FLAME_DTYPE_F32, o); }},
      {"flame_full", [=](flame_tensor_t* o) { return flame_full(c, shape, 2, FLAME_DTYPE_F32, 1.5, o); }},
      {"flame_arange", [=](flame_tensor_t* o) { return flame_arange(c, 0, 10, 1, FLAME_DTYPE_F32, o); }},
      {"flame_linspace", [=](flame_tensor_t* o) { return flame_linspace(c, 0, 1, 5, FLAME_DTYPE_F32, o); }},
      {"flame_eye", [=](flame_tensor_t* o) { return flame_eye(c, 3, 3, FLAME_DTYPE_F32, o); }},
      {"flame_rand", [=](flame_tensor_t* o) { return flame_rand(c, shape, 2, FLAME_DTYPE_F32, o); }},
      {"flame_randn", [=](flame_tensor_t* o) { return flame_randn(c, shape, 2, FLAME_DTYPE_F32, o); }},
      {"flame_from_host",
       [=](flame_tensor_t* o) { return flame_from_host(c, host, sizeof host, shape, 2, FLAME_DTYPE_F32, o); }},
      // views and shape ops
      {"flame_reshape", [=](flame_tensor_t* o) { return flame_reshape(t, shape, 2, o); }},
      {"flame_view", [=](flame_tensor_t* o) { return flame_view(t, shape, 2, o); }},
      {"flame_permute", [=](flame_tensor_t* o) { return flame_permute(t, perm, 2, o); }},
      {"flame_transpose", [=](flame_tensor_t* o) { return flame_transpose(t, 0, 1, o); }},
      {"flame_expand", [=](flame_tensor_t* o) { return flame_expand(t, shape, 2, o); }},
      {"flame_squeeze", [=](flame_tensor_t* o) { return flame_squeeze(t, 0, o); }},
      {"flame_squeeze_all", [=](flame_tensor_t* o) { return flame_squeeze_all(t, o); }},
      {"flame_unsqueeze", [=](flame_tensor_t* o) { return flame_unsqueeze(t, 0, o); }},
      {"flame_narrow", [=](flame_tensor_t* o) { return flame_narrow(t, 0, 0, 1, o); }},
      {"flame_slice", [=](flame_tensor_t* o) { return flame_slice(t, 0, 0, 2, 1, o); }},
      {"flame_select", [=](flame_tensor_t* o) { return flame_select(t, 0, 0, o); }},
      {"flame_flip", [=](flame_tensor_t* o) { return flame_flip(t, dims, 1, o); }},
      {"flame_diagonal", [=](flame_tensor_t* o) { return flame_diagonal(t, 0, 0, 1, o); }},
      {"flame_contiguous", [=](flame_tensor_t* o) { return flame_contiguous(t, o); }},
      {"flame_clone", [=](flame_tensor_t* o) { return flame_clone(t, o); }},
      {"flame_to_dtype", [=](flame_tensor_t* o) { return flame_to_dtype(t, FLAME_DTYPE_F16, o); }},
      {"flame_triu", [=](flame_tensor_t* o) { return flame_triu(t, 0, o); }},
      {"flame_tril", [=](flame_tensor_t* o) { return flame_tril(t, 0, o); }},
      // elementwise
      {"flame_add", [=](flame_tensor_t* o) { return flame_add(t, t, o); }},
      {"flame_sub", [=](flame_tensor_t* o) { return flame_sub(t, t, o); }},
      {"flame_mul", [=](flame_tensor_t* o) { return flame_mul(t, t, o); }},
      {"flame_div", [=](flame_tensor_t* o) { return flame_div(t, t, o); }},
      {"flame_pow", [=](flame_tensor_t* o) { return flame_pow(t, t, o); }},
      {"flame_maximum", [=](flame_tensor_t* o) { return flame_maximum(t, t, o); }},
      {"flame_minimum", [=](flame_tensor_t* o) { return flame_minimum(t, t, o); }},
      {"flame_eq", [=](flame_tensor_t* o) { return flame_eq(t, t, o); }},
      {"flame_ne", [=](flame_tensor_t* o) { return flame_ne(t, t, o); }},
      {"flame_lt", [=](flame_tensor_t* o) { return flame_lt(t, t, o); }},
      {"flame_le", [=](flame_tensor_t* o) { return flame_le(t, t, o); }},
      {"flame_gt", [=](flame_tensor_t* o) { return flame_gt(t, t, o); }},
      {"flame_ge", [=](flame_tensor_t* o) { return flame_ge(t, t, o); }},
      {"flame_logical_and", [=](flame_tensor_t* o) { return flame_logical_and(t, t, o); }},
      {"flame_logical_or", [=](flame_tensor_t* o) { return flame_logical_or(t, t, o); }},
      {"flame_logical_not", [=](flame_tensor_t* o) { return flame_logical_not(t, o); }},
      {"flame_where", [=](flame_tensor_t* o) { return flame_where(t, t, t, o); }},
      {"flame_clamp", [=](flame_tensor_t* o) { return flame_clamp(t, -1.0, 1.0, o); }},
      {"flame_add_scalar", [=](flame_tensor_t* o) { return flame_add_scalar(t, 1.0, o); }},
      {"flame_sub_scalar", [=](flame_tensor_t* o) { return flame_sub_scalar(t, 1.0, o); }},
      {"flame_rsub_scalar", [=](flame_tensor_t* o) { return flame_rsub_scalar(t, 1.0, o); }},
      {"flame_mul_scalar", [=](flame_tensor_t* o) { return flame_mul_scalar(t, 2.0, o); }},
      {"flame_div_scalar", [=](flame_tensor_t* o) { return flame_div_scalar(t, 2.0, o); }},
      {"flame_pow_scalar", [=](flame_tensor_t* o) { return flame_pow_scalar(t, 2.0, o); }},
      {"flame_neg", [=](flame_tensor_t* o) { return flame_neg(t, o); }},
      {"flame_abs", [=](flame_tensor_t* o) { return flame_abs(t, o); }},
      {"flame_exp", [=](flame_tensor_t* o) { return flame_exp(t, o); }},
      {"flame_log", [=](flame_tensor_t* o) { return flame_log(t, o); }},
      {"flame_log1p", [=](flame_tensor_t* o) { return flame_log1p(t, o); }},
      {"flame_expm1", [=](flame_tensor_t* o) { return flame_expm1(t, o); }},
      {"flame_sqrt", [=](flame_tensor_t* o) { return flame_sqrt(t, o); }},
      {"flame_rsqrt", [=](flame_tensor_t* o) { return flame_rsqrt(t, o); }},
      {"flame_sin", [=](flame_tensor_t* o) { return flame_sin(t, o); }},
      {"flame_cos", [=](flame_tensor_t* o) { return flame_cos(t, o); }},
      {"flame_tanh", [=](flame_tensor_t* o) { return flame_tanh(t, o); }},
      {"flame_sigmoid", [=](flame_tensor_t* o) { return flame_sigmoid(t, o); }},
      {"flame_relu", [=](flame_tensor_t* o) { return flame_relu(t, o); }},
      {"flame_silu", [=](flame_tensor_t* o) { return flame_silu(t, o); }},
      {"flame_leaky_relu", [=](flame_tensor_t* o) { return flame_leaky_relu(t, 0.01, o); }},
      {"flame_elu", [=](flame_tensor_t* o) { return flame_elu(t, 1.0, o); }},
      {"flame_gelu", [=](flame_tensor_t* o) { return flame_gelu(t, 0, o); }},
      {"flame_softplus", [=](flame_tensor_t* o) { return flame_softplus(t, 1.0, 20.0, o); }},
      {"flame_floor", [=](flame_tensor_t* o) { return flame_floor(t, o); }},
      {"flame_ceil", [=](flame_tensor_t* o) { return flame_ceil(t, o); }},
      {"flame_round", [=](flame_tensor_t* o) { return flame_round(t, o); }},
      {"flame_sign", [=](flame_tensor_t* o) { return flame_sign(t, o); }},
      {"flame_reciprocal", [=](flame_tensor_t* o) { return flame_reciprocal(t, o); }},
      {"flame_square", [=](flame_tensor_t* o) { return flame_square(t, o); }},
      {"flame_isnan", [=](flame_tensor_t* o) { return flame_isnan(t, o); }},
      {"flame_isinf", [=](flame_tensor_t* o) { return flame_isinf(t, o); }},
      // reductions
      {"flame_sum", [=](flame_tensor_t* o) { return flame_sum(t, dims, 1, 0, o); }},
      {"flame_mean", [=](flame_tensor_t* o) { return flame_mean(t, nullptr, 0, 1, o); }},
      {"flame_prod", [=](flame_tensor_t* o) { return flame_prod(t, nullptr, 0, 0, o); }},
      {"flame_max", [=](flame_tensor_t* o) { return flame_max(t, dims, 1, 0, o); }},
      {"flame_min", [=](flame_tensor_t* o) { return flame_min(t, dims, 1, 0, o); }},
      {"flame_var", [=](flame_tensor_t* o) { return flame_var(t, dims, 1, 1.0, 0, o); }},
      {"flame_std", [=](flame_tensor_t* o) { return flame_std(t, dims, 1, 0.0, 0, o); }},
      {"flame_norm", [=](flame_tensor_t* o) { return flame_norm(t, 2.0, nullptr, 0, 0, o); }},
      {"flame_logsumexp", [=](flame_tensor_t* o) { return flame_logsumexp(t, dims, 1, 0, o); }},
      {"flame_argmax", [=](flame_tensor_t* o) { return flame_argmax(t, FLAME_DIM_ALL, 0, o); }},
      {"flame_argmin", [=](flame_tensor_t* o) { return flame_argmin(t, 0, 1, o); }},
      {"flame_cumsum", [=](flame_tensor_t* o) { return flame_cumsum(t, 0, o); }},
      {"flame_sum_all", [=](flame_tensor_t* o) { return flame_sum_all(t, o); }},
      {"flame_max_all", [=](flame_tensor_t* o) { return flame_max_all(t, o); }},
      {"flame_min_all", [=](flame_tensor_t* o) { return flame_min_all(t, o); }},
      // autograd
      {"flame_tensor_detach", [=](flame_tensor_t* o) { return flame_tensor_detach(t, o); }},
      {"flame_tensor_grad", [=](flame_tensor_t* o) { return flame_tensor_grad(t, o); }},
  };
  // ---- neural-network ops: softmax and normalisation ----
  static const int64_t last[] = {3};
  std::vector<OutCase> nn = {
      {"flame_softmax", [=](flame_tensor_t* o) { return flame_softmax(t, -1, o); }},
      {"flame_log_softmax", [=](flame_tensor_t* o) { return flame_log_softmax(t, -1, o); }},
      {"flame_layer_norm", [=](flame_tensor_t* o) { return flame_layer_norm(t, last, 1, nullptr, nullptr, 1e-5, o); }},
      {"flame_rms_norm", [=](flame_tensor_t* o) { return flame_rms_norm(t, last, 1, nullptr, 1e-5, o); }},
      {"flame_group_norm", [=](flame_tensor_t* o) { return flame_group_norm(t, 1, nullptr, nullptr, 1e-5, 0, o); }},
      {"flame_batch_norm",
       [=](flame_tensor_t* o) { return flame_batch_norm(t, nullptr, nullptr, nullptr, nullptr, 1, 0.1, 1e-5, o); }},
  };
  v.insert(v.end(), nn.begin(), nn.end());
  return v;
}

TEST(NullArguments, TensorOutSetToNullAndFunctionNamed) {
  for (const OutCase& c : tensor_out_cases()) {
    flame_tensor_t out = sentinel_tensor();
    flame_status_t st = c.call(&out);
    EXPECT_EQ(st, FLAME_ERROR_INVALID_ARGUMENT) << c.name << " -> " << flame_status_string(st);
    EXPECT_EQ(out, nullptr) << c.name << " must set *out to NULL on failure";
    const char* msg = flame_last_error_message();
    ASSERT_NE(msg, nullptr) << c.name;
    EXPECT_TRUE(contains(msg, c.name)) << c.name << ": the message must name the function: \"" << msg << "\"";
  }
}

TEST(NullArguments, NullOutPointer) {
  for (const OutCase& c : tensor_out_cases()) {
    flame_status_t st = c.call(nullptr);
    EXPECT_EQ(st, FLAME_ERROR_INVALID_ARGUMENT) << c.name << " with out == NULL -> " << flame_status_string(st);
  }
}

TEST(NullArguments, ListFunctions) {
  flame_tensor_t none[2] = {nullptr, nullptr};
  flame_tensor_t out = sentinel_tensor();
  FLAME_EXPECT_STATUS(flame_cat(nullptr, 2, 0, &out), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);
  out = sentinel_tensor();
  FLAME_EXPECT_STATUS(flame_cat(none, 2, 0, &out), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_cat")) << flame_last_error_message();
  out = sentinel_tensor();
  FLAME_EXPECT_STATUS(flame_stack(none, 2, 0, &out), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_stack")) << flame_last_error_message();
  FLAME_EXPECT_STATUS(flame_cat(none, 2, 0, nullptr), FLAME_ERROR_INVALID_ARGUMENT);

  flame_tensor_t outs[4];
  int32_t count = -1;
  FLAME_EXPECT_STATUS(flame_split(nullptr, 1, 0, outs, 4, &count), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_split")) << flame_last_error_message();
  FLAME_EXPECT_STATUS(flame_chunk(nullptr, 2, 0, outs, 4, &count), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_chunk")) << flame_last_error_message();
  const int64_t sizes[] = {1, 1};
  FLAME_EXPECT_STATUS(flame_split_sizes(nullptr, sizes, 2, 0, outs), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_split_sizes")) << flame_last_error_message();
}

// Functions whose OUT values are not tensors, and functions without OUT values.
TEST(NullArguments, QueriesAndCommands) {
  struct Case {
    const char* name;
    std::function<flame_status_t()> call;
  };
  flame_tensor_t t = nullptr;
  flame_ctx_t c = nullptr;
  flame_ctx_t ctx_out = sentinel_ctx();
  flame_dtype_t dt;
  int32_t i32 = 0, i32b = 0;
  int64_t i64[8];
  uint64_t u64 = 0, u64b = 0;
  double d = 0;
  float host[4];
  char name[64];
  void* stream = nullptr;
  flame_memory_stats_t stats;
  stats.struct_size = sizeof stats;
  flame_ctx_counters_t counters;
  counters.struct_size = sizeof counters;
  const std::vector<Case> cases = {
      {"flame_tensor_retain", [&] { return flame_tensor_retain(t); }},
      {"flame_tensor_context", [&] { return flame_tensor_context(t, &ctx_out); }},
      {"flame_tensor_dtype", [&] { return flame_tensor_dtype(t, &dt); }},
      {"flame_tensor_ndim", [&] { return flame_tensor_ndim(t, &i32); }},
      {"flame_tensor_shape", [&] { return flame_tensor_shape(t, i64, 8); }},
      {"flame_tensor_strides", [&] { return flame_tensor_strides(t, i64, 8); }},
      {"flame_tensor_numel", [&] { return flame_tensor_numel(t, i64); }},
      {"flame_tensor_is_contiguous", [&] { return flame_tensor_is_contiguous(t, &i32); }},
      {"flame_tensor_data_ptr", [&] { return flame_tensor_data_ptr(t, &stream); }},
      {"flame_to_host", [&] { return flame_to_host(t, host, sizeof host); }},
      {"flame_tensor_item", [&] { return flame_tensor_item(t, &d); }},
      {"flame_ctx_synchronize", [&] { return flame_ctx_synchronize(c); }},
      {"flame_ctx_device_name", [&] { return flame_ctx_device_name(c, name, sizeof name); }},
      {"flame_ctx_compute_capability", [&] { return flame_ctx_compute_capability(c, &i32, &i32b); }},
      {"flame_ctx_stream", [&] { return flame_ctx_stream(c, &stream); }},
      {"flame_ctx_cudnn_info", [&] { return flame_ctx_cudnn_info(c, &i32, &u64); }},
      {"flame_ctx_cudnn_attention_info", [&] { return flame_ctx_cudnn_attention_info(c, &u64, &u64b); }},
      {"flame_ctx_memory_stats", [&] { return flame_ctx_memory_stats(c, &stats); }},
      {"flame_ctx_reset_peak_memory", [&] { return flame_ctx_reset_peak_memory(c); }},
      {"flame_ctx_counters", [&] { return flame_ctx_counters(c, &counters); }},
      {"flame_ctx_reset_counters", [&] { return flame_ctx_reset_counters(c); }},
      {"flame_ctx_manual_seed", [&] { return flame_ctx_manual_seed(c, 42); }},
      {"flame_ctx_get_rng_state", [&] { return flame_ctx_get_rng_state(c, &u64, &u64b); }},
      {"flame_ctx_set_rng_state", [&] { return flame_ctx_set_rng_state(c, 1, 2); }},
      {"flame_ctx_set_grad_enabled", [&] { return flame_ctx_set_grad_enabled(c, 0, &i32); }},
      {"flame_ctx_is_grad_enabled", [&] { return flame_ctx_is_grad_enabled(c, &i32); }},
      {"flame_ctx_set_autocast", [&] { return flame_ctx_set_autocast(c, FLAME_DTYPE_BF16, &i32); }},
      {"flame_ctx_get_autocast", [&] { return flame_ctx_get_autocast(c, &i32); }},
      {"flame_ctx_set_inference_mode", [&] { return flame_ctx_set_inference_mode(c, 1, nullptr); }},
      {"flame_tensor_set_requires_grad", [&] { return flame_tensor_set_requires_grad(t, 1); }},
      {"flame_tensor_requires_grad", [&] { return flame_tensor_requires_grad(t, &i32); }},
      {"flame_tensor_is_leaf", [&] { return flame_tensor_is_leaf(t, &i32); }},
      {"flame_tensor_set_grad", [&] { return flame_tensor_set_grad(t, nullptr); }},
      {"flame_tensor_zero_grad", [&] { return flame_tensor_zero_grad(t); }},
      {"flame_tensor_retain_grad", [&] { return flame_tensor_retain_grad(t); }},
      {"flame_backward", [&] { return flame_backward(c, t, nullptr, 0); }},
  };
  for (const Case& cs : cases) {
    flame_status_t st = cs.call();
    EXPECT_EQ(st, FLAME_ERROR_INVALID_ARGUMENT) << cs.name << " -> " << flame_status_string(st);
    EXPECT_TRUE(contains(flame_last_error_message(), cs.name))
        << cs.name << ": the message must name the function: \"" << flame_last_error_message() << "\"";
  }
  EXPECT_EQ(ctx_out, nullptr) << "flame_tensor_context must set *ctx to NULL on failure";
}

// A valid-looking handle (the context) may be absent; the OUT pointers are NULL: still an error.
TEST(NullArguments, NullOutPointersOfQueries) {
  flame_tensor_t t = nullptr;
  FLAME_EXPECT_STATUS(flame_tensor_dtype(t, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_tensor_ndim(t, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_tensor_shape(t, nullptr, 8), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_tensor_numel(t, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_tensor_item(t, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_to_host(t, nullptr, 0), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_ctx_memory_stats(nullptr, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_ctx_counters(nullptr, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_ctx_device_name(nullptr, nullptr, 0), FLAME_ERROR_INVALID_ARGUMENT);
}

TEST(NullArguments, Grad) {
  flame_tensor_t none[1] = {nullptr};
  flame_tensor_t results[1] = {sentinel_tensor()};
  FLAME_EXPECT_STATUS(flame_grad(nullptr, none, nullptr, 1, none, 1, 0, results), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_grad")) << flame_last_error_message();
  EXPECT_EQ(results[0], nullptr) << "flame_grad must set its results to NULL on failure";
  FLAME_EXPECT_STATUS(flame_grad(nullptr, nullptr, nullptr, 0, nullptr, 0, 0, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
}

namespace {
int g_destroy_calls = 0;
flame_status_t noop_hook(void*, flame_tensor_t, flame_tensor_t* replacement) {
  *replacement = nullptr;
  return FLAME_OK;
}
flame_status_t noop_post_hook(void*, flame_tensor_t) { return FLAME_OK; }
void count_destroy(void*) { ++g_destroy_calls; }
}  // namespace

TEST(NullArguments, Hooks) {
  flame_hook_t hook = sentinel_hook();
  FLAME_EXPECT_STATUS(flame_tensor_register_hook(nullptr, noop_hook, nullptr, count_destroy, &hook),
                      FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(hook, nullptr);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_tensor_register_hook")) << flame_last_error_message();
  hook = sentinel_hook();
  FLAME_EXPECT_STATUS(
      flame_tensor_register_post_accumulate_grad_hook(nullptr, noop_post_hook, nullptr, count_destroy, &hook),
      FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(hook, nullptr);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_tensor_register_post_accumulate_grad_hook"))
      << flame_last_error_message();
  FLAME_EXPECT_STATUS(flame_tensor_register_hook(nullptr, noop_hook, nullptr, nullptr, nullptr),
                      FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_LE(g_destroy_calls, 2) << "destroy is called at most once per failed registration";
}

// ============================== Losses ==============================

static_assert(FLAME_REDUCTION_NONE == 0 && FLAME_REDUCTION_MEAN == 1 && FLAME_REDUCTION_SUM == 2,
              "flame_reduction_t values are frozen");
static_assert(sizeof(flame_reduction_t) == 4, "enums are 32-bit");

TEST(NullArguments, Losses) {
  flame_tensor_t t = nullptr;
  const flame_reduction_t mean = FLAME_REDUCTION_MEAN;
  const std::vector<OutCase> cases = {
      {"flame_cross_entropy", [=](flame_tensor_t* o) { return flame_cross_entropy(t, t, nullptr, -100, 0.0, mean, o); }},
      {"flame_nll_loss", [=](flame_tensor_t* o) { return flame_nll_loss(t, t, nullptr, -100, mean, o); }},
      {"flame_mse_loss", [=](flame_tensor_t* o) { return flame_mse_loss(t, t, mean, o); }},
      {"flame_l1_loss", [=](flame_tensor_t* o) { return flame_l1_loss(t, t, mean, o); }},
      {"flame_smooth_l1_loss", [=](flame_tensor_t* o) { return flame_smooth_l1_loss(t, t, 1.0, mean, o); }},
      {"flame_huber_loss", [=](flame_tensor_t* o) { return flame_huber_loss(t, t, 1.0, mean, o); }},
      {"flame_binary_cross_entropy_with_logits",
       [=](flame_tensor_t* o) { return flame_binary_cross_entropy_with_logits(t, t, nullptr, nullptr, mean, o); }},
  };
  expect_null_rejections(cases);
}

// ============================== DLPack exchange (no driver: argument checks only) ==============================

TEST(NullArguments, Dlpack) {
  struct DLManagedTensor* m = reinterpret_cast<struct DLManagedTensor*>(static_cast<uintptr_t>(0x40));
  FLAME_EXPECT_STATUS(flame_tensor_to_dlpack(nullptr, &m), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(m, nullptr) << "*out is NULL on failure";
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_tensor_to_dlpack")) << flame_last_error_message();
  FLAME_EXPECT_STATUS(flame_tensor_to_dlpack(nullptr, nullptr), FLAME_ERROR_INVALID_ARGUMENT);

  flame_tensor_t out = sentinel_tensor();
  FLAME_EXPECT_STATUS(flame_tensor_from_dlpack(nullptr, nullptr, &out), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_tensor_from_dlpack")) << flame_last_error_message();
  FLAME_EXPECT_STATUS(flame_tensor_from_dlpack(nullptr, nullptr, nullptr), FLAME_ERROR_INVALID_ARGUMENT);

  struct DLManagedTensorVersioned* v = reinterpret_cast<struct DLManagedTensorVersioned*>(static_cast<uintptr_t>(0x40));
  FLAME_EXPECT_STATUS(flame_tensor_to_dlpack_versioned(nullptr, &v), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(v, nullptr);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_tensor_to_dlpack_versioned")) << flame_last_error_message();
  out = sentinel_tensor();
  FLAME_EXPECT_STATUS(flame_tensor_from_dlpack_versioned(nullptr, nullptr, &out), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_tensor_from_dlpack_versioned")) << flame_last_error_message();
}

// ============================== safetensors ==============================
// Without a GPU there is no context, so these check the argument rules that come before any file
// or device work: NULL handles and OUT pointers, OUT values cleared, the function named.

TEST(NullArguments, Safetensors) {
  flame_safetensors_release(nullptr);  // a no-op
  flame_safetensors_t file = reinterpret_cast<flame_safetensors_t>(static_cast<uintptr_t>(0x40));
  FLAME_EXPECT_STATUS(flame_safetensors_load(nullptr, "/nonexistent.safetensors", &file), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(file, nullptr) << "flame_safetensors_load must set *file to NULL on failure";
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_safetensors_load")) << flame_last_error_message();
  FLAME_EXPECT_STATUS(flame_safetensors_load(nullptr, nullptr, nullptr), FLAME_ERROR_INVALID_ARGUMENT);

  int64_t count = 7;
  FLAME_EXPECT_STATUS(flame_safetensors_count(nullptr, &count), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(count, 0);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_safetensors_count")) << flame_last_error_message();
  count = 7;
  FLAME_EXPECT_STATUS(flame_safetensors_metadata_count(nullptr, &count), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(count, 0);
  FLAME_EXPECT_STATUS(flame_safetensors_count(nullptr, nullptr), FLAME_ERROR_INVALID_ARGUMENT);

  const char* str = "sentinel";
  FLAME_EXPECT_STATUS(flame_safetensors_name(nullptr, 0, &str), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(str, nullptr);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_safetensors_name")) << flame_last_error_message();
  str = "sentinel";
  FLAME_EXPECT_STATUS(flame_safetensors_metadata_key(nullptr, 0, &str), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(str, nullptr);
  str = "sentinel";
  FLAME_EXPECT_STATUS(flame_safetensors_metadata(nullptr, "k", &str), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(str, nullptr);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_safetensors_metadata")) << flame_last_error_message();

  flame_dtype_t dt = FLAME_DTYPE_F32;
  int64_t shape[FLAME_MAX_DIMS];
  int32_t nd = 5;
  FLAME_EXPECT_STATUS(flame_safetensors_info(nullptr, "w", &dt, shape, FLAME_MAX_DIMS, &nd), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(nd, 0);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_safetensors_info")) << flame_last_error_message();
  FLAME_EXPECT_STATUS(flame_safetensors_info(nullptr, "w", nullptr, shape, FLAME_MAX_DIMS, nullptr), FLAME_ERROR_INVALID_ARGUMENT);

  flame_tensor_t out = sentinel_tensor();
  FLAME_EXPECT_STATUS(flame_safetensors_get(nullptr, "w", &out), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr) << "flame_safetensors_get must set *out to NULL on failure";
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_safetensors_get")) << flame_last_error_message();
  FLAME_EXPECT_STATUS(flame_safetensors_get(nullptr, nullptr, nullptr), FLAME_ERROR_INVALID_ARGUMENT);

  FLAME_EXPECT_STATUS(flame_safetensors_save(nullptr, "/tmp/x.safetensors", nullptr, nullptr, 0, nullptr, 0),
                      FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_safetensors_save")) << flame_last_error_message();
}

// ============================== Handle scopes and parameter lists ==============================

TEST(NullArguments, Scopes) {
  flame_set_error_message("stale");
  FLAME_EXPECT_STATUS(flame_scope_end(nullptr), FLAME_OK);  // a no-op, as *_release(NULL)
  EXPECT_STREQ(flame_last_error_message(), "") << "a successful call clears the message";
  flame_scope_t scope = reinterpret_cast<flame_scope_t>(static_cast<uintptr_t>(0x40));
  FLAME_EXPECT_STATUS(flame_scope_begin(nullptr, &scope), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(scope, nullptr) << "flame_scope_begin must set *scope to NULL on failure";
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_scope_begin")) << flame_last_error_message();
  FLAME_EXPECT_STATUS(flame_scope_begin(nullptr, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_scope_keep(nullptr, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flame_last_error_message(), "scope is NULL")) << flame_last_error_message();
  int64_t count = 7;
  FLAME_EXPECT_STATUS(flame_scope_count(nullptr, &count), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(count, 0) << "flame_scope_count must clear *count on failure";
  FLAME_EXPECT_STATUS(flame_scope_count(nullptr, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
}

TEST(GarbageHandles, Scopes) {
  // Zeroed memory: no magic matches, so every entry point reports a dead handle and reads nothing else.
  std::vector<uint64_t> zeros(64, 0);
  auto scope = reinterpret_cast<flame_scope_t>(zeros.data());
  FLAME_EXPECT_STATUS(flame_scope_end(scope), FLAME_ERROR_INVALID_HANDLE);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_scope_end: scope is not an open scope"))
      << flame_last_error_message();
  FLAME_EXPECT_STATUS(flame_scope_keep(scope, reinterpret_cast<flame_tensor_t>(zeros.data())), FLAME_ERROR_INVALID_HANDLE);
  int64_t count = 7;
  FLAME_EXPECT_STATUS(flame_scope_count(scope, &count), FLAME_ERROR_INVALID_HANDLE);
  EXPECT_EQ(count, 0);
}

TEST(NullArguments, Params) {
  flame_params_release(nullptr);  // a no-op
  flame_params_t params = reinterpret_cast<flame_params_t>(static_cast<uintptr_t>(0x40));
  FLAME_EXPECT_STATUS(flame_params_create(nullptr, &params), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(params, nullptr) << "flame_params_create must set *params to NULL on failure";
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_params_create")) << flame_last_error_message();
  FLAME_EXPECT_STATUS(flame_params_create(nullptr, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_params_add(nullptr, "w", nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_params_add: params is NULL")) << flame_last_error_message();
  int64_t count = 7;
  FLAME_EXPECT_STATUS(flame_params_count(nullptr, &count), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(count, 0);
  const char* name = "x";
  FLAME_EXPECT_STATUS(flame_params_name(nullptr, 0, &name), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(name, nullptr);
  flame_tensor_t t = reinterpret_cast<flame_tensor_t>(static_cast<uintptr_t>(0x40));
  FLAME_EXPECT_STATUS(flame_params_tensor(nullptr, 0, &t), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(t, nullptr);
  t = reinterpret_cast<flame_tensor_t>(static_cast<uintptr_t>(0x40));
  FLAME_EXPECT_STATUS(flame_params_find(nullptr, "w", &t), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(t, nullptr);
  const flame_tensor_t* ts = reinterpret_cast<const flame_tensor_t*>(static_cast<uintptr_t>(0x40));
  FLAME_EXPECT_STATUS(flame_params_tensors(nullptr, &ts), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ts, nullptr);
  FLAME_EXPECT_STATUS(flame_params_save_safetensors(nullptr, "/tmp/x.safetensors", nullptr, 0), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_params_save_safetensors")) << flame_last_error_message();
  FLAME_EXPECT_STATUS(flame_params_load_safetensors(nullptr, "/tmp/x.safetensors", 0), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_params_load_safetensors")) << flame_last_error_message();
}

TEST(GarbageHandles, Params) {
  std::vector<uint64_t> zeros(64, 0);
  auto params = reinterpret_cast<flame_params_t>(zeros.data());
  flame_params_release(params);  // not a live list: nothing happens
  FLAME_EXPECT_STATUS(flame_params_add(params, "w", reinterpret_cast<flame_tensor_t>(zeros.data())), FLAME_ERROR_INVALID_HANDLE);
  EXPECT_TRUE(contains(flame_last_error_message(), "params is not a live parameter list")) << flame_last_error_message();
  // Unknown flag bits are checked after the handle: a garbage list is still reported as such.
  FLAME_EXPECT_STATUS(flame_params_load_safetensors(params, "/tmp/x.safetensors", 0x80u), FLAME_ERROR_INVALID_HANDLE);
  FLAME_EXPECT_STATUS(flame_params_save_safetensors(params, "/tmp/x.safetensors", nullptr, 0), FLAME_ERROR_INVALID_HANDLE);
}

TEST(Params, LoadFlagValues) {
  // The strictness bits compose as documented: NON_STRICT is both relaxations, CONVERT is separate.
  EXPECT_EQ(FLAME_PARAMS_LOAD_NON_STRICT, FLAME_PARAMS_LOAD_ALLOW_MISSING | FLAME_PARAMS_LOAD_ALLOW_UNEXPECTED);
  EXPECT_EQ(FLAME_PARAMS_LOAD_CONVERT_DTYPE & FLAME_PARAMS_LOAD_NON_STRICT, 0);
}

// ============================== Indexing ==============================

static_assert(FLAME_NO_PADDING == INT64_MIN, "FLAME_NO_PADDING is INT64_MIN");

TEST(NullArguments, Indexing) {
  flame_tensor_t t = nullptr;
  const std::vector<OutCase> cases = {
      {"flame_index_select", [=](flame_tensor_t* o) { return flame_index_select(t, 0, t, o); }},
      {"flame_gather", [=](flame_tensor_t* o) { return flame_gather(t, 0, t, o); }},
      {"flame_scatter_add", [=](flame_tensor_t* o) { return flame_scatter_add(t, 0, t, t, o); }},
      {"flame_index_add", [=](flame_tensor_t* o) { return flame_index_add(t, 0, t, t, 1.0, o); }},
      {"flame_masked_fill", [=](flame_tensor_t* o) { return flame_masked_fill(t, t, 0.0, o); }},
      {"flame_one_hot", [=](flame_tensor_t* o) { return flame_one_hot(t, 3, o); }},
      {"flame_embedding", [=](flame_tensor_t* o) { return flame_embedding(t, t, FLAME_NO_PADDING, o); }},
  };
  expect_null_rejections(cases);
}

// ============================== Convolution ==============================

static_assert(offsetof(flame_conv_options_t, struct_size) == 0, "layout");
static_assert(offsetof(flame_conv_options_t, stride) == 8, "layout");
static_assert(offsetof(flame_conv_options_t, padding) == 24, "layout");
static_assert(offsetof(flame_conv_options_t, dilation) == 40, "layout");
static_assert(offsetof(flame_conv_options_t, groups) == 56, "layout");
static_assert(offsetof(flame_conv_options_t, output_padding) == 64, "layout");
static_assert(offsetof(flame_conv_options_t, padding_same) == 80, "layout");

TEST(ConvOptions, InitSetsDefaults) {
  flame_conv_options_t o;
  std::memset(&o, 0x5a, sizeof o);
  ASSERT_EQ(flame_conv_options_init(&o), FLAME_OK);
  EXPECT_EQ(o.struct_size, sizeof(flame_conv_options_t));
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(o.stride[i], 1);
    EXPECT_EQ(o.padding[i], 0);
    EXPECT_EQ(o.dilation[i], 1);
    EXPECT_EQ(o.output_padding[i], 0);
  }
  EXPECT_EQ(o.groups, 1);
  EXPECT_EQ(o.padding_same, 0);
  EXPECT_EQ(flame_conv_options_init(nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_conv_options_init")) << flame_last_error_message();
}

TEST(NullArguments, Convolution) {
  flame_tensor_t t = nullptr;
  flame_conv_options_t bad;
  flame_conv_options_init(&bad);
  bad.struct_size = 3;  // not filled by flame_conv_options_init: rejected before any handle is read
  using Fn = flame_status_t (*)(flame_tensor_t, flame_tensor_t, flame_tensor_t, const flame_conv_options_t*, flame_tensor_t*);
  const std::pair<const char*, Fn> fns[] = {
      {"flame_conv2d", flame_conv2d}, {"flame_conv_transpose2d", flame_conv_transpose2d}, {"flame_conv1d", flame_conv1d}};
  for (const auto& f : fns) {
    flame_tensor_t out = sentinel_tensor();
    EXPECT_EQ(f.second(t, t, nullptr, nullptr, &out), FLAME_ERROR_INVALID_ARGUMENT) << f.first;
    EXPECT_EQ(out, nullptr) << f.first << " must set *out to NULL on failure";
    EXPECT_TRUE(contains(flame_last_error_message(), f.first)) << f.first << ": " << flame_last_error_message();
    EXPECT_EQ(f.second(t, t, nullptr, nullptr, nullptr), FLAME_ERROR_INVALID_ARGUMENT) << f.first << " with out == NULL";
    out = sentinel_tensor();
    EXPECT_EQ(f.second(t, t, nullptr, &bad, &out), FLAME_ERROR_INVALID_ARGUMENT) << f.first;
    EXPECT_EQ(out, nullptr);
    EXPECT_TRUE(contains(flame_last_error_message(), "struct_size")) << f.first << ": " << flame_last_error_message();
  }
}

// ============================== Attention ==============================

static_assert(FLAME_ATTENTION_CAUSAL == 1, "flag values are frozen");
static_assert(offsetof(flame_attention_options_t, struct_size) == 0, "layout");
static_assert(offsetof(flame_attention_options_t, flags) == 8, "layout");
static_assert(offsetof(flame_attention_options_t, scale) == 16, "layout");
static_assert(offsetof(flame_attention_options_t, dropout_p) == 24, "layout");
static_assert(sizeof(flame_attention_options_t) == 32, "layout");

TEST(Attention, OptionsInitWorksWithoutADevice) {
  flame_attention_options_t o;
  std::memset(&o, 0x7f, sizeof o);
  ASSERT_EQ(flame_attention_options_init(&o), FLAME_OK);
  EXPECT_EQ(o.struct_size, sizeof(flame_attention_options_t));
  EXPECT_EQ(o.flags, 0u);
  EXPECT_EQ(o.scale, 0.0);
  EXPECT_EQ(o.dropout_p, 0.0);
  EXPECT_EQ(flame_attention_options_init(nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_attention_options_init")) << flame_last_error_message();
}

TEST(NullArguments, Attention) {
  flame_tensor_t t = nullptr;
  flame_attention_options_t o;
  flame_attention_options_init(&o);
  const std::vector<OutCase> cases = {
      {"flame_scaled_dot_product_attention",
       [=](flame_tensor_t* out) { return flame_scaled_dot_product_attention(t, t, t, nullptr, &o, out); }},
      {"flame_scaled_dot_product_attention",
       [=](flame_tensor_t* out) { return flame_scaled_dot_product_attention(t, t, t, t, nullptr, out); }},
  };
  expect_null_rejections(cases);
}

// ============================== Indexing: scatter, masked_select, repeat, pad ==============================

static_assert(FLAME_PAD_CONSTANT == 0 && FLAME_PAD_REFLECT == 1 && FLAME_PAD_REPLICATE == 2, "flame_pad_mode_t is frozen");
static_assert(sizeof(flame_pad_mode_t) == 4, "enums are 32-bit");

TEST(NullArguments, NnIndexing) {
  flame_tensor_t t = nullptr;
  const int64_t two[2] = {1, 1};
  const std::vector<OutCase> cases = {
      {"flame_scatter", [=](flame_tensor_t* o) { return flame_scatter(t, 0, t, t, o); }},
      {"flame_masked_select", [=](flame_tensor_t* o) { return flame_masked_select(t, t, o); }},
      {"flame_repeat", [=](flame_tensor_t* o) { return flame_repeat(t, two, 2, o); }},
      {"flame_repeat_interleave", [=](flame_tensor_t* o) { return flame_repeat_interleave(t, 2, 0, o); }},
      {"flame_pad", [=](flame_tensor_t* o) { return flame_pad(t, two, 2, FLAME_PAD_CONSTANT, 0.0, o); }},
      {"flame_dropout", [=](flame_tensor_t* o) { return flame_dropout(t, 0.5, 1, o); }},
  };
  expect_null_rejections(cases);
}

// ============================== Pooling ==============================

static_assert(offsetof(flame_pool2d_options_t, struct_size) == 0, "layout");
static_assert(offsetof(flame_pool2d_options_t, kernel_size) == 8, "layout");
static_assert(offsetof(flame_pool2d_options_t, stride) == 24, "layout");
static_assert(offsetof(flame_pool2d_options_t, padding) == 40, "layout");
static_assert(offsetof(flame_pool2d_options_t, dilation) == 56, "layout");
static_assert(offsetof(flame_pool2d_options_t, ceil_mode) == 72, "layout");
static_assert(offsetof(flame_pool2d_options_t, count_include_pad) == 76, "layout");
static_assert(offsetof(flame_pool2d_options_t, divisor_override) == 80, "layout");
static_assert(sizeof(flame_pool2d_options_t) == 88, "layout");

TEST(Pool2dOptions, InitSetsDefaults) {
  flame_pool2d_options_t o;
  std::memset(&o, 0x5a, sizeof o);
  FLAME_EXPECT_STATUS(flame_pool2d_options_init(&o, 3, 2), FLAME_OK);
  EXPECT_EQ(o.struct_size, sizeof o);
  EXPECT_EQ(o.kernel_size[0], 3);
  EXPECT_EQ(o.stride[1], 2);
  EXPECT_EQ(o.padding[0], 0);
  EXPECT_EQ(o.dilation[1], 1);
  EXPECT_EQ(o.ceil_mode, 0);
  EXPECT_EQ(o.count_include_pad, 1);
  EXPECT_EQ(o.divisor_override, 0);
  FLAME_EXPECT_STATUS(flame_pool2d_options_init(nullptr, 3, 2), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_pool2d_options_init")) << flame_last_error_message();
}

TEST(NullArguments, Pooling) {
  flame_tensor_t t = nullptr;
  flame_pool2d_options_t o;
  flame_pool2d_options_init(&o, 2, 2);
  const flame_pool2d_options_t* po = &o;
  const std::vector<OutCase> cases = {
      {"flame_max_pool2d", [=](flame_tensor_t* out) { return flame_max_pool2d(t, po, out); }},
      {"flame_avg_pool2d", [=](flame_tensor_t* out) { return flame_avg_pool2d(t, po, out); }},
      {"flame_adaptive_avg_pool2d", [=](flame_tensor_t* out) { return flame_adaptive_avg_pool2d(t, 2, 2, out); }},
  };
  expect_null_rejections(cases);
}

// ============================== Upsampling ==============================

TEST(NullArguments, Upsampling) {
  flame_tensor_t t = nullptr;
  const std::vector<OutCase> cases = {
      {"flame_upsample_nearest2d", [=](flame_tensor_t* o) { return flame_upsample_nearest2d(t, 0, 0, 2.0, 2.0, o); }},
      {"flame_upsample_bilinear2d", [=](flame_tensor_t* o) { return flame_upsample_bilinear2d(t, 4, 4, 0.0, 0.0, 0, o); }},
  };
  expect_null_rejections(cases);
}

// ============================== Positional embeddings ==============================

static_assert(offsetof(flame_rope_options_t, struct_size) == 0, "layout");
static_assert(offsetof(flame_rope_options_t, theta) == 8, "layout");
static_assert(offsetof(flame_rope_options_t, rotary_dim) == 16, "layout");
static_assert(offsetof(flame_rope_options_t, position_offset) == 24, "layout");
static_assert(offsetof(flame_rope_options_t, interleaved) == 32, "layout");
static_assert(offsetof(flame_rope_options_t, seq_dim) == 36, "layout");
static_assert(sizeof(flame_rope_options_t) == 40, "layout");

TEST(RopeOptions, InitSetsDefaults) {
  flame_rope_options_t o;
  std::memset(&o, 0x5a, sizeof o);
  FLAME_EXPECT_STATUS(flame_rope_options_init(&o), FLAME_OK);
  EXPECT_EQ(o.struct_size, sizeof o);
  EXPECT_EQ(o.theta, 10000.0);
  EXPECT_EQ(o.rotary_dim, 0);
  EXPECT_EQ(o.position_offset, 0);
  EXPECT_EQ(o.interleaved, 0);
  EXPECT_EQ(o.seq_dim, -2);
  FLAME_EXPECT_STATUS(flame_rope_options_init(nullptr), FLAME_ERROR_INVALID_ARGUMENT);
}

TEST(NullArguments, PositionalEmbeddings) {
  flame_tensor_t t = nullptr;
  flame_rope_options_t o;
  flame_rope_options_init(&o);
  const flame_rope_options_t* po = &o;
  const std::vector<OutCase> cases = {
      {"flame_rope", [=](flame_tensor_t* out) { return flame_rope(t, nullptr, po, out); }},
      {"flame_timestep_embedding", [=](flame_tensor_t* out) { return flame_timestep_embedding(t, 8, 1e4, 0, 1.0, 1.0, out); }},
  };
  expect_null_rejections(cases);
}

// ============================== Composite blocks ==============================

TEST(NullArguments, CompositeBlocks) {
  flame_tensor_t t = nullptr;
  const std::vector<OutCase> cases = {
      {"flame_geglu", [=](flame_tensor_t* o) { return flame_geglu(t, 0, o); }},
      {"flame_adaln_modulate", [=](flame_tensor_t* o) { return flame_adaln_modulate(t, t, t, o); }},
      {"flame_swiglu_mlp", [=](flame_tensor_t* o) { return flame_swiglu_mlp(t, t, t, t, o); }},
  };
  expect_null_rejections(cases);
}

// ============================== Training toolkit ==============================

#if defined(__LP64__)
static_assert(offsetof(flame_grad_scaler_options_t, struct_size) == 0 && offsetof(flame_grad_scaler_options_t, init_scale) == 8 &&
                  offsetof(flame_grad_scaler_options_t, growth_factor) == 16 &&
                  offsetof(flame_grad_scaler_options_t, backoff_factor) == 24 &&
                  offsetof(flame_grad_scaler_options_t, growth_interval) == 32 &&
                  offsetof(flame_grad_scaler_options_t, enabled) == 40 && sizeof(flame_grad_scaler_options_t) == 48,
              "flame_grad_scaler_options_t layout");
#endif
static_assert(FLAME_STAT_NORM == 0 && FLAME_STAT_MIN == 1 && FLAME_STAT_MAX == 2 && FLAME_STAT_MEAN == 3 &&
                  FLAME_STAT_NAN_COUNT == 4 && FLAME_STAT_INF_COUNT == 5 && FLAME_STAT_COLUMNS == 6,
              "statistics columns are frozen");

TEST(Toolkit, ScalerOptionsDefaultsWithoutADriver) {
  flame_grad_scaler_options_t o;
  std::memset(&o, 0xab, sizeof o);
  FLAME_EXPECT_STATUS(flame_grad_scaler_options_init(&o), FLAME_OK);
  EXPECT_EQ(o.struct_size, sizeof o);
  EXPECT_EQ(o.init_scale, 65536.0);
  EXPECT_EQ(o.growth_interval, 2000);
  FLAME_EXPECT_STATUS(flame_grad_scaler_options_init(nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  flame_grad_scaler_t s = reinterpret_cast<flame_grad_scaler_t>(static_cast<uintptr_t>(0x40));
  FLAME_EXPECT_STATUS(flame_grad_scaler_create(nullptr, &o, &s), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(s, nullptr);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_grad_scaler_create")) << flame_last_error_message();
  flame_grad_scaler_release(nullptr);
}

TEST(Toolkit, LoraWithoutADriver) {
  flame_lora_t l = reinterpret_cast<flame_lora_t>(static_cast<uintptr_t>(0x40));
  FLAME_EXPECT_STATUS(flame_lora_create(nullptr, nullptr, 2, 1.0, &l), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(l, nullptr);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_lora_create")) << flame_last_error_message();
  FLAME_EXPECT_STATUS(flame_lora_merge(nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  flame_lora_release(nullptr);
}

// ============================== CUDA graphs ==============================

TEST(NullArguments, Graphs) {
  FLAME_EXPECT_STATUS(flame_graph_capture_begin(nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_graph_capture_begin")) << flame_last_error_message();
  FLAME_EXPECT_STATUS(flame_graph_capture_begin_shared(nullptr, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_graph_capture_begin_shared")) << flame_last_error_message();
  EXPECT_TRUE(contains(flame_last_error_message(), "ctx is NULL")) << flame_last_error_message();
  flame_graph_t g = reinterpret_cast<flame_graph_t>(static_cast<uintptr_t>(0x40));
  FLAME_EXPECT_STATUS(flame_graph_capture_end(nullptr, &g), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(g, nullptr) << "flame_graph_capture_end must set *graph to NULL on failure";
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_graph_capture_end")) << flame_last_error_message();
  FLAME_EXPECT_STATUS(flame_graph_capture_end(nullptr, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_graph_replay(nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_graph_replay")) << flame_last_error_message();
  const float host[2] = {1, 2};
  FLAME_EXPECT_STATUS(flame_copy_from_host(nullptr, host, sizeof host), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_copy_from_host")) << flame_last_error_message();
  flame_graph_release(nullptr);
}

// ============================== Distributed (NCCL) ==============================

static_assert(sizeof(flame_comm_id_t) == FLAME_COMM_ID_BYTES && FLAME_COMM_ID_BYTES == 128, "flame_comm_id_t is 128 bytes");
static_assert(FLAME_REDUCE_SUM == 0 && FLAME_REDUCE_AVG == 1 && FLAME_REDUCE_MAX == 2 && FLAME_REDUCE_MIN == 3,
              "reduction values are frozen");
#if defined(__LP64__)
static_assert(offsetof(flame_comm_options_t, timeout_ms) == 8 && sizeof(flame_comm_options_t) == 16,
              "flame_comm_options_t layout");
static_assert(offsetof(flame_dp_options_t, bucket_bytes) == 8 && offsetof(flame_dp_options_t, broadcast_parameters) == 16 &&
                  sizeof(flame_dp_options_t) == 24,
              "flame_dp_options_t layout");
#endif

TEST(Distributed, OptionsDefaultsWithoutADriver) {
  flame_comm_options_t co;
  std::memset(&co, 0xab, sizeof co);
  FLAME_EXPECT_STATUS(flame_comm_options_init(&co), FLAME_OK);
  EXPECT_EQ(co.struct_size, sizeof co);
  EXPECT_EQ(co.timeout_ms, 600000);
  flame_dp_options_t dpo;
  std::memset(&dpo, 0xab, sizeof dpo);
  FLAME_EXPECT_STATUS(flame_dp_options_init(&dpo), FLAME_OK);
  EXPECT_EQ(dpo.struct_size, sizeof dpo);
  EXPECT_EQ(dpo.bucket_bytes, uint64_t{64} << 20);
  EXPECT_EQ(dpo.broadcast_parameters, 1);
  FLAME_EXPECT_STATUS(flame_comm_options_init(nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_dp_options_init(nullptr), FLAME_ERROR_INVALID_ARGUMENT);
}

// ZeRO options, stage 3 fields included; a ZeRO-3 call without a helper fails cleanly.
TEST(Distributed, ZeroOptionsDefaultsWithoutADriver) {
  flame_zero_options_t zo;
  std::memset(&zo, 0xab, sizeof zo);
  FLAME_EXPECT_STATUS(flame_zero_options_init(&zo), FLAME_OK);
  EXPECT_EQ(zo.struct_size, sizeof zo);
  EXPECT_EQ(zo.stage, 1);
  EXPECT_EQ(zo.broadcast_parameters, 1);
  EXPECT_EQ(zo.max_grad_norm, 0.0);
  EXPECT_EQ(zo.model, nullptr);
  EXPECT_EQ(zo.gather_slots, 2);
  EXPECT_EQ(zo.reduce_dtype, FLAME_ZERO_PARAM_DTYPE);
  EXPECT_EQ(zo.gather_dtype, FLAME_ZERO_PARAM_DTYPE);
  FLAME_EXPECT_STATUS(flame_zero_options_init(nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  flame_params_t p = reinterpret_cast<flame_params_t>(static_cast<uintptr_t>(0x40));
  FLAME_EXPECT_STATUS(flame_zero_gather_params(nullptr, &p), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(p, nullptr);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_zero_gather_params")) << flame_last_error_message();
  // Checkpoints: a NULL helper is refused before the path is read.
  FLAME_EXPECT_STATUS(flame_zero_save_full(nullptr, "/nonexistent/full.safetensors"), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_zero_save_full")) << flame_last_error_message();
  FLAME_EXPECT_STATUS(flame_zero_save_shards(nullptr, "/nonexistent/ck"), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_zero_load(nullptr, "/nonexistent/ck-0-of-1.safetensors"), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_zero_load")) << flame_last_error_message();
}

// The communication dtypes are checked before any handle: a bad value is refused by name and
// nothing is created. A caller's struct of the version before them (its struct_size ends where
// reduce_dtype now lies, in what was padding) keeps the defaults whatever that padding holds.
TEST(Distributed, ZeroCommunicationDtypesRefusedBeforeAnyHandle) {
  flame_zero_options_t zo;
  flame_zero_t z = reinterpret_cast<flame_zero_t>(static_cast<uintptr_t>(0x40));
  const std::vector<std::pair<int32_t, int32_t>> bad = {{FLAME_DTYPE_F16, FLAME_ZERO_PARAM_DTYPE},
                                                        {FLAME_DTYPE_I64, FLAME_ZERO_PARAM_DTYPE},
                                                        {-2, FLAME_ZERO_PARAM_DTYPE},
                                                        {FLAME_ZERO_PARAM_DTYPE, FLAME_DTYPE_F32},
                                                        {FLAME_ZERO_PARAM_DTYPE, FLAME_DTYPE_BF16}};  // stage 1
  for (const auto& [reduce, gather] : bad) {
    SCOPED_TRACE("reduce_dtype " + std::to_string(reduce) + ", gather_dtype " + std::to_string(gather));
    FLAME_EXPECT_STATUS(flame_zero_options_init(&zo), FLAME_OK);
    zo.reduce_dtype = reduce;
    zo.gather_dtype = gather;
    z = reinterpret_cast<flame_zero_t>(static_cast<uintptr_t>(0x40));
    FLAME_EXPECT_STATUS(flame_zero_create(nullptr, nullptr, &zo, &z), FLAME_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(z, nullptr);
    const std::string msg = flame_last_error_message();
    EXPECT_TRUE(contains(msg.c_str(), reduce != FLAME_ZERO_PARAM_DTYPE ? "reduce_dtype" : "gather_dtype")) << msg;
    EXPECT_TRUE(contains(msg.c_str(), "flame_zero_create")) << msg;
  }
  // Valid values pass the options and reach the handles (here: the NULL communicator).
  FLAME_EXPECT_STATUS(flame_zero_options_init(&zo), FLAME_OK);
  zo.reduce_dtype = FLAME_DTYPE_BF16;
  FLAME_EXPECT_STATUS(flame_zero_create(nullptr, nullptr, &zo, &z), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flame_last_error_message(), "comm")) << flame_last_error_message();
  EXPECT_FALSE(contains(flame_last_error_message(), "dtype")) << flame_last_error_message();
  // The previous version's struct: its last 4 bytes were padding, here garbage, never read.
  FLAME_EXPECT_STATUS(flame_zero_options_init(&zo), FLAME_OK);
  zo.struct_size = offsetof(flame_zero_options_t, reduce_dtype) + sizeof(int32_t);
  zo.reduce_dtype = 77;
  zo.gather_dtype = 77;
  FLAME_EXPECT_STATUS(flame_zero_create(nullptr, nullptr, &zo, &z), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flame_last_error_message(), "comm")) << flame_last_error_message();
  EXPECT_FALSE(contains(flame_last_error_message(), "dtype")) << flame_last_error_message();
  // The current struct with the same values is read whole and refused.
  zo.struct_size = sizeof zo;
  FLAME_EXPECT_STATUS(flame_zero_create(nullptr, nullptr, &zo, &z), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flame_last_error_message(), "reduce_dtype")) << flame_last_error_message();
}

TEST(Distributed, NullArgumentsWithoutADriver) {
  flame_comm_id_t id;
  std::memset(&id, 0x5a, sizeof id);
  FLAME_EXPECT_STATUS(flame_comm_unique_id(nullptr, &id), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(id.internal[0], 0) << "the id is cleared on failure";
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_comm_unique_id")) << flame_last_error_message();

  flame_comm_t c = reinterpret_cast<flame_comm_t>(static_cast<uintptr_t>(0x40));
  FLAME_EXPECT_STATUS(flame_comm_create(nullptr, &id, 0, 1, nullptr, &c), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(c, nullptr);
  EXPECT_TRUE(contains(flame_last_error_message(), "ctx")) << flame_last_error_message();
  FLAME_EXPECT_STATUS(flame_comm_create(nullptr, &id, 0, 1, nullptr, nullptr), FLAME_ERROR_INVALID_ARGUMENT);

  flame_comm_t comms[2] = {c, c};
  comms[0] = comms[1] = reinterpret_cast<flame_comm_t>(static_cast<uintptr_t>(0x40));
  flame_ctx_t ctxs[2] = {nullptr, nullptr};
  FLAME_EXPECT_STATUS(flame_comm_create_group(ctxs, 2, nullptr, comms), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(comms[0], nullptr);
  EXPECT_EQ(comms[1], nullptr);
  EXPECT_TRUE(contains(flame_last_error_message(), "ctxs[0]")) << flame_last_error_message();
  FLAME_EXPECT_STATUS(flame_comm_create_group(nullptr, 2, nullptr, comms), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_comm_create_group(ctxs, 0, nullptr, comms), FLAME_ERROR_INVALID_ARGUMENT);

  int32_t v = 7;
  FLAME_EXPECT_STATUS(flame_comm_rank(nullptr, &v), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(v, 0);
  FLAME_EXPECT_STATUS(flame_comm_size(nullptr, &v), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_comm_synchronize(nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_comm_all_reduce(nullptr, nullptr, FLAME_REDUCE_SUM), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_comm_broadcast(nullptr, nullptr, 0), FLAME_ERROR_INVALID_ARGUMENT);
  flame_tensor_t out = reinterpret_cast<flame_tensor_t>(static_cast<uintptr_t>(0x40));
  FLAME_EXPECT_STATUS(flame_comm_all_gather(nullptr, nullptr, &out), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);
  out = reinterpret_cast<flame_tensor_t>(static_cast<uintptr_t>(0x40));
  FLAME_EXPECT_STATUS(flame_comm_reduce_scatter(nullptr, nullptr, FLAME_REDUCE_SUM, &out), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_comm_reduce_scatter")) << flame_last_error_message();

  flame_dp_t dp = reinterpret_cast<flame_dp_t>(static_cast<uintptr_t>(0x40));
  FLAME_EXPECT_STATUS(flame_dp_create(nullptr, nullptr, 0, nullptr, &dp), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(dp, nullptr);
  EXPECT_TRUE(contains(flame_last_error_message(), "comm")) << flame_last_error_message();
  FLAME_EXPECT_STATUS(flame_dp_set_sync(nullptr, 1), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_dp_wait(nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  flame_comm_release(nullptr);
  flame_dp_release(nullptr);
}

// ============================== Fused elementwise expressions ==============================

static_assert(FLAME_FUSED_MAX_INPUTS == 8, "FLAME_FUSED_MAX_INPUTS is frozen");

TEST(NullArguments, Fused) {
  flame_fused_t f = reinterpret_cast<flame_fused_t>(static_cast<uintptr_t>(0x40));
  FLAME_EXPECT_STATUS(flame_fused_compile(nullptr, "x0", 1, &f), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(f, nullptr) << "flame_fused_compile must set *out to NULL on failure";
  EXPECT_TRUE(contains(flame_last_error_message(), "flame_fused_compile")) << flame_last_error_message();
  FLAME_EXPECT_STATUS(flame_fused_compile(nullptr, "x0", 1, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  flame_tensor_t out = reinterpret_cast<flame_tensor_t>(static_cast<uintptr_t>(0x40));
  FLAME_EXPECT_STATUS(flame_fused_call(nullptr, nullptr, 0, &out), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);
  EXPECT_TRUE(contains(flame_last_error_message(), "fn")) << flame_last_error_message();
  flame_fused_release(nullptr);
}

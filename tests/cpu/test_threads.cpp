// Threads on the CPU paths (issue 12), through libflame.so as a user links it, without a GPU (the
// test runs with FLAME_CUDA_DRIVER_PATH pointing at nothing). Many threads start together (a
// barrier) and hammer the paths that need no device: context creation failing without a driver,
// flame_device_count, argument checks of ops and of the toolkit, the per-thread error message and
// the static string functions. Each thread checks its own results; the point is as much the
// ThreadSanitizer run of this binary in CI (.ci/run step 8, build-tsan/) as the assertions.
#include <gtest/gtest.h>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include "flame.h"

namespace {

constexpr int kThreads = 12;
constexpr int kRounds = 40;

// Releases every waiting thread at once, so that the calls overlap as much as possible.
class StartLine {
 public:
  explicit StartLine(int n) : left_(n) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(m_);
    if (--left_ == 0) cv_.notify_all();
    cv_.wait(lock, [this] { return left_ == 0; });
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int left_;
};

bool contains(const char* s, const char* part) { return s && std::strstr(s, part) != nullptr; }

// Runs body(thread index) in kThreads threads started together; returns the failures ("" each).
template <class F>
std::vector<std::string> run_threads(F body) {
  StartLine line(kThreads);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([i, &line, &errors, &body] {
      line.arrive_and_wait();
      errors[static_cast<size_t>(i)] = body(i);
    });
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace

TEST(CpuThreads, ContextCreationFailsCleanlyEverywhereAtOnce) {
  auto errors = run_threads([](int i) -> std::string {
    for (int r = 0; r < kRounds; ++r) {
      flame_ctx_options_t o;
      if (flame_ctx_options_init(&o) != FLAME_OK) return "options_init failed";
      o.device = (i + r) % 3;  // several ordinals: each fails before it is looked at
      o.seed = static_cast<uint64_t>(i);
      o.kernel_cache_dir = (r % 2) ? "" : nullptr;
      flame_ctx_t ctx = reinterpret_cast<flame_ctx_t>(static_cast<uintptr_t>(0x1000 + i));  // must become NULL
      flame_status_t st = flame_ctx_create((r % 4 == 3) ? nullptr : &o, &ctx);
      if (st != FLAME_ERROR_NO_DRIVER && st != FLAME_ERROR_NO_DEVICE)
        return std::string("round ") + std::to_string(r) + ": ctx_create gave " + flame_status_string(st);
      if (ctx != nullptr) return "ctx not cleared on failure";
      if (!contains(flame_last_error_message(), "flame_ctx_create"))
        return std::string("message does not name the function: ") + flame_last_error_message();
      int32_t n = -1;
      st = flame_device_count(&n);
      if (st != FLAME_ERROR_NO_DRIVER) return std::string("device_count gave ") + flame_status_string(st);
      if (!contains(flame_last_error_message(), "flame_device_count"))
        return std::string("device_count message: ") + flame_last_error_message();
      flame_ctx_destroy(nullptr);  // no-op, also concurrently
    }
    return "";
  });
  for (int i = 0; i < kThreads; ++i) EXPECT_EQ(errors[static_cast<size_t>(i)], "") << "thread " << i;
}

TEST(CpuThreads, ErrorPathsKeepTheirOwnMessage) {
  // Each thread fails in its own functions and interleaves successes and messages set by "hooks";
  // after every call the thread's message is its own and matches the call it just made.
  auto errors = run_threads([](int i) -> std::string {
    const std::string own = "hook of thread " + std::to_string(i);
    for (int r = 0; r < kRounds; ++r) {
      flame_tensor_t out = reinterpret_cast<flame_tensor_t>(static_cast<uintptr_t>(0x2000 + i));
      flame_status_t st = FLAME_OK;
      const char* fn = nullptr;
      switch ((i + r) % 6) {
        case 0: st = flame_add(nullptr, nullptr, &out); fn = "flame_add"; break;
        case 1: st = flame_softmax(nullptr, -1, &out); fn = "flame_softmax"; break;
        case 2: st = flame_zeros(nullptr, nullptr, 0, FLAME_DTYPE_F32, &out); fn = "flame_zeros"; break;
        case 3: st = flame_tensor_retain(nullptr); out = nullptr; fn = "flame_tensor_retain"; break;
        case 4: st = flame_sum_all(nullptr, &out); fn = "flame_sum_all"; break;
        default: st = flame_gather(nullptr, 0, nullptr, &out); fn = "flame_gather"; break;
      }
      if (st != FLAME_ERROR_INVALID_ARGUMENT)
        return std::string(fn) + " gave " + flame_status_string(st) + " in round " + std::to_string(r);
      if (out != nullptr) return std::string(fn) + " did not clear out";
      if (!contains(flame_last_error_message(), fn))
        return std::string(fn) + ": the message is not this thread's: " + flame_last_error_message();
      flame_set_error_message(own.c_str());
      if (own != flame_last_error_message()) return std::string("hook message replaced: ") + flame_last_error_message();
      flame_ctx_options_t o;
      if (flame_ctx_options_init(&o) != FLAME_OK) return "options_init failed";
      if (std::strcmp(flame_last_error_message(), "") != 0) return "a success left a message";
      flame_tensor_release(nullptr);
      if (std::strcmp(flame_status_string(FLAME_ERROR_CONTEXT_FAILED), "FLAME_ERROR_CONTEXT_FAILED") != 0)
        return "status string";
      if (std::strcmp(flame_dtype_name(FLAME_DTYPE_BF16), "bf16") != 0 || flame_dtype_size(FLAME_DTYPE_I64) != 8)
        return "dtype helpers";
    }
    return "";
  });
  for (int i = 0; i < kThreads; ++i) EXPECT_EQ(errors[static_cast<size_t>(i)], "") << "thread " << i;
}

TEST(CpuThreads, OptionInitialisersAndVersion) {
  std::atomic<int> bad{0};
  auto errors = run_threads([&bad](int) -> std::string {
    for (int r = 0; r < kRounds; ++r) {
      flame_optimizer_options_t oo;
      flame_conv_options_t co;
      flame_attention_options_t ao;
      flame_pool2d_options_t po;
      flame_rope_options_t ro;
      flame_grad_scaler_options_t go;
      if (flame_optimizer_options_init(&oo, FLAME_OPTIMIZER_ADAMW) != FLAME_OK || flame_conv_options_init(&co) != FLAME_OK ||
          flame_attention_options_init(&ao) != FLAME_OK || flame_pool2d_options_init(&po, 2, 2) != FLAME_OK ||
          flame_rope_options_init(&ro) != FLAME_OK || flame_grad_scaler_options_init(&go) != FLAME_OK)
        return std::string("an options_init failed: ") + flame_last_error_message();
      if (flame_abi_version() != FLAME_ABI_VERSION) bad.fetch_add(1);
      if (std::strlen(flame_version_string()) < 5) bad.fetch_add(1);
    }
    return "";
  });
  for (int i = 0; i < kThreads; ++i) EXPECT_EQ(errors[static_cast<size_t>(i)], "") << "thread " << i;
  EXPECT_EQ(bad.load(), 0);
}

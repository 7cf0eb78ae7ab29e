// The context's log on a GPU (flame_ctx_set_log): a cold kernel cache announces itself in
// exactly one INFO line naming the architecture and the cache directory; a second context on the
// now-warm cache compiles nothing and says nothing; DEBUG counts every compiled kernel; a cache that
// cannot be written gives one WARNING; without a callback the line goes to stderr.
#include <dirent.h>
#include <unistd.h>
#include <cmath>
#include <fstream>
#include <string>
#include <utility>
#include <vector>
#include "flame_test.h"

namespace {

struct Recorded {
  std::vector<std::pair<int32_t, std::string>> lines;
  size_t count(int32_t level, const std::string& contains) const {
    size_t n = 0;
    for (const auto& l : lines) n += l.first == level && l.second.find(contains) != std::string::npos;
    return n;
  }
  std::string all() const {
    std::string s;
    for (const auto& l : lines) s += "  [" + std::to_string(l.first) + "] " + l.second + "\n";
    return s;
  }
};

void record(void* user_data, int32_t level, const char* message) {
  static_cast<Recorded*>(user_data)->lines.emplace_back(level, message);
}

std::string empty_dir() {
  char tmpl[] = "/tmp/flame-log-test-XXXXXX";
  const char* d = mkdtemp(tmpl);
  EXPECT_NE(d, nullptr);
  return d ? d : "";
}

int cubin_files(const std::string& dir) {
  int n = 0;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string name = e->d_name;
      n += name.size() > 6 && name.substr(name.size() - 6) == ".cubin";
    }
    closedir(d);
  }
  return n;
}

// Creates a context on cache directory dir that logs into *rec (NULL: the default sink, stderr) from
// level on, runs exp on a random vector and reads one element back, destroys the context. *arch:
// "sm_<major><minor>" of the device.
void run_one_op(const std::string& dir, Recorded* rec, int32_t level, bool* skip, std::string* why, std::string* arch) {
  flame_ctx_options_t o;
  flame_ctx_options_init(&o);
  o.kernel_cache_dir = dir.c_str();
  flame_ctx_t ctx = nullptr;
  flame_status_t st = flame_ctx_create(&o, &ctx);
  *skip = (st == FLAME_ERROR_NO_DRIVER || st == FLAME_ERROR_NO_DEVICE) && !flame_gpu_required();
  if (st != FLAME_OK) {
    *why = std::string(flame_status_string(st)) + ": " + flame_last_error_message();
    return;
  }
  // Right after creation, before any kernel: the first compile is still to come.
  FLAME_ASSERT_OK(flame_ctx_set_log(ctx, static_cast<flame_log_level_t>(level), rec ? record : nullptr, rec));
  int32_t major = 0, minor = 0;
  FLAME_ASSERT_OK(flame_ctx_compute_capability(ctx, &major, &minor));
  *arch = "sm_" + std::to_string(major * 10 + minor);
  int64_t shape[] = {1000};
  double x0 = 0, y0 = 0;
  {
    T x, y, first_x, first_y;
    FLAME_ASSERT_OK(flame_randn(ctx, shape, 1, FLAME_DTYPE_F32, x.out()));
    FLAME_ASSERT_OK(flame_exp(x, y.out()));
    FLAME_ASSERT_OK(flame_select(x, 0, 0, first_x.out()));
    FLAME_ASSERT_OK(flame_select(y, 0, 0, first_y.out()));
    FLAME_ASSERT_OK(flame_tensor_item(first_x, &x0));
    FLAME_ASSERT_OK(flame_tensor_item(first_y, &y0));
  }
  EXPECT_NEAR(y0, std::exp(x0), 1e-5 * std::exp(x0));
  flame_ctx_destroy(ctx);
}

}  // namespace

TEST(LogGpu, ColdCacheLogsOneLineWarmCacheNone) {
  const std::string dir = empty_dir();
  bool skip = false;
  std::string why, arch;
  Recorded cold;
  run_one_op(dir, &cold, FLAME_LOG_INFO, &skip, &why, &arch);
  if (skip) GTEST_SKIP() << "no GPU: " << why;
  ASSERT_TRUE(why.empty()) << why;
  ASSERT_GT(cubin_files(dir), 0) << "the op compiled nothing into " << dir;
  EXPECT_EQ(cold.count(FLAME_LOG_INFO, "compiling kernels for " + arch), 1u) << cold.all();
  EXPECT_EQ(cold.count(FLAME_LOG_INFO, "cached in " + dir), 1u) << cold.all();
  EXPECT_EQ(cold.lines.size(), 1u) << "only the one line at INFO:\n" << cold.all();

  Recorded warm;
  run_one_op(dir, &warm, FLAME_LOG_INFO, &skip, &why, &arch);
  ASSERT_TRUE(why.empty()) << why;
  EXPECT_TRUE(warm.lines.empty()) << "a warm cache compiles nothing and says nothing:\n" << warm.all();
}

TEST(LogGpu, DebugCountsEveryCompiledKernel) {
  const std::string dir = empty_dir();
  bool skip = false;
  std::string why, arch;
  Recorded rec;
  run_one_op(dir, &rec, FLAME_LOG_DEBUG, &skip, &why, &arch);
  if (skip) GTEST_SKIP() << "no GPU: " << why;
  ASSERT_TRUE(why.empty()) << why;
  const int files = cubin_files(dir);
  ASSERT_GT(files, 0);
  EXPECT_EQ(rec.count(FLAME_LOG_INFO, "compiling kernels for " + arch), 1u) << rec.all();
  EXPECT_EQ(rec.count(FLAME_LOG_DEBUG, "compiled kernel "), size_t(files)) << "one DEBUG line per cache entry written:\n"
                                                                             << rec.all();
  for (int k = 1; k <= files; ++k)
    EXPECT_EQ(rec.count(FLAME_LOG_DEBUG, "compiled kernel " + std::to_string(k) + " of this context for " + arch), 1u)
        << "kernel " << k << ":\n" << rec.all();

  Recorded warm;  // warm cache, DEBUG: still no compile line
  run_one_op(dir, &warm, FLAME_LOG_DEBUG, &skip, &why, &arch);
  EXPECT_EQ(warm.count(FLAME_LOG_DEBUG, "compiled kernel"), 0u) << warm.all();
  EXPECT_EQ(warm.count(FLAME_LOG_INFO, "compiling kernels"), 0u) << warm.all();
}

TEST(LogGpu, UnwritableCacheWarnsOnce) {
  const std::string parent = empty_dir();
  const std::string file = parent + "/not-a-directory";
  std::ofstream(file) << "x";
  const std::string dir = file + "/kernels";  // below a regular file: no one can create it, root included
  bool skip = false;
  std::string why, arch;
  Recorded rec;
  run_one_op(dir, &rec, FLAME_LOG_INFO, &skip, &why, &arch);
  if (skip) GTEST_SKIP() << "no GPU: " << why;
  ASSERT_TRUE(why.empty()) << why;
  EXPECT_EQ(rec.count(FLAME_LOG_WARNING, "cannot write the kernel cache in " + dir), 1u) << rec.all();
  EXPECT_EQ(rec.count(FLAME_LOG_INFO, "compiling kernels for " + arch), 1u) << rec.all();
}

TEST(LogGpu, WithoutCallbackTheLineGoesToStderr) {
  const std::string dir = empty_dir();
  bool skip = false;
  std::string why, arch;
  testing::internal::CaptureStderr();
  run_one_op(dir, nullptr, FLAME_LOG_INFO, &skip, &why, &arch);
  const std::string err = testing::internal::GetCapturedStderr();
  if (skip) GTEST_SKIP() << "no GPU: " << why;
  ASSERT_TRUE(why.empty()) << why;
  EXPECT_NE(err.find("flame: compiling kernels for " + arch + " on first use"), std::string::npos) << err;
  EXPECT_NE(err.find("cached in " + dir), std::string::npos) << err;
}

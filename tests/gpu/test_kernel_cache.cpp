// The on-disk kernel cache seen from the public API: a second context hits the entries the first
// wrote (nothing is rewritten), and a corrupt entry is recompiled and replaced.
#include <dirent.h>
#include <sys/stat.h>
#include <fstream>
#include <map>
#include "flame_test.h"

namespace {

std::map<std::string, long long> entries(const std::string& dir) {
  std::map<std::string, long long> m;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n.size() > 6 && n.substr(n.size() - 6) == ".cubin") {
        struct stat st;
        stat((dir + "/" + n).c_str(), &st);
        m[n] = static_cast<long long>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
      }
    }
    closedir(d);
  }
  return m;
}

// exp of a random tensor in a fresh context using cache directory dir; returns exp(x)[0] and x[0].
void run_exp(const std::string& dir, bool* skip, std::string* why, double* y0, double* x0) {
  flame_ctx_options_t o;
  flame_ctx_options_init(&o);
  o.kernel_cache_dir = dir.c_str();
  flame_ctx_t ctx = nullptr;
  flame_status_t st = flame_ctx_create(&o, &ctx);
  *skip = (st == FLAME_ERROR_NO_DRIVER || st == FLAME_ERROR_NO_DEVICE) && !flame_gpu_required();
  if (st != FLAME_OK) {
    *why = flame_last_error_message();
    return;
  }
  int64_t shape[] = {1000};
  T x, y, first_x, first_y;
  FLAME_ASSERT_OK(flame_randn(ctx, shape, 1, FLAME_DTYPE_F32, x.out()));
  FLAME_ASSERT_OK(flame_exp(x, y.out()));
  FLAME_ASSERT_OK(flame_select(x, 0, 0, first_x.out()));
  FLAME_ASSERT_OK(flame_select(y, 0, 0, first_y.out()));
  FLAME_ASSERT_OK(flame_tensor_item(first_x, x0));
  FLAME_ASSERT_OK(flame_tensor_item(first_y, y0));
  flame_ctx_destroy(ctx);
}

TEST(KernelCacheGpu, SecondContextHitsAndCorruptEntriesRecover) {
  char tmpl[] = "/tmp/flame-kcache-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  bool skip = false;
  std::string why;
  double y = 0, x = 0;
  run_exp(dir, &skip, &why, &y, &x);
  if (skip) GTEST_SKIP() << "no GPU: " << why;
  ASSERT_TRUE(why.empty()) << why;
  EXPECT_NEAR(y, std::exp(x), 1e-5 * std::exp(x));
  auto first = entries(dir);
  ASSERT_FALSE(first.empty()) << "the first context wrote no cache entries to " << dir;

  run_exp(dir, &skip, &why, &y, &x);  // the same kernels: all from disk
  EXPECT_NEAR(y, std::exp(x), 1e-5 * std::exp(x));
  EXPECT_EQ(entries(dir), first) << "a warm context must not rewrite (recompile) any entry";

  for (auto& e : first) {  // corrupt every entry: the next context recompiles and replaces them
    std::ofstream f(dir + "/" + e.first, std::ios::binary | std::ios::trunc);
    f << "not a cubin";
  }
  run_exp(dir, &skip, &why, &y, &x);
  EXPECT_NEAR(y, std::exp(x), 1e-5 * std::exp(x));
  auto third = entries(dir);
  EXPECT_EQ(third.size(), first.size());
  for (auto& e : third) {
    struct stat st;
    stat((dir + "/" + e.first).c_str(), &st);
    EXPECT_GT(st.st_size, 100) << e.first << " was not rewritten";
  }
}

}  // namespace

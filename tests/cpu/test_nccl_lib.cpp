// The NCCL loader (src/dist/nccl_lib.cpp) without a GPU: ncclGetUniqueId needs only the network, and
// it starts NCCL's bootstrap-root thread, which outlives the call. Regression: the loader used to
// dlclose the library when its table went away, unmapping the code under that thread (SIGSEGV a
// moment later; every Dist test and example_train_mlp_dp died of it on the GPU machine).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <chrono>
#include <cstring>
#include <thread>
#include "core/error.h"
#include "dist/nccl_lib.h"

namespace {

bool nccl_present() {
  void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (!h) h = dlopen("libnccl.so.2", RTLD_LAZY | RTLD_LOCAL);
  if (!h) return false;
  dlclose(h);
  return true;
}

TEST(NcclLib, UniqueIdThreadsOutliveTheLoader) {
  if (!nccl_present()) GTEST_SKIP() << "libnccl.so.2 is not installed here";
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  {
    flame::Nccl lib;
    lib.load();
    EXPECT_GE(lib.version, 21400);
    ncclResult_t r = lib.ncclGetUniqueId(&id);
    if (r != ncclSuccess) GTEST_SKIP() << "ncclGetUniqueId: " << lib.describe(r) << " (no usable network interface?)";
  }  // the table is gone; NCCL's bootstrap root still runs, so the code must still be mapped
  void* still = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  EXPECT_NE(still, nullptr) << "libnccl.so.2 was unmapped under its own threads";
  if (still) dlclose(still);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  bool any = false;
  for (char c : id.internal) any = any || c != 0;
  EXPECT_TRUE(any) << "the id is all zero";
  // Reaching this line means the bootstrap thread ran on mapped code: the process is alive.
  flame::Nccl again;
  again.load();
  EXPECT_EQ(again.ncclGetUniqueId(&id), ncclSuccess);
}

TEST(NcclLib, MissingLibraryIsUnsupported) {
  setenv("FLAME_NCCL_PATH", "/nonexistent/libnccl.so.2", 1);
  flame::Nccl lib;
  try {
    lib.load();
    ADD_FAILURE() << "loading a missing NCCL succeeded";
  } catch (const flame::Error& e) {
    EXPECT_EQ(e.status(), FLAME_ERROR_UNSUPPORTED);
    EXPECT_NE(std::string(e.what()).find("NCCL is not available"), std::string::npos) << e.what();
  }
  unsetenv("FLAME_NCCL_PATH");
}

}  // namespace

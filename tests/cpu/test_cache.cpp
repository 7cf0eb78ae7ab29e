// The persistent kernel cache without a GPU: keys, atomic writes, corrupt and foreign entries.
#include <gtest/gtest.h>
#include <dirent.h>
#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include "runtime/disk_cache.h"
#include "runtime/hash.h"
#include "runtime/nvrtc_compiler.h"

using namespace flame;

namespace {

std::string temp_dir() {
  char tmpl[] = "/tmp/flame-cache-test-XXXXXX";
  char* d = mkdtemp(tmpl);
  EXPECT_NE(d, nullptr);
  return std::string(d) + "/nested/dir";  // the cache creates missing directories
}

int count_files(const std::string& dir, const char* contains) {
  int n = 0;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name).find(contains) != std::string::npos) ++n;
    closedir(d);
  }
  return n;
}

CacheEntry entry() {
  CacheEntry e;
  e.lowered_name = "_Z6kernelPf";
  e.image = {'\x7f', 'E', 'L', 'F', '\0', '\1', '\2', '\3'};
  return e;
}

TEST(KernelCache, StoreThenLoad) {
  DiskCache c(temp_dir());
  ASSERT_TRUE(c.store("key-1", entry()));
  CacheEntry got;
  ASSERT_TRUE(c.load("key-1", &got));
  EXPECT_EQ(got.lowered_name, entry().lowered_name);
  EXPECT_EQ(got.image, entry().image);
  EXPECT_FALSE(c.load("key-2", &got)) << "another key must miss";
  EXPECT_EQ(count_files(c.dir(), ".tmp."), 0) << "no temporary files are left behind";
}

TEST(KernelCache, KeysDependOnEverything) {
  EXPECT_NE(Hasher().add("a").add("bc").hex(), Hasher().add("ab").add("c").hex());
  EXPECT_EQ(Hasher().add("x").hex(), Hasher().add("x").hex());
  EXPECT_EQ(kernel_sources_digest().size(), 32u);
  bool ptx = false;
  auto o80 = nvrtc_options(80, &ptx), o90 = nvrtc_options(90, &ptx);
  EXPECT_NE(o80, o90);
  EXPECT_EQ(o90.at(0), "--gpu-architecture=sm_90a");  // the wgmma kernels need the arch-specific target
  EXPECT_EQ(o80.at(0), "--gpu-architecture=sm_80");
  EXPECT_NE(nvrtc_version_string().find("NVRTC"), std::string::npos);
}

TEST(KernelCache, CorruptEntryIsAMissAndRemoved) {
  DiskCache c(temp_dir());
  ASSERT_TRUE(c.store("k", entry()));
  std::string path = c.path_for("k");
  {  // flip bytes in the image
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-40, std::ios::end);
    f.write("garbage!", 8);
  }
  CacheEntry got;
  EXPECT_FALSE(c.load("k", &got));
  EXPECT_NE(access(path.c_str(), F_OK), 0) << "the corrupt file is removed";
  ASSERT_TRUE(c.store("k", entry()));
  EXPECT_TRUE(c.load("k", &got)) << "and rewritten by the next store";
}

TEST(KernelCache, TruncatedAndForeignFilesMiss) {
  DiskCache c(temp_dir());
  ASSERT_TRUE(c.store("k", entry()));
  std::string path = c.path_for("k");
  { std::ofstream f(path, std::ios::binary | std::ios::trunc); f << "FLAMEKC1"; }
  CacheEntry got;
  EXPECT_FALSE(c.load("k", &got));
  ASSERT_TRUE(c.store("k", entry()));
  // An entry stored under another key but placed at this key's path (a hash collision) misses.
  std::rename(path.c_str(), c.path_for("other").c_str());
  EXPECT_FALSE(c.load("other", &got));
}

TEST(KernelCache, DisabledAndUnwritable) {
  DiskCache off("");
  EXPECT_FALSE(off.enabled());
  EXPECT_FALSE(off.store("k", entry()));
  CacheEntry got;
  EXPECT_FALSE(off.load("k", &got));
  DiskCache bad("/proc/definitely/not/writable");
  EXPECT_FALSE(bad.store("k", entry())) << "an unwritable cache is not an error, just no cache";
}

TEST(KernelCache, DirectoryResolution) {
  EXPECT_EQ(DiskCache::resolve_dir("/explicit"), "/explicit");
  EXPECT_EQ(DiskCache::resolve_dir(""), "");
  setenv("FLAME_KERNEL_CACHE_DIR", "/from/env", 1);
  EXPECT_EQ(DiskCache::resolve_dir(nullptr), "/from/env");
  unsetenv("FLAME_KERNEL_CACHE_DIR");
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  EXPECT_EQ(DiskCache::resolve_dir(nullptr), "/xdg/flame/kernels");
}

}  // namespace

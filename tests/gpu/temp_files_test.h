// A GPU test fixture with a fresh temporary folder ($TMPDIR or /tmp) for the files a test writes:
// path(name) names a file in it, and the files named so and the folder are removed after the test.
#pragma once
#include <stdlib.h>
#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include "flame_test.h"

class TempFilesTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/flame_gpu_test_XXXXXX";
    ASSERT_NE(mkdtemp(&tmpl[0]), nullptr);
    dir = tmpl;
  }
  void TearDown() override {
    for (const std::string& f : files) std::remove(f.c_str());
    if (!dir.empty()) rmdir(dir.c_str());
    GpuTest::TearDown();
  }
  std::string path(const char* name) {
    files.push_back(dir + "/" + name);
    return files.back();
  }
  std::string dir;
  std::vector<std::string> files;
};

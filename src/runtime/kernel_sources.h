// The device sources of cuda/, embedded at build time by cmake/embed_kernels.cmake.
#pragma once
#include <string>
#include <vector>

namespace flame {

struct EmbeddedFile {
  const char* name;     // file name within cuda/, e.g. "elementwise.cuh"
  std::string content;
};

const std::vector<EmbeddedFile>& embedded_kernel_files();

}  // namespace flame

// NVRTC front end: compiles one cuda/ header plus a list of template instantiations (name
// expressions) for one architecture, straight to SASS (a cubin). Runs without a GPU, so CI uses it
// to check every kernel for sm_80 and sm_90.
#pragma once
#include <string>
#include <vector>

namespace flame {

struct CompiledModule {
  std::vector<char> image;                 // cubin, or PTX when ptx is true
  bool ptx = false;
  std::vector<std::string> lowered_names;  // mangled name per name expression, same order
};

// arch is the compute capability as 80, 90, ... Builds SASS when NVRTC knows the architecture and
// PTX for the newest one it knows otherwise (the driver then JIT-compiles it). Throws
// FLAME_ERROR_KERNEL_COMPILE with NVRTC's log on failure. `prelude` is source placed before the
// file's #include (generated code the file needs, e.g. the expression of cuda/fused.cuh).
CompiledModule nvrtc_compile(const std::string& file, const std::vector<std::string>& name_exprs, int arch,
                             const std::string& prelude = std::string());

// "NVRTC 13.0" style version, part of every cache key.
std::string nvrtc_version_string();
// The compile options used for arch, part of every cache key.
std::vector<std::string> nvrtc_options(int arch, bool* ptx);
// A hash of every embedded kernel file: any change to cuda/ changes every cache key.
const std::string& kernel_sources_digest();

}  // namespace flame

#include "runtime/nvrtc_compiler.h"
#include <nvrtc.h>
#include <algorithm>
#include <cstdio>
#include "core/error.h"
#include "runtime/hash.h"
#include "runtime/kernel_sources.h"

namespace flame {

static void check_nvrtc(nvrtcResult r, const char* what) {
  if (r != NVRTC_SUCCESS) fail(FLAME_ERROR_KERNEL_COMPILE, what, " failed: ", nvrtcGetErrorString(r));
}

std::string nvrtc_version_string() {
  int major = 0, minor = 0;
  nvrtcVersion(&major, &minor);
  return "NVRTC " + std::to_string(major) + "." + std::to_string(minor);
}

std::vector<std::string> nvrtc_options(int arch, bool* ptx) {
  int n = 0;
  nvrtcGetNumSupportedArchs(&n);
  std::vector<int> archs(static_cast<size_t>(n));
  if (n > 0) nvrtcGetSupportedArchs(archs.data());
  bool known = std::find(archs.begin(), archs.end(), arch) != archs.end();
  *ptx = !known;
  int target = arch;
  if (!known) {  // newer GPU than this NVRTC: emit PTX for the newest arch below it
    target = 0;
    for (int a : archs)
      if (a <= arch) target = std::max(target, a);
    if (target == 0) fail(FLAME_ERROR_UNSUPPORTED, "NVRTC cannot target compute capability ", arch / 10, ".", arch % 10);
  }
  // sm_90 compiles as sm_90a: its cubins run only on compute capability 9.0, and they may hold the
  // warpgroup instructions (wgmma) that exist only there.
  std::string gpu = std::string(known ? "--gpu-architecture=sm_" : "--gpu-architecture=compute_") + std::to_string(target) +
                    (known && target == 90 ? "a" : "");
  return {gpu, "-std=c++17", "--device-as-default-execution-space", "-DFLAME_NVRTC=1"};
}

const std::string& kernel_sources_digest() {
  static const std::string digest = [] {
    Hasher h;
    for (const auto& f : embedded_kernel_files()) {
      h.add(f.name);
      h.add(f.content);
    }
    return h.hex();
  }();
  return digest;
}

CompiledModule nvrtc_compile(const std::string& file, const std::vector<std::string>& name_exprs, int arch,
                             const std::string& prelude) {
  const auto& files = embedded_kernel_files();
  std::vector<const char*> header_src, header_names;
  for (const auto& f : files) {
    header_src.push_back(f.content.c_str());
    header_names.push_back(f.name);
  }
  std::string src = prelude + "#include \"" + file + "\"\n";
  nvrtcProgram prog = nullptr;
  check_nvrtc(nvrtcCreateProgram(&prog, src.c_str(), "flame_kernel.cu", static_cast<int>(files.size()),
                                 header_src.data(), header_names.data()),
              "nvrtcCreateProgram");
  struct ProgramGuard {
    nvrtcProgram* p;
    ~ProgramGuard() { nvrtcDestroyProgram(p); }
  } guard{&prog};
  for (const auto& e : name_exprs) check_nvrtc(nvrtcAddNameExpression(prog, e.c_str()), "nvrtcAddNameExpression");
  CompiledModule m;
  std::vector<std::string> opts = nvrtc_options(arch, &m.ptx);
  std::vector<const char*> opt_ptrs;
  for (const auto& o : opts) opt_ptrs.push_back(o.c_str());
  nvrtcResult r = nvrtcCompileProgram(prog, static_cast<int>(opt_ptrs.size()), opt_ptrs.data());
  if (r != NVRTC_SUCCESS) {
    size_t log_size = 0;
    nvrtcGetProgramLogSize(prog, &log_size);
    std::string log(log_size, '\0');
    if (log_size) nvrtcGetProgramLog(prog, &log[0]);
    std::string first = name_exprs.empty() ? std::string() : name_exprs[0];
    fail(FLAME_ERROR_KERNEL_COMPILE, "NVRTC could not compile ", file, " (", first,
         name_exprs.size() > 1 ? " and others" : "", ") for sm_", arch, ": ", log);
  }
  size_t size = 0;
  if (m.ptx) {
    check_nvrtc(nvrtcGetPTXSize(prog, &size), "nvrtcGetPTXSize");
    m.image.resize(size);
    check_nvrtc(nvrtcGetPTX(prog, m.image.data()), "nvrtcGetPTX");
  } else {
    check_nvrtc(nvrtcGetCUBINSize(prog, &size), "nvrtcGetCUBINSize");
    m.image.resize(size);
    check_nvrtc(nvrtcGetCUBIN(prog, m.image.data()), "nvrtcGetCUBIN");
  }
  for (const auto& e : name_exprs) {
    const char* lowered = nullptr;
    check_nvrtc(nvrtcGetLoweredName(prog, e.c_str(), &lowered), "nvrtcGetLoweredName");
    m.lowered_names.emplace_back(lowered);
  }
  return m;
}

}  // namespace flame

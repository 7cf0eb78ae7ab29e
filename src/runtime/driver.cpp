#include "runtime/driver.h"
#include <dlfcn.h>
#include <cstdlib>
#include "core/error.h"

namespace flame {

#define FLAME_STR2(x) #x
#define FLAME_STR(x) FLAME_STR2(x)  // expands cuda.h's renaming macros before stringising

Driver::~Driver() {
  if (handle) dlclose(handle);
}

void Driver::load() {
  const char* override_path = std::getenv("FLAME_CUDA_DRIVER_PATH");
  const char* path = override_path && *override_path ? override_path : "libcuda.so.1";
  handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    fail(FLAME_ERROR_NO_DRIVER, "cannot load the CUDA driver ", path, ": ", why ? why : "unknown reason",
         " (is an NVIDIA driver installed?)");
  }
#define FLAME_LOAD_FN(name)                                                              \
  name = reinterpret_cast<decltype(name)>(dlsym(handle, FLAME_STR(name)));               \
  if (!name) fail(FLAME_ERROR_NO_DRIVER, "the CUDA driver lacks ", FLAME_STR(name),      \
                  "; FLAME needs a driver for CUDA 12 or newer");
  FLAME_DRIVER_FUNCTIONS(FLAME_LOAD_FN)
#undef FLAME_LOAD_FN
#define FLAME_LOAD_COUNTED_FN(name, field)                                                   \
  name.fn = reinterpret_cast<decltype(name.fn)>(dlsym(handle, FLAME_STR(name)));             \
  if (!name.fn) fail(FLAME_ERROR_NO_DRIVER, "the CUDA driver lacks ", FLAME_STR(name),       \
                     "; FLAME needs a driver for CUDA 12 or newer");
  FLAME_COUNTED_DRIVER_FUNCTIONS(FLAME_LOAD_COUNTED_FN)
#undef FLAME_LOAD_COUNTED_FN
  CUresult r = cuInit(0);
  if (r == CUDA_ERROR_NO_DEVICE) fail(FLAME_ERROR_NO_DEVICE, "the CUDA driver found no GPU");
  if (r != CUDA_SUCCESS) fail(FLAME_ERROR_NO_DRIVER, "cuInit failed: ", describe(r));
}

std::string Driver::describe(CUresult r) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (cuGetErrorName) cuGetErrorName(r, &name);
  if (cuGetErrorString) cuGetErrorString(r, &text);
  std::string s = name ? name : ("CUresult " + std::to_string(static_cast<int>(r)));
  if (text) s += std::string(" (") + text + ")";
  return s;
}

}  // namespace flame

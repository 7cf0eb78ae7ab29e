#include "dist/nccl_lib.h"
#include <dlfcn.h>
#include <cstdlib>
#include "core/error.h"

namespace flame {

Nccl::~Nccl() {
  if (handle) dlclose(handle);
}

void Nccl::load() {
  const char* override_path = std::getenv("FLAME_NCCL_PATH");
  const char* path = override_path && *override_path ? override_path : "libnccl.so.2";
  // RTLD_NODELETE: NCCL keeps threads of its own past the calls that start them (ncclGetUniqueId
  // starts the bootstrap root, which waits for the ranks to join), so the library must never be
  // unmapped while the process lives; dlclose then only drops the reference.
  handle = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!handle) {
    const char* why = dlerror();
    fail(FLAME_ERROR_UNSUPPORTED, "NCCL is not available: cannot load ", path, ": ", why ? why : "unknown reason",
         " (install NCCL 2.14 or newer, e.g. the nvidia-nccl-cu12 package or libnccl2, or set FLAME_NCCL_PATH)");
  }
#define FLAME_NCCL_LOAD(name)                                                                  \
  name = reinterpret_cast<decltype(name)>(dlsym(handle, #name));                               \
  if (!name) fail(FLAME_ERROR_UNSUPPORTED, "the NCCL library ", path, " lacks ", #name,        \
                  "; FLAME needs NCCL 2.14 or newer");
  FLAME_NCCL_FUNCTIONS(FLAME_NCCL_LOAD)
#undef FLAME_NCCL_LOAD
  ncclResult_t r = ncclGetVersion(&version);
  if (r != ncclSuccess) fail(FLAME_ERROR_UNSUPPORTED, "ncclGetVersion failed: ", describe(r));
  FLAME_CHECK(version >= 21400, FLAME_ERROR_UNSUPPORTED, "NCCL ", version, " at ", path,
              " is too old; FLAME needs 2.14 or newer (non-blocking communicators)");
}

std::string Nccl::describe(ncclResult_t r, ncclComm_t comm) const {
  std::string s = ncclGetErrorString ? ncclGetErrorString(r) : ("ncclResult_t " + std::to_string(static_cast<int>(r)));
  const char* last = ncclGetLastError ? ncclGetLastError(comm) : nullptr;
  if (last && *last) s += std::string(": ") + last;
  return s;
}

}  // namespace flame

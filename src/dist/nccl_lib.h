// NCCL, loaded at run time with dlopen("libnccl.so.2") (or $FLAME_NCCL_PATH) so that libflame has no
// link-time dependency on it and loads on machines without it. nccl.h is used for types and
// prototypes only (decltype). One table per communicator: no process-wide state; dlopen
// reference-counts the library and RTLD_NODELETE keeps it mapped, because NCCL's threads outlive
// the calls that start them. Without the library (or with one older than 2.14, which
// lacks non-blocking communicators) load() throws FLAME_ERROR_UNSUPPORTED.
#pragma once
#include <nccl.h>
#include <string>

namespace flame {

#define FLAME_NCCL_FUNCTIONS(X)                                                                  \
  X(ncclGetVersion) X(ncclGetUniqueId) X(ncclCommInitRankConfig) X(ncclCommFinalize)             \
  X(ncclCommDestroy) X(ncclCommAbort) X(ncclGetErrorString) X(ncclGetLastError)                  \
  X(ncclCommGetAsyncError) X(ncclCommCount) X(ncclCommUserRank) X(ncclAllReduce) X(ncclBroadcast) \
  X(ncclAllGather) X(ncclReduceScatter) X(ncclGroupStart) X(ncclGroupEnd)

struct Nccl {
#define FLAME_NCCL_DECLARE(name) decltype(&::name) name = nullptr;
  FLAME_NCCL_FUNCTIONS(FLAME_NCCL_DECLARE)
#undef FLAME_NCCL_DECLARE
  void* handle = nullptr;
  int version = 0;  // NCCL_VERSION_CODE of the loaded library

  Nccl() = default;
  Nccl(const Nccl&) = delete;
  Nccl& operator=(const Nccl&) = delete;
  ~Nccl();

  void load();
  // "ncclSystemError (unhandled system error): <last error text>" for a result code.
  std::string describe(ncclResult_t r, ncclComm_t comm = nullptr) const;
};

}  // namespace flame

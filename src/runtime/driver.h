// The CUDA driver API, loaded at run time with dlopen("libcuda.so.1") so that libflame loads on
// machines without a GPU. One table per context (no process-wide state); dlopen reference-counts
// the library itself. Names come from cuda.h's macros, so versioned entry points (cuMemcpyHtoD_v2
// and friends) resolve to the ABI that the header describes.
#pragma once
#include <cuda.h>
#include <string>

namespace flame {

#define FLAME_DRIVER_FUNCTIONS(X) \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString) \
  X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName) X(cuDeviceGetAttribute) \
  X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuCtxSetCurrent) X(cuCtxGetCurrent) \
  X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize) X(cuStreamQuery) X(cuStreamWaitEvent) \
  X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventSynchronize) X(cuEventElapsedTime) \
  X(cuMemPoolCreate) X(cuMemPoolDestroy) X(cuMemPoolSetAttribute) X(cuMemPoolGetAttribute) \
  X(cuMemPoolTrimTo) X(cuMemAllocFromPoolAsync) X(cuMemFreeAsync) X(cuMemGetInfo) \
  X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync) X(cuMemcpyDtoDAsync) X(cuMemsetD8Async) \
  X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction) X(cuLaunchKernel) \
  X(cuFuncSetAttribute) X(cuPointerGetAttribute) \
  X(cuMemsetD32Async) X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuStreamIsCapturing) \
  X(cuThreadExchangeStreamCaptureMode) X(cuGraphInstantiateWithFlags) X(cuGraphLaunch) \
  X(cuGraphExecDestroy) X(cuGraphDestroy) \
  X(cuTensorMapEncodeTiled) X(cuMemHostAlloc) X(cuMemFreeHost) X(cuMemHostGetDevicePointer)

struct Driver {
#define FLAME_DECLARE_FN(name) decltype(&::name) name = nullptr;
  FLAME_DRIVER_FUNCTIONS(FLAME_DECLARE_FN)
#undef FLAME_DECLARE_FN
  void* handle = nullptr;

  Driver() = default;
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;
  ~Driver();

  // Loads libcuda.so.1 (or $FLAME_CUDA_DRIVER_PATH) and calls cuInit. Throws
  // FLAME_ERROR_NO_DRIVER with the loader's reason when that fails.
  void load();
  // "CUDA_ERROR_OUT_OF_MEMORY (out of memory)" for an error code.
  std::string describe(CUresult r) const;
};

}  // namespace flame

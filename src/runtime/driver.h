// The CUDA driver API, loaded at run time with dlopen("libcuda.so.1") so that libflame loads on
// machines without a GPU. One table per context (no process-wide state); dlopen reference-counts
// the library itself. Names come from cuda.h's macros, so versioned entry points (cuMemcpyHtoD_v2
// and friends) resolve to the ABI that the header describes.
//
// The entry points that issue device work, wait for the device or take memory from the driver go
// through CountedDriverFn, which bumps one of the table's DeviceWorkCounters before the call: every
// call site counts without knowing it (flame_ctx_counters reads them). Libraries FLAME drives
// directly (cuBLASLt, cuDNN, NCCL) bump the counters at their call sites.
#pragma once
#include <cuda.h>
#include <cstdint>
#include <string>

namespace flame {

#define FLAME_DRIVER_FUNCTIONS(X) \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString) \
  X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName) X(cuDeviceGetAttribute) \
  X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuCtxSetCurrent) X(cuCtxGetCurrent) \
  X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamQuery) X(cuStreamWaitEvent) \
  X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventElapsedTime) \
  X(cuMemPoolCreate) X(cuMemPoolDestroy) X(cuMemPoolSetAttribute) X(cuMemPoolGetAttribute) \
  X(cuMemPoolTrimTo) X(cuMemFreeAsync) X(cuMemGetInfo) \
  X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction) \
  X(cuFuncSetAttribute) X(cuPointerGetAttribute) \
  X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuStreamIsCapturing) \
  X(cuThreadExchangeStreamCaptureMode) X(cuGraphInstantiateWithFlags) \
  X(cuGraphExecDestroy) X(cuGraphDestroy) \
  X(cuTensorMapEncodeTiled) X(cuMemHostAlloc) X(cuMemFreeHost) X(cuMemHostGetDevicePointer)

// The counted entry points, each with the DeviceWorkCounters field its calls bump.
#define FLAME_COUNTED_DRIVER_FUNCTIONS(X) \
  X(cuLaunchKernel, launches) X(cuGraphLaunch, launches) \
  X(cuMemcpyHtoDAsync, launches) X(cuMemcpyDtoHAsync, launches) X(cuMemcpyDtoDAsync, launches) \
  X(cuMemsetD8Async, launches) X(cuMemsetD32Async, launches) \
  X(cuStreamSynchronize, host_syncs) X(cuEventSynchronize, host_syncs) \
  X(cuMemAllocFromPoolAsync, driver_allocations)

// What a context has issued from the host since creation or the last flame_ctx_reset_counters.
// Plain integers: every call on a context is serialised by its mutex.
struct DeviceWorkCounters {
  uint64_t launches = 0;            // kernels, GEMMs, cuDNN executions, memsets, copies, graph launches
  uint64_t cast_kernels = 0;        // the launches of dtype conversions (ops::to_dtype)
  uint64_t host_syncs = 0;          // waits of the host for the device
  uint64_t driver_allocations = 0;  // cuMemAllocFromPoolAsync calls (FLAME's free-list hits are not)
};

// A driver entry point that adds one to a counter before each call.
template <typename Fn>
struct CountedDriverFn;
template <typename R, typename... Args>
struct CountedDriverFn<R(CUDAAPI*)(Args...)> {
  R(CUDAAPI* fn)(Args...) = nullptr;
  uint64_t* counter;
  R operator()(Args... args) const {
    ++*counter;
    return fn(args...);
  }
};

struct Driver {
  DeviceWorkCounters counters;
#define FLAME_DECLARE_FN(name) decltype(&::name) name = nullptr;
  FLAME_DRIVER_FUNCTIONS(FLAME_DECLARE_FN)
#undef FLAME_DECLARE_FN
#define FLAME_DECLARE_COUNTED_FN(name, field) CountedDriverFn<decltype(&::name)> name{nullptr, &counters.field};
  FLAME_COUNTED_DRIVER_FUNCTIONS(FLAME_DECLARE_COUNTED_FN)
#undef FLAME_DECLARE_COUNTED_FN
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

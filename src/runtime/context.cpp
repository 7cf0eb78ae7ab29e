#include "runtime/context.h"
#include "runtime/blas.h"
#include "runtime/cudnn.h"
#include "runtime/capture.h"
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include "core/error.h"
#include "runtime/nvrtc_compiler.h"
#include "runtime/hash.h"

#include <cstddef>

// Context::DeviceErrorRecord mirrors cuda/device_error.cuh's DeviceErrorRecord byte for byte.
static_assert(sizeof(flame::Context::DeviceErrorRecord) == 32, "DeviceErrorRecord: 32 bytes, as the device writes it");
static_assert(offsetof(flame::Context::DeviceErrorRecord, code) == 0 && offsetof(flame::Context::DeviceErrorRecord, source) == 4 &&
                  offsetof(flame::Context::DeviceErrorRecord, value) == 8 &&
                  offsetof(flame::Context::DeviceErrorRecord, position) == 16 &&
                  offsetof(flame::Context::DeviceErrorRecord, limit) == 24,
              "DeviceErrorRecord: the device's field offsets");
namespace flame {

CUdeviceptr capture_allocate(Context& ctx, size_t bytes);  // runtime/capture.cpp
void capture_deallocate(Context& ctx, CUdeviceptr p) noexcept;

std::shared_ptr<Context> Context::create(const flame_ctx_options_t& opts) {
  std::shared_ptr<Context> c(new Context());
  c->log = Logger::from_options(nullptr, nullptr, FLAME_LOG_DEFAULT, std::getenv("FLAME_LOG"));  // flame_ctx_set_log changes it
  c->drv.load();
  int count = 0;
  c->check(c->drv.cuDeviceGetCount(&count), "cuDeviceGetCount");
  FLAME_CHECK(count > 0, FLAME_ERROR_NO_DEVICE, "the CUDA driver found no GPU");
  FLAME_CHECK(opts.device >= 0 && opts.device < count, FLAME_ERROR_NO_DEVICE, "device ", opts.device,
              " does not exist (", count, " device(s) present)");
  c->ordinal = opts.device;
  c->check(c->drv.cuDeviceGet(&c->device, opts.device), "cuDeviceGet");
  char name[256] = {0};
  c->check(c->drv.cuDeviceGetName(name, sizeof name - 1, c->device), "cuDeviceGetName");
  c->device_name = name;
  c->check(c->drv.cuDeviceGetAttribute(&c->cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, c->device), "cuDeviceGetAttribute");
  c->check(c->drv.cuDeviceGetAttribute(&c->cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, c->device), "cuDeviceGetAttribute");
  c->check(c->drv.cuDeviceGetAttribute(&c->sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, c->device), "cuDeviceGetAttribute");
  FLAME_CHECK(c->cc_major >= 7, FLAME_ERROR_UNSUPPORTED, "device ", name, " has compute capability ", c->cc_major,
              ".", c->cc_minor, "; FLAME needs 7.0 or newer");
  c->check(c->drv.cuDevicePrimaryCtxRetain(&c->cu, c->device), "cuDevicePrimaryCtxRetain");
  c->bind();
  c->check(c->drv.cuStreamCreate(&c->stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  CUmemPoolProps props;
  std::memset(&props, 0, sizeof props);
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = c->device;
  c->check(c->drv.cuMemPoolCreate(&c->pool, &props), "cuMemPoolCreate");
  cuuint64_t threshold = ~0ull;  // keep freed memory in the pool: threshold 0 returns it at every sync
  c->check(c->drv.cuMemPoolSetAttribute(c->pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold), "cuMemPoolSetAttribute");
  c->memory_limit = opts.memory_limit;
  c->rng_seed = opts.seed;
  c->allow_tf32 = opts.allow_tf32 != 0;
  c->gemm_autotune = opts.gemm_heuristic_only == 0;
  c->disk_cache = DiskCache(DiskCache::resolve_dir(opts.kernel_cache_dir));
  if (const char* n = std::getenv("FLAME_FAIL_ALLOC_AT")) c->fail_alloc_at = std::strtoull(n, nullptr, 10);
  const char* no_cudnn = std::getenv("FLAME_DISABLE_CUDNN");
  c->cudnn_enabled = !(no_cudnn && std::strcmp(no_cudnn, "1") == 0);
  const char* no_wgmma = std::getenv("FLAME_DISABLE_WGMMA");
  c->wgmma_enabled = c->cc_major == 9 && c->cc_minor == 0 && !(no_wgmma && std::strcmp(no_wgmma, "1") == 0);
  return c;
}

Context::~Context() {
  if (cu) {
    drv.cuCtxSetCurrent(cu);
    abort_capture();
    blas.reset();  // frees its workspace into the pool, so before the pool goes
    cudnn.reset();  // its handle and descriptors, while the CUDA context is current
    if (device_error_) drv.cuMemFreeAsync(device_error_, stream);
    if (reduce_counters_) drv.cuMemFreeAsync(reduce_counters_, stream);
    release_small_blocks();
    if (stream) drv.cuStreamSynchronize(stream);
    for (CUmodule m : modules_) drv.cuModuleUnload(m);
    if (pool) drv.cuMemPoolDestroy(pool);
    if (stream) drv.cuStreamDestroy(stream);
    if (side_stream) drv.cuStreamDestroy(side_stream);
    for (CUevent e : side_events)
      if (e) drv.cuEventDestroy(e);
    drv.cuDevicePrimaryCtxRelease(device);
  }
}

void Context::bind() {
  CUcontext cur = nullptr;
  if (drv.cuCtxGetCurrent(&cur) != CUDA_SUCCESS || cur != cu) drv.cuCtxSetCurrent(cu);
}

static bool is_sticky(CUresult r) {
  switch (r) {
    case CUDA_ERROR_ILLEGAL_ADDRESS: case CUDA_ERROR_LAUNCH_FAILED: case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS: case CUDA_ERROR_INVALID_ADDRESS_SPACE: case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_HARDWARE_STACK_ERROR: case CUDA_ERROR_ASSERT: case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ECC_UNCORRECTABLE: case CUDA_ERROR_CONTEXT_IS_DESTROYED:
      return true;
    default:
      return false;
  }
}

void Context::check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  std::string msg = std::string(what) + " failed: " + drv.describe(r);
  if (is_sticky(r)) {
    if (sticky_error_.empty()) sticky_error_ = msg;
    fail(FLAME_ERROR_CONTEXT_FAILED, "device fault, the context is no longer usable: ", msg);
  }
  if (r == CUDA_ERROR_OUT_OF_MEMORY) fail(FLAME_ERROR_OUT_OF_MEMORY, msg);
  fail(FLAME_ERROR_CUDA, msg);
}

void Context::check_alive() const {
  if (!sticky_error_.empty())
    fail(FLAME_ERROR_CONTEXT_FAILED, "an earlier device fault made this context unusable: ", sticky_error_);
}

void Context::synchronize() {
  forbid_in_capture("waiting for the device (a copy to the host, flame_ctx_synchronize)");
  check(drv.cuStreamSynchronize(stream), "cuStreamSynchronize");
  if (device_error_armed_) check_device_error();
}

namespace {
constexpr size_t kSmallMin = 512;
// The power-of-two class of a small block (512 B .. 1 MiB), or -1.
int small_class(size_t bytes) {
  if (bytes > kSmallMin << (Context::kSmallClasses - 1)) return -1;
  int c = 0;
  while ((kSmallMin << c) < bytes) ++c;
  return c;
}
}  // namespace

CUdeviceptr Context::allocate(size_t bytes) {
  if (bytes == 0) return 0;
  ++alloc_count;
  if (fail_alloc_at && alloc_count == fail_alloc_at)
    fail(FLAME_ERROR_OUT_OF_MEMORY, "allocation of ", bytes, " bytes failed (fault injected by FLAME_FAIL_ALLOC_AT)");
  if (memory_limit && bytes_in_use + bytes > memory_limit) fail_out_of_memory(bytes, OomCause::MemoryLimit);
  CUdeviceptr p = 0;
  if (capture) {  // from the capture's private pool (runtime/capture.cpp)
    p = capture_allocate(*this, bytes);
    bytes_in_use += bytes;
    if (bytes_in_use > peak_bytes) peak_bytes = bytes_in_use;
    return p;
  }
  const int cls = small_class(bytes);
  if (cls >= 0 && !small_free_[cls].empty()) {
    p = small_free_[cls].back();
    small_live_.emplace(p, cls);  // first: if it throws, the block stays on the list
    small_free_[cls].pop_back();
    bytes_in_use += bytes;
    if (bytes_in_use > peak_bytes) peak_bytes = bytes_in_use;
    return p;
  }
  const size_t size = cls >= 0 ? kSmallMin << cls : bytes;
  CUresult r = drv.cuMemAllocFromPoolAsync(&p, size, pool, stream);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {  // give cached blocks back to the device and try once more
    release_small_blocks();
    drv.cuStreamSynchronize(stream);
    drv.cuMemPoolTrimTo(pool, 0);
    r = drv.cuMemAllocFromPoolAsync(&p, size, pool, stream);
  }
  if (r == CUDA_ERROR_OUT_OF_MEMORY) fail_out_of_memory(bytes, OomCause::Device);
  check(r, "cuMemAllocFromPoolAsync");
  if (cls >= 0) {
    try {
      small_live_.emplace(p, cls);
    } catch (...) {  // unrecorded, the block is freed to the pool later instead of reused
    }
  }
  bytes_in_use += bytes;
  if (bytes_in_use > peak_bytes) peak_bytes = bytes_in_use;
  return p;
}

void Context::deallocate(CUdeviceptr p, size_t bytes) noexcept {
  if (!p) return;
  std::lock_guard<std::recursive_mutex> lock(mutex);
  bind();
  bytes_in_use -= bytes;
  auto live = small_live_.find(p);
  int cls = -1;
  if (live != small_live_.end()) {
    cls = live->second;
    small_live_.erase(live);
  }
  if (capture || !graph_held.empty()) return capture_deallocate(*this, p);  // runtime/capture.cpp
  if (cls >= 0 && small_free_[cls].size() < kSmallFreeMax) {
    try {
      small_free_[cls].push_back(p);
      return;
    } catch (...) {  // no host memory for the list: free it instead
    }
  }
  drv.cuMemFreeAsync(p, stream);
}

void Context::release_small_blocks() noexcept {
  for (auto& list : small_free_) {
    for (CUdeviceptr p : list) drv.cuMemFreeAsync(p, stream);
    list.clear();
  }
}

namespace {
// "1.50 GiB" / "12.0 MiB" / "512 B" into buf (no allocation).
void format_size(char* buf, size_t n, uint64_t bytes) {
  const double v = static_cast<double>(bytes);
  if (bytes >= (uint64_t(1) << 30)) std::snprintf(buf, n, "%.2f GiB", v / double(uint64_t(1) << 30));
  else if (bytes >= (uint64_t(1) << 20)) std::snprintf(buf, n, "%.1f MiB", v / double(uint64_t(1) << 20));
  else if (bytes >= 1024) std::snprintf(buf, n, "%.1f KiB", v / 1024.0);
  else std::snprintf(buf, n, "%llu B", static_cast<unsigned long long>(bytes));
}
}  // namespace

size_t Context::describe_pool_state(char* buf, size_t n) noexcept {
  // Driver queries only: nothing here allocates, so the description cannot fail in turn.
  size_t dev_free = 0, dev_total = 0;
  const bool have_device = drv.cuMemGetInfo && drv.cuMemGetInfo(&dev_free, &dev_total) == CUDA_SUCCESS;
  cuuint64_t reserved = 0, pool_used = 0;
  const bool have_pool = pool && drv.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) == CUDA_SUCCESS &&
                         drv.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &pool_used) == CUDA_SUCCESS;
  uint64_t small_cached = 0, largest_small = 0;
  for (int c = 0; c < kSmallClasses; ++c) {
    const uint64_t block = uint64_t(kSmallMin) << c;
    small_cached += block * small_free_[c].size();
    if (!small_free_[c].empty()) largest_small = block;
  }
  char in_use[32], peak[32], total[32], free_b[32], res[32], cached[32], small[32], largest[32];
  format_size(in_use, sizeof in_use, bytes_in_use);
  format_size(peak, sizeof peak, peak_bytes);
  format_size(total, sizeof total, dev_total);
  format_size(free_b, sizeof free_b, dev_free);
  format_size(res, sizeof res, reserved);
  format_size(cached, sizeof cached, reserved > pool_used ? reserved - pool_used : 0);
  format_size(small, sizeof small, small_cached);
  format_size(largest, sizeof largest, largest_small);
  int w = std::snprintf(buf, n, "pool: %s in use by tensors and workspaces (%llu live tensors), peak %s", in_use,
                        static_cast<unsigned long long>(live_tensors), peak);
  if (w < 0 || static_cast<size_t>(w) >= n) return n ? std::strlen(buf) : 0;
  size_t used = static_cast<size_t>(w);
  if (have_pool) {
    w = std::snprintf(buf + used, n - used,
                      "; reserved from the device %s, of it cached and free %s (the driver pool does not report its"
                      " free blocks' sizes; the largest free block is at most that); small-block lists %s, largest %s",
                      res, cached, small, largest);
    if (w > 0) used = std::min(n - 1, used + static_cast<size_t>(w));
  }
  if (have_device) {
    w = std::snprintf(buf + used, n - used, "; device %s total, %s free", total, free_b);
    if (w > 0) used = std::min(n - 1, used + static_cast<size_t>(w));
  }
  return used;
}

void Context::fail_out_of_memory(uint64_t bytes, OomCause cause) {
  char request[32], limit[32], state[768];
  format_size(request, sizeof request, bytes);
  format_size(limit, sizeof limit, memory_limit);
  describe_pool_state(state, sizeof state);
  char msg[1024];
  switch (cause) {
    case OomCause::MemoryLimit:
      std::snprintf(msg, sizeof msg, "allocating %s (%llu bytes) would exceed the context's memory limit of %s (%llu bytes); %s",
                    request, static_cast<unsigned long long>(bytes), limit, static_cast<unsigned long long>(memory_limit), state);
      break;
    case OomCause::Device:
      std::snprintf(msg, sizeof msg,
                    "out of device memory allocating %s (%llu bytes), after returning the pool's cached blocks to the"
                    " device; %s",
                    request, static_cast<unsigned long long>(bytes), state);
      break;
    case OomCause::Capture:
      std::snprintf(msg, sizeof msg, "out of device memory allocating %s (%llu bytes) during a graph capture; %s", request,
                    static_cast<unsigned long long>(bytes), state);
      break;
  }
  fail(FLAME_ERROR_OUT_OF_MEMORY, static_cast<const char*>(msg));
}

uint64_t Context::bytes_reserved() {
  cuuint64_t v = 0;
  check(drv.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v), "cuMemPoolGetAttribute");
  return v;
}

CUfunction Context::function_miss(const KernelKey& key) {
  CUfunction f = function_by_name(key.tmpl->file, kernel_name(key));
  KernelKey kept = key;
  if (!key.text.empty()) kept.text = *key_texts_.emplace(key.text).first;  // the caller's text may not outlive the call
  keyed_functions_.emplace(kept, f);
  return f;
}

CUfunction Context::function_by_name(const std::string& file, const std::string& name_expr, const std::string& prelude) {
  std::string mem_key = prelude + file + '\n' + name_expr;
  auto it = functions_.find(mem_key);
  if (it != functions_.end()) {
    ++kernel_stats.memory_hits;
    return it->second;
  }
  int arch = cc_major * 10 + cc_minor;
  bool ptx = false;
  std::string key = kernel_sources_digest() + '\n' + prelude + file + '\n' + name_expr + '\n' + nvrtc_version_string() +
                    '\n' + std::to_string(arch);
  for (const auto& o : nvrtc_options(arch, &ptx)) key += '\n' + o;
  CacheEntry entry;
  bool from_disk = disk_cache.load(key, &entry);
  if (from_disk) {
    ++kernel_stats.disk_hits;
  } else {
    CompiledModule m = compile_logged(file, name_expr, arch, prelude);
    entry.image = std::move(m.image);
    entry.ptx = m.ptx;
    entry.lowered_name = m.lowered_names.at(0);
    if (entry.ptx) entry.image.push_back('\0');
    ++kernel_stats.compiled;
  }
  CUmodule mod = nullptr;
  RelaxedCaptureMode relaxed(*this);  // loading a module during a capture is set-up, not graph work
  CUresult r = drv.cuModuleLoadData(&mod, entry.image.data());
  if (r != CUDA_SUCCESS && from_disk) {  // a stale entry the driver rejects: rebuild it
    CompiledModule m = compile_logged(file, name_expr, arch, prelude);
    entry.image = std::move(m.image);
    entry.ptx = m.ptx;
    entry.lowered_name = m.lowered_names.at(0);
    if (entry.ptx) entry.image.push_back('\0');
    from_disk = false;
    r = drv.cuModuleLoadData(&mod, entry.image.data());
  }
  check(r, "cuModuleLoadData");
  modules_.push_back(mod);
  if (!from_disk && !disk_cache.store(key, entry) && disk_cache.enabled() && !cache_write_warned_) {
    cache_write_warned_ = true;
    log.write(FLAME_LOG_WARNING, "cannot write the kernel cache in " + disk_cache.dir() +
                                     ": kernels compiled now will be compiled again by the next process"
                                     " (set FLAME_KERNEL_CACHE_DIR to a writable directory)");
  }
  CUfunction f = nullptr;
  check(drv.cuModuleGetFunction(&f, mod, entry.lowered_name.c_str()), "cuModuleGetFunction");
  functions_.emplace(mem_key, f);
  return f;
}

CompiledModule Context::compile_logged(const std::string& file, const std::string& name_expr, int arch,
                                       const std::string& prelude) {
  const std::string sm = "sm_" + std::to_string(arch);
  if (nvrtc_compiles_ == 0) {
    log.write(FLAME_LOG_INFO, "compiling kernels for " + sm + " on first use, which can take minutes (" +
                                  (disk_cache.enabled() ? "cached in " + disk_cache.dir() + ": later runs skip this"
                                                        : std::string("the kernel cache is disabled: every run compiles them")) +
                                  ")");
  }
  ++nvrtc_compiles_;
  const auto start = std::chrono::steady_clock::now();
  CompiledModule m = nvrtc_compile(file, {name_expr}, arch, prelude);
  if (log.enabled(FLAME_LOG_DEBUG)) {
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    char took[32];
    std::snprintf(took, sizeof took, "%.0f ms", ms);
    log.write(FLAME_LOG_DEBUG, "compiled kernel " + std::to_string(nvrtc_compiles_) + " of this context for " +
                                   sm + " in " + took + ": " + name_expr + " (" + file + ")");
  }
  return m;
}

void Context::launch(CUfunction f, unsigned grid, unsigned block, void** args, unsigned smem) {
  check(drv.cuLaunchKernel(f, grid, 1, 1, block, 1, 1, smem, stream, args, nullptr), "cuLaunchKernel");
}

}  // namespace flame

// ---- errors found by kernels (cuda/device_error.cuh) ----
namespace flame {

CUdeviceptr Context::device_error_record(const std::string& what, uint32_t* source) {
  if (!device_error_) {  // straight from the pool, outside the memory statistics of tensors
    CUdeviceptr p = 0;
    RelaxedCaptureMode relaxed(*this);  // while capturing: set-up on the side stream, not a graph node
    check(drv.cuMemAllocFromPoolAsync(&p, sizeof(DeviceErrorRecord), pool, init_stream()), "cuMemAllocFromPoolAsync");
    device_error_ = p;
    check(drv.cuMemsetD8Async(device_error_, 0, sizeof(DeviceErrorRecord), init_stream()), "cuMemsetD8Async");
  }
  if (capture) capture->arms_device_error = true;
  size_t i = 0;
  while (i < device_error_sources_.size() && device_error_sources_[i] != what) ++i;
  if (i == device_error_sources_.size()) device_error_sources_.push_back(what);
  *source = static_cast<uint32_t>(i + 1);
  device_error_armed_ = true;
  return device_error_;
}

CUdeviceptr Context::reduce_counters(size_t n) {
  FLAME_CHECK(n <= kMaxReduceCounters, FLAME_ERROR_INVALID_ARGUMENT, "internal: ", n, " reduction counters requested, at most ",
              kMaxReduceCounters);
  if (!reduce_counters_) {  // straight from the pool, outside the memory statistics of tensors
    CUdeviceptr p = 0;
    RelaxedCaptureMode relaxed(*this);  // while capturing: set-up on the side stream, not a graph node
    check(drv.cuMemAllocFromPoolAsync(&p, kMaxReduceCounters * 4, pool, init_stream()), "cuMemAllocFromPoolAsync");
    reduce_counters_ = p;
    check(drv.cuMemsetD32Async(reduce_counters_, 0, kMaxReduceCounters, init_stream()), "cuMemsetD32Async");
  }
  return reduce_counters_;
}

void Context::check_device_error() {
  DeviceErrorRecord rec{};
  check(drv.cuMemcpyDtoHAsync(&rec, device_error_, sizeof rec, stream), "cuMemcpyDtoHAsync");
  check(drv.cuStreamSynchronize(stream), "cuStreamSynchronize");
  device_error_armed_ = false;
  if (rec.code == 0) return;
  check(drv.cuMemsetD8Async(device_error_, 0, sizeof rec, stream), "cuMemsetD8Async");  // reported once
  std::string what = rec.source >= 1 && rec.source <= device_error_sources_.size()
                         ? device_error_sources_[rec.source - 1] : std::string("a kernel");
  fail(FLAME_ERROR_INVALID_ARGUMENT, what, " ", rec.value, " at position ", rec.position,
       " is out of range [0, ", rec.limit, ") (found on the device by an earlier call, reported at this synchronisation; "
       "results computed from it are NaN)");
}

}  // namespace flame

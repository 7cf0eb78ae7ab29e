// A FLAME context: one GPU (its primary CUDA context), one stream, one stream-ordered memory pool,
// the kernel cache, the Philox generator state and the autograd mode. Everything FLAME keeps
// lives here; there is no process-wide mutable state. Tensors hold a shared_ptr to their context,
// so it outlives flame_ctx_destroy until the last tensor goes.
#pragma once
#include <cuda.h>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>
#include "flame.h"
#include "runtime/disk_cache.h"
#include "runtime/nvrtc_compiler.h"
#include "runtime/driver.h"
#include "runtime/kernel_key.h"
#include "runtime/log.h"

namespace flame {
class Context;
class Blas;
class Cudnn;
struct Capture;
struct GraphPool;
}

struct flame_ctx_s {
  uint64_t magic;
  flame::Context* ctx;
};

namespace flame {

constexpr uint64_t kCtxMagic = 0xF1A3EC7C7C7C0001ull;
constexpr uint64_t kDeadMagic = 0xDEADDEADDEADDEADull;

struct KernelStats {
  uint64_t memory_hits = 0, disk_hits = 0, compiled = 0;
};

// The autograd mode of a context: what the ops of the calling code record, whether autocast casts
// their inputs, and how the backward walk in progress treats .grad. The flame_ctx_set_* entry points
// change it for good; FLAME's own code changes it only for a scope, through GradModeGuard.
struct GradMode {
  bool grad_enabled = true;
  bool inference = false;  // inference mode: tensors made now can never require grad
  int32_t autocast = -1;   // FLAME_DTYPE_BF16 / F16 while autocast is on, else -1 (api/autocast.h)
  // Whether the backward walk in progress accumulates into .grad (flame_backward) or returns the
  // gradients of given inputs (flame_grad): rules that walk a graph of their own (checkpointing) follow it.
  bool backward_accumulates = true;

  bool recording() const { return grad_enabled && !inference; }
  // This mode with grad mode set to `enabled`; turning it on also leaves inference mode.
  GradMode with_grad(bool enabled) const {
    GradMode m = *this;
    m.grad_enabled = enabled;
    if (enabled) m.inference = false;
    return m;
  }
};

class Context : public std::enable_shared_from_this<Context> {
 public:
  static std::shared_ptr<Context> create(const flame_ctx_options_t& opts);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  // ---- identity and C handle ----
  flame_ctx_s handle{kCtxMagic, this};
  std::shared_ptr<Context> user_ref;  // the reference flame_ctx_create hands out
  std::recursive_mutex mutex;         // serialises every call on this context

  // ---- device ----
  Driver drv;
  CUdevice device = 0;
  int ordinal = 0;
  CUcontext cu = nullptr;
  CUstream stream = nullptr;
  CUmemoryPool pool = nullptr;
  int cc_major = 0, cc_minor = 0, sm_count = 0;
  std::string device_name;
  bool allow_tf32 = false;
  bool gemm_autotune = true;  // time cuBLASLt's top candidates once per shape (runtime/blas.cpp)

  // Makes this context current on the calling thread (cheap when it already is).
  void bind();
  // Throws on a failed driver call; faults that poison the context are recorded as sticky.
  void check(CUresult r, const char* what);
  // Throws FLAME_ERROR_CONTEXT_FAILED when an earlier fault poisoned the context.
  void check_alive() const;
  void synchronize();

  // ---- memory (stream-ordered pool, release threshold at max) ----
  CUdeviceptr allocate(size_t bytes);
  void deallocate(CUdeviceptr p, size_t bytes) noexcept;
  uint64_t bytes_in_use = 0, peak_bytes = 0, memory_limit = 0;
  uint64_t live_tensors = 0;
  uint64_t alloc_count = 0, fail_alloc_at = 0;  // fault injection: $FLAME_FAIL_ALLOC_AT=N fails the Nth allocation
  uint64_t bytes_reserved();
  // Why an allocation failed, for fail_out_of_memory's message.
  enum class OomCause { MemoryLimit, Device, Capture };
  // Throws FLAME_ERROR_OUT_OF_MEMORY for a request of `bytes`, the message naming the request and
  // the pool state (describe_pool_state). Formats into stack buffers: the failure path makes no
  // device allocation and no host allocation beyond the exception's own message.
  [[noreturn]] void fail_out_of_memory(uint64_t bytes, OomCause cause);
  // Writes "pool: <in use> in use ... peak ...; reserved ..., cached ...; device <total> total,
  // <free> free" into buf (NUL-terminated, truncated to n) from driver queries only; never throws or
  // allocates. Returns the length written.
  size_t describe_pool_state(char* buf, size_t n) noexcept;
  // Gives the blocks on the small-block free lists back to the pool (out of memory, destruction).
  void release_small_blocks() noexcept;
  static constexpr int kSmallClasses = 12;      // see small_free_
  static constexpr size_t kSmallFreeMax = 64;  // blocks kept per class

  // ---- kernels ----
  // The function of one kernel instantiation (runtime/kernel_key.h), compiled on first use. A hit
  // hashes the key (no string is built); a miss spells the name expression and goes through
  // function_by_name. Every launch site names its kernel this way.
  CUfunction function(const KernelKey& key) {
    auto it = keyed_functions_.find(key);
    if (it == keyed_functions_.end()) return function_miss(key);
    ++kernel_stats.memory_hits;
    return it->second;
  }
  // By name expression: the cache behind keys (memory, then disk, then NVRTC), called directly only
  // by fused functions (ops/fused.cpp), whose generated `prelude` is compiled in front of the file
  // and is part of both cache keys.
  CUfunction function_by_name(const std::string& file, const std::string& name_expr,
                              const std::string& prelude = std::string());
  void launch(CUfunction f, unsigned grid, unsigned block, void** args, unsigned smem = 0);
  DiskCache disk_cache{""};
  KernelStats kernel_stats;

  // ---- messages to the user (runtime/log.h): stderr from $FLAME_LOG's level, or flame_ctx_set_log's ----
  Logger log;

  // ---- matrix products (runtime/blas.h): cuBLASLt handle, workspace and plan cache, made on first use ----
  std::unique_ptr<Blas> blas;

  // ---- convolutions through cuDNN (runtime/cudnn.h): libcudnn.so.9 loaded on first use ----
  std::unique_ptr<Cudnn> cudnn;
  bool cudnn_enabled = true;      // false: FLAME_DISABLE_CUDNN=1 at creation (FLAME's kernels only)
  std::string cudnn_unavailable;  // why loading failed (then it is not tried again)

  // ---- sm_90a kernels (wgmma): an H100/H200 and not FLAME_DISABLE_WGMMA=1 at creation ----
  bool wgmma_enabled = false;

  // ---- random numbers (Philox4x32-10, counter = offset + element) ----
  uint64_t rng_seed = 0, rng_offset = 0;
  // Reserves n counters and returns the first. Not during a graph capture (runtime/capture.cpp).
  uint64_t take_rng(uint64_t n) {
    if (capture) forbid_in_capture("drawing random numbers (each replay would repeat the same numbers)");
    uint64_t o = rng_offset;
    rng_offset += n;
    return o;
  }

  // ---- autograd mode: one value; scoped changes go through GradModeGuard ----
  GradMode mode;
  bool recording() const { return mode.recording(); }

  // ---- released handles of kinds other than tensors (safetensors files, ...), kept readable so
  // that reuse is detected ----
  std::deque<std::shared_ptr<void>> dead_objects;
  // ---- what the API layer keeps for this context's tensor handles (api/handles.h: the quarantine
  // of released handles and the handle scopes open on each thread); opaque below the API layer,
  // made there on first use and destroyed with the context ----
  std::shared_ptr<void> api_handles;

  // ---- errors found by kernels in the data they read (indices out of range) ----
  // Kernels that check indices write the first bad one into a small device record
  // (cuda/device_error.cuh); synchronize() reads it back and throws FLAME_ERROR_INVALID_ARGUMENT
  // with `what` ("cross_entropy: target index"), the index, its position and the valid range, then clears
  // it, so the context stays usable. The record costs one 32-byte copy per synchronize, and only
  // after a checking kernel was launched.
  struct DeviceErrorRecord {  // mirrors cuda/device_error.cuh
    uint32_t code, source;
    int64_t value, position, limit;
  };
  // The record's device address for a kernel about to be launched; *source identifies `what`.
  CUdeviceptr device_error_record(const std::string& what, uint32_t* source);

  // ---- completion counters of split reductions (cuda/reduce.cuh, reduce_general) ----
  // n zeroed 32-bit counters that a kernel returns to zero when it is done (the last block of each
  // output resets its own), so one buffer serves every launch in stream order. At most
  // kMaxReduceCounters; allocated and cleared on first use.
  static constexpr size_t kMaxReduceCounters = 4096;
  CUdeviceptr reduce_counters(size_t n);

  // ---- CUDA graph capture (runtime/capture.h, runtime/capture.cpp) ----
  // Between flame_graph_capture_begin and _end: the capture's state and private memory pool.
  std::unique_ptr<Capture> capture;
  // A second stream that is never captured: one-time set-up made during a capture (persistent
  // state, constant tables) is allocated and written there, ordered after the work queued before
  // the capture and before anything queued after it (capture.cpp).
  CUstream side_stream = nullptr;
  CUevent side_events[2] = {nullptr, nullptr};
  // > 0 while a SetupScope is open: allocations are set-up memory (see capture.h), not capture memory.
  int setup_depth = 0;
  // Blocks allocated during a finished capture that a tensor still holds, with the pool of their
  // graph: freed when both the holder and every graph of the pool have let go.
  std::unordered_map<CUdeviceptr, std::shared_ptr<GraphPool>> graph_held;
  // Throws FLAME_ERROR_UNSUPPORTED "<what> is not allowed during a CUDA graph capture" while capturing.
  void forbid_in_capture(const char* what) const;
  // The stream for one-time initialisation of set-up memory: side_stream while capturing, else stream.
  CUstream init_stream() const { return capture ? side_stream : stream; }
  // Gives a block back: to the pool in stream order, or, during a capture, to the capture's keep
  // list (the graph may read it; freed when the graph is released).
  void release_block(CUdeviceptr p) noexcept;
  // Ends a capture in progress and discards it (flame_ctx_destroy, ~Context). Never throws.
  void abort_capture() noexcept;
  // A replayed graph ran kernels that check indices: the next synchronize reads the record.
  void arm_device_error() { device_error_armed_ = true; }

 private:
  Context() = default;
  std::string sticky_error_;
  std::unordered_map<std::string, CUfunction> functions_;  // by file and name expression
  std::unordered_map<KernelKey, CUfunction, KernelKeyHash> keyed_functions_;
  std::unordered_set<std::string> key_texts_;  // the text of every kept key (nodes: stable addresses)
  CUfunction function_miss(const KernelKey& key);
  // NVRTC for one kernel, with the messages: INFO before the context's first compile (the one line a
  // user sees on a cold kernel cache), DEBUG after each with its time and count.
  CompiledModule compile_logged(const std::string& file, const std::string& name_expr, int arch,
                                const std::string& prelude);
  uint64_t nvrtc_compiles_ = 0;      // NVRTC runs of this context (the first one is announced)
  bool cache_write_warned_ = false;  // a failed kernel cache write was reported (once per context)
  // Small blocks (<= 1 MiB, power-of-two classes from 512 B) freed outside captures wait on host
  // free lists and are handed out again without a driver call: cuMemAllocFromPoolAsync plus
  // cuMemFreeAsync cost ~0.6 us of an eager op's ~4.6 us on an H200. All eager work runs on
  // `stream`, whose order makes the reuse safe, as it does for the pool's own reuse.
  std::vector<CUdeviceptr> small_free_[kSmallClasses];
  std::unordered_map<CUdeviceptr, int> small_live_;  // live blocks of the class path -> class
  std::vector<CUmodule> modules_;
  CUdeviceptr device_error_ = 0;                   // the DeviceErrorRecord, allocated on first use
  CUdeviceptr reduce_counters_ = 0;                // kMaxReduceCounters counters, allocated on first use
  bool device_error_armed_ = false;                 // a checking kernel ran since the last read-back
  std::vector<std::string> device_error_sources_;  // `what` of each source id (id = index + 1)
  void check_device_error();
};

// Locks the context and binds it to the thread for the duration of an API call.
// A call that fails while the context is capturing a graph aborts the capture (capture.cpp): the
// capture's end then returns that call's status and message and discards the graph.
// Sets a context's autograd mode for a scope and restores the previous one when the scope ends
// (also when an exception leaves it).
class GradModeGuard {
 public:
  GradModeGuard(Context& c, const GradMode& m) : c_(c), prev_(c.mode) { c.mode = m; }
  ~GradModeGuard() { c_.mode = prev_; }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  Context& c_;
  GradMode prev_;
};

class ContextScope {
 public:
  explicit ContextScope(Context& c) : lock_(c.mutex), ctx_(c), uncaught_(std::uncaught_exceptions()) { c.bind(); }
  ~ContextScope() {
    if (ctx_.capture && std::uncaught_exceptions() > uncaught_) note_capture_failure(ctx_);
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  std::lock_guard<std::recursive_mutex> lock_;
  Context& ctx_;
  int uncaught_;
  static void note_capture_failure(Context& c) noexcept;  // capture.cpp
};

// Called by api_call with the status and message of a failed entry point: when that call aborted
// a capture (ContextScope above), the capture keeps them for flame_graph_capture_end.
void record_capture_error(flame_status_t status, const std::string& message) noexcept;

}  // namespace flame

// C entry points: version, status strings, errors, dtypes, contexts.
#include <algorithm>
#include <cstring>
#include "api/guard.h"
#include "runtime/driver.h"

using namespace flame;

namespace {

// Writes the fields of v (a struct that starts with size_t struct_size) that the caller's struct
// has room for: its struct_size tells how long it is (an older caller's struct is shorter); the
// caller's struct_size itself is left as it set it.
template <class Struct>
void copy_to_caller(const Struct& v, Struct* out) {
  const size_t n = std::min(out->struct_size, sizeof v);
  std::memcpy(reinterpret_cast<char*>(out) + sizeof(size_t), reinterpret_cast<const char*>(&v) + sizeof(size_t),
              n - sizeof(size_t));
}

}  // namespace

extern "C" {

FLAME_API const char* flame_version_string(void) { return FLAME_VERSION_STRING; }
FLAME_API int32_t flame_abi_version(void) { return FLAME_ABI_VERSION; }

FLAME_API const char* flame_status_string(flame_status_t s) {
  switch (enum_arg(s)) {
    case FLAME_OK: return "FLAME_OK";
    case FLAME_ERROR_INVALID_ARGUMENT: return "FLAME_ERROR_INVALID_ARGUMENT";
    case FLAME_ERROR_INVALID_HANDLE: return "FLAME_ERROR_INVALID_HANDLE";
    case FLAME_ERROR_SHAPE_MISMATCH: return "FLAME_ERROR_SHAPE_MISMATCH";
    case FLAME_ERROR_DTYPE_MISMATCH: return "FLAME_ERROR_DTYPE_MISMATCH";
    case FLAME_ERROR_OUT_OF_MEMORY: return "FLAME_ERROR_OUT_OF_MEMORY";
    case FLAME_ERROR_NO_DRIVER: return "FLAME_ERROR_NO_DRIVER";
    case FLAME_ERROR_NO_DEVICE: return "FLAME_ERROR_NO_DEVICE";
    case FLAME_ERROR_CUDA: return "FLAME_ERROR_CUDA";
    case FLAME_ERROR_KERNEL_COMPILE: return "FLAME_ERROR_KERNEL_COMPILE";
    case FLAME_ERROR_NOT_DIFFERENTIABLE: return "FLAME_ERROR_NOT_DIFFERENTIABLE";
    case FLAME_ERROR_IO: return "FLAME_ERROR_IO";
    case FLAME_ERROR_UNSUPPORTED: return "FLAME_ERROR_UNSUPPORTED";
    case FLAME_ERROR_INTERNAL: return "FLAME_ERROR_INTERNAL";
    case FLAME_ERROR_CONTEXT_FAILED: return "FLAME_ERROR_CONTEXT_FAILED";
    case FLAME_ERROR_INVALID_FORMAT: return "FLAME_ERROR_INVALID_FORMAT";
    case FLAME_ERROR_GRAPH_FREED: return "FLAME_ERROR_GRAPH_FREED";
    case FLAME_ERROR_INPLACE_MODIFIED: return "FLAME_ERROR_INPLACE_MODIFIED";
  }
  return "FLAME_ERROR_UNKNOWN_STATUS";
}

FLAME_API const char* flame_last_error_message(void) { return last_error(); }
FLAME_API void flame_set_error_message(const char* msg) {
  try {
    if (msg) set_last_error(msg);
    else clear_last_error();
  } catch (...) {
  }
}

FLAME_API size_t flame_dtype_size(flame_dtype_t d) {
  const int32_t v = enum_arg(d);
  return dtype_valid(v) ? dtype_size(static_cast<DType>(v)) : 0;
}
FLAME_API const char* flame_dtype_name(flame_dtype_t d) {
  const int32_t v = enum_arg(d);
  return dtype_valid(v) ? dtype_name(static_cast<DType>(v)) : "unknown";
}

FLAME_API flame_status_t flame_ctx_options_init(flame_ctx_options_t* opts) {
  return api_call("flame_ctx_options_init", [&] {
    FLAME_CHECK(opts, FLAME_ERROR_INVALID_ARGUMENT, "opts is NULL");
    std::memset(opts, 0, sizeof *opts);
    opts->struct_size = sizeof *opts;
  });
}

FLAME_API flame_status_t flame_ctx_create(const flame_ctx_options_t* opts, flame_ctx_t* out) {
  return api_call("flame_ctx_create", [&] {
    out_param(out, "ctx");
    flame_ctx_options_t o;
    flame_ctx_options_init(&o);
    if (opts) {
      // Read only what the caller's (possibly older, smaller) struct holds.
      FLAME_CHECK(opts->struct_size >= offsetof(flame_ctx_options_t, seed) && opts->struct_size <= 4096,
                  FLAME_ERROR_INVALID_ARGUMENT, "opts->struct_size is ", opts->struct_size,
                  "; set it with flame_ctx_options_init");
      std::memcpy(&o, opts, std::min(opts->struct_size, sizeof o));
      o.struct_size = sizeof o;
    }
    auto c = Context::create(o);
    c->user_ref = c;
    *out = &c->handle;
  });
}

FLAME_API void flame_ctx_destroy(flame_ctx_t ctx) {
  if (!ctx || ctx->magic != kCtxMagic) return;
  std::shared_ptr<Context> keep;
  {
    std::lock_guard<std::recursive_mutex> lock(ctx->ctx->mutex);
    ctx->ctx->bind();
    ctx->ctx->abort_capture();  // a capture in progress is discarded (its end needs the handle)
    ctx->magic = kDeadMagic;
    keep = std::move(ctx->ctx->user_ref);
  }
  // keep goes here: the context is torn down now unless tensors still hold it.
}

FLAME_API flame_status_t flame_ctx_synchronize(flame_ctx_t ctx) {
  return api_call("flame_ctx_synchronize", [&] {
    Context& c = context_of(ctx);
    LiveScope s(c);
    c.synchronize();
  });
}

FLAME_API flame_status_t flame_ctx_device_name(flame_ctx_t ctx, char* buf, size_t capacity) {
  return api_call("flame_ctx_device_name", [&] {
    Context& c = context_of(ctx);
    FLAME_CHECK(buf && capacity > 0, FLAME_ERROR_INVALID_ARGUMENT, "buf is NULL or capacity is 0");
    size_t n = std::min(capacity - 1, c.device_name.size());
    std::memcpy(buf, c.device_name.data(), n);
    buf[n] = '\0';
  });
}

FLAME_API flame_status_t flame_ctx_compute_capability(flame_ctx_t ctx, int32_t* major, int32_t* minor) {
  return api_call("flame_ctx_compute_capability", [&] {
    Context& c = context_of(ctx);
    out_param(major, "major");
    out_param(minor, "minor");
    *major = c.cc_major;
    *minor = c.cc_minor;
  });
}

FLAME_API flame_status_t flame_ctx_stream(flame_ctx_t ctx, void** stream) {
  return api_call("flame_ctx_stream", [&] {
    Context& c = context_of(ctx);
    auto* out_ = out_param(stream, "stream");
    *out_ = c.stream;
  });
}

FLAME_API flame_status_t flame_device_count(int32_t* count) {
  return api_call("flame_device_count", [&] {
    out_param(count, "count");
    Driver d;
    try {
      d.load();
    } catch (const Error& e) {
      if (e.status() == FLAME_ERROR_NO_DEVICE) return;  // a driver without GPUs: zero devices
      throw;
    }
    int n = 0;
    CUresult r = d.cuDeviceGetCount(&n);
    FLAME_CHECK(r == CUDA_SUCCESS, FLAME_ERROR_CUDA, "cuDeviceGetCount failed: ", d.describe(r));
    *count = n;
  });
}

FLAME_API flame_status_t flame_ctx_memory_stats(flame_ctx_t ctx, flame_memory_stats_t* stats) {
  return api_call("flame_ctx_memory_stats", [&] {
    Context& c = context_of(ctx);
    FLAME_CHECK(stats, FLAME_ERROR_INVALID_ARGUMENT, "stats is NULL");
    FLAME_CHECK(stats->struct_size >= offsetof(flame_memory_stats_t, bytes_reserved), FLAME_ERROR_INVALID_ARGUMENT,
                "stats->struct_size must be set to sizeof(flame_memory_stats_t)");
    ContextScope s(c);
    flame_memory_stats_t v;
    v.struct_size = sizeof v;
    v.bytes_in_use = c.bytes_in_use;
    v.bytes_reserved = c.bytes_reserved();
    v.peak_bytes_in_use = c.peak_bytes;
    v.live_tensors = c.live_tensors;
    copy_to_caller(v, stats);
  });
}

FLAME_API flame_status_t flame_ctx_reset_peak_memory(flame_ctx_t ctx) {
  return api_call("flame_ctx_reset_peak_memory", [&] {
    Context& c = context_of(ctx);
    ContextScope s(c);
    c.peak_bytes = c.bytes_in_use;
  });
}

FLAME_API flame_status_t flame_ctx_counters(flame_ctx_t ctx, flame_ctx_counters_t* counters) {
  return api_call("flame_ctx_counters", [&] {
    Context& c = context_of(ctx);
    FLAME_CHECK(counters, FLAME_ERROR_INVALID_ARGUMENT, "counters is NULL");
    FLAME_CHECK(counters->struct_size >= offsetof(flame_ctx_counters_t, cast_kernels), FLAME_ERROR_INVALID_ARGUMENT,
                "counters->struct_size must be set to sizeof(flame_ctx_counters_t)");
    ContextScope s(c);
    const DeviceWorkCounters& counted = c.drv.counters;
    flame_ctx_counters_t v;
    v.struct_size = sizeof v;
    v.launches = counted.launches;
    v.cast_kernels = counted.cast_kernels;
    v.host_syncs = counted.host_syncs;
    v.driver_allocations = counted.driver_allocations;
    copy_to_caller(v, counters);
  });
}

FLAME_API flame_status_t flame_ctx_reset_counters(flame_ctx_t ctx) {
  return api_call("flame_ctx_reset_counters", [&] {
    Context& c = context_of(ctx);
    ContextScope s(c);
    c.drv.counters = DeviceWorkCounters{};
  });
}

FLAME_API flame_status_t flame_ctx_manual_seed(flame_ctx_t ctx, uint64_t seed) {
  return api_call("flame_ctx_manual_seed", [&] {
    Context& c = context_of(ctx);
    ContextScope s(c);
    c.rng_seed = seed;
    c.rng_offset = 0;
  });
}

FLAME_API flame_status_t flame_ctx_get_rng_state(flame_ctx_t ctx, uint64_t* seed, uint64_t* offset) {
  return api_call("flame_ctx_get_rng_state", [&] {
    Context& c = context_of(ctx);
    out_param(seed, "seed");
    out_param(offset, "offset");
    ContextScope s(c);
    *seed = c.rng_seed;
    *offset = c.rng_offset;
  });
}

FLAME_API flame_status_t flame_ctx_set_rng_state(flame_ctx_t ctx, uint64_t seed, uint64_t offset) {
  return api_call("flame_ctx_set_rng_state", [&] {
    Context& c = context_of(ctx);
    ContextScope s(c);
    c.rng_seed = seed;
    c.rng_offset = offset;
  });
}

FLAME_API flame_status_t flame_ctx_set_log(flame_ctx_t ctx, flame_log_level_t level, flame_log_fn fn, void* user_data) {
  return api_call("flame_ctx_set_log", [&] {
    Context& c = context_of(ctx);
    ContextScope s(c);
    Logger next = Logger::from_options(fn, user_data, enum_arg(level), std::getenv("FLAME_LOG"));  // validates first
    c.log = next;
  });
}

FLAME_API flame_status_t flame_ctx_set_grad_enabled(flame_ctx_t ctx, int32_t enabled, int32_t* previous) {
  return api_call("flame_ctx_set_grad_enabled", [&] {
    Context& c = context_of(ctx);
    ContextScope s(c);
    if (previous) *previous = c.mode.grad_enabled ? 1 : 0;
    c.mode.grad_enabled = enabled != 0;
  });
}

FLAME_API flame_status_t flame_ctx_set_autocast(flame_ctx_t ctx, int32_t dtype, int32_t* previous) {
  return api_call("flame_ctx_set_autocast", [&] {
    Context& c = context_of(ctx);
    ContextScope s(c);
    FLAME_CHECK(dtype == FLAME_AUTOCAST_OFF || dtype == FLAME_DTYPE_BF16 || dtype == FLAME_DTYPE_F16,
                FLAME_ERROR_INVALID_ARGUMENT, "dtype ", dtype, " is not FLAME_DTYPE_BF16, FLAME_DTYPE_F16 or FLAME_AUTOCAST_OFF");
    if (previous) *previous = c.mode.autocast;
    c.mode.autocast = dtype;
  });
}

FLAME_API flame_status_t flame_ctx_get_autocast(flame_ctx_t ctx, int32_t* dtype) {
  return api_call("flame_ctx_get_autocast", [&] {
    Context& c = context_of(ctx);
    auto* out_ = out_param(dtype, "dtype");
    *out_ = c.mode.autocast;
  });
}

FLAME_API flame_status_t flame_ctx_is_grad_enabled(flame_ctx_t ctx, int32_t* enabled) {
  return api_call("flame_ctx_is_grad_enabled", [&] {
    Context& c = context_of(ctx);
    auto* out_ = out_param(enabled, "enabled");
    *out_ = c.mode.grad_enabled ? 1 : 0;
  });
}

FLAME_API flame_status_t flame_ctx_set_inference_mode(flame_ctx_t ctx, int32_t enabled, int32_t* previous) {
  return api_call("flame_ctx_set_inference_mode", [&] {
    Context& c = context_of(ctx);
    ContextScope s(c);
    if (previous) *previous = c.mode.inference ? 1 : 0;
    c.mode.inference = enabled != 0;
  });
}

}  // extern "C"

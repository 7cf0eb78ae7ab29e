/*
 * flame.h - the public C ABI of FLAME (Fast Learning Accelerated Matrix Engine).
 *
 * If it is not in this file, it is not API. Everything here is plain C99 and C++ compatible.
 *
 * Conventions that hold for every function below unless its comment says otherwise:
 *  - Every function returns flame_status_t (FLAME_OK = 0) and never throws, aborts or exits.
 *  - Results come back through out-parameters marked OUT. On failure every OUT handle is set to
 *    NULL (when the OUT pointer itself is not NULL) and nothing else changes.
 *  - Tensor handles passed in are BORROWED: the call neither keeps nor releases your reference.
 *    Tensor handles returned are NEW REFERENCES: release each with flame_tensor_release(), or let
 *    a handle scope release them (see "Handle scopes").
 *  - A NULL handle or NULL OUT pointer gives FLAME_ERROR_INVALID_ARGUMENT; a released handle gives
 *    FLAME_ERROR_INVALID_HANDLE wherever the library can still tell (see flame_tensor_release).
 *  - After a failure, flame_last_error_message() names the function and the offending argument.
 *  - Every *_release / *_destroy / *_remove function accepts NULL and then does nothing.
 *
 * Threads: a context and all of its tensors may be used from several threads; calls on one
 * context are serialised by a lock inside the context. Distinct contexts share nothing and run
 * in parallel. Error messages are per thread.
 *
 * Lifetime: tensors keep their context alive. flame_ctx_destroy() drops the caller's reference;
 * the GPU resources go when the last tensor of the context is released. Using the context handle
 * after flame_ctx_destroy() is an error (FLAME_ERROR_INVALID_HANDLE while tensors keep it alive).
 *
 * Work is asynchronous on one stream per context. Copies to the host synchronise. A device fault
 * found asynchronously is kept in the context and reported by the next call that can see it
 * (FLAME_ERROR_CONTEXT_FAILED); such a context stays failed; contexts on other GPUs keep working.
 *
 * Device faults (an illegal address or instruction in a kernel, e.g. through a DLPack import whose
 * memory is not what it claims): the call that launched the kernel usually succeeds; the fault is
 * reported by the next call that synchronises or queues work, as FLAME_ERROR_CONTEXT_FAILED with
 * "device fault" and the CUDA error in the message. From then on every call on that context that
 * needs the device returns FLAME_ERROR_CONTEXT_FAILED; results computed since the last successful
 * synchronisation are lost. What survives: the process; queries that do not touch the device
 * (shapes, dtypes, status strings); releasing its tensors (DLPack deleters still run once) and
 * flame_ctx_destroy. What does not: CUDA poisons a whole CUDA context, and all FLAME contexts on one
 * GPU share that GPU's primary CUDA context, so every context on the faulting GPU fails too (each
 * reports FLAME_ERROR_CONTEXT_FAILED at its next device call). Contexts on other GPUs, and a new
 * context on the faulting GPU once all of its contexts are destroyed, work where the driver allows:
 * with one GPU a new context starts afresh (unless something else, e.g. the CUDA runtime under
 * cuBLASLt, still holds the primary context); on a two-GPU H200 host (CUDA 13.0 driver) the fault
 * also failed the other GPU's context and a new one, each cleanly with FLAME_ERROR_CONTEXT_FAILED.
 * Treat a device fault as the end of the process's GPU work: save what is on the host, restart.
 * tests/gpu/test_device_fault.cpp checks this in a child process.
 */
#ifndef FLAME_H
#define FLAME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ============================== Export and version ============================== */

#if defined(_WIN32)
#  if defined(FLAME_BUILDING_LIBRARY)
#    define FLAME_API __declspec(dllexport)
#  else
#    define FLAME_API __declspec(dllimport)
#  endif
#elif defined(__GNUC__)
#  define FLAME_API __attribute__((visibility("default")))
#else
#  define FLAME_API
#endif

#define FLAME_VERSION_MAJOR 0
#define FLAME_VERSION_MINOR 1
#define FLAME_VERSION_PATCH 0
/* The ABI major version: the SONAME is libflame.so.FLAME_ABI_VERSION. Bumped on every break. */
#define FLAME_ABI_VERSION 1

/* @return the library's version as "MAJOR.MINOR.PATCH"; a static string, never NULL. */
FLAME_API const char* flame_version_string(void);
/* @return FLAME_ABI_VERSION of the loaded library; bindings compare it before first use. */
FLAME_API int32_t flame_abi_version(void);

/* ============================== Status and errors ============================== */

typedef enum flame_status_t {
  FLAME_OK = 0,
  FLAME_ERROR_INVALID_ARGUMENT = 1,   /* NULL pointer, bad value, out-of-range axis or index */
  FLAME_ERROR_INVALID_HANDLE = 2,     /* released or foreign handle */
  FLAME_ERROR_SHAPE_MISMATCH = 3,     /* shapes cannot broadcast or do not fit */
  FLAME_ERROR_DTYPE_MISMATCH = 4,     /* dtype not supported by the op, or incompatible dtypes */
  FLAME_ERROR_OUT_OF_MEMORY = 5,      /* device memory or the context's memory limit */
  FLAME_ERROR_NO_DRIVER = 6,          /* libcuda.so.1 could not be loaded */
  FLAME_ERROR_NO_DEVICE = 7,          /* the driver loaded but the device ordinal does not exist */
  FLAME_ERROR_CUDA = 8,               /* a CUDA driver call failed */
  FLAME_ERROR_KERNEL_COMPILE = 9,     /* NVRTC failed to compile a kernel */
  FLAME_ERROR_NOT_DIFFERENTIABLE = 10,/* an op without backward got an input that requires grad */
  FLAME_ERROR_IO = 11,                /* file system error (kernel cache, model files) */
  FLAME_ERROR_UNSUPPORTED = 12,       /* valid request this build or device cannot do */
  FLAME_ERROR_INTERNAL = 13,          /* a bug in FLAME; please report it */
  FLAME_ERROR_CONTEXT_FAILED = 14,    /* an earlier asynchronous device fault; context unusable */
  FLAME_ERROR_INVALID_FORMAT = 15,    /* malformed file content */
  FLAME_ERROR_GRAPH_FREED = 16,       /* backward through a graph whose saved tensors were freed */
  FLAME_ERROR_INPLACE_MODIFIED = 17   /* a tensor saved for backward was modified in place */
} flame_status_t;

/* @return a static English name for status ("FLAME_ERROR_SHAPE_MISMATCH"); never NULL. */
FLAME_API const char* flame_status_string(flame_status_t status);

/* @return the message of the last failed FLAME call on this thread ("" when the last call
 * succeeded). Owned by the library; valid until the next FLAME call on this thread. */
FLAME_API const char* flame_last_error_message(void);

/* Sets this thread's error message. Callbacks (hooks) call it before returning an error status so
 * that the status reaches the caller with their text. msg may be NULL (clears). */
FLAME_API void flame_set_error_message(const char* msg);

/* ============================== Types ============================== */

typedef enum flame_dtype_t {
  FLAME_DTYPE_F32 = 0,
  FLAME_DTYPE_F16 = 1,
  FLAME_DTYPE_BF16 = 2,
  FLAME_DTYPE_F64 = 3,
  FLAME_DTYPE_I32 = 4,
  FLAME_DTYPE_I64 = 5,
  FLAME_DTYPE_U8 = 6,
  FLAME_DTYPE_BOOL = 7,
  /* 8-bit floats (OCP FP8; safetensors' "F8_E4M3" and "F8_E5M2"; PyTorch's torch.float8_e4m3fn and
   * torch.float8_e5m2), one byte per element. They are storage dtypes: tensors of them can be
   * created (empty, zeros, ones, full, eye, from_host), copied (clone, contiguous), viewed,
   * converted with flame_to_dtype (to and from every dtype; also FLAME_PARAMS_LOAD_CONVERT_DTYPE),
   * moved to and from the host, saved and loaded (safetensors) and exchanged through DLPack. Every
   * other op (arithmetic, reductions, matrix products, indexing kernels, optimizers, random
   * numbers, reducing collectives) fails with FLAME_ERROR_UNSUPPORTED naming the dtype: convert to
   * f32, f16 or bf16 first. Mixing an f8 dtype with another where dtypes are promoted (binary ops,
   * flame_cat) is FLAME_ERROR_UNSUPPORTED too, as in PyTorch. Conversions to f8 round to nearest,
   * ties to even, bit for bit as PyTorch's .to() (its CPU conversion): f64, integers and bool go
   * through f32 first, and a NaN keeps its sign from every float dtype (-NaN gives 0xFF; f16 and f64
   * NaN signs included). Conversions from f8 are exact (f8 to integers: through f32); an f8 NaN
   * becomes a NaN of its sign in f32, f64 and f16 (0x7E00 / 0xFE00) and 0x7FC0 in bf16, as PyTorch's
   * c10 conversions. Copies (clone, contiguous, cat) keep every byte, NaN codes included. */
  /* E4M3 "fn": sign, 4 exponent bits (bias 7), 3 mantissa bits; largest finite 448, smallest
   * subnormal 2^-9; no infinities; NaN is 0x7F / 0xFF. Magnitudes above 464 (which round past 448;
   * 464 itself rounds to 448), infinities and NaN become NaN, sign kept: nothing saturates. */
  FLAME_DTYPE_F8_E4M3 = 8,
  /* E5M2: sign, 5 exponent bits (bias 15), 2 mantissa bits (IEEE-like: the top byte of an f16);
   * largest finite 57344, smallest subnormal 2^-16; magnitudes that round above 57344 (>= 61440)
   * become +-infinity (0x7C / 0xFC); NaN becomes NaN (0x7F / 0xFF). */
  FLAME_DTYPE_F8_E5M2 = 9
} flame_dtype_t;

/* @return size in bytes of one element of dtype, or 0 for an unknown value. */
FLAME_API size_t flame_dtype_size(flame_dtype_t dtype);
/* @return a static name ("f32", "bf16", ...) or "unknown"; never NULL. */
FLAME_API const char* flame_dtype_name(flame_dtype_t dtype);

typedef struct flame_ctx_s* flame_ctx_t;       /* a GPU, its stream, memory pool and kernels */
typedef struct flame_tensor_s* flame_tensor_t; /* a reference-counted strided view of memory */
typedef struct flame_hook_s* flame_hook_t;     /* a registered gradient hook */

/* The most dimensions a tensor may have. */
#define FLAME_MAX_DIMS 8

/* ============================== Context ============================== */

/* Levels of the library's messages (flame_ctx_set_log, $FLAME_LOG). The library logs
 * little: INFO once per context when it starts compiling kernels (the kernel cache is cold: the
 * first run on a machine, a new GPU architecture or library version; this can take minutes), DEBUG
 * each compiled kernel with its time and count and why cuDNN refused an attention shape (INFO with
 * $FLAME_CUDNN_LOG=1), WARNING a kernel cache directory that cannot be written. */
typedef enum flame_log_level_t {
  FLAME_LOG_DEFAULT = 0, /* for flame_ctx_set_log: $FLAME_LOG (debug, info, warning or off), else INFO */
  FLAME_LOG_DEBUG = 1,
  FLAME_LOG_INFO = 2,
  FLAME_LOG_WARNING = 3,
  FLAME_LOG_OFF = 4     /* as a threshold only: no messages */
} flame_log_level_t;

/* Receives one message of a context: level is a flame_log_level_t, message one line without a
 * trailing newline, owned by the library and valid only during the call. Called on the thread whose
 * FLAME call produced the message, while that call holds its context's lock: the messages of one
 * context never overlap, those of different contexts may come concurrently from several threads.
 * The callback must return normally (no longjmp; a C++ exception thrown from it is caught and
 * dropped) and must not call FLAME functions that take a context or a tensor. */
typedef void (*flame_log_fn)(void* user_data, int32_t level, const char* message);

/* Options for flame_ctx_create. Fill with flame_ctx_options_init, then change fields. The struct
 * may grow at its end; the library reads only struct_size bytes of it. */
typedef struct flame_ctx_options_t {
  size_t struct_size;           /* sizeof(flame_ctx_options_t), set by flame_ctx_options_init */
  int32_t device;               /* CUDA device ordinal; default 0 */
  uint64_t seed;                /* seed of the Philox generator; default 0 */
  const char* kernel_cache_dir; /* NULL: $FLAME_KERNEL_CACHE_DIR, else $XDG_CACHE_HOME/flame/kernels,
                                   else ~/.cache/flame/kernels. "" disables the disk cache.
                                   Copied during flame_ctx_create. */
  uint64_t memory_limit;        /* bytes of tensor memory the context may hold; 0 = no limit */
  int32_t allow_tf32;           /* matrix products in f32 may use TF32 tensor cores; default 0 */
  int32_t gemm_heuristic_only;  /* 0 (default): the first product of each new shape times cuBLASLt's
                                   top candidate algorithms (one synchronisation) and keeps the
                                   fastest, so two contexts may pick different ones; 1: always the
                                   heuristic's first choice (the same algorithm in every run) */
} flame_ctx_options_t;

/* Sets opts to the defaults above. opts NULL: FLAME_ERROR_INVALID_ARGUMENT. */
FLAME_API flame_status_t flame_ctx_options_init(flame_ctx_options_t* opts);

/* Creates a context on a device. opts may be NULL (defaults). OUT *ctx: a new context, destroy it
 * with flame_ctx_destroy. Loads the CUDA driver (libcuda.so.1) on first use.
 * Errors: FLAME_ERROR_NO_DRIVER (no libcuda.so.1 or no usable driver), FLAME_ERROR_NO_DEVICE
 * (ordinal out of range, or no GPU), FLAME_ERROR_INVALID_ARGUMENT (bad struct_size),
 * FLAME_ERROR_CUDA. */
FLAME_API flame_status_t flame_ctx_create(const flame_ctx_options_t* opts, flame_ctx_t* ctx);

/* Drops the caller's reference to ctx (see Lifetime above). NULL is a no-op. */
FLAME_API void flame_ctx_destroy(flame_ctx_t ctx);

/* Where ctx's messages go, and from which level on. A new context writes FLAME_LOG_DEFAULT's level
 * ($FLAME_LOG, else INFO: a cold kernel cache prints one line) to stderr as "flame: <message>"
 * ("flame: warning: <message>" for warnings); call this right after flame_ctx_create to catch the
 * first compile. fn NULL: stderr. user_data is passed to fn, borrowed: it must stay valid until the
 * next flame_ctx_set_log of ctx or until the context is gone (its last tensor released).
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (ctx NULL; level not FLAME_LOG_DEFAULT .. FLAME_LOG_OFF),
 * FLAME_ERROR_INVALID_HANDLE. Nothing changes on an error. */
FLAME_API flame_status_t flame_ctx_set_log(flame_ctx_t ctx, flame_log_level_t level, flame_log_fn fn, void* user_data);

/* Waits for all work queued on the context's stream. Reports asynchronous faults. */
FLAME_API flame_status_t flame_ctx_synchronize(flame_ctx_t ctx);

/* Writes the device's name, NUL-terminated and truncated to capacity bytes, into buf.
 * buf NULL or capacity 0: FLAME_ERROR_INVALID_ARGUMENT. */
FLAME_API flame_status_t flame_ctx_device_name(flame_ctx_t ctx, char* buf, size_t capacity);

/* OUT *major, *minor: the device's compute capability (9, 0 for Hopper). */
FLAME_API flame_status_t flame_ctx_compute_capability(flame_ctx_t ctx, int32_t* major, int32_t* minor);

/* OUT *stream: the context's CUstream (borrowed; valid while the context lives), for interop. */
FLAME_API flame_status_t flame_ctx_stream(flame_ctx_t ctx, void** stream);

/* OUT *count: number of CUDA devices. Errors: FLAME_ERROR_NO_DRIVER when no driver loads. */
FLAME_API flame_status_t flame_device_count(int32_t* count);

/* Memory statistics of the context's pool. Fill struct_size before the call (sizeof). */
typedef struct flame_memory_stats_t {
  size_t struct_size;
  uint64_t bytes_in_use;      /* bytes held by live tensors and workspaces */
  uint64_t bytes_reserved;    /* bytes the pool holds from the device */
  uint64_t peak_bytes_in_use; /* maximum of bytes_in_use since creation or the last reset */
  uint64_t live_tensors;      /* tensor handles not yet released */
} flame_memory_stats_t;

/* OUT *stats. stats->struct_size must be set. */
FLAME_API flame_status_t flame_ctx_memory_stats(flame_ctx_t ctx, flame_memory_stats_t* stats);
/* Resets peak_bytes_in_use to the current bytes_in_use. */
FLAME_API flame_status_t flame_ctx_reset_peak_memory(flame_ctx_t ctx);

/* Counts of the work a context has issued from the host, since its creation or the last
 * flame_ctx_reset_counters: what a training step costs beyond its arithmetic (issue 36 asks for
 * kernels, cast kernels and host syncs per step). Fill struct_size before the call (sizeof); fields
 * are only ever appended. What counts is each call FLAME makes, counted when it is made:
 *  - launches: kernel launches (cuLaunchKernel), cuBLASLt matmuls, cuDNN executions, NCCL
 *    collectives, memsets and copies (host to device, device to host, device to device), and graph
 *    launches. Work recorded into a CUDA graph during a capture counts as it is captured (it runs
 *    later, at each replay); a replay of a graph (flame_graph_replay) counts as ONE launch,
 *    whatever the graph holds, because the host issues one cuGraphLaunch. GEMM autotuning (unless flame_ctx_options_t.gemm_heuristic_only) runs each
 *    candidate on the first call of a new shape, as cuDNN's convolution search may: those count too.
 *  - cast_kernels: the launches among `launches` that convert a dtype (flame_to_dtype, and the
 *    conversions ops and autocast make through it); a conversion to the same dtype launches nothing.
 *  - host_syncs: each wait of the host for the device: stream and event synchronisations
 *    (flame_ctx_synchronize, a copy to the host such as flame_to_host, reading a scalar, the
 *    allocator's retry after the pool ran out, GEMM autotuning's timing, error checks) and waits for
 *    NCCL collectives.
 *  - driver_allocations: allocations asked of the CUDA driver's stream-ordered pool
 *    (cuMemAllocFromPoolAsync); blocks FLAME reuses from its own free lists do not count. */
typedef struct flame_ctx_counters_t {
  size_t struct_size;
  uint64_t launches;
  uint64_t cast_kernels;
  uint64_t host_syncs;
  uint64_t driver_allocations;
} flame_ctx_counters_t;

/* OUT *counters: ctx's counts (above). Fill counters->struct_size first; a smaller struct from an
 * older header gets the fields it has, struct_size is left as the caller set it. Reading changes
 * nothing and is allowed during a graph capture. Errors: FLAME_ERROR_INVALID_ARGUMENT (ctx NULL, counters NULL, or struct_size below the
 * first field's end), FLAME_ERROR_INVALID_HANDLE (ctx destroyed). */
FLAME_API flame_status_t flame_ctx_counters(flame_ctx_t ctx, flame_ctx_counters_t* counters);
/* Sets every count of ctx to zero (a benchmark resets after warm-up and reads after the timed
 * steps). Errors: FLAME_ERROR_INVALID_ARGUMENT (ctx NULL), FLAME_ERROR_INVALID_HANDLE. */
FLAME_API flame_status_t flame_ctx_reset_counters(flame_ctx_t ctx);

/* Random number generator state: seed and a counter of values drawn so far. Setting the state
 * replays the same stream (same seed gives the same tensors on any GPU). */
FLAME_API flame_status_t flame_ctx_manual_seed(flame_ctx_t ctx, uint64_t seed);
FLAME_API flame_status_t flame_ctx_get_rng_state(flame_ctx_t ctx, uint64_t* seed, uint64_t* offset);
FLAME_API flame_status_t flame_ctx_set_rng_state(flame_ctx_t ctx, uint64_t seed, uint64_t offset);

/* ============================== Tensor lifetime and queries ============================== */

/* Adds a reference to t. */
FLAME_API flame_status_t flame_tensor_retain(flame_tensor_t t);
/* Drops a reference; the tensor's memory returns to the pool when the last one goes. NULL is a
 * no-op. A released handle is detected (FLAME_ERROR_INVALID_HANDLE) while its context lives. */
FLAME_API void flame_tensor_release(flame_tensor_t t);

/* OUT *ctx: the tensor's context, BORROWED (do not destroy it). */
FLAME_API flame_status_t flame_tensor_context(flame_tensor_t t, flame_ctx_t* ctx);
FLAME_API flame_status_t flame_tensor_dtype(flame_tensor_t t, flame_dtype_t* dtype);
FLAME_API flame_status_t flame_tensor_ndim(flame_tensor_t t, int32_t* ndim);
/* Writes ndim sizes into dims; capacity below ndim: FLAME_ERROR_INVALID_ARGUMENT. */
FLAME_API flame_status_t flame_tensor_shape(flame_tensor_t t, int64_t* dims, int32_t capacity);
/* Writes ndim strides, in elements (may be 0 or negative for views), into strides. */
FLAME_API flame_status_t flame_tensor_strides(flame_tensor_t t, int64_t* strides, int32_t capacity);
FLAME_API flame_status_t flame_tensor_numel(flame_tensor_t t, int64_t* numel);
/* OUT *contiguous: 1 when the elements are dense in row-major order. */
FLAME_API flame_status_t flame_tensor_is_contiguous(flame_tensor_t t, int32_t* contiguous);
/* OUT *ptr: device address of the first element (a CUdeviceptr), BORROWED: valid while t lives.
 * Work on it must be ordered after the context's stream (flame_ctx_stream). */
FLAME_API flame_status_t flame_tensor_data_ptr(flame_tensor_t t, void** ptr);

/* ============================== Handle scopes ============================== */
/* A handle scope releases the tensor handles made while it is open, so that C code does not have to
 * release every intermediate by hand (as an autorelease pool in Objective-C, or a HandleScope in V8):
 *
 *   flame_scope_t s;
 *   flame_scope_begin(ctx, &s);
 *   ... flame_matmul(x, w, &h); flame_relu(h, &a); flame_sum_all(a, &loss); ...
 *   flame_scope_keep(s, loss);      (loss is the caller's again; h and a are not)
 *   flame_scope_end(s);             (releases h and a)
 *
 * Rules:
 *  - What is recorded: every tensor handle that a FLAME call returns to the caller (OUT tensors,
 *    including flame_tensor_grad, flame_detach, flame_safetensors_get, DLPack imports, a LoRA
 *    adapter's factors, the outputs of flame_checkpoint, and tensors made during a CUDA graph
 *    capture) on the calling thread, for a tensor of the scope's context, while the scope is the
 *    innermost one open on that thread for that context. The scope owns the one reference the call
 *    returned. Handles made on other threads, on other contexts, and before the scope began are not
 *    recorded; nor are handles FLAME lends to callbacks (a hook's gradient, a checkpoint function's
 *    inputs), which FLAME releases itself. Failed calls return NULL and record nothing.
 *  - Inside a scope every returned handle is a new handle, also where a function's comment says
 *    "t itself (a new reference)": it refers to the same tensor (same memory, same autograd state),
 *    so the scope can own exactly the reference it returned.
 *  - Scopes nest, per thread and per context: a scope begun while another is open on the same thread
 *    and context is the innermost until it ends; scopes on different threads or contexts are
 *    independent. flame_scope_end must end the innermost scope of its thread and context.
 *  - flame_tensor_retain adds a reference the caller owns; flame_tensor_release drops the caller's
 *    references first and the scope's last: releasing a recorded handle that you did not retain
 *    releases it now and takes it out of its scope (it is not released twice). So code that releases
 *    its intermediates by hand keeps working inside a scope.
 *  - flame_scope_keep takes a handle out of the scope: its reference is the caller's again, exactly
 *    as if no scope had been open. A kept handle is NOT moved to an enclosing scope (unlike V8's
 *    EscapableHandleScope): ownership stays explicit, and a function that returns a kept tensor
 *    returns a new reference, as every FLAME function does. Inside an enclosing scope that should
 *    own it, release it there by hand or make the result in the enclosing scope.
 *  - Callbacks run on the thread that calls into FLAME (hooks during flame_backward, checkpoint
 *    functions): handles they make are recorded in the scope open on that thread. A handle a callback
 *    returns to FLAME (a hook's replacement, a checkpoint function's outputs) may be such a handle:
 *    FLAME releases the reference it is given, which takes it out of the scope. A callback that opens
 *    its own scope must keep what it returns.
 *  - A scope keeps its context alive, as a tensor does: flame_ctx_destroy with scopes open leaves them
 *    open, and ending them later releases their handles. End a thread's scopes before it exits (a
 *    scope left open leaks its handles and its context).
 *  - Cost: recording is O(1) per handle (a lookup of the calling thread's innermost scope and an
 *    append); ending a scope is O(handles it holds). */

typedef struct flame_scope_s* flame_scope_t; /* an open handle scope of one thread and context */

/* Opens a scope on the calling thread for ctx; it becomes the innermost one there.
 * OUT *scope: the scope, valid until flame_scope_end.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (ctx or scope NULL), FLAME_ERROR_INVALID_HANDLE (ctx
 * destroyed), FLAME_ERROR_OUT_OF_MEMORY. */
FLAME_API flame_status_t flame_scope_begin(flame_ctx_t ctx, flame_scope_t* scope);

/* Ends scope: releases every handle it still holds (in the reverse order of their making), then
 * frees the scope. It may be called from any thread, but scope must be the innermost scope open on
 * the thread that began it for its context; ending an outer scope while an inner one is open is an
 * error and changes nothing (end the inner one first). NULL is a no-op (FLAME_OK). An ended scope is
 * detected (FLAME_ERROR_INVALID_HANDLE) while its context lives.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (an inner scope is still open), FLAME_ERROR_INVALID_HANDLE. */
FLAME_API flame_status_t flame_scope_end(flame_scope_t scope);

/* Takes t out of scope: the reference the scope held is the caller's again (release it with
 * flame_tensor_release); t is not recorded in any other scope. May be called from any thread.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (scope or t NULL, t of another context, or t not held by
 * scope: made outside it, kept or released already, or held by another scope),
 * FLAME_ERROR_INVALID_HANDLE (scope ended or t released). */
FLAME_API flame_status_t flame_scope_keep(flame_scope_t scope, flame_tensor_t t);

/* OUT *count: the number of handles scope holds now (made in it, neither kept nor released).
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (scope or count NULL), FLAME_ERROR_INVALID_HANDLE. */
FLAME_API flame_status_t flame_scope_count(flame_scope_t scope, int64_t* count);

/* ============================== Creation ============================== */
/* shape points to ndim sizes (>= 0); ndim 0 makes a 0-d (scalar) tensor and shape may be NULL.
 * Sizes whose product or byte count overflows: FLAME_ERROR_INVALID_ARGUMENT. */

/* Uninitialised memory. */
FLAME_API flame_status_t flame_empty(flame_ctx_t ctx, const int64_t* shape, int32_t ndim, flame_dtype_t dtype, flame_tensor_t* out);
FLAME_API flame_status_t flame_zeros(flame_ctx_t ctx, const int64_t* shape, int32_t ndim, flame_dtype_t dtype, flame_tensor_t* out);
FLAME_API flame_status_t flame_ones(flame_ctx_t ctx, const int64_t* shape, int32_t ndim, flame_dtype_t dtype, flame_tensor_t* out);
FLAME_API flame_status_t flame_full(flame_ctx_t ctx, const int64_t* shape, int32_t ndim, flame_dtype_t dtype, double value, flame_tensor_t* out);
/* Values start, start+step, ... below end (above end for negative step). step 0: error. */
FLAME_API flame_status_t flame_arange(flame_ctx_t ctx, double start, double end, double step, flame_dtype_t dtype, flame_tensor_t* out);
/* steps values evenly from start to end inclusive; steps >= 0. */
FLAME_API flame_status_t flame_linspace(flame_ctx_t ctx, double start, double end, int64_t steps, flame_dtype_t dtype, flame_tensor_t* out);
/* n x m matrix with ones on the diagonal. */
FLAME_API flame_status_t flame_eye(flame_ctx_t ctx, int64_t n, int64_t m, flame_dtype_t dtype, flame_tensor_t* out);
/* Uniform in [0, 1) from the context's Philox generator (floating dtypes only). */
FLAME_API flame_status_t flame_rand(flame_ctx_t ctx, const int64_t* shape, int32_t ndim, flame_dtype_t dtype, flame_tensor_t* out);
/* Standard normal from the context's Philox generator (floating dtypes only). */
FLAME_API flame_status_t flame_randn(flame_ctx_t ctx, const int64_t* shape, int32_t ndim, flame_dtype_t dtype, flame_tensor_t* out);
/* Copies nbytes of host data (row-major, element type dtype; f16/bf16 as their 16-bit patterns,
 * f8 as their 8-bit patterns, bool as one byte 0/1) into a new tensor. nbytes must equal numel * dtype size. */
FLAME_API flame_status_t flame_from_host(flame_ctx_t ctx, const void* data, size_t nbytes, const int64_t* shape, int32_t ndim, flame_dtype_t dtype, flame_tensor_t* out);
/* Copies t (any strides) to host memory in row-major order; waits for the copy.
 * nbytes must equal numel * dtype size: otherwise FLAME_ERROR_INVALID_ARGUMENT. */
FLAME_API flame_status_t flame_to_host(flame_tensor_t t, void* data, size_t nbytes);
/* OUT *value: the single element of a one-element tensor, converted to double; waits. */
FLAME_API flame_status_t flame_tensor_item(flame_tensor_t t, double* value);

/* ============================== Views and shape ops ============================== */
/* Views share memory with their input (no copy); negative dims count from the end.
 * A result (of these or of any op that broadcasts: arithmetic, where, matmul batch dims) with more
 * than 2^63 - 1 elements: FLAME_ERROR_INVALID_ARGUMENT naming the sizes. A broadcast view may hold
 * more elements than its bytes could (it reads its input's few); materialising one then fails the
 * same way when the byte count passes 2^63 - 1. */

/* Same data, new shape; one size may be -1. Copies only when the strides forbid a view. */
FLAME_API flame_status_t flame_reshape(flame_tensor_t t, const int64_t* shape, int32_t ndim, flame_tensor_t* out);
/* As reshape but never copies: FLAME_ERROR_INVALID_ARGUMENT when no view exists. */
FLAME_API flame_status_t flame_view(flame_tensor_t t, const int64_t* shape, int32_t ndim, flame_tensor_t* out);
FLAME_API flame_status_t flame_permute(flame_tensor_t t, const int32_t* dims, int32_t ndim, flame_tensor_t* out);
FLAME_API flame_status_t flame_transpose(flame_tensor_t t, int32_t dim0, int32_t dim1, flame_tensor_t* out);
/* Broadcasts t to shape (NumPy rules; also known as broadcast_to); -1 keeps a size. */
FLAME_API flame_status_t flame_expand(flame_tensor_t t, const int64_t* shape, int32_t ndim, flame_tensor_t* out);
/* Removes dimension dim, which must have size 1. */
FLAME_API flame_status_t flame_squeeze(flame_tensor_t t, int32_t dim, flame_tensor_t* out);
/* Removes every dimension of size 1. */
FLAME_API flame_status_t flame_squeeze_all(flame_tensor_t t, flame_tensor_t* out);
FLAME_API flame_status_t flame_unsqueeze(flame_tensor_t t, int32_t dim, flame_tensor_t* out);
/* Elements start .. start+length-1 of dim. */
FLAME_API flame_status_t flame_narrow(flame_tensor_t t, int32_t dim, int64_t start, int64_t length, flame_tensor_t* out);
/* Python-style slice start:end:step of dim (step > 0; start/end clamped, negative from the end). */
FLAME_API flame_status_t flame_slice(flame_tensor_t t, int32_t dim, int64_t start, int64_t end, int64_t step, flame_tensor_t* out);
/* Index index of dim, removing the dimension. */
FLAME_API flame_status_t flame_select(flame_tensor_t t, int32_t dim, int64_t index, flame_tensor_t* out);
/* Reverses the listed dims (a view with negative strides). */
FLAME_API flame_status_t flame_flip(flame_tensor_t t, const int32_t* dims, int32_t ndims, flame_tensor_t* out);
/* The diagonal of dims dim1 and dim2 with offset, as a new last dimension. */
FLAME_API flame_status_t flame_diagonal(flame_tensor_t t, int64_t offset, int32_t dim1, int32_t dim2, flame_tensor_t* out);
/* t itself (new reference) when contiguous, else a contiguous copy. */
FLAME_API flame_status_t flame_contiguous(flame_tensor_t t, flame_tensor_t* out);
/* A contiguous copy with its own memory. */
FLAME_API flame_status_t flame_clone(flame_tensor_t t, flame_tensor_t* out);
/* Converts to dtype (a copy; t itself as a new reference when the dtype is already dtype). Any
 * dtype to any other, f8 included (see flame_dtype_t for their rounding, NaN and overflow rules). */
FLAME_API flame_status_t flame_to_dtype(flame_tensor_t t, flame_dtype_t dtype, flame_tensor_t* out);
/* Joins n tensors along dim; all other sizes must agree; dtypes are promoted. */
FLAME_API flame_status_t flame_cat(const flame_tensor_t* tensors, int32_t n, int32_t dim, flame_tensor_t* out);
/* Joins n equal-shaped tensors along a new dim. */
FLAME_API flame_status_t flame_stack(const flame_tensor_t* tensors, int32_t n, int32_t dim, flame_tensor_t* out);
/* Views of consecutive pieces of split_size along dim (the last may be smaller). Writes up to
 * capacity handles (new references) into outs and OUT *count the number of pieces; capacity below
 * the number of pieces: FLAME_ERROR_INVALID_ARGUMENT and nothing is written. */
FLAME_API flame_status_t flame_split(flame_tensor_t t, int64_t split_size, int32_t dim, flame_tensor_t* outs, int32_t capacity, int32_t* count);
/* Views of pieces with the given sizes (summing to the size of dim). */
FLAME_API flame_status_t flame_split_sizes(flame_tensor_t t, const int64_t* sizes, int32_t n, int32_t dim, flame_tensor_t* outs);
/* chunks views of ceil(size/chunks) elements each (fewer when they run out), as torch.chunk. */
FLAME_API flame_status_t flame_chunk(flame_tensor_t t, int32_t chunks, int32_t dim, flame_tensor_t* outs, int32_t capacity, int32_t* count);
/* Upper / lower triangle of the last two dims; diagonal shifts it (0: main diagonal). */
FLAME_API flame_status_t flame_triu(flame_tensor_t t, int64_t diagonal, flame_tensor_t* out);
FLAME_API flame_status_t flame_tril(flame_tensor_t t, int64_t diagonal, flame_tensor_t* out);

/* ============================== Elementwise ============================== */
/* Binary ops broadcast (NumPy rules) and promote dtypes (bool < u8 < i32 < i64 < f16,bf16 < f32 <
 * f64; f16 with bf16 gives f32). Math functions on integer inputs give f32. Comparisons and logical
 * ops give bool. Any strides are accepted. Arithmetic on bool tensors: FLAME_ERROR_DTYPE_MISMATCH. */

FLAME_API flame_status_t flame_add(flame_tensor_t a, flame_tensor_t b, flame_tensor_t* out);
FLAME_API flame_status_t flame_sub(flame_tensor_t a, flame_tensor_t b, flame_tensor_t* out);
FLAME_API flame_status_t flame_mul(flame_tensor_t a, flame_tensor_t b, flame_tensor_t* out);
/* True division: integer inputs give f32, so an integer divided by 0 gives +-inf or NaN as in
 * torch.div (FLAME has no integer-result division that could produce a garbage value). */
FLAME_API flame_status_t flame_div(flame_tensor_t a, flame_tensor_t b, flame_tensor_t* out);
FLAME_API flame_status_t flame_pow(flame_tensor_t a, flame_tensor_t b, flame_tensor_t* out);
/* Elementwise max / min; NaN propagates. */
FLAME_API flame_status_t flame_maximum(flame_tensor_t a, flame_tensor_t b, flame_tensor_t* out);
FLAME_API flame_status_t flame_minimum(flame_tensor_t a, flame_tensor_t b, flame_tensor_t* out);
FLAME_API flame_status_t flame_eq(flame_tensor_t a, flame_tensor_t b, flame_tensor_t* out);
FLAME_API flame_status_t flame_ne(flame_tensor_t a, flame_tensor_t b, flame_tensor_t* out);
FLAME_API flame_status_t flame_lt(flame_tensor_t a, flame_tensor_t b, flame_tensor_t* out);
FLAME_API flame_status_t flame_le(flame_tensor_t a, flame_tensor_t b, flame_tensor_t* out);
FLAME_API flame_status_t flame_gt(flame_tensor_t a, flame_tensor_t b, flame_tensor_t* out);
FLAME_API flame_status_t flame_ge(flame_tensor_t a, flame_tensor_t b, flame_tensor_t* out);
/* Nonzero counts as true; the result is bool. */
FLAME_API flame_status_t flame_logical_and(flame_tensor_t a, flame_tensor_t b, flame_tensor_t* out);
FLAME_API flame_status_t flame_logical_or(flame_tensor_t a, flame_tensor_t b, flame_tensor_t* out);
FLAME_API flame_status_t flame_logical_not(flame_tensor_t t, flame_tensor_t* out);
/* cond ? a : b, broadcasting all three; cond must be bool. */
FLAME_API flame_status_t flame_where(flame_tensor_t cond, flame_tensor_t a, flame_tensor_t b, flame_tensor_t* out);
/* Clamps into [lo, hi]; pass -INFINITY / INFINITY for no bound. NaN stays NaN. */
FLAME_API flame_status_t flame_clamp(flame_tensor_t t, double lo, double hi, flame_tensor_t* out);

/* Tensor-scalar forms: t op s. sub_scalar is t - s; rsub_scalar is s - t. */
FLAME_API flame_status_t flame_add_scalar(flame_tensor_t t, double s, flame_tensor_t* out);
FLAME_API flame_status_t flame_sub_scalar(flame_tensor_t t, double s, flame_tensor_t* out);
FLAME_API flame_status_t flame_rsub_scalar(flame_tensor_t t, double s, flame_tensor_t* out);
FLAME_API flame_status_t flame_mul_scalar(flame_tensor_t t, double s, flame_tensor_t* out);
FLAME_API flame_status_t flame_div_scalar(flame_tensor_t t, double s, flame_tensor_t* out);
FLAME_API flame_status_t flame_pow_scalar(flame_tensor_t t, double s, flame_tensor_t* out);

FLAME_API flame_status_t flame_neg(flame_tensor_t t, flame_tensor_t* out);
FLAME_API flame_status_t flame_abs(flame_tensor_t t, flame_tensor_t* out);
FLAME_API flame_status_t flame_exp(flame_tensor_t t, flame_tensor_t* out);
FLAME_API flame_status_t flame_log(flame_tensor_t t, flame_tensor_t* out);
FLAME_API flame_status_t flame_log1p(flame_tensor_t t, flame_tensor_t* out);
FLAME_API flame_status_t flame_expm1(flame_tensor_t t, flame_tensor_t* out);
FLAME_API flame_status_t flame_sqrt(flame_tensor_t t, flame_tensor_t* out);
FLAME_API flame_status_t flame_rsqrt(flame_tensor_t t, flame_tensor_t* out);
FLAME_API flame_status_t flame_sin(flame_tensor_t t, flame_tensor_t* out);
FLAME_API flame_status_t flame_cos(flame_tensor_t t, flame_tensor_t* out);
FLAME_API flame_status_t flame_tanh(flame_tensor_t t, flame_tensor_t* out);
FLAME_API flame_status_t flame_sigmoid(flame_tensor_t t, flame_tensor_t* out);
FLAME_API flame_status_t flame_relu(flame_tensor_t t, flame_tensor_t* out);
FLAME_API flame_status_t flame_silu(flame_tensor_t t, flame_tensor_t* out);
/* x for x > 0, slope * x otherwise. */
FLAME_API flame_status_t flame_leaky_relu(flame_tensor_t t, double slope, flame_tensor_t* out);
/* x for x > 0, alpha * (exp(x) - 1) otherwise. */
FLAME_API flame_status_t flame_elu(flame_tensor_t t, double alpha, flame_tensor_t* out);
/* GELU; approximate 0: exact (erf), 1: tanh approximation. */
FLAME_API flame_status_t flame_gelu(flame_tensor_t t, int32_t approximate, flame_tensor_t* out);
/* log(1 + exp(beta x)) / beta, and x where beta x > threshold (PyTorch's softplus). */
FLAME_API flame_status_t flame_softplus(flame_tensor_t t, double beta, double threshold, flame_tensor_t* out);
FLAME_API flame_status_t flame_floor(flame_tensor_t t, flame_tensor_t* out);
FLAME_API flame_status_t flame_ceil(flame_tensor_t t, flame_tensor_t* out);
/* Rounds half to even, as PyTorch. */
FLAME_API flame_status_t flame_round(flame_tensor_t t, flame_tensor_t* out);
FLAME_API flame_status_t flame_sign(flame_tensor_t t, flame_tensor_t* out);
FLAME_API flame_status_t flame_reciprocal(flame_tensor_t t, flame_tensor_t* out);
FLAME_API flame_status_t flame_square(flame_tensor_t t, flame_tensor_t* out);
FLAME_API flame_status_t flame_isnan(flame_tensor_t t, flame_tensor_t* out);
FLAME_API flame_status_t flame_isinf(flame_tensor_t t, flame_tensor_t* out);

/* ============================== Fused elementwise expressions ============================== */
/* A chain of elementwise math written as one expression and run as one kernel (compiled at run time
 * by NVRTC through the context's kernel cache), forward and backward: gelu-tanh or adaLN modulation
 * read their inputs and write their result once instead of once per op. The gradient of each input
 * is another fused kernel made from the expression's symbolic derivative, itself differentiable, so
 * FLAME_BACKWARD_CREATE_GRAPH works to any order.
 *
 * Expressions over the inputs x0 .. x{n_inputs-1}: decimal numbers (1, 0.5, 4.4715e-2), + - * /,
 * unary minus, parentheses, and the functions exp log sqrt rsqrt tanh sigmoid sin cos abs sign erf,
 * pow(e, number) (the exponent a literal), min(a, b) and max(a, b) (NaN propagates; at a tie each
 * side gets half of the gradient, as torch.maximum). Whitespace is ignored. Examples:
 *   "0.5 * x0 * (1 + tanh(0.7978845608028654 * (x0 + 0.044715 * x0 * x0 * x0)))"   (gelu, tanh form)
 *   "x0 * (1 + x1) + x2"                                                              (adaLN modulation)
 * The expression is simplified once (constants folded; x * 1, x + 0, x * 0 -> 0), so that results may
 * differ from the same ops run one by one in the last bits (one rounding for the whole expression in
 * the compute type instead of one per op). */

typedef struct flame_fused_s* flame_fused_t; /* a compiled expression, bound to one context */

/* The most inputs an expression may have. */
#define FLAME_FUSED_MAX_INPUTS 8

/* Parses expr (borrowed; NUL-terminated, at most 4096 characters, nesting at most 64 deep) over
 * n_inputs in [1, FLAME_FUSED_MAX_INPUTS] inputs. Kernels are compiled at the first call for each
 * dtype and memory layout. OUT *out: a new function of ctx; release it with flame_fused_release (it
 * keeps the context alive, as tensors do).
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (ctx, expr or out NULL; n_inputs out of range; a syntax error,
 * an unknown name, an input x<k> with k >= n_inputs, a non-literal pow exponent: the message gives the
 * 1-based column and what was expected there), FLAME_ERROR_INVALID_HANDLE (ctx destroyed). */
FLAME_API flame_status_t flame_fused_compile(flame_ctx_t ctx, const char* expr, int32_t n_inputs, flame_fused_t* out);

/* Applies fn to inputs[0..n) (borrowed), n equal to fn's n_inputs. Inputs broadcast together (NumPy
 * rules) and promote as the binary ops (bool < u8 < i32 < i64 < f16,bf16 < f32 < f64); integer and
 * bool inputs compute in f32; f16 and bf16 compute in f32 and round once, f64 computes in f64. Any
 * strides. OUT *out: a new tensor of the broadcast shape and the promoted dtype. With grad mode on and
 * an input that requires grad, one node records the call (plus the casts and broadcasts, whose
 * gradients are summed back as for every op).
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (fn, inputs or out NULL, an element of inputs NULL, n not
 * fn's n_inputs, an input of another context than fn), FLAME_ERROR_INVALID_HANDLE (fn or an input
 * released), FLAME_ERROR_SHAPE_MISMATCH (shapes that do not broadcast), FLAME_ERROR_UNSUPPORTED (a
 * derivative of very high order that would need more than 16 operands), FLAME_ERROR_KERNEL_COMPILE. */
FLAME_API flame_status_t flame_fused_call(flame_fused_t fn, const flame_tensor_t* inputs, int32_t n, flame_tensor_t* out);

/* Releases fn. Nodes recorded by its calls keep what their backward needs, so graphs built with fn
 * stay differentiable. NULL is a no-op; a released handle is detected (nothing happens) while its
 * context lives. */
FLAME_API void flame_fused_release(flame_fused_t fn);

/* ============================== Reductions ============================== */
/* dims lists ndims axes (negative counts from the end); dims NULL with ndims 0 reduces all axes.
 * keepdim != 0 keeps reduced axes with size 1. f16/bf16 accumulate in f32; integer and bool sums
 * give i64. Reducing an empty axis: sum 0, prod 1, mean NaN; max/min/argmax/argmin error. */

FLAME_API flame_status_t flame_sum(flame_tensor_t t, const int32_t* dims, int32_t ndims, int32_t keepdim, flame_tensor_t* out);
FLAME_API flame_status_t flame_mean(flame_tensor_t t, const int32_t* dims, int32_t ndims, int32_t keepdim, flame_tensor_t* out);
FLAME_API flame_status_t flame_prod(flame_tensor_t t, const int32_t* dims, int32_t ndims, int32_t keepdim, flame_tensor_t* out);
/* Max / min values (gradient split evenly between ties, as torch.amax). NaN propagates. */
FLAME_API flame_status_t flame_max(flame_tensor_t t, const int32_t* dims, int32_t ndims, int32_t keepdim, flame_tensor_t* out);
FLAME_API flame_status_t flame_min(flame_tensor_t t, const int32_t* dims, int32_t ndims, int32_t keepdim, flame_tensor_t* out);
/* Variance / standard deviation with the given correction (1: unbiased, 0: population). */
FLAME_API flame_status_t flame_var(flame_tensor_t t, const int32_t* dims, int32_t ndims, double correction, int32_t keepdim, flame_tensor_t* out);
FLAME_API flame_status_t flame_std(flame_tensor_t t, const int32_t* dims, int32_t ndims, double correction, int32_t keepdim, flame_tensor_t* out);
/* Vector norm with p = 1, 2 or INFINITY. */
FLAME_API flame_status_t flame_norm(flame_tensor_t t, double p, const int32_t* dims, int32_t ndims, int32_t keepdim, flame_tensor_t* out);
FLAME_API flame_status_t flame_logsumexp(flame_tensor_t t, const int32_t* dims, int32_t ndims, int32_t keepdim, flame_tensor_t* out);

/* Pass as dim to argmax/argmin to search the flattened tensor. */
#define FLAME_DIM_ALL (-2147483647 - 1)
/* Index (i64) of the first maximum / minimum along dim; NaN counts as the maximum. */
FLAME_API flame_status_t flame_argmax(flame_tensor_t t, int32_t dim, int32_t keepdim, flame_tensor_t* out);
FLAME_API flame_status_t flame_argmin(flame_tensor_t t, int32_t dim, int32_t keepdim, flame_tensor_t* out);
/* Inclusive prefix sum along dim (integer inputs give i64). */
FLAME_API flame_status_t flame_cumsum(flame_tensor_t t, int32_t dim, flame_tensor_t* out);
/* 0-d results over all elements. */
FLAME_API flame_status_t flame_sum_all(flame_tensor_t t, flame_tensor_t* out);
FLAME_API flame_status_t flame_max_all(flame_tensor_t t, flame_tensor_t* out);
FLAME_API flame_status_t flame_min_all(flame_tensor_t t, flame_tensor_t* out);

/* ============================== Indexing ============================== */
/* Index tensors hold i64 or i32 values. They are checked on the device like class indices (see
 * Losses): an index out of range makes its element NaN (0 for integer data) and is reported by the
 * next call that synchronises, as FLAME_ERROR_INVALID_ARGUMENT naming the op, the index and its
 * position. Data may have any strides; results are new contiguous tensors. Gradients flow to
 * floating data, never to indices. Negative dims count from the end.
 * Accumulation is not deterministic: flame_scatter_add, flame_index_add and the backward of
 * flame_gather, flame_index_select and flame_embedding add with atomics, so floating results may
 * differ in their last bits between runs (as PyTorch's CUDA index_add_ and scatter_add_);
 * f16/bf16 accumulate in f32. */

/* Pass as padding_idx to flame_embedding for no padding row. */
#define FLAME_NO_PADDING (-9223372036854775807LL - 1)

/* out[..., k, ...] = t[..., index[k], ...] along dim. index: 1-D (or 0-d), values in [0, size of
 * dim). out has t's shape with size numel(index) along dim; t (any dtype) has at least one dim.
 * Errors: FLAME_ERROR_DTYPE_MISMATCH (index not i64/i32), FLAME_ERROR_SHAPE_MISMATCH (index not
 * 1-D), FLAME_ERROR_INVALID_ARGUMENT (dim out of range, 0-d t). */
FLAME_API flame_status_t flame_index_select(flame_tensor_t t, int32_t dim, flame_tensor_t index, flame_tensor_t* out);
/* torch.gather: out has index's shape and out[i][j] = t[i][index[i][j]] for dim 1 (likewise for any
 * dim). index has as many dims as t and no larger size than t on the other dims. Errors as
 * flame_index_select (SHAPE_MISMATCH when index does not fit t). */
FLAME_API flame_status_t flame_gather(flame_tensor_t t, int32_t dim, flame_tensor_t index, flame_tensor_t* out);
/* torch.scatter_add, out of place: out = t, then out[i][index[i][j]] += src[i][j] for dim 1
 * (likewise for any dim). src has index's shape and t's dtype (floating, i32 or i64); index fits t
 * as for flame_gather. Gradients flow to t and src. */
FLAME_API flame_status_t flame_scatter_add(flame_tensor_t t, int32_t dim, flame_tensor_t index, flame_tensor_t src,
                                           flame_tensor_t* out);
/* torch.index_add, out of place: out = t, then out[..., index[k], ...] += alpha * source[..., k, ...].
 * index: 1-D; source: t's shape with size numel(index) along dim and t's dtype (floating, i32, i64);
 * alpha finite, and whole for integer tensors. Gradients flow to t and source. */
FLAME_API flame_status_t flame_index_add(flame_tensor_t t, int32_t dim, flame_tensor_t index, flame_tensor_t source, double alpha,
                                         flame_tensor_t* out);
/* value where mask (bool, broadcast to t's shape; it may not enlarge it) is true, t elsewhere.
 * value must be finite for integer t. Differentiable with respect to t. */
FLAME_API flame_status_t flame_masked_fill(flame_tensor_t t, flame_tensor_t mask, double value, flame_tensor_t* out);
/* An i64 tensor of shape [index's shape..., num_classes] holding 1 where the last coordinate equals
 * the index value, else 0. num_classes: >= 1, or -1 for max(index) + 1 (this waits for the device).
 * Not differentiable. */
FLAME_API flame_status_t flame_one_hot(flame_tensor_t index, int64_t num_classes, flame_tensor_t* out);
/* Rows of weight [V, D] (any dtype) at indices (any shape, values in [0, V)): out has shape
 * [indices' shape..., D]. padding_idx (in [-V, V); negative counts from the end) names a row whose
 * gradient stays zero, as in PyTorch; FLAME_NO_PADDING for none. */
FLAME_API flame_status_t flame_embedding(flame_tensor_t weight, flame_tensor_t indices, int64_t padding_idx, flame_tensor_t* out);

/* ---- scatter, masked_select, repeat, pad ---- */
/* More indexing ops, with the conventions of this section's start: index tensors hold i64 or i32 values
 * checked on the device (a bad one is reported by the next call that synchronises), data may have any
 * strides, negative dims count from the end, gradients flow to floating data only. Results are new
 * contiguous tensors that share no memory with the inputs. */

/* torch.scatter, out of place: out = t, then out[i][index[i][j]] = src[i][j] for dim 1 (likewise for
 * any dim). t: any dtype, at least one dim; index fits t as for flame_gather; src has t's dtype, as
 * many dims as index and at least index's size on every dim (only that leading part of src is read).
 * Where index names one position more than once along dim, which of those src values lands there is
 * unspecified (as in PyTorch on CUDA). Gradients: t's is the incoming gradient with every scattered
 * position set to 0; src's is the incoming gradient gathered at index (for repeated positions too).
 * An out-of-range index is reported at the next synchronisation and its element not written.
 * Errors: FLAME_ERROR_DTYPE_MISMATCH (index not i64/i32, src's dtype), FLAME_ERROR_SHAPE_MISMATCH
 * (index does not fit t, src smaller than index), FLAME_ERROR_INVALID_ARGUMENT (dim out of range, 0-d
 * t, tensors of different contexts). */
FLAME_API flame_status_t flame_scatter(flame_tensor_t t, int32_t dim, flame_tensor_t index, flame_tensor_t src,
                                       flame_tensor_t* out);
/* torch.masked_select: the elements of t where mask (bool) is true, in row-major order, as a new 1-D
 * tensor; t and mask broadcast together (NumPy rules). The result's length depends on the mask's
 * values, so this call WAITS for the device (a device-to-host copy of the count), as PyTorch does.
 * Differentiable with respect to t: the gradient goes back to the selected positions, 0 elsewhere.
 * Errors: FLAME_ERROR_DTYPE_MISMATCH (mask not bool), FLAME_ERROR_SHAPE_MISMATCH (no broadcast),
 * FLAME_ERROR_INVALID_ARGUMENT (tensors of different contexts). */
FLAME_API flame_status_t flame_masked_select(flame_tensor_t t, flame_tensor_t mask, flame_tensor_t* out);
/* torch.Tensor.repeat: t tiled repeats[d] times along each dim d. repeats holds n counts (>= 0), one
 * per dim of t or more (n <= FLAME_MAX_DIMS): with n > ndim(t), t is first viewed with n - ndim(t)
 * leading dims of size 1. The gradient sums the tiles. Errors: FLAME_ERROR_INVALID_ARGUMENT (repeats
 * NULL, n < ndim(t) or > FLAME_MAX_DIMS, a negative count, a result whose size overflows). */
FLAME_API flame_status_t flame_repeat(flame_tensor_t t, const int64_t* repeats, int32_t n, flame_tensor_t* out);
/* torch.repeat_interleave with an integer count: each element of t repeated `repeats` (>= 0) times
 * in a row along dim; dim FLAME_DIM_ALL flattens t first (PyTorch's dim=None) and the result is 1-D.
 * The gradient sums the copies. Errors: FLAME_ERROR_INVALID_ARGUMENT (negative repeats, dim out of
 * range, a result whose size overflows). */
FLAME_API flame_status_t flame_repeat_interleave(flame_tensor_t t, int64_t repeats, int32_t dim, flame_tensor_t* out);

/* Modes of flame_pad. */
typedef enum flame_pad_mode_t {
  FLAME_PAD_CONSTANT = 0,  /* the value: [a b c] padded (2, 1) -> [v v a b c v] */
  FLAME_PAD_REFLECT = 1,   /* mirrored at the edge, which is not repeated: -> [c b a b c b] */
  FLAME_PAD_REPLICATE = 2  /* the edge repeated: -> [a a a b c c] */
} flame_pad_mode_t;

/* torch.nn.functional.pad. pads holds npads amounts (npads even, >= 2): (left, right) of the last dim,
 * then (left, right) of the dim before it, and so on. A negative amount removes that many elements
 * (a crop), as in PyTorch. mode is a flame_pad_mode_t: CONSTANT pads any number of trailing dims
 * (npads <= 2 ndim(t)) with value (finite for integer t; converted to t's dtype); REFLECT and
 * REPLICATE pad the last 1 to 3 dims (npads 2, 4 or 6, and at most 2 ndim(t); unlike PyTorch no batch
 * dim is required), REFLECT with amounts smaller than the dim's size, REPLICATE on non-empty dims.
 * Any dtype. The gradient flows back to t; for REFLECT and REPLICATE it is accumulated with atomics
 * (the last bits may vary between runs, as in PyTorch). Errors: FLAME_ERROR_INVALID_ARGUMENT (pads
 * NULL, npads odd, 0 or too large, an unknown mode, a crop larger than its dim, a reflect amount not
 * below the dim's size, value not finite for integer t). */
FLAME_API flame_status_t flame_pad(flame_tensor_t t, const int64_t* pads, int32_t npads, int32_t mode, double value,
                                   flame_tensor_t* out);

/* ============================== Matrix products ============================== */
/* On cuBLASLt, with f32 accumulation for f16/bf16. Both operands must have the same dtype (f32,
 * f64, f16 or bf16; otherwise FLAME_ERROR_DTYPE_MISMATCH) and context. f32 is IEEE unless the
 * context was created with allow_tf32. Transposed and permuted views are read in place (no copy)
 * wherever a GEMM layout can express them. OUT *out: a new reference, contiguous; NULL on failure.
 * Wrong sizes: FLAME_ERROR_SHAPE_MISMATCH. Inputs that require grad give a differentiable result. */

/* NumPy/PyTorch matmul: 1-D x 1-D is a dot product (0-d result); a 1-D left (right) operand is a
 * row (column) vector whose dim is removed from the result; batch dims (all but the last two)
 * broadcast. */
FLAME_API flame_status_t flame_matmul(flame_tensor_t a, flame_tensor_t b, flame_tensor_t* out);
/* Batched product of a [B, M, K] and b [B, K, N] (no broadcasting, as torch.bmm). */
FLAME_API flame_status_t flame_bmm(flame_tensor_t a, flame_tensor_t b, flame_tensor_t* out);

/* Activation applied by flame_linear inside the GEMM's epilogue. */
typedef enum flame_activation_t {
  FLAME_ACTIVATION_NONE = 0,
  FLAME_ACTIVATION_RELU = 1,
  FLAME_ACTIVATION_GELU_TANH = 2 /* gelu with the tanh approximation (flame_gelu approximate=1) */
} flame_activation_t;

/* out = activation(x @ weight^T + bias) for x [..., in], weight [out, in], bias [out] (borrowed;
 * may be NULL), as torch.nn.functional.linear followed by the activation. The bias and activation
 * are fused into the GEMM where cuBLASLt supports it, else computed by separate kernels with the
 * same result (to rounding). Backward takes the bias gradient out of the weight-gradient GEMM.
 * activation not a flame_activation_t value: FLAME_ERROR_INVALID_ARGUMENT. */
FLAME_API flame_status_t flame_linear(flame_tensor_t x, flame_tensor_t weight, flame_tensor_t bias, int32_t activation,
                                      flame_tensor_t* out);

/* ============================== Neural networks: softmax and normalisation ============================== */
/* Fused kernels with fused backward (first order) and differentiable backward (create_graph). x must
 * be floating (otherwise FLAME_ERROR_DTYPE_MISMATCH); any strides are accepted; f16/bf16 compute in
 * f32. weight, bias and running statistics, when given, must have x's context (otherwise
 * FLAME_ERROR_INVALID_ARGUMENT), x's dtype (FLAME_ERROR_DTYPE_MISMATCH) and the documented shape
 * (FLAME_ERROR_SHAPE_MISMATCH). eps must be finite and >= 0. OUT *out: a new reference of x's shape
 * and dtype. On any error *out is NULL and nothing changes (running statistics included). */

/* exp(x - max) / sum(exp(x - max)) along dim (negative counts from the end; a 0-d x takes dim 0 or
 * -1). A dim out of range: FLAME_ERROR_INVALID_ARGUMENT. */
FLAME_API flame_status_t flame_softmax(flame_tensor_t x, int32_t dim, flame_tensor_t* out);
/* x - max - log(sum(exp(x - max))) along dim, as flame_softmax. */
FLAME_API flame_status_t flame_log_softmax(flame_tensor_t x, int32_t dim, flame_tensor_t* out);

/* (x - mean) / sqrt(var + eps) * weight + bias over the last ndims dims of x, which must equal
 * normalized_shape[0..ndims-1] (1 <= ndims <= FLAME_MAX_DIMS, else FLAME_ERROR_INVALID_ARGUMENT; a
 * mismatch: FLAME_ERROR_SHAPE_MISMATCH). var is the biased variance, as torch.nn.functional.layer_norm.
 * weight and bias have shape normalized_shape; each may be NULL (no scale / no shift). */
FLAME_API flame_status_t flame_layer_norm(flame_tensor_t x, const int64_t* normalized_shape, int32_t ndims,
                                          flame_tensor_t weight, flame_tensor_t bias, double eps, flame_tensor_t* out);
/* x / sqrt(mean(x^2) + eps) * weight over the last ndims dims, as flame_layer_norm (weight may be
 * NULL). PyTorch's default eps is the dtype's epsilon: pass it explicitly (e.g. 1.1920929e-07 for f32). */
FLAME_API flame_status_t flame_rms_norm(flame_tensor_t x, const int64_t* normalized_shape, int32_t ndims,
                                        flame_tensor_t weight, double eps, flame_tensor_t* out);
/* Group normalisation of x [N, C, *] (channels_last 0) or [N, *, C] (channels_last 1; the result is
 * channels-last too): the C channels form num_groups groups of C / num_groups consecutive channels,
 * each (sample, group) is normalised over its channels and spatial positions, then scaled and
 * shifted per channel by weight [C] and bias [C] (each may be NULL). x needs at least 2 dims
 * (FLAME_ERROR_SHAPE_MISMATCH); num_groups must be positive and divide C, channels_last 0 or 1
 * (FLAME_ERROR_INVALID_ARGUMENT). */
FLAME_API flame_status_t flame_group_norm(flame_tensor_t x, int32_t num_groups, flame_tensor_t weight, flame_tensor_t bias,
                                          double eps, int32_t channels_last, flame_tensor_t* out);
/* Batch normalisation of x [N, C, *] per channel, as torch.nn.functional.batch_norm.
 * training != 0: normalises with the batch statistics (biased variance) and, when running_mean and
 * running_var are given, updates them IN PLACE: r = (1 - momentum) * r + momentum * s, with the
 * unbiased variance for running_var; needs more than one value per channel (N * spatial > 1, else
 * FLAME_ERROR_INVALID_ARGUMENT). training == 0: normalises with running_mean and running_var, which
 * must be given. running_mean and running_var [C] are both given or both NULL, borrowed, and must
 * not require grad (FLAME_ERROR_INVALID_ARGUMENT). weight [C] and bias [C] may be NULL. The gradient
 * flows to x, weight and bias (in eval mode the statistics are constants). */
FLAME_API flame_status_t flame_batch_norm(flame_tensor_t x, flame_tensor_t running_mean, flame_tensor_t running_var,
                                          flame_tensor_t weight, flame_tensor_t bias, int32_t training, double momentum,
                                          double eps, flame_tensor_t* out);

/* ============================== Convolution ============================== */
/* torch.nn.functional.conv2d, conv1d and conv_transpose2d. Shapes are logical NCHW as in PyTorch:
 * x [N, C, H, W] (conv1d: [N, C, L]), weight [O, C / groups, kh, kw] ([O, C / groups, k]), bias [O];
 * conv_transpose2d: x [N, C_in, H, W], weight [C_in, C_out / groups, kh, kw], bias [C_out].
 * Channels-last is a memory format, not a shape: an x or weight whose strides are those of a dense
 * [N, H, W, C] tensor (channel stride 1; e.g. flame_permute by {0, 3, 1, 2} of a contiguous NHWC
 * tensor) is read in place and the result is channels-last too (as PyTorch does); any other strides
 * are read through an internal channels-last copy and give a contiguous result. Channels-last is
 * the fast layout.
 *
 * x, weight and bias are BORROWED; bias may be NULL (no bias); opts may be NULL (the defaults of
 * flame_conv_options_init). All three tensors must share a context (FLAME_ERROR_INVALID_ARGUMENT)
 * and a floating dtype: f32, f64, f16 or bf16 (FLAME_ERROR_DTYPE_MISMATCH). f16/bf16 run on tensor
 * cores (sm_80 and newer) with f32 accumulation; f32 is computed in IEEE f32 FMAs (TF32 only through
 * cuDNN in a context with allow_tf32), f64 in f64. OUT *out: a new reference; NULL on any error, and
 * nothing else changes. When libcudnn.so.9 is installed, f32/f16/bf16 convolutions (and their
 * gradients) run through cuDNN, else through FLAME's own kernels; see the "cuDNN" section.
 * Gradients flow to x, weight and bias, to any order (each convolution's backward is made of
 * convolutions). Results are deterministic (every sum in a fixed order; only cuDNN's deterministic
 * algorithms).
 * Errors: wrong ranks, x without channels, a weight shape that does not fit x and groups, a bias
 * that is not [O] (conv_transpose2d: [C_out]), an empty output: FLAME_ERROR_SHAPE_MISMATCH;
 * groups < 1 or not dividing the channels of x, stride or dilation < 1, padding or output_padding
 * < 0, output_padding not 0 outside conv_transpose2d, padding_same with a stride other than 1 or
 * with conv_transpose2d, padding_same not 0 or 1, a size above 2^31 - 1, opts->struct_size out of
 * range: FLAME_ERROR_INVALID_ARGUMENT; the message names the argument. */

/* Options of the convolutions. Fill with flame_conv_options_init, then change fields. The struct
 * may grow at its end; the library reads only struct_size bytes of it. Pairs are (rows, columns);
 * conv1d reads element 0 of each pair. */
typedef struct flame_conv_options_t {
  size_t struct_size;        /* sizeof(flame_conv_options_t), set by flame_conv_options_init */
  int64_t stride[2];         /* default {1, 1}; >= 1 */
  int64_t padding[2];        /* zeros added before and after each spatial dim; default {0, 0}; >= 0 */
  int64_t dilation[2];       /* spacing of the kernel taps; default {1, 1}; >= 1 */
  int64_t groups;            /* default 1; divides C (and O); groups == C with weight [C, 1, kh, kw] is depthwise */
  int64_t output_padding[2]; /* conv_transpose2d only (must be 0 otherwise): extra rows / columns at the
                                end of the output; default {0, 0}; below max(stride, dilation) per dim */
  int32_t padding_same;      /* 1: PyTorch's padding='same' (stride 1 only, not for conv_transpose2d):
                                the output has x's size; each dim is padded by dilation * (k - 1) in
                                all, half before and the rest (one more when odd) after; padding is
                                then ignored. Default 0 */
} flame_conv_options_t;

/* Sets opts to the defaults above. opts NULL: FLAME_ERROR_INVALID_ARGUMENT. */
FLAME_API flame_status_t flame_conv_options_init(flame_conv_options_t* opts);

/* 2-D convolution (cross-correlation, as PyTorch): out [N, O, H_out, W_out] with
 * H_out = (H + 2 padding[0] - dilation[0] (kh - 1) - 1) / stride[0] + 1 (rounded down; likewise W_out);
 * out[n, o] = bias[o] + sum over the C / groups channels of o's group and the kernel taps. */
FLAME_API flame_status_t flame_conv2d(flame_tensor_t x, flame_tensor_t weight, flame_tensor_t bias,
                                      const flame_conv_options_t* opts, flame_tensor_t* out);
/* 2-D transposed convolution (the gradient of flame_conv2d with respect to its input, plus bias):
 * out [N, C_out, H_out, W_out], C_out = groups * weight's dim 1,
 * H_out = (H - 1) stride[0] - 2 padding[0] + dilation[0] (kh - 1) + output_padding[0] + 1. */
FLAME_API flame_status_t flame_conv_transpose2d(flame_tensor_t x, flame_tensor_t weight, flame_tensor_t bias,
                                                const flame_conv_options_t* opts, flame_tensor_t* out);
/* 1-D convolution of x [N, C, L] with weight [O, C / groups, k]: out [N, O, L_out], computed as
 * flame_conv2d of the [N, C, 1, L] view; channels-last means channel stride 1 here. */
FLAME_API flame_status_t flame_conv1d(flame_tensor_t x, flame_tensor_t weight, flame_tensor_t bias,
                                      const flame_conv_options_t* opts, flame_tensor_t* out);

/* ============================== Attention ============================== */
/* Scaled-dot-product attention with the semantics of torch.nn.functional.scaled_dot_product_attention:
 * per batch and head, out = dropout(softmax(scale * q k^T + mask terms)) v, the softmax over the keys.
 * f16 and bf16 run FLAME's fused kernels (FlashAttention-2 style: tensor cores, f32 accumulation and
 * softmax, the [Lq, Lk] scores never stored, so the extra memory grows with Lq alone) on GPUs of
 * compute capability 8.0 or newer with head dims up to 128; other head dims and older GPUs compute
 * the same function from matrix products in f32 that store the scores. On H100/H200 (compute
 * capability 9.0) attention without mask or dropout, head dim 64 or 128 for q, k and v, and a
 * positive scale runs FlashAttention-3 style kernels instead,
 * forward and backward, with the same results up to rounding; FLAME_DISABLE_WGMMA=1 in the environment before
 * flame_ctx_create keeps a context on the FlashAttention-2 kernels. f32 and f64 are composed of
 * FLAME ops (matmul, softmax, where, ...), storing the scores, and differentiate through them. */

/* Bits of flame_attention_options_t.flags. */
enum {
  FLAME_ATTENTION_CAUSAL = 1 /* query i attends to keys j <= i only (top-left aligned, as PyTorch's is_causal) */
};

/* Options of flame_scaled_dot_product_attention. Fill with flame_attention_options_init, then change
 * fields. The struct may grow at its end; the library reads only struct_size bytes of it. */
typedef struct flame_attention_options_t {
  size_t struct_size; /* sizeof(flame_attention_options_t), set by flame_attention_options_init */
  uint32_t flags;     /* FLAME_ATTENTION_* bits; default 0 */
  double scale;       /* the factor of q k^T; 0 (default): 1 / sqrt(head dim); any other finite value is used as given */
  double dropout_p;   /* probability of zeroing each attention weight, in [0, 1); default 0 */
} flame_attention_options_t;

/* Sets opts to the defaults above. opts NULL: FLAME_ERROR_INVALID_ARGUMENT. */
FLAME_API flame_status_t flame_attention_options_init(flame_attention_options_t* opts);

/* Attention of q [B, H, Lq, D] over keys k [B, H, Lk, D] and values v [B, H, Lk, Dv] (BORROWED; one
 * floating dtype and one context; Lq and Lk may differ, as in cross-attention). Any strides: views
 * such as the heads split from one qkv projection and transposed are read in place (a copy is made
 * only when the last dim is not contiguous). mask (BORROWED, may be NULL): bool (true: the pair takes
 * part) or additive in q's dtype (added to the scaled scores; -INFINITY excludes a pair), of any shape
 * that broadcasts to [B, H, Lq, Lk] without enlarging it ([Lq, Lk], [B, 1, 1, Lk], ...). With
 * FLAME_ATTENTION_CAUSAL the causal mask applies as well. opts may be NULL (the defaults).
 * OUT *out: a new reference, contiguous [B, H, Lq, Dv] in q's dtype. A query whose keys are all masked
 * (and every query when Lk is 0) gets zeros and passes no gradient, as PyTorch's math path does.
 * Dropout (dropout_p > 0) zeroes each attention weight with probability dropout_p and scales the others
 * by 1 / (1 - dropout_p), from the context's Philox generator, whose offset advances by
 * B * H * Lq * ceil(Lk / 4); the decision for each (b, h, i, j) depends only on the seed and that offset,
 * is the same in every dtype and is applied again by the backward.
 * Gradients flow to q, k, v and to an additive mask that requires grad (summed over its broadcast
 * dims). The first-order backward of the f16/bf16 kernels is fused too; under
 * FLAME_BACKWARD_CREATE_GRAPH it is composed of FLAME ops (differentiable again; it stores the scores).
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (q, k, v or out NULL; tensors of different contexts;
 * opts->struct_size below sizeof(flame_attention_options_t) or above 4096; unknown flags; scale not
 * finite; dropout_p outside [0, 1)), FLAME_ERROR_INVALID_HANDLE, FLAME_ERROR_SHAPE_MISMATCH (q, k or v
 * not 4-D; their B or H differ; k's head dim differs from q's or is 0; v's Lk differs from k's; a mask
 * that does not broadcast), FLAME_ERROR_DTYPE_MISMATCH (q not floating; k or v of another dtype; a mask
 * neither bool nor q's dtype), FLAME_ERROR_OUT_OF_MEMORY, FLAME_ERROR_KERNEL_COMPILE, FLAME_ERROR_CUDA. */
FLAME_API flame_status_t flame_scaled_dot_product_attention(flame_tensor_t q, flame_tensor_t k, flame_tensor_t v,
                                                            flame_tensor_t mask, const flame_attention_options_t* opts,
                                                            flame_tensor_t* out);

/* ============================== Dropout ============================== */

/* torch.nn.functional.dropout. With training != 0 and 0 < p < 1, each element of t is kept with
 * probability 1 - p and multiplied by 1 / (1 - p), or multiplied by 0 (a dropped NaN or infinity gives
 * NaN, as in PyTorch); f16/bf16 compute in f32. The keep mask comes from the context's Philox
 * generator: the call reserves ceil(numel / 4) counters (flame_ctx_get_rng_state shows the offset
 * advance) and element e of t in row-major order (whatever t's strides) is kept when the top 24 bits
 * of word e % 4 of Philox4x32-10(seed, offset + e / 4), read as a fraction of 2^24, are >= p. So a
 * given (seed, offset) gives the same mask on any GPU, for any dtype and layout. The backward
 * regenerates that mask from the (seed, offset) kept in the graph node and applies it to the gradient;
 * no mask tensor is stored. training == 0 or p == 0: OUT *out is t itself (a new reference, as PyTorch
 * returns its input) and no counters are reserved. p == 1: t * 0 (zeros, NaN where t is not finite).
 * Errors: FLAME_ERROR_DTYPE_MISMATCH (t not floating), FLAME_ERROR_INVALID_ARGUMENT (p outside [0, 1]
 * or NaN). */
FLAME_API flame_status_t flame_dropout(flame_tensor_t t, double p, int32_t training, flame_tensor_t* out);

/* ============================== Pooling ============================== */
/* 2-D pooling of x [N, C, H, W] or unbatched [C, H, W] (floating; f16/bf16 compute in f32), with
 * PyTorch's semantics, argument checks and output sizes. x may have any strides; a channels-last x
 * (the C stride 1) gives a channels-last result, any other layout a contiguous one. N may be 0 (an
 * empty result); C, H and W must be >= 1 (FLAME_ERROR_SHAPE_MISMATCH, as for any other rank). Not
 * floating: FLAME_ERROR_DTYPE_MISMATCH. The result is a new tensor; the gradient flows to x. */

/* Options of flame_max_pool2d and flame_avg_pool2d. Fill with flame_pool2d_options_init, then change
 * fields. The struct may grow at its end; the library reads only struct_size bytes of it. Pairs are
 * (height, width). */
typedef struct flame_pool2d_options_t {
  size_t struct_size;        /* sizeof(flame_pool2d_options_t), set by flame_pool2d_options_init */
  int64_t kernel_size[2];    /* >= 1 */
  int64_t stride[2];         /* >= 1; default: kernel_size (PyTorch's stride=None) */
  int64_t padding[2];        /* >= 0 and <= kernel_size / 2; default 0. max: -inf; avg: zeros */
  int64_t dilation[2];       /* >= 1; default 1. flame_avg_pool2d requires 1 */
  int32_t ceil_mode;         /* 1: the output size rounds up (windows may start in the padding but
                                never past it); default 0: down */
  int32_t count_include_pad; /* flame_avg_pool2d: padded zeros count in the divisor; default 1 */
  int64_t divisor_override;  /* flame_avg_pool2d: > 0 replaces the divisor; default 0 (none) */
} flame_pool2d_options_t;

/* Sets opts to the defaults above with the given kernel size (not checked here).
 * opts NULL: FLAME_ERROR_INVALID_ARGUMENT. */
FLAME_API flame_status_t flame_pool2d_options_init(flame_pool2d_options_t* opts, int64_t kernel_h, int64_t kernel_w);

/* torch.nn.functional.max_pool2d: each output is the maximum of its window (kernel_size, stride,
 * padding, dilation, ceil_mode of opts; count_include_pad and divisor_override are ignored). NaN
 * propagates. The gradient goes to the maximum's position: the first maximum in row-major window
 * order on ties, the last NaN when the window holds NaNs (as PyTorch); overlapping windows (stride
 * below kernel_size) add their gradients with atomics, so the last bits may vary between runs.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (opts NULL or its struct_size too small, a size, stride or
 * dilation < 1, padding < 0 or above half the kernel, ceil_mode or count_include_pad other than 0 or
 * 1, an output size < 1). */
FLAME_API flame_status_t flame_max_pool2d(flame_tensor_t x, const flame_pool2d_options_t* opts, flame_tensor_t* out);

/* torch.nn.functional.avg_pool2d: each output is the sum of its window over the divisor: the window's
 * size including padding (count_include_pad 1, cut at the padded border) or its elements inside x
 * (count_include_pad 0), or divisor_override when > 0; a window with no element inside x (possible
 * with ceil_mode) gives 0. The backward is a deterministic gather (no atomics). Errors: as
 * flame_max_pool2d, plus dilation other than 1 and a negative divisor_override
 * (FLAME_ERROR_INVALID_ARGUMENT). */
FLAME_API flame_status_t flame_avg_pool2d(flame_tensor_t x, const flame_pool2d_options_t* opts, flame_tensor_t* out);

/* torch.nn.functional.adaptive_avg_pool2d to an out_h x out_w output (>= 0; 0 gives an empty result):
 * output (i, j) averages rows [floor(i H / out_h), ceil((i + 1) H / out_h)) and the columns likewise.
 * The backward is a deterministic gather. Errors: FLAME_ERROR_INVALID_ARGUMENT (a negative or too large
 * output size). */
FLAME_API flame_status_t flame_adaptive_avg_pool2d(flame_tensor_t x, int64_t out_h, int64_t out_w, flame_tensor_t* out);

/* ============================== Upsampling ============================== */
/* torch.nn.functional.interpolate of x [N, C, H, W] (floating; f16/bf16 compute in f32) with modes
 * 'nearest' and 'bilinear', matching PyTorch's CUDA kernels index for index. Sizes, per dim: out_h
 * > 0 gives the output height, out_h == 0 takes floor(H * scale_h) (interpolate's scale_factor).
 * scale_h > 0 is the scale factor, which also sets the source index scale to 1 / scale_h, as
 * interpolate(scale_factor=...) does; scale_h == 0 means none (the index scale is then H / out_h, as
 * interpolate(size=...)). Likewise for the width. x may have any strides; a channels-last x (the C
 * stride 1) gives a channels-last result, any other layout a contiguous one. N may be 0 (an empty
 * result). The backward is the exact adjoint, computed as a deterministic gather (no atomics), and is
 * differentiable again. Errors: FLAME_ERROR_DTYPE_MISMATCH (x not floating), FLAME_ERROR_SHAPE_MISMATCH
 * (x not 4-D, or C, H or W of size 0), FLAME_ERROR_INVALID_ARGUMENT (a negative out size, a scale that
 * is negative or not finite, neither an out size nor a scale for a dim, an output size below 1 or not
 * below 2^31). */

/* 'nearest': output row i reads input row min(floor(i * s), H - 1), s the index scale in f32
 * (PyTorch's 'nearest', not 'nearest-exact'); likewise for columns. */
FLAME_API flame_status_t flame_upsample_nearest2d(flame_tensor_t x, int64_t out_h, int64_t out_w, double scale_h, double scale_w,
                                                  flame_tensor_t* out);
/* 'bilinear': align_corners 1 maps the corner pixels' centres onto each other (index scale
 * (H - 1) / (out_h - 1), scale factors only size the output); align_corners 0 samples at
 * (i + 0.5) * s - 0.5, clamped at 0. The interpolation weights are computed in f32 (f64 for f64).
 * align_corners other than 0 or 1: FLAME_ERROR_INVALID_ARGUMENT. */
FLAME_API flame_status_t flame_upsample_bilinear2d(flame_tensor_t x, int64_t out_h, int64_t out_w, double scale_h,
                                                   double scale_w, int32_t align_corners, flame_tensor_t* out);

/* ============================== Positional embeddings ============================== */

/* Options of flame_rope. Fill with flame_rope_options_init, then change fields. The struct may grow
 * at its end; the library reads only struct_size bytes of it. */
typedef struct flame_rope_options_t {
  size_t struct_size;      /* sizeof(flame_rope_options_t), set by flame_rope_options_init */
  double theta;            /* base of the frequencies theta^(-2i / rotary_dim); default 10000 */
  int64_t rotary_dim;      /* leading features of the last dim that rotate (even, <= D); default 0: all D */
  int64_t position_offset; /* without position ids, position t of x is position_offset + t (a KV cache's
                              length when decoding); default 0 */
  int32_t interleaved;     /* 0 (default): pairs (i, i + rotary_dim / 2), GPT-NeoX and Hugging Face's
                              rotate_half; 1: pairs (2i, 2i + 1), GPT-J and Meta's llama */
  int32_t seq_dim;         /* the dim of x that holds positions (negative counts from the end); default
                              -2 for x [B, H, T, D]; -3 for x [B, T, H, D] */
} flame_rope_options_t;

/* Sets opts to the defaults above. opts NULL: FLAME_ERROR_INVALID_ARGUMENT. */
FLAME_API flame_status_t flame_rope_options_init(flame_rope_options_t* opts);

/* Rotary position embeddings (Su et al. 2021), fused: x (floating, >= 2 dims, any strides) has head
 * features D in its last dim and positions along opts->seq_dim. Each pair (i0, i1) of the first
 * rotary_dim features (see opts->interleaved) at position p rotates by the angle
 * a = p * theta^(-2i / rotary_dim), i the pair's index: y[i0] = x[i0] cos a - x[i1] sin a,
 * y[i1] = x[i1] cos a + x[i0] sin a; the other features are copied. p is position_offset + t, or, when
 * positions (i64 or i32; may be NULL) is given, positions[t] ([T]) or positions[b, t] ([B, T], b the
 * index along dim 0 of x, which must then not be seq_dim). The angle is formed and reduced in f64
 * (long positions lose no accuracy to an f32 product; an f32 table as in Hugging Face's code agrees
 * to about 1e-4 at positions of some thousands) and cos / sin and the rotation are computed in f32
 * for f32, f16 and bf16 (f64 for f64). OUT *out: a new contiguous tensor of x's shape and dtype. The
 * backward rotates the gradient back, itself differentiable;
 * positions get no gradient. Errors: FLAME_ERROR_INVALID_ARGUMENT (opts NULL or its struct_size too
 * small, theta not finite and > 0, rotary_dim odd, < 2 or above D, seq_dim out of range or the last
 * dim, interleaved other than 0 or 1, tensors of different contexts), FLAME_ERROR_SHAPE_MISMATCH (x
 * with fewer than 2 dims, positions neither [T] nor [B, T]), FLAME_ERROR_DTYPE_MISMATCH (x not
 * floating, positions not i64/i32). */
FLAME_API flame_status_t flame_rope(flame_tensor_t x, flame_tensor_t positions, const flame_rope_options_t* opts,
                                    flame_tensor_t* out);

/* Sinusoidal timestep embeddings as diffusers' get_timestep_embedding: for timesteps [N] (any
 * numeric dtype, converted to f32), with half = dim / 2 and f_i = exp(-ln(max_period) * i /
 * (half - downscale_freq_shift)), out [N, dim] (f32) holds sin(scale * t f_i) in columns [0, half) and
 * cos(scale * t f_i) in [half, 2 half), swapped when flip_sin_to_cos is 1, and a zero last column
 * when dim is odd. Computed in f32 in diffusers' order of operations. A composition of FLAME ops:
 * differentiable in floating timesteps (integer timesteps take no gradient). Errors:
 * FLAME_ERROR_SHAPE_MISMATCH (timesteps not 1-D), FLAME_ERROR_DTYPE_MISMATCH (bool timesteps),
 * FLAME_ERROR_INVALID_ARGUMENT (dim < 1 or > 2^30, max_period not finite and > 0,
 * downscale_freq_shift or scale not finite, flip_sin_to_cos other than 0 or 1). */
FLAME_API flame_status_t flame_timestep_embedding(flame_tensor_t timesteps, int64_t dim, double max_period,
                                                  int32_t flip_sin_to_cos, double downscale_freq_shift, double scale,
                                                  flame_tensor_t* out);

/* ============================== Composite blocks ============================== */
/* Building blocks of diffusion and transformer models made of the ops above, with no kernel of their
 * own: each is differentiable, to any order, through its parts. Inputs are borrowed; OUT *out is a
 * new tensor. */

/* GEGLU (Shazeer 2020, as diffusers' GEGLU after its projection): x [..., 2 H] (floating) is split
 * into its halves a = x[..., :H] and gate = x[..., H:]; out [..., H] = a * gelu(gate), gelu exact
 * (approximate 0) or with the tanh approximation (approximate 1). Errors: FLAME_ERROR_DTYPE_MISMATCH
 * (x not floating), FLAME_ERROR_SHAPE_MISMATCH (0-d x, odd last dim), FLAME_ERROR_INVALID_ARGUMENT
 * (approximate other than 0 or 1). */
FLAME_API flame_status_t flame_geglu(flame_tensor_t x, int32_t approximate, flame_tensor_t* out);

/* adaLN modulation (DiT): out = x * (1 + scale) + shift for x [N, ..., C] (floating, >= 2 dims) and
 * shift, scale [N, C] of x's dtype, applied per sample (broadcast over the middle dims, as
 * x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1) for x [N, T, C]). shift and scale may each be NULL
 * (no shift / no scale). Errors: FLAME_ERROR_DTYPE_MISMATCH (x not floating, another dtype),
 * FLAME_ERROR_SHAPE_MISMATCH (x with fewer than 2 dims, shift or scale not [N, C]),
 * FLAME_ERROR_INVALID_ARGUMENT (tensors of different contexts). */
FLAME_API flame_status_t flame_adaln_modulate(flame_tensor_t x, flame_tensor_t shift, flame_tensor_t scale, flame_tensor_t* out);

/* SiLU-gated MLP (SwiGLU, llama's feed-forward): out = (silu(x w1^T) * (x w3^T)) w2^T for x [..., in],
 * w1 and w3 [hidden, in], w2 [out, hidden], all of one floating dtype (three flame_linear products
 * without bias). Errors: FLAME_ERROR_DTYPE_MISMATCH, FLAME_ERROR_SHAPE_MISMATCH (0-d x, weights of
 * other shapes), FLAME_ERROR_INVALID_ARGUMENT (tensors of different contexts). */
FLAME_API flame_status_t flame_swiglu_mlp(flame_tensor_t x, flame_tensor_t w1, flame_tensor_t w3, flame_tensor_t w2,
                                          flame_tensor_t* out);

/* ============================== Losses ============================== */
/* Every loss takes a reduction: NONE returns the per-element (per-sample) losses, MEAN their mean
 * and SUM their sum, as 0-d tensors. Inputs are borrowed; the result is a new reference in the
 * input's dtype (f16/bf16 are computed and accumulated in f32). Every loss has a backward, also
 * twice (create_graph). A zero-size batch gives an empty result (NONE), 0 (SUM) or NaN (MEAN).
 *
 * Class indices are checked on the device, not copied to the host: an index outside [0, C) that is
 * not ignore_index makes its sample's loss and gradient NaN, and the next call that synchronises
 * with the context (flame_ctx_synchronize, flame_to_host, flame_tensor_item) returns
 * FLAME_ERROR_INVALID_ARGUMENT with a message naming the op, the index and its position. The
 * context stays usable. */

typedef enum flame_reduction_t {
  FLAME_REDUCTION_NONE = 0,
  FLAME_REDUCTION_MEAN = 1,
  FLAME_REDUCTION_SUM = 2
} flame_reduction_t;

/* Cross-entropy of logits [C], [N, C] or [N, C, d1, ...] (class dim 1, as PyTorch), fused: the
 * forward reads the logits once and saves the logsumexp of each row; the backward reads them once
 * more. With f32 or f64 logits, class indices and reduction MEAN or SUM, a forward that is recorded
 * for backward (grad mode on, logits requiring grad) also computes the gradient with respect to the logits in the same
 * read and keeps it (one more buffer of the logits' size and dtype, until backward): a backward that
 * starts at this loss with a NULL gradient (flame_backward, flame_grad), with no hook on the loss
 * and without RETAIN_GRAPH or CREATE_GRAPH, then costs no further pass; any other backward reads the
 * logits again. For evaluation turn grad mode off (or use inference mode): nothing is computed for
 * backward. target is either:
 *  - class indices (i64 or i32) of shape [], [N] or [N, d1, ...]: entries equal to ignore_index
 *    count for nothing; label_smoothing eps in [0, 1] mixes the one-hot target with the uniform
 *    distribution ((1 - eps) onehot + eps / C). MEAN divides by the sum of weight[target] over the
 *    samples that are not ignored (their count without weight); all ignored gives NaN, as PyTorch.
 *  - class probabilities (floating, the logits' shape; converted to the logits' dtype), smoothed the
 *    same way; ignore_index is not used. MEAN divides by the number of samples. target may require
 *    grad.
 * weight (may be NULL): per-class weights [C], floating; it must not require grad (its gradient is
 * not implemented, as in PyTorch: FLAME_ERROR_NOT_DIFFERENTIABLE). [N, C, d1, ...] logits are
 * permuted to rows (one copy); [N, C] logits that are not contiguous are copied.
 * Errors: FLAME_ERROR_SHAPE_MISMATCH (no class dim, C = 0, target or weight shape),
 * FLAME_ERROR_DTYPE_MISMATCH (non-floating logits, target neither i64/i32 nor floating),
 * FLAME_ERROR_INVALID_ARGUMENT (label_smoothing outside [0, 1], bad reduction, tensors of different
 * contexts). */
FLAME_API flame_status_t flame_cross_entropy(flame_tensor_t logits, flame_tensor_t target, flame_tensor_t weight,
                                             int64_t ignore_index, double label_smoothing, flame_reduction_t reduction,
                                             flame_tensor_t* out);
/* Negative log-likelihood of log-probabilities [C], [N, C] or [N, C, d1, ...] (any strides) at
 * class indices target (i64 or i32, shaped as for flame_cross_entropy): -weight[t] * input[n, t].
 * weight (may be NULL) and ignore_index as for flame_cross_entropy; MEAN divides by the sum of the
 * weights of the samples that are not ignored. Errors as flame_cross_entropy. */
FLAME_API flame_status_t flame_nll_loss(flame_tensor_t input, flame_tensor_t target, flame_tensor_t weight,
                                        int64_t ignore_index, flame_reduction_t reduction, flame_tensor_t* out);
/* (input - target)^2. input and target: floating, the same shape (no broadcasting: expand the target
 * yourself). Errors: FLAME_ERROR_SHAPE_MISMATCH, FLAME_ERROR_DTYPE_MISMATCH,
 * FLAME_ERROR_INVALID_ARGUMENT (bad reduction). For per-sample weights use NONE, multiply, then
 * reduce. */
FLAME_API flame_status_t flame_mse_loss(flame_tensor_t input, flame_tensor_t target, flame_reduction_t reduction, flame_tensor_t* out);
/* |input - target|; as flame_mse_loss. */
FLAME_API flame_status_t flame_l1_loss(flame_tensor_t input, flame_tensor_t target, flame_reduction_t reduction, flame_tensor_t* out);
/* 0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta, with d = input - target; beta 0 is
 * flame_l1_loss. beta must be finite and >= 0 (FLAME_ERROR_INVALID_ARGUMENT). As flame_mse_loss. */
FLAME_API flame_status_t flame_smooth_l1_loss(flame_tensor_t input, flame_tensor_t target, double beta, flame_reduction_t reduction,
                                              flame_tensor_t* out);
/* 0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta). delta must be finite and > 0
 * (FLAME_ERROR_INVALID_ARGUMENT). As flame_mse_loss. */
FLAME_API flame_status_t flame_huber_loss(flame_tensor_t input, flame_tensor_t target, double delta, flame_reduction_t reduction,
                                          flame_tensor_t* out);
/* Binary cross-entropy of logits x with targets y in [0, 1] (the same shape, floating):
 * weight * ((1 - y) x + (1 + (pos_weight - 1) y) log(1 + exp(-x))), computed without overflow.
 * weight and pos_weight may be NULL; each must broadcast to the input's shape (pos_weight is usually
 * [C], one per class along the last dim). Gradients flow to logits, target, weight and pos_weight.
 * Errors: FLAME_ERROR_SHAPE_MISMATCH, FLAME_ERROR_DTYPE_MISMATCH, FLAME_ERROR_INVALID_ARGUMENT. */
FLAME_API flame_status_t flame_binary_cross_entropy_with_logits(flame_tensor_t logits, flame_tensor_t target, flame_tensor_t weight,
                                                                flame_tensor_t pos_weight, flame_reduction_t reduction,
                                                                flame_tensor_t* out);

/* ============================== Autograd ============================== */
/* One reverse-mode engine with PyTorch semantics. Only floating tensors can require grad. Ops
 * record a graph while grad mode is on and an input requires grad; an op that has no backward
 * returns FLAME_ERROR_NOT_DIFFERENTIABLE in that case. */

FLAME_API flame_status_t flame_tensor_set_requires_grad(flame_tensor_t t, int32_t requires_grad);
FLAME_API flame_status_t flame_tensor_requires_grad(flame_tensor_t t, int32_t* requires_grad);
/* OUT *is_leaf: 1 unless t was made by a recorded op. */
FLAME_API flame_status_t flame_tensor_is_leaf(flame_tensor_t t, int32_t* is_leaf);
/* A new tensor sharing t's memory, with no history and requires_grad 0. */
FLAME_API flame_status_t flame_tensor_detach(flame_tensor_t t, flame_tensor_t* out);

/* OUT *grad: the accumulated gradient (a new reference), or NULL when there is none. */
FLAME_API flame_status_t flame_tensor_grad(flame_tensor_t t, flame_tensor_t* grad);
/* Replaces t's gradient (grad is copied by reference; NULL clears it). Shape and dtype must match. */
FLAME_API flame_status_t flame_tensor_set_grad(flame_tensor_t t, flame_tensor_t grad);
/* Fills t's gradient with zeros, if it has one. */
FLAME_API flame_status_t flame_tensor_zero_grad(flame_tensor_t t);
/* Makes a non-leaf keep its gradient in .grad during backward. */
FLAME_API flame_status_t flame_tensor_retain_grad(flame_tensor_t t);

enum {
  FLAME_BACKWARD_RETAIN_GRAPH = 1, /* keep saved tensors so the graph can be walked again */
  FLAME_BACKWARD_CREATE_GRAPH = 2, /* record the backward itself (higher-order gradients) */
  FLAME_GRAD_ALLOW_UNUSED = 4      /* flame_grad: inputs not reached give NULL instead of an error */
};

/* Accumulates d(root)/d(leaf) into .grad of every leaf that requires grad. grad: the gradient of
 * root (same shape and dtype); NULL means 1 and then root must have one element. flags: the
 * FLAME_BACKWARD_* bits. Without RETAIN_GRAPH the graph's saved tensors are freed; walking it again
 * gives FLAME_ERROR_GRAPH_FREED. An error from a hook stops backward and is returned. A leaf with
 * post-accumulate hooks gets its .grad, and runs those hooks, as soon as its gradient is complete
 * during the walk (as PyTorch; their work overlaps the rest of backward); the other leaves after the
 * walk, so that a hook's error leaves their .grad unchanged. */
FLAME_API flame_status_t flame_backward(flame_ctx_t ctx, flame_tensor_t root, flame_tensor_t grad, uint32_t flags);

/* Gradients of n_outputs outputs (weighted by grad_outputs, which may be NULL or hold NULLs for
 * ones) with respect to n_inputs inputs, written as new references into results[n_inputs]; .grad
 * fields are not touched. flags: FLAME_BACKWARD_* and FLAME_GRAD_ALLOW_UNUSED. */
FLAME_API flame_status_t flame_grad(flame_ctx_t ctx, const flame_tensor_t* outputs, const flame_tensor_t* grad_outputs, int32_t n_outputs,
                                    const flame_tensor_t* inputs, int32_t n_inputs, uint32_t flags, flame_tensor_t* results);

/* Grad mode of the context (on by default). OUT *previous (may be NULL): the mode before, so that
 * callers nest: prev = set(0); ...; set(prev). */
FLAME_API flame_status_t flame_ctx_set_grad_enabled(flame_ctx_t ctx, int32_t enabled, int32_t* previous);
FLAME_API flame_status_t flame_ctx_is_grad_enabled(flame_ctx_t ctx, int32_t* enabled);

/* Autocast (mixed precision), off by default. While a context's autocast dtype is FLAME_DTYPE_BF16
 * or FLAME_DTYPE_F16, the matrix products (flame_matmul, flame_bmm, flame_linear, the convolutions
 * and attention) convert f32 inputs to it, and softmax, log_softmax, the normalisations, the losses,
 * flame_sum, flame_mean and flame_sum_all convert f16/bf16 inputs to f32 (their results are f32).
 * Conversions are recorded casts whose backward casts the gradient back, so every tensor receives
 * its gradient in its own dtype (f32 parameters get f32 gradients). Where such a cast feeds only a
 * flame_linear and nothing observes its gradient (no hook or retain_grad on the cast's result), the
 * linear's products write that f32 gradient directly, without rounding it to the low dtype first;
 * flame_cross_entropy with class indices reads f16/bf16 logits as they are (computing in f32) and
 * returns an f32 loss, without a converted copy of the logits. f64 and integer tensors are never
 * converted; batch_norm's running statistics neither (keep them f32). Nests like grad mode: prev =
 * set(BF16); ...; set(prev). dtype not one of the three values: FLAME_ERROR_INVALID_ARGUMENT.
 * OUT *previous (may be NULL): the setting before the call. */
#define FLAME_AUTOCAST_OFF (-1)
FLAME_API flame_status_t flame_ctx_set_autocast(flame_ctx_t ctx, int32_t dtype, int32_t* previous);
/* OUT *dtype: FLAME_DTYPE_BF16, FLAME_DTYPE_F16 or FLAME_AUTOCAST_OFF. */
FLAME_API flame_status_t flame_ctx_get_autocast(flame_ctx_t ctx, int32_t* dtype);
/* Inference mode records nothing and tensors made in it can never require grad. Nests as above. */
FLAME_API flame_status_t flame_ctx_set_inference_mode(flame_ctx_t ctx, int32_t enabled, int32_t* previous);

/* A tensor hook: called during backward with the gradient flowing into t (borrowed). It may
 * write a replacement gradient (a new reference of the same shape and dtype, which the engine
 * takes over) into *replacement, or leave it NULL to keep the gradient. A non-OK return stops
 * backward with that status (set the text with flame_set_error_message). */
typedef flame_status_t (*flame_tensor_hook_fn)(void* user_data, flame_tensor_t grad, flame_tensor_t* replacement);
/* A post-accumulate hook: called on a leaf (borrowed) after its .grad was updated; it may edit
 * .grad in place (flame_tensor_grad gives it). */
typedef flame_status_t (*flame_post_accumulate_hook_fn)(void* user_data, flame_tensor_t leaf);
/* Called exactly once with user_data when the hook goes: on flame_hook_remove or when the tensor
 * goes, whichever comes first. May be NULL. */
typedef void (*flame_destroy_fn)(void* user_data);

/* Registers fn on t. OUT *hook: a handle to pass to flame_hook_remove (it must be removed even
 * after t is released, to free the handle). Hooks run in registration order. */
FLAME_API flame_status_t flame_tensor_register_hook(flame_tensor_t t, flame_tensor_hook_fn fn, void* user_data, flame_destroy_fn destroy, flame_hook_t* hook);
/* Registers fn on a leaf tensor t (error for a non-leaf). */
FLAME_API flame_status_t flame_tensor_register_post_accumulate_grad_hook(flame_tensor_t t, flame_post_accumulate_hook_fn fn, void* user_data,
                                                                         flame_destroy_fn destroy, flame_hook_t* hook);
/* Detaches the hook (if its tensor still lives), calls destroy once, frees the handle. NULL: no-op. */
FLAME_API void flame_hook_remove(flame_hook_t hook);

/* ============================== Gradient tools ============================== */
/* These edit the .grad of params[0..n) (borrowed) in place; parameters without a .grad are skipped.
 * Usable from hooks. */

/* Scales all gradients by min(1, max_norm / (total + 1e-6)), where total is the norm_type norm (2,
 * 1 or INFINITY) of all gradients together, as torch.nn.utils.clip_grad_norm_. OUT *total_norm
 * (may be NULL): a new 0-d f32 tensor holding the total norm (no host synchronisation unless
 * error_if_nonfinite). error_if_nonfinite and a NaN/Inf total: FLAME_ERROR_INVALID_ARGUMENT and no
 * gradient changes. */
FLAME_API flame_status_t flame_clip_grad_norm(flame_ctx_t ctx, const flame_tensor_t* params, int64_t n, double max_norm,
                                             double norm_type, int32_t error_if_nonfinite, flame_tensor_t* total_norm);
/* Clamps every gradient element to [-clip, clip] (clip >= 0), as torch.nn.utils.clip_grad_value_. */
FLAME_API flame_status_t flame_clip_grad_value(flame_ctx_t ctx, const flame_tensor_t* params, int64_t n, double clip);

/* ---- gradient tools on tensor lists ---- */
/* Fused over a whole list: a few kernel launches for all of tensors[0..n) (borrowed; floating, of
 * ctx, any strides; n may be 0, tensors NULL when n is 0), whatever their sizes and dtypes
 * (f16/bf16 compute in f32). Unlike flame_clip_grad_norm they take the tensors themselves, so that
 * a hook can pass a gradient, or a loop the .grad of its parameters. In a tensor hook, edit a copy
 * (flame_clone) and return it as the replacement: the gradient a hook receives may be shared with
 * other parts of the graph. In a post-accumulate hook .grad belongs to the leaf: edit it in place.
 * The in-place tools (normalize, add_noise) record nothing in the graph: a tensor that requires
 * grad while grad mode is on, two tensors that overlap in memory, or a broadcast view (stride 0):
 * FLAME_ERROR_INVALID_ARGUMENT, and nothing changes. They bump the version of every tensor they write
 * (a tensor saved for backward then reports FLAME_ERROR_INPLACE_MODIFIED, as after any in-place write).
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (ctx NULL, tensors NULL with n > 0, n negative, a tensor of
 * another context, bad scalars), FLAME_ERROR_INVALID_HANDLE, FLAME_ERROR_DTYPE_MISMATCH (a
 * non-floating tensor). None of them waits for the device except flame_grad_stats_host. */

/* Per tensor: g = g * target_norm / (||g||_2 + eps). target_norm and eps finite and >= 0 (1 and 1e-6
 * are usual); an all-zero g stays 0 for eps > 0. */
FLAME_API flame_status_t flame_grad_normalize(flame_ctx_t ctx, const flame_tensor_t* tensors, int64_t n, double target_norm,
                                             double eps);
/* g = g + std_dev * N(0, 1), in place, from the context's Philox generator: element e of the list
 * (counting through the tensors in order, each in row-major order) uses counter offset + e, where
 * offset is the generator's offset before the call, which then advances by the total element count;
 * so flame_ctx_set_rng_state replays the same noise. std_dev finite and >= 0. */
FLAME_API flame_status_t flame_grad_add_noise(flame_ctx_t ctx, const flame_tensor_t* tensors, int64_t n, double std_dev);

/* Columns of a statistics row (flame_grad_stats). */
#define FLAME_STAT_NORM 0      /* L2 norm (NaN / Inf propagate) */
#define FLAME_STAT_MIN 1       /* minimum of the non-NaN values; NaN when there is none */
#define FLAME_STAT_MAX 2       /* maximum of the non-NaN values; NaN when there is none */
#define FLAME_STAT_MEAN 3      /* mean (NaN / Inf propagate; NaN for no elements) */
#define FLAME_STAT_NAN_COUNT 4 /* number of NaN values */
#define FLAME_STAT_INF_COUNT 5 /* number of +Inf and -Inf values */
#define FLAME_STAT_COLUMNS 6

/* Statistics of each tensor and of the list as a whole, computed in f64 without waiting for the
 * device: OUT *out, a new f64 tensor [n + 1, FLAME_STAT_COLUMNS] whose row i < n describes
 * tensors[i] and whose row n describes all elements together (with n = 0 it is the row of an empty
 * list: norm 0, counts 0, min, max and mean NaN). Read it when you need it (flame_to_host waits). */
FLAME_API flame_status_t flame_grad_stats(flame_ctx_t ctx, const flame_tensor_t* tensors, int64_t n, flame_tensor_t* out);
/* As flame_grad_stats, written to host memory: values[i * FLAME_STAT_COLUMNS + column] for rows
 * i = 0 .. n. WAITS for the device (one synchronisation). capacity (in doubles) below
 * (n + 1) * FLAME_STAT_COLUMNS, or values NULL: FLAME_ERROR_INVALID_ARGUMENT. */
FLAME_API flame_status_t flame_grad_stats_host(flame_ctx_t ctx, const flame_tensor_t* tensors, int64_t n, double* values,
                                              int64_t capacity);

/* ============================== Optimizers ============================== */
/* Fused multi-tensor optimizers with the formulas of torch.optim (SGD, Adam, AdamW) and Lion
 * (Chen et al. 2023). A step updates every parameter that has a .grad, in place, with one kernel
 * launch per parameter group and dtype; parameters without a .grad are skipped. State (moments)
 * is kept in f32 for f16/bf16/f32 parameters (f64 for f64) inside the optimizer. */

typedef struct flame_optimizer_s* flame_optimizer_t;

typedef enum flame_optimizer_kind_t {
  FLAME_OPTIMIZER_SGD = 0,
  FLAME_OPTIMIZER_ADAM = 1,   /* weight_decay is an L2 term added to the gradient */
  FLAME_OPTIMIZER_ADAMW = 2,  /* weight_decay is decoupled: p *= 1 - lr * weight_decay */
  FLAME_OPTIMIZER_LION = 3    /* betas default (0.9, 0.99) */
} flame_optimizer_kind_t;

/* Hyper-parameters of one parameter group. Set struct_size = sizeof(flame_optimizer_options_t)
 * (flame_optimizer_options_init does) so that later versions can grow the struct. */
typedef struct flame_optimizer_options_t {
  size_t struct_size;
  int32_t kind;                /* a flame_optimizer_kind_t */
  double lr;                   /* default 1e-3 */
  double weight_decay;         /* default 1e-2 for AdamW, 0 otherwise */
  double beta1;                /* Adam/AdamW (0.9, 0.999); Lion (0.9, 0.99) */
  double beta2;
  double eps;                  /* Adam/AdamW denominator term; default 1e-8 */
  double momentum;             /* SGD; default 0 */
  double dampening;            /* SGD; default 0 */
  int32_t nesterov;            /* SGD: Nesterov momentum (needs momentum > 0, dampening 0) */
  int32_t amsgrad;             /* Adam/AdamW: keep the maximum of the second moment */
  int32_t maximize;            /* ascend instead of descend */
  int32_t master_weights;      /* f16/bf16 parameters: keep an f32 master copy and update it */
  int32_t stochastic_rounding; /* with master_weights: round bf16 parameters stochastically (bits from
                                  the optimizer's own Philox stream, keyed from the context's generator
                                  at the first rounding step; saved by flame_optimizer_save_state) */
} flame_optimizer_options_t;

/* Fills opts with the defaults of kind. opts NULL or kind unknown: FLAME_ERROR_INVALID_ARGUMENT. */
FLAME_API flame_status_t flame_optimizer_options_init(flame_optimizer_options_t* opts, int32_t kind);
/* Creates an optimizer whose first parameter group is params[0..n) (borrowed; the optimizer keeps
 * its own references) with opts. Parameters must be contiguous floating leaves of ctx, each at most
 * once in the optimizer. OUT *out: a new optimizer (release with flame_optimizer_release).
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (NULLs, bad options, non-leaf or strided parameters),
 * FLAME_ERROR_DTYPE_MISMATCH (integer parameters). n may be 0. */
FLAME_API flame_status_t flame_optimizer_create(flame_ctx_t ctx, const flame_optimizer_options_t* opts, const flame_tensor_t* params,
                                                int64_t n, flame_optimizer_t* out);
/* Adds a parameter group with its own options (same kind). OUT *group (may be NULL): its index. */
FLAME_API flame_status_t flame_optimizer_add_param_group(flame_optimizer_t opt, const flame_optimizer_options_t* opts,
                                                         const flame_tensor_t* params, int64_t n, int32_t* group);
/* One update of every parameter with a gradient. A gradient whose shape or dtype differs from its
 * parameter's: FLAME_ERROR_SHAPE_MISMATCH (nothing is updated in that group). */
FLAME_API flame_status_t flame_optimizer_step(flame_optimizer_t opt);
/* Clears the gradients of all parameters: set_to_none != 0 drops them, else fills them with 0. */
FLAME_API flame_status_t flame_optimizer_zero_grad(flame_optimizer_t opt, int32_t set_to_none);
/* Learning rate of one group, or of all groups when group is -1 (schedules stay in user code).
 * lr negative or non-finite, or group out of range: FLAME_ERROR_INVALID_ARGUMENT. */
FLAME_API flame_status_t flame_optimizer_set_lr(flame_optimizer_t opt, int32_t group, double lr);
FLAME_API flame_status_t flame_optimizer_get_lr(flame_optimizer_t opt, int32_t group, double* lr);
/* OUT *steps: number of completed steps. */
FLAME_API flame_status_t flame_optimizer_step_count(flame_optimizer_t opt, int64_t* steps);
/* Frees the optimizer and its state (parameters stay). NULL: no-op. */
FLAME_API void flame_optimizer_release(flame_optimizer_t opt);

/* The width of opt's moments: bits 32 (f32, the default) or 8 (blockwise 8-bit states, as
 * bitsandbytes' Adam8bit / AdamW8bit / Lion8bit: about a quarter of the memory). With 8, every
 * f16 / bf16 / f32 parameter of at least 4096 elements keeps each moment as one byte per element,
 * a code index, plus one f32 absmax per block of 256 consecutive elements (row-major); smaller
 * parameters and f64 ones keep f32 (f64) moments. A step dequantises a moment (code value x its
 * block's absmax), updates it in f32 with the same formula as the 32-bit step, then stores it as
 * the code nearest to moment / the block's new absmax (the largest |moment| of the block; ties to
 * the lower code). The code tables, 256 values each, ascending: for decade i = 0 .. 6 and
 * j = 0 .. n_i - 1 the values 10^(i - 6) * (0.1 + 0.9 * (j + 0.5) / n_i), with n_i = 2^i for the
 * first moment (signed: these values, their negatives, 0 and 1) and n_i = 2^(i + 1) for the
 * second (unsigned: these values, 0 and 1). The first step therefore equals the 32-bit step; later
 * ones differ by the rounding of the stored moments. Works in CUDA graphs; saved and loaded by
 * flame_optimizer_save_state / _load_state (a file loads only into an optimizer of the same width).
 * opt is borrowed; nothing is allocated here (the moments are made, in this width, by the first step
 * that sees a gradient) and nothing waits for the device. Setting the width opt already has is a no-op.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (opt NULL; bits not 8 or 32; 8 for an SGD optimizer, with
 * an amsgrad group, or on a sharded optimizer (flame_zero_create refuses 8-bit optimizers too);
 * a change once the optimizer holds state: choose the width before its first step),
 * FLAME_ERROR_INVALID_HANDLE. Nothing changes on an error. */
FLAME_API flame_status_t flame_optimizer_set_state_bits(flame_optimizer_t opt, int32_t bits);

/* ---- optimizer state files ---- */

/* Writes the complete state of opt to a safetensors file at path (NUL-terminated; replaced
 * atomically, as flame_safetensors_save does): the step count, every group's hyper-parameters
 * (learning rates included), the moments as f32 (f64 for f64 parameters) tensors
 * "state.<i>.momentum_buffer" (SGD), "state.<i>.exp_avg", "state.<i>.exp_avg_sq",
 * "state.<i>.max_exp_avg_sq" (Adam, AdamW; Lion has exp_avg only; 8-bit moments,
 * flame_optimizer_set_state_bits, as u8 codes with "state.<i>.exp_avg_absmax" and
 * "state.<i>.exp_avg_sq_absmax", f32 [ceil(numel / 256)]), the f32 master weights
 * "master.<i>" and the stochastic-rounding generator, with the parameters numbered 0, 1, ... across
 * the groups in order (as torch's state_dict); the rest is JSON in the metadata entry
 * "flame.optimizer_state". A parameter never stepped has no tensors. The parameters themselves are
 * not written: save them with flame_safetensors_save. Waits for the device.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (opt or path NULL), FLAME_ERROR_INVALID_HANDLE, FLAME_ERROR_IO
 * (the file cannot be written; no temporary file is left behind), FLAME_ERROR_CUDA. */
FLAME_API flame_status_t flame_optimizer_save_state(flame_optimizer_t opt, const char* path);

/* Replaces the state of opt with the one flame_optimizer_save_state wrote to path, so that training
 * continues exactly as the saved optimizer would have (bit for bit, stochastic rounding included):
 * create opt of the same kind over parameters of the same shapes and dtypes in the same groups and
 * order, give the parameters their saved values, then load. Hyper-parameters and learning rates come
 * from the file. The file is read and checked in full before opt changes: after any error opt is as
 * it was. Waits for nothing (the copies to the device are queued on the context's stream).
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (opt or path NULL; the file holds the state of another kind
 * of optimizer or of other group or parameter counts), FLAME_ERROR_SHAPE_MISMATCH /
 * FLAME_ERROR_DTYPE_MISMATCH (a parameter's shape / dtype differs from the one saved),
 * FLAME_ERROR_INVALID_FORMAT (not an optimizer state file, or a state tensor of an unknown name, the
 * wrong dtype or shape, an incomplete Adam state, invalid hyper-parameters), FLAME_ERROR_IO (the file
 * cannot be read), FLAME_ERROR_INVALID_HANDLE, FLAME_ERROR_OUT_OF_MEMORY, FLAME_ERROR_CUDA. */
FLAME_API flame_status_t flame_optimizer_load_state(flame_optimizer_t opt, const char* path);

/* ============================== Training toolkit ============================== */
/* Dynamic loss scaling (flame_grad_scaler_t), LoRA adapters (flame_lora_t) and gradient
 * checkpointing. The general conventions at the top of this file hold. */

/* ---- dynamic loss scaling (as torch.cuda.amp.GradScaler) ---- */
/* A loop with f16 gradients: scaled = scale(loss); backward(scaled); [unscale(opt); clip...];
 * step(opt); update(). The scale multiplies the loss so that small gradients survive f16; unscale
 * divides the optimizer's gradients by it again in place, with a fused Inf/NaN check; step skips
 * the optimizer step when the check found one; update backs the scale off (times backoff_factor)
 * after a skipped step, or grows it (times growth_factor, unless that overflows f32) after
 * growth_interval clean steps in a row. The scale, the growth tracker and the Inf flags live on the
 * device: scale, unscale, unscale_tensors and update never wait for the GPU; step waits once, to read
 * its optimizer's Inf flag (as torch's GradScaler.step does: a skipped step must not advance the
 * optimizer's step count, which is kept on the host). */

typedef struct flame_grad_scaler_s* flame_grad_scaler_t;

/* Options of flame_grad_scaler_create. Set struct_size = sizeof(flame_grad_scaler_options_t)
 * (flame_grad_scaler_options_init does) so that later versions can grow the struct. */
typedef struct flame_grad_scaler_options_t {
  size_t struct_size;
  double init_scale;       /* default 65536 (2^16); positive, finite in f32 */
  double growth_factor;    /* default 2; finite, > 1 */
  double backoff_factor;   /* default 0.5; in (0, 1) */
  int64_t growth_interval; /* default 2000 clean steps; in [1, 2^31 - 1] */
  int32_t enabled;         /* default 1; 0 makes every call a pass-through (scale returns the loss,
                              step steps, unscale and update do nothing, get_scale gives 1) */
} flame_grad_scaler_options_t;

/* Fills opts with the defaults above. opts NULL: FLAME_ERROR_INVALID_ARGUMENT. */
FLAME_API flame_status_t flame_grad_scaler_options_init(flame_grad_scaler_options_t* opts);
/* Creates a scaler on ctx; opts NULL means the defaults. OUT *out: a new scaler (release with
 * flame_grad_scaler_release); it keeps ctx alive. Bad options: FLAME_ERROR_INVALID_ARGUMENT. */
FLAME_API flame_status_t flame_grad_scaler_create(flame_ctx_t ctx, const flame_grad_scaler_options_t* opts, flame_grad_scaler_t* out);
/* Frees the scaler. NULL is a no-op; a released handle is detected (FLAME_ERROR_INVALID_HANDLE)
 * while its context lives. */
FLAME_API void flame_grad_scaler_release(flame_grad_scaler_t scaler);
/* OUT *out: loss * scale, a new reference recorded in the graph (its backward multiplies the incoming
 * gradient by the scale). loss (borrowed, floating, any shape) is multiplied in f32 (f64 for an f64
 * loss), so *out is f32 for f32/f16/bf16 losses. Disabled: *out is loss itself (a new reference).
 * Errors: FLAME_ERROR_DTYPE_MISMATCH (integer loss), FLAME_ERROR_INVALID_ARGUMENT (another context). */
FLAME_API flame_status_t flame_grad_scaler_scale(flame_grad_scaler_t scaler, flame_tensor_t loss, flame_tensor_t* out);
/* Divides the .grad of every parameter of opt (borrowed) by the scale, in place (the reciprocal is
 * taken in f64 and rounded to f32, as torch), and records whether any gradient held an Inf or NaN.
 * Call it before editing gradients (clipping) and before step; step calls it when you did not.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (called twice for opt, or after flame_grad_scaler_step for
 * opt, without flame_grad_scaler_update in between; opt of another context; a gradient that requires
 * grad while grad mode is on), FLAME_ERROR_INVALID_HANDLE. */
FLAME_API flame_status_t flame_grad_scaler_unscale(flame_grad_scaler_t scaler, flame_optimizer_t opt);
/* As flame_grad_scaler_unscale for tensors[0..n) (borrowed; floating, of the scaler's context; edited
 * in place), for training loops with their own optimizer: their Inf/NaN check counts for update and
 * for flame_grad_scaler_found_inf, not for flame_grad_scaler_step. Errors as flame_grad_normalize. */
FLAME_API flame_status_t flame_grad_scaler_unscale_tensors(flame_grad_scaler_t scaler, const flame_tensor_t* tensors, int64_t n);
/* Unscales opt's gradients unless flame_grad_scaler_unscale already did since the last update, then
 * runs flame_optimizer_step(opt) unless an Inf or NaN was found in them. WAITS for the device once
 * (to read that flag). OUT *stepped (may be NULL): 1 when the optimizer stepped, 0 when the step was
 * skipped. Errors: FLAME_ERROR_INVALID_ARGUMENT (step called twice for opt without an update in
 * between; opt of another context), the errors of flame_optimizer_step. */
FLAME_API flame_status_t flame_grad_scaler_step(flame_grad_scaler_t scaler, flame_optimizer_t opt, int32_t* stepped);
/* Updates the scale on the device from the Inf checks since the last update (as torch's
 * GradScaler.update, without an explicit new scale: use flame_grad_scaler_set_state for that) and
 * forgets them. No check since the last update: FLAME_ERROR_INVALID_ARGUMENT. */
FLAME_API flame_status_t flame_grad_scaler_update(flame_grad_scaler_t scaler);
/* OUT *scale: the current scale (1 when disabled). WAITS for the device. */
FLAME_API flame_status_t flame_grad_scaler_get_scale(flame_grad_scaler_t scaler, double* scale);
/* OUT *out: a new 0-d f32 tensor, 1 when a gradient unscaled since the last update held an Inf or
 * NaN, else 0 (a copy made on the device: no waiting). */
FLAME_API flame_status_t flame_grad_scaler_found_inf(flame_grad_scaler_t scaler, flame_tensor_t* out);
/* The state to checkpoint with the model (torch's "scale" and "_growth_tracker"): OUT *scale and
 * *growth_tracker (clean steps since the scale last changed). WAITS for the device. */
FLAME_API flame_status_t flame_grad_scaler_get_state(flame_grad_scaler_t scaler, double* scale, int64_t* growth_tracker);
/* Restores a state saved with flame_grad_scaler_get_state (or sets a new scale). scale positive and
 * finite in f32, growth_tracker in [0, growth_interval): otherwise FLAME_ERROR_INVALID_ARGUMENT. */
FLAME_API flame_status_t flame_grad_scaler_set_state(flame_grad_scaler_t scaler, double scale, int64_t growth_tracker);

/* ---- LoRA adapters over linear layers ---- */
/* A low-rank adapter (Hu et al. 2021, as peft's LoRA) on a frozen linear layer weight [out, in]
 * (f32, f16, bf16 or f64) with optional bias [out]: trainable A [rank, in] and B [out, rank] in f32
 * (f64 for an f64 weight), A drawn from U(-1/sqrt(in), 1/sqrt(in)) (Kaiming-uniform with a = sqrt(5),
 * as torch.nn.Linear) with the context's generator and B zero, so that a new adapter changes nothing;
 * scale = alpha / rank. Train A and B (flame_lora_adapters gives them to an optimizer); merge folds
 * the adapter into the weight for inference. */

typedef struct flame_lora_s* flame_lora_t;

/* Creates an adapter over weight and bias (borrowed; the adapter keeps references; bias may be NULL;
 * weight must not require grad: it is the frozen base; bias may, to train it too). rank in
 * [1, 65536], alpha finite. OUT *out: a new adapter (release with flame_lora_release).
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (NULLs, weight requires grad, rank, alpha, bias of another
 * context), FLAME_ERROR_SHAPE_MISMATCH (weight not 2-D or empty, bias not [out]),
 * FLAME_ERROR_DTYPE_MISMATCH (weight not floating, bias of another dtype). */
FLAME_API flame_status_t flame_lora_create(flame_tensor_t weight, flame_tensor_t bias, int64_t rank, double alpha, flame_lora_t* out);
/* Frees the adapter (its A and B stay alive as long as you hold them). NULL is a no-op; a released
 * handle is detected (FLAME_ERROR_INVALID_HANDLE) while its context lives. */
FLAME_API void flame_lora_release(flame_lora_t lora);
/* OUT *out: linear(x, weight, bias) + scale * linear(linear(x, A), B), a new reference of x's
 * leading dims and [out] last, in the weight's dtype; x [..., in] (borrowed) must have the weight's
 * dtype. The adapter path runs in A's dtype (x cast to it, the result cast back), all recorded:
 * gradients reach A, B and, when they require grad, x and bias; never the weight. While merged, out
 * is linear(x, merged weight, bias) and nothing reaches A or B.
 * Errors: FLAME_ERROR_DTYPE_MISMATCH (x of another dtype), FLAME_ERROR_SHAPE_MISMATCH (last dim of x
 * not in), FLAME_ERROR_INVALID_ARGUMENT (x of another context). */
FLAME_API flame_status_t flame_lora_forward(flame_lora_t lora, flame_tensor_t x, flame_tensor_t* out);
/* OUT *a, *b: new references to the adapter's A [rank, in] and B [out, rank] themselves (leaves that
 * require grad; pass them to flame_optimizer_create). Both NULL on failure. */
FLAME_API flame_status_t flame_lora_adapters(flame_lora_t lora, flame_tensor_t* a, flame_tensor_t* b);
/* Adds scale * B A to the weight in place (computed in A's dtype, rounded once to the weight's), after
 * keeping a copy of the weight (memory of one weight while merged). The weight's version moves: a
 * graph that saved it cannot be walked any more. Merged already: FLAME_ERROR_INVALID_ARGUMENT. */
FLAME_API flame_status_t flame_lora_merge(flame_lora_t lora);
/* Writes the copy kept by flame_lora_merge back, so that the weight is bit for bit what it was.
 * Not merged: FLAME_ERROR_INVALID_ARGUMENT. */
FLAME_API flame_status_t flame_lora_unmerge(flame_lora_t lora);
/* OUT *merged: 1 while merged, else 0. */
FLAME_API flame_status_t flame_lora_is_merged(flame_lora_t lora, int32_t* merged);

/* ---- gradient checkpointing ---- */
/* Trades compute for memory, as torch.utils.checkpoint: a block of the model runs without keeping
 * its intermediate tensors, and runs again during backward to rebuild them. */

/* The block: reads inputs[0..n_inputs) (borrowed) and writes n_outputs new references into
 * outputs[0..n_outputs) (each NULL on entry), built with any FLAME ops on the same context, from the
 * calling thread only. It runs twice: once in flame_checkpoint (grad mode off) and once during
 * backward (grad mode on, inputs then detached copies of the originals), and must compute the same
 * outputs (shapes and dtypes) from the same inputs both times; draws from the context's generator
 * (dropout masks) repeat exactly, since the generator's state is replayed. Parameters may come as
 * inputs or through user_data. A non-OK return stops the call with that status (set the text with
 * flame_set_error_message); handles it wrote are released. It must not throw. */
typedef flame_status_t (*flame_checkpoint_fn)(void* user_data, const flame_tensor_t* inputs, int32_t n_inputs,
                                              flame_tensor_t* outputs, int32_t n_outputs);

/* Runs fn(user_data, inputs, n_inputs, outputs, n_outputs) without recording its operations, and
 * writes its results into outputs[0..n_outputs) (new references; all NULL on failure). When grad
 * mode is on, one graph node records the call: it keeps the inputs (not fn's intermediates) and the
 * generator's state, and the floating outputs require grad (also when no input does, so that
 * parameters fn reaches through user_data get gradients). Its backward runs fn again with grad mode
 * on, on detached copies of the inputs and with the generator's state replayed, then back-propagates
 * the outputs' gradients through the rebuilt operations: with flame_backward, gradients accumulate
 * into .grad of every leaf fn used (inputs, and parameters through user_data) as with any other
 * operation, except that leaves inside a checkpoint receive their gradient when the walk reaches the
 * checkpoint rather than at the end of the walk; with flame_grad, the inputs' gradients are returned,
 * and a tensor used inside fn that requires grad without being one of its inputs gives
 * FLAME_ERROR_UNSUPPORTED. Higher-order gradients through a checkpoint (FLAME_BACKWARD_CREATE_GRAPH):
 * FLAME_ERROR_UNSUPPORTED. An error fn returns during backward stops the backward with fn's status
 * and message. n_inputs may be 0 (inputs NULL); n_outputs in [1, 65536].
 * destroy (may be NULL) is called exactly once with user_data when FLAME no longer needs fn: when the
 * recorded node is freed (its outputs and the graph built on them released, or a backward without
 * FLAME_BACKWARD_RETAIN_GRAPH done and the outputs released), or before flame_checkpoint returns when
 * nothing was recorded (grad mode off) or the call failed, NULL arguments included.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (ctx, fn or outputs NULL, inputs NULL with n_inputs > 0,
 * counts out of range, an input of another context; fn left an output NULL or returned one of
 * another context), FLAME_ERROR_INVALID_HANDLE, and any status fn returns. */
FLAME_API flame_status_t flame_checkpoint(flame_ctx_t ctx, flame_checkpoint_fn fn, void* user_data, flame_destroy_fn destroy,
                                          const flame_tensor_t* inputs, int32_t n_inputs, flame_tensor_t* outputs,
                                          int32_t n_outputs);

/* ============================== DLPack exchange ============================== */
/* Zero-copy exchange of device tensors with PyTorch, JAX, CuPy and others through DLPack
 * (https://dmlc.github.io/dlpack). flame.h does not include dlpack.h: include it yourself to read
 * the structs; the declarations below only name them.
 *
 *  - Export: the DLManagedTensor points at t's memory (no copy) with shape and strides in
 *    elements as t has them (strides may be 0 or negative for views), device (kDLCUDA, the
 *    context's ordinal), byte_offset 0. Dtypes: f32/f16/f64 as kDLFloat, bf16 as kDLBfloat, i32/i64
 *    as kDLInt, u8 as kDLUInt 8, bool as kDLBool (code 6) 8 bits, f8_e4m3 as kDLFloat8_e4m3fn
 *    (code 10) and f8_e5m2 as kDLFloat8_e5m2 (code 12) 8 bits (DLPack 1.1's codes; FLAME uses them
 *    whatever dlpack.h it was built with); lanes 1. The export waits for the
 *    context's stream first, so the data is ready for work on any stream. It carries no autograd
 *    history (as flame_tensor_detach). The consumer calls the deleter exactly once, from any
 *    thread; until then the memory, and the context, stay alive even if every FLAME handle and the
 *    context handle are gone. Work the consumer queued on the memory must be finished or ordered
 *    before its deleter call, as FLAME reuses the memory in the order of its own stream.
 *  - Import: on success FLAME owns src and calls src->deleter(src) exactly once (when not NULL),
 *    after the last FLAME tensor using the memory is released and the context's stream has
 *    finished its work on it; possibly from another thread, inside a later FLAME call on the
 *    context, with the context's lock held: the deleter must not wait for a lock that a thread
 *    calling FLAME may hold (Python: release the GIL around FLAME calls, as ctypes does). On
 *    failure nothing is taken: src stays the caller's, who still has to call its
 *    deleter. The data must be ready: finish or synchronise the producer's work on it before the
 *    call (FLAME's stream does not wait on other streams). The result is a new leaf tensor (no
 *    grad) sharing the memory, on the context's device; writes on either side are seen by the other.
 *    Accepted: kDLCUDA memory of the context's device, the dtypes listed above, lanes 1, ndim in
 *    [0, FLAME_MAX_DIMS], strides NULL (compact row-major) or in elements, the first element
 *    aligned to the element size. Memory imported this way is not counted in the context's memory
 *    statistics or limit.
 *  - Errors: FLAME_ERROR_INVALID_ARGUMENT (NULL, bad shape/strides/alignment, another GPU than the
 *    context's), FLAME_ERROR_UNSUPPORTED (not CUDA device memory, e.g. kDLCPU; a read-only
 *    versioned tensor; versioned functions in a build whose dlpack.h predates DLPack 1.0),
 *    FLAME_ERROR_DTYPE_MISMATCH (a dtype FLAME does not have: complex, int8, float8 other than
 *    e4m3fn and e5m2, lanes > 1). */
struct DLManagedTensor;
struct DLManagedTensorVersioned;

/* OUT *out: a new DLManagedTensor sharing t's memory; the consumer owns it (call its deleter once). */
FLAME_API flame_status_t flame_tensor_to_dlpack(flame_tensor_t t, struct DLManagedTensor** out);
/* OUT *out: a new tensor of ctx wrapping src's memory; takes src over on success only. */
FLAME_API flame_status_t flame_tensor_from_dlpack(flame_ctx_t ctx, struct DLManagedTensor* src, flame_tensor_t* out);
/* As flame_tensor_to_dlpack with the versioned struct of DLPack >= 1.0 (version = the dlpack.h
 * FLAME was built with, flags 0). FLAME_ERROR_UNSUPPORTED when FLAME was built with an older dlpack.h. */
FLAME_API flame_status_t flame_tensor_to_dlpack_versioned(flame_tensor_t t, struct DLManagedTensorVersioned** out);
/* As flame_tensor_from_dlpack for the versioned struct. A major version other than FLAME's:
 * FLAME_ERROR_UNSUPPORTED (nothing else is read; the caller calls the deleter, as DLPack requires);
 * DLPACK_FLAG_BITMASK_READ_ONLY set: FLAME_ERROR_UNSUPPORTED (FLAME tensors are writable). */
FLAME_API flame_status_t flame_tensor_from_dlpack_versioned(flame_ctx_t ctx, struct DLManagedTensorVersioned* src,
                                                            flame_tensor_t* out);

/* ============================== safetensors ============================== */
/* Reading and writing the safetensors format (as the Python package `safetensors` does): an 8-byte
 * little-endian header length N, N bytes of UTF-8 JSON mapping each tensor name to its dtype, shape
 * and byte range (plus an optional "__metadata__" object of strings), then the tensors' row-major
 * little-endian bytes. FLAME reads and writes the dtypes F32, F16, BF16, F64, I64, I32, U8, BOOL,
 * F8_E4M3 (FLAME_DTYPE_F8_E4M3) and F8_E5M2 (FLAME_DTYPE_F8_E5M2); tensors of the format's other
 * dtypes (F8_E8M0, I16, U32, ...) are listed, but
 * flame_safetensors_info and flame_safetensors_get return FLAME_ERROR_UNSUPPORTED for them. */

typedef struct flame_safetensors_s* flame_safetensors_t; /* an open safetensors file */

/* Opens the safetensors file at path (NUL-terminated) on ctx: the file is memory-mapped read-only
 * and its header validated in full before this returns; tensor data is read by
 * flame_safetensors_get. Nothing in the file is trusted. A file shorter than 8 bytes, a header
 * length above 100 MB or beyond the file, a header that is not UTF-8 or not JSON, JSON of the wrong
 * types or nesting, missing fields, an unknown dtype, negative, too large or more than 64 dims, an
 * element or byte count that overflows, a byte range whose size is not numel * dtype size, ranges
 * outside the data region, overlapping, with gaps between them or not ending at the end of the file,
 * a name or metadata key given twice, a NUL character in a name, key or value, more than 1048576
 * tensors or metadata entries: FLAME_ERROR_INVALID_FORMAT, with a message naming the file, the tensor
 * and the defect. OUT *file: a new handle; release it with flame_safetensors_release. It keeps ctx
 * alive (as tensors do) and the file mapped: do not truncate or rewrite the file in place while it
 * is open (a mapped file that shrinks makes reads fault; flame_safetensors_save replaces files by
 * renaming, which is safe). The handle may be used from several threads.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (ctx, path or file NULL), FLAME_ERROR_IO (the file cannot be
 * opened or mapped, or is not a regular file; the message gives the system's reason),
 * FLAME_ERROR_INVALID_FORMAT. */
FLAME_API flame_status_t flame_safetensors_load(flame_ctx_t ctx, const char* path, flame_safetensors_t* file);

/* Unmaps the file and frees the handle. NULL is a no-op. Tensors read from it stay valid (they own
 * their memory). A released handle is detected (FLAME_ERROR_INVALID_HANDLE) while its context lives. */
FLAME_API void flame_safetensors_release(flame_safetensors_t file);

/* OUT *count: the number of tensors in the file (may be 0). */
FLAME_API flame_status_t flame_safetensors_count(flame_safetensors_t file, int64_t* count);

/* OUT *name: the name of tensor index, 0 <= index < count, with tensors sorted by name (byte
 * order). BORROWED: NUL-terminated UTF-8 owned by the handle, valid until it is released.
 * index out of range: FLAME_ERROR_INVALID_ARGUMENT. */
FLAME_API flame_status_t flame_safetensors_name(flame_safetensors_t file, int64_t index, const char** name);

/* The dtype and shape of the tensor called name, without reading its data. OUT *dtype, *ndim; the
 * ndim sizes go into shape, which may be NULL to ask for dtype and ndim only (capacity is then
 * ignored); otherwise capacity below ndim: FLAME_ERROR_INVALID_ARGUMENT (tensors in files may have
 * up to 64 dims). No tensor called name: FLAME_ERROR_INVALID_ARGUMENT. A dtype FLAME does not have:
 * FLAME_ERROR_UNSUPPORTED (the message names it). */
FLAME_API flame_status_t flame_safetensors_info(flame_safetensors_t file, const char* name, flame_dtype_t* dtype, int64_t* shape,
                                                int32_t capacity, int32_t* ndim);

/* Reads the tensor called name into a new contiguous tensor on the file's context, copying from
 * the mapped file straight to the device. OUT *out: a new reference (requires_grad 0).
 * Errors: no tensor called name: FLAME_ERROR_INVALID_ARGUMENT; a dtype FLAME does not have or more
 * than FLAME_MAX_DIMS dims: FLAME_ERROR_UNSUPPORTED; FLAME_ERROR_OUT_OF_MEMORY, FLAME_ERROR_CUDA,
 * FLAME_ERROR_CONTEXT_FAILED. */
FLAME_API flame_status_t flame_safetensors_get(flame_safetensors_t file, const char* name, flame_tensor_t* out);

/* OUT *count: the number of "__metadata__" entries (0 when the file has none). */
FLAME_API flame_status_t flame_safetensors_metadata_count(flame_safetensors_t file, int64_t* count);

/* OUT *key: metadata key index, 0 <= index < count, with keys sorted in byte order; BORROWED as
 * for flame_safetensors_name. index out of range: FLAME_ERROR_INVALID_ARGUMENT. */
FLAME_API flame_status_t flame_safetensors_metadata_key(flame_safetensors_t file, int64_t index, const char** key);

/* OUT *value: the metadata value stored under key, BORROWED as for flame_safetensors_name, or NULL
 * when the file has no such key (that is not an error: the call returns FLAME_OK). */
FLAME_API flame_status_t flame_safetensors_metadata(flame_safetensors_t file, const char* key, const char** value);

/* Writes n tensors (BORROWED; any dtype and strides; all on ctx) to path under names[i] (distinct,
 * NUL-terminated UTF-8, not "__metadata__"), with n_metadata entries of "__metadata__" taken from
 * metadata_kv as 2 * n_metadata strings key0, value0, key1, value1, ... (distinct UTF-8 keys;
 * "__metadata__" is written only when n_metadata > 0). The layout is the Python package's: the JSON
 * header padded with spaces to a multiple of 8 bytes, then the tensors sorted by dtype (I64, F64,
 * F32, I32, BF16, F16, F8_E4M3, F8_E5M2, U8, BOOL) and then by name (byte order), so that every tensor starts at a
 * multiple of its element size; non-contiguous tensors are written in row-major order. Without
 * metadata the file is byte for byte the one the Python package writes for the same tensors. The bytes go to a new temporary file next
 * to path, which is flushed to disk and renamed over path at the end: path holds either its old
 * content or the complete new file, never a partial one. Data is copied through host memory in
 * pieces of at most 64 MiB, and the call waits for the device. names and tensors may be NULL when n
 * is 0, metadata_kv when n_metadata is 0.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (ctx or path NULL, a NULL name, tensor, key or value, n or
 * n_metadata negative or above 1048576, a tensor of another context, a name or key given twice,
 * a reserved name, invalid UTF-8), FLAME_ERROR_INVALID_HANDLE, FLAME_ERROR_IO (the file cannot be
 * created, written or renamed; no temporary file is left behind), FLAME_ERROR_CUDA. */
FLAME_API flame_status_t flame_safetensors_save(flame_ctx_t ctx, const char* path, const char* const* names,
                                                const flame_tensor_t* tensors, int64_t n, const char* const* metadata_kv,
                                                int64_t n_metadata);

/* ============================== Named parameter lists ============================== */
/* A flame_params_t is an ordered list of named tensors of one context (a model's parameters, as
 * PyTorch's named_parameters / state_dict): saved to and loaded from a safetensors file in one call
 * each. The list holds a reference to each tensor and to its context. Names are unique, non-empty
 * UTF-8, not "__metadata__" (as in safetensors files). A tensor may appear under several names
 * (tied weights). Handles taken from the list are BORROWED: valid until the list is released. */

typedef struct flame_params_s* flame_params_t;

/* Flags of flame_params_load_safetensors (bitwise OR; 0 is strict, as PyTorch's load_state_dict). */
enum {
  FLAME_PARAMS_LOAD_ALLOW_MISSING = 1,    /* a parameter the file lacks keeps its value */
  FLAME_PARAMS_LOAD_ALLOW_UNEXPECTED = 2, /* a file tensor no parameter is named after is ignored */
  FLAME_PARAMS_LOAD_NON_STRICT = 3,       /* both: PyTorch's strict=False */
  FLAME_PARAMS_LOAD_CONVERT_DTYPE = 4     /* a file tensor of another dtype is converted to the
                                             parameter's (e.g. BF16 file into F32 parameters; as
                                             flame_to_dtype rounds); without it: DTYPE_MISMATCH */
};

/* OUT *params: a new, empty list on ctx; release it with flame_params_release.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (ctx or params NULL), FLAME_ERROR_INVALID_HANDLE. */
FLAME_API flame_status_t flame_params_create(flame_ctx_t ctx, flame_params_t* params);

/* Releases the list and its references to its tensors (the tensors live on while other references
 * hold them). NULL is a no-op; a released list is detected (nothing happens) while its context lives. */
FLAME_API void flame_params_release(flame_params_t params);

/* Appends t (BORROWED: the list takes a reference of its own; any dtype, shape and strides) under
 * name (NUL-terminated, copied). Nothing changes on error.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (params, name or t NULL; name empty, "__metadata__", not
 * UTF-8, or in the list already; t of another context; more than 1048576 entries),
 * FLAME_ERROR_INVALID_HANDLE (params or t released). */
FLAME_API flame_status_t flame_params_add(flame_params_t params, const char* name, flame_tensor_t t);

/* OUT *count: the number of entries. */
FLAME_API flame_status_t flame_params_count(flame_params_t params, int64_t* count);

/* OUT *name: the name of entry index (0 <= index < count, in the order of adding), BORROWED: owned
 * by the list. index out of range: FLAME_ERROR_INVALID_ARGUMENT. */
FLAME_API flame_status_t flame_params_name(flame_params_t params, int64_t index, const char** name);

/* OUT *t: the tensor of entry index, BORROWED (do not release it; retain it to keep it longer than
 * the list). Not recorded in handle scopes. index out of range: FLAME_ERROR_INVALID_ARGUMENT. */
FLAME_API flame_status_t flame_params_tensor(flame_params_t params, int64_t index, flame_tensor_t* t);

/* OUT *tensors: the list's count tensors in order, BORROWED as an array owned by the list, valid
 * until the next flame_params_add or the release (e.g. for flame_optimizer_create). *tensors is NULL
 * when the list is empty. */
FLAME_API flame_status_t flame_params_tensors(flame_params_t params, const flame_tensor_t** tensors);

/* OUT *t: the tensor called name, BORROWED as for flame_params_tensor, or NULL (and FLAME_OK) when
 * the list has no such entry. Constant time.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (params, name or t NULL), FLAME_ERROR_INVALID_HANDLE. */
FLAME_API flame_status_t flame_params_find(flame_params_t params, const char* name, flame_tensor_t* t);

/* Writes every entry to a safetensors file at path under its name, exactly as
 * flame_safetensors_save does with the same names, tensors and metadata (atomic replacement, the
 * Python package's layout, any dtype and strides). metadata_kv: 2 * n_metadata strings key0,
 * value0, ...; may be NULL when n_metadata is 0. Waits for the device.
 * Errors: as flame_safetensors_save (params instead of ctx), FLAME_ERROR_UNSUPPORTED during a CUDA
 * graph capture. */
FLAME_API flame_status_t flame_params_save_safetensors(flame_params_t params, const char* path, const char* const* metadata_kv,
                                                       int64_t n_metadata);

/* Copies the tensors of the safetensors file at path into the list's tensors of the same names, in
 * place (the handles, strides and autograd state stay; each tensor's version counter advances, as
 * for any in-place write, so graphs that saved it report FLAME_ERROR_INPLACE_MODIFIED). Shapes must
 * be equal; dtypes equal unless flags has FLAME_PARAMS_LOAD_CONVERT_DTYPE. flags 0 is strict: every
 * entry must be in the file and every file tensor must be an entry (FLAME_PARAMS_LOAD_ALLOW_MISSING,
 * _ALLOW_UNEXPECTED or _NON_STRICT relax that). The file and every entry are checked before anything
 * is written: after any error other than a device fault no tensor has changed. Entries not in the
 * file are left alone. The copies are queued on the context's stream (the call does not wait for
 * them; the file may be changed when it returns). Reading the file is as for flame_safetensors_load.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (params or path NULL, unknown flag bits, an entry missing
 * from the file or an unexpected file tensor under strict flags; the message lists up to 8 names and
 * the count), FLAME_ERROR_SHAPE_MISMATCH / FLAME_ERROR_DTYPE_MISMATCH (naming the entry, both shapes
 * / dtypes), FLAME_ERROR_UNSUPPORTED (a file tensor of a dtype FLAME lacks that an entry would read;
 * during a CUDA graph capture), FLAME_ERROR_INVALID_FORMAT, FLAME_ERROR_IO, FLAME_ERROR_INVALID_HANDLE,
 * FLAME_ERROR_OUT_OF_MEMORY (staging converted or strided entries), FLAME_ERROR_CUDA,
 * FLAME_ERROR_CONTEXT_FAILED. */
FLAME_API flame_status_t flame_params_load_safetensors(flame_params_t params, const char* path, uint32_t flags);

/* ============================== cuDNN ============================== */
/* The convolutions (flame_conv2d, flame_conv_transpose2d, flame_conv1d and their gradients) run
 * through NVIDIA cuDNN 9 when a context finds libcudnn.so.9 (the dynamic loader's search path, or
 * the file named by $FLAME_CUDNN_PATH), loaded at run time on the context's first convolution; FLAME
 * never links it. cuDNN takes f32, f16 and bf16 convolutions whose padding it can express (not
 * padding_same with an even dilated kernel extent, not an output_padding of at least the stride), with
 * only its deterministic algorithms, never FFT ones, f32 in IEEE FMAs unless the context allows TF32,
 * and the memory-format rules of "Convolution"; everything else, f64, and every convolution of a
 * context without cuDNN runs FLAME's own kernels, with the same results up to rounding. Set
 * FLAME_DISABLE_CUDNN=1 in the environment before flame_ctx_create to keep a context off cuDNN. */

/* OUT *version: the version of the cuDNN the context uses (cudnnGetVersion(), e.g. 91900 for 9.19.0),
 * loading it now if no convolution did yet; 0 when the context does not use cuDNN (not installed,
 * not loadable, or FLAME_DISABLE_CUDNN=1 at creation). OUT *convolutions: the convolutions (forward,
 * input gradient or weight gradient) the context ran through cuDNN so far.
 * Errors: ctx, version or convolutions NULL: FLAME_ERROR_INVALID_ARGUMENT; a failed context:
 * FLAME_ERROR_CONTEXT_FAILED. */
FLAME_API flame_status_t flame_ctx_cudnn_info(flame_ctx_t ctx, int32_t* version, uint64_t* convolutions);

/* ---- cuDNN attention ----
 * flame_scaled_dot_product_attention runs through cuDNN's fused flash attention, in a context that
 * uses cuDNN (as above), for f16/bf16 q, k, v without mask and without dropout, with one head dim
 * D == Dv that is a multiple of 8 and at most 128, causal (top-left, as documented there) or not, any
 * scale, Lq and Lk as given (cross-attention included), views with 16-byte aligned data and strides of
 * multiples of 8 elements read in place, when cuDNN builds a plan for those shapes on this GPU; its
 * first-order gradient then runs through cuDNN too. Everything else, and every shape cuDNN refuses
 * (tried once per shape), runs FLAME's own kernels with the same results up to rounding. With
 * FLAME_CUDNN_LOG=1 in the environment when cuDNN loads, each refusal is reported on stderr.
 * OUT *forward, *backward: the attentions and attention gradients the context ran through cuDNN so
 * far (0 and 0 for a context that does not use cuDNN).
 * Errors: ctx, forward or backward NULL: FLAME_ERROR_INVALID_ARGUMENT; a failed context:
 * FLAME_ERROR_CONTEXT_FAILED. */
FLAME_API flame_status_t flame_ctx_cudnn_attention_info(flame_ctx_t ctx, uint64_t* forward, uint64_t* backward);

/* ============================== CUDA graphs ============================== */
/* Records the work of FLAME calls on a context into a CUDA graph once, then replays it with one
 * launch: a whole training step (forward, backward, optimizer step, zero_grad) costs one call.
 *
 * Between flame_graph_capture_begin and flame_graph_capture_end, calls on the context do not run:
 * their kernels, memsets and device copies are recorded, with the tensors' device addresses and
 * every host-side value (shapes, scalars, which kernel) fixed at that moment. Each replay then runs
 * exactly that work on the same memory, asynchronously on the context's stream. So:
 *  - Inputs: create static input tensors before the capture and write each new batch into them
 *    between replays with flame_copy_from_host or flame_copy (a batch already on the GPU); the graph
 *    reads whatever they hold when it runs. Tensors created before the capture that the graph reads
 *    or writes (static inputs, parameters, their .grad, the optimizer) must stay alive while the
 *    graph may be replayed; FLAME keeps alive those released during the capture itself.
 *  - Outputs: tensors created during the capture (the loss, new .grad tensors) come from the
 *    capture's private memory; those you keep stay valid after capture_end and each replay rewrites
 *    them (their content is unspecified until the first replay). Intermediate tensors freed during
 *    the capture give their memory back to that private pool for later allocations of the same
 *    capture. The graph owns the pool until it is released; memory a kept tensor still uses is freed
 *    when both are released. Graphs of one step at several input shapes can share one pool
 *    (flame_graph_capture_begin_shared, below).
 *  - Optimizers: flame_optimizer_step reads the step count and the learning rate from device memory
 *    and advances the count on the device, so replaying a captured step N times equals N eager steps,
 *    and flame_optimizer_set_lr between replays takes effect at the next replay (a set_lr captured
 *    inside the graph sets that rate at every replay). Each replay adds one to
 *    flame_optimizer_step_count per captured step. The optimizer's state (moments) is created at
 *    capture time if needed; f16/bf16 master copies must already exist (run one eager step first).
 *  - Matrix products use the cuBLASLt algorithm already chosen for their shape; shapes first seen
 *    during the capture keep the heuristic's choice (timing candidates would need synchronisation).
 *    Kernels not compiled yet are compiled during the capture (a warm-up step before it avoids that).
 *  - flame_from_host during a capture makes a constant of the graph: the data is copied once, at
 *    capture time, and every replay reads that copy.
 *  - Not allowed during a capture (FLAME_ERROR_UNSUPPORTED): copies to the host (flame_to_host,
 *    flame_tensor_item), flame_copy_from_host, safetensors and optimizer-state files, DLPack
 *    export, flame_ctx_synchronize and anything else that waits for the
 *    device (flame_clip_grad_norm with error_if_nonfinite, the grad scaler's step), random numbers
 *    (flame_rand, dropout and stochastic rounding would repeat the same numbers at every replay),
 *    replaying a graph, and a nested capture_begin.
 *  - A call that fails during the capture (for any reason) aborts it: flame_graph_capture_end then
 *    returns that call's status with its message, discards the graph, and the context works as
 *    before. flame_ctx_destroy during a capture discards it (call it on the capturing thread).
 * Between begin and end the context belongs to the capture: calls from other threads on it are
 * captured too. capture_end must come from the thread that called capture_begin (the capture uses
 * CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: other threads and contexts keep working, while a CUDA call on
 * the capturing thread that a graph cannot represent fails instead of being recorded wrongly). */

typedef struct flame_graph_s* flame_graph_t;

/* Starts capturing the work of ctx's calls into a graph (nothing runs until a replay).
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (ctx NULL, or ctx is capturing already),
 * FLAME_ERROR_INVALID_HANDLE, FLAME_ERROR_CONTEXT_FAILED, FLAME_ERROR_CUDA. */
FLAME_API flame_status_t flame_graph_capture_begin(flame_ctx_t ctx);
/* Ends the capture begun on ctx. OUT *graph: a new graph (release with flame_graph_release); NULL on
 * failure, in which case the capture is discarded and ctx is usable again. out NULL: the capture is
 * ended and discarded, FLAME_ERROR_INVALID_ARGUMENT.
 * Errors: the status of a call that failed during the capture (its message follows this function's
 * name), FLAME_ERROR_INVALID_ARGUMENT (ctx not capturing, or called from another thread than
 * capture_begin: the capture is then aborted and must still be ended on its own thread),
 * FLAME_ERROR_INVALID_HANDLE, FLAME_ERROR_CUDA (the driver could not capture or instantiate). */
FLAME_API flame_status_t flame_graph_capture_end(flame_ctx_t ctx, flame_graph_t* graph);
/* Runs the captured work once more, asynchronously on the context's stream (ordered after the calls
 * made before it and before those made after it; flame_to_host or flame_ctx_synchronize wait for it).
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (graph NULL), FLAME_ERROR_INVALID_HANDLE (released graph),
 * FLAME_ERROR_UNSUPPORTED (the context is capturing), FLAME_ERROR_CONTEXT_FAILED, FLAME_ERROR_CUDA. */
FLAME_API flame_status_t flame_graph_replay(flame_graph_t graph);
/* Releases the graph and the private memory only it uses (in stream order: replays already queued
 * still run). Tensors created during its capture stay valid. NULL: no-op. */
FLAME_API void flame_graph_release(flame_graph_t graph);
/* Writes nbytes of host data (row-major, dst's dtype) into the existing contiguous tensor dst (borrowed),
 * in stream order: the static-input pattern of graphs. data may be reused when the call returns.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (dst or data NULL, dst not contiguous, nbytes not numel * dtype
 * size), FLAME_ERROR_INVALID_HANDLE, FLAME_ERROR_UNSUPPORTED (during a capture). */
FLAME_API flame_status_t flame_copy_from_host(flame_tensor_t dst, const void* data, size_t nbytes);
/* Writes src into the existing tensor dst in place (both borrowed, same context), converting src's
 * dtype to dst's (flame_to_dtype's rules), in stream order: the device-side counterpart of
 * flame_copy_from_host, e.g. to refill a graph's static inputs with a batch already on the GPU, or to
 * copy one set of weights into another. src may have any strides (views, broadcast expand
 * included); dst must be contiguous. Allowed during a capture (the copy becomes a node of the graph).
 * Autograd: the copy is not recorded (no gradient flows to src) and it bumps dst's version, so a
 * backward that saved dst fails with FLAME_ERROR_INPLACE_MODIFIED; a dst that requires grad (a
 * parameter) may be written only with grad mode off (flame_ctx_set_grad_enabled), as PyTorch's
 * copy_ under no_grad. A src that is dst itself (same memory and layout) is a no-op.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (dst or src NULL, another context, dst not contiguous, dst
 * requires grad while grad mode is on, src and dst partly overlap in memory),
 * FLAME_ERROR_SHAPE_MISMATCH (shapes differ), FLAME_ERROR_INVALID_HANDLE (a released tensor),
 * FLAME_ERROR_CONTEXT_FAILED. On error dst is unchanged. */
FLAME_API flame_status_t flame_copy(flame_tensor_t dst, flame_tensor_t src);
/* Starts a capture like flame_graph_capture_begin, whose private memory pool is the pool of
 * share_pool_with, a live graph of ctx (borrowed; it may be released at any time afterwards), as
 * PyTorch's torch.cuda.graph(pool=other.pool()). Meant for one training step captured at several
 * input shapes (one graph per shape, same parameters, .grad tensors and optimizer): the new capture
 * reuses the memory that the pool's earlier captures needed only inside their graphs (intermediates),
 * so N graphs sharing a pool hold about what the largest needs instead of N times a step's
 * activations. share_pool_with NULL: exactly flame_graph_capture_begin (a pool of its own).
 *  - Graphs sharing a pool must not run at the same time. Graphs of one context replay in stream
 *    order, one after the other, so this always holds.
 *  - A tensor created during the capture of one graph of the pool and kept by the caller (an output
 *    such as the loss, or a .grad the capture created) may be overwritten by a replay of ANOTHER graph
 *    of the same pool: read or copy it after its own graph's replay, before replaying another graph
 *    of the pool. Tensors created before a capture (parameters, a .grad that existed already,
 *    optimizer state, static inputs) are never in the pool; they are read and written only as the
 *    captured calls say.
 *  - The pool is freed when the last graph using it is released; memory a kept tensor still uses is
 *    freed when that tensor is released too.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (ctx NULL; ctx capturing already; share_pool_with a graph of
 * another context), FLAME_ERROR_INVALID_HANDLE (ctx not a live context; share_pool_with released or
 * not a graph), FLAME_ERROR_CONTEXT_FAILED, FLAME_ERROR_CUDA. Nothing changes on an error, except
 * that a call failing while ctx captures aborts that capture, as any call does (see above). */
FLAME_API flame_status_t flame_graph_capture_begin_shared(flame_ctx_t ctx, flame_graph_t share_pool_with);

/* ============================== Distributed: NCCL communicators and data parallelism ============================== */
/* Multi-GPU training over NCCL (libnccl.so.2, 2.14 or newer, loaded at run time: set
 * $FLAME_NCCL_PATH to load another file). Without it every function of this section that needs it
 * returns FLAME_ERROR_UNSUPPORTED with the loader's reason; libflame itself never needs NCCL.
 *
 * A communicator is one rank of a group of world_size ranks, bound to one context (one GPU): one
 * process per GPU (ranks exchange a flame_comm_id_t by their own means: MPI, a file, a socket), or
 * one process driving several GPUs (one context each) with one thread per rank, or from one thread
 * with flame_comm_create_group. Every rank must issue the same collectives in the same order, each
 * from the thread driving it (NCCL needs the ranks to run concurrently: one thread cannot call a
 * collective on two of its communicators in turn).
 *
 * Ordering: the collectives run on the context's stream, in order with every other operation of
 * the context (like a kernel; the call returns once the work is queued). Failures: NCCL runs
 * non-blocking; every wait in this section polls with the communicator's timeout, and past it (or
 * when NCCL reports an error, such as a peer that went away) aborts the communicator and returns
 * FLAME_ERROR_CUDA; an aborted communicator stays unusable (every later call on it returns
 * FLAME_ERROR_CUDA with the reason). Wait with flame_comm_synchronize (or flame_dp_wait) rather than
 * flame_ctx_synchronize / flame_to_host, which wait without a timeout when a peer never comes. */

typedef struct flame_comm_s* flame_comm_t; /* one rank of an NCCL communicator */
typedef struct flame_dp_s* flame_dp_t;     /* a data-parallel gradient synchroniser */

/* The identity of a communicator to create (ncclUniqueId): 128 opaque bytes, copied as a value. */
#define FLAME_COMM_ID_BYTES 128
typedef struct flame_comm_id_t {
  uint8_t internal[FLAME_COMM_ID_BYTES];
} flame_comm_id_t;

/* Options of flame_comm_create. Fill with flame_comm_options_init; the struct may grow at its end. */
typedef struct flame_comm_options_t {
  size_t struct_size; /* sizeof(flame_comm_options_t), set by flame_comm_options_init */
  int64_t timeout_ms; /* how long any wait of this communicator may take before it aborts (creation
                         included); default 600000 (10 minutes); in [1, 2^40] */
} flame_comm_options_t;

/* Reductions of flame_comm_all_reduce and flame_comm_reduce_scatter. */
typedef enum flame_reduce_op_t {
  FLAME_REDUCE_SUM = 0,
  FLAME_REDUCE_AVG = 1, /* sum / world_size; floating dtypes only */
  FLAME_REDUCE_MAX = 2,
  FLAME_REDUCE_MIN = 3
} flame_reduce_op_t;

/* Sets opts to the defaults above. opts NULL: FLAME_ERROR_INVALID_ARGUMENT. */
FLAME_API flame_status_t flame_comm_options_init(flame_comm_options_t* opts);
/* OUT *id: a new communicator identity (ncclGetUniqueId). Make it on one rank and give the same
 * bytes to every rank's flame_comm_create. ctx: any live context (NCCL is loaded for it).
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (NULLs), FLAME_ERROR_UNSUPPORTED (no NCCL),
 * FLAME_ERROR_CUDA (NCCL failed: no network interface for its bootstrap, ...). */
FLAME_API flame_status_t flame_comm_unique_id(flame_ctx_t ctx, flame_comm_id_t* id);
/* Hands rank 0's *id to every rank of a job whose ranks are separate processes, over TCP (the
 * torchrun convention: pass MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE). Needs no context and no GPU.
 * Rank 0 listens on master_addr:master_port (an address or host name of rank 0's own host; it binds
 * there, with SO_REUSEADDR) until world_size - 1 distinct ranks have said hello, then sends them *id
 * (an INPUT on rank 0, unchanged). Every other rank connects (retrying while rank 0 is not up yet)
 * and OUT: *id is written with rank 0's bytes (zeroed on failure). Clients that are not FLAME ranks
 * are dropped; a rank with another world_size, a rank out of range or a rank already present is
 * refused with a message (rank 0 goes on waiting). world_size 1: returns at once, no network.
 * timeout_seconds in (0, 86400]: rank 0 waits that long for every rank, then fails naming the ranks
 * that did not arrive and sends that message to the ranks that did (they fail with it too); a rank
 * that cannot reach rank 0 in that time fails naming the address; a connected rank waits 5 s more
 * for rank 0's verdict. The call blocks the calling thread throughout.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (NULLs, empty address, port outside [1, 65535],
 * world_size < 1, rank outside [0, world_size), bad timeout), FLAME_ERROR_IO (name resolution,
 * listen/connect failures, timeouts, refusals: the message names the address and the ranks). */
FLAME_API flame_status_t flame_comm_rendezvous(const char* master_addr, int32_t master_port, int32_t rank,
                                               int32_t world_size, double timeout_seconds, flame_comm_id_t* id);
/* Creates rank `rank` of world_size ranks on ctx's GPU, waiting (up to the timeout) until every rank
 * has joined. id (borrowed bytes) must be the same on every rank; opts may be NULL (defaults). OUT
 * *out: a new communicator (release with flame_comm_release); it keeps ctx alive. Two ranks of one
 * communicator must be on different GPUs.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (NULLs, world_size < 1, rank outside [0, world_size), bad
 * options), FLAME_ERROR_UNSUPPORTED (no NCCL), FLAME_ERROR_CUDA (NCCL failed, or the timeout passed
 * before every rank joined). */
FLAME_API flame_status_t flame_comm_create(flame_ctx_t ctx, const flame_comm_id_t* id, int32_t rank, int32_t world_size,
                                           const flame_comm_options_t* opts, flame_comm_t* out);
/* Jobs started by a launcher (flame-run, torchrun, or any that sets the torchrun variables): each
 * process reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT from its environment, and
 * optionally FLAME_RENDEZVOUS_TIMEOUT (seconds in (0, 86400], default 300).
 * OUT *local_rank: LOCAL_RANK, the GPU ordinal this process should create its context on
 * (flame_ctx_options_t.device), after every variable above was checked as in
 * flame_comm_create_from_env. Needs no context and no GPU.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (local_rank NULL; a variable missing, empty, not a number or
 * out of range: WORLD_SIZE >= 1, RANK and LOCAL_RANK in [0, WORLD_SIZE), MASTER_PORT in [1, 65535];
 * the message names the variable and its value). *local_rank is 0 on failure. */
FLAME_API flame_status_t flame_comm_env_local_rank(int32_t* local_rank);
/* Creates this process's rank of the launcher's job: reads the variables above, checks that ctx is
 * on device LOCAL_RANK (or on device 0 when the process sees exactly one GPU, as with a per-rank
 * CUDA_VISIBLE_DEVICES), rank 0 makes a communicator identity, flame_comm_rendezvous hands it to
 * every rank over MASTER_ADDR:MASTER_PORT (with FLAME_RENDEZVOUS_TIMEOUT), then flame_comm_create
 * (rank RANK of WORLD_SIZE; opts may be NULL, as there). OUT *out: a new communicator (NULL on
 * failure). Blocks until every rank arrived or a timeout passed.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (NULLs, bad options, a bad variable as in
 * flame_comm_env_local_rank, ctx on another device than LOCAL_RANK), FLAME_ERROR_IO (rendezvous:
 * a rank that did not arrive is named), FLAME_ERROR_UNSUPPORTED (no NCCL), FLAME_ERROR_CUDA. */
FLAME_API flame_status_t flame_comm_create_from_env(flame_ctx_t ctx, const flame_comm_options_t* opts, flame_comm_t* out);
/* Creates the n ranks of one communicator from one thread: rank i on ctxs[i] (borrowed; n distinct
 * contexts on distinct GPUs), written into comms[i] (new references; all NULL on failure). n >= 1;
 * opts as flame_comm_create. Errors as flame_comm_create. */
FLAME_API flame_status_t flame_comm_create_group(const flame_ctx_t* ctxs, int32_t n, const flame_comm_options_t* opts,
                                                 flame_comm_t* comms);
/* Frees the communicator: waits (up to the timeout) for its queued collectives, then finalizes and
 * destroys it, or aborts it when that fails or times out. Finalizing waits until every rank has
 * released its communicator, so release it on every rank concurrently (each from the thread driving
 * that rank), as creation; a rank releasing alone waits for the timeout and then aborts. A
 * data-parallel helper made over it keeps it alive until the helper goes. NULL is a no-op; a
 * released handle is detected (nothing happens) while its context lives. */
FLAME_API void flame_comm_release(flame_comm_t comm);
/* OUT *rank: this communicator's rank; OUT *size: its world size. */
FLAME_API flame_status_t flame_comm_rank(flame_comm_t comm, int32_t* rank);
FLAME_API flame_status_t flame_comm_size(flame_comm_t comm, int32_t* size);
/* Waits, up to the timeout, until the context's stream (collectives included) is idle, then reports
 * asynchronous faults as flame_ctx_synchronize. Timeout or NCCL error: FLAME_ERROR_CUDA, and the
 * communicator is aborted. */
FLAME_API flame_status_t flame_comm_synchronize(flame_comm_t comm);

/* The collectives: every rank calls the same one with tensors of the same shape and dtype (NCCL
 * does not check; a mismatch corrupts results or hangs until the timeout). Tensors (borrowed)
 * must belong to the communicator's context. Dtypes: f32, f16, bf16, f64, i32, i64, u8 (reductions
 * of f16/bf16 accumulate in their own precision, as NCCL does); bool, f8_e4m3 and f8_e5m2 for broadcast and all_gather (the f8 dtypes in
 * reductions: FLAME_ERROR_UNSUPPORTED).
 * Autograd: collectives have no backward. The in-place ones (all_reduce, broadcast) refuse a tensor
 * that requires grad while grad mode is on (FLAME_ERROR_INVALID_ARGUMENT, as any in-place write
 * to it would) and move its version (a graph that saved it cannot be walked any more); the others
 * refuse such an input with FLAME_ERROR_NOT_DIFFERENTIABLE. Use them on detached tensors, or on
 * gradients with grad mode off. Common errors: FLAME_ERROR_INVALID_ARGUMENT (NULLs, tensor of
 * another context, non-contiguous in-place tensor), FLAME_ERROR_DTYPE_MISMATCH (dtype NCCL lacks,
 * bool in a reduction, AVG of an integer dtype), FLAME_ERROR_CUDA (NCCL failed; aborted). */

/* Replaces t, in place, with the reduction (op, a flame_reduce_op_t) of t over all ranks. t must be
 * contiguous. */
FLAME_API flame_status_t flame_comm_all_reduce(flame_comm_t comm, flame_tensor_t t, int32_t op);
/* Replaces t, in place, with rank root's t. root in [0, world_size). t must be contiguous. */
FLAME_API flame_status_t flame_comm_broadcast(flame_comm_t comm, flame_tensor_t t, int32_t root);
/* OUT *out: a new tensor, the inputs of ranks 0..world-1 concatenated along dim 0 (shape
 * [world * d0, ...] for in [d0, ...]; [world] for a 0-d in). in may be strided. */
FLAME_API flame_status_t flame_comm_all_gather(flame_comm_t comm, flame_tensor_t in, flame_tensor_t* out);
/* OUT *out: a new tensor [d0 / world, ...], this rank's block (rank r: rows r*d0/world ...) of the
 * reduction (op) of in [d0, ...] over all ranks. d0 not a multiple of world_size, or in 0-d:
 * FLAME_ERROR_SHAPE_MISMATCH. in may be strided. */
FLAME_API flame_status_t flame_comm_reduce_scatter(flame_comm_t comm, flame_tensor_t in, int32_t op, flame_tensor_t* out);

/* ---- data parallelism (as torch DistributedDataParallel) ---- */
/* Each rank runs the same model on its part of the batch: flame_dp_create broadcasts the parameters
 * from rank 0 and registers post-accumulate hooks on them; during backward the hooks copy each
 * gradient into a bucket (buckets fill in reverse parameter order, which is backward order when the
 * parameters are listed in forward order) and all-reduce (average) each bucket on a communication
 * stream as soon as it is full, ordered with events against the context's stream; flame_dp_wait
 * finishes the round and writes the averages into .grad; then step the optimizer. With gradient
 * accumulation, turn sync off for the micro-steps that only accumulate (no communication) and on for
 * the last one. The engine runs these hooks as soon as each parameter's gradient is complete during
 * its reverse walk (see flame_backward), so a full bucket's all-reduce overlaps the backward of the
 * layers before it. */

/* Options of flame_dp_create. Fill with flame_dp_options_init; the struct may grow at its end. */
typedef struct flame_dp_options_t {
  size_t struct_size;            /* sizeof(flame_dp_options_t), set by flame_dp_options_init */
  uint64_t bucket_bytes;         /* a bucket is all-reduced once this many bytes of gradients are in it
                                    (a larger parameter gets a bucket of its own); default 64 MiB;
                                    in [1, 2^40]. The helper holds one bucket buffer per bucket. */
  int32_t broadcast_parameters;  /* 1 (default): copy rank 0's parameter values to every rank at
                                    creation; 0: leave them (the caller made them equal) */
} flame_dp_options_t;

/* Sets opts to the defaults above. opts NULL: FLAME_ERROR_INVALID_ARGUMENT. */
FLAME_API flame_status_t flame_dp_options_init(flame_dp_options_t* opts);
/* Collective: every rank calls it with the same parameter list params[0..n) (borrowed; the helper
 * keeps references): contiguous floating leaves that require grad, of comm's context, each once.
 * It first compares every rank's list (count, dtypes and shapes in order, plus whether the rank's
 * own checks passed), so that a rank with a different model makes every rank fail (not hang):
 * FLAME_ERROR_SHAPE_MISMATCH on the ranks whose own list was fine. Then broadcasts the parameters
 * from rank 0 (opts), and registers its hooks. opts may be NULL (defaults). OUT *out: a new helper
 * (release with flame_dp_release); it keeps comm alive. Sync starts on. n may be 0.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (NULLs, bad options, a parameter that is not a contiguous leaf
 * requiring grad, of comm's context, listed once; another rank failed its checks),
 * FLAME_ERROR_SHAPE_MISMATCH, FLAME_ERROR_DTYPE_MISMATCH, FLAME_ERROR_CUDA (NCCL failed or timed
 * out: the communicator is aborted). */
FLAME_API flame_status_t flame_dp_create(flame_comm_t comm, const flame_tensor_t* params, int64_t n, const flame_dp_options_t* opts,
                                         flame_dp_t* out);
/* sync != 0 (the default): backward all-reduces the gradients (call flame_dp_wait after it);
 * sync == 0: backward only accumulates into .grad, and flame_dp_wait does nothing. Every rank must
 * use the same setting for each backward. */
FLAME_API flame_status_t flame_dp_set_sync(flame_dp_t dp, int32_t sync);
/* With sync on: finishes the round (packs every parameter whose hook did not run in this round from
 * its .grad, or zeros without one; all-reduces the buckets still pending), waits for the
 * communication (up to the communicator's timeout) and makes .grad of every parameter the averaged
 * gradient: a view into the helper's bucket buffer, as torch DDP's gradient_as_bucket_view (no copy
 * back; the next backward accumulates into it in place unless .grad was set to none, and the next
 * round overwrites it: clone a .grad to keep it). Call it on every rank after each backward
 * with sync on, before the optimizer step. A backward that delivers a parameter's gradient twice
 * before flame_dp_wait fails in that parameter's hook (FLAME_ERROR_INVALID_ARGUMENT).
 * Errors: FLAME_ERROR_CUDA (NCCL failed or timed out: aborted). With sync off: does nothing. */
FLAME_API flame_status_t flame_dp_wait(flame_dp_t dp);
/* Removes the hooks, waits for communication in flight (up to the timeout) and frees the buckets;
 * the parameters and their .grad stay. NULL is a no-op; a released handle is detected (nothing
 * happens) while its context lives. */
FLAME_API void flame_dp_release(flame_dp_t dp);

/* ---- sharded optimizer state (ZeRO-1 and ZeRO-2, as DeepSpeed's stages 1 and 2) and sharded
 * model parameters (ZeRO-3, as PyTorch FSDP; stage 3 below) ---- */
/* Each rank keeps the whole model (parameters replicated, as with flame_dp) but only 1/world_size
 * of the optimizer's state: the parameters of each dtype, in the optimizer's order (groups, then
 * parameters), are flattened into one sequence, padded to a multiple of world_size and cut into
 * world_size equal contiguous shards; rank r owns shard r (its moments and, with master_weights,
 * its f32 master copy of bf16/f16 parameters). flame_zero_step replaces flame_dp_wait +
 * flame_optimizer_step: it averages the gradients over the ranks (stage 1: all-reduce of all of
 * them; stage 2: reduce-scatter, so that each rank receives only its shard's average), optionally
 * clips them by the global 2-norm (over every rank's shard, as flame_clip_grad_norm over the whole
 * model), steps the owned elements with the optimizer's fused kernel, and all-gathers the updated
 * parameters, so that every rank ends the step with the same parameters as a replicated run (within
 * rounding: the reductions sum in another order). Every rank must call every function of this
 * part (except the release) in the same order.
 * Gradients: backward accumulates into .grad as usual (several backwards accumulate; zero_grad and
 * set_to_none work); the step reads .grad (a parameter without one counts as zeros). Stage 1 then
 * leaves .grad as the averaged (and clipped) gradient, a view into the helper's gradient buffer (as
 * flame_dp_wait);
 * stage 2 sets every .grad to none after the reduce-scatter, so that full gradients live only
 * between backward and step. Memory per rank (P parameter elements, AdamW with f32 master weights
 * of bf16 parameters): replicated 2P + 2P + 12P bytes; stage 1 2P + 2P + 12P/world (+ a 2P
 * gradient buffer kept across steps); stage 2 2P + 2P (during backward only) + 12P/world. The
 * reduce-scatter of stage 2 and every stage's parameter all-gather run in buckets of at most 256 MiB,
 * so that no flat copy of all gradients or parameters is made during the step.
 * The optimizer (flame_optimizer_*) keeps working for zero_grad, set_lr, get_lr and step_count;
 * flame_optimizer_step, flame_optimizer_add_param_group, flame_optimizer_save_state and
 * flame_optimizer_load_state refuse a sharded optimizer (use flame_zero_step, and
 * flame_zero_save_full, flame_zero_save_shards and flame_zero_load for its state:
 * FLAME_ERROR_UNSUPPORTED). It stays sharded after flame_zero_release. */
typedef struct flame_zero_s* flame_zero_t; /* the sharding of one optimizer over one communicator */
typedef struct flame_model_s* flame_model_t; /* a model: see "Models" below */

/* flame_zero_options_t's reduce_dtype and gather_dtype: communicate in the parameters' own dtype. */
#define FLAME_ZERO_PARAM_DTYPE (-1)

/* Options of flame_zero_create. Fill with flame_zero_options_init; the struct may grow at its end. */
typedef struct flame_zero_options_t {
  size_t struct_size;           /* sizeof(flame_zero_options_t), set by flame_zero_options_init */
  int32_t stage;                /* 1 (default): all-reduce the gradients; 2: reduce-scatter them */
  int32_t broadcast_parameters; /* 1 (default): copy rank 0's parameter values to every rank at
                                   creation; 0: leave them (the caller made them equal) */
  double max_grad_norm;         /* > 0: flame_zero_step scales the gradients by
                                   min(1, max_grad_norm / (norm + 1e-6)), norm the 2-norm of all
                                   gradients of all ranks' shards; 0 (default): no clipping. Finite. */
  flame_model_t model;          /* stage 3: the model whose block parameters are sharded (borrowed;
                                   the helper keeps it alive); NULL (default) for stages 1 and 2 */
  int32_t gather_slots;         /* stage 3: device buffers of gathered blocks, in [2, 64]; default 2 */
  /* Mixed precision of communication (read only when struct_size covers both fields; every rank
   * must pass the same values): */
  int32_t reduce_dtype;         /* the dtype the gradients are averaged in over the ranks (stage 1's
                                   all-reduce, stage 2's and 3's reduce-scatters):
                                   FLAME_ZERO_PARAM_DTYPE (default): each parameter's own dtype;
                                   FLAME_DTYPE_F32 or FLAME_DTYPE_BF16: each rank's gradients are
                                   cast to it before the collective and the average is cast back to
                                   the parameter's dtype after (stage 3: then added to the gradient
                                   shard, which accumulates in the parameter's dtype), as PyTorch
                                   FSDP2's MixedPrecisionPolicy(reduce_dtype). bf16 halves the bytes
                                   sent for f32 parameters and rounds each rank's gradient to bf16
                                   (8 significant bits) even on one rank; f32 for bf16 parameters
                                   sums the ranks' gradients without bf16 rounding in between. The
                                   step's clipping and the optimizer see the average in the
                                   parameter's dtype. Other values: FLAME_ERROR_INVALID_ARGUMENT. */
  int32_t gather_dtype;         /* stage 3: the dtype of the parameter all-gather before each block:
                                   FLAME_ZERO_PARAM_DTYPE (default): the parameters' dtype;
                                   FLAME_DTYPE_BF16: each f32 block is gathered as bf16 (half the
                                   bytes) from a bf16 copy of each rank's shard (made after each
                                   step: 2 more bytes per shard element) and widened back to f32 in
                                   its gather buffer (each buffer 1.5x the block's f32 size), so the
                                   block computes in f32 with its weights rounded to bf16; the
                                   shards, the optimizer step and flame_zero_gather_params /
                                   flame_zero_save_* keep the exact f32 values (FSDP2's
                                   param_dtype = bf16 without the bf16 compute). Blocks of bf16/f16
                                   parameters are gathered in their dtype either way. Stages 1 and 2
                                   gather the stepped parameters in their own dtype always (a rounded
                                   copy would make ranks differ): gather_dtype other than
                                   FLAME_ZERO_PARAM_DTYPE with stage 1 or 2, or any other value:
                                   FLAME_ERROR_INVALID_ARGUMENT. */
} flame_zero_options_t;

/* Stage 3 (parameter sharding, ZeRO-3 / FSDP) shards a model's parameters too: set opts->stage 3
 * and opts->model (a flame_model_t; the optimizer's parameters are usually flame_model_params of
 * it, plus any adapters). The model must have run one forward before (any inputs of the shapes it
 * will train on; gradients may be off), in which it learns which parameters each repeated block
 * (transformer layer, resnet / attention unit) reads, as the model option "offload" does. Then,
 * collectively: every rank's model must have learnt the same blocks (else FLAME_ERROR_INVALID_ARGUMENT
 * on every rank, nothing changed); rank 0's values are broadcast (opts->broadcast_parameters); each
 * block whose parameters share one dtype becomes one flat, each parameter starting on a 256-byte
 * boundary, padded and cut into world_size shards; rank r keeps shard r and the parameter tensors
 * give their memory up. They stay the same handles with their name, shape, dtype and
 * requires_grad (flame_tensor_shape, _dtype, _numel, _requires_grad, _set_requires_grad, _grad work),
 * but hold no values: passing one to any other entry point, or in a flame_params_t list, fails
 * with FLAME_ERROR_INVALID_ARGUMENT, and flame_model_save, flame_model_add_lora, _load_lora and
 * _merge_lora refuse the model (FLAME_ERROR_INVALID_ARGUMENT); flame_zero_gather_params returns the
 * whole values. Parameters read outside blocks or by two blocks (embeddings, final norms and
 * projections) and parameters that are not the model's (adapters) stay whole on every rank and are
 * handled as in stage 2 (their gradients reduce-scattered at the step, their optimizer state
 * sharded, the updated values all-gathered).
 * Forward: each sharded block's parameters are all-gathered into one of gather_slots device
 * buffers on a stream of the communicator's context of its own just before the block runs (the next
 * block's gather overlaps the current block's kernels; no host synchronisation), and the buffer is
 * reused once the block's views are gone. Sharded blocks always run gradient-checkpointed while a
 * graph is recorded (whatever flame_model_set_checkpointing says): the forward keeps no gathered
 * weight; backward gathers each block again for its recompute (in reverse order, prefetching the
 * block before), then reduce-scatters (average) the block's gradients on the context's stream as
 * soon as its backward is done, adding them to this rank's gradient shard; those accumulate over
 * several backwards and flame_zero_step consumes them (flame_optimizer_zero_grad does not reach
 * them). Every rank must run the same forwards and backwards (same blocks, same order), as with
 * every collective. flame_grad through the model does not compute the sharded parameters'
 * gradients; create_graph through them fails (FLAME_ERROR_UNSUPPORTED); not during a CUDA graph
 * capture (FLAME_ERROR_UNSUPPORTED).
 * Step: the optimizer steps each rank's owned elements in place in its shard (f32 master copies of
 * bf16/f16 parameters with master_weights, moments: 1/world_size each); max_grad_norm and the
 * returned norm cover every gradient of the shards (those of block parameters outside the
 * optimizer included). Memory per rank (P block parameter elements in bf16, AdamW with f32 master
 * weights): 2P/world + 2P/world (gradient shards) + 12P/world, plus gather_slots buffers of the
 * largest block and, during backward, one block's whole gradients. Not with the model options
 * "offload" or "quantize" (FLAME_ERROR_INVALID_ARGUMENT). */

/* Sets opts to the defaults above. opts NULL: FLAME_ERROR_INVALID_ARGUMENT. */
FLAME_API flame_status_t flame_zero_options_init(flame_zero_options_t* opts);
/* Collective: shards opt (borrowed; the helper keeps it alive) over comm (kept alive too); opt must
 * belong to comm's context and must not have stepped yet (nor hold loaded state). Every rank passes
 * an optimizer with the same parameter list (counts, dtypes and shapes, in order), compared as in
 * flame_dp_create. Broadcasts the parameters from rank 0 (opts). opts may be NULL (defaults).
 * Stage 3 also shards opts->model's block parameters, as described above (the model keeps being
 * sharded after flame_zero_release: the helper's shards stay with it).
 * OUT *out: a new helper (release with flame_zero_release).
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (NULLs, bad options: stage outside [1, 3], opts->model NULL
 * with stage 3 or set with stage 1 or 2, gather_slots outside [2, 64], reduce_dtype not
 * FLAME_ZERO_PARAM_DTYPE, FLAME_DTYPE_F32 or FLAME_DTYPE_BF16, gather_dtype not FLAME_ZERO_PARAM_DTYPE
 * or FLAME_DTYPE_BF16 or set with stage 1 or 2: nothing is created); optimizer of another context,
 * stepped or sharded already; stage 3: a model handle that is not live, of another context, sharded
 * already, made with "offload" or "quantize", that has not run a forward, or whose blocks differ
 * from another rank's; another rank failed its checks), FLAME_ERROR_SHAPE_MISMATCH (another rank's
 * parameter list differs), FLAME_ERROR_CUDA (NCCL failed or timed out: the communicator is aborted). */
FLAME_API flame_status_t flame_zero_create(flame_comm_t comm, flame_optimizer_t opt, const flame_zero_options_t* opts,
                                           flame_zero_t* out);
/* Collective: one optimizer step over all ranks, as described above. The collectives and kernels are
 * queued on the context's stream (no wait; flame_comm_synchronize waits with the timeout).
 * OUT *total_norm (may be NULL): a new 0-d f32 tensor, the global 2-norm of the averaged gradients
 * before clipping (computed whenever it is asked for or max_grad_norm > 0).
 * Errors: FLAME_ERROR_SHAPE_MISMATCH (a .grad of another shape or dtype than its parameter),
 * FLAME_ERROR_CUDA (NCCL failed or timed out: aborted), the errors of flame_optimizer_step. */
FLAME_API flame_status_t flame_zero_step(flame_zero_t zero, flame_tensor_t* total_norm);
/* Frees the helper's buffers (the optimizer stays sharded: release it too). NULL is a no-op; a
 * released handle is detected (nothing happens) while its context lives. */
FLAME_API void flame_zero_release(flame_zero_t zero);
/* Collective (stage 3): every parameter of the helper's model with the values all ranks hold, for
 * saving or comparing: OUT *params, a new list (release with flame_params_release) of the model's
 * parameters by name in flame_model_params' order; the sharded ones are all-gathered into new
 * tensors (so the call needs the memory of the whole model's sharded parameters on every rank), the
 * others are the model's own tensors. Queued on the context's stream; no wait.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (NULLs, a helper of stage 1 or 2, its model released),
 * FLAME_ERROR_CUDA (NCCL failed or timed out: aborted). */
FLAME_API flame_status_t flame_zero_gather_params(flame_zero_t zero, flame_params_t* params);
/* OUT *bytes: device memory held by opt's state tensors on this rank (moments and their 8-bit
 * absmax, master weights; 0 before the first step), to compare sharded and replicated runs. */
FLAME_API flame_status_t flame_optimizer_state_bytes(flame_optimizer_t opt, uint64_t* bytes);

/* ---- checkpoints of sharded training (any stage; they load on any number of ranks) ----
 * Format: a "shard set" is world_size safetensors files; the file of rank r holds, for every
 * parameter i of the optimizer (numbered 0, 1, ... across its groups in order, as torch's
 * state_dict and flame_optimizer_save_state), the elements [lo, hi) (row-major) that rank r owned:
 *   param.<i>                                    the parameter's values, in its dtype
 *   state.<i>.exp_avg, state.<i>.exp_avg_sq,     Adam / AdamW moments (exp_avg only: Lion;
 *   state.<i>.max_exp_avg_sq, state.<i>.momentum_buffer   amsgrad; SGD with momentum)
 *   master.<i>                                   f32 master weights of f16/bf16 parameters
 * state in f32 (f64 for f64 parameters), each tensor 1-D of hi - lo elements, absent when hi == lo
 * or when the parameter has no such state yet (never stepped). Metadata "flame.zero_shard": JSON
 * {"version": 1, "world": W, "rank": r, "kind": "adamw", "step": n, "rounding_rng": {"seed": s,
 * "offset": o} or null, "lr": [lr of group 0, ...], "files": [base names of the W files, by rank],
 * "params": [{"shape": [...], "dtype": "bf16", "lo": lo, "hi": hi}, ...]}. The ranges of the W files
 * tile each parameter's elements exactly. A gathered file (flame_zero_save_full) is the set of one
 * rank that owned everything: world 1, lo 0, hi numel, every tensor in its parameter's shape (so
 * param.<i> is the whole parameter, readable with flame_safetensors_load).
 * Parameters that are not the optimizer's (stage 3 block parameters it does not train) are not
 * saved. Hyper-parameters other than the learning rates are not saved: the loading optimizer keeps
 * its own (its kind, parameter count, shapes and dtypes must match the file's). */

/* Collective: every rank's owned parameter elements and optimizer state are gathered (one tensor
 * at a time: the call needs the memory of the largest parameter's state on every rank) and rank 0
 * writes them to path as one safetensors file (format above; replaced atomically). Other ranks
 * write nothing (path is read on rank 0 only but must not be NULL anywhere). Waits for the
 * communication (up to the communicator's timeout).
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (NULLs), FLAME_ERROR_IO (rank 0 cannot write path; rank 0
 * still joins every collective, so the other ranks finish and return FLAME_OK), FLAME_ERROR_UNSUPPORTED (during a CUDA graph capture), FLAME_ERROR_CUDA
 * (NCCL failed or timed out: aborted). */
FLAME_API flame_status_t flame_zero_save_full(flame_zero_t zero, const char* path);
/* Every rank writes its own file of a shard set, "<path_prefix>-<rank>-of-<world>.safetensors"
 * (format above; replaced atomically), with no communication: call it on every rank after the same
 * step. The directory must exist.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (NULLs), FLAME_ERROR_IO (cannot write),
 * FLAME_ERROR_UNSUPPORTED (during a CUDA graph capture). */
FLAME_API flame_status_t flame_zero_save_shards(flame_zero_t zero, const char* path_prefix);
/* Loads a checkpoint into this rank's parameters and sharded optimizer state: path is a gathered
 * file or any one file of a shard set (the others are found by the names its metadata lists, in the
 * same directory). The set may come from any number of ranks and any stage: each rank reads from
 * every file the elements it now owns (the whole values of parameters it keeps whole). Restores
 * the values, the state, the step count, the rounding generator and each group's learning rate;
 * no communication (every rank reads the same files). Everything is read and checked before
 * anything changes: on failure the parameters and the optimizer are as they were. Until then each
 * rank holds a second copy of what it loads (the parameters it keeps whole, its shards of the
 * others and of the state). A failure is this rank's alone: when one rank fails (out of memory, a
 * file missing on its machine) while others succeed, the ranks no longer agree, and the program
 * must stop (or load again everywhere) rather than train on.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (NULLs; another optimizer kind, group or parameter count;
 * master copies for parameters this optimizer keeps none of), FLAME_ERROR_SHAPE_MISMATCH,
 * FLAME_ERROR_DTYPE_MISMATCH (a parameter saved with another shape or dtype), FLAME_ERROR_IO (a file
 * of the set is missing or unreadable), FLAME_ERROR_INVALID_FORMAT (not a safetensors file, no or bad
 * "flame.zero_shard" metadata, tensors that do not match it, files that are not one set: another
 * world size, rank or save, ranges that overlap or leave gaps, state held by some files only, an
 * incomplete Adam state: exp_avg without exp_avg_sq or the reverse, max_exp_avg_sq without them),
 * FLAME_ERROR_UNSUPPORTED (during a CUDA graph capture). */
FLAME_API flame_status_t flame_zero_load(flame_zero_t zero, const char* path);

/* ============================== Models ============================== */
/* A flame_model_t is a diffusion or text-encoder architecture built from FLAME's operations, with
 * the parameters and the forward pass of the reference implementation it is named after (diffusers'
 * or transformers' class: "CLIPTextModel", "CLIPTextModelWithProjection", "FluxTransformer2DModel",
 * "SD3Transformer2DModel"; the list grows with
 * releases: flame_model_known_architectures). A program drives every architecture the same way:
 *  - parameters are ordinary tensors under the reference's state_dict names, in its order
 *    (flame_model_params): optimizers, hooks, freezing (flame_tensor_set_requires_grad), LoRA and
 *    safetensors work on them as on any tensor; they require grad when the model is made (the
 *    quantised weights and scales of the "quantize" option excepted: frozen);
 *  - the forward pass takes and returns named tensors (flame_params_t lists) under the names the
 *    reference's forward() uses; its outputs are recorded like any operation's, so flame_backward
 *    works through them.
 * Configurations are the config.json objects the reference classes write (missing keys take the
 * class's defaults; flame_model_config returns the complete one). Options are a JSON object:
 *   "dtype": "f32" | "f16" | "bf16" | "f64" (the parameters' dtype; default "f32"),
 *   "compute_dtype": the dtype the forward computes in (default: dtype; parameters of another dtype
 *                    are cast at each use, float inputs are cast on entry),
 *   "quantize": {"dtype": "f8_e4m3", "scale": "tensor" | "row"} (both keys optional, these defaults;
 *               "float8_e4m3fn" is accepted for the dtype; null or false: off): a frozen fp8 base for
 *               LoRA training in about half the memory. The weight of every linear layer (each 2-D
 *               "<module>.weight" that is not an embedding table) is kept in FLAME_DTYPE_F8_E4M3 with
 *               an f32 scale, W = weight * scale_weight (ComfyUI's "scaled fp8" convention): per
 *               tensor a 0-d scale amax|W| / 448, per row an [out, 1] column of each row's amax / 448;
 *               values are rounded to the nearest e4m3. Norms, biases, embeddings and convolutions
 *               stay in "dtype". At each use the weight is dequantised to compute_dtype (f32 product,
 *               rounded once): gradients reach the layer's input and its LoRA adapters, never the
 *               quantised weight or its scale, which are made with requires_grad false (setting it
 *               later is ignored: no gradient reaches them). An unknown key or value:
 *               FLAME_ERROR_INVALID_ARGUMENT naming it ("quantize.scale", ...),
 *   "quantize": {"dtype": "nf4", "block_size": 64, "double_quant": true} (both keys optional, these
 *               defaults): a frozen NF4 base (QLoRA's 4-bit NormalFloat, as bitsandbytes' Linear4bit
 *               with quant_type "nf4" and compress_statistics=True) in about a quarter of bf16's
 *               memory. The weight of every linear layer is cut into blocks of block_size consecutive
 *               elements of a row (a power of two in [16, 4096] that must divide the layer's row
 *               length); each block keeps absmax = max |w| (f32) and each element the 4-bit code of
 *               the nearest of the 16 NF4 levels to w / absmax (computed as w * (1 / absmax) in f32;
 *               a value on a midpoint takes the lower code, as bitsandbytes), two codes per byte, the
 *               first element in the high nibble. With double_quant the absmax values are stored in
 *               8 bits: their mean is subtracted, and each run of 256 gets an f32 scale (the largest
 *               |absmax - mean|) and codes into bitsandbytes' signed 8-bit dynamic map. Bytes per
 *               weight: 0.5 + 1 / block_size (+ 4 / (256 block_size)) with double_quant, 0.5 +
 *               4 / block_size without. At each use the weight is dequantised by one kernel to
 *               compute_dtype (level * absmax, rounded once in f32, then to compute_dtype) and the
 *               layer saves only the packed weight for backward. Everything else is as for fp8
 *               above (frozen, LoRA and DoRA adapters beside it, gradients never reach it). A block
 *               size that does not divide a layer's rows: FLAME_ERROR_INVALID_ARGUMENT naming
 *               "quantize.block_size" and the layer; "scale" with nf4, or "block_size" /
 *               "double_quant" with fp8: FLAME_ERROR_INVALID_ARGUMENT naming the key. An NF4 model
 *               cannot be saved (flame_model_save) and a LoRA cannot be merged into it
 *               (flame_model_merge_lora): both fail with FLAME_ERROR_INVALID_ARGUMENT and change
 *               nothing; flame_model_load quantises each linear weight on the GPU from a temporary
 *               f32 copy of that one weight, whatever the file stores,
 *   "offload": {"budget_bytes": N} or {"budget_fraction": f} (exactly one; optional "slots": 2..64,
 *              default 2): offload of frozen block weights for training in a fixed device budget.
 *              N bytes, or the share f in [0, 1] of the parameters' bytes, of device memory for the
 *              parameters (the ring below included). The model's first forward learns which
 *              parameters each repeated block (transformer layer, resnet / attention unit) reads;
 *              at its end (or a later forward's, while no block is wholly frozen yet), blocks whose
 *              parameters all have requires_grad 0 move to pinned host memory, in execution order,
 *              until the rest fits the budget (so the model is made or loaded, and runs that first
 *              forward, with all its weights on the device; the budget holds from then on). The
 *              parameter tensors stay the same handles (they then view the host memory through its
 *              device mapping: reading and saving them work). Each forward streams an offloaded block's weights into a ring of "slots"
 *              device buffers (sized for the largest offloaded block, allocated once) on a copy
 *              stream, the next block's copy overlapping the current block's kernels, with no host
 *              synchronisation. An offloaded block is always gradient-checkpointed while a graph is
 *              recorded (its recompute in backward fetches the weights again), whatever
 *              flame_model_set_checkpointing says. A budget that cannot be met even with every
 *              frozen block offloaded fails that forward with FLAME_ERROR_INVALID_ARGUMENT (the
 *              message gives the least budget). Using an offloaded parameter after its
 *              requires_grad was turned on fails with FLAME_ERROR_INVALID_ARGUMENT (offloaded
 *              weights stay frozen); writing an offloaded parameter in place is seen at its next
 *              fetch. Not available during a CUDA graph capture (FLAME_ERROR_UNSUPPORTED). Not
 *              together with "quantize" yet (FLAME_ERROR_INVALID_ARGUMENT).
 * A model is used by one thread at a time; it keeps its context alive, as tensors do. */

/* flame_model_t (a model) is declared above, before the ZeRO options that name it. */

/* OUT *names: a JSON array of the architecture names flame_model_create knows, BORROWED (static
 * storage of the library). Errors: FLAME_ERROR_INVALID_ARGUMENT (names NULL). */
FLAME_API flame_status_t flame_model_known_architectures(const char** names);

/* Makes a model of architecture (a name flame_model_known_architectures lists) with configuration
 * config_json (a JSON object as the reference's config.json, or NULL / "{}" for the defaults) and
 * options_json (see above; NULL for the defaults). Parameters are initialised from the context's
 * generator: weights of linear, convolution and embedding layers N(0, 0.02), norm scales 1, biases 0
 * (load trained weights with flame_params_load_safetensors on flame_model_params' list). With
 * "quantize" the model is initialised in "dtype", then its linear weights are quantised on the GPU one
 * by one (the full-precision model exists briefly; flame_model_load never makes it).
 * OUT *model: a new model; release it with flame_model_release. NULL on any error.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (ctx, architecture or model NULL; an unknown architecture, the
 * message listing the known ones; invalid JSON, a config value of the wrong type or out of range, an
 * unknown option key or dtype name: the message names the key), FLAME_ERROR_INVALID_HANDLE,
 * FLAME_ERROR_OUT_OF_MEMORY, FLAME_ERROR_CUDA, FLAME_ERROR_CONTEXT_FAILED. */
FLAME_API flame_status_t flame_model_create(flame_ctx_t ctx, const char* architecture, const char* config_json,
                                            const char* options_json, flame_model_t* model);

/* Loads a model from the files users have (reading only headers until the weights are copied):
 *  - a diffusers model folder: config.json plus diffusion_pytorch_model.safetensors or model.safetensors,
 *    or shards named by a *.safetensors.index.json;
 *  - a diffusers pipeline folder (model_index.json): the component options_json names ("component":
 *    "unet", "transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3");
 *  - a single .safetensors file in the original layout (Black Forest Labs' flux1-dev / schnell,
 *    Stability's SDXL / SD 1.5 / SD 3.5 single files, ComfyUI's "model.diffusion_model." prefix) or in
 *    the diffusers layout; single files holding several components take "component" as above.
 * The architecture and configuration come from config.json, or from the tensors' names and shapes
 * for single files; options_json's "architecture" and "config" override them (a single file loaded
 * with "architecture" must hold that architecture's own names, as flame_model_save writes them). Tensors of any dtype
 * FLAME has are converted on the GPU to the options' "dtype" (default: "bf16" for files stored in
 * f16/bf16/F8, f32 scales of scaled F8 weights aside, else "f32"); files are memory-mapped and copied
 * through a bounded staging buffer. ComfyUI's scaled fp8 files (F8_E4M3 "*.weight" with f32
 * "*.scale_weight": W = weight * scale_weight; a scalar, or here also one per row) load dequantised
 * into "dtype"; their "scaled_fp8" marker and "*.scale_input" tensors are skipped. With "quantize",
 * each linear weight goes straight to its final form: an F8_E4M3 tensor as stored with its scale
 * (1 without one; bit for bit, never re-quantised; a per-row scale into a per-tensor model only when
 * the rows' scales are equal, else FLAME_ERROR_INVALID_ARGUMENT asking for "scale": "row"), any
 * other through a temporary f32 copy of that one tensor quantised on the GPU (never a full-precision
 * copy of the model on the device).
 * OUT *model: NULL on any error; nothing half-loaded is returned.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (ctx, path or model NULL; options as for flame_model_create; a
 * component missing or not named for a file that needs one), FLAME_ERROR_INVALID_FORMAT (malformed
 * JSON or safetensors, a missing or extra tensor, a shape the configuration contradicts, an index
 * naming a missing file or a key its shard lacks, an unknown architecture: the message names the
 * file and the key), FLAME_ERROR_UNSUPPORTED (a tensor dtype FLAME lacks), FLAME_ERROR_IO,
 * FLAME_ERROR_INVALID_HANDLE, FLAME_ERROR_OUT_OF_MEMORY, FLAME_ERROR_CUDA, FLAME_ERROR_CONTEXT_FAILED. */
FLAME_API flame_status_t flame_model_load(flame_ctx_t ctx, const char* path, const char* options_json, flame_model_t* model);

/* Writes the model's parameters to one safetensors file at path (atomic replacement, as
 * flame_params_save_safetensors) in layout:
 *  - "diffusers" (or NULL): the reference's names, as flame_model_params lists them, which diffusers'
 *    from_pretrained / from_single_file, transformers and flame_model_load read back;
 *  - "original": the class's usual single-file layout, the exact inverse of what flame_model_load
 *    reads (fused tensors concatenated on the GPU, halves swapped, projections transposed, 1x1
 *    convolutions reshaped as the original files store them), or one named explicitly:
 *      FluxTransformer2DModel: "bfl" (= original: Black Forest Labs' names, no prefix, as
 *        flux1-dev.safetensors), "comfyui" (the same under "model.diffusion_model.");
 *      UNet2DConditionModel: "sgm" (= original), "ldm": SGM / LDM names under "model.diffusion_model.";
 *      SD3Transformer2DModel: "sd3" (= original): MMDiT names under "model.diffusion_model.";
 *      AutoencoderKL: "sgm" (= original), "ldm": LDM names under "first_stage_model."; "bfl": the same
 *        names without prefix (ae.safetensors);
 *      CLIPTextModel: "sgm" (= original): under "conditioner.embedders.0.transformer." (SDXL's CLIP-L);
 *        "sd3": under "text_encoders.clip_l.transformer.";
 *      CLIPTextModelWithProjection: "sgm" (= original): OpenCLIP names under
 *        "conditioner.embedders.1.model." (SDXL's bigG); "sd3": under "text_encoders.clip_l.transformer."
 *        (width 768) or "text_encoders.clip_g.transformer." (width 1280);
 *      T5EncoderModel: "sd3" (= original): under "text_encoders.t5xxl.transformer."; "comfyui": no prefix.
 * The file holds this one model (no other component); its metadata has "format": "pt" (and
 * "flame_layout": the explicit layout name for original layouts). Tensors keep the parameters' dtype:
 * a quantised model writes its F8 weights and their f32 "<module>.scale_weight" scales (ComfyUI's
 * convention; in original layouts a stored tensor fused from several weights, such as Flux's qkv,
 * or with per-row scales gets an exact [rows, 1] scale column, which flame_model_load reads back but
 * ComfyUI, reading scalars only, does not), and flame_model_load with the same "quantize" option
 * reads the file back bit for bit.
 * Builds at most one stored tensor at a time on the device beside the parameters. Waits for the device.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (model or path NULL; a layout the class does not have, or one
 * that cannot hold this model, e.g. a shape the loader would not read back: the message names the
 * layout and the class; a model whose parameters are sharded over ranks by flame_zero_create stage 3:
 * save flame_zero_gather_params' list instead), FLAME_ERROR_IO, FLAME_ERROR_INVALID_HANDLE, FLAME_ERROR_OUT_OF_MEMORY,
 * FLAME_ERROR_CUDA. Nothing is written on error (the previous file at path stays). A model with an
 * NF4 base ("quantize": {"dtype": "nf4"}) is not written: FLAME_ERROR_INVALID_ARGUMENT (load the
 * original checkpoint with the option instead; its LoRA adapters save with flame_model_save_lora). */
FLAME_API flame_status_t flame_model_save(flame_model_t model, const char* path, const char* layout);

/* Releases the model and its references to its parameters (tensors taken from it live on while
 * other references hold them). NULL is a no-op; a released model is detected (nothing happens) while
 * its context lives. */
FLAME_API void flame_model_release(flame_model_t model);

/* OUT *name: the model's architecture name, BORROWED (valid until the model is released). */
FLAME_API flame_status_t flame_model_architecture(flame_model_t model, const char** name);

/* OUT *config_json: the model's complete configuration as a JSON object (every default filled in),
 * BORROWED (valid until the model is released). */
FLAME_API flame_status_t flame_model_config(flame_model_t model, const char** config_json);

/* OUT *params: a new list (release it with flame_params_release) of the model's parameters under
 * the reference's names, in its state_dict order. The tensors ARE the model's parameters: writing
 * into them (flame_params_load_safetensors, an optimizer step) changes the model. With "quantize",
 * each quantised "<module>.weight" is its FLAME_DTYPE_F8_E4M3 tensor and is followed by its f32 scale
 * "<module>.scale_weight" (0-d, or [out, 1] per row), both not requiring grad; the list's bytes are
 * the model's parameter memory (one byte per linear weight element). With "quantize" {"dtype": "nf4"},
 * each linear "<module>.weight" is its packed codes (FLAME_DTYPE_U8 [out, in / 2]) followed by
 * "<module>.weight.absmax" (f32 [blocks], or with double_quant U8 codes [blocks] followed by the f32
 * "<module>.weight.nested_absmax" [ceil(blocks / 256)] and the 0-d f32 "<module>.weight.nested_offset"),
 * bitsandbytes' state-dict names, none requiring grad.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (model or params NULL), FLAME_ERROR_INVALID_HANDLE,
 * FLAME_ERROR_OUT_OF_MEMORY (host). */
FLAME_API flame_status_t flame_model_params(flame_model_t model, flame_params_t* params);

/* Runs the forward pass on inputs (a list of named tensors of the model's context, BORROWED; the
 * names each architecture requires and accepts are in its section of flame.h and in the error
 * message) and returns the outputs as a new list (release it with flame_params_release; its tensors
 * are new results; retain one to keep it longer than the list). With grad mode on, every operation
 * is recorded: call flame_backward on a loss computed from the outputs for the parameters' and
 * inputs' gradients. Blocks under the checkpointing policy (flame_model_set_checkpointing) keep only
 * their inputs and are recomputed during backward.
 *   CLIPTextModel, CLIPTextModelWithProjection: input_ids [B, T] (i64 or i32, T <= max_position_
 *   embeddings); optional attention_mask [B, T] (nonzero = attend), position_ids [T] or [B, T].
 *   Outputs: last_hidden_state [B, T, D], pooler_output [B, D] (at the end-of-text token),
 *   text_embeds [B, projection_dim] (WithProjection), hidden_states.<i> [B, T, D] for i in
 *   0..num_hidden_layers (the embeddings, then each layer's output; SDXL uses the second-to-last).
 *   UNet2DConditionModel (SDXL base / refiner, SD 1.5): sample [B, in_channels, H, W], timestep
 *   [B], [1] or a scalar (any number dtype), encoder_hidden_states [B, T, cross_attention_dim]; with
 *   addition_embed_type "text_time" (SDXL) also text_embeds [B, P] and time_ids [B, K] (diffusers'
 *   added_cond_kwargs; P + K * addition_time_embed_dim = projection_class_embeddings_input_dim);
 *   optional encoder_attention_mask [B, T] (nonzero = attend; diffusers' -10000 score bias).
 *   Output: sample [B, out_channels, H, W].
 *   AutoencoderKL (SD / SDXL 4-channel, Flux / SD3 16-channel): either or both of sample
 *   [B, in_channels, H, W] (encode) and latent_sample [B, latent_channels, h, w] (decode).
 *   Outputs: latent_mean and latent_logvar [B, latent_channels, H / f, W / f] (f = 2^(blocks - 1),
 *   each halving rounding down; the posterior's parameters, logvar clamped to [-30, 20]; draw
 *   mean + exp(logvar / 2) * noise yourself) for sample, and sample [B, out_channels, h * f, w * f]
 *   for latent_sample. The config's scaling_factor / shift_factor are not applied: as with
 *   diffusers, the caller scales latents ((latent - shift_factor) * scaling_factor) and unscales
 *   them before decoding.
 *   FluxTransformer2DModel (Flux.1 dev / schnell; parameters under diffusers' unfused names):
 *   hidden_states [B, L, in_channels] (packed 2x2 latent patches), encoder_hidden_states [B, T,
 *   joint_attention_dim], pooled_projections [B, pooled_projection_dim], timestep [B] or a scalar
 *   (in [0, 1]: multiplied by 1000 inside, as diffusers does), img_ids [L, 3] and txt_ids [T, 3]
 *   (RoPE position ids, float or integer; of a [batch, n, 3] tensor the first is used), and with
 *   guidance_embeds guidance [B] or a scalar (also times 1000). Output: sample [B, L, patch_size^2
 *   * out_channels].
 *   SD3Transformer2DModel (SD3, and SD3.5 with qk_norm "rms_norm" and dual_attention_layers):
 *   hidden_states [B, in_channels, H, W] (H / patch_size and W / patch_size at most
 *   pos_embed_max_size), encoder_hidden_states [B, T, joint_attention_dim], pooled_projections
 *   [B, pooled_projection_dim], timestep [B] or a scalar (0..1000, not rescaled). Output: sample
 *   [B, out_channels, H, W]. Its parameter "pos_embed.pos_embed" (the sin-cos position table, a
 *   buffer in diffusers' state_dict) does not require grad.
 * OUT *outputs: NULL on any error.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (model, inputs or outputs NULL; a required input missing, an
 * unknown input name, an input of another context, a shape or dtype the architecture cannot take:
 * the message names the input), FLAME_ERROR_INVALID_HANDLE, FLAME_ERROR_SHAPE_MISMATCH,
 * FLAME_ERROR_OUT_OF_MEMORY, FLAME_ERROR_CUDA, FLAME_ERROR_KERNEL_COMPILE, FLAME_ERROR_CONTEXT_FAILED. */
FLAME_API flame_status_t flame_model_forward(flame_model_t model, flame_params_t inputs, flame_params_t* outputs);

/* Training mode (training nonzero) or evaluation mode (0, the initial mode), as PyTorch's
 * module.train() / eval(): dropout layers of the architecture act only in training mode.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (model NULL), FLAME_ERROR_INVALID_HANDLE. */
FLAME_API flame_status_t flame_model_set_training(flame_model_t model, int32_t training);

/* Gradient checkpointing of the model's repeated blocks (transformer layers, resnet / attention
 * blocks): every_n_blocks 0 turns it off (the initial policy), 1 checkpoints every block, n every
 * n-th block (blocks 0, n, 2n, ...). A checkpointed block keeps only its inputs during the forward
 * pass and runs again during backward (as flame_checkpoint), trading time for memory.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (model NULL, every_n_blocks negative), FLAME_ERROR_INVALID_HANDLE. */
FLAME_API flame_status_t flame_model_set_checkpointing(flame_model_t model, int64_t every_n_blocks);

/* ---- LoRA adapters on a model ----
 * A LoRA adapter (Hu et al. 2021, as peft's LoRA) adds to chosen linear layers of a model, beside
 * their frozen weight W (never merged into it while training; flame_model_merge_lora folds it in
 * on request),
 *   y = x W^T + b + multiplier * (alpha / rank) * ((dropout(x) A^T) B^T)
 * with A [rank, in] (the "down" / lora_A matrix) and B [out, rank] ("up" / lora_B) trainable leaf
 * tensors, cast to the model's compute dtype at use. With DoRA (Liu et al. 2024, peft's use_dora)
 * each layer also has a trainable magnitude vector m [out], initialised to the row norms of W, and
 *   y = x W^T + b + multiplier * ((m / n - 1) * (x' W^T) + (m / n) * (alpha / rank) * ((x' A^T) B^T))
 * with n = ||W + (alpha / rank) B A|| per output row, treated as a constant by backward (as peft),
 * and x' = dropout(x) in training mode with dropout, x otherwise: for multiplier 1,
 * y = (m / n) * x (W + (alpha / rank) B A)^T + b. Layers are chosen by target names matched
 * against the diffusers / transformers module names (a module matches a target equal to it or
 * ending with "." + target, as peft's target_modules: "to_q" matches "down_blocks.1.attentions.0.
 * transformer_blocks.0.attn1.to_q"; '*' matches any run of characters). A model may hold
 * several adapters by name; each forward applies all of them in the order added.
 * LoKr (LyCORIS' Kronecker adapter, peft's LoKrConfig; "type": "lokr") replaces B A by a Kronecker
 * product: y = x W^T + b + multiplier * scale * (dropout(x) kron(W1, W2)^T), W1 [a, b] and
 * W2 [out / a, in / b] with (a, out / a) = factorization(out, factor) and (b, in / b) =
 * factorization(in, factor) as LyCORIS defines it (the divisor pair closest to a square, the smaller
 * member at most factor when factor > 0); W2 is stored as lokr_w2_a [out / a, rank] @ lokr_w2_b
 * [rank, in / b] when rank < max(out / a, in / b) / 2, and W1 as lokr_w1_a @ lokr_w1_b when
 * "decompose_both" and rank < max(a, b) / 2; scale = alpha / rank when a factor is so stored, 1 when
 * both are whole (as LyCORIS and ComfyUI). The product is applied without forming the [out, in]
 * matrix. */

/* Adds a LoRA adapter to model. options_json (NULL or an object; every key optional):
 *   "name": string ("default"); "targets": [strings] (default: the architecture's usual targets of
 *   "preset": "diffusers" (the default: diffusers' training scripts: UNet2DConditionModel to_q, to_k,
 *   to_v, to_out.0; FluxTransformer2DModel attn.to_{q,k,v}, attn.to_out.0, attn.add_{q,k,v}_proj,
 *   attn.to_add_out, ff.net.{0.proj,2}, ff_context.net.{0.proj,2}; SD3Transformer2DModel the same
 *   attention projections; CLIP q_proj, k_proj, v_proj, out_proj; T5 q, k, v, o) or "kohya"
 *   (sd-scripts': every linear layer of the transformer blocks; CLIP and T5 attention and MLP);
 *   AutoencoderKL has no default); "rank": integer in [1, 65536] (16); "alpha": number (= rank);
 *   "rank_pattern" / "alpha_pattern": {target: value} overriding rank / alpha for the modules a key
 *   matches (the longest matching key wins); "init": "kaiming" (A uniform in +-1/sqrt(in), as
 *   torch.nn.Linear and peft) or "gaussian" (A normal with std 1/rank), B zero either way, so that a
 *   new adapter changes no output; drawn from the context's generator; "dropout": [0, 1) (0), on the
 *   adapter's input in training mode; "dtype": "f32" (default), "bf16", "f16" or "f64" of A and B;
 *   "freeze_base": true (default) makes every parameter of the model stop requiring grad;
 *   "multiplier": number (1); "dora": true adds DoRA's magnitude vectors (false);
 *   "type": "lora" (default) or "lokr" (above; with "init" "kaiming" only, as LyCORIS: W1 and
 *   lokr_w1_a / _b / lokr_w2_a Kaiming-uniform, lokr_w2 or lokr_w2_b zero; not with "dora");
 *   "factor": -1 (default) or a positive integer, LoKr's factorization factor; "decompose_both":
 *   false (default), LoKr's W1 low rank too (both LoKr only).
 * OUT *adapter_params: a new list (release with flame_params_release) of the adapter's tensors
 * themselves, "<module>.lora_A.weight" and "<module>.lora_B.weight" (and with DoRA
 * "<module>.lora_magnitude_vector", [out]; for LoKr "<module>.lokr_w1" or "<module>.lokr_w1_a" and
 * "_w1_b", then "<module>.lokr_w2" or "_w2_a" and "_w2_b", as peft's LoKr names them) per module in
 * the model's order (hand it to flame_optimizer_create; writing into them changes the adapter). NULL on failure,
 * and the model is unchanged.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (model or adapter_params NULL, options not valid JSON, an
 * unknown key or a bad value naming it, a name in use, a target matching no linear layer, a model
 * sharded over ranks by flame_zero_create stage 3: add adapters before sharding),
 * FLAME_ERROR_INVALID_HANDLE, FLAME_ERROR_OUT_OF_MEMORY, FLAME_ERROR_CUDA, FLAME_ERROR_UNSUPPORTED
 * (during a graph capture). */
FLAME_API flame_status_t flame_model_add_lora(flame_model_t model, const char* options_json, flame_params_t* adapter_params);

/* OUT *adapter_params: a new list of the tensors of the adapter called name (NULL: "default"), as
 * flame_model_add_lora returns it. Errors: FLAME_ERROR_INVALID_ARGUMENT (model or adapter_params
 * NULL, no adapter of that name), FLAME_ERROR_INVALID_HANDLE, FLAME_ERROR_OUT_OF_MEMORY (host). */
FLAME_API flame_status_t flame_model_lora_params(flame_model_t model, const char* name, flame_params_t* adapter_params);

/* Writes the adapter called name (NULL: "default") to one safetensors file at path (atomic
 * replacement, as flame_safetensors_save), in the format kohya's sd-scripts, ComfyUI, A1111 and
 * diffusers read. options_json (NULL or an object, every key optional):
 *   "format": "kohya" (default: "lora_unet_<original module>" / "lora_te1_" / "lora_te2_" /
 *   "lora_te3_" names with ".lora_down.weight", ".lora_up.weight" and a 0-d ".alpha"; Flux under
 *   Black Forest Labs' names, SDXL under SGM names, SD3 under MMDiT names; where the original layout
 *   fuses modules (Flux's img_attn.qkv, linear1) the file holds one pair for the fused module: the
 *   downs stacked and a block-diagonal up, exact; ss_* and modelspec.* metadata) or "peft"
 *   ("diffusers": "<component>.<module>.lora_A.weight" / ".lora_B.weight" with peft's LoraConfig in
 *   the metadata "lora_adapter_metadata", as diffusers' save_lora_weights);
 *   "component": the pipeline slot that prefixes the names ("unet", "transformer", "text_encoder",
 *   "text_encoder_2", "text_encoder_3"; default by class: UNet2DConditionModel "unet", Flux and SD3
 *   "transformer", CLIPTextModel "text_encoder", CLIPTextModelWithProjection and T5EncoderModel
 *   "text_encoder_2"); "dtype": "f32" (default), "bf16" or "f16" of the stored matrices;
 *   "metadata": {string: string} entries added to the file's metadata.
 * The stored alphas include the adapter's multiplier. DoRA magnitudes are stored as
 * "<component>.<module>.lora_magnitude_vector" [out] with "use_dora": true in peft files, and as
 * LyCORIS' "<name>.dora_scale" [out, 1] in kohya files (ComfyUI reads it). LoKr modules are stored
 * in kohya files only, under LyCORIS' keys "<name>.lokr_w1" (or "_w1_a", "_w1_b"), "<name>.lokr_w2"
 * (or "_w2_a", "_w2_b") and "<name>.alpha" (ComfyUI reads them; two whole factors store alpha = rank
 * and carry the multiplier in lokr_w2). A LoKr on one member of a fused original (Flux's qkv and
 * linear1, SD3's qkv: a Kronecker product cannot be split over the fused rows) or on a layer whose
 * original has its row halves swapped (Flux's and SD3's norm_out.linear, SD3's last
 * norm1_context.linear) is stored under the module's own diffusers name with OneTrainer's prefix,
 * "lora_transformer_<module>" with '_' for '.' (ComfyUI applies it to the member's rows of the fused
 * weight, halves swapped back); a LoKr on a layer stored transposed is refused. Waits for the device.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (model or path NULL, no adapter of that name, a bad option
 * naming it, a module the format cannot express, a DoRA adapter whose multiplier is not 1, a LoKr
 * adapter in the peft format or on a transposed original), FLAME_ERROR_IO, FLAME_ERROR_INVALID_HANDLE,
 * FLAME_ERROR_OUT_OF_MEMORY, FLAME_ERROR_CUDA, FLAME_ERROR_UNSUPPORTED (during a graph capture). */
FLAME_API flame_status_t flame_model_save_lora(flame_model_t model, const char* name, const char* path,
                                               const char* options_json);

/* Loads a LoRA file (kohya, peft / diffusers, OneTrainer's "lora_transformer_" and SimpleTuner's
 * LyCORIS "lycoris_" keys, or ComfyUI's diffusers-named keys; the key forms of lora_format.h,
 * detected from the keys) as a new adapter of the model. Keys of other pipeline
 * components are skipped, so one file holding a UNet's and its text encoders' LoRAs loads into each
 * model in turn. A pair stored for a fused original module gives every member module the whole down
 * and its rows of the up (exact). A missing kohya alpha means alpha = rank (scale 1). DoRA
 * magnitudes (".lora_magnitude_vector" or ".dora_scale", [out] or [out, 1]) make DoRA modules.
 * LyCORIS LoKr keys (".lokr_w1" or ".lokr_w1_a" / "_b", ".lokr_w2" or ".lokr_w2_a" / "_b", ".alpha")
 * make LoKr modules (scale alpha / rank with a low-rank factor, else 1; no alpha: 1).
 * options_json (NULL or an object): "name" ("default"), "component" (as flame_model_save_lora),
 * "multiplier" (1), "dtype" ("f32") of the adapter's tensors, "trainable" (false: the tensors do not
 * require grad; true to go on training them).
 * OUT *adapter_params: a new list of the adapter's tensors (as flame_model_add_lora). NULL on failure,
 * and the model is unchanged.
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (model, path or adapter_params NULL, a bad option, a name in
 * use, a model sharded over ranks by flame_zero_create stage 3), FLAME_ERROR_IO, FLAME_ERROR_INVALID_FORMAT (not safetensors, a key no rule knows or whose
 * module the model lacks, shapes contradicting the model, LyCORIS keys (LoHa, Tucker LoKr's
 * lokr_t2, an input-axis dora_scale [1, in], DoRA on a LoKr), a LoKr whose factors are incomplete or
 * do not make the weight's shape or that names a fused original, nothing for the
 * component: the message names the file and key), FLAME_ERROR_INVALID_HANDLE,
 * FLAME_ERROR_OUT_OF_MEMORY, FLAME_ERROR_CUDA, FLAME_ERROR_UNSUPPORTED (during a graph capture). */
FLAME_API flame_status_t flame_model_load_lora(flame_model_t model, const char* path, const char* options_json,
                                               flame_params_t* adapter_params);

/* Removes the adapter called name (NULL: "default") from the model: later forwards run without it
 * (its tensors live on while references to them are held). Parameters frozen when it was added stay
 * frozen. Errors: FLAME_ERROR_INVALID_ARGUMENT (model NULL, no adapter of that name),
 * FLAME_ERROR_INVALID_HANDLE. */
FLAME_API flame_status_t flame_model_remove_lora(flame_model_t model, const char* name);

/* Folds the adapter called name (NULL: "default") into the model's weights and removes it: each
 * adapted weight becomes W + multiplier * (alpha / rank) * B A, or with DoRA
 * W + multiplier * ((m / n) * (W + (alpha / rank) * B A) - W) (n as above), or for LoKr
 * W + multiplier * scale * kron(W1, W2), computed in f32 on the
 * device and stored in the weight's dtype, so later forwards give the adapter's output up to that
 * rounding without its cost. The weights keep their identity (handles to them see the new values);
 * the adapter's tensors live on while references to them are held. Other adapters stay; a DoRA
 * adapter on the same layers then normalises the merged weight (as peft).
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (model NULL, no adapter of that name, a weight of a dtype a
 * merge cannot write (an fp8 or NF4 base: the message says which), a model sharded over ranks by flame_zero_create stage 3: nothing changed), FLAME_ERROR_INVALID_HANDLE, FLAME_ERROR_UNSUPPORTED (during a
 * graph capture), FLAME_ERROR_OUT_OF_MEMORY, FLAME_ERROR_CUDA (the layers merged before the failure
 * stay merged and leave the adapter, the others keep it: the model computes the same function). */
FLAME_API flame_status_t flame_model_merge_lora(flame_model_t model, const char* name);

/* ---- Preflight memory estimate ----
 * The device memory a training step of a denoiser is expected to need at its peak, computed on the
 * host from the architecture's configuration before any weight is read (no context, no GPU): what
 * flame_ctx_memory_stats' peak_bytes_in_use reaches over a steady step (forward, backward, optimizer
 * step; after the first step, which makes the optimizer state). Fields, in bytes: */
typedef struct flame_memory_estimate_t {
  size_t struct_size;         /* set by the caller: sizeof(flame_memory_estimate_t) */
  uint64_t weights_bytes;     /* the model's parameters on the device: exact (its own parameter table, in
                                 the options' dtype; "quantize": 1 byte per linear weight element plus its
                                 f32 scale; "offload": what stays resident after the offload plan, the ring
                                 of slots included; "quantize" nf4: half a byte per linear weight element
                                 plus its block statistics, as the option above describes) */
  uint64_t adapter_bytes;     /* the LoRA tensors (A, B, DoRA magnitudes): exact */
  uint64_t gradient_bytes;    /* gradients of what is trained: exact */
  uint64_t optimizer_bytes;   /* optimizer state (AdamW / Adam: 2 moments, Lion: 1, SGD: none; f32, f64 for
                                 f64 tensors): exact; with an "...8bit" optimizer 1 byte per element and
                                 moment plus an f32 per 256 elements (tensors under 4096 elements keep f32
                                 moments but are counted so: at most 3 bytes per such element low) */
  uint64_t activation_bytes;  /* what the forward keeps for backward plus backward's transients: estimated */
  uint64_t workspace_bytes;   /* cuBLASLt's workspace (32 MiB) */
  uint64_t total_bytes;       /* the sum of the above: the expected peak */
  uint64_t parameter_count;   /* elements of the model's parameters */
  uint64_t trainable_count;   /* elements trained (the adapter's, or every unquantised parameter) */
} flame_memory_estimate_t;

/* Estimates the peak device memory of a training step. request_json is an object:
 *   "architecture" (a flame_model_create name) with "config" (config.json's object; missing keys take
 *   the class's defaults), or "path" (a file or folder flame_model_load takes: only headers and
 *   config.json are read);
 *   "options": the model options of flame_model_create / flame_model_load ("dtype", "compute_dtype",
 *   "quantize", "offload"; with "path" also "component", "architecture", "config"; dtype default: f32
 *   with "architecture", the file's as flame_model_load with "path");
 *   "lora": flame_model_add_lora's options object (default {}: the architecture's default targets,
 *   rank 16, f32); null or false: a full fine-tune (every unquantised parameter trained);
 *   "batch" (1), "height" and "width" in pixels (1024; multiples of 8: latents are 1/8 of the image),
 *   "text_tokens" (77 for the UNet, 512 for Flux, 333 for SD3), "checkpointing" (every_n_blocks of
 *   flame_model_set_checkpointing, 0), "optimizer": "adamw" (default), "adam", "lion" or "sgd", or
 *   "adamw8bit", "adam8bit", "lion8bit" (8-bit moments, flame_optimizer_set_state_bits).
 * Architectures: UNet2DConditionModel, FluxTransformer2DModel, SD3Transformer2DModel.
 * How activations are estimated: a structural count, per block, of the tensors its operations keep
 * for backward (per token or pixel position, from the config's widths and the request's shapes),
 * times one factor per family for what FLAME's fused operations keep of it (the UNet 0.845; Flux and
 * SD3 0.68: fitted to the measured peaks below); a checkpointed block keeps its inputs and the
 * largest one is recomputed in backward; Flux adds backward's working set inside its largest block
 * (0.6 of its count); a "quantize" base keeps no dequantised weights (its linear layers save the fp8
 * weight and scale), only the largest one dequantised for one product at a time; every block keeps
 * cast copies of its weights when compute_dtype differs from dtype; offloaded blocks are checkpointed. Against FLAME's measured peaks on an H200 (bf16, rank-16 LoRA on
 * diffusers' script targets, f32 A/B, AdamW, 1024x1024, T = 77 / 512 / 333; bench/RESULTS.md T6),
 * estimate vs measured in GiB: SDXL B=1 10.24 vs 10.20 (+0.4%, the UNet factor's fit), SDXL B=4
 * 25.47 vs 25.47 (0.0%), SDXL B=4 checkpointed 7.61 vs 7.51 (+1.3%), Flux-dev B=1 checkpointed 25.20
 * vs 25.14 (+0.2%), Flux-dev B=1 44.74 vs 44.84 (-0.2%), SD3.5-medium B=1 10.48 vs 10.30 (+1.7%; these
 * two fit the MMDiT factor together; Flux's backward transient is fitted to a mid-sized Flux), Flux-dev
 * fp8 base checkpointed 14.22 vs 14.13 (+0.6%), Flux-dev offload 12 GiB checkpointed 14.44 vs 14.38
 * (+0.4%). Expect a few percent at these sizes;
 * small models (a few hundred MB) are checked within 25% (fixed costs weigh more there).
 * Not counted: the first forward of an "offload" model, which runs with every weight on the device
 * before the plan moves blocks out; other libraries' memory (cuDNN's own workspaces are small); a
 * full fine-tune's peak is counted as if gradients and activations peaked together (an upper bound,
 * not validated). Other resolutions, batches and text lengths scale the same per-token counts.
 * OUT *estimate: the fields up to estimate->struct_size (which must be set: at least this version's
 * size); zeros on failure. No other state is read or changed (thread-safe).
 * Errors: FLAME_ERROR_INVALID_ARGUMENT (estimate or request_json NULL, struct_size too small, invalid
 * JSON, an unknown key or a bad value naming it, model and LoRA option errors as flame_model_create and
 * flame_model_add_lora give them, a LoRA target matching nothing, an offload budget that cannot be
 * met: the message gives the least), FLAME_ERROR_UNSUPPORTED (another architecture), and with "path"
 * flame_model_load's file errors (FLAME_ERROR_IO, FLAME_ERROR_INVALID_FORMAT). */
FLAME_API flame_status_t flame_model_estimate_memory(const char* request_json, flame_memory_estimate_t* estimate);

/* OUT *free_bytes, *total_bytes: the device's free and total memory now (cuMemGetInfo on ctx's GPU:
 * every process's use counted, this context's pool included; what flame_model_estimate_memory's
 * total is compared with before a run). Either pointer may be NULL when that value is not wanted.
 * Errors: FLAME_ERROR_INVALID_HANDLE, FLAME_ERROR_CUDA, FLAME_ERROR_CONTEXT_FAILED. */
FLAME_API flame_status_t flame_ctx_device_memory(flame_ctx_t ctx, uint64_t* free_bytes, uint64_t* total_bytes);

#ifdef __cplusplus
}
#endif

#endif /* FLAME_H */

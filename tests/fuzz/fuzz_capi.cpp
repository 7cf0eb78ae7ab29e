// libFuzzer target over the C API on the CPU path (no GPU, no driver: FLAME_CUDA_DRIVER_PATH points
// at nothing, so context creation fails cleanly). The input decodes to a sequence of calls:
//  - context creation with arbitrary options (struct_size, device, seed, cache directory string,
//    memory limit), device count, status / dtype queries with arbitrary values, the per-thread
//    error message set and read back;
//  - every row of the argument matrix (tests/common/arg_rows) with an arbitrary NULL argument;
//  - creation, view and reduction calls with arbitrary shapes, dims, dtypes and scalars on NULL
//    or garbage handles, and DLPack imports of arbitrary descriptors.
// Invariants: no crash or sanitizer report; every status is a flame_status_t value; a failure
// sets OUT handles to NULL and names the function in the message; no call succeeds that cannot.
#include <fuzzer/FuzzedDataProvider.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include "arg_matrix.h"
#include "flame.h"

namespace {

[[noreturn]] void finding(const char* what, const char* detail = "") {
  std::fprintf(stderr, "fuzz_capi: invariant violated: %s %s (message: %s)\n", what, detail, flame_last_error_message());
  std::abort();
}
#define REQUIRE(cond, detail) \
  do {                        \
    if (!(cond)) finding(#cond, detail); \
  } while (0)

const flame_tensor_t kSentinel = reinterpret_cast<flame_tensor_t>(static_cast<uintptr_t>(0x40));

void check_failed(flame_status_t st, const char* fn) {
  REQUIRE(st > FLAME_OK && st <= FLAME_ERROR_INPLACE_MODIFIED, fn);
  REQUIRE(std::strstr(flame_last_error_message(), fn) != nullptr, fn);
}

alignas(16) unsigned char g_garbage[256];  // zeroed: never a live handle

flame_tensor_t draw_handle(FuzzedDataProvider& p) {
  return p.ConsumeBool() ? nullptr : reinterpret_cast<flame_tensor_t>(g_garbage);
}

void call_ctx_create(FuzzedDataProvider& p) {
  flame_ctx_options_t o;
  REQUIRE(flame_ctx_options_init(&o) == FLAME_OK, "options_init");
  o.struct_size = p.ConsumeBool() ? sizeof o : p.ConsumeIntegralInRange<size_t>(0, 8192);
  o.device = p.ConsumeIntegral<int32_t>();
  o.seed = p.ConsumeIntegral<uint64_t>();
  std::string dir = p.ConsumeRandomLengthString(64);
  o.kernel_cache_dir = p.ConsumeBool() ? nullptr : dir.c_str();
  o.memory_limit = p.ConsumeIntegral<uint64_t>();
  o.allow_tf32 = p.ConsumeIntegral<int32_t>();
  o.gemm_heuristic_only = p.ConsumeIntegral<int32_t>();
  flame_ctx_t c = reinterpret_cast<flame_ctx_t>(g_garbage);
  flame_status_t st = flame_ctx_create(p.ConsumeBool() ? &o : nullptr, &c);
  REQUIRE(st != FLAME_OK, "a context without a driver");
  check_failed(st, "flame_ctx_create");
  REQUIRE(c == nullptr, "flame_ctx_create must clear *ctx");
}

void call_queries(FuzzedDataProvider& p) {
  const int v = p.ConsumeIntegral<int>();
  REQUIRE(flame_status_string(static_cast<flame_status_t>(v)) != nullptr, "status_string");
  REQUIRE(flame_dtype_name(static_cast<flame_dtype_t>(v)) != nullptr, "dtype_name");
  size_t sz = flame_dtype_size(static_cast<flame_dtype_t>(v));
  REQUIRE(sz == 0 || sz == 1 || sz == 2 || sz == 4 || sz == 8, "dtype_size");
  int32_t n = -1;
  flame_status_t st = flame_device_count(&n);
  REQUIRE(st == FLAME_ERROR_NO_DRIVER, "device_count without a driver");
  std::string msg = p.ConsumeRandomLengthString(512);
  flame_set_error_message(msg.c_str());
  REQUIRE(std::strcmp(flame_last_error_message(), msg.c_str()) == 0, "set/last error message");
}

void call_row(FuzzedDataProvider& p) {
  const auto& rows = argm::registry();
  if (rows.empty()) return;
  const argm::Row& r = rows[p.ConsumeIntegralInRange<size_t>(0, rows.size() - 1)];
  argm::Args a(argm::Mode::Cpu);
  a.null_at = p.ConsumeIntegralInRange<int>(-1, 8);
  flame_status_t st = r.call(a);
  if (r.kind == argm::Kind::Status && st != FLAME_OK) {
    check_failed(st, r.name.c_str());
    REQUIRE(a.uncleared_outs().empty(), r.name.c_str());
  }
  a.finish(st);
}

// Shapes, dims and scalars from the input on NULL / garbage handles: every call must fail cleanly.
void call_ops(FuzzedDataProvider& p) {
  const int32_t ndim = p.ConsumeIntegralInRange<int32_t>(-2, 10);
  std::vector<int64_t> shape(static_cast<size_t>(ndim > 0 ? ndim : 0));
  for (int64_t& s : shape) s = p.ConsumeIntegral<int64_t>();
  std::vector<int32_t> dims(shape.size());
  for (int32_t& d : dims) d = p.ConsumeIntegral<int32_t>();
  const int dt_raw = p.ConsumeIntegralInRange<int>(-1, 10);
  // Passed as a prvalue: an out-of-range value is never read from an enum-typed object here.
  auto dt = [dt_raw] { return static_cast<flame_dtype_t>(dt_raw); };
  const double x = p.ConsumeFloatingPoint<double>();
  flame_ctx_t ctx = p.ConsumeBool() ? nullptr : reinterpret_cast<flame_ctx_t>(g_garbage);
  flame_tensor_t t = draw_handle(p), u = draw_handle(p);
  const int64_t* sp = shape.empty() || p.ConsumeBool() ? nullptr : shape.data();
  const int32_t* dp = dims.empty() || p.ConsumeBool() ? nullptr : dims.data();
  const int32_t nd = shape.empty() ? (ndim < 0 ? ndim : 0) : ndim;
  flame_tensor_t out = kSentinel;
  flame_status_t st = FLAME_OK;
  const char* fn = "";
  switch (p.ConsumeIntegralInRange<int>(0, 11)) {
    case 0: fn = "flame_empty"; st = flame_empty(ctx, sp, nd, dt(), &out); break;
    case 1: fn = "flame_full"; st = flame_full(ctx, sp, nd, dt(), x, &out); break;
    case 2: fn = "flame_arange"; st = flame_arange(ctx, x, p.ConsumeFloatingPoint<double>(), p.ConsumeFloatingPoint<double>(), dt(), &out); break;
    case 3: fn = "flame_reshape"; st = flame_reshape(t, sp, nd, &out); break;
    case 4: fn = "flame_permute"; st = flame_permute(t, dp, nd, &out); break;
    case 5: fn = "flame_sum"; st = flame_sum(t, dp, nd, p.ConsumeIntegral<int32_t>(), &out); break;
    case 6: fn = "flame_narrow"; st = flame_narrow(t, p.ConsumeIntegral<int32_t>(), p.ConsumeIntegral<int64_t>(), p.ConsumeIntegral<int64_t>(), &out); break;
    case 7: fn = "flame_where"; st = flame_where(t, u, draw_handle(p), &out); break;
    case 8: fn = "flame_clamp"; st = flame_clamp(t, x, p.ConsumeFloatingPoint<double>(), &out); break;
    case 9: {
      fn = "flame_from_host";
      std::vector<unsigned char> host(p.ConsumeIntegralInRange<size_t>(0, 256));
      st = flame_from_host(ctx, host.empty() ? nullptr : host.data(), host.size(), sp, nd, dt(), &out);
      break;
    }
    case 10: {
      fn = "flame_split";
      flame_tensor_t outs[4] = {kSentinel, kSentinel, kSentinel, kSentinel};
      int32_t count = -1;
      st = flame_split(t, p.ConsumeIntegral<int64_t>(), p.ConsumeIntegral<int32_t>(), outs, p.ConsumeIntegralInRange<int32_t>(-1, 4), &count);
      out = nullptr;
      break;
    }
    default: {
      fn = "flame_tensor_from_dlpack";
      st = flame_tensor_from_dlpack(ctx, reinterpret_cast<struct DLManagedTensor*>(g_garbage), &out);
      break;
    }
  }
  REQUIRE(st != FLAME_OK, fn);  // no live context or tensor exists here
  check_failed(st, fn);
  REQUIRE(out == nullptr, fn);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("FLAME_CUDA_DRIVER_PATH", "/nonexistent/libcuda.so.1", 1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider p(data, size);
  for (int steps = 0; steps < 32 && p.remaining_bytes() > 0; ++steps) {
    switch (p.ConsumeIntegralInRange<int>(0, 3)) {
      case 0: call_ctx_create(p); break;
      case 1: call_queries(p); break;
      case 2: call_row(p); break;
      default: call_ops(p); break;
    }
  }
  return 0;
}

// The C ABI boundary. api_call runs an entry point's body, converts every exception into a status
// and the thread-local message (prefixed with the function's name), and never lets one escape.
#pragma once
#include <array>
#include <cstring>
#include <new>
#include <string>
#include <tuple>
#include "core/error.h"
#include "api/handles.h"

namespace flame {

template <class F>
flame_status_t api_call(const char* fn, F&& body) noexcept {
  try {
    body();
    clear_last_error();
    return FLAME_OK;
  } catch (const Error& e) {
    set_last_error(std::string(fn) + ": " + e.what());
    record_capture_error(e.status(), flame_last_error_message());
    return e.status();
  } catch (const std::bad_alloc&) {
    set_last_error(std::string(fn) + ": out of host memory");
    record_capture_error(FLAME_ERROR_OUT_OF_MEMORY, flame_last_error_message());
    return FLAME_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    set_last_error(std::string(fn) + ": internal error: " + e.what());
    record_capture_error(FLAME_ERROR_INTERNAL, flame_last_error_message());
    return FLAME_ERROR_INTERNAL;
  } catch (...) {
    set_last_error(std::string(fn) + ": internal error");
    record_capture_error(FLAME_ERROR_INTERNAL, flame_last_error_message());
    return FLAME_ERROR_INTERNAL;
  }
}

// Clears an OUT pointer up front so that it is NULL on every failure path.
template <class P>
P* out_param(P* p, const char* name) {
  FLAME_CHECK(p, FLAME_ERROR_INVALID_ARGUMENT, name, " is NULL");
  *p = P{};
  return p;
}

Context& context_of(flame_ctx_t ctx);  // validates the handle
// The result handle of an op: the input handle itself (one more reference) when the op returned
// its input unchanged (contiguous of a contiguous tensor, to_dtype to the same dtype), else new.
// While a handle scope is open on the calling thread, always a new handle (of the same tensor), so
// that the scope owns exactly the reference the call returns.
inline flame_tensor_t same_or_wrap(flame_tensor_t in, const Tensor& r) {
  if (r == in->t && !scope_open_here(r->ctx())) {
    in->refs.fetch_add(1);
    return in;
  }
  return wrap(r);
}
// Locks a context (a tensor's, or a handle object's) for the call and checks it has not failed.
class LiveScope {
 public:
  explicit LiveScope(Context& c) : scope_(c) { c.check_alive(); }
  explicit LiveScope(const Tensor& t) : LiveScope(t->ctx()) {}

 private:
  ContextScope scope_;
};

// ---------------- the common entry point: tensors in, one tensor out ----------------
// A tensor argument: its handle and its name in messages; an optional one may be NULL (a null Tensor).
struct TensorArg {
  flame_tensor_t handle;
  const char* name;
  bool optional = false;
};

// Unwraps tensor arguments in order, each in the first one's context.
template <size_t N>
std::array<Tensor, N> unwrap_args(const TensorArg (&args)[N]) {
  std::array<Tensor, N> ts;
  for (size_t i = 0; i < N; ++i) {
    if (args[i].optional && !args[i].handle) continue;
    ts[i] = unwrap(args[i].handle, args[i].name);
    FLAME_CHECK(i == 0 || &ts[i]->ctx() == &ts[0]->ctx(), FLAME_ERROR_INVALID_ARGUMENT, args[i].name,
                " belongs to another context than ", args[0].name);
  }
  return ts;
}

// Runs an op's entry point: clears *out, unwraps the arguments (unwrap_args), locks their context,
// calls f with one Tensor per argument and stores the result in *out (see same_or_wrap).
// Validation inside f reports through api_call like everything else.
template <size_t N, class F>
flame_status_t tensor_op(const char* fn, const TensorArg (&args)[N], flame_tensor_t* out, F&& f) noexcept {
  return api_call(fn, [&] {
    out_param(out, "out");
    std::array<Tensor, N> ts = unwrap_args(args);
    LiveScope s(ts[0]);
    *out = same_or_wrap(args[0].handle, std::apply(f, ts));
  });
}
// The same for an entry point that makes a tensor in a context: f(Context&).
template <class F>
flame_status_t tensor_op(const char* fn, flame_ctx_t ctx, flame_tensor_t* out, F&& f) noexcept {
  return api_call(fn, [&] {
    out_param(out, "out");
    Context& c = context_of(ctx);
    LiveScope s(c);
    *out = wrap(f(c));
  });
}

// ---------------- enum parameters ----------------
// The integer a caller passed for an enum parameter (flame_status_t, flame_dtype_t). C lets callers
// pass any int there, but in C++ reading a value outside the enum's range as the enum type is
// undefined behaviour (and lets the compiler drop range checks), so entry points read the bytes
// and validate the integer.
template <class E>
int32_t enum_arg(const E& e) noexcept {
  static_assert(sizeof(E) == sizeof(int32_t), "flame.h enums are 32-bit");
  int32_t v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

}  // namespace flame

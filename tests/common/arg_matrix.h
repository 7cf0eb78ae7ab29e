// The argument-validation matrix (issue 12): one row per exported flame_* function, shared by the
// CPU test (tests/cpu/test_arg_matrix.cpp: no GPU, garbage handles, run in CI) and the GPU test
// (tests/gpu/test_arg_matrix_gpu.cpp: live handles, strict).
//
// A row is the function called with its arguments drawn, in parameter order, from an Args
// provider that knows each pointer argument's name and role:
//
//   FLAME_ARG_ROW(flame_add, a.t("a"), a.t("b"), a.out_t("out"))
//
// Each driver calls a row several times: every argument valid; one nullable pointer NULL; one
// handle garbage / released / from another context. Args owns what it creates (input tensors,
// contexts, exported DLPack tensors, outputs) and releases it in finish(), so a row never leaks.
// Rows live in tests/common/arg_rows/<topic>.cpp (registered statically, compiled into both
// tests): adding a function is one line there, and the CPU test fails for an exported function
// that has no row (the list of exports comes from the built library itself).
//
// Row kinds: FLAME_ARG_ROW (returns flame_status_t), FLAME_ARG_VOID (void functions that accept
// NULL: *_release / *_destroy / *_remove / flame_set_error_message), FLAME_ARG_PURE (no pointer
// arguments; the expression must hold, e.g. a static string for an out-of-range value).
//
// Handle kinds: contexts, tensors, optimizers (a.opt: Live, an SGD optimizer over one parameter
// with a .grad) and safetensors files (a.st: Live, a small valid file that Args writes into its own
// temporary directory, so no row needs a GPU to make it). Released optimizers and files are parked
// by their context like tensors, so the released sweep covers every handle kind. Loss scalers
// (a.scaler) and LoRA adapters (a.lora) are made and parked the same way.
#pragma once
#include <dirent.h>
#include <stdlib.h>
#include <unistd.h>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>
#include "flame.h"

namespace argm {

enum class Kind { Status, Void, Pure };
enum class Mode { Probe, Cpu, Live };
enum class Bad { None, Garbage, Released, Foreign };

// How a live input tensor is made (Live mode). Values are all ones: rows only need valid input.
struct Spec {
  std::vector<int64_t> shape{2, 3};
  flame_dtype_t dtype = FLAME_DTYPE_F32;
  // Param: a leaf that requires grad and has a .grad of ones (optimizers and gradient clipping).
  enum Role { Plain, GradLeaf, Loss, LossLeaf, Param } role = Plain;
};
inline Spec sp(std::vector<int64_t> shape = {2, 3}, flame_dtype_t d = FLAME_DTYPE_F32) {
  Spec s;
  s.shape = std::move(shape);
  s.dtype = d;
  return s;
}
inline Spec scalar(flame_dtype_t d = FLAME_DTYPE_F32) { return sp({}, d); }
inline Spec grad_leaf() { Spec s; s.role = Spec::GradLeaf; return s; }
// A 0-d loss sum(leaf * leaf) of a 2x3 leaf that requires grad; loss_leaf() is that leaf.
inline Spec loss() { Spec s; s.shape = {}; s.role = Spec::Loss; return s; }
inline Spec loss_leaf() { Spec s; s.role = Spec::LossLeaf; return s; }
inline Spec param() { Spec s; s.role = Spec::Param; return s; }

// What one argument was, recorded in call order.
struct ArgInfo {
  std::string name;  // parameter name; for array elements the array's name
  bool nullable = false;  // a pointer the sweeps set to NULL
  bool handle = false;    // a handle the sweeps make garbage / released / foreign
  bool is_ctx = false;
  bool detects_released = true;  // a released handle of this kind is reported (not an optimizer)
};

// Hooks the GPU driver installs so that rows can hand out DLPack tensors without this header
// knowing dlpack.h: free an unconsumed (versioned) DLManagedTensor by calling its deleter.
struct DlpackHooks {
  std::function<void(struct DLManagedTensor*)> free_dl;
  std::function<void(struct DLManagedTensorVersioned*)> free_dlv;
  bool versioned = false;  // the library exports the versioned struct (else UNSUPPORTED)
};

class Args {
 public:
  Args(Mode mode, flame_ctx_t ctx = nullptr, flame_ctx_t ctx2 = nullptr, const DlpackHooks* dl = nullptr)
      : mode_(mode), ctx_(ctx), ctx2_(ctx2), dl_(dl) {}
  Args(const Args&) = delete;
  Args& operator=(const Args&) = delete;
  ~Args() { finish(FLAME_ERROR_INTERNAL); }

  // ---- the variant to produce ----
  int null_at = -1;  // index of the nullable argument passed as NULL
  int bad_at = -1;   // index of the handle argument made bad
  Bad bad = Bad::None;

  // ---- what the call saw ----
  std::vector<ArgInfo> args;
  flame_status_t expected_valid = FLAME_OK;  // the status of the all-valid call
  bool takes_released = false;  // a void row whose target may be a released handle (tensor, context)
  // Out handle slots that a failed call must leave NULL: (name, still sentinel or non-NULL?).
  std::vector<std::pair<std::string, void**>> out_slots;

  // ---- handles ----
  flame_ctx_t ctx(const char* name) {
    int h = handle_index(name, true, true);
    if (null_now()) return nullptr;
    if (mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return reinterpret_cast<flame_ctx_t>(garbage());
    if (bad_now(h)) {
      if (bad == Bad::Foreign) return ctx2_;
      if (bad == Bad::Released) return released_ctx();
      return reinterpret_cast<flame_ctx_t>(garbage());
    }
    return ctx_;
  }
  flame_tensor_t t(const char* name, Spec s = Spec()) { return tensor(name, s, true); }
  // An optimizer (Live: SGD over one param()).
  flame_optimizer_t opt(const char* name) {
    int h = handle_index(name, true, false);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return reinterpret_cast<flame_optimizer_t>(garbage());
    if (bad_now(h)) {
      if (bad == Bad::Foreign) return live_optimizer(ctx2_, true);
      if (bad == Bad::Released) {  // released: parked by its context, detectably dead
        flame_optimizer_t o = live_optimizer(ctx_, false);
        flame_optimizer_release(o);
        return o;
      }
      return reinterpret_cast<flame_optimizer_t>(garbage());
    }
    return live_optimizer(ctx_, true);
  }
  // An open safetensors file (Live: valid_st_file() loaded on the context).
  flame_safetensors_t st(const char* name) {
    int h = handle_index(name, true, false);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return reinterpret_cast<flame_safetensors_t>(garbage());
    if (bad_now(h)) {
      if (bad == Bad::Foreign) return live_st(ctx2_, true);
      if (bad == Bad::Released) {  // released: parked by its context, detectably dead
        flame_safetensors_t f = live_st(ctx_, false);
        flame_safetensors_release(f);
        return f;
      }
      return reinterpret_cast<flame_safetensors_t>(garbage());
    }
    return live_st(ctx_, true);
  }
  // The path of a valid safetensors file (valid_st_file()) / of a file to write, in Args' own
  // temporary directory (removed with its contents in finish()). Cpu: a path never opened (the
  // context is garbage or NULL), so that the CPU test and the fuzzer touch no files.
  const char* st_path(const char* name) {
    nullable(name);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return "/nonexistent/flame_argm/valid.safetensors";
    return keep_string(valid_st_file());
  }
  const char* out_path(const char* name) {
    nullable(name);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return "/nonexistent/flame_argm/out.safetensors";
    return keep_string(tmp_dir() + "/out.safetensors");
  }
  // A tensor the call retains (flame_tensor_retain): the extra reference is dropped after success.
  flame_tensor_t t_retained(const char* name) {
    flame_tensor_t x = tensor(name, Spec(), true);
    if (mode_ == Mode::Live && x) release_on_ok_.push_back(x);
    return x;
  }
  // A tensor argument that may be NULL by contract (never NULLed by the sweeps).
  flame_tensor_t opt_t(const char* name, Spec s = Spec()) { return tensor(name, s, false); }
  // An input array of handles (the array pointer is nullable; its elements are handles).
  const flame_tensor_t* ts(const char* name, std::vector<Spec> specs) { return tensor_array(name, specs, true); }
  const flame_tensor_t* opt_ts(const char* name, std::vector<Spec> specs) { return tensor_array(name, specs, false); }

  // ---- outputs ----
  flame_tensor_t* out_t(const char* name) { return out_slot<flame_tensor_t>(name, OutKind::Tensor); }
  flame_ctx_t* out_ctx(const char* name) { return out_slot<flame_ctx_t>(name, OutKind::Ctx); }
  flame_ctx_t* out_ctx_borrowed(const char* name) { return out_slot<flame_ctx_t>(name, OutKind::None); }
  flame_hook_t* out_hook(const char* name) { return out_slot<flame_hook_t>(name, OutKind::Hook); }
  struct DLManagedTensor** out_dl(const char* name) { return out_slot<struct DLManagedTensor*>(name, OutKind::Dl); }
  struct DLManagedTensorVersioned** out_dlv(const char* name) {
    if (mode_ == Mode::Live && !(dl_ && dl_->versioned)) expected_valid = FLAME_ERROR_UNSUPPORTED;
    return out_slot<struct DLManagedTensorVersioned*>(name, OutKind::Dlv);
  }
  // An array of n output handles (released after the call).
  flame_tensor_t* outs(const char* name, int n) {
    nullable(name);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    auto v = std::make_shared<std::vector<flame_tensor_t>>(static_cast<size_t>(n), nullptr);
    out_arrays_.push_back(v);
    return v->data();
  }
  // Out scalars / arrays of plain values.
  template <class T>
  T* out(const char* name, size_t n = 1) {
    nullable(name);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    return static_cast<T*>(scratch(n * sizeof(T)));
  }
  // An OUT pointer that may be NULL by contract (flame_ctx_set_grad_enabled's previous).
  template <class T>
  T* opt_out(const char*, size_t n = 1) {
    if (mode_ == Mode::Probe) return nullptr;
    return static_cast<T*>(scratch(n * sizeof(T)));
  }
  // An OUT tensor that may be NULL by contract (flame_clip_grad_norm's total_norm): never NULLed,
  // but checked for NULL after a failure and released after success.
  flame_tensor_t* opt_out_t(const char* name) {
    if (mode_ == Mode::Probe) return nullptr;
    return slot<flame_tensor_t>(name, OutKind::Tensor);
  }
  // A borrowed string OUT (safetensors names, keys, values): NULL after a failure, never freed.
  const char** out_str(const char* name) { return out_slot<const char*>(name, OutKind::None); }
  flame_optimizer_t* out_opt(const char* name) { return out_slot<flame_optimizer_t>(name, OutKind::Opt); }
  flame_safetensors_t* out_st(const char* name) { return out_slot<flame_safetensors_t>(name, OutKind::St); }

  // ---- plain inputs ----
  template <class T>
  const T* in(const char* name, std::vector<T> values) {
    nullable(name);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    T* p = static_cast<T*>(scratch(values.size() * sizeof(T)));
    std::memcpy(p, values.data(), values.size() * sizeof(T));
    return p;
  }
  void* buf(const char* name, size_t bytes) { return out<unsigned char>(name, bytes); }
  char* chars(const char* name, size_t n) { return out<char>(name, n); }
  const char* str(const char* name, const char* value) {
    nullable(name);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    return value;
  }
  template <class F>
  F fn(const char* name, F f) {
    nullable(name);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    return f;
  }
  flame_ctx_options_t* opts(const char* name) {
    flame_ctx_options_t* o = out<flame_ctx_options_t>(name);
    if (o) flame_ctx_options_init(o);
    return o;
  }
  const flame_ctx_options_t* opt_opts(const char*) {
    if (mode_ == Mode::Probe) return nullptr;
    auto* o = static_cast<flame_ctx_options_t*>(scratch(sizeof(flame_ctx_options_t)));
    flame_ctx_options_init(o);
    o->kernel_cache_dir = "";
    return o;
  }
  // Optimizer options filled with the defaults of kind.
  const flame_optimizer_options_t* optim_opts(const char* name, int32_t kind = FLAME_OPTIMIZER_SGD) {
    flame_optimizer_options_t* o = out<flame_optimizer_options_t>(name);
    if (o) flame_optimizer_options_init(o, kind);
    return o;
  }
  // Attention options with the defaults. NULL is allowed by contract (the defaults), so the sweeps
  // never NULL it.
  const flame_attention_options_t* attention_opts(const char*) {
    if (mode_ == Mode::Probe) return nullptr;
    auto* o = static_cast<flame_attention_options_t*>(scratch(sizeof(flame_attention_options_t)));
    flame_attention_options_init(o);
    return o;
  }
  flame_memory_stats_t* stats(const char* name) {
    flame_memory_stats_t* s = out<flame_memory_stats_t>(name);
    if (s) s->struct_size = sizeof(flame_memory_stats_t);
    return s;
  }
  flame_memory_estimate_t* estimate(const char* name) {
    flame_memory_estimate_t* s = out<flame_memory_estimate_t>(name);
    if (s) s->struct_size = sizeof(flame_memory_estimate_t);
    return s;
  }
  flame_ctx_counters_t* counters(const char* name) {
    flame_ctx_counters_t* s = out<flame_ctx_counters_t>(name);
    if (s) s->struct_size = sizeof(flame_ctx_counters_t);
    return s;
  }

  // ---- DLPack inputs (Live: exported from a fresh tensor; Cpu: an opaque buffer never read) ----
  struct DLManagedTensor* dl(const char* name) {
    nullable(name);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return static_cast<struct DLManagedTensor*>(garbage());
    struct DLManagedTensor* m = nullptr;
    flame_tensor_t t = live_tensor(ctx_, sp());
    if (flame_tensor_to_dlpack(t, &m) != FLAME_OK) return nullptr;
    dl_in_ = m;
    return m;
  }
  struct DLManagedTensorVersioned* dlv(const char* name) {
    nullable(name);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu || !(dl_ && dl_->versioned)) {
      if (mode_ == Mode::Live) expected_valid = FLAME_ERROR_UNSUPPORTED;
      return static_cast<struct DLManagedTensorVersioned*>(garbage());  // never read without support
    }
    struct DLManagedTensorVersioned* m = nullptr;
    flame_tensor_t t = live_tensor(ctx_, sp());
    if (flame_tensor_to_dlpack_versioned(t, &m) != FLAME_OK) return nullptr;
    dlv_in_ = m;
    return m;
  }

  // ---- targets of void release functions (Live: a live object the call consumes) ----
  flame_tensor_t release_t(const char* name) {
    takes_released = true;
    nullable(name);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return reinterpret_cast<flame_tensor_t>(garbage());
    flame_tensor_t t = nullptr;
    if (bad == Bad::Released) return released_tensor(ctx_);
    const int64_t shape[] = {2};
    flame_zeros(ctx_, shape, 1, FLAME_DTYPE_F32, &t);
    return t;
  }
  flame_ctx_t release_ctx(const char* name) {
    takes_released = true;
    nullable(name);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return reinterpret_cast<flame_ctx_t>(garbage());
    if (bad == Bad::Released) return released_ctx();
    flame_ctx_options_t o;
    flame_ctx_options_init(&o);
    o.kernel_cache_dir = "";
    flame_ctx_t c = nullptr;
    flame_ctx_create(&o, &c);
    return c;
  }
  flame_hook_t release_hook(const char* name);  // defined below (needs the hook functions)
  flame_optimizer_t release_opt(const char* name) {  // no takes_released: a released one is freed
    nullable(name);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return reinterpret_cast<flame_optimizer_t>(garbage());
    return live_optimizer(ctx_, false);
  }
  flame_safetensors_t release_st(const char* name) {
    takes_released = true;
    nullable(name);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return reinterpret_cast<flame_safetensors_t>(garbage());
    flame_safetensors_t f = live_st(ctx_, false);
    if (bad == Bad::Released) flame_safetensors_release(f);
    return f;
  }

  // ---- training toolkit handles (Live: a.scaler is a loss scaler with default options; a.lora a
  // rank-2 LoRA adapter, alpha 4, over an f32 [4, 3] weight and a [4] bias, so x is sp()) ----
  flame_grad_scaler_t scaler(const char* name) {
    int h = handle_index(name, true, false);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return reinterpret_cast<flame_grad_scaler_t>(garbage());
    if (bad_now(h)) {
      if (bad == Bad::Foreign) return live_scaler(ctx2_, true);
      if (bad == Bad::Released) {  // released: parked by its context, detectably dead
        flame_grad_scaler_t g = live_scaler(ctx_, false);
        flame_grad_scaler_release(g);
        return g;
      }
      return reinterpret_cast<flame_grad_scaler_t>(garbage());
    }
    return live_scaler(ctx_, true);
  }
  flame_grad_scaler_t release_scaler(const char* name) {
    takes_released = true;
    nullable(name);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return reinterpret_cast<flame_grad_scaler_t>(garbage());
    flame_grad_scaler_t g = live_scaler(ctx_, false);
    if (bad == Bad::Released) flame_grad_scaler_release(g);
    return g;
  }
  flame_grad_scaler_t* out_scaler(const char* name) { return out_slot<flame_grad_scaler_t>(name, OutKind::Scaler); }
  flame_lora_t lora(const char* name) {
    int h = handle_index(name, true, false);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return reinterpret_cast<flame_lora_t>(garbage());
    if (bad_now(h)) {
      if (bad == Bad::Foreign) return live_lora(ctx2_, true);
      if (bad == Bad::Released) {
        flame_lora_t l = live_lora(ctx_, false);
        flame_lora_release(l);
        return l;
      }
      return reinterpret_cast<flame_lora_t>(garbage());
    }
    return live_lora(ctx_, true);
  }
  flame_lora_t release_lora(const char* name) {
    takes_released = true;
    nullable(name);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return reinterpret_cast<flame_lora_t>(garbage());
    flame_lora_t l = live_lora(ctx_, false);
    if (bad == Bad::Released) flame_lora_release(l);
    return l;
  }
  flame_lora_t* out_lora(const char* name) { return out_slot<flame_lora_t>(name, OutKind::Lora); }

  // ---- CUDA graphs (Live: a.cuda_graph is a graph captured on the context, one small op; a.capture_ctx
  // is the context, capturing when the call gets the live one; a.begin_ctx is the context for
  // flame_graph_capture_begin. finish() ends a capture either left open, so rows never leak one) ----
  flame_graph_t cuda_graph(const char* name) { return graph_handle(name, true); }
  // A graph argument that may be NULL by contract (never NULLed by the sweeps).
  flame_graph_t opt_cuda_graph(const char* name) { return graph_handle(name, false); }
  flame_graph_t graph_handle(const char* name, bool is_nullable) {
    int h = handle_index(name, is_nullable, false);
    if ((is_nullable && null_now()) || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return reinterpret_cast<flame_graph_t>(garbage());
    if (bad_now(h)) {
      if (bad == Bad::Foreign) return live_cuda_graph(ctx2_, true);
      if (bad == Bad::Released) {  // released: parked by its context, detectably dead
        flame_graph_t g = live_cuda_graph(ctx_, false);
        flame_graph_release(g);
        return g;
      }
      return reinterpret_cast<flame_graph_t>(garbage());
    }
    return live_cuda_graph(ctx_, true);
  }
  flame_graph_t release_cuda_graph(const char* name) {
    takes_released = true;
    nullable(name);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return reinterpret_cast<flame_graph_t>(garbage());
    flame_graph_t g = live_cuda_graph(ctx_, false);
    if (bad == Bad::Released) flame_graph_release(g);
    return g;
  }
  flame_graph_t* out_cuda_graph(const char* name) { return out_slot<flame_graph_t>(name, OutKind::Graph); }
  flame_ctx_t capture_ctx(const char* name) {
    flame_ctx_t c = ctx(name);
    if (mode_ == Mode::Live && c && c == ctx_ && flame_graph_capture_begin(c) == FLAME_OK) end_capture_ = true;
    return c;
  }
  flame_ctx_t begin_ctx(const char* name) {
    flame_ctx_t c = ctx(name);
    if (mode_ == Mode::Live && c && (c == ctx_ || c == ctx2_)) end_capture_ = true;
    return c;
  }

  // ---- distributed handles (Live: a.comm is a world-size-1 communicator on the context, made from a
  // fresh id; a.dp a data-parallel helper over such a communicator and one param(); a.comm_id a
  // fresh id; Cpu: zeroed bytes, never used since the context is garbage) ----
  flame_comm_t comm(const char* name) {
    int h = handle_index(name, true, false);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return reinterpret_cast<flame_comm_t>(garbage());
    if (bad_now(h)) {
      if (bad == Bad::Foreign) return live_comm(ctx2_, true);
      if (bad == Bad::Released) {  // released: parked by its context, detectably dead
        flame_comm_t c = live_comm(ctx_, false);
        flame_comm_release(c);
        return c;
      }
      return reinterpret_cast<flame_comm_t>(garbage());
    }
    return live_comm(ctx_, true);
  }
  flame_comm_t release_comm(const char* name) {
    takes_released = true;
    nullable(name);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return reinterpret_cast<flame_comm_t>(garbage());
    flame_comm_t c = live_comm(ctx_, false);
    if (bad == Bad::Released) flame_comm_release(c);
    return c;
  }
  flame_comm_t* out_comm(const char* name) { return out_slot<flame_comm_t>(name, OutKind::Comm); }
  flame_dp_t dp(const char* name) {
    int h = handle_index(name, true, false);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return reinterpret_cast<flame_dp_t>(garbage());
    if (bad_now(h)) {
      if (bad == Bad::Foreign) return live_dp(ctx2_, true);
      if (bad == Bad::Released) {
        flame_dp_t d = live_dp(ctx_, false);
        flame_dp_release(d);
        return d;
      }
      return reinterpret_cast<flame_dp_t>(garbage());
    }
    return live_dp(ctx_, true);
  }
  flame_dp_t release_dp(const char* name) {
    takes_released = true;
    nullable(name);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return reinterpret_cast<flame_dp_t>(garbage());
    flame_dp_t d = live_dp(ctx_, false);
    if (bad == Bad::Released) flame_dp_release(d);
    return d;
  }
  flame_dp_t* out_dp(const char* name) { return out_slot<flame_dp_t>(name, OutKind::Dp); }
  // a.zero: a ZeRO helper over a world-size-1 communicator and a fresh live optimizer (Live).
  flame_zero_t zero(const char* name) {
    int h = handle_index(name, true, false);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return reinterpret_cast<flame_zero_t>(garbage());
    if (bad_now(h)) {
      if (bad == Bad::Foreign) return live_zero(ctx2_, true);
      if (bad == Bad::Released) {
        flame_zero_t z = live_zero(ctx_, false);
        flame_zero_release(z);
        return z;
      }
      return reinterpret_cast<flame_zero_t>(garbage());
    }
    return live_zero(ctx_, true);
  }
  flame_zero_t release_zero(const char* name) {
    takes_released = true;
    nullable(name);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return reinterpret_cast<flame_zero_t>(garbage());
    flame_zero_t z = live_zero(ctx_, false);
    if (bad == Bad::Released) flame_zero_release(z);
    return z;
  }
  // a.zero3: a stage-3 helper sharding a tiny live model over a world-size-1 communicator (Live).
  flame_zero_t zero3(const char* name) {
    int h = handle_index(name, true, false);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return reinterpret_cast<flame_zero_t>(garbage());
    if (bad_now(h)) {
      if (bad == Bad::Foreign) return live_zero3(ctx2_, true);
      if (bad == Bad::Released) {
        flame_zero_t z = live_zero3(ctx_, false);
        flame_zero_release(z);
        return z;
      }
      return reinterpret_cast<flame_zero_t>(garbage());
    }
    return live_zero3(ctx_, true);
  }
  flame_zero_t* out_zero(const char* name) { return out_slot<flame_zero_t>(name, OutKind::Zero); }
  const flame_comm_id_t* comm_id(const char* name) {
    nullable(name);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    auto* id = static_cast<flame_comm_id_t*>(scratch(sizeof(flame_comm_id_t)));
    if (mode_ == Mode::Live) flame_comm_unique_id(ctx_, id);
    return id;
  }
  // An array of one context (the handle inside may be made bad like any context handle).
  const flame_ctx_t* ctx_array(const char* name) {
    nullable(name);
    const bool null_array = null_now();
    int h = handle_index(name, false, true);
    flame_ctx_t c = nullptr;
    if (mode_ == Mode::Cpu) {
      c = reinterpret_cast<flame_ctx_t>(garbage());
    } else if (mode_ == Mode::Live) {
      c = ctx_;
      if (bad_now(h))
        c = bad == Bad::Foreign ? ctx2_ : bad == Bad::Released ? released_ctx() : reinterpret_cast<flame_ctx_t>(garbage());
    }
    if (null_array || mode_ == Mode::Probe) return nullptr;
    auto* arr = static_cast<flame_ctx_t*>(scratch(sizeof(flame_ctx_t)));
    arr[0] = c;
    return arr;
  }

  // ---- fused expressions (Live: a.fused is "x0 * x1 + 1" over 2 inputs, so inputs are two sp()) ----
  flame_fused_t fused(const char* name) {
    int h = handle_index(name, true, false);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return reinterpret_cast<flame_fused_t>(garbage());
    if (bad_now(h)) {
      if (bad == Bad::Foreign) return live_fused(ctx2_, true);
      if (bad == Bad::Released) {  // released: parked by its context, detectably dead
        flame_fused_t f = live_fused(ctx_, false);
        flame_fused_release(f);
        return f;
      }
      return reinterpret_cast<flame_fused_t>(garbage());
    }
    return live_fused(ctx_, true);
  }
  flame_fused_t release_fused(const char* name) {
    takes_released = true;
    nullable(name);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return reinterpret_cast<flame_fused_t>(garbage());
    flame_fused_t f = live_fused(ctx_, false);
    if (bad == Bad::Released) flame_fused_release(f);
    return f;
  }
  flame_fused_t* out_fused(const char* name) { return out_slot<flame_fused_t>(name, OutKind::Fused); }

  // ---- handle scopes (Live: a.scope is a scope begun on the context, the same one for every
  // argument of the row; a.scoped_t a tensor made while it is innermost, so held by it; a.end_scope a
  // fresh scope the call ends. finish() ends the scopes a row left open, after the row's tensors) ----
  flame_scope_t scope(const char* name) {
    int h = handle_index(name, true, false);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return reinterpret_cast<flame_scope_t>(garbage());
    if (bad_now(h)) {
      if (bad == Bad::Foreign) return begin_scope(ctx2_);
      if (bad == Bad::Released) {  // ended: parked by its context, detectably dead
        flame_scope_t s = nullptr;
        if (flame_scope_begin(ctx_, &s) != FLAME_OK) return nullptr;
        flame_scope_end(s);
        return s;
      }
      return reinterpret_cast<flame_scope_t>(garbage());
    }
    return row_scope();
  }
  flame_tensor_t scoped_t(const char* name) {
    if (mode_ == Mode::Live) row_scope();
    return tensor(name, Spec(), true);
  }
  // flame_scope_end's scope: a handle, but not NULLed by the sweeps (NULL is a no-op there).
  flame_scope_t end_scope(const char* name) {
    int h = handle_index(name, false, false);
    if (mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu || (bad_now(h) && bad == Bad::Garbage)) return reinterpret_cast<flame_scope_t>(garbage());
    flame_scope_t s = nullptr;
    if (flame_scope_begin(ctx_, &s) != FLAME_OK) return nullptr;
    if (bad_now(h) && bad == Bad::Released) flame_scope_end(s);
    return s;
  }
  flame_scope_t* out_scope(const char* name) { return out_slot<flame_scope_t>(name, OutKind::Scope); }

  // ---- models (Live: a.model is a tiny CLIPTextModel, kTinyModelConfig; a.model_path a file it
  // saved, loaded with kTinyModelOptions) ----
  static constexpr const char* kTinyModelConfig =
      "{\"vocab_size\": 16, \"hidden_size\": 8, \"intermediate_size\": 16, \"num_hidden_layers\": 1, "
      "\"num_attention_heads\": 2, \"max_position_embeddings\": 8}";
  static constexpr const char* kTinyModelOptions =
      "{\"architecture\": \"CLIPTextModel\", \"config\": {\"vocab_size\": 16, \"hidden_size\": 8, "
      "\"intermediate_size\": 16, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
      "\"max_position_embeddings\": 8}}";
  flame_model_t model(const char* name) {
    int h = handle_index(name, true, false);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return reinterpret_cast<flame_model_t>(garbage());
    if (bad_now(h)) {
      if (bad == Bad::Released) {  // released: parked by its context, detectably dead
        flame_model_t m = live_model(ctx_, false);
        flame_model_release(m);
        return m;
      }
      if (bad == Bad::Foreign) return live_model(ctx2_, true);
      return reinterpret_cast<flame_model_t>(garbage());
    }
    return live_model(ctx_, true);
  }
  flame_model_t release_model(const char* name) {
    takes_released = true;
    nullable(name);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return reinterpret_cast<flame_model_t>(garbage());
    flame_model_t m = live_model(ctx_, false);
    if (bad == Bad::Released) flame_model_release(m);
    return m;
  }
  flame_model_t* out_model(const char* name) { return out_slot<flame_model_t>(name, OutKind::Model); }
  // a.model with a LoRA adapter "default" (rank 2, the default targets) added
  flame_model_t lora_model(const char* name) {
    flame_model_t m = model(name);
    if (m && mode_ == Mode::Live) {
      flame_params_t p = nullptr;
      if (flame_model_add_lora(m, "{\"rank\": 2}", &p) == FLAME_OK) flame_params_release(p);
    }
    return m;
  }
  // A LoRA file (peft format) of the tiny model's adapter, for flame_model_load_lora.
  const char* lora_path(const char* name) {
    nullable(name);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return "/nonexistent/flame_argm/lora.safetensors";
    const std::string path = tmp_dir() + "/lora.safetensors";
    flame_model_t m = live_model(ctx_, false);
    flame_params_t p = nullptr;
    if (m && flame_model_add_lora(m, "{\"rank\": 2}", &p) == FLAME_OK) {
      flame_params_release(p);
      flame_model_save_lora(m, nullptr, path.c_str(), "{\"format\": \"peft\"}");
    }
    flame_model_release(m);
    return keep_string(path);
  }
  // A model file (the tiny CLIPTextModel in diffusers names) for flame_model_load.
  const char* model_path(const char* name) {
    nullable(name);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return "/nonexistent/flame_argm/model.safetensors";
    const std::string path = tmp_dir() + "/model.safetensors";
    flame_model_t m = live_model(ctx_, false);
    if (m) flame_model_save(m, path.c_str(), nullptr);
    flame_model_release(m);
    return keep_string(path);
  }
  // inputs of the tiny model's forward: input_ids [1, 4] (i64).
  flame_params_t model_inputs(const char* name) {
    int h = handle_index(name, true, false);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return reinterpret_cast<flame_params_t>(garbage());
    flame_ctx_t c = bad_now(h) && bad == Bad::Foreign ? ctx2_ : ctx_;
    if (bad_now(h) && bad == Bad::Garbage) return reinterpret_cast<flame_params_t>(garbage());
    flame_params_t p = nullptr;
    if (flame_params_create(c, &p) != FLAME_OK) return nullptr;
    const int64_t ids[4] = {1, 5, 7, 3}, shape[2] = {1, 4};
    flame_tensor_t t = nullptr;
    if (flame_from_host(c, ids, sizeof(ids), shape, 2, FLAME_DTYPE_I64, &t) == FLAME_OK) {
      flame_params_add(p, "input_ids", t);
      flame_tensor_release(t);
    }
    if (bad_now(h) && bad == Bad::Released) {
      flame_params_release(p);
      return p;
    }
    params_.push_back(p);
    return p;
  }

  // ---- named parameter lists (Live: a.params is a list with one entry "x", a ones sp(), matching
  // the file of st_path) ----
  flame_params_t params(const char* name) {
    int h = handle_index(name, true, false);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return reinterpret_cast<flame_params_t>(garbage());
    if (bad_now(h)) {
      if (bad == Bad::Foreign) return live_params(ctx2_, true);
      if (bad == Bad::Released) {  // released: parked by its context, detectably dead
        flame_params_t p = live_params(ctx_, false);
        flame_params_release(p);
        return p;
      }
      return reinterpret_cast<flame_params_t>(garbage());
    }
    return live_params(ctx_, true);
  }
  flame_params_t release_params(const char* name) {
    takes_released = true;
    nullable(name);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return reinterpret_cast<flame_params_t>(garbage());
    flame_params_t p = live_params(ctx_, false);
    if (bad == Bad::Released) flame_params_release(p);
    return p;
  }
  flame_params_t* out_params(const char* name) { return out_slot<flame_params_t>(name, OutKind::Params); }
  // A borrowed OUT pointer of any pointer type (a list's tensors): NULL after a failure, never freed.
  template <class P>
  P* out_borrowed(const char* name) {
    return out_slot<P>(name, OutKind::None);
  }

  // ---- after the call ----
  // Checks the out slots of a failed call; returns the names of slots not set to NULL.
  std::vector<std::string> uncleared_outs() const {
    std::vector<std::string> bad_slots;
    for (const auto& s : out_slots)
      if (*s.second != nullptr) bad_slots.push_back(s.first);
    return bad_slots;
  }
  // Releases everything the row made; `status` is the call's result (ownership of DLPack inputs
  // passed to FLAME on success).
  void finish(flame_status_t status);

  // The names of the nullable arguments / handle arguments, in call order (after a probe).
  std::vector<std::string> nullable_names() const {
    std::vector<std::string> v;
    for (const ArgInfo& a : args)
      if (a.nullable) v.push_back(a.name);
    return v;
  }
  std::vector<ArgInfo> handles() const {
    std::vector<ArgInfo> v;
    for (const ArgInfo& a : args)
      if (a.handle) v.push_back(a);
    return v;
  }

  Mode mode() const { return mode_; }

 private:
  enum class OutKind { None, Tensor, Ctx, Hook, Dl, Dlv, Opt, St, Scaler, Lora, Graph, Comm, Dp, Zero, Fused, Scope, Params, Model };
  struct OutSlot {
    OutKind kind;
    void** slot;
  };

  bool null_now() const { return null_at >= 0 && nullable_seen_ - 1 == null_at; }
  bool bad_now(int h) const { return bad != Bad::None && h == bad_at; }
  void nullable(const char* name) {
    ArgInfo a;
    a.name = name;
    a.nullable = true;
    args.push_back(a);
    ++nullable_seen_;
  }
  int handle_index(const char* name, bool is_nullable, bool is_ctx) {
    ArgInfo a;
    a.name = name;
    a.nullable = is_nullable;
    a.handle = true;
    a.is_ctx = is_ctx;
    args.push_back(a);
    if (is_nullable) ++nullable_seen_;
    return handles_seen_++;
  }
  void* garbage() {  // zeroed memory: no magic matches, and nothing is read past the magic
    return scratch(256);
  }
  void* scratch(size_t bytes) {
    scratch_.emplace_back(new uint64_t[(bytes + 7) / 8 + 1]());
    return scratch_.back().get();
  }
  template <class P>
  P* out_slot(const char* name, OutKind kind) {
    nullable(name);
    if (null_now() || mode_ == Mode::Probe) return nullptr;
    return slot<P>(name, kind);
  }
  template <class P>
  P* slot(const char* name, OutKind kind) {
    P* p = static_cast<P*>(scratch(sizeof(P)));
    *p = reinterpret_cast<P>(static_cast<uintptr_t>(0x40));  // a failing call must overwrite it
    void** as_void = static_cast<void**>(static_cast<void*>(p));  // P is a pointer type
    out_slots.emplace_back(name, as_void);
    outs_.push_back({kind, as_void});
    return p;
  }

  flame_tensor_t tensor(const char* name, const Spec& s, bool is_nullable) {
    int h = handle_index(name, is_nullable, false);
    if (is_nullable && null_now()) return nullptr;
    if (mode_ == Mode::Probe) return nullptr;
    if (mode_ == Mode::Cpu) return reinterpret_cast<flame_tensor_t>(garbage());
    if (bad_now(h)) {
      if (bad == Bad::Foreign) return live_tensor(ctx2_, s);
      if (bad == Bad::Released) return released_tensor(ctx_);
      return reinterpret_cast<flame_tensor_t>(garbage());
    }
    return live_tensor(ctx_, s);
  }
  const flame_tensor_t* tensor_array(const char* name, const std::vector<Spec>& specs, bool is_nullable) {
    if (is_nullable) nullable(name);
    bool null_array = is_nullable && null_now();
    auto v = std::make_shared<std::vector<flame_tensor_t>>();
    for (const Spec& s : specs) v->push_back(tensor(name, s, false));  // elements: handles, not NULLed
    if (null_array || mode_ == Mode::Probe) return nullptr;
    in_arrays_.push_back(v);
    return v->data();
  }

  // Live objects (owned here, released in finish).
  flame_tensor_t live_tensor(flame_ctx_t c, const Spec& s);
  flame_tensor_t released_tensor(flame_ctx_t c) {
    flame_tensor_t t = nullptr;
    const int64_t shape[] = {2};
    flame_zeros(c, shape, 1, FLAME_DTYPE_F32, &t);
    flame_tensor_release(t);  // kept in the context's quarantine: detectably dead
    return t;
  }
  flame_ctx_t released_ctx() {  // destroyed, kept readable by one of its tensors
    flame_ctx_options_t o;
    flame_ctx_options_init(&o);
    o.kernel_cache_dir = "";
    flame_ctx_t c = nullptr;
    if (flame_ctx_create(&o, &c) != FLAME_OK) return nullptr;
    flame_tensor_t keep = nullptr;
    const int64_t shape[] = {1};
    flame_zeros(c, shape, 1, FLAME_DTYPE_F32, &keep);
    owned_.push_back(keep);
    flame_ctx_destroy(c);
    return c;
  }
  struct Graph {
    flame_tensor_t leaf = nullptr, loss = nullptr;
  };
  Graph& graph(flame_ctx_t c);

  // An SGD optimizer on c over one param() (kept: released in finish).
  flame_optimizer_t live_optimizer(flame_ctx_t c, bool keep) {
    flame_optimizer_options_t o;
    if (flame_optimizer_options_init(&o, FLAME_OPTIMIZER_SGD) != FLAME_OK) return nullptr;
    flame_tensor_t p = live_tensor(c, param());
    flame_optimizer_t opt = nullptr;
    if (flame_optimizer_create(c, &o, &p, 1, &opt) != FLAME_OK) return nullptr;
    if (keep) opts_.push_back(opt);
    return opt;
  }
  flame_safetensors_t live_st(flame_ctx_t c, bool keep) {
    flame_safetensors_t f = nullptr;
    if (flame_safetensors_load(c, valid_st_file().c_str(), &f) != FLAME_OK) return nullptr;
    if (keep) files_.push_back(f);
    return f;
  }
  flame_grad_scaler_t live_scaler(flame_ctx_t c, bool keep) {
    flame_grad_scaler_t g = nullptr;
    if (flame_grad_scaler_create(c, nullptr, &g) != FLAME_OK) return nullptr;
    if (keep) scalers_.push_back(g);
    return g;
  }
  flame_graph_t live_cuda_graph(flame_ctx_t c, bool keep) {
    flame_tensor_t x = live_tensor(c, sp()), y = nullptr;
    flame_graph_t g = nullptr;
    if (flame_graph_capture_begin(c) != FLAME_OK) return nullptr;
    flame_status_t st = flame_mul_scalar(x, 2.0, &y);
    flame_tensor_release(y);
    if (flame_graph_capture_end(c, &g) != FLAME_OK || st != FLAME_OK) return nullptr;
    if (keep) cuda_graphs_.push_back(g);
    return g;
  }

  flame_comm_t live_comm(flame_ctx_t c, bool keep) {  // world size 1: needs NCCL
    flame_comm_id_t id;
    flame_comm_t comm = nullptr;
    if (flame_comm_unique_id(c, &id) != FLAME_OK || flame_comm_create(c, &id, 0, 1, nullptr, &comm) != FLAME_OK) return nullptr;
    if (keep) comms_.push_back(comm);
    return comm;
  }
  flame_dp_t live_dp(flame_ctx_t c, bool keep) {
    flame_comm_t comm = live_comm(c, true);
    flame_tensor_t p = live_tensor(c, param());
    flame_dp_t d = nullptr;
    if (!comm || flame_dp_create(comm, &p, 1, nullptr, &d) != FLAME_OK) return nullptr;
    if (keep) dps_.push_back(d);
    return d;
  }
  flame_zero_t live_zero(flame_ctx_t c, bool keep) {
    flame_comm_t comm = live_comm(c, true);
    flame_optimizer_t opt = live_optimizer(c, true);
    flame_zero_t z = nullptr;
    if (!comm || !opt || flame_zero_create(comm, opt, nullptr, &z) != FLAME_OK) return nullptr;
    if (keep) zeros_.push_back(z);
    return z;
  }
  // Stage 3: a tiny CLIP text model that ran one forward with gradients off (so that it knows its
  // blocks), sharded over a world-size-1 communicator beside a live optimizer, gathered in bf16.
  flame_zero_t live_zero3(flame_ctx_t c, bool keep) {
    flame_comm_t comm = live_comm(c, true);
    flame_optimizer_t opt = live_optimizer(c, true);
    flame_model_t m = live_model(c, true);
    if (!comm || !opt || !m) return nullptr;
    flame_params_t in = nullptr, out = nullptr;
    if (flame_params_create(c, &in) != FLAME_OK) return nullptr;
    const int64_t ids[4] = {1, 5, 7, 3}, shape[2] = {1, 4};
    flame_tensor_t t = nullptr;
    if (flame_from_host(c, ids, sizeof(ids), shape, 2, FLAME_DTYPE_I64, &t) == FLAME_OK) {
      flame_params_add(in, "input_ids", t);
      flame_tensor_release(t);
    }
    int32_t grad = 1;
    flame_ctx_set_grad_enabled(c, 0, &grad);
    const flame_status_t st = flame_model_forward(m, in, &out);
    flame_ctx_set_grad_enabled(c, grad, nullptr);
    flame_params_release(in);
    flame_params_release(out);
    if (st != FLAME_OK) return nullptr;
    flame_zero_options_t o;
    flame_zero_options_init(&o);
    o.stage = 3;
    o.model = m;
    o.reduce_dtype = FLAME_DTYPE_F32;  // valid values other than the defaults (the CLIP model is f32)
    o.gather_dtype = FLAME_DTYPE_BF16;
    flame_zero_t z = nullptr;
    if (flame_zero_create(comm, opt, &o, &z) != FLAME_OK) return nullptr;
    if (keep) zeros_.push_back(z);
    return z;
  }
  flame_lora_t live_lora(flame_ctx_t c, bool keep) {
    flame_tensor_t w = live_tensor(c, sp({4, 3})), b = live_tensor(c, sp({4}));
    flame_lora_t l = nullptr;
    if (flame_lora_create(w, b, 2, 4.0, &l) != FLAME_OK) return nullptr;
    if (keep) loras_.push_back(l);
    return l;
  }
  // The scope of the row on the context (begun on first use, ended in finish).
  flame_scope_t row_scope() {
    if (!row_scope_) row_scope_ = begin_scope(ctx_);
    return row_scope_;
  }
  flame_scope_t begin_scope(flame_ctx_t c) {
    flame_scope_t s = nullptr;
    if (flame_scope_begin(c, &s) != FLAME_OK) return nullptr;
    scopes_.push_back(s);
    return s;
  }
  flame_model_t live_model(flame_ctx_t c, bool keep) {
    flame_model_t m = nullptr;
    if (flame_model_create(c, "CLIPTextModel", kTinyModelConfig, nullptr, &m) != FLAME_OK) return nullptr;
    if (keep) models_.push_back(m);
    return m;
  }
  flame_params_t live_params(flame_ctx_t c, bool keep) {
    flame_params_t p = nullptr;
    if (flame_params_create(c, &p) != FLAME_OK) return nullptr;
    if (flame_params_add(p, "x", live_tensor(c, sp())) != FLAME_OK) {
      flame_params_release(p);
      return nullptr;
    }
    if (keep) params_.push_back(p);
    return p;
  }
  flame_fused_t live_fused(flame_ctx_t c, bool keep) {
    flame_fused_t f = nullptr;
    if (flame_fused_compile(c, "x0 * x1 + 1", 2, &f) != FLAME_OK) return nullptr;
    if (keep) fused_.push_back(f);
    return f;
  }
  // A valid safetensors file with tensor "x" (F32 [2, 3], ones) and metadata {"format": "pt"}.
  std::string valid_st_file() {
    const std::string path = tmp_dir() + "/valid.safetensors";
    if (!st_written_) {
      const std::string json =
          "{\"__metadata__\":{\"format\":\"pt\"},\"x\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}";
      std::string bytes;
      for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>(static_cast<uint64_t>(json.size()) >> (8 * i)));
      bytes += json;
      const float one = 1.0f;  // little-endian hosts only, as FLAME
      for (int i = 0; i < 6; ++i) bytes.append(reinterpret_cast<const char*>(&one), sizeof one);
      if (FILE* f = std::fopen(path.c_str(), "wb")) {
        st_written_ = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
        st_written_ = std::fclose(f) == 0 && st_written_;
      }
    }
    return path;
  }
  std::string tmp_dir() {
    if (tmp_dir_.empty()) {
      const char* base = std::getenv("TMPDIR");
      std::string tmpl = std::string(base && *base ? base : "/tmp") + "/flame_argm_XXXXXX";
      if (mkdtemp(&tmpl[0])) tmp_dir_ = tmpl;
    }
    return tmp_dir_;
  }
  void remove_tmp_dir() {  // the files rows wrote (and any a failed save left behind), then the dir
    if (tmp_dir_.empty()) return;
    if (DIR* d = opendir(tmp_dir_.c_str())) {
      while (dirent* e = readdir(d)) {
        const std::string n = e->d_name;
        if (n != "." && n != "..") std::remove((tmp_dir_ + "/" + n).c_str());
      }
      closedir(d);
    }
    rmdir(tmp_dir_.c_str());
    tmp_dir_.clear();
  }
  const char* keep_string(const std::string& s) {
    char* p = static_cast<char*>(scratch(s.size() + 1));
    std::memcpy(p, s.c_str(), s.size() + 1);
    return p;
  }

  Mode mode_;
  flame_ctx_t ctx_, ctx2_;
  const DlpackHooks* dl_;
  int nullable_seen_ = 0, handles_seen_ = 0;
  std::vector<std::unique_ptr<uint64_t[]>> scratch_;
  std::vector<flame_tensor_t> owned_;
  std::vector<std::shared_ptr<std::vector<flame_tensor_t>>> in_arrays_, out_arrays_;
  std::vector<OutSlot> outs_;
  std::vector<std::pair<flame_ctx_t, Graph>> graphs_;
  std::vector<flame_tensor_t> release_on_ok_;
  std::vector<flame_optimizer_t> opts_;
  std::vector<flame_safetensors_t> files_;
  std::vector<flame_grad_scaler_t> scalers_;
  std::vector<flame_lora_t> loras_;
  std::vector<flame_graph_t> cuda_graphs_;
  bool end_capture_ = false;
  std::vector<flame_comm_t> comms_;
  std::vector<flame_dp_t> dps_;
  std::vector<flame_zero_t> zeros_;
  std::vector<flame_fused_t> fused_;
  std::vector<flame_scope_t> scopes_;
  flame_scope_t row_scope_ = nullptr;
  std::vector<flame_params_t> params_;
  std::vector<flame_model_t> models_;
  std::string tmp_dir_;
  bool st_written_ = false;
  struct DLManagedTensor* dl_in_ = nullptr;
  struct DLManagedTensorVersioned* dlv_in_ = nullptr;
  bool finished_ = false;
};

// ---- hook callbacks the rows register (they do nothing) ----
inline flame_status_t noop_hook(void*, flame_tensor_t, flame_tensor_t* replacement) {
  *replacement = nullptr;
  return FLAME_OK;
}
inline flame_status_t noop_post_hook(void*, flame_tensor_t) { return FLAME_OK; }

inline flame_tensor_t Args::live_tensor(flame_ctx_t c, const Spec& s) {
  if (s.role == Spec::Loss) return graph(c).loss;
  if (s.role == Spec::LossLeaf) return graph(c).leaf;
  flame_tensor_t t = nullptr;
  if (flame_full(c, s.shape.data(), static_cast<int32_t>(s.shape.size()), s.dtype, 1.0, &t) != FLAME_OK) return nullptr;
  owned_.push_back(t);
  if (s.role == Spec::GradLeaf || s.role == Spec::Param) flame_tensor_set_requires_grad(t, 1);
  if (s.role == Spec::Param) {
    flame_tensor_t g = nullptr;
    if (flame_full(c, s.shape.data(), static_cast<int32_t>(s.shape.size()), s.dtype, 1.0, &g) != FLAME_OK) return t;
    owned_.push_back(g);
    flame_tensor_set_grad(t, g);
  }
  return t;
}

inline Args::Graph& Args::graph(flame_ctx_t c) {
  for (auto& g : graphs_)
    if (g.first == c) return g.second;
  Graph g;
  const int64_t shape[] = {2, 3};
  flame_tensor_t sq = nullptr;
  if (flame_full(c, shape, 2, FLAME_DTYPE_F32, 1.5, &g.leaf) == FLAME_OK) {
    owned_.push_back(g.leaf);
    flame_tensor_set_requires_grad(g.leaf, 1);
    if (flame_mul(g.leaf, g.leaf, &sq) == FLAME_OK) {
      owned_.push_back(sq);
      if (flame_sum_all(sq, &g.loss) == FLAME_OK) owned_.push_back(g.loss);
    }
  }
  graphs_.emplace_back(c, g);
  return graphs_.back().second;
}

inline flame_hook_t Args::release_hook(const char* name) {
  nullable(name);
  if (null_now() || mode_ != Mode::Live) return nullptr;  // hooks are not validated: never garbage
  flame_tensor_t t = live_tensor(ctx_, grad_leaf());
  flame_hook_t h = nullptr;
  flame_tensor_register_hook(t, noop_hook, nullptr, nullptr, &h);
  return h;
}

inline void Args::finish(flame_status_t status) {
  if (finished_) return;
  finished_ = true;
  for (const OutSlot& o : outs_) {
    void* v = *o.slot;
    if (!v || v == reinterpret_cast<void*>(static_cast<uintptr_t>(0x40))) continue;
    switch (o.kind) {
      case OutKind::Tensor: flame_tensor_release(static_cast<flame_tensor_t>(v)); break;
      case OutKind::Ctx: flame_ctx_destroy(static_cast<flame_ctx_t>(v)); break;
      case OutKind::Hook: flame_hook_remove(static_cast<flame_hook_t>(v)); break;
      case OutKind::Dl: if (dl_ && dl_->free_dl) dl_->free_dl(static_cast<struct DLManagedTensor*>(v)); break;
      case OutKind::Dlv: if (dl_ && dl_->free_dlv) dl_->free_dlv(static_cast<struct DLManagedTensorVersioned*>(v)); break;
      case OutKind::Opt: flame_optimizer_release(static_cast<flame_optimizer_t>(v)); break;
      case OutKind::St: flame_safetensors_release(static_cast<flame_safetensors_t>(v)); break;
      case OutKind::Scaler: flame_grad_scaler_release(static_cast<flame_grad_scaler_t>(v)); break;
      case OutKind::Lora: flame_lora_release(static_cast<flame_lora_t>(v)); break;
      case OutKind::Graph: flame_graph_release(static_cast<flame_graph_t>(v)); break;
      case OutKind::Comm: flame_comm_release(static_cast<flame_comm_t>(v)); break;
      case OutKind::Dp: flame_dp_release(static_cast<flame_dp_t>(v)); break;
      case OutKind::Zero: flame_zero_release(static_cast<flame_zero_t>(v)); break;
      case OutKind::Fused: flame_fused_release(static_cast<flame_fused_t>(v)); break;
      case OutKind::Scope: flame_scope_end(static_cast<flame_scope_t>(v)); break;
      case OutKind::Params: flame_params_release(static_cast<flame_params_t>(v)); break;
      case OutKind::Model: flame_model_release(static_cast<flame_model_t>(v)); break;
      case OutKind::None: break;
    }
  }
  for (auto& arr : out_arrays_)
    for (flame_tensor_t t : *arr) flame_tensor_release(t);
  // DLPack inputs: FLAME took them over only when the call succeeded.
  if (status != FLAME_OK) {
    if (dl_in_ && dl_ && dl_->free_dl) dl_->free_dl(dl_in_);
    if (dlv_in_ && dl_ && dl_->free_dlv) dl_->free_dlv(dlv_in_);
  }
  if (status == FLAME_OK)
    for (flame_tensor_t t : release_on_ok_) flame_tensor_release(t);
  for (flame_optimizer_t o : opts_) flame_optimizer_release(o);
  opts_.clear();
  for (flame_safetensors_t f : files_) flame_safetensors_release(f);
  files_.clear();
  for (flame_grad_scaler_t g : scalers_) flame_grad_scaler_release(g);
  scalers_.clear();
  for (flame_lora_t l : loras_) flame_lora_release(l);
  loras_.clear();
  for (flame_graph_t g : cuda_graphs_) flame_graph_release(g);
  cuda_graphs_.clear();
  if (end_capture_) {  // a capture a row began or left open: end it and drop the graph
    for (flame_ctx_t c : {ctx_, ctx2_}) {
      flame_graph_t g = nullptr;
      if (c && flame_graph_capture_end(c, &g) == FLAME_OK) flame_graph_release(g);
    }
    end_capture_ = false;
  }
  for (flame_dp_t d : dps_) flame_dp_release(d);  // before the communicators they hold
  dps_.clear();
  for (flame_zero_t z : zeros_) flame_zero_release(z);
  zeros_.clear();
  for (flame_comm_t c : comms_) flame_comm_release(c);
  comms_.clear();
  for (flame_fused_t f : fused_) flame_fused_release(f);
  fused_.clear();
  for (flame_params_t p : params_) flame_params_release(p);
  params_.clear();
  for (flame_model_t m : models_) flame_model_release(m);
  models_.clear();
  for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) flame_tensor_release(*it);
  owned_.clear();
  for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) flame_scope_end(*it);  // innermost first
  scopes_.clear();
  row_scope_ = nullptr;
  remove_tmp_dir();
}

// ---- the registry ----
struct Row {
  std::string name;
  Kind kind;
  std::function<flame_status_t(Args&)> call;
  const char* file;
  int line;
};
inline std::vector<Row>& registry() {
  static std::vector<Row> rows;
  return rows;
}
inline bool add_row(const char* name, Kind kind, std::function<flame_status_t(Args&)> call, const char* file, int line) {
  registry().push_back(Row{name, kind, std::move(call), file, line});
  return true;
}

}  // namespace argm

#define FLAME_ARG_CAT2(a, b) a##b
#define FLAME_ARG_CAT(a, b) FLAME_ARG_CAT2(a, b)
// A function returning flame_status_t; the arguments use `a` (an argm::Args&).
#define FLAME_ARG_ROW(fn, ...)                                                                          \
  static const bool FLAME_ARG_CAT(flame_arg_row_, __LINE__) = ::argm::add_row(                        \
      #fn, ::argm::Kind::Status, [](::argm::Args& a) -> flame_status_t { return fn(__VA_ARGS__); }, \
      __FILE__, __LINE__)
// A void function that accepts NULL (release-like).
#define FLAME_ARG_VOID(fn, ...)                                                                  \
  static const bool FLAME_ARG_CAT(flame_arg_row_, __LINE__) = ::argm::add_row(                 \
      #fn, ::argm::Kind::Void, [](::argm::Args& a) -> flame_status_t { fn(__VA_ARGS__); return FLAME_OK; }, \
      __FILE__, __LINE__)
// A function without pointer arguments: `check` (an expression calling it) must hold.
#define FLAME_ARG_PURE(fn, check)                                                                        \
  static const bool FLAME_ARG_CAT(flame_arg_row_, __LINE__) = ::argm::add_row(                         \
      #fn, ::argm::Kind::Pure,                                                                          \
      [](::argm::Args& a) -> flame_status_t { (void)a; return (check) ? FLAME_OK : FLAME_ERROR_INTERNAL; }, \
      __FILE__, __LINE__)

// ---- rejection rows (issue 32): calls with live tensors and values that must be refused ----
//
// A rejection row makes its inputs through an argm::Inputs (live tensors on the driver's context,
// released after the row) and makes one call that must fail with `status`, a message containing
// `word`, its OUT tensor NULL and no tensor left behind. The GPU driver (tests/gpu/
// test_arg_matrix_gpu.cpp, ArgMatrixGpu.RejectionRows) runs them; without a GPU no input can be made.
//
//   FLAME_ARG_REJECT("expand: [1] to [2^40, 2^40]", FLAME_ERROR_INVALID_ARGUMENT, "elements",
//                    return flame_expand(in.full({1}), in.shape({1LL << 40, 1LL << 40}), 2, out);)
//
// Rows live in tests/common/arg_rows/<topic>_reject.cpp (overflow_reject.cpp: overflowing sizes).
namespace argm {

class Inputs {
 public:
  explicit Inputs(flame_ctx_t ctx) : ctx_(ctx) {}
  Inputs(const Inputs&) = delete;
  Inputs& operator=(const Inputs&) = delete;
  ~Inputs() {
    for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) flame_tensor_release(*it);
  }
  flame_ctx_t ctx() const { return ctx_; }
  // Whether every input was made; a row whose inputs failed is a broken row, not a rejection.
  bool ok() const { return ok_; }
  const std::string& setup_error() const { return setup_error_; }

  // A tensor of `shape` filled with `value`.
  flame_tensor_t full(std::vector<int64_t> shape, flame_dtype_t d = FLAME_DTYPE_F32, double value = 1.0) {
    flame_tensor_t t = nullptr;
    note(flame_full(ctx_, shape.data(), static_cast<int32_t>(shape.size()), d, value, &t), "flame_full");
    return keep(t);
  }
  // A legal broadcast view of full(small) as `shape` (the sizes may exceed any allocation).
  flame_tensor_t broadcast(std::vector<int64_t> small, std::vector<int64_t> shape, flame_dtype_t d = FLAME_DTYPE_F32) {
    flame_tensor_t base = full(std::move(small), d), t = nullptr;
    if (!base) return nullptr;
    note(flame_expand(base, shape.data(), static_cast<int32_t>(shape.size()), &t), "flame_expand (setup)");
    return keep(t);
  }
  // A stable int64 array (shapes, repeat counts, pads) for the call.
  const int64_t* shape(std::vector<int64_t> v) {
    arrays_.push_back(std::make_shared<std::vector<int64_t>>(std::move(v)));
    return arrays_.back()->data();
  }
  // A stable array of tensor handles (cat, stack).
  const flame_tensor_t* list(std::vector<flame_tensor_t> v) {
    lists_.push_back(std::make_shared<std::vector<flame_tensor_t>>(std::move(v)));
    return lists_.back()->data();
  }

 private:
  void note(flame_status_t st, const char* what) {
    if (st == FLAME_OK || !ok_) return;
    ok_ = false;
    setup_error_ = std::string(what) + ": " + flame_last_error_message();
  }
  flame_tensor_t keep(flame_tensor_t t) {
    if (t) owned_.push_back(t);
    return t;
  }
  flame_ctx_t ctx_;
  bool ok_ = true;
  std::string setup_error_;
  std::vector<flame_tensor_t> owned_;
  std::vector<std::shared_ptr<std::vector<int64_t>>> arrays_;
  std::vector<std::shared_ptr<std::vector<flame_tensor_t>>> lists_;
};

struct RejectRow {
  std::string what;
  flame_status_t status;
  const char* word;  // the message must contain it
  std::function<flame_status_t(Inputs&, flame_tensor_t*)> call;
  const char* file;
  int line;
};
inline std::vector<RejectRow>& reject_registry() {
  static std::vector<RejectRow> rows;
  return rows;
}
inline bool add_reject(const char* what, flame_status_t status, const char* word,
                       std::function<flame_status_t(Inputs&, flame_tensor_t*)> call, const char* file, int line) {
  reject_registry().push_back(RejectRow{what, status, word, std::move(call), file, line});
  return true;
}

}  // namespace argm

// A rejection row: the body uses `in` (an argm::Inputs&) and `out` (a flame_tensor_t*) and returns
// the call's status.
#define FLAME_ARG_REJECT(what, status, word, ...)                                                               \
  static const bool FLAME_ARG_CAT(flame_reject_row_, __LINE__) = ::argm::add_reject(                          \
      what, status, word, [](::argm::Inputs& in, flame_tensor_t* out) -> flame_status_t { __VA_ARGS__ }, __FILE__, \
      __LINE__)

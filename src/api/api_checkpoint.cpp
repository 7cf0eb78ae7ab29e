// C entry point of gradient checkpointing (toolkit/checkpoint.h): the user's C callback adapted to
// the toolkit's C++ CheckpointFunction. The adapter lends the callback handles of its inputs,
// collects the handles it returns, and owns user_data (destroy runs exactly once, when the last
// copy of the adapter goes: with the recorded node, or before flame_checkpoint returns).
#include <string>
#include "api/guard.h"
#include "api/toolkit_args.h"
#include "toolkit/checkpoint.h"

using namespace flame;

namespace {

// The user's callback and its data; destroy(user_data) runs in the destructor.
struct CCheckpointCallback {
  flame_checkpoint_fn fn = nullptr;
  void* user_data = nullptr;
  flame_destroy_fn destroy = nullptr;
  int32_t n_outputs = 0;
  CCheckpointCallback(flame_checkpoint_fn f, void* u, flame_destroy_fn d, int32_t n)
      : fn(f), user_data(u), destroy(d), n_outputs(n) {}
  CCheckpointCallback(const CCheckpointCallback&) = delete;
  CCheckpointCallback& operator=(const CCheckpointCallback&) = delete;
  ~CCheckpointCallback() {
    if (destroy) destroy(user_data);
  }
};

// Handles lent to the callback and slots for what it returns, released on every path.
struct LentHandles {
  std::vector<flame_tensor_t> in, out;
  ~LentHandles() {
    for (flame_tensor_t h : in) release_handle(h);
    for (flame_tensor_t h : out) release_handle(h);
  }
};

// One call of the callback; failures throw flame::Error (checkpoint() names the phase).
std::vector<Tensor> call_c_checkpoint(const CCheckpointCallback& f, const std::vector<Tensor>& inputs) {
  LentHandles h;
  for (const Tensor& t : inputs) h.in.push_back(wrap_lent(t));
  h.out.assign(static_cast<size_t>(f.n_outputs), nullptr);
  clear_last_error();
  flame_status_t st = FLAME_ERROR_INTERNAL;
  try {
    st = f.fn(f.user_data, h.in.data(), static_cast<int32_t>(h.in.size()), h.out.data(), f.n_outputs);
  } catch (...) {  // a C++ callback that threw: the exception must not cross the ABI
    fail(FLAME_ERROR_INVALID_ARGUMENT, "it threw an exception");
  }
  if (st != FLAME_OK) {
    std::string msg = last_error();
    fail(st, msg.empty() ? "(it gave no message)" : msg);
  }
  std::vector<Tensor> outs;
  for (int32_t i = 0; i < f.n_outputs; ++i) {
    flame_tensor_t o = h.out[static_cast<size_t>(i)];
    FLAME_CHECK(o, FLAME_ERROR_INVALID_ARGUMENT, "it left outputs[", i, "] NULL");
    try {
      outs.push_back(unwrap(o, "output"));
    } catch (const Error&) {
      h.out[static_cast<size_t>(i)] = nullptr;  // not ours to release
      fail(FLAME_ERROR_INVALID_HANDLE, "it returned an invalid handle in outputs[", i, "]");
    }
  }
  return outs;
}

}  // namespace

extern "C" {

FLAME_API flame_status_t flame_checkpoint(flame_ctx_t ctx, flame_checkpoint_fn fn, void* user_data, flame_destroy_fn destroy,
                                          const flame_tensor_t* inputs, int32_t n_inputs, flame_tensor_t* outputs,
                                          int32_t n_outputs) {
  if (outputs && n_outputs > 0 && n_outputs <= 65536)
    for (int32_t i = 0; i < n_outputs; ++i) outputs[i] = nullptr;
  return api_call("flame_checkpoint", [&] {
    // Owns user_data from here on: destroy runs exactly once, whatever happens below.
    auto cb = std::make_shared<CCheckpointCallback>(fn, user_data, destroy, n_outputs);
    Context& c = context_of(ctx);
    FLAME_CHECK(fn, FLAME_ERROR_INVALID_ARGUMENT, "fn is NULL");
    FLAME_CHECK(outputs, FLAME_ERROR_INVALID_ARGUMENT, "outputs is NULL");
    FLAME_CHECK(n_outputs >= 1 && n_outputs <= 65536, FLAME_ERROR_INVALID_ARGUMENT, "n_outputs ", n_outputs,
                " is not in [1, 65536]");
    std::vector<Tensor> ins = tensor_list(inputs, n_inputs, "inputs");
    for (size_t i = 0; i < ins.size(); ++i)
      FLAME_CHECK(&ins[i]->ctx() == &c, FLAME_ERROR_INVALID_ARGUMENT, "inputs[", i, "] belongs to another context");
    LiveScope scope(c);
    CheckpointFunction adapted = [cb](const std::vector<Tensor>& in) { return call_c_checkpoint(*cb, in); };
    cb.reset();  // the adapter is the callback's only owner now
    std::vector<Tensor> outs = checkpoint(c, std::move(adapted), ins);
    std::vector<flame_tensor_t> hs;
    try {
      for (const Tensor& t : outs) hs.push_back(wrap(t));
    } catch (...) {
      for (flame_tensor_t h : hs) release_handle(h);
      throw;
    }
    for (size_t i = 0; i < hs.size(); ++i) outputs[i] = hs[i];
  });
}

}  // extern "C"

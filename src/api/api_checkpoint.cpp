// C entry point of gradient checkpointing (toolkit/checkpoint.h).
#include "api/guard.h"
#include "api/toolkit_args.h"
#include "toolkit/checkpoint.h"

using namespace flame;

extern "C" {

FLAME_API flame_status_t flame_checkpoint(flame_ctx_t ctx, flame_checkpoint_fn fn, void* user_data, flame_destroy_fn destroy,
                                          const flame_tensor_t* inputs, int32_t n_inputs, flame_tensor_t* outputs,
                                          int32_t n_outputs) {
  if (outputs && n_outputs > 0 && n_outputs <= 65536)
    for (int32_t i = 0; i < n_outputs; ++i) outputs[i] = nullptr;
  return api_call("flame_checkpoint", [&] {
    // Owns user_data from here on: destroy runs exactly once, whatever happens below.
    auto f = std::make_shared<CheckpointFn>(fn, user_data, destroy);
    Context& c = context_of(ctx);
    FLAME_CHECK(fn, FLAME_ERROR_INVALID_ARGUMENT, "fn is NULL");
    FLAME_CHECK(outputs, FLAME_ERROR_INVALID_ARGUMENT, "outputs is NULL");
    FLAME_CHECK(n_outputs >= 1 && n_outputs <= 65536, FLAME_ERROR_INVALID_ARGUMENT, "n_outputs ", n_outputs,
                " is not in [1, 65536]");
    std::vector<Tensor> ins = tensor_list(inputs, n_inputs, "inputs");
    for (size_t i = 0; i < ins.size(); ++i)
      FLAME_CHECK(&ins[i]->ctx() == &c, FLAME_ERROR_INVALID_ARGUMENT, "inputs[", i, "] belongs to another context");
    LiveScope scope(c);
    std::vector<Tensor> outs = checkpoint(c, f, ins, n_outputs);
    f.reset();
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

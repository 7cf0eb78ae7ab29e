// Gradient checkpointing (as torch.utils.checkpoint): the user's function runs in no-grad mode, so
// none of its intermediates is kept; one Checkpoint node records the call (its inputs saved, one
// output per tensor the function returned, the context's RNG state at the call). Its backward
// (checkpoint_backward, called by the rule in autograd/backward_rules.cpp) re-runs the function
// with grad mode on, on detached copies of the inputs and with the RNG state replayed (so dropout
// masks match), then walks the rebuilt graph with the one engine:
//   - in a flame_backward walk, the nested walk accumulates into .grad like the outer one, so that
//     parameters the function reaches through user_data (not passed as inputs) get their
//     gradients; the detached inputs' gradients are handed on to the outer walk;
//   - in a flame_grad walk, the nested walk returns the inputs' gradients; a tensor that requires
//     grad inside the function without being an input fails (FLAME_ERROR_UNSUPPORTED): flame_grad
//     could not return its gradient;
//   - higher-order gradients through a checkpoint (create_graph) fail with FLAME_ERROR_UNSUPPORTED.
// Errors the function returns propagate with its status and message, in forward and in backward.
#pragma once
#include <memory>
#include <vector>
#include "tensor/autograd_graph.h"
#include "flame.h"

namespace flame {

// The user's function; destroy(user_data) runs exactly once, when the last owner lets go (the
// recorded node when it is freed, else the entry point before it returns, also on failure).
struct CheckpointFn {
  flame_checkpoint_fn fn = nullptr;
  void* user_data = nullptr;
  flame_destroy_fn destroy = nullptr;
  CheckpointFn(flame_checkpoint_fn f, void* u, flame_destroy_fn d) : fn(f), user_data(u), destroy(d) {}
  CheckpointFn(const CheckpointFn&) = delete;
  CheckpointFn& operator=(const CheckpointFn&) = delete;
  ~CheckpointFn() {
    if (destroy) destroy(user_data);
  }
};

// Runs the function on inputs (of ctx) and returns its n_outputs (>= 1) outputs; when grad mode is
// on, records a Checkpoint node that owns fn (the outputs then require grad, so that parameters
// reached through user_data get gradients even when no input requires grad).
std::vector<Tensor> checkpoint(Context& ctx, const std::shared_ptr<CheckpointFn>& fn, const std::vector<Tensor>& inputs,
                               int32_t n_outputs);

// The backward of a Checkpoint node: one gradient per output (null or missing where none arrived).
std::vector<Tensor> checkpoint_backward(Node& n, const std::vector<Tensor>& grads);

}  // namespace flame

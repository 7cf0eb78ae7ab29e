// Gradient checkpointing (as torch.utils.checkpoint): a function of tensors runs in no-grad mode, so
// none of its intermediates is kept; one Checkpoint node records the call (its inputs saved, one
// output per tensor the function returned, the context's RNG state at the call) and carries its
// backward (Node::backward). The backward re-runs the function with grad mode on, on detached
// copies of the inputs and with the RNG state replayed (so dropout masks match), then walks the
// rebuilt graph with the one engine:
//   - in a flame_backward walk, the nested walk accumulates into .grad like the outer one, so that
//     parameters the function reaches without taking them as inputs (captured by a lambda, or
//     through a C callback's user_data) get their gradients; the detached inputs' gradients are
//     handed on to the outer walk;
//   - in a flame_grad walk, the nested walk returns the inputs' gradients; a tensor that requires
//     grad inside the function without being an input fails (FLAME_ERROR_UNSUPPORTED): flame_grad
//     could not return its gradient;
//   - higher-order gradients through a checkpoint (create_graph) fail with FLAME_ERROR_UNSUPPORTED.
// The function is C++ (the model layer checkpoints transformer blocks with lambdas); the C entry
// point flame_checkpoint adapts the user's C callback to it (api/api_checkpoint.cpp).
#pragma once
#include <functional>
#include <vector>
#include "tensor/autograd_graph.h"

namespace flame {

// A function to checkpoint: its inputs (tensors of one context) -> its outputs (at least one,
// tensors of that context, none null). It is called twice: once by checkpoint() with grad mode off,
// and again by the backward with grad mode on, on detached copies of the inputs, with the RNG
// state of the first call replayed; both calls must return the same number of outputs with the
// same shapes and dtypes. It reports failure by throwing flame::Error (the status and message then
// propagate, prefixed with the phase: "the checkpoint function failed in forward: ..."); any other
// exception except std::bad_alloc becomes FLAME_ERROR_INVALID_ARGUMENT. What it captures lives as
// long as the recorded node (or until checkpoint() returns, when nothing is recorded) and is
// destroyed with it; it is called on the thread running the forward or the backward, with the
// context's lock held. Example (the model layer):
//   std::vector<Tensor> y = checkpoint(ctx, [&block](const std::vector<Tensor>& in) {
//     return std::vector<Tensor>{block.forward(in[0])};
//   }, {x});
// (capture by reference only what outlives the backward; capture by value otherwise).
using CheckpointFunction = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)>;

// Runs fn on inputs (of ctx) and returns its outputs as fresh tensors. When grad mode is on and an
// output is floating, records a Checkpoint node that owns fn: the floating outputs then require
// grad (even when no input does, so that parameters fn reaches by capture get gradients).
std::vector<Tensor> checkpoint(Context& ctx, CheckpointFunction fn, const std::vector<Tensor>& inputs);

}  // namespace flame

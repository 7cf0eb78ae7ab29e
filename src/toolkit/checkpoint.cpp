// Gradient checkpointing (see checkpoint.h): calling the function, the recorded node, and its
// backward (re-run with the RNG replayed, then a nested walk of the engine).
#include "toolkit/checkpoint.h"
#include <new>
#include "autograd/engine.h"
#include "core/error.h"

namespace flame {

namespace {

// What a Checkpoint node's backward keeps besides the node's saved inputs.
struct CheckpointState {
  CheckpointFunction fn;
  uint64_t seed = 0, offset = 0;     // the context's RNG state when the function first ran
  std::vector<TensorInfo> outputs;   // the geometry of its outputs
};

// The RNG state set to (seed, offset) for a scope, restored after.
class RngReplay {
 public:
  RngReplay(Context& c, uint64_t seed, uint64_t offset) : c_(c), seed_(c.rng_seed), offset_(c.rng_offset) {
    c.rng_seed = seed;
    c.rng_offset = offset;
  }
  ~RngReplay() {
    c_.rng_seed = seed_;
    c_.rng_offset = offset_;
  }

 private:
  Context& c_;
  uint64_t seed_, offset_;
};

// Calls the function and checks what it returned (phase names the call in messages). detach: return
// fresh views without history (forward), else the tensors as they are (backward, where their
// history is the rebuilt graph).
std::vector<Tensor> call(Context& ctx, const CheckpointFunction& fn, const std::vector<Tensor>& inputs,
                         const char* phase, bool detach) {
  std::vector<Tensor> outs;
  try {
    outs = fn(inputs);
  } catch (const Error& e) {
    fail(e.status(), "the checkpoint function failed in ", phase, ": ", e.what());
  } catch (const std::bad_alloc&) {
    throw;
  } catch (...) {
    fail(FLAME_ERROR_INVALID_ARGUMENT, "the checkpoint function threw an exception in ", phase);
  }
  FLAME_CHECK(!outs.empty(), FLAME_ERROR_INVALID_ARGUMENT, "the checkpoint function returned no outputs in ", phase);
  for (size_t i = 0; i < outs.size(); ++i) {
    FLAME_CHECK(outs[i], FLAME_ERROR_INVALID_ARGUMENT, "the checkpoint function returned outputs[", i, "] null in ", phase);
    FLAME_CHECK(&outs[i]->ctx() == &ctx, FLAME_ERROR_INVALID_ARGUMENT, "the checkpoint function returned outputs[", i,
                "] of another context in ", phase);
    if (detach) outs[i] = alias(outs[i]);  // forward: fresh views, whose autograd state is the node's alone
  }
  return outs;
}

// The backward of a Checkpoint node: one gradient per output (null or missing where none arrived).
std::vector<Tensor> checkpoint_backward(Node& n, const CheckpointState& st, const std::vector<Tensor>& grads);

}  // namespace

std::vector<Tensor> checkpoint(Context& ctx, CheckpointFunction fn, const std::vector<Tensor>& inputs) {
  FLAME_CHECK(fn, FLAME_ERROR_INVALID_ARGUMENT, "the checkpoint function is empty");
  for (size_t i = 0; i < inputs.size(); ++i) {
    FLAME_CHECK(inputs[i], FLAME_ERROR_INVALID_ARGUMENT, "checkpoint: inputs[", i, "] is null");
    FLAME_CHECK(&inputs[i]->ctx() == &ctx, FLAME_ERROR_INVALID_ARGUMENT, "checkpoint: inputs[", i,
                "] belongs to another context");
  }
  auto state = std::make_shared<CheckpointState>();
  state->fn = std::move(fn);
  state->seed = ctx.rng_seed;
  state->offset = ctx.rng_offset;
  const bool record = ctx.recording();
  std::vector<Tensor> outs;
  {
    GradModeGuard no_grad(ctx, ctx.mode.with_grad(false));
    outs = call(ctx, state->fn, inputs, "forward", true);
  }
  if (!record) return outs;
  bool any_float = false;
  for (const Tensor& o : outs) any_float = any_float || is_floating(o->dtype);
  if (!any_float) return outs;
  auto node = std::make_shared<Node>();
  node->op = OpId::Checkpoint;
  node->num_outputs = static_cast<uint32_t>(outs.size());
  for (const Tensor& t : inputs) {
    node->next.push_back(gradient_edge(t));
    node->inputs.push_back({t->shape, t->dtype});
    node->saved.emplace_back(t, false);
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    state->outputs.push_back({outs[i]->shape, outs[i]->dtype});
    if (!is_floating(outs[i]->dtype)) continue;
    auto& m = autograd_meta(*outs[i]);
    m.requires_grad = true;
    m.grad_fn = node;
    m.output_nr = static_cast<uint32_t>(i);
  }
  node->backward = [state](Node& self, const std::vector<Tensor>& grads) {
    return checkpoint_backward(self, *state, grads);
  };
  return outs;
}

namespace {

std::vector<Tensor> checkpoint_backward(Node& n, const CheckpointState& st, const std::vector<Tensor>& grads) {
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < n.saved.size(); ++i) inputs.push_back(n.saved[i].unpack(n));
  Context* cp = nullptr;
  for (const Tensor& g : grads)
    if (g && !cp) cp = &g->ctx();
  FLAME_CHECK(cp, FLAME_ERROR_INTERNAL, "checkpoint backward without gradients");
  Context& ctx = *cp;
  FLAME_CHECK(!ctx.mode.grad_enabled, FLAME_ERROR_UNSUPPORTED,
              "higher-order gradients (create_graph) through a checkpoint are not supported");
  const bool accumulate = ctx.mode.backward_accumulates;

  // Detached copies of the inputs, leaves that require grad where the outer graph wants a gradient.
  std::vector<Tensor> det;
  std::vector<Tensor> wanted;
  for (size_t i = 0; i < inputs.size(); ++i) {
    det.push_back(alias(inputs[i]));
    if (n.needs_input_grad(i)) {
      autograd_meta(*det[i]).requires_grad = true;
      wanted.push_back(det[i]);
    }
  }
  std::vector<Tensor> outs;
  {
    RngReplay replay(ctx, st.seed, st.offset);  // the same random numbers as the first run
    GradModeGuard grad_on(ctx, ctx.mode.with_grad(true));
    outs = call(ctx, st.fn, det, "backward", false);
  }
  FLAME_CHECK(outs.size() == st.outputs.size(), FLAME_ERROR_INVALID_ARGUMENT, "the checkpoint function returned ",
              outs.size(), " outputs in backward but ", st.outputs.size(),
              " in forward (it must compute the same thing both times)");
  BackwardRequest req;
  for (size_t i = 0; i < outs.size(); ++i) {
    FLAME_CHECK(outs[i]->shape == st.outputs[i].shape && outs[i]->dtype == st.outputs[i].dtype, FLAME_ERROR_INVALID_ARGUMENT,
                "the checkpoint function returned outputs[", i, "] as ", shape_str(outs[i]->shape), " ",
                dtype_name(outs[i]->dtype), " in backward but ", shape_str(st.outputs[i].shape), " ",
                dtype_name(st.outputs[i].dtype), " in forward (it must compute the same thing both times)");
    if (i < grads.size() && grads[i] && requires_grad(*outs[i])) {
      req.roots.push_back(outs[i]);
      req.root_grads.push_back(grads[i]);
    }
  }
  std::vector<Tensor> result(inputs.size());
  if (req.roots.empty()) return result;  // nothing inside depends on what requires grad
  if (accumulate) {
    run_backward(ctx, req);  // .grad of every leaf reached, the detached inputs among them
    for (size_t i = 0; i < det.size(); ++i)
      if (n.needs_input_grad(i) && det[i]->autograd) result[i] = det[i]->autograd->grad;
    return result;
  }
  if (wanted.empty()) return result;
  req.inputs = wanted;
  req.allow_unused = true;
  req.other_leaves_error =
      "flame_grad through a checkpoint: a tensor used inside the checkpoint function requires grad but is not one of "
      "its inputs, so its gradient cannot be returned (pass it as an input of flame_checkpoint, or use flame_backward)";
  std::vector<Tensor> gs = run_backward(ctx, req);
  size_t k = 0;
  for (size_t i = 0; i < det.size(); ++i)
    if (n.needs_input_grad(i)) result[i] = gs[k++];
  return result;
}

}  // namespace

}  // namespace flame

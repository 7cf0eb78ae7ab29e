// Gradient checkpointing (see checkpoint.h): calling the user's function through the C ABI, the
// recorded node, and its backward (re-run with the RNG replayed, then a nested walk of the engine).
#include "toolkit/checkpoint.h"
#include <string>
#include "autograd/engine.h"
#include "core/error.h"

namespace flame {

namespace {

// What a Checkpoint node keeps besides its saved inputs.
struct CheckpointState {
  std::shared_ptr<CheckpointFn> fn;
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

// Handles lent to the function and slots for what it returns, released on every path.
struct Handles {
  std::vector<flame_tensor_t> in, out;
  ~Handles() {
    for (flame_tensor_t h : in) release_handle(h);
    for (flame_tensor_t h : out) release_handle(h);
  }
};

// Calls the function; its outputs come back as tensors of ctx (phase names the call in messages).
// detach: return fresh views without history (forward), else the tensors as they are (backward,
// where their history is the rebuilt graph).
std::vector<Tensor> call(Context& ctx, const CheckpointFn& f, const std::vector<Tensor>& inputs, int32_t n_outputs,
                         const char* phase, bool detach) {
  Handles h;
  for (const Tensor& t : inputs) h.in.push_back(wrap_lent(t));
  h.out.assign(static_cast<size_t>(n_outputs), nullptr);
  clear_last_error();
  flame_status_t st = FLAME_ERROR_INTERNAL;
  try {
    st = f.fn(f.user_data, h.in.data(), static_cast<int32_t>(h.in.size()), h.out.data(), n_outputs);
  } catch (...) {  // a C++ callback that threw: the exception must not cross the ABI
    fail(FLAME_ERROR_INVALID_ARGUMENT, "the checkpoint function threw an exception in ", phase);
  }
  if (st != FLAME_OK) {
    std::string msg = last_error();
    fail(st, "the checkpoint function failed in ", phase, ": ", msg.empty() ? "(it gave no message)" : msg);
  }
  std::vector<Tensor> outs;
  for (int32_t i = 0; i < n_outputs; ++i) {
    flame_tensor_t o = h.out[static_cast<size_t>(i)];
    FLAME_CHECK(o, FLAME_ERROR_INVALID_ARGUMENT, "the checkpoint function left outputs[", i, "] NULL in ", phase);
    Tensor t;
    try {
      t = unwrap(o, "output");
    } catch (const Error&) {
      h.out[static_cast<size_t>(i)] = nullptr;  // not ours to release
      fail(FLAME_ERROR_INVALID_HANDLE, "the checkpoint function returned an invalid handle in outputs[", i, "] in ", phase);
    }
    FLAME_CHECK(&t->ctx() == &ctx, FLAME_ERROR_INVALID_ARGUMENT, "the checkpoint function returned outputs[", i,
                "] of another context in ", phase);
    outs.push_back(detach ? alias(t) : t);  // forward: fresh views, whose autograd state is the node's alone
  }
  return outs;
}

}  // namespace

std::vector<Tensor> checkpoint(Context& ctx, const std::shared_ptr<CheckpointFn>& fn, const std::vector<Tensor>& inputs,
                               int32_t n_outputs) {
  auto state = std::make_shared<CheckpointState>();
  state->fn = fn;
  state->seed = ctx.rng_seed;
  state->offset = ctx.rng_offset;
  const bool record = ctx.recording();
  std::vector<Tensor> outs;
  {
    GradModeGuard no_grad(ctx, ctx.mode.with_grad(false));
    outs = call(ctx, *fn, inputs, n_outputs, "forward", true);
  }
  if (!record) return outs;
  bool any_float = false;
  for (const Tensor& o : outs) any_float = any_float || is_floating(o->dtype);
  if (!any_float) return outs;
  auto node = std::make_shared<Node>();
  node->op = OpId::Checkpoint;
  node->num_outputs = static_cast<uint32_t>(n_outputs);
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
  node->payload = state;
  return outs;
}

std::vector<Tensor> checkpoint_backward(Node& n, const std::vector<Tensor>& grads) {
  const auto& st = *static_cast<const CheckpointState*>(n.payload.get());
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
    outs = call(ctx, *st.fn, det, static_cast<int32_t>(st.outputs.size()), "backward", false);
  }
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

}  // namespace flame

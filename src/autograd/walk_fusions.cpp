// The backward walk's cross-node fusions, behind one call (fused_backward) from the engine.
//
// - Linear activation: when a Linear's input was produced by a Linear with an activation (through
//   reshapes only) and nothing else observes the gradient in between (one incoming edge each, no
//   hooks, retain_grad or flame_grad capture), the consumer's dgrad GEMM applies the producer's
//   activation derivative in its epilogue and hands the producer its pre-activation gradient
//   (backward_rules.cpp, linear_backward).
// - Autocast casts: a Linear whose f16/bf16 inputs autocast cast from f32 tensors (through reshapes
//   only, nothing observing in between) has its GEMMs write those inputs' gradients in f32, and the
//   casts pass them on instead of running a kernel each (GPT-2 in bf16: ~100 casts per step).
// - Slices: a slice's gradient is added in place into that slice of its input's pending gradient
//   when the walk alone holds that buffer, so q, k and v split from one qkv tensor cost one
//   zero-filled buffer instead of three, and no full-size additions.
// None applies while higher-order gradients are recorded (create_graph).
#include <array>
#include "autograd/walk.h"
#include "core/error.h"
#include "ops/launch.h"
#include "ops/ops.h"

namespace flame {

std::vector<Tensor> linear_backward(Node& n, const Tensor& g, bool pre, Node* p, Tensor* p_dz,
                                    const std::array<bool, 3>& wide);  // backward_rules.cpp

namespace {

// Whether nothing but c's one incoming edge can see the gradient that reaches c.
bool unobserved(WalkState& w, Node* c) {
  return w.deps[c] == 1 && !w.buffer.count(c) && c->hooks.empty() && c->retained.empty() && !w.capture.count({c, 0}) &&
         !c->graph_freed && c->num_outputs == 1;
}

// The Linear whose activation gradient n's dgrad GEMM may apply, or null.
Node* fusable_producer(WalkState& w, Node* n) {
  if (w.req.create_graph || n->op != OpId::Linear || !n->needs_input_grad(0)) return nullptr;
  Node* c = n->next[0].fn.get();
  while (c && c->op == OpId::Reshape && unobserved(w, c)) c = c->next[0].fn.get();
  if (!c || c->op != OpId::Linear || !unobserved(w, c) || c->attrs<ops::LinearAttrs>().act == ops::Activation::None) return nullptr;
  Shape produced{c->inputs[0].shape[0], c->inputs[1].shape[0]};  // [rows, out_features]
  return n->inputs[0].shape == produced ? c : nullptr;
}

// Which of a Linear's inputs (x, W, b) come from an f32 -> f16/bf16 cast, through reshapes only,
// with nothing observing the gradient in between; those casts are appended to *casts.
std::array<bool, 3> wide_inputs(WalkState& w, Node* n, std::vector<Node*>* casts) {
  std::array<bool, 3> wide{};
  if (w.req.create_graph || n->op != OpId::Linear) return wide;
  for (size_t i = 0; i < n->next.size() && i < 3; ++i) {
    const DType dt = n->inputs[i].dtype;
    if (!n->next[i].fn || (dt != FLAME_DTYPE_F16 && dt != FLAME_DTYPE_BF16)) continue;
    Node* c = n->next[i].fn.get();
    while (c && c->op == OpId::Reshape && unobserved(w, c)) c = c->next[0].fn.get();
    if (c && c->op == OpId::Cast && unobserved(w, c) && c->inputs[0].dtype == FLAME_DTYPE_F32) {
      wide[i] = true;
      casts->push_back(c);
    }
  }
  return wide;
}

// Adds a slice's gradient in place into that slice of its input's pending gradient; false when the
// walk does not hold that buffer alone (then the rule runs: zeros + copy).
bool scatter_into_pending(WalkState& w, Node& n, const Tensor& g) {
  Node* child = n.next[0].fn.get();
  auto it = child ? w.buffer.find(child) : w.buffer.end();
  if (w.req.create_graph || it == w.buffer.end() || it->second.size() <= n.next[0].input_nr) return false;
  const Tensor& acc = it->second[n.next[0].input_nr];
  if (!acc || acc.use_count() != 1 || acc->storage.use_count() != 1 || !acc->contiguous() || acc->dtype != g->dtype ||
      acc->shape != n.inputs[0].shape)
    return false;
  Tensor slice = ops::view_slice(acc, n.view);  // grad mode is off: no node recorded
  launch_elementwise("Add", {}, slice, {slice, g});
  acc->storage->version++;
  w.unit_seed.erase({child, n.next[0].input_nr});
  return true;
}

}  // namespace

bool fused_backward(WalkState& w, Node& n, const std::vector<Tensor>& gs, std::vector<Tensor>* grads) {
  const bool pre = w.pre_activation.count(&n) > 0;
  Node* producer = n.num_outputs == 1 ? fusable_producer(w, &n) : nullptr;
  std::vector<Node*> casts;
  const std::array<bool, 3> wide = n.num_outputs == 1 ? wide_inputs(w, &n, &casts) : std::array<bool, 3>{};
  if (w.cast_through.count(&n)) {
    *grads = {gs[0]};  // already in the cast's input dtype
    return true;
  }
  if (pre || producer || !casts.empty()) {
    Tensor p_dz;
    *grads = linear_backward(n, gs[0], pre, producer, &p_dz, wide);
    if (p_dz) {  // the reshapes in between pass no gradient; the producer gets it directly
      w.buffer[producer] = {p_dz};
      w.unit_seed.erase({producer, 0});
      w.pre_activation.insert(producer);
    }
    w.cast_through.insert(casts.begin(), casts.end());
    return true;
  }
  if (n.op == OpId::ViewSlice && scatter_into_pending(w, n, gs[0])) {
    grads->assign(n.next.size(), nullptr);  // already in the input's buffer
    return true;
  }
  return false;
}

}  // namespace flame

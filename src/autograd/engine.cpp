// Dependency-counting reverse walk: count, for every node reachable from the roots, how many
// edges lead into it; run a node once all of them have delivered their gradient (summed in its
// buffer, one per output of the node: Edge::input_nr); pass its rule's results along its edges.
// Leaf gradients are collected and applied after the walk. Grad mode is set to create_graph for the
// walk so that rules record themselves only when higher-order gradients were asked for. Nodes with
// several outputs (checkpointing) get all their outputs' gradients at once (apply_backward_rule_multi).
// Before a node's rule runs, the walk's cross-node fusions get one call (fused_backward,
// walk_fusions.cpp: Linear activation and autocast-cast gradients through the GEMMs, slices added
// in place into their input's pending gradient). The walk's state is a WalkState (walk.h).
// The unit seed: the ones tensor the engine makes for a one-element root whose gradient the caller
// left NULL is remembered (by the buffer slot it fills) until that slot's node runs. The mark goes as
// soon as anything else reaches the slot (another root or edge adds to it, a slice is added into it
// in place, a hook on the output sees it), and is never made for a gradient the caller passed or
// when the graph is kept or recorded. The node's rule is then told that g is exactly 1, seen by no
// user code, and that its saved tensors are freed after it: cross_entropy hands out the gradient its
// forward already computed (backward_rules.cpp, seed_rule).
#include "autograd/engine.h"
#include <algorithm>
#include "autograd/walk.h"
#include "core/error.h"
#include "ops/launch.h"
#include "ops/ops.h"

namespace flame {

std::vector<Tensor> apply_backward_rule(Node& n, const Tensor& g, bool unit_seed);  // backward_rules.cpp
std::vector<Tensor> apply_backward_rule_multi(Node& n, const std::vector<Tensor>& gs);  // backward_rules.cpp

namespace {

void check_grad_geometry(const Tensor& g, const TensorInfo& want, const char* what) {
  FLAME_CHECK(g->shape == want.shape, FLAME_ERROR_SHAPE_MISMATCH, what, " has shape ", shape_str(g->shape),
              " but the tensor has shape ", shape_str(want.shape));
  FLAME_CHECK(g->dtype == want.dtype, FLAME_ERROR_DTYPE_MISMATCH, what, " has dtype ", dtype_name(g->dtype),
              " but the tensor has dtype ", dtype_name(want.dtype));
}

// Calls the tensor hooks in order; each may replace the gradient (a hook that fails throws).
Tensor run_hooks(const HookList& hooks, Tensor g, const TensorInfo& info) {
  for (const auto& h : hooks) {
    if (!h->alive || !h->on_grad) continue;
    Tensor r = h->on_grad(g);
    if (r) {
      check_grad_geometry(r, info, "the gradient returned by a hook");
      g = r;
    }
  }
  return g;
}

void run_post_hooks(const Tensor& leaf) {
  if (!leaf->autograd) return;
  HookList hooks = leaf->autograd->post_hooks;  // a hook may register or remove hooks
  for (const auto& h : hooks)
    if (h->alive && h->on_accumulated) h->on_accumulated(leaf);
}

// .grad += g, in place when no graph is being built (the buffer is private to the leaf).
void accumulate_grad(const Tensor& t, Tensor g, bool create_graph) {
  auto& m = autograd_meta(*t);
  if (!m.grad && !create_graph) {
    // The engine's buffer becomes .grad when nothing else can reach it, as PyTorch steals it: a dense
    // tensor whose handle and storage only this call holds (a gradient shared by two leaves, kept by
    // a hook's caller or exported is still referenced). Otherwise a private copy, so that later
    // in-place accumulation touches nothing else. Saves one copy per parameter and step.
    const bool sole = g.use_count() == 1 && g->storage.use_count() == 1 && g->contiguous() && !g->autograd;
    m.grad = sole ? alias(g) : ops::clone(alias(g));
    return;
  }
  if (!create_graph) g = alias(g);
  if (!m.grad) {
    m.grad = g;
    return;
  }
  if (create_graph) {
    m.grad = ops::add(m.grad, g);
    return;
  }
  launch_elementwise("Add", {}, m.grad, {m.grad, g});
  m.grad->storage->version++;
}

// The roots' gradients into the buffer (ones for a one-element root without one: the unit seed).
void seed_roots(WalkState& w) {
  const BackwardRequest& req = w.req;
  for (size_t i = 0; i < req.roots.size(); ++i) {
    const Tensor& r = req.roots[i];
    Edge e = gradient_edge(r);
    FLAME_CHECK(e.fn, FLAME_ERROR_INVALID_ARGUMENT, "output ", i, " does not require grad and has no grad_fn");
    Tensor g = i < req.root_grads.size() ? req.root_grads[i] : nullptr;
    const bool implicit = !g;
    if (implicit) {
      FLAME_CHECK(r->numel() == 1, FLAME_ERROR_INVALID_ARGUMENT, "grad can be implicitly created only for outputs "
                  "with one element; output ", i, " has shape ", shape_str(r->shape));
      g = ops::full(w.ctx, r->shape, r->dtype, 1.0);
    } else {
      FLAME_CHECK(&g->ctx() == &w.ctx, FLAME_ERROR_INVALID_ARGUMENT, "gradient ", i, " belongs to another context");
      check_grad_geometry(g, {r->shape, r->dtype}, "the gradient of the output");
    }
    auto slot = w.buffer.find(e.fn.get());
    const bool first = slot == w.buffer.end() || slot->second.size() <= e.input_nr || !slot->second[e.input_nr];
    w.add_to(e.fn.get(), e.input_nr, g);
    if (implicit && first && !req.keep_graph && !req.create_graph) w.unit_seed.insert({e.fn.get(), e.input_nr});
    w.root_nodes.push_back(e.fn);
  }
}

// flame_grad's inputs, keyed by the node (and output) their gradient reaches.
void capture_inputs(WalkState& w) {
  for (size_t j = 0; j < w.req.inputs.size(); ++j) {
    Edge e = gradient_edge(w.req.inputs[j]);
    FLAME_CHECK(e.fn, FLAME_ERROR_INVALID_ARGUMENT, "input ", j, " does not require grad");
    w.capture[{e.fn.get(), e.input_nr}].push_back(j);
    w.keep_alive.push_back(e.fn);
  }
  w.results.resize(w.req.inputs.size());
}

// The incoming edges of every node reachable from the roots; the roots nothing leads into are ready.
void count_dependencies(WalkState& w) {
  std::vector<Node*> stack;
  std::unordered_map<Node*, bool> seen;
  for (auto& n : w.root_nodes)
    if (!seen[n.get()]) { seen[n.get()] = true; stack.push_back(n.get()); }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (auto& e : n->next) {
      if (!e.fn) continue;
      w.deps[e.fn.get()]++;
      if (!seen[e.fn.get()]) { seen[e.fn.get()] = true; stack.push_back(e.fn.get()); }
    }
  }
  for (auto& n : w.root_nodes)
    if (w.deps[n.get()] == 0 && std::find(w.ready.begin(), w.ready.end(), n.get()) == w.ready.end())
      w.ready.push_back(n.get());
}

// A leaf's gradient: its hooks, then flame_grad's result or .grad (now when post-accumulate hooks
// wait for it, as PyTorch, so that their work overlaps the walk; else after the walk).
void deliver_to_leaf(WalkState& w, Node* n, Tensor g) {
  Tensor leaf = n->leaf.lock();
  if (leaf && leaf->autograd) g = run_hooks(leaf->autograd->hooks, g, n->inputs[0]);
  auto it = w.capture.find({n, 0});
  if (it != w.capture.end())
    for (size_t j : it->second) w.results[j] = g;
  else if (!w.accumulate && w.req.other_leaves_error)
    fail(FLAME_ERROR_UNSUPPORTED, w.req.other_leaves_error);
  if (!w.accumulate || !leaf) return;
  if (leaf->autograd && !leaf->autograd->post_hooks.empty()) {
    accumulate_grad(leaf, std::move(g), w.req.create_graph);
    run_post_hooks(leaf);
  } else {
    w.pending.emplace_back(leaf, std::move(g));
  }
}

// What user code sees of a node's output gradients: its hooks (which may replace them), tensors
// that retain their gradient, flame_grad's captured inputs.
void observe_outputs(WalkState& w, Node* n, std::vector<Tensor>& gs) {
  for (uint32_t nr = 0; nr < gs.size(); ++nr) {
    if (!gs[nr]) continue;
    HookList hooks;
    for (auto& h : n->hooks)
      if (h.first == nr) hooks.push_back(h.second);
    if (!hooks.empty()) {
      w.unit_seed.erase({n, nr});  // a hook may replace the gradient or edit it in place
      gs[nr] = run_hooks(hooks, gs[nr], {gs[nr]->shape, gs[nr]->dtype});
    }
    for (auto& r : n->retained)
      if (r.first == nr)
        if (auto t = r.second.lock()) w.pending.emplace_back(t, gs[nr]);
    auto it = w.capture.find({n, nr});
    if (it != w.capture.end())
      for (size_t j : it->second) w.results[j] = gs[nr];
  }
}

// The gradients of n's inputs: a fusion of the walk's, else n's backward rule.
std::vector<Tensor> node_backward(WalkState& w, Node* n, const std::vector<Tensor>& gs) {
  std::vector<Tensor> grads;
  if (!fused_backward(w, *n, gs, &grads))
    grads = n->num_outputs > 1 ? apply_backward_rule_multi(*n, gs)
                               : apply_backward_rule(*n, gs[0], w.unit_seed.count({n, 0}) > 0);
  FLAME_CHECK(grads.size() == n->next.size(), FLAME_ERROR_INTERNAL, "backward of ", op_name(n->op), " returned ",
              grads.size(), " gradients for ", n->next.size(), " inputs");
  return grads;
}

// Hands n's input gradients to the nodes its edges lead to; a node whose last edge delivered is ready.
void pass_along(WalkState& w, Node* n, const std::vector<Tensor>& grads) {
  for (size_t i = 0; i < n->next.size(); ++i) {
    Node* child = n->next[i].fn.get();
    if (!child) continue;
    if (i < grads.size() && grads[i]) {
      FLAME_CHECK(grads[i]->shape == n->inputs[i].shape, FLAME_ERROR_INTERNAL, "backward of ", op_name(n->op),
                  " gave input ", i, " a gradient of shape ", shape_str(grads[i]->shape), " instead of ",
                  shape_str(n->inputs[i].shape));
      w.add_to(child, n->next[i].input_nr, grads[i]);
    }
    if (--w.deps[child] == 0) w.ready.push_back(child);
  }
}

// Runs one ready node: its buffered gradients through leaf delivery or observation, backward and
// pass-along. A node that received no gradient still counts down its children.
void run_node(WalkState& w, Node* n) {
  std::vector<Tensor> gs = std::move(w.buffer[n]);
  w.buffer.erase(n);
  bool any = false;
  for (const Tensor& t : gs) any = any || t;
  std::vector<Tensor> grads;
  if (any) {
    if (n->op == OpId::Count) {  // a leaf
      deliver_to_leaf(w, n, std::move(gs[0]));
      return;
    }
    observe_outputs(w, n, gs);
    grads = node_backward(w, n, gs);
  }
  if (!w.req.keep_graph) n->release_saved();
  pass_along(w, n, grads);
}

// After the walk: unused flame_grad inputs, then the other leaves' .grad (none is accumulated if any
// hook failed during the walk) and their post-accumulate hooks.
std::vector<Tensor> finish(WalkState& w) {
  for (size_t j = 0; j < w.req.inputs.size(); ++j)
    FLAME_CHECK(w.results[j] || w.req.allow_unused, FLAME_ERROR_INVALID_ARGUMENT, "input ", j,
                " was not used to compute the outputs (pass FLAME_GRAD_ALLOW_UNUSED to get NULL instead)");
  for (auto& p : w.pending) accumulate_grad(p.first, std::move(p.second), w.req.create_graph);  // moved: see accumulate_grad
  for (auto& p : w.pending)
    if (!p.first->autograd || !p.first->autograd->grad_fn) run_post_hooks(p.first);
  if (!w.req.create_graph)
    for (auto& r : w.results)
      if (r) r = alias(r);
  return std::move(w.results);
}

}  // namespace

void WalkState::add_to(Node* n, uint32_t nr, const Tensor& g) {
  std::vector<Tensor>& v = buffer[n];
  if (v.size() <= nr) v.resize(nr + 1);
  v[nr] = v[nr] ? ops::add(v[nr], g) : g;
  unit_seed.erase({n, nr});
}

std::vector<Tensor> run_backward(Context& ctx, const BackwardRequest& req) {
  GradMode walk_mode = ctx.mode;
  walk_mode.grad_enabled = req.create_graph;  // rules record themselves only for higher-order gradients
  walk_mode.inference = false;
  walk_mode.backward_accumulates = req.inputs.empty();  // checkpoint rules' inner walks follow it
  GradModeGuard mode(ctx, walk_mode);

  WalkState w(ctx, req);
  seed_roots(w);
  capture_inputs(w);
  count_dependencies(w);
  while (!w.ready.empty()) {
    Node* n = w.ready.back();
    w.ready.pop_back();
    run_node(w, n);
  }
  return finish(w);
}

}  // namespace flame

// Dependency-counting reverse walk: count, for every node reachable from the roots, how many
// edges lead into it; run a node once all of them have delivered their gradient (summed in its
// buffer, one per output of the node: Edge::input_nr); pass its rule's results along its edges.
// Leaf gradients are collected and applied after the walk. Grad mode is set to create_graph for the
// walk so that rules record themselves only when higher-order gradients were asked for. Nodes with
// several outputs (checkpointing) get all their outputs' gradients at once (apply_backward_rule_multi).
// One cross-node fusion: when a Linear's input was produced by a Linear with an activation (through
// reshapes only) and nothing else observes the gradient in between (one incoming edge each, no
// hooks, retain_grad or flame_grad capture), the consumer's dgrad GEMM applies the producer's
// activation derivative in its epilogue and hands the producer its pre-activation gradient
// (backward_rules.cpp, linear_backward). Likewise a Linear whose f16/bf16 inputs autocast cast from
// f32 tensors (through reshapes only, nothing observing in between) has its GEMMs write those inputs'
// gradients in f32, and the casts pass them on instead of running a kernel each (GPT-2 in bf16: ~100
// casts per step).
// The unit seed: the ones tensor the engine makes for a one-element root whose gradient the caller
// left NULL is remembered (by the buffer slot it fills) until that slot's node runs. The mark goes as
// soon as anything else reaches the slot (another root or edge adds to it, a slice is added into it
// in place, a hook on the output sees it), and is never made for a gradient the caller passed or
// when the graph is kept or recorded. The node's rule is then told that g is exactly 1, seen by no
// user code, and that its saved tensors are freed after it: cross_entropy hands out the gradient its
// forward already computed (backward_rules.cpp, seed_rule).
#include "autograd/engine.h"
#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include "core/error.h"
#include "ops/launch.h"
#include "ops/ops.h"

namespace flame {

std::vector<Tensor> apply_backward_rule(Node& n, const Tensor& g, bool unit_seed);  // backward_rules.cpp
std::vector<Tensor> apply_backward_rule_multi(Node& n, const std::vector<Tensor>& gs);  // backward_rules.cpp
std::vector<Tensor> linear_backward(Node& n, const Tensor& g, bool pre, Node* p, Tensor* p_dz,
                                    const std::array<bool, 3>& wide);

namespace {

class GradModeGuard {
 public:
  GradModeGuard(Context& c, bool enabled) : c_(c), prev_(c.grad_enabled), prev_inf_(c.inference_mode) {
    c.grad_enabled = enabled;
    c.inference_mode = false;
  }
  ~GradModeGuard() {
    c_.grad_enabled = prev_;
    c_.inference_mode = prev_inf_;
  }

 private:
  Context& c_;
  bool prev_, prev_inf_;
};

// Context::backward_accumulates for the duration of one walk (walks nest inside checkpoint rules).
class AccumulateModeGuard {
 public:
  AccumulateModeGuard(Context& c, bool accumulates) : c_(c), prev_(c.backward_accumulates) { c.backward_accumulates = accumulates; }
  ~AccumulateModeGuard() { c_.backward_accumulates = prev_; }

 private:
  Context& c_;
  bool prev_;
};

void check_grad_geometry(const Tensor& g, const TensorInfo& want, const char* what) {
  FLAME_CHECK(g->shape == want.shape, FLAME_ERROR_SHAPE_MISMATCH, what, " has shape ", shape_str(g->shape),
              " but the tensor has shape ", shape_str(want.shape));
  FLAME_CHECK(g->dtype == want.dtype, FLAME_ERROR_DTYPE_MISMATCH, what, " has dtype ", dtype_name(g->dtype),
              " but the tensor has dtype ", dtype_name(want.dtype));
}

// Calls the user's tensor hooks in order; each may replace the gradient.
Tensor run_hooks(const HookList& hooks, Tensor g, const TensorInfo& info) {
  for (const auto& h : hooks) {
    if (!h->alive || !h->fn) continue;
    flame_tensor_t gh = wrap_lent(g);
    flame_tensor_t replacement = nullptr;
    clear_last_error();
    flame_status_t st = h->fn(h->user_data, gh, &replacement);
    release_handle(gh);
    if (st != FLAME_OK) {
      release_handle(replacement);
      std::string msg = last_error();
      fail(st, "a gradient hook failed: ", msg.empty() ? "(the hook gave no message)" : msg);
    }
    if (replacement) {
      Tensor r;
      try {
        r = unwrap(replacement, "replacement");
      } catch (...) {
        fail(FLAME_ERROR_INVALID_HANDLE, "a gradient hook returned an invalid replacement handle");
      }
      release_handle(replacement);
      check_grad_geometry(r, info, "the gradient returned by a hook");
      g = r;
    }
  }
  return g;
}

void run_post_hooks(const Tensor& leaf) {
  if (!leaf->autograd) return;
  HookList hooks = leaf->autograd->post_hooks;  // a hook may register or remove hooks
  for (const auto& h : hooks) {
    if (!h->alive || !h->post_fn) continue;
    flame_tensor_t lh = wrap_lent(leaf);
    clear_last_error();
    flame_status_t st = h->post_fn(h->user_data, lh);
    release_handle(lh);
    if (st != FLAME_OK) {
      std::string msg = last_error();
      fail(st, "a post-accumulate hook failed: ", msg.empty() ? "(the hook gave no message)" : msg);
    }
  }
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

}  // namespace

std::vector<Tensor> run_backward(Context& ctx, const BackwardRequest& req) {
  GradModeGuard mode(ctx, req.create_graph);
  const bool accumulate = req.inputs.empty();
  AccumulateModeGuard acc_mode(ctx, accumulate);

  // Root gradients.
  std::unordered_map<Node*, std::vector<Tensor>> buffer;  // per node, one gradient per output
  std::set<std::pair<Node*, uint32_t>> unit_seed;          // buffer slots holding the untouched seed (see the top)
  std::vector<std::shared_ptr<Node>> root_nodes;
  auto add_to = [&](Node* n, uint32_t nr, const Tensor& g) {
    std::vector<Tensor>& v = buffer[n];
    if (v.size() <= nr) v.resize(nr + 1);
    v[nr] = v[nr] ? ops::add(v[nr], g) : g;
    unit_seed.erase({n, nr});
  };
  for (size_t i = 0; i < req.roots.size(); ++i) {
    const Tensor& r = req.roots[i];
    Edge e = gradient_edge(r);
    FLAME_CHECK(e.fn, FLAME_ERROR_INVALID_ARGUMENT, "output ", i, " does not require grad and has no grad_fn");
    Tensor g = i < req.root_grads.size() ? req.root_grads[i] : nullptr;
    const bool implicit = !g;
    if (implicit) {
      FLAME_CHECK(r->numel() == 1, FLAME_ERROR_INVALID_ARGUMENT, "grad can be implicitly created only for outputs "
                  "with one element; output ", i, " has shape ", shape_str(r->shape));
      g = ops::full(ctx, r->shape, r->dtype, 1.0);
    } else {
      FLAME_CHECK(&g->ctx() == &ctx, FLAME_ERROR_INVALID_ARGUMENT, "gradient ", i, " belongs to another context");
      check_grad_geometry(g, {r->shape, r->dtype}, "the gradient of the output");
    }
    auto slot = buffer.find(e.fn.get());
    const bool first = slot == buffer.end() || slot->second.size() <= e.input_nr || !slot->second[e.input_nr];
    add_to(e.fn.get(), e.input_nr, g);
    if (implicit && first && !req.keep_graph && !req.create_graph) unit_seed.insert({e.fn.get(), e.input_nr});
    root_nodes.push_back(e.fn);
  }

  // Inputs whose gradients flame_grad returns, keyed by the node (and output) their gradient reaches.
  std::map<std::pair<Node*, uint32_t>, std::vector<size_t>> capture;
  std::vector<std::shared_ptr<Node>> keep_alive;
  for (size_t j = 0; j < req.inputs.size(); ++j) {
    Edge e = gradient_edge(req.inputs[j]);
    FLAME_CHECK(e.fn, FLAME_ERROR_INVALID_ARGUMENT, "input ", j, " does not require grad");
    capture[{e.fn.get(), e.input_nr}].push_back(j);
    keep_alive.push_back(e.fn);
  }

  // Count incoming edges of every reachable node.
  std::unordered_map<Node*, int> deps;
  std::vector<Node*> stack;
  std::unordered_map<Node*, bool> seen;
  for (auto& n : root_nodes)
    if (!seen[n.get()]) { seen[n.get()] = true; stack.push_back(n.get()); }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (auto& e : n->next) {
      if (!e.fn) continue;
      deps[e.fn.get()]++;
      if (!seen[e.fn.get()]) { seen[e.fn.get()] = true; stack.push_back(e.fn.get()); }
    }
  }

  // A slice's gradient added in place into that slice of its input's pending gradient, when the
  // engine alone holds that buffer: q, k and v split from one qkv tensor then cost one zero-filled
  // buffer instead of three, and no full-size additions. False: the rule runs (zeros + copy).
  auto scatter_into_pending = [&](Node& n, const Tensor& g) {
    Node* child = n.next[0].fn.get();
    auto it = child ? buffer.find(child) : buffer.end();
    if (req.create_graph || it == buffer.end() || it->second.size() <= n.next[0].input_nr) return false;
    const Tensor& acc = it->second[n.next[0].input_nr];
    if (!acc || acc.use_count() != 1 || acc->storage.use_count() != 1 || !acc->contiguous() || acc->dtype != g->dtype ||
        acc->shape != n.inputs[0].shape)
      return false;
    Tensor slice = ops::view_slice(acc, n.view);  // grad mode is off: no node recorded
    launch_elementwise("Add", {}, slice, {slice, g});
    acc->storage->version++;
    unit_seed.erase({child, n.next[0].input_nr});
    return true;
  };

  // Linear nodes whose buffered gradient is already their pre-activation gradient.
  std::unordered_set<Node*> pre_activation;
  auto unobserved = [&](Node* c) {
    return deps[c] == 1 && !buffer.count(c) && c->hooks.empty() && c->retained.empty() && !capture.count({c, 0}) &&
           !c->graph_freed && c->num_outputs == 1;
  };
  // The Linear whose activation gradient n's dgrad GEMM may apply, or null.
  auto fusable_producer = [&](Node* n) -> Node* {
    if (req.create_graph || n->op != OpId::Linear || !n->needs_input_grad(0)) return nullptr;
    Node* c = n->next[0].fn.get();
    while (c && c->op == OpId::Reshape && unobserved(c)) c = c->next[0].fn.get();
    if (!c || c->op != OpId::Linear || !unobserved(c) || c->ints.at(0) == 0) return nullptr;
    Shape produced{c->inputs[0].shape[0], c->inputs[1].shape[0]};  // [rows, out_features]
    return n->inputs[0].shape == produced ? c : nullptr;
  };

  // Casts whose buffered gradient is already in their input's dtype: a Linear's GEMMs wrote it in f32
  // (autocast's f32 -> f16/bf16 casts of parameters and activations), so the cast passes it on.
  std::unordered_set<Node*> cast_through;
  // Which of a Linear's inputs (x, W, b) come from such a cast, through reshapes only, with nothing
  // observing the gradient in between; those casts are appended to *casts.
  auto wide_inputs = [&](Node* n, std::vector<Node*>* casts) {
    std::array<bool, 3> wide{};
    if (req.create_graph || n->op != OpId::Linear) return wide;
    for (size_t i = 0; i < n->next.size() && i < 3; ++i) {
      const DType dt = n->inputs[i].dtype;
      if (!n->next[i].fn || (dt != FLAME_DTYPE_F16 && dt != FLAME_DTYPE_BF16)) continue;
      Node* c = n->next[i].fn.get();
      while (c && c->op == OpId::Reshape && unobserved(c)) c = c->next[0].fn.get();
      if (c && c->op == OpId::Cast && unobserved(c) && c->inputs[0].dtype == FLAME_DTYPE_F32) {
        wide[i] = true;
        casts->push_back(c);
      }
    }
    return wide;
  };

  std::vector<Tensor> results(req.inputs.size());
  std::vector<std::pair<Tensor, Tensor>> pending;  // (leaf, gradient)
  std::vector<Node*> ready;
  for (auto& n : root_nodes)
    if (deps[n.get()] == 0 && std::find(ready.begin(), ready.end(), n.get()) == ready.end()) ready.push_back(n.get());

  while (!ready.empty()) {
    Node* n = ready.back();
    ready.pop_back();
    std::vector<Tensor> gs = std::move(buffer[n]);
    buffer.erase(n);
    bool any = false;
    for (const Tensor& t : gs) any = any || t;
    if (any) {
      if (n->op == OpId::Count) {  // a leaf
        Tensor g = std::move(gs[0]);
        Tensor leaf = n->leaf.lock();
        if (leaf && leaf->autograd) g = run_hooks(leaf->autograd->hooks, g, n->inputs[0]);
        auto it = capture.find({n, 0});
        if (it != capture.end())
          for (size_t j : it->second) results[j] = g;
        else if (!accumulate && req.other_leaves_error)
          fail(FLAME_ERROR_UNSUPPORTED, req.other_leaves_error);
        if (accumulate && leaf) {
          if (leaf->autograd && !leaf->autograd->post_hooks.empty()) {  // now, as PyTorch: the hooks' work overlaps the walk
            accumulate_grad(leaf, std::move(g), req.create_graph);
            run_post_hooks(leaf);
          } else {
            pending.emplace_back(leaf, std::move(g));
          }
        }
        continue;
      }
      for (uint32_t nr = 0; nr < gs.size(); ++nr) {  // each output's hooks, retained grad, capture
        if (!gs[nr]) continue;
        HookList hooks;
        for (auto& h : n->hooks)
          if (h.first == nr) hooks.push_back(h.second);
        if (!hooks.empty()) {
          unit_seed.erase({n, nr});  // a hook may replace the gradient or edit it in place
          gs[nr] = run_hooks(hooks, gs[nr], {gs[nr]->shape, gs[nr]->dtype});
        }
        for (auto& r : n->retained)
          if (r.first == nr)
            if (auto t = r.second.lock()) pending.emplace_back(t, gs[nr]);
        auto it = capture.find({n, nr});
        if (it != capture.end())
          for (size_t j : it->second) results[j] = gs[nr];
      }
    }
    std::vector<Tensor> grads;
    if (any) {
      const bool pre = pre_activation.count(n) > 0;
      Node* producer = n->num_outputs == 1 ? fusable_producer(n) : nullptr;
      std::vector<Node*> casts;
      const std::array<bool, 3> wide = n->num_outputs == 1 ? wide_inputs(n, &casts) : std::array<bool, 3>{};
      if (cast_through.count(n)) {
        grads = {gs[0]};  // already in the cast's input dtype
      } else if (pre || producer || !casts.empty()) {
        Tensor p_dz;
        grads = linear_backward(*n, gs[0], pre, producer, &p_dz, wide);
        if (p_dz) {  // the reshapes in between pass no gradient; the producer gets it directly
          buffer[producer] = {p_dz};
          unit_seed.erase({producer, 0});
          pre_activation.insert(producer);
        }
        cast_through.insert(casts.begin(), casts.end());
      } else if (n->op == OpId::ViewSlice && scatter_into_pending(*n, gs[0])) {
        grads.assign(n->next.size(), nullptr);  // already in the input's buffer
      } else {
        grads = n->num_outputs > 1 ? apply_backward_rule_multi(*n, gs)
                                   : apply_backward_rule(*n, gs[0], unit_seed.count({n, 0}) > 0);
      }
      FLAME_CHECK(grads.size() == n->next.size(), FLAME_ERROR_INTERNAL, "backward of ", op_name(n->op), " returned ",
                  grads.size(), " gradients for ", n->next.size(), " inputs");
    }
    if (!req.keep_graph) n->release_saved();
    for (size_t i = 0; i < n->next.size(); ++i) {
      Node* child = n->next[i].fn.get();
      if (!child) continue;
      if (i < grads.size() && grads[i]) {
        FLAME_CHECK(grads[i]->shape == n->inputs[i].shape, FLAME_ERROR_INTERNAL, "backward of ", op_name(n->op),
                    " gave input ", i, " a gradient of shape ", shape_str(grads[i]->shape), " instead of ",
                    shape_str(n->inputs[i].shape));
        add_to(child, n->next[i].input_nr, grads[i]);
      }
      if (--deps[child] == 0) ready.push_back(child);
    }
  }

  for (size_t j = 0; j < req.inputs.size(); ++j)
    FLAME_CHECK(results[j] || req.allow_unused, FLAME_ERROR_INVALID_ARGUMENT, "input ", j,
                " was not used to compute the outputs (pass FLAME_GRAD_ALLOW_UNUSED to get NULL instead)");
  // The other leaves last: none of them is accumulated if any hook failed during the walk.
  for (auto& p : pending) accumulate_grad(p.first, std::move(p.second), req.create_graph);  // moved: see accumulate_grad
  for (auto& p : pending)
    if (!p.first->autograd || !p.first->autograd->grad_fn) run_post_hooks(p.first);
  if (!req.create_graph)
    for (auto& r : results)
      if (r) r = alias(r);
  return results;
}

}  // namespace flame

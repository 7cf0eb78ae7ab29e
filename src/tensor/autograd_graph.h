// The autograd graph, as the ops see it when they record. A recorded op creates one Node holding
// edges to the nodes that produced its inputs (or to an accumulator node for a leaf), the tensors
// its backward rule needs (SavedTensor, version-checked), and small attributes. Nodes live as long
// as some tensor's grad_fn or a downstream node refers to them; there is no global tape. It sits in
// the tensor layer, below the ops that record nodes; the one engine that walks the graph is
// autograd/engine.cpp, and all backward rules are in autograd/backward_rules.cpp, except those an op
// hands in with its node (Node::backward: gradient checkpointing, fused functions).
#pragma once
#include <any>
#include <functional>
#include <memory>
#include <vector>
#include "core/error.h"
#include "tensor/op_list.h"
#include "tensor/tensor.h"

namespace flame {

struct Node;

struct Edge {
  std::shared_ptr<Node> fn;
  uint32_t input_nr = 0;  // which output of fn this gradient belongs to
};

// A gradient hook: C++ callables, so that the graph knows nothing of C handles (the API layer
// adapts flame.h's callbacks to them, api/api_autograd.cpp; data parallelism registers its own).
// A hook reports failure by throwing flame::Error. finish() runs on_finish exactly once, on
// flame_hook_remove or when its owner (tensor or node) goes, whichever is first; no callable of a
// finished hook runs again.
struct HookRecord {
  // Tensor hook: sees the gradient flowing into the tensor; returns its replacement, or null to keep it.
  std::function<Tensor(const Tensor& grad)> on_grad;
  // Post-accumulate hook: sees the leaf once its .grad has been accumulated.
  std::function<void(const Tensor& leaf)> on_accumulated;
  // Releases what the hook holds (the user's data); must not throw.
  std::function<void()> on_finish;
  bool alive = true;
  std::weak_ptr<Context> ctx;
  void finish() noexcept {
    if (!alive) return;
    alive = false;  // the callables stay (a hook may remove itself while it runs) but are never called again
    if (on_finish) {
      std::function<void()> f = std::move(on_finish);
      on_finish = nullptr;
      f();
    }
  }
};
using HookList = std::vector<std::shared_ptr<HookRecord>>;
void finish_hooks(HookList& hooks) noexcept;

struct AutogradMeta {
  bool requires_grad = false;
  std::shared_ptr<Node> grad_fn;    // null for leaves
  uint32_t output_nr = 0;
  Tensor grad;                      // .grad of a leaf (or of a non-leaf that retains it)
  std::weak_ptr<Node> accumulator;  // leaves: the node that accumulates into .grad
  HookList hooks;                   // leaves: tensor hooks (non-leaf hooks live on grad_fn)
  HookList post_hooks;              // leaves: post-accumulate hooks
  bool is_inference = false;        // created in inference mode: can never require grad
  ~AutogradMeta() { finish_hooks(hooks); finish_hooks(post_hooks); }
};

// A tensor saved for backward. Outputs of the node itself are stored without history (a saved
// output holding its own grad_fn would be a reference cycle) and given it back on unpack.
class SavedTensor {
 public:
  SavedTensor() = default;
  SavedTensor(const Tensor& t, bool is_output);
  Tensor unpack(Node& owner) const;
  void reset() { data_.reset(); }
  bool defined() const { return static_cast<bool>(data_); }

 private:
  Tensor data_;
  uint64_t version_ = 0;
  bool is_output_ = false;
  uint32_t output_nr_ = 0;
};

struct TensorInfo {
  Shape shape;
  DType dtype;
};

// Geometry of one strided sub-view (narrow, slice, select, diagonal, flip), re-applied by the
// backward of ViewSlice and ViewScatter.
struct ViewSpec {
  enum Kind { Slice, Select, Diagonal, Flip } kind = Slice;
  int dim = 0, dim2 = 0;
  int64_t start = 0, length = 0, step = 1;  // Slice: start, number of elements, step; Select: start
  std::vector<int> dims;                    // Flip
};

struct Node : std::enable_shared_from_this<Node> {
  OpId op = OpId::Count;  // OpId::Count marks an accumulator (leaf) node
  std::vector<Edge> next;          // one per input; fn null when that input needs no gradient
  std::vector<TensorInfo> inputs;  // geometry of each input
  std::vector<SavedTensor> saved;
  std::any attributes;             // the op's attribute struct (defined beside the op), read through attrs<A>()
  ViewSpec view;
  bool graph_freed = false;        // saved tensors were released by a backward without retain_graph
  // Hooks and retain_grad of the tensors this node produced (non-leaves), keyed by output number.
  std::vector<std::pair<uint32_t, std::shared_ptr<HookRecord>>> hooks;
  std::vector<std::pair<uint32_t, std::weak_ptr<TensorImpl>>> retained;
  std::weak_ptr<TensorImpl> leaf;  // accumulator nodes only
  // ---- nodes with several outputs (gradient checkpointing) ----
  // The engine keeps one gradient per output (Edge::input_nr) and, for num_outputs > 1, hands all
  // of them to the node's backward at once.
  uint32_t num_outputs = 1;
  // The backward of an op whose rule is not in autograd/backward_rules.cpp, handed in at record
  // time by the layer that owns the op's state (gradient checkpointing: toolkit/checkpoint.cpp;
  // fused functions: ops/fused.cpp); what it captures is freed with the node. It gets one gradient
  // per output (null where none arrived) and returns one per input (null where none is needed).
  using BackwardFn = std::function<std::vector<Tensor>(Node& self, const std::vector<Tensor>& output_grads)>;
  BackwardFn backward;

  template <class A> A& attrs() {
    if (A* a = std::any_cast<A>(&attributes)) return *a;
    fail(FLAME_ERROR_INTERNAL, "node of ", op_name(op), " does not hold the attributes its reader expects");
  }
  template <class A> const A& attrs() const { return const_cast<Node*>(this)->attrs<A>(); }
  bool needs_input_grad(size_t i) const { return i < next.size() && next[i].fn != nullptr; }
  void release_saved() {
    for (auto& s : saved) s.reset();
    graph_freed = true;
  }
  ~Node();
};

bool requires_grad(const TensorImpl& t);
// The edge a gradient for t must flow along (empty when t needs no gradient).
Edge gradient_edge(const Tensor& t);
AutogradMeta& autograd_meta(TensorImpl& t);

// Called by every op after computing its outputs: when grad mode is on and an input requires
// grad, creates the node, wires the outputs to it and returns it (else null). Fails with
// FLAME_ERROR_NOT_DIFFERENTIABLE for ops whose row of tensor/op_list.h has no backward (not RULE).
std::shared_ptr<Node> record(OpId op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs);

}  // namespace flame

// The state of one backward walk (autograd/engine.cpp), shared with the walk's op-specific fusions
// (autograd/walk_fusions.cpp). Internal to autograd/: the engine's public face is engine.h.
//
// buffer holds, per node, the gradient of each of its outputs summed so far; deps counts the edges
// that have yet to deliver into each node; a node is ready when its count reaches zero. unit_seed
// marks buffer slots that still hold the untouched ones tensor the engine made for a one-element
// root (engine.cpp's top comment says what that allows). capture maps the (node, output) of each
// flame_grad input to the result slots its gradient fills.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>
#include "autograd/engine.h"

namespace flame {

struct WalkState {
  WalkState(Context& c, const BackwardRequest& r) : ctx(c), req(r), accumulate(r.inputs.empty()) {}

  Context& ctx;
  const BackwardRequest& req;
  const bool accumulate;  // into .grad (flame_backward); false: results for req.inputs (flame_grad)

  std::unordered_map<Node*, std::vector<Tensor>> buffer;  // per node, one gradient per output
  std::set<std::pair<Node*, uint32_t>> unit_seed;          // buffer slots holding the untouched seed
  std::vector<std::shared_ptr<Node>> root_nodes;
  std::map<std::pair<Node*, uint32_t>, std::vector<size_t>> capture;
  std::vector<std::shared_ptr<Node>> keep_alive;  // the nodes of the captured inputs
  std::unordered_map<Node*, int> deps;
  std::vector<Node*> ready;
  std::vector<Tensor> results;                      // flame_grad: one per req.inputs
  std::vector<std::pair<Tensor, Tensor>> pending;   // (leaf or retained tensor, gradient) applied at the end

  // Fusion state: Linear nodes whose buffered gradient is already their pre-activation gradient, and
  // casts whose buffered gradient is already in their input's dtype.
  std::unordered_set<Node*> pre_activation;
  std::unordered_set<Node*> cast_through;

  // Adds g to output nr of n's buffered gradient.
  void add_to(Node* n, uint32_t nr, const Tensor& g);
};

// The gradients of n's inputs when one of the walk's cross-node fusions applies to n (the Linear
// activation / autocast-cast fusions, a slice added in place into its input's pending gradient):
// sets *grads and returns true. Returns false when none applies: the op's backward rule runs.
bool fused_backward(WalkState& w, Node& n, const std::vector<Tensor>& gs, std::vector<Tensor>* grads);

}  // namespace flame

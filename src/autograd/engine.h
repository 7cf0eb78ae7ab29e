// The reverse-mode engine: the one place where graphs are walked.
#pragma once
#include <vector>
#include "tensor/autograd_graph.h"

namespace flame {

struct BackwardRequest {
  std::vector<Tensor> roots;
  std::vector<Tensor> root_grads;  // null entries mean ones (root must have one element)
  bool keep_graph = false;
  bool create_graph = false;
  // flame_grad: gradients of these inputs are returned instead of accumulated into .grad.
  std::vector<Tensor> inputs;
  bool allow_unused = false;
  // With inputs: a leaf reached that is not one of them fails with FLAME_ERROR_UNSUPPORTED and this
  // text instead of being ignored (checkpointing cannot return such a gradient to flame_grad).
  const char* other_leaves_error = nullptr;
};

// Runs backward. With no inputs, accumulates into .grad of the reached leaves and runs their
// post-accumulate hooks: a leaf with such hooks as soon as its gradient is complete during the walk
// (so that their work, e.g. data-parallel communication, overlaps the rest of backward), the others
// after the walk (a failing hook then leaves their .grad untouched). With inputs, returns one
// gradient per input (null for unused inputs when allowed).
std::vector<Tensor> run_backward(Context& ctx, const BackwardRequest& req);

// Whether the rule table of backward_rules.cpp has a rule for op (exactly the RULE rows of
// tensor/op_list.h: tests/cpu/test_op_coverage.cpp checks it).
bool has_backward(OpId op);

}  // namespace flame

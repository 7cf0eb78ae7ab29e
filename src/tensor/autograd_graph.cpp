// The autograd graph (autograd_graph.h): nodes, saved tensors, leaf accumulators and record().
#include "tensor/autograd_graph.h"
#include "core/error.h"

namespace flame {

void finish_hooks(HookList& hooks) noexcept {
  for (auto& h : hooks) h->finish();
  hooks.clear();
}

Node::~Node() {
  for (auto& h : hooks) h.second->finish();
}

SavedTensor::SavedTensor(const Tensor& t, bool is_output) : is_output_(is_output) {
  version_ = t->storage->version.load();
  if (is_output) {
    data_ = alias(t);
    output_nr_ = t->autograd ? t->autograd->output_nr : 0;
  } else {
    data_ = t;
  }
}

Tensor SavedTensor::unpack(Node& owner) const {
  if (!data_) {
    if (owner.graph_freed)
      fail(FLAME_ERROR_GRAPH_FREED, "trying to backward through the graph a second time (or to use saved tensors after "
           "they were freed); pass FLAME_BACKWARD_RETAIN_GRAPH to the first backward to keep them");
    fail(FLAME_ERROR_INTERNAL, "saved tensor of ", op_name(owner.op), " is missing");
  }
  if (data_->storage->version.load() != version_)
    fail(FLAME_ERROR_INPLACE_MODIFIED, "a tensor saved for the backward of ", op_name(owner.op),
         " was modified in place after it was saved (version ", data_->storage->version.load(), ", expected ",
         version_, ")");
  if (!is_output_) return data_;
  Tensor t = alias(data_);  // give the output its history back, for create_graph
  auto& m = autograd_meta(*t);
  m.requires_grad = true;
  m.grad_fn = owner.shared_from_this();
  m.output_nr = output_nr_;
  return t;
}

bool requires_grad(const TensorImpl& t) { return t.autograd && t.autograd->requires_grad; }

AutogradMeta& autograd_meta(TensorImpl& t) {
  if (!t.autograd) t.autograd = std::make_unique<AutogradMeta>();
  return *t.autograd;
}

Edge gradient_edge(const Tensor& t) {
  if (!requires_grad(*t)) return {};
  auto& m = *t->autograd;
  if (m.grad_fn) return {m.grad_fn, m.output_nr};
  auto acc = m.accumulator.lock();
  if (!acc) {
    acc = std::make_shared<Node>();
    acc->leaf = t;
    acc->inputs.push_back({t->shape, t->dtype});
    m.accumulator = acc;
  }
  return {acc, 0};
}

std::shared_ptr<Node> record(OpId op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) {
  if (inputs.empty() || !inputs[0]->ctx().recording()) return nullptr;
  bool any = false;
  for (const auto& t : inputs) any = any || (t && requires_grad(*t));
  if (!any) return nullptr;
  bool float_out = false;
  for (const auto& o : outputs) float_out = float_out || is_floating(o->dtype);
  if (!float_out) return nullptr;  // comparisons, argmax...: no gradient flows through integer outputs
  if (op_backward(op) != Backward::RULE)
    fail(FLAME_ERROR_NOT_DIFFERENTIABLE, "op ", op_name(op), " has no backward, but an input requires grad "
         "(disable grad mode or detach the input)");
  auto node = std::make_shared<Node>();
  node->op = op;
  for (const auto& t : inputs) {
    node->next.push_back(t ? gradient_edge(t) : Edge{});
    node->inputs.push_back(t ? TensorInfo{t->shape, t->dtype} : TensorInfo{});
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!is_floating(outputs[i]->dtype)) continue;
    auto& m = autograd_meta(*outputs[i]);
    m.requires_grad = true;
    m.grad_fn = node;
    m.output_nr = static_cast<uint32_t>(i);
  }
  return node;
}

}  // namespace flame

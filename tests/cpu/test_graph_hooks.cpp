// The graph's hook records and node-owned backward (src/tensor/autograd_graph.h), with no GPU:
// a hook's on_finish runs exactly once, whoever finishes it first (flame_hook_remove, the tensor's
// autograd state or the node that owns it), and a finished hook's callables are never called again
// by the engine's guard (alive); what a node's backward captures is freed with the node.
#include <gtest/gtest.h>
#include <memory>
#include "tensor/autograd_graph.h"

namespace flame {
namespace {

std::shared_ptr<HookRecord> counting_hook(int* finished) {
  auto rec = std::make_shared<HookRecord>();
  rec->on_grad = [](const Tensor& g) { return g; };
  rec->on_finish = [finished] { ++*finished; };
  return rec;
}

TEST(GraphHooks, FinishRunsOnFinishExactlyOnce) {
  int finished = 0;
  auto rec = counting_hook(&finished);
  rec->finish();
  rec->finish();
  EXPECT_EQ(finished, 1);
  EXPECT_FALSE(rec->alive);
}

TEST(GraphHooks, OwnersFinishTheirHooks) {
  int finished = 0;
  auto a = counting_hook(&finished), b = counting_hook(&finished), c = counting_hook(&finished);
  {
    AutogradMeta meta;  // a leaf's tensor and post-accumulate hooks
    meta.hooks.push_back(a);
    meta.post_hooks.push_back(b);
  }
  EXPECT_EQ(finished, 2);
  {
    auto node = std::make_shared<Node>();  // a non-leaf's hooks live on its grad_fn
    node->hooks.emplace_back(0, c);
  }
  EXPECT_EQ(finished, 3);
  a->finish();  // flame_hook_remove after the owner went: nothing more
  EXPECT_EQ(finished, 3);
}

TEST(GraphHooks, HookMayFinishItselfWhileItRuns) {
  int finished = 0;
  auto rec = std::make_shared<HookRecord>();
  HookRecord* self = rec.get();
  int calls = 0;
  rec->on_accumulated = [self, &calls](const Tensor&) {
    ++calls;
    self->finish();  // flame_hook_remove from inside the hook: its callable must survive the call
  };
  rec->on_finish = [&finished] { ++finished; };
  rec->on_accumulated(nullptr);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(finished, 1);
  EXPECT_FALSE(rec->alive);
}

TEST(GraphNode, BackwardCapturesAreFreedWithTheNode) {
  auto state = std::make_shared<int>(7);
  std::weak_ptr<int> watch = state;
  {
    auto node = std::make_shared<Node>();
    node->backward = [state](Node&, const std::vector<Tensor>& gs) { return std::vector<Tensor>(gs.size()); };
    state.reset();
    EXPECT_FALSE(watch.expired());
    EXPECT_EQ(node->backward(*node, {nullptr, nullptr}).size(), 2u);
  }
  EXPECT_TRUE(watch.expired());
}

}  // namespace
}  // namespace flame

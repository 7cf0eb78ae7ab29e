// The training step as CUDA graphs per bucket (see step_graphs.h).
#include "step_graphs.h"

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

namespace flame_train {
namespace {

// The members of StepInputs that hold tensors, for cloning and refilling them alike.
constexpr Tensor StepInputs::*kInputTensors[] = {
    &StepInputs::x0,        &StepInputs::noise,   &StepInputs::noisy_a,  &StepInputs::noisy_b,
    &StepInputs::target_a,  &StepInputs::target_b, &StepInputs::timesteps, &StepInputs::weights,
    &StepInputs::embeds,    &StepInputs::pooled,  &StepInputs::time_ids, &StepInputs::img_ids,
    &StepInputs::txt_ids,   &StepInputs::guidance, &StepInputs::loss_scale};

StepInputs static_copy(const StepInputs& in) {
  StepInputs s;
  s.batch = in.batch;
  s.channels = in.channels;
  s.height = in.height;
  s.width = in.width;
  s.tokens = in.tokens;
  for (Tensor StepInputs::*m : kInputTensors)
    if ((in.*m).get()) check(flame_clone((in.*m).get(), (s.*m).out()), "flame_clone (static input)");
  return s;
}

void refill(const StepInputs& dst, const StepInputs& src) {
  for (Tensor StepInputs::*m : kInputTensors)
    if ((dst.*m).get()) check(flame_copy((dst.*m).get(), (src.*m).get()), "flame_copy (static input)");
}

double item(flame_tensor_t t) {
  double v = 0;
  check(flame_tensor_item(t, &v), "flame_tensor_item");
  return v;
}

}  // namespace

std::string graphs_blocker(const TrainConfig& config) {
  if (!config.training.cuda_graphs) return "training.cuda_graphs is false";
  if (config.network.dropout > 0) return "network.dropout > 0 draws random numbers inside the step";
  if (config.model.offload_budget_gib > 0) return "model.offload_budget_gib streams weights with host work per block";
  if (config.training.gpus > 1) return "training.gpus > 1 averages gradients through NCCL outside a graph";
  return "";
}

StepGraphs::StepGraphs(flame_ctx_t ctx, flame_model_t model, const Objective& objective, int accumulation_steps,
                       bool enabled)
    : ctx_(ctx), model_(model), objective_(objective), accumulation_steps_(accumulation_steps), enabled_(enabled) {}

StepGraphs::~StepGraphs() {
  flame_graph_release(update_graph_);
  for (auto& [key, b] : buckets_) flame_graph_release(b->graph);
}

flame_graph_t StepGraphs::pool_owner() const {
  if (!buckets_.empty()) return buckets_.begin()->second->graph;
  return update_graph_;
}

void StepGraphs::disable(const std::string& why) {
  std::fprintf(stderr, "flame-train: CUDA graphs off (%s); training goes on eagerly\n", why.c_str());
  enabled_ = false;
  flame_graph_release(update_graph_);
  update_graph_ = nullptr;
  for (auto& [key, b] : buckets_) flame_graph_release(b->graph);
  buckets_.clear();
}

// Captures work() into a graph sharing the run's pool; NULL (graphs disabled) when it fails.
flame_graph_t StepGraphs::capture(const std::function<void()>& work, const char* what) {
  check(flame_graph_capture_begin_shared(ctx_, pool_owner()), "flame_graph_capture_begin_shared");
  std::string failure;
  try {
    work();
  } catch (const std::exception& e) {
    failure = e.what();
  }
  flame_graph_t g = nullptr;
  const flame_status_t st = flame_graph_capture_end(ctx_, &g);
  if (st != FLAME_OK && failure.empty()) failure = std::string("flame_graph_capture_end: ") + flame_last_error_message();
  if (!failure.empty()) {
    flame_graph_release(g);
    disable(std::string("capturing ") + what + " failed: " + failure);
    return nullptr;
  }
  return g;
}

double StepGraphs::eager_micro(const StepInputs& in) {
  Tensor loss = loss_and_backward(ctx_, model_, objective_, in, accumulation_steps_);
  return item(loss.get());
}

void StepGraphs::capture_bucket(const BucketKey& key, const StepInputs& first) {
  auto b = std::make_unique<BucketGraph>();
  b->inputs = static_copy(first);
  BucketGraph& ref = *b;
  ref.graph = capture([&] { ref.loss = loss_and_backward(ctx_, model_, objective_, ref.inputs, accumulation_steps_); },
                      "a micro-batch");
  if (ref.graph) buckets_.emplace(key, std::move(b));
}

double StepGraphs::run_micro(const StepInputs& in) {
  if (!enabled_) return eager_micro(in);
  const BucketKey key = {in.batch, in.channels, in.height, in.width, in.tokens};
  auto it = buckets_.find(key);
  if (it == buckets_.end()) {
    const double loss = eager_micro(in);  // the bucket's warm-up is a real micro-batch
    capture_bucket(key, in);
    return loss;
  }
  BucketGraph& b = *it->second;
  refill(b.inputs, in);
  check(flame_graph_replay(b.graph), "flame_graph_replay");
  return item(b.loss.get());
}

void StepGraphs::run_update(const std::function<void()>& update) {
  if (update_graph_) {
    check(flame_graph_replay(update_graph_), "flame_graph_replay (update)");
    return;
  }
  update();
  if (enabled_ && !update_captured_) {
    update_captured_ = true;
    update_graph_ = capture(update, "the update");
  }
}

}  // namespace flame_train

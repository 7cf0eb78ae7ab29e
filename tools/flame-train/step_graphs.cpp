// The training step as CUDA graphs per bucket (see step_graphs.h).
#include "step_graphs.h"

#include <cstdio>
#include <exception>
#include <memory>
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

// The adapter's gradients at one moment, to put back after a micro-batch failed half-way (its
// backward may have added to some of them). A parameter without a gradient gets none back.
class GradientSnapshot {
 public:
  explicit GradientSnapshot(flame_params_t adapter) {
    const flame_tensor_t* tensors = nullptr;
    int64_t n = 0;
    check(flame_params_count(adapter, &n), "flame_params_count");
    check(flame_params_tensors(adapter, &tensors), "flame_params_tensors");
    for (int64_t i = 0; i < n; ++i) {
      Saved s;
      s.param = tensors[i];
      Tensor grad;
      check(flame_tensor_grad(tensors[i], grad.out()), "flame_tensor_grad");
      if (grad.get()) check(flame_clone(grad.get(), s.copy.out()), "flame_clone (gradient snapshot)");
      saved_.push_back(std::move(s));
    }
  }

  void restore() const {
    for (const Saved& s : saved_) {
      Tensor grad;
      check(flame_tensor_grad(s.param, grad.out()), "flame_tensor_grad");
      if (!s.copy.get()) {
        check(flame_tensor_set_grad(s.param, nullptr), "flame_tensor_set_grad");
      } else if (grad.get()) {  // in place: the same .grad memory as before
        check(flame_copy(grad.get(), s.copy.get()), "flame_copy (gradient snapshot)");
      } else {
        Tensor back;
        check(flame_clone(s.copy.get(), back.out()), "flame_clone (gradient snapshot)");
        check(flame_tensor_set_grad(s.param, back.get()), "flame_tensor_set_grad");
      }
    }
  }

 private:
  struct Saved {
    flame_tensor_t param = nullptr;  // borrowed from the adapter
    Tensor copy;                     // empty: no gradient
  };
  std::vector<Saved> saved_;
};

bool out_of_memory(const FlameError& e) { return e.status() == FLAME_ERROR_OUT_OF_MEMORY; }

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

StepGraphs::StepGraphs(flame_ctx_t ctx, flame_model_t model, flame_params_t adapter, const Objective& objective,
                       int accumulation_steps, bool enabled)
    : ctx_(ctx),
      model_(model),
      adapter_(adapter),
      objective_(objective),
      accumulation_steps_(accumulation_steps),
      enabled_(enabled) {}

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
  if (flame_graph_capture_begin_shared(ctx_, pool_owner()) != FLAME_OK) {  // e.g. no memory for the pool
    disable(std::string("starting the capture of ") + what + " failed: " + flame_last_error_message());
    return nullptr;
  }
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

// A new bucket's first micro-batch while other graphs hold their pool (see step_graphs.h).
double StepGraphs::warm_up_beside_graphs(const StepInputs& in) {
  std::unique_ptr<GradientSnapshot> before;
  try {
    before = std::make_unique<GradientSnapshot>(adapter_);
    return eager_micro(in);
  } catch (const FlameError& e) {
    if (!out_of_memory(e)) throw;
    disable(std::string("a new batch shape ran out of memory beside the graphs' pool: ") + e.what());
  }
  if (before) before->restore();
  return eager_micro(in);
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
    // the bucket's warm-up is a real micro-batch
    const double loss = buckets_.empty() && !update_graph_ ? eager_micro(in) : warm_up_beside_graphs(in);
    if (!enabled_) return loss;  // the warm-up gave the graphs up
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

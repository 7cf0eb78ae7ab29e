// The training step as CUDA graphs (training.cuda_graphs, on by default where the step allows it):
// one graph per batch shape ("bucket": B, C, H, W, T) of a micro-batch's loss_and_backward
// (training_step.h), and one of the update (clipping, optimizer step, gradients zeroed in place).
//
// The first micro-batch of a bucket runs eagerly (it is also the warm-up that compiles kernels and
// picks matrix-product algorithms), then its work is captured with static copies of its inputs;
// later micro-batches of that bucket copy their inputs into the static ones on the device
// (flame_copy: the noise, latents and draws are made eagerly, outside the graph, so every replay
// equals the eager step) and replay. The update is captured after its first eager run; the
// learning rate is set between replays. Gradients are zeroed in place rather than dropped so that the
// graphs keep accumulating into the same .grad memory.
//
// Memory: every graph of a run shares one private pool (flame_graph_capture_begin_shared), so the
// graphs of N buckets hold about one step's transient memory, not N. A loss read right after its
// replay is never overwritten by another graph of the pool.
//
// If a capture fails (an operation that a graph cannot hold, or no memory for it), the graphs are
// dropped, a note is printed once, and training goes on eagerly. A new bucket's eager warm-up runs
// outside the graphs' pool, so next to a pool that holds a step's transient memory it can run out of
// memory where an eager run would not: the adapter's gradients are copied first (small next to the
// step), and on running out of memory the graphs are dropped (their pool freed), the gradients put
// back and the micro-batch run again eagerly. No micro-batch is lost or counted twice.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "config.h"
#include "flame_handles.h"
#include "training_step.h"

namespace flame_train {

// Why the configuration's step cannot be a graph ("" when it can): training.cuda_graphs false, LoRA
// dropout (random numbers inside the step), offloaded weights (streamed with host work per block).
std::string graphs_blocker(const TrainConfig& config);

class StepGraphs {
 public:
  // enabled false: every micro-batch and update runs eagerly (graphs_blocker named a reason).
  // adapter: the trained parameters, whose gradients a new bucket's warm-up may have to put back.
  StepGraphs(flame_ctx_t ctx, flame_model_t model, flame_params_t adapter, const Objective& objective,
             int accumulation_steps, bool enabled);
  ~StepGraphs();
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  // The micro-batch's (weighted, undivided) loss; its gradients accumulated into the adapter.
  double run_micro(const StepInputs& in);
  // The update: update() eagerly the first time (it must zero the gradients in place), then as a
  // replay of its capture.
  void run_update(const std::function<void()>& update);

  bool enabled() const { return enabled_; }
  size_t graph_count() const { return buckets_.size() + (update_graph_ ? 1 : 0); }
  size_t bucket_count() const { return buckets_.size(); }

 private:
  using BucketKey = std::array<int64_t, 5>;  // B, C, H, W, T
  struct BucketGraph {
    StepInputs inputs;  // the static inputs the graph reads
    Tensor loss;        // written by every replay
    flame_graph_t graph = nullptr;
  };

  double eager_micro(const StepInputs& in);
  double warm_up_beside_graphs(const StepInputs& in);
  void capture_bucket(const BucketKey& key, const StepInputs& first);
  flame_graph_t capture(const std::function<void()>& work, const char* what);
  void disable(const std::string& why);
  flame_graph_t pool_owner() const;

  flame_ctx_t ctx_;
  flame_model_t model_;
  flame_params_t adapter_;
  const Objective& objective_;
  int accumulation_steps_;
  bool enabled_ = true;
  std::map<BucketKey, std::unique_ptr<BucketGraph>> buckets_;
  flame_graph_t update_graph_ = nullptr;
  bool update_captured_ = false;  // tried once
};

}  // namespace flame_train

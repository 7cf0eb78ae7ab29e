// Data parallel training over several GPUs of one machine in one process (training.gpus = N > 1,
// `--gpus N`), with FLAME's one-process mode of the distributed section of flame.h:
//
//   set-up     N must not exceed the GPUs from training.device on (else a clear error naming how many
//              there are); one context per GPU (devices training.device .. + N - 1, all seeded with
//              training.seed); NCCL must load (else a clear error with the loader's reason); the
//              memory check and the caching stage run once, on rank 0's context; then
//              flame_comm_create_group makes the N ranks of one communicator from this thread.
//   ranks      one thread per rank, each running the whole training loop (run_training, trainer.h)
//              on its own context with its own model, adapter, optimizer (and EMA); flame_dp_create
//              over the adapter's tensors broadcasts rank 0's values, so every rank starts equal.
//   a step     each rank trains its part of the global batch (global_batch.h: batch_size x N
//              samples, rank r the r-th contiguous part), its noise and timesteps keyed by each
//              sample's place in the global batch (batch_noise.h), so the draws do not depend on the
//              rank; gradient accumulation micro-steps but the last run with sync off; flame_dp_wait
//              averages the gradients before clipping and the optimizer step, which are then the same
//              on every rank: every rank's adapter stays identical. The logged loss is the global
//              batch's mean (an all-reduce of each rank's share).
//   end        the ranks' adapters are compared (a hash of their bits): a difference is an error on
//              every rank, before rank 0 writes the final files.
//   output     rank 0 alone writes the LoRA files, the state, the JSONL log, the progress line and
//              the sample images; the others wait at the next collective.
// A rank that fails makes the others fail at their next collective after the communicator's
// timeout (10 minutes); the first failing rank's error is reported.
#pragma once

#include <string>

#include <flame.h>

#include "config.h"
#include "flame_handles.h"
#include "train_state.h"

namespace flame_train {

struct TrainResult;

// One rank's communicator and gradient synchroniser, used by run_training (trainer.h) when given.
class DataParallelRank {
 public:
  // Takes comm (a rank of flame_comm_create_group; released with this object, on its thread).
  DataParallelRank(flame_comm_t comm, int rank, int world, std::string cache_file);
  ~DataParallelRank();
  DataParallelRank(const DataParallelRank&) = delete;
  DataParallelRank& operator=(const DataParallelRank&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }
  bool main() const { return rank_ == 0; }  // rank 0 writes files, logs and samples
  const std::string& cache_file() const { return cache_file_; }  // the caching stage's, "" for --demo

  // Collective: flame_dp_create over the adapter's tensors (rank 0's values broadcast to every rank).
  void attach(flame_params_t adapter);
  // Before each backward: sync on (all-reduce the gradients) for the step's last micro-step only.
  void set_sync(bool sync);
  // After the step's backwards: the averaged gradients in .grad (flame_dp_wait).
  void wait();
  // Collective: the mean over the ranks of value (each rank's loss share: global_batch.h).
  double mean_over_ranks(flame_ctx_t ctx, double value);
  // Collective: whether every rank's adapter holds the same bits (a 64-bit FNV-1a hash of each rank's
  // tensors, its minimum and maximum over the ranks compared). The same answer on every rank.
  bool adapters_identical(flame_ctx_t ctx, flame_params_t adapter);

 private:
  using Comm = Owned<flame_comm_t, flame_comm_release>;
  using Dp = Owned<flame_dp_t, flame_dp_release>;
  Comm comm_;
  Dp dp_;
  int rank_, world_;
  std::string cache_file_;
};

// The whole data-parallel run (see above): rank 0's result. Throws std::runtime_error for too few
// GPUs or no NCCL (before any model is loaded), FlameError / std::runtime_error as run_training
// for the first rank that failed (its message prefixed with "rank R: ").
TrainResult run_data_parallel_training(const TrainConfig& config, bool demo, const TrainState* resume_from);

}  // namespace flame_train

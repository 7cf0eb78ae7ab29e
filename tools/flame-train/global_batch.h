// How a data-parallel run (data_parallel.h) cuts each global batch among its GPUs, as kohya and
// accelerate do: the global batch is training.batch_size x training.gpus samples of the epoch's
// order (plan_epoch_batches with that size), and rank r trains the contiguous part
// [r k / N, (r + 1) k / N) of a global batch of k samples (k = batch_size x N except for a bucket's
// last, shorter batch). The parts are disjoint, cover the global batch, and depend only on the data
// order and the rank: the same on every run and machine. Host arithmetic only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace flame_train {

struct RankShare {
  std::vector<size_t> batch;    // this rank's sample indices (empty when k < N and the rank gets none)
  uint64_t first_position = 0;  // the place of batch[0] in the global batch (batch_noise.h keys on it)
  // The factor on this rank's mean loss so that the average over the N ranks of the scaled means
  // (what the gradient all-reduce computes) is the global batch's mean: size x N / k (1 for equal parts).
  double loss_scale = 1.0;
};

// Rank rank's part of global (world >= 1, 0 <= rank < world).
RankShare rank_share(const std::vector<size_t>& global, int rank, int world);

}  // namespace flame_train

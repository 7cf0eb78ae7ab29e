// The rank's part of a global batch (see global_batch.h).
#include "global_batch.h"

#include <stdexcept>
#include <string>

namespace flame_train {

RankShare rank_share(const std::vector<size_t>& global, int rank, int world) {
  if (world < 1 || rank < 0 || rank >= world)
    throw std::invalid_argument("rank_share: rank " + std::to_string(rank) + " of " + std::to_string(world));
  const size_t k = global.size(), n = static_cast<size_t>(world), r = static_cast<size_t>(rank);
  const size_t begin = r * k / n, end = (r + 1) * k / n;
  RankShare share;
  share.batch.assign(global.begin() + static_cast<std::ptrdiff_t>(begin), global.begin() + static_cast<std::ptrdiff_t>(end));
  share.first_position = begin;
  share.loss_scale = k == 0 ? 0.0 : static_cast<double>(end - begin) * static_cast<double>(n) / static_cast<double>(k);
  return share;
}

}  // namespace flame_train

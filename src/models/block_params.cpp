// Learning which parameters each block reads (block_params.h).
#include "models/block_params.h"

namespace flame::models {

void BlockParams::begin_forward() {
  if (learnt_) return;
  learning_ = true;
  blocks_.clear();
  block_pos_.clear();
  owner_.clear();
  active_.clear();
}

void BlockParams::end_forward() {
  if (!learning_) return;
  learning_ = false;
  learnt_ = true;
  active_.clear();
}

void BlockParams::enter(int64_t block_index) {
  if (!block_pos_.count(block_index)) {
    block_pos_.emplace(block_index, blocks_.size());
    blocks_.push_back(Block{block_index, {}});
  }
  active_.push_back(block_index);
}

void BlockParams::leave() noexcept {
  if (!active_.empty()) active_.pop_back();
}

void BlockParams::record_use(const std::string& name) {
  if (!learning_) return;
  const int64_t block = active_.empty() ? -1 : active_.back();
  auto it = owner_.find(name);
  if (it == owner_.end()) {
    owner_.emplace(name, block);
    if (block >= 0) blocks_[block_pos_.at(block)].names.push_back(name);
  } else if (it->second != block) {
    it->second = -1;  // read by two blocks, or outside blocks: belongs to none
  }
}

int64_t BlockParams::owner(const std::string& name) const {
  auto it = owner_.find(name);
  return it == owner_.end() ? -1 : it->second;
}

std::vector<std::string> BlockParams::owned(const Block& b) const {
  std::vector<std::string> out;
  for (const std::string& n : b.names)
    if (owner(n) == b.index) out.push_back(n);
  return out;
}

}  // namespace flame::models

// Which parameters each repeated block of a model reads, learnt in the model's first forward: every
// Model::param call made while Model::run_block runs block i belongs to block i; a parameter read
// outside blocks or by two blocks belongs to none. The two features that fetch a block's weights
// just before it runs (weight_offload.h: from pinned host memory; param_sharding.h: all-gathered
// from every rank's shard) plan from this map. A forward that fails half-way leaves nothing learnt:
// the next forward learns afresh.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace flame::models {

class BlockParams {
 public:
  struct Block {
    int64_t index = 0;
    std::vector<std::string> names;  // parameters first read inside this block, in first-use order
  };

  // Bracket every forward of the model: the first forward (until one completes) learns.
  void begin_forward();
  void end_forward();
  bool learning() const { return learning_; }
  bool learnt() const { return learnt_; }

  // A block's scope while learning (nested blocks: the innermost owns what it reads).
  void enter(int64_t block_index);
  void leave() noexcept;
  // Records that the current block (or no block) read parameter name; only while learning.
  void record_use(const std::string& name);

  // The blocks in first-entry order (execution order of the learning forward).
  const std::vector<Block>& blocks() const { return blocks_; }
  // The block that alone reads name, or -1 (shared, read outside blocks, or never read).
  int64_t owner(const std::string& name) const;
  // The parameters block b owns (read by b alone), in first-use order.
  std::vector<std::string> owned(const Block& b) const;

 private:
  bool learning_ = false, learnt_ = false;
  std::vector<Block> blocks_;
  std::unordered_map<int64_t, size_t> block_pos_;   // index -> position in blocks_
  std::unordered_map<std::string, int64_t> owner_;  // param -> block index, -1: shared
  std::vector<int64_t> active_;                     // blocks entered, innermost last
};

// Enters a block of a learner for a scope (also left on an exception); does nothing once learnt.
class BlockLearnScope {
 public:
  BlockLearnScope(BlockParams& b, int64_t block_index) : b_(b.learning() ? &b : nullptr) {
    if (b_) b_->enter(block_index);
  }
  ~BlockLearnScope() {
    if (b_) b_->leave();
  }
  BlockLearnScope(const BlockLearnScope&) = delete;
  BlockLearnScope& operator=(const BlockLearnScope&) = delete;

 private:
  BlockParams* b_;
};

}  // namespace flame::models

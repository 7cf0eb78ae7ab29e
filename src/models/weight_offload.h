// Offload of a model's frozen block weights (the model option "offload"): blocks whose weights do
// not fit a device budget keep them in pinned, device-mapped host memory and are streamed into a
// preallocated ring of device buffers on a copy stream of their own, ahead of use.
//
//  - Which parameters a block reads is learnt in the model's first forward: every Model::param call
//    made while Model::run_block runs block i belongs to block i (a parameter read outside blocks
//    or by two blocks belongs to none and stays resident). At the end of that forward (or of a later
//    one, until some block has all its parameters frozen) the plan is made once: blocks whose
//    parameters all have requires_grad false are offloaded in execution order until the
//    parameters left on the device plus the ring fit the budget. Each offloaded block's parameters
//    move into one pinned host buffer laid out as a ring slot; the parameter tensors keep their
//    identity and now view that buffer through its device mapping (so saving, reading and
//    flame_model_params still work, at PCIe speed).
//  - The ring: `slots` device buffers of the largest offloaded block's size, allocated once. Entering
//    an offloaded block waits (cuStreamWaitEvent, never the host) for its slot's copy; param() then
//    returns views of the slot; the next offloaded block in execution order (forward) or reverse
//    order (a checkpoint's recompute during backward) is copied into a free slot meanwhile. A slot's
//    views share one Storage whose release records the slot's "released" event on the compute
//    stream: the slot is refilled (the copy stream waits on that event) only after the last tensor
//    viewing it, autograd's saved weights included, is gone and every kernel enqueued before that
//    has finished. A slot still held when it would be needed is not reused: the block then reads
//    the mapped host memory directly (same results, slower).
//  - Offloaded blocks always run through gradient checkpointing when a graph is recorded (their
//    forward keeps no weight; the recompute in backward fetches them again), whatever the model's
//    checkpoint policy says.
//  - An offloaded parameter must stay frozen: a use after requires_grad was turned on fails with
//    FLAME_ERROR_INVALID_ARGUMENT. Offload is not available during a CUDA graph capture.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>
#include <nlohmann/json.hpp>
#include "tensor/tensor.h"

namespace flame::models {

// The model option "offload": {"budget_bytes": N} or {"budget_fraction": f} (exactly one), and
// optionally "slots" (ring buffers, >= 2, default 2).
struct OffloadOptions {
  bool enabled = false;
  uint64_t budget_bytes = 0;     // used when budget_fraction < 0
  double budget_fraction = -1;   // of the model's parameter bytes, in (0, 1]
  int32_t slots = 2;
  // The device bytes allowed for parameters (ring included) of a model of total_bytes.
  uint64_t budget_for(uint64_t total_bytes) const;
};

// Parses the value of the "offload" key (null: disabled). Anything else than an object with exactly
// one budget key of the right type and range, or an unknown key: FLAME_ERROR_INVALID_ARGUMENT
// naming the key.
OffloadOptions parse_offload_options(const nlohmann::json& value);

class WeightOffload {
 public:
  WeightOffload(Context& ctx, const OffloadOptions& options);
  ~WeightOffload();
  WeightOffload(const WeightOffload&) = delete;
  WeightOffload& operator=(const WeightOffload&) = delete;

  // Bracket every forward: the first forward learns the blocks; the plan is made at an end.
  void begin_forward();
  // names / tensors: the model's parameters (ParamStore order). The plan's errors (a budget that
  // cannot be met: FLAME_ERROR_INVALID_ARGUMENT) leave everything as it was.
  void end_forward(const std::vector<std::string>& names, const std::vector<Tensor>& tensors);

  // Whether block index's weights live in host memory (then it runs checkpointed when recording).
  bool offloads(int64_t block_index) const;

  // Block scope: enter before the block's body runs, leave after it returned. recompute: the body is
  // a checkpoint's recompute during backward (blocks then come in reverse order).
  void enter_block(int64_t block_index, bool recompute);
  void leave_block() noexcept;

  // The tensor the model computes with for parameter name (stored: its ParamStore tensor): a view of
  // the ring slot while its block is active, else stored. Records the use in the first forward.
  Tensor use(const std::string& name, const Tensor& stored);

 private:
  struct Ring;  // device slots, copy stream and events (weight_offload.cpp)
  struct Block {
    int64_t index = 0;
    std::vector<std::string> names;  // parameters read only by this block, in first-use order
  };
  struct Placement {                  // an offloaded parameter
    int64_t block = 0;
    int64_t offset_elements = 0;      // in the block's host buffer and slot
  };
  struct Chosen {                     // a block the plan offloads, and its layout
    size_t block = 0;                 // position in blocks_
    std::vector<size_t> params;       // indices into the model's parameters
    std::vector<size_t> offsets;      // byte offsets in the slot (256-byte aligned)
    size_t bytes = 0;                 // slot bytes it needs
  };
  struct Active {
    int64_t block = 0;
    int slot = -1;                    // -1: not offloaded, or no free slot (reads host memory)
    std::shared_ptr<Storage> storage;  // the slot's views share it
  };

  void plan(const std::vector<std::string>& names, const std::vector<Tensor>& tensors);
  void apply(const std::vector<Tensor>& tensors, const std::vector<Chosen>& chosen, size_t slot_bytes);
  int64_t next_offloaded(int64_t block_index, bool reverse) const;

  std::shared_ptr<Context> ctx_;
  OffloadOptions options_;
  // learning the blocks
  bool learning_ = true, learnt_ = false, planned_ = false, warned_unfrozen_ = false;
  std::vector<Block> blocks_;                                   // in first-entry order
  std::unordered_map<int64_t, size_t> block_pos_;               // index -> position in blocks_
  std::unordered_map<std::string, int64_t> owner_;              // param -> block index, -1: shared
  // the plan
  std::unordered_map<std::string, Placement> placed_;
  std::vector<int64_t> offloaded_;                              // sorted block indices
  std::shared_ptr<Ring> ring_;
  std::vector<Active> active_;                                  // nested blocks, innermost last
};

// Enters a block for a scope and leaves it when the scope ends (also on an exception).
class OffloadedBlockScope {
 public:
  OffloadedBlockScope(WeightOffload& o, int64_t block_index, bool recompute) : o_(o) { o.enter_block(block_index, recompute); }
  ~OffloadedBlockScope() { o_.leave_block(); }
  OffloadedBlockScope(const OffloadedBlockScope&) = delete;
  OffloadedBlockScope& operator=(const OffloadedBlockScope&) = delete;

 private:
  WeightOffload& o_;
};

}  // namespace flame::models

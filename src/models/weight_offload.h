// Offload of a model's frozen block weights (the model option "offload"): blocks whose weights do
// not fit a device budget keep them in pinned, device-mapped host memory and are streamed into a
// preallocated ring of device buffers on a copy stream of their own, ahead of use.
//
//  - Which parameters a block reads is learnt in the model's first forward (block_params.h; a
//    parameter read outside blocks or by two blocks belongs to none and stays resident). At the
//    end of that forward (or of a later one, until some block has all its parameters frozen) the
//    plan is made once: blocks whose parameters all have requires_grad false are offloaded in
//    execution order until the parameters left on the device plus the ring fit the budget. Each
//    offloaded block's parameters move into one pinned host buffer laid out as a ring slot; the
//    parameter tensors keep their identity and now view that buffer through its device mapping (so
//    saving, reading and flame_model_params still work, at PCIe speed).
//  - The ring (block_fetch.h, shared with parameter sharding): `slots` device buffers of the largest
//    offloaded block's size, allocated once, filled by copies from the host buffers on a copy
//    stream, the next offloaded block's copy overlapping the current block's kernels. A slot still
//    held when it would be needed is not reused: the block then reads the mapped host memory
//    directly (same results, slower).
//  - Offloaded blocks always run through gradient checkpointing when a graph is recorded (their
//    forward keeps no weight; the recompute in backward fetches them again), whatever the model's
//    checkpoint policy says.
//  - An offloaded parameter must stay frozen: a use after requires_grad was turned on fails with
//    FLAME_ERROR_INVALID_ARGUMENT. Offload is not available during a CUDA graph capture.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "models/block_fetch.h"
#include "models/block_params.h"
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

  // After every forward, while no plan is made: plans from the blocks learnt (blocks.learnt()).
  // names / tensors: the model's parameters (ParamStore order). The plan's errors (a budget that
  // cannot be met: FLAME_ERROR_INVALID_ARGUMENT) leave everything as it was.
  void end_forward(const BlockParams& blocks, const std::vector<std::string>& names, const std::vector<Tensor>& tensors);

  // The fetcher of the offloaded blocks (their weights copied into a ring slot), null until the
  // plan offloaded some.
  const std::shared_ptr<BlockFetch>& fetch() const { return fetch_; }
  // Whether block index's weights live in host memory (then it runs checkpointed when recording).
  bool offloads(int64_t block_index) const { return fetch_ && fetch_->fetches(block_index); }

  // The tensor the model computes with for parameter name (stored: its ParamStore tensor): a view of
  // the ring slot while its block is active, else stored.
  Tensor use(const std::string& name, const Tensor& stored);

 private:
  struct Chosen {                     // a block the plan offloads, and its layout
    int64_t block = 0;                // its index
    std::vector<std::string> names;   // its own parameters
    std::vector<size_t> params;       // indices into the model's parameters
    std::vector<size_t> offsets;      // byte offsets in the slot (256-byte aligned)
    size_t bytes = 0;                 // slot bytes it needs
  };

  void plan(const BlockParams& blocks, const std::vector<std::string>& names, const std::vector<Tensor>& tensors);
  void apply(const std::vector<Tensor>& tensors, const std::vector<Chosen>& chosen, size_t slot_bytes);

  std::shared_ptr<Context> ctx_;
  OffloadOptions options_;
  bool planned_ = false, warned_unfrozen_ = false;
  std::shared_ptr<BlockFetch> fetch_;
};

}  // namespace flame::models

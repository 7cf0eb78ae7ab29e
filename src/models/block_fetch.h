// Fetching a block's weights into device memory just before the block runs, shared by the model
// option "offload" (weight_offload.h: copies from pinned host memory) and parameter sharding
// (param_sharding.h: all-gathers from every rank's shard). Each fetched block has a Source that
// enqueues the fetch of its weights into a device buffer on a stream; BlockFetch owns that stream
// and a ring of `slots` device buffers of slot_bytes each, allocated once.
//
//  - Entering a fetched block waits (cuStreamWaitEvent, never the host) for its slot's fetch; views
//    of the slot (active_view) are what the block computes with; the next fetched block in
//    execution order (forward) or reverse order (a checkpoint's recompute during backward) is
//    fetched into a free slot meanwhile, on the fetch stream.
//  - A slot's views share one Storage; the slot is refilled only after the last tensor viewing it
//    (autograd's saved weights included) is gone. Every fill first makes the fetch stream wait for
//    everything enqueued on the compute stream so far: the kernels that read the slot's previous
//    contents, and any write to the weights being fetched.
//  - A slot keeps its block's weights until it is refilled: re-entering that block while the
//    Source's version is unchanged fetches nothing (the last block of a forward is still there
//    when its recompute starts the backward).
//  - A slot still held when it would be needed is not reused: the overflow function then makes
//    the block's weights another way (offload: none, the block reads host memory in place;
//    sharding: a one-off buffer gathered on the compute stream).
// The host's decisions (which block goes to which slot, when to fetch) depend only on the order of
// calls, tensor lifetimes and the Sources' versions, so ranks running the same program make the
// same ones, in the same order, as long as a Source whose fetch is a collective reports the same
// versions on every rank: the sharding's collectives on the fetch stream then match across ranks.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>
#include "tensor/tensor.h"

namespace flame::models {

class BlockFetch {
 public:
  // How one block's weights reach device memory.
  struct Source {
    // Enqueues the fetch of the block's weights into dst (slot_bytes long) on stream s.
    std::function<void(CUdeviceptr dst, CUstream s)> fetch;
    // A number that changes whenever the weights to fetch change (their version counters).
    std::function<uint64_t()> version;
  };
  struct Placement {
    int64_t block = 0;
    int64_t offset_elements = 0;  // in the block's slot, in elements of the parameter's dtype
  };
  // The block's weights when every slot is held: a Storage holding them, ready in compute-stream
  // order, or null to compute with the stored tensors.
  using Overflow = std::function<std::shared_ptr<Storage>(int64_t block)>;

  // feature names the user-facing feature in errors ("the model option \"offload\"").
  BlockFetch(Context& ctx, int slots, size_t slot_bytes, std::string feature);
  ~BlockFetch();
  BlockFetch(const BlockFetch&) = delete;
  BlockFetch& operator=(const BlockFetch&) = delete;

  size_t slot_bytes() const;
  CUstream fetch_stream() const;
  // Makes the fetch stream wait for everything enqueued on the compute stream so far.
  void fetch_after_compute();
  // Makes the compute stream wait for everything enqueued on the fetch stream so far (before the
  // weights a fetch in flight reads are written).
  void compute_after_fetch();

  // Setup, before the first enter_block: the blocks fetched, each parameter's place, the overflow.
  void add_block(int64_t block, Source source);
  void place(const std::string& name, Placement p);
  void set_overflow(Overflow f) { overflow_ = std::move(f); }

  bool fetches(int64_t block) const;
  const Placement* placement(const std::string& name) const;

  // Block scope: enter before the block's body runs, leave after it returned. recompute: the body
  // is a checkpoint's recompute during backward (blocks then come in reverse order).
  void enter_block(int64_t block, bool recompute);
  void leave_block() noexcept;
  // A view (shape and dtype of stored) of parameter name in its block's fetched weights while that
  // block is active and has them; null otherwise (not placed, outside its block, or an overflow
  // that returned null).
  Tensor active_view(const std::string& name, const Tensor& stored) const;
  // The fetched weights of block while it is active (the Storage its views share); null otherwise.
  std::shared_ptr<Storage> active_storage(int64_t block) const;

 private:
  struct Ring;  // slots, stream and events (block_fetch.cpp)
  struct Active {
    int64_t block = 0;
    std::shared_ptr<Storage> storage;  // the block's fetched weights (views share it), or null
  };
  int64_t next_fetched(int64_t block, bool reverse) const;

  std::shared_ptr<Context> ctx_;
  std::string feature_;
  std::shared_ptr<Ring> ring_;
  std::vector<int64_t> blocks_;  // sorted
  std::unordered_map<std::string, Placement> placed_;
  Overflow overflow_;
  std::vector<Active> active_;  // nested blocks, innermost last
};

// Enters a block for a scope and leaves it when the scope ends (also on an exception).
class FetchedBlockScope {
 public:
  FetchedBlockScope(BlockFetch& f, int64_t block, bool recompute) : f_(f) { f.enter_block(block, recompute); }
  ~FetchedBlockScope() { f_.leave_block(); }
  FetchedBlockScope(const FetchedBlockScope&) = delete;
  FetchedBlockScope& operator=(const FetchedBlockScope&) = delete;

 private:
  BlockFetch& f_;
};

}  // namespace flame::models

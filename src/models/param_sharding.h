// Parameter sharding of a model's blocks over the ranks of a communicator (ZeRO-3, as PyTorch FSDP):
// the ShardedParameters of ZeroOptimizer's stage 3 (toolkit/zero.h), made by flame_zero_create.
//
// Layout (made once, from the blocks the model learnt in its first forward, block_params.h): every
// block whose own parameters share one dtype forms one flat of its parameters in first-use order,
// each starting on a 256-byte boundary, padded to world * S elements (S a multiple of 256 bytes);
// rank r keeps the elements [r*S, (r+1)*S) as its shard, a device tensor of its own. The parameter
// tensors then give their memory up: they keep name, shape, dtype and requires_grad, over an empty
// Storage (holds_no_data), so that reading them outside their block is refused rather than wrong.
// Parameters read outside blocks or by two blocks stay whole on every rank.
//
// Forward: a sharded block runs through the ring of block_fetch.h, whose Source all-gathers the
// block's shards into a slot on the fetch stream, the next block's gather overlapping the current
// block's kernels; Model::param returns views of the slot. Sharded blocks always run checkpointed
// while a graph is recorded: the forward keeps no gathered weight, and the recompute in backward
// gathers them again (in reverse order, prefetching the block before).
// Backward: in the recompute, the views of parameters that require grad are the outputs of one
// ShardGather node per block entry. Its backward packs their gradients into a flat (zeros where none
// arrived), reduce-scatters it (average) on the compute stream and adds this rank's part to the
// block's gradient shard, which accumulates over backwards until the step consumes it. A flame_grad
// walk does not ask for these gradients (the node then does nothing).
// Collectives: all-gathers on the fetch stream, reduce-scatters on the compute stream, one
// communicator; every rank makes the same calls in the same order (same program, same blocks: the
// layout is compared across ranks before anything changes).
// Mixed precision of communication (flame_zero_options_t): reduce_dtype packs the gradients cast to
// it, reduce-scatters in it and adds the average cast back to the flat's dtype to the gradient
// shard. gather_dtype bf16 for an f32 flat: each rank keeps a bf16 copy of its shard (refreshed on
// the compute stream at the first block entry after a step or at shard()), the Source all-gathers
// those copies into the slot's tail (its f32 part is world * S * 4 bytes, the tail world * S * 2),
// and entering the block widens the tail into the f32 part on the compute stream before the block's
// views are made. gather_params reads the f32 shards themselves (exact values).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>
#include "dist/comm.h"
#include "models/block_fetch.h"
#include "models/model.h"
#include "tensor/autograd_graph.h"
#include "toolkit/zero.h"

namespace flame::models {

class ParamSharding : public ShardedParameters, public std::enable_shared_from_this<ParamSharding> {
 public:
  // o: gather_slots (ring buffers of gathered blocks, >= 2), reduce_dtype and gather_dtype, checked
  // by validate_zero_options. Nothing changes before shard().
  ParamSharding(std::shared_ptr<Model> model, std::shared_ptr<Comm> comm, const flame_zero_options_t& o);

  // ShardedParameters (toolkit/zero.h).
  void check(Comm& comm) override;
  void shard(bool broadcast) override;
  bool part(const TensorImpl& p, Part* out) const override;
  void before_step() override;
  std::vector<Tensor> gradient_shards() override;
  void consume_gradients() noexcept override;

  // Whether block's parameters are sharded (the block then runs through enter_block / leave_block).
  bool shards(int64_t block) const { return fetch_ && fetch_->fetches(block); }
  void enter_block(int64_t block, bool recompute);
  void leave_block() noexcept;
  // What the model computes with for parameter name: a view of its gathered block while that block
  // runs (recorded as an output of the block's ShardGather node when it requires grad), stored for
  // a parameter that is not sharded. A sharded parameter read outside its block:
  // FLAME_ERROR_INVALID_ARGUMENT.
  Tensor use(const std::string& name, const Tensor& stored);

  // Collective: every parameter of the model by name, in the model's order, with the values all
  // ranks hold: the sharded ones gathered into new tensors, the others the model's own tensors.
  std::vector<std::pair<std::string, Tensor>> gather_params();

 private:
  struct Member {
    std::string name;
    Tensor stored;       // the model's parameter tensor
    int64_t offset = 0;  // first element in the flat
  };
  struct Flat {
    int64_t block = 0;
    DType dtype = FLAME_DTYPE_F32;
    int64_t shard = 0;  // S
    std::vector<Member> members;
    Tensor value;       // this rank's shard [S]
    Tensor grad;        // its averaged gradient, accumulated since the last step (null: none)
    bool gather_bf16 = false;  // gather_dtype bf16 and an f32 flat: gathered from value_bf16
    Tensor value_bf16;         // then: value rounded to bf16 [S], as of gathered_epoch_
  };
  struct Where {
    size_t flat = 0, member = 0;
  };
  struct ActiveGather {
    int64_t block = 0;
    std::shared_ptr<Node> node;  // made at the first use that records
  };

  void lay_out(const Model& m);
  void check_same_layout_on_every_rank();
  std::shared_ptr<BlockFetch> make_fetch();
  // This rank's elements of f's flat, copied from the whole parameters into shard (zeros elsewhere).
  void copy_member_parts(const Flat& f, const Tensor& shard);
  void reduce_gradients(size_t flat, const std::vector<Tensor>& grads);
  // gather_dtype bf16: the bf16 copies of the shards, made again when a step changed the shards.
  void refresh_bf16_shards();
  // gather_dtype bf16: the block's gathered bf16 values (the slot's tail) widened into its f32 part.
  void widen_gathered(int64_t block);
  std::shared_ptr<Node> gather_node(size_t flat);

  std::weak_ptr<Model> model_;
  std::shared_ptr<Comm> comm_;
  std::shared_ptr<Context> ctx_;
  int slots_;
  flame_zero_options_t comm_opts_;  // reduce_dtype (zero_reduce_dtype) and gather_dtype
  bool gather_bf16_;                 // gather_dtype bf16 (applies to f32 flats)
  std::vector<Flat> flats_;
  std::unordered_map<std::string, Where> where_;
  std::unordered_map<const TensorImpl*, Where> where_tensor_;
  size_t slot_bytes_ = 0;
  std::shared_ptr<BlockFetch> fetch_;  // set by shard()
  uint64_t epoch_ = 0;                 // steps so far: the version of every block's gathered weights
  uint64_t bf16_epoch_ = 0;            // epoch_ when the bf16 copies of the shards were made
  std::vector<ActiveGather> active_;   // nested block entries, innermost last
};

// Enters a sharded block for a scope and leaves it when the scope ends (also on an exception).
class ShardedBlockScope {
 public:
  ShardedBlockScope(ParamSharding& s, int64_t block, bool recompute) : s_(s) { s.enter_block(block, recompute); }
  ~ShardedBlockScope() { s_.leave_block(); }
  ShardedBlockScope(const ShardedBlockScope&) = delete;
  ShardedBlockScope& operator=(const ShardedBlockScope&) = delete;

 private:
  ParamSharding& s_;
};

}  // namespace flame::models

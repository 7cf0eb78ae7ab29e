// ZeRO-1 and ZeRO-2 (optimizer state sharded over the ranks of a communicator) for the fused
// optimizers (optim/optimizer.h), as DeepSpeed's stages 1 and 2.
//
// Layout: the optimizer's parameters of one dtype, in its order (groups, then parameters), form one
// flat sequence of T elements ("a flat"), padded to world * S with S = ceil(T / world); rank r owns
// the contiguous elements [r*S, (r+1)*S). Each parameter's owned part is the intersection of its
// [offset, offset + numel) with that range; the optimizer (made sharded) keeps state only for it.
//
// A step, per flat, all on the context's stream:
//   1. stage 1: pack every .grad into a flat gradient buffer G (zeros for a parameter without one);
//   2. stage 1: all-reduce (average) G, which stays the parameters' .grad (views, as flame_dp_wait
//      leaves them) and is kept across steps; stage 2: no G: bucket by bucket (at most 256 MiB),
//      each rank's next piece of every shard is packed and reduce-scattered (average) into this
//      rank's shard buffer of S elements, and each .grad is set to none once its last bucket is
//      queued;
//   3. optional clipping over the global 2-norm: squared norms of each rank's shard, summed over
//      the flats, all-reduced, then the gradients scaled on the device (no host wait): stage 1 the
//      whole averaged buffer (it stays .grad), stage 2 the shard;
//   4. the optimizer steps the owned elements (their gradients: views into the shard);
//   5. bucket by bucket, each rank copies its next owned parameter elements into its piece of a
//      bucket, all-gathers it in place, and copies every parameter element back out of it.
// Everything every rank does is in the same order with the same sizes, so NCCL calls match.
// opts->reduce_dtype other than the flat's dtype: step 2 averages a copy cast to it (stage 1: the
// whole of G, cast back into G after; stage 2: buckets of the cast gradients into a shard of that
// dtype, cast back into the shard after).
//
// Stage 3 (parameter sharding, ZeRO-3): the parameters a ShardedParameters object holds (the model
// layer's blocks, models/param_sharding.h) are not in any flat: their values live as each rank's
// shard, their averaged gradients arrive as shards during backward (reduce-scattered block by
// block), and the optimizer steps the owned elements in place in the shard (OptimParam::shard_value);
// nothing is gathered after the step (the next forward gathers each block). Every other parameter
// of the optimizer is treated as in stage 2.
#pragma once
#include <memory>
#include <vector>
#include "dist/comm.h"
#include "flame.h"
#include "optim/optimizer.h"

namespace flame {

void validate_zero_options(const flame_zero_options_t& o);
// The dtype the gradients of parameters of param_dtype are averaged in (opts->reduce_dtype).
DType zero_reduce_dtype(const flame_zero_options_t& o, DType param_dtype);

// Stage 3: parameters whose values live sharded over the ranks, kept by a layer above the toolkit.
// Their tensors hold no memory once sharded; each rank owns a contiguous range of each one's
// elements (possibly empty), which the optimizer updates in place.
class ShardedParameters {
 public:
  virtual ~ShardedParameters() = default;
  // Local checks, made before any collective (their outcome is exchanged: a rank that fails here
  // makes every rank fail). Throws flame::Error.
  virtual void check(Comm& comm) = 0;
  // Collective: shards the parameters (after copying rank 0's values to every rank when broadcast).
  virtual void shard(bool broadcast) = 0;
  struct Part {
    int64_t lo = 0, hi = 0;  // the elements of the parameter this rank owns
    Tensor value;            // those elements in place (1-D, hi - lo; null when hi == lo)
    size_t flat = 0;         // the gradient shard (gradient_shards()) that holds their gradient
    int64_t at = 0;          // from this element of it
  };
  // Whether p is one of the sharded parameters (after shard()); its part in *out.
  virtual bool part(const TensorImpl& p, Part* out) const = 0;
  // Before the optimizer writes the shards: orders the compute stream after every gather in flight.
  virtual void before_step() = 0;
  // This rank's averaged gradient shards, one per flat (zeros where no gradient arrived since the
  // last step): contiguous 1-D tensors the step may scale in place.
  virtual std::vector<Tensor> gradient_shards() = 0;
  // After the step: the gradient shards were used; the next backward starts from zero.
  virtual void consume_gradients() noexcept = 0;
};

class ZeroOptimizer {
 public:
  // Collective: checks, compares the parameter lists of all ranks, broadcasts the parameters (option)
  // and makes the optimizer sharded.
  // Stage 3 needs sharded (the parameters it shards; null for stages 1 and 2).
  ZeroOptimizer(std::shared_ptr<Comm> comm, std::shared_ptr<Optimizer> opt, const flame_zero_options_t& o,
                std::shared_ptr<ShardedParameters> sharded = nullptr);
  // Collective: one step (see above). Returns the global gradient norm (0-d f32) when want_norm or
  // clipping asked for it, else an empty tensor.
  Tensor step(bool want_norm);
  Context& ctx() { return comm_->ctx(); }
  Comm& comm() { return *comm_; }
  Optimizer& optimizer() { return *opt_; }
  // Whether p's values live sharded (stage 3): then this rank holds only its owned elements, in
  // p.shard_value (null when it owns none), and p.param holds no memory.
  bool values_sharded(const OptimParam& p) const;
  // Before writing the stage-3 shards outside a step (flame_zero_load): orders the compute stream
  // after every gather in flight and makes every gathered block (and bf16 gather copy) stale, as a
  // step does. Every rank calls it at the same point. Nothing to do for stages 1 and 2.
  void before_writing_shards() {
    if (sharded_) sharded_->before_step();
  }

 private:
  struct Member {
    OptimParam* param;  // in the optimizer's groups (stable: no group can be added once sharded)
    int64_t offset;     // first element in the flat
  };
  struct Flat {
    DType dtype = FLAME_DTYPE_F32;
    int64_t total = 0;  // T: elements of the parameters
    int64_t shard = 0;  // S: elements per rank
    std::vector<Member> members;
    Tensor grads;  // stage 1: [world * S], kept across steps
  };

  Tensor pack_gradients(Flat& f);
  Tensor reduce_gradients(Flat& f);  // the shard's averaged gradients, [S]
  Tensor reduce_scatter_in_buckets(Flat& f);  // stage 2's reduce_gradients
  void copy_flat_range(const Flat& f, int64_t lo, int64_t hi, const Tensor& dst, bool want_grads);
  // The global 2-norm of the shards' gradients (all ranks); when max_grad_norm > 0, scales the
  // tensors `scaled` (the shards, or the whole flat gradients that contain them) by the clip factor.
  Tensor clip(const std::vector<Tensor>& shards, const std::vector<Tensor>& scaled);
  void gather_parameters(Flat& f);

  std::shared_ptr<Comm> comm_;
  std::shared_ptr<Optimizer> opt_;
  flame_zero_options_t opts_;
  std::vector<Flat> flats_;
  std::shared_ptr<ShardedParameters> sharded_;
  std::vector<std::pair<OptimParam*, ShardedParameters::Part>> sharded_members_;  // stage 3
};

}  // namespace flame

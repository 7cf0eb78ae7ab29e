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
#pragma once
#include <memory>
#include <vector>
#include "dist/comm.h"
#include "flame.h"
#include "optim/optimizer.h"

namespace flame {

void validate_zero_options(const flame_zero_options_t& o);

class ZeroOptimizer {
 public:
  // Collective: checks, compares the parameter lists of all ranks, broadcasts the parameters (option)
  // and makes the optimizer sharded.
  ZeroOptimizer(std::shared_ptr<Comm> comm, std::shared_ptr<Optimizer> opt, const flame_zero_options_t& o);
  // Collective: one step (see above). Returns the global gradient norm (0-d f32) when want_norm or
  // clipping asked for it, else an empty tensor.
  Tensor step(bool want_norm);
  Context& ctx() { return comm_->ctx(); }

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
};

}  // namespace flame

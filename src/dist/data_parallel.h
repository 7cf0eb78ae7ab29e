// Data-parallel training over a communicator (as torch DDP): parameters are broadcast from rank 0
// at creation; post-accumulate hooks copy each gradient into a bucket (buckets are filled in
// reverse parameter order, which is backward order for parameters listed in forward order, split by
// dtype and by bucket_bytes) and all-reduce (average) each bucket on a communication stream as soon
// as all its gradients are in, so communication overlaps the rest of backward; wait() completes the
// round and writes the averages back into .grad.
//
// Buckets are launched strictly in index order (a full bucket waits for the ones before it), so that
// every rank issues the same collectives in the same order whatever order its hooks ran in.
// wait() packs what no hook packed this round (the parameter's .grad, or zeros without one), so a
// rank whose backward skipped a parameter still matches the others.
//
// Streams: gradients are packed on the context's stream; an event recorded there after a bucket's
// last copy makes the communication stream wait before its all_reduce; wait() makes the context's
// stream wait for an event recorded after the last all_reduce, and then polls the communication
// stream from the host with the communicator's timeout (aborting on it). Bucket memory belongs to
// this object and is only reused after that wait, so no cross-stream lifetime question arises.
//
// FLAME's engine runs post-accumulate hooks after its reverse walk (leaf gradients are applied last),
// so the overlap is with the packing of later buckets and with whatever the application queues
// before wait(), not with the backward kernels of earlier layers.
#pragma once
#include <memory>
#include <vector>
#include "tensor/autograd_graph.h"
#include "dist/comm.h"

namespace flame {

class DataParallel {
 public:
  // Collective: every rank must call it with the same parameter list (shapes and dtypes, in order).
  DataParallel(std::shared_ptr<Comm> comm, std::vector<Tensor> params, const flame_dp_options_t& o);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  void set_sync(bool sync) { sync_ = sync; }
  bool sync() const { return sync_; }
  void wait();
  Context& ctx() { return comm_->ctx(); }

  // Called by the post-accumulate hook of parameter i.
  void on_grad_ready(size_t i);

 private:
  struct Slot {
    size_t index = 0;   // parameter index
    size_t bucket = 0;
    int64_t offset = 0;  // in elements, inside the bucket
    bool packed = false;
  };
  struct Bucket {
    DType dtype = FLAME_DTYPE_F32;
    Tensor buf;  // 1-D, the concatenated gradients
    std::vector<size_t> params;
    size_t pending = 0;  // gradients not yet packed this round
    bool launched = false;
    CUevent ready = nullptr;
  };

  void pack(Slot& s);
  void launch_ready();
  void verify_same_parameters(const std::vector<Tensor>& params, bool local_ok, flame_status_t local_status);

  std::shared_ptr<Comm> comm_;
  std::vector<Tensor> params_;
  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;
  std::vector<std::shared_ptr<HookRecord>> hooks_;
  size_t next_launch_ = 0;
  bool sync_ = true;
  CUstream stream_ = nullptr;  // communication stream
  CUevent done_ = nullptr;
};

void validate_dp_options(const flame_dp_options_t& o);

// Collective: exchanges every rank's local_status and (count, dtypes, shapes) of params; a rank
// whose own checks failed returns (its caller reports its error); the others fail with
// FLAME_ERROR_INVALID_ARGUMENT naming that rank ("failed to <what>"), or FLAME_ERROR_SHAPE_MISMATCH
// when the lists differ. Waits with the communicator's timeout.
void verify_same_parameter_lists(Comm& comm, const std::vector<Tensor>& params, flame_status_t local_status,
                                 const char* what);

}  // namespace flame

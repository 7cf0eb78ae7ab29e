// A communicator: one rank of an NCCL communicator bound to one FLAME context (one GPU). It owns
// its NCCL function table (dist/nccl_lib.h), the ncclComm_t and the timeout, and keeps its context
// alive. NCCL runs non-blocking (ncclConfig_t::blocking = 0): every wait polls the stream and
// ncclCommGetAsyncError, and past the timeout calls ncclCommAbort, so that a rank whose peers failed
// or diverged reports an error instead of hanging. An aborted communicator stays unusable: every
// later call on it fails with the reason (FLAME_ERROR_CUDA).
//
// The collectives below run on the context's stream, in order with every other op of the context.
// The data-parallel helper (dist/data_parallel.h) drives its buckets on a stream of its own through
// the raw entry points (enqueue_*) and orders it against the context's stream with events.
#pragma once
#include <nccl.h>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>
#include "dist/nccl_lib.h"
#include "tensor/tensor.h"

namespace flame {

// FLAME_REDUCE_* values of flame.h.
ncclRedOp_t nccl_reduce_op(int32_t op, DType dtype);  // validates op and the (op, dtype) pair
ncclDataType_t nccl_dtype(DType d);                    // FLAME_ERROR_DTYPE_MISMATCH when NCCL has none

class Comm {
 public:
  // ncclGetUniqueId (loads NCCL; needs no communicator).
  static ncclUniqueId unique_id();
  // One rank; waits (up to timeout_ms) until every rank of the communicator has joined.
  static std::shared_ptr<Comm> create(Context& ctx, const ncclUniqueId& id, int rank, int world, int64_t timeout_ms);
  // Ranks 0..n-1 on ctxs[0..n-1], created from one thread inside ncclGroupStart/End.
  static std::vector<std::shared_ptr<Comm>> create_group(const std::vector<Context*>& ctxs, int64_t timeout_ms);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  Context& ctx() { return *ctx_; }
  int rank() const { return rank_; }
  int world() const { return world_; }
  int64_t timeout_ms() const { return timeout_ms_; }

  // ---- collectives on tensors (context's stream) ----
  void all_reduce(const Tensor& t, int32_t op);
  void broadcast(const Tensor& t, int root);
  Tensor all_gather(const Tensor& in);
  Tensor reduce_scatter(const Tensor& in, int32_t op);
  // Waits for the context's stream with the timeout (aborting on it), then reports device errors.
  void synchronize();

  // ---- raw entry points (device addresses, any stream of this context) ----
  void enqueue_all_reduce(CUdeviceptr buf, size_t count, ncclDataType_t t, ncclRedOp_t op, CUstream s);
  void enqueue_broadcast(CUdeviceptr buf, size_t count, ncclDataType_t t, int root, CUstream s);
  void enqueue_all_gather(CUdeviceptr in, CUdeviceptr out, size_t count, ncclDataType_t t, CUstream s);
  // in: world * count elements; out: this rank's count elements of the reduction.
  void enqueue_reduce_scatter(CUdeviceptr in, CUdeviceptr out, size_t count, ncclDataType_t t, ncclRedOp_t op,
                              CUstream s);
  void group_start();
  void group_end();
  // Polls stream s until it is idle; an NCCL error or the timeout aborts the communicator and throws.
  void wait_stream(CUstream s, const char* what);
  // Throws when the communicator was aborted (FLAME_ERROR_CUDA with the reason).
  void check_usable() const;

 private:
  Comm() = default;
  // Handles the result of an NCCL call: ncclInProgress settles (non-blocking communicators),
  // another error aborts and throws.
  void after(ncclResult_t r, const char* what);
  // Polls ncclCommGetAsyncError until it leaves ncclInProgress, with the timeout.
  void settle(const char* what);
  [[noreturn]] void abort_and_fail(const std::string& why);

  std::shared_ptr<Context> ctx_;
  std::unique_ptr<Nccl> nccl_;
  ncclComm_t comm_ = nullptr;
  int rank_ = 0, world_ = 1;
  int64_t timeout_ms_ = 0;
  int group_depth_ = 0;  // inside group_start/group_end: calls are only queued
  std::string failed_;   // why the communicator was aborted
};

}  // namespace flame

// Communicator creation, waiting with a timeout, abort, and the collectives on tensors.
#include "dist/comm.h"
#include <chrono>
#include <cstring>
#include <thread>
#include "tensor/autograd_graph.h"
#include "core/error.h"
#include "ops/ops.h"

namespace flame {

namespace {

using Clock = std::chrono::steady_clock;

// Polls done() until it returns true; between polls yields for ~1 ms, then sleeps 50 us, so a
// short collective costs little latency and a long wait little CPU.
template <class Done, class OnTimeout>
void poll_until(int64_t timeout_ms, Done&& done, OnTimeout&& on_timeout) {
  const auto start = Clock::now();
  for (uint64_t spin = 0;; ++spin) {
    if (done()) return;
    const auto waited = Clock::now() - start;
    if (std::chrono::duration_cast<std::chrono::milliseconds>(waited).count() >= timeout_ms) on_timeout();
    if (waited < std::chrono::milliseconds(1)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // calls return ncclInProgress instead of blocking: waits can time out
  return config;
}

}  // namespace

ncclDataType_t nccl_dtype(DType d) {
  switch (d) {
    case FLAME_DTYPE_F32: return ncclFloat32;
    case FLAME_DTYPE_F16: return ncclFloat16;
    case FLAME_DTYPE_BF16: return ncclBfloat16;
    case FLAME_DTYPE_F64: return ncclFloat64;
    case FLAME_DTYPE_I32: return ncclInt32;
    case FLAME_DTYPE_I64: return ncclInt64;
    case FLAME_DTYPE_U8: return ncclUint8;
    case FLAME_DTYPE_BOOL: return ncclUint8;  // one byte 0/1: broadcast and all_gather only
    case FLAME_DTYPE_F8_E4M3: case FLAME_DTYPE_F8_E5M2: return ncclUint8;  // bytes: broadcast and all_gather only
    default: fail(FLAME_ERROR_DTYPE_MISMATCH, "dtype ", dtype_name(d), " has no NCCL type");
  }
}

ncclRedOp_t nccl_reduce_op(int32_t op, DType dtype) {
  FLAME_CHECK(dtype != FLAME_DTYPE_BOOL, FLAME_ERROR_DTYPE_MISMATCH, "reductions do not take bool tensors");
  check_compute_dtype(dtype, "reducing collectives");
  switch (op) {
    case FLAME_REDUCE_SUM: return ncclSum;
    case FLAME_REDUCE_AVG:
      FLAME_CHECK(is_floating(dtype), FLAME_ERROR_DTYPE_MISMATCH, "FLAME_REDUCE_AVG needs a floating dtype, not ",
                  dtype_name(dtype));
      return ncclAvg;
    case FLAME_REDUCE_MAX: return ncclMax;
    case FLAME_REDUCE_MIN: return ncclMin;
    default: fail(FLAME_ERROR_INVALID_ARGUMENT, "op ", op, " is not a flame_reduce_op_t value");
  }
}

// ---------------- creation and teardown ----------------

ncclUniqueId Comm::unique_id() {
  Nccl lib;
  lib.load();
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  ncclResult_t r = lib.ncclGetUniqueId(&id);
  FLAME_CHECK(r == ncclSuccess, FLAME_ERROR_CUDA, "ncclGetUniqueId failed: ", lib.describe(r));
  return id;
}

std::shared_ptr<Comm> Comm::create(Context& ctx, const ncclUniqueId& id, int rank, int world, int64_t timeout_ms) {
  std::shared_ptr<Comm> c(new Comm());
  c->ctx_ = ctx.shared_from_this();
  c->nccl_ = std::make_unique<Nccl>();
  c->nccl_->load();
  c->rank_ = rank;
  c->world_ = world;
  c->timeout_ms_ = timeout_ms;
  ctx.bind();  // NCCL takes the device from the current CUDA context
  ncclConfig_t config = nonblocking_config();
  ncclResult_t r = c->nccl_->ncclCommInitRankConfig(&c->comm_, world, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    std::string why = c->nccl_->describe(r, c->comm_);
    if (c->comm_) c->nccl_->ncclCommAbort(c->comm_);
    c->comm_ = nullptr;
    fail(FLAME_ERROR_CUDA, "ncclCommInitRankConfig (rank ", rank, " of ", world, ") failed: ", why);
  }
  c->settle("communicator creation (waiting for every rank to join)");
  return c;
}

std::vector<std::shared_ptr<Comm>> Comm::create_group(const std::vector<Context*>& ctxs, int64_t timeout_ms) {
  const int n = static_cast<int>(ctxs.size());
  std::vector<std::shared_ptr<Comm>> comms;
  for (int i = 0; i < n; ++i) {
    std::shared_ptr<Comm> c(new Comm());
    c->ctx_ = ctxs[i]->shared_from_this();
    c->nccl_ = std::make_unique<Nccl>();
    c->nccl_->load();
    c->rank_ = i;
    c->world_ = n;
    c->timeout_ms_ = timeout_ms;
    comms.push_back(std::move(c));
  }
  ncclUniqueId id = unique_id();
  Nccl& lib = *comms[0]->nccl_;
  ncclResult_t r = lib.ncclGroupStart();
  FLAME_CHECK(r == ncclSuccess, FLAME_ERROR_CUDA, "ncclGroupStart failed: ", lib.describe(r));
  std::string error;
  for (int i = 0; i < n && error.empty(); ++i) {
    ContextScope scope(*ctxs[i]);  // binds the GPU whose rank this is
    ncclConfig_t config = nonblocking_config();
    r = lib.ncclCommInitRankConfig(&comms[i]->comm_, n, id, i, &config);
    if (r != ncclSuccess && r != ncclInProgress) error = "ncclCommInitRankConfig (rank " + std::to_string(i) + ") failed: " + lib.describe(r);
  }
  r = lib.ncclGroupEnd();
  if (error.empty() && r != ncclSuccess && r != ncclInProgress) error = "ncclGroupEnd failed: " + lib.describe(r);
  if (!error.empty()) {
    for (auto& c : comms) {
      if (c->comm_) c->nccl_->ncclCommAbort(c->comm_);
      c->comm_ = nullptr;
      c->failed_ = error;
    }
    fail(FLAME_ERROR_CUDA, error);
  }
  for (auto& c : comms) {
    try {
      c->settle("communicator creation");
    } catch (...) {  // one rank failed: abort the others so that none is left waiting
      for (auto& o : comms)
        if (o->comm_) {
          o->nccl_->ncclCommAbort(o->comm_);
          o->comm_ = nullptr;
        }
      throw;
    }
  }
  return comms;
}

Comm::~Comm() {
  if (!comm_) return;
  std::lock_guard<std::recursive_mutex> lock(ctx_->mutex);
  ctx_->bind();
  try {  // finish queued work, then free; a peer that is gone makes this time out: abort then
    wait_stream(ctx_->stream, "releasing the communicator");
    after(nccl_->ncclCommFinalize(comm_), "ncclCommFinalize");
    if (comm_) nccl_->ncclCommDestroy(comm_);
  } catch (...) {
    if (comm_) nccl_->ncclCommAbort(comm_);
  }
  comm_ = nullptr;
}

// ---------------- waiting, errors, abort ----------------

void Comm::check_usable() const {
  if (!failed_.empty()) fail(FLAME_ERROR_CUDA, "the communicator was aborted earlier: ", failed_);
  FLAME_CHECK(comm_, FLAME_ERROR_INTERNAL, "communicator without an NCCL handle");
}

void Comm::abort_and_fail(const std::string& why) {
  for (; group_depth_ > 0; --group_depth_) nccl_->ncclGroupEnd();  // NCCL's group depth is per thread: close ours
  if (comm_) nccl_->ncclCommAbort(comm_);  // makes kernels waiting for peers return
  comm_ = nullptr;
  failed_ = why;
  fail(FLAME_ERROR_CUDA, why, " (rank ", rank_, " of ", world_, "; the communicator was aborted)");
}

void Comm::settle(const char* what) {
  ncclResult_t state = ncclInProgress;
  poll_until(
      timeout_ms_,
      [&] {
        ncclResult_t r = nccl_->ncclCommGetAsyncError(comm_, &state);
        if (r != ncclSuccess) state = r;
        return state != ncclInProgress;
      },
      [&] { abort_and_fail(std::string(what) + " timed out after " + std::to_string(timeout_ms_) + " ms"); });
  if (state != ncclSuccess) abort_and_fail(std::string(what) + " failed: " + nccl_->describe(state, comm_));
}

void Comm::after(ncclResult_t r, const char* what) {
  if (r != ncclSuccess && r != ncclInProgress) abort_and_fail(std::string(what) + " failed: " + nccl_->describe(r, comm_));
  if (group_depth_ == 0) settle(what);
}

void Comm::wait_stream(CUstream s, const char* what) {
  Driver& drv = ctx_->drv;
  ++drv.counters.host_syncs;  // the polling below is one wait for the device
  poll_until(
      timeout_ms_,
      [&] {
        CUresult q = drv.cuStreamQuery(s);
        if (q == CUDA_SUCCESS) return true;
        if (q != CUDA_ERROR_NOT_READY) ctx_->check(q, "cuStreamQuery");
        ncclResult_t state = ncclSuccess;
        if (comm_ && nccl_->ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state != ncclSuccess &&
            state != ncclInProgress)
          abort_and_fail(std::string(what) + ": NCCL reported " + nccl_->describe(state, comm_));
        return false;
      },
      [&] {
        abort_and_fail(std::string(what) + " timed out after " + std::to_string(timeout_ms_) +
                       " ms (a peer rank failed, exited, or issued a different collective)");
      });
}

void Comm::synchronize() {
  check_usable();
  wait_stream(ctx_->stream, "waiting for the collectives");
  ctx_->synchronize();  // idle now: reports errors kernels recorded
}

// ---------------- raw entry points ----------------

void Comm::group_start() {
  check_usable();
  ncclResult_t r = nccl_->ncclGroupStart();
  if (r != ncclSuccess) abort_and_fail(std::string("ncclGroupStart failed: ") + nccl_->describe(r, comm_));
  ++group_depth_;
}

void Comm::group_end() {
  if (group_depth_ == 0) return;  // an abort inside the group closed it already
  --group_depth_;
  after(nccl_->ncclGroupEnd(), "ncclGroupEnd");
}

void Comm::enqueue_all_reduce(CUdeviceptr buf, size_t count, ncclDataType_t t, ncclRedOp_t op, CUstream s) {
  check_usable();
  void* p = reinterpret_cast<void*>(buf);
  ++ctx_->drv.counters.launches;
  after(nccl_->ncclAllReduce(p, p, count, t, op, comm_, s), "ncclAllReduce");
}

void Comm::enqueue_broadcast(CUdeviceptr buf, size_t count, ncclDataType_t t, int root, CUstream s) {
  check_usable();
  void* p = reinterpret_cast<void*>(buf);
  ++ctx_->drv.counters.launches;
  after(nccl_->ncclBroadcast(p, p, count, t, root, comm_, s), "ncclBroadcast");
}

void Comm::enqueue_all_gather(CUdeviceptr in, CUdeviceptr out, size_t count, ncclDataType_t t, CUstream s) {
  check_usable();
  ++ctx_->drv.counters.launches;
  after(nccl_->ncclAllGather(reinterpret_cast<void*>(in), reinterpret_cast<void*>(out), count, t, comm_, s),
        "ncclAllGather");
}

void Comm::enqueue_reduce_scatter(CUdeviceptr in, CUdeviceptr out, size_t count, ncclDataType_t t, ncclRedOp_t op,
                                  CUstream s) {
  check_usable();
  ++ctx_->drv.counters.launches;
  after(nccl_->ncclReduceScatter(reinterpret_cast<void*>(in), reinterpret_cast<void*>(out), count, t, op, comm_, s),
        "ncclReduceScatter");
}

// ---------------- collectives on tensors ----------------

namespace {

void check_same_context(Comm& c, const Tensor& t, const char* name) {
  FLAME_CHECK(&t->ctx() == &c.ctx(), FLAME_ERROR_INVALID_ARGUMENT, name, " belongs to another context than the communicator");
}

// In-place collectives write t: as every in-place op, refused on a tensor that requires grad while
// grad mode records (a leaf's value would change under its graph); t must be contiguous.
void check_in_place(Comm& c, const Tensor& t, const char* name) {
  check_same_context(c, t, name);
  FLAME_CHECK(!(c.ctx().recording() && requires_grad(*t)), FLAME_ERROR_INVALID_ARGUMENT, name,
              " requires grad: an in-place collective on it would bypass autograd (detach it, or turn grad mode off)");
  FLAME_CHECK(t->contiguous(), FLAME_ERROR_INVALID_ARGUMENT, name,
              " is not contiguous; in-place collectives need contiguous tensors (flame_contiguous first)");
}

// Out-of-place collectives have no backward: an input that requires grad while recording is an error.
void check_input(Comm& c, const Tensor& t, const char* name) {
  check_same_context(c, t, name);
  FLAME_CHECK(!(c.ctx().recording() && requires_grad(*t)), FLAME_ERROR_NOT_DIFFERENTIABLE, name,
              " requires grad, but collectives have no backward (detach it, or turn grad mode off)");
}

}  // namespace

void Comm::all_reduce(const Tensor& t, int32_t op) {
  check_usable();
  check_in_place(*this, t, "t");
  ncclRedOp_t rop = nccl_reduce_op(op, t->dtype);
  ncclDataType_t type = nccl_dtype(t->dtype);
  if (t->numel() == 0) return;
  enqueue_all_reduce(t->data(), static_cast<size_t>(t->numel()), type, rop, ctx_->stream);
  t->storage->version.fetch_add(1);
}

void Comm::broadcast(const Tensor& t, int root) {
  check_usable();
  check_in_place(*this, t, "t");
  FLAME_CHECK(root >= 0 && root < world_, FLAME_ERROR_INVALID_ARGUMENT, "root ", root, " is not a rank of [0, ", world_, ")");
  ncclDataType_t type = nccl_dtype(t->dtype);
  if (t->numel() == 0) return;
  enqueue_broadcast(t->data(), static_cast<size_t>(t->numel()), type, root, ctx_->stream);
  t->storage->version.fetch_add(1);
}

Tensor Comm::all_gather(const Tensor& in) {
  check_usable();
  check_input(*this, in, "in");
  ncclDataType_t type = nccl_dtype(in->dtype);
  Shape shape = in->shape;
  if (shape.empty()) shape = {1};  // a 0-d input gathers into [world]
  shape[0] *= world_;
  checked_numel(shape);
  Tensor src = ops::contiguous(alias(in));
  Tensor out = make_tensor(*ctx_, shape, in->dtype);
  if (in->numel() == 0) return out;
  enqueue_all_gather(src->data(), out->data(), static_cast<size_t>(in->numel()), type, ctx_->stream);
  return out;
}

Tensor Comm::reduce_scatter(const Tensor& in, int32_t op) {
  check_usable();
  check_input(*this, in, "in");
  ncclRedOp_t rop = nccl_reduce_op(op, in->dtype);
  ncclDataType_t type = nccl_dtype(in->dtype);
  FLAME_CHECK(in->ndim() >= 1, FLAME_ERROR_SHAPE_MISMATCH, "in must have at least one dimension");
  FLAME_CHECK(in->shape[0] % world_ == 0, FLAME_ERROR_SHAPE_MISMATCH, "dim 0 of in (", in->shape[0],
              ") is not a multiple of the world size ", world_);
  Shape shape = in->shape;
  shape[0] /= world_;
  Tensor src = ops::contiguous(alias(in));
  Tensor out = make_tensor(*ctx_, shape, in->dtype);
  if (out->numel() == 0) return out;
  check_usable();
  ++ctx_->drv.counters.launches;
  after(nccl_->ncclReduceScatter(reinterpret_cast<void*>(src->data()), reinterpret_cast<void*>(out->data()),
                                 static_cast<size_t>(out->numel()), type, rop, comm_, ctx_->stream),
        "ncclReduceScatter");
  return out;
}

}  // namespace flame

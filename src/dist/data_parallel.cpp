#include "dist/data_parallel.h"
#include <array>
#include <unordered_set>
#include "core/error.h"
#include "ops/ops.h"

namespace flame {

namespace {

int64_t round_up(int64_t n) { return (n + 63) / 64 * 64; }

uint64_t fnv1a(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xFF;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

void validate_dp_options(const flame_dp_options_t& o) {
  FLAME_CHECK(o.struct_size >= sizeof(size_t) && o.struct_size <= sizeof(flame_dp_options_t), FLAME_ERROR_INVALID_ARGUMENT,
              "opts->struct_size ", o.struct_size, " is not a size of flame_dp_options_t (use flame_dp_options_init)");
  FLAME_CHECK(o.bucket_bytes >= 1 && o.bucket_bytes <= (uint64_t{1} << 40), FLAME_ERROR_INVALID_ARGUMENT,
              "opts->bucket_bytes ", o.bucket_bytes, " is not in [1, 2^40]");
  FLAME_CHECK(o.broadcast_parameters == 0 || o.broadcast_parameters == 1, FLAME_ERROR_INVALID_ARGUMENT,
              "opts->broadcast_parameters must be 0 or 1");
}

DataParallel::DataParallel(std::shared_ptr<Comm> comm, std::vector<Tensor> params, const flame_dp_options_t& o)
    : comm_(std::move(comm)) {
  Context& c = ctx();
  comm_->check_usable();
  // Local checks first; their outcome is exchanged with the shapes, so that a rank that fails here
  // makes every rank fail at once instead of leaving the others waiting for its collectives.
  flame_status_t local_status = FLAME_OK;
  std::string local_message;
  try {
    std::unordered_set<const TensorImpl*> seen;
    for (size_t i = 0; i < params.size(); ++i) {
      const Tensor& p = params[i];
      FLAME_CHECK(&p->ctx() == &c, FLAME_ERROR_INVALID_ARGUMENT, "params[", i, "] belongs to another context than the communicator");
      FLAME_CHECK(requires_grad(*p) && !(p->autograd && p->autograd->grad_fn), FLAME_ERROR_INVALID_ARGUMENT, "params[", i,
                  "] is not a leaf that requires grad");
      FLAME_CHECK(p->contiguous(), FLAME_ERROR_INVALID_ARGUMENT, "params[", i, "] is not contiguous");
      FLAME_CHECK(seen.insert(p.get()).second, FLAME_ERROR_INVALID_ARGUMENT, "params[", i, "] appears twice");
      nccl_dtype(p->dtype);
    }
  } catch (const Error& e) {
    local_status = e.status();
    local_message = e.what();
  }
  verify_same_parameters(params, local_status == FLAME_OK, local_status);
  if (local_status != FLAME_OK) fail(local_status, local_message);
  params_ = std::move(params);

  if (o.broadcast_parameters && comm_->world() > 1) {  // every rank starts from rank 0's values
    comm_->group_start();
    for (const Tensor& p : params_)
      if (p->numel() > 0) comm_->enqueue_broadcast(p->data(), static_cast<size_t>(p->numel()), nccl_dtype(p->dtype), 0, c.stream);
    comm_->group_end();
    comm_->synchronize();
    for (const Tensor& p : params_) p->storage->version.fetch_add(1);
  }

  // Buckets in reverse parameter order (backward order), one dtype each, up to bucket_bytes.
  slots_.resize(params_.size());
  for (size_t k = params_.size(); k-- > 0;) {
    const Tensor& p = params_[k];
    const uint64_t bytes = static_cast<uint64_t>(p->numel()) * p->elem_size();
    bool fresh = buckets_.empty() || buckets_.back().dtype != p->dtype;
    if (!fresh) {
      const Bucket& b = buckets_.back();
      uint64_t used = 0;
      for (size_t j : b.params) used += static_cast<uint64_t>(params_[j]->numel()) * params_[j]->elem_size();
      fresh = used > 0 && used + bytes > o.bucket_bytes;
    }
    if (fresh) {
      buckets_.emplace_back();
      buckets_.back().dtype = p->dtype;
    }
    Bucket& b = buckets_.back();
    // Each gradient starts on a 64-element boundary: .grad is a view into the bucket after the
    // round (flame_dp_wait), and aligned views keep the optimizer's vector loads.
    const int64_t offset = b.params.empty() ? 0 : round_up(slots_[b.params.back()].offset + params_[b.params.back()]->numel());
    slots_[k] = Slot{k, buckets_.size() - 1, offset, false};
    b.params.push_back(k);
  }
  Driver& drv = c.drv;
  c.check(drv.cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  c.check(drv.cuEventCreate(&done_, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  for (Bucket& b : buckets_) {
    const int64_t n = slots_[b.params.back()].offset + params_[b.params.back()]->numel();
    b.buf = ops::zeros(c, {n}, b.dtype);  // the padding between gradients is all-reduced too: keep it 0
    b.pending = b.params.size();
    c.check(drv.cuEventCreate(&b.ready, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    auto rec = std::make_shared<HookRecord>();
    rec->on_accumulated = [this, i](const Tensor&) {  // the hooks end with this object (hooks_)
      try {
        on_grad_ready(i);
      } catch (const Error& e) {
        fail(e.status(), "data-parallel gradient hook: ", e.what());
      }
    };
    rec->ctx = c.shared_from_this();
    autograd_meta(*params_[i]).post_hooks.push_back(rec);
    hooks_.push_back(rec);
  }
}

void DataParallel::verify_same_parameters(const std::vector<Tensor>& params, bool local_ok, flame_status_t local_status) {
  verify_same_parameter_lists(*comm_, params, local_ok ? FLAME_OK : local_status, "set up data parallelism");
}

void verify_same_parameter_lists(Comm& comm, const std::vector<Tensor>& params, flame_status_t local_status,
                                 const char* what) {
  const bool local_ok = local_status == FLAME_OK;
  // [status, count, hash of (dtype, shape) in order, total elements] from every rank.
  uint64_t hash = 0xcbf29ce484222325ull, total = 0;
  if (local_ok)
    for (const Tensor& p : params) {
      hash = fnv1a(hash, static_cast<uint64_t>(p->dtype));
      hash = fnv1a(hash, static_cast<uint64_t>(p->ndim()));
      for (int64_t d : p->shape) hash = fnv1a(hash, static_cast<uint64_t>(d));
      total += static_cast<uint64_t>(p->numel());
    }
  std::array<int64_t, 4> mine{static_cast<int64_t>(local_status), static_cast<int64_t>(params.size()),
                              static_cast<int64_t>(hash), static_cast<int64_t>(total)};
  Tensor local = ops::from_host(comm.ctx(), mine.data(), sizeof mine, {4}, FLAME_DTYPE_I64);
  Tensor all = comm.all_gather(local);
  comm.synchronize();
  std::vector<int64_t> v(4 * static_cast<size_t>(comm.world()));
  ops::to_host(all, v.data(), v.size() * sizeof(int64_t));
  if (!local_ok) return;  // the caller reports its own error
  for (int r = 0; r < comm.world(); ++r) {
    const int64_t* f = &v[4 * static_cast<size_t>(r)];
    FLAME_CHECK(f[0] == FLAME_OK, FLAME_ERROR_INVALID_ARGUMENT, "rank ", r, " failed to ", what, " (",
                flame_status_string(static_cast<flame_status_t>(f[0])), "); see its own error message");
    FLAME_CHECK(f[1] == mine[1] && f[2] == mine[2] && f[3] == mine[3], FLAME_ERROR_SHAPE_MISMATCH, "rank ", r,
                " registered a different parameter list (", f[1], " tensors, ", f[3], " elements) than rank ",
                comm.rank(), " (", mine[1], " tensors, ", mine[3],
                " elements), or the same counts with other shapes or dtypes; every rank must pass the same model");
  }
}

DataParallel::~DataParallel() {
  Context& c = ctx();
  std::lock_guard<std::recursive_mutex> lock(c.mutex);
  c.bind();
  for (size_t i = 0; i < hooks_.size(); ++i) {
    hooks_[i]->finish();
    if (params_[i]->autograd) {
      auto& list = params_[i]->autograd->post_hooks;
      for (size_t j = 0; j < list.size(); ++j)
        if (list[j] == hooks_[i]) {
          list.erase(list.begin() + static_cast<std::ptrdiff_t>(j));
          break;
        }
    }
  }
  if (stream_) {
    try {
      comm_->wait_stream(stream_, "releasing the data-parallel helper");
    } catch (...) {  // the communicator is aborted now, and its kernels returned
      c.drv.cuStreamSynchronize(stream_);
    }
  }
  for (Bucket& b : buckets_)
    if (b.ready) c.drv.cuEventDestroy(b.ready);
  buckets_.clear();  // bucket memory goes back to the pool on the context's stream
  if (done_) c.drv.cuEventDestroy(done_);
  if (stream_) c.drv.cuStreamDestroy(stream_);
}

void DataParallel::pack(Slot& s) {
  const Tensor& p = params_[s.index];
  Bucket& b = buckets_[s.bucket];
  Tensor view = make_view(b.buf, p->shape, contiguous_strides(p->shape), s.offset);
  const Tensor& g = p->autograd ? p->autograd->grad : Tensor();
  if (g && g->data() == view->data()) {
    // .grad is still this slot's view from the last round and backward accumulated into it in place
  } else if (g) {
    ops::copy_into(view, g);
  } else {
    ops::fill_(view, 0.0);  // no gradient on this rank: contributes zeros to the average
  }
  s.packed = true;
  --b.pending;
}

void DataParallel::launch_ready() {
  Context& c = ctx();
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    Bucket& b = buckets_[next_launch_++];
    c.check(c.drv.cuEventRecord(b.ready, c.stream), "cuEventRecord");
    c.check(c.drv.cuStreamWaitEvent(stream_, b.ready, 0), "cuStreamWaitEvent");
    comm_->enqueue_all_reduce(b.buf->data(), static_cast<size_t>(b.buf->numel()), nccl_dtype(b.dtype), ncclAvg, stream_);
    b.launched = true;
  }
}

void DataParallel::on_grad_ready(size_t i) {
  if (!sync_) return;  // an accumulation micro-step: gradients stay local
  comm_->check_usable();
  Slot& s = slots_.at(i);
  FLAME_CHECK(!s.packed, FLAME_ERROR_INVALID_ARGUMENT, "the gradient of parameter ", i,
              " arrived twice in one round: call flame_dp_wait after each backward with sync on, and turn sync off "
              "(flame_dp_set_sync) for the micro-steps that only accumulate");
  pack(s);
  launch_ready();
}

void DataParallel::wait() {
  if (!sync_) return;
  comm_->check_usable();
  Context& c = ctx();
  for (Slot& s : slots_)
    if (!s.packed) pack(s);
  launch_ready();
  c.check(c.drv.cuEventRecord(done_, stream_), "cuEventRecord");
  c.check(c.drv.cuStreamWaitEvent(c.stream, done_, 0), "cuStreamWaitEvent");
  comm_->wait_stream(stream_, "flame_dp_wait (gradient all_reduce)");
  for (Slot& s : slots_) {  // .grad becomes the averaged gradient in place: a view, no copy back
    const Tensor& p = params_[s.index];
    AutogradMeta& m = autograd_meta(*p);
    if (!m.grad || m.grad->data() != buckets_[s.bucket].buf->data() + static_cast<CUdeviceptr>(s.offset) * p->elem_size())
      m.grad = make_view(buckets_[s.bucket].buf, p->shape, contiguous_strides(p->shape), s.offset);
    s.packed = false;
  }
  for (Bucket& b : buckets_) {
    b.pending = b.params.size();
    b.launched = false;
  }
  next_launch_ = 0;
}

}  // namespace flame

#include "toolkit/zero.h"
#include <cmath>
#include <map>
#include "core/error.h"
#include "dist/data_parallel.h"
#include "ops/ops.h"
#include "tensor/autograd_graph.h"

namespace flame {

void validate_zero_options(const flame_zero_options_t& o) {
  FLAME_CHECK(o.stage >= 1 && o.stage <= 3, FLAME_ERROR_INVALID_ARGUMENT, "opts->stage ", o.stage, " is not 1, 2 or 3");
  FLAME_CHECK((o.stage == 3) == (o.model != nullptr), FLAME_ERROR_INVALID_ARGUMENT,
              o.stage == 3 ? "opts->stage 3 shards the parameters of a model: set opts->model"
                           : "opts->model is for stage 3 only (parameter sharding): leave it NULL");
  FLAME_CHECK(o.gather_slots >= 2 && o.gather_slots <= 64, FLAME_ERROR_INVALID_ARGUMENT,
              "opts->gather_slots must lie in [2, 64], got ", o.gather_slots);
  FLAME_CHECK(o.broadcast_parameters == 0 || o.broadcast_parameters == 1, FLAME_ERROR_INVALID_ARGUMENT,
              "opts->broadcast_parameters must be 0 or 1");
  FLAME_CHECK(std::isfinite(o.max_grad_norm) && o.max_grad_norm >= 0, FLAME_ERROR_INVALID_ARGUMENT,
              "opts->max_grad_norm must be finite and >= 0 (0: no clipping), got ", o.max_grad_norm);
  FLAME_CHECK(o.reduce_dtype == FLAME_ZERO_PARAM_DTYPE || o.reduce_dtype == FLAME_DTYPE_F32 || o.reduce_dtype == FLAME_DTYPE_BF16,
              FLAME_ERROR_INVALID_ARGUMENT, "opts->reduce_dtype must be FLAME_ZERO_PARAM_DTYPE (-1), FLAME_DTYPE_F32 or ",
              "FLAME_DTYPE_BF16, got ", o.reduce_dtype);
  FLAME_CHECK(o.gather_dtype == FLAME_ZERO_PARAM_DTYPE || o.gather_dtype == FLAME_DTYPE_BF16, FLAME_ERROR_INVALID_ARGUMENT,
              "opts->gather_dtype must be FLAME_ZERO_PARAM_DTYPE (-1) or FLAME_DTYPE_BF16, got ", o.gather_dtype);
  FLAME_CHECK(o.gather_dtype == FLAME_ZERO_PARAM_DTYPE || o.stage == 3, FLAME_ERROR_INVALID_ARGUMENT,
              "opts->gather_dtype is for stage 3 only (stages 1 and 2 gather the stepped parameters in their own dtype, ",
              "so that every rank holds the same values): leave it FLAME_ZERO_PARAM_DTYPE");
}

DType zero_reduce_dtype(const flame_zero_options_t& o, DType param_dtype) {
  return o.reduce_dtype == FLAME_ZERO_PARAM_DTYPE ? param_dtype : static_cast<DType>(o.reduce_dtype);
}

namespace {

// A 1-D view of `count` elements of the 1-D contiguous `buf` (itself possibly a view) from its element `at`.
Tensor flat_view(const Tensor& buf, int64_t at, int64_t count) { return make_view(buf, {count}, {1}, buf->offset + at); }

// Parameter p's elements [lo, lo + count) as a 1-D view (p is contiguous).
Tensor param_part(const Tensor& p, int64_t lo, int64_t count) {
  return make_view(p, {count}, {1}, p->offset + lo);
}

// Collective buffers hold at most this many bytes (all ranks' pieces together), so that a step never
// needs a second copy of all gradients or parameters: stage 2's reduce-scatter and every stage's
// parameter all-gather run bucket by bucket.
constexpr int64_t kBucketBytes = int64_t{256} << 20;

// Elements per rank in one bucket of a flat of element size elem over world ranks (at least 1).
int64_t bucket_piece(int64_t elem, int64_t world, int64_t shard) {
  return std::max<int64_t>(1, std::min(shard, kBucketBytes / (elem * world)));
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(std::shared_ptr<Comm> comm, std::shared_ptr<Optimizer> opt, const flame_zero_options_t& o,
                             std::shared_ptr<ShardedParameters> sharded)
    : comm_(std::move(comm)), opt_(std::move(opt)), opts_(o), sharded_(std::move(sharded)) {
  Context& c = ctx();
  comm_->check_usable();
  // Local checks first; their outcome is exchanged with the parameter lists, so that a rank that
  // fails here makes every rank fail at once instead of leaving the others in a collective.
  std::vector<Tensor> params;
  flame_status_t local_status = FLAME_OK;
  std::string local_message;
  try {
    FLAME_CHECK(&opt_->ctx() == &c, FLAME_ERROR_INVALID_ARGUMENT, "opt belongs to another context than the communicator");
    opt_->check_shardable();
    FLAME_CHECK((o.stage == 3) == (sharded_ != nullptr), FLAME_ERROR_INTERNAL, "stage 3 without its sharded parameters");
    if (sharded_) sharded_->check(*comm_);
    for (auto& g : opt_->groups())
      for (auto& p : g.params) params.push_back(p.param);
  } catch (const Error& e) {
    local_status = e.status();
    local_message = e.what();
    params.clear();
  }
  verify_same_parameter_lists(*comm_, params, local_status, "shard its optimizer");
  if (local_status != FLAME_OK) fail(local_status, local_message);

  if (sharded_) {  // stage 3: the sharded parameters leave the list (they hold no memory any more)
    sharded_->shard(o.broadcast_parameters && comm_->world() > 1);
    std::vector<Tensor> rest;
    ShardedParameters::Part part;
    for (const Tensor& p : params)
      if (!sharded_->part(*p, &part)) rest.push_back(p);
    params = std::move(rest);
  }
  if (o.broadcast_parameters && comm_->world() > 1) {  // every rank starts from rank 0's values
    comm_->group_start();
    for (const Tensor& p : params)
      if (p->numel() > 0) comm_->enqueue_broadcast(p->data(), static_cast<size_t>(p->numel()), nccl_dtype(p->dtype), 0, c.stream);
    comm_->group_end();
    comm_->synchronize();
    for (const Tensor& p : params) p->storage->version.fetch_add(1);
  }

  // One flat per dtype, in the order the dtypes first appear; shards and owned ranges.
  std::map<DType, size_t> flat_of;
  for (auto& g : opt_->groups())
    for (auto& p : g.params) {
      ShardedParameters::Part part;
      if (sharded_ && sharded_->part(*p.param, &part)) {  // stage 3: stepped in place in its shard
        p.shard_lo = part.lo;
        p.shard_hi = part.hi;
        p.shard_value = part.value;
        sharded_members_.emplace_back(&p, part);
        continue;
      }
      auto at = flat_of.find(p.param->dtype);
      if (at == flat_of.end()) {
        at = flat_of.emplace(p.param->dtype, flats_.size()).first;
        flats_.emplace_back();
        flats_.back().dtype = p.param->dtype;
      }
      Flat& f = flats_[at->second];
      f.members.push_back({&p, f.total});
      f.total += p.param->numel();
    }
  const int64_t world = comm_->world(), rank = comm_->rank();
  for (Flat& f : flats_) {
    f.shard = (f.total + world - 1) / world;
    const int64_t first = rank * f.shard, end = first + f.shard;
    for (Member& m : f.members) {
      const int64_t lo = std::max(m.offset, first), hi = std::min(m.offset + m.param->param->numel(), end);
      m.param->shard_lo = hi > lo ? lo - m.offset : 0;
      m.param->shard_hi = hi > lo ? hi - m.offset : 0;
    }
  }
  opt_->make_sharded();
}

Tensor ZeroOptimizer::pack_gradients(Flat& f) {
  Context& c = ctx();
  const int64_t padded = f.shard * comm_->world();
  const bool keep = opts_.stage == 1;
  Tensor g = keep ? f.grads : Tensor();
  if (!g) {
    g = make_tensor(c, {padded}, f.dtype);
    if (padded > f.total) ops::fill_(flat_view(g, f.total, padded - f.total), 0.0);  // padding: zeros
  }
  for (const Member& m : f.members) {
    const Tensor& p = m.param->param;
    if (p->numel() == 0) continue;
    Tensor view = make_view(g, p->shape, contiguous_strides(p->shape), m.offset);
    const Tensor grad = p->autograd ? p->autograd->grad : Tensor();
    if (!grad) {
      ops::fill_(view, 0.0);  // no gradient on this rank: zeros in the average
      continue;
    }
    FLAME_CHECK(grad->shape == p->shape && grad->dtype == p->dtype, FLAME_ERROR_SHAPE_MISMATCH, "the gradient of a parameter ",
                shape_str(p->shape), " ", dtype_name(p->dtype), " is ", shape_str(grad->shape), " ", dtype_name(grad->dtype));
    if (grad->data() == view->data() && grad->contiguous()) continue;  // last step's view, accumulated in place
    ops::copy_into(view, alias(grad));
  }
  if (keep) f.grads = g;
  return g;
}

Tensor ZeroOptimizer::reduce_gradients(Flat& f) {
  Context& c = ctx();
  if (f.shard == 0) return make_tensor(c, {0}, f.dtype);
  if (opts_.stage >= 2) return reduce_scatter_in_buckets(f);
  Tensor g = pack_gradients(f);
  const int64_t padded = f.shard * comm_->world();
  const DType reduce = zero_reduce_dtype(opts_, f.dtype);
  if (reduce == f.dtype) {
    comm_->enqueue_all_reduce(g->data(), static_cast<size_t>(padded), nccl_dtype(f.dtype), ncclAvg, c.stream);
  } else {  // opts->reduce_dtype: averaged in a cast copy, cast back into the kept buffer
    Tensor sent = ops::to_dtype(g, reduce);
    comm_->enqueue_all_reduce(sent->data(), static_cast<size_t>(padded), nccl_dtype(reduce), ncclAvg, c.stream);
    ops::copy_into(g, sent);
  }
  g->storage->version.fetch_add(1);
  for (const Member& m : f.members) {  // .grad: the average, a view into the kept buffer
    const Tensor& p = m.param->param;
    AutogradMeta& meta = autograd_meta(*p);
    const CUdeviceptr at = g->data() + static_cast<CUdeviceptr>(m.offset) * p->elem_size();
    if (!meta.grad || meta.grad->data() != at || !meta.grad->contiguous())
      meta.grad = make_view(g, p->shape, contiguous_strides(p->shape), m.offset);
  }
  return flat_view(g, comm_->rank() * f.shard, f.shard);
}

// The flat elements [lo, hi) of every member that has any (padding past the last member: zeros)
// copied into dst (hi - lo elements): the gradients (want_grads; zeros for a parameter without one)
// or the parameters themselves.
void ZeroOptimizer::copy_flat_range(const Flat& f, int64_t lo, int64_t hi, const Tensor& dst, bool want_grads) {
  int64_t filled = lo;
  for (const Member& m : f.members) {
    const Tensor& p = m.param->param;
    const int64_t a = std::max(lo, m.offset), b = std::min(hi, m.offset + p->numel());
    if (a >= b) continue;
    Tensor into = flat_view(dst, a - lo, b - a);
    if (!want_grads) {
      ops::copy_into(into, param_part(p, a - m.offset, b - a));
    } else {
      const Tensor grad = p->autograd ? p->autograd->grad : Tensor();
      if (!grad) {
        ops::fill_(into, 0.0);  // no gradient on this rank: zeros in the average
      } else {
        FLAME_CHECK(grad->shape == p->shape && grad->dtype == p->dtype, FLAME_ERROR_SHAPE_MISMATCH,
                    "the gradient of a parameter ", shape_str(p->shape), " ", dtype_name(p->dtype), " is ",
                    shape_str(grad->shape), " ", dtype_name(grad->dtype));
        const Tensor flat = grad->contiguous() ? grad : ops::contiguous(alias(grad));
        ops::copy_into(into, make_view(flat, {b - a}, {1}, flat->offset + (a - m.offset)));
      }
    }
    filled = b;
  }
  if (filled < hi) ops::fill_(flat_view(dst, filled - lo, hi - filled), 0.0);
}

// Stage 2: bucket k holds, for every rank r, the flat range [r*S + k*n, r*S + (k+1)*n) as its piece r,
// so that one reduce-scatter of it hands each rank the next n averaged elements of its own shard. A
// parameter's full .grad is dropped once every bucket that reads it is queued, so that at most one
// bucket and the shard exist beside the gradients (no full flat copy).
Tensor ZeroOptimizer::reduce_scatter_in_buckets(Flat& f) {
  Context& c = ctx();
  const int64_t world = comm_->world(), S = f.shard;
  // opts->reduce_dtype: buckets hold the gradients cast to it, and the averaged shard is cast back.
  const DType reduce = zero_reduce_dtype(opts_, f.dtype);
  const int64_t n_max = bucket_piece(static_cast<int64_t>(dtype_size(reduce)), world, S);
  Tensor shard = make_tensor(c, {S}, f.dtype);
  Tensor reduced = reduce == f.dtype ? shard : make_tensor(c, {S}, reduce);
  Tensor bucket = make_tensor(c, {world * n_max}, reduce);
  // The largest in-shard position of each member's elements: it is complete after the bucket past it.
  std::vector<int64_t> last(f.members.size());
  for (size_t i = 0; i < f.members.size(); ++i) {
    const int64_t first = f.members[i].offset, end = first + f.members[i].param->param->numel();
    last[i] = end == first ? -1 : (first / S == (end - 1) / S ? (end - 1) % S : S - 1);
  }
  for (int64_t k0 = 0; k0 < S; k0 += n_max) {
    const int64_t n = std::min(n_max, S - k0);
    for (int64_t r = 0; r < world; ++r)
      copy_flat_range(f, r * S + k0, r * S + k0 + n, flat_view(bucket, r * n, n), true);
    comm_->enqueue_reduce_scatter(bucket->data(), reduced->data() + static_cast<CUdeviceptr>(k0) * reduced->elem_size(),
                                  static_cast<size_t>(n), nccl_dtype(reduce), ncclAvg, c.stream);
    // Drop every gradient whose last bucket this was (host bookkeeping over the members).
    for (size_t i = 0; i < f.members.size(); ++i)
      if (last[i] >= 0 && last[i] < k0 + n) {
        AutogradMeta* meta = f.members[i].param->param->autograd.get();
        if (meta) meta->grad.reset();
        last[i] = -1;
      }
  }
  for (const Member& m : f.members)  // full gradients are no longer needed: only the shard is
    if (m.param->param->autograd) m.param->param->autograd->grad.reset();
  if (reduced != shard) ops::copy_into(shard, reduced);
  shard->storage->version.fetch_add(1);
  return shard;
}

Tensor ZeroOptimizer::clip(const std::vector<Tensor>& shards, const std::vector<Tensor>& scaled) {
  Context& c = ctx();
  std::vector<Tensor> squares;  // per flat, in f32
  for (const Tensor& s : shards)
    if (s->numel() > 0) squares.push_back(ops::square(ops::to_dtype(ops::norm(s, 2, {}, false), FLAME_DTYPE_F32)));
  Tensor sum = squares.empty() ? ops::scalar(c, 0.0, FLAME_DTYPE_F32) : ops::sum(ops::stack(squares, 0), {}, false);
  sum = ops::contiguous(sum);
  comm_->all_reduce(sum, FLAME_REDUCE_SUM);
  Tensor total = ops::sqrt(sum);
  if (opts_.max_grad_norm > 0) {
    // coef = min(1, max_norm / (total + 1e-6)) on the device, as flame_clip_grad_norm.
    Tensor coef = ops::binary(OpId::Minimum,
                              ops::div(ops::scalar(c, opts_.max_grad_norm, FLAME_DTYPE_F32), ops::add_scalar(total, 1e-6)),
                              ops::scalar(c, 1.0, FLAME_DTYPE_F32));
    for (const Tensor& s : scaled)
      if (s->numel() > 0) ops::copy_into(s, ops::mul(s, ops::to_dtype(coef, s->dtype)));
  }
  return total;
}

// Bucket k: each rank's owned elements [k*n, (k+1)*n) of its shard, all-gathered in place so that
// piece r holds rank r's; every parameter element in those ranges is then copied back out. At most
// one bucket exists (no full flat copy of the parameters).
void ZeroOptimizer::gather_parameters(Flat& f) {
  Context& c = ctx();
  if (f.shard == 0) return;
  const int64_t world = comm_->world(), rank = comm_->rank(), S = f.shard;
  const int64_t n_max = bucket_piece(static_cast<int64_t>(dtype_size(f.dtype)), world, S);
  Tensor bucket = make_tensor(c, {world * n_max}, f.dtype);
  for (int64_t k0 = 0; k0 < S; k0 += n_max) {
    const int64_t n = std::min(n_max, S - k0);
    copy_flat_range(f, rank * S + k0, rank * S + k0 + n, flat_view(bucket, rank * n, n), false);
    const CUdeviceptr mine = bucket->data() + static_cast<CUdeviceptr>(rank * n) * bucket->elem_size();
    comm_->enqueue_all_gather(mine, bucket->data(), static_cast<size_t>(n), nccl_dtype(f.dtype), c.stream);
    for (int64_t r = 0; r < world; ++r) {
      const int64_t lo = r * S + k0, hi = lo + n;
      for (const Member& m : f.members) {
        const Tensor& p = m.param->param;
        const int64_t a = std::max(lo, m.offset), b = std::min(hi, m.offset + p->numel());
        if (a < b) ops::copy_into(param_part(p, a - m.offset, b - a), flat_view(bucket, r * n + (a - lo), b - a));
      }
    }
  }
  for (const Member& m : f.members)
    if (m.param->param->numel() > 0) m.param->param->storage->version.fetch_add(1);
}

bool ZeroOptimizer::values_sharded(const OptimParam& p) const {
  for (const auto& member : sharded_members_)
    if (member.first == &p) return true;
  return false;
}

Tensor ZeroOptimizer::step(bool want_norm) {
  comm_->check_usable();
  struct ConsumeShardGradients {  // stage 3: the next backward starts from zero, even after a failure
    ShardedParameters* sharded;
    ~ConsumeShardGradients() {
      if (sharded) sharded->consume_gradients();
    }
  } consume{sharded_.get()};
  std::vector<Tensor> shards;
  for (Flat& f : flats_) shards.push_back(reduce_gradients(f));
  const std::vector<Tensor> sharded_grads = sharded_ ? sharded_->gradient_shards() : std::vector<Tensor>{};
  Tensor norm;
  if (want_norm || opts_.max_grad_norm > 0) {
    // Stage 1 scales the whole averaged gradient (it stays in .grad); stages 2 and 3 only the shards.
    std::vector<Tensor> scaled = shards;
    if (opts_.stage == 1)
      for (size_t i = 0; i < flats_.size(); ++i)
        if (flats_[i].grads) scaled[i] = flats_[i].grads;
    std::vector<Tensor> all = shards;
    all.insert(all.end(), sharded_grads.begin(), sharded_grads.end());
    scaled.insert(scaled.end(), sharded_grads.begin(), sharded_grads.end());
    norm = clip(all, scaled);
  }
  const int64_t rank = comm_->rank();
  for (size_t i = 0; i < flats_.size(); ++i)
    for (const Member& m : flats_[i].members) {
      OptimParam& p = *m.param;
      const int64_t count = p.shard_hi - p.shard_lo;
      p.shard_grad = count > 0 ? flat_view(shards[i], m.offset + p.shard_lo - rank * flats_[i].shard, count) : Tensor();
    }
  for (auto& [p, part] : sharded_members_) {
    const int64_t count = part.hi - part.lo;
    p->shard_grad = count > 0 ? flat_view(sharded_grads.at(part.flat), part.at, count) : Tensor();
  }
  struct DropShardGrads {  // the shard buffers go back to the pool after the step, even on a failure
    std::vector<Flat>& flats;
    std::vector<std::pair<OptimParam*, ShardedParameters::Part>>& sharded;
    ~DropShardGrads() {
      for (Flat& f : flats)
        for (Member& m : f.members) m.param->shard_grad.reset();
      for (auto& s : sharded) s.first->shard_grad.reset();
    }
  } drop{flats_, sharded_members_};
  if (sharded_) sharded_->before_step();
  opt_->step_shard();
  for (Flat& f : flats_) gather_parameters(f);
  return norm;
}

}  // namespace flame

// Parameter sharding of a model's blocks (param_sharding.h): the layout, the collective set-up, the
// gather Source of the fetch ring, the ShardGather node and its reduce-scatter, the step's view.
#include "models/param_sharding.h"
#include <algorithm>
#include <array>
#include "core/error.h"
#include "ops/ops.h"

namespace flame::models {

namespace {

constexpr int64_t kAlignBytes = 256;  // every parameter, and every rank's shard, starts on this boundary

int64_t align_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

// A 1-D view of `count` elements of the 1-D contiguous `buf` from its element `at`.
Tensor flat_view(const Tensor& buf, int64_t at, int64_t count) { return make_view(buf, {count}, {1}, buf->offset + at); }

uint64_t fnv1a(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

ParamSharding::ParamSharding(std::shared_ptr<Model> model, std::shared_ptr<Comm> comm, const flame_zero_options_t& o)
    : model_(model), comm_(std::move(comm)), ctx_(model->ctx().shared_from_this()), slots_(o.gather_slots), comm_opts_(o),
      gather_bf16_(o.gather_dtype == FLAME_DTYPE_BF16) {}

// ---- set-up ----

void ParamSharding::check(Comm& comm) {
  std::shared_ptr<Model> m = model_.lock();
  FLAME_CHECK(m, FLAME_ERROR_INVALID_ARGUMENT, "the model to shard was released");
  FLAME_CHECK(&comm.ctx() == &m->ctx(), FLAME_ERROR_INVALID_ARGUMENT, "opts->model belongs to another context than the communicator");
  FLAME_CHECK(!m->sharded(), FLAME_ERROR_INVALID_ARGUMENT, "opts->model is sharded already (one stage-3 helper per model)");
  FLAME_CHECK(!m->options().offload.enabled, FLAME_ERROR_INVALID_ARGUMENT,
              "a model made with the option \"offload\" cannot be sharded over ranks (use one or the other)");
  FLAME_CHECK(!m->options().quantize.enabled, FLAME_ERROR_INVALID_ARGUMENT,
              "a model made with the option \"quantize\" cannot be sharded over ranks yet");
  FLAME_CHECK(m->block_params().learnt(), FLAME_ERROR_INVALID_ARGUMENT,
              "opts->model has not run a forward yet: run one (any inputs; with gradients off it costs no memory for a "
              "graph) so that it learns which parameters each block reads, then shard it");
  ctx_->forbid_in_capture("sharding a model's parameters");
  lay_out(*m);
}

void ParamSharding::lay_out(const Model& m) {
  flats_.clear();
  where_.clear();
  where_tensor_.clear();
  slot_bytes_ = 0;
  const int64_t world = comm_->world();
  const ParamStore& store = m.params();
  for (const BlockParams::Block& b : m.block_params().blocks()) {
    const std::vector<std::string> names = m.block_params().owned(b);
    if (names.empty()) continue;
    Flat f;
    f.block = b.index;
    f.dtype = store.get(names.front())->dtype;
    bool uniform = true;
    for (const std::string& n : names) uniform = uniform && store.get(n)->dtype == f.dtype && store.get(n)->contiguous();
    if (!uniform) continue;  // parameters of several dtypes (or strided): the block stays whole on every rank
    const int64_t elem = static_cast<int64_t>(dtype_size(f.dtype));
    const int64_t align = kAlignBytes / elem;
    int64_t total = 0;
    for (const std::string& n : names) {
      const Tensor& t = store.get(n);
      f.members.push_back({n, t, total});
      total = align_up(total + t->numel(), align);
    }
    f.shard = align_up((total + world - 1) / world, align);
    f.gather_bf16 = gather_bf16_ && f.dtype == FLAME_DTYPE_F32;
    // gather_dtype bf16: the slot holds the f32 values and, behind them, the gathered bf16 ones.
    const int64_t gathered_elem = f.gather_bf16 ? elem + static_cast<int64_t>(dtype_size(FLAME_DTYPE_BF16)) : elem;
    slot_bytes_ = std::max(slot_bytes_, static_cast<size_t>(world * f.shard * gathered_elem));
    for (size_t k = 0; k < f.members.size(); ++k) {
      where_[f.members[k].name] = Where{flats_.size(), k};
      where_tensor_[f.members[k].stored.get()] = Where{flats_.size(), k};
    }
    flats_.push_back(std::move(f));
  }
}

// Every rank must have learnt the same blocks (their first forwards took the same paths): compared
// before anything changes, so that a difference fails on every rank instead of mismatching NCCL calls.
void ParamSharding::check_same_layout_on_every_rank() {
  uint64_t h = 0xcbf29ce484222325ull;
  h = fnv1a(h, flats_.size());
  for (const Flat& f : flats_) {
    h = fnv1a(h, static_cast<uint64_t>(f.block));
    h = fnv1a(h, static_cast<uint64_t>(f.dtype));
    h = fnv1a(h, static_cast<uint64_t>(f.shard));
    h = fnv1a(h, f.gather_bf16 ? 1u : 0u);  // one rank gathering bf16 and another f32 would mismatch
    for (const Member& m : f.members) {
      h = fnv1a(h, static_cast<uint64_t>(m.offset));
      h = fnv1a(h, static_cast<uint64_t>(m.stored->numel()));
    }
  }
  const std::array<int64_t, 2> mine{static_cast<int64_t>(h), static_cast<int64_t>(flats_.size())};
  Tensor local = ops::from_host(*ctx_, mine.data(), sizeof mine, {2}, FLAME_DTYPE_I64);
  Tensor all = comm_->all_gather(local);
  comm_->synchronize();
  std::vector<int64_t> v(2 * static_cast<size_t>(comm_->world()));
  ops::to_host(all, v.data(), v.size() * sizeof(int64_t));
  for (int r = 0; r < comm_->world(); ++r)
    FLAME_CHECK(v[2 * r] == mine[0] && v[2 * r + 1] == mine[1], FLAME_ERROR_INVALID_ARGUMENT, "rank ", r,
                " learnt other blocks (", v[2 * r + 1], " sharded blocks) than rank ", comm_->rank(), " (", mine[1],
                "): every rank's model must have run the same first forward (same inputs' shapes and options)");
}

// This rank's elements of f's flat copied from the whole parameters into shard (zeros elsewhere).
void ParamSharding::copy_member_parts(const Flat& f, const Tensor& shard) {
  const int64_t first = comm_->rank() * f.shard, end = first + f.shard;
  ops::fill_(shard, 0.0);
  for (const Member& m : f.members) {
    const Tensor& p = m.stored;
    const int64_t lo = std::max(first, m.offset), hi = std::min(end, m.offset + p->numel());
    if (lo >= hi) continue;
    ops::copy_into(flat_view(shard, lo - first, hi - lo), make_view(p, {hi - lo}, {1}, p->offset + (lo - m.offset)));
  }
}

std::shared_ptr<BlockFetch> ParamSharding::make_fetch() {
  auto fetch = std::make_shared<BlockFetch>(*ctx_, slots_, slot_bytes_, "parameter sharding (flame_zero_create stage 3)");
  std::shared_ptr<Comm> comm = comm_;
  for (const Flat& f : flats_) {
    // gather_dtype bf16: the bf16 copies, into the slot's tail behind the f32 part.
    const Tensor value = f.gather_bf16 ? f.value_bf16 : f.value;  // kept alive by the Source
    const size_t count = static_cast<size_t>(f.shard);
    const ncclDataType_t dt = nccl_dtype(value->dtype);
    const CUdeviceptr at = f.gather_bf16 ? static_cast<CUdeviceptr>(comm->world() * f.shard * dtype_size(f.dtype)) : 0;
    BlockFetch::Source src;
    src.fetch = [comm, value, count, dt, at](CUdeviceptr dst, CUstream s) {
      comm->enqueue_all_gather(value->data(), dst + at, count, dt, s);
    };
    // The shards change only at a step, on every rank at once: a count of steps, the same on every
    // rank (a local version counter would not be: a rank whose part of a block is frozen would keep
    // its gathered copy while the others gather again, and the collectives would no longer match).
    src.version = [this] { return epoch_; };
    fetch->add_block(f.block, std::move(src));
    for (const Member& m : f.members) fetch->place(m.name, BlockFetch::Placement{f.block, m.offset});
  }
  // Every slot held (a graph recorded without checkpointing keeps its block's views): a one-off
  // buffer from the pool, gathered on the compute stream.
  fetch->set_overflow([this](int64_t block) -> std::shared_ptr<Storage> {
    for (const Flat& f : flats_)
      if (f.block == block) {
        auto storage = std::make_shared<Storage>(ctx_, slot_bytes_);
        const Tensor& value = f.gather_bf16 ? f.value_bf16 : f.value;
        const CUdeviceptr at = f.gather_bf16 ? static_cast<CUdeviceptr>(comm_->world() * f.shard * dtype_size(f.dtype)) : 0;
        comm_->enqueue_all_gather(value->data(), storage->ptr + at, static_cast<size_t>(f.shard), nccl_dtype(value->dtype),
                                  ctx_->stream);
        return storage;
      }
    return nullptr;
  });
  return fetch;
}

void ParamSharding::shard(bool broadcast) {
  std::shared_ptr<Model> m = model_.lock();
  FLAME_CHECK(m, FLAME_ERROR_INVALID_ARGUMENT, "the model to shard was released");
  Context& c = *ctx_;
  check_same_layout_on_every_rank();
  if (broadcast) {  // every rank starts from rank 0's values
    comm_->group_start();
    for (const Flat& f : flats_)
      for (const Member& mb : f.members)
        if (mb.stored->numel() > 0)
          comm_->enqueue_broadcast(mb.stored->data(), static_cast<size_t>(mb.stored->numel()), nccl_dtype(f.dtype), 0,
                                   c.stream);
    comm_->group_end();
    for (const Flat& f : flats_)
      for (const Member& mb : f.members) mb.stored->storage->version.fetch_add(1);
  }
  // Everything that can fail first (the shards, the ring), built aside...
  std::vector<Tensor> values;
  for (const Flat& f : flats_) {
    Tensor v = make_tensor(c, {f.shard}, f.dtype);
    copy_member_parts(f, v);
    values.push_back(v);
  }
  std::vector<Tensor> values_bf16;  // gather_dtype bf16: the shards rounded, for the gathers
  for (size_t i = 0; i < flats_.size(); ++i)
    values_bf16.push_back(flats_[i].gather_bf16 ? ops::to_dtype(values[i], FLAME_DTYPE_BF16) : Tensor());
  for (size_t i = 0; i < flats_.size(); ++i) {
    flats_[i].value = values[i];
    flats_[i].value_bf16 = values_bf16[i];
  }
  bf16_epoch_ = epoch_;
  std::shared_ptr<BlockFetch> fetch;
  try {
    fetch = make_fetch();
  } catch (...) {
    for (Flat& f : flats_) {
      f.value.reset();
      f.value_bf16.reset();
    }
    throw;
  }
  // ...then the parameters give their memory up (back to the pool in stream order, after the copies).
  for (Flat& f : flats_)
    for (Member& mb : f.members) {
      TensorImpl& t = *mb.stored;
      std::shared_ptr<Storage> none = empty_storage(ctx_);
      none->version.store(t.storage->version.load());
      t.storage = std::move(none);
      t.offset = 0;
      if (t.autograd) t.autograd->grad.reset();  // whole-parameter gradients have no place any more
    }
  fetch_ = std::move(fetch);
  m->set_sharding(shared_from_this());
  size_t sharded = 0;
  for (const Flat& f : flats_) sharded += f.members.size();
  c.log.write(FLAME_LOG_INFO, "parameter sharding: " + std::to_string(flats_.size()) + " of " +
                                  std::to_string(m->block_params().blocks().size()) + " blocks (" + std::to_string(sharded) +
                                  " parameters) sharded over " + std::to_string(comm_->world()) + " ranks, ring of " +
                                  std::to_string(slots_) + " x " + std::to_string(slot_bytes_) + " bytes");
}

// ---- the step's view (toolkit/zero.h) ----

bool ParamSharding::part(const TensorImpl& p, Part* out) const {
  auto it = where_tensor_.find(&p);
  if (it == where_tensor_.end() || !fetch_) return false;
  const Flat& f = flats_[it->second.flat];
  const Member& m = f.members[it->second.member];
  const int64_t first = comm_->rank() * f.shard;
  const int64_t lo = std::max(first, m.offset), hi = std::min(first + f.shard, m.offset + p.numel());
  Part r;
  r.flat = it->second.flat;
  if (lo < hi) {
    r.lo = lo - m.offset;
    r.hi = hi - m.offset;
    r.at = lo - first;
    r.value = flat_view(f.value, r.at, hi - lo);
  }
  *out = r;
  return true;
}

void ParamSharding::before_step() {
  ++epoch_;  // every gathered block is stale from now on
  if (fetch_) fetch_->compute_after_fetch();  // no gather in flight reads a shard the step writes
}

std::vector<Tensor> ParamSharding::gradient_shards() {
  std::vector<Tensor> out;
  for (Flat& f : flats_) {
    if (!f.grad) {  // no gradient arrived since the last step: zeros
      f.grad = make_tensor(*ctx_, {f.shard}, f.dtype);
      ops::fill_(f.grad, 0.0);
    }
    out.push_back(f.grad);
  }
  return out;
}

void ParamSharding::consume_gradients() noexcept {
  for (Flat& f : flats_) f.grad.reset();
}

// ---- forward and backward ----

void ParamSharding::refresh_bf16_shards() {
  if (bf16_epoch_ == epoch_) return;
  // On the compute stream, after the step that wrote the shards; every later gather is enqueued
  // after it (a fill makes the fetch stream wait for the compute stream).
  for (Flat& f : flats_)
    if (f.gather_bf16) ops::copy_into(f.value_bf16, f.value);
  bf16_epoch_ = epoch_;
}

void ParamSharding::widen_gathered(int64_t block) {
  for (const Flat& f : flats_) {
    if (f.block != block || !f.gather_bf16) continue;
    std::shared_ptr<Storage> storage = fetch_->active_storage(block);
    if (!storage) return;
    const int64_t n = comm_->world() * f.shard;
    // Both views of the entry's own Storage, made before any view the block computes with.
    ops::copy_into(make_tensor_over(storage, {n}, FLAME_DTYPE_F32, 0), make_tensor_over(storage, {n}, FLAME_DTYPE_BF16, 2 * n));
    return;
  }
}

void ParamSharding::enter_block(int64_t block, bool recompute) {
  ctx_->forbid_in_capture("a block of a model with parameter sharding (flame_zero_create stage 3)");
  refresh_bf16_shards();
  fetch_->enter_block(block, recompute);
  try {
    widen_gathered(block);
    active_.push_back({block, nullptr});
  } catch (...) {
    fetch_->leave_block();
    throw;
  }
}

void ParamSharding::leave_block() noexcept {
  if (!active_.empty()) active_.pop_back();
  fetch_->leave_block();
}

std::shared_ptr<Node> ParamSharding::gather_node(size_t flat) {
  const int64_t block = flats_[flat].block;
  for (auto a = active_.rbegin(); a != active_.rend(); ++a) {
    if (a->block != block) continue;
    if (!a->node) {
      auto node = std::make_shared<Node>();
      node->op = OpId::ShardGather;
      node->num_outputs = static_cast<uint32_t>(flats_[flat].members.size());
      std::shared_ptr<ParamSharding> self = shared_from_this();
      node->backward = [self, flat](Node&, const std::vector<Tensor>& grads) {
        self->reduce_gradients(flat, grads);
        return std::vector<Tensor>{};
      };
      a->node = std::move(node);
    }
    return a->node;
  }
  fail(FLAME_ERROR_INTERNAL, "a sharded block's parameter read while the block is not active");
}

Tensor ParamSharding::use(const std::string& name, const Tensor& stored) {
  auto it = where_.find(name);
  if (it == where_.end()) return stored;
  Tensor v = fetch_->active_view(name, stored);
  FLAME_CHECK(v, FLAME_ERROR_INVALID_ARGUMENT, "parameter ", name,
              " is sharded over ranks (flame_zero_create stage 3) and is read outside its block; the model must read "
              "each block's parameters inside that block only, as in its first forward");
  if (ctx_->recording() && requires_grad(*stored)) {
    AutogradMeta& meta = autograd_meta(*v);
    meta.requires_grad = true;
    meta.grad_fn = gather_node(it->second.flat);
    meta.output_nr = static_cast<uint32_t>(it->second.member);
  }
  return v;
}

// The backward of a block entry's ShardGather node: one gradient per parameter of the block (null
// where none arrived). Packs them as the flat, reduce-scatters (average) on the compute stream and
// adds this rank's part to the block's gradient shard.
void ParamSharding::reduce_gradients(size_t flat, const std::vector<Tensor>& grads) {
  Context& c = *ctx_;
  if (!c.mode.backward_accumulates) return;  // a flame_grad walk: these gradients are not asked for
  FLAME_CHECK(!c.mode.grad_enabled, FLAME_ERROR_UNSUPPORTED,
              "higher-order gradients (create_graph) through sharded parameters are not supported");
  comm_->check_usable();
  Flat& f = flats_[flat];
  const int64_t world = comm_->world();
  const DType reduce = zero_reduce_dtype(comm_opts_, f.dtype);  // opts->reduce_dtype
  Tensor packed = make_tensor(c, {world * f.shard}, reduce);
  ops::fill_(packed, 0.0);
  for (size_t k = 0; k < f.members.size() && k < grads.size(); ++k) {
    if (!grads[k]) continue;
    const Member& m = f.members[k];
    FLAME_CHECK(grads[k]->shape == m.stored->shape, FLAME_ERROR_INTERNAL, "the gradient of sharded parameter ", m.name,
                " has shape ", shape_str(grads[k]->shape));
    const Tensor g = grads[k]->dtype == reduce ? alias(grads[k]) : ops::to_dtype(alias(grads[k]), reduce);
    ops::copy_into(make_view(packed, m.stored->shape, contiguous_strides(m.stored->shape), m.offset), g);
  }
  Tensor mine = make_tensor(c, {f.shard}, reduce);
  comm_->enqueue_reduce_scatter(packed->data(), mine->data(), static_cast<size_t>(f.shard), nccl_dtype(reduce), ncclAvg,
                                c.stream);
  if (reduce != f.dtype) mine = ops::to_dtype(mine, f.dtype);  // the shard accumulates in the parameters' dtype
  f.grad = f.grad ? ops::add(f.grad, mine) : mine;
}

// ---- gathering the whole parameters ----

std::vector<std::pair<std::string, Tensor>> ParamSharding::gather_params() {
  std::shared_ptr<Model> m = model_.lock();
  FLAME_CHECK(m, FLAME_ERROR_INVALID_ARGUMENT, "the sharded model was released");
  comm_->check_usable();
  Context& c = *ctx_;
  GradModeGuard no_grad(c, c.mode.with_grad(false));
  std::unordered_map<const TensorImpl*, Tensor> gathered;
  for (const Flat& f : flats_) {
    Tensor whole = make_tensor(c, {comm_->world() * f.shard}, f.dtype);
    comm_->enqueue_all_gather(f.value->data(), whole->data(), static_cast<size_t>(f.shard), nccl_dtype(f.dtype), c.stream);
    for (const Member& mb : f.members)
      gathered[mb.stored.get()] =
          ops::clone(make_view(whole, mb.stored->shape, contiguous_strides(mb.stored->shape), mb.offset));
  }
  std::vector<std::pair<std::string, Tensor>> out;
  const ParamStore& store = m->params();
  for (size_t i = 0; i < store.size(); ++i) {
    auto it = gathered.find(store.tensors()[i].get());
    out.emplace_back(store.names()[i], it != gathered.end() ? it->second : store.tensors()[i]);
  }
  return out;
}

}  // namespace flame::models

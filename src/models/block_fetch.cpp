// The ring of device slots a block's weights are fetched into (block_fetch.h): slots, fetch stream,
// events, and the block scopes that acquire and prefetch.
#include "models/block_fetch.h"
#include <algorithm>
#include "core/error.h"

namespace flame::models {

struct BlockFetch::Ring {
  struct Slot {
    CUdeviceptr ptr = 0;
    CUevent filled = nullptr;  // recorded on the fetch stream after its last fill
    int64_t block = -1;        // whose weights it holds (-1: none)
    uint64_t version = 0;      // that block's Source version at the fill
    int holds = 0;             // live Storages viewing it
    uint64_t last_use = 0;
  };

  std::shared_ptr<Context> ctx;
  CUstream stream = nullptr;        // the fetch stream
  CUevent compute_point = nullptr;  // recorded on the compute stream before each fill
  CUevent fetch_done = nullptr;     // the fetch stream's last work, for the destructor
  CUdeviceptr base = 0;
  size_t slot_bytes = 0, total_bytes = 0;
  std::vector<Slot> slots;
  std::unordered_map<int64_t, Source> sources;
  uint64_t clock = 0;

  Ring(std::shared_ptr<Context> c, int n, size_t bytes) : ctx(std::move(c)), slot_bytes(bytes), slots(n) {
    Context& x = *ctx;
    try {
      x.check(x.drv.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate (block fetch)");
      x.check(x.drv.cuEventCreate(&compute_point, CU_EVENT_DISABLE_TIMING), "cuEventCreate (block fetch)");
      x.check(x.drv.cuEventCreate(&fetch_done, CU_EVENT_DISABLE_TIMING), "cuEventCreate (block fetch)");
      for (Slot& s : slots) x.check(x.drv.cuEventCreate(&s.filled, CU_EVENT_DISABLE_TIMING), "cuEventCreate (block fetch)");
      total_bytes = slot_bytes * slots.size();
      if (total_bytes) base = x.allocate(total_bytes);
    } catch (...) {
      destroy();
      throw;
    }
    for (size_t i = 0; i < slots.size(); ++i) slots[i].ptr = base + i * slot_bytes;
  }
  ~Ring() { destroy(); }
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  void destroy() noexcept {
    Driver& d = ctx->drv;
    if (stream && fetch_done && d.cuEventRecord(fetch_done, stream) == CUDA_SUCCESS)
      d.cuStreamWaitEvent(ctx->stream, fetch_done, 0);  // the pool reuses the slots only after the fetches
    if (stream) d.cuStreamSynchronize(stream);  // what the fetches read may be freed next (model gone: not in a step)
    if (base) ctx->deallocate(base, total_bytes);
    for (Slot& s : slots)
      if (s.filled) d.cuEventDestroy(s.filled);
    if (compute_point) d.cuEventDestroy(compute_point);
    if (fetch_done) d.cuEventDestroy(fetch_done);
    if (stream) d.cuStreamDestroy(stream);
  }

  void fetch_after_compute() {
    Context& x = *ctx;
    x.check(x.drv.cuEventRecord(compute_point, x.stream), "cuEventRecord (block fetch)");
    x.check(x.drv.cuStreamWaitEvent(stream, compute_point, 0), "cuStreamWaitEvent (block fetch)");
  }

  // A slot that no tensor views, least recently used first; -1 when all are held.
  int free_slot() const {
    int best = -1;
    for (size_t i = 0; i < slots.size(); ++i) {
      const Slot& s = slots[i];
      if (s.holds > 0) continue;
      if (best < 0 || s.block < 0 || (slots[best].block >= 0 && s.last_use < slots[best].last_use)) best = static_cast<int>(i);
      if (s.block < 0) break;
    }
    return best;
  }

  // Fetches block's weights into slot s on the fetch stream, after everything enqueued on the
  // compute stream so far (the kernels that read the slot's previous contents, and any write to
  // the weights).
  void fill(int s, int64_t block) {
    const Source& src = sources.at(block);
    Slot& slot = slots[s];
    fetch_after_compute();
    slot.block = -1;  // until the fetch is enqueued
    src.fetch(slot.ptr, stream);
    Context& x = *ctx;
    x.check(x.drv.cuEventRecord(slot.filled, stream), "cuEventRecord (block fetch)");
    slot.block = block;
    slot.version = src.version();
  }

  // The slot holding block's current weights (-1: none).
  int find(int64_t block) const {
    const uint64_t v = sources.at(block).version();
    for (size_t i = 0; i < slots.size(); ++i)
      if (slots[i].block == block && slots[i].version == v) return static_cast<int>(i);
    return -1;
  }

  // Starts fetching block into a free slot unless a slot holds its current weights already.
  void prefetch(int64_t block) {
    if (find(block) >= 0) return;
    const int f = free_slot();
    if (f >= 0) fill(f, block);
  }

  // The slot holding block, ready for the compute stream (which waits for its fetch), or -1 when
  // every slot is held by other tensors.
  int acquire(int64_t block) {
    int s = find(block);
    if (s < 0) {
      s = free_slot();
      if (s < 0) return -1;
      fill(s, block);
    }
    Context& x = *ctx;
    x.check(x.drv.cuStreamWaitEvent(x.stream, slots[s].filled, 0), "cuStreamWaitEvent (block fetch)");
    slots[s].last_use = ++clock;
    return s;
  }

  void release(int s) noexcept { --slots[s].holds; }
};

BlockFetch::BlockFetch(Context& ctx, int slots, size_t slot_bytes, std::string feature)
    : ctx_(ctx.shared_from_this()), feature_(std::move(feature)),
      ring_(std::make_shared<Ring>(ctx_, slots, slot_bytes)) {}

BlockFetch::~BlockFetch() = default;

size_t BlockFetch::slot_bytes() const { return ring_->slot_bytes; }

CUstream BlockFetch::fetch_stream() const { return ring_->stream; }

void BlockFetch::fetch_after_compute() { ring_->fetch_after_compute(); }

void BlockFetch::compute_after_fetch() {
  Context& x = *ctx_;
  x.check(x.drv.cuEventRecord(ring_->fetch_done, ring_->stream), "cuEventRecord (block fetch)");
  x.check(x.drv.cuStreamWaitEvent(x.stream, ring_->fetch_done, 0), "cuStreamWaitEvent (block fetch)");
}

void BlockFetch::add_block(int64_t block, Source source) {
  ring_->sources[block] = std::move(source);
  auto at = std::lower_bound(blocks_.begin(), blocks_.end(), block);
  if (at == blocks_.end() || *at != block) blocks_.insert(at, block);
}

void BlockFetch::place(const std::string& name, Placement p) { placed_[name] = p; }

bool BlockFetch::fetches(int64_t block) const { return std::binary_search(blocks_.begin(), blocks_.end(), block); }

const BlockFetch::Placement* BlockFetch::placement(const std::string& name) const {
  auto it = placed_.find(name);
  return it == placed_.end() ? nullptr : &it->second;
}

int64_t BlockFetch::next_fetched(int64_t block, bool reverse) const {
  if (reverse) {
    auto it = std::lower_bound(blocks_.begin(), blocks_.end(), block);
    return it == blocks_.begin() ? -1 : *(it - 1);
  }
  auto it = std::upper_bound(blocks_.begin(), blocks_.end(), block);
  return it == blocks_.end() ? -1 : *it;
}

void BlockFetch::enter_block(int64_t block, bool recompute) {
  ctx_->forbid_in_capture(("a block of a model with " + feature_).c_str());
  Active a;
  a.block = block;
  if (fetches(block)) {
    const int s = ring_->acquire(block);
    if (s >= 0) {
      std::shared_ptr<Ring> ring = ring_;
      a.storage = std::make_shared<Storage>(ctx_, ring->slots[s].ptr, ring->slot_bytes, [ring, s] { ring->release(s); });
      ++ring->slots[s].holds;
    } else if (overflow_) {
      a.storage = overflow_(block);
    }
  }
  const int64_t next = next_fetched(block, recompute);
  if (next >= 0) ring_->prefetch(next);
  active_.push_back(std::move(a));
}

void BlockFetch::leave_block() noexcept {
  if (!active_.empty()) active_.pop_back();  // the slot stays held while views of it live
}

std::shared_ptr<Storage> BlockFetch::active_storage(int64_t block) const {
  for (auto a = active_.rbegin(); a != active_.rend(); ++a)
    if (a->block == block) return a->storage;
  return nullptr;
}

Tensor BlockFetch::active_view(const std::string& name, const Tensor& stored) const {
  const Placement* p = placement(name);
  if (!p) return nullptr;
  for (auto a = active_.rbegin(); a != active_.rend(); ++a)
    if (a->block == p->block && a->storage) return make_tensor_over(a->storage, stored->shape, stored->dtype, p->offset_elements);
  return nullptr;
}

}  // namespace flame::models

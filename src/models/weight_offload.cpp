// Offload of frozen block weights (weight_offload.h): the option, learning the blocks, the plan,
// the pinned host buffers and the ring of device slots filled on a copy stream.
#include "models/weight_offload.h"
#include <algorithm>
#include <cmath>
#include "core/error.h"
#include "tensor/autograd_graph.h"

namespace flame::models {

namespace {

constexpr size_t kSlotAlign = 256;  // every parameter starts on a 256-byte boundary of its slot

size_t align_up(size_t n) { return (n + kSlotAlign - 1) / kSlotAlign * kSlotAlign; }

size_t param_bytes(const Tensor& t) { return static_cast<size_t>(t->numel()) * t->elem_size(); }

// One offloaded block's parameters in pinned host memory, mapped into the device's address space.
struct HostBuffer {
  std::shared_ptr<Context> ctx;
  void* host = nullptr;
  CUdeviceptr device = 0;
  size_t bytes = 0;
  HostBuffer(std::shared_ptr<Context> c, size_t n) : ctx(std::move(c)), bytes(n) {
    ctx->check(ctx->drv.cuMemHostAlloc(&host, n, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP),
               "cuMemHostAlloc (offloaded weights)");
    const CUresult r = ctx->drv.cuMemHostGetDevicePointer(&device, host, 0);
    if (r != CUDA_SUCCESS) {
      ctx->drv.cuMemFreeHost(host);
      ctx->check(r, "cuMemHostGetDevicePointer (offloaded weights)");
    }
  }
  ~HostBuffer() {
    if (!host) return;
    // Kernels may still read it through its mapping (a parameter's last use): wait for them first.
    // This runs when the model and the parameter tensors are gone, never inside a step.
    ctx->drv.cuStreamSynchronize(ctx->stream);
    ctx->drv.cuMemFreeHost(host);
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
};

}  // namespace

// ---- the option ----

uint64_t OffloadOptions::budget_for(uint64_t total_bytes) const {
  if (budget_fraction < 0) return budget_bytes;
  return static_cast<uint64_t>(std::floor(budget_fraction * static_cast<double>(total_bytes)));
}

OffloadOptions parse_offload_options(const nlohmann::json& v) {
  OffloadOptions o;
  if (v.is_null()) return o;
  FLAME_CHECK(v.is_object(), FLAME_ERROR_INVALID_ARGUMENT,
              "options: \"offload\" must be an object such as {\"budget_bytes\": 12000000000} or {\"budget_fraction\": 0.5}");
  for (auto it = v.begin(); it != v.end(); ++it)
    FLAME_CHECK(it.key() == "budget_bytes" || it.key() == "budget_fraction" || it.key() == "slots",
                FLAME_ERROR_INVALID_ARGUMENT, "options: unknown key \"offload.", it.key(),
                "\" (known: budget_bytes, budget_fraction, slots)");
  const bool by_bytes = v.contains("budget_bytes"), by_fraction = v.contains("budget_fraction");
  FLAME_CHECK(by_bytes != by_fraction, FLAME_ERROR_INVALID_ARGUMENT,
              "options: \"offload\" takes exactly one of \"budget_bytes\" and \"budget_fraction\"");
  if (by_bytes) {
    const nlohmann::json& b = v["budget_bytes"];
    FLAME_CHECK(b.is_number_unsigned() || (b.is_number_integer() && b.get<int64_t>() >= 0), FLAME_ERROR_INVALID_ARGUMENT,
                "options: \"offload.budget_bytes\" must be an integer >= 0");
    o.budget_bytes = b.get<uint64_t>();
  } else {
    const nlohmann::json& f = v["budget_fraction"];
    FLAME_CHECK(f.is_number(), FLAME_ERROR_INVALID_ARGUMENT, "options: \"offload.budget_fraction\" must be a number");
    o.budget_fraction = f.get<double>();
    FLAME_CHECK(o.budget_fraction >= 0 && o.budget_fraction <= 1, FLAME_ERROR_INVALID_ARGUMENT,
                "options: \"offload.budget_fraction\" must lie in [0, 1] (the share of the parameters' bytes kept on the "
                "device), not ", o.budget_fraction);
  }
  if (v.contains("slots")) {
    const nlohmann::json& s = v["slots"];
    FLAME_CHECK(s.is_number_integer() && s.get<int64_t>() >= 2 && s.get<int64_t>() <= 64, FLAME_ERROR_INVALID_ARGUMENT,
                "options: \"offload.slots\" must be an integer from 2 to 64");
    o.slots = static_cast<int32_t>(s.get<int64_t>());
  }
  o.enabled = true;
  return o;
}

// ---- the ring ----

struct WeightOffload::Ring {
  struct Slot {
    CUdeviceptr ptr = 0;
    CUevent filled = nullptr;   // recorded on the copy stream after its last fill
    int64_t block = -1;         // whose weights it holds (-1: none)
    uint64_t versions = 0;      // the sum of that block's parameter versions at the fill
    int holds = 0;              // live Storages viewing it
    uint64_t last_use = 0;
  };
  struct HostBlock {
    std::shared_ptr<HostBuffer> buffer;
    std::vector<Tensor> params;  // to notice writes to the frozen weights (their version counters)
  };

  std::shared_ptr<Context> ctx;
  CUstream copy = nullptr;
  CUevent compute_point = nullptr;  // recorded on the compute stream before each fill
  CUevent copy_done = nullptr;      // the copy stream's last work, for the destructor
  CUdeviceptr base = 0;
  size_t slot_bytes = 0, total_bytes = 0;
  std::vector<Slot> slots;
  std::unordered_map<int64_t, HostBlock> host;
  uint64_t clock = 0;

  Ring(std::shared_ptr<Context> c, int n, size_t bytes) : ctx(std::move(c)), slot_bytes(bytes), slots(n) {
    Context& x = *ctx;
    try {
      x.check(x.drv.cuStreamCreate(&copy, CU_STREAM_NON_BLOCKING), "cuStreamCreate (weight offload)");
      x.check(x.drv.cuEventCreate(&compute_point, CU_EVENT_DISABLE_TIMING), "cuEventCreate (weight offload)");
      x.check(x.drv.cuEventCreate(&copy_done, CU_EVENT_DISABLE_TIMING), "cuEventCreate (weight offload)");
      for (Slot& s : slots) x.check(x.drv.cuEventCreate(&s.filled, CU_EVENT_DISABLE_TIMING), "cuEventCreate (weight offload)");
      total_bytes = slot_bytes * slots.size();
      base = x.allocate(total_bytes);
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
    if (copy && copy_done && d.cuEventRecord(copy_done, copy) == CUDA_SUCCESS)
      d.cuStreamWaitEvent(ctx->stream, copy_done, 0);  // the pool reuses the slots only after the copies
    if (copy) d.cuStreamSynchronize(copy);  // the host buffers it reads are freed next (model gone: not in a step)
    if (base) ctx->deallocate(base, total_bytes);
    for (Slot& s : slots)
      if (s.filled) d.cuEventDestroy(s.filled);
    if (compute_point) d.cuEventDestroy(compute_point);
    if (copy_done) d.cuEventDestroy(copy_done);
    if (copy) d.cuStreamDestroy(copy);
  }

  uint64_t versions_of(const HostBlock& h) const {
    uint64_t v = 0;
    for (const Tensor& p : h.params) v += p->storage->version.load();
    return v;
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

  // Copies block's weights into slot s on the copy stream, after everything enqueued on the compute
  // stream so far (the kernels that read the slot's previous contents, and any write to the weights).
  void fill(int s, int64_t block) {
    const HostBlock& h = host.at(block);
    Slot& slot = slots[s];
    Context& x = *ctx;
    x.check(x.drv.cuEventRecord(compute_point, x.stream), "cuEventRecord (weight offload)");
    x.check(x.drv.cuStreamWaitEvent(copy, compute_point, 0), "cuStreamWaitEvent (weight offload)");
    slot.block = -1;  // until the copy is enqueued
    x.check(x.drv.cuMemcpyHtoDAsync(slot.ptr, h.buffer->host, h.buffer->bytes, copy), "cuMemcpyHtoDAsync (weight offload)");
    x.check(x.drv.cuEventRecord(slot.filled, copy), "cuEventRecord (weight offload)");
    slot.block = block;
    slot.versions = versions_of(h);
  }

  int find(int64_t block) const {
    for (size_t i = 0; i < slots.size(); ++i)
      if (slots[i].block == block) return static_cast<int>(i);
    return -1;
  }

  // Starts copying block into a free slot unless a slot holds it already.
  void prefetch(int64_t block) {
    const int s = find(block);
    if (s >= 0 && (slots[s].holds > 0 || slots[s].versions == versions_of(host.at(block)))) return;
    const int f = s >= 0 ? s : free_slot();
    if (f >= 0) fill(f, block);
  }

  // The slot holding block, ready for the compute stream (which waits for its copy), or -1 when
  // every slot is held by other blocks.
  int acquire(int64_t block) {
    int s = find(block);
    if (s >= 0 && slots[s].holds == 0 && slots[s].versions != versions_of(host.at(block))) fill(s, block);
    if (s < 0) {
      s = free_slot();
      if (s < 0) return -1;
      fill(s, block);
    }
    Context& x = *ctx;
    x.check(x.drv.cuStreamWaitEvent(x.stream, slots[s].filled, 0), "cuStreamWaitEvent (weight offload)");
    slots[s].last_use = ++clock;
    return s;
  }

  void release(int s) noexcept { --slots[s].holds; }
};

// ---- WeightOffload ----

WeightOffload::WeightOffload(Context& ctx, const OffloadOptions& options)
    : ctx_(ctx.shared_from_this()), options_(options) {}

WeightOffload::~WeightOffload() = default;

bool WeightOffload::offloads(int64_t block_index) const {
  return std::binary_search(offloaded_.begin(), offloaded_.end(), block_index);
}

void WeightOffload::begin_forward() {
  if (learnt_) return;
  // The first forward (or one after a forward that failed half-way) learns the blocks afresh.
  learning_ = true;
  blocks_.clear();
  block_pos_.clear();
  owner_.clear();
}

void WeightOffload::end_forward(const std::vector<std::string>& names, const std::vector<Tensor>& tensors) {
  if (learning_) {
    learning_ = false;
    learnt_ = true;
  }
  if (!planned_) plan(names, tensors);
}

int64_t WeightOffload::next_offloaded(int64_t block_index, bool reverse) const {
  if (reverse) {
    auto it = std::lower_bound(offloaded_.begin(), offloaded_.end(), block_index);
    return it == offloaded_.begin() ? -1 : *(it - 1);
  }
  auto it = std::upper_bound(offloaded_.begin(), offloaded_.end(), block_index);
  return it == offloaded_.end() ? -1 : *it;
}

void WeightOffload::enter_block(int64_t block_index, bool recompute) {
  Active a;
  a.block = block_index;
  if (learning_ && !block_pos_.count(block_index)) {
    block_pos_.emplace(block_index, blocks_.size());
    blocks_.push_back(Block{block_index, {}});
  }
  if (ring_) {
    ctx_->forbid_in_capture("a block of a model with weight offload (the model option \"offload\")");
    if (offloads(block_index)) {
      a.slot = ring_->acquire(block_index);
      if (a.slot >= 0) {
        std::shared_ptr<Ring> ring = ring_;
        const int s = a.slot;
        a.storage = std::make_shared<Storage>(ctx_, ring->slots[s].ptr, ring->slot_bytes, [ring, s] { ring->release(s); });
        ++ring->slots[s].holds;
      }
    }
    const int64_t next = next_offloaded(block_index, recompute);
    if (next >= 0) ring_->prefetch(next);
  }
  active_.push_back(std::move(a));
}

void WeightOffload::leave_block() noexcept {
  if (!active_.empty()) active_.pop_back();  // the slot stays held while views of it live
}

Tensor WeightOffload::use(const std::string& name, const Tensor& stored) {
  if (learning_) {
    const int64_t block = active_.empty() ? -1 : active_.back().block;
    auto it = owner_.find(name);
    if (it == owner_.end()) {
      owner_.emplace(name, block);
      if (block >= 0) blocks_[block_pos_.at(block)].names.push_back(name);
    } else if (it->second != block) {
      it->second = -1;  // read by two blocks, or outside blocks: stays resident
    }
    return stored;
  }
  auto it = placed_.find(name);
  if (it == placed_.end()) return stored;
  FLAME_CHECK(!requires_grad(*stored), FLAME_ERROR_INVALID_ARGUMENT, "parameter ", name,
              " is offloaded to host memory (the model option \"offload\") and must stay frozen: set its requires_grad "
              "back to false, or make the model without offload to train it");
  for (auto a = active_.rbegin(); a != active_.rend(); ++a)
    if (a->block == it->second.block && a->storage)
      return make_tensor_over(a->storage, stored->shape, stored->dtype, it->second.offset_elements);
  return stored;  // outside its block, or no free slot: the mapped host memory, read in place
}

void WeightOffload::plan(const std::vector<std::string>& names, const std::vector<Tensor>& tensors) {
  std::unordered_map<std::string, size_t> index;
  uint64_t total = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    index.emplace(names[i], i);
    total += param_bytes(tensors[i]);
  }
  const uint64_t budget = options_.budget_for(total);
  if (total <= budget) {
    planned_ = true;  // everything fits: nothing to offload, for good
    return;
  }
  // Blocks whose parameters (read by that block only) are all frozen and contiguous, in execution order.
  std::vector<Chosen> eligible;
  for (size_t b = 0; b < blocks_.size(); ++b) {
    Chosen c;
    c.block = b;
    bool ok = true;
    for (const std::string& n : blocks_[b].names) {
      if (owner_.at(n) != blocks_[b].index) continue;
      const size_t i = index.at(n);
      const Tensor& t = tensors[i];
      ok = ok && !requires_grad(*t) && t->contiguous() && !t->storage->release_external;
      c.params.push_back(i);
      c.offsets.push_back(c.bytes);
      c.bytes += align_up(param_bytes(t));
    }
    if (ok && !c.params.empty()) eligible.push_back(std::move(c));
  }
  if (eligible.empty()) {
    if (!warned_unfrozen_)
      ctx_->log.write(FLAME_LOG_WARNING, "model option offload: no block has all its parameters frozen, so nothing is "
                                         "offloaded yet (freeze the base first, e.g. with a LoRA adapter's freeze_base)");
    warned_unfrozen_ = true;
    return;
  }
  std::vector<Chosen> chosen;
  uint64_t moved = 0, slot_bytes = 0;
  auto resident = [&] { return total - moved + static_cast<uint64_t>(options_.slots) * slot_bytes; };
  for (Chosen& c : eligible) {
    for (size_t i : c.params) moved += param_bytes(tensors[i]);
    slot_bytes = std::max<uint64_t>(slot_bytes, c.bytes);
    chosen.push_back(std::move(c));
    if (resident() <= budget) break;
  }
  FLAME_CHECK(resident() <= budget, FLAME_ERROR_INVALID_ARGUMENT, "model option offload: a budget of ", budget,
              " bytes cannot be met: with all ", chosen.size(), " blocks whose parameters are frozen in host memory, ",
              resident(), " bytes stay on the device (", total - moved, " bytes of other parameters, plus ",
              options_.slots, " ring slots of ", slot_bytes, " bytes)");
  apply(tensors, chosen, slot_bytes);
  planned_ = true;
  ctx_->log.write(FLAME_LOG_INFO, "model option offload: " + std::to_string(chosen.size()) + " of " +
                                      std::to_string(blocks_.size()) + " blocks (" + std::to_string(moved) +
                                      " bytes) in host memory, ring of " + std::to_string(options_.slots) + " x " +
                                      std::to_string(slot_bytes) + " bytes");
}

void WeightOffload::apply(const std::vector<Tensor>& tensors, const std::vector<Chosen>& chosen, size_t slot_bytes) {
  Context& x = *ctx_;
  // Everything that can fail first: the ring, then the host buffers and their copies.
  auto ring = std::make_shared<Ring>(ctx_, options_.slots, slot_bytes);
  std::vector<std::shared_ptr<HostBuffer>> buffers;
  for (const Chosen& c : chosen) {
    auto buffer = std::make_shared<HostBuffer>(ctx_, c.bytes);
    for (size_t k = 0; k < c.params.size(); ++k) {
      const Tensor& t = tensors[c.params[k]];
      x.check(x.drv.cuMemcpyDtoHAsync(static_cast<char*>(buffer->host) + c.offsets[k], t->data(), param_bytes(t), x.stream),
              "cuMemcpyDtoHAsync (offloading weights)");
    }
    buffers.push_back(std::move(buffer));
  }
  // The copy stream starts after the ring's allocation and these copies (stream order, no host wait).
  x.check(x.drv.cuEventRecord(ring->compute_point, x.stream), "cuEventRecord (weight offload)");
  x.check(x.drv.cuStreamWaitEvent(ring->copy, ring->compute_point, 0), "cuStreamWaitEvent (weight offload)");

  // The new state, built aside (an allocation failure changes nothing)...
  std::unordered_map<std::string, Placement> placed;
  std::vector<int64_t> offloaded;
  std::vector<std::pair<Tensor, std::shared_ptr<Storage>>> swaps;
  for (size_t j = 0; j < chosen.size(); ++j) {
    const Chosen& c = chosen[j];
    const Block& b = blocks_[c.block];
    Ring::HostBlock hb;
    hb.buffer = buffers[j];
    size_t k = 0;
    for (const std::string& n : b.names) {
      if (owner_.at(n) != b.index) continue;  // c.params lists the block's own parameters in this order
      const Tensor& t = tensors[c.params[k]];
      std::shared_ptr<HostBuffer> keep = buffers[j];
      swaps.emplace_back(t, std::make_shared<Storage>(ctx_, keep->device + c.offsets[k], param_bytes(t), [keep] {}));
      placed.emplace(n, Placement{b.index, static_cast<int64_t>(c.offsets[k] / t->elem_size())});
      hb.params.push_back(t);
      ++k;
    }
    ring->host.emplace(b.index, std::move(hb));
    offloaded.push_back(b.index);
  }
  // ...then the parameters view their host buffers; their device memory goes back to the pool in
  // stream order, after the copies.
  // A graph recorded before (a first forward without checkpointing) may hold the parameter itself as
  // a saved tensor: it then reads the same values from host memory, and the version counter carries
  // over so that its check still passes.
  for (auto& [t, storage] : swaps) {
    storage->version.store(t->storage->version.load());
    t->storage = std::move(storage);
    t->offset = 0;
  }
  std::sort(offloaded.begin(), offloaded.end());
  placed_ = std::move(placed);
  offloaded_ = std::move(offloaded);
  ring_ = std::move(ring);
}

}  // namespace flame::models

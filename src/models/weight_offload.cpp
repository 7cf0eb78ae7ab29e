// Offload of frozen block weights (weight_offload.h): the option, the plan, the pinned host buffers
// and the Sources that copy them into the ring of block_fetch.h.
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

// ---- WeightOffload ----

WeightOffload::WeightOffload(Context& ctx, const OffloadOptions& options)
    : ctx_(ctx.shared_from_this()), options_(options) {}

WeightOffload::~WeightOffload() = default;

void WeightOffload::end_forward(const BlockParams& blocks, const std::vector<std::string>& names,
                                const std::vector<Tensor>& tensors) {
  if (!planned_ && blocks.learnt()) plan(blocks, names, tensors);
}

Tensor WeightOffload::use(const std::string& name, const Tensor& stored) {
  if (!fetch_ || !fetch_->placement(name)) return stored;
  FLAME_CHECK(!requires_grad(*stored), FLAME_ERROR_INVALID_ARGUMENT, "parameter ", name,
              " is offloaded to host memory (the model option \"offload\") and must stay frozen: set its requires_grad "
              "back to false, or make the model without offload to train it");
  Tensor view = fetch_->active_view(name, stored);
  return view ? view : stored;  // outside its block, or no free slot: the mapped host memory, read in place
}

void WeightOffload::plan(const BlockParams& blocks, const std::vector<std::string>& names,
                         const std::vector<Tensor>& tensors) {
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
  for (const BlockParams::Block& b : blocks.blocks()) {
    Chosen c;
    c.block = b.index;
    bool ok = true;
    for (const std::string& n : blocks.owned(b)) {
      const size_t i = index.at(n);
      const Tensor& t = tensors[i];
      ok = ok && !requires_grad(*t) && t->contiguous() && !t->storage->release_external;
      c.names.push_back(n);
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
                                      std::to_string(blocks.blocks().size()) + " blocks (" + std::to_string(moved) +
                                      " bytes) in host memory, ring of " + std::to_string(options_.slots) + " x " +
                                      std::to_string(slot_bytes) + " bytes");
}

void WeightOffload::apply(const std::vector<Tensor>& tensors, const std::vector<Chosen>& chosen, size_t slot_bytes) {
  Context& x = *ctx_;
  // Everything that can fail first: the ring, then the host buffers and their copies.
  auto fetch = std::make_shared<BlockFetch>(x, options_.slots, slot_bytes, "weight offload (the model option \"offload\")");
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
  fetch->fetch_after_compute();

  // The new state, built aside (an allocation failure changes nothing)...
  std::vector<std::pair<Tensor, std::shared_ptr<Storage>>> swaps;
  for (size_t j = 0; j < chosen.size(); ++j) {
    const Chosen& c = chosen[j];
    std::shared_ptr<HostBuffer> buffer = buffers[j];
    std::vector<Tensor> params;
    for (size_t k = 0; k < c.params.size(); ++k) {
      const Tensor& t = tensors[c.params[k]];
      swaps.emplace_back(t, std::make_shared<Storage>(ctx_, buffer->device + c.offsets[k], param_bytes(t), [buffer] {}));
      fetch->place(c.names[k], BlockFetch::Placement{c.block, static_cast<int64_t>(c.offsets[k] / t->elem_size())});
      params.push_back(t);
    }
    BlockFetch::Source src;
    src.fetch = [buffer, ctx = ctx_](CUdeviceptr dst, CUstream s) {
      ctx->check(ctx->drv.cuMemcpyHtoDAsync(dst, buffer->host, buffer->bytes, s), "cuMemcpyHtoDAsync (weight offload)");
    };
    src.version = [params] {  // writes to the frozen weights move their version counters
      uint64_t v = 0;
      for (const Tensor& p : params) v += p->storage->version.load();
      return v;
    };
    fetch->add_block(c.block, std::move(src));
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
  fetch_ = std::move(fetch);
}

}  // namespace flame::models

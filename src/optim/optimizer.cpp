// Host side of the fused optimizer steps: per group, parameter dtype and moment width (f32 or 8-bit),
// a table of tensors and a table of chunks (65536 elements per block) is uploaded and one kernel
// updates them all; the step count and learning rates come from the device record (optimizer.h).
#include "optim/optimizer.h"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include "tensor/autograd_graph.h"
#include "core/error.h"
#include "ops/ops.h"
#include "runtime/capture.h"

namespace flame {

namespace {

// Must match cuda/optim.cuh.
struct OptimTensor {
  uint64_t param, grad, m, v, vmax, master;
  int64_t numel, rng_base, first;
  uint64_t m_absmax, v_absmax;
};
struct OptimChunk {
  int64_t tensor, start;
};
struct OptimHyper {
  double beta1, beta2, eps, weight_decay, momentum, dampening;
  uint64_t record;  // [int64 step, f64 lr per group]
  int64_t group, kind, flags, seed, offset;
  uint64_t codes;   // 8-bit moments: f32 [2 * 256]
};
enum : int { kNesterov = 1, kAmsgrad = 2, kMaximize = 4, kStochastic = 16, kHasMomentum = 32 };
constexpr int64_t kChunk = 65536;
constexpr KernelTemplate kOptimStep{"optim.cuh", "flame::optim_step", {TArg::Dtype}};  // <parameter type>
constexpr KernelTemplate kOptimStep8{"optim.cuh", "flame::optim_step_8bit", {TArg::Dtype}};  // <parameter type>
constexpr KernelTemplate kOptimTick{"optim.cuh", "flame::optim_tick", {}};
static_assert(kChunk % kQuantBlock == 0, "8-bit chunks start at quantisation block boundaries");

DType compute_dtype(DType d) { return d == FLAME_DTYPE_F64 ? FLAME_DTYPE_F64 : FLAME_DTYPE_F32; }

void check_real(double v, const char* name, bool allow_zero = true) {
  FLAME_CHECK(std::isfinite(v) && (v > 0 || (allow_zero && v == 0)), FLAME_ERROR_INVALID_ARGUMENT, "optimizer option ",
              name, " must be finite and ", allow_zero ? "non-negative" : "positive", ", got ", v);
}

}  // namespace

std::vector<float> blockwise8_codes(bool is_signed) {
  // Decade i = 0 .. 6 (magnitude 10^(i - 6)) holds n_i = 2^i (signed) or 2^(i + 1) (unsigned) values
  // 10^(i - 6) * (0.1 + 0.9 * (j + 0.5) / n_i), j < n_i; then 0 and 1 (and the negatives when signed).
  static const double kDecade[7] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
  std::vector<double> v = {0.0, 1.0};
  for (int i = 0; i < 7; ++i) {
    const int n = is_signed ? 1 << i : 2 << i;
    for (int j = 0; j < n; ++j) {
      const double x = kDecade[i] * (0.1 + 0.9 * (j + 0.5) / n);
      v.push_back(x);
      if (is_signed) v.push_back(-x);
    }
  }
  std::sort(v.begin(), v.end());
  FLAME_CHECK(v.size() == 256, FLAME_ERROR_INTERNAL, "an 8-bit code table of ", v.size(), " values");
  return std::vector<float>(v.begin(), v.end());
}

void validate_optimizer_options(const flame_optimizer_options_t& o, int32_t kind) {
  FLAME_CHECK(o.struct_size == sizeof(flame_optimizer_options_t), FLAME_ERROR_INVALID_ARGUMENT,
              "options->struct_size must be sizeof(flame_optimizer_options_t) (call flame_optimizer_options_init)");
  FLAME_CHECK(o.kind >= FLAME_OPTIMIZER_SGD && o.kind <= FLAME_OPTIMIZER_LION, FLAME_ERROR_INVALID_ARGUMENT,
              "options->kind ", o.kind, " is not a flame_optimizer_kind_t value");
  FLAME_CHECK(kind < 0 || o.kind == kind, FLAME_ERROR_INVALID_ARGUMENT, "a parameter group's kind (", o.kind,
              ") differs from the optimizer's (", kind, ")");
  check_real(o.lr, "lr");
  check_real(o.weight_decay, "weight_decay");
  check_real(o.momentum, "momentum");
  check_real(o.dampening, "dampening");
  check_real(o.eps, "eps");
  FLAME_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, FLAME_ERROR_INVALID_ARGUMENT,
              "betas must be in [0, 1), got ", o.beta1, " and ", o.beta2);
  FLAME_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0), FLAME_ERROR_INVALID_ARGUMENT,
              "nesterov momentum needs momentum > 0 and dampening 0");
}

void Optimizer::add_group(const flame_optimizer_options_t& opts, const std::vector<Tensor>& params) {
  FLAME_CHECK(!sharded_, FLAME_ERROR_INVALID_ARGUMENT,
              "the optimizer is sharded over ranks (flame_zero_create): add every group before sharding it");
  validate_optimizer_options(opts, kind_);
  FLAME_CHECK(state_bits_ == 32 || !opts.amsgrad, FLAME_ERROR_INVALID_ARGUMENT,
              "amsgrad is not available with 8-bit optimizer states");
  std::set<const TensorImpl*> seen;
  for (auto& g : groups_)
    for (auto& p : g.params) seen.insert(p.param.get());
  OptimGroup g{opts, {}};
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    FLAME_CHECK(&p->ctx() == ctx_.get(), FLAME_ERROR_INVALID_ARGUMENT, "params[", i, "] belongs to another context");
    FLAME_CHECK(is_floating(p->dtype), FLAME_ERROR_DTYPE_MISMATCH, "params[", i, "] is ", dtype_name(p->dtype),
                "; parameters must be floating");
    FLAME_CHECK(p->contiguous(), FLAME_ERROR_INVALID_ARGUMENT, "params[", i, "] is not contiguous");
    FLAME_CHECK(!p->autograd || !p->autograd->grad_fn, FLAME_ERROR_INVALID_ARGUMENT, "params[", i,
                "] is not a leaf tensor");
    FLAME_CHECK(seen.insert(p.get()).second, FLAME_ERROR_INVALID_ARGUMENT, "params[", i,
                "] appears twice in the optimizer");
    OptimParam entry;
    entry.param = p;
    g.params.push_back(std::move(entry));
  }
  groups_.push_back(std::move(g));
  record_stale_ = true;  // one more learning rate in the device record
}

void Optimizer::zero_grad(bool set_to_none) {
  for (auto& g : groups_)
    for (auto& p : g.params) {
      if (!p.param->autograd || !p.param->autograd->grad) continue;
      if (set_to_none) p.param->autograd->grad.reset();
      else ops::fill_(p.param->autograd->grad, 0.0);
    }
}

// splitmix64's finaliser: spreads a counter into an unrelated 64-bit Philox key.
static uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The first use keys the stream from the context's generator (one counter taken from it).
uint64_t Optimizer::take_rounding_rng(uint64_t n) {
  if (!rng_.ready) {
    rng_.seed = mix64(ctx_->rng_seed ^ mix64(ctx_->take_rng(1)));
    rng_.offset = 0;
    rng_.ready = true;
  }
  const uint64_t first = rng_.offset;
  rng_.offset += n;
  return first;
}

void Optimizer::sync_record() {
  Context& ctx = *ctx_;
  const size_t n = groups_.size();
  if (record_ && !record_stale_ && record_->numel() == static_cast<int64_t>(8 * (n + 1))) return;
  std::vector<int64_t> host(n + 1);
  host[0] = steps_;
  for (size_t g = 0; g < n; ++g) std::memcpy(&host[g + 1], &groups_[g].opts.lr, sizeof(double));
  if (!record_ || record_->numel() != static_cast<int64_t>(8 * (n + 1))) {
    SetupScope setup(ctx);  // persists across replays; written below, outside any graph
    record_ = make_tensor(ctx, {static_cast<int64_t>(8 * (n + 1))}, FLAME_DTYPE_U8);
  }
  RelaxedCaptureMode relaxed(ctx);  // while capturing: a set-up copy on the side stream
  ctx.check(ctx.drv.cuMemcpyHtoDAsync(record_->data(), host.data(), 8 * (n + 1), ctx.init_stream()), "cuMemcpyHtoDAsync");
  record_stale_ = false;
}

void Optimizer::set_lr(int32_t group, double lr) {
  Context& ctx = *ctx_;
  const int32_t n = static_cast<int32_t>(groups_.size());
  const bool write = record_ && !record_stale_ && record_->numel() == static_cast<int64_t>(8 * (n + 1));
  for (int32_t g = 0; g < n; ++g) {
    if (group != -1 && g != group) continue;
    groups_[static_cast<size_t>(g)].opts.lr = lr;
    if (!write) continue;
    // The double's two 32-bit halves (little-endian): memsets are stream-ordered and capturable.
    uint32_t w[2];
    std::memcpy(w, &lr, sizeof lr);
    const CUdeviceptr at = record_->data() + 8 * static_cast<CUdeviceptr>(g + 1);
    ctx.check(ctx.drv.cuMemsetD32Async(at, w[0], 1, ctx.stream), "cuMemsetD32Async");
    ctx.check(ctx.drv.cuMemsetD32Async(at + 4, w[1], 1, ctx.stream), "cuMemsetD32Async");
  }
}

// A zeroed state tensor: set-up memory, zeroed once (on the side stream while capturing).
static Tensor zero_state(Context& ctx, const Shape& shape, DType dtype) {
  SetupScope setup(ctx);
  Tensor t = make_tensor(ctx, shape, dtype);
  const size_t bytes = static_cast<size_t>(t->numel()) * t->elem_size();
  RelaxedCaptureMode relaxed(ctx);
  if (bytes) ctx.check(ctx.drv.cuMemsetD8Async(t->data(), 0, bytes, ctx.init_stream()), "cuMemsetD8Async");
  return t;
}

void Optimizer::step() {
  FLAME_CHECK(!sharded_, FLAME_ERROR_INVALID_ARGUMENT,
              "the optimizer is sharded over ranks (flame_zero_create): step it with flame_zero_step");
  run_step();
}

void Optimizer::step_shard() {
  FLAME_CHECK(sharded_, FLAME_ERROR_INTERNAL, "step_shard on an optimizer that is not sharded");
  run_step();
}

void Optimizer::make_sharded() {
  check_shardable();
  sharded_ = true;
}

void Optimizer::check_shardable() const {
  FLAME_CHECK(steps_ == 0, FLAME_ERROR_INVALID_ARGUMENT, "the optimizer stepped already (", steps_,
              " steps): shard it before its first step");
  for (auto& g : groups_)
    for (auto& p : g.params)
      FLAME_CHECK(!p.m && !p.v && !p.vmax && !p.master, FLAME_ERROR_INVALID_ARGUMENT,
                  "the optimizer holds state already (loaded from a file?): shard it before its first step");
  FLAME_CHECK(!sharded_, FLAME_ERROR_INVALID_ARGUMENT, "the optimizer is sharded already (one ZeRO helper per optimizer)");
  FLAME_CHECK(state_bits_ == 32, FLAME_ERROR_INVALID_ARGUMENT,
              "the optimizer keeps 8-bit states, which sharding (ZeRO) does not support: use 32-bit states");
}

bool Optimizer::quantizes(const Tensor& param) const {
  return state_bits_ == 8 && param->dtype != FLAME_DTYPE_F64 && param->numel() >= kMinQuantizedNumel;
}

void Optimizer::set_state_bits(int32_t bits) {
  FLAME_CHECK(bits == 8 || bits == 32, FLAME_ERROR_INVALID_ARGUMENT, "state bits must be 8 or 32, got ", bits);
  if (bits == state_bits_) return;
  FLAME_CHECK(bits == 32 || kind_ == FLAME_OPTIMIZER_ADAM || kind_ == FLAME_OPTIMIZER_ADAMW || kind_ == FLAME_OPTIMIZER_LION,
              FLAME_ERROR_INVALID_ARGUMENT, "8-bit states are for Adam, AdamW and Lion, not ", optimizer_kind_name(kind_));
  FLAME_CHECK(!sharded_, FLAME_ERROR_INVALID_ARGUMENT,
              "the optimizer is sharded over ranks (flame_zero_create): its state width cannot change");
  for (auto& g : groups_) {
    FLAME_CHECK(bits == 32 || !g.opts.amsgrad, FLAME_ERROR_INVALID_ARGUMENT,
                "amsgrad is not available with 8-bit optimizer states");
    for (auto& p : g.params)
      FLAME_CHECK(!p.m && !p.v && !p.vmax, FLAME_ERROR_INVALID_ARGUMENT,
                  "the optimizer holds state already (it stepped, or a state was loaded): choose the state width "
                  "before the first step");
  }
  state_bits_ = bits;
}

void Optimizer::upload_codes() {
  if (codes_) return;
  Context& ctx = *ctx_;
  std::vector<float> host = blockwise8_codes(true);
  const std::vector<float> unsigned_codes = blockwise8_codes(false);
  host.insert(host.end(), unsigned_codes.begin(), unsigned_codes.end());
  Tensor codes;
  {
    SetupScope setup(ctx);  // persists across replays; written below, outside any graph
    codes = make_tensor(ctx, {static_cast<int64_t>(host.size())}, FLAME_DTYPE_F32);
  }
  RelaxedCaptureMode relaxed(ctx);
  // A pageable source: the copy is staged before cuMemcpyHtoDAsync returns.
  ctx.check(ctx.drv.cuMemcpyHtoDAsync(codes->data(), host.data(), host.size() * sizeof(float), ctx.init_stream()),
            "cuMemcpyHtoDAsync");
  codes_ = std::move(codes);  // only once uploaded: a failed upload is tried again at the next step
}

uint64_t Optimizer::state_bytes() const {
  uint64_t n = 0;
  for (auto& g : groups_)
    for (auto& p : g.params)
      for (const Tensor* t : {&p.m, &p.v, &p.vmax, &p.master, &p.m_absmax, &p.v_absmax})
        if (*t) n += static_cast<uint64_t>((*t)->numel()) * (*t)->elem_size();
  return n;
}

void Optimizer::run_step() {
  Context& ctx = *ctx_;
  const bool capturing = ctx.capture != nullptr;
  const int64_t t = steps_ + 1;  // the step the device record will hold after optim_tick
  struct Launch {
    DType dtype;
    bool quantized;  // 8-bit moments (optim_step_8bit)
    size_t group;
    std::vector<OptimTensor> tensors;
    std::vector<OptimChunk> chunks;
    int64_t flags;
    uint64_t rng_offset;
  };
  std::vector<Launch> launches;
  std::vector<Tensor> keep;  // contiguous copies of strided gradients, alive until the launches
  // First every group's tables (and checks), so that a failure leaves the step count alone.
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    auto& grp = groups_[gi];
    const flame_optimizer_options_t& o = grp.opts;
    std::map<std::pair<DType, bool>, size_t> index;  // launches of this group by parameter dtype and 8-bit
    int64_t rng_total = 0;
    const int64_t flags = (o.nesterov ? kNesterov : 0) | (o.amsgrad ? kAmsgrad : 0) | (o.maximize ? kMaximize : 0) |
                          (o.momentum > 0 ? kHasMomentum : 0) | (o.stochastic_rounding ? kStochastic : 0);
    for (auto& p : grp.params) {
      const Tensor& w = p.param;
      // Unsharded: the whole parameter from its .grad (none: skipped, as torch.optim). Sharded: the
      // owned elements [lo, lo + numel) from shard_grad; the state holds those elements only.
      int64_t lo = 0, numel = w->numel();
      Shape state_shape = w->shape;
      Tensor g;
      if (sharded_) {
        lo = p.shard_lo;
        numel = p.shard_hi - p.shard_lo;
        state_shape = {numel};
        g = p.shard_grad;
        FLAME_CHECK(numel >= 0 && lo >= 0 && p.shard_hi <= w->numel(), FLAME_ERROR_INTERNAL, "bad shard range");
        if (numel == 0) {
          rng_total += w->numel();
          continue;  // owned by other ranks
        }
        FLAME_CHECK(g && g->numel() == numel && g->dtype == w->dtype && g->contiguous(), FLAME_ERROR_INTERNAL,
                    "a sharded step without the shard's gradient");
        FLAME_CHECK(!p.shard_value || (p.shard_value->numel() == numel && p.shard_value->dtype == w->dtype &&
                                       p.shard_value->contiguous()),
                    FLAME_ERROR_INTERNAL, "a sharded parameter's shard does not match its owned range");
      } else {
        if (!w->autograd || !w->autograd->grad) continue;  // no gradient: skipped, as torch.optim
        g = w->autograd->grad;
        FLAME_CHECK(g->shape == w->shape && g->dtype == w->dtype, FLAME_ERROR_SHAPE_MISMATCH, "the gradient of a parameter ",
                    shape_str(w->shape), " ", dtype_name(w->dtype), " is ", shape_str(g->shape), " ", dtype_name(g->dtype));
        if (!g->contiguous()) {
          g = ops::contiguous(alias(g));
          keep.push_back(g);
        }
      }
      const DType cd = compute_dtype(w->dtype);
      const bool adam = o.kind == FLAME_OPTIMIZER_ADAM || o.kind == FLAME_OPTIMIZER_ADAMW;
      const bool needs_m = adam || o.kind == FLAME_OPTIMIZER_LION || (o.kind == FLAME_OPTIMIZER_SGD && o.momentum > 0);
      const bool quantized = !sharded_ && quantizes(w);  // sharded optimizers keep 32-bit states
      const Shape absmax_shape = {(numel + kQuantBlock - 1) / kQuantBlock};
      // A moment and its absmax are made together (a failed allocation leaves neither).
      if (needs_m && !p.m) {
        Tensor m = zero_state(ctx, state_shape, quantized ? FLAME_DTYPE_U8 : cd);
        Tensor absmax = quantized ? zero_state(ctx, absmax_shape, FLAME_DTYPE_F32) : Tensor();  // all zero: m = 0
        p.m = std::move(m);
        p.m_absmax = std::move(absmax);
        p.first_step = t;
      }
      if (adam && !p.v) {
        Tensor v = zero_state(ctx, state_shape, quantized ? FLAME_DTYPE_U8 : cd);
        Tensor absmax = quantized ? zero_state(ctx, absmax_shape, FLAME_DTYPE_F32) : Tensor();
        p.v = std::move(v);
        p.v_absmax = std::move(absmax);
      }
      if (adam && o.amsgrad && !p.vmax) p.vmax = zero_state(ctx, state_shape, cd);
      if (o.master_weights && w->dtype != cd && !p.master) {
        ctx.forbid_in_capture("creating f32 master weights (run one eager step before capturing)");
        if (p.shard_value)
          p.master = ops::contiguous(ops::to_dtype(alias(p.shard_value), cd));
        else
          p.master = sharded_ ? ops::contiguous(ops::to_dtype(ops::narrow(ops::reshape(alias(w), {w->numel()}), 0, lo, numel), cd))
                              : ops::to_dtype(alias(w), cd);
      }
      auto at = index.find({w->dtype, quantized});
      if (at == index.end()) {
        at = index.emplace(std::make_pair(w->dtype, quantized), launches.size()).first;
        launches.push_back({w->dtype, quantized, gi, {}, {}, flags, 0});
      }
      Launch& l = launches[at->second];
      const CUdeviceptr param_at =
          p.shard_value ? p.shard_value->data() : w->data() + static_cast<CUdeviceptr>(lo) * w->elem_size();
      OptimTensor ot{param_at, g->data(), p.m ? p.m->data() : 0, p.v ? p.v->data() : 0, p.vmax ? p.vmax->data() : 0,
                     p.master ? p.master->data() : 0, numel, rng_total + lo, p.first_step,
                     p.m_absmax ? p.m_absmax->data() : 0, p.v_absmax ? p.v_absmax->data() : 0};
      rng_total += w->numel();
      const int64_t idx = static_cast<int64_t>(l.tensors.size());
      l.tensors.push_back(ot);
      for (int64_t s = 0; s < numel; s += kChunk) l.chunks.push_back({idx, s});
    }
    if (o.stochastic_rounding && rng_total > 0) {
      ctx.forbid_in_capture("stochastic rounding (each replay would draw the same bits)");
      const uint64_t off = take_rounding_rng(static_cast<uint64_t>(rng_total));
      for (auto& kv : index) launches[kv.second].rng_offset = off;
    }
  }
  // Everything that may fail (allocation, upload, kernel compilation) before optim_tick, so that a
  // failed step leaves the device's step count equal to the host's.
  sync_record();
  if (std::any_of(launches.begin(), launches.end(), [](const Launch& l) { return l.quantized; })) upload_codes();
  CUdeviceptr record = record_->data();
  std::vector<Tensor> metas(launches.size());
  std::vector<CUfunction> fns(launches.size(), nullptr);
  for (size_t i = 0; i < launches.size(); ++i) {
    Launch& l = launches[i];
    if (l.chunks.empty()) continue;
    const size_t tb = l.tensors.size() * sizeof(OptimTensor), cb = l.chunks.size() * sizeof(OptimChunk);
    // The tables: set-up memory while capturing (the graph reads them at every replay), written
    // once from the host; eagerly an ordinary tensor freed in stream order after the launch.
    {
      SetupScope setup(ctx);
      metas[i] = make_tensor(ctx, {static_cast<int64_t>(tb + cb)}, FLAME_DTYPE_U8);
    }
    {
      RelaxedCaptureMode relaxed(ctx);
      // The pageable host tables are staged by cuMemcpyHtoDAsync before it returns.
      ctx.check(ctx.drv.cuMemcpyHtoDAsync(metas[i]->data(), l.tensors.data(), tb, ctx.init_stream()), "cuMemcpyHtoDAsync");
      ctx.check(ctx.drv.cuMemcpyHtoDAsync(metas[i]->data() + tb, l.chunks.data(), cb, ctx.init_stream()), "cuMemcpyHtoDAsync");
    }
    fns[i] = ctx.function(make_key(l.quantized ? kOptimStep8 : kOptimStep, l.dtype));
  }
  CUfunction tick = ctx.function(make_key(kOptimTick));
  {  // step += 1 on the device, before the updates read it
    void* args[] = {&record};
    ctx.launch(tick, 1, 1, args);
  }
  for (size_t i = 0; i < launches.size(); ++i) {
    Launch& l = launches[i];
    if (l.chunks.empty()) continue;
    const flame_optimizer_options_t& o = groups_[l.group].opts;
    OptimHyper h{o.beta1, o.beta2, o.eps, o.weight_decay, o.momentum, o.dampening, static_cast<uint64_t>(record),
                 static_cast<int64_t>(l.group), o.kind, l.flags, static_cast<int64_t>(rng_.seed),
                 static_cast<int64_t>(l.rng_offset), l.quantized ? static_cast<uint64_t>(codes_->data()) : 0};
    CUdeviceptr tensors = metas[i]->data(), chunks = metas[i]->data() + l.tensors.size() * sizeof(OptimTensor);
    int64_t chunk = kChunk;
    void* args[] = {&tensors, &chunks, &chunk, &h};
    ctx.launch(fns[i], static_cast<unsigned>(l.chunks.size()), 256, args);
  }
  for (auto& grp : groups_)
    for (auto& p : grp.params)
      if (sharded_ ? p.shard_hi > p.shard_lo : p.param->autograd && p.param->autograd->grad)
        (p.shard_value ? p.shard_value : p.param)->storage->version.fetch_add(1);
  if (!capturing) {
    steps_ = t;
    return;
  }
  // Captured: nothing ran yet. Each replay is one more step for the host's count.
  std::weak_ptr<Optimizer> self = weak_from_this();
  ctx.capture->on_replay.push_back([self] {
    if (auto o = self.lock()) ++o->steps_;
  });
}

}  // namespace flame

// Host side of the fused optimizer steps: per group and parameter dtype, a table of tensors and a
// table of chunks (65536 elements per block) is uploaded and one kernel updates them all.
#include "optim/optimizer.h"
#include <cmath>
#include <map>
#include <set>
#include "autograd/graph.h"
#include "core/error.h"
#include "ops/ops.h"

namespace flame {

namespace {

// Must match cuda/optim.cuh.
struct OptimTensor {
  uint64_t param, grad, m, v, vmax, master;
  int64_t numel, rng_base, first;
};
struct OptimChunk {
  int64_t tensor, start;
};
struct OptimHyper {
  double lr, beta1, beta2, eps, weight_decay, momentum, dampening, bc1, bc2;
  int64_t kind, flags, seed, offset;
};
enum : int { kNesterov = 1, kAmsgrad = 2, kMaximize = 4, kStochastic = 16, kHasMomentum = 32 };
constexpr int64_t kChunk = 65536;

DType compute_dtype(DType d) { return d == FLAME_DTYPE_F64 ? FLAME_DTYPE_F64 : FLAME_DTYPE_F32; }

void check_real(double v, const char* name, bool allow_zero = true) {
  FLAME_CHECK(std::isfinite(v) && (v > 0 || (allow_zero && v == 0)), FLAME_ERROR_INVALID_ARGUMENT, "optimizer option ",
              name, " must be finite and ", allow_zero ? "non-negative" : "positive", ", got ", v);
}

}  // namespace

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
  validate_optimizer_options(opts, kind_);
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
    g.params.push_back({p, nullptr, nullptr, nullptr, nullptr});
  }
  groups_.push_back(std::move(g));
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

void Optimizer::step() {
  Context& ctx = *ctx_;
  const int64_t t = steps_ + 1;
  for (auto& grp : groups_) {
    const flame_optimizer_options_t& o = grp.opts;
    // The tables for each parameter dtype present in the group.
    std::map<DType, std::pair<std::vector<OptimTensor>, std::vector<OptimChunk>>> tables;
    std::vector<Tensor> keep;  // contiguous copies of strided gradients, alive until the launch
    int64_t rng_total = 0;
    for (auto& p : grp.params) {
      const Tensor& w = p.param;
      if (!w->autograd || !w->autograd->grad) continue;  // no gradient: skipped, as torch.optim
      Tensor g = w->autograd->grad;
      FLAME_CHECK(g->shape == w->shape && g->dtype == w->dtype, FLAME_ERROR_SHAPE_MISMATCH, "the gradient of a parameter ",
                  shape_str(w->shape), " ", dtype_name(w->dtype), " is ", shape_str(g->shape), " ", dtype_name(g->dtype));
      if (!g->contiguous()) {
        g = ops::contiguous(alias(g));
        keep.push_back(g);
      }
      const DType cd = compute_dtype(w->dtype);
      const bool adam = o.kind == FLAME_OPTIMIZER_ADAM || o.kind == FLAME_OPTIMIZER_ADAMW;
      const bool needs_m = adam || o.kind == FLAME_OPTIMIZER_LION || (o.kind == FLAME_OPTIMIZER_SGD && o.momentum > 0);
      const bool fresh = needs_m && !p.m;
      if (fresh) p.m = ops::zeros(ctx, w->shape, cd);
      if (adam && !p.v) p.v = ops::zeros(ctx, w->shape, cd);
      if (adam && o.amsgrad && !p.vmax) p.vmax = ops::zeros(ctx, w->shape, cd);
      if (o.master_weights && w->dtype != cd && !p.master) p.master = ops::to_dtype(alias(w), cd);
      auto& tab = tables[w->dtype];
      OptimTensor ot{w->data(), g->data(), p.m ? p.m->data() : 0, p.v ? p.v->data() : 0, p.vmax ? p.vmax->data() : 0,
                     p.master ? p.master->data() : 0, w->numel(), rng_total, fresh ? 1 : 0};
      rng_total += w->numel();
      const int64_t idx = static_cast<int64_t>(tab.first.size());
      tab.first.push_back(ot);
      for (int64_t s = 0; s < w->numel(); s += kChunk) tab.second.push_back({idx, s});
      w->storage->version.fetch_add(1);
    }
    const double bc1 = 1 - std::pow(o.beta1, static_cast<double>(t)), bc2 = 1 - std::pow(o.beta2, static_cast<double>(t));
    int64_t flags = (o.nesterov ? kNesterov : 0) | (o.amsgrad ? kAmsgrad : 0) | (o.maximize ? kMaximize : 0) |
                    (o.momentum > 0 ? kHasMomentum : 0) | (o.stochastic_rounding ? kStochastic : 0);
    const uint64_t rng_offset = o.stochastic_rounding ? take_rounding_rng(static_cast<uint64_t>(rng_total)) : 0;
    for (auto& [dtype, tab] : tables) {
      if (tab.second.empty()) continue;
      OptimHyper h{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.momentum, o.dampening, bc1, bc2,
                   o.kind, flags, static_cast<int64_t>(rng_.seed),
                   static_cast<int64_t>(rng_offset)};
      const size_t tb = tab.first.size() * sizeof(OptimTensor), cb = tab.second.size() * sizeof(OptimChunk);
      Tensor meta = make_tensor(ctx, {static_cast<int64_t>(tb + cb)}, FLAME_DTYPE_U8);
      ctx.check(ctx.drv.cuMemcpyHtoDAsync(meta->data(), tab.first.data(), tb, ctx.stream), "cuMemcpyHtoDAsync");
      ctx.check(ctx.drv.cuMemcpyHtoDAsync(meta->data() + tb, tab.second.data(), cb, ctx.stream), "cuMemcpyHtoDAsync");
      CUdeviceptr tensors = meta->data(), chunks = meta->data() + tb;
      int64_t chunk = kChunk;
      void* args[] = {&tensors, &chunks, &chunk, &h};
      CUfunction f = ctx.function("optim.cuh", std::string("flame::optim_step<") + device_type(dtype) + ">");
      ctx.launch(f, static_cast<unsigned>(tab.second.size()), 256, args);
      // The pageable host tables were staged by cuMemcpyHtoDAsync before it returned.
    }
  }
  steps_ = t;
}

}  // namespace flame

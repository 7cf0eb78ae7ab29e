// C entry points of the optimizers (optim/optimizer.h) and the gradient tools. The optimizer
// handle owns a shared Optimizer; its functions lock the optimizer's context like tensor calls.
#include <cmath>
#include "api/guard.h"
#include "tensor/autograd_graph.h"
#include "ops/ops.h"
#include "optim/optimizer.h"
#include "api/toolkit_args.h"

using namespace flame;

constexpr uint64_t kOptimMagic = 0xF1A3E0F700000001ull;

struct flame_optimizer_s {
  uint64_t magic;
  std::shared_ptr<Optimizer> opt;
};

namespace flame {

Optimizer& unwrap_opt(flame_optimizer_t o) {
  FLAME_CHECK(o, FLAME_ERROR_INVALID_ARGUMENT, "opt is NULL");
  FLAME_CHECK(o->magic == kOptimMagic && o->opt, FLAME_ERROR_INVALID_HANDLE, "opt is not a live optimizer");
  return *o->opt;
}

std::shared_ptr<Optimizer> optimizer_ref(flame_optimizer_t o) {
  unwrap_opt(o);
  return o->opt;
}

std::vector<Tensor> tensor_list(const flame_tensor_t* ts, int64_t n, const char* name) {
  FLAME_CHECK(n >= 0, FLAME_ERROR_INVALID_ARGUMENT, name, " count ", n, " is negative");
  FLAME_CHECK(ts || n == 0, FLAME_ERROR_INVALID_ARGUMENT, name, " is NULL");
  std::vector<Tensor> v;
  v.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    std::string arg = std::string(name) + "[" + std::to_string(i) + "]";
    v.push_back(unwrap(ts[i], arg.c_str()));
  }
  return v;
}

}  // namespace flame

namespace {

// The gradients of params that have one (detached, so edits record nothing).
std::vector<Tensor> grads_of(Context& ctx, const std::vector<Tensor>& params) {
  std::vector<Tensor> gs;
  for (size_t i = 0; i < params.size(); ++i) {
    FLAME_CHECK(&params[i]->ctx() == &ctx, FLAME_ERROR_INVALID_ARGUMENT, "params[", i, "] belongs to another context");
    if (params[i]->autograd && params[i]->autograd->grad) gs.push_back(params[i]->autograd->grad);
  }
  return gs;
}

}  // namespace

extern "C" {

FLAME_API flame_status_t flame_optimizer_options_init(flame_optimizer_options_t* o, int32_t kind) {
  return api_call("flame_optimizer_options_init", [&] {
    FLAME_CHECK(o, FLAME_ERROR_INVALID_ARGUMENT, "opts is NULL");
    FLAME_CHECK(kind >= FLAME_OPTIMIZER_SGD && kind <= FLAME_OPTIMIZER_LION, FLAME_ERROR_INVALID_ARGUMENT, "kind ", kind,
                " is not a flame_optimizer_kind_t value");
    *o = flame_optimizer_options_t{};
    o->struct_size = sizeof(flame_optimizer_options_t);
    o->kind = kind;
    o->lr = 1e-3;
    o->weight_decay = kind == FLAME_OPTIMIZER_ADAMW ? 1e-2 : 0.0;
    o->beta1 = 0.9;
    o->beta2 = kind == FLAME_OPTIMIZER_LION ? 0.99 : 0.999;
    o->eps = 1e-8;
  });
}

FLAME_API flame_status_t flame_optimizer_create(flame_ctx_t ctx, const flame_optimizer_options_t* opts, const flame_tensor_t* params,
                                                int64_t n, flame_optimizer_t* out) {
  return api_call("flame_optimizer_create", [&] {
    out_param(out, "out");
    Context& c = context_of(ctx);
    FLAME_CHECK(opts, FLAME_ERROR_INVALID_ARGUMENT, "opts is NULL");
    LiveScope scope(c);
    std::vector<Tensor> ps = tensor_list(params, n, "params");
    validate_optimizer_options(*opts, -1);
    auto opt = std::make_shared<Optimizer>(c, opts->kind);
    opt->add_group(*opts, ps);
    *out = new flame_optimizer_s{kOptimMagic, std::move(opt)};
  });
}

FLAME_API flame_status_t flame_optimizer_add_param_group(flame_optimizer_t o, const flame_optimizer_options_t* opts,
                                                         const flame_tensor_t* params, int64_t n, int32_t* group) {
  return api_call("flame_optimizer_add_param_group", [&] {
    if (group) *group = -1;
    Optimizer& opt = unwrap_opt(o);
    FLAME_CHECK(opts, FLAME_ERROR_INVALID_ARGUMENT, "opts is NULL");
    ContextScope scope(opt.ctx());
    opt.add_group(*opts, tensor_list(params, n, "params"));
    if (group) *group = static_cast<int32_t>(opt.groups().size() - 1);
  });
}

FLAME_API flame_status_t flame_optimizer_step(flame_optimizer_t o) {
  return api_call("flame_optimizer_step", [&] {
    Optimizer& opt = unwrap_opt(o);
    LiveScope scope(opt.ctx());
    opt.step();
  });
}

FLAME_API flame_status_t flame_optimizer_zero_grad(flame_optimizer_t o, int32_t set_to_none) {
  return api_call("flame_optimizer_zero_grad", [&] {
    Optimizer& opt = unwrap_opt(o);
    ContextScope scope(opt.ctx());
    opt.zero_grad(set_to_none != 0);
  });
}

FLAME_API flame_status_t flame_optimizer_set_lr(flame_optimizer_t o, int32_t group, double lr) {
  return api_call("flame_optimizer_set_lr", [&] {
    Optimizer& opt = unwrap_opt(o);
    FLAME_CHECK(std::isfinite(lr) && lr >= 0, FLAME_ERROR_INVALID_ARGUMENT, "lr must be finite and non-negative, got ", lr);
    const int32_t n = static_cast<int32_t>(opt.groups().size());
    FLAME_CHECK(group >= -1 && group < n, FLAME_ERROR_INVALID_ARGUMENT, "group ", group, " is not -1 or in [0, ", n, ")");
    LiveScope scope(opt.ctx());
    opt.set_lr(group, lr);  // host value and device record (stream-ordered; captured inside a graph)
  });
}

FLAME_API flame_status_t flame_optimizer_get_lr(flame_optimizer_t o, int32_t group, double* lr) {
  return api_call("flame_optimizer_get_lr", [&] {
    FLAME_CHECK(lr, FLAME_ERROR_INVALID_ARGUMENT, "lr is NULL");
    Optimizer& opt = unwrap_opt(o);
    const int32_t n = static_cast<int32_t>(opt.groups().size());
    FLAME_CHECK(group >= 0 && group < n, FLAME_ERROR_INVALID_ARGUMENT, "group ", group, " is not in [0, ", n, ")");
    *lr = opt.groups()[static_cast<size_t>(group)].opts.lr;
  });
}

FLAME_API flame_status_t flame_optimizer_step_count(flame_optimizer_t o, int64_t* steps) {
  return api_call("flame_optimizer_step_count", [&] {
    FLAME_CHECK(steps, FLAME_ERROR_INVALID_ARGUMENT, "steps is NULL");
    *steps = unwrap_opt(o).step_count();
  });
}

FLAME_API flame_status_t flame_optimizer_state_bytes(flame_optimizer_t o, uint64_t* bytes) {
  if (bytes) *bytes = 0;
  return api_call("flame_optimizer_state_bytes", [&] {
    Optimizer& opt = unwrap_opt(o);
    FLAME_CHECK(bytes, FLAME_ERROR_INVALID_ARGUMENT, "bytes is NULL");
    LiveScope scope(opt.ctx());
    *bytes = opt.state_bytes();
  });
}

FLAME_API flame_status_t flame_optimizer_set_state_bits(flame_optimizer_t o, int32_t bits) {
  return api_call("flame_optimizer_set_state_bits", [&] {
    Optimizer& opt = unwrap_opt(o);
    ContextScope scope(opt.ctx());
    opt.set_state_bits(bits);
  });
}

// A released optimizer frees its state at once; the emptied handle is parked in the context's
// dead_objects (as tensors and safetensors files), so passing it again is FLAME_ERROR_INVALID_HANDLE.
FLAME_API void flame_optimizer_release(flame_optimizer_t o) {
  if (!o || o->magic != kOptimMagic || !o->opt) return;
  std::shared_ptr<Context> keep = o->opt->ctx().shared_from_this();
  std::lock_guard<std::recursive_mutex> lock(keep->mutex);
  keep->bind();
  o->magic = kDeadMagic;
  o->opt.reset();
  try {
    keep->dead_objects.push_back(std::shared_ptr<flame_optimizer_s>(o));
    if (keep->dead_objects.size() > 4096) keep->dead_objects.pop_front();
  } catch (...) {  // out of host memory: shared_ptr's constructor deleted the handle
  }
}

FLAME_API flame_status_t flame_clip_grad_norm(flame_ctx_t ctx, const flame_tensor_t* params, int64_t n, double max_norm,
                                             double norm_type, int32_t error_if_nonfinite, flame_tensor_t* total_norm) {
  return api_call("flame_clip_grad_norm", [&] {
    if (total_norm) *total_norm = nullptr;
    Context& c = context_of(ctx);
    FLAME_CHECK(std::isfinite(max_norm) && max_norm >= 0, FLAME_ERROR_INVALID_ARGUMENT, "max_norm must be finite and >= 0");
    FLAME_CHECK(norm_type == 1 || norm_type == 2 || (std::isinf(norm_type) && norm_type > 0), FLAME_ERROR_INVALID_ARGUMENT,
                "norm_type must be 1, 2 or INFINITY, got ", norm_type);
    LiveScope scope(c);
    std::vector<Tensor> gs = grads_of(c, tensor_list(params, n, "params"));
    Tensor total;
    if (gs.empty()) {
      total = ops::scalar(c, 0.0, FLAME_DTYPE_F32);
    } else {
      std::vector<Tensor> norms;  // per tensor, in f32 (f16/bf16 norms accumulate in f32 already)
      for (const Tensor& g : gs) norms.push_back(ops::to_dtype(ops::norm(alias(g), norm_type, {}, false), FLAME_DTYPE_F32));
      total = ops::norm(ops::stack(norms, 0), norm_type, {}, false);
    }
    if (error_if_nonfinite) {
      double v = ops::item(total);
      FLAME_CHECK(std::isfinite(v), FLAME_ERROR_INVALID_ARGUMENT, "the total gradient norm is ", v,
                  " (error_if_nonfinite); no gradient was changed");
    }
    if (!gs.empty()) {
      // coef = min(1, max_norm / (total + 1e-6)) stays on the device: no synchronisation.
      Tensor coef = ops::binary(OpId::Minimum, ops::div(ops::scalar(c, max_norm, FLAME_DTYPE_F32), ops::add_scalar(total, 1e-6)),
                                ops::scalar(c, 1.0, FLAME_DTYPE_F32));
      for (const Tensor& g : gs) ops::copy_into(g, ops::mul(alias(g), ops::to_dtype(coef, g->dtype)));
    }
    if (total_norm) *total_norm = wrap(total);
  });
}

FLAME_API flame_status_t flame_clip_grad_value(flame_ctx_t ctx, const flame_tensor_t* params, int64_t n, double clip) {
  return api_call("flame_clip_grad_value", [&] {
    Context& c = context_of(ctx);
    FLAME_CHECK(std::isfinite(clip) && clip >= 0, FLAME_ERROR_INVALID_ARGUMENT, "clip must be finite and >= 0, got ", clip);
    LiveScope scope(c);
    for (const Tensor& g : grads_of(c, tensor_list(params, n, "params")))
      ops::copy_into(g, ops::unary(OpId::Clamp, alias(g), -clip, clip));
  });
}

}  // extern "C"

// ---------------- optimizer state files (optim/optim_state.cpp) ----------------
extern "C" {

FLAME_API flame_status_t flame_optimizer_save_state(flame_optimizer_t o, const char* path) {
  return api_call("flame_optimizer_save_state", [&] {
    Optimizer& opt = unwrap_opt(o);
    FLAME_CHECK(path, FLAME_ERROR_INVALID_ARGUMENT, "path is NULL");
    LiveScope scope(opt.ctx());
    save_optimizer_state(opt, path);
  });
}

FLAME_API flame_status_t flame_optimizer_load_state(flame_optimizer_t o, const char* path) {
  return api_call("flame_optimizer_load_state", [&] {
    Optimizer& opt = unwrap_opt(o);
    FLAME_CHECK(path, FLAME_ERROR_INVALID_ARGUMENT, "path is NULL");
    LiveScope scope(opt.ctx());
    load_optimizer_state(opt, path);
  });
}

}  // extern "C"

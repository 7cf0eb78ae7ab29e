// C entry points of autograd: requires_grad, .grad, backward, grad, hooks.
#include <functional>
#include <string>
#include "api/guard.h"
#include "autograd/engine.h"
#include "ops/ops.h"

struct flame_hook_s {
  std::shared_ptr<flame::HookRecord> record;
};

using namespace flame;

namespace {

std::vector<Tensor> optional_list(const flame_tensor_t* ts, int32_t n, const char* name) {
  std::vector<Tensor> v(static_cast<size_t>(n));
  if (!ts) return v;
  for (int32_t i = 0; i < n; ++i)
    if (ts[i]) v[static_cast<size_t>(i)] = unwrap(ts[i], name);
  return v;
}

// The C hooks of flame.h adapted to the graph's C++ hooks (tensor/autograd_graph.h): each call lends
// the callback a handle, and a failing status becomes a flame::Error with the callback's message.
std::function<Tensor(const Tensor&)> c_tensor_hook(flame_tensor_hook_fn fn, void* user_data) {
  return [fn, user_data](const Tensor& g) -> Tensor {
    flame_tensor_t gh = wrap_lent(g);
    flame_tensor_t replacement = nullptr;
    clear_last_error();
    flame_status_t st = fn(user_data, gh, &replacement);
    release_handle(gh);
    if (st != FLAME_OK) {
      release_handle(replacement);
      std::string msg = last_error();
      fail(st, "a gradient hook failed: ", msg.empty() ? "(the hook gave no message)" : msg);
    }
    if (!replacement) return nullptr;
    Tensor r;
    try {
      r = unwrap(replacement, "replacement");
    } catch (...) {
      fail(FLAME_ERROR_INVALID_HANDLE, "a gradient hook returned an invalid replacement handle");
    }
    release_handle(replacement);
    return r;
  };
}

std::function<void(const Tensor&)> c_post_accumulate_hook(flame_post_accumulate_hook_fn fn, void* user_data) {
  return [fn, user_data](const Tensor& leaf) {
    flame_tensor_t lh = wrap_lent(leaf);
    clear_last_error();
    flame_status_t st = fn(user_data, lh);
    release_handle(lh);
    if (st != FLAME_OK) {
      std::string msg = last_error();
      fail(st, "a post-accumulate hook failed: ", msg.empty() ? "(the hook gave no message)" : msg);
    }
  };
}

flame_status_t register_hook(const char* fn, flame_tensor_t t, flame_tensor_hook_fn tfn, flame_post_accumulate_hook_fn pfn,
                             void* user_data, flame_destroy_fn destroy, flame_hook_t* out) {
  return api_call(fn, [&] {
    out_param(out, "hook");
    const Tensor& x = unwrap(t, "t");
    FLAME_CHECK(tfn || pfn, FLAME_ERROR_INVALID_ARGUMENT, "fn is NULL");
    LiveScope s(x);
    FLAME_CHECK(requires_grad(*x), FLAME_ERROR_INVALID_ARGUMENT, "cannot register a hook on a tensor that does not require grad");
    auto rec = std::make_shared<HookRecord>();
    if (tfn) rec->on_grad = c_tensor_hook(tfn, user_data);
    if (pfn) rec->on_accumulated = c_post_accumulate_hook(pfn, user_data);
    if (destroy) rec->on_finish = [destroy, user_data] { destroy(user_data); };
    rec->ctx = x->ctx().shared_from_this();
    auto& m = *x->autograd;
    if (pfn) {
      FLAME_CHECK(!m.grad_fn, FLAME_ERROR_INVALID_ARGUMENT, "post-accumulate hooks can only be registered on leaf tensors");
      m.post_hooks.push_back(rec);
    } else if (m.grad_fn) {
      m.grad_fn->hooks.emplace_back(m.output_nr, rec);
    } else {
      m.hooks.push_back(rec);
    }
    *out = new flame_hook_s{rec};
  });
}

}  // namespace

extern "C" {

FLAME_API flame_status_t flame_tensor_set_requires_grad(flame_tensor_t t, int32_t flag) {
  return api_call("flame_tensor_set_requires_grad", [&] {
    const Tensor& x = unwrap_any(t, "t");
    LiveScope s(x);
    if (!flag && !requires_grad(*x)) return;
    if (flag) {
      FLAME_CHECK(is_floating(x->dtype), FLAME_ERROR_DTYPE_MISMATCH, "only floating tensors can require grad, not ",
                  dtype_name(x->dtype));
      FLAME_CHECK(!(x->autograd && x->autograd->is_inference), FLAME_ERROR_INVALID_ARGUMENT,
                  "a tensor created in inference mode can never require grad");
    }
    auto& m = autograd_meta(*x);
    FLAME_CHECK(!m.grad_fn, FLAME_ERROR_INVALID_ARGUMENT,
                "requires_grad can only be changed on leaf tensors (detach the tensor first)");
    m.requires_grad = flag != 0;
  });
}

FLAME_API flame_status_t flame_tensor_requires_grad(flame_tensor_t t, int32_t* out) {
  return api_call("flame_tensor_requires_grad", [&] { auto* out_ = out_param(out, "requires_grad");
    *out_ = requires_grad(*unwrap_any(t, "t")); });
}

FLAME_API flame_status_t flame_tensor_is_leaf(flame_tensor_t t, int32_t* out) {
  return api_call("flame_tensor_is_leaf", [&] {
    const Tensor& x = unwrap_any(t, "t");
    auto* out_ = out_param(out, "is_leaf");
    *out_ = !(x->autograd && x->autograd->grad_fn);
  });
}

FLAME_API flame_status_t flame_tensor_detach(flame_tensor_t t, flame_tensor_t* out) {
  return api_call("flame_tensor_detach", [&] {
    out_param(out, "out");
    const Tensor& x = unwrap(t, "t");
    LiveScope s(x);
    *out = wrap(alias(x));
  });
}

FLAME_API flame_status_t flame_tensor_grad(flame_tensor_t t, flame_tensor_t* out) {
  return api_call("flame_tensor_grad", [&] {
    out_param(out, "grad");
    const Tensor& x = unwrap_any(t, "t");
    LiveScope s(x);
    if (x->autograd && x->autograd->grad) *out = wrap(x->autograd->grad);
  });
}

FLAME_API flame_status_t flame_tensor_set_grad(flame_tensor_t t, flame_tensor_t grad) {
  return api_call("flame_tensor_set_grad", [&] {
    const Tensor& x = unwrap(t, "t");
    LiveScope s(x);
    if (!grad) {
      if (x->autograd) x->autograd->grad.reset();
      return;
    }
    const Tensor& g = unwrap(grad, "grad");
    FLAME_CHECK(&g->ctx() == &x->ctx(), FLAME_ERROR_INVALID_ARGUMENT, "grad belongs to another context");
    FLAME_CHECK(g->shape == x->shape, FLAME_ERROR_SHAPE_MISMATCH, "grad has shape ", shape_str(g->shape),
                ", the tensor ", shape_str(x->shape));
    FLAME_CHECK(g->dtype == x->dtype, FLAME_ERROR_DTYPE_MISMATCH, "grad has dtype ", dtype_name(g->dtype),
                ", the tensor ", dtype_name(x->dtype));
    autograd_meta(*x).grad = g;
  });
}

FLAME_API flame_status_t flame_tensor_zero_grad(flame_tensor_t t) {
  return api_call("flame_tensor_zero_grad", [&] {
    const Tensor& x = unwrap(t, "t");
    LiveScope s(x);
    if (x->autograd && x->autograd->grad) ops::fill_(x->autograd->grad, 0.0);
  });
}

FLAME_API flame_status_t flame_tensor_retain_grad(flame_tensor_t t) {
  return api_call("flame_tensor_retain_grad", [&] {
    const Tensor& x = unwrap(t, "t");
    LiveScope s(x);
    FLAME_CHECK(requires_grad(*x), FLAME_ERROR_INVALID_ARGUMENT, "retain_grad on a tensor that does not require grad");
    auto& m = *x->autograd;
    if (!m.grad_fn) return;  // leaves keep their gradient anyway
    for (auto& r : m.grad_fn->retained)
      if (r.first == m.output_nr && r.second.lock() == x) return;
    m.grad_fn->retained.emplace_back(m.output_nr, x);
  });
}

FLAME_API flame_status_t flame_backward(flame_ctx_t ctx, flame_tensor_t root, flame_tensor_t grad, uint32_t flags) {
  return api_call("flame_backward", [&] {
    Context& c = context_of(ctx);
    const Tensor& r = unwrap(root, "root");
    FLAME_CHECK(&r->ctx() == &c, FLAME_ERROR_INVALID_ARGUMENT, "root belongs to another context");
    FLAME_CHECK((flags & ~3u) == 0, FLAME_ERROR_INVALID_ARGUMENT, "unknown flags ", flags);
    LiveScope s(c);
    BackwardRequest req;
    req.roots = {r};
    req.root_grads = {grad ? unwrap(grad, "grad") : nullptr};
    req.keep_graph = (flags & (FLAME_BACKWARD_RETAIN_GRAPH | FLAME_BACKWARD_CREATE_GRAPH)) != 0;
    req.create_graph = (flags & FLAME_BACKWARD_CREATE_GRAPH) != 0;
    run_backward(c, req);
  });
}

FLAME_API flame_status_t flame_grad(flame_ctx_t ctx, const flame_tensor_t* outputs, const flame_tensor_t* grad_outputs,
                                    int32_t n_outputs, const flame_tensor_t* inputs, int32_t n_inputs, uint32_t flags,
                                    flame_tensor_t* results) {
  return api_call("flame_grad", [&] {
    FLAME_CHECK(results, FLAME_ERROR_INVALID_ARGUMENT, "results is NULL");
    FLAME_CHECK(outputs && inputs && n_outputs > 0 && n_inputs > 0, FLAME_ERROR_INVALID_ARGUMENT,
                "outputs and inputs must be non-empty arrays");
    for (int32_t i = 0; i < n_inputs; ++i) results[i] = nullptr;
    FLAME_CHECK((flags & ~7u) == 0, FLAME_ERROR_INVALID_ARGUMENT, "unknown flags ", flags);
    Context& c = context_of(ctx);
    BackwardRequest req;
    req.roots = optional_list(outputs, n_outputs, "outputs[i]");
    for (auto& o : req.roots) FLAME_CHECK(o, FLAME_ERROR_INVALID_ARGUMENT, "outputs holds NULL");
    req.root_grads = optional_list(grad_outputs, n_outputs, "grad_outputs[i]");
    req.inputs = optional_list(inputs, n_inputs, "inputs[i]");
    for (auto& x : req.inputs) FLAME_CHECK(x && &x->ctx() == &c, FLAME_ERROR_INVALID_ARGUMENT, "inputs holds NULL or a tensor of another context");
    for (auto& o : req.roots) FLAME_CHECK(&o->ctx() == &c, FLAME_ERROR_INVALID_ARGUMENT, "outputs holds a tensor of another context");
    req.keep_graph = (flags & (FLAME_BACKWARD_RETAIN_GRAPH | FLAME_BACKWARD_CREATE_GRAPH)) != 0;
    req.create_graph = (flags & FLAME_BACKWARD_CREATE_GRAPH) != 0;
    req.allow_unused = (flags & FLAME_GRAD_ALLOW_UNUSED) != 0;
    LiveScope s(c);
    std::vector<Tensor> g = run_backward(c, req);
    for (int32_t i = 0; i < n_inputs; ++i) results[i] = g[static_cast<size_t>(i)] ? wrap(g[static_cast<size_t>(i)]) : nullptr;
  });
}

FLAME_API flame_status_t flame_tensor_register_hook(flame_tensor_t t, flame_tensor_hook_fn fn, void* user_data,
                                                    flame_destroy_fn destroy, flame_hook_t* hook) {
  return register_hook("flame_tensor_register_hook", t, fn, nullptr, user_data, destroy, hook);
}

FLAME_API flame_status_t flame_tensor_register_post_accumulate_grad_hook(flame_tensor_t t, flame_post_accumulate_hook_fn fn,
                                                                         void* user_data, flame_destroy_fn destroy,
                                                                         flame_hook_t* hook) {

  return register_hook("flame_tensor_register_post_accumulate_grad_hook", t, nullptr, fn, user_data, destroy, hook);
}

FLAME_API void flame_hook_remove(flame_hook_t hook) {
  if (!hook) return;
  try {
    std::shared_ptr<Context> ctx = hook->record->ctx.lock();
    if (ctx) {
      std::lock_guard<std::recursive_mutex> lock(ctx->mutex);
      hook->record->finish();
    } else {
      hook->record->finish();
    }
  } catch (...) {
  }
  delete hook;
}

}  // extern "C"

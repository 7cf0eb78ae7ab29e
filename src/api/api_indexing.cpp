// C entry points of the indexing ops (ops/indexing.h): argument checks, then one call each.
#include <cmath>
#include "api/guard.h"
#include "ops/indexing.h"

using namespace flame;

namespace {

// t and the other tensor arguments (named in messages) must be live handles of one context.
template <class F>
flame_status_t index_call(const char* fn, flame_tensor_t t, const char* t_name, std::initializer_list<std::pair<flame_tensor_t, const char*>> more,
                          flame_tensor_t* out, F&& f) {
  return api_call(fn, [&] {
    out_param(out, "out");
    const Tensor& x = unwrap(t, t_name);
    std::vector<Tensor> args;
    for (const auto& m : more) {
      args.push_back(unwrap(m.first, m.second));
      FLAME_CHECK(&args.back()->ctx() == &x->ctx(), FLAME_ERROR_INVALID_ARGUMENT, m.second, " belongs to another context");
    }
    TensorScope s(x);
    *out = wrap(f(x, args));
  });
}

}  // namespace

extern "C" {

FLAME_API flame_status_t flame_index_select(flame_tensor_t t, int32_t dim, flame_tensor_t index, flame_tensor_t* out) {
  return index_call("flame_index_select", t, "t", {{index, "index"}}, out,
                    [&](const Tensor& x, const std::vector<Tensor>& a) { return ops::index_select(x, dim, a[0]); });
}

FLAME_API flame_status_t flame_gather(flame_tensor_t t, int32_t dim, flame_tensor_t index, flame_tensor_t* out) {
  return index_call("flame_gather", t, "t", {{index, "index"}}, out,
                    [&](const Tensor& x, const std::vector<Tensor>& a) { return ops::gather(x, dim, a[0]); });
}

FLAME_API flame_status_t flame_scatter_add(flame_tensor_t t, int32_t dim, flame_tensor_t index, flame_tensor_t src,
                                           flame_tensor_t* out) {
  return index_call("flame_scatter_add", t, "t", {{index, "index"}, {src, "src"}}, out,
                    [&](const Tensor& x, const std::vector<Tensor>& a) { return ops::scatter_add(x, dim, a[0], a[1]); });
}

FLAME_API flame_status_t flame_index_add(flame_tensor_t t, int32_t dim, flame_tensor_t index, flame_tensor_t source, double alpha,
                                         flame_tensor_t* out) {
  return index_call("flame_index_add", t, "t", {{index, "index"}, {source, "source"}}, out,
                    [&](const Tensor& x, const std::vector<Tensor>& a) { return ops::index_add(x, dim, a[0], a[1], alpha); });
}

FLAME_API flame_status_t flame_masked_fill(flame_tensor_t t, flame_tensor_t mask, double value, flame_tensor_t* out) {
  return index_call("flame_masked_fill", t, "t", {{mask, "mask"}}, out,
                    [&](const Tensor& x, const std::vector<Tensor>& a) { return ops::masked_fill(x, a[0], value); });
}

FLAME_API flame_status_t flame_one_hot(flame_tensor_t index, int64_t num_classes, flame_tensor_t* out) {
  return index_call("flame_one_hot", index, "index", {}, out,
                    [&](const Tensor& x, const std::vector<Tensor>&) { return ops::one_hot(x, num_classes); });
}

FLAME_API flame_status_t flame_embedding(flame_tensor_t weight, flame_tensor_t indices, int64_t padding_idx, flame_tensor_t* out) {
  return index_call("flame_embedding", weight, "weight", {{indices, "indices"}}, out,
                    [&](const Tensor& x, const std::vector<Tensor>& a) { return ops::embedding(x, a[0], padding_idx); });
}

}  // extern "C"

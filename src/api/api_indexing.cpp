// C entry points of the indexing ops (ops/indexing.h): argument checks, then one call each.
#include <cmath>
#include "api/guard.h"
#include "ops/indexing.h"

using namespace flame;

namespace {

}  // namespace

extern "C" {

FLAME_API flame_status_t flame_index_select(flame_tensor_t t, int32_t dim, flame_tensor_t index, flame_tensor_t* out) {
  return tensor_op("flame_index_select", {{t, "t"}, {index, "index"}}, out,
                   [&](const Tensor& x, const Tensor& idx) { return ops::index_select(x, dim, idx); });
}

FLAME_API flame_status_t flame_gather(flame_tensor_t t, int32_t dim, flame_tensor_t index, flame_tensor_t* out) {
  return tensor_op("flame_gather", {{t, "t"}, {index, "index"}}, out,
                   [&](const Tensor& x, const Tensor& idx) { return ops::gather(x, dim, idx); });
}

FLAME_API flame_status_t flame_scatter_add(flame_tensor_t t, int32_t dim, flame_tensor_t index, flame_tensor_t src,
                                           flame_tensor_t* out) {
  return tensor_op("flame_scatter_add", {{t, "t"}, {index, "index"}, {src, "src"}}, out,
                   [&](const Tensor& x, const Tensor& idx, const Tensor& values) { return ops::scatter_add(x, dim, idx, values); });
}

FLAME_API flame_status_t flame_index_add(flame_tensor_t t, int32_t dim, flame_tensor_t index, flame_tensor_t source, double alpha,
                                         flame_tensor_t* out) {
  return tensor_op("flame_index_add", {{t, "t"}, {index, "index"}, {source, "source"}}, out,
                   [&](const Tensor& x, const Tensor& idx, const Tensor& values) { return ops::index_add(x, dim, idx, values, alpha); });
}

FLAME_API flame_status_t flame_masked_fill(flame_tensor_t t, flame_tensor_t mask, double value, flame_tensor_t* out) {
  return tensor_op("flame_masked_fill", {{t, "t"}, {mask, "mask"}}, out,
                   [&](const Tensor& x, const Tensor& m) { return ops::masked_fill(x, m, value); });
}

FLAME_API flame_status_t flame_one_hot(flame_tensor_t index, int64_t num_classes, flame_tensor_t* out) {
  return tensor_op("flame_one_hot", {{index, "index"}}, out,
                   [&](const Tensor& x) { return ops::one_hot(x, num_classes); });
}

FLAME_API flame_status_t flame_embedding(flame_tensor_t weight, flame_tensor_t indices, int64_t padding_idx, flame_tensor_t* out) {
  return tensor_op("flame_embedding", {{weight, "weight"}, {indices, "indices"}}, out,
                   [&](const Tensor& x, const Tensor& idx) { return ops::embedding(x, idx, padding_idx); });
}

}  // extern "C"

// Indexing ops (src/ops/indexing.cpp): two recorded primitives with kernels (cuda/indexing.cuh),
// gather and scatter-add, each the other's backward, and the ops built on them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "tensor/tensor.h"

namespace flame::ops {

constexpr int64_t kNoIndex = INT64_MIN;  // FLAME_NO_PADDING: no index is skipped

Tensor gather(const Tensor& x, int dim, const Tensor& index);
Tensor index_select(const Tensor& x, int dim, const Tensor& index);
Tensor embedding(const Tensor& weight, const Tensor& indices, int64_t padding_idx);
Tensor scatter_add(const Tensor& x, int dim, const Tensor& index, const Tensor& src);
Tensor index_add(const Tensor& x, int dim, const Tensor& index, const Tensor& source, double alpha);
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
Tensor one_hot(const Tensor& index, int64_t num_classes);

// The primitives. index has the iteration shape (index_select / index_add pass a broadcast view of
// their 1-D index); `what` names the index in error messages. gather_index reads 0 where
// index == skip if zero_skip; scatter_add_index never scatters index == skip. Gather's backward is
// scatter_add_index with its skip; scatter_add_index's backward (for src) is gather_index with
// zero_skip, so each is differentiable as often as needed.
Tensor gather_index(const Tensor& x, int dim, const Tensor& index, int64_t skip, bool zero_skip, const std::string& what);
Tensor scatter_add_index(const Tensor& x, int dim, const Tensor& index, const Tensor& src, int64_t skip, double alpha,
                         const std::string& what);
// Node attributes of Gather (alpha unused) and ScatterAdd (zero_skip unused); the index is saved.
struct IndexAttrs {
  int dim = 0;
  int64_t skip = 0;
  bool zero_skip = false;
  double alpha = 1.0;
};

// The kernel names the indexing ops can launch (for the CPU test that compiles every kernel).
std::vector<std::string> indexing_instantiations();

}  // namespace flame::ops

// Host side of the generic kernels: names them by kernel keys (runtime/kernel_key.h) from dtypes and
// functor names, picks the dense or strided elementwise kernel, the reduction strategy, and launches.
// The launch geometry of the elementwise kernels (grid, vector width, the rows and strided layouts) is
// shared with the fused kernels (ops/fused.cpp), whose layouts differ only in their operand count.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>
#include "tensor/op_list.h"
#include "tensor/tensor.h"

namespace flame {

struct ScalarArgs {  // must match cuda/common.cuh
  double s0 = 0, s1 = 0, s2 = 0;
};

// out = functor(ins...) elementwise; all operands share out's shape (views may broadcast).
void launch_elementwise(std::string_view functor, const ScalarArgs& s, const Tensor& out, const std::vector<Tensor>& ins);
// The name expressions launch_elementwise may instantiate for a functor and dtypes (out, ins...):
// used by the CPU test that compiles every kernel.
std::vector<std::string> elementwise_instantiations(std::string_view functor, DType out, const std::vector<DType>& ins);

// The dtypes an elementwise op computes in and returns for input dtype `in`; false when the op
// rejects the dtype or answers without a kernel.
bool elementwise_signature(OpId op, DType in, DType* compute, DType* out);
const char* elementwise_functor(OpId op);

enum class ReduceKind { Sum, Prod, Max, Min };
// Reduces x over rdims (sorted, normalised) into a new tensor of out_dtype with keepdim geometry.
Tensor launch_reduce(const Tensor& x, const std::vector<int>& rdims, ReduceKind kind, DType out_dtype);
std::vector<std::string> reduce_instantiations(ReduceKind kind, DType in, DType out);
// Index of the max/min over rdims (keepdim geometry), as i64.
Tensor launch_arg_reduce(const Tensor& x, const std::vector<int>& rdims, bool is_max);
std::vector<std::string> arg_reduce_instantiations(DType in);
Tensor launch_cumsum(const Tensor& x, int dim, DType out_dtype);
std::string cumsum_instantiation(DType in, DType out);

// ---------------- launch geometry of the elementwise and fused kernels ----------------
constexpr unsigned kLaunchBlock = 256;  // threads per block of ew_contig/rows/strided and fused_*
constexpr int kLayoutMaxDims = 8;       // collapsed axes a layout holds

// Blocks for a grid-stride loop over work_items, one per thread, capped at 32 blocks per SM.
unsigned grid_for(Context& ctx, int64_t work_items, unsigned block = kLaunchBlock);
// Elements per 16-byte vector access of the widest of out and ins.
int vector_width(DType out, const std::vector<DType>& ins);
// Whether out and every operand start on a boundary of v of their elements.
bool vectors_aligned(const Tensor& out, const std::vector<Tensor>& ins, int v);

// Host mirrors of the device layouts, for kernels of up to N input operands: N = 3 is RowsLayout /
// StridedLayout of cuda/elementwise.cuh, N = kFusedMaxOperands FusedRowsLayout / FusedStridedLayout
// of cuda/fused.cuh. Field for field; the sizes are asserted on both sides (N = 3 here, the fused
// ones in ops/fused.cpp).
template <int N>
struct RowsLayout {
  int nd;  // outer axes, 0 to kLayoutMaxDims - 1
  int64_t shape[kLayoutMaxDims - 1];
  int64_t outer[N][kLayoutMaxDims - 1];  // operand strides along the outer axes
  int64_t rows, cols;
  int inner[N];  // 0 (broadcast along the row) or 1
};
template <int N>
struct StridedLayout {
  int ndim;
  int64_t shape[kLayoutMaxDims];
  int64_t stride[N + 1][kLayoutMaxDims];  // operand 0 is the output
};
static_assert(offsetof(RowsLayout<3>, shape) == 8 && offsetof(RowsLayout<3>, rows) == 232 &&
                  offsetof(RowsLayout<3>, inner) == 248 && sizeof(RowsLayout<3>) == 264,
              "RowsLayout of cuda/elementwise.cuh");
static_assert(offsetof(StridedLayout<3>, stride) == 72 && sizeof(StridedLayout<3>) == 328,
              "StridedLayout of cuda/elementwise.cuh");

// Whether the collapsed layout c of (out, ins...) suits the rows kernels with v elements per vector:
// a dense output whose operands are dense (inner stride 1) or broadcast (0) along the last axis,
// rows of at least 4 vectors, and every vector access aligned (out, each dense operand and its
// outer strides). False also for no operands or more than kLayoutMaxDims axes.
bool rows_fit(const Tensor& out, const std::vector<Tensor>& ins, const CollapsedLayout& c, int v);

// Fills L for the rows kernels, or returns false (the caller falls back) where rows_fit says no
// or there are more than N operands.
template <int N>
bool plan_rows_layout(const Tensor& out, const std::vector<Tensor>& ins, const CollapsedLayout& c, int v, RowsLayout<N>* L) {
  if (ins.size() > static_cast<size_t>(N) || !rows_fit(out, ins, c, v)) return false;
  const int nd = static_cast<int>(c.shape.size());
  *L = RowsLayout<N>{};
  L->nd = nd - 1;
  L->cols = c.shape[nd - 1];
  L->rows = 1;
  for (int d = 0; d < nd - 1; ++d) {
    L->shape[d] = c.shape[d];
    L->rows *= c.shape[d];
    for (size_t k = 0; k < ins.size(); ++k) L->outer[k][d] = c.strides[k + 1][d];
  }
  for (size_t k = 0; k < ins.size(); ++k) L->inner[k] = static_cast<int>(c.strides[k + 1][nd - 1]);
  return true;
}

// The strided layout of c (operand 0 the output, then up to N inputs; at most kLayoutMaxDims axes).
template <int N>
StridedLayout<N> plan_strided_layout(const CollapsedLayout& c) {
  StridedLayout<N> L{};
  L.ndim = static_cast<int>(c.shape.size());
  for (int d = 0; d < L.ndim; ++d) {
    L.shape[d] = c.shape[d];
    for (size_t k = 0; k < c.strides.size(); ++k) L.stride[k][d] = c.strides[k][d];
  }
  return L;
}

}  // namespace flame

// Host side of the generic kernels: names them by kernel keys (runtime/kernel_key.h) from dtypes and
// functor names, picks the dense or strided elementwise kernel, the reduction strategy, and launches.
#pragma once
#include <string>
#include <string_view>
#include <vector>
#include "ops/op_list.h"
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

}  // namespace flame

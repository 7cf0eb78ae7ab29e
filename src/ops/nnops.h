// More neural-network ops (issue 5, second part), one source file per group:
//  - indexing: scatter, masked_select, repeat, repeat_interleave, pad (ops/indexing_extra.cpp,
//    kernel cuda/scatter.cuh);
//  - dropout (ops/dropout.cpp, kernel cuda/dropout.cuh).
// Recorded nodes are the FLAME_NNOPS_OPS rows of ops/op_list.h; their backward rules live with all
// others in autograd/backward_rules.cpp. Everything else here is a composition of recorded ops.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "tensor/tensor.h"

namespace flame::ops {

// ---- indexing (ops/indexing_extra.cpp) ----
// torch.scatter out of place; src at least index's size on every dim (only that part is read).
Tensor scatter(const Tensor& x, int dim, const Tensor& index, const Tensor& src);
// The recorded primitive: index (contiguous, the iteration shape) and src of index's shape.
Tensor scatter_index(const Tensor& x, int dim, const Tensor& index, const Tensor& src, const std::string& what);
// The elements of x where mask (bool, broadcast with x) is true, 1-D. Waits for the device (count).
Tensor masked_select(const Tensor& x, const Tensor& mask);
Tensor repeat(const Tensor& x, const std::vector<int64_t>& repeats);
// flatten: PyTorch's dim=None (x flattened first, dim ignored).
Tensor repeat_interleave(const Tensor& x, int64_t repeats, int dim, bool flatten);
enum class PadMode : int { Constant = 0, Reflect = 1, Replicate = 2 };  // values of flame_pad_mode_t
// pads: (left, right) of the last dim, then of the one before, ... (torch.nn.functional.pad).
Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, PadMode mode, double value);
// The recorded constant pad: x placed at offsets `lefts` (one per dim, >= 0) of a tensor of shape
// `shape` filled with value.
Tensor constant_pad(const Tensor& x, const std::vector<int64_t>& lefts, const Shape& shape, double value);

// ---- dropout (ops/dropout.cpp) ----
// Identity (x itself) when !training or p == 0; x * 0 when p == 1; else draws from the context's
// generator and records a Dropout node.
Tensor dropout(const Tensor& x, double p, bool training);
// The recorded op: x times the keep mask of (seed, offset, p), scaled by 1 / (1 - p).
Tensor dropout_apply(const Tensor& x, uint64_t seed, uint64_t offset, double p);

// ---- every kernel instantiation these ops may launch (for the CPU kernel-compile test) ----
std::vector<std::string> scatter_instantiations();
std::vector<std::string> dropout_instantiations();

}  // namespace flame::ops

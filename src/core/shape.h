// Shape arithmetic shared by every op: overflow-checked element counts, row-major strides,
// broadcasting, axis normalisation, reshape-as-view strides, and dimension collapsing for kernels.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace flame {

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

// Product of sizes; fails with FLAME_ERROR_INVALID_ARGUMENT on negative sizes or when the product
// of the nonzero sizes overflows int64 (also for empty shapes: strides are made of those sizes).
int64_t checked_numel(const Shape& shape);
// numel * elem_size as bytes, failing on overflow of size_t / int64.
size_t checked_bytes(int64_t numel, size_t elem_size);
Strides contiguous_strides(const Shape& shape);
bool is_contiguous(const Shape& shape, const Strides& strides);
std::string shape_str(const Shape& shape);
// Maps a possibly negative axis into [0, ndim); fails naming `what`.
int normalize_dim(int64_t dim, int ndim, const char* what = "dim");
// NumPy broadcast of two shapes; fails with FLAME_ERROR_SHAPE_MISMATCH.
Shape broadcast_shapes(const Shape& a, const Shape& b);
// Strides that view (shape, strides) as new_shape without copying; false when impossible.
bool view_strides(const Shape& shape, const Strides& strides, const Shape& new_shape, Strides* out);
// Resolves a single -1 in a requested shape against numel.
Shape infer_shape(const Shape& requested, int64_t numel);

// Several operands of one common shape described together for a kernel: merges adjacent
// dimensions wherever every operand allows it, drops size-1 dimensions.
struct CollapsedLayout {
  Shape shape;                       // at least one dimension
  std::vector<Strides> strides;      // per operand
};
CollapsedLayout collapse(const Shape& shape, const std::vector<Strides>& strides);

}  // namespace flame

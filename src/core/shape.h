// Shape arithmetic shared by every op: overflow-checked element counts, row-major strides,
// broadcasting, axis normalisation, reshape-as-view strides, and dimension collapsing for kernels.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace flame {

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

// The one element-count and byte-size check of the library (issue 32). Every shape a tensor is
// made with (make_tensor) and every view geometry (make_view) passes through it, and so do the
// shapes ops compute before allocating (broadcast_shapes, reshape, expand, cat, repeat, pad, ...).
// Hence any product of some of a tensor's sizes fits int64, its strides too, and TensorImpl::numel()
// needs no check of its own. Failures are FLAME_ERROR_INVALID_ARGUMENT with a message naming the
// sizes, prefixed by `what` (the operation, e.g. "expand") when given.
//
// Product of sizes; fails on negative sizes or when the product of the nonzero sizes overflows
// int64 (also for empty shapes: strides and view offsets are products of those sizes). A count of
// up to 2^63 - 1 is legal.
int64_t checked_numel(const Shape& shape, const char* what = nullptr);
// numel * elem_size as bytes, failing when it exceeds 2^63 - 1 (a byte count the allocator, the
// driver and pointer arithmetic can all hold).
size_t checked_bytes(int64_t numel, size_t elem_size, const char* what = nullptr);
// checked_bytes(checked_numel(shape), elem_size): the bytes a contiguous tensor of shape needs.
size_t checked_shape_bytes(const Shape& shape, size_t elem_size, const char* what = nullptr);
// a + b and a * b of sizes >= 0 (a new dim of cat, repeat, ...), failing instead of overflowing.
int64_t checked_size_add(int64_t a, int64_t b, const char* what = nullptr);
int64_t checked_size_mul(int64_t a, int64_t b, const char* what = nullptr);
// The element offsets a strided view reaches relative to its first element (0, ..., 0): lowest
// (<= 0, negative strides) and highest (>= 0). {0, 0} for an empty shape. Fails when a (size - 1)
// * stride or their sum overflows int64; the message names the dim, its size and stride.
struct ElementSpan {
  int64_t lo = 0, hi = 0;
};
ElementSpan checked_span(const Shape& shape, const Strides& strides, const char* what = nullptr);
// A view's geometry over its storage: checked_numel(shape), then for a view of at least one
// element checked_span(shape, strides), the lowest element offset + lo not below 0, and the byte
// just past the highest element, (offset + hi + 1) * elem_size, within 2^63 - 1. A broadcast (stride 0) view may have more
// elements than its bytes could hold: only the extent it reads counts.
void check_view_geometry(const Shape& shape, const Strides& strides, int64_t offset, size_t elem_size,
                         const char* what = nullptr);
Strides contiguous_strides(const Shape& shape);
bool is_contiguous(const Shape& shape, const Strides& strides);
std::string shape_str(const Shape& shape);
// Maps a possibly negative axis into [0, ndim); fails naming `what`.
int normalize_dim(int64_t dim, int ndim, const char* what = "dim");
// NumPy broadcast of two shapes; fails with FLAME_ERROR_SHAPE_MISMATCH, or with
// FLAME_ERROR_INVALID_ARGUMENT (checked_numel) when the result has more than 2^63 - 1 elements.
Shape broadcast_shapes(const Shape& a, const Shape& b);
// Strides that view (shape, strides) as new_shape without copying; false when impossible.
bool view_strides(const Shape& shape, const Strides& strides, const Shape& new_shape, Strides* out);
// Resolves a single -1 in a requested shape against numel; the known sizes pass checked_numel
// (`what` prefixes the messages).
Shape infer_shape(const Shape& requested, int64_t numel, const char* what = nullptr);

// Several operands of one common shape described together for a kernel: merges adjacent
// dimensions wherever every operand allows it, drops size-1 dimensions.
struct CollapsedLayout {
  Shape shape;                       // at least one dimension
  std::vector<Strides> strides;      // per operand
};
CollapsedLayout collapse(const Shape& shape, const std::vector<Strides>& strides);

}  // namespace flame

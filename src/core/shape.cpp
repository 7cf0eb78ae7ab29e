#include "core/shape.h"
#include <limits>
#include <sstream>
#include "core/error.h"

namespace flame {

namespace {

// "what: " before a message, or nothing.
struct Prefix {
  const char* what;
};
std::ostream& operator<<(std::ostream& os, Prefix p) {
  if (p.what && *p.what) os << p.what << ": ";
  return os;
}

constexpr const char* kInt64Max = "2^63 - 1";

}  // namespace

int64_t checked_numel(const Shape& shape, const char* what) {
  // The product of the nonzero sizes must fit too, also when a 0 makes the tensor empty: strides
  // (contiguous_strides) and view offsets are products of those sizes (found by fuzz_core).
  int64_t nonzero = 1;
  bool empty = false;
  for (int64_t s : shape) {
    FLAME_CHECK(s >= 0, FLAME_ERROR_INVALID_ARGUMENT, Prefix{what}, "negative size ", s, " in shape ", shape_str(shape));
    if (s == 0) {
      empty = true;
      continue;
    }
    if (__builtin_mul_overflow(nonzero, s, &nonzero))
      fail(FLAME_ERROR_INVALID_ARGUMENT, Prefix{what}, "shape ", shape_str(shape),
           " has more elements than fit in int64 (more than ", kInt64Max, ")");
  }
  return empty ? 0 : nonzero;
}

size_t checked_bytes(int64_t numel, size_t elem_size, const char* what) {
  FLAME_CHECK(numel >= 0, FLAME_ERROR_INVALID_ARGUMENT, Prefix{what}, "negative element count ", numel);
  int64_t bytes = 0;
  if (elem_size > static_cast<size_t>(std::numeric_limits<int64_t>::max()) ||
      __builtin_mul_overflow(numel, static_cast<int64_t>(elem_size), &bytes))
    fail(FLAME_ERROR_INVALID_ARGUMENT, Prefix{what}, "a tensor of ", numel, " elements of ", elem_size,
         " bytes overflows the byte count (more than ", kInt64Max, " bytes)");
  return static_cast<size_t>(bytes);
}

size_t checked_shape_bytes(const Shape& shape, size_t elem_size, const char* what) {
  const int64_t n = checked_numel(shape, what);
  try {
    return checked_bytes(n, elem_size, what);
  } catch (const Error& e) {
    fail(e.status(), e.what(), " (shape ", shape_str(shape), ")");
  }
}

int64_t checked_size_add(int64_t a, int64_t b, const char* what) {
  FLAME_CHECK(a >= 0 && b >= 0, FLAME_ERROR_INVALID_ARGUMENT, Prefix{what}, "negative size in ", a, " + ", b);
  int64_t r = 0;
  FLAME_CHECK(!__builtin_add_overflow(a, b, &r), FLAME_ERROR_INVALID_ARGUMENT, Prefix{what}, "size ", a, " + ", b,
              " overflows int64 (more than ", kInt64Max, ")");
  return r;
}

int64_t checked_size_mul(int64_t a, int64_t b, const char* what) {
  FLAME_CHECK(a >= 0 && b >= 0, FLAME_ERROR_INVALID_ARGUMENT, Prefix{what}, "negative size in ", a, " * ", b);
  int64_t r = 0;
  FLAME_CHECK(!__builtin_mul_overflow(a, b, &r), FLAME_ERROR_INVALID_ARGUMENT, Prefix{what}, "size ", a, " * ", b,
              " overflows int64 (more than ", kInt64Max, ")");
  return r;
}

ElementSpan checked_span(const Shape& shape, const Strides& strides, const char* what) {
  FLAME_CHECK(shape.size() == strides.size(), FLAME_ERROR_INTERNAL, Prefix{what}, shape.size(), " sizes but ",
              strides.size(), " strides");
  ElementSpan span;
  for (int64_t s : shape)
    if (s == 0) return span;  // no element is reached
  for (size_t i = 0; i < shape.size(); ++i) {
    FLAME_CHECK(shape[i] > 0, FLAME_ERROR_INVALID_ARGUMENT, Prefix{what}, "negative size ", shape[i], " in shape ",
                shape_str(shape));
    int64_t step = 0;
    bool bad = __builtin_mul_overflow(shape[i] - 1, strides[i], &step);
    bad = bad || (step < 0 ? __builtin_add_overflow(span.lo, step, &span.lo)
                           : __builtin_add_overflow(span.hi, step, &span.hi));
    FLAME_CHECK(!bad, FLAME_ERROR_INVALID_ARGUMENT, Prefix{what}, "strides reach past 2^63 elements (dim ", i,
                ": size ", shape[i], ", stride ", strides[i], "; shape ", shape_str(shape), ")");
  }
  return span;
}

void check_view_geometry(const Shape& shape, const Strides& strides, int64_t offset, size_t elem_size,
                         const char* what) {
  // An empty view reads nothing: its offset may even point one stride before its storage (an empty
  // slice at the end of a flipped dim), as PyTorch allows.
  if (checked_numel(shape, what) == 0) return;
  const ElementSpan span = checked_span(shape, strides, what);
  int64_t first = 0, last = 0;
  FLAME_CHECK(offset >= 0 && !__builtin_add_overflow(offset, span.lo, &first) && first >= 0, FLAME_ERROR_INVALID_ARGUMENT,
              Prefix{what}, "a view of shape ", shape_str(shape), " at element offset ", offset,
              " reaches below its storage");
  FLAME_CHECK(!__builtin_add_overflow(offset, span.hi, &last) && last < std::numeric_limits<int64_t>::max(),
              FLAME_ERROR_INVALID_ARGUMENT, Prefix{what}, "a view of shape ", shape_str(shape), " at element offset ",
              offset, " reaches past element 2^63");
  try {
    checked_bytes(last + 1, elem_size, what);
  } catch (const Error& e) {
    fail(e.status(), e.what(), " (the extent of a view of shape ", shape_str(shape), ")");
  }
}

Strides contiguous_strides(const Shape& shape) {
  Strides st(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    st[i] = s;
    s *= shape[i] > 0 ? shape[i] : 1;
  }
  return st;
}

bool is_contiguous(const Shape& shape, const Strides& strides) {
  int64_t expect = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 0) return true;
    if (shape[i] != 1 && strides[i] != expect) return false;
    expect *= shape[i];
  }
  return true;
}

std::string shape_str(const Shape& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

int normalize_dim(int64_t dim, int ndim, const char* what) {
  int64_t d = dim < 0 ? dim + ndim : dim;
  if (d < 0 || d >= ndim)
    fail(FLAME_ERROR_INVALID_ARGUMENT, what, " ", dim, " is out of range for a tensor of ", ndim, " dims");
  return static_cast<int>(d);
}

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t x = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t y = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (x != y && x != 1 && y != 1)
      fail(FLAME_ERROR_SHAPE_MISMATCH, "shapes ", shape_str(a), " and ", shape_str(b), " cannot broadcast");
    out[i] = x == 1 ? y : x;
  }
  try {
    checked_numel(out);
  } catch (const Error& e) {
    fail(e.status(), "shapes ", shape_str(a), " and ", shape_str(b), " cannot broadcast: the result's ", e.what());
  }
  return out;
}

// PyTorch's computeStride: walk chunks of the old shape that are contiguous among themselves and
// match them to runs of the new shape with equal element counts.
bool view_strides(const Shape& shape, const Strides& strides, const Shape& new_shape, Strides* out) {
  out->assign(new_shape.size(), 0);
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  if (numel == 0) {
    *out = contiguous_strides(new_shape);
    return true;
  }
  if (shape.empty()) {
    for (auto& s : *out) s = 1;
    return true;
  }
  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t chunk_base_stride = strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; d--) {
    tensor_numel *= shape[d];
    if (d == 0 || (shape[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        (*out)[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_shape[view_d];
        view_d--;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base_stride = strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

Shape infer_shape(const Shape& requested, int64_t numel, const char* what) {
  Shape out = requested;
  Shape known_sizes;  // the sizes other than the -1
  int infer = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      FLAME_CHECK(infer < 0, FLAME_ERROR_INVALID_ARGUMENT, Prefix{what}, "only one size may be -1 in ", shape_str(requested));
      infer = static_cast<int>(i);
    } else {
      FLAME_CHECK(out[i] >= 0, FLAME_ERROR_INVALID_ARGUMENT, Prefix{what}, "invalid size ", out[i], " in ",
                  shape_str(requested));
      known_sizes.push_back(out[i]);
    }
  }
  int64_t known = 0;
  try {
    known = checked_numel(known_sizes);
  } catch (const Error& e) {
    fail(e.status(), Prefix{what}, "requested shape ", shape_str(requested), " has more elements than fit in int64 (more than ",
         kInt64Max, ")");
  }
  if (infer >= 0) {
    FLAME_CHECK(known != 0 && numel % known == 0, FLAME_ERROR_SHAPE_MISMATCH, Prefix{what}, "cannot reshape ", numel,
                " elements into ", shape_str(requested));
    out[infer] = numel / known;
  } else {
    FLAME_CHECK(known == numel, FLAME_ERROR_SHAPE_MISMATCH, Prefix{what}, "cannot reshape ", numel, " elements into ",
                shape_str(requested));
  }
  return out;
}

CollapsedLayout collapse(const Shape& shape, const std::vector<Strides>& strides) {
  CollapsedLayout r;
  r.strides.resize(strides.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !r.shape.empty();
    for (size_t k = 0; merge && k < strides.size(); ++k)
      merge = r.strides[k].back() == strides[k][d] * shape[d];
    if (merge) {
      r.shape.back() *= shape[d];
      for (size_t k = 0; k < strides.size(); ++k) r.strides[k].back() = strides[k][d];
    } else {
      r.shape.push_back(shape[d]);
      for (size_t k = 0; k < strides.size(); ++k) r.strides[k].push_back(strides[k][d]);
    }
  }
  if (r.shape.empty()) {
    r.shape.push_back(1);
    for (auto& s : r.strides) s.push_back(1);
  }
  return r;
}

}  // namespace flame

// libFuzzer target over the core's CPU logic (white box, linked with the flame_core objects): the
// shape arithmetic every op runs on its arguments (element and byte counts, broadcasting, reshape
// inference, views, axis normalisation, dimension collapsing for kernels) and the validation of
// foreign DLPack descriptors. The input is a sequence of operations with shapes, strides and axes
// drawn from it. Each helper either throws flame::Error (a clean rejection) or returns a result
// that is checked against a brute-force reference for small shapes; anything else (another
// exception, a sanitizer report, a violated invariant) is a finding.
#include <fuzzer/FuzzedDataProvider.h>
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>
#include "core/error.h"
#include "core/shape.h"
#include "interop/dlpack.h"

using namespace flame;

namespace {

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "fuzz_core: invariant violated: %s\n", what);
  std::abort();
}
#define REQUIRE(cond) \
  do {                \
    if (!(cond)) finding(#cond); \
  } while (0)

// A size or stride: mostly small, sometimes an edge value.
int64_t draw_int(FuzzedDataProvider& p, bool allow_negative) {
  switch (p.ConsumeIntegralInRange<int>(0, 9)) {
    case 0: return 0;
    case 1: return 1;
    case 2: return p.ConsumeIntegral<int64_t>();  // anything
    case 3: return int64_t{1} << p.ConsumeIntegralInRange<int>(20, 62);
    case 4: return allow_negative ? -p.ConsumeIntegralInRange<int64_t>(1, 5) : 2;
    default: return p.ConsumeIntegralInRange<int64_t>(0, 6);
  }
}

Shape draw_shape(FuzzedDataProvider& p, int max_ndim = FLAME_MAX_DIMS + 1) {
  Shape s(static_cast<size_t>(p.ConsumeIntegralInRange<int>(0, max_ndim)));
  for (int64_t& v : s) v = draw_int(p, true);
  return s;
}

// Small, valid shapes for brute-force checks.
Shape draw_small_shape(FuzzedDataProvider& p) {
  Shape s(static_cast<size_t>(p.ConsumeIntegralInRange<int>(0, 4)));
  for (int64_t& v : s) v = p.ConsumeIntegralInRange<int64_t>(0, 4);
  return s;
}

int64_t small_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t v : s) n *= v;
  return n;
}

// Element offsets of every index of (shape, strides), row-major order.
std::vector<int64_t> offsets(const Shape& shape, const Strides& strides, int64_t base = 0) {
  std::vector<int64_t> out;
  int64_t n = small_numel(shape);
  Shape idx(shape.size(), 0);
  for (int64_t k = 0; k < n; ++k) {
    int64_t off = base;
    for (size_t d = 0; d < shape.size(); ++d) off += idx[d] * strides[d];
    out.push_back(off);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

template <class F>
void guarded(F&& f) {
  try {
    f();
  } catch (const Error&) {  // a clean rejection
  }
}

void op_counts(FuzzedDataProvider& p) {
  Shape s = draw_shape(p);
  guarded([&] {
    int64_t n = checked_numel(s);
    REQUIRE(n >= 0);
    for (int64_t v : s) REQUIRE(v >= 0);
    size_t elem = static_cast<size_t>(1) << p.ConsumeIntegralInRange<int>(0, 3);
    size_t bytes = checked_bytes(n, elem);
    REQUIRE(bytes / elem == static_cast<size_t>(n));
  });
}

void op_broadcast(FuzzedDataProvider& p) {
  Shape a = draw_shape(p), b = draw_shape(p);
  guarded([&] {
    Shape r = broadcast_shapes(a, b);
    REQUIRE(r.size() == std::max(a.size(), b.size()));
    for (size_t i = 0; i < r.size(); ++i) {
      int64_t x = i + a.size() >= r.size() ? a[i + a.size() - r.size()] : 1;
      int64_t y = i + b.size() >= r.size() ? b[i + b.size() - r.size()] : 1;
      REQUIRE(r[i] == x || r[i] == y);
      REQUIRE((x == 1 || x == r[i]) && (y == 1 || y == r[i]));
    }
  });
}

void op_infer(FuzzedDataProvider& p) {
  Shape requested = draw_shape(p);
  if (!requested.empty() && p.ConsumeBool()) requested[p.ConsumeIntegralInRange<size_t>(0, requested.size() - 1)] = -1;
  int64_t numel = draw_int(p, false);
  guarded([&] {
    Shape r = infer_shape(requested, numel);
    REQUIRE(r.size() == requested.size());
    REQUIRE(checked_numel(r) == numel);
  });
}

void op_view(FuzzedDataProvider& p) {
  Shape shape = draw_small_shape(p);
  Strides strides(shape.size());
  for (int64_t& v : strides) v = p.ConsumeIntegralInRange<int64_t>(-6, 12);
  if (p.ConsumeBool()) strides = contiguous_strides(shape);
  Shape target = draw_small_shape(p);
  guarded([&] {
    Strides out;
    if (small_numel(target) != small_numel(shape)) return;
    if (!view_strides(shape, strides, target, &out)) return;
    REQUIRE(out.size() == target.size());
    REQUIRE(offsets(target, out) == offsets(shape, strides));  // the same elements in the same order
  });
  REQUIRE(is_contiguous(shape, contiguous_strides(shape)));
}

void op_dims(FuzzedDataProvider& p) {
  int ndim = p.ConsumeIntegralInRange<int>(0, 9);
  int64_t dim = draw_int(p, true);
  guarded([&] {
    int d = normalize_dim(dim, ndim);
    REQUIRE(d >= 0 && d < ndim);
  });
}

void op_collapse(FuzzedDataProvider& p) {
  Shape shape = draw_small_shape(p);
  std::vector<Strides> strides(static_cast<size_t>(p.ConsumeIntegralInRange<int>(1, 3)), Strides(shape.size()));
  for (Strides& s : strides)
    for (int64_t& v : s) v = p.ConsumeIntegralInRange<int64_t>(-4, 9);
  guarded([&] {
    CollapsedLayout c = collapse(shape, strides);
    REQUIRE(!c.shape.empty());
    REQUIRE(c.strides.size() == strides.size());
    REQUIRE(small_numel(c.shape) == small_numel(shape));
    for (size_t k = 0; k < strides.size(); ++k) {
      REQUIRE(c.strides[k].size() == c.shape.size());
      REQUIRE(offsets(c.shape, c.strides[k]) == offsets(shape, strides[k]));  // kernels see the same elements
    }
  });
}

void op_dlpack(FuzzedDataProvider& p) {
  int64_t shape[FLAME_MAX_DIMS + 2];
  int64_t strides[FLAME_MAX_DIMS + 2];
  DLTensor t{};
  t.ndim = p.ConsumeIntegralInRange<int32_t>(-1, FLAME_MAX_DIMS + 1);
  const int n = std::max(0, std::min<int>(t.ndim, FLAME_MAX_DIMS + 1));
  bool small = p.ConsumeBool();
  for (int i = 0; i < n; ++i) {
    shape[i] = small ? p.ConsumeIntegralInRange<int64_t>(0, 4) : draw_int(p, true);
    strides[i] = small ? p.ConsumeIntegralInRange<int64_t>(-8, 8) : draw_int(p, true);
  }
  t.shape = p.ConsumeBool() || t.ndim <= 0 ? shape : nullptr;
  t.strides = p.ConsumeBool() ? strides : nullptr;
  t.data = reinterpret_cast<void*>(static_cast<uintptr_t>(p.ConsumeBool() ? p.ConsumeIntegral<uint64_t>()
                                                                           : (uint64_t{1} << 40)));
  t.byte_offset = p.ConsumeBool() ? p.ConsumeIntegral<uint64_t>() : p.ConsumeIntegralInRange<uint64_t>(0, 64);
  const int32_t device_type = p.ConsumeBool() ? kDLCUDA : p.ConsumeIntegralInRange<int32_t>(0, 20);
  std::memcpy(&t.device.device_type, &device_type, sizeof device_type);  // any value, as a producer may send
  t.device.device_id = p.ConsumeBool() ? 0 : p.ConsumeIntegral<int32_t>();
  t.dtype.code = p.ConsumeBool() ? kDLFloat : p.ConsumeIntegral<uint8_t>();
  t.dtype.bits = p.ConsumeBool() ? 32 : p.ConsumeIntegral<uint8_t>();
  t.dtype.lanes = p.ConsumeBool() ? 1 : p.ConsumeIntegral<uint16_t>();
  guarded([&] {
    dlpack::Layout l = dlpack::import_layout(t, 0, "src");
    REQUIRE(l.shape.size() == static_cast<size_t>(t.ndim) && l.strides.size() == l.shape.size());
    const uint64_t elem = dtype_size(l.dtype);
    REQUIRE(elem > 0 && l.bytes % elem == 0);
    const uint64_t first = reinterpret_cast<uintptr_t>(t.data) + t.byte_offset;
    if (l.bytes == 0) return;
    REQUIRE(l.base + static_cast<uint64_t>(l.offset) * elem == first);
    REQUIRE(l.base + l.bytes >= l.base);  // no wrap
    int64_t numel = small_numel(l.shape);
    if (numel > 4096 || numel < 0) return;
    for (int64_t off : offsets(l.shape, l.strides, l.offset)) {  // every element inside the storage
      REQUIRE(off >= 0);
      REQUIRE(static_cast<uint64_t>(off) * elem + elem <= l.bytes);
    }
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider p(data, size);
  for (int steps = 0; steps < 64 && p.remaining_bytes() > 0; ++steps) {
    switch (p.ConsumeIntegralInRange<int>(0, 6)) {
      case 0: op_counts(p); break;
      case 1: op_broadcast(p); break;
      case 2: op_infer(p); break;
      case 3: op_view(p); break;
      case 4: op_dims(p); break;
      case 5: op_collapse(p); break;
      default: op_dlpack(p); break;
    }
  }
  return 0;
}

// White-box tests of the library's one element-count and byte-size check (core/shape.h, issue 32):
// checked_numel, checked_bytes, checked_shape_bytes, checked_size_add/mul, checked_span,
// check_view_geometry, and the shape functions that route through them (broadcast_shapes,
// infer_shape), at the exact int64 boundaries. No GPU: these run wherever the core builds.
#include <gtest/gtest.h>
#include <cstdint>
#include <limits>
#include <string>
#include "core/error.h"
#include "core/shape.h"

namespace flame {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();  // 2^63 - 1
constexpr int64_t p(int n) { return int64_t{1} << n; }

// Runs f, expecting a flame::Error with `status` whose message contains every one of `words`.
template <class F>
void expect_error(F f, flame_status_t status, std::initializer_list<const char*> words) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), status) << e.what();
    for (const char* w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << "\"" << e.what() << "\" lacks " << w;
  }
}

TEST(ShapeOverflow, NumelUpToInt64MaxIsACount) {
  EXPECT_EQ(checked_numel({}), 1);
  EXPECT_EQ(checked_numel({kMax}), kMax);
  EXPECT_EQ(checked_numel({1, kMax, 1}), kMax);
  // 2^63 - 1 = 7^2 * 73 * 127 * 337 * 92737 * 649657: a product that lands exactly on the maximum.
  EXPECT_EQ(checked_numel({49, 73, 127, 337, 92737, 649657}), kMax);
  EXPECT_EQ(checked_numel({p(31), p(31)}), p(62));
  EXPECT_EQ(checked_numel({p(62), 1}), p(62));
}

TEST(ShapeOverflow, NumelPastInt64MaxFailsNamingTheShape) {
  // The probe's cases (issue 32): 2^80 and 2^64 + 4 elements.
  expect_error([] { checked_numel({p(40), p(40)}); }, FLAME_ERROR_INVALID_ARGUMENT,
               {"[1099511627776, 1099511627776]", "elements", "int64"});
  expect_error([] { checked_numel({p(62) + 1, 4}); }, FLAME_ERROR_INVALID_ARGUMENT, {"[4611686018427387905, 4]"});
  expect_error([] { checked_numel({p(32), p(31)}); }, FLAME_ERROR_INVALID_ARGUMENT, {"elements"});  // exactly 2^63
  expect_error([] { checked_numel({kMax, 2}); }, FLAME_ERROR_INVALID_ARGUMENT, {"elements"});
  expect_error([] { checked_numel({2, 2, p(61)}); }, FLAME_ERROR_INVALID_ARGUMENT, {"elements"});
  expect_error([] { checked_numel({p(40), p(40)}, "expand"); }, FLAME_ERROR_INVALID_ARGUMENT, {"expand: shape ["});
}

TEST(ShapeOverflow, ZeroSizesMakeNumelZeroButTheOtherSizesMustFit) {
  EXPECT_EQ(checked_numel({0}), 0);
  EXPECT_EQ(checked_numel({0, kMax}), 0);
  EXPECT_EQ(checked_numel({p(31), 0, p(31)}), 0);
  EXPECT_EQ(checked_numel({kMax, 0, 1}), 0);
  // Strides of an empty tensor are products of its nonzero sizes: those must fit too.
  expect_error([] { checked_numel({0, p(62), p(62)}); }, FLAME_ERROR_INVALID_ARGUMENT, {"elements"});
  expect_error([] { checked_numel({p(40), 0, p(40)}); }, FLAME_ERROR_INVALID_ARGUMENT, {"elements"});
}

TEST(ShapeOverflow, NegativeSizesFail) {
  expect_error([] { checked_numel({2, -3}); }, FLAME_ERROR_INVALID_ARGUMENT, {"negative size -3", "[2, -3]"});
  expect_error([] { checked_numel({0, -1}); }, FLAME_ERROR_INVALID_ARGUMENT, {"negative"});
  expect_error([] { checked_numel({std::numeric_limits<int64_t>::min()}); }, FLAME_ERROR_INVALID_ARGUMENT, {"negative"});
  expect_error([] { checked_bytes(-1, 4); }, FLAME_ERROR_INVALID_ARGUMENT, {"negative"});
}

TEST(ShapeOverflow, BytesAtTheBoundaryOfEachElementSize) {
  EXPECT_EQ(checked_bytes(kMax, 1), static_cast<size_t>(kMax));  // 2^63 - 1 one-byte elements
  EXPECT_EQ(checked_bytes(0, 8), 0u);
  EXPECT_EQ(checked_bytes(kMax / 2, 2), static_cast<size_t>(kMax - 1));
  EXPECT_EQ(checked_bytes(kMax / 4, 4), static_cast<size_t>(kMax - 3));
  EXPECT_EQ(checked_bytes(kMax / 8, 8), static_cast<size_t>(kMax - 7));
  for (int64_t size : {2, 4, 8}) {
    SCOPED_TRACE(size);
    const int64_t first_bad = kMax / size + 1;  // the smallest count whose bytes pass 2^63 - 1
    expect_error([&] { checked_bytes(first_bad, static_cast<size_t>(size)); }, FLAME_ERROR_INVALID_ARGUMENT,
                 {"overflows", std::to_string(first_bad).c_str(), "bytes"});
    expect_error([&] { checked_bytes(kMax, static_cast<size_t>(size)); }, FLAME_ERROR_INVALID_ARGUMENT, {"overflows"});
  }
  // The shape form: the count is checked first, then the bytes, and the message names the shape.
  EXPECT_EQ(checked_shape_bytes({p(30), p(30)}, 4), static_cast<size_t>(p(62)));
  EXPECT_EQ(checked_shape_bytes({0, kMax}, 8), 0u);
  expect_error([] { checked_shape_bytes({p(31), p(31)}, 2); }, FLAME_ERROR_INVALID_ARGUMENT,
               {"overflows", "[2147483648, 2147483648]"});
  expect_error([] { checked_shape_bytes({p(61)}, 8); }, FLAME_ERROR_INVALID_ARGUMENT, {"overflows"});
  expect_error([] { checked_shape_bytes({p(40), p(40)}, 1); }, FLAME_ERROR_INVALID_ARGUMENT, {"elements"});
}

TEST(ShapeOverflow, SizeSumsAndProducts) {
  EXPECT_EQ(checked_size_add(kMax - 1, 1), kMax);
  EXPECT_EQ(checked_size_mul(p(31), p(31) + 1), p(62) + p(31));
  EXPECT_EQ(checked_size_mul(0, kMax), 0);
  expect_error([] { checked_size_add(kMax, 1, "cat"); }, FLAME_ERROR_INVALID_ARGUMENT, {"cat: ", "overflows int64"});
  expect_error([] { checked_size_add(p(62), p(62)); }, FLAME_ERROR_INVALID_ARGUMENT, {"overflows"});
  expect_error([] { checked_size_mul(p(62), 2, "repeat"); }, FLAME_ERROR_INVALID_ARGUMENT, {"repeat: ", "overflows"});
  expect_error([] { checked_size_mul(2, -1); }, FLAME_ERROR_INVALID_ARGUMENT, {"negative"});
}

TEST(ShapeOverflow, SpanOfStridedViews) {
  ElementSpan s = checked_span({4, 3}, {3, 1});
  EXPECT_EQ(s.lo, 0);
  EXPECT_EQ(s.hi, 11);
  s = checked_span({4, 3}, {-3, 1});  // a flip of dim 0
  EXPECT_EQ(s.lo, -9);
  EXPECT_EQ(s.hi, 2);
  s = checked_span({p(40), p(20)}, {0, 0});  // a broadcast reads one element
  EXPECT_EQ(s.lo, 0);
  EXPECT_EQ(s.hi, 0);
  s = checked_span({0, p(62)}, {kMax, kMax});  // empty: nothing is reached
  EXPECT_EQ(s.hi, 0);
  s = checked_span({2}, {kMax});
  EXPECT_EQ(s.hi, kMax);
  expect_error([] { checked_span({3}, {kMax}); }, FLAME_ERROR_INVALID_ARGUMENT, {"strides", "dim 0", "stride 9223372036854775807"});
  expect_error([] { checked_span({2, 2}, {kMax, 1}); }, FLAME_ERROR_INVALID_ARGUMENT, {"strides", "dim 1"});
  expect_error([] { checked_span({2, 2}, {-kMax, -2}); }, FLAME_ERROR_INVALID_ARGUMENT, {"strides"});
}

TEST(ShapeOverflow, ViewGeometry) {
  // Broadcast views larger than any byte count are legal: they read one element.
  check_view_geometry({p(31), p(31)}, {0, 0}, 0, 8);
  check_view_geometry({kMax}, {0}, 5, 8);
  check_view_geometry({p(22), 1024}, {0, 1}, 0, 4);
  // ...but their element count must fit.
  expect_error([] { check_view_geometry({p(40), p(40)}, {0, 0}, 0, 4, "expand"); }, FLAME_ERROR_INVALID_ARGUMENT,
               {"expand: ", "elements"});
  expect_error([] { check_view_geometry({p(62) + 1, 4}, {0, 1}, 0, 4); }, FLAME_ERROR_INVALID_ARGUMENT, {"elements"});
  // The extent in bytes: the last element's end within 2^63 - 1 bytes.
  check_view_geometry({2}, {p(61) - 2}, 0, 4);  // elements [0, 2^61 - 2]: bytes end at 2^63 - 4
  expect_error([] { check_view_geometry({2}, {p(61) - 1}, 0, 4); }, FLAME_ERROR_INVALID_ARGUMENT, {"overflows", "extent"});
  expect_error([] { check_view_geometry({2}, {1}, kMax - 1, 1); }, FLAME_ERROR_INVALID_ARGUMENT, {"2^63"});
  expect_error([] { check_view_geometry({2}, {p(62)}, p(62), 1); }, FLAME_ERROR_INVALID_ARGUMENT, {"2^63"});
  // Offsets and negative strides must stay within the storage.
  check_view_geometry({4}, {-1}, 3, 4);
  expect_error([] { check_view_geometry({4}, {-1}, 2, 4); }, FLAME_ERROR_INVALID_ARGUMENT, {"below"});
  expect_error([] { check_view_geometry({1}, {1}, -1, 4); }, FLAME_ERROR_INVALID_ARGUMENT, {"below"});
  expect_error([] { check_view_geometry({2, -1}, {1, 1}, 0, 4); }, FLAME_ERROR_INVALID_ARGUMENT, {"negative"});
  // Empty views reach nothing, whatever their strides and offset (an empty slice at the end of a
  // flipped dim sits one stride before element 0).
  check_view_geometry({0, 5}, {kMax, kMax}, 0, 8);
  check_view_geometry({0}, {-1}, -1, 4);
  expect_error([] { check_view_geometry({0, p(62), p(62)}, {0, 0, 0}, 0, 4); }, FLAME_ERROR_INVALID_ARGUMENT, {"elements"});
}

TEST(ShapeOverflow, BroadcastRefusesResultsPastInt64) {
  EXPECT_EQ(broadcast_shapes({p(31), 1}, {1, p(31)}), (Shape{p(31), p(31)}));  // 2^62: a legal count
  EXPECT_EQ(broadcast_shapes({0, 1}, {1, kMax}), (Shape{0, kMax}));
  expect_error([] { broadcast_shapes({p(40), 1}, {1, p(40)}); }, FLAME_ERROR_INVALID_ARGUMENT,
               {"[1099511627776, 1]", "[1, 1099511627776]", "elements"});
  expect_error([] { broadcast_shapes({p(62) + 1, 1}, {4}); }, FLAME_ERROR_INVALID_ARGUMENT, {"elements"});
  expect_error([] { broadcast_shapes({2, 3}, {4}); }, FLAME_ERROR_SHAPE_MISMATCH, {"broadcast"});  // unchanged
}

TEST(ShapeOverflow, InferShapeRefusesOverflowingRequests) {
  EXPECT_EQ(infer_shape({-1, p(31)}, p(62)), (Shape{p(31), p(31)}));
  EXPECT_EQ(infer_shape({kMax}, kMax), (Shape{kMax}));
  // The probe: a wrapped-around count (2^64 + 4 elements "are" 4) must not match a request for 4.
  expect_error([] { infer_shape({p(62) + 1, 4}, 4, "reshape"); }, FLAME_ERROR_INVALID_ARGUMENT,
               {"reshape: ", "[4611686018427387905, 4]", "elements"});
  expect_error([] { infer_shape({p(40), p(40)}, 0, "view"); }, FLAME_ERROR_INVALID_ARGUMENT, {"view: ", "elements"});
  expect_error([] { infer_shape({-1, p(40), p(40)}, 6); }, FLAME_ERROR_INVALID_ARGUMENT, {"elements"});
  expect_error([] { infer_shape({p(40), -1}, 6, "reshape"); }, FLAME_ERROR_SHAPE_MISMATCH, {"reshape: cannot reshape 6"});
  expect_error([] { infer_shape({-2, 3}, 6); }, FLAME_ERROR_INVALID_ARGUMENT, {"invalid size -2"});
}

}  // namespace
}  // namespace flame

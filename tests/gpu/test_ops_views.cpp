// Forward tests of flame.h "Views and shape ops" and of the tensor queries: shapes, strides,
// values and, for the ops flame.h documents as views, that the result shares the input's memory
// (data pointer at the expected element offset).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>
#include "host_ref.h"

using namespace href;

namespace {

class Views : public GpuTest {
 protected:
  struct Dev {
    T t;
    HT h;          // host mirror with the same strides and offset as the device tensor
    uintptr_t base = 0;  // data pointer of the contiguous upload that t views
  };
  // A contiguous random tensor.
  Dev make(Rng& rng, const Shape& shape, flame_dtype_t d = FLAME_DTYPE_F32) {
    Dev r;
    r.h = random(rng, shape, d, dom_);
    r.t = upload(ctx, r.h);
    if (r.t.h) r.base = ptr_of(r.t);
    return r;
  }
  // Checks that out is the view hv of a tensor uploaded at base: shape, strides, data pointer, values.
  void expect_view(flame_tensor_t out, const HT& hv, uintptr_t base, const std::string& what) {
    SCOPED_TRACE(what);
    ASSERT_NE(out, nullptr);
    EXPECT_EQ(shape_of(out), hv.shape);
    EXPECT_TRUE(strides_match(out, hv.strides));
    if (hv.numel() > 0) {
      EXPECT_EQ(ptr_of(out), base + static_cast<uintptr_t>(hv.offset * static_cast<int64_t>(dsize(hv.dtype))))
          << "not a view at element offset " << hv.offset;
    }
    EXPECT_TRUE(matches(out, hv));
  }
  // Checks that out is a copy with its own memory holding the values of expected.
  void expect_copy(flame_tensor_t out, const HT& expected, const Dev& src, const std::string& what) {
    SCOPED_TRACE(what);
    ASSERT_NE(out, nullptr);
    EXPECT_EQ(shape_of(out), expected.shape);
    EXPECT_TRUE(is_contiguous(out));
    EXPECT_TRUE(strides_match(out, contiguous_strides(expected.shape)));
    const uintptr_t p = ptr_of(out), lo = src.base, hi = src.base + static_cast<uintptr_t>(src.h.numel()) * dsize(src.h.dtype);
    if (expected.numel() > 0) {
      EXPECT_TRUE(p < lo || p >= hi) << "expected a copy, got memory inside the input";
    }
    EXPECT_TRUE(matches(out, expected));
  }
  Domain dom_ = Domain();
};

// ---------------------------------------------------------------------------------------------
// reshape / view

TEST_F(Views, ReshapeContiguousIsAView) {
  HREF_RNG(rng);
  for (flame_dtype_t d : kAllDtypes) {
    SCOPED_TRACE(dname(d));
    Dev x = make(rng, {2, 3, 4}, d);
    const std::vector<Shape> shapes = {{4, -1}, {24}, {-1}, {2, 12}, {1, 24, 1}, {2, 3, 2, 2}, {-1, 2, 3}};
    for (const Shape& s : shapes) {
      T out;
      FLAME_ASSERT_OK(flame_reshape(x.t, s.data(), static_cast<int32_t>(s.size()), out.out()));
      expect_view(out, x.h.reshape(s), x.base, "reshape to " + to_string(s));
      EXPECT_TRUE(is_contiguous(out));
      T v;
      FLAME_ASSERT_OK(flame_view(x.t, s.data(), static_cast<int32_t>(s.size()), v.out()));
      expect_view(v, x.h.reshape(s), x.base, "view as " + to_string(s));
    }
  }
}

TEST_F(Views, ReshapeOfTransposedCopies) {
  HREF_RNG(rng);
  Dev x = make(rng, {3, 4});
  T xt;
  FLAME_ASSERT_OK(flame_transpose(x.t, 0, 1, xt.out()));
  const HT ht = x.h.transpose(0, 1);
  EXPECT_FALSE(is_contiguous(xt));
  const Shape s = {12};
  T out;
  FLAME_ASSERT_OK(flame_reshape(xt, s.data(), 1, out.out()));
  expect_copy(out, ht.reshape(s), x, "reshape of a transpose to [12]");
  const Shape s2 = {6, -1};
  FLAME_ASSERT_OK(flame_reshape(xt, s2.data(), 2, out.out()));
  expect_copy(out, ht.reshape(s2), x, "reshape of a transpose to [6,2]");
  // view must refuse
  flame_tensor_t bad;
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_view(xt, s.data(), 1, &bad));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_view(xt, s2.data(), 2, &bad));
}

TEST_F(Views, ReshapeOfTransposedStaysAViewWhenStridesAllow) {
  HREF_RNG(rng);
  Dev x = make(rng, {3, 4});
  T xt;
  FLAME_ASSERT_OK(flame_transpose(x.t, 0, 1, xt.out()));  // [4,3] strides [1,4]
  HT ht = x.h.transpose(0, 1);
  // Splitting dim 0 (size 4, stride 1) into [2,2] needs no copy: strides [2,1,4].
  const Shape s = {2, 2, 3};
  HT hv = ht;
  hv.shape = s;
  hv.strides = {2, 1, 4};
  T out;
  FLAME_ASSERT_OK(flame_reshape(xt, s.data(), 3, out.out()));
  expect_view(out, hv, x.base, "reshape [4,3]^T -> [2,2,3]");
  T v;
  FLAME_ASSERT_OK(flame_view(xt, s.data(), 3, v.out()));
  expect_view(v, hv, x.base, "view [4,3]^T -> [2,2,3]");
  // Adding size-1 dims never needs a copy.
  const Shape s1 = {4, 1, 3};
  HT h1 = ht;
  h1.shape = s1;
  h1.strides = {1, 1, 4};
  FLAME_ASSERT_OK(flame_view(xt, s1.data(), 3, v.out()));
  expect_view(v, h1, x.base, "view [4,3]^T -> [4,1,3]");
}

TEST_F(Views, ReshapeZeroDimAndEmpty) {
  HREF_RNG(rng);
  Dev x = make(rng, {1});
  T s0, s2;
  FLAME_ASSERT_OK(flame_reshape(x.t, nullptr, 0, s0.out()));
  EXPECT_EQ(shape_of(s0), Shape{});
  EXPECT_EQ(numel_of(s0), 1);
  EXPECT_DOUBLE_EQ(item(s0), x.h.values()[0]);
  const Shape s11 = {1, 1};
  FLAME_ASSERT_OK(flame_reshape(s0, s11.data(), 2, s2.out()));
  EXPECT_EQ(shape_of(s2), s11);
  EXPECT_EQ(ptr_of(s2), x.base);
  Dev e = make(rng, {0, 3});
  const Shape s30 = {3, 0, 2};
  T r;
  FLAME_ASSERT_OK(flame_reshape(e.t, s30.data(), 3, r.out()));
  EXPECT_EQ(shape_of(r), s30);
  EXPECT_EQ(numel_of(r), 0);
}

TEST_F(Views, ReshapeErrors) {
  HREF_RNG(rng);
  Dev x = make(rng, {2, 3, 4});
  flame_tensor_t bad;
  const Shape s55 = {5, 5}, s2neg = {-1, -1, 2}, sneg = {-3, 8}, s7 = {7, -1};
  HREF_EXPECT_ANY_FAIL(bad, flame_reshape(x.t, s55.data(), 2, &bad));
  HREF_EXPECT_ANY_FAIL(bad, flame_reshape(x.t, s2neg.data(), 3, &bad));
  HREF_EXPECT_ANY_FAIL(bad, flame_reshape(x.t, sneg.data(), 2, &bad));
  HREF_EXPECT_ANY_FAIL(bad, flame_reshape(x.t, s7.data(), 2, &bad));  // 24 is not a multiple of 7
  HREF_EXPECT_ANY_FAIL(bad, flame_view(x.t, s55.data(), 2, &bad));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_reshape(nullptr, s55.data(), 2, &bad));
  FLAME_EXPECT_STATUS(flame_reshape(x.t, s55.data(), 2, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  const Shape nine = {1, 1, 1, 1, 1, 2, 3, 4, 1};
  HREF_EXPECT_ANY_FAIL(bad, flame_reshape(x.t, nine.data(), 9, &bad));  // more than FLAME_MAX_DIMS
}

// ---------------------------------------------------------------------------------------------
// permute / transpose / expand / squeeze / unsqueeze

TEST_F(Views, Permute) {
  HREF_RNG(rng);
  Dev x = make(rng, {2, 3, 4}, FLAME_DTYPE_F16);
  const std::vector<std::vector<int32_t>> perms = {{2, 0, 1}, {-1, 0, 1}, {0, 1, 2}, {1, 2, 0}, {2, 1, 0}, {0, -1, -2}};
  for (const auto& p : perms) {
    T out;
    FLAME_ASSERT_OK(flame_permute(x.t, p.data(), 3, out.out()));
    expect_view(out, x.h.permute(std::vector<int>(p.begin(), p.end())), x.base,
                "permute " + to_string(Shape(p.begin(), p.end())));
  }
  T out;
  FLAME_ASSERT_OK(flame_permute(x.t, perms[0].data(), 3, out.out()));
  EXPECT_EQ(strides_of(out), (Shape{1, 12, 4}));
  EXPECT_FALSE(is_contiguous(out));
  flame_tensor_t bad;
  const int32_t rep[] = {0, 0, 1}, shortp[] = {0, 1}, oob[] = {0, 1, 3};
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_permute(x.t, rep, 3, &bad));
  HREF_EXPECT_ANY_FAIL(bad, flame_permute(x.t, shortp, 2, &bad));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_permute(x.t, oob, 3, &bad));
}

TEST_F(Views, Transpose) {
  HREF_RNG(rng);
  Dev x = make(rng, {2, 3, 4}, FLAME_DTYPE_I64);
  const std::pair<int, int> pairs[] = {{0, 1}, {0, -1}, {1, 2}, {-1, -2}, {1, 1}};
  for (auto pr : pairs) {
    T out;
    FLAME_ASSERT_OK(flame_transpose(x.t, pr.first, pr.second, out.out()));
    expect_view(out, x.h.transpose(pr.first, pr.second), x.base,
                "transpose " + std::to_string(pr.first) + "," + std::to_string(pr.second));
  }
  T out;
  FLAME_ASSERT_OK(flame_transpose(x.t, 0, -1, out.out()));
  EXPECT_EQ(strides_of(out), (Shape{1, 4, 12}));
  // transposing twice gives the original layout back
  T back;
  FLAME_ASSERT_OK(flame_transpose(out, 0, 2, back.out()));
  EXPECT_TRUE(is_contiguous(back));
  expect_view(back, x.h, x.base, "transpose twice");
  flame_tensor_t bad;
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_transpose(x.t, 0, 3, &bad));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_transpose(x.t, -4, 0, &bad));
}

TEST_F(Views, Expand) {
  HREF_RNG(rng);
  Dev x = make(rng, {3, 1});
  T out;
  const Shape s234 = {2, 3, 4};
  FLAME_ASSERT_OK(flame_expand(x.t, s234.data(), 3, out.out()));
  expect_view(out, x.h.expand(s234), x.base, "expand [3,1] -> [2,3,4]");
  Shape st = strides_of(out);
  EXPECT_EQ(st[0], 0);
  EXPECT_EQ(st[2], 0);
  EXPECT_FALSE(is_contiguous(out));
  const Shape keep = {-1, 5};
  FLAME_ASSERT_OK(flame_expand(x.t, keep.data(), 2, out.out()));
  expect_view(out, x.h.expand(keep), x.base, "expand [3,1] -> [-1,5]");
  EXPECT_EQ(shape_of(out), (Shape{3, 5}));
  const Shape same = {3, 1};
  FLAME_ASSERT_OK(flame_expand(x.t, same.data(), 2, out.out()));
  expect_view(out, x.h, x.base, "expand to the same shape");
  // 0-d
  Dev s = make(rng, {});
  const Shape s22 = {2, 2};
  FLAME_ASSERT_OK(flame_expand(s.t, s22.data(), 2, out.out()));
  expect_view(out, s.h.expand(s22), s.base, "expand 0-d -> [2,2]");
  // an expanded tensor made contiguous holds the repeated values
  FLAME_ASSERT_OK(flame_expand(x.t, s234.data(), 3, out.out()));
  T c;
  FLAME_ASSERT_OK(flame_contiguous(out, c.out()));
  expect_copy(c, x.h.expand(s234).contiguous(), x, "contiguous of an expand");
  flame_tensor_t bad;
  Dev y = make(rng, {3, 2});
  const Shape s34 = {3, 4}, s2 = {2};
  HREF_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, bad, flame_expand(y.t, s34.data(), 2, &bad));
  HREF_EXPECT_ANY_FAIL(bad, flame_expand(y.t, s2.data(), 1, &bad));  // fewer dims than the input
}

TEST_F(Views, SqueezeUnsqueeze) {
  HREF_RNG(rng);
  Dev x = make(rng, {3, 1, 4, 1}, FLAME_DTYPE_BF16);
  auto squeezed = [&](std::vector<int> drop) {
    HT h = x.h;
    std::sort(drop.rbegin(), drop.rend());
    for (int d : drop) { h.shape.erase(h.shape.begin() + d); h.strides.erase(h.strides.begin() + d); }
    return h;
  };
  T out;
  FLAME_ASSERT_OK(flame_squeeze(x.t, 1, out.out()));
  expect_view(out, squeezed({1}), x.base, "squeeze(1)");
  FLAME_ASSERT_OK(flame_squeeze(x.t, -1, out.out()));
  expect_view(out, squeezed({3}), x.base, "squeeze(-1)");
  FLAME_ASSERT_OK(flame_squeeze_all(x.t, out.out()));
  expect_view(out, squeezed({1, 3}), x.base, "squeeze_all");
  EXPECT_EQ(shape_of(out), (Shape{3, 4}));
  flame_tensor_t bad;
  HREF_EXPECT_ANY_FAIL(bad, flame_squeeze(x.t, 0, &bad));  // size 3
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_squeeze(x.t, 4, &bad));
  for (int d : {0, 2, 4, -1, -5}) {
    FLAME_ASSERT_OK(flame_unsqueeze(x.t, d, out.out()));
    expect_view(out, x.h.unsqueeze(d), x.base, "unsqueeze(" + std::to_string(d) + ")");
  }
  FLAME_ASSERT_OK(flame_unsqueeze(x.t, -1, out.out()));
  EXPECT_EQ(shape_of(out), (Shape{3, 1, 4, 1, 1}));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_unsqueeze(x.t, 6, &bad));
  // all-ones shape squeezes to 0-d; unsqueeze of 0-d gives [1]
  Dev o = make(rng, {1, 1});
  FLAME_ASSERT_OK(flame_squeeze_all(o.t, out.out()));
  EXPECT_EQ(shape_of(out), Shape{});
  EXPECT_DOUBLE_EQ(item(out), o.h.values()[0]);
  Dev s = make(rng, {});
  FLAME_ASSERT_OK(flame_unsqueeze(s.t, 0, out.out()));
  EXPECT_EQ(shape_of(out), Shape{1});
  EXPECT_EQ(ptr_of(out), s.base);
}

// ---------------------------------------------------------------------------------------------
// narrow / slice / select / flip / diagonal

TEST_F(Views, Narrow) {
  HREF_RNG(rng);
  Dev x = make(rng, {5, 6}, FLAME_DTYPE_I32);
  struct C { int dim; int64_t start, len; };
  const C cases[] = {{1, 2, 3}, {0, 1, 4}, {-1, 0, 6}, {0, 4, 1}, {1, 5, 1}, {1, 3, 0}};
  for (const C& c : cases) {
    T out;
    FLAME_ASSERT_OK(flame_narrow(x.t, c.dim, c.start, c.len, out.out()));
    expect_view(out, x.h.narrow(c.dim, c.start, c.len), x.base,
                "narrow(" + std::to_string(c.dim) + "," + std::to_string(c.start) + "," + std::to_string(c.len) + ")");
  }
  flame_tensor_t bad;
  HREF_EXPECT_ANY_FAIL(bad, flame_narrow(x.t, 1, 4, 3, &bad));
  HREF_EXPECT_ANY_FAIL(bad, flame_narrow(x.t, 0, -1, 2, &bad));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_narrow(x.t, 2, 0, 1, &bad));
}

TEST_F(Views, Slice) {
  HREF_RNG(rng);
  Dev x = make(rng, {10}, FLAME_DTYPE_F64);
  struct C { int64_t start, end, step; int64_t n; };
  const C cases[] = {
      {1, 8, 3, 3},      // 1, 4, 7
      {-4, 100, 1, 4},   // 6..9 (end clamped)
      {-100, 3, 2, 2},   // 0, 2 (start clamped)
      {7, 3, 1, 0},      // empty
      {0, 10, 20, 1},    // 0
      {0, 10, 1, 10},    // everything
      {2, -2, 2, 3},     // 2, 4, 6
      {10, 20, 1, 0},    // start at the end
  };
  for (const C& c : cases) {
    T out;
    FLAME_ASSERT_OK(flame_slice(x.t, 0, c.start, c.end, c.step, out.out()));
    HT hv = x.h.slice(0, c.start, c.end, c.step);
    EXPECT_EQ(hv.numel(), c.n);
    expect_view(out, hv, x.base,
                "slice " + std::to_string(c.start) + ":" + std::to_string(c.end) + ":" + std::to_string(c.step));
  }
  Dev y = make(rng, {6, 8});
  T out;
  FLAME_ASSERT_OK(flame_slice(y.t, 1, 1, 8, 2, out.out()));
  expect_view(out, y.h.slice(1, 1, 8, 2), y.base, "slice dim 1 1:8:2");
  EXPECT_EQ(strides_of(out), (Shape{8, 2}));
  FLAME_ASSERT_OK(flame_slice(y.t, -2, 5, 6, 1, out.out()));
  expect_view(out, y.h.slice(0, 5, 6, 1), y.base, "slice dim -2 5:6");
  flame_tensor_t bad;
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_slice(x.t, 0, 0, 5, 0, &bad));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_slice(x.t, 0, 0, 5, -1, &bad));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_slice(x.t, 1, 0, 5, 1, &bad));
}

TEST_F(Views, Select) {
  HREF_RNG(rng);
  Dev x = make(rng, {3, 4, 5}, FLAME_DTYPE_U8);
  struct C { int dim; int64_t index; };
  const C cases[] = {{1, 2}, {-1, 4}, {0, 0}, {0, 2}, {2, 0}};
  for (const C& c : cases) {
    T out;
    FLAME_ASSERT_OK(flame_select(x.t, c.dim, c.index, out.out()));
    expect_view(out, x.h.select(c.dim, c.index), x.base, "select(" + std::to_string(c.dim) + "," + std::to_string(c.index) + ")");
  }
  T out;
  FLAME_ASSERT_OK(flame_select(x.t, 1, 2, out.out()));
  EXPECT_EQ(strides_of(out), (Shape{20, 1}));
  Dev v = make(rng, {7});
  FLAME_ASSERT_OK(flame_select(v.t, 0, 3, out.out()));
  EXPECT_EQ(shape_of(out), Shape{});
  EXPECT_DOUBLE_EQ(item(out), v.h.values()[3]);
  EXPECT_EQ(ptr_of(out), v.base + 3 * sizeof(float));
  flame_tensor_t bad;
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_select(x.t, 0, 3, &bad));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_select(x.t, 3, 0, &bad));
}

TEST_F(Views, Flip) {
  HREF_RNG(rng);
  Dev x = make(rng, {3, 4});
  const std::vector<std::vector<int32_t>> cases = {{0}, {1}, {0, 1}, {-1}, {}};
  for (const auto& dims : cases) {
    T out;
    const int32_t none = 0;
    FLAME_ASSERT_OK(flame_flip(x.t, dims.empty() ? &none : dims.data(), static_cast<int32_t>(dims.size()), out.out()));
    expect_view(out, x.h.flip(std::vector<int>(dims.begin(), dims.end())), x.base,
                "flip " + to_string(Shape(dims.begin(), dims.end())));
  }
  T f;
  const int32_t both[] = {0, 1};
  FLAME_ASSERT_OK(flame_flip(x.t, both, 2, f.out()));
  EXPECT_EQ(strides_of(f), (Shape{-4, -1}));
  EXPECT_EQ(ptr_of(f), x.base + 11 * sizeof(float));
  EXPECT_FALSE(is_contiguous(f));
  T ff;
  FLAME_ASSERT_OK(flame_flip(f, both, 2, ff.out()));  // flipping back gives the original
  expect_view(ff, x.h, x.base, "flip twice");
  EXPECT_TRUE(is_contiguous(ff));
  // flip of a transposed view, then contiguous
  T xt, ft, c;
  FLAME_ASSERT_OK(flame_transpose(x.t, 0, 1, xt.out()));
  const int32_t d0[] = {0};
  FLAME_ASSERT_OK(flame_flip(xt, d0, 1, ft.out()));
  HT hft = x.h.transpose(0, 1).flip({0});
  expect_view(ft, hft, x.base, "flip of a transpose");
  FLAME_ASSERT_OK(flame_contiguous(ft, c.out()));
  expect_copy(c, hft.contiguous(), x, "contiguous of a flipped transpose");
  flame_tensor_t bad;
  const int32_t oob[] = {2}, rep[] = {0, 0};
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_flip(x.t, oob, 1, &bad));
  HREF_EXPECT_ANY_FAIL(bad, flame_flip(x.t, rep, 2, &bad));
}

TEST_F(Views, Diagonal) {
  HREF_RNG(rng);
  Dev x = make(rng, {3, 4});
  for (int64_t off : {0, 1, -1, 3, -2, 4, -3, 10}) {
    T out;
    FLAME_ASSERT_OK(flame_diagonal(x.t, off, 0, 1, out.out()));
    expect_view(out, x.h.diagonal(off, 0, 1), x.base, "diagonal offset " + std::to_string(off));
  }
  T out;
  FLAME_ASSERT_OK(flame_diagonal(x.t, -1, 0, 1, out.out()));
  EXPECT_EQ(shape_of(out), Shape{2});
  EXPECT_EQ(strides_of(out), Shape{5});
  EXPECT_EQ(ptr_of(out), x.base + 4 * sizeof(float));
  Dev y = make(rng, {2, 3, 4}, FLAME_DTYPE_F64);
  struct C { int64_t off; int d1, d2; };
  const C cases[] = {{0, 1, 2}, {1, 0, 2}, {0, -1, -2}, {1, -1, -2}, {-1, 1, 2}, {0, 2, 0}};
  for (const C& c : cases) {
    FLAME_ASSERT_OK(flame_diagonal(y.t, c.off, c.d1, c.d2, out.out()));
    expect_view(out, y.h.diagonal(c.off, c.d1, c.d2), y.base,
                "diagonal(" + std::to_string(c.off) + "," + std::to_string(c.d1) + "," + std::to_string(c.d2) + ")");
  }
  flame_tensor_t bad;
  HREF_EXPECT_ANY_FAIL(bad, flame_diagonal(y.t, 0, 1, 1, &bad));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_diagonal(y.t, 0, 0, 3, &bad));
}

// ---------------------------------------------------------------------------------------------
// contiguous / clone / to_dtype

TEST_F(Views, ContiguousAndClone) {
  HREF_RNG(rng);
  for (flame_dtype_t d : kAllDtypes) {
    SCOPED_TRACE(dname(d));
    Dev x = make(rng, {5, 7}, d);
    T c;
    FLAME_ASSERT_OK(flame_contiguous(x.t, c.out()));
    EXPECT_EQ(c.h, x.t.h) << "contiguous of a contiguous tensor is the tensor itself";
    EXPECT_EQ(ptr_of(c), x.base);
    T k;
    FLAME_ASSERT_OK(flame_clone(x.t, k.out()));
    expect_copy(k, x.h, x, "clone");
    EXPECT_EQ(dtype_of(k), d);
    T xt, ct, kt;
    FLAME_ASSERT_OK(flame_transpose(x.t, 0, 1, xt.out()));
    FLAME_ASSERT_OK(flame_contiguous(xt, ct.out()));
    expect_copy(ct, x.h.transpose(0, 1).contiguous(), x, "contiguous of a transpose");
    FLAME_ASSERT_OK(flame_clone(xt, kt.out()));
    expect_copy(kt, x.h.transpose(0, 1).contiguous(), x, "clone of a transpose");
    // a clone stays unchanged when the original goes
    x.t = T();
    EXPECT_TRUE(matches(k, x.h));
  }
  // empty and 0-d
  Dev e = make(rng, {0, 4});
  T c;
  FLAME_ASSERT_OK(flame_clone(e.t, c.out()));
  EXPECT_EQ(shape_of(c), (Shape{0, 4}));
  Dev s = make(rng, {});
  FLAME_ASSERT_OK(flame_clone(s.t, c.out()));
  EXPECT_EQ(shape_of(c), Shape{});
  EXPECT_DOUBLE_EQ(item(c), s.h.values()[0]);
}

TEST_F(Views, ToDtypeEveryPair) {
  HREF_RNG(rng);
  for (flame_dtype_t from : kAllDtypes) {
    for (flame_dtype_t to : kAllDtypes) {
      SCOPED_TRACE(std::string(dname(from)) + " -> " + dname(to));
      // u8 cannot hold negatives (and converting a negative float to u8 is undefined in C).
      Domain dm;
      dm.lo = to == FLAME_DTYPE_U8 ? 0.0 : -100.0;
      dm.hi = 100.0;
      dm.ilo = to == FLAME_DTYPE_U8 ? 0 : -100;
      dm.ihi = 100;
      HT h = random(rng, {4, 33}, from, dm);
      // some exact zeros and values in (0, 1): bool(0.5) is true, int(0.5) is 0
      (*h.data)[0] = 0.0;
      (*h.data)[1] = round_to(0.5, from);
      (*h.data)[2] = round_to(99.75, from);
      T x = upload(ctx, h);
      T out;
      FLAME_ASSERT_OK(flame_to_dtype(x, to, out.out()));
      EXPECT_EQ(dtype_of(out), to);
      EXPECT_TRUE(matches(out, h.as(to)));
      if (from == to) {
        EXPECT_EQ(ptr_of(out), ptr_of(x)) << "same dtype gives the tensor itself";
      }
      // non-contiguous source
      T xt, outt;
      FLAME_ASSERT_OK(flame_transpose(x, 0, 1, xt.out()));
      FLAME_ASSERT_OK(flame_to_dtype(xt, to, outt.out()));
      EXPECT_TRUE(matches(outt, h.transpose(0, 1).as(to)));
    }
  }
  Dev x = make(rng, {3});
  flame_tensor_t bad;
  HREF_EXPECT_ANY_FAIL(bad, flame_to_dtype(x.t, static_cast<flame_dtype_t>(42), &bad));
}

// ---------------------------------------------------------------------------------------------
// cat / stack

HT host_cat(const std::vector<HT>& xs, int dim, flame_dtype_t out_dtype) {
  const size_t nd = xs[0].shape.size();
  const int d = norm_dim(dim, nd);
  Shape s = xs[0].shape;
  s[static_cast<size_t>(d)] = 0;
  for (const HT& x : xs) s[static_cast<size_t>(d)] += x.shape[static_cast<size_t>(d)];
  HT r(s, out_dtype);
  size_t k = 0;
  for_each_index(s, [&](const Shape& i) {
    Shape j = i;
    size_t which = 0;
    while (j[static_cast<size_t>(d)] >= xs[which].shape[static_cast<size_t>(d)]) {
      j[static_cast<size_t>(d)] -= xs[which].shape[static_cast<size_t>(d)];
      ++which;
    }
    (*r.data)[k++] = round_to(xs[which].at(j), out_dtype);
  });
  return r;
}

TEST_F(Views, CatPromotesAndJoins) {
  HREF_RNG(rng);
  {
    Dev a = make(rng, {2, 3}, FLAME_DTYPE_F32), b = make(rng, {4, 3}, FLAME_DTYPE_F16);
    flame_tensor_t in[] = {a.t, b.t};
    T out;
    FLAME_ASSERT_OK(flame_cat(in, 2, 0, out.out()));
    EXPECT_EQ(dtype_of(out), FLAME_DTYPE_F32);
    EXPECT_TRUE(matches(out, host_cat({a.h, b.h}, 0, FLAME_DTYPE_F32)));
  }
  {
    Dev a = make(rng, {2, 3}, FLAME_DTYPE_I32), b = make(rng, {5, 2}, FLAME_DTYPE_I64);
    T bt;
    FLAME_ASSERT_OK(flame_transpose(b.t, 0, 1, bt.out()));  // [2,5], non-contiguous
    flame_tensor_t in[] = {a.t, bt};
    T out;
    FLAME_ASSERT_OK(flame_cat(in, 2, -1, out.out()));
    EXPECT_EQ(dtype_of(out), FLAME_DTYPE_I64);
    EXPECT_TRUE(matches(out, host_cat({a.h, b.h.transpose(0, 1)}, 1, FLAME_DTYPE_I64)));
  }
  {
    Dev a = make(rng, {2, 1, 4}, FLAME_DTYPE_BF16), b = make(rng, {2, 3, 4}, FLAME_DTYPE_BF16),
        c = make(rng, {2, 0, 4}, FLAME_DTYPE_BF16), e = make(rng, {2, 2, 4}, FLAME_DTYPE_F16);
    flame_tensor_t in[] = {a.t, b.t, c.t, e.t};
    T out;
    FLAME_ASSERT_OK(flame_cat(in, 4, 1, out.out()));
    EXPECT_EQ(dtype_of(out), FLAME_DTYPE_F32);  // bf16 with f16
    EXPECT_TRUE(matches(out, host_cat({a.h, b.h, c.h, e.h}, 1, FLAME_DTYPE_F32)));
    flame_tensor_t in3[] = {a.t, b.t, c.t};
    FLAME_ASSERT_OK(flame_cat(in3, 3, 1, out.out()));
    EXPECT_EQ(dtype_of(out), FLAME_DTYPE_BF16);
    EXPECT_TRUE(matches(out, host_cat({a.h, b.h, c.h}, 1, FLAME_DTYPE_BF16)));
  }
  {
    Dev a = make(rng, {3, 2}, FLAME_DTYPE_U8), b = make(rng, {3, 2}, FLAME_DTYPE_BOOL);
    flame_tensor_t in[] = {a.t, b.t, a.t};
    T out;
    FLAME_ASSERT_OK(flame_cat(in, 3, 0, out.out()));
    EXPECT_EQ(dtype_of(out), FLAME_DTYPE_U8);
    EXPECT_TRUE(matches(out, host_cat({a.h, b.h, a.h}, 0, FLAME_DTYPE_U8)));
    FLAME_ASSERT_OK(flame_cat(in, 3, 1, out.out()));
    EXPECT_TRUE(matches(out, host_cat({a.h, b.h, a.h}, 1, FLAME_DTYPE_U8)));
  }
  {
    Dev a = make(rng, {4097}, FLAME_DTYPE_F64);
    flame_tensor_t in[] = {a.t};
    T out;
    FLAME_ASSERT_OK(flame_cat(in, 1, 0, out.out()));
    EXPECT_TRUE(matches(out, a.h));
  }
}

TEST_F(Views, CatErrors) {
  HREF_RNG(rng);
  Dev a = make(rng, {2, 3}), b = make(rng, {3, 3}), c = make(rng, {2, 3, 1});
  flame_tensor_t bad;
  flame_tensor_t ab[] = {a.t, b.t}, ac[] = {a.t, c.t}, an[] = {a.t, nullptr};
  HREF_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, bad, flame_cat(ab, 2, 1, &bad));
  HREF_EXPECT_ANY_FAIL(bad, flame_cat(ac, 2, 0, &bad));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_cat(ab, 0, 0, &bad));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_cat(ab, 2, 2, &bad));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_cat(an, 2, 0, &bad));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_cat(nullptr, 2, 0, &bad));
}

TEST_F(Views, Stack) {
  HREF_RNG(rng);
  Dev a = make(rng, {2, 3}), b = make(rng, {2, 3}), c = make(rng, {3, 2});
  T ct;
  FLAME_ASSERT_OK(flame_transpose(c.t, 0, 1, ct.out()));
  const HT hct = c.h.transpose(0, 1);
  flame_tensor_t in[] = {a.t, b.t, ct};
  for (int dim : {0, 1, 2, -1, -3}) {
    SCOPED_TRACE("dim " + std::to_string(dim));
    T out;
    FLAME_ASSERT_OK(flame_stack(in, 3, dim, out.out()));
    const int d = dim < 0 ? dim + 3 : dim;
    HT expected = host_cat({a.h.unsqueeze(d), b.h.unsqueeze(d), hct.unsqueeze(d)}, d, FLAME_DTYPE_F32);
    EXPECT_TRUE(matches(out, expected));
  }
  T out;
  FLAME_ASSERT_OK(flame_stack(in, 1, 0, out.out()));
  EXPECT_TRUE(matches(out, a.h.unsqueeze(0)));
  // mixed dtypes promote as cat does
  Dev i = make(rng, {2, 3}, FLAME_DTYPE_I32);
  flame_tensor_t mixed[] = {a.t, i.t};
  FLAME_ASSERT_OK(flame_stack(mixed, 2, 0, out.out()));
  EXPECT_EQ(dtype_of(out), FLAME_DTYPE_F32);
  EXPECT_TRUE(matches(out, host_cat({a.h.unsqueeze(0), i.h.unsqueeze(0)}, 0, FLAME_DTYPE_F32)));
  flame_tensor_t bad;
  flame_tensor_t ac[] = {a.t, c.t};
  HREF_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, bad, flame_stack(ac, 2, 0, &bad));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_stack(in, 3, 3, &bad));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_stack(in, 0, 0, &bad));
}

// ---------------------------------------------------------------------------------------------
// split / split_sizes / chunk

struct Pieces {
  std::vector<flame_tensor_t> h;
  explicit Pieces(size_t n) : h(n, nullptr) {}
  ~Pieces() { for (flame_tensor_t t : h) flame_tensor_release(t); }
  void reset() { for (flame_tensor_t& t : h) { flame_tensor_release(t); t = nullptr; } }
};

TEST_F(Views, Split) {
  HREF_RNG(rng);
  Dev x = make(rng, {10, 3});
  {
    Pieces p(8);
    int32_t count = -1;
    FLAME_ASSERT_OK(flame_split(x.t, 4, 0, p.h.data(), 8, &count));
    ASSERT_EQ(count, 3);
    const int64_t starts[] = {0, 4, 8}, lens[] = {4, 4, 2};
    for (int i = 0; i < 3; ++i) expect_view(p.h[i], x.h.narrow(0, starts[i], lens[i]), x.base, "piece " + std::to_string(i));
    for (int i = 3; i < 8; ++i) EXPECT_EQ(p.h[i], nullptr) << "slot " << i << " past count was written";
  }
  {
    Pieces p(2);
    int32_t count = 0;
    FLAME_EXPECT_STATUS(flame_split(x.t, 4, 0, p.h.data(), 2, &count), FLAME_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(p.h[0], nullptr);
    EXPECT_EQ(p.h[1], nullptr);
  }
  {
    Pieces p(3);
    int32_t count = -1;
    FLAME_ASSERT_OK(flame_split(x.t, 2, -1, p.h.data(), 3, &count));
    ASSERT_EQ(count, 2);
    expect_view(p.h[0], x.h.narrow(1, 0, 2), x.base, "columns 0..1");
    expect_view(p.h[1], x.h.narrow(1, 2, 1), x.base, "column 2");
    p.reset();
    FLAME_ASSERT_OK(flame_split(x.t, 10, 0, p.h.data(), 3, &count));  // one piece: everything
    ASSERT_EQ(count, 1);
    expect_view(p.h[0], x.h, x.base, "one piece");
    p.reset();
    FLAME_ASSERT_OK(flame_split(x.t, 100, 0, p.h.data(), 3, &count));
    ASSERT_EQ(count, 1);
    expect_view(p.h[0], x.h, x.base, "split size beyond the dim");
  }
  {
    Pieces p(4);
    int32_t count = -1;
    FLAME_EXPECT_STATUS(flame_split(x.t, 0, 0, p.h.data(), 4, &count), FLAME_ERROR_INVALID_ARGUMENT);
    FLAME_EXPECT_STATUS(flame_split(x.t, 2, 2, p.h.data(), 4, &count), FLAME_ERROR_INVALID_ARGUMENT);
    FLAME_EXPECT_STATUS(flame_split(x.t, 2, 0, p.h.data(), 4, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
    for (flame_tensor_t t : p.h) EXPECT_EQ(t, nullptr);
  }
  // pieces keep the memory alive after the input goes
  Pieces p(3);
  int32_t count = -1;
  FLAME_ASSERT_OK(flame_split(x.t, 4, 0, p.h.data(), 3, &count));
  x.t = T();
  EXPECT_TRUE(matches(p.h[2], x.h.narrow(0, 8, 2)));
}

TEST_F(Views, SplitSizes) {
  HREF_RNG(rng);
  Dev x = make(rng, {10, 4}, FLAME_DTYPE_I32);
  Pieces p(3);
  const int64_t sizes[] = {2, 5, 3};
  FLAME_ASSERT_OK(flame_split_sizes(x.t, sizes, 3, 0, p.h.data()));
  int64_t start = 0;
  for (int i = 0; i < 3; ++i) {
    expect_view(p.h[i], x.h.narrow(0, start, sizes[i]), x.base, "piece " + std::to_string(i));
    start += sizes[i];
  }
  p.reset();
  const int64_t cols[] = {0, 4};
  Pieces q(2);
  FLAME_ASSERT_OK(flame_split_sizes(x.t, cols, 2, -1, q.h.data()));
  EXPECT_EQ(shape_of(q.h[0]), (Shape{10, 0}));
  expect_view(q.h[1], x.h, x.base, "the whole dim");
  q.reset();
  const int64_t short_sizes[] = {2, 5}, neg[] = {12, -2};
  // flame.h names no status for sizes that do not sum to the dim: any failure, and nothing written
  EXPECT_NE(flame_split_sizes(x.t, short_sizes, 2, 0, q.h.data()), FLAME_OK);
  EXPECT_NE(flame_split_sizes(x.t, neg, 2, 0, q.h.data()), FLAME_OK);
  FLAME_EXPECT_STATUS(flame_split_sizes(x.t, sizes, 3, 0, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(q.h[0], nullptr);
  EXPECT_EQ(q.h[1], nullptr);
}

TEST_F(Views, Chunk) {
  HREF_RNG(rng);
  struct C { int64_t n; int32_t chunks; std::vector<int64_t> lens; };
  const C cases[] = {
      {10, 4, {3, 3, 3, 1}}, {6, 4, {2, 2, 2}}, {2, 5, {1, 1}}, {12, 3, {4, 4, 4}}, {7, 1, {7}}, {5, 5, {1, 1, 1, 1, 1}},
  };
  for (const C& c : cases) {
    SCOPED_TRACE("chunk " + std::to_string(c.n) + " into " + std::to_string(c.chunks));
    Dev x = make(rng, {2, c.n});
    Pieces p(8);
    int32_t count = -1;
    FLAME_ASSERT_OK(flame_chunk(x.t, c.chunks, 1, p.h.data(), 8, &count));
    ASSERT_EQ(count, static_cast<int32_t>(c.lens.size()));
    int64_t start = 0;
    for (size_t i = 0; i < c.lens.size(); ++i) {
      expect_view(p.h[i], x.h.narrow(1, start, c.lens[i]), x.base, "piece " + std::to_string(i));
      start += c.lens[i];
    }
    Pieces small(1);
    if (c.lens.size() > 1) {
      FLAME_EXPECT_STATUS(flame_chunk(x.t, c.chunks, 1, small.h.data(), 1, &count), FLAME_ERROR_INVALID_ARGUMENT);
      EXPECT_EQ(small.h[0], nullptr);
    }
  }
  Dev x = make(rng, {4});
  Pieces p(4);
  int32_t count = 0;
  FLAME_EXPECT_STATUS(flame_chunk(x.t, 0, 0, p.h.data(), 4, &count), FLAME_ERROR_INVALID_ARGUMENT);
}

// ---------------------------------------------------------------------------------------------
// triu / tril

TEST_F(Views, TriuTril) {
  HREF_RNG(rng);
  auto tri = [](const HT& x, int64_t k, bool upper) {
    HT r(x.shape, x.dtype);
    size_t n = 0;
    const size_t nd = x.shape.size();
    for_each_index(x.shape, [&](const Shape& i) {
      const int64_t diff = i[nd - 1] - i[nd - 2];
      const bool keep = upper ? diff >= k : diff <= k;
      (*r.data)[n++] = keep ? x.at(i) : 0.0;
    });
    return r;
  };
  for (flame_dtype_t d : {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_I32, FLAME_DTYPE_F64}) {
    SCOPED_TRACE(dname(d));
    Dev x = make(rng, {4, 5}, d);
    for (int64_t k : {0, 1, -1, 3, -10, 10}) {
      SCOPED_TRACE("diagonal " + std::to_string(k));
      T u, l;
      FLAME_ASSERT_OK(flame_triu(x.t, k, u.out()));
      FLAME_ASSERT_OK(flame_tril(x.t, k, l.out()));
      EXPECT_TRUE(matches(u, tri(x.h, k, true)));
      EXPECT_TRUE(matches(l, tri(x.h, k, false)));
    }
    // batched and non-contiguous
    Dev y = make(rng, {2, 6, 3}, d);
    T yt, u, l;
    FLAME_ASSERT_OK(flame_transpose(y.t, 1, 2, yt.out()));  // [2,3,6]
    FLAME_ASSERT_OK(flame_triu(yt, 1, u.out()));
    FLAME_ASSERT_OK(flame_tril(yt, -1, l.out()));
    EXPECT_TRUE(matches(u, tri(y.h.transpose(1, 2), 1, true)));
    EXPECT_TRUE(matches(l, tri(y.h.transpose(1, 2), -1, false)));
    // the input is not modified
    EXPECT_TRUE(matches(x.t, x.h));
  }
  Dev v = make(rng, {5});
  flame_tensor_t bad;
  HREF_EXPECT_ANY_FAIL(bad, flame_triu(v.t, 0, &bad));  // needs two dims
}

// ---------------------------------------------------------------------------------------------
// tensor queries

class TensorQueries : public GpuTest {};

TEST_F(TensorQueries, ShapeStridesNumelContiguity) {
  HREF_RNG(rng);
  for (flame_dtype_t d : kAllDtypes) {
    SCOPED_TRACE(dname(d));
    HT h = random(rng, {2, 3, 4}, d, Domain());
    T x = upload(ctx, h);
    int32_t nd = -1;
    FLAME_ASSERT_OK(flame_tensor_ndim(x, &nd));
    EXPECT_EQ(nd, 3);
    EXPECT_EQ(shape_of(x), (Shape{2, 3, 4}));
    EXPECT_EQ(strides_of(x), (Shape{12, 4, 1}));
    EXPECT_EQ(numel_of(x), 24);
    EXPECT_TRUE(is_contiguous(x));
    EXPECT_EQ(dtype_of(x), d);
    flame_ctx_t c = nullptr;
    FLAME_ASSERT_OK(flame_tensor_context(x, &c));
    EXPECT_EQ(c, ctx);
    void* p = nullptr;
    FLAME_ASSERT_OK(flame_tensor_data_ptr(x, &p));
    EXPECT_NE(p, nullptr);
    int64_t small[2] = {-7, -7};
    FLAME_EXPECT_STATUS(flame_tensor_shape(x, small, 2), FLAME_ERROR_INVALID_ARGUMENT);
    FLAME_EXPECT_STATUS(flame_tensor_strides(x, small, 2), FLAME_ERROR_INVALID_ARGUMENT);
    int64_t exact[3];
    FLAME_ASSERT_OK(flame_tensor_shape(x, exact, 3));
    EXPECT_EQ(exact[2], 4);
  }
  // 0-d
  T s;
  FLAME_ASSERT_OK(flame_zeros(ctx, nullptr, 0, FLAME_DTYPE_F32, s.out()));
  int32_t nd = -1;
  FLAME_ASSERT_OK(flame_tensor_ndim(s, &nd));
  EXPECT_EQ(nd, 0);
  EXPECT_EQ(numel_of(s), 1);
  EXPECT_TRUE(is_contiguous(s));
}

TEST_F(TensorQueries, NullArguments) {
  T x;
  const int64_t shp[] = {3};
  FLAME_ASSERT_OK(flame_zeros(ctx, shp, 1, FLAME_DTYPE_F32, x.out()));
  int32_t i32 = 0;
  int64_t i64 = 0;
  flame_dtype_t d;
  void* p;
  flame_ctx_t c;
  FLAME_EXPECT_STATUS(flame_tensor_ndim(nullptr, &i32), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_tensor_ndim(x, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_tensor_numel(nullptr, &i64), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_tensor_numel(x, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_tensor_dtype(nullptr, &d), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_tensor_dtype(x, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_tensor_is_contiguous(x, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_tensor_data_ptr(x, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_tensor_data_ptr(nullptr, &p), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_tensor_context(x, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_tensor_context(nullptr, &c), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_tensor_shape(x, nullptr, 1), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_tensor_retain(nullptr), FLAME_ERROR_INVALID_ARGUMENT);
}

TEST_F(TensorQueries, ContiguityOfViews) {
  HREF_RNG(rng);
  HT h = random(rng, {4, 6}, FLAME_DTYPE_F32, Domain());
  T x = upload(ctx, h);
  T v;
  FLAME_ASSERT_OK(flame_narrow(x, 0, 1, 2, v.out()));  // rows 1..2: dense
  EXPECT_TRUE(is_contiguous(v));
  FLAME_ASSERT_OK(flame_narrow(x, 1, 1, 2, v.out()));  // columns: not dense
  EXPECT_FALSE(is_contiguous(v));
  FLAME_ASSERT_OK(flame_slice(x, 0, 0, 4, 2, v.out()));
  EXPECT_FALSE(is_contiguous(v));
  FLAME_ASSERT_OK(flame_select(x, 0, 3, v.out()));
  EXPECT_TRUE(is_contiguous(v));
  FLAME_ASSERT_OK(flame_select(x, 1, 3, v.out()));
  EXPECT_FALSE(is_contiguous(v));
  FLAME_ASSERT_OK(flame_unsqueeze(x, 1, v.out()));
  EXPECT_TRUE(is_contiguous(v));
}

}  // namespace

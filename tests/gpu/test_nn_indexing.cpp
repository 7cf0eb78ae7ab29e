// GPU tests of scatter, masked_select, repeat, repeat_interleave and pad (flame.h "Indexing: scatter,
// masked_select, repeat, pad"; src/ops/indexing_extra.cpp, cuda/scatter.cuh):
//  - NnIndexGradCheck / NnIndexGradGradCheck: every op with broadcasting, non-contiguous inputs,
//    negative pads and i32/i64 indices: forward against a host float64 reference, gradients against
//    finite differences (f64, f32, and f16/bf16 for a subset), second order (create_graph) in f64;
//  - NnIndexOps: every dtype moved exactly; scatter with repeated indices (one of the candidates
//    lands; gradients as PyTorch); out-of-range scatter indices reported at the next sync; empty
//    masks and empty tensors; bad arguments (documented status, NULL result, nothing launched).
// Reproduce a failure with FLAME_GRADCHECK_SEED=<seed printed in the failure>.
#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "gradcheck.h"

using namespace gc;

namespace {

// ------------------------------------------------------------------ host references

int64_t ix(double v) { return std::llround(v); }

int64_t offset_of(const Shape& s, const std::vector<int64_t>& c) {
  int64_t o = 0;
  for (size_t d = 0; d < s.size(); ++d) o = o * s[d] + c[d];
  return o;
}

// out = x; out[.., index[c], ..] = src[c] along dim (src at least index's size).
HT scatter_ref(const HT& x, int dim, const HT& index, const HT& src) {
  HT out = x;
  for_each_index(index.shape, [&](const std::vector<int64_t>& c, int64_t lin) {
    std::vector<int64_t> xc = c;
    xc[static_cast<size_t>(dim)] = ix(index.v[lin]);
    out.v[offset_of(x.shape, xc)] = src.v[offset_of(src.shape, c)];
  });
  return out;
}

HT masked_select_ref(const HT& x, const HT& mask) {
  Shape s = broadcast_shapes({x.shape, mask.shape});
  HT ex = expand(x, s), em = expand(mask, s);
  std::vector<double> v;
  for (size_t i = 0; i < ex.v.size(); ++i)
    if (em.v[i] != 0) v.push_back(ex.v[i]);
  HT out(Shape{static_cast<int64_t>(v.size())});
  out.v = v;
  return out;
}

HT repeat_ref(const HT& x, const std::vector<int64_t>& reps) {
  Shape s(reps.size() - x.shape.size(), 1);
  s.insert(s.end(), x.shape.begin(), x.shape.end());
  Shape os(s.size());
  for (size_t d = 0; d < s.size(); ++d) os[d] = s[d] * reps[d];
  HT out(os);
  for_each_index(os, [&](const std::vector<int64_t>& c, int64_t lin) {
    std::vector<int64_t> xc(c.size());
    for (size_t d = 0; d < c.size(); ++d) xc[d] = c[d] % s[d];
    out.v[lin] = x.v[offset_of(s, xc)];
  });
  return out;
}

constexpr int kFlatten = FLAME_DIM_ALL;

HT repeat_interleave_ref(const HT& x0, int64_t r, int dim0) {
  HT x = dim0 == kFlatten ? reshape(x0, {x0.numel()}) : x0;
  const int dim = dim0 == kFlatten ? 0 : norm_dim(dim0, x.ndim());
  Shape os = x.shape;
  os[static_cast<size_t>(dim)] *= r;
  HT out(os);
  for_each_index(os, [&](const std::vector<int64_t>& c, int64_t lin) {
    std::vector<int64_t> xc = c;
    xc[static_cast<size_t>(dim)] /= r;
    out.v[lin] = x.v[offset_of(x.shape, xc)];
  });
  return out;
}

// torch.nn.functional.pad; mode 0 constant, 1 reflect, 2 replicate.
HT pad_ref(const HT& x, const std::vector<int64_t>& pads, int mode, double value) {
  const int nd = x.ndim(), k = static_cast<int>(pads.size() / 2);
  Shape os = x.shape;
  for (int i = 0; i < k; ++i) os[static_cast<size_t>(nd - 1 - i)] += pads[2 * i] + pads[2 * i + 1];
  HT out(os);
  for_each_index(os, [&](const std::vector<int64_t>& c, int64_t lin) {
    std::vector<int64_t> xc = c;
    bool inside = true;
    for (int i = 0; i < k; ++i) {
      const size_t d = static_cast<size_t>(nd - 1 - i);
      const int64_t n = x.shape[d];
      int64_t m = c[d] - pads[2 * i];
      if (mode == 0) inside = inside && m >= 0 && m < n;
      else if (mode == 1) m = m < 0 ? -m : (m >= n ? 2 * (n - 1) - m : m);
      else m = std::min(std::max<int64_t>(m, 0), n - 1);
      xc[d] = m;
    }
    out.v[lin] = inside ? x.v[offset_of(x.shape, xc)] : value;
  });
  return out;
}

// ------------------------------------------------------------------ the gradcheck table

In idx_in(Shape s, int64_t hi) {
  In i = in(std::move(s), uni(0, static_cast<double>(hi)));
  i.grad = false;
  return i;
}

// Input k becomes an index whose values are distinct along dim within [0, size): each line along dim
// gets the ranks of its draws, shifted by its first draw, modulo size.
std::function<void(std::vector<HT>&)> distinct_along(size_t k, int dim, int64_t size) {
  return [k, dim, size](std::vector<HT>& xs) {
    HT& h = xs[k];
    const Shape st = contiguous_strides(h.shape);
    const int64_t len = h.shape[static_cast<size_t>(dim)], step = st[static_cast<size_t>(dim)];
    for_each_index(h.shape, [&](const std::vector<int64_t>& c, int64_t lin) {
      if (c[static_cast<size_t>(dim)] != 0) return;
      std::vector<std::pair<double, int64_t>> u;
      for (int64_t j = 0; j < len; ++j) u.push_back({h.v[lin + j * step], j});
      const int64_t shift = static_cast<int64_t>(std::floor(h.v[lin]));
      std::sort(u.begin(), u.end());
      for (int64_t r = 0; r < len; ++r) h.v[lin + u[r].second * step] = static_cast<double>((r + shift) % size);
    });
  };
}

Row make_row(std::string name, std::string covers, std::vector<Case> cases, FlameFn fwd, RefFn ref) {
  Row r;
  r.name = std::move(name);
  if (!covers.empty()) r.covers = {std::move(covers)};
  r.cases = std::move(cases);
  r.fwd = std::move(fwd);
  r.ref = std::move(ref);
  return r;
}

// Runs f with input k converted to an index of dtype idt.
FlameFn with_index(size_t k, flame_dtype_t idt, std::function<flame_status_t(const Tensors&, flame_tensor_t, flame_tensor_t*)> f) {
  return [k, idt, f](const Tensors& in, flame_dtype_t, std::vector<T>& out) {
    T index;
    flame_status_t st = flame_to_dtype(in[k], idt, index.out());
    if (st != FLAME_OK) return st;
    out.emplace_back();
    return f(in, index, out.back().out());
  };
}
FlameFn one(std::function<flame_status_t(const Tensors&, flame_tensor_t*)> f) {
  return [f](const Tensors& in, flame_dtype_t, std::vector<T>& out) {
    out.emplace_back();
    return f(in, out.back().out());
  };
}
RefFn one_ref(std::function<HT(const std::vector<HT>&)> f) {
  return [f](const std::vector<HT>& x) { return std::vector<HT>{f(x)}; };
}

const std::vector<Row>& rows() {
  static const std::vector<Row> table = [] {
    std::vector<Row> v;
    auto last = [&v]() -> Row& { return v.back(); };
    // ---- scatter: distinct indices along dim (repeated ones are tested directly below)
    auto scatter_row = [&](std::string name, In x, int dim, Shape ishape, In src, flame_dtype_t idt) {
      const int nd = static_cast<int>(x.shape.size()), d = norm_dim(dim, nd);
      const int64_t size = x.shape[static_cast<size_t>(d)];
      v.push_back(make_row(std::move(name), "scatter", {Case({x, idx_in(ishape, size), src}, distinct_along(1, d, size))},
                           with_index(1, idt, [dim](const Tensors& in, flame_tensor_t i, flame_tensor_t* o) {
                             return flame_scatter(in[0], dim, i, in[2], o);
                           }),
                           one_ref([d](const std::vector<HT>& x) { return scatter_ref(x[0], d, x[1], x[2]); })));
    };
    scatter_row("scatter_dim1", in({3, 5}), 1, {3, 4}, in({3, 4}), FLAME_DTYPE_I64);
    last().low_precision = true;
    scatter_row("scatter_dim0_nc_i32", nc({4, 3}), 0, {3, 3}, nc({3, 3}), FLAME_DTYPE_I32);
    scatter_row("scatter_src_larger_3d", in({2, 3, 4}), -1, {2, 2, 3}, in({3, 3, 5}), FLAME_DTYPE_I64);
    // ---- masked_select (broadcasting both ways)
    auto masked_row = [&](std::string name, In x, Shape ms) {
      v.push_back(make_row(std::move(name), "", {Case({x, cond(ms)})},
                           one([](const Tensors& in, flame_tensor_t* o) { return flame_masked_select(in[0], in[1], o); }),
                           one_ref([](const std::vector<HT>& x) { return masked_select_ref(x[0], x[1]); })));
    };
    masked_row("masked_select", in({3, 4}), {3, 4});
    last().low_precision = true;
    masked_row("masked_select_nc_x_broadcast", nc({1, 4}), {3, 4});
    masked_row("masked_select_mask_broadcast", in({2, 3, 4}), {3, 1});
    // ---- repeat
    auto repeat_row = [&](std::string name, In x, std::vector<int64_t> reps) {
      v.push_back(make_row(std::move(name), "", {Case({x})},
                           one([reps](const Tensors& in, flame_tensor_t* o) {
                             return flame_repeat(in[0], reps.data(), static_cast<int32_t>(reps.size()), o);
                           }),
                           one_ref([reps](const std::vector<HT>& x) { return repeat_ref(x[0], reps); })));
    };
    repeat_row("repeat_new_leading_dim", in({2, 3}), {2, 1, 3});
    last().low_precision = true;
    repeat_row("repeat_nc", nc({3, 2}), {2, 2});
    repeat_row("repeat_0d", in({}), {3});
    repeat_row("repeat_zero_count", in({2, 3}), {0, 2});
    // ---- repeat_interleave
    auto interleave_row = [&](std::string name, In x, int64_t r, int dim) {
      v.push_back(make_row(std::move(name), "", {Case({x})},
                           one([r, dim](const Tensors& in, flame_tensor_t* o) { return flame_repeat_interleave(in[0], r, dim, o); }),
                           one_ref([r, dim](const std::vector<HT>& x) { return repeat_interleave_ref(x[0], r, dim); })));
    };
    interleave_row("repeat_interleave_dim1", in({2, 3}), 2, 1);
    last().low_precision = true;
    interleave_row("repeat_interleave_flatten_nc", nc({3, 2}), 3, kFlatten);
    interleave_row("repeat_interleave_first_of_3d", in({2, 3, 2}), 2, -3);
    // ---- pad
    auto pad_row = [&](std::string name, In x, std::vector<int64_t> pads, int mode, double value) {
      v.push_back(make_row(std::move(name), mode == 0 ? "constant_pad" : "", {Case({x})},
                           one([pads, mode, value](const Tensors& in, flame_tensor_t* o) {
                             return flame_pad(in[0], pads.data(), static_cast<int32_t>(pads.size()), mode, value, o);
                           }),
                           one_ref([pads, mode, value](const std::vector<HT>& x) { return pad_ref(x[0], pads, mode, value); })));
    };
    pad_row("pad_constant_2d", in({2, 3, 4}), {1, 2, 0, 1}, FLAME_PAD_CONSTANT, 0.5);
    last().low_precision = true;
    pad_row("pad_constant_crop_nc", nc({3, 5}), {-1, 2, 1, -1}, FLAME_PAD_CONSTANT, -1.0);
    pad_row("pad_constant_every_dim", in({2, 3}), {1, 0, 0, 2}, FLAME_PAD_CONSTANT, 0.0);
    pad_row("pad_reflect_1d", in({2, 5}), {2, 3}, FLAME_PAD_REFLECT, 0.0);
    last().low_precision = true;
    pad_row("pad_reflect_3d_nc", nc({2, 3, 4, 4}), {1, 1, 2, 0, 1, 2}, FLAME_PAD_REFLECT, 0.0);
    pad_row("pad_reflect_negative", in({2, 6}), {-2, 3}, FLAME_PAD_REFLECT, 0.0);
    pad_row("pad_replicate_2d", in({2, 3, 3}), {2, 1, 1, 3}, FLAME_PAD_REPLICATE, 0.0);
    last().low_precision = true;
    pad_row("pad_replicate_negative_nc", nc({4, 5}), {1, -2, -1, 2}, FLAME_PAD_REPLICATE, 0.0);
    return v;
  }();
  return table;
}


TEST(NnIndexTable, RowNamesAreUnique) {
  std::set<std::string> names;
  for (const Row& r : rows()) EXPECT_TRUE(names.insert(r.name).second) << "duplicate row " << r.name;
}

FLAME_GRADCHECK_SUITES(NnIndexing, NnIndexGradCheck, NnIndexGradGradCheck, rows, 0x9e3779b97f4a7c15ull);

// ------------------------------------------------------------------ direct tests

const flame_dtype_t kEveryDtype[] = {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_F64,
                                     FLAME_DTYPE_I32, FLAME_DTYPE_I64, FLAME_DTYPE_U8,  FLAME_DTYPE_BOOL};

// Values exact in every dtype: small whole numbers (0/1 for bool), never all zero.
HT exact_values(const Shape& s, flame_dtype_t dt, int salt) {
  HT h(s);
  for (size_t i = 0; i < h.v.size(); ++i)
    h.v[i] = dt == FLAME_DTYPE_BOOL ? static_cast<double>((i + salt) % 3 == 0) : static_cast<double>((i * 7 + salt) % 97);
  return h;
}

HT index_ht(const Shape& s, std::vector<double> v) {
  HT h(s);
  h.v = std::move(v);
  return h;
}

class NnIndexOps : public GpuTest {};

TEST_F(NnIndexOps, EveryDtypeMovesExactly) {
  for (flame_dtype_t dt : kEveryDtype) {
    SCOPED_TRACE(dtname(dt));
    const HT x = exact_values({3, 4}, dt, 1), src = exact_values({3, 2}, dt, 5);
    const HT idx = index_ht({3, 2}, {3, 0, 1, 2, 0, 3});
    HT mask(Shape{4});
    mask.v = {1, 0, 1, 1};
    T xt, st, it, mt, a, b, c, d, e, f;
    FLAME_ASSERT_OK(upload(ctx, x, dt, xt.out()));
    FLAME_ASSERT_OK(upload(ctx, src, dt, st.out()));
    FLAME_ASSERT_OK(upload(ctx, idx, FLAME_DTYPE_I64, it.out()));
    FLAME_ASSERT_OK(upload(ctx, mask, FLAME_DTYPE_BOOL, mt.out()));
    const int64_t reps[] = {2, 1, 2}, pads[] = {1, 2, 2, 1};
    FLAME_ASSERT_OK(flame_scatter(xt, 1, it, st, a.out()));
    FLAME_ASSERT_OK(flame_masked_select(xt, mt, b.out()));
    FLAME_ASSERT_OK(flame_repeat(xt, reps, 3, c.out()));
    FLAME_ASSERT_OK(flame_repeat_interleave(xt, 3, 0, d.out()));
    FLAME_ASSERT_OK(flame_pad(xt, pads, 4, FLAME_PAD_REFLECT, 0.0, e.out()));
    FLAME_ASSERT_OK(flame_pad(xt, pads, 4, FLAME_PAD_CONSTANT, 1.0, f.out()));
    const std::pair<flame_tensor_t, HT> want[] = {
        {a, scatter_ref(x, 1, idx, src)},    {b, masked_select_ref(x, mask)},       {c, repeat_ref(x, {2, 1, 2})},
        {d, repeat_interleave_ref(x, 3, 0)}, {e, pad_ref(x, {1, 2, 2, 1}, 1, 0.0)}, {f, pad_ref(x, {1, 2, 2, 1}, 0, 1.0)}};
    for (const auto& w : want) {
      EXPECT_EQ(dtype_of(w.first), dt);
      HT got;
      FLAME_ASSERT_OK(download(w.first, &got));
      EXPECT_TRUE(close(got, w.second, 0, "exact data movement"));
      int32_t contiguous = 0;
      FLAME_ASSERT_OK(flame_tensor_is_contiguous(w.first, &contiguous));
      EXPECT_EQ(contiguous, 1);
    }
  }
}

// Results never share memory with the input, even when nothing is padded or repeated.
TEST_F(NnIndexOps, ResultsAreFreshTensors) {
  HT x(Shape{2, 3}, 1.5);
  T xt, a, b, c;
  FLAME_ASSERT_OK(upload(ctx, x, FLAME_DTYPE_F32, xt.out()));
  const int64_t ones[] = {1, 1}, zeros[] = {0, 0};
  FLAME_ASSERT_OK(flame_repeat(xt, ones, 2, a.out()));
  FLAME_ASSERT_OK(flame_pad(xt, zeros, 2, FLAME_PAD_CONSTANT, 0.0, b.out()));
  FLAME_ASSERT_OK(flame_repeat_interleave(xt, 1, 0, c.out()));
  void *px = nullptr, *p = nullptr;
  FLAME_ASSERT_OK(flame_tensor_data_ptr(xt, &px));
  for (flame_tensor_t t : {a.h, b.h, c.h}) {
    FLAME_ASSERT_OK(flame_tensor_data_ptr(t, &p));
    EXPECT_NE(p, px);
    HT got;
    FLAME_ASSERT_OK(download(t, &got));
    EXPECT_TRUE(close(got, x, 0, "identity"));
  }
}

// Repeated positions: one of the candidates lands (PyTorch leaves which unspecified); t's gradient is
// zero at every scattered position and src's gradient is the gathered incoming gradient.
TEST_F(NnIndexOps, ScatterWithRepeatedIndices) {
  std::mt19937_64 rng(gc::seed() ^ 21);
  std::uniform_real_distribution<double> u(-2, 2);
  HT x(Shape{2, 5}), src(Shape{2, 4}), g(Shape{2, 5});
  for (HT* h : {&x, &src, &g})
    for (double& e : h->v) e = u(rng);
  const HT idx = index_ht({2, 4}, {1, 3, 1, 1, 4, 0, 4, 2});
  T xt, st, it, gt, out;
  FLAME_ASSERT_OK(upload(ctx, x, FLAME_DTYPE_F64, xt.out()));
  FLAME_ASSERT_OK(upload(ctx, src, FLAME_DTYPE_F64, st.out()));
  FLAME_ASSERT_OK(upload(ctx, idx, FLAME_DTYPE_I64, it.out()));
  FLAME_ASSERT_OK(upload(ctx, g, FLAME_DTYPE_F64, gt.out()));
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(xt, 1));
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(st, 1));
  FLAME_ASSERT_OK(flame_scatter(xt, 1, it, st, out.out()));
  HT got;
  FLAME_ASSERT_OK(download(out, &got));
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t c = 0; c < 5; ++c) {
      std::vector<double> candidates;
      for (int64_t j = 0; j < 4; ++j)
        if (ix(idx.v[r * 4 + j]) == c) candidates.push_back(src.v[r * 4 + j]);
      const double v = got.v[r * 5 + c];
      if (candidates.empty()) EXPECT_EQ(v, x.v[r * 5 + c]) << "untouched (" << r << ", " << c << ")";
      else EXPECT_NE(std::find(candidates.begin(), candidates.end(), v), candidates.end()) << "(" << r << ", " << c << ")";
    }
  flame_tensor_t outs[] = {out.h}, gouts[] = {gt.h}, ins[] = {xt.h, st.h}, res[2] = {nullptr, nullptr};
  FLAME_ASSERT_OK(flame_grad(ctx, outs, gouts, 1, ins, 2, 0, res));
  T gx(res[0]), gs(res[1]);
  HT hgx, hgs, want_gx = g, want_gs(Shape{2, 4});
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t j = 0; j < 4; ++j) {
      want_gx.v[r * 5 + ix(idx.v[r * 4 + j])] = 0;
      want_gs.v[r * 4 + j] = g.v[r * 5 + ix(idx.v[r * 4 + j])];
    }
  FLAME_ASSERT_OK(download(gx, &hgx));
  FLAME_ASSERT_OK(download(gs, &hgs));
  EXPECT_TRUE(close(hgx, want_gx, 0, "gradient of t"));
  EXPECT_TRUE(close(hgs, want_gs, 0, "gradient of src"));
}

TEST_F(NnIndexOps, ScatterOutOfRangeIsReportedAtTheNextSync) {
  HT x(Shape{2, 3}, 1.0), src(Shape{2, 2}, 5.0);
  const HT idx = index_ht({2, 2}, {0, 3, -1, 2});
  T xt, st, it, out;
  FLAME_ASSERT_OK(upload(ctx, x, FLAME_DTYPE_F32, xt.out()));
  FLAME_ASSERT_OK(upload(ctx, src, FLAME_DTYPE_F32, st.out()));
  FLAME_ASSERT_OK(upload(ctx, idx, FLAME_DTYPE_I32, it.out()));
  FLAME_ASSERT_OK(flame_scatter(xt, 1, it, st, out.out()));
  FLAME_EXPECT_STATUS(flame_ctx_synchronize(ctx), FLAME_ERROR_INVALID_ARGUMENT);
  const std::string msg = flame_last_error_message();
  EXPECT_NE(msg.find("scatter: index"), std::string::npos) << msg;
  EXPECT_NE(msg.find("out of range [0, 3)"), std::string::npos) << msg;
  HT got, want(Shape{2, 3}, 1.0);
  want.v[0] = 5.0;
  want.v[5] = 5.0;
  FLAME_ASSERT_OK(download(out, &got));  // reported once; the context goes on
  EXPECT_TRUE(close(got, want, 0, "only the valid indices were written"));
}

TEST_F(NnIndexOps, EmptyMasksAndEmptyTensors) {
  HT x(Shape{2, 3}, 1.0), none(Shape{2, 3});
  T xt, mt, out;
  FLAME_ASSERT_OK(upload(ctx, x, FLAME_DTYPE_BF16, xt.out()));
  FLAME_ASSERT_OK(upload(ctx, none, FLAME_DTYPE_BOOL, mt.out()));
  FLAME_ASSERT_OK(flame_masked_select(xt, mt, out.out()));
  EXPECT_EQ(shape_of(out), (Shape{0}));
  EXPECT_EQ(dtype_of(out), FLAME_DTYPE_BF16);
  const int64_t zero_shape[] = {0, 3};
  T e, e2, e3, e4;
  FLAME_ASSERT_OK(flame_zeros(ctx, zero_shape, 2, FLAME_DTYPE_F32, e.out()));
  FLAME_EXPECT_STATUS(flame_masked_select(e, e, e2.out()), FLAME_ERROR_DTYPE_MISMATCH);
  T em;
  FLAME_ASSERT_OK(flame_zeros(ctx, zero_shape, 2, FLAME_DTYPE_BOOL, em.out()));
  FLAME_ASSERT_OK(flame_masked_select(e, em, e2.out()));
  EXPECT_EQ(shape_of(e2), (Shape{0}));
  const int64_t pads[] = {1, 1, 2, 0};
  FLAME_ASSERT_OK(flame_pad(e, pads, 4, FLAME_PAD_CONSTANT, 3.0, e3.out()));
  EXPECT_EQ(shape_of(e3), (Shape{2, 5}));
  HT got;
  FLAME_ASSERT_OK(download(e3, &got));
  EXPECT_TRUE(close(got, HT(Shape{2, 5}, 3.0), 0, "padding an empty tensor gives the value"));
  FLAME_ASSERT_OK(flame_repeat_interleave(e, 4, 1, e4.out()));
  EXPECT_EQ(shape_of(e4), (Shape{0, 12}));
}

TEST_F(NnIndexOps, BadArgumentsGiveTheDocumentedStatusAndNoOutput) {
  const int64_t s23[2] = {2, 3}, s22[2] = {2, 2}, s4[1] = {4};
  T x, xi, scalar, i22, i22f, i4, src22, src22d, src12, mask_f32, mask4;
  FLAME_ASSERT_OK(flame_zeros(ctx, s23, 2, FLAME_DTYPE_F32, x.out()));
  FLAME_ASSERT_OK(flame_zeros(ctx, s23, 2, FLAME_DTYPE_I32, xi.out()));
  FLAME_ASSERT_OK(flame_zeros(ctx, nullptr, 0, FLAME_DTYPE_F32, scalar.out()));
  FLAME_ASSERT_OK(flame_zeros(ctx, s22, 2, FLAME_DTYPE_I64, i22.out()));
  FLAME_ASSERT_OK(flame_zeros(ctx, s22, 2, FLAME_DTYPE_F32, i22f.out()));
  FLAME_ASSERT_OK(flame_zeros(ctx, s4, 1, FLAME_DTYPE_I64, i4.out()));
  FLAME_ASSERT_OK(flame_zeros(ctx, s22, 2, FLAME_DTYPE_F32, src22.out()));
  FLAME_ASSERT_OK(flame_zeros(ctx, s22, 2, FLAME_DTYPE_F64, src22d.out()));
  const int64_t s12[2] = {1, 2};
  FLAME_ASSERT_OK(flame_zeros(ctx, s12, 2, FLAME_DTYPE_F32, src12.out()));
  FLAME_ASSERT_OK(flame_zeros(ctx, s23, 2, FLAME_DTYPE_F32, mask_f32.out()));
  FLAME_ASSERT_OK(flame_zeros(ctx, s4, 1, FLAME_DTYPE_BOOL, mask4.out()));
  const int64_t reps1[] = {2}, reps_neg[] = {1, -1}, reps9[] = {1, 1, 1, 1, 1, 1, 1, 1, 1}, huge[] = {INT64_MAX / 2, 3};
  const int64_t p2[] = {1, 1}, p3[] = {1, 1, 1}, p8[] = {1, 1, 1, 1, 1, 1, 1, 1}, p_reflect[] = {3, 0};
  const int64_t p_crop[] = {-2, -2}, p_crop0[] = {0, 0, -1, -2}, p_replicate_empty[] = {0, 0, 1, 0};
  T empty_rows;
  const int64_t s03[2] = {0, 3};
  FLAME_ASSERT_OK(flame_zeros(ctx, s03, 2, FLAME_DTYPE_F32, empty_rows.out()));
  struct Bad {
    const char* what;
    flame_status_t want;
    std::function<flame_status_t(flame_tensor_t*)> call;
  };
  const std::vector<Bad> bad = {
      {"scatter NULL t", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_scatter(nullptr, 1, i22, src22, o); }},
      {"scatter NULL src", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_scatter(x, 1, i22, nullptr, o); }},
      {"scatter float index", FLAME_ERROR_DTYPE_MISMATCH, [&](flame_tensor_t* o) { return flame_scatter(x, 1, i22f, src22, o); }},
      {"scatter src dtype", FLAME_ERROR_DTYPE_MISMATCH, [&](flame_tensor_t* o) { return flame_scatter(x, 1, i22, src22d, o); }},
      {"scatter src smaller", FLAME_ERROR_SHAPE_MISMATCH, [&](flame_tensor_t* o) { return flame_scatter(x, 1, i22, src12, o); }},
      {"scatter index rank", FLAME_ERROR_SHAPE_MISMATCH, [&](flame_tensor_t* o) { return flame_scatter(x, 0, i4, src22, o); }},
      {"scatter dim", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_scatter(x, 2, i22, src22, o); }},
      {"scatter 0-d", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_scatter(scalar, 0, i22, scalar, o); }},
      {"masked_select mask dtype", FLAME_ERROR_DTYPE_MISMATCH, [&](flame_tensor_t* o) { return flame_masked_select(x, mask_f32, o); }},
      {"masked_select no broadcast", FLAME_ERROR_SHAPE_MISMATCH, [&](flame_tensor_t* o) { return flame_masked_select(x, mask4, o); }},
      {"repeat NULL", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_repeat(x, nullptr, 2, o); }},
      {"repeat too few", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_repeat(x, reps1, 1, o); }},
      {"repeat negative", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_repeat(x, reps_neg, 2, o); }},
      {"repeat too many dims", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_repeat(x, reps9, 9, o); }},
      {"repeat overflow", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_repeat(x, huge, 2, o); }},
      {"repeat_interleave negative", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_repeat_interleave(x, -1, 0, o); }},
      {"repeat_interleave dim", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_repeat_interleave(x, 2, 2, o); }},
      {"repeat_interleave 0-d dim", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_repeat_interleave(scalar, 2, 0, o); }},
      {"pad NULL", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_pad(x, nullptr, 2, 0, 0.0, o); }},
      {"pad odd", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_pad(x, p3, 3, 0, 0.0, o); }},
      {"pad none", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_pad(x, p2, 0, 0, 0.0, o); }},
      {"pad too many", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_pad(x, p8, 6, 0, 0.0, o); }},
      {"pad mode", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_pad(x, p2, 2, 3, 0.0, o); }},
      {"pad reflect 4 dims", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_pad(x, p8, 8, 1, 0.0, o); }},
      {"pad reflect too wide", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_pad(x, p_reflect, 2, 1, 0.0, o); }},
      {"pad crop too wide", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_pad(x, p_crop, 2, 0, 0.0, o); }},
      {"pad replicate crop too wide", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_pad(x, p_crop0, 4, 2, 0.0, o); }},
      {"pad replicate empty dim", FLAME_ERROR_INVALID_ARGUMENT,
       [&](flame_tensor_t* o) { return flame_pad(empty_rows, p_replicate_empty, 4, 2, 0.0, o); }},
      {"pad integer NaN", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_pad(xi, p2, 2, 0, NAN, o); }},
  };
  for (const Bad& b : bad) {
    flame_tensor_t out = reinterpret_cast<flame_tensor_t>(static_cast<uintptr_t>(0x10));
    flame_status_t st = b.call(&out);
    EXPECT_EQ(st, b.want) << b.what << ": " << flame_status_string(st) << " " << flame_last_error_message();
    EXPECT_EQ(out, nullptr) << b.what;
    if (st == FLAME_OK && out) flame_tensor_release(out);
  }
  FLAME_EXPECT_STATUS(flame_scatter(x, 1, i22, src22, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));  // nothing was launched with a bad index
}

}  // namespace

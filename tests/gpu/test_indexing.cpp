// GPU tests of the indexing ops (flame.h "Indexing", src/ops/indexing.cpp, cuda/indexing.cuh):
//  - IndexGradCheck / IndexGradGradCheck: index_select, gather, scatter_add, index_add, embedding and
//    masked_fill with repeated indices, non-contiguous data, every dim, i32 and i64 indices: forward
//    against a host float64 reference, gradients against finite differences (f64, f32, and f16/bf16
//    for a subset) and second order (create_graph) in f64;
//  - IndexOps: every data dtype moved exactly; the padding row of embedding gets no gradient; large
//    scatters with many repeats (atomics) in f32, bf16 and integers; one_hot (given and inferred
//    class counts); out-of-range indices reported at the next synchronisation with the context still
//    usable; bad arguments.
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "gradcheck.h"

using namespace gc;

namespace {

// ------------------------------------------------------------------ host references

int64_t ix(double v) { return std::llround(v); }

// Flat offset of coordinates c in a row-major tensor of shape s.
int64_t offset_of(const Shape& s, const std::vector<int64_t>& c) {
  int64_t o = 0;
  for (size_t d = 0; d < s.size(); ++d) o = o * s[d] + c[d];
  return o;
}

HT gather_ref(const HT& x, int dim, const HT& index) {
  HT out(index.shape);
  for_each_index(index.shape, [&](const std::vector<int64_t>& c, int64_t lin) {
    std::vector<int64_t> xc = c;
    xc[static_cast<size_t>(dim)] = ix(index.v[lin]);
    out.v[lin] = x.v[offset_of(x.shape, xc)];
  });
  return out;
}

HT scatter_add_ref(const HT& x, int dim, const HT& index, const HT& src, double alpha = 1.0) {
  HT out = x;
  for_each_index(index.shape, [&](const std::vector<int64_t>& c, int64_t lin) {
    std::vector<int64_t> xc = c;
    xc[static_cast<size_t>(dim)] = ix(index.v[lin]);
    out.v[offset_of(x.shape, xc)] += alpha * src.v[lin];
  });
  return out;
}

// The 1-D index of index_select / index_add broadcast to `shape` along dim.
HT broadcast_1d(const HT& index, const Shape& shape, int dim) {
  HT b(shape);
  for_each_index(shape, [&](const std::vector<int64_t>& c, int64_t lin) { b.v[lin] = index.v[c[static_cast<size_t>(dim)]]; });
  return b;
}

HT index_select_ref(const HT& x, int dim, const HT& index) {
  Shape s = x.shape;
  s[static_cast<size_t>(dim)] = index.numel();
  return gather_ref(x, dim, broadcast_1d(index, s, dim));
}

HT embedding_ref(const HT& w, const HT& idx) {
  int64_t D = w.shape[1];
  Shape s = idx.shape;
  s.push_back(D);
  HT out(s);
  for (int64_t i = 0; i < idx.numel(); ++i)
    for (int64_t d = 0; d < D; ++d) out.v[i * D + d] = w.v[ix(idx.v[i]) * D + d];
  return out;
}

// ------------------------------------------------------------------ the gradcheck table

In idx_in(Shape s, int64_t hi) {  // integer-valued draws in [0, hi), converted to an index in the row
  In i = in(std::move(s), uni(0, static_cast<double>(hi)));
  i.grad = false;
  return i;
}
std::function<void(std::vector<HT>&)> floor_input(size_t k, std::vector<std::pair<size_t, double>> set = {}) {
  return [k, set](std::vector<HT>& xs) {
    for (double& e : xs[k].v) e = std::floor(e);
    for (auto& p : set) xs[k].v[p.first] = p.second;
  };
}

Row make_row(std::string name, std::string covers, std::vector<Case> cases, FlameFn fwd, RefFn ref) {
  Row r;
  r.name = std::move(name);
  r.covers = {std::move(covers)};
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

const std::vector<Row>& rows() {
  static const std::vector<Row> table = [] {
    std::vector<Row> v;
    auto last = [&v]() -> Row& { return v.back(); };
    const flame_dtype_t I64 = FLAME_DTYPE_I64, I32 = FLAME_DTYPE_I32;
    // ---- index_select (repeated indices: the backward accumulates)
    auto index_select_row = [&](std::string name, In x, int dim, int64_t k, flame_dtype_t idt) {
      int64_t size = x.shape[static_cast<size_t>(dim < 0 ? dim + static_cast<int>(x.shape.size()) : dim)];
      int nd = static_cast<int>(x.shape.size());
      v.push_back(make_row(std::move(name), "gather", {Case({x, idx_in({k}, size)}, floor_input(1, {{0, 0}, {1, 0}}))},
                           with_index(1, idt, [dim](const Tensors& in, flame_tensor_t i, flame_tensor_t* o) {
                             return flame_index_select(in[0], dim, i, o);
                           }),
                           [dim, nd](const std::vector<HT>& x) {
                             return std::vector<HT>{index_select_ref(x[0], dim < 0 ? dim + nd : dim, x[1])};
                           }));
    };
    index_select_row("index_select_dim0", in({4, 5}), 0, 6, I64);
    last().low_precision = true;
    index_select_row("index_select_dim1_nc_i32", nc({3, 5}), 1, 7, I32);
    index_select_row("index_select_last_3d", in({2, 3, 4}), -1, 5, I64);
    // ---- gather
    auto gather_row = [&](std::string name, In x, int dim, Shape ishape, flame_dtype_t idt) {
      int64_t size = x.shape[static_cast<size_t>(dim)];
      v.push_back(make_row(std::move(name), "gather", {Case({x, idx_in(ishape, size)}, floor_input(1))},
                           with_index(1, idt, [dim](const Tensors& in, flame_tensor_t i, flame_tensor_t* o) {
                             return flame_gather(in[0], dim, i, o);
                           }),
                           [dim](const std::vector<HT>& x) { return std::vector<HT>{gather_ref(x[0], dim, x[1])}; }));
    };
    gather_row("gather_dim1", in({3, 5}), 1, {3, 4}, I64);
    last().low_precision = true;
    gather_row("gather_dim0_nc_i32", nc({4, 3}), 0, {6, 2}, I32);
    gather_row("gather_3d", in({2, 3, 4}), 1, {2, 5, 3}, I64);
    // ---- scatter_add (gradients to the input and to src)
    auto scatter_row = [&](std::string name, In x, int dim, Shape ishape, flame_dtype_t idt) {
      int64_t size = x.shape[static_cast<size_t>(dim)];
      v.push_back(make_row(std::move(name), "scatter_add", {Case({x, idx_in(ishape, size), in(ishape)}, floor_input(1))},
                           with_index(1, idt, [dim](const Tensors& in, flame_tensor_t i, flame_tensor_t* o) {
                             return flame_scatter_add(in[0], dim, i, in[2], o);
                           }),
                           [dim](const std::vector<HT>& x) { return std::vector<HT>{scatter_add_ref(x[0], dim, x[1], x[2])}; }));
    };
    scatter_row("scatter_add_dim1", in({3, 5}), 1, {3, 4}, I64);
    last().low_precision = true;
    scatter_row("scatter_add_dim0_nc_i32", nc({4, 3}), 0, {6, 2}, I32);
    // ---- index_add
    auto index_add_row = [&](std::string name, Shape xs, int dim, int64_t k, double alpha, bool nc_source) {
      Shape ss = xs;
      ss[static_cast<size_t>(dim)] = k;
      In src = nc_source ? nc(ss) : in(ss);
      v.push_back(make_row(std::move(name), "scatter_add", {Case({in(xs), idx_in({k}, xs[static_cast<size_t>(dim)]), src}, floor_input(1, {{0, 1}, {1, 1}}))},
                           with_index(1, FLAME_DTYPE_I64, [dim, alpha](const Tensors& in, flame_tensor_t i, flame_tensor_t* o) {
                             return flame_index_add(in[0], dim, i, in[2], alpha, o);
                           }),
                           [dim, alpha](const std::vector<HT>& x) {
                             return std::vector<HT>{scatter_add_ref(x[0], dim, broadcast_1d(x[1], x[2].shape, dim), x[2], alpha)};
                           }));
    };
    index_add_row("index_add_dim0", {5, 3}, 0, 4, 1.5, false);
    last().low_precision = true;
    index_add_row("index_add_dim1_nc", {3, 4}, 1, 6, -1.0, true);
    // ---- embedding (no index equals padding_idx here: finite differences know nothing of padding)
    auto embedding_row = [&](std::string name, Shape ishape, int64_t padding, flame_dtype_t idt) {
      v.push_back(make_row(std::move(name), "gather", {Case({in({7, 4}), idx_in(ishape, 6)}, floor_input(1))},
                           with_index(1, idt, [padding](const Tensors& in, flame_tensor_t i, flame_tensor_t* o) {
                             return flame_embedding(in[0], i, padding, o);
                           }),
                           [](const std::vector<HT>& x) { return std::vector<HT>{embedding_ref(x[0], x[1])}; }));
    };
    embedding_row("embedding", {2, 5}, FLAME_NO_PADDING, I64);
    last().low_precision = true;
    embedding_row("embedding_padding_unused_i32", {9}, -1, I32);  // row 6 is the padding row; indices < 6
    // ---- masked_fill (a where(): gradient 0 where filled)
    auto masked_row = [&](std::string name, Shape xs, Shape ms) {
      v.push_back(make_row(std::move(name), "where", {Case({in(xs), cond(ms)})},
                           [](const Tensors& in, flame_dtype_t, std::vector<T>& out) {
                             out.emplace_back();
                             return flame_masked_fill(in[0], in[1], 2.5, out.back().out());
                           },
                           [](const std::vector<HT>& x) {
                             return std::vector<HT>{gc::binary(x[0], x[1], [](double a, double m) { return m != 0 ? 2.5 : a; })};
                           }));
    };
    masked_row("masked_fill", {3, 4}, {3, 4});
    last().low_precision = true;
    masked_row("masked_fill_broadcast", {3, 4}, {4});
    return v;
  }();
  return table;
}

TEST(IndexTable, RowNamesAreUnique) {  // every op of the list has a row: test_op_coverage.cpp
  std::set<std::string> names;
  for (const Row& r : rows()) EXPECT_TRUE(names.insert(r.name).second) << "duplicate row " << r.name;
}

FLAME_GRADCHECK_SUITES(Indexing, IndexGradCheck, IndexGradGradCheck, rows, 0x2545f4914f6cdd1dull);

// ------------------------------------------------------------------ direct tests

HT random_ht(const Shape& s, std::mt19937_64& rng, double lo, double hi) {
  HT h(s);
  std::uniform_real_distribution<double> u(lo, hi);
  for (double& e : h.v) e = u(rng);
  return h;
}
HT random_index(const Shape& s, int64_t hi, std::mt19937_64& rng) {
  HT h(s);
  std::uniform_int_distribution<int64_t> u(0, hi - 1);
  for (double& e : h.v) e = static_cast<double>(u(rng));
  return h;
}

class IndexOps : public GpuTest {};

// Data movement is exact in every dtype (values chosen to be exact in each).
TEST_F(IndexOps, GatherIndexSelectEmbeddingMoveEveryDtypeExactly) {
  std::mt19937_64 rng(gc::seed() ^ 3);
  const flame_dtype_t dts[] = {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_F64,
                               FLAME_DTYPE_I32, FLAME_DTYPE_I64, FLAME_DTYPE_U8,  FLAME_DTYPE_BOOL};
  for (flame_dtype_t dt : dts) {
    SCOPED_TRACE(dtname(dt));
    HT x(Shape{6, 5});
    for (size_t i = 0; i < x.v.size(); ++i) x.v[i] = dt == FLAME_DTYPE_BOOL ? static_cast<double>(i % 3 == 0) : static_cast<double>(i % 97);
    HT sel = random_index({8}, 6, rng), gi = random_index({6, 7}, 5, rng);
    T xt, st, gt, a, b, c;
    FLAME_ASSERT_OK(upload(ctx, x, dt, xt.out()));
    FLAME_ASSERT_OK(upload(ctx, sel, FLAME_DTYPE_I64, st.out()));
    FLAME_ASSERT_OK(upload(ctx, gi, FLAME_DTYPE_I32, gt.out()));
    HT ga, gb, gc_;
    FLAME_ASSERT_OK(flame_index_select(xt, 0, st, a.out()));
    FLAME_ASSERT_OK(download(a, &ga));
    EXPECT_EQ(dtype_of(a), dt);
    EXPECT_TRUE(close(ga, index_select_ref(x, 0, sel), 0, "index_select"));
    HT gi2 = random_index({6, 3}, 5, rng);
    T g2;
    FLAME_ASSERT_OK(upload(ctx, gi2, FLAME_DTYPE_I32, g2.out()));
    FLAME_ASSERT_OK(flame_gather(xt, 1, g2, b.out()));
    FLAME_ASSERT_OK(download(b, &gb));
    EXPECT_TRUE(close(gb, gather_ref(x, 1, gi2), 0, "gather"));
    FLAME_ASSERT_OK(flame_embedding(xt, gt, FLAME_NO_PADDING, c.out()));
    FLAME_ASSERT_OK(download(c, &gc_));
    EXPECT_EQ(shape_of(c), (Shape{6, 7, 5}));
    EXPECT_TRUE(close(gc_, embedding_ref(x, gi), 0, "embedding"));
  }
}

TEST_F(IndexOps, EmbeddingPaddingRowGetsNoGradient) {
  std::mt19937_64 rng(gc::seed() ^ 5);
  for (flame_dtype_t dt : {FLAME_DTYPE_F32, FLAME_DTYPE_BF16})
    for (int64_t padding : {int64_t{2}, int64_t{-3}}) {  // -3 is row 4 of 7
      SCOPED_TRACE(dtname(dt) + " padding_idx " + std::to_string(padding));
      const int64_t V = 7, D = 3, pad_row = padding < 0 ? padding + V : padding;
      HT w = random_ht({V, D}, rng, -1, 1), idx = random_index({4, 5}, V, rng);
      idx.v[0] = static_cast<double>(pad_row);
      idx.v[7] = static_cast<double>(pad_row);
      T wt, it, out, sum;
      FLAME_ASSERT_OK(upload(ctx, w, dt, wt.out()));
      FLAME_ASSERT_OK(download(wt, &w));
      FLAME_ASSERT_OK(flame_tensor_set_requires_grad(wt, 1));
      FLAME_ASSERT_OK(upload(ctx, idx, FLAME_DTYPE_I64, it.out()));
      FLAME_ASSERT_OK(flame_embedding(wt, it, padding, out.out()));
      HT got;
      FLAME_ASSERT_OK(download(out, &got));
      EXPECT_TRUE(close(got, embedding_ref(w, idx), 0, "forward reads the padding row too"));
      FLAME_ASSERT_OK(flame_sum_all(out, sum.out()));
      FLAME_ASSERT_OK(flame_backward(ctx, sum, nullptr, 0));
      T g;
      FLAME_ASSERT_OK(flame_tensor_grad(wt, g.out()));
      HT gh, want(Shape{V, D});
      FLAME_ASSERT_OK(download(g, &gh));
      for (double e : idx.v)
        if (ix(e) != pad_row)
          for (int64_t d = 0; d < D; ++d) want.v[ix(e) * D + d] += 1.0;
      EXPECT_TRUE(close(gh, want, 0, "gradient: counts of each row, zero for the padding row"));
    }
}

// Many repeats of few indices: the atomics must lose nothing.
TEST_F(IndexOps, LargeScattersWithRepeats) {
  std::mt19937_64 rng(gc::seed() ^ 7);
  const int64_t V = 300, D = 64, N = 5000;
  for (flame_dtype_t dt : {FLAME_DTYPE_F32, FLAME_DTYPE_BF16, FLAME_DTYPE_F64, FLAME_DTYPE_I32, FLAME_DTYPE_I64}) {
    SCOPED_TRACE(dtname(dt));
    const bool integer = dt == FLAME_DTYPE_I32 || dt == FLAME_DTYPE_I64;
    HT x = random_ht({V, D}, rng, -4, 4), src = random_ht({N, D}, rng, -4, 4), idx = random_index({N}, V / 10, rng);
    if (integer)
      for (HT* h : {&x, &src})
        for (double& e : h->v) e = std::floor(e * 100);
    T xt, st, it, out;
    FLAME_ASSERT_OK(upload(ctx, x, dt, xt.out()));
    FLAME_ASSERT_OK(download(xt, &x));
    FLAME_ASSERT_OK(upload(ctx, src, dt, st.out()));
    FLAME_ASSERT_OK(download(st, &src));
    FLAME_ASSERT_OK(upload(ctx, idx, FLAME_DTYPE_I64, it.out()));
    FLAME_ASSERT_OK(flame_index_add(xt, 0, it, st, integer ? 2.0 : 0.5, out.out()));
    HT got;
    FLAME_ASSERT_OK(download(out, &got));
    HT want = scatter_add_ref(x, 0, broadcast_1d(idx, {N, D}, 0), src, integer ? 2.0 : 0.5);
    // sums of ~170 terms: f32 accumulation error ~1e-5 relative, then one rounding to dt
    double tol = integer ? 0 : dt == FLAME_DTYPE_BF16 ? 1e-2 : dt == FLAME_DTYPE_F32 ? 1e-5 : 1e-12;
    EXPECT_TRUE(close(got, want, tol, "index_add with repeats", 1.0));
    // The backward of embedding sums the same way: d sum(embedding * src) / d weight.
    if (integer) continue;
    T e, prod, loss;
    FLAME_ASSERT_OK(flame_tensor_set_requires_grad(xt, 1));
    FLAME_ASSERT_OK(flame_embedding(xt, it, FLAME_NO_PADDING, e.out()));
    FLAME_ASSERT_OK(flame_mul(e, st, prod.out()));
    FLAME_ASSERT_OK(flame_sum_all(prod, loss.out()));
    flame_tensor_t l = loss.h, in = xt.h, res = nullptr;
    FLAME_ASSERT_OK(flame_grad(ctx, &l, nullptr, 1, &in, 1, 0, &res));
    T r(res);
    HT gw;
    FLAME_ASSERT_OK(download(r, &gw));
    HT zero(Shape{V, D});
    EXPECT_TRUE(close(gw, scatter_add_ref(zero, 0, broadcast_1d(idx, {N, D}, 0), src), tol, "embedding backward", 1.0));
  }
}

TEST_F(IndexOps, OneHot) {
  HT idx(Shape{2, 3});
  idx.v = {0, 4, 2, 2, 1, 4};
  for (flame_dtype_t idt : {FLAME_DTYPE_I64, FLAME_DTYPE_I32})
    for (int64_t classes : {int64_t{6}, int64_t{-1}}) {
      SCOPED_TRACE(dtname(idt) + " num_classes " + std::to_string(classes));
      T it, out;
      FLAME_ASSERT_OK(upload(ctx, idx, idt, it.out()));
      FLAME_ASSERT_OK(flame_one_hot(it, classes, out.out()));
      int64_t C = classes == -1 ? 5 : classes;
      EXPECT_EQ(shape_of(out), (Shape{2, 3, C}));
      EXPECT_EQ(dtype_of(out), FLAME_DTYPE_I64);
      HT got, want(Shape{2, 3, C});
      for (size_t i = 0; i < idx.v.size(); ++i) want.v[i * C + ix(idx.v[i])] = 1;
      FLAME_ASSERT_OK(download(out, &got));
      EXPECT_TRUE(close(got, want, 0, "one_hot"));
    }
  // Out of range: reported at the next sync.
  T it, out;
  idx.v[4] = 9;
  FLAME_ASSERT_OK(upload(ctx, idx, FLAME_DTYPE_I64, it.out()));
  FLAME_ASSERT_OK(flame_one_hot(it, 6, out.out()));
  FLAME_EXPECT_STATUS(flame_ctx_synchronize(ctx), FLAME_ERROR_INVALID_ARGUMENT);
  std::string msg = flame_last_error_message();
  EXPECT_NE(msg.find("one_hot: index 9 at position 4 is out of range [0, 6)"), std::string::npos) << msg;
  FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));
  // Empty index with inferred classes, and bad class counts.
  const int64_t zero = 0;
  T e;
  FLAME_ASSERT_OK(flame_zeros(ctx, &zero, 1, FLAME_DTYPE_I64, e.out()));
  FLAME_EXPECT_STATUS(flame_one_hot(e, -1, out.out()), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_one_hot(it, 0, out.out()), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_one_hot(it, -2, out.out()), FLAME_ERROR_INVALID_ARGUMENT);
  T f;
  FLAME_ASSERT_OK(flame_zeros(ctx, &zero, 1, FLAME_DTYPE_F32, f.out()));
  FLAME_EXPECT_STATUS(flame_one_hot(f, 3, out.out()), FLAME_ERROR_DTYPE_MISMATCH);
  EXPECT_EQ(out.h, nullptr);
}

TEST_F(IndexOps, OutOfRangeIndicesAreReportedAtTheNextSync) {
  std::mt19937_64 rng(gc::seed() ^ 11);
  HT x = random_ht({4, 5}, rng, -1, 1);
  T xt;
  FLAME_ASSERT_OK(upload(ctx, x, FLAME_DTYPE_F32, xt.out()));
  struct Case {
    const char* what;
    std::function<flame_status_t(flame_tensor_t, flame_tensor_t*)> call;  // (index, out)
    Shape index_shape;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"index_select", [&](flame_tensor_t i, flame_tensor_t* o) { return flame_index_select(xt, 0, i, o); }, {6},
       "index_select: index 4 at position 3 is out of range [0, 4)"},
      {"gather", [&](flame_tensor_t i, flame_tensor_t* o) { return flame_gather(xt, 1, i, o); }, {2, 3},
       "gather: index 5 at position 3 is out of range [0, 5)"},
      {"embedding", [&](flame_tensor_t i, flame_tensor_t* o) { return flame_embedding(xt, i, FLAME_NO_PADDING, o); }, {6},
       "embedding: index 4 at position 3"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    HT idx(c.index_shape);
    for (size_t i = 0; i < idx.v.size(); ++i) idx.v[i] = static_cast<double>(i % 2);
    idx.v[3] = std::string(c.what) == "gather" ? 5 : 4;
    T it, out;
    FLAME_ASSERT_OK(upload(ctx, idx, FLAME_DTYPE_I64, it.out()));
    FLAME_ASSERT_OK(c.call(it, out.out()));
    FLAME_EXPECT_STATUS(flame_ctx_synchronize(ctx), FLAME_ERROR_INVALID_ARGUMENT);
    std::string msg = flame_last_error_message();
    EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
    HT got;
    FLAME_ASSERT_OK(download(out, &got));  // reported once; the context goes on
    bool any_nan = false;
    for (double e : got.v) any_nan = any_nan || std::isnan(e);
    EXPECT_TRUE(any_nan) << "the bad element reads as NaN";
  }
  // scatter: the bad index is reported and its value dropped.
  HT idx(Shape{1, 2}), src(Shape{1, 2}, 1.0);
  idx.v = {-1, 2};
  T it, st, out;
  FLAME_ASSERT_OK(upload(ctx, idx, FLAME_DTYPE_I64, it.out()));
  FLAME_ASSERT_OK(upload(ctx, src, FLAME_DTYPE_F32, st.out()));
  FLAME_ASSERT_OK(flame_scatter_add(xt, 1, it, st, out.out()));
  HT got;
  FLAME_EXPECT_STATUS(download(out, &got), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("scatter_add: index -1 at position 0"), std::string::npos)
      << flame_last_error_message();
  FLAME_ASSERT_OK(download(out, &got));
  HT want = x;
  for (double& e : want.v) e = static_cast<float>(e);
  want.v[2] += 1.0;
  EXPECT_TRUE(close(got, want, 1e-6, "scatter without the bad index"));
}

TEST_F(IndexOps, MaskedFillKeepsIntegersAndBroadcastsTheMask) {
  HT x(Shape{2, 3}), m(Shape{3});
  x.v = {1, 2, 3, 4, 5, 6};
  m.v = {1, 0, 1};
  T xt, mt, out;
  FLAME_ASSERT_OK(upload(ctx, x, FLAME_DTYPE_I32, xt.out()));
  FLAME_ASSERT_OK(upload(ctx, m, FLAME_DTYPE_BOOL, mt.out()));
  FLAME_ASSERT_OK(flame_masked_fill(xt, mt, -7, out.out()));
  EXPECT_EQ(dtype_of(out), FLAME_DTYPE_I32);
  HT got, want(Shape{2, 3});
  want.v = {-7, 2, -7, -7, 5, -7};
  FLAME_ASSERT_OK(download(out, &got));
  EXPECT_TRUE(close(got, want, 0, "masked_fill"));
  // -inf into float scores (attention masks).
  T xf, outf;
  FLAME_ASSERT_OK(upload(ctx, x, FLAME_DTYPE_BF16, xf.out()));
  FLAME_ASSERT_OK(flame_masked_fill(xf, mt, -INFINITY, outf.out()));
  FLAME_ASSERT_OK(download(outf, &got));
  EXPECT_TRUE(std::isinf(got.v[0]) && got.v[0] < 0);
  EXPECT_EQ(got.v[1], 2.0);
}

TEST_F(IndexOps, BadArgumentsGiveTheDocumentedStatusAndNoOutput) {
  const int64_t s23[2] = {2, 3}, s4[1] = {4}, s22[2] = {2, 2}, s33[2] = {3, 3}, s234[3] = {2, 3, 4};
  T x, xu8, scalar, i1, i2, i3, if32, src22, src22f64, src33, mask_bad, mask_f32, w3d;
  FLAME_ASSERT_OK(flame_zeros(ctx, s23, 2, FLAME_DTYPE_F32, x.out()));
  FLAME_ASSERT_OK(flame_zeros(ctx, s23, 2, FLAME_DTYPE_U8, xu8.out()));
  FLAME_ASSERT_OK(flame_zeros(ctx, nullptr, 0, FLAME_DTYPE_F32, scalar.out()));
  FLAME_ASSERT_OK(flame_zeros(ctx, s4, 1, FLAME_DTYPE_I64, i1.out()));
  FLAME_ASSERT_OK(flame_zeros(ctx, s22, 2, FLAME_DTYPE_I64, i2.out()));
  FLAME_ASSERT_OK(flame_zeros(ctx, s33, 2, FLAME_DTYPE_I64, i3.out()));
  FLAME_ASSERT_OK(flame_zeros(ctx, s4, 1, FLAME_DTYPE_F32, if32.out()));
  FLAME_ASSERT_OK(flame_zeros(ctx, s22, 2, FLAME_DTYPE_F32, src22.out()));
  FLAME_ASSERT_OK(flame_zeros(ctx, s22, 2, FLAME_DTYPE_F64, src22f64.out()));
  FLAME_ASSERT_OK(flame_zeros(ctx, s33, 2, FLAME_DTYPE_F32, src33.out()));
  FLAME_ASSERT_OK(flame_zeros(ctx, s234, 3, FLAME_DTYPE_BOOL, mask_bad.out()));
  FLAME_ASSERT_OK(flame_zeros(ctx, s23, 2, FLAME_DTYPE_F32, mask_f32.out()));
  FLAME_ASSERT_OK(flame_zeros(ctx, s234, 3, FLAME_DTYPE_F32, w3d.out()));
  struct Bad {
    const char* what;
    flame_status_t want;
    std::function<flame_status_t(flame_tensor_t*)> call;
  };
  const std::vector<Bad> bad = {
      {"NULL t", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_index_select(nullptr, 0, i1, o); }},
      {"NULL index", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_gather(x, 0, nullptr, o); }},
      {"float index", FLAME_ERROR_DTYPE_MISMATCH, [&](flame_tensor_t* o) { return flame_index_select(x, 0, if32, o); }},
      {"2-D index_select index", FLAME_ERROR_SHAPE_MISMATCH, [&](flame_tensor_t* o) { return flame_index_select(x, 0, i2, o); }},
      {"dim out of range", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_index_select(x, 2, i1, o); }},
      {"0-d input", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_index_select(scalar, 0, i1, o); }},
      {"gather index rank", FLAME_ERROR_SHAPE_MISMATCH, [&](flame_tensor_t* o) { return flame_gather(x, 0, i1, o); }},
      {"gather index too wide", FLAME_ERROR_SHAPE_MISMATCH, [&](flame_tensor_t* o) { return flame_gather(x, 1, i3, o); }},
      {"scatter u8", FLAME_ERROR_DTYPE_MISMATCH, [&](flame_tensor_t* o) { return flame_scatter_add(xu8, 1, i2, src22, o); }},
      {"scatter src dtype", FLAME_ERROR_DTYPE_MISMATCH, [&](flame_tensor_t* o) { return flame_scatter_add(x, 1, i2, src22f64, o); }},
      {"scatter src shape", FLAME_ERROR_SHAPE_MISMATCH, [&](flame_tensor_t* o) { return flame_scatter_add(x, 1, i2, src33, o); }},
      {"index_add source shape", FLAME_ERROR_SHAPE_MISMATCH, [&](flame_tensor_t* o) { return flame_index_add(x, 1, i1, src22, 1.0, o); }},
      {"index_add alpha NaN", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_index_add(x, 0, i1, x, NAN, o); }},
      {"masked_fill mask dtype", FLAME_ERROR_DTYPE_MISMATCH, [&](flame_tensor_t* o) { return flame_masked_fill(x, mask_f32, 1.0, o); }},
      {"masked_fill mask grows", FLAME_ERROR_SHAPE_MISMATCH, [&](flame_tensor_t* o) { return flame_masked_fill(x, mask_bad, 1.0, o); }},
      {"embedding weight rank", FLAME_ERROR_SHAPE_MISMATCH, [&](flame_tensor_t* o) { return flame_embedding(w3d, i1, FLAME_NO_PADDING, o); }},
      {"embedding padding_idx", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_embedding(x, i1, 2, o); }},
      {"embedding float indices", FLAME_ERROR_DTYPE_MISMATCH, [&](flame_tensor_t* o) { return flame_embedding(x, if32, FLAME_NO_PADDING, o); }},
  };
  for (const Bad& b : bad) {
    static int sentinel;
    flame_tensor_t out = reinterpret_cast<flame_tensor_t>(&sentinel);
    flame_status_t st = b.call(&out);
    EXPECT_EQ(st, b.want) << b.what << ": " << flame_status_string(st) << " " << flame_last_error_message();
    EXPECT_EQ(out, nullptr) << b.what;
  }
  FLAME_EXPECT_STATUS(flame_gather(x, 0, i2, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));  // nothing was launched with a bad index
}

}  // namespace

// GPU tests of the composite ops GEGLU, adaLN modulation and the SiLU-gated MLP (flame.h "Composite
// blocks"; src/ops/nn_composites.cpp), which have no kernel or node of their own:
//  - CompositeGradCheck / CompositeGradGradCheck: forward against host float64 references, gradients
//    of every input against finite differences (f64, f32; f16/bf16 for a subset), with
//    non-contiguous inputs, NULL shift or scale, and second order (create_graph) in f64;
//  - CompositeOps: bad arguments (documented status, NULL result).
// Reproduce a failure with FLAME_GRADCHECK_SEED=<seed printed in the failure>.
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "gradcheck.h"

using namespace gc;

namespace {

// ------------------------------------------------------------------ host references

HT geglu_ref(const HT& x, bool tanh_approx) {
  const int64_t C = x.shape.back(), h = C / 2, rows = x.numel() / C;
  Shape s = x.shape;
  s.back() = h;
  HT y(s);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < h; ++i) {
      const double a = x.v[r * C + i], g = x.v[r * C + h + i];
      y.v[r * h + i] = a * (tanh_approx ? gelu_tanh(g) : gelu(g));
    }
  return y;
}

// x [N, ..., C]; shift / scale [N, C] or null.
HT adaln_ref(const HT& x, const HT* shift, const HT* scale) {
  const int64_t N = x.shape[0], C = x.shape.back(), inner = x.numel() / (N * C);
  HT y = x;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < inner; ++k)
      for (int64_t c = 0; c < C; ++c) {
        double& e = y.v[(n * inner + k) * C + c];
        if (scale) e *= 1 + scale->v[n * C + c];
        if (shift) e += shift->v[n * C + c];
      }
  return y;
}

HT swiglu_ref(const HT& x, const HT& w1, const HT& w3, const HT& w2) {
  HT a = matmul(x, transpose(w1, 0, 1)), b = matmul(x, transpose(w3, 0, 1));
  HT h = binary(a, b, [](double u, double v) { return u * sigmoid(u) * v; });
  return matmul(h, transpose(w2, 0, 1));
}

// ------------------------------------------------------------------ the gradcheck table

Row make_row(std::string name, std::vector<Case> cases, FlameFn fwd, RefFn ref) {
  Row r;
  r.name = std::move(name);
  r.cases = std::move(cases);
  r.fwd = std::move(fwd);
  r.ref = std::move(ref);
  return r;
}
FlameFn one(std::function<flame_status_t(const Tensors&, flame_tensor_t*)> f) {
  return [f](const Tensors& in, flame_dtype_t, std::vector<T>& out) {
    out.emplace_back();
    return f(in, out.back().out());
  };
}

const std::vector<Row>& rows() {
  static const std::vector<Row> table = [] {
    std::vector<Row> v;
    auto last = [&v]() -> Row& { return v.back(); };
    for (int approx : {0, 1}) {
      const std::string sfx = approx ? "_tanh" : "";
      v.push_back(make_row("geglu" + sfx, {Case({in({3, 8})}), Case({nc({4, 6})}), Case({in({2, 3, 4})})},
                           one([approx](const Tensors& in, flame_tensor_t* o) { return flame_geglu(in[0], approx, o); }),
                           [approx](const std::vector<HT>& x) { return std::vector<HT>{geglu_ref(x[0], approx != 0)}; }));
      last().low_precision = true;
    }
    // inputs: x, shift, scale (k: which of shift / scale are given)
    auto adaln = [&](std::string name, std::vector<Case> cases, bool has_shift, bool has_scale) {
      v.push_back(make_row(std::move(name), std::move(cases),
                           one([has_shift, has_scale](const Tensors& in, flame_tensor_t* o) {
                             return flame_adaln_modulate(in[0], has_shift ? in[1] : nullptr,
                                                         has_scale ? in[has_shift ? 2 : 1] : nullptr, o);
                           }),
                           [has_shift, has_scale](const std::vector<HT>& x) {
                             return std::vector<HT>{adaln_ref(x[0], has_shift ? &x[1] : nullptr,
                                                              has_scale ? &x[has_shift ? 2 : 1] : nullptr)};
                           }));
    };
    adaln("adaln_modulate", {Case({in({2, 3, 4}), in({2, 4}), in({2, 4})}), Case({nc({2, 3, 5, 4}), nc({2, 4}), in({2, 4})})},
          true, true);
    last().low_precision = true;
    adaln("adaln_modulate_scale_only", {Case({in({3, 2, 5}), in({3, 5})})}, false, true);
    adaln("adaln_modulate_shift_only_2d", {Case({in({2, 4}), in({2, 4})})}, true, false);
    v.push_back(make_row("swiglu_mlp",
                         {Case({in({3, 4}), in({5, 4}), in({5, 4}), in({6, 5})}),
                          Case({in({2, 3, 4}), nc({5, 4}), in({5, 4}), nc({3, 5})})},
                         one([](const Tensors& in, flame_tensor_t* o) { return flame_swiglu_mlp(in[0], in[1], in[2], in[3], o); }),
                         [](const std::vector<HT>& x) { return std::vector<HT>{swiglu_ref(x[0], x[1], x[2], x[3])}; }));
    last().low_precision = true;
    last().tol_scale = 2;  // f16/bf16: two products of rounded operands before the last one
    return v;
  }();
  return table;
}

TEST(CompositeTable, RowNamesAreUnique) {
  std::set<std::string> names;
  for (const Row& r : rows()) EXPECT_TRUE(names.insert(r.name).second) << r.name;
}

FLAME_GRADCHECK_SUITES(Composites, CompositeGradCheck, CompositeGradGradCheck, rows, 0x60bee2bee120fc15ull);

// ------------------------------------------------------------------ direct tests

class CompositeOps : public GpuTest {};

TEST_F(CompositeOps, BadArgumentsGiveTheDocumentedStatusAndNoOutput) {
  const int64_t s35[2] = {3, 5}, s34[2] = {3, 4}, s234[3] = {2, 3, 4}, s24[2] = {2, 4}, s25[2] = {2, 5}, s4[1] = {4};
  const int64_t s54[2] = {5, 4}, s55[2] = {5, 5}, s65[2] = {6, 5}, s64[2] = {6, 4};
  T odd, x34, xi, x3, p24, p25, p24d, w54, w55, w65, w64, w54d, v4;
  FLAME_ASSERT_OK(flame_ones(ctx, s35, 2, FLAME_DTYPE_F32, odd.out()));
  FLAME_ASSERT_OK(flame_ones(ctx, s34, 2, FLAME_DTYPE_F32, x34.out()));
  FLAME_ASSERT_OK(flame_ones(ctx, s34, 2, FLAME_DTYPE_I32, xi.out()));
  FLAME_ASSERT_OK(flame_ones(ctx, s234, 3, FLAME_DTYPE_F32, x3.out()));
  FLAME_ASSERT_OK(flame_ones(ctx, s24, 2, FLAME_DTYPE_F32, p24.out()));
  FLAME_ASSERT_OK(flame_ones(ctx, s25, 2, FLAME_DTYPE_F32, p25.out()));
  FLAME_ASSERT_OK(flame_ones(ctx, s24, 2, FLAME_DTYPE_F64, p24d.out()));
  FLAME_ASSERT_OK(flame_ones(ctx, s54, 2, FLAME_DTYPE_F32, w54.out()));
  FLAME_ASSERT_OK(flame_ones(ctx, s55, 2, FLAME_DTYPE_F32, w55.out()));
  FLAME_ASSERT_OK(flame_ones(ctx, s65, 2, FLAME_DTYPE_F32, w65.out()));
  FLAME_ASSERT_OK(flame_ones(ctx, s64, 2, FLAME_DTYPE_F32, w64.out()));
  FLAME_ASSERT_OK(flame_ones(ctx, s54, 2, FLAME_DTYPE_F64, w54d.out()));
  FLAME_ASSERT_OK(flame_ones(ctx, s4, 1, FLAME_DTYPE_F32, v4.out()));
  struct Bad {
    const char* what;
    flame_status_t want;
    std::function<flame_status_t(flame_tensor_t*)> call;
  };
  const std::vector<Bad> bad = {
      {"geglu NULL", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_geglu(nullptr, 0, o); }},
      {"geglu odd", FLAME_ERROR_SHAPE_MISMATCH, [&](flame_tensor_t* o) { return flame_geglu(odd, 0, o); }},
      {"geglu integer", FLAME_ERROR_DTYPE_MISMATCH, [&](flame_tensor_t* o) { return flame_geglu(xi, 0, o); }},
      {"geglu approximate 2", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_geglu(x34, 2, o); }},
      {"adaln 1-D x", FLAME_ERROR_SHAPE_MISMATCH, [&](flame_tensor_t* o) { return flame_adaln_modulate(v4, nullptr, nullptr, o); }},
      {"adaln shift shape", FLAME_ERROR_SHAPE_MISMATCH, [&](flame_tensor_t* o) { return flame_adaln_modulate(x3, p25, nullptr, o); }},
      {"adaln scale dtype", FLAME_ERROR_DTYPE_MISMATCH, [&](flame_tensor_t* o) { return flame_adaln_modulate(x3, p24, p24d, o); }},
      {"adaln integer x", FLAME_ERROR_DTYPE_MISMATCH, [&](flame_tensor_t* o) { return flame_adaln_modulate(xi, nullptr, nullptr, o); }},
      {"swiglu NULL w2", FLAME_ERROR_INVALID_ARGUMENT, [&](flame_tensor_t* o) { return flame_swiglu_mlp(x34, w54, w54, nullptr, o); }},
      {"swiglu w3 shape", FLAME_ERROR_SHAPE_MISMATCH, [&](flame_tensor_t* o) { return flame_swiglu_mlp(x34, w54, w55, w65, o); }},
      {"swiglu w2 shape", FLAME_ERROR_SHAPE_MISMATCH, [&](flame_tensor_t* o) { return flame_swiglu_mlp(x34, w54, w54, w64, o); }},
      {"swiglu in size", FLAME_ERROR_SHAPE_MISMATCH, [&](flame_tensor_t* o) { return flame_swiglu_mlp(odd, w54, w54, w65, o); }},
      {"swiglu dtype", FLAME_ERROR_DTYPE_MISMATCH, [&](flame_tensor_t* o) { return flame_swiglu_mlp(x34, w54d, w54, w65, o); }},
  };
  for (const Bad& b : bad) {
    flame_tensor_t out = reinterpret_cast<flame_tensor_t>(static_cast<uintptr_t>(0x10));
    flame_status_t st = b.call(&out);
    EXPECT_EQ(st, b.want) << b.what << ": " << flame_status_string(st) << " " << flame_last_error_message();
    EXPECT_EQ(out, nullptr) << b.what;
    if (st == FLAME_OK && out) flame_tensor_release(out);
  }
  T ok;
  FLAME_ASSERT_OK(flame_adaln_modulate(x3, p24, p24, ok.out()));
  FLAME_ASSERT_OK(flame_swiglu_mlp(x34, w54, w54, w65, ok.out()));
}

}  // namespace

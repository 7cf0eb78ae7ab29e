// Table-driven gradient checks: one row per differentiable op form, compared with central finite
// differences of a host float64 reference (see gradcheck.h), in f64 and f32 (and f16/bf16 for a
// subset), with broadcasting and non-contiguous inputs, plus a second-order (create_graph) check.
// Ops that are not differentiable have rows in a second table. Both tables count for the op-list
// coverage test (test_op_coverage.cpp), which fails when an op of src/tensor/op_list.h has no row.
//
// Reproduce a failure with FLAME_GRADCHECK_SEED=<seed printed in the failure>.
#include <cmath>
#include <map>
#include <set>

#include "gradcheck.h"
#include "attention_ref.h"

using namespace gc;

namespace {

using UnaryC = flame_status_t (*)(flame_tensor_t, flame_tensor_t*);
using BinaryC = flame_status_t (*)(flame_tensor_t, flame_tensor_t, flame_tensor_t*);
using ReduceC = flame_status_t (*)(flame_tensor_t, const int32_t*, int32_t, int32_t, flame_tensor_t*);
using OneFn = std::function<flame_status_t(const Tensors&, flame_dtype_t, flame_tensor_t*)>;
using Dims = std::vector<int32_t>;

// Wraps a single-output call.
FlameFn one(OneFn f) {
  return [f](const Tensors& in, flame_dtype_t dt, std::vector<T>& out) {
    out.emplace_back();
    return f(in, dt, out.back().out());
  };
}
RefFn one_ref(std::function<HT(const std::vector<HT>&)> f) {
  return [f](const std::vector<HT>& x) { return std::vector<HT>{f(x)}; };
}

const int32_t* dptr(const Dims& d) { return d.empty() ? nullptr : d.data(); }
std::vector<int> idims(const Dims& d) { return std::vector<int>(d.begin(), d.end()); }

// Makes every input's magnitudes pairwise distinct (gaps of at least ~0.9/numel), with random
// signs: max/min/norm_inf then have no near-ties that finite differences would straddle.
void spread(std::vector<HT>& xs) {
  for (HT& x : xs) {
    size_t n = x.v.size();
    if (n < 2) continue;
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return std::fabs(x.v[a]) < std::fabs(x.v[b]); });
    const double step = 1.8 / static_cast<double>(n);
    for (size_t k = 0; k < n; ++k) {
      double frac = std::fabs(x.v[order[k]]) * 0.25 / 2.0;  // in [0, 0.25): keeps the draw's randomness
      double mag = 0.2 + (static_cast<double>(k) + 0.25 + frac) * step;
      x.v[order[k]] = x.v[order[k]] < 0 ? -mag : mag;
    }
  }
}

struct Table {
  std::vector<Row> rows;

  Row& add(std::string name, std::vector<std::string> covers, std::vector<Case> cases, FlameFn fwd, RefFn ref) {
    Row r;
    r.name = std::move(name);
    r.covers = std::move(covers);
    r.cases = std::move(cases);
    r.fwd = std::move(fwd);
    r.ref = std::move(ref);
    rows.push_back(std::move(r));
    return rows.back();
  }

  // Unary elementwise: contiguous, transposed, 0-d and strided 1-d inputs.
  Row& unary(std::string name, std::string covers, std::function<flame_status_t(flame_tensor_t, flame_tensor_t*)> fn,
             std::function<double(double)> f, Domain d) {
    std::vector<Case> cases = {{{in({3, 5}, d)}}, {{nc({4, 3}, d)}}, {{in({}, d)}}, {{nc({7}, d)}}};
    return add(std::move(name), {std::move(covers)}, cases,
               one([fn](const Tensors& x, flame_dtype_t, flame_tensor_t* o) { return fn(x[0], o); }),
               one_ref([f](const std::vector<HT>& x) { return gc::unary(x[0], f); }));
  }

  // Binary elementwise: same shapes, [3,1] op [1,4], rank broadcast, transposed, 0-d, mixed.
  Row& binary(std::string name, std::string covers, BinaryC fn, std::function<double(double, double)> f, Domain da,
              Domain db) {
    std::vector<Case> cases = {{{in({3, 4}, da), in({3, 4}, db)}}, {{in({3, 1}, da), in({1, 4}, db)}},
                               {{in({2, 3, 4}, da), in({4}, db)}}, {{nc({3, 4}, da), nc({3, 4}, db)}},
                               {{in({3, 4}, da), in({}, db)}},     {{in({1, 4}, da), nc({3, 4}, db)}}};
    return add(std::move(name), {std::move(covers)}, cases,
               one([fn](const Tensors& x, flame_dtype_t, flame_tensor_t* o) { return fn(x[0], x[1], o); }),
               one_ref([f](const std::vector<HT>& x) { return gc::binary(x[0], x[1], f); }));
  }

  // A reduction over dims in four forms: one dim, all dims (non-contiguous), keepdim over two
  // dims, the last dim of a 3-d tensor.
  void reduction(const std::string& name, std::vector<std::string> covers,
                 std::function<flame_status_t(flame_tensor_t, const int32_t*, int32_t, int32_t, flame_tensor_t*)> fn,
                 std::function<double(const std::vector<double>&)> r, Domain d, bool low_precision = false,
                 double tol_scale = 1.0, bool distinct = false) {
    struct V { const char* suffix; In input; Dims dims; int keep; };
    std::vector<V> vs = {{"_dim1", in({3, 4}, d), {1}, 0},
                         {"_alldims", nc({3, 4}, d), {}, 0},
                         {"_keepdim02", in({2, 3, 4}, d), {0, 2}, 1},
                         {"_lastdim", in({2, 3, 4}, d), {-1}, 0}};
    for (auto& v : vs) {
      Dims dims = v.dims;
      int keep = v.keep;
      Row& row = add(name + v.suffix, covers, {Case({v.input}, distinct ? spread : nullptr)},
                     one([fn, dims, keep](const Tensors& x, flame_dtype_t, flame_tensor_t* o) {
                       return fn(x[0], dptr(dims), static_cast<int32_t>(dims.size()), keep, o);
                     }),
                     one_ref([r, dims, keep](const std::vector<HT>& x) { return gc::reduce(x[0], idims(dims), keep != 0, r); }));
      row.low_precision = low_precision && std::string(v.suffix) == "_dim1";
      row.tol_scale = tol_scale;
    }
  }
};

Table build_table() {
  Table t;
  // ---- FLAME_UNARY_OPS
  t.unary("neg", "neg", flame_neg, [](double x) { return -x; }, uni());
  t.unary("abs", "abs", flame_abs, [](double x) { return std::fabs(x); }, away0());
  t.unary("exp", "exp", flame_exp, [](double x) { return std::exp(x); }, uni()).low_precision = true;
  t.unary("log", "log", flame_log, [](double x) { return std::log(x); }, uni(0.5, 3));
  t.unary("log1p", "log1p", flame_log1p, [](double x) { return std::log1p(x); }, uni(-0.5, 2));
  t.unary("expm1", "expm1", flame_expm1, [](double x) { return std::expm1(x); }, uni());
  t.unary("sqrt", "sqrt", flame_sqrt, [](double x) { return std::sqrt(x); }, uni(0.5, 3));
  t.unary("rsqrt", "rsqrt", flame_rsqrt, [](double x) { return 1 / std::sqrt(x); }, uni(0.5, 3));
  t.unary("sin", "sin", flame_sin, [](double x) { return std::sin(x); }, uni(-3, 3));
  t.unary("cos", "cos", flame_cos, [](double x) { return std::cos(x); }, uni(-3, 3));
  t.unary("tanh", "tanh", flame_tanh, [](double x) { return std::tanh(x); }, uni()).low_precision = true;
  t.unary("sigmoid", "sigmoid", flame_sigmoid, gc::sigmoid, uni(-4, 4)).low_precision = true;
  t.unary("relu", "relu", flame_relu, [](double x) { return x > 0 ? x : 0.0; }, away0());
  t.unary("silu", "silu", flame_silu, [](double x) { return x * gc::sigmoid(x); }, uni(-4, 4)).low_precision = true;
  t.unary("floor", "floor", flame_floor, [](double x) { return std::floor(x); }, halfgrid()).second_order = false;
  t.unary("ceil", "ceil", flame_ceil, [](double x) { return std::ceil(x); }, halfgrid()).second_order = false;
  t.unary("round", "round", flame_round, gc::round_half_even, halfgrid()).second_order = false;
  t.unary("sign", "sign", flame_sign, gc::sign, away0()).second_order = false;
  t.unary("reciprocal", "reciprocal", flame_reciprocal, [](double x) { return 1 / x; }, away0(-2, 2, 0.5));
  t.unary("square", "square", flame_square, [](double x) { return x * x; }, uni());

  // ---- FLAME_SCALAR_OPS (and the API forms built on them)
  auto scalar = [&t](std::string name, std::string covers, flame_status_t (*fn)(flame_tensor_t, double, flame_tensor_t*),
                     double s, std::function<double(double, double)> f, Domain d) -> Row& {
    return t.unary(std::move(name), std::move(covers),
                   [fn, s](flame_tensor_t x, flame_tensor_t* o) { return fn(x, s, o); },
                   [f, s](double x) { return f(x, s); }, d);
  };
  scalar("add_scalar", "add_scalar", flame_add_scalar, 1.5, [](double x, double s) { return x + s; }, uni());
  scalar("sub_scalar", "sub_scalar", flame_sub_scalar, 0.75, [](double x, double s) { return x - s; }, uni());
  scalar("mul_scalar", "mul_scalar", flame_mul_scalar, -2.5, [](double x, double s) { return x * s; }, uni());
  scalar("div_scalar", "mul_scalar", flame_div_scalar, 4.0, [](double x, double s) { return x / s; }, uni());
  scalar("rsub_scalar", "rsub_scalar", flame_rsub_scalar, 3.0, [](double x, double s) { return s - x; }, uni());
  scalar("pow_scalar", "pow_scalar", flame_pow_scalar, 2.5, [](double x, double s) { return std::pow(x, s); }, uni(0.5, 2));
  scalar("pow_scalar_int", "pow_scalar", flame_pow_scalar, 3.0, [](double x, double s) { return std::pow(x, s); }, uni());
  scalar("pow_scalar_neg", "pow_scalar", flame_pow_scalar, -1.5, [](double x, double s) { return std::pow(x, s); },
         uni(0.5, 2));
  scalar("leaky_relu", "leaky_relu", flame_leaky_relu, 0.1, [](double x, double s) { return x > 0 ? x : s * x; }, away0());
  scalar("elu", "elu", flame_elu, 1.3, [](double x, double a) { return x > 0 ? x : a * std::expm1(x); }, away0());

  // ---- FLAME_SPECIAL_UNARY_OPS
  // Their second-order checks run the rules of the internal nodes their backward records.
  t.unary("gelu", "gelu", [](flame_tensor_t x, flame_tensor_t* o) { return flame_gelu(x, 0, o); }, gc::gelu, uni(-3, 3))
      .low_precision = true;
  t.rows.back().covers.push_back("gelu_deriv");
  t.unary("gelu_tanh", "gelu_tanh", [](flame_tensor_t x, flame_tensor_t* o) { return flame_gelu(x, 1, o); }, gc::gelu_tanh,
          uni(-3, 3));
  t.rows.back().covers.push_back("gelu_tanh_backward");
  t.unary("softplus", "softplus", [](flame_tensor_t x, flame_tensor_t* o) { return flame_softplus(x, 2.0, 4.0, o); },
          [](double x) { return gc::softplus(x, 2.0, 4.0); }, away(-3, 3, {2.0}));
  t.unary("softplus_default", "softplus", [](flame_tensor_t x, flame_tensor_t* o) { return flame_softplus(x, 1.0, 20.0, o); },
          [](double x) { return gc::softplus(x, 1.0, 20.0); }, uni(-4, 4));
  t.unary("clamp", "clamp", [](flame_tensor_t x, flame_tensor_t* o) { return flame_clamp(x, -0.5, 0.8, o); },
          [](double x) { return std::min(std::max(x, -0.5), 0.8); }, away(-2, 2, {-0.5, 0.8}));
  t.unary("clamp_min", "clamp", [](flame_tensor_t x, flame_tensor_t* o) { return flame_clamp(x, 0.25, INFINITY, o); },
          [](double x) { return std::max(x, 0.25); }, away(-2, 2, {0.25}));
  t.unary("clamp_max", "clamp", [](flame_tensor_t x, flame_tensor_t* o) { return flame_clamp(x, -INFINITY, -0.25, o); },
          [](double x) { return std::min(x, -0.25); }, away(-2, 2, {-0.25}));

  // ---- FLAME_BINARY_OPS (arithmetic)
  t.binary("add", "add", flame_add, [](double a, double b) { return a + b; }, uni(), uni()).low_precision = true;
  t.binary("sub", "sub", flame_sub, [](double a, double b) { return a - b; }, uni(), uni());
  t.binary("mul", "mul", flame_mul, [](double a, double b) { return a * b; }, uni(), uni()).low_precision = true;
  t.binary("div", "div", flame_div, [](double a, double b) { return a / b; }, uni(), away0(-2, 2, 0.5)).low_precision = true;
  t.binary("pow", "pow", flame_pow, [](double a, double b) { return std::pow(a, b); }, uni(0.5, 2), uni(-2, 2));
  t.binary("maximum", "maximum", flame_maximum, [](double a, double b) { return std::max(a, b); }, grid(0.25), grid(0.75));
  t.binary("minimum", "minimum", flame_minimum, [](double a, double b) { return std::min(a, b); }, grid(0.25), grid(0.75));

  // ---- where
  t.add("where", {"where"},
        {{{cond({3, 4}), in({3, 4}), in({3, 4})}},
         {{cond({3, 1}), in({1, 4}), in({3, 4})}},
         {{cond({3, 4}), nc({3, 4}), in({})}},
         {{cond({2, 3, 4}), in({4}), nc({3, 4})}}},
        one([](const Tensors& x, flame_dtype_t, flame_tensor_t* o) { return flame_where(x[0], x[1], x[2], o); }),
        one_ref([](const std::vector<HT>& x) {
          return gc::ternary(x[0], x[1], x[2], [](double c, double a, double b) { return c != 0 ? a : b; });
        }))
      .low_precision = true;

  // ---- casts and copies
  t.add("to_dtype", {"to_dtype"}, {{{in({3, 4})}}, {{nc({3, 4})}}},
        one([](const Tensors& x, flame_dtype_t dt, flame_tensor_t* o) {
          return flame_to_dtype(x[0], dt == FLAME_DTYPE_F64 ? FLAME_DTYPE_F32 : FLAME_DTYPE_F64, o);
        }),
        one_ref([](const std::vector<HT>& x) { return x[0]; }))
      .low_precision = true;
  t.add("to_same_dtype", {"to_dtype"}, {{{in({3, 4})}}},
        one([](const Tensors& x, flame_dtype_t dt, flame_tensor_t* o) { return flame_to_dtype(x[0], dt, o); }),
        one_ref([](const std::vector<HT>& x) { return x[0]; }));
  t.add("contiguous", {"contiguous"}, {{{nc({3, 4})}}, {{in({3, 4})}}, {{nc({5})}}},
        one([](const Tensors& x, flame_dtype_t, flame_tensor_t* o) { return flame_contiguous(x[0], o); }),
        one_ref([](const std::vector<HT>& x) { return x[0]; }));
  t.add("clone", {"contiguous"}, {{{nc({3, 4})}}, {{in({3, 4})}}},
        one([](const Tensors& x, flame_dtype_t, flame_tensor_t* o) { return flame_clone(x[0], o); }),
        one_ref([](const std::vector<HT>& x) { return x[0]; }));

  // ---- views and shape ops
  auto reshape_row = [&t](std::string name, In input, Shape shape, bool view_only) {
    t.add(std::move(name), {"reshape"}, {{{std::move(input)}}},
          one([shape, view_only](const Tensors& x, flame_dtype_t, flame_tensor_t* o) {
            return view_only ? flame_view(x[0], shape.data(), static_cast<int32_t>(shape.size()), o)
                             : flame_reshape(x[0], shape.data(), static_cast<int32_t>(shape.size()), o);
          }),
          one_ref([shape](const std::vector<HT>& x) { return gc::reshape(x[0], shape); }));
  };
  reshape_row("reshape", in({3, 4}), {2, 6}, false);
  reshape_row("reshape_copy", nc({3, 4}), {12}, false);
  reshape_row("reshape_infer", in({2, 3, 4}), {4, -1}, false);
  reshape_row("view", in({3, 4}), {2, 2, 3}, true);

  auto permute_row = [&t](std::string name, In input, std::vector<int32_t> dims) {
    t.add(std::move(name), {"permute"}, {{{std::move(input)}}},
          one([dims](const Tensors& x, flame_dtype_t, flame_tensor_t* o) {
            return flame_permute(x[0], dims.data(), static_cast<int32_t>(dims.size()), o);
          }),
          one_ref([dims](const std::vector<HT>& x) { return gc::permute(x[0], std::vector<int>(dims.begin(), dims.end())); }));
  };
  permute_row("permute", in({2, 3, 4}), {2, 0, 1});
  permute_row("permute_nc", nc({3, 4}), {1, 0});
  t.add("transpose", {"permute"}, {{{in({2, 3, 4})}}, {{nc({2, 3, 4})}}},
        one([](const Tensors& x, flame_dtype_t, flame_tensor_t* o) { return flame_transpose(x[0], 0, 2, o); }),
        one_ref([](const std::vector<HT>& x) { return gc::transpose(x[0], 0, 2); }));

  auto expand_row = [&t](std::string name, In input, Shape shape) {
    t.add(std::move(name), {"expand"}, {{{std::move(input)}}},
          one([shape](const Tensors& x, flame_dtype_t, flame_tensor_t* o) {
            return flame_expand(x[0], shape.data(), static_cast<int32_t>(shape.size()), o);
          }),
          one_ref([shape](const std::vector<HT>& x) {
            Shape s = shape;
            size_t off = s.size() - x[0].shape.size();
            for (size_t i = 0; i < x[0].shape.size(); ++i)
              if (s[off + i] == -1) s[off + i] = x[0].shape[i];
            return gc::expand(x[0], s);
          }));
  };
  expand_row("expand", in({3, 1}), {2, 3, 4});
  expand_row("expand_rank", in({4}), {3, 4});
  expand_row("expand_keep", in({1, 4}), {3, -1});
  expand_row("expand_nc", nc({1, 4}), {2, 3, 4});

  t.add("squeeze", {"reshape", "view_slice"}, {{{in({3, 1, 4})}}},
        one([](const Tensors& x, flame_dtype_t, flame_tensor_t* o) { return flame_squeeze(x[0], 1, o); }),
        one_ref([](const std::vector<HT>& x) { return gc::reshape(x[0], {3, 4}); }));
  t.add("squeeze_all", {"reshape", "view_slice"}, {{{in({1, 3, 1, 4})}}},
        one([](const Tensors& x, flame_dtype_t, flame_tensor_t* o) { return flame_squeeze_all(x[0], o); }),
        one_ref([](const std::vector<HT>& x) { return gc::reshape(x[0], {3, 4}); }));
  t.add("unsqueeze", {"reshape", "view_slice"}, {{{in({3, 4})}}, {{nc({3, 4})}}},
        one([](const Tensors& x, flame_dtype_t, flame_tensor_t* o) { return flame_unsqueeze(x[0], 1, o); }),
        one_ref([](const std::vector<HT>& x) { return gc::unsqueeze(x[0], 1); }));
  t.add("unsqueeze_last", {"reshape", "view_slice"}, {{{in({3, 4})}}},
        one([](const Tensors& x, flame_dtype_t, flame_tensor_t* o) { return flame_unsqueeze(x[0], -1, o); }),
        one_ref([](const std::vector<HT>& x) { return gc::unsqueeze(x[0], 2); }));

  t.add("narrow", {"view_slice", "view_scatter"}, {{{in({5, 4})}}, {{nc({5, 4})}}},
        one([](const Tensors& x, flame_dtype_t, flame_tensor_t* o) { return flame_narrow(x[0], 0, 1, 3, o); }),
        one_ref([](const std::vector<HT>& x) { return gc::slice(x[0], 0, 1, 4, 1); }));
  t.add("slice_step", {"view_slice", "view_scatter"}, {{{in({7, 3})}}},
        one([](const Tensors& x, flame_dtype_t, flame_tensor_t* o) { return flame_slice(x[0], 0, 1, 7, 2, o); }),
        one_ref([](const std::vector<HT>& x) { return gc::slice(x[0], 0, 1, 7, 2); }));
  t.add("slice_negative_clamped", {"view_slice", "view_scatter"}, {{{in({3, 8})}}, {{nc({3, 8})}}},
        one([](const Tensors& x, flame_dtype_t, flame_tensor_t* o) { return flame_slice(x[0], -1, -6, 100, 3, o); }),
        one_ref([](const std::vector<HT>& x) { return gc::slice(x[0], 1, 2, 8, 3); }));
  t.add("select", {"view_slice", "view_scatter"}, {{{in({3, 4})}}, {{nc({3, 4})}}},
        one([](const Tensors& x, flame_dtype_t, flame_tensor_t* o) { return flame_select(x[0], 1, 2, o); }),
        one_ref([](const std::vector<HT>& x) { return gc::select(x[0], 1, 2); }));
  t.add("select_negative", {"view_slice", "view_scatter"}, {{{in({3, 4})}}},
        one([](const Tensors& x, flame_dtype_t, flame_tensor_t* o) { return flame_select(x[0], 0, -1, o); }),
        one_ref([](const std::vector<HT>& x) { return gc::select(x[0], 0, -1); }));
  t.add("flip", {"view_slice", "view_scatter"}, {{{in({3, 4})}}, {{nc({3, 4})}}},
        one([](const Tensors& x, flame_dtype_t, flame_tensor_t* o) {
          const int32_t d[2] = {0, 1};
          return flame_flip(x[0], d, 2, o);
        }),
        one_ref([](const std::vector<HT>& x) { return gc::flip(x[0], {0, 1}); }));
  t.add("flip_middle", {"view_slice", "view_scatter"}, {{{in({2, 3, 4})}}},
        one([](const Tensors& x, flame_dtype_t, flame_tensor_t* o) {
          const int32_t d[1] = {1};
          return flame_flip(x[0], d, 1, o);
        }),
        one_ref([](const std::vector<HT>& x) { return gc::flip(x[0], {1}); }));
  t.add("diagonal", {"view_slice", "view_scatter"}, {{{in({4, 5})}}, {{nc({5, 4})}}},
        one([](const Tensors& x, flame_dtype_t, flame_tensor_t* o) { return flame_diagonal(x[0], 1, 0, 1, o); }),
        one_ref([](const std::vector<HT>& x) { return gc::diagonal(x[0], 1, 0, 1); }));
  t.add("diagonal_batched", {"view_slice", "view_scatter"}, {{{in({2, 3, 4})}}},
        one([](const Tensors& x, flame_dtype_t, flame_tensor_t* o) { return flame_diagonal(x[0], -1, 1, 2, o); }),
        one_ref([](const std::vector<HT>& x) { return gc::diagonal(x[0], -1, 1, 2); }));

  // ---- cat / stack / split / chunk
  t.add("cat_dim1", {"cat"}, {{{in({2, 3}), in({2, 1}), nc({2, 4})}}},
        one([](const Tensors& x, flame_dtype_t, flame_tensor_t* o) { return flame_cat(x.data(), 3, 1, o); }),
        one_ref([](const std::vector<HT>& x) { return gc::cat(x, 1); }));
  t.add("cat_dim0", {"cat"}, {{{in({2, 3}), nc({1, 3})}}, {{in({4}), in({3})}}},
        one([](const Tensors& x, flame_dtype_t, flame_tensor_t* o) { return flame_cat(x.data(), 2, 0, o); }),
        one_ref([](const std::vector<HT>& x) { return gc::cat(x, 0); }));
  t.add("stack", {"cat"}, {{{in({3, 4}), nc({3, 4}), in({3, 4})}}},
        one([](const Tensors& x, flame_dtype_t, flame_tensor_t* o) { return flame_stack(x.data(), 3, 0, o); }),
        one_ref([](const std::vector<HT>& x) { return gc::stack(x, 0); }));
  t.add("stack_last", {"cat"}, {{{in({3, 4}), in({3, 4})}}},
        one([](const Tensors& x, flame_dtype_t, flame_tensor_t* o) { return flame_stack(x.data(), 2, -1, o); }),
        one_ref([](const std::vector<HT>& x) { return gc::stack(x, 2); }));
  t.add("split", {"view_slice", "view_scatter"}, {{{in({7, 3})}}, {{nc({7, 3})}}},
        [](const Tensors& x, flame_dtype_t, std::vector<T>& out) {
          flame_tensor_t h[3] = {nullptr, nullptr, nullptr};
          int32_t n = 0;
          flame_status_t st = flame_split(x[0], 3, 0, h, 3, &n);
          for (int i = 0; i < n && st == FLAME_OK; ++i) out.emplace_back(h[i]);
          return st;
        },
        [](const std::vector<HT>& x) {
          return std::vector<HT>{gc::slice(x[0], 0, 0, 3, 1), gc::slice(x[0], 0, 3, 6, 1), gc::slice(x[0], 0, 6, 7, 1)};
        });
  t.add("split_sizes", {"view_slice", "view_scatter"}, {{{in({3, 6})}}},
        [](const Tensors& x, flame_dtype_t, std::vector<T>& out) {
          flame_tensor_t h[3] = {nullptr, nullptr, nullptr};
          const int64_t sizes[3] = {1, 2, 3};
          flame_status_t st = flame_split_sizes(x[0], sizes, 3, 1, h);
          for (int i = 0; i < 3 && st == FLAME_OK; ++i) out.emplace_back(h[i]);
          return st;
        },
        [](const std::vector<HT>& x) {
          return std::vector<HT>{gc::slice(x[0], 1, 0, 1, 1), gc::slice(x[0], 1, 1, 3, 1), gc::slice(x[0], 1, 3, 6, 1)};
        });
  t.add("chunk", {"view_slice", "view_scatter"}, {{{in({3, 7})}}},
        [](const Tensors& x, flame_dtype_t, std::vector<T>& out) {
          flame_tensor_t h[4] = {nullptr, nullptr, nullptr, nullptr};
          int32_t n = 0;
          flame_status_t st = flame_chunk(x[0], 3, 1, h, 4, &n);
          for (int i = 0; i < n && st == FLAME_OK; ++i) out.emplace_back(h[i]);
          return st;
        },
        [](const std::vector<HT>& x) {
          return std::vector<HT>{gc::slice(x[0], 1, 0, 3, 1), gc::slice(x[0], 1, 3, 6, 1), gc::slice(x[0], 1, 6, 7, 1)};
        });

  // ---- triangles
  t.add("triu", {}, {{{in({4, 5})}}, {{nc({4, 5})}}},
        one([](const Tensors& x, flame_dtype_t, flame_tensor_t* o) { return flame_triu(x[0], 1, o); }),
        one_ref([](const std::vector<HT>& x) { return gc::tri(x[0], 1, true); }));
  t.add("tril", {}, {{{in({2, 4, 4})}}},
        one([](const Tensors& x, flame_dtype_t, flame_tensor_t* o) { return flame_tril(x[0], -1, o); }),
        one_ref([](const std::vector<HT>& x) { return gc::tri(x[0], -1, false); }));

  // ---- reductions
  t.reduction("sum", {"sum"}, flame_sum, r_sum, uni(), true);
  t.reduction("mean", {"sum"}, flame_mean, r_mean, uni(), true);
  t.reduction("prod", {"prod"}, flame_prod, r_prod, away0(-1.6, 1.6, 0.4));
  t.reduction("max", {"max"}, flame_max, r_max, uni(), false, 1.0, true);
  t.reduction("min", {"min"}, flame_min, r_min, uni(), false, 1.0, true);
  t.reduction("logsumexp", {"max", "sum"}, flame_logsumexp, r_logsumexp, uni(), true);
  for (double corr : {1.0, 0.0}) {
    std::string sfx = corr == 1.0 ? "" : "_pop";
    t.reduction("var" + sfx, {"sum"},
                [corr](flame_tensor_t x, const int32_t* d, int32_t n, int32_t k, flame_tensor_t* o) {
                  return flame_var(x, d, n, corr, k, o);
                },
                [corr](const std::vector<double>& e) { return r_var(e, corr); }, uni());
    t.reduction("std" + sfx, {"sum"},
                [corr](flame_tensor_t x, const int32_t* d, int32_t n, int32_t k, flame_tensor_t* o) {
                  return flame_std(x, d, n, corr, k, o);
                },
                [corr](const std::vector<double>& e) { return std::sqrt(r_var(e, corr)); }, uni());
  }
  struct NormP { const char* name; double p; Domain d; };
  for (const NormP& np : {NormP{"norm1", 1.0, away0()}, NormP{"norm2", 2.0, uni()}, NormP{"norm_inf", INFINITY, away0()}}) {
    double p = np.p;
    t.reduction(np.name, {"sum", "max"},
                [p](flame_tensor_t x, const int32_t* d, int32_t n, int32_t k, flame_tensor_t* o) {
                  return flame_norm(x, p, d, n, k, o);
                },
                [p](const std::vector<double>& e) { return r_norm(e, p); }, np.d, false, 1.0, std::isinf(p));
  }
  // prod with exact zeros (one zero in a row, two in another): the gradient is still defined.
  {
    Case zc{{in({3, 4}, away0(-1.6, 1.6, 0.4))}, [](std::vector<HT>& x) {
              x[0].v[1] = 0.0;
              x[0].v[4] = 0.0;
              x[0].v[6] = 0.0;
            }};
    t.add("prod_zeros", {"prod"}, {zc},
          one([](const Tensors& x, flame_dtype_t, flame_tensor_t* o) {
            const int32_t d[1] = {1};
            return flame_prod(x[0], d, 1, 0, o);
          }),
          one_ref([](const std::vector<HT>& x) { return gc::reduce(x[0], {1}, false, r_prod); }));
  }
  auto all_row = [&t](std::string name, std::string covers, UnaryC fn, std::function<double(const std::vector<double>&)> r) {
    t.add(std::move(name), {std::move(covers)}, {Case({in({3, 4})}, spread), Case({nc({3, 4})}, spread), Case({in({})})},
          one([fn](const Tensors& x, flame_dtype_t, flame_tensor_t* o) { return fn(x[0], o); }),
          one_ref([r](const std::vector<HT>& x) { return gc::reduce(x[0], {}, false, r); }));
  };
  all_row("sum_all", "sum", flame_sum_all, r_sum);
  all_row("max_all", "max", flame_max_all, r_max);
  all_row("min_all", "min", flame_min_all, r_min);

  for (int d : {1, 0, -1}) {
    std::string name = d == 1 ? "cumsum_dim1" : (d == 0 ? "cumsum_dim0" : "cumsum_last");
    In input = d == 0 ? nc({4, 3}) : (d == 1 ? in({3, 4}) : in({7}));
    t.add(name, {"cumsum"}, {{{input}}},
          one([d](const Tensors& x, flame_dtype_t, flame_tensor_t* o) { return flame_cumsum(x[0], d, o); }),
          one_ref([d](const std::vector<HT>& x) { return gc::cumsum(x[0], d); }));
  }

  // ---- matrix products (ops/matmul.cpp): transposed leaves, 1-D operands, broadcast and folded batches
  t.add("matmul_2d", {"matmul"}, {{{in({3, 4}), in({4, 5})}}, {{nc({3, 4}), nc({4, 5})}}, {{in({1, 4}), nc({4, 1})}}},
        one([](const Tensors& x, flame_dtype_t, flame_tensor_t* o) { return flame_matmul(x[0], x[1], o); }),
        one_ref([](const std::vector<HT>& x) { return gc::matmul(x[0], x[1]); }))
      .low_precision = true;
  t.add("matmul_vectors", {"matmul"}, {{{in({4}), in({4, 5})}}, {{in({3, 4}), nc({4})}}, {{in({4}), in({4})}}, {{in({4}), in({2, 4, 3})}}},
        one([](const Tensors& x, flame_dtype_t, flame_tensor_t* o) { return flame_matmul(x[0], x[1], o); }),
        one_ref([](const std::vector<HT>& x) { return gc::matmul(x[0], x[1]); }));
  t.add("matmul_batched", {"matmul"},
        {{{in({2, 3, 4}), nc({2, 4, 5})}}, {{in({2, 3, 4}), in({4, 5})}}, {{nc({3, 4}), in({2, 4, 5})}},
         {{in({2, 1, 3, 4}), in({3, 4, 2})}}, {{nc({2, 3, 4}), in({4, 2})}}},
        one([](const Tensors& x, flame_dtype_t, flame_tensor_t* o) { return flame_matmul(x[0], x[1], o); }),
        one_ref([](const std::vector<HT>& x) { return gc::matmul(x[0], x[1]); }))
      .low_precision = true;
  t.add("bmm", {"matmul"}, {{{in({2, 3, 4}), in({2, 4, 5})}}, {{nc({3, 2, 4}), nc({3, 4, 1})}}},
        one([](const Tensors& x, flame_dtype_t, flame_tensor_t* o) { return flame_bmm(x[0], x[1], o); }),
        one_ref([](const std::vector<HT>& x) { return gc::matmul(x[0], x[1]); }));
  // linear: act(x W^T + b). Small x and W with |b| >= 1 keep relu's pre-activation away from its kink.
  {
    auto lin_ref = [](int act, bool bias) {
      return one_ref([act, bias](const std::vector<HT>& x) {
        HT z = gc::matmul(x[0], gc::transpose(x[1], 0, 1));
        if (bias) z = gc::binary(z, x[2], [](double u, double v) { return u + v; });
        if (act == 1) return gc::unary(z, [](double u) { return u > 0 ? u : 0.0; });
        if (act == 2) return gc::unary(z, gc::gelu_tanh);
        return z;
      });
    };
    struct L { const char* name; int act; bool bias; };
    for (const L& l : {L{"linear", 0, false}, L{"linear_bias", 0, true}, L{"linear_relu_bias", 1, true},
                       L{"linear_gelu_bias", 2, true}, L{"linear_gelu", 2, false}}) {
      Domain small = uni(-0.3, 0.3), b = away0(-2, 2, 1.0);
      std::vector<Case> cases = {{{in({3, 4}, small), in({5, 4}, small), in({5}, b)}},
                                 {{in({2, 3, 4}, small), nc({5, 4}, small), in({5}, b)}},
                                 {{nc({4, 3}, small), in({7, 3}, small), in({7}, b)}}};
      if (!l.bias)
        for (Case& c : cases) c.ins.pop_back();
      const int act = l.act;
      const bool bias = l.bias;
      t.add(l.name, {"linear"}, cases,
            one([act, bias](const Tensors& x, flame_dtype_t, flame_tensor_t* o) {
              return flame_linear(x[0], x[1], bias ? x[2] : nullptr, act, o);
            }),
            lin_ref(act, bias))
          .low_precision = true;
    }
  }
  // ---- scaled-dot-product attention: f16/bf16 run the fused kernels (head dim 6 padded into a
  // 64-wide tile), f32/f64 the composed path (whose create_graph gives the second-order rows).
  {
    struct A { const char* name; bool causal; double scale; int mask; };  // mask 0 none, 1 bool, 2 additive
    for (const A& a : {A{"attention", false, 0.0, 0}, A{"attention_causal_scale", true, 0.7, 0},
                       A{"attention_bool_mask", false, 0.0, 1}, A{"attention_additive_mask", true, 0.0, 2}}) {
      const int64_t lq = a.causal ? 5 : 4, lk = a.causal ? 4 : 5;  // causal with more queries than keys
      std::vector<In> ins = {in({1, 2, lq, 6}), in({1, 2, lk, 6}), in({1, 2, lk, 4})};
      std::vector<In> ncs = {nc({1, 2, lq, 6}), in({1, 2, lk, 6}), nc({1, 2, lk, 4})};
      if (a.mask == 1) {
        ins.push_back(cond({lq, lk}));
        ncs.push_back(cond({1, 2, 1, lk}));
      }
      if (a.mask == 2) {
        ins.push_back(in({1, 2, 1, lk}));
        ncs.push_back(in({lq, lk}));
      }
      const A cfg = a;
      t.add(a.name, {"matmul"}, {Case(ins), Case(ncs)},
            one([cfg](const Tensors& x, flame_dtype_t, flame_tensor_t* o) {
              flame_attention_options_t opts;
              flame_attention_options_init(&opts);
              opts.flags = cfg.causal ? FLAME_ATTENTION_CAUSAL : 0;
              opts.scale = cfg.scale;
              return flame_scaled_dot_product_attention(x[0], x[1], x[2], cfg.mask ? x[3] : nullptr, &opts, o);
            }),
            one_ref([cfg](const std::vector<HT>& x) {
              aref::Problem pr;
              pr.B = x[0].shape[0], pr.H = x[0].shape[1], pr.Lq = x[0].shape[2], pr.Lk = x[1].shape[2];
              pr.D = x[0].shape[3], pr.Dv = x[2].shape[3];
              pr.q = x[0].v, pr.k = x[1].v, pr.v = x[2].v;
              pr.causal = cfg.causal;
              pr.scale = cfg.scale;
              if (cfg.mask) {
                const HT m = expand(x[3], {pr.B, pr.H, pr.Lq, pr.Lk});
                const bool is_bool = cfg.mask == 1;
                const int64_t H = pr.H, Lq = pr.Lq, Lk = pr.Lk;
                pr.bias = [m, is_bool, H, Lq, Lk](int64_t b, int64_t h, int64_t i, int64_t j) {
                  const double e = m.v[static_cast<size_t>(((b * H + h) * Lq + i) * Lk + j)];
                  return is_bool ? (e != 0 ? 0.0 : -INFINITY) : e;
                };
              }
              HT out({pr.B, pr.H, pr.Lq, pr.Dv});
              out.v = aref::forward(pr).out;
              return out;
            }))
          .low_precision = true;
    }
  }
  return t;
}

const std::vector<Row>& rows() {
  static const std::vector<Row> r = build_table().rows;
  return r;
}

// Ops whose outputs are not differentiable (bool / integer results): they must work on inputs that
// require grad and give outputs that do not.
const std::vector<NdRow>& nd_rows() {
  static const std::vector<NdRow> r = [] {
    std::vector<NdRow> v;
    auto bin = [&v](const char* name, BinaryC fn) {
      v.push_back({name, {name}, 2, [fn](const Tensors& x, flame_tensor_t* o) { return fn(x[0], x[1], o); }});
    };
    auto un = [&v](const char* name, UnaryC fn) {
      v.push_back({name, {name}, 1, [fn](const Tensors& x, flame_tensor_t* o) { return fn(x[0], o); }});
    };
    bin("eq", flame_eq);
    bin("ne", flame_ne);
    bin("lt", flame_lt);
    bin("le", flame_le);
    bin("gt", flame_gt);
    bin("ge", flame_ge);
    bin("logical_and", flame_logical_and);
    bin("logical_or", flame_logical_or);
    un("logical_not", flame_logical_not);
    un("isnan", flame_isnan);
    un("isinf", flame_isinf);
    v.push_back({"argmax", {"argmax"}, 1, [](const Tensors& x, flame_tensor_t* o) { return flame_argmax(x[0], 1, 0, o); }});
    v.push_back({"argmin", {"argmin"}, 1, [](const Tensors& x, flame_tensor_t* o) { return flame_argmin(x[0], 1, 0, o); }});
    v.push_back({"argmax_all", {"argmax"}, 1,
                 [](const Tensors& x, flame_tensor_t* o) { return flame_argmax(x[0], FLAME_DIM_ALL, 0, o); }});
    return v;
  }();
  return r;
}

// The op-list coverage test (test_op_coverage.cpp) reads what the not-differentiable rows cover.
const bool kNotDifferentiableCovered = gc::register_covers(nd_rows());

TEST(GradCheckTable, RowNamesAreUnique) {
  std::set<std::string> seen;
  for (const Row& r : rows()) EXPECT_TRUE(seen.insert(r.name).second) << r.name;
}

// ------------------------------------------------------------------ parameterised checks

FLAME_GRADCHECK_SUITES(Ops, GradCheck, GradGradCheck, rows, 0x9e3779b97f4a7c15ull);

// ------------------------------------------------------------------ not-differentiable ops

class NotDifferentiable : public GpuTest, public ::testing::WithParamInterface<size_t> {};

TEST_P(NotDifferentiable, WorksOnInputsThatRequireGradAndGivesNoGrad) {
  const NdRow& row = nd_rows()[GetParam()];
  std::mt19937_64 rng(gc::case_seed(0x9e3779b97f4a7c15ull, row.name, 0, 0));
  for (int grad_mode : {1, 0}) {
    SCOPED_TRACE(row.name + (grad_mode ? " (grad mode on)" : " (grad mode off)"));
    int32_t prev = -1;
    FLAME_ASSERT_OK(flame_ctx_set_grad_enabled(ctx, grad_mode, &prev));
    std::vector<T> xs(static_cast<size_t>(row.n_inputs));
    Tensors raw;
    for (auto& x : xs) {
      HT h(Shape{3, 4});
      for (auto& e : h.v) e = std::nearbyint(uni(-2, 2).draw(rng));  // integers, so eq/le ties happen
      FLAME_ASSERT_OK(upload(ctx, h, FLAME_DTYPE_F32, x.out()));
      FLAME_ASSERT_OK(flame_tensor_set_requires_grad(x, 1));
      raw.push_back(x);
    }
    T out;
    FLAME_ASSERT_OK(row.fn(raw, out.out()));
    int32_t rg = -1;
    FLAME_ASSERT_OK(flame_tensor_requires_grad(out, &rg));
    EXPECT_EQ(rg, 0);
    EXPECT_FALSE(is_floating(dtype_of(out))) << "output dtype " << flame_dtype_name(dtype_of(out));
    FLAME_ASSERT_OK(flame_ctx_set_grad_enabled(ctx, prev, nullptr));
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, NotDifferentiable, ::testing::Range<size_t>(0, nd_rows().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) { return nd_rows()[info.param].name; });

// ------------------------------------------------------------------ PyTorch's tie and kink rules

// Backward of sum(f(x) * w) for a given w, returned as host values.
struct Grads {
  std::vector<HT> g;
};

void grad_of(flame_ctx_t ctx, const std::vector<HT>& xs, const std::function<flame_status_t(const Tensors&, flame_tensor_t*)>& f,
             Grads* out) {
  std::vector<T> leaves(xs.size());
  Tensors raw;
  for (size_t i = 0; i < xs.size(); ++i) {
    FLAME_ASSERT_OK(upload(ctx, xs[i], FLAME_DTYPE_F64, leaves[i].out()));
    FLAME_ASSERT_OK(flame_tensor_set_requires_grad(leaves[i], 1));
    raw.push_back(leaves[i]);
  }
  T y, loss;
  FLAME_ASSERT_OK(f(raw, y.out()));
  FLAME_ASSERT_OK(flame_sum_all(y, loss.out()));
  FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
  for (auto& l : leaves) {
    T g;
    FLAME_ASSERT_OK(flame_tensor_grad(l, g.out()));
    ASSERT_NE(g.h, nullptr);
    HT h;
    FLAME_ASSERT_OK(download(g, &h));
    out->g.push_back(h);
  }
}

void expect_values(const HT& got, const std::vector<double>& want) {
  ASSERT_EQ(got.v.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got.v[i], want[i], 1e-12) << "element " << i;
}

HT host(Shape s, std::vector<double> v) {
  HT h(std::move(s));
  h.v = std::move(v);
  return h;
}

using GradRules = GpuTest;

TEST_F(GradRules, MaxAndMinSplitGradientEvenlyBetweenTies) {
  Grads g;
  grad_of(ctx, {host({2, 3}, {1, 3, 3, 2, 2, 0})},
          [](const Tensors& x, flame_tensor_t* o) { const int32_t d = 1; return flame_max(x[0], &d, 1, 0, o); }, &g);
  if (HasFatalFailure()) return;
  expect_values(g.g[0], {0, 0.5, 0.5, 0.5, 0.5, 0});
  Grads m;
  grad_of(ctx, {host({2, 3}, {1, 1, 3, 0, 2, 0})},
          [](const Tensors& x, flame_tensor_t* o) { const int32_t d = 1; return flame_min(x[0], &d, 1, 0, o); }, &m);
  if (HasFatalFailure()) return;
  expect_values(m.g[0], {0.5, 0.5, 0, 0.5, 0, 0.5});
  Grads a;
  grad_of(ctx, {host({2, 2}, {3, 1, 3, 3})}, [](const Tensors& x, flame_tensor_t* o) { return flame_max_all(x[0], o); }, &a);
  if (HasFatalFailure()) return;
  expect_values(a.g[0], {1.0 / 3, 0, 1.0 / 3, 1.0 / 3});
  Grads n;
  grad_of(ctx, {host({4}, {-2, 5, -2, 0})}, [](const Tensors& x, flame_tensor_t* o) { return flame_min_all(x[0], o); }, &n);
  if (HasFatalFailure()) return;
  expect_values(n.g[0], {0.5, 0, 0.5, 0});
}

TEST_F(GradRules, MaximumAndMinimumSplitTiesInHalf) {
  // torch.maximum: grad/2 to each side where a == b.
  Grads g;
  grad_of(ctx, {host({3}, {1, 2, 3}), host({3}, {1, 0, 4})},
          [](const Tensors& x, flame_tensor_t* o) { return flame_maximum(x[0], x[1], o); }, &g);
  if (HasFatalFailure()) return;
  expect_values(g.g[0], {0.5, 1, 0});
  expect_values(g.g[1], {0.5, 0, 1});
  Grads m;
  grad_of(ctx, {host({3}, {1, 2, 3}), host({3}, {1, 0, 4})},
          [](const Tensors& x, flame_tensor_t* o) { return flame_minimum(x[0], x[1], o); }, &m);
  if (HasFatalFailure()) return;
  expect_values(m.g[0], {0.5, 0, 1});
  expect_values(m.g[1], {0.5, 1, 0});
}

TEST_F(GradRules, ClampPassesGradientAtItsBounds) {
  // torch.clamp: gradient where lo <= x <= hi (inclusive).
  Grads g;
  grad_of(ctx, {host({5}, {-2, -1, 0, 1, 2})},
          [](const Tensors& x, flame_tensor_t* o) { return flame_clamp(x[0], -1, 1, o); }, &g);
  if (HasFatalFailure()) return;
  expect_values(g.g[0], {0, 1, 1, 1, 0});
}

TEST_F(GradRules, ReluAndAbsHaveZeroGradientAtZero) {
  Grads r;
  grad_of(ctx, {host({3}, {-1, 0, 1})}, [](const Tensors& x, flame_tensor_t* o) { return flame_relu(x[0], o); }, &r);
  if (HasFatalFailure()) return;
  expect_values(r.g[0], {0, 0, 1});
  Grads a;
  grad_of(ctx, {host({3}, {-1, 0, 1})}, [](const Tensors& x, flame_tensor_t* o) { return flame_abs(x[0], o); }, &a);
  if (HasFatalFailure()) return;
  expect_values(a.g[0], {-1, 0, 1});
}

TEST_F(GradRules, BroadcastBackwardSumsOverExpandedDims) {
  // d/db sum(a + b) for a [3,4] and b [4] is 3 for every element of b; for b [] it is 12.
  Grads g;
  grad_of(ctx, {HT(Shape{3, 4}, 1.0), HT(Shape{4}, 2.0)},
          [](const Tensors& x, flame_tensor_t* o) { return flame_add(x[0], x[1], o); }, &g);
  if (HasFatalFailure()) return;
  expect_values(g.g[1], {3, 3, 3, 3});
  EXPECT_EQ(g.g[1].shape, (Shape{4}));
  Grads s;
  grad_of(ctx, {HT(Shape{3, 4}, 1.0), HT(Shape{}, 2.0)},
          [](const Tensors& x, flame_tensor_t* o) { return flame_mul(x[0], x[1], o); }, &s);
  if (HasFatalFailure()) return;
  EXPECT_EQ(s.g[1].shape, Shape{});
  expect_values(s.g[1], {12});
}

}  // namespace

// Forward tests of every elementwise op of flame.h against a float64 host reference.
//
// One table row per op of src/tensor/op_list.h (FLAME_UNARY_OPS, FLAME_SCALAR_OPS,
// FLAME_SPECIAL_UNARY_OPS, FLAME_BINARY_OPS); ElementwiseOpList.EveryOpHasARow fails when an op
// of those lists has no row here (or its Kind differs). Each row runs over every dtype its Kind
// allows, contiguous inputs of odd sizes (vector tails), non-contiguous views (transpose, slice
// with step, flip, misaligned offset, stride-0 expand), broadcasting, 0-d and empty tensors.
// f16/bf16 references are computed on the inputs after rounding them to the dtype.
#include <cmath>
#include <functional>
#include <string>
#include <vector>
#include "host_ref.h"
#include "../../src/tensor/op_list.h"  // the op list (macros and an enum only; nothing here calls op_name)

using namespace href;

namespace {

enum class Kind { ARITH, MATH, PRED, ROUND, CMP };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::ARITH: return "ARITH";
    case Kind::MATH: return "MATH";
    case Kind::PRED: return "PRED";
    case Kind::ROUND: return "ROUND";
    case Kind::CMP: return "CMP";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// Rows. `isint` tells the call and the reference whether the input dtype is not floating (so that
// scalar arguments can be integral for integer inputs, whose scalar semantics flame.h leaves to
// the integer type).

using UnCall = std::function<flame_status_t(flame_tensor_t, bool isint, flame_tensor_t*)>;
using UnRef = std::function<double(double, bool isint)>;
using BinCall = std::function<flame_status_t(flame_tensor_t, flame_tensor_t, flame_tensor_t*)>;
using BinRef = std::function<double(double, double)>;

struct UnaryRow {
  std::string name;
  Kind kind;
  UnCall call;
  UnRef ref;
  Domain dom;
  bool ints = true;  // run integer (and bool) inputs; false where flame.h does not say what happens
};

struct BinaryRow {
  std::string name;
  Kind kind;
  BinCall call;
  BinRef ref;
  Domain da, db;
};

Domain dom(double lo, double hi, int64_t ilo, int64_t ihi, bool sym = false) {
  Domain d;
  d.lo = lo; d.hi = hi; d.ilo = ilo; d.ihi = ihi; d.sym = sym;
  return d;
}
Domain integral_dom(int64_t lo, int64_t hi) {
  Domain d = dom(lo, hi, lo, hi);
  d.integral = true;
  return d;
}

#define UN(fn) [](flame_tensor_t t, bool, flame_tensor_t* o) { return fn(t, o); }

const std::vector<UnaryRow>& unary_rows() {
  static const std::vector<UnaryRow> rows = [] {
    std::vector<UnaryRow> r;
    // ---- FLAME_UNARY_OPS ----
    r.push_back({"neg", Kind::ARITH, UN(flame_neg), [](double x, bool) { return -x; }, dom(-3, 3, -20, 20)});
    r.push_back({"abs", Kind::ARITH, UN(flame_abs), [](double x, bool) { return std::fabs(x); }, dom(-3, 3, -20, 20)});
    r.push_back({"exp", Kind::MATH, UN(flame_exp), [](double x, bool) { return std::exp(x); }, dom(-3, 3, -3, 3)});
    r.push_back({"log", Kind::MATH, UN(flame_log), [](double x, bool) { return std::log(x); }, dom(0.05, 5, 1, 50)});
    r.push_back({"log1p", Kind::MATH, UN(flame_log1p), [](double x, bool) { return std::log1p(x); }, dom(-0.9, 3, 0, 50)});
    r.push_back({"expm1", Kind::MATH, UN(flame_expm1), [](double x, bool) { return std::expm1(x); }, dom(-3, 3, -3, 3)});
    r.push_back({"sqrt", Kind::MATH, UN(flame_sqrt), [](double x, bool) { return std::sqrt(x); }, dom(0, 9, 0, 100)});
    r.push_back({"rsqrt", Kind::MATH, UN(flame_rsqrt), [](double x, bool) { return 1.0 / std::sqrt(x); }, dom(0.05, 9, 1, 100)});
    r.push_back({"sin", Kind::MATH, UN(flame_sin), [](double x, bool) { return std::sin(x); }, dom(-6, 6, -20, 20)});
    r.push_back({"cos", Kind::MATH, UN(flame_cos), [](double x, bool) { return std::cos(x); }, dom(-6, 6, -20, 20)});
    r.push_back({"tanh", Kind::MATH, UN(flame_tanh), [](double x, bool) { return std::tanh(x); }, dom(-4, 4, -4, 4)});
    r.push_back({"sigmoid", Kind::MATH, UN(flame_sigmoid), [](double x, bool) { return 1.0 / (1.0 + std::exp(-x)); },
                 dom(-6, 6, -6, 6)});
    r.push_back({"relu", Kind::ARITH, UN(flame_relu), [](double x, bool) { return x > 0 ? x : 0.0; }, dom(-3, 3, -20, 20)});
    r.push_back({"silu", Kind::MATH, UN(flame_silu), [](double x, bool) { return x / (1.0 + std::exp(-x)); },
                 dom(-6, 6, -6, 6)});
    r.push_back({"floor", Kind::ROUND, UN(flame_floor), [](double x, bool) { return std::floor(x); }, dom(-5, 5, -20, 20)});
    r.push_back({"ceil", Kind::ROUND, UN(flame_ceil), [](double x, bool) { return std::ceil(x); }, dom(-5, 5, -20, 20)});
    r.push_back({"round", Kind::ROUND, UN(flame_round), [](double x, bool) { return std::nearbyint(x); }, dom(-5, 5, -20, 20)});
    r.push_back({"sign", Kind::ARITH, UN(flame_sign), [](double x, bool) { return double((x > 0) - (x < 0)); },
                 dom(-3, 3, -20, 20)});
    r.push_back({"reciprocal", Kind::MATH, UN(flame_reciprocal), [](double x, bool) { return 1.0 / x; },
                 dom(0.1, 4, 1, 20, true)});
    r.push_back({"square", Kind::ARITH, UN(flame_square), [](double x, bool) { return x * x; }, dom(-3, 3, -15, 15)});
    r.push_back({"isnan", Kind::PRED, UN(flame_isnan), [](double x, bool) { return double(std::isnan(x)); }, dom(-3, 3, -20, 20)});
    r.push_back({"isinf", Kind::PRED, UN(flame_isinf), [](double x, bool) { return double(std::isinf(x)); }, dom(-3, 3, -20, 20)});
    r.push_back({"logical_not", Kind::PRED, UN(flame_logical_not), [](double x, bool) { return double(x == 0.0); },
                 integral_dom(-2, 2)});

    // ---- FLAME_SCALAR_OPS (and the scalar forms flame.h adds on top: sub_scalar, div_scalar) ----
    r.push_back({"add_scalar", Kind::ARITH,
                 [](flame_tensor_t t, bool i, flame_tensor_t* o) { return flame_add_scalar(t, i ? 3.0 : 0.75, o); },
                 [](double x, bool i) { return x + (i ? 3.0 : 0.75); }, dom(-3, 3, -20, 20)});
    r.push_back({"sub_scalar", Kind::ARITH,
                 [](flame_tensor_t t, bool i, flame_tensor_t* o) { return flame_sub_scalar(t, i ? 3.0 : 0.75, o); },
                 [](double x, bool i) { return x - (i ? 3.0 : 0.75); }, dom(-3, 3, -20, 20)});
    r.push_back({"mul_scalar", Kind::ARITH,
                 [](flame_tensor_t t, bool i, flame_tensor_t* o) { return flame_mul_scalar(t, i ? 3.0 : -1.5, o); },
                 [](double x, bool i) { return x * (i ? 3.0 : -1.5); }, dom(-3, 3, -20, 20)});
    r.push_back({"rsub_scalar", Kind::ARITH,
                 [](flame_tensor_t t, bool i, flame_tensor_t* o) { return flame_rsub_scalar(t, i ? 3.0 : 0.75, o); },
                 [](double x, bool i) { return (i ? 3.0 : 0.75) - x; }, dom(-3, 3, -20, 20)});
    r.push_back({"div_scalar", Kind::ARITH, [](flame_tensor_t t, bool, flame_tensor_t* o) { return flame_div_scalar(t, -2.5, o); },
                 [](double x, bool) { return x / -2.5; }, dom(-3, 3, -20, 20), /*ints=*/false});
    r.push_back({"pow_scalar", Kind::ARITH, [](flame_tensor_t t, bool, flame_tensor_t* o) { return flame_pow_scalar(t, 3.0, o); },
                 [](double x, bool) { return x * x * x; }, dom(0.2, 2, -4, 4, true)});
    r.push_back({"pow_scalar_square", Kind::ARITH,
                 [](flame_tensor_t t, bool, flame_tensor_t* o) { return flame_pow_scalar(t, 2.0, o); },
                 [](double x, bool) { return x * x; }, dom(-3, 3, -10, 10)});
    r.push_back({"pow_scalar_fraction", Kind::ARITH,
                 [](flame_tensor_t t, bool, flame_tensor_t* o) { return flame_pow_scalar(t, 0.5, o); },
                 [](double x, bool) { return std::pow(x, 0.5); }, dom(0, 4, 0, 4), /*ints=*/false});
    r.push_back({"leaky_relu", Kind::MATH,
                 [](flame_tensor_t t, bool, flame_tensor_t* o) { return flame_leaky_relu(t, 0.1, o); },
                 [](double x, bool) { return x > 0 ? x : 0.1 * x; }, dom(-3, 3, -20, 20)});
    r.push_back({"elu", Kind::MATH, [](flame_tensor_t t, bool, flame_tensor_t* o) { return flame_elu(t, 1.3, o); },
                 [](double x, bool) { return x > 0 ? x : 1.3 * std::expm1(x); }, dom(-3, 3, -5, 5)});

    // ---- FLAME_SPECIAL_UNARY_OPS ----
    r.push_back({"gelu", Kind::MATH, [](flame_tensor_t t, bool, flame_tensor_t* o) { return flame_gelu(t, 0, o); },
                 [](double x, bool) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }, dom(-4, 4, -4, 4)});
    r.push_back({"gelu_tanh", Kind::MATH, [](flame_tensor_t t, bool, flame_tensor_t* o) { return flame_gelu(t, 1, o); },
                 [](double x, bool) {
                   return 0.5 * x * (1.0 + std::tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x)));
                 },
                 dom(-4, 4, -4, 4)});
    {
      // beta 1.5, threshold 3: the function jumps where beta x == threshold; stay away from it.
      Domain d = dom(-4, 4, -4, 4);
      d.reject = [](double x) { return std::fabs(1.5 * x - 3.0) < 0.05; };
      r.push_back({"softplus", Kind::MATH,
                   [](flame_tensor_t t, bool, flame_tensor_t* o) { return flame_softplus(t, 1.5, 3.0, o); },
                   [](double x, bool) { return 1.5 * x > 3.0 ? x : std::log1p(std::exp(1.5 * x)) / 1.5; }, d});
    }
    r.push_back({"clamp", Kind::ARITH,
                 [](flame_tensor_t t, bool i, flame_tensor_t* o) { return i ? flame_clamp(t, -2, 3, o) : flame_clamp(t, -0.5, 0.7, o); },
                 [](double x, bool i) { return i ? std::min(std::max(x, -2.0), 3.0) : std::min(std::max(x, -0.5), 0.7); },
                 dom(-3, 3, -20, 20)});
    r.push_back({"clamp_no_lower_bound", Kind::ARITH,
                 [](flame_tensor_t t, bool i, flame_tensor_t* o) { return flame_clamp(t, -INFINITY, i ? 5.0 : 0.5, o); },
                 [](double x, bool i) { return std::min(x, i ? 5.0 : 0.5); }, dom(-3, 3, -20, 20)});
    r.push_back({"clamp_no_upper_bound", Kind::ARITH,
                 [](flame_tensor_t t, bool i, flame_tensor_t* o) { return flame_clamp(t, i ? 2.0 : 0.25, INFINITY, o); },
                 [](double x, bool i) { return std::max(x, i ? 2.0 : 0.25); }, dom(-3, 3, -20, 20)});
    return r;
  }();
  return rows;
}

#define BIN(fn) [](flame_tensor_t a, flame_tensor_t b, flame_tensor_t* o) { return fn(a, b, o); }

const std::vector<BinaryRow>& binary_rows() {
  static const std::vector<BinaryRow> rows = [] {
    std::vector<BinaryRow> r;
    const Domain cmp = integral_dom(-3, 3), logic = integral_dom(-2, 2);
    r.push_back({"add", Kind::ARITH, BIN(flame_add), [](double x, double y) { return x + y; }, dom(-3, 3, -50, 50),
                 dom(-3, 3, -50, 50)});
    r.push_back({"sub", Kind::ARITH, BIN(flame_sub), [](double x, double y) { return x - y; }, dom(-3, 3, -50, 50),
                 dom(-3, 3, -50, 50)});
    r.push_back({"mul", Kind::ARITH, BIN(flame_mul), [](double x, double y) { return x * y; }, dom(-3, 3, -30, 30),
                 dom(-3, 3, -30, 30)});
    r.push_back({"div", Kind::MATH, BIN(flame_div), [](double x, double y) { return x / y; }, dom(-3, 3, -50, 50),
                 dom(0.25, 3, 1, 9, true)});
    r.push_back({"pow", Kind::ARITH, BIN(flame_pow), [](double x, double y) { return std::pow(x, y); },
                 dom(0.25, 2.5, -4, 4), dom(-2, 2, 0, 4)});
    r.push_back({"maximum", Kind::ARITH, BIN(flame_maximum), [](double x, double y) { return std::max(x, y); },
                 dom(-3, 3, -5, 5), dom(-3, 3, -5, 5)});
    r.push_back({"minimum", Kind::ARITH, BIN(flame_minimum), [](double x, double y) { return std::min(x, y); },
                 dom(-3, 3, -5, 5), dom(-3, 3, -5, 5)});
    r.push_back({"eq", Kind::CMP, BIN(flame_eq), [](double x, double y) { return double(x == y); }, cmp, cmp});
    r.push_back({"ne", Kind::CMP, BIN(flame_ne), [](double x, double y) { return double(x != y); }, cmp, cmp});
    r.push_back({"lt", Kind::CMP, BIN(flame_lt), [](double x, double y) { return double(x < y); }, cmp, cmp});
    r.push_back({"le", Kind::CMP, BIN(flame_le), [](double x, double y) { return double(x <= y); }, cmp, cmp});
    r.push_back({"gt", Kind::CMP, BIN(flame_gt), [](double x, double y) { return double(x > y); }, cmp, cmp});
    r.push_back({"ge", Kind::CMP, BIN(flame_ge), [](double x, double y) { return double(x >= y); }, cmp, cmp});
    r.push_back({"logical_and", Kind::CMP, BIN(flame_logical_and),
                 [](double x, double y) { return double(x != 0 && y != 0); }, logic, logic});
    r.push_back({"logical_or", Kind::CMP, BIN(flame_logical_or),
                 [](double x, double y) { return double(x != 0 || y != 0); }, logic, logic});
    return r;
  }();
  return rows;
}

const UnaryRow* find_unary(const std::string& n) {
  for (const UnaryRow& r : unary_rows())
    if (r.name == n) return &r;
  return nullptr;
}
const BinaryRow* find_binary(const std::string& n) {
  for (const BinaryRow& r : binary_rows())
    if (r.name == n) return &r;
  return nullptr;
}

// ---------------------------------------------------------------------------------------------
// Inputs in several memory layouts: a device tensor whose logical shape is `shape` and the host
// copy of its logical values.

enum class Layout { CONTIG, TRANSPOSED, FLIPPED, STEPPED, OFFSET, EXPANDED };

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::CONTIG: return "contiguous";
    case Layout::TRANSPOSED: return "transposed";
    case Layout::FLIPPED: return "flipped";
    case Layout::STEPPED: return "sliced with step 2";
    case Layout::OFFSET: return "narrowed at offset 1 (misaligned)";
    case Layout::EXPANDED: return "expanded (stride 0)";
  }
  return "?";
}

struct Input {
  T dev;
  HT host;
};

Input make_input(flame_ctx_t ctx, Rng& rng, Layout layout, const Shape& shape, flame_dtype_t d, const Domain& dm) {
  Input in;
  const int nd = static_cast<int>(shape.size());
  if (nd == 0) layout = Layout::CONTIG;
  if (layout == Layout::TRANSPOSED && nd < 2) layout = Layout::FLIPPED;
  Shape base = shape;
  switch (layout) {
    case Layout::CONTIG: case Layout::FLIPPED: break;
    case Layout::TRANSPOSED: std::swap(base[nd - 1], base[nd - 2]); break;
    case Layout::STEPPED: base[0] = 2 * shape[0]; break;
    case Layout::OFFSET: base[nd - 1] = shape[nd - 1] + 1; break;
    case Layout::EXPANDED: base[0] = 1; break;
  }
  HT hb = random(rng, base, d, dm);
  T db = upload(ctx, hb);
  if (!db.h) return in;
  HT hv = hb;
  flame_status_t st = FLAME_OK;
  switch (layout) {
    case Layout::CONTIG: in.dev = std::move(db); break;
    case Layout::TRANSPOSED:
      st = flame_transpose(db, -1, -2, in.dev.out());
      hv = hb.transpose(-1, -2);
      break;
    case Layout::FLIPPED: {
      std::vector<int32_t> dims(static_cast<size_t>(nd));
      std::vector<int> hd(static_cast<size_t>(nd));
      for (int i = 0; i < nd; ++i) dims[static_cast<size_t>(i)] = hd[static_cast<size_t>(i)] = i;
      st = flame_flip(db, dims.data(), nd, in.dev.out());
      hv = hb.flip(hd);
      break;
    }
    case Layout::STEPPED:
      st = flame_slice(db, 0, 0, base[0], 2, in.dev.out());
      hv = hb.slice(0, 0, base[0], 2);
      break;
    case Layout::OFFSET:
      st = flame_narrow(db, nd - 1, 1, shape[nd - 1], in.dev.out());
      hv = hb.narrow(nd - 1, 1, shape[nd - 1]);
      break;
    case Layout::EXPANDED:
      st = flame_expand(db, shape.data(), nd, in.dev.out());
      hv = hb.expand(shape);
      break;
  }
  EXPECT_EQ(st, FLAME_OK) << "making a " << layout_name(layout) << " input: " << flame_last_error_message();
  in.host = hv.contiguous();
  if (in.dev.h) {
    EXPECT_EQ(shape_of(in.dev), shape) << layout_name(layout);
  }
  return in;
}

struct UnaryCase {
  Layout layout;
  Shape shape;
};
const std::vector<UnaryCase>& unary_cases() {
  static const std::vector<UnaryCase> cases = {
      {Layout::CONTIG, {1}},           {Layout::CONTIG, {7}},         {Layout::CONTIG, {33}},
      {Layout::CONTIG, {1000}},        {Layout::CONTIG, {4097}},      {Layout::CONTIG, {}},
      {Layout::CONTIG, {0, 5}},        {Layout::TRANSPOSED, {6, 35}}, {Layout::FLIPPED, {3, 4, 5}},
      {Layout::STEPPED, {13, 3}},      {Layout::OFFSET, {1001}},      {Layout::EXPANDED, {4, 9}},
      {Layout::TRANSPOSED, {2, 3, 70}},
  };
  return cases;
}

struct BinaryCase {
  Layout la, lb;
  Shape sa, sb;
};
const std::vector<BinaryCase>& binary_cases() {
  static const std::vector<BinaryCase> cases = {
      {Layout::CONTIG, Layout::CONTIG, {1}, {1}},
      {Layout::CONTIG, Layout::CONTIG, {7}, {7}},
      {Layout::CONTIG, Layout::CONTIG, {33}, {33}},
      {Layout::CONTIG, Layout::CONTIG, {1000}, {1000}},
      {Layout::CONTIG, Layout::CONTIG, {4097}, {4097}},
      {Layout::TRANSPOSED, Layout::FLIPPED, {6, 35}, {6, 35}},
      {Layout::STEPPED, Layout::OFFSET, {13, 3}, {13, 3}},
      {Layout::OFFSET, Layout::OFFSET, {1001}, {1001}},
      {Layout::EXPANDED, Layout::CONTIG, {4, 9}, {4, 9}},
      {Layout::CONTIG, Layout::CONTIG, {3, 1, 5}, {4, 5}},   // -> [3,4,5]
      {Layout::CONTIG, Layout::TRANSPOSED, {4, 1}, {4, 6}},  // broadcast with a non-contiguous operand
      {Layout::CONTIG, Layout::CONTIG, {2, 3}, {}},          // tensor with 0-d
      {Layout::CONTIG, Layout::CONTIG, {}, {5, 2}},          // 0-d with tensor
      {Layout::CONTIG, Layout::CONTIG, {}, {}},              // 0-d with 0-d
      {Layout::CONTIG, Layout::CONTIG, {0, 3}, {1, 3}},      // empty
      {Layout::CONTIG, Layout::CONTIG, {2, 0}, {}},          // empty with 0-d
  };
  return cases;
}

std::string case_label(Layout l, const Shape& s) { return std::string(layout_name(l)) + " " + to_string(s); }

// Result dtype of a unary op of kind k on dtype d.
flame_dtype_t unary_out(Kind k, flame_dtype_t d) {
  switch (k) {
    case Kind::MATH: return math_dtype(d);
    case Kind::PRED: case Kind::CMP: return FLAME_DTYPE_BOOL;
    default: return d;
  }
}
flame_dtype_t binary_out(Kind k, flame_dtype_t a, flame_dtype_t b) {
  flame_dtype_t p = promote(a, b);
  switch (k) {
    case Kind::MATH: return math_dtype(p);
    case Kind::PRED: case Kind::CMP: return FLAME_DTYPE_BOOL;
    default: return p;
  }
}

std::string param_name(const std::string& n) { return n; }

// ---------------------------------------------------------------------------------------------

class UnaryOp : public GpuTest, public ::testing::WithParamInterface<int> {};

TEST_P(UnaryOp, Forward) {
  const UnaryRow& row = unary_rows()[static_cast<size_t>(GetParam())];
  SCOPED_TRACE("op " + row.name + " (" + kind_name(row.kind) + ")");
  HREF_RNG(rng);
  for (flame_dtype_t d : kAllDtypes) {
    SCOPED_TRACE(std::string("dtype ") + dname(d));
    const bool isint = !is_float(d);
    if (isint && !row.ints) continue;
    if (d == FLAME_DTYPE_BOOL && row.kind == Kind::ROUND) continue;  // flame.h: floating or integer
    if (d == FLAME_DTYPE_BOOL && row.kind == Kind::ARITH) {
      Input in = make_input(ctx, rng, Layout::CONTIG, {5}, d, row.dom);
      flame_tensor_t out;
      HREF_EXPECT_FAIL(FLAME_ERROR_DTYPE_MISMATCH, out, row.call(in.dev, true, &out));
      continue;
    }
    const flame_dtype_t od = unary_out(row.kind, d);
    for (const UnaryCase& c : unary_cases()) {
      SCOPED_TRACE(case_label(c.layout, c.shape));
      Input in = make_input(ctx, rng, c.layout, c.shape, d, row.dom);
      ASSERT_NE(in.dev.h, nullptr);
      T out;
      flame_status_t st = row.call(in.dev, isint, out.out());
      ASSERT_EQ(st, FLAME_OK) << flame_status_string(st) << ": " << flame_last_error_message();
      HT expected = map1(in.host, od, [&](double x) { return row.ref(x, isint); });
      EXPECT_TRUE(matches(out, expected));
      EXPECT_NE(out.h, in.dev.h);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, UnaryOp, ::testing::Range(0, static_cast<int>(unary_rows().size())),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return param_name(unary_rows()[static_cast<size_t>(i.param)].name);
                         });

class BinaryOp : public GpuTest, public ::testing::WithParamInterface<int> {};

TEST_P(BinaryOp, Forward) {
  const BinaryRow& row = binary_rows()[static_cast<size_t>(GetParam())];
  SCOPED_TRACE("op " + row.name + " (" + kind_name(row.kind) + ")");
  HREF_RNG(rng);
  for (flame_dtype_t d : kAllDtypes) {
    SCOPED_TRACE(std::string("dtype ") + dname(d));
    if (d == FLAME_DTYPE_BOOL && row.kind == Kind::ARITH) {
      Input a = make_input(ctx, rng, Layout::CONTIG, {5}, d, row.da);
      Input b = make_input(ctx, rng, Layout::CONTIG, {5}, d, row.db);
      flame_tensor_t out;
      HREF_EXPECT_FAIL(FLAME_ERROR_DTYPE_MISMATCH, out, row.call(a.dev, b.dev, &out));
      continue;
    }
    const flame_dtype_t od = binary_out(row.kind, d, d);
    for (const BinaryCase& c : binary_cases()) {
      SCOPED_TRACE(case_label(c.la, c.sa) + " with " + case_label(c.lb, c.sb));
      Input a = make_input(ctx, rng, c.la, c.sa, d, row.da);
      Input b = make_input(ctx, rng, c.lb, c.sb, d, row.db);
      ASSERT_NE(a.dev.h, nullptr);
      ASSERT_NE(b.dev.h, nullptr);
      T out;
      flame_status_t st = row.call(a.dev, b.dev, out.out());
      ASSERT_EQ(st, FLAME_OK) << flame_status_string(st) << ": " << flame_last_error_message();
      EXPECT_TRUE(matches(out, map2(a.host, b.host, od, row.ref)));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, BinaryOp, ::testing::Range(0, static_cast<int>(binary_rows().size())),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return param_name(binary_rows()[static_cast<size_t>(i.param)].name);
                         });

// ---------------------------------------------------------------------------------------------
// The op list must be covered: every c_name of op_list.h has a row here with the same Kind.

TEST(ElementwiseOpList, EveryOpHasARow) {
  struct Entry {
    const char* name;
    Kind kind;
    bool binary;
  };
  const Entry entries[] = {
#define FLAME_TEST_UNARY_ENTRY(Id, c_name, K, ...) {#c_name, Kind::K, false},
#define FLAME_TEST_BINARY_ENTRY(Id, c_name, K, ...) {#c_name, Kind::K, true},
      FLAME_UNARY_OPS(FLAME_TEST_UNARY_ENTRY) FLAME_SCALAR_OPS(FLAME_TEST_UNARY_ENTRY)
          FLAME_SPECIAL_UNARY_OPS(FLAME_TEST_UNARY_ENTRY) FLAME_BINARY_OPS(FLAME_TEST_BINARY_ENTRY)
#undef FLAME_TEST_UNARY_ENTRY
#undef FLAME_TEST_BINARY_ENTRY
  };
  ASSERT_GT(sizeof(entries) / sizeof(entries[0]), 40u);
  for (const Entry& e : entries) {
    if (e.binary) {
      const BinaryRow* r = find_binary(e.name);
      EXPECT_NE(r, nullptr) << "binary op '" << e.name << "' of src/tensor/op_list.h has no test row";
      if (r) {
        EXPECT_EQ(r->kind, e.kind) << e.name << ": Kind " << kind_name(e.kind) << " in op_list.h";
      }
    } else {
      const UnaryRow* r = find_unary(e.name);
      EXPECT_NE(r, nullptr) << "unary op '" << e.name << "' of src/tensor/op_list.h has no test row";
      if (r) {
        EXPECT_EQ(r->kind, e.kind) << e.name << ": Kind " << kind_name(e.kind) << " in op_list.h";
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Type promotion across every pair of dtypes.

class ElementwisePromotion : public GpuTest {};

TEST_F(ElementwisePromotion, EveryDtypePair) {
  HREF_RNG(rng);
  Domain dm = dom(-3, 3, -20, 20);
  struct Op {
    const char* name;
    Kind kind;
    BinCall call;
    BinRef ref;
    bool bool_mix;  // run pairs of bool with another dtype
  };
  const Op ops[] = {
      {"add", Kind::ARITH, BIN(flame_add), [](double x, double y) { return x + y; }, false},
      {"mul", Kind::ARITH, BIN(flame_mul), [](double x, double y) { return x * y; }, false},
      {"maximum", Kind::ARITH, BIN(flame_maximum), [](double x, double y) { return std::max(x, y); }, false},
      {"div", Kind::MATH, BIN(flame_div), [](double x, double y) { return x / y; }, false},
      {"lt", Kind::CMP, BIN(flame_lt), [](double x, double y) { return double(x < y); }, true},
      {"eq", Kind::CMP, BIN(flame_eq), [](double x, double y) { return double(x == y); }, true},
  };
  for (const Op& op : ops) {
    for (flame_dtype_t da : kAllDtypes) {
      for (flame_dtype_t db : kAllDtypes) {
        if (da == db) continue;  // covered by BinaryOp
        const bool has_bool = da == FLAME_DTYPE_BOOL || db == FLAME_DTYPE_BOOL;
        if (has_bool && !op.bool_mix) continue;  // flame.h does not say whether bool + i32 is arithmetic on bool
        SCOPED_TRACE(std::string(op.name) + " " + dname(da) + " with " + dname(db));
        Domain bdm = dm;
        if (op.kind == Kind::MATH) { bdm = dom(0.5, 3, 1, 9, true); }
        Input a = make_input(ctx, rng, Layout::CONTIG, {3, 7}, da, dm);
        Input b = make_input(ctx, rng, Layout::TRANSPOSED, {3, 7}, db, bdm);
        T out;
        flame_status_t st = op.call(a.dev, b.dev, out.out());
        ASSERT_EQ(st, FLAME_OK) << flame_status_string(st) << ": " << flame_last_error_message();
        const flame_dtype_t od = binary_out(op.kind, da, db);
        EXPECT_EQ(dtype_of(out), od) << "promoted dtype";
        EXPECT_TRUE(matches(out, map2(a.host, b.host, od, op.ref)));
      }
    }
  }
}

TEST_F(ElementwisePromotion, DocumentedExamples) {
  HREF_RNG(rng);
  struct Case {
    flame_dtype_t a, b, add_out, div_out;
  };
  const Case cases[] = {
      {FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_F32, FLAME_DTYPE_F32},
      {FLAME_DTYPE_BF16, FLAME_DTYPE_F16, FLAME_DTYPE_F32, FLAME_DTYPE_F32},
      {FLAME_DTYPE_I32, FLAME_DTYPE_F32, FLAME_DTYPE_F32, FLAME_DTYPE_F32},
      {FLAME_DTYPE_I32, FLAME_DTYPE_I32, FLAME_DTYPE_I32, FLAME_DTYPE_F32},
      {FLAME_DTYPE_I64, FLAME_DTYPE_I64, FLAME_DTYPE_I64, FLAME_DTYPE_F32},
      {FLAME_DTYPE_U8, FLAME_DTYPE_U8, FLAME_DTYPE_U8, FLAME_DTYPE_F32},
      {FLAME_DTYPE_U8, FLAME_DTYPE_I32, FLAME_DTYPE_I32, FLAME_DTYPE_F32},
      {FLAME_DTYPE_I64, FLAME_DTYPE_F16, FLAME_DTYPE_F16, FLAME_DTYPE_F16},
      {FLAME_DTYPE_F32, FLAME_DTYPE_F64, FLAME_DTYPE_F64, FLAME_DTYPE_F64},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(dname(c.a)) + " with " + dname(c.b));
    Input a = make_input(ctx, rng, Layout::CONTIG, {17}, c.a, dom(-3, 3, 0, 20));
    Input b = make_input(ctx, rng, Layout::CONTIG, {17}, c.b, dom(0.5, 3, 1, 9));
    T s, q;
    FLAME_ASSERT_OK(flame_add(a.dev, b.dev, s.out()));
    FLAME_ASSERT_OK(flame_div(a.dev, b.dev, q.out()));
    EXPECT_EQ(dtype_of(s), c.add_out);
    EXPECT_EQ(dtype_of(q), c.div_out);
    EXPECT_TRUE(matches(s, map2(a.host, b.host, c.add_out, [](double x, double y) { return x + y; })));
    EXPECT_TRUE(matches(q, map2(a.host, b.host, c.div_out, [](double x, double y) { return x / y; })));
  }
  // int / int is true division: 7 / 2 == 3.5, -7 / 2 == -3.5
  const int32_t ai[] = {7, -7, 1, 0}, bi[] = {2, 2, 3, 5};
  const int64_t shp[] = {4};
  T a, b, q;
  FLAME_ASSERT_OK(flame_from_host(ctx, ai, sizeof(ai), shp, 1, FLAME_DTYPE_I32, a.out()));
  FLAME_ASSERT_OK(flame_from_host(ctx, bi, sizeof(bi), shp, 1, FLAME_DTYPE_I32, b.out()));
  FLAME_ASSERT_OK(flame_div(a, b, q.out()));
  EXPECT_TRUE(matches(q, HT::from_values({4}, FLAME_DTYPE_F32, {3.5, -3.5, 1.0 / 3.0, 0.0})));
}

// ---------------------------------------------------------------------------------------------
// where

class ElementwiseWhere : public GpuTest {};

TEST_F(ElementwiseWhere, BroadcastsAllThree) {
  HREF_RNG(rng);
  for (flame_dtype_t d : kAllDtypes) {
    SCOPED_TRACE(dname(d));
    Input c = make_input(ctx, rng, Layout::CONTIG, {3, 1}, FLAME_DTYPE_BOOL, Domain());
    Input a = make_input(ctx, rng, Layout::CONTIG, {1, 4}, d, Domain());
    Input b = make_input(ctx, rng, Layout::CONTIG, {}, d, Domain());
    T out;
    FLAME_ASSERT_OK(flame_where(c.dev, a.dev, b.dev, out.out()));
    EXPECT_TRUE(matches(out, map3(c.host, a.host, b.host, d, [](double k, double x, double y) { return k != 0 ? x : y; })));
    // non-contiguous operands
    Input c2 = make_input(ctx, rng, Layout::TRANSPOSED, {5, 6}, FLAME_DTYPE_BOOL, Domain());
    Input a2 = make_input(ctx, rng, Layout::FLIPPED, {5, 6}, d, Domain());
    Input b2 = make_input(ctx, rng, Layout::STEPPED, {5, 6}, d, Domain());
    FLAME_ASSERT_OK(flame_where(c2.dev, a2.dev, b2.dev, out.out()));
    EXPECT_TRUE(
        matches(out, map3(c2.host, a2.host, b2.host, d, [](double k, double x, double y) { return k != 0 ? x : y; })));
  }
}

TEST_F(ElementwiseWhere, PromotesAndChecks) {
  HREF_RNG(rng);
  Input c = make_input(ctx, rng, Layout::CONTIG, {4097}, FLAME_DTYPE_BOOL, Domain());
  Input a = make_input(ctx, rng, Layout::CONTIG, {4097}, FLAME_DTYPE_I32, Domain());
  Input b = make_input(ctx, rng, Layout::CONTIG, {4097}, FLAME_DTYPE_F64, Domain());
  T out;
  FLAME_ASSERT_OK(flame_where(c.dev, a.dev, b.dev, out.out()));
  EXPECT_TRUE(matches(out, map3(c.host, a.host, b.host, FLAME_DTYPE_F64,
                                [](double k, double x, double y) { return k != 0 ? x : y; })));
  flame_tensor_t bad;
  HREF_EXPECT_FAIL(FLAME_ERROR_DTYPE_MISMATCH, bad, flame_where(a.dev, a.dev, b.dev, &bad));  // cond must be bool
  Input s = make_input(ctx, rng, Layout::CONTIG, {7}, FLAME_DTYPE_F64, Domain());
  HREF_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, bad, flame_where(c.dev, a.dev, s.dev, &bad));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, bad, flame_where(nullptr, a.dev, b.dev, &bad));
  FLAME_EXPECT_STATUS(flame_where(c.dev, a.dev, b.dev, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
}

// ---------------------------------------------------------------------------------------------
// Special values, rounding, large launches, errors.

class ElementwiseSpecial : public GpuTest {};

TEST_F(ElementwiseSpecial, NanAndInfinity) {
  const double nan = std::nan(""), inf = INFINITY;
  const std::vector<double> v = {nan, inf, -inf, 1.5, -0.0, 0.0, -2.5};
  for (flame_dtype_t d : kFloatDtypes) {
    SCOPED_TRACE(dname(d));
    HT h = HT::from_values({7}, d, v);
    T x = upload(ctx, h);
    T zero;
    FLAME_ASSERT_OK(flame_zeros(ctx, nullptr, 0, d, zero.out()));
    HT hz = scalar(0.0, d);
    T o;
    FLAME_ASSERT_OK(flame_isnan(x, o.out()));
    EXPECT_TRUE(matches(o, HT::from_values({7}, FLAME_DTYPE_BOOL, {1, 0, 0, 0, 0, 0, 0})));
    FLAME_ASSERT_OK(flame_isinf(x, o.out()));
    EXPECT_TRUE(matches(o, HT::from_values({7}, FLAME_DTYPE_BOOL, {0, 1, 1, 0, 0, 0, 0})));
    FLAME_ASSERT_OK(flame_logical_not(x, o.out()));  // NaN is nonzero, so true
    EXPECT_TRUE(matches(o, HT::from_values({7}, FLAME_DTYPE_BOOL, {0, 0, 0, 0, 1, 1, 0})));
    FLAME_ASSERT_OK(flame_maximum(x, zero, o.out()));  // NaN propagates
    EXPECT_TRUE(matches(o, HT::from_values({7}, d, {nan, inf, 0, 1.5, 0, 0, 0})));
    FLAME_ASSERT_OK(flame_minimum(zero, x, o.out()));
    EXPECT_TRUE(matches(o, HT::from_values({7}, d, {nan, 0, -inf, 0, 0, 0, -2.5})));
    FLAME_ASSERT_OK(flame_clamp(x, -1.0, 1.0, o.out()));  // NaN stays NaN
    EXPECT_TRUE(matches(o, HT::from_values({7}, d, {nan, 1, -1, 1, 0, 0, -1})));
    FLAME_ASSERT_OK(flame_clamp(x, -INFINITY, INFINITY, o.out()));
    EXPECT_TRUE(matches(o, h));
    FLAME_ASSERT_OK(flame_sign(x, o.out()));
    EXPECT_TRUE(matches(o, HT::from_values({7}, d, {nan, 1, -1, 1, 0, 0, -1})));
    FLAME_ASSERT_OK(flame_abs(x, o.out()));
    EXPECT_TRUE(matches(o, HT::from_values({7}, d, {nan, inf, inf, 1.5, 0, 0, 2.5})));
    FLAME_ASSERT_OK(flame_exp(x, o.out()));
    EXPECT_TRUE(matches(o, map1(h, d, [](double t) { return std::exp(t); })));
    FLAME_ASSERT_OK(flame_eq(x, x, o.out()));  // NaN != NaN
    EXPECT_TRUE(matches(o, HT::from_values({7}, FLAME_DTYPE_BOOL, {0, 1, 1, 1, 1, 1, 1})));
    FLAME_ASSERT_OK(flame_ne(x, x, o.out()));
    EXPECT_TRUE(matches(o, HT::from_values({7}, FLAME_DTYPE_BOOL, {1, 0, 0, 0, 0, 0, 0})));
    FLAME_ASSERT_OK(flame_add(x, zero, o.out()));
    EXPECT_TRUE(matches(o, map2(h, hz, d, [](double a, double b) { return a + b; })));
  }
}

TEST_F(ElementwiseSpecial, RoundHalfToEven) {
  const std::vector<double> v = {0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 0.49, -0.51, 1e6 + 0.5};
  for (flame_dtype_t d : {FLAME_DTYPE_F32, FLAME_DTYPE_F64}) {
    SCOPED_TRACE(dname(d));
    T x = upload(ctx, HT::from_values({10}, d, v));
    T o;
    FLAME_ASSERT_OK(flame_round(x, o.out()));
    EXPECT_TRUE(matches(o, HT::from_values({10}, d, {0, 2, 2, -0.0, -2, -2, 4, 0, -1, 1e6})));
  }
  T x = upload(ctx, HT::from_values({4}, FLAME_DTYPE_F16, {0.5, 1.5, 2.5, -2.5}));
  T o;
  FLAME_ASSERT_OK(flame_round(x, o.out()));
  EXPECT_TRUE(matches(o, HT::from_values({4}, FLAME_DTYPE_F16, {0, 2, 2, -2})));
}

TEST_F(ElementwiseSpecial, IntegerWraparoundAndExactness) {
  // u8 arithmetic wraps modulo 256; i64 keeps values beyond 2^53's neighbourhood exact.
  const uint8_t a8[] = {250, 3, 0, 128}, b8[] = {10, 5, 1, 128};
  const int64_t s4[] = {4};
  T a, b, o;
  FLAME_ASSERT_OK(flame_from_host(ctx, a8, 4, s4, 1, FLAME_DTYPE_U8, a.out()));
  FLAME_ASSERT_OK(flame_from_host(ctx, b8, 4, s4, 1, FLAME_DTYPE_U8, b.out()));
  FLAME_ASSERT_OK(flame_add(a, b, o.out()));
  EXPECT_TRUE(matches(o, HT::from_values({4}, FLAME_DTYPE_U8, {4, 8, 1, 0})));
  FLAME_ASSERT_OK(flame_sub(a, b, o.out()));
  EXPECT_TRUE(matches(o, HT::from_values({4}, FLAME_DTYPE_U8, {240, 254, 255, 0})));
  const int64_t big[] = {(1LL << 40) + 1, -(1LL << 35) - 3, 123456789012LL, 7};
  T x;
  FLAME_ASSERT_OK(flame_from_host(ctx, big, sizeof(big), s4, 1, FLAME_DTYPE_I64, x.out()));
  FLAME_ASSERT_OK(flame_add(x, x, o.out()));
  int64_t got[4] = {0};
  FLAME_ASSERT_OK(flame_to_host(o, got, sizeof(got)));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got[i], big[i] * 2) << i;
  FLAME_ASSERT_OK(flame_mul_scalar(x, 3.0, o.out()));
  FLAME_ASSERT_OK(flame_to_host(o, got, sizeof(got)));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got[i], big[i] * 3) << i;
}

TEST_F(ElementwiseSpecial, GridStrideLoop) {
  // Enough elements that a launch has to loop (and odd, for the vector tail).
  HREF_RNG(rng);
  for (flame_dtype_t d : {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_U8}) {
    SCOPED_TRACE(dname(d));
    const int64_t n = (int64_t(1) << 22) + 3;
    Input a = make_input(ctx, rng, Layout::CONTIG, {n}, d, dom(-3, 3, 0, 100));
    Input b = make_input(ctx, rng, Layout::OFFSET, {n}, d, dom(-3, 3, 0, 100));
    T o;
    FLAME_ASSERT_OK(flame_add(a.dev, b.dev, o.out()));
    EXPECT_TRUE(matches(o, map2(a.host, b.host, d, [](double x, double y) { return x + y; })));
    Input c = make_input(ctx, rng, Layout::TRANSPOSED, {1025, 4097}, d, dom(-3, 3, 0, 100));
    FLAME_ASSERT_OK(flame_neg(c.dev, o.out()));
    EXPECT_TRUE(matches(o, map1(c.host, d, [](double x) { return -x; })));
  }
}

// The specialised launches: ew_rows (dense output, operands dense or broadcast along one of two
// collapsed axes, vector width dividing the row) and ew_tile (one operand whose unit stride is not
// the output's last axis), next to shapes that must fall back to ew_strided.
TEST_F(ElementwiseSpecial, RowBroadcastAndTransposeLaunches) {
  HREF_RNG(rng);
  const Domain d0 = dom(-3, 3, 0, 100);
  for (flame_dtype_t d : {FLAME_DTYPE_F32, FLAME_DTYPE_BF16, FLAME_DTYPE_F16, FLAME_DTYPE_F64, FLAME_DTYPE_I32, FLAME_DTYPE_U8}) {
    SCOPED_TRACE(dname(d));
    const auto add = [](double x, double y) { return x + y; };
    struct Pair { Shape a, b; };
    for (const Pair& p : {Pair{{64, 96}, {96}}, Pair{{64, 96}, {64, 1}}, Pair{{5, 7, 96}, {7, 96}}, Pair{{1, 96}, {96}},
                          Pair{{64, 30}, {30}}, Pair{{33, 17}, {33, 1}}, Pair{{96}, {}}}) {
      SCOPED_TRACE(to_string(p.a) + " + " + to_string(p.b));
      Input a = make_input(ctx, rng, Layout::CONTIG, p.a, d, d0);
      Input b = make_input(ctx, rng, Layout::CONTIG, p.b, d, d0);
      T o, o2;
      FLAME_ASSERT_OK(flame_add(a.dev, b.dev, o.out()));
      EXPECT_TRUE(matches(o, map2(a.host, b.host, d, add)));
      FLAME_ASSERT_OK(flame_add(b.dev, a.dev, o2.out()));  // the broadcast operand first
      EXPECT_TRUE(matches(o2, map2(b.host, a.host, d, add)));
    }
    // Transposed and permuted copies, and a cast of a transposed view.
    for (const std::vector<int>& perm : {std::vector<int>{1, 0, 2}, std::vector<int>{0, 2, 1}, std::vector<int>{2, 0, 1},
                                         std::vector<int>{2, 1, 0}}) {
      SCOPED_TRACE("permute " + std::to_string(perm[0]) + std::to_string(perm[1]) + std::to_string(perm[2]));
      for (const Shape& shape : {Shape{6, 40, 50}, Shape{6, 40, 64}}) {  // rows of 64: ew_rows for {1, 0, 2}
        HT h = random(rng, shape, d, d0);
        T x = upload(ctx, h), v, o;
        FLAME_ASSERT_OK(flame_permute(x, perm.data(), 3, v.out()));
        FLAME_ASSERT_OK(flame_contiguous(v, o.out()));
        EXPECT_TRUE(matches(o, h.permute(perm).contiguous()));
        FLAME_ASSERT_OK(flame_to_dtype(v, FLAME_DTYPE_F32, o.out()));
        EXPECT_TRUE(matches(o, h.permute(perm).as(FLAME_DTYPE_F32)));
      }
    }
    {  // the attention layout: [B, H, T, D] read as [B, T, H, D], and a slice of it (an offset row start)
      const std::vector<int> perm = {0, 2, 1, 3};
      HT h = random(rng, {2, 3, 5, 64}, d, d0);
      T x = upload(ctx, h), v, o, s;
      FLAME_ASSERT_OK(flame_permute(x, perm.data(), 4, v.out()));
      FLAME_ASSERT_OK(flame_contiguous(v, o.out()));
      EXPECT_TRUE(matches(o, h.permute(perm).contiguous()));
      FLAME_ASSERT_OK(flame_narrow(v, 3, 8, 48, s.out()));
      FLAME_ASSERT_OK(flame_contiguous(s, o.out()));
      EXPECT_TRUE(matches(o, h.permute(perm).narrow(3, 8, 48).contiguous()));
    }
    if (d == FLAME_DTYPE_F32 || d == FLAME_DTYPE_BF16) {
      // More vectors than ew_rows' grid takes in one pass of its grid-stride loop (6 blocks of 256 threads
      // per SM), with rows of a length that does not divide the grid's threads.
      Input a = make_input(ctx, rng, Layout::CONTIG, {2048, 1104}, d, d0);
      Input b = make_input(ctx, rng, Layout::CONTIG, {1104}, d, d0);
      T o;
      FLAME_ASSERT_OK(flame_add(a.dev, b.dev, o.out()));
      EXPECT_TRUE(matches(o, map2(a.host, b.host, d, add)));
      const std::vector<int> perm = {0, 2, 1, 3};  // several outer axes
      HT h = random(rng, {8, 12, 520, 64}, d, d0);
      T x = upload(ctx, h), v, c;
      FLAME_ASSERT_OK(flame_permute(x, perm.data(), 4, v.out()));
      FLAME_ASSERT_OK(flame_contiguous(v, c.out()));
      EXPECT_TRUE(matches(c, h.permute(perm).contiguous()));
    }
    HT h = random(rng, {37, 45}, d, d0);  // tile edges in both directions
    T x = upload(ctx, h), v, o;
    FLAME_ASSERT_OK(flame_transpose(x, 0, 1, v.out()));
    FLAME_ASSERT_OK(flame_neg(v, o.out()));
    EXPECT_TRUE(matches(o, map1(h.transpose(0, 1), d, [](double y) { return -y; })));
  }
}

TEST_F(ElementwiseSpecial, InputsAreNotModified) {
  HREF_RNG(rng);
  Input a = make_input(ctx, rng, Layout::CONTIG, {100}, FLAME_DTYPE_F32, Domain());
  Input b = make_input(ctx, rng, Layout::TRANSPOSED, {10, 10}, FLAME_DTYPE_F32, Domain());
  T o, v;
  const int64_t s[] = {100};
  FLAME_ASSERT_OK(flame_reshape(b.dev, s, 1, v.out()));
  FLAME_ASSERT_OK(flame_mul(a.dev, v, o.out()));
  FLAME_ASSERT_OK(flame_exp(a.dev, o.out()));
  FLAME_ASSERT_OK(flame_add_scalar(b.dev, 1.0, o.out()));
  EXPECT_TRUE(matches(a.dev, a.host));
  EXPECT_TRUE(matches(b.dev, b.host));
}

class ElementwiseErrors : public GpuTest {};

TEST_F(ElementwiseErrors, ShapeMismatch) {
  HREF_RNG(rng);
  Input a = make_input(ctx, rng, Layout::CONTIG, {3}, FLAME_DTYPE_F32, Domain());
  Input b = make_input(ctx, rng, Layout::CONTIG, {4}, FLAME_DTYPE_F32, Domain());
  Input c = make_input(ctx, rng, Layout::CONTIG, {2, 3}, FLAME_DTYPE_F32, Domain());
  Input d = make_input(ctx, rng, Layout::CONTIG, {3, 2}, FLAME_DTYPE_F32, Domain());
  Input e = make_input(ctx, rng, Layout::CONTIG, {0}, FLAME_DTYPE_F32, Domain());
  flame_tensor_t out;
  HREF_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, out, flame_add(a.dev, b.dev, &out));
  EXPECT_STRNE(flame_last_error_message(), "");
  HREF_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, out, flame_mul(c.dev, d.dev, &out));
  HREF_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, out, flame_lt(c.dev, d.dev, &out));
  HREF_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, out, flame_add(a.dev, e.dev, &out));  // 3 vs 0
  for (const BinaryRow& r : binary_rows()) {
    SCOPED_TRACE(r.name);
    HREF_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, out, r.call(c.dev, b.dev, &out));
  }
  // and then the context works as before
  T ok;
  FLAME_ASSERT_OK(flame_add(c.dev, a.dev, ok.out()));
  EXPECT_STREQ(flame_last_error_message(), "");
  EXPECT_TRUE(matches(ok, map2(c.host, a.host, FLAME_DTYPE_F32, [](double x, double y) { return x + y; })));
}

TEST_F(ElementwiseErrors, BoolArithmetic) {
  HREF_RNG(rng);
  Input a = make_input(ctx, rng, Layout::CONTIG, {6}, FLAME_DTYPE_BOOL, Domain());
  Input b = make_input(ctx, rng, Layout::CONTIG, {6}, FLAME_DTYPE_BOOL, Domain());
  flame_tensor_t out;
  HREF_EXPECT_FAIL(FLAME_ERROR_DTYPE_MISMATCH, out, flame_add(a.dev, b.dev, &out));
  HREF_EXPECT_FAIL(FLAME_ERROR_DTYPE_MISMATCH, out, flame_sub(a.dev, b.dev, &out));
  HREF_EXPECT_FAIL(FLAME_ERROR_DTYPE_MISMATCH, out, flame_mul(a.dev, b.dev, &out));
  HREF_EXPECT_FAIL(FLAME_ERROR_DTYPE_MISMATCH, out, flame_neg(a.dev, &out));
  HREF_EXPECT_FAIL(FLAME_ERROR_DTYPE_MISMATCH, out, flame_add_scalar(a.dev, 1.0, &out));
  HREF_EXPECT_FAIL(FLAME_ERROR_DTYPE_MISMATCH, out, flame_mul_scalar(a.dev, 2.0, &out));
  // bool is fine for comparisons and logical ops
  T o;
  FLAME_ASSERT_OK(flame_logical_and(a.dev, b.dev, o.out()));
  EXPECT_TRUE(matches(o, map2(a.host, b.host, FLAME_DTYPE_BOOL, [](double x, double y) { return double(x && y); })));
}

TEST_F(ElementwiseErrors, NullArguments) {
  HREF_RNG(rng);
  Input a = make_input(ctx, rng, Layout::CONTIG, {6}, FLAME_DTYPE_F32, Domain());
  flame_tensor_t out;
  FLAME_EXPECT_STATUS(flame_add(a.dev, a.dev, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_exp(a.dev, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_add_scalar(a.dev, 1.0, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_clamp(a.dev, 0, 1, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, out, flame_add(nullptr, a.dev, &out));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, out, flame_add(a.dev, nullptr, &out));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, out, flame_exp(nullptr, &out));
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, out, flame_gelu(nullptr, 0, &out));
  for (const UnaryRow& r : unary_rows()) {
    SCOPED_TRACE(r.name);
    HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, out, r.call(nullptr, false, &out));
    FLAME_EXPECT_STATUS(r.call(a.dev, false, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  }
  for (const BinaryRow& r : binary_rows()) {
    SCOPED_TRACE(r.name);
    HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_ARGUMENT, out, r.call(a.dev, nullptr, &out));
    FLAME_EXPECT_STATUS(r.call(a.dev, a.dev, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  }
  EXPECT_STRNE(flame_last_error_message(), "");
}

TEST_F(ElementwiseErrors, ErrorMessageNamesTheFunction) {
  HREF_RNG(rng);
  Input a = make_input(ctx, rng, Layout::CONTIG, {3}, FLAME_DTYPE_F32, Domain());
  Input b = make_input(ctx, rng, Layout::CONTIG, {4}, FLAME_DTYPE_F32, Domain());
  flame_tensor_t out;
  HREF_EXPECT_FAIL(FLAME_ERROR_SHAPE_MISMATCH, out, flame_maximum(a.dev, b.dev, &out));
  EXPECT_NE(std::string(flame_last_error_message()).find("maximum"), std::string::npos)
      << "message: " << flame_last_error_message();
  T ok;
  FLAME_ASSERT_OK(flame_maximum(a.dev, a.dev, ok.out()));
  EXPECT_STREQ(flame_last_error_message(), "");
}

}  // namespace

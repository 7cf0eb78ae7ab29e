// The frozen fp8 base's ops on a GPU (white-box, src/ops/quantized.h, kernel cuda/dequantize.cuh):
//  - dequantize against a host float64 reference: every e4m3 and e5m2 code, a scale per tensor and
//    per row, outputs f32 / f16 / bf16 / f64, vector and scalar paths, strided and 3-D q; each value
//    is the f64 product rounded to f32 and then once to the output type (the old composed path's
//    arithmetic), and within half an ulp (plus f32's) of the exact product; bad arguments fail;
//  - quantized_linear: output and gradients of x and bias equal to linear over the dequantised
//    weight (the old path) within rounding, for both scale kinds and f32 / bf16 / f16, the node is
//    QuantizedLinear and its rule works under create_graph;
//  - memory: forward + backward through a stack of fp8 linears with a requires-grad input peaks
//    lower than with the dequantised weights saved (flame_ctx_memory_stats), by most of the saved
//    copies.
// The LoRA (A, B, DoRA) gradients through a model are in tests/gpu/test_model_quantized.cpp.
// Without a GPU the tests skip unless FLAME_REQUIRE_GPU=1.
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>
#include "autograd/engine.h"
#include "core/error.h"
#include "flame_test.h"
#include "models/quantized_weights.h"
#include "ops/ops.h"
#include "ops/quantized.h"
#include "runtime/context.h"
#include "tensor/autograd_graph.h"

using namespace flame;

namespace {

// ---- host reference, written out here rather than taken from FLAME ----

double e4m3_value(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  if ((b & 0x7f) == 0x7f) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (b & 0x80) ? -mag : mag;
}
double e5m2_value(uint8_t b) {
  const int e = (b >> 2) & 31, m = b & 3;
  double mag;
  if (e == 31) mag = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else mag = e == 0 ? std::ldexp(m, -16) : std::ldexp(1.0 + m / 4.0, e - 15);
  return (b & 0x80) ? -mag : mag;
}

struct Format {
  int mantissa;  // explicit mantissa bits
  int min_exp;   // exponent of the smallest normal
  double max;    // largest finite value
};
const Format kF32{23, -126, 3.4028234663852886e38};
Format format_of(DType d) {
  switch (d) {
    case FLAME_DTYPE_BF16: return {7, -126, 3.3895313892515355e38};
    case FLAME_DTYPE_F16: return {10, -14, 65504.0};
    default: return kF32;  // f32; f64 takes the f32 product exactly
  }
}
// v rounded to nearest even in format f (subnormals included, overflow to infinity).
double round_to(double v, const Format& f) {
  if (!std::isfinite(v) || v == 0) return v;
  int exp2 = 0;
  std::frexp(v, &exp2);  // |v| in [2^(exp2 - 1), 2^exp2)
  const int e = std::max(exp2 - 1, f.min_exp);
  const double ulp = std::ldexp(1.0, e - f.mantissa);
  const double r = std::nearbyint(v / ulp) * ulp;
  return std::fabs(r) > f.max ? std::copysign(std::numeric_limits<double>::infinity(), v) : r;
}

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
double f16_value(uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  double mag;
  if (e == 31) mag = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else mag = e == 0 ? std::ldexp(m, -24) : std::ldexp(1.0 + m / 1024.0, e - 15);
  return (h & 0x8000) ? -mag : mag;
}

// t's values (f32 / f16 / bf16 / f64) as doubles.
std::vector<double> host_values(const Tensor& t) {
  const size_t n = static_cast<size_t>(t->numel());
  std::vector<double> out(n);
  if (t->dtype == FLAME_DTYPE_F64) {
    ops::to_host(t, out.data(), n * 8);
  } else if (t->dtype == FLAME_DTYPE_F32) {
    std::vector<float> v(n);
    ops::to_host(t, v.data(), n * 4);
    for (size_t i = 0; i < n; ++i) out[i] = v[i];
  } else {
    std::vector<uint16_t> v(n);
    ops::to_host(t, v.data(), n * 2);
    for (size_t i = 0; i < n; ++i)
      out[i] = t->dtype == FLAME_DTYPE_BF16 ? bits_to_float(static_cast<uint32_t>(v[i]) << 16) : f16_value(v[i]);
  }
  return out;
}

std::vector<double> as_doubles(const Tensor& t) {
  return host_values(t->dtype == FLAME_DTYPE_F32 || t->dtype == FLAME_DTYPE_F64 || t->dtype == FLAME_DTYPE_F16 ||
                             t->dtype == FLAME_DTYPE_BF16
                         ? ops::contiguous(t)
                         : ops::to_dtype(t, FLAME_DTYPE_F32));
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}
double max_abs(const std::vector<double>& a) {
  double m = 0;
  for (double v : a) m = std::max(m, std::fabs(v));
  return m;
}

const char* name_of(DType d) { return dtype_name(d); }

class QuantizedOps : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (ctx) c = ctx->ctx;
  }
  Context* c = nullptr;
};

// ---- dequantize ----

struct DequantCase {
  Shape shape;       // q's shape
  bool per_row;      // scale [shape[0], 1, ...] or 0-d
  bool transposed;   // q is the transpose of a contiguous [shape[1], shape[0]] tensor (2-D only)
};

void check_dequantize(Context& c, DType qd, const DequantCase& k, DType out_dtype) {
  SCOPED_TRACE(std::string(name_of(qd)) + " -> " + name_of(out_dtype) + ", q " + shape_str(k.shape) +
               (k.per_row ? ", scale per row" : ", scale per tensor") + (k.transposed ? ", strided q" : ""));
  int64_t n = 1;
  for (int64_t s : k.shape) n *= s;
  const int64_t rows = k.shape[0], cols = n / rows;
  // codes: every byte value when n >= 256, spread over all of them otherwise
  std::vector<uint8_t> codes(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) codes[static_cast<size_t>(i)] = static_cast<uint8_t>(n >= 256 ? i % 256 : (i * 37) % 256);
  Tensor q;
  if (k.transposed) {  // q[r][j] = stored[j][r]
    std::vector<uint8_t> stored(static_cast<size_t>(n));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j) stored[static_cast<size_t>(j * rows + r)] = codes[static_cast<size_t>(r * cols + j)];
    q = ops::transpose(ops::from_host(c, stored.data(), stored.size(), {cols, rows}, qd), 0, 1);
  } else {
    q = ops::from_host(c, codes.data(), codes.size(), k.shape, qd);
  }
  std::vector<float> scales(static_cast<size_t>(k.per_row ? rows : 1));
  for (size_t r = 0; r < scales.size(); ++r) scales[r] = 0.0371f + 0.173f * static_cast<float>(r) / 3.0f;
  Shape scale_shape;
  if (k.per_row) {
    scale_shape.assign(k.shape.size(), 1);
    scale_shape[0] = rows;
  }
  const Tensor s = ops::from_host(c, scales.data(), scales.size() * 4, scale_shape, FLAME_DTYPE_F32);
  const Tensor out = ops::dequantize(q, s, out_dtype);
  ASSERT_EQ(out->dtype, out_dtype);
  ASSERT_EQ(out->shape, k.shape);
  const std::vector<double> got = host_values(out);
  // and dequantize_into a preallocated tensor: the same values
  const Tensor into = ops::empty(c, k.shape, out_dtype);
  ops::dequantize_into(q, s, into);
  const std::vector<double> got_into = host_values(into);

  const Format f = format_of(out_dtype);
  int64_t wrong = 0, far = 0, nan_wrong = 0;
  for (int64_t i = 0; i < n; ++i) {
    const size_t u = static_cast<size_t>(i);
    const uint8_t b = codes[u];
    const double qv = qd == FLAME_DTYPE_F8_E4M3 ? e4m3_value(b) : e5m2_value(b);
    const double exact = qv * static_cast<double>(scales[k.per_row ? static_cast<size_t>(i / cols) : 0]);  // exact in f64
    const double want = out_dtype == FLAME_DTYPE_F32 || out_dtype == FLAME_DTYPE_F64 ? round_to(exact, kF32)
                                                                                     : round_to(round_to(exact, kF32), f);
    if (std::isnan(exact)) {
      if (!std::isnan(got[u]) || !std::isnan(got_into[u])) ++nan_wrong;
      continue;
    }
    if (got[u] != want || got_into[u] != want || std::signbit(got[u]) != std::signbit(want)) {
      if (wrong < 5) ADD_FAILURE() << "element " << i << " (code 0x" << std::hex << int(b) << std::dec << "): got "
                                   << got[u] << ", want " << want << " (exact " << exact << ")";
      ++wrong;
    }
    if (std::isfinite(want)) {  // one rounding to f32 and one to the output type from the f64 product
      const double bound = std::fabs(exact) * (std::ldexp(1.0, -(f.mantissa + 1)) + std::ldexp(1.0, -24)) * (1 + 1e-9) +
                           std::ldexp(1.0, f.min_exp - f.mantissa - 1);
      if (std::fabs(got[u] - exact) > bound) ++far;
    }
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(far, 0) << "values further than one rounding from the float64 product";
  EXPECT_EQ(nan_wrong, 0) << "NaN codes must stay NaN";
}

TEST_F(QuantizedOps, DequantizeMatchesHostFloat64Reference) {
  const std::vector<DequantCase> cases = {
      {{8, 40}, false, false},    // 320 elements: every code, 8 per thread
      {{8, 40}, true, false},     // per row, rows of 40 (a multiple of 8)
      {{5, 13}, true, false},     // odd rows: one element per thread
      {{7, 9}, false, false},
      {{16, 24}, true, true},     // a strided (transposed) q
      {{4, 2, 16}, true, false},  // a 1x1-convolution-shaped weight, scale [4, 1, 1]
  };
  for (DType qd : {FLAME_DTYPE_F8_E4M3, FLAME_DTYPE_F8_E5M2})
    for (DType out : {FLAME_DTYPE_BF16, FLAME_DTYPE_F16, FLAME_DTYPE_F32, FLAME_DTYPE_F64})
      for (const DequantCase& k : cases) check_dequantize(*c, qd, k, out);
}

TEST_F(QuantizedOps, DequantizeRejectsBadArguments) {
  const Tensor q = ops::zeros(*c, {4, 8}, FLAME_DTYPE_F8_E4M3);
  const Tensor s = ops::full(*c, {}, FLAME_DTYPE_F32, 0.5);
  auto status = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.status();
    }
    return FLAME_OK;
  };
  EXPECT_EQ(status([&] { ops::dequantize(ops::zeros(*c, {4, 8}, FLAME_DTYPE_BF16), s, FLAME_DTYPE_F32); }),
            FLAME_ERROR_DTYPE_MISMATCH);
  EXPECT_EQ(status([&] { ops::dequantize(q, ops::full(*c, {}, FLAME_DTYPE_BF16, 0.5), FLAME_DTYPE_F32); }),
            FLAME_ERROR_DTYPE_MISMATCH);
  EXPECT_EQ(status([&] { ops::dequantize(q, s, FLAME_DTYPE_I32); }), FLAME_ERROR_DTYPE_MISMATCH);
  EXPECT_EQ(status([&] { ops::dequantize(q, ops::full(*c, {4}, FLAME_DTYPE_F32, 0.5), FLAME_DTYPE_F32); }),
            FLAME_ERROR_SHAPE_MISMATCH);  // [rows] would broadcast along the columns: not a row scale
  EXPECT_EQ(status([&] { ops::dequantize(q, ops::full(*c, {8, 1}, FLAME_DTYPE_F32, 0.5), FLAME_DTYPE_F32); }),
            FLAME_ERROR_SHAPE_MISMATCH);
  const Tensor out = ops::full(*c, {4, 8}, FLAME_DTYPE_F32, 7.0);
  EXPECT_EQ(status([&] { ops::dequantize_into(q, s, ops::empty(*c, {8, 4}, FLAME_DTYPE_F32)); }), FLAME_ERROR_SHAPE_MISMATCH);
  EXPECT_EQ(status([&] { ops::dequantize_into(q, s, ops::transpose(ops::empty(*c, {8, 4}, FLAME_DTYPE_F32), 0, 1)); }),
            FLAME_ERROR_SHAPE_MISMATCH);
  EXPECT_EQ(status([&] { ops::quantized_linear(ops::zeros(*c, {3, 5}, FLAME_DTYPE_F32), q, s, nullptr); }),
            FLAME_ERROR_SHAPE_MISMATCH);
  EXPECT_EQ(status([&] {
              ops::quantized_linear(ops::zeros(*c, {3, 8}, FLAME_DTYPE_F32), q, s, ops::zeros(*c, {4}, FLAME_DTYPE_BF16));
            }),
            FLAME_ERROR_DTYPE_MISMATCH);
  // nothing was written into a preallocated result on failure
  for (double v : host_values(out)) EXPECT_EQ(v, 7.0);
}

// ---- quantized_linear against linear over the dequantised weight ----

// A frozen fp8 weight [out, in] (quantize_into of a random one) and its scale.
std::pair<Tensor, Tensor> random_quantized(Context& c, int64_t out, int64_t in, bool per_row) {
  const Tensor w = ops::mul(ops::randn(c, {out, in}, FLAME_DTYPE_F32),
                            ops::rand(c, {out, 1}, FLAME_DTYPE_F32));  // rows of different ranges
  const Tensor q = ops::empty(c, {out, in}, FLAME_DTYPE_F8_E4M3);
  const Tensor s = ops::empty(c, models::scale_shape(per_row ? models::QuantScale::PerRow : models::QuantScale::PerTensor, {out, in}),
                              FLAME_DTYPE_F32);
  models::quantize_into(w, q, s);
  return {q, s};
}

Tensor leaf(const Tensor& t) {
  autograd_meta(*t).requires_grad = true;
  return t;
}

void check_linear(Context& c, DType d, bool per_row) {
  SCOPED_TRACE(std::string(name_of(d)) + (per_row ? ", scale per row" : ", scale per tensor"));
  const auto [q, s] = random_quantized(c, 24, 32, per_row);
  const Tensor x = leaf(ops::to_dtype(ops::randn(c, {2, 3, 32}, FLAME_DTYPE_F32), d));
  const Tensor b = leaf(ops::to_dtype(ops::randn(c, {24}, FLAME_DTYPE_F32), d));
  const Tensor gy = ops::to_dtype(ops::randn(c, {2, 3, 24}, FLAME_DTYPE_F32), d);
  auto run = [&](bool fp8) {
    const Tensor y = fp8 ? ops::quantized_linear(x, q, s, b)
                         : ops::linear(x, models::dequantize(q, s, d), b, ops::Activation::None);
    BackwardRequest req;
    req.roots = {y};
    req.root_grads = {gy};
    req.inputs = {x, b};
    std::vector<Tensor> g = run_backward(c, req);
    return std::vector<Tensor>{y, g.at(0), g.at(1)};
  };
  const std::vector<Tensor> fp8 = run(true), old = run(false);
  const double tol = d == FLAME_DTYPE_F32 ? 1e-6 : std::ldexp(1.0, -9);
  const char* what[] = {"output", "input gradient", "bias gradient"};
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(fp8[i] && old[i]) << what[i] << " missing";
    EXPECT_EQ(fp8[i]->shape, old[i]->shape) << what[i];
    EXPECT_EQ(fp8[i]->dtype, d) << what[i];
    const std::vector<double> a = as_doubles(fp8[i]), r = as_doubles(old[i]);
    EXPECT_LE(max_abs_diff(a, r), tol * std::max(max_abs(r), 1e-30)) << what[i];
    EXPECT_GT(max_abs(r), 0) << what[i];
  }
}

TEST_F(QuantizedOps, LinearEqualsLinearOverTheDequantizedWeight) {
  for (DType d : {FLAME_DTYPE_BF16, FLAME_DTYPE_F16, FLAME_DTYPE_F32})
    for (bool per_row : {false, true}) check_linear(*c, d, per_row);
}

TEST_F(QuantizedOps, LinearRecordsOneNodeAndDifferentiatesUnderCreateGraph) {
  const auto [q, s] = random_quantized(*c, 6, 5, true);
  const Tensor x = leaf(ops::randn(*c, {4, 5}, FLAME_DTYPE_F32));
  const Tensor y = ops::quantized_linear(x, q, s, nullptr);
  ASSERT_TRUE(autograd_meta(*y).grad_fn);
  EXPECT_EQ(autograd_meta(*y).grad_fn->op, OpId::QuantizedLinear);
  EXPECT_EQ(autograd_meta(*y).grad_fn->next.size(), 2u) << "inputs x and bias only: q and scale are constants";
  EXPECT_FALSE(requires_grad(*q));
  // gx = g W with g requiring grad: the rule's mm is recorded, so d(sum(gx * v))/dg = v W^T
  const Tensor g = leaf(ops::randn(*c, {4, 6}, FLAME_DTYPE_F32));
  BackwardRequest first;
  first.roots = {y};
  first.root_grads = {g};
  first.inputs = {x};
  first.create_graph = true;
  const Tensor gx = run_backward(*c, first).at(0);
  ASSERT_TRUE(gx && requires_grad(*gx));
  const Tensor v = ops::randn(*c, {4, 5}, FLAME_DTYPE_F32);
  BackwardRequest second;
  second.roots = {gx};
  second.root_grads = {v};
  second.inputs = {g};
  const Tensor gg = run_backward(*c, second).at(0);
  const Tensor w = models::dequantize(q, s, FLAME_DTYPE_F32);
  const std::vector<double> got = as_doubles(gg), want = as_doubles(ops::matmul(v, ops::transpose(w, 0, 1)));
  EXPECT_LE(max_abs_diff(got, want), 1e-5 * max_abs(want));
}

// ---- memory: the fp8 weight saved instead of its dequantised copy ----

uint64_t peak_of_forward_backward(flame_ctx_t handle, Context& c, const std::vector<std::pair<Tensor, Tensor>>& layers,
                                  const Tensor& x, bool fp8) {
  flame_memory_stats_t before, after;
  before.struct_size = after.struct_size = sizeof(flame_memory_stats_t);
  EXPECT_EQ(flame_ctx_reset_peak_memory(handle), FLAME_OK);
  EXPECT_EQ(flame_ctx_memory_stats(handle, &before), FLAME_OK);
  {
    Tensor h = x;
    for (const auto& [q, s] : layers)
      h = fp8 ? ops::quantized_linear(h, q, s, nullptr)
              : ops::linear(h, models::dequantize(q, s, x->dtype), nullptr, ops::Activation::None);
    BackwardRequest req;
    req.roots = {ops::sum(ops::to_dtype(h, FLAME_DTYPE_F32), {0, 1}, false)};
    req.root_grads = {nullptr};
    req.inputs = {x};
    const Tensor gx = run_backward(c, req).at(0);
    EXPECT_TRUE(gx);
  }
  EXPECT_EQ(flame_ctx_memory_stats(handle, &after), FLAME_OK);
  return after.peak_bytes_in_use - before.bytes_in_use;
}

TEST_F(QuantizedOps, StackOfFp8LinearsPeaksLowerThanSavingDequantizedWeights) {
  const int64_t D = 1024, layers = 6;
  std::vector<std::pair<Tensor, Tensor>> stack;
  for (int64_t l = 0; l < layers; ++l) stack.push_back(random_quantized(*c, D, D, l % 2 == 1));
  const Tensor x = leaf(ops::to_dtype(ops::randn(*c, {16, D}, FLAME_DTYPE_F32), FLAME_DTYPE_BF16));
  peak_of_forward_backward(ctx, *c, stack, x, false);  // warm-up: cuBLASLt's workspace and the kernels
  peak_of_forward_backward(ctx, *c, stack, x, true);
  c->synchronize();
  const uint64_t dequantized = peak_of_forward_backward(ctx, *c, stack, x, false);
  const uint64_t fp8 = peak_of_forward_backward(ctx, *c, stack, x, true);
  const uint64_t weight_bytes = static_cast<uint64_t>(D * D * 2);  // one dequantised bf16 weight
  // the old path holds all six dequantised weights at the end of forward; the fp8 layer one at a time
  EXPECT_GE(dequantized, static_cast<uint64_t>(layers) * weight_bytes);
  EXPECT_LE(fp8 + 4 * weight_bytes, dequantized) << "fp8 path peak " << fp8 << " bytes, dequantised-weights path "
                                                  << dequantized << " bytes";
  EXPECT_LE(fp8, 3 * weight_bytes) << "more than a dequantised weight or two alive at once";
}

}  // namespace

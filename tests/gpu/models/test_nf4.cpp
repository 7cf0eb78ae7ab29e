// The frozen NF4 base's ops on a GPU (white-box, src/ops/nf4.h, kernels cuda/nf4.cuh):
//  - quantisation of random matrices (f32 and bf16, block sizes 16 / 64 / 256, with and without
//    double quantisation) against a host reference of the NF4 algorithm written out here: absmax =
//    max |w| per block, n = w * (1 / absmax) in f32 (as bitsandbytes), the code of the nearest of
//    QLoRA's 16 levels with a value on a midpoint going to the lower code (bitsandbytes' x > t): the
//    codes and the f32 absmax exactly; with double quantisation the mean, the 8-bit scales exactly
//    (f32 max of |absmax - mean|) and each absmax rebuilt (code8 * scale + mean) within the 8-bit
//    code's quantisation error; the dequantised values equal level * absmax rounded once in f32
//    (and then to f16 / bf16 / f64 as FLAME's casts round);
//  - values exactly on a decision threshold, just above it, and an all-zero block;
//  - nf4_linear: output and gradients of x and bias equal to linear over the dequantised weight, one
//    Nf4Linear node, its rule under create_graph; memory: a stack of NF4 linears peaks lower than
//    with the dequantised weights saved;
//  - bitsandbytes, when the machine's python3 has torch with CUDA and bitsandbytes: the same packed
//    codes and absmax for the same matrix (else that one test skips and says why).
// The model-level tests (tiny Flux / SDXL UNet, LoRA, memory) are in tests/gpu/test_model_nf4.cpp.
// Without a GPU the tests skip unless FLAME_REQUIRE_GPU=1.
#include <gtest/gtest.h>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>
#include <unistd.h>
#include "autograd/engine.h"
#include "core/error.h"
#include "flame_test.h"
#include "ops/nf4.h"
#include "ops/ops.h"
#include "runtime/context.h"
#include "tensor/autograd_graph.h"

using namespace flame;

namespace {

// ---- host reference, written out here rather than taken from FLAME ----

// QLoRA's NF4 levels (bitsandbytes' nf4_dequantization_lut, as f32), code order.
const std::array<float, 16> kLevels = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,
    -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,
    0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f,
    0.7229568362236023f, 1.0f};

// bitsandbytes' dQuantizeNF4 decision constants (csrc/kernels.cu), ascending, as f32 literals. They
// are the midpoints of the float64 levels, and differ by one ulp from the midpoint of the f32 levels
// at k = 0, 8, 12 and 14, so they are written out rather than computed from kLevels.
const std::array<float, 15> kThresholds = {
    -0.8480964004993439f, -0.6106329262256622f, -0.4599952697753906f, -0.33967943489551544f,
    -0.23460740596055984f, -0.13791173323988914f, -0.045525018125772476f, 0.03979014977812767f,
    0.1202552504837513f, 0.2035212516784668f, 0.2920137718319893f, 0.3893125355243683f,
    0.5016634166240692f, 0.6427869200706482f, 0.8614784181118011f};

// The threshold between codes k and k + 1.
float threshold(int k) { return kThresholds[static_cast<size_t>(k)]; }

// The code of the level nearest to n (a value on a midpoint: the lower code).
int reference_code(float n) {
  int c = 0;
  for (int k = 0; k < 15; ++k)
    if (static_cast<double>(n) > static_cast<double>(threshold(k))) c = k + 1;
  return c;
}

struct Reference {
  std::vector<float> absmax;  // per block, f32
  std::vector<int> codes;     // per element
};

Reference reference_quantize(const std::vector<float>& w, int64_t block) {
  Reference r;
  const size_t blocks = w.size() / static_cast<size_t>(block);
  r.absmax.resize(blocks);
  r.codes.resize(w.size());
  for (size_t b = 0; b < blocks; ++b) {
    float m = 0.0f;
    for (int64_t i = 0; i < block; ++i) m = std::max(m, std::fabs(w[b * static_cast<size_t>(block) + static_cast<size_t>(i)]));
    r.absmax[b] = m;
    const float inv = m > 0.0f ? 1.0f / m : 0.0f;  // f32, as the kernel and bitsandbytes
    for (int64_t i = 0; i < block; ++i) {
      const size_t k = b * static_cast<size_t>(block) + static_cast<size_t>(i);
      r.codes[k] = reference_code(w[k] * inv);
    }
  }
  return r;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  std::vector<uint8_t> v(static_cast<size_t>(t->numel()));
  ops::to_host(t, v.data(), v.size());
  return v;
}
std::vector<float> floats_of(const Tensor& t) {
  const Tensor f = t->dtype == FLAME_DTYPE_F32 ? ops::contiguous(t) : ops::to_dtype(t, FLAME_DTYPE_F32);
  std::vector<float> v(static_cast<size_t>(f->numel()));
  ops::to_host(f, v.data(), v.size() * sizeof(float));
  return v;
}
std::vector<int> codes_of(const ops::Nf4Weight& w) {
  const std::vector<uint8_t> packed = bytes_of(w.packed);
  std::vector<int> c(packed.size() * 2);
  for (size_t i = 0; i < packed.size(); ++i) {
    c[2 * i] = packed[i] >> 4;  // the first element in the high nibble (bitsandbytes)
    c[2 * i + 1] = packed[i] & 15;
  }
  return c;
}

// The absmax values the dequantisation uses: as stored, or rebuilt from the 8-bit codes (f32
// product, then f32 sum with the mean).
std::vector<float> used_absmax(const ops::Nf4Weight& w) {
  if (!w.double_quant()) return floats_of(w.absmax);
  const std::vector<uint8_t> q = bytes_of(w.absmax);
  const std::vector<float> scale = floats_of(w.nested_scale), code = floats_of(w.nested_code);
  const float mean = floats_of(w.nested_offset).at(0);
  std::vector<float> a(q.size());
  for (size_t b = 0; b < q.size(); ++b) {
    volatile float product = code[q[b]] * scale[b / 256];  // rounded to f32 before the sum
    a[b] = product + mean;
  }
  return a;
}

class Nf4Ops : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (ctx) c = ctx->ctx;
  }
  Context* c = nullptr;
};

// A random [out, in] matrix whose rows have different ranges (some blocks small, some large).
Tensor random_weight(Context& c, int64_t out, int64_t in, DType d) {
  const Tensor w = ops::mul(ops::randn(c, {out, in}, FLAME_DTYPE_F32), ops::add_scalar(ops::rand(c, {out, 1}, FLAME_DTYPE_F32), 0.05));
  return d == FLAME_DTYPE_F32 ? w : ops::to_dtype(w, d);
}

void check_round_trip(Context& c, DType input, int64_t block, bool double_quant) {
  SCOPED_TRACE(std::string(dtype_name(input)) + ", block " + std::to_string(block) + (double_quant ? ", double quant" : ""));
  const int64_t out = 48, in = 512;
  const Tensor w = random_weight(c, out, in, input);
  const ops::Nf4Weight q = ops::nf4_empty(c, out, in, block, double_quant ? ops::nf4_dynamic_map(c) : nullptr);
  ops::nf4_quantize_into(w, q);
  EXPECT_EQ(q.packed->shape, Shape({out, in / 2}));
  EXPECT_EQ(q.absmax->numel(), out * in / block);
  EXPECT_EQ(q.block_size(), block);
  EXPECT_EQ(q.in_features(), in);

  const std::vector<float> wh = floats_of(w);  // bf16 input: its values, exactly, in f32
  const Reference ref = reference_quantize(wh, block);
  const std::vector<int> codes = codes_of(q);
  ASSERT_EQ(codes.size(), ref.codes.size());
  int64_t wrong = 0;
  for (size_t i = 0; i < codes.size(); ++i) wrong += codes[i] != ref.codes[i];
  EXPECT_EQ(wrong, 0) << "codes differ from the host reference";

  const std::vector<float> absmax = used_absmax(q);
  if (!double_quant) {
    EXPECT_EQ(floats_of(q.absmax), ref.absmax) << "absmax differs from max |w| per block";
  } else {
    // the mean of the absmax values, and per block of 256 the f32 max of |absmax - mean| as the scale
    double sum = 0;
    for (float a : ref.absmax) sum += a;
    const float mean = floats_of(q.nested_offset).at(0);
    EXPECT_NEAR(mean, sum / static_cast<double>(ref.absmax.size()), 1e-6 * std::fabs(sum / ref.absmax.size()));
    const std::vector<float> scale = floats_of(q.nested_scale), code = floats_of(q.nested_code);
    ASSERT_EQ(scale.size(), (ref.absmax.size() + 255) / 256);
    for (size_t chunk = 0; chunk < scale.size(); ++chunk) {
      float m = 0.0f;
      for (size_t b = chunk * 256; b < std::min(ref.absmax.size(), (chunk + 1) * 256); ++b) m = std::max(m, std::fabs(ref.absmax[b] - mean));
      EXPECT_EQ(scale[chunk], m) << "nested scale of chunk " << chunk;
    }
    // each absmax within the 8-bit code's quantisation error: half the gap to the neighbour on its side
    const std::vector<uint8_t> qa = bytes_of(q.absmax);
    for (size_t b = 0; b < ref.absmax.size(); ++b) {
      const float s = scale[b / 256];
      const double v = (static_cast<double>(ref.absmax[b]) - mean) / s;  // normalised, in [-1, 1]
      const auto hi = std::lower_bound(code.begin(), code.end(), static_cast<float>(v));
      const double up = hi == code.end() ? code.back() : *hi, down = hi == code.begin() ? code.front() : *(hi - 1);
      const double error_bound = (0.5 * std::max(up - down, 0.0) + 1e-6) * s;
      EXPECT_LE(std::fabs(static_cast<double>(absmax[b]) - ref.absmax[b]), error_bound)
          << "block " << b << ": code " << int(qa[b]) << " for " << v;
    }
  }

  // dequantised: level * absmax rounded once in f32, then to the output type by FLAME's cast
  const Tensor d32 = ops::nf4_dequantize(q, FLAME_DTYPE_F32);
  EXPECT_EQ(d32->shape, Shape({out, in}));
  const std::vector<float> got = floats_of(d32);
  int64_t off = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float want = kLevels[static_cast<size_t>(codes[i])] * absmax[i / static_cast<size_t>(block)];
    off += got[i] != want;
  }
  EXPECT_EQ(off, 0) << "dequantised values differ from level * absmax in f32";
  for (DType d : {FLAME_DTYPE_BF16, FLAME_DTYPE_F16, FLAME_DTYPE_F64}) {
    const Tensor dq = ops::nf4_dequantize(q, d);
    EXPECT_EQ(dq->dtype, d);
    EXPECT_EQ(floats_of(dq), floats_of(ops::to_dtype(d32, d))) << dtype_name(d);  // f64 -> f32: exact here
  }
  // and against the original: within half the widest level gap (between -1 and -0.696: 0.304 / 2)
  // of each block's absmax,
  // plus the absmax's own 8-bit error
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const size_t b = i / static_cast<size_t>(block);
    const double a = ref.absmax[b];
    const double e = std::fabs(got[i] - wh[i]) - std::fabs(absmax[b] - a);
    if (a > 0) worst = std::max(worst, e / a);
  }
  EXPECT_LE(worst, 0.5 * (1.0 - 0.6961928009986877) + 1e-6);
}

TEST_F(Nf4Ops, QuantizeAndDequantizeMatchTheHostReference) {
  for (int64_t block : {16, 64, 256})
    for (bool dq : {false, true}) check_round_trip(*c, FLAME_DTYPE_F32, block, dq);
  check_round_trip(*c, FLAME_DTYPE_BF16, 64, true);
  check_round_trip(*c, FLAME_DTYPE_F16, 64, false);
}

TEST_F(Nf4Ops, ThresholdsTiesAndZeroBlocks) {
  // block 0: 1.0 (absmax 1, so n = w exactly), each threshold, and the next float above each;
  // block 1: all zero.
  const int64_t block = 32;
  std::vector<float> w(2 * block, 0.0f);
  w[0] = 1.0f;
  for (int k = 0; k < 15; ++k) {
    w[1 + k] = threshold(k);
    w[16 + k] = std::nextafter(threshold(k), 2.0f);
  }
  const Tensor t = ops::from_host(*c, w.data(), w.size() * sizeof(float), {1, 2 * block}, FLAME_DTYPE_F32);
  const ops::Nf4Weight q = ops::nf4_empty(*c, 1, 2 * block, block, nullptr);
  ops::nf4_quantize_into(t, q);
  const std::vector<int> codes = codes_of(q);
  EXPECT_EQ(codes[0], 15);
  for (int k = 0; k < 15; ++k) {
    EXPECT_EQ(codes[1 + k], k) << "a value on threshold " << k << " takes the lower code";
    EXPECT_EQ(codes[16 + k], k + 1) << "the float above threshold " << k << " takes the upper code";
  }
  for (int64_t i = block; i < 2 * block; ++i) EXPECT_EQ(codes[static_cast<size_t>(i)], 7) << "zero block, element " << i;
  EXPECT_EQ(floats_of(q.absmax), std::vector<float>({1.0f, 0.0f}));
  const std::vector<float> d = floats_of(ops::nf4_dequantize(q, FLAME_DTYPE_F32));
  for (int64_t i = block; i < 2 * block; ++i) EXPECT_EQ(d[static_cast<size_t>(i)], 0.0f);
  EXPECT_EQ(d[0], 1.0f);
}

TEST_F(Nf4Ops, DynamicMapIsBitsandbytesSignedEightBitCode) {
  const std::array<float, 256> m = ops::nf4_dynamic_map_values();
  EXPECT_TRUE(std::is_sorted(m.begin(), m.end()));
  EXPECT_EQ(m[255], 1.0f);
  EXPECT_EQ(m[127], 0.0f);  // 127 negative values, 0, 127 positive values, 1
  for (int i = 0; i < 127; ++i) EXPECT_EQ(m[static_cast<size_t>(i)], -m[static_cast<size_t>(254 - i)]) << i;
  EXPECT_NEAR(m[128], 0.55e-6, 1e-12);          // the smallest: 1e-6 * (0.1 + 1) / 2
  EXPECT_NEAR(m[254], 0.99296875, 1e-6);        // the largest below 1: (1 - 0.9 / 128 + 1) / 2
}

TEST_F(Nf4Ops, RejectsBadArguments) {
  auto status = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.status();
    }
    return FLAME_OK;
  };
  EXPECT_EQ(status([&] { ops::nf4_empty(*c, 4, 64, 48, nullptr); }), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(status([&] { ops::nf4_empty(*c, 4, 64, 8, nullptr); }), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(status([&] { ops::nf4_empty(*c, 4, 64, 8192, nullptr); }), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(status([&] { ops::nf4_empty(*c, 4, 40, 16, nullptr); }), FLAME_ERROR_INVALID_ARGUMENT);
  const ops::Nf4Weight q = ops::nf4_empty(*c, 4, 64, 16, nullptr);
  EXPECT_EQ(status([&] { ops::nf4_quantize_into(ops::zeros(*c, {4, 32}, FLAME_DTYPE_F32), q); }), FLAME_ERROR_SHAPE_MISMATCH);
  EXPECT_EQ(status([&] { ops::nf4_quantize_into(ops::zeros(*c, {4, 64}, FLAME_DTYPE_I32), q); }), FLAME_ERROR_DTYPE_MISMATCH);
  EXPECT_EQ(status([&] { ops::nf4_dequantize(q, FLAME_DTYPE_I32); }), FLAME_ERROR_DTYPE_MISMATCH);
  EXPECT_EQ(status([&] { ops::nf4_linear(ops::zeros(*c, {3, 32}, FLAME_DTYPE_F32), q, nullptr); }), FLAME_ERROR_SHAPE_MISMATCH);
  EXPECT_EQ(status([&] { ops::nf4_linear(ops::zeros(*c, {3, 64}, FLAME_DTYPE_F32), q, ops::zeros(*c, {4}, FLAME_DTYPE_BF16)); }),
            FLAME_ERROR_DTYPE_MISMATCH);
  ops::Nf4Weight broken = q;
  broken.absmax = ops::zeros(*c, {3}, FLAME_DTYPE_F32);  // 3 blocks for 256 elements
  EXPECT_EQ(status([&] { ops::nf4_dequantize(broken, FLAME_DTYPE_F32); }), FLAME_ERROR_SHAPE_MISMATCH);
}

// ---- nf4_linear against linear over the dequantised weight ----

Tensor leaf(const Tensor& t) {
  autograd_meta(*t).requires_grad = true;
  return t;
}

ops::Nf4Weight random_nf4(Context& c, int64_t out, int64_t in, bool double_quant) {
  const ops::Nf4Weight q = ops::nf4_empty(c, out, in, 64, double_quant ? ops::nf4_dynamic_map(c) : nullptr);
  ops::nf4_quantize_into(random_weight(c, out, in, FLAME_DTYPE_F32), q);
  return q;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  return d;
}
double max_abs(const std::vector<float>& a) {
  double m = 0;
  for (float v : a) m = std::max(m, std::fabs(static_cast<double>(v)));
  return m;
}

void check_linear(Context& c, DType d, bool double_quant, ops::Activation act) {
  SCOPED_TRACE(std::string(dtype_name(d)) + (double_quant ? ", double quant" : "") +
               (act == ops::Activation::GeluTanh ? ", gelu" : ""));
  const ops::Nf4Weight q = random_nf4(c, 24, 128, double_quant);
  const Tensor x = leaf(ops::to_dtype(ops::randn(c, {2, 3, 128}, FLAME_DTYPE_F32), d));
  const Tensor b = leaf(ops::to_dtype(ops::randn(c, {24}, FLAME_DTYPE_F32), d));
  const Tensor gy = ops::to_dtype(ops::randn(c, {2, 3, 24}, FLAME_DTYPE_F32), d);
  auto run = [&](bool nf4) {
    const Tensor y = nf4 ? ops::nf4_linear(x, q, b, act) : ops::linear(x, ops::nf4_dequantize(q, d), b, act);
    BackwardRequest req;
    req.roots = {y};
    req.root_grads = {gy};
    req.inputs = {x, b};
    std::vector<Tensor> g = run_backward(c, req);
    return std::vector<Tensor>{y, g.at(0), g.at(1)};
  };
  const std::vector<Tensor> nf4 = run(true), plain = run(false);
  const double tol = d == FLAME_DTYPE_F32 ? 1e-6 : std::ldexp(1.0, -9);
  const char* what[] = {"output", "input gradient", "bias gradient"};
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(nf4[i] && plain[i]) << what[i] << " missing";
    EXPECT_EQ(nf4[i]->shape, plain[i]->shape) << what[i];
    EXPECT_EQ(nf4[i]->dtype, d) << what[i];
    const std::vector<float> a = floats_of(nf4[i]), r = floats_of(plain[i]);
    EXPECT_LE(max_abs_diff(a, r), tol * std::max(max_abs(r), 1e-30)) << what[i];
    EXPECT_GT(max_abs(r), 0) << what[i];
  }
}

TEST_F(Nf4Ops, LinearEqualsLinearOverTheDequantizedWeight) {
  for (DType d : {FLAME_DTYPE_BF16, FLAME_DTYPE_F32})
    for (bool dq : {false, true}) check_linear(*c, d, dq, ops::Activation::None);
  check_linear(*c, FLAME_DTYPE_BF16, true, ops::Activation::GeluTanh);
}

TEST_F(Nf4Ops, LinearRecordsOneNodeAndDifferentiatesUnderCreateGraph) {
  const ops::Nf4Weight q = random_nf4(*c, 6, 64, true);
  const Tensor x = leaf(ops::randn(*c, {4, 64}, FLAME_DTYPE_F32));
  const Tensor y = ops::nf4_linear(x, q, nullptr);
  ASSERT_TRUE(autograd_meta(*y).grad_fn);
  EXPECT_EQ(autograd_meta(*y).grad_fn->op, OpId::Nf4Linear);
  EXPECT_EQ(autograd_meta(*y).grad_fn->next.size(), 2u) << "inputs x and bias only: the NF4 tensors are constants";
  EXPECT_FALSE(requires_grad(*q.packed));
  const Tensor g = leaf(ops::randn(*c, {4, 6}, FLAME_DTYPE_F32));
  BackwardRequest first;
  first.roots = {y};
  first.root_grads = {g};
  first.inputs = {x};
  first.create_graph = true;
  const Tensor gx = run_backward(*c, first).at(0);
  ASSERT_TRUE(gx && requires_grad(*gx));
  const Tensor v = ops::randn(*c, {4, 64}, FLAME_DTYPE_F32);
  BackwardRequest second;
  second.roots = {gx};
  second.root_grads = {v};
  second.inputs = {g};
  const Tensor gg = run_backward(*c, second).at(0);
  const Tensor w = ops::nf4_dequantize(q, FLAME_DTYPE_F32);
  const std::vector<float> got = floats_of(gg), want = floats_of(ops::matmul(v, ops::transpose(w, 0, 1)));
  EXPECT_LE(max_abs_diff(got, want), 1e-5 * max_abs(want));
}

// ---- memory: the packed weight saved instead of its dequantised copy ----

uint64_t peak_of_forward_backward(flame_ctx_t handle, Context& c, const std::vector<ops::Nf4Weight>& layers, const Tensor& x,
                                  bool nf4) {
  flame_memory_stats_t before, after;
  before.struct_size = after.struct_size = sizeof(flame_memory_stats_t);
  EXPECT_EQ(flame_ctx_reset_peak_memory(handle), FLAME_OK);
  EXPECT_EQ(flame_ctx_memory_stats(handle, &before), FLAME_OK);
  {
    Tensor h = x;
    for (const ops::Nf4Weight& q : layers)
      h = nf4 ? ops::nf4_linear(h, q, nullptr) : ops::linear(h, ops::nf4_dequantize(q, x->dtype), nullptr, ops::Activation::None);
    BackwardRequest req;
    req.roots = {ops::sum(ops::to_dtype(h, FLAME_DTYPE_F32), {0, 1}, false)};
    req.root_grads = {nullptr};
    req.inputs = {x};
    EXPECT_TRUE(run_backward(c, req).at(0));
  }
  EXPECT_EQ(flame_ctx_memory_stats(handle, &after), FLAME_OK);
  return after.peak_bytes_in_use - before.bytes_in_use;
}

TEST_F(Nf4Ops, StackOfNf4LinearsPeaksLowerThanSavingDequantizedWeights) {
  const int64_t D = 1024, layers = 6;
  std::vector<ops::Nf4Weight> stack;
  for (int64_t l = 0; l < layers; ++l) stack.push_back(random_nf4(*c, D, D, l % 2 == 0));
  const Tensor x = leaf(ops::to_dtype(ops::randn(*c, {16, D}, FLAME_DTYPE_F32), FLAME_DTYPE_BF16));
  peak_of_forward_backward(ctx, *c, stack, x, false);  // warm-up: cuBLASLt's workspace and the kernels
  peak_of_forward_backward(ctx, *c, stack, x, true);
  c->synchronize();
  const uint64_t dequantized = peak_of_forward_backward(ctx, *c, stack, x, false);
  const uint64_t nf4 = peak_of_forward_backward(ctx, *c, stack, x, true);
  const uint64_t weight_bytes = static_cast<uint64_t>(D * D * 2);  // one dequantised bf16 weight
  EXPECT_GE(dequantized, static_cast<uint64_t>(layers) * weight_bytes);
  EXPECT_LE(nf4 + 4 * weight_bytes, dequantized) << "NF4 path peak " << nf4 << " bytes, dequantised path " << dequantized;
  EXPECT_LE(nf4, 3 * weight_bytes) << "more than a dequantised weight or two alive at once";
}

// ---- bitsandbytes, when the GPU machine has it ----

// Runs python3 with script; returns its exit status (-1 when it cannot start).
int run_python(const std::string& script_path) {
  const std::string cmd = "python3 " + script_path + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  char buf[512];
  std::string out;
  while (fgets(buf, sizeof buf, p)) out += buf;
  const int rc = pclose(p);
  if (rc != 0) std::fprintf(stderr, "python3 %s: %s\n", script_path.c_str(), out.c_str());
  return rc;
}

void remove_dir(const std::string& dir) {
  if (std::system(("rm -rf " + dir).c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", dir.c_str());
}

template <class V>
V read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  V v;
  f.seekg(0, std::ios::end);
  const std::streamsize n = f.tellg();
  f.seekg(0);
  v.resize(static_cast<size_t>(n) / sizeof(typename V::value_type));
  f.read(reinterpret_cast<char*>(v.data()), n);
  return v;
}

TEST_F(Nf4Ops, MatchesBitsandbytesWhenInstalled) {
  const std::string dir = "/tmp/flame_nf4_bnb_" + std::to_string(static_cast<long>(getpid()));
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  {
    std::ofstream probe(dir + "/probe.py");
    probe << "import torch, bitsandbytes\nassert torch.cuda.is_available()\n";
  }
  if (run_python(dir + "/probe.py") != 0) {
    remove_dir(dir);
    GTEST_SKIP() << "python3 with torch (CUDA) and bitsandbytes is not installed here: the comparison with "
                    "bitsandbytes did not run (the host reference tests above still hold)";
  }
  const int64_t out = 64, in = 256;
  const Tensor w = random_weight(*c, out, in, FLAME_DTYPE_F32);
  const std::vector<float> wh = floats_of(w);
  {
    std::ofstream f(dir + "/w.f32", std::ios::binary);
    f.write(reinterpret_cast<const char*>(wh.data()), static_cast<std::streamsize>(wh.size() * sizeof(float)));
    std::ofstream s(dir + "/bnb.py");
    s << "import numpy as np, torch, bitsandbytes.functional as F\n"
      << "d = '" << dir << "'\n"
      << "w = torch.from_numpy(np.fromfile(d + '/w.f32', dtype=np.float32)).reshape(" << out << ", " << in << ").cuda()\n"
      << "for dq in (False, True):\n"
      << "    q, st = F.quantize_4bit(w, blocksize=64, compress_statistics=dq, quant_type='nf4')\n"
      << "    tag = '/dq' if dq else '/plain'\n"
      << "    q.cpu().numpy().tofile(d + tag + '.packed')\n"
      << "    st.absmax.cpu().numpy().tofile(d + tag + '.absmax')\n"
      << "    F.dequantize_4bit(q, st).float().cpu().numpy().tofile(d + tag + '.deq')\n"
      << "    if dq:\n"
      << "        st.state2.absmax.cpu().numpy().tofile(d + tag + '.scale')\n"
      << "        np.array([st.offset.item()], dtype=np.float32).tofile(d + tag + '.offset')\n";
  }
  ASSERT_EQ(run_python(dir + "/bnb.py"), 0) << "bitsandbytes failed on the matrix";
  for (bool dq : {false, true}) {
    SCOPED_TRACE(dq ? "compress_statistics=True" : "compress_statistics=False");
    const std::string tag = dir + (dq ? "/dq" : "/plain");
    const ops::Nf4Weight q = ops::nf4_empty(*c, out, in, 64, dq ? ops::nf4_dynamic_map(*c) : nullptr);
    ops::nf4_quantize_into(w, q);
    EXPECT_EQ(bytes_of(q.packed), read_file<std::vector<uint8_t>>(tag + ".packed")) << "packed codes differ";
    const std::vector<float> deq = read_file<std::vector<float>>(tag + ".deq"), mine = floats_of(ops::nf4_dequantize(q, FLAME_DTYPE_F32));
    if (!dq) {
      EXPECT_EQ(floats_of(q.absmax), read_file<std::vector<float>>(tag + ".absmax"));
      EXPECT_EQ(mine, deq);
      continue;
    }
    // the mean may differ in its last bits (another reduction order), and so an absmax code at a midpoint
    const std::vector<uint8_t> qa = bytes_of(q.absmax), bnb_qa = read_file<std::vector<uint8_t>>(tag + ".absmax");
    ASSERT_EQ(qa.size(), bnb_qa.size());
    int64_t differ = 0;
    for (size_t i = 0; i < qa.size(); ++i) differ += qa[i] != bnb_qa[i];
    EXPECT_LE(differ, static_cast<int64_t>(qa.size() / 100)) << "absmax codes differ from bitsandbytes'";
    EXPECT_NEAR(floats_of(q.nested_offset).at(0), read_file<std::vector<float>>(tag + ".offset").at(0), 1e-6);
    EXPECT_LE(max_abs_diff(mine, deq), 1e-2 * max_abs(deq));
  }
  remove_dir(dir);
}

}  // namespace

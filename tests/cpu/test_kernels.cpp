// Compiles the kernel instantiations FLAME can launch, through NVRTC, for sm_80 and sm_90, without
// a GPU. The instantiations come from the same functions the runtime uses to name kernels, driven
// by the op list, so a new op or dtype rule is covered automatically.
//
// Two matrices (FLAME_KERNEL_MATRIX): "full" compiles every instantiation (about 26 CPU-minutes;
// ctest label kernels-full, which CI runs); the default, "sample", compiles each kernel template
// once per dtype-family signature (floating 32/64-bit, 16-bit floating, integer/bool) and every
// other template argument (functor, vector width, layout, ...) at least once per kernel template:
// kernel_sample() below. A syntax or type error in a template, in a functor, or in a 16-bit or
// integer path fails the default run; the full run adds the remaining dtype combinations.
#include <gtest/gtest.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <set>
#include "core/error.h"
#include "ops/launch.h"
#include "ops/nn.h"
#include "tensor/op_list.h"
#include "runtime/nvrtc_compiler.h"

using namespace flame;

namespace {

const DType kAll[] = {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_F64,
                      FLAME_DTYPE_I32, FLAME_DTYPE_I64, FLAME_DTYPE_U8,  FLAME_DTYPE_BOOL};
const DType kFloat[] = {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_F64};
const DType kF8[] = {FLAME_DTYPE_F8_E4M3, FLAME_DTYPE_F8_E5M2};  // storage dtypes: casts and fills only

// The elementwise kernels the f8 dtypes take: casts to and from every dtype (f8 to f8 too) and fills.
std::vector<std::string> f8_names() {
  std::set<std::string> names;
  auto add = [&](const std::vector<std::string>& v) { names.insert(v.begin(), v.end()); };
  for (DType q : kF8) {
    add(elementwise_instantiations("Fill", q, {}));
    for (DType d : kAll) {
      add(elementwise_instantiations("Identity", q, {d}));
      add(elementwise_instantiations("Identity", d, {q}));
    }
    for (DType r : kF8) add(elementwise_instantiations("Identity", q, {r}));
  }
  return {names.begin(), names.end()};
}

std::vector<std::string> elementwise_names() {
  std::set<std::string> names;
  auto add = [&](const std::vector<std::string>& v) { names.insert(v.begin(), v.end()); };
  auto unary_op = [&](OpId op) {
    for (DType d : kAll) {
      DType c, o;
      if (elementwise_signature(op, d, &c, &o)) add(elementwise_instantiations(elementwise_functor(op), o, {c}));
    }
  };
  auto binary_op = [&](OpId op) {
    for (DType d : kAll) {
      DType c, o;
      if (elementwise_signature(op, d, &c, &o)) add(elementwise_instantiations(elementwise_functor(op), o, {c, c}));
    }
  };
#define U(Id, ...) unary_op(OpId::Id);
#define B(Id, ...) binary_op(OpId::Id);
  FLAME_UNARY_OPS(U) FLAME_SCALAR_OPS(U) FLAME_SPECIAL_UNARY_OPS(U) FLAME_INTERNAL_UNARY_OPS(U)
  FLAME_BINARY_OPS(B) FLAME_INTERNAL_BINARY_OPS(B)
#undef U
#undef B
  for (DType a : kAll) {
    add(elementwise_instantiations("Fill", a, {}));
    add(elementwise_instantiations("Where", a, {FLAME_DTYPE_BOOL, a, a}));
    for (DType b : kAll) add(elementwise_instantiations("Identity", a, {b}));  // casts and copies
    // Integer inputs of MATH ops (e.g. integer scalar ops with fractional scalars) compute in f32.
  }
  return {names.begin(), names.end()};
}

std::vector<std::string> reduce_names() {
  std::set<std::string> names;
  for (DType d : kAll) {
    for (ReduceKind k : {ReduceKind::Sum, ReduceKind::Prod}) {
      auto v = reduce_instantiations(k, d, sum_result_dtype(d));
      names.insert(v.begin(), v.end());
    }
    for (ReduceKind k : {ReduceKind::Max, ReduceKind::Min}) {
      auto v = reduce_instantiations(k, d, d);
      names.insert(v.begin(), v.end());
    }
    auto a = arg_reduce_instantiations(d);
    names.insert(a.begin(), a.end());
  }
  return {names.begin(), names.end()};
}

std::vector<std::string> random_names() {
  std::vector<std::string> v;
  for (DType d : kFloat) {
    v.push_back(std::string("flame::rand_uniform<") + device_type(d) + ">");
    v.push_back(std::string("flame::rand_normal<") + device_type(d) + ">");
  }
  for (DType d : kAll) {
    v.push_back(std::string("flame::arange_kernel<") + device_type(d) + ">");
    v.push_back(std::string("flame::linspace_kernel<") + device_type(d) + ">");
  }
  return v;
}

bool full_matrix() {
  const char* v = std::getenv("FLAME_KERNEL_MATRIX");
  return v && std::strcmp(v, "full") == 0;
}

// Splits "ns::name<a, b<c, d>, e>" into "ns::name" and its top-level arguments {"a", "b<c, d>", "e"}.
std::vector<std::string> template_parts(const std::string& inst) {
  std::vector<std::string> parts;
  size_t open = inst.find('<');
  parts.push_back(inst.substr(0, open));
  if (open == std::string::npos) return parts;
  int depth = 0;
  std::string arg;
  for (size_t i = open + 1; i < inst.size(); ++i) {
    char c = inst[i];
    if (c == '<' || c == '(') ++depth;
    if ((c == '>' || c == ')') && depth-- == 0) break;  // the closing '>' of the kernel template
    if (c == ',' && depth == 0) {
      parts.push_back(arg);
      arg.clear();
      continue;
    }
    if (!(arg.empty() && c == ' ')) arg += c;
  }
  parts.push_back(arg);
  return parts;
}

// The sample of the default run: a name is kept when it brings a new (kernel template, dtype-family
// signature) or a new (kernel template, argument position, non-dtype argument). Families: F for
// float/double, H for half/bf16, Q for the f8 types, I for the integers and bool.
std::vector<std::string> kernel_sample(const std::vector<std::string>& names) {
  static const std::regex wide(R"(\b(float|double)\b)"), narrow(R"(flame::(half_t|bf16_t))"),
      integer(R"(\b(long long|unsigned char|int|bool)\b)"), f8(R"(flame::(f8_e4m3_t|f8_e5m2_t))");
  std::set<std::string> seen;
  std::vector<std::string> kept;
  for (const std::string& n : names) {
    std::vector<std::string> parts = template_parts(n);
    std::string signature = parts[0] + "<";
    std::vector<std::string> keys;
    for (size_t i = 1; i < parts.size(); ++i) {
      std::string fam = std::regex_replace(parts[i], narrow, "H");
      fam = std::regex_replace(fam, f8, "Q");
      fam = std::regex_replace(fam, wide, "F");
      fam = std::regex_replace(fam, integer, "I");
      if (fam != parts[i]) {
        signature += fam + ",";
      } else {
        signature += "_,";
        keys.push_back(parts[0] + "#" + std::to_string(i) + "=" + parts[i]);
      }
    }
    keys.push_back(signature);
    bool fresh = false;
    for (const std::string& k : keys) fresh |= seen.insert(k).second;
    if (fresh) kept.push_back(n);
  }
  return kept;
}

// The instantiations this run compiles: all of them (full matrix) or kernel_sample's.
std::vector<std::string> matrix(const std::vector<std::string>& names) {
  if (full_matrix()) return names;
  std::vector<std::string> kept = kernel_sample(names);
  std::printf("[ sample   ] %zu of %zu instantiations (FLAME_KERNEL_MATRIX=full: all)\n", kept.size(), names.size());
  return kept;
}

// Compiles in batches so that one NVRTC program stays a reasonable size.
void compile_all(const std::string& file, const std::vector<std::string>& all_names, int arch) {
  const std::vector<std::string> names = matrix(all_names);
  const size_t batch = 256;
  for (size_t i = 0; i < names.size(); i += batch) {
    std::vector<std::string> part(names.begin() + i, names.begin() + std::min(names.size(), i + batch));
    try {
      CompiledModule m = nvrtc_compile(file, part, arch);
      EXPECT_FALSE(m.ptx) << "NVRTC should build SASS for sm_" << arch;
      EXPECT_GT(m.image.size(), 0u);
      EXPECT_EQ(m.lowered_names.size(), part.size());
    } catch (const Error& e) {
      ADD_FAILURE() << e.what();
    }
  }
}

class KernelCompile : public ::testing::TestWithParam<int> {};

TEST_P(KernelCompile, Elementwise) {
  auto names = elementwise_names();
  EXPECT_GT(names.size(), 500u);
  compile_all("elementwise.cuh", names, GetParam());
}
TEST_P(KernelCompile, F8Conversions) {
  auto names = f8_names();
  EXPECT_GT(names.size(), 100u);
  compile_all("elementwise.cuh", names, GetParam());
}
TEST_P(KernelCompile, Reductions) { compile_all("reduce.cuh", reduce_names(), GetParam()); }
TEST_P(KernelCompile, Random) { compile_all("random.cuh", random_names(), GetParam()); }
TEST_P(KernelCompile, Scan) {
  std::vector<std::string> v;
  for (DType d : kAll) v.push_back(cumsum_instantiation(d, sum_result_dtype(d)));
  compile_all("scan.cuh", v, GetParam());
}

TEST_P(KernelCompile, Optimizers) {
  std::vector<std::string> v;
  for (DType d : {FLAME_DTYPE_F32, FLAME_DTYPE_F64, FLAME_DTYPE_F16, FLAME_DTYPE_BF16})
    v.push_back(std::string("flame::optim_step<") + device_type(d) + ">");
  for (DType d : {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_BF16})  // 8-bit moments: no f64 parameters
    v.push_back(std::string("flame::optim_step_8bit<") + device_type(d) + ">");
  compile_all("optim.cuh", v, GetParam());
}
// ---- neural-network kernels (ops/nn.h): every softmax / norm instantiation the ops may launch ----
TEST_P(KernelCompile, Softmax) {
  auto names = ops::softmax_kernel_instantiations();
  EXPECT_GT(names.size(), 100u);
  compile_all("softmax.cuh", names, GetParam());
}
TEST_P(KernelCompile, Norm) {
  auto names = ops::norm_kernel_instantiations();
  EXPECT_GT(names.size(), 300u);
  compile_all("norm_ring.cuh", names, GetParam());  // includes norm.cuh
}

INSTANTIATE_TEST_SUITE_P(Archs, KernelCompile, ::testing::Values(80, 90),
                         [](const ::testing::TestParamInfo<int>& i) { return "sm_" + std::to_string(i.param); });

TEST(KernelCompile, ErrorsCarryTheLog) {
  try {
    nvrtc_compile("elementwise.cuh", {"flame::ew_contig<4, flame::NoSuchFunctor, float, float>"}, 90);
    FAIL() << "compiling a missing functor should fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), FLAME_ERROR_KERNEL_COMPILE);
    EXPECT_NE(std::string(e.what()).find("NoSuchFunctor"), std::string::npos) << e.what();
  }
}

}  // namespace

// ---- losses (cuda/loss.cuh, src/ops/loss.cpp) ----
#include "ops/loss.h"

TEST_P(KernelCompile, Losses) {
  auto names = flame::ops::loss_instantiations();
  EXPECT_GT(names.size(), 60u);
  compile_all("loss_ring.cuh", names, GetParam());  // includes loss.cuh
}

// ---- indexing (cuda/indexing.cuh, src/ops/indexing.cpp) ----
#include "ops/indexing.h"

TEST_P(KernelCompile, Indexing) {
  auto names = flame::ops::indexing_instantiations();
  EXPECT_GT(names.size(), 20u);
  compile_all("indexing.cuh", names, GetParam());
}

// ---- convolution (cuda/conv.cuh, src/ops/conv.cpp) ----
#include "ops/conv.h"

TEST_P(KernelCompile, Convolution) {
  auto names = flame::ops::conv_kernel_instantiations();
  EXPECT_EQ(names.size(), 30u);
  compile_all("conv.cuh", names, GetParam());
}

// ---- attention (cuda/attention.cuh, src/ops/attention.cpp) ----
#include "ops/attention.h"

TEST_P(KernelCompile, Attention) {
  auto names = flame::ops::attention_instantiations();
  EXPECT_EQ(names.size(), 45u);
  compile_all("attention_tma_bwd.cuh", names, GetParam());  // includes attention_tma.cuh (and so attention_wg.cuh, attention.cuh): every attention kernel
}

// ---- more nn ops (ops/nnops.h): scatter, dropout, pooling, upsampling, rotary embeddings ----
#include "ops/nnops.h"

TEST_P(KernelCompile, NnopsScatter) {
  auto names = flame::ops::scatter_instantiations();
  EXPECT_EQ(names.size(), 16u);
  compile_all("scatter.cuh", names, GetParam());
}
TEST_P(KernelCompile, NnopsDropout) {
  auto names = flame::ops::dropout_instantiations();
  EXPECT_EQ(names.size(), 8u);
  compile_all("dropout.cuh", names, GetParam());
}
TEST_P(KernelCompile, NnopsPooling) {
  auto names = flame::ops::pool_instantiations();
  EXPECT_EQ(names.size(), 12u);
  compile_all("pool.cuh", names, GetParam());
}
TEST_P(KernelCompile, NnopsUpsample) {
  auto names = flame::ops::upsample_instantiations();
  // 4 dtypes x (forward, backward) of the general kernels, and blocks2x2.cuh's expand2x2 / sum2x2 for
  // each dtype, vector width (1 or 16 bytes), layout and scale (1 or 1/4): 8 + 64
  EXPECT_EQ(names.size(), 72u);
  compile_all("upsample.cuh", names, GetParam());  // includes blocks2x2.cuh
}
TEST_P(KernelCompile, NnopsRope) {
  auto names = flame::ops::rope_instantiations();
  EXPECT_EQ(names.size(), 8u);
  compile_all("rope.cuh", names, GetParam());
}

// ---- the frozen fp8 base: dequantisation (cuda/dequantize.cuh, src/ops/quantized.cpp) ----
#include "ops/quantized.h"

TEST_P(KernelCompile, Dequantize) {
  auto names = flame::ops::dequantize_instantiations();
  EXPECT_EQ(names.size(), 16u);  // {e4m3, e5m2} x {f32, f16, bf16, f64} x {1, 8} elements per thread
  compile_all("dequantize.cuh", names, GetParam());
}

// ---- the frozen NF4 base: quantisation and dequantisation (cuda/nf4.cuh, src/ops/nf4.cpp) ----
#include "ops/nf4.h"

TEST_P(KernelCompile, Nf4) {
  auto names = flame::ops::nf4_instantiations();
  // the two quantisation kernels, then {f32, f16, bf16, f64} x {absmax f32, double-quantised} x {1, 4} bytes per thread
  EXPECT_EQ(names.size(), 18u);
  compile_all("nf4.cuh", names, GetParam());  // includes nf4_constants.cuh
}

// ---- training toolkit: fused gradient tools and loss scaling (cuda/grad_tools.cuh) ----
#include "toolkit/grad_tools.h"

TEST_P(KernelCompile, GradTools) {
  auto names = flame::toolkit::grad_tools_instantiations();
  EXPECT_EQ(names.size(), 23u);
  compile_all("grad_tools.cuh", names, GetParam());
}

// ---- CUDA graphs (runtime/capture.h): the optimizer's device step counter (cuda/optim.cuh) ----
TEST_P(KernelCompile, OptimizerTick) { compile_all("optim.cuh", {"flame::optim_tick"}, GetParam()); }

// ---- fused elementwise expressions (cuda/fused.cuh behind a generated prelude, src/ops/fused.cpp) ----
#include "ops/fused.h"

TEST_P(KernelCompile, Fused) {
  // gelu-tanh, adaLN modulation, every function of the grammar, and a derivative (g * d/dx0, as the
  // backward builds it) over the four element types and every layout a call may launch.
  const std::pair<const char*, int> exprs[] = {
      {"0.5 * x0 * (1 + tanh(0.7978845608028654 * (x0 + 0.044715 * x0 * x0 * x0)))", 1},
      {"x0 * (1 + x1) + x2", 3},
      {"exp(x0) + log(x1) + sqrt(x0) * rsqrt(x1) - sigmoid(x0) / sin(x1) + cos(x0) * abs(x1) + sign(x0) * erf(x1) "
       "+ pow(x0, 2.5) + pow(x1, 3) + pow(x0, -1) + pow(x1, 0.5) + min(x0, x1) * max(x0, -x1) + log(0)",
       2}};
  std::vector<std::string> names;
  for (DType d : kFloat) {
    auto v = ops::fused_instantiations(d);
    names.insert(names.end(), v.begin(), v.end());
  }
  EXPECT_EQ(names.size(), 16u);
  names = matrix(names);
  auto compile = [&](const fused::Expr& e, int n) {
    try {
      CompiledModule m = nvrtc_compile("fused.cuh", names, GetParam(), fused::device_source(e, n));
      EXPECT_FALSE(m.ptx);
      EXPECT_EQ(m.lowered_names.size(), names.size());
    } catch (const Error& err) {
      ADD_FAILURE() << err.what();
    }
  };
  for (const auto& [text, n] : exprs) {
    SCOPED_TRACE(text);
    fused::Expr e = fused::simplify(fused::parse(text, n));
    compile(e, n);
    std::vector<int> shift;
    for (int k = 0; k < n; ++k) shift.push_back(k + 1);
    fused::Expr g = fused::simplify(fused::binary(fused::Op::Mul, fused::input(0),
                                                  fused::remap_inputs(fused::derivative(e, 0), shift)));
    compile(g, n + 1);
  }
  // 16 operands, the most a kernel takes.
  std::string sum = "x0";
  for (int k = 1; k < ops::kFusedMaxOperands; ++k) sum += " + x" + std::to_string(k);
  compile(fused::parse(sum, ops::kFusedMaxOperands), ops::kFusedMaxOperands);
}

// ---- fused mse_loss / l1_loss, reduction mean or sum (cuda/loss_pointwise.cuh, src/ops/loss_pointwise.cpp) ----
TEST_P(KernelCompile, PointwiseLosses) {
  // 16 (input, target) dtype pairs x {mse, l1} x {vector, scalar} x {partial, backward}, and 4 final passes.
  auto names = flame::ops::pointwise_loss_instantiations();
  EXPECT_EQ(names.size(), 132u);
  compile_all("loss_pointwise.cuh", names, GetParam());
}

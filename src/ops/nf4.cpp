// NF4 quantisation, dequantisation and the linear layer over a frozen NF4 weight (ops/nf4.h;
// kernels: cuda/nf4.cuh). nf4_linear computes its forward with linear's GEMM and epilogue
// (linear2d_forward) over a temporary dequantised weight and records one Nf4Linear node over
// (x, bias) that saves the packed weight and its statistics; the rule dequantises them again.
#include "ops/nf4.h"
#include <algorithm>
#include <cmath>
#include <tuple>
#include "core/error.h"
#include "cuda/nf4_constants.cuh"
#include "ops/nn_rows.h"
#include "ops/quantized.h"
#include "runtime/context.h"
#include "runtime/kernel_key.h"
#include "tensor/autograd_graph.h"

namespace flame {

namespace {

constexpr KernelTemplate kNf4Quantize{"nf4.cuh", "flame::nf4_quantize_kernel", {}};
constexpr KernelTemplate kNf4AbsmaxQuantize{"nf4.cuh", "flame::nf4_absmax_quantize_kernel", {}};
// <out dtype, nested (0/1), bytes per thread>
constexpr KernelTemplate kNf4Dequantize{"nf4.cuh", "flame::nf4_dequantize_kernel", {TArg::Dtype, TArg::Int, TArg::Int}};
constexpr int kVectorBytes = 4;  // bytes of packed codes per thread of the vector path
constexpr unsigned kMaxQuantizeGrid = 8192;

bool is_compute_float(DType d) {
  return d == FLAME_DTYPE_F32 || d == FLAME_DTYPE_F16 || d == FLAME_DTYPE_BF16 || d == FLAME_DTYPE_F64;
}
bool is_power_of_two(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }
int log2_of(int64_t v) {
  int s = 0;
  while ((int64_t{1} << s) < v) ++s;
  return s;
}

// Checks the weight's tensors against each other as Nf4Weight documents them.
void check_nf4(const ops::Nf4Weight& w, const char* op) {
  FLAME_CHECK(w.packed && w.absmax, FLAME_ERROR_INVALID_ARGUMENT, op, ": an NF4 weight without its packed codes or absmax");
  Context& c = w.packed->ctx();
  FLAME_CHECK(w.packed->dtype == FLAME_DTYPE_U8 && w.packed->ndim() == 2 && w.packed->contiguous(), FLAME_ERROR_SHAPE_MISMATCH,
              op, ": the packed NF4 codes must be a contiguous U8 [out, in / 2] tensor, got ", dtype_name(w.packed->dtype), " ",
              shape_str(w.packed->shape));
  const int64_t n = w.packed->numel() * 2;
  const int64_t blocks = w.absmax->numel();
  FLAME_CHECK(&w.absmax->ctx() == &c && w.absmax->ndim() == 1 && w.absmax->contiguous() && blocks > 0 && n % blocks == 0 &&
                  is_power_of_two(n / blocks) && n / blocks >= 16 && w.in_features() % (n / blocks) == 0,
              FLAME_ERROR_SHAPE_MISMATCH, op, ": an absmax of shape ", shape_str(w.absmax->shape), " for ", n,
              " NF4 elements in rows of ", w.in_features());
  if (!w.double_quant()) {
    FLAME_CHECK(w.absmax->dtype == FLAME_DTYPE_F32 && !w.nested_scale && !w.nested_offset, FLAME_ERROR_DTYPE_MISMATCH, op,
                ": without double quantisation the absmax must be F32 (and no nested statistics), got ",
                dtype_name(w.absmax->dtype));
    return;
  }
  const int64_t chunks = (blocks + kNf4NestedBlock - 1) / kNf4NestedBlock;
  FLAME_CHECK(w.absmax->dtype == FLAME_DTYPE_U8 && w.nested_scale && w.nested_offset, FLAME_ERROR_DTYPE_MISMATCH, op,
              ": with double quantisation the absmax must be U8 codes with a nested scale and offset, got ",
              dtype_name(w.absmax->dtype));
  for (const Tensor* t : {&w.nested_scale, &w.nested_offset, &w.nested_code})
    FLAME_CHECK(&(*t)->ctx() == &c && (*t)->dtype == FLAME_DTYPE_F32 && (*t)->contiguous(), FLAME_ERROR_DTYPE_MISMATCH, op,
                ": the nested statistics must be contiguous F32 tensors of the weight's context");
  FLAME_CHECK(w.nested_scale->shape == Shape({chunks}) && w.nested_offset->numel() == 1 && w.nested_code->shape == Shape({256}),
              FLAME_ERROR_SHAPE_MISMATCH, op, ": nested statistics of shapes ", shape_str(w.nested_scale->shape), ", ",
              shape_str(w.nested_offset->shape), ", ", shape_str(w.nested_code->shape), " for ", blocks, " blocks (want [",
              chunks, "], [], [256])");
}

KernelKey dequantize_key(DType out, bool nested, int v) { return make_key(kNf4Dequantize, out, nested ? 1 : 0, v); }

void launch_dequantize(const ops::Nf4Weight& w, const Tensor& out) {
  const int64_t bytes = w.packed->numel();
  if (bytes == 0) return;
  Context& ctx = w.packed->ctx();
  const int64_t out_vector_bytes = 2 * kVectorBytes * static_cast<int64_t>(out->elem_size());
  const bool vec = bytes % kVectorBytes == 0 && w.packed->data() % kVectorBytes == 0 &&
                   out->data() % static_cast<CUdeviceptr>(out_vector_bytes) == 0;
  const int v = vec ? kVectorBytes : 1;
  const bool nested = w.double_quant();
  CUdeviceptr pp = w.packed->data(), pa = w.absmax->data(), po = out->data();
  CUdeviceptr ps = nested ? w.nested_scale->data() : 0, pm = nested ? w.nested_offset->data() : 0,
              pc = nested ? w.nested_code->data() : 0;
  int64_t n = bytes;
  int32_t shift = log2_of(w.block_size());
  void* args[] = {&pp, &pa, &ps, &pm, &pc, &po, &n, &shift};
  launch_flat(ctx, ctx.function(dequantize_key(out->dtype, nested, v)), bytes / v, args);
}

unsigned quantize_grid(int64_t blocks) {
  return static_cast<unsigned>(std::min<int64_t>(blocks, kMaxQuantizeGrid));
}

}  // namespace

std::array<float, 16> ops::nf4_levels() { return {FLAME_NF4_LEVELS}; }

std::array<float, 256> ops::nf4_dynamic_map_values() {
  // create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): for exponent i in 0..6,
  // the 2^i means of adjacent points of linspace(0.1, 1, 2^i + 1) (f32; torch's linspace: start +
  // step * k for the first half, end - step * (steps - 1 - k) for the rest) times +-10^(i - 6), then
  // 0 and 1, sorted.
  std::vector<float> data;
  for (int i = 0; i < 7; ++i) {
    const int64_t steps = (int64_t{1} << i) + 1;
    const float start = 0.1f, end = 1.0f, step = (end - start) / static_cast<float>(steps - 1);
    std::vector<float> b(static_cast<size_t>(steps));
    for (int64_t k = 0; k < steps; ++k)
      b[static_cast<size_t>(k)] = k < steps / 2 ? start + step * static_cast<float>(k)
                                                : end - step * static_cast<float>(steps - k - 1);
    const float power = static_cast<float>(std::pow(10.0, i - 6));
    for (int64_t k = 0; k + 1 < steps; ++k) {
      const float mean = (b[static_cast<size_t>(k)] + b[static_cast<size_t>(k + 1)]) / 2.0f;
      data.push_back(power * mean);
      data.push_back(-power * mean);
    }
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  FLAME_CHECK(data.size() == 256, FLAME_ERROR_INTERNAL, "the 8-bit dynamic map has ", data.size(), " values, not 256");
  std::sort(data.begin(), data.end());
  std::array<float, 256> out{};
  std::copy(data.begin(), data.end(), out.begin());
  return out;
}

Tensor ops::nf4_dynamic_map(Context& ctx) {
  const std::array<float, 256> v = nf4_dynamic_map_values();
  return from_host(ctx, v.data(), sizeof(v), {256}, FLAME_DTYPE_F32);
}

ops::Nf4Weight ops::nf4_empty(Context& ctx, int64_t out, int64_t in, int64_t block_size, const Tensor& nested_code) {
  FLAME_CHECK(is_power_of_two(block_size) && block_size >= 16 && block_size <= 4096, FLAME_ERROR_INVALID_ARGUMENT,
              "NF4: the block size ", block_size, " is not a power of two in [16, 4096]");
  FLAME_CHECK(out > 0 && in > 0 && in % block_size == 0, FLAME_ERROR_INVALID_ARGUMENT, "NF4: the block size ", block_size,
              " does not divide the row length ", in, " of a [", out, ", ", in, "] weight");
  const int64_t blocks = out * in / block_size;
  Nf4Weight w;
  w.packed = empty(ctx, {out, in / 2}, FLAME_DTYPE_U8);
  if (!nested_code) {
    w.absmax = empty(ctx, {blocks}, FLAME_DTYPE_F32);
    return w;
  }
  FLAME_CHECK(&nested_code->ctx() == &ctx && nested_code->dtype == FLAME_DTYPE_F32 && nested_code->shape == Shape({256}),
              FLAME_ERROR_INVALID_ARGUMENT, "NF4: the nested code must be an F32 [256] tensor of the context (nf4_dynamic_map)");
  w.absmax = empty(ctx, {blocks}, FLAME_DTYPE_U8);
  w.nested_scale = empty(ctx, {(blocks + kNf4NestedBlock - 1) / kNf4NestedBlock}, FLAME_DTYPE_F32);
  w.nested_offset = empty(ctx, {}, FLAME_DTYPE_F32);
  w.nested_code = nested_code;
  return w;
}

void ops::nf4_quantize_into(const Tensor& w, const Nf4Weight& dst) {
  check_nf4(dst, "nf4_quantize_into");
  FLAME_CHECK(&w->ctx() == &dst.packed->ctx(), FLAME_ERROR_INVALID_ARGUMENT, "nf4_quantize_into: the weight belongs to another context");
  FLAME_CHECK(is_compute_float(w->dtype), FLAME_ERROR_DTYPE_MISMATCH, "nf4_quantize_into: the weight must be f32, f16, bf16 or f64, not ",
              dtype_name(w->dtype));
  FLAME_CHECK(w->shape == Shape({dst.out_features(), dst.in_features()}), FLAME_ERROR_SHAPE_MISMATCH, "nf4_quantize_into: a ",
              shape_str(w->shape), " weight into NF4 tensors of a [", dst.out_features(), ", ", dst.in_features(), "] one");
  Context& ctx = w->ctx();
  GradModeGuard no_grad(ctx, ctx.mode.with_grad(false));  // not recorded
  const Tensor wf = w->dtype == FLAME_DTYPE_F32 && w->contiguous() ? w : contiguous(to_dtype(w, FLAME_DTYPE_F32));
  const int64_t blocks = dst.absmax->numel();
  const Tensor absmax = dst.double_quant() ? empty(ctx, {blocks}, FLAME_DTYPE_F32) : dst.absmax;
  {
    CUdeviceptr pw = wf->data(), pp = dst.packed->data(), pa = absmax->data();
    int64_t nb = blocks;
    int32_t block = static_cast<int32_t>(dst.block_size());
    void* args[] = {&pw, &pp, &pa, &nb, &block};
    ctx.launch(ctx.function(make_key(kNf4Quantize)), quantize_grid(blocks), kNf4QuantizeThreads, args);
  }
  dst.packed->storage->version++;
  if (!dst.double_quant()) {
    dst.absmax->storage->version++;
    return;
  }
  // bitsandbytes' quantize_4bit with compress_statistics: offset = absmax.mean(), then the 8-bit
  // blockwise quantisation of absmax - offset in blocks of 256.
  copy_into(dst.nested_offset, mean(absmax, {0}, false));
  CUdeviceptr pa = absmax->data(), pm = dst.nested_offset->data(), pc = dst.nested_code->data(), pq = dst.absmax->data(),
              ps = dst.nested_scale->data();
  int64_t n = blocks;
  void* args[] = {&pa, &pm, &pc, &pq, &ps, &n};
  const int64_t chunks = dst.nested_scale->numel();
  ctx.launch(ctx.function(make_key(kNf4AbsmaxQuantize)), quantize_grid(chunks), kNf4QuantizeThreads, args);
  dst.absmax->storage->version++;
  dst.nested_scale->storage->version++;
}

Tensor ops::nf4_dequantize(const Nf4Weight& weight, DType dtype) {
  check_nf4(weight, "nf4_dequantize");
  FLAME_CHECK(is_compute_float(dtype), FLAME_ERROR_DTYPE_MISMATCH, "nf4_dequantize: the result must be f32, f16, bf16 or f64, not ",
              dtype_name(dtype));
  Tensor out = make_tensor(weight.packed->ctx(), {weight.out_features(), weight.in_features()}, dtype);
  launch_dequantize(weight, out);
  return out;
}

Tensor ops::nf4_linear(const Tensor& x, const Nf4Weight& weight, const Tensor& bias, Activation act) {
  check_nf4(weight, "nf4_linear");
  FLAME_CHECK(&x->ctx() == &weight.packed->ctx(), FLAME_ERROR_INVALID_ARGUMENT, "nf4_linear: x and the weight belong to different contexts");
  FLAME_CHECK(is_compute_float(x->dtype), FLAME_ERROR_DTYPE_MISMATCH, "nf4_linear: x must be f32, f16, bf16 or f64, not ",
              dtype_name(x->dtype));
  const int64_t in = weight.in_features(), out = weight.out_features();
  FLAME_CHECK(x->ndim() >= 1 && x->shape.back() == in, FLAME_ERROR_SHAPE_MISMATCH, "nf4_linear: x ", shape_str(x->shape),
              " does not end in in_features ", in);
  if (bias) {
    FLAME_CHECK(&bias->ctx() == &x->ctx() && bias->dtype == x->dtype, FLAME_ERROR_DTYPE_MISMATCH, "nf4_linear: the bias must be ",
                dtype_name(x->dtype), " (x's dtype) of x's context, got ", dtype_name(bias->dtype));
    FLAME_CHECK(bias->ndim() == 1 && bias->shape[0] == out, FLAME_ERROR_SHAPE_MISMATCH, "nf4_linear: bias ",
                shape_str(bias->shape), " must be [", out, "]");
  }
  // Saved: packed, absmax, (nested scale, offset, code), then linear's own (linear_over_dequantized).
  std::vector<Tensor> saved = {weight.packed, weight.absmax};
  if (weight.double_quant()) saved.insert(saved.end(), {weight.nested_scale, weight.nested_offset, weight.nested_code});
  return linear_over_dequantized(x, [&](DType dtype) { return nf4_dequantize(weight, dtype); }, in, out, bias, act,
                                 OpId::Nf4Linear, saved);
}

std::vector<std::string> ops::nf4_instantiations() {
  std::vector<std::string> v = {kernel_name(make_key(kNf4Quantize)), kernel_name(make_key(kNf4AbsmaxQuantize))};
  for (DType out : {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_F64})
    for (bool nested : {false, true})
      for (int w : {1, kVectorBytes}) v.push_back(kernel_name(dequantize_key(out, nested, w)));
  return v;
}

}  // namespace flame

// max_pool2d, avg_pool2d and adaptive_avg_pool2d on [N, C, H, W] (or unbatched [C, H, W]) inputs of
// any strides: the host side of cuda/pool.cuh, with PyTorch's argument checks and output sizes.
//  - max_pool2d records a MaxPool2d node that keeps the winners' flat indices (i64, h * W + w per
//    plane); its rule scatter-adds the gradient there (ops/indexing.h), so second order works and
//    overlapping windows accumulate with atomics.
//  - avg_pool2d and adaptive_avg_pool2d record AvgPool2d, whose rule is the adjoint kernel recorded as
//    AvgPool2dBackward, whose rule is AvgPool2d again. The geometry is the node's attributes (PoolParams). Windows
//    that are the input's 2x2 blocks, between dense tensors, run the vector kernels of
//    cuda/blocks2x2.cuh (launch_blocks2x2).
// A channels-last input (c stride 1) gives a channels-last output, walked in that order by the
// kernels; any other layout gives a contiguous NCHW output.
#include <algorithm>
#include "tensor/autograd_graph.h"
#include "core/error.h"
#include "ops/indexing.h"
#include "ops/nn_rows.h"
#include "ops/nnops.h"
#include "ops/ops.h"
#include "ops/spatial.h"

namespace flame {

namespace {

struct PoolGeom {  // mirrors cuda/pool.cuh
  int64_t N, C, H, W, OH, OW;
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
  int64_t xs[4];
  int64_t ys[4];
  int32_t cl;
  int32_t count_include_pad;
  int64_t divisor;
  int32_t adaptive;
};

PoolGeom geometry(const ops::PoolParams& p, const Tensor& xlike, const Tensor& ylike, bool cl) {
  PoolGeom g{};
  g.N = p.N;
  g.C = p.C;
  g.H = p.H;
  g.W = p.W;
  g.OH = p.OH;
  g.OW = p.OW;
  g.kh = p.kh;
  g.kw = p.kw;
  g.sh = p.sh;
  g.sw = p.sw;
  g.ph = p.ph;
  g.pw = p.pw;
  g.dh = p.dh;
  g.dw = p.dw;
  for (int d = 0; d < 4; ++d) {
    g.xs[d] = xlike->strides[d];
    g.ys[d] = ylike->strides[d];
  }
  g.cl = cl ? 1 : 0;
  g.count_include_pad = p.count_include_pad ? 1 : 0;
  g.divisor = p.divisor;
  g.adaptive = p.adaptive ? 1 : 0;
  return g;
}

// floor(a / b) for b > 0 (PyTorch's div_rtn).
int64_t div_floor(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// PyTorch's pooling_output_shape.
int64_t pool_out(int64_t in, int64_t k, int64_t pad, int64_t stride, int64_t dil, bool ceil_mode) {
  int64_t out = div_floor(in + 2 * pad - dil * (k - 1) - 1 + (ceil_mode ? stride - 1 : 0), stride) + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;  // the last window must start inside the input
  return out;
}

// x as [N, C, H, W] (an unbatched [C, H, W] gets a leading 1); checks dtype and sizes.
Tensor batched(const char* op, const Tensor& x) {
  FLAME_CHECK(is_floating(x->dtype), FLAME_ERROR_DTYPE_MISMATCH, op, ": x must be floating, got ", dtype_name(x->dtype));
  FLAME_CHECK(x->ndim() == 3 || x->ndim() == 4, FLAME_ERROR_SHAPE_MISMATCH, op, ": x must be [N, C, H, W] or [C, H, W], got ",
              shape_str(x->shape));
  const int nd = x->ndim();
  FLAME_CHECK(x->shape[nd - 3] > 0 && x->shape[nd - 2] > 0 && x->shape[nd - 1] > 0, FLAME_ERROR_SHAPE_MISMATCH, op,
              ": x needs non-empty channel and spatial dims, got ", shape_str(x->shape));
  return nd == 3 ? ops::unsqueeze(x, 0) : x;
}

Tensor unbatched(const Tensor& y, const Tensor& x) { return x->ndim() == 3 ? ops::squeeze(y, 0) : y; }

ops::PoolParams fixed_params(const char* op, const Tensor& x4, const ops::Pool2dOptions& o, bool max) {
  const int64_t kMax = INT32_MAX;  // as PyTorch (int); keeps the window arithmetic far from overflow
  for (int i = 0; i < 2; ++i) {
    FLAME_CHECK(o.kernel[i] > 0 && o.kernel[i] <= kMax, FLAME_ERROR_INVALID_ARGUMENT, op, ": kernel_size must be positive, got ",
                o.kernel[0], " x ", o.kernel[1]);
    FLAME_CHECK(o.stride[i] > 0 && o.stride[i] <= kMax, FLAME_ERROR_INVALID_ARGUMENT, op, ": stride must be positive, got ",
                o.stride[0], " x ", o.stride[1]);
    FLAME_CHECK(o.dilation[i] > 0 && o.dilation[i] <= kMax, FLAME_ERROR_INVALID_ARGUMENT, op, ": dilation must be positive, got ",
                o.dilation[0], " x ", o.dilation[1]);
    FLAME_CHECK(o.padding[i] >= 0 && o.padding[i] <= o.kernel[i] / 2, FLAME_ERROR_INVALID_ARGUMENT, op,
                ": padding must be >= 0 and at most half the kernel size, got ", o.padding[0], " x ", o.padding[1],
                " for a ", o.kernel[0], " x ", o.kernel[1], " kernel");
  }
  FLAME_CHECK(max || (o.dilation[0] == 1 && o.dilation[1] == 1), FLAME_ERROR_INVALID_ARGUMENT, op, ": dilation must be 1, got ",
              o.dilation[0], " x ", o.dilation[1]);
  FLAME_CHECK(o.divisor_override >= 0, FLAME_ERROR_INVALID_ARGUMENT, op, ": divisor_override must be > 0 (or 0 for none), got ",
              o.divisor_override);
  ops::PoolParams p;
  p.N = x4->shape[0];
  p.C = x4->shape[1];
  p.H = x4->shape[2];
  p.W = x4->shape[3];
  p.kh = o.kernel[0];
  p.kw = o.kernel[1];
  p.sh = o.stride[0];
  p.sw = o.stride[1];
  p.ph = o.padding[0];
  p.pw = o.padding[1];
  p.dh = o.dilation[0];
  p.dw = o.dilation[1];
  p.OH = pool_out(p.H, p.kh, p.ph, p.sh, p.dh, o.ceil_mode);
  p.OW = pool_out(p.W, p.kw, p.pw, p.sw, p.dw, o.ceil_mode);
  FLAME_CHECK(p.OH >= 1 && p.OW >= 1, FLAME_ERROR_INVALID_ARGUMENT, op, ": the output of a ", p.H, " x ", p.W, " input would be ",
              p.OH, " x ", p.OW, " (too small for the kernel, dilation and padding)");
  p.count_include_pad = o.count_include_pad;
  p.divisor = o.divisor_override;
  return p;
}

// The kernels of cuda/pool.cuh: <T>.
constexpr KernelTemplate kMaxPool{"pool.cuh", "flame::max_pool2d_kernel", {TArg::Dtype}};
constexpr KernelTemplate kAvgPool{"pool.cuh", "flame::avg_pool2d_kernel", {TArg::Dtype}};
constexpr KernelTemplate kAvgPoolBackward{"pool.cuh", "flame::avg_pool2d_backward_kernel", {TArg::Dtype}};

// Windows that are exactly the 2x2 blocks of the input: 2x2 with stride 2, no padding and the divisor
// 4 (none given, or 4), or adaptive to half of even sizes. Each output is the mean of its block
// (blocks2x2.cuh, where both tensors are dense in one layout).
bool avg_2x2(const ops::PoolParams& p) {
  const bool halves = p.OH * 2 == p.H && p.OW * 2 == p.W;
  return halves && (p.adaptive || (p.kh == 2 && p.kw == 2 && p.sh == 2 && p.sw == 2 && p.ph == 0 && p.pw == 0 &&
                                    (p.divisor == 0 || p.divisor == 4)));
}

}  // namespace

// ---------------------------------------------------------------- max

Tensor ops::max_pool2d(const Tensor& x, const Pool2dOptions& o) {
  const char* op = "max_pool2d";
  Tensor x4 = batched(op, x);
  PoolParams p = fixed_params(op, x4, o, true);
  Context& ctx = x4->ctx();
  const bool cl = spatial_channels_last(x4);
  Tensor y = make_nchw(ctx, {p.N, p.C, p.OH, p.OW}, x4->dtype, cl);
  Tensor idx = make_nchw(ctx, {p.N, p.C, p.OH, p.OW}, FLAME_DTYPE_I64, cl);
  int64_t total = y->numel();
  if (total > 0) {
    PoolGeom g = geometry(p, x4, y, cl);
    CUdeviceptr px = x4->data(), py = y->data(), pi = idx->data();
    void* args[] = {&px, &py, &pi, &total, &g};
    launch_flat(ctx, ctx.function(make_key(kMaxPool, x4->dtype)), total, args);
  }
  if (auto node = record(OpId::MaxPool2d, {x4}, {y})) node->saved.emplace_back(idx, false);
  return unbatched(y, x);
}

// ---------------------------------------------------------------- avg (fixed and adaptive windows)

Tensor ops::avg_pool2d_apply(const Tensor& x4, const PoolParams& p) {
  Context& ctx = x4->ctx();
  const bool cl = spatial_channels_last(x4);
  Tensor y = make_nchw(ctx, {p.N, p.C, p.OH, p.OW}, x4->dtype, cl);
  int64_t total = y->numel();
  if (total > 0 && !(avg_2x2(p) && launch_blocks2x2(ctx, false, true, y, x4, cl))) {
    PoolGeom g = geometry(p, x4, y, cl);
    CUdeviceptr px = x4->data(), py = y->data();
    void* args[] = {&px, &py, &total, &g};
    launch_flat(ctx, ctx.function(make_key(kAvgPool, x4->dtype)), total, args);
  }
  if (auto node = record(OpId::AvgPool2d, {x4}, {y})) node->attributes = p;
  return y;
}

Tensor ops::avg_pool2d_adjoint(const Tensor& g4, const PoolParams& p) {
  Context& ctx = g4->ctx();
  const bool cl = spatial_channels_last(g4);
  Tensor gx = make_nchw(ctx, {p.N, p.C, p.H, p.W}, g4->dtype, cl);
  int64_t total = gx->numel();
  if (total > 0 && !(avg_2x2(p) && launch_blocks2x2(ctx, true, true, g4, gx, cl))) {
    PoolGeom g = geometry(p, gx, g4, cl);
    CUdeviceptr pg = g4->data(), px = gx->data();
    void* args[] = {&pg, &px, &total, &g};
    launch_flat(ctx, ctx.function(make_key(kAvgPoolBackward, g4->dtype)), total, args);
  }
  if (auto node = record(OpId::AvgPool2dBackward, {g4}, {gx})) node->attributes = p;
  return gx;
}

Tensor ops::avg_pool2d(const Tensor& x, const Pool2dOptions& o) {
  const char* op = "avg_pool2d";
  Tensor x4 = batched(op, x);
  return unbatched(avg_pool2d_apply(x4, fixed_params(op, x4, o, false)), x);
}

Tensor ops::adaptive_avg_pool2d(const Tensor& x, int64_t out_h, int64_t out_w) {
  const char* op = "adaptive_avg_pool2d";
  Tensor x4 = batched(op, x);
  FLAME_CHECK(out_h >= 0 && out_w >= 0 && out_h <= INT32_MAX && out_w <= INT32_MAX, FLAME_ERROR_INVALID_ARGUMENT, op,
              ": the output size must be >= 0, got ", out_h, " x ", out_w);
  PoolParams p;
  p.N = x4->shape[0];
  p.C = x4->shape[1];
  p.H = x4->shape[2];
  p.W = x4->shape[3];
  p.OH = out_h;
  p.OW = out_w;
  p.adaptive = true;
  return unbatched(avg_pool2d_apply(x4, p), x);
}

std::vector<std::string> ops::pool_instantiations() {
  std::vector<std::string> v;
  for (DType t : {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_F64})
    for (const KernelTemplate* k : {&kMaxPool, &kAvgPool, &kAvgPoolBackward}) v.push_back(kernel_name(make_key(*k, t)));
  return v;
}

}  // namespace flame

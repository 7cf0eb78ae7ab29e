// upsample_nearest2d and upsample_bilinear2d of [N, C, H, W] inputs of any strides: the host side of
// cuda/upsample.cuh. The forward records Upsample2d; its rule is the adjoint kernel recorded as
// Upsample2dBackward, whose rule is Upsample2d again (so gradients of any order work). The geometry
// (sizes, mode, align_corners, the caller's scale factors) is the node's attributes (UpsampleParams).
// Output sizes follow PyTorch: an explicit size, or floor(in * scale_factor); a given scale_factor
// also sets the index scale (1 / scale_factor), as torch.nn.functional.interpolate passes it on. A
// channels-last input gives a channels-last output, walked in that order. Nearest by exactly 2 between
// dense tensors takes the vector kernels of cuda/blocks2x2.cuh (launch_blocks2x2).
#include <cmath>
#include "tensor/autograd_graph.h"
#include "core/error.h"
#include "ops/nn_rows.h"
#include "ops/nnops.h"
#include "ops/ops.h"
#include "ops/spatial.h"

namespace flame {

namespace {

struct UpGeom {  // mirrors cuda/upsample.cuh
  int64_t N, C, H, W, OH, OW;
  double scale_h, scale_w;
  int64_t xs[4];
  int64_t ys[4];
  int32_t cl;
  int32_t mode;
  int32_t align_corners;
};

UpGeom geometry(const ops::UpsampleParams& p, const Tensor& xlike, const Tensor& ylike, bool cl) {
  UpGeom g{};
  g.N = p.N;
  g.C = p.C;
  g.H = p.H;
  g.W = p.W;
  g.OH = p.OH;
  g.OW = p.OW;
  g.scale_h = p.scale_h;
  g.scale_w = p.scale_w;
  for (int d = 0; d < 4; ++d) {
    g.xs[d] = xlike->strides[d];
    g.ys[d] = ylike->strides[d];
  }
  g.cl = cl ? 1 : 0;
  g.mode = p.bilinear ? 1 : 0;
  g.align_corners = p.align_corners ? 1 : 0;
  return g;
}

// The output size of one dim: out (> 0), or floor(in * scale) when out is 0.
int64_t out_size(const char* op, const char* dim, int64_t in, int64_t out, double scale) {
  FLAME_CHECK(std::isfinite(scale) && scale >= 0, FLAME_ERROR_INVALID_ARGUMENT, op, ": scale_", dim,
              " must be finite and >= 0 (0: none), got ", scale);
  FLAME_CHECK(out >= 0, FLAME_ERROR_INVALID_ARGUMENT, op, ": out_", dim, " must be >= 0 (0: from the scale), got ", out);
  FLAME_CHECK(out > 0 || scale > 0, FLAME_ERROR_INVALID_ARGUMENT, op, ": give out_", dim, " or scale_", dim);
  const double o = out > 0 ? static_cast<double>(out) : std::floor(static_cast<double>(in) * scale);
  FLAME_CHECK(o >= 1 && o <= INT32_MAX, FLAME_ERROR_INVALID_ARGUMENT, op, ": the output ", dim, " ", o, " of input ", dim, " ",
              in, " is not in [1, 2^31)");
  return static_cast<int64_t>(o);
}

// The kernels of cuda/upsample.cuh: <T>.
constexpr KernelTemplate kUpsample{"upsample.cuh", "flame::upsample2d_kernel", {TArg::Dtype}};
constexpr KernelTemplate kUpsampleBackward{"upsample.cuh", "flame::upsample2d_backward_kernel", {TArg::Dtype}};

// Nearest by exactly 2 in both dims with the index scale 0.5 (no scale factor, or 2): every output
// copies its 2x2 block's source (blocks2x2.cuh, where both tensors are dense in one layout).
bool nearest_by_2(const ops::UpsampleParams& p) {
  return !p.bilinear && p.OH == 2 * p.H && p.OW == 2 * p.W && (p.scale_h == 0 || p.scale_h == 2.0) &&
         (p.scale_w == 0 || p.scale_w == 2.0);
}

}  // namespace

Tensor ops::upsample2d_apply(const Tensor& x, const UpsampleParams& p) {
  Context& ctx = x->ctx();
  const bool cl = spatial_channels_last(x);
  Tensor y = make_nchw(ctx, {p.N, p.C, p.OH, p.OW}, x->dtype, cl);
  int64_t total = y->numel();
  if (total > 0 && !(nearest_by_2(p) && launch_blocks2x2(ctx, true, false, x, y, cl))) {
    UpGeom g = geometry(p, x, y, cl);
    CUdeviceptr px = x->data(), py = y->data();
    void* args[] = {&px, &py, &total, &g};
    launch_flat(ctx, ctx.function(make_key(kUpsample, x->dtype)), total, args);
  }
  if (auto node = record(OpId::Upsample2d, {x}, {y})) {
    node->attributes = p;
  }
  return y;
}

Tensor ops::upsample2d_adjoint(const Tensor& g4, const UpsampleParams& p) {
  Context& ctx = g4->ctx();
  const bool cl = spatial_channels_last(g4);
  Tensor gx = make_nchw(ctx, {p.N, p.C, p.H, p.W}, g4->dtype, cl);
  int64_t total = gx->numel();
  if (total > 0 && !(nearest_by_2(p) && launch_blocks2x2(ctx, false, false, gx, g4, cl))) {
    UpGeom g = geometry(p, gx, g4, cl);
    CUdeviceptr pg = g4->data(), px = gx->data();
    void* args[] = {&pg, &px, &total, &g};
    launch_flat(ctx, ctx.function(make_key(kUpsampleBackward, g4->dtype)), total, args);
  }
  if (auto node = record(OpId::Upsample2dBackward, {g4}, {gx})) {
    node->attributes = p;
  }
  return gx;
}

Tensor ops::upsample2d(const Tensor& x, int64_t out_h, int64_t out_w, double scale_h, double scale_w, bool bilinear,
                       bool align_corners) {
  const char* op = bilinear ? "upsample_bilinear2d" : "upsample_nearest2d";
  FLAME_CHECK(is_floating(x->dtype), FLAME_ERROR_DTYPE_MISMATCH, op, ": x must be floating, got ", dtype_name(x->dtype));
  FLAME_CHECK(x->ndim() == 4, FLAME_ERROR_SHAPE_MISMATCH, op, ": x must be [N, C, H, W], got ", shape_str(x->shape));
  FLAME_CHECK(x->shape[1] > 0 && x->shape[2] > 0 && x->shape[3] > 0, FLAME_ERROR_SHAPE_MISMATCH, op,
              ": x needs non-empty channel and spatial dims, got ", shape_str(x->shape));
  UpsampleParams p;
  p.N = x->shape[0];
  p.C = x->shape[1];
  p.H = x->shape[2];
  p.W = x->shape[3];
  p.OH = out_size(op, "h", p.H, out_h, scale_h);
  p.OW = out_size(op, "w", p.W, out_w, scale_w);
  p.scale_h = scale_h;
  p.scale_w = scale_w;
  p.bilinear = bilinear;
  p.align_corners = align_corners;
  return upsample2d_apply(x, p);
}

std::vector<std::string> ops::upsample_instantiations() {
  std::vector<std::string> v;
  for (DType t : {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_F64}) {
    for (const KernelTemplate* k : {&kUpsample, &kUpsampleBackward}) v.push_back(kernel_name(make_key(*k, t)));
  }
  for (const std::string& n : blocks2x2_instantiations()) v.push_back(n);  // upsample.cuh includes blocks2x2.cuh
  return v;
}

}  // namespace flame

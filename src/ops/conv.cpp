// conv2d, conv_transpose2d and conv1d: argument checks, the three recorded primitives, and the host
// side of cuda/conv.cuh.
//
// Memory formats. The kernels read and write dense NHWC tensors. An input whose strides already
// are dense NHWC is passed as it is; any other goes through one internal copy (permute +
// contiguous, not recorded). The result is computed as NHWC and returned as a permuted view, i.e.
// channels-last, when x (dy) or the weight is channels-last, as PyTorch does; otherwise it is
// copied to contiguous NCHW. The weight is rearranged per call into the kernels' B layout
// [G][Nc][kh][kw][Kc] (cheap next to the convolution).
//
// Kernel choice (per GEMM): groups with fewer than 16 output channels (depthwise, tiny groups) run
// the direct kernels; f16/bf16 on sm_80+ run the tensor-core kernels (16-byte gathers when channel
// counts are multiples of 8 and pointers 16-byte aligned); f32/f64 run the SIMT kernels.
// The weight gradient splits its reduction over N * Ho * Wo across blocks (enough to fill the GPU
// twice) into partial sums [splits, O, K] in the compute type, added up by one reduction.
//
// cuDNN: when the context has it (runtime/cudnn.h), f32 (IEEE unless the context allows TF32),
// f16 and bf16 convolutions whose padding cuDNN can express (symmetric) run there instead, with
// the same memory-format rules: x / dy and w dense in the result's format (NHWC or NCHW; copied
// when they are not), the result computed in that format. A bias is written into the result first
// and cuDNN adds the convolution to it (beta = 1), one rounding as in FLAME's kernels. Only the
// kernel behind the recorded primitive changes; what is recorded and saved is the same.
//
// Determinism (promised in flame.h): the weight gradient's partial sums (in f32, f64 for f64) are
// added in a fixed order; only cuDNN's deterministic algorithms are used.
//
// Autograd: Conv2d saves x and w; ConvTranspose2d saves dy and w; ConvWeightGrad saves dy and x;
// the geometry (ConvGeom) is the node's attributes. The rules (autograd/backward_rules.cpp) only call these
// primitives and conv_bias_grad, so every order of derivative is available.
#include "ops/conv.h"
#include <algorithm>
#include <climits>
#include "tensor/autograd_graph.h"
#include "core/error.h"
#include "ops/nn_rows.h"
#include "ops/ops.h"
#include "runtime/cudnn.h"

namespace flame {

namespace {

struct ConvLaunch {  // mirrors ConvParams in cuda/conv.cuh
  int32_t N, Hs, Ws, Cs, Hd, Wd, Cd;
  int32_t kh, kw, sh, sw, ph, pw, dh, dw;
  int32_t G, Kc, Nc, K, splits;
  int64_t M, m_chunk;
};
static_assert(sizeof(ConvLaunch) == 96, "ConvLaunch must match ConvParams in cuda/conv.cuh");

constexpr int kMode_Fwd = 0, kMode_Dgrad = 1;
constexpr int64_t kMmaTile = 128, kMmaDepth = 32;
constexpr unsigned kMmaThreads = 128, kSimtThreads = 256;  // conv::kThreads; the SIMT kernels
constexpr unsigned kMmaSmem = 4 * 2 * 128 * (32 + 8) * 2;    // conv_mma: stages x (A, B) x rows x pitch x 2 bytes
constexpr unsigned kWgradSmem = 4 * 2 * 32 * (128 + 8) * 2;  // conv_wgrad_mma
constexpr int64_t kDirectBelow = 16;                         // fewer output channels per group: direct kernels

// The kernels of cuda/conv.cuh: <T, mode (forward / data gradient), vectorised loads>.
using A = TArg;
constexpr KernelTemplate kMma{"conv.cuh", "flame::conv_mma", {A::Dtype, A::Int, A::Bool}};
constexpr KernelTemplate kWgradMma{"conv.cuh", "flame::conv_wgrad_mma", {A::Dtype, A::Bool}};
constexpr KernelTemplate kSimt{"conv.cuh", "flame::conv_simt", {A::Dtype, A::Int}};
constexpr KernelTemplate kWgradSimt{"conv.cuh", "flame::conv_wgrad_simt", {A::Dtype}};
constexpr KernelTemplate kDirect{"conv.cuh", "flame::conv_direct", {A::Dtype, A::Int}};
constexpr KernelTemplate kWgradDirect{"conv.cuh", "flame::conv_wgrad_direct", {A::Dtype}};
KernelKey mma_key(DType t, int mode, bool vec) { return make_key(kMma, t, mode, vec); }
KernelKey wgrad_mma_key(DType t, bool vec) { return make_key(kWgradMma, t, vec); }
KernelKey simt_key(DType t, int mode) { return make_key(kSimt, t, mode); }
KernelKey wgrad_simt_key(DType t) { return make_key(kWgradSimt, t); }
KernelKey direct_key(DType t, int mode) { return make_key(kDirect, t, mode); }
KernelKey wgrad_direct_key(DType t) { return make_key(kWgradDirect, t); }

bool is_half(DType t) { return t == FLAME_DTYPE_F16 || t == FLAME_DTYPE_BF16; }
bool tensor_cores(const Context& ctx, DType t) { return is_half(t) && ctx.cc_major >= 8; }
bool aligned16(const Tensor& t) { return t->data() % 16 == 0; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
// The SIMT kernels' square tile (conv::Simt in cuda/conv.cuh): 128 for f32, 64 for f64; slices 1024 / tile deep.
int64_t simt_tile(DType t) { return t == FLAME_DTYPE_F64 ? 64 : 128; }

// The launch geometry of one GEMM: source and destination tensors of the forward conv (MODE 0 and
// the weight gradient) or of its input gradient (MODE 1).
ConvLaunch launch_geometry(const ops::ConvGeom& g, int mode) {
  ConvLaunch P{};
  const int64_t Cg = g.C / g.G, Og = g.O / g.G;
  const bool fwd = mode == kMode_Fwd;
  P.N = static_cast<int32_t>(g.N);
  P.Hs = static_cast<int32_t>(fwd ? g.H : g.Ho);
  P.Ws = static_cast<int32_t>(fwd ? g.W : g.Wo);
  P.Cs = static_cast<int32_t>(fwd ? g.C : g.O);
  P.Hd = static_cast<int32_t>(fwd ? g.Ho : g.H);
  P.Wd = static_cast<int32_t>(fwd ? g.Wo : g.W);
  P.Cd = static_cast<int32_t>(fwd ? g.O : g.C);
  P.kh = static_cast<int32_t>(g.kh);
  P.kw = static_cast<int32_t>(g.kw);
  P.sh = static_cast<int32_t>(g.sh);
  P.sw = static_cast<int32_t>(g.sw);
  P.ph = static_cast<int32_t>(g.ph);
  P.pw = static_cast<int32_t>(g.pw);
  P.dh = static_cast<int32_t>(g.dh);
  P.dw = static_cast<int32_t>(g.dw);
  P.G = static_cast<int32_t>(g.G);
  P.Kc = static_cast<int32_t>(fwd ? Cg : Og);
  P.Nc = static_cast<int32_t>(fwd ? Og : Cg);
  P.K = static_cast<int32_t>(g.kh * g.kw * P.Kc);
  P.splits = 1;
  P.M = g.N * P.Hd * P.Wd;
  P.m_chunk = 0;
  return P;
}

// A dense [N, H, W, C] tensor with t's values (t: [N, C, H, W], any strides): t's own memory when
// its strides allow it, else an internal copy.
Tensor nhwc(const Tensor& t) { return ops::contiguous(ops::permute(alias(t), {0, 2, 3, 1})); }

void set_smem(Context& ctx, CUfunction f, unsigned bytes) {
  ctx.check(ctx.drv.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(bytes)),
            "cuFuncSetAttribute");
}
void launch3(Context& ctx, CUfunction f, int64_t gx, int64_t gy, int64_t gz, unsigned threads, unsigned smem, void** args) {
  FLAME_CHECK(gx <= INT32_MAX && gy <= 65535 && gz <= 65535, FLAME_ERROR_UNSUPPORTED, "convolution too large for one launch (grid ",
              gx, " x ", gy, " x ", gz, ")");
  ctx.check(ctx.drv.cuLaunchKernel(f, static_cast<unsigned>(gx), static_cast<unsigned>(gy), static_cast<unsigned>(gz), threads,
                                   1, 1, smem, ctx.stream, args, nullptr),
            "cuLaunchKernel");
}

// dst (dense NHWC [N, Hd, Wd, Cd]) = the MODE GEMM of src (dense NHWC) and wb ([G][Nc][kh][kw][Kc]), + bias.
void run_conv(int mode, const ConvLaunch& P0, const Tensor& src, const Tensor& wb, const Tensor& bias, const Tensor& dst) {
  Context& ctx = dst->ctx();
  const DType dt = dst->dtype;
  if (P0.M == 0 || P0.Cd == 0) return;
  if (P0.K == 0) {  // no reduction channels: the bias alone
    if (bias) ops::copy_into(dst, ops::expand(ops::reshape(bias, {1, 1, 1, P0.Cd}), dst->shape));
    else ops::fill_(dst, 0);
    return;
  }
  ConvLaunch P = P0;
  CUdeviceptr sp = src->data(), wp = wb->data(), bp = bias ? bias->data() : 0, dp = dst->data();
  void* args[] = {&P, &sp, &wp, &bp, &dp};
  const int64_t simt = simt_tile(dt), mma_y = P.G * ceil_div(P.Nc, kMmaTile), simt_y = P.G * ceil_div(P.Nc, simt);
  if (P.Nc < kDirectBelow || (is_half(dt) && !tensor_cores(ctx, dt)) || (tensor_cores(ctx, dt) ? mma_y : simt_y) > 65535) {
    launch_flat(ctx, ctx.function(direct_key(dt, mode)), P.M * P.Cd, args);
    return;
  }
  if (tensor_cores(ctx, dt)) {
    const bool vec = P.Kc % 8 == 0 && P.Cs % 8 == 0 && aligned16(src) && aligned16(wb);
    CUfunction f = ctx.function(mma_key(dt, mode, vec));
    set_smem(ctx, f, kMmaSmem);
    launch3(ctx, f, ceil_div(P.M, kMmaTile), mma_y, 1, kMmaThreads, kMmaSmem, args);
  } else {
    launch3(ctx, ctx.function(simt_key(dt, mode)), ceil_div(P.M, simt), simt_y, 1, kSimtThreads, 0, args);
  }
}

// The weight gradient's partial sums [splits, O, K] in the compute type (x and dy dense NHWC).
Tensor run_wgrad(const ConvLaunch& P0, const Tensor& x, const Tensor& dy) {
  Context& ctx = dy->ctx();
  const DType dt = dy->dtype, acc = acc_of(dt);
  ConvLaunch P = P0;
  const int64_t O = static_cast<int64_t>(P.G) * P.Nc;
  enum { Direct, Mma, Simt } path = Mma;
  if (P.Nc < kDirectBelow || (is_half(dt) && !tensor_cores(ctx, dt))) path = Direct;
  else if (!tensor_cores(ctx, dt)) path = Simt;
  const int64_t tile = path == Mma ? kMmaTile : simt_tile(dt), depth = path == Mma ? kMmaDepth : 1024 / tile;
  if (path != Direct && (ceil_div(P.Nc, tile) > 65535 || P.G > 65535)) path = Direct;
  // Splits: as many blocks as fit on the GPU at once (two per SM; rounded down, so that the grid is
  // one full wave rather than one and a sliver), each split keeping at least 16 slices of the
  // reduction; the direct kernel: about 2048 threads per SM, at least 64 rows per split.
  int64_t want, max_splits;
  if (path == Direct) {
    want = ceil_div(2048LL * ctx.sm_count, O * P.K);
    max_splits = ceil_div(P.M, 64);
  } else {
    want = 2LL * ctx.sm_count / (ceil_div(P.K, tile) * ceil_div(P.Nc, tile) * P.G);
    max_splits = ceil_div(P.M, 16 * depth);
  }
  int64_t splits = std::max<int64_t>(1, std::min(want, max_splits));
  if (path != Direct) splits = std::min<int64_t>(splits, std::max<int64_t>(1, 65535 / P.G));
  // Each split covers a whole number of 32-row slices (a multiple of every kernel's slice depth).
  P.m_chunk = ceil_div(ceil_div(P.M, splits), kMmaDepth) * kMmaDepth;
  P.splits = static_cast<int32_t>(ceil_div(P.M, P.m_chunk));
  Tensor part = make_tensor(ctx, {P.splits, O, P.K}, acc);
  CUdeviceptr xp = x->data(), dp = dy->data(), op = part->data();
  void* args[] = {&P, &xp, &dp, &op};
  if (path == Direct) {
    launch_flat(ctx, ctx.function(wgrad_direct_key(dt)), static_cast<int64_t>(P.splits) * O * P.K, args);
  } else if (path == Mma) {
    const bool vec = P.Kc % 8 == 0 && P.Cs % 8 == 0 && P.Nc % 8 == 0 && P.Cd % 8 == 0 && aligned16(x) && aligned16(dy);
    CUfunction f = ctx.function(wgrad_mma_key(dt, vec));
    set_smem(ctx, f, kWgradSmem);
    launch3(ctx, f, ceil_div(P.K, kMmaTile), ceil_div(P.Nc, kMmaTile), static_cast<int64_t>(P.G) * P.splits, kMmaThreads,
            kWgradSmem, args);
  } else {
    launch3(ctx, ctx.function(wgrad_simt_key(dt)), ceil_div(P.K, tile), ceil_div(P.Nc, tile),
            static_cast<int64_t>(P.G) * P.splits, kSimtThreads, 0, args);
  }
  return part;
}

// The memory format of a result computed as NHWC: a channels-last view, or a contiguous copy.
Tensor finish_layout(const Tensor& y_nhwc, bool channels_last) {
  Tensor out = ops::permute(y_nhwc, {0, 3, 1, 2});
  return channels_last ? out : ops::contiguous(out);
}

// ---- the cuDNN path (see the top of the file); each returns null when cuDNN does not take the call

// Output size of one dim with `pad` rows before and after.
int64_t sym_out(int64_t in, int64_t k, int64_t s, int64_t pad, int64_t d) {
  const int64_t span = in + 2 * pad - d * (k - 1) - 1;
  return span < 0 ? 0 : span / s + 1;
}

// Whether cuDNN's legacy API can express the convolution: its dtype, symmetric padding that gives
// the geometry's output size ('same' with an even dilated kernel and conv_transpose2d's
// output_padding >= stride do not), and element counts within its int strides.
bool cudnn_fits(const ops::ConvGeom& g, DType dt) {
  if (dt != FLAME_DTYPE_F32 && dt != FLAME_DTYPE_F16 && dt != FLAME_DTYPE_BF16) return false;
  if (sym_out(g.H, g.kh, g.sh, g.ph, g.dh) != g.Ho || sym_out(g.W, g.kw, g.sw, g.pw, g.dw) != g.Wo) return false;
  const double most = std::max({static_cast<double>(g.N) * g.C * g.H * g.W, static_cast<double>(g.N) * g.O * g.Ho * g.Wo,
                                static_cast<double>(g.O) * (g.C / g.G) * g.kh * g.kw});
  return most <= INT32_MAX;
}

CudnnConv cudnn_call(CudnnDir dir, const ops::ConvGeom& g, bool nhwc_format, DType dt) {
  CudnnConv c;
  c.dir = dir;
  c.dtype = dt;
  c.channels_last = nhwc_format;
  c.N = g.N, c.C = g.C, c.H = g.H, c.W = g.W, c.O = g.O, c.kh = g.kh, c.kw = g.kw, c.G = g.G;
  c.sh = g.sh, c.sw = g.sw, c.ph = g.ph, c.pw = g.pw, c.dh = g.dh, c.dw = g.dw, c.Ho = g.Ho, c.Wo = g.Wo;
  return c;
}

// t ([N, C, H, W] or a weight) dense in the format: its own memory when its strides allow, else a copy.
Tensor dense_in(const Tensor& t, bool nhwc_format) { return nhwc_format ? nhwc(t) : ops::contiguous(alias(t)); }

// Forward: y from x = src; BackwardData: dx from dy = src. In format cl, plus bias b.
Tensor cudnn_data(CudnnDir dir, const ops::ConvGeom& g, bool cl, const Tensor& src, const Tensor& w, const Tensor& b) {
  Context& ctx = src->ctx();
  const DType dt = src->dtype;
  const bool fwd = dir == CudnnDir::Forward;
  const int64_t Cd = fwd ? g.O : g.C, Hd = fwd ? g.Ho : g.H, Wd = fwd ? g.Wo : g.W;
  if (g.N * Cd * Hd * Wd == 0 || !cudnn_fits(g, dt)) return nullptr;
  Cudnn* dnn = cudnn(ctx);
  if (!dnn) return nullptr;
  Tensor s = dense_in(src, cl), wt = dense_in(w, cl);
  if (!aligned16(s) || !aligned16(wt)) return nullptr;
  Tensor dst = make_tensor(ctx, cl ? Shape{g.N, Hd, Wd, Cd} : Shape{g.N, Cd, Hd, Wd}, dt);
  CudnnConv c = cudnn_call(dir, g, cl, dt);
  if (b) {  // cuDNN adds the convolution to it (beta = 1)
    ops::copy_into(dst, ops::expand(ops::reshape(alias(b), cl ? Shape{1, 1, 1, Cd} : Shape{1, Cd, 1, 1}), dst->shape));
    c.beta_one = true;
  }
  (fwd ? c.x : c.y) = s->data();
  (fwd ? c.y : c.x) = dst->data();
  c.w = wt->data();
  if (!dnn->run(c)) return nullptr;
  return cl ? ops::permute(dst, {0, 3, 1, 2}) : dst;
}

// The weight gradient from dy and x, channels-last when channels_last (else contiguous).
Tensor cudnn_wgrad(const ops::ConvGeom& g, bool channels_last, const Tensor& dy, const Tensor& x) {
  Context& ctx = dy->ctx();
  const DType dt = dy->dtype;
  const int64_t Cg = g.C / g.G;
  if (g.O * Cg * g.kh * g.kw == 0 || g.N * g.Ho * g.Wo == 0 || !cudnn_fits(g, dt)) return nullptr;
  Cudnn* dnn = cudnn(ctx);
  if (!dnn) return nullptr;
  // One format for all three tensors: NHWC when any of them is channels-last.
  const bool cl = channels_last || ops::is_channels_last(x) || ops::is_channels_last(dy);
  Tensor xs = dense_in(x, cl), ds = dense_in(dy, cl);
  if (!aligned16(xs) || !aligned16(ds)) return nullptr;
  Tensor dw = make_tensor(ctx, cl ? Shape{g.O, g.kh, g.kw, Cg} : Shape{g.O, Cg, g.kh, g.kw}, dt);
  CudnnConv c = cudnn_call(CudnnDir::BackwardFilter, g, cl, dt);
  c.x = xs->data();
  c.y = ds->data();
  c.w = dw->data();
  if (!dnn->run(c)) return nullptr;
  if (!cl) return dw;
  Tensor gw = ops::permute(dw, {0, 3, 1, 2});
  return channels_last ? gw : ops::contiguous(gw);
}

void record_conv(OpId op, const std::vector<Tensor>& ins, const Tensor& out, const ops::ConvGeom& g, const Tensor& s0,
                 const Tensor& s1) {
  if (auto node = record(op, ins, {out})) {
    node->attributes = g;
    // Conv2d / ConvTranspose2d: s0 (the input) is read only by the weight gradient, so a frozen
    // conv keeps no copy of its input (an empty slot). The weight (s1) is always kept: a parameter,
    // and its memory format picks the weight gradient's. ConvWeightGrad (double backward) keeps both.
    const bool conv = op == OpId::Conv2d || op == OpId::ConvTranspose2d;
    if (!conv || node->needs_input_grad(1)) node->saved.emplace_back(s0, false);
    else node->saved.emplace_back();
    node->saved.emplace_back(s1, false);
  }
}

}  // namespace

// ---------------------------------------------------------------- geometry

bool ops::is_channels_last(const Tensor& t) {
  if (t->ndim() != 4 || t->contiguous()) return false;
  const Shape& s = t->shape;
  const Strides& st = t->strides;
  const int order[4] = {1, 3, 2, 0};  // C, W, H, N from the fastest
  int64_t expect = 1;
  for (int d : order) {
    if (s[d] != 1 && st[d] != expect) return false;
    expect *= s[d];
  }
  return true;
}

// ---------------------------------------------------------------- the recorded primitives

Tensor ops::conv_forward(const Tensor& x, const Tensor& w, const Tensor& b, const ConvGeom& g) {
  Context& ctx = x->ctx();
  const bool cl = is_channels_last(x) || is_channels_last(w);
  Tensor out = cudnn_data(CudnnDir::Forward, g, cl, x, w, b);
  if (!out) {
    Tensor y = make_tensor(ctx, {g.N, g.Ho, g.Wo, g.O}, x->dtype);
    if (y->numel() > 0) {
      Tensor wb = contiguous(permute(alias(w), {0, 2, 3, 1}));  // [O][kh][kw][C / G] = [G][Og][kh][kw][Cg]
      run_conv(kMode_Fwd, launch_geometry(g, kMode_Fwd), nhwc(x), wb, b ? contiguous(alias(b)) : nullptr, y);
    }
    out = finish_layout(y, cl);
  }
  record_conv(OpId::Conv2d, {x, w, b}, out, g, x, w);
  return out;
}

Tensor ops::conv_input_grad(const Tensor& dy, const Tensor& w, const Tensor& b, const ConvGeom& g) {
  Context& ctx = dy->ctx();
  const bool cl = is_channels_last(dy) || is_channels_last(w);
  Tensor out = cudnn_data(CudnnDir::BackwardData, g, cl, dy, w, b);
  if (!out) {
    Tensor dx = make_tensor(ctx, {g.N, g.H, g.W, g.C}, dy->dtype);
    if (dx->numel() > 0) {
      const int64_t Og = g.O / g.G, Cg = g.C / g.G;
      // [G][Og][Cg][kh][kw] -> [G][Cg][kh][kw][Og]: the input gradient reduces over the output channels
      Tensor wb = contiguous(permute(reshape(alias(w), {g.G, Og, Cg, g.kh, g.kw}), {0, 2, 3, 4, 1}));
      run_conv(kMode_Dgrad, launch_geometry(g, kMode_Dgrad), nhwc(dy), wb, b ? contiguous(alias(b)) : nullptr, dx);
    }
    out = finish_layout(dx, cl);
  }
  record_conv(OpId::ConvTranspose2d, {dy, w, b}, out, g, dy, w);
  return out;
}

Tensor ops::conv_weight_grad(const Tensor& dy, const Tensor& x, const ConvGeom& g, bool channels_last) {
  Context& ctx = dy->ctx();
  Tensor gw = cudnn_wgrad(g, channels_last, dy, x);
  if (!gw) {
    const DType dt = dy->dtype, acc = acc_of(dt);
    const int64_t Cg = g.C / g.G, K = g.kh * g.kw * Cg;
    Tensor flat;  // [O, K] in the compute type, K = (r, s, c)
    if (g.O * K == 0) {
      flat = make_tensor(ctx, {g.O, K}, acc);
    } else if (g.N * g.Ho * g.Wo == 0) {
      flat = zeros(ctx, {g.O, K}, acc);
    } else {
      Tensor part = run_wgrad(launch_geometry(g, kMode_Fwd), nhwc(x), nhwc(dy));
      flat = part->shape[0] == 1 ? reshape(part, {g.O, K}) : sum_as(part, {0}, false, acc);
    }
    gw = permute(reshape(to_dtype(flat, dt), {g.O, g.kh, g.kw, Cg}), {0, 3, 1, 2});
    if (!channels_last) gw = contiguous(gw);
  }
  record_conv(OpId::ConvWeightGrad, {dy, x}, gw, g, dy, x);
  return gw;
}

Tensor ops::conv_bias_grad(const Tensor& dy) {
  return to_dtype(sum_as(dy, {0, 2, 3}, false, acc_of(dy->dtype)), dy->dtype);
}

// ---------------------------------------------------------------- PyTorch-style entry points

namespace {

constexpr int64_t kMaxArg = INT32_MAX;

void check_tensors(const Tensor& x, const Tensor& w, const Tensor& b, int nd, const char* op) {
  FLAME_CHECK(&w->ctx() == &x->ctx() && (!b || &b->ctx() == &x->ctx()), FLAME_ERROR_INVALID_ARGUMENT, op,
              ": x, weight and bias belong to different contexts");
  check_compute_dtype(x->dtype, op);
  FLAME_CHECK(is_floating(x->dtype), FLAME_ERROR_DTYPE_MISMATCH, op, ": x must be f32, f64, f16 or bf16, got ",
              dtype_name(x->dtype));
  FLAME_CHECK(w->dtype == x->dtype, FLAME_ERROR_DTYPE_MISMATCH, op, ": weight has dtype ", dtype_name(w->dtype),
              " but x has dtype ", dtype_name(x->dtype));
  FLAME_CHECK(!b || b->dtype == x->dtype, FLAME_ERROR_DTYPE_MISMATCH, op, ": bias has dtype ", b ? dtype_name(b->dtype) : "",
              " but x has dtype ", dtype_name(x->dtype));
  const char* dims = nd == 3 ? "[N, C, L]" : "[N, C, H, W]";
  FLAME_CHECK(x->ndim() == nd, FLAME_ERROR_SHAPE_MISMATCH, op, ": x must be ", nd, "-D ", dims, ", got shape ",
              shape_str(x->shape));
  FLAME_CHECK(w->ndim() == nd, FLAME_ERROR_SHAPE_MISMATCH, op, ": weight must be ", nd, "-D, got shape ", shape_str(w->shape));
  FLAME_CHECK(!b || b->ndim() == 1, FLAME_ERROR_SHAPE_MISMATCH, op, ": bias must be 1-D, got shape ",
              b ? shape_str(b->shape) : "");
  FLAME_CHECK(x->shape[1] >= 1, FLAME_ERROR_SHAPE_MISMATCH, op, ": x has no channels (shape ", shape_str(x->shape), ")");
  for (int d = 2; d < nd; ++d)
    FLAME_CHECK(w->shape[d] >= 1, FLAME_ERROR_SHAPE_MISMATCH, op, ": weight's kernel size must be at least 1, got shape ",
                shape_str(w->shape));
  for (int64_t s : x->shape)
    FLAME_CHECK(s <= kMaxArg, FLAME_ERROR_INVALID_ARGUMENT, op, ": x of shape ", shape_str(x->shape), " is too large");
  for (int64_t s : w->shape)
    FLAME_CHECK(s <= kMaxArg, FLAME_ERROR_INVALID_ARGUMENT, op, ": weight of shape ", shape_str(w->shape), " is too large");
}

// The checks every option field gets, over the first `dims` elements of each pair.
void check_args(const ops::ConvArgs& a, int dims, const char* op) {
  for (int i = 0; i < dims; ++i) {
    FLAME_CHECK(a.stride[i] >= 1 && a.stride[i] <= kMaxArg, FLAME_ERROR_INVALID_ARGUMENT, op, ": stride[", i, "] must be in [1, 2^31 - 1], got ",
                a.stride[i]);
    FLAME_CHECK(a.dilation[i] >= 1 && a.dilation[i] <= kMaxArg, FLAME_ERROR_INVALID_ARGUMENT, op, ": dilation[", i,
                "] must be in [1, 2^31 - 1], got ", a.dilation[i]);
    FLAME_CHECK(a.padding[i] >= 0 && a.padding[i] <= kMaxArg, FLAME_ERROR_INVALID_ARGUMENT, op, ": padding[", i,
                "] must be in [0, 2^31 - 1], got ", a.padding[i]);
    FLAME_CHECK(a.output_padding[i] >= 0 && a.output_padding[i] <= kMaxArg, FLAME_ERROR_INVALID_ARGUMENT, op,
                ": output_padding[", i, "] must be in [0, 2^31 - 1], got ", a.output_padding[i]);
  }
  FLAME_CHECK(a.groups >= 1 && a.groups <= kMaxArg, FLAME_ERROR_INVALID_ARGUMENT, op, ": groups must be in [1, 2^31 - 1], got ", a.groups);
}

// The kernels index pixels and taps with 32-bit integers.
void check_reach(const ops::ConvGeom& g, const char* op) {
  const int64_t Cg = g.C / g.G, Og = g.O / g.G;
  const int64_t reach_h = g.Ho * g.sh + g.kh * g.dh + g.ph + g.H, reach_w = g.Wo * g.sw + g.kw * g.dw + g.pw + g.W;
  FLAME_CHECK(g.Ho <= kMaxArg && g.Wo <= kMaxArg && reach_h <= kMaxArg && reach_w <= kMaxArg &&
                  g.kh * g.kw * std::max(Cg, Og) <= kMaxArg,
              FLAME_ERROR_INVALID_ARGUMENT, op, ": the geometry exceeds the 32-bit indexing of the convolution kernels");
}

// Output size of one spatial dim; 0 when the kernel does not fit.
int64_t conv_out(int64_t in, int64_t k, int64_t s, int64_t pad_total, int64_t d) {
  const int64_t span = in + pad_total - d * (k - 1) - 1;
  return span < 0 ? 0 : span / s + 1;
}

// conv2d on 4-D tensors with checked tensors and arguments.
Tensor conv2d_checked(const Tensor& x, const Tensor& w, const Tensor& b, const ops::ConvArgs& a, const char* op) {
  ops::ConvGeom g;
  g.N = x->shape[0], g.C = x->shape[1], g.H = x->shape[2], g.W = x->shape[3];
  g.O = w->shape[0], g.kh = w->shape[2], g.kw = w->shape[3], g.G = a.groups;
  FLAME_CHECK(g.C % g.G == 0, FLAME_ERROR_INVALID_ARGUMENT, op, ": groups ", g.G, " does not divide the ", g.C,
              " channels of x");
  FLAME_CHECK(g.O % g.G == 0 && w->shape[1] == g.C / g.G, FLAME_ERROR_SHAPE_MISMATCH, op, ": weight has shape ",
              shape_str(w->shape), "; x with ", g.C, " channels in ", g.G, " groups needs [O, ", g.C / g.G,
              ", kh, kw] with O a multiple of ", g.G);
  FLAME_CHECK(!b || b->shape[0] == g.O, FLAME_ERROR_SHAPE_MISMATCH, op, ": bias has shape ", b ? shape_str(b->shape) : "",
              ", expected [", g.O, "]");
  FLAME_CHECK(a.output_padding[0] == 0 && a.output_padding[1] == 0, FLAME_ERROR_INVALID_ARGUMENT, op,
              ": output_padding is only for conv_transpose2d and must be 0 here");
  g.sh = a.stride[0], g.sw = a.stride[1], g.dh = a.dilation[0], g.dw = a.dilation[1];
  if (a.same) {
    FLAME_CHECK(g.sh == 1 && g.sw == 1, FLAME_ERROR_INVALID_ARGUMENT, op, ": padding_same needs stride 1, got stride [",
                a.stride[0], ", ", a.stride[1], "]");
    g.ph = g.dh * (g.kh - 1) / 2;  // the odd extra row / column of padding goes after, as in PyTorch
    g.pw = g.dw * (g.kw - 1) / 2;
    g.Ho = g.H;
    g.Wo = g.W;
  } else {
    g.ph = a.padding[0], g.pw = a.padding[1];
    g.Ho = conv_out(g.H, g.kh, g.sh, 2 * g.ph, g.dh);
    g.Wo = conv_out(g.W, g.kw, g.sw, 2 * g.pw, g.dw);
  }
  FLAME_CHECK(g.Ho >= 1 && g.Wo >= 1, FLAME_ERROR_SHAPE_MISMATCH, op, ": the output would be empty: x ", shape_str(x->shape),
              " with kernel ", g.kh, "x", g.kw, ", dilation [", g.dh, ", ", g.dw, "] and padding [", g.ph, ", ", g.pw,
              "] is smaller than the dilated kernel");
  check_reach(g, op);
  return ops::conv_forward(x, w, b, g);
}

}  // namespace

Tensor ops::conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const ConvArgs& a) {
  check_tensors(x, w, b, 4, "conv2d");
  check_args(a, 2, "conv2d");
  return conv2d_checked(x, w, b, a, "conv2d");
}

Tensor ops::conv1d(const Tensor& x, const Tensor& w, const Tensor& b, const ConvArgs& a) {
  check_tensors(x, w, b, 3, "conv1d");
  check_args(a, 1, "conv1d");
  ConvArgs a2;  // [N, C, L] as [N, C, 1, L]: the pairs' element 0 becomes the width's
  a2.stride[1] = a.stride[0];
  a2.padding[1] = a.padding[0];
  a2.dilation[1] = a.dilation[0];
  a2.output_padding[1] = a.output_padding[0];
  a2.groups = a.groups;
  a2.same = a.same;
  return squeeze(conv2d_checked(unsqueeze(x, 2), unsqueeze(w, 2), b, a2, "conv1d"), 2);
}

Tensor ops::conv_transpose2d(const Tensor& x, const Tensor& w, const Tensor& b, const ConvArgs& a) {
  const char* op = "conv_transpose2d";
  check_tensors(x, w, b, 4, op);
  check_args(a, 2, op);
  FLAME_CHECK(!a.same, FLAME_ERROR_INVALID_ARGUMENT, op, ": padding_same is not available for transposed convolutions");
  // The forward convolution whose input gradient this is: input [N, C_out, H_out, W_out], output
  // x [N, C_in, H_in, W_in], weight [C_in, C_out / groups, kh, kw] (the same tensor).
  ConvGeom g;
  g.N = x->shape[0], g.O = x->shape[1], g.Ho = x->shape[2], g.Wo = x->shape[3];
  g.kh = w->shape[2], g.kw = w->shape[3], g.G = a.groups;
  FLAME_CHECK(g.O % g.G == 0, FLAME_ERROR_INVALID_ARGUMENT, op, ": groups ", g.G, " does not divide the ", g.O,
              " channels of x");
  FLAME_CHECK(w->shape[0] == g.O, FLAME_ERROR_SHAPE_MISMATCH, op, ": weight has shape ", shape_str(w->shape),
              "; x with ", g.O, " channels needs [", g.O, ", C_out / groups, kh, kw]");
  g.C = w->shape[1] * g.G;
  FLAME_CHECK(g.C <= kMaxArg, FLAME_ERROR_INVALID_ARGUMENT, op, ": ", g.C, " output channels is too many");
  FLAME_CHECK(!b || b->shape[0] == g.C, FLAME_ERROR_SHAPE_MISMATCH, op, ": bias has shape ", b ? shape_str(b->shape) : "",
              ", expected [", g.C, "]");
  g.sh = a.stride[0], g.sw = a.stride[1], g.ph = a.padding[0], g.pw = a.padding[1], g.dh = a.dilation[0], g.dw = a.dilation[1];
  for (int i = 0; i < 2; ++i)
    FLAME_CHECK(a.output_padding[i] < std::max(a.stride[i], a.dilation[i]), FLAME_ERROR_INVALID_ARGUMENT, op,
                ": output_padding[", i, "] = ", a.output_padding[i], " must be smaller than stride[", i, "] or dilation[",
                i, "]");
  g.H = (g.Ho - 1) * g.sh - 2 * g.ph + g.dh * (g.kh - 1) + a.output_padding[0] + 1;
  g.W = (g.Wo - 1) * g.sw - 2 * g.pw + g.dw * (g.kw - 1) + a.output_padding[1] + 1;
  FLAME_CHECK(g.H >= 1 && g.W >= 1, FLAME_ERROR_SHAPE_MISMATCH, op, ": the output would be empty (", g.H, " x ", g.W,
              ") for x ", shape_str(x->shape), ", kernel ", g.kh, "x", g.kw, " and padding [", g.ph, ", ", g.pw, "]");
  FLAME_CHECK(g.H <= kMaxArg && g.W <= kMaxArg, FLAME_ERROR_INVALID_ARGUMENT, op, ": the output (", g.H, " x ", g.W,
              ") is too large");
  check_reach(g, op);
  return conv_input_grad(x, w, b, g);
}

// ---------------------------------------------------------------- kernel list

std::vector<std::string> ops::conv_kernel_instantiations() {
  std::vector<std::string> v;
  for (DType t : {FLAME_DTYPE_F16, FLAME_DTYPE_BF16}) {
    for (int mode : {kMode_Fwd, kMode_Dgrad})
      for (bool vec : {true, false}) v.push_back(kernel_name(mma_key(t, mode, vec)));
    for (bool vec : {true, false}) v.push_back(kernel_name(wgrad_mma_key(t, vec)));
  }
  for (DType t : {FLAME_DTYPE_F32, FLAME_DTYPE_F64}) {
    for (int mode : {kMode_Fwd, kMode_Dgrad}) v.push_back(kernel_name(simt_key(t, mode)));
    v.push_back(kernel_name(wgrad_simt_key(t)));
  }
  for (DType t : {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_F64}) {
    for (int mode : {kMode_Fwd, kMode_Dgrad}) v.push_back(kernel_name(direct_key(t, mode)));
    v.push_back(kernel_name(wgrad_direct_key(t)));
  }
  return v;
}

}  // namespace flame

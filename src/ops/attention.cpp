// Scaled-dot-product attention: argument checks, the fused kernel path and the composed path.
//
// Kernel path (f16/bf16, sm_80+, head dims D, Dv <= 128): q, k, v are read in place with any
// strides of their first three dims (a copy only when the last dim is not contiguous); the mask with
// any strides (0 on broadcast dims). The forward writes the output and lse (f32 [B, H, Lq]) and
// records one Attention node; memory beyond the output is O(B H Lq). The backward needs delta
// (f32 [B, H, Lq]) and an f32 dq accumulator [B, H, Lq, D]; only a mask gradient materialises dS.
// The kernels are cuda/attention.cuh's (FlashAttention-2, mma.sync) or, on compute capability 9.0
// without mask or dropout, D == Dv of 64 or 128, 16-byte aligned rows, scale > 0 and no empty dim
// (wg_path), the sm_90a ones (FlashAttention-3 structure: a TMA producer warpgroup feeding two wgmma
// warpgroups through mbarriers): the forward sdpa_fwd_tma of cuda/attention_tma.cuh and the backward
// sdpa_bwd_tma of cuda/attention_tma_bwd.cuh, which read and write the same O, lse2, delta and dq_acc
// (either backward follows either forward). They read q, k, v and dO through 4-D tensor maps; an input
// that no map describes (a stride of 0 from broadcasting, or a stride the driver refuses) is copied dense
// first (tma_input), only that input and only for reading: the copy is not recorded, the node keeps the
// input itself, and dq, dk, dv are [B, H, L, D] as on every path (an expand view's own backward sums them
// over its broadcast dims). On an H200 at 8x16x2048x128 bf16 they replaced cp.async kernels (sdpa_fwd_wg,
// sdpa_bwd_wg): forward 0.69 -> 0.50 ms, forward and backward 2.69-2.88 -> 2.40-2.45 ms (causal 1.65 ->
// 1.49-1.51).
//
// Composed path (everything else): S = scale q k^T, masked with where(-inf) / plus the additive
// mask, softmax over the keys, rows with no key left set to 0 (PyTorch's _safe_softmax), times the
// dropout mask, times v: ordinary recorded ops, so autograd (and create_graph) come from them.
//
// cuDNN path (runtime/cudnn_sdpa.cpp): f16/bf16 without mask or dropout, D == Dv, D % 8 == 0,
// D <= 128, 16-byte aligned views with strides in multiples of 8 elements, in a context that uses
// cuDNN, run cuDNN's fused flash attention when it has a plan for the shapes (else the kernels
// above). Its node saves cuDNN's Stats (natural-log log-sum-exp, attribute cudnn_stats); the backward runs
// through cuDNN too, or FLAME's kernels with lse = Stats log2(e) should cuDNN refuse that plan. Its
// output follows q's memory order (out_like_q): heads split from one projection give [B, Lq, H, Dv]
// memory, so merging the heads back costs no copy.
//
// Dropout draws B H Lq ceil(Lk / 4) Philox counters from the context (one per four keys of a row);
// the decision for (b, h, i, j) is the same function in both paths (see cuda/attention.cuh).
#include "ops/attention.h"
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstddef>
#include "core/error.h"
#include "ops/nn.h"
#include "ops/ops.h"
#include "runtime/cudnn.h"

namespace flame {

using namespace ops;

namespace {

const char* const kOp = "scaled_dot_product_attention";

struct AttnParams {  // mirrors flame::attn::Params (cuda/attention.cuh)
  uint64_t q, k, v, o, lse, mask;
  uint64_t dout, dq, dk, dv, dq_acc, delta, ds;
  int64_t q_sb, q_sh, q_sl, k_sb, k_sh, k_sl, v_sb, v_sh, v_sl, do_sb, do_sh, do_sl;
  int64_t m_sb, m_sh, m_si, m_sj;
  uint64_t seed, offset;
  int32_t B, H, Lq, Lk, D, Dv;
  int32_t mask_kind, causal, vec;
  uint32_t drop_threshold;
  float scale, scale_log2, drop_scale;
  int32_t pad;
};
static_assert(sizeof(AttnParams) == 304, "AttnParams must match flame::attn::Params");

// Tile geometry of the kernels (mirrors FwdTile / BwdTile in cuda/attention.cuh).
constexpr int kThreads = 128;
constexpr int kFwdBM = 128, kFwdBN = 64;
constexpr int kBwdBN = 64, kBwdBM = 64;
// Shared memory of one block: tiles of Q, K, V (padded rows of tile_d + 8), plus the mask tile.
unsigned fwd_smem(int tile_d, bool mask) {
  return static_cast<unsigned>((kFwdBM + 2 * kFwdBN) * (tile_d + 8) * 2 + (mask ? kFwdBM * (kFwdBN + 8) * 2 : 0));
}
unsigned bwd_smem(int tile_d, bool mask) {
  return static_cast<unsigned>((2 * kBwdBN + 2 * kBwdBM) * (tile_d + 8) * 2 + kBwdBN * (kBwdBM + 8) * 2 + 2 * kBwdBM * 4 +
                               (mask ? kBwdBM * (kBwdBN + 8) * 2 : 0));
}
// The kernels' tile width for head dims D and Dv (the larger is zero-padded up to it); 0: none.
int tile_dim(int64_t d) {
  for (int t : {64, 80, 96, 128})
    if (d <= t) return t;
  return 0;
}

struct Geometry {
  int64_t B, H, Lq, Lk, D, Dv;
};

struct Dropout {
  bool on = false;
  double p = 0;
  uint64_t seed = 0, offset = 0;
};

Geometry check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, const AttentionOptions& o) {
  const std::pair<const char*, const Tensor*> qkv[] = {{"q", &q}, {"k", &k}, {"v", &v}};
  for (const auto& [name, t] : qkv)
    FLAME_CHECK((*t)->ndim() == 4, FLAME_ERROR_SHAPE_MISMATCH, kOp, ": ", name, " must have 4 dims [B, H, L, E], got ",
                shape_str((*t)->shape));
  check_compute_dtype(q->dtype, kOp);
  FLAME_CHECK(is_floating(q->dtype), FLAME_ERROR_DTYPE_MISMATCH, kOp, ": q must be floating, got ", dtype_name(q->dtype));
  for (const auto& [name, t] : qkv) {
    FLAME_CHECK(&(*t)->ctx() == &q->ctx(), FLAME_ERROR_INVALID_ARGUMENT, kOp, ": ", name, " belongs to another context than q");
    FLAME_CHECK((*t)->dtype == q->dtype, FLAME_ERROR_DTYPE_MISMATCH, kOp, ": ", name, " is ", dtype_name((*t)->dtype),
                " but q is ", dtype_name(q->dtype));
    FLAME_CHECK((*t)->shape[0] == q->shape[0] && (*t)->shape[1] == q->shape[1], FLAME_ERROR_SHAPE_MISMATCH, kOp, ": ", name,
                " of shape ", shape_str((*t)->shape), " has other batch or head sizes than q ", shape_str(q->shape));
  }
  FLAME_CHECK(k->shape[3] == q->shape[3], FLAME_ERROR_SHAPE_MISMATCH, kOp, ": k's head dim ", k->shape[3],
              " differs from q's ", q->shape[3]);
  FLAME_CHECK(v->shape[2] == k->shape[2], FLAME_ERROR_SHAPE_MISMATCH, kOp, ": v has ", v->shape[2], " keys, k has ",
              k->shape[2]);
  FLAME_CHECK(q->shape[3] > 0, FLAME_ERROR_SHAPE_MISMATCH, kOp, ": the head dim of q and k is 0");
  Geometry G{q->shape[0], q->shape[1], q->shape[2], k->shape[2], q->shape[3], v->shape[3]};
  if (mask) {
    FLAME_CHECK(&mask->ctx() == &q->ctx(), FLAME_ERROR_INVALID_ARGUMENT, kOp, ": mask belongs to another context than q");
    FLAME_CHECK(mask->dtype == FLAME_DTYPE_BOOL || mask->dtype == q->dtype, FLAME_ERROR_DTYPE_MISMATCH, kOp,
                ": mask must be bool or q's dtype ", dtype_name(q->dtype), ", got ", dtype_name(mask->dtype));
    const Shape full = {G.B, G.H, G.Lq, G.Lk};
    bool fits = mask->ndim() <= 4;
    for (int d = 0; fits && d < mask->ndim(); ++d) {
      const int64_t m = mask->shape[static_cast<size_t>(d)], f = full[static_cast<size_t>(4 - mask->ndim() + d)];
      fits = m == 1 || m == f;
    }
    FLAME_CHECK(fits, FLAME_ERROR_SHAPE_MISMATCH, kOp, ": mask of shape ", shape_str(mask->shape),
                " does not broadcast to [B, H, Lq, Lk] = ", shape_str(full));
  }
  FLAME_CHECK(std::isfinite(o.scale), FLAME_ERROR_INVALID_ARGUMENT, kOp, ": scale must be finite, got ", o.scale);
  FLAME_CHECK(std::isfinite(o.dropout_p) && o.dropout_p >= 0 && o.dropout_p < 1, FLAME_ERROR_INVALID_ARGUMENT, kOp,
              ": dropout_p must be in [0, 1), got ", o.dropout_p);
  return G;
}

bool is_half(DType d) { return d == FLAME_DTYPE_F16 || d == FLAME_DTYPE_BF16; }

// The kernels need sm_80 (mma.sync with bf16), head dims up to 128, sizes that fit their int
// indices and enough shared memory per block.
bool use_kernels(Context& ctx, DType dtype, const Geometry& G) {
  if (!is_half(dtype) || ctx.cc_major < 8) return false;
  const int td = tile_dim(std::max(G.D, G.Dv));
  if (td == 0) return false;
  const int64_t big = INT_MAX / 2;
  if (G.B * G.H > big || G.Lq > big || G.Lk > big) return false;
  if ((G.Lq + kFwdBM - 1) / kFwdBM * G.B * G.H > INT_MAX || (G.Lk + kBwdBN - 1) / kBwdBN * G.B * G.H > INT_MAX)
    return false;
  int optin = 0;
  ctx.check(ctx.drv.cuDeviceGetAttribute(&optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, ctx.device),
            "cuDeviceGetAttribute");
  return std::max(fwd_smem(td, true), bwd_smem(td, true)) <= static_cast<unsigned>(optin);
}

// t itself when its last dim is contiguous (or has one element), else a contiguous copy.
Tensor unit_last(const Tensor& t) { return (t->shape[3] <= 1 || t->strides[3] == 1) ? t : contiguous(t); }

// 16-byte loads: head dims, strides of dims that matter and base addresses in 16-byte units.
bool aligned16(const Tensor& t) {
  if (t->data() % 16 != 0) return false;
  for (int d = 0; d < 3; ++d)
    if (t->shape[static_cast<size_t>(d)] > 1 && t->strides[static_cast<size_t>(d)] % 8 != 0) return false;
  return t->shape[3] % 8 == 0;
}

// The kernels of cuda/attention.cuh: <T, head-dim tile, dropout> and <T>.
using A = TArg;
constexpr KernelTemplate kFwd{"attention.cuh", "flame::attn::sdpa_fwd", {A::Dtype, A::Int, A::Bool}};
constexpr KernelTemplate kBwd{"attention.cuh", "flame::attn::sdpa_bwd", {A::Dtype, A::Int, A::Bool}};
constexpr KernelTemplate kBwdDelta{"attention.cuh", "flame::attn::sdpa_bwd_delta", {A::Dtype}};
constexpr KernelTemplate kBwdDq{"attention.cuh", "flame::attn::sdpa_bwd_dq", {A::Dtype}};
constexpr KernelTemplate kKeep{"attention.cuh", "flame::attn::sdpa_dropout_keep", {}};
// ---- the sm_90a kernels: the forward of cuda/attention_tma.cuh, the backward of cuda/attention_tma_bwd.cuh ----
// <T, head dim 64 or 128>: a TMA producer warpgroup and two wgmma consumer warpgroups; blocks of 128 query
// rows (forward) or 128 keys (backward).
constexpr KernelTemplate kFwdTma{"attention_tma.cuh", "flame::attn::sdpa_fwd_tma", {A::Dtype, A::Int}};
constexpr KernelTemplate kBwdTma{"attention_tma_bwd.cuh", "flame::attn::sdpa_bwd_tma", {A::Dtype, A::Int}};
constexpr unsigned kTmaThreads = 384;
constexpr int kTmaBwdBN = 128;
// Mirrors TmaFwdTile<d>::kSmemBytes: Q, then 2 (d = 128) or 3 (d = 64) stages of K and of V, 128 x d
// each; 8-byte mbarriers (Q, and full / empty of K and V per stage); 1 KB to align the base to 1024.
unsigned tma_fwd_smem(int d) {
  const int stages = d == 128 ? 2 : 3;
  return static_cast<unsigned>((1 + 2 * stages) * 128 * d * 2 + 8 * (1 + 4 * stages) + 1024);
}
// Mirrors TmaBwdTile<d>::kSmemBytes: K, V (128 x d), 3 (d = 128) or 4 (d = 64) stages of Q and dO (64 x d),
// dS^T twice (128 x 64), lse2 and delta per stage (64 f32 each), 8-byte mbarriers (kv; full / empty per
// stage), 1 KB to align the base to 1024.
unsigned tma_bwd_smem(int d) {
  const int stages = d == 128 ? 3 : 4;
  return static_cast<unsigned>(2 * 128 * d * 2 + 2 * stages * 64 * d * 2 + 2 * 128 * 64 * 2 + 2 * stages * 64 * 4 +
                               8 * (1 + 2 * stages) + 1024);
}
// The sm_90a kernels take f16/bf16 without mask or dropout, D == Dv of 64 or 128, 16-byte aligned rows
// (P.vec) and scale > 0 (their row maxima are taken over unscaled scores), and no empty dim (which no
// tensor map has; cuda/attention.cuh's kernels write the zeros and infinities of Lk = 0 or Lq = 0).
bool wg_path(Context& ctx, const Geometry& G, bool mask, bool dropout, const AttnParams& P) {
  return ctx.wgmma_enabled && !mask && !dropout && G.D == G.Dv && (G.D == 64 || G.D == 128) && P.vec && P.scale_log2 > 0 &&
         G.B * G.H * G.Lq * G.Lk > 0;
}
struct AttnTmaMaps {  // mirrors flame::attn::TmaMaps: three 128-byte CUtensorMaps at offsets 0, 128, 256
  CUtensorMap q, k, v;  // (cuda.h aligns them to 64 or, from CUDA 13, 128 bytes: the offsets are the same)
};
static_assert(sizeof(CUtensorMap) == 128 && sizeof(AttnTmaMaps) == 384 && offsetof(AttnTmaMaps, v) == 256,
              "AttnTmaMaps must match flame::attn::TmaMaps");
struct AttnTmaBwdMaps {  // mirrors flame::attn::TmaBwdMaps: q, k, v, dout at offsets 0, 128, 256, 384
  CUtensorMap q, k, v, dout;
};
static_assert(sizeof(AttnTmaBwdMaps) == 512 && offsetof(AttnTmaBwdMaps, dout) == 384,
              "AttnTmaBwdMaps must match flame::attn::TmaBwdMaps");
// A 4-D tensor map over t = [B, H, L, D] (innermost first: D, L, H, B) with t's strides, boxes of 64
// columns (128 bytes) x box_rows rows (128; 64 for the backward's query tiles), 128-byte swizzle, zeros
// outside. A size-1 dim gets the stride of a dense tensor (any value works for it); false where TMA cannot
// describe t (a 0 stride of a broadcast dim, a stride that is no multiple of 16 bytes) or the driver refuses.
bool tma_map(Context& ctx, CUtensorMap* map, const Tensor& t, unsigned box_rows) {
  int64_t st[3];
  int64_t inner = t->shape[3];
  for (int d = 2; d >= 0; --d) {
    const size_t ud = static_cast<size_t>(d);
    st[d] = t->shape[ud] == 1 ? inner : t->strides[ud];
    inner = st[d] * t->shape[ud];
  }
  cuuint64_t dims[4], strides[3];
  for (int d = 0; d < 4; ++d) dims[d] = static_cast<cuuint64_t>(t->shape[static_cast<size_t>(3 - d)]);
  for (int d = 0; d < 3; ++d) {
    const int64_t bytes = st[2 - d] * 2;
    if (bytes <= 0 || bytes % 16 != 0 || bytes >= (int64_t{1} << 40)) return false;
    strides[d] = static_cast<cuuint64_t>(bytes);
  }
  for (cuuint64_t n : dims)
    if (n == 0 || n > (cuuint64_t{1} << 32)) return false;
  const cuuint32_t box[4] = {64, box_rows, 1, 1}, elem[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type = t->dtype == FLAME_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return ctx.drv.cuTensorMapEncodeTiled(map, type, 4, reinterpret_cast<void*>(t->data()), dims, strides, box, elem,
                                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                        CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}
// The tensor map of an sm_90a kernel's input t: over t itself, else over a dense copy of t (a broadcast
// view's stride of 0, a stride the driver refuses), which *copy keeps alive until the launch is queued. The
// copy is not recorded: it only feeds the map (gradients keep t's shape). False only where not even the copy
// can be described (never expected; the caller then runs cuda/attention.cuh's kernels).
bool tma_input(Context& ctx, CUtensorMap* map, const Tensor& t, Tensor* copy, unsigned box_rows = 128) {
  if (tma_map(ctx, map, t, box_rows)) return true;
  *copy = make_tensor(ctx, t->shape, t->dtype);
  copy_into(*copy, t);
  return tma_map(ctx, map, *copy, box_rows);
}
// ---- end of the sm_90a kernels' host part ----

void launch(Context& ctx, const KernelKey& key, int64_t grid, unsigned smem, void** args, unsigned threads = kThreads) {
  CUfunction f = ctx.function(key);
  if (smem > 48 * 1024)
    ctx.check(ctx.drv.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(smem)),
              "cuFuncSetAttribute");
  ctx.launch(f, static_cast<unsigned>(grid), threads, args, smem);
}
int64_t flat_grid(Context& ctx, int64_t work) {
  return std::max<int64_t>(1, std::min<int64_t>((work + kThreads - 1) / kThreads, static_cast<int64_t>(ctx.sm_count) * 32));
}

// The parameters shared by every kernel of one call.
AttnParams make_params(const Geometry& G, bool causal, double scale, const Dropout& drop) {
  AttnParams P{};
  P.B = static_cast<int32_t>(G.B);
  P.H = static_cast<int32_t>(G.H);
  P.Lq = static_cast<int32_t>(G.Lq);
  P.Lk = static_cast<int32_t>(G.Lk);
  P.D = static_cast<int32_t>(G.D);
  P.Dv = static_cast<int32_t>(G.Dv);
  P.causal = causal ? 1 : 0;
  P.scale = static_cast<float>(scale);
  P.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  P.seed = drop.seed;
  P.offset = drop.offset;
  // keep when the top 24 bits of a word are >= ceil(p 2^24): probability 1 - p (to 2^-24)
  P.drop_threshold = drop.on ? static_cast<uint32_t>(std::ceil(drop.p * 16777216.0)) : 0;
  P.drop_scale = drop.on ? static_cast<float>(1.0 / (1.0 - drop.p)) : 1.0f;
  return P;
}

void set_inputs(AttnParams& P, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask) {
  P.q = q->data();
  P.k = k->data();
  P.v = v->data();
  P.q_sb = q->strides[0], P.q_sh = q->strides[1], P.q_sl = q->strides[2];
  P.k_sb = k->strides[0], P.k_sh = k->strides[1], P.k_sl = k->strides[2];
  P.v_sb = v->strides[0], P.v_sh = v->strides[1], P.v_sl = v->strides[2];
  P.vec = aligned16(q) && aligned16(k) && aligned16(v) ? 1 : 0;
  if (!mask) return;
  P.mask = mask->data();
  P.mask_kind = mask->dtype == FLAME_DTYPE_BOOL ? 1 : 2;
  int64_t* st[4] = {&P.m_sb, &P.m_sh, &P.m_si, &P.m_sj};
  const int lead = 4 - mask->ndim();
  for (int d = 0; d < 4; ++d) {  // broadcast dims (missing or of size 1) read index 0: stride 0
    const int md = d - lead;
    *st[d] = (md >= 0 && mask->shape[static_cast<size_t>(md)] != 1) ? mask->strides[static_cast<size_t>(md)] : 0;
  }
}

// The dropout keep mask as attention weights' factors: 1 / (1 - p) or 0, [B, H, Lq, Lk] in dtype.
Tensor dropout_factors(Context& ctx, const Geometry& G, const Dropout& drop, DType dtype) {
  Tensor keep = make_tensor(ctx, {G.B, G.H, G.Lq, G.Lk}, FLAME_DTYPE_BOOL);
  if (keep->numel() > 0) {
    AttnParams P = make_params(G, false, 1.0, drop);
    uint64_t out = keep->data();
    void* args[] = {&P, &out};
    launch(ctx, make_key(kKeep), flat_grid(ctx, G.B * G.H * G.Lq * ((G.Lk + 3) / 4)), 0, args);
  }
  return mul_scalar(to_dtype(keep, dtype), 1.0 / (1.0 - drop.p));
}

// softmax(scale q k^T + mask terms) over the keys with ops, 0 on rows whose keys are all masked.
Tensor composed_probs(const Tensor& q, const Tensor& k, const Tensor& mask, bool causal, double scale) {
  Context& ctx = q->ctx();
  const int64_t Lq = q->shape[2], Lk = k->shape[2];
  Tensor s = mul_scalar(matmul(q, transpose(k, 2, 3)), scale);
  if (Lk == 0) return s;  // [B, H, Lq, 0]: nothing to normalise
  Tensor allowed;
  if (causal)
    allowed = binary(OpId::Ge, unsqueeze(arange(ctx, 0, static_cast<double>(Lq), 1, FLAME_DTYPE_I64), 1),
                     unsqueeze(arange(ctx, 0, static_cast<double>(Lk), 1, FLAME_DTYPE_I64), 0));
  const bool may_empty_rows = mask != nullptr;  // causal alone always leaves key 0
  if (mask && mask->dtype == FLAME_DTYPE_BOOL) allowed = allowed ? binary(OpId::LogicalAnd, allowed, mask) : mask;
  if (mask && mask->dtype != FLAME_DTYPE_BOOL) s = add(s, to_dtype(mask, s->dtype));
  Tensor ninf = scalar(ctx, -INFINITY, s->dtype);
  if (allowed) s = where(allowed, s, ninf);
  if (!may_empty_rows) return softmax(s, 3, false);
  Tensor zero = scalar(ctx, 0.0, s->dtype);
  Tensor empty = binary(OpId::Eq, amax(alias(s), {3}, true), ninf);  // rows with no key left
  return where(empty, zero, softmax(where(empty, zero, s), 3, false));
}

// The whole composed forward in the compute dtype (f32 for f16/bf16 inputs), cast back.
Tensor composed_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, const Geometry& G,
                        bool causal, double scale, const Dropout& drop) {
  const DType dt = q->dtype, ct = is_half(dt) ? FLAME_DTYPE_F32 : dt;
  Tensor p = composed_probs(to_dtype(q, ct), to_dtype(k, ct), mask, causal, scale);
  if (drop.on) p = mul(p, dropout_factors(q->ctx(), G, drop, ct));
  return to_dtype(matmul(p, to_dtype(v, ct)), dt);
}

struct KernelForward {
  Tensor out, lse;
};

KernelForward kernel_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, const Geometry& G,
                             bool causal, double scale, const Dropout& drop) {
  Context& ctx = q->ctx();
  KernelForward r{make_tensor(ctx, {G.B, G.H, G.Lq, G.Dv}, q->dtype), make_tensor(ctx, {G.B, G.H, G.Lq}, FLAME_DTYPE_F32)};
  const int64_t grid = (G.Lq + kFwdBM - 1) / kFwdBM * G.B * G.H;
  if (grid == 0) return r;
  AttnParams P = make_params(G, causal, scale, drop);
  set_inputs(P, q, k, v, mask);
  P.o = r.out->data();
  P.lse = r.lse->data();
  void* args[] = {&P};
  AttnTmaMaps maps;
  Tensor qc, kc, vc;  // dense copies of inputs no tensor map describes
  if (wg_path(ctx, G, mask != nullptr, drop.on, P) && tma_input(ctx, &maps.q, q, &qc) && tma_input(ctx, &maps.k, k, &kc) &&
      tma_input(ctx, &maps.v, v, &vc)) {
    void* targs[] = {&P, &maps};
    const int d = static_cast<int>(G.D);
    launch(ctx, make_key(kFwdTma, q->dtype, d), grid, tma_fwd_smem(d), targs, kTmaThreads);
    return r;
  }
  const int td = tile_dim(std::max(G.D, G.Dv));
  launch(ctx, make_key(kFwd, q->dtype, td, drop.on), grid, fwd_smem(td, mask != nullptr), args);
  return r;
}

// The strides of dims 0..2 of t for cuDNN (a size-1 dim gets the extent of the dims after it).
void sdpa_strides(const Tensor& t, int64_t out[3]) {
  int64_t inner = t->shape[3];
  for (int d = 2; d >= 0; --d) {
    const size_t ud = static_cast<size_t>(d);
    out[d] = t->shape[ud] == 1 ? inner : t->strides[ud];
    inner = out[d] * t->shape[ud];
  }
}
// 16-byte aligned, strides of dims that matter in multiples of 8 elements and none 0 (a broadcast
// view runs FLAME's kernels or is copied), last dim contiguous.
bool cudnn_layout(const Tensor& t) {
  for (int d = 0; d < 3; ++d)
    if (t->shape[static_cast<size_t>(d)] > 1 && t->strides[static_cast<size_t>(d)] == 0) return false;
  return aligned16(t) && (t->shape[3] == 1 || t->strides[3] == 1);
}

// The context's cuDNN when it may run this attention (what CudnnSdpa covers), else nullptr.
Cudnn* cudnn_for(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                 const Geometry& G, const Dropout& drop) {
  if (mask || drop.on || !is_half(q->dtype) || G.D != G.Dv || G.D % 8 != 0 || G.D > 128) return nullptr;
  if (G.B * G.H * G.Lq * G.Lk == 0 || !cudnn_layout(q) || !cudnn_layout(k) || !cudnn_layout(v)) return nullptr;
  return cudnn(ctx);
}

// The output cuDNN writes, in q's memory order: [B, Lq, H, Dv] memory seen as [B, H, Lq, Dv] when q's
// heads lie inside its rows (q split from one qkv projection: strides (L 3HD, D, 3HD, 1)), so that the
// usual permute back to [B, Lq, H * Dv] is free (as PyTorch's SDPA); else dense.
Tensor out_like_q(Context& ctx, const Tensor& q, const Geometry& G) {
  if (G.H > 1 && G.Lq > 1 && q->strides[1] < q->strides[2]) {
    Tensor rows = make_tensor(ctx, {G.B, G.Lq, G.H, G.Dv}, q->dtype);
    return make_view(rows, {G.B, G.H, G.Lq, G.Dv}, {G.Lq * G.H * G.Dv, G.Dv, G.H * G.Dv, 1}, 0);
  }
  return make_tensor(ctx, {G.B, G.H, G.Lq, G.Dv}, q->dtype);
}

CudnnSdpa sdpa_args(const Tensor& q, const Tensor& k, const Tensor& v, const Geometry& G, bool causal, double scale) {
  CudnnSdpa a;
  a.dtype = q->dtype;
  a.causal = causal;
  a.B = G.B, a.H = G.H, a.Sq = G.Lq, a.Sk = G.Lk, a.D = G.D;
  sdpa_strides(q, a.q_st);
  sdpa_strides(k, a.k_st);
  sdpa_strides(v, a.v_st);
  a.scale = static_cast<float>(scale);
  a.q = q->data(), a.k = k->data(), a.v = v->data();
  return a;
}

Geometry geometry_of(const AttentionSaved& s) {
  return {s.q->shape[0], s.q->shape[1], s.q->shape[2], s.k->shape[2], s.q->shape[3], s.v->shape[3]};
}
Dropout dropout_of(const AttentionSaved& s) {
  Dropout d;
  d.on = s.dropout_p > 0;
  d.p = s.dropout_p;
  d.seed = s.seed;
  d.offset = s.offset;
  return d;
}

}  // namespace

Tensor ops::scaled_dot_product_attention(const Tensor& q0, const Tensor& k0, const Tensor& v0, const Tensor& mask,
                                         const AttentionOptions& opts) {
  const Geometry G = check_inputs(q0, k0, v0, mask, opts);
  Context& ctx = q0->ctx();
  const double scale = opts.scale != 0 ? opts.scale : 1.0 / std::sqrt(static_cast<double>(G.D));
  const uint64_t rng_before = ctx.rng_offset;
  try {
    Dropout drop;
    if (opts.dropout_p > 0 && G.B * G.H * G.Lq * G.Lk > 0) {
      drop.on = true;
      drop.p = opts.dropout_p;
      drop.seed = ctx.rng_seed;
      drop.offset = ctx.take_rng(static_cast<uint64_t>(G.B * G.H * G.Lq * ((G.Lk + 3) / 4)));
    }
    if (!use_kernels(ctx, q0->dtype, G)) return composed_forward(q0, k0, v0, mask, G, opts.causal, scale, drop);
    Tensor q = unit_last(q0), k = unit_last(k0), v = unit_last(v0);
    KernelForward f;
    bool via_cudnn = false;
    if (Cudnn* dnn = cudnn_for(ctx, q, k, v, mask, G, drop)) {
      f = {out_like_q(ctx, q, G), make_tensor(ctx, {G.B, G.H, G.Lq}, FLAME_DTYPE_F32)};
      CudnnSdpa a = sdpa_args(q, k, v, G, opts.causal, scale);
      sdpa_strides(f.out, a.o_st);
      a.o = f.out->data();
      a.stats = f.lse->data();
      via_cudnn = dnn->attention(a);  // false: no plan for these shapes, FLAME's kernels below
    }
    if (!via_cudnn) f = kernel_forward(q, k, v, mask, G, opts.causal, scale, drop);
    if (auto node = record(OpId::Attention, {q, k, v, mask}, {f.out})) {
      node->saved.emplace_back(q, false);
      node->saved.emplace_back(k, false);
      node->saved.emplace_back(v, false);
      node->saved.emplace_back(f.out, true);
      node->saved.emplace_back(f.lse, false);
      if (mask) node->saved.emplace_back(mask, false);
      node->attributes = AttentionAttrs{opts.causal, mask != nullptr, via_cudnn, drop.seed, drop.offset, scale,
                                        drop.on ? drop.p : 0.0};
    }
    return f.out;
  } catch (...) {
    ctx.rng_offset = rng_before;  // a failed call draws nothing
    throw;
  }
}

AttentionSaved ops::unpack_attention(Node& n) {
  AttentionSaved s;
  s.q = n.saved.at(0).unpack(n);
  s.k = n.saved.at(1).unpack(n);
  s.v = n.saved.at(2).unpack(n);
  s.out = n.saved.at(3).unpack(n);
  s.lse = n.saved.at(4).unpack(n);
  const AttentionAttrs& a = n.attrs<AttentionAttrs>();
  if (a.has_mask) s.mask = n.saved.at(5).unpack(n);
  s.causal = a.causal;
  s.cudnn_stats = a.cudnn_stats;
  s.seed = a.seed;
  s.offset = a.offset;
  s.scale = a.scale;
  s.dropout_p = a.dropout_p;
  return s;
}

AttentionGrads ops::attention_backward(const AttentionSaved& s, const Tensor& g0, bool need_dmask) {
  const Geometry G = geometry_of(s);
  Context& ctx = s.q->ctx();
  const DType dt = s.q->dtype;
  Tensor g = g0->dtype == dt ? unit_last(g0) : unit_last(to_dtype(g0, dt));
  AttentionGrads r;
  r.dq = make_tensor(ctx, {G.B, G.H, G.Lq, G.D}, dt);
  r.dk = make_tensor(ctx, {G.B, G.H, G.Lk, G.D}, dt);
  r.dv = make_tensor(ctx, {G.B, G.H, G.Lk, G.Dv}, dt);
  if (s.cudnn_stats) {  // the forward ran through cuDNN (no mask, no dropout): its backward too
    if (!cudnn_layout(g)) g = contiguous(g);  // e.g. the broadcast gradient of a sum
    Cudnn* dnn = cudnn_layout(g) ? cudnn(ctx) : nullptr;  // (a contiguous view may still be misaligned)
    CudnnSdpa a = sdpa_args(s.q, s.k, s.v, G, s.causal, s.scale);
    a.backward = true;
    sdpa_strides(g, a.do_st);
    sdpa_strides(s.out, a.o_st);
    a.o = s.out->data(), a.stats = s.lse->data(), a.dout = g->data();
    a.dq = r.dq->data(), a.dk = r.dk->data(), a.dv = r.dv->data();
    if (dnn && dnn->attention(a)) {
      record(OpId::AttentionBackward, {g, s.q, s.k, s.v}, {r.dq, r.dk, r.dv});
      return r;
    }
    // cuDNN has no backward plan: FLAME's kernels read the base-2 log-sum-exp, Stats log2(e)
    AttentionSaved s2 = s;
    s2.lse = mul_scalar(s.lse, 1.4426950408889634);
    s2.out = contiguous(s.out);  // FLAME's kernels read o dense (cuDNN may have written it in q's order)
    s2.cudnn_stats = false;
    return attention_backward(s2, g, need_dmask);
  }
  Tensor dq_acc = make_tensor(ctx, {G.B, G.H, G.Lq, G.D}, FLAME_DTYPE_F32);  // cleared by sdpa_bwd_delta
  Tensor delta = make_tensor(ctx, {G.B, G.H, G.Lq}, FLAME_DTYPE_F32);
  Tensor ds = need_dmask && s.mask ? zeros(ctx, {G.B, G.H, G.Lq, G.Lk}, FLAME_DTYPE_F32) : nullptr;
  AttnParams P = make_params(G, s.causal, s.scale, dropout_of(s));
  set_inputs(P, s.q, s.k, s.v, s.mask);
  P.vec = P.vec && aligned16(g) ? 1 : 0;
  P.o = s.out->data();
  P.lse = s.lse->data();
  P.dout = g->data();
  P.do_sb = g->strides[0], P.do_sh = g->strides[1], P.do_sl = g->strides[2];
  P.dq = r.dq->data();
  P.dk = r.dk->data();
  P.dv = r.dv->data();
  P.dq_acc = dq_acc->data();
  P.delta = delta->data();
  P.ds = ds ? ds->data() : 0;
  const int td = tile_dim(std::max(G.D, G.Dv));
  const bool drop = s.dropout_p > 0;
  void* args[] = {&P};
  const int64_t rows = G.B * G.H * G.Lq;
  if (rows > 0) {
    const int64_t blocks = std::min<int64_t>((rows + 3) / 4, static_cast<int64_t>(ctx.sm_count) * 32);  // a warp per row
    launch(ctx, make_key(kBwdDelta, dt), blocks, 0, args);
  }
  AttnTmaBwdMaps maps;
  Tensor qc, kc, vc, gc;  // dense copies of inputs no tensor map describes (read only: dq, dk, dv keep [B, H, L, D])
  if (wg_path(ctx, G, s.mask != nullptr, drop, P) && tma_input(ctx, &maps.q, s.q, &qc, 64) &&
      tma_input(ctx, &maps.k, s.k, &kc) && tma_input(ctx, &maps.v, s.v, &vc) && tma_input(ctx, &maps.dout, g, &gc, 64)) {
    void* targs[] = {&P, &maps};
    const int d = static_cast<int>(G.D);
    launch(ctx, make_key(kBwdTma, dt, d), (G.Lk + kTmaBwdBN - 1) / kTmaBwdBN * G.B * G.H, tma_bwd_smem(d), targs,
           kTmaThreads);
  } else {
    const int64_t grid = (G.Lk + kBwdBN - 1) / kBwdBN * G.B * G.H;
    if (grid > 0) launch(ctx, make_key(kBwd, dt, td, drop), grid, bwd_smem(td, s.mask != nullptr), args);
  }
  if (r.dq->numel() > 0) launch(ctx, make_key(kBwdDq, dt), flat_grid(ctx, r.dq->numel()), 0, args);
  if (ds) r.dmask = to_dtype(sum_to(ds, s.mask->shape), s.mask->dtype);
  record(OpId::AttentionBackward, {g, s.q, s.k, s.v}, {r.dq, r.dk, r.dv});
  return r;
}

AttentionGrads ops::attention_backward_composed(const AttentionSaved& s, const Tensor& g, bool need_dmask) {
  const Geometry G = geometry_of(s);
  const Dropout drop = dropout_of(s);
  const DType dt = s.q->dtype, ct = is_half(dt) ? FLAME_DTYPE_F32 : dt;
  Tensor q = to_dtype(s.q, ct), k = to_dtype(s.k, ct), v = to_dtype(s.v, ct), gc = to_dtype(g, ct);
  Tensor p = composed_probs(q, k, s.mask, s.causal, s.scale);
  Tensor z = drop.on ? dropout_factors(s.q->ctx(), G, drop, ct) : nullptr;
  Tensor pd = z ? mul(p, z) : p;
  Tensor dpd = matmul(gc, transpose(v, 2, 3));
  Tensor dp = z ? mul(dpd, z) : dpd;
  Tensor dsc = mul(p, sub(dp, sum(mul(dp, p), {3}, true)));  // softmax backward, per row
  AttentionGrads r;
  r.dq = to_dtype(mul_scalar(matmul(dsc, k), s.scale), dt);
  r.dk = to_dtype(mul_scalar(matmul(transpose(dsc, 2, 3), q), s.scale), dt);
  r.dv = to_dtype(matmul(transpose(pd, 2, 3), gc), dt);
  if (need_dmask && s.mask) r.dmask = to_dtype(sum_to(dsc, s.mask->shape), s.mask->dtype);
  return r;
}

std::vector<std::string> ops::attention_instantiations() {
  std::vector<std::string> v;
  for (DType dt : {FLAME_DTYPE_F16, FLAME_DTYPE_BF16}) {
    for (int td : {64, 80, 96, 128})
      for (bool drop : {false, true}) {
        v.push_back(kernel_name(make_key(kFwd, dt, td, drop)));
        v.push_back(kernel_name(make_key(kBwd, dt, td, drop)));
      }
    for (int d : {64, 128}) {
      v.push_back(kernel_name(make_key(kFwdTma, dt, d)));
      v.push_back(kernel_name(make_key(kBwdTma, dt, d)));
    }
    v.push_back(kernel_name(make_key(kBwdDelta, dt)));
    v.push_back(kernel_name(make_key(kBwdDq, dt)));
  }
  v.push_back(kernel_name(make_key(kKeep)));
  return v;
}

}  // namespace flame

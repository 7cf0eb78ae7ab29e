#include "ops/launch.h"
#include <algorithm>
#include "core/error.h"

namespace flame {

namespace {

constexpr unsigned kBlock = kLaunchBlock;
constexpr int kMaxDims = kLayoutMaxDims;
constexpr int kEwMaxOperands = 3;  // a, b, c of the ew_* kernels

struct TileLayout {  // mirrors cuda/elementwise.cuh
  int nb;
  int64_t bshape[6];
  int64_t bstride_out[6];
  int64_t bstride_in[6];
  int64_t rows, cols;
  int64_t in_col_stride;
  int64_t out_row_stride;
};

struct ReduceLayout {  // mirrors cuda/reduce.cuh
  int out_ndim;
  int64_t out_shape[kMaxDims];
  int64_t out_stride[kMaxDims];
  int red_ndim;
  int64_t red_shape[kMaxDims];
  int64_t red_stride[kMaxDims];
};

struct ScanLayout {  // mirrors cuda/scan.cuh
  int row_ndim;
  int64_t row_shape[kMaxDims];
  int64_t row_in_stride[kMaxDims];
  int64_t row_out_stride[kMaxDims];
  int64_t len, in_stride, out_stride;
};

// The elementwise kernels: <first, functor, out, up to 3 operand types> (ew_tile: one operand, no first).
// They take the storage-only (f8) dtypes, for the functors check_storage_functor admits.
using A = TArg;
constexpr KernelTemplate kEwContig{"elementwise.cuh", "flame::ew_contig",
                                   {A::Int, A::Text, A::Dtype, A::Dtype, A::Dtype, A::Dtype}, true};
constexpr KernelTemplate kEwRows{"elementwise.cuh", "flame::ew_rows",
                                 {A::Int, A::Text, A::Dtype, A::Dtype, A::Dtype, A::Dtype}, true};
constexpr KernelTemplate kEwStrided{"elementwise.cuh", "flame::ew_strided",
                                    {A::Index, A::Text, A::Dtype, A::Dtype, A::Dtype, A::Dtype}, true};
constexpr KernelTemplate kEwTile{"elementwise.cuh", "flame::ew_tile", {A::Text, A::Dtype, A::Dtype}, true};

// Storage-only (f8) operands are converted (Identity: casts and copies) and filled (Fill), never
// computed on: any other functor with an f8 operand is FLAME_ERROR_UNSUPPORTED naming it.
// Called on every launch: no allocation unless it fails.
void check_storage_functor(std::string_view functor, DType out, const std::vector<DType>& ins) {
  DType f8 = out;
  for (DType d : ins) f8 = is_storage_only(f8) ? f8 : d;
  if (!is_storage_only(f8) || functor == "Identity" || functor == "Fill") return;
  check_compute_dtype(f8, ("the elementwise op " + std::string(functor)).c_str());
}

// first: the vector width (contig, rows) or whether the index type is 64-bit (strided).
KernelKey ew_key(const KernelTemplate& t, int first, std::string_view functor, DType out, const std::vector<DType>& ins) {
  FLAME_CHECK(ins.size() <= 3, FLAME_ERROR_INTERNAL, "elementwise kernels take at most 3 operands");
  check_storage_functor(functor, out, ins);
  KernelKey k = make_key(t, first, functor, out);
  for (size_t i = 0; i < 3; ++i) k.ints[3 + i] = i < ins.size() ? static_cast<int32_t>(ins[i]) : KernelKey::kAbsent;
  return k;
}

// Collapses kept or reduced axes of x into a (shape, stride) pair list.
void collapse_axes(const Tensor& x, const std::vector<int>& axes, int* ndim, int64_t* shape, int64_t* stride) {
  Shape s;
  Strides st;
  for (int a : axes) {
    s.push_back(x->shape[a]);
    st.push_back(x->strides[a]);
  }
  CollapsedLayout c = collapse(s, {st});
  *ndim = static_cast<int>(c.shape.size());
  for (int i = 0; i < *ndim; ++i) {
    shape[i] = c.shape[i];
    stride[i] = c.strides[0][i];
  }
}

// Few outputs with long reductions: each output is split into chunks reduced by separate blocks
// into partials, which a second launch combines (so that a full reduction fills the GPU: one wave of
// the 3 blocks of 512 threads reduce_general keeps resident per SM).
void split_reduction(Context& ctx, int64_t n_out, int64_t n_red, int64_t* chunks, int64_t* chunk_len) {
  if (n_out >= 2 * static_cast<int64_t>(ctx.sm_count) || n_red <= 8192) return;
  int64_t c = std::min<int64_t>((n_red + 4095) / 4096, std::max<int64_t>(1, 3 * ctx.sm_count / n_out));
  *chunk_len = (n_red + c - 1) / c;
  *chunks = (n_red + *chunk_len - 1) / *chunk_len;
}

// The [n_out, chunks] partials of split_reduction, reduced along their last axis.
ReduceLayout partials_layout(int64_t n_out, int64_t chunks) {
  ReduceLayout L{};
  L.out_ndim = 1;
  L.out_shape[0] = n_out;
  L.out_stride[0] = chunks;
  L.red_ndim = 1;
  L.red_shape[0] = chunks;
  L.red_stride[0] = 1;
  return L;
}

const char* reduce_op_name(ReduceKind k) {  // a functor of cuda/reduce.cuh (the key's text)
  switch (k) {
    case ReduceKind::Sum: return "SumOp";
    case ReduceKind::Prod: return "ProdOp";
    case ReduceKind::Max: return "MaxOp";
    case ReduceKind::Min: return "MinOp";
  }
  return "";
}

// The accumulator type: sums/products of floats in f32 (f64 for f64), of integers in i64;
// max/min in the compute type of the input.
DType acc_dtype(ReduceKind k, DType in) {
  bool sumlike = k == ReduceKind::Sum || k == ReduceKind::Prod;
  if (in == FLAME_DTYPE_F64) return FLAME_DTYPE_F64;
  if (is_floating(in)) return FLAME_DTYPE_F32;
  return sumlike ? FLAME_DTYPE_I64 : in;
}

// <op, in, acc, out>
constexpr KernelTemplate kReduceGeneral{"reduce.cuh", "flame::reduce_general", {A::Text, A::Dtype, A::Dtype, A::Dtype}};
constexpr KernelTemplate kReduceFlat{"reduce.cuh", "flame::reduce_flat", {A::Text, A::Dtype, A::Dtype, A::Dtype}};
constexpr KernelTemplate kReduceCols{"reduce.cuh", "flame::reduce_cols", {A::Text, A::Dtype, A::Dtype, A::Dtype}};
constexpr KernelTemplate kReduceTall{"reduce.cuh", "flame::reduce_tall", {A::Text, A::Dtype, A::Dtype, A::Dtype}};
constexpr KernelTemplate kArgReduce{"reduce.cuh", "flame::arg_reduce", {A::Bool, A::Dtype}};  // <is_max, in>
constexpr KernelTemplate kCumsum{"scan.cuh", "flame::cumsum_kernel", {A::Dtype, A::Dtype, A::Dtype}};  // <in, acc, out>

KernelKey reduce_key(const KernelTemplate& t, ReduceKind k, DType in, DType acc, DType out) {
  return make_key(t, reduce_op_name(k), in, acc, out);
}

}  // namespace

unsigned grid_for(Context& ctx, int64_t work_items, unsigned block) {
  int64_t blocks = (work_items + block - 1) / block;
  int64_t cap = static_cast<int64_t>(ctx.sm_count) * 32;  // grid-stride loops cover the rest
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(blocks, cap)));
}

int vector_width(DType out, const std::vector<DType>& ins) {
  size_t widest = dtype_size(out);
  for (DType d : ins) widest = std::max(widest, dtype_size(d));
  return static_cast<int>(16 / widest);
}

bool vectors_aligned(const Tensor& out, const std::vector<Tensor>& ins, int v) {
  bool aligned = out->data() % (v * out->elem_size()) == 0;
  for (const Tensor& t : ins) aligned = aligned && t->data() % (v * t->elem_size()) == 0;
  return aligned;
}

bool rows_fit(const Tensor& out, const std::vector<Tensor>& ins, const CollapsedLayout& c, int v) {
  const int nd = static_cast<int>(c.shape.size());
  if (ins.empty() || nd > kMaxDims || !out->contiguous()) return false;
  const int64_t cols = c.shape[nd - 1];
  if (cols % v != 0 || cols / v < 4 || out->data() % (v * out->elem_size()) != 0) return false;  // short rows: strided
  for (size_t k = 0; k < ins.size(); ++k) {
    const Strides& st = c.strides[k + 1];
    const int64_t inner = st[nd - 1];
    if (inner == 0) continue;  // one element per row, read as a scalar
    if (inner != 1 || ins[k]->data() % (v * ins[k]->elem_size()) != 0) return false;
    for (int d = 0; d < nd - 1; ++d)
      if (st[d] % v != 0) return false;
  }
  return true;
}

std::vector<std::string> elementwise_instantiations(std::string_view functor, DType out, const std::vector<DType>& ins) {
  const int v = vector_width(out, ins);
  std::vector<std::string> r = {kernel_name(ew_key(kEwContig, v, functor, out, ins)),
                                kernel_name(ew_key(kEwContig, 1, functor, out, ins)),
                                kernel_name(ew_key(kEwStrided, 0, functor, out, ins)),
                                kernel_name(ew_key(kEwStrided, 1, functor, out, ins))};
  if (!ins.empty()) r.push_back(kernel_name(ew_key(kEwRows, v, functor, out, ins)));
  if (ins.size() == 1) r.push_back(kernel_name(make_key(kEwTile, functor, out, ins[0])));
  return r;
}

namespace {

// Dense output whose operands are dense or broadcast along the last collapsed axis (x + bias,
// x * row_scale, a copy or cast of a view with permuted outer axes): ew_rows, V elements per thread.
// False when the layout or the alignment does not fit; the caller then uses ew_tile or ew_strided.
bool launch_rows(Context& ctx, std::string_view functor, ScalarArgs& args, const Tensor& out,
                 const std::vector<Tensor>& ins, const std::vector<DType>& in_types, const CollapsedLayout& c,
                 CUdeviceptr* ptr) {
  const int v = vector_width(out->dtype, in_types);
  RowsLayout<kEwMaxOperands> L;
  if (!plan_rows_layout(out, ins, c, v, &L)) return false;
  CUfunction f = ctx.function(ew_key(kEwRows, v, functor, out->dtype, in_types));
  void* kargs[] = {&args, &ptr[0], &ptr[1], &ptr[2], &ptr[3], &L};
  // One wave of the 6 blocks an SM holds (40 registers): the broadcast add [16384^2] + [16384] f32 on an
  // H200 took 0.559 ms with the usual cap of 32 blocks per SM (5.33 waves), 0.548 with 24, 0.547 with 6.
  const int64_t blocks = (L.rows * (L.cols / v) + kBlock - 1) / kBlock;
  ctx.launch(f, static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(blocks, static_cast<int64_t>(ctx.sm_count) * 6))),
             kBlock, kargs);
  return true;
}

// Dense output from one operand whose unit-stride axis is not the output's last axis (a transposed
// or channels-last copy or cast): ew_tile through shared memory. False when the layout does not fit.
bool launch_tile(Context& ctx, std::string_view functor, ScalarArgs& args, const Tensor& out, const Tensor& in,
                 const CollapsedLayout& c, CUdeviceptr* ptr) {
  const int nd = static_cast<int>(c.shape.size());
  if (nd < 2 || nd > 8 || !out->contiguous()) return false;
  const Strides& si = c.strides[1];
  const Strides& so = c.strides[0];
  int p = -1;
  for (int d = 0; d < nd - 1; ++d)
    if (si[d] == 1) p = d;
  if (p < 0 || si[nd - 1] == 1 || c.shape[p] < 16 || c.shape[nd - 1] < 16) return false;
  TileLayout L{};
  L.rows = c.shape[p];
  L.cols = c.shape[nd - 1];
  L.in_col_stride = si[nd - 1];
  L.out_row_stride = so[p];
  int64_t tiles = ((L.rows + 31) / 32) * ((L.cols + 31) / 32);
  for (int d = 0; d < nd - 1; ++d) {
    if (d == p) continue;
    L.bshape[L.nb] = c.shape[d];
    L.bstride_out[L.nb] = so[d];
    L.bstride_in[L.nb] = si[d];
    tiles *= c.shape[d];
    ++L.nb;
  }
  CUfunction f = ctx.function(make_key(kEwTile, functor, out->dtype, in->dtype));
  void* kargs[] = {&args, &ptr[0], &ptr[1], &L};
  ctx.check(ctx.drv.cuLaunchKernel(f, grid_for(ctx, tiles, 1), 1, 1, 32, 8, 1, 0, ctx.stream, kargs, nullptr), "cuLaunchKernel");
  return true;
}

}  // namespace

void launch_elementwise(std::string_view functor, const ScalarArgs& s, const Tensor& out, const std::vector<Tensor>& ins) {
  Context& ctx = out->ctx();
  std::vector<DType> in_types;
  for (const auto& t : ins) in_types.push_back(t->dtype);
  check_storage_functor(functor, out->dtype, in_types);  // empty tensors too: the same answer for every size
  int64_t n = out->numel();
  if (n == 0) return;
  CUdeviceptr ptr[4] = {out->data(), 0, 0, 0};
  for (size_t i = 0; i < ins.size(); ++i) ptr[i + 1] = ins[i]->data();
  ScalarArgs args = s;
  bool dense = out->contiguous();
  for (const auto& t : ins) dense = dense && t->contiguous();
  if (dense) {
    int v = vector_width(out->dtype, in_types);
    if (!vectors_aligned(out, ins, v)) v = 1;
    CUfunction f = ctx.function(ew_key(kEwContig, v, functor, out->dtype, in_types));
    void* kargs[] = {&args, &ptr[0], &n, &ptr[1], &ptr[2], &ptr[3]};
    // One pair of vectors per thread (the kernel's loop body), so a block's life is short: on an H200
    // this reaches 1.00-1.01 of PyTorch on 2^28-element unary/binary/cast rows, against 1.05-1.08
    // with the grid capped at 32 blocks per SM and 1.07-1.18 at 8 (long grid-stride loops per thread).
    const int64_t nvec = (n + v - 1) / v;
    const unsigned grid = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((nvec + 2 * kBlock - 1) / (2 * kBlock), 0x7fffffff)));
    ctx.launch(f, grid, kBlock, kargs);
    return;
  }
  std::vector<Strides> strides = {out->strides};
  for (const auto& t : ins) strides.push_back(t->strides);
  CollapsedLayout c = collapse(out->shape, strides);
  if (launch_rows(ctx, functor, args, out, ins, in_types, c, ptr)) return;
  if (ins.size() == 1 && launch_tile(ctx, functor, args, out, ins[0], c, ptr)) return;
  StridedLayout<kEwMaxOperands> L = plan_strided_layout<kEwMaxOperands>(c);
  bool wide = n >= (int64_t{1} << 32) - kBlock * static_cast<int64_t>(ctx.sm_count) * 32;
  CUfunction f = ctx.function(ew_key(kEwStrided, wide ? 1 : 0, functor, out->dtype, in_types));
  void* kargs[] = {&args, &ptr[0], &n, &ptr[1], &ptr[2], &ptr[3], &L};
  ctx.launch(f, grid_for(ctx, n, kBlock), kBlock, kargs);
}

std::vector<std::string> reduce_instantiations(ReduceKind k, DType in, DType out) {
  DType acc = acc_dtype(k, in);
  return {kernel_name(reduce_key(kReduceGeneral, k, in, acc, out)), kernel_name(reduce_key(kReduceFlat, k, in, acc, out)),
          kernel_name(reduce_key(kReduceCols, k, in, acc, out)),
          kernel_name(reduce_key(kReduceTall, k, in, acc, out)),    kernel_name(reduce_key(kReduceTall, k, in, acc, acc)),
          kernel_name(reduce_key(kReduceTall, k, acc, acc, out))};
}

namespace {

// reduce_tall's grid over `nvec` column vectors and `rows` rows: at least two blocks per SM where
// the columns allow (narrower column slices, more rows per step), then chunks of >= 16 rows per
// thread when `split` (partials for a second pass).
struct TallPlan {
  int slice = 0;
  int64_t slices = 0, chunks = 1, chunk_len = 0;
};
TallPlan plan_tall(const Context& ctx, int64_t nvec, int64_t rows, bool split) {
  const int64_t want = 2 * static_cast<int64_t>(ctx.sm_count);
  TallPlan p;
  int64_t slice = std::min<int64_t>(nvec, 256);
  while (slice > 32 && (nvec + slice - 1) / slice < want) slice /= 2;
  p.slice = static_cast<int>(slice);
  p.slices = (nvec + slice - 1) / slice;
  if (split) {
    const int64_t rpi = 256 / slice;
    p.chunks = std::max<int64_t>(1, std::min((want + p.slices - 1) / p.slices, rows / (16 * rpi)));
  }
  p.chunk_len = (rows + p.chunks - 1) / p.chunks;
  p.chunks = (rows + p.chunk_len - 1) / p.chunk_len;
  return p;
}

void launch_tall_pass(Context& ctx, const KernelKey& key, CUdeviceptr in, CUdeviceptr out, int64_t n_out, int64_t rows,
                      const TallPlan& p) {
  CUfunction f = ctx.function(key);
  int slice = p.slice;
  int64_t chunk_len = p.chunk_len;
  void* kargs[] = {&in, &out, &n_out, &rows, &chunk_len, &slice};
  ctx.check(ctx.drv.cuLaunchKernel(f, static_cast<unsigned>(p.slices), static_cast<unsigned>(p.chunks), 1, 256, 1, 1, 0,
                                   ctx.stream, kargs, nullptr),
            "cuLaunchKernel");
}

// x's reduced axes form one run of stride n_out over one kept run of stride 1 (a dense [n_red, n_out]
// block) whose rows split into 16-byte vectors: reduce_tall, in one pass or two (row chunks into
// [chunks, n_out] partials of the accumulator type, then those). False: another kernel's case.
bool launch_tall(Context& ctx, ReduceKind kind, const Tensor& x, const Tensor& out, const ReduceLayout& L, int64_t n_out,
                 int64_t n_red, DType acc) {
  const int64_t v_in = 16 / static_cast<int64_t>(dtype_size(x->dtype)), v_acc = 16 / static_cast<int64_t>(dtype_size(acc));
  if (L.out_ndim != 1 || L.red_ndim != 1 || L.out_stride[0] != 1 || L.red_stride[0] != n_out) return false;
  if (n_out % v_in != 0 || n_out % v_acc != 0 || x->data() % 16 != 0) return false;
  const TallPlan p = plan_tall(ctx, n_out / v_in, n_red, true);
  if (p.chunks == 1) {
    launch_tall_pass(ctx, reduce_key(kReduceTall, kind, x->dtype, acc, out->dtype), x->data(), out->data(), n_out, n_red, p);
    return true;
  }
  Tensor partial = make_tensor(ctx, {p.chunks, n_out}, acc);
  launch_tall_pass(ctx, reduce_key(kReduceTall, kind, x->dtype, acc, acc), x->data(), partial->data(), n_out, n_red, p);
  launch_tall_pass(ctx, reduce_key(kReduceTall, kind, acc, acc, out->dtype), partial->data(), out->data(), n_out, p.chunks,
                   plan_tall(ctx, n_out / v_acc, p.chunks, false));
  return true;
}

}  // namespace

Tensor launch_reduce(const Tensor& x, const std::vector<int>& rdims, ReduceKind kind, DType out_dtype) {
  check_compute_dtype(x->dtype, "reductions");  // empty inputs too, which need no kernel
  check_compute_dtype(out_dtype, "reductions");
  Context& ctx = x->ctx();
  Shape out_shape = x->shape;
  std::vector<int> kept;
  for (int d = 0; d < x->ndim(); ++d) {
    if (std::find(rdims.begin(), rdims.end(), d) != rdims.end()) out_shape[d] = 1;
    else kept.push_back(d);
  }
  Tensor out = make_tensor(ctx, out_shape, out_dtype);
  int64_t n_out = out->numel(), n_red = 1;
  for (int d : rdims) n_red *= x->shape[d];
  if (n_out == 0) return out;
  if (n_red == 0) {
    FLAME_CHECK(kind == ReduceKind::Sum || kind == ReduceKind::Prod, FLAME_ERROR_INVALID_ARGUMENT,
                "max/min of an empty axis is undefined");
    launch_elementwise("Fill", {kind == ReduceKind::Sum ? 0.0 : 1.0}, out, {});
    return out;
  }
  ReduceLayout L{};
  collapse_axes(x, kept, &L.out_ndim, L.out_shape, L.out_stride);
  collapse_axes(x, rdims, &L.red_ndim, L.red_shape, L.red_stride);
  DType acc = acc_dtype(kind, x->dtype);
  CUdeviceptr in_ptr = x->data(), out_ptr = out->data();
  const bool dense_rows = L.red_ndim == 1 && L.red_stride[0] == 1 && n_red >= 1024 &&
                          (n_out == 1 || (L.out_ndim == 1 && L.out_stride[0] == n_red));
  if (dense_rows && (n_out == 1 ? n_red > 8192 : n_out >= 2 * static_cast<int64_t>(ctx.sm_count))) {
    // reduce_flat, up to 4 blocks of 512 per SM. One output: the blocks sweep the tensor in tiles of
    // 1024 vectors spaced by the grid, and the last combines their partials. Rows: a block per row.
    const int64_t tiles = (n_red * static_cast<int64_t>(dtype_size(x->dtype)) / 16 + 1023) / 1024;
    const int64_t cap = 4 * static_cast<int64_t>(ctx.sm_count);
    int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(n_out == 1 ? tiles : n_out, cap));
    CUdeviceptr part_ptr = 0, done_ptr = 0;
    Tensor partial;
    if (n_out == 1) {
      partial = make_tensor(ctx, {blocks}, acc);
      part_ptr = partial->data();
      done_ptr = ctx.reduce_counters(1);
    }
    void* kargs[] = {&in_ptr, &out_ptr, &part_ptr, &done_ptr, &n_out, &n_red};
    ctx.launch(ctx.function(reduce_key(kReduceFlat, kind, x->dtype, acc, out_dtype)), static_cast<unsigned>(blocks), 512, kargs);
    return out;
  }
  if (launch_tall(ctx, kind, x, out, L, n_out, n_red, acc)) return out;
  bool cols = L.out_stride[L.out_ndim - 1] == 1 && L.red_stride[L.red_ndim - 1] != 1 && kept.size() > 0 &&
              n_out >= 32 * static_cast<int64_t>(ctx.sm_count);
  if (cols) {
    CUfunction f = ctx.function(reduce_key(kReduceCols, kind, x->dtype, acc, out_dtype));
    void* kargs[] = {&in_ptr, &out_ptr, &n_out, &n_red, &L};
    int64_t blocks = std::min<int64_t>((n_out + 31) / 32, static_cast<int64_t>(ctx.sm_count) * 16);
    ctx.check(ctx.drv.cuLaunchKernel(f, static_cast<unsigned>(blocks), 1, 1, 32, 8, 1, 0, ctx.stream, kargs, nullptr),
              "cuLaunchKernel");
    return out;
  }
  int64_t chunks = 1, chunk_len = n_red;
  split_reduction(ctx, n_out, n_red, &chunks, &chunk_len);
  unsigned block = n_red >= 1024 ? 512 : (n_red >= 128 ? 128 : 32);
  unsigned grid = static_cast<unsigned>(std::min<int64_t>(n_out * chunks, static_cast<int64_t>(ctx.sm_count) * 64));
  CUfunction f = ctx.function(reduce_key(kReduceGeneral, kind, x->dtype, acc, out_dtype));
  CUdeviceptr part_ptr = 0, done_ptr = 0;
  Tensor partial;
  if (chunks > 1) {  // the last block of each output combines its partials (cuda/reduce.cuh)
    partial = make_tensor(ctx, {n_out, chunks}, acc);
    part_ptr = partial->data();
    done_ptr = ctx.reduce_counters(static_cast<size_t>(n_out));
  }
  void* kargs[] = {&in_ptr, &out_ptr, &part_ptr, &done_ptr, &n_out, &n_red, &chunks, &chunk_len, &L};
  ctx.launch(f, grid, block, kargs);
  return out;
}

static KernelKey arg_key(bool is_max, DType in) { return make_key(kArgReduce, is_max, in); }
static DType compute_dtype(DType d) { return (d == FLAME_DTYPE_F16 || d == FLAME_DTYPE_BF16) ? FLAME_DTYPE_F32 : d; }

std::vector<std::string> arg_reduce_instantiations(DType in) {
  return {kernel_name(arg_key(true, in)), kernel_name(arg_key(false, in)), kernel_name(arg_key(true, compute_dtype(in))),
          kernel_name(arg_key(false, compute_dtype(in)))};
}

Tensor launch_arg_reduce(const Tensor& x, const std::vector<int>& rdims, bool is_max) {
  check_compute_dtype(x->dtype, is_max ? "argmax" : "argmin");
  Context& ctx = x->ctx();
  Shape out_shape = x->shape;
  std::vector<int> kept;
  for (int d = 0; d < x->ndim(); ++d) {
    if (std::find(rdims.begin(), rdims.end(), d) != rdims.end()) out_shape[d] = 1;
    else kept.push_back(d);
  }
  Tensor out = make_tensor(ctx, out_shape, FLAME_DTYPE_I64);
  int64_t n_out = out->numel(), n_red = 1;
  for (int d : rdims) n_red *= x->shape[d];
  if (n_out == 0) return out;
  FLAME_CHECK(n_red > 0, FLAME_ERROR_INVALID_ARGUMENT, "argmax/argmin of an empty axis is undefined");
  ReduceLayout L{};
  collapse_axes(x, kept, &L.out_ndim, L.out_shape, L.out_stride);
  collapse_axes(x, rdims, &L.red_ndim, L.red_shape, L.red_stride);
  int64_t chunks = 1, chunk_len = n_red;
  split_reduction(ctx, n_out, n_red, &chunks, &chunk_len);
  CUdeviceptr in_ptr = x->data(), null_ptr = 0, out_ptr = out->data();
  unsigned block = n_red >= 1024 ? 512 : (n_red >= 128 ? 128 : 32);
  unsigned grid = static_cast<unsigned>(std::min<int64_t>(n_out * chunks, static_cast<int64_t>(ctx.sm_count) * 64));
  if (chunks == 1) {
    int64_t one = 1;
    void* kargs[] = {&in_ptr, &null_ptr, &out_ptr, &null_ptr, &n_out, &n_red, &one, &chunk_len, &L};
    ctx.launch(ctx.function(arg_key(is_max, x->dtype)), grid, block, kargs);
    return out;
  }
  DType cd = compute_dtype(x->dtype);
  Tensor pidx = make_tensor(ctx, {n_out, chunks}, FLAME_DTYPE_I64);
  Tensor pval = make_tensor(ctx, {n_out, chunks}, cd);
  CUdeviceptr pi = pidx->data(), pv = pval->data();
  void* a1[] = {&in_ptr, &null_ptr, &pi, &pv, &n_out, &n_red, &chunks, &chunk_len, &L};
  ctx.launch(ctx.function(arg_key(is_max, x->dtype)), grid, block, a1);
  ReduceLayout L2 = partials_layout(n_out, chunks);
  int64_t one = 1;
  void* a2[] = {&pv, &pi, &out_ptr, &null_ptr, &n_out, &chunks, &one, &chunks, &L2};
  ctx.launch(ctx.function(arg_key(is_max, cd)), static_cast<unsigned>(std::min<int64_t>(n_out, 4096)), 128, a2);
  return out;
}

static KernelKey cumsum_key(DType in, DType out) {
  DType acc = in == FLAME_DTYPE_F64 ? FLAME_DTYPE_F64 : (is_floating(in) ? FLAME_DTYPE_F32 : FLAME_DTYPE_I64);
  return make_key(kCumsum, in, acc, out);
}

std::string cumsum_instantiation(DType in, DType out) { return kernel_name(cumsum_key(in, out)); }

Tensor launch_cumsum(const Tensor& x, int dim, DType out_dtype) {
  check_compute_dtype(x->dtype, "cumsum");
  check_compute_dtype(out_dtype, "cumsum");
  Context& ctx = x->ctx();
  Tensor out = make_tensor(ctx, x->shape, out_dtype);
  int64_t n = x->numel();
  if (n == 0) return out;
  ScanLayout L{};
  L.len = x->shape[dim];
  L.in_stride = x->strides[dim];
  L.out_stride = out->strides[dim];
  int64_t rows = 1;
  for (int d = 0; d < x->ndim(); ++d) {
    if (d == dim) continue;
    L.row_shape[L.row_ndim] = x->shape[d];
    L.row_in_stride[L.row_ndim] = x->strides[d];
    L.row_out_stride[L.row_ndim] = out->strides[d];
    ++L.row_ndim;
    rows *= x->shape[d];
  }
  CUdeviceptr in_ptr = x->data(), out_ptr = out->data();
  void* kargs[] = {&in_ptr, &out_ptr, &rows, &L};
  unsigned block = L.len >= 1024 ? 1024 : (L.len >= 256 ? 256 : 32);
  ctx.launch(ctx.function(cumsum_key(x->dtype, out_dtype)),
             static_cast<unsigned>(std::min<int64_t>(rows, static_cast<int64_t>(ctx.sm_count) * 32)), block, kargs);
  return out;
}

}  // namespace flame

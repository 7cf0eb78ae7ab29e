// Host side of the fused gradient tools: a Plan holds the tensor and chunk tables of one list (as
// the optimizer's step does), uploaded once, and the kernels of cuda/grad_tools.cuh run over them.
#include "runtime/capture.h"
#include "toolkit/grad_tools.h"
#include <algorithm>
#include <cstring>
#include <map>
#include "tensor/autograd_graph.h"
#include "core/error.h"
#include "ops/ops.h"

namespace flame::toolkit {

namespace {

constexpr int64_t kChunk = 65536;
constexpr unsigned kBlock = 256;
const DType kFloats[] = {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_F64};

// The kernels of cuda/grad_tools.cuh: the per-chunk kernels take <T>, the others no arguments.
constexpr KernelTemplate kSumsq{"grad_tools.cuh", "flame::gt_sumsq", {TArg::Dtype}};
constexpr KernelTemplate kScale{"grad_tools.cuh", "flame::gt_scale", {TArg::Dtype}};
constexpr KernelTemplate kStatsPartial{"grad_tools.cuh", "flame::gt_stats_partial", {TArg::Dtype}};
constexpr KernelTemplate kAddNoise{"grad_tools.cuh", "flame::gt_add_noise", {TArg::Dtype}};
constexpr KernelTemplate kAmpUnscale{"grad_tools.cuh", "flame::amp_unscale", {TArg::Dtype}};
constexpr KernelTemplate kFactor{"grad_tools.cuh", "flame::gt_factor", {}};
constexpr KernelTemplate kStatsFinal{"grad_tools.cuh", "flame::gt_stats_final", {}};
constexpr KernelTemplate kAmpUpdateScale{"grad_tools.cuh", "flame::amp_update_scale", {}};

struct Plan {
  std::vector<GtTensor> tensors;
  std::map<DType, std::vector<GtChunk>> chunks;
  int64_t slots = 0, total = 0;
  std::vector<std::pair<Tensor, Tensor>> write_back;  // (strided target, the contiguous copy written)
  std::vector<Tensor> keep;                           // what the tables point to, alive until the end
  Tensor meta;                                        // the tables on the device
  CUdeviceptr tensors_dev = 0;
  std::map<DType, CUdeviceptr> chunks_dev;
};

Plan make_plan(Context& ctx, const std::vector<Tensor>& ts, bool write) {
  Plan p;
  for (size_t i = 0; i < ts.size(); ++i) {
    Tensor d = ts[i];
    if (!d->contiguous()) {
      d = ops::contiguous(alias(ts[i]));
      if (write) p.write_back.emplace_back(ts[i], d);
    }
    p.keep.push_back(d);
    const int64_t n = d->numel(), nc = (n + kChunk - 1) / kChunk;
    p.tensors.push_back({static_cast<uint64_t>(d->data()), n, p.slots, nc, p.total});
    auto& cs = p.chunks[d->dtype];
    for (int64_t c = 0; c < nc; ++c) cs.push_back({static_cast<int64_t>(i), c * kChunk, p.slots + c});
    p.slots += nc;
    p.total += n;
  }
  std::vector<unsigned char> host(p.tensors.size() * sizeof(GtTensor));
  if (!host.empty()) std::memcpy(host.data(), p.tensors.data(), host.size());
  std::map<DType, size_t> at;
  for (auto& [dt, cs] : p.chunks) {
    at[dt] = host.size();
    host.resize(host.size() + cs.size() * sizeof(GtChunk));
    if (!cs.empty()) std::memcpy(host.data() + at[dt], cs.data(), cs.size() * sizeof(GtChunk));
  }
  {  // during a graph capture: set-up memory the graph reads, written once (runtime/capture.h)
    SetupScope setup(ctx);
    p.meta = make_tensor(ctx, {static_cast<int64_t>(std::max<size_t>(host.size(), 8))}, FLAME_DTYPE_U8);
  }
  RelaxedCaptureMode relaxed(ctx);
  if (!host.empty())  // pageable source: staged by the driver before the call returns
    ctx.check(ctx.drv.cuMemcpyHtoDAsync(p.meta->data(), host.data(), host.size(), ctx.init_stream()), "cuMemcpyHtoDAsync");
  p.tensors_dev = p.meta->data();
  for (auto& [dt, off] : at) p.chunks_dev[dt] = p.meta->data() + off;
  return p;
}

// Runs kernel<dtype> over the chunks of each dtype; extra points to the kernel's arguments after
// (tensors, chunks, chunk).
void launch_chunks(Context& ctx, Plan& p, const KernelTemplate& kernel, std::vector<void*> extra) {
  int64_t chunk = kChunk;
  for (auto& [dt, cs] : p.chunks) {
    if (cs.empty()) continue;
    CUdeviceptr cd = p.chunks_dev[dt];
    std::vector<void*> args = {&p.tensors_dev, &cd, &chunk};
    args.insert(args.end(), extra.begin(), extra.end());
    ctx.launch(ctx.function(make_key(kernel, dt)), static_cast<unsigned>(cs.size()), kBlock, args.data());
  }
}

// After an in-place kernel: strided targets get their copy back; every target's version moves.
void finish_writes(Plan& p, const std::vector<Tensor>& ts) {
  for (auto& [target, dense] : p.write_back) ops::copy_into(target, dense);  // bumps target's version
  for (const Tensor& t : ts)
    if (t->contiguous()) t->storage->version++;
}

// [first, last] byte addresses a tensor touches (numel > 0).
std::pair<CUdeviceptr, CUdeviceptr> byte_range(const Tensor& t) {
  int64_t lo = 0, hi = 0;
  for (int d = 0; d < t->ndim(); ++d) {
    const int64_t span = (t->shape[d] - 1) * t->strides[d];
    (span < 0 ? lo : hi) += span;
  }
  const int64_t es = static_cast<int64_t>(t->elem_size());
  return {t->data() + static_cast<CUdeviceptr>(lo * es), t->data() + static_cast<CUdeviceptr>(hi * es + es - 1)};
}

}  // namespace

void check_tensor_list(Context& ctx, const std::vector<Tensor>& ts, const char* name, bool inplace) {
  std::vector<std::pair<std::pair<CUdeviceptr, CUdeviceptr>, size_t>> ranges;
  for (size_t i = 0; i < ts.size(); ++i) {
    const Tensor& t = ts[i];
    FLAME_CHECK(&t->ctx() == &ctx, FLAME_ERROR_INVALID_ARGUMENT, name, "[", i, "] belongs to another context");
    FLAME_CHECK(is_floating(t->dtype), FLAME_ERROR_DTYPE_MISMATCH, name, "[", i, "] is ", dtype_name(t->dtype),
                "; the gradient tools take floating tensors");
    if (!inplace) continue;
    for (int d = 0; d < t->ndim(); ++d)
      FLAME_CHECK(t->strides[d] != 0 || t->shape[d] <= 1, FLAME_ERROR_INVALID_ARGUMENT, name, "[", i,
                  "] is a broadcast view (stride 0): several of its elements share memory and cannot be written");
    FLAME_CHECK(!(requires_grad(*t) && ctx.recording()), FLAME_ERROR_INVALID_ARGUMENT, name, "[", i,
                "] requires grad: the in-place gradient tools record nothing (disable grad mode or detach it)");
    if (t->numel() > 0) ranges.push_back({byte_range(t), i});
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t k = 1; k < ranges.size(); ++k)
    FLAME_CHECK(ranges[k].first.first > ranges[k - 1].first.second, FLAME_ERROR_INVALID_ARGUMENT, name, "[",
                ranges[k - 1].second, "] and ", name, "[", ranges[k].second, "] overlap in memory");
}

void normalize(Context& ctx, const std::vector<Tensor>& ts, double target, double eps) {
  if (ts.empty()) return;
  Plan p = make_plan(ctx, ts, true);
  Tensor partial = make_tensor(ctx, {std::max<int64_t>(p.slots, 1)}, FLAME_DTYPE_F64);
  Tensor factor = make_tensor(ctx, {static_cast<int64_t>(ts.size())}, FLAME_DTYPE_F64);
  CUdeviceptr pp = partial->data(), fp = factor->data();
  launch_chunks(ctx, p, kSumsq, {&pp});
  void* args[] = {&p.tensors_dev, &pp, &target, &eps, &fp};
  ctx.launch(ctx.function(make_key(kFactor)), static_cast<unsigned>(ts.size()), kBlock, args);
  launch_chunks(ctx, p, kScale, {&fp});
  finish_writes(p, ts);
}

void add_noise(Context& ctx, const std::vector<Tensor>& ts, double std_dev) {
  Plan p = make_plan(ctx, ts, true);
  if (p.total == 0) return;
  uint64_t seed = ctx.rng_seed, offset = ctx.take_rng(static_cast<uint64_t>(p.total));
  launch_chunks(ctx, p, kAddNoise, {&std_dev, &seed, &offset});
  finish_writes(p, ts);
}

Tensor stats(Context& ctx, const std::vector<Tensor>& ts) {
  Plan p = make_plan(ctx, ts, false);
  int64_t n = static_cast<int64_t>(ts.size());
  Tensor out = make_tensor(ctx, {n + 1, kStatColumns}, FLAME_DTYPE_F64);
  Tensor partial = make_tensor(ctx, {std::max<int64_t>(p.slots, 1) * kStatColumns}, FLAME_DTYPE_F64);
  CUdeviceptr pp = partial->data(), op = out->data();
  launch_chunks(ctx, p, kStatsPartial, {&pp});
  void* args[] = {&p.tensors_dev, &n, &pp, &p.slots, &op};
  ctx.launch(ctx.function(make_key(kStatsFinal)), static_cast<unsigned>(n + 1), kBlock, args);
  return out;
}

void unscale(Context& ctx, const std::vector<Tensor>& ts, const Tensor& scale, const Tensor& found_inf,
             const Tensor& found_any) {
  if (ts.empty()) return;
  Plan p = make_plan(ctx, ts, true);
  CUdeviceptr sp = scale->data(), fp = found_inf->data(), ap = found_any ? found_any->data() : 0;
  launch_chunks(ctx, p, kAmpUnscale, {&sp, &fp, &ap});
  finish_writes(p, ts);
  found_inf->storage->version++;
  if (found_any) found_any->storage->version++;
}

void update_scale(Context& ctx, const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf, double growth,
                  double backoff, int64_t interval) {
  CUdeviceptr sp = scale->data(), gp = growth_tracker->data(), fp = found_inf->data();
  void* args[] = {&sp, &gp, &fp, &growth, &backoff, &interval};
  ctx.launch(ctx.function(make_key(kAmpUpdateScale)), 1, 32, args);
  scale->storage->version++;
  growth_tracker->storage->version++;
}

std::vector<std::string> grad_tools_instantiations() {
  std::vector<std::string> v = {kernel_name(make_key(kFactor)), kernel_name(make_key(kStatsFinal)),
                                kernel_name(make_key(kAmpUpdateScale))};
  for (DType d : kFloats)
    for (const KernelTemplate* k : {&kSumsq, &kScale, &kStatsPartial, &kAddNoise, &kAmpUnscale})
      v.push_back(kernel_name(make_key(*k, d)));
  return v;
}

}  // namespace flame::toolkit

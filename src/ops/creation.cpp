// Tensor creation and host transfers. Nothing here is recorded in the autograd graph.
#include <cmath>
#include <vector>
#include "core/error.h"
#include "ops/launch.h"
#include "ops/ops.h"
#include "runtime/capture.h"

namespace flame {

namespace {
struct u {
  static unsigned grid(Context& ctx, int64_t n) {
    return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n + 255) / 256, ctx.sm_count * 32)));
  }
};
// The kernels of cuda/random.cuh: <T>.
constexpr KernelTemplate kArange{"random.cuh", "flame::arange_kernel", {TArg::Dtype}};
constexpr KernelTemplate kLinspace{"random.cuh", "flame::linspace_kernel", {TArg::Dtype}};
constexpr KernelTemplate kRandUniform{"random.cuh", "flame::rand_uniform", {TArg::Dtype}};
constexpr KernelTemplate kRandNormal{"random.cuh", "flame::rand_normal", {TArg::Dtype}};
}  // namespace

Tensor ops::empty(Context& ctx, const Shape& shape, DType dtype) { return make_tensor(ctx, shape, dtype); }

Tensor ops::full(Context& ctx, const Shape& shape, DType dtype, double value) {
  Tensor t = make_tensor(ctx, shape, dtype);
  fill_(t, value);
  return t;
}

Tensor ops::zeros(Context& ctx, const Shape& shape, DType dtype) { return full(ctx, shape, dtype, 0.0); }
Tensor ops::zeros_like(const Tensor& t) { return zeros(t->ctx(), t->shape, t->dtype); }
Tensor ops::scalar(Context& ctx, double value, DType dtype) { return full(ctx, {}, dtype, value); }

Tensor ops::arange(Context& ctx, double start, double end, double step, DType dtype) {
  FLAME_CHECK(std::isfinite(start) && std::isfinite(end) && std::isfinite(step), FLAME_ERROR_INVALID_ARGUMENT,
              "arange: start, end and step must be finite");
  FLAME_CHECK(step != 0, FLAME_ERROR_INVALID_ARGUMENT, "arange: step must not be 0");
  FLAME_CHECK((end - start) * step >= 0, FLAME_ERROR_INVALID_ARGUMENT, "arange: the sign of step (", step,
              ") does not lead from ", start, " to ", end);
  double count = std::ceil((end - start) / step);
  FLAME_CHECK(count < 9.0e18, FLAME_ERROR_INVALID_ARGUMENT, "arange: too many elements");
  int64_t n = static_cast<int64_t>(count);
  Tensor t = make_tensor(ctx, {n}, dtype);
  if (n == 0) return t;
  CUdeviceptr p = t->data();
  void* args[] = {&p, &n, &start, &step};
  ctx.launch(ctx.function(make_key(kArange, dtype)), u::grid(ctx, n), 256, args);
  return t;
}

Tensor ops::linspace(Context& ctx, double start, double end, int64_t steps, DType dtype) {
  FLAME_CHECK(steps >= 0, FLAME_ERROR_INVALID_ARGUMENT, "linspace: steps must be >= 0, got ", steps);
  Tensor t = make_tensor(ctx, {steps}, dtype);
  if (steps == 0) return t;
  if (steps == 1) end = start;  // one value: start, as PyTorch
  double step = steps > 1 ? (end - start) / static_cast<double>(steps - 1) : 0.0;
  CUdeviceptr p = t->data();
  void* args[] = {&p, &steps, &start, &end, &step};
  ctx.launch(ctx.function(make_key(kLinspace, dtype)), u::grid(ctx, steps), 256, args);
  return t;
}

Tensor ops::eye(Context& ctx, int64_t n, int64_t m, DType dtype) {
  FLAME_CHECK(n >= 0 && m >= 0, FLAME_ERROR_INVALID_ARGUMENT, "eye: sizes must be >= 0");
  Tensor t = zeros(ctx, {n, m}, dtype);
  int64_t k = std::min(n, m);
  if (k > 0) fill_(make_view(t, {k}, {m + 1}, 0), 1.0);  // the diagonal is a strided view
  return t;
}

static Tensor random_tensor(Context& ctx, const Shape& shape, DType dtype, const char* op,
                            const KernelTemplate& kernel) {
  FLAME_CHECK(is_floating(dtype), FLAME_ERROR_DTYPE_MISMATCH, op, ": random tensors must be floating, got ",
              dtype_name(dtype));
  Tensor t = make_tensor(ctx, shape, dtype);
  int64_t n = t->numel();
  if (n == 0) return t;
  int64_t per_call = dtype == FLAME_DTYPE_F64 ? 2 : 4;
  int64_t calls = (n + per_call - 1) / per_call;
  uint64_t seed = ctx.rng_seed, offset = ctx.take_rng(static_cast<uint64_t>(calls));
  CUdeviceptr p = t->data();
  void* args[] = {&p, &n, &seed, &offset};
  ctx.launch(ctx.function(make_key(kernel, dtype)), u::grid(ctx, calls), 256, args);
  return t;
}

Tensor ops::rand(Context& ctx, const Shape& shape, DType dtype) {
  return random_tensor(ctx, shape, dtype, "rand_uniform", kRandUniform);
}
Tensor ops::randn(Context& ctx, const Shape& shape, DType dtype) {
  return random_tensor(ctx, shape, dtype, "rand_normal", kRandNormal);
}

// During a graph capture the result is a constant of the graph: set-up memory written once, at
// capture time, on the side stream (runtime/capture.h); internal index tables rely on this.
Tensor ops::from_host(Context& ctx, const void* data, size_t nbytes, const Shape& shape, DType dtype) {
  Tensor t;
  {
    SetupScope setup(ctx);
    t = make_tensor(ctx, shape, dtype);
  }
  const size_t need = checked_bytes(t->numel(), t->elem_size(), "from_host");
  FLAME_CHECK(nbytes == need, FLAME_ERROR_INVALID_ARGUMENT, "nbytes is ", nbytes, " but shape ", shape_str(shape), " of ",
              dtype_name(dtype), " needs ", need);
  FLAME_CHECK(data || need == 0, FLAME_ERROR_INVALID_ARGUMENT, "data is NULL");
  // From pageable memory the copy is staged before the call returns, so `data` may be reused at once.
  RelaxedCaptureMode relaxed(ctx);
  if (need) ctx.check(ctx.drv.cuMemcpyHtoDAsync(t->data(), data, need, ctx.init_stream()), "cuMemcpyHtoDAsync");
  return t;
}

void ops::to_host(const Tensor& t0, void* data, size_t nbytes) {
  t0->ctx().forbid_in_capture("a copy to the host");
  // A broadcast view may hold more elements than 2^63 - 1 bytes: refused here, not wrapped around.
  const size_t need = checked_bytes(t0->numel(), t0->elem_size(), "to_host");
  FLAME_CHECK(nbytes == need, FLAME_ERROR_INVALID_ARGUMENT, "nbytes is ", nbytes, " but the tensor holds ", need, " bytes");
  FLAME_CHECK(data || need == 0, FLAME_ERROR_INVALID_ARGUMENT, "data is NULL");
  Context& ctx = t0->ctx();
  Tensor t = t0;
  if (!t->contiguous()) {
    t = make_tensor(ctx, t0->shape, t0->dtype);
    copy_into(t, t0);
  }
  if (need) ctx.check(ctx.drv.cuMemcpyDtoHAsync(data, t->data(), need, ctx.stream), "cuMemcpyDtoHAsync");
  ctx.synchronize();
}

double ops::item(const Tensor& t) {
  FLAME_CHECK(t->numel() == 1, FLAME_ERROR_INVALID_ARGUMENT, "item: the tensor has ", t->numel(),
              " elements, not 1");
  unsigned char buf[8];
  to_host(t, buf, t->elem_size());
  return load_as_double(buf, t->dtype);
}

}  // namespace flame

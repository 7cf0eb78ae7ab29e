// Dropout from the context's Philox generator (kernel: cuda/dropout.cuh). A training call reserves
// ceil(numel / 4) counters of the context's stream (as flame_rand does) and records one Dropout node
// holding (seed, offset, p): the rule applies the same kernel with the same (seed, offset) to the
// gradient, which regenerates the forward's mask, so no mask is kept (not even as bits) and the
// backward is itself a Dropout node (differentiable again). Elements are numbered in row-major order
// of the logical shape: a non-contiguous input is copied first, so its mask is the one its
// contiguous copy would get.
#include <cmath>
#include "tensor/autograd_graph.h"
#include "core/error.h"
#include "ops/nn_rows.h"
#include "ops/nnops.h"
#include "ops/ops.h"

namespace flame {

namespace {

constexpr KernelTemplate kDropout{"dropout.cuh", "flame::dropout_kernel", {TArg::Dtype, TArg::Bool}};  // <T, vectorised>
KernelKey dropout_key(DType t, bool vec) { return make_key(kDropout, t, vec); }

}  // namespace

Tensor ops::dropout_apply(const Tensor& x0, uint64_t seed, uint64_t offset, double p) {
  Tensor x = contiguous(x0);
  Context& ctx = x->ctx();
  Tensor out = make_tensor(ctx, x->shape, x->dtype);
  int64_t n = x->numel();
  if (n > 0) {
    CUdeviceptr pi = x->data(), po = out->data();
    const size_t vbytes = 4 * x->elem_size();
    const bool vec = pi % vbytes == 0 && po % vbytes == 0;
    float pf = static_cast<float>(p);
    double scale = 1.0 / (1.0 - p);
    void* args[] = {&pi, &po, &n, &seed, &offset, &pf, &scale};
    launch_flat(ctx, ctx.function(dropout_key(x->dtype, vec)), (n + 3) / 4, args);
  }
  if (auto node = record(OpId::Dropout, {x}, {out})) {
    node->attributes = ops::DropoutAttrs{seed, offset, p};
  }
  return out;
}

Tensor ops::dropout(const Tensor& x, double p, bool training) {
  FLAME_CHECK(is_floating(x->dtype), FLAME_ERROR_DTYPE_MISMATCH, "dropout: the input must be floating, got ", dtype_name(x->dtype));
  FLAME_CHECK(p >= 0.0 && p <= 1.0, FLAME_ERROR_INVALID_ARGUMENT, "dropout: p must be in [0, 1], got ", p);
  if (!training || p == 0.0) return x;
  if (p == 1.0) return mul_scalar(x, 0.0);  // x * 0, as PyTorch (NaN stays NaN); no random numbers drawn
  Context& ctx = x->ctx();
  const uint64_t seed = ctx.rng_seed, offset = ctx.take_rng(static_cast<uint64_t>((x->numel() + 3) / 4));
  return dropout_apply(x, seed, offset, p);
}

std::vector<std::string> ops::dropout_instantiations() {
  std::vector<std::string> v;
  for (DType t : {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_F64})
    for (bool vec : {false, true}) v.push_back(kernel_name(dropout_key(t, vec)));
  return v;
}

}  // namespace flame

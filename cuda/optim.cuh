// Fused multi-tensor optimizer steps: one launch updates every parameter of one dtype in a group.
// The host uploads a table of tensors (parameter, gradient, state slots, optional f32 master copy)
// and a table of chunks (one block each), so that one kernel covers a whole parameter list. State
// and arithmetic are in the compute type (f32 for f16/bf16/f32, f64 for f64); bf16 parameters kept
// through a master copy may be written with stochastic rounding (Philox bits below the bf16 mantissa).
// The step count and learning rates are read from a device record that optim_tick advances, so that
// a step captured in a CUDA graph does on every replay what the next eager step would do.
#pragma once
#include "common.cuh"
#include "random.cuh"

namespace flame {

// Must match src/optim/optimizer.cpp.
struct OptimTensor {
  u64 param, grad, m, v, vmax, master;
  i64 numel, rng_base, first;  // first: the step that created the state (SGD's buffer starts as its gradient)
};
struct OptimChunk {
  i64 tensor, start;
};
struct OptimHyper {
  double beta1, beta2, eps, weight_decay, momentum, dampening;
  u64 record;  // [i64 step, f64 lr of group 0, 1, ...]
  i64 group, kind, flags, seed, offset;
};

// One step more on the device (one thread), launched before the step's updates.
__global__ void optim_tick(i64* record) { record[0] += 1; }

enum : int { kSgd = 0, kAdam = 1, kAdamW = 2, kLion = 3 };
enum : int { kNesterov = 1, kAmsgrad = 2, kMaximize = 4, kStochastic = 16, kHasMomentum = 32 };

template <class P> __device__ __forceinline__ P round_param(compute_t<P> x, u64 seed, u64 counter, bool stochastic) {
  return cast<P>(x);
}
// Stochastic rounding to bf16: add 16 random bits below the kept mantissa, then truncate.
template <> __device__ __forceinline__ bf16_t round_param<bf16_t>(float x, u64 seed, u64 counter, bool stochastic) {
  unsigned u = __float_as_uint(x);
  if (!stochastic || (u & 0x7f800000u) == 0x7f800000u) return to_bf16(x);  // nearest; inf/NaN unchanged
  u += philox(seed, counter).x & 0xffffu;
  bf16_t h;
  h.x = static_cast<unsigned short>(u >> 16);
  return h;
}

template <class P>
__global__ void optim_step(const OptimTensor* tensors, const OptimChunk* chunks, i64 chunk, OptimHyper h) {
  using C = compute_t<P>;
  const OptimChunk ck = chunks[blockIdx.x];
  const OptimTensor t = tensors[ck.tensor];
  const i64 end = ck.start + chunk < t.numel ? ck.start + chunk : t.numel;
  P* param = reinterpret_cast<P*>(t.param);
  const P* grad = reinterpret_cast<const P*>(t.grad);
  C* m = reinterpret_cast<C*>(t.m);
  C* v = reinterpret_cast<C*>(t.v);
  C* vmax = reinterpret_cast<C*>(t.vmax);
  C* master = reinterpret_cast<C*>(t.master);
  const i64 step = reinterpret_cast<const i64*>(h.record)[0];
  const double lr_d = reinterpret_cast<const double*>(h.record)[1 + h.group];
  // Bias corrections in f64, as torch computes them on the host.
  const double bc1 = 1.0 - pow(h.beta1, static_cast<double>(step)), bc2 = 1.0 - pow(h.beta2, static_cast<double>(step));
  const bool first = t.first == step;
  const C lr = C(lr_d), b1 = C(h.beta1), b2 = C(h.beta2), eps = C(h.eps), wd = C(h.weight_decay);
  const int kind = static_cast<int>(h.kind), flags = static_cast<int>(h.flags);
  for (i64 i = ck.start + threadIdx.x; i < end; i += blockDim.x) {
    C w = master ? master[i] : to_compute(param[i]);
    C g = to_compute(grad[i]);
    if (flags & kMaximize) g = -g;
    if (kind == kSgd) {  // torch.optim.SGD
      if (wd != C(0)) g += wd * w;
      if (flags & kHasMomentum) {
        C buf = first ? g : C(h.momentum) * m[i] + (C(1) - C(h.dampening)) * g;
        m[i] = buf;
        g = (flags & kNesterov) ? g + C(h.momentum) * buf : buf;
      }
      w -= lr * g;
    } else if (kind == kAdam || kind == kAdamW) {  // torch.optim.Adam / AdamW
      if (kind == kAdam && wd != C(0)) g += wd * w;
      if (kind == kAdamW) w *= C(1) - lr * wd;
      C mi = b1 * m[i] + (C(1) - b1) * g;
      C vi = b2 * v[i] + (C(1) - b2) * g * g;
      m[i] = mi;
      v[i] = vi;
      if (flags & kAmsgrad) {
        vi = vi > vmax[i] ? vi : vmax[i];
        vmax[i] = vi;
      }
      C denom = m_sqrt(vi) / m_sqrt(C(bc2)) + eps;
      w -= (lr / C(bc1)) * mi / denom;
    } else {  // Lion (Chen et al. 2023): sign of an interpolated momentum
      C c = b1 * m[i] + (C(1) - b1) * g;
      w *= C(1) - lr * wd;
      w -= lr * C((c > C(0)) - (c < C(0)));
      m[i] = b2 * m[i] + (C(1) - b2) * g;
    }
    if (master) master[i] = w;
    param[i] = round_param<P>(w, static_cast<u64>(h.seed), static_cast<u64>(h.offset + t.rng_base + i),
                              (flags & kStochastic) != 0);
  }
}

}  // namespace flame

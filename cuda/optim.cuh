// Fused multi-tensor optimizer steps: one launch updates every parameter of one dtype in a group.
// The host uploads a table of tensors (parameter, gradient, state slots, optional f32 master copy)
// and a table of chunks (one block each), so that one kernel covers a whole parameter list. State
// and arithmetic are in the compute type (f32 for f16/bf16/f32, f64 for f64); bf16 parameters kept
// through a master copy may be written with stochastic rounding (Philox bits below the bf16 mantissa).
// The step count and learning rates are read from a device record that optim_tick advances, so that
// a step captured in a CUDA graph does on every replay what the next eager step would do.
// optim_step_8bit keeps the moments as blockwise 8-bit codes (bitsandbytes' 8-bit optimizers): per
// block of 256 elements one f32 absmax per moment; each moment is dequantised (code value x absmax),
// updated in f32 with the same formula as optim_step, and quantised again to the nearest code of
// the block's new absmax (the code tables come from the host: src/optim/optimizer.cpp).
#pragma once
#include "common.cuh"
#include "random.cuh"

namespace flame {

// Must match src/optim/optimizer.cpp.
struct OptimTensor {
  u64 param, grad, m, v, vmax, master;
  i64 numel, rng_base, first;  // first: the step that created the state (SGD's buffer starts as its gradient)
  u64 m_absmax, v_absmax;      // optim_step_8bit: f32 per block of kQuantBlock elements
};
struct OptimChunk {
  i64 tensor, start;
};
struct OptimHyper {
  double beta1, beta2, eps, weight_decay, momentum, dampening;
  u64 record;  // [i64 step, f64 lr of group 0, 1, ...]
  i64 group, kind, flags, seed, offset;
  u64 codes;  // optim_step_8bit: f32 [2, 256], the signed code table then the unsigned one, ascending
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

// The per-step constants of one launch, in the compute type.
template <class C> struct OptimScalars {
  C lr, b1, b2, eps, wd, momentum, dampening, bc1, bc2;
  int kind, flags;
  bool first;  // this step created the state (SGD's buffer starts as the gradient)
};

// One element's update on registers: w (weight, from the master copy when there is one), g
// (gradient), and the state slots the kind uses (m, v, vmax); the caller loads and stores them.
template <class C>
__device__ __forceinline__ void update_one(const OptimScalars<C>& s, C& w, C g, C& m, C& v, C& vmax) {
  if (s.flags & kMaximize) g = -g;
  if (s.kind == kSgd) {  // torch.optim.SGD
    if (s.wd != C(0)) g += s.wd * w;
    if (s.flags & kHasMomentum) {
      m = s.first ? g : s.momentum * m + (C(1) - s.dampening) * g;
      g = (s.flags & kNesterov) ? g + s.momentum * m : m;
    }
    w -= s.lr * g;
  } else if (s.kind == kAdam || s.kind == kAdamW) {  // torch.optim.Adam / AdamW
    if (s.kind == kAdam && s.wd != C(0)) g += s.wd * w;
    if (s.kind == kAdamW) w *= C(1) - s.lr * s.wd;
    m = s.b1 * m + (C(1) - s.b1) * g;
    v = s.b2 * v + (C(1) - s.b2) * g * g;
    C vi = v;
    if (s.flags & kAmsgrad) {
      vi = vi > vmax ? vi : vmax;
      vmax = vi;
    }
    C denom = m_sqrt(vi) / m_sqrt(s.bc2) + s.eps;
    w -= (s.lr / s.bc1) * m / denom;
  } else {  // Lion (Chen et al. 2023): sign of an interpolated momentum
    C c = s.b1 * m + (C(1) - s.b1) * g;
    w *= C(1) - s.lr * s.wd;
    w -= s.lr * C((c > C(0)) - (c < C(0)));
    m = s.b2 * m + (C(1) - s.b2) * g;
  }
}

// Four consecutive elements in one load or store (16 bytes for f32, 8 for f16/bf16).
template <class T> struct alignas(4 * sizeof(T)) Pack4 { T x[4]; };
template <class T> __device__ __forceinline__ bool aligned4(const void* p) {
  return p == nullptr || (reinterpret_cast<u64>(p) % (4 * sizeof(T))) == 0;
}
// Through a Pack4 value (registers), never by casting the register arrays themselves.
template <class T> __device__ __forceinline__ void load4(const T* p, T (&r)[4]) {
  const Pack4<T> a = *reinterpret_cast<const Pack4<T>*>(p);
#pragma unroll
  for (int k = 0; k < 4; ++k) r[k] = a.x[k];
}
template <class T> __device__ __forceinline__ void store4(T* p, const T (&r)[4]) {
  Pack4<T> a;
#pragma unroll
  for (int k = 0; k < 4; ++k) a.x[k] = r[k];
  *reinterpret_cast<Pack4<T>*>(p) = a;
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
  // Bias corrections in f64, as torch computes them on the host; once per block, not per thread.
  __shared__ double bias_corr[2];
  if (threadIdx.x == 0) {
    bias_corr[0] = 1.0 - pow(h.beta1, static_cast<double>(step));
    bias_corr[1] = 1.0 - pow(h.beta2, static_cast<double>(step));
  }
  __syncthreads();
  const OptimScalars<C> s{C(lr_d), C(h.beta1), C(h.beta2), C(h.eps), C(h.weight_decay), C(h.momentum),
                          C(h.dampening), C(bias_corr[0]), C(bias_corr[1]), static_cast<int>(h.kind),
                          static_cast<int>(h.flags), t.first == step};
  const bool stochastic = (s.flags & kStochastic) != 0;
  const u64 seed = static_cast<u64>(h.seed), rng0 = static_cast<u64>(h.offset + t.rng_base);
  // Memory-bound: 4 consecutive elements per thread and iteration, each array read with one vector
  // load (chunk starts are multiples of 4, so aligned base pointers keep every pack aligned).
  i64 vec_end = ck.start;
  if (aligned4<P>(param) && aligned4<P>(grad) && aligned4<C>(m) && aligned4<C>(v) && aligned4<C>(vmax) &&
      aligned4<C>(master)) {
    vec_end = ck.start + ((end - ck.start) & ~i64(3));
    for (i64 i = ck.start + 4 * i64(threadIdx.x); i < vec_end; i += 4 * i64(blockDim.x)) {
      C w[4], g[4], mv[4] = {}, vv[4] = {}, vx[4] = {};
      if (master) {
        load4(master + i, w);
      } else {
        const Pack4<P> a = *reinterpret_cast<const Pack4<P>*>(param + i);
#pragma unroll
        for (int k = 0; k < 4; ++k) w[k] = to_compute(a.x[k]);
      }
      const Pack4<P> ga = *reinterpret_cast<const Pack4<P>*>(grad + i);
#pragma unroll
      for (int k = 0; k < 4; ++k) g[k] = to_compute(ga.x[k]);
      if (m) load4(m + i, mv);
      if (v) load4(v + i, vv);
      if (vmax) load4(vmax + i, vx);
#pragma unroll
      for (int k = 0; k < 4; ++k) update_one(s, w[k], g[k], mv[k], vv[k], vx[k]);
      if (m) store4(m + i, mv);
      if (v) store4(v + i, vv);
      if (vmax) store4(vmax + i, vx);
      if (master) store4(master + i, w);
      Pack4<P> out;
#pragma unroll
      for (int k = 0; k < 4; ++k) out.x[k] = round_param<P>(w[k], seed, rng0 + static_cast<u64>(i + k), stochastic);
      *reinterpret_cast<Pack4<P>*>(param + i) = out;
    }
  }
  for (i64 i = vec_end + threadIdx.x; i < end; i += blockDim.x) {  // misaligned tensors and the tail
    C w = master ? master[i] : to_compute(param[i]);
    C mv = m ? m[i] : C(0), vv = v ? v[i] : C(0), vx = vmax ? vmax[i] : C(0);
    update_one(s, w, to_compute(grad[i]), mv, vv, vx);
    if (m) m[i] = mv;
    if (v) v[i] = vv;
    if (vmax) vmax[i] = vx;
    if (master) master[i] = w;
    param[i] = round_param<P>(w, seed, rng0 + static_cast<u64>(i), stochastic);
  }
}

// ---- blockwise 8-bit moments ----
constexpr int kQuantBlock = 256;  // elements per absmax; also the block size of optim_step_8bit

// The index of the code nearest to x in the ascending table (ties to the lower code); x is clamped
// to the table's range first.
__device__ __forceinline__ unsigned char nearest_code(const float* code, float x) {
  x = fminf(fmaxf(x, code[0]), code[255]);
  int lo = 0, hi = 255;
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (code[mid] <= x) lo = mid;
    else hi = mid;
  }
  return static_cast<unsigned char>(x - code[lo] <= code[hi] - x ? lo : hi);
}

// The largest of one value per thread over the block (kQuantBlock threads); every thread gets it.
__device__ __forceinline__ float block_max(float x, float* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = x;
  __syncthreads();
  float r = scratch[0];
#pragma unroll
  for (int w = 1; w < kQuantBlock / 32; ++w) r = fmaxf(r, scratch[w]);
  return r;
}

// Adam / AdamW / Lion with 8-bit moments (m: signed codes, v: unsigned codes). Chunks start at
// multiples of kQuantBlock; one thread per element of each quantisation block of the chunk.
template <class P>
__global__ void __launch_bounds__(kQuantBlock) optim_step_8bit(const OptimTensor* tensors, const OptimChunk* chunks,
                                                               i64 chunk, OptimHyper h) {
  const OptimChunk ck = chunks[blockIdx.x];
  const OptimTensor t = tensors[ck.tensor];
  const i64 end = ck.start + chunk < t.numel ? ck.start + chunk : t.numel;
  P* param = reinterpret_cast<P*>(t.param);
  const P* grad = reinterpret_cast<const P*>(t.grad);
  unsigned char* m = reinterpret_cast<unsigned char*>(t.m);
  unsigned char* v = reinterpret_cast<unsigned char*>(t.v);
  float* m_absmax = reinterpret_cast<float*>(t.m_absmax);
  float* v_absmax = reinterpret_cast<float*>(t.v_absmax);
  float* master = reinterpret_cast<float*>(t.master);
  __shared__ float signed_code[256], unsigned_code[256], scratch[2][kQuantBlock / 32];
  __shared__ double bias_corr[2];
  const float* codes = reinterpret_cast<const float*>(h.codes);
  signed_code[threadIdx.x] = codes[threadIdx.x];
  unsigned_code[threadIdx.x] = codes[256 + threadIdx.x];
  const i64 step = reinterpret_cast<const i64*>(h.record)[0];
  const double lr_d = reinterpret_cast<const double*>(h.record)[1 + h.group];
  if (threadIdx.x == 0) {
    bias_corr[0] = 1.0 - pow(h.beta1, static_cast<double>(step));
    bias_corr[1] = 1.0 - pow(h.beta2, static_cast<double>(step));
  }
  __syncthreads();
  const OptimScalars<float> s{float(lr_d), float(h.beta1), float(h.beta2), float(h.eps), float(h.weight_decay), 0.0f,
                              0.0f, float(bias_corr[0]), float(bias_corr[1]), static_cast<int>(h.kind),
                              static_cast<int>(h.flags), t.first == step};
  const bool stochastic = (s.flags & kStochastic) != 0;
  const u64 seed = static_cast<u64>(h.seed), rng0 = static_cast<u64>(h.offset + t.rng_base);
  for (i64 b = ck.start; b < end; b += kQuantBlock) {
    const i64 i = b + threadIdx.x, block = b / kQuantBlock;
    const bool live = i < end;
    float w = 0.0f, mv = 0.0f, vv = 0.0f, vx = 0.0f;
    if (live) {
      w = master ? master[i] : to_compute(param[i]);
      mv = signed_code[m[i]] * m_absmax[block];
      if (v) vv = unsigned_code[v[i]] * v_absmax[block];
      update_one(s, w, to_compute(grad[i]), mv, vv, vx);
    }
    // Every thread read the old absmax before block_max's barrier; thread 0 writes the new one after.
    const float am = block_max(live ? fabsf(mv) : 0.0f, scratch[0]);
    const float av = v ? block_max(live ? vv : 0.0f, scratch[1]) : 0.0f;
    if (live) {
      m[i] = nearest_code(signed_code, am > 0.0f ? mv / am : 0.0f);
      if (v) v[i] = nearest_code(unsigned_code, av > 0.0f ? vv / av : 0.0f);
      if (master) master[i] = w;
      param[i] = round_param<P>(w, seed, rng0 + static_cast<u64>(i), stochastic);
    }
    if (threadIdx.x == 0) {
      m_absmax[block] = am;
      if (v) v_absmax[block] = av;
    }
    __syncthreads();  // the scratch is reused by the next block
  }
}

}  // namespace flame

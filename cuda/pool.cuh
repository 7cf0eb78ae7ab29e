// 2-D pooling over [N, C, H, W] logical tensors of any strides (host code: src/ops/pooling.cpp).
//  - max_pool2d_kernel: one thread per output element scans its (dilated) window in row-major order
//    and keeps the first maximum; a NaN always wins and a later NaN replaces an earlier one (PyTorch's
//    `val > max || isnan(val)`). It writes the value and the flat index h * W + w of the winner in the
//    (n, c) plane (-1 for a window with no element inside the input), which the backward scatters to.
//  - avg_pool2d_kernel: the window sum over its divisor (count_include_pad / valid count / override),
//    or, adaptive, over windows [floor(o * H / OH), ceil((o + 1) * H / OH)); an empty window gives 0.
//  - avg_pool2d_backward_kernel: the adjoint, gather-style (deterministic): each input element sums
//    g / divisor over the output windows that contain it, found from the window arithmetic.
// Threads walk the tensor they write in its memory order: w fastest (NCHW), or c fastest when that
// tensor is channels-last (cl), so both layouts are read and written coalesced.
#pragma once
#include "common.cuh"

namespace flame {

struct PoolGeom {  // mirrors src/ops/pooling.cpp
  i64 N, C, H, W, OH, OW;
  i64 kh, kw, sh, sw, ph, pw, dh, dw;
  i64 xs[4];  // strides of the input-shaped tensor (n, c, h, w)
  i64 ys[4];  // strides of the output-shaped tensor (n, c, oh, ow)
  int cl;     // the written tensor is walked with c fastest
  int count_include_pad;
  i64 divisor;  // > 0: divisor_override
  int adaptive;
};


template <class C> __device__ __forceinline__ C neg_infinity();
template <> __device__ __forceinline__ float neg_infinity<float>() { return -__int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double neg_infinity<double>() { return -__longlong_as_double(0x7ff0000000000000ll); }

template <class T>
__global__ void max_pool2d_kernel(const T* __restrict__ x, T* __restrict__ y, i64* __restrict__ idx, i64 total, PoolGeom g) {
  typedef compute_t<T> C;
  for (i64 e = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += static_cast<i64>(gridDim.x) * blockDim.x) {
    i64 n, c, oh, ow;
    spatial_coords(e, g.C, g.OH, g.OW, g.cl, &n, &c, &oh, &ow);
    const T* plane = x + n * g.xs[0] + c * g.xs[1];
    const i64 h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
    i64 best = -1;
    C m = neg_infinity<C>();
    T bv = cast<T>(m);
    for (i64 i = 0; i < g.kh; ++i) {
      const i64 h = h0 + i * g.dh;
      if (h < 0 || h >= g.H) continue;
      for (i64 j = 0; j < g.kw; ++j) {
        const i64 w = w0 + j * g.dw;
        if (w < 0 || w >= g.W) continue;
        const T v = plane[h * g.xs[2] + w * g.xs[3]];
        const C cv = to_compute(v);
        if (best < 0 || cv > m || is_nan(cv)) {
          best = h * g.W + w;
          m = cv;
          bv = v;
        }
      }
    }
    const i64 o = n * g.ys[0] + c * g.ys[1] + oh * g.ys[2] + ow * g.ys[3];
    y[o] = bv;
    idx[o] = best;
  }
}

// The averaging window of output (oh, ow) clipped to the input, and its divisor; false when empty.
__device__ __forceinline__ bool avg_window(const PoolGeom& g, i64 oh, i64 ow, i64* hs, i64* he, i64* ws, i64* we, i64* div) {
  if (g.adaptive) {
    *hs = (oh * g.H) / g.OH;
    *he = ((oh + 1) * g.H + g.OH - 1) / g.OH;
    *ws = (ow * g.W) / g.OW;
    *we = ((ow + 1) * g.W + g.OW - 1) / g.OW;
    *div = (*he - *hs) * (*we - *ws);
    return true;
  }
  i64 h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
  i64 h1 = min(h0 + g.kh, g.H + g.ph), w1 = min(w0 + g.kw, g.W + g.pw);
  const i64 padded = (h1 - h0) * (w1 - w0);  // the window with padding, cut at the padded border
  h0 = max(h0, i64(0));
  w0 = max(w0, i64(0));
  h1 = min(h1, g.H);
  w1 = min(w1, g.W);
  *hs = h0;
  *he = h1;
  *ws = w0;
  *we = w1;
  if (h0 >= h1 || w0 >= w1) return false;
  *div = g.divisor > 0 ? g.divisor : (g.count_include_pad ? padded : (h1 - h0) * (w1 - w0));
  return true;
}

template <class T>
__global__ void avg_pool2d_kernel(const T* __restrict__ x, T* __restrict__ y, i64 total, PoolGeom g) {
  typedef compute_t<T> C;
  for (i64 e = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += static_cast<i64>(gridDim.x) * blockDim.x) {
    i64 n, c, oh, ow;
    spatial_coords(e, g.C, g.OH, g.OW, g.cl, &n, &c, &oh, &ow);
    const T* plane = x + n * g.xs[0] + c * g.xs[1];
    i64 hs, he, ws, we, div;
    C r = C(0);
    if (avg_window(g, oh, ow, &hs, &he, &ws, &we, &div)) {
      C s = C(0);
      for (i64 h = hs; h < he; ++h)
        for (i64 w = ws; w < we; ++w) s += to_compute(plane[h * g.xs[2] + w * g.xs[3]]);
      r = s / static_cast<C>(div);
    }
    y[n * g.ys[0] + c * g.ys[1] + oh * g.ys[2] + ow * g.ys[3]] = cast<T>(r);
  }
}

// Candidate output rows (or columns) [*lo, *hi) whose windows may contain input row h.
__device__ __forceinline__ void avg_candidates(i64 h, i64 H, i64 OH, i64 k, i64 s, i64 p, int adaptive, i64* lo, i64* hi) {
  if (adaptive) {
    *lo = (h * OH) / H;
    *hi = min(((h + 1) * OH + H - 1) / H, OH);
  } else {
    *lo = h + p < k ? 0 : (h + p - k) / s + 1;
    *hi = min((h + p) / s + 1, OH);
  }
}

// gx (input-shaped, strides xs, walked in its order) = the adjoint of avg_pool2d applied to gy (strides ys).
template <class T>
__global__ void avg_pool2d_backward_kernel(const T* __restrict__ gy, T* __restrict__ gx, i64 total, PoolGeom g) {
  typedef compute_t<T> C;
  for (i64 e = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += static_cast<i64>(gridDim.x) * blockDim.x) {
    i64 n, c, h, w;
    spatial_coords(e, g.C, g.H, g.W, g.cl, &n, &c, &h, &w);
    const T* plane = gy + n * g.ys[0] + c * g.ys[1];
    i64 ohl, ohh, owl, owh;
    avg_candidates(h, g.H, g.OH, g.kh, g.sh, g.ph, g.adaptive, &ohl, &ohh);
    avg_candidates(w, g.W, g.OW, g.kw, g.sw, g.pw, g.adaptive, &owl, &owh);
    C s = C(0);
    for (i64 oh = ohl; oh < ohh; ++oh)
      for (i64 ow = owl; ow < owh; ++ow) {
        i64 hs, he, ws, we, div;
        if (avg_window(g, oh, ow, &hs, &he, &ws, &we, &div) && h >= hs && h < he && w >= ws && w < we)
          s += to_compute(plane[oh * g.ys[2] + ow * g.ys[3]]) / static_cast<C>(div);
      }
    gx[n * g.xs[0] + c * g.xs[1] + h * g.xs[2] + w * g.xs[3]] = cast<T>(s);
  }
}

}  // namespace flame

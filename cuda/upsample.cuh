// 2-D upsampling of [N, C, H, W] logical tensors of any strides (host code: src/ops/upsample.cpp),
// with PyTorch's CUDA index arithmetic:
//  - nearest: source row min(floor(dst * scale), H - 1) in f32, scale = 1 / scale_factor when one was
//    given, else H / OH (torch's upsample_nearest2d);
//  - bilinear: source coordinate scale * dst (align_corners) or max(scale * (dst + 0.5) - 0.5, 0),
//    scale = (H - 1) / (OH - 1) (align_corners; 0 for OH = 1) or 1 / scale_factor or H / OH, in the
//    compute type (f32, or f64 for f64); rows h0 = trunc(src) and h0 + 1 (h0 at the last row) with
//    weights 1 - l and l, l = src - h0 (torch's upsample_bilinear2d).
// The backward kernel is the exact adjoint, gather-style (deterministic, no atomics): each input
// element sums, over the output rows and columns that read it, the gradient times their weights.
// Those outputs are contiguous ranges because the source index is nondecreasing in dst; the forward's
// own index function finds their ends (nearest: from a closed-form guess; bilinear: a binary
// search), so forward and backward always agree.
// Threads walk the tensor they write in its memory order (c fastest when cl), as in pool.cuh.
// Nearest by exactly 2 in both dims (index scale 0.5, the UNet's upsampling) between dense tensors
// of one layout runs blocks2x2.cuh's vector kernels instead (the general ones ran at 0.17 of copy).
#pragma once
#include "blocks2x2.cuh"

namespace flame {

struct UpGeom {  // mirrors src/ops/upsample.cpp
  i64 N, C, H, W, OH, OW;
  double scale_h, scale_w;  // the caller's scale factors (> 0), or 0: none
  i64 xs[4];                // strides of the input-shaped tensor (n, c, h, w)
  i64 ys[4];                // strides of the output-shaped tensor (n, c, oh, ow)
  int cl;                   // the written tensor is walked with c fastest
  int mode;                 // 0 nearest, 1 bilinear
  int align_corners;
};

// ---- nearest
__device__ __forceinline__ float nearest_scale(i64 in, i64 out, double user) {
  return user > 0 ? static_cast<float>(1.0 / user) : static_cast<float>(in) / static_cast<float>(out);
}
__device__ __forceinline__ i64 nearest_src(i64 dst, float scale, i64 in) {
  return min(static_cast<i64>(floorf(static_cast<float>(dst) * scale)), in - 1);
}
// The first dst in [0, out] whose source is >= v: from the closed-form guess ceil(v / scale), moved
// by the forward's own index function until it is exact (nearest_src is nondecreasing in dst, so
// the answer is unique and forward and backward agree); one or two steps at most in practice.
__device__ __forceinline__ i64 nearest_first(i64 v, i64 out, float scale, i64 in) {
  i64 d = static_cast<i64>(ceilf(static_cast<float>(v) / scale));
  d = d < 0 ? 0 : (d > out ? out : d);
  while (d > 0 && nearest_src(d - 1, scale, in) >= v) --d;
  while (d < out && nearest_src(d, scale, in) < v) ++d;
  return d;
}

// ---- bilinear
template <class A> __device__ __forceinline__ A linear_scale(i64 in, i64 out, int align, double user) {
  if (align) return out > 1 ? static_cast<A>(in - 1) / static_cast<A>(out - 1) : A(0);
  return user > 0 ? static_cast<A>(1.0 / user) : static_cast<A>(in) / static_cast<A>(out);
}
template <class A> __device__ __forceinline__ A linear_src(A scale, i64 dst, int align) {
  if (align) return scale * static_cast<A>(dst);
  const A s = scale * (static_cast<A>(dst) + A(0.5)) - A(0.5);
  return s < A(0) ? A(0) : s;
}
// The lower row of dst and the weight l of the upper one (h0 + p, p = 0 at the last row). h0 is
// clamped to the input (only a scale_factor inconsistent with the output size reaches past it).
template <class A> __device__ __forceinline__ i64 linear_row(A scale, i64 dst, int align, i64 in, A* l, i64* p) {
  const A src = linear_src(scale, dst, align);
  const i64 h0 = min(static_cast<i64>(src), in - 1);
  const A l1 = src - static_cast<A>(h0);
  *l = l1 < A(0) ? A(0) : (l1 > A(1) ? A(1) : l1);
  *p = h0 < in - 1 ? 1 : 0;
  return h0;
}
template <class A> __device__ __forceinline__ i64 linear_first(i64 v, i64 out, A scale, int align, i64 in) {
  i64 lo = 0, hi = out;
  while (lo < hi) {
    const i64 mid = (lo + hi) / 2;
    A l;
    i64 p;
    if (linear_row(scale, mid, align, in, &l, &p) >= v) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

template <class T>
__global__ void upsample2d_kernel(const T* __restrict__ x, T* __restrict__ y, i64 total, UpGeom g) {
  typedef compute_t<T> A;
  // The scales once per thread (the nearest ones divide in f64).
  const float nh = nearest_scale(g.H, g.OH, g.scale_h), nw = nearest_scale(g.W, g.OW, g.scale_w);
  const A sh = linear_scale<A>(g.H, g.OH, g.align_corners, g.scale_h), sw = linear_scale<A>(g.W, g.OW, g.align_corners, g.scale_w);
  for (i64 e = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += static_cast<i64>(gridDim.x) * blockDim.x) {
    i64 n, c, oh, ow;
    spatial_coords(e, g.C, g.OH, g.OW, g.cl, &n, &c, &oh, &ow);
    const T* plane = x + n * g.xs[0] + c * g.xs[1];
    T r;
    if (g.mode == 0) {
      const i64 ih = nearest_src(oh, nh, g.H);
      const i64 iw = nearest_src(ow, nw, g.W);
      r = plane[ih * g.xs[2] + iw * g.xs[3]];
    } else {
      A lh, lw;
      i64 ph, pw;
      const i64 h0 = linear_row(sh, oh, g.align_corners, g.H, &lh, &ph);
      const i64 w0 = linear_row(sw, ow, g.align_corners, g.W, &lw, &pw);
      const T* r0 = plane + h0 * g.xs[2];
      const T* r1 = plane + (h0 + ph) * g.xs[2];
      const A v00 = to_compute(r0[w0 * g.xs[3]]), v01 = to_compute(r0[(w0 + pw) * g.xs[3]]);
      const A v10 = to_compute(r1[w0 * g.xs[3]]), v11 = to_compute(r1[(w0 + pw) * g.xs[3]]);
      const A kh = A(1) - lh, kw = A(1) - lw;
      r = cast<T>(kh * (kw * v00 + lw * v01) + lh * (kw * v10 + lw * v11));
    }
    y[n * g.ys[0] + c * g.ys[1] + oh * g.ys[2] + ow * g.ys[3]] = r;
  }
}

// Weight of input row h in output row dst (bilinear).
template <class A> __device__ __forceinline__ A linear_weight(A scale, i64 dst, int align, i64 in, i64 h) {
  A l;
  i64 p;
  const i64 h0 = linear_row(scale, dst, align, in, &l, &p);
  return (h0 == h ? A(1) - l : A(0)) + (h0 + p == h ? l : A(0));
}

// gx (input-shaped, strides xs, walked in its order) = the adjoint of upsample2d applied to gy.
template <class T>
__global__ void upsample2d_backward_kernel(const T* __restrict__ gy, T* __restrict__ gx, i64 total, UpGeom g) {
  typedef compute_t<T> A;
  const float fh = nearest_scale(g.H, g.OH, g.scale_h), fw = nearest_scale(g.W, g.OW, g.scale_w);
  for (i64 e = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += static_cast<i64>(gridDim.x) * blockDim.x) {
    i64 n, c, h, w;
    spatial_coords(e, g.C, g.H, g.W, g.cl, &n, &c, &h, &w);
    const T* plane = gy + n * g.ys[0] + c * g.ys[1];
    A s = A(0);
    if (g.mode == 0) {
      const i64 oh0 = nearest_first(h, g.OH, fh, g.H), oh1 = nearest_first(h + 1, g.OH, fh, g.H);
      const i64 ow0 = nearest_first(w, g.OW, fw, g.W), ow1 = nearest_first(w + 1, g.OW, fw, g.W);
      for (i64 oh = oh0; oh < oh1; ++oh)
        for (i64 ow = ow0; ow < ow1; ++ow) s += to_compute(plane[oh * g.ys[2] + ow * g.ys[3]]);
    } else {
      const A fh = linear_scale<A>(g.H, g.OH, g.align_corners, g.scale_h);
      const A fw = linear_scale<A>(g.W, g.OW, g.align_corners, g.scale_w);
      // Output rows whose lower row is h - 1 or h read row h.
      const i64 oh0 = linear_first(h - 1, g.OH, fh, g.align_corners, g.H), oh1 = linear_first(h + 1, g.OH, fh, g.align_corners, g.H);
      const i64 ow0 = linear_first(w - 1, g.OW, fw, g.align_corners, g.W), ow1 = linear_first(w + 1, g.OW, fw, g.align_corners, g.W);
      for (i64 oh = oh0; oh < oh1; ++oh) {
        const A wh = linear_weight(fh, oh, g.align_corners, g.H, h);
        if (wh == A(0)) continue;
        A row = A(0);
        for (i64 ow = ow0; ow < ow1; ++ow)
          row += linear_weight(fw, ow, g.align_corners, g.W, w) * to_compute(plane[oh * g.ys[2] + ow * g.ys[3]]);
        s += wh * row;
      }
    }
    gx[n * g.xs[0] + c * g.xs[1] + h * g.xs[2] + w * g.xs[3]] = cast<T>(s);
  }
}

}  // namespace flame

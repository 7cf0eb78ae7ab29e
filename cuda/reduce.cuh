// Reductions over any set of axes of a strided tensor. The host describes the kept axes
// (out_*) and the reduced axes (red_*) by their sizes and input strides, after merging
// neighbours. reduce_general gives each output one block (or `chunks` blocks writing partials
// that the last of them combines, when few outputs must reduce many elements); reduce_cols gives
// each output one thread lane when outputs are adjacent in memory, so loads stay coalesced;
// reduce_tall reduces the rows of a dense [rows, outputs] block with 16-byte loads.
// Sums of f16/bf16/f32 accumulate in f32, f64 in f64, integers and bool in i64.
#pragma once
#include "common.cuh"

namespace flame {

template <class T> __device__ __forceinline__ T lowest_value();
template <> __device__ __forceinline__ float lowest_value<float>() { return -__int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double lowest_value<double>() { return -__longlong_as_double(0x7ff0000000000000ll); }
template <> __device__ __forceinline__ long long lowest_value<long long>() { return -0x7fffffffffffffffll - 1; }
template <> __device__ __forceinline__ int lowest_value<int>() { return -0x7fffffff - 1; }
template <> __device__ __forceinline__ unsigned char lowest_value<unsigned char>() { return 0; }
template <> __device__ __forceinline__ bool lowest_value<bool>() { return false; }
template <class T> __device__ __forceinline__ T highest_value();
template <> __device__ __forceinline__ float highest_value<float>() { return __int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double highest_value<double>() { return __longlong_as_double(0x7ff0000000000000ll); }
template <> __device__ __forceinline__ long long highest_value<long long>() { return 0x7fffffffffffffffll; }
template <> __device__ __forceinline__ int highest_value<int>() { return 0x7fffffff; }
template <> __device__ __forceinline__ unsigned char highest_value<unsigned char>() { return 255; }
template <> __device__ __forceinline__ bool highest_value<bool>() { return true; }

struct SumOp {
  template <class A> static __device__ __forceinline__ A init() { return A(0); }
  template <class A> static __device__ __forceinline__ A combine(A x, A y) { return x + y; }
};
struct ProdOp {
  template <class A> static __device__ __forceinline__ A init() { return A(1); }
  template <class A> static __device__ __forceinline__ A combine(A x, A y) { return x * y; }
};
struct MaxOp {  // NaN wins, as in PyTorch
  template <class A> static __device__ __forceinline__ A init() { return lowest_value<A>(); }
  template <class A> static __device__ __forceinline__ A combine(A x, A y) { return is_nan(x) ? x : (is_nan(y) ? y : (x > y ? x : y)); }
};
struct MinOp {
  template <class A> static __device__ __forceinline__ A init() { return highest_value<A>(); }
  template <class A> static __device__ __forceinline__ A combine(A x, A y) { return is_nan(x) ? x : (is_nan(y) ? y : (x < y ? x : y)); }
};

struct ReduceLayout {
  int out_ndim;
  i64 out_shape[8];
  i64 out_stride[8];  // input strides of the kept axes
  int red_ndim;
  i64 red_shape[8];
  i64 red_stride[8];  // input strides of the reduced axes
};

__device__ __forceinline__ i64 layout_offset(i64 i, int ndim, const i64* shape, const i64* stride) {
  i64 off = 0;
  for (int d = ndim - 1; d >= 0; --d) {
    i64 idx = i % shape[d];
    i /= shape[d];
    off += idx * stride[d];
  }
  return off;
}

// A dense span of n elements: 16-byte vector loads from the first aligned element, two of them in
// flight per thread (one scalar load at a time reaches only a third of the memory bandwidth). The
// vectors go in tiles of 2 x blockDim; this block takes tiles tile0, tile0 + tile_step, ... (and,
// with tile0 == 0, the unaligned head and the tail), so that blocks sharing a span sweep it together.
template <class Op, class Acc, class T>
__device__ __forceinline__ Acc reduce_dense(const T* p, i64 n, Acc acc, i64 tile0 = 0, i64 tile_step = 1) {
  constexpr int V = 16 / sizeof(T);
  const i64 mis = static_cast<i64>((reinterpret_cast<u64>(p) / sizeof(T)) % V);
  const i64 head = mis ? min(n, static_cast<i64>(V) - mis) : 0;
  const i64 bd = blockDim.x;
  if (tile0 == 0)
    for (i64 i = threadIdx.x; i < head; i += bd) acc = Op::combine(acc, static_cast<Acc>(to_compute(p[i])));
  const Vec<T, V>* pv = reinterpret_cast<const Vec<T, V>*>(p + head);
  const i64 nv = (n - head) / V;
  Acc acc2 = Op::template init<Acc>();
  i64 j = tile0 * 2 * bd + threadIdx.x;
  const i64 step = tile_step * 2 * bd;
  for (; j + bd < nv; j += step) {
    Vec<T, V> x = pv[j], y = pv[j + bd];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      acc = Op::combine(acc, static_cast<Acc>(to_compute(x.v[k])));
      acc2 = Op::combine(acc2, static_cast<Acc>(to_compute(y.v[k])));
    }
  }
  if (j < nv) {
    Vec<T, V> x = pv[j];
#pragma unroll
    for (int k = 0; k < V; ++k) acc = Op::combine(acc, static_cast<Acc>(to_compute(x.v[k])));
  }
  acc = Op::combine(acc, acc2);
  if (tile0 == 0)
    for (i64 i = head + nv * V + threadIdx.x; i < n; i += bd) acc = Op::combine(acc, static_cast<Acc>(to_compute(p[i])));
  return acc;
}

// Split reductions: this block's result `acc` (valid in thread 0) is partial `ch` of the `chunks` of
// an output whose partials are part[0, chunks); the last of those blocks to finish (counted in *done,
// zero before the launch and reset to zero by that block for the next one) combines them in index
// order and writes *out (whichever block is last, the same order: deterministic). Every thread of the
// block calls it; `last` is a shared flag.
template <class Op, class Acc, class R>
__device__ __forceinline__ void finish_split(Acc acc, Acc* part, i64 ch, i64 chunks, R* out, unsigned* done, Acc* smem,
                                             bool& last) {
  if (threadIdx.x == 0) {
    part[ch] = acc;
    __threadfence();  // the partial is visible to every block before the count says it is there
    last = atomicAdd(done, 1u) == static_cast<unsigned>(chunks - 1);
  }
  __syncthreads();
  if (last) {  // uniform over the block
    __threadfence();
    const volatile Acc* vp = part;  // written by other blocks: not from L1
    Acc a = Op::template init<Acc>();
    for (i64 i = threadIdx.x; i < chunks; i += blockDim.x) a = Op::combine(a, static_cast<Acc>(vp[i]));
    a = block_reduce(a, [](Acc x, Acc y) { return Op::combine(x, y); }, smem);
    if (threadIdx.x == 0) {
      *out = cast<R>(a);
      *done = 0;
    }
  }
}

template <class Op, class T, class Acc, class R>
// At most 40 registers (3 blocks of 512 per SM): at 48 only 2 blocks fit and sum(dim=1) of 16384^2 f32
// ran at 80% of the DRAM bandwidth with half the warps (ncu, H200); 0.280 -> 0.266 ms. A bound of 4
// blocks (32 registers) spills and measured 0.351 ms.
// chunks > 1 (few outputs, long reductions): block blk reduces chunk blk % chunks of output
// o = blk / chunks into partial[blk], and the last of them writes out[o] (finish_split, counter
// done[o]): no second launch.
__global__ void __launch_bounds__(512, 3) reduce_general(const T* in, R* out, Acc* partial, unsigned* done, i64 n_out,
                                                         i64 n_red, i64 chunks, i64 chunk_len, ReduceLayout L) {
  __shared__ Acc smem[32];
  __shared__ bool last;
  auto op = [](Acc x, Acc y) { return Op::combine(x, y); };
  for (i64 blk = blockIdx.x; blk < n_out * chunks; blk += gridDim.x) {
    i64 o = blk / chunks, ch = blk % chunks;
    i64 base = layout_offset(o, L.out_ndim, L.out_shape, L.out_stride);
    i64 r1 = min(n_red, (ch + 1) * chunk_len);
    Acc acc = Op::template init<Acc>();
    if (L.red_ndim == 1 && L.red_stride[0] == 1) {
      acc = reduce_dense<Op>(in + base + ch * chunk_len, r1 - ch * chunk_len, acc);
    } else if (L.red_ndim == 1) {
      i64 s = L.red_stride[0];
      for (i64 r = ch * chunk_len + threadIdx.x; r < r1; r += blockDim.x)
        acc = Op::combine(acc, static_cast<Acc>(to_compute(in[base + r * s])));
    } else {
      for (i64 r = ch * chunk_len + threadIdx.x; r < r1; r += blockDim.x)
        acc = Op::combine(acc, static_cast<Acc>(to_compute(in[base + layout_offset(r, L.red_ndim, L.red_shape, L.red_stride)])));
    }
    acc = block_reduce(acc, op, smem);
    if (chunks == 1) {
      if (threadIdx.x == 0) out[blk] = cast<R>(acc);
      continue;
    }
    finish_split<Op>(acc, partial + o * chunks, ch, chunks, out + o, done + o, smem, last);
  }
}

// Dense rows: out[o] = the reduction of in[o * n_red, (o + 1) * n_red), with 32 registers, so 4
// blocks of 512 per SM (reduce_general's layout walk needs 40: 3 blocks).
//  n_out == 1 (sum_all, the mean of a contiguous tensor): every block sweeps the span in tiles spaced
//    by the grid, so the blocks stream through memory together and finish together; the last block
//    combines the per-block partials (finish_split, counter *done).
//  n_out > 1 (sum over the last dim of a contiguous tensor, enough rows to fill the GPU): one block
//    per row at a time.
template <class Op, class T, class Acc, class R>
__global__ void __launch_bounds__(512, 4) reduce_flat(const T* in, R* out, Acc* partial, unsigned* done, i64 n_out, i64 n_red) {
  __shared__ Acc smem[32];
  __shared__ bool last;
  auto op = [](Acc x, Acc y) { return Op::combine(x, y); };
  if (n_out == 1) {
    Acc acc = reduce_dense<Op>(in, n_red, Op::template init<Acc>(), blockIdx.x, gridDim.x);
    acc = block_reduce(acc, op, smem);
    finish_split<Op>(acc, partial, blockIdx.x, gridDim.x, out, done, smem, last);
    return;
  }
  for (i64 o = blockIdx.x; o < n_out; o += gridDim.x) {
    Acc acc = block_reduce(reduce_dense<Op>(in + o * n_red, n_red, Op::template init<Acc>()), op, smem);
    if (threadIdx.x == 0) out[o] = cast<R>(acc);
  }
}

// blockDim = (32, 8): x walks adjacent outputs (input stride 1 along the last kept axis), y splits
// the reduced elements; the 8 partial values of a column are combined through shared memory.
template <class Op, class T, class Acc, class R>
__global__ void reduce_cols(const T* in, R* out, i64 n_out, i64 n_red, ReduceLayout L) {
  __shared__ Acc part[8][33];
  for (i64 o0 = static_cast<i64>(blockIdx.x) * 32; o0 < n_out; o0 += static_cast<i64>(gridDim.x) * 32) {
    i64 o = o0 + threadIdx.x;
    Acc acc = Op::template init<Acc>();
    if (o < n_out) {
      i64 base = layout_offset(o, L.out_ndim, L.out_shape, L.out_stride);
      for (i64 r = threadIdx.y; r < n_red; r += blockDim.y)
        acc = Op::combine(acc, static_cast<Acc>(to_compute(in[base + layout_offset(r, L.red_ndim, L.red_shape, L.red_stride)])));
    }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && o < n_out) {
      for (int y = 1; y < blockDim.y; ++y) acc = Op::combine(acc, part[y][threadIdx.x]);
      out[o] = cast<R>(acc);
    }
    __syncthreads();
  }
}

// Reduces the rows of a dense [n_red, n_out] block: a sum over every axis but the trailing kept ones
// (bias gradients; N, H, W of a channels-last tensor; split-K partials). Each thread owns V adjacent
// columns (one 16-byte load per row, 4 rows in flight); the 256 threads of a block cover rpi = 256 /
// slice rows of a slice of `slice` column vectors (blockIdx.x) per step, over chunk blockIdx.y of
// the rows, and write out[blockIdx.y][columns] (partials that a second launch combines when
// gridDim.y > 1, so the order of the sums is fixed). reduce_general would stride through memory
// with one block per output, reduce_cols make scalar loads with one lane per output.
template <class Op, class T, class Acc, class R>
__global__ void __launch_bounds__(256) reduce_tall(const T* in, R* out, i64 n_out, i64 n_red, i64 chunk_len, int slice) {
  constexpr int V = 16 / sizeof(T);
  __shared__ Acc part[256 * V];
  const int rpi = 256 / slice, c = static_cast<int>(threadIdx.x) % slice, r0 = static_cast<int>(threadIdx.x) / slice;
  const i64 col = (static_cast<i64>(blockIdx.x) * slice + c) * V;
  const bool live = r0 < rpi && col < n_out;
  Acc acc[V];
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] = Op::template init<Acc>();
  if (live) {
    const i64 r_end = min(n_red, (static_cast<i64>(blockIdx.y) + 1) * chunk_len);
    const T* p = in + col;
    i64 r = static_cast<i64>(blockIdx.y) * chunk_len + r0;
    for (; r + 3 * rpi < r_end; r += 4 * rpi) {
      Vec<T, V> x[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) x[u] = *reinterpret_cast<const Vec<T, V>*>(p + (r + u * rpi) * n_out);
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] = Op::combine(acc[k], static_cast<Acc>(to_compute(x[u].v[k])));
    }
    for (; r < r_end; r += rpi) {
      const Vec<T, V> x = *reinterpret_cast<const Vec<T, V>*>(p + r * n_out);
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] = Op::combine(acc[k], static_cast<Acc>(to_compute(x.v[k])));
    }
  }
#pragma unroll
  for (int k = 0; k < V; ++k) part[threadIdx.x * V + k] = acc[k];
  __syncthreads();
  if (live && r0 == 0) {
    for (int j = 1; j < rpi; ++j)
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] = Op::combine(acc[k], part[(j * slice + c) * V + k]);
    R* o = out + static_cast<i64>(blockIdx.y) * n_out + col;
#pragma unroll
    for (int k = 0; k < V; ++k) o[k] = cast<R>(acc[k]);
  }
}

// Index of the first maximum (IsMax) or minimum; NaN counts as the maximum and the minimum alike
// (the first NaN wins), as in PyTorch. in_idx, when not null, supplies the candidates' indices
// (second pass over partials); out_val, when not null, receives the winning values.
template <bool IsMax, class V>
__device__ __forceinline__ bool arg_better(V a, i64 ia, V b, i64 ib) {  // is (a, ia) preferred to (b, ib)?
  bool na = is_nan(a), nb = is_nan(b);
  if (na || nb) return na && (!nb || ia < ib);
  if (a == b) return ia < ib;
  return IsMax ? a > b : a < b;
}

template <bool IsMax, class T>
__global__ void arg_reduce(const T* in, const i64* in_idx, i64* out_idx, compute_t<T>* out_val, i64 n_out, i64 n_red,
                           i64 chunks, i64 chunk_len, ReduceLayout L) {
  typedef compute_t<T> V;
  __shared__ V sv[32];
  __shared__ i64 si[32];
  for (i64 blk = blockIdx.x; blk < n_out * chunks; blk += gridDim.x) {
    i64 o = blk / chunks, ch = blk % chunks;
    i64 base = layout_offset(o, L.out_ndim, L.out_shape, L.out_stride);
    i64 r1 = min(n_red, (ch + 1) * chunk_len);
    V best = V(0);
    i64 bi = -1;
    for (i64 r = ch * chunk_len + threadIdx.x; r < r1; r += blockDim.x) {
      i64 off = base + layout_offset(r, L.red_ndim, L.red_shape, L.red_stride);
      V v = to_compute(in[off]);
      i64 id = in_idx ? in_idx[off] : r;
      if (bi < 0 || arg_better<IsMax>(v, id, best, bi)) { best = v; bi = id; }
    }
    for (int s = 16; s > 0; s >>= 1) {
      V ov = __shfl_down_sync(0xffffffffu, best, s);
      i64 oi = __shfl_down_sync(0xffffffffu, bi, s);
      if (oi >= 0 && (bi < 0 || arg_better<IsMax>(ov, oi, best, bi))) { best = ov; bi = oi; }
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) { sv[warp] = best; si[warp] = bi; }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w)
        if (si[w] >= 0 && (bi < 0 || arg_better<IsMax>(sv[w], si[w], best, bi))) { best = sv[w]; bi = si[w]; }
      out_idx[blk] = bi;
      if (out_val) out_val[blk] = best;
    }
  }
}

}  // namespace flame

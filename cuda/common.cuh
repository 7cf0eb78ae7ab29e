// Shared device definitions for every FLAME kernel. Self-contained (no CUDA headers), so NVRTC
// needs no include path: 16-bit float types with PTX conversions, the 8-bit float storage types
// with integer conversions, the compute-type mapping (f16/bf16/f8 compute in f32), conversions between any two element types
// (convert_element: bit-exact same-type copies, f8 and NaN bits as PyTorch's CPU casts), aligned vectors for
// 16-byte accesses, and the scalar-argument block every functor carries.
#pragma once

namespace flame {

struct half_t { unsigned short x; };
struct bf16_t { unsigned short x; };
// The f8 storage dtypes (FLAME_DTYPE_F8_E4M3 / _E5M2): only the conversion and fill kernels see them
// (kernel_name refuses them elsewhere).
struct f8_e4m3_t { unsigned char x; };
struct f8_e5m2_t { unsigned char x; };
struct None {};  // an absent operand

__device__ __forceinline__ float to_float(half_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.x));
  return f;
}
__device__ __forceinline__ half_t to_half(float f) {
  half_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.x) : "f"(f));
  return h;
}
__device__ __forceinline__ float to_float(bf16_t h) { return __uint_as_float(static_cast<unsigned>(h.x) << 16); }
__device__ __forceinline__ bf16_t to_bf16(float f) {
  bf16_t h;
#if __CUDA_ARCH__ >= 800
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.x) : "f"(f));
#else
  unsigned u = __float_as_uint(f);
  h.x = (u & 0x7fffffffu) > 0x7f800000u ? static_cast<unsigned short>((u >> 16) | 0x40u)
                                        : static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
  return h;
}

// f8 <-> f32, bit for bit as PyTorch's c10::Float8_e4m3fn / Float8_e5m2 conversions and as the
// host's (src/core/dtype.cpp, which these mirror line for line): round to nearest even; e4m3 turns
// magnitudes past 448 (above 464), infinities and NaN into NaN (0x7f, sign kept), e5m2 magnitudes
// past 57344 into infinity and NaN into 0x7f. Integer arithmetic only: no flush-to-zero or
// rounding-mode option of the compilation can change a result. (cvt.rn.satfinite.e4m3x2.f32, sm_89
// on, saturates instead, which PyTorch's .to() does not.)
__device__ __forceinline__ unsigned f8_shift_round_even(unsigned sig, int shift) {
  if (shift >= 32) return 0u;
  const unsigned q = sig >> shift, rem = sig & ((1u << shift) - 1u), half = 1u << (shift - 1);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}
// The unsigned code nearest to the finite magnitude with f32 bits a, without an upper limit.
template <int MBITS, int BIAS>
__device__ __forceinline__ unsigned f8_magnitude_code(unsigned a) {
  const int e = static_cast<int>(a >> 23), e_eff = e ? e : 1;
  const unsigned frac = a & 0x7fffffu;
  if (e_eff - 127 < 1 - BIAS)
    return f8_shift_round_even(frac | (e ? 0x800000u : 0u), (1 - BIAS - MBITS) - (e_eff - 150));
  const unsigned head = (static_cast<unsigned>(e - 127 + BIAS) << MBITS) | (frac >> (23 - MBITS));
  const unsigned rest = frac & ((1u << (23 - MBITS)) - 1u), half = 1u << (22 - MBITS);
  return head + ((rest > half || (rest == half && (head & 1u))) ? 1u : 0u);
}
__device__ __forceinline__ f8_e4m3_t to_f8_e4m3(float f) {
  const unsigned x = __float_as_uint(f), a = x & 0x7fffffffu, sign = (x >> 24) & 0x80u;
  f8_e4m3_t r;
  r.x = static_cast<unsigned char>(sign | (a >= 0x43f00000u ? 0x7fu : f8_magnitude_code<3, 7>(a)));
  return r;
}
__device__ __forceinline__ float to_float(f8_e4m3_t v) {
  const unsigned b = v.x, sign = (b & 0x80u) << 24, e = (b >> 3) & 0xfu, m = b & 7u;
  if ((b & 0x7fu) == 0x7fu) return __uint_as_float(sign | 0x7ff00000u);
  if (e == 0) {
    const float mag = static_cast<float>(m) * 0.001953125f;  // m * 2^-9, exact
    return sign ? -mag : mag;
  }
  return __uint_as_float(sign | ((e + 120u) << 23) | (m << 20));
}
__device__ __forceinline__ f8_e5m2_t to_f8_e5m2(float f) {
  const unsigned x = __float_as_uint(f), a = x & 0x7fffffffu, sign = (x >> 24) & 0x80u;
  f8_e5m2_t r;
  r.x = static_cast<unsigned char>(sign | (a > 0x7f800000u    ? 0x7fu
                                           : a >= 0x47800000u ? 0x7cu
                                                              : f8_magnitude_code<2, 15>(a)));
  return r;
}
__device__ __forceinline__ float to_float(f8_e5m2_t v) {
  const unsigned b = v.x, sign = (b & 0x80u) << 24, e = (b >> 2) & 0x1fu, m = b & 3u;
  // Infinity, or NaN quiet with its sign and payload (c10 decodes e5m2 as the f16 it is the top
  // byte of, and fp16_ieee_to_fp32_value's multiply quiets: 0x7D -> 0x7FE00000).
  if (e == 31) return __uint_as_float(sign | 0x7f800000u | (m << 21) | (m ? 0x400000u : 0u));
  if (e == 0) {
    const float mag = static_cast<float>(m) * 1.52587890625e-05f;  // m * 2^-16, exact
    return sign ? -mag : mag;
  }
  return __uint_as_float(sign | ((e + 112u) << 23) | (m << 21));
}

template <class T> struct compute_type { using type = T; };
template <> struct compute_type<half_t> { using type = float; };
template <> struct compute_type<bf16_t> { using type = float; };
template <> struct compute_type<f8_e4m3_t> { using type = float; };
template <> struct compute_type<f8_e5m2_t> { using type = float; };
template <class T> using compute_t = typename compute_type<T>::type;

template <class T> __device__ __forceinline__ compute_t<T> to_compute(T x) { return x; }
template <> __device__ __forceinline__ float to_compute<half_t>(half_t x) { return to_float(x); }
template <> __device__ __forceinline__ float to_compute<bf16_t>(bf16_t x) { return to_float(x); }
template <> __device__ __forceinline__ float to_compute<f8_e4m3_t>(f8_e4m3_t x) { return to_float(x); }
template <> __device__ __forceinline__ float to_compute<f8_e5m2_t>(f8_e5m2_t x) { return to_float(x); }

template <class A, class B> struct is_same_type { static constexpr bool value = false; };
template <class A> struct is_same_type<A, A> { static constexpr bool value = true; };

// The f32 value an f8 encoding starts from, NaN keeping its sign: PyTorch rounds f64 to f32 first
// (C++'s double to float, which keeps a NaN's sign), and cvt.rn.f32.f64 need not keep it.
template <class F> __device__ __forceinline__ float f8_source_float(F x) {
  if constexpr (is_same_type<F, double>::value) {
    const unsigned long long u = static_cast<unsigned long long>(__double_as_longlong(x));
    if ((u & 0x7fffffffffffffffull) > 0x7ff0000000000000ull)
      return __uint_as_float((static_cast<unsigned>(u >> 32) & 0x80000000u) | 0x7fc00000u);
  }
  return static_cast<float>(x);
}

// cast<To>(x) for x of any arithmetic compute type.
template <class To> struct Caster {
  template <class F> static __device__ __forceinline__ To from(F x) { return static_cast<To>(x); }
};
template <> struct Caster<half_t> {
  template <class F> static __device__ __forceinline__ half_t from(F x) { return to_half(static_cast<float>(x)); }
};
template <> struct Caster<bf16_t> {
  template <class F> static __device__ __forceinline__ bf16_t from(F x) { return to_bf16(static_cast<float>(x)); }
};
template <> struct Caster<f8_e4m3_t> {
  template <class F> static __device__ __forceinline__ f8_e4m3_t from(F x) { return to_f8_e4m3(f8_source_float(x)); }
};
template <> struct Caster<f8_e5m2_t> {
  template <class F> static __device__ __forceinline__ f8_e5m2_t from(F x) { return to_f8_e5m2(f8_source_float(x)); }
};
template <> struct Caster<bool> {
  template <class F> static __device__ __forceinline__ bool from(F x) { return x != F(0); }
};
template <class To, class F> __device__ __forceinline__ To cast(F x) { return Caster<To>::from(x); }

template <class T> struct is_none { static constexpr bool value = false; };
template <> struct is_none<None> { static constexpr bool value = true; };

// N elements of T, aligned so that one access moves N * sizeof(T) bytes.
template <class T, int N> struct alignas(sizeof(T) * N) Vec { T v[N]; };
template <int N> struct Vec<None, N> { None v[N]; };

// The V elements of v in the accumulation type A. bf16 pairs come out of their 32-bit words with one
// shift or mask each (element by element, the high half costs an extract and a shift).
template <class A, class T, int V> __device__ __forceinline__ void unpack(const Vec<T, V>& v, A (&xs)[V]) {
#pragma unroll
  for (int k = 0; k < V; ++k) xs[k] = static_cast<A>(to_compute(v.v[k]));
}
template <int V> __device__ __forceinline__ void unpack(const Vec<bf16_t, V>& v, float (&xs)[V]) {
  if constexpr (V % 2 == 0) {
    const unsigned* w = reinterpret_cast<const unsigned*>(&v);
#pragma unroll
    for (int k = 0; k < V / 2; ++k) {
      xs[2 * k] = __uint_as_float(w[k] << 16);
      xs[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) xs[k] = to_float(v.v[k]);
  }
}

template <class T> struct is_bf16 { static constexpr bool value = false; };
template <> struct is_bf16<bf16_t> { static constexpr bool value = true; };
template <class T> struct is_half { static constexpr bool value = false; };
template <> struct is_half<half_t> { static constexpr bool value = true; };
template <class T> struct is_f8 { static constexpr bool value = false; };
template <> struct is_f8<f8_e4m3_t> { static constexpr bool value = true; };
template <> struct is_f8<f8_e5m2_t> { static constexpr bool value = true; };

// f8 to f16 / bf16, exact (every f8 value is an f16 and a bf16 value) and bit for bit as PyTorch's
// CPU conversion, c10::Half / c10::BFloat16 of the f32 value: NaN becomes 0x7E00 with the f8 sign
// in f16 (fp16_ieee_from_fp32_value) and 0x7FC0 in bf16 (round_to_nearest_even drops the sign).
// Integer arithmetic: cvt.rn.f16.f32 / cvt.rn.bf16.f32 would turn every NaN into 0x7FFF.
__device__ __forceinline__ half_t f8_to_half(f8_e5m2_t v) {  // e5m2 is the top byte of an f16
  half_t h;
  h.x = static_cast<unsigned short>((v.x & 0x7fu) > 0x7cu ? ((v.x & 0x80u) << 8) | 0x7e00u : v.x << 8);
  return h;
}
__device__ __forceinline__ half_t f8_to_half(f8_e4m3_t v) {
  const unsigned a = __float_as_uint(to_float(v)) & 0x7fffffffu, sign = (v.x & 0x80u) << 8;
  half_t h;  // every finite e4m3 value but 0 is a normal f16: rebias the exponent (127 -> 15)
  h.x = static_cast<unsigned short>(sign | ((v.x & 0x7fu) == 0x7fu ? 0x7e00u : a ? (a >> 13) - (112u << 10) : 0u));
  return h;
}
template <class Q> __device__ __forceinline__ bf16_t f8_to_bf16(Q v) {
  const unsigned u = __float_as_uint(to_float(v));  // at most 3 mantissa bits: the low half is 0
  bf16_t h;
  h.x = static_cast<unsigned short>((u & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : u >> 16);
  return h;
}

// f16 to f32 and f32 to f64 as PyTorch's CPU conversions (fp16_ieee_to_fp32_value; C++'s float
// to double): a NaN keeps its sign and payload and comes out quiet. cvt.f32.f16 gives the
// canonical 0x7FFFFFFF for every f16 NaN, which lost the sign of f8 NaN decoded through f16 and of
// f16 NaN encoded to f8 (0x7F where PyTorch gives 0xFF); cvt.f64.f32 is not relied on either.
__device__ __forceinline__ float half_to_float_keep_nan(half_t h) {
  if ((h.x & 0x7fffu) <= 0x7c00u) return to_float(h);
  return __uint_as_float((static_cast<unsigned>(h.x & 0x8000u) << 16) | 0x7fc00000u | ((h.x & 0x3ffu) << 13));
}
__device__ __forceinline__ double float_to_double_keep_nan(float f) {
  const unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) <= 0x7f800000u) return static_cast<double>(f);
  return __longlong_as_double(static_cast<long long>((static_cast<unsigned long long>(u & 0x80000000u) << 32) |
                                                     0x7ff8000000000000ull |
                                                     (static_cast<unsigned long long>(u & 0x7fffffu) << 29)));
}

// One element of type A converted to R: the elementwise Identity (copies and casts). The same
// type moves its bits unchanged (NaN payloads and signs too: a copy, as PyTorch's same-dtype
// copy); f8 to f16 / bf16 as above; f16 sources and f64 results keep a NaN's sign as above (f16
// to f8 goes through that f32, so -NaN gives 0xFF as PyTorch's); anything else through the
// compute type.
template <class R, class A> __device__ __forceinline__ R convert_element(A x) {
  if constexpr (is_same_type<R, A>::value) return x;
  else if constexpr (is_f8<A>::value && is_half<R>::value) return f8_to_half(x);
  else if constexpr (is_f8<A>::value && is_bf16<R>::value) return f8_to_bf16(x);
  else if constexpr (is_half<A>::value) return convert_element<R>(half_to_float_keep_nan(x));
  else if constexpr (is_same_type<R, double>::value && is_same_type<compute_t<A>, float>::value)
    return float_to_double_keep_nan(to_compute(x));
  else return cast<R>(to_compute(x));
}

// Two floats rounded to T (bf16 or f16; sm_80 on) and packed: lo in the lower half (the lower
// column), hi in the upper.
template <class T>
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  unsigned r;
  if constexpr (is_bf16<T>::value) asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  else asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// The V values xs (compute type) as a vector of T. f16 / bf16 pairs (sm_80 on) round by one pack2
// each into their 32-bit word instead of a conversion and a merge per element.
template <class T, int V, class A> __device__ __forceinline__ Vec<T, V> pack(const A (&xs)[V]) {
  Vec<T, V> o;
#if __CUDA_ARCH__ >= 800
  constexpr bool kPairs = (is_bf16<T>::value || is_half<T>::value) && V % 2 == 0;
#else
  constexpr bool kPairs = false;
#endif
  if constexpr (kPairs) {
    unsigned* w = reinterpret_cast<unsigned*>(&o);
#pragma unroll
    for (int k = 0; k < V / 2; ++k) w[k] = pack2<T>(xs[2 * k], xs[2 * k + 1]);
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) o.v[k] = cast<T>(xs[k]);
  }
  return o;
}

constexpr float kLog2e = 1.4426950408889634f;
// 2^x with the hardware approximation (relative error ~2^-22; -inf gives +0; results below 2^-126
// flush to 0: exp2f's subnormal handling costs 3 more instructions).
__device__ __forceinline__ float fast_exp2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// Scalar parameters of a functor (clamp bounds, slopes, the scalar of add_scalar...). Every
// functor derives from Functor so that its kernel parameter has this exact host-visible layout.
struct ScalarArgs { double s0, s1, s2; };
struct Functor { ScalarArgs a; };

typedef long long i64;
typedef unsigned long long u64;

// Math overloads for float and double.
#define FLAME_MATH1(name, f32, f64) \
  __device__ __forceinline__ float name(float x) { return f32(x); } \
  __device__ __forceinline__ double name(double x) { return f64(x); }
FLAME_MATH1(m_exp, expf, exp)
FLAME_MATH1(m_log, logf, log)
FLAME_MATH1(m_log1p, log1pf, log1p)
FLAME_MATH1(m_expm1, expm1f, expm1)
FLAME_MATH1(m_sqrt, sqrtf, sqrt)
FLAME_MATH1(m_rsqrt, rsqrtf, rsqrt)
FLAME_MATH1(m_sin, sinf, sin)
FLAME_MATH1(m_cos, cosf, cos)
FLAME_MATH1(m_tanh, tanhf, tanh)
FLAME_MATH1(m_erf, erff, erf)
FLAME_MATH1(m_floor, floorf, floor)
FLAME_MATH1(m_ceil, ceilf, ceil)
FLAME_MATH1(m_rint, rintf, rint)
#undef FLAME_MATH1
__device__ __forceinline__ float m_pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double m_pow(double x, double y) { return pow(x, y); }

// Integer powers: m_pow has no integer overloads; repeated squaring keeps integers exact.
template <class T> __device__ __forceinline__ T ipow(T b, T e) {
  if (e < T(0)) return b == T(1) ? T(1) : (b == T(-1) ? ((e & T(1)) ? T(-1) : T(1)) : T(0));
  T r = T(1);
  while (e) { if (e & T(1)) r *= b; b *= b; e >>= 1; }
  return r;
}
__device__ __forceinline__ int m_pow(int x, int y) { return ipow(x, y); }
__device__ __forceinline__ long long m_pow(long long x, long long y) { return ipow(x, y); }
__device__ __forceinline__ unsigned char m_pow(unsigned char x, unsigned char y) { return static_cast<unsigned char>(ipow<int>(x, y)); }

// X when B, else Y (std::conditional; NVRTC has no <type_traits>).
template <bool B, class X, class Y> struct pick_type { typedef X type; };
template <class X, class Y> struct pick_type<false, X, Y> { typedef Y type; };

// A functor's double scalar as T: through i64 for integer types, so that negative scalars wrap
// (u8 - 3) instead of converting a negative double to an unsigned type.
template <class T> __device__ __forceinline__ T sc(double v) {
  if constexpr (static_cast<T>(0.5) == static_cast<T>(0)) return static_cast<T>(static_cast<long long>(v));
  else return static_cast<T>(v);
}

template <class T> __device__ __forceinline__ bool is_nan(T x) { return x != x; }

// Block-wide combine through shared memory (blockDim.x a multiple of 32, at most 1024).
template <class T, class F>
__device__ T block_reduce(T v, F combine, T* smem /* 32 entries */) {
  for (int o = 16; o > 0; o >>= 1) v = combine(v, __shfl_down_sync(0xffffffffu, v, o));
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // smem may still be read by a previous call
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  int nw = (blockDim.x + 31) >> 5;
  if (warp == 0) {
    v = lane < nw ? smem[lane] : smem[0];
    for (int o = 16; o > 0; o >>= 1) {
      T other = __shfl_down_sync(0xffffffffu, v, o);
      if (lane + o < nw) v = combine(v, other);
    }
  }
  return v;  // valid in thread 0
}

// Element e of an [N, C, A, B] tensor walked in memory order: b fastest (NCHW), or c fastest when
// cl (channels-last). 32-bit division where every value fits (a 64-bit division costs several
// times more per element: upsample x2 ran at 0.13 of copy with it).
template <class I>
__device__ __forceinline__ void spatial_coords_as(I e, I C, I A, I B, int cl, i64* n, i64* c, i64* a, i64* b) {
  if (cl) {
    *c = e % C; e /= C;
    *b = e % B; e /= B;
    *a = e % A; *n = e / A;
  } else {
    *b = e % B; e /= B;
    *a = e % A; e /= A;
    *c = e % C; *n = e / C;
  }
}
__device__ __forceinline__ void spatial_coords(i64 e, i64 C, i64 A, i64 B, int cl, i64* n, i64* c, i64* a, i64* b) {
  if (((e | C | A | B) >> 32) == 0)
    spatial_coords_as<unsigned>(static_cast<unsigned>(e), static_cast<unsigned>(C), static_cast<unsigned>(A),
                                static_cast<unsigned>(B), cl, n, c, a, b);
  else
    spatial_coords_as<i64>(e, C, A, B, cl, n, c, a, b);
}


// Division by a divisor fixed for the whole kernel: multiply-high, add and shift with a rounded-up
// multiplier (Granlund and Montgomery), exact for dividends below 2^31 (so the add cannot carry out
// of 32 bits). Set up once per thread; a u32 division by a runtime value costs ~20 instructions.
struct FastDivU32 {
  unsigned m, s;
  __device__ __forceinline__ explicit FastDivU32(unsigned d)
      : m(0), s(static_cast<unsigned>(32 - __clz(static_cast<int>(d - 1)))) {  // s = ceil(log2 d); d = 1: 0
    m = static_cast<unsigned>(((1ull << 32) * ((1ull << s) - d)) / d + 1);
  }
  __device__ __forceinline__ unsigned operator()(unsigned n) const { return (__umulhi(n, m) + n) >> s; }
};
// n / d for a non-negative i64 n and a per-launch divisor d >= 1 (group_norm's channel index):
// FastDivU32 where n and d are below 2^31, else a 64-bit division (~70 instructions).
struct DivI64 {
  i64 d;
  FastDivU32 f;
  __device__ __forceinline__ explicit DivI64(i64 div) : d(div), f(div < (i64(1) << 31) ? static_cast<unsigned>(div) : 1u) {}
  __device__ __forceinline__ i64 operator()(i64 n) const {
    return ((n | d) >> 31) == 0 ? static_cast<i64>(f(static_cast<unsigned>(n))) : n / d;
  }
};
// n / d for the index types of the row kernels: FastDivU32 for unsigned, a division for i64.
template <class U> struct RowDivider {
  U d;
  __device__ __forceinline__ explicit RowDivider(U div) : d(div) {}
  __device__ __forceinline__ U operator()(U n) const { return n / d; }
};
template <> struct RowDivider<unsigned> {
  FastDivU32 f;
  __device__ __forceinline__ explicit RowDivider(unsigned div) : f(div) {}
  __device__ __forceinline__ unsigned operator()(unsigned n) const { return f(n); }
};

// The offsets of row r of a dense [rows, cols] output in K operands whose outer axes (shape[0..nd),
// the last fastest) have strides outer[k][d]: off[k] += idx_d outer[k][d]. The outermost index is
// what is left of r (r < rows), so it costs no division; U = unsigned where the row count fits in
// 32 bits (a 64-bit division per vector held broadcast adds at 0.92 of copy).
template <class U, int K, class Layout>
__device__ __forceinline__ void rows_outer_offsets(U r, const Layout& L, i64 (&off)[K]) {
  for (int d = L.nd - 1; d >= 1; --d) {
    const U s = static_cast<U>(L.shape[d]), idx = r % s;
    r /= s;
#pragma unroll
    for (int k = 0; k < K; ++k) off[k] += static_cast<i64>(idx) * L.outer[k][d];
  }
  if (L.nd > 0) {
#pragma unroll
    for (int k = 0; k < K; ++k) off[k] += static_cast<i64>(r) * L.outer[k][0];
  }
}

}  // namespace flame

// The math of every elementwise op: one functor per row of src/tensor/op_list.h, of the same name.
// The elementwise kernels (cuda/elementwise.cuh) apply them, and the fused-expression generator
// (src/ops/fused_expr.cpp) calls the same functors in the code it writes for flame_fused_compile, so
// each op's math is spelled once. Functors compute in compute_t (f32 for f16/bf16); scalar
// arguments come from a (ScalarArgs: s0, s1).
#pragma once
#include "common.cuh"

namespace flame {

#define FLAME_UNARY(Name, expr) \
  struct Name : Functor { template <class T> __device__ __forceinline__ auto operator()(T x) const { return expr; } };
#define FLAME_BINARY(Name, expr) \
  struct Name : Functor { template <class T> __device__ __forceinline__ auto operator()(T x, T y) const { return expr; } };

FLAME_UNARY(Identity, x)
FLAME_UNARY(Neg, -x)
FLAME_UNARY(Abs, x < T(0) ? T(-x) : x)
FLAME_UNARY(Exp, m_exp(x))
FLAME_UNARY(Log, m_log(x))
FLAME_UNARY(Log1p, m_log1p(x))
FLAME_UNARY(Expm1, m_expm1(x))
FLAME_UNARY(Sqrt, m_sqrt(x))
FLAME_UNARY(Rsqrt, m_rsqrt(x))
FLAME_UNARY(Sin, m_sin(x))
FLAME_UNARY(Cos, m_cos(x))
FLAME_UNARY(Tanh, m_tanh(x))
FLAME_UNARY(Sigmoid, T(1) / (T(1) + m_exp(-x)))
FLAME_UNARY(Relu, (x > T(0) || is_nan(x)) ? x : T(0))  // NaN propagates, as PyTorch
FLAME_UNARY(Silu, x / (T(1) + m_exp(-x)))
FLAME_UNARY(LeakyRelu, x > T(0) ? x : sc<T>(a.s0) * x)
FLAME_UNARY(Elu, x > T(0) ? x : sc<T>(a.s0) * m_expm1(x))
FLAME_UNARY(Gelu, T(0.5) * x * (T(1) + m_erf(x * T(0.70710678118654752440))))
FLAME_UNARY(GeluTanh, T(0.5) * x * (T(1) + m_tanh(T(0.79788456080286535588) * (x + T(0.044715) * x * x * x))))
// d/dx gelu(x) = Phi(x) + x phi(x), used by gelu's backward.
FLAME_UNARY(GeluDeriv, T(0.5) * (T(1) + m_erf(x * T(0.70710678118654752440))) + x * m_exp(T(-0.5) * x * x) * T(0.39894228040143267794))
// d/dx gelu_tanh(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2), t = tanh(k (x + c x^3)).
struct GeluTanhDeriv : Functor {
  template <class T> __device__ __forceinline__ auto operator()(T x) const {
    const T k = T(0.79788456080286535588), t = m_tanh(k * (x + T(0.044715) * x * x * x));
    return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * k * (T(1) + T(0.134145) * x * x);
  }
};
// g * gelu_tanh'(z) in one pass: the backward of gelu_tanh and of linear's GELU epilogue.
FLAME_BINARY(GeluTanhBackward, x * GeluTanhDeriv{}(y))
FLAME_UNARY(Softplus, x * sc<T>(a.s0) > sc<T>(a.s1) ? x : m_log1p(m_exp(x * sc<T>(a.s0))) / sc<T>(a.s0))
FLAME_UNARY(Floor, m_floor(x))
FLAME_UNARY(Ceil, m_ceil(x))
FLAME_UNARY(Round, m_rint(x))
FLAME_UNARY(Sign, is_nan(x) ? x : T((x > T(0)) - (x < T(0))))
FLAME_UNARY(Reciprocal, T(1) / x)
FLAME_UNARY(Square, x * x)
FLAME_UNARY(IsNan, is_nan(x))
FLAME_UNARY(IsInf, x == T(1.0 / 0.0) || x == T(-1.0 / 0.0))
FLAME_UNARY(LogicalNot, !(x != T(0)))
// Bounds compared in double so that infinite bounds never convert to an integer type.
FLAME_UNARY(Clamp, static_cast<double>(x) < a.s0 ? sc<T>(a.s0) : (static_cast<double>(x) > a.s1 ? sc<T>(a.s1) : x))
FLAME_UNARY(AddScalar, x + sc<T>(a.s0))
FLAME_UNARY(SubScalar, x - sc<T>(a.s0))
FLAME_UNARY(MulScalar, x * sc<T>(a.s0))
FLAME_UNARY(RsubScalar, sc<T>(a.s0) - x)
FLAME_UNARY(PowScalar, a.s0 == 2.0 ? T(x * x) : m_pow(x, sc<T>(a.s0)))

FLAME_BINARY(Add, x + y)
FLAME_BINARY(Sub, x - y)
FLAME_BINARY(Mul, x * y)
FLAME_BINARY(Div, x / y)
FLAME_BINARY(Pow, m_pow(x, y))
FLAME_BINARY(Maximum, is_nan(x) ? x : (is_nan(y) ? y : (x > y ? x : y)))
FLAME_BINARY(Minimum, is_nan(x) ? x : (is_nan(y) ? y : (x < y ? x : y)))
FLAME_BINARY(Eq, x == y)
FLAME_BINARY(Ne, x != y)
FLAME_BINARY(Lt, x < y)
FLAME_BINARY(Le, x <= y)
FLAME_BINARY(Gt, x > y)
FLAME_BINARY(Ge, x >= y)
FLAME_BINARY(LogicalAnd, (x != T(0)) && (y != T(0)))
FLAME_BINARY(LogicalOr, (x != T(0)) || (y != T(0)))

struct Fill : Functor { __device__ __forceinline__ double operator()() const { return a.s0; } };
struct Where : Functor {
  template <class C, class T> __device__ __forceinline__ T operator()(C c, T x, T y) const { return c ? x : y; }
};
#undef FLAME_UNARY
#undef FLAME_BINARY

}  // namespace flame

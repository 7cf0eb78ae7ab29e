// The derivative of every elementwise op that both the backward rules (src/autograd/backward_rules.cpp,
// on tensors, each operation one FLAME op and so itself differentiable) and the fused-expression
// generator (src/ops/fused_expr.cpp, on expressions) differentiate, written once: the chain product
// g * f'(.) of y = f(x), given the one tensor the rule reads (x or y: the op row's Saves column).
// Each is a template over an algebra M with `using Value` (Tensor or fused::Expr) and the const
// operations mul(a, b), div(a, b), neg(a), scale(a, c) = a * c, rsub(a, c) = c - a, square(a),
// pow(a, c) = a ^ c, sin(a), cos(a), sign(a) and zero(g) (a zero gradient like g), c a double.
// The rules' kernels (which FLAME op computes what, in which order) are the ones these spell.
#pragma once

namespace flame::derivatives {

template <class M> using V = typename M::Value;

// y = exp(x): g y
template <class M> V<M> exp(const M& m, const V<M>& g, const V<M>& y) { return m.mul(g, y); }
// y = log(x): g / x
template <class M> V<M> log(const M& m, const V<M>& g, const V<M>& x) { return m.div(g, x); }
// y = sqrt(x): g / (2 y)
template <class M> V<M> sqrt(const M& m, const V<M>& g, const V<M>& y) { return m.div(g, m.scale(y, 2)); }
// y = rsqrt(x): g (-0.5 y^3)
template <class M> V<M> rsqrt(const M& m, const V<M>& g, const V<M>& y) { return m.mul(g, m.scale(m.pow(y, 3), -0.5)); }
// y = tanh(x): g (1 - y^2)
template <class M> V<M> tanh(const M& m, const V<M>& g, const V<M>& y) { return m.mul(g, m.rsub(m.square(y), 1)); }
// y = sigmoid(x): g y (1 - y)
template <class M> V<M> sigmoid(const M& m, const V<M>& g, const V<M>& y) { return m.mul(g, m.mul(y, m.rsub(y, 1))); }
// y = sin(x): g cos(x)
template <class M> V<M> sin(const M& m, const V<M>& g, const V<M>& x) { return m.mul(g, m.cos(x)); }
// y = cos(x): g (-sin(x))
template <class M> V<M> cos(const M& m, const V<M>& g, const V<M>& x) { return m.mul(g, m.neg(m.sin(x))); }
// y = |x|: g sign(x)
template <class M> V<M> abs(const M& m, const V<M>& g, const V<M>& x) { return m.mul(g, m.sign(x)); }
// y = x ^ p, p a number: g (p x^(p-1)); zero for p = 0
template <class M> V<M> pow_scalar(const M& m, const V<M>& g, const V<M>& x, double p) {
  if (p == 0) return m.zero(g);
  return m.mul(g, m.scale(m.pow(x, p - 1), p));
}

}  // namespace flame::derivatives

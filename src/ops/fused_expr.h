// Expressions of flame_fused_compile: the parser of the user's text into an immutable AST over inputs
// x0..x{n-1}, a small simplifier (constant folding, x*1, x+0, x*0, double negation), symbolic
// differentiation, a float64 host evaluator (tests) and the code generator that writes the device
// function `fused_expr` which cuda/fused.cuh applies elementwise. User text never reaches NVRTC:
// only code generated from a parsed AST does (numbers printed by us, names from a fixed table).
// Pure host code: no GPU, no context (tests/cpu/test_fused_expr.cpp tests it white-box).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace flame::fused {

enum class Op : uint8_t {
  Const, Input,                                   // leaves
  Neg, Exp, Log, Sqrt, Rsqrt, Tanh, Sigmoid, Sin, Cos, Abs, Sign, Erf,
  Step,                                           // internal: 1 above 0, 1/2 at 0, 0 below (max/min/abs ties)
  Pow,                                            // a ^ value, value a literal
  Add, Sub, Mul, Div, Min, Max
};

struct Node;
using Expr = std::shared_ptr<const Node>;

struct Node {
  Op op = Op::Const;
  double value = 0;  // Const: the number; Pow: the exponent
  int input = 0;     // Input: its index
  Expr a, b;         // operands (b for binary ops only)
};

// Builders (no simplification).
Expr constant(double v);
Expr input(int i);
Expr unary(Op op, Expr a);
Expr binary(Op op, Expr a, Expr b);
Expr power(Expr a, double p);

// Parses text over n_inputs inputs. Grammar: sums and differences of products and quotients of
// unary minus / plus of primaries; a primary is a number (decimal, exponent allowed), x<k> with
// 0 <= k < n_inputs, a parenthesised expression, f(e) for f in exp log sqrt rsqrt tanh sigmoid sin
// cos abs sign erf, pow(e, number) (the exponent a literal, unary minus allowed) or min(e, e) /
// max(e, e). Whitespace is ignored. Throws FLAME_ERROR_INVALID_ARGUMENT naming the 1-based column
// and what was expected there. Limits: 4096 characters, nesting 64 deep.
Expr parse(const std::string& text, int n_inputs);

// Constant folding and identities: c op c, x*1, 1*x, x*0, 0*x, x+0, 0+x, x-0, 0-x, x/1, 0/x,
// -(-x), -c, pow(x, 1), pow(x, 0), (-1)*x. (x*0 = 0 ignores x = inf or NaN, as most CAS do.)
Expr simplify(const Expr& e);
// d e / d x_i, simplified.
Expr derivative(const Expr& e, int i);
// e with every input k renamed to map[k].
Expr remap_inputs(const Expr& e, const std::vector<int>& map);
// The sorted distinct inputs e reads.
std::vector<int> inputs_used(const Expr& e);
bool is_input(const Expr& e, int i);
bool is_const(const Expr& e, double v);

// A readable form, fully parenthesised: "((x0 * x1) + 1)", "tanh(x0)", "pow(x0, 3)".
std::string to_string(const Expr& e);
// The value of e at x (float64).
double eval(const Expr& e, const double* x);

// The device source that defines `template <class C> C flame::fused_expr(const C* x)` (C float or
// double) and FLAME_FUSED_INPUTS = n_inputs, to be compiled in front of cuda/fused.cuh. Common
// subexpressions become one local each.
std::string device_source(const Expr& e, int n_inputs);

}  // namespace flame::fused

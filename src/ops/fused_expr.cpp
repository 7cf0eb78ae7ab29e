// Parser, simplifier, differentiation, evaluator and code generator of fused expressions (see
// fused_expr.h). Every node is built through the smart constructors below, which fold constants
// and apply the identities as they go, so derivatives come out small without a separate pass.
#include "ops/fused_expr.h"
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include "core/error.h"
#include "ops/derivatives.h"

namespace flame::fused {

namespace {

constexpr size_t kMaxText = 4096;
constexpr int kMaxDepth = 64;

bool is_unary(Op op) { return op >= Op::Neg && op <= Op::Pow; }

struct FnName {
  const char* name;
  Op op;
  int arity;  // Pow: 2 (the second a literal)
};
const FnName kFunctions[] = {{"exp", Op::Exp, 1},   {"log", Op::Log, 1},         {"sqrt", Op::Sqrt, 1},
                             {"rsqrt", Op::Rsqrt, 1}, {"tanh", Op::Tanh, 1},     {"sigmoid", Op::Sigmoid, 1},
                             {"sin", Op::Sin, 1},   {"cos", Op::Cos, 1},         {"abs", Op::Abs, 1},
                             {"sign", Op::Sign, 1}, {"erf", Op::Erf, 1},         {"pow", Op::Pow, 2},
                             {"min", Op::Min, 2},   {"max", Op::Max, 2}};

const char* fn_name(Op op) {
  if (op == Op::Step) return "step";
  for (const FnName& f : kFunctions)
    if (f.op == op) return f.name;
  return "?";
}

double step(double d) { return d > 0 ? 1.0 : (d < 0 ? 0.0 : 0.5); }
double sign(double d) { return std::isnan(d) ? d : static_cast<double>((d > 0) - (d < 0)); }
double nan_max(double a, double b) { return std::isnan(a) ? a : (std::isnan(b) ? b : (a > b ? a : b)); }
double nan_min(double a, double b) { return std::isnan(a) ? a : (std::isnan(b) ? b : (a < b ? a : b)); }

double apply1(Op op, double a, double p) {
  switch (op) {
    case Op::Neg: return -a;
    case Op::Exp: return std::exp(a);
    case Op::Log: return std::log(a);
    case Op::Sqrt: return std::sqrt(a);
    case Op::Rsqrt: return 1.0 / std::sqrt(a);
    case Op::Tanh: return std::tanh(a);
    case Op::Sigmoid: return 1.0 / (1.0 + std::exp(-a));
    case Op::Sin: return std::sin(a);
    case Op::Cos: return std::cos(a);
    case Op::Abs: return std::fabs(a);
    case Op::Sign: return sign(a);
    case Op::Erf: return std::erf(a);
    case Op::Step: return step(a);
    case Op::Pow: return std::pow(a, p);
    default: fail(FLAME_ERROR_INTERNAL, "fused: not a unary op");
  }
}

double apply2(Op op, double a, double b) {
  switch (op) {
    case Op::Add: return a + b;
    case Op::Sub: return a - b;
    case Op::Mul: return a * b;
    case Op::Div: return a / b;
    case Op::Min: return nan_min(a, b);
    case Op::Max: return nan_max(a, b);
    default: fail(FLAME_ERROR_INTERNAL, "fused: not a binary op");
  }
}

// The shortest decimal that reads back as v.
std::string num_str(double v) {
  char buf[40];
  if (v == std::floor(v) && std::fabs(v) < 1e15) {  // integers in full: 150, not 1.5e+02
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

// ---------------- smart constructors: fold and simplify while building ----------------
Expr s_neg(const Expr& a);
Expr s_mul(const Expr& a, const Expr& b);

Expr s_unary(Op op, const Expr& a, double p = 0) {
  if (a->op == Op::Const) return constant(apply1(op, a->value, p));
  if (op == Op::Neg) return s_neg(a);
  if (op == Op::Pow) {
    if (p == 1) return a;
    if (p == 0) return constant(1);
    return power(a, p);
  }
  return unary(op, a);
}
Expr s_neg(const Expr& a) {
  if (a->op == Op::Const) return constant(-a->value);
  if (a->op == Op::Neg) return a->a;
  return unary(Op::Neg, a);
}
Expr s_add(const Expr& a, const Expr& b) {
  if (a->op == Op::Const && b->op == Op::Const) return constant(a->value + b->value);
  if (is_const(a, 0)) return b;
  if (is_const(b, 0)) return a;
  if (b->op == Op::Neg) return binary(Op::Sub, a, b->a);
  return binary(Op::Add, a, b);
}
Expr s_sub(const Expr& a, const Expr& b) {
  if (a->op == Op::Const && b->op == Op::Const) return constant(a->value - b->value);
  if (is_const(b, 0)) return a;
  if (is_const(a, 0)) return s_neg(b);
  if (b->op == Op::Neg) return binary(Op::Add, a, b->a);
  return binary(Op::Sub, a, b);
}
Expr s_mul(const Expr& a, const Expr& b) {
  if (a->op == Op::Const && b->op == Op::Const) return constant(a->value * b->value);
  if (b->op == Op::Const) return s_mul(b, a);  // constants first
  if (is_const(a, 0)) return a;
  if (is_const(a, 1)) return b;
  if (is_const(a, -1)) return s_neg(b);
  if (a->op == Op::Const && b->op == Op::Mul && b->a->op == Op::Const) return s_mul(constant(a->value * b->a->value), b->b);
  if (a->op == Op::Const && b->op == Op::Neg) return s_mul(constant(-a->value), b->a);
  if (a->op == Op::Neg && b->op == Op::Neg) return binary(Op::Mul, a->a, b->a);
  return binary(Op::Mul, a, b);
}
Expr s_div(const Expr& a, const Expr& b) {
  if (a->op == Op::Const && b->op == Op::Const) return constant(a->value / b->value);
  if (is_const(a, 0)) return a;
  if (is_const(b, 1)) return a;
  if (is_const(b, -1)) return s_neg(a);
  return binary(Op::Div, a, b);
}
Expr s_binary(Op op, const Expr& a, const Expr& b) {
  switch (op) {
    case Op::Add: return s_add(a, b);
    case Op::Sub: return s_sub(a, b);
    case Op::Mul: return s_mul(a, b);
    case Op::Div: return s_div(a, b);
    default:
      if (a->op == Op::Const && b->op == Op::Const) return constant(apply2(op, a->value, b->value));
      return binary(op, a, b);
  }
}

// The algebra of ops/derivatives.h on expressions, through the smart constructors.
struct ExprMath {
  using Value = Expr;
  Expr mul(const Expr& a, const Expr& b) const { return s_mul(a, b); }
  Expr div(const Expr& a, const Expr& b) const { return s_div(a, b); }
  Expr neg(const Expr& a) const { return s_neg(a); }
  Expr scale(const Expr& a, double c) const { return s_mul(constant(c), a); }
  Expr rsub(const Expr& a, double c) const { return s_sub(constant(c), a); }
  Expr square(const Expr& a) const { return s_mul(a, a); }
  Expr pow(const Expr& a, double c) const { return s_unary(Op::Pow, a, c); }
  Expr sin(const Expr& a) const { return s_unary(Op::Sin, a); }
  Expr cos(const Expr& a) const { return s_unary(Op::Cos, a); }
  Expr sign(const Expr& a) const { return s_unary(Op::Sign, a); }
  Expr zero(const Expr&) const { return constant(0); }
};
constexpr ExprMath kExprMath{};

// ---------------- the parser ----------------
class Parser {
 public:
  Parser(const std::string& s, int n) : s_(s), n_(n) {}

  Expr parse_all() {
    FLAME_CHECK(s_.size() <= kMaxText, FLAME_ERROR_INVALID_ARGUMENT, "expr has ", s_.size(), " characters; at most ",
                kMaxText, " are allowed");
    skip();
    if (pos_ == s_.size()) error("expected an expression, found the end of the text");
    Expr e = sum();
    if (pos_ != s_.size()) error(std::string("expected an operator (+ - * /) or the end, found ") + here());
    return e;
  }

 private:
  const std::string& s_;
  int n_;
  size_t pos_ = 0;
  int depth_ = 0;

  [[noreturn]] void error(const std::string& what) const {
    fail(FLAME_ERROR_INVALID_ARGUMENT, "expr, column ", pos_ + 1, ": ", what);
  }
  std::string here() const {
    if (pos_ >= s_.size()) return "the end of the text";
    unsigned char c = static_cast<unsigned char>(s_[pos_]);
    if (!std::isprint(c)) return "a non-printable character";
    return std::string("'") + s_[pos_] + "'";
  }
  void skip() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool eat(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      skip();
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) error(std::string("expected '") + c + "', found " + here());
  }
  struct Depth {  // bounds the recursion (a stack overflow must not crash the caller)
    Parser& p;
    explicit Depth(Parser& q) : p(q) {
      if (++p.depth_ > kMaxDepth) p.error("the expression nests more than 64 levels deep");
    }
    ~Depth() { --p.depth_; }
  };

  Expr sum() {
    Expr e = product();
    for (;;) {
      if (eat('+')) e = binary(Op::Add, e, product());
      else if (eat('-')) e = binary(Op::Sub, e, product());
      else return e;
    }
  }
  Expr product() {
    Expr e = signed_primary();
    for (;;) {
      if (eat('*')) e = binary(Op::Mul, e, signed_primary());
      else if (eat('/')) e = binary(Op::Div, e, signed_primary());
      else return e;
    }
  }
  Expr signed_primary() {
    Depth d(*this);
    if (eat('-')) return unary(Op::Neg, signed_primary());
    if (eat('+')) return signed_primary();
    return primary();
  }
  bool at_number() const {
    if (pos_ >= s_.size()) return false;
    char c = s_[pos_];
    return std::isdigit(static_cast<unsigned char>(c)) ||
           (c == '.' && pos_ + 1 < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_ + 1])));
  }
  double number() {
    size_t start = pos_, i = pos_;
    auto digits = [&] {
      size_t k = i;
      while (i < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i]))) ++i;
      return i - k;
    };
    size_t nd = digits();
    if (i < s_.size() && s_[i] == '.') {
      ++i;
      nd += digits();
    }
    if (nd == 0) error("expected a number, found " + here());
    if (i < s_.size() && (s_[i] == 'e' || s_[i] == 'E')) {
      size_t save = i++;
      if (i < s_.size() && (s_[i] == '+' || s_[i] == '-')) ++i;
      if (digits() == 0) {
        pos_ = save;
        error("expected the digits of an exponent after 'e'");
      }
    }
    double v = std::strtod(s_.substr(start, i - start).c_str(), nullptr);
    if (!std::isfinite(v)) error("the number " + s_.substr(start, i - start) + " is out of range");
    pos_ = i;
    skip();
    return v;
  }
  Expr primary() {
    if (at_number()) return constant(number());
    if (eat('(')) {
      Expr e = sum();
      expect(')');
      return e;
    }
    if (pos_ < s_.size() && (std::isalpha(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_')) {
      size_t start = pos_;
      while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_')) ++pos_;
      std::string id = s_.substr(start, pos_ - start);
      if (id.size() >= 2 && id[0] == 'x' && id.find_first_not_of("0123456789", 1) == std::string::npos) {
        long k = id.size() <= 4 ? std::strtol(id.c_str() + 1, nullptr, 10) : -1;
        if (k < 0 || k >= n_ || (id.size() > 2 && id[1] == '0')) {
          pos_ = start;
          error("input " + id + " does not exist: the inputs are x0 to x" + std::to_string(n_ - 1));
        }
        skip();
        return input(static_cast<int>(k));
      }
      const FnName* fn = nullptr;
      for (const FnName& f : kFunctions)
        if (id == f.name) fn = &f;
      if (!fn) {
        pos_ = start;
        error("unknown name '" + id.substr(0, 32) +
              "' (inputs are x0, x1, ...; functions: exp log sqrt rsqrt tanh sigmoid sin cos abs sign erf pow min max)");
      }
      skip();
      expect('(');
      Expr a = sum();
      if (fn->op == Op::Pow) {
        expect(',');
        bool neg = false;
        while (pos_ < s_.size() && (s_[pos_] == '-' || s_[pos_] == '+')) {
          neg ^= s_[pos_] == '-';
          ++pos_;
          skip();
        }
        if (!at_number()) error("the exponent of pow must be a number literal, found " + here());
        double p = number();
        expect(')');
        return power(a, neg ? -p : p);
      }
      if (fn->arity == 2) {
        expect(',');
        Expr b = sum();
        expect(')');
        return binary(fn->op, a, b);
      }
      expect(')');
      return unary(fn->op, a);
    }
    error("expected a number, an input x<k>, a function or '(', found " + here());
  }
};

// ---------------- code generation with common subexpressions shared ----------------
class Gen {
 public:
  std::ostringstream body;
  std::string emit(const Expr& e) {
    auto m = memo_.find(e.get());
    if (m != memo_.end()) return m->second;
    std::string r = rhs(e);
    if (e->op != Op::Const && e->op != Op::Input) {
      auto it = names_.find(r);
      if (it != names_.end()) {
        r = it->second;
      } else {
        std::string name = "t" + std::to_string(names_.size());
        body << "  const C " << name << " = " << r << ";\n";
        names_.emplace(r, name);
        r = name;
      }
    }
    memo_.emplace(e.get(), r);
    return r;
  }

 private:
  std::map<const Node*, std::string> memo_;
  std::map<std::string, std::string> names_;  // right-hand side -> local

  static std::string lit(double v) {
    if (std::isnan(v)) return "(C(0) / C(0))";
    if (std::isinf(v)) return v > 0 ? "(C(1) / C(0))" : "(C(-1) / C(0))";
    return "C(" + num_str(v) + ")";
  }
  // The functor of cuda/functors.cuh that computes op (the elementwise op of the same math), or
  // null for the generator's own forms: erf, step, pow with a literal exponent, and min / max, whose
  // NaN-propagating selects NVRTC compiles to other code through the Minimum / Maximum functors
  // (sm_90 PTX of max(x0, x1) differs), so they keep the inline form the fused kernels always had.
  static const char* functor(Op op) {
    switch (op) {
      case Op::Neg: return "Neg";
      case Op::Exp: return "Exp";
      case Op::Log: return "Log";
      case Op::Sqrt: return "Sqrt";
      case Op::Rsqrt: return "Rsqrt";
      case Op::Tanh: return "Tanh";
      case Op::Sigmoid: return "Sigmoid";
      case Op::Sin: return "Sin";
      case Op::Cos: return "Cos";
      case Op::Abs: return "Abs";
      case Op::Sign: return "Sign";
      case Op::Add: return "Add";
      case Op::Sub: return "Sub";
      case Op::Mul: return "Mul";
      case Op::Div: return "Div";
      default: return nullptr;
    }
  }
  std::string rhs(const Expr& e) {
    switch (e->op) {
      case Op::Const: return lit(e->value);
      case Op::Input: return "x[" + std::to_string(e->input) + "]";
      default: break;
    }
    const std::string a = emit(e->a);
    if (is_unary(e->op)) {
      if (const char* f = functor(e->op)) return std::string(f) + "{}(" + a + ")";
      switch (e->op) {
        case Op::Erf: return "m_erf(" + a + ")";
        case Op::Step: return "(" + a + " > C(0) ? C(1) : (" + a + " < C(0) ? C(0) : C(0.5)))";
        case Op::Pow: {
          const double p = e->value;
          if (p == 2) return a + " * " + a;
          if (p == 3) return a + " * " + a + " * " + a;
          if (p == -1) return "C(1) / " + a;
          if (p == 0.5) return "m_sqrt(" + a + ")";
          return "m_pow(" + a + ", " + lit(p) + ")";
        }
        default: break;
      }
      fail(FLAME_ERROR_INTERNAL, "fused: no code for op ", static_cast<int>(e->op));
    }
    const std::string b = emit(e->b);
    if (const char* f = functor(e->op)) return std::string(f) + "{}(" + a + ", " + b + ")";
    switch (e->op) {
      case Op::Min: return "(is_nan(" + a + ") ? " + a + " : (is_nan(" + b + ") ? " + b + " : (" + a + " < " + b + " ? " + a + " : " + b + ")))";
      case Op::Max: return "(is_nan(" + a + ") ? " + a + " : (is_nan(" + b + ") ? " + b + " : (" + a + " > " + b + " ? " + a + " : " + b + ")))";
      default: break;
    }
    fail(FLAME_ERROR_INTERNAL, "fused: no code for op ", static_cast<int>(e->op));
  }
};

void collect_inputs(const Expr& e, std::vector<bool>& seen) {
  if (e->op == Op::Input) {
    if (static_cast<size_t>(e->input) >= seen.size()) seen.resize(static_cast<size_t>(e->input) + 1, false);
    seen[static_cast<size_t>(e->input)] = true;
  }
  if (e->a) collect_inputs(e->a, seen);
  if (e->b) collect_inputs(e->b, seen);
}

}  // namespace

// ---------------- builders ----------------
Expr constant(double v) {
  auto n = std::make_shared<Node>();
  n->op = Op::Const;
  n->value = v;
  return n;
}
Expr input(int i) {
  auto n = std::make_shared<Node>();
  n->op = Op::Input;
  n->input = i;
  return n;
}
Expr unary(Op op, Expr a) {
  auto n = std::make_shared<Node>();
  n->op = op;
  n->a = std::move(a);
  return n;
}
Expr binary(Op op, Expr a, Expr b) {
  auto n = std::make_shared<Node>();
  n->op = op;
  n->a = std::move(a);
  n->b = std::move(b);
  return n;
}
Expr power(Expr a, double p) {
  auto n = std::make_shared<Node>();
  n->op = Op::Pow;
  n->value = p;
  n->a = std::move(a);
  return n;
}

bool is_input(const Expr& e, int i) { return e->op == Op::Input && e->input == i; }
bool is_const(const Expr& e, double v) { return e->op == Op::Const && e->value == v; }

Expr parse(const std::string& text, int n_inputs) { return Parser(text, n_inputs).parse_all(); }

Expr simplify(const Expr& e) {
  switch (e->op) {
    case Op::Const: case Op::Input: return e;
    default: break;
  }
  if (is_unary(e->op)) return s_unary(e->op, simplify(e->a), e->value);
  return s_binary(e->op, simplify(e->a), simplify(e->b));
}

Expr derivative(const Expr& e, int i) {
  const Expr& a = e->a;
  const Expr& b = e->b;
  auto da = [&] { return derivative(a, i); };
  switch (e->op) {
    case Op::Const: return constant(0);
    case Op::Input: return constant(e->input == i ? 1 : 0);
    case Op::Neg: return s_neg(da());
    // The elementwise ops' derivatives, shared with their backward rules (ops/derivatives.h).
    case Op::Exp: return derivatives::exp(kExprMath, da(), e);
    case Op::Log: return derivatives::log(kExprMath, da(), a);
    case Op::Sqrt: return derivatives::sqrt(kExprMath, da(), e);
    case Op::Rsqrt: return derivatives::rsqrt(kExprMath, da(), e);
    case Op::Tanh: return derivatives::tanh(kExprMath, da(), e);
    case Op::Sigmoid: return derivatives::sigmoid(kExprMath, da(), e);
    case Op::Sin: return derivatives::sin(kExprMath, da(), a);
    case Op::Cos: return derivatives::cos(kExprMath, da(), a);
    case Op::Abs: return derivatives::abs(kExprMath, da(), a);
    case Op::Sign: case Op::Step: return constant(0);
    case Op::Erf:  // 2 / sqrt(pi) exp(-a^2)
      return s_mul(s_mul(constant(1.1283791670955126), da()), s_unary(Op::Exp, s_neg(s_mul(a, a))));
    case Op::Pow: return derivatives::pow_scalar(kExprMath, da(), a, e->value);
    case Op::Add: return s_add(da(), derivative(b, i));
    case Op::Sub: return s_sub(da(), derivative(b, i));
    case Op::Mul: return s_add(s_mul(da(), b), s_mul(a, derivative(b, i)));
    case Op::Div: {  // a'/b - (a/b) b'/b
      Expr db = derivative(b, i);
      return s_sub(s_div(da(), b), s_div(s_mul(e, db), b));
    }
    case Op::Max: case Op::Min: {  // the winner's derivative; ties split evenly (as torch.maximum)
      Expr d = e->op == Op::Max ? s_sub(a, b) : s_sub(b, a);
      return s_add(s_mul(da(), s_unary(Op::Step, d)), s_mul(derivative(b, i), s_unary(Op::Step, s_neg(d))));
    }
  }
  fail(FLAME_ERROR_INTERNAL, "fused: no derivative for op ", static_cast<int>(e->op));
}

Expr remap_inputs(const Expr& e, const std::vector<int>& map) {
  switch (e->op) {
    case Op::Const: return e;
    case Op::Input: return input(map.at(static_cast<size_t>(e->input)));
    default: break;
  }
  if (is_unary(e->op)) {
    if (e->op == Op::Pow) return power(remap_inputs(e->a, map), e->value);
    return unary(e->op, remap_inputs(e->a, map));
  }
  return binary(e->op, remap_inputs(e->a, map), remap_inputs(e->b, map));
}

std::vector<int> inputs_used(const Expr& e) {
  std::vector<bool> seen;
  collect_inputs(e, seen);
  std::vector<int> r;
  for (size_t k = 0; k < seen.size(); ++k)
    if (seen[k]) r.push_back(static_cast<int>(k));
  return r;
}

std::string to_string(const Expr& e) {
  switch (e->op) {
    case Op::Const: return num_str(e->value);
    case Op::Input: return "x" + std::to_string(e->input);
    case Op::Neg: return "(-" + to_string(e->a) + ")";
    case Op::Pow: return "pow(" + to_string(e->a) + ", " + num_str(e->value) + ")";
    case Op::Add: return "(" + to_string(e->a) + " + " + to_string(e->b) + ")";
    case Op::Sub: return "(" + to_string(e->a) + " - " + to_string(e->b) + ")";
    case Op::Mul: return "(" + to_string(e->a) + " * " + to_string(e->b) + ")";
    case Op::Div: return "(" + to_string(e->a) + " / " + to_string(e->b) + ")";
    case Op::Min: case Op::Max: return std::string(fn_name(e->op)) + "(" + to_string(e->a) + ", " + to_string(e->b) + ")";
    default: return std::string(fn_name(e->op)) + "(" + to_string(e->a) + ")";
  }
}

double eval(const Expr& e, const double* x) {
  switch (e->op) {
    case Op::Const: return e->value;
    case Op::Input: return x[e->input];
    default: break;
  }
  if (is_unary(e->op)) return apply1(e->op, eval(e->a, x), e->value);
  return apply2(e->op, eval(e->a, x), eval(e->b, x));
}

std::string device_source(const Expr& e, int n_inputs) {
  Gen g;
  std::string result = g.emit(e);
  std::ostringstream os;
  os << "#include \"functors.cuh\"\n"
     << "#define FLAME_FUSED_INPUTS " << n_inputs << "\n"
     << "namespace flame {\n"
     << "// " << to_string(e).substr(0, 200) << "\n"
     << "template <class C> __device__ __forceinline__ C fused_expr(const C* x) {\n"
     << g.body.str() << "  return " << result << ";\n}\n"
     << "}  // namespace flame\n";
  return os.str();
}

}  // namespace flame::fused

// White-box tests of fused expressions (src/ops/fused_expr.h), no GPU: the parser (precedence,
// errors with their column), the simplifier, symbolic derivatives against central differences of
// the float64 evaluator, and the generated device source (CSE, no user text). The generated source
// is compiled by NVRTC for sm_80 and sm_90 in test_kernels.cpp (KernelCompile.Fused).
#include <gtest/gtest.h>
#include <cmath>
#include <fstream>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include "core/error.h"
#include "ops/fused_expr.h"

using namespace flame;
using namespace flame::fused;

namespace {

std::string parsed(const std::string& text, int n = 3) { return to_string(parse(text, n)); }
std::string simple(const std::string& text, int n = 3) { return to_string(simplify(parse(text, n))); }

// The status and message of parsing text (FLAME_OK and "" when it parses).
std::pair<flame_status_t, std::string> parse_error(const std::string& text, int n = 2) {
  try {
    parse(text, n);
    return {FLAME_OK, ""};
  } catch (const Error& e) {
    return {e.status(), e.what()};
  }
}

const char* kGeluTanh = "0.5 * x0 * (1 + tanh(0.7978845608028654 * (x0 + 0.044715 * x0 * x0 * x0)))";

}  // namespace

TEST(FusedExpr, PrecedenceAndAssociativity) {
  EXPECT_EQ(parsed("x0 + x1 * x2"), "(x0 + (x1 * x2))");
  EXPECT_EQ(parsed("x0 - x1 - x2"), "((x0 - x1) - x2)");
  EXPECT_EQ(parsed("x0 / x1 * x2"), "((x0 / x1) * x2)");
  EXPECT_EQ(parsed("-x0 * x1"), "((-x0) * x1)");
  EXPECT_EQ(parsed("(x0 + x1) * x2"), "((x0 + x1) * x2)");
  EXPECT_EQ(parsed("--x0"), "(-(-x0))");
  EXPECT_EQ(parsed("+x0"), "x0");
  EXPECT_EQ(parsed(" pow( x0 , -2.5 ) "), "pow(x0, -2.5)");
  EXPECT_EQ(parsed("max(x0, min(x1, 1e-3))"), "max(x0, min(x1, 0.001))");
  EXPECT_EQ(parsed("sigmoid(x0)*tanh(x1)+erf(x2)"), "((sigmoid(x0) * tanh(x1)) + erf(x2))");
  EXPECT_EQ(parsed(".5 * 2. * 1.5E2"), "((0.5 * 2) * 150)");
}

TEST(FusedExpr, ErrorsNameTheColumn) {
  struct Bad {
    const char* text;
    const char* col;
    const char* words;
  };
  const Bad bad[] = {
      {"x0 +", "column 5", "end of the text"},
      {"x0 * * x1", "column 6", "found '*'"},
      {"x2 + 1", "column 1", "x2 does not exist"},
      {"foo(x0)", "column 1", "unknown name 'foo'"},
      {"exp(x0", "column 7", "expected ')'"},
      {"pow(x0, x1)", "column 9", "literal"},
      {"min(x0)", "column 7", "expected ','"},
      {"x0 x1", "column 4", "expected an operator"},
      {"", "column 1", "expected an expression"},
      {"1e", "column 2", "exponent"},
      {"x0 $ 1", "column 4", "'$'"},
      {"1e999", "column 1", "out of range"},
      {"x01", "column 1", "does not exist"},
      {"inf", "column 1", "unknown name"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.text);
    auto [st, msg] = parse_error(b.text);
    EXPECT_EQ(st, FLAME_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(msg.find(b.col), std::string::npos) << msg;
    EXPECT_NE(msg.find(b.words), std::string::npos) << msg;
    EXPECT_NE(msg.find("expr"), std::string::npos) << msg;
  }
  std::string deep(100, '(');
  deep += "x0" + std::string(100, ')');
  EXPECT_EQ(parse_error(deep).first, FLAME_ERROR_INVALID_ARGUMENT);
  std::string minus(100, '-');
  EXPECT_NE(parse_error(minus + "x0").second.find("64 levels"), std::string::npos);
  EXPECT_EQ(parse_error(std::string(5000, ' ') + "x0").first, FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(parse_error("x0 + x1", 2).first, FLAME_OK);
}

TEST(FusedExpr, SimplifierFoldsConstantsAndIdentities) {
  EXPECT_EQ(simple("x0 * 1 + 0"), "x0");
  EXPECT_EQ(simple("1 * x0 - 0"), "x0");
  EXPECT_EQ(simple("x0 * 0 + x1"), "x1");
  EXPECT_EQ(simple("0 - x0"), "(-x0)");
  EXPECT_EQ(simple("-(-x0)"), "x0");
  EXPECT_EQ(simple("2 * 3 + x0 / 1"), "(6 + x0)");
  EXPECT_EQ(simple("pow(x0, 1) + pow(x1, 0)"), "(x0 + 1)");
  EXPECT_EQ(simple("exp(0) * x0"), "x0");
  EXPECT_EQ(simple("x0 * 2 * 3"), "(6 * x0)");  // constants move left and combine
  EXPECT_EQ(simple("0 / x0"), "0");
  EXPECT_EQ(simple("x0 - -x1"), "(x0 + x1)");
  EXPECT_EQ(simple("max(1, 2) * x0"), "(2 * x0)");
}

TEST(FusedExpr, DerivativesInClosedForm) {
  // d/dx tanh(x) * x = (1 - tanh(x)^2) x + tanh(x)
  Expr e = simplify(parse("tanh(x0) * x0", 1));
  EXPECT_EQ(to_string(derivative(e, 0)), "(((1 - (tanh(x0) * tanh(x0))) * x0) + tanh(x0))");
  Expr ada = simplify(parse("x0 * (1 + x1) + x2", 3));
  EXPECT_EQ(to_string(derivative(ada, 0)), "(1 + x1)");
  EXPECT_EQ(to_string(derivative(ada, 1)), "x0");
  EXPECT_EQ(to_string(derivative(ada, 2)), "1");
  EXPECT_EQ(to_string(derivative(simplify(parse("x0 + 3", 2)), 1)), "0");
  EXPECT_EQ(to_string(derivative(simplify(parse("pow(x0, 3)", 1)), 0)), "(3 * pow(x0, 2))");
  EXPECT_EQ(to_string(derivative(simplify(parse("exp(2 * x0)", 1)), 0)), "(2 * exp((2 * x0)))");
  EXPECT_EQ(to_string(derivative(simplify(parse("abs(x0)", 1)), 0)), "sign(x0)");
}

TEST(FusedExpr, DerivativesMatchFiniteDifferences) {
  const char* exprs[] = {kGeluTanh,
                         "x0 * (1 + x1) + x2",
                         "sigmoid(x0) * x1 - log(1 + x2 * x2)",
                         "sqrt(2 + sin(x0)) / (3 + cos(x1 * x2))",
                         "rsqrt(1.5 + x0 * x0) * erf(x1) + pow(2 + x2, -1.5)",
                         "exp(-x0 * x0) * abs(x1) + max(x0, x2) - min(x1, x2)",
                         "x0 / x1 + x2 / (x0 * x1 + 5)",
                         "tanh(tanh(x0 * x1)) * sign(x2) + pow(x0, 3)"};
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(-1.5, 1.5);
  for (const char* text : exprs) {
    SCOPED_TRACE(text);
    Expr e = simplify(parse(text, 3));
    for (int trial = 0; trial < 20; ++trial) {
      double x[3];
      for (double& v : x) {
        v = u(rng);
        if (std::fabs(v) < 0.1) v += 0.3;  // away from the kinks of abs and sign at 0
      }
      if (std::fabs(x[0] - x[2]) < 0.05 || std::fabs(x[1] - x[2]) < 0.05) continue;  // max/min ties
      for (int i = 0; i < 3; ++i) {
        Expr d = derivative(e, i);
        double xp[3] = {x[0], x[1], x[2]}, xm[3] = {x[0], x[1], x[2]};
        const double h = 1e-6;
        xp[i] += h;
        xm[i] -= h;
        const double fd = (eval(e, xp) - eval(e, xm)) / (2 * h);
        EXPECT_NEAR(eval(d, x), fd, 1e-6 * (1 + std::fabs(fd))) << "d/dx" << i << " = " << to_string(d);
      }
    }
  }
}

TEST(FusedExpr, SecondDerivativesMatchFiniteDifferences) {
  Expr e = simplify(parse(kGeluTanh, 1));
  Expr d1 = derivative(e, 0), d2 = derivative(d1, 0), d3 = derivative(d2, 0);
  for (double x : {-2.0, -0.7, 0.3, 1.1, 2.5}) {
    const double h = 1e-5;
    double xp = x + h, xm = x - h;
    EXPECT_NEAR(eval(d2, &x), (eval(d1, &xp) - eval(d1, &xm)) / (2 * h), 1e-6);
    EXPECT_NEAR(eval(d3, &x), (eval(d2, &xp) - eval(d2, &xm)) / (2 * h), 1e-5);
  }
}

TEST(FusedExpr, InputsAndRemapping) {
  Expr e = parse("x2 * x0 + x2", 3);
  EXPECT_EQ(inputs_used(e), (std::vector<int>{0, 2}));
  EXPECT_EQ(to_string(remap_inputs(e, {1, 9, 0})), "((x0 * x1) + x0)");
  EXPECT_TRUE(is_input(parse("x1", 2), 1));
  EXPECT_TRUE(is_const(simplify(parse("2 - 2", 1)), 0));
}

TEST(FusedExpr, DeviceSourceSharesSubexpressionsAndHoldsNoUserText) {
  Expr e = simplify(parse("tanh(x0 * x1) + tanh(x0 * x1) * x1", 2));
  const std::string src = device_source(e, 2);
  EXPECT_NE(src.find("#define FLAME_FUSED_INPUTS 2"), std::string::npos) << src;
  EXPECT_NE(src.find("#include \"functors.cuh\""), std::string::npos);
  size_t tanh_calls = 0;
  for (size_t p = src.find("Tanh{}("); p != std::string::npos; p = src.find("Tanh{}(", p + 1)) ++tanh_calls;
  EXPECT_EQ(tanh_calls, 1u) << "the common tanh(x0 * x1) is computed once:\n" << src;
  // Numbers are printed by FLAME (shortest round trip); the user's spelling never appears.
  const std::string odd = device_source(simplify(parse("x0 * 00.50000 + 1E0", 1)), 1);
  EXPECT_EQ(odd.find("00.5"), std::string::npos) << odd;
  EXPECT_NE(odd.find("C(0.5)"), std::string::npos) << odd;
  // Constants folded to inf / NaN stay valid C++.
  const std::string inf = device_source(simplify(parse("x0 + log(0)", 1)), 1);
  EXPECT_NE(inf.find("(C(-1) / C(0))"), std::string::npos) << inf;
}

// Every functor the generated code calls is an elementwise op's functor in cuda/functors.cuh (one
// definition of each op's math for the elementwise kernels and the fused expressions).
TEST(FusedExpr, GeneratedCodeCallsTheElementwiseFunctors) {
  std::ifstream f(std::string(FLAME_SOURCE_DIR) + "/cuda/functors.cuh");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string functors = ss.str();
  ASSERT_FALSE(functors.empty());
  const std::string src = device_source(
      parse("-exp(x0) + log(x1) - sqrt(x0) * rsqrt(x1) / tanh(x0) + sigmoid(x1) * sin(x0) * cos(x1) + abs(x0) * sign(x1)"
            " + min(x0, x1) + max(x0, x1) + erf(x0) + pow(x1, 2.5)",
            2),
      2);
  const std::regex call(R"(([A-Z]\w*)\{\}\()");
  std::set<std::string> called;
  for (auto it = std::sregex_iterator(src.begin(), src.end(), call); it != std::sregex_iterator(); ++it)
    called.insert((*it)[1].str());
  EXPECT_EQ(called.size(), 15u) << src;  // 11 unary and 4 binary ops (min / max stay inline, fused_expr.cpp)
  for (const std::string& name : called)
    EXPECT_TRUE(functors.find("FLAME_UNARY(" + name + ",") != std::string::npos ||
                functors.find("FLAME_BINARY(" + name + ",") != std::string::npos)
        << name << " is not a functor of cuda/functors.cuh";
  for (const char* own : {"m_exp(", "m_log(", "m_tanh(", "m_sin(", "m_cos(", "m_sqrt(x", "m_rsqrt("})
    EXPECT_EQ(src.find(own), std::string::npos) << "the generator re-spells an op's math (" << own << "):\n" << src;
}

// The op list (src/tensor/op_list.h) against what is generated from it and what the rules read, with
// no GPU: every op id has a backward rule exactly when its row says RULE, and is otherwise marked
// NONDIFF or NOBACKWARD; comparisons and predicates (bool outputs) are NONDIFF; and the Saves
// column of every elementwise row is exactly what its rule in src/autograd/backward_rules.cpp
// reads through saved_input / saved_output (read from the source, following the helpers a rule
// calls with the node), so no rule reads a tensor that was not saved and nothing is saved unread.
// The GPU half (every op has a gradient-check or not-differentiable row) is
// tests/gpu/test_op_coverage.cpp.
#include <gtest/gtest.h>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include "autograd/engine.h"
#include "tensor/autograd_graph.h"
#include "ops/launch.h"
#include "tensor/op_list.h"

namespace flame {
namespace {

struct Row {
  OpId id;
  const char* name;
  bool elementwise;
};

std::vector<Row> rows() {
  return {
#define ROW_EW(Id, name, ...) {OpId::Id, #name, true},
#define ROW_GRAPH(Id, name, ...) {OpId::Id, #name, false},
      FLAME_ELEMENTWISE_OPS(ROW_EW) FLAME_GRAPH_OPS(ROW_GRAPH)
#undef ROW_EW
#undef ROW_GRAPH
  };
}

const char* backward_name(Backward b) {
  switch (b) {
    case Backward::RULE: return "RULE";
    case Backward::NONDIFF: return "NONDIFF";
    case Backward::NOBACKWARD: return "NOBACKWARD";
  }
  return "?";
}

TEST(OpCoverage, EveryOpIdHasARuleOrANotDifferentiableMark) {
  const std::vector<Row> all = rows();
  ASSERT_EQ(all.size(), static_cast<size_t>(kNumOps));
  std::set<std::string> names;
  for (int i = 0; i < kNumOps; ++i) {
    const Row& r = all[static_cast<size_t>(i)];
    const OpId op = static_cast<OpId>(i);
    ASSERT_EQ(r.id, op) << r.name << ": the rows are not in OpId order";
    EXPECT_STREQ(op_name(op), r.name);
    EXPECT_TRUE(names.insert(r.name).second) << "op name '" << r.name << "' appears twice";
    const Backward b = op_backward(op);
    EXPECT_EQ(has_backward(op), b == Backward::RULE)
        << "op '" << r.name << "' is marked " << backward_name(b) << " but the rule table "
        << (has_backward(op) ? "has" : "has no") << " rule for it";
    if (b != Backward::RULE) EXPECT_EQ(op_saves(op), Saves::NONE) << "op '" << r.name << "' has no rule but saves tensors";
    if (r.elementwise) {
      DType compute = FLAME_DTYPE_F32, out = FLAME_DTYPE_F32;
      ASSERT_TRUE(elementwise_signature(op, FLAME_DTYPE_F32, &compute, &out)) << r.name;
      EXPECT_EQ(b == Backward::NONDIFF, out == FLAME_DTYPE_BOOL)
          << "elementwise op '" << r.name << "': NONDIFF exactly for bool outputs (Kind PRED / CMP)";
      EXPECT_NE(b, Backward::NOBACKWARD) << "elementwise op '" << r.name << "': a rule or NONDIFF";
    }
  }
}

// ---- what the rules read, from the source of src/autograd/backward_rules.cpp ----

std::string read_rules_source() {
  std::ifstream f(std::string(FLAME_SOURCE_DIR) + "/src/autograd/backward_rules.cpp");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The body (from the opening brace to its match) of every function that takes the node: the
// rules `RULE(Id)` (keyed "bw_Id") and the helpers `... name(Node& n, ...)`.
std::map<std::string, std::string> node_functions(const std::string& src) {
  std::map<std::string, std::string> fns;
  const std::regex head(R"((?:^|\n)(?:RULE\((\w+)\)|[\w:<>]+ (\w+)\(Node& n[,)][^{;]*)\s*\{)");
  for (auto it = std::sregex_iterator(src.begin(), src.end(), head); it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    const std::string name = m[1].matched ? "bw_" + m[1].str() : m[2].str();
    size_t pos = static_cast<size_t>(m.position(0) + m.length(0)), depth = 1, start = pos;
    while (pos < src.size() && depth > 0) {
      if (src[pos] == '{') ++depth;
      if (src[pos] == '}') --depth;
      ++pos;
    }
    fns[name] = src.substr(start, pos - start);
  }
  return fns;
}

// Whether the function `name` (or a node helper it calls with n, other than the accessors of the
// saved tensors themselves) contains `what`.
bool reads(const std::map<std::string, std::string>& fns, const std::string& name, const std::string& what,
           std::set<std::string>& seen) {
  if (name == "saved" || name == "saved_input" || name == "saved_output") return false;
  auto it = fns.find(name);
  if (it == fns.end() || !seen.insert(name).second) return false;
  if (it->second.find(what) != std::string::npos) return true;
  const std::regex call(R"((\w+)\(n[,)])");
  const std::string& body = it->second;
  for (auto c = std::sregex_iterator(body.begin(), body.end(), call); c != std::sregex_iterator(); ++c)
    if (reads(fns, (*c)[1].str(), what, seen)) return true;
  return false;
}

TEST(OpCoverage, SavesColumnIsWhatEachElementwiseRuleReads) {
  const std::string src = read_rules_source();
  ASSERT_FALSE(src.empty()) << "cannot read src/autograd/backward_rules.cpp under " << FLAME_SOURCE_DIR;
  const auto fns = node_functions(src);
  ASSERT_TRUE(fns.count("bw_Neg") && fns.count("max_min")) << "the rule parser found " << fns.size() << " functions";
  for (const Row& r : rows()) {
    if (!r.elementwise || op_backward(r.id) != Backward::RULE) continue;
    const std::string rule = std::string("bw_") + elementwise_functor(r.id);
    ASSERT_TRUE(fns.count(rule)) << "no RULE(" << elementwise_functor(r.id) << ") in backward_rules.cpp";
    std::set<std::string> s1, s2, s3;
    EXPECT_FALSE(reads(fns, rule, "saved(n", s3)) << r.name << ": an elementwise rule reads saved_input / saved_output";
    EXPECT_EQ(reads(fns, rule, "saved_input(n", s1), saves_input(r.id))
        << "op '" << r.name << "': the rule's reads of its input and the row's Saves column disagree";
    EXPECT_EQ(reads(fns, rule, "saved_output(n", s2), saves_output(r.id))
        << "op '" << r.name << "': the rule's reads of its output and the row's Saves column disagree";
  }
}

}  // namespace
}  // namespace flame

// The FLAME_NNOPS_OPS rows (src/ops/op_list.h) that the tests of the second part of issue 5 cover
// with gradient checks. Each test_<topic>.cpp registers the op names its gradcheck rows cover, at
// static initialisation; test_nnops_cover.cpp fails for an op of the list that no file covers.
#pragma once
#include <set>
#include <string>
#include <vector>
#include "gradcheck.h"

namespace nnops {

inline std::set<std::string>& covered() {
  static std::set<std::string> s;
  return s;
}
// Registers the covers of rows; returns true (for a namespace-scope `const bool`).
inline bool cover(const std::vector<gc::Row>& rows) {
  for (const gc::Row& r : rows) covered().insert(r.covers.begin(), r.covers.end());
  return true;
}

}  // namespace nnops

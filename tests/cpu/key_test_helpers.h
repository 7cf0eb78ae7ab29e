// Helpers of the CPU checkpoint-key tests (test_*_keys.cpp, white-box over src/models/*_keys.*):
// a table's parameter total, its keys in one layout under a prefix, and the status and message of
// a detection or other call that may throw flame::Error. Header only.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "core/error.h"
#include "models/mapped_keys.h"

namespace flame::models::testing {

inline int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The elements of every parameter of the table.
inline int64_t parameter_total(const MappedTable& t) {
  int64_t n = 0;
  for (const MappedParameter& p : t.parameters) n += element_count(p.shape);
  return n;
}

// keys with prefix in front of each name.
inline std::vector<KeyShape> with_prefix(std::vector<KeyShape> keys, const std::string& prefix) {
  for (KeyShape& k : keys) k.name = prefix + k.name;
  return keys;
}

// The table's checkpoint keys in the original layout (or diffusers'), under prefix.
inline std::vector<KeyShape> table_keys(const MappedTable& t, bool original, const std::string& prefix) {
  return with_prefix(original ? t.original : t.diffusers_tensors(), prefix);
}

// FLAME_OK when fn returns; else the status of the flame::Error it throws, its message in *msg.
template <class Fn>
flame_status_t status_of(Fn&& fn, std::string* msg) {
  try {
    fn();
    return FLAME_OK;
  } catch (const Error& e) {
    *msg = e.what();
    return e.status();
  }
}

}  // namespace flame::models::testing

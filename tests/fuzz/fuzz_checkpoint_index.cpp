// libFuzzer target over the JSON files of checkpoint folders (src/models/checkpoint_json.h), white
// box and without a GPU. The input is given both as a sharded checkpoint's index
// (parse_shard_index) and as a pipeline's model_index.json (parse_model_index). Each either throws
// flame::Error with FLAME_ERROR_INVALID_FORMAT naming the source (a clean rejection) or returns a
// result whose promises are then checked: index pairs sorted by key, unique keys, every shard a
// plain file name (never "", ".", "..", and no '/', '\\' or NUL: no path leaves the folder);
// components sorted, unique, with plain names that do not start with '_'. Anything else (another
// exception, a sanitizer report, a violated invariant) is a finding.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include "core/error.h"
#include "models/checkpoint_json.h"

using namespace flame;
using namespace flame::models;

namespace {

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "fuzz_checkpoint_index: invariant violated: %s\n", what);
  std::abort();
}
#define REQUIRE(cond) \
  do {                \
    if (!(cond)) finding(#cond); \
  } while (0)

const char* const kSource = "fuzz-input.json";

bool plain(const std::string& n) {
  return !n.empty() && n != "." && n != ".." && n.find('/') == std::string::npos && n.find('\\') == std::string::npos &&
         n.find('\0') == std::string::npos;
}

void expect_clean_rejection(const Error& e) {
  REQUIRE(e.status() == FLAME_ERROR_INVALID_FORMAT);
  REQUIRE(std::string(e.what()).find(kSource) != std::string::npos);
}

void check_shard_index(const std::string& text) {
  try {
    const auto pairs = parse_shard_index(text, kSource);
    REQUIRE(!pairs.empty());
    for (size_t i = 0; i < pairs.size(); ++i) {
      REQUIRE(i == 0 || pairs[i - 1].first < pairs[i].first);  // sorted, unique
      REQUIRE(plain(pairs[i].second));
    }
  } catch (const Error& e) {
    expect_clean_rejection(e);
  }
}

void check_model_index(const std::string& text) {
  try {
    const auto components = parse_model_index(text, kSource);
    for (size_t i = 0; i < components.size(); ++i) {
      REQUIRE(i == 0 || components[i - 1].name < components[i].name);
      REQUIRE(plain(components[i].name));
      REQUIRE(components[i].name[0] != '_');
    }
  } catch (const Error& e) {
    expect_clean_rejection(e);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  check_shard_index(text);
  check_model_index(text);
  return 0;
}

#include "dist/launch_env.h"
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include "core/error.h"

namespace flame {

namespace {

bool blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The variable's value with surrounding blanks removed; a missing or blank one fails.
std::string required(const EnvLookup& lookup, const char* name) {
  const char* raw = lookup(name);
  FLAME_CHECK(raw, FLAME_ERROR_INVALID_ARGUMENT, "environment variable ", name,
              " is not set (start every rank with a launcher that sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and "
              "MASTER_PORT: flame-run or torchrun)");
  std::string v(raw);
  while (!v.empty() && blank(v.back())) v.pop_back();
  size_t first = 0;
  while (first < v.size() && blank(v[first])) ++first;
  v.erase(0, first);
  FLAME_CHECK(!v.empty(), FLAME_ERROR_INVALID_ARGUMENT, "environment variable ", name, " is empty");
  return v;
}

int32_t integer_in(const EnvLookup& lookup, const char* name, int64_t lo, int64_t hi) {
  const std::string v = required(lookup, name);
  errno = 0;
  char* end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  FLAME_CHECK(errno == 0 && end && *end == '\0', FLAME_ERROR_INVALID_ARGUMENT, "environment variable ", name, "=\"", v,
              "\" is not a whole decimal number");
  FLAME_CHECK(n >= lo && n <= hi, FLAME_ERROR_INVALID_ARGUMENT, "environment variable ", name, "=", n, " is not in [", lo,
              ", ", hi, "]");
  return static_cast<int32_t>(n);
}

}  // namespace

LaunchEnv read_launch_env(const EnvLookup& lookup) {
  LaunchEnv e;
  e.world_size = integer_in(lookup, "WORLD_SIZE", 1, 1 << 20);
  e.rank = integer_in(lookup, "RANK", 0, e.world_size - 1);
  e.local_rank = integer_in(lookup, "LOCAL_RANK", 0, e.world_size - 1);
  e.master_addr = required(lookup, "MASTER_ADDR");
  e.master_port = integer_in(lookup, "MASTER_PORT", 1, 65535);
  if (const char* t = lookup("FLAME_RENDEZVOUS_TIMEOUT")) {
    errno = 0;
    char* end = nullptr;
    const double s = std::strtod(t, &end);
    while (end && blank(*end)) ++end;
    FLAME_CHECK(errno == 0 && end != t && end && *end == '\0' && std::isfinite(s) && s > 0 && s <= 86400,
                FLAME_ERROR_INVALID_ARGUMENT, "environment variable FLAME_RENDEZVOUS_TIMEOUT=\"", t,
                "\" is not a number of seconds in (0, 86400]");
    e.rendezvous_timeout_seconds = s;
  }
  return e;
}

}  // namespace flame

// The torchrun launch convention, read from the environment: RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, MASTER_PORT (as torchrun, flame-run, Slurm wrappers and most cluster launchers set
// them), plus FLAME_RENDEZVOUS_TIMEOUT (seconds; optional). The lookup is a parameter so that the
// parsing is testable without touching the process environment; the C entry point passes getenv.
// A missing or malformed variable throws FLAME_ERROR_INVALID_ARGUMENT naming the variable and the
// value found, before anything else happens (no network, no GPU).
#pragma once
#include <cstdint>
#include <functional>
#include <string>

namespace flame {

struct LaunchEnv {
  int32_t rank = 0;
  int32_t world_size = 1;
  int32_t local_rank = 0;
  std::string master_addr;
  int32_t master_port = 0;
  double rendezvous_timeout_seconds = 300;  // FLAME_RENDEZVOUS_TIMEOUT's default
};

using EnvLookup = std::function<const char*(const char*)>;  // NULL when the variable is unset

// Validates: WORLD_SIZE >= 1, RANK in [0, WORLD_SIZE), LOCAL_RANK in [0, WORLD_SIZE), MASTER_PORT in
// [1, 65535], MASTER_ADDR non-empty, FLAME_RENDEZVOUS_TIMEOUT in (0, 86400]. Integers are whole
// decimal numbers (surrounding blanks allowed, nothing else).
LaunchEnv read_launch_env(const EnvLookup& lookup);

}  // namespace flame

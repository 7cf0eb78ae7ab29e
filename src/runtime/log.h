// Messages from the library to its user: a context's logger. Where they go and from which level on
// is stderr from $FLAME_LOG's level (else FLAME_LOG_INFO) when the context is made, and what
// flame_ctx_set_log says afterwards; kept in the context: no process-wide state. The
// library logs little: INFO the first kernel compile of a context (a cold kernel cache can take
// minutes and would otherwise look like a hang), DEBUG each compiled kernel with its time, WARNING
// a kernel cache that cannot be written.
#pragma once
#include <cstdint>
#include <string>
#include "flame.h"

namespace flame {

// The level named by text ("debug", "info", "warning" or "warn", "off"; any case): true and *level
// set, else false.
bool parse_log_level(const char* text, int32_t* level);
// The name of a level ("debug", "info", "warning", "off"); "unknown" for other values.
const char* log_level_name(int32_t level);

class Logger {
 public:
  // INFO and above to stderr.
  Logger() = default;
  // For flame_ctx_set_log: fn NULL writes to stderr; level 0 takes env_level ($FLAME_LOG, may be
  // NULL), else INFO. Throws FLAME_ERROR_INVALID_ARGUMENT for a level outside
  // [FLAME_LOG_DEBUG, FLAME_LOG_OFF]. An unknown env_level is not an error: INFO, and one WARNING
  // line naming it, delivered here (through the chosen sink).
  static Logger from_options(flame_log_fn fn, void* user_data, int32_t level, const char* env_level);

  bool enabled(int32_t level) const { return level >= threshold_ && threshold_ != FLAME_LOG_OFF; }
  int32_t threshold() const { return threshold_; }
  // Delivers message (no trailing newline) when level is enabled. Never throws: an exception thrown
  // by a C++ callback is swallowed, a failed write to stderr ignored.
  void write(int32_t level, const std::string& message) noexcept;

  // The line written to stderr for a message: "flame: <message>\n", "flame: warning: <message>\n".
  static std::string stderr_line(int32_t level, const std::string& message);

 private:
  flame_log_fn fn_ = nullptr;
  void* user_data_ = nullptr;
  int32_t threshold_ = FLAME_LOG_INFO;
};

}  // namespace flame

// The context's logger (runtime/log.h): level filtering, the stderr format, the callback guard.
#include "runtime/log.h"
#include <cctype>
#include <cstdio>
#include "core/error.h"

namespace flame {

bool parse_log_level(const char* text, int32_t* level) {
  if (!text) return false;
  std::string t;
  for (const char* p = text; *p; ++p) t += static_cast<char>(std::tolower(static_cast<unsigned char>(*p)));
  if (t == "debug") *level = FLAME_LOG_DEBUG;
  else if (t == "info") *level = FLAME_LOG_INFO;
  else if (t == "warning" || t == "warn") *level = FLAME_LOG_WARNING;
  else if (t == "off") *level = FLAME_LOG_OFF;
  else return false;
  return true;
}

const char* log_level_name(int32_t level) {
  switch (level) {
    case FLAME_LOG_DEBUG: return "debug";
    case FLAME_LOG_INFO: return "info";
    case FLAME_LOG_WARNING: return "warning";
    case FLAME_LOG_OFF: return "off";
    default: return "unknown";
  }
}

Logger Logger::from_options(flame_log_fn fn, void* user_data, int32_t level, const char* env_level) {
  FLAME_CHECK(level == 0 || (level >= FLAME_LOG_DEBUG && level <= FLAME_LOG_OFF), FLAME_ERROR_INVALID_ARGUMENT,
              "level is ", level, "; expected 0 (default) or FLAME_LOG_DEBUG .. FLAME_LOG_OFF (",
              int(FLAME_LOG_DEBUG), " .. ", int(FLAME_LOG_OFF), ")");
  Logger l;
  l.fn_ = fn;
  l.user_data_ = user_data;
  if (level != 0) {
    l.threshold_ = level;
  } else if (env_level && *env_level && !parse_log_level(env_level, &l.threshold_)) {
    l.threshold_ = FLAME_LOG_INFO;
    l.write(FLAME_LOG_WARNING, std::string("FLAME_LOG='") + env_level + "' is not one of debug, info, warning, off; using info");
  }
  return l;
}

std::string Logger::stderr_line(int32_t level, const std::string& message) {
  return std::string(level >= FLAME_LOG_WARNING ? "flame: warning: " : "flame: ") + message + "\n";
}

void Logger::write(int32_t level, const std::string& message) noexcept {
  if (!enabled(level)) return;
  if (fn_) {
    try {
      fn_(user_data_, level, message.c_str());
    } catch (...) {  // a C++ callback's exception must not cross into the library's caller
    }
    return;
  }
  try {
    const std::string line = stderr_line(level, message);
    std::fwrite(line.data(), 1, line.size(), stderr);  // one write: lines of several threads do not interleave
    std::fflush(stderr);
  } catch (...) {  // out of memory while formatting: the message is dropped
  }
}

}  // namespace flame

// Errors inside FLAME are C++ exceptions of type flame::Error carrying a flame_status_t. They never
// cross the C ABI: every entry point runs its body through api_call() (src/api/guard.h), which
// catches everything, stores the text in a thread-local message and returns the status.
#pragma once
#include <stdexcept>
#include <string>
#include <sstream>
#include "flame.h"

namespace flame {

class Error : public std::runtime_error {
 public:
  Error(flame_status_t status, const std::string& msg) : std::runtime_error(msg), status_(status) {}
  flame_status_t status() const { return status_; }

 private:
  flame_status_t status_;
};

// Builds a message from stream-able pieces: fail(FLAME_ERROR_SHAPE_MISMATCH, "dim ", d, " is ", n).
template <class... Args>
[[noreturn]] void fail(flame_status_t status, const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  throw Error(status, os.str());
}

#define FLAME_CHECK(cond, status, ...) \
  do {                                 \
    if (!(cond)) ::flame::fail(status, __VA_ARGS__); \
  } while (0)

// Thread-local message behind flame_last_error_message().
void set_last_error(const std::string& msg);
void clear_last_error();
const char* last_error();

}  // namespace flame

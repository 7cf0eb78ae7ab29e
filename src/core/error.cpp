// The thread-local error text. A message is per thread by contract (flame.h), so this is the one
// piece of thread-local state in FLAME; it holds no graph or tensor state.
#include "core/error.h"

namespace flame {

static std::string& message() {
  thread_local std::string msg;
  return msg;
}

void set_last_error(const std::string& msg) { message() = msg; }
void clear_last_error() { message().clear(); }
const char* last_error() { return message().c_str(); }

}  // namespace flame

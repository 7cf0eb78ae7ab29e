// Owning C++ handles over flame.h's C handles for the trainer (flame-train), and `check`, which
// turns a failed call into a FlameError carrying the library's message. The trainer uses only the
// public C ABI; these wrappers just release what it owns on every path (exceptions included).
#pragma once

#include <flame.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace flame_train {

class FlameError : public std::runtime_error {
 public:
  FlameError(flame_status_t status, const std::string& what)
      : std::runtime_error(what + " failed (" + flame_status_string(status) + "): " + flame_last_error_message()),
        status_(status) {}
  flame_status_t status() const { return status_; }

 private:
  flame_status_t status_;
};

inline void check(flame_status_t status, const char* what) {
  if (status != FLAME_OK) throw FlameError(status, what);
}

// One owned handle; Release is the C release function.
template <typename H, void (*Release)(H)>
class Owned {
 public:
  Owned() = default;
  explicit Owned(H h) : h_(h) {}
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  Owned(Owned&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  Owned& operator=(Owned&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, nullptr);
    }
    return *this;
  }
  ~Owned() { reset(); }
  void reset() {
    if (h_) Release(h_);
    h_ = nullptr;
  }
  H get() const { return h_; }
  H* out() {  // for a C out-parameter: releases what was held
    reset();
    return &h_;
  }

 private:
  H h_ = nullptr;
};

using Tensor = Owned<flame_tensor_t, flame_tensor_release>;
using Params = Owned<flame_params_t, flame_params_release>;
using Model = Owned<flame_model_t, flame_model_release>;
using Optimizer = Owned<flame_optimizer_t, flame_optimizer_release>;
using Context = Owned<flame_ctx_t, flame_ctx_destroy>;
using SafetensorsFile = Owned<flame_safetensors_t, flame_safetensors_release>;

}  // namespace flame_train

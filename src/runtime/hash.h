// A 128-bit non-cryptographic digest (two independent FNV-1a-64 lanes) for kernel cache keys and
// entry checksums. Cache entries also store their full key, so a collision cannot load a wrong kernel.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

namespace flame {

class Hasher {
 public:
  Hasher& add(const void* data, size_t n) {
    const unsigned char* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) {
      a_ = (a_ ^ p[i]) * 0x100000001b3ull;
      b_ = (b_ ^ p[i]) * 0x100000001b3ull;
      b_ ^= b_ >> 29;
    }
    return *this;
  }
  Hasher& add(const std::string& s) {
    uint64_t n = s.size();
    add(&n, sizeof n);  // length prefix keeps ("ab","c") and ("a","bc") apart
    return add(s.data(), s.size());
  }
  std::string hex() const {
    char buf[33];
    std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(a_),
                  static_cast<unsigned long long>(b_));
    return buf;
  }

 private:
  uint64_t a_ = 0xcbf29ce484222325ull;
  uint64_t b_ = 0x84222325cbf29ce4ull;
};

}  // namespace flame

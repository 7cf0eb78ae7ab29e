// Kernel keys: how a launch site names the kernel instantiation it wants without building a string.
// A KernelTemplate is a constant per kernel template of a cuda/ file: the file, the qualified name
// and how each template argument is spelled. A KernelKey is a template plus up to kMaxArgs small
// ints (dtype codes, widths, flags) and at most one text argument (an elementwise functor, a
// reduction op). Context::function(key) looks the key up by hashing those fields and spells the
// NVRTC name expression (kernel_name) only on a miss. The *_instantiations lists that the CPU test
// compiles (tests/cpu/test_kernels.cpp) call kernel_name on keys made by the same functions the
// launch sites use, so the runtime and the test name every kernel identically.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include "core/dtype.h"

namespace flame {

// How one template argument is spelled from ints[i] of a key.
enum class TArg : uint8_t {
  End,    // no more arguments
  Int,    // decimal: "4"
  Bool,   // "true" / "false"
  Dtype,  // device_type: "float", "flame::half_t", ...
  Index,  // the index type of a strided kernel: 0 "unsigned int", 1 "unsigned long long"
  Text,   // "flame::" + the key's text (its int is unused)
};

constexpr int kKernelMaxArgs = 8;

struct KernelTemplate {
  const char* file;                       // under cuda/
  const char* name;                       // qualified: "flame::norm_fwd"
  std::array<TArg, kKernelMaxArgs> args;  // End-terminated; none: a plain kernel (no "<>")
  // Whether a Dtype argument may be a storage-only dtype (f8): only the elementwise kernels, whose
  // launcher (ops/launch.cpp) admits f8 for conversions and fills alone, and the dequantisation
  // kernel (ops/quantized.cpp), which decodes f8 into a float dtype. kernel_name refuses an
  // f8 argument of any other template with FLAME_ERROR_UNSUPPORTED.
  bool storage_dtypes = false;
};

struct KernelKey {
  static constexpr int32_t kAbsent = INT32_MIN;  // leaves its argument out (kernels of varying arity)
  const KernelTemplate* tmpl = nullptr;          // identity: templates are constants with one address
  std::array<int32_t, kKernelMaxArgs> ints{};
  std::string_view text;  // compared by content; the context copies it before keeping a key
  bool operator==(const KernelKey& o) const { return tmpl == o.tmpl && ints == o.ints && text == o.text; }
};

struct KernelKeyHash {
  size_t operator()(const KernelKey& k) const {
    size_t h = std::hash<const void*>()(k.tmpl);
    for (int32_t i : k.ints) h = h * 1000003u ^ static_cast<size_t>(static_cast<uint32_t>(i));
    if (!k.text.empty()) h = h * 1000003u ^ std::hash<std::string_view>()(k.text);
    return h;
  }
};

// The name expression of an instantiation: "flame::norm_fwd<float, 0, 4, 8>". A storage-only
// dtype argument of a template without storage_dtypes: FLAME_ERROR_UNSUPPORTED (check_compute_dtype).
std::string kernel_name(const KernelKey& k);

namespace key_detail {
inline void set(KernelKey& k, size_t i, DType d) { k.ints[i] = static_cast<int32_t>(d); }
inline void set(KernelKey& k, size_t i, int v) { k.ints[i] = v; }
inline void set(KernelKey& k, size_t i, bool b) { k.ints[i] = b ? 1 : 0; }
inline void set(KernelKey& k, size_t, std::string_view s) { k.text = s; }
inline void set(KernelKey& k, size_t, const char* s) { k.text = s; }  // not the bool overload
}  // namespace key_detail

// A key from its arguments in template order: DType, int, bool, or a string (the Text argument).
template <class... A>
KernelKey make_key(const KernelTemplate& t, const A&... a) {
  static_assert(sizeof...(A) <= kKernelMaxArgs, "too many kernel template arguments");
  KernelKey k;
  k.tmpl = &t;
  size_t i = 0;
  (key_detail::set(k, i++, a), ...);
  return k;
}

}  // namespace flame

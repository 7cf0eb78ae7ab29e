// Spelling of kernel keys as NVRTC name expressions (see runtime/kernel_key.h).
#include "runtime/kernel_key.h"

namespace flame {

std::string kernel_name(const KernelKey& k) {
  std::string s = k.tmpl->name;
  bool open = false;
  for (size_t i = 0; i < k.ints.size() && k.tmpl->args[i] != TArg::End; ++i) {
    const int32_t v = k.ints[i];
    if (v == KernelKey::kAbsent) continue;
    s += open ? ", " : "<";
    open = true;
    switch (k.tmpl->args[i]) {
      case TArg::End: break;
      case TArg::Int: s += std::to_string(v); break;
      case TArg::Bool: s += v ? "true" : "false"; break;
      case TArg::Dtype:
        if (!k.tmpl->storage_dtypes) check_compute_dtype(static_cast<DType>(v), k.tmpl->name);
        s += device_type(static_cast<DType>(v));
        break;
      case TArg::Index: s += v ? "unsigned long long" : "unsigned int"; break;
      case TArg::Text: s += "flame::"; s.append(k.text.data(), k.text.size()); break;
    }
  }
  if (open) s += '>';
  return s;
}

}  // namespace flame

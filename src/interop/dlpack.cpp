// DLPack dtype mapping and descriptor validation (see dlpack.h). Every size, stride and address
// computation is overflow-checked: a DLTensor may come from untrusted code paths (a fuzzer feeds it).
#include "interop/dlpack.h"
#include <cstring>
#include "core/error.h"

namespace flame::dlpack {

#if defined(DLPACK_MAJOR_VERSION) && (DLPACK_MAJOR_VERSION > 1 || (DLPACK_MAJOR_VERSION == 1 && DLPACK_MINOR_VERSION >= 1))
static_assert(kDLFloat8_e4m3fn == kFloat8E4m3fnCode && kDLFloat8_e5m2 == kFloat8E5m2Code, "DLPack 1.1 float8 codes");
#endif

DLDataType to_dl(DType d) {
  DLDataType t;
  t.lanes = 1;
  t.bits = static_cast<uint8_t>(8 * dtype_size(d));
  switch (d) {
    case FLAME_DTYPE_F32: case FLAME_DTYPE_F16: case FLAME_DTYPE_F64: t.code = kDLFloat; break;
    case FLAME_DTYPE_BF16: t.code = kDLBfloat; break;
    case FLAME_DTYPE_I32: case FLAME_DTYPE_I64: t.code = kDLInt; break;
    case FLAME_DTYPE_U8: t.code = kDLUInt; break;
    case FLAME_DTYPE_BOOL: t.code = kBoolCode; break;
    case FLAME_DTYPE_F8_E4M3: t.code = kFloat8E4m3fnCode; break;
    case FLAME_DTYPE_F8_E5M2: t.code = kFloat8E5m2Code; break;
    default: fail(FLAME_ERROR_INTERNAL, "no DLPack dtype for dtype ", static_cast<int>(d));
  }
  return t;
}

DType from_dl(DLDataType t) {
  if (t.lanes == 1) {
    switch (t.code) {
      case kDLFloat:
        if (t.bits == 32) return FLAME_DTYPE_F32;
        if (t.bits == 16) return FLAME_DTYPE_F16;
        if (t.bits == 64) return FLAME_DTYPE_F64;
        break;
      case kDLBfloat:
        if (t.bits == 16) return FLAME_DTYPE_BF16;
        break;
      case kDLInt:
        if (t.bits == 32) return FLAME_DTYPE_I32;
        if (t.bits == 64) return FLAME_DTYPE_I64;
        break;
      case kDLUInt:
        if (t.bits == 8) return FLAME_DTYPE_U8;
        break;
      case kBoolCode:
        if (t.bits == 8) return FLAME_DTYPE_BOOL;
        break;
      case kFloat8E4m3fnCode:
        if (t.bits == 8) return FLAME_DTYPE_F8_E4M3;
        break;
      case kFloat8E5m2Code:
        if (t.bits == 8) return FLAME_DTYPE_F8_E5M2;
        break;
      default:
        break;
    }
  }
  fail(FLAME_ERROR_DTYPE_MISMATCH, "DLPack dtype (code ", static_cast<int>(t.code), ", bits ", static_cast<int>(t.bits),
       ", lanes ", t.lanes,
       ") has no FLAME dtype (f32, f16, bf16, f64, i32, i64, u8, bool, float8_e4m3fn, float8_e5m2 with 1 lane)");
}

const char* device_name(int device_type) {
  switch (device_type) {
    case kDLCPU: return "CPU";
    case kDLCUDA: return "CUDA";
    case kDLCUDAHost: return "CUDA host (pinned)";
    case kDLCUDAManaged: return "CUDA managed";
    case kDLROCM: return "ROCm";
    case kDLROCMHost: return "ROCm host";
    case kDLOpenCL: return "OpenCL";
    case kDLVulkan: return "Vulkan";
    case kDLMetal: return "Metal";
    default: return "unknown";
  }
}

Layout import_layout(const DLTensor& t, int ordinal, const char* arg) {
  // A producer may send device types this dlpack.h does not list: read the integer, not the enum
  // (a value outside DLDeviceType's range is undefined behaviour in C++).
  static_assert(sizeof(t.device.device_type) == sizeof(int32_t), "DLDeviceType is 32-bit");
  int32_t device_type = 0;
  std::memcpy(&device_type, &t.device.device_type, sizeof device_type);
  FLAME_CHECK(device_type == kDLCUDA, FLAME_ERROR_UNSUPPORTED, arg, " is on DLPack device type ", device_type, " (",
              device_name(device_type), "); FLAME imports CUDA device memory only (kDLCUDA)");
  FLAME_CHECK(t.device.device_id == ordinal, FLAME_ERROR_INVALID_ARGUMENT, arg, " is on CUDA device ", t.device.device_id,
              ", the context on device ", ordinal, "; create a context on that device");
  Layout l;
  try {
    l.dtype = from_dl(t.dtype);
  } catch (const Error& e) {
    fail(e.status(), arg, "->dl_tensor.dtype: ", e.what());
  }
  FLAME_CHECK(t.ndim >= 0 && t.ndim <= FLAME_MAX_DIMS, FLAME_ERROR_INVALID_ARGUMENT, arg, "->dl_tensor.ndim ", t.ndim,
              " is not in [0, ", FLAME_MAX_DIMS, "]");
  FLAME_CHECK(t.shape || t.ndim == 0, FLAME_ERROR_INVALID_ARGUMENT, arg, "->dl_tensor.shape is NULL");
  l.shape.assign(t.shape, t.shape + t.ndim);
  int64_t numel = 0;
  try {
    numel = checked_numel(l.shape);  // negative sizes and overflow
  } catch (const Error& e) {
    fail(e.status(), arg, "->dl_tensor.shape: ", e.what());
  }
  l.strides = t.strides ? Strides(t.strides, t.strides + t.ndim) : contiguous_strides(l.shape);
  const int64_t elem = static_cast<int64_t>(dtype_size(l.dtype));

  const uint64_t data = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(t.data));
  uint64_t first = 0;  // address of element (0, ..., 0)
  FLAME_CHECK(!__builtin_add_overflow(data, t.byte_offset, &first), FLAME_ERROR_INVALID_ARGUMENT, arg,
              "->dl_tensor.data + byte_offset overflows");
  if (numel == 0) {
    l.base = first;
    l.strides = contiguous_strides(l.shape);  // no element is addressed: keep the producer's strides out
    return l;
  }
  FLAME_CHECK(first != 0, FLAME_ERROR_INVALID_ARGUMENT, arg, "->dl_tensor.data is NULL for ", numel, " elements");
  FLAME_CHECK(first % static_cast<uint64_t>(elem) == 0, FLAME_ERROR_INVALID_ARGUMENT, arg,
              "'s first element (data + byte_offset) is not aligned to its ", elem, "-byte elements");
  // Lowest and highest element offsets the view reaches (negative strides reach below `first`).
  ElementSpan reach;
  try {
    reach = checked_span(l.shape, l.strides);  // the library's one overflow check (core/shape.h)
  } catch (const Error& e) {
    fail(e.status(), arg, "->dl_tensor.strides: ", e.what());
  }
  const int64_t lo = reach.lo, hi = reach.hi;
  int64_t span = 0, span_bytes = 0, below = 0;
  bool bad = __builtin_sub_overflow(hi, lo, &span) || __builtin_add_overflow(span, int64_t{1}, &span) ||
             __builtin_mul_overflow(span, elem, &span_bytes) || __builtin_mul_overflow(-lo, elem, &below);
  FLAME_CHECK(!bad, FLAME_ERROR_INVALID_ARGUMENT, arg, " addresses more than 2^63 bytes");
  FLAME_CHECK(static_cast<uint64_t>(below) <= first, FLAME_ERROR_INVALID_ARGUMENT, arg,
              "'s negative strides reach below address 0");
  l.base = first - static_cast<uint64_t>(below);
  uint64_t end = 0;
  FLAME_CHECK(!__builtin_add_overflow(l.base, static_cast<uint64_t>(span_bytes), &end), FLAME_ERROR_INVALID_ARGUMENT,
              arg, " reaches past the end of the address space");
  l.bytes = static_cast<size_t>(span_bytes);
  l.offset = -lo;
  return l;
}

}  // namespace flame::dlpack

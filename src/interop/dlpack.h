// DLPack <-> FLAME without device calls: the dtype mapping and the validation of a foreign
// DLTensor descriptor into a FLAME storage range plus a strided view of it. Kept free of CUDA so
// that the CPU tests and the fuzzers exercise it; the C entry points are in api/api_dlpack.cpp.
//
// The header is the packaged dlpack.h found at configure time (cmake/dlpack.cmake): Debian's
// libdlpack-dev (0.6) or the copy PyTorch ships (1.x). Both are supported; the versioned struct
// exists only with DLPack >= 1.0 (FLAME_HAVE_DLPACK_VERSIONED).
#pragma once
#include <cstdint>
#include FLAME_DLPACK_HEADER
#include "core/dtype.h"
#include "core/shape.h"

#if defined(DLPACK_MAJOR_VERSION) && DLPACK_MAJOR_VERSION >= 1
#define FLAME_HAVE_DLPACK_VERSIONED 1
#else
#define FLAME_HAVE_DLPACK_VERSIONED 0
#endif

namespace flame::dlpack {

// kDLBool: a type code since DLPack 0.8; 0.6 headers lack the name, the value is the protocol's.
constexpr uint8_t kBoolCode = 6;
// kDLFloat8_e4m3fn and kDLFloat8_e5m2 (8 bits): type codes since DLPack 1.1 (PyTorch exports its
// float8 tensors with them); older headers lack the names, the values are the protocol's.
constexpr uint8_t kFloat8E4m3fnCode = 10;
constexpr uint8_t kFloat8E5m2Code = 12;

DLDataType to_dl(DType d);
// The FLAME dtype of a DLPack dtype; FLAME_ERROR_DTYPE_MISMATCH naming it when FLAME has none.
DType from_dl(DLDataType t);
// "CPU", "CUDA", ... for messages.
const char* device_name(int device_type);

// A DLTensor seen as FLAME memory: the storage [base, base + bytes) and a view at offset elements
// from base. For an empty tensor base is the data address (maybe 0) and bytes 0.
struct Layout {
  DType dtype = FLAME_DTYPE_F32;
  Shape shape;
  Strides strides;
  uint64_t base = 0;
  size_t bytes = 0;
  int64_t offset = 0;
};

// Validates t as CUDA memory of device `ordinal`: device, dtype, ndim, sizes, strides (NULL means
// compact row-major), alignment, and that the addressed range fits in 64 bits. Throws flame::Error
// (INVALID_ARGUMENT, UNSUPPORTED or DTYPE_MISMATCH) naming `arg` ("src").
Layout import_layout(const DLTensor& t, int ordinal, const char* arg);

}  // namespace flame::dlpack

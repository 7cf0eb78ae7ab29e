// Errors that kernels find in the data they read (an index out of range), reported to the host at
// the context's next synchronisation (see Context::device_error_record in src/runtime/context.h).
// The record lives in device memory; the first reporting thread claims it with an atomicCAS on
// `code` and fills in the rest, later reports are dropped, so the message names the first one the
// device saw. Reporting never traps: the kernel writes NaN where the bad index was used and goes on.
#pragma once
#include "common.cuh"

namespace flame {

struct DeviceErrorRecord {  // mirrors Context::DeviceErrorRecord
  unsigned int code;        // 0: no error; 1: an index out of range
  unsigned int source;      // which launch reported it (a host-side table of descriptions)
  i64 value, position, limit;  // the bad index, its position in the index tensor, the valid range [0, limit)
};
// The host reads the record back byte for byte: 32 bytes, code at 0, source at 4, value at 8,
// position at 16, limit at 24 (checked on the host side in src/runtime/context.cpp too).
static_assert(sizeof(DeviceErrorRecord) == 32, "DeviceErrorRecord: the host mirror expects 32 bytes");

__device__ __forceinline__ void report_bad_index(DeviceErrorRecord* rec, unsigned int source, i64 value, i64 position,
                                                 i64 limit) {
  if (!rec) return;
  if (atomicCAS(&rec->code, 0u, 1u) == 0u) {
    rec->source = source;
    rec->value = value;
    rec->position = position;
    rec->limit = limit;
  }
}

}  // namespace flame

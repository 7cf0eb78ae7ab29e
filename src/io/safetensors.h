// The safetensors format (https://github.com/huggingface/safetensors), without the GPU: parsing and
// validating a whole file held in memory, and laying out and serialising a header for writing.
//
// File layout: 8 bytes little-endian u64 N; N bytes of UTF-8 JSON, an object mapping tensor names
// to {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]} plus an optional
// "__metadata__" object of string values; then the data region, where each tensor's bytes lie
// row-major and little-endian at [begin, end) relative to the start of the region.
//
// parse() trusts nothing in the header. It reads only inside the span it is given and fails with
// FLAME_ERROR_INVALID_FORMAT (and a message naming the tensor and the problem) on: a file shorter
// than 8 bytes, N above 100 MB (the Python package's limit) or beyond the file, invalid UTF-8,
// invalid JSON, JSON types other than the schema's, missing fields, nesting deeper than the schema,
// duplicate keys at any level, NUL characters in names/keys/values, a dtype the format does not
// define, negative or non-integer dims, more than kMaxDims dims, an element count or byte count
// that overflows, a byte range whose size is not numel * dtype size, begin > end, ranges outside
// the data region, overlapping ranges, gaps between ranges or bytes after the last one (the
// reference implementation rejects those too), more than kMaxEntries tensors or metadata entries.
// The JSON is read with nlohmann-json's SAX interface, so memory grows with what the header holds,
// never with what it claims; nothing is allocated from a number read in the header.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>
#include "core/dtype.h"
#include "core/shape.h"

namespace flame::st {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // as safetensors' MAX_HEADER_SIZE
constexpr size_t kMaxDims = 64;                    // per tensor; FLAME itself reads up to FLAME_MAX_DIMS
constexpr size_t kMaxEntries = size_t(1) << 20;    // tensors, and metadata entries, per file
constexpr size_t kMaxNesting = 3;                  // top object > tensor object > shape array

struct TensorEntry {
  std::string name;
  std::string dtype_name;  // as the file spells it: "F32", "F8_E4M3"
  bool supported = false;  // FLAME has the dtype (then `dtype` holds it)
  DType dtype = FLAME_DTYPE_F32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte range inside the data region
  uint64_t bytes() const { return end - begin; }
};

struct Header {
  uint64_t data_start = 0;  // file offset of the data region: 8 + N
  uint64_t data_bytes = 0;  // size of the data region
  std::vector<TensorEntry> tensors;                           // sorted by name (byte order)
  std::vector<std::pair<std::string, std::string>> metadata;  // sorted by key (byte order)

  // The tensor called name, or nullptr.
  const TensorEntry* find(const std::string& name) const;
  // The metadata value stored under key, or nullptr.
  const std::string* find_metadata(const std::string& key) const;
};

// The limits parse() enforces; tests lower them to reach them cheaply.
struct Limits {
  uint64_t max_header_bytes = kMaxHeaderBytes;
  size_t max_dims = kMaxDims;
  size_t max_entries = kMaxEntries;
};

// Parses and validates the safetensors file held in [data, data + size). Throws flame::Error with
// FLAME_ERROR_INVALID_FORMAT on any of the defects listed above. data may be NULL when size is 0.
Header parse(const unsigned char* data, size_t size, const Limits& limits = Limits());

// The format's name of a FLAME dtype ("F32", "BF16", "BOOL", ...).
const char* format_dtype_name(DType d);

// Assigns begin/end to tensors (whose name, dtype and shape are set) in the order the Python
// package writes: by dtype (I64, F64, F32, I32, BF16, F16, U8, BOOL), then by name, back to back
// from 0, so that every tensor starts at a multiple of its element size. Returns that order
// (indices into tensors). Duplicate or reserved ("__metadata__") names, invalid UTF-8 in names,
// keys or values, or duplicate metadata keys: FLAME_ERROR_INVALID_ARGUMENT.
std::vector<size_t> layout(std::vector<TensorEntry>& tensors,
                           const std::vector<std::pair<std::string, std::string>>& metadata);

// The bytes that precede the data region of a file: the 8-byte length and the JSON header
// ("__metadata__" first when there is any, then the tensors in `order`), padded with spaces to a
// multiple of 8 bytes. tensors must have been laid out by layout().
std::string serialize_header(const std::vector<TensorEntry>& tensors, const std::vector<size_t>& order,
                             const std::vector<std::pair<std::string, std::string>>& metadata);

// True when [s, s + n) is well-formed UTF-8 (no overlong forms, surrogates or values > U+10FFFF).
bool valid_utf8(const char* s, size_t n);

}  // namespace flame::st

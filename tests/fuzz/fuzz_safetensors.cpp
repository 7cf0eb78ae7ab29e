// libFuzzer target over the safetensors parser (src/io/safetensors.h), white box and without a GPU.
// The input is a whole file. st::parse either throws flame::Error with FLAME_ERROR_INVALID_FORMAT
// (a clean rejection) or returns a header whose every promise is then checked: the data region lies
// inside the file, every tensor's byte range lies inside the region with size numel * dtype size,
// the ranges tile the region without overlap or gap, names and metadata keys are unique, sorted and
// valid UTF-8. An accepted header is also re-serialised (layout + serialize_header) and parsed
// again, which must give the same tensors and metadata. Anything else (another exception, a
// sanitizer report, a violated invariant) is a finding.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include "core/dtype.h"
#include "core/error.h"
#include "io/safetensors.h"

using namespace flame;

namespace {

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "fuzz_safetensors: invariant violated: %s\n", what);
  std::abort();
}
#define REQUIRE(cond) \
  do {                \
    if (!(cond)) finding(#cond); \
  } while (0)

void check_header(const st::Header& h, size_t file_size) {
  REQUIRE(h.data_start >= 8 && h.data_start <= file_size);
  REQUIRE(h.data_bytes == file_size - h.data_start);
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    const st::TensorEntry& t = h.tensors[i];
    REQUIRE(st::valid_utf8(t.name.data(), t.name.size()));
    REQUIRE(i == 0 || h.tensors[i - 1].name < t.name);  // sorted, unique
    REQUIRE(t.begin <= t.end && t.end <= h.data_bytes);
    if (t.supported) {
      uint64_t n = 1;
      for (int64_t d : t.shape) {
        REQUIRE(d >= 0);
        n *= static_cast<uint64_t>(d);  // cannot overflow: parse checked the byte count
      }
      REQUIRE(n * dtype_size(t.dtype) == t.bytes());
    }
    if (t.bytes() > 0) ranges.emplace_back(t.begin, t.end);
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t at = 0;
  for (const auto& r : ranges) {  // back to back from 0 (the reference rejects gaps and overlaps)
    REQUIRE(r.first == at);
    at = r.second;
  }
  REQUIRE(at == h.data_bytes);
  for (size_t i = 0; i < h.metadata.size(); ++i) {
    REQUIRE(i == 0 || h.metadata[i - 1].first < h.metadata[i].first);
    REQUIRE(st::valid_utf8(h.metadata[i].first.data(), h.metadata[i].first.size()));
    REQUIRE(st::valid_utf8(h.metadata[i].second.data(), h.metadata[i].second.size()));
  }
}

// Writes the accepted header again (FLAME's own layout), with zeroed data, and parses the result.
void round_trip(const st::Header& h) {
  std::vector<st::TensorEntry> tensors;
  for (const st::TensorEntry& t : h.tensors) {
    if (!t.supported) return;  // FLAME writes only its own dtypes
    st::TensorEntry e;
    e.name = t.name;
    e.dtype_name = t.dtype_name;
    e.supported = true;
    e.dtype = t.dtype;
    e.shape = t.shape;
    tensors.push_back(e);
  }
  std::vector<size_t> order;
  try {
    order = st::layout(tensors, h.metadata);
  } catch (const Error&) {
    return;  // names the writer refuses (e.g. "__metadata__"-like reserved ones) are not a finding
  }
  std::string head = st::serialize_header(tensors, order, h.metadata);
  uint64_t data = 0;
  for (const st::TensorEntry& t : tensors) data = std::max<uint64_t>(data, t.end);
  if (data > (uint64_t{1} << 24)) return;  // keep the fuzzer's memory bounded
  std::vector<unsigned char> file(head.begin(), head.end());
  file.resize(head.size() + data, 0);
  st::Header again = st::parse(file.data(), file.size());  // must not throw
  check_header(again, file.size());
  REQUIRE(again.tensors.size() == h.tensors.size());
  for (size_t i = 0; i < again.tensors.size(); ++i) {
    REQUIRE(again.tensors[i].name == h.tensors[i].name);
    REQUIRE(again.tensors[i].dtype == h.tensors[i].dtype);
    REQUIRE(again.tensors[i].shape == h.tensors[i].shape);
  }
  REQUIRE(again.metadata == h.metadata);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  st::Limits limits;
  limits.max_header_bytes = 1 << 20;  // the real limit is 100 MB; smaller inputs reach it
  st::Header h;
  try {
    h = st::parse(data, size, limits);
  } catch (const Error& e) {
    if (e.status() != FLAME_ERROR_INVALID_FORMAT) finding("parse failed with a status other than INVALID_FORMAT");
    return 0;
  }
  check_header(h, size);
  round_trip(h);
  return 0;
}

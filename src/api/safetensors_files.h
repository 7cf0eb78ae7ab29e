// The safetensors file work shared by the entry points of api_safetensors.cpp and api_params.cpp:
// writing named tensors to a file, reading the metadata argument, opening a file.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>
#include "io/file.h"
#include "io/safetensors.h"
#include "tensor/tensor.h"

namespace flame {

using StMetadata = std::vector<std::pair<std::string, std::string>>;

// The n_metadata key/value pairs of metadata_kv (2 * n strings), checked (NULLs, n's range).
StMetadata metadata_arg(const char* const* metadata_kv, int64_t n_metadata);

// Writes tensors[i] (all of c) under names[i] with metadata to path, in the Python package's layout,
// replacing path atomically. Validates the names (distinct, UTF-8, not reserved) before writing.
// Waits for the device; not allowed during a capture.
void save_safetensors(Context& c, const std::string& path, const std::vector<std::string>& names,
                      const std::vector<Tensor>& tensors, const StMetadata& metadata);

// The same with each tensor made only when its turn comes: tensors announces the names, dtypes and
// shapes (the header is written first), produce(i) returns tensor i (of that dtype and shape), so that
// at most one produced tensor is alive at a time (a model saved with fused tensors built on the GPU).
void save_safetensors_streamed(Context& c, const std::string& path, const std::vector<st::TensorEntry>& tensors,
                               const std::function<Tensor(size_t)>& produce, const StMetadata& metadata);

// An open, validated safetensors file (errors name the path).
struct OpenSafetensors {
  std::unique_ptr<io::MappedFile> file;
  st::Header header;
  const unsigned char* bytes_of(const st::TensorEntry& e) const { return file->data() + header.data_start + e.begin; }
};
OpenSafetensors open_safetensors(const std::string& path);

}  // namespace flame

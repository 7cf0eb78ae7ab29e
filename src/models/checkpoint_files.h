// The checkpoint files a model loads from, whatever their layout on disk, as one set of named
// tensors that can be streamed onto the GPU.
//
// Layouts CheckpointFiles::open(path, component) accepts:
//   - a single .safetensors file (BFL Flux, SGM SDXL, SD3.5, ComfyUI repacks): no config;
//   - a diffusers / transformers model folder: config.json plus one of
//     diffusion_pytorch_model.safetensors, model.safetensors, or the shards listed by
//     diffusion_pytorch_model.safetensors.index.json / model.safetensors.index.json ("weight_map");
//   - a diffusers pipeline folder (model_index.json) with a component ("unet", "transformer",
//     "vae", "text_encoder", "text_encoder_2", "text_encoder_3", ...): that component's subfolder,
//     which is a model folder as above.
// Every file is memory-mapped and its header validated (io/safetensors.h) before open returns; the
// JSON files are parsed by checkpoint_json.h. Anything malformed, truncated, foreign or inconsistent
// throws flame::Error naming the file (and the key where there is one), and nothing half-opened is
// returned: FLAME_ERROR_IO for a missing or unreadable file or folder, FLAME_ERROR_INVALID_FORMAT
// for bad content (bad JSON, an index whose weight_map names a missing shard, a key its shard does
// not hold or a shard holds unlisted, a key in two shards, a shard name leaving the folder,
// several weight files in one folder), FLAME_ERROR_INVALID_ARGUMENT for a bad request (a component
// the pipeline does not list, a component for a single file, an unknown key, rows out of range).
// Shard names must be plain file names; the shard files themselves may be symlinks (the Hugging
// Face cache links them into its blobs/ folder).
//
// Reading: read_into copies one stored tensor, or a range of its dim-0 rows, into a device tensor
// of the same element count (any shape, any dtype, any strides), converting on the GPU. The bytes
// go from the mapping (page cache) to the device in pieces of at most kStagingBytes: straight into
// the destination when it is dense and of the file's dtype, else through a device staging buffer
// of the file's dtype and ops::copy_into. The driver stages pageable copies through its own pinned
// buffers, in one thread; while a PinnedUploads scope is open (a model's load), large tensors go
// through two pinned buffers of FLAME's instead, filled by several threads (pinned_upload.h). Either
// way no host memory beyond the page cache and a bounded staging area is ever used, even for a 24 GB
// checkpoint. Files must not be shrunk in place while open (the mapping would fault).
//
// Prefix views: single files hold several components under key prefixes (known_component_prefixes
// lists them); with_prefix returns a view of the keys under one, with the prefix stripped, that
// reads from the same mapped files. Copies and views share the files and the load statistics.
// Every method is const and may be called from several threads at once (read_into serialises on
// the destination's context; the statistics have a lock of their own).
//
// Use (the model classes):
//   const CheckpointFiles files = CheckpointFiles::open(path, component);  // component: "" or "unet"...
//   const CheckpointFiles unet = files.component_prefixes().empty()
//                                    ? files : files.with_prefix("model.diffusion_model.");
//   detect the architecture and layout from unet.keys() (flux_keys.h, unet_keys.h, ...), then per
//   parameter: unet.read_into("conv_in.weight", param);                  // to param's dtype
//              unet.read_into("double_blocks.0.img_attn.qkv.weight", q, 0, inner);  // rows of a fused tensor
// Each read_into waits for the stream before its first upload (the driver does so for pageable
// copies): loading is not meant to overlap a training step.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>
#include "core/dtype.h"
#include "models/checkpoint_json.h"
#include "models/flux_keys.h"
#include "tensor/tensor.h"

namespace flame::models {

enum class CheckpointLayout { SingleFile, ModelFolder, ShardedModelFolder };

// The storage of one key: the file's dtype name ("F32", "F8_E4M3"), whether FLAME has that dtype
// (then `dtype` holds it), the tensor's bytes and the file that holds it.
struct StoredTensor {
  std::string dtype_name;
  bool supported = false;
  DType dtype = FLAME_DTYPE_F32;
  uint64_t bytes = 0;
  std::string file;
};

// Bytes read_into has moved from the files to the device and the host seconds it spent doing so
// (the last piece's conversion may still be running on the GPU: synchronise before reading a rate).
struct LoadStats {
  uint64_t bytes = 0;
  double seconds = 0;
  double gb_per_s() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }
};

class PinnedUploader;  // pinned_upload.h

constexpr size_t kStagingBytes = size_t(64) << 20;     // the most read_into moves per piece
constexpr size_t kMaxJsonFileBytes = size_t(64) << 20;  // config / index / model_index files

class CheckpointFiles {
  struct Files;  // the mapped files, their headers, the shared statistics and the pinned uploader

 public:
  // Opens path (a file or a folder, see above); component selects a pipeline folder's component
  // and must be empty otherwise.
  static CheckpointFiles open(const std::string& path, const std::string& component = std::string());

  CheckpointLayout layout() const { return layout_; }
  // The file or folder the tensors come from (for a pipeline, the component's folder).
  const std::string& source() const { return source_; }
  // config.json's text (validated as a JSON object); empty for a single file.
  const std::string& config_json() const { return config_json_; }
  // Every key of this view with its shape, sorted by name (byte order).
  const std::vector<KeyShape>& keys() const { return keys_; }
  bool contains(const std::string& key) const;
  // The storage of a key; FLAME_ERROR_INVALID_ARGUMENT naming the key and source when absent.
  const StoredTensor& stored(const std::string& key) const;

  // The keys that start with prefix, prefix stripped, reading from the same files. A prefix no key
  // carries: FLAME_ERROR_INVALID_ARGUMENT naming it. An empty prefix gives a copy of this view.
  CheckpointFiles with_prefix(const std::string& prefix) const;
  // Which of known_component_prefixes() some key of this view starts with, in that table's order.
  std::vector<std::string> component_prefixes() const;

  // Copies rows [row_begin, row_begin + rows) of key's dim 0 (rows = -1: to the end; a 0-d tensor
  // is one row) into dst, which must hold exactly that many elements, converting to dst's dtype.
  // Errors (naming the file and key): FLAME_ERROR_INVALID_ARGUMENT (unknown key, rows out of range,
  // element count), FLAME_ERROR_UNSUPPORTED (a dtype FLAME lacks), and those of the copy itself.
  // Not allowed during a graph capture. Bumps dst's version, like any in-place write.
  void read_into(const std::string& key, const Tensor& dst, int64_t row_begin = 0, int64_t rows = -1) const;

  // The safetensors "__metadata__" entries of the files (a key in several files: the first file's
  // value), sorted by key.
  std::map<std::string, std::string> metadata() const;

  // What read_into has moved so far through this object and every view or copy sharing its files.
  LoadStats load_stats() const;

  // While one is alive, read_into moves tensors of at least kPinnedMinBytes bound for ctx's device
  // through pinned host buffers (pinned_upload.h), for these files and every view or copy sharing
  // them; the destructor waits for those uploads to have read the buffers and frees them. When
  // pinned memory cannot be had, it changes nothing. One at a time per set of files.
  class PinnedUploads {
   public:
    PinnedUploads(const CheckpointFiles& files, Context& ctx);
    ~PinnedUploads();
    PinnedUploads(const PinnedUploads&) = delete;
    PinnedUploads& operator=(const PinnedUploads&) = delete;

   private:
    std::shared_ptr<Files> files_;
    std::unique_ptr<PinnedUploader> uploader_;
  };

 private:
  struct Entry {
    size_t file = 0;   // index into Files::files
    size_t tensor = 0; // index into that file's header.tensors
  };
  CheckpointFiles() = default;
  const Entry& entry_of(const std::string& key) const;

  std::shared_ptr<Files> files_;
  CheckpointLayout layout_ = CheckpointLayout::SingleFile;
  std::string source_, config_json_, prefix_;
  std::vector<KeyShape> keys_;         // sorted by name, prefix stripped
  std::vector<Entry> entries_;         // parallel to keys_
  std::vector<StoredTensor> stored_;   // parallel to keys_
};

// The key prefixes under which single files hold components: SGM SDXL, ComfyUI Flux, SD3.5.
const std::vector<std::string>& known_component_prefixes();

}  // namespace flame::models

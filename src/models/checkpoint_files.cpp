// CheckpointFiles (see the header; the JSON parsers are checkpoint_json.cpp): finding the weight
// files of a layout, mapping and validating them, joining their keys, checking a shard index
// against the shards, and streaming a stored tensor (or a range of its rows) to the GPU in bounded
// pieces.
#include "models/checkpoint_files.h"
#include "models/pinned_upload.h"
#include <dirent.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <fstream>
#include <mutex>
#include "core/error.h"
#include "io/file.h"
#include "io/safetensors.h"
#include "ops/ops.h"

namespace flame::models {
namespace {

const char* const kSingleWeightFiles[] = {"diffusion_pytorch_model.safetensors", "model.safetensors"};
const char* const kShardIndexFiles[] = {"diffusion_pytorch_model.safetensors.index.json", "model.safetensors.index.json"};

// ---- the file system ----

enum class PathKind { Missing, File, Folder, Other };

PathKind path_kind(const std::string& path) {
  struct stat s;
  if (::stat(path.c_str(), &s) != 0) return PathKind::Missing;
  if (S_ISREG(s.st_mode)) return PathKind::File;
  if (S_ISDIR(s.st_mode)) return PathKind::Folder;
  return PathKind::Other;
}

std::string join(const std::string& folder, const std::string& name) {
  return !folder.empty() && folder.back() == '/' ? folder + name : folder + "/" + name;
}

// The names in a folder ending with suffix, sorted (for error messages).
std::vector<std::string> files_ending_with(const std::string& folder, const std::string& suffix) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(folder.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n.size() >= suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0) names.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string quoted_list(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) s += (i ? ", '" : "'") + names[i] + "'";
  return s.empty() ? "none" : s;
}

// A small text file (config, index, model_index) read whole.
std::string read_text_file(const std::string& path) {
  FLAME_CHECK(path_kind(path) == PathKind::File, FLAME_ERROR_IO, path, " does not exist or is not a regular file");
  std::ifstream in(path, std::ios::binary);
  FLAME_CHECK(in, FLAME_ERROR_IO, "cannot open ", path);
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  FLAME_CHECK(size >= 0, FLAME_ERROR_IO, "cannot read the size of ", path);
  FLAME_CHECK(static_cast<uint64_t>(size) <= kMaxJsonFileBytes, FLAME_ERROR_INVALID_FORMAT, path, " is ", size,
              " bytes, more than the ", kMaxJsonFileBytes, " a JSON file of a checkpoint may have");
  in.seekg(0, std::ios::beg);
  std::string text(static_cast<size_t>(size), '\0');
  FLAME_CHECK(in.read(text.data(), size), FLAME_ERROR_IO, "cannot read ", path);
  return text;
}


// ---- mapped safetensors files ----

struct MappedSafetensors {
  std::string path;
  std::unique_ptr<io::MappedFile> map;
  st::Header header;
};

MappedSafetensors map_safetensors(const std::string& path) {
  MappedSafetensors f;
  f.path = path;
  f.map = std::make_unique<io::MappedFile>(path);  // FLAME_ERROR_IO naming the path
  try {
    f.header = st::parse(f.map->data(), f.map->size());
  } catch (const Error& e) {
    fail(e.status(), path, ": ", e.what());
  }
  return f;
}

}  // namespace

const std::vector<std::string>& known_component_prefixes() {
  static const std::vector<std::string> prefixes{
      "model.diffusion_model.",                // SDXL UNet (SGM), ComfyUI Flux, SD3.5 MMDiT
      "first_stage_model.",                    // VAE (SDXL, SD3.5)
      "conditioner.embedders.0.transformer.",  // SDXL CLIP-L
      "conditioner.embedders.1.model.",        // SDXL OpenCLIP bigG
      "text_encoders.clip_l.transformer.",     // SD3.5 CLIP-L
      "text_encoders.clip_g.transformer.",     // SD3.5 CLIP-G
      "text_encoders.t5xxl.transformer.",      // SD3.5 T5-XXL
  };
  return prefixes;
}

// ---- opening ----

struct CheckpointFiles::Files {
  std::vector<MappedSafetensors> files;
  mutable std::mutex stats_mutex;
  std::mutex pinned_mutex;              // guards pinned (CheckpointFiles::PinnedUploads sets it)
  PinnedUploader* pinned = nullptr;
  LoadStats stats;
};

namespace {

// A key of a file and where it lives, before the view is built.
struct FoundKey {
  const std::string* name;
  size_t file, tensor;
};

// Every key of every file, sorted by name; a key held by two files is an error naming both.
std::vector<FoundKey> join_keys(const std::vector<MappedSafetensors>& files) {
  std::vector<FoundKey> keys;
  for (size_t f = 0; f < files.size(); ++f)
    for (size_t t = 0; t < files[f].header.tensors.size(); ++t) keys.push_back({&files[f].header.tensors[t].name, f, t});
  std::sort(keys.begin(), keys.end(), [](const FoundKey& a, const FoundKey& b) { return *a.name < *b.name; });
  for (size_t i = 1; i < keys.size(); ++i)
    FLAME_CHECK(*keys[i].name != *keys[i - 1].name, FLAME_ERROR_INVALID_FORMAT, "the key '", printable(*keys[i].name),
                "' is in two shards: ", files[keys[i - 1].file].path, " and ", files[keys[i].file].path);
  return keys;
}

// The shards an index lists, mapped, after checking that the index and the shards agree exactly.
std::vector<MappedSafetensors> map_shards(const std::string& folder, const std::string& index_path) {
  const auto weight_map = parse_shard_index(read_text_file(index_path), index_path);
  std::vector<std::string> shard_names;
  for (const auto& kv : weight_map) shard_names.push_back(kv.second);
  std::sort(shard_names.begin(), shard_names.end());
  shard_names.erase(std::unique(shard_names.begin(), shard_names.end()), shard_names.end());
  std::vector<MappedSafetensors> files;
  for (const std::string& name : shard_names) {
    const std::string path = join(folder, name);
    if (path_kind(path) == PathKind::Missing) {
      const auto k = std::find_if(weight_map.begin(), weight_map.end(), [&](const auto& kv) { return kv.second == name; });
      fail(FLAME_ERROR_INVALID_FORMAT, index_path, ": key '", printable(k->first), "' is in the shard '", name,
           "', which does not exist in ", folder);
    }
    files.push_back(map_safetensors(path));
  }
  const std::vector<FoundKey> keys = join_keys(files);
  for (const auto& [key, shard] : weight_map) {
    auto it = std::lower_bound(keys.begin(), keys.end(), key, [](const FoundKey& a, const std::string& k) { return *a.name < k; });
    FLAME_CHECK(it != keys.end() && *it->name == key, FLAME_ERROR_INVALID_FORMAT, index_path, ": key '", printable(key),
                "' is listed in the shard '", shard, "', but ", join(folder, shard), " does not hold it");
    FLAME_CHECK(files[it->file].path == join(folder, shard), FLAME_ERROR_INVALID_FORMAT, index_path, ": key '", key,
                "' is listed in the shard '", shard, "', but it is in ", files[it->file].path);
  }
  if (keys.size() != weight_map.size()) {
    for (const FoundKey& k : keys) {
      auto it = std::lower_bound(weight_map.begin(), weight_map.end(), *k.name,
                                 [](const auto& kv, const std::string& n) { return kv.first < n; });
      FLAME_CHECK(it != weight_map.end() && it->first == *k.name, FLAME_ERROR_INVALID_FORMAT, files[k.file].path,
                  " holds the key '", printable(*k.name), "', which the index ", index_path, " does not list");
    }
  }
  return files;
}

// The weight files of a model folder and the layout they make.
std::vector<MappedSafetensors> map_model_folder(const std::string& folder, CheckpointLayout* layout) {
  std::vector<std::string> present;
  for (const char* n : kSingleWeightFiles)
    if (path_kind(join(folder, n)) != PathKind::Missing) present.push_back(n);
  for (const char* n : kShardIndexFiles)
    if (path_kind(join(folder, n)) != PathKind::Missing) present.push_back(n);
  if (present.empty()) {
    std::vector<std::string> others = files_ending_with(folder, ".safetensors");
    for (const std::string& b : files_ending_with(folder, ".bin")) others.push_back(b);
    fail(FLAME_ERROR_IO, folder, " has no weights: none of diffusion_pytorch_model.safetensors, model.safetensors or their "
         "*.safetensors.index.json (weight files there: ", quoted_list(others), ")");
  }
  FLAME_CHECK(present.size() == 1, FLAME_ERROR_INVALID_FORMAT, folder, " holds several sets of weights (",
              quoted_list(present), "): which one to load is ambiguous");
  const std::string path = join(folder, present[0]);
  const bool sharded = present[0].size() > 5 && present[0].compare(present[0].size() - 5, 5, ".json") == 0;
  *layout = sharded ? CheckpointLayout::ShardedModelFolder : CheckpointLayout::ModelFolder;
  if (sharded) return map_shards(folder, path);
  std::vector<MappedSafetensors> files;
  files.push_back(map_safetensors(path));
  return files;
}

// config.json of a model folder, checked to be a JSON object.
std::string read_config(const std::string& folder) {
  const std::string path = join(folder, "config.json");
  std::string text = read_text_file(path);
  check_json_object(text, path);
  return text;
}

// The folder of a pipeline's component, after checking that model_index.json lists it.
std::string component_folder(const std::string& pipeline, const std::string& component) {
  const std::string index_path = join(pipeline, "model_index.json");
  FLAME_CHECK(path_kind(index_path) != PathKind::Missing, FLAME_ERROR_INVALID_ARGUMENT, "component '", printable(component),
              "' asked of ", pipeline, ", which is not a diffusers pipeline folder (no model_index.json)");
  const std::vector<PipelineComponent> components = parse_model_index(read_text_file(index_path), index_path);
  std::vector<std::string> names;
  for (const PipelineComponent& c : components) names.push_back(c.name);
  FLAME_CHECK(std::find(names.begin(), names.end(), component) != names.end(), FLAME_ERROR_INVALID_ARGUMENT,
              index_path, " does not list the component '", printable(component), "' (it lists ", quoted_list(names), ")");
  const std::string folder = join(pipeline, component);
  FLAME_CHECK(path_kind(folder) == PathKind::Folder, FLAME_ERROR_IO, index_path, " lists the component '", printable(component),
              "', but ", folder, " is not a folder");
  return folder;
}

}  // namespace

CheckpointFiles CheckpointFiles::open(const std::string& path, const std::string& component) {
  const PathKind kind = path_kind(path);
  FLAME_CHECK(kind != PathKind::Missing, FLAME_ERROR_IO, path, " does not exist");
  FLAME_CHECK(kind != PathKind::Other, FLAME_ERROR_IO, path, " is neither a file nor a folder");
  CheckpointFiles cf;
  cf.files_ = std::make_shared<Files>();
  if (kind == PathKind::File) {
    FLAME_CHECK(component.empty(), FLAME_ERROR_INVALID_ARGUMENT, "component '", printable(component), "' asked of ", path,
                ", a single file (components are the folders of a diffusers pipeline; a single file's parts are "
                "views by key prefix)");
    cf.layout_ = CheckpointLayout::SingleFile;
    cf.source_ = path;
    cf.files_->files.push_back(map_safetensors(path));
  } else {
    std::string folder = path;
    if (!component.empty()) {
      FLAME_CHECK(is_plain_name(component), FLAME_ERROR_INVALID_ARGUMENT, "component '", printable(component),
                  "' is not a plain folder name");
      folder = component_folder(path, component);
    } else if (path_kind(join(path, "config.json")) == PathKind::Missing &&
               path_kind(join(path, "model_index.json")) != PathKind::Missing) {
      const std::string index_path = join(path, "model_index.json");
      std::vector<std::string> names;
      for (const PipelineComponent& c : parse_model_index(read_text_file(index_path), index_path)) names.push_back(c.name);
      fail(FLAME_ERROR_INVALID_ARGUMENT, path, " is a diffusers pipeline folder: name one of its components (",
           quoted_list(names), ")");
    }
    FLAME_CHECK(path_kind(join(folder, "config.json")) != PathKind::Missing, FLAME_ERROR_IO, folder,
                " has no config.json (a diffusers or transformers model folder has one beside its weights)");
    cf.source_ = folder;
    cf.config_json_ = read_config(folder);
    cf.files_->files = map_model_folder(folder, &cf.layout_);
  }
  for (const FoundKey& k : join_keys(cf.files_->files)) {
    const MappedSafetensors& f = cf.files_->files[k.file];
    const st::TensorEntry& e = f.header.tensors[k.tensor];
    cf.keys_.push_back({e.name, e.shape});
    cf.entries_.push_back({k.file, k.tensor});
    cf.stored_.push_back({e.dtype_name, e.supported, e.dtype, e.bytes(), f.path});
  }
  return cf;
}

// ---- the view ----

const CheckpointFiles::Entry& CheckpointFiles::entry_of(const std::string& key) const {
  auto it = std::lower_bound(keys_.begin(), keys_.end(), key, [](const KeyShape& a, const std::string& k) { return a.name < k; });
  FLAME_CHECK(it != keys_.end() && it->name == key, FLAME_ERROR_INVALID_ARGUMENT, source_, " has no key '", printable(prefix_ + key),
              "'");
  return entries_[static_cast<size_t>(it - keys_.begin())];
}

bool CheckpointFiles::contains(const std::string& key) const {
  auto it = std::lower_bound(keys_.begin(), keys_.end(), key, [](const KeyShape& a, const std::string& k) { return a.name < k; });
  return it != keys_.end() && it->name == key;
}

const StoredTensor& CheckpointFiles::stored(const std::string& key) const {
  const Entry& e = entry_of(key);
  return stored_[static_cast<size_t>(&e - entries_.data())];
}

CheckpointFiles CheckpointFiles::with_prefix(const std::string& prefix) const {
  CheckpointFiles v;
  v.files_ = files_;
  v.layout_ = layout_;
  v.source_ = source_;
  v.config_json_ = config_json_;
  v.prefix_ = prefix_ + prefix;
  // Keys are sorted, so the ones carrying prefix are one run and stay sorted once it is stripped.
  auto first = std::lower_bound(keys_.begin(), keys_.end(), prefix, [](const KeyShape& a, const std::string& p) { return a.name < p; });
  for (auto it = first; it != keys_.end() && it->name.compare(0, prefix.size(), prefix) == 0; ++it) {
    const size_t i = static_cast<size_t>(it - keys_.begin());
    v.keys_.push_back({it->name.substr(prefix.size()), it->shape});
    v.entries_.push_back(entries_[i]);
    v.stored_.push_back(stored_[i]);
  }
  FLAME_CHECK(!v.keys_.empty(), FLAME_ERROR_INVALID_ARGUMENT, source_, " has no key starting with '", v.prefix_, "'");
  return v;
}

std::vector<std::string> CheckpointFiles::component_prefixes() const {
  std::vector<std::string> found;
  for (const std::string& p : known_component_prefixes()) {
    auto it = std::lower_bound(keys_.begin(), keys_.end(), p, [](const KeyShape& a, const std::string& q) { return a.name < q; });
    if (it != keys_.end() && it->name.compare(0, p.size(), p) == 0) found.push_back(p);
  }
  return found;
}

std::map<std::string, std::string> CheckpointFiles::metadata() const {
  std::map<std::string, std::string> out;
  for (const MappedSafetensors& f : files_->files)
    for (const auto& [k, v] : f.header.metadata) out.emplace(k, v);
  return out;
}

LoadStats CheckpointFiles::load_stats() const {
  std::lock_guard<std::mutex> lock(files_->stats_mutex);
  return files_->stats;
}

// ---- reading ----

namespace {

// Asks the kernel to start reading [p, p + n) of a mapping ahead of its use (page-aligned; advice
// only, so failure is ignored).
void advise_will_need(const unsigned char* p, size_t n) {
  if (n == 0) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  ::madvise(reinterpret_cast<void*>(begin), reinterpret_cast<uintptr_t>(p) + n - begin, MADV_WILLNEED);
}

// A flat, history-free view of n elements of a contiguous tensor starting at element `first`.
Tensor flat_piece(const Tensor& t, int64_t first, int64_t n) { return make_view(t, {n}, {1}, t->offset + first); }

// Moves `bytes` bytes of the file's dtype `file_dtype` from src into the contiguous tensor dst
// (same element count), in pieces of at most kStagingBytes, converting on the GPU when the dtypes
// differ. Stream order keeps a piece's upload after the previous piece's conversion.
void upload_pieces(Context& c, const unsigned char* src, uint64_t bytes, DType file_dtype, const Tensor& dst,
                   PinnedUploader* pinned) {
  const size_t elem = dtype_size(file_dtype);
  const int64_t piece_elems = static_cast<int64_t>(kStagingBytes / elem);
  const int64_t total = static_cast<int64_t>(bytes / elem);
  Tensor staging;
  if (dst->dtype != file_dtype && total > 0) staging = ops::empty(c, {std::min(total, piece_elems)}, file_dtype);
  for (int64_t first = 0; first < total; first += piece_elems) {
    const int64_t n = std::min(piece_elems, total - first);
    const unsigned char* from = src + static_cast<size_t>(first) * elem;
    const size_t piece_bytes = static_cast<size_t>(n) * elem;
    if (first + n < total)
      advise_will_need(from + piece_bytes, static_cast<size_t>(std::min(piece_elems, total - first - n)) * elem);
    const CUdeviceptr to = staging ? staging->data() : dst->data() + static_cast<CUdeviceptr>(first) * elem;
    if (pinned && piece_bytes >= kPinnedMinBytes)
      pinned->upload(from, piece_bytes, to);
    else
      c.check(c.drv.cuMemcpyHtoDAsync(to, from, piece_bytes, c.stream), "cuMemcpyHtoDAsync");
    if (staging) ops::copy_into(flat_piece(dst, first, n), flat_piece(staging, 0, n));
  }
  if (!staging) dst->storage->version.fetch_add(1);  // an in-place write, as copy_into counts one
}

}  // namespace

void CheckpointFiles::read_into(const std::string& key, const Tensor& dst, int64_t row_begin, int64_t rows) const {
  const Entry& entry = entry_of(key);
  const MappedSafetensors& f = files_->files[entry.file];
  const st::TensorEntry& e = f.header.tensors[entry.tensor];
  const std::string where = f.path + ": key '" + e.name + "'";
  FLAME_CHECK(e.supported, FLAME_ERROR_UNSUPPORTED, where, " is stored as ", e.dtype_name, ", a dtype FLAME does not have");
  const int64_t total_rows = e.shape.empty() ? 1 : e.shape[0];
  int64_t row_elems = 1;
  for (size_t d = 1; d < e.shape.size(); ++d) row_elems *= e.shape[d];  // bounded: parse checked numel
  if (rows < 0) rows = total_rows - row_begin;
  FLAME_CHECK(row_begin >= 0 && row_begin <= total_rows && rows >= 0 && rows <= total_rows - row_begin,
              FLAME_ERROR_INVALID_ARGUMENT, where, ": rows [", row_begin, ", ", row_begin + rows, ") are not within its ",
              total_rows, " rows");
  const int64_t count = rows * row_elems;
  FLAME_CHECK(dst, FLAME_ERROR_INVALID_ARGUMENT, where, ": the destination tensor is null");
  FLAME_CHECK(dst->numel() == count, FLAME_ERROR_INVALID_ARGUMENT, where, ": the destination holds ", dst->numel(),
              " elements, but ", rows, " rows of shape ", shape_str(e.shape), " hold ", count);
  const auto start = std::chrono::steady_clock::now();
  const uint64_t bytes = static_cast<uint64_t>(count) * dtype_size(e.dtype);
  Context& c = dst->ctx();
  try {
    ContextScope scope(c);
    c.check_alive();
    c.forbid_in_capture("reading a checkpoint file");
    const unsigned char* src = f.map->data() + f.header.data_start + e.begin +
                               static_cast<uint64_t>(row_begin) * static_cast<uint64_t>(row_elems) * dtype_size(e.dtype);
    std::lock_guard<std::mutex> pinned_lock(files_->pinned_mutex);
    PinnedUploader* pinned = files_->pinned && &files_->pinned->ctx() == &c ? files_->pinned : nullptr;
    if (dst->contiguous()) {
      upload_pieces(c, src, bytes, e.dtype, dst, pinned);
    } else {  // strided destination: read densely, then scatter with one copy
      const Tensor dense = ops::empty(c, dst->shape, dst->dtype);
      upload_pieces(c, src, bytes, e.dtype, dense, pinned);
      ops::copy_into(dst, dense);
    }
  } catch (const Error& err) {
    fail(err.status(), where, ": ", err.what());
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::lock_guard<std::mutex> lock(files_->stats_mutex);
  files_->stats.bytes += bytes;
  files_->stats.seconds += seconds;
}

CheckpointFiles::PinnedUploads::PinnedUploads(const CheckpointFiles& files, Context& ctx)
    : files_(files.files_), uploader_(PinnedUploader::try_create(ctx)) {
  std::lock_guard<std::mutex> lock(files_->pinned_mutex);
  FLAME_CHECK(!files_->pinned, FLAME_ERROR_INTERNAL, "checkpoint files: pinned uploads are already open on ",
              files.source());
  files_->pinned = uploader_.get();
}

CheckpointFiles::PinnedUploads::~PinnedUploads() {
  std::lock_guard<std::mutex> lock(files_->pinned_mutex);
  files_->pinned = nullptr;
}  // uploader_'s destructor waits for its uploads and frees the buffers

}  // namespace flame::models

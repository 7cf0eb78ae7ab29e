// C entry points: safetensors load and save (flame.h "safetensors").
//
// A flame_safetensors_t owns the read-only mapping of one file and its validated header
// (io/safetensors.h); it holds a reference to its context, as tensors do. flame_safetensors_get
// copies a tensor's bytes from the mapping to a new device tensor with cuMemcpyHtoDAsync: from
// pageable memory the driver stages the bytes before the call returns, so the mapping may go right
// after. Saving lays the file out (safetensors.h), then streams each tensor, made contiguous on the
// device if needed, through a host buffer of at most 64 MiB into an AtomicFileWriter.
//
// A released handle is emptied (mapping and header freed), marked dead and parked in its context's
// dead_objects (the latest 4096), so that passing it again reports FLAME_ERROR_INVALID_HANDLE while
// the context lives, as for tensors.
#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>
#include "api/guard.h"
#include "api/safetensors_files.h"
#include "core/shape.h"
#include "ops/ops.h"

namespace flame {
constexpr uint64_t kSafetensorsMagic = 0xF1A3E5AF7E450001ull;
constexpr size_t kDeadObjectsKept = 4096;
constexpr size_t kSaveChunkBytes = size_t(64) << 20;
}  // namespace flame

struct flame_safetensors_s {
  uint64_t magic = flame::kDeadMagic;
  std::shared_ptr<flame::Context> ctx;
  std::string path;
  std::unique_ptr<flame::io::MappedFile> file;
  flame::st::Header header;
};

using namespace flame;

namespace {

flame_safetensors_s& file_of(flame_safetensors_t f) {
  FLAME_CHECK(f, FLAME_ERROR_INVALID_ARGUMENT, "file is NULL");
  FLAME_CHECK(f->magic == kSafetensorsMagic, FLAME_ERROR_INVALID_HANDLE,
              "file is not a live safetensors handle (released already?)");
  return *f;
}

const char* string_arg(const char* s, const char* name) {
  FLAME_CHECK(s, FLAME_ERROR_INVALID_ARGUMENT, name, " is NULL");
  return s;
}

// The entry called name; FLAME_ERROR_INVALID_ARGUMENT when the file has none, FLAME_ERROR_UNSUPPORTED
// when FLAME lacks its dtype.
const st::TensorEntry& readable_entry(const flame_safetensors_s& f, const char* name) {
  const st::TensorEntry* e = f.header.find(string_arg(name, "name"));
  FLAME_CHECK(e, FLAME_ERROR_INVALID_ARGUMENT, "no tensor called '", name, "' in ", f.path);
  FLAME_CHECK(e->supported, FLAME_ERROR_UNSUPPORTED, "tensor '", name, "' in ", f.path, " has dtype ", e->dtype_name,
              ", which FLAME does not have (it reads F32, F16, BF16, F64, I64, I32, U8 and BOOL)");
  return *e;
}

size_t index_arg(int64_t index, size_t count) {
  FLAME_CHECK(index >= 0 && static_cast<uint64_t>(index) < count, FLAME_ERROR_INVALID_ARGUMENT, "index ", index,
              " is not in [0, ", count, ")");
  return static_cast<size_t>(index);
}

}  // namespace

namespace flame {

StMetadata metadata_arg(const char* const* metadata_kv, int64_t n_metadata) {
  FLAME_CHECK(n_metadata >= 0 && static_cast<uint64_t>(n_metadata) <= st::kMaxEntries, FLAME_ERROR_INVALID_ARGUMENT,
              "n_metadata ", n_metadata, " is not in [0, ", st::kMaxEntries, "]");
  FLAME_CHECK(n_metadata == 0 || metadata_kv, FLAME_ERROR_INVALID_ARGUMENT, "metadata_kv is NULL");
  StMetadata metadata;
  for (int64_t i = 0; i < n_metadata; ++i) {
    const std::string k = "metadata_kv[" + std::to_string(2 * i) + "]", v = "metadata_kv[" + std::to_string(2 * i + 1) + "]";
    metadata.emplace_back(string_arg(metadata_kv[2 * i], k.c_str()), string_arg(metadata_kv[2 * i + 1], v.c_str()));
  }
  return metadata;
}

OpenSafetensors open_safetensors(const std::string& path) {
  OpenSafetensors f;
  f.file = std::make_unique<io::MappedFile>(path);
  try {
    f.header = st::parse(f.file->data(), f.file->size());
  } catch (const Error& e) {
    fail(e.status(), path, ": ", e.what());
  }
  return f;
}

void save_safetensors_streamed(Context& c, const std::string& path, const std::vector<st::TensorEntry>& tensors,
                               const std::function<Tensor(size_t)>& produce, const StMetadata& metadata) {
  std::vector<st::TensorEntry> entries = tensors;
  const std::vector<size_t> order = st::layout(entries, metadata);
  const std::string header = st::serialize_header(entries, order, metadata);

  LiveScope scope(c);
  c.forbid_in_capture("writing a safetensors file");
  size_t largest = 0;
  for (const st::TensorEntry& e : entries) largest = std::max<size_t>(largest, e.bytes());
  std::vector<unsigned char> buf(std::min(largest, kSaveChunkBytes));
  io::AtomicFileWriter out(path);
  out.write(header.data(), header.size());
  for (size_t i : order) {
    Tensor t = produce(i);
    FLAME_CHECK(t->dtype == entries[i].dtype && t->shape == entries[i].shape, FLAME_ERROR_INTERNAL, "saving ",
                entries[i].name, ": produced ", shape_str(t->shape), ", announced ", shape_str(entries[i].shape));
    if (!t->contiguous()) {  // row-major bytes on the device first
      Tensor dense = make_tensor(c, t->shape, t->dtype);
      ops::copy_into(dense, t);
      t = std::move(dense);
    }
    const size_t bytes = entries[i].bytes();
    for (size_t off = 0; off < bytes; off += buf.size()) {
      const size_t len = std::min(buf.size(), bytes - off);
      c.check(c.drv.cuMemcpyDtoHAsync(buf.data(), t->data() + off, len, c.stream), "cuMemcpyDtoHAsync");
      c.synchronize();
      out.write(buf.data(), len);
    }
  }
  out.commit();
}

void save_safetensors(Context& c, const std::string& path, const std::vector<std::string>& names,
                      const std::vector<Tensor>& tensors, const StMetadata& metadata) {
  std::vector<st::TensorEntry> entries(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    entries[i].name = names[i];
    entries[i].dtype = tensors[i]->dtype;
    entries[i].shape = tensors[i]->shape;
  }
  save_safetensors_streamed(c, path, entries, [&](size_t i) { return tensors[i]; }, metadata);
}

}  // namespace flame

extern "C" {

FLAME_API flame_status_t flame_safetensors_load(flame_ctx_t ctx, const char* path, flame_safetensors_t* file) {
  return api_call("flame_safetensors_load", [&] {
    out_param(file, "file");
    Context& c = context_of(ctx);
    auto h = std::make_unique<flame_safetensors_s>();
    h->path = string_arg(path, "path");
    OpenSafetensors f = open_safetensors(h->path);
    h->file = std::move(f.file);
    h->header = std::move(f.header);
    h->ctx = c.shared_from_this();
    h->magic = kSafetensorsMagic;
    *file = h.release();
  });
}

FLAME_API void flame_safetensors_release(flame_safetensors_t file) {
  if (!file || file->magic != kSafetensorsMagic) return;
  try {
    std::shared_ptr<Context> keep = std::move(file->ctx);  // the context outlives this function
    std::lock_guard<std::recursive_mutex> lock(keep->mutex);
    file->magic = kDeadMagic;
    file->file.reset();
    file->header = st::Header();
    file->path.clear();
    keep->dead_objects.push_back(std::shared_ptr<flame_safetensors_s>(file));
    if (keep->dead_objects.size() > kDeadObjectsKept) keep->dead_objects.pop_front();
  } catch (...) {
    // push_back can only fail for lack of host memory: the handle is then freed at once (the
    // shared_ptr constructor deletes it if it throws) or was already parked.
  }
}

FLAME_API flame_status_t flame_safetensors_count(flame_safetensors_t file, int64_t* count) {
  return api_call("flame_safetensors_count", [&] {
    auto* out = out_param(count, "count");
    *out = static_cast<int64_t>(file_of(file).header.tensors.size());
  });
}

FLAME_API flame_status_t flame_safetensors_name(flame_safetensors_t file, int64_t index, const char** name) {
  return api_call("flame_safetensors_name", [&] {
    auto* out = out_param(name, "name");
    const auto& tensors = file_of(file).header.tensors;
    *out = tensors[index_arg(index, tensors.size())].name.c_str();
  });
}

FLAME_API flame_status_t flame_safetensors_info(flame_safetensors_t file, const char* name, flame_dtype_t* dtype, int64_t* shape,
                                                int32_t capacity, int32_t* ndim) {
  return api_call("flame_safetensors_info", [&] {
    FLAME_CHECK(dtype, FLAME_ERROR_INVALID_ARGUMENT, "dtype is NULL");
    auto* nd = out_param(ndim, "ndim");
    const st::TensorEntry& e = readable_entry(file_of(file), name);
    const auto n = static_cast<int32_t>(e.shape.size());
    if (shape) {
      FLAME_CHECK(capacity >= n, FLAME_ERROR_INVALID_ARGUMENT, "capacity ", capacity, " is below ndim ", n);
      std::copy(e.shape.begin(), e.shape.end(), shape);
    }
    *dtype = e.dtype;
    *nd = n;
  });
}

FLAME_API flame_status_t flame_safetensors_get(flame_safetensors_t file, const char* name, flame_tensor_t* out) {
  return api_call("flame_safetensors_get", [&] {
    out_param(out, "out");
    const flame_safetensors_s& f = file_of(file);
    const st::TensorEntry& e = readable_entry(f, name);
    FLAME_CHECK(e.shape.size() <= FLAME_MAX_DIMS, FLAME_ERROR_UNSUPPORTED, "tensor '", name, "' in ", f.path, " has ",
                e.shape.size(), " dims; FLAME tensors have at most ", FLAME_MAX_DIMS);
    Context& c = *f.ctx;
    LiveScope scope(c);
    c.forbid_in_capture("reading a safetensors file");
    Tensor t = make_tensor(c, e.shape, e.dtype);
    const size_t bytes = static_cast<size_t>(t->numel()) * t->elem_size();
    FLAME_CHECK(bytes == e.bytes(), FLAME_ERROR_INTERNAL, "tensor '", name, "': ", bytes, " bytes expected, the file has ",
                e.bytes());  // parse() checked this against the format's sizes, which equal FLAME's
    if (bytes)
      c.check(c.drv.cuMemcpyHtoDAsync(t->data(), f.file->data() + f.header.data_start + e.begin, bytes, c.stream),
              "cuMemcpyHtoDAsync");
    *out = wrap(std::move(t));
  });
}

FLAME_API flame_status_t flame_safetensors_metadata_count(flame_safetensors_t file, int64_t* count) {
  return api_call("flame_safetensors_metadata_count", [&] {
    auto* out = out_param(count, "count");
    *out = static_cast<int64_t>(file_of(file).header.metadata.size());
  });
}

FLAME_API flame_status_t flame_safetensors_metadata_key(flame_safetensors_t file, int64_t index, const char** key) {
  return api_call("flame_safetensors_metadata_key", [&] {
    auto* out = out_param(key, "key");
    const auto& md = file_of(file).header.metadata;
    *out = md[index_arg(index, md.size())].first.c_str();
  });
}

FLAME_API flame_status_t flame_safetensors_metadata(flame_safetensors_t file, const char* key, const char** value) {
  return api_call("flame_safetensors_metadata", [&] {
    auto* out = out_param(value, "value");
    const std::string* v = file_of(file).header.find_metadata(string_arg(key, "key"));
    *out = v ? v->c_str() : nullptr;
  });
}

FLAME_API flame_status_t flame_safetensors_save(flame_ctx_t ctx, const char* path, const char* const* names,
                                                const flame_tensor_t* tensors, int64_t n, const char* const* metadata_kv,
                                                int64_t n_metadata) {
  return api_call("flame_safetensors_save", [&] {
    Context& c = context_of(ctx);
    const std::string target = string_arg(path, "path");
    FLAME_CHECK(n >= 0 && static_cast<uint64_t>(n) <= st::kMaxEntries, FLAME_ERROR_INVALID_ARGUMENT, "n ", n,
                " is not in [0, ", st::kMaxEntries, "]");
    FLAME_CHECK(n_metadata >= 0 && static_cast<uint64_t>(n_metadata) <= st::kMaxEntries, FLAME_ERROR_INVALID_ARGUMENT,
                "n_metadata ", n_metadata, " is not in [0, ", st::kMaxEntries, "]");
    FLAME_CHECK(n == 0 || names, FLAME_ERROR_INVALID_ARGUMENT, "names is NULL");
    FLAME_CHECK(n == 0 || tensors, FLAME_ERROR_INVALID_ARGUMENT, "tensors is NULL");
    FLAME_CHECK(n_metadata == 0 || metadata_kv, FLAME_ERROR_INVALID_ARGUMENT, "metadata_kv is NULL");

    std::vector<Tensor> ts;
    std::vector<std::string> ns;
    for (int64_t i = 0; i < n; ++i) {
      const std::string arg = "tensors[" + std::to_string(i) + "]";
      const Tensor& t = unwrap(tensors[i], arg.c_str());
      FLAME_CHECK(&t->ctx() == &c, FLAME_ERROR_INVALID_ARGUMENT, arg, " belongs to another context");
      ns.emplace_back(string_arg(names[i], ("names[" + std::to_string(i) + "]").c_str()));
      ts.push_back(t);
    }
    save_safetensors(c, target, ns, ts, metadata_arg(metadata_kv, n_metadata));
  });
}

}  // extern "C"

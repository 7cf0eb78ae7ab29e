// C entry points: named parameter lists (flame.h "Named parameter lists").
//
// A flame_params_t holds, per entry, its name and a handle of its own to the tensor (made with
// wrap_lent, so never owned by a handle scope, and distinct from the caller's handle, whose
// references the caller keeps counting alone), plus a name -> index map. Saving hands names and
// tensors to the safetensors writer of api_safetensors.cpp. Loading opens and validates the file,
// matches every entry (names, shapes, dtypes, the strictness flags) and stages what needs converting
// or scattering into strided memory on the device, all before the first write; then dense entries
// of the file's dtype are copied from the mapping straight into place and staged ones by copy_into.
// After validation only a device fault can stop the writes.
//
// A released list is emptied, marked dead and parked in its context's dead_objects (the latest
// 4096), so that passing it again reports FLAME_ERROR_INVALID_HANDLE while the context lives.
#include <algorithm>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>
#include "api/guard.h"
#include "api/params_list.h"
#include "api/safetensors_files.h"
#include "ops/ops.h"

namespace flame {
constexpr uint64_t kParamsMagic = 0xF1A3E9A7A3500001ull;
constexpr size_t kParamsDeadKept = 4096;
constexpr size_t kNamesListed = 8;  // names an error message lists before "and N more"
constexpr uint32_t kParamsLoadFlags =
    FLAME_PARAMS_LOAD_ALLOW_MISSING | FLAME_PARAMS_LOAD_ALLOW_UNEXPECTED | FLAME_PARAMS_LOAD_CONVERT_DTYPE;
}  // namespace flame

struct flame_params_s {
  uint64_t magic = flame::kDeadMagic;
  std::shared_ptr<flame::Context> ctx;
  std::vector<std::string> names;
  std::vector<flame_tensor_t> handles;  // the list's own references
  std::unordered_map<std::string, size_t> index;
};

using namespace flame;

namespace {

flame_params_s& params_of(flame_params_t p) {
  FLAME_CHECK(p, FLAME_ERROR_INVALID_ARGUMENT, "params is NULL");
  FLAME_CHECK(p->magic == kParamsMagic, FLAME_ERROR_INVALID_HANDLE, "params is not a live parameter list (released already?)");
  return *p;
}

const char* text_arg(const char* s, const char* name) {
  FLAME_CHECK(s, FLAME_ERROR_INVALID_ARGUMENT, name, " is NULL");
  return s;
}

size_t entry_index(int64_t index, size_t count) {
  FLAME_CHECK(index >= 0 && static_cast<uint64_t>(index) < count, FLAME_ERROR_INVALID_ARGUMENT, "index ", index,
              " is not in [0, ", count, ")");
  return static_cast<size_t>(index);
}

// "'a', 'b' and 3 more" for error messages.
std::string name_list(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < kNamesListed; ++i) s += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > kNamesListed) s += " and " + std::to_string(names.size() - kNamesListed) + " more";
  return s;
}

// One entry's part of a load: the file tensor it reads, and the staged copy when it is not a
// dense tensor of the file's dtype (else it is written straight from the mapping).
struct LoadStep {
  size_t entry;
  const st::TensorEntry* file_tensor;
  Tensor staged;
};

// Matches the list against the file: strictness, then every matched entry's dtype and shape.
std::vector<LoadStep> plan_load(const flame_params_s& p, const st::Header& header, const std::string& path, uint32_t flags) {
  std::vector<std::string> missing, unexpected;
  std::vector<LoadStep> steps;
  for (size_t i = 0; i < p.names.size(); ++i) {
    const st::TensorEntry* e = header.find(p.names[i]);
    if (e) steps.push_back({i, e, nullptr});
    else missing.push_back(p.names[i]);
  }
  for (const st::TensorEntry& e : header.tensors)
    if (!p.index.count(e.name)) unexpected.push_back(e.name);
  FLAME_CHECK(missing.empty() || (flags & FLAME_PARAMS_LOAD_ALLOW_MISSING), FLAME_ERROR_INVALID_ARGUMENT, path, " lacks ",
              missing.size(), " of the list's tensors: ", name_list(missing),
              " (FLAME_PARAMS_LOAD_ALLOW_MISSING keeps their values)");
  FLAME_CHECK(unexpected.empty() || (flags & FLAME_PARAMS_LOAD_ALLOW_UNEXPECTED), FLAME_ERROR_INVALID_ARGUMENT, path,
              " has ", unexpected.size(), " tensor(s) the list does not name: ", name_list(unexpected),
              " (FLAME_PARAMS_LOAD_ALLOW_UNEXPECTED ignores them)");
  for (const LoadStep& s : steps) {
    const st::TensorEntry& e = *s.file_tensor;
    const Tensor& t = p.handles[s.entry]->t;
    FLAME_CHECK(e.supported, FLAME_ERROR_UNSUPPORTED, "tensor '", e.name, "' in ", path, " has dtype ", e.dtype_name,
                ", which FLAME does not have");
    FLAME_CHECK(e.shape == t->shape, FLAME_ERROR_SHAPE_MISMATCH, "tensor '", e.name, "' has shape ", shape_str(e.shape),
                " in ", path, " but ", shape_str(t->shape), " in the list");
    FLAME_CHECK(e.dtype == t->dtype || (flags & FLAME_PARAMS_LOAD_CONVERT_DTYPE), FLAME_ERROR_DTYPE_MISMATCH, "tensor '",
                e.name, "' has dtype ", dtype_name(e.dtype), " in ", path, " but ", dtype_name(t->dtype),
                " in the list (FLAME_PARAMS_LOAD_CONVERT_DTYPE converts it)");
  }
  return steps;
}

}  // namespace

flame_params_t flame::make_params_list(Context& ctx, const std::vector<std::pair<std::string, Tensor>>& entries) {
  auto p = std::make_unique<flame_params_s>();
  p->ctx = ctx.shared_from_this();
  p->names.reserve(entries.size());
  p->handles.reserve(entries.size());
  struct ReleaseOnFailure {  // the handles made so far, if a later one fails
    flame_params_s& p;
    bool done = false;
    ~ReleaseOnFailure() {
      if (!done)
        for (flame_tensor_t h : p.handles) release_handle(h);
    }
  } guard{*p};
  for (const auto& [name, t] : entries) {
    FLAME_CHECK(p->index.emplace(name, p->names.size()).second, FLAME_ERROR_INTERNAL, "name '", name,
                "' twice in a list");
    p->names.push_back(name);
    p->handles.push_back(wrap_lent(t));
  }
  guard.done = true;
  p->magic = kParamsMagic;
  return p.release();
}

std::vector<std::pair<std::string, Tensor>> flame::params_list_entries(flame_params_t params, const char* arg) {
  FLAME_CHECK(params, FLAME_ERROR_INVALID_ARGUMENT, arg, " is NULL");
  FLAME_CHECK(params->magic == kParamsMagic, FLAME_ERROR_INVALID_HANDLE, arg,
              " is not a live parameter list (released already?)");
  std::vector<std::pair<std::string, Tensor>> out;
  out.reserve(params->names.size());
  for (size_t i = 0; i < params->names.size(); ++i) {
    FLAME_CHECK(!holds_no_data(*params->handles[i]->t), FLAME_ERROR_INVALID_ARGUMENT, arg, " entry \"", params->names[i],
                "\" is a model parameter sharded over ranks (flame_zero_create stage 3): it holds no values of its own "
                "(flame_zero_gather_params gathers them)");
    out.emplace_back(params->names[i], params->handles[i]->t);
  }
  return out;
}

extern "C" {

FLAME_API flame_status_t flame_params_create(flame_ctx_t ctx, flame_params_t* params) {
  return api_call("flame_params_create", [&] {
    out_param(params, "params");
    Context& c = context_of(ctx);
    auto p = std::make_unique<flame_params_s>();
    p->ctx = c.shared_from_this();
    p->magic = kParamsMagic;
    *params = p.release();
  });
}

FLAME_API void flame_params_release(flame_params_t params) {
  if (!params || params->magic != kParamsMagic) return;
  std::shared_ptr<Context> keep = std::move(params->ctx);  // the context outlives this function
  std::lock_guard<std::recursive_mutex> lock(keep->mutex);
  params->magic = kDeadMagic;
  for (flame_tensor_t h : params->handles) release_handle(h);
  params->handles.clear();
  params->names.clear();
  params->index.clear();
  try {
    keep->dead_objects.push_back(std::shared_ptr<flame_params_s>(params));
    if (keep->dead_objects.size() > kParamsDeadKept) keep->dead_objects.pop_front();
  } catch (...) {  // out of host memory: shared_ptr's constructor deleted the handle
  }
}

FLAME_API flame_status_t flame_params_add(flame_params_t params, const char* name, flame_tensor_t t) {
  return api_call("flame_params_add", [&] {
    flame_params_s& p = params_of(params);
    const std::string n = text_arg(name, "name");
    const Tensor& x = unwrap(t, "t");
    FLAME_CHECK(&x->ctx() == p.ctx.get(), FLAME_ERROR_INVALID_ARGUMENT, "t belongs to another context than params");
    FLAME_CHECK(!n.empty(), FLAME_ERROR_INVALID_ARGUMENT, "name is empty");
    FLAME_CHECK(n != "__metadata__", FLAME_ERROR_INVALID_ARGUMENT, "name '__metadata__' is reserved by safetensors");
    FLAME_CHECK(st::valid_utf8(n.data(), n.size()), FLAME_ERROR_INVALID_ARGUMENT, "name is not valid UTF-8");
    std::lock_guard<std::recursive_mutex> lock(p.ctx->mutex);
    FLAME_CHECK(!p.index.count(n), FLAME_ERROR_INVALID_ARGUMENT, "name '", n, "' is in the list already");
    FLAME_CHECK(p.names.size() < st::kMaxEntries, FLAME_ERROR_INVALID_ARGUMENT, "the list has ", st::kMaxEntries,
                " entries, the most a safetensors file holds");
    // Reserve everything first: after the handle is made nothing can fail.
    p.names.reserve(p.names.size() + 1);
    p.handles.reserve(p.handles.size() + 1);
    auto slot = p.index.emplace(n, p.names.size());
    try {
      p.names.push_back(n);
      p.handles.push_back(wrap_lent(x));
    } catch (...) {
      p.index.erase(slot.first);
      if (p.names.size() > p.handles.size()) p.names.pop_back();
      throw;
    }
  });
}

FLAME_API flame_status_t flame_params_count(flame_params_t params, int64_t* count) {
  return api_call("flame_params_count", [&] {
    auto* out = out_param(count, "count");
    *out = static_cast<int64_t>(params_of(params).names.size());
  });
}

FLAME_API flame_status_t flame_params_name(flame_params_t params, int64_t index, const char** name) {
  return api_call("flame_params_name", [&] {
    auto* out = out_param(name, "name");
    const flame_params_s& p = params_of(params);
    *out = p.names[entry_index(index, p.names.size())].c_str();
  });
}

FLAME_API flame_status_t flame_params_tensor(flame_params_t params, int64_t index, flame_tensor_t* t) {
  return api_call("flame_params_tensor", [&] {
    auto* out = out_param(t, "t");
    const flame_params_s& p = params_of(params);
    *out = p.handles[entry_index(index, p.handles.size())];
  });
}

FLAME_API flame_status_t flame_params_tensors(flame_params_t params, const flame_tensor_t** tensors) {
  return api_call("flame_params_tensors", [&] {
    auto* out = out_param(tensors, "tensors");
    const flame_params_s& p = params_of(params);
    *out = p.handles.empty() ? nullptr : p.handles.data();
  });
}

FLAME_API flame_status_t flame_params_find(flame_params_t params, const char* name, flame_tensor_t* t) {
  return api_call("flame_params_find", [&] {
    auto* out = out_param(t, "t");
    const flame_params_s& p = params_of(params);
    auto it = p.index.find(text_arg(name, "name"));
    if (it != p.index.end()) *out = p.handles[it->second];
  });
}

FLAME_API flame_status_t flame_params_save_safetensors(flame_params_t params, const char* path, const char* const* metadata_kv,
                                                       int64_t n_metadata) {
  return api_call("flame_params_save_safetensors", [&] {
    flame_params_s& p = params_of(params);
    const std::string target = text_arg(path, "path");
    const StMetadata metadata = metadata_arg(metadata_kv, n_metadata);
    std::vector<Tensor> tensors;
    for (flame_tensor_t h : p.handles) tensors.push_back(h->t);
    save_safetensors(*p.ctx, target, p.names, tensors, metadata);
  });
}

FLAME_API flame_status_t flame_params_load_safetensors(flame_params_t params, const char* path, uint32_t flags) {
  return api_call("flame_params_load_safetensors", [&] {
    flame_params_s& p = params_of(params);
    const std::string source = text_arg(path, "path");
    FLAME_CHECK((flags & ~kParamsLoadFlags) == 0, FLAME_ERROR_INVALID_ARGUMENT, "flags 0x", std::hex, flags,
                " has bits that are not FLAME_PARAMS_LOAD_* flags");
    Context& c = *p.ctx;
    LiveScope scope(c);
    c.forbid_in_capture("reading a safetensors file");
    const OpenSafetensors file = open_safetensors(source);
    std::vector<LoadStep> steps = plan_load(p, file.header, source, flags);
    for (LoadStep& s : steps) {  // stage what cannot be copied straight into place (may run out of memory)
      const Tensor& t = p.handles[s.entry]->t;
      const st::TensorEntry& e = *s.file_tensor;
      if (t->contiguous() && e.dtype == t->dtype) continue;
      s.staged = ops::from_host(c, file.bytes_of(e), e.bytes(), e.shape, e.dtype);
    }
    for (const LoadStep& s : steps) {  // from here on only a device fault can fail
      const Tensor& t = p.handles[s.entry]->t;
      const st::TensorEntry& e = *s.file_tensor;
      if (s.staged) {
        ops::copy_into(t, s.staged);
      } else if (e.bytes()) {
        c.check(c.drv.cuMemcpyHtoDAsync(t->data(), file.bytes_of(e), e.bytes(), c.stream), "cuMemcpyHtoDAsync");
        t->storage->version.fetch_add(1);  // an in-place write, as far as saved tensors are concerned
      }
    }
  });
}

}  // extern "C"

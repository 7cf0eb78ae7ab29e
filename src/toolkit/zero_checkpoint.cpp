// Checkpoints of ZeRO training: see zero_checkpoint.h and flame_zero_save_shards in flame.h.
//
// Saving a rank's shard copies its owned elements (parameter values from the parameter, or from its
// shard with stage 3; moments and master weights as the sharded optimizer keeps them) to the host
// tensor by tensor. The gathered file assembles each tensor on every rank (zeros, this rank's owned
// elements copied in, an all-reduce sum: the owned ranges are disjoint, so the sum is exact) and
// rank 0 writes it; every rank issues the same collectives in the same order. Loading reads and
// checks every file of the set, copies the ranges this rank now needs into new device tensors, and
// only then replaces the parameters' values and the optimizer's state.
#include "toolkit/zero_checkpoint.h"
#include <algorithm>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include "core/error.h"
#include "io/file.h"
#include "ops/ops.h"

namespace flame {

const char* const kZeroShardKey = "flame.zero_shard";

namespace {

using json = nlohmann::json;
constexpr size_t kChunkBytes = size_t(64) << 20;


Tensor* slot(OptimParam& p, size_t k, size_t n_slots) {
  if (k == n_slots) return &p.master;
  return k == 0 ? &p.m : (k == 1 ? &p.v : &p.vmax);
}
std::string tensor_name(size_t i, size_t k, const std::vector<std::string>& slots) {
  return k == slots.size() ? "master." + std::to_string(i) : "state." + std::to_string(i) + "." + slots[k];
}
// Shapes here were checked (the parser's, or the metadata's bounded dims): a product without a zero
// fits. A zero dimension is looked for first: the parser's [2^40, 2^23, 0] holds no elements, but its
// first two dimensions alone overflow int64.
int64_t numel_of(const Shape& s) {
  if (std::find(s.begin(), s.end(), int64_t{0}) != s.end()) return 0;
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}
DType state_dtype(DType param) { return param == FLAME_DTYPE_F64 ? FLAME_DTYPE_F64 : FLAME_DTYPE_F32; }

std::string base_name(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}
std::string dir_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
}

std::vector<OptimParam*> all_params(Optimizer& opt) {
  std::vector<OptimParam*> out;
  for (OptimGroup& g : opt.groups())
    for (OptimParam& p : g.params) out.push_back(&p);
  return out;
}

// The rank's elements of p's value as a 1-D contiguous tensor (null when it owns none).
Tensor owned_value(OptimParam& p) {
  const int64_t count = p.shard_hi - p.shard_lo;
  if (count <= 0) return Tensor();
  if (p.shard_value) return p.shard_value;
  return make_view(p.param, {count}, {1}, p.param->offset + p.shard_lo);
}

const json& field(const json& obj, const char* name, const std::string& where) {
  FLAME_CHECK(obj.is_object() && obj.contains(name), FLAME_ERROR_INVALID_FORMAT, where, " has no \"", name, "\"");
  return obj.at(name);
}
int64_t integer(const json& obj, const char* name, const std::string& where) {
  const json& v = field(obj, name, where);
  FLAME_CHECK(v.is_number_integer(), FLAME_ERROR_INVALID_FORMAT, where, ": \"", name, "\" is not an integer");
  return v.get<int64_t>();
}

json metadata_json(ZeroOptimizer& z, int64_t rank, int64_t world, const std::vector<std::string>& files, bool whole) {
  Optimizer& opt = z.optimizer();
  json lrs = json::array(), params = json::array();
  for (OptimGroup& g : opt.groups()) lrs.push_back(g.opts.lr);
  for (OptimParam* p : all_params(opt)) {
    const int64_t lo = whole ? 0 : p->shard_lo, hi = whole ? p->param->numel() : p->shard_hi;
    params.push_back({{"shape", p->param->shape}, {"dtype", dtype_name(p->param->dtype)}, {"lo", lo}, {"hi", hi}});
  }
  const RoundingRng& rng = opt.rounding_rng();
  return {{"version", 1}, {"world", world}, {"rank", rank}, {"kind", optimizer_kind_name(opt.kind())}, {"step", opt.step_count()},
          {"rounding_rng", rng.ready ? json{{"seed", rng.seed}, {"offset", rng.offset}} : json(nullptr)},
          {"lr", lrs}, {"files", files}, {"params", params}};
}

// Writes a safetensors file whose tensors (entries: name, dtype, shape) come from tensor_of(i), called
// in the file's order; with write false nothing is written but tensor_of is still called in that
// order (the other ranks of a gathered save, which must join the same collectives).
void write_file(Context& c, const std::string& path, std::vector<st::TensorEntry> entries,
                const std::vector<std::pair<std::string, std::string>>& metadata,
                const std::function<Tensor(size_t)>& tensor_of, bool write) {
  const std::vector<size_t> order = st::layout(entries, metadata);
  std::unique_ptr<io::AtomicFileWriter> out;
  std::vector<unsigned char> buf;
  // A write error stops the writing, not the loop: the other ranks' collectives still need this one.
  flame_status_t failed = FLAME_OK;
  std::string message;
  const auto guarded = [&](const std::function<void()>& f) {
    if (!write || failed != FLAME_OK) return;
    try {
      f();
    } catch (const Error& e) {
      failed = e.status();
      message = e.what();
    }
  };
  guarded([&] {
    size_t largest = 0;
    for (const st::TensorEntry& e : entries) largest = std::max<size_t>(largest, e.bytes());
    buf.resize(std::max<size_t>(1, std::min(largest, kChunkBytes)));
    out = std::make_unique<io::AtomicFileWriter>(path);
    const std::string header = st::serialize_header(entries, order, metadata);
    out->write(header.data(), header.size());
  });
  for (size_t i : order) {
    const Tensor t = tensor_of(i);
    guarded([&] {
      const size_t bytes = entries[i].bytes();
      FLAME_CHECK(t && t->contiguous() && static_cast<size_t>(t->numel()) * t->elem_size() == bytes,
                  FLAME_ERROR_INTERNAL, "a checkpoint tensor does not match its entry");
      for (size_t off = 0; off < bytes; off += buf.size()) {
        const size_t len = std::min(buf.size(), bytes - off);
        c.check(c.drv.cuMemcpyDtoHAsync(buf.data(), t->data() + off, len, c.stream), "cuMemcpyDtoHAsync");
        c.synchronize();
        out->write(buf.data(), len);
      }
    });
  }
  guarded([&] { out->commit(); });
  if (failed != FLAME_OK) fail(failed, message);
}

// Which slots (kind's slots, then master) hold state on any rank, per parameter (collective).
std::vector<std::vector<bool>> present_anywhere(ZeroOptimizer& z, const std::vector<OptimParam*>& params, size_t n_slots) {
  Context& c = z.ctx();
  std::vector<float> flags(params.size() * (n_slots + 1), 0.0f);
  for (size_t i = 0; i < params.size(); ++i)
    for (size_t k = 0; k <= n_slots; ++k) flags[i * (n_slots + 1) + k] = *slot(*params[i], k, n_slots) ? 1.0f : 0.0f;
  std::vector<std::vector<bool>> out(params.size(), std::vector<bool>(n_slots + 1, false));
  if (flags.empty()) return out;
  Tensor t = make_tensor(c, {static_cast<int64_t>(flags.size())}, FLAME_DTYPE_F32);
  c.check(c.drv.cuMemcpyHtoDAsync(t->data(), flags.data(), flags.size() * sizeof(float), c.stream), "cuMemcpyHtoDAsync");
  z.comm().all_reduce(t, FLAME_REDUCE_SUM);
  z.comm().synchronize();
  c.check(c.drv.cuMemcpyDtoHAsync(flags.data(), t->data(), flags.size() * sizeof(float), c.stream), "cuMemcpyDtoHAsync");
  c.synchronize();
  for (size_t i = 0; i < params.size(); ++i)
    for (size_t k = 0; k <= n_slots; ++k) out[i][k] = flags[i * (n_slots + 1) + k] > 0.0f;
  return out;
}

}  // namespace

std::string zero_shard_file_name(const std::string& prefix, int64_t rank, int64_t world) {
  return prefix + "-" + std::to_string(rank) + "-of-" + std::to_string(world) + ".safetensors";
}

ZeroShardFile parse_zero_shard_file(const st::Header& h, const std::string& path) {
  ZeroShardFile f;
  f.path = path;
  f.header = &h;
  const std::string* text = h.find_metadata(kZeroShardKey);
  FLAME_CHECK(text, FLAME_ERROR_INVALID_FORMAT, path, " is not a FLAME ZeRO checkpoint (no \"", kZeroShardKey, "\" metadata)");
  const json meta = json::parse(*text, nullptr, false);
  const std::string where = path + " (" + kZeroShardKey + ")";
  FLAME_CHECK(!meta.is_discarded() && meta.is_object(), FLAME_ERROR_INVALID_FORMAT, where, " is not a JSON object");
  FLAME_CHECK(integer(meta, "version", where) == 1, FLAME_ERROR_INVALID_FORMAT, where, ": unknown version");
  f.world = integer(meta, "world", where);
  f.rank = integer(meta, "rank", where);
  FLAME_CHECK(f.world >= 1 && f.world <= 65536 && f.rank >= 0 && f.rank < f.world, FLAME_ERROR_INVALID_FORMAT, where,
              ": rank ", f.rank, " of world ", f.world, " is not a valid rank");
  const json& kind = field(meta, "kind", where);
  FLAME_CHECK(kind.is_string(), FLAME_ERROR_INVALID_FORMAT, where, ": \"kind\" is not a string");
  f.kind = kind.get<std::string>();
  FLAME_CHECK(f.kind == "sgd" || f.kind == "adam" || f.kind == "adamw" || f.kind == "lion", FLAME_ERROR_INVALID_FORMAT,
              where, ": unknown optimizer kind \"", f.kind, "\"");
  f.step = integer(meta, "step", where);
  FLAME_CHECK(f.step >= 0, FLAME_ERROR_INVALID_FORMAT, where, ": step is negative");
  const json& rng = field(meta, "rounding_rng", where);
  if (!rng.is_null()) {
    const json& seed = field(rng, "seed", where + " rounding_rng");
    const json& offset = field(rng, "offset", where + " rounding_rng");
    FLAME_CHECK(seed.is_number_unsigned() && offset.is_number_unsigned(), FLAME_ERROR_INVALID_FORMAT, where,
                ": rounding_rng's seed and offset must be unsigned integers");
    f.rng.ready = true;
    f.rng.seed = seed.get<uint64_t>();
    f.rng.offset = offset.get<uint64_t>();
  }
  const json& lrs = field(meta, "lr", where);
  FLAME_CHECK(lrs.is_array(), FLAME_ERROR_INVALID_FORMAT, where, ": \"lr\" is not an array");
  for (const json& lr : lrs) {
    FLAME_CHECK(lr.is_number() && std::isfinite(lr.get<double>()) && lr.get<double>() >= 0, FLAME_ERROR_INVALID_FORMAT,
                where, ": a learning rate is not a finite number >= 0");
    f.lrs.push_back(lr.get<double>());
  }
  const json& files = field(meta, "files", where);
  FLAME_CHECK(files.is_array() && static_cast<int64_t>(files.size()) == f.world, FLAME_ERROR_INVALID_FORMAT, where,
              ": \"files\" must list the world's ", f.world, " files");
  for (const json& name : files) {
    FLAME_CHECK(name.is_string() && !name.get<std::string>().empty() &&
                    name.get<std::string>().find('/') == std::string::npos,
                FLAME_ERROR_INVALID_FORMAT, where, ": \"files\" must hold base names (no '/')");
    f.files.push_back(name.get<std::string>());
  }
  const std::vector<std::string> slots = optimizer_state_slot_names(optimizer_kind_of_name(f.kind));
  const json& params = field(meta, "params", where);
  FLAME_CHECK(params.is_array(), FLAME_ERROR_INVALID_FORMAT, where, ": \"params\" is not an array");
  size_t expected_tensors = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string pw = where + " parameter " + std::to_string(i);
    ZeroShardParam p;
    const json& shape = field(params[i], "shape", pw);
    FLAME_CHECK(shape.is_array() && shape.size() <= FLAME_MAX_DIMS, FLAME_ERROR_INVALID_FORMAT, pw, ": bad shape");
    int64_t numel = 1;
    for (const json& d : shape) {
      FLAME_CHECK(d.is_number_integer() && d.get<int64_t>() >= 0 && d.get<int64_t>() <= (int64_t{1} << 40),
                  FLAME_ERROR_INVALID_FORMAT, pw, ": the shape holds a bad dimension");
      const int64_t dim = d.get<int64_t>();
      p.shape.push_back(dim);
      // Checked before multiplying: two dimensions of up to 2^40 would overflow int64.
      FLAME_CHECK(dim == 0 || numel <= (int64_t{1} << 40) / dim, FLAME_ERROR_INVALID_FORMAT, pw,
                  ": too many elements");
      numel *= dim;
    }
    const json& dt = field(params[i], "dtype", pw);
    FLAME_CHECK(dt.is_string(), FLAME_ERROR_INVALID_FORMAT, pw, ": \"dtype\" is not a string");
    p.dtype = dt.get<std::string>();
    p.lo = integer(params[i], "lo", pw);
    p.hi = integer(params[i], "hi", pw);
    FLAME_CHECK(p.lo >= 0 && p.lo <= p.hi && p.hi <= numel, FLAME_ERROR_INVALID_FORMAT, pw, ": range [", p.lo, ", ", p.hi,
                ") is not inside its ", numel, " elements");
    // Its tensors: the value always (when the range is not empty), state slots as present.
    const auto check_tensor = [&](const std::string& name, bool is_value) -> bool {
      const st::TensorEntry* e = h.find(name);
      if (!e) return false;
      FLAME_CHECK(p.hi > p.lo, FLAME_ERROR_INVALID_FORMAT, path, ": tensor '", name, "' for an empty range");
      FLAME_CHECK(e->supported, FLAME_ERROR_INVALID_FORMAT, path, ": tensor '", name, "' has dtype ", e->dtype_name);
      const bool dtype_ok = is_value ? p.dtype == dtype_name(e->dtype)
                                     : e->dtype == (p.dtype == "f64" ? FLAME_DTYPE_F64 : FLAME_DTYPE_F32);
      FLAME_CHECK(dtype_ok, FLAME_ERROR_INVALID_FORMAT, path, ": tensor '", name, "' is ", e->dtype_name,
                  is_value ? "; the parameter is " + p.dtype : std::string("; state is f32 (f64 for f64 parameters)"));
      FLAME_CHECK(numel_of(e->shape) == p.hi - p.lo, FLAME_ERROR_INVALID_FORMAT, path, ": tensor '", name, "' holds ",
                  numel_of(e->shape), " elements; the range [", p.lo, ", ", p.hi, ") has ", p.hi - p.lo);
      ++expected_tensors;
      return true;
    };
    const bool has_value = check_tensor("param." + std::to_string(i), true);
    FLAME_CHECK(has_value == (p.hi > p.lo), FLAME_ERROR_INVALID_FORMAT, path, ": tensor 'param.", i, "' is missing");
    for (size_t k = 0; k <= slots.size(); ++k) p.present.push_back(check_tensor(tensor_name(i, k, slots), false));
    FLAME_CHECK(optimizer_state_slots_complete(p.present, slots.size()), FLAME_ERROR_INVALID_FORMAT, path,
                ": parameter ", i, " has an incomplete Adam state (exp_avg, exp_avg_sq and max_exp_avg_sq go together)");
    f.params.push_back(std::move(p));
  }
  FLAME_CHECK(expected_tensors == h.tensors.size(), FLAME_ERROR_INVALID_FORMAT, path, " holds ",
              h.tensors.size() - expected_tensors, " tensors that are no ", f.kind, " state of its ", f.params.size(),
              " parameters");
  return f;
}

void check_zero_shard_set(const std::vector<ZeroShardFile>& files) {
  FLAME_CHECK(!files.empty(), FLAME_ERROR_INVALID_FORMAT, "an empty shard set");
  const ZeroShardFile& a = files[0];
  FLAME_CHECK(static_cast<int64_t>(files.size()) == a.world, FLAME_ERROR_INVALID_FORMAT, a.path, ": a set of ", a.world,
              " files, but ", files.size(), " were given");
  for (size_t r = 0; r < files.size(); ++r) {
    const ZeroShardFile& f = files[r];
    FLAME_CHECK(f.world == a.world && f.rank == static_cast<int64_t>(r), FLAME_ERROR_INVALID_FORMAT, f.path, " is rank ",
                f.rank, " of ", f.world, "; expected rank ", r, " of ", a.world, " (", a.path, ")");
    FLAME_CHECK(f.kind == a.kind && f.step == a.step && f.files == a.files && f.lrs == a.lrs &&
                    f.params.size() == a.params.size(),
                FLAME_ERROR_INVALID_FORMAT, f.path, " and ", a.path,
                " are not of one save (kind, step, learning rates, file list or parameter count differ)");
    for (size_t i = 0; i < a.params.size(); ++i)
      FLAME_CHECK(f.params[i].shape == a.params[i].shape && f.params[i].dtype == a.params[i].dtype,
                  FLAME_ERROR_INVALID_FORMAT, f.path, ": parameter ", i, " differs from ", a.path, "'s");
  }
  for (size_t i = 0; i < a.params.size(); ++i) {
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (const ZeroShardFile& f : files)
      if (f.params[i].hi > f.params[i].lo) ranges.emplace_back(f.params[i].lo, f.params[i].hi);
    std::sort(ranges.begin(), ranges.end());
    int64_t covered = 0;
    for (auto& [lo, hi] : ranges) {
      FLAME_CHECK(lo == covered, FLAME_ERROR_INVALID_FORMAT, a.path, ": the set's ranges of parameter ", i,
                  lo < covered ? " overlap" : " leave a gap", " at element ", std::min(lo, covered));
      covered = hi;
    }
    FLAME_CHECK(covered == numel_of(a.params[i].shape), FLAME_ERROR_INVALID_FORMAT, a.path,
                ": the set's ranges of parameter ", i, " end at element ", covered, " of ", numel_of(a.params[i].shape));
    for (size_t k = 0; k < a.params[i].present.size(); ++k) {
      int held = 0, nonempty = 0;
      for (const ZeroShardFile& f : files)
        if (f.params[i].hi > f.params[i].lo) {
          ++nonempty;
          held += f.params[i].present[k] ? 1 : 0;
        }
      FLAME_CHECK(held == 0 || held == nonempty, FLAME_ERROR_INVALID_FORMAT, a.path, ": parameter ", i,
                  "'s state is in ", held, " of the ", nonempty, " files that hold its elements");
    }
  }
}

void save_zero_shards(ZeroOptimizer& z, const std::string& prefix) {
  Context& c = z.ctx();
  c.forbid_in_capture("writing a ZeRO checkpoint");
  Optimizer& opt = z.optimizer();
  const int64_t rank = z.comm().rank(), world = z.comm().world();
  std::vector<std::string> files;
  for (int64_t r = 0; r < world; ++r) files.push_back(base_name(zero_shard_file_name(prefix, r, world)));
  const std::vector<std::string> slots = optimizer_state_slot_names(opt.kind());
  std::vector<st::TensorEntry> entries;
  std::vector<Tensor> tensors;
  const std::vector<OptimParam*> params = all_params(opt);
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor value = owned_value(*params[i]);
    if (!value) continue;
    auto add = [&](const std::string& name, const Tensor& t) {
      st::TensorEntry e;
      e.name = name;
      e.dtype = t->dtype;
      e.shape = {t->numel()};
      entries.push_back(e);
      tensors.push_back(t);
    };
    add("param." + std::to_string(i), value);
    for (size_t k = 0; k <= slots.size(); ++k)
      if (const Tensor& s = *slot(*params[i], k, slots.size())) add(tensor_name(i, k, slots), s);
  }
  const json meta = metadata_json(z, rank, world, files, false);
  write_file(c, zero_shard_file_name(prefix, rank, world), std::move(entries), {{kZeroShardKey, meta.dump()}},
             [&](size_t i) { return tensors[i]; }, true);
}

void save_zero_full(ZeroOptimizer& z, const std::string& path) {
  Context& c = z.ctx();
  c.forbid_in_capture("writing a ZeRO checkpoint");
  z.comm().check_usable();
  Optimizer& opt = z.optimizer();
  const bool writer = z.comm().rank() == 0;
  const std::vector<std::string> slots = optimizer_state_slot_names(opt.kind());
  const std::vector<OptimParam*> params = all_params(opt);
  const std::vector<std::vector<bool>> present = present_anywhere(z, params, slots.size());
  struct Source {
    size_t param;
    size_t slot;  // slots.size() + 1: the value
    DType dtype;
  };
  std::vector<st::TensorEntry> entries;
  std::vector<Source> sources;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& w = params[i]->param;
    if (w->numel() == 0) continue;
    auto add = [&](const std::string& name, DType dtype, size_t k) {
      st::TensorEntry e;
      e.name = name;
      e.dtype = dtype;
      e.shape = w->shape;
      entries.push_back(e);
      sources.push_back({i, k, dtype});
    };
    add("param." + std::to_string(i), w->dtype, slots.size() + 1);
    for (size_t k = 0; k <= slots.size(); ++k)
      if (present[i][k]) add(tensor_name(i, k, slots), state_dtype(w->dtype), k);
  }
  // One whole tensor on every rank: this rank's owned elements, zeros elsewhere, summed over the ranks.
  const auto assemble = [&](size_t e) -> Tensor {
    OptimParam& p = *params[sources[e].param];
    const bool value = sources[e].slot == slots.size() + 1;
    if (value && !z.values_sharded(p)) return p.param;  // replicated: every rank holds it whole
    const Tensor piece = value ? owned_value(p) : *slot(p, sources[e].slot, slots.size());
    Tensor whole = make_tensor(c, p.param->shape, sources[e].dtype);
    ops::fill_(whole, 0.0);
    const int64_t count = p.shard_hi - p.shard_lo;
    if (piece && count > 0) ops::copy_into(make_view(whole, {count}, {1}, p.shard_lo), ops::reshape(piece, {count}));
    z.comm().all_reduce(whole, FLAME_REDUCE_SUM);
    return whole;
  };
  const json meta = metadata_json(z, 0, 1, {base_name(path)}, true);
  write_file(c, path, std::move(entries), {{kZeroShardKey, meta.dump()}}, assemble, writer);
  z.comm().synchronize();
}

void load_zero(ZeroOptimizer& z, const std::string& path) {
  Context& c = z.ctx();
  c.forbid_in_capture("reading a ZeRO checkpoint");
  Optimizer& opt = z.optimizer();
  // Every file of the set, parsed and checked.
  std::vector<std::unique_ptr<io::MappedFile>> mapped;
  std::vector<std::unique_ptr<st::Header>> headers;
  const auto open = [&](const std::string& p) -> ZeroShardFile {
    mapped.push_back(std::make_unique<io::MappedFile>(p));
    headers.push_back(std::make_unique<st::Header>());
    try {
      *headers.back() = st::parse(mapped.back()->data(), mapped.back()->size());
    } catch (const Error& e) {
      fail(e.status(), p, ": ", e.what());
    }
    ZeroShardFile f = parse_zero_shard_file(*headers.back(), p);
    f.bytes = mapped.back()->data();
    return f;
  };
  const ZeroShardFile first = open(path);
  std::vector<ZeroShardFile> files;
  for (int64_t r = 0; r < first.world; ++r)
    files.push_back(r == first.rank ? first : open(dir_of(path) + first.files[static_cast<size_t>(r)]));
  check_zero_shard_set(files);

  // Against this optimizer.
  const std::vector<OptimParam*> params = all_params(opt);
  FLAME_CHECK(first.kind == optimizer_kind_name(opt.kind()), FLAME_ERROR_INVALID_ARGUMENT, path, " holds the state of a ", first.kind,
              " optimizer; this optimizer is ", optimizer_kind_name(opt.kind()));
  FLAME_CHECK(first.lrs.size() == opt.groups().size() && first.params.size() == params.size(),
              FLAME_ERROR_INVALID_ARGUMENT, path, " holds ", first.lrs.size(), " groups and ", first.params.size(),
              " parameters; the optimizer has ", opt.groups().size(), " and ", params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& w = params[i]->param;
    FLAME_CHECK(first.params[i].shape == w->shape, FLAME_ERROR_SHAPE_MISMATCH, path, ": parameter ", i,
                " was saved with shape ", shape_str(first.params[i].shape), "; the optimizer's has ", shape_str(w->shape));
    FLAME_CHECK(first.params[i].dtype == dtype_name(w->dtype), FLAME_ERROR_DTYPE_MISMATCH, path, ": parameter ", i,
                " was saved as ", first.params[i].dtype, "; the optimizer's is ", dtype_name(w->dtype));
  }
  const std::vector<std::string> slots = optimizer_state_slot_names(opt.kind());  // first.kind checked above
  for (size_t i = 0, gi = 0, in_group = 0; i < params.size(); ++i, ++in_group) {
    while (in_group >= opt.groups()[gi].params.size()) ++gi, in_group = 0;
    const bool has_master = std::any_of(files.begin(), files.end(), [&](const ZeroShardFile& f) {
      return f.params[i].present[slots.size()];
    });
    const DType d = params[i]->param->dtype;
    FLAME_CHECK(!has_master || ((d == FLAME_DTYPE_BF16 || d == FLAME_DTYPE_F16) && opt.groups()[gi].opts.master_weights),
                FLAME_ERROR_INVALID_ARGUMENT, path, ": parameter ", i, " has a master copy, but this optimizer keeps none for it");
  }

  // The elements [lo, hi) of tensor `name` of parameter i, gathered from the files into a new tensor.
  c.check_alive();
  const auto read_range = [&](size_t i, const std::string& name, DType dtype, int64_t lo, int64_t hi) {
    Tensor t = make_tensor(c, {hi - lo}, dtype);
    const size_t elem = dtype_size(dtype);
    for (const ZeroShardFile& f : files) {
      const ZeroShardParam& p = f.params[i];
      const int64_t a = std::max(lo, p.lo), b = std::min(hi, p.hi);
      if (a >= b) continue;
      const st::TensorEntry* e = f.header->find(name);
      FLAME_CHECK(e, FLAME_ERROR_INTERNAL, f.path, " lacks '", name, "' after its checks");
      const unsigned char* src = f.bytes + f.header->data_start + e->begin + static_cast<size_t>(a - p.lo) * elem;
      c.check(c.drv.cuMemcpyHtoDAsync(t->data() + static_cast<CUdeviceptr>(a - lo) * elem, src,
                                      static_cast<size_t>(b - a) * elem, c.stream),
              "cuMemcpyHtoDAsync");
    }
    return t;
  };
  std::vector<Tensor> values(params.size());
  std::vector<std::vector<Tensor>> states(params.size(), std::vector<Tensor>(slots.size() + 1));
  for (size_t i = 0; i < params.size(); ++i) {
    OptimParam& p = *params[i];
    const Tensor& w = p.param;
    if (w->numel() == 0) continue;
    const std::string value_name = "param." + std::to_string(i);
    if (!z.values_sharded(p))
      values[i] = read_range(i, value_name, w->dtype, 0, w->numel());
    else if (p.shard_hi > p.shard_lo)
      values[i] = read_range(i, value_name, w->dtype, p.shard_lo, p.shard_hi);
    if (p.shard_hi <= p.shard_lo) continue;
    for (size_t k = 0; k <= slots.size(); ++k) {
      const bool held = std::any_of(files.begin(), files.end(), [&](const ZeroShardFile& f) { return f.params[i].present[k]; });
      if (held) states[i][k] = read_range(i, tensor_name(i, k, slots), state_dtype(w->dtype), p.shard_lo, p.shard_hi);
    }
  }
  c.synchronize();  // the mapped files stay until every copy from them is done

  // Commit.
  z.before_writing_shards();  // stage 3: blocks gathered before the load must be gathered again
  for (size_t i = 0; i < params.size(); ++i) {
    OptimParam& p = *params[i];
    if (values[i]) {
      const Tensor& dst = z.values_sharded(p) ? p.shard_value : p.param;
      ops::copy_into(dst, ops::reshape(values[i], dst->shape));
      dst->storage->version.fetch_add(1);
    }
    for (size_t k = 0; k <= slots.size(); ++k) *slot(p, k, slots.size()) = states[i][k];
    p.first_step = 0;  // loaded state is not fresh (SGD's buffer continues)
  }
  for (size_t g = 0; g < opt.groups().size(); ++g) opt.set_lr(static_cast<int32_t>(g), first.lrs[g]);
  opt.set_step_count(first.step);
  opt.rounding_rng() = first.rng;
}

}  // namespace flame

// Optimizer state as a safetensors file, so that training resumes bit for bit.
//
// Tensors (parameters numbered 0, 1, ... across the groups in order, as torch's state_dict):
//   state.<i>.momentum_buffer                         SGD with momentum
//   state.<i>.exp_avg, state.<i>.exp_avg_sq           Adam / AdamW (exp_avg only: Lion)
//   state.<i>.max_exp_avg_sq                          amsgrad
//   master.<i>                                        f32 master weights of f16/bf16 parameters
// each in the state's dtype (f32; f64 for f64 parameters) and the parameter's shape. A parameter
// that has no state yet (never stepped with a gradient) has no tensors. With 8-bit states
// (flame_optimizer_set_state_bits), a parameter whose moments are 8-bit (optimizer.h) stores each
// moment as u8 codes in its shape plus state.<i>.<slot>_absmax, f32 [ceil(numel / 256)]; the
// metadata JSON below then also holds "state_bits": 8, and only an optimizer with 8-bit states
// loads the file.
// Metadata "flame.optimizer_state": JSON {"version": 1, "kind": "adamw", "step": n,
// "rounding_rng": {"seed": s, "offset": o} or null, "groups": [{hyper-parameters..., "params":
// [{"shape": [...], "dtype": "bf16"}, ...]}, ...]}. Doubles are written by nlohmann-json with
// round-trip precision, so learning rates come back exactly.
//
// Loading reads and checks everything (kind, group and parameter counts, shapes, dtypes, names,
// hyper-parameters) into new device tensors before it touches the optimizer, so that a failure
// leaves it as it was.
#include <algorithm>
#include <array>
#include <map>
#include <nlohmann/json.hpp>
#include "tensor/autograd_graph.h"
#include "core/error.h"
#include "io/file.h"
#include "io/safetensors.h"
#include "ops/ops.h"
#include "optim/optimizer.h"

namespace flame {

namespace {

using json = nlohmann::json;
constexpr const char* kKey = "flame.optimizer_state";
constexpr size_t kChunkBytes = size_t(64) << 20;


DType state_dtype(DType param) { return param == FLAME_DTYPE_F64 ? FLAME_DTYPE_F64 : FLAME_DTYPE_F32; }
bool is_half(DType d) { return d == FLAME_DTYPE_F16 || d == FLAME_DTYPE_BF16; }

Tensor* slot(OptimParam& p, size_t k) { return k == 0 ? &p.m : (k == 1 ? &p.v : &p.vmax); }
Tensor* absmax_slot(OptimParam& p, size_t k) { return k == 0 ? &p.m_absmax : &p.v_absmax; }
std::string absmax_name(const std::string& slot) { return slot + "_absmax"; }
int64_t absmax_count(const Tensor& w) { return (w->numel() + kQuantBlock - 1) / kQuantBlock; }

json group_json(const OptimGroup& g) {
  const flame_optimizer_options_t& o = g.opts;
  json params = json::array();
  for (const OptimParam& p : g.params)
    params.push_back({{"shape", p.param->shape}, {"dtype", dtype_name(p.param->dtype)}});
  return {{"lr", o.lr}, {"weight_decay", o.weight_decay}, {"beta1", o.beta1}, {"beta2", o.beta2},
          {"eps", o.eps}, {"momentum", o.momentum}, {"dampening", o.dampening}, {"nesterov", o.nesterov},
          {"amsgrad", o.amsgrad}, {"maximize", o.maximize}, {"master_weights", o.master_weights},
          {"stochastic_rounding", o.stochastic_rounding}, {"params", params}};
}

// A JSON field of the expected type, else FLAME_ERROR_INVALID_FORMAT naming it.
const json& field(const json& obj, const char* name, json::value_t type, const std::string& where) {
  FLAME_CHECK(obj.is_object() && obj.contains(name), FLAME_ERROR_INVALID_FORMAT, where, " has no \"", name, "\"");
  const json& v = obj.at(name);
  bool ok = v.type() == type;
  if (type == json::value_t::number_float) ok = v.is_number();
  if (type == json::value_t::number_integer) ok = v.is_number_integer();
  FLAME_CHECK(ok, FLAME_ERROR_INVALID_FORMAT, where, ": \"", name, "\" has the wrong JSON type");
  return v;
}
double real(const json& o, const char* n, const std::string& w) { return field(o, n, json::value_t::number_float, w).get<double>(); }
int32_t flag(const json& o, const char* n, const std::string& w) {
  const json& v = field(o, n, json::value_t::number_integer, w);
  FLAME_CHECK(v.get<int64_t>() == 0 || v.get<int64_t>() == 1, FLAME_ERROR_INVALID_FORMAT, w, ": \"", n, "\" is not 0 or 1");
  return static_cast<int32_t>(v.get<int64_t>());
}

// "state.<i>.<slot>" or "master.<i>" -> (i, slot index; -1 for master); false for other names.
bool parse_name(const std::string& name, const std::vector<std::string>& slots, size_t n_params, size_t* index, int* s) {
  std::string rest;
  if (name.compare(0, 7, "master.") == 0) {
    rest = name.substr(7);
    *s = -1;
  } else if (name.compare(0, 6, "state.") == 0) {
    const size_t dot = name.find('.', 6);
    if (dot == std::string::npos) return false;
    auto it = std::find(slots.begin(), slots.end(), name.substr(dot + 1));
    if (it == slots.end()) return false;
    *s = static_cast<int>(it - slots.begin());
    rest = name.substr(6, dot - 6);
  } else {
    return false;
  }
  if (rest.empty() || rest.size() > 12 || (rest.size() > 1 && rest[0] == '0')) return false;
  if (!std::all_of(rest.begin(), rest.end(), [](char c) { return c >= '0' && c <= '9'; })) return false;
  *index = static_cast<size_t>(std::stoull(rest));
  return *index < n_params;
}

}  // namespace

const char* optimizer_kind_name(int32_t kind) {
  switch (kind) {
    case FLAME_OPTIMIZER_SGD: return "sgd";
    case FLAME_OPTIMIZER_ADAM: return "adam";
    case FLAME_OPTIMIZER_ADAMW: return "adamw";
    case FLAME_OPTIMIZER_LION: return "lion";
  }
  return "unknown";
}

int32_t optimizer_kind_of_name(const std::string& name) {
  for (int32_t k : {FLAME_OPTIMIZER_SGD, FLAME_OPTIMIZER_ADAM, FLAME_OPTIMIZER_ADAMW, FLAME_OPTIMIZER_LION})
    if (name == optimizer_kind_name(k)) return k;
  return -1;
}

std::vector<std::string> optimizer_state_slot_names(int32_t kind) {
  switch (kind) {
    case FLAME_OPTIMIZER_SGD: return {"momentum_buffer"};
    case FLAME_OPTIMIZER_LION: return {"exp_avg"};
    default: return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  }
}

bool optimizer_state_slots_complete(const std::vector<bool>& present, size_t n_slots) {
  if (n_slots < 3) return true;
  FLAME_CHECK(present.size() >= 3, FLAME_ERROR_INTERNAL, "optimizer_state_slots_complete: ", present.size(),
              " flags for 3 slots");
  const bool m = present[0], v = present[1], vmax = present[2];
  return m == v && (m || !vmax);
}

void save_optimizer_state(Optimizer& opt, const std::string& path) {
  Context& c = opt.ctx();
  FLAME_CHECK(!opt.sharded(), FLAME_ERROR_UNSUPPORTED,
              "the optimizer is sharded over ranks (flame_zero_create): its state files are not supported yet");
  c.forbid_in_capture("writing an optimizer state file");
  const std::vector<std::string> slots = optimizer_state_slot_names(opt.kind());
  std::vector<st::TensorEntry> entries;
  std::vector<Tensor> tensors;
  json groups = json::array();
  size_t index = 0;
  for (OptimGroup& g : opt.groups()) {
    groups.push_back(group_json(g));
    for (OptimParam& p : g.params) {
      auto add = [&](const std::string& name, const Tensor& t) {
        if (!t) return;
        st::TensorEntry e;
        e.name = name;
        e.dtype = t->dtype;
        e.shape = t->shape;
        entries.push_back(e);
        tensors.push_back(t);
      };
      for (size_t k = 0; k < slots.size(); ++k) {
        add("state." + std::to_string(index) + "." + slots[k], *slot(p, k));
        if (k < 2) add("state." + std::to_string(index) + "." + absmax_name(slots[k]), *absmax_slot(p, k));
      }
      add("master." + std::to_string(index), p.master);
      ++index;
    }
  }
  const RoundingRng& rng = opt.rounding_rng();
  json meta = {{"version", 1}, {"kind", optimizer_kind_name(opt.kind())}, {"step", opt.step_count()},
               {"rounding_rng", rng.ready ? json{{"seed", rng.seed}, {"offset", rng.offset}} : json(nullptr)},
               {"groups", groups}};
  if (opt.state_bits() != 32) meta["state_bits"] = opt.state_bits();
  const std::vector<std::pair<std::string, std::string>> metadata = {{kKey, meta.dump()}};
  const std::vector<size_t> order = st::layout(entries, metadata);
  const std::string header = st::serialize_header(entries, order, metadata);
  // As flame_safetensors_save: every state tensor is contiguous, copied through a bounded buffer.
  size_t largest = 0;
  for (const st::TensorEntry& e : entries) largest = std::max<size_t>(largest, e.bytes());
  std::vector<unsigned char> buf(std::min(largest, kChunkBytes));
  io::AtomicFileWriter out(path);
  out.write(header.data(), header.size());
  for (size_t i : order) {
    const size_t bytes = entries[i].bytes();
    for (size_t off = 0; off < bytes; off += buf.size()) {
      const size_t len = std::min(buf.size(), bytes - off);
      c.check(c.drv.cuMemcpyDtoHAsync(buf.data(), tensors[i]->data() + off, len, c.stream), "cuMemcpyDtoHAsync");
      c.synchronize();
      out.write(buf.data(), len);
    }
  }
  out.commit();
}

void load_optimizer_state(Optimizer& opt, const std::string& path) {
  Context& c = opt.ctx();
  FLAME_CHECK(!opt.sharded(), FLAME_ERROR_UNSUPPORTED,
              "the optimizer is sharded over ranks (flame_zero_create): its state files are not supported yet");
  c.forbid_in_capture("reading an optimizer state file");
  io::MappedFile file(path);
  st::Header h;
  try {
    h = st::parse(file.data(), file.size());
  } catch (const Error& e) {
    fail(e.status(), path, ": ", e.what());
  }
  const std::string* text = h.find_metadata(kKey);
  FLAME_CHECK(text, FLAME_ERROR_INVALID_FORMAT, path, " is not a FLAME optimizer state (no \"", kKey, "\" metadata)");
  json meta = json::parse(*text, nullptr, false);
  FLAME_CHECK(!meta.is_discarded() && meta.is_object(), FLAME_ERROR_INVALID_FORMAT, path, ": \"", kKey,
              "\" is not a JSON object");
  const std::string where = path + " (" + kKey + ")";
  FLAME_CHECK(field(meta, "version", json::value_t::number_integer, where).get<int64_t>() == 1,
              FLAME_ERROR_INVALID_FORMAT, where, ": unknown version ", meta.at("version").dump());
  const std::string kind = field(meta, "kind", json::value_t::string, where).get<std::string>();
  FLAME_CHECK(kind == optimizer_kind_name(opt.kind()), FLAME_ERROR_INVALID_ARGUMENT, path, " holds the state of a ", kind,
              " optimizer; this optimizer is ", optimizer_kind_name(opt.kind()));
  int64_t file_bits = 32;
  if (meta.contains("state_bits")) {
    file_bits = field(meta, "state_bits", json::value_t::number_integer, where).get<int64_t>();
    FLAME_CHECK(file_bits == 8 || file_bits == 32, FLAME_ERROR_INVALID_FORMAT, where, ": state_bits is ", file_bits,
                " (8 or 32)");
  }
  FLAME_CHECK(file_bits == opt.state_bits(), FLAME_ERROR_INVALID_ARGUMENT, path, " holds ", file_bits,
              "-bit optimizer states; this optimizer keeps ", opt.state_bits(),
              "-bit states (flame_optimizer_set_state_bits before loading)");
  const json& step = field(meta, "step", json::value_t::number_integer, where);
  FLAME_CHECK(step.get<int64_t>() >= 0, FLAME_ERROR_INVALID_FORMAT, where, ": step is negative");
  RoundingRng rng;
  FLAME_CHECK(meta.contains("rounding_rng"), FLAME_ERROR_INVALID_FORMAT, where, " has no \"rounding_rng\"");
  if (!meta.at("rounding_rng").is_null()) {
    const json& r = meta.at("rounding_rng");
    const std::string rw = where + " rounding_rng";
    rng.ready = true;
    rng.seed = field(r, "seed", json::value_t::number_unsigned, rw).get<uint64_t>();
    rng.offset = field(r, "offset", json::value_t::number_unsigned, rw).get<uint64_t>();
  }

  // Groups: counts, hyper-parameters, the parameters' shapes and dtypes.
  std::vector<OptimGroup>& groups = opt.groups();
  const json& gs = field(meta, "groups", json::value_t::array, where);
  FLAME_CHECK(gs.size() == groups.size(), FLAME_ERROR_INVALID_ARGUMENT, path, " holds ", gs.size(),
              " parameter groups; the optimizer has ", groups.size());
  std::vector<flame_optimizer_options_t> opts;
  std::vector<Tensor> params;
  std::vector<size_t> group_of;  // the group of each parameter
  for (size_t gi = 0; gi < gs.size(); ++gi) {
    const std::string gw = where + " group " + std::to_string(gi);
    const json& g = gs[gi];
    flame_optimizer_options_t o = groups[gi].opts;
    o.lr = real(g, "lr", gw);
    o.weight_decay = real(g, "weight_decay", gw);
    o.beta1 = real(g, "beta1", gw);
    o.beta2 = real(g, "beta2", gw);
    o.eps = real(g, "eps", gw);
    o.momentum = real(g, "momentum", gw);
    o.dampening = real(g, "dampening", gw);
    o.nesterov = flag(g, "nesterov", gw);
    o.amsgrad = flag(g, "amsgrad", gw);
    o.maximize = flag(g, "maximize", gw);
    o.master_weights = flag(g, "master_weights", gw);
    o.stochastic_rounding = flag(g, "stochastic_rounding", gw);
    FLAME_CHECK(file_bits == 32 || !o.amsgrad, FLAME_ERROR_INVALID_FORMAT, gw,
                ": amsgrad with 8-bit states (the 8-bit step keeps no maximum of the second moment)");
    try {
      validate_optimizer_options(o, opt.kind());
    } catch (const Error& e) {
      fail(FLAME_ERROR_INVALID_FORMAT, gw, ": ", e.what());
    }
    opts.push_back(o);
    const json& ps = field(g, "params", json::value_t::array, gw);
    FLAME_CHECK(ps.size() == groups[gi].params.size(), FLAME_ERROR_INVALID_ARGUMENT, path, " group ", gi, " holds ",
                ps.size(), " parameters; the optimizer's group has ", groups[gi].params.size());
    for (size_t k = 0; k < ps.size(); ++k) {
      const Tensor& w = groups[gi].params[k].param;
      const std::string pw = gw + " parameter " + std::to_string(params.size());
      const json& shape = field(ps[k], "shape", json::value_t::array, pw);
      const std::string dt = field(ps[k], "dtype", json::value_t::string, pw).get<std::string>();
      Shape s;
      for (const json& d : shape) {
        FLAME_CHECK(d.is_number_integer(), FLAME_ERROR_INVALID_FORMAT, pw, ": the shape holds a non-integer");
        s.push_back(d.get<int64_t>());
      }
      FLAME_CHECK(s == w->shape, FLAME_ERROR_SHAPE_MISMATCH, path, ": parameter ", params.size(), " was saved with shape ",
                  shape_str(s), "; the optimizer's has shape ", shape_str(w->shape));
      FLAME_CHECK(dt == dtype_name(w->dtype), FLAME_ERROR_DTYPE_MISMATCH, path, ": parameter ", params.size(),
                  " was saved as ", dt, "; the optimizer's is ", dtype_name(w->dtype));
      params.push_back(w);
      group_of.push_back(gi);
    }
  }

  // Tensors: known names only, each once (parse() rejected duplicates), with the right geometry.
  const std::vector<std::string> slots = optimizer_state_slot_names(opt.kind());
  std::vector<std::string> names = slots;  // the slots, then the absmax of the first two (8-bit moments)
  for (size_t k = 0; k < std::min<size_t>(2, slots.size()); ++k) names.push_back(absmax_name(slots[k]));
  std::vector<std::array<Tensor, 6>> loaded(params.size());  // m, v, vmax, master, m_absmax, v_absmax
  c.check_alive();
  for (const st::TensorEntry& e : h.tensors) {
    size_t i = 0;
    int s = 0;
    FLAME_CHECK(parse_name(e.name, names, params.size(), &i, &s), FLAME_ERROR_INVALID_FORMAT, path, ": tensor '", e.name,
                "' is not state of this ", optimizer_kind_name(opt.kind()), " optimizer with ", params.size(), " parameters");
    const Tensor& w = params[i];
    FLAME_CHECK(s >= 0 || (is_half(w->dtype) && opts[group_of[i]].master_weights), FLAME_ERROR_INVALID_FORMAT, path,
                ": tensor '", e.name, "' is a master copy, but parameter ", i, " is ", dtype_name(w->dtype),
                " in a group ", opts[group_of[i]].master_weights ? "with" : "without",
                " master_weights (only f16/bf16 parameters of such groups have one)");
    const bool absmax = s >= static_cast<int>(slots.size());
    FLAME_CHECK(!absmax || opt.quantizes(w), FLAME_ERROR_INVALID_FORMAT, path, ": tensor '", e.name,
                "' is the absmax of 8-bit moments, but parameter ", i, " keeps ",
                opt.state_bits() == 8 ? "f32 moments (it is f64 or has fewer than 4096 elements)" : "32-bit moments");
    const DType want = absmax                                   ? FLAME_DTYPE_F32
                       : s >= 0 && s < 2 && opt.quantizes(w) ? FLAME_DTYPE_U8
                                                              : state_dtype(w->dtype);
    const Shape want_shape = absmax ? Shape{absmax_count(w)} : w->shape;
    FLAME_CHECK(e.supported && e.dtype == want && e.shape == want_shape, FLAME_ERROR_INVALID_FORMAT, path, ": tensor '",
                e.name, "' is ", e.dtype_name, " ", shape_str(e.shape), "; expected ", st::format_dtype_name(want), " ",
                shape_str(want_shape));
    Tensor t = make_tensor(c, e.shape, e.dtype);
    if (e.bytes())
      c.check(c.drv.cuMemcpyHtoDAsync(t->data(), file.data() + h.data_start + e.begin, e.bytes(), c.stream),
              "cuMemcpyHtoDAsync");
    const size_t at = s < 0 ? 3 : absmax ? 4 + static_cast<size_t>(s) - slots.size() : static_cast<size_t>(s);
    loaded[i][at] = std::move(t);
  }
  for (size_t i = 0; i < loaded.size(); ++i) {
    const std::vector<bool> present = {static_cast<bool>(loaded[i][0]), static_cast<bool>(loaded[i][1]),
                                       static_cast<bool>(loaded[i][2])};
    FLAME_CHECK(optimizer_state_slots_complete(present, slots.size()), FLAME_ERROR_INVALID_FORMAT, path,
                ": parameter ", i, " has an incomplete Adam state (exp_avg, exp_avg_sq and max_exp_avg_sq go together)");
    for (size_t k = 0; k < 2; ++k)  // 8-bit moments come with their absmax
      FLAME_CHECK(static_cast<bool>(loaded[i][4 + k]) == (opt.quantizes(params[i]) && static_cast<bool>(loaded[i][k])),
                  FLAME_ERROR_INVALID_FORMAT, path, ": parameter ", i, "'s 8-bit ", k == 0 ? "first" : "second",
                  " moment and its absmax do not come together");
  }

  // Commit: nothing below throws.
  size_t i = 0;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    groups[gi].opts = opts[gi];
    for (OptimParam& p : groups[gi].params) {
      p.m = loaded[i][0];
      p.v = loaded[i][1];
      p.vmax = loaded[i][2];
      p.master = loaded[i][3];
      p.m_absmax = loaded[i][4];
      p.v_absmax = loaded[i][5];
      p.first_step = 0;  // loaded state is not fresh (SGD's buffer continues)
      ++i;
    }
  }
  opt.set_step_count(step.get<int64_t>());
  opt.rounding_rng() = rng;
}

}  // namespace flame

// LoRA file formats as key plans (see lora_format.h for the formats and the fused-module rules).
//
// Every plan starts from a ComponentTable: the model's Linear modules (2-D weights of its key table)
// under their diffusers names, each with the original-layout module that stores it (rows of it,
// maybe with halves swapped or transposed), plus the prefixes and names the two formats use for the
// component. Saving groups the requested modules by their kohya name; loading resolves each file key
// to such a name or module and checks the shapes against the table.
#include "models/lora_format.h"
#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>
#include "core/error.h"
#include "models/clip_keys.h"
#include "models/mapped_keys.h"
#include "models/sd3_keys.h"
#include "models/t5_keys.h"
#include "models/unet_keys.h"

namespace flame::models {
namespace {

enum class ModelKind { Flux, SDXLUNet, SD15UNet, SD3, ClipL, ClipG, T5 };

// One Linear module and the original tensor that stores its weight.
struct LinearPiece {
  std::string module;    // diffusers / transformers name, no ".weight"
  int64_t out = 0, in = 0;
  std::string original;  // original-layout module name (no ".weight")
  int64_t row_begin = 0;
  int64_t rows = 0;
  int64_t original_rows = 0;
  bool swap_halves = false;
  bool transposed = false;
};

struct ComponentTable {
  ModelKind kind = ModelKind::Flux;
  std::string class_name;
  std::string component;
  std::vector<LinearPiece> pieces;
  std::map<std::string, size_t> by_module;
  std::map<std::string, std::vector<size_t>> by_original;
  std::map<std::string, std::string> kohya_to_original;  // underscored original name -> original
  std::map<std::string, std::string> kohya_to_module;    // underscored diffusers name -> module
  std::set<std::string> convolutions;  // convolution weights' module names, dotted and underscored (both layouts)
  bool kohya_saves_diffusers_names = false;  // SD1.5 (sd-scripts' diffusers UNet), text encoders
  std::string peft_prefix;                   // "transformer", "unet", "text_encoder", ...
  std::string kohya_prefix;                  // "lora_unet", "lora_te1", ...
  std::vector<std::string> kohya_accepted;   // prefixes (with '_') accepted on load for this component
  // Flux and SD3: the prefix under which a LoKr on one member of a fused original (or on an original
  // with swapped row halves) is saved, with the member's diffusers name (OneTrainer's
  // "lora_transformer_", which ComfyUI maps to the member's rows of the fused weight, halves swapped
  // back); empty: such a LoKr cannot be saved.
  std::string kohya_member_prefix;
  std::vector<std::string> dotted_accepted;  // prefixes (with '.') accepted on load
  bool sd3_qk_norm = false;                  // SD3: the model version kohya's metadata names
  bool sd3_dual_attention = false;
};

const std::vector<std::string> kAllKohyaPrefixes = {"lora_unet_", "lora_transformer_", "lycoris_", "lora_te1_",
                                                     "lora_te2_", "lora_te3_", "lora_te_"};
const std::vector<std::string> kAllDottedPrefixes = {"model.diffusion_model.", "diffusion_model.", "transformer.", "unet.",
                                                     "text_encoder_2.", "text_encoder_3.", "text_encoder."};

std::string underscored(std::string s) {
  std::replace(s.begin(), s.end(), '.', '_');
  return s;
}

bool starts_with(const std::string& s, const std::string& head) { return s.compare(0, head.size(), head) == 0; }
bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
std::string strip_weight(const std::string& name) { return name.substr(0, name.size() - 7); }

int64_t json_int(const nlohmann::json& c, const char* key, int64_t fallback) {
  if (!c.contains(key) || c[key].is_null()) return fallback;
  FLAME_CHECK(c[key].is_number_integer(), FLAME_ERROR_INVALID_ARGUMENT, "config: \"", key, "\" must be an integer");
  return c[key].get<int64_t>();
}
bool json_bool(const nlohmann::json& c, const char* key, bool fallback) {
  if (!c.contains(key) || c[key].is_null()) return fallback;
  FLAME_CHECK(c[key].is_boolean(), FLAME_ERROR_INVALID_ARGUMENT, "config: \"", key, "\" must be a boolean");
  return c[key].get<bool>();
}
std::vector<int64_t> json_ints(const nlohmann::json& c, const char* key, const std::vector<int64_t>& fallback) {
  if (!c.contains(key) || c[key].is_null()) return fallback;
  FLAME_CHECK(c[key].is_array(), FLAME_ERROR_INVALID_ARGUMENT, "config: \"", key, "\" must be an array of integers");
  std::vector<int64_t> v;
  for (const auto& e : c[key]) {
    FLAME_CHECK(e.is_number_integer(), FLAME_ERROR_INVALID_ARGUMENT, "config: \"", key, "\" must be an array of integers");
    v.push_back(e.get<int64_t>());
  }
  return v;
}
std::string json_string(const nlohmann::json& c, const char* key, const std::string& fallback) {
  if (!c.contains(key) || c[key].is_null()) return fallback;
  FLAME_CHECK(c[key].is_string(), FLAME_ERROR_INVALID_ARGUMENT, "config: \"", key, "\" must be a string");
  return c[key].get<std::string>();
}

FluxConfig read_flux_config(const nlohmann::json& c) {
  FluxConfig f;
  f.in_channels = json_int(c, "in_channels", 64);
  f.out_channels = json_int(c, "out_channels", f.in_channels);
  f.num_layers = json_int(c, "num_layers", 19);
  f.num_single_layers = json_int(c, "num_single_layers", 38);
  f.attention_head_dim = json_int(c, "attention_head_dim", 128);
  f.num_attention_heads = json_int(c, "num_attention_heads", 24);
  f.joint_attention_dim = json_int(c, "joint_attention_dim", 4096);
  f.pooled_projection_dim = json_int(c, "pooled_projection_dim", 768);
  f.guidance_embeds = json_bool(c, "guidance_embeds", false);
  f.axes_dims_rope = json_ints(c, "axes_dims_rope", {16, 56, 56});
  f.mlp_hidden_dim = 4 * f.inner_dim();  // FluxTransformer2DModel's fixed mlp_ratio
  return f;
}

UNetConfig read_unet_config(const nlohmann::json& c) {
  UNetConfig u;
  u.in_channels = json_int(c, "in_channels", 4);
  u.out_channels = json_int(c, "out_channels", 4);
  u.block_out_channels = json_ints(c, "block_out_channels", {320, 640, 1280, 1280});
  const size_t n = u.block_out_channels.size();
  u.down_block_has_attention.assign(n, true);
  if (c.contains("down_block_types") && c["down_block_types"].is_array()) {
    FLAME_CHECK(c["down_block_types"].size() == n, FLAME_ERROR_INVALID_ARGUMENT,
                "config: \"down_block_types\" and \"block_out_channels\" differ in length");
    for (size_t i = 0; i < n; ++i)
      u.down_block_has_attention[i] = c["down_block_types"][i].get<std::string>().find("CrossAttn") != std::string::npos;
  } else {
    u.down_block_has_attention.back() = false;  // diffusers' default: three CrossAttnDownBlock2D, one DownBlock2D
  }
  if (c.contains("transformer_layers_per_block") && c["transformer_layers_per_block"].is_array())
    u.transformer_layers_per_block = json_ints(c, "transformer_layers_per_block", {});
  else
    u.transformer_layers_per_block.assign(n, json_int(c, "transformer_layers_per_block", 1));
  FLAME_CHECK(u.transformer_layers_per_block.size() == n, FLAME_ERROR_INVALID_ARGUMENT,
              "config: \"transformer_layers_per_block\" and \"block_out_channels\" differ in length");
  if (c.contains("layers_per_block") && c["layers_per_block"].is_array()) {  // FLAME's full configs list it per block
    const std::vector<int64_t> per_block = json_ints(c, "layers_per_block", {});
    FLAME_CHECK(!per_block.empty() && std::count(per_block.begin(), per_block.end(), per_block[0]) ==
                                          static_cast<std::ptrdiff_t>(per_block.size()),
                FLAME_ERROR_INVALID_ARGUMENT, "config: \"layers_per_block\" differs between blocks (the UNet's key tables need one value)");
    u.layers_per_block = per_block[0];
  } else {
    u.layers_per_block = json_int(c, "layers_per_block", 2);
  }
  u.cross_attention_dim = json_int(c, "cross_attention_dim", 1280);
  u.use_linear_projection = json_bool(c, "use_linear_projection", false);
  u.mid_block_has_attention = !(c.contains("mid_block_type") && c["mid_block_type"].is_null()) &&
                              json_string(c, "mid_block_type", "UNetMidBlock2DCrossAttn") == "UNetMidBlock2DCrossAttn";
  u.projection_class_embeddings_input_dim = json_string(c, "addition_embed_type", "") == "text_time"
                                                ? json_int(c, "projection_class_embeddings_input_dim", 0)
                                                : 0;
  return u;
}

SD3Config read_sd3_config(const nlohmann::json& c) {
  SD3Config s;  // diffusers' SD3Transformer2DModel defaults where config.json omits a field
  s.sample_size = json_int(c, "sample_size", 128);
  s.patch_size = json_int(c, "patch_size", 2);
  s.in_channels = json_int(c, "in_channels", 16);
  s.num_layers = json_int(c, "num_layers", 18);
  s.attention_head_dim = json_int(c, "attention_head_dim", 64);
  s.num_attention_heads = json_int(c, "num_attention_heads", 18);
  s.joint_attention_dim = json_int(c, "joint_attention_dim", 4096);
  s.caption_projection_dim = json_int(c, "caption_projection_dim", 1152);
  s.pooled_projection_dim = json_int(c, "pooled_projection_dim", 2048);
  s.out_channels = json_int(c, "out_channels", 16);
  s.pos_embed_max_size = json_int(c, "pos_embed_max_size", 96);
  s.qk_norm = json_string(c, "qk_norm", "");
  s.dual_attention_layers = json_ints(c, "dual_attention_layers", {});
  return s;
}

ClipTextConfig read_clip_config(const nlohmann::json& c, bool with_projection) {
  ClipTextConfig k;  // transformers' CLIPTextConfig defaults
  k.vocab_size = json_int(c, "vocab_size", 49408);
  k.hidden_size = json_int(c, "hidden_size", 512);
  k.intermediate_size = json_int(c, "intermediate_size", 2048);
  k.num_hidden_layers = json_int(c, "num_hidden_layers", 12);
  k.num_attention_heads = json_int(c, "num_attention_heads", 8);
  k.max_position_embeddings = json_int(c, "max_position_embeddings", 77);
  k.hidden_act = json_string(c, "hidden_act", "quick_gelu");
  k.projection_dim = json_int(c, "projection_dim", 512);
  k.with_projection = with_projection;
  return k;
}

T5Config read_t5_config(const nlohmann::json& c) {
  T5Config t;  // transformers' T5Config defaults
  t.vocab_size = json_int(c, "vocab_size", 32128);
  t.d_model = json_int(c, "d_model", 512);
  t.d_kv = json_int(c, "d_kv", 64);
  t.d_ff = json_int(c, "d_ff", 2048);
  t.num_layers = json_int(c, "num_layers", 6);
  t.num_heads = json_int(c, "num_heads", 8);
  t.relative_attention_num_buckets = json_int(c, "relative_attention_num_buckets", 32);
  t.feed_forward_proj = json_string(c, "feed_forward_proj", "relu");
  return t;
}

ModelKind model_kind(const std::string& class_name, const nlohmann::json& config) {
  if (class_name == "FluxTransformer2DModel") return ModelKind::Flux;
  if (class_name == "SD3Transformer2DModel") return ModelKind::SD3;
  if (class_name == "UNet2DConditionModel")
    return json_string(config, "addition_embed_type", "") == "text_time" ? ModelKind::SDXLUNet : ModelKind::SD15UNet;
  if (class_name == "CLIPTextModel") return ModelKind::ClipL;
  if (class_name == "CLIPTextModelWithProjection") return ModelKind::ClipG;
  if (class_name == "T5EncoderModel") return ModelKind::T5;
  fail(FLAME_ERROR_INVALID_ARGUMENT, "LoRA files: unknown model class \"", class_name,
       "\" (FluxTransformer2DModel, UNet2DConditionModel, SD3Transformer2DModel, CLIPTextModel, ",
       "CLIPTextModelWithProjection or T5EncoderModel)");
}

void add_piece(ComponentTable& t, LinearPiece p) {
  t.by_module[p.module] = t.pieces.size();
  t.by_original[p.original].push_back(t.pieces.size());
  t.kohya_to_original.emplace(underscored(p.original), p.original);
  t.kohya_to_module.emplace(underscored(p.module), p.module);
  t.pieces.push_back(std::move(p));
}

// A convolution weight: remembered so that a LoRA key naming it gets a precise error.
void add_convolution(ComponentTable& t, const std::string& diffusers_weight, const std::string& original_weight) {
  for (const std::string& w : {diffusers_weight, original_weight}) {
    if (!ends_with(w, ".weight")) continue;
    t.convolutions.insert(strip_weight(w));
    t.convolutions.insert(underscored(strip_weight(w)));
  }
}

// The 2-D weights of a MappedTable (SD3; CLIP and T5 under their own names when identity).
void add_mapped(ComponentTable& t, const MappedTable& m, bool identity) {
  std::map<std::string, std::vector<int64_t>> original_shape;
  for (const KeyShape& k : m.original) original_shape[k.name] = k.shape;
  for (const MappedParameter& p : m.parameters) {
    if (p.shape.size() == 4) add_convolution(t, p.diffusers_name, p.original_name);
    if (!ends_with(p.diffusers_name, ".weight") || p.shape.size() != 2) continue;
    LinearPiece piece;
    piece.module = strip_weight(p.diffusers_name);
    piece.out = p.shape[0];
    piece.in = p.shape[1];
    if (identity) {
      piece.original = piece.module;
      piece.rows = piece.original_rows = piece.out;
    } else {
      if (!ends_with(p.original_name, ".weight")) continue;  // no original Linear weight (e.g. a bare parameter)
      piece.original = strip_weight(p.original_name);
      piece.row_begin = p.row_begin;
      piece.rows = p.transposed ? piece.out : p.rows;
      piece.original_rows = original_shape.at(p.original_name).at(0);
      piece.swap_halves = p.swap_halves;
      piece.transposed = p.transposed;
    }
    add_piece(t, std::move(piece));
  }
}

void add_flux(ComponentTable& t, const FluxConfig& cfg) {
  std::map<std::string, std::vector<int64_t>> dshape, oshape;
  for (const KeyShape& k : flux_diffusers_tensors(cfg)) dshape[k.name] = k.shape;
  for (const KeyShape& k : flux_original_tensors(cfg)) oshape[k.name] = k.shape;
  for (const FluxParameter& p : flux_parameter_map(cfg)) {
    const std::vector<int64_t>& s = dshape.at(p.diffusers_name);
    if (!ends_with(p.diffusers_name, ".weight") || s.size() != 2 || !ends_with(p.original_name, ".weight")) continue;
    add_piece(t, {strip_weight(p.diffusers_name), s[0], s[1], strip_weight(p.original_name), p.row_begin, p.rows,
                  oshape.at(p.original_name).at(0), p.swap_halves, false});
  }
}

void add_unet(ComponentTable& t, const UNetConfig& cfg) {
  for (const UNetParameter& p : unet_parameters(cfg)) {
    if (p.shape.size() == 4) add_convolution(t, p.diffusers_name, p.original_name);
    if (!ends_with(p.diffusers_name, ".weight") || p.shape.size() != 2) continue;
    add_piece(t, {strip_weight(p.diffusers_name), p.shape[0], p.shape[1], strip_weight(p.original_name), 0, p.shape[0],
                  p.shape[0], false, false});
  }
}

const std::vector<std::string> kComponents = {"unet", "transformer", "text_encoder", "text_encoder_2", "text_encoder_3"};

ComponentTable component_table(const std::string& class_name, const nlohmann::json& config, const std::string& component) {
  FLAME_CHECK(config.is_object(), FLAME_ERROR_INVALID_ARGUMENT, "LoRA files: the model config must be a JSON object");
  FLAME_CHECK(std::find(kComponents.begin(), kComponents.end(), component) != kComponents.end(), FLAME_ERROR_INVALID_ARGUMENT,
              "LoRA files: component \"", component, "\" is not one of unet, transformer, text_encoder, text_encoder_2, text_encoder_3");
  ComponentTable t;
  t.kind = model_kind(class_name, config);
  t.class_name = class_name;
  t.component = component;
  t.peft_prefix = component;
  const bool denoiser = t.kind == ModelKind::Flux || t.kind == ModelKind::SD3 || t.kind == ModelKind::SDXLUNet ||
                        t.kind == ModelKind::SD15UNet;
  FLAME_CHECK(denoiser == (component == "unet" || component == "transformer"), FLAME_ERROR_INVALID_ARGUMENT,
              "LoRA files: component \"", component, "\" cannot hold a ", class_name);
  switch (t.kind) {
    case ModelKind::Flux: add_flux(t, read_flux_config(config)); break;
    case ModelKind::SDXLUNet:
    case ModelKind::SD15UNet: add_unet(t, read_unet_config(config)); break;
    case ModelKind::SD3: {
      const SD3Config sd3 = read_sd3_config(config);
      t.sd3_qk_norm = !sd3.qk_norm.empty();
      t.sd3_dual_attention = !sd3.dual_attention_layers.empty();
      add_mapped(t, sd3_parameter_table(sd3), false);
      break;
    }
    case ModelKind::ClipL:
    case ModelKind::ClipG: add_mapped(t, clip_parameter_table(read_clip_config(config, t.kind == ModelKind::ClipG)), true); break;
    case ModelKind::T5: add_mapped(t, t5_parameter_table(read_t5_config(config)), true); break;
  }
  // Members of a fused original in row order: the rank blocks of a saved up then follow the output
  // rows, as diffusers' block-diagonal ("sparse") detection expects (q, k, v, mlp).
  for (auto& [original, members] : t.by_original)
    std::stable_sort(members.begin(), members.end(),
                     [&](size_t a, size_t b) { return t.pieces[a].row_begin < t.pieces[b].row_begin; });
  t.kohya_saves_diffusers_names = !(t.kind == ModelKind::Flux || t.kind == ModelKind::SD3 || t.kind == ModelKind::SDXLUNet);
  if (denoiser) {
    t.kohya_prefix = "lora_unet";
    // lycoris_: SimpleTuner's LyCORIS files (diffusers names), as ComfyUI reads them.
    t.kohya_accepted = {"lora_unet_", "lora_transformer_", "lycoris_"};
    if (t.kind == ModelKind::Flux || t.kind == ModelKind::SD3) t.kohya_member_prefix = "lora_transformer_";
    t.dotted_accepted = {"model.diffusion_model.", "diffusion_model.", "transformer.", "unet."};
  } else {
    const bool t5 = t.kind == ModelKind::T5;
    if (component == "text_encoder") t.kohya_accepted = {"lora_te1_", "lora_te_"};
    else if (component == "text_encoder_2" && t5) t.kohya_accepted = {"lora_te3_", "lora_te2_"};  // Flux's T5 (lora_te2_: OneTrainer)
    else if (component == "text_encoder_2") t.kohya_accepted = {"lora_te2_"};
    else t.kohya_accepted = {"lora_te3_"};
    t.kohya_prefix = t.kohya_accepted.front().substr(0, t.kohya_accepted.front().size() - 1);
    t.dotted_accepted = {component + "."};
  }
  return t;
}

const LinearPiece& need_module(const ComponentTable& t, const std::string& module) {
  auto it = t.by_module.find(module);
  FLAME_CHECK(it != t.by_module.end(), FLAME_ERROR_INVALID_ARGUMENT, "LoRA module \"", module, "\": ", t.class_name,
              " has no Linear module of that name");
  return t.pieces[it->second];
}

void check_modules(const ComponentTable& t, const std::vector<LoraModuleShape>& modules) {
  FLAME_CHECK(!modules.empty(), FLAME_ERROR_INVALID_ARGUMENT, "LoRA save: no modules for ", t.component);
  std::set<std::string> seen;
  for (const LoraModuleShape& m : modules) {
    const LinearPiece& p = need_module(t, m.module);
    FLAME_CHECK(seen.insert(m.module).second, FLAME_ERROR_INVALID_ARGUMENT, "LoRA module \"", m.module, "\" is listed twice");
    FLAME_CHECK(m.in_features == p.in && m.out_features == p.out, FLAME_ERROR_INVALID_ARGUMENT, "LoRA module \"", m.module,
                "\": in/out features ", m.in_features, "/", m.out_features, " but the model's weight is [", p.out, ", ", p.in, "]");
    FLAME_CHECK(m.rank >= 1, FLAME_ERROR_INVALID_ARGUMENT, "LoRA module \"", m.module, "\": rank ", m.rank, " < 1");
    FLAME_CHECK(m.alpha > 0 && std::isfinite(m.alpha), FLAME_ERROR_INVALID_ARGUMENT, "LoRA module \"", m.module,
                "\": alpha must be positive and finite");
  }
}

// Python's str() of a float for ss_network_alpha ("16.0", "0.5").
std::string python_float(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  std::string s = os.str();
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

nlohmann::json json_number(double v) {
  if (std::floor(v) == v && std::fabs(v) < 1e15) return static_cast<int64_t>(v);
  return v;
}

template <class T>
T most_common(const std::vector<T>& values) {
  std::map<T, int> count;
  for (const T& v : values) ++count[v];
  T best = values.front();
  for (const T& v : values)
    if (count[v] > count[best]) best = v;
  return best;
}

LoraSavePlan plan_peft(const ComponentTable& t, const std::vector<LoraModuleShape>& modules) {
  LoraSavePlan plan;
  plan.format = LoraFileFormat::Peft;
  bool any_dora = false;
  std::vector<int64_t> ranks;
  std::vector<double> alphas;
  for (const LoraModuleShape& m : modules)
    FLAME_CHECK(!m.lokr, FLAME_ERROR_INVALID_ARGUMENT, "LoRA module \"", m.module,
                "\" is a LoKr: the peft / diffusers format has no LoKr (diffusers' loaders read LoRA only); "
                "save it with \"format\": \"kohya\" (LyCORIS' keys, which ComfyUI reads)");
  for (const LoraModuleShape& m : modules) {
    const std::string base = t.peft_prefix + "." + m.module;
    plan.tensors.push_back({base + ".lora_A.weight", {m.rank, m.in_features}, LoraTensorKind::Down,
                            {{m.module, 0, m.rank, 0, m.in_features, false, 1.0}}, 0});
    plan.tensors.push_back({base + ".lora_B.weight", {m.out_features, m.rank}, LoraTensorKind::Up,
                            {{m.module, 0, m.out_features, 0, m.rank, false, 1.0}}, 0});
    if (m.dora)
      plan.tensors.push_back({base + ".lora_magnitude_vector", {m.out_features}, LoraTensorKind::Magnitude,
                              {{m.module, 0, m.out_features, 0, 1, false, 1.0}}, 0});
    any_dora = any_dora || m.dora;
    ranks.push_back(m.rank);
    alphas.push_back(m.alpha);
  }
  // peft's LoraConfig as diffusers writes it (_pack_dict_with_prefix): the most common rank and alpha,
  // the others by full module name in rank_pattern / alpha_pattern. peft matches a key as
  // "(^|.*\.)<key>$" and takes the first matching key (the JSON's order is sorted), so a module whose
  // name ends another's ("proj_out" and "single_transformer_blocks.0.proj_out") is written "^<name>",
  // anchored at the start (peft PR 2419; diffusers' own rank keys do the same).
  const int64_t r = most_common(ranks);
  const double alpha = most_common(alphas);
  std::set<std::string> suffix_of_another;
  for (const LoraModuleShape& m : modules)
    for (const LoraModuleShape& other : modules)
      if (&m != &other && ends_with(other.module, "." + m.module)) suffix_of_another.insert(m.module);
  nlohmann::json rank_pattern = nlohmann::json::object(), alpha_pattern = nlohmann::json::object(),
                 targets = nlohmann::json::array();
  for (const LoraModuleShape& m : modules) {
    const std::string key = suffix_of_another.count(m.module) ? "^" + m.module : m.module;
    if (m.rank != r) rank_pattern[key] = m.rank;
    if (m.alpha != alpha) alpha_pattern[key] = json_number(m.alpha);
    targets.push_back(m.module);
  }
  const std::string p = t.peft_prefix + ".";
  nlohmann::json meta = {{p + "r", r},
                         {p + "lora_alpha", json_number(alpha)},
                         {p + "rank_pattern", rank_pattern},
                         {p + "alpha_pattern", alpha_pattern},
                         {p + "target_modules", targets},
                         {p + "use_dora", any_dora},
                         {p + "lora_bias", false},
                         {p + "init_lora_weights", true}};
  plan.metadata["format"] = "pt";
  plan.metadata["lora_adapter_metadata"] = meta.dump(2);
  return plan;
}

void add_kohya_metadata(const ComponentTable& t, const std::vector<LoraModuleShape>& modules, LoraSavePlan& plan) {
  std::vector<int64_t> ranks;
  std::vector<double> alphas;
  for (const LoraModuleShape& m : modules) {
    ranks.push_back(m.rank);
    alphas.push_back(m.alpha);
  }
  auto& md = plan.metadata;
  md["ss_network_dim"] = std::to_string(most_common(ranks));
  md["ss_network_alpha"] = python_float(most_common(alphas));
  md["ss_v2"] = "False";
  md["modelspec.sai_model_spec"] = "1.0.1";
  md["modelspec.title"] = "FLAME LoRA";
  switch (t.kind) {
    case ModelKind::Flux:
      md["ss_network_module"] = "networks.lora_flux";
      md["ss_base_model_version"] = "flux1";
      md["modelspec.architecture"] =
          t.by_module.count("time_text_embed.guidance_embedder.linear_1") ? "flux-1-dev/lora" : "flux-1-schnell/lora";
      md["modelspec.implementation"] = "https://github.com/black-forest-labs/flux";
      break;
    case ModelKind::SDXLUNet:
      md["ss_network_module"] = "networks.lora";
      md["ss_base_model_version"] = "sdxl_base_v1-0";
      md["modelspec.architecture"] = "stable-diffusion-xl-v1-base/lora";
      md["modelspec.implementation"] = "https://github.com/Stability-AI/generative-models";
      break;
    case ModelKind::SD15UNet:
      md["ss_network_module"] = "networks.lora";
      md["ss_base_model_version"] = "sd_v1";
      md["modelspec.architecture"] = "stable-diffusion-v1/lora";
      md["modelspec.implementation"] = "diffusers";
      break;
    case ModelKind::SD3: {
      // sd-scripts' sd3_utils: "medium" (no QK norm), "5-medium" (QK norm and dual attention), "5-large".
      const std::string type = !t.sd3_qk_norm ? "medium" : t.sd3_dual_attention ? "5-medium" : "5-large";
      md["ss_network_module"] = "networks.lora_sd3";
      md["ss_base_model_version"] = type;
      md["modelspec.architecture"] = "stable-diffusion-3-" + type + "/lora";
      md["modelspec.implementation"] = "diffusers";
      break;
    }
    default:
      md["ss_network_module"] = t.kind == ModelKind::T5 ? "networks.lora_flux" : "networks.lora";
      break;
  }
  if (std::any_of(modules.begin(), modules.end(), [](const LoraModuleShape& m) { return m.lokr; })) {
    // LyCORIS' kohya network (lycoris/kohya.py) names its algorithm in the network args
    md["ss_network_module"] = "lycoris.kohya";
    md["ss_network_args"] = R"({"algo": "lokr"})";
  }
}

// A kohya ".dora_scale" [rows, 1] for the members of one stored name (model_lora.h's layout notes in
// lora_format.h): a DoRA member's magnitude in its rows, every other member's adapted row norms.
LoraStoredTensor kohya_dora_scale(const std::string& key, const std::vector<const LinearPiece*>& members, int64_t rows,
                                  const std::map<std::string, const LoraModuleShape*>& by_module, bool whole) {
  LoraStoredTensor s{key + ".dora_scale", {rows, 1}, LoraTensorKind::Magnitude, {}, 0};
  int64_t covered = 0;
  for (const LinearPiece* p : members) {
    auto it = by_module.find(p->module);
    const bool own = it != by_module.end() && it->second->dora;
    LoraTensorPiece piece{p->module, whole ? 0 : p->row_begin, whole ? p->out : p->rows, 0, 1, !whole && p->swap_halves, 1.0};
    piece.adapted_row_norms = !own;
    covered += piece.rows;
    s.pieces.push_back(std::move(piece));
  }
  FLAME_CHECK(covered == rows, FLAME_ERROR_INVALID_ARGUMENT, "LoRA module \"", members.front()->module,
              "\": its original tensor has rows no Linear module covers; the kohya format cannot express DoRA on it");
  return s;
}

bool owns_original(const LinearPiece& p) { return p.row_begin == 0 && p.rows == p.original_rows && !p.swap_halves; }

// Whether a LoKr on p is saved under its member name (ComponentTable::kohya_member_prefix): p is a
// row range of a fused original (a Kronecker product cannot be split across the fused rows), or an
// original stored with its row halves swapped (ComfyUI maps the diffusers name with its
// swap_scale_shift, which it applies to the adapter's difference).
bool lokr_saved_as_member(const ComponentTable& t, const LinearPiece& p) {
  return !t.kohya_member_prefix.empty() && !t.kohya_saves_diffusers_names && !owns_original(p) && !p.transposed;
}

// A LoKr module's kohya tensors under key (LyCORIS' names, lora_format.h): its factors and the 0-d
// alpha. Two whole factors store alpha = rank (scale 1, as LyCORIS) and carry m's scale in W2.
void append_kohya_lokr(const ComponentTable& t, const LoraModuleShape& m, const LinearPiece& p, const std::string& key,
                       LoraSavePlan& plan) {
  const bool whole = t.kohya_saves_diffusers_names || owns_original(p) || lokr_saved_as_member(t, p);
  FLAME_CHECK(whole && !p.transposed, FLAME_ERROR_INVALID_ARGUMENT, "LoRA module \"", m.module, "\" is a LoKr on ",
              p.original, ", which the original layout stores ",
              p.transposed ? "transposed" : p.swap_halves ? "with its row halves swapped" : "fused with other modules",
              "; a Kronecker product cannot be split there (use a LoRA, or targets that own their weight)");
  const LokrShape& ls = m.lokr_shape;
  FLAME_CHECK(ls.w1_rows * ls.w2_rows == m.out_features && ls.w1_cols * ls.w2_cols == m.in_features,
              FLAME_ERROR_INVALID_ARGUMENT, "LoRA module \"", m.module, "\": LoKr factors [", ls.w1_rows, ", ",
              ls.w1_cols, "] x [", ls.w2_rows, ", ", ls.w2_cols, "] do not make its weight [", m.out_features, ", ",
              m.in_features, "]");
  const bool both_whole = !ls.w1_low_rank && !ls.w2_low_rank;
  const double scale = m.alpha / static_cast<double>(m.rank);
  for (LokrFactor f : ls.factors()) {
    LoraStoredTensor s{key + "." + lokr_factor_name(f), ls.factor_shape(f, m.rank), LoraTensorKind::Lokr, {}, 0, f};
    LoraTensorPiece piece{m.module, 0, s.shape[0], 0, s.shape[1], false, 1.0};
    if (both_whole && f == LokrFactor::W2) piece.scale = scale;
    s.pieces.push_back(std::move(piece));
    plan.tensors.push_back(std::move(s));
  }
  plan.tensors.push_back({key + ".alpha", {}, LoraTensorKind::Alpha, {}, both_whole ? static_cast<double>(m.rank) : m.alpha});
}

LoraSavePlan plan_kohya(const ComponentTable& t, const std::vector<LoraModuleShape>& modules) {
  LoraSavePlan plan;
  plan.format = LoraFileFormat::Kohya;
  std::map<std::string, const LoraModuleShape*> by_module;
  for (const LoraModuleShape& m : modules) by_module[m.module] = &m;
  std::set<std::string> done;
  for (const LoraModuleShape& first : modules) {
    const LinearPiece& fp = need_module(t, first.module);
    const bool member_key = first.lokr && lokr_saved_as_member(t, fp);
    const std::string stored = t.kohya_saves_diffusers_names || member_key ? fp.module : fp.original;
    if (!done.insert(stored).second) continue;
    if (first.lokr) {
      append_kohya_lokr(t, first, fp,
                        member_key ? t.kohya_member_prefix + underscored(stored) : t.kohya_prefix + "_" + underscored(stored),
                        plan);
      continue;
    }
    std::vector<const LinearPiece*> members;
    if (t.kohya_saves_diffusers_names) {
      members.push_back(&fp);
    } else {
      for (size_t i : t.by_original.at(stored)) members.push_back(&t.pieces[i]);
    }
    int64_t total_rank = 0, original_rows = t.kohya_saves_diffusers_names ? fp.out : fp.original_rows;
    for (const LinearPiece* p : members) {
      if (!by_module.count(p->module)) continue;
      FLAME_CHECK(!by_module.at(p->module)->lokr, FLAME_ERROR_INVALID_ARGUMENT, "LoRA module \"", p->module,
                  "\" is a LoKr and shares its original tensor ", p->original,
                  " with a LoRA module; the kohya format stores one adapter per original tensor");
      FLAME_CHECK(!p->transposed, FLAME_ERROR_INVALID_ARGUMENT, "LoRA module \"", p->module, "\": its original tensor ",
                  p->original, " is stored transposed; the kohya format cannot express a LoRA on it");
      total_rank += by_module.at(p->module)->rank;
    }
    const double stored_scale = first.alpha / static_cast<double>(first.rank);
    const std::string key = t.kohya_prefix + "_" + underscored(stored);
    LoraStoredTensor down{key + ".lora_down.weight", {total_rank, fp.in}, LoraTensorKind::Down, {}, 0};
    LoraStoredTensor up{key + ".lora_up.weight", {original_rows, total_rank}, LoraTensorKind::Up, {}, 0};
    int64_t offset = 0;
    for (const LinearPiece* p : members) {
      auto it = by_module.find(p->module);
      if (it == by_module.end()) continue;  // a zero block: this member has no LoRA
      const LoraModuleShape& m = *it->second;
      const bool whole = t.kohya_saves_diffusers_names;
      down.pieces.push_back({m.module, offset, m.rank, 0, m.in_features, false, 1.0});
      up.pieces.push_back({m.module, whole ? 0 : p->row_begin, whole ? p->out : p->rows, offset, m.rank,
                           !whole && p->swap_halves, (m.alpha / static_cast<double>(m.rank)) / stored_scale});
      offset += m.rank;
    }
    plan.tensors.push_back(std::move(down));
    plan.tensors.push_back(std::move(up));
    plan.tensors.push_back({key + ".alpha", {}, LoraTensorKind::Alpha, {}, stored_scale * static_cast<double>(total_rank)});
    if (std::any_of(members.begin(), members.end(), [&](const LinearPiece* p) {
          return by_module.count(p->module) && by_module.at(p->module)->dora;
        }))
      plan.tensors.push_back(kohya_dora_scale(key, members, original_rows, by_module, t.kohya_saves_diffusers_names));
  }
  add_kohya_metadata(t, modules, plan);
  return plan;
}

// ---- loading ----

enum class KeyRole { Down, Up, Alpha, Magnitude, Lokr };

struct SuffixRule {
  const char* suffix;
  KeyRole role;
  LokrFactor factor = LokrFactor::W1;  // Lokr
};
const SuffixRule kSuffixes[] = {
    {".lora_down.weight", KeyRole::Down},  {".lora_up.weight", KeyRole::Up},
    {".lora_A.weight", KeyRole::Down},     {".lora_B.weight", KeyRole::Up},
    {".lora.down.weight", KeyRole::Down},  {".lora.up.weight", KeyRole::Up},
    {".lora_linear_layer.down.weight", KeyRole::Down}, {".lora_linear_layer.up.weight", KeyRole::Up},
    {".alpha", KeyRole::Alpha},
    {".dora_scale", KeyRole::Magnitude},   {".lora_magnitude_vector", KeyRole::Magnitude},
    {".lokr_w1", KeyRole::Lokr, LokrFactor::W1},   {".lokr_w1_a", KeyRole::Lokr, LokrFactor::W1A},
    {".lokr_w1_b", KeyRole::Lokr, LokrFactor::W1B}, {".lokr_w2", KeyRole::Lokr, LokrFactor::W2},
    {".lokr_w2_a", KeyRole::Lokr, LokrFactor::W2A}, {".lokr_w2_b", KeyRole::Lokr, LokrFactor::W2B},
};

// Keys of adapters FLAME cannot load yet (LyCORIS' LoHa and Tucker LoKr, LoCon's mid, peft's lora
// bias, full diffs), by a piece of their name (after ".") or their ending.
const char* const kUnsupportedMarks[] = {".hada_w", ".lokr_t",
                                         ".hada_t", ".lora_mid.", ".lora_B.bias", ".w_norm", ".b_norm"};
const char* const kUnsupportedEndings[] = {".diff", ".diff_b"};

// The tensors of one LoRA in a file (one base name).
struct Pair {
  const KeyShape* down = nullptr;
  const KeyShape* up = nullptr;
  const KeyShape* alpha = nullptr;
  const KeyShape* magnitude = nullptr;  // DoRA
  std::map<LokrFactor, const KeyShape*> lokr;  // LoKr's factors
  std::string name;  // the module or original name it resolves to
  bool is_original = false;
};

// What a key's base names: this component's module (diffusers name) or original module, or another
// component (own = false); resolve_base fails for a base no rule knows.
struct Resolved {
  bool own = false;
  bool kohya_name = false;
  bool is_original = false;
  std::string name;
};

[[noreturn]] void fail_unknown_module(const ComponentTable& t, const std::string& key, const std::string& name) {
  if (t.convolutions.count(name))
    fail(FLAME_ERROR_INVALID_FORMAT, "LoRA key ", key, ": \"", name, "\" of ", t.class_name,
         " is a convolution; LoRA on convolutions (kohya's conv / LoCon, SD 1.5's 1x1 proj_in / proj_out) is not supported yet");
  fail(FLAME_ERROR_INVALID_FORMAT, "LoRA key ", key, ": ", t.class_name, " has no Linear module \"", name, "\"");
}

Resolved resolve_base(const ComponentTable& t, const std::string& base, const std::string& key) {
  for (const std::string& p : t.kohya_accepted) {
    if (!starts_with(base, p)) continue;
    const std::string rest = base.substr(p.size());
    if (auto it = t.kohya_to_original.find(rest); it != t.kohya_to_original.end()) return {true, true, true, it->second};
    if (auto it = t.kohya_to_module.find(rest); it != t.kohya_to_module.end()) return {true, true, false, it->second};
    fail_unknown_module(t, key, rest);
  }
  for (const std::string& p : kAllKohyaPrefixes)
    if (starts_with(base, p)) return {false, true, false, ""};
  for (const std::string& p : t.dotted_accepted) {
    if (!starts_with(base, p)) continue;
    const std::string rest = base.substr(p.size());
    if (t.by_module.count(rest)) return {true, false, false, rest};
    if (t.by_original.count(rest)) return {true, false, true, rest};
    fail_unknown_module(t, key, rest);
  }
  for (const std::string& p : kAllDottedPrefixes)
    if (starts_with(base, p)) return {false, false, false, ""};
  if (t.by_module.count(base)) return {true, false, false, base};
  if (t.by_original.count(base)) return {true, false, true, base};
  fail(FLAME_ERROR_INVALID_FORMAT, "LoRA key ", key, ": no module of ", t.class_name, " (component ", t.component,
       ") and no known component prefix");
}

// Peft's alpha / rank for a module from lora_adapter_metadata (prefixed by the component). A field the
// JSON lacks has peft's LoraConfig default (r = 8, lora_alpha = 8).
struct PeftConfigView {
  bool present = false;  // the JSON has fields of this component
  int64_t r = 8;
  double lora_alpha = 8.0;
  nlohmann::json rank_pattern = nlohmann::json::object();
  nlohmann::json alpha_pattern = nlohmann::json::object();
};

PeftConfigView read_peft_metadata(const ComponentTable& t, const std::map<std::string, std::string>& metadata) {
  PeftConfigView v;
  auto it = metadata.find("lora_adapter_metadata");
  if (it == metadata.end()) return v;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(it->second);
  } catch (const nlohmann::json::exception& e) {
    fail(FLAME_ERROR_INVALID_FORMAT, "LoRA metadata lora_adapter_metadata is not JSON: ", e.what());
  }
  FLAME_CHECK(j.is_object(), FLAME_ERROR_INVALID_FORMAT, "LoRA metadata lora_adapter_metadata is not a JSON object");
  const std::string p = t.peft_prefix + ".";
  for (auto f = j.begin(); f != j.end(); ++f) v.present = v.present || starts_with(f.key(), p);
  auto field = [&](const std::string& name) -> const nlohmann::json* {
    auto f = j.find(p + name);
    return f == j.end() || f->is_null() ? nullptr : &*f;
  };
  if (const auto* r = field("r")) {
    FLAME_CHECK(r->is_number_integer(), FLAME_ERROR_INVALID_FORMAT, "LoRA metadata ", p, "r is not an integer");
    v.r = r->get<int64_t>();
  }
  if (const auto* a = field("lora_alpha")) {
    FLAME_CHECK(a->is_number(), FLAME_ERROR_INVALID_FORMAT, "LoRA metadata ", p, "lora_alpha is not a number");
    v.lora_alpha = a->get<double>();
  }
  if (const auto* rp = field("rank_pattern")) {
    FLAME_CHECK(rp->is_object(), FLAME_ERROR_INVALID_FORMAT, "LoRA metadata ", p, "rank_pattern is not an object");
    v.rank_pattern = *rp;
  }
  if (const auto* ap = field("alpha_pattern")) {
    FLAME_CHECK(ap->is_object(), FLAME_ERROR_INVALID_FORMAT, "LoRA metadata ", p, "alpha_pattern is not an object");
    v.alpha_pattern = *ap;
  }
  return v;
}

// peft's get_pattern_key: the first key (in the JSON's sorted order) that the module name ends with
// after a '.', or equals when the key starts with '^' (diffusers writes "^<module>" rank patterns since
// peft PR 2419). Keys are taken literally (peft reads them as regular expressions; module names
// written by trainers are literal).
const nlohmann::json* pattern_value(const nlohmann::json& pattern, const std::string& module) {
  for (auto it = pattern.begin(); it != pattern.end(); ++it) {
    const std::string& key = it.key();
    if (!key.empty() && key[0] == '^' ? module == key.substr(1) : module == key || ends_with(module, "." + key))
      return &it.value();
  }
  return nullptr;
}

void check_shape(bool ok, const KeyShape& k, const std::string& what) {
  if (ok) return;
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < k.shape.size(); ++i) s << (i ? ", " : "") << k.shape[i];
  s << "]";
  fail(FLAME_ERROR_INVALID_FORMAT, "LoRA key ", k.name, ": shape ", s.str(), " but ", what);
}

// DoRA's magnitude of an original with `rows` output rows: [rows] (peft) or [rows, 1] (LyCORIS'
// wd_on_out); LyCORIS' input-axis [1, in] gets its own message.
void check_magnitude_shape(const KeyShape& k, int64_t rows, int64_t in) {
  const bool input_axis = k.shape.size() == 2 && k.shape[0] == 1 && k.shape[1] == in && !(rows == 1 && in == 1);
  if (input_axis)
    fail(FLAME_ERROR_INVALID_FORMAT, "LoRA key ", k.name, ": a DoRA scale over input columns [1, ", in,
         "] (LyCORIS' wd_on_out=False) is not supported; peft's and LyCORIS' default layout is [", rows, ", 1]");
  check_shape((k.shape.size() == 1 && k.shape[0] == rows) || (k.shape.size() == 2 && k.shape[0] == rows && k.shape[1] == 1),
              k, "a DoRA magnitude is [" + std::to_string(rows) + "] or [" + std::to_string(rows) + ", 1]");
}

// The LoKr source of one base name's tensors (lora_format.h's LoKr rules).
LoraModuleSource lokr_source(const ComponentTable& t, const Pair& p, std::map<std::string, std::string>& module_key) {
  const KeyShape* first = p.lokr.begin()->second;
  auto factor = [&](LokrFactor f) -> const KeyShape* {
    auto it = p.lokr.find(f);
    return it == p.lokr.end() ? nullptr : it->second;
  };
  FLAME_CHECK(!p.down && !p.up, FLAME_ERROR_INVALID_FORMAT, "LoRA key ", first->name,
              ": LoKr factors and a LoRA pair for the same module");
  FLAME_CHECK(!p.magnitude, FLAME_ERROR_INVALID_FORMAT, "LoRA key ", p.magnitude ? p.magnitude->name : "",
              ": DoRA on a LoKr (LyCORIS' weight_decompose) is not supported");
  const KeyShape *w1 = factor(LokrFactor::W1), *w1a = factor(LokrFactor::W1A), *w1b = factor(LokrFactor::W1B);
  const KeyShape *w2 = factor(LokrFactor::W2), *w2a = factor(LokrFactor::W2A), *w2b = factor(LokrFactor::W2B);
  FLAME_CHECK(w1 ? !w1a && !w1b : w1a && w1b, FLAME_ERROR_INVALID_FORMAT, "LoRA key ", first->name,
              ": a LoKr needs lokr_w1, or lokr_w1_a with lokr_w1_b, and not both");
  FLAME_CHECK(w2 ? !w2a && !w2b : w2a && w2b, FLAME_ERROR_INVALID_FORMAT, "LoRA key ", first->name,
              ": a LoKr needs lokr_w2, or lokr_w2_a with lokr_w2_b, and not both");
  for (const auto& [f, k] : p.lokr) check_shape(k->shape.size() == 2 && k->shape[0] >= 1 && k->shape[1] >= 1, *k, "a LoKr factor is 2-D (Linear LoKr only)");
  if (p.alpha) check_shape(p.alpha->shape.empty() || (p.alpha->shape.size() == 1 && p.alpha->shape[0] == 1), *p.alpha, "an alpha is 0-d");
  LokrShape ls;
  ls.w1_low_rank = w1 == nullptr;
  ls.w2_low_rank = w2 == nullptr;
  int64_t rank = 0;
  if (w1a) {
    check_shape(w1b->shape[0] == w1a->shape[1], *w1b, "lokr_w1_a is [" + std::to_string(w1a->shape[0]) + ", " +
                                                        std::to_string(w1a->shape[1]) + "]: its rows must match");
    rank = w1a->shape[1];
  }
  if (w2a) {
    check_shape(w2b->shape[0] == w2a->shape[1], *w2b, "lokr_w2_a is [" + std::to_string(w2a->shape[0]) + ", " +
                                                        std::to_string(w2a->shape[1]) + "]: its rows must match");
    check_shape(rank == 0 || rank == w2a->shape[1], *w2a, "lokr_w1_a has rank " + std::to_string(rank));
    rank = w2a->shape[1];
  }
  ls.w1_rows = w1 ? w1->shape[0] : w1a->shape[0];
  ls.w1_cols = w1 ? w1->shape[1] : w1b->shape[1];
  ls.w2_rows = w2 ? w2->shape[0] : w2a->shape[0];
  ls.w2_cols = w2 ? w2->shape[1] : w2b->shape[1];
  const LinearPiece* piece = nullptr;
  if (p.is_original) {
    const std::vector<size_t>& members = t.by_original.at(p.name);
    const LinearPiece& only = t.pieces[members.front()];
    FLAME_CHECK(members.size() == 1 && only.rows == only.original_rows && !only.swap_halves && !only.transposed,
                FLAME_ERROR_INVALID_FORMAT, "LoRA key ", first->name, ": ", p.name,
                " is fused, transposed or row-swapped in the original layout; a LoKr on it is not supported");
    piece = &only;
  } else {
    piece = &t.pieces[t.by_module.at(p.name)];
  }
  check_shape(ls.w1_rows * ls.w2_rows == piece->out && ls.w1_cols * ls.w2_cols == piece->in, *first,
              "kron(W1 [" + std::to_string(ls.w1_rows) + ", " + std::to_string(ls.w1_cols) + "], W2 [" +
                  std::to_string(ls.w2_rows) + ", " + std::to_string(ls.w2_cols) + "]) must be the weight of " +
                  piece->module + " [" + std::to_string(piece->out) + ", " + std::to_string(piece->in) + "]");
  auto [mit, fresh] = module_key.emplace(piece->module, first->name);
  FLAME_CHECK(fresh, FLAME_ERROR_INVALID_FORMAT, "LoRA key ", first->name, ": module ", piece->module,
              " already has a LoRA from ", mit->second);
  LoraModuleSource s;
  s.module = piece->module;
  s.rank = rank > 0 ? rank : 1;
  s.in_features = piece->in;
  s.out_features = piece->out;
  s.lokr = true;
  s.lokr_shape = ls;
  for (LokrFactor f : ls.factors()) s.lokr_keys.emplace_back(f, factor(f)->name);
  if (p.alpha) s.alpha_key = p.alpha->name;
  s.alpha = static_cast<double>(s.rank);  // no alpha (or read later): scale 1, as ComfyUI and LyCORIS
  return s;
}

}  // namespace

const char* lokr_factor_name(LokrFactor f) {
  switch (f) {
    case LokrFactor::W1: return "lokr_w1";
    case LokrFactor::W1A: return "lokr_w1_a";
    case LokrFactor::W1B: return "lokr_w1_b";
    case LokrFactor::W2: return "lokr_w2";
    case LokrFactor::W2A: return "lokr_w2_a";
    case LokrFactor::W2B: return "lokr_w2_b";
  }
  fail(FLAME_ERROR_INTERNAL, "unknown LoKr factor");
}

std::pair<int64_t, int64_t> lokr_factorization(int64_t dimension, int64_t factor) {
  FLAME_CHECK(dimension >= 1, FLAME_ERROR_INVALID_ARGUMENT, "LoKr: dimension ", dimension, " < 1");
  if (factor > 0 && dimension % factor == 0) {
    const int64_t m = factor, n = dimension / factor;
    return m > n ? std::make_pair(n, m) : std::make_pair(m, n);
  }
  const int64_t bound = factor < 0 ? dimension : factor;
  int64_t m = 1, n = dimension;
  const int64_t length = m + n;
  while (m < n) {
    int64_t new_m = m + 1;
    while (dimension % new_m != 0) ++new_m;
    const int64_t new_n = dimension / new_m;
    if (new_m + new_n > length || new_m > bound) break;
    m = new_m;
    n = new_n;
  }
  return m > n ? std::make_pair(n, m) : std::make_pair(m, n);
}

std::vector<LokrFactor> LokrShape::factors() const {
  std::vector<LokrFactor> out;
  if (w1_low_rank) {
    out.push_back(LokrFactor::W1A);
    out.push_back(LokrFactor::W1B);
  } else {
    out.push_back(LokrFactor::W1);
  }
  if (w2_low_rank) {
    out.push_back(LokrFactor::W2A);
    out.push_back(LokrFactor::W2B);
  } else {
    out.push_back(LokrFactor::W2);
  }
  return out;
}

std::vector<int64_t> LokrShape::factor_shape(LokrFactor f, int64_t rank) const {
  switch (f) {
    case LokrFactor::W1: return {w1_rows, w1_cols};
    case LokrFactor::W1A: return {w1_rows, rank};
    case LokrFactor::W1B: return {rank, w1_cols};
    case LokrFactor::W2: return {w2_rows, w2_cols};
    case LokrFactor::W2A: return {w2_rows, rank};
    case LokrFactor::W2B: return {rank, w2_cols};
  }
  fail(FLAME_ERROR_INTERNAL, "unknown LoKr factor");
}

int64_t LokrShape::elements(int64_t rank) const {
  int64_t n = 0;
  for (LokrFactor f : factors()) {
    const std::vector<int64_t> shape = factor_shape(f, rank);
    n += shape[0] * shape[1];
  }
  return n;
}

LokrShape lokr_shape(int64_t out_features, int64_t in_features, int64_t rank, int64_t factor, bool decompose_both) {
  const auto [a, c] = lokr_factorization(out_features, factor);
  const auto [b, d] = lokr_factorization(in_features, factor);
  LokrShape s;
  s.w1_rows = a;
  s.w1_cols = b;
  s.w2_rows = c;
  s.w2_cols = d;
  // LyCORIS compares the int rank with a float half: rank < max / 2 exactly
  s.w1_low_rank = decompose_both && 2 * rank < std::max(a, b);
  s.w2_low_rank = 2 * rank < std::max(c, d);
  return s;
}

LoraSavePlan plan_lora_save(const std::string& class_name, const nlohmann::json& full_config, const std::string& component,
                            const std::vector<LoraModuleShape>& modules, LoraFileFormat format) {
  const ComponentTable t = component_table(class_name, full_config, component);
  check_modules(t, modules);
  return format == LoraFileFormat::Peft ? plan_peft(t, modules) : plan_kohya(t, modules);
}

LoraSavePlan merge_lora_save_plans(const std::vector<LoraSavePlan>& plans) {
  FLAME_CHECK(!plans.empty(), FLAME_ERROR_INVALID_ARGUMENT, "LoRA save: no plans to merge");
  LoraSavePlan out;
  out.format = plans.front().format;
  std::set<std::string> keys;
  nlohmann::json peft_meta = nlohmann::json::object();
  bool have_base = false;
  for (const LoraSavePlan& p : plans) {
    FLAME_CHECK(p.format == out.format, FLAME_ERROR_INVALID_ARGUMENT, "LoRA save: plans of different formats cannot share a file");
    for (const LoraStoredTensor& s : p.tensors) {
      FLAME_CHECK(keys.insert(s.key).second, FLAME_ERROR_INVALID_ARGUMENT, "LoRA save: key ", s.key, " is in two plans");
      out.tensors.push_back(s);
    }
    if (out.format == LoraFileFormat::Peft) {
      auto it = p.metadata.find("lora_adapter_metadata");
      if (it != p.metadata.end()) peft_meta.update(nlohmann::json::parse(it->second));
      out.metadata["format"] = "pt";
    } else if (!have_base) {
      if (p.metadata.count("ss_base_model_version")) {
        out.metadata = p.metadata;
        have_base = true;
      } else if (out.metadata.empty()) {
        out.metadata = p.metadata;
      }
    }
  }
  if (out.format == LoraFileFormat::Peft && !peft_meta.empty()) out.metadata["lora_adapter_metadata"] = peft_meta.dump(2);
  return out;
}

LoraLoadPlan plan_lora_load(const std::string& class_name, const nlohmann::json& full_config, const std::string& component,
                            const std::vector<KeyShape>& file_keys, const std::map<std::string, std::string>& metadata) {
  const ComponentTable t = component_table(class_name, full_config, component);
  LoraLoadPlan plan;
  std::map<std::string, Pair> pairs;  // by base, in first-seen order below
  std::vector<std::string> order;
  bool any_kohya = false;
  for (const KeyShape& k : file_keys) {
    const SuffixRule* rule = nullptr;
    for (const SuffixRule& r : kSuffixes)
      if (ends_with(k.name, r.suffix)) {
        rule = &r;
        break;
      }
    if (!rule) {
      bool unsupported = false;
      for (const char* mark : kUnsupportedMarks) unsupported = unsupported || k.name.find(mark) != std::string::npos;
      for (const char* ending : kUnsupportedEndings) unsupported = unsupported || ends_with(k.name, ending);
      if (unsupported)
        fail(FLAME_ERROR_INVALID_FORMAT, "LoRA key ", k.name,
             ": LyCORIS' LoHa and Tucker LoKr (lokr_t2), LoCon mid, bias and diff tensors are not supported yet");
      fail(FLAME_ERROR_INVALID_FORMAT, "LoRA key ", k.name, ": not a LoRA down, up or alpha tensor");
    }
    const std::string base = k.name.substr(0, k.name.size() - std::string(rule->suffix).size());
    const Resolved r = resolve_base(t, base, k.name);
    if (!r.own) {
      plan.other_component_keys.push_back(k.name);
      continue;
    }
    any_kohya = any_kohya || r.kohya_name;
    auto [it, fresh] = pairs.try_emplace(base);
    if (fresh) order.push_back(base);
    Pair& p = it->second;
    p.name = r.name;
    p.is_original = r.is_original;
    const KeyShape** slot = rule->role == KeyRole::Down        ? &p.down
                            : rule->role == KeyRole::Up        ? &p.up
                            : rule->role == KeyRole::Magnitude ? &p.magnitude
                            : rule->role == KeyRole::Lokr      ? &p.lokr[rule->factor]
                                                               : &p.alpha;
    FLAME_CHECK(*slot == nullptr, FLAME_ERROR_INVALID_FORMAT, "LoRA key ", k.name, ": the file also has ", (*slot)->name,
                " for the same module");
    *slot = &k;
  }
  plan.format = any_kohya ? LoraFileFormat::Kohya : LoraFileFormat::Peft;
  const PeftConfigView peft = read_peft_metadata(t, metadata);
  std::map<std::string, std::string> module_key;  // module -> the down key that set it
  for (const std::string& base : order) {
    const Pair& p = pairs.at(base);
    if (!p.lokr.empty()) {
      plan.modules.push_back(lokr_source(t, p, module_key));
      continue;
    }
    const KeyShape* any = p.down ? p.down : p.up ? p.up : p.alpha ? p.alpha : p.magnitude;
    FLAME_CHECK(p.down && p.up, FLAME_ERROR_INVALID_FORMAT, "LoRA key ", any->name, ": its ", p.down ? "up" : "down",
                " tensor is missing");
    check_shape(p.down->shape.size() == 2 && p.down->shape[0] >= 1, *p.down, "a down is [rank, in] (Linear LoRA only)");
    const int64_t rank = p.down->shape[0];
    if (p.alpha) check_shape(p.alpha->shape.empty() || (p.alpha->shape.size() == 1 && p.alpha->shape[0] == 1), *p.alpha, "an alpha is 0-d");
    std::vector<const LinearPiece*> members;
    int64_t rows = 0;
    if (p.is_original) {
      for (size_t i : t.by_original.at(p.name)) members.push_back(&t.pieces[i]);
      rows = members.front()->original_rows;
    } else {
      members.push_back(&t.pieces[t.by_module.at(p.name)]);
      rows = members.front()->out;
    }
    check_shape(p.down->shape[1] == members.front()->in, *p.down,
                "the model's " + p.name + " has " + std::to_string(members.front()->in) + " inputs");
    check_shape(p.up->shape.size() == 2 && p.up->shape[0] == rows && p.up->shape[1] == rank, *p.up,
                "expected [" + std::to_string(rows) + ", " + std::to_string(rank) + "] for " + p.name);
    if (p.magnitude) check_magnitude_shape(*p.magnitude, rows, members.front()->in);
    for (const LinearPiece* m : members) {
      FLAME_CHECK(!(p.is_original && m->transposed), FLAME_ERROR_INVALID_FORMAT, "LoRA key ", p.down->name, ": ", p.name,
                  " is stored transposed in the original layout; a LoRA on it is not supported");
      auto [mit, fresh] = module_key.emplace(m->module, p.down->name);
      FLAME_CHECK(fresh, FLAME_ERROR_INVALID_FORMAT, "LoRA key ", p.down->name, ": module ", m->module,
                  " already has a LoRA from ", mit->second);
      LoraModuleSource s;
      s.module = m->module;
      s.rank = rank;
      s.in_features = m->in;
      s.out_features = m->out;
      s.down = {p.down->name, 0, rank, false};
      if (p.is_original)
        s.up = {p.up->name, m->row_begin, m->rows, m->swap_halves};
      else
        s.up = {p.up->name, 0, m->out, false};
      if (p.magnitude) s.magnitude = {p.magnitude->name, s.up.row_begin, s.up.rows, s.up.swap_halves};
      if (p.alpha) {
        s.alpha_key = p.alpha->name;
        s.alpha = static_cast<double>(rank);  // replaced by the tensor's value
      } else if (!any_kohya && peft.present) {
        if (const nlohmann::json* rv = pattern_value(peft.rank_pattern, m->module)) {
          FLAME_CHECK(rv->is_number_integer() && rv->get<int64_t>() == rank, FLAME_ERROR_INVALID_FORMAT, "LoRA key ",
                      p.down->name, ": rank ", rank, " but lora_adapter_metadata's rank_pattern says ", rv->dump());
        } else {
          FLAME_CHECK(peft.r == rank, FLAME_ERROR_INVALID_FORMAT, "LoRA key ", p.down->name, ": rank ", rank,
                      " but lora_adapter_metadata says r = ", peft.r);
        }
        const nlohmann::json* av = pattern_value(peft.alpha_pattern, m->module);
        FLAME_CHECK(!av || av->is_number(), FLAME_ERROR_INVALID_FORMAT, "LoRA metadata alpha_pattern for ", m->module, " is not a number");
        s.alpha = av ? av->get<double>() : peft.lora_alpha;
      } else {
        s.alpha = static_cast<double>(rank);  // no alpha: scale 1 (ComfyUI, diffusers)
      }
      plan.modules.push_back(std::move(s));
    }
  }
  return plan;
}

std::vector<LoraCandidate> lora_candidate_modules(const std::string& class_name, const nlohmann::json& full_config) {
  const ModelKind kind = model_kind(class_name, full_config);
  const bool denoiser = kind == ModelKind::Flux || kind == ModelKind::SD3 || kind == ModelKind::SDXLUNet || kind == ModelKind::SD15UNet;
  const ComponentTable t = component_table(class_name, full_config, denoiser ? "transformer" : "text_encoder");
  std::vector<LoraCandidate> out;
  for (const LinearPiece& p : t.pieces) out.push_back({p.module, p.in, p.out});
  return out;
}

std::vector<std::string> default_lora_targets(const std::string& class_name, const nlohmann::json& full_config,
                                              LoraTargetConvention convention) {
  const ModelKind kind = model_kind(class_name, full_config);
  const bool kohya = convention == LoraTargetConvention::Kohya;
  switch (kind) {
    case ModelKind::Flux:
      if (!kohya)  // examples/dreambooth/train_dreambooth_lora_flux.py
        return {"attn.to_k", "attn.to_q", "attn.to_v", "attn.to_out.0", "attn.add_k_proj", "attn.add_q_proj",
                "attn.add_v_proj", "attn.to_add_out", "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2"};
      // networks/lora_flux.py: every Linear of DoubleStreamBlock and SingleStreamBlock
      return {"transformer_blocks.*.attn.to_q", "transformer_blocks.*.attn.to_k", "transformer_blocks.*.attn.to_v",
              "transformer_blocks.*.attn.to_out.0", "transformer_blocks.*.attn.add_q_proj",
              "transformer_blocks.*.attn.add_k_proj", "transformer_blocks.*.attn.add_v_proj",
              "transformer_blocks.*.attn.to_add_out", "transformer_blocks.*.ff.net.0.proj", "transformer_blocks.*.ff.net.2",
              "transformer_blocks.*.ff_context.net.0.proj", "transformer_blocks.*.ff_context.net.2",
              "transformer_blocks.*.norm1.linear", "transformer_blocks.*.norm1_context.linear",
              "single_transformer_blocks.*.attn.to_q", "single_transformer_blocks.*.attn.to_k",
              "single_transformer_blocks.*.attn.to_v", "single_transformer_blocks.*.proj_mlp",
              "single_transformer_blocks.*.proj_out", "single_transformer_blocks.*.norm.linear"};
    case ModelKind::SD3:
      if (!kohya)  // examples/dreambooth/train_dreambooth_lora_sd3.py
        return {"attn.add_k_proj", "attn.add_q_proj", "attn.add_v_proj", "attn.to_add_out",
                "attn.to_k",       "attn.to_out.0",   "attn.to_q",       "attn.to_v"};
      // networks/lora_sd3.py: the Linear layers of the joint blocks
      return {"transformer_blocks.*.attn.to_q", "transformer_blocks.*.attn.to_k", "transformer_blocks.*.attn.to_v",
              "transformer_blocks.*.attn.to_out.0", "transformer_blocks.*.attn.add_q_proj",
              "transformer_blocks.*.attn.add_k_proj", "transformer_blocks.*.attn.add_v_proj",
              "transformer_blocks.*.attn.to_add_out", "transformer_blocks.*.attn2.to_q", "transformer_blocks.*.attn2.to_k",
              "transformer_blocks.*.attn2.to_v", "transformer_blocks.*.attn2.to_out.0", "transformer_blocks.*.ff.net.0.proj",
              "transformer_blocks.*.ff.net.2", "transformer_blocks.*.ff_context.net.0.proj",
              "transformer_blocks.*.ff_context.net.2", "transformer_blocks.*.norm1.linear",
              "transformer_blocks.*.norm1_context.linear"};
    case ModelKind::SDXLUNet:
    case ModelKind::SD15UNet: {
      if (!kohya) return {"to_k", "to_q", "to_v", "to_out.0"};  // train_dreambooth_lora_sdxl.py / train_text_to_image_lora.py
      // networks/lora.py: every Linear (and 1x1 conv: not a Linear here) of Transformer2DModel
      std::vector<std::string> t = {"attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q",
                                    "attn2.to_k", "attn2.to_v", "attn2.to_out.0", "ff.net.0.proj", "ff.net.2"};
      if (json_bool(full_config, "use_linear_projection", false)) {
        t.push_back("attentions.*.proj_in");
        t.push_back("attentions.*.proj_out");
      }
      return t;
    }
    case ModelKind::ClipL:
    case ModelKind::ClipG:
      if (!kohya) return {"q_proj", "k_proj", "v_proj", "out_proj"};
      return {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj", "mlp.fc1", "mlp.fc2"};
    case ModelKind::T5:
      if (!kohya) return {"q", "k", "v", "o"};
      return {"SelfAttention.q", "SelfAttention.k", "SelfAttention.v", "SelfAttention.o", "DenseReluDense.wi_0",
              "DenseReluDense.wi_1", "DenseReluDense.wi", "DenseReluDense.wo"};
  }
  return {};
}

namespace {
bool glob_match(const char* s, const char* p) {
  for (; *p; ++p, ++s) {
    if (*p == '*') {
      for (const char* rest = s;; ++rest) {
        if (glob_match(rest, p + 1)) return true;
        if (!*rest) return false;
      }
    }
    if (*s != *p) return false;
  }
  return *s == '\0';
}
}  // namespace

bool lora_target_matches(const std::string& module, const std::string& pattern) {
  if (glob_match(module.c_str(), pattern.c_str())) return true;
  const std::string suffix = "*." + pattern;
  return glob_match(module.c_str(), suffix.c_str());
}

std::vector<LoraCandidate> select_lora_modules(const std::vector<LoraCandidate>& candidates,
                                               const std::vector<std::string>& patterns) {
  std::vector<LoraCandidate> out;
  for (const LoraCandidate& c : candidates)
    for (const std::string& p : patterns)
      if (lora_target_matches(c.module, p)) {
        out.push_back(c);
        break;
      }
  return out;
}

}  // namespace flame::models

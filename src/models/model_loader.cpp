// flame_model_load's work (model_loader.h): files -> component -> architecture and config -> a
// plan naming, for every parameter, the stored tensor (and rows) it comes from -> the copies.
#include "models/model_loader.h"
#include <sys/stat.h>
#include <algorithm>
#include <map>
#include <set>
#include "core/error.h"
#include "models/architecture.h"
#include "models/checkpoint_files.h"
#include "models/clip_keys.h"
#include "models/flux_keys.h"
#include "models/quantized_files.h"
#include "models/sd3_keys.h"
#include "models/t5_keys.h"
#include "models/unet_keys.h"
#include "models/vae_keys.h"
#include "ops/ops.h"

namespace flame::models {

namespace {

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}


// What plan_single_file finds: the architecture, its config and the parameters' sources.
struct LoadPlan {
  std::string architecture;
  nlohmann::json config;
  std::map<std::string, ParamSource> sources;  // by parameter name; empty: the identity (same names)
};

// The prefix of a single file's component (SGM SDXL, SD 3.5 single files, ComfyUI Flux).
std::string component_prefix(const CheckpointFiles& files, const std::string& component) {
  const std::vector<std::string> present = files.component_prefixes();
  auto first_present = [&](std::initializer_list<const char*> candidates) -> std::string {
    for (const char* c : candidates)
      if (std::find(present.begin(), present.end(), c) != present.end()) return c;
    return std::string();
  };
  if (component.empty() || component == "unet" || component == "transformer") return first_present({"model.diffusion_model."});
  if (component == "vae") return first_present({"first_stage_model."});
  if (component == "text_encoder")
    return first_present({"conditioner.embedders.0.transformer.", "text_encoders.clip_l.transformer."});
  if (component == "text_encoder_2")
    return first_present({"conditioner.embedders.1.model.", "text_encoders.clip_g.transformer."});
  if (component == "text_encoder_3") return first_present({"text_encoders.t5xxl.transformer."});
  fail(FLAME_ERROR_INVALID_ARGUMENT, "component \"", component,
       "\" is not one of unet, transformer, vae, text_encoder, text_encoder_2, text_encoder_3");
}

nlohmann::json flux_config_json(const FluxConfig& c) {
  return {{"_class_name", "FluxTransformer2DModel"},
          {"patch_size", 1},
          {"in_channels", c.in_channels},
          {"out_channels", c.out_channels},
          {"num_layers", c.num_layers},
          {"num_single_layers", c.num_single_layers},
          {"attention_head_dim", c.attention_head_dim},
          {"num_attention_heads", c.num_attention_heads},
          {"joint_attention_dim", c.joint_attention_dim},
          {"pooled_projection_dim", c.pooled_projection_dim},
          {"guidance_embeds", c.guidance_embeds},
          {"axes_dims_rope", c.axes_dims_rope}};
}

nlohmann::json unet_config_json(const UNetConfig& c) {
  const bool sdxl = c.projection_class_embeddings_input_dim > 0;
  nlohmann::json down = nlohmann::json::array(), up = nlohmann::json::array(), heads = nlohmann::json::array();
  for (size_t i = 0; i < c.block_out_channels.size(); ++i) {
    down.push_back(c.down_block_has_attention[i] ? "CrossAttnDownBlock2D" : "DownBlock2D");
    heads.push_back(c.block_out_channels[i] / 64);  // SDXL's 64-wide heads ("attention_head_dim" counts heads)
  }
  for (size_t i = c.block_out_channels.size(); i-- > 0;)
    up.push_back(c.down_block_has_attention[i] ? "CrossAttnUpBlock2D" : "UpBlock2D");
  nlohmann::json j = {{"_class_name", "UNet2DConditionModel"},
                      {"in_channels", c.in_channels},
                      {"out_channels", c.out_channels},
                      {"block_out_channels", c.block_out_channels},
                      {"down_block_types", down},
                      {"up_block_types", up},
                      {"mid_block_type", c.mid_block_has_attention ? nlohmann::json("UNetMidBlock2DCrossAttn") : nlohmann::json()},
                      {"layers_per_block", c.layers_per_block},
                      {"cross_attention_dim", c.cross_attention_dim},
                      {"transformer_layers_per_block", c.transformer_layers_per_block},
                      {"use_linear_projection", c.use_linear_projection},
                      {"attention_head_dim", sdxl ? heads : nlohmann::json(8)}};
  if (sdxl) {
    j["addition_embed_type"] = "text_time";
    j["addition_time_embed_dim"] = 256;
    j["projection_class_embeddings_input_dim"] = c.projection_class_embeddings_input_dim;
  }
  return j;
}

// The architecture a config.json names: diffusers' "_class_name" or transformers' "architectures".
std::string architecture_of_config(const nlohmann::json& config, const std::string& source) {
  if (config.contains("_class_name") && config["_class_name"].is_string()) return config["_class_name"].get<std::string>();
  if (config.contains("architectures") && config["architectures"].is_array() && !config["architectures"].empty() &&
      config["architectures"][0].is_string())
    return config["architectures"][0].get<std::string>();
  fail(FLAME_ERROR_INVALID_FORMAT, source, "/config.json names no architecture (no \"_class_name\" or \"architectures\");",
       " pass \"architecture\" in the options");
}

nlohmann::json sd3_config_json(const SD3Config& c) {
  return {{"_class_name", "SD3Transformer2DModel"},
          {"sample_size", c.sample_size},
          {"patch_size", c.patch_size},
          {"in_channels", c.in_channels},
          {"num_layers", c.num_layers},
          {"attention_head_dim", c.attention_head_dim},
          {"num_attention_heads", c.num_attention_heads},
          {"joint_attention_dim", c.joint_attention_dim},
          {"caption_projection_dim", c.caption_projection_dim},
          {"pooled_projection_dim", c.pooled_projection_dim},
          {"out_channels", c.out_channels},
          {"pos_embed_max_size", c.pos_embed_max_size},
          {"qk_norm", c.qk_norm.empty() ? nlohmann::json() : nlohmann::json(c.qk_norm)},
          {"dual_attention_layers", c.dual_attention_layers}};
}

nlohmann::json vae_config_json(const VAEConfig& c) {
  const size_t n = c.block_out_channels.size();
  nlohmann::json j = {{"_class_name", "AutoencoderKL"},
                      {"in_channels", c.in_channels},
                      {"out_channels", c.out_channels},
                      {"down_block_types", std::vector<std::string>(n, "DownEncoderBlock2D")},
                      {"up_block_types", std::vector<std::string>(n, "UpDecoderBlock2D")},
                      {"block_out_channels", c.block_out_channels},
                      {"layers_per_block", c.layers_per_block},
                      {"latent_channels", c.latent_channels},
                      {"norm_num_groups", c.norm_num_groups},
                      {"sample_size", c.sample_size},
                      {"scaling_factor", c.scaling_factor},
                      {"use_quant_conv", c.use_quant_conv},
                      {"use_post_quant_conv", c.use_post_quant_conv},
                      {"mid_block_add_attention", c.mid_block_add_attention},
                      {"force_upcast", c.force_upcast}};
  j["shift_factor"] = c.shift_factor ? nlohmann::json(*c.shift_factor) : nlohmann::json();
  return j;
}

nlohmann::json clip_config_json(const ClipTextConfig& c) {
  // Stability's and BFL's files hold the encoders SD, SDXL, SD3 and Flux ship, whose config.json
  // set eos_token_id 2 (pooling at the highest token id, transformers' legacy rule).
  return {{"architectures", {c.with_projection ? "CLIPTextModelWithProjection" : "CLIPTextModel"}},
          {"vocab_size", c.vocab_size},
          {"hidden_size", c.hidden_size},
          {"intermediate_size", c.intermediate_size},
          {"num_hidden_layers", c.num_hidden_layers},
          {"num_attention_heads", c.num_attention_heads},
          {"max_position_embeddings", c.max_position_embeddings},
          {"hidden_act", c.hidden_act},
          {"projection_dim", c.projection_dim},
          {"layer_norm_eps", 1e-5},
          {"eos_token_id", 2}};
}

nlohmann::json t5_config_json(const T5Config& c) {
  return {{"architectures", {"T5EncoderModel"}},
          {"vocab_size", c.vocab_size},
          {"d_model", c.d_model},
          {"d_kv", c.d_kv},
          {"d_ff", c.d_ff},
          {"num_layers", c.num_layers},
          {"num_heads", c.num_heads},
          {"relative_attention_num_buckets", c.relative_attention_num_buckets},
          {"relative_attention_max_distance", c.relative_attention_max_distance},
          {"feed_forward_proj", c.feed_forward_proj},
          {"layer_norm_epsilon", 1e-6}};
}

// The sources of a key table: each parameter's piece of its stored tensor under prefix (a piece that
// is the whole tensor reads all rows), or, for a file in the diffusers / transformers layout
// (original_names false), each parameter under its own name.
void add_table_sources(const MappedTable& table, const std::string& prefix, bool original_names, LoadPlan& plan) {
  std::map<std::string, const KeyShape*> stored;
  for (const KeyShape& k : table.original) stored[k.name] = &k;
  for (const MappedParameter& p : table.parameters) {
    if (!original_names) {
      plan.sources[p.diffusers_name] = ParamSource{prefix + p.diffusers_name};
      continue;
    }
    ParamSource s{prefix + p.original_name, p.row_begin, p.rows, p.swap_halves, p.transposed};
    const KeyShape* k = stored.at(p.original_name);
    if (!k->shape.empty() && p.row_begin == 0 && p.rows == k->shape[0]) s.rows = -1;
    plan.sources[p.diffusers_name] = s;
  }
}

// Architecture, config and parameter sources of a single file's component (no config.json).
LoadPlan plan_single_file(const CheckpointFiles& view, const nlohmann::json& options) {
  LoadPlan plan;
  if (options.contains("architecture")) {  // the caller names it: the file holds its own names
    plan.architecture = options["architecture"].get<std::string>();
    return plan;
  }
  const bool diffusion = !options.contains("component") || options["component"] == "unet" ||
                         options["component"] == "transformer";
  if (diffusion && is_flux_checkpoint(view.keys())) {
    const FluxCheckpoint f = detect_flux_checkpoint(view.keys());
    plan.architecture = "FluxTransformer2DModel";
    plan.config = flux_config_json(f.config);
    add_table_sources(flux_parameter_table(f.config), f.prefix, f.layout == FluxLayout::Original, plan);
    return plan;
  }
  if (diffusion && is_unet_checkpoint(view.keys())) {
    const UNetCheckpoint u = detect_unet_checkpoint(view.keys());
    plan.architecture = "UNet2DConditionModel";
    plan.config = unet_config_json(u.config);
    add_table_sources(unet_parameter_table(u.config), u.prefix, u.layout == UNetLayout::Original, plan);
    return plan;
  }
  const std::vector<ArchitectureComponent> found = detect_components(view.keys());
  if (!found.empty() && found.front().architecture == Architecture::SD3Transformer) {
    const SD3Checkpoint c = detect_sd3_checkpoint(view.keys());
    plan.architecture = "SD3Transformer2DModel";
    plan.config = sd3_config_json(c.config);
    add_table_sources(sd3_parameter_table(c.config), c.prefix, c.layout == SD3Layout::Original, plan);
    return plan;
  }
  if (!found.empty() && found.front().architecture == Architecture::AutoencoderKL) {
    const VAECheckpoint c = detect_vae_checkpoint(view.keys());
    plan.architecture = "AutoencoderKL";
    plan.config = vae_config_json(c.config);
    add_table_sources(vae_parameter_table(c.config), c.prefix, c.layout == VAELayout::Original, plan);
    return plan;
  }
  if (!found.empty() && (found.front().architecture == Architecture::CLIPText ||
                         found.front().architecture == Architecture::CLIPTextWithProjection)) {
    const ClipCheckpoint c = detect_clip_checkpoint_at(view.keys(), found.front().prefix);
    plan.architecture = c.config.with_projection ? "CLIPTextModelWithProjection" : "CLIPTextModel";
    plan.config = clip_config_json(c.config);
    add_table_sources(clip_parameter_table(c.config), c.prefix, c.layout == ClipLayout::OpenCLIP, plan);
    return plan;
  }
  if (!found.empty() && found.front().architecture == Architecture::T5Encoder) {
    const T5Checkpoint c = detect_t5_checkpoint(view.keys());
    plan.architecture = "T5EncoderModel";
    plan.config = t5_config_json(c.config);
    add_table_sources(t5_parameter_table(c.config), c.prefix, true, plan);
    if (c.embedding_name != "shared.weight") plan.sources["shared.weight"] = {c.prefix + c.embedding_name};
    return plan;
  }
  FLAME_CHECK(options.contains("architecture"), FLAME_ERROR_INVALID_FORMAT, view.source(),
              ": the architecture cannot be told from the tensors' names (",
              view.keys().empty() ? std::string("no tensors") : "first: " + view.keys().front().name,
              "); pass \"architecture\" (and \"config\") in the options");
  plan.architecture = options["architecture"].get<std::string>();
  return plan;  // same names as the architecture's parameters
}

// Buffers reference classes keep in their files but do not load as parameters, and ComfyUI's
// scaled-fp8 markers (quantized_files.h).
bool ignorable_extra(const std::string& key) {
  return (key.size() >= 12 && key.compare(key.size() - 12, 12, "position_ids") == 0) || is_ignorable_quantization_key(key);
}

// Other names under which files store a parameter: tied weights transformers may write under
// either name (T5's shared embedding is also encoder.embed_tokens).
std::vector<std::string> tied_aliases(const std::string& param) {
  if (param == "shared.weight") return {"encoder.embed_tokens.weight"};
  return {};
}

// The stored key of a parameter without an explicit source: its own name, a tied alias, or
// transformers 5's CLIPTextModel names (without "text_model.").
std::string same_name_key(const CheckpointFiles& view, const std::string& param) {
  if (view.contains(param)) return param;
  for (const std::string& alias : tied_aliases(param))
    if (view.contains(alias)) return alias;
  const std::string stripped = param.rfind("text_model.", 0) == 0 ? param.substr(11) : std::string();
  if (!stripped.empty() && view.contains(stripped)) return stripped;
  fail(FLAME_ERROR_INVALID_FORMAT, view.source(), " lacks the tensor ", param);
}

// Copies every parameter; checks shapes and that no stored tensor is left over.
void copy_parameters(Model& model, const ModelLoadPlan& plan) {
  const CheckpointFiles& view = plan.view;
  GradMode no_grad = model.ctx().mode;
  no_grad.grad_enabled = false;
  GradModeGuard guard(model.ctx(), no_grad);
  std::map<std::string, const KeyShape*> shapes;
  for (const KeyShape& k : view.keys()) shapes[k.name] = &k;
  std::set<std::string> used;
  const CheckpointFiles::PinnedUploads pinned(view, model.ctx());  // multi-threaded, pinned uploads
  const ParamStore& store = model.params();
  for (size_t i = 0; i < store.size(); ++i) {
    const std::string& name = store.names()[i];
    const Tensor& dst = store.tensors()[i];
    if (model.is_quantization_scale(name)) continue;  // read with its weight
    ParamSource src;
    auto it = plan.sources.find(name);
    if (it != plan.sources.end()) src = it->second;
    else src.key = same_name_key(view, name);
    FLAME_CHECK(shapes.count(src.key), FLAME_ERROR_INVALID_FORMAT, view.source(), " lacks the tensor ", src.key,
                " (parameter ", name, ")");
    const KeyShape& k = *shapes[src.key];
    std::vector<int64_t> expect = model.logical_shape(name);  // an NF4 weight: [out, in], not its packed codes
    if (src.transposed && expect.size() == 2) std::swap(expect[0], expect[1]);
    std::vector<int64_t> stored = k.shape;
    if (src.rows >= 0 && !stored.empty()) stored[0] = src.rows;
    // Linear weights stored as 1x1 convolutions ([O, I, 1, 1]) and the reverse load as their reshape.
    auto numel = [](const std::vector<int64_t>& s) {
      int64_t n = 1;
      for (int64_t d : s) n *= d;
      return n;
    };
    const bool same = stored == expect;
    const bool reshaped = !same && numel(stored) == numel(expect) && stored.size() != expect.size() && !expect.empty() &&
                          !stored.empty() && stored[0] == expect[0];
    FLAME_CHECK(same || reshaped, FLAME_ERROR_INVALID_FORMAT, view.source(), ": tensor ", src.key, " has shape ",
                shape_str(k.shape), " but parameter ", name, " needs ", shape_str(expect),
                src.rows >= 0 ? " (rows of a fused tensor)" : "");
    // Quantised weights (and files storing scaled F8 weights) go through quantized_files.h.
    const std::string scale_key = read_weight(model, view, src, name, dst);
    if (!scale_key.empty()) used.insert(scale_key);
    used.insert(src.key);
    for (const std::string& alias : tied_aliases(name)) used.insert(alias);  // the same tensor written twice
  }
  std::vector<std::string> extra;
  for (const KeyShape& k : view.keys())
    if (!used.count(k.name) && !ignorable_extra(k.name)) extra.push_back(k.name);
  if (!extra.empty()) {
    std::string listed;
    for (size_t i = 0; i < extra.size() && i < 8; ++i) listed += (i ? ", " : "") + extra[i];
    fail(FLAME_ERROR_INVALID_FORMAT, view.source(), " holds ", extra.size(), " tensor(s) ", model.class_name(),
         " has no parameter for: ", listed, extra.size() > 8 ? ", ..." : "");
  }
}

// The options' dtype, else bf16 when every float tensor is stored in 16 or 8 bits (the f32 scales
// of scaled F8 weights aside), else f32.
std::string default_dtype(const CheckpointFiles& view) {
  bool any = false;
  for (const KeyShape& k : view.keys()) {
    if (is_scale_weight_name(k.name) || is_ignorable_quantization_key(k.name)) continue;
    const StoredTensor& s = view.stored(k.name);
    if (s.dtype_name == "F32" || s.dtype_name == "F64") return "f32";
    any = any || s.dtype_name == "BF16" || s.dtype_name == "F16" || s.dtype_name.rfind("F8", 0) == 0;
  }
  return any ? "bf16" : "f32";
}

}  // namespace

void read_parameter(const CheckpointFiles& view, const ParamSource& src, const Tensor& dst) {
  if (src.transposed) {
    FLAME_CHECK(dst->ndim() == 2, FLAME_ERROR_INTERNAL, "a transposed source for a non-matrix parameter (", src.key, ")");
    Tensor staged = ops::empty(dst->ctx(), {dst->shape[1], dst->shape[0]}, dst->dtype);
    view.read_into(src.key, staged, src.row_begin, src.rows);
    ops::copy_into(dst, ops::transpose(staged, 0, 1));
  } else if (src.swap_halves) {
    const int64_t h = (src.rows >= 0 ? src.rows : dst->shape[0]) / 2;  // rows -1: the whole tensor
    view.read_into(src.key, ops::narrow(dst, 0, 0, h), src.row_begin + h, h);
    view.read_into(src.key, ops::narrow(dst, 0, h, h), src.row_begin, h);
  } else {
    view.read_into(src.key, dst, src.row_begin, src.rows);
  }
}

ModelLoadPlan plan_model_load(const std::string& path, const nlohmann::json& options_in) {
  nlohmann::json options = options_in.is_null() ? nlohmann::json::object() : options_in;
  FLAME_CHECK(options.is_object(), FLAME_ERROR_INVALID_ARGUMENT, "options must be a JSON object");
  parse_model_options(options);  // unknown keys and bad values fail before any file is opened
  for (const char* key : {"architecture", "component"})
    FLAME_CHECK(!options.contains(key) || options[key].is_string(), FLAME_ERROR_INVALID_ARGUMENT, "options: \"", key,
                "\" must be a string");
  FLAME_CHECK(!options.contains("config") || options["config"].is_object(), FLAME_ERROR_INVALID_ARGUMENT,
              "options: \"config\" must be a JSON object");
  const std::string component = options.value("component", std::string());

  const bool folder = is_directory(path);
  const CheckpointFiles files = CheckpointFiles::open(path, folder ? component : std::string());
  LoadPlan plan;
  CheckpointFiles view = files;
  if (files.layout() == CheckpointLayout::SingleFile) {
    // A file holding several components (SDXL, SD 3.5 single files, ComfyUI repacks) is read
    // through the chosen component's prefix; a file without component prefixes is the component.
    const std::string prefix = component_prefix(files, component);
    FLAME_CHECK(prefix.empty() ? component.empty() || files.component_prefixes().empty() : true,
                FLAME_ERROR_INVALID_ARGUMENT, path, " holds no component \"", component, "\"");
    if (!prefix.empty()) view = files.with_prefix(prefix);
    plan = plan_single_file(view, options);
  } else {
    plan.config = nlohmann::json::parse(files.config_json());
    plan.architecture = architecture_of_config(plan.config, files.source());
  }
  if (options.contains("architecture")) plan.architecture = options["architecture"].get<std::string>();
  if (options.contains("config")) plan.config = options["config"];
  if (!options.contains("dtype")) options["dtype"] = default_dtype(view);
  return ModelLoadPlan{plan.architecture, plan.config, parse_model_options(options), std::move(plan.sources), view};
}

std::shared_ptr<Model> load_model(Context& ctx, const std::string& path, const nlohmann::json& options) {
  const ModelLoadPlan plan = plan_model_load(path, options);
  std::shared_ptr<Model> model = create_model(ctx, plan.architecture, plan.config, plan.options);
  copy_parameters(*model, plan);
  return model;
}

}  // namespace flame::models

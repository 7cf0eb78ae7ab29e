// Loading or creating the denoiser (see model_setup.h).
#include "model_setup.h"

#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace flame_train {
namespace {

// Tiny configurations in the real classes (the GPU tests' sizes): Flux with guidance and 4 latent
// channels (packed to 16), an SDXL-shaped UNet with text_time conditioning (text_embeds 24 + 6 time
// ids x 8), an SD3.5-shaped MMDiT with dual attention and RMS q/k norm.
constexpr const char* kDemoFlux =
    R"({"num_layers": 2, "num_single_layers": 2, "attention_head_dim": 16, "num_attention_heads": 2,
        "in_channels": 16, "joint_attention_dim": 24, "pooled_projection_dim": 20, "guidance_embeds": true,
        "axes_dims_rope": [4, 6, 6]})";
constexpr const char* kDemoSdxl = R"({"block_out_channels": [32, 48, 64], "layers_per_block": 2,
  "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
  "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
  "transformer_layers_per_block": [1, 2, 3], "attention_head_dim": [1, 2, 4], "cross_attention_dim": 40,
  "use_linear_projection": true, "norm_num_groups": 8, "addition_embed_type": "text_time",
  "addition_time_embed_dim": 8, "projection_class_embeddings_input_dim": 72})";
constexpr const char* kDemoSd3 =
    R"({"sample_size": 8, "patch_size": 2, "in_channels": 4, "num_layers": 3, "attention_head_dim": 8,
        "num_attention_heads": 4, "joint_attention_dim": 24, "caption_projection_dim": 32,
        "pooled_projection_dim": 20, "out_channels": 4, "pos_embed_max_size": 12,
        "dual_attention_layers": [0, 2], "qk_norm": "rms_norm"})";
constexpr const char* kModelOptions = R"({"dtype": "bf16"})";

int64_t integer(const nlohmann::json& c, const char* key) {
  if (!c.contains(key) || !c[key].is_number_integer())
    throw std::runtime_error(std::string("the model configuration has no integer '") + key + "'");
  return c[key].get<int64_t>();
}

}  // namespace

const char* family_name(ModelFamily f) {
  switch (f) {
    case ModelFamily::Flux: return "flux";
    case ModelFamily::Sdxl: return "sdxl";
    case ModelFamily::Sd3: return "sd3";
  }
  return "?";
}

bool is_demo_model_path(const std::string& path) { return path.rfind("demo:", 0) == 0; }

const char* demo_model_config(const std::string& family, const char** architecture) {
  if (family == "flux") {
    *architecture = "FluxTransformer2DModel";
    return kDemoFlux;
  }
  if (family == "sdxl") {
    *architecture = "UNet2DConditionModel";
    return kDemoSdxl;
  }
  if (family == "sd3") {
    *architecture = "SD3Transformer2DModel";
    return kDemoSd3;
  }
  throw std::invalid_argument("unknown demo model 'demo:" + family + "' (demo:flux, demo:sdxl, demo:sd3)");
}

ModelShapes shapes_from_config(const std::string& architecture, const std::string& config_json) {
  const nlohmann::json c = nlohmann::json::parse(config_json);
  ModelShapes s;
  if (architecture == "FluxTransformer2DModel") {
    s.family = ModelFamily::Flux;
    s.latent_channels = integer(c, "in_channels") / 4;
    s.text_dim = integer(c, "joint_attention_dim");
    s.pooled_dim = integer(c, "pooled_projection_dim");
    s.guidance_embeds = c.value("guidance_embeds", false);
    s.latent_multiple = 2;  // 2x2 packing
  } else if (architecture == "SD3Transformer2DModel") {
    s.family = ModelFamily::Sd3;
    s.latent_channels = integer(c, "in_channels");
    s.text_dim = integer(c, "joint_attention_dim");
    s.pooled_dim = integer(c, "pooled_projection_dim");
    s.latent_multiple = integer(c, "patch_size");
  } else if (architecture == "UNet2DConditionModel") {
    if (c.value("addition_embed_type", std::string()) != "text_time")
      throw std::runtime_error("flame-train trains SDXL UNets (addition_embed_type \"text_time\"); this UNet has none");
    s.family = ModelFamily::Sdxl;
    s.latent_channels = integer(c, "in_channels");
    s.text_dim = integer(c, "cross_attention_dim");
    s.pooled_dim = integer(c, "projection_class_embeddings_input_dim") - 6 * integer(c, "addition_time_embed_dim");
    const int64_t blocks = static_cast<int64_t>(c.at("block_out_channels").size());
    s.latent_multiple = int64_t{1} << (blocks > 0 ? blocks - 1 : 0);
  } else {
    throw std::runtime_error("flame-train trains Flux, SDXL and SD3 denoisers, not " + architecture);
  }
  return s;
}

std::string component_load_options(const std::string& source, const std::string& model_path,
                                   const std::string& component) {
  nlohmann::json o = nlohmann::json::parse(kModelOptions);
  namespace fs = std::filesystem;
  const bool bundled_file = fs::is_regular_file(source) && source == model_path;
  const bool pipeline_folder = fs::is_directory(source) && fs::exists(fs::path(source) / "model_index.json");
  if (bundled_file || pipeline_folder) o["component"] = component;
  return o.dump();
}

namespace {

// A diffusers pipeline folder's denoiser: "transformer" (Flux, SD3) or "unet" (SDXL), as its
// model_index.json lists them; empty for anything else (a model folder, a single file, a demo).
std::string pipeline_denoiser(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path index = fs::path(path) / "model_index.json";
  if (!fs::is_directory(path) || !fs::exists(index)) return std::string();
  std::ifstream in(index);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_object() && j.contains("transformer")) return "transformer";
  if (j.is_object() && j.contains("unet")) return "unet";
  throw std::runtime_error("model.path: " + index.string() + " names neither a transformer nor a unet component");
}

}  // namespace

std::string denoiser_model_options(const TrainConfig& config) {
  nlohmann::json o = nlohmann::json::parse(kModelOptions);
  const std::string component = pipeline_denoiser(config.model.path);
  if (!component.empty()) o["component"] = component;
  if (config.model.quantize != "none") o["quantize"] = {{"dtype", config.model.quantize}, {"scale", config.model.quantize_scale}};
  if (config.model.offload_budget_gib > 0)
    o["offload"] = {{"budget_bytes", static_cast<uint64_t>(config.model.offload_budget_gib * 1073741824.0)}};
  return o.dump();
}

LoadedModel load_training_model(flame_ctx_t ctx, const std::string& path, const std::string& arch,
                                const std::string& options) {
  LoadedModel m;
  if (is_demo_model_path(path)) {
    const char* architecture = nullptr;
    const char* config = demo_model_config(path.substr(5), &architecture);
    check(flame_model_create(ctx, architecture, config, options.c_str(), m.model.out()), "flame_model_create");
  } else {
    check(flame_model_load(ctx, path.c_str(), options.c_str(), m.model.out()), "flame_model_load");
  }
  const char* architecture = nullptr;
  const char* config = nullptr;
  check(flame_model_architecture(m.model.get(), &architecture), "flame_model_architecture");
  check(flame_model_config(m.model.get(), &config), "flame_model_config");
  m.shapes = shapes_from_config(architecture, config);
  if (arch != "auto" && arch != family_name(m.shapes.family))
    throw std::runtime_error("model.arch is " + arch + " but " + path + " holds a " + family_name(m.shapes.family) +
                             " model (" + architecture + ")");
  return m;
}

}  // namespace flame_train

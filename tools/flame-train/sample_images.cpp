// Sample images: conditioning, VAE, rounds and files (see sample_images.h).
#include "sample_images.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "images.h"
#include "sample_grid.h"

namespace flame_train {
namespace {

constexpr const char* kVaeOptions = R"({"dtype": "bf16"})";

std::vector<int64_t> shape_of(flame_tensor_t t) {
  int32_t nd = 0;
  check(flame_tensor_ndim(t, &nd), "flame_tensor_ndim");
  std::vector<int64_t> dims(static_cast<size_t>(nd));
  if (nd > 0) check(flame_tensor_shape(t, dims.data(), nd), "flame_tensor_shape");
  return dims;
}

// A second owned reference to t.
Tensor shared(flame_tensor_t t) {
  check(flame_tensor_retain(t), "flame_tensor_retain");
  return Tensor(t);
}

Tensor zeros_like_shape(flame_ctx_t ctx, flame_tensor_t t) {
  const std::vector<int64_t> shape = shape_of(t);
  Tensor out;
  check(flame_zeros(ctx, shape.data(), static_cast<int32_t>(shape.size()), FLAME_DTYPE_F32, out.out()), "flame_zeros");
  return out;
}

// The demo's conditioning: prompt k takes demo sample k mod count; the negative is zeros.
SampleConditioning demo_conditioning(flame_ctx_t ctx, const ModelShapes& shapes, size_t prompts,
                                     const std::vector<TrainingSample>& samples) {
  if (samples.empty()) throw std::runtime_error("sampling: the demo has no samples");
  SampleConditioning c;
  for (size_t k = 0; k < prompts; ++k) {
    const TrainingSample& s = samples[k % samples.size()];
    c.prompt_embeds.push_back(shared(s.prompt_embeds.get()));
    c.pooled.push_back(shared(s.pooled.get()));
  }
  if (shapes.family != ModelFamily::Flux) {
    c.negative_prompt_embeds = zeros_like_shape(ctx, samples.front().prompt_embeds.get());
    c.negative_pooled = zeros_like_shape(ctx, samples.front().pooled.get());
  }
  return c;
}

std::string vae_source(const TrainConfig& config) {
  if (!config.model.vae.empty()) return config.model.vae;
  if (std::filesystem::is_directory(config.model.path)) return (std::filesystem::path(config.model.path) / "vae").string();
  throw std::runtime_error("sampling needs the VAE: model.path " + config.model.path +
                           " is a single file, so set model.vae (it may name model.path when the file bundles its VAE)");
}

void make_directory(const std::string& path) {
  if (::mkdir(path.c_str(), 0777) != 0 && errno != EEXIST) throw std::runtime_error("cannot create " + path);
}

}  // namespace

VaeFacts vae_facts_from_config(const std::string& config_json) {
  const nlohmann::json c = nlohmann::json::parse(config_json, nullptr, false);
  if (c.is_discarded() || !c.is_object()) throw std::runtime_error("the VAE's configuration is not a JSON object");
  VaeFacts f;
  if (!c.contains("latent_channels") || !c["latent_channels"].is_number_integer())
    throw std::runtime_error("the VAE's configuration has no integer latent_channels");
  f.latent_channels = c["latent_channels"].get<int64_t>();
  const auto blocks = c.find("block_out_channels");
  if (blocks == c.end() || !blocks->is_array() || blocks->empty())
    throw std::runtime_error("the VAE's configuration has no block_out_channels");
  f.factor = int64_t{1} << (blocks->size() - 1);
  if (c.contains("scaling_factor") && c["scaling_factor"].is_number()) f.scaling_factor = c["scaling_factor"].get<double>();
  if (c.contains("shift_factor") && c["shift_factor"].is_number()) f.shift_factor = c["shift_factor"].get<double>();
  if (f.scaling_factor == 0) throw std::runtime_error("the VAE's scaling_factor is 0");
  return f;
}

std::string demo_vae_config(ModelFamily family, int64_t latent_channels) {
  nlohmann::json c = nlohmann::json::parse(R"({"block_out_channels": [8, 16, 16, 16], "layers_per_block": 1,
      "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"],
      "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"],
      "norm_num_groups": 8})");
  c["latent_channels"] = latent_channels;
  switch (family) {  // the real VAEs' factors (training_data.h)
    case ModelFamily::Flux:
      c["scaling_factor"] = 0.3611;
      c["shift_factor"] = 0.1159;
      break;
    case ModelFamily::Sd3:
      c["scaling_factor"] = 1.5305;
      c["shift_factor"] = 0.0609;
      break;
    case ModelFamily::Sdxl: c["scaling_factor"] = 0.13025; break;
  }
  return c.dump();
}

Model load_vae(flame_ctx_t ctx, const std::string& source, const std::string& model_path) {
  Model vae;
  check(flame_model_load(ctx, source.c_str(), component_load_options(source, model_path, "vae").c_str(), vae.out()),
        ("loading the VAE " + source).c_str());
  const char* architecture = nullptr;
  check(flame_model_architecture(vae.get(), &architecture), "flame_model_architecture");
  if (std::string(architecture) != "AutoencoderKL")
    throw std::runtime_error(std::string("the VAE ") + source + " is a " + architecture + ", not an AutoencoderKL");
  return vae;
}

std::string sample_image_path(const TrainConfig& config, int64_t step) {
#ifdef FLAME_TRAIN_NO_IMAGES
  const char* extension = "ppm";
#else
  const char* extension = "png";
#endif
  char suffix[64];
  std::snprintf(suffix, sizeof suffix, "-step%06lld.%s", static_cast<long long>(step), extension);
  return config.output.dir + "/samples/" + config.output.name + suffix;
}

SampleImages::SampleImages(flame_ctx_t ctx, const TrainConfig& config, const ModelShapes& shapes, bool demo,
                           const std::vector<TrainingSample>& samples)
    : ctx_(ctx), config_(config), shapes_(shapes), demo_(demo) {
  const size_t prompts = config.sample.prompts.size();
  if (prompts == 0) throw std::runtime_error("sampling: sample.prompts is empty");
  if (demo) {
    conditioning_ = demo_conditioning(ctx, shapes, prompts, samples);
  } else {
    conditioning_ = load_sample_conditioning(ctx, config.data.cache_file, shapes);
    if (conditioning_.prompt_embeds.size() != prompts)
      throw std::runtime_error("sampling: the latent cache " + config.data.cache_file + " holds the conditioning of " +
                               std::to_string(conditioning_.prompt_embeds.size()) + " sample prompts, sample.prompts has " +
                               std::to_string(prompts) + ": run the caching stage again with these prompts");
  }

  {
    const Model vae = open_vae();
    const char* vae_config = nullptr;
    check(flame_model_config(vae.get(), &vae_config), "flame_model_config");
    vae_ = vae_facts_from_config(vae_config);
  }
  if (vae_.latent_channels != shapes.latent_channels)
    throw std::runtime_error("sampling: the VAE has " + std::to_string(vae_.latent_channels) +
                             " latent channels, the model takes " + std::to_string(shapes.latent_channels));

  settings_.steps = config.sample.steps;
  settings_.guidance_scale = config.sample.guidance_scale;
  settings_.sdxl_sampler = parse_sdxl_sampler(config.sample.sampler);
  settings_.prediction = parse_prediction_type(config.training.prediction_type);
  if (config.training.flow_shift > 0) settings_.sd3_shift = config.training.flow_shift;
  if (config.sample.width > 0) {
    const int64_t unit = vae_.factor * shapes.latent_multiple;
    if (config.sample.width % unit || config.sample.height % unit)
      throw std::runtime_error("sampling: sample.width x sample.height (" + std::to_string(config.sample.width) + "x" +
                               std::to_string(config.sample.height) + ") must be multiples of " + std::to_string(unit) +
                               " (the VAE's factor times the model's latent multiple)");
    settings_.pixel_width = config.sample.width;
    settings_.pixel_height = config.sample.height;
  } else {
    if (samples.empty()) throw std::runtime_error("sampling: no training sample gives the size; set sample.width / height");
    settings_.pixel_width = samples.front().width * vae_.factor;
    settings_.pixel_height = samples.front().height * vae_.factor;
  }
  settings_.latent_width = settings_.pixel_width / vae_.factor;
  settings_.latent_height = settings_.pixel_height / vae_.factor;
}

Model SampleImages::open_vae() const {
  Model vae;
  if (demo_) {
    ReseededGenerator generator(ctx_, config_.training.seed);  // the same random VAE in every round
    const std::string vae_config = demo_vae_config(shapes_.family, shapes_.latent_channels);
    check(flame_model_create(ctx_, "AutoencoderKL", vae_config.c_str(), kVaeOptions, vae.out()),
          "flame_model_create (demo VAE)");
    return vae;
  }
  return load_vae(ctx_, vae_source(config_), config_.model.path);
}

// latent [1, C, h, w] in the denoiser's scale -> the image [3, H, W] f32 on the host.
std::vector<float> SampleImages::decode(flame_model_t vae, const Tensor& latent) const {
  Tensor unscaled, shifted;
  check(flame_mul_scalar(latent.get(), 1.0 / vae_.scaling_factor, unscaled.out()), "flame_mul_scalar");
  check(flame_add_scalar(unscaled.get(), vae_.shift_factor, shifted.out()), "flame_add_scalar");
  Params inputs, outputs;
  check(flame_params_create(ctx_, inputs.out()), "flame_params_create");
  check(flame_params_add(inputs.get(), "latent_sample", shifted.get()), "latent_sample");
  check(flame_model_forward(vae, inputs.get(), outputs.out()), "flame_model_forward (VAE decode)");
  flame_tensor_t sample = nullptr;
  check(flame_params_find(outputs.get(), "sample", &sample), "flame_params_find");
  if (!sample) throw std::runtime_error("the VAE returned no 'sample' output");
  Tensor image;
  check(flame_to_dtype(sample, FLAME_DTYPE_F32, image.out()), "flame_to_dtype");
  const std::vector<int64_t> shape = shape_of(image.get());
  if (shape.size() != 4 || shape[0] != 1 || shape[1] != 3 || shape[2] != settings_.pixel_height ||
      shape[3] != settings_.pixel_width)
    throw std::runtime_error("the VAE decoded an image of another shape than [1, 3, " +
                             std::to_string(settings_.pixel_height) + ", " + std::to_string(settings_.pixel_width) + "]");
  std::vector<float> pixels(static_cast<size_t>(3 * shape[2] * shape[3]));
  check(flame_to_host(image.get(), pixels.data(), pixels.size() * sizeof(float)), "flame_to_host");
  return pixels;
}

std::string SampleImages::write(flame_model_t model, int64_t step) {
  std::vector<ImageRGB8> images;
  {
    InferenceScope inference(ctx_, model, true);
    const Model vae = open_vae();
    for (size_t k = 0; k < conditioning_.prompt_embeds.size(); ++k) {
      PromptConditioning prompt;
      prompt.embeds = conditioning_.prompt_embeds[k].get();
      prompt.pooled = conditioning_.pooled[k].get();
      prompt.negative_embeds = conditioning_.negative_prompt_embeds.get();
      prompt.negative_pooled = conditioning_.negative_pooled.get();
      const Tensor latent = sample_latent(ctx_, model, shapes_, settings_, prompt, config_.sample.seed + k);
      const std::vector<float> pixels = decode(vae.get(), latent);
      const size_t bad = static_cast<size_t>(
          std::count_if(pixels.begin(), pixels.end(), [](float v) { return !std::isfinite(v); }));
      if (bad > 0)  // written as black; said so, since the image then shows a diverged model
        std::fprintf(stderr, "flame-train: warning: sample %zu of step %lld has %zu non-finite values (shown black)\n",
                     k, static_cast<long long>(step), bad);
      images.push_back(decoded_to_rgb8(pixels, static_cast<int>(settings_.pixel_height),
                                       static_cast<int>(settings_.pixel_width)));
    }
  }
  make_directory(config_.output.dir + "/samples");
  const std::string path = sample_image_path(config_, step);
  const ImageRGB8 row = image_row(images);
#ifdef FLAME_TRAIN_NO_IMAGES
  write_ppm(path, row);
#else
  write_png_rgb8(path, row);
#endif
  return path;
}

}  // namespace flame_train

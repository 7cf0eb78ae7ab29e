// The caching stage (see cache_writer.h): family and sources, reuse decision, text pass, image pass,
// the file.
#include "cache_writer.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "cache_fingerprint.h"
#include "cache_plan.h"
#include "clip_tokenizer.h"
#include "dataset.h"
#include "model_setup.h"
#include "objectives.h"
#include "sample_images.h"
#include "sampling.h"
#include "t5_tokenizer.h"

namespace flame_train {
namespace {

namespace fs = std::filesystem;

enum class HiddenOutput { None, Penultimate, Last };

// What the pipeline takes from one encoder (diffusers' encode_prompt of each family).
struct EncoderRole {
  const char* component;     // diffusers' slot, for bundled files
  HiddenOutput hidden;
  const char* pooled;        // output name, or nullptr
  int max_length;
};

EncoderRole encoder_role(const std::string& family, TextEncoderKind kind) {
  if (family == "flux")
    return kind == TextEncoderKind::T5 ? EncoderRole{"text_encoder_2", HiddenOutput::Last, nullptr, 512}
                                       : EncoderRole{"text_encoder", HiddenOutput::None, "pooler_output", 77};
  if (family == "sdxl")
    return kind == TextEncoderKind::ClipG ? EncoderRole{"text_encoder_2", HiddenOutput::Penultimate, "text_embeds", 77}
                                          : EncoderRole{"text_encoder", HiddenOutput::Penultimate, nullptr, 77};
  if (kind == TextEncoderKind::T5) return {"text_encoder_3", HiddenOutput::Last, nullptr, 256};
  return {kind == TextEncoderKind::ClipG ? "text_encoder_2" : "text_encoder", HiddenOutput::Penultimate, "text_embeds", 77};
}

// One encoder's outputs per text ([T, D] and [P]; empty where the role takes none).
struct EncoderOutputs {
  std::vector<Tensor> hidden, pooled;
};

Tensor retained(flame_tensor_t t) {
  check(flame_tensor_retain(t), "flame_tensor_retain");
  return Tensor(t);
}

// The output name's tensor, first batch row, as bf16 ([1, ...] -> [...]).
Tensor output_row(flame_params_t outputs, const std::string& name) {
  flame_tensor_t found = nullptr;
  check(flame_params_find(outputs, name.c_str(), &found), "flame_params_find");
  if (!found) throw std::runtime_error("the text encoder returned no '" + name + "' output");
  Tensor row, converted;
  check(flame_select(found, 0, 0, row.out()), "flame_select");
  check(flame_to_dtype(row.get(), FLAME_DTYPE_BF16, converted.out()), "flame_to_dtype");
  return converted;
}

// Token ids of text for kind (CLIP: BOS .. EOS padded to max_length; T5: .. </s> padded).
std::vector<int64_t> token_ids(const ClipTokenizer* clip, const T5Tokenizer* t5, const std::string& text,
                               int max_length) {
  TokenizedText tokens;
  std::string error;
  const bool ok = clip ? clip->encode(text, max_length, tokens, error) : t5->encode(text, max_length, tokens, error);
  if (!ok) throw std::runtime_error("tokenizing '" + text + "': " + error);
  return std::vector<int64_t>(tokens.input_ids.begin(), tokens.input_ids.end());
}

std::string hidden_output_name(flame_model_t encoder, HiddenOutput hidden) {
  if (hidden == HiddenOutput::Last) return "last_hidden_state";
  const char* config = nullptr;
  check(flame_model_config(encoder, &config), "flame_model_config");
  const nlohmann::json c = nlohmann::json::parse(config);
  const int64_t layers = c.value("num_hidden_layers", int64_t{0});
  if (layers < 1) throw std::runtime_error("the CLIP text encoder's configuration has no num_hidden_layers");
  return "hidden_states." + std::to_string(layers - 1);  // transformers' hidden_states[-2]
}

EncoderOutputs run_encoder(flame_ctx_t ctx, const std::string& family, const TextEncoderSource& source,
                           const std::string& model_path, const std::vector<std::string>& texts) {
  const EncoderRole role = encoder_role(family, source.kind);
  std::string error;
  std::unique_ptr<ClipTokenizer> clip;
  std::unique_ptr<T5Tokenizer> t5;
  if (source.kind == TextEncoderKind::T5)
    t5 = T5Tokenizer::load(source.tokenizer, error);
  else
    clip = ClipTokenizer::load(source.tokenizer, error);
  if (!clip && !t5) throw std::runtime_error("tokenizer " + source.tokenizer + ": " + error);

  std::printf("latent cache: loading text encoder %s\n", source.model.c_str());
  Model encoder;
  check(flame_model_load(ctx, source.model.c_str(),
                         component_load_options(source.model, model_path, role.component).c_str(), encoder.out()),
        ("loading the text encoder " + source.model).c_str());
  InferenceScope inference(ctx, encoder.get(), false);
  const std::string hidden_name = role.hidden == HiddenOutput::None ? "" : hidden_output_name(encoder.get(), role.hidden);
  EncoderOutputs out;
  for (const std::string& text : texts) {
    const std::vector<int64_t> ids = token_ids(clip.get(), t5.get(), text, role.max_length);
    const int64_t shape[2] = {1, static_cast<int64_t>(ids.size())};
    Tensor input_ids;
    check(flame_from_host(ctx, ids.data(), ids.size() * sizeof(int64_t), shape, 2, FLAME_DTYPE_I64, input_ids.out()),
          "flame_from_host");
    Params inputs, outputs;
    check(flame_params_create(ctx, inputs.out()), "flame_params_create");
    check(flame_params_add(inputs.get(), "input_ids", input_ids.get()), "input_ids");
    check(flame_model_forward(encoder.get(), inputs.get(), outputs.out()), "flame_model_forward (text encoder)");
    if (!hidden_name.empty()) out.hidden.push_back(output_row(outputs.get(), hidden_name));
    if (role.pooled) out.pooled.push_back(output_row(outputs.get(), role.pooled));
  }
  return out;  // the encoder is released here, before the next one is loaded
}

Tensor cat(std::vector<flame_tensor_t> parts, int32_t dim) {
  Tensor out;
  check(flame_cat(parts.data(), static_cast<int32_t>(parts.size()), dim, out.out()), "flame_cat");
  return out;
}

int64_t last_dim(flame_tensor_t t) {
  int32_t nd = 0;
  check(flame_tensor_ndim(t, &nd), "flame_tensor_ndim");
  std::vector<int64_t> dims(static_cast<size_t>(nd));
  check(flame_tensor_shape(t, dims.data(), nd), "flame_tensor_shape");
  return dims.back();
}

// SD3: [77, D_L + D_G] zero-padded on D to width (diffusers pads to T5's width).
Tensor pad_width(const Tensor& t, int64_t width) {
  const int64_t pads[2] = {0, width - last_dim(t.get())};
  if (pads[1] < 0) throw std::runtime_error("SD3: the CLIP embeddings are wider than T5's");
  Tensor out;
  check(flame_pad(t.get(), pads, 2, FLAME_PAD_CONSTANT, 0.0, out.out()), "flame_pad");
  return out;
}

TextConditioning combine(const std::string& family, std::vector<EncoderOutputs>& e, size_t count) {
  TextConditioning c;
  for (size_t i = 0; i < count; ++i) {
    if (family == "flux") {
      c.embeds.push_back(retained(e[1].hidden[i].get()));
      c.pooled.push_back(retained(e[0].pooled[i].get()));
    } else if (family == "sdxl") {
      c.embeds.push_back(cat({e[0].hidden[i].get(), e[1].hidden[i].get()}, 1));
      c.pooled.push_back(retained(e[1].pooled[i].get()));
    } else {
      const Tensor clip = cat({e[0].hidden[i].get(), e[1].hidden[i].get()}, 1);
      const Tensor padded = pad_width(clip, last_dim(e[2].hidden[i].get()));
      c.embeds.push_back(cat({padded.get(), e[2].hidden[i].get()}, 0));
      c.pooled.push_back(cat({e[0].pooled[i].get(), e[1].pooled[i].get()}, 0));
    }
  }
  return c;
}

// Every file a source is read from: the file, or a folder's files (recursive, sorted).
void add_source_files(const std::string& source, std::vector<std::string>& files) {
  if (!fs::is_directory(source)) {
    files.push_back(source);
    return;
  }
  std::vector<std::string> found;
  for (const auto& entry : fs::recursive_directory_iterator(source))
    if (entry.is_regular_file()) found.push_back(entry.path().string());
  std::sort(found.begin(), found.end());
  files.insert(files.end(), found.begin(), found.end());
}

CacheSettings cache_settings(const TrainConfig& config, const std::string& family, const ConditioningSources& sources) {
  CacheSettings s;
  s.family = family;
  s.dtype = "bf16";
  s.buckets = config.data.buckets;
  s.captions = config.data.captions;
  s.flip_aug = config.data.flip_aug;
  s.random_crop = config.data.random_crop;
  s.seed = config.training.seed;
  s.sample_prompts = config.sample.prompts;
  add_source_files(sources.vae, s.model_files);
  for (const TextEncoderSource& e : sources.encoders) {
    add_source_files(e.model, s.model_files);
    add_source_files(e.tokenizer, s.model_files);
  }
  return s;
}

struct ImageLatent {
  Tensor latent;                 // [C, h, w] bf16
  std::array<float, 6> time_ids;  // SDXL
};

ImageLatent encode_image(flame_ctx_t ctx, flame_model_t vae, const VaeFacts& facts, const LoadedBatch& batch) {
  const int64_t shape[4] = {1, 3, batch.height, batch.width};
  Tensor pixels, pixels_bf16;
  check(flame_from_host(ctx, batch.pixels.data(), batch.pixels.size() * sizeof(float), shape, 4, FLAME_DTYPE_F32,
                        pixels.out()),
        "flame_from_host");
  check(flame_to_dtype(pixels.get(), FLAME_DTYPE_BF16, pixels_bf16.out()), "flame_to_dtype");
  Params inputs, outputs;
  check(flame_params_create(ctx, inputs.out()), "flame_params_create");
  check(flame_params_add(inputs.get(), "sample", pixels_bf16.get()), "sample");
  check(flame_model_forward(vae, inputs.get(), outputs.out()), "flame_model_forward (VAE encode)");
  flame_tensor_t mean = nullptr;
  check(flame_params_find(outputs.get(), "latent_mean", &mean), "flame_params_find");
  if (!mean) throw std::runtime_error("the VAE returned no 'latent_mean' output");
  Tensor row, f32, shifted, scaled, out;
  check(flame_select(mean, 0, 0, row.out()), "flame_select");
  check(flame_to_dtype(row.get(), FLAME_DTYPE_F32, f32.out()), "flame_to_dtype");
  check(flame_add_scalar(f32.get(), -facts.shift_factor, shifted.out()), "flame_add_scalar");
  check(flame_mul_scalar(shifted.get(), facts.scaling_factor, scaled.out()), "flame_mul_scalar");
  check(flame_to_dtype(scaled.get(), FLAME_DTYPE_BF16, out.out()), "flame_to_dtype");
  ImageLatent result;
  result.latent = std::move(out);
  result.time_ids = sdxl_time_ids(batch.original_sizes[0].height, batch.original_sizes[0].width, batch.crop_top[0],
                                  batch.crop_left[0], batch.height, batch.width);
  return result;
}

std::vector<ImageLatent> encode_images(flame_ctx_t ctx, const ConditioningSources& sources, const TrainConfig& config,
                                       const Dataset& dataset, const BucketPlan& buckets, const CachePlan& plan) {
  std::printf("latent cache: loading the VAE %s\n", sources.vae.c_str());
  const Model vae = load_vae(ctx, sources.vae, config.model.path);
  const char* vae_config = nullptr;
  check(flame_model_config(vae.get(), &vae_config), "flame_model_config");
  const VaeFacts facts = vae_facts_from_config(vae_config);
  InferenceScope inference(ctx, vae.get(), false);
  const DataOptions options = data_options_of(config);
  std::vector<ImageLatent> latents;
  for (size_t first_entry : plan.latents) {
    const CacheEntry& e = plan.entries[first_entry];
    Batch batch;
    batch.bucket = e.bucket;
    batch.samples.push_back(Sample{e.image, e.sample_id});
    latents.push_back(
        encode_image(ctx, vae.get(), facts, load_batch(dataset, buckets, batch, options, config.training.seed, 0)));
  }
  return latents;
}

void write_cache(flame_ctx_t ctx, const std::string& path, const std::string& family, const std::string& fingerprint,
                 const CachePlan& plan, const TextConditioning& text, const std::vector<ImageLatent>& latents) {
  std::vector<std::string> names;
  std::vector<flame_tensor_t> tensors;
  std::vector<Tensor> time_ids;
  auto add = [&](const std::string& name, const Tensor& t) {
    names.push_back(name);
    tensors.push_back(t.get());
  };
  for (size_t i = 0; i < plan.entries.size(); ++i) {
    const CacheEntry& e = plan.entries[i];
    const std::string n = std::to_string(i);
    add("latents." + n, latents[e.latent].latent);
    add("prompt_embeds." + n, text.embeds[e.caption]);
    add("pooled_prompt_embeds." + n, text.pooled[e.caption]);
    if (family == "sdxl") {
      const std::array<float, 6>& ids = latents[e.latent].time_ids;
      const int64_t six = 6;
      time_ids.emplace_back();
      check(flame_from_host(ctx, ids.data(), sizeof(float) * 6, &six, 1, FLAME_DTYPE_F32, time_ids.back().out()),
            "flame_from_host");
      add("time_ids." + n, time_ids.back());
    }
  }
  for (size_t k = 0; k < plan.sample_prompts.size(); ++k) {
    add("sample_prompt_embeds." + std::to_string(k), text.embeds[plan.sample_prompts[k]]);
    add("sample_pooled_prompt_embeds." + std::to_string(k), text.pooled[plan.sample_prompts[k]]);
  }
  if (plan.negative >= 0) {
    add("negative_prompt_embeds", text.embeds[static_cast<size_t>(plan.negative)]);
    add("negative_pooled_prompt_embeds", text.pooled[static_cast<size_t>(plan.negative)]);
  }
  const std::string count = std::to_string(plan.entries.size()), prompts = std::to_string(plan.sample_prompts.size());
  const std::vector<const char*> metadata = {"flame_train_cache", "1",  "family",          family.c_str(),
                                             "count",             count.c_str(), "fingerprint", fingerprint.c_str(),
                                             "sample_prompts",    prompts.c_str(), "latents", "mean"};
  std::vector<const char*> name_pointers;
  for (const std::string& name : names) name_pointers.push_back(name.c_str());
  check(flame_safetensors_save(ctx, path.c_str(), name_pointers.data(), tensors.data(),
                               static_cast<int64_t>(tensors.size()), metadata.data(),
                               static_cast<int64_t>(metadata.size() / 2)),
        ("writing the latent cache " + path).c_str());
}

}  // namespace

std::string latent_cache_path(const TrainConfig& config) { return config.output.dir + "/latent_cache.safetensors"; }

std::string caching_family(const TrainConfig& config) {
  if (config.model.arch != "auto") return config.model.arch;
  if (is_demo_model_path(config.model.path)) return config.model.path.substr(5);
  const fs::path index = fs::path(config.model.path) / "model_index.json";
  if (fs::is_regular_file(index)) {
    std::ifstream in(index);
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    const std::string pipeline = j.is_object() ? j.value("_class_name", std::string()) : "";
    if (pipeline.rfind("Flux", 0) == 0) return "flux";
    if (pipeline.rfind("StableDiffusionXL", 0) == 0) return "sdxl";
    if (pipeline.rfind("StableDiffusion3", 0) == 0) return "sd3";
  }
  throw std::runtime_error("the caching stage needs the model family: set model.arch (flux, sdxl or sd3)");
}

TextConditioning encode_texts(flame_ctx_t ctx, const std::string& family, const ConditioningSources& sources,
                              const std::string& model_path, const std::vector<std::string>& texts) {
  const size_t expected = family == "sd3" ? 3 : 2;
  if (sources.encoders.size() != expected)
    throw std::runtime_error("the " + family + " family takes " + std::to_string(expected) + " text encoders, not " +
                             std::to_string(sources.encoders.size()));
  std::vector<EncoderOutputs> outputs;
  for (const TextEncoderSource& source : sources.encoders)
    outputs.push_back(run_encoder(ctx, family, source, model_path, texts));
  return combine(family, outputs, texts.size());
}

std::string prepare_latent_cache(flame_ctx_t ctx, const TrainConfig& config) {
  const std::string family = caching_family(config);
  const ConditioningPaths paths{config.model.path,           config.model.vae,           config.model.text_encoder,
                                config.model.text_encoder_2, config.model.text_encoder_3, config.model.tokenizer_dir};
  std::vector<std::string> problems;
  const ConditioningSources sources = resolve_conditioning_sources(family, paths, problems);
  if (!problems.empty()) throw DatasetError(problems);
  const DataOptions options = data_options_of(config);
  const Dataset dataset = scan_dataset(options);
  const BucketPlan buckets = plan_buckets(dataset, options.buckets);
  const std::string path = latent_cache_path(config);
  const std::string fingerprint = cache_fingerprint(dataset, cache_settings(config, family, sources));
  const CacheDecision decision = decide_cache_use(path, family, fingerprint);
  if (decision.action == CacheAction::Reuse) {
    std::printf("latent cache: reusing %s (%s; no encoder loaded)\n", path.c_str(), decision.reason.c_str());
    return path;
  }
  const CachePlan plan = plan_cache(dataset, buckets, options, config.training.seed, config.sample.prompts,
                                    family != "flux");
  std::printf("latent cache: encoding %zu texts and %zu images into %s (%s)\n", plan.texts.size(), plan.latents.size(),
              path.c_str(), decision.reason.c_str());
  const auto start = std::chrono::steady_clock::now();
  {
    const TextConditioning text = encode_texts(ctx, family, sources, config.model.path, plan.texts);
    const std::vector<ImageLatent> latents = encode_images(ctx, sources, config, dataset, buckets, plan);
    write_cache(ctx, path, family, fingerprint, plan, text, latents);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("latent cache: wrote %zu entries in %.1f s; text encoders and VAE released\n", plan.entries.size(), seconds);
  return path;
}

}  // namespace flame_train

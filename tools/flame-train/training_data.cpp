// Cache file, demo data and epoch batches (see training_data.h).
#include "training_data.h"

#include <cmath>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <tuple>

#include "objectives.h"
#include "random.h"
#include "tensor_helpers.h"

namespace flame_train {
namespace {

std::vector<int64_t> shape_of(flame_tensor_t t) {
  int32_t nd = 0;
  check(flame_tensor_ndim(t, &nd), "flame_tensor_ndim");
  std::vector<int64_t> dims(static_cast<size_t>(nd));
  if (nd > 0) check(flame_tensor_shape(t, dims.data(), nd), "flame_tensor_shape");
  return dims;
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::string metadata(flame_safetensors_t file, const char* key) {
  const char* value = nullptr;
  if (flame_safetensors_metadata(file, key, &value) != FLAME_OK || !value) return "";
  return value;
}

// Throws unless file is a flame-train cache made for the model's family.
void check_cache_header(flame_safetensors_t file, const std::string& path, const ModelShapes& shapes) {
  auto fail = [&](const std::string& why) { throw std::runtime_error("latent cache " + path + ": " + why); };
  if (metadata(file, "flame_train_cache") != "1") fail("not a flame-train cache (metadata flame_train_cache is not \"1\")");
  const std::string family = metadata(file, "family");
  if (family != family_name(shapes.family))
    fail("made for a '" + family + "' model, this model is " + family_name(shapes.family));
}

}  // namespace

std::vector<TrainingSample> load_latent_cache(flame_ctx_t ctx, const std::string& path, const ModelShapes& shapes) {
  SafetensorsFile file;
  check(flame_safetensors_load(ctx, path.c_str(), file.out()), ("reading the latent cache " + path).c_str());
  auto fail = [&](const std::string& why) { throw std::runtime_error("latent cache " + path + ": " + why); };
  check_cache_header(file.get(), path, shapes);
  const std::string count_text = metadata(file.get(), "count");
  char* end = nullptr;
  const long long count = std::strtoll(count_text.c_str(), &end, 10);
  if (count_text.empty() || *end != '\0' || count <= 0) fail("metadata count '" + count_text + "' is not a positive integer");

  std::vector<TrainingSample> samples;
  for (long long i = 0; i < count; ++i) {
    const std::string n = std::to_string(i);
    auto get = [&](const std::string& key, size_t ndim) {
      Tensor t;
      const flame_status_t st = flame_safetensors_get(file.get(), key.c_str(), t.out());
      if (st == FLAME_ERROR_INVALID_ARGUMENT) fail("no tensor '" + key + "'");
      check(st, ("reading '" + key + "' of the latent cache " + path).c_str());
      if (shape_of(t.get()).size() != ndim) fail("'" + key + "' is " + shape_text(shape_of(t.get())) + ", expected " +
                                                 std::to_string(ndim) + " dimensions");
      return t;
    };
    TrainingSample s;
    s.latents = get("latents." + n, 3);
    s.prompt_embeds = get("prompt_embeds." + n, 2);
    s.pooled = get("pooled_prompt_embeds." + n, 1);
    const std::vector<int64_t> l = shape_of(s.latents.get()), e = shape_of(s.prompt_embeds.get()),
                               p = shape_of(s.pooled.get());
    if (l[0] != shapes.latent_channels || l[1] % shapes.latent_multiple || l[2] % shapes.latent_multiple)
      fail("'latents." + n + "' is " + shape_text(l) + ": the model takes " + std::to_string(shapes.latent_channels) +
           " channels and sides that are multiples of " + std::to_string(shapes.latent_multiple));
    if (e[1] != shapes.text_dim)
      fail("'prompt_embeds." + n + "' is " + shape_text(e) + ": the model takes width " + std::to_string(shapes.text_dim));
    if (p[0] != shapes.pooled_dim)
      fail("'pooled_prompt_embeds." + n + "' is " + shape_text(p) + ": the model takes " + std::to_string(shapes.pooled_dim));
    if (shapes.family == ModelFamily::Sdxl) {
      s.time_ids = get("time_ids." + n, 1);
      if (shape_of(s.time_ids.get())[0] != 6) fail("'time_ids." + n + "' must have 6 values");
    }
    s.height = l[1];
    s.width = l[2];
    s.tokens = e[0];
    samples.push_back(std::move(s));
  }
  return samples;
}

SampleConditioning load_sample_conditioning(flame_ctx_t ctx, const std::string& path, const ModelShapes& shapes) {
  SafetensorsFile file;
  check(flame_safetensors_load(ctx, path.c_str(), file.out()), ("reading the latent cache " + path).c_str());
  auto fail = [&](const std::string& why) { throw std::runtime_error("latent cache " + path + ": " + why); };
  check_cache_header(file.get(), path, shapes);
  const std::string count_text = metadata(file.get(), "sample_prompts");
  SampleConditioning out;
  if (count_text.empty()) return out;
  char* end = nullptr;
  const long long count = std::strtoll(count_text.c_str(), &end, 10);
  if (*end != '\0' || count < 0) fail("metadata sample_prompts '" + count_text + "' is not a count");
  if (count == 0) return out;
  // A tensor of the expected width (last dimension) and rank, or a clear error.
  auto get = [&](const std::string& key, size_t ndim, int64_t width) {
    Tensor t;
    const flame_status_t st = flame_safetensors_get(file.get(), key.c_str(), t.out());
    if (st == FLAME_ERROR_INVALID_ARGUMENT) fail("no tensor '" + key + "'");
    check(st, ("reading '" + key + "' of the latent cache " + path).c_str());
    const std::vector<int64_t> shape = shape_of(t.get());
    if (shape.size() != ndim || shape.back() != width)
      fail("'" + key + "' is " + shape_text(shape) + ", the model takes " + std::to_string(ndim) +
           " dimensions, the last " + std::to_string(width));
    return t;
  };
  for (long long k = 0; k < count; ++k) {
    const std::string n = std::to_string(k);
    out.prompt_embeds.push_back(get("sample_prompt_embeds." + n, 2, shapes.text_dim));
    out.pooled.push_back(get("sample_pooled_prompt_embeds." + n, 1, shapes.pooled_dim));
  }
  if (shapes.family != ModelFamily::Flux) {
    out.negative_prompt_embeds = get("negative_prompt_embeds", 2, shapes.text_dim);
    out.negative_pooled = get("negative_pooled_prompt_embeds", 1, shapes.pooled_dim);
  }
  return out;
}

// The demo latents' scale: small next to the unit noise, so that the flow-matching target (noise - x0)
// is mostly recoverable from the noisy input's direction, which a tiny random-init model carries
// to its output projection (where the demo's adapter acts): the loss falls within tens of steps.
constexpr double kDemoAmplitude = 0.3, kDemoOffsetStd = 0.2;

std::vector<TrainingSample> make_demo_samples(flame_ctx_t ctx, const ModelShapes& shapes, int count, int64_t height,
                                              int64_t width, int64_t tokens, uint64_t seed) {
  std::vector<TrainingSample> samples;
  for (int i = 0; i < count; ++i) {
    RandomStream rng(seed, RandomPurpose::DemoData, 0, static_cast<uint64_t>(i));
    const int64_t c_count = shapes.latent_channels;
    std::vector<float> latents(static_cast<size_t>(c_count * height * width));
    for (int64_t c = 0; c < c_count; ++c) {
      const double fy = 1 + rng.next_below(3), fx = 1 + rng.next_below(3), phase = 6.283185307 * rng.next_unit();
      const double offset = standard_normal(rng) * kDemoOffsetStd;
      for (int64_t y = 0; y < height; ++y)
        for (int64_t x = 0; x < width; ++x)
          latents[static_cast<size_t>((c * height + y) * width + x)] = static_cast<float>(
              offset + kDemoAmplitude * std::sin(6.283185307 * (fy * y / height + fx * x / width) + phase));
    }
    std::vector<float> embeds(static_cast<size_t>(tokens * shapes.text_dim)), pooled(static_cast<size_t>(shapes.pooled_dim));
    for (float& v : embeds) v = static_cast<float>(standard_normal(rng));
    for (float& v : pooled) v = static_cast<float>(standard_normal(rng));
    TrainingSample s;
    s.latents = host_f32(ctx, latents, {c_count, height, width});
    s.prompt_embeds = host_f32(ctx, embeds, {tokens, shapes.text_dim});
    s.pooled = host_f32(ctx, pooled, {shapes.pooled_dim});
    if (shapes.family == ModelFamily::Sdxl) {
      const int py = static_cast<int>(height * 8), px = static_cast<int>(width * 8);
      const std::array<float, 6> ids = sdxl_time_ids(py, px, 0, 0, py, px);
      s.time_ids = host_f32(ctx, std::vector<float>(ids.begin(), ids.end()), {6});
    }
    s.height = height;
    s.width = width;
    s.tokens = tokens;
    samples.push_back(std::move(s));
  }
  return samples;
}

std::vector<std::vector<size_t>> plan_epoch_batches(const std::vector<TrainingSample>& samples, int batch_size,
                                                    uint64_t seed, uint64_t epoch) {
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::vector<size_t>> groups;
  for (size_t i = 0; i < samples.size(); ++i)
    groups[{samples[i].height, samples[i].width, samples[i].tokens}].push_back(i);
  std::vector<std::vector<size_t>> batches;
  uint64_t group_index = 0;
  for (auto& [key, members] : groups) {
    RandomStream rng(seed, RandomPurpose::BatchOrder, epoch, group_index++);
    shuffle_with(members, rng);
    for (size_t i = 0; i < members.size(); i += static_cast<size_t>(batch_size))
      batches.emplace_back(members.begin() + static_cast<std::ptrdiff_t>(i),
                           members.begin() + static_cast<std::ptrdiff_t>(std::min(members.size(), i + batch_size)));
  }
  RandomStream order(seed, RandomPurpose::BatchOrder, epoch, ~uint64_t{0});
  shuffle_with(batches, order);
  return batches;
}

}  // namespace flame_train

// The denoising loops of the sample images (see sampling.h).
#include "sampling.h"

#include <array>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensor_helpers.h"

namespace flame_train {
namespace {

Tensor scaled(flame_tensor_t t, double s) {
  Tensor out;
  check(flame_mul_scalar(t, s, out.out()), "flame_mul_scalar");
  return out;
}

Tensor added(flame_tensor_t a, flame_tensor_t b) {
  Tensor out;
  check(flame_add(a, b, out.out()), "flame_add");
  return out;
}

// [n, ...] from n tensors of equal shape.
Tensor stacked(std::vector<flame_tensor_t> parts) {
  Tensor out;
  check(flame_stack(parts.data(), static_cast<int32_t>(parts.size()), 0, out.out()), "flame_stack");
  return out;
}

Tensor unsqueezed(flame_tensor_t t) {
  Tensor out;
  check(flame_unsqueeze(t, 0, out.out()), "flame_unsqueeze");
  return out;
}

int64_t first_dim(flame_tensor_t t) {
  int32_t nd = 0;
  check(flame_tensor_ndim(t, &nd), "flame_tensor_ndim");
  std::vector<int64_t> dims(static_cast<size_t>(nd));
  if (nd > 0) check(flame_tensor_shape(t, dims.data(), nd), "flame_tensor_shape");
  return nd > 0 ? dims[0] : 1;
}

// The model's "sample" output for the named inputs, as f32.
Tensor forward(flame_model_t model, flame_ctx_t ctx, const std::vector<std::pair<const char*, flame_tensor_t>>& named) {
  Params inputs, outputs;
  check(flame_params_create(ctx, inputs.out()), "flame_params_create");
  for (const auto& [name, t] : named) check(flame_params_add(inputs.get(), name, t), name);
  check(flame_model_forward(model, inputs.get(), outputs.out()), "flame_model_forward (sampling)");
  flame_tensor_t sample = nullptr;
  check(flame_params_find(outputs.get(), "sample", &sample), "flame_params_find");
  if (!sample) throw std::runtime_error("the model returned no 'sample' output");
  return to_f32(sample);
}

// The seeded starting noise [1, C, h, w], times scale.
Tensor seeded_noise(flame_ctx_t ctx, int64_t c, int64_t h, int64_t w, uint64_t seed, double scale) {
  Tensor noise;
  {
    ReseededGenerator generator(ctx, seed);
    const int64_t shape[4] = {1, c, h, w};
    check(flame_randn(ctx, shape, 4, FLAME_DTYPE_F32, noise.out()), "flame_randn");
  }
  if (scale == 1.0) return noise;
  return scaled(noise.get(), scale);
}

// x_next = a x + b m.
Tensor euler_update(const Tensor& x, const Tensor& m, const SamplerStep& s) {
  Tensor ms = scaled(m.get(), s.output_coef);
  if (s.sample_coef == 1.0) return added(x.get(), ms.get());
  Tensor xs = scaled(x.get(), s.sample_coef);
  return added(xs.get(), ms.get());
}

// uncond + g (text - uncond) of a [2, ...] prediction (row 0 negative, row 1 positive).
Tensor guided(const Tensor& both, double g) {
  Tensor uncond, text, diff, step;
  check(flame_narrow(both.get(), 0, 0, 1, uncond.out()), "flame_narrow");
  check(flame_narrow(both.get(), 0, 1, 1, text.out()), "flame_narrow");
  check(flame_sub(text.get(), uncond.get(), diff.out()), "flame_sub");
  step = scaled(diff.get(), g);
  return added(uncond.get(), step.get());
}

// The batch of the text conditioning: [1, ...] of the prompt, or [2, ...] negative then positive.
struct TextBatch {
  Tensor embeds, pooled;
  bool guided = false;
};

TextBatch text_batch(const PromptConditioning& p, bool use_guidance) {
  TextBatch b;
  if (!use_guidance) {
    b.embeds = unsqueezed(to_f32(p.embeds).get());
    b.pooled = unsqueezed(to_f32(p.pooled).get());
    return b;
  }
  if (!p.negative_embeds || !p.negative_pooled)
    throw std::runtime_error("classifier-free guidance needs the negative prompt's conditioning");
  if (first_dim(p.negative_embeds) != first_dim(p.embeds))
    throw std::runtime_error("the negative prompt has " + std::to_string(first_dim(p.negative_embeds)) +
                             " text tokens, the prompt " + std::to_string(first_dim(p.embeds)) +
                             ": guidance batches them together and needs the same count");
  // f32 on both sides: the cache may hold bf16, the demo's zeros are f32.
  const Tensor ne = to_f32(p.negative_embeds), e = to_f32(p.embeds), np = to_f32(p.negative_pooled), pp = to_f32(p.pooled);
  b.embeds = stacked({ne.get(), e.get()});
  b.pooled = stacked({np.get(), pp.get()});
  b.guided = true;
  return b;
}

Tensor sample_flux(flame_ctx_t ctx, flame_model_t model, const ModelShapes& shapes, const SamplerSettings& s,
                   const PromptConditioning& p, uint64_t seed) {
  const int64_t c = shapes.latent_channels, h = s.latent_height, w = s.latent_width;
  const std::vector<double> sigmas = flux_sampling_sigmas(s.steps, static_cast<double>((h / 2) * (w / 2)));
  const SamplerPlan plan = flow_euler_plan(sigmas, FlowTimestepInput::Sigma);
  Tensor noise = seeded_noise(ctx, c, h, w, seed, plan.init_noise_scale);
  Tensor x = pack_latents(noise.get(), 1, c, h, w);
  const TextBatch text = text_batch(p, false);
  Tensor img_ids = flux_img_ids(ctx, h / 2, w / 2);
  Tensor txt_ids = host_f32(ctx, std::vector<float>(static_cast<size_t>(first_dim(p.embeds) * 3), 0.0f),
                            {first_dim(p.embeds), 3});
  Tensor guidance = host_f32(ctx, {static_cast<float>(s.guidance_scale)}, {1});
  for (const SamplerStep& step : plan.steps) {
    Tensor t = host_f32(ctx, {static_cast<float>(step.timestep)}, {1});
    std::vector<std::pair<const char*, flame_tensor_t>> in = {
        {"hidden_states", x.get()},      {"encoder_hidden_states", text.embeds.get()},
        {"pooled_projections", text.pooled.get()}, {"timestep", t.get()},
        {"img_ids", img_ids.get()},      {"txt_ids", txt_ids.get()}};
    if (shapes.guidance_embeds) in.push_back({"guidance", guidance.get()});
    Tensor m = forward(model, ctx, in);
    x = euler_update(x, m, step);
  }
  return unpack_latents(x.get(), 1, c, h, w);
}

// SD3 and SDXL: latents [B, C, h, w] as they are, optional guidance.
Tensor sample_unpacked(flame_ctx_t ctx, flame_model_t model, const ModelShapes& shapes, const SamplerSettings& s,
                       const PromptConditioning& p, uint64_t seed) {
  const bool sdxl = shapes.family == ModelFamily::Sdxl;
  SamplerPlan plan;
  if (!sdxl) {
    plan = flow_euler_plan(sd3_sampling_sigmas(s.steps, s.sd3_shift), FlowTimestepInput::SigmaTimes1000);
  } else {
    const std::vector<double> alphas = scaled_linear_alphas_cumprod();
    plan = s.sdxl_sampler == SdxlSampler::Euler ? sdxl_euler_plan(alphas, s.steps, s.prediction)
                                                : sdxl_ddim_plan(alphas, s.steps, s.prediction);
  }
  Tensor x = seeded_noise(ctx, shapes.latent_channels, s.latent_height, s.latent_width, seed, plan.init_noise_scale);
  const TextBatch text = text_batch(p, s.guidance_scale > 1.0);
  const int64_t batch = text.guided ? 2 : 1;
  Tensor time_ids;
  if (sdxl) {
    const std::array<float, 6> ids = sdxl_time_ids(static_cast<int>(s.pixel_height), static_cast<int>(s.pixel_width),
                                                   0, 0, static_cast<int>(s.pixel_height), static_cast<int>(s.pixel_width));
    std::vector<float> rows;
    for (int64_t i = 0; i < batch; ++i) rows.insert(rows.end(), ids.begin(), ids.end());
    time_ids = host_f32(ctx, rows, {batch, 6});
  }
  for (const SamplerStep& step : plan.steps) {
    Tensor input_scaled;
    flame_tensor_t input = x.get();
    if (step.input_scale != 1.0) {
      input_scaled = scaled(x.get(), step.input_scale);
      input = input_scaled.get();
    }
    Tensor input_pair;  // [2, C, h, w]: the same latent for the negative and the positive prompt
    if (text.guided) {
      const flame_tensor_t both[2] = {input, input};
      check(flame_cat(both, 2, 0, input_pair.out()), "flame_cat");
      input = input_pair.get();
    }
    Tensor t = host_f32(ctx, std::vector<float>(static_cast<size_t>(batch), static_cast<float>(step.timestep)), {batch});
    Tensor m;
    if (sdxl)
      m = forward(model, ctx, {{"sample", input}, {"timestep", t.get()},
                               {"encoder_hidden_states", text.embeds.get()}, {"text_embeds", text.pooled.get()},
                               {"time_ids", time_ids.get()}});
    else
      m = forward(model, ctx, {{"hidden_states", input}, {"timestep", t.get()},
                               {"encoder_hidden_states", text.embeds.get()}, {"pooled_projections", text.pooled.get()}});
    if (text.guided) m = guided(m, s.guidance_scale);
    x = euler_update(x, m, step);
  }
  return x;
}

}  // namespace

Tensor sample_latent(flame_ctx_t ctx, flame_model_t model, const ModelShapes& shapes, const SamplerSettings& settings,
                     const PromptConditioning& prompt, uint64_t seed) {
  if (!prompt.embeds || !prompt.pooled) throw std::runtime_error("sampling: the prompt's conditioning is missing");
  const int64_t h = settings.latent_height, w = settings.latent_width;
  if (h <= 0 || w <= 0 || h % shapes.latent_multiple || w % shapes.latent_multiple)
    throw std::runtime_error("sampling: the latent size " + std::to_string(h) + "x" + std::to_string(w) +
                             " must be positive multiples of " + std::to_string(shapes.latent_multiple));
  if (shapes.family == ModelFamily::Flux) return sample_flux(ctx, model, shapes, settings, prompt, seed);
  return sample_unpacked(ctx, model, shapes, settings, prompt, seed);
}

InferenceScope::InferenceScope(flame_ctx_t ctx, flame_model_t model, bool restore_training)
    : ctx_(ctx), model_(model), restore_training_(restore_training) {
  check(flame_ctx_set_grad_enabled(ctx_, 0, &previous_grad_), "flame_ctx_set_grad_enabled");
  const flame_status_t st = flame_model_set_training(model_, 0);
  if (st != FLAME_OK) {
    flame_ctx_set_grad_enabled(ctx_, previous_grad_, nullptr);
    throw FlameError(st, "flame_model_set_training");
  }
}

InferenceScope::~InferenceScope() {
  if (restore_training_) flame_model_set_training(model_, 1);
  flame_ctx_set_grad_enabled(ctx_, previous_grad_, nullptr);
}

ReseededGenerator::ReseededGenerator(flame_ctx_t ctx, uint64_t seed) : ctx_(ctx) {
  check(flame_ctx_get_rng_state(ctx_, &seed_, &offset_), "flame_ctx_get_rng_state");
  check(flame_ctx_manual_seed(ctx_, seed), "flame_ctx_manual_seed");
}

ReseededGenerator::~ReseededGenerator() { flame_ctx_set_rng_state(ctx_, seed_, offset_); }

}  // namespace flame_train

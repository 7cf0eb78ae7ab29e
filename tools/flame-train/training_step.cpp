// One micro-batch of a training step: the eager draws and the capturable tensor work (see
// training_step.h).
#include "training_step.h"

#include <stdexcept>

#include "random.h"
#include "tensor_helpers.h"

namespace flame_train {
namespace {

using BinaryOp = flame_status_t (*)(flame_tensor_t, flame_tensor_t, flame_tensor_t*);

Tensor binary(BinaryOp op, flame_tensor_t a, flame_tensor_t b, const char* what) {
  Tensor out;
  check(op(a, b, out.out()), what);
  return out;
}

// Stacks one member tensor of each sample of the batch along a new first axis.
Tensor stack_member(const std::vector<TrainingSample>& samples, const std::vector<size_t>& batch,
                    Tensor TrainingSample::*member) {
  std::vector<flame_tensor_t> parts;
  for (size_t i : batch) parts.push_back((samples[i].*member).get());
  Tensor out;
  check(flame_stack(parts.data(), static_cast<int32_t>(parts.size()), 0, out.out()), "flame_stack");
  return out;
}

// x * a + y * b with per-sample coefficients a, b of shape [B, 1, 1, 1].
Tensor combine(flame_tensor_t x, flame_tensor_t a, flame_tensor_t y, flame_tensor_t b) {
  Tensor xa = binary(flame_mul, x, a, "flame_mul"), yb = binary(flame_mul, y, b, "flame_mul");
  return binary(flame_add, xa.get(), yb.get(), "flame_add");
}

// The objective's host draws of one micro-batch, per sample.
struct HostDraws {
  std::vector<float> timestep, weight, noisy_a, noisy_b, target_a, target_b;
  explicit HostDraws(size_t b) : timestep(b), weight(b), noisy_a(b), noisy_b(b), target_a(b), target_b(b) {}
};

HostDraws draw_objective(const TrainConfig& config, const Objective& objective, int64_t b, int64_t h, int64_t w,
                         const BatchPlace& place) {
  HostDraws d(static_cast<size_t>(b));
  for (int64_t i = 0; i < b; ++i) {
    RandomStream rng(config.training.seed, RandomPurpose::Timestep, place.step, batch_sample_item(place, i));
    if (objective.family == ModelFamily::Sdxl) {
      const DdpmSample s = draw_ddpm_sample(objective.alphas_cumprod, objective.prediction, objective.min_snr_gamma, rng);
      d.timestep[i] = static_cast<float>(s.timestep);
      d.weight[i] = static_cast<float>(s.weight);
      d.noisy_a[i] = static_cast<float>(s.noisy_x0_coef);
      d.noisy_b[i] = static_cast<float>(s.noisy_noise_coef);
      d.target_a[i] = static_cast<float>(s.target_x0_coef);
      d.target_b[i] = static_cast<float>(s.target_noise_coef);
    } else {
      const bool flux = objective.family == ModelFamily::Flux;
      const FlowSample f = draw_flow_sample(objective.flow, flux ? FlowTimestepInput::Sigma : FlowTimestepInput::SigmaTimes1000,
                                            static_cast<double>((h / 2) * (w / 2)), rng);
      d.timestep[i] = static_cast<float>(f.timestep);
      d.weight[i] = static_cast<float>(f.weight);
      d.noisy_a[i] = static_cast<float>(1.0 - f.sigma);
      d.noisy_b[i] = static_cast<float>(f.sigma);
      d.target_a[i] = -1.0f;
      d.target_b[i] = 1.0f;
    }
  }
  return d;
}

}  // namespace

Objective make_objective(const TrainConfig& c, const ModelShapes& shapes) {
  Objective o;
  o.family = shapes.family;
  o.flow.sampling = parse_timestep_sampling(c.training.timestep_sampling);
  o.flow.logit_mean = c.training.logit_mean;
  o.flow.logit_std = c.training.logit_std;
  o.flow.mode_scale = c.training.mode_scale;
  o.flow.weighting = parse_flow_weighting(c.training.weighting_scheme);
  if (c.training.flow_shift > 0) {
    o.flow.shift = FlowShift::Fixed;
    o.flow.fixed_shift = c.training.flow_shift;
  } else {
    o.flow.shift = shapes.family == ModelFamily::Sd3 ? FlowShift::Fixed : FlowShift::Resolution;
  }
  o.prediction = parse_prediction_type(c.training.prediction_type);
  if (shapes.family == ModelFamily::Sdxl) o.alphas_cumprod = scaled_linear_alphas_cumprod();
  o.min_snr_gamma = c.training.min_snr_gamma;
  o.noise_offset = c.training.noise_offset;
  o.guidance = c.training.guidance_scale;
  o.guidance_embeds = shapes.guidance_embeds;
  return o;
}

StepInputs draw_step_inputs(flame_ctx_t ctx, const TrainConfig& config, const Objective& objective,
                            const std::vector<TrainingSample>& samples, const std::vector<size_t>& batch,
                            const BatchPlace& place, double loss_scale) {
  const TrainingSample& first = samples[batch.front()];
  StepInputs in;
  in.batch = static_cast<int64_t>(batch.size());
  in.height = first.height;
  in.width = first.width;
  in.tokens = first.tokens;
  in.x0 = to_f32(stack_member(samples, batch, &TrainingSample::latents).get());
  int32_t nd = 0;
  int64_t dims[4] = {0, 0, 0, 0};
  check(flame_tensor_ndim(in.x0.get(), &nd), "flame_tensor_ndim");
  if (nd != 4) throw std::runtime_error("the batch's latents are not [B, C, H, W]");
  check(flame_tensor_shape(in.x0.get(), dims, 4), "flame_tensor_shape");
  in.channels = dims[1];
  const int64_t b = in.batch, c = in.channels, h = in.height, w = in.width;
  in.noise = draw_batch_noise(ctx, config.training.seed, place, b, c, h, w, objective.noise_offset);
  const HostDraws d = draw_objective(config, objective, b, h, w, place);
  const std::vector<int64_t> coef = {b, 1, 1, 1};
  in.noisy_a = host_f32(ctx, d.noisy_a, coef);
  in.noisy_b = host_f32(ctx, d.noisy_b, coef);
  in.target_a = host_f32(ctx, d.target_a, coef);
  in.target_b = host_f32(ctx, d.target_b, coef);
  in.timesteps = host_f32(ctx, d.timestep, {b});
  in.weights = host_f32(ctx, d.weight, {b});
  in.loss_scale = host_f32(ctx, {static_cast<float>(loss_scale)}, {});
  in.embeds = stack_member(samples, batch, &TrainingSample::prompt_embeds);
  in.pooled = stack_member(samples, batch, &TrainingSample::pooled);
  if (objective.family == ModelFamily::Sdxl) in.time_ids = stack_member(samples, batch, &TrainingSample::time_ids);
  if (objective.family == ModelFamily::Flux) {
    in.img_ids = flux_img_ids(ctx, h / 2, w / 2);
    in.txt_ids = host_f32(ctx, std::vector<float>(static_cast<size_t>(first.tokens * 3), 0.0f), {first.tokens, 3});
    if (objective.guidance_embeds)
      in.guidance = host_f32(ctx, std::vector<float>(static_cast<size_t>(b), static_cast<float>(objective.guidance)), {b});
  }
  return in;
}

Tensor loss_and_backward(flame_ctx_t ctx, flame_model_t model, const Objective& objective, const StepInputs& in,
                         int accumulation_steps) {
  const int64_t b = in.batch, c = in.channels, h = in.height, w = in.width;
  Tensor noisy = combine(in.x0.get(), in.noisy_a.get(), in.noise.get(), in.noisy_b.get());
  Tensor target = combine(in.x0.get(), in.target_a.get(), in.noise.get(), in.target_b.get());

  Params inputs;
  check(flame_params_create(ctx, inputs.out()), "flame_params_create");
  auto add = [&](const char* name, flame_tensor_t t) { check(flame_params_add(inputs.get(), name, t), name); };
  add("encoder_hidden_states", in.embeds.get());
  add("timestep", in.timesteps.get());
  Tensor hidden;
  if (objective.family == ModelFamily::Flux) {
    hidden = pack_latents(noisy.get(), b, c, h, w);
    target = pack_latents(target.get(), b, c, h, w);
    add("hidden_states", hidden.get());
    add("pooled_projections", in.pooled.get());
    add("img_ids", in.img_ids.get());
    add("txt_ids", in.txt_ids.get());
    if (in.guidance.get()) add("guidance", in.guidance.get());
  } else if (objective.family == ModelFamily::Sd3) {
    add("hidden_states", noisy.get());
    add("pooled_projections", in.pooled.get());
  } else {
    add("sample", noisy.get());
    add("text_embeds", in.pooled.get());
    add("time_ids", in.time_ids.get());
  }

  Params outputs;
  check(flame_model_forward(model, inputs.get(), outputs.out()), "flame_model_forward");
  flame_tensor_t sample = nullptr;
  check(flame_params_find(outputs.get(), "sample", &sample), "flame_params_find");
  if (!sample) throw std::runtime_error("the model returned no 'sample' output");
  Tensor pred = to_f32(sample);

  // Weighted MSE: mean over each sample's elements, times its weight, mean over the batch.
  Tensor per_element;
  check(flame_mse_loss(pred.get(), target.get(), FLAME_REDUCTION_NONE, per_element.out()), "flame_mse_loss");
  int32_t nd = 0;
  check(flame_tensor_ndim(per_element.get(), &nd), "flame_tensor_ndim");
  std::vector<int32_t> dims;
  for (int32_t d = 1; d < nd; ++d) dims.push_back(d);
  Tensor per_sample, mean, loss, scaled;
  check(flame_mean(per_element.get(), dims.data(), static_cast<int32_t>(dims.size()), 0, per_sample.out()), "flame_mean");
  Tensor weighted = binary(flame_mul, per_sample.get(), in.weights.get(), "flame_mul");
  check(flame_mean(weighted.get(), nullptr, 0, 0, mean.out()), "flame_mean");
  loss = binary(flame_mul, mean.get(), in.loss_scale.get(), "flame_mul");  // x 1 is exact on one GPU
  check(flame_div_scalar(loss.get(), accumulation_steps, scaled.out()), "flame_div_scalar");
  check(flame_backward(ctx, scaled.get(), nullptr, 0), "flame_backward");
  return loss;
}

}  // namespace flame_train

// The samplers' host-side arithmetic (flame-train, issue 37): which noise levels a sampling run
// visits, what timestep the denoiser sees at each, and how one step combines the current latent x
// with the model's output m (x_next = sample_coef * x + output_coef * m). Pure functions (no GPU),
// so that the CPU tests (tests/trainer/test_trainer_sampling.cpp) check them against numbers worked
// out from diffusers' formulas:
//
//  FlowMatchEulerDiscreteScheduler (Flux, SD3), Euler step x + (sigma_next - sigma) v, v the
//  model's velocity:
//    Flux (FluxPipeline): sigmas = linspace(1, 1 / n, n), shifted by time_shift exponential
//      e^mu / (e^mu + 1 / s - 1), mu = calculate_shift(image tokens; 256 -> 0.5, 4096 -> 1.15);
//      the model's timestep input is sigma (the pipeline passes t / 1000).
//    SD3 (StableDiffusion3Pipeline, scheduler shift 3.0, no dynamic shifting): the scheduler's
//      sigma_max = 1 and sigma_min = shift(1 / N) (its shifted training sigmas), timesteps =
//      linspace(N sigma_max, N sigma_min, n), sigmas = shift(timesteps / N) (shifted a second time,
//      as diffusers does); the model's timestep is N sigma.
//    Both end with sigma 0.
//  EulerDiscreteScheduler (SDXL's scheduler config: scaled_linear 0.00085 .. 0.012, N = 1000,
//    timestep_spacing "leading", steps_offset 1, linear interpolation, final sigma 0):
//    timesteps = (arange(n) * (N // n))[::-1] + 1, sigma(t) = sqrt((1 - ac_t) / ac_t),
//    init_noise_sigma = sqrt(sigma_max^2 + 1) ("leading"), scale_model_input x / sqrt(sigma^2 + 1),
//    step (s_churn 0): epsilon: x + (sigma_next - sigma) m; v_prediction: x0 = -sigma / sqrt(sigma^2
//    + 1) m + x / (sigma^2 + 1), x + (sigma_next - sigma) (x - x0) / sigma.
//  DDIMScheduler (SDXL config as above, set_alpha_to_one false, eta 0, no clipping):
//    the same "leading" timesteps, prev = t - N // n, a = ac_t, a' = ac_prev (ac_0 when prev < 0);
//    epsilon: x0 = (x - sqrt(1 - a) m) / sqrt(a), eps = m; v_prediction: x0 = sqrt(a) x - sqrt(1 - a) m,
//    eps = sqrt(a) m + sqrt(1 - a) x; x_next = sqrt(a') x0 + sqrt(1 - a') eps. No input scaling,
//    init_noise_sigma 1.
// A timestep N (only with n = N steps) reads ac_{N-1}, where diffusers' Euler interpolation clamps
// the same way (its DDIM would index past the table).
#pragma once

#include <string>
#include <vector>

#include "objectives.h"

namespace flame_train {

// One step of a sampler.
struct SamplerStep {
  double timestep = 0;      // the denoiser's timestep input
  double input_scale = 1;   // the denoiser sees input_scale * x (Euler's scale_model_input)
  double sample_coef = 1;   // x_next = sample_coef * x + output_coef * model_output
  double output_coef = 0;
  double sigma = 0;         // this step's noise level (flow: sigma; Euler: sigma; DDIM: sqrt((1 - a) / a))
};

struct SamplerPlan {
  double init_noise_scale = 1;  // the starting latent is init_noise_scale * N(0, I)
  std::vector<SamplerStep> steps;
};

enum class SdxlSampler { Euler, Ddim };
// "euler" | "ddim"; throws std::invalid_argument otherwise.
SdxlSampler parse_sdxl_sampler(const std::string& name);

// The flow-matching sigmas of n steps, n + 1 values ending with 0.
std::vector<double> flux_sampling_sigmas(int steps, double image_seq_len, const FlowMatchOptions& o = {});
std::vector<double> sd3_sampling_sigmas(int steps, double shift = 3.0, int num_train_timesteps = 1000);

// Flow-matching Euler plans (timestep input: sigma for Flux, 1000 sigma for SD3).
SamplerPlan flow_euler_plan(const std::vector<double>& sigmas, FlowTimestepInput input);

// SDXL's "leading" timesteps with steps_offset 1, largest first.
std::vector<int> leading_timesteps(int steps, int num_train_timesteps = 1000, int steps_offset = 1);
// EulerDiscreteScheduler's sigmas at those timesteps plus the final 0 (n + 1 values).
std::vector<double> euler_discrete_sigmas(const std::vector<double>& alphas_cumprod, const std::vector<int>& timesteps);

SamplerPlan sdxl_euler_plan(const std::vector<double>& alphas_cumprod, int steps, PredictionType prediction);
SamplerPlan sdxl_ddim_plan(const std::vector<double>& alphas_cumprod, int steps, PredictionType prediction);

}  // namespace flame_train

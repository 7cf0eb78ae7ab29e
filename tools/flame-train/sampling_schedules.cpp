// The samplers' noise levels, timesteps and step coefficients (see sampling_schedules.h).
#include "sampling_schedules.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace flame_train {
namespace {

// numpy.linspace(start, stop, n).
std::vector<double> linspace(double start, double stop, int n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = n == 1 ? start : start + (stop - start) * i / (n - 1);
  return v;
}

double alpha_at(const std::vector<double>& alphas_cumprod, int t) {
  const int last = static_cast<int>(alphas_cumprod.size()) - 1;
  return alphas_cumprod[static_cast<size_t>(std::clamp(t, 0, last))];
}

void check_steps(int steps) {
  if (steps < 1) throw std::invalid_argument("sampler steps must be at least 1, got " + std::to_string(steps));
}

}  // namespace

SdxlSampler parse_sdxl_sampler(const std::string& name) {
  if (name == "euler") return SdxlSampler::Euler;
  if (name == "ddim") return SdxlSampler::Ddim;
  throw std::invalid_argument("unknown SDXL sampler '" + name + "' (euler, ddim)");
}

std::vector<double> flux_sampling_sigmas(int steps, double image_seq_len, const FlowMatchOptions& o) {
  check_steps(steps);
  const double mu = flux_shift_mu(o, image_seq_len);
  std::vector<double> sigmas = linspace(1.0, 1.0 / steps, steps);
  for (double& s : sigmas) s = exponential_time_shift(mu, s);
  sigmas.push_back(0.0);
  return sigmas;
}

std::vector<double> sd3_sampling_sigmas(int steps, double shift, int num_train_timesteps) {
  check_steps(steps);
  const double n = num_train_timesteps;
  const double sigma_max = fixed_time_shift(shift, 1.0), sigma_min = fixed_time_shift(shift, 1.0 / n);
  std::vector<double> sigmas = linspace(sigma_max * n, sigma_min * n, steps);
  for (double& s : sigmas) s = fixed_time_shift(shift, s / n);
  sigmas.push_back(0.0);
  return sigmas;
}

SamplerPlan flow_euler_plan(const std::vector<double>& sigmas, FlowTimestepInput input) {
  SamplerPlan plan;
  for (size_t i = 0; i + 1 < sigmas.size(); ++i) {
    SamplerStep s;
    s.sigma = sigmas[i];
    s.timestep = input == FlowTimestepInput::Sigma ? sigmas[i] : sigmas[i] * 1000.0;
    s.output_coef = sigmas[i + 1] - sigmas[i];
    plan.steps.push_back(s);
  }
  return plan;
}

std::vector<int> leading_timesteps(int steps, int num_train_timesteps, int steps_offset) {
  check_steps(steps);
  const int ratio = num_train_timesteps / steps;
  std::vector<int> t;
  for (int i = steps - 1; i >= 0; --i) t.push_back(i * ratio + steps_offset);
  return t;
}

std::vector<double> euler_discrete_sigmas(const std::vector<double>& alphas_cumprod, const std::vector<int>& timesteps) {
  std::vector<double> sigmas;
  for (int t : timesteps) {
    // diffusers computes ((1 - ac) / ac) ** 0.5 on the f32 table.
    const float a = static_cast<float>(alpha_at(alphas_cumprod, t));
    sigmas.push_back(static_cast<double>(std::sqrt((1.0f - a) / a)));
  }
  sigmas.push_back(0.0);
  return sigmas;
}

SamplerPlan sdxl_euler_plan(const std::vector<double>& alphas_cumprod, int steps, PredictionType prediction) {
  const std::vector<int> timesteps = leading_timesteps(steps);
  const std::vector<double> sigmas = euler_discrete_sigmas(alphas_cumprod, timesteps);
  SamplerPlan plan;
  const double sigma_max = *std::max_element(sigmas.begin(), sigmas.end());
  plan.init_noise_scale = std::sqrt(sigma_max * sigma_max + 1.0);
  for (size_t i = 0; i < timesteps.size(); ++i) {
    const double s = sigmas[i], dt = sigmas[i + 1] - s, s2 = s * s + 1.0;
    SamplerStep step;
    step.timestep = timesteps[i];
    step.sigma = s;
    step.input_scale = 1.0 / std::sqrt(s2);
    if (prediction == PredictionType::Epsilon) {
      step.sample_coef = 1.0;
      step.output_coef = dt;
    } else {  // x + dt (x - x0) / s with x0 = -s / sqrt(s2) m + x / s2
      step.sample_coef = 1.0 + dt * s / s2;
      step.output_coef = dt / std::sqrt(s2);
    }
    plan.steps.push_back(step);
  }
  return plan;
}

SamplerPlan sdxl_ddim_plan(const std::vector<double>& alphas_cumprod, int steps, PredictionType prediction) {
  const std::vector<int> timesteps = leading_timesteps(steps);
  const int ratio = static_cast<int>(alphas_cumprod.size()) / steps;
  SamplerPlan plan;
  for (int t : timesteps) {
    const int prev = t - ratio;
    const double a = alpha_at(alphas_cumprod, t), ap = prev >= 0 ? alpha_at(alphas_cumprod, prev) : alphas_cumprod[0];
    const double sa = std::sqrt(a), sb = std::sqrt(1.0 - a), spa = std::sqrt(ap), spb = std::sqrt(1.0 - ap);
    SamplerStep step;
    step.timestep = t;
    step.sigma = sb / sa;
    if (prediction == PredictionType::Epsilon) {
      step.sample_coef = spa / sa;
      step.output_coef = spb - spa * sb / sa;
    } else {
      step.sample_coef = spa * sa + spb * sb;
      step.output_coef = spb * sa - spa * sb;
    }
    plan.steps.push_back(step);
  }
  return plan;
}

}  // namespace flame_train

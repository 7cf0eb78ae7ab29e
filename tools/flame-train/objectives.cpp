// The objectives' host arithmetic (see objectives.h).
#include "objectives.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "random.h"

namespace flame_train {
namespace {
constexpr double kPi = 3.14159265358979323846;
}

TimestepSampling parse_timestep_sampling(const std::string& name) {
  if (name == "uniform") return TimestepSampling::Uniform;
  if (name == "logit_normal") return TimestepSampling::LogitNormal;
  if (name == "sigmoid") return TimestepSampling::Sigmoid;
  if (name == "mode") return TimestepSampling::Mode;
  throw std::invalid_argument("unknown timestep sampling '" + name + "' (uniform, logit_normal, sigmoid, mode)");
}

FlowWeighting parse_flow_weighting(const std::string& name) {
  if (name == "none") return FlowWeighting::None;
  if (name == "sigma_sqrt") return FlowWeighting::SigmaSqrt;
  if (name == "cosmap") return FlowWeighting::CosMap;
  throw std::invalid_argument("unknown loss weighting '" + name + "' (none, sigma_sqrt, cosmap)");
}

PredictionType parse_prediction_type(const std::string& name) {
  if (name == "epsilon") return PredictionType::Epsilon;
  if (name == "v_prediction") return PredictionType::VPrediction;
  throw std::invalid_argument("unknown prediction type '" + name + "' (epsilon, v_prediction)");
}

double flow_density_sample(const FlowMatchOptions& o, double z, double v) {
  switch (o.sampling) {
    case TimestepSampling::LogitNormal: return 1.0 / (1.0 + std::exp(-(o.logit_mean + o.logit_std * z)));
    case TimestepSampling::Sigmoid: return 1.0 / (1.0 + std::exp(-(o.logit_std * z)));
    case TimestepSampling::Mode: {
      const double c = std::cos(kPi * v / 2.0);
      return 1.0 - v - o.mode_scale * (c * c - 1.0 + v);
    }
    case TimestepSampling::Uniform: return v;
  }
  return v;
}

double flux_shift_mu(const FlowMatchOptions& o, double image_seq_len) {
  const double m = (o.max_shift - o.base_shift) / (o.max_image_seq_len - o.base_image_seq_len);
  const double b = o.base_shift - m * o.base_image_seq_len;
  return image_seq_len * m + b;
}

double exponential_time_shift(double mu, double t) { return std::exp(mu) / (std::exp(mu) + (1.0 / t - 1.0)); }

double fixed_time_shift(double shift, double t) { return shift * t / (1.0 + (shift - 1.0) * t); }

double discrete_sigma(double u, int n) {
  const int64_t index = std::clamp<int64_t>(static_cast<int64_t>(std::floor(u * n)), 0, n - 1);
  return static_cast<double>(n - index) / static_cast<double>(n);
}

double flow_sigma(const FlowMatchOptions& o, double u, double image_seq_len) {
  const double t = discrete_sigma(u, o.num_train_timesteps);
  switch (o.shift) {
    case FlowShift::None: return t;
    case FlowShift::Fixed: return fixed_time_shift(o.fixed_shift, t);
    case FlowShift::Resolution: return exponential_time_shift(flux_shift_mu(o, image_seq_len), t);
  }
  return t;
}

double flow_loss_weight(FlowWeighting w, double sigma) {
  switch (w) {
    case FlowWeighting::None: return 1.0;
    case FlowWeighting::SigmaSqrt: return 1.0 / (sigma * sigma);
    case FlowWeighting::CosMap: return 2.0 / (kPi * (1.0 - 2.0 * sigma + 2.0 * sigma * sigma));
  }
  return 1.0;
}

double standard_normal(RandomStream& rng) {
  const double u1 = 1.0 - rng.next_unit();  // (0, 1]
  const double u2 = rng.next_unit();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * kPi * u2);
}

FlowSample draw_flow_sample(const FlowMatchOptions& o, FlowTimestepInput input, double image_seq_len,
                            RandomStream& rng) {
  const double z = standard_normal(rng);
  const double v = rng.next_unit();
  FlowSample s;
  s.sigma = flow_sigma(o, flow_density_sample(o, z, v), image_seq_len);
  s.timestep = input == FlowTimestepInput::Sigma ? s.sigma : s.sigma * 1000.0;
  s.weight = flow_loss_weight(o.weighting, s.sigma);
  return s;
}

std::vector<double> scaled_linear_alphas_cumprod(double beta_start, double beta_end, int n) {
  // torch.linspace(beta_start**0.5, beta_end**0.5, n, dtype=float32) ** 2, then cumprod in f32.
  // torch's f32 linspace computes start + i * step for the first half and end - (n - 1 - i) * step
  // for the second; the difference from a plain formula is below 1e-7 relative.
  std::vector<double> out(static_cast<size_t>(n));
  const float a = static_cast<float>(std::sqrt(beta_start)), b = static_cast<float>(std::sqrt(beta_end));
  const float step = (b - a) / static_cast<float>(n - 1);
  float cumprod = 1.0f;
  for (int i = 0; i < n; ++i) {
    const float root = i < n / 2 ? a + step * static_cast<float>(i) : b - step * static_cast<float>(n - 1 - i);
    const float beta = root * root;
    cumprod *= 1.0f - beta;
    out[static_cast<size_t>(i)] = cumprod;
  }
  return out;
}

double snr(double ac) { return ac / (1.0 - ac); }

double min_snr_weight(double ac, double gamma, PredictionType p) {
  if (gamma <= 0) return 1.0;
  const double s = snr(ac);
  return std::min(s, gamma) / (p == PredictionType::Epsilon ? s : s + 1.0);
}

DdpmSample ddpm_sample_at(const std::vector<double>& alphas_cumprod, int64_t t, PredictionType p, double gamma) {
  if (t < 0 || t >= static_cast<int64_t>(alphas_cumprod.size()))
    throw std::out_of_range("DDPM timestep " + std::to_string(t) + " outside the schedule");
  const double ac = alphas_cumprod[static_cast<size_t>(t)];
  DdpmSample s;
  s.timestep = t;
  s.noisy_x0_coef = std::sqrt(ac);
  s.noisy_noise_coef = std::sqrt(1.0 - ac);
  if (p == PredictionType::Epsilon) {
    s.target_x0_coef = 0.0;
    s.target_noise_coef = 1.0;
  } else {
    s.target_x0_coef = -std::sqrt(1.0 - ac);
    s.target_noise_coef = std::sqrt(ac);
  }
  s.weight = min_snr_weight(ac, gamma, p);
  return s;
}

DdpmSample draw_ddpm_sample(const std::vector<double>& alphas_cumprod, PredictionType p, double gamma,
                            RandomStream& rng) {
  const int64_t t = static_cast<int64_t>(rng.next_below(alphas_cumprod.size()));
  return ddpm_sample_at(alphas_cumprod, t, p, gamma);
}

std::array<float, 6> sdxl_time_ids(int original_h, int original_w, int crop_top, int crop_left, int target_h,
                                   int target_w) {
  return {static_cast<float>(original_h), static_cast<float>(original_w), static_cast<float>(crop_top),
          static_cast<float>(crop_left),  static_cast<float>(target_h),   static_cast<float>(target_w)};
}

}  // namespace flame_train

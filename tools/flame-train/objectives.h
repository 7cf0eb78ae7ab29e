// The training objectives' host-side arithmetic (flame-train, issue 37): which noise level each
// sample of a batch trains at, what the model's inputs and targets are, and how the per-sample
// losses are weighted. Pure functions of their arguments (no GPU, no global state), so the CPU tests
// (tests/trainer/test_trainer_objectives.cpp) check them against numbers derived from diffusers:
//
//  Flow matching (Flux, SD3; diffusers' FlowMatchEulerDiscreteScheduler and the dreambooth LoRA
//  scripts train_dreambooth_lora_flux.py / _sd3.py):
//    u ~ density (compute_density_for_timestep_sampling: logit_normal = sigmoid(N(mean, std)),
//        mode = 1 - u - scale (cos^2(pi u / 2) - 1 + u), uniform; kohya's "sigmoid" = logit-normal
//        with mean 0 and std sigmoid_scale), index = floor(u * 1000), sigma = (1000 - index) / 1000
//        (the scheduler's discrete sigmas), then shifted: SD3's fixed shift s * t / (1 + (s - 1) t)
//        (shift 3.0), or Flux's resolution-dependent exponential shift e^mu / (e^mu + 1 / t - 1)
//        with mu = calculate_shift(image tokens; 256 -> 0.5, 4096 -> 1.15);
//    noisy = (1 - sigma) x0 + sigma noise, target = noise - x0; the model's timestep is sigma
//    (Flux: diffusers passes t / 1000, the model multiplies by 1000) or sigma * 1000 (SD3);
//    loss weights compute_loss_weighting_for_sd3: none (1), sigma_sqrt (1 / sigma^2), cosmap
//    (2 / (pi (1 - 2 sigma + 2 sigma^2))). (The SD3 script's default --precondition_outputs compares
//    noisy - sigma pred with x0, i.e. this target with an extra factor sigma^2; flame-train uses the
//    Flux script's form, target noise - x0, for both.)
//  DDPM (SDXL; DDPMScheduler with beta_schedule "scaled_linear", 0.00085 .. 0.012, 1000 steps):
//    betas = linspace(sqrt(b0), sqrt(b1), N)^2, alphas_cumprod = prod(1 - beta); t ~ U{0..999};
//    noisy = sqrt(ac) x0 + sqrt(1 - ac) noise; target noise (epsilon) or sqrt(ac) noise -
//    sqrt(1 - ac) x0 (v_prediction); min-SNR-gamma weights (train_text_to_image*.py):
//    min(snr, gamma) / snr (epsilon), min(snr, gamma) / (snr + 1) (v_prediction), snr = ac / (1 - ac);
//    SDXL's add_time_ids = (original h, w, crop top, left, target h, w).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace flame_train {

class RandomStream;

// ---- flow matching ----

enum class TimestepSampling { Uniform, LogitNormal, Sigmoid, Mode };
enum class FlowShift { None, Fixed, Resolution };
enum class FlowWeighting { None, SigmaSqrt, CosMap };

struct FlowMatchOptions {
  TimestepSampling sampling = TimestepSampling::Sigmoid;
  double logit_mean = 0.0;   // logit_normal
  double logit_std = 1.0;    // logit_normal; the scale of "sigmoid"
  double mode_scale = 1.29;  // mode
  FlowShift shift = FlowShift::Resolution;
  double fixed_shift = 3.0;  // FlowShift::Fixed (SD3)
  // FlowShift::Resolution (Flux's scheduler config).
  double base_shift = 0.5, max_shift = 1.15;
  double base_image_seq_len = 256, max_image_seq_len = 4096;
  FlowWeighting weighting = FlowWeighting::None;
  int num_train_timesteps = 1000;
};

// Parses "uniform" | "logit_normal" | "sigmoid" | "mode" (throws std::invalid_argument otherwise).
TimestepSampling parse_timestep_sampling(const std::string& name);
FlowWeighting parse_flow_weighting(const std::string& name);

// u in (0, 1) by the density, from one standard normal draw z and one uniform draw v in [0, 1)
// (the caller's random numbers, so that the mapping is testable).
double flow_density_sample(const FlowMatchOptions& o, double z, double v);
// diffusers' calculate_shift: mu, linear in the image token count.
double flux_shift_mu(const FlowMatchOptions& o, double image_seq_len);
// time_shift with the exponential rule (sigma exponent 1): e^mu / (e^mu + (1 / t - 1)).
double exponential_time_shift(double mu, double t);
// The fixed shift of SD3's scheduler: s t / (1 + (s - 1) t).
double fixed_time_shift(double shift, double t);
// The discrete unshifted sigma of u: (N - floor(u N)) / N, in [1 / N, 1].
double discrete_sigma(double u, int num_train_timesteps);
// The shifted sigma of u for an image of image_seq_len tokens (Flux: (H / 2) (W / 2) of the latent).
double flow_sigma(const FlowMatchOptions& o, double u, double image_seq_len);
// compute_loss_weighting_for_sd3.
double flow_loss_weight(FlowWeighting w, double sigma);

// One sample's draw: sigma, the model's timestep input and the loss weight.
struct FlowSample {
  double sigma = 0, timestep = 0, weight = 1;
};
enum class FlowTimestepInput { Sigma, SigmaTimes1000 };  // Flux, SD3
FlowSample draw_flow_sample(const FlowMatchOptions& o, FlowTimestepInput input, double image_seq_len,
                            RandomStream& rng);

// ---- DDPM (SDXL) ----

enum class PredictionType { Epsilon, VPrediction };
PredictionType parse_prediction_type(const std::string& name);

// The scaled-linear schedule's cumulative alphas (computed in f32 as torch does, returned as double).
std::vector<double> scaled_linear_alphas_cumprod(double beta_start = 0.00085, double beta_end = 0.012,
                                                 int num_train_timesteps = 1000);
double snr(double alpha_cumprod);
// min(snr, gamma) / snr (epsilon) or / (snr + 1) (v); gamma <= 0: 1 (off).
double min_snr_weight(double alpha_cumprod, double gamma, PredictionType p);

struct DdpmSample {
  int64_t timestep = 0;
  double noisy_x0_coef = 0, noisy_noise_coef = 0;    // noisy = a x0 + b noise
  double target_x0_coef = 0, target_noise_coef = 0;  // target = c x0 + d noise
  double weight = 1;
};
DdpmSample ddpm_sample_at(const std::vector<double>& alphas_cumprod, int64_t t, PredictionType p, double min_snr_gamma);
DdpmSample draw_ddpm_sample(const std::vector<double>& alphas_cumprod, PredictionType p, double min_snr_gamma,
                            RandomStream& rng);

// SDXL's add_time_ids: original (h, w), crop (top, left), target (h, w), in pixels.
std::array<float, 6> sdxl_time_ids(int original_h, int original_w, int crop_top, int crop_left, int target_h,
                                   int target_w);

// A standard normal from two uniforms of the stream (Box-Muller), for host-side draws.
double standard_normal(RandomStream& rng);

}  // namespace flame_train

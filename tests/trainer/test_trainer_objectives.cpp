// flame-train's objectives and learning-rate schedules (host arithmetic; no GPU). The expected
// numbers are derived from diffusers' formulas (FlowMatchEulerDiscreteScheduler, calculate_shift,
// compute_density_for_timestep_sampling, compute_loss_weighting_for_sd3, DDPMScheduler's
// scaled_linear betas, the min-SNR weights of train_text_to_image_sdxl.py) and transformers'
// schedule lambdas, evaluated independently in double precision (python3, recorded here).
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "lr_schedule.h"
#include "objectives.h"
#include "progress.h"
#include "random.h"

using namespace flame_train;

TEST(TrainerObjectives, FluxShiftIsLinearInImageTokens) {
  FlowMatchOptions o;
  EXPECT_NEAR(flux_shift_mu(o, 256), 0.5, 1e-12);
  EXPECT_NEAR(flux_shift_mu(o, 4096), 1.15, 1e-12);
  EXPECT_NEAR(flux_shift_mu(o, 1024), 0.63, 1e-12);  // 512x512 image: 32x32 packed tokens
  // e^0.63 / (e^0.63 + 1 / 0.5 - 1)
  EXPECT_NEAR(exponential_time_shift(0.63, 0.5), 0.6524894621927445, 1e-12);
}

TEST(TrainerObjectives, Sd3FixedShift) {
  EXPECT_NEAR(fixed_time_shift(3.0, 0.5), 0.75, 1e-12);
  EXPECT_NEAR(fixed_time_shift(3.0, 0.25), 0.5, 1e-12);
  EXPECT_NEAR(fixed_time_shift(3.0, 1.0), 1.0, 1e-12);
}

TEST(TrainerObjectives, DiscreteSigmasAreTheSchedulersGrid) {
  // timesteps = linspace(1, 1000, 1000)[::-1], sigmas = timesteps / 1000, index = floor(u * 1000)
  EXPECT_DOUBLE_EQ(discrete_sigma(0.0, 1000), 1.0);
  EXPECT_DOUBLE_EQ(discrete_sigma(0.9999, 1000), 0.001);
  EXPECT_DOUBLE_EQ(discrete_sigma(0.25, 1000), 0.75);
  EXPECT_DOUBLE_EQ(discrete_sigma(1.0, 1000), 0.001);  // clamped to the last index
  FlowMatchOptions sd3;
  sd3.shift = FlowShift::Fixed;
  EXPECT_NEAR(flow_sigma(sd3, 0.5, 0), 0.75, 1e-12);  // sigma 0.5, shifted by 3
  FlowMatchOptions flux;
  EXPECT_NEAR(flow_sigma(flux, 0.5, 1024), 0.6524894621927445, 1e-12);
  FlowMatchOptions none;
  none.shift = FlowShift::None;
  EXPECT_DOUBLE_EQ(flow_sigma(none, 0.5, 1024), 0.5);
}

TEST(TrainerObjectives, DensitySamples) {
  FlowMatchOptions o;
  o.sampling = TimestepSampling::LogitNormal;
  o.logit_mean = 0.5;
  o.logit_std = 2.0;
  EXPECT_NEAR(flow_density_sample(o, 0.7, 0.1), 0.8698915256370021, 1e-12);  // sigmoid(0.5 + 2 * 0.7)
  o.sampling = TimestepSampling::Sigmoid;  // kohya: sigmoid(scale * z), no mean
  EXPECT_NEAR(flow_density_sample(o, 0.7, 0.1), 1.0 / (1.0 + std::exp(-1.4)), 1e-12);
  o.sampling = TimestepSampling::Mode;
  EXPECT_NEAR(flow_density_sample(o, 0.0, 0.25), 0.6164161261346769, 1e-12);
  o.sampling = TimestepSampling::Uniform;
  EXPECT_DOUBLE_EQ(flow_density_sample(o, 3.0, 0.25), 0.25);
  EXPECT_THROW(parse_timestep_sampling("cosine"), std::invalid_argument);
  EXPECT_EQ(parse_timestep_sampling("sigmoid"), TimestepSampling::Sigmoid);
}

TEST(TrainerObjectives, Sd3LossWeighting) {
  EXPECT_DOUBLE_EQ(flow_loss_weight(FlowWeighting::None, 0.3), 1.0);
  EXPECT_NEAR(flow_loss_weight(FlowWeighting::SigmaSqrt, 0.5), 4.0, 1e-12);
  EXPECT_NEAR(flow_loss_weight(FlowWeighting::CosMap, 0.3), 1.097620297185485, 1e-12);
}

TEST(TrainerObjectives, FlowDrawsAreDeterministicAndInRange) {
  FlowMatchOptions o;  // Flux: sigmoid + resolution shift
  RandomStream a(42, RandomPurpose::Timestep, 3, 0), b(42, RandomPurpose::Timestep, 3, 0);
  double mean = 0;
  for (int i = 0; i < 2000; ++i) {
    FlowSample x = draw_flow_sample(o, FlowTimestepInput::Sigma, 1024, a);
    FlowSample y = draw_flow_sample(o, FlowTimestepInput::Sigma, 1024, b);
    ASSERT_EQ(x.sigma, y.sigma);
    ASSERT_GT(x.sigma, 0.0);
    ASSERT_LE(x.sigma, 1.0);
    ASSERT_EQ(x.timestep, x.sigma);
    mean += x.sigma / 2000;
  }
  // The logit-normal median 0.5 maps to 0.652 under the shift: the mean lies well above 0.5.
  EXPECT_GT(mean, 0.58);
  EXPECT_LT(mean, 0.72);
  FlowSample s = draw_flow_sample(o, FlowTimestepInput::SigmaTimes1000, 1024, a);
  EXPECT_NEAR(s.timestep, s.sigma * 1000.0, 1e-9);
}

TEST(TrainerObjectives, ScaledLinearAlphasCumprod) {
  const std::vector<double> ac = scaled_linear_alphas_cumprod();
  ASSERT_EQ(ac.size(), 1000u);
  EXPECT_NEAR(ac[0], 0.99915, 1e-7);
  EXPECT_NEAR(ac[499], 0.27766965045646763, 3e-6);
  EXPECT_NEAR(ac[999], 0.004660098513077234, 1e-7);  // SD / SDXL's final alpha_cumprod, 0.00466
}

TEST(TrainerObjectives, DdpmTargetsAndMinSnr) {
  const std::vector<double> ac = scaled_linear_alphas_cumprod();
  DdpmSample e = ddpm_sample_at(ac, 499, PredictionType::Epsilon, 5.0);
  EXPECT_NEAR(e.noisy_x0_coef, 0.526943688126604, 3e-6);
  EXPECT_NEAR(e.noisy_noise_coef, 0.8499001997549668, 3e-6);
  EXPECT_EQ(e.target_x0_coef, 0.0);
  EXPECT_EQ(e.target_noise_coef, 1.0);
  EXPECT_NEAR(e.weight, 1.0, 1e-12);  // snr 0.384 < gamma
  DdpmSample v = ddpm_sample_at(ac, 499, PredictionType::VPrediction, 5.0);
  EXPECT_NEAR(v.target_noise_coef, 0.526943688126604, 3e-6);  // v = sqrt(ac) noise - sqrt(1 - ac) x0
  EXPECT_NEAR(v.target_x0_coef, -0.8499001997549668, 3e-6);
  EXPECT_NEAR(v.weight, 0.27766965045646763, 3e-6);  // snr / (snr + 1) = ac
  DdpmSample e10 = ddpm_sample_at(ac, 10, PredictionType::Epsilon, 5.0);
  EXPECT_NEAR(e10.weight, 0.048305676515169475, 1e-5);  // 5 / snr, snr = 103.5
  DdpmSample v10 = ddpm_sample_at(ac, 10, PredictionType::VPrediction, 5.0);
  EXPECT_NEAR(v10.weight, 0.04784345442857052, 1e-5);  // 5 / (snr + 1)
  EXPECT_EQ(ddpm_sample_at(ac, 10, PredictionType::Epsilon, 0.0).weight, 1.0);  // gamma 0: off
  EXPECT_THROW(ddpm_sample_at(ac, 1000, PredictionType::Epsilon, 0.0), std::out_of_range);
  RandomStream r(1, RandomPurpose::Timestep, 0, 0);
  for (int i = 0; i < 500; ++i) {
    DdpmSample d = draw_ddpm_sample(ac, PredictionType::Epsilon, 0.0, r);
    ASSERT_GE(d.timestep, 0);
    ASSERT_LT(d.timestep, 1000);
  }
  EXPECT_THROW(parse_prediction_type("sample"), std::invalid_argument);
}

TEST(TrainerObjectives, SdxlTimeIds) {
  const std::array<float, 6> ids = sdxl_time_ids(1200, 800, 16, 0, 1024, 768);
  const std::array<float, 6> expected = {1200, 800, 16, 0, 1024, 768};
  EXPECT_EQ(ids, expected);
}

TEST(TrainerLrSchedule, ConstantIgnoresNothingButWarmup) {
  LrSchedule c = make_lr_schedule("constant", 0, 100);
  EXPECT_EQ(c.kind, LrScheduleKind::Constant);
  EXPECT_EQ(lr_multiplier(c, 0), 1.0);
  LrSchedule w = make_lr_schedule("constant", 10, 100);
  EXPECT_EQ(w.kind, LrScheduleKind::ConstantWithWarmup);
  EXPECT_EQ(lr_multiplier(w, 0), 0.0);
  EXPECT_DOUBLE_EQ(lr_multiplier(w, 5), 0.5);
  EXPECT_EQ(lr_multiplier(w, 10), 1.0);
  EXPECT_EQ(lr_multiplier(w, 99), 1.0);
  EXPECT_THROW(make_lr_schedule("linear", 0, 10), std::invalid_argument);
}

TEST(TrainerLrSchedule, CosineWithWarmup) {
  LrSchedule s = make_lr_schedule("cosine", 10, 110);
  EXPECT_DOUBLE_EQ(lr_multiplier(s, 3), 0.3);
  EXPECT_NEAR(lr_multiplier(s, 10), 1.0, 1e-12);
  EXPECT_NEAR(lr_multiplier(s, 35), 0.8535533905932737, 1e-12);  // progress 0.25: 0.5 (1 + cos(pi / 4))
  EXPECT_NEAR(lr_multiplier(s, 60), 0.5, 1e-12);
  EXPECT_NEAR(lr_multiplier(s, 110), 0.0, 1e-12);
  EXPECT_EQ(lr_multiplier(s, 200), 0.0);  // clamped past the end
  LrSchedule nowarm = make_lr_schedule("cosine", 0, 4);
  EXPECT_NEAR(lr_multiplier(nowarm, 0), 1.0, 1e-12);
  EXPECT_NEAR(lr_multiplier(nowarm, 2), 0.5, 1e-12);
}

// ---- the progress line (progress.h) ----

TEST(TrainerProgress, SmoothedLossRateEtaAndLine) {
  flame_train::Progress p(100);
  p.record(1, 2.0, 500);
  EXPECT_DOUBLE_EQ(p.smoothed_loss(), 2.0);  // bias-corrected: the first step is its own average
  p.record(2, 1.0, 500);
  // (0.9 * 0.1 * 2 + 0.1 * 1) / (1 - 0.81) = 0.28 / 0.19
  EXPECT_NEAR(p.smoothed_loss(), 0.28 / 0.19, 1e-12);
  EXPECT_DOUBLE_EQ(p.steps_per_second(), 2.0);
  EXPECT_DOUBLE_EQ(p.seconds_left(), 49.0);  // 98 steps at 2 it/s
  for (int64_t s = 3; s <= 30; ++s) p.record(s, 1.0, 250);  // the window keeps the last 20 steps
  EXPECT_DOUBLE_EQ(p.steps_per_second(), 4.0);
  EXPECT_DOUBLE_EQ(p.seconds_left(), 17.5);
  EXPECT_TRUE(p.prints_in_log());
  EXPECT_EQ(p.line(1e-4, uint64_t(3) << 30, uint64_t(7) << 29),
            "step 30/100  4.00 it/s  ETA 0:18  loss 1.00000 (avg 1.00492)  lr 0.0001  GPU 3.0 GiB (peak 3.5)");  // 1 + 0.1 * 0.9^29 / (1 - 0.9^30)
  p.record(31, 1.0, 250);
  EXPECT_FALSE(p.prints_in_log());
  EXPECT_EQ(flame_train::format_duration(3725.4), "1:02:05");
  EXPECT_EQ(flame_train::format_duration(59.6), "1:00");
  flame_train::Progress resumed(10, 6);  // a resumed run prints its first step
  resumed.record(7, 1.0, 10);
  EXPECT_TRUE(resumed.prints_in_log());
}

// flame-train's sampling on the CPU: the samplers' sigma / timestep tables and step coefficients
// (sampling_schedules.h) against numbers worked out by hand (Python, double precision) from
// diffusers' formulas (FluxPipeline + FlowMatchEulerDiscreteScheduler with dynamic shifting, SD3's
// shift-3 scheduler, SDXL's EulerDiscreteScheduler and DDIMScheduler with "leading" spacing and
// steps_offset 1), the sample images' pixels (sample_grid.h), the PNG writer (images.h) and the
// sample.* configuration keys.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "config.h"
#include "image_writers.h"
#include "images.h"
#include "objectives.h"
#include "sample_grid.h"
#include "sampling_schedules.h"

namespace {

using namespace flame_train;

void expect_near_all(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "index " << i;
}

TEST(SamplingSchedules, FluxSigmasShiftWithTheImageTokenCount) {
  // mu = calculate_shift(256) = 0.5: sigmas e^mu / (e^mu + 1 / s - 1) of linspace(1, 1/4, 4), then 0.
  expect_near_all(flux_sampling_sigmas(4, 256), {1.0, 0.8318243439635804, 0.6224593312018546, 0.3546612443924434, 0.0},
                  1e-12);
  // 1024 tokens (a 1024 x 1024 image): mu = 0.5 + 0.65 * 768 / 3840 = 0.63.
  expect_near_all(flux_sampling_sigmas(3, 1024), {1.0, 0.7897048388156547, 0.4842184486768554, 0.0}, 1e-12);
  expect_near_all(flux_sampling_sigmas(1, 4096), {1.0, 0.0}, 1e-12);
}

TEST(SamplingSchedules, Sd3SigmasAreShiftedTwiceAtTheLowEnd) {
  // timesteps linspace(1000, 1000 shift(1/1000), 4) / 1000, shifted again (as diffusers does).
  expect_near_all(sd3_sampling_sigmas(4), {1.0, 0.8576923076923075, 0.6021505376344084, 0.008928571428571713, 0.0},
                  1e-12);
  expect_near_all(sd3_sampling_sigmas(1), {1.0, 0.0}, 1e-12);
}

TEST(SamplingSchedules, FlowEulerPlanTakesSigmaDifferences) {
  const std::vector<double> sigmas = sd3_sampling_sigmas(4);
  const SamplerPlan sd3 = flow_euler_plan(sigmas, FlowTimestepInput::SigmaTimes1000);
  ASSERT_EQ(sd3.steps.size(), 4u);
  EXPECT_EQ(sd3.init_noise_scale, 1.0);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_DOUBLE_EQ(sd3.steps[i].timestep, 1000 * sigmas[i]);
    EXPECT_DOUBLE_EQ(sd3.steps[i].sample_coef, 1.0);
    EXPECT_DOUBLE_EQ(sd3.steps[i].output_coef, sigmas[i + 1] - sigmas[i]);
    EXPECT_DOUBLE_EQ(sd3.steps[i].input_scale, 1.0);
  }
  const SamplerPlan flux = flow_euler_plan(flux_sampling_sigmas(2, 256), FlowTimestepInput::Sigma);
  EXPECT_DOUBLE_EQ(flux.steps[1].timestep, flux_sampling_sigmas(2, 256)[1]);
  // The Euler steps add up to the whole way from noise (sigma 1) to the image (sigma 0).
  double total = 0;
  for (const SamplerStep& s : flux.steps) total += s.output_coef;
  EXPECT_NEAR(total, -1.0, 1e-12);
}

TEST(SamplingSchedules, LeadingTimestepsWithStepsOffset) {
  EXPECT_EQ(leading_timesteps(4), (std::vector<int>{751, 501, 251, 1}));
  const std::vector<int> t20 = leading_timesteps(20);
  ASSERT_EQ(t20.size(), 20u);
  EXPECT_EQ(t20.front(), 951);
  EXPECT_EQ(t20.back(), 1);
  EXPECT_EQ(leading_timesteps(3), (std::vector<int>{667, 334, 1}));  // 1000 // 3 = 333
  EXPECT_THROW(leading_timesteps(0), std::invalid_argument);
}

TEST(SamplingSchedules, SdxlEulerSigmasInitNoiseAndSteps) {
  const std::vector<double> ac = scaled_linear_alphas_cumprod();
  const std::vector<double> sigmas = euler_discrete_sigmas(ac, leading_timesteps(4));
  // sqrt((1 - ac_t) / ac_t) at 751, 501, 251, 1 (double precision; diffusers' f32 table within 1e-5).
  const std::vector<double> want = {4.116696479276066, 1.623692081515863, 0.6983980911630334, 0.04131441199678309, 0};
  ASSERT_EQ(sigmas.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(sigmas[i], want[i], 1e-5 * (1 + want[i])) << i;

  const SamplerPlan eps = sdxl_euler_plan(ac, 4, PredictionType::Epsilon);
  EXPECT_NEAR(eps.init_noise_scale, 4.236412385791067, 1e-4);  // sqrt(sigma_max^2 + 1), "leading"
  ASSERT_EQ(eps.steps.size(), 4u);
  EXPECT_EQ(eps.steps[0].timestep, 751);
  EXPECT_NEAR(eps.steps[0].input_scale, 1 / std::sqrt(want[0] * want[0] + 1), 1e-6);
  // One step from x = 0.7 with model output -0.3, to t = 501: epsilon x + (s' - s) m; v-prediction
  // x + (s' - s) (x - x0) / s with x0 = -s / sqrt(s^2 + 1) m + x / (s^2 + 1).
  const double x = 0.7, m = -0.3;
  EXPECT_NEAR(eps.steps[0].sample_coef * x + eps.steps[0].output_coef * m, 1.4479013193280608, 1e-5);
  const SamplerPlan v = sdxl_euler_plan(ac, 4, PredictionType::VPrediction);
  EXPECT_NEAR(v.steps[0].sample_coef * x + v.steps[0].output_coef * m, 0.47625236551106154, 1e-5);
  EXPECT_NEAR(eps.steps[3].output_coef, -want[3], 1e-6);  // the last step goes to sigma 0
}

TEST(SamplingSchedules, SdxlDdimCoefficients) {
  const std::vector<double> ac = scaled_linear_alphas_cumprod();
  // x_next = sqrt(a') x0 + sqrt(1 - a') eps, with a' = ac[t - 250] (ac[0] after the last step).
  const double eps_want[4][2] = {{2.2215896281188385, -1.3073403173625473},
                                 {1.5633922919320489, -0.75860083775369},
                                 {1.218697990602334, -0.6565236143322535},
                                 {1.000427623464135, -0.012142090164663218}};
  const double v_want[4][2] = {{0.9511931719681033, -0.3085960945981956},
                               {0.9174665380647247, -0.3978129604871229},
                               {0.8427853134914108, -0.5382498633192435},
                               {0.9999264077239142, -0.012131740862240923}};
  const SamplerPlan eps = sdxl_ddim_plan(ac, 4, PredictionType::Epsilon);
  const SamplerPlan v = sdxl_ddim_plan(ac, 4, PredictionType::VPrediction);
  ASSERT_EQ(eps.steps.size(), 4u);
  EXPECT_EQ(eps.init_noise_scale, 1.0);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(eps.steps[i].input_scale, 1.0);
    EXPECT_NEAR(eps.steps[i].sample_coef, eps_want[i][0], 2e-5) << i;
    EXPECT_NEAR(eps.steps[i].output_coef, eps_want[i][1], 2e-5) << i;
    EXPECT_NEAR(v.steps[i].sample_coef, v_want[i][0], 2e-5) << i;
    EXPECT_NEAR(v.steps[i].output_coef, v_want[i][1], 2e-5) << i;
  }
}

TEST(SamplingSchedules, SamplerNames) {
  EXPECT_EQ(parse_sdxl_sampler("euler"), SdxlSampler::Euler);
  EXPECT_EQ(parse_sdxl_sampler("ddim"), SdxlSampler::Ddim);
  EXPECT_THROW(parse_sdxl_sampler("dpm"), std::invalid_argument);
}

TEST(SampleGrid, DecodedPixelsAsDiffusersPostprocess) {
  // [3, 1, 2]: R = (-1, 1), G = (0, 2), B = (-3, NaN).
  const std::vector<float> chw = {-1.0f, 1.0f, 0.0f, 2.0f, -3.0f, NAN};
  const ImageRGB8 img = decoded_to_rgb8(chw, 1, 2);
  ASSERT_EQ(img.width, 2);
  ASSERT_EQ(img.height, 1);
  // round((x / 2 + 0.5) clamped * 255); 0 -> 127.5 rounds to even (128), as numpy's round.
  EXPECT_EQ(img.pixels, (std::vector<uint8_t>{0, 128, 0, 255, 255, 0}));
  EXPECT_THROW(decoded_to_rgb8(chw, 2, 2), std::invalid_argument);
}

TEST(SampleGrid, ImagesSideBySide) {
  ImageRGB8 a = flame_train_test::pattern_image(3, 2), b = flame_train_test::pattern_image(2, 2);
  const ImageRGB8 row = image_row({a, b});
  ASSERT_EQ(row.width, 5);
  ASSERT_EQ(row.height, 2);
  for (int y = 0; y < 2; ++y)
    for (int x = 0; x < 5; ++x)
      for (int c = 0; c < 3; ++c) {
        const ImageRGB8& src = x < 3 ? a : b;
        const int sx = x < 3 ? x : x - 3;
        EXPECT_EQ(row.pixels[(y * 5 + x) * 3 + c], src.pixels[(y * src.width + sx) * 3 + c]);
      }
  EXPECT_THROW(image_row({a, flame_train_test::pattern_image(3, 3)}), std::invalid_argument);
  EXPECT_THROW(image_row({}), std::invalid_argument);
}

TEST(SampleGrid, PpmAndPngFilesHoldThePixels) {
  flame_train_test::TempDir dir;
  const ImageRGB8 img = flame_train_test::pattern_image(7, 5);
  write_ppm(dir.file("a.ppm"), img);
  std::ifstream f(dir.file("a.ppm"), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const std::string header = "P6\n7 5\n255\n";
  ASSERT_EQ(bytes.size(), header.size() + img.pixels.size());
  EXPECT_EQ(bytes.substr(0, header.size()), header);
  EXPECT_EQ(std::vector<uint8_t>(bytes.begin() + static_cast<std::ptrdiff_t>(header.size()), bytes.end()), img.pixels);

  write_png_rgb8(dir.file("a.png"), img);
  const ImageRGB8 back = decode_image(dir.file("a.png"));
  EXPECT_EQ(back.width, 7);
  EXPECT_EQ(back.height, 5);
  EXPECT_EQ(back.pixels, img.pixels);

  EXPECT_THROW(write_ppm(dir.file("missing/a.ppm"), img), std::runtime_error);
  EXPECT_THROW(write_png_rgb8(dir.file("missing/a.png"), img), ImageError);
  ImageRGB8 bad = img;
  bad.pixels.pop_back();
  EXPECT_THROW(write_png_rgb8(dir.file("b.png"), bad), ImageError);
}

std::vector<std::string> config_problems(std::vector<std::pair<std::string, std::string>> overrides) {
  CommandLine cmd;
  cmd.demo = true;
  cmd.overrides = std::move(overrides);
  try {
    load_config(cmd);
  } catch (const ConfigError& e) {
    return e.problems();
  }
  return {};
}

TEST(SampleConfig, KeysAndTheirChecks) {
  CommandLine cmd;
  cmd.demo = true;
  cmd.overrides = {{"sample.seed", "7"}, {"sample.width", "256"}, {"sample.height", "128"}, {"sample.sampler", "ddim"}};
  const TrainConfig c = load_config(cmd);
  EXPECT_EQ(c.sample.seed, 7u);
  EXPECT_EQ(c.sample.width, 256);
  EXPECT_EQ(c.sample.height, 128);
  EXPECT_EQ(c.sample.sampler, "ddim");
  const TrainConfig d = load_config(CommandLine{{}, {}, false, false, true});
  EXPECT_EQ(d.sample.sampler, "euler");
  EXPECT_EQ(d.sample.width, 0);

  auto has = [](const std::vector<std::string>& problems, const std::string& text) {
    for (const auto& p : problems)
      if (p.find(text) != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(has(config_problems({{"sample.sampler", "dpm"}}), "sample.sampler"));
  EXPECT_TRUE(has(config_problems({{"sample.width", "256"}}), "set both"));
  EXPECT_TRUE(has(config_problems({{"sample.width", "260"}, {"sample.height", "256"}}), "multiples of 8"));
  EXPECT_TRUE(has(config_problems({{"sample.seed", "-1"}}), "sample.seed"));
}

}  // namespace

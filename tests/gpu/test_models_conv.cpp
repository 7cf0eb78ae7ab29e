// UNet2DConditionModel and AutoencoderKL through the model ABI (the parity with diffusers is
// tests/models/check_model_parity.py's): output shapes of tiny SDXL-, SD 1.5- and VAE-shaped
// configs (odd sizes included), gradients identical with and without checkpointing (every block
// and every second block), and input errors that name the input, leaving nothing changed.
#include <cmath>
#include <string>
#include <vector>
#include "flame_test.h"

namespace {

class ModelsConv : public GpuTest {};

struct Tensor {
  flame_tensor_t h = nullptr;
  Tensor() = default;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  ~Tensor() { flame_tensor_release(h); }
};

std::vector<float> host(flame_tensor_t t) {
  int64_t n = 0;
  EXPECT_EQ(flame_tensor_numel(t, &n), FLAME_OK);
  std::vector<float> v(static_cast<size_t>(n));
  EXPECT_EQ(flame_to_host(t, v.data(), v.size() * sizeof(float)), FLAME_OK) << flame_last_error_message();
  return v;
}

std::vector<int64_t> shape_of(flame_tensor_t t) {
  int64_t s[8] = {0};
  int32_t nd = 0;
  EXPECT_EQ(flame_tensor_ndim(t, &nd), FLAME_OK);
  EXPECT_EQ(flame_tensor_shape(t, s, nd), FLAME_OK);
  return std::vector<int64_t>(s, s + nd);
}

// A model with its parameters and a list of inputs (random normal floats, fixed integer tensors).
struct Fixture {
  flame_model_t model = nullptr;
  flame_params_t params = nullptr, inputs = nullptr;
  std::vector<flame_tensor_t> owned;
  ~Fixture() {
    for (flame_tensor_t t : owned) flame_tensor_release(t);
    flame_params_release(inputs);
    flame_params_release(params);
    flame_model_release(model);
  }
  flame_tensor_t randn(flame_ctx_t ctx, const char* name, std::vector<int64_t> shape) {
    flame_tensor_t t = nullptr;
    EXPECT_EQ(flame_randn(ctx, shape.data(), static_cast<int32_t>(shape.size()), FLAME_DTYPE_F32, &t), FLAME_OK);
    EXPECT_EQ(flame_tensor_set_requires_grad(t, 1), FLAME_OK);
    owned.push_back(t);
    if (name) {
      EXPECT_EQ(flame_params_add(inputs, name, t), FLAME_OK);
    }
    return t;
  }
  void ints(flame_ctx_t ctx, const char* name, const std::vector<int64_t>& v) {
    flame_tensor_t t = nullptr;
    int64_t n = static_cast<int64_t>(v.size());
    EXPECT_EQ(flame_from_host(ctx, v.data(), v.size() * 8, &n, 1, FLAME_DTYPE_I64, &t), FLAME_OK);
    owned.push_back(t);
    EXPECT_EQ(flame_params_add(inputs, name, t), FLAME_OK);
  }
};

bool make(flame_ctx_t ctx, Fixture& f, const char* arch, const std::string& config) {
  if (flame_model_create(ctx, arch, config.c_str(), nullptr, &f.model) != FLAME_OK) {
    ADD_FAILURE() << "flame_model_create: " << flame_last_error_message();
    return false;
  }
  EXPECT_EQ(flame_model_params(f.model, &f.params), FLAME_OK);
  EXPECT_EQ(flame_params_create(ctx, &f.inputs), FLAME_OK);
  return true;
}

// Forward under checkpointing policy n, loss = sum over outputs of sum(out * 1.5^k); returns the
// outputs and every parameter and input gradient on the host (gradients cleared afterwards).
std::vector<std::vector<float>> run(flame_ctx_t ctx, Fixture& f, int64_t every_n) {
  std::vector<std::vector<float>> got;
  EXPECT_EQ(flame_model_set_checkpointing(f.model, every_n), FLAME_OK);
  flame_params_t outputs = nullptr;
  if (flame_model_forward(f.model, f.inputs, &outputs) != FLAME_OK) {
    ADD_FAILURE() << "flame_model_forward: " << flame_last_error_message();
    return got;
  }
  int64_t n = 0;
  EXPECT_EQ(flame_params_count(outputs, &n), FLAME_OK);
  Tensor loss;
  for (int64_t i = 0; i < n; ++i) {
    flame_tensor_t y = nullptr;
    EXPECT_EQ(flame_params_tensor(outputs, i, &y), FLAME_OK);
    got.push_back(host(y));
    Tensor scaled, s, next;
    EXPECT_EQ(flame_mul_scalar(y, std::pow(1.5, static_cast<double>(i)), &scaled.h), FLAME_OK);
    EXPECT_EQ(flame_sum_all(scaled.h, &s.h), FLAME_OK);
    if (loss.h) {
      EXPECT_EQ(flame_add(loss.h, s.h, &next.h), FLAME_OK);
      std::swap(loss.h, next.h);
    } else {
      std::swap(loss.h, s.h);
    }
  }
  flame_params_release(outputs);
  EXPECT_EQ(flame_backward(ctx, loss.h, nullptr, 0), FLAME_OK) << flame_last_error_message();
  int64_t np = 0;
  EXPECT_EQ(flame_params_count(f.params, &np), FLAME_OK);
  std::vector<flame_tensor_t> leaves = f.owned;
  for (int64_t i = 0; i < np; ++i) {
    flame_tensor_t p = nullptr;
    EXPECT_EQ(flame_params_tensor(f.params, i, &p), FLAME_OK);
    leaves.push_back(p);
  }
  for (flame_tensor_t p : leaves) {
    Tensor g;
    EXPECT_EQ(flame_tensor_grad(p, &g.h), FLAME_OK);
    got.push_back(g.h ? host(g.h) : std::vector<float>{});
    EXPECT_EQ(flame_tensor_set_grad(p, nullptr), FLAME_OK);
  }
  return got;
}

// Checkpointing recomputes the same operations: results equal up to the nondeterminism of
// accumulation order in the convolution kernels' backward.
void expect_same(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), b[i].size()) << what << " tensor " << i;
    double scale = 0, diff = 0;
    for (size_t k = 0; k < a[i].size(); ++k) {
      scale = std::max(scale, std::fabs(static_cast<double>(a[i][k])));
      diff = std::max(diff, std::fabs(static_cast<double>(a[i][k]) - b[i][k]));
      ASSERT_TRUE(std::isfinite(a[i][k])) << what << " tensor " << i;
    }
    EXPECT_LE(diff, 1e-5 * scale + 1e-12) << what << " tensor " << i;
  }
}

const char* kUnetSdxl = R"({"block_out_channels": [32, 48, 64], "layers_per_block": 2,
  "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
  "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
  "transformer_layers_per_block": [1, 2, 3], "attention_head_dim": [1, 2, 4], "cross_attention_dim": 40,
  "use_linear_projection": true, "norm_num_groups": 8, "addition_embed_type": "text_time",
  "addition_time_embed_dim": 8, "projection_class_embeddings_input_dim": 72})";

}  // namespace

TEST_F(ModelsConv, UNetShapesAndCheckpointedGradients) {
  Fixture f;
  ASSERT_TRUE(make(ctx, f, "UNet2DConditionModel", kUnetSdxl));
  f.randn(ctx, "sample", {2, 4, 12, 20});
  f.ints(ctx, "timestep", {10, 700});
  f.randn(ctx, "encoder_hidden_states", {2, 7, 40});
  f.randn(ctx, "text_embeds", {2, 24});
  f.randn(ctx, "time_ids", {2, 6});
  const auto plain = run(ctx, f, 0);
  ASSERT_FALSE(plain.empty());
  EXPECT_EQ(plain[0].size(), 2u * 4 * 12 * 20);  // output "sample"
  expect_same(plain, run(ctx, f, 1), "every block");
  expect_same(plain, run(ctx, f, 2), "every second block");
}

TEST_F(ModelsConv, UNetOddSizesAndConvProjections) {
  Fixture f;
  ASSERT_TRUE(make(ctx, f, "UNet2DConditionModel", R"({"block_out_channels": [32, 32, 64], "layers_per_block": 1,
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"], "attention_head_dim": 2,
    "cross_attention_dim": 24, "norm_num_groups": 8})"));
  flame_tensor_t sample = f.randn(ctx, "sample", {1, 4, 10, 13});
  f.ints(ctx, "timestep", {999});  // [1] broadcasts over the batch
  f.randn(ctx, "encoder_hidden_states", {1, 5, 24});
  flame_params_t out = nullptr;
  FLAME_ASSERT_OK(flame_model_forward(f.model, f.inputs, &out));
  flame_tensor_t y = nullptr;
  FLAME_ASSERT_OK(flame_params_find(out, "sample", &y));
  ASSERT_NE(y, nullptr);
  EXPECT_EQ(shape_of(y), shape_of(sample));
  flame_params_release(out);
}

TEST_F(ModelsConv, UNetInputErrorsNameTheInput) {
  Fixture f;
  ASSERT_TRUE(make(ctx, f, "UNet2DConditionModel", kUnetSdxl));
  f.randn(ctx, "sample", {2, 4, 8, 8});
  f.ints(ctx, "timestep", {1, 2, 3});  // neither [1] nor [B]
  f.randn(ctx, "encoder_hidden_states", {2, 7, 40});
  f.randn(ctx, "text_embeds", {2, 24});
  flame_params_t out = reinterpret_cast<flame_params_t>(&f);
  FLAME_EXPECT_STATUS(flame_model_forward(f.model, f.inputs, &out), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);
  EXPECT_NE(std::string(flame_last_error_message()).find("time_ids"), std::string::npos) << flame_last_error_message();
  f.randn(ctx, "time_ids", {2, 6});  // every input present: the timestep's shape is the error
  FLAME_EXPECT_STATUS(flame_model_forward(f.model, f.inputs, &out), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("timestep"), std::string::npos) << flame_last_error_message();

  Fixture g;
  ASSERT_TRUE(make(ctx, g, "UNet2DConditionModel", kUnetSdxl));
  g.randn(ctx, "sample", {2, 3, 8, 8});  // 3 channels, not 4
  g.ints(ctx, "timestep", {1, 2});
  g.randn(ctx, "encoder_hidden_states", {2, 7, 40});
  g.randn(ctx, "text_embeds", {2, 24});
  g.randn(ctx, "time_ids", {2, 6});
  FLAME_EXPECT_STATUS(flame_model_forward(g.model, g.inputs, &out), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("sample"), std::string::npos) << flame_last_error_message();
  g.randn(ctx, "class_labels", {2});
  FLAME_EXPECT_STATUS(flame_model_forward(g.model, g.inputs, &out), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("class_labels"), std::string::npos) << flame_last_error_message();
}

TEST_F(ModelsConv, UNetEncoderAttentionMask) {
  Fixture f;
  ASSERT_TRUE(make(ctx, f, "UNet2DConditionModel", kUnetSdxl));
  f.randn(ctx, "sample", {2, 4, 8, 8});
  f.ints(ctx, "timestep", {1, 2});
  f.randn(ctx, "encoder_hidden_states", {2, 7, 40});
  f.randn(ctx, "text_embeds", {2, 24});
  f.randn(ctx, "time_ids", {2, 6});
  flame_tensor_t mask = nullptr;
  const std::vector<int64_t> keep = {1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1};  // [2, 6]: one token short
  const int64_t shape[2] = {2, 6};
  FLAME_ASSERT_OK(flame_from_host(ctx, keep.data(), keep.size() * 8, shape, 2, FLAME_DTYPE_I64, &mask));
  f.owned.push_back(mask);
  FLAME_ASSERT_OK(flame_params_add(f.inputs, "encoder_attention_mask", mask));
  flame_params_t out = nullptr;
  FLAME_EXPECT_STATUS(flame_model_forward(f.model, f.inputs, &out), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("encoder_attention_mask"), std::string::npos)
      << flame_last_error_message();
  EXPECT_EQ(out, nullptr);
}

TEST_F(ModelsConv, AutoencoderEncodeDecodeShapesAndCheckpointedGradients) {
  for (bool flux : {false, true}) {
    SCOPED_TRACE(flux ? "16 channels" : "4 channels");
    Fixture f;
    const std::string cfg = std::string(R"({"block_out_channels": [16, 24, 32], "layers_per_block": 1,
      "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"],
      "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"], "norm_num_groups": 8, )") +
                            (flux ? R"("latent_channels": 16, "use_quant_conv": false, "use_post_quant_conv": false})"
                                  : R"("latent_channels": 4})");
    ASSERT_TRUE(make(ctx, f, "AutoencoderKL", cfg));
    const int64_t L = flux ? 16 : 4;
    f.randn(ctx, "sample", {2, 3, 20, 14});  // 20 -> 10 -> 5, 14 -> 7 -> 3 (diffusers' padding rounds down)
    f.randn(ctx, "latent_sample", {2, L, 3, 5});
    flame_params_t out = nullptr;
    FLAME_ASSERT_OK(flame_model_forward(f.model, f.inputs, &out));
    const std::vector<std::pair<const char*, std::vector<int64_t>>> want = {
        {"latent_mean", {2, L, 5, 3}}, {"latent_logvar", {2, L, 5, 3}}, {"sample", {2, 3, 12, 20}}};
    for (const auto& [name, shape] : want) {
      flame_tensor_t y = nullptr;
      FLAME_ASSERT_OK(flame_params_find(out, name, &y));
      ASSERT_NE(y, nullptr) << name;
      EXPECT_EQ(shape_of(y), shape) << name;
      if (std::string(name) == "latent_logvar") {
        for (float v : host(y)) EXPECT_TRUE(v >= -30.0f && v <= 20.0f);
      }
    }
    flame_params_release(out);
    const auto plain = run(ctx, f, 0);
    expect_same(plain, run(ctx, f, 1), "every block");
  }
}

TEST_F(ModelsConv, AutoencoderNeedsAnInput) {
  Fixture f;
  ASSERT_TRUE(make(ctx, f, "AutoencoderKL", R"({"block_out_channels": [32], "norm_num_groups": 8})"));
  flame_params_t out = nullptr;
  FLAME_EXPECT_STATUS(flame_model_forward(f.model, f.inputs, &out), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("latent_sample"), std::string::npos);
  f.randn(ctx, "latent_sample", {1, 3, 4, 4});  // 3 channels, not 4
  FLAME_EXPECT_STATUS(flame_model_forward(f.model, f.inputs, &out), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("latent_sample"), std::string::npos);
  EXPECT_EQ(out, nullptr);
}

// FluxTransformer2DModel and SD3Transformer2DModel through the model ABI, in tiny configurations:
// output shapes, gradients identical with and without per-block checkpointing (the conditioning
// passes through the checkpointed blocks as inputs, so temb's and the position ids' gradients must
// survive the recomputation), SD3's sin-cos table (a parameter that does not require grad) as
// initialised, and clear errors for bad configurations and inputs. Exactness against diffusers is
// tests/models/check_model_parity.py's job (cases flux_tiny, flux_schnell_tiny, sd3_tiny, sd35_tiny).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>
#include "host_ref.h"

using namespace href;

namespace {

class MMDiTModels : public GpuTest {};

struct ModelHolder {
  flame_model_t m = nullptr;
  ~ModelHolder() { flame_model_release(m); }
};
struct ParamsHolder {
  flame_params_t p = nullptr;
  ~ParamsHolder() { flame_params_release(p); }
};

const char* const kFluxConfig =
    R"({"num_layers": 2, "num_single_layers": 2, "attention_head_dim": 16, "num_attention_heads": 2,
        "in_channels": 16, "joint_attention_dim": 24, "pooled_projection_dim": 20, "guidance_embeds": true,
        "axes_dims_rope": [4, 6, 6]})";
const char* const kSD3Config =
    R"({"sample_size": 8, "patch_size": 2, "in_channels": 4, "num_layers": 3, "attention_head_dim": 8,
        "num_attention_heads": 4, "joint_attention_dim": 24, "caption_projection_dim": 32,
        "pooled_projection_dim": 20, "out_channels": 4, "pos_embed_max_size": 12,
        "dual_attention_layers": [0, 2], "qk_norm": "rms_norm"})";

T randn(flame_ctx_t ctx, const Shape& s) {
  T t;
  EXPECT_EQ(flame_randn(ctx, s.data(), static_cast<int32_t>(s.size()), FLAME_DTYPE_F32, t.out()), FLAME_OK);
  return t;
}

struct Inputs {
  std::vector<std::string> names;
  std::vector<T> tensors;
  void add(const std::string& n, T t) {
    names.push_back(n);
    tensors.push_back(std::move(t));
  }
  // Runs the model on every input but skip; returns what flame_model_forward (or building the list) returned.
  flame_status_t forward(flame_ctx_t ctx, flame_model_t m, flame_params_t* out, const std::string& skip = "") const {
    ParamsHolder in;
    flame_status_t st = flame_params_create(ctx, &in.p);
    if (st != FLAME_OK) return st;
    for (size_t i = 0; i < names.size(); ++i)
      if (names[i] != skip && (st = flame_params_add(in.p, names[i].c_str(), tensors[i].h)) != FLAME_OK) return st;
    return flame_model_forward(m, in.p, out);
  }
};

// Flux inputs for B = 2, a 4 x 3 latent grid (L = 12) and T = 5 text tokens; float ids requiring grad.
Inputs flux_inputs(flame_ctx_t ctx, int64_t img_rows = 12) {
  Inputs in;
  in.add("hidden_states", randn(ctx, {2, 12, 16}));
  in.add("encoder_hidden_states", randn(ctx, {2, 5, 24}));
  in.add("pooled_projections", randn(ctx, {2, 20}));
  in.add("timestep", upload(ctx, HT::from_values({2}, FLAME_DTYPE_F32, {0.25, 0.8})));
  in.add("guidance", upload(ctx, HT::from_values({2}, FLAME_DTYPE_F32, {3.5, 2.0})));
  HT ids({img_rows, 3}, FLAME_DTYPE_F32);
  for (int64_t r = 0; r < img_rows; ++r) {
    ids.at({r, 1}) = static_cast<double>(r / 3);
    ids.at({r, 2}) = static_cast<double>(r % 3);
  }
  in.add("img_ids", upload(ctx, ids));
  in.add("txt_ids", upload(ctx, HT({5, 3}, FLAME_DTYPE_F32)));
  for (const T& t : in.tensors) EXPECT_EQ(flame_tensor_set_requires_grad(t.h, 1), FLAME_OK);
  return in;
}

Inputs sd3_inputs(flame_ctx_t ctx, int64_t height = 8) {
  Inputs in;
  in.add("hidden_states", randn(ctx, {2, 4, height, 12}));
  in.add("encoder_hidden_states", randn(ctx, {2, 5, 24}));
  in.add("pooled_projections", randn(ctx, {2, 20}));
  in.add("timestep", upload(ctx, HT::from_values({2}, FLAME_DTYPE_F32, {500.0, 125.5})));
  for (const T& t : in.tensors) EXPECT_EQ(flame_tensor_set_requires_grad(t.h, 1), FLAME_OK);
  return in;
}

// Runs forward and backward of sum(sample * weights) and returns every parameter and input
// gradient (host copies, in order), clearing them afterwards.
std::vector<HT> gradients(flame_ctx_t ctx, flame_model_t m, const Inputs& in, flame_tensor_t weights) {
  ParamsHolder out, params;
  EXPECT_EQ(in.forward(ctx, m, &out.p), FLAME_OK) << flame_last_error_message();
  flame_tensor_t sample = nullptr;
  EXPECT_EQ(flame_params_find(out.p, "sample", &sample), FLAME_OK);
  if (!sample) return {};
  T prod, loss;
  EXPECT_EQ(flame_mul(sample, weights, prod.out()), FLAME_OK);
  EXPECT_EQ(flame_sum_all(prod.h, loss.out()), FLAME_OK);
  EXPECT_EQ(flame_backward(ctx, loss.h, nullptr, 0), FLAME_OK) << flame_last_error_message();
  EXPECT_EQ(flame_model_params(m, &params.p), FLAME_OK);
  int64_t n = 0;
  EXPECT_EQ(flame_params_count(params.p, &n), FLAME_OK);
  std::vector<flame_tensor_t> leaves;
  for (int64_t i = 0; i < n; ++i) {
    flame_tensor_t p = nullptr;
    EXPECT_EQ(flame_params_tensor(params.p, i, &p), FLAME_OK);
    leaves.push_back(p);
  }
  for (const T& t : in.tensors) leaves.push_back(t.h);
  std::vector<HT> grads;
  for (flame_tensor_t p : leaves) {
    T g;
    EXPECT_EQ(flame_tensor_grad(p, g.out()), FLAME_OK);
    grads.push_back(g.h ? download(g.h) : HT());
    EXPECT_EQ(flame_tensor_set_grad(p, nullptr), FLAME_OK);
  }
  return grads;
}

void expect_same_gradients(flame_ctx_t ctx, flame_model_t m, const Inputs& in, const Shape& sample_shape) {
  T weights = randn(ctx, sample_shape);
  const std::vector<HT> plain = gradients(ctx, m, in, weights.h);
  FLAME_ASSERT_OK(flame_model_set_checkpointing(m, 1));
  const std::vector<HT> every = gradients(ctx, m, in, weights.h);
  FLAME_ASSERT_OK(flame_model_set_checkpointing(m, 2));
  const std::vector<HT> second = gradients(ctx, m, in, weights.h);
  ASSERT_EQ(plain.size(), every.size());
  ASSERT_EQ(plain.size(), second.size());
  size_t compared = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    for (const std::vector<HT>* other : {&every, &second}) {
      const HT& a = plain[i];
      const HT& b = (*other)[i];
      // HT() (no data) stands for "no gradient" (SD3's sin-cos table does not require grad)
      ASSERT_EQ(a.data->empty(), b.data->empty()) << "gradient " << i << " exists in one run only";
      if (a.data->empty()) continue;
      ASSERT_EQ(a.shape, b.shape) << "gradient " << i;
      const std::vector<double> va = a.values(), vb = b.values();
      double scale = 0, diff = 0;
      for (size_t k = 0; k < va.size(); ++k) {
        scale = std::max(scale, std::fabs(va[k]));
        diff = std::max(diff, std::fabs(va[k] - vb[k]));
      }
      EXPECT_LE(diff, 1e-5 * scale + 1e-30) << "gradient " << i << " differs under checkpointing";
      compared += va.empty() ? 0 : 1;
    }
  }
  EXPECT_GT(compared, plain.size());  // most tensors have gradients
}

TEST_F(MMDiTModels, FluxShapesCheckpointingAndErrors) {
  ModelHolder m;
  FLAME_ASSERT_OK(flame_model_create(ctx, "FluxTransformer2DModel", kFluxConfig, nullptr, &m.m));
  const Inputs in = flux_inputs(ctx);
  {
    ParamsHolder out;
    FLAME_ASSERT_OK(in.forward(ctx, m.m, &out.p));
    flame_tensor_t sample = nullptr;
    FLAME_ASSERT_OK(flame_params_find(out.p, "sample", &sample));
    ASSERT_NE(sample, nullptr);
    EXPECT_EQ(shape_of(sample), (Shape{2, 12, 16}));
  }
  expect_same_gradients(ctx, m.m, in, {2, 12, 16});

  flame_params_t out = reinterpret_cast<flame_params_t>(1);
  FLAME_EXPECT_STATUS(in.forward(ctx, m.m, &out, "guidance"), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);
  EXPECT_NE(std::string(flame_last_error_message()).find("guidance"), std::string::npos);
  const Inputs short_ids = flux_inputs(ctx, 11);
  FLAME_EXPECT_STATUS(short_ids.forward(ctx, m.m, &out), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("img_ids"), std::string::npos);

  ModelHolder bad;
  FLAME_EXPECT_STATUS(flame_model_create(ctx, "FluxTransformer2DModel",
                                         R"({"attention_head_dim": 16, "axes_dims_rope": [4, 4, 6]})", nullptr, &bad.m),
                      FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(bad.m, nullptr);
  EXPECT_NE(std::string(flame_last_error_message()).find("axes_dims_rope"), std::string::npos);
}

TEST_F(MMDiTModels, SD3ShapesCheckpointingTableAndErrors) {
  ModelHolder m;
  FLAME_ASSERT_OK(flame_model_create(ctx, "SD3Transformer2DModel", kSD3Config, nullptr, &m.m));
  const Inputs in = sd3_inputs(ctx);
  {
    ParamsHolder out;
    FLAME_ASSERT_OK(in.forward(ctx, m.m, &out.p));
    flame_tensor_t sample = nullptr;
    FLAME_ASSERT_OK(flame_params_find(out.p, "sample", &sample));
    ASSERT_NE(sample, nullptr);
    EXPECT_EQ(shape_of(sample), (Shape{2, 4, 8, 12}));
  }
  expect_same_gradients(ctx, m.m, in, {2, 4, 8, 12});

  // The 12 x 12 sin-cos table: token (0, 0) is [sin 0, cos 0] per half (zeros then ones); token
  // (i, j) encodes j / (12 / 4) with omega_0 = 1 in its first sin entry.
  ParamsHolder params;
  FLAME_ASSERT_OK(flame_model_params(m.m, &params.p));
  flame_tensor_t table = nullptr;
  FLAME_ASSERT_OK(flame_params_find(params.p, "pos_embed.pos_embed", &table));
  ASSERT_NE(table, nullptr);
  int32_t rg = 1;
  FLAME_ASSERT_OK(flame_tensor_requires_grad(table, &rg));
  EXPECT_EQ(rg, 0);
  const HT t = download(table);
  ASSERT_EQ(t.shape, (Shape{1, 144, 32}));
  for (int64_t k = 0; k < 8; ++k) {
    EXPECT_EQ(t.at({0, 0, k}), 0.0);
    EXPECT_EQ(t.at({0, 0, 8 + k}), 1.0);
  }
  EXPECT_NEAR(t.at({0, 12 * 5 + 7, 0}), std::sin(7.0 / 3.0), 1e-6);   // w coordinate of token (5, 7)
  EXPECT_NEAR(t.at({0, 12 * 5 + 7, 16}), std::sin(5.0 / 3.0), 1e-6);  // h coordinate

  flame_params_t out = reinterpret_cast<flame_params_t>(1);
  const Inputs too_tall = sd3_inputs(ctx, 26);  // 13 patches > pos_embed_max_size 12
  FLAME_EXPECT_STATUS(too_tall.forward(ctx, m.m, &out), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);
  EXPECT_NE(std::string(flame_last_error_message()).find("pos_embed_max_size"), std::string::npos);

  ModelHolder bad;
  FLAME_EXPECT_STATUS(flame_model_create(ctx, "SD3Transformer2DModel", R"({"qk_norm": "l2"})", nullptr, &bad.m),
                      FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(bad.m, nullptr);
  FLAME_EXPECT_STATUS(flame_model_create(ctx, "SD3Transformer2DModel", R"({"caption_projection_dim": 100})", nullptr, &bad.m),
                      FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("caption_projection_dim"), std::string::npos);
}

}  // namespace

// flame_model_load's planning step without a GPU (src/models/model_loader.h, plan_model_load):
// single files in every family's original layout (written from the key tables' stored-tensor lists
// of the tiny configs), bundled under their component prefixes, are recognised, configured and
// mapped onto every diffusers / transformers parameter; options override detection; bad requests
// fail with the status flame.h promises.
#include <gtest/gtest.h>
#include <string>
#include <vector>
#include "core/error.h"
#include "model_configs.h"
#include "models/clip_keys.h"
#include "models/flux_keys.h"
#include "models/model_loader.h"
#include "models/sd3_keys.h"
#include "models/t5_keys.h"
#include "models/unet_keys.h"
#include "models/vae_keys.h"
#include "synthetic_checkpoint.h"

using namespace flame;
using namespace flame::models;

namespace {

// Tensors (F16, so the planned dtype is bf16) of keys under prefix.
std::vector<synth::Tensor> tensors_of(const std::vector<KeyShape>& keys, const std::string& prefix) {
  std::vector<synth::Tensor> out;
  for (const KeyShape& k : keys) out.push_back({prefix + k.name, "F16", k.shape, {}});
  return out;
}

std::vector<KeyShape> unet_original(const UNetConfig& c) {
  std::vector<KeyShape> keys;
  for (const UNetParameter& p : unet_parameters(c)) keys.push_back({p.original_name, p.shape});
  return keys;
}

flame_status_t status_of(const std::string& path, const nlohmann::json& options) {
  try {
    plan_model_load(path, options);
    return FLAME_OK;
  } catch (const Error& e) {
    return e.status();
  }
}

TEST(ModelLoadPlan, FluxOriginalSingleFileWithComfyPrefix) {
  synth::TempDir dir;
  const FluxConfig c = models::testing::tiny_flux_config();
  const std::string path = dir.sub("flux.safetensors");
  synth::write_safetensors(path, tensors_of(flux_original_tensors(c), "model.diffusion_model."));
  const ModelLoadPlan plan = plan_model_load(path, nullptr);
  EXPECT_EQ(plan.architecture, "FluxTransformer2DModel");
  EXPECT_EQ(plan.config["num_layers"], c.num_layers);
  EXPECT_EQ(plan.config["num_single_layers"], c.num_single_layers);
  EXPECT_EQ(plan.options.param_dtype, FLAME_DTYPE_BF16);  // F16 files default to bf16
  EXPECT_EQ(plan.sources.size(), flux_diffusers_tensors(c).size());
  // to_k of double block 0 is the second third of the fused img_attn.qkv rows.
  const ParamSource& k = plan.sources.at("transformer_blocks.0.attn.to_k.weight");
  EXPECT_EQ(k.key, "double_blocks.0.img_attn.qkv.weight");
  EXPECT_EQ(k.row_begin, c.inner_dim());
  EXPECT_EQ(k.rows, c.inner_dim());
  EXPECT_TRUE(plan.sources.at("norm_out.linear.weight").swap_halves);
}

TEST(ModelLoadPlan, SdxlStyleBundleByComponent) {
  synth::TempDir dir;
  const UNetConfig u = models::testing::tiny_unet_config();
  const VAEConfig v = models::testing::tiny_vae_config();
  const ClipTextConfig g = models::testing::tiny_clip_config();  // OpenCLIP names, with projection
  std::vector<synth::Tensor> all = tensors_of(unet_original(u), "model.diffusion_model.");
  for (auto& t : tensors_of(vae_parameter_table(v).original, "first_stage_model.")) all.push_back(t);
  for (auto& t : tensors_of(clip_parameter_table(g).original, "conditioner.embedders.1.model.")) all.push_back(t);
  const std::string path = dir.sub("sdxl.safetensors");
  synth::write_safetensors(path, all);

  const ModelLoadPlan unet = plan_model_load(path, nullptr);  // the denoiser by default
  EXPECT_EQ(unet.architecture, "UNet2DConditionModel");
  EXPECT_EQ(unet.sources.size(), unet_parameters(u).size());
  EXPECT_EQ(unet.config["cross_attention_dim"], u.cross_attention_dim);

  const ModelLoadPlan vae = plan_model_load(path, {{"component", "vae"}});
  EXPECT_EQ(vae.architecture, "AutoencoderKL");
  EXPECT_EQ(vae.config["latent_channels"], v.latent_channels);
  EXPECT_EQ(vae.sources.size(), vae_parameter_table(v).parameters.size());

  const ModelLoadPlan clip = plan_model_load(path, {{"component", "text_encoder_2"}, {"dtype", "f32"}});
  EXPECT_EQ(clip.architecture, "CLIPTextModelWithProjection");
  EXPECT_EQ(clip.options.param_dtype, FLAME_DTYPE_F32);
  EXPECT_TRUE(clip.sources.at("text_projection.weight").transposed);
  EXPECT_EQ(clip.config["eos_token_id"], 2);

  // A component the file lacks, and one that does not exist at all.
  EXPECT_EQ(status_of(path, {{"component", "text_encoder_3"}}), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(status_of(path, {{"component", "decoder"}}), FLAME_ERROR_INVALID_ARGUMENT);
}

TEST(ModelLoadPlan, Sd3AndT5SingleFiles) {
  synth::TempDir dir;
  const SD3Config s = models::testing::tiny_sd3_config();
  const std::string sd3 = dir.sub("sd3.safetensors");
  synth::write_safetensors(sd3, tensors_of(sd3_parameter_table(s).original, "model.diffusion_model."));
  const ModelLoadPlan a = plan_model_load(sd3, nullptr);
  EXPECT_EQ(a.architecture, "SD3Transformer2DModel");
  EXPECT_EQ(a.config["num_layers"], s.num_layers);
  EXPECT_EQ(a.sources.size(), sd3_parameter_table(s).parameters.size());

  const T5Config t = models::testing::tiny_t5_config();
  const std::string t5 = dir.sub("t5.safetensors");
  synth::write_safetensors(t5, tensors_of(t5_parameter_table(t).original, ""));
  const ModelLoadPlan b = plan_model_load(t5, nullptr);
  EXPECT_EQ(b.architecture, "T5EncoderModel");
  EXPECT_EQ(b.config["d_model"], t.d_model);
  EXPECT_EQ(b.config["feed_forward_proj"], t.feed_forward_proj);
}

TEST(ModelLoadPlan, OptionsOverrideAndErrors) {
  synth::TempDir dir;
  const std::string path = dir.sub("plain.safetensors");
  synth::write_safetensors(path, {{"w", "F32", {2, 3}, {}}});
  // Unknown names: the caller must say what the file is.
  EXPECT_EQ(status_of(path, nullptr), FLAME_ERROR_INVALID_FORMAT);
  // Named: no detection; the file is taken to hold the architecture's own names.
  const ModelLoadPlan p = plan_model_load(path, {{"architecture", "CLIPTextModel"}, {"config", {{"hidden_size", 8}}}});
  EXPECT_EQ(p.architecture, "CLIPTextModel");
  EXPECT_EQ(p.config["hidden_size"], 8);
  EXPECT_TRUE(p.sources.empty());
  EXPECT_EQ(p.options.param_dtype, FLAME_DTYPE_F32);  // an F32 file stays f32
  EXPECT_EQ(status_of(path, {{"dtype", "f12"}}), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(status_of(path, {{"colour", "red"}}), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(status_of(path, {{"config", 3}}), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(status_of(dir.sub("missing.safetensors"), nullptr), FLAME_ERROR_IO);
}

}  // namespace

// Architecture detection over every family (white-box, src/models/architecture.*): class names both
// ways, the model each kind of file holds (Flux, SD3, UNet, VAE, CLIP, T5 alone and SDXL / SD3.5 single
// files bundling several), unknown keys as a clear error; and the integrity of every mapped key table
// (src/models/mapped_keys.*): each stored tensor's rows covered exactly once by parameters of
// consistent shapes, names unique.
#include <gtest/gtest.h>
#include <map>
#include <set>
#include <string>
#include <vector>
#include "core/error.h"
#include "model_configs.h"
#include "models/architecture.h"

using namespace flame;
using namespace flame::models;
using namespace flame::models::testing;

namespace {

std::vector<KeyShape> with_prefix(const std::vector<KeyShape>& keys, const std::string& prefix) {
  std::vector<KeyShape> out;
  for (const KeyShape& k : keys) out.push_back({prefix + k.name, k.shape});
  return out;
}

void append(std::vector<KeyShape>* to, const std::vector<KeyShape>& from) { to->insert(to->end(), from.begin(), from.end()); }

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Every stored tensor's rows are covered exactly once (swapped pieces cover the whole tensor), each
// parameter has the stored piece's element count, transposed pieces are the 2-D transpose.
void expect_consistent(const MappedTable& t) {
  std::map<std::string, std::vector<int64_t>> stored;
  for (const KeyShape& k : t.original) ASSERT_TRUE(stored.emplace(k.name, k.shape).second) << k.name;
  std::map<std::string, std::vector<int>> covered;
  std::set<std::string> names;
  for (const MappedParameter& p : t.parameters) {
    SCOPED_TRACE(p.diffusers_name);
    ASSERT_TRUE(names.insert(p.diffusers_name).second);
    ASSERT_TRUE(stored.count(p.original_name));
    const std::vector<int64_t>& s = stored[p.original_name];
    std::vector<int>& rows = covered[p.original_name];
    rows.resize(s.at(0), 0);
    ASSERT_GE(p.row_begin, 0);
    ASSERT_LE(p.row_begin + p.rows, s[0]);
    for (int64_t r = p.row_begin; r < p.row_begin + p.rows; ++r) ++rows[r];
    std::vector<int64_t> piece = s;
    piece[0] = p.rows;
    if (p.transposed) {
      EXPECT_EQ(p.shape, (std::vector<int64_t>{s.at(1), s.at(0)}));
    } else {
      EXPECT_EQ(numel(p.shape), numel(piece));
      EXPECT_EQ(p.shape.at(0), p.rows);
    }
    if (p.swap_halves) EXPECT_EQ(p.rows % 2, 0);
  }
  for (const auto& [name, rows] : covered)
    for (size_t r = 0; r < rows.size(); ++r) ASSERT_EQ(rows[r], 1) << name << " row " << r;
  EXPECT_EQ(covered.size(), stored.size());
}

}  // namespace

TEST(Architecture, ClassNamesBothWays) {
  const Architecture all[] = {Architecture::FluxTransformer, Architecture::UNet2DCondition,
                              Architecture::SD3Transformer,  Architecture::AutoencoderKL,
                              Architecture::CLIPText,        Architecture::CLIPTextWithProjection,
                              Architecture::T5Encoder};
  std::set<std::string> seen;
  for (Architecture a : all) {
    const std::string name = architecture_class_name(a);
    EXPECT_TRUE(seen.insert(name).second) << name;
    EXPECT_EQ(architecture_from_class_name(name), a) << name;
  }
  EXPECT_STREQ(architecture_class_name(Architecture::SD3Transformer), "SD3Transformer2DModel");
  EXPECT_STREQ(architecture_class_name(Architecture::CLIPTextWithProjection), "CLIPTextModelWithProjection");
  EXPECT_STREQ(architecture_library(Architecture::T5Encoder), "transformers");
  EXPECT_STREQ(architecture_library(Architecture::AutoencoderKL), "diffusers");
  EXPECT_FALSE(architecture_from_class_name("PixArtTransformer2DModel").has_value());
  EXPECT_THROW(architecture_class_name(static_cast<Architecture>(99)), Error);
}

TEST(Architecture, DetectsEachFamilyAlone) {
  std::vector<KeyShape> unet;
  for (const UNetParameter& p : unet_parameters(tiny_unet_config())) unet.push_back({p.diffusers_name, p.shape});
  ClipTextConfig clip_l = tiny_clip_config();
  clip_l.with_projection = false;
  const struct {
    std::vector<KeyShape> keys;
    Architecture want;
  } cases[] = {
      {flux_original_tensors(tiny_flux_config()), Architecture::FluxTransformer},
      {with_prefix(flux_diffusers_tensors(tiny_flux_config()), ""), Architecture::FluxTransformer},
      {sd3_parameter_table(tiny_sd3_config()).original, Architecture::SD3Transformer},
      {sd3_parameter_table(tiny_sd3_config()).diffusers_tensors(), Architecture::SD3Transformer},
      {unet, Architecture::UNet2DCondition},
      {vae_parameter_table(tiny_vae_config()).original, Architecture::AutoencoderKL},
      {vae_parameter_table(tiny_vae_config()).diffusers_tensors(), Architecture::AutoencoderKL},
      {clip_parameter_table(clip_l).diffusers_tensors(), Architecture::CLIPText},
      {clip_parameter_table(tiny_clip_config()).diffusers_tensors(), Architecture::CLIPTextWithProjection},
      {with_prefix(clip_parameter_table(tiny_clip_config()).original, "cond_stage_model.model."),
       Architecture::CLIPTextWithProjection},
      {t5_parameter_table(tiny_t5_config()).diffusers_tensors(), Architecture::T5Encoder},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(architecture_class_name(c.want) + std::string(" from ") + c.keys.front().name);
    EXPECT_EQ(detect_architecture(c.keys), c.want);
    const std::vector<ArchitectureComponent> found = detect_components(c.keys);
    ASSERT_EQ(found.size(), 1u);
    EXPECT_EQ(found[0].architecture, c.want);
  }
}

TEST(Architecture, SingleFilesBundlingSeveralModels) {
  // SDXL: UNet (SGM names), CLIP-L (transformers names), bigG (OpenCLIP names), VAE (LDM names).
  std::vector<KeyShape> sdxl;
  for (const UNetParameter& p : unet_parameters(tiny_unet_config()))
    sdxl.push_back({"model.diffusion_model." + p.original_name, p.shape});
  ClipTextConfig clip_l = tiny_clip_config();
  clip_l.with_projection = false;
  append(&sdxl, with_prefix(clip_parameter_table(clip_l).diffusers_tensors(), "conditioner.embedders.0.transformer."));
  append(&sdxl, with_prefix(clip_parameter_table(tiny_clip_config()).original, "conditioner.embedders.1.model."));
  append(&sdxl, with_prefix(vae_parameter_table(tiny_vae_config()).original, "first_stage_model."));
  EXPECT_EQ(detect_architecture(sdxl), Architecture::UNet2DCondition);
  std::vector<ArchitectureComponent> found = detect_components(sdxl);
  ASSERT_EQ(found.size(), 4u);
  EXPECT_EQ(found[0].prefix, "model.diffusion_model.");
  EXPECT_EQ(found[1].architecture, Architecture::AutoencoderKL);
  EXPECT_EQ(found[1].prefix, "first_stage_model.");
  EXPECT_EQ(found[2].architecture, Architecture::CLIPText);
  EXPECT_EQ(found[2].prefix, "conditioner.embedders.0.transformer.");
  EXPECT_EQ(found[3].architecture, Architecture::CLIPTextWithProjection);
  EXPECT_EQ(found[3].prefix, "conditioner.embedders.1.model.");
  // SD3.5: MMDiT, both CLIPs and T5 in transformers names, the VAE.
  std::vector<KeyShape> sd35 = with_prefix(sd3_parameter_table(tiny_sd3_config()).original, "model.diffusion_model.");
  append(&sd35, with_prefix(clip_parameter_table(tiny_clip_config()).diffusers_tensors(), "text_encoders.clip_l.transformer."));
  append(&sd35, with_prefix(clip_parameter_table(tiny_clip_config()).diffusers_tensors(), "text_encoders.clip_g.transformer."));
  append(&sd35, with_prefix(t5_parameter_table(tiny_t5_config()).diffusers_tensors(), "text_encoders.t5xxl.transformer."));
  append(&sd35, with_prefix(vae_parameter_table(flux_vae_config()).original, "first_stage_model."));
  EXPECT_EQ(detect_architecture(sd35), Architecture::SD3Transformer);
  found = detect_components(sd35);
  ASSERT_EQ(found.size(), 5u);
  EXPECT_EQ(found[4].architecture, Architecture::T5Encoder);
  EXPECT_EQ(found[4].prefix, "text_encoders.t5xxl.transformer.");
  // A ComfyUI Flux file.
  EXPECT_EQ(detect_architecture(with_prefix(flux_original_tensors(tiny_flux_config()), "model.diffusion_model.")),
            Architecture::FluxTransformer);
}

TEST(Architecture, UnknownOrBrokenKeysAreErrors) {
  try {
    detect_architecture({{"visual.conv1.weight", {768, 3, 14, 14}}, {"logit_scale", {}}});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), FLAME_ERROR_INVALID_FORMAT);
    EXPECT_NE(std::string(e.what()).find("visual.conv1.weight"), std::string::npos) << e.what();
  }
  EXPECT_THROW(detect_architecture({}), Error);
  EXPECT_TRUE(detect_components({{"visual.conv1.weight", {768, 3, 14, 14}}}).empty());
  // Recognised but incomplete: the family's own error, naming the key.
  std::vector<KeyShape> broken = sd3_parameter_table(tiny_sd3_config()).original;
  broken.pop_back();
  try {
    detect_architecture(broken);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), FLAME_ERROR_INVALID_FORMAT);
    EXPECT_NE(std::string(e.what()).find("final_layer"), std::string::npos) << e.what();
  }
}

TEST(MappedKeys, EveryTableCoversItsStoredTensorsExactlyOnce) {
  ClipTextConfig clip_l;
  for (const MappedTable& t :
       {sd3_parameter_table(SD3Config{}), sd3_parameter_table(sd3_medium_config()), sd3_parameter_table(tiny_sd3_config()),
        vae_parameter_table(VAEConfig{}), vae_parameter_table(flux_vae_config()), vae_parameter_table(tiny_vae_config()),
        clip_parameter_table(clip_l), clip_parameter_table(clip_bigg_config()), clip_parameter_table(tiny_clip_config()),
        t5_parameter_table(T5Config{}), t5_parameter_table(tiny_t5_config())}) {
    SCOPED_TRACE(t.parameters.front().diffusers_name + " ... " + t.parameters.back().diffusers_name);
    expect_consistent(t);
  }
}

// LoRA file formats without tensors (white-box, src/models/lora_format.*): save plans of the default
// targets of diffusers' and kohya's trainers for Flux-dev, SDXL, SD 1.5, SD3.5-medium, CLIP-L, bigG and
// T5-XXL in both formats, every key checked against ComfyUI's key rules; load plans of the saved keys
// give back the same modules and scales; load plans of key lists in the shapes users share; errors
// that name the key.
//
// ComfyUI's rules, from comfy/lora.py (model_lora_keys_unet / model_lora_keys_clip, load_lora) and
// comfy/utils.py (flux_to_diffusers, unet_to_diffusers, mmdit_to_diffusers):
//  - a LoRA is "<name>.lora_up.weight" + "<name>.lora_down.weight" (+ optional "<name>.alpha", scale 1
//    when missing), or "<name>.lora_B.weight" + "<name>.lora_A.weight"; up [out, r], down [r, in].
//  - denoiser names: "lora_unet_" + the original weight's name under "diffusion_model." without
//    ".weight", '.' -> '_' (for a UNet also the diffusers names, via unet_to_diffusers); diffusers names
//    "transformer.<diffusers module>" (Flux, SD3: flux_to_diffusers / mmdit_to_diffusers), and
//    OneTrainer's "lora_transformer_<diffusers module, '_' for '.'>", which for a member of a fused
//    original (Flux's qkv, linear1; SD3's qkv) patches the member's rows only. For a UNet
//    ComfyUI maps only the old attention-processor names ("unet.<...>.processor.to_q"), not peft's
//    "unet.<diffusers module>": a peft SDXL / SD 1.5 file is for diffusers, kohya is for ComfyUI. The
//    peft keys of a UNet and of T5 are checked against the model's diffusers modules instead.
//  - CLIP: "lora_te1_text_model_encoder_layers_<b>_<c>" (CLIP-L), "lora_te2_..." (bigG with CLIP-L
//    present), c in LORA_CLIP_MAP (self_attn_{q,k,v,out}_proj, mlp_fc1, mlp_fc2); diffusers
//    "text_encoder.text_model.encoder.layers.<b>.<c dotted>", "text_encoder_2...."
//  - T5: "lora_te3_" + the T5 weight's name without ".weight", '.' -> '_'.
#include <gtest/gtest.h>
#include <cmath>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>
#include "core/error.h"
#include "lora_model_configs.h"
#include "models/clip_keys.h"
#include "models/flux_keys.h"
#include "models/lora_format.h"
#include "models/mapped_keys.h"
#include "models/sd3_keys.h"
#include "models/t5_keys.h"
#include "models/unet_keys.h"

using namespace flame;
using namespace flame::models;
using flame::models::testing::LoraTestModel;
using flame::models::testing::lora_test_model;
using flame::models::testing::lora_test_models;

namespace {

std::string underscored(std::string s) {
  for (char& c : s)
    if (c == '.') c = '_';
  return s;
}

std::string strip(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0 ? s.substr(0, s.size() - tail.size())
                                                                                                : std::string();
}

// Weight shapes ComfyUI patches, by the LoRA name it maps to them (the rules above).
std::map<std::string, std::vector<int64_t>> comfy_lora_names(const std::string& model) {
  std::map<std::string, std::vector<int64_t>> names;
  auto add_original = [&](const std::string& weight, const std::vector<int64_t>& shape) {
    const std::string m = strip(weight, ".weight");
    if (!m.empty() && shape.size() == 2) names["lora_unet_" + underscored(m)] = shape;
  };
  auto add_diffusers = [&](const std::string& head, const std::string& weight, const std::vector<int64_t>& shape) {
    const std::string m = strip(weight, ".weight");
    if (!m.empty() && shape.size() == 2) names[head + m] = shape;
  };
  auto add_onetrainer = [&](const std::string& weight, const std::vector<int64_t>& shape) {
    const std::string m = strip(weight, ".weight");
    if (!m.empty() && shape.size() == 2) names["lora_transformer_" + underscored(m)] = shape;
  };
  if (model == "flux") {
    const FluxConfig c;
    for (const KeyShape& k : flux_original_tensors(c)) add_original(k.name, k.shape);
    for (const KeyShape& k : flux_diffusers_tensors(c)) {
      add_diffusers("transformer.", k.name, k.shape);
      add_onetrainer(k.name, k.shape);
    }
  } else if (model == "sdxl" || model == "sd15") {
    const UNetConfig c = model == "sdxl" ? UNetConfig() : sd15_unet_config();
    for (const UNetParameter& p : unet_parameters(c)) {
      add_original(p.original_name, p.shape);
      add_original(p.diffusers_name, p.shape);  // unet_to_diffusers: lora_unet_<diffusers name>
      add_diffusers("unet.", p.diffusers_name, p.shape);  // not ComfyUI: diffusers' peft names (see above)
    }
  } else if (model == "sd3") {
    const MappedTable t = sd3_parameter_table(SD3Config());
    for (const KeyShape& k : t.original) add_original(k.name, k.shape);
    for (const KeyShape& k : t.diffusers_tensors()) {
      add_diffusers("transformer.", k.name, k.shape);
      add_onetrainer(k.name, k.shape);
    }
  } else if (model == "clip_l" || model == "clip_g") {
    const ClipTextConfig c = model == "clip_l" ? ClipTextConfig() : clip_bigg_config();
    const std::string te = model == "clip_l" ? "lora_te1_" : "lora_te2_";
    const std::string dte = model == "clip_l" ? "text_encoder." : "text_encoder_2.";
    const std::map<std::string, std::vector<int64_t>> clip_map = {
        {"mlp.fc1", {c.intermediate_size, c.hidden_size}}, {"mlp.fc2", {c.hidden_size, c.intermediate_size}},
        {"self_attn.k_proj", {c.hidden_size, c.hidden_size}}, {"self_attn.q_proj", {c.hidden_size, c.hidden_size}},
        {"self_attn.v_proj", {c.hidden_size, c.hidden_size}}, {"self_attn.out_proj", {c.hidden_size, c.hidden_size}}};
    for (int64_t b = 0; b < c.num_hidden_layers; ++b)
      for (const auto& [sub, shape] : clip_map) {
        names[te + "text_model_encoder_layers_" + std::to_string(b) + "_" + underscored(sub)] = shape;
        names[dte + "text_model.encoder.layers." + std::to_string(b) + "." + sub] = shape;
      }
  } else if (model == "t5") {
    for (const KeyShape& k : t5_parameter_table(T5Config()).diffusers_tensors()) {
      const std::string m = strip(k.name, ".weight");
      if (!m.empty() && k.shape.size() == 2) {
        names["lora_te3_" + underscored(m)] = k.shape;
        names["text_encoder_3." + m] = k.shape;  // not ComfyUI: diffusers' peft names (SD3 pipeline)
      }
    }
  }
  return names;
}

// Every key of a plan follows ComfyUI's rules: suffix, a known name, shapes of up x down equal to
// the weight it patches, and an alpha for every kohya pair.
void expect_comfy_keys(const LoraSavePlan& plan, const std::string& model) {
  const auto names = comfy_lora_names(model);
  const bool comfy_reads = plan.format == LoraFileFormat::Kohya || !(model == "sdxl" || model == "sd15" || model == "t5");
  if (comfy_reads)
    for (const LoraStoredTensor& t : plan.tensors)
      EXPECT_TRUE(t.key.rfind("unet.", 0) != 0 && t.key.rfind("text_encoder_3.", 0) != 0) << t.key << ": a name ComfyUI does not map";
  std::map<std::string, std::map<std::string, const LoraStoredTensor*>> by_name;
  for (const LoraStoredTensor& t : plan.tensors) {
    std::string name, role;
    for (const char* s : {".lora_up.weight", ".lora_down.weight", ".alpha", ".lora_A.weight", ".lora_B.weight", ".dora_scale",
                          ".lora_magnitude_vector"})
      if (!(name = strip(t.key, s)).empty()) {
        role = s;
        break;
      }
    ASSERT_FALSE(name.empty()) << t.key << ": no suffix ComfyUI reads";
    ASSERT_TRUE(names.count(name)) << t.key << ": ComfyUI maps no weight to " << name;
    by_name[name][role] = &t;
  }
  for (const auto& [name, roles] : by_name) {
    const bool kohya = roles.count(".lora_up.weight") > 0;
    const LoraStoredTensor* up = roles.count(kohya ? ".lora_up.weight" : ".lora_B.weight") ? roles.at(kohya ? ".lora_up.weight" : ".lora_B.weight") : nullptr;
    const LoraStoredTensor* down = roles.count(kohya ? ".lora_down.weight" : ".lora_A.weight") ? roles.at(kohya ? ".lora_down.weight" : ".lora_A.weight") : nullptr;
    ASSERT_TRUE(up && down) << name << ": up or down missing";
    const std::vector<int64_t>& w = names.at(name);
    EXPECT_EQ(up->shape.at(0), w[0]) << name;
    EXPECT_EQ(down->shape.at(1), w[1]) << name;
    EXPECT_EQ(up->shape.at(1), down->shape.at(0)) << name;
    if (roles.count(".dora_scale")) {  // LyCORIS' wd_on_out layout, the one ComfyUI's weight_decompose reads per row
      EXPECT_TRUE(kohya) << name;
      EXPECT_EQ(roles.at(".dora_scale")->shape, (std::vector<int64_t>{w[0], 1})) << name;
    }
    if (roles.count(".lora_magnitude_vector")) {
      EXPECT_FALSE(kohya) << name;
      EXPECT_EQ(roles.at(".lora_magnitude_vector")->shape, (std::vector<int64_t>{w[0]})) << name;
    }
    if (kohya) {
      ASSERT_TRUE(roles.count(".alpha")) << name << ": no alpha";
      EXPECT_TRUE(roles.at(".alpha")->shape.empty()) << name;
      EXPECT_GT(roles.at(".alpha")->alpha, 0) << name;
    }
    EXPECT_EQ(plan.format == LoraFileFormat::Kohya, kohya) << name;
  }
}

std::vector<KeyShape> keys_of(const LoraSavePlan& plan) {
  std::vector<KeyShape> keys;
  for (const LoraStoredTensor& t : plan.tensors) keys.push_back({t.key, t.shape});
  return keys;
}

// Modules with ranks 4, 8, 12 and alphas 4, 4, 16 in turn (mixed scales inside fused groups), every
// other one with DoRA (fused groups with and without magnitudes).
std::vector<LoraModuleShape> modules_for(const LoraTestModel& m, LoraTargetConvention conv, bool mixed) {
  std::vector<LoraModuleShape> out;
  const auto selected = select_lora_modules(lora_candidate_modules(m.class_name, m.config),
                                            default_lora_targets(m.class_name, m.config, conv));
  for (size_t i = 0; i < selected.size(); ++i) {
    const int64_t r = mixed ? 4 * static_cast<int64_t>(1 + i % 3) : 16;
    const double a = mixed ? (i % 3 == 2 ? 16.0 : 4.0) : 8.0;
    out.push_back({selected[i].module, r, selected[i].in_features, selected[i].out_features, a, mixed && i % 2 == 0});
  }
  return out;
}

// The load plan of a save plan's keys gives every saved module with the same delta W: its rows of the
// stored up, the stored down, and a scale that, times the piece's scale, is the module's alpha / r.
void expect_round_trip(const LoraTestModel& m, const LoraSavePlan& saved, const std::vector<LoraModuleShape>& modules) {
  const LoraLoadPlan loaded = plan_lora_load(m.class_name, m.config, m.component, keys_of(saved), saved.metadata);
  EXPECT_EQ(loaded.format, saved.format);
  EXPECT_TRUE(loaded.other_component_keys.empty());
  std::map<std::string, const LoraModuleSource*> got;
  for (const LoraModuleSource& s : loaded.modules) got[s.module] = &s;
  std::map<std::string, const LoraStoredTensor*> stored;
  for (const LoraStoredTensor& t : saved.tensors) stored[t.key] = &t;
  for (const LoraModuleShape& mod : modules) {
    ASSERT_TRUE(got.count(mod.module)) << mod.module << " not loaded back";
    const LoraModuleSource& s = *got.at(mod.module);
    EXPECT_EQ(s.in_features, mod.in_features);
    EXPECT_EQ(s.out_features, mod.out_features);
    const LoraStoredTensor& up = *stored.at(s.up.key);
    const LoraStoredTensor& down = *stored.at(s.down.key);
    EXPECT_EQ(down.shape[0], s.rank);
    double alpha = s.alpha;
    if (!s.alpha_key.empty()) alpha = stored.at(s.alpha_key)->alpha;
    const LoraTensorPiece* piece = nullptr;
    for (const LoraTensorPiece& p : up.pieces)
      if (p.module == mod.module) piece = &p;
    ASSERT_NE(piece, nullptr) << mod.module;
    EXPECT_EQ(piece->row_begin, s.up.row_begin) << mod.module;
    EXPECT_EQ(piece->rows, s.up.rows) << mod.module;
    EXPECT_EQ(piece->swap_halves, s.up.swap_halves) << mod.module;
    EXPECT_NEAR(alpha / s.rank * piece->scale, mod.alpha / mod.rank, 1e-12) << mod.module;
    // DoRA: the module's magnitude comes from its rows; a module of a fused group whose stored scale
    // holds its adapted row norms (no DoRA of its own) also loads them (factor 1).
    if (mod.dora || !s.magnitude.key.empty()) {
      ASSERT_FALSE(s.magnitude.key.empty()) << mod.module << ": magnitude lost";
      const LoraStoredTensor& mag = *stored.at(s.magnitude.key);
      EXPECT_EQ(mag.kind, LoraTensorKind::Magnitude);
      const LoraTensorPiece* mp = nullptr;
      for (const LoraTensorPiece& p : mag.pieces)
        if (p.module == mod.module) mp = &p;
      ASSERT_NE(mp, nullptr) << mod.module;
      EXPECT_EQ(mp->adapted_row_norms, !mod.dora) << mod.module;
      EXPECT_EQ(mp->row_begin, s.magnitude.row_begin) << mod.module;
      EXPECT_EQ(mp->rows, s.magnitude.rows) << mod.module;
      EXPECT_EQ(mp->swap_halves, s.magnitude.swap_halves) << mod.module;
      EXPECT_EQ(s.magnitude.row_begin, s.up.row_begin) << mod.module;
      EXPECT_EQ(s.magnitude.rows, s.up.rows) << mod.module;
    }
    if (saved.format == LoraFileFormat::Peft) {
      EXPECT_EQ(s.rank, mod.rank) << mod.module;
      EXPECT_NEAR(alpha, mod.alpha, 1e-12) << mod.module;
    }
  }
}

const char* format_name(LoraFileFormat f) { return f == LoraFileFormat::Kohya ? "kohya" : "peft"; }

template <class F>
std::string error_of(F&& f, flame_status_t want) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), want) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(LoraFormat, DefaultTargetsSaveToComfyKeysAndLoadBack) {
  for (const LoraTestModel& m : lora_test_models())
    for (LoraTargetConvention conv : {LoraTargetConvention::DiffusersScripts, LoraTargetConvention::Kohya})
      for (bool mixed : {false, true})
        for (LoraFileFormat f : {LoraFileFormat::Kohya, LoraFileFormat::Peft}) {
          SCOPED_TRACE(m.name + " " + format_name(f) + (conv == LoraTargetConvention::Kohya ? " kohya targets" : " diffusers targets") +
                       (mixed ? " mixed" : ""));
          const auto modules = modules_for(m, conv, mixed);
          ASSERT_FALSE(modules.empty());
          const LoraSavePlan plan = plan_lora_save(m.class_name, m.config, m.component, modules, f);
          expect_comfy_keys(plan, m.name);
          expect_round_trip(m, plan, modules);
        }
}

TEST(LoraFormat, DefaultTargetCounts) {
  auto count = [](const std::string& name, LoraTargetConvention conv) {
    const LoraTestModel m = lora_test_model(name);
    return select_lora_modules(lora_candidate_modules(m.class_name, m.config), default_lora_targets(m.class_name, m.config, conv)).size();
  };
  // Flux: 12 per double block, to_q/k/v of the 38 single blocks; kohya: every Linear of both kinds.
  EXPECT_EQ(count("flux", LoraTargetConvention::DiffusersScripts), 19u * 12 + 38 * 3);
  EXPECT_EQ(count("flux", LoraTargetConvention::Kohya), 19u * 14 + 38 * 6);
  // SDXL: 70 transformer blocks x 2 attentions x 4; SD 1.5: 16 blocks.
  EXPECT_EQ(count("sdxl", LoraTargetConvention::DiffusersScripts), 70u * 8);
  EXPECT_EQ(count("sd15", LoraTargetConvention::DiffusersScripts), 16u * 8);
  EXPECT_EQ(count("sdxl", LoraTargetConvention::Kohya), 70u * 10 + 11 * 2);  // + proj_in / proj_out of 11 Transformer2DModels
  EXPECT_EQ(count("sd15", LoraTargetConvention::Kohya), 16u * 10);           // 1x1 conv projections are no Linear
  // SD3.5-medium: 24 blocks; the last has no to_add_out; 13 with attn2.
  EXPECT_EQ(count("sd3", LoraTargetConvention::DiffusersScripts), 24u * 8 - 1);
  EXPECT_EQ(count("clip_l", LoraTargetConvention::DiffusersScripts), 12u * 4);
  EXPECT_EQ(count("clip_g", LoraTargetConvention::Kohya), 32u * 6);
  EXPECT_EQ(count("t5", LoraTargetConvention::Kohya), 24u * 7);
}

TEST(LoraFormat, KohyaFluxFusesQkvAndLinear1BlockDiagonally) {
  const LoraTestModel m = lora_test_model("flux");
  // to_q rank 4 alpha 4, to_k rank 8 alpha 4 (another scale), to_v absent; single block 0: to_q and proj_mlp.
  const std::vector<LoraModuleShape> modules = {
      {"transformer_blocks.0.attn.to_q", 4, 3072, 3072, 4.0},
      {"transformer_blocks.0.attn.to_k", 8, 3072, 3072, 4.0},
      {"single_transformer_blocks.0.proj_mlp", 2, 3072, 12288, 1.0},
      {"single_transformer_blocks.0.attn.to_q", 2, 3072, 3072, 2.0},
      {"norm_out.linear", 4, 3072, 6144, 4.0}};
  const LoraSavePlan plan = plan_lora_save(m.class_name, m.config, m.component, modules, LoraFileFormat::Kohya);
  std::map<std::string, const LoraStoredTensor*> t;
  for (const LoraStoredTensor& s : plan.tensors) t[s.key] = &s;
  ASSERT_EQ(t.size(), 9u);
  const auto& qkv_down = *t.at("lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight");
  const auto& qkv_up = *t.at("lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight");
  EXPECT_EQ(qkv_down.shape, (std::vector<int64_t>{12, 3072}));
  EXPECT_EQ(qkv_up.shape, (std::vector<int64_t>{9216, 12}));
  ASSERT_EQ(qkv_up.pieces.size(), 2u);
  EXPECT_EQ(qkv_up.pieces[0].row_begin, 0);
  EXPECT_EQ(qkv_up.pieces[0].col_begin, 0);
  EXPECT_EQ(qkv_up.pieces[1].row_begin, 3072);
  EXPECT_EQ(qkv_up.pieces[1].col_begin, 4);
  EXPECT_EQ(qkv_up.pieces[1].cols, 8);
  EXPECT_DOUBLE_EQ(t.at("lora_unet_double_blocks_0_img_attn_qkv.alpha")->alpha, 12.0);  // scale 1 = to_q's
  EXPECT_DOUBLE_EQ(qkv_up.pieces[1].scale, 0.5);                                          // to_k's scale 0.5
  const auto& l1_up = *t.at("lora_unet_single_blocks_0_linear1.lora_up.weight");
  EXPECT_EQ(l1_up.shape, (std::vector<int64_t>{3 * 3072 + 12288, 4}));
  ASSERT_EQ(l1_up.pieces.size(), 2u);
  EXPECT_EQ(l1_up.pieces[0].module, "single_transformer_blocks.0.attn.to_q");  // the original's row order
  EXPECT_EQ(l1_up.pieces[1].row_begin, 9216);
  EXPECT_EQ(l1_up.pieces[1].col_begin, 2);
  const auto& final_up = *t.at("lora_unet_final_layer_adaLN_modulation_1.lora_up.weight");
  ASSERT_EQ(final_up.pieces.size(), 1u);
  EXPECT_TRUE(final_up.pieces[0].swap_halves);
  EXPECT_EQ(plan.metadata.at("ss_network_module"), "networks.lora_flux");
  EXPECT_EQ(plan.metadata.at("ss_base_model_version"), "flux1");
  EXPECT_EQ(plan.metadata.at("modelspec.architecture"), "flux-1-dev/lora");
}

TEST(LoraFormat, LoadsKohyaFluxWithSharedDown) {
  const LoraTestModel m = lora_test_model("flux");
  const std::vector<KeyShape> keys = {
      {"lora_unet_double_blocks_0_img_attn_qkv.alpha", {}},
      {"lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight", {16, 3072}},
      {"lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight", {9216, 16}},
      {"lora_unet_single_blocks_3_linear1.lora_down.weight", {16, 3072}},
      {"lora_unet_single_blocks_3_linear1.lora_up.weight", {21504, 16}},
      {"lora_unet_final_layer_adaLN_modulation_1.lora_down.weight", {16, 3072}},
      {"lora_unet_final_layer_adaLN_modulation_1.lora_up.weight", {6144, 16}},
      {"lora_te1_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight", {16, 768}},
      {"lora_te1_text_model_encoder_layers_0_self_attn_q_proj.lora_up.weight", {768, 16}},
      {"lora_te1_text_model_encoder_layers_0_self_attn_q_proj.alpha", {}}};
  const LoraLoadPlan plan = plan_lora_load(m.class_name, m.config, m.component, keys, {{"ss_network_module", "networks.lora_flux"}});
  EXPECT_EQ(plan.format, LoraFileFormat::Kohya);
  EXPECT_EQ(plan.other_component_keys.size(), 3u);
  std::map<std::string, LoraModuleSource> s;
  for (const LoraModuleSource& x : plan.modules) s[x.module] = x;
  ASSERT_EQ(s.size(), 3u + 4 + 1);
  const auto& k = s.at("transformer_blocks.0.attn.to_k");
  EXPECT_EQ(k.rank, 16);
  EXPECT_EQ(k.alpha_key, "lora_unet_double_blocks_0_img_attn_qkv.alpha");
  EXPECT_EQ(k.down.key, "lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight");
  EXPECT_EQ(k.down.rows, 16);
  EXPECT_EQ(k.up.row_begin, 3072);
  EXPECT_EQ(k.up.rows, 3072);
  const auto& mlp = s.at("single_transformer_blocks.3.proj_mlp");
  EXPECT_EQ(mlp.up.row_begin, 9216);
  EXPECT_EQ(mlp.up.rows, 12288);
  EXPECT_TRUE(mlp.alpha_key.empty());
  EXPECT_DOUBLE_EQ(mlp.alpha, 16.0);  // no alpha: scale 1
  EXPECT_TRUE(s.at("norm_out.linear").up.swap_halves);
  // The te1 keys load into CLIP-L as text_encoder.
  const LoraTestModel clip = lora_test_model("clip_l");
  const LoraLoadPlan te = plan_lora_load(clip.class_name, clip.config, "text_encoder", keys, {});
  ASSERT_EQ(te.modules.size(), 1u);
  EXPECT_EQ(te.modules[0].module, "text_model.encoder.layers.0.self_attn.q_proj");
  EXPECT_EQ(te.other_component_keys.size(), 7u);
}

TEST(LoraFormat, LoadsPeftSdxlWithAdapterMetadata) {
  const LoraTestModel m = lora_test_model("sdxl");
  const std::string q = "down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q";
  const std::string k = "down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_k";
  const std::vector<KeyShape> keys = {{"unet." + q + ".lora_A.weight", {8, 640}},
                                      {"unet." + q + ".lora_B.weight", {640, 8}},
                                      {"unet." + k + ".lora_A.weight", {4, 640}},
                                      {"unet." + k + ".lora_B.weight", {640, 4}},
                                      {"text_encoder.text_model.encoder.layers.0.self_attn.q_proj.lora_A.weight", {8, 768}},
                                      {"text_encoder.text_model.encoder.layers.0.self_attn.q_proj.lora_B.weight", {768, 8}}};
  const std::string meta = R"({"unet.r": 8, "unet.lora_alpha": 4, "unet.rank_pattern": {")" + k +
                           R"(": 4}, "unet.alpha_pattern": {")" + k + R"(": 8}, "text_encoder.r": 8, "text_encoder.lora_alpha": 8})";
  const LoraLoadPlan plan = plan_lora_load(m.class_name, m.config, "unet", keys, {{"lora_adapter_metadata", meta}});
  EXPECT_EQ(plan.format, LoraFileFormat::Peft);
  ASSERT_EQ(plan.modules.size(), 2u);
  EXPECT_EQ(plan.modules[0].module, q);
  EXPECT_EQ(plan.modules[0].rank, 8);
  EXPECT_DOUBLE_EQ(plan.modules[0].alpha, 4.0);
  EXPECT_EQ(plan.modules[1].rank, 4);
  EXPECT_DOUBLE_EQ(plan.modules[1].alpha, 8.0);
  EXPECT_EQ(plan.other_component_keys.size(), 2u);
  // diffusers' own rank patterns ("^<module>", from get_peft_kwargs) match the module exactly.
  const std::string caret = R"({"unet.r": 4, "unet.lora_alpha": 2, "unet.rank_pattern": {"^)" + q +
                            R"(": 8}, "unet.alpha_pattern": {"^)" + q + R"(": 16, "^down_blocks.1": 1}})";
  const LoraLoadPlan caret_plan = plan_lora_load(m.class_name, m.config, "unet", keys, {{"lora_adapter_metadata", caret}});
  EXPECT_DOUBLE_EQ(caret_plan.modules[0].alpha, 16.0);
  EXPECT_DOUBLE_EQ(caret_plan.modules[1].alpha, 2.0);
  // Without metadata: alpha = rank.
  const LoraLoadPlan bare = plan_lora_load(m.class_name, m.config, "unet", keys, {});
  EXPECT_DOUBLE_EQ(bare.modules[0].alpha, 8.0);
  // A rank the metadata contradicts names the key.
  const std::string bad = R"({"unet.r": 16, "unet.lora_alpha": 4})";
  const std::string msg = error_of([&] { plan_lora_load(m.class_name, m.config, "unet", keys, {{"lora_adapter_metadata", bad}}); },
                                   FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("unet." + q + ".lora_A.weight"), std::string::npos) << msg;
}

TEST(LoraFormat, LoadsKohyaUNetUnderDiffusersAndSgmNames) {
  const LoraTestModel sd15 = lora_test_model("sd15");
  const std::vector<KeyShape> keys = {
      {"lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q.lora_down.weight", {4, 320}},
      {"lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q.lora_up.weight", {320, 4}},
      {"lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q.alpha", {}},
      {"lora_unet_input_blocks_1_1_transformer_blocks_0_attn2_to_k.lora_down.weight", {4, 768}},
      {"lora_unet_input_blocks_1_1_transformer_blocks_0_attn2_to_k.lora_up.weight", {320, 4}},
      {"lora_te_text_model_encoder_layers_11_mlp_fc2.lora_down.weight", {4, 3072}},
      {"lora_te_text_model_encoder_layers_11_mlp_fc2.lora_up.weight", {768, 4}}};
  const LoraLoadPlan plan = plan_lora_load(sd15.class_name, sd15.config, "unet", keys, {});
  ASSERT_EQ(plan.modules.size(), 2u);
  EXPECT_EQ(plan.modules[0].module, "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q");
  EXPECT_EQ(plan.modules[1].module, "down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k");
  EXPECT_EQ(plan.other_component_keys.size(), 2u);
  // SD 1.5 saves under diffusers names (sd-scripts' lora.py), SDXL under SGM names.
  const LoraSavePlan s15 = plan_lora_save(sd15.class_name, sd15.config, "unet",
                                          {{"down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q", 4, 320, 320, 4}},
                                          LoraFileFormat::Kohya);
  EXPECT_EQ(s15.tensors[0].key, "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q.lora_down.weight");
  const LoraTestModel sdxl = lora_test_model("sdxl");
  const LoraSavePlan sxl = plan_lora_save(sdxl.class_name, sdxl.config, "unet",
                                          {{"down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q", 4, 640, 640, 4}},
                                          LoraFileFormat::Kohya);
  EXPECT_EQ(sxl.tensors[0].key, "lora_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_q.lora_down.weight");
  EXPECT_EQ(sxl.metadata.at("ss_base_model_version"), "sdxl_base_v1-0");
  EXPECT_EQ(sxl.metadata.at("modelspec.architecture"), "stable-diffusion-xl-v1-base/lora");
  EXPECT_EQ(s15.metadata.at("ss_base_model_version"), "sd_v1");
  const LoraTestModel sd3 = lora_test_model("sd3");
  const LoraSavePlan s3 = plan_lora_save(sd3.class_name, sd3.config, "transformer",
                                         {{"transformer_blocks.0.attn.to_q", 4, 1536, 1536, 4}}, LoraFileFormat::Kohya);
  EXPECT_EQ(s3.tensors[0].key, "lora_unet_joint_blocks_0_x_block_attn_qkv.lora_down.weight");
  EXPECT_EQ(s3.metadata.at("ss_base_model_version"), "5-medium");  // sd-scripts' sd3_utils model_type
  EXPECT_EQ(s3.metadata.at("modelspec.architecture"), "stable-diffusion-3-5-medium/lora");
}

TEST(LoraFormat, LoadsComfyStyleNames) {
  const LoraTestModel m = lora_test_model("flux");
  const std::vector<KeyShape> keys = {
      {"diffusion_model.double_blocks.1.txt_attn.qkv.lora_A.weight", {8, 3072}},
      {"diffusion_model.double_blocks.1.txt_attn.qkv.lora_B.weight", {9216, 8}},
      {"transformer.transformer_blocks.1.ff.net.2.lora_down.weight", {8, 12288}},
      {"transformer.transformer_blocks.1.ff.net.2.lora_up.weight", {3072, 8}},
      {"transformer.transformer_blocks.1.ff.net.2.alpha", {}},
      {"lora_transformer_single_transformer_blocks_0_proj_out.lora_down.weight", {8, 15360}},
      {"lora_transformer_single_transformer_blocks_0_proj_out.lora_up.weight", {3072, 8}},
      // SimpleTuner's LyCORIS files: "lycoris_" + the diffusers name
      {"lycoris_single_transformer_blocks_1_attn_to_k.lora_down.weight", {8, 3072}},
      {"lycoris_single_transformer_blocks_1_attn_to_k.lora_up.weight", {3072, 8}},
      {"lycoris_single_transformer_blocks_1_attn_to_k.alpha", {}}};
  const LoraLoadPlan plan = plan_lora_load(m.class_name, m.config, "transformer", keys, {});
  std::set<std::string> got;
  for (const LoraModuleSource& s : plan.modules) got.insert(s.module);
  EXPECT_EQ(got, (std::set<std::string>{"transformer_blocks.1.attn.add_q_proj", "transformer_blocks.1.attn.add_k_proj",
                                        "transformer_blocks.1.attn.add_v_proj", "transformer_blocks.1.ff.net.2",
                                        "single_transformer_blocks.0.proj_out", "single_transformer_blocks.1.attn.to_k"}));
  // ... and for a UNet (ComfyUI's unet_to_diffusers names); a text encoder leaves them to the UNet
  const LoraTestModel sdxl = lora_test_model("sdxl");
  const std::vector<KeyShape> unet_keys = {
      {"lycoris_down_blocks_1_attentions_0_transformer_blocks_0_attn1_to_q.lora_down.weight", {4, 640}},
      {"lycoris_down_blocks_1_attentions_0_transformer_blocks_0_attn1_to_q.lora_up.weight", {640, 4}}};
  const LoraLoadPlan unet = plan_lora_load(sdxl.class_name, sdxl.config, "unet", unet_keys, {});
  ASSERT_EQ(unet.modules.size(), 1u);
  EXPECT_EQ(unet.modules[0].module, "down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q");
  const LoraTestModel clip = lora_test_model("clip_l");
  EXPECT_EQ(plan_lora_load(clip.class_name, clip.config, clip.component, unet_keys, {}).other_component_keys.size(), 2u);
}

TEST(LoraFormat, PeftMetadataIsWhatDiffusersReads) {
  const LoraTestModel m = lora_test_model("flux");
  const LoraSavePlan plan = plan_lora_save(m.class_name, m.config, "transformer",
                                           {{"transformer_blocks.0.attn.to_q", 16, 3072, 3072, 16},
                                            {"transformer_blocks.0.attn.to_k", 16, 3072, 3072, 16},
                                            {"transformer_blocks.0.attn.to_v", 4, 3072, 3072, 8}},
                                           LoraFileFormat::Peft);
  const auto j = nlohmann::json::parse(plan.metadata.at("lora_adapter_metadata"));
  EXPECT_EQ(j.at("transformer.r"), 16);
  EXPECT_EQ(j.at("transformer.lora_alpha"), 16);
  EXPECT_EQ(j.at("transformer.rank_pattern").at("transformer_blocks.0.attn.to_v"), 4);
  EXPECT_EQ(j.at("transformer.alpha_pattern").at("transformer_blocks.0.attn.to_v"), 8);
  EXPECT_EQ(plan.metadata.at("format"), "pt");
  EXPECT_EQ(plan.tensors[0].key, "transformer.transformer_blocks.0.attn.to_q.lora_A.weight");
  // Merged with a text encoder's plan: one JSON with both prefixes.
  const LoraTestModel clip = lora_test_model("clip_l");
  const LoraSavePlan te = plan_lora_save(clip.class_name, clip.config, "text_encoder",
                                         {{"text_model.encoder.layers.0.self_attn.q_proj", 4, 768, 768, 4}}, LoraFileFormat::Peft);
  const LoraSavePlan both = merge_lora_save_plans({plan, te});
  const auto jb = nlohmann::json::parse(both.metadata.at("lora_adapter_metadata"));
  EXPECT_EQ(jb.at("text_encoder.r"), 4);
  EXPECT_EQ(jb.at("transformer.r"), 16);
  EXPECT_EQ(both.tensors.size(), 8u);
  error_of([&] { merge_lora_save_plans({plan, plan}); }, FLAME_ERROR_INVALID_ARGUMENT);
}

// peft takes the first pattern key matching "(^|.*\.)<key>$" in the JSON's (sorted) order, so the
// top-level proj_out's entry would also set a single block's proj_out: the writer anchors a module
// name that ends another's with "^", and FLAME's reader gives each module its own value back.
TEST(LoraFormat, PeftPatternKeysAreUnambiguous) {
  const LoraTestModel m = lora_test_model("flux");
  const std::vector<LoraModuleShape> modules = {{"single_transformer_blocks.0.proj_out", 8, 15360, 3072, 8},
                                                {"single_transformer_blocks.1.proj_out", 8, 15360, 3072, 8},
                                                {"proj_out", 4, 3072, 64, 2}};
  const LoraSavePlan plan = plan_lora_save(m.class_name, m.config, "transformer", modules, LoraFileFormat::Peft);
  const auto j = nlohmann::json::parse(plan.metadata.at("lora_adapter_metadata"));
  EXPECT_EQ(j.at("transformer.r"), 8);
  EXPECT_EQ(j.at("transformer.rank_pattern").size(), 1u);
  EXPECT_EQ(j.at("transformer.rank_pattern").at("^proj_out"), 4);
  EXPECT_EQ(j.at("transformer.alpha_pattern").at("^proj_out"), 2);
  std::vector<KeyShape> keys;
  for (const auto& t : plan.tensors) keys.push_back({t.key, t.shape});
  const LoraLoadPlan back = plan_lora_load(m.class_name, m.config, "transformer", keys, plan.metadata);
  ASSERT_EQ(back.modules.size(), 3u);
  for (const auto& mod : back.modules) EXPECT_EQ(mod.alpha, mod.module == "proj_out" ? 2.0 : 8.0) << mod.module;
}

TEST(LoraFormat, ErrorsNameTheKeyOrModule) {
  const LoraTestModel m = lora_test_model("flux");
  auto load = [&](const std::vector<KeyShape>& keys) { plan_lora_load(m.class_name, m.config, "transformer", keys, {}); };
  std::string msg = error_of([&] { load({{"lora_unet_double_blocks_0_img_attn_qkvv.lora_down.weight", {4, 3072}}}); },
                             FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("lora_unet_double_blocks_0_img_attn_qkvv.lora_down.weight"), std::string::npos) << msg;
  msg = error_of([&] { load({{"something_else.weight", {4, 3072}}}); }, FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("something_else.weight"), std::string::npos) << msg;
  msg = error_of([&] {
    load({{"lora_unet_double_blocks_0_img_attn_proj.lora_down.weight", {4, 3072}},
          {"lora_unet_double_blocks_0_img_attn_proj.lora_up.weight", {3072, 5}}});
  }, FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("lora_unet_double_blocks_0_img_attn_proj.lora_up.weight"), std::string::npos) << msg;
  msg = error_of([&] { load({{"lora_unet_double_blocks_0_img_attn_proj.lora_down.weight", {4, 3072}}}); }, FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("lora_unet_double_blocks_0_img_attn_proj.lora_down.weight"), std::string::npos) << msg;
  msg = error_of([&] { load({{"lora_unet_double_blocks_0_img_attn_proj.dora_scale", {1, 3072}}}); }, FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("dora_scale"), std::string::npos) << msg;
  msg = error_of([&] {
    load({{"lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight", {4, 3072}},
          {"lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight", {9216, 4}},
          {"transformer.transformer_blocks.0.attn.to_q.lora_A.weight", {4, 3072}},
          {"transformer.transformer_blocks.0.attn.to_q.lora_B.weight", {3072, 4}}});
  }, FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("transformer.transformer_blocks.0.attn.to_q.lora_A.weight"), std::string::npos) << msg;
  msg = error_of([&] {
    load({{"lora_unet_double_blocks_0_img_attn_proj.lora_down.weight", {4, 3072}},
          {"lora_unet_double_blocks_0_img_attn_proj.lora_up.weight", {3072, 4}},
          {"lora_unet_double_blocks_0_img_attn_proj.alpha", {4}}});
  }, FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("lora_unet_double_blocks_0_img_attn_proj.alpha"), std::string::npos) << msg;

  // SD 1.5's 1x1 convolution projections (in kohya's SD 1.5 defaults): named as convolutions.
  const LoraTestModel sd15 = lora_test_model("sd15");
  msg = error_of([&] {
    plan_lora_load(sd15.class_name, sd15.config, "unet",
                   {{"lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight", {4, 320, 1, 1}},
                    {"lora_unet_down_blocks_0_attentions_0_proj_in.lora_up.weight", {320, 4, 1, 1}}}, {});
  }, FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find("convolution"), std::string::npos) << msg;
  EXPECT_NE(msg.find("lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight"), std::string::npos) << msg;

  auto save = [&](const std::vector<LoraModuleShape>& mods) {
    plan_lora_save(m.class_name, m.config, "transformer", mods, LoraFileFormat::Kohya);
  };
  msg = error_of([&] { save({{"transformer_blocks.0.attn.to_qq", 4, 3072, 3072, 4}}); }, FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(msg.find("transformer_blocks.0.attn.to_qq"), std::string::npos) << msg;
  msg = error_of([&] { save({{"transformer_blocks.0.attn.to_q", 4, 3072, 3000, 4}}); }, FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(msg.find("transformer_blocks.0.attn.to_q"), std::string::npos) << msg;
  msg = error_of([&] {
    save({{"transformer_blocks.0.attn.to_q", 4, 3072, 3072, 4}, {"transformer_blocks.0.attn.to_q", 4, 3072, 3072, 4}});
  }, FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(msg.find("listed twice"), std::string::npos) << msg;
  error_of([&] { save({}); }, FLAME_ERROR_INVALID_ARGUMENT);
  error_of([&] { plan_lora_save(m.class_name, m.config, "vae", {{"proj_out", 4, 3072, 64, 4}}, LoraFileFormat::Kohya); },
           FLAME_ERROR_INVALID_ARGUMENT);
  error_of([&] { plan_lora_save("AutoencoderKL", m.config, "transformer", {{"proj_out", 4, 3072, 64, 4}}, LoraFileFormat::Kohya); },
           FLAME_ERROR_INVALID_ARGUMENT);
  // CLIP's text_projection is stored transposed in OpenCLIP, but kohya names text encoders by
  // transformers' names, so it saves; bigG's candidates include it.
  const LoraTestModel g = lora_test_model("clip_g");
  EXPECT_NO_THROW(plan_lora_save(g.class_name, g.config, "text_encoder_2", {{"text_projection", 4, 1280, 1280, 4}}, LoraFileFormat::Kohya));
}

TEST(LoraFormat, DoraKeysInBothFormats) {
  const LoraTestModel m = lora_test_model("flux");
  const std::vector<LoraModuleShape> modules = {
      {"transformer_blocks.0.attn.to_q", 4, 3072, 3072, 4.0, true},
      {"transformer_blocks.0.attn.to_k", 8, 3072, 3072, 4.0, true},
      {"single_transformer_blocks.0.attn.to_q", 2, 3072, 3072, 2.0, true},
      {"single_transformer_blocks.0.proj_out", 2, 15360, 3072, 2.0, false},
      {"norm_out.linear", 4, 3072, 6144, 4.0, true}};
  const LoraSavePlan kohya = plan_lora_save(m.class_name, m.config, m.component, modules, LoraFileFormat::Kohya);
  std::map<std::string, const LoraStoredTensor*> t;
  for (const LoraStoredTensor& s : kohya.tensors) t[s.key] = &s;
  EXPECT_FALSE(t.count("lora_unet_single_blocks_0_linear2.dora_scale")) << "proj_out has no DoRA";
  const auto& qkv = *t.at("lora_unet_double_blocks_0_img_attn_qkv.dora_scale");
  EXPECT_EQ(qkv.shape, (std::vector<int64_t>{9216, 1}));
  ASSERT_EQ(qkv.pieces.size(), 3u);  // q and k their magnitudes, v (no LoRA) its row norms
  EXPECT_FALSE(qkv.pieces[0].adapted_row_norms);
  EXPECT_FALSE(qkv.pieces[1].adapted_row_norms);
  EXPECT_EQ(qkv.pieces[2].module, "transformer_blocks.0.attn.to_v");
  EXPECT_TRUE(qkv.pieces[2].adapted_row_norms);
  EXPECT_EQ(qkv.pieces[2].row_begin, 6144);
  const auto& linear1 = *t.at("lora_unet_single_blocks_0_linear1.dora_scale");
  EXPECT_EQ(linear1.shape, (std::vector<int64_t>{3 * 3072 + 12288, 1}));
  EXPECT_EQ(linear1.pieces.size(), 4u);
  const auto& final_scale = *t.at("lora_unet_final_layer_adaLN_modulation_1.dora_scale");
  ASSERT_EQ(final_scale.pieces.size(), 1u);
  EXPECT_TRUE(final_scale.pieces[0].swap_halves);
  expect_comfy_keys(kohya, "flux");
  expect_round_trip(m, kohya, modules);

  const LoraSavePlan peft = plan_lora_save(m.class_name, m.config, m.component, modules, LoraFileFormat::Peft);
  std::map<std::string, const LoraStoredTensor*> p;
  for (const LoraStoredTensor& s : peft.tensors) p[s.key] = &s;
  EXPECT_EQ(p.at("transformer.transformer_blocks.0.attn.to_q.lora_magnitude_vector")->shape, (std::vector<int64_t>{3072}));
  EXPECT_FALSE(p.count("transformer.single_transformer_blocks.0.proj_out.lora_magnitude_vector"));
  EXPECT_EQ(nlohmann::json::parse(peft.metadata.at("lora_adapter_metadata")).at("transformer.use_dora"), true);
  expect_comfy_keys(peft, "flux");
  expect_round_trip(m, peft, modules);
  const LoraSavePlan plain = plan_lora_save(m.class_name, m.config, m.component, {{"transformer_blocks.0.attn.to_q", 4, 3072, 3072, 4.0}},
                                            LoraFileFormat::Peft);
  EXPECT_EQ(nlohmann::json::parse(plain.metadata.at("lora_adapter_metadata")).at("transformer.use_dora"), false);

  // Files of others: diffusers' kohya conversion keeps [out, 1]; peft writes [out].
  const std::string q = "transformer.transformer_blocks.1.attn.to_q";
  const LoraLoadPlan loaded = plan_lora_load(m.class_name, m.config, m.component,
                                             {{q + ".lora_A.weight", {4, 3072}}, {q + ".lora_B.weight", {3072, 4}},
                                              {q + ".lora_magnitude_vector", {3072, 1}}}, {});
  ASSERT_EQ(loaded.modules.size(), 1u);
  EXPECT_EQ(loaded.modules[0].magnitude.key, q + ".lora_magnitude_vector");
  EXPECT_EQ(loaded.modules[0].magnitude.rows, 3072);

  auto load = [&](const std::vector<KeyShape>& keys) { plan_lora_load(m.class_name, m.config, m.component, keys, {}); };
  const std::string k = "lora_unet_double_blocks_0_img_attn_proj";
  std::string msg = error_of([&] {
    load({{k + ".lora_down.weight", {4, 3072}}, {k + ".lora_up.weight", {3072, 4}}, {k + ".dora_scale", {1, 3072}}});
  }, FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find(k + ".dora_scale"), std::string::npos) << msg;
  EXPECT_NE(msg.find("wd_on_out"), std::string::npos) << msg;
  msg = error_of([&] {
    load({{k + ".lora_down.weight", {4, 3072}}, {k + ".lora_up.weight", {3072, 4}}, {k + ".dora_scale", {3000, 1}}});
  }, FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find(k + ".dora_scale"), std::string::npos) << msg;
  msg = error_of([&] { load({{k + ".dora_scale", {3072, 1}}}); }, FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(msg.find(k + ".dora_scale"), std::string::npos) << msg;
}

TEST(LoraFormat, TargetPatterns) {
  EXPECT_TRUE(lora_target_matches("transformer_blocks.0.attn.to_q", "to_q"));
  EXPECT_TRUE(lora_target_matches("transformer_blocks.0.attn.to_q", "attn.to_q"));
  EXPECT_FALSE(lora_target_matches("transformer_blocks.0.attn.to_q", "n.to_q"));
  EXPECT_TRUE(lora_target_matches("transformer_blocks.0.attn.to_out.0", "to_out.0"));
  EXPECT_TRUE(lora_target_matches("single_transformer_blocks.3.proj_out", "single_transformer_blocks.*.proj_out"));
  EXPECT_FALSE(lora_target_matches("proj_out", "single_transformer_blocks.*.proj_out"));
  EXPECT_FALSE(lora_target_matches("single_transformer_blocks.3.attn.to_q", "transformer_blocks.*.attn.to_q"));
  EXPECT_TRUE(lora_target_matches("encoder.block.0.layer.0.SelfAttention.q", "q"));
  EXPECT_FALSE(lora_target_matches("encoder.block.0.layer.0.SelfAttention.q", "SelfAttention.k"));
}

// ---- LoKr (LyCORIS' Kronecker adapter) ----

TEST(LoraFormat, LokrFactorizationIsLycoris) {
  // lycoris/functional/general.py factorization(dimension, factor), computed by LyCORIS' own code
  const struct {
    int64_t dim, factor, m, n;
  } cases[] = {{127, -1, 1, 127}, {128, -1, 8, 16},  {250, -1, 10, 25}, {360, -1, 18, 20}, {1024, -1, 32, 32},
               {3072, -1, 48, 64}, {768, -1, 24, 32}, {96, -1, 8, 12},   {128, 2, 2, 64},   {360, 4, 4, 90},
               {250, 4, 2, 125},  {250, 8, 5, 50},   {360, 16, 15, 24}, {64, 16, 4, 16},   {1024, 16, 16, 64}};
  for (const auto& c : cases)
    EXPECT_EQ(lokr_factorization(c.dim, c.factor), std::make_pair(c.m, c.n)) << c.dim << " factor " << c.factor;
  // LokrModule's shapes: W1 [a, b] from the smaller members, W2 [c, d] low rank when rank < max(c, d) / 2
  LokrShape s = lokr_shape(3072, 768, 32, -1, false);
  EXPECT_EQ(s.w1_rows, 48);
  EXPECT_EQ(s.w1_cols, 24);
  EXPECT_EQ(s.w2_rows, 64);
  EXPECT_EQ(s.w2_cols, 32);
  EXPECT_FALSE(s.w1_low_rank);
  EXPECT_FALSE(s.w2_low_rank);  // 32 >= 64 / 2
  EXPECT_TRUE(lokr_shape(3072, 768, 31, -1, false).w2_low_rank);
  s = lokr_shape(3072, 768, 15, -1, true);
  EXPECT_TRUE(s.w2_low_rank);
  EXPECT_TRUE(s.w1_low_rank);  // 15 < 48 / 2
  s = lokr_shape(3072, 768, 4, 8, true);
  EXPECT_EQ(s.w1_rows, 8);
  EXPECT_EQ(s.w2_rows, 384);
  EXPECT_FALSE(s.w1_low_rank);  // 4 >= 8 / 2
  EXPECT_TRUE(s.w2_low_rank);
  EXPECT_EQ(s.factors(), (std::vector<LokrFactor>{LokrFactor::W1, LokrFactor::W2A, LokrFactor::W2B}));
  EXPECT_EQ(s.factor_shape(LokrFactor::W2B, 4), (std::vector<int64_t>{4, 96}));
}

// LoKr modules (whole and low-rank factors in turn) on every default kohya target of a model.
std::vector<LoraModuleShape> lokr_modules_for(const LoraTestModel& m) {
  std::vector<LoraModuleShape> out;
  const auto selected = select_lora_modules(lora_candidate_modules(m.class_name, m.config),
                                            default_lora_targets(m.class_name, m.config, LoraTargetConvention::Kohya));
  for (size_t i = 0; i < selected.size(); ++i) {
    LoraModuleShape s{selected[i].module, i % 3 == 0 ? 64 : 4, selected[i].in_features, selected[i].out_features, 8.0, false};
    s.lokr = true;
    s.lokr_shape = lokr_shape(s.out_features, s.in_features, s.rank, i % 2 ? 8 : -1, i % 4 == 1);
    out.push_back(std::move(s));
  }
  return out;
}

// Every key of a LoKr plan follows ComfyUI's comfy/weight_adapter/lokr.py: "<name>.lokr_w1" or
// ".lokr_w1_a" + ".lokr_w1_b", ".lokr_w2" or ".lokr_w2_a" + ".lokr_w2_b", ".alpha"; name a weight
// ComfyUI maps; kron(W1, W2) of the weight's shape (ComfyUI reshapes it to the weight); the low-rank
// factors share the rank ComfyUI divides alpha by (w2_b's rows, else w1_b's).
void expect_comfy_lokr_keys(const LoraSavePlan& plan, const std::string& model) {
  ASSERT_EQ(plan.format, LoraFileFormat::Kohya);
  const auto names = comfy_lora_names(model);
  std::map<std::string, std::map<std::string, const LoraStoredTensor*>> by_name;
  for (const LoraStoredTensor& t : plan.tensors) {
    std::string name, role;
    for (const char* s : {".lokr_w1", ".lokr_w1_a", ".lokr_w1_b", ".lokr_w2", ".lokr_w2_a", ".lokr_w2_b", ".alpha"})
      if (!(name = strip(t.key, s)).empty()) {
        role = s;
        break;
      }
    ASSERT_FALSE(name.empty()) << t.key << ": no suffix ComfyUI's LoKr adapter reads";
    ASSERT_TRUE(names.count(name)) << t.key << ": ComfyUI maps no weight to " << name;
    ASSERT_TRUE(by_name[name].emplace(role, &t).second) << t.key << " twice";
  }
  EXPECT_FALSE(by_name.empty());
  for (const auto& [name, roles_of_name] : by_name) {
    const auto& roles = roles_of_name;  // clang refuses a lambda capture of a structured binding
    auto get = [&](const char* r) { return roles.count(r) ? roles.at(r) : nullptr; };
    const LoraStoredTensor *w1 = get(".lokr_w1"), *w1a = get(".lokr_w1_a"), *w1b = get(".lokr_w1_b");
    const LoraStoredTensor *w2 = get(".lokr_w2"), *w2a = get(".lokr_w2_a"), *w2b = get(".lokr_w2_b");
    ASSERT_TRUE(w1 ? !w1a && !w1b : w1a && w1b) << name << ": W1 whole or as _a / _b";
    ASSERT_TRUE(w2 ? !w2a && !w2b : w2a && w2b) << name << ": W2 whole or as _a / _b";
    for (const auto& [role, t] : roles)
      if (role != ".alpha") ASSERT_EQ(t->shape.size(), 2u) << t->key;
    const int64_t a = w1 ? w1->shape[0] : w1a->shape[0], b = w1 ? w1->shape[1] : w1b->shape[1];
    const int64_t c = w2 ? w2->shape[0] : w2a->shape[0], d = w2 ? w2->shape[1] : w2b->shape[1];
    if (w1a) EXPECT_EQ(w1a->shape[1], w1b->shape[0]) << name;
    if (w2a) EXPECT_EQ(w2a->shape[1], w2b->shape[0]) << name;
    if (w1a && w2a) EXPECT_EQ(w1b->shape[0], w2b->shape[0]) << name << ": one rank";
    const std::vector<int64_t>& w = names.at(name);
    EXPECT_EQ(a * c, w[0]) << name;
    EXPECT_EQ(b * d, w[1]) << name;
    ASSERT_TRUE(roles.count(".alpha")) << name << ": no alpha";
    EXPECT_TRUE(roles.at(".alpha")->shape.empty()) << name;
    EXPECT_GT(roles.at(".alpha")->alpha, 0) << name;
  }
}

TEST(LoraFormat, LokrKohyaKeysAreComfyUisAndLoadBack) {
  for (const char* name : {"flux", "sd3", "sdxl", "sd15", "clip_l", "clip_g", "t5"}) {
    SCOPED_TRACE(name);
    const LoraTestModel m = lora_test_model(name);
    const std::vector<LoraModuleShape> modules = lokr_modules_for(m);
    ASSERT_FALSE(modules.empty());
    const LoraSavePlan plan = plan_lora_save(m.class_name, m.config, m.component, modules, LoraFileFormat::Kohya);
    expect_comfy_lokr_keys(plan, m.name);
    EXPECT_EQ(plan.metadata.at("ss_network_module"), "lycoris.kohya");
    std::map<std::string, const LoraStoredTensor*> stored;
    for (const LoraStoredTensor& t : plan.tensors) stored[t.key] = &t;
    const LoraLoadPlan loaded = plan_lora_load(m.class_name, m.config, m.component, keys_of(plan), plan.metadata);
    ASSERT_EQ(loaded.modules.size(), modules.size());
    std::map<std::string, const LoraModuleSource*> got;
    for (const LoraModuleSource& s : loaded.modules) got[s.module] = &s;
    for (const LoraModuleShape& mod : modules) {
      ASSERT_TRUE(got.count(mod.module)) << mod.module;
      const LoraModuleSource& s = *got.at(mod.module);
      EXPECT_TRUE(s.lokr);
      EXPECT_TRUE(s.down.key.empty() && s.up.key.empty());
      EXPECT_EQ(s.lokr_shape.factors(), mod.lokr_shape.factors()) << mod.module;
      EXPECT_EQ(s.lokr_shape.w1_rows, mod.lokr_shape.w1_rows);
      EXPECT_EQ(s.lokr_shape.w2_cols, mod.lokr_shape.w2_cols);
      ASSERT_FALSE(s.alpha_key.empty()) << mod.module;
      const bool whole = !mod.lokr_shape.w1_low_rank && !mod.lokr_shape.w2_low_rank;
      if (!whole) {
        EXPECT_EQ(s.rank, mod.rank);
        EXPECT_EQ(stored.at(s.alpha_key)->alpha, mod.alpha) << mod.module;
      }
      for (const auto& [f, key] : s.lokr_keys) {
        const LoraStoredTensor& t = *stored.at(key);
        EXPECT_EQ(t.kind, LoraTensorKind::Lokr);
        EXPECT_EQ(t.factor, f);
        ASSERT_EQ(t.pieces.size(), 1u);
        EXPECT_EQ(t.pieces[0].module, mod.module);
        // two whole factors: scale 1 in the file, the module's scale (alpha / rank) carried by W2
        EXPECT_DOUBLE_EQ(t.pieces[0].scale, whole && f == LokrFactor::W2 ? mod.alpha / mod.rank : 1.0) << key;
      }
    }
  }
}

TEST(LoraFormat, LokrOnFusedOrSwappedOriginalsTakesMemberNamesAndRefusesPeft) {
  const LoraTestModel m = lora_test_model("flux");
  auto lokr_on = [&](const std::string& module, int64_t out, int64_t in) {
    LoraModuleShape s{module, 4, in, out, 4.0, false};
    s.lokr = true;
    s.lokr_shape = lokr_shape(out, in, 4, -1, false);
    return s;
  };
  auto has_key = [](const LoraSavePlan& plan, const std::string& key) {
    return std::any_of(plan.tensors.begin(), plan.tensors.end(), [&](const LoraStoredTensor& t) { return t.key == key; });
  };
  // img_attn.proj owns its weight: its original name. to_q and to_k live in the fused img_attn.qkv,
  // proj_mlp in linear1, and norm_out.linear is stored with swapped halves: each under its own
  // diffusers name with OneTrainer's prefix, which ComfyUI maps to its rows of the fused weight (or
  // swaps the halves of the difference back).
  const LoraSavePlan ok = plan_lora_save(m.class_name, m.config, "transformer",
                                         {lokr_on("transformer_blocks.0.attn.to_out.0", 3072, 3072),
                                          lokr_on("transformer_blocks.0.attn.to_q", 3072, 3072),
                                          lokr_on("transformer_blocks.0.attn.to_k", 3072, 3072),
                                          lokr_on("single_transformer_blocks.1.proj_mlp", 12288, 3072),
                                          lokr_on("norm_out.linear", 6144, 3072)},
                                         LoraFileFormat::Kohya);
  expect_comfy_lokr_keys(ok, "flux");
  EXPECT_TRUE(has_key(ok, "lora_unet_double_blocks_0_img_attn_proj.lokr_w1"));
  EXPECT_TRUE(has_key(ok, "lora_transformer_transformer_blocks_0_attn_to_q.lokr_w1"));
  EXPECT_TRUE(has_key(ok, "lora_transformer_transformer_blocks_0_attn_to_k.alpha"));
  EXPECT_TRUE(has_key(ok, "lora_transformer_single_transformer_blocks_1_proj_mlp.lokr_w1"));
  EXPECT_TRUE(has_key(ok, "lora_transformer_norm_out_linear.lokr_w1"));
  const LoraLoadPlan back = plan_lora_load(m.class_name, m.config, "transformer", keys_of(ok), ok.metadata);
  std::set<std::string> modules;
  for (const LoraModuleSource& s : back.modules) modules.insert(s.module);
  EXPECT_EQ(modules, (std::set<std::string>{"transformer_blocks.0.attn.to_out.0", "transformer_blocks.0.attn.to_q",
                                            "transformer_blocks.0.attn.to_k", "single_transformer_blocks.1.proj_mlp",
                                            "norm_out.linear"}));
  // SD3's fused qkv likewise
  const LoraTestModel sd3 = lora_test_model("sd3");
  const LoraSavePlan s3 = plan_lora_save(sd3.class_name, sd3.config, "transformer",
                                         {lokr_on("transformer_blocks.0.attn.to_v", 1536, 1536)}, LoraFileFormat::Kohya);
  expect_comfy_lokr_keys(s3, "sd3");
  EXPECT_TRUE(has_key(s3, "lora_transformer_transformer_blocks_0_attn_to_v.lokr_w1"));
  const std::string msg = error_of([&] {
    plan_lora_save(m.class_name, m.config, "transformer", {lokr_on("transformer_blocks.0.attn.to_out.0", 3072, 3072)},
                   LoraFileFormat::Peft);
  }, FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(msg.find("kohya"), std::string::npos) << msg;
  EXPECT_NE(msg.find("LoKr"), std::string::npos) << msg;
}

TEST(LoraFormat, LokrLoadErrorsNameTheKey) {
  const LoraTestModel m = lora_test_model("flux");
  auto load = [&](const std::vector<KeyShape>& keys) { return plan_lora_load(m.class_name, m.config, "transformer", keys, {}); };
  const std::string k = "lora_unet_double_blocks_0_img_attn_proj";
  // a LyCORIS file as users share it: W1 whole, W2 low rank, alpha; and one without alpha (scale 1)
  LoraLoadPlan p = load({{k + ".lokr_w1", {48, 48}}, {k + ".lokr_w2_a", {64, 8}}, {k + ".lokr_w2_b", {8, 64}}, {k + ".alpha", {}}});
  ASSERT_EQ(p.modules.size(), 1u);
  EXPECT_EQ(p.modules[0].module, "transformer_blocks.0.attn.to_out.0");
  EXPECT_EQ(p.modules[0].rank, 8);
  EXPECT_EQ(p.modules[0].alpha_key, k + ".alpha");
  p = load({{k + ".lokr_w1", {48, 48}}, {k + ".lokr_w2", {64, 64}}});
  EXPECT_EQ(p.modules[0].rank, 1);
  EXPECT_TRUE(p.modules[0].alpha_key.empty());
  EXPECT_EQ(p.format, LoraFileFormat::Kohya);
  // diffusers-named dotted keys (peft's LoKr state dict names under the component) load too
  p = load({{"transformer.transformer_blocks.0.attn.to_out.0.lokr_w1", {48, 48}},
            {"transformer.transformer_blocks.0.attn.to_out.0.lokr_w2", {64, 64}}});
  EXPECT_EQ(p.modules[0].module, "transformer_blocks.0.attn.to_out.0");

  const std::vector<std::pair<std::vector<KeyShape>, const char*>> bad = {
      {{{k + ".lokr_w2", {64, 64}}}, "lokr_w1"},                                                   // no W1
      {{{k + ".lokr_w1", {48, 48}}, {k + ".lokr_w1_a", {48, 2}}, {k + ".lokr_w1_b", {2, 48}}, {k + ".lokr_w2", {64, 64}}},
       "lokr_w1"},                                                                                 // W1 twice
      {{{k + ".lokr_w1", {48, 48}}, {k + ".lokr_w2_a", {64, 8}}}, "lokr_w2"},                      // w2_b missing
      {{{k + ".lokr_w1", {48, 48}}, {k + ".lokr_w2", {64, 32}}}, "kron"},                          // product not the weight
      {{{k + ".lokr_w1", {48, 48}}, {k + ".lokr_w2_a", {64, 8}}, {k + ".lokr_w2_b", {4, 64}}}, "rows must match"},
      {{{k + ".lokr_w1_a", {48, 2}}, {k + ".lokr_w1_b", {2, 48}}, {k + ".lokr_w2_a", {64, 8}}, {k + ".lokr_w2_b", {8, 64}}},
       "rank"},                                                                                    // two ranks
      {{{k + ".lokr_w1", {48, 48}}, {k + ".lokr_w2", {64, 64}}, {k + ".lora_down.weight", {4, 3072}},
        {k + ".lora_up.weight", {3072, 4}}}, "LoRA pair"},
      {{{k + ".lokr_w1", {48, 48}}, {k + ".lokr_w2", {64, 64}}, {k + ".dora_scale", {3072, 1}}}, "DoRA"},
      {{{k + ".lokr_w1", {48, 48}}, {k + ".lokr_t2", {8, 8, 1, 1}}, {k + ".lokr_w2_a", {8, 64}}, {k + ".lokr_w2_b", {8, 64}}},
       "lokr_t2"},
      {{{"lora_unet_double_blocks_0_img_attn_qkv.lokr_w1", {48, 48}}, {"lora_unet_double_blocks_0_img_attn_qkv.lokr_w2", {192, 64}}},
       "fused"},
  };
  for (const auto& [bad_keys, needle] : bad) {
    const auto& keys = bad_keys;  // clang refuses a lambda capture of a structured binding
    const std::string msg = error_of([&] { load(keys); }, FLAME_ERROR_INVALID_FORMAT);
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_NE(msg.find("lora_unet_double_blocks_0_img_attn_"), std::string::npos) << msg;
  }
}

}  // namespace

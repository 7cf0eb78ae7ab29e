// flame_model_keys: prints, as JSON on stdout, what FLAME's model layer knows of a model's
// checkpoint keys, for tests/models/check_model_keys.py to compare with the real diffusers classes
// and converters on a machine that has them. Needs no GPU and no weights.
//
//   flame_model_keys flux dev|schnell|tiny
//   flame_model_keys unet sdxl|sd15|tiny
//   flame_model_keys sd3 sd35-medium|sd3-medium|tiny
//   flame_model_keys vae sdxl|flux|sd3|tiny
//   flame_model_keys clip l|l-projection|bigg|tiny
//   flame_model_keys t5 xxl|tiny
//
// Output: {"config": {...}, "original": [[name, [shape]], ...], "diffusers": [[name, [shape]], ...],
//          "map": [[diffusers_name, original_name, row_begin, rows, swap_halves], ...]}
// (for the UNet every parameter is one whole stored tensor: row_begin 0, all rows, no swap). The
// families of mapped_keys.h (sd3, vae, clip, t5) add "class" (the real class's name) and a sixth map
// field, transposed; "diffusers" is then the transformers list for clip and t5, and "original" the
// OpenCLIP names for clip (T5's names are the same in every layout).
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "model_configs.h"
#include "models/clip_keys.h"
#include "models/flux_keys.h"
#include "models/sd3_keys.h"
#include "models/t5_keys.h"
#include "models/unet_keys.h"
#include "models/vae_keys.h"

using flame::models::FluxConfig;
using flame::models::KeyShape;

namespace {

nlohmann::json key_list(const std::vector<KeyShape>& keys) {
  nlohmann::json out = nlohmann::json::array();
  for (const KeyShape& k : keys) out.push_back({k.name, k.shape});
  return out;
}

int usage() {
  std::fprintf(stderr,
               "usage: flame_model_keys flux dev|schnell|tiny\n       flame_model_keys unet sdxl|sd15|tiny\n"
               "       flame_model_keys sd3 sd35-medium|sd3-medium|tiny\n       flame_model_keys vae sdxl|flux|sd3|tiny\n"
               "       flame_model_keys clip l|l-projection|bigg|tiny\n       flame_model_keys t5 xxl|tiny\n");
  return 1;
}

// Prints a mapped family's tables with its class name and config.json fields.
int print_mapped(const char* class_name, nlohmann::json config, const flame::models::MappedTable& t) {
  nlohmann::json j;
  j["class"] = class_name;
  j["config"] = std::move(config);
  j["original"] = key_list(t.original);
  j["diffusers"] = key_list(t.diffusers_tensors());
  nlohmann::json map = nlohmann::json::array();
  for (const auto& p : t.parameters)
    map.push_back({p.diffusers_name, p.original_name, p.row_begin, p.rows, p.swap_halves, p.transposed});
  j["map"] = map;
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

int print_sd3(const std::string& which) {
  flame::models::SD3Config c;
  if (which == "sd3-medium") {
    c = flame::models::sd3_medium_config();
  } else if (which == "tiny") {
    c = flame::models::testing::tiny_sd3_config();
  } else if (which != "sd35-medium") {
    return usage();
  }
  nlohmann::json config = {{"sample_size", c.sample_size},
                           {"patch_size", c.patch_size},
                           {"in_channels", c.in_channels},
                           {"num_layers", c.num_layers},
                           {"attention_head_dim", c.attention_head_dim},
                           {"num_attention_heads", c.num_attention_heads},
                           {"joint_attention_dim", c.joint_attention_dim},
                           {"caption_projection_dim", c.caption_projection_dim},
                           {"pooled_projection_dim", c.pooled_projection_dim},
                           {"out_channels", c.out_channels},
                           {"pos_embed_max_size", c.pos_embed_max_size},
                           {"dual_attention_layers", c.dual_attention_layers}};
  config["qk_norm"] = c.qk_norm.empty() ? nlohmann::json(nullptr) : nlohmann::json(c.qk_norm);
  return print_mapped("SD3Transformer2DModel", config, flame::models::sd3_parameter_table(c));
}

int print_vae(const std::string& which) {
  flame::models::VAEConfig c;
  if (which == "flux") {
    c = flame::models::flux_vae_config();
  } else if (which == "sd3") {
    c = flame::models::sd3_vae_config();
  } else if (which == "tiny") {
    c = flame::models::testing::tiny_vae_config();
  } else if (which != "sdxl") {
    return usage();
  }
  const size_t n = c.block_out_channels.size();
  nlohmann::json config = {{"in_channels", c.in_channels},
                           {"out_channels", c.out_channels},
                           {"down_block_types", std::vector<std::string>(n, "DownEncoderBlock2D")},
                           {"up_block_types", std::vector<std::string>(n, "UpDecoderBlock2D")},
                           {"block_out_channels", c.block_out_channels},
                           {"layers_per_block", c.layers_per_block},
                           {"latent_channels", c.latent_channels},
                           {"norm_num_groups", c.norm_num_groups},
                           {"sample_size", c.sample_size},
                           {"scaling_factor", c.scaling_factor},
                           {"use_quant_conv", c.use_quant_conv},
                           {"use_post_quant_conv", c.use_post_quant_conv},
                           {"mid_block_add_attention", c.mid_block_add_attention},
                           {"force_upcast", c.force_upcast}};
  config["shift_factor"] = c.shift_factor ? nlohmann::json(*c.shift_factor) : nlohmann::json(nullptr);
  return print_mapped("AutoencoderKL", config, flame::models::vae_parameter_table(c));
}

int print_clip(const std::string& which) {
  flame::models::ClipTextConfig c;
  if (which == "l-projection") {
    c.with_projection = true;
  } else if (which == "bigg") {
    c = flame::models::clip_bigg_config();
  } else if (which == "tiny") {
    c = flame::models::testing::tiny_clip_config();
  } else if (which != "l") {
    return usage();
  }
  nlohmann::json config = {{"vocab_size", c.vocab_size},
                           {"hidden_size", c.hidden_size},
                           {"intermediate_size", c.intermediate_size},
                           {"num_hidden_layers", c.num_hidden_layers},
                           {"num_attention_heads", c.num_attention_heads},
                           {"max_position_embeddings", c.max_position_embeddings},
                           {"hidden_act", c.hidden_act},
                           {"projection_dim", c.projection_dim}};
  return print_mapped(c.with_projection ? "CLIPTextModelWithProjection" : "CLIPTextModel", config,
                      flame::models::clip_parameter_table(c));
}

int print_t5(const std::string& which) {
  flame::models::T5Config c;
  if (which == "tiny") {
    c = flame::models::testing::tiny_t5_config();
  } else if (which != "xxl") {
    return usage();
  }
  nlohmann::json config = {{"vocab_size", c.vocab_size},
                           {"d_model", c.d_model},
                           {"d_kv", c.d_kv},
                           {"d_ff", c.d_ff},
                           {"num_layers", c.num_layers},
                           {"num_heads", c.num_heads},
                           {"relative_attention_num_buckets", c.relative_attention_num_buckets},
                           {"relative_attention_max_distance", c.relative_attention_max_distance},
                           {"feed_forward_proj", c.feed_forward_proj}};
  return print_mapped("T5EncoderModel", config, flame::models::t5_parameter_table(c));
}

// The UNet's tables, with its diffusers config.json fields.
int print_unet(const std::string& which) {
  flame::models::UNetConfig c;
  if (which == "sd15") {
    c = flame::models::sd15_unet_config();
  } else if (which == "tiny") {
    c = flame::models::testing::tiny_unet_config();
  } else if (which != "sdxl") {
    return usage();
  }
  nlohmann::json down = nlohmann::json::array(), up = nlohmann::json::array();
  for (bool a : c.down_block_has_attention) down.push_back(a ? "CrossAttnDownBlock2D" : "DownBlock2D");
  for (auto it = c.down_block_has_attention.rbegin(); it != c.down_block_has_attention.rend(); ++it)
    up.push_back(*it ? "CrossAttnUpBlock2D" : "UpBlock2D");
  nlohmann::json j;
  j["config"] = {{"in_channels", c.in_channels},
                 {"out_channels", c.out_channels},
                 {"block_out_channels", c.block_out_channels},
                 {"down_block_types", down},
                 {"up_block_types", up},
                 {"layers_per_block", c.layers_per_block},
                 {"transformer_layers_per_block", c.transformer_layers_per_block},
                 {"cross_attention_dim", c.cross_attention_dim},
                 {"use_linear_projection", c.use_linear_projection}};
  // Head counts do not change any shape; 64-wide heads as SDXL and SD 1.5 have, 8 for the tiny one.
  nlohmann::json heads = nlohmann::json::array();
  for (int64_t ch : c.block_out_channels) heads.push_back(which == "tiny" ? ch / 8 : ch / 64);
  j["config"]["attention_head_dim"] = heads;
  if (c.projection_class_embeddings_input_dim > 0) {
    j["config"]["addition_embed_type"] = "text_time";
    j["config"]["addition_time_embed_dim"] = 256;
    j["config"]["projection_class_embeddings_input_dim"] = c.projection_class_embeddings_input_dim;
  }
  nlohmann::json original = nlohmann::json::array(), diffusers = nlohmann::json::array(), map = nlohmann::json::array();
  for (const auto& p : flame::models::unet_parameters(c)) {
    original.push_back({p.original_name, p.shape});
    diffusers.push_back({p.diffusers_name, p.shape});
    map.push_back({p.diffusers_name, p.original_name, 0, p.shape.at(0), false});
  }
  j["original"] = original;
  j["diffusers"] = diffusers;
  j["map"] = map;
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) return usage();
  if (std::strcmp(argv[1], "unet") == 0) return print_unet(argv[2]);
  if (std::strcmp(argv[1], "sd3") == 0) return print_sd3(argv[2]);
  if (std::strcmp(argv[1], "vae") == 0) return print_vae(argv[2]);
  if (std::strcmp(argv[1], "clip") == 0) return print_clip(argv[2]);
  if (std::strcmp(argv[1], "t5") == 0) return print_t5(argv[2]);
  if (std::strcmp(argv[1], "flux") != 0) return usage();
  FluxConfig c;
  const std::string which = argv[2];
  if (which == "schnell") {
    c.guidance_embeds = false;
  } else if (which == "tiny") {
    c = flame::models::testing::tiny_flux_config();
  } else if (which != "dev") {
    return usage();
  }
  nlohmann::json j;
  j["config"] = {{"in_channels", c.in_channels},
                 {"out_channels", c.out_channels},
                 {"num_layers", c.num_layers},
                 {"num_single_layers", c.num_single_layers},
                 {"attention_head_dim", c.attention_head_dim},
                 {"num_attention_heads", c.num_attention_heads},
                 {"joint_attention_dim", c.joint_attention_dim},
                 {"pooled_projection_dim", c.pooled_projection_dim},
                 {"guidance_embeds", c.guidance_embeds},
                 {"axes_dims_rope", c.axes_dims_rope}};
  j["mlp_hidden_dim"] = c.mlp_hidden_dim;
  j["original"] = key_list(flame::models::flux_original_tensors(c));
  j["diffusers"] = key_list(flame::models::flux_diffusers_tensors(c));
  nlohmann::json map = nlohmann::json::array();
  for (const auto& p : flame::models::flux_parameter_map(c))
    map.push_back({p.diffusers_name, p.original_name, p.row_begin, p.rows, p.swap_halves});
  j["map"] = map;
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

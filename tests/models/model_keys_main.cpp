// flame_model_keys: prints, as JSON on stdout, what FLAME's model layer knows of a model's
// checkpoint keys, for tests/models/check_model_keys.py to compare with the real diffusers classes
// and converters on a machine that has them. Needs no GPU and no weights.
//
//   flame_model_keys flux dev|schnell|tiny
//   flame_model_keys unet sdxl|sd15|tiny
//
// Output: {"config": {...}, "original": [[name, [shape]], ...], "diffusers": [[name, [shape]], ...],
//          "map": [[diffusers_name, original_name, row_begin, rows, swap_halves], ...]}
// (for the UNet every parameter is one whole stored tensor: row_begin 0, all rows, no swap).
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "model_configs.h"
#include "models/flux_keys.h"
#include "models/unet_keys.h"

using flame::models::FluxConfig;
using flame::models::KeyShape;

namespace {

nlohmann::json key_list(const std::vector<KeyShape>& keys) {
  nlohmann::json out = nlohmann::json::array();
  for (const KeyShape& k : keys) out.push_back({k.name, k.shape});
  return out;
}

int usage() {
  std::fprintf(stderr, "usage: flame_model_keys flux dev|schnell|tiny\n       flame_model_keys unet sdxl|sd15|tiny\n");
  return 1;
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

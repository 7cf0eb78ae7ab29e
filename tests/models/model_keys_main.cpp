// flame_model_keys: prints, as JSON on stdout, what FLAME's model layer knows of a model's
// checkpoint keys, for tests/models/check_model_keys.py to compare with the real diffusers classes
// and converters on a machine that has them. Needs no GPU and no weights.
//
//   flame_model_keys flux dev|schnell|tiny
//
// Output: {"config": {...}, "original": [[name, [shape]], ...], "diffusers": [[name, [shape]], ...],
//          "map": [[diffusers_name, original_name, row_begin, rows, swap_halves], ...]}
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "models/flux_keys.h"

using flame::models::FluxConfig;
using flame::models::KeyShape;

namespace {

nlohmann::json key_list(const std::vector<KeyShape>& keys) {
  nlohmann::json out = nlohmann::json::array();
  for (const KeyShape& k : keys) out.push_back({k.name, k.shape});
  return out;
}

int usage() {
  std::fprintf(stderr, "usage: flame_model_keys flux dev|schnell|tiny\n");
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || std::strcmp(argv[1], "flux") != 0) return usage();
  FluxConfig c;
  const std::string which = argv[2];
  if (which == "schnell") {
    c.guidance_embeds = false;
  } else if (which == "tiny") {
    c.in_channels = c.out_channels = 16;
    c.num_layers = 2;
    c.num_single_layers = 3;
    c.attention_head_dim = 16;
    c.num_attention_heads = 2;
    c.joint_attention_dim = 40;
    c.pooled_projection_dim = 24;
    c.mlp_hidden_dim = 128;
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

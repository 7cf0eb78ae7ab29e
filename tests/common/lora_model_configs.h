// Full-size config.json contents of the models LoRA files target (Flux-dev, SDXL base, SD 1.5,
// SD3.5-medium, CLIP-L, OpenCLIP bigG, T5-XXL), with the class and pipeline slot each sits in, for the
// LoRA format tests (tests/cpu/test_lora_format.cpp) and the plan dump tool (tests/models/lora_plan_main.cpp).
#pragma once
#include <stdexcept>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

namespace flame::models::testing {

struct LoraTestModel {
  std::string name;        // "flux", "sdxl", "sd15", "sd3", "clip_l", "clip_g", "t5"
  std::string class_name;  // diffusers / transformers class
  std::string component;   // pipeline slot
  nlohmann::json config;
};

inline std::vector<LoraTestModel> lora_test_models() {
  using nlohmann::json;
  const json flux = {{"_class_name", "FluxTransformer2DModel"}, {"patch_size", 1}, {"in_channels", 64},
                     {"num_layers", 19}, {"num_single_layers", 38}, {"attention_head_dim", 128},
                     {"num_attention_heads", 24}, {"joint_attention_dim", 4096}, {"pooled_projection_dim", 768},
                     {"guidance_embeds", true}, {"axes_dims_rope", {16, 56, 56}}};
  const json sdxl = {{"_class_name", "UNet2DConditionModel"}, {"in_channels", 4}, {"out_channels", 4},
                     {"block_out_channels", {320, 640, 1280}},
                     {"down_block_types", {"DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"}},
                     {"up_block_types", {"CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"}},
                     {"mid_block_type", "UNetMidBlock2DCrossAttn"}, {"layers_per_block", 2},
                     {"cross_attention_dim", 2048}, {"transformer_layers_per_block", {1, 2, 10}},
                     {"use_linear_projection", true}, {"attention_head_dim", {5, 10, 20}},
                     {"addition_embed_type", "text_time"}, {"addition_time_embed_dim", 256},
                     {"projection_class_embeddings_input_dim", 2816}};
  const json sd15 = {{"_class_name", "UNet2DConditionModel"}, {"in_channels", 4}, {"out_channels", 4},
                     {"block_out_channels", {320, 640, 1280, 1280}},
                     {"down_block_types", {"CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"}},
                     {"up_block_types", {"UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"}},
                     {"layers_per_block", 2}, {"cross_attention_dim", 768}, {"attention_head_dim", 8}};
  const json sd3 = {{"_class_name", "SD3Transformer2DModel"}, {"sample_size", 128}, {"patch_size", 2},
                    {"in_channels", 16}, {"num_layers", 24}, {"attention_head_dim", 64}, {"num_attention_heads", 24},
                    {"joint_attention_dim", 4096}, {"caption_projection_dim", 1536}, {"pooled_projection_dim", 2048},
                    {"out_channels", 16}, {"pos_embed_max_size", 384}, {"qk_norm", "rms_norm"},
                    {"dual_attention_layers", {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}}};
  const json clip_l = {{"architectures", {"CLIPTextModel"}}, {"vocab_size", 49408}, {"hidden_size", 768},
                       {"intermediate_size", 3072}, {"num_hidden_layers", 12}, {"num_attention_heads", 12},
                       {"max_position_embeddings", 77}, {"hidden_act", "quick_gelu"}, {"projection_dim", 768}};
  const json clip_g = {{"architectures", {"CLIPTextModelWithProjection"}}, {"vocab_size", 49408}, {"hidden_size", 1280},
                       {"intermediate_size", 5120}, {"num_hidden_layers", 32}, {"num_attention_heads", 20},
                       {"max_position_embeddings", 77}, {"hidden_act", "gelu"}, {"projection_dim", 1280}};
  const json t5 = {{"architectures", {"T5EncoderModel"}}, {"vocab_size", 32128}, {"d_model", 4096}, {"d_kv", 64},
                   {"d_ff", 10240}, {"num_layers", 24}, {"num_heads", 64}, {"relative_attention_num_buckets", 32},
                   {"feed_forward_proj", "gated-gelu"}};
  return {{"flux", "FluxTransformer2DModel", "transformer", flux},
          {"sdxl", "UNet2DConditionModel", "unet", sdxl},
          {"sd15", "UNet2DConditionModel", "unet", sd15},
          {"sd3", "SD3Transformer2DModel", "transformer", sd3},
          {"clip_l", "CLIPTextModel", "text_encoder", clip_l},
          {"clip_g", "CLIPTextModelWithProjection", "text_encoder_2", clip_g},
          {"t5", "T5EncoderModel", "text_encoder_3", t5}};
}

inline LoraTestModel lora_test_model(const std::string& name) {
  for (const LoraTestModel& m : lora_test_models())
    if (m.name == name) return m;
  throw std::invalid_argument("no LoRA test model named " + name);
}

}  // namespace flame::models::testing

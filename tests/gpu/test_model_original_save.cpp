// flame_model_save in the original single-file layouts, through the C ABI: tiny models of every
// family (Flux, UNet SDXL, SD3.5, both VAEs, CLIP-L and bigG-style CLIP with projection, T5) get
// distinct values in every parameter (so that a swapped half, a transposition or a wrong third of a
// fused tensor cannot go unnoticed), are saved in each original layout, and loaded back with
// flame_model_load, which detects the architecture and layout from the file: every parameter must
// come back bit-identical under the same name. Layouts a class lacks fail, leaving no file.
#include <sys/stat.h>
#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include "flame_test.h"
#include "model_test_handles.h"

namespace {

class ModelOriginalSave : public GpuTest {};




// Every parameter filled with values unique across the model (f32 parameters).
void fill_distinct(flame_model_t m) {
  ParamsHandle ps;
  ASSERT_EQ(flame_model_params(m, &ps.p), FLAME_OK);
  int64_t count = 0;
  ASSERT_EQ(flame_params_count(ps.p, &count), FLAME_OK);
  uint32_t state = 12345;
  for (int64_t i = 0; i < count; ++i) {
    flame_tensor_t t = nullptr;
    ASSERT_EQ(flame_params_tensor(ps.p, i, &t), FLAME_OK);
    int64_t n = 0;
    ASSERT_EQ(flame_tensor_numel(t, &n), FLAME_OK);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) {
      state = state * 1664525u + 1013904223u;
      x = static_cast<float>(state >> 8) / 16777216.0f - 0.5f;
    }
    ASSERT_EQ(flame_copy_from_host(t, v.data(), v.size() * sizeof(float)), FLAME_OK) << flame_last_error_message();
  }
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::string temp_path(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir && *dir ? dir : "/tmp") + "/flame_orig_save_" + std::to_string(::getpid()) + "_" + name;
}

// Creates arch with config, saves it in layout, loads it back (the config given, since some of it is
// not stored in weights; the layout and the parameters' sources are detected) and compares.
void expect_round_trip(flame_ctx_t ctx, const char* arch, const std::string& config, const char* layout) {
  SCOPED_TRACE(std::string(arch) + " in layout " + layout);
  ModelHandle model;
  ASSERT_EQ(flame_model_create(ctx, arch, config.c_str(), nullptr, &model.m), FLAME_OK) << flame_last_error_message();
  fill_distinct(model.m);
  const std::string path = temp_path(std::string(arch) + "_" + layout + ".safetensors");
  ASSERT_EQ(flame_model_save(model.m, path.c_str(), layout), FLAME_OK) << flame_last_error_message();
  ModelHandle loaded;
  const std::string options = R"({"config": )" + config + "}";
  const flame_status_t st = flame_model_load(ctx, path.c_str(), options.c_str(), &loaded.m);
  std::remove(path.c_str());
  ASSERT_EQ(st, FLAME_OK) << flame_last_error_message();
  const char* name = nullptr;
  ASSERT_EQ(flame_model_architecture(loaded.m, &name), FLAME_OK);
  EXPECT_STREQ(name, arch);
  ParamsHandle a, b;
  ASSERT_EQ(flame_model_params(model.m, &a.p), FLAME_OK);
  ASSERT_EQ(flame_model_params(loaded.m, &b.p), FLAME_OK);
  int64_t na = 0, nb = 0;
  ASSERT_EQ(flame_params_count(a.p, &na), FLAME_OK);
  ASSERT_EQ(flame_params_count(b.p, &nb), FLAME_OK);
  ASSERT_EQ(na, nb);
  for (int64_t i = 0; i < na; ++i) {
    const char *pa = nullptr, *pb = nullptr;
    flame_tensor_t ta = nullptr, tb = nullptr;
    ASSERT_EQ(flame_params_name(a.p, i, &pa), FLAME_OK);
    ASSERT_EQ(flame_params_name(b.p, i, &pb), FLAME_OK);
    ASSERT_STREQ(pa, pb);
    ASSERT_EQ(flame_params_tensor(a.p, i, &ta), FLAME_OK);
    ASSERT_EQ(flame_params_tensor(b.p, i, &tb), FLAME_OK);
    const std::vector<float> va = host_of(ta), vb = host_of(tb);
    ASSERT_EQ(va.size(), vb.size()) << pa;
    EXPECT_EQ(std::memcmp(va.data(), vb.data(), va.size() * sizeof(float)), 0) << pa << " differs after the round trip";
  }
}

const char* const kFlux =
    R"({"num_layers": 2, "num_single_layers": 2, "attention_head_dim": 16, "num_attention_heads": 2,
        "in_channels": 16, "joint_attention_dim": 24, "pooled_projection_dim": 20, "guidance_embeds": true,
        "axes_dims_rope": [4, 6, 6]})";
const char* const kUnetSdxl = R"({"block_out_channels": [32, 48, 64], "layers_per_block": 2,
  "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
  "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
  "transformer_layers_per_block": [1, 2, 3], "attention_head_dim": [1, 2, 4], "cross_attention_dim": 40,
  "use_linear_projection": true, "norm_num_groups": 8, "addition_embed_type": "text_time",
  "addition_time_embed_dim": 8, "projection_class_embeddings_input_dim": 72})";
const char* const kSD35 =
    R"({"sample_size": 8, "patch_size": 2, "in_channels": 4, "num_layers": 3, "attention_head_dim": 8,
        "num_attention_heads": 4, "joint_attention_dim": 24, "caption_projection_dim": 32,
        "pooled_projection_dim": 20, "out_channels": 4, "pos_embed_max_size": 12,
        "dual_attention_layers": [0, 2], "qk_norm": "rms_norm"})";
const char* const kVae = R"({"block_out_channels": [16, 24, 32], "layers_per_block": 1,
      "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"],
      "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"], "norm_num_groups": 8,
      "latent_channels": 4})";
const char* const kVae16 = R"({"block_out_channels": [16, 24, 32], "layers_per_block": 1,
      "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"],
      "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"], "norm_num_groups": 8,
      "latent_channels": 16, "use_quant_conv": false, "use_post_quant_conv": false})";
// CLIP widths are multiples of 64: the loader's detection assumes 64-wide heads.
const char* const kClip = R"({"vocab_size": 100, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
      "num_attention_heads": 1, "max_position_embeddings": 16})";
const char* const kClipProjection = R"({"vocab_size": 100, "hidden_size": 128, "intermediate_size": 160,
      "num_hidden_layers": 2, "num_attention_heads": 2, "max_position_embeddings": 16, "projection_dim": 48,
      "hidden_act": "gelu"})";
const char* const kT5 = R"({"vocab_size": 100, "d_model": 32, "d_kv": 8, "d_ff": 48, "num_layers": 2, "num_heads": 4,
      "relative_attention_num_buckets": 8, "relative_attention_max_distance": 16, "feed_forward_proj": "gated-gelu"})";

}  // namespace

TEST_F(ModelOriginalSave, FluxBflAndComfyUI) {
  expect_round_trip(ctx, "FluxTransformer2DModel", kFlux, "original");
  expect_round_trip(ctx, "FluxTransformer2DModel", kFlux, "comfyui");
}

TEST_F(ModelOriginalSave, UNetSdxl) { expect_round_trip(ctx, "UNet2DConditionModel", kUnetSdxl, "original"); }

TEST_F(ModelOriginalSave, SD35) { expect_round_trip(ctx, "SD3Transformer2DModel", kSD35, "original"); }

TEST_F(ModelOriginalSave, AutoencoderKL) {
  expect_round_trip(ctx, "AutoencoderKL", kVae, "original");
  expect_round_trip(ctx, "AutoencoderKL", kVae16, "bfl");
}

TEST_F(ModelOriginalSave, TextEncoders) {
  expect_round_trip(ctx, "CLIPTextModel", kClip, "original");
  expect_round_trip(ctx, "CLIPTextModel", kClip, "sd3");
  expect_round_trip(ctx, "CLIPTextModelWithProjection", kClipProjection, "original");  // OpenCLIP names
  expect_round_trip(ctx, "T5EncoderModel", kT5, "original");
  expect_round_trip(ctx, "T5EncoderModel", kT5, "comfyui");
}

TEST_F(ModelOriginalSave, LayoutsAClassLacksFailAndWriteNothing) {
  ModelHandle clip;
  ASSERT_EQ(flame_model_create(ctx, "CLIPTextModel", kClip, nullptr, &clip.m), FLAME_OK);
  const std::string path = temp_path("bad.safetensors");
  EXPECT_EQ(flame_model_save(clip.m, path.c_str(), "bfl"), FLAME_ERROR_INVALID_ARGUMENT);
  const std::string msg = flame_last_error_message();
  EXPECT_NE(msg.find("bfl"), std::string::npos) << msg;
  EXPECT_NE(msg.find("CLIPTextModel"), std::string::npos) << msg;
  // A width the loader could not read back (32 is no multiple of CLIP's 64-wide heads).
  ModelHandle narrow;
  ASSERT_EQ(flame_model_create(ctx, "CLIPTextModel", R"({"hidden_size": 32, "num_attention_heads": 4,
      "intermediate_size": 64, "num_hidden_layers": 1, "vocab_size": 50, "max_position_embeddings": 8})", nullptr,
                               &narrow.m),
            FLAME_OK);
  EXPECT_EQ(flame_model_save(narrow.m, path.c_str(), "original"), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_FALSE(file_exists(path));
}

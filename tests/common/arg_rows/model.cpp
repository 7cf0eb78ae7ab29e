// Argument-matrix rows (tests/common/arg_matrix.h) for models. a.model is a tiny CLIPTextModel;
// a.model_path a file it saved; the JSON arguments that may be NULL by contract are given as
// literals (never NULLed by the sweeps).
#include "arg_matrix.h"

namespace {
using namespace argm;

FLAME_ARG_ROW(flame_model_known_architectures, a.out_str("names"));
FLAME_ARG_ROW(flame_model_create, a.ctx("ctx"), a.str("architecture", "CLIPTextModel"), Args::kTinyModelConfig,
              "{\"dtype\": \"f32\"}", a.out_model("model"));
FLAME_ARG_ROW(flame_model_estimate_memory,
              a.str("request_json", "{\"architecture\": \"FluxTransformer2DModel\", \"config\": {\"num_layers\": 1, "
                                    "\"num_single_layers\": 1, \"attention_head_dim\": 16, \"num_attention_heads\": 2, "
                                    "\"joint_attention_dim\": 32, \"pooled_projection_dim\": 16, \"in_channels\": 16, "
                                    "\"axes_dims_rope\": [4, 6, 6]}, \"height\": 64, \"width\": 64}"),
              a.estimate("estimate"));
FLAME_ARG_ROW(flame_model_load, a.ctx("ctx"), a.model_path("path"), Args::kTinyModelOptions, a.out_model("model"));
FLAME_ARG_ROW(flame_model_save, a.model("model"), a.out_path("path"), "diffusers");
FLAME_ARG_VOID(flame_model_release, a.release_model("model"));
FLAME_ARG_ROW(flame_model_architecture, a.model("model"), a.out_str("name"));
FLAME_ARG_ROW(flame_model_config, a.model("model"), a.out_str("config_json"));
FLAME_ARG_ROW(flame_model_params, a.model("model"), a.out_params("params"));
FLAME_ARG_ROW(flame_model_forward, a.model("model"), a.model_inputs("inputs"), a.out_params("outputs"));
FLAME_ARG_ROW(flame_model_set_training, a.model("model"), 1);
FLAME_ARG_ROW(flame_model_set_checkpointing, a.model("model"), 1);
FLAME_ARG_ROW(flame_model_add_lora, a.model("model"), "{\"rank\": 2}", a.out_params("adapter_params"));
FLAME_ARG_ROW(flame_model_lora_params, a.lora_model("model"), "default", a.out_params("adapter_params"));
FLAME_ARG_ROW(flame_model_save_lora, a.lora_model("model"), "default", a.out_path("path"), "{\"format\": \"peft\"}");
FLAME_ARG_ROW(flame_model_load_lora, a.model("model"), a.lora_path("path"), "{\"name\": \"loaded\"}",
              a.out_params("adapter_params"));
FLAME_ARG_ROW(flame_model_remove_lora, a.lora_model("model"), "default");
FLAME_ARG_ROW(flame_model_merge_lora, a.lora_model("model"), "default");

}  // namespace

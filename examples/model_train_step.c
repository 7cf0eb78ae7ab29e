/*
 * model_train_step.c - a few training steps of a real model architecture from C: load a model file
 * or folder with flame_model_load, freeze it except for the parameters a diffusion fine-tune trains,
 * build random inputs from the architecture's configuration, and run forward, a diffusion-style
 * loss, backward and AdamW steps, printing the loss, the step time and the peak memory of each step.
 *
 *   load     --model PATH: whatever flame_model_load takes (a diffusers / transformers model
 *            folder, a pipeline folder with --component, a single .safetensors file), in --dtype
 *            (default: the loader's choice, bf16 for 16-bit files). Without --model the program is
 *            self-contained: it makes a tiny CLIPTextModel and a tiny SDXL-shaped
 *            UNet2DConditionModel (flame_model_create, small configs), writes each as a diffusers
 *            model folder under a temporary directory (config.json naming the class, then the
 *            weights through flame_model_save), loads them back with flame_model_load (options
 *            {"architecture": ..., "config": ...}), trains both and removes the folder.
 *   train    --train attention (default): the attention projections' weights (to_q / to_k / to_v /
 *            to_out.0 of diffusers' attention blocks, Flux's add_*_proj / to_add_out,
 *            CLIP's q/k/v/out_proj, T5's SelfAttention q/k/v/o), as attention-only fine-tunes
 *            (Custom Diffusion) do; every other parameter is frozen with
 *            flame_tensor_set_requires_grad(p, 0). --train all: every parameter (a full fine-tune).
 *            Why not LoRA: flame_lora_t wraps a weight for the caller's own flame_lora_forward, and
 *            flame_model_forward has no way yet to route a model's projection through an adapter,
 *            so the layers LoRA would target are trained themselves (AdamW, with f32 master weights
 *            for bf16 / f16 parameters). --checkpoint N checkpoints every N-th block.
 *   inputs   batch 1, random normal floats from the context's generator, shapes from the model's
 *            complete configuration (flame_model_config). C has no JSON library, so the few numbers
 *            needed are read with a minimal lookup (json_number below: the first "key": value in
 *            the text; the configurations are flat objects, which is all it handles):
 *              UNet2DConditionModel    sample [1, in_channels, S, S] (S = --size), timestep [1],
 *                                      encoder_hidden_states [1, T, cross_attention_dim] (T = --tokens);
 *                                      with addition_embed_type "text_time" (SDXL) text_embeds [1, P]
 *                                      and time_ids [1, K]: K = 5 for the refiner's layout
 *                                      (projection_class_embeddings_input_dim - 5 *
 *                                      addition_time_embed_dim == cross_attention_dim), else 6 (base),
 *                                      P the rest of projection_class_embeddings_input_dim
 *              FluxTransformer2DModel  hidden_states [1, (S/2)^2, in_channels] (packed 2x2 latents),
 *                                      encoder_hidden_states [1, T, joint_attention_dim],
 *                                      pooled_projections [1, pooled_projection_dim], timestep [1] in
 *                                      [0, 1], img_ids [(S/2)^2, 3] (0, row, column), txt_ids [T, 3]
 *                                      zero, guidance [1] when guidance_embeds (diffusers' forward)
 *              SD3Transformer2DModel   hidden_states [1, in_channels, S, S], encoder_hidden_states
 *                                      [1, T, joint_attention_dim], pooled_projections [1,
 *                                      pooled_projection_dim], timestep [1]
 *              CLIPTextModel(WithProjection), T5EncoderModel   input_ids [1, T] (T at most
 *                                      max_position_embeddings for CLIP), token ids below vocab_size
 *              AutoencoderKL           sample [1, in_channels, S, S], an "image"
 *   loss     MSE (f32) of the output "sample" against a random target fixed for the run (the noise
 *            a diffusion model predicts); text encoders: the mean of last_hidden_state squared;
 *            AutoencoderKL: reconstruction, the image encoded, a latent drawn from the posterior
 *            (mean + exp(logvar / 2) * noise) and decoded, MSE against the image (no KL term).
 *   save     --save OUT: the model after training through flame_model_save (diffusers' names; it
 *            loads back with flame_model_load); self-contained, the tiny UNet.
 *
 * Claims, checked for every model (exit status 1 when one fails): every loss is finite, a trained
 * parameter changed and a frozen one did not. Exit status: 0 when they hold, 1 on a FLAME error (the
 * library's message is printed) or a failed claim, 2 without a GPU or driver.
 *
 *   model_train_step [--model PATH] [--component NAME] [--dtype bf16|f32] [--train attention|all]
 *                    [--steps N] [--lr X] [--checkpoint N] [--size S] [--tokens T] [--seed S]
 *                    [--save OUT.safetensors]
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime and mkdtemp under strict C99 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sys/stat.h> /* mkdir (POSIX) */

#define EXAMPLE_NAME "model_train_step" /* example_check.h: the prefix of error messages */
#include "flame.h"
#include "example_check.h" /* DO(): first-failure error chaining, handle scopes */
#include "example_args.h"  /* the options table: --help, --version, errors naming the option */

#define EXIT_NO_GPU 2
#define MAX_INPUT_DIMS 8

/* Records a failure found by this program (not by the library) with its own message. */
static void fail_here(check* s, flame_status_t st, const char* what) {
  if (s->st != FLAME_OK) return;
  s->st = st;
  s->where = "a check of the example";
  snprintf(s->msg, sizeof s->msg, "%s", what);
}

typedef struct config {
  const char* model;     /* NULL: self-contained (tiny models) */
  const char* component; /* pipeline folders and multi-component single files */
  const char* dtype;     /* NULL: the loader's default */
  const char* train;     /* "attention" or "all" */
  const char* save;
  int steps, checkpoint, size, tokens;
  double lr;
  uint64_t seed;
} config;

/* The tiny models of the self-contained mode: an SDXL-shaped UNet (text_time embedding, linear
 * projections) whose cross-attention width is the tiny CLIP's hidden size. */
static const char* const kTinyClipConfig =
    "{\"vocab_size\": 1000, \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2,"
    " \"num_attention_heads\": 4, \"max_position_embeddings\": 77, \"projection_dim\": 32}";
static const char* const kTinyUnetConfig =
    "{\"block_out_channels\": [32, 64], \"layers_per_block\": 1,"
    " \"down_block_types\": [\"CrossAttnDownBlock2D\", \"DownBlock2D\"],"
    " \"up_block_types\": [\"UpBlock2D\", \"CrossAttnUpBlock2D\"], \"attention_head_dim\": 2,"
    " \"cross_attention_dim\": 64, \"norm_num_groups\": 8, \"use_linear_projection\": true,"
    " \"addition_embed_type\": \"text_time\", \"addition_time_embed_dim\": 8,"
    " \"projection_class_embeddings_input_dim\": 80, \"sample_size\": 16}";

/* ---- the command line ---- */

static int parse_args(int argc, char** argv, config* cfg) {
  const example_arg args[] = {
      {"--model", ARG_STRING, &cfg->model, "PATH", "model file or folder (flame_model_load)", 0, 0,
       "none: tiny CLIP and UNet made, saved and loaded here"},
      {"--component", ARG_STRING, &cfg->component, "NAME", "component of a pipeline folder or single file (unet, transformer, vae, text_encoder, ...)", 0, 0, NULL},
      {"--dtype", ARG_STRING, &cfg->dtype, "bf16|f32", "parameter dtype", 0, 0, "the loader's: bf16 for 16-bit files, else f32"},
      {"--train", ARG_STRING, &cfg->train, "attention|all", "parameters trained: attention projections or all", 0, 0, NULL},
      {"--steps", ARG_INT, &cfg->steps, "N", "training steps per model", 1, 0, NULL},
      {"--lr", ARG_POSITIVE_DOUBLE, &cfg->lr, "X", "AdamW learning rate", 0, 0, NULL},
      {"--checkpoint", ARG_INT, &cfg->checkpoint, "N", "gradient checkpointing of every N-th block (0: off)", 0, 0, NULL},
      {"--size", ARG_INT, &cfg->size, "S", "height and width of the random sample (latent; the VAE's image)", 2, 4096, NULL},
      {"--tokens", ARG_INT, &cfg->tokens, "T", "text length (text encoders, encoder_hidden_states)", 1, 4096, NULL},
      {"--seed", ARG_U64, &cfg->seed, "S", "seed of the context's generator", 0, 0, NULL},
      {"--save", ARG_STRING, &cfg->save, "OUT.safetensors", "write the trained model there (flame_model_save)", 0, 0, NULL}};
  const example_cli cli = {
      "model_train_step",
      "loads a model (or makes tiny ones), freezes it but its attention projections, and runs AdamW training steps",
      args, (int)(sizeof args / sizeof args[0]),
      "Without --model the program needs no file: it creates a tiny CLIPTextModel and a tiny SDXL-shaped\n"
      "UNet2DConditionModel, writes each as a diffusers model folder in a temporary directory, loads them\n"
      "back with flame_model_load and trains both. Architectures: UNet2DConditionModel, FluxTransformer2DModel,\n"
      "SD3Transformer2DModel, AutoencoderKL, CLIPTextModel(WithProjection), T5EncoderModel.\n"
      "Exit status: 0 when every loss is finite, trained parameters moved and frozen ones did not;\n"
      "1 on an error or a failed check; 2 without a GPU.\n"
      "Example: model_train_step --model sdxl/ --component unet --dtype bf16 --checkpoint 1 --steps 3"};
  int rc = example_parse_args(&cli, argc, argv);
  if (rc != EXAMPLE_ARGS_RUN) return rc;
  if (cfg->dtype && strcmp(cfg->dtype, "bf16") && strcmp(cfg->dtype, "f32"))
    return example_arg_fail(&cli, "--dtype", "expected bf16 or f32, got '%s'", cfg->dtype);
  if (strcmp(cfg->train, "attention") && strcmp(cfg->train, "all"))
    return example_arg_fail(&cli, "--train", "expected attention or all, got '%s'", cfg->train);
  if (cfg->component && !cfg->model)
    return example_arg_fail(&cli, "--component", "needs --model (the tiny models have no components)");
  return EXAMPLE_ARGS_RUN;
}

/* ---- configuration values (a minimal JSON lookup) ---- */

/* The value after the first "key": in a flat JSON object's text, or NULL. */
static const char* json_value(const char* json, const char* key) {
  size_t n = strlen(key);
  const char* p = json;
  while ((p = strchr(p, '"')) != NULL) {
    const char* q = p + 1;
    if (!strncmp(q, key, n) && q[n] == '"') {
      q += n + 1;
      while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r') ++q;
      if (*q == ':') {
        ++q;
        while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r') ++q;
        return q;
      }
    }
    p += 1;
  }
  return NULL;
}

/* The number under key, else fallback (missing key, null, or not a number such as a list). */
static double json_number(const char* json, const char* key, double fallback) {
  const char* v = json_value(json, key);
  char* end = NULL;
  double d;
  if (!v) return fallback;
  d = strtod(v, &end);
  return end == v ? fallback : d;
}

/* 1 when key's value is true. */
static int json_true(const char* json, const char* key) {
  const char* v = json_value(json, key);
  return v && !strncmp(v, "true", 4);
}

/* 1 when key's value is the string text. */
static int json_string_is(const char* json, const char* key, const char* text) {
  const char* v = json_value(json, key);
  size_t n = strlen(text);
  return v && *v == '"' && !strncmp(v + 1, text, n) && v[1 + n] == '"';
}

/* ---- inputs ---- */

/* Adds a random normal f32 tensor of shape to inputs (the handle belongs to the open scope). */
static void add_randn(check* s, flame_ctx_t ctx, flame_params_t inputs, const char* name, const int64_t* shape, int32_t ndim) {
  flame_tensor_t t;
  DO(s, t, flame_randn(ctx, shape, ndim, FLAME_DTYPE_F32, &t));
  if (s->st == FLAME_OK) check_fail(s, flame_params_add(inputs, name, t), "flame_params_add");
}

/* Adds a tensor of host values (f32 or i64) to inputs. */
static void add_host(check* s, flame_ctx_t ctx, flame_params_t inputs, const char* name, const void* data, size_t nbytes,
                     const int64_t* shape, int32_t ndim, flame_dtype_t dtype) {
  flame_tensor_t t;
  DO(s, t, flame_from_host(ctx, data, nbytes, shape, ndim, dtype, &t));
  if (s->st == FLAME_OK) check_fail(s, flame_params_add(inputs, name, t), "flame_params_add");
}

/* input_ids [1, T]: fixed pseudo-random token ids below vocab. */
static void add_token_ids(check* s, flame_ctx_t ctx, flame_params_t inputs, int64_t tokens, int64_t vocab) {
  int64_t shape[2] = {1, tokens}, i;
  int64_t* ids = (int64_t*)malloc((size_t)tokens * sizeof *ids);
  if (!ids) {
    fail_here(s, FLAME_ERROR_OUT_OF_MEMORY, "out of host memory for input_ids");
    return;
  }
  for (i = 0; i < tokens; ++i) ids[i] = (i * 7919 + 13) % vocab;
  add_host(s, ctx, inputs, "input_ids", ids, (size_t)tokens * sizeof *ids, shape, 2, FLAME_DTYPE_I64);
  free(ids);
}

static int64_t positive_or(double v, int64_t fallback) { return v >= 1 ? (int64_t)v : fallback; }

/* The UNet's inputs, SDXL's added conditions included when the config asks for them. */
static int unet_inputs(check* s, flame_ctx_t ctx, const char* json, const config* cfg, flame_params_t in) {
  const int64_t c = positive_or(json_number(json, "in_channels", 4), 4);
  const int64_t cross = positive_or(json_number(json, "cross_attention_dim", 1280), 1280);
  const int64_t sample[4] = {1, c, cfg->size, cfg->size}, text[3] = {1, cfg->tokens, cross}, one = 1;
  const int64_t timestep = 500;
  add_randn(s, ctx, in, "sample", sample, 4);
  add_host(s, ctx, in, "timestep", &timestep, sizeof timestep, &one, 1, FLAME_DTYPE_I64);
  add_randn(s, ctx, in, "encoder_hidden_states", text, 3);
  if (json_string_is(json, "addition_embed_type", "text_time")) {
    const int64_t ted = (int64_t)json_number(json, "addition_time_embed_dim", 0);
    const int64_t proj = (int64_t)json_number(json, "projection_class_embeddings_input_dim", 0);
    const int64_t k = proj - 5 * ted == cross ? 5 : 6; /* refiner: 5 time ids, base: 6 */
    const int64_t p = proj - k * ted;
    const float px = (float)(8 * cfg->size);
    /* base: original size, crop top-left, target size; refiner: original size, crop, aesthetic score */
    const float base_ids[6] = {px, px, 0, 0, px, px}, refiner_ids[5] = {px, px, 0, 0, 6.0f};
    const int64_t embeds[2] = {1, p}, ids[2] = {1, k};
    if (ted <= 0 || p <= 0) {
      fprintf(stderr, "model_train_step: UNet config: addition_time_embed_dim %lld and projection_class_embeddings_input_dim %lld leave no room for text_embeds\n",
              (long long)ted, (long long)proj);
      return 1;
    }
    add_randn(s, ctx, in, "text_embeds", embeds, 2);
    add_host(s, ctx, in, "time_ids", k == 5 ? (const void*)refiner_ids : (const void*)base_ids, (size_t)k * sizeof(float), ids, 2,
             FLAME_DTYPE_F32);
  }
  return 0;
}

/* Flux's inputs as diffusers' FluxTransformer2DModel.forward takes them (packed 2x2 latents). */
static int flux_inputs(check* s, flame_ctx_t ctx, const char* json, const config* cfg, flame_params_t in) {
  const int64_t c = positive_or(json_number(json, "in_channels", 64), 64);
  const int64_t joint = positive_or(json_number(json, "joint_attention_dim", 4096), 4096);
  const int64_t pooled = positive_or(json_number(json, "pooled_projection_dim", 768), 768);
  const int64_t side = cfg->size / 2 > 0 ? cfg->size / 2 : 1, seq = side * side, T = cfg->tokens;
  const int64_t hidden[3] = {1, seq, c}, text[3] = {1, T, joint}, pool[2] = {1, pooled}, one = 1;
  const int64_t img_shape[2] = {seq, 3}, txt_shape[2] = {T, 3};
  const float timestep = 0.5f, guidance = 3.5f; /* the pipeline's t / 1000 and guidance scale */
  float* img_ids = (float*)calloc((size_t)seq * 3, sizeof(float));
  float* txt_ids = (float*)calloc((size_t)T * 3, sizeof(float));
  int64_t i;
  if (!img_ids || !txt_ids) {
    free(img_ids);
    free(txt_ids);
    fail_here(s, FLAME_ERROR_OUT_OF_MEMORY, "out of host memory for img_ids / txt_ids");
    return 0;
  }
  for (i = 0; i < seq; ++i) {
    img_ids[3 * i + 1] = (float)(i / side);
    img_ids[3 * i + 2] = (float)(i % side);
  }
  add_randn(s, ctx, in, "hidden_states", hidden, 3);
  add_randn(s, ctx, in, "encoder_hidden_states", text, 3);
  add_randn(s, ctx, in, "pooled_projections", pool, 2);
  add_host(s, ctx, in, "timestep", &timestep, sizeof timestep, &one, 1, FLAME_DTYPE_F32);
  add_host(s, ctx, in, "img_ids", img_ids, (size_t)seq * 3 * sizeof(float), img_shape, 2, FLAME_DTYPE_F32);
  add_host(s, ctx, in, "txt_ids", txt_ids, (size_t)T * 3 * sizeof(float), txt_shape, 2, FLAME_DTYPE_F32);
  if (json_true(json, "guidance_embeds"))
    add_host(s, ctx, in, "guidance", &guidance, sizeof guidance, &one, 1, FLAME_DTYPE_F32);
  free(img_ids);
  free(txt_ids);
  return 0;
}

/* SD3's inputs as diffusers' SD3Transformer2DModel.forward takes them. */
static int sd3_inputs(check* s, flame_ctx_t ctx, const char* json, const config* cfg, flame_params_t in) {
  const int64_t c = positive_or(json_number(json, "in_channels", 16), 16);
  const int64_t joint = positive_or(json_number(json, "joint_attention_dim", 4096), 4096);
  const int64_t pooled = positive_or(json_number(json, "pooled_projection_dim", 2048), 2048);
  const int64_t sample[4] = {1, c, cfg->size, cfg->size}, text[3] = {1, cfg->tokens, joint}, pool[2] = {1, pooled}, one = 1;
  const float timestep = 500.0f;
  add_randn(s, ctx, in, "hidden_states", sample, 4);
  add_randn(s, ctx, in, "encoder_hidden_states", text, 3);
  add_randn(s, ctx, in, "pooled_projections", pool, 2);
  add_host(s, ctx, in, "timestep", &timestep, sizeof timestep, &one, 1, FLAME_DTYPE_F32);
  return 0;
}

/* The model's random inputs into the new list *inputs; 0 on success (else a failure in s or a message). */
static int build_inputs(check* s, flame_ctx_t ctx, const char* arch, const char* json, const config* cfg, flame_params_t* inputs) {
  flame_scope_t scope;
  int rc = 0;
  check_fail(s, flame_params_create(ctx, inputs), "flame_params_create");
  begin_scope(s, ctx, &scope); /* the list keeps the inputs; the scope drops our handles */
  if (!strcmp(arch, "UNet2DConditionModel")) {
    rc = unet_inputs(s, ctx, json, cfg, *inputs);
  } else if (!strcmp(arch, "FluxTransformer2DModel")) {
    rc = flux_inputs(s, ctx, json, cfg, *inputs);
  } else if (!strcmp(arch, "SD3Transformer2DModel")) {
    rc = sd3_inputs(s, ctx, json, cfg, *inputs);
  } else if (!strcmp(arch, "CLIPTextModel") || !strcmp(arch, "CLIPTextModelWithProjection")) {
    const int64_t max_pos = positive_or(json_number(json, "max_position_embeddings", 77), 77);
    add_token_ids(s, ctx, *inputs, cfg->tokens < max_pos ? cfg->tokens : max_pos, positive_or(json_number(json, "vocab_size", 49408), 49408));
  } else if (!strcmp(arch, "T5EncoderModel")) {
    add_token_ids(s, ctx, *inputs, cfg->tokens, positive_or(json_number(json, "vocab_size", 32128), 32128));
  } else if (!strcmp(arch, "AutoencoderKL")) {
    const int64_t image[4] = {1, positive_or(json_number(json, "in_channels", 3), 3), cfg->size, cfg->size};
    add_randn(s, ctx, *inputs, "sample", image, 4);
  } else {
    fprintf(stderr,
            "model_train_step: no inputs known for the architecture %s (this example builds them for UNet2DConditionModel, "
            "FluxTransformer2DModel, SD3Transformer2DModel, AutoencoderKL, CLIPTextModel(WithProjection), T5EncoderModel)\n",
            arch);
    rc = 1;
  }
  end_scope(s, &scope);
  return rc;
}

/* ---- parameters ---- */

static int ends_with(const char* s, const char* tail) {
  size_t n = strlen(s), m = strlen(tail);
  return n >= m && !strcmp(s + n - m, tail);
}

/* 1 for the weight of an attention projection (the layers LoRA trainers target). */
static int is_attention_projection(const char* name) {
  static const char* const tails[] = {"to_q.weight", "to_k.weight", "to_v.weight", "to_out.0.weight",
                                      "q_proj.weight", "k_proj.weight", "v_proj.weight", "out_proj.weight",
                                      "to_add_out.weight", ".q.weight", ".k.weight", ".v.weight", ".o.weight"};
  size_t i;
  if (!strstr(name, "attn") && !strstr(name, "attention") && !strstr(name, "Attention")) return 0;
  for (i = 0; i < sizeof tails / sizeof tails[0]; ++i)
    if (ends_with(name, tails[i])) return 1;
  return 0;
}

/* A host copy (f32) of a parameter, to tell afterwards whether it changed. */
typedef struct snapshot {
  flame_tensor_t tensor; /* borrowed from the model's list */
  float* values;
  int64_t numel;
} snapshot;

static void take_snapshot(check* s, flame_ctx_t ctx, flame_tensor_t t, snapshot* snap) {
  flame_scope_t scope;
  flame_tensor_t plain, f32;
  snap->tensor = t;
  check_fail(s, flame_tensor_numel(t, &snap->numel), "flame_tensor_numel");
  if (s->st != FLAME_OK) return;
  snap->values = (float*)malloc((size_t)snap->numel * sizeof(float));
  if (!snap->values) {
    fail_here(s, FLAME_ERROR_OUT_OF_MEMORY, "out of host memory for a parameter's copy");
    return;
  }
  begin_scope(s, ctx, &scope);
  DO(s, plain, flame_tensor_detach(t, &plain));
  DO(s, f32, flame_to_dtype(plain, FLAME_DTYPE_F32, &f32));
  if (s->st == FLAME_OK) check_fail(s, flame_to_host(f32, snap->values, (size_t)snap->numel * sizeof(float)), "flame_to_host");
  end_scope(s, &scope);
}

/* Number of elements that differ from the snapshot now (-1 on error). */
static int64_t count_changed(check* s, flame_ctx_t ctx, const snapshot* snap) {
  snapshot now;
  int64_t i, changed = 0;
  memset(&now, 0, sizeof now);
  take_snapshot(s, ctx, snap->tensor, &now);
  if (s->st != FLAME_OK) {
    free(now.values);
    return -1;
  }
  for (i = 0; i < snap->numel; ++i) changed += now.values[i] != snap->values[i];
  free(now.values);
  return changed;
}

/* Freezes every parameter, then lets those --train names require grad again; writes them into
 * trained (count *n_trained) and the index of the last frozen one into *frozen (-1: none). */
static void select_trained(check* s, flame_params_t params, int64_t count, int attention_only, flame_tensor_t* trained,
                           int64_t* n_trained, int64_t* frozen, const char** first_name) {
  int64_t i;
  *n_trained = 0;
  *frozen = -1;
  *first_name = NULL;
  for (i = 0; i < count && s->st == FLAME_OK; ++i) {
    const char* name = NULL;
    flame_tensor_t p = NULL;
    int train;
    check_fail(s, flame_params_name(params, i, &name), "flame_params_name");
    check_fail(s, flame_params_tensor(params, i, &p), "flame_params_tensor");
    if (s->st != FLAME_OK) return;
    train = !attention_only || is_attention_projection(name);
    check_fail(s, flame_tensor_set_requires_grad(p, train), "flame_tensor_set_requires_grad");
    if (train) {
      if (!*first_name) *first_name = name;
      trained[(*n_trained)++] = p;
    } else {
      *frozen = i;
    }
  }
}

/* ---- one model ---- */

static double seconds_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The loss of one forward pass (a handle of the open scope), or NULL after a failure in s.
 * *target: the fixed random target, made (and kept out of the scope) at the first call. */
static flame_tensor_t step_loss(check* s, flame_ctx_t ctx, flame_model_t model, const char* arch, flame_params_t inputs,
                                flame_scope_t scope, flame_tensor_t* target) {
  flame_params_t out = NULL, decoded = NULL;
  flame_tensor_t y = NULL, y32, loss = NULL;
  int text_encoder = !strcmp(arch, "CLIPTextModel") || !strcmp(arch, "CLIPTextModelWithProjection") || !strcmp(arch, "T5EncoderModel");
  check_fail(s, flame_model_forward(model, inputs, &out), "flame_model_forward");
  if (s->st != FLAME_OK) return NULL;
  if (!strcmp(arch, "AutoencoderKL")) {
    /* reconstruction: z = mean + exp(logvar / 2) * noise, decoded, against the image */
    flame_tensor_t mean = NULL, logvar = NULL, mean32, logvar32, half, sd, noise, scaled, z, image = NULL;
    flame_params_t latent = NULL;
    int64_t shape[4] = {0};
    check_fail(s, flame_params_find(out, "latent_mean", &mean), "flame_params_find(latent_mean)");
    check_fail(s, flame_params_find(out, "latent_logvar", &logvar), "flame_params_find(latent_logvar)");
    check_fail(s, flame_params_find(inputs, "sample", &image), "flame_params_find(sample)");
    if (s->st == FLAME_OK && (!mean || !logvar)) fail_here(s, FLAME_ERROR_INVALID_ARGUMENT, "the AutoencoderKL forward pass returned no latent_mean / latent_logvar");
    if (s->st == FLAME_OK) check_fail(s, flame_tensor_shape(mean, shape, 4), "flame_tensor_shape");
    DO(s, mean32, flame_to_dtype(mean, FLAME_DTYPE_F32, &mean32));
    DO(s, logvar32, flame_to_dtype(logvar, FLAME_DTYPE_F32, &logvar32));
    DO(s, half, flame_mul_scalar(logvar32, 0.5, &half));
    DO(s, sd, flame_exp(half, &sd));
    DO(s, noise, flame_randn(ctx, shape, 4, FLAME_DTYPE_F32, &noise));
    DO(s, scaled, flame_mul(sd, noise, &scaled));
    DO(s, z, flame_add(mean32, scaled, &z));
    if (s->st == FLAME_OK) check_fail(s, flame_params_create(ctx, &latent), "flame_params_create");
    if (s->st == FLAME_OK) check_fail(s, flame_params_add(latent, "latent_sample", z), "flame_params_add");
    if (s->st == FLAME_OK) check_fail(s, flame_model_forward(model, latent, &decoded), "flame_model_forward(decode)");
    flame_params_release(latent);
    if (s->st == FLAME_OK) check_fail(s, flame_params_find(decoded, "sample", &y), "flame_params_find(sample)");
    if (s->st == FLAME_OK && !y) fail_here(s, FLAME_ERROR_INVALID_ARGUMENT, "the AutoencoderKL decoder returned no \"sample\"");
    DO(s, y32, flame_to_dtype(y, FLAME_DTYPE_F32, &y32));
    DO(s, loss, flame_mse_loss(y32, image, FLAME_REDUCTION_MEAN, &loss));
  } else if (text_encoder) {
    flame_tensor_t h32, sq;
    check_fail(s, flame_params_find(out, "last_hidden_state", &y), "flame_params_find(last_hidden_state)");
    if (s->st == FLAME_OK && !y) fail_here(s, FLAME_ERROR_INVALID_ARGUMENT, "the forward pass returned no last_hidden_state");
    DO(s, h32, flame_to_dtype(y, FLAME_DTYPE_F32, &h32));
    DO(s, sq, flame_square(h32, &sq));
    DO(s, loss, flame_mean(sq, NULL, 0, 0, &loss));
  } else {
    check_fail(s, flame_params_find(out, "sample", &y), "flame_params_find(sample)");
    if (s->st == FLAME_OK && !y) fail_here(s, FLAME_ERROR_INVALID_ARGUMENT, "the forward pass returned no \"sample\"");
    DO(s, y32, flame_to_dtype(y, FLAME_DTYPE_F32, &y32));
    if (s->st == FLAME_OK && !*target) {
      int64_t shape[MAX_INPUT_DIMS];
      int32_t nd = 0;
      check_fail(s, flame_tensor_ndim(y32, &nd), "flame_tensor_ndim");
      if (s->st == FLAME_OK && nd > MAX_INPUT_DIMS) fail_here(s, FLAME_ERROR_SHAPE_MISMATCH, "the output \"sample\" has more than 8 dims");
      if (s->st == FLAME_OK) check_fail(s, flame_tensor_shape(y32, shape, nd), "flame_tensor_shape");
      DO(s, *target, flame_randn(ctx, shape, nd, FLAME_DTYPE_F32, target));
      if (s->st == FLAME_OK) check_fail(s, flame_scope_keep(scope, *target), "flame_scope_keep");
    }
    DO(s, loss, flame_mse_loss(y32, *target, FLAME_REDUCTION_MEAN, &loss));
  }
  flame_params_release(decoded); /* the tensors used above live on in the scope and the graph */
  flame_params_release(out);
  return loss;
}

/* Freezes, trains cfg->steps steps and checks the claims; 0 when they hold. label names the model. */
static int train_model(flame_ctx_t ctx, flame_model_t model, const config* cfg, const char* label, const char* save_path) {
  check s;
  const char *arch = NULL, *json = NULL, *first_trained = NULL;
  flame_params_t params = NULL, inputs = NULL;
  flame_tensor_t* trained = NULL;
  flame_tensor_t target = NULL;
  flame_optimizer_t opt = NULL;
  flame_scope_t scope = NULL;
  snapshot moved, fixed;
  int64_t count = 0, n_trained = 0, frozen = -1, step;
  int rc = 1;
  flame_dtype_t dtype = FLAME_DTYPE_F32;
  memset(&s, 0, sizeof s);
  memset(&moved, 0, sizeof moved);
  memset(&fixed, 0, sizeof fixed);

  check_fail(&s, flame_model_architecture(model, &arch), "flame_model_architecture");
  check_fail(&s, flame_model_config(model, &json), "flame_model_config");
  check_fail(&s, flame_model_params(model, &params), "flame_model_params");
  if (s.st == FLAME_OK) check_fail(&s, flame_params_count(params, &count), "flame_params_count");
  if (s.st != FLAME_OK) goto done;
  trained = (flame_tensor_t*)malloc((size_t)(count > 0 ? count : 1) * sizeof *trained);
  if (!trained) {
    fail_here(&s, FLAME_ERROR_OUT_OF_MEMORY, "out of host memory for the parameter list");
    goto done;
  }
  select_trained(&s, params, count, !strcmp(cfg->train, "attention"), trained, &n_trained, &frozen, &first_trained);
  if (s.st == FLAME_OK && n_trained == 0) {
    fprintf(stderr, "model_train_step: %s: %s has no attention projection to train (use --train all)\n", label, arch);
    goto done;
  }
  if (build_inputs(&s, ctx, arch, json, cfg, &inputs) || s.st != FLAME_OK) goto done;
  check_fail(&s, flame_tensor_dtype(trained[0], &dtype), "flame_tensor_dtype");
  {
    flame_optimizer_options_t o;
    check_fail(&s, flame_optimizer_options_init(&o, FLAME_OPTIMIZER_ADAMW), "flame_optimizer_options_init");
    o.lr = cfg->lr;
    o.master_weights = dtype == FLAME_DTYPE_BF16 || dtype == FLAME_DTYPE_F16;
    if (s.st == FLAME_OK) check_fail(&s, flame_optimizer_create(ctx, &o, trained, n_trained, &opt), "flame_optimizer_create");
  }
  if (s.st == FLAME_OK) check_fail(&s, flame_model_set_checkpointing(model, cfg->checkpoint), "flame_model_set_checkpointing");
  if (s.st == FLAME_OK) check_fail(&s, flame_model_set_training(model, 1), "flame_model_set_training");
  if (s.st == FLAME_OK) take_snapshot(&s, ctx, trained[0], &moved);
  if (s.st == FLAME_OK && frozen >= 0) {
    flame_tensor_t p = NULL;
    check_fail(&s, flame_params_tensor(params, frozen, &p), "flame_params_tensor");
    if (s.st == FLAME_OK) take_snapshot(&s, ctx, p, &fixed);
  }
  if (s.st != FLAME_OK) goto done;
  printf("%s: %s, %lld parameter tensors, training %lld (%s, first %s), dtype %s, checkpointing %d\n", label, arch,
         (long long)count, (long long)n_trained, cfg->train, first_trained, dtype == FLAME_DTYPE_BF16 ? "bf16" : dtype == FLAME_DTYPE_F16 ? "f16" : "f32",
         cfg->checkpoint);

  for (step = 1; step <= cfg->steps; ++step) {
    flame_tensor_t loss;
    flame_memory_stats_t ms;
    double value = NAN, t0;
    check_fail(&s, flame_ctx_synchronize(ctx), "flame_ctx_synchronize");
    check_fail(&s, flame_ctx_reset_peak_memory(ctx), "flame_ctx_reset_peak_memory");
    t0 = seconds_now();
    begin_scope(&s, ctx, &scope);
    loss = s.st == FLAME_OK ? step_loss(&s, ctx, model, arch, inputs, scope, &target) : NULL;
    if (s.st == FLAME_OK) check_fail(&s, flame_backward(ctx, loss, NULL, 0), "flame_backward");
    if (s.st == FLAME_OK) check_fail(&s, flame_optimizer_step(opt), "flame_optimizer_step");
    if (s.st == FLAME_OK) check_fail(&s, flame_optimizer_zero_grad(opt, 1), "flame_optimizer_zero_grad");
    if (s.st == FLAME_OK) check_fail(&s, flame_tensor_item(loss, &value), "flame_tensor_item"); /* waits for the step */
    end_scope(&s, &scope);
    if (s.st != FLAME_OK) goto done;
    ms.struct_size = sizeof ms;
    check_fail(&s, flame_ctx_memory_stats(ctx, &ms), "flame_ctx_memory_stats");
    if (s.st != FLAME_OK) goto done;
    printf("%s step %lld/%d: loss %.6f, %.1f ms, peak memory %.1f MiB\n", label, (long long)step, cfg->steps, value,
           1e3 * (seconds_now() - t0), (double)ms.peak_bytes_in_use / 1048576.0);
    fflush(stdout);
    if (!isfinite(value)) {
      fprintf(stderr, "model_train_step: %s: CLAIM FAILED: the loss of step %lld is not finite (%g)\n", label, (long long)step, value);
      goto done;
    }
  }
  {
    const int64_t changed = count_changed(&s, ctx, &moved);
    const int64_t drift = fixed.values ? count_changed(&s, ctx, &fixed) : 0;
    if (s.st != FLAME_OK) goto done;
    printf("%s: %lld of %lld elements of %s changed; frozen parameters unchanged: %s\n", label, (long long)changed,
           (long long)moved.numel, first_trained, !fixed.values ? "none frozen" : drift == 0 ? "yes" : "NO");
    if (changed == 0 || drift != 0) {
      fprintf(stderr, "model_train_step: %s: CLAIM FAILED: %s\n", label,
              changed == 0 ? "the trained parameter did not change" : "a frozen parameter changed");
      goto done;
    }
  }
  if (save_path) {
    check_fail(&s, flame_model_save(model, save_path, NULL), "flame_model_save");
    if (s.st != FLAME_OK) goto done;
    printf("%s: wrote %s\n", label, save_path);
  }
  rc = 0;

done:
  if (s.st != FLAME_OK) report(&s);
  if (scope) flame_scope_end(scope);
  free(moved.values);
  free(fixed.values);
  flame_optimizer_release(opt);
  flame_tensor_release(target);
  flame_params_release(inputs);
  free(trained);
  flame_params_release(params);
  return rc;
}

/* ---- loading ---- */

/* options_json for flame_model_load: {"dtype": ..., "component": ..., "architecture": ..., "config": ...}
 * (NULL fields left out); a malloc'd string, NULL when out of memory. */
static char* load_options(const char* dtype, const char* component, const char* arch, const char* config_json) {
  size_t n = 64 + (dtype ? strlen(dtype) : 0) + (component ? strlen(component) : 0) + (arch ? strlen(arch) : 0) +
             (config_json ? strlen(config_json) : 0) + 64;
  char* text = (char*)malloc(n);
  size_t used;
  if (!text) return NULL;
  used = (size_t)snprintf(text, n, "{");
  if (dtype) used += (size_t)snprintf(text + used, n - used, "\"dtype\": \"%s\"", dtype);
  if (component) used += (size_t)snprintf(text + used, n - used, "%s\"component\": \"%s\"", used > 1 ? ", " : "", component);
  if (arch) used += (size_t)snprintf(text + used, n - used, "%s\"architecture\": \"%s\"", used > 1 ? ", " : "", arch);
  if (config_json) used += (size_t)snprintf(text + used, n - used, "%s\"config\": %s", used > 1 ? ", " : "", config_json);
  snprintf(text + used, n - used, "}");
  return text;
}

static int load_and_train(flame_ctx_t ctx, const char* path, const char* options, const config* cfg, const char* label, const char* save_path) {
  flame_model_t model = NULL;
  int rc;
  printf("%s: loading %s\n", label, path);
  if (flame_model_load(ctx, path, options, &model) != FLAME_OK) {
    fprintf(stderr, "model_train_step: flame_model_load(%s) failed: %s\n", path, flame_last_error_message());
    return 1;
  }
  rc = train_model(ctx, model, cfg, label, save_path);
  flame_model_release(model);
  return rc;
}

/* Creates the folder path; 0 on success. */
static int make_folder(const char* path) {
  if (mkdir(path, 0700) == 0) return 0;
  fprintf(stderr, "model_train_step: cannot create the folder %s\n", path);
  return 1;
}

/* Writes text to path; 0 on success. */
static int write_text(const char* path, const char* text) {
  FILE* f = fopen(path, "wb");
  int ok = f && fputs(text, f) >= 0;
  if (f && fclose(f) != 0) ok = 0;
  if (!ok) fprintf(stderr, "model_train_step: cannot write %s\n", path);
  return ok ? 0 : 1;
}

/* Self-contained mode, one model: created from config, written as the diffusers folder dir/name
 * (config.json naming the class, then weights_file through flame_model_save), loaded back and trained. */
static int tiny_model_round_trip(flame_ctx_t ctx, const char* dir, const char* name, const char* arch, const char* config_json,
                                 const char* weights_file, const config* cfg, const char* save_path) {
  flame_model_t made = NULL;
  const char* full = NULL;
  char folder[1024], config_path[1100], weights_path[1100];
  char *class_config = NULL, *options = NULL;
  int rc = 1;
  char create_options[64];
  snprintf(create_options, sizeof create_options, "{\"dtype\": \"%s\"}", cfg->dtype ? cfg->dtype : "f32");
  snprintf(folder, sizeof folder, "%s/%s", dir, name);
  snprintf(config_path, sizeof config_path, "%s/config.json", folder);
  snprintf(weights_path, sizeof weights_path, "%s/%s", folder, weights_file);
  if (flame_model_create(ctx, arch, config_json, create_options, &made) != FLAME_OK) {
    fprintf(stderr, "model_train_step: flame_model_create(%s) failed: %s\n", arch, flame_last_error_message());
    return 1;
  }
  if (flame_model_config(made, &full) != FLAME_OK) {
    fprintf(stderr, "model_train_step: flame_model_config failed: %s\n", flame_last_error_message());
    goto done;
  }
  /* config.json as the reference libraries write it: the complete config, naming its class
   * ("_class_name" for diffusers, "architectures" for transformers; added when missing) */
  class_config = (char*)malloc(strlen(full) + strlen(arch) + 32);
  if (!class_config || full[0] != '{') goto done;
  if (json_value(full, "_class_name") || json_value(full, "architectures"))
    strcpy(class_config, full);
  else
    sprintf(class_config, "{\"_class_name\": \"%s\"%s%s", arch, full[1] == '}' ? "" : ", ", full + 1);
  if (make_folder(folder) || write_text(config_path, class_config)) goto done;
  if (flame_model_save(made, weights_path, NULL) != FLAME_OK) {
    fprintf(stderr, "model_train_step: flame_model_save(%s) failed: %s\n", weights_path, flame_last_error_message());
    goto done;
  }
  options = load_options(cfg->dtype ? cfg->dtype : "f32", NULL, arch, full);
  flame_model_release(made); /* the loaded copy is trained, not this one */
  made = NULL;
  if (!options) goto done;
  rc = load_and_train(ctx, folder, options, cfg, name, save_path);
done:
  flame_model_release(made);
  remove(weights_path);
  remove(config_path);
  remove(folder);
  free(class_config);
  free(options);
  return rc;
}

int main(int argc, char** argv) {
  config cfg = {NULL, NULL, NULL, "attention", NULL, 3, 0, 32, 77, 1e-4, 0};
  flame_ctx_t ctx = NULL;
  flame_ctx_options_t o;
  flame_status_t st;
  int rc = parse_args(argc, argv, &cfg);
  if (rc != EXAMPLE_ARGS_RUN) return rc;
  flame_ctx_options_init(&o);
  o.seed = cfg.seed;
  st = flame_ctx_create(&o, &ctx);
  if (st == FLAME_ERROR_NO_DRIVER || st == FLAME_ERROR_NO_DEVICE) {
    fprintf(stderr, "model_train_step: no GPU available (%s): %s\n", flame_status_string(st), flame_last_error_message());
    return EXIT_NO_GPU;
  }
  if (st != FLAME_OK) {
    fprintf(stderr, "model_train_step: flame_ctx_create failed: %s\n", flame_last_error_message());
    return 1;
  }
  if (cfg.model) {
    char* options = load_options(cfg.dtype, cfg.component, NULL, NULL);
    rc = options ? load_and_train(ctx, cfg.model, options, &cfg, cfg.component ? cfg.component : "model", cfg.save) : 1;
    free(options);
  } else {
    const char* tmp = getenv("TMPDIR");
    char dir[900];
    snprintf(dir, sizeof dir, "%s/model_train_step_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
      fprintf(stderr, "model_train_step: cannot create a temporary folder like %s\n", dir);
      rc = 1;
    } else {
      printf("self-contained: tiny models written to and loaded from %s\n", dir);
      rc = tiny_model_round_trip(ctx, dir, "text_encoder", "CLIPTextModel", kTinyClipConfig, "model.safetensors", &cfg, NULL);
      if (rc == 0)
        rc = tiny_model_round_trip(ctx, dir, "unet", "UNet2DConditionModel", kTinyUnetConfig,
                                   "diffusion_pytorch_model.safetensors", &cfg, cfg.save);
      remove(dir);
    }
  }
  flame_ctx_destroy(ctx);
  if (rc == 0) printf("model_train_step: all checks passed\n");
  return rc;
}

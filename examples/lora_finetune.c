/*
 * lora_finetune.c - LoRA fine-tuning from C: a frozen GPT saved by train_gpt, adapters trained on a
 * second text, saved alone, and reloaded into a fresh copy of the base model.
 *
 *   base   the parameters and the "train_gpt.config" metadata of a file written by
 *          `train_gpt --save FILE` (gpt_model.h: the same model and names), in its dtype (f32, or
 *          bf16 after train_gpt --bf16). Nothing of the base requires grad: it stays frozen.
 *   LoRA   a flame_lora_t (rank --rank, alpha --alpha; A random, B zero, so the adapted model starts
 *          as the base model) on every block's four linear layers: attn.qkv, attn.proj, mlp.fc and
 *          mlp.proj; the forward pass of gpt_model.h calls flame_lora_forward for them
 *   data   a second text (default: the project's Python scripts, concatenated by the build into
 *          lora_corpus.txt; any file with --text, which is required outside the project's build),
 *          code in another language than the base's
 *          documentation, so that the base model's loss on it starts clearly higher; the last 10%
 *          is held out
 *   train  cross-entropy, AdamW over the adapters' A and B only, warm-up + cosine, gradient
 *          clipping at 1.0; step, loss, throughput and memory every --log steps
 *   save   only the adapters, to safetensors (--out): "h.<l>.<layer>.lora_A" [rank, in] and
 *          "h.<l>.<layer>.lora_B" [out, rank] (f32), with the rank, alpha and base config as metadata
 *   reload a fresh base model from the base file, new adapters of the same rank, their A and B set
 *          from the adapter file; then the adapters merged into the weights for inference
 *
 * The claims, checked at the end (exit status 1 when one fails):
 *  1. the loss falls: the mean loss over fixed batches of the training part of the text, after
 *     training, is at most --target-factor (default 0.9) times the base model's;
 *  2. the adapter file holds only adapters: 2 tensors per adapted layer, every name ending in
 *     ".lora_A" or ".lora_B";
 *  3. the reloaded model gives the same loss on the same batches (within 1e-5 relative, 1e-2 for a
 *     bf16 base whose loss is a bf16 value; the program says whether it is bit for bit the same);
 *  4. for an f32 base, the merged model gives that loss within 1e-4 relative (bf16: printed only,
 *     since the merged weight is rounded to bf16).
 * Exit status: 0 when they hold, 1 on a FLAME error (the library's message is printed), a file that
 * cannot be read or a failed claim, 2 without a GPU or driver.
 *
 *   lora_finetune --base FILE [--text PATH] [--steps N] [--batch B] [--rank R] [--alpha A] [--lr LR]
 *                 [--seed S] [--log K] [--out FILE] [--target-factor F]
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime under strict C99 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXAMPLE_NAME "lora_finetune" /* example_check.h: the prefix of error messages */
#include "flame.h"
#include "example_check.h" /* DO(): first-failure error chaining */
#include "gpt_model.h"     /* the model, its forward pass (with adapters), loss and validation */
#include "example_args.h" /* the options table: --help, --version, errors naming the option */

#define EXIT_NO_GPU 2
#define PI 3.14159265358979323846
#define MAX_PARAMS (2 + PARAMS_PER_BLOCK * MAX_LAYERS + 2)
#define MAX_ADAPTERS (LORA_PER_BLOCK * MAX_LAYERS)

#ifndef FLAME_EXAMPLE_LORA_TEXT
#define FLAME_EXAMPLE_LORA_TEXT NULL /* built outside the project (no lora_corpus.txt): --text is required */
#endif

static const char* const lora_layer_names[LORA_PER_BLOCK] = {"attn.qkv", "attn.proj", "mlp.fc", "mlp.proj"};

typedef struct config {
  const char *base, *text, *out;
  int steps, batch, rank, log_every;
  double alpha, lr, target_factor;
  uint64_t seed;
} config;

/* ---------------------------------------------------------------- the base model */

/* Opens path, reads its "train_gpt.config" into m (dim, heads, layers, block size) and the dtype of
 * "wte", then every parameter of model_params (frozen: they do not require grad). */
static flame_status_t load_base(flame_ctx_t ctx, const char* path, model* m) {
  flame_safetensors_t f = NULL;
  const char* cfg = NULL;
  int32_t nd = 0;
  flame_status_t st = flame_safetensors_load(ctx, path, &f);
  if (st == FLAME_OK) st = flame_safetensors_metadata(f, "train_gpt.config", &cfg);
  if (st == FLAME_OK) {
    if (!cfg || sscanf(cfg, "{\"dim\": %d, \"heads\": %d, \"layers\": %d, \"block\": %d}", &m->dim, &m->heads, &m->layers,
                       &m->block_size) != 4 ||
        m->layers < 1 || m->layers > MAX_LAYERS || m->heads < 1 || m->dim % m->heads || m->block_size < 2) {
      flame_set_error_message("lora_finetune: the base file has no valid \"train_gpt.config\" metadata "
                              "(write it with train_gpt --save)");
      st = FLAME_ERROR_INVALID_FORMAT;
    }
  }
  if (st == FLAME_OK) st = flame_safetensors_info(f, "wte", &m->dtype, NULL, 0, &nd);
  flame_safetensors_release(f);
  /* Allocated, then loaded in place by name: every parameter must be in the file, nothing else. */
  flame_params_t params = NULL;
  if (st == FLAME_OK) st = model_init(ctx, m, 0);
  if (st == FLAME_OK) st = model_param_list(ctx, m, &params);
  if (st == FLAME_OK) st = flame_params_load_safetensors(params, path, 0);
  flame_params_release(params);
  return st;
}

static void release_model(model* m) {
  flame_tensor_t* slots[MAX_PARAMS];
  char names[MAX_PARAMS][48];
  int decay[MAX_PARAMS];
  const int n = model_params(m, slots, names, decay);
  for (int l = 0; l < m->layers; ++l)
    for (int k = 0; k < LORA_PER_BLOCK; ++k) {
      flame_lora_release(m->lora[l][k]);
      m->lora[l][k] = NULL;
    }
  for (int i = 0; i < n; ++i) {
    flame_tensor_release(*slots[i]);
    *slots[i] = NULL;
  }
}

/* ---------------------------------------------------------------- adapters */

/* An adapter (rank, alpha) on each of the four linear layers of every block. */
static flame_status_t attach_adapters(model* m, int64_t rank, double alpha) {
  flame_status_t st = FLAME_OK;
  for (int l = 0; l < m->layers && st == FLAME_OK; ++l) {
    block* b = &m->h[l];
    flame_tensor_t w[LORA_PER_BLOCK] = {b->qkv_w, b->proj_w, b->fc_w, b->out_w};
    flame_tensor_t bias[LORA_PER_BLOCK] = {b->qkv_b, b->proj_b, b->fc_b, b->out_b};
    for (int k = 0; k < LORA_PER_BLOCK && st == FLAME_OK; ++k) st = flame_lora_create(w[k], bias[k], rank, alpha, &m->lora[l][k]);
  }
  return st;
}

/* The adapters' A and B (new references) with their names, A and B alternating; returns the count. */
static int adapter_tensors(const model* m, flame_tensor_t* t, char names[][48], flame_status_t* st) {
  int n = 0;
  *st = FLAME_OK;
  for (int l = 0; l < m->layers; ++l)
    for (int k = 0; k < LORA_PER_BLOCK; ++k) {
      flame_tensor_t a = NULL, b = NULL;
      if (*st == FLAME_OK) *st = flame_lora_adapters(m->lora[l][k], &a, &b);
      if (*st != FLAME_OK) continue;
      snprintf(names[n], 48, "h.%d.%s.lora_A", l, lora_layer_names[k]);
      t[n++] = a;
      snprintf(names[n], 48, "h.%d.%s.lora_B", l, lora_layer_names[k]);
      t[n++] = b;
    }
  return n;
}

/* OUT *out: a named parameter list of the adapters' A and B, under adapter_tensors's names. */
static flame_status_t adapter_list(flame_ctx_t ctx, const model* m, flame_params_t* out) {
  flame_tensor_t t[2 * MAX_ADAPTERS];
  char names[2 * MAX_ADAPTERS][48];
  flame_status_t st;
  const int n = adapter_tensors(m, t, names, &st);
  if (st == FLAME_OK) st = flame_params_create(ctx, out);
  for (int i = 0; i < n && st == FLAME_OK; ++i) st = flame_params_add(*out, names[i], t[i]);
  for (int i = 0; i < n; ++i) flame_tensor_release(t[i]); /* the list holds its own references */
  return st;
}

/* Sets every adapter's A and B, in place, from the adapter file at path: strictly the same names,
 * shapes and dtypes. */
static flame_status_t load_adapters(flame_ctx_t ctx, const model* m, const char* path) {
  flame_params_t list = NULL;
  flame_status_t st = adapter_list(ctx, m, &list);
  if (st == FLAME_OK) st = flame_params_load_safetensors(list, path, 0);
  flame_params_release(list);
  return st;
}

/* ---------------------------------------------------------------- schedule, arguments */

static double schedule(const config* c, int step) {
  int warm = c->steps / 20 + 1;
  if (step < warm) return c->lr * (step + 1) / warm;
  double p = (double)(step - warm) / (double)(c->steps - warm > 0 ? c->steps - warm : 1);
  return c->lr * (0.1 + 0.9 * 0.5 * (1.0 + cos(PI * p)));
}

/* EXAMPLE_ARGS_RUN to train, else the exit status (example_args.h). */
static int parse_args(int argc, char** argv, config* c) {
  const example_arg args[] = {
      {"--base", ARG_STRING, &c->base, "FILE", "the base model, saved by train_gpt --save (required)", 0, 0, NULL},
      {"--text", ARG_STRING, &c->text, "PATH", "text to fine-tune on", 0, 0,
       c->text ? NULL : "none: required in a build outside the project"},
      {"--steps", ARG_INT, &c->steps, "N", "training steps", 1, 0, NULL},
      {"--batch", ARG_INT, &c->batch, "B", "sequences per step", 1, 0, NULL},
      {"--rank", ARG_INT, &c->rank, "R", "rank of the LoRA adapters", 1, 0, NULL},
      {"--alpha", ARG_DOUBLE, &c->alpha, "A", "LoRA scale numerator (the adapters are scaled by A / R)", 0, 0, NULL},
      {"--lr", ARG_POSITIVE_DOUBLE, &c->lr, "LR", "peak learning rate of AdamW", 0, 0, NULL},
      {"--seed", ARG_U64, &c->seed, "S", "seed of the batches, the adapters and the context's generator", 0, 0, NULL},
      {"--log", ARG_INT, &c->log_every, "K", "print progress every K steps", 1, 0, NULL},
      {"--out", ARG_STRING, &c->out, "FILE", "where the adapters are saved (safetensors)", 0, 0, NULL},
      {"--target-factor", ARG_POSITIVE_DOUBLE, &c->target_factor, "F",
       "the training loss after fine-tuning must be at most F x the base model's", 0, 0, NULL}};
  const example_cli cli = {"lora_finetune", "Fine-tunes a train_gpt model on new text with LoRA adapters and saves only the adapters.",
                           args, (int)(sizeof args / sizeof args[0]),
                           "Exit status: 0 target reached, 1 a FLAME error, a missed target or a bad option, 2 no GPU."};
  int rc = example_parse_args(&cli, argc, argv);
  if (rc == EXAMPLE_ARGS_RUN && !c->base) rc = example_arg_fail(&cli, "--base", "required (a model saved by train_gpt --save)");
  if (rc == EXAMPLE_ARGS_RUN && !c->text) rc = example_arg_fail(&cli, "--text", "required in a build outside the project");
  return rc;
}

static long file_size(const char* path) {
  FILE* f = fopen(path, "rb");
  long n = -1;
  if (f && fseek(f, 0, SEEK_END) == 0) n = ftell(f);
  if (f) fclose(f);
  return n;
}

int main(int argc, char** argv) {
  config cfg = {NULL, FLAME_EXAMPLE_LORA_TEXT, "lora_adapters.safetensors", 600, 16, 8, 100, 16.0, 2e-3, 0.9, 1};
  int status = 1;
  flame_ctx_t ctx = NULL;
  model m, fresh;
  flame_optimizer_t opt = NULL;
  flame_safetensors_t saved = NULL;
  flame_params_t adapter_params = NULL;
  flame_scope_t step_scope = NULL;
  unsigned char* text = NULL;
  int64_t *idx = NULL, *tgt = NULL;
  long size = 0;
  flame_tensor_t adapters[2 * MAX_ADAPTERS];
  char anames[2 * MAX_ADAPTERS][48];
  int na = 0;
  memset(&m, 0, sizeof m);
  memset(&fresh, 0, sizeof fresh);
  int args_rc = parse_args(argc, argv, &cfg);
  if (args_rc != EXAMPLE_ARGS_RUN) return args_rc;

  flame_ctx_options_t o;
  flame_ctx_options_init(&o);
  o.seed = cfg.seed;
  flame_status_t st = flame_ctx_create(&o, &ctx);
  if (st == FLAME_ERROR_NO_DRIVER || st == FLAME_ERROR_NO_DEVICE) {
    fprintf(stderr, "lora_finetune: no GPU available (%s): %s\n", flame_status_string(st), flame_last_error_message());
    return EXIT_NO_GPU;
  }
  check s;
  memset(&s, 0, sizeof s);
#define CHECK(call)                \
  do {                             \
    flame_status_t e_ = (call);    \
    if (e_ != FLAME_OK) {          \
      check_fail(&s, e_, #call);   \
      report(&s);                  \
      goto cleanup;                \
    }                              \
  } while (0)
  CHECK(st);
  CHECK(load_base(ctx, cfg.base, &m));
  const int T = m.block_size, B = cfg.batch;
  text = read_text(cfg.text, &size);
  if (!text || size < 10L * T + 100) {
    fprintf(stderr, "lora_finetune: cannot read enough text from %s (pass --text PATH; need %ld bytes)\n", cfg.text,
            10L * T + 100);
    goto cleanup;
  }
  const long split = size - size / 10;
  char device[128];
  CHECK(flame_ctx_device_name(ctx, device, sizeof device));
  CHECK(attach_adapters(&m, cfg.rank, cfg.alpha));
  flame_status_t ast;
  na = adapter_tensors(&m, adapters, anames, &ast);
  CHECK(ast);
  /* Base parameters: wte, wpe, ln_f, and per block 12 d^2 weights and 13 d biases and norms. */
  int64_t n_lora = 0, n_base = (int64_t)(VOCAB + T + 2) * m.dim + (int64_t)m.layers * (12LL * m.dim * m.dim + 13LL * m.dim);
  for (int i = 0; i < na; ++i) {
    int64_t k = 0;
    CHECK(flame_tensor_numel(adapters[i], &k));
    n_lora += k;
  }
  printf("lora_finetune on %s: base %s (GPT %d layers x %d dims x %d heads, block %d, %s, %lld parameters, frozen)\n", device,
         cfg.base, m.layers, m.dim, m.heads, T, flame_dtype_name(m.dtype), (long long)n_base);
  printf("  %d adapters of rank %d, alpha %g on attn.qkv, attn.proj, mlp.fc, mlp.proj: %lld trainable parameters (%.2f%%)\n",
         na / 2, cfg.rank, cfg.alpha, (long long)n_lora, 100.0 * (double)n_lora / (double)n_base);
  printf("  text %s (%ld bytes), batch %d, %d steps, AdamW lr %g\n", cfg.text, size, B, cfg.steps, cfg.lr);

  idx = malloc(sizeof(int64_t) * (size_t)B * (size_t)T);
  tgt = malloc(sizeof(int64_t) * (size_t)B * (size_t)T);
  if (!idx || !tgt) {
    fprintf(stderr, "lora_finetune: out of host memory\n");
    goto cleanup;
  }
  /* B = 0: the adapted model is the base model, so these are the base model's losses. */
  double base_fit = 0, base_held = 0, fit = 0, held = 0;
  CHECK(validate(ctx, &m, text, 0, split, B, T, idx, tgt, &base_fit));
  CHECK(validate(ctx, &m, text, split, size, B, T, idx, tgt, &base_held));
  printf("base model on the new text: loss %.4f (training part), %.4f (held out)\n", base_fit, base_held);

  flame_optimizer_options_t oo;
  CHECK(flame_optimizer_options_init(&oo, FLAME_OPTIMIZER_ADAMW));
  oo.lr = cfg.lr;
  oo.weight_decay = 0.0;
  CHECK(flame_optimizer_create(ctx, &oo, adapters, na, &opt));

  uint64_t data_rng = 0x243F6A8885A308D3ull ^ cfg.seed;
  const int64_t bt[2] = {B, T};
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int since = 0;
  for (int step = 0; step < cfg.steps; ++step) {
    flame_tensor_t ti, tt, logits, loss, norm;
    make_batch(&data_rng, text, 0, split, B, T, idx, tgt);
    CHECK(flame_optimizer_set_lr(opt, -1, schedule(&cfg, step)));
    begin_scope(&s, ctx, &step_scope); /* this step's intermediates */
    DO(&s, ti, flame_from_host(ctx, idx, sizeof(int64_t) * (size_t)(B * T), bt, 2, FLAME_DTYPE_I64, &ti));
    DO(&s, tt, flame_from_host(ctx, tgt, sizeof(int64_t) * (size_t)(B * T), bt, 2, FLAME_DTYPE_I64, &tt));
    logits = forward(&s, &m, ti, B, T);
    loss = loss_of(&s, logits, tt, B * T);
    if (s.st == FLAME_OK) CHECK(flame_backward(ctx, loss, NULL, 0));
    DO(&s, norm, flame_clip_grad_norm(ctx, adapters, na, 1.0, 2.0, 0, &norm));
    if (s.st == FLAME_OK) CHECK(flame_optimizer_step(opt));
    if (s.st == FLAME_OK) CHECK(flame_optimizer_zero_grad(opt, 1));
    if (s.st != FLAME_OK) {
      report(&s);
      goto cleanup;
    }
    ++since;
    if ((step + 1) % cfg.log_every == 0 || step + 1 == cfg.steps) {
      double lv = 0, nv = 0;
      flame_memory_stats_t ms;
      ms.struct_size = sizeof ms;
      CHECK(flame_tensor_item(loss, &lv)); /* synchronises: the timing covers the queued steps */
      CHECK(flame_tensor_item(norm, &nv));
      CHECK(flame_ctx_memory_stats(ctx, &ms));
      clock_gettime(CLOCK_MONOTONIC, &t1);
      const double sec = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
      printf("step %5d  loss %.4f  grad-norm %6.3f  %8.0f tokens/s  %.2f ms/step  memory %.1f MiB (peak %.1f)\n", step + 1, lv,
             nv, since * (double)B * T / sec, 1e3 * sec / since, ms.bytes_in_use / 1048576.0, ms.peak_bytes_in_use / 1048576.0);
      since = 0;
      end_scope(&s, &step_scope);
      clock_gettime(CLOCK_MONOTONIC, &t0);
    }
    end_scope(&s, &step_scope);
    if (s.st != FLAME_OK) {
      report(&s);
      goto cleanup;
    }
  }
  CHECK(validate(ctx, &m, text, 0, split, B, T, idx, tgt, &fit));
  CHECK(validate(ctx, &m, text, split, size, B, T, idx, tgt, &held));
  printf("fine-tuned model on the new text: loss %.4f (training part; base %.4f), %.4f (held out; base %.4f)\n", fit, base_fit,
         held, base_held);

  /* Only the adapters go to the file, with what is needed to use them again as metadata. */
  {
    char meta_val[256];
    snprintf(meta_val, sizeof meta_val,
             "{\"rank\": %d, \"alpha\": %g, \"targets\": \"attn.qkv,attn.proj,mlp.fc,mlp.proj\", \"base\": {\"dim\": %d, "
             "\"heads\": %d, \"layers\": %d, \"block\": %d}}",
             cfg.rank, cfg.alpha, m.dim, m.heads, m.layers, T);
    const char* meta[2] = {"lora_finetune.config", meta_val};
    CHECK(adapter_list(ctx, &m, &adapter_params));
    CHECK(flame_params_save_safetensors(adapter_params, cfg.out, meta, 1));
  }
  int64_t count = 0;
  int only_adapters = 1;
  CHECK(flame_safetensors_load(ctx, cfg.out, &saved));
  CHECK(flame_safetensors_count(saved, &count));
  for (int64_t i = 0; i < count; ++i) {
    const char* nm = NULL;
    CHECK(flame_safetensors_name(saved, i, &nm));
    const size_t len = strlen(nm);
    if (len < 7 || (strcmp(nm + len - 7, ".lora_A") && strcmp(nm + len - 7, ".lora_B"))) only_adapters = 0;
  }
  only_adapters = only_adapters && count == na;
  flame_safetensors_release(saved);
  saved = NULL;
  printf("saved %s: %lld tensors, %ld bytes (the base file: %ld bytes)\n", cfg.out, (long long)count, file_size(cfg.out),
         file_size(cfg.base));

  /* A fresh base model, new adapters (other random A, zero B), their values from the file. */
  double reloaded = 0, merged = 0;
  CHECK(load_base(ctx, cfg.base, &fresh));
  CHECK(attach_adapters(&fresh, cfg.rank, cfg.alpha));
  CHECK(load_adapters(ctx, &fresh, cfg.out));
  CHECK(validate(ctx, &fresh, text, 0, split, B, T, idx, tgt, &reloaded));
  for (int l = 0; l < fresh.layers; ++l)
    for (int k = 0; k < LORA_PER_BLOCK; ++k) CHECK(flame_lora_merge(fresh.lora[l][k]));
  CHECK(validate(ctx, &fresh, text, 0, split, B, T, idx, tgt, &merged));

  const int fell = fit <= cfg.target_factor * base_fit;
  /* The reloaded model is the trained one bit for bit (same base file, A and B written exactly),
   * and the forward pass is deterministic on one context: the tolerance only allows for a GEMM
   * algorithm that sums in another order; a bf16 loss is rounded to bf16 (2^-8 relative). */
  const double same_tol = m.dtype == FLAME_DTYPE_F32 ? 1e-5 : 1e-2;
  const int same = fabs(reloaded - fit) <= same_tol * fabs(fit);
  const int merged_ok = m.dtype != FLAME_DTYPE_F32 || fabs(merged - fit) <= 1e-4 * fabs(fit);
  printf("claim 1, the loss falls: %.4f -> %.4f (ratio %.3f, claim <= %.2f): %s\n", base_fit, fit, fit / base_fit,
         cfg.target_factor, fell ? "ok" : "FAILED");
  printf("claim 2, the file holds only the %d adapter tensors: %s\n", na, only_adapters ? "ok" : "FAILED");
  printf("claim 3, reloaded into a fresh base model: loss %.6f vs %.6f (%s; claim: within %g relative): %s\n", reloaded,
         fit, reloaded == fit ? "bit for bit the same" : "not bit for bit", same_tol, same ? "ok" : "FAILED");
  printf("claim 4, merged into the weights: loss %.6f vs %.6f%s: %s\n", merged, fit,
         m.dtype == FLAME_DTYPE_F32 ? " (claim: within 1e-4)" : " (bf16 weights: not checked)", merged_ok ? "ok" : "FAILED");
  status = fell && only_adapters && same && merged_ok ? 0 : 1;
  if (status) fprintf(stderr, "lora_finetune: a claim failed (see above)\n");

cleanup:
  flame_scope_end(step_scope); /* NULL when no step was in progress */
  flame_params_release(adapter_params);
  for (int i = 0; i < na; ++i) flame_tensor_release(adapters[i]);
  flame_optimizer_release(opt);
  flame_safetensors_release(saved);
  release_model(&m);
  release_model(&fresh);
  flame_ctx_destroy(ctx);
  free(text);
  free(idx);
  free(tgt);
  return status;
#undef CHECK
}

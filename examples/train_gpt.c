/*
 * train_gpt.c - a character-level GPT trained from C on a plain-text file.
 *
 *   data   the bytes of a text file (default: the project's documentation, concatenated by the
 *          build into corpus.txt; any file with --text); the last 10% is held out for validation
 *   model  byte embedding + learned positions, `--layers` pre-norm blocks (layer norm, causal
 *          scaled-dot-product attention with heads split from one qkv projection, GELU MLP with the
 *          activation fused into the GEMM), final layer norm, head tied to the embedding; defined in
 *          gpt_model.h, which lora_finetune.c shares
 *   train  cross-entropy, AdamW (no decay on biases, norms and positions), warm-up + cosine,
 *          gradient clipping at 1.0; --bf16 keeps bf16 parameters with f32 master weights in the
 *          optimizer (FLAME has no autocast yet: everything runs in bf16 with f32 accumulation)
 *   output progress every --log steps (loss, validation loss, tokens/s, memory) and a sample of
 *          generated text every --sample steps; --save writes the parameters (safetensors) and the
 *          optimizer state (<path>.opt); --resume continues from such a pair bit for bit
 *
 * Exit status: 0 when the training loss of the final step is below
 * --target-loss (default 2.0 nats; a uniform guess over bytes is 5.5), 1 on a FLAME error (the
 * library's message is printed) or a missed target, 2 without a GPU or driver. The validation loss
 * is printed next to it: on a small text it rises again once the model memorises (overfitting).
 *
 *   train_gpt [--text PATH] [--steps N] [--batch B] [--block T] [--dim D] [--heads H] [--layers L]
 *             [--lr LR] [--seed S] [--log K] [--sample K] [--bf16] [--save PATH] [--resume PATH]
 *             [--target-loss X]
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime under strict C99 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXAMPLE_NAME "train_gpt" /* example_scope.h: the prefix of error messages */
#include "flame.h"
#include "example_scope.h" /* DO(), scope: intermediates released together */
#include "gpt_model.h"    /* the model, its forward pass, loss and validation, the text batches */

#define EXIT_NO_GPU 2
#define PI 3.14159265358979323846

#ifndef FLAME_EXAMPLE_TEXT
#define FLAME_EXAMPLE_TEXT "README.md"
#endif

/* ---------------------------------------------------------------- configuration and data */
typedef struct config {
  const char* text;
  const char* save;
  const char* resume;
  int steps, batch, block, dim, heads, layers, log_every, sample_every, bf16;
  double lr, target_loss;
  uint64_t seed;
} config;

/* Prints `n` bytes sampled (temperature 0.8) after a prompt taken from the text. */
static flame_status_t sample(flame_ctx_t ctx, const model* m, const unsigned char* text, long size, int n, uint64_t* rng) {
  scope s;
  memset(&s, 0, sizeof s);
  int32_t prev = 1;
  const int T = m->block_size;
  int64_t* ctxbuf = malloc(sizeof(int64_t) * (size_t)(T + n));
  float* row = malloc(sizeof(float) * VOCAB);
  if (!ctxbuf || !row) {
    free(ctxbuf);
    free(row);
    flame_set_error_message("train_gpt: out of host memory");
    return FLAME_ERROR_OUT_OF_MEMORY;
  }
  long start = (long)(rng_uniform(rng) * (double)(size - 32));
  int len = 0;
  for (; len < 24; ++len) ctxbuf[len] = text[start + len];
  flame_status_t st = flame_ctx_set_grad_enabled(ctx, 0, &prev);
  if (st == FLAME_OK) {
    printf("  sample: \"");
    for (int i = 0; i < len; ++i) putchar(ctxbuf[i] >= 32 && ctxbuf[i] < 127 ? (int)ctxbuf[i] : ' ');
    printf("|");
    for (int i = 0; i < n && s.st == FLAME_OK; ++i) {
      int t = len < T ? len : T;
      const int64_t shape[2] = {1, t};
      flame_tensor_t ti, logits, last, lastf;
      DO(&s, ti, flame_from_host(ctx, ctxbuf + len - t, sizeof(int64_t) * (size_t)t, shape, 2, FLAME_DTYPE_I64, &ti));
      logits = forward(&s, m, ti, 1, t);
      DO(&s, last, flame_select(logits, 1, t - 1, &last)); /* [1, V] */
      DO(&s, lastf, flame_to_dtype(last, FLAME_DTYPE_F32, &lastf));
      if (s.st == FLAME_OK) {
        flame_status_t e = flame_to_host(lastf, row, sizeof(float) * VOCAB);
        if (e != FLAME_OK) scope_fail(&s, e, "flame_to_host");
      }
      scope_release(&s);
      if (s.st != FLAME_OK) break;
      double mx = row[0], z = 0, u = rng_uniform(rng), acc = 0;
      for (int c = 1; c < VOCAB; ++c) mx = row[c] > mx ? row[c] : mx;
      for (int c = 0; c < VOCAB; ++c) z += exp((row[c] - mx) / 0.8);
      int pick = VOCAB - 1;
      for (int c = 0; c < VOCAB; ++c) {
        acc += exp((row[c] - mx) / 0.8) / z;
        if (u < acc) {
          pick = c;
          break;
        }
      }
      ctxbuf[len++] = pick;
      putchar(pick == '\n' ? ' ' : pick >= 32 && pick < 127 ? pick : '?');
    }
    printf("\"\n");
    flame_ctx_set_grad_enabled(ctx, prev, NULL);
  }
  free(ctxbuf);
  free(row);
  if (s.st != FLAME_OK) {
    report(&s);
    return s.st;
  }
  return st;
}

static double schedule(const config* c, int step) {
  int warm = c->steps / 20 + 1;
  if (step < warm) return c->lr * (step + 1) / warm;
  double p = (double)(step - warm) / (double)(c->steps - warm > 0 ? c->steps - warm : 1);
  return c->lr * (0.1 + 0.9 * 0.5 * (1.0 + cos(PI * p)));
}

static int parse_args(int argc, char** argv, config* c) {
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (!strcmp(a, "--bf16")) {
      c->bf16 = 1;
      continue;
    }
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) goto usage;
    if (!strcmp(a, "--text")) c->text = v;
    else if (!strcmp(a, "--steps")) c->steps = atoi(v);
    else if (!strcmp(a, "--batch")) c->batch = atoi(v);
    else if (!strcmp(a, "--block")) c->block = atoi(v);
    else if (!strcmp(a, "--dim")) c->dim = atoi(v);
    else if (!strcmp(a, "--heads")) c->heads = atoi(v);
    else if (!strcmp(a, "--layers")) c->layers = atoi(v);
    else if (!strcmp(a, "--lr")) c->lr = atof(v);
    else if (!strcmp(a, "--seed")) c->seed = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--log")) c->log_every = atoi(v);
    else if (!strcmp(a, "--sample")) c->sample_every = atoi(v);
    else if (!strcmp(a, "--save")) c->save = v;
    else if (!strcmp(a, "--resume")) c->resume = v;
    else if (!strcmp(a, "--target-loss")) c->target_loss = atof(v);
    else goto usage;
    ++i;
  }
  if (c->steps > 0 && c->batch > 0 && c->block > 1 && c->heads > 0 && c->dim % c->heads == 0 && c->layers > 0 &&
      c->layers <= MAX_LAYERS && c->log_every > 0 && c->sample_every > 0 && c->lr > 0)
    return 1;
usage:
  fprintf(stderr,
          "usage: train_gpt [--text PATH] [--steps N] [--batch B] [--block T] [--dim D] [--heads H (dividing D)]\n"
          "                 [--layers L (<= %d)] [--lr LR] [--seed S] [--log K] [--sample K] [--bf16]\n"
          "                 [--save PATH] [--resume PATH] [--target-loss X]\n",
          MAX_LAYERS);
  return 0;
}

/* Writes the parameters to path and the optimizer state to path.opt. */
static flame_status_t save(flame_ctx_t ctx, model* m, flame_optimizer_t opt, const char* path) {
  flame_tensor_t* slots[2 + PARAMS_PER_BLOCK * MAX_LAYERS + 2];
  char names[2 + PARAMS_PER_BLOCK * MAX_LAYERS + 2][48];
  const char* name_ptrs[2 + PARAMS_PER_BLOCK * MAX_LAYERS + 2];
  flame_tensor_t tensors[2 + PARAMS_PER_BLOCK * MAX_LAYERS + 2];
  int decay[2 + PARAMS_PER_BLOCK * MAX_LAYERS + 2];
  int n = model_params(m, slots, names, decay);
  for (int i = 0; i < n; ++i) {
    name_ptrs[i] = names[i];
    tensors[i] = *slots[i];
  }
  char cfgval[128], optpath[4096];
  snprintf(cfgval, sizeof cfgval, "{\"dim\": %d, \"heads\": %d, \"layers\": %d, \"block\": %d}", m->dim, m->heads,
           m->layers, m->block_size);
  const char* meta[2] = {"train_gpt.config", cfgval};
  flame_status_t st = flame_safetensors_save(ctx, path, name_ptrs, tensors, n, meta, 1);
  snprintf(optpath, sizeof optpath, "%s.opt", path);
  if (st == FLAME_OK) st = flame_optimizer_save_state(opt, optpath);
  return st;
}

int main(int argc, char** argv) {
  config cfg = {FLAME_EXAMPLE_TEXT, NULL, NULL, 1500, 32, 128, 256, 4, 4, 100, 500, 0, 2e-3, 2.0, 1};
  int status = 1;
  flame_ctx_t ctx = NULL;
  model m;
  flame_optimizer_t opt = NULL;
  flame_safetensors_t resume_file = NULL;
  unsigned char* text = NULL;
  int64_t *idx = NULL, *tgt = NULL;
  long size = 0;
  flame_tensor_t* slots[2 + PARAMS_PER_BLOCK * MAX_LAYERS + 2];
  char names[2 + PARAMS_PER_BLOCK * MAX_LAYERS + 2][48];
  int decay[2 + PARAMS_PER_BLOCK * MAX_LAYERS + 2];
  int np = 0;
  memset(&m, 0, sizeof m);
  if (!parse_args(argc, argv, &cfg)) return 1;

  flame_ctx_options_t o;
  flame_ctx_options_init(&o);
  o.seed = cfg.seed;
  flame_status_t st = flame_ctx_create(&o, &ctx);
  if (st == FLAME_ERROR_NO_DRIVER || st == FLAME_ERROR_NO_DEVICE) {
    fprintf(stderr, "train_gpt: no GPU available (%s): %s\n", flame_status_string(st), flame_last_error_message());
    return EXIT_NO_GPU;
  }
  scope s;
  memset(&s, 0, sizeof s);
#define CHECK(call)                                                     \
  do {                                                                  \
    flame_status_t e_ = (call);                                         \
    if (e_ != FLAME_OK) {                                               \
      scope_fail(&s, e_, #call);                                        \
      report(&s);                                                       \
      goto cleanup;                                                     \
    }                                                                   \
  } while (0)
  CHECK(st);

  text = read_text(cfg.text, &size);
  if (!text || size < 10L * cfg.block + 100) {
    fprintf(stderr, "train_gpt: cannot read enough text from %s (pass --text PATH; need %ld bytes)\n", cfg.text,
            10L * cfg.block + 100);
    goto cleanup;
  }
  const long split = size - size / 10;
  char device[128];
  CHECK(flame_ctx_device_name(ctx, device, sizeof device));
  printf("train_gpt on %s: %s (%ld bytes), GPT %d layers x %d dims x %d heads, block %d, batch %d, %s\n", device,
         cfg.text, size, cfg.layers, cfg.dim, cfg.heads, cfg.block, cfg.batch, cfg.bf16 ? "bf16" : "f32");

  m.dim = cfg.dim;
  m.heads = cfg.heads;
  m.layers = cfg.layers;
  m.block_size = cfg.block;
  m.dtype = cfg.bf16 ? FLAME_DTYPE_BF16 : FLAME_DTYPE_F32;
  np = model_params(&m, slots, names, decay);
  if (cfg.resume) { /* the parameters come from the file, the rest of the state from <path>.opt */
    CHECK(flame_safetensors_load(ctx, cfg.resume, &resume_file));
    for (int i = 0; i < np; ++i) CHECK(flame_safetensors_get(resume_file, names[i], slots[i]));
  } else {
    CHECK(model_init(ctx, &m));
  }
  flame_tensor_t with_decay[2 + PARAMS_PER_BLOCK * MAX_LAYERS + 2], without[2 + PARAMS_PER_BLOCK * MAX_LAYERS + 2],
      all[2 + PARAMS_PER_BLOCK * MAX_LAYERS + 2];
  int nw = 0, nn = 0;
  for (int i = 0; i < np; ++i) {
    CHECK(flame_tensor_set_requires_grad(*slots[i], 1));
    all[i] = *slots[i];
    if (decay[i]) with_decay[nw++] = *slots[i];
    else without[nn++] = *slots[i];
  }
  flame_optimizer_options_t oo;
  CHECK(flame_optimizer_options_init(&oo, FLAME_OPTIMIZER_ADAMW));
  oo.lr = cfg.lr;
  oo.beta2 = 0.95;
  oo.weight_decay = 0.1;
  oo.master_weights = cfg.bf16;
  CHECK(flame_optimizer_create(ctx, &oo, with_decay, nw, &opt));
  oo.weight_decay = 0.0;
  CHECK(flame_optimizer_add_param_group(opt, &oo, without, nn, NULL));
  int64_t first_step = 0;
  if (cfg.resume) {
    char optpath[4096];
    snprintf(optpath, sizeof optpath, "%s.opt", cfg.resume);
    CHECK(flame_optimizer_load_state(opt, optpath));
    CHECK(flame_optimizer_step_count(opt, &first_step));
    printf("resumed from %s at step %lld\n", cfg.resume, (long long)first_step);
  }

  idx = malloc(sizeof(int64_t) * (size_t)cfg.batch * (size_t)cfg.block);
  tgt = malloc(sizeof(int64_t) * (size_t)cfg.batch * (size_t)cfg.block);
  if (!idx || !tgt) {
    fprintf(stderr, "train_gpt: out of host memory\n");
    goto cleanup;
  }
  uint64_t data_rng = 0x243F6A8885A308D3ull ^ (cfg.seed + (uint64_t)first_step * 0x9E3779B97F4A7C15ull);
  uint64_t sample_rng = 0x13198A2E03707344ull ^ cfg.seed;
  double val = 0, last_loss = INFINITY;
  CHECK(validate(ctx, &m, text, split, size, cfg.batch, cfg.block, idx, tgt, &val));
  printf("step %5lld  validation loss %.4f\n", (long long)first_step, val);

  const int64_t bt[2] = {cfg.batch, cfg.block};
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int since = 0;
  for (int step = (int)first_step; step < cfg.steps; ++step) {
    flame_tensor_t ti, tt, logits, loss, norm;
    make_batch(&data_rng, text, 0, split, cfg.batch, cfg.block, idx, tgt);
    CHECK(flame_optimizer_set_lr(opt, -1, schedule(&cfg, step)));
    DO(&s, ti, flame_from_host(ctx, idx, sizeof(int64_t) * (size_t)(cfg.batch * cfg.block), bt, 2, FLAME_DTYPE_I64, &ti));
    DO(&s, tt, flame_from_host(ctx, tgt, sizeof(int64_t) * (size_t)(cfg.batch * cfg.block), bt, 2, FLAME_DTYPE_I64, &tt));
    logits = forward(&s, &m, ti, cfg.batch, cfg.block);
    loss = loss_of(&s, logits, tt, cfg.batch * cfg.block);
    if (s.st == FLAME_OK) CHECK(flame_backward(ctx, loss, NULL, 0));
    DO(&s, norm, flame_clip_grad_norm(ctx, all, np, 1.0, 2.0, 0, &norm));
    if (s.st == FLAME_OK) CHECK(flame_optimizer_step(opt));
    if (s.st == FLAME_OK) CHECK(flame_optimizer_zero_grad(opt, 1));
    if (s.st != FLAME_OK) {
      report(&s);
      scope_release(&s);
      goto cleanup;
    }
    ++since;
    if ((step + 1) % cfg.log_every == 0 || step + 1 == cfg.steps) {
      double lv = 0, nv = 0;
      flame_memory_stats_t ms;
      ms.struct_size = sizeof ms;
      CHECK(flame_tensor_item(loss, &lv));
      last_loss = lv;
      CHECK(flame_tensor_item(norm, &nv));
      CHECK(flame_ctx_memory_stats(ctx, &ms));
      clock_gettime(CLOCK_MONOTONIC, &t1);
      double sec = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
      printf("step %5d  loss %.4f  grad-norm %6.3f  %8.0f tokens/s  %.2f ms/step  memory %.1f MiB (peak %.1f)\n", step + 1,
             lv, nv, since * (double)cfg.batch * cfg.block / sec, 1e3 * sec / since, ms.bytes_in_use / 1048576.0,
             ms.peak_bytes_in_use / 1048576.0);
      since = 0;
      scope_release(&s);
      if ((step + 1) % cfg.sample_every == 0 || step + 1 == cfg.steps) {
        CHECK(validate(ctx, &m, text, split, size, cfg.batch, cfg.block, idx, tgt, &val));
        printf("step %5d  validation loss %.4f\n", step + 1, val);
        CHECK(sample(ctx, &m, text, split, 120, &sample_rng));
      }
      clock_gettime(CLOCK_MONOTONIC, &t0);
    }
    scope_release(&s);
  }
  if (cfg.save) {
    CHECK(save(ctx, &m, opt, cfg.save));
    printf("saved %s and %s.opt\n", cfg.save, cfg.save);
  }
  status = last_loss < cfg.target_loss ? 0 : 1;
  if (status) fprintf(stderr, "train_gpt: training loss %.4f is not below the target %.4f\n", last_loss, cfg.target_loss);
  else printf("training loss %.4f is below the target %.4f (validation %.4f)\n", last_loss, cfg.target_loss, val);

cleanup:
  scope_release(&s);
  flame_optimizer_release(opt);
  for (int i = 0; i < np; ++i) flame_tensor_release(*slots[i]);
  flame_safetensors_release(resume_file);
  flame_ctx_destroy(ctx);
  free(text);
  free(idx);
  free(tgt);
  return status;
#undef CHECK
}

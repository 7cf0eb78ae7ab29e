/*
 * train_gpt.c - a character-level GPT trained from C on a plain-text file.
 *
 *   data   the bytes of a text file (default: the project's documentation, concatenated by the
 *          build into corpus.txt; any file with --text); the last 10% is held out for validation
 *   model  byte embedding + learned positions, `--layers` pre-norm blocks (layer norm, causal
 *          scaled-dot-product attention with heads split from one qkv projection, GELU MLP with the
 *          activation fused into the GEMM), final layer norm, head tied to the embedding
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

#include "flame.h"

#define EXIT_NO_GPU 2
#define PI 3.14159265358979323846
#define VOCAB 256
#define MAX_LAYERS 16
#define MAX_TRACKED 1024

#ifndef FLAME_EXAMPLE_TEXT
#define FLAME_EXAMPLE_TEXT "README.md"
#endif

/* ---------------------------------------------------------------- a scope of tensor handles
 * Every intermediate of a forward pass is tracked here and released together; the first failing
 * call is remembered with its message and makes the remaining calls no-ops. */
typedef struct scope {
  flame_tensor_t t[MAX_TRACKED];
  int n;
  flame_status_t st;
  char msg[512];
  const char* where;
} scope;

static void scope_fail(scope* s, flame_status_t st, const char* where) {
  if (s->st != FLAME_OK) return;
  s->st = st;
  s->where = where;
  snprintf(s->msg, sizeof s->msg, "%s", flame_last_error_message());
}

static void track(scope* s, flame_status_t st, flame_tensor_t t, const char* where) {
  if (st != FLAME_OK) scope_fail(s, st, where);
  if (!t) return;
  if (s->n == MAX_TRACKED) {
    flame_tensor_release(t);
    flame_set_error_message("train_gpt: too many live intermediates");
    scope_fail(s, FLAME_ERROR_INTERNAL, where);
    return;
  }
  s->t[s->n++] = t;
}

static void scope_release(scope* s) {
  while (s->n > 0) flame_tensor_release(s->t[--s->n]);
}

/* var = the result of call (which writes &var), tracked in s; skipped after a failure. */
#define DO(s, var, call)                              \
  do {                                                \
    (var) = NULL;                                     \
    if ((s)->st == FLAME_OK) {                        \
      flame_status_t st_ = (call);                    \
      track((s), st_, (var), #call);                  \
    }                                                 \
  } while (0)

static int report(const scope* s) {
  fprintf(stderr, "train_gpt: %s failed: %s: %s\n", s->where ? s->where : "?", flame_status_string(s->st), s->msg);
  return 1;
}

/* ---------------------------------------------------------------- configuration and data */
typedef struct config {
  const char* text;
  const char* save;
  const char* resume;
  int steps, batch, block, dim, heads, layers, log_every, sample_every, bf16;
  double lr, target_loss;
  uint64_t seed;
} config;

static uint64_t rng_next(uint64_t* s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 2685821657736338717ull;
}
static double rng_uniform(uint64_t* s) { return (double)(rng_next(s) >> 11) / 9007199254740992.0; }

static unsigned char* read_text(const char* path, long* size) {
  FILE* f = fopen(path, "rb");
  if (!f) return NULL;
  unsigned char* buf = NULL;
  long n = 0;
  if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0) {
    buf = malloc((size_t)n);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
      free(buf);
      buf = NULL;
    }
  }
  fclose(f);
  *size = n;
  return buf;
}

/* Random windows of text[lo, hi): idx [B, T] and the next bytes as targets [B, T] (i64). */
static void make_batch(uint64_t* s, const unsigned char* text, long lo, long hi, int B, int T, int64_t* idx, int64_t* tgt) {
  for (int b = 0; b < B; ++b) {
    long start = lo + (long)(rng_uniform(s) * (double)(hi - lo - T - 1));
    for (int t = 0; t < T; ++t) {
      idx[b * T + t] = text[start + t];
      tgt[b * T + t] = text[start + t + 1];
    }
  }
}

/* ---------------------------------------------------------------- the model */
typedef struct block {
  flame_tensor_t ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, out_w, out_b;
} block;

typedef struct model {
  int dim, heads, layers, block_size;
  flame_dtype_t dtype;
  flame_tensor_t wte, wpe, lnf_w, lnf_b;
  block h[MAX_LAYERS];
} model;

/* The parameters in a fixed order with their names; *decay says which get weight decay. */
#define PARAMS_PER_BLOCK 12
static int model_params(model* m, flame_tensor_t** slots, char names[][48], int* decay) {
  int n = 0;
#define P(field, nm, d)                          \
  do {                                           \
    slots[n] = &(field);                         \
    snprintf(names[n], 48, "%s", nm);            \
    decay[n++] = d;                              \
  } while (0)
  P(m->wte, "wte", 1);
  P(m->wpe, "wpe", 0);
  for (int l = 0; l < m->layers; ++l) {
    block* b = &m->h[l];
    char nm[48];
#define PB(field, suffix, d)                                     \
  do {                                                           \
    snprintf(nm, sizeof nm, "h.%d.%s", l, suffix);               \
    P(b->field, nm, d);                                          \
  } while (0)
    PB(ln1_w, "ln1.weight", 0); PB(ln1_b, "ln1.bias", 0);
    PB(qkv_w, "attn.qkv.weight", 1); PB(qkv_b, "attn.qkv.bias", 0);
    PB(proj_w, "attn.proj.weight", 1); PB(proj_b, "attn.proj.bias", 0);
    PB(ln2_w, "ln2.weight", 0); PB(ln2_b, "ln2.bias", 0);
    PB(fc_w, "mlp.fc.weight", 1); PB(fc_b, "mlp.fc.bias", 0);
    PB(out_w, "mlp.proj.weight", 1); PB(out_b, "mlp.proj.bias", 0);
#undef PB
  }
  P(m->lnf_w, "ln_f.weight", 0);
  P(m->lnf_b, "ln_f.bias", 0);
#undef P
  return n;
}

/* A parameter leaf: normal(0, std) when std > 0, else filled with `fill`. */
static flame_status_t param(flame_ctx_t ctx, flame_dtype_t dt, const int64_t* shape, int nd, double std, double fill,
                            flame_tensor_t* out) {
  flame_tensor_t r = NULL;
  flame_status_t st;
  if (std > 0) {
    st = flame_randn(ctx, shape, nd, dt, &r);
    if (st == FLAME_OK) st = flame_mul_scalar(r, std, out);
  } else {
    st = flame_full(ctx, shape, nd, dt, fill, out);
  }
  flame_tensor_release(r);
  return st;
}

/* GPT-2's initialisation: normal(0, 0.02), residual projections scaled by 1 / sqrt(2 L). */
static flame_status_t model_init(flame_ctx_t ctx, model* m) {
  const int64_t d = m->dim, V = VOCAB;
  const double res = 0.02 / sqrt(2.0 * m->layers);
  flame_status_t st = FLAME_OK;
  int64_t s_vd[2] = {V, d}, s_td[2] = {m->block_size, d}, s_d[1] = {d};
#define INIT(field, shape, nd, std, fill) \
  if (st == FLAME_OK) st = param(ctx, m->dtype, shape, nd, std, fill, &(field))
  INIT(m->wte, s_vd, 2, 0.02, 0);
  INIT(m->wpe, s_td, 2, 0.01, 0);
  INIT(m->lnf_w, s_d, 1, 0, 1.0);
  INIT(m->lnf_b, s_d, 1, 0, 0.0);
  for (int l = 0; l < m->layers; ++l) {
    block* b = &m->h[l];
    int64_t s_3dd[2] = {3 * d, d}, s_3d[1] = {3 * d}, s_dd[2] = {d, d}, s_4dd[2] = {4 * d, d}, s_4d[1] = {4 * d},
            s_d4d[2] = {d, 4 * d};
    INIT(b->ln1_w, s_d, 1, 0, 1.0);
    INIT(b->ln1_b, s_d, 1, 0, 0.0);
    INIT(b->qkv_w, s_3dd, 2, 0.02, 0);
    INIT(b->qkv_b, s_3d, 1, 0, 0.0);
    INIT(b->proj_w, s_dd, 2, res, 0);
    INIT(b->proj_b, s_d, 1, 0, 0.0);
    INIT(b->ln2_w, s_d, 1, 0, 1.0);
    INIT(b->ln2_b, s_d, 1, 0, 0.0);
    INIT(b->fc_w, s_4dd, 2, 0.02, 0);
    INIT(b->fc_b, s_4d, 1, 0, 0.0);
    INIT(b->out_w, s_d4d, 2, res, 0);
    INIT(b->out_b, s_d, 1, 0, 0.0);
  }
#undef INIT
  return st;
}

/* logits [B, T, V] for idx [B, T] (i64), T <= block size. Intermediates live in s. */
static flame_tensor_t forward(scope* s, const model* m, flame_tensor_t idx, int B, int T) {
  const int64_t d = m->dim, H = m->heads, hd = m->dim / m->heads;
  const int64_t norm_shape[1] = {d};
  const int64_t split[5] = {B, T, 3, H, hd}, merged[3] = {B, T, d};
  const int32_t qkv_order[5] = {2, 0, 3, 1, 4}, back[4] = {0, 2, 1, 3};
  flame_attention_options_t ao;
  flame_tensor_t tok, wpe_t, x, nx, h, qkv, qkv5, heads, q, k, v, a, at, am, proj, fc, out, logits;
  if (s->st == FLAME_OK) {
    flame_status_t st = flame_attention_options_init(&ao);
    if (st != FLAME_OK) scope_fail(s, st, "flame_attention_options_init");
  }
  ao.flags = FLAME_ATTENTION_CAUSAL;
  DO(s, tok, flame_embedding(m->wte, idx, FLAME_NO_PADDING, &tok));           /* [B, T, d] */
  DO(s, wpe_t, flame_narrow(m->wpe, 0, 0, T, &wpe_t));                        /* [T, d] */
  DO(s, x, flame_add(tok, wpe_t, &x));                                        /* broadcast over B */
  for (int l = 0; l < m->layers; ++l) {
    const block* b = &m->h[l];
    DO(s, h, flame_layer_norm(x, norm_shape, 1, b->ln1_w, b->ln1_b, 1e-5, &h));
    DO(s, qkv, flame_linear(h, b->qkv_w, b->qkv_b, FLAME_ACTIVATION_NONE, &qkv)); /* [B, T, 3d] */
    DO(s, qkv5, flame_reshape(qkv, split, 5, &qkv5));                             /* [B, T, 3, H, hd] */
    DO(s, heads, flame_permute(qkv5, qkv_order, 5, &heads));                      /* [3, B, H, T, hd] views */
    DO(s, q, flame_select(heads, 0, 0, &q));
    DO(s, k, flame_select(heads, 0, 1, &k));
    DO(s, v, flame_select(heads, 0, 2, &v));
    DO(s, a, flame_scaled_dot_product_attention(q, k, v, NULL, &ao, &a));         /* [B, H, T, hd] */
    DO(s, at, flame_permute(a, back, 4, &at));                                    /* [B, T, H, hd] */
    DO(s, am, flame_reshape(at, merged, 3, &am));
    DO(s, proj, flame_linear(am, b->proj_w, b->proj_b, FLAME_ACTIVATION_NONE, &proj));
    DO(s, nx, flame_add(x, proj, &nx));
    x = nx;
    DO(s, h, flame_layer_norm(x, norm_shape, 1, b->ln2_w, b->ln2_b, 1e-5, &h));
    DO(s, fc, flame_linear(h, b->fc_w, b->fc_b, FLAME_ACTIVATION_GELU_TANH, &fc));
    DO(s, out, flame_linear(fc, b->out_w, b->out_b, FLAME_ACTIVATION_NONE, &out));
    DO(s, nx, flame_add(x, out, &nx));
    x = nx;
  }
  DO(s, h, flame_layer_norm(x, norm_shape, 1, m->lnf_w, m->lnf_b, 1e-5, &h));
  DO(s, logits, flame_linear(h, m->wte, NULL, FLAME_ACTIVATION_NONE, &logits)); /* tied head */
  return logits;
}

static flame_tensor_t loss_of(scope* s, flame_tensor_t logits, flame_tensor_t targets, int BT) {
  const int64_t flat[2] = {BT, VOCAB}, tflat[1] = {BT};
  flame_tensor_t l2, t1, loss;
  DO(s, l2, flame_reshape(logits, flat, 2, &l2));
  DO(s, t1, flame_reshape(targets, tflat, 1, &t1));
  DO(s, loss, flame_cross_entropy(l2, t1, NULL, -100, 0.0, FLAME_REDUCTION_MEAN, &loss));
  return loss;
}

/* Mean validation loss over a few fixed batches, without recording a graph. */
static flame_status_t validate(flame_ctx_t ctx, const model* m, const unsigned char* text, long lo, long hi, int B, int T,
                               int64_t* idx, int64_t* tgt, double* out) {
  scope s;
  memset(&s, 0, sizeof s);
  int32_t prev = 1;
  uint64_t r = 0xA0761D6478BD642Full; /* the same batches every time */
  double sum = 0;
  const int64_t shape[2] = {B, T};
  flame_status_t st = flame_ctx_set_grad_enabled(ctx, 0, &prev);
  if (st != FLAME_OK) return st;
  for (int i = 0; i < 4 && s.st == FLAME_OK; ++i) {
    flame_tensor_t ti, tt, logits, loss;
    double v = 0;
    make_batch(&r, text, lo, hi, B, T, idx, tgt);
    DO(&s, ti, flame_from_host(ctx, idx, sizeof(int64_t) * (size_t)(B * T), shape, 2, FLAME_DTYPE_I64, &ti));
    DO(&s, tt, flame_from_host(ctx, tgt, sizeof(int64_t) * (size_t)(B * T), shape, 2, FLAME_DTYPE_I64, &tt));
    logits = forward(&s, m, ti, B, T);
    loss = loss_of(&s, logits, tt, B * T);
    if (s.st == FLAME_OK) {
      flame_status_t e = flame_tensor_item(loss, &v);
      if (e != FLAME_OK) scope_fail(&s, e, "flame_tensor_item");
    }
    sum += v;
    scope_release(&s);
  }
  flame_ctx_set_grad_enabled(ctx, prev, NULL);
  if (s.st != FLAME_OK) {
    report(&s);
    return s.st;
  }
  *out = sum / 4;
  return FLAME_OK;
}

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

/*
 * gpt_model.h - the character-level GPT of train_gpt.c and lora_finetune.c: its parameters and their
 * safetensors names, initialisation, forward pass, loss and validation, and the text batches.
 *
 *   model  byte embedding + learned positions, `layers` pre-norm blocks (layer norm, causal
 *          scaled-dot-product attention with heads split from one qkv projection, GELU MLP with the
 *          activation fused into the GEMM), final layer norm, head tied to the embedding
 *   names  "wte", "wpe", "h.<l>.ln1.weight", "h.<l>.attn.qkv.weight", ... "ln_f.bias" (model_params);
 *          train_gpt --save also writes the metadata entry "train_gpt.config" =
 *          {"dim": D, "heads": H, "layers": L, "block": T}
 *   LoRA   each block's four linear layers (attn.qkv, attn.proj, mlp.fc, mlp.proj) may carry a
 *          flame_lora_t (model.lora[l][k], NULL for none); the forward then calls flame_lora_forward
 *          for that layer (and applies the GELU after it, since the adapter's output is not fused)
 *
 * Intermediates of forward / loss_of belong to the handle scope the caller has open (validate opens
 * its own per batch). Header only (static functions), C99; include example_check.h first
 * (EXAMPLE_NAME defined).
 */
#ifndef FLAME_EXAMPLES_GPT_MODEL_H
#define FLAME_EXAMPLES_GPT_MODEL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flame.h"
#include "example_check.h"

#define VOCAB 256
#define MAX_LAYERS 16

/* ---------------------------------------------------------------- data */
static inline uint64_t rng_next(uint64_t* s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 2685821657736338717ull;
}
static inline double rng_uniform(uint64_t* s) { return (double)(rng_next(s) >> 11) / 9007199254740992.0; }

/* The whole file at path (malloc'ed; NULL when it cannot be read), its size in *size. */
static inline unsigned char* read_text(const char* path, long* size) {
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
static inline void make_batch(uint64_t* s, const unsigned char* text, long lo, long hi, int B, int T, int64_t* idx, int64_t* tgt) {
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

/* The adapted linear layers of a block, in the order of model.lora[l][k]. */
enum { LORA_QKV = 0, LORA_PROJ = 1, LORA_FC = 2, LORA_OUT = 3, LORA_PER_BLOCK = 4 };

typedef struct model {
  int dim, heads, layers, block_size;
  flame_dtype_t dtype;
  flame_tensor_t wte, wpe, lnf_w, lnf_b;
  block h[MAX_LAYERS];
  flame_lora_t lora[MAX_LAYERS][LORA_PER_BLOCK]; /* NULL: the plain linear layer */
} model;

/* The parameters in a fixed order with their names; *decay says which get weight decay. */
#define PARAMS_PER_BLOCK 12
static inline int model_params(model* m, flame_tensor_t** slots, char names[][48], int* decay) {
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

/* OUT *out: a named parameter list (flame_params_t) of the model's parameters, under model_params's
 * names: what train_gpt --save writes and --resume / lora_finetune load. Release it with
 * flame_params_release (the parameters stay). */
static inline flame_status_t model_param_list(flame_ctx_t ctx, model* m, flame_params_t* out) {
  flame_tensor_t* slots[2 + PARAMS_PER_BLOCK * MAX_LAYERS + 2];
  char names[2 + PARAMS_PER_BLOCK * MAX_LAYERS + 2][48];
  int decay[2 + PARAMS_PER_BLOCK * MAX_LAYERS + 2];
  const int n = model_params(m, slots, names, decay);
  flame_status_t st = flame_params_create(ctx, out);
  for (int i = 0; i < n && st == FLAME_OK; ++i) st = flame_params_add(*out, names[i], *slots[i]);
  return st;
}

/* A parameter leaf: normal(0, std) when std > 0, else filled with `fill`; uninitialised memory
 * when !init (its values are loaded next). */
static inline flame_status_t param(flame_ctx_t ctx, flame_dtype_t dt, const int64_t* shape, int nd, double std, double fill,
                                   int init, flame_tensor_t* out) {
  flame_tensor_t r = NULL;
  flame_status_t st;
  if (!init) {
    st = flame_empty(ctx, shape, nd, dt, out);
  } else if (std > 0) {
    st = flame_randn(ctx, shape, nd, dt, &r);
    if (st == FLAME_OK) st = flame_mul_scalar(r, std, out);
  } else {
    st = flame_full(ctx, shape, nd, dt, fill, out);
  }
  flame_tensor_release(r);
  return st;
}

/* GPT-2's initialisation: normal(0, 0.02), residual projections scaled by 1 / sqrt(2 L); with
 * init 0 the parameters are only allocated (no random numbers drawn), for loading. */
static inline flame_status_t model_init(flame_ctx_t ctx, model* m, int init) {
  const int64_t d = m->dim, V = VOCAB;
  const double res = 0.02 / sqrt(2.0 * m->layers);
  flame_status_t st = FLAME_OK;
  int64_t s_vd[2] = {V, d}, s_td[2] = {m->block_size, d}, s_d[1] = {d};
#define INIT(field, shape, nd, std, fill) \
  if (st == FLAME_OK) st = param(ctx, m->dtype, shape, nd, std, fill, init, &(field))
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

/* activation(x @ w^T + b) (flame_linear), or through the adapter when lora is not NULL: the
 * adapter's output is linear(x, w, b) + scale * B A x, and the GELU follows as a separate op. */
static inline flame_tensor_t linear_or_lora(check* s, flame_lora_t lora, flame_tensor_t x, flame_tensor_t w, flame_tensor_t b,
                                            int32_t act) {
  flame_tensor_t y, g;
  if (!lora) {
    DO(s, y, flame_linear(x, w, b, act, &y));
    return y;
  }
  DO(s, y, flame_lora_forward(lora, x, &y));
  if (act == FLAME_ACTIVATION_NONE) return y;
  DO(s, g, flame_gelu(y, 1, &g)); /* the tanh approximation, as FLAME_ACTIVATION_GELU_TANH */
  return g;
}

/* logits [B, T, V] for idx [B, T] (i64), T <= block size. Intermediates belong to the caller's
 * handle scope; s records the first failure. */
static inline flame_tensor_t forward(check* s, const model* m, flame_tensor_t idx, int B, int T) {
  const int64_t d = m->dim, H = m->heads, hd = m->dim / m->heads;
  const int64_t norm_shape[1] = {d};
  const int64_t split[5] = {B, T, 3, H, hd}, merged[3] = {B, T, d};
  const int32_t qkv_order[5] = {2, 0, 3, 1, 4}, back[4] = {0, 2, 1, 3};
  flame_attention_options_t ao;
  flame_tensor_t tok, wpe_t, x, nx, h, qkv, qkv5, heads, q, k, v, a, at, am, proj, fc, out, logits;
  if (s->st == FLAME_OK) {
    flame_status_t st = flame_attention_options_init(&ao);
    if (st != FLAME_OK) check_fail(s, st, "flame_attention_options_init");
  }
  ao.flags = FLAME_ATTENTION_CAUSAL;
  DO(s, tok, flame_embedding(m->wte, idx, FLAME_NO_PADDING, &tok));           /* [B, T, d] */
  DO(s, wpe_t, flame_narrow(m->wpe, 0, 0, T, &wpe_t));                        /* [T, d] */
  DO(s, x, flame_add(tok, wpe_t, &x));                                        /* broadcast over B */
  for (int l = 0; l < m->layers; ++l) {
    const block* b = &m->h[l];
    DO(s, h, flame_layer_norm(x, norm_shape, 1, b->ln1_w, b->ln1_b, 1e-5, &h));
    qkv = linear_or_lora(s, m->lora[l][LORA_QKV], h, b->qkv_w, b->qkv_b, FLAME_ACTIVATION_NONE); /* [B, T, 3d] */
    DO(s, qkv5, flame_reshape(qkv, split, 5, &qkv5));                             /* [B, T, 3, H, hd] */
    DO(s, heads, flame_permute(qkv5, qkv_order, 5, &heads));                      /* [3, B, H, T, hd] views */
    DO(s, q, flame_select(heads, 0, 0, &q));
    DO(s, k, flame_select(heads, 0, 1, &k));
    DO(s, v, flame_select(heads, 0, 2, &v));
    DO(s, a, flame_scaled_dot_product_attention(q, k, v, NULL, &ao, &a));         /* [B, H, T, hd] */
    DO(s, at, flame_permute(a, back, 4, &at));                                    /* [B, T, H, hd] */
    DO(s, am, flame_reshape(at, merged, 3, &am));
    proj = linear_or_lora(s, m->lora[l][LORA_PROJ], am, b->proj_w, b->proj_b, FLAME_ACTIVATION_NONE);
    DO(s, nx, flame_add(x, proj, &nx));
    x = nx;
    DO(s, h, flame_layer_norm(x, norm_shape, 1, b->ln2_w, b->ln2_b, 1e-5, &h));
    fc = linear_or_lora(s, m->lora[l][LORA_FC], h, b->fc_w, b->fc_b, FLAME_ACTIVATION_GELU_TANH);
    out = linear_or_lora(s, m->lora[l][LORA_OUT], fc, b->out_w, b->out_b, FLAME_ACTIVATION_NONE);
    DO(s, nx, flame_add(x, out, &nx));
    x = nx;
  }
  DO(s, h, flame_layer_norm(x, norm_shape, 1, m->lnf_w, m->lnf_b, 1e-5, &h));
  DO(s, logits, flame_linear(h, m->wte, NULL, FLAME_ACTIVATION_NONE, &logits)); /* tied head */
  return logits;
}

static inline flame_tensor_t loss_of(check* s, flame_tensor_t logits, flame_tensor_t targets, int BT) {
  const int64_t flat[2] = {BT, VOCAB}, tflat[1] = {BT};
  flame_tensor_t l2, t1, loss;
  DO(s, l2, flame_reshape(logits, flat, 2, &l2));
  DO(s, t1, flame_reshape(targets, tflat, 1, &t1));
  DO(s, loss, flame_cross_entropy(l2, t1, NULL, -100, 0.0, FLAME_REDUCTION_MEAN, &loss));
  return loss;
}

/* Mean validation loss over a few fixed batches, without recording a graph. */
static inline flame_status_t validate(flame_ctx_t ctx, const model* m, const unsigned char* text, long lo, long hi, int B, int T,
                               int64_t* idx, int64_t* tgt, double* out) {
  check s;
  memset(&s, 0, sizeof s);
  int32_t prev = 1;
  uint64_t r = 0xA0761D6478BD642Full; /* the same batches every time */
  double sum = 0;
  const int64_t shape[2] = {B, T};
  flame_status_t st = flame_ctx_set_grad_enabled(ctx, 0, &prev);
  if (st != FLAME_OK) return st;
  for (int i = 0; i < 4 && s.st == FLAME_OK; ++i) {
    flame_tensor_t ti, tt, logits, loss;
    flame_scope_t batch_scope; /* this batch's intermediates */
    double v = 0;
    make_batch(&r, text, lo, hi, B, T, idx, tgt);
    begin_scope(&s, ctx, &batch_scope);
    DO(&s, ti, flame_from_host(ctx, idx, sizeof(int64_t) * (size_t)(B * T), shape, 2, FLAME_DTYPE_I64, &ti));
    DO(&s, tt, flame_from_host(ctx, tgt, sizeof(int64_t) * (size_t)(B * T), shape, 2, FLAME_DTYPE_I64, &tt));
    logits = forward(&s, m, ti, B, T);
    loss = loss_of(&s, logits, tt, B * T);
    if (s.st == FLAME_OK) {
      flame_status_t e = flame_tensor_item(loss, &v);
      if (e != FLAME_OK) check_fail(&s, e, "flame_tensor_item");
    }
    sum += v;
    end_scope(&s, &batch_scope);
  }
  flame_ctx_set_grad_enabled(ctx, prev, NULL);
  if (s.st != FLAME_OK) {
    report(&s);
    return s.st;
  }
  *out = sum / 4;
  return FLAME_OK;
}


#endif /* FLAME_EXAMPLES_GPT_MODEL_H */

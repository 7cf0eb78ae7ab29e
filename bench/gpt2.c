/*
 * gpt2.c - GPT-2 (124M by default) training step on FLAME's public C API, the T3/T4/T5 workload of
 * bench/run.py (entry points: bench/gpt2.h; the same model in PyTorch: bench/gpt2_torch.py).
 *
 *   model   token embedding wte [V, d] + learned positions wpe [block, d]; `layers` pre-LayerNorm
 *           blocks: x += c_proj(attention(c_attn(ln_1(x)))), x += c_proj(gelu_tanh(c_fc(ln_2(x))))
 *           with causal SDPA (FLAME's fused flash kernels in bf16) on heads split from one qkv
 *           projection (views, no copy), the GELU fused into c_fc's GEMM epilogue; ln_f; the head
 *           is tied to wte; mean cross-entropy over all B*T positions.
 *   numbers f32 parameters, gradients and AdamW state; the forward and the loss run under bf16
 *           autocast (flame_ctx_set_autocast), as torch.autocast: matrix products and attention in
 *           bf16, layer norms and the loss in f32, the residual stream in f32 (f32 + bf16 -> f32).
 *   optim   AdamW (lr 6e-4, betas 0.9/0.95, eps 1e-8) in two parameter groups: weight decay 0.1
 *           on the 2-D tensors (embeddings and matrices), 0 on biases and norm parameters.
 *
 * Intermediates of a step live in a scope released after the optimizer step; the first failing
 * FLAME call is recorded with its message and makes the rest of the step a no-op.
 *
 *   data parallel  gpt2_dp_run: one model (context) per GPU of this process, one thread per rank,
 *           an NCCL communicator over them (flame_comm_create_group) and flame_dp over the
 *           parameter list (default bucket size): gpt2_step then waits for the averaged gradients
 *           (flame_dp_wait) before the optimizer step. World 1 is the plain step, timed the same way.
 */
#define _POSIX_C_SOURCE 200112L /* pthreads and clock_gettime under strict C11 */
#include "gpt2.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flame.h"
#include "bench_util.h"

#define PER_LAYER 12 /* parameter tensors per block */
#define NAME_LEN 64

/* ---------------------------------------------------------------- errors (per thread) */
static _Thread_local char g_error[2048];

static void set_error(const char* what, flame_status_t st) {
  snprintf(g_error, sizeof g_error, "%s: %s: %s", what, flame_status_string(st), flame_last_error_message());
}

static int32_t fail(flame_status_t st, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_error, sizeof g_error, fmt, ap);
  va_end(ap);
  return (int32_t)st;
}

const char* gpt2_last_error(void) { return g_error; }

/* ---------------------------------------------------------------- a scope of intermediates */
typedef struct scope {
  flame_tensor_t* t;
  int n, cap;
  flame_status_t st;
} scope;

static void track(scope* s, flame_status_t st, flame_tensor_t t, const char* what) {
  if (st != FLAME_OK && s->st == FLAME_OK) {
    s->st = st;
    set_error(what, st);
  }
  if (!t) return;
  if (s->n == s->cap) { /* cap is sized from the layer count; reaching it is a bug here */
    flame_tensor_release(t);
    if (s->st == FLAME_OK) s->st = (flame_status_t)fail(FLAME_ERROR_INTERNAL, "gpt2: scope of %d tensors is full", s->cap);
    return;
  }
  s->t[s->n++] = t;
}

static void scope_release(scope* s) {
  while (s->n > 0) flame_tensor_release(s->t[--s->n]);
}

/* var = the result of call (which writes &var), tracked in s; skipped after a failure. */
#define DO(s, var, call)               \
  do {                                 \
    (var) = NULL;                      \
    if ((s)->st == FLAME_OK) {         \
      flame_status_t st_ = (call);     \
      track((s), st_, (var), #call);   \
    }                                  \
  } while (0)

/* ---------------------------------------------------------------- the model */
struct gpt2_model_s {
  gpt2_config cfg;
  flame_ctx_t ctx;
  int n_params;
  flame_tensor_t* p;                /* parameters, in the order of param_spec */
  char (*names)[NAME_LEN];
  flame_optimizer_t opt;
  flame_tensor_t tokens, targets;   /* [B, T] and [B * T] (i64) */
  flame_tensor_t loss;              /* the last step's loss (0-d f32) */
  flame_dp_t dp;                    /* gpt2_dp_run with several GPUs: the gradient synchroniser */
  flame_graph_t graph;              /* gpt2_graph_capture: one captured step */
  scope s;
};

/* Indices into p: wte, wpe, then PER_LAYER per block, then ln_f. */
enum { P_WTE = 0, P_WPE = 1, P_BLOCKS = 2 };
enum { B_LN1_W, B_LN1_B, B_ATTN_W, B_ATTN_B, B_APROJ_W, B_APROJ_B, B_LN2_W, B_LN2_B, B_FC_W, B_FC_B, B_MPROJ_W, B_MPROJ_B };
#define BP(g, l, k) ((g)->p[P_BLOCKS + (l) * PER_LAYER + (k)])
#define LNF_W(g) ((g)->p[P_BLOCKS + (int)(g)->cfg.layers * PER_LAYER])
#define LNF_B(g) ((g)->p[P_BLOCKS + (int)(g)->cfg.layers * PER_LAYER + 1])

/* Name, shape and initialisation of parameter i (nanoGPT's: normal(0, 0.02), the residual
 * projections 0.02 / sqrt(2 layers), biases 0, norm weights 1). *std > 0: normal; else fill. */
static void param_spec(const gpt2_config* c, int i, char* name, int64_t* shape, int* nd, double* std, double* fill) {
  const int64_t d = c->dim;
  const int last = P_BLOCKS + (int)c->layers * PER_LAYER;
  *std = 0;
  *fill = 0;
  if (i == P_WTE || i == P_WPE) {
    snprintf(name, NAME_LEN, "transformer.%s.weight", i == P_WTE ? "wte" : "wpe");
    shape[0] = i == P_WTE ? c->vocab : c->block;
    shape[1] = d;
    *nd = 2;
    *std = 0.02;
    return;
  }
  if (i >= last) {
    snprintf(name, NAME_LEN, "transformer.ln_f.%s", i == last ? "weight" : "bias");
    shape[0] = d;
    *nd = 1;
    *fill = i == last ? 1.0 : 0.0;
    return;
  }
  static const char* const suffix[PER_LAYER] = {
      "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
      "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"};
  const int l = (i - P_BLOCKS) / PER_LAYER, k = (i - P_BLOCKS) % PER_LAYER;
  snprintf(name, NAME_LEN, "transformer.h.%d.%s", l, suffix[k]);
  const double res = 0.02 / sqrt(2.0 * (double)c->layers);
  switch (k) {
    case B_LN1_W: case B_LN2_W: shape[0] = d; *nd = 1; *fill = 1.0; break;
    case B_LN1_B: case B_LN2_B: case B_APROJ_B: case B_MPROJ_B: shape[0] = d; *nd = 1; break;
    case B_ATTN_W: shape[0] = 3 * d; shape[1] = d; *nd = 2; *std = 0.02; break;
    case B_ATTN_B: shape[0] = 3 * d; *nd = 1; break;
    case B_APROJ_W: shape[0] = d; shape[1] = d; *nd = 2; *std = res; break;
    case B_FC_W: shape[0] = 4 * d; shape[1] = d; *nd = 2; *std = 0.02; break;
    case B_FC_B: shape[0] = 4 * d; *nd = 1; break;
    default: /* B_MPROJ_W */ shape[0] = d; shape[1] = 4 * d; *nd = 2; *std = res; break;
  }
}

void gpt2_config_default(gpt2_config* c) {
  memset(c, 0, sizeof *c);
  c->vocab = 50304;
  c->block = 1024;
  c->layers = 12;
  c->heads = 12;
  c->dim = 768;
  c->batch = 8;
  c->seq = 1024;
  c->lr = 6e-4;
  c->weight_decay = 0.1;
  c->beta1 = 0.9;
  c->beta2 = 0.95;
  c->eps = 1e-8;
  c->seed = 1337;
  c->bf16 = 1;
  c->gemm_heuristic_only = 0;
}

static int32_t check_config(const gpt2_config* c) {
  if (c->vocab < 2 || c->block < 1 || c->layers < 1 || c->layers > 256 || c->heads < 1 || c->dim < 1 ||
      c->dim % c->heads != 0 || c->batch < 1 || c->seq < 1 || c->seq > c->block)
    return fail(FLAME_ERROR_INVALID_ARGUMENT,
                "gpt2_create: bad config (vocab %lld block %lld layers %lld heads %lld dim %lld batch %lld seq %lld): "
                "need layers in [1, 256], heads dividing dim, 1 <= seq <= block",
                (long long)c->vocab, (long long)c->block, (long long)c->layers, (long long)c->heads, (long long)c->dim,
                (long long)c->batch, (long long)c->seq);
  if (!(c->lr >= 0) || !(c->weight_decay >= 0) || !isfinite(c->beta1) || !isfinite(c->beta2) || !(c->eps > 0))
    return fail(FLAME_ERROR_INVALID_ARGUMENT, "gpt2_create: bad optimizer hyper-parameters");
  return FLAME_OK;
}

/* Parameter i from the context's generator. */
static flame_status_t init_param(gpt2_t g, int i) {
  char name[NAME_LEN];
  int64_t shape[2];
  int nd;
  double std, fill;
  param_spec(&g->cfg, i, name, shape, &nd, &std, &fill);
  flame_status_t st;
  if (std > 0) {
    flame_tensor_t r = NULL;
    st = flame_randn(g->ctx, shape, nd, FLAME_DTYPE_F32, &r);
    if (st == FLAME_OK) st = flame_mul_scalar(r, std, &g->p[i]);
    flame_tensor_release(r);
  } else {
    st = flame_full(g->ctx, shape, nd, FLAME_DTYPE_F32, fill, &g->p[i]);
  }
  if (st != FLAME_OK) set_error(name, st);
  return st;
}

/* Parameter i from an open safetensors file: it must be there, f32, with the model's shape. */
static flame_status_t load_param(gpt2_t g, flame_safetensors_t f, int i, const char* path) {
  char name[NAME_LEN];
  int64_t shape[2], got[FLAME_MAX_DIMS];
  int nd;
  int32_t got_nd = 0;
  double std, fill;
  flame_dtype_t dt;
  param_spec(&g->cfg, i, name, shape, &nd, &std, &fill);
  flame_status_t st = flame_safetensors_get(f, name, &g->p[i]);
  if (st != FLAME_OK) {
    char what[NAME_LEN + 256];
    snprintf(what, sizeof what, "flame_safetensors_get(%.200s, \"%s\")", path, name);
    set_error(what, st);
    return st;
  }
  if ((st = flame_tensor_dtype(g->p[i], &dt)) != FLAME_OK || (st = flame_tensor_ndim(g->p[i], &got_nd)) != FLAME_OK ||
      (got_nd <= FLAME_MAX_DIMS && (st = flame_tensor_shape(g->p[i], got, FLAME_MAX_DIMS)) != FLAME_OK)) {
    set_error(name, st);
    return st;
  }
  int ok = dt == FLAME_DTYPE_F32 && got_nd == nd;
  for (int k = 0; ok && k < nd; ++k) ok = got[k] == shape[k];
  if (!ok)
    return (flame_status_t)fail(FLAME_ERROR_SHAPE_MISMATCH, "gpt2_create: %s in %s is %s with %d dims (%lld, ...); "
                                "the model needs f32 [%lld%s%lld]", name, path, flame_dtype_name(dt), (int)got_nd,
                                (long long)(got_nd > 0 ? got[0] : 0), (long long)shape[0], nd == 2 ? ", " : "",
                                nd == 2 ? (long long)shape[1] : 0LL);
  return FLAME_OK;
}

/* gpt2_create on CUDA device `device`. */
static int32_t create_on(const gpt2_config* cfg, int32_t device, const char* weights, const char* kernel_cache_dir, gpt2_t* out) {
  g_error[0] = 0;
  if (!out) return fail(FLAME_ERROR_INVALID_ARGUMENT, "gpt2_create: out is NULL");
  *out = NULL;
  if (!cfg) return fail(FLAME_ERROR_INVALID_ARGUMENT, "gpt2_create: cfg is NULL");
  int32_t rc = check_config(cfg);
  if (rc != FLAME_OK) return rc;
  gpt2_t g = calloc(1, sizeof *g);
  if (!g) return fail(FLAME_ERROR_OUT_OF_MEMORY, "gpt2_create: out of host memory");
  g->cfg = *cfg;
  g->n_params = P_BLOCKS + (int)cfg->layers * PER_LAYER + 2;
  g->p = calloc((size_t)g->n_params, sizeof *g->p);
  g->names = calloc((size_t)g->n_params, sizeof *g->names);
  g->s.cap = 24 * (int)cfg->layers + 32; /* about 17 tracked tensors per block */
  g->s.t = calloc((size_t)g->s.cap, sizeof *g->s.t);
  flame_tensor_t* decay = calloc((size_t)g->n_params, sizeof *decay);
  flame_tensor_t* no_decay = calloc((size_t)g->n_params, sizeof *no_decay);
  flame_safetensors_t file = NULL;
  flame_status_t st = FLAME_OK;
  if (!g->p || !g->names || !g->s.t || !decay || !no_decay) {
    st = (flame_status_t)fail(FLAME_ERROR_OUT_OF_MEMORY, "gpt2_create: out of host memory");
    goto done;
  }

  flame_ctx_options_t o;
  flame_ctx_options_init(&o);
  o.device = device;
  o.seed = (uint64_t)cfg->seed;
  o.kernel_cache_dir = kernel_cache_dir;
  o.gemm_heuristic_only = (int32_t)cfg->gemm_heuristic_only;
  if ((st = flame_ctx_create(&o, &g->ctx)) != FLAME_OK) {
    set_error("flame_ctx_create", st);
    goto done;
  }
  if (weights && (st = flame_safetensors_load(g->ctx, weights, &file)) != FLAME_OK) {
    set_error("flame_safetensors_load", st);
    goto done;
  }
  int nd_ = 0, nn = 0;
  for (int i = 0; i < g->n_params; ++i) {
    int64_t shape[2];
    int nd;
    double std, fill;
    param_spec(&g->cfg, i, g->names[i], shape, &nd, &std, &fill);
    st = file ? load_param(g, file, i, weights) : init_param(g, i);
    if (st != FLAME_OK) goto done;
    if ((st = flame_tensor_set_requires_grad(g->p[i], 1)) != FLAME_OK) {
      set_error("flame_tensor_set_requires_grad", st);
      goto done;
    }
    if (nd == 2) decay[nd_++] = g->p[i];
    else no_decay[nn++] = g->p[i];
  }

  flame_optimizer_options_t oo;
  if ((st = flame_optimizer_options_init(&oo, FLAME_OPTIMIZER_ADAMW)) != FLAME_OK) {
    set_error("flame_optimizer_options_init", st);
    goto done;
  }
  oo.lr = cfg->lr;
  oo.beta1 = cfg->beta1;
  oo.beta2 = cfg->beta2;
  oo.eps = cfg->eps;
  oo.weight_decay = cfg->weight_decay;
  if ((st = flame_optimizer_create(g->ctx, &oo, decay, nd_, &g->opt)) != FLAME_OK) {
    set_error("flame_optimizer_create (2-D weights, decayed)", st);
    goto done;
  }
  oo.weight_decay = 0.0;
  if ((st = flame_optimizer_add_param_group(g->opt, &oo, no_decay, nn, NULL)) != FLAME_OK) {
    set_error("flame_optimizer_add_param_group (biases and norms, no decay)", st);
    goto done;
  }
  if ((st = flame_ctx_synchronize(g->ctx)) != FLAME_OK) set_error("flame_ctx_synchronize after initialisation", st);

done:
  flame_safetensors_release(file);
  free(decay);
  free(no_decay);
  if (st != FLAME_OK) {
    gpt2_destroy(g);
    return (int32_t)st;
  }
  *out = g;
  return FLAME_OK;
}

int32_t gpt2_create(const gpt2_config* cfg, const char* weights, const char* kernel_cache_dir, gpt2_t* out) {
  return create_on(cfg, 0, weights, kernel_cache_dir, out);
}

void gpt2_destroy(gpt2_t g) {
  if (!g) return;
  flame_graph_release(g->graph);
  flame_dp_release(g->dp);
  if (g->s.t) scope_release(&g->s);
  flame_tensor_release(g->loss);
  flame_tensor_release(g->tokens);
  flame_tensor_release(g->targets);
  flame_optimizer_release(g->opt);
  if (g->p)
    for (int i = 0; i < g->n_params; ++i) flame_tensor_release(g->p[i]);
  flame_ctx_destroy(g->ctx);
  free(g->p);
  free(g->names);
  free(g->s.t);
  free(g);
}

int32_t gpt2_set_batch(gpt2_t g, const int64_t* tokens, const int64_t* targets) {
  g_error[0] = 0;
  if (!g || !tokens || !targets) return fail(FLAME_ERROR_INVALID_ARGUMENT, "gpt2_set_batch: NULL argument");
  const int64_t B = g->cfg.batch, T = g->cfg.seq, bt[2] = {B, T}, flat[1] = {B * T};
  const size_t nbytes = sizeof(int64_t) * (size_t)(B * T);
  flame_tensor_t tok = NULL, tgt2 = NULL, tgt = NULL;
  flame_status_t st = flame_from_host(g->ctx, tokens, nbytes, bt, 2, FLAME_DTYPE_I64, &tok);
  if (st != FLAME_OK) set_error("flame_from_host(tokens)", st);
  if (st == FLAME_OK && (st = flame_from_host(g->ctx, targets, nbytes, bt, 2, FLAME_DTYPE_I64, &tgt2)) != FLAME_OK)
    set_error("flame_from_host(targets)", st);
  if (st == FLAME_OK && (st = flame_reshape(tgt2, flat, 1, &tgt)) != FLAME_OK) set_error("flame_reshape(targets)", st);
  flame_tensor_release(tgt2);
  if (st != FLAME_OK) {
    flame_tensor_release(tok);
    flame_tensor_release(tgt);
    return (int32_t)st;
  }
  flame_tensor_release(g->tokens);
  flame_tensor_release(g->targets);
  g->tokens = tok;
  g->targets = tgt;
  return FLAME_OK;
}

/* The mean loss of the current batch, recorded for backward. Intermediates go to s. */
static flame_tensor_t forward_loss(gpt2_t g, scope* s) {
  const gpt2_config* c = &g->cfg;
  const int64_t B = c->batch, T = c->seq, d = c->dim, H = c->heads, hd = c->dim / c->heads;
  const int64_t norm_shape[1] = {d}, split[5] = {B, T, 3, H, hd}, merged[3] = {B, T, d}, rows[2] = {B * T, c->vocab};
  const int32_t qkv_order[5] = {2, 0, 3, 1, 4}, back[4] = {0, 2, 1, 3};
  flame_attention_options_t ao;
  flame_tensor_t tok, pos, x, nx, h, qkv, qkv5, heads, q, k, v, a, at, am, proj, fc, mo, logits, l2, loss;
  flame_status_t st = flame_attention_options_init(&ao);
  if (st != FLAME_OK) track(s, st, NULL, "flame_attention_options_init");
  ao.flags = FLAME_ATTENTION_CAUSAL;
  DO(s, tok, flame_embedding(g->p[P_WTE], g->tokens, FLAME_NO_PADDING, &tok)); /* [B, T, d] f32 */
  DO(s, pos, flame_narrow(g->p[P_WPE], 0, 0, T, &pos));                       /* [T, d] */
  DO(s, x, flame_add(tok, pos, &x));                                          /* broadcast over B */
  for (int l = 0; l < (int)c->layers; ++l) {
    DO(s, h, flame_layer_norm(x, norm_shape, 1, BP(g, l, B_LN1_W), BP(g, l, B_LN1_B), 1e-5, &h));
    DO(s, qkv, flame_linear(h, BP(g, l, B_ATTN_W), BP(g, l, B_ATTN_B), FLAME_ACTIVATION_NONE, &qkv)); /* [B, T, 3d] */
    DO(s, qkv5, flame_reshape(qkv, split, 5, &qkv5));                         /* [B, T, 3, H, hd] */
    DO(s, heads, flame_permute(qkv5, qkv_order, 5, &heads));                  /* [3, B, H, T, hd], a view */
    DO(s, q, flame_select(heads, 0, 0, &q));
    DO(s, k, flame_select(heads, 0, 1, &k));
    DO(s, v, flame_select(heads, 0, 2, &v));
    DO(s, a, flame_scaled_dot_product_attention(q, k, v, NULL, &ao, &a));     /* [B, H, T, hd] */
    DO(s, at, flame_permute(a, back, 4, &at));                                /* [B, T, H, hd] */
    DO(s, am, flame_reshape(at, merged, 3, &am));                             /* a view (cuDNN writes a in q's order) */
    DO(s, proj, flame_linear(am, BP(g, l, B_APROJ_W), BP(g, l, B_APROJ_B), FLAME_ACTIVATION_NONE, &proj));
    DO(s, nx, flame_add(x, proj, &nx));                                       /* f32 residual */
    x = nx;
    DO(s, h, flame_layer_norm(x, norm_shape, 1, BP(g, l, B_LN2_W), BP(g, l, B_LN2_B), 1e-5, &h));
    DO(s, fc, flame_linear(h, BP(g, l, B_FC_W), BP(g, l, B_FC_B), FLAME_ACTIVATION_GELU_TANH, &fc));
    DO(s, mo, flame_linear(fc, BP(g, l, B_MPROJ_W), BP(g, l, B_MPROJ_B), FLAME_ACTIVATION_NONE, &mo));
    DO(s, nx, flame_add(x, mo, &nx));
    x = nx;
  }
  DO(s, h, flame_layer_norm(x, norm_shape, 1, LNF_W(g), LNF_B(g), 1e-5, &h));
  DO(s, logits, flame_linear(h, g->p[P_WTE], NULL, FLAME_ACTIVATION_NONE, &logits)); /* tied head, [B, T, V] */
  DO(s, l2, flame_reshape(logits, rows, 2, &l2));
  DO(s, loss, flame_cross_entropy(l2, g->targets, NULL, -100, 0.0, FLAME_REDUCTION_MEAN, &loss));
  return loss;
}

int32_t gpt2_step(gpt2_t g, float* loss_out) {
  g_error[0] = 0;
  if (!g) return fail(FLAME_ERROR_INVALID_ARGUMENT, "gpt2_step: g is NULL");
  if (!g->tokens) return fail(FLAME_ERROR_INVALID_ARGUMENT, "gpt2_step: no batch (call gpt2_set_batch first)");
  scope* s = &g->s;
  s->st = FLAME_OK;
  int32_t prev = FLAME_AUTOCAST_OFF;
  if (g->cfg.bf16) {
    flame_status_t st = flame_ctx_set_autocast(g->ctx, FLAME_DTYPE_BF16, &prev);
    if (st != FLAME_OK) track(s, st, NULL, "flame_ctx_set_autocast");
  }
  flame_tensor_t loss = forward_loss(g, s);
  if (g->cfg.bf16) flame_ctx_set_autocast(g->ctx, prev, NULL); /* backward and the optimizer run outside autocast */
  flame_status_t st = s->st;
  if (st == FLAME_OK && (st = flame_backward(g->ctx, loss, NULL, 0)) != FLAME_OK) set_error("flame_backward", st);
  if (st == FLAME_OK && g->dp && (st = flame_dp_wait(g->dp)) != FLAME_OK) set_error("flame_dp_wait", st); /* averaged .grad */
  if (st == FLAME_OK && (st = flame_optimizer_step(g->opt)) != FLAME_OK) set_error("flame_optimizer_step", st);
  if (st == FLAME_OK && (st = flame_optimizer_zero_grad(g->opt, 1)) != FLAME_OK) set_error("flame_optimizer_zero_grad", st);
  if (st == FLAME_OK && (st = flame_tensor_retain(loss)) != FLAME_OK) set_error("flame_tensor_retain(loss)", st);
  if (st == FLAME_OK) {
    flame_tensor_release(g->loss);
    g->loss = loss;
  }
  scope_release(s);
  if (st != FLAME_OK) return (int32_t)st;
  return loss_out ? gpt2_last_loss(g, loss_out) : FLAME_OK;
}

int32_t gpt2_graph_capture(gpt2_t g) {
  g_error[0] = 0;
  if (!g) return fail(FLAME_ERROR_INVALID_ARGUMENT, "gpt2_graph_capture: g is NULL");
  if (!g->loss) return fail(FLAME_ERROR_INVALID_ARGUMENT, "gpt2_graph_capture: run gpt2_step once first");
  flame_graph_release(g->graph);
  g->graph = NULL;
  flame_status_t st = flame_graph_capture_begin(g->ctx);
  if (st != FLAME_OK) {
    set_error("flame_graph_capture_begin", st);
    return (int32_t)st;
  }
  const int32_t step = gpt2_step(g, NULL); /* recorded, not run: the loss it keeps is the graph's */
  char step_error[sizeof g_error];
  snprintf(step_error, sizeof step_error, "%s", g_error);
  flame_graph_t graph = NULL;
  st = flame_graph_capture_end(g->ctx, &graph);
  if (step != FLAME_OK) { /* the capture was aborted; the step's message says why */
    flame_graph_release(graph);
    snprintf(g_error, sizeof g_error, "%s", step_error);
    return step;
  }
  if (st != FLAME_OK) {
    set_error("flame_graph_capture_end", st);
    return (int32_t)st;
  }
  g->graph = graph;
  return FLAME_OK;
}

int32_t gpt2_graph_replay(gpt2_t g) {
  g_error[0] = 0;
  if (!g || !g->graph) return fail(FLAME_ERROR_INVALID_ARGUMENT, "gpt2_graph_replay: no captured step");
  flame_status_t st = flame_graph_replay(g->graph);
  if (st != FLAME_OK) set_error("flame_graph_replay", st);
  return (int32_t)st;
}

int32_t gpt2_last_loss(gpt2_t g, float* loss) {
  g_error[0] = 0;
  if (!g || !loss) return fail(FLAME_ERROR_INVALID_ARGUMENT, "gpt2_last_loss: NULL argument");
  if (!g->loss) return fail(FLAME_ERROR_INVALID_ARGUMENT, "gpt2_last_loss: no step has run");
  double v = 0;
  flame_status_t st = flame_tensor_item(g->loss, &v);
  if (st != FLAME_OK) {
    set_error("flame_tensor_item(loss)", st);
    return (int32_t)st;
  }
  *loss = (float)v;
  return FLAME_OK;
}

int32_t gpt2_sync(gpt2_t g) {
  g_error[0] = 0;
  if (!g) return fail(FLAME_ERROR_INVALID_ARGUMENT, "gpt2_sync: g is NULL");
  flame_status_t st = flame_ctx_synchronize(g->ctx);
  if (st != FLAME_OK) set_error("flame_ctx_synchronize", st);
  return (int32_t)st;
}

int32_t gpt2_stream(gpt2_t g, void** stream) {
  g_error[0] = 0;
  if (!g || !stream) return fail(FLAME_ERROR_INVALID_ARGUMENT, "gpt2_stream: NULL argument");
  flame_status_t st = flame_ctx_stream(g->ctx, stream);
  if (st != FLAME_OK) set_error("flame_ctx_stream", st);
  return (int32_t)st;
}

int32_t gpt2_memory(gpt2_t g, uint64_t out[4]) {
  g_error[0] = 0;
  if (!g || !out) return fail(FLAME_ERROR_INVALID_ARGUMENT, "gpt2_memory: NULL argument");
  flame_memory_stats_t ms;
  memset(&ms, 0, sizeof ms);
  ms.struct_size = sizeof ms;
  flame_status_t st = flame_ctx_memory_stats(g->ctx, &ms);
  if (st != FLAME_OK) {
    set_error("flame_ctx_memory_stats", st);
    return (int32_t)st;
  }
  out[0] = ms.bytes_in_use;
  out[1] = ms.bytes_reserved;
  out[2] = ms.peak_bytes_in_use;
  out[3] = ms.live_tensors;
  return FLAME_OK;
}

int32_t gpt2_reset_peak(gpt2_t g) {
  g_error[0] = 0;
  if (!g) return fail(FLAME_ERROR_INVALID_ARGUMENT, "gpt2_reset_peak: g is NULL");
  flame_status_t st = flame_ctx_reset_peak_memory(g->ctx);
  if (st != FLAME_OK) set_error("flame_ctx_reset_peak_memory", st);
  return (int32_t)st;
}

int32_t gpt2_num_params(gpt2_t g, int64_t* count, int64_t* elements) {
  g_error[0] = 0;
  if (!g || !count || !elements) return fail(FLAME_ERROR_INVALID_ARGUMENT, "gpt2_num_params: NULL argument");
  int64_t total = 0;
  for (int i = 0; i < g->n_params; ++i) {
    int64_t n = 0;
    flame_status_t st = flame_tensor_numel(g->p[i], &n);
    if (st != FLAME_OK) {
      set_error("flame_tensor_numel", st);
      return (int32_t)st;
    }
    total += n;
  }
  *count = g->n_params;
  *elements = total;
  return FLAME_OK;
}

int32_t gpt2_save(gpt2_t g, const char* path) {
  g_error[0] = 0;
  if (!g || !path) return fail(FLAME_ERROR_INVALID_ARGUMENT, "gpt2_save: NULL argument");
  const char** names = calloc((size_t)g->n_params, sizeof *names);
  if (!names) return fail(FLAME_ERROR_OUT_OF_MEMORY, "gpt2_save: out of host memory");
  for (int i = 0; i < g->n_params; ++i) names[i] = g->names[i];
  flame_status_t st = flame_safetensors_save(g->ctx, path, names, g->p, g->n_params, NULL, 0);
  free(names);
  if (st != FLAME_OK) set_error("flame_safetensors_save", st);
  return (int32_t)st;
}

/* ---------------------------------------------------------------- data parallelism */
#define DP_MAX_WORLD 16

typedef struct dp_rank {
  const gpt2_config* cfg;
  gpt2_t g;
  flame_comm_t comm; /* NULL with world 1 */
  int rank, world;
  int64_t warmup, steps;
  double ms_per_step;
  float first_loss, last_loss;
  float* params; /* world > 1: the final parameters, for the comparison between ranks */
  size_t n_elements;
  int32_t status;
  char error[2048];
} dp_rank;

/* The rank's batch: sequences of a fixed random successor table (the same table on every rank, the
 * sequences drawn per rank): token t is followed by succ[t] with probability 3/4, else by a uniform
 * token; targets are the tokens shifted by one (as gpt2_main.c). */
static int32_t dp_set_batch(dp_rank* r) {
  const int64_t V = r->cfg->vocab, B = r->cfg->batch, T = r->cfg->seq;
  int64_t* succ = malloc((size_t)V * sizeof *succ);
  int64_t* tok = malloc((size_t)(B * T) * sizeof *tok);
  int64_t* tgt = malloc((size_t)(B * T) * sizeof *tgt);
  int32_t st = FLAME_OK;
  if (!succ || !tok || !tgt) {
    st = fail(FLAME_ERROR_OUT_OF_MEMORY, "gpt2_dp_run: out of host memory");
  } else {
    uint64_t rng = 0x9E3779B97F4A7C15ull ^ (uint64_t)r->cfg->seed;
    for (int64_t t = 0; t < V; ++t) succ[t] = (int64_t)(rng_next(&rng) % (uint64_t)V);
    rng ^= 0xD1B54A32D192ED03ull * (uint64_t)(r->rank + 1);
    for (int64_t b = 0; b < B; ++b) {
      int64_t cur = (int64_t)(rng_next(&rng) % (uint64_t)V);
      for (int64_t t = 0; t <= T; ++t) {
        if (t < T) tok[b * T + t] = cur;
        if (t > 0) tgt[b * T + t - 1] = cur;
        cur = (rng_next(&rng) % 4 != 0) ? succ[cur] : (int64_t)(rng_next(&rng) % (uint64_t)V);
      }
    }
    st = gpt2_set_batch(r->g, tok, tgt);
  }
  free(succ);
  free(tok);
  free(tgt);
  return st;
}

/* Waits for the rank's queued work: through the communicator (with its timeout) when there is one. */
static int32_t dp_sync(dp_rank* r) {
  if (!r->comm) return gpt2_sync(r->g);
  flame_status_t st = flame_comm_synchronize(r->comm);
  if (st != FLAME_OK) set_error("flame_comm_synchronize", st);
  return (int32_t)st;
}

/* One rank's thread: the helper over its parameters, warm-up, the timed steps, its parameters. */
static void* dp_rank_main(void* arg) {
  dp_rank* r = arg;
  gpt2_t g = r->g;
  int32_t st = FLAME_OK;
  g_error[0] = 0;
  if (r->comm && (st = flame_dp_create(r->comm, g->p, g->n_params, NULL, &g->dp)) != FLAME_OK)
    set_error("flame_dp_create", (flame_status_t)st);
  if (st == FLAME_OK) st = dp_set_batch(r);
  if (st == FLAME_OK) st = gpt2_step(g, &r->first_loss); /* the first step compiles the kernels */
  for (int64_t i = 1; st == FLAME_OK && i < r->warmup; ++i) st = gpt2_step(g, NULL);
  if (st == FLAME_OK) st = dp_sync(r);
  double t0 = now_ms();
  for (int64_t i = 0; st == FLAME_OK && i < r->steps; ++i) st = gpt2_step(g, NULL);
  if (st == FLAME_OK) st = dp_sync(r);
  r->ms_per_step = (now_ms() - t0) / (double)r->steps;
  if (st == FLAME_OK) st = gpt2_last_loss(g, &r->last_loss);
  if (st == FLAME_OK && r->world > 1) {
    int64_t count = 0, elements = 0;
    st = gpt2_num_params(g, &count, &elements);
    r->params = st == FLAME_OK ? malloc((size_t)elements * sizeof(float)) : NULL;
    if (st == FLAME_OK && !r->params) st = fail(FLAME_ERROR_OUT_OF_MEMORY, "gpt2_dp_run: out of host memory");
    for (int i = 0; st == FLAME_OK && i < g->n_params; ++i) {
      int64_t n = 0;
      flame_status_t e = flame_tensor_numel(g->p[i], &n);
      if (e == FLAME_OK) e = flame_to_host(g->p[i], r->params + r->n_elements, (size_t)n * sizeof(float));
      if (e != FLAME_OK) {
        set_error(g->names[i], e);
        st = (int32_t)e;
      }
      r->n_elements += (size_t)n;
    }
  }
  if (st != FLAME_OK) snprintf(r->error, sizeof r->error, "%s", g_error);
  r->status = st;
  flame_dp_release(g->dp); /* every rank releases its helper and communicator concurrently */
  g->dp = NULL;
  flame_comm_release(r->comm);
  r->comm = NULL;
  return NULL;
}

int32_t gpt2_dp_run(const gpt2_config* cfg, int64_t world, int64_t warmup, int64_t steps, const char* kernel_cache_dir,
                    gpt2_dp_result* out) {
  g_error[0] = 0;
  if (!cfg || !out) return fail(FLAME_ERROR_INVALID_ARGUMENT, "gpt2_dp_run: NULL argument");
  memset(out, 0, sizeof *out);
  if (world < 1 || world > DP_MAX_WORLD || warmup < 1 || steps < 1)
    return fail(FLAME_ERROR_INVALID_ARGUMENT, "gpt2_dp_run: world %lld (need 1..%d), warmup %lld and steps %lld (need >= 1)",
                (long long)world, DP_MAX_WORLD, (long long)warmup, (long long)steps);
  int32_t count = 0;
  flame_status_t fst = flame_device_count(&count);
  if (fst != FLAME_OK) {
    set_error("flame_device_count", fst);
    return (int32_t)fst;
  }
  if (count < world)
    return fail(FLAME_ERROR_NO_DEVICE, "gpt2_dp_run: %lld GPUs asked for, %d visible", (long long)world, (int)count);

  dp_rank ranks[DP_MAX_WORLD];
  pthread_t threads[DP_MAX_WORLD];
  flame_comm_t comms[DP_MAX_WORLD];
  flame_ctx_t ctxs[DP_MAX_WORLD];
  memset(ranks, 0, sizeof ranks);
  int32_t st = FLAME_OK;
  int started = 0;
  for (int r = 0; r < world && st == FLAME_OK; ++r) {
    ranks[r].cfg = cfg;
    ranks[r].rank = r;
    ranks[r].world = (int)world;
    ranks[r].warmup = warmup;
    ranks[r].steps = steps;
    st = create_on(cfg, r, NULL, kernel_cache_dir, &ranks[r].g); /* rank 0's weights reach the others in flame_dp_create */
    if (st == FLAME_OK) ctxs[r] = ranks[r].g->ctx;
  }
  if (st == FLAME_OK && world > 1) {
    flame_comm_options_t co;
    if ((fst = flame_comm_options_init(&co)) != FLAME_OK) set_error("flame_comm_options_init", fst);
    co.timeout_ms = 300000; /* covers the first step's kernel compilation on every rank */
    if (fst == FLAME_OK && (fst = flame_comm_create_group(ctxs, (int32_t)world, &co, comms)) != FLAME_OK)
      set_error("flame_comm_create_group", fst);
    st = (int32_t)fst;
    for (int r = 0; st == FLAME_OK && r < world; ++r) ranks[r].comm = comms[r];
  }
  for (; st == FLAME_OK && started < world; ++started)
    if (pthread_create(&threads[started], NULL, dp_rank_main, &ranks[started]) != 0) {
      st = fail(FLAME_ERROR_INTERNAL, "gpt2_dp_run: could not start the thread of rank %d", started);
      break;
    }
  for (int r = 0; r < started; ++r) pthread_join(threads[r], NULL);
  for (int r = started; r < world; ++r) flame_comm_release(ranks[r].comm); /* not started: none when all were */

  if (st == FLAME_OK) { /* every failing rank's message (one rank's failure times the others out) */
    size_t len = 0;
    for (int r = 0; r < world; ++r)
      if (ranks[r].status != FLAME_OK) {
        if (st == FLAME_OK) st = ranks[r].status;
        if (len < sizeof g_error)
          len += (size_t)snprintf(g_error + len, sizeof g_error - len, "%srank %d: %s", len ? "; " : "", r, ranks[r].error);
      }
  }
  if (st == FLAME_OK) {
    out->params_identical = 1;
    for (int r = 0; r < world; ++r) {
      out->ms_per_step = ranks[r].ms_per_step > out->ms_per_step ? ranks[r].ms_per_step : out->ms_per_step;
      out->first_loss += ranks[r].first_loss / (double)world;
      out->last_loss += ranks[r].last_loss / (double)world;
      if (r > 0 && (ranks[r].n_elements != ranks[0].n_elements ||
                    memcmp(ranks[r].params, ranks[0].params, ranks[0].n_elements * sizeof(float)) != 0))
        out->params_identical = 0;
    }
    out->tokens_per_s = (double)(world * cfg->batch * cfg->seq) / (out->ms_per_step * 1e-3);
  }
  for (int r = 0; r < world; ++r) {
    free(ranks[r].params);
    gpt2_destroy(ranks[r].g);
  }
  return st;
}

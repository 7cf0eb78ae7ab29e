/*
 * train_mlp.c - an MLP classifier trained from C: two interleaved spirals, AdamW, accuracy.
 *
 *   data   two spirals of 1.5 turns each (class 0 and its point reflection, class 1), with noise,
 *          generated here; a training set and a held-out test set from different random draws
 *   model  2 -> hidden -> hidden -> 2: flame_linear with the GELU fused into the GEMM epilogue
 *          (and, in backward, DGELU fused into the next layer's gradient GEMM)
 *   train  full-batch cross-entropy, AdamW with two parameter groups (no weight decay on biases),
 *          linear warm-up then cosine decay of the learning rate (the schedule lives here, the
 *          optimizer only takes set_lr), global gradient-norm clipping at 1.0
 *
 * Prints step, loss, learning rate, gradient norm, throughput and memory every `--log` steps, then
 * the held-out accuracy. Exit status: 0 when the accuracy reaches --target (default 0.98), 1 on a
 * FLAME error (the library's message is printed) or a missed target, 2 without a GPU or driver.
 *
 *   train_mlp [--steps N] [--hidden H] [--points P] [--lr LR] [--seed S] [--log K] [--target A]
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime under strict C99 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "example_args.h" /* the options table: --help, --version, errors naming the option */
#include "flame.h"

#define EXIT_NO_GPU 2
#define PI 3.14159265358979323846

#define CHECK(call)                                                                              \
  do {                                                                                           \
    flame_status_t st_ = (call);                                                                 \
    if (st_ != FLAME_OK) {                                                                       \
      fprintf(stderr, "train_mlp: %s failed: %s: %s\n", #call, flame_status_string(st_),        \
              flame_last_error_message());                                                       \
      goto cleanup;                                                                              \
    }                                                                                            \
  } while (0)

typedef struct config {
  int steps, hidden, points, log_every;
  double lr, target;
  uint64_t seed;
} config;

/* xorshift64* and Box-Muller: the data set is the same on every machine for a given seed. */
static uint64_t rng_next(uint64_t* s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 2685821657736338717ull;
}
static double rng_uniform(uint64_t* s) { return (double)(rng_next(s) >> 11) / 9007199254740992.0; }
static double rng_normal(uint64_t* s) {
  double u = rng_uniform(s), v = rng_uniform(s);
  return sqrt(-2.0 * log(u + 1e-300)) * cos(2.0 * PI * v);
}

/* n points: xy [n, 2] (f32), label [n] (i64). Arm angle in [0, 3 pi], radius growing with it. */
static void make_spirals(int n, uint64_t* s, float* xy, int64_t* label) {
  for (int i = 0; i < n; ++i) {
    double t = 3.0 * PI * sqrt(rng_uniform(s)); /* sqrt: even density along the arm */
    double r = t / (3.0 * PI) + 0.05;
    int c = i % 2;
    double sign = c ? -1.0 : 1.0;
    xy[2 * i] = (float)(sign * r * cos(t) * 2.0 + 0.02 * rng_normal(s));
    xy[2 * i + 1] = (float)(sign * r * sin(t) * 2.0 + 0.02 * rng_normal(s));
    label[i] = c;
  }
}

/* The model's parameters: w[l] [out, in], b[l] [out]. */
#define LAYERS 3
typedef struct model {
  flame_tensor_t w[LAYERS], b[LAYERS];
} model;

/* Kaiming-normal weights (std sqrt(2 / in)), zero biases; all leaves that require grad. */
static flame_status_t model_init(flame_ctx_t ctx, model* m, const int64_t* dims) {
  flame_status_t st = FLAME_OK;
  for (int l = 0; l < LAYERS && st == FLAME_OK; ++l) {
    int64_t ws[2] = {dims[l + 1], dims[l]}, bs[1] = {dims[l + 1]};
    flame_tensor_t raw = NULL;
    st = flame_randn(ctx, ws, 2, FLAME_DTYPE_F32, &raw);
    if (st == FLAME_OK) st = flame_mul_scalar(raw, sqrt(2.0 / (double)dims[l]), &m->w[l]);
    flame_tensor_release(raw);
    if (st == FLAME_OK) st = flame_zeros(ctx, bs, 1, FLAME_DTYPE_F32, &m->b[l]);
    if (st == FLAME_OK) st = flame_tensor_set_requires_grad(m->w[l], 1);
    if (st == FLAME_OK) st = flame_tensor_set_requires_grad(m->b[l], 1);
  }
  return st;
}

static void model_release(model* m) {
  for (int l = 0; l < LAYERS; ++l) {
    flame_tensor_release(m->w[l]);
    flame_tensor_release(m->b[l]);
  }
}

/* logits = L3(gelu(L2(gelu(L1(x))))). OUT *logits: a new reference. */
static flame_status_t forward(const model* m, flame_tensor_t x, flame_tensor_t* logits) {
  flame_tensor_t h = x, next = NULL;
  flame_status_t st = FLAME_OK;
  for (int l = 0; l < LAYERS && st == FLAME_OK; ++l) {
    int32_t act = l + 1 < LAYERS ? FLAME_ACTIVATION_GELU_TANH : FLAME_ACTIVATION_NONE;
    st = flame_linear(h, m->w[l], m->b[l], act, &next);
    if (h != x) flame_tensor_release(h);
    h = next;
    next = NULL;
  }
  if (st != FLAME_OK) {
    if (h != x) flame_tensor_release(h);
    *logits = NULL;
    return st;
  }
  *logits = h;
  return FLAME_OK;
}

/* Fraction of rows whose argmax equals the label, computed without recording a graph. */
static flame_status_t accuracy(flame_ctx_t ctx, const model* m, flame_tensor_t x, flame_tensor_t y, int n, double* acc) {
  flame_tensor_t logits = NULL, pred = NULL, hit = NULL, hitf = NULL, count = NULL;
  int32_t prev = 1;
  double hits = 0;
  flame_status_t st = flame_ctx_set_grad_enabled(ctx, 0, &prev);
  if (st != FLAME_OK) return st;
  if ((st = forward(m, x, &logits)) != FLAME_OK) goto done;
  if ((st = flame_argmax(logits, 1, 0, &pred)) != FLAME_OK) goto done;
  if ((st = flame_eq(pred, y, &hit)) != FLAME_OK) goto done;
  if ((st = flame_to_dtype(hit, FLAME_DTYPE_F32, &hitf)) != FLAME_OK) goto done;
  if ((st = flame_sum_all(hitf, &count)) != FLAME_OK) goto done;
  if ((st = flame_tensor_item(count, &hits)) != FLAME_OK) goto done;
  *acc = hits / n;
done:
  flame_ctx_set_grad_enabled(ctx, prev, NULL);
  flame_tensor_release(count);
  flame_tensor_release(hitf);
  flame_tensor_release(hit);
  flame_tensor_release(pred);
  flame_tensor_release(logits);
  return st;
}

/* Linear warm-up over the first 5% of the steps, then cosine decay to 1% of the peak. */
static double schedule(const config* c, int step) {
  int warm = c->steps / 20 + 1;
  if (step < warm) return c->lr * (step + 1) / warm;
  double p = (double)(step - warm) / (double)(c->steps - warm > 0 ? c->steps - warm : 1);
  return c->lr * (0.01 + 0.99 * 0.5 * (1.0 + cos(PI * p)));
}

/* EXAMPLE_ARGS_RUN to train, else the exit status (example_args.h). */
static int parse_args(int argc, char** argv, config* c) {
  const example_arg args[] = {
      {"--steps", ARG_INT, &c->steps, "N", "training steps (full batch)", 1, 0, NULL},
      {"--hidden", ARG_INT, &c->hidden, "H", "width of the two hidden layers", 1, 0, NULL},
      {"--points", ARG_INT, &c->points, "P", "points in the training set and in the test set", 2, 0, NULL},
      {"--lr", ARG_POSITIVE_DOUBLE, &c->lr, "LR", "peak learning rate of AdamW", 0, 0, NULL},
      {"--seed", ARG_U64, &c->seed, "S", "seed of the data and of the context's generator", 0, 0, NULL},
      {"--log", ARG_INT, &c->log_every, "K", "print progress every K steps", 1, 0, NULL},
      {"--target", ARG_DOUBLE, &c->target, "A", "held-out accuracy needed for exit status 0", 0, 0, NULL}};
  const example_cli cli = {"train_mlp", "Trains an MLP on two interleaved spirals (AdamW) and checks its held-out accuracy.",
                           args, (int)(sizeof args / sizeof args[0]),
                           "Exit status: 0 accuracy reached, 1 a FLAME error, a missed target or a bad option, 2 no GPU."};
  return example_parse_args(&cli, argc, argv);
}

int main(int argc, char** argv) {
  config cfg = {2000, 128, 4000, 200, 3e-3, 0.98, 1};
  int status = 1;
  flame_ctx_t ctx = NULL;
  model m;
  flame_optimizer_t opt = NULL;
  flame_tensor_t xtr = NULL, ytr = NULL, xte = NULL, yte = NULL;
  float* xy = NULL;
  int64_t* lab = NULL;
  double acc = 0;
  memset(&m, 0, sizeof m);
  int args_rc = parse_args(argc, argv, &cfg);
  if (args_rc != EXAMPLE_ARGS_RUN) return args_rc;

  flame_ctx_options_t o;
  flame_ctx_options_init(&o);
  o.seed = cfg.seed;
  flame_status_t st = flame_ctx_create(&o, &ctx);
  if (st == FLAME_ERROR_NO_DRIVER || st == FLAME_ERROR_NO_DEVICE) {
    fprintf(stderr, "train_mlp: no GPU available (%s): %s\n", flame_status_string(st), flame_last_error_message());
    return EXIT_NO_GPU;
  }
  CHECK(st);
  char device[128];
  CHECK(flame_ctx_device_name(ctx, device, sizeof device));
  printf("train_mlp on %s: %d points, MLP 2-%d-%d-2, %d steps, AdamW lr %g\n", device, cfg.points, cfg.hidden,
         cfg.hidden, cfg.steps, cfg.lr);

  /* Training and held-out sets from one host RNG stream (different draws). */
  uint64_t s = 0x9E3779B97F4A7C15ull ^ cfg.seed;
  xy = malloc(sizeof(float) * 2 * (size_t)cfg.points);
  lab = malloc(sizeof(int64_t) * (size_t)cfg.points);
  if (!xy || !lab) {
    fprintf(stderr, "train_mlp: out of host memory\n");
    goto cleanup;
  }
  int64_t xs[2] = {cfg.points, 2}, ys[1] = {cfg.points};
  make_spirals(cfg.points, &s, xy, lab);
  CHECK(flame_from_host(ctx, xy, sizeof(float) * 2 * (size_t)cfg.points, xs, 2, FLAME_DTYPE_F32, &xtr));
  CHECK(flame_from_host(ctx, lab, sizeof(int64_t) * (size_t)cfg.points, ys, 1, FLAME_DTYPE_I64, &ytr));
  make_spirals(cfg.points, &s, xy, lab);
  CHECK(flame_from_host(ctx, xy, sizeof(float) * 2 * (size_t)cfg.points, xs, 2, FLAME_DTYPE_F32, &xte));
  CHECK(flame_from_host(ctx, lab, sizeof(int64_t) * (size_t)cfg.points, ys, 1, FLAME_DTYPE_I64, &yte));

  const int64_t dims[LAYERS + 1] = {2, cfg.hidden, cfg.hidden, 2};
  CHECK(model_init(ctx, &m, dims));
  /* Group 0: weights with decoupled weight decay; group 1: biases without. */
  flame_optimizer_options_t oo;
  CHECK(flame_optimizer_options_init(&oo, FLAME_OPTIMIZER_ADAMW));
  oo.lr = cfg.lr;
  oo.weight_decay = 1e-4;
  CHECK(flame_optimizer_create(ctx, &oo, m.w, LAYERS, &opt));
  oo.weight_decay = 0.0;
  CHECK(flame_optimizer_add_param_group(opt, &oo, m.b, LAYERS, NULL));
  flame_tensor_t params[2 * LAYERS];
  for (int l = 0; l < LAYERS; ++l) {
    params[l] = m.w[l];
    params[LAYERS + l] = m.b[l];
  }

  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int since = 0;
  for (int step = 0; step < cfg.steps; ++step) {
    flame_tensor_t logits = NULL, loss = NULL, norm = NULL;
    double lr = schedule(&cfg, step);
    st = flame_optimizer_set_lr(opt, -1, lr);
    if (st == FLAME_OK) st = forward(&m, xtr, &logits);
    if (st == FLAME_OK) st = flame_cross_entropy(logits, ytr, NULL, -100, 0.0, FLAME_REDUCTION_MEAN, &loss);
    if (st == FLAME_OK) st = flame_backward(ctx, loss, NULL, 0);
    if (st == FLAME_OK) st = flame_clip_grad_norm(ctx, params, 2 * LAYERS, 1.0, 2.0, 0, &norm);
    if (st == FLAME_OK) st = flame_optimizer_step(opt);
    if (st == FLAME_OK) st = flame_optimizer_zero_grad(opt, 1);
    ++since;
    if (st == FLAME_OK && (step % cfg.log_every == 0 || step + 1 == cfg.steps)) {
      double lv = 0, nv = 0;
      flame_memory_stats_t ms;
      ms.struct_size = sizeof ms;
      st = flame_tensor_item(loss, &lv); /* synchronises: the timing below covers the queued steps */
      if (st == FLAME_OK) st = flame_tensor_item(norm, &nv);
      if (st == FLAME_OK) st = flame_ctx_memory_stats(ctx, &ms);
      clock_gettime(CLOCK_MONOTONIC, &t1);
      double sec = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
      if (st == FLAME_OK)
        printf("step %5d  loss %.4f  lr %.2e  grad-norm %7.3f  %8.0f samples/s  %.2f ms/step  memory %.1f MiB (peak %.1f)\n",
               step, lv, lr, nv, since * (double)cfg.points / sec, 1e3 * sec / since, ms.bytes_in_use / 1048576.0,
               ms.peak_bytes_in_use / 1048576.0);
      t0 = t1;
      since = 0;
    }
    flame_tensor_release(norm);
    flame_tensor_release(loss);
    flame_tensor_release(logits);
    CHECK(st);
  }

  double train_acc = 0;
  CHECK(accuracy(ctx, &m, xtr, ytr, cfg.points, &train_acc));
  CHECK(accuracy(ctx, &m, xte, yte, cfg.points, &acc));
  printf("accuracy: train %.2f%%, held-out %.2f%% (target %.0f%%)\n", 100 * train_acc, 100 * acc, 100 * cfg.target);
  status = acc >= cfg.target ? 0 : 1;
  if (status) fprintf(stderr, "train_mlp: held-out accuracy %.4f is below the target %.4f\n", acc, cfg.target);

cleanup:
  flame_optimizer_release(opt);
  model_release(&m);
  flame_tensor_release(xtr);
  flame_tensor_release(ytr);
  flame_tensor_release(xte);
  flame_tensor_release(yte);
  flame_ctx_destroy(ctx);
  free(xy);
  free(lab);
  return status;
}

/*
 * train_cnn.c - a small convolutional classifier trained from C on procedurally drawn shapes.
 *
 *   data   32x32 RGB images of a filled circle, square or triangle at a random position, size and
 *          colour on a noisy background, drawn on the host (shapes_data.h); every training step draws
 *          a fresh batch, and a fixed held-out set is drawn from another part of the random stream
 *   model  three blocks of conv 3x3 (padding 'same') -> group norm -> SiLU, the first two followed by
 *          2x2 max pooling, then adaptive average pooling to 1x1 and a linear head (3 classes)
 *   train  cross-entropy, AdamW (no weight decay on biases and norm parameters), warm-up + cosine,
 *          global gradient-norm clipping at 1.0
 *
 * Prints step, loss, learning rate, throughput and memory every `--log` steps, then the held-out
 * accuracy. Exit status: 0 when it reaches --target (default 0.95), 1 on a FLAME error (the library's
 * message is printed) or a missed target, 2 without a GPU or driver.
 *
 *   train_cnn [--steps N] [--batch B] [--width C] [--lr LR] [--seed S] [--log K] [--target A]
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
#include "shapes_data.h" /* the data set: draw_batch, IMG, CLASSES */

#define EXIT_NO_GPU 2
#define PI 3.14159265358979323846
#define BLOCKS 3

#define CHECK(call)                                                                              \
  do {                                                                                           \
    flame_status_t st_ = (call);                                                                 \
    if (st_ != FLAME_OK) {                                                                       \
      fprintf(stderr, "train_cnn: %s failed: %s: %s\n", #call, flame_status_string(st_),        \
              flame_last_error_message());                                                       \
      goto cleanup;                                                                              \
    }                                                                                            \
  } while (0)

/* Propagates a failure out of a helper that returns flame_status_t. */
#define TRY(call)                      \
  do {                                 \
    flame_status_t st_ = (call);       \
    if (st_ != FLAME_OK) return st_;   \
  } while (0)

typedef struct config {
  int steps, batch, width, log_every;
  double lr, target;
  uint64_t seed;
} config;

typedef struct model {
  int64_t channels; /* of the last block, the head's input */
  flame_tensor_t conv_w[BLOCKS], conv_b[BLOCKS], gn_w[BLOCKS], gn_b[BLOCKS];
  flame_tensor_t head_w, head_b;
} model;

/* A leaf that requires grad: randn * scale (scale > 0) or filled with `fill`. */
static flame_status_t leaf(flame_ctx_t ctx, const int64_t* shape, int nd, double scale, double fill, flame_tensor_t* out) {
  flame_tensor_t r = NULL;
  flame_status_t st;
  if (scale > 0) {
    st = flame_randn(ctx, shape, nd, FLAME_DTYPE_F32, &r);
    if (st == FLAME_OK) st = flame_mul_scalar(r, scale, out);
  } else {
    st = flame_full(ctx, shape, nd, FLAME_DTYPE_F32, fill, out);
  }
  flame_tensor_release(r);
  if (st == FLAME_OK) st = flame_tensor_set_requires_grad(*out, 1);
  return st;
}

/* Kaiming-normal convolutions, zero biases, unit/zero group-norm affine, a small head. */
static flame_status_t model_init(flame_ctx_t ctx, model* m, int width) {
  int64_t chans[BLOCKS + 1] = {3, width, 2 * width, 2 * width};
  for (int b = 0; b < BLOCKS; ++b) {
    int64_t ws[4] = {chans[b + 1], chans[b], 3, 3}, cs[1] = {chans[b + 1]};
    TRY(leaf(ctx, ws, 4, sqrt(2.0 / (double)(chans[b] * 9)), 0, &m->conv_w[b]));
    TRY(leaf(ctx, cs, 1, 0, 0.0, &m->conv_b[b]));
    TRY(leaf(ctx, cs, 1, 0, 1.0, &m->gn_w[b]));
    TRY(leaf(ctx, cs, 1, 0, 0.0, &m->gn_b[b]));
  }
  m->channels = chans[BLOCKS];
  int64_t hw[2] = {CLASSES, chans[BLOCKS]}, hb[1] = {CLASSES};
  TRY(leaf(ctx, hw, 2, 1.0 / sqrt((double)chans[BLOCKS]), 0, &m->head_w));
  TRY(leaf(ctx, hb, 1, 0, 0.0, &m->head_b));
  return FLAME_OK;
}

static void model_release(model* m) {
  for (int b = 0; b < BLOCKS; ++b) {
    flame_tensor_release(m->conv_w[b]);
    flame_tensor_release(m->conv_b[b]);
    flame_tensor_release(m->gn_w[b]);
    flame_tensor_release(m->gn_b[b]);
  }
  flame_tensor_release(m->head_w);
  flame_tensor_release(m->head_b);
}

/* *cur = next, releasing the old value unless it is the caller's (borrowed) input. */
static void advance(flame_tensor_t* cur, flame_tensor_t next, flame_tensor_t input) {
  if (*cur != input) flame_tensor_release(*cur);
  *cur = next;
}

/* logits [N, CLASSES] for images x [N, 3, 32, 32]. OUT *logits: a new reference. */
static flame_status_t forward(const model* m, flame_tensor_t x, flame_tensor_t* logits) {
  flame_conv_options_t co;
  flame_pool2d_options_t po;
  flame_tensor_t cur = x, next = NULL;
  const int64_t flat[2] = {-1, m->channels};
  *logits = NULL;
  flame_status_t st = flame_conv_options_init(&co);
  if (st == FLAME_OK) st = flame_pool2d_options_init(&po, 2, 2);
  co.padding_same = 1;
  for (int b = 0; b < BLOCKS && st == FLAME_OK; ++b) {
    if ((st = flame_conv2d(cur, m->conv_w[b], m->conv_b[b], &co, &next)) != FLAME_OK) break;
    advance(&cur, next, x);
    if ((st = flame_group_norm(cur, 8, m->gn_w[b], m->gn_b[b], 1e-5, 0, &next)) != FLAME_OK) break;
    advance(&cur, next, x);
    if ((st = flame_silu(cur, &next)) != FLAME_OK) break;
    advance(&cur, next, x);
    if (b + 1 < BLOCKS) {
      if ((st = flame_max_pool2d(cur, &po, &next)) != FLAME_OK) break;
      advance(&cur, next, x);
    }
  }
  if (st == FLAME_OK && (st = flame_adaptive_avg_pool2d(cur, 1, 1, &next)) == FLAME_OK) advance(&cur, next, x);
  if (st == FLAME_OK && (st = flame_reshape(cur, flat, 2, &next)) == FLAME_OK) advance(&cur, next, x);
  if (st == FLAME_OK && (st = flame_linear(cur, m->head_w, m->head_b, FLAME_ACTIVATION_NONE, &next)) == FLAME_OK)
    advance(&cur, next, x);
  if (st != FLAME_OK) {
    if (cur != x) flame_tensor_release(cur);
    return st;
  }
  *logits = cur;
  return FLAME_OK;
}

/* Fraction of correct argmax predictions, without recording a graph. */
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

static double schedule(const config* c, int step) {
  int warm = c->steps / 20 + 1;
  if (step < warm) return c->lr * (step + 1) / warm;
  double p = (double)(step - warm) / (double)(c->steps - warm > 0 ? c->steps - warm : 1);
  return c->lr * (0.01 + 0.99 * 0.5 * (1.0 + cos(PI * p)));
}

/* EXAMPLE_ARGS_RUN to train, else the exit status (example_args.h). */
static int parse_args(int argc, char** argv, config* c) {
  const example_arg args[] = {
      {"--steps", ARG_INT, &c->steps, "N", "training steps (a fresh batch each)", 1, 0, NULL},
      {"--batch", ARG_INT, &c->batch, "B", "images per step", 1, 0, NULL},
      {"--width", ARG_INT, &c->width, "C", "channels of the first block (a multiple of 8)", 8, 0, NULL},
      {"--lr", ARG_POSITIVE_DOUBLE, &c->lr, "LR", "peak learning rate of AdamW", 0, 0, NULL},
      {"--seed", ARG_U64, &c->seed, "S", "seed of the data and of the context's generator", 0, 0, NULL},
      {"--log", ARG_INT, &c->log_every, "K", "print progress every K steps", 1, 0, NULL},
      {"--target", ARG_DOUBLE, &c->target, "A", "held-out accuracy needed for exit status 0", 0, 0, NULL}};
  const example_cli cli = {"train_cnn", "Trains a small CNN on drawn circles, squares and triangles and checks its held-out accuracy.",
                           args, (int)(sizeof args / sizeof args[0]),
                           "Exit status: 0 accuracy reached, 1 a FLAME error, a missed target or a bad option, 2 no GPU."};
  int rc = example_parse_args(&cli, argc, argv);
  if (rc == EXAMPLE_ARGS_RUN && c->width % 8) rc = example_arg_fail(&cli, "--width", "expected a multiple of 8, got %d", c->width);
  return rc;
}

/* Uploads n images and labels. */
static flame_status_t upload(flame_ctx_t ctx, int n, const float* imgs, const int64_t* labels, flame_tensor_t* x, flame_tensor_t* y) {
  const int64_t xs[4] = {n, 3, IMG, IMG}, ys[1] = {n};
  TRY(flame_from_host(ctx, imgs, sizeof(float) * (size_t)n * 3 * IMG * IMG, xs, 4, FLAME_DTYPE_F32, x));
  return flame_from_host(ctx, labels, sizeof(int64_t) * (size_t)n, ys, 1, FLAME_DTYPE_I64, y);
}

int main(int argc, char** argv) {
  config cfg = {600, 128, 32, 50, 3e-3, 0.95, 1};
  const int held_out = 1024;
  int status = 1;
  flame_ctx_t ctx = NULL;
  model m;
  flame_optimizer_t opt = NULL;
  flame_tensor_t xte = NULL, yte = NULL;
  float* imgs = NULL;
  int64_t* labels = NULL;
  double acc = 0;
  memset(&m, 0, sizeof m);
  int args_rc = parse_args(argc, argv, &cfg);
  if (args_rc != EXAMPLE_ARGS_RUN) return args_rc;

  flame_ctx_options_t o;
  flame_ctx_options_init(&o);
  o.seed = cfg.seed;
  flame_status_t st = flame_ctx_create(&o, &ctx);
  if (st == FLAME_ERROR_NO_DRIVER || st == FLAME_ERROR_NO_DEVICE) {
    fprintf(stderr, "train_cnn: no GPU available (%s): %s\n", flame_status_string(st), flame_last_error_message());
    return EXIT_NO_GPU;
  }
  CHECK(st);
  char device[128];
  CHECK(flame_ctx_device_name(ctx, device, sizeof device));
  printf("train_cnn on %s: shapes 32x32, batch %d, width %d, %d steps, AdamW lr %g\n", device, cfg.batch, cfg.width,
         cfg.steps, cfg.lr);

  int maxn = cfg.batch > held_out ? cfg.batch : held_out;
  imgs = malloc(sizeof(float) * (size_t)maxn * 3 * IMG * IMG);
  labels = malloc(sizeof(int64_t) * (size_t)maxn);
  if (!imgs || !labels) {
    fprintf(stderr, "train_cnn: out of host memory\n");
    goto cleanup;
  }
  uint64_t test_rng = 0xD1B54A32D192ED03ull ^ cfg.seed, train_rng = 0x8CB92BA72F3D8DD7ull ^ cfg.seed;
  draw_batch(&test_rng, held_out, imgs, labels);
  CHECK(upload(ctx, held_out, imgs, labels, &xte, &yte));

  CHECK(model_init(ctx, &m, cfg.width));
  flame_optimizer_options_t oo;
  CHECK(flame_optimizer_options_init(&oo, FLAME_OPTIMIZER_ADAMW));
  oo.lr = cfg.lr;
  oo.weight_decay = 1e-4;
  flame_tensor_t decayed[BLOCKS + 1], plain[3 * BLOCKS + 1], all[4 * BLOCKS + 2];
  int nd = 0, np = 0, na = 0;
  for (int b = 0; b < BLOCKS; ++b) {
    decayed[nd++] = m.conv_w[b];
    plain[np++] = m.conv_b[b];
    plain[np++] = m.gn_w[b];
    plain[np++] = m.gn_b[b];
  }
  decayed[nd++] = m.head_w;
  plain[np++] = m.head_b;
  for (int i = 0; i < nd; ++i) all[na++] = decayed[i];
  for (int i = 0; i < np; ++i) all[na++] = plain[i];
  CHECK(flame_optimizer_create(ctx, &oo, decayed, nd, &opt));
  oo.weight_decay = 0.0;
  CHECK(flame_optimizer_add_param_group(opt, &oo, plain, np, NULL));

  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int since = 0;
  for (int step = 0; step < cfg.steps; ++step) {
    flame_tensor_t x = NULL, y = NULL, logits = NULL, loss = NULL, norm = NULL;
    double lr = schedule(&cfg, step);
    draw_batch(&train_rng, cfg.batch, imgs, labels);
    st = upload(ctx, cfg.batch, imgs, labels, &x, &y);
    if (st == FLAME_OK) st = flame_optimizer_set_lr(opt, -1, lr);
    if (st == FLAME_OK) st = forward(&m, x, &logits);
    if (st == FLAME_OK) st = flame_cross_entropy(logits, y, NULL, -100, 0.0, FLAME_REDUCTION_MEAN, &loss);
    if (st == FLAME_OK) st = flame_backward(ctx, loss, NULL, 0);
    if (st == FLAME_OK) st = flame_clip_grad_norm(ctx, all, na, 1.0, 2.0, 0, &norm);
    if (st == FLAME_OK) st = flame_optimizer_step(opt);
    if (st == FLAME_OK) st = flame_optimizer_zero_grad(opt, 1);
    ++since;
    if (st == FLAME_OK && (step % cfg.log_every == 0 || step + 1 == cfg.steps)) {
      double lv = 0;
      flame_memory_stats_t ms;
      ms.struct_size = sizeof ms;
      st = flame_tensor_item(loss, &lv);
      if (st == FLAME_OK) st = flame_ctx_memory_stats(ctx, &ms);
      clock_gettime(CLOCK_MONOTONIC, &t1);
      double sec = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
      if (st == FLAME_OK)
        printf("step %4d  loss %.4f  lr %.2e  %7.0f images/s  %.2f ms/step  memory %.1f MiB (peak %.1f)\n", step, lv, lr,
               since * (double)cfg.batch / sec, 1e3 * sec / since, ms.bytes_in_use / 1048576.0,
               ms.peak_bytes_in_use / 1048576.0);
      t0 = t1;
      since = 0;
    }
    flame_tensor_release(norm);
    flame_tensor_release(loss);
    flame_tensor_release(logits);
    flame_tensor_release(y);
    flame_tensor_release(x);
    CHECK(st);
  }

  CHECK(accuracy(ctx, &m, xte, yte, held_out, &acc));
  printf("held-out accuracy: %.2f%% over %d images (target %.0f%%)\n", 100 * acc, held_out, 100 * cfg.target);
  status = acc >= cfg.target ? 0 : 1;
  if (status) fprintf(stderr, "train_cnn: held-out accuracy %.4f is below the target %.4f\n", acc, cfg.target);

cleanup:
  flame_optimizer_release(opt);
  model_release(&m);
  flame_tensor_release(xte);
  flame_tensor_release(yte);
  flame_ctx_destroy(ctx);
  free(imgs);
  free(labels);
  return status;
}

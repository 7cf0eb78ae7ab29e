/*
 * train_diffusion.c - a small flow-matching (rectified flow) image model trained from C.
 *
 *   data   the procedural shapes of train_cnn.c (shapes_data.h): 32x32 RGB, one filled circle, square
 *          or triangle of random position, size and colour on a dark noisy background; a fresh batch
 *          every step
 *   model  a tiny UNet: a sinusoidal time embedding (flame_timestep_embedding of 1000 t) through a
 *          two-layer SiLU MLP; residual blocks of group norm -> SiLU -> conv 3x3 (the time embedding,
 *          projected per block, added after the first conv), 1x1 convs on the skip path where the
 *          channels change; 32x32 (C) -> average pool -> 16x16 (2C) -> average pool -> 8x8 (2C) ->
 *          nearest upsampling with the encoder's features concatenated -> 16x16 (2C) -> 32x32 (C) ->
 *          group norm, SiLU, conv 3x3 to RGB. The last conv of every block and the output conv start
 *          at zero (each block starts as the identity, the model as v = 0).
 *   train  rectified flow: x_t = (1 - t) x0 + t x1 for noise x0 ~ N(0, I), an image x1 and
 *          t ~ U(0, 1); the model predicts the velocity x1 - x0 (mean squared error). AdamW (no
 *          weight decay on biases and norms), warm-up + cosine, global gradient-norm clipping at 1.0,
 *          and an exponential moving average (EMA) of the weights, kept with FLAME ops under
 *          no-grad: ema += (1 - d) (p - ema), d = min(--ema, (1 + step) / (10 + step)).
 *   sample Euler steps of the ODE dx/dt = v(x, t) from t = 0 (noise) to t = 1, with the EMA weights.
 *   output step, loss, learning rate, gradient norm, throughput and memory every --log steps; a PNG
 *          grid of 16 samples every --png-every steps (<prefix>_stepNNNNN.png), of the untrained
 *          model's samples (<prefix>_untrained.png) and of the final samples (<prefix>_final.png),
 *          written by the tiny PNG writer of png_tiny.h (zlib) and read back at once with its
 *          checker (signature, IHDR, chunk CRCs, inflated IDAT, filters) to compare with the pixels.
 *
 * The claims, checked at the end (exit status 1 when one fails):
 *  1. loss: the mean training loss over the last --log steps is at most --loss-factor (default 0.5)
 *     times the loss of the first step (the untrained model predicts v = 0: loss E|x1 - x0|^2, about
 *     1.7; a velocity field that has learned the data goes well below half of it).
 *  2. samples: a plausible-shape test on the generated images. An image passes when the pixels whose
 *     channel mean, averaged over their 3x3 neighbourhood, is above -0.55 (the data's background is
 *     at most -0.7, its shapes at least -0.4) form one 4-connected blob of 12 to 450 pixels holding at
 *     least 80% of them (the data's shapes cover about 20 to 200 pixels). Every data image passes
 *     (printed as a reference), also with added pixel noise of std 0.4, four 3x3 blurs or the
 *     contrast halved; Gaussian noise, which is what the untrained model generates, fails (nearly all
 *     of its pixels are above the threshold, in one blob of about 1000). The claim: at least
 *     --target (default 0.5) of --eval (default 256) samples of the trained EMA model pass, and fewer
 *     than that of the untrained model's.
 *
 * Exit status: 0 when the claims hold, 1 on a FLAME error (the library's message is printed), a
 * PNG that does not read back, or a failed claim, 2 without a GPU or driver.
 *
 *   train_diffusion [--steps N] [--batch B] [--width C (multiple of 8)] [--lr LR] [--ema D] [--seed S]
 *                   [--log K] [--png-every K] [--sample-steps K] [--eval N] [--out PREFIX]
 *                   [--target F] [--loss-factor F]
 *   train_diffusion --verify-png FILE    (reads FILE back with the checker; no GPU needed)
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime under strict C99 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXAMPLE_NAME "train_diffusion" /* example_check.h: the prefix of error messages */
#include "flame.h"
#include "example_check.h" /* DO(): first-failure error chaining */
#include "png_tiny.h"      /* png_write_rgb, png_check */
#include "shapes_data.h"   /* draw_batch, IMG */
#include "example_args.h" /* the options table: --help, --version, errors naming the option */

#define EXIT_NO_GPU 2
#define PI 3.14159265358979323846
#define GROUPS 8         /* group norm groups */
#define MAX_PARAMS 96
#define SAMPLE_CHUNK 128 /* images per sampling pass (bounds the memory of no-grad forwards) */
#define FG_THRESHOLD -0.55

typedef struct config {
  int steps, batch, width, log_every, png_every, sample_steps, eval;
  double lr, ema, target, loss_factor;
  uint64_t seed;
  const char* out;
} config;

/* ---------------------------------------------------------------- the model's parameters
 * One flat list, in the order in which the forward pass reads them (net_init and unet agree on it;
 * the forward checks that it read exactly n). The EMA copy has the same layout. */
typedef struct net {
  flame_tensor_t p[MAX_PARAMS];
  int decay[MAX_PARAMS]; /* 1: weight decay (conv and linear weights) */
  int n;
  int64_t width;
} net;

/* Appends a leaf that requires grad: normal(0, std) when std > 0, else filled with `fill`. */
static flame_status_t push(flame_ctx_t ctx, net* m, const int64_t* shape, int nd, double std, double fill, int decay) {
  flame_tensor_t r = NULL, t = NULL;
  flame_status_t st;
  if (m->n == MAX_PARAMS) {
    flame_set_error_message("train_diffusion: too many parameters for MAX_PARAMS");
    return FLAME_ERROR_INTERNAL;
  }
  if (std > 0) {
    st = flame_randn(ctx, shape, nd, FLAME_DTYPE_F32, &r);
    if (st == FLAME_OK) st = flame_mul_scalar(r, std, &t);
  } else {
    st = flame_full(ctx, shape, nd, FLAME_DTYPE_F32, fill, &t);
  }
  flame_tensor_release(r);
  if (st == FLAME_OK) st = flame_tensor_set_requires_grad(t, 1);
  if (st != FLAME_OK) {
    flame_tensor_release(t);
    return st;
  }
  m->decay[m->n] = decay;
  m->p[m->n++] = t;
  return FLAME_OK;
}

#define TRY(call)                    \
  do {                               \
    flame_status_t st_ = (call);     \
    if (st_ != FLAME_OK) return st_; \
  } while (0)

/* conv k x k, cin -> cout: weight (Kaiming normal, or zero) and a zero bias. */
static flame_status_t push_conv(flame_ctx_t ctx, net* m, int64_t cin, int64_t cout, int64_t k, int zero) {
  const int64_t ws[4] = {cout, cin, k, k}, bs[1] = {cout};
  TRY(push(ctx, m, ws, 4, zero ? 0.0 : sqrt(2.0 / (double)(cin * k * k)), 0.0, 1));
  return push(ctx, m, bs, 1, 0.0, 0.0, 0);
}
static flame_status_t push_linear(flame_ctx_t ctx, net* m, int64_t in, int64_t out) {
  const int64_t ws[2] = {out, in}, bs[1] = {out};
  TRY(push(ctx, m, ws, 2, 1.0 / sqrt((double)in), 0.0, 1));
  return push(ctx, m, bs, 1, 0.0, 0.0, 0);
}
static flame_status_t push_norm(flame_ctx_t ctx, net* m, int64_t c) {
  const int64_t s[1] = {c};
  TRY(push(ctx, m, s, 1, 0.0, 1.0, 0));
  return push(ctx, m, s, 1, 0.0, 0.0, 0);
}
/* A residual block cin -> cout with the time embedding (width 4C) projected to cout. */
static flame_status_t push_block(flame_ctx_t ctx, net* m, int64_t cin, int64_t cout) {
  TRY(push_norm(ctx, m, cin));
  TRY(push_conv(ctx, m, cin, cout, 3, 0));
  TRY(push_linear(ctx, m, 4 * m->width, cout));
  TRY(push_norm(ctx, m, cout));
  TRY(push_conv(ctx, m, cout, cout, 3, 1)); /* zero: the block starts as its skip path */
  if (cin != cout) TRY(push_conv(ctx, m, cin, cout, 1, 0));
  return FLAME_OK;
}

/* The UNet's parameters, in forward order. */
static flame_status_t net_init(flame_ctx_t ctx, net* m, int64_t c) {
  m->width = c;
  TRY(push_linear(ctx, m, c, 4 * c)); /* time MLP */
  TRY(push_linear(ctx, m, 4 * c, 4 * c));
  TRY(push_conv(ctx, m, 3, c, 3, 0)); /* stem */
  TRY(push_block(ctx, m, c, c));         /* 32x32 */
  TRY(push_block(ctx, m, c, 2 * c));     /* 16x16 */
  TRY(push_block(ctx, m, 2 * c, 2 * c)); /* 8x8 */
  TRY(push_block(ctx, m, 4 * c, 2 * c)); /* 16x16, with the 16x16 features concatenated */
  TRY(push_block(ctx, m, 3 * c, c));     /* 32x32, with the 32x32 features concatenated */
  TRY(push_norm(ctx, m, c));             /* output */
  return push_conv(ctx, m, c, 3, 3, 1);
}

static void net_release(net* m) {
  for (int i = 0; i < m->n; ++i) flame_tensor_release(m->p[i]);
  m->n = 0;
}

/* ---------------------------------------------------------------- the forward pass */
typedef struct cursor {
  const net* m;
  int i;
} cursor;

/* The next parameter (borrowed), or NULL with the scope failed when the list is exhausted. */
static flame_tensor_t take(check* s, cursor* c) {
  if (c->i < c->m->n) return c->m->p[c->i++];
  if (s->st == FLAME_OK) {
    flame_set_error_message("train_diffusion: the forward pass reads more parameters than net_init made");
    check_fail(s, FLAME_ERROR_INTERNAL, "take");
  }
  return NULL;
}

/* silu(group_norm(x)) with the next two parameters. */
static flame_tensor_t norm_silu(check* s, cursor* c, flame_tensor_t x) {
  flame_tensor_t w = take(s, c), b = take(s, c), h, a;
  DO(s, h, flame_group_norm(x, GROUPS, w, b, 1e-5, 0, &h));
  DO(s, a, flame_silu(h, &a));
  return a;
}

/* conv2d with the next two parameters; 'same' padding (k = 3 pads 1, k = 1 pads 0). */
static flame_tensor_t conv(check* s, cursor* c, flame_tensor_t x, const flame_conv_options_t* co) {
  flame_tensor_t w = take(s, c), b = take(s, c), y;
  DO(s, y, flame_conv2d(x, w, b, co, &y));
  return y;
}

static flame_tensor_t linear(check* s, cursor* c, flame_tensor_t x) {
  flame_tensor_t w = take(s, c), b = take(s, c), y;
  DO(s, y, flame_linear(x, w, b, FLAME_ACTIVATION_NONE, &y));
  return y;
}

/* x + f(x, temb) for a block cin -> cout; semb = silu(time embedding) [N, 4C]. */
static flame_tensor_t block(check* s, cursor* c, flame_tensor_t x, int64_t n, int64_t cin, int64_t cout, flame_tensor_t semb,
                            const flame_conv_options_t* co) {
  const int64_t per_channel[4] = {n, cout, 1, 1};
  flame_tensor_t h, e, e4, he, out, skip;
  h = conv(s, c, norm_silu(s, c, x), co);
  e = linear(s, c, semb);                           /* [N, cout] */
  DO(s, e4, flame_reshape(e, per_channel, 4, &e4)); /* broadcast over the pixels */
  DO(s, he, flame_add(h, e4, &he));
  h = conv(s, c, norm_silu(s, c, he), co);
  skip = cin == cout ? x : conv(s, c, x, co);
  DO(s, out, flame_add(skip, h, &out));
  return out;
}

/* The predicted velocity [N, 3, IMG, IMG] for x_t [N, 3, IMG, IMG] and t [N] (f32 in [0, 1]). */
static flame_tensor_t unet(check* s, const net* m, flame_tensor_t x, flame_tensor_t t, int64_t n) {
  const int64_t C = m->width;
  cursor c = {m, 0};
  flame_conv_options_t co;
  flame_pool2d_options_t po;
  flame_tensor_t temb, t1, t2, t3, semb, h0, h1, p1, h2, p2, mid, u2, c2, b2, u1, c1, b1, out;
  flame_status_t st = flame_conv_options_init(&co);
  if (st == FLAME_OK) st = flame_pool2d_options_init(&po, 2, 2);
  if (st != FLAME_OK) check_fail(s, st, "options_init");
  co.padding_same = 1;
  /* time: sin/cos features of 1000 t (the usual 0..1000 range of diffusion timesteps), then an MLP */
  DO(s, temb, flame_timestep_embedding(t, C, 10000.0, 1, 0.0, 1000.0, &temb)); /* [N, C] */
  t1 = linear(s, &c, temb);
  DO(s, t2, flame_silu(t1, &t2));
  t3 = linear(s, &c, t2);
  DO(s, semb, flame_silu(t3, &semb)); /* every block projects silu(temb) */
  h0 = conv(s, &c, x, &co);           /* [N, C, 32, 32] */
  h1 = block(s, &c, h0, n, C, C, semb, &co);
  DO(s, p1, flame_avg_pool2d(h1, &po, &p1)); /* 16x16 */
  h2 = block(s, &c, p1, n, C, 2 * C, semb, &co);
  DO(s, p2, flame_avg_pool2d(h2, &po, &p2)); /* 8x8 */
  mid = block(s, &c, p2, n, 2 * C, 2 * C, semb, &co);
  DO(s, u2, flame_upsample_nearest2d(mid, IMG / 2, IMG / 2, 0.0, 0.0, &u2));
  {
    flame_tensor_t parts[2] = {u2, h2};
    DO(s, c2, flame_cat(parts, 2, 1, &c2)); /* [N, 4C, 16, 16] */
  }
  b2 = block(s, &c, c2, n, 4 * C, 2 * C, semb, &co);
  DO(s, u1, flame_upsample_nearest2d(b2, IMG, IMG, 0.0, 0.0, &u1));
  {
    flame_tensor_t parts[2] = {u1, h1};
    DO(s, c1, flame_cat(parts, 2, 1, &c1)); /* [N, 3C, 32, 32] */
  }
  b1 = block(s, &c, c1, n, 3 * C, C, semb, &co);
  out = conv(s, &c, norm_silu(s, &c, b1), &co);
  if (s->st == FLAME_OK && c.i != m->n) {
    flame_set_error_message("train_diffusion: the forward pass read fewer parameters than net_init made");
    check_fail(s, FLAME_ERROR_INTERNAL, "unet");
  }
  return out;
}

/* ---------------------------------------------------------------- EMA weights */

/* ema = detached copies of the parameters (no grad). */
static flame_status_t ema_init(flame_ctx_t ctx, const net* m, net* ema) {
  int32_t prev = 1;
  flame_status_t st = flame_ctx_set_grad_enabled(ctx, 0, &prev);
  ema->width = m->width;
  ema->n = 0;
  for (int i = 0; i < m->n && st == FLAME_OK; ++i) {
    st = flame_clone(m->p[i], &ema->p[i]);
    if (st == FLAME_OK) ema->n = i + 1;
  }
  flame_ctx_set_grad_enabled(ctx, prev, NULL);
  return st;
}

/* ema += (1 - decay) (p - ema) for every parameter, under no-grad; each EMA tensor is replaced.
 * Called inside the training step's handle scope: the intermediates go with a scope of its own,
 * and each new EMA tensor is kept (the caller's, not the step scope's). */
static flame_status_t ema_update(flame_ctx_t ctx, const net* m, net* ema, double decay) {
  int32_t prev = 1;
  flame_scope_t scope = NULL;
  flame_status_t st = flame_ctx_set_grad_enabled(ctx, 0, &prev);
  if (st == FLAME_OK) st = flame_scope_begin(ctx, &scope);
  for (int i = 0; i < m->n && st == FLAME_OK; ++i) {
    flame_tensor_t d = NULL, step = NULL, next = NULL;
    st = flame_sub(m->p[i], ema->p[i], &d);
    if (st == FLAME_OK) st = flame_mul_scalar(d, 1.0 - decay, &step);
    if (st == FLAME_OK) st = flame_add(ema->p[i], step, &next);
    if (st == FLAME_OK) st = flame_scope_keep(scope, next);
    if (st == FLAME_OK) {
      flame_tensor_release(ema->p[i]);
      ema->p[i] = next;
    }
  }
  flame_status_t end = flame_scope_end(scope);
  if (st == FLAME_OK) st = end;
  flame_ctx_set_grad_enabled(ctx, prev, NULL);
  return st;
}

/* ---------------------------------------------------------------- sampling */

/* n images from model m: Euler steps x += v(x, t) / steps from noise at t = 0 to t = 1, without
 * recording a graph; written clamped to [-1, 1] into out [n, 3, IMG, IMG] (host floats). */
static flame_status_t sample_images(flame_ctx_t ctx, const net* m, int n, int steps, float* out) {
  int32_t prev = 1;
  flame_status_t st = flame_ctx_set_grad_enabled(ctx, 0, &prev);
  if (st != FLAME_OK) return st;
  for (int done = 0; done < n && st == FLAME_OK; done += SAMPLE_CHUNK) {
    const int k = n - done < SAMPLE_CHUNK ? n - done : SAMPLE_CHUNK;
    const int64_t xs[4] = {k, 3, IMG, IMG}, ts[1] = {k};
    flame_tensor_t x = NULL, clamped = NULL;
    st = flame_randn(ctx, xs, 4, FLAME_DTYPE_F32, &x);
    for (int i = 0; i < steps && st == FLAME_OK; ++i) {
      check s;
      flame_tensor_t t, v, dx, next;
      flame_scope_t euler_scope; /* this Euler step's intermediates */
      memset(&s, 0, sizeof s);
      begin_scope(&s, ctx, &euler_scope);
      DO(&s, t, flame_full(ctx, ts, 1, FLAME_DTYPE_F32, (double)i / steps, &t));
      v = unet(&s, m, x, t, k);
      DO(&s, dx, flame_mul_scalar(v, 1.0 / steps, &dx));
      DO(&s, next, flame_add(x, dx, &next));
      if (s.st == FLAME_OK) check_fail(&s, flame_scope_keep(euler_scope, next), "flame_scope_keep"); /* ours */
      end_scope(&s, &euler_scope);
      if (s.st != FLAME_OK) {
        report(&s);
        st = s.st;
        break;
      }
      flame_tensor_release(x);
      x = next;
    }
    if (st == FLAME_OK) st = flame_clamp(x, -1.0, 1.0, &clamped);
    if (st == FLAME_OK) st = flame_to_host(clamped, out + (size_t)done * 3 * IMG * IMG, sizeof(float) * (size_t)k * 3 * IMG * IMG);
    flame_tensor_release(clamped);
    flame_tensor_release(x);
  }
  flame_ctx_set_grad_enabled(ctx, prev, NULL);
  return st;
}

/* ---------------------------------------------------------------- the sample-quality proxy */

/* 1 when img (planar CHW floats) shows one shape on a dark background: the pixels whose channel mean,
 * averaged over their 3x3 neighbourhood, is above FG_THRESHOLD form one 4-connected blob of 12 to 450
 * pixels that holds at least 80% of them. (See the file's header for why this separates the data
 * from noise.) */
static int plausible_shape(const float* img) {
  unsigned char fg[IMG * IMG];
  double grey[IMG * IMG];
  int stack[IMG * IMG], total = 0, largest = 0;
  for (int p = 0; p < IMG * IMG; ++p) grey[p] = (img[p] + img[IMG * IMG + p] + img[2 * IMG * IMG + p]) / 3.0;
  for (int y = 0; y < IMG; ++y) /* a 3x3 box average first: pixel noise (std up to ~0.4) does not split blobs */
    for (int x = 0; x < IMG; ++x) {
      double sum = 0;
      int cnt = 0;
      for (int dy = -1; dy <= 1; ++dy)
        for (int dx = -1; dx <= 1; ++dx)
          if (y + dy >= 0 && y + dy < IMG && x + dx >= 0 && x + dx < IMG) {
            sum += grey[(y + dy) * IMG + x + dx];
            ++cnt;
          }
      fg[y * IMG + x] = sum / cnt > FG_THRESHOLD;
      total += fg[y * IMG + x];
    }
  for (int p = 0; p < IMG * IMG; ++p) { /* flood fill each blob, clearing it as it goes */
    if (!fg[p]) continue;
    int top = 0, size = 0;
    stack[top++] = p;
    fg[p] = 0;
    while (top) {
      int q = stack[--top], y = q / IMG, x = q % IMG;
      ++size;
      const int nb[4] = {x > 0 ? q - 1 : -1, x + 1 < IMG ? q + 1 : -1, y > 0 ? q - IMG : -1, y + 1 < IMG ? q + IMG : -1};
      for (int k = 0; k < 4; ++k)
        if (nb[k] >= 0 && fg[nb[k]]) {
          fg[nb[k]] = 0;
          stack[top++] = nb[k];
        }
    }
    if (size > largest) largest = size;
  }
  return largest >= 12 && largest <= 450 && largest >= 0.8 * total;
}

/* Fraction of n images that pass plausible_shape. */
static double plausible_fraction(const float* imgs, int n) {
  int pass = 0;
  for (int i = 0; i < n; ++i) pass += plausible_shape(imgs + (size_t)i * 3 * IMG * IMG);
  return n ? (double)pass / n : 0.0;
}

/* ---------------------------------------------------------------- PNG grids */

/* The first g * g images as a g x g grid, each pixel drawn 2 x 2, with 2-pixel grey gutters; written
 * to path and read back with png_check, which must give the same pixels. Returns 0 on success. */
static int write_grid(const char* path, const float* imgs, int g) {
  const int z = 2, cell = IMG * z + 2, side = g * cell + 2;
  unsigned char* rgb = malloc((size_t)side * side * 3);
  unsigned char* back = NULL;
  int w = 0, h = 0, rc = 1;
  char why[256];
  if (!rgb) {
    fprintf(stderr, "train_diffusion: out of host memory\n");
    return 1;
  }
  memset(rgb, 96, (size_t)side * side * 3);
  for (int i = 0; i < g * g; ++i) {
    const float* img = imgs + (size_t)i * 3 * IMG * IMG;
    const int ox = 2 + (i % g) * cell, oy = 2 + (i / g) * cell;
    for (int y = 0; y < IMG * z; ++y)
      for (int x = 0; x < IMG * z; ++x)
        for (int k = 0; k < 3; ++k) {
          double v = (img[(k * IMG + y / z) * IMG + x / z] + 1.0) * 127.5;
          rgb[((size_t)(oy + y) * side + (ox + x)) * 3 + k] = (unsigned char)(v < 0 ? 0 : v > 255 ? 255 : v + 0.5);
        }
  }
  if (png_write_rgb(path, rgb, side, side) != 0) {
    fprintf(stderr, "train_diffusion: cannot write %s\n", path);
  } else if (png_check(path, &back, &w, &h, why, sizeof why) != 0) {
    fprintf(stderr, "train_diffusion: %s does not read back: %s\n", path, why);
  } else if (w != side || h != side || memcmp(back, rgb, (size_t)side * side * 3) != 0) {
    fprintf(stderr, "train_diffusion: %s reads back as other pixels (%dx%d)\n", path, w, h);
  } else {
    printf("  wrote %s (%dx%d, %d samples; read back and checked)\n", path, side, side, g * g);
    rc = 0;
  }
  free(back);
  free(rgb);
  return rc;
}

/* ---------------------------------------------------------------- schedule and arguments */

static double schedule(const config* c, int step) {
  int warm = c->steps / 20 + 1;
  if (step < warm) return c->lr * (step + 1) / warm;
  double p = (double)(step - warm) / (double)(c->steps - warm > 0 ? c->steps - warm : 1);
  return c->lr * (0.01 + 0.99 * 0.5 * (1.0 + cos(PI * p)));
}

/* EXAMPLE_ARGS_RUN to train, else the exit status (example_args.h). *verify: --verify-png's FILE. */
static int parse_args(int argc, char** argv, config* c, const char** verify) {
  const example_arg args[] = {
      {"--steps", ARG_INT, &c->steps, "N", "training steps", 1, 0, NULL},
      {"--batch", ARG_INT, &c->batch, "B", "images per step", 1, 0, NULL},
      {"--width", ARG_INT, &c->width, "C", "channels of the first level (a multiple of 8)", 8, 0, NULL},
      {"--lr", ARG_POSITIVE_DOUBLE, &c->lr, "LR", "peak learning rate of AdamW", 0, 0, NULL},
      {"--ema", ARG_FRACTION, &c->ema, "D", "decay of the parameters' moving average, in [0, 1)", 0, 0, NULL},
      {"--seed", ARG_U64, &c->seed, "S", "seed of the data, the noise and the context's generator", 0, 0, NULL},
      {"--log", ARG_INT, &c->log_every, "K", "print progress every K steps", 1, 0, NULL},
      {"--png-every", ARG_INT, &c->png_every, "K", "write a PNG grid of samples every K steps", 1, 0, NULL},
      {"--sample-steps", ARG_INT, &c->sample_steps, "K", "denoising steps of the sampler", 1, 0, NULL},
      {"--eval", ARG_INT, &c->eval, "N", "samples drawn for the final check (>= 16)", 16, 0, NULL},
      {"--out", ARG_STRING, &c->out, "PREFIX", "prefix of the PNG files", 0, 0, NULL},
      {"--target", ARG_DOUBLE, &c->target, "F", "fraction of the --eval samples that must pass the shape test", 0, 0, NULL},
      {"--loss-factor", ARG_POSITIVE_DOUBLE, &c->loss_factor, "F", "the mean loss of the last --log steps must be at most F x the first step's", 0, 0, NULL},
      {"--verify-png", ARG_STRING, verify, "FILE", "only check that FILE reads back as an 8-bit RGB PNG, then exit", 0, 0, NULL}};
  const example_cli cli = {"train_diffusion", "Trains a small diffusion model on drawn shapes, samples from it and writes PNG grids.",
                           args, (int)(sizeof args / sizeof args[0]),
                           "Exit status: 0 targets reached (--verify-png: the file checks out), 1 a FLAME error, a missed\n"
                           "target or a bad option, 2 no GPU."};
  int rc = example_parse_args(&cli, argc, argv);
  if (rc == EXAMPLE_ARGS_RUN && c->width % 8) rc = example_arg_fail(&cli, "--width", "expected a multiple of 8, got %d", c->width);
  return rc;
}

/* --verify-png FILE: 0 when FILE reads back as an 8-bit RGB PNG, 1 otherwise. */
static int verify_png(const char* path) {
  unsigned char* rgb = NULL;
  int w = 0, h = 0;
  char why[256];
  if (png_check(path, &rgb, &w, &h, why, sizeof why) != 0) {
    fprintf(stderr, "train_diffusion: %s: %s\n", path, why);
    return 1;
  }
  free(rgb);
  printf("%s: an 8-bit RGB PNG of %dx%d; signature, chunk CRCs, IHDR, IDAT and filters check out\n", path, w, h);
  return 0;
}

int main(int argc, char** argv) {
  config cfg = {1000, 64, 32, 100, 250, 50, 256, 2e-3, 0.995, 0.5, 0.5, 1, "diffusion"};
  int status = 1;
  flame_ctx_t ctx = NULL;
  net m, ema;
  flame_optimizer_t opt = NULL;
  flame_tensor_t loss_sum = NULL;
  flame_scope_t step_scope = NULL;
  float *imgs = NULL, *samples = NULL;
  char path[4096];
  memset(&m, 0, sizeof m);
  memset(&ema, 0, sizeof ema);
  const char* verify = NULL;
  int args_rc = parse_args(argc, argv, &cfg, &verify);
  if (args_rc != EXAMPLE_ARGS_RUN) return args_rc;
  if (verify) return verify_png(verify);

  flame_ctx_options_t o;
  flame_ctx_options_init(&o);
  o.seed = cfg.seed;
  flame_status_t st = flame_ctx_create(&o, &ctx);
  if (st == FLAME_ERROR_NO_DRIVER || st == FLAME_ERROR_NO_DEVICE) {
    fprintf(stderr, "train_diffusion: no GPU available (%s): %s\n", flame_status_string(st), flame_last_error_message());
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
  char device[128];
  CHECK(flame_ctx_device_name(ctx, device, sizeof device));
  CHECK(net_init(ctx, &m, cfg.width));
  int64_t nparams = 0;
  for (int i = 0; i < m.n; ++i) {
    int64_t k = 0;
    CHECK(flame_tensor_numel(m.p[i], &k));
    nparams += k;
  }
  printf("train_diffusion on %s: shapes 32x32, UNet width %d (%lld parameters in %d tensors), batch %d, %d steps, "
         "AdamW lr %g, EMA %g\n",
         device, cfg.width, (long long)nparams, m.n, cfg.batch, cfg.steps, cfg.lr, cfg.ema);
  CHECK(ema_init(ctx, &m, &ema));

  const int maxn = cfg.batch > cfg.eval ? cfg.batch : cfg.eval;
  imgs = malloc(sizeof(float) * (size_t)maxn * 3 * IMG * IMG);
  samples = malloc(sizeof(float) * (size_t)cfg.eval * 3 * IMG * IMG);
  if (!imgs || !samples) {
    fprintf(stderr, "train_diffusion: out of host memory\n");
    goto cleanup;
  }

  /* The proxy on the data (a reference: every image should pass) and on the untrained model. */
  uint64_t data_rng = 0x8CB92BA72F3D8DD7ull ^ cfg.seed, ref_rng = 0xD1B54A32D192ED03ull ^ cfg.seed;
  draw_batch(&ref_rng, cfg.eval, imgs, NULL);
  const double data_pass = plausible_fraction(imgs, cfg.eval);
  CHECK(sample_images(ctx, &ema, cfg.eval, cfg.sample_steps, samples));
  const double untrained_pass = plausible_fraction(samples, cfg.eval);
  printf("plausible-shape test: %.1f%% of %d data images, %.1f%% of %d samples of the untrained model\n", 100 * data_pass,
         cfg.eval, 100 * untrained_pass, cfg.eval);
  snprintf(path, sizeof path, "%s_untrained.png", cfg.out);
  if (write_grid(path, samples, 4)) goto cleanup;

  flame_optimizer_options_t oo;
  flame_tensor_t decayed[MAX_PARAMS], plain[MAX_PARAMS];
  int nd = 0, np = 0;
  for (int i = 0; i < m.n; ++i) {
    if (m.decay[i]) decayed[nd++] = m.p[i];
    else plain[np++] = m.p[i];
  }
  CHECK(flame_optimizer_options_init(&oo, FLAME_OPTIMIZER_ADAMW));
  oo.lr = cfg.lr;
  oo.weight_decay = 0.01;
  CHECK(flame_optimizer_create(ctx, &oo, decayed, nd, &opt));
  oo.weight_decay = 0.0;
  CHECK(flame_optimizer_add_param_group(opt, &oo, plain, np, NULL));

  const int64_t xs[4] = {cfg.batch, 3, IMG, IMG}, ts[1] = {cfg.batch}, t4s[4] = {cfg.batch, 1, 1, 1};
  double first_loss = NAN, window_loss = NAN;
  struct timespec t0, t1, start;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  start = t0;
  int since = 0;
  CHECK(flame_zeros(ctx, NULL, 0, FLAME_DTYPE_F32, &loss_sum));
  for (int step = 0; step < cfg.steps; ++step) {
    flame_tensor_t x1, x0, t, t4, v, tv, xt, pred, loss, norm, det, acc;
    const double lr = schedule(&cfg, step);
    draw_batch(&data_rng, cfg.batch, imgs, NULL);
    CHECK(flame_optimizer_set_lr(opt, -1, lr));
    begin_scope(&s, ctx, &step_scope); /* this step's intermediates */
    DO(&s, x1, flame_from_host(ctx, imgs, sizeof(float) * (size_t)cfg.batch * 3 * IMG * IMG, xs, 4, FLAME_DTYPE_F32, &x1));
    DO(&s, x0, flame_randn(ctx, xs, 4, FLAME_DTYPE_F32, &x0));
    DO(&s, t, flame_rand(ctx, ts, 1, FLAME_DTYPE_F32, &t));
    DO(&s, t4, flame_reshape(t, t4s, 4, &t4));
    DO(&s, v, flame_sub(x1, x0, &v));   /* the target velocity */
    DO(&s, tv, flame_mul(t4, v, &tv));
    DO(&s, xt, flame_add(x0, tv, &xt)); /* x_t = x0 + t (x1 - x0) */
    pred = unet(&s, &m, xt, t, cfg.batch);
    DO(&s, loss, flame_mse_loss(pred, v, FLAME_REDUCTION_MEAN, &loss));
    if (s.st == FLAME_OK) CHECK(flame_backward(ctx, loss, NULL, 0));
    DO(&s, norm, flame_clip_grad_norm(ctx, m.p, m.n, 1.0, 2.0, 0, &norm));
    if (s.st == FLAME_OK) CHECK(flame_optimizer_step(opt));
    if (s.st == FLAME_OK) CHECK(flame_optimizer_zero_grad(opt, 1));
    if (s.st == FLAME_OK) {
      const double d = (1.0 + step) / (10.0 + step);
      CHECK(ema_update(ctx, &m, &ema, d < cfg.ema ? d : cfg.ema));
    }
    /* The loss summed on the device (no synchronisation per step), read every --log steps. */
    DO(&s, det, flame_tensor_detach(loss, &det));
    DO(&s, acc, flame_add(loss_sum, det, &acc));
    if (s.st != FLAME_OK) {
      report(&s);
      goto cleanup;
    }
    CHECK(flame_scope_keep(step_scope, acc)); /* ours: it outlives the step */
    flame_tensor_release(loss_sum);
    loss_sum = acc;
    if (step == 0) CHECK(flame_tensor_item(loss, &first_loss));
    ++since;
    if ((step + 1) % cfg.log_every == 0 || step + 1 == cfg.steps) {
      double total = 0, nv = 0;
      flame_memory_stats_t ms;
      ms.struct_size = sizeof ms;
      CHECK(flame_tensor_item(loss_sum, &total)); /* synchronises: the timing covers the queued steps */
      CHECK(flame_tensor_item(norm, &nv));
      CHECK(flame_ctx_memory_stats(ctx, &ms));
      clock_gettime(CLOCK_MONOTONIC, &t1);
      const double sec = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
      window_loss = total / since;
      printf("step %5d  loss %.4f (mean of %d steps)  lr %.2e  grad-norm %6.3f  %7.0f images/s  %.2f ms/step  "
             "memory %.1f MiB (peak %.1f)\n",
             step + 1, window_loss, since, lr, nv, since * (double)cfg.batch / sec, 1e3 * sec / since,
             ms.bytes_in_use / 1048576.0, ms.peak_bytes_in_use / 1048576.0);
      flame_tensor_release(loss_sum);
      loss_sum = NULL;
      CHECK(flame_zeros(ctx, NULL, 0, FLAME_DTYPE_F32, &loss_sum));
      CHECK(flame_scope_keep(step_scope, loss_sum));
      since = 0;
      clock_gettime(CLOCK_MONOTONIC, &t0);
    }
    end_scope(&s, &step_scope);
    if (s.st != FLAME_OK) {
      report(&s);
      goto cleanup;
    }
    if ((step + 1) % cfg.png_every == 0 && step + 1 < cfg.steps) { /* the EMA model's samples so far */
      struct timespec p0, p1;
      clock_gettime(CLOCK_MONOTONIC, &p0);
      snprintf(path, sizeof path, "%s_step%05d.png", cfg.out, step + 1);
      CHECK(sample_images(ctx, &ema, 16, cfg.sample_steps, samples));
      if (write_grid(path, samples, 4)) goto cleanup;
      clock_gettime(CLOCK_MONOTONIC, &p1);
      t0.tv_sec += p1.tv_sec - p0.tv_sec; /* the throughput leaves the sampling out */
      t0.tv_nsec += p1.tv_nsec - p0.tv_nsec;
    }
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  printf("training loop: %.1f s (sampling included)\n",
         (double)(t1.tv_sec - start.tv_sec) + 1e-9 * (double)(t1.tv_nsec - start.tv_nsec));

  /* The claims. */
  CHECK(sample_images(ctx, &ema, cfg.eval, cfg.sample_steps, samples));
  const double trained_pass = plausible_fraction(samples, cfg.eval);
  snprintf(path, sizeof path, "%s_final.png", cfg.out);
  const int grid = cfg.eval >= 64 ? 8 : 4;
  if (write_grid(path, samples, grid)) goto cleanup;
  const int loss_ok = window_loss <= cfg.loss_factor * first_loss;
  const int samples_ok = trained_pass >= cfg.target && untrained_pass < cfg.target;
  printf("loss: %.4f at the first step, %.4f over the last %d steps (ratio %.3f, claim <= %.2f): %s\n", first_loss,
         window_loss, cfg.steps % cfg.log_every ? cfg.steps % cfg.log_every : cfg.log_every, window_loss / first_loss,
         cfg.loss_factor, loss_ok ? "ok" : "FAILED");
  printf("plausible shapes: %.1f%% of %d EMA samples (%d Euler steps), untrained %.1f%%, data %.1f%% (claim: >= %.0f%%, "
         "untrained below): %s\n",
         100 * trained_pass, cfg.eval, cfg.sample_steps, 100 * untrained_pass, 100 * data_pass, 100 * cfg.target,
         samples_ok ? "ok" : "FAILED");
  status = loss_ok && samples_ok ? 0 : 1;
  if (status) fprintf(stderr, "train_diffusion: a claim failed (see above)\n");

cleanup:
  flame_scope_end(step_scope); /* NULL when no step was in progress */
  flame_tensor_release(loss_sum);
  flame_optimizer_release(opt);
  net_release(&m);
  net_release(&ema);
  flame_ctx_destroy(ctx);
  free(imgs);
  free(samples);
  return status;
#undef CHECK
}

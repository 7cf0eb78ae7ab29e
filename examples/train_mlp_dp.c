/*
 * train_mlp_dp.c - data-parallel training on several GPUs of one machine, from C: one thread and one
 * context per GPU, an NCCL communicator between them, flame_dp_* for the gradients.
 *
 *   data   y = sin(3 x0) cos(2 x1) + 0.5 x2 on x uniform in [-1, 1]^4, generated here; every step
 *          draws a global batch, and rank r trains on rows [r * B, (r + 1) * B) of it
 *   model  4 -> hidden -> 1 (flame_linear with ReLU fused), mse loss
 *   train  per step two micro-steps of B / 2 rows: the first with sync off (gradients accumulate
 *          locally, no communication), the second with sync on (its backward all-reduces the
 *          buckets); flame_dp_wait, then AdamW. The initial parameters differ per rank (seeded by
 *          rank): flame_dp_create broadcasts rank 0's.
 *
 * Prints the loss averaged over the ranks (an all_reduce of each rank's loss) every --log steps; at
 * the end checks that every rank holds exactly the same parameters. Runs with one GPU too (world 1).
 * Exit status: 0 when the parameters agree and the loss fell below half of its first value, 1 on
 * a FLAME error or a failed check, 2 without a GPU, driver or NCCL.
 *
 *   train_mlp_dp [--gpus N] [--steps S] [--batch B] [--hidden H] [--log K]
 *
 * The same loop runs with one process per GPU: make the id with flame_comm_unique_id on rank 0,
 * hand its 128 bytes to the other processes (MPI, a file, a socket), and call flame_comm_create
 * with each process's rank.
 */
#define _POSIX_C_SOURCE 199309L
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "example_args.h" /* the options table: --help, --version, errors naming the option */
#include "flame.h"

#define EXIT_NO_GPU 2
#define MAX_GPUS 8
#define IN 4

#define CHECK(call)                                                                                 \
  do {                                                                                              \
    flame_status_t st_ = (call);                                                                    \
    if (st_ != FLAME_OK) {                                                                          \
      fprintf(stderr, "train_mlp_dp rank %d: %s failed: %s: %s\n", r->rank, #call,                 \
              flame_status_string(st_), flame_last_error_message());                                \
      goto cleanup;                                                                                 \
    }                                                                                               \
  } while (0)

typedef struct shared {
  int world, steps, batch, hidden, log_every;
  flame_ctx_t ctx[MAX_GPUS];
  flame_comm_id_t id;
} shared;

typedef struct rank_state {
  shared* s;
  int rank;
  int ok;
  double first_loss, last_loss;
  float* params; /* the final parameters, copied to the host */
  size_t n_params;
} rank_state;

static uint64_t rng_next(uint64_t* s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 2685821657736338717ull;
}
static float rng_uniform(uint64_t* s) { return (float)((double)(rng_next(s) >> 11) / 9007199254740992.0) * 2.0f - 1.0f; }

/* rows [first, first + n) of step `step`'s global batch: x [n, IN], y [n, 1] */
static void make_batch(int step, int first, int n, float* x, float* y) {
  int i, k;
  for (i = 0; i < n; ++i) {
    uint64_t g = 0x9E3779B97F4A7C15ull ^ ((uint64_t)step * 1000003u + (uint64_t)(first + i) * 7919u + 1u);
    for (k = 0; k < IN; ++k) x[i * IN + k] = rng_uniform(&g);
    y[i] = (float)(sin(3.0 * x[i * IN]) * cos(2.0 * x[i * IN + 1]) + 0.5 * x[i * IN + 2]);
  }
}

/* A leaf of shape [rows, cols] (cols 0: a vector of rows), uniform in [-scale, scale], rank-seeded. */
static flame_status_t make_param(flame_ctx_t ctx, int rows, int cols, float scale, uint64_t seed, flame_tensor_t* out) {
  int64_t shape[2];
  int n = cols ? rows * cols : rows, i;
  float* v = (float*)malloc(sizeof(float) * (size_t)n);
  flame_status_t st;
  if (!v) return FLAME_ERROR_OUT_OF_MEMORY;
  for (i = 0; i < n; ++i) v[i] = scale * rng_uniform(&seed);
  shape[0] = rows;
  shape[1] = cols;
  st = flame_from_host(ctx, v, sizeof(float) * (size_t)n, shape, cols ? 2 : 1, FLAME_DTYPE_F32, out);
  free(v);
  if (st == FLAME_OK) st = flame_tensor_set_requires_grad(*out, 1);
  return st;
}

/* loss = mse(mlp(x), y); *loss_out keeps the (unscaled) loss; backward of loss * scale. */
static flame_status_t micro_step(flame_ctx_t ctx, flame_tensor_t* p, const float* x, const float* y, int n, double scale,
                                 flame_tensor_t* loss_out) {
  int64_t xs[2], ys[2];
  flame_tensor_t tx = NULL, ty = NULL, h = NULL, o = NULL, loss = NULL, scaled = NULL;
  flame_status_t st;
  xs[0] = n;
  xs[1] = IN;
  ys[0] = n;
  ys[1] = 1;
  if ((st = flame_from_host(ctx, x, sizeof(float) * (size_t)n * IN, xs, 2, FLAME_DTYPE_F32, &tx)) != FLAME_OK) goto done;
  if ((st = flame_from_host(ctx, y, sizeof(float) * (size_t)n, ys, 2, FLAME_DTYPE_F32, &ty)) != FLAME_OK) goto done;
  if ((st = flame_linear(tx, p[0], p[1], FLAME_ACTIVATION_RELU, &h)) != FLAME_OK) goto done;
  if ((st = flame_linear(h, p[2], p[3], FLAME_ACTIVATION_NONE, &o)) != FLAME_OK) goto done;
  if ((st = flame_mse_loss(o, ty, FLAME_REDUCTION_MEAN, &loss)) != FLAME_OK) goto done;
  if ((st = flame_mul_scalar(loss, scale, &scaled)) != FLAME_OK) goto done;
  if ((st = flame_backward(ctx, scaled, NULL, 0)) != FLAME_OK) goto done;
  *loss_out = loss;
  loss = NULL;
done:
  flame_tensor_release(tx);
  flame_tensor_release(ty);
  flame_tensor_release(h);
  flame_tensor_release(o);
  flame_tensor_release(loss);
  flame_tensor_release(scaled);
  return st;
}

static void* rank_main(void* arg) {
  rank_state* r = (rank_state*)arg;
  shared* s = r->s;
  flame_ctx_t ctx = s->ctx[r->rank];
  flame_comm_t comm = NULL;
  flame_dp_t dp = NULL;
  flame_optimizer_t opt = NULL;
  flame_tensor_t p[4] = {NULL, NULL, NULL, NULL};
  flame_optimizer_options_t oo;
  const int half = s->batch / 2;
  float* x = (float*)malloc(sizeof(float) * (size_t)half * IN);
  float* y = (float*)malloc(sizeof(float) * (size_t)half);
  int step, micro, i;
  size_t off = 0;
  if (!x || !y) goto cleanup;

  /* every rank joins the communicator concurrently */
  CHECK(flame_comm_create(ctx, &s->id, r->rank, s->world, NULL, &comm));
  CHECK(make_param(ctx, s->hidden, IN, 0.5f, 11u + (uint64_t)r->rank, &p[0]));
  CHECK(make_param(ctx, s->hidden, 0, 0.1f, 22u + (uint64_t)r->rank, &p[1]));
  CHECK(make_param(ctx, 1, s->hidden, 0.3f, 33u + (uint64_t)r->rank, &p[2]));
  CHECK(make_param(ctx, 1, 0, 0.1f, 44u + (uint64_t)r->rank, &p[3]));
  CHECK(flame_dp_create(comm, p, 4, NULL, &dp)); /* rank 0's values everywhere from here on */
  CHECK(flame_optimizer_options_init(&oo, FLAME_OPTIMIZER_ADAMW));
  oo.lr = 3e-3;
  oo.weight_decay = 0.0;
  CHECK(flame_optimizer_create(ctx, &oo, p, 4, &opt));

  for (step = 0; step < s->steps; ++step) {
    flame_tensor_t loss = NULL;
    double loss_sum = 0.0, value = 0.0;
    for (micro = 0; micro < 2; ++micro) {
      flame_status_t st;
      CHECK(flame_dp_set_sync(dp, micro == 1)); /* communicate on the last micro-step only */
      make_batch(step, r->rank * s->batch + micro * half, half, x, y);
      st = micro_step(ctx, p, x, y, half, 0.5, &loss);
      CHECK(st);
      /* the loss averaged over the ranks, for printing (grad mode off: it is a plain value now) */
      if ((step + 1) % s->log_every == 0 || step == 0 || step + 1 == s->steps) {
        flame_tensor_t d = NULL;
        st = flame_tensor_detach(loss, &d);
        if (st == FLAME_OK) st = flame_comm_all_reduce(comm, d, FLAME_REDUCE_AVG);
        if (st == FLAME_OK) st = flame_comm_synchronize(comm);
        if (st == FLAME_OK) st = flame_tensor_item(d, &value);
        flame_tensor_release(d);
        loss_sum += 0.5 * value;
      }
      flame_tensor_release(loss);
      loss = NULL;
      CHECK(st);
    }
    CHECK(flame_dp_wait(dp)); /* averaged gradients in .grad */
    CHECK(flame_optimizer_step(opt));
    CHECK(flame_optimizer_zero_grad(opt, 1));
    if ((step + 1) % s->log_every == 0 || step == 0 || step + 1 == s->steps) {
      if (step == 0) r->first_loss = loss_sum;
      r->last_loss = loss_sum;
      if (r->rank == 0) printf("step %4d  loss %.6f  (mean over %d ranks)\n", step + 1, loss_sum, s->world);
    }
  }

  for (i = 0; i < 4; ++i) {
    int64_t n = 0;
    CHECK(flame_tensor_numel(p[i], &n));
    r->n_params += (size_t)n;
  }
  r->params = (float*)malloc(sizeof(float) * r->n_params);
  if (!r->params) goto cleanup;
  for (i = 0; i < 4; ++i) {
    int64_t n = 0;
    CHECK(flame_tensor_numel(p[i], &n));
    CHECK(flame_to_host(p[i], r->params + off, sizeof(float) * (size_t)n));
    off += (size_t)n;
  }
  r->ok = 1;
cleanup:
  flame_optimizer_release(opt);
  flame_dp_release(dp);
  for (i = 0; i < 4; ++i) flame_tensor_release(p[i]);
  flame_comm_release(comm); /* every rank releases concurrently, as it created */
  free(x);
  free(y);
  return NULL;
}

/* EXAMPLE_ARGS_RUN to train, else the exit status (example_args.h). */
static int parse_args(int argc, char** argv, shared* s) {
  const example_arg args[] = {
      {"--gpus", ARG_INT, &s->world, "N", "GPUs to train on (one thread and context each)", 1, MAX_GPUS, "2, or 1 with one GPU"},
      {"--steps", ARG_INT, &s->steps, "S", "training steps", 1, 0, NULL},
      {"--batch", ARG_INT, &s->batch, "B", "rows per GPU and step, even (two micro-steps of B / 2)", 2, 0, NULL},
      {"--hidden", ARG_INT, &s->hidden, "H", "width of the hidden layer", 1, 0, NULL},
      {"--log", ARG_INT, &s->log_every, "K", "print the loss every K steps", 1, 0, NULL}};
  const example_cli cli = {"train_mlp_dp", "Trains an MLP data-parallel on the GPUs of this machine (NCCL) and checks that the ranks agree.",
                           args, (int)(sizeof args / sizeof args[0]),
                           "Exit status: 0 the ranks agree and the loss halved, 1 a FLAME error, a failed check or a bad\n"
                           "option, 2 no GPU, driver or NCCL."};
  int rc = example_parse_args(&cli, argc, argv);
  if (rc == EXAMPLE_ARGS_RUN && s->batch % 2) rc = example_arg_fail(&cli, "--batch", "expected an even number, got %d", s->batch);
  return rc;
}

int main(int argc, char** argv) {
  shared s;
  rank_state ranks[MAX_GPUS];
  pthread_t threads[MAX_GPUS];
  int32_t count = 0;
  int i, rc = 1, made = 0;
  flame_status_t st;
  memset(&s, 0, sizeof s);
  memset(ranks, 0, sizeof ranks);
  s.world = -1;
  s.steps = 300;
  s.batch = 64;
  s.hidden = 64;
  s.log_every = 50;
  rc = parse_args(argc, argv, &s);
  if (rc != EXAMPLE_ARGS_RUN) return rc;
  rc = 1;
  st = flame_device_count(&count);
  if (st != FLAME_OK || count < 1) {
    fprintf(stderr, "train_mlp_dp: no GPU: %s\n", st != FLAME_OK ? flame_last_error_message() : "no device");
    return EXIT_NO_GPU;
  }
  if (s.world < 0) s.world = count < 2 ? count : 2;
  if (s.world < 1 || s.world > count || s.world > MAX_GPUS) {
    fprintf(stderr, "train_mlp_dp: --gpus %d, but %d GPU(s) are present (at most %d)\n", s.world, (int)count, MAX_GPUS);
    return 1;
  }
  for (i = 0; i < s.world; ++i) {
    flame_ctx_options_t o;
    flame_ctx_options_init(&o);
    o.device = i;
    st = flame_ctx_create(&o, &s.ctx[i]);
    if (st != FLAME_OK) {
      fprintf(stderr, "train_mlp_dp: context on GPU %d: %s\n", i, flame_last_error_message());
      rc = st == FLAME_ERROR_NO_DRIVER || st == FLAME_ERROR_NO_DEVICE ? EXIT_NO_GPU : 1;
      goto done;
    }
  }
  st = flame_comm_unique_id(s.ctx[0], &s.id);
  if (st != FLAME_OK) {
    fprintf(stderr, "train_mlp_dp: %s\n", flame_last_error_message());
    rc = st == FLAME_ERROR_UNSUPPORTED ? EXIT_NO_GPU : 1;
    goto done;
  }
  printf("data-parallel MLP on %d GPU(s): global batch %d per step (%d per rank, 2 micro-steps)\n", s.world,
         s.batch * s.world, s.batch);
  for (i = 0; i < s.world; ++i) {
    ranks[i].s = &s;
    ranks[i].rank = i;
    if (pthread_create(&threads[i], NULL, rank_main, &ranks[i]) != 0) break;
  }
  made = i;
  for (i = 0; i < made; ++i) pthread_join(threads[i], NULL);
  rc = made == s.world ? 0 : 1;
  for (i = 0; i < made; ++i) rc = ranks[i].ok ? rc : 1;
  if (rc == 0) {
    for (i = 1; i < s.world; ++i)
      if (ranks[i].n_params != ranks[0].n_params ||
          memcmp(ranks[i].params, ranks[0].params, sizeof(float) * ranks[0].n_params) != 0) {
        fprintf(stderr, "train_mlp_dp: rank %d's parameters differ from rank 0's\n", i);
        rc = 1;
      }
    if (rc == 0) printf("all %d ranks hold identical parameters (%zu values)\n", s.world, ranks[0].n_params);
    if (!(ranks[0].last_loss < 0.5 * ranks[0].first_loss)) {
      fprintf(stderr, "train_mlp_dp: the loss fell from %.6f to %.6f only\n", ranks[0].first_loss, ranks[0].last_loss);
      rc = 1;
    }
  }
done:
  for (i = 0; i < MAX_GPUS; ++i) {
    free(ranks[i].params);
    flame_ctx_destroy(s.ctx[i]);
  }
  return rc;
}

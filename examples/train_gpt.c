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
 *          gradient clipping at 1.0. Precision: f32 by default; --autocast keeps f32 parameters and
 *          runs the matrix products and attention in bf16 (flame_ctx_set_autocast, as torch.autocast:
 *          norms, softmax and the loss stay f32); --bf16 keeps bf16 parameters with f32 master
 *          weights in the optimizer (everything in bf16 with f32 accumulation)
 *   output progress every --log steps (loss, validation loss, tokens/s, memory) and a sample of
 *          generated text every --sample steps; --save writes the parameters (safetensors) and the
 *          optimizer state (<path>.opt); --resume continues from such a pair bit for bit
 *
 *   gpus   --gpus N (default 1) trains data-parallel on N GPUs of this machine: one thread and one
 *          context per GPU, an NCCL communicator between them (flame_comm_create with a shared id)
 *          and flame_dp_* for the gradients (averaged over the ranks during backward; flame_dp_wait
 *          before clipping and the optimizer step). --batch is per GPU (N x B sequences a step in
 *          all) and every rank draws its own windows; the learning-rate schedule is unchanged. Rank 0
 *          prints the loss averaged over the ranks (tokens/s counts every GPU), validates, samples
 *          and saves; at the end every rank must hold bit-identical parameters.
 *
 * Exit status: 0 when the training loss of the final step is below
 * --target-loss (default 2.0 nats; a uniform guess over bytes is 5.5), 1 on a FLAME error (the
 * library's message is printed), a missed target or (--gpus N) ranks whose parameters differ, 2
 * without a GPU or driver, or with --gpus N without N GPUs or without NCCL. The validation loss
 * is printed next to it: on a small text it rises again once the model memorises (overfitting).
 *
 *   train_gpt [--text PATH] [--steps N] [--batch B] [--block T] [--dim D] [--heads H] [--layers L]
 *             [--lr LR] [--seed S] [--log K] [--sample K] [--bf16 | --autocast] [--save PATH]
 *             [--resume PATH] [--target-loss X] [--gpus N]
 *
 *   train_gpt --gpus 2          the default model on 2 GPUs (global batch 64)
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime under strict C99 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXAMPLE_NAME "train_gpt" /* example_check.h: the prefix of error messages */
#include "flame.h"
#include "example_check.h" /* DO(): first-failure error chaining */
#include "gpt_model.h"    /* the model, its forward pass, loss and validation, the text batches */
#include "example_args.h" /* the options table: --help, --version, errors naming the option */

#define EXIT_NO_GPU 2
#define PI 3.14159265358979323846
#define MAX_GPUS 8
#define MAX_PARAMS (2 + PARAMS_PER_BLOCK * MAX_LAYERS + 2)

#ifndef FLAME_EXAMPLE_TEXT
#define FLAME_EXAMPLE_TEXT "README.md"
#endif

/* ---------------------------------------------------------------- configuration and data */
typedef struct config {
  const char* text;
  const char* save;
  const char* resume;
  int steps, batch, block, dim, heads, layers, log_every, sample_every, bf16, autocast;
  double lr, target_loss;
  uint64_t seed;
  int gpus;
} config;

/* --gpus N: what the N ranks share (read-only while they train) and what each reports back. */
typedef struct shared {
  config cfg;
  const unsigned char* text;
  long size;
  flame_ctx_t ctx[MAX_GPUS]; /* rank r trains on GPU r */
  flame_comm_id_t id;        /* N > 1: the communicator every rank joins */
} shared;

typedef struct rank_state {
  const shared* sh;
  int rank;
  int status;              /* the exit status this rank reached (rank 0's carries the target check) */
  unsigned char* params;   /* N > 1: the final parameters, copied to the host for the check */
  size_t param_bytes;
} rank_state;

/* Prints `n` bytes sampled (temperature 0.8) after a prompt taken from the text. */
static flame_status_t sample(flame_ctx_t ctx, const model* m, const unsigned char* text, long size, int n, uint64_t* rng) {
  check s;
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
      flame_scope_t step_scope; /* this token's intermediates */
      begin_scope(&s, ctx, &step_scope);
      DO(&s, ti, flame_from_host(ctx, ctxbuf + len - t, sizeof(int64_t) * (size_t)t, shape, 2, FLAME_DTYPE_I64, &ti));
      logits = forward(&s, m, ti, 1, t);
      DO(&s, last, flame_select(logits, 1, t - 1, &last)); /* [1, V] */
      DO(&s, lastf, flame_to_dtype(last, FLAME_DTYPE_F32, &lastf));
      if (s.st == FLAME_OK) {
        flame_status_t e = flame_to_host(lastf, row, sizeof(float) * VOCAB);
        if (e != FLAME_OK) check_fail(&s, e, "flame_to_host");
      }
      end_scope(&s, &step_scope);
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

/* EXAMPLE_ARGS_RUN to train, else the exit status (example_args.h). */
static int parse_args(int argc, char** argv, config* c) {
  const example_arg args[] = {
      {"--text", ARG_STRING, &c->text, "PATH", "text to train on (the last 10% is held out)", 0, 0, NULL},
      {"--steps", ARG_INT, &c->steps, "N", "training steps", 1, 0, NULL},
      {"--batch", ARG_INT, &c->batch, "B", "sequences per step (per GPU with --gpus)", 1, 0, NULL},
      {"--block", ARG_INT, &c->block, "T", "sequence length in bytes", 2, 0, NULL},
      {"--dim", ARG_INT, &c->dim, "D", "model width", 1, 0, NULL},
      {"--heads", ARG_INT, &c->heads, "H", "attention heads (dividing D)", 1, 0, NULL},
      {"--layers", ARG_INT, &c->layers, "L", "transformer blocks", 1, MAX_LAYERS, NULL},
      {"--lr", ARG_POSITIVE_DOUBLE, &c->lr, "LR", "peak learning rate of AdamW", 0, 0, NULL},
      {"--seed", ARG_U64, &c->seed, "S", "seed of the batches, the initial weights and the context's generator", 0, 0, NULL},
      {"--log", ARG_INT, &c->log_every, "K", "print progress and the validation loss every K steps", 1, 0, NULL},
      {"--sample", ARG_INT, &c->sample_every, "K", "print a sample of generated text every K steps", 1, 0, NULL},
      {"--bf16", ARG_FLAG, &c->bf16, NULL, "bf16 parameters, f32 master weights in the optimizer", 0, 0, NULL},
      {"--autocast", ARG_FLAG, &c->autocast, NULL, "f32 parameters, matrix products and attention in bf16", 0, 0, NULL},
      {"--save", ARG_STRING, &c->save, "PATH", "write the parameters (safetensors) and PATH.opt at the end", 0, 0, NULL},
      {"--resume", ARG_STRING, &c->resume, "PATH", "continue from a --save pair", 0, 0, NULL},
      {"--target-loss", ARG_DOUBLE, &c->target_loss, "X", "final training loss (nats) needed for exit status 0", 0, 0, NULL},
      {"--gpus", ARG_INT, &c->gpus, "N", "train data-parallel on N GPUs of this machine", 1, MAX_GPUS, NULL}};
  const example_cli cli = {"train_gpt", "Trains a character-level GPT on a text file and prints samples of generated text.",
                           args, (int)(sizeof args / sizeof args[0]),
                           "Exit status: 0 target loss reached, 1 a FLAME error, a missed target or a bad option, 2 no GPU\n"
                           "(or, with --gpus N, fewer than N GPUs or no NCCL)."};
  int rc = example_parse_args(&cli, argc, argv);
  if (rc == EXAMPLE_ARGS_RUN && c->dim % c->heads)
    rc = example_arg_fail(&cli, "--heads", "expected a divisor of --dim (%d), got %d", c->dim, c->heads);
  if (rc == EXAMPLE_ARGS_RUN && c->bf16 && c->autocast)
    rc = example_arg_fail(&cli, "--autocast", "cannot be combined with --bf16 (choose one precision)");
  return rc;
}

/* Writes the parameters to path and the optimizer state to path.opt. */
static flame_status_t save(flame_ctx_t ctx, model* m, flame_optimizer_t opt, const char* path) {
  flame_params_t params = NULL;
  char cfgval[128], optpath[4096];
  snprintf(cfgval, sizeof cfgval, "{\"dim\": %d, \"heads\": %d, \"layers\": %d, \"block\": %d}", m->dim, m->heads,
           m->layers, m->block_size);
  const char* meta[2] = {"train_gpt.config", cfgval};
  flame_status_t st = model_param_list(ctx, m, &params);
  if (st == FLAME_OK) st = flame_params_save_safetensors(params, path, meta, 1);
  flame_params_release(params);
  snprintf(optpath, sizeof optpath, "%s.opt", path);
  if (st == FLAME_OK) st = flame_optimizer_save_state(opt, optpath);
  return st;
}

/* The loss averaged over the ranks (comm not NULL: every rank calls it at the same step), else
 * this rank's own. Collectives have no backward: a detached view of the loss is reduced in place
 * (backward has run, nothing reads the loss's memory any more). */
static flame_status_t mean_loss(flame_comm_t comm, flame_tensor_t loss, double* out) {
  if (!comm) return flame_tensor_item(loss, out);
  flame_tensor_t d = NULL;
  flame_status_t st = flame_tensor_detach(loss, &d);
  if (st == FLAME_OK) st = flame_comm_all_reduce(comm, d, FLAME_REDUCE_AVG);
  if (st == FLAME_OK) st = flame_comm_synchronize(comm); /* waits with the communicator's timeout */
  if (st == FLAME_OK) st = flame_tensor_item(d, out);
  flame_tensor_release(d);
  return st;
}

/* Copies every parameter's bytes to r->params (malloc'ed), for the comparison between ranks. */
static flame_status_t copy_params(flame_tensor_t* const* slots, int np, rank_state* r) {
  size_t sizes[MAX_PARAMS], total = 0, off = 0;
  for (int i = 0; i < np; ++i) {
    int64_t n = 0;
    flame_dtype_t dt = FLAME_DTYPE_F32;
    flame_status_t st = flame_tensor_numel(*slots[i], &n);
    if (st == FLAME_OK) st = flame_tensor_dtype(*slots[i], &dt);
    if (st != FLAME_OK) return st;
    sizes[i] = (size_t)n * flame_dtype_size(dt);
    total += sizes[i];
  }
  r->params = malloc(total);
  if (!r->params) {
    flame_set_error_message("train_gpt: out of host memory");
    return FLAME_ERROR_OUT_OF_MEMORY;
  }
  r->param_bytes = total;
  for (int i = 0; i < np; ++i) {
    flame_status_t st = flame_to_host(*slots[i], r->params + off, sizes[i]);
    if (st != FLAME_OK) return st;
    off += sizes[i];
  }
  return FLAME_OK;
}

/* Prints the recorded failure (example_check.h's report), naming the rank when there are several. */
static void report_rank(const check* s, int world, int rank) {
  if (world == 1) report(s);
  else fprintf(stderr, "train_gpt rank %d: %s failed: %s: %s\n", rank, s->where ? s->where : "?", flame_status_string(s->st), s->msg);
}

/* One rank: builds the model on its GPU and trains it. With one GPU it runs on the main thread and
 * has no communicator; with N it runs on its own thread, and only rank 0 prints. */
static void* train(void* arg) {
  rank_state* r = arg;
  const config cfg = r->sh->cfg;
  const int world = cfg.gpus, rank = r->rank, lead = rank == 0;
  const unsigned char* text = r->sh->text;
  const long size = r->sh->size, split = size - size / 10;
  flame_ctx_t ctx = r->sh->ctx[rank];
  flame_comm_t comm = NULL;
  flame_dp_t dp = NULL;
  model m;
  flame_optimizer_t opt = NULL;
  flame_params_t resume_params = NULL;
  flame_scope_t step_scope = NULL; /* each training step's intermediates */
  int64_t *idx = NULL, *tgt = NULL;
  flame_tensor_t* slots[MAX_PARAMS];
  char names[MAX_PARAMS][48];
  int decay[MAX_PARAMS];
  int np = 0;
  memset(&m, 0, sizeof m);
  r->status = 1;
  check s;
  memset(&s, 0, sizeof s);
#define CHECK(call)                                                    \
  do {                                                                 \
    flame_status_t e_ = (call);                                        \
    if (e_ != FLAME_OK) {                                              \
      check_fail(&s, e_, #call);                                       \
      report_rank(&s, world, rank);                                    \
      goto cleanup;                                                    \
    }                                                                  \
  } while (0)

  const char* precision = cfg.bf16 ? "bf16" : cfg.autocast ? "f32 parameters, bf16 autocast" : "f32";
  char device[128];
  CHECK(flame_ctx_device_name(ctx, device, sizeof device));
  /* Context-wide: training, validation and sampling all run their products in bf16. */
  if (cfg.autocast) CHECK(flame_ctx_set_autocast(ctx, FLAME_DTYPE_BF16, NULL));
  if (world == 1)
    printf("train_gpt on %s: %s (%ld bytes), GPT %d layers x %d dims x %d heads, block %d, batch %d, %s\n", device,
           cfg.text, size, cfg.layers, cfg.dim, cfg.heads, cfg.block, cfg.batch, precision);
  else if (lead)
    printf("train_gpt on %d GPUs (%s, ...): %s (%ld bytes), GPT %d layers x %d dims x %d heads, block %d, batch %d per "
           "GPU (%d in all), %s\n", world, device, cfg.text, size, cfg.layers, cfg.dim, cfg.heads, cfg.block, cfg.batch,
           cfg.batch * world, precision);
  if (world > 1) { /* every rank joins concurrently; a rank that fails makes the others stop after the timeout */
    flame_comm_options_t co;
    CHECK(flame_comm_options_init(&co));
    co.timeout_ms = 300000; /* longer than rank 0's validation and sampling, and a cold kernel cache */
    CHECK(flame_comm_create(ctx, &r->sh->id, rank, world, &co, &comm));
  }

  m.dim = cfg.dim;
  m.heads = cfg.heads;
  m.layers = cfg.layers;
  m.block_size = cfg.block;
  m.dtype = cfg.bf16 ? FLAME_DTYPE_BF16 : FLAME_DTYPE_F32;
  np = model_params(&m, slots, names, decay);
  if (cfg.resume) { /* the parameters come from the file (all of them, nothing else), the rest of the state from <path>.opt */
    CHECK(model_init(ctx, &m, 0));
    CHECK(model_param_list(ctx, &m, &resume_params));
    CHECK(flame_params_load_safetensors(resume_params, cfg.resume, 0));
  } else {
    CHECK(model_init(ctx, &m, 1));
  }
  flame_tensor_t with_decay[MAX_PARAMS], without[MAX_PARAMS], all[MAX_PARAMS];
  int nw = 0, nn = 0;
  for (int i = 0; i < np; ++i) {
    CHECK(flame_tensor_set_requires_grad(*slots[i], 1));
    all[i] = *slots[i];
    if (decay[i]) with_decay[nw++] = *slots[i];
    else without[nn++] = *slots[i];
  }
  /* N > 1: rank 0's parameters everywhere from here on; backward averages the gradients */
  if (world > 1) CHECK(flame_dp_create(comm, all, np, NULL, &dp));
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
    if (lead) printf("resumed from %s at step %lld\n", cfg.resume, (long long)first_step);
  }

  idx = malloc(sizeof(int64_t) * (size_t)cfg.batch * (size_t)cfg.block);
  tgt = malloc(sizeof(int64_t) * (size_t)cfg.batch * (size_t)cfg.block);
  if (!idx || !tgt) {
    fprintf(stderr, "train_gpt: out of host memory\n");
    goto cleanup;
  }
  /* each rank its own windows of the text (rank 0's are those of a one-GPU run) */
  uint64_t data_rng = 0x243F6A8885A308D3ull ^
                      (cfg.seed + (uint64_t)first_step * 0x9E3779B97F4A7C15ull + (uint64_t)rank * 0xD1B54A32D192ED03ull);
  uint64_t sample_rng = 0x13198A2E03707344ull ^ cfg.seed;
  double val = 0, last_loss = INFINITY;
  if (lead) {
    CHECK(validate(ctx, &m, text, split, size, cfg.batch, cfg.block, idx, tgt, &val));
    printf("step %5lld  validation loss %.4f\n", (long long)first_step, val);
  }

  const int64_t bt[2] = {cfg.batch, cfg.block};
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int since = 0;
  for (int step = (int)first_step; step < cfg.steps; ++step) {
    flame_tensor_t ti, tt, logits, loss, norm;
    make_batch(&data_rng, text, 0, split, cfg.batch, cfg.block, idx, tgt);
    CHECK(flame_optimizer_set_lr(opt, -1, schedule(&cfg, step)));
    begin_scope(&s, ctx, &step_scope);
    DO(&s, ti, flame_from_host(ctx, idx, sizeof(int64_t) * (size_t)(cfg.batch * cfg.block), bt, 2, FLAME_DTYPE_I64, &ti));
    DO(&s, tt, flame_from_host(ctx, tgt, sizeof(int64_t) * (size_t)(cfg.batch * cfg.block), bt, 2, FLAME_DTYPE_I64, &tt));
    logits = forward(&s, &m, ti, cfg.batch, cfg.block);
    loss = loss_of(&s, logits, tt, cfg.batch * cfg.block);
    if (s.st == FLAME_OK) CHECK(flame_backward(ctx, loss, NULL, 0));
    if (s.st == FLAME_OK && dp) CHECK(flame_dp_wait(dp)); /* .grad now holds the average over the ranks */
    DO(&s, norm, flame_clip_grad_norm(ctx, all, np, 1.0, 2.0, 0, &norm));
    if (s.st == FLAME_OK) CHECK(flame_optimizer_step(opt));
    if (s.st == FLAME_OK) CHECK(flame_optimizer_zero_grad(opt, 1));
    if (s.st != FLAME_OK) {
      report_rank(&s, world, rank);
      goto cleanup;
    }
    ++since;
    if ((step + 1) % cfg.log_every == 0 || step + 1 == cfg.steps) {
      double lv = 0, nv = 0;
      flame_memory_stats_t ms;
      ms.struct_size = sizeof ms;
      CHECK(mean_loss(comm, loss, &lv));
      last_loss = lv;
      CHECK(flame_tensor_item(norm, &nv));
      CHECK(flame_ctx_memory_stats(ctx, &ms));
      clock_gettime(CLOCK_MONOTONIC, &t1);
      double sec = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
      if (lead)
        printf("step %5d  loss %.4f  grad-norm %6.3f  %8.0f tokens/s  %.2f ms/step  memory %.1f MiB (peak %.1f)\n",
               step + 1, lv, nv, since * (double)cfg.batch * cfg.block * world / sec, 1e3 * sec / since,
               ms.bytes_in_use / 1048576.0, ms.peak_bytes_in_use / 1048576.0);
      since = 0;
      end_scope(&s, &step_scope); /* before validation and sampling, which open scopes of their own */
      if (lead && ((step + 1) % cfg.sample_every == 0 || step + 1 == cfg.steps)) {
        CHECK(validate(ctx, &m, text, split, size, cfg.batch, cfg.block, idx, tgt, &val));
        printf("step %5d  validation loss %.4f\n", step + 1, val);
        CHECK(sample(ctx, &m, text, split, 120, &sample_rng));
      }
      clock_gettime(CLOCK_MONOTONIC, &t0);
    }
    end_scope(&s, &step_scope);
  }
  if (cfg.save && lead) {
    CHECK(save(ctx, &m, opt, cfg.save));
    printf("saved %s and %s.opt\n", cfg.save, cfg.save);
  }
  if (world > 1) CHECK(copy_params(slots, np, r));
  r->status = last_loss < cfg.target_loss ? 0 : 1;
  if (lead && r->status)
    fprintf(stderr, "train_gpt: training loss %.4f is not below the target %.4f\n", last_loss, cfg.target_loss);
  else if (lead)
    printf("training loss %.4f is below the target %.4f (validation %.4f)\n", last_loss, cfg.target_loss, val);

cleanup:
  flame_scope_end(step_scope); /* NULL when no step was in progress */
  flame_dp_release(dp);
  flame_optimizer_release(opt);
  for (int i = 0; i < np; ++i) flame_tensor_release(*slots[i]);
  flame_params_release(resume_params);
  flame_comm_release(comm); /* every rank releases concurrently, as it joined */
  free(idx);
  free(tgt);
  return NULL;
#undef CHECK
}

int main(int argc, char** argv) {
  config cfg = {FLAME_EXAMPLE_TEXT, NULL, NULL, 1500, 32, 128, 256, 4, 4, 100, 500, 0, 0, 2e-3, 2.0, 1, 1};
  shared sh;
  rank_state ranks[MAX_GPUS];
  pthread_t threads[MAX_GPUS];
  unsigned char* text = NULL;
  int status = 1, started = 0;
  memset(&sh, 0, sizeof sh);
  memset(ranks, 0, sizeof ranks);
  int args_rc = parse_args(argc, argv, &cfg);
  if (args_rc != EXAMPLE_ARGS_RUN) return args_rc;
  const int world = cfg.gpus;

  if (world > 1) {
    int32_t count = 0;
    flame_status_t st = flame_device_count(&count);
    if (st != FLAME_OK || count < world) {
      if (st != FLAME_OK) fprintf(stderr, "train_gpt: no GPU available (%s): %s\n", flame_status_string(st), flame_last_error_message());
      else fprintf(stderr, "train_gpt: --gpus %d, but %d GPU(s) are visible\n", world, (int)count);
      return EXIT_NO_GPU;
    }
  }
  for (int i = 0; i < world; ++i) {
    flame_ctx_options_t o;
    flame_ctx_options_init(&o);
    o.device = i;
    o.seed = cfg.seed;
    flame_status_t st = flame_ctx_create(&o, &sh.ctx[i]);
    if (st == FLAME_ERROR_NO_DRIVER || st == FLAME_ERROR_NO_DEVICE) {
      fprintf(stderr, "train_gpt: no GPU available (%s): %s\n", flame_status_string(st), flame_last_error_message());
      status = EXIT_NO_GPU;
      goto cleanup;
    }
    if (st != FLAME_OK) {
      fprintf(stderr, "train_gpt: flame_ctx_create (GPU %d) failed: %s: %s\n", i, flame_status_string(st),
              flame_last_error_message());
      goto cleanup;
    }
  }

  long size = 0;
  text = read_text(cfg.text, &size);
  if (!text || size < 10L * cfg.block + 100) {
    fprintf(stderr, "train_gpt: cannot read enough text from %s (pass --text PATH; need %ld bytes)\n", cfg.text,
            10L * cfg.block + 100);
    goto cleanup;
  }
  sh.cfg = cfg;
  sh.text = text;
  sh.size = size;
  for (int i = 0; i < world; ++i) {
    ranks[i].sh = &sh;
    ranks[i].rank = i;
  }
  if (world == 1) { /* one GPU: no communicator, no thread */
    train(&ranks[0]);
    status = ranks[0].status;
    goto cleanup;
  }

  flame_status_t st = flame_comm_unique_id(sh.ctx[0], &sh.id);
  if (st != FLAME_OK) {
    fprintf(stderr, "train_gpt: flame_comm_unique_id failed: %s: %s\n", flame_status_string(st), flame_last_error_message());
    status = st == FLAME_ERROR_UNSUPPORTED ? EXIT_NO_GPU : 1; /* UNSUPPORTED: no NCCL */
    goto cleanup;
  }
  for (; started < world; ++started)
    if (pthread_create(&threads[started], NULL, train, &ranks[started]) != 0) break;
  for (int i = 0; i < started; ++i) pthread_join(threads[i], NULL);
  if (started < world) {
    fprintf(stderr, "train_gpt: could not start the thread of rank %d\n", started);
    goto cleanup; /* the started ranks stopped at their communicator's timeout */
  }
  status = ranks[0].status; /* every rank saw the same (mean) loss: rank 0 reported the target check */
  for (int i = 1; i < world; ++i) {
    if (ranks[i].status != 0) status = 1;
    if (!ranks[0].params || !ranks[i].params) continue; /* a rank that stopped on an error printed it */
    if (ranks[i].param_bytes != ranks[0].param_bytes || memcmp(ranks[i].params, ranks[0].params, ranks[0].param_bytes)) {
      fprintf(stderr, "train_gpt: rank %d's parameters differ from rank 0's\n", i);
      status = 1;
    }
  }
  if (status == 0) printf("all %d ranks hold identical parameters (%zu bytes)\n", world, ranks[0].param_bytes);

cleanup:
  for (int i = 0; i < MAX_GPUS; ++i) {
    free(ranks[i].params);
    flame_ctx_destroy(sh.ctx[i]);
  }
  free(text);
  return status;
}

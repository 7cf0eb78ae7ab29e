/*
 * gpt2_main.c - flame_bench_gpt2: the GPT-2 training step of libflame_gpt2_bench.so (bench/gpt2.c)
 * run standalone. bench/run.py's T4 tier runs it in fresh processes (cold and warm kernel cache);
 * the `bench_gpt2_tiny` ctest runs a tiny configuration.
 *
 * Data: synthetic token sequences from a fixed random successor table (token t is followed by
 * succ[t] with probability 3/4, else by a uniform token), so that the loss has something to learn;
 * --same-batch trains on the first batch every step (the loss must then fall).
 *
 * Prints one line per step and a final JSON object (prefix "RESULT ") with: ctx_to_first_step_ms
 * (from just before context creation to the end of the first step, its loss read back), create_ms
 * (context + parameters + optimizer), first_step_ms, median_step_ms over the later steps, tokens per
 * second, the losses, and FLAME's pool memory (in use, reserved, peak in use).
 *
 * --gpus N: data-parallel training on GPUs 0..N-1 instead (gpt2_dp_run: a thread and a model per
 * GPU, flame_dp over NCCL; --batch is per GPU, each rank trains on its own batch every step); after
 * --warmup steps (default 3) times --steps steps and prints "RESULT {"gpus": N, "ms_per_step": ...,
 * "tokens_per_s": ... (all GPUs), "first_loss", "last_loss" (averaged over the ranks),
 * "params_identical": 1}". --gpus 1 is the plain step timed the same way (the scaling baseline):
 *   flame_bench_gpt2 --gpus 1 --steps 30 && flame_bench_gpt2 --gpus 2 --steps 30
 *
 * Exit status: 0 success (with --check-falls: every loss finite and the last below the first; with
 * --gpus also identical parameters on every rank), 1 a FLAME error (message printed) or a failed
 * check, 2 no GPU or driver (with --gpus N: fewer than N GPUs, or no NCCL).
 *
 *   flame_bench_gpt2 [--steps N] [--layers L] [--heads H] [--dim D] [--vocab V] [--block N]
 *                    [--batch B] [--seq T] [--lr X] [--seed S] [--f32] [--weights FILE.safetensors]
 *                    [--cache-dir DIR] [--heuristic-gemm] [--same-batch] [--check-falls] [--save FILE]
 *                    [--gpus N [--warmup W]]
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flame.h"
#include "gpt2.h"
#include "bench_util.h"

#define EXIT_NO_GPU 2
#define MAX_STEPS 100000

/* One batch of B sequences of T + 1 tokens: tokens = [:, :T], targets = [:, 1:]. */
static void make_batch(uint64_t* rng, const int64_t* succ, int64_t V, int64_t B, int64_t T, int64_t* tok, int64_t* tgt) {
  for (int64_t b = 0; b < B; ++b) {
    int64_t cur = (int64_t)(rng_next(rng) % (uint64_t)V);
    for (int64_t t = 0; t <= T; ++t) {
      if (t < T) tok[b * T + t] = cur;
      if (t > 0) tgt[b * T + t - 1] = cur;
      cur = (rng_next(rng) % 4 != 0) ? succ[cur] : (int64_t)(rng_next(rng) % (uint64_t)V);
    }
  }
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static int usage(void) {
  fprintf(stderr,
          "usage: flame_bench_gpt2 [--steps N] [--layers L] [--heads H] [--dim D] [--vocab V] [--block N]\n"
          "                        [--batch B] [--seq T] [--lr X] [--seed S] [--f32] [--weights FILE]\n"
          "                        [--cache-dir DIR] [--heuristic-gemm] [--same-batch] [--check-falls] [--save FILE]\n"
          "                        [--gpus N [--warmup W]]\n");
  return 1;
}

/* --gpus N: data-parallel training through gpt2_dp_run (its RESULT line differs from the one-GPU one). */
static int run_dp(const gpt2_config* cfg, int gpus, int warmup, int steps, const char* cache_dir, int check_falls) {
  gpt2_dp_result r;
  int32_t st = gpt2_dp_run(cfg, gpus, warmup, steps, cache_dir, &r);
  if (st != FLAME_OK) {
    fprintf(stderr, "flame_bench_gpt2: gpt2_dp_run on %d GPU(s) failed: %s\n", gpus, gpt2_last_error());
    return st == FLAME_ERROR_NO_DRIVER || st == FLAME_ERROR_NO_DEVICE || st == FLAME_ERROR_UNSUPPORTED ? EXIT_NO_GPU : 1;
  }
  printf("%d GPU(s), B%lld T%lld per GPU: %.3f ms/step, %.0f tokens/s, loss %.6f -> %.6f, parameters %s\n", gpus,
         (long long)cfg->batch, (long long)cfg->seq, r.ms_per_step, r.tokens_per_s, r.first_loss, r.last_loss,
         r.params_identical ? "identical on every rank" : "DIFFER between ranks");
  printf("RESULT {\"gpus\": %d, \"batch_per_gpu\": %lld, \"seq\": %lld, \"warmup\": %d, \"steps\": %d, "
         "\"ms_per_step\": %.4f, \"tokens_per_s\": %.1f, \"first_loss\": %.6f, \"last_loss\": %.6f, "
         "\"params_identical\": %lld}\n",
         gpus, (long long)cfg->batch, (long long)cfg->seq, warmup, steps, r.ms_per_step, r.tokens_per_s,
         isfinite(r.first_loss) ? r.first_loss : -1.0, isfinite(r.last_loss) ? r.last_loss : -1.0,
         (long long)r.params_identical);
  if (!r.params_identical) {
    fprintf(stderr, "flame_bench_gpt2: the ranks' parameters differ after training\n");
    return 1;
  }
  if (check_falls && !(isfinite(r.first_loss) && isfinite(r.last_loss) && r.last_loss < r.first_loss)) {
    fprintf(stderr, "flame_bench_gpt2: the loss did not fall (first %.6f, last %.6f)\n", r.first_loss, r.last_loss);
    return 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  gpt2_config cfg;
  gpt2_config_default(&cfg);
  int steps = 10, same_batch = 0, check_falls = 0, gpus = 0, warmup = 3;
  const char *weights = NULL, *cache_dir = NULL, *save = NULL;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
#define INT_ARG(flag, field)             \
  if (strcmp(a, flag) == 0 && v) {       \
    field = strtoll(v, NULL, 10);        \
    ++i;                                 \
    continue;                            \
  }
    INT_ARG("--steps", steps)
    INT_ARG("--layers", cfg.layers)
    INT_ARG("--heads", cfg.heads)
    INT_ARG("--dim", cfg.dim)
    INT_ARG("--vocab", cfg.vocab)
    INT_ARG("--block", cfg.block)
    INT_ARG("--batch", cfg.batch)
    INT_ARG("--seq", cfg.seq)
    INT_ARG("--seed", cfg.seed)
    INT_ARG("--gpus", gpus)
    INT_ARG("--warmup", warmup)
#undef INT_ARG
    if (strcmp(a, "--lr") == 0 && v) { cfg.lr = strtod(v, NULL); ++i; continue; }
    if (strcmp(a, "--weights") == 0 && v) { weights = v; ++i; continue; }
    if (strcmp(a, "--cache-dir") == 0 && v) { cache_dir = v; ++i; continue; }
    if (strcmp(a, "--save") == 0 && v) { save = v; ++i; continue; }
    if (strcmp(a, "--f32") == 0) { cfg.bf16 = 0; continue; }
    if (strcmp(a, "--heuristic-gemm") == 0) { cfg.gemm_heuristic_only = 1; continue; }
    if (strcmp(a, "--same-batch") == 0) { same_batch = 1; continue; }
    if (strcmp(a, "--check-falls") == 0) { check_falls = 1; continue; }
    fprintf(stderr, "flame_bench_gpt2: unknown or incomplete argument %s\n", a);
    return usage();
  }
  if (steps < 1 || steps > MAX_STEPS) {
    fprintf(stderr, "flame_bench_gpt2: --steps must be in [1, %d]\n", MAX_STEPS);
    return 1;
  }
  if (cfg.vocab < 2 || cfg.batch < 1 || cfg.seq < 1) return usage(); /* gpt2_create checks the rest */
  if (gpus != 0) {
    if (gpus < 1 || warmup < 1 || weights || save || same_batch) {
      fprintf(stderr, "flame_bench_gpt2: --gpus N needs N >= 1 and --warmup >= 1, and trains on one batch per rank "
                      "from generated weights (no --weights, --save or --same-batch)\n");
      return 1;
    }
    return run_dp(&cfg, gpus, warmup, steps, cache_dir, check_falls);
  }

  const size_t n = (size_t)(cfg.batch * cfg.seq);
  int64_t* tok = malloc(n * sizeof *tok);
  int64_t* tgt = malloc(n * sizeof *tgt);
  int64_t* succ = malloc((size_t)cfg.vocab * sizeof *succ);
  double* loss = malloc((size_t)steps * sizeof *loss);
  double* ms = malloc((size_t)steps * sizeof *ms);
  if (!tok || !tgt || !succ || !loss || !ms) {
    fprintf(stderr, "flame_bench_gpt2: out of host memory\n");
    return 1;
  }
  uint64_t rng = 0x9E3779B97F4A7C15ull ^ (uint64_t)cfg.seed;
  for (int64_t t = 0; t < cfg.vocab; ++t) succ[t] = (int64_t)(rng_next(&rng) % (uint64_t)cfg.vocab);

  int status = 1;
  gpt2_t g = NULL;
  double t0 = now_ms();
  int32_t st = gpt2_create(&cfg, weights, cache_dir, &g);
  double t_created = now_ms();
  if (st == FLAME_ERROR_NO_DRIVER || st == FLAME_ERROR_NO_DEVICE) {
    fprintf(stderr, "flame_bench_gpt2: no GPU available: %s\n", gpt2_last_error());
    status = EXIT_NO_GPU;
    goto cleanup;
  }
  if (st != FLAME_OK) {
    fprintf(stderr, "flame_bench_gpt2: gpt2_create failed: %s\n", gpt2_last_error());
    goto cleanup;
  }
  double first_end = 0;
  for (int s = 0; s < steps; ++s) {
    if (s == 0 || !same_batch) {
      make_batch(&rng, succ, cfg.vocab, cfg.batch, cfg.seq, tok, tgt);
      if ((st = gpt2_set_batch(g, tok, tgt)) != FLAME_OK) {
        fprintf(stderr, "flame_bench_gpt2: step %d: %s\n", s, gpt2_last_error());
        goto cleanup;
      }
    }
    float l = 0;
    double a = now_ms();
    if ((st = gpt2_step(g, &l)) != FLAME_OK) { /* reads the loss back: the step has finished */
      fprintf(stderr, "flame_bench_gpt2: step %d: %s\n", s, gpt2_last_error());
      goto cleanup;
    }
    double b = now_ms();
    if (s == 0) first_end = b;
    loss[s] = l;
    ms[s] = b - a;
    printf("step %4d  loss %.6f  %9.3f ms\n", s, (double)l, ms[s]);
    fflush(stdout);
  }
  uint64_t mem[4] = {0, 0, 0, 0};
  if (gpt2_memory(g, mem) != FLAME_OK) {
    fprintf(stderr, "flame_bench_gpt2: %s\n", gpt2_last_error());
    goto cleanup;
  }
  if (save && gpt2_save(g, save) != FLAME_OK) {
    fprintf(stderr, "flame_bench_gpt2: %s\n", gpt2_last_error());
    goto cleanup;
  }
  double med = 0;
  if (steps > 1) {
    double* sorted = malloc((size_t)(steps - 1) * sizeof *sorted);
    if (!sorted) goto cleanup;
    memcpy(sorted, ms + 1, (size_t)(steps - 1) * sizeof *sorted);
    qsort(sorted, (size_t)(steps - 1), sizeof *sorted, cmp_double);
    med = (steps - 1) % 2 ? sorted[(steps - 1) / 2] : 0.5 * (sorted[(steps - 1) / 2 - 1] + sorted[(steps - 1) / 2]);
    free(sorted);
  }
  printf("RESULT {\"ctx_to_first_step_ms\": %.3f, \"create_ms\": %.3f, \"first_step_ms\": %.3f, \"median_step_ms\": %.4f, "
         "\"tokens_per_s\": %.1f, \"steps\": %d, \"bytes_in_use\": %llu, \"bytes_reserved\": %llu, \"peak_bytes_in_use\": %llu, "
         "\"losses\": [",
         first_end - t0, t_created - t0, ms[0], med, med > 0 ? (double)n / (med * 1e-3) : 0.0, steps,
         (unsigned long long)mem[0], (unsigned long long)mem[1], (unsigned long long)mem[2]);
  int finite = 1;
  for (int s = 0; s < steps; ++s) {
    printf("%s%.6f", s ? ", " : "", isfinite(loss[s]) ? loss[s] : -1.0);
    finite = finite && isfinite(loss[s]);
  }
  printf("]}\n");
  status = 0;
  if (check_falls) {
    if (!finite) {
      fprintf(stderr, "flame_bench_gpt2: a loss is not finite\n");
      status = 1;
    } else if (!(loss[steps - 1] < loss[0])) {
      fprintf(stderr, "flame_bench_gpt2: the loss did not fall (first %.6f, last %.6f)\n", loss[0], loss[steps - 1]);
      status = 1;
    }
  }

cleanup:
  gpt2_destroy(g);
  free(tok);
  free(tgt);
  free(succ);
  free(loss);
  free(ms);
  return status;
}

/*
 * gpt2.h - the entry points of libflame_gpt2_bench.so: a GPT-2 training step written against the
 * public FLAME API only (bench/gpt2.c), for bench/run.py (ctypes, in the same process as PyTorch)
 * and for the standalone program bench/gpt2_main.c.
 *
 * Every function returns a flame_status_t value (0 = FLAME_OK). On failure gpt2_last_error() gives
 * "<what failed>: <FLAME status>: <flame_last_error_message()>" for the calling thread.
 * Handles are not shared between threads.
 */
#ifndef FLAME_GPT2_BENCH_H
#define FLAME_GPT2_BENCH_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define GPT2_API __attribute__((visibility("default")))
#else
#define GPT2_API
#endif

/* Model and training configuration. Every field is 8 bytes wide so that the ctypes mirror in
 * bench/run.py has no padding to get wrong. gpt2_config_default fills GPT-2 124M, B8 T1024. */
typedef struct gpt2_config {
  int64_t vocab;         /* 50304 (GPT-2's 50257 padded to a multiple of 128) */
  int64_t block;         /* context length = rows of the position table: 1024 */
  int64_t layers;        /* 12 */
  int64_t heads;         /* 12 */
  int64_t dim;           /* 768 (divisible by heads) */
  int64_t batch;         /* B: 8 */
  int64_t seq;           /* T <= block: 1024 */
  double lr;             /* AdamW: 6e-4 */
  double weight_decay;   /* 0.1, on 2-D weights only (embeddings and matrices) */
  double beta1, beta2;   /* 0.9, 0.95 */
  double eps;            /* 1e-8 */
  int64_t seed;          /* context generator seed (initial weights when no file is given) */
  int64_t bf16;          /* 1: bf16 autocast over forward and loss, f32 parameters (default);
                            0: everything in f32 */
  int64_t gemm_heuristic_only; /* flame_ctx_options_t.gemm_heuristic_only: 0 (default) or 1 */
} gpt2_config;

typedef struct gpt2_model_s* gpt2_t;

/* Fills cfg with the defaults above. */
GPT2_API void gpt2_config_default(gpt2_config* cfg);

/* Creates a FLAME context (kernel_cache_dir as flame_ctx_options_t.kernel_cache_dir: NULL means
 * $FLAME_KERNEL_CACHE_DIR or the default location, "" no disk cache), the model and its AdamW
 * optimizer. weights: a safetensors file with every parameter under the names of
 * bench/gpt2_torch.py (f32; see gpt2_param_name), or NULL to draw GPT-2's initialisation from the
 * context's generator. OUT *out: release with gpt2_destroy. FLAME's errors are passed through;
 * FLAME_ERROR_NO_DRIVER / FLAME_ERROR_NO_DEVICE mean no GPU. */
GPT2_API int32_t gpt2_create(const gpt2_config* cfg, const char* weights, const char* kernel_cache_dir, gpt2_t* out);
/* Frees the model, optimizer and context. NULL is a no-op. */
GPT2_API void gpt2_destroy(gpt2_t g);

/* Copies one batch of token ids and next-token targets (batch * seq int64 each, row-major [B, T],
 * values in [0, vocab)) to the device; later steps train on it until the next call. */
GPT2_API int32_t gpt2_set_batch(gpt2_t g, const int64_t* tokens, const int64_t* targets);
/* One training step on the current batch: forward (autocast), cross-entropy, backward, AdamW step,
 * zero_grad (set to none). loss NULL: returns as soon as the work is queued (no synchronisation);
 * otherwise waits and writes the step's mean loss. */
GPT2_API int32_t gpt2_step(gpt2_t g, float* loss);
/* OUT *loss: the loss of the last step (waits for it). No step yet: FLAME_ERROR_INVALID_ARGUMENT. */
GPT2_API int32_t gpt2_last_loss(gpt2_t g, float* loss);
/* Waits for all queued work. */
GPT2_API int32_t gpt2_sync(gpt2_t g);
/* OUT *stream: the context's CUstream (for CUDA events around steps). */
GPT2_API int32_t gpt2_stream(gpt2_t g, void** stream);
/* Pool statistics of the context: out[0] bytes in use, out[1] bytes reserved, out[2] peak bytes in
 * use since creation or gpt2_reset_peak, out[3] live tensors. */
GPT2_API int32_t gpt2_memory(gpt2_t g, uint64_t out[4]);
GPT2_API int32_t gpt2_reset_peak(gpt2_t g);
/* OUT *count: number of parameter tensors; *elements: number of parameter elements. */
GPT2_API int32_t gpt2_num_params(gpt2_t g, int64_t* count, int64_t* elements);
/* Writes the parameters (f32) to a safetensors file under their names. */
GPT2_API int32_t gpt2_save(gpt2_t g, const char* path);
/* ---- data parallelism: GPT-2 on several GPUs of this process ---- */
/* Every field 8 bytes wide (the ctypes mirror in bench/gpt2_tiers.py). */
typedef struct gpt2_dp_result {
  double ms_per_step;       /* wall clock per timed step, from a synchronisation after the warm-up to
                               one after the last step; the slowest rank's */
  double tokens_per_s;      /* world * batch * seq / ms_per_step */
  double first_loss;        /* the first step's loss, averaged over the ranks */
  double last_loss;         /* the last step's loss, averaged over the ranks */
  int64_t params_identical; /* 1: every rank ended with bit-identical parameters (always 1 for world 1) */
} gpt2_dp_result;

/* Trains cfg's model on GPUs 0..world-1 (world in [1, 16]): one model and context per GPU, one
 * thread per rank, each rank on its own batch of cfg->batch sequences (synthetic, as gpt2_main.c's,
 * drawn per rank; every step trains on it again). world > 1: an NCCL communicator over the contexts
 * (flame_comm_create_group, a 5-minute timeout) and flame_dp over the parameters (default bucket
 * size; it broadcasts rank 0's initial weights), the gradients averaged before each AdamW step.
 * world 1: the plain step of gpt2_step. Runs `warmup` steps (the first compiles the kernels), then
 * times `steps` steps. OUT *out (zeroed first). Errors: FLAME_ERROR_NO_DEVICE with fewer than world
 * GPUs, FLAME_ERROR_UNSUPPORTED without NCCL, else FLAME's (gpt2_last_error names the rank). */
GPT2_API int32_t gpt2_dp_run(const gpt2_config* cfg, int64_t world, int64_t warmup, int64_t steps,
                             const char* kernel_cache_dir, gpt2_dp_result* out);

/* Captures one training step on the current batch (gpt2_step: forward, backward, AdamW, zero_grad)
 * into a CUDA graph (flame_graph_capture_begin/end); gpt2_graph_replay then runs that step again,
 * with no host work per kernel. Run gpt2_step at least once first (the optimizer creates its state
 * in an eager step), and keep the batch (its device memory is what the graph reads). After a replay,
 * gpt2_last_loss reads that step's loss. A new capture replaces the previous graph. */
GPT2_API int32_t gpt2_graph_capture(gpt2_t g);
GPT2_API int32_t gpt2_graph_replay(gpt2_t g);

/* The calling thread's message for the last failure of a gpt2_* call ("" if none); static storage. */
GPT2_API const char* gpt2_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* FLAME_GPT2_BENCH_H */

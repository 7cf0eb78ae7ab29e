/* flame_bench_model_step: a model's load rate and its forward + backward time and peak memory, through
 * the public C ABI only (bench/models_full.py and bench/lora_full.py run it beside the same diffusers
 * model in PyTorch).
 *
 *   flame_bench_model_step (--load PATH | --arch CLASS --config JSON) --inputs IN.safetensors
 *                          --grads G.safetensors [--options JSON] [--checkpoint N] [--warmup 2]
 *                          [--steps 5] [--out OUT.safetensors] [--lora JSON [--lr 1e-4] [--graph 1]
 *                          [--optimizer-in-backward | --clip-grad-norm MAX] [--state-bits 8]] [--busy N]
 *
 * --arch / --config make the model with flame_model_create (random init; no load rate) instead.
 * --lora adds an adapter with flame_model_add_lora(JSON) (freezing the base) and an AdamW optimizer
 * over its tensors; a step then also runs the optimizer and drops the adapter's gradients (the LoRA
 * training step). --graph 1 captures one such step after the warm-up as a CUDA graph
 * (flame_graph_capture_*) and times its replays. --clip-grad-norm MAX clips the adapter's gradients
 * to a global 2-norm of MAX (flame_clip_grad_norm) before the optimizer's step.
 * --optimizer-in-backward (with --lora) replaces the one AdamW by one AdamW per adapter tensor (same
 * options), each stepped from its tensor's post-accumulate-grad hook during backward, which then
 * drops that gradient (optimizer_in_backward.h: why this is sound, with checkpointing and graphs);
 * the step after backward then has nothing left to do. Not with --clip-grad-norm (a global norm
 * needs every gradient before any update) nor --zero.
 * --state-bits 8 (with --lora, not with --optimizer-in-backward) keeps the AdamW moments in 8 bits
 * (flame_optimizer_set_state_bits; "state_bits" and "optimizer_state_bytes" in the result).
 * Loads PATH with flame_model_load (timed until the device is idle: the load rate is the file's size
 * over that time), then runs warm-up and timed steps of: forward on every tensor of IN, loss =
 * sum over the outputs o named in G of sum(o * G[o]), backward into every parameter that requires grad,
 * the gradients dropped (PyTorch's zero_grad(set_to_none=True)). The peak is the context's
 * peak_bytes_in_use over the timed steps (weights included). --out writes the first step's outputs
 * as "out.<name>" for a closeness check. Prints one line "RESULT {json}"; exit 1 on any error (the
 * library's message on stderr), 2 when there is no GPU. A failed graph capture is reported in the
 * JSON ("graph_error") and the eager step is timed instead. The RESULT also has the work each timed
 * step issued (flame_ctx_counters, read before the step's closing flame_ctx_synchronize so that the
 * benchmark's own wait is left out): launches, cast kernels, host syncs and driver allocations per
 * step (a replayed graph is one launch), and the wall time from the process's start (main) to the end of
 * the first warm-up step, the model loaded or made (start_to_first_step_ms; 0 without a warm-up).
 * --zero STAGE (1, 2 or 3) is a full fine-tune on one rank of a launcher's job (flame-run or torchrun:
 * RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; the context on device LOCAL_RANK): AdamW with
 * f32 master weights over every parameter that requires grad, sharded with flame_zero_create at that
 * stage (3: the model's block parameters too, after one forward without gradients so that the model
 * knows its blocks), each step ending in flame_zero_step; each rank prints its own RESULT
 * (optimizer_state_bytes: this rank's share of the optimizer state).
 * --busy N adds the GPU busy fraction, measured over N more steps after the timed ones (the same step:
 * eager, or the graph replayed) with CUPTI's activity trace on (cupti_busy.h): the union of the device
 * intervals of every kernel, memcpy and memset over the wall-clock time from the host's start of the
 * first of those steps to the end, device synchronised, of the last. CUPTI attaches only for these
 * steps (after one untimed step, so that its start-up stays out), so the timed steps above carry none of
 * its overhead; its own cost per launch is in busy_wall_ms_per_step (compare step_ms_median). RESULT then
 * also has busy_steps, busy_fraction, busy_device_ms_per_step (the union), busy_wall_ms_per_step,
 * busy_records_per_step (kernels + memcpys + memsets the device ran: a graph's nodes one by one) and
 * busy_error ("" or CUPTI's reason for no fraction: busy_fraction is then -1, the timing fields stay
 * valid). A build without CUPTI refuses --busy at once ("built without CUPTI", exit 1). */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include "bench_util.h"
#include "cupti_busy.h"
#include "flame.h"
#include "optimizer_in_backward.h"

#define MAX_TENSORS 64

typedef struct {
  const char* load;
  const char* arch;
  const char* config;
  const char* lora;
  const char* options;
  const char* inputs;
  const char* grads;
  const char* out;
  long checkpoint, warmup, steps, graph, zero, busy;
  long state_bits; /* the LoRA optimizer's moments: 32 (f32) or 8 (flame_optimizer_set_state_bits) */
  double lr, clip_grad_norm; /* clip_grad_norm 0: no clipping */
  int optimizer_in_backward;
} Args;

typedef struct {
  int64_t n;
  const char* names[MAX_TENSORS];
  flame_tensor_t tensors[MAX_TENSORS];
  flame_safetensors_t file;
} TensorFile;

static int check(flame_status_t s, const char* what) {
  if (s == FLAME_OK) return 0;
  fprintf(stderr, "flame_bench_model_step: %s failed: %s: %s\n", what, flame_status_string(s), flame_last_error_message());
  exit(s == FLAME_ERROR_NO_DEVICE || s == FLAME_ERROR_NO_DRIVER ? 2 : 1);
}

static void usage(void) {
  fprintf(stderr, "usage: flame_bench_model_step (--load PATH | --arch CLASS --config JSON) --inputs IN.safetensors "
                  "--grads G.safetensors [--options JSON] [--checkpoint N] [--warmup N] [--steps N] [--out OUT.safetensors] "
                  "[--lora JSON [--lr LR] [--graph 1] [--optimizer-in-backward | --clip-grad-norm MAX] [--state-bits 8] | --zero STAGE [--lr LR]] "
                  "[--busy N]\n");
  exit(1);
}

static Args parse(int argc, char** argv) {
  Args a = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 2, 5, 0, 0, 0, 32, 1e-4, 0, 0};
  for (int i = 1; i < argc; i += 2) {
    const char* k = argv[i];
    if (!strcmp(k, "--optimizer-in-backward")) {  /* the one option without a value */
      a.optimizer_in_backward = 1;
      --i;
      continue;
    }
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) usage();
    if (!strcmp(k, "--load")) a.load = v;
    else if (!strcmp(k, "--arch")) a.arch = v;
    else if (!strcmp(k, "--config")) a.config = v;
    else if (!strcmp(k, "--lora")) a.lora = v;
    else if (!strcmp(k, "--lr")) a.lr = strtod(v, NULL);
    else if (!strcmp(k, "--graph")) a.graph = strtol(v, NULL, 10);
    else if (!strcmp(k, "--zero")) a.zero = strtol(v, NULL, 10);
    else if (!strcmp(k, "--clip-grad-norm")) a.clip_grad_norm = strtod(v, NULL);
    else if (!strcmp(k, "--options")) a.options = v;
    else if (!strcmp(k, "--inputs")) a.inputs = v;
    else if (!strcmp(k, "--grads")) a.grads = v;
    else if (!strcmp(k, "--out")) a.out = v;
    else if (!strcmp(k, "--checkpoint")) a.checkpoint = strtol(v, NULL, 10);
    else if (!strcmp(k, "--warmup")) a.warmup = strtol(v, NULL, 10);
    else if (!strcmp(k, "--steps")) a.steps = strtol(v, NULL, 10);
    else if (!strcmp(k, "--busy")) a.busy = strtol(v, NULL, 10);
    else if (!strcmp(k, "--state-bits")) a.state_bits = strtol(v, NULL, 10);
    else usage();
  }
  if ((!a.load == !a.arch) || !a.inputs || !a.grads || a.steps < 1 || a.warmup < 0 || a.busy < 0) usage();
  if (a.state_bits != 32 && (!a.lora || a.optimizer_in_backward)) {
    fprintf(stderr, "flame_bench_model_step: --state-bits sets the one LoRA optimizer's moments: it needs --lora "
                    "without --optimizer-in-backward\n");
    exit(1);
  }
  if (a.graph && (!a.lora || a.warmup < 1)) usage();  /* a captured step needs the optimizer's state made */
  if (a.zero && (a.lora || a.graph || a.zero < 1 || a.zero > 3)) usage();
  if (a.clip_grad_norm < 0 || (a.clip_grad_norm > 0 && !a.lora)) usage();
  if (a.optimizer_in_backward && !a.lora) {
    fprintf(stderr, "flame_bench_model_step: --optimizer-in-backward steps the adapter's optimizers: it needs --lora\n");
    exit(1);
  }
  if (a.optimizer_in_backward && a.clip_grad_norm > 0) {
    fprintf(stderr, "flame_bench_model_step: --clip-grad-norm cannot be combined with --optimizer-in-backward: clipping "
                    "to a global norm needs every gradient before any update, while each adapter tensor is updated "
                    "(and its gradient dropped) as soon as backward completes it\n");
    exit(1);
  }
  return a;
}

/* Every tensor of a safetensors file (names borrowed from the open file). */
static TensorFile read_tensors(flame_ctx_t ctx, const char* path) {
  TensorFile f;
  memset(&f, 0, sizeof f);
  check(flame_safetensors_load(ctx, path, &f.file), path);
  check(flame_safetensors_count(f.file, &f.n), "flame_safetensors_count");
  if (f.n > MAX_TENSORS) {
    fprintf(stderr, "flame_bench_model_step: %s holds more than %d tensors\n", path, MAX_TENSORS);
    exit(1);
  }
  for (int64_t i = 0; i < f.n; ++i) {
    check(flame_safetensors_name(f.file, i, &f.names[i]), "flame_safetensors_name");
    check(flame_safetensors_get(f.file, f.names[i], &f.tensors[i]), "flame_safetensors_get");
  }
  return f;
}

static void release_tensors(TensorFile* f) {
  for (int64_t i = 0; i < f->n; ++i) flame_tensor_release(f->tensors[i]);
  flame_safetensors_release(f->file);
}

/* The size of the file at path, or of the *.safetensors files directly inside a folder (0 if unknown). */
static double checkpoint_bytes(const char* path) {
  struct stat st;
  if (stat(path, &st) != 0) return 0;
  if (S_ISREG(st.st_mode)) return (double)st.st_size;
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "du -cb '%s'/*.safetensors 2>/dev/null | tail -1", path);
  FILE* p = popen(cmd, "r");
  double total = 0;
  if (p) {
    if (fscanf(p, "%lf", &total) != 1) total = 0;
    pclose(p);
  }
  return total;
}

/* What a step does after backward: the optimizer (one, ZeRO-sharded, or inside backward), the
 * adapter's tensors (borrowed from the adapter list) for clipping. All NULL / 0: no update. */
typedef struct {
  flame_optimizer_t opt;
  flame_zero_t zero;
  OptimizerInBackward* oib;
  const flame_tensor_t* adapter;
  int64_t n_adapter;
  double clip_grad_norm;
} Update;

/* After backward (flame_backward returned st): the update of the normal path, or, with the optimizer
 * in backward, nothing but readying its hooks (they stepped and dropped every adapter gradient). */
static flame_status_t after_backward(flame_ctx_t ctx, const Update* u, flame_status_t st) {
  if (u->oib) {
    oib_end_backward(u->oib, NULL);  /* whatever backward returned */
    return st;
  }
  if (st != FLAME_OK) return st;
  if (u->zero) {
    st = flame_zero_step(u->zero, NULL);
    return st == FLAME_OK ? flame_optimizer_zero_grad(u->opt, 1) : st;
  }
  if (!u->opt) return FLAME_OK;
  if (u->clip_grad_norm > 0) st = flame_clip_grad_norm(ctx, u->adapter, u->n_adapter, u->clip_grad_norm, 2.0, 0, NULL);
  if (st == FLAME_OK) st = flame_optimizer_step(u->opt);
  return st == FLAME_OK ? flame_optimizer_zero_grad(u->opt, 1) : st;
}

/* One step: forward, the loss, backward, then the update when there is one, gradients dropped. With
 * out_path, the outputs are saved. */
static void step(flame_ctx_t ctx, flame_model_t model, flame_params_t inputs, const TensorFile* grads,
                 flame_params_t params, const Update* u, const char* out_path) {
  flame_params_t outputs = NULL;
  check(flame_model_forward(model, inputs, &outputs), "flame_model_forward");
  flame_tensor_t loss = NULL;
  const char* out_names[MAX_TENSORS];
  char name_buf[MAX_TENSORS][256];
  flame_tensor_t out_tensors[MAX_TENSORS];
  for (int64_t i = 0; i < grads->n; ++i) {
    flame_tensor_t y = NULL, prod = NULL, s = NULL;
    check(flame_params_find(outputs, grads->names[i], &y), "flame_params_find");
    if (!y) {
      fprintf(stderr, "flame_bench_model_step: the model has no output %s\n", grads->names[i]);
      exit(1);
    }
    snprintf(name_buf[i], sizeof name_buf[i], "out.%s", grads->names[i]);
    out_names[i] = name_buf[i];
    out_tensors[i] = y;
    check(flame_mul(y, grads->tensors[i], &prod), "flame_mul");
    check(flame_sum_all(prod, &s), "flame_sum_all");
    flame_tensor_release(prod);
    if (loss) {
      flame_tensor_t next = NULL;
      check(flame_add(loss, s, &next), "flame_add");
      flame_tensor_release(loss);
      flame_tensor_release(s);
      loss = next;
    } else {
      loss = s;
    }
  }
  if (out_path)
    check(flame_safetensors_save(ctx, out_path, out_names, out_tensors, grads->n, NULL, 0), "flame_safetensors_save");
  flame_status_t st = flame_backward(ctx, loss, NULL, 0);
  flame_tensor_release(loss);
  flame_params_release(outputs);
  check(after_backward(ctx, u, st), u->oib ? "flame_backward (optimizer in backward)" : "flame_backward and the update");
  if (u->opt || u->oib) return;
  int64_t n = 0;
  check(flame_params_count(params, &n), "flame_params_count");
  for (int64_t i = 0; i < n; ++i) {
    flame_tensor_t p = NULL;
    check(flame_params_tensor(params, i, &p), "flame_params_tensor");
    check(flame_tensor_set_grad(p, NULL), "flame_tensor_set_grad");
  }
}

/* The step recorded into a graph: the same calls, but a failing call ends the capture instead of the
 * program (capture_end then reports it). */
static void step_captured(flame_ctx_t ctx, flame_model_t model, flame_params_t inputs, const TensorFile* grads,
                          const Update* u) {
  flame_params_t outputs = NULL;
  if (flame_model_forward(model, inputs, &outputs) != FLAME_OK) return;
  flame_tensor_t loss = NULL;
  for (int64_t i = 0; i < grads->n; ++i) {
    flame_tensor_t y = NULL, prod = NULL, s = NULL, next = NULL;
    if (flame_params_find(outputs, grads->names[i], &y) != FLAME_OK || !y) break;
    if (flame_mul(y, grads->tensors[i], &prod) != FLAME_OK) break;
    flame_status_t st = flame_sum_all(prod, &s);
    flame_tensor_release(prod);
    if (st != FLAME_OK) break;
    if (!loss) {
      loss = s;
      continue;
    }
    st = flame_add(loss, s, &next);
    flame_tensor_release(loss);
    flame_tensor_release(s);
    loss = next;
    if (st != FLAME_OK) break;
  }
  if (loss) after_backward(ctx, u, flame_backward(ctx, loss, NULL, 0));
  flame_tensor_release(loss);
  flame_params_release(outputs);
}

static int compare_doubles(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

/* --zero: AdamW (f32 master weights of the bf16 parameters) over every parameter that requires grad,
 * sharded over the communicator at the given stage (rank 0's values broadcast to every rank). Stage 3
 * first runs one forward on inputs without gradients: the model learns which parameters each block
 * reads, which flame_zero_create then shards. */
static flame_optimizer_t full_finetune_optimizer(flame_ctx_t ctx, flame_comm_t comm, flame_model_t model,
                                                 flame_params_t params, flame_params_t inputs, Args a, flame_zero_t* zero) {
  int64_t n = 0, trainable = 0;
  check(flame_params_count(params, &n), "flame_params_count");
  flame_tensor_t* list = calloc((size_t)(n > 0 ? n : 1), sizeof(flame_tensor_t));
  if (!list) exit(1);
  for (int64_t i = 0; i < n; ++i) {
    flame_tensor_t p = NULL;
    int32_t requires = 0;
    check(flame_params_tensor(params, i, &p), "flame_params_tensor");
    check(flame_tensor_requires_grad(p, &requires), "flame_tensor_requires_grad");
    if (requires) list[trainable++] = p;
  }
  flame_optimizer_options_t oo;
  check(flame_optimizer_options_init(&oo, FLAME_OPTIMIZER_ADAMW), "flame_optimizer_options_init");
  oo.lr = a.lr;
  oo.master_weights = 1;
  flame_optimizer_t opt = NULL;
  check(flame_optimizer_create(ctx, &oo, list, trainable, &opt), "flame_optimizer_create");
  free(list);
  flame_zero_options_t zo;
  check(flame_zero_options_init(&zo), "flame_zero_options_init");
  zo.stage = (int32_t)a.zero;
  if (a.zero == 3) {
    flame_params_t outputs = NULL;
    int32_t grad_mode = 1;
    check(flame_ctx_set_grad_enabled(ctx, 0, &grad_mode), "flame_ctx_set_grad_enabled");
    check(flame_model_forward(model, inputs, &outputs), "flame_model_forward");
    flame_params_release(outputs);
    check(flame_ctx_set_grad_enabled(ctx, grad_mode, NULL), "flame_ctx_set_grad_enabled");
    zo.model = model;
  }
  check(flame_zero_create(comm, opt, &zo, zero), "flame_zero_create");
  return opt;
}

typedef struct {
  double fraction; /* -1: not measured (error says why) */
  double device_ms_per_step, wall_ms_per_step, records_per_step;
  char error[256];
} BusyResult;

/* --busy: one untimed step with CUPTI's trace on (its start-up), then `steps` steps in the window from
 * the host's start of the first to the synchronised end of the last; the union of the device intervals
 * inside that window over its length. A CUPTI failure, or a replay or synchronize failing under the
 * trace, is reported in the result (the timed fields stay printable); a failing eager step still ends
 * the program as in the timed loop. */
static BusyResult measure_busy(flame_ctx_t ctx, flame_model_t model, flame_params_t inputs, const TensorFile* grads,
                               flame_params_t params, const Update* update, flame_graph_t graph, long steps) {
  BusyResult r;
  memset(&r, 0, sizeof r);
  r.fraction = -1;
  if (busy_trace_start(r.error, sizeof r.error) != 0) return r;
  uint64_t window_start = 0;
  for (long i = -1; i < steps && !r.error[0]; ++i) {
    if (i == 0) {
      if (flame_ctx_synchronize(ctx) != FLAME_OK) {
        snprintf(r.error, sizeof r.error, "flame_ctx_synchronize under CUPTI: %s", flame_last_error_message());
        break;
      }
      window_start = busy_timestamp_ns();
    }
    if (!graph)
      step(ctx, model, inputs, grads, params, update, NULL);
    else if (flame_graph_replay(graph) != FLAME_OK)
      snprintf(r.error, sizeof r.error, "flame_graph_replay under CUPTI: %s", flame_last_error_message());
  }
  if (!r.error[0] && flame_ctx_synchronize(ctx) != FLAME_OK)
    snprintf(r.error, sizeof r.error, "flame_ctx_synchronize under CUPTI: %s", flame_last_error_message());
  const uint64_t window_end = busy_timestamp_ns();
  BusyInterval* v = NULL;
  size_t n = 0, untimed = 0, dropped = 0;
  char stop_error[256] = "";
  const int stopped = busy_trace_stop(&v, &n, &untimed, &dropped, stop_error, sizeof stop_error) == 0;
  if (!r.error[0] && !stopped) snprintf(r.error, sizeof r.error, "%s", stop_error);
  if (r.error[0]) {
    free(v);
    return r;
  }
  n = busy_clip(v, n, window_start, window_end);
  if (window_start == 0 || window_end <= window_start)
    snprintf(r.error, sizeof r.error, "cuptiGetTimestamp gave no window (%llu..%llu)",
             (unsigned long long)window_start, (unsigned long long)window_end);
  else if (dropped || untimed)
    snprintf(r.error, sizeof r.error, "CUPTI dropped %zu records and left %zu untimed", dropped, untimed);
  else if (n == 0)
    snprintf(r.error, sizeof r.error, "CUPTI recorded no kernel, memcpy or memset in the measured steps");
  else {
    const double window_ns = (double)(window_end - window_start);
    const double busy_ns = (double)busy_union_ns(v, n);
    r.fraction = busy_ns / window_ns;
    r.device_ms_per_step = busy_ns / 1e6 / steps;
    r.wall_ms_per_step = window_ns / 1e6 / steps;
    r.records_per_step = (double)n / steps;
  }
  free(v);
  return r;
}

int main(int argc, char** argv) {
  const double process_start = now_ms();
  const Args a = parse(argc, argv);
  if (a.busy && !busy_built_with_cupti()) {
    char why[256];
    busy_trace_start(why, sizeof why);
    fprintf(stderr, "flame_bench_model_step: --busy: %s\n", why);
    return 1;
  }
  flame_ctx_options_t o;
  check(flame_ctx_options_init(&o), "flame_ctx_options_init");
  int32_t local_rank = 0;
  if (a.zero) check(flame_comm_env_local_rank(&local_rank), "flame_comm_env_local_rank");
  o.device = local_rank;
  flame_ctx_t ctx = NULL;
  check(flame_ctx_create(&o, &ctx), "flame_ctx_create");
  flame_comm_t comm = NULL;
  if (a.zero) check(flame_comm_create_from_env(ctx, NULL, &comm), "flame_comm_create_from_env");

  double t0 = now_ms();
  flame_model_t model = NULL;
  if (a.load)
    check(flame_model_load(ctx, a.load, a.options, &model), "flame_model_load");
  else
    check(flame_model_create(ctx, a.arch, a.config, a.options, &model), "flame_model_create");
  check(flame_ctx_synchronize(ctx), "flame_ctx_synchronize");
  const double load_ms = now_ms() - t0;
  const double bytes = a.load ? checkpoint_bytes(a.load) : 0;
  check(flame_model_set_checkpointing(model, a.checkpoint), "flame_model_set_checkpointing");
  check(flame_model_set_training(model, 1), "flame_model_set_training");

  flame_params_t params = NULL, inputs = NULL, adapter = NULL;
  flame_optimizer_t opt = NULL;
  OptimizerInBackward* oib = NULL;
  flame_tensor_t* list = NULL;  /* the adapter's tensors, borrowed from adapter */
  int64_t n = 0, adapter_elements = 0;
  if (a.lora) {
    check(flame_model_add_lora(model, a.lora, &adapter), "flame_model_add_lora");
    check(flame_params_count(adapter, &n), "flame_params_count");
    list = calloc((size_t)(n > 0 ? n : 1), sizeof(flame_tensor_t));
    if (!list) return 1;
    for (int64_t i = 0; i < n; ++i) {
      int64_t numel = 0;
      check(flame_params_tensor(adapter, i, &list[i]), "flame_params_tensor");
      check(flame_tensor_numel(list[i], &numel), "flame_tensor_numel");
      adapter_elements += numel;
    }
    flame_optimizer_options_t oo;
    check(flame_optimizer_options_init(&oo, FLAME_OPTIMIZER_ADAMW), "flame_optimizer_options_init");
    oo.lr = a.lr;
    if (a.optimizer_in_backward)
      check(oib_create(ctx, &oo, list, n, &oib), "oib_create");
    else
      check(flame_optimizer_create(ctx, &oo, list, n, &opt), "flame_optimizer_create");
    if (opt) check(flame_optimizer_set_state_bits(opt, (int32_t)a.state_bits), "flame_optimizer_set_state_bits");
  }
  check(flame_model_params(model, &params), "flame_model_params");
  flame_zero_t zero = NULL;
  TensorFile in = read_tensors(ctx, a.inputs), grads = read_tensors(ctx, a.grads);
  check(flame_params_create(ctx, &inputs), "flame_params_create");
  for (int64_t i = 0; i < in.n; ++i) check(flame_params_add(inputs, in.names[i], in.tensors[i]), "flame_params_add");
  if (a.zero) opt = full_finetune_optimizer(ctx, comm, model, params, inputs, a, &zero);
  const Update update = {opt, zero, oib, list, n, a.clip_grad_norm};

  double start_to_first_step_ms = 0;
  for (long i = 0; i < a.warmup; ++i) {
    step(ctx, model, inputs, &grads, params, &update, i == 0 ? a.out : NULL);
    if (i == 0) {
      check(flame_ctx_synchronize(ctx), "flame_ctx_synchronize");
      start_to_first_step_ms = now_ms() - process_start;
    }
  }
  check(flame_ctx_synchronize(ctx), "flame_ctx_synchronize");
  check(flame_ctx_reset_peak_memory(ctx), "flame_ctx_reset_peak_memory");
  flame_graph_t graph = NULL;
  char graph_error[512] = "";
  if (a.graph) {
    check(flame_graph_capture_begin(ctx), "flame_graph_capture_begin");
    step_captured(ctx, model, inputs, &grads, &update);
    if (flame_graph_capture_end(ctx, &graph) != FLAME_OK) {
      snprintf(graph_error, sizeof graph_error, "%s", flame_last_error_message());
      graph = NULL;
    }
  }
  double* ms = calloc((size_t)a.steps, sizeof(double));
  if (!ms) return 1;
  flame_ctx_counters_t issued, total;
  memset(&total, 0, sizeof total);
  for (long i = 0; i < a.steps; ++i) {
    check(flame_ctx_reset_counters(ctx), "flame_ctx_reset_counters");
    t0 = now_ms();
    if (graph)
      check(flame_graph_replay(graph), "flame_graph_replay");
    else
      step(ctx, model, inputs, &grads, params, &update, a.warmup == 0 && i == 0 ? a.out : NULL);
    memset(&issued, 0, sizeof issued);
    issued.struct_size = sizeof issued;
    check(flame_ctx_counters(ctx, &issued), "flame_ctx_counters");
    check(flame_ctx_synchronize(ctx), "flame_ctx_synchronize");
    ms[i] = now_ms() - t0;
    total.launches += issued.launches;
    total.cast_kernels += issued.cast_kernels;
    total.host_syncs += issued.host_syncs;
    total.driver_allocations += issued.driver_allocations;
  }
  flame_memory_stats_t mem;
  memset(&mem, 0, sizeof mem);
  mem.struct_size = sizeof mem;
  check(flame_ctx_memory_stats(ctx, &mem), "flame_ctx_memory_stats");
  uint64_t state_bytes = 0;
  if (opt) check(flame_optimizer_state_bytes(opt, &state_bytes), "flame_optimizer_state_bytes");
  if (oib) check(oib_state_bytes(oib, &state_bytes), "oib_state_bytes");
  char busy_json[768] = "";
  if (a.busy) {
    BusyResult b = measure_busy(ctx, model, inputs, &grads, params, &update, graph, a.busy);
    for (char* c = b.error; *c; ++c)  /* the message goes into a JSON string */
      if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20) *c = ' ';
    snprintf(busy_json, sizeof busy_json,
             ", \"busy_steps\": %ld, \"busy_fraction\": %.4f, \"busy_device_ms_per_step\": %.3f, "
             "\"busy_wall_ms_per_step\": %.3f, \"busy_records_per_step\": %.1f, \"busy_error\": \"%s\"",
             a.busy, b.fraction, b.device_ms_per_step, b.wall_ms_per_step, b.records_per_step, b.error);
  }
  qsort(ms, (size_t)a.steps, sizeof(double), compare_doubles);
  for (const char* c = graph_error; *c; ++c)  /* the message goes into a JSON string */
    if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20) graph_error[c - graph_error] = ' ';
  printf("RESULT {\"load_ms\": %.1f, \"checkpoint_bytes\": %.0f, \"load_gb_per_s\": %.3f, \"step_ms_median\": %.3f, "
         "\"step_ms_min\": %.3f, \"peak_bytes\": %llu, \"steps\": %ld, \"adapter_elements\": %lld, \"graph\": %d, "
         "\"graph_error\": \"%s\", \"launches_per_step\": %.1f, \"cast_kernels_per_step\": %.1f, "
         "\"host_syncs_per_step\": %.1f, \"driver_allocations_per_step\": %.1f, \"start_to_first_step_ms\": %.1f, "
         "\"optimizer_state_bytes\": %llu, \"zero_stage\": %ld, \"optimizer_in_backward\": %d, "
         "\"clip_grad_norm\": %g, \"state_bits\": %ld%s}\n",
         load_ms, bytes, bytes > 0 ? bytes / 1e9 / (load_ms / 1e3) : 0.0, ms[a.steps / 2], ms[0],
         (unsigned long long)mem.peak_bytes_in_use, a.steps, (long long)adapter_elements, graph != NULL, graph_error,
         (double)total.launches / a.steps, (double)total.cast_kernels / a.steps, (double)total.host_syncs / a.steps,
         (double)total.driver_allocations / a.steps, start_to_first_step_ms, (unsigned long long)state_bytes, a.zero,
         a.optimizer_in_backward, a.clip_grad_norm, a.state_bits, busy_json);
  free(ms);
  flame_graph_release(graph);
  flame_zero_release(zero);
  flame_optimizer_release(opt);
  oib_release(oib);
  free(list);
  flame_params_release(adapter);
  flame_params_release(inputs);
  release_tensors(&in);
  release_tensors(&grads);
  flame_params_release(params);
  flame_model_release(model);
  flame_comm_release(comm);
  flame_ctx_destroy(ctx);
  return 0;
}

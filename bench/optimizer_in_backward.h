/* The optimizer applied inside backward, through the public C ABI only (PyTorch's "optimizer step in
 * backward" pattern): one FLAME optimizer per parameter, stepped from that parameter's
 * post-accumulate-grad hook, after which the hook drops the gradient. Each adapter gradient then
 * lives only from the moment backward completes it until its update is queued, instead of until the
 * end of backward: the peak loses (most of) the gradients' bytes. Used by flame_bench_model_step
 * (--optimizer-in-backward) and its GPU test (tests/gpu/test_model_lora_optimizer_in_backward.cpp).
 * Header-only C (C11 and C++17) so that both include the same mechanism.
 *
 * Why it is sound with FLAME's engine (src/autograd/engine.cpp, deliver_to_leaf):
 *  - A leaf's post-accumulate hooks run once per walk, when the walk's last edge into the leaf has
 *    delivered (dependency counting), so every contribution of that walk is in .grad and every node
 *    that read the parameter has queued its kernels; the update is queued after them on the same
 *    stream, and the parameter's version bump (an in-place write) meets no saved tensor still waiting.
 *  - Checkpointing is re-entrant (toolkit/checkpoint.cpp): a checkpointed block's backward is a
 *    nested walk that delivers to the parameters its function reads and runs their hooks then. A
 *    parameter read by one checkpointed block only (every LoRA tensor of the models: each belongs to
 *    one block) gets its hook once per backward, after all contributions. A parameter read by two
 *    walks (two checkpointed blocks, or one and the outer graph) would get its hook once per walk,
 *    before all contributions: this approach is wrong for it, and the hook refuses the second call
 *    (FLAME_ERROR_UNSUPPORTED, backward stops) instead of stepping twice on partial gradients.
 *  - Dropping .grad in the hook (flame_tensor_set_grad(leaf, NULL)): flame.h says that in a
 *    post-accumulate hook .grad belongs to the leaf; the engine reads nothing of it after the hooks
 *    (the leaf is not in the after-walk list: leaves with such hooks get their .grad during the walk).
 *    The optimizer's kernels were queued before the drop and the memory goes back to the pool in
 *    stream order (during a capture, to the capture's pool, reused only by later captured work), so
 *    nothing overwrites the gradient before the update reads it. Same effect as
 *    flame_optimizer_zero_grad(opt, 1) on the one-parameter optimizer, without its loop.
 *  - CUDA graphs: the hooks run while the step is captured, so each flame_optimizer_step is captured
 *    as for a normal step (optim_tick and the update kernels, its tables and state as set-up memory;
 *    the step count and learning rate read from its device record). Requirements are the normal
 *    path's: an eager step before capturing when master weights are asked, no stochastic rounding.
 *  - The learning rate is not set from the hook: a flame_optimizer_set_lr captured in a hook would
 *    fix that rate into the graph. oib_set_lr sets it on every optimizer (stream-ordered memsets of
 *    their device records), which the next eager step or the next replay reads.
 *  - Global-norm gradient clipping needs every gradient before any update: incompatible (callers
 *    refuse the combination); per-tensor tools (flame_grad_normalize, clip by value) could run in
 *    the hook before the step.
 * Host cost per hook call: the optimizer step's own (its tables, two launches) and a set_grad; the
 * hook allocates nothing. */
#ifndef FLAME_BENCH_OPTIMIZER_IN_BACKWARD_H
#define FLAME_BENCH_OPTIMIZER_IN_BACKWARD_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "flame.h"

typedef struct OptimizerInBackward OptimizerInBackward;

/* One parameter: its optimizer, its hook, and whether the current backward stepped it. */
typedef struct {
  OptimizerInBackward* owner;
  flame_optimizer_t opt;
  flame_hook_t hook;
  int32_t stepped;
} OibSlot;

struct OptimizerInBackward {
  int64_t n;
  OibSlot* slots;
  int64_t stepped; /* parameters stepped since the last oib_end_backward */
};

static inline flame_status_t oib_step_hook(void* user_data, flame_tensor_t leaf) {
  OibSlot* s = (OibSlot*)user_data;
  if (s->stepped) {
    flame_set_error_message(
        "optimizer in backward: a parameter's post-accumulate hook ran twice in one backward (it is read by two "
        "walks: two checkpointed blocks, or a checkpointed block and the rest of the graph), so its first step "
        "saw a partial gradient; train such parameters with the normal optimizer");
    return FLAME_ERROR_UNSUPPORTED;
  }
  flame_status_t st = flame_optimizer_step(s->opt);
  if (st != FLAME_OK) return st; /* its message stands */
  s->stepped = 1;
  s->owner->stepped++;
  return flame_tensor_set_grad(leaf, NULL);
}

/* Frees everything oib_create made (hooks first: their user data lives in slots). NULL: no-op. */
static inline void oib_release(OptimizerInBackward* oib) {
  if (!oib) return;
  for (int64_t i = 0; i < oib->n; ++i) flame_hook_remove(oib->slots[i].hook);
  for (int64_t i = 0; i < oib->n; ++i) flame_optimizer_release(oib->slots[i].opt);
  free(oib->slots);
  free(oib);
}

/* One optimizer with opts per parameter of params[0..n) (borrowed; leaves that require grad) and its
 * hook. OUT *out (NULL on failure; release with oib_release). Errors: those of
 * flame_optimizer_create and flame_tensor_register_post_accumulate_grad_hook (with their message),
 * FLAME_ERROR_OUT_OF_MEMORY (host). On failure nothing stays registered. */
static inline flame_status_t oib_create(flame_ctx_t ctx, const flame_optimizer_options_t* opts, const flame_tensor_t* params,
                                        int64_t n, OptimizerInBackward** out) {
  if (!out) return FLAME_ERROR_INVALID_ARGUMENT;
  *out = NULL;
  if (n < 0 || (n > 0 && !params)) {
    flame_set_error_message("oib_create: params NULL or n negative");
    return FLAME_ERROR_INVALID_ARGUMENT;
  }
  OptimizerInBackward* oib = (OptimizerInBackward*)calloc(1, sizeof *oib);
  OibSlot* slots = (OibSlot*)calloc((size_t)(n > 0 ? n : 1), sizeof *slots);
  if (!oib || !slots) {
    free(oib);
    free(slots);
    flame_set_error_message("oib_create: out of host memory");
    return FLAME_ERROR_OUT_OF_MEMORY;
  }
  oib->slots = slots;
  for (int64_t i = 0; i < n; ++i) {
    OibSlot* s = &slots[i];
    s->owner = oib;
    flame_status_t st = flame_optimizer_create(ctx, opts, &params[i], 1, &s->opt);
    if (st == FLAME_OK) st = flame_tensor_register_post_accumulate_grad_hook(params[i], oib_step_hook, s, NULL, &s->hook);
    if (st != FLAME_OK) {
      char msg[512];
      snprintf(msg, sizeof msg, "oib_create: parameter %lld: %s", (long long)i, flame_last_error_message());
      oib->n = i + 1; /* slot i may hold an optimizer without a hook */
      oib_release(oib);
      flame_set_error_message(msg);
      return st;
    }
    oib->n = i + 1;
  }
  *out = oib;
  return FLAME_OK;
}

/* Call after every backward (whatever it returned): readies the slots for the next one. OUT
 * *stepped (may be NULL): how many parameters that backward stepped. */
static inline void oib_end_backward(OptimizerInBackward* oib, int64_t* stepped) {
  if (stepped) *stepped = oib ? oib->stepped : 0;
  if (!oib) return;
  for (int64_t i = 0; i < oib->n; ++i) oib->slots[i].stepped = 0;
  oib->stepped = 0;
}

/* The learning rate of every parameter's optimizer, from the next step on (eager or replayed). */
static inline flame_status_t oib_set_lr(OptimizerInBackward* oib, double lr) {
  for (int64_t i = 0; i < oib->n; ++i) {
    flame_status_t st = flame_optimizer_set_lr(oib->slots[i].opt, -1, lr);
    if (st != FLAME_OK) return st;
  }
  return FLAME_OK;
}

/* OUT *bytes: device memory of all the optimizers' state (moments, master weights). */
static inline flame_status_t oib_state_bytes(const OptimizerInBackward* oib, uint64_t* bytes) {
  *bytes = 0;
  for (int64_t i = 0; i < oib->n; ++i) {
    uint64_t b = 0;
    flame_status_t st = flame_optimizer_state_bytes(oib->slots[i].opt, &b);
    if (st != FLAME_OK) return st;
    *bytes += b;
  }
  return FLAME_OK;
}

#endif /* FLAME_BENCH_OPTIMIZER_IN_BACKWARD_H */

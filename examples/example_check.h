/*
 * example_check.h - first-failure error chaining for the longer examples (train_gpt, lora_finetune,
 * train_diffusion).
 *
 * A forward pass reads as a list of operations with one error check at its end: the first failing
 * call is remembered with its message and makes the remaining DO() calls no-ops. The handles the
 * calls return are not tracked here: the examples open a FLAME handle scope (flame_scope_begin /
 * flame_scope_end, flame.h "Handle scopes") around each step, which releases them together. Define
 * EXAMPLE_NAME (the program's name, a string literal) before including this header: messages start
 * with it. Header only (static functions), C99.
 */
#ifndef FLAME_EXAMPLES_EXAMPLE_CHECK_H
#define FLAME_EXAMPLES_EXAMPLE_CHECK_H

#include <stdio.h>

#include "flame.h"

#ifndef EXAMPLE_NAME
#error "define EXAMPLE_NAME (the program's name) before including example_check.h"
#endif

typedef struct check {
  flame_status_t st;
  char msg[512];
  const char* where;
} check;

/* Records the first failure (status, call, the library's message); later ones are ignored. */
static inline void check_fail(check* s, flame_status_t st, const char* where) {
  if (s->st != FLAME_OK || st == FLAME_OK) return;
  s->st = st;
  s->where = where;
  snprintf(s->msg, sizeof s->msg, "%s", flame_last_error_message());
}

/* var = the result of call (which writes &var); skipped after a failure. The handle belongs to the
 * handle scope open on the thread (the caller opens one). */
#define DO(s, var, call)                                      \
  do {                                                        \
    (var) = NULL;                                             \
    if ((s)->st == FLAME_OK) check_fail((s), (call), #call);  \
  } while (0)

/* Opens a handle scope on ctx into *scope (recording a failure in s). */
static inline void begin_scope(check* s, flame_ctx_t ctx, flame_scope_t* scope) {
  *scope = NULL;
  if (s->st == FLAME_OK) check_fail(s, flame_scope_begin(ctx, scope), "flame_scope_begin");
}

/* Ends *scope (NULL: nothing to do), releasing the handles made in it, and sets it to NULL. */
static inline void end_scope(check* s, flame_scope_t* scope) {
  check_fail(s, flame_scope_end(*scope), "flame_scope_end");
  *scope = NULL;
}

/* Prints the recorded failure; returns 1 (an exit status). */
static inline int report(const check* s) {
  fprintf(stderr, EXAMPLE_NAME ": %s failed: %s: %s\n", s->where ? s->where : "?", flame_status_string(s->st), s->msg);
  return 1;
}

#endif /* FLAME_EXAMPLES_EXAMPLE_CHECK_H */

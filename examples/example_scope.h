/*
 * example_scope.h - a scope of tensor handles for the longer examples (train_gpt, lora_finetune,
 * train_diffusion).
 *
 * Every intermediate of a forward pass is tracked in a scope and released together; the first
 * failing call is remembered with its message and makes the remaining DO() calls no-ops, so a
 * forward pass reads as a list of operations with one error check at its end. Define EXAMPLE_NAME
 * (the program's name, a string literal) before including this header: messages start with it.
 * Header only (static functions), C99.
 */
#ifndef FLAME_EXAMPLES_EXAMPLE_SCOPE_H
#define FLAME_EXAMPLES_EXAMPLE_SCOPE_H

#include <stdio.h>

#include "flame.h"

#ifndef EXAMPLE_NAME
#error "define EXAMPLE_NAME (the program's name) before including example_scope.h"
#endif

#define MAX_TRACKED 1024

typedef struct scope {
  flame_tensor_t t[MAX_TRACKED];
  int n;
  flame_status_t st;
  char msg[512];
  const char* where;
} scope;

/* Records the first failure (status, call, the library's message); later ones are ignored. */
static inline void scope_fail(scope* s, flame_status_t st, const char* where) {
  if (s->st != FLAME_OK) return;
  s->st = st;
  s->where = where;
  snprintf(s->msg, sizeof s->msg, "%s", flame_last_error_message());
}

/* Takes t (a new reference, may be NULL) into the scope; st is the status of the call that made it. */
static inline void track(scope* s, flame_status_t st, flame_tensor_t t, const char* where) {
  if (st != FLAME_OK) scope_fail(s, st, where);
  if (!t) return;
  if (s->n == MAX_TRACKED) {
    flame_tensor_release(t);
    flame_set_error_message(EXAMPLE_NAME ": too many live intermediates");
    scope_fail(s, FLAME_ERROR_INTERNAL, where);
    return;
  }
  s->t[s->n++] = t;
}

/* Releases every tracked handle (the failure, if any, stays recorded). */
static inline void scope_release(scope* s) {
  while (s->n > 0) flame_tensor_release(s->t[--s->n]);
}

/* var = the result of call (which writes &var), tracked in s; skipped after a failure. */
#define DO(s, var, call)                              \
  do {                                                \
    (var) = NULL;                                     \
    if ((s)->st == FLAME_OK) {                        \
      flame_status_t st_ = (call);                    \
      track((s), st_, (var), #call);                  \
    }                                                 \
  } while (0)

/* Prints the recorded failure; returns 1 (an exit status). */
static inline int report(const scope* s) {
  fprintf(stderr, EXAMPLE_NAME ": %s failed: %s: %s\n", s->where ? s->where : "?", flame_status_string(s->st), s->msg);
  return 1;
}

#endif /* FLAME_EXAMPLES_EXAMPLE_SCOPE_H */

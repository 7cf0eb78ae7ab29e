/* flame.h must compile as strict C99: -std=c99 -pedantic -Wall -Wextra -Werror -Wstrict-prototypes.
 * This file is built as an object library (flame_header_c99); it is never linked or run. */
#include "flame.h"
#include "flame.h" /* the include guard must make a second inclusion harmless */

int flame_header_c99_probe(void);

/* Touch the types, macros and a few prototypes so that the compiler checks them. */
int flame_header_c99_probe(void) {
  flame_ctx_options_t opts;
  flame_memory_stats_t stats;
  flame_status_t st = FLAME_OK;
  flame_dtype_t dt = FLAME_DTYPE_BF16;
  flame_tensor_t t = NULL;
  flame_ctx_t ctx = NULL;
  flame_hook_t hook = NULL;
  flame_tensor_hook_fn fn = NULL;
  flame_post_accumulate_hook_fn post = NULL;
  flame_destroy_fn destroy = NULL;
  const char* (*version)(void) = flame_version_string;
  flame_status_t (*add)(flame_tensor_t, flame_tensor_t, flame_tensor_t*) = flame_add;
  int64_t dims[FLAME_MAX_DIMS];
  int32_t dim_all = FLAME_DIM_ALL;
  unsigned flags = FLAME_BACKWARD_RETAIN_GRAPH | FLAME_BACKWARD_CREATE_GRAPH | FLAME_GRAD_ALLOW_UNUSED;
  opts.struct_size = sizeof opts;
  stats.struct_size = sizeof stats;
  dims[0] = 1;
  (void)st; (void)dt; (void)t; (void)ctx; (void)hook; (void)fn; (void)post; (void)destroy;
  (void)version; (void)add; (void)dims; (void)dim_all; (void)flags; (void)stats;
  return FLAME_VERSION_MAJOR * 10000 + FLAME_VERSION_MINOR * 100 + FLAME_VERSION_PATCH + FLAME_ABI_VERSION;
}

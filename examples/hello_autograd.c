/*
 * hello_autograd.c - the first FLAME program: a gradient, and a hook that clips it.
 *
 *   x = [2, 3] (requires grad);  loss = sum(x * x);  backward  ->  dloss/dx = 2x = [4, 6]
 *   then a tensor hook on x logs the incoming gradient and clamps it to [-5, 5]  ->  [4, 5]
 *
 * Uses only flame.h (C99). Exit status: 0 success, 1 a FLAME call failed (the library's message is
 * printed), 2 no GPU or no NVIDIA driver on this machine (the library's message is printed).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "example_args.h" /* --help, --version, errors naming the option */
#include "flame.h"

#define EXIT_NO_GPU 2

/* On failure: print the call, the status and the library's message, then jump to cleanup. */
#define CHECK(call)                                                                              \
  do {                                                                                           \
    flame_status_t st_ = (call);                                                                 \
    if (st_ != FLAME_OK) {                                                                       \
      fprintf(stderr, "hello_autograd: %s failed: %s: %s\n", #call, flame_status_string(st_),   \
              flame_last_error_message());                                                       \
      goto cleanup;                                                                              \
    }                                                                                            \
  } while (0)

/* State of the clipping hook, passed as user_data. */
typedef struct clip_state {
  double limit;
  int calls;
} clip_state;

/* A tensor hook: sees the gradient flowing into x and replaces it with a clamped copy. */
static flame_status_t clip_hook(void* user_data, flame_tensor_t grad, flame_tensor_t* replacement) {
  clip_state* s = (clip_state*)user_data;
  float g[2];
  flame_status_t st = flame_to_host(grad, g, sizeof g);
  if (st != FLAME_OK) return st; /* the message is already set by flame_to_host */
  s->calls++;
  printf("  hook: gradient into x = [%g, %g], clipping to [%g, %g]\n", g[0], g[1], -s->limit, s->limit);
  return flame_clamp(grad, -s->limit, s->limit, replacement);
}

/* Called once when the hook goes (flame_hook_remove, or when x is released). */
static void clip_destroy(void* user_data) {
  clip_state* s = (clip_state*)user_data;
  printf("  hook removed after %d call(s)\n", s->calls);
}

/* loss = sum(x * x), then backward; prints and returns x.grad in out[2]. */
static flame_status_t loss_and_backward(flame_ctx_t ctx, flame_tensor_t x, float out[2]) {
  flame_tensor_t y = NULL, loss = NULL, grad = NULL;
  double value = 0;
  flame_status_t st;
  if ((st = flame_mul(x, x, &y)) != FLAME_OK) goto done;
  if ((st = flame_sum_all(y, &loss)) != FLAME_OK) goto done;
  if ((st = flame_tensor_item(loss, &value)) != FLAME_OK) goto done;
  if ((st = flame_backward(ctx, loss, NULL, 0)) != FLAME_OK) goto done;
  if ((st = flame_tensor_grad(x, &grad)) != FLAME_OK) goto done;
  if (!grad) {
    flame_set_error_message("x has no gradient after backward");
    st = FLAME_ERROR_INTERNAL;
    goto done;
  }
  if ((st = flame_to_host(grad, out, 2 * sizeof(float))) != FLAME_OK) goto done;
  printf("  loss = %g, dloss/dx = [%g, %g]\n", value, out[0], out[1]);
done:
  flame_tensor_release(grad);
  flame_tensor_release(loss);
  flame_tensor_release(y);
  return st;
}

int main(int argc, char** argv) {
  const example_cli cli = {"hello_autograd", "Computes a gradient on the GPU and clips it with a tensor hook; takes no options.",
                           NULL, 0, "Exit status: 0 success, 1 a FLAME call failed or a bad option, 2 no GPU."};
  const int args_rc = example_parse_args(&cli, argc, argv);
  int status = 1;
  flame_ctx_t ctx = NULL;
  flame_tensor_t x = NULL;
  flame_hook_t hook = NULL;
  clip_state clip = {5.0, 0};
  const float x_host[2] = {2.0f, 3.0f};
  const int64_t shape[1] = {2};
  float g[2];
  char device[128];
  flame_status_t st;

  if (args_rc != EXAMPLE_ARGS_RUN) return args_rc;
  printf("FLAME %s (ABI %d)\n", flame_version_string(), (int)flame_abi_version());

  st = flame_ctx_create(NULL, &ctx);
  if (st == FLAME_ERROR_NO_DRIVER || st == FLAME_ERROR_NO_DEVICE) {
    fprintf(stderr, "hello_autograd: no GPU available (%s): %s\n", flame_status_string(st),
            flame_last_error_message());
    return EXIT_NO_GPU;
  }
  CHECK(st);
  CHECK(flame_ctx_device_name(ctx, device, sizeof device));
  printf("device: %s\n", device);

  CHECK(flame_from_host(ctx, x_host, sizeof x_host, shape, 1, FLAME_DTYPE_F32, &x));
  CHECK(flame_tensor_set_requires_grad(x, 1));

  printf("x = [2, 3], loss = sum(x * x)\n");
  CHECK(loss_and_backward(ctx, x, g));
  if (fabsf(g[0] - 4.0f) > 1e-6f || fabsf(g[1] - 6.0f) > 1e-6f) {
    fprintf(stderr, "hello_autograd: expected dloss/dx = [4, 6]\n");
    goto cleanup;
  }

  printf("with a hook that clips the gradient of x to [-5, 5]:\n");
  CHECK(flame_tensor_register_hook(x, clip_hook, &clip, clip_destroy, &hook));
  CHECK(flame_tensor_set_grad(x, NULL)); /* start from no gradient instead of accumulating */
  CHECK(loss_and_backward(ctx, x, g));
  if (clip.calls != 1 || fabsf(g[0] - 4.0f) > 1e-6f || fabsf(g[1] - 5.0f) > 1e-6f) {
    fprintf(stderr, "hello_autograd: expected one hook call and dloss/dx = [4, 5]\n");
    goto cleanup;
  }
  status = 0;

cleanup:
  flame_hook_remove(hook); /* NULL-safe, like every release function */
  flame_tensor_release(x);
  flame_ctx_destroy(ctx);
  if (status == 0) printf("ok\n");
  return status;
}

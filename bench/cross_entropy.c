/* bench/cross_entropy.c - fused cross-entropy forward + backward against its memory bound.
 *
 * With grad recorded, class indices and reduction mean, the forward reads each logits row from DRAM
 * once and writes the loss and the gradient (the second read of a row for the gradient comes from
 * L2); flame_grad of the loss with no grad_outputs returns that gradient without another pass. So
 * forward + backward move 2 * N * C elements: one read of the logits, one write of the gradient.
 * The bound is that traffic at the copy bandwidth measured in the same run (flame_clone of the
 * logits: one read and one write per element, the same traffic); the target is a ratio of
 * at most 1.3 at the GPT-2 head, 8192 x 50304. The ratio to the 3-pass bound (the logits read
 * twice, as a backward with any other upstream gradient does) is printed for comparison. The
 * gradient comes from flame_grad, so no .grad accumulation (a copy) is timed.
 *
 * Build and run (from the repository root, after building libflame into build/):
 *   cc -O2 -std=c99 bench/cross_entropy.c -Iinclude -Lbuild -lflame -Wl,-rpath,$PWD/build -o build/bench_cross_entropy
 *   ./build/bench_cross_entropy [N C dtype]      (defaults: 8192 50304 bf16; dtype f32, f16 or bf16)
 */
#define _POSIX_C_SOURCE 199309L
#include <flame.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(call)                                                                          \
  do {                                                                                       \
    flame_status_t st_ = (call);                                                             \
    if (st_ != FLAME_OK) {                                                                   \
      fprintf(stderr, "%s failed: %s\n", #call, flame_last_error_message());                 \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void step(flame_ctx_t ctx, flame_tensor_t x, flame_tensor_t t) {
  flame_tensor_t loss = NULL, grad = NULL;
  CHECK(flame_cross_entropy(x, t, NULL, -100, 0.0, FLAME_REDUCTION_MEAN, &loss));
  CHECK(flame_grad(ctx, &loss, NULL, 1, &x, 1, 0, &grad));
  flame_tensor_release(grad);
  flame_tensor_release(loss);
}

int main(int argc, char** argv) {
  int64_t n = argc > 1 ? atoll(argv[1]) : 8192, c = argc > 2 ? atoll(argv[2]) : 50304;
  const char* dtn = argc > 3 ? argv[3] : "bf16";
  flame_dtype_t dt = strcmp(dtn, "f32") == 0 ? FLAME_DTYPE_F32 : strcmp(dtn, "f16") == 0 ? FLAME_DTYPE_F16 : FLAME_DTYPE_BF16;
  const int iters = 20;
  flame_ctx_t ctx;
  if (flame_ctx_create(NULL, &ctx) != FLAME_OK) {
    fprintf(stderr, "%s\n", flame_last_error_message());
    return 2;
  }
  int64_t shape[2] = {n, c};
  flame_tensor_t x = NULL, t = NULL, t64 = NULL, u = NULL;
  CHECK(flame_randn(ctx, shape, 2, dt, &x));
  CHECK(flame_tensor_set_requires_grad(x, 1));
  CHECK(flame_rand(ctx, &n, 1, FLAME_DTYPE_F32, &u)); /* class indices: floor(u * c) */
  CHECK(flame_mul_scalar(u, (double)c, &t64));
  flame_tensor_release(u);
  CHECK(flame_floor(t64, &u));
  flame_tensor_release(t64);
  CHECK(flame_clamp(u, 0.0, (double)(c - 1), &t64)); /* u * c may round up to c in f32 */
  CHECK(flame_to_dtype(t64, FLAME_DTYPE_I64, &t));
  flame_tensor_release(u);
  flame_tensor_release(t64);

  for (int i = 0; i < 3; ++i) step(ctx, x, t); /* compile and warm up */
  CHECK(flame_ctx_synchronize(ctx));
  double t0 = now();
  for (int i = 0; i < iters; ++i) step(ctx, x, t);
  CHECK(flame_ctx_synchronize(ctx));
  double ce = (now() - t0) / iters;

  for (int i = 0; i < 3; ++i) {
    flame_tensor_t y = NULL;
    CHECK(flame_clone(x, &y));
    flame_tensor_release(y);
  }
  CHECK(flame_ctx_synchronize(ctx));
  t0 = now();
  for (int i = 0; i < iters; ++i) {
    flame_tensor_t y = NULL;
    CHECK(flame_clone(x, &y));
    flame_tensor_release(y);
  }
  CHECK(flame_ctx_synchronize(ctx));
  double copy = (now() - t0) / iters;

  double bytes = (double)n * (double)c * (double)flame_dtype_size(dt);
  double bw = 2.0 * bytes / copy;
  char name[256];
  CHECK(flame_ctx_device_name(ctx, name, sizeof name));
  printf("cross_entropy %lld x %lld %s on %s\n", (long long)n, (long long)c, dtn, name);
  printf("  forward+backward %.3f ms; copy bandwidth %.2f TB/s\n", ce * 1e3, bw * 1e-12);
  printf("  single-pass bound (2 passes: read logits, write grad) %.3f ms: ratio %.2f (target <= 1.3)\n",
         2.0 * bytes / bw * 1e3, ce / (2.0 * bytes / bw));
  printf("  3-pass bound (logits read twice)                    %.3f ms: ratio %.2f\n", 3.0 * bytes / bw * 1e3,
         ce / (3.0 * bytes / bw));
  flame_tensor_release(t);
  flame_tensor_release(x);
  flame_ctx_destroy(ctx);
  return 0;
}

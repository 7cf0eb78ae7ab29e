/* Host overhead per FLAME call, measured in C (no language binding in the loop): the T0 tier of
 * bench/run.py. Each case runs warm-up iterations, then N calls (each result released), then one
 * synchronisation; the wall time divided by N is the cost a C, Rust or C# caller pays per op.
 * Prints one JSON object per line: {"name": ..., "us_per_op": ...}. Exit 2 without a GPU. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "flame.h"

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

#define CHECK(expr)                                                                  \
  do {                                                                               \
    flame_status_t st_ = (expr);                                                     \
    if (st_ != FLAME_OK) {                                                           \
      fprintf(stderr, "%s: %s\n", #expr, flame_last_error_message());               \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

typedef flame_status_t (*binary_fn)(flame_tensor_t, flame_tensor_t, flame_tensor_t*);

/* us_per_op: wall time per call including the final synchronisation; issue_us_per_op: the host's
 * time to issue the calls (before the synchronisation): when the two agree the loop is host-bound. */
static void report(const char* name, double t0, double t_issued, int n) {
  printf("{\"name\": \"%s\", \"us_per_op\": %.4f, \"issue_us_per_op\": %.4f}\n", name, (now_us() - t0) / n,
         (t_issued - t0) / n);
  fflush(stdout);
}

/* n calls of fn(a, b), each result released. */
static void call_binary(binary_fn fn, flame_tensor_t a, flame_tensor_t b, int n) {
  for (int i = 0; i < n; ++i) {
    flame_tensor_t c = NULL;
    CHECK(fn(a, b, &c));
    flame_tensor_release(c);
  }
}

static void run(flame_ctx_t ctx, const char* name, binary_fn fn, flame_tensor_t a, flame_tensor_t b, int n) {
  call_binary(fn, a, b, 2000);
  CHECK(flame_ctx_synchronize(ctx));
  double t0 = now_us();
  call_binary(fn, a, b, n);
  double t1 = now_us();
  CHECK(flame_ctx_synchronize(ctx));
  report(name, t0, t1, n);
}

typedef flame_status_t (*factory_fn)(flame_ctx_t, const int64_t*, int32_t, flame_dtype_t, flame_tensor_t*);

/* n calls of a factory (flame_empty, flame_zeros) for a 1-element f32 tensor, each released, then one
 * synchronisation. */
static void run_factory(flame_ctx_t ctx, const char* name, factory_fn fn, int n) {
  const int64_t one[1] = {1};
  double t0 = now_us();
  for (int i = 0; i < n; ++i) {
    flame_tensor_t v = NULL;
    CHECK(fn(ctx, one, 1, FLAME_DTYPE_F32, &v));
    flame_tensor_release(v);
  }
  double t1 = now_us();
  CHECK(flame_ctx_synchronize(ctx));
  report(name, t0, t1, n);
}

/* The parts of an eager op's host cost, each timed alone (breakdown rows, not compared with torch):
 * a handle retain + release; a view (entry point, handle and tensor bookkeeping, no allocation, no
 * kernel); an allocation + free of a 1-element tensor (no kernel); zeros (allocation + one kernel). */
static void run_parts(flame_ctx_t ctx, flame_tensor_t a, int n, int view_only) {
  const int64_t one[1] = {1};
  double t0;
  if (view_only) goto view;
  t0 = now_us();
  for (int i = 0; i < n; ++i) {
    CHECK(flame_tensor_retain(a));
    flame_tensor_release(a);
  }
  report("part_retain_release", t0, now_us(), n);
view:
  t0 = now_us();
  for (int i = 0; i < n; ++i) {
    flame_tensor_t v = NULL;
    CHECK(flame_reshape(a, one, 1, &v));
    flame_tensor_release(v);
  }
  report("part_view", t0, now_us(), n);
  if (view_only) return;
  CHECK(flame_ctx_synchronize(ctx));
  run_factory(ctx, "part_empty", flame_empty, n);
  run_factory(ctx, "part_zeros", flame_zeros, n);
}

/* The floor under every eager op: cuLaunchKernel of an empty kernel (6 parameters, as flame_add
 * passes) on FLAME's stream, with the driver opened by dlopen as FLAME does. Wall time per launch
 * (the empty kernel's GPU time is below the launch cost, so the loop is host-bound). */
typedef int (*mod_load_t)(void**, const void*);
typedef int (*get_fn_t)(void**, void*, const char*);
typedef int (*launch_t)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**, void**);
static void run_raw_launch(flame_ctx_t ctx, int n) {
  static const char ptx[] =
      ".version 7.0\n.target sm_80\n.address_size 64\n"
      ".visible .entry noop(.param .align 8 .b8 a[24], .param .u64 p0, .param .u64 n, .param .u64 p1, .param .u64 p2,"
      " .param .u64 p3)\n{\n ret;\n}\n";
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  mod_load_t load = lib ? (mod_load_t)dlsym(lib, "cuModuleLoadData") : NULL;
  get_fn_t get = lib ? (get_fn_t)dlsym(lib, "cuModuleGetFunction") : NULL;
  launch_t launch = lib ? (launch_t)dlsym(lib, "cuLaunchKernel") : NULL;
  void *mod = NULL, *fn = NULL, *stream = NULL;
  if (!launch || !load || !get || load(&mod, ptx) != 0 || get(&fn, mod, "noop") != 0 || flame_ctx_stream(ctx, &stream) != FLAME_OK) {
    fprintf(stderr, "raw launch: driver setup failed\n");
    return;
  }
  double a[3] = {0, 0, 0};
  unsigned long long p = 0, len = 1;
  void* args[] = {a, &p, &len, &p, &p, &p};
  for (int i = 0; i < 2000; ++i) launch(fn, 1, 1, 1, 256, 1, 1, 0, stream, args, NULL);
  CHECK(flame_ctx_synchronize(ctx));
  double t0 = now_us();
  for (int i = 0; i < n; ++i) launch(fn, 1, 1, 1, 256, 1, 1, 0, stream, args, NULL);
  double t1 = now_us();
  CHECK(flame_ctx_synchronize(ctx));
  report("part_raw_cuLaunchKernel", t0, t1, n);
}

/* A captured graph of `chain` 1-element adds (each result released inside the capture, so its
 * block is reused), replayed `reps` times: wall time per replayed kernel, launch and GPU execution
 * included (the T0 graph row; target <= 1 us per kernel). */
static void run_graph(flame_ctx_t ctx, const char* name, flame_tensor_t a, flame_tensor_t b, int chain, int reps) {
  flame_tensor_t keep = NULL;
  CHECK(flame_graph_capture_begin(ctx));
  for (int i = 0; i < chain; ++i) {
    flame_tensor_t c = NULL;
    CHECK(flame_add(i == 0 ? a : keep, b, &c));
    flame_tensor_release(keep);
    keep = c;
  }
  flame_graph_t g = NULL;
  CHECK(flame_graph_capture_end(ctx, &g));
  for (int i = 0; i < 50; ++i) CHECK(flame_graph_replay(g));
  CHECK(flame_ctx_synchronize(ctx));
  double t0 = now_us();
  for (int i = 0; i < reps; ++i) CHECK(flame_graph_replay(g));
  CHECK(flame_ctx_synchronize(ctx));
  printf("{\"name\": \"%s\", \"us_per_op\": %.4f}\n", name, (now_us() - t0) / ((double)reps * chain));
  fflush(stdout);
  flame_graph_release(g);
  flame_tensor_release(keep);
}

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 20000;
  const char* only = argc > 2 ? argv[2] : NULL; /* one case (for a host profiler): add_1elem, ... */
  flame_ctx_options_t o;
  flame_ctx_options_init(&o);
  flame_ctx_t ctx = NULL;
  flame_status_t st = flame_ctx_create(&o, &ctx);
  if (st != FLAME_OK) {
    fprintf(stderr, "no GPU: %s\n", flame_last_error_message());
    return 2;
  }
  const int64_t one[1] = {1}, sq[2] = {64, 64};
  flame_tensor_t a, b, ag, m1, m2;
  CHECK(flame_full(ctx, one, 1, FLAME_DTYPE_F32, 1.0, &a));
  CHECK(flame_full(ctx, one, 1, FLAME_DTYPE_F32, 2.0, &b));
  CHECK(flame_full(ctx, one, 1, FLAME_DTYPE_F32, 3.0, &ag));
  CHECK(flame_tensor_set_requires_grad(ag, 1));
  CHECK(flame_randn(ctx, sq, 2, FLAME_DTYPE_F32, &m1));
  CHECK(flame_randn(ctx, sq, 2, FLAME_DTYPE_F32, &m2));
#define WANT(name) (!only || strcmp(only, name) == 0)
  if (WANT("add_1elem")) run(ctx, "add_1elem", flame_add, a, b, n);
  if (WANT("add_1elem_autograd")) run(ctx, "add_1elem_autograd", flame_add, ag, b, n);
  if (WANT("matmul_64x64_f32")) run(ctx, "matmul_64x64_f32", flame_matmul, m1, m2, n);
  if (WANT("parts") || WANT("part_view")) run_parts(ctx, a, n, only && strcmp(only, "part_view") == 0);
  if (WANT("parts") || WANT("part_raw_cuLaunchKernel")) run_raw_launch(ctx, n);
  if (WANT("add_1elem_graph")) run_graph(ctx, "add_1elem_graph", a, b, 100, n / 100 > 10 ? n / 100 : 10);
  flame_tensor_release(a);
  flame_tensor_release(b);
  flame_tensor_release(ag);
  flame_tensor_release(m1);
  flame_tensor_release(m2);
  flame_ctx_destroy(ctx);
  return 0;
}

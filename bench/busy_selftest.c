/* flame_bench_busy_selftest: checks the interval arithmetic behind flame_bench_model_step --busy
 * (cupti_busy.c's busy_clip and busy_union_ns) on hand-made intervals; no GPU, no CUPTI needed. With
 * CUPTI built in, also checks that a trace starts and stops cleanly with no device work (no records).
 * Exit 0 when every check holds, 1 otherwise (each failure printed). */
#include <stdio.h>
#include <stdlib.h>

#include "cupti_busy.h"

static int failures = 0;

static void expect_u64(const char* what, uint64_t got, uint64_t want) {
  if (got == want) return;
  fprintf(stderr, "busy_selftest: %s: got %llu, want %llu\n", what, (unsigned long long)got, (unsigned long long)want);
  ++failures;
}

static uint64_t union_of(const BusyInterval* in, size_t n) {
  BusyInterval v[16];
  for (size_t i = 0; i < n; ++i) v[i] = in[i];
  return busy_union_ns(v, n);
}

static void check_union(void) {
  expect_u64("empty", busy_union_ns(NULL, 0), 0);
  const BusyInterval one[] = {{10, 25}};
  expect_u64("one interval", union_of(one, 1), 15);
  const BusyInterval disjoint[] = {{50, 60}, {10, 20}, {30, 35}};  /* unsorted on purpose */
  expect_u64("disjoint", union_of(disjoint, 3), 10 + 10 + 5);
  const BusyInterval overlap[] = {{10, 30}, {20, 40}, {35, 50}};  /* a chain: [10, 50) */
  expect_u64("overlapping chain", union_of(overlap, 3), 40);
  const BusyInterval nested[] = {{0, 100}, {10, 20}, {30, 90}, {99, 100}};  /* all inside the first */
  expect_u64("nested", union_of(nested, 4), 100);
  const BusyInterval touching[] = {{0, 10}, {10, 20}, {25, 30}};  /* [0, 20) and [25, 30) */
  expect_u64("touching", union_of(touching, 3), 25);
  const BusyInterval empty_ones[] = {{5, 5}, {9, 3}, {40, 45}};  /* zero-length and reversed count nothing */
  expect_u64("empty intervals", union_of(empty_ones, 3), 5);
  const BusyInterval two_streams[] = {{0, 40}, {100, 140}, {30, 110}, {200, 210}, {205, 220}};
  expect_u64("two streams", union_of(two_streams, 5), 140 + 20);
}

static void check_clip(void) {
  BusyInterval v[] = {{0, 5}, {5, 15}, {12, 18}, {20, 30}, {25, 40}, {50, 60}};
  const size_t kept = busy_clip(v, 6, 10, 30);
  expect_u64("clip: kept", kept, 4);  /* [0,5) and [50,60) lie outside, [20,30) and [25,40) are cut */
  if (kept == 4) {
    expect_u64("clip: first start", v[0].start, 10);
    expect_u64("clip: first end", v[0].end, 15);
    expect_u64("clip: third start", v[2].start, 20);
    expect_u64("clip: last start", v[3].start, 25);
    expect_u64("clip: last end", v[3].end, 30);
  }
  expect_u64("clip then union", busy_union_ns(v, kept), (18 - 10) + (30 - 20));
}

static void check_trace(void) {
  char err[256] = "";
  if (!busy_built_with_cupti()) {  /* without CUPTI: a clear error, never a number */
    if (busy_trace_start(err, sizeof err) != -1 || !err[0]) {
      fprintf(stderr, "busy_selftest: busy_trace_start without CUPTI must fail with a message\n");
      ++failures;
    }
    printf("busy_selftest: built without CUPTI (%s)\n", err);
    return;
  }
  /* CUPTI present: starting needs no device (no context); a second start fails; stop hands back nothing.
   * A machine whose CUPTI cannot start without a driver prints why and skips this part. */
  if (busy_trace_start(err, sizeof err) != 0) {
    printf("busy_selftest: CUPTI trace not started here (%s): interval checks only\n", err);
    return;
  }
  char err2[256] = "";
  if (busy_trace_start(err2, sizeof err2) != -1) {
    fprintf(stderr, "busy_selftest: a second busy_trace_start must fail\n");
    ++failures;
  }
  BusyInterval* v = NULL;
  size_t n = 1, untimed = 1, dropped = 1;
  if (busy_trace_stop(&v, &n, &untimed, &dropped, err, sizeof err) != 0) {
    fprintf(stderr, "busy_selftest: busy_trace_stop: %s\n", err);
    ++failures;
  } else {
    expect_u64("records with no device work", n, 0);
    expect_u64("dropped", dropped, 0);
  }
  free(v);
}

int main(void) {
  check_union();
  check_clip();
  check_trace();
  if (failures) {
    fprintf(stderr, "busy_selftest: %d check(s) failed\n", failures);
    return 1;
  }
  printf("busy_selftest: all checks passed\n");
  return 0;
}

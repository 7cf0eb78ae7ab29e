/* GPU busy fraction for flame_bench_model_step --busy: how much of a stretch of wall-clock time the device
 * spent running at least one kernel, memcpy or memset.
 *
 * Design: FLAME keeps no device-time counter, so the bench asks CUPTI's activity API (a bench-only
 * dependency: libflame never links CUPTI) for the device interval [start, end) of every kernel
 * (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: kernels replayed from a CUDA graph are reported one by one,
 * like eager ones), memcpy and memset between busy_trace_start and busy_trace_stop. The busy time is
 * the length of the union of those intervals (overlapping kernels on several streams count once),
 * clipped to the measured window; busy fraction = busy time / window. The interval arithmetic
 * (busy_clip, busy_union_ns) is plain C and always built, so that bench/busy_selftest.c checks it
 * without a GPU; the CUPTI part is built only with FLAME_BENCH_HAVE_CUPTI (CMake found CUDA::cupti),
 * otherwise busy_trace_start fails with "built without CUPTI".
 *
 * CUPTI hands its record buffers to callbacks that carry no user pointer, so the trace lives in one
 * collector inside cupti_busy.c: one trace at a time per process (a second start fails). */
#ifndef FLAME_BENCH_CUPTI_BUSY_H
#define FLAME_BENCH_CUPTI_BUSY_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  uint64_t start, end; /* ns; end <= start is an empty interval */
} BusyInterval;

/* Keeps the parts of the n intervals of v that lie inside [lo, hi), clipped to it, moved to the front of
 * v in their order; returns how many were kept. */
size_t busy_clip(BusyInterval* v, size_t n, uint64_t lo, uint64_t hi);

/* The length of the union of the n intervals of v (sorts v by start); 0 for n == 0. */
uint64_t busy_union_ns(BusyInterval* v, size_t n);

/* 1 when this build can trace (CUPTI found at build time), else 0. */
int busy_built_with_cupti(void);

/* Starts recording kernel, memcpy and memset activity. Returns 0, or -1 with a message in err (err_len
 * bytes, always terminated): built without CUPTI, a trace already running, or CUPTI's own error. */
int busy_trace_start(char* err, size_t err_len);

/* CUPTI's clock in ns (the clock of the records): the bounds of the measured window. 0 without CUPTI. */
uint64_t busy_timestamp_ns(void);

/* Flushes and stops the trace started by busy_trace_start. On success returns 0 and hands over the
 * recorded intervals (*out, *n; the caller frees *out; *out is NULL when n is 0), how many records had
 * no timestamps (*untimed) and how many CUPTI dropped (*dropped). On failure returns -1 with err set,
 * *out NULL and *n 0; the trace is stopped either way. Device work must be finished (synchronised). */
int busy_trace_stop(BusyInterval** out, size_t* n, size_t* untimed, size_t* dropped, char* err, size_t err_len);

#endif /* FLAME_BENCH_CUPTI_BUSY_H */

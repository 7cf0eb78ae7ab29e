/* The GPU busy fraction's two halves (see cupti_busy.h): interval arithmetic, always built, and a CUPTI
 * activity trace of kernels, memcpys and memsets, built with FLAME_BENCH_HAVE_CUPTI only. CUPTI asks
 * for record buffers and returns them filled through callbacks without a user pointer (possibly from its
 * own thread), so the collector is this file's one static, guarded by a mutex. */
#define _POSIX_C_SOURCE 200809L
#include "cupti_busy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int by_start(const void* a, const void* b) {
  const BusyInterval *x = a, *y = b;
  return (x->start > y->start) - (x->start < y->start);
}

size_t busy_clip(BusyInterval* v, size_t n, uint64_t lo, uint64_t hi) {
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t s = v[i].start > lo ? v[i].start : lo;
    const uint64_t e = v[i].end < hi ? v[i].end : hi;
    if (e <= s) continue;
    v[kept].start = s;
    v[kept].end = e;
    ++kept;
  }
  return kept;
}

uint64_t busy_union_ns(BusyInterval* v, size_t n) {
  if (n == 0) return 0;
  qsort(v, n, sizeof *v, by_start);
  uint64_t total = 0, run_start = 0, run_end = 0;
  int open = 0;
  for (size_t i = 0; i < n; ++i) {
    if (v[i].end <= v[i].start) continue;
    if (open && v[i].start <= run_end) {  /* overlaps or touches the current run: extend it */
      if (v[i].end > run_end) run_end = v[i].end;
      continue;
    }
    if (open) total += run_end - run_start;
    run_start = v[i].start;
    run_end = v[i].end;
    open = 1;
  }
  if (open) total += run_end - run_start;
  return total;
}

static void set_error(char* err, size_t err_len, const char* what) {
  if (err && err_len) snprintf(err, err_len, "%s", what);
}

#ifndef FLAME_BENCH_HAVE_CUPTI

int busy_built_with_cupti(void) { return 0; }

static const char kNoCupti[] =
    "built without CUPTI: --busy needs CUDA's CUPTI library (CUDA::cupti) found when configuring with CMake";

int busy_trace_start(char* err, size_t err_len) {
  set_error(err, err_len, kNoCupti);
  return -1;
}

uint64_t busy_timestamp_ns(void) { return 0; }

int busy_trace_stop(BusyInterval** out, size_t* n, size_t* untimed, size_t* dropped, char* err, size_t err_len) {
  if (out) *out = NULL;
  if (n) *n = 0;
  if (untimed) *untimed = 0;
  if (dropped) *dropped = 0;
  set_error(err, err_len, kNoCupti);
  return -1;
}

#else /* FLAME_BENCH_HAVE_CUPTI */

#include <cupti.h>
#include <pthread.h>

/* The record layouts of this CUPTI (the fields read, start and end, sit at the same place in each). */
#if CUPTI_API_VERSION >= 130000
typedef CUpti_ActivityKernel10 KernelRecord;
typedef CUpti_ActivityMemcpy6 MemcpyRecord;
#else
typedef CUpti_ActivityKernel9 KernelRecord;
typedef CUpti_ActivityMemcpy5 MemcpyRecord;
#endif
typedef CUpti_ActivityMemset4 MemsetRecord;

enum { kBufferBytes = 8 << 20, kBufferAlign = 8 };

static const CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                            CUPTI_ACTIVITY_KIND_MEMSET};

static struct {
  pthread_mutex_t lock;
  int callbacks_registered, running, out_of_memory;
  BusyInterval* v;
  size_t n, cap, untimed, dropped;
} collector = {PTHREAD_MUTEX_INITIALIZER, 0, 0, 0, NULL, 0, 0, 0, 0};

int busy_built_with_cupti(void) { return 1; }

static void cupti_error(char* err, size_t err_len, const char* call, CUptiResult r) {
  const char* text = NULL;
  if (cuptiGetResultString(r, &text) != CUPTI_SUCCESS || !text) text = "unknown CUPTI error";
  if (err && err_len) snprintf(err, err_len, "%s failed: %s", call, text);
}

static void append_locked(uint64_t start, uint64_t end) {
  if (start == 0 && end == 0) {  /* CUPTI could not time this one */
    ++collector.untimed;
    return;
  }
  if (collector.n == collector.cap) {
    const size_t cap = collector.cap ? collector.cap * 2 : 65536;
    BusyInterval* grown = realloc(collector.v, cap * sizeof *grown);
    if (!grown) {
      collector.out_of_memory = 1;
      return;
    }
    collector.v = grown;
    collector.cap = cap;
  }
  collector.v[collector.n].start = start;
  collector.v[collector.n].end = end;
  ++collector.n;
}

static void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  void* p = NULL;
  if (posix_memalign(&p, kBufferAlign, kBufferBytes) != 0) p = NULL;  /* CUPTI counts the records it drops */
  *buffer = p;
  *size = p ? kBufferBytes : 0;
  *max_records = 0;  /* as many as fit */
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream_id, uint8_t* buffer, size_t size, size_t valid) {
  (void)size;
  pthread_mutex_lock(&collector.lock);
  CUpti_Activity* record = NULL;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const KernelRecord* k = (const KernelRecord*)record;
        append_locked(k->start, k->end);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const MemcpyRecord* m = (const MemcpyRecord*)record;
        append_locked(m->start, m->end);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const MemsetRecord* m = (const MemsetRecord*)record;
        append_locked(m->start, m->end);
        break;
      }
      default:
        break;
    }
  }
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(ctx, stream_id, &dropped) == CUPTI_SUCCESS) collector.dropped += dropped;
  pthread_mutex_unlock(&collector.lock);
  free(buffer);
}

static void disable_kinds(void) {
  for (size_t i = 0; i < sizeof kKinds / sizeof kKinds[0]; ++i) cuptiActivityDisable(kKinds[i]);
}

int busy_trace_start(char* err, size_t err_len) {
  pthread_mutex_lock(&collector.lock);
  const int already = collector.running;
  if (!already) {
    free(collector.v);
    collector.v = NULL;
    collector.n = collector.cap = collector.untimed = collector.dropped = 0;
    collector.out_of_memory = 0;
  }
  pthread_mutex_unlock(&collector.lock);
  if (already) {
    set_error(err, err_len, "busy_trace_start: a trace is already running");
    return -1;
  }
  CUptiResult r = CUPTI_SUCCESS;
  if (!collector.callbacks_registered) {
    r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    if (r != CUPTI_SUCCESS) {
      cupti_error(err, err_len, "cuptiActivityRegisterCallbacks", r);
      return -1;
    }
    collector.callbacks_registered = 1;
  }
  for (size_t i = 0; i < sizeof kKinds / sizeof kKinds[0]; ++i) {
    r = cuptiActivityEnable(kKinds[i]);
    if (r != CUPTI_SUCCESS) {
      disable_kinds();
      cupti_error(err, err_len, "cuptiActivityEnable", r);
      return -1;
    }
  }
  collector.running = 1;
  return 0;
}

uint64_t busy_timestamp_ns(void) {
  uint64_t t = 0;
  if (cuptiGetTimestamp(&t) != CUPTI_SUCCESS) return 0;
  return t;
}

int busy_trace_stop(BusyInterval** out, size_t* n, size_t* untimed, size_t* dropped, char* err, size_t err_len) {
  *out = NULL;
  *n = 0;
  *untimed = *dropped = 0;
  if (!collector.running) {
    set_error(err, err_len, "busy_trace_stop: no trace is running");
    return -1;
  }
  /* records of finished work reach buffer_completed on a forced flush; a second flush after disabling
   * catches any record completed in between */
  CUptiResult r = cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  disable_kinds();
  const CUptiResult r2 = cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  if (r == CUPTI_SUCCESS) r = r2;
  pthread_mutex_lock(&collector.lock);
  collector.running = 0;
  const int oom = collector.out_of_memory;
  BusyInterval* v = collector.v;
  const size_t count = collector.n;
  *untimed = collector.untimed;
  *dropped = collector.dropped;
  collector.v = NULL;
  collector.n = collector.cap = 0;
  pthread_mutex_unlock(&collector.lock);
  if (r != CUPTI_SUCCESS || oom) {
    free(v);
    if (oom)
      set_error(err, err_len, "busy_trace_stop: out of host memory for the activity records");
    else
      cupti_error(err, err_len, "cuptiActivityFlushAll", r);
    return -1;
  }
  *out = count ? v : NULL;
  if (!count) free(v);
  *n = count;
  return 0;
}

#endif /* FLAME_BENCH_HAVE_CUPTI */

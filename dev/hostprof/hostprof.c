/* A sampling host profiler for machines without perf (the device): LD_PRELOAD it, and every
 * HOSTPROF_US microseconds of the main thread's CPU time a signal records its stack (backtrace).
 * At exit each sample is written to $HOSTPROF_OUT as one line of "object+offset" frames, which
 * dev/hostprof/report.py resolves with addr2line and sums per function (self and inclusive).
 * Build: cc -O2 -shared -fPIC dev/hostprof/hostprof.c -o build/hostprof.so -lrt */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAX_SAMPLES 200000
#define DEPTH 40
static void* frames[MAX_SAMPLES][DEPTH];
static int depths[MAX_SAMPLES];
static volatile int nsamples;
static timer_t timer;

static void on_tick(int sig) {
  (void)sig;
  int i = nsamples;
  if (i >= MAX_SAMPLES) return;
  depths[i] = backtrace(frames[i], DEPTH);
  nsamples = i + 1;
}

__attribute__((constructor)) static void start(void) {
  void* warm[4];
  backtrace(warm, 4);  // loads libgcc's unwinder outside the signal handler
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_tick;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGPROF, &sa, NULL);
  struct sigevent ev;
  memset(&ev, 0, sizeof ev);
  ev.sigev_notify = SIGEV_THREAD_ID;
  ev.sigev_signo = SIGPROF;
  ev._sigev_un._tid = (pid_t)syscall(SYS_gettid);
  if (timer_create(CLOCK_THREAD_CPUTIME_ID, &ev, &timer) != 0) return;
  const char* us = getenv("HOSTPROF_US");
  long period = us ? atol(us) : 200;
  struct itimerspec its = {{0, period * 1000}, {0, period * 1000}};
  timer_settime(timer, 0, &its, NULL);
}

__attribute__((destructor)) static void stop(void) {
  struct itimerspec off;
  memset(&off, 0, sizeof off);
  timer_settime(timer, 0, &off, NULL);
  const char* path = getenv("HOSTPROF_OUT");
  FILE* f = fopen(path ? path : "hostprof.txt", "w");
  if (!f) return;
  for (int i = 0; i < nsamples; ++i) {
    for (int d = 0; d < depths[i]; ++d) {
      Dl_info info;
      if (dladdr(frames[i][d], &info) && info.dli_fname)
        fprintf(f, "%s+0x%lx ", info.dli_fname, (unsigned long)((char*)frames[i][d] - (char*)info.dli_fbase - (d ? 1 : 0)));
      else
        fprintf(f, "?+0x%lx ", (unsigned long)frames[i][d]);
    }
    fputc('\n', f);
  }
  fclose(f);
}

/* Host helpers shared by the GPT-2 bench library (gpt2.c) and its standalone program (gpt2_main.c):
 * a monotonic clock in milliseconds and the xorshift64* generator of the synthetic batches. Include
 * after <time.h> and <stdint.h>, with _POSIX_C_SOURCE defined for clock_gettime. */
#ifndef FLAME_BENCH_UTIL_H
#define FLAME_BENCH_UTIL_H

static inline double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static inline uint64_t rng_next(uint64_t* s) { /* xorshift64* */
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 2685821657736338717ull;
}

#endif /* FLAME_BENCH_UTIL_H */

/* Shared helpers for the native core: monotonic clock and thread spawning. */
#ifndef MB_COMMON_H
#define MB_COMMON_H
#include <stddef.h>
#include <stdint.h>
#include <time.h>

static inline double mb_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Copy bandwidth: `threads` threads each copy their slice of a `size_bytes` buffer.
 * Fills times_s[iters] with wall time per iteration. Returns 0, or an errno value. */
int mb_memcpy_run(size_t size_bytes, int threads, int iters, double *times_s);

#endif

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

/* TCP link loops over already-connected sockets (non-blocking). role 0 sends (uni) or
 * initiates (pingpong); role 1 receives or responds. Fills times_s[iters]; returns 0 or an
 * errno value (ETIMEDOUT when nothing moved for timeout_s, ECONNRESET when the peer left). */
enum { MB_LINK_UNI = 0, MB_LINK_BIDIR = 1, MB_LINK_PINGPONG = 2 };
int mb_tcp_link_run(const int *fds, int nfds, int role, int mode, size_t size, int iters, double timeout_s,
                    double *times_s);

#endif

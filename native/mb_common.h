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
 * Fills times_s[iters] with wall time per iteration. *kernel is one of MB_COPY_*; AUTO is
 * replaced by the kernel that ran. Returns 0, or an errno value. */
enum { MB_COPY_AUTO = 0, MB_COPY_LIBC = 1, MB_COPY_STREAM = 2 };
int mb_memcpy_run(size_t size_bytes, int threads, int iters, double *times_s, int *kernel);

/* Storage engine (io_engine.c). */
enum { MB_ENGINE_AUTO = 0, MB_ENGINE_THREADS = 1, MB_ENGINE_URING = 2 };

typedef struct {
  const char *path; /* an existing file; the engine never creates or truncates */
  int write, direct, random, do_fsync, engine, threads, qd;
  size_t bs;
  uint64_t size; /* bytes of the file to cover, split into equal per-worker slices */
  uint64_t seed;
} mb_io_params;

typedef struct {
  uint64_t bytes, ios, lat_samples;
  double seconds, lat_p50_us, lat_p99_us, lat_p999_us, lat_max_us, lat_mean_us;
  int engine_used, workers;
} mb_io_result;

/* Returns 0, or an errno value (EINVAL for misaligned O_DIRECT, ENOSPC, EROFS, ...). */
int mb_io_run(const mb_io_params *p, mb_io_result *out);
int mb_io_uring_available(void);
/* TCP link loops over already-connected sockets (non-blocking). role 0 sends (uni) or
 * initiates (pingpong); role 1 receives or responds. Fills times_s[iters]; returns 0 or an
 * errno value (ETIMEDOUT when nothing moved for timeout_s, ECONNRESET when the peer left). */
enum { MB_LINK_UNI = 0, MB_LINK_BIDIR = 1, MB_LINK_PINGPONG = 2 };
int mb_tcp_link_run(const int *fds, int nfds, int role, int mode, size_t size, int iters, double timeout_s,
                    double *times_s);

/* dataload's sample check (sample_check.c): 1 when `data` is not sample `index`'s bytes. */
int mb_sample_wrong(int64_t index, const unsigned char *data, size_t size, uint64_t low, uint64_t high,
                    const unsigned char *base, size_t base_len, uint64_t span, uint64_t stride);
int64_t mb_member_index(const char *name, size_t len);

#endif

/* Host memcpy bandwidth: the ceiling every storage and network result is held against.
 *
 * Each thread stamps its own copy's start and end; an iteration lasts from the first start to
 * the last end. Timing from the coordinating thread instead (stamp after the start barrier,
 * again after the stop barrier) was wrong both ways on a busy machine: waking a worker can
 * preempt the waker, so the copy sometimes ran before the first stamp (64 MiB in 0.00-2.6 ms)
 * and sometimes the stamp waited for a slow wake-up (26 ms).
 *
 * Buffers are allocated and touched once per call, outside the timed copies, 2 MiB aligned
 * and advised as transparent huge pages, as numpy does for large arrays: both copies then pay
 * the same TLB cost, so the native and the fallback ceilings measure the same thing. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "mb_common.h"

#define HUGE_ALIGN (2u << 20)

typedef struct {
  char *src, *dst;
  size_t len;
  int iters;
  double *t_start, *t_end;  /* per iteration, this thread's own stamps */
  pthread_barrier_t *start;
} slice_t;

static void *copy_worker(void *arg) {
  slice_t *s = (slice_t *)arg;
  for (int i = 0; i < s->iters; i++) {
    pthread_barrier_wait(s->start);
    s->t_start[i] = mb_now();
    memcpy(s->dst, s->src, s->len);
    s->t_end[i] = mb_now();
  }
  return NULL;
}

static char *huge_buffer(size_t size_bytes) {
  char *p = NULL;
  if (posix_memalign((void **)&p, HUGE_ALIGN, size_bytes)) return NULL;
  madvise(p, size_bytes, MADV_HUGEPAGE); /* advice only: without THP it is plain pages */
  return p;
}

int mb_memcpy_run(size_t size_bytes, int threads, int iters, double *times_s) {
  if (threads < 1 || iters < 1 || size_bytes < (size_t)threads) return EINVAL;
  char *src = huge_buffer(size_bytes), *dst = huge_buffer(size_bytes);
  if (!src || !dst) { free(src); free(dst); return ENOMEM; }
  /* Touch every page so first-touch faults are not timed. */
  memset(src, 0x5a, size_bytes);
  memset(dst, 0, size_bytes);

  pthread_barrier_t start;
  /* Workers wait for each other (not for this thread) so no copy starts before all can. */
  pthread_barrier_init(&start, NULL, (unsigned)threads);
  pthread_t *tids = calloc((size_t)threads, sizeof(pthread_t));
  slice_t *slices = calloc((size_t)threads, sizeof(slice_t));
  double *stamps = calloc((size_t)threads * (size_t)iters * 2, sizeof(double));
  int rc = (tids && slices && stamps) ? 0 : ENOMEM, started = 0;
  size_t chunk = (size_bytes / (size_t)threads) & ~(size_t)63;
  for (int t = 0; rc == 0 && t < threads; t++) {
    size_t off = chunk * (size_t)t;
    size_t len = (t == threads - 1) ? size_bytes - off : chunk;
    double *mine = stamps + (size_t)t * (size_t)iters * 2;
    slices[t] = (slice_t){src + off, dst + off, len, iters, mine, mine + iters, &start};
    if (pthread_create(&tids[t], NULL, copy_worker, &slices[t])) { rc = EAGAIN; break; }
    started++;
  }
  /* On a failed start the started threads are stuck at the barrier; a run that cannot
   * create its threads is rare enough that we detach and leak rather than deadlock. */
  for (int t = 0; t < started; t++) {
    if (rc == 0) pthread_join(tids[t], NULL); else pthread_detach(tids[t]);
  }
  if (rc == 0) {
    for (int i = 0; i < iters; i++) {
      double first = slices[0].t_start[i], last = slices[0].t_end[i];
      for (int t = 1; t < threads; t++) {
        if (slices[t].t_start[i] < first) first = slices[t].t_start[i];
        if (slices[t].t_end[i] > last) last = slices[t].t_end[i];
      }
      times_s[i] = last - first;
    }
    pthread_barrier_destroy(&start);
    free(src);
    free(dst);
    free(stamps);
  }
  free(tids);
  free(slices);
  return rc;
}

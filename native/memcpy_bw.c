/* Host memcpy bandwidth: the ceiling every storage and network result is held against.
 * Threads are created once per run and released together per iteration by a barrier, so
 * thread start-up is outside the timed region (as in STREAM's copy kernel). */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "mb_common.h"

typedef struct {
  char *src, *dst;
  size_t len;
  int iters;
  pthread_barrier_t *start, *stop;
} slice_t;

static void *copy_worker(void *arg) {
  slice_t *s = (slice_t *)arg;
  for (int i = 0; i < s->iters; i++) {
    pthread_barrier_wait(s->start);
    memcpy(s->dst, s->src, s->len);
    pthread_barrier_wait(s->stop);
  }
  return NULL;
}

int mb_memcpy_run(size_t size_bytes, int threads, int iters, double *times_s) {
  if (threads < 1 || iters < 1 || size_bytes < (size_t)threads) return EINVAL;
  char *src = NULL, *dst = NULL;
  if (posix_memalign((void **)&src, 4096, size_bytes)) return ENOMEM;
  if (posix_memalign((void **)&dst, 4096, size_bytes)) { free(src); return ENOMEM; }
  /* Touch every page so first-touch faults are not timed. */
  memset(src, 0x5a, size_bytes);
  memset(dst, 0, size_bytes);

  pthread_barrier_t start, stop;
  pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
  pthread_barrier_init(&stop, NULL, (unsigned)threads + 1);
  pthread_t *tids = calloc((size_t)threads, sizeof(pthread_t));
  slice_t *slices = calloc((size_t)threads, sizeof(slice_t));
  size_t chunk = (size_bytes / (size_t)threads) & ~(size_t)63;
  int rc = 0, started = 0;
  for (int t = 0; t < threads; t++) {
    size_t off = chunk * (size_t)t;
    size_t len = (t == threads - 1) ? size_bytes - off : chunk;
    slices[t] = (slice_t){src + off, dst + off, len, iters, &start, &stop};
    if (pthread_create(&tids[t], NULL, copy_worker, &slices[t])) { rc = EAGAIN; break; }
    started++;
  }
  if (rc == 0) {
    for (int i = 0; i < iters; i++) {
      pthread_barrier_wait(&start);
      double t0 = mb_now();
      pthread_barrier_wait(&stop);
      times_s[i] = mb_now() - t0;
    }
  }
  /* On a failed start the started threads are stuck at the barrier; a run that cannot
   * create its threads is rare enough that we detach and leak rather than deadlock. */
  for (int t = 0; t < started; t++) {
    if (rc == 0) pthread_join(tids[t], NULL); else pthread_detach(tids[t]);
  }
  if (rc == 0) {
    pthread_barrier_destroy(&start);
    pthread_barrier_destroy(&stop);
    free(src);
    free(dst);
  }
  free(tids);
  free(slices);
  return rc;
}

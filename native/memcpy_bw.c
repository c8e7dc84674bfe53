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
 * the same TLB cost, so the native and the fallback ceilings measure the same thing.
 *
 * The ceiling must be the fastest copy the machine does, so there are two kernels: libc's
 * memcpy, and a copy with non-temporal (streaming) stores, which skips reading each
 * destination line into the cache before overwriting it. glibc picks streaming stores only
 * above a cache-size threshold that it sometimes misjudges: on the 2-core EPYC VM this was
 * written on, 64 MiB took 7.0 ms with memcpy and 3.7 ms streaming. MB_COPY_AUTO tries both,
 * untimed, and keeps the faster. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "mb_common.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define HUGE_ALIGN (2u << 20)

typedef void (*copy_fn)(char *dst, const char *src, size_t len);

static void copy_libc(char *dst, const char *src, size_t len) { memcpy(dst, src, len); }

#if defined(__x86_64__)
/* SSE2 is part of x86-64, so this kernel needs no run-time check. */
static void copy_stream(char *dst, const char *src, size_t len) {
  size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
  if (head > len) head = len;
  memcpy(dst, src, head);
  dst += head; src += head; len -= head;
  size_t body = len & ~(size_t)63;
  for (size_t i = 0; i < body; i += 64) {
    __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
    __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
    __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
    _mm_stream_si128((__m128i *)(dst + i), a);
    _mm_stream_si128((__m128i *)(dst + i + 16), b);
    _mm_stream_si128((__m128i *)(dst + i + 32), c);
    _mm_stream_si128((__m128i *)(dst + i + 48), d);
  }
  _mm_sfence(); /* streaming stores are weakly ordered: make them visible before "done" */
  memcpy(dst + body, src + body, len - body);
}
#define HAVE_STREAM 1
#else
#define copy_stream copy_libc
#define HAVE_STREAM 0
#endif

static copy_fn kernel_fn(int kernel) { return kernel == MB_COPY_STREAM ? copy_stream : copy_libc; }

/* The faster kernel on these buffers: the best of five copies with each, alternating, so a
 * burst of other work on the machine does not decide it. Best of three picked libc (1.6x slower
 * here) in at least one of 5 runs at load 13 on 2 cores, so the two ways of timing the ceiling disagreed
 * on the kernel, not the copy; five more copies cost ~40 ms once per case. */
static int pick_kernel(char *dst, const char *src, size_t len) {
  if (!HAVE_STREAM) return MB_COPY_LIBC;
  double best[2] = {1e30, 1e30};
  for (int round = 0; round < 5; round++) {
    for (int k = 0; k < 2; k++) {
      double t0 = mb_now();
      kernel_fn(k == 0 ? MB_COPY_LIBC : MB_COPY_STREAM)(dst, src, len);
      double t = mb_now() - t0;
      if (t < best[k]) best[k] = t;
    }
  }
  return best[1] < best[0] ? MB_COPY_STREAM : MB_COPY_LIBC;
}

typedef struct {
  char *src, *dst;
  size_t len;
  int iters;
  double *t_start, *t_end;  /* per iteration, this thread's own stamps */
  pthread_barrier_t *start;
  copy_fn copy;
  struct gate *gate;
} slice_t;

/* Workers first wait here until every one of them exists: the barrier below counts `threads`
 * waiters, so one that could not be created would leave the others waiting on it for ever (and
 * on this run's stack once it returned). Opened with go = 1, or -1 when a thread could not be
 * created: then the started ones leave before the barrier and are joined. */
struct gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int go;
};

static int gate_pass(struct gate *g) {
  pthread_mutex_lock(&g->mu);
  while (g->go == 0) pthread_cond_wait(&g->cv, &g->mu);
  int go = g->go;
  pthread_mutex_unlock(&g->mu);
  return go > 0;
}

static void gate_open(struct gate *g, int go) {
  pthread_mutex_lock(&g->mu);
  g->go = go;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

static void *copy_worker(void *arg) {
  slice_t *s = (slice_t *)arg;
  if (!gate_pass(s->gate)) return NULL;
  for (int i = 0; i < s->iters; i++) {
    pthread_barrier_wait(s->start);
    s->t_start[i] = mb_now();
    s->copy(s->dst, s->src, s->len);
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

int mb_memcpy_run(size_t size_bytes, int threads, int iters, double *times_s, int *kernel) {
  if (threads < 1 || iters < 1 || size_bytes < (size_t)threads) return EINVAL;
  char *src = huge_buffer(size_bytes), *dst = huge_buffer(size_bytes);
  if (!src || !dst) { free(src); free(dst); return ENOMEM; }
  /* Touch every page so first-touch faults are not timed. */
  memset(src, 0x5a, size_bytes);
  memset(dst, 0, size_bytes);
  if (*kernel == MB_COPY_AUTO) {
    *kernel = pick_kernel(dst, src, size_bytes);
    memset(dst, 0, size_bytes); /* so the check below sees the timed copies' bytes */
  }
  copy_fn copy = kernel_fn(*kernel);

  pthread_barrier_t start;
  struct gate gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
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
    slices[t] = (slice_t){src + off, dst + off, len, iters, mine, mine + iters, &start, copy, &gate};
    if (pthread_create(&tids[t], NULL, copy_worker, &slices[t])) { rc = EAGAIN; break; }
    started++;
  }
  gate_open(&gate, rc == 0 ? 1 : -1);
  for (int t = 0; t < started; t++) pthread_join(tids[t], NULL);
  /* A copy kernel that moves the wrong bytes must not report a ceiling (checked untimed). */
  if (rc == 0 && memcmp(src, dst, size_bytes) != 0) rc = EIO;
  if (rc == 0) {
    for (int i = 0; i < iters; i++) {
      double first = slices[0].t_start[i], last = slices[0].t_end[i];
      for (int t = 1; t < threads; t++) {
        if (slices[t].t_start[i] < first) first = slices[t].t_start[i];
        if (slices[t].t_end[i] > last) last = slices[t].t_end[i];
      }
      times_s[i] = last - first;
    }
  }
  pthread_barrier_destroy(&start);
  free(src);
  free(dst);
  free(stamps);
  free(tids);
  free(slices);
  return rc;
}

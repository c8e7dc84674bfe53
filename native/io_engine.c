/* The POSIX storage engine: `threads` workers move one file's bytes with pread/pwrite
 * (queue depth 1 each) or, for qd > 1, each drives its own io_uring with qd I/Os in flight.
 * Without io_uring (old kernel, seccomp) qd > 1 becomes threads x qd synchronous workers, so
 * the number of I/Os in flight stays what was asked for. Every I/O's latency (submit to
 * completion) is kept, sampled with a stride when there are very many, for p50/p99/p99.9.
 * The clock starts after every worker has its buffers and ring ready, and for writes stops
 * after fsync: bytes that are not durable are not written. */
#include <errno.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "mb_common.h"

#define MB_LAT_CAP (1u << 20) /* latency samples kept per worker */

typedef struct {
  int fd, ring_fd;
  unsigned *sq_head, *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
  struct io_uring_sqe *sqes;
  struct io_uring_cqe *cqes;
  void *sq_ptr, *cq_ptr;
  size_t sq_sz, cq_sz, sqes_sz;
} mb_ring;

/* Completions are only reaped by the thread that submits, inside io_uring_enter: telling the
 * kernel so (single issuer, deferred task work) saves an interrupt per completion. Kernels
 * before 6.1 refuse these flags, so fall back to fewer. */
static const unsigned ring_flag_sets[] = {
#if defined(IORING_SETUP_DEFER_TASKRUN) && defined(IORING_SETUP_SINGLE_ISSUER)
    IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
#endif
#ifdef IORING_SETUP_COOP_TASKRUN
    IORING_SETUP_COOP_TASKRUN,
#endif
    0};

static int ring_init(mb_ring *r, unsigned entries) {
  struct io_uring_params p;
  memset(r, 0, sizeof *r);
  int fd = -1;
  for (size_t i = 0; i < sizeof ring_flag_sets / sizeof ring_flag_sets[0] && fd < 0; i++) {
    memset(&p, 0, sizeof p);
    p.flags = ring_flag_sets[i];
    fd = (int)syscall(__NR_io_uring_setup, entries, &p);
    if (fd < 0 && errno != EINVAL) return errno;
  }
  if (fd < 0) return errno;
  r->ring_fd = fd;
  r->sq_sz = p.sq_off.array + p.sq_entries * sizeof(unsigned);
  r->cq_sz = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
  int single = (p.features & IORING_FEAT_SINGLE_MMAP) != 0;
  if (single) r->sq_sz = r->cq_sz = r->sq_sz > r->cq_sz ? r->sq_sz : r->cq_sz;
  r->sq_ptr = mmap(NULL, r->sq_sz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQ_RING);
  if (r->sq_ptr == MAP_FAILED) goto fail;
  r->cq_ptr = single ? r->sq_ptr
                     : mmap(NULL, r->cq_sz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_CQ_RING);
  if (r->cq_ptr == MAP_FAILED) goto fail;
  r->sqes_sz = p.sq_entries * sizeof(struct io_uring_sqe);
  r->sqes = mmap(NULL, r->sqes_sz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQES);
  if (r->sqes == MAP_FAILED) goto fail;
  char *sq = r->sq_ptr, *cq = r->cq_ptr;
  r->sq_head = (unsigned *)(sq + p.sq_off.head);
  r->sq_tail = (unsigned *)(sq + p.sq_off.tail);
  r->sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
  r->sq_array = (unsigned *)(sq + p.sq_off.array);
  r->cq_head = (unsigned *)(cq + p.cq_off.head);
  r->cq_tail = (unsigned *)(cq + p.cq_off.tail);
  r->cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
  r->cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
  return 0;
fail:;
  int err = errno;
  if (r->sq_ptr && r->sq_ptr != MAP_FAILED) munmap(r->sq_ptr, r->sq_sz);
  if (!single && r->cq_ptr && r->cq_ptr != MAP_FAILED) munmap(r->cq_ptr, r->cq_sz);
  close(fd);
  memset(r, 0, sizeof *r);
  return err;
}

static void ring_free(mb_ring *r) {
  if (r->sqes && r->sqes != MAP_FAILED) munmap(r->sqes, r->sqes_sz);
  if (r->cq_ptr && r->cq_ptr != r->sq_ptr && r->cq_ptr != MAP_FAILED) munmap(r->cq_ptr, r->cq_sz);
  if (r->sq_ptr && r->sq_ptr != MAP_FAILED) munmap(r->sq_ptr, r->sq_sz);
  if (r->ring_fd > 0) close(r->ring_fd);
}

int mb_io_uring_available(void) {
  mb_ring r;
  if (ring_init(&r, 2)) return 0;
  ring_free(&r);
  return 1;
}

/* Workers wait here until all are set up, so the clock times I/O and nothing else. */
struct gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int ready, go;
};

typedef struct {
  const mb_io_params *p;
  int fd, use_uring, depth;
  uint64_t start, len;  /* this worker's slice of the file */
  uint64_t *order;      /* block indices in issue order */
  uint64_t nblocks;
  char *buf;
  float *lat_us;
  uint64_t nlat, stride, done_ios, done_bytes;
  int err;
  struct gate *gate;
  mb_ring ring;
} worker;

static void note_latency(worker *w, uint64_t io_index, double seconds) {
  if (io_index % w->stride == 0 && w->nlat < MB_LAT_CAP) w->lat_us[w->nlat++] = (float)(seconds * 1e6);
}

/* One whole block with pread/pwrite, resuming after short transfers. */
static int sync_block(worker *w, uint64_t off, char *buf) {
  size_t bs = w->p->bs, done = 0;
  while (done < bs) {
    ssize_t n = w->p->write ? pwrite(w->fd, buf + done, bs - done, (off_t)(off + done))
                            : pread(w->fd, buf + done, bs - done, (off_t)(off + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return w->p->write ? ENOSPC : EIO; /* a read past the end: the file is too short */
    done += (size_t)n;
  }
  return 0;
}

static int run_sync(worker *w) {
  for (uint64_t i = 0; i < w->nblocks; i++) {
    uint64_t off = w->start + w->order[i] * w->p->bs;
    double t0 = mb_now();
    int rc = sync_block(w, off, w->buf);
    if (rc) return rc;
    note_latency(w, i, mb_now() - t0);
    w->done_ios++;
    w->done_bytes += w->p->bs;
  }
  return 0;
}

typedef struct {
  uint64_t off;
  size_t done;
  double t0;
  uint64_t index;
} slot_state;

static void uring_prep(worker *w, unsigned slot, slot_state *s) {
  mb_ring *r = &w->ring;
  unsigned tail = *r->sq_tail, idx = tail & *r->sq_mask;
  struct io_uring_sqe *sqe = &r->sqes[idx];
  memset(sqe, 0, sizeof *sqe);
  sqe->opcode = w->p->write ? IORING_OP_WRITE : IORING_OP_READ;
  sqe->fd = w->fd;
  sqe->off = s->off + s->done;
  sqe->addr = (uint64_t)(uintptr_t)(w->buf + (size_t)slot * w->p->bs + s->done);
  sqe->len = (unsigned)(w->p->bs - s->done);
  sqe->user_data = slot;
  r->sq_array[idx] = idx;
  __atomic_store_n(r->sq_tail, tail + 1, __ATOMIC_RELEASE);
}

static int run_uring(worker *w) {
  mb_ring *r = &w->ring;
  unsigned depth = (unsigned)w->depth;
  slot_state *slots = calloc(depth, sizeof *slots);
  if (!slots) return ENOMEM;
  uint64_t next = 0, inflight = 0;
  unsigned to_submit = 0;
  int rc = 0;
  for (unsigned s = 0; s < depth && next < w->nblocks; s++, next++) {
    slots[s] = (slot_state){w->start + w->order[next] * w->p->bs, 0, mb_now(), next};
    uring_prep(w, s, &slots[s]);
    to_submit++;
    inflight++;
  }
  while (inflight > 0) {
    int n = (int)syscall(__NR_io_uring_enter, r->ring_fd, to_submit, 1, IORING_ENTER_GETEVENTS, NULL, 0);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EBUSY) continue;
      rc = errno;
      break;
    }
    to_submit -= (unsigned)n < to_submit ? (unsigned)n : to_submit;
    unsigned head = *r->cq_head;
    while (head != __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE)) {
      struct io_uring_cqe *cqe = &r->cqes[head & *r->cq_mask];
      unsigned slot = (unsigned)cqe->user_data;
      int res = cqe->res;
      head++;
      slot_state *s = &slots[slot];
      if (res < 0) {
        rc = rc ? rc : -res;
        inflight--;
        continue;
      }
      if (res == 0 && !rc) rc = w->p->write ? ENOSPC : EIO;
      s->done += (size_t)res;
      if (!rc && s->done < w->p->bs) { /* short transfer: ask for the rest */
        uring_prep(w, slot, s);
        to_submit++;
        continue;
      }
      inflight--;
      if (rc) continue;
      note_latency(w, s->index, mb_now() - s->t0);
      w->done_ios++;
      w->done_bytes += w->p->bs;
      if (next < w->nblocks) {
        *s = (slot_state){w->start + w->order[next] * w->p->bs, 0, mb_now(), next};
        next++;
        uring_prep(w, slot, s);
        to_submit++;
        inflight++;
      }
    }
    __atomic_store_n(r->cq_head, head, __ATOMIC_RELEASE);
  }
  free(slots);
  return rc;
}

static void *worker_main(void *arg) {
  worker *w = arg;
  /* The ring is made by the thread that will submit to it: a single-issuer ring refuses others. */
  if (!w->err && w->use_uring) w->err = ring_init(&w->ring, (unsigned)w->depth);
  pthread_mutex_lock(&w->gate->mu);
  w->gate->ready++;
  pthread_cond_broadcast(&w->gate->cv);
  while (!w->gate->go) pthread_cond_wait(&w->gate->cv, &w->gate->mu);
  pthread_mutex_unlock(&w->gate->mu);
  if (!w->err) w->err = w->use_uring ? run_uring(w) : run_sync(w);
  return NULL;
}

static uint64_t xorshift(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *s = x;
}

/* Buffers carry pseudo-random bytes so compressing or deduplicating storage can't fake speed. */
static int worker_setup(worker *w, int index) {
  const mb_io_params *p = w->p;
  w->nblocks = w->len / p->bs;
  w->order = malloc((w->nblocks ? w->nblocks : 1) * sizeof(uint64_t));
  uint64_t cap = w->nblocks < MB_LAT_CAP ? w->nblocks : MB_LAT_CAP;
  w->stride = w->nblocks > MB_LAT_CAP ? (w->nblocks + MB_LAT_CAP - 1) / MB_LAT_CAP : 1;
  w->lat_us = malloc((cap ? cap : 1) * sizeof(float));
  size_t bufsz = (size_t)p->bs * (size_t)w->depth;
  /* Huge pages where the kernel allows them: O_DIRECT pins every user page of every I/O, and
   * a 16M block is 4096 small pages but 8 huge ones. */
  size_t align = bufsz >= (2u << 20) ? (2u << 20) : 4096;
  if (!w->order || !w->lat_us || posix_memalign((void **)&w->buf, align, bufsz)) return ENOMEM;
#ifdef MADV_HUGEPAGE
  if (align > 4096) madvise(w->buf, bufsz, MADV_HUGEPAGE);
#endif
  uint64_t seed = p->seed * 0x9E3779B97F4A7C15ull + (uint64_t)index + 1;
  uint64_t *words = (uint64_t *)w->buf;
  for (size_t i = 0; i < bufsz / 8; i++) words[i] = xorshift(&seed);
  for (uint64_t i = 0; i < w->nblocks; i++) w->order[i] = i;
  if (p->random)
    for (uint64_t i = w->nblocks; i > 1; i--) {
      uint64_t j = xorshift(&seed) % i, t = w->order[i - 1];
      w->order[i - 1] = w->order[j];
      w->order[j] = t;
    }
  return 0;
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

static double pick(const float *v, uint64_t n, double q) {
  if (!n) return 0.0;
  double pos = (double)(n - 1) * q;
  uint64_t lo = (uint64_t)pos, hi = lo + 1 < n ? lo + 1 : lo;
  return v[lo] + (v[hi] - v[lo]) * (pos - (double)lo);
}

int mb_io_run(const mb_io_params *p, mb_io_result *out) {
  memset(out, 0, sizeof *out);
  if (p->bs == 0 || p->threads < 1 || p->qd < 1) return EINVAL;
  int use_uring = 0;
  if (p->qd > 1 && p->engine != MB_ENGINE_THREADS) use_uring = mb_io_uring_available();
  if (p->engine == MB_ENGINE_URING && !use_uring) return ENOSYS;
  int nworkers = use_uring ? p->threads : p->threads * p->qd;
  int flags = (p->write ? O_WRONLY : O_RDONLY) | (p->direct ? O_DIRECT : 0);
  int fd = open(p->path, flags);
  if (fd < 0) return errno;
  if (!p->write) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED); /* read from the disk, not the cache */
  worker *ws = calloc((size_t)nworkers, sizeof *ws);
  pthread_t *tids = calloc((size_t)nworkers, sizeof *tids);
  struct gate gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
  int rc = 0, started = 0;
  if (!ws || !tids) {
    rc = ENOMEM;
    goto done;
  }
  uint64_t slice = p->size / (uint64_t)nworkers / p->bs * p->bs;
  for (int i = 0; i < nworkers; i++) {
    worker *w = &ws[i];
    *w = (worker){.p = p, .fd = fd, .use_uring = use_uring, .depth = use_uring ? p->qd : 1,
                  .start = (uint64_t)i * slice, .len = slice, .gate = &gate};
    w->err = worker_setup(w, i);
  }
  for (int i = 0; i < nworkers; i++) {
    if (pthread_create(&tids[i], NULL, worker_main, &ws[i])) {
      rc = EAGAIN;
      break;
    }
    started++;
  }
  if (started < nworkers) /* the ones that did start see the error and stop */
    for (int i = 0; i < nworkers; i++) ws[i].err = ws[i].err ? ws[i].err : ECANCELED;
  pthread_mutex_lock(&gate.mu);
  while (gate.ready < started) pthread_cond_wait(&gate.cv, &gate.mu);
  double t0 = mb_now();
  gate.go = 1;
  pthread_cond_broadcast(&gate.cv);
  pthread_mutex_unlock(&gate.mu);
  for (int i = 0; i < started; i++) pthread_join(tids[i], NULL);
  for (int i = 0; i < nworkers && !rc; i++) rc = ws[i].err;
  if (!rc && p->write && p->do_fsync && fsync(fd)) rc = errno;
  double t1 = mb_now();
  if (!rc) {
    uint64_t nlat = 0;
    for (int i = 0; i < nworkers; i++) {
      out->bytes += ws[i].done_bytes;
      out->ios += ws[i].done_ios;
      nlat += ws[i].nlat;
    }
    float *all = malloc((nlat ? nlat : 1) * sizeof(float));
    if (!all) {
      rc = ENOMEM;
      goto done;
    }
    uint64_t k = 0;
    double sum = 0.0;
    for (int i = 0; i < nworkers; i++)
      for (uint64_t j = 0; j < ws[i].nlat; j++) sum += (all[k++] = ws[i].lat_us[j]);
    qsort(all, nlat, sizeof(float), cmp_float);
    out->seconds = t1 - t0;
    out->lat_p50_us = pick(all, nlat, 0.50);
    out->lat_p99_us = pick(all, nlat, 0.99);
    out->lat_p999_us = pick(all, nlat, 0.999);
    out->lat_max_us = nlat ? all[nlat - 1] : 0.0;
    out->lat_mean_us = nlat ? sum / (double)nlat : 0.0;
    out->lat_samples = nlat;
    out->engine_used = use_uring ? MB_ENGINE_URING : MB_ENGINE_THREADS;
    out->workers = nworkers;
    free(all);
  }
done:
  if (ws)
    for (int i = 0; i < nworkers; i++) {
      if (ws[i].use_uring && ws[i].ring.ring_fd > 0) ring_free(&ws[i].ring);
      free(ws[i].order);
      free(ws[i].lat_us);
      free(ws[i].buf);
    }
  free(ws);
  free(tids);
  if (close(fd) && !rc && p->write) rc = errno;
  return rc;
}

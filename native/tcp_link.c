/* Point-to-point TCP loops for the link probe: bulk transfer (one direction or both) over N
 * connected streams, and ping-pong round trips. One thread drives every stream with
 * non-blocking send/recv and poll, so the cost per byte is the kernel's, not ours; each loop
 * times itself so no interpreter work falls inside a measured interval.
 *
 * Every wait is bounded: when no byte moves on any stream for `timeout_s`, the call returns
 * ETIMEDOUT (a link taken down mid-transfer must end the run, never hang it). A peer that
 * closes its end returns ECONNRESET. */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "mb_common.h"

#define MB_CHUNK (128u << 10) /* bytes per send/recv call: large enough to amortize syscalls */

typedef struct {
  const int *fds;
  int n;
  char *sbuf, *rbuf;
  size_t buf_len;
  double timeout_s;
} link_ctx;

/* Move send_left[i] bytes out of and recv_left[i] bytes into each stream i. Tries each
 * operation first and polls only when nothing moved, which keeps small round trips at
 * one syscall each way. *first_rx (if given) gets the time the first byte arrived. */
static int drive(link_ctx *c, size_t *send_left, size_t *recv_left, double *first_rx) {
  struct pollfd pfd[64];
  double last_progress = mb_now();
  for (;;) {
    int busy = 0, moved = 0;
    for (int i = 0; i < c->n; i++) {
      if (send_left[i]) {
        size_t want = send_left[i] < c->buf_len ? send_left[i] : c->buf_len;
        ssize_t k = send(c->fds[i], c->sbuf, want, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k > 0) {
          send_left[i] -= (size_t)k;
          moved = 1;
        } else if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          return errno;
        }
      }
      if (recv_left[i]) {
        size_t want = recv_left[i] < c->buf_len ? recv_left[i] : c->buf_len;
        ssize_t k = recv(c->fds[i], c->rbuf, want, MSG_DONTWAIT);
        if (k > 0) {
          if (first_rx && *first_rx == 0.0) *first_rx = mb_now();
          recv_left[i] -= (size_t)k;
          moved = 1;
        } else if (k == 0) {
          return ECONNRESET;
        } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          return errno;
        }
      }
      busy |= send_left[i] != 0 || recv_left[i] != 0;
    }
    if (!busy) return 0;
    double now = mb_now();
    if (moved) {
      last_progress = now;
      continue;
    }
    double left = c->timeout_s - (now - last_progress);
    if (left <= 0) return ETIMEDOUT;
    for (int i = 0; i < c->n; i++) {
      pfd[i].fd = c->fds[i];
      pfd[i].events = (short)((send_left[i] ? POLLOUT : 0) | (recv_left[i] ? POLLIN : 0));
      pfd[i].revents = 0;
    }
    int ms = (int)(left * 1000.0) + 1;
    if (poll(pfd, (nfds_t)c->n, ms > 100 ? 100 : ms) < 0 && errno != EINTR) return errno;
  }
}

static void split(size_t total, int n, size_t *parts) {
  for (int i = 0; i < n; i++) parts[i] = total / (size_t)n + ((size_t)i < total % (size_t)n ? 1 : 0);
}

static int one_way(link_ctx *c, int fd_index, int sending, size_t bytes, double *first_rx) {
  size_t s[64] = {0}, r[64] = {0};
  (sending ? s : r)[fd_index] = bytes;
  return drive(c, s, r, first_rx);
}

int mb_tcp_link_run(const int *fds, int nfds, int role, int mode, size_t size, int iters, double timeout_s,
                    double *times_s) {
  if (nfds < 1 || nfds > 64 || iters < 1 || size == 0) return EINVAL;
  link_ctx c = {fds, nfds, NULL, NULL, size < MB_CHUNK ? size : MB_CHUNK, timeout_s};
  c.sbuf = malloc(c.buf_len);
  c.rbuf = malloc(c.buf_len);
  if (!c.sbuf || !c.rbuf) {
    free(c.sbuf);
    free(c.rbuf);
    return ENOMEM;
  }
  memset(c.sbuf, 0x5A, c.buf_len);
  size_t parts[64], zero[64] = {0};
  split(size, nfds, parts);
  int rc = 0;
  double prev_end = 0.0;
  for (int it = 0; it < iters && !rc; it++) {
    size_t s[64], r[64];
    double t0 = mb_now(), first_rx = 0.0;
    if (mode == MB_LINK_UNI && role == 0) {
      /* Sender: from the first byte out to the receiver's 1-byte acknowledgement. */
      memcpy(s, parts, sizeof parts);
      rc = drive(&c, s, zero, NULL);
      if (!rc) rc = one_way(&c, 0, 0, 1, NULL);
      times_s[it] = mb_now() - t0;
    } else if (mode == MB_LINK_UNI) {
      /* Receiver: from the first byte in to the acknowledgement out. */
      memcpy(r, parts, sizeof parts);
      memset(s, 0, sizeof s);
      rc = drive(&c, s, r, &first_rx);
      if (!rc) rc = one_way(&c, 0, 1, 1, NULL);
      times_s[it] = mb_now() - (first_rx > 0 ? first_rx : t0);
    } else if (mode == MB_LINK_BIDIR) {
      /* Both directions at once; a 1-byte exchange first lines the two clocks up. */
      size_t s1[64] = {0}, r1[64] = {0};
      s1[0] = r1[0] = 1;
      rc = drive(&c, s1, r1, NULL);
      t0 = mb_now();
      memcpy(s, parts, sizeof parts);
      memcpy(r, parts, sizeof parts);
      if (!rc) rc = drive(&c, s, r, NULL);
      times_s[it] = mb_now() - t0;
    } else if (mode == MB_LINK_PINGPONG && role == 0) {
      rc = one_way(&c, 0, 1, size, NULL);
      if (!rc) rc = one_way(&c, 0, 0, size, NULL);
      times_s[it] = mb_now() - t0;
    } else if (mode == MB_LINK_PINGPONG) {
      /* Responder: the period between its echoes equals the initiator's round trip. */
      rc = one_way(&c, 0, 0, size, &first_rx);
      if (!rc) rc = one_way(&c, 0, 1, size, NULL);
      double end = mb_now();
      times_s[it] = end - (prev_end > 0 ? prev_end : (first_rx > 0 ? first_rx : t0));
      prev_end = end;
    } else {
      rc = EINVAL;
    }
  }
  free(c.sbuf);
  free(c.rbuf);
  return rc;
}

/* The one binding file: Python entry points over the native core. Every call that does I/O
 * or copies releases the GIL so other ranks' threads and the progress display keep going. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "mb_common.h"

static PyObject *times_to_list(const double *times, int n) {
  PyObject *list = PyList_New(n);
  if (!list) return NULL;
  for (int i = 0; i < n; i++) PyList_SET_ITEM(list, i, PyFloat_FromDouble(times[i]));
  return list;
}

/* Frees `times`; an errno from the native loop becomes OSError. */
static PyObject *finish_times(int rc, double *times, int n) {
  PyObject *out = NULL;
  if (rc) {
    errno = rc;
    PyErr_SetFromErrno(PyExc_OSError);
  } else {
    out = times_to_list(times, n);
  }
  free(times);
  return out;
}

static const char *const COPY_KERNELS[] = {"auto", "libc", "stream"};

static PyObject *py_memcpy_bandwidth(PyObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"size_bytes", "threads", "iters", "kernel", NULL};
  Py_ssize_t size_bytes;
  int threads = 1, iters = 5, kernel = -1;
  const char *kernel_name = "auto";
  if (!PyArg_ParseTupleAndKeywords(args, kw, "n|iis", kwlist, &size_bytes, &threads, &iters, &kernel_name))
    return NULL;
  for (int k = 0; k < 3; k++)
    if (strcmp(kernel_name, COPY_KERNELS[k]) == 0) kernel = k;
  if (size_bytes <= 0 || threads < 1 || iters < 1 || kernel < 0) {
    PyErr_SetString(PyExc_ValueError, "size_bytes, threads and iters must be positive; kernel auto, libc or stream");
    return NULL;
  }
  double *times = calloc((size_t)iters, sizeof(double));
  if (!times) return PyErr_NoMemory();
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = mb_memcpy_run((size_t)size_bytes, threads, iters, times, &kernel);
  Py_END_ALLOW_THREADS
  PyObject *list = finish_times(rc, times, iters);
  if (!list) return NULL;
  return Py_BuildValue("(Ns)", list, COPY_KERNELS[kernel]);
}

static PyObject *py_io_run(PyObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"path", "write", "bs", "size", "threads", "qd", "direct", "random",
                           "fsync", "engine", "seed", NULL};
  const char *path, *engine = "auto";
  int write = 0, threads = 1, qd = 1, direct = 0, random = 0, do_fsync = 1;
  Py_ssize_t bs, size;
  unsigned long long seed = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "spnn|iipppsK", kwlist, &path, &write, &bs, &size, &threads, &qd,
                                   &direct, &random, &do_fsync, &engine, &seed))
    return NULL;
  if (bs <= 0 || size <= 0 || threads < 1 || qd < 1) {
    PyErr_SetString(PyExc_ValueError, "bs, size, threads and qd must be positive");
    return NULL;
  }
  int eng = strcmp(engine, "io_uring") == 0 ? MB_ENGINE_URING : strcmp(engine, "threads") == 0 ? MB_ENGINE_THREADS : MB_ENGINE_AUTO;
  mb_io_params p = {path, write, direct, random, do_fsync, eng, threads, qd, (size_t)bs, (uint64_t)size, seed};
  mb_io_result r;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = mb_io_run(&p, &r);
  Py_END_ALLOW_THREADS
  if (rc) {
    errno = rc;
    return PyErr_SetFromErrnoWithFilename(PyExc_OSError, path);
  }
  return Py_BuildValue("{s:K,s:d,s:d,s:K,s:d,s:d,s:d,s:d,s:d,s:K,s:s,s:i}", "bytes", (unsigned long long)r.bytes,
                       "seconds", r.seconds, "iops", r.seconds > 0 ? (double)r.ios / r.seconds : 0.0, "ios",
                       (unsigned long long)r.ios, "lat_p50_us", r.lat_p50_us, "lat_p99_us", r.lat_p99_us,
                       "lat_p999_us", r.lat_p999_us, "lat_max_us", r.lat_max_us, "lat_mean_us", r.lat_mean_us,
                       "lat_samples", (unsigned long long)r.lat_samples, "engine",
                       r.engine_used == MB_ENGINE_URING ? "io_uring" : "pthreads", "workers", r.workers);
}

static PyObject *py_io_uring_available(PyObject *self, PyObject *unused) {
  int ok;
  Py_BEGIN_ALLOW_THREADS
  ok = mb_io_uring_available();
  Py_END_ALLOW_THREADS
  return PyBool_FromLong(ok);
}

static PyObject *py_tcp_link(PyObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"fds", "role", "mode", "size_bytes", "iters", "timeout_s", NULL};
  PyObject *fd_seq;
  int role, mode, iters;
  Py_ssize_t size_bytes;
  double timeout_s;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "Oiinid", kwlist, &fd_seq, &role, &mode, &size_bytes, &iters,
                                   &timeout_s))
    return NULL;
  PyObject *fast = PySequence_Fast(fd_seq, "fds must be a sequence of file descriptors");
  if (!fast) return NULL;
  Py_ssize_t nfds = PySequence_Fast_GET_SIZE(fast);
  if (nfds < 1 || nfds > 64 || size_bytes <= 0 || iters < 1 || timeout_s <= 0) {
    Py_DECREF(fast);
    PyErr_SetString(PyExc_ValueError, "need 1-64 fds and positive size_bytes, iters and timeout_s");
    return NULL;
  }
  int fds[64];
  for (Py_ssize_t i = 0; i < nfds; i++) {
    fds[i] = (int)PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
    if (PyErr_Occurred()) {
      Py_DECREF(fast);
      return NULL;
    }
  }
  Py_DECREF(fast);
  double *times = calloc((size_t)iters, sizeof(double));
  if (!times) return PyErr_NoMemory();
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = mb_tcp_link_run(fds, (int)nfds, role, mode, (size_t)size_bytes, iters, timeout_s, times);
  Py_END_ALLOW_THREADS
  return finish_times(rc, times, iters);
}

/* check_sample(key, data, low, high, base, span, stride) -> 0 or 1: one sample, right after it
 * was read, while its bytes are still in the core's cache (a batch's 32 x 16K checked at the
 * end of the batch cost 1.7 us a sample against 0.5 us hot). FASTCALL: no argument tuple. */
static PyObject *py_check_sample(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 7) {
    PyErr_SetString(PyExc_TypeError, "check_sample(key, data, low, high, base, span, stride)");
    return NULL;
  }
  int64_t index;
  PyObject *key = args[0];
  if (PyLong_Check(key)) {
    long long value = PyLong_AsLongLong(key);
    if (value == -1 && PyErr_Occurred()) PyErr_Clear();
    index = value;
  } else if (PyUnicode_Check(key)) {
    Py_ssize_t len;
    const char *name = PyUnicode_AsUTF8AndSize(key, &len);
    if (!name) return NULL;
    index = mb_member_index(name, (size_t)len);
  } else {
    PyErr_SetString(PyExc_TypeError, "a sample's key must be an int index or a str member name");
    return NULL;
  }
  unsigned long long v[5];
  for (int i = 0; i < 5; i++) {
    if (i == 2) continue;
    v[i] = PyLong_AsUnsignedLongLong(args[2 + i]);
    if (PyErr_Occurred()) return NULL;
  }
  if (v[3] == 0 || v[0] > v[1]) {
    PyErr_SetString(PyExc_ValueError, "span must be positive and low <= high");
    return NULL;
  }
  Py_buffer data, base;
  if (PyObject_GetBuffer(args[1], &data, PyBUF_SIMPLE) < 0) return NULL;
  if (PyObject_GetBuffer(args[4], &base, PyBUF_SIMPLE) < 0) {
    PyBuffer_Release(&data);
    return NULL;
  }
  int wrong = mb_sample_wrong(index, data.buf, (size_t)data.len, v[0], v[1], base.buf, (size_t)base.len, v[3], v[4]);
  PyBuffer_Release(&data);
  PyBuffer_Release(&base);
  return PyLong_FromLong(wrong);
}

static PyMethodDef methods[] = {
    {"io_run", (PyCFunction)(void (*)(void))py_io_run, METH_VARARGS | METH_KEYWORDS,
     "io_run(path, write, bs, size, threads=1, qd=1, direct=False, random=False, fsync=True, engine='auto', seed=1)"
     " -> dict(bytes, seconds, iops, ios, lat_p50_us, lat_p99_us, lat_p999_us, lat_max_us, engine, ...)"},
    {"check_sample", (PyCFunction)(void (*)(void))py_check_sample, METH_FASTCALL,
     "check_sample(key, data, low, high, base, span, stride) -> 1 when data is not sample key's bytes, else 0"},
    {"io_uring_available", py_io_uring_available, METH_NOARGS, "io_uring_available() -> bool"},
    {"memcpy_bandwidth", (PyCFunction)(void (*)(void))py_memcpy_bandwidth, METH_VARARGS | METH_KEYWORDS,
     "memcpy_bandwidth(size_bytes, threads=1, iters=5, kernel='auto') -> (seconds per iteration, kernel used)"},
    {"tcp_link", (PyCFunction)(void (*)(void))py_tcp_link, METH_VARARGS | METH_KEYWORDS,
     "tcp_link(fds, role, mode, size_bytes, iters, timeout_s) -> list of seconds per iteration; "
     "mode 0 uni, 1 bidir, 2 pingpong; OSError(ETIMEDOUT) when nothing moved for timeout_s"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native",
                                    "microbench native core (C hot loops)", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }

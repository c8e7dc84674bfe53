"""S3 object throughput: multipart PUT and ranged, concurrent GET through botocore's low-level
client with our own thread pool (so memory stays bounded and nothing is hidden in s3transfer).

One iteration of `put` uploads `objects` objects of `object_size` bytes, each as a multipart
upload of `part_size` parts (a single PutObject when the object fits in one part), all parts of
all objects spread over `concurrency` threads. One iteration of `get` reads the same objects
back as ranged GETs of `part_size` bytes, again `concurrency` at a time, into a reused buffer.

throughput_gbps = objects x object_size / iteration wall time (GB/s = 1e9 B/s), the time
including create/complete calls of a multipart upload.
Per-request latency is over data requests (UploadPart/PutObject, ranged GetObject), whole
request to last byte. Time to first byte is curl's time_starttransfer: request start to the
response headers, for GETs.

Memory: every part body is a view of one shared random part-sized buffer, and each GET thread
reads into its own chunk buffer, so the probe holds about part_size + concurrency x 2 MiB of
data whatever the object size.
"""

from __future__ import annotations

import io
import os
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import Any

from ...core.errors import RunError
from ...core.probe import Case, Probe, Timed
from ...core.registry import Needs, ProbeSpec, SuiteStep, SweepDefaults
from ...core.stats import percentile
from ...results.schema import ProbeRow
from ...targets.s3client import Target, delete_prefix, s3_client_unavailable_reason, translate
from .s3_config import OPS, Config, validate
from .s3_parts import _peak_rss_bytes, _same_bytes, part_plan, pooled_latencies, put_single_stream
from .s3_run import print_report, run_s3

READ_CHUNK_BYTES = 1 << 20  # per-thread GET buffer; urllib3 allocates one more of it per read




class _S3Required(ProbeRow):
    part_size_bytes: int
    concurrency: int
    objects: int
    bytes_per_iter: int
    upload: str | None              # put: "single" or "multipart"
    throughput_gbps: float
    requests: float                 # medians over iterations
    request_ms_p50: float
    request_ms_p99: float


class S3Row(_S3Required, total=False):
    stream: str                     # put "single": one object, its parts one after another (s3_parts.py)
    ttfb_ms_p50: float              # get
    ttfb_ms_p99: float


class StorageS3Probe(Probe):
    name = "storage_s3"

    def __init__(self, config: Config, target: Target, client: Any | None = None, cred_source: str = "unknown"):
        self.config = config
        self.target = target
        self.cred_source = cred_source
        self._client = client
        self._pool: ThreadPoolExecutor | None = None
        self._payload = b""
        self._tail = b""
        self._wrong = 0
        self._rss_before = 0
        self._stored = False
        self._open_uploads: dict[str, str] = {}
        self._local = threading.local()
        # Per op: one list of (request_s, ttfb_s or None) per iteration, warm-up included;
        # summarize() keeps the last `iters` of them.
        self._latencies: dict[str, list[list[tuple[float, float | None]]]] = {op: [] for op in OPS}

    def unavailable_reason(self) -> str | None:
        return s3_client_unavailable_reason()

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = self.target.client(pool=self.config.concurrency + 2)
        return self._client

    def implementation(self) -> dict[str, Any]:
        import botocore

        return {
            "engine": "botocore low-level client, own thread pool",
            "botocore": botocore.__version__,
            **self.target.describe(),
            "credentials_source": self.cred_source,
            "addressing_style": self.target.addressing_style,
            "payload_signing": False,
            "range_bytes": self.config.part_size,
            "read_chunk_bytes": min(READ_CHUNK_BYTES, self.config.part_size),
        }

    @property
    def stream_key(self) -> str:
        return f"{self.config.prefix}stream-00000"

    def keys(self) -> list[str]:
        return [f"{self.config.prefix}obj-{i:05d}" for i in range(self.config.objects)]

    def cases(self) -> list[Case]:
        single = [Case("put", self.config.object_size, (("stream", "single"),))] if "put" in self.config.ops else []
        return [Case(op, self.config.object_size) for op in self.config.ops] + single

    def row_fields(self, case: Case) -> dict[str, Any]:
        c = self.config
        if case.param("stream") == "single":
            return {"part_size_bytes": c.part_size, "concurrency": 1, "objects": 1, "bytes_per_iter": c.object_size,
                    "upload": "multipart" if c.object_size > c.part_size else "single", "stream": "single"}
        return {"part_size_bytes": c.part_size, "concurrency": c.concurrency, "objects": c.objects,
                "bytes_per_iter": c.objects * c.object_size,
                "upload": ("multipart" if c.object_size > c.part_size else "single") if case.op == "put" else None}

    def prepare(self, case: Case) -> None:
        # Made here, once: made lazily by the first requests, each of the pool's threads finds
        # none yet and builds its own, and the first PUT pays for all of them
        # (docs/BENCHMARKS.md has the figures).
        _ = self.client
        if self._pool is None:
            self._rss_before = _peak_rss_bytes()  # imports (torch via the environment record) included
            self._pool = ThreadPoolExecutor(self.config.concurrency, thread_name_prefix="mb-s3")
        if not self._payload:
            # Random bytes: nothing on the way can compress or deduplicate them.
            self._payload = os.urandom(min(self.config.part_size, self.config.object_size))
        if case.op == "get" and not self._stored:
            self._put_all()  # untimed: GET needs the objects

    def run_once(self, case: Case) -> Timed:
        start = time.perf_counter()
        single = case.param("stream") == "single"
        lat = put_single_stream(self) if single else self._put_all() if case.op == "put" else self._get_all()
        elapsed = time.perf_counter() - start
        self._latencies.setdefault(_key(case.op, single), []).append(lat)
        req = [r for r, _ in lat]
        extra: dict[str, Any] = {"requests": len(req), "request_ms_p50": percentile(req, 50) * 1e3,
                                 "request_ms_p99": percentile(req, 99) * 1e3}
        ttfb = [t for _, t in lat if t is not None]
        if ttfb:
            extra.update(ttfb_ms_p50=percentile(ttfb, 50) * 1e3, ttfb_ms_p99=percentile(ttfb, 99) * 1e3)
        return Timed(elapsed, extra)

    # --- PUT --------------------------------------------------------------------------------
    def _body(self, length: int) -> io.BytesIO:
        # BytesIO over an immutable bytes object shares it instead of copying.
        if length != len(self._payload):
            if len(self._tail) != length:
                self._tail = self._payload[:length]  # the short last part, sliced once
            return io.BytesIO(self._tail)
        return io.BytesIO(self._payload)

    def _put_part(self, key: str, upload_id: str, number: int, length: int) -> tuple[dict, float]:
        t0 = time.perf_counter()
        out = self.client.upload_part(Bucket=self.config.bucket, Key=key, UploadId=upload_id,
                                      PartNumber=number, Body=self._body(length))
        return {"ETag": out["ETag"], "PartNumber": number}, time.perf_counter() - t0

    def _put_single(self, key: str) -> float:
        t0 = time.perf_counter()
        self.client.put_object(Bucket=self.config.bucket, Key=key, Body=self._body(self.config.object_size))
        return time.perf_counter() - t0

    def _put_all(self) -> list[tuple[float, float | None]]:
        c = self.config
        keys = self.keys()
        try:
            if c.object_size <= c.part_size:
                times = self._gather([self._submit(self._put_single, key) for key in keys])
                self._stored = True
                return [(t, None) for t in times]
            for key, uid in zip(keys, self._gather([self._submit(self._create, key) for key in keys]), strict=False):
                self._open_uploads[key] = uid
            plan = part_plan(c.object_size, c.part_size)
            futures = [self._submit(self._put_part, key, self._open_uploads[key], n + 1, length)
                       for key in keys for n, (_, length) in enumerate(plan)]
            results = self._gather(futures)
            lat: list[tuple[float, float | None]] = [(t, None) for _, t in results]
            done = [self._submit(self._complete, key, [p for p, _ in results[i * len(plan):(i + 1) * len(plan)]])
                    for i, key in enumerate(keys)]
            self._gather(done)
            self._stored = True
            return lat
        except BaseException as exc:
            self.abort_uploads()
            raise self._error(exc, "uploading") from None

    def _create(self, key: str) -> str:
        return self.client.create_multipart_upload(Bucket=self.config.bucket, Key=key)["UploadId"]

    def _complete(self, key: str, parts: list[dict]) -> None:
        uid = self._open_uploads[key]
        self.client.complete_multipart_upload(Bucket=self.config.bucket, Key=key, UploadId=uid,
                                              MultipartUpload={"Parts": parts})
        self._open_uploads.pop(key, None)

    def abort_uploads(self) -> None:
        for key, uid in list(self._open_uploads.items()):
            try:
                self.client.abort_multipart_upload(Bucket=self.config.bucket, Key=key, UploadId=uid)
            except Exception:  # noqa: BLE001 - best effort; delete_prefix also aborts
                pass
            self._open_uploads.pop(key, None)

    # --- GET --------------------------------------------------------------------------------
    def _buffer(self) -> memoryview:
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = memoryview(bytearray(min(READ_CHUNK_BYTES, self.config.part_size)))
        return buf

    def _get_range(self, key: str, offset: int, length: int, verify: bool = False) -> tuple[float, float, int]:
        buf = self._buffer()
        t0 = time.perf_counter()
        out = self.client.get_object(Bucket=self.config.bucket, Key=key, Range=f"bytes={offset}-{offset + length - 1}")
        ttfb = time.perf_counter() - t0
        body, got, wrong = out["Body"], 0, 0
        try:
            while True:
                n = body.readinto(buf)
                if not n:
                    break
                if verify and not _same_bytes(buf, n, self._payload, got):
                    wrong += 1
                got += n
        finally:
            body.close()
        if got != length:
            raise RunError(f"short read from S3: {key} bytes {offset}+{length} returned {got} bytes")
        return time.perf_counter() - t0, ttfb, wrong

    def _get_all(self, verify: bool = False) -> list[tuple[float, float | None]]:
        plan = part_plan(self.config.object_size, self.config.part_size)
        try:
            results = self._gather([self._submit(self._get_range, key, off, length, verify)
                                    for key in self.keys() for off, length in plan])
        except BaseException as exc:
            raise self._error(exc, "downloading") from None
        self._wrong = sum(w for _, _, w in results)
        return [(r, t) for r, t, _ in results]

    # --- plumbing ---------------------------------------------------------------------------
    def _submit(self, fn: Any, *args: Any) -> Future:
        assert self._pool is not None
        return self._pool.submit(fn, *args)

    @staticmethod
    def _gather(futures: list[Future]) -> list[Any]:
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for fut in pending:
            fut.cancel()
        for fut in futures:
            if fut.done() and not fut.cancelled() and fut.exception() is not None:
                wait(pending)  # let in-flight requests end before cleanup touches the prefix
                raise fut.exception()  # type: ignore[misc]
        return [fut.result() for fut in futures]

    def _error(self, exc: BaseException, doing: str) -> BaseException:
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            return exc
        assert self.config.bucket is not None   # resolved by validate
        return translate(exc, self.target, self.config.bucket, self.cred_source, doing)

    def check(self, case: Case) -> int:
        """put: objects whose stored size is wrong; get: 8 MiB chunks whose bytes differ."""
        if case.op == "put":
            keys = [self.stream_key] if case.param("stream") == "single" else self.keys()
            sizes = [self.client.head_object(Bucket=self.config.bucket, Key=k)["ContentLength"] for k in keys]
            return sum(1 for s in sizes if s != self.config.object_size)
        self._get_all(verify=True)
        return self._wrong

    def metrics(self, case: Case, time_s: float) -> dict[str, Any]:
        objects = 1 if case.param("stream") == "single" else self.config.objects
        return {"throughput_gbps": objects * case.size_bytes / time_s / 1e9}

    def summarize(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """Latency percentiles pooled over every request of the timed iterations, per op."""
        return pooled_latencies(self, rows)

    def release(self, case: Case) -> None:
        """Objects stay between cases (GET reads what PUT wrote); close() removes them."""

    def close(self) -> int:
        """Stop the threads and delete what this run wrote (unless keep). Returns objects deleted."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self.abort_uploads()
        if self.config.keep or self._client is None:
            return 0
        assert self.config.bucket is not None   # resolved by validate
        try:
            return delete_prefix(self.client, self.config.bucket, self.config.prefix)
        except Exception as exc:  # noqa: BLE001
            raise self._error(exc, f"deleting {self.config.prefix}") from None


def _key(op: str, single: bool) -> str:
    return "put_single_stream" if single else op


SPEC = ProbeSpec(
    name="storage_s3",
    command=("storage", "s3"),
    order=50,
    help="S3 multipart PUT / ranged GET throughput, latency, time to first byte",
    description="PUT objects as concurrent multipart uploads and GET them back as concurrent ranged reads. Without "
    "--endpoint an embedded S3 server (rclone serve s3) runs over a temporary directory for the run. "
    "Credentials come from the standard AWS environment or profile.",
    metrics=("throughput_gbps",),
    config=Config,
    build=lambda config, context: StorageS3Probe(config, context.s3, cred_source=context.cred_source),
    row_schema=S3Row,
    validate=validate,
    run=run_s3,
    printer=print_report,
    sweep=SweepDefaults(warmup=1, iters=5, budget_s=4.0),
    needs=Needs(s3=True),
    aliases=(),
    case_keys=("part_size_bytes", "concurrency", "objects", "stream"),
    feeds=("tier",),
    suite=(SuiteStep("storage s3", ("--object-size", "64M", "--objects", "4")),),
)

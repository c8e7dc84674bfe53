"""The S3 probe's pieces that are not the probe: how an object splits into parts, checking bytes
read back, the process's peak memory, and the single-stream upload.

The single stream is how one process writing one file through s3fs (torch.save of a full state
dict to s3://) reaches S3: one object, its parts uploaded one after another on one thread, then
the completion, the object's durable point. Its throughput is what `microbench compose` takes as
the tier's single-stream bandwidth.
"""

from __future__ import annotations

import resource
import time
from typing import Any

from ...core.stats import percentile


def part_plan(object_size: int, part_size: int) -> list[tuple[int, int]]:
    """(offset, length) of each part/range of an object."""
    return [(off, min(part_size, object_size - off)) for off in range(0, object_size, part_size)]


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _same_bytes(buf: memoryview, n: int, payload: bytes, offset: int) -> bool:
    """buf[:n] == payload[offset:offset + n], vectorised: comparing memoryviews goes element by
    element (45 ms per 8 MiB here, 1.2 s to check 256 MiB of GETs); numpy takes 3 ms."""
    import numpy as np

    got = np.frombuffer(buf, np.uint8, n)
    want = np.frombuffer(payload, np.uint8, n, offset) if offset + n <= len(payload) else None
    return want is not None and bool(np.array_equal(got, want))


def put_single_stream(probe: Any) -> list[tuple[float, float | None]]:
    """One object of the probe's object size, its parts in order on this thread (a single
    PutObject when it fits in one part); per-request latencies."""
    c, key = probe.config, probe.stream_key
    try:
        if c.object_size <= c.part_size:
            start = time.perf_counter()
            probe.client.put_object(Bucket=c.bucket, Key=key, Body=probe._body(c.object_size))
            return [(time.perf_counter() - start, None)]
        probe._open_uploads[key] = probe._create(key)
        results = [
            probe._put_part(key, probe._open_uploads[key], n + 1, length)
            for n, (_, length) in enumerate(part_plan(c.object_size, c.part_size))
        ]
        probe._complete(key, [part for part, _ in results])
        return [(t, None) for _, t in results]
    except BaseException as exc:
        probe.abort_uploads()
        raise probe._error(exc, "uploading one stream") from None


def pooled_latencies(probe: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Latency percentiles pooled over every request of the timed iterations, per op."""
    out: dict[str, Any] = {}
    for row in rows:
        key = "put_single_stream" if row.get("stream") == "single" else row["op"]
        timed = probe._latencies.get(key, [])[-row["iters"] :] if row["iters"] else []
        pooled = [x for it in timed for x in it]
        req = [r for r, _ in pooled]
        ttfb = [t for _, t in pooled if t is not None]
        entry = {
            "requests": len(req),
            "request_ms_p50": percentile(req, 50) * 1e3,
            "request_ms_p99": percentile(req, 99) * 1e3,
            "throughput_gbps": row["throughput_gbps"],
        }
        if ttfb:
            entry.update(ttfb_ms_p50=percentile(ttfb, 50) * 1e3, ttfb_ms_p99=percentile(ttfb, 99) * 1e3)
        out[key] = entry
    c = probe.config
    out["peak_rss_bytes"] = _peak_rss_bytes()
    out["peak_rss_before_first_request_bytes"] = probe._rss_before
    out["memory_bound_bytes"] = c.concurrency * c.part_size + (200 << 20)
    return out

"""What a storage probe needs when its path is on a bucket mount: the facts its record states
(from /proc/self/mountinfo and what `microbench mount up` recorded, never from the user's word)
and the time until the store really holds what was written (polled over the S3 API, never
through the mount: the mount answers from its cache).

For the probes (storage posix and checkpoint here; the data and model loading probes call the
same two functions):

    facts = mount_facts.facts_for_path(path)        # None when `path` is not on an rclone mount
    result = mount_facts.wait_durable(directory, started_at=t0, timeout_s=300)

`facts_for_path` raises RunError, one line, when the mount is dead (its rclone was killed) or hung,
so no probe blocks on it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from ...core.errors import Interrupted, RunError
from ...core.units import format_bytes_human, format_number
from . import system as sysm

POLL_S = 0.02


def _state_for(point: str) -> Any:
    from .. import mount as mountmod

    for name in mountmod.names():
        state = mountmod.read_state(name)
        if state is not None and state.path == point:
            return state
    return None


def check_alive(path: str) -> None:
    """RunError when `path` is on an rclone mount whose process is dead or not answering."""
    info = sysm.mount_of(path)
    if info is None or not info["fstype"].startswith("fuse"):
        return
    reason = sysm.dead_reason(info["mount_point"])
    if reason:
        state = _state_for(info["mount_point"])
        fix = (f"run `microbench mount down --name {state.name}`" if state is not None
               else f"unmount it (fusermount3 -uz {info['mount_point']})")
        raise RunError(f"the {info['fstype']} mount at {info['mount_point']!r} {reason}; {fix}")


def facts_for_path(path: str) -> dict[str, Any] | None:
    """The record's facts about the rclone mount holding `path`, or None when it is not on one."""
    info = sysm.mount_of(path)
    if info is None or not info["fstype"].startswith("fuse.rclone"):
        return None
    check_alive(path)
    state = _state_for(info["mount_point"])
    out: dict[str, Any] = {"on_mount": True, "mount_point": info["mount_point"], "mount_fstype": info["fstype"],
                           "mount_source": info["source"]}
    if state is None:
        from ..s3server import rclone_binary, rclone_version

        binary = rclone_binary()
        out.update(mount_mode="unknown (not mounted by `microbench mount up`)", mount_name=None,
                   backing_store="unknown", rclone_version=rclone_version(binary) if binary else None,
                   durable_when="unknown: no store access for a mount microbench did not make")
        return out
    out.update(mount_mode=state.mode, mount_name=state.name, backing_store=state.backing(),
               rclone_version=state.rclone_version, write_back_s=state.write_back_s, cache_dir=state.cache_dir,
               durable_when=("close returns once the object is uploaded (direct mount): blocked = durable, "
                             "checked over the S3 API" if state.mode == "direct" else
                             f"the store holds every byte, polled over the S3 API after close (cached mount, "
                             f"upload {format_number(state.write_back_s, 6)} s after close)"))
    return out


_CLIENTS: dict[str, tuple[Any, str]] = {}


def store_client(mount_point: str) -> tuple[Any, str]:
    """Made once per mount point and process (a botocore session takes about a second, which
    would otherwise count as drain time). A botocore client and the bucket behind a mount `up`
    made (its state has the keys of the embedded server; an --endpoint mount uses the standard
    AWS chain, as rclone did)."""
    from ..s3client import Target
    from ..s3server import REGION, Credentials

    state = _state_for(mount_point)
    if state is None:
        raise RunError(f"no `microbench mount up` state for the mount at {mount_point!r}: cannot reach its store")
    key = f"{mount_point} {state.endpoint} {state.started_at}"   # a later mount at the same point is another store
    if key in _CLIENTS:
        return _CLIENTS[key]
    if state.embedded:
        target = Target(state.endpoint, REGION, "path", Credentials(state.key or "", state.secret or ""))
    else:
        target = Target(state.endpoint)
    _CLIENTS[key] = target.client(pool=2, connect_timeout_s=5, read_timeout_s=30, attempts=3), state.bucket
    return _CLIENTS[key]


@dataclass
class Durable:
    seconds: float          # from `started_at` until the store held every byte
    total_bytes: int
    durable_bytes: int
    files: int


def _expected(directory: str, mount_point: str) -> dict[str, int]:
    """Object key -> size for every file under `directory`, as the application wrote them."""
    out = {}
    for dirpath, _dirs, files in os.walk(directory):
        for name in files:
            full = os.path.join(dirpath, name)
            out[os.path.relpath(full, mount_point)] = os.stat(full).st_size
    return out


def _in_store(client: Any, bucket: str, prefix: str) -> dict[str, int]:
    found: dict[str, int] = {}
    token = None
    while True:
        kwargs = {"Bucket": bucket, "Prefix": prefix, **({"ContinuationToken": token} if token else {})}
        page = client.list_objects_v2(**kwargs)
        for obj in page.get("Contents", []):
            found[obj["Key"]] = int(obj["Size"])
        if not page.get("IsTruncated"):
            return found
        token = page.get("NextContinuationToken")


def wait_durable(directory: str, *, started_at: float, timeout_s: float) -> Durable:
    """Poll the store until it holds every file under `directory` (on a mount `up` made) at its
    full size. `started_at` is a time.perf_counter() value. Ctrl-C or the timeout end the wait
    with one line saying how many bytes were durable."""
    info = sysm.mount_of(directory)
    if info is None:
        raise RunError(f"{directory!r} is not on a mount")
    point = info["mount_point"]
    client, bucket = store_client(point)
    expected = _expected(directory, point)
    total = sum(expected.values())
    prefix = os.path.relpath(directory, point).rstrip("/") + "/"
    deadline = time.perf_counter() + timeout_s
    held = 0
    try:
        while True:
            found = _in_store(client, bucket, prefix)
            held = sum(size for key, size in expected.items() if found.get(key) == size)
            if held == total:
                return Durable(time.perf_counter() - started_at, total, held, len(expected))
            if time.perf_counter() > deadline:
                raise RunError(f"not durable within --timeout {format_number(timeout_s, 6)} s: the store held "
                               f"{format_bytes_human(held)} of {format_bytes_human(total)} written to {directory}; "
                               f"the rest is still in the mount's cache (`microbench mount status`)")
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted while the mount's cache drained: {held} of {total} bytes "
                          f"({format_bytes_human(held)} of {format_bytes_human(total)}) were durable") from None

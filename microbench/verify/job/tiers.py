"""verify job, rank side: one tier's place for one phase's bytes, the same calls whether it is a
local directory, the embedded S3 server over the API, or its bucket through a cached rclone mount.

A place is a unique directory (or S3 prefix) under the tier, made and removed by rank 0. It
writes and reads whole objects (model shards), hands the dataload probe's loader its Source,
gives DCP its RunDir, drops the cached pages of what it holds (posix_fadvise, as the probes do;
for S3 on the embedded server's own files), and on a mount waits until the store holds what was
written, so uploads of one phase's preparation do not run under the next one's timing."""

from __future__ import annotations

import os
import shutil
import uuid
from typing import Any

from ...targets import checkpoint_target as ct
from ...targets.workdir import drop_pages
from ..spec import JobTiers


def s3_access() -> tuple[Any, ct.S3Access, str | None]:
    """(botocore-capable Target, DCP's S3Access, the server's data directory) for the launcher's
    embedded server, from the environment the launcher gave the ranks."""
    from ...run.provision import embedded_s3_from_env
    from ...targets.s3client import Target
    from ...targets.s3server import REGION, Credentials

    handed = embedded_s3_from_env()
    if handed is None:
        from ...core.errors import RunError

        raise RunError("verify job: the launcher's embedded S3 server is not in this rank's environment")
    target = Target(handed["endpoint"], REGION, "path", Credentials(handed["key"] or "", handed["secret"] or ""))
    access = ct.S3Access(handed["endpoint"], handed["key"], handed["secret"], embedded=True, root_dir=handed["root"])
    return target, access, handed["root"]


class Place:
    def __init__(self, tier: str, tiers: JobTiers, what: str, name: str | None = None):
        self.tier, self.what = tier, what
        self.name = name or f"microbench-job-{what}-{uuid.uuid4().hex[:10]}"
        self._client: Any = None
        if tier == "s3":
            self.s3, self.access, self.server_root = s3_access()
            assert tiers.s3 is not None
            self.bucket, self.prefix = tiers.s3["bucket"], f"{tiers.s3['prefix']}/{self.name}"
            self.root = None
        else:
            self.root = os.path.join(tiers.root(tier), self.name)

    # -- where ------------------------------------------------------------------------
    @property
    def local(self) -> bool:
        return self.tier != "s3"

    @property
    def display(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.tier == "s3" else str(self.root)

    def path(self, key: str) -> str:
        assert self.root is not None
        return os.path.join(self.root, key)

    def client(self) -> Any:
        pid = os.getpid()   # DataLoader workers are forks: a client per process
        if self._client is None or self._client[0] != pid:
            self._client = (pid, self.s3.client(pool=10))
        return self._client[1]

    # -- objects ------------------------------------------------------------------------
    def create(self) -> None:
        if self.root is not None:
            os.makedirs(self.root)

    def put(self, key: str, data: bytes) -> None:
        if self.tier == "s3":
            from ...probes.modelload.store import upload

            upload(self.client(), self.bucket, f"{self.prefix}/{key}", data)   # multipart above 8 MiB
            return
        os.makedirs(os.path.dirname(self.path(key)), exist_ok=True)
        with open(self.path(key), "xb") as handle:
            handle.write(data)

    def get(self, key: str) -> bytes:
        if self.tier == "s3":
            # Whole, with ranged parallel GETs, as object-store loaders (and modelload) fetch a shard.
            from ...probes.modelload.store import fetch

            return bytes(fetch(self.client(), self.bucket, f"{self.prefix}/{key}")[1] or b"")
        with open(self.path(key), "rb") as handle:
            return handle.read()

    def cache_files(self, keys: list[str]) -> list[str]:
        if self.tier == "s3":
            return (
                [os.path.join(self.server_root, self.bucket, self.prefix, k) for k in keys] if self.server_root else []
            )
        return [self.path(k) for k in keys]

    def drop_cache(self, keys: list[str]) -> None:
        drop_pages(self.cache_files(keys))

    def settle(self, timeout_s: float) -> None:
        """Written bytes flushed (so their pages can be dropped); on a mount, uploaded."""
        os.sync()
        if self.tier == "mount" and self.root is not None:
            import time

            from ...targets.mount import facts as mount_facts

            mount_facts.wait_durable(self.root, started_at=time.perf_counter(), timeout_s=timeout_s)

    def remove(self) -> None:
        if self.tier == "s3":
            from ...targets.s3client import delete_prefix

            try:
                delete_prefix(self.client(), self.bucket, self.prefix + "/")
            except Exception:   # cleanup of a run that already failed: nothing to add
                pass
        elif self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)

    # -- what the probes and the job take ------------------------------------------------
    def data_source(self) -> Any:
        from ...probes.dataload.loader import Source

        if self.tier == "s3":
            return Source(bucket=self.bucket, prefix=self.prefix, s3=self.s3)
        return Source(root=self.root)

    def run_dir(self) -> ct.RunDir:
        if self.tier == "s3":
            return ct.RunDir(ct.parse_target(f"s3://{self.bucket}/{self.prefix.rsplit('/', 1)[0]}"), self.name,
                             self.access)
        assert self.root is not None
        return ct.RunDir(ct.parse_target(os.path.dirname(self.root)), self.name)


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def steady_threads(quiet_s: float = 0.05, timeout_s: float = 5.0) -> int:
    """The OS thread count once it has stopped changing for `quiet_s`: threads a collection just
    ended (a thread pool freed with its cycle) may still be deleting their state."""
    import time

    deadline = time.monotonic() + timeout_s
    last, since = os_threads(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.005)
        now = os_threads()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            break
    return last


def threads_settled(baseline: int, timeout_s: float = 5.0) -> None:
    """Wait until the threads a fetch started have ended at the OS level. A DataLoader forks its
    workers next, and in CPython 3.11 a fork while another thread is still deleting its thread
    state (after join() returned) deadlocks the child in PyOS_AfterFork_Child: seen here after the
    ranged-GET pool of an S3 model load, a worker stuck until --timeout."""
    import time

    deadline = time.monotonic() + timeout_s
    while os_threads() > baseline and time.monotonic() < deadline:
        time.sleep(0.001)


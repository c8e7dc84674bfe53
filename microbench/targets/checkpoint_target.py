"""Where a checkpoint run writes: a local directory or an S3 prefix, always inside a unique
directory of its own that is removed afterwards.

DCP talks to both through its own storage layer: FileSystemWriter/Reader for directories,
FsspecWriter/Reader (s3fs) for s3:// URLs. This module only parses targets, checks them before
any rank starts (writable, enough free space, endpoint reachable, bucket present), creates the
run directory and removes it again, including target directories it had to create.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import stat
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from ..core.errors import RunError, UsageError
from ..core.units import format_bytes_human
from .workdir import dead_mount_reason, drop_pages

# Headroom over the checkpoint's bytes: DCP metadata, file system overhead, one in-flight write.
SPACE_MARGIN_BYTES = 64 << 20


@dataclass(frozen=True)
class Target:
    kind: str  # "local" or "s3"
    path: str  # absolute directory, or "bucket/prefix" without a trailing slash
    bucket: str = ""

    @property
    def display(self) -> str:
        return f"s3://{self.path}" if self.kind == "s3" else self.path


@dataclass(frozen=True)
class S3Access:
    endpoint_url: str | None  # None: the SDK's default (AWS)
    key_id: str | None = field(default=None, repr=False)
    secret: str | None = field(default=None, repr=False)
    embedded: bool = False
    root_dir: str | None = None  # the embedded server's data directory
    # --timeout: bounds each of the calls made before and after the ranks (the bucket check,
    # the run directory's removal), so a server that accepts and never answers fails the run.
    timeout_s: float = 300.0

    def control_options(self) -> dict[str, Any]:
        """s3fs options for rank 0's own calls around the ranks: one attempt each (botocore's and
        s3fs's retries would multiply the wait), connect and read bounded by `timeout_s`."""
        opts = self.storage_options()
        opts["config_kwargs"] = {
            **opts["config_kwargs"],
            "connect_timeout": self.timeout_s,
            "read_timeout": self.timeout_s,
            "retries": {"total_max_attempts": 1},
        }
        return opts

    def storage_options(self) -> dict[str, Any]:
        """s3fs options; explicit keys only for the embedded server, otherwise the standard AWS
        environment or profile applies."""
        # Checksums only where the API requires them: botocore's default validates ranged GETs
        # against whole-object checksums, which servers other than AWS (rclone, MinIO) fail.
        # Without a checksum header botocore SHA-256s every payload in Python, over https too;
        # a default client sends a CRC32 header instead and signs no payload. As the S3 probe
        # does, no payload is signed: on the embedded server that was 7-10% of a save's time.
        opts: dict[str, Any] = {
            "config_kwargs": {
                "connect_timeout": 5,
                "read_timeout": 120,
                "retries": {"total_max_attempts": 2},
                "request_checksum_calculation": "when_required",
                "response_checksum_validation": "when_required",
                "s3": {"payload_signing_enabled": False},
            }
        }
        bounded = bounded_session(self.timeout_s)
        if bounded is not None:
            opts["config_kwargs"]["http_session_cls"] = bounded
        if self.endpoint_url:
            opts["client_kwargs"] = {"endpoint_url": self.endpoint_url}
        if self.key_id and self.secret:
            opts["key"], opts["secret"] = self.key_id, self.secret
        return opts


_BOUNDED: dict[float, Any] = {}


def bounded_session(total_s: float) -> Any:
    """aiobotocore's HTTP session with a whole-request timeout of `total_s` (connect to last
    byte): its read timeout bounds each read, so an endpoint that answers a byte now and then
    would hold a save or the bucket check forever. None where aiobotocore cannot take one."""
    if total_s not in _BOUNDED:
        try:
            import inspect

            import aiohttp
            from aiobotocore.config import AioConfig
            from aiobotocore.httpsession import AIOHTTPSession
        except ImportError:
            return None
        if "http_session_cls" not in inspect.signature(AioConfig.__init__).parameters:
            return None

        class Bounded(AIOHTTPSession):
            def __init__(self, *args: Any, **kwargs: Any):
                super().__init__(*args, **kwargs)
                per_read = self._timeout  # type: ignore[has-type]  # aiobotocore's, set by its __init__
                self._timeout = aiohttp.ClientTimeout(
                    total=total_s, sock_connect=per_read.sock_connect, sock_read=per_read.sock_read
                )

        _BOUNDED[total_s] = Bounded
    return _BOUNDED[total_s]


def parse_target(text: str) -> Target:
    raw = str(text).strip()
    if not raw:
        raise UsageError("invalid --target '': expected a directory or s3://bucket/prefix, e.g. --target /tmp/ck")
    if "://" in raw:
        parsed = urlparse(raw)
        if parsed.scheme != "s3":
            raise UsageError(
                f"invalid --target {raw!r}: only local directories and s3:// URLs are supported, "
                f"e.g. --target s3://ckpt/run1"
            )
        bucket = parsed.netloc
        if not bucket:
            raise UsageError(f"invalid --target {raw!r}: no bucket; expected s3://bucket/prefix, e.g. s3://ckpt/run1")
        from .s3client import check_bucket

        check_bucket(bucket, "--target", raw)
        prefix = parsed.path.strip("/")
        return Target("s3", f"{bucket}/{prefix}" if prefix else bucket, bucket)
    return Target("local", os.path.abspath(os.path.expanduser(raw)))


def required_bytes(size_bytes: int) -> int:
    """Free space a run needs: one checkpoint on disk at a time (the previous one is removed
    before the next save) plus a margin."""
    return int(size_bytes * 1.05) + SPACE_MARGIN_BYTES


def check_free_space(directory: str, need: int, what: str) -> None:
    stat = os.statvfs(directory)
    free = stat.f_bavail * stat.f_frsize
    if free < need:
        raise UsageError(
            f"not enough free space for {what}: needs about {format_bytes_human(need)} "
            f"but {directory} has {format_bytes_human(free)} free; use a smaller --size or "
            f"another --target"
        )


def existing_ancestor(path: str) -> str:
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def unique_name() -> str:
    return f"microbench-ckpt-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"


def check_endpoint_reachable(url: str, timeout_s: float = 5.0) -> None:
    from .s3client import check_endpoint

    parsed = urlparse(check_endpoint(url))  # a malformed URL is named there, its password hidden
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname, port), timeout=timeout_s):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise RunError(
            f"cannot reach the S3 endpoint {url}: {reason}; check --endpoint (without it an embedded server is started)"
        ) from None


class RunDir:
    """The run's own directory under the target. Rank 0 creates and removes it; every rank
    builds DCP writers and readers for its subdirectories."""

    def __init__(self, target: Target, name: str, s3: S3Access | None = None):
        self.target, self.name, self.s3 = target, name, s3
        self.created: list[str] = []  # local target directories this run made, deepest last
        self._fs: Any = None

    # -- locations ---------------------------------------------------------------------
    @property
    def root(self) -> str:
        return (
            os.path.join(self.target.path, self.name)
            if self.target.kind == "local"
            else f"{self.target.path}/{self.name}"
        )

    @property
    def display(self) -> str:
        return self.root if self.target.kind == "local" else f"s3://{self.root}"

    def sub(self, name: str) -> str:
        return os.path.join(self.root, name) if self.target.kind == "local" else f"s3://{self.root}/{name}"

    def fs(self) -> Any:
        if self._fs is None:
            import s3fs

            assert self.s3 is not None
            self._fs = s3fs.S3FileSystem(**self.s3.control_options())
            self._fs.retries = 1  # s3fs's own retry loop (5 by default) around botocore's, not an __init__ option here
        return self._fs

    # -- DCP storage --------------------------------------------------------------------
    def writer(self, sub: str, thread_count: int) -> Any:
        import torch.distributed.checkpoint as dcp

        if self.target.kind == "local":
            return dcp.FileSystemWriter(self.sub(sub), thread_count=thread_count, sync_files=True)
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        # An S3 object is durable once its upload completes at close; DCP's fsync fallback
        # for streams without a descriptor is os.sync() of the whole machine, so it is off.
        assert self.s3 is not None
        return FsspecWriter(self.sub(sub), thread_count=thread_count, sync_files=False, **self.s3.storage_options())

    def reader(self, sub: str) -> Any:
        import torch.distributed.checkpoint as dcp

        if self.target.kind == "local":
            return dcp.FileSystemReader(self.sub(sub))
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        assert self.s3 is not None
        return FsspecReader(self.sub(sub), **self.s3.storage_options())

    def implementation(self) -> dict[str, Any]:
        if self.target.kind == "local":
            return {
                "storage": "FileSystemWriter/FileSystemReader",
                "target_kind": "local",
                "durable_when": "fsync of every file (sync_files=True)",
            }
        assert self.s3 is not None
        return {
            "storage": "FsspecWriter/FsspecReader (s3fs)",
            "target_kind": "s3",
            "s3_endpoint": self.s3.endpoint_url or "default (AWS)",
            "s3_embedded_server": self.s3.embedded,
            "durable_when": "every object's upload completed (S3 PUT/multipart complete)",
            "payload_signing": False,
        }

    # -- lifecycle (rank 0) -----------------------------------------------------------------
    def create(self) -> None:
        if self.target.kind == "s3":
            self._check_bucket()
            return
        missing = []
        path = self.target.path
        while not os.path.exists(path):
            if os.path.lexists(path):
                # exists() is False for a symlink loop or a dangling link, and mkdir on it
                # would fail with a bare "File exists".
                raise UsageError(
                    f"invalid --target {self.target.path!r}: {_broken_link(path)}; expected a "
                    f"directory or a path to create, e.g. --target /tmp/ck"
                )
            missing.append(path)
            path = os.path.dirname(path)
        if not os.path.isdir(path):
            raise UsageError(f"invalid --target {self.target.path!r}: {path} is not a directory")
        try:
            for directory in reversed(missing):
                try:
                    os.mkdir(directory)
                except FileExistsError:
                    # exists() said no, yet it is there: its stat failed (a FUSE mount whose
                    # daemon is busy or gone answers stat with an error) or another process made
                    # it meanwhile. Its own stat says which: a directory is taken as it is.
                    if not stat.S_ISDIR(os.stat(directory).st_mode):
                        raise
                    continue
                self.created.append(directory)
            os.mkdir(self.root)
        except OSError as exc:
            self._remove_created()
            raise RunError(
                f"cannot write under --target {self.target.path}: {dead_mount_reason(exc) or exc.strerror or exc}"
            ) from None

    def _check_bucket(self) -> None:
        fs = self.fs()
        assert self.s3 is not None  # fs() has made the client from it
        try:
            fs.ls(self.target.bucket, refresh=True)
        except FileNotFoundError:
            raise RunError(
                f"S3 bucket {self.target.bucket!r} does not exist at {self.s3.endpoint_url or 'AWS'}; "
                f"create it first or choose another --target"
            ) from None
        except PermissionError as exc:
            raise RunError(
                f"S3 endpoint {self.s3.endpoint_url or 'AWS'} refused access to bucket "
                f"{self.target.bucket!r} (check the AWS credentials): {_first_line(exc)}"
            ) from None
        except Exception as exc:
            raise RunError(
                f"S3 endpoint {self.s3.endpoint_url or 'AWS'} failed listing bucket "
                f"{self.target.bucket!r}: {_first_line(exc)}"
            ) from None

    def remove_sub(self, sub: str) -> None:
        if self.target.kind == "local":
            shutil.rmtree(self.sub(sub), ignore_errors=True)
            return
        fs = self.fs()
        path = f"{self.root}/{sub}"
        if fs.exists(path):
            fs.rm(path, recursive=True)
        fs.invalidate_cache()

    def remove(self) -> None:
        if self.target.kind == "local":
            shutil.rmtree(self.root, ignore_errors=True)
            self._remove_created()
            return
        fs = self.fs()
        try:
            fs.invalidate_cache()
            if fs.exists(self.root):
                fs.rm(self.root, recursive=True)
        except Exception:
            pass

    def _remove_created(self) -> None:
        for directory in reversed(self.created):
            try:
                os.rmdir(directory)  # only if empty: never remove what someone else put there
            except OSError:
                break
        self.created = []

    def drop_page_cache(self, sub: str) -> str:
        """Evict the checkpoint's pages so a load reads the storage, not memory. For the embedded
        S3 server that means its data files; a remote server's cache is out of reach."""
        if self.target.kind == "local":
            base = self.sub(sub)
        elif self.s3 is not None and self.s3.embedded and self.s3.root_dir:
            base = os.path.join(self.s3.root_dir, self.root, sub)
        else:
            return "not dropped (remote S3 server)"
        drop_pages((os.path.join(d, name) for d, _dirs, files in os.walk(base) for name in files), sync=True)
        return "dropped before each load (posix_fadvise DONTNEED)"


def preflight_local(target: Target, size_bytes: int) -> None:
    """Before any rank starts: the target can be written and has room (UsageError, exit 2, as
    every probe's check before work). Leaves nothing behind."""
    from ..results.outputs import why_unwritable
    from .mount.facts import check_alive

    base = existing_ancestor(target.path)
    check_alive(base)  # a dead FUSE mount would look merely unwritable (exit 2): it is a failure (exit 1)
    why = why_unwritable(base) if os.path.isdir(base) else None
    if why:
        raise UsageError(
            f"invalid --target {target.path!r}: {why}; give a directory this user can write, e.g. --target /tmp/ck"
        )
    probe = RunDir(target, unique_name() + "-preflight")
    probe.create()
    try:
        check_free_space(probe.root, required_bytes(size_bytes), f"a {format_bytes_human(size_bytes)} checkpoint")
    finally:
        probe.remove()


def _broken_link(path: str) -> str:
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"{path} is a symlink loop (too many levels of symbolic links)"
    return f"{path} is a symlink to {os.readlink(path)!r}, which does not exist"


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:300] if lines else type(exc).__name__

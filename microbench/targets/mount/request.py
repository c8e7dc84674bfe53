"""What `mount up` is asked and what it leaves running: the request and the checks that refuse its
misuse before anything starts (exit 2), and the state kept in state.json."""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from ...core.errors import UsageError
from . import system as sysm

MODES = ("direct", "cached")
DEFAULT_WRITE_BACK_S = 5.0
READY_TIMEOUT_S = 20.0
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,15}$")


@dataclass
class MountRequest:
    name: str
    mode: str
    path: str | None = None  # default: <state dir>/mnt
    cache_dir: str | None = None  # cached: the local disk for the cache (default: the state dir)
    write_back_s: float = DEFAULT_WRITE_BACK_S
    endpoint: str | None = None  # None: the embedded server
    bucket: str | None = None
    timeout_s: float = READY_TIMEOUT_S


@dataclass
class MountState:
    """What `up` started, as kept in state.json. `secret` fields never leave that file."""

    name: str
    path: str
    mode: str
    bucket: str
    endpoint: str
    embedded: bool
    write_back_s: float | None
    cache_dir: str | None  # rclone's --cache-dir: ours, removed by down
    rclone_pid: int
    rclone_version: str | None
    created_path: bool = False
    server_pid: int | None = None
    server_root: str | None = None
    key: str | None = field(default=None, repr=False)
    secret: str | None = field(default=None, repr=False)
    started_at: float = 0.0

    def public(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("key"), out.pop("secret")
        out["backing_store"] = self.backing()
        return out

    def backing(self) -> str:
        where = "embedded S3 server (rclone serve s3)" if self.embedded else "S3 endpoint"
        return f"{where} {self.endpoint}, bucket {self.bucket}"


def check_name(name: str) -> str:
    if not _NAME_RE.match(str(name)):
        raise UsageError(
            f"invalid --name {name!r}: expected 1-16 of a-z, 0-9, '-' and '_', starting with a letter "
            f"or digit, e.g. --name m"
        )
    return name


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise UsageError(f"invalid --mode {mode!r}: expected one of {', '.join(MODES)}, e.g. --mode cached")
    return mode


def validate(req: MountRequest) -> MountRequest:
    """Misuse refused before anything starts (exit 2): name, mode, mount point, cache dir."""
    check_name(req.name)
    check_mode(req.mode)
    if req.endpoint and not req.bucket:
        raise UsageError("--endpoint needs --bucket: an existing bucket to mount, e.g. --bucket my-bucket")
    if req.bucket is not None:
        from ..s3client import check_bucket

        check_bucket(req.bucket)
    if req.write_back_s < 0:
        raise UsageError(f"invalid --write-back {req.write_back_s!r}: expected a duration >= 0, e.g. --write-back 5s")
    if req.mode == "direct" and req.cache_dir is not None:
        raise UsageError("--cache-dir only applies to --mode cached (a direct mount has no write cache)")
    if req.path is not None:
        path = os.path.realpath(req.path)
        parent = os.path.dirname(path)
        if not os.path.exists(path) and not os.path.isdir(parent):
            # up makes the mount point itself, not a tree of directories a typo would grow.
            raise UsageError(
                f"mount point {req.path!r}: directory {parent!r} does not exist; give a mount point "
                f"in an existing directory, e.g. --path /mnt/bucket"
            )
        if sysm.mount_at(path) is not None:
            raise UsageError(
                f"mount point {req.path!r} is already mounted; give an empty directory that is not a "
                f"mount point, e.g. --path /mnt/bucket"
            )
        if os.path.exists(path):
            if not os.path.isdir(path):
                raise UsageError(
                    f"mount point {req.path!r} is not a directory; give an empty directory, e.g. --path /mnt/bucket"
                )
            if os.listdir(path):
                raise UsageError(
                    f"mount point {req.path!r} is not empty: a mount would hide what is there; give an "
                    f"empty directory, e.g. --path /mnt/bucket"
                )
        if req.cache_dir is not None:
            cache = os.path.realpath(req.cache_dir)
            if cache == path or cache.startswith(path.rstrip("/") + "/"):
                raise UsageError(
                    f"--cache-dir {req.cache_dir!r} is on the mount {req.path!r} itself: the cache must "
                    f"be a local disk, e.g. --cache-dir /var/tmp"
                )
    if req.cache_dir is not None:
        check_cache_dir(req.cache_dir)
        cache = os.path.realpath(req.cache_dir)
        holder = sysm.mount_of(cache)
        if holder and holder["fstype"].startswith("fuse.rclone"):
            raise UsageError(
                f"--cache-dir {req.cache_dir!r} is on the rclone mount at {holder['mount_point']!r}: "
                f"the cache must be a local disk, e.g. --cache-dir /var/tmp"
            )
    return req


def check_cache_dir(text: str) -> str:
    """A --cache-dir the cache can be made in: its nearest existing ancestor a directory this
    user can write, on a filesystem that is not read-only (else rclone mounts, and every write
    through the mount fails later)."""
    from ...results.outputs import why_unwritable

    if not str(text).strip():
        raise UsageError(f"invalid --cache-dir {text!r}: empty; give a local directory, e.g. --cache-dir /var/tmp")
    place = os.path.realpath(text)
    while not os.path.exists(place) and os.path.dirname(place) != place:
        place = os.path.dirname(place)
    if not os.path.isdir(place):
        raise UsageError(
            f"invalid --cache-dir {text!r}: {place!r} is not a directory; give a local directory, "
            f"e.g. --cache-dir /var/tmp"
        )
    why = why_unwritable(place)
    if why:
        raise UsageError(
            f"invalid --cache-dir {text!r}: {why}; give a local directory this user can write, "
            f"e.g. --cache-dir /var/tmp"
        )
    return text

"""A bucket mounted as people mount it: `rclone mount` at a path, direct or cached.

`direct` has no write cache (`--vfs-cache-mode off`): every write streams to the bucket and
close returns once the object is uploaded. `cached` is rclone's full VFS cache on a local disk
(`--vfs-cache-mode full`): writes land in the cache and are uploaded `--write-back` after close,
so a save "returns" before the store holds it.

`up` leaves the mount (and, without --endpoint, the embedded S3 server it mounts) running
after the command ends. What it started is kept in a private state directory per name,
`<state root>/mount-<name>/` (0700): `state.json` (0600; pids, port, paths, and for the
embedded server its generated key pair, which the probes need to poll the store), the logs,
the embedded server's data and the default cache and mount point. Credentials travel to rclone
only in its environment (RCLONE_CONFIG_MBS3_*), never on its command line, and are never
printed or put in a record. Leftovers of a crash are found from the system, as the lab finds
its own: rclone mounts named `microbench-<name>:` in /proc/self/mountinfo, rclone processes
whose command line names that device or state directory.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ...core.claim import exclusive
from ...core.errors import RunError, UsageError
from . import system as sysm

MODES = ("direct", "cached")
DEVNAME_PREFIX = "microbench-"
REMOTE = "MBS3"          # rclone remote name, configured only through the environment
DEFAULT_WRITE_BACK_S = 5.0
READY_TIMEOUT_S = 20.0
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,15}$")


@dataclass
class MountRequest:
    name: str
    mode: str
    path: str | None = None            # default: <state dir>/mnt
    cache_dir: str | None = None       # cached: the local disk for the cache (default: the state dir)
    write_back_s: float = DEFAULT_WRITE_BACK_S
    endpoint: str | None = None        # None: the embedded server
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
    cache_dir: str | None              # rclone's --cache-dir: ours, removed by down
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
        raise UsageError(f"invalid --name {name!r}: expected 1-16 of a-z, 0-9, '-' and '_', starting with a letter "
                         f"or digit, e.g. --name m")
    return name


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise UsageError(f"invalid --mode {mode!r}: expected one of {', '.join(MODES)}, e.g. --mode cached")
    return mode


def state_dir(name: str) -> Path:
    return sysm.state_root() / f"mount-{name}"


def devname(name: str, bucket: str) -> str:
    return f"{DEVNAME_PREFIX}{name}:{bucket}"


# --------------------------------------------------------------------------- checks before any work


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
            raise UsageError(f"mount point {req.path!r}: directory {parent!r} does not exist; give a mount point "
                             f"in an existing directory, e.g. --path /mnt/bucket")
        if sysm.mount_at(path) is not None:
            raise UsageError(f"mount point {req.path!r} is already mounted; give an empty directory that is not a "
                             f"mount point, e.g. --path /mnt/bucket")
        if os.path.exists(path):
            if not os.path.isdir(path):
                raise UsageError(f"mount point {req.path!r} is not a directory; give an empty directory, "
                                 f"e.g. --path /mnt/bucket")
            if os.listdir(path):
                raise UsageError(f"mount point {req.path!r} is not empty: a mount would hide what is there; give an "
                                 f"empty directory, e.g. --path /mnt/bucket")
        if req.cache_dir is not None:
            cache = os.path.realpath(req.cache_dir)
            if cache == path or cache.startswith(path.rstrip("/") + "/"):
                raise UsageError(f"--cache-dir {req.cache_dir!r} is on the mount {req.path!r} itself: the cache must "
                                 f"be a local disk, e.g. --cache-dir /var/tmp")
    if req.cache_dir is not None:
        check_cache_dir(req.cache_dir)
        cache = os.path.realpath(req.cache_dir)
        holder = sysm.mount_of(cache)
        if holder and holder["fstype"].startswith("fuse.rclone"):
            raise UsageError(f"--cache-dir {req.cache_dir!r} is on the rclone mount at {holder['mount_point']!r}: "
                             f"the cache must be a local disk, e.g. --cache-dir /var/tmp")
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
        raise UsageError(f"invalid --cache-dir {text!r}: {place!r} is not a directory; give a local directory, "
                         f"e.g. --cache-dir /var/tmp")
    why = why_unwritable(place)
    if why:
        raise UsageError(f"invalid --cache-dir {text!r}: {why}; give a local directory this user can write, "
                         f"e.g. --cache-dir /var/tmp")
    return text


# --------------------------------------------------------------------------- up


def up(req: MountRequest) -> tuple[MountState, list[str]]:
    """Mount; returns the state and what leftovers of an earlier crash were removed first. Two
    `up` of one name at once: the second is refused while the first holds the name's claim."""
    validate(req)
    reason = sysm.fuse_unavailable_reason()
    if reason:
        raise RunError(f"cannot mount: {reason}")
    binary = sysm.rclone_or_fail()
    with exclusive(sysm.state_root() / "locks" / f"mount-{req.name}",
                   f"mount {req.name!r} is being set up by another `microbench mount up --name {req.name}`; wait "
                   f"for it, then see `microbench mount status --name {req.name}`, or pick another --name"):
        return _claimed_up(req, binary)


def _claimed_up(req: MountRequest, binary: str) -> tuple[MountState, list[str]]:
    existing = read_state(req.name)
    if existing is not None and sysm.mount_at(existing.path) is not None and sysm.alive(existing.rclone_pid):
        raise UsageError(f"mount {req.name!r} is already up at {existing.path!r} ({existing.mode}); run "
                         f"`microbench mount down --name {req.name}` first or pick another --name")
    leftovers = down(req.name)
    home = state_dir(req.name)
    home.mkdir(mode=0o700, parents=True)
    started: dict[str, Any] = {}
    try:
        return _up(req, binary, home, started), leftovers
    except BaseException:
        _undo(req.name, started)
        raise


def _up(req: MountRequest, binary: str, home: Path, started: dict[str, Any]) -> MountState:
    from ..s3client import Target, check_endpoint, preflight
    from ..s3server import DEFAULT_BUCKET, EmbeddedS3, rclone_version

    bucket = req.bucket or DEFAULT_BUCKET
    env = {**os.environ, "RCLONE_CONFIG": os.devnull, f"RCLONE_CONFIG_{REMOTE}_TYPE": "s3",
           f"RCLONE_CONFIG_{REMOTE}_PROVIDER": "Other", f"RCLONE_CONFIG_{REMOTE}_FORCE_PATH_STYLE": "true",
           f"RCLONE_CONFIG_{REMOTE}_NO_CHECK_BUCKET": "true",
           # Parts as large and as many in flight as the S3 probe's defaults, so a mount and the
           # API are compared on the same upload (rclone's own default: 5 MiB parts).
           f"RCLONE_CONFIG_{REMOTE}_CHUNK_SIZE": "16M", f"RCLONE_CONFIG_{REMOTE}_UPLOAD_CONCURRENCY": "4"}
    key = secret = None
    server = None
    if req.endpoint:
        target = Target(check_endpoint(req.endpoint))
        preflight(target, bucket, timeout_s=min(req.timeout_s, 10))   # unreachable, credentials: exit 1 here
        env.update({f"RCLONE_CONFIG_{REMOTE}_ENDPOINT": req.endpoint, f"RCLONE_CONFIG_{REMOTE}_ENV_AUTH": "true"})
        region = target.session().get_config_variable("region")
        if region:
            env[f"RCLONE_CONFIG_{REMOTE}_REGION"] = region
        endpoint = target.describe()["endpoint"]
    else:
        server = EmbeddedS3(bucket=bucket, root=home / "s3", detached=True, log=str(home / "s3.log"))
        server.start()
        started["server"] = server
        key, secret = server.credentials.access_key_id, server.credentials.secret_access_key
        preflight(Target.for_embedded(server), bucket, timeout_s=min(req.timeout_s, 10))
        env.update(
            {
                f"RCLONE_CONFIG_{REMOTE}_ENDPOINT": server.endpoint_url,
                f"RCLONE_CONFIG_{REMOTE}_REGION": "us-east-1",
                f"RCLONE_CONFIG_{REMOTE}_ACCESS_KEY_ID": key,
                f"RCLONE_CONFIG_{REMOTE}_SECRET_ACCESS_KEY": secret,
            }
        )
        endpoint = server.endpoint_url
    path = os.path.realpath(req.path) if req.path else str(home / "mnt")
    created = not os.path.exists(path)
    if created:
        os.makedirs(path, mode=0o755)
        started["path"] = path
    argv = [binary, "mount", f"{REMOTE}:{bucket}", path, "--devname", devname(req.name, bucket),
            "--log-file", str(home / "mount.log"), "--log-level", "NOTICE",
            # Uploads in the S3 probe's parts (16 MiB, 4 in flight), not rclone's 5 MiB: the same
            # requests the probe's PUT makes, so the two compare like for like.
            "--s3-chunk-size", "16M", "--s3-upload-concurrency", "4"]
    cache = None
    if req.mode == "cached":
        base = Path(req.cache_dir) if req.cache_dir else home
        cache = str(base / f"microbench-mount-{req.name}-cache")
        if os.path.exists(cache):
            shutil.rmtree(cache)   # ours by its name: a crashed run's cache
        started["cache"] = cache
        # Not --write-back-cache: it makes the blocked write slower (docs/BENCHMARKS.md has the
        # figures).
        argv += ["--vfs-cache-mode", "full", "--cache-dir", cache, "--vfs-write-back", f"{req.write_back_s:g}s"]
    else:
        argv += ["--vfs-cache-mode", "off"]
    with open(home / "mount.out", "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env,
                                start_new_session=True)
    started["rclone"] = proc.pid
    _wait_mounted(proc, path, home, req.timeout_s)
    state = MountState(name=req.name, path=path, mode=req.mode, bucket=bucket, endpoint=endpoint,
                       embedded=server is not None, write_back_s=req.write_back_s if req.mode == "cached" else None,
                       cache_dir=cache, rclone_pid=proc.pid, rclone_version=rclone_version(binary),
                       created_path=created, server_pid=server.pid if server else None,
                       server_root=str(server.root) if server else None, key=key, secret=secret,
                       started_at=time.time())
    sysm.write_private_json(home / "state.json", asdict(state))
    return state


def _wait_mounted(proc: subprocess.Popen, path: str, home: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RunError(f"rclone mount exited with status {proc.returncode} before {path!r} was mounted: "
                           f"{sysm.log_tail(home / 'mount.log', home / 'mount.out')}")
        info = sysm.mount_at(path)
        if info is not None and info["fstype"].startswith("fuse.rclone"):
            return
        time.sleep(0.05)
    raise RunError(f"rclone mount did not mount {path!r} within {timeout_s:g} s: "
                   f"{sysm.log_tail(home / 'mount.log', home / 'mount.out')}")


def _undo(name: str, started: dict[str, Any]) -> None:
    """A failed up leaves nothing: no mount, no process, no cache, no state."""
    path = started.get("path")
    if "rclone" in started:
        if path:
            sysm.unmount(path)
        sysm.stop_pid(started["rclone"])
    if started.get("server") is not None:
        started["server"].detached = False
        started["server"].stop()
    down(name)
    if path:
        try:
            os.rmdir(path)
        except OSError:
            pass


# --------------------------------------------------------------------------- state, down, status


def read_state(name: str) -> MountState | None:
    path = state_dir(name) / "state.json"
    try:
        data = json.loads(path.read_text())
        return MountState(**data)
    except (OSError, ValueError, TypeError):
        return None


def names() -> list[str]:
    """Every mount name with a state directory or an rclone mount named by us."""
    found = set()
    root = sysm.state_root()
    if root.is_dir():
        found |= {p.name[len("mount-"):] for p in root.iterdir() if p.name.startswith("mount-")}
    for info in sysm.mounts():
        if info["source"].startswith(DEVNAME_PREFIX) and info["fstype"].startswith("fuse.rclone"):
            found.add(info["source"][len(DEVNAME_PREFIX):].split(":", 1)[0])
    return sorted(found)


def down(name: str) -> list[str]:
    """Unmount, stop what up started, remove the cache, the state and a mount point up made.
    Works from the state file and, for a crash's leftovers, from the system. Returns what it removed."""
    check_name(name)
    removed: list[str] = []
    state = read_state(name)
    home = state_dir(name)
    points = {info["mount_point"] for info in sysm.mounts()
              if info["source"].startswith(f"{DEVNAME_PREFIX}{name}:") and info["fstype"].startswith("fuse.rclone")}
    if state is not None and sysm.mount_at(state.path) is not None:
        points.add(state.path)
    for point in sorted(points, key=len, reverse=True):
        sysm.unmount(point)
        removed.append(f"mount {point}")
    # The state directory with its slash: a bare prefix would match every name that starts with this one.
    marks = (f"--devname {DEVNAME_PREFIX}{name}:", f"{home}/")
    pids = set(sysm.rclone_pids(marks))
    if state is not None:
        pids |= {p for p in (state.rclone_pid, state.server_pid) if p and sysm.is_rclone(p, marks)}
    for pid in sorted(pids):
        sysm.stop_pid(pid)
        removed.append(f"rclone pid {pid}")
    if state is not None and state.cache_dir and os.path.exists(state.cache_dir):
        shutil.rmtree(state.cache_dir, ignore_errors=True)
        removed.append(f"cache {state.cache_dir}")
    if state is not None and state.created_path and os.path.isdir(state.path) and not home_contains(home, state.path):
        try:
            os.rmdir(state.path)
            removed.append(f"mount point {state.path}")
        except OSError:
            pass
    if home.exists():
        shutil.rmtree(home, ignore_errors=True)
        removed.append(f"state {home}")
    return removed


def home_contains(home: Path, path: str) -> bool:
    return os.path.realpath(path).startswith(str(home) + "/")


def status(name: str | None = None) -> list[dict[str, Any]]:
    """Every mount (or the one named): up, broken, or a crash's leftover. A name nothing on this
    machine carries is a UsageError, not a leftover."""
    out = []
    if name and check_name(name) not in names():
        raise UsageError(f"no mount named {name!r} on this machine (none is up or left over); "
                         f"`microbench mount status` lists them, `microbench mount up --name {name}` makes one")
    for each in ([name] if name else names()):
        state = read_state(each)
        if state is None:
            out.append({"name": each, "state": "leftover (no state file): run `microbench mount down --name "
                                                f"{each}`"})
            continue
        info = sysm.mount_at(state.path)
        healthy = info is not None and sysm.alive(state.rclone_pid) and sysm.responsive(state.path)
        row = {**state.public(), "state": "up" if healthy else "broken: run `microbench mount down --name "
                                                               f"{each}`"}
        if state.cache_dir:
            row["cache_bytes"] = sysm.tree_bytes(state.cache_dir)
        out.append(row)
    return out

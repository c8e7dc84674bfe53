"""Where storage probes may write: a unique directory they create under --path, files they
create themselves (O_EXCL, so nothing that existed is ever overwritten), removed afterwards
unless kept. Also the facts a storage record states about its target: filesystem, device,
free space, whether O_DIRECT really works there.
"""

from __future__ import annotations

import errno
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import RunError, UsageError
from ..core.units import format_bytes_human
from ..results.outputs import why_unwritable

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def check_base(path: str, *, writable: bool = False, flag: str = "--path") -> Path:
    """An existing directory to write under (--path), or UsageError naming what it is instead.
    writable: also refuse a read-only mount or a directory this user cannot write (the suite's
    scratch, made before any step runs). flag: how the messages name the option (--target)."""
    if not str(path).strip():
        # Path('') is Path('.'): an empty --path would quietly test whatever the working directory is.
        raise UsageError(f"{flag} {path!r} is empty; give an existing directory to write under, e.g. {flag} /tmp")
    base = Path(path)
    from .mount.facts import check_alive

    check_alive(str(path))  # a dead bucket mount: "does not exist" would send the user looking elsewhere
    try:
        os.stat(base)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UsageError(
                f"{flag} {path!r} is a symlink loop (too many levels of symbolic links); give an "
                f"existing directory to write under, e.g. {flag} /tmp"
            ) from None
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
            # A FUSE mount whose daemon just died answers ENOTCONN before its process is reaped.
            raise RunError(
                f"{flag} {path!r} cannot be read: {exc.strerror} (a dead or hung mount?); "
                f"check the filesystem under it, e.g. `microbench mount status`"
            ) from None
    if not base.exists():
        raise UsageError(f"{flag} {path!r} does not exist; give an existing directory to write under, e.g. {flag} /tmp")
    if not base.is_dir():
        raise UsageError(f"{flag} {path!r} is not a directory; give a directory to write under, e.g. {flag} /tmp")
    why = why_unwritable(base) if writable else None
    if why:
        # A FUSE mount whose daemon just died can still answer stat from its cache, and then
        # looks merely unwritable: a real lookup says what it is.
        try:
            os.listdir(base)
        except OSError as exc:
            if dead_mount_reason(exc):
                check_alive(str(path))
                raise RunError(f"{flag} {path!r}: {dead_mount_reason(exc)}") from None
        raise UsageError(f"{flag} {path!r}: {why}; give a directory this user can write, e.g. {flag} /tmp")
    return base


def free_bytes(path: str | os.PathLike) -> int:
    try:
        st = os.statvfs(path)
    except OSError as exc:
        # A bucket mount whose rclone died between the checks and now: name the mount if it is one.
        from .mount.facts import check_alive

        check_alive(str(path))
        raise RunError(
            f"cannot read the free space under {str(path)!r}: {dead_mount_reason(exc) or exc.strerror}"
        ) from None
    return st.f_bavail * st.f_frsize


def check_free_space(path: str | os.PathLike, needed: int, what: str) -> None:
    """Room for `needed` bytes under `path`, checked before any work: a shortfall is misuse of
    the place or the size (UsageError, exit 2), as every probe's own space check is; running
    out during the work is a RunError (exit 1) where the write fails."""
    free = free_bytes(path)
    if free < needed:
        raise UsageError(
            f"not enough free space under {str(path)!r}: the run needs {format_bytes_human(needed)} "
            f"({what}) but only {format_bytes_human(free)} is free; use a smaller --size or another --path"
        )


def mount_of(path: str | os.PathLike) -> dict[str, str]:
    """Filesystem type, source device and mount point of the mount holding `path` (the one
    mountinfo reader, targets/mount/system.py, on the real path); "unknown" where none is found."""
    from .mount.system import mount_of as holding

    found = holding(os.path.realpath(path))
    if found is None:
        return {"fstype": "unknown", "source": "unknown", "mount_point": "/"}
    return {"fstype": found["fstype"], "source": found["source"], "mount_point": found["mount_point"]}


def logical_block_size(path: str | os.PathLike) -> int:
    """The device's logical block size (O_DIRECT's minimum alignment); the page size when unknown."""
    dev = os.stat(path).st_dev
    sysfs = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    for candidate in (sysfs / "queue" / "logical_block_size", sysfs / ".." / "queue" / "logical_block_size"):
        try:
            return int(candidate.read_text().strip())
        except (OSError, ValueError):
            continue
    return PAGE


def direct_alignment(path: str | os.PathLike) -> int:
    """Block sizes and offsets for O_DIRECT must be multiples of this. Some devices accept
    512 B, but 4K-sector drives and most filesystems' blocks need 4K, so asking for the page
    size keeps a result from one machine valid on the next."""
    return max(PAGE, logical_block_size(path))


class WorkDir:
    """A unique directory under `base`; `cleanup()` removes exactly what was created here."""

    def __init__(self, base: str, *, keep: bool = False, prefix: str = "microbench-"):
        check_base(base)
        try:
            self.path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
        except OSError as exc:
            raise RunError(
                f"cannot write under --path {base!r}: {exc.strerror or exc}; "
                f"give a writable directory, e.g. --path /tmp"
            ) from None
        self.keep = keep
        self.files: list[Path] = []

    def new_file(self, name: str) -> Path:
        path = self.path / name
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        fd = os.open(path, flags, 0o600)  # O_EXCL: never replaces a file we didn't create
        self.files.append(path)
        os.close(fd)
        return path

    def remove_file(self, path: Path) -> None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        if path in self.files:
            self.files.remove(path)

    def probe_direct(self) -> tuple[bool, str | None]:
        """Whether O_DIRECT opens here; the reason when it doesn't (tmpfs before Linux 6.6...)."""
        if not hasattr(os, "O_DIRECT"):
            return False, "this OS has no O_DIRECT"
        try:
            probe = self.new_file(".odirect-probe")
        except OSError as exc:
            raise RunError(f"cannot create a file in {str(self.path)!r}: {exc.strerror}") from None
        # Opened apart from creating it: a refused O_DIRECT open may still have created the file.
        try:
            os.close(os.open(probe, os.O_RDONLY | os.O_DIRECT))
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            fs = mount_of(self.path)["fstype"]
            return False, f"{fs} at {str(self.path.parent)!r} refuses O_DIRECT (open: EINVAL)"
        finally:
            self.remove_file(probe)
        return True, None

    def cleanup(self) -> None:
        if self.keep:
            return
        for path in list(self.files):
            self.remove_file(path)
        try:
            self.path.rmdir()
        except OSError:
            pass  # something else was put there: leave it rather than delete what isn't ours

    def facts(self) -> dict[str, Any]:
        from .mount.facts import facts_for_path

        mount = mount_of(self.path)
        return {
            "workdir": str(self.path),
            "filesystem": mount["fstype"],
            "device": mount["source"],
            "mount_point": mount["mount_point"],
            "kept": self.keep,
            **(facts_for_path(str(self.path)) or {}),
        }

    def __enter__(self) -> "WorkDir":
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


@dataclass
class IOFailure:
    """Turns an OSError from the engine into one line that says what to do about it."""

    what: str

    def error(self, exc: OSError) -> RunError | UsageError:
        code = exc.errno
        name = errno.errorcode.get(code or 0, "error")
        text = f"{self.what} failed: {exc.strerror or exc} ({name})"
        if code == errno.ENOSPC:
            return RunError(
                f"{self.what} failed: no space left on device (ENOSPC); free some space or use a smaller --size"
            )
        if code in (errno.EROFS, errno.EACCES, errno.EPERM):
            return RunError(f"{text}; give a writable --path")
        if code == errno.EINVAL:
            return UsageError(
                f"{text}: the device refused the O_DIRECT alignment; use a --bs that is a multiple "
                f"of 4K (e.g. --bs 1M) or --buffered"
            )
        return RunError(text)


def dead_mount_reason(exc: OSError) -> str | None:
    """ENOTCONN is a FUSE mount whose daemon died (its process perhaps not yet reaped, so a
    check that looks for the process can still pass): say so, and how to clear it."""
    if exc.errno != errno.ENOTCONN:
        return None
    return (
        f"the mount is dead: {exc.strerror} (its FUSE daemon is gone); unmount it with "
        f"`microbench mount down --name NAME` or fusermount3 -uz"
    )


def drop_pages(paths: Any, sync: bool = False) -> None:
    """Evict these files' cached pages (posix_fadvise DONTNEED), so the next read goes to the
    storage; with `sync`, write their dirty pages first (DONTNEED leaves dirty pages in place).
    A file that is gone is skipped."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            if sync:
                os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

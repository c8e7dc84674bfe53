"""Writing records: atomic (temp file + rename), never replacing a file this run didn't create.

A run claims a unique file name once (O_EXCL), then rewrites that same file atomically after
every finished size, so a crash or Ctrl-C leaves the rows finished so far on disk with
status "running"/"partial", never a half-written JSON document.

A write the filesystem refuses (full, read-only, over quota) is a RunError naming the file and
the cause, for every writer here: a record that was never written is removed again, one that
was keeps its last complete version marked partial (see RecordWriter._write_failed); a CSV or
another whole file is either all there or not there at all.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any, Callable

from ..core.errors import RunError, UsageError
from ..core.jsonfile import load_json
from ..core.redaction import redact_text
from .outputs import DEFAULT_RESULTS_DIR, check_results_dir
from .schema import STATUSES, check_record, check_rows, upgrade, utc_now

DEFAULT_DIR = DEFAULT_RESULTS_DIR
RECORD_EXPECTED = "a microbench record (JSON, UTF-8), e.g. results/suite-20261122-031100/nccl.json"
# Set by a launcher for the ranks it spawns: rank 0 writes the path of the record it claimed
# there, so that if rank 0 is killed or freezes, the launcher can still mark the record partial.
RECORD_NOTE_ENV = "MICROBENCH_RECORD_NOTE"


# Writers whose record still says "running": the command line marks them partial when a command
# ends by an error no layer below caught (cli.py), so no record outlives its run as "running".
_OPEN: "weakref.WeakSet[RecordWriter]" = weakref.WeakSet()
# The top-level status as json.dumps(indent=1) writes it: a string value cannot hold a newline,
# so nothing nested or quoted matches.
_RUNNING = b'\n "status": "running",'


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "run"


class RecordWriter:
    """Owns one record file for the life of a run."""

    def __init__(
        self, record: dict[str, Any], path: str | os.PathLike | None = None, directory: str | os.PathLike = DEFAULT_DIR
    ):
        self.record = record
        self.path: Path = Path()  # claimed below
        self.failed: str | None = None  # why the last write was refused; nothing is written after
        self.saved_rows = 0  # rows in the version on disk
        self._saved: bytes | None = None
        self._made_dir: Path | None = None
        self._check(lambda: check_record(record))  # before claiming a file that would stay empty
        if not path:
            check_results_dir(directory)
        self.path = self._claim(Path(path) if path else None, Path(directory), record["kind"])
        self.flush()
        _OPEN.add(self)
        note = os.environ.get(RECORD_NOTE_ENV)
        if note:
            try:
                with open(note, "a") as handle:
                    handle.write(f"{self.path.resolve()}\n")
            except OSError:
                pass  # only a fallback for a rank 0 that dies; the run itself goes on

    @classmethod
    def resume(cls, path: str | os.PathLike) -> "RecordWriter":
        """The writer of a record another process of this run claimed and wrote (a launcher's
        record, which each phase's rank 0 and then the launcher again carry on): the file's
        content as it is now, rewritten in place from here on. Claims nothing."""
        writer = cls.__new__(cls)
        writer.path = Path(path)
        writer.failed, writer._made_dir = None, None
        try:
            writer._saved = writer.path.read_bytes()
            writer.record = json.loads(writer._saved)
        except (OSError, ValueError) as exc:
            raise RunError(f"cannot read back results file {str(path)!r}: {exc}") from None
        writer.saved_rows = len(writer.record.get("rows", []))
        return writer

    def update(self, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Change the record in place (its summary, say) and rewrite the file."""
        change(self.record)
        self.flush()
        return self.record

    def _claim(self, path: Path | None, directory: Path, kind: str) -> Path:
        if path is not None:
            candidates = [path]
            target_dir = path.parent
        else:
            stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
            base = f"{_safe(kind)}-{stamp}"
            candidates = [directory / f"{base}{'' if i == 0 else f'-{i}'}.json" for i in range(1000)]
            target_dir = directory
        missing = [d for d in (target_dir, *target_dir.parents) if not d.exists()]
        try:
            target_dir.mkdir(parents=True, exist_ok=True)
            self._made_dir = missing[-1] if missing else None
        except OSError as exc:
            raise RunError(f"cannot create results directory {str(target_dir)!r}: {exc.strerror}") from None
        for candidate in candidates:
            try:
                fd = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                continue
            except OSError as exc:
                raise RunError(f"cannot write results file {str(candidate)!r}: {exc.strerror}") from None
            os.close(fd)
            return candidate
        if path is not None:
            raise UsageError(
                f"results file {str(path)!r} already exists; results are never "
                f"overwritten: pick a new name, e.g. --json {path.with_suffix('')}-2.json"
            )
        raise RunError(f"could not find a free results file name in {str(directory)!r}")

    def _check(self, check: Callable[[], None]) -> None:
        """Readers refuse a record that breaks its schema, so writing one is our bug: say so
        before it reaches the disk (the file keeps what was valid so far)."""
        try:
            check()
        except ValueError as exc:
            claimed = getattr(self, "path", Path())  # Path() until the file is claimed
            where = f" {str(claimed)!r}" if claimed != Path() else ""
            raise RunError(f"bug: the {self.record.get('kind')!r} record{where} would not be readable: {exc}") from None

    def add_rows(self, rows: list[dict[str, Any]], *, complete: bool = False) -> None:
        """Append rows and rewrite the file. `complete`: the rows carry every field their kind's
        schema requires (the runner's rows do; a hand-made record may carry fewer)."""
        self._check(lambda: check_rows(self.record, rows, len(self.record["rows"]), complete=complete))
        self.record["rows"].extend(rows)
        self.flush()

    def finish(self, status: str, reason: str | None = None) -> Path:
        if status not in STATUSES:
            raise RunError(f"bug: status {status!r} is not one of {STATUSES}")
        self.record["status"] = status
        # Reasons come from any layer's exception text: a URL password in one never reaches disk.
        self.record["status_reason"] = None if reason is None else redact_text(str(reason))
        self.record["ended_at"] = utc_now()
        if self.failed is None:  # else the file already says partial, and why not more
            self.flush()
        _OPEN.discard(self)
        return self.path

    def flush(self) -> None:
        if self.failed is not None:
            raise RunError(self.failed)
        text = record_text(self.record).encode()
        try:
            atomic_write_text(self.path, text)
        except OSError as exc:
            self._write_failed(exc)
        self._saved, self.saved_rows = text, len(self.record["rows"])

    def _write_failed(self, exc: OSError) -> None:
        """The filesystem refused a rewrite (full, read-only, quota). A record never written is
        removed (an empty file is no record); else its last complete version on disk is marked
        partial: rewritten with the reason where a copy still fits, else its status patched in
        place ("running" and "partial" are the same length, so the patch takes no new block)."""
        self.failed = f"cannot write results file {str(self.path)!r}: {exc.strerror or exc}"
        _OPEN.discard(self)
        if self._saved is None:
            self._remove()
            raise RunError(self.failed) from None
        record = json.loads(self._saved)
        record.update(status="partial", status_reason=redact_text(self.failed), ended_at=utc_now())
        try:
            atomic_write_text(self.path, record_text(record))
        except OSError:
            at = self._saved.find(_RUNNING)
            if at >= 0:
                try:
                    fd = os.open(self.path, os.O_WRONLY)
                    try:
                        os.pwrite(fd, b"partial", at + len(b'\n "status": "'))
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                except OSError:
                    pass  # the line on stderr still says what happened
        raise RunError(self.failed) from None

    def _remove(self) -> None:
        try:
            self.path.unlink()
        except OSError:
            return
        made, here = self._made_dir, self.path.parent
        while made is not None and (here == made or made in here.parents):
            try:
                here.rmdir()  # only an empty directory this run made
            except OSError:
                return
            here = here.parent


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def record_text(record: dict[str, Any]) -> str:
    """A record as its file holds it. A number that is not finite is written as null: JSON has
    no infinity, and the one reader of records (core/jsonfile) refuses one, so a record with a
    bound that is never reached (a breakeven bandwidth of inf) would be written and then never
    read back."""
    return json.dumps(_finite(record), indent=1, sort_keys=False, default=str, allow_nan=False) + "\n"


def mark_abandoned(path: str | os.PathLike, reason: str) -> bool:
    """Mark a record its writer left "running" (killed, frozen) as partial with `reason`; its
    finished rows stay. True if it was changed."""

    def change(record: dict[str, Any]) -> bool:
        if record.get("status") != "running":
            return False
        record.update(status="partial", status_reason=redact_text(reason), ended_at=utc_now())
        return True

    return _rewrite(path, change)


def add_ended_ranks(path: str | os.PathLike, ended: dict[int, tuple[str, str]]) -> bool:
    """Keep in a record what the launcher learnt of the ranks it had to end: rank -> (why it was
    ended, its Python stacks at that moment). True if the record was changed."""

    def change(record: dict[str, Any]) -> bool:
        record["ended_ranks"] = [
            {"rank": rank, "why": redact_text(why), "python_stacks": redact_text(stacks)}
            for rank, (why, stacks) in sorted(ended.items())
        ]
        return True

    return bool(ended) and _rewrite(path, change)


def _rewrite(path: str | os.PathLike, change: Callable[[dict[str, Any]], bool]) -> bool:
    """A record that another process wrote, changed in place (atomically) where `change` says it
    changed it. False when there is no readable record or nothing was written."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(record, dict) or not change(record):
        return False
    try:
        atomic_write_text(Path(path), record_text(record))
    except OSError:
        return False
    return True


def atomic_write_text(path: Path, text: str | bytes, *, mode: int = 0o644) -> None:
    """Write `text` (str or bytes) to `path` through a temp file and a rename: a reader sees the
    old content or the new, never half of it. mode: 0o600 for a file only this user's
    processes should read."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes the file 0600; results are meant to be shared like any file we create.
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def atomic_write_new(path: str | os.PathLike, data: str | bytes, noun: str, *, exists: str | None = None) -> Path:
    """Write a file that must not exist yet: claim the name (O_EXCL, never overwrite), then
    fill it atomically; a failed write removes the claimed name again, and a write the
    filesystem refuses is a RunError naming the file and the cause. `noun` names the file in
    the messages ("heatmap 'x.png' exists"); `exists`: the whole refusal of an existing name."""
    target = Path(path)
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise UsageError(exists or f"{noun} {str(target)!r} exists; files are never overwritten") from None
    except OSError as exc:
        raise RunError(f"cannot write {noun} {str(target)!r}: {exc.strerror or exc}") from None
    os.close(fd)
    try:
        atomic_write_text(target, data)
    except BaseException as exc:
        try:
            target.unlink()
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise RunError(f"cannot write {noun} {str(target)!r}: {exc.strerror or exc}") from None
        raise
    return target


def abandon_open(reason: str) -> None:
    """Mark partial, with `reason`, every record of this process still "running": the command
    ended by an error that no layer below turned into a finished record (cli.py)."""
    for writer in list(_OPEN):
        if writer.record.get("status") == "running":
            try:
                current = _as_on_disk(writer)
                if current.record.get("status") == "running":
                    current.finish("partial", reason)
            except (OSError, RunError):
                pass
        _OPEN.discard(writer)


def _as_on_disk(writer: RecordWriter) -> RecordWriter:
    """`writer`, or the file as it is now where another writer carried it on since (a launcher's
    record that its ranks wrote and the launcher finished through resume): marking the stale copy
    partial would rewrite a finished record without its rows."""
    try:
        changed = writer._saved is not None and writer.path.read_bytes() != writer._saved
    except OSError:
        return writer
    return RecordWriter.resume(writer.path) if changed else writer


def load_record(path: str | os.PathLike) -> dict[str, Any]:
    """The record in `path` as the current schema version (older versions upgraded), its rows
    checked against its kind's row schema; UsageError naming the file otherwise."""
    record = load_json(path, what="results file", expected=RECORD_EXPECTED)
    record = upgrade(record)
    try:
        check_record(record)
    except ValueError as exc:
        raise UsageError(f"results file {str(path)!r} is not a microbench record: {exc}") from None
    return record


def write_csv(path: str | os.PathLike, rows: list[dict[str, Any]]) -> Path:
    """Flat CSV, one line per row; nested dicts become dotted columns. Never overwrites."""
    target = Path(path)
    flat = [_flatten(row) for row in rows]
    columns: list[str] = []
    for row in flat:
        columns.extend(key for key in row if key not in columns)
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=columns)
    writer.writeheader()
    writer.writerows(flat)
    return atomic_write_new(
        target,
        text.getvalue().encode(),
        "CSV file",
        exists=(
            f"CSV file {str(target)!r} already exists; results are never overwritten: "
            f"pick a new name, e.g. --csv {target.with_suffix('')}-2.csv"
        ),
    )


def _flatten(row: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, f"{name}."))
        elif isinstance(value, list):
            out[name] = json.dumps(value)
        else:
            out[name] = value
    return out

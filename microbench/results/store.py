"""Writing records: atomic (temp file + rename), never replacing a file this run didn't create.

A run claims a unique file name once (O_EXCL), then rewrites that same file atomically after
every finished size, so a crash or Ctrl-C leaves the rows finished so far on disk with
status "running"/"partial", never a half-written JSON document.
"""

from __future__ import annotations

import csv
import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from ..core.errors import RunError, UsageError
from ..core.redaction import redact_text
from ..core.jsonfile import load_json
from .outputs import DEFAULT_RESULTS_DIR, check_results_dir
from .schema import STATUSES, check_record, check_rows, upgrade, utc_now

DEFAULT_DIR = DEFAULT_RESULTS_DIR
RECORD_EXPECTED = "a microbench record (JSON, UTF-8), e.g. results/suite-20261122-031100/nccl.json"
# Set by a launcher for the ranks it spawns: rank 0 writes the path of the record it claimed
# there, so that if rank 0 is killed or freezes, the launcher can still mark the record partial.
RECORD_NOTE_ENV = "MICROBENCH_RECORD_NOTE"


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "run"


class RecordWriter:
    """Owns one record file for the life of a run."""

    def __init__(self, record: dict[str, Any], path: str | os.PathLike | None = None,
                 directory: str | os.PathLike = DEFAULT_DIR):
        self.record = record
        self._check(lambda: check_record(record))  # before claiming a file that would stay empty
        if not path:
            check_results_dir(directory)
        self.path: Path = self._claim(Path(path) if path else None, Path(directory), record["kind"])
        self.flush()
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
        try:
            writer.record = json.loads(writer.path.read_text())
        except (OSError, ValueError) as exc:
            raise RunError(f"cannot read back results file {str(path)!r}: {exc}") from None
        return writer

    def update(self, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Change the record in place (its summary, say) and rewrite the file."""
        change(self.record)
        self.flush()
        return self.record

    @staticmethod
    def _claim(path: Path | None, directory: Path, kind: str) -> Path:
        if path is not None:
            candidates = [path]
            target_dir = path.parent
        else:
            stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
            base = f"{_safe(kind)}-{stamp}"
            candidates = [directory / f"{base}{'' if i == 0 else f'-{i}'}.json" for i in range(1000)]
            target_dir = directory
        try:
            target_dir.mkdir(parents=True, exist_ok=True)
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
            raise UsageError(f"results file {str(path)!r} already exists; results are never "
                             f"overwritten: pick a new name, e.g. --json {path.with_suffix('')}-2.json")
        raise RunError(f"could not find a free results file name in {str(directory)!r}")

    def _check(self, check: Callable[[], None]) -> None:
        """Readers refuse a record that breaks its schema, so writing one is our bug: say so
        before it reaches the disk (the file keeps what was valid so far)."""
        try:
            check()
        except ValueError as exc:
            claimed = getattr(self, "path", None)   # None until the file is claimed
            where = f" {str(claimed)!r}" if claimed else ""
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
        self.flush()
        return self.path

    def flush(self) -> None:
        atomic_write_text(self.path, json.dumps(self.record, indent=1, sort_keys=False, default=str) + "\n")


def mark_abandoned(path: str | os.PathLike, reason: str) -> bool:
    """Mark a record its writer left "running" (killed, frozen) as partial with `reason`; its
    finished rows stay. True if it was changed."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(record, dict) or record.get("status") != "running":
        return False
    record.update(status="partial", status_reason=redact_text(reason), ended_at=utc_now())
    try:
        atomic_write_text(Path(path), json.dumps(record, indent=1, sort_keys=False, default=str) + "\n")
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


def atomic_write_new(path: str | os.PathLike, data: str | bytes, noun: str) -> Path:
    """Write a file that must not exist yet: claim the name (O_EXCL, never overwrite), then
    fill it atomically; a failed write removes the claimed name again. `noun` names the file
    in the refusal ("heatmap 'x.png' exists")."""
    target = Path(path)
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise UsageError(f"{noun} {str(target)!r} exists; files are never overwritten") from None
    os.close(fd)
    try:
        atomic_write_text(target, data)
    except BaseException:
        try:
            target.unlink()
        except OSError:
            pass
        raise
    return target


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
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise UsageError(f"CSV file {str(target)!r} already exists; results are never overwritten: "
                         f"pick a new name, e.g. --csv {target.with_suffix('')}-2.csv") from None
    except OSError as exc:
        raise RunError(f"cannot write CSV file {str(target)!r}: {exc.strerror}") from None
    with os.fdopen(fd, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(flat)
    return target


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

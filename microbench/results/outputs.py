"""One check for every file a command will write (--json, --csv, --out, --junit, --heatmap):
run before anything is measured, so that a name that cannot be written fails in a second with
one line, not after an hour of measuring.

The writers themselves still claim their file with O_EXCL (results/store.py, write_csv, plot):
this check is the early answer, not the guarantee against a race.

The rule, the same for every output flag: a misnamed output is a usage error (exit 2), said
before the work starts. An output file's directory must exist (it is never created for --json,
--csv, --out, --junit or --heatmap: a typo in a directory name should not grow a new tree); a
directory of records (--results-dir) is created, its nearest existing ancestor must be a
writable directory. cli.py runs check_outputs on every command's arguments.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

from ..core.errors import UsageError

DEFAULT_RESULTS_DIR = "results"   # where records go without --json or --results-dir


def why_unwritable(directory: str | os.PathLike) -> str | None:
    """Why a new file cannot be made in `directory`, or None. A read-only mount is named as
    such: it stops root too, where permission bits do not."""
    try:
        if os.statvfs(directory).f_flag & os.ST_RDONLY:
            return f"directory {str(directory)!r} is on a read-only filesystem"
    except OSError:
        pass
    if not os.access(directory, os.W_OK):
        return f"directory {str(directory)!r} is not writable by this user"
    return None


def check_new_file(path: str | os.PathLike, flag: str, *, noun: str | None = None, kept: str = "files",
                   example: str | None = None, overwrite: bool = False, parents_made: bool = False,
                   claimed: bool = False) -> Path:
    """Refuse `path` for `flag` when it is a directory, already exists (outputs are never
    overwritten, unless `overwrite`), its directory is missing (unless the writer makes it:
    `parents_made`, as the record store does) or that directory cannot take a new file
    (read-only filesystem, no permission).

    noun: how the exists message names the file ("CSV file 'r.csv' already exists"); without it,
    "invalid --json 'r.json': it exists". kept: what is never overwritten ("results", "reports").
    example: the path in the "e.g." of the other messages (default: the file's own name).
    claimed: the caller claims the file itself right after (O_EXCL) and reports the OS's reason
    for a place it cannot write, so only existence and the directory are checked here.
    """
    target = Path(path)
    text = str(path)
    parent = target.parent
    good = f"e.g. {flag} {example or target.name}"
    if not text.strip():
        # Path('') is '.': an empty --json would quietly mean "the default place" or "here".
        raise UsageError(
            f"invalid {flag} {text!r}: empty; expected a file path, e.g. {flag} {example or 'results/run.json'}"
        )
    for place in (target, parent):
        why = _broken(place)
        if why:
            raise UsageError(f"invalid {flag} {text!r}: {why}; {good}")
    if target.is_dir():
        raise UsageError(f"invalid {flag} {text!r}: it is a directory; expected a file path, {good}")
    if target.exists() and not overwrite:
        lead = f"{noun} {text!r} already exists" if noun else f"invalid {flag} {text!r}: it exists"
        raise UsageError(f"{lead}; {kept} are never overwritten: pick a new name, "
                         f"e.g. {flag} {target.with_suffix('')}-2{target.suffix}")
    if parent.exists() and not parent.is_dir():
        raise UsageError(f"invalid {flag} {text!r}: {str(parent)!r} is a file, not a directory; {good}")
    if not parent.is_dir():
        if parents_made:
            return target
        raise UsageError(f"invalid {flag} {text!r}: directory {str(parent)!r} does not exist; {good}")
    why = None if claimed else why_unwritable(parent)
    if why:
        raise UsageError(f"invalid {flag} {text!r}: {why}; {good}")
    if target.exists() and not os.access(target, os.W_OK):
        raise UsageError(f"invalid {flag} {text!r}: not writable by this user; {good}")
    return target


def _broken(path: Path) -> str | None:
    """A name that stat cannot follow: a symlink loop, a dangling symlink, a path through a file."""
    try:
        os.stat(path)
    except FileNotFoundError:
        if os.path.lexists(path):
            return f"{str(path)!r} is a symlink to {os.readlink(path)!r}, which does not exist"
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"{str(path)!r} is a symlink loop (too many levels of symbolic links)"
        if exc.errno == errno.ENOTDIR:
            blocker = next((p for p in reversed(path.parents) if p.exists() and not p.is_dir()), None)
            return f"{str(blocker or path)!r} is a file, not a directory"
        return f"{str(path)!r} cannot be looked up ({exc.strerror or exc})"
    return None


def check_results_dir(path: str | os.PathLike, flag: str = "--results-dir") -> Path:
    """A directory records will be written into: an existing directory this user can write, or
    a missing one whose nearest existing ancestor is (the writer creates it). The default
    (`results`, found in the working directory, named by no one) must not be a symlink: a
    `results -> /etc` left there would have records written wherever it points. A directory the
    user names (--results-dir /scratch/r, --json a/b.json) is followed like any path they type,
    links included, and so is this one written otherwise (`--results-dir results/`): `path` is
    the text as given, before any Path() tidies it. UsageError (exit 2) before any work."""
    text = str(path)
    if text == DEFAULT_RESULTS_DIR and Path(path).is_symlink():
        real = os.path.realpath(path)
        raise UsageError(f"results directory {text!r} is a symlink to {real!r}; microbench does not "
                         f"follow a link it was not given: remove it, or name it yourself, "
                         f"e.g. --results-dir {real} (or --results-dir results/ to follow the link)")
    good = f"e.g. {flag} results"
    if not text.strip():
        raise UsageError(f"invalid {flag} {text!r}: empty; expected a directory, {good}")
    place = Path(path)
    while True:
        why = _broken(place)
        if why:
            raise UsageError(f"invalid {flag} {text!r}: {why}; {good}")
        if place.exists() or place == place.parent:
            break
        place = place.parent
    if not place.is_dir():
        raise UsageError(f"invalid {flag} {text!r}: {str(place)!r} is a file, not a directory; {good}")
    why = why_unwritable(place)
    if why:
        raise UsageError(f"invalid {flag} {text!r}: {why}; {good}")
    return Path(path)


def check_outputs(args: Any) -> None:
    """Every output a command's arguments name, checked once before the command runs (cli.py):
    --json (when it is a path, not `env --json`'s switch), --csv, and --results-dir where no
    --json replaces it; and that no two output flags name the same file. --out, --junit and
    --heatmap are checked by their commands, before any work, with check_new_file as well (plot's
    default --out depends on its records)."""
    json_path = getattr(args, "json", None)
    if isinstance(json_path, str):
        check_new_file(json_path, "--json", example="results/run.json")
    csv_path = getattr(args, "csv", None)
    if isinstance(csv_path, str):
        check_new_file(csv_path, "--csv", noun="CSV file", kept="results", example="results/run.csv")
    check_distinct(args)
    results_dir = getattr(args, "results_dir", None)
    if isinstance(results_dir, str) and not isinstance(json_path, str):
        check_results_dir(results_dir)


# Every flag that names one new file, and the suffix its example takes.
_FILE_FLAGS = (("--json", "json", ".json"), ("--csv", "csv", ".csv"), ("--heatmap", "heatmap", ".png"),
               ("--out", "out", ""), ("--junit", "junit", ".xml"))


def check_distinct(args: Any) -> None:
    """Two output flags naming one file (`--json r --csv r`): the second writer would find the
    first's file there after all the work. UsageError (exit 2) before any."""
    seen: dict[str, tuple[str, str]] = {}
    for flag, attr, suffix in _FILE_FLAGS:
        value = getattr(args, attr, None)
        if not isinstance(value, str) or not value.strip():
            continue
        key = os.path.realpath(value)
        if key in seen:
            other_flag, other = seen[key]
            path = Path(value)
            example = path.with_suffix(suffix) if suffix and path.suffix != suffix else \
                path.with_name(f"{path.stem}-2{path.suffix}")
            raise UsageError(f"invalid {flag} {value!r}: the same file as {other_flag} {other!r}; each output "
                             f"needs a file of its own, e.g. {flag} {example}")
        seen[key] = (flag, value)

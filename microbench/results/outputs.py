"""One check for every file a command will write (--json, --csv, --out, --junit, --heatmap):
run before anything is measured, so that a name that cannot be written fails in a second with
one line, not after an hour of measuring.

The writers themselves still claim their file with O_EXCL (results/store.py, write_csv, plot):
this check is the early answer, not the guarantee against a race.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..core.errors import UsageError


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
    if target.is_dir():
        raise UsageError(f"invalid {flag} {text!r}: it is a directory; expected a file path, {good}")
    if target.exists() and not overwrite:
        lead = f"{noun} {text!r} already exists" if noun else f"invalid {flag} {text!r}: it exists"
        raise UsageError(f"{lead}; {kept} are never overwritten: pick a new name, "
                         f"e.g. {flag} {target.with_suffix('')}-2{target.suffix}")
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

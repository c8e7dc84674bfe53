"""`microbench fleet` as one library call: every output checked before anything is read, the
fleet analysed, then the record, the JUnit XML and the drain and rerun lists written (the
command prints the tables)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...core.errors import RunError, UsageError
from ...results import RecordWriter
from ...results.outputs import check_new_file, check_results_dir
from ...results.store import atomic_write_new, atomic_write_text
from .. import junit as junit_file
from . import outputs
from .analysis import Analysis, analyse
from .config import Config


@dataclass
class Outcome:
    analysis: Analysis
    record: Path
    drain: Path
    rerun: Path
    junit: Path | None


def check_outputs(config: Config) -> None:
    """Refuse, before reading a record, an output that could not be written (exit 2)."""
    if config.json:
        check_new_file(config.json, "--json", example="results/fleet.json")
    else:
        check_results_dir(config.results_dir)
    for flag, path in (("--drain", config.drain), ("--rerun", config.rerun)):
        if path:
            check_new_file(path, flag, example=f"results/fleet{flag[1:].replace('-', '.')}.txt")
    if config.junit:
        junit_file.check_writable(config.junit)
    if config.drain and config.drain == config.rerun:
        raise UsageError(
            f"--drain and --rerun name one file {config.drain!r}; give each its own, e.g. --rerun rerun.txt"
        )


def _beside(record: Path, suffix: str, given: str | None) -> Path:
    return Path(given) if given else record.with_name(f"{record.stem}.{suffix}.txt")


def run(config: Config, argv: list[str] | None = None) -> Outcome:
    check_outputs(config)
    analysis = analyse(config)
    path = RecordWriter(outputs.record(analysis, argv), config.json, config.results_dir).path
    drain, rerun = _beside(path, "drain", config.drain), _beside(path, "rerun", config.rerun)
    atomic_write_new(drain, outputs.node_list(analysis.drain), "drain list")
    atomic_write_new(rerun, outputs.node_list(analysis.rerun), "rerun list")
    junit_path = None
    if config.junit:
        junit_path = Path(config.junit)
        try:
            atomic_write_text(junit_path, outputs.junit(analysis))
        except OSError as exc:
            raise RunError(f"cannot write --junit {config.junit!r}: {exc.strerror}") from None
    return Outcome(analysis, path, drain, rerun, junit_path)

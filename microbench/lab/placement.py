"""Lab plumbing for `microbench nccl`: rank placement, link ceilings, and --link-profiles."""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

from . import namespaces as labmod
from ..core.units import format_link_rate, format_size, parse_link_rate
from ..world.launch import package_env, self_command
from ..core.errors import MicrobenchError, RunError, UsageError
from ..core.units import parse_positive_int
from ..results.store import load_record


def lab_placement(name: str, nproc_text: str | None) -> tuple[int, str, Any]:
    lab = labmod.get(name)
    nproc = len(lab.hosts)
    if nproc_text is not None:
        nproc = parse_positive_int(nproc_text, what="--nproc", example="2")
        if not 2 <= nproc <= len(lab.hosts):
            raise UsageError(f"invalid --nproc {nproc_text!r} with --lab {name}: the lab has {len(lab.hosts)} "
                             f"hosts and places one rank per host; use 2 to {len(lab.hosts)}")
    return labmod.placement(lab, list(range(nproc)))


def lab_facts() -> dict[str, Any]:
    """What the record says about lab placement (empty off the lab)."""
    if not os.environ.get("MICROBENCH_LAB"):
        return {}
    return {"lab": os.environ["MICROBENCH_LAB"], "lab_host_rank0": os.environ.get("MICROBENCH_LAB_HOST"),
            "socket_ifname": os.environ.get("GLOO_SOCKET_IFNAME")}


def link_gbps_from(path: str) -> float:
    """The one-way link ceiling (GB/s) from a `microbench link` record."""
    expected = "run e.g. `microbench link --lab NAME --ops uni --json link.json`"
    try:
        record = load_record(path)
    except UsageError as exc:
        raise UsageError(f"--link-result {path!r} is not a finished `microbench link` record with a uni "
                         f"bandwidth ({exc}); {expected}") from None
    except OSError as exc:
        raise UsageError(f"cannot read --link-result {path!r}: {exc.strerror}") from None
    summary = record.get("summary")
    gbps = summary.get("link_gbps") if isinstance(summary, dict) else None
    if record.get("kind") != "link" or isinstance(gbps, bool) \
            or not isinstance(gbps, (int, float)) or not math.isfinite(gbps) or gbps <= 0:
        raise UsageError(f"--link-result {path!r} is not a finished `microbench link` record with a uni "
                         f"bandwidth; {expected}")
    return float(gbps)


@contextlib.contextmanager
def naming_lab_hosts(lab_name: str | None, world: Any) -> Iterator[None]:
    """A failed run on a lab names the hosts whose link is down (rank 0 can see every host)."""
    try:
        yield
    except MicrobenchError as exc:
        found = labmod.diagnose(os.environ.get("MICROBENCH_LAB") or lab_name) if lab_name and world.rank == 0 else None
        if not found or found in str(exc):
            raise
        raise type(exc)(f"{exc}; {found}") from None


def _without(argv: list[str], *options: str) -> list[str]:
    out, skip = [], False
    for item in argv:
        if skip:
            skip = False
            continue
        if item in options:
            skip = True
            continue
        if any(item.startswith(opt + "=") for opt in options):
            continue
        out.append(item)
    return out


def run_profiles(lab_name: str | None, link_profiles: str, argv: list[str], *, json_path: str | None,
                 results_dir: str) -> int:
    """Run the same sweep (`argv`, this command's own arguments) once per egress rate in
    `link_profiles` (reshaping the lab in between) and compare. json_path: each profile's record
    is named after it with the rate appended; without it, records go into results_dir."""
    if not lab_name:
        raise UsageError("--link-profiles needs --lab NAME: it reshapes the lab's links between sweeps, "
                         "e.g. --lab default --link-profiles 1gbit,unlimited")
    labels = [p.strip() for p in str(link_profiles).split(",") if p.strip()]
    rates = [parse_link_rate(p) for p in labels]
    if len(rates) < 2:
        raise UsageError(f"invalid --link-profiles {link_profiles!r}: expected two or more rates to compare, "
                         f"e.g. 1gbit,unlimited")
    lab = labmod.get(lab_name)
    # Read before the first reshape: the lab's own exceptions (--host-link, --pair-link) must
    # come back afterwards, not just its base rate.
    before = labmod.current_shaping(lab)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    base = _without(argv, "--link-profiles", "--json")
    env = package_env()
    records: list[tuple[str, dict]] = []
    try:
        for label, rate in zip(labels, rates):
            labmod.shape(lab.name, rate, lab.delay_ms)
            if json_path:
                stem = Path(json_path)
                path = stem.with_name(f"{stem.stem}-{format_link_rate(rate)}{stem.suffix or '.json'}")
            else:
                path = Path(results_dir) / f"nccl-lab-{lab.name}-{format_link_rate(rate)}-{stamp}.json"
            print(f"# link profile {label}: every host's egress shaped to {format_link_rate(rate)}", flush=True)
            code = subprocess.run([*self_command(), *base, "--json", str(path)], env=env).returncode
            if code != 0:
                return code
            records.append((format_link_rate(rate), load_record(path)))
            print(flush=True)
    finally:
        labmod.restore(lab, before)
    if not records:
        raise RunError("no profile produced a record")
    print(profiles_table(records))
    return 0


def profiles_table(records: list[tuple[str, dict[str, Any]]]) -> str:
    """The same sweep under several link profiles: busbw side by side and last/first ratio."""
    labels = [label for label, _ in records]
    first, last = labels[0], labels[-1]
    lines = [f"# busbw (GB/s) by link profile; ratio = {last} / {first}"]
    head = f"#{'op':>15}{'size':>10}" + "".join(f"{label:>12}" for label in labels) + f"{'ratio':>9}"
    lines.append(head)
    ops = list(dict.fromkeys(r["op"] for _, rec in records for r in rec["rows"]))
    for op in ops:
        sizes = sorted({r["size_bytes"] for _, rec in records for r in rec["rows"] if r["op"] == op})
        for size in sizes:
            values = []
            for _, rec in records:
                rows = [r for r in rec["rows"] if r["op"] == op and r["size_bytes"] == size]
                # Out-of-place where the op has it, as the nccl-tests summary does.
                row = next((r for r in rows if r.get("placement") == "out"), rows[0] if rows else None)
                values.append(row["busbw_gbps"] if row else None)
            cells = "".join(f"{v:>12.3f}" if v is not None else f"{'-':>12}" for v in values)
            ratio = (f"{values[-1] / values[0]:>8.2f}x" if values[0] and values[-1] is not None
                     else f"{'-':>9}")
            lines.append(f" {op:>15}{format_size(size):>10}{cells}{ratio}")
    return "\n".join(lines)

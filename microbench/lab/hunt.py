"""Which host or link is bad: pure scheduling and judgement for `microbench hunt`.

Every host sends to every other host, one pair at a time per host: N-1 rounds of disjoint
pairs (the circle method, as a round-robin tournament is drawn) cover all N(N-1)/2 pairs, and
the pairs of a round run at once, so the time grows with N, not N^2. Each pair is measured
both ways, because a host's egress and ingress fail separately.

Judgement, over the directed bandwidths i -> j:
  slow(i -> j)   bandwidth below --slow x the median of all directed bandwidths, or below
                 --floor when one is given;
  slow pair      either direction slow;
  bad host       a host whose pair is slow with every peer (the common end of all its
                 slow pairs; needs 3 hosts, or a slow pair could be blamed on either end);
  bad link       a slow pair whose two ends are both healthy with everyone else.

--bisect first halves the hosts (N >= 4): an all_reduce over each half at once, and the
search goes on in the half that is slow against the other, so one bad host is cornered in
about log2(N) collective rounds. The last 2-3 suspects and healthy hosts from the halves
already cleared, 4 hosts in all, then run the pairwise rounds; a single slow host among the
suspects there decides. Anything else (halves alike, as with a slow link between halves or a
clean cluster; a link rather than a host; more than one host) falls back to all pairs.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import UsageError
from ..core.pyplot import pyplot
from ..core.units import format_number

MIN_HOSTS = 3


@dataclass
class HuntOptions:
    """What `microbench hunt` was asked for, parsed and checked (commands/hunt.py builds it)."""
    size_bytes: int
    iters: int
    warmup: int
    slow_ratio: float
    floor_gbps: float | None
    timeout_s: float
    lab: str | None = None
    bisect: bool = False
    heatmap: str | None = None
    json: str | None = None
    csv: str | None = None
    results_dir: str = "results"

    def measuring(self) -> dict[str, Any]:
        """The record's config keys for how each pair is measured, in the record's order."""
        return {"size_bytes": self.size_bytes, "iters": self.iters, "warmup": self.warmup,
                "slow_ratio": self.slow_ratio, "floor_gbps": self.floor_gbps, "timeout_s": self.timeout_s}


def rounds(n: int) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint pairs covering every pair once: n-1 rounds for even n, n for odd."""
    if n < 2:
        return []
    players: list[int | None] = list(range(n)) + ([None] if n % 2 else [])
    m = len(players)
    out = []
    for _ in range(m - 1):
        pairs = []
        for k in range(m // 2):
            a, b = players[k], players[m - 1 - k]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        out.append(sorted(pairs))
        players = [players[0], players[-1], *players[1:-1]]
    return out


BISECT_MIN_HOSTS = 4
CONFIRM_HOSTS = 4


def halves(hosts: list[int]) -> tuple[list[int], list[int]]:
    mid = len(hosts) // 2
    return hosts[:mid], hosts[mid:]


def slower_half(busbw_a: float, busbw_b: float, slow_ratio: float, floor_gbps: float | None = None) -> int | None:
    """0 or 1 when exactly that half is slow (against the other half, or the floor); None
    when they are alike or both slow: halving cannot tell which way to go."""
    slow_a = busbw_a < slow_ratio * busbw_b or (floor_gbps is not None and busbw_a < floor_gbps)
    slow_b = busbw_b < slow_ratio * busbw_a or (floor_gbps is not None and busbw_b < floor_gbps)
    if slow_a != slow_b:
        return 0 if slow_a else 1
    return None


def confirm_set(suspects: list[int], cleared: list[int]) -> list[int]:
    """The suspects plus cleared hosts up to CONFIRM_HOSTS: 4 hosts take 3 pair rounds, as 3 do."""
    extra = max(0, CONFIRM_HOSTS - len(suspects))
    return sorted(suspects + cleared[:extra])


def default_heatmap(record_path: str | Path) -> Path:
    """The heatmap beside the record: its name with .png."""
    return Path(record_path).with_suffix(".png")


def check_default_heatmap(json_path: str | None, heatmap: str | None) -> None:
    """With --json and no --heatmap the heatmap's name is known before the ranks start: refuse
    it there if taken (exit 2), not after the whole matrix was measured."""
    if heatmap or not json_path:
        return
    target = default_heatmap(json_path)
    if target.exists() or target.is_symlink():
        raise UsageError(f"the default heatmap {str(target)!r} (the --json name with .png) already exists; "
                         f"files are never overwritten: give a new one, e.g. --heatmap "
                         f"{target.with_suffix('')}-2.png")


def free_heatmap(record_path: str | Path) -> Path:
    """The default heatmap for a record whose name was chosen at run time (results/hunt-TIME.json):
    its .png, or the first free -N.png beside it, so a taken name never fails a finished hunt."""
    first = default_heatmap(record_path)
    for i in range(1000):
        candidate = first if i == 0 else first.with_name(f"{first.stem}-{i}.png")
        if not candidate.exists() and not candidate.is_symlink():
            return candidate
    return first   # the writer's O_EXCL then says it is taken


def check_hosts(n: int, where: str) -> None:
    if n < MIN_HOSTS:
        raise UsageError(f"hunt needs at least {MIN_HOSTS} hosts, {where} has {n}: with 2, a slow link "
                         f"cannot be blamed on either end; e.g. microbench lab up --hosts 4 --name h")


def check_bisect_hosts(n: int, where: str) -> None:
    if n < BISECT_MIN_HOSTS:
        raise UsageError(f"hunt --bisect needs at least {BISECT_MIN_HOSTS} hosts, {where} has {n}: each half "
                         f"needs 2 hosts for an all_reduce; drop --bisect (all pairs take {len(rounds(n))} rounds)")


@dataclass
class Verdict:
    median_gbps: float
    threshold_gbps: float
    slow: set[tuple[int, int]]
    hosts: list[int]
    links: list[tuple[int, int]]
    lines: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.hosts and not self.links


def _median_of(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def analyze(matrix: dict[tuple[int, int], float], names: list[str], slow_ratio: float,
            floor_gbps: float | None = None) -> Verdict:
    """matrix: (src, dst) -> GB/s for every ordered pair of hosts 0..len(names)-1."""
    n = len(names)
    check_hosts(n, "this world")
    missing = [(i, j) for i in range(n) for j in range(n) if i != j and (i, j) not in matrix]
    if missing:
        raise ValueError(f"matrix lacks {len(missing)} directed pair(s), e.g. {missing[0]}")
    median = statistics.median(matrix.values())
    threshold = max(slow_ratio * median, floor_gbps or 0.0)
    slow = {pair for pair, gbps in matrix.items() if gbps < threshold}

    def pair_slow(a: int, b: int) -> bool:
        return (a, b) in slow or (b, a) in slow

    hosts = [h for h in range(n) if all(pair_slow(h, p) for p in range(n) if p != h)]
    links = [(a, b) for a in range(n) for b in range(a + 1, n)
             if pair_slow(a, b) and a not in hosts and b not in hosts]
    verdict = Verdict(median, threshold, slow, hosts, links)
    basis = (f"{format_number(slow_ratio, 6)} x median {_g(median)} GB/s" if threshold == slow_ratio * median
             else f"--floor {_g(floor_gbps or 0.0)} GB/s")
    if len(hosts) == n:
        verdict.lines.append(f"ALL SLOW: every pair is below {_g(threshold)} GB/s ({basis}); no single host "
                             f"or link stands out")
        return verdict
    for h in hosts:
        sends = _median_of([matrix[(h, p)] for p in range(n) if p != h])
        receives = _median_of([matrix[(p, h)] for p in range(n) if p != h])
        way = ("sending and receiving" if sends < threshold and receives < threshold
               else "sending (egress)" if sends < threshold else "receiving (ingress)")
        verdict.lines.append(f"SLOW HOST {names[h]}: slow with every peer, {way}: sends at {_g(sends)} GB/s, "
                             f"receives at {_g(receives)} GB/s (median of its pairs; threshold {_g(threshold)} "
                             f"GB/s = {basis})")
    for a, b in links:
        verdict.lines.append(f"SLOW LINK {names[a]} <-> {names[b]}: {names[a]}->{names[b]} {_g(matrix[(a, b)])} GB/s, "
                             f"{names[b]}->{names[a]} {_g(matrix[(b, a)])} GB/s, while both hosts are healthy with "
                             f"every other peer (threshold {_g(threshold)} GB/s = {basis})")
    if verdict.clean:
        verdict.lines.append(f"OK: every link reaches {_g(threshold)} GB/s ({basis}); no slow host or link")
    return verdict



def _g(gbps: float) -> str:
    """A rate in the verdicts and the matrix: four significant digits, never an exponent."""
    return format_number(gbps, 4)


def matrix_table(matrix: dict[tuple[int, int], float], names: list[str], slow: set[tuple[int, int]]) -> list[list[str]]:
    """Rows for a sender x receiver table; slow cells carry a '*'."""
    rows = []
    for i, name in enumerate(names):
        cells = [name]
        for j in range(len(names)):
            if i == j:
                cells.append("-")
            elif (i, j) not in matrix:
                cells.append(".")  # not measured (--bisect decided on the hosts it narrowed to)
            else:
                cells.append(f"{_g(matrix[(i, j)])}{' *' if (i, j) in slow else ''}")
        rows.append(cells)
    return rows


def heatmap_png(matrix: dict[tuple[int, int], float], names: list[str], slow: set[tuple[int, int]],
                title: str) -> bytes:
    import io

    import numpy as np

    plt = pyplot("the hunt heatmap")

    n = len(names)
    grid = np.full((n, n), np.nan)
    for (i, j), value in matrix.items():
        grid[i, j] = value
    size = max(4.0, 0.7 * n + 2)
    fig, ax = plt.subplots(figsize=(size + 1, size), dpi=110)
    image = ax.imshow(grid, cmap="viridis", vmin=0)
    fig.colorbar(image, ax=ax, label="GB/s (1e9 B/s), sender -> receiver")
    ax.set_xticks(range(n), names, rotation=45 if n > 6 else 0)
    ax.set_yticks(range(n), names)
    ax.set_xlabel("receiver")
    ax.set_ylabel("sender")
    top = np.nanmax(grid) if n > 1 else 1.0
    for (i, j), value in matrix.items():
        mark = "*" if (i, j) in slow else ""
        ax.text(j, i, f"{format_number(value)}{mark}", ha="center", va="center", fontsize=8,
                color="white" if value < 0.6 * top else "black")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()

"""Point-to-point TCP between two ranks: bandwidth one way and both ways, and round trips.

Rank 0 listens (its address is the world's MASTER_ADDR, which every rank can reach), publishes
the port over the world's control group, and rank 1 opens `streams` connections to it. The
send/receive loops are native (native/tcp_link.c) with the GIL released; without the native
module a Python loop over the same non-blocking sockets runs instead, and the record says so.

Ops and formulas (GB/s = 1e9 B/s; Gbit/s = 8e9 bit/s):
  uni    rank 0 sends S bytes split over the streams; rank 1 acknowledges with one byte.
         t = S / bw + one round trip, so bw_gbps = S / t slightly understates the link for small
         S and converges for large S (the sizes a link ceiling is read from).
  bidir  both ranks send S and receive S at once: bw_gbps = S / t per direction,
         total_gbps = 2 S / t over the link.
  rtt    rank 0 sends S, rank 1 echoes S; each iteration runs a batch of round trips inside
         the native loop and rtt_us_p50/p99 are taken over every round trip of the case.
"""

from __future__ import annotations

import errno
import os
import socket
from dataclasses import dataclass, field
from typing import Any, Callable

from ...core.errors import RunError, UsageError
from ...core.options import one_of, option, positive_int, sweep, text, timeout
from ...core.probe import Case, Probe, Timed
from ...core.registry import Needs, ProbeSpec, SuiteStep, SweepDefaults
from ...core.stats import percentile
from ...core.units import parse_sizes
from ...results.schema import ProbeRow
from ...targets import native
from ...world.dist import World
from .run import print_report, run as run_command

OPS = ("uni", "bidir", "rtt")
MODES = {"uni": 0, "bidir": 1, "rtt": 2}
MAX_STREAMS = 64


def _pair(text: Any, flag: str) -> list[int]:
    try:
        pair = [int(x) for x in str(text).split(",")]
    except ValueError:
        pair = []
    if len(pair) != 2 or pair[0] == pair[1] or min(pair) < 0:
        raise UsageError(f"invalid --pair {text!r}: expected two different host indices, e.g. --pair 0,1")
    return pair


def _expected(text: Any, flag: str) -> dict[str, Any] | None:
    from ...expect.overrides import override

    return override(text)


@dataclass
class Config:
    lab: str | None = option(None, metavar="NAME", record=False,
                             help="run between two hosts of this lab (see `microbench lab`)")
    # Parsed by validate, after the check that it comes with --lab (the more useful message).
    pair: list[int] | str | None = option(None, parse=text, record=False, shown="0,1",
                                    help="with --lab: the two host indices, e.g. 0,1")
    streams: int = option(1, parse=positive_int, help="parallel TCP connections for uni/bidir")
    sizes: list[int] = option(parse_sizes("1M-64M"), parse=sweep, shown="1M-64M",
                              help="message sizes for uni/bidir, binary units")
    lat_sizes: list[int] = option(parse_sizes("8,512,4K,64K,1M"), parse=sweep, shown="8,512,4K,64K,1M",
                                  help="message sizes for rtt")
    ops: list[str] = option(list(OPS), parse=one_of(OPS), shown="all", help=f"some of {','.join(OPS)}")
    timeout_s: float = option(60.0, parse=timeout, flag="--timeout", shown="60",
                              help="seconds without progress before the run fails")
    expected: dict | None = option(None, parse=_expected, metavar="RATE", record=False, shown="",
                                   help="the one-way bandwidth this hardware should reach, overriding what "
                                        "sysfs/NVML say, with a unit: e.g. 24GB/s or 200Gbit (results then show "
                                        "%% of it)")
    hosts: list[str] = field(default_factory=list)  # lab host (or hostname) of each rank, for messages


def validate(config: Config) -> Config:
    from dataclasses import replace

    if config.pair is not None and not config.lab:
        raise UsageError(f"--pair {config.pair!r} needs --lab NAME: it picks two hosts of a lab; "
                         f"without --lab both ends run on this machine (e.g. --lab default --pair 0,1)")
    if config.streams > MAX_STREAMS:
        raise UsageError(f"invalid --streams {str(config.streams)!r}: at most {MAX_STREAMS}, e.g. --streams 4")
    pair = _pair(config.pair, "--pair") if isinstance(config.pair, str) else config.pair
    return replace(config, pair=pair or ([0, 1] if config.lab else None))


def rtt_batch(size_bytes: int) -> int:
    """Round trips per timed iteration: many for small messages (percentiles need samples),
    few for large ones (a batch should stay well under a second on a slow link)."""
    return max(1, min(200, (4 << 20) // max(size_bytes, 1)))


class _LinkRequired(ProbeRow):
    streams: int
    batch: int                      # round trips timed as one iteration (rtt), else 1


class LinkRow(_LinkRequired, total=False):
    bw_gbps: float                  # uni, bidir: one direction
    bw_gbit_s: float
    total_gbps: float               # bidir: both directions
    bw_pct_of_expected: float
    rtt_us_p50: float               # rtt
    rtt_us_p99: float
    rtt_samples: int


class LinkProbe(Probe):
    name = "link"

    def __init__(self, config: Config, world: World):
        if world.size != 2:
            raise UsageError(f"the link probe runs between exactly 2 ranks, this world has {world.size}; "
                             f"launch 2 ranks (e.g. --nproc 2) or use --lab NAME --pair 0,1")
        if not 1 <= config.streams <= MAX_STREAMS:
            raise UsageError(f"invalid --streams {config.streams!r}: expected 1 to {MAX_STREAMS}, e.g. --streams 4")
        self.config, self.world, self.rank = config, world, world.rank
        self.diagnose: Callable[[], str | None] | None = None   # after a failure: whose fault, if known
        self.socks: list[socket.socket] = []
        self.samples: dict[tuple[str, int], list[float]] = {}
        self._connect()

    # ------------------------------------------------------------------ setup
    def _connect(self) -> None:
        timeout = self.config.timeout_s
        if self.rank == 0:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("0.0.0.0", 0))
            listener.listen(MAX_STREAMS)
            listener.settimeout(timeout)
            self.world.broadcast_object(listener.getsockname()[1])
            try:
                for _ in range(self.config.streams):
                    self.socks.append(listener.accept()[0])
            except OSError as exc:
                raise RunError(f"rank 1 ({self.peer}) did not connect to the link probe within "
                               f"{timeout:g} s (--timeout): {exc}") from None
            finally:
                listener.close()
        else:
            port = self.world.broadcast_object(None)
            addr = self.world.spec.master_addr
            for _ in range(self.config.streams):
                try:
                    self.socks.append(socket.create_connection((addr, port), timeout=timeout))
                except OSError as exc:
                    raise RunError(f"rank 1 ({self.host(1)}) could not connect to rank 0 ({self.host(0)}) at "
                                   f"{addr}:{port}: {exc}") from None
        # The listener was the last step that needed a rendezvous: only then is every
        # connection in the accept order both ranks agree on (stream i is the i-th accepted).
        self.world.barrier()
        for sock in self.socks:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)

    def host(self, rank: int) -> str:
        return self.config.hosts[rank] if len(self.config.hosts) > rank else f"rank {rank}"

    @property
    def peer(self) -> str:
        return self.host(1 - self.rank)

    def implementation(self) -> dict[str, Any]:
        return {"engine": "tcp_link (native, poll loop)" if native.available() else "python sockets (fallback)",
                "transport": "tcp", "streams": self.config.streams, "hosts": self.config.hosts}

    def cases(self) -> list[Case]:
        out = []
        for op in self.config.ops:
            sizes = self.config.lat_sizes if op == "rtt" else self.config.sizes
            for size in sizes:
                out.append(Case(op, size, (("streams", 1 if op == "rtt" else self.config.streams),)))
        return out

    def row_fields(self, case: Case) -> dict[str, Any]:
        return {"batch": rtt_batch(case.size_bytes) if case.op == "rtt" else 1}

    # ------------------------------------------------------------------ the operation
    def prepare(self, case: Case) -> None:
        self.samples[(case.op, case.size_bytes)] = []

    def run_once(self, case: Case) -> Timed:
        socks = self.socks[:1] if case.op == "rtt" else self.socks
        iters = rtt_batch(case.size_bytes) if case.op == "rtt" else 1
        try:
            times = native.tcp_link(socks, self.rank, MODES[case.op], case.size_bytes, iters, self.config.timeout_s)
        except OSError as exc:
            raise RunError(self._failure(case, exc)) from None
        self.samples[(case.op, case.size_bytes)].extend(times)
        return Timed(percentile(times, 50))

    def _failure(self, case: Case, exc: OSError) -> str:
        if exc.errno == errno.ETIMEDOUT:
            what = f"no data moved for {self.config.timeout_s:g} s (--timeout)"
        else:
            what = os.strerror(exc.errno) if exc.errno else str(exc)
        return (f"link between {self.host(0)} and {self.host(1)} failed during {case.label}: {what}; "
                f"{self._whose_fault()}")

    def _whose_fault(self) -> str:
        # `diagnose` is given by whoever placed the ranks (the lab knows which of its hosts has
        # its link down); a probe knows nothing of the lab.
        found = self.diagnose() if self.diagnose is not None else None
        return found or f"check the link of {self.peer}"

    def metrics(self, case: Case, time_s: float) -> dict[str, Any]:
        if case.op == "rtt":
            samples = self.samples.get((case.op, case.size_bytes)) or [time_s]
            return {"rtt_us_p50": percentile(samples, 50) * 1e6, "rtt_us_p99": percentile(samples, 99) * 1e6,
                    "rtt_samples": len(samples)}
        bw = case.size_bytes / time_s / 1e9
        out = {"bw_gbps": bw, "bw_gbit_s": bw * 8}
        expected = getattr(self, "expected", None)  # set by the link command (expectations.py)
        if expected and expected.get("gbps"):
            out["bw_pct_of_expected"] = 100.0 * bw / expected["gbps"]
        if case.op == "bidir":
            out["total_gbps"] = 2 * bw
        return out

    def summarize(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for op in ("uni", "bidir"):
            bws = [r["bw_gbps"] for r in rows if r["op"] == op]
            if bws:
                out[f"peak_{op}_gbps"] = max(bws)
        lat = [r for r in rows if r["op"] == "rtt"]
        if lat:
            smallest = min(lat, key=lambda r: r["size_bytes"])
            out["rtt_us_p50_smallest"] = smallest["rtt_us_p50"]
        # The ceiling collectives are held against: one direction of the link at the largest
        # size, where a shaper's initial burst no longer inflates the figure.
        uni = [r for r in rows if r["op"] == "uni"]
        if uni:
            out["link_gbps"] = max(uni, key=lambda r: r["size_bytes"])["bw_gbps"]
        return out

    def close(self) -> None:
        for sock in self.socks:
            sock.close()
        self.socks = []


SPEC = ProbeSpec(
    name="link",
    command=("link",),
    order=30,
    help="point-to-point TCP bandwidth and latency between two ranks or lab hosts",
    description="TCP bandwidth one way (uni) and both ways (bidir) over --streams connections, and round-trip "
    "latency p50/p99 (rtt), between rank 0 and rank 1: two local processes, two launched ranks, or two "
    "lab hosts.",
    metrics=("bw_gbps", "total_gbps", "bw_gbit_s"),
    config=Config,
    build=lambda config, context: LinkProbe(config, context.world),
    row_schema=LinkRow,
    validate=validate,
    run=run_command,
    printer=print_report,
    sweep=SweepDefaults(warmup=2, iters=10, check=False),
    needs=Needs(world=True),
    aliases=(),
    case_keys=("streams", "batch"),
    identity_keys=("transport",),
    suite=(SuiteStep("link", ("--sizes", "1M-16M")),),
)

"""The measuring side of `microbench hunt`: pair transfers over sockets, the rounds, the bisect
driver, the record and the heatmap (lab/hunt.py has the schedule and the verdict, pure).

One rank per host does the measuring (the lowest rank on each host when a launcher started
several); in each round every host pairs with one partner and the pairs run at once: the lower
one connects, sends size_bytes iters times, then the other sends back (native TCP loop of the
link probe). Rank 0 gathers each round, keeps the record current, and judges at the end.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

from ..core.errors import Interrupted, MicrobenchError, OutputClosed, RunError, UsageError
from ..core.tables import text_table
from ..core.units import format_number, format_size
from ..results import RecordWriter, new_record, write_csv
from ..results.store import atomic_write_new
from ..run.failures import dead_peers, diagnose
from ..targets import native
from ..world import environment as envmod
from ..world.backends import BackendChoice
from ..world.dist import World
from ..world.launch import detect_world
from ..world.policy import in_world
from . import hunt, namespaces as labmod
from .hunt import HuntOptions
from .placement import lab_ranks


def run(opts: HuntOptions) -> int:
    """Place one rank per lab host (or take the launcher's world) and hunt; exit code."""
    per_rank, master_addr, nproc = None, "127.0.0.1", 0
    if detect_world() is None:
        if not opts.lab:
            raise UsageError("hunt runs across hosts: give --lab NAME, or start it with your launcher, one or more "
                             "ranks per host, e.g. srun -N 8 --ntasks-per-node 1 microbench hunt")
        lab = labmod.get(opts.lab)
        hunt.check_hosts(len(lab.hosts), f"lab {opts.lab!r}")
        if opts.bisect:
            hunt.check_bisect_hosts(len(lab.hosts), f"lab {opts.lab!r}")
        # The lab's ranks per host, as a launcher would start them: participants are hosts (_body).
        nproc, master_addr, per_rank = lab_ranks(lab)
    choice = BackendChoice("gloo", "cpu", "tcp", {}, "hunt exchanges only metadata over gloo")
    return in_world(nproc=nproc, timeout_s=opts.timeout_s, choice=choice, per_rank=per_rank, master_addr=master_addr,
                    body=lambda world: _body(world, opts))


def my_label() -> str:
    """h2 on a lab host, else the hostname: what the verdict calls this host."""
    return envmod.host_label()


def my_address(master_addr: str) -> str:
    """The address peers reach this host at: the source address of the route to rank 0."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((socket.gethostbyname(master_addr), 9))
        return probe.getsockname()[0]


def measure_pair(me: int, peer: int, infos: list[tuple[str, str, int]], listener: socket.socket,
                 opts: HuntOptions) -> list[tuple[int, int, float]]:
    """Both directions between participant `me` and `peer`; returns what `me` sent."""
    names = [info[0] for info in infos]
    try:
        if me < peer:
            sock = socket.create_connection((infos[peer][1], infos[peer][2]), timeout=opts.timeout_s)
        else:
            sock = listener.accept()[0]
    except OSError as exc:
        raise RunError(f"hunt: {names[me]} could not connect with {names[peer]} ({infos[peer][1]}): {exc}") from None
    out = []
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        for src, dst in ((min(me, peer), max(me, peer)), (max(me, peer), min(me, peer))):
            role = 0 if me == src else 1
            try:
                if opts.warmup:
                    native.tcp_link([sock], role, 0, opts.size_bytes, opts.warmup, opts.timeout_s)
                times = native.tcp_link([sock], role, 0, opts.size_bytes, opts.iters, opts.timeout_s)
            except OSError as exc:
                raise RunError(f"hunt: transfer {names[src]} -> {names[dst]} failed: {exc}") from None
            if role == 0:
                # The best of the transfers: a slow link is slow every time, a busy CPU only sometimes.
                out.append((src, dst, opts.size_bytes / min(times) / 1e9))
    finally:
        sock.close()
    return out


def _body(world: World, opts: HuntOptions) -> int:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", 0))
    listener.listen(4)
    listener.settimeout(opts.timeout_s)
    gathered = world.all_gather_object((my_label(), my_address(world.spec.master_addr), listener.getsockname()[1]))
    first_rank: dict[str, int] = {}
    for rank, (label, _, _) in enumerate(gathered):
        first_rank.setdefault(label, rank)
    participants = sorted(first_rank.values())
    infos = [gathered[r] for r in participants]
    names = [info[0] for info in infos]
    hunt.check_hosts(len(names), "this world")
    if opts.bisect:
        hunt.check_bisect_hosts(len(names), "this world")
    me = participants.index(world.rank) if world.rank in participants else None
    schedule = hunt.rounds(len(names))
    writer = None
    if world.rank == 0:
        config = {**opts.measuring(), "lab": opts.lab, "bisect": bool(opts.bisect), "hosts": names,
                  "addresses": [i[1] for i in infos],
                  "ranks_per_host": {n: sum(1 for g in gathered if g[0] == n) for n in names}}
        impl = {"engine": "tcp_link (native, poll loop)" if native.available() else "python sockets (fallback)",
                "transport": "tcp", "streams": 1,
                "schedule": f"circle method: {len(schedule)} rounds of disjoint pairs, each round in parallel",
                **({"bisect": "all_reduce (torch.distributed/gloo, the nccl probe's) over each half at once, "
                              "into the slow half"} if opts.bisect else {})}
        writer = RecordWriter(new_record("hunt", config, envmod.collect(), impl), opts.json, opts.results_dir)
        print(f"# microbench hunt: {len(names)} hosts ({', '.join(names)}), "
              f"{'halving first, then ' if opts.bisect else ''}{len(schedule)} rounds at most, "
              f"{format_size(opts.size_bytes)} x {opts.iters} each way", flush=True)
    run = HuntRun(world, me, infos, names, listener, opts, writer)
    try:
        if opts.bisect:
            run.bisect(participants)
        if run.decided_by is None:
            run.pair_rounds(list(range(len(names))), "all pairs")
            run.decided_by = "all pairs"
    except (MicrobenchError, KeyboardInterrupt) as exc:
        if isinstance(exc, RunError) and not isinstance(exc, Interrupted):
            # A transfer that broke is how a dead peer shows to its partner: leave a note (this
            # rank is not the dead one) and name the silent ranks, as a probe's sweep does.
            dead = dead_peers(world, str(exc))
            if dead and dead not in str(exc):
                exc = RunError(f"{dead} during {run.phase}; {exc}")
        if writer is not None:
            writer.finish("partial", str(exc) or "interrupted")
        raise exc from None
    except OutputClosed:
        if writer is not None:
            writer.finish("partial", OutputClosed.reason)
        raise
    except Exception as exc:
        # A gather or barrier that broke (gloo's "Connection closed by peer"): name the rank
        # that died or froze, as a probe's sweep does.
        reason = diagnose(exc, world, f" during {run.phase}")
        if writer is not None:
            writer.finish("partial", reason)
            reason += f"; kept {len(writer.record['rows'])} measurement(s) in {writer.path} (partial)"
        raise RunError(reason) from None
    finally:
        listener.close()
    if writer is None:
        return 0
    try:
        return _report(writer, run, opts)
    except (MicrobenchError, KeyboardInterrupt) as exc:
        if writer.record["status"] == "running":   # a failure writing the heatmap or the CSV
            writer.finish("partial", str(exc) or "interrupted")
        raise


class HuntRun:
    """What every rank knows as the hunt goes on: all of them see every round's results."""

    def __init__(self, world: World, me: int | None, infos: list, names: list[str], listener: socket.socket,
                 opts: HuntOptions, writer: RecordWriter | None):
        self.world, self.me, self.infos, self.names, self.listener = world, me, infos, names, listener
        self.opts, self.writer = opts, writer
        self.matrix: dict[tuple[int, int], float] = {}
        self.round_s: list[float] = []
        self.steps: list[dict[str, Any]] = []
        self.decided_by: str | None = None
        self.confirm_hosts: list[int] = []
        self.verdict: hunt.Verdict | None = None
        self.phase = "the start"   # what runs now, for a failure's message

    def pair_rounds(self, hosts: list[int], phase: str) -> None:
        """The circle-method rounds over `hosts`, less the pairs measured already."""
        names, opts = self.names, self.opts
        schedule = [[(hosts[a], hosts[b]) for a, b in pairs if (hosts[a], hosts[b]) not in self.matrix]
                    for pairs in hunt.rounds(len(hosts))]
        schedule = [pairs for pairs in schedule if pairs]
        for r, pairs in enumerate(schedule):
            self.phase = f"{phase} round {r + 1}"
            self.world.barrier()
            start = time.monotonic()
            mine: list[tuple[int, int, float]] = []
            for a, b in pairs:
                if self.me in (a, b):
                    mine = measure_pair(self.me, b if self.me == a else a, self.infos, self.listener, opts)
            results = [m for part in self.world.all_gather_object(mine) for m in part]
            self.round_s.append(time.monotonic() - start)
            self.matrix.update({(s, d): g for s, d, g in results})
            if self.writer is not None:
                self.writer.add_rows([{"probe": "hunt", "op": "uni", "phase": phase, "src": names[s], "dst": names[d],
                                       "size_bytes": opts.size_bytes, "round": len(self.round_s), "bw_gbps": g,
                                       "bw_gbit_s": g * 8} for s, d, g in results])
                print(
                    f"# {phase} round {r + 1}/{len(schedule)}: "
                    f"{', '.join(f'{names[a]}<->{names[b]}' for a, b in pairs)} ({self.round_s[-1]:.1f} s)",
                    flush=True,
                )

    def bisect(self, participants: list[int]) -> None:
        from .bisect import bisect

        self.phase = "halving"
        suspects, cleared, self.steps = bisect(self.world, participants, self.names, self.me, self.opts, self._emit)
        if len(suspects) == len(self.names):
            if self.writer is not None:
                print("# halving cannot tell the halves apart: all pairs decide", flush=True)
            return
        self.confirm_hosts = hunt.confirm_set(suspects, cleared)
        self.pair_rounds(self.confirm_hosts, "confirm")
        sub = self.confirm_hosts
        verdict = hunt.analyze({(sub.index(s), sub.index(d)): g for (s, d), g in self.matrix.items()},
                               [self.names[h] for h in sub], self.opts.slow_ratio, self.opts.floor_gbps)
        culprits = [sub[h] for h in verdict.hosts]
        if len(culprits) == 1 and culprits[0] in suspects and not verdict.links:
            verdict.hosts, self.verdict, self.decided_by = culprits, verdict, "bisect"
        elif self.writer is not None:
            print(f"# the pairwise rounds over {', '.join(self.names[h] for h in sub)} do not single out one suspect "
                  f"({'; '.join(verdict.lines)}): all pairs decide", flush=True)

    def _emit(self, step: dict[str, Any]) -> None:
        if self.writer is None:
            return
        self.writer.add_rows(
            [
                {
                    "probe": "hunt",
                    "op": "all_reduce",
                    "phase": "bisect",
                    "step": step["step"],
                    "hosts": half,
                    "size_bytes": self.opts.size_bytes,
                    "busbw_gbps": bw,
                    "slow": step["slow_half"] == k,
                }
                for k, (half, bw) in enumerate(zip(step["halves"], step["busbw_gbps"], strict=False))
            ]
        )
        (a, b), (bw_a, bw_b) = step["halves"], step["busbw_gbps"]
        went = {0: f"into {','.join(a)}", 1: f"into {','.join(b)}", None: "halves alike"}[step["slow_half"]]
        print(
            f"# halving {step['step']}: all_reduce busbw {','.join(a)} {format_number(bw_a, 4)} GB/s | "
            f"{','.join(b)} {format_number(bw_b, 4)} GB/s "
            f"-> {went} ({step['seconds']:.1f} s)",
            flush=True,
        )


def _report(writer: RecordWriter, run: HuntRun, opts: HuntOptions) -> int:
    names, matrix, round_s = run.names, run.matrix, run.round_s
    if run.decided_by == "bisect":
        assert run.verdict is not None
        verdict = run.verdict
        sub = run.confirm_hosts
        verdict.slow = {(sub[s], sub[d]) for s, d in verdict.slow}
        unmeasured = ("; the other pairs were not measured (drop --bisect for the full matrix)"
                      if len(sub) < len(names) else "")
        verdict.lines.append(f"DECIDED BY BISECT: {len(run.steps)} halving(s) cornered {names[verdict.hosts[0]]}, "
                             f"pairwise rounds over {', '.join(names[h] for h in sub)} confirm it{unmeasured}")
    else:
        verdict = hunt.analyze(matrix, names, opts.slow_ratio, opts.floor_gbps)
    print()
    print("# bandwidth GB/s, sender (row) -> receiver (column); * = slow, . = not measured")
    print(text_table(hunt.matrix_table(matrix, names, verdict.slow), headers=["from \\ to", *names], tablefmt="simple"))
    print()
    for line in verdict.lines:
        print(line)
    for row in writer.record["rows"]:
        if "src" in row:
            row["slow"] = (names.index(row["src"]), names.index(row["dst"])) in verdict.slow
    writer.record["summary"] = {
        "median_gbps": verdict.median_gbps, "threshold_gbps": verdict.threshold_gbps,
        "slow_hosts": [names[h] for h in verdict.hosts],
        "slow_links": [[names[a], names[b]] for a, b in verdict.links],
        "verdict": verdict.lines, "decided_by": run.decided_by, "rounds": len(round_s), "round_s": round_s,
        "total_s": sum(round_s) + sum(step["seconds"] for step in run.steps)}
    if opts.bisect:
        writer.record["summary"].update({"bisect": run.steps, "confirm_hosts": [names[h] for h in run.confirm_hosts]})
    heatmap = Path(opts.heatmap) if opts.heatmap else hunt.free_heatmap(writer.path)
    no_picture = None
    try:
        png = hunt.heatmap_png(
            matrix, names, verdict.slow, f"microbench hunt: {len(names)} hosts, GB/s sender -> receiver"
        )
        atomic_write_new(heatmap, png, "heatmap")
        writer.record["summary"]["heatmap"] = str(heatmap)
    except RunError as exc:   # no matplotlib: the record is complete, the command still fails
        no_picture = exc
    path = writer.finish("complete")
    if no_picture is not None:
        raise no_picture
    if opts.csv:
        write_csv(opts.csv, writer.record["rows"])
    halvings = f"{len(run.steps)} halving(s) and " if opts.bisect else ""
    print(
        f"# {halvings}{len(round_s)} pair rounds in {writer.record['summary']['total_s']:.1f} s, "
        f"decided by {run.decided_by}; record: {path}"
        + (f"; heatmap: {writer.record['summary'].get('heatmap')}" if writer.record["summary"].get("heatmap") else "")
    )
    if not verdict.clean:
        found = [f"slow host {names[h]}" for h in verdict.hosts] + [
            f"slow link {names[a]}<->{names[b]}" for a, b in verdict.links
        ]
        raise RunError(f"hunt found {', '.join(found)} (verdict and matrix above)")
    return 0

"""How much does `microbench nccl` itself cost? Two figures for docs/BENCHMARKS.md:

1. Probe vs the faster bare loop: 2 local gloo ranks, 64 MiB (--sizes), reduce_scatter,
   all_gather, all_reduce. Each round runs, as separate worlds one after the other (order
   rotated every round), two bare torch.distributed loops, one that sets one compute thread per
   rank (torch.set_num_threads(cores // ranks), what a careful user writes for a CPU world) and
   one with torch's default threads, and the command as a user types it, `microbench nccl
   --sizes S --ops ... --warmup W --iters N`. All time each call and take the slowest rank's
   median; per op the busbw of each side is the median over rounds and the ratio is probe / the
   faster bare loop (out-of-place rows for reduce_scatter and all_gather, the in-place row for
   all_reduce, the op's only one). Target >= 0.95.
2. Wall time of the default sweep, `microbench nccl` (1M-256M, reduce_scatter, all_gather,
   all_reduce), as a user runs it. Target < 60 s.

    python benchmarks/nccl_overhead.py [--sizes 64M] [--rounds 3] [--iters 10] [--skip-sweep]

The machine's load average (uptime) is printed with the figures: on a shared 2-core box other
work moves both numbers, and the ratio is only meaningful because both sides run interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Last, not first: the installed microbench (with its compiled core) wins; the checkout is the
# fallback for a machine where it is not installed.
sys.path.append(str(ROOT))

OPS = ("reduce_scatter", "all_gather", "all_reduce")
RANKS = 2


def bare_worker(args: argparse.Namespace) -> None:
    """One rank of the bare loop: allocate, warm up, time each call; rank 0 prints JSON."""
    import torch
    import torch.distributed as dist

    from microbench.core.units import bus_factor, parse_sizes

    if args.bare_threads:
        torch.set_num_threads(args.bare_threads)
    dist.init_process_group("gloo")
    n, out = dist.get_world_size(), {}
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    (size,) = parse_sizes(args.sizes)
    count = size // 4 // n * n
    for op in OPS:
        if op == "all_reduce":
            buf = torch.ones(count)
            call = lambda: dist.all_reduce(buf)  # noqa: E731
        elif op == "reduce_scatter":
            src, dst = torch.ones(count), torch.empty(count // n)
            call = lambda: rs(dst, src)  # noqa: E731
        else:
            src, dst = torch.ones(count // n), torch.empty(count)
            call = lambda: ag(dst, src)  # noqa: E731
        for _ in range(args.warmup):
            call()
        times = []
        for _ in range(args.iters):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        med = torch.tensor([statistics.median(times)], dtype=torch.float64)
        dist.all_reduce(med, op=dist.ReduceOp.MAX)
        out[op] = count * 4 / med.item() / 1e9 * bus_factor(op, n)
        src = dst = buf = None  # noqa: F841 (free before the next op, as the probe does)
    if dist.get_rank() == 0:
        print(json.dumps(out))
    dist.destroy_process_group()


def run_bare(args: argparse.Namespace) -> dict[str, float]:
    from microbench.world.launch import free_port

    port = free_port()
    procs = []
    for rank in range(RANKS):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(RANKS), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), TORCH_CPP_LOG_LEVEL="FATAL")
        procs.append(subprocess.Popen([sys.executable, __file__, "--bare-worker", "--sizes", args.sizes,
                                      "--warmup", str(args.warmup), "--iters", str(args.iters),
                                      "--bare-threads", str(args.bare_threads)], env=env,
                                      stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL, text=True))
    text = procs[0].communicate()[0]
    codes = [p.wait() for p in procs]
    if any(codes):
        sys.exit(f"a bare-loop rank failed: exit codes {codes}")
    return json.loads(text.strip().splitlines()[-1])


def run_probe(args: argparse.Namespace, tmp: str, rnd: int) -> dict[str, float]:
    from microbench.world.launch import package_env, self_command

    record = Path(tmp) / f"probe-{rnd}.json"
    done = subprocess.run([*self_command(), "nccl", "--sizes", args.sizes, "--ops", ",".join(OPS), "--nproc", str(RANKS),
                           "--warmup", str(args.warmup), "--iters", str(args.iters), "--json", str(record)],
                          cwd=tmp, env=package_env(), capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"microbench nccl failed ({done.returncode}): {done.stderr.strip()}")
    rows = json.loads(record.read_text())["rows"]
    # The placement a bare loop times: out-of-place where the op has it (all_reduce: in-place only).
    return {op: next(r["busbw_gbps"] for r in rows if r["op"] == op and r["placement"] == ("in" if op == "all_reduce" else "out"))
            for op in OPS}


def compare_probe_and_bare(args: argparse.Namespace) -> None:
    one = max(1, (os.cpu_count() or 1) // RANKS)
    sides = (f"bare {one} thread", "bare default threads", "probe")
    got: dict[str, dict[str, list[float]]] = {side: {op: [] for op in OPS} for side in sides}
    with tempfile.TemporaryDirectory(prefix="mb-bench-") as tmp:
        for rnd in range(args.rounds):
            # Each side first in turn: drift in load hits all alike.
            for side in sides[rnd % 3:] + sides[:rnd % 3]:
                if side == "probe":
                    busbw = run_probe(args, tmp, rnd)
                else:
                    args.bare_threads = one if side == sides[0] else 0
                    busbw = run_bare(args)
                for op in OPS:
                    got[side][op].append(busbw[op])
            print(f"# round {rnd + 1} ({uptime()}): " + "; ".join(
                f"{op} " + " / ".join(f"{got[side][op][-1]:.3f}" for side in sides) for op in OPS), flush=True)
    print(f"{'op':<16}{'size':>6}" + "".join(f"{side:>22}" for side in sides) + f"{'probe/faster':>14}"
          f"   (busbw GB/s, medians of {args.rounds} interleaved rounds)")
    ratios = []
    for op in OPS:
        med = {side: statistics.median(got[side][op]) for side in sides}
        faster = max(med[sides[0]], med[sides[1]])
        ratios.append(med["probe"] / faster)
        print(f"{op:<16}{args.sizes:>6}" + "".join(f"{med[side]:>22.3f}" for side in sides) + f"{ratios[-1]:>14.3f}")
    print(f"probe / faster bare loop: min over ops {min(ratios):.3f}, median {statistics.median(ratios):.3f} "
          f"(target >= 0.95)")


def time_default_sweep() -> None:
    with tempfile.TemporaryDirectory(prefix="mb-bench-") as tmp:
        from microbench.world.launch import package_env, self_command

        env = package_env()
        start = time.monotonic()
        res = subprocess.run([*self_command(), "nccl", "--results-dir", tmp], cwd=tmp, env=env,
                             capture_output=True, text=True)
        wall = time.monotonic() - start
    if res.returncode != 0:
        sys.exit(f"default sweep failed ({res.returncode}): {res.stderr.strip()}")
    print(f"default sweep `microbench nccl` (1M-256M, {', '.join(OPS)}; 2 gloo ranks): {wall:.1f} s (target < 60 s)")


def uptime() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} on {os.cpu_count()} cores"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64M", help="one size")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--bare-threads", type=int, default=0, help=argparse.SUPPRESS)  # set per bare world
    parser.add_argument("--skip-sweep", action="store_true")
    parser.add_argument("--bare-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_worker:
        bare_worker(args)
        return
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} before: {uptime()}", flush=True)
    compare_probe_and_bare(args)
    if not args.skip_sweep:
        time_default_sweep()
    print(f"# after: {uptime()}")


if __name__ == "__main__":
    main()

"""How much does `microbench nccl` itself cost? Two figures for docs/BENCHMARKS.md:

1. Probe overhead: gloo, 2 local ranks, sizes >= 16 MiB. In one world, alternate the probe's own
   measurement (runner.measure_case on CollectiveProbe) with a bare torch.distributed loop
   timing the same op and size the same way (slowest rank's median per-iteration time), several
   rounds; print busbw(probe) / busbw(bare) per op and size and the median. Target >= 0.95.
2. Wall time of the default sweep, `microbench nccl` (1M-256M, reduce_scatter, all_gather,
   all_reduce), as a user runs it. Target < 60 s.

    python benchmarks/nccl_overhead.py [--sizes 16M,64M] [--rounds 5] [--iters 10] [--skip-sweep]

The machine's load average is printed with the figures: on a shared 2-core box other work
moves both numbers, and the ratio is only meaningful because both sides run interleaved.
"""

from __future__ import annotations

import argparse
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


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from microbench.world.dist import World

    from microbench.world.launch import detect_world
    from microbench.core.probe import Case
    from microbench.probes import nccl as coll
    from microbench.run.runner import SweepSettings, measure_case
    from microbench.core.units import parse_sizes

    spec = detect_world()
    assert spec is not None
    world = World(spec, "gloo", timeout_s=120)
    n = world.size
    sizes = parse_sizes(args.sizes)
    config = coll.Config(sizes=sizes, ops=list(OPS), dtype="float32", backend="gloo", device="cpu")
    probe = coll.CollectiveProbe(config, world)
    settings = SweepSettings(warmup=args.warmup, iters=args.iters, budget_s_per_case=None, check=False, progress=False)
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

    def bare(op: str, size: int) -> float:
        """The loop a user would write: allocate, warm up, time each call, slowest rank's median."""
        count = size // 4
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
        return size / med.item() / 1e9 * coll.OPS[op].factor(n)

    results = []
    for op in OPS:
        for size in sizes:
            size = coll.effective_size(coll.OPS[op], size, n, 4)
            case = Case(op, size, (("placement", "out" if "out" in coll.OPS[op].placements else "in"),))
            probe_bw, bare_bw = [], []
            for rnd in range(args.rounds):
                # Alternate which side goes first so drift in machine load hits both alike.
                order = ("probe", "bare") if rnd % 2 == 0 else ("bare", "probe")
                for side in order:
                    if side == "probe":
                        probe_bw.append(measure_case(probe, case, settings, world)["busbw_gbps"])
                    else:
                        bare_bw.append(bare(op, size))
            results.append((op, size, statistics.median(probe_bw), statistics.median(bare_bw)))
    if world.rank == 0:
        print(f"{'op':<16}{'size':>8}{'probe busbw':>14}{'bare busbw':>13}{'ratio':>8}")
        for op, size, p, b in results:
            print(f"{op:<16}{size >> 20:>7}M{p:>11.3f} GB/s{b:>8.3f} GB/s{p / b:>8.3f}")
        ratios = [p / b for _, _, p, b in results]
        print(f"overhead ratio (probe/bare busbw), median over {len(ratios)} op x size: "
              f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}; target >= 0.95)")
    world.close()


def launch(args: argparse.Namespace) -> None:
    from microbench.world.launch import free_port

    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), TORCH_CPP_LOG_LEVEL="FATAL")
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", *sys.argv[1:]], env=env,
                                      stdout=None if rank == 0 else subprocess.DEVNULL))
    codes = [p.wait() for p in procs]
    if any(codes):
        sys.exit(f"a benchmark rank failed: exit codes {codes}")


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16M,64M")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--skip-sweep", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    print(f"# load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    launch(args)
    if not args.skip_sweep:
        time_default_sweep()
    print(f"# load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

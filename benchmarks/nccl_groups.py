"""`microbench nccl --groups` targets (issue 24), two figures for docs/BENCHMARKS.md:

1. No overhead on the world curve: the same sweep with `--groups world,node,cross` and without
   `--groups`, run interleaved (order swapped every round) on a lab of 2 hosts x 2 ranks. Per op
   and size, each side's world busbw is the median over rounds; the figure is the median over
   sizes of grouped / plain. Target >= 0.95.
2. The cross groups share the link: on the same lab shaped to 1gbit with `--algo ring`, the two
   cross groups, measured at once, add up to within 10% of the line rate: the figure is
   sum(cross busbw) / (rate / 8), the median over rounds of the bandwidth-bound size. Target 0.90-1.10.

    python benchmarks/nccl_groups.py [--rounds 3] [--sizes 4M,16M] [--link 1gbit] [--name i24b]

Needs root (it makes the lab `--name`, and removes it at the end). The load average (uptime)
is printed with the figures: on a shared box the ratio means something only because the two
sides run interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def microbench(*args: str) -> subprocess.CompletedProcess:
    from microbench.world.launch import package_env, self_command

    return subprocess.run([*self_command(), *args], env=package_env(), capture_output=True, text=True)


def busbw(record: dict, group: str) -> dict[tuple[str, int], float]:
    out = {}
    for r in record["rows"]:
        if r.get("group", "world") == group and r.get("placement", "out") == ("in" if r["op"] == "all_reduce" else "out"):
            out[(r["op"], r["size_bytes"])] = r["busbw_gbps"]
    return out


def run_nccl(lab: str, sizes: str, ops: str, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "r.json"
        done = microbench("nccl", "--lab", lab, "--sizes", sizes, "--ops", ops, "--warmup", "2", "--iters", "5",
                          "--json", str(path), *extra)
        if done.returncode != 0:
            raise SystemExit(f"nccl failed: {done.stderr.strip()}")
        return json.loads(path.read_text())


def load() -> str:
    return os.getloadavg().__repr__()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sizes", default="4M,16M")
    p.add_argument("--ops", default="all_reduce,all_gather")
    p.add_argument("--link", default="1gbit")
    p.add_argument("--name", default="i24b")
    args = p.parse_args()
    from microbench.core.units import parse_link_rate

    rate = parse_link_rate(args.link)
    up = microbench("lab", "up", "--hosts", "2", "--ranks-per-host", "2", "--link", args.link, "--name", args.name)
    if up.returncode != 0:
        raise SystemExit(f"lab up failed: {up.stderr.strip()}")
    try:
        print(f"# load average before: {load()}")
        ratios: dict[tuple[str, int], list[tuple[float, float]]] = {}
        for rnd in range(args.rounds):
            sides = [("plain", []), ("grouped", ["--groups", "world,node,cross"])]
            if rnd % 2:
                sides.reverse()
            got = {}
            for name, extra in sides:
                got[name] = busbw(run_nccl(args.name, args.sizes, args.ops, extra), "world")
            for key in got["plain"]:
                ratios.setdefault(key, []).append((got["grouped"][key], got["plain"][key]))
            print(f"# round {rnd + 1}: load {load()}", flush=True)
        per_size = []
        for (op, size), pairs in sorted(ratios.items()):
            g, b = statistics.median(x for x, _ in pairs), statistics.median(y for _, y in pairs)
            per_size.append(g / b)
            print(f"world busbw {op:>12} {size >> 20:>4}M: grouped {g:.4f} / plain {b:.4f} GB/s = {g / b:.3f}x")
        print(f"TARGET 1 (>= 0.95): world curve with --groups / without = {statistics.median(per_size):.3f}x "
              f"(median over {len(per_size)} op x size)")

        line_gbps = rate / 8 / 1e9
        sums = []
        largest = max(int(s.rstrip("M")) for s in args.sizes.split(",")) << 20
        for rnd in range(args.rounds):
            record = run_nccl(args.name, args.sizes, "all_reduce", ["--groups", "cross", "--algo", "ring"])
            at_once = record["summary"]["groups"]["cross"]["groups_at_once"]
            one = busbw(record, "cross")[("all_reduce", largest)]
            sums.append(one * at_once / line_gbps)
            print(f"# ring round {rnd + 1}: one cross group {one:.4f} GB/s x {at_once} at once = "
                  f"{one * at_once:.4f} GB/s of {line_gbps:.4f}; load {load()}", flush=True)
        share = statistics.median(sums)
        print(f"TARGET 2 (0.90-1.10): cross groups at once, summed / line rate = {share:.3f} "
              f"(all_reduce ring {largest >> 20}M, median of {len(sums)})")
    finally:
        microbench("lab", "down", "--name", args.name)
        print(f"# load average after: {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

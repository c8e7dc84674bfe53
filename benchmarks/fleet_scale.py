"""`microbench fleet` at a thousand nodes (issue targets, docs/BENCHMARKS.md):

1. Scale: 1,000 nodes' suite records, made from one real suite run (its records copied per node
   with the node's host name and 2% noise on every rate, its iterations' spread capped at 5%;
   three nodes' memory degraded), analysed by the command as a user runs it: wall time < 10 s
   and peak memory < 1 GiB (the child's maxrss).
2. False flags: a healthy synthetic fleet of 1,000 nodes x 20 metrics (half bandwidths, half
   latencies, each metric's node-to-node spread a CV drawn from --cv-range), through the fleet
   gate itself (accept/fleet/verdicts.fleet_lines): the flags of a run within the budget (1) in
   >= 95% of 100 seeds.
3. Detection: the same fleet with 10 nodes degraded by 15% on one metric (a bandwidth 15% lower
   or a latency 15% higher): all 10 flagged in >= 95% of seeds.

    python benchmarks/fleet_scale.py                       # runs a short suite for the template
    python benchmarks/fleet_scale.py --template results/suite-20261127-174327
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from microbench.accept.fleet import stats
from microbench.accept.fleet.metrics import Sample
from microbench.accept.fleet.verdicts import fleet_lines

RATES = ("copy_gbps", "busbw_gbps", "algbw_gbps", "bw_gbps", "total_gbps", "bw_gbit_s", "read_gbps", "write_gbps",
         "iops", "throughput_gbps", "durable_gbps", "samples_per_s", "load_gbps", "raw_read_gbps", "tflops",
         "operand_gbps")
TEMPLATE_STEPS = "memory,nccl,link,storage posix,compute"


def template_suite(given: str | None, tmp: Path) -> Path:
    if given:
        return Path(given)
    print(f"# template: `microbench suite --only {TEMPLATE_STEPS}` on this machine ...", flush=True)
    subprocess.run([sys.executable, "-m", "microbench", "suite", "--only", TEMPLATE_STEPS, "--results-dir",
                    str(tmp / "template")], check=True, stdout=subprocess.DEVNULL)
    return next((tmp / "template").glob("suite-*"))


# A node's iterations move about as much as like nodes differ: the template's iteration spread is
# capped at 5% either side of its median. Taken on a loaded box it can span 3x, and a thousand
# copies of that spread around medians 2% apart would be no fleet (the gate holds a group's
# sigma to at least its nodes' own spread, docs/fleet.md).
ITERATION_SPREAD = 0.05


def _tame(time_us: dict) -> dict:
    p50 = time_us.get("p50")
    if not isinstance(p50, (int, float)) or p50 <= 0:
        return time_us
    out = dict(time_us)
    for key in ("min", "max", "p95", "p99", "mean"):
        if isinstance(out.get(key), (int, float)):
            out[key] = min(max(out[key], p50 * (1 - ITERATION_SPREAD)), p50 * (1 + ITERATION_SPREAD))
    return out


def make_fleet(template: Path, root: Path, nodes: int, degraded: dict[str, float], seed: int) -> int:
    """Every node's copy of the template's records; returns the bytes written."""
    rng = random.Random(seed)
    records = [(p.name, json.loads(p.read_text())) for p in sorted(template.glob("*.json"))]
    for _, record in records:
        for row in record["rows"]:
            if isinstance(row.get("time_us"), dict):
                row["time_us"] = _tame(row["time_us"])
    written = 0
    for i in range(nodes):
        node = f"node{i:04d}"
        target = root / node / "suite-1"
        target.mkdir(parents=True)
        factor = degraded.get(node, 1.0)
        for name, record in records:
            copy = json.loads(json.dumps(record))
            copy["environment"]["hostname"] = node
            for row in copy["rows"]:
                noise = rng.gauss(1.0, 0.02) * (factor if name == "memory.json" else 1.0)
                for key in RATES:
                    if isinstance(row.get(key), (int, float)) and not isinstance(row.get(key), bool):
                        row[key] *= noise
                if isinstance(row.get("time_us"), dict):
                    row["time_us"] = {k: (v / noise if k != "n" else v) for k, v in row["time_us"].items()}
            text = json.dumps(copy)
            (target / name).write_text(text)
            written += len(text)
    return written


def scale(args: argparse.Namespace) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="fleet-scale-") as tmp_name:
        tmp = Path(tmp_name)
        template = template_suite(args.template, tmp)
        degraded = {"node0017": 0.5, "node0400": 0.6, "node0901": 0.7}   # memory copies at this share
        written = make_fleet(template, tmp / "fleet", args.nodes, degraded, seed=1)
        files = sum(1 for _ in (tmp / "fleet").rglob("*.json"))
        print(f"# {args.nodes} nodes: {files} records, {written / 2**20:.0f} MiB of JSON, from {template}")
        start = time.perf_counter()
        with open(tmp / "out.txt", "w") as out, open(tmp / "err.txt", "w") as err:
            child = subprocess.Popen([sys.executable, "-m", "microbench", "fleet", str(tmp / "fleet"),
                                      "--json", str(tmp / "fleet.json")], stdout=out, stderr=err)
            # wait4: this child's own peak resident memory (the template's suite ran as other children)
            _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        code = os.waitstatus_to_exitcode(status)
        peak_mib = usage.ru_maxrss / 1024
        failed = json.loads((tmp / "fleet.json").read_text())["summary"]["drain"]
        print(f"# exit {code}: {(tmp / 'err.txt').read_text().strip()}")
        print(f"# drained: {', '.join(failed)} (degraded: {', '.join(f'{n} memory x{f:.2f}' for n, f in degraded.items())})")
        if args.keep_output:
            shutil.copy(tmp / "fleet.json", args.keep_output)
        return wall, peak_mib


def synthetic(seed: int, nodes: int, metrics: int, cv_range: tuple[float, float], degraded: int,
              drop: float) -> tuple[dict, set[tuple[str, str]]]:
    """merged values as verdicts.fleet_lines takes them; the (node, metric) pairs degraded."""
    rng = random.Random(seed)
    merged: dict = {}
    bad: set[tuple[str, str]] = set()
    target_metric = f"m{rng.randrange(metrics):02d}"
    victims = set(rng.sample(range(nodes), degraded)) if degraded else set()
    for m in range(metrics):
        name = f"m{m:02d}"
        higher = m % 2 == 0
        cv = rng.uniform(*cv_range)
        base = rng.uniform(1, 1000)
        by_node = {}
        for i in range(nodes):
            value = base * max(1e-6, rng.gauss(1.0, cv))
            if name == target_metric and i in victims:
                value *= (1 - drop) if higher else (1 + drop)
                bad.add((f"n{i:04d}", name))
            sample = Sample("synthetic", f"synthetic {name} {'bw_gbps' if higher else 'lat_us_p50'}", None, value,
                            value, value, higher, "other", "synthetic")
            by_node[f"n{i:04d}"] = (value, value, value, 1, sample)
        merged[(name, "")] = by_node
    return merged, bad


def rates(args: argparse.Namespace) -> tuple[float, float, float]:
    tests = args.nodes * args.metrics
    p = stats.tail_for_budget(args.budget, tests)
    within = found_all = 0
    flags_total = 0
    for seed in range(args.seeds):
        merged, _ = synthetic(seed, args.nodes, args.metrics, args.cv_range, 0, 0.0)
        flags = sum(1 for line in fleet_lines("g", merged, p, args.min_fraction) if line.verdict != "PASS")
        flags_total += flags
        within += flags <= args.budget
        merged, bad = synthetic(10_000 + seed, args.nodes, args.metrics, args.cv_range, 10, 0.15)
        flagged = {(line.node, line.metric.split()[1]) for line in fleet_lines("g", merged, p, args.min_fraction)
                   if line.verdict != "PASS"}
        found_all += bad <= flagged
    return within / args.seeds, found_all / args.seeds, flags_total / args.seeds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--template", help="a suite directory to copy (default: run a short suite now)")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--metrics", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--budget", type=float, default=1.0)
    parser.add_argument("--min-fraction", type=float, default=0.05)
    parser.add_argument("--cv-range", type=float, nargs=2, default=(0.01, 0.025), metavar=("LOW", "HIGH"),
                        help="each synthetic metric's node-to-node coefficient of variation, drawn from this range")
    parser.add_argument("--sensitivity", type=float, nargs="*", default=[0.01, 0.02, 0.03, 0.05], metavar="CV",
                        help="also the rates at these fixed CVs (a fifth of --seeds each): where detection ends")
    parser.add_argument("--skip-scale", action="store_true", help="only the synthetic false-flag and detection rates")
    parser.add_argument("--keep-output", help="copy the 1,000-node fleet record here")
    args = parser.parse_args()
    print(f"# load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    if not args.skip_scale:
        wall, peak = scale(args)
        print(f"scale: {args.nodes} nodes analysed in {wall:.2f} s (target < 10 s), peak memory {peak:.0f} MiB "
              f"(target < 1024 MiB)")
    within, found, mean_flags = rates(args)
    k = stats.k_for_budget(args.budget, args.nodes * args.metrics)
    print(f"false flags: healthy {args.nodes} nodes x {args.metrics} metrics (CV {args.cv_range[0]:g}-"
          f"{args.cv_range[1]:g}), k = {k:.2f}: within the budget of {args.budget:g} in {100 * within:.0f}% of "
          f"{args.seeds} seeds (target >= 95%), {mean_flags:.2f} flags per run on average")
    print(f"detection: 10 nodes 15% worse on one metric: all 10 flagged in {100 * found:.0f}% of {args.seeds} seeds "
          f"(target >= 95%)")
    for cv in args.sensitivity:
        fixed = argparse.Namespace(**{**vars(args), "cv_range": (cv, cv), "seeds": max(10, args.seeds // 5)})
        within, found, mean_flags = rates(fixed)
        print(f"  at a CV of {cv:g} on every metric ({fixed.seeds} seeds): within the budget {100 * within:.0f}%, "
              f"{mean_flags:.2f} flags per run, all 10 found {100 * found:.0f}%")
    print(f"# load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

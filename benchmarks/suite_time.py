"""Where `microbench suite`'s wall time goes, and whether a cheaper step argument changes a figure.

    python benchmarks/suite_time.py --rounds 1
    python benchmarks/suite_time.py --step "checkpoint s3" --variant "--size 128M" --rounds 3

Without --step: runs `microbench suite` (from this checkout, and alternating with the checkout
--baseline names when given) --rounds times and prints each
step's seconds (from the suite's JUnit report, millisecond resolution), the wall time, the CPU
seconds of the whole process tree (user+sys, steadier than wall time on a shared box) and the
load average before and after.

With --step NAME --variant "ARGS": runs that suite step as the suite does (its argv from the
probe registry) and the same step with ARGS replacing the matching options, alternating which
goes first each round, and prints per round and side the step's seconds and its primary figure
per op; the medians over rounds are compared at the end. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def env(root: Path = ROOT) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def load() -> float:
    return os.getloadavg()[0]


def cpu_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_suite(tmp: Path, root: Path = ROOT) -> tuple[dict[str, float], float, float, int, dict[str, str]]:
    report = tmp / f"junit-{time.monotonic_ns()}.xml"
    cpu0, t0 = cpu_children(), time.monotonic()
    done = subprocess.run([sys.executable, "-m", "microbench", "suite", "--results-dir", str(tmp / "results"),
                           "--junit", str(report)], capture_output=True, text=True, env=env(root), cwd=tmp)
    wall, cpu = time.monotonic() - t0, cpu_children() - cpu0
    steps: dict[str, float] = {}
    if report.exists():
        for suite in ET.parse(report).getroot().iter("testsuite"):
            if suite.get("name") == "microbench.accept.suite":  # one testcase per step, its seconds as time
                for case in suite.iter("testcase"):
                    steps[case.get("name", "?")] = float(case.get("time", "0"))
    if done.returncode != 0:
        print(done.stdout[-2000:] + done.stderr[-2000:], file=sys.stderr)
    # The suite's own table: "step  result  s  headline", so each time can be read beside its figures.
    headlines = {}
    for line in done.stdout.splitlines():
        for name in steps:
            rest = line[len(name):].split() if line.startswith(name + " ") else []
            if len(rest) >= 2 and rest[0] in ("pass", "fail", "skip"):
                headlines[name] = f"{rest[0]}: " + " ".join(rest[2:])
    return steps, wall, cpu, done.returncode, headlines


def step_argv(name: str) -> list[str]:
    from microbench.core.registry import suite_steps

    for spec, step in suite_steps():
        if step.name == name or name in step.aliases:
            return [*spec.command, *step.argv]
    raise SystemExit(f"no suite step named {name!r}; expected one of "
                     f"{', '.join(step.name for _, step in suite_steps())}")


def with_variant(argv: list[str], variant: list[str]) -> list[str]:
    """argv with each `--opt value` of variant replacing the same option (appended if absent)."""
    out = list(argv)
    for i in range(0, len(variant), 2):
        opt, value = variant[i], variant[i + 1]
        if opt in out:
            out[out.index(opt) + 1] = value
        else:
            out += [opt, value]
    return out


def run_step(argv: list[str], tmp: Path) -> tuple[float, dict[str, float]]:
    from microbench.core.registry import for_record

    record = tmp / f"step-{time.monotonic_ns()}.json"
    filled = [a.format(path=str(tmp)) for a in argv]
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "microbench", *filled, "--json", str(record)],
                          capture_output=True, text=True, env=env(), cwd=tmp)
    seconds = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(filled)} failed: {done.stderr.strip()[-500:]}")
    rec = json.loads(record.read_text())
    spec = for_record(rec)
    figures = {}
    for row in rec["rows"]:
        metric = spec.row_metric(row) if spec else None
        if metric:
            figures[f"{row['op']} {metric}"] = row[metric]
    return seconds, figures


def compare(args: argparse.Namespace) -> None:
    base = step_argv(args.step)
    variant = with_variant(base, shlex.split(args.variant))
    sides = {"suite": base, "variant": variant}
    print(f"# suite:   microbench {' '.join(base)}\n# variant: microbench {' '.join(variant)}")
    results: dict[str, list[tuple[float, dict[str, float]]]] = {name: [] for name in sides}
    with tempfile.TemporaryDirectory(prefix="mb-suite-time-") as tmp_text:
        for i in range(args.rounds):
            order = list(sides) if i % 2 == 0 else list(sides)[::-1]
            for name in order:
                before = load()
                seconds, figures = run_step(sides[name], Path(tmp_text))
                results[name].append((seconds, figures))
                print(f"round {i + 1} {name:<7} {seconds:6.1f} s  load {before:4.1f}  "
                      + "  ".join(f"{k} {v:.4f}" for k, v in figures.items()), flush=True)
    for name, runs in results.items():
        keys = runs[0][1].keys()
        med = {k: statistics.median(r[1][k] for r in runs) for k in keys}
        print(f"median {name:<7} {statistics.median(r[0] for r in runs):6.1f} s  "
              + "  ".join(f"{k} {v:.4f}" for k, v in med.items()))
    keys = results["suite"][0][1].keys()
    for k in keys:
        a = statistics.median(r[1][k] for r in results["suite"])
        b = statistics.median(r[1][k] for r in results["variant"])
        ratios = [v[1][k] / s[1][k] for s, v in zip(results["suite"], results["variant"])]
        print(f"{k}: variant / suite median {b / a:.3f}; per-round ratios " + " ".join(f"{r:.3f}" for r in ratios))


def timeline(args: argparse.Namespace) -> None:
    checkouts = [ROOT] + ([Path(args.baseline).resolve()] if args.baseline else [])
    with tempfile.TemporaryDirectory(prefix="mb-suite-time-") as tmp_text:
        tmp = Path(tmp_text)
        for i in range(args.rounds):
            for root in (checkouts if i % 2 else checkouts[::-1]):
                before = load()
                steps, wall, cpu, code, headlines = run_suite(tmp, root)
                print(f"# round {i + 1}, {root}: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load "
                      f"{before:.1f} before, {load():.1f} after, {os.cpu_count()} cores, exit {code}")
                for name, seconds in steps.items():
                    print(f"  {name:<15} {seconds:6.1f} s  {headlines.get(name, '')}")
                print(f"  {'steps':<15} {sum(steps.values()):6.1f} s\n  {'wall':<15} {wall:6.1f} s (target < 60)\n"
                      f"  {'user+sys':<15} {cpu:6.1f} s (CPU of the whole process tree)", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--baseline", metavar="CHECKOUT",
                        help="also time the suite of another checkout (e.g. main), alternating with this one")
    parser.add_argument("--step", help="compare one suite step with a variant of its arguments")
    parser.add_argument("--variant", help='options replacing the step\'s own, e.g. "--size 128M"')
    args = parser.parse_args()
    if args.step:
        if not args.variant:
            raise SystemExit("--step needs --variant, e.g. --variant \"--size 128M\"")
        compare(args)
    else:
        timeline(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

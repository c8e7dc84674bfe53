"""Does forking a step from a warm process change what it measures?

    python benchmarks/step_modes.py --baseline /tmp/base --rounds 2 -- checkpoint --size 256M \\
        --nproc 2 --target s3://microbench/ckpt

Runs one microbench command three ways per round, side by side: as a fresh interpreter on the
--baseline checkout (skipped without one), as a fresh interpreter on this checkout, and forked
from a warm process of this checkout (prefork.py, as `microbench suite` runs its steps). Prints
each run's seconds, every row's primary figure and the load average. Nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def figures(path: Path) -> str:
    from microbench.core.registry import for_record

    record = json.loads(path.read_text())
    spec = for_record(record)
    out = []
    for row in record["rows"]:
        metric = spec.row_metric(row) if spec else None
        if metric:
            out.append(f"{row['op']} {row[metric]:.3f}")
    return " ".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="another checkout (native core built in place) to run as well")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the microbench command, after --")
    args = parser.parse_args()
    command = [a for a in args.command if a != "--"] or ["memory", "--sizes", "64M"]

    from microbench.world import fork as prefork

    if not prefork.warm():
        raise SystemExit("this machine cannot fork steps (a GPU is possible, or torch is missing)")
    modes = (["base-exec"] if args.baseline else []) + ["main-exec", "main-fork"]
    with tempfile.TemporaryDirectory(prefix="mb-step-modes-") as tmp:
        for round_no in range(args.rounds):
            for mode in modes:
                out = Path(tmp) / f"{mode}-{round_no}.json"
                start = time.monotonic()
                if mode == "main-fork":
                    env = {**os.environ, "PYTHONPATH": str(ROOT)}
                    code = prefork.start([*command, "--json", str(out)], env, stdout=subprocess.DEVNULL).wait()
                else:
                    root = args.baseline if mode == "base-exec" else str(ROOT)
                    code = subprocess.run([sys.executable, "-P", "-m", "microbench", *command, "--json", str(out)],
                                          stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": root}).returncode
                seconds = time.monotonic() - start
                shown = figures(out) if code == 0 and out.exists() else f"failed with exit code {code}"
                print(f"{round_no} {mode:<9} {seconds:5.1f} s  {shown}  load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()

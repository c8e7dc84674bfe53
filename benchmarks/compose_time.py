"""How long `microbench compose` takes with two networks, --sharding and --scale-nodes (issue 24:
target under 1 s), interleaved with the same command on a one-level --net (what compose took
before). Prints the median wall seconds of each over --repeat rounds and their ratio.

    python benchmarks/compose_time.py --repeat 7
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = ["--model", "llama-3.1-8b", "--nodes", "2", "--gpus-per-node", "8", "--gpu", "h100"]
CASES = {
    "one level (--net)": ["--net", "eth=1.2GB/s"],
    "two levels, full,hybrid": ["--net-intra", "360GB/s", "--net-inter", "1.2GB/s", "--sharding", "full,hybrid"],
    "two levels x2, 4 strategies, 4 node counts": [
        "--net-intra", "360GB/s", "--net-inter", "eth=1.2GB/s", "--net-inter", "ib=400GB/s@10us",
        "--sharding", "full,hybrid,hybrid:4,hybrid:1", "--scale-nodes", "1,8,64,512"],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in CASES}
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.repeat):
            for name, extra in CASES.items():
                out = Path(tmp) / f"{rnd}-{len(times[name])}-{abs(hash(name))}.json"
                start = time.perf_counter()
                subprocess.run([sys.executable, "-m", "microbench", "compose", *JOB, *extra, "--json", str(out)],
                               check=True, stdout=subprocess.DEVNULL, cwd=tmp)
                times[name].append(time.perf_counter() - start)
    base = statistics.median(times["one level (--net)"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:45s} median {med:.3f} s  (min {min(ts):.3f}, max {max(ts):.3f})  {med / base:.2f}x one level")
    return 0


if __name__ == "__main__":
    sys.exit(main())

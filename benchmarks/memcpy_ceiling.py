"""Is the memcpy ceiling the fastest copy this machine does, and do both ways of timing it agree?

    python benchmarks/memcpy_ceiling.py --rounds 5

Alternates, round by round, three separate processes on the same 64 MiB single-thread copy:
  1. `microbench memory --sizes 64M` (the runner: warm-up, timed iterations, median);
  2. the pytest-benchmark comparison `benchmarks/test_hot_paths.py -k memcpy` (native and numpy
     fallback through the probe_benchmark fixture), read back from --benchmark-json;
  3. a plain numpy copy (`np.copyto` on pre-touched 64 MiB arrays), median of 20.
Prints each side's median over rounds, then the two targets: pytest-benchmark's native median
within 10% of `microbench memory`, and the native copy >= 1.0x the plain numpy copy.
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
SIZE = 64 << 20
NUMPY_COPY = f"""
import time, numpy as np
src = np.full({SIZE}, 0x5A, dtype=np.uint8); dst = np.empty({SIZE}, dtype=np.uint8); dst.fill(0)
np.copyto(dst, src)
ts = []
for _ in range(20):
    t = time.perf_counter(); np.copyto(dst, src); ts.append(time.perf_counter() - t)
ts.sort(); print(ts[len(ts) // 2])
"""


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def memory_ms(tmp: Path) -> float:
    out = tmp / "memory.json"
    out.unlink(missing_ok=True)
    subprocess.run([sys.executable, "-m", "microbench", "memory", "--sizes", "64M", "--json", str(out)],
                   check=True, capture_output=True, env=env(), cwd=tmp)
    row = next(r for r in json.loads(out.read_text())["rows"] if r["op"] == "memcpy_1t")
    return row["time_us"]["p50"] / 1e3


def pytest_ms(tmp: Path) -> dict[str, float]:
    out = tmp / "bench.json"
    subprocess.run([sys.executable, "-m", "pytest", str(ROOT / "benchmarks" / "test_hot_paths.py"), "-k", "memcpy",
                    "-q", "-p", "no:cacheprovider", f"--benchmark-json={out}"],
                   check=True, capture_output=True, env=env(), cwd=ROOT)
    found = {}
    for bench in json.loads(out.read_text())["benchmarks"]:
        found[bench["param"]] = bench["stats"]["median"] * 1e3
    return found


def numpy_ms() -> float:
    done = subprocess.run([sys.executable, "-c", NUMPY_COPY], check=True, capture_output=True, text=True)
    return float(done.stdout.strip()) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {os.getloadavg()[0]:.2f} "
          f"on {os.cpu_count()} cores")
    sides: dict[str, list[float]] = {"microbench memory (native)": [], "pytest-benchmark native": [],
                                     "pytest-benchmark numpy fallback": [], "plain numpy copy": []}
    with tempfile.TemporaryDirectory(prefix="microbench-memcpy-") as tmp_text:
        tmp = Path(tmp_text)
        for i in range(args.rounds):
            steps = [("microbench memory (native)", lambda: memory_ms(tmp)), ("pytest", lambda: pytest_ms(tmp)),
                     ("plain numpy copy", numpy_ms)]
            for name, fn in (steps if i % 2 == 0 else steps[::-1]):
                value = fn()
                if name == "pytest":
                    sides["pytest-benchmark native"].append(value["native"])
                    sides["pytest-benchmark numpy fallback"].append(value["python"])
                else:
                    sides[name].append(value)
    med = {name: statistics.median(v) for name, v in sides.items()}
    for name, value in med.items():
        print(f"{name:<34} {value:6.2f} ms  {SIZE / value / 1e6:6.2f} GB/s   rounds: "
              + " ".join(f"{v:.2f}" for v in sides[name]))
    agree = med["pytest-benchmark native"] / med["microbench memory (native)"]
    vs_numpy = med["plain numpy copy"] / med["microbench memory (native)"]
    print(f"pytest-benchmark / microbench memory (native time): {agree:.3f} (target within 0.90-1.10) "
          f"{'ok' if 0.9 <= agree <= 1.1 else 'MISSED'}")
    print(f"native copy speed / plain numpy copy speed: {vs_numpy:.3f}x (target >= 1.0) "
          f"{'ok' if vs_numpy >= 1.0 else 'MISSED'}")
    print(f"# load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Is the memcpy ceiling the fastest copy this machine does, and do both ways of timing it agree?

    python benchmarks/memcpy_ceiling.py --rounds 5

Alternates, round by round, three separate processes on the same 64 MiB single-thread copy:
  1. `microbench memory --sizes 64M` (the runner: warm-up, timed iterations, median);
  2. the pytest-benchmark comparison `benchmarks/test_hot_paths.py -k memcpy` (native and numpy
     fallback through the probe_benchmark fixture), read back from --benchmark-json;
  3. a plain numpy copy (`np.copyto` on pre-touched 64 MiB arrays), median of 20.
Both native paths time the same copies: MemoryProbe.run_once (native copies in batches of
probes.memory.copies_per_call(warm-up, iterations), one batch per case at these counts, buffers
allocated, touched and huge-page advised once per batch, outside the timed copies), with the
memory command's warm-up and iteration counts (test_hot_paths reads them from its parser).

Prints, per side, the median of the per-round medians, the fastest copy and the copy kernel each
run used. Targets, on medians: pytest-benchmark's native median within 10% of `microbench
memory`'s, judged as the median over rounds of the per-round ratio (the two processes of a round
run back to back, so a burst of other work on a shared box hits both sides of one ratio rather
than one side of the comparison), and the native copy >= 1.0x the plain numpy copy (median and
fastest). The fastest copies are printed beside them as the ceiling's own definition.
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
KERNELS: dict[str, set] = {}  # side -> copy kernels its runs used
NUMPY_COPY = f"""
import time, numpy as np
src = np.full({SIZE}, 0x5A, dtype=np.uint8); dst = np.empty({SIZE}, dtype=np.uint8); dst.fill(0)
np.copyto(dst, src)
ts = []
for _ in range(20):
    t = time.perf_counter(); np.copyto(dst, src); ts.append(time.perf_counter() - t)
ts.sort(); print(ts[len(ts) // 2], ts[0])
"""


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def memory_ms(tmp: Path) -> tuple[float, float]:
    out = tmp / "memory.json"
    out.unlink(missing_ok=True)
    subprocess.run([sys.executable, "-m", "microbench", "memory", "--sizes", "64M", "--json", str(out)],
                   check=True, capture_output=True, env=env(), cwd=tmp)
    row = next(r for r in json.loads(out.read_text())["rows"] if r["op"] == "memcpy_1t")
    KERNELS.setdefault("microbench memory (native)", set()).add(row.get("copy_kernel"))
    return row["time_us"]["p50"] / 1e3, row["time_us"]["min"] / 1e3


def pytest_ms(tmp: Path) -> dict[str, tuple[float, float]]:
    out = tmp / "bench.json"
    subprocess.run([sys.executable, "-m", "pytest", str(ROOT / "benchmarks" / "test_hot_paths.py"), "-k", "memcpy",
                    "-q", "-p", "no:cacheprovider", f"--benchmark-json={out}"],
                   check=True, capture_output=True, env=env(), cwd=ROOT)
    found = {}
    for bench in json.loads(out.read_text())["benchmarks"]:
        found[bench["param"]] = (bench["stats"]["median"] * 1e3, bench["stats"]["min"] * 1e3)
        side = "pytest-benchmark native" if bench["param"] == "native" else "pytest-benchmark numpy fallback"
        KERNELS.setdefault(side, set()).add(bench["extra_info"].get("copy_kernel"))
    return found


def numpy_ms() -> tuple[float, float]:
    done = subprocess.run([sys.executable, "-c", NUMPY_COPY], check=True, capture_output=True, text=True)
    median, fastest = (float(x) * 1e3 for x in done.stdout.split())
    return median, fastest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {os.getloadavg()[0]:.2f} "
          f"on {os.cpu_count()} cores")
    sides: dict[str, list[tuple[float, float]]] = {"microbench memory (native)": [], "pytest-benchmark native": [],
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
    best = {name: min(f for _, f in v) for name, v in sides.items()}
    med = {name: statistics.median(m for m, _ in v) for name, v in sides.items()}
    for name, values in sides.items():
        kernels = ",".join(sorted(str(k) for k in KERNELS.get(name, {"numpy"})))
        print(f"{name:<34} median {med[name]:6.2f} ms ({SIZE / med[name] / 1e6:5.2f} GB/s), fastest "
              f"{best[name]:5.2f} ms ({SIZE / best[name] / 1e6:5.2f} GB/s), kernel {kernels}; per-round medians: "
              + " ".join(f"{m:.2f}" for m, _ in values))
    native, bench = "microbench memory (native)", "pytest-benchmark native"
    ratios = [b / m for (b, _), (m, _) in zip(sides[bench], sides[native])]
    paired = statistics.median(ratios)
    print("per-round ratio of medians, pytest-benchmark / microbench memory: " + " ".join(f"{r:.3f}" for r in ratios))
    verdicts = [
        ("median of per-round ratios, pytest-benchmark / microbench memory (native time)", paired, 0.9, 1.1),
        ("median of medians, pytest-benchmark / microbench memory (native time)", med[bench] / med[native], 0.9, 1.1),
        ("fastest copy, pytest-benchmark / microbench memory (native time)", best[bench] / best[native], 0.9, 1.1),
        ("median, native speed / plain numpy speed", med["plain numpy copy"] / med[native], 1.0, None),
        ("fastest copy, native speed / plain numpy speed", best["plain numpy copy"] / best[native], 1.0, None),
    ]
    for label, value, low, high in verdicts:
        ok = value >= low and (high is None or value <= high)
        target = f"{low:.2f}-{high:.2f}" if high is not None else f">= {low:.1f}x"
        print(f"{label}: {value:.3f} (target {target}) {'ok' if ok else 'MISSED'}")
    print(f"# load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

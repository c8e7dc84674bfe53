"""Native POSIX engine vs fio on the same file: sequential read and write, O_DIRECT, same
threads and queue depth. Runs alternate (native, fio, fio, native, ...) so drift in the
machine hits both alike; each side's figure is the median GB/s of --runs runs. Target: the
native engine at least 0.95x fio.

    python benchmarks/posix_vs_fio.py --path /tmp --size 1G --runs 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

# Last, not first: the installed microbench (with its compiled core) wins; the checkout is the
# fallback for a machine where it is not installed.
sys.path.append(str(Path(__file__).resolve().parent.parent))

from microbench.targets import native  # noqa: E402
from microbench.probes.storage import fio_engine as sf  # noqa: E402
from microbench.probes.storage import posix as sp  # noqa: E402
from microbench.core.units import format_size, parse_size  # noqa: E402

TARGET = 0.95


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", default="/tmp")
    ap.add_argument("--size", default="1G")
    ap.add_argument("--bs", default="1M,16M")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--qd", type=int, default=4)
    ap.add_argument("--runs", type=int, default=5, help="runs per side, at least 3")
    args = ap.parse_args()
    if args.runs < 3:
        ap.error("--runs must be at least 3")
    if sf.fio_unavailable_reason():
        print(f"skipped: {sf.fio_unavailable_reason()}")
        return 0
    size = parse_size(args.size)
    bss = [parse_size(b) for b in args.bs.split(",")]
    config = sp.Config(path=args.path, rw=["write", "read"], bs=bss, threads=args.threads, qd=args.qd,
                       direct=True, size=size)
    engine = sp.expected_engine(config)
    rows, worst = [], None
    with sp.Target(config) as target:
        data = str(target.data)
        print(f"# {data} ({target.workdir.facts()['filesystem']}), O_DIRECT, {args.threads} thread(s) x qd {args.qd}, "
              f"engine {engine} ({native.implementation()['name']}), file {format_size(size)}, "
              f"median of {args.runs} alternating runs; {sf.fio_version()}")

        def posix(write: bool, bs: int) -> float:
            r = native.io_run(data, write, bs, size, threads=args.threads, qd=args.qd, direct=True)
            return r["bytes"] / r["seconds"] / 1e9

        def fio(write: bool, bs: int) -> float:
            r = sf.run_fio(data, write=write, bs=bs, size=size, threads=args.threads, qd=args.qd, direct=True,
                           random_order=False, engine=engine)
            return r["bytes"] / r["seconds"] / 1e9

        for rw in ("write", "read"):
            for bs in bss:
                write = rw == "write"
                posix(write, bs), fio(write, bs)  # warm-up, not counted
                mine, theirs = [], []
                for i in range(args.runs):
                    order = (posix, fio) if i % 2 == 0 else (fio, posix)
                    for fn in order:
                        (mine if fn is posix else theirs).append(fn(write, bs))
                m, f = statistics.median(mine), statistics.median(theirs)
                ratio = m / f
                worst = ratio if worst is None else min(worst, ratio)
                rows.append((rw, format_size(bs), m, f, ratio))
                print(f"{rw:<6}{format_size(bs):>5}  posix {m:6.3f} GB/s  fio {f:6.3f} GB/s  ratio {ratio:5.3f}  "
                      f"(posix runs {' '.join(f'{v:.3f}' for v in mine)}; fio runs {' '.join(f'{v:.3f}' for v in theirs)})",
                      flush=True)
    verdict = "meets" if worst is not None and worst >= TARGET else "misses"
    print(f"# worst ratio {worst:.3f}: {verdict} the {TARGET}x target")
    return 0


if __name__ == "__main__":
    sys.exit(main())

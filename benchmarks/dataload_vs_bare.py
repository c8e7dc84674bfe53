"""`microbench dataload` vs a bare DataLoader loop over the same files with the same workers.

Two figures. **Pairs** (the target's): in one process, over one dataset the probe's own code
wrote, the probe's pass (`DataloadProbe.run_once`: the page-cache drop, its DataLoader, every
sample checked, timed as the probe times it) and a bare pass alternate, the order swapped every
pair, --pairs pairs per worker count; the ratio is the median of the pairs' ratios (target >=
0.95). `cold` pairs drop the pages before every pass, as the probe does: both sides then make
the same reads, and on the 2-core VM a cold pass of either swings by -40/+10 % from one pass to
the next (13-23K samples/s for the bare loop alone, while a plain 1 MiB read of the same files
takes 0.23 s +-5 %), so their median needs many pairs. `warm` pairs read from the page cache:
the same code with the storage's noise gone, so their ratio is the probe's own cost, +-5 %.

**CLI rounds** (a cross-check that the command adds nothing the pairs miss, skipped with
--pairs-only):
Each round runs `microbench dataload --keep --iters N` as a user types it (a new dataset; per
--workers count the median of N passes, each after dropping the dataset's pages) between two bare
loops: one over the previous round's dataset before it and one over the dataset it kept after it
(the first round has only the one after). A bare loop has the same DataLoader settings
(map-style shuffled over files, or an IterableDataset streaming the shards split across
workers), reads bytes and nothing else, and takes the median of N passes after the same
page-cache drop. A round's ratio is probe samples/s over the mean of the bare loops around it;
printed per worker count: the median over --repeat rounds (target >= 0.95). Single cold passes of
a 20000-sample dataset swing by +-25 % on the 2-core VM, hence N passes a side and a bracket.

    python benchmarks/dataload_vs_bare.py --layout shards --samples 20000 --workers 0,2 --pairs 11 --repeat 3
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time


def drop(paths: list[str]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def bare(root: str, layout: str, workers: int, batch: int, cold: bool = True) -> tuple[float, int]:
    import torch
    from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

    if layout == "files":
        paths = sorted(glob.glob(os.path.join(root, "files", "*", "*")))

        class Files(Dataset):
            def __len__(self):
                return len(paths)

            def __getitem__(self, i):
                with open(paths[i], "rb") as f:
                    return f.read()

        data, kw = Files(), {"shuffle": True}
    else:
        paths = sorted(glob.glob(os.path.join(root, "shards", "*.tar")))

        class Shards(IterableDataset):
            def __iter__(self):
                info = get_worker_info()
                mine = paths if info is None else paths[info.id::info.num_workers]
                for path in mine:
                    with open(path, "rb") as f, tarfile.open(fileobj=f, mode="r|") as tar:
                        for m in tar:
                            yield tar.extractfile(m).read()

        data, kw = Shards(), {}
    if cold:
        drop(paths)
    loader = DataLoader(data, batch_size=batch, num_workers=workers, collate_fn=list, **kw)
    start, n = time.perf_counter(), 0
    for items in loader:
        n += len(items)
    return time.perf_counter() - start, n


def bare_median(root: str, layout: str, workers: int, batch: int, iters: int) -> float:
    """samples/s: the median of `iters` bare passes, each after a page-cache drop."""
    rates = []
    for _ in range(iters):
        seconds, n = bare(root, layout, workers, batch)
        rates.append(n / seconds)
    return statistics.median(rates)


def pairs(args: argparse.Namespace, workers: list[int], cold: bool) -> dict[int, list[float]]:
    """Probe pass / bare pass, alternating in this process over one dataset the probe's code
    wrote; cold: each pass after dropping the dataset's pages (as the probe runs), warm: none
    dropped, so both read from the page cache and the ratio is the probe's own CPU cost."""
    from microbench.core.probe import Case
    from microbench.core.units import parse_size
    from microbench.probes.dataload import Config, DataloadProbe, dataset as ds, size_or_range
    from microbench.probes.dataload.loader import Source
    from microbench.probes.dataload.run import Dataset

    low, high = size_or_range(args.sample_size, "--sample-size")
    config = Config(layout=args.layout, samples=parse_size(args.samples), sample_size=[low, high],
                    workers=workers, batch_size=args.batch_size)
    plan = ds.plan_for(config)
    root = tempfile.mkdtemp(prefix="dataload-pairs-", dir=args.path)
    ratios: dict[int, list[float]] = {}
    try:
        paths = ds.write_local(plan, root)
        data = Dataset(plan, Source(root=root).index(plan), paths if cold else [], False)
        probe = DataloadProbe(config, None, data)
        if not cold:
            bare(root, args.layout, 0, args.batch_size, cold=False)   # the pages in, once
        for w in workers:
            case = Case(args.layout, plan.total_bytes, (("workers", w),))
            # One untimed pass of each side first: the first pass after the dataset was written
            # ran 2-3x slower than any later one, whichever side it was (the written bytes' freed
            # memory handed back to the VM's host; docs/BENCHMARKS.md), which put every first
            # pair at 0.3-0.5.
            probe.run_once(case)
            bare(root, args.layout, w, args.batch_size, cold=cold)
            for i in range(args.pairs):
                def probe_rate() -> float:
                    timed = probe.run_once(case)
                    assert probe.check(case) == 0
                    return plan.samples / timed.time_s

                def bare_rate() -> float:
                    seconds, n = bare(root, args.layout, w, args.batch_size, cold=cold)
                    return n / seconds

                if i % 2:
                    b, p = bare_rate(), probe_rate()
                else:
                    p, b = probe_rate(), bare_rate()
                ratios.setdefault(w, []).append(p / b)
                print(f"pair {'cold' if cold else 'warm'} workers={w}: microbench {p:.0f} samples/s, bare {b:.0f} "
                      f"-> {p / b:.3f}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return ratios


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layout", default="shards")
    ap.add_argument("--samples", default="20000")
    ap.add_argument("--sample-size", default="16K")
    ap.add_argument("--workers", default="0,2")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--iters", type=int, default=3, help="passes per side per round (median)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--path", default=tempfile.gettempdir())
    ap.add_argument("--pairs", type=int, default=15, help="alternating probe/bare passes per worker count")
    ap.add_argument("--cache", default="cold,warm", help="pairs with the pages dropped before each pass, "
                    "from the page cache, or both")
    ap.add_argument("--pairs-only", action="store_true", help="skip the CLI rounds")
    args = ap.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    print(f"# load average before: {os.getloadavg()[0]:.2f}", flush=True)
    in_process = {(cache, w): values for cache in args.cache.split(",")
                  for w, values in pairs(args, workers, cache == "cold").items()}
    ratios: dict[int, list[float]] = {}
    previous: str | None = None
    try:
        for _ in range(0 if args.pairs_only else args.repeat):
            before = ({w: bare_median(previous, args.layout, w, args.batch_size, args.iters) for w in workers}
                      if previous else {})
            out = tempfile.mkdtemp()
            cmd = [sys.executable, "-m", "microbench", "dataload", "--path", args.path, "--layout", args.layout,
                   "--samples", args.samples, "--sample-size", args.sample_size, "--workers", args.workers,
                   "--batch-size", str(args.batch_size), "--iters", str(args.iters), "--warmup", "0",
                   "--keep", "--json", os.path.join(out, "r.json")]
            subprocess.run(cmd, check=True, capture_output=True, text=True)
            record = json.load(open(os.path.join(out, "r.json")))
            shutil.rmtree(out, ignore_errors=True)
            if previous:
                shutil.rmtree(previous, ignore_errors=True)
            previous = record["implementation"]["dataset_dir"]
            assert all(row["nwrong"] == 0 for row in record["rows"])
            for row in record["rows"]:
                w = row["workers"]
                after = bare_median(previous, args.layout, w, args.batch_size, args.iters)
                base = statistics.mean([after] + ([before[w]] if w in before else []))
                ratio = row["samples_per_s"] / base
                ratios.setdefault(w, []).append(ratio)
                print(f"workers={w}: microbench {row['samples_per_s']:.0f} samples/s, bare "
                      f"{before[w]:.0f} before / {after:.0f} after" if w in before else
                      f"workers={w}: microbench {row['samples_per_s']:.0f} samples/s, bare {after:.0f} after",
                      f"-> ratio {ratio:.3f}", flush=True)
    finally:
        if previous:
            shutil.rmtree(previous, ignore_errors=True)
    print(f"# load average after: {os.getloadavg()[0]:.2f}")
    for (cache, w), values in in_process.items():
        print(f"workers={w}: {cache} pairs: median ratio microbench/bare {statistics.median(values):.3f} "
              f"over {len(values)} pairs {['%.3f' % v for v in values]}")
    for w, values in sorted(ratios.items()):
        print(f"workers={w}: CLI rounds: median ratio microbench/bare {statistics.median(values):.3f} "
              f"over {len(values)} rounds {['%.3f' % v for v in values]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

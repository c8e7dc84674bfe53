"""`microbench dataload` vs a bare DataLoader loop over the same files with the same workers.

Each round runs `microbench dataload --keep` (a new dataset, one pass per --workers count after
dropping its pages) and then, over the dataset it kept, a bare loop: the same DataLoader
settings (map-style shuffled over files, or an IterableDataset streaming the shards split across
workers), reading bytes and nothing else, after the same page-cache drop. Prints per worker count
the median ratio probe samples/s / bare samples/s over --repeat interleaved rounds (target >= 0.95).

    python benchmarks/dataload_vs_bare.py --layout shards --samples 20000 --workers 0,2 --repeat 3
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


def bare(root: str, layout: str, workers: int, batch: int) -> tuple[float, int]:
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
    drop(paths)
    loader = DataLoader(data, batch_size=batch, num_workers=workers, collate_fn=list, **kw)
    start, n = time.perf_counter(), 0
    for items in loader:
        n += len(items)
    return time.perf_counter() - start, n


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layout", default="shards")
    ap.add_argument("--samples", default="20000")
    ap.add_argument("--sample-size", default="16K")
    ap.add_argument("--workers", default="0,2")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--path", default=tempfile.gettempdir())
    args = ap.parse_args()
    ratios: dict[int, list[float]] = {}
    for _ in range(args.repeat):
        out = tempfile.mkdtemp()
        cmd = [sys.executable, "-m", "microbench", "dataload", "--path", args.path, "--layout", args.layout,
               "--samples", args.samples, "--sample-size", args.sample_size, "--workers", args.workers,
               "--batch-size", str(args.batch_size), "--keep", "--json", os.path.join(out, "r.json")]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        record = json.load(open(os.path.join(out, "r.json")))
        root = record["implementation"]["dataset_dir"]
        try:
            for row in record["rows"]:
                seconds, n = bare(root, args.layout, row["workers"], args.batch_size)
                ratio = row["samples_per_s"] / (n / seconds)
                ratios.setdefault(row["workers"], []).append(ratio)
                print(f"workers={row['workers']}: microbench {row['samples_per_s']:.0f} samples/s, "
                      f"bare {n / seconds:.0f} samples/s, ratio {ratio:.3f}", flush=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)
            shutil.rmtree(out, ignore_errors=True)
    for workers, values in sorted(ratios.items()):
        print(f"workers={workers}: median ratio microbench/bare {statistics.median(values):.3f} "
              f"over {len(values)} rounds {['%.3f' % v for v in values]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

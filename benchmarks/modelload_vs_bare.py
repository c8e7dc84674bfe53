"""`microbench modelload` vs a bare safetensors.torch.load_file loop over the same shards.

Each round runs `microbench modelload --keep --nproc 1` (raw read + every-rank load, cold cache)
and then, over the directory it kept, the bare loop after the same page-cache drop: load_file on
each shard in order and copy every tensor into a preallocated one (load_file maps the file and
reads a tensor's bytes only when touched; from_pretrained's copy into the model's parameters is
what reads them). Prints the median ratio probe load GB/s / bare GB/s (target >= 0.95).

    python benchmarks/modelload_vs_bare.py --size 1G --pairs 11 --repeat 3

**Pairs** (the target's figure, as in dataload_vs_bare.py): in one process, over one model
directory the probe's own code wrote, the probe's every-rank load (`ModelloadProbe.run_once`:
the drop, load_file per shard, the copy into the model's tensors, timed as the probe times it)
and the bare loop alternate, order swapped every pair, after one untimed load of each; the
median of the pairs' ratios. The rounds above are the cross-check (each one's probe load is the
first after that process wrote and synced the model, the bare one's a later one).
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
import tempfile
import time


def bare(root: str, dest: dict | None = None) -> tuple[float, int]:
    import torch
    from safetensors.torch import load_file

    paths = sorted(glob.glob(os.path.join(root, "*.safetensors")))
    if dest is None:
        dest = {}
    if not dest:
        for path in paths:   # the destination tensors exist before the timed load, as the model's do
            for name, t in load_file(path).items():
                dest[name] = torch.zeros_like(t)
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    start, total = time.perf_counter(), 0
    for path in paths:
        for name, t in load_file(path).items():
            dest[name].copy_(t)
            total += t.numel() * t.element_size()
    return time.perf_counter() - start, total


def pairs(args: argparse.Namespace) -> list[float]:
    import torch

    from microbench.core.probe import Case
    from microbench.core.units import parse_size
    from microbench.probes.modelload import Config, ModelloadProbe, model_dir as md
    from microbench.probes.modelload.run import md_elem
    from microbench.probes.modelload.store import LocalModel

    config = Config(size_bytes=parse_size(args.size), nproc=1)
    lay = md.layout(config.size_bytes, config.dtype, md_elem(config.dtype))
    root = os.path.join(tempfile.mkdtemp(prefix="modelload-pairs-", dir=args.path), "m")
    model = LocalModel(lay, root)
    ratios: list[float] = []
    try:
        model.write(torch)
        probe = ModelloadProbe(config, None, model)
        case = Case("every-rank", lay.total_bytes)
        dest: dict = {}

        def probe_gbps() -> float:
            probe.prepare(case)
            seconds = probe.run_once(case).time_s
            assert probe.check(case) == 0
            return lay.total_bytes / seconds / 1e9

        def bare_gbps() -> float:
            seconds, nbytes = bare(root, dest)
            return nbytes / seconds / 1e9

        probe_gbps(), bare_gbps()   # one untimed load of each first
        for i in range(args.pairs):
            if i % 2:
                b, p = bare_gbps(), probe_gbps()
            else:
                p, b = probe_gbps(), bare_gbps()
            ratios.append(p / b)
            print(f"pair: microbench {p:.3f} GB/s, bare {b:.3f} GB/s -> {p / b:.3f}", flush=True)
    finally:
        shutil.rmtree(os.path.dirname(root), ignore_errors=True)
    return ratios


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1G")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=11)
    ap.add_argument("--path", default=tempfile.gettempdir())
    args = ap.parse_args()
    in_process = pairs(args)
    ratios = []
    for _ in range(args.repeat):
        out = tempfile.mkdtemp()
        subprocess.run([sys.executable, "-m", "microbench", "modelload", "--path", args.path, "--size", args.size,
                        "--nproc", "1", "--keep", "--json", os.path.join(out, "r.json")],
                       check=True, capture_output=True, text=True)
        record = json.load(open(os.path.join(out, "r.json")))
        root = record["implementation"]["model_dir"]
        try:
            row = next(r for r in record["rows"] if r["op"] == "every-rank")
            seconds, nbytes = bare(root)
            ratio = row["load_gbps"] / (nbytes / seconds / 1e9)
            ratios.append(ratio)
            print(f"microbench {row['load_gbps']:.3f} GB/s (raw read {row['raw_read_gbps']:.3f}), bare load_file "
                  f"{nbytes / seconds / 1e9:.3f} GB/s, ratio {ratio:.3f}", flush=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)
            shutil.rmtree(out, ignore_errors=True)
    print(f"pairs: median ratio microbench/bare {statistics.median(in_process):.3f} over {len(in_process)} pairs "
          f"{['%.3f' % v for v in in_process]}")
    print(f"rounds: median ratio microbench/bare {statistics.median(ratios):.3f} over {len(ratios)} rounds "
          f"{['%.3f' % v for v in ratios]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

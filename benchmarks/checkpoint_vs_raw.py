"""DCP checkpoint save vs raw sequential writes of the same bytes to the same directory.

Runs `microbench checkpoint` (N ranks, save + load) and then N processes that each write and
fsync size/N bytes with plain os.write in 16 MiB blocks, then read them back after dropping the
page cache. Prints the ratios DCP/raw: how much of the storage's bandwidth DCP's serialization,
planning and metadata leave on the table. Alternates the two, median of --repeat runs.

    python benchmarks/checkpoint_vs_raw.py --size 1G --nproc 2 --target /tmp/ckbench --repeat 3
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

BLOCK = 16 << 20


def _raw_rank(path: str, nbytes: int, start, out) -> None:
    buf = os.urandom(BLOCK)
    start.wait()
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    left = nbytes
    while left > 0:
        left -= os.write(fd, buf[:min(BLOCK, left)])
    os.fsync(fd)
    os.close(fd)
    write_s = time.perf_counter() - t0
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    start.wait()
    t0 = time.perf_counter()
    while os.read(fd, BLOCK):
        pass
    os.close(fd)
    out.put((write_s, time.perf_counter() - t0))


def raw(size: int, nproc: int, target: str) -> tuple[float, float]:
    run = os.path.join(target, f"raw-{uuid.uuid4().hex[:8]}")
    os.makedirs(run)
    start, out = mp.Barrier(nproc), mp.Queue()
    procs = [mp.Process(target=_raw_rank, args=(os.path.join(run, f"r{r}"), size // nproc, start, out))
             for r in range(nproc)]
    for p in procs:
        p.start()
    times = [out.get() for _ in procs]
    for p in procs:
        p.join()
    for name in os.listdir(run):
        os.unlink(os.path.join(run, name))
    os.rmdir(run)
    return size / max(t[0] for t in times) / 1e9, size / max(t[1] for t in times) / 1e9


def dcp(size: str, nproc: int, target: str) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "r.json")
        from microbench.world.launch import package_env, self_command

        subprocess.run([*self_command(), "checkpoint", "--size", size, "--nproc", str(nproc),
                        "--target", target, "--warmup", "1", "--iters", "3", "--json", path, "--no-check"],
                       check=True, stdout=subprocess.DEVNULL, env=package_env())
        rows = {r["op"]: r for r in json.load(open(path))["rows"]}
    return rows["save"]["write_gbps"], rows["load"]["read_gbps"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1G")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--target", default=tempfile.gettempdir())
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    # Last: the installed microbench (with its compiled core) wins over the checkout.
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from microbench.core.units import parse_size

    nbytes = parse_size(args.size)
    save, load, wr, rd = [], [], [], []
    for _ in range(args.repeat):
        s, l = dcp(args.size, args.nproc, args.target)
        w, r = raw(nbytes, args.nproc, args.target)
        save.append(s), load.append(l), wr.append(w), rd.append(r)
    med = statistics.median
    print(f"size {args.size}, {args.nproc} ranks, target {args.target}, median of {args.repeat}")
    print(f"write: DCP save {med(save):.3f} GB/s, raw {med(wr):.3f} GB/s, ratio {med(save) / med(wr):.2f}")
    print(f"read:  DCP load {med(load):.3f} GB/s, raw {med(rd):.3f} GB/s, ratio {med(load) / med(rd):.2f}")


if __name__ == "__main__":
    main()

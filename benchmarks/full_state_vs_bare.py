"""`checkpoint --state-dict full` vs a bare loop doing the same save: get_model_state_dict
(full_state_dict, cpu_offload) of the same sharded state, torch.save on rank 0 and fsync.

The bare loop builds the probe's state (checkpoint.layout: the same tensors, rows and DTensor
sharding over the same ranks), wraps it in a module and times, per iteration, from a barrier to
the barrier after rank 0's fsync; the file is removed between iterations (untimed), as the probe
removes its previous step. The two alternate, --repeat times each; printed: the medians of each
run's median save time and the ratio bare / probe (1.0: the probe adds nothing; the target is
>= 0.95).

    python benchmarks/full_state_vs_bare.py --size 1G --nproc 2 --target /tmp/fullbench --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def _bare_rank(rank: int, nproc: int, size: int, iters: int, directory: str, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(nproc))
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from microbench.probes.checkpoint.config import ROW_ELEMS, layout

    dist.init_process_group("gloo", rank=rank, world_size=nproc)
    mesh = init_device_mesh("cpu", (nproc,))
    module = torch.nn.Module()
    for i, rows in enumerate(layout(size, nproc, 4)):
        local = torch.full((rows, ROW_ELEMS), float(i + rank))
        value = DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=torch.Size((rows * nproc, ROW_ELEMS)),
                                   stride=(ROW_ELEMS, 1))
        module.register_parameter(f"t{i:05d}", torch.nn.Parameter(value, requires_grad=False))
    times = []
    path = os.path.join(directory, "state.pt")
    for _ in range(iters + 1):     # the first warms up, as the probe's --warmup 1
        dist.barrier()
        start = time.perf_counter()
        full = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if rank == 0:
            torch.save({"tensors": full, "objects": {"t00000": 1000}}, path)
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        del full
        dist.barrier()
        times.append(time.perf_counter() - start)
        if rank == 0:
            os.unlink(path)
    dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as handle:
            json.dump(times[1:], handle)


def bare(size: int, nproc: int, iters: int, target: str) -> float:
    import multiprocessing as mp
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    directory = tempfile.mkdtemp(dir=target, prefix="bare-")
    out = os.path.join(directory, "times.json")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_bare_rank, args=(r, nproc, size, iters, directory, port, out)) for r in range(nproc)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    with open(out) as handle:
        times = json.load(handle)
    shutil.rmtree(directory)
    return statistics.median(times)


def probe(size: str, nproc: int, iters: int, target: str) -> float:
    out = os.path.join(tempfile.mkdtemp(), "r.json")
    subprocess.run([sys.executable, "-m", "microbench", "checkpoint", "--size", size, "--nproc", str(nproc),
                    "--state-dict", "full", "--target", target, "--warmup", "1", "--iters", str(iters),
                    "--no-check", "--json", out], check=True, stdout=subprocess.DEVNULL)
    with open(out) as handle:
        record = json.load(handle)
    (save,) = [r for r in record["rows"] if r["op"] == "save"]
    return save["time_us"]["p50"] / 1e6


def main() -> None:
    from microbench.core.units import parse_size

    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1G")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--target", default="/tmp/fullbench")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    os.makedirs(args.target, exist_ok=True)
    size = parse_size(args.size)
    probes, bares = [], []
    for i in range(args.repeat):
        probes.append(probe(args.size, args.nproc, args.iters, args.target))
        bares.append(bare(size, args.nproc, args.iters, args.target))
        print(f"run {i + 1}: probe {probes[-1]:.3f} s, bare {bares[-1]:.3f} s, bare/probe {bares[-1] / probes[-1]:.3f}",
              flush=True)
    p, b = statistics.median(probes), statistics.median(bares)
    print(f"full save of {args.size} over {args.nproc} ranks to {args.target}: probe p50 {p:.3f} s, bare loop "
          f"{b:.3f} s; bare/probe {b / p:.3f} (target >= 0.95)")


if __name__ == "__main__":
    main()

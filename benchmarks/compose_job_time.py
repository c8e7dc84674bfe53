"""`microbench compose` with a job and its what-if over 3 networks x 4 tiers (issue 23's target:
under 1 s), timed as a user runs it: the whole command in a fresh process, interleaved with the
same command without the job (--steps), so the job's own cost is the difference. Prints the
medians, the ratio, the load average, and whether the target holds.

    python benchmarks/compose_job_time.py --repeat 7
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

BASE = ["--model", "gemma-3-12b", "--nodes", "2", "--gpus-per-node", "8", "--gpu", "h100", "--micro-batch", "1",
        "--seq-len", "8192", "--grad-accum", "8", "--net", "eth=1.6GB/s", "--net", "roce=12GB/s", "--net", "ib=40GB/s",
        "--tier", "nvme=10:10,ephemeral", "--tier", "shared=1.6:6.4", "--tier", "mount=0.1:0.3",
        "--tier", "cached=0.3:0.3,cached"]
JOB = ["--steps", "80", "--ckpt-every", "5"]
TARGET_S = 1.0


def once(args: list[str], out_dir: str, n: int) -> tuple[float, float]:
    """(wall s, CPU s of the child): the CPU time holds still on a loaded machine, the wall does not."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "microbench", "compose", *args, "--json", os.path.join(out_dir, f"{n}.json")],
                   check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=7)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as out:
        once(BASE + JOB, out, -1)          # warm the file cache and the bytecode
        plain, job = [], []
        for i in range(a.repeat):
            plain.append(once(BASE, out, 2 * i))
            job.append(once(BASE + JOB, out, 2 * i + 1))
    load = os.getloadavg()
    pm, jm = statistics.median(w for w, _ in plain), statistics.median(w for w, _ in job)
    pc, jc = statistics.median(c for _, c in plain), statistics.median(c for _, c in job)
    print(f"compose, 3 networks x 4 tiers (whole command, fresh process, median of {a.repeat} interleaved runs)")
    print(f"  without a job:               {pm:.3f} s wall (min {min(w for w, _ in plain):.3f}), {pc:.3f} s CPU")
    print(f"  with --steps 80 and what-if: {jm:.3f} s wall (min {min(w for w, _ in job):.3f}), {jc:.3f} s CPU; "
          f"192 configurations")
    print(f"  ratio job/plain {jm / pm:.2f}x wall, {jc / pc:.2f}x CPU; the job's own cost {jm - pm:.3f} s wall, "
          f"{jc - pc:.3f} s CPU")
    print(f"  load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; cpus {os.cpu_count()}")
    print(f"  target: under {TARGET_S:g} s: {'met' if jm < TARGET_S else 'MISSED'}")


if __name__ == "__main__":
    main()

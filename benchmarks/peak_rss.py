"""Peak memory of a command and every process it starts (ranks included), sampled from /proc.

    python3 benchmarks/peak_rss.py -- microbench nccl --sizes 4G --ops all_reduce --iters 1 --warmup 0

Every 50 ms it sums the resident set (VmRSS) of the command and all its descendants and keeps
the largest sum; it prints that peak, the command's exit status and its wall time. RSS counts
the shared torch libraries once per rank (a few hundred MiB each), so the figure is an upper
bound of what the ranks need, which is what a "does it fit" claim wants. No psutil: /proc only.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree_rss(root: int) -> int:
    kids, total, todo = _children(), 0, [root]
    while todo:
        pid = todo.pop()
        total += _rss_bytes(pid)
        todo += kids.get(pid, [])
    return total


def main(argv: list[str]) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print(__doc__)
        return 2
    start = time.monotonic()
    proc = subprocess.Popen(argv)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(0.05)
    print(f"# peak_rss: {peak / 2**30:.2f} GiB summed over the command and its descendants; "
          f"exit {proc.returncode}; {time.monotonic() - start:.1f} s; {' '.join(argv)}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

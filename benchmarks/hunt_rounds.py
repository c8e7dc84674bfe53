"""How long `microbench hunt` takes on 3, 4 and 8 lab hosts, and whether rounds really run in
parallel.

Target (issue 11): rounds run their pairs at once, so a round of 8 hosts (4 pairs) takes at
most 2x a round of one pair. A 3-host lab has exactly one pair per round (plus a bye), so its
round time is the one-pair reference. Every lab is uniform at --link (default 1gbit).

Run as root from a checkout: python benchmarks/hunt_rounds.py [--link 1gbit] [--size 8M]
Builds labs named h<random>, removes them afterwards; prints per-round and total seconds and
the ratio; exits 1 if the target is missed (a loaded machine slows the wide rounds first:
quote the load average with the numbers).
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
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from microbench.lab import namespaces as labmod  # noqa: E402
from microbench.core.units import parse_link_rate  # noqa: E402


def hunt_once(hosts: int, link: str, size: str, workdir: str) -> dict:
    name = "h" + uuid.uuid4().hex[:6]
    labmod.up(name, hosts, parse_link_rate(link))
    try:
        record = Path(workdir) / f"hunt-{hosts}.json"
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "microbench", "hunt", "--lab", name, "--size", size,
                               "--json", str(record)], env=env, capture_output=True, text=True)
        wall = time.monotonic() - start
        if proc.returncode not in (0, 1) or not record.exists():
            raise SystemExit(f"hunt on {hosts} hosts failed: {proc.stderr.strip()}")
        summary = json.loads(record.read_text())["summary"]
        summary["wall_s"] = wall
        return summary
    finally:
        labmod.down(name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--link", default="1gbit")
    parser.add_argument("--size", default="8M")
    args = parser.parse_args()
    print(f"# load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    results = {}
    with tempfile.TemporaryDirectory() as workdir:
        for hosts in (3, 4, 8):
            s = hunt_once(hosts, args.link, args.size, workdir)
            results[hosts] = s
            print(f"{hosts} hosts at {args.link}: {s['rounds']} rounds, median round {statistics.median(s['round_s']):.2f} s, "
                  f"rounds total {s['total_s']:.1f} s, command wall time {s['wall_s']:.1f} s "
                  f"(slow hosts {s['slow_hosts'] or 'none'}, slow links {s['slow_links'] or 'none'})")
    ratio = statistics.median(results[8]["round_s"]) / statistics.median(results[3]["round_s"])
    ok = ratio <= 2.0
    print(f"8-host round / one-pair round: {ratio:.2f}x (target <= 2) {'ok' if ok else 'MISSED'}")
    print(f"# load average after: {os.getloadavg()[0]:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

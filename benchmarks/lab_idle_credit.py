"""What a lab link hands out after idling: one transfer timed back to back against the same
transfer after the link idled, under the lab's shaping and under tbf without a peak rate.

A training step idles its links while it computes; a collective probe times its collectives
back to back. On a real NIC the two see the same link. tbf's bucket (burst = 10 ms of the rate)
is credit that refills while the link idles and then leaves at the veth's own speed, so without
a peak rate a collective after compute ran up to twice as fast as the probe had timed it, and
`verify fsdp` over-predicted the 1gbit steps (docs/verify.md). Targets, for the lab's shaping:
the transfer after idle takes >= 0.8x the back-to-back time (credit at most a fifth of it), and
back to back the link carries >= 0.9x its line rate (the link probe's target, link_vs_iperf3.py).

Run as root from a checkout: python benchmarks/lab_idle_credit.py [--size 2M] [--idle-ms 20]
[--reps 15] [--rounds 3]. Builds a 2-host lab and removes it. Prints the medians and ratios per
shaping; exits 1 if a target is missed (noisy on a loaded machine: the load average is printed).
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))

from microbench.core.units import parse_link_rate, parse_size  # noqa: E402
from microbench.lab import namespaces as labmod  # noqa: E402
from microbench.lab import shaping as labshape  # noqa: E402

RECEIVER = r"""
import socket, sys
size = int(sys.argv[1])
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", int(sys.argv[2]))); srv.listen(1)
print("ready", flush=True)
conn, _ = srv.accept(); conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
buf = bytearray(1 << 20)
while True:
    left = size
    while left:
        n = conn.recv_into(buf, min(left, len(buf)))
        if not n:
            sys.exit(0)
        left -= n
    conn.sendall(b"k")
"""

# argv: address port size idle_s reps; prints one time in seconds per line (warm-up excluded).
SENDER = r"""
import socket, sys, time
addr, port, size, idle_s, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
sock = socket.create_connection((addr, port)); sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
data = bytes(size)
for i in range(3 + reps):
    if idle_s:
        time.sleep(idle_s)
    start = time.perf_counter()
    sock.sendall(data)
    sock.recv(1)
    if i >= 3:
        print(time.perf_counter() - start, flush=True)
"""


def burst_only(name: str, hosts: int, rate_bps: int) -> None:
    """tbf as the lab shaped it before the peak rate: the same burst and queue, no peak."""
    for i in range(hosts):
        cmd = labshape.shape_commands(labmod.netns_name(name, i), rate_bps, 0.0)[-1]
        cmd = cmd[:cmd.index("peakrate")]
        cmd[cmd.index("add")] = "replace"
        subprocess.run(cmd, check=True, capture_output=True)


def transfers(lab: labmod.Lab, size: int, idle_s: float, reps: int) -> list[float]:
    port = str(20000 + random.randrange(20000))
    recv, send = lab.hosts[1], lab.hosts[0]
    rx = subprocess.Popen(["ip", "netns", "exec", recv.netns, sys.executable, "-c", RECEIVER, str(size), port],
                          stdout=subprocess.PIPE, text=True)
    try:
        assert rx.stdout is not None and rx.stdout.readline().strip() == "ready"
        out = subprocess.run(["ip", "netns", "exec", send.netns, sys.executable, "-c", SENDER, recv.address, port,
                              str(size), str(idle_s), str(reps)], capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            raise SystemExit(f"sender failed: {out.stderr.strip()[-300:]}")
        return [float(x) for x in out.stdout.split()]
    finally:
        rx.kill()
        rx.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="2M", help="bytes per transfer (default 2M: about what a block's "
                        "AllGather puts on each host's link in verify's 2 x 2 lab)")
    parser.add_argument("--idle-ms", type=float, default=20.0, help="idle time before each transfer (default 20)")
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of both shapings")
    args = parser.parse_args()
    labmod.require()
    size, rate = parse_size(args.size), parse_link_rate(args.rate)
    name = "ic" + uuid.uuid4().hex[:6]
    print("load average before:", " ".join(open("/proc/loadavg").read().split()[:3]))
    results: dict[str, dict[str, list[float]]] = {"lab shaping (peak rate)": {}, "tbf without a peak rate": {}}
    try:
        lab, _ = labmod.up(name, 2, rate)
        for _ in range(args.rounds):
            for label in results:
                if label.startswith("lab"):
                    labmod.shape(name, rate)
                else:
                    burst_only(name, 2, rate)
                for mode, idle in (("back to back", 0.0), ("after idle", args.idle_ms / 1e3)):
                    results[label].setdefault(mode, []).extend(transfers(lab, size, idle, args.reps))
    finally:
        labmod.down(name)
    ok = True
    line_s = size * 8 / rate
    for label, modes in results.items():
        b2b, idle = statistics.median(modes["back to back"]), statistics.median(modes["after idle"])
        ratio, rate_ratio = idle / b2b, line_s / b2b
        print(f"{label}: {size} B back to back {b2b * 1e3:.2f} ms ({rate_ratio:.3f}x line rate), after "
              f"{args.idle_ms:g} ms idle {idle * 1e3:.2f} ms: after idle / back to back {ratio:.3f}")
        if label.startswith("lab"):
            for what, value, target in (("after idle / back to back", ratio, 0.8), ("line rate", rate_ratio, 0.9)):
                ok &= value >= target
                print(f"  {what}: {value:.3f} (target >= {target}) {'ok' if value >= target else 'MISSED'}")
    print("load average after:", " ".join(open("/proc/loadavg").read().split()[:3]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

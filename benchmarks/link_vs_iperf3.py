"""Link probe vs iperf3 on the same lab link, and gloo collectives vs the line rate.

Targets (issue 3): on a 1gbit lab link the link probe reaches >= 0.9x the line rate and
>= 0.95x iperf3 in the same run; unshaped, >= 0.95x iperf3; gloo ReduceScatter and AllGather
busbw at sizes >= 16 MiB on a 2-host 1gbit lab >= 0.8x the line rate.

Run as root from a checkout: python benchmarks/link_vs_iperf3.py [--size 64M] [--seconds 5]
Prints each measurement and ratio; exits 1 if a target is missed (numbers are noisy on a
loaded machine: say so when quoting them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Last, not first: the installed microbench (with its compiled core) wins; the checkout is the
# fallback for a machine where it is not installed.
sys.path.append(str(ROOT))

from microbench.lab import namespaces as labmod  # noqa: E402
from microbench.core.units import parse_link_rate  # noqa: E402
from microbench.world.launch import package_env, self_command  # noqa: E402

LINE_GBIT = 1.0


def cli(*args: str, cwd: str) -> None:
    proc = subprocess.run([*self_command(), *args], cwd=cwd, env=package_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"microbench {' '.join(args)} failed: {proc.stderr.strip()}")


def iperf3_gbit(lab: labmod.Lab, seconds: float) -> float:
    server, client = lab.hosts[1], lab.hosts[0]
    port = "5201"
    srv = subprocess.Popen(["ip", "netns", "exec", server.netns, "iperf3", "-s", "-1", "-p", port],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):
            out = subprocess.run(["ip", "netns", "exec", client.netns, "iperf3", "-c", server.address, "-p", port,
                                  "-t", str(seconds), "-J"], capture_output=True, text=True)
            try:
                data = json.loads(out.stdout)
            except ValueError:
                data = {}
            if out.returncode == 0 and "sum_received" in data.get("end", {}):
                return data["end"]["sum_received"]["bits_per_second"] / 1e9
            import time

            time.sleep(0.2)
        raise SystemExit(f"iperf3 failed: {out.stdout[-300:]} {out.stderr[-300:]}")
    finally:
        srv.kill()
        srv.wait()


def link_gbit(lab: labmod.Lab, size: str, work: str) -> tuple[float, str]:
    path = os.path.join(work, f"link-{uuid.uuid4().hex[:6]}.json")
    cli("link", "--lab", lab.name, "--ops", "uni", "--sizes", size, "--warmup", "2", "--iters", "10",
        "--budget", "10", "--json", path, cwd=work)
    record = json.loads(Path(path).read_text())
    return record["summary"]["link_gbps"] * 8, record["implementation"]["name"]


def best_of(lab: labmod.Lab, size: str, seconds: float, work: str, rounds: int) -> tuple[float, float, str]:
    """Alternate iperf3 and the link probe and keep each one's best round: on a shared machine
    a neighbour's burst of CPU work otherwise decides which tool "wins"."""
    ip_best = lp_best = 0.0
    impl = "?"
    for _ in range(rounds):
        ip_best = max(ip_best, iperf3_gbit(lab, seconds))
        lp, impl = link_gbit(lab, size, work)
        lp_best = max(lp_best, lp)
    return ip_best, lp_best, impl


def collective_busbw(lab: labmod.Lab, sizes: str, work: str, algo: str) -> list[dict]:
    path = os.path.join(work, f"nccl-{algo}.json")
    cli("nccl", "--lab", lab.name, "--ops", "reduce_scatter,all_gather", "--sizes", sizes, "--warmup", "2",
        "--iters", "8", "--budget", "5", "--algo", algo, "--json", path, cwd=work)
    return json.loads(Path(path).read_text())["rows"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="64M", help="link probe message size (default 64M)")
    parser.add_argument("--seconds", default="5", help="iperf3 duration (default 5)")
    parser.add_argument("--coll-sizes", default="16M-64M", help="collective sizes (default 16M-64M)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds for the unshaped comparison")
    args = parser.parse_args()
    if shutil.which("iperf3") is None:
        raise SystemExit("iperf3 is not installed (apt-get install iperf3)")
    labmod.require()
    name = "b" + uuid.uuid4().hex[:6]
    ok = True
    with tempfile.TemporaryDirectory(prefix="mb-bench-") as work:
        try:
            lab, _ = labmod.up(name, 2, parse_link_rate("1gbit"))
            ip, lp, impl = best_of(lab, args.size, float(args.seconds), work, 1)
            print(f"1gbit lab link: iperf3 {ip:.3f} Gbit/s, link probe ({impl}) {lp:.3f} Gbit/s")
            for label, ratio, target in (("link/line rate", lp / LINE_GBIT, 0.9), ("link/iperf3", lp / ip, 0.95)):
                ok &= ratio >= target
                print(f"  {label}: {ratio:.3f}x (target >= {target}) {'ok' if ratio >= target else 'MISSED'}")

            line_gbps = LINE_GBIT / 8
            # The target is the fabric's: microbench's rings (--algo ring). torch's own gloo
            # collectives run the same sweep beside them, as information: their send-before-
            # receive exchange is half duplex on this link (see microbench/probes/nccl/ring.py).
            for algo in ("ring", "torch"):
                for row in collective_busbw(lab, args.coll_sizes, work, algo):
                    if row["size_bytes"] >= 16 << 20 and row.get("placement") == "out":
                        ratio = row["busbw_gbps"] / line_gbps
                        verdict = ("ok" if ratio >= 0.8 else "MISSED") if algo == "ring" else "info"
                        if algo == "ring":
                            ok &= ratio >= 0.8
                        print(f"  gloo --algo {algo} {row['op']} {row['size_bytes'] >> 20}M busbw {row['busbw_gbps']:.4f} "
                              f"GB/s = {ratio:.3f}x line rate (target >= 0.8 for ring) {verdict}")

            labmod.shape(name, None)
            ip, lp, impl = best_of(lab, "256M", float(args.seconds), work, args.rounds)
            ratio = lp / ip
            ok &= ratio >= 0.95
            print(f"unshaped lab link (best of {args.rounds}): iperf3 {ip:.3f} Gbit/s, link probe ({impl}) {lp:.3f} Gbit/s")
            print(f"  link/iperf3: {ratio:.3f}x (target >= 0.95) {'ok' if ratio >= 0.95 else 'MISSED'}")
        finally:
            labmod.down(name)
    print("load average:", open("/proc/loadavg").read().split()[:3])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

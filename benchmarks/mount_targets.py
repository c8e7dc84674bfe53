"""The bucket-mount targets of issue 22, on the embedded S3 server, in one run:

  1. cached mount: blocked write (write+fsync+close) within 1.25x of the same write to the
     cache's local disk (the filesystem of --cache-dir);
  2. direct mount: write bandwidth >= 0.8x the S3 probe's PUT bandwidth to the same server
     (`microbench storage s3 --endpoint ... --ops put --object-size SIZE`, a single stream
     like the mount's file);
  3. durable time within 15% of bytes / (that PUT bandwidth) + the write-back delay. The delay
     starts at close (rclone's --vfs-write-back), so the durable time compared is from the
     close, i.e. the probe's durable time (from the write's start) less the blocked time; the
     line also prints the whole durable time against blocked + delay + bytes / PUT.

    python benchmarks/mount_targets.py [--size 256M] [--rounds 3] [--write-back 1]

Rounds interleave the cases (mount write, local write, direct write, S3 probe); medians are
compared and printed as ratios. Needs root or FUSE access; mounts under a temporary state dir,
removed afterwards.
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
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent.parent))

from microbench.core.units import parse_size  # noqa: E402
from microbench.targets import mount as mountmod  # noqa: E402
from microbench.targets.mount import facts as mount_facts, system as mount_sys  # noqa: E402
from microbench.world.launch import package_env, self_command  # noqa: E402


def write_file(path: str, size: int, bs: int = 16 << 20) -> float:
    block = os.urandom(bs)
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        left = size
        while left > 0:
            left -= os.write(fd, block[:min(left, bs)])
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - start


def s3_put_gbps(state: mountmod.MountState, size: int, tmp: str) -> float:
    out = os.path.join(tmp, f"s3-{time.monotonic_ns()}.json")
    env = {**os.environ, **package_env(), "AWS_ACCESS_KEY_ID": state.key or "", "AWS_SECRET_ACCESS_KEY": state.secret or "",
           "AWS_DEFAULT_REGION": "us-east-1"}
    subprocess.run([*self_command(), "storage", "s3", "--endpoint", state.endpoint, "--bucket", state.bucket,
                    "--ops", "put", "--object-size", str(size), "--part-size", "16M", "--concurrency", "4",
                    "--warmup", "0", "--iters", "1", "--json", out], env=env, check=True, capture_output=True)
    row = json.loads(Path(out).read_text())["rows"][0]
    return float(row["throughput_gbps"])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="256M")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--write-back", type=float, default=1.0)
    args = ap.parse_args()
    size = parse_size(args.size)
    reason = mount_sys.fuse_unavailable_reason()
    if reason:
        print(f"skipped: {reason}")
        return 0
    tmp = tempfile.mkdtemp(prefix="mb-mount-bench-")
    os.environ[mount_sys.STATE_ENV] = os.path.join(tmp, "state")
    cache_parent = os.path.join(tmp, "cache")
    local = os.path.join(tmp, "local")
    os.makedirs(cache_parent)
    os.makedirs(local)
    cached, _ = mountmod.up(mountmod.MountRequest("bc", "cached", cache_dir=cache_parent, write_back_s=args.write_back))
    direct, _ = mountmod.up(mountmod.MountRequest("bd", "direct"))
    mount_facts.store_client(cached.path)
    mount_facts.store_client(direct.path)
    res: dict[str, list[float]] = {"cached_blocked": [], "local": [], "durable": [], "direct": [], "put_gbps": []}
    try:
        for i in range(args.rounds):
            d = os.path.join(cached.path, f"r{i}")
            os.mkdir(d)
            start = time.perf_counter()
            res["cached_blocked"].append(write_file(os.path.join(d, "f"), size))
            res["durable"].append(mount_facts.wait_durable(d, started_at=start, timeout_s=600).seconds)
            lf = os.path.join(local, f"f{i}")
            res["local"].append(write_file(lf, size))
            os.unlink(lf)
            dd = os.path.join(direct.path, f"r{i}")
            os.mkdir(dd)
            res["direct"].append(write_file(os.path.join(dd, "f"), size))
            res["put_gbps"].append(s3_put_gbps(direct, size, tmp))
    finally:
        mountmod.down("bc")
        mountmod.down("bd")
        subprocess.run(["rm", "-rf", tmp])
    med = {k: statistics.median(v) for k, v in res.items()}
    put = med["put_gbps"]
    direct_gbps = size / med["direct"] / 1e9
    predicted = size / (put * 1e9) + args.write_back
    after_close = statistics.median(d - b for d, b in zip(res["durable"], res["cached_blocked"]))
    print(f"# {args.size} per write, {args.rounds} interleaved rounds, medians; embedded S3 server, rclone "
          f"{cached.rclone_version}")
    for k, v in res.items():
        print(f"{k:15s} " + " ".join(f"{x:.3f}" for x in v))
    print(f"1. cached blocked {med['cached_blocked']:.3f} s vs local disk {med['local']:.3f} s: "
          f"{med['cached_blocked'] / med['local']:.2f}x (target <= 1.25x)")
    print(f"2. direct mount {direct_gbps:.3f} GB/s vs S3 probe PUT {put:.3f} GB/s: {direct_gbps / put:.2f}x "
          f"(target >= 0.8x)")
    print(f"3. durable after close {after_close:.3f} s vs bytes/PUT + write-back {predicted:.3f} s: "
          f"{after_close / predicted:.2f}x (target within 15%); from the write's start {med['durable']:.3f} s vs "
          f"blocked + write-back + bytes/PUT {med['cached_blocked'] + predicted:.3f} s: "
          f"{med['durable'] / (med['cached_blocked'] + predicted):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

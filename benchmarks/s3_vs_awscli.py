"""S3 probe vs `aws s3 cp` against the same embedded server in the same run, and the probe's
peak memory against its bound (concurrency x part size + 200 MB).

    python benchmarks/s3_vs_awscli.py [--size 256M] [--part-size 16M] [--concurrency 8] [--rounds 3]

awscli is not a microbench extra: it pins botocore exactly, which fights s3fs's own botocore range
in one environment. Install it apart (`pipx install awscli`, so `aws` is on PATH) or into this
environment by hand (`pip install awscli`, run as `python -m awscli`).

Both clients use the same part size and concurrency (awscli through a temporary config file:
multipart_chunksize, max_concurrent_requests). Rounds alternate probe and awscli; medians are
compared. awscli is timed around the whole `aws s3 cp` process, so its interpreter start-up is
measured separately (`aws s3api head-bucket`, median) and reported both in and out; the
probe's numbers are its own timed iterations (each one whole PUT or GET of the object). The
probe runs as a child CLI process with --endpoint; its peak RSS comes from its own record
(getrusage of that process), the embedded server's memory is not counted on either side.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Last, not first: the installed microbench (with its compiled core) wins; the checkout is the
# fallback for a machine where it is not installed.
sys.path.append(str(ROOT))

from microbench.world.launch import package_env, self_command  # noqa: E402
from microbench.targets.s3server import EmbeddedS3  # noqa: E402
from microbench.core.units import parse_size  # noqa: E402


def awscli_env(server: EmbeddedS3, config_file: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(server.env())
    env["AWS_CONFIG_FILE"] = str(config_file)
    env["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    return env


def timed(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}: {proc.stderr.strip()[-500:]}")
    return elapsed


def run_probe(server: EmbeddedS3, env: dict[str, str], args: argparse.Namespace, out: Path) -> dict:
    cmd = [*self_command(), "storage", "s3", "--endpoint", server.endpoint_url,
           "--bucket", server.bucket, "--object-size", args.size, "--part-size", args.part_size,
           "--concurrency", str(args.concurrency), "--warmup", "1", "--iters", "3", "--budget", "0",
           "--json", str(out)]
    penv = package_env(env)
    proc = subprocess.run(cmd, env=penv, capture_output=True, text=True, cwd=out.parent)
    if proc.returncode != 0:
        sys.exit(f"probe failed: {proc.stderr.strip()}")
    return json.loads(out.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="256M")
    ap.add_argument("--part-size", default="16M")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    size, part = parse_size(args.size), parse_size(args.part_size)
    aws = [shutil.which("aws")] if shutil.which("aws") else [sys.executable, "-m", "awscli"]

    with tempfile.TemporaryDirectory(prefix="mb-s3bench-") as tmp, EmbeddedS3(bucket="bench") as server:
        work = Path(tmp)
        src = work / "src.bin"
        with open(src, "wb") as handle:
            for _ in range(0, size, 16 << 20):
                handle.write(os.urandom(min(16 << 20, size - handle.tell())))
        config = work / "aws-config"
        config.write_text(f"[default]\nregion = us-east-1\ns3 =\n  multipart_chunksize = {part}\n"
                          f"  multipart_threshold = {part}\n  max_concurrent_requests = {args.concurrency}\n")
        env = awscli_env(server, config)
        url = f"s3://{server.bucket}/awscli/obj.bin"
        ep = ["--endpoint-url", server.endpoint_url]

        startup, aws_put, aws_get, probe_put, probe_get, rss = [], [], [], [], [], []
        for rnd in range(args.rounds):
            record = run_probe(server, env, args, work / f"probe-{rnd}.json")
            rows = {r["op"]: r for r in record["rows"]}
            probe_put.append(rows["put"]["time_us"]["p50"] / 1e6)
            probe_get.append(rows["get"]["time_us"]["p50"] / 1e6)
            rss.append(record["summary"])
            startup.append(timed(aws + ["s3api", "head-bucket", "--bucket", server.bucket] + ep, env))
            aws_put.append(timed(aws + ["s3", "cp", "--only-show-errors", str(src), url] + ep, env))
            dst = work / "dst.bin"
            aws_get.append(timed(aws + ["s3", "cp", "--only-show-errors", url, str(dst)] + ep, env))
            dst.unlink()
            timed(aws + ["s3", "rm", "--only-show-errors", url] + ep, env)
            print(f"round {rnd + 1}: probe put {probe_put[-1]:.2f}s get {probe_get[-1]:.2f}s | aws put "
                  f"{aws_put[-1]:.2f}s get {aws_get[-1]:.2f}s (start-up {startup[-1]:.2f}s)", flush=True)

    med = statistics.median
    st = med(startup)
    gb = size / 1e9
    print(f"\n{args.size} object, part {args.part_size}, concurrency {args.concurrency}, {args.rounds} rounds, "
          f"medians; embedded rclone serve s3 {server.version}")
    for op, mine, theirs in (("PUT", med(probe_put), med(aws_put)), ("GET", med(probe_get), med(aws_get))):
        net = max(theirs - st, 1e-9)
        print(f"{op}: probe {gb / mine:.3f} GB/s | aws s3 cp {gb / theirs:.3f} GB/s whole process, "
              f"{gb / net:.3f} GB/s without start-up | ratio {theirs / mine:.2f}x whole, "
              f"{net / mine:.2f}x without start-up")
    peak = max(s["peak_rss_bytes"] for s in rss)
    before = max(s["peak_rss_before_first_request_bytes"] for s in rss)
    bound = rss[0]["memory_bound_bytes"]
    print(f"peak RSS of the probe process {peak / 2**20:.0f} MiB = {peak / bound:.2f}x the bound "
          f"{bound / 2**20:.0f} MiB (concurrency x part size + 200 MiB); {(peak - before) / 2**20:.0f} MiB of it "
          f"grew after the first request ({before / 2**20:.0f} MiB before: the interpreter and boto3; "
          f"torch facts for the record come from a child process)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

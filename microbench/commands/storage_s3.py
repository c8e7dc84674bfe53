"""`microbench storage s3`: multipart PUT and ranged GET throughput, request latency and time to
first byte against an S3 endpoint, or against an embedded `rclone serve s3` when none is given."""

from __future__ import annotations

import argparse
import contextlib
import sys

from tabulate import tabulate

from ..core.errors import UsageError
from ..probes.storage import s3 as s3p
from ..run import provision as needs
from ..targets.s3client import Target, check_endpoint, preflight, unique_prefix
from ..targets.s3server import DEFAULT_BUCKET
from ..core.units import format_bytes_human, format_size, parse_list, parse_positive_int, parse_size
from ..run.runner import run_probe
from ..expect import overrides as expectations
from .common import add_sweep_options, parse_timeout, settings_from_args, write_outputs


DESCRIPTION = ("PUT objects as concurrent multipart uploads and GET them back as concurrent ranged reads. "
               "Without --endpoint an embedded S3 server (rclone serve s3) runs over a temporary directory for "
               "the run. Credentials come from the standard AWS environment or profile.")


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--endpoint", metavar="URL", help="S3 endpoint, e.g. http://10.0.0.5:9000 (default: embedded server)")
    p.add_argument("--bucket", help=f"existing bucket (default {DEFAULT_BUCKET!r} on the embedded server; "
                   "required with --endpoint)")
    p.add_argument("--object-size", default="64M", help="bytes per object (default 64M)")
    p.add_argument("--part-size", default="16M", help="multipart part size, also the GET range size (default 16M)")
    p.add_argument("--concurrency", default="8", help="requests in flight at once (default 8)")
    p.add_argument("--ops", default="put,get", help="put, get or both (default put,get)")
    p.add_argument("--objects", default="1", help="objects per iteration (default 1)")
    p.add_argument("--keep", action="store_true", help="keep the objects written (under a unique prefix)")
    p.add_argument("--timeout", default="10", help="seconds to connect before the endpoint counts as unreachable (default 10)")
    p.add_argument("--region", default=None, help="region for signing (default: AWS config, else us-east-1)")
    p.add_argument("--addressing-style", choices=("path", "virtual", "auto"), default="path",
                   help="bucket in the path (default, what most non-AWS servers need) or in the host name")
    expectations.add_option(p, "throughput")
    add_sweep_options(p, warmup=1, iters=5, budget_s=4.0)


def resolve(args: argparse.Namespace) -> tuple[s3p.Config, str | None]:
    """Validate every flag before any server starts or any request goes out."""
    endpoint = check_endpoint(args.endpoint) if args.endpoint else None
    if endpoint and not args.bucket:
        raise UsageError("--endpoint needs --bucket: an existing bucket to write test objects into, "
                         "e.g. --bucket my-bucket")
    bucket = args.bucket or DEFAULT_BUCKET
    if not bucket.strip() or "/" in bucket:
        raise UsageError(f"invalid --bucket {bucket!r}: expected a bucket name without '/', e.g. --bucket my-bucket")
    config = s3p.Config(
        object_size=parse_size(args.object_size, what="--object-size"),
        part_size=parse_size(args.part_size, what="--part-size"),
        concurrency=parse_positive_int(args.concurrency, what="--concurrency", example="8"),
        ops=parse_list(args.ops, s3p.OPS, what="--ops"),
        objects=parse_positive_int(args.objects, what="--objects", example="4"),
        bucket=bucket, prefix=unique_prefix(), keep=args.keep, timeout_s=parse_timeout(args.timeout))
    s3p.validate(config)
    return config, endpoint


def run(args: argparse.Namespace) -> int:
    config, endpoint = resolve(args)
    given = expectations.override(args.expected)
    settings = settings_from_args(args)
    needs.check_s3_client()
    with contextlib.ExitStack() as stack:
        if endpoint is None:
            # A multipart upload briefly keeps a temporary copy of the object beside the others.
            server = needs.embedded_s3(stack, config.bucket, (config.objects + 1) * config.object_size,
                                       "smaller --object-size/--objects")
            target = Target.for_embedded(server)
        else:
            target = Target(endpoint, region=args.region, addressing_style=args.addressing_style)
        source = preflight(target, config.bucket, timeout_s=config.timeout_s)
        probe = s3p.StorageS3Probe(config, target, cred_source=source)
        expect = expectations.for_s3(target.endpoint_url, endpoint is None, given)
        try:
            outcome = run_probe(probe, settings, config=config, json_path=args.json, results_dir=args.results_dir,
                                extra_summary=expect)
        except BaseException:
            with contextlib.suppress(Exception):
                probe.close()  # the run's own error is the one worth reporting
            raise
        deleted = probe.close()
        print_report(outcome.record, config)
        where = (f"kept under s3://{config.bucket}/{config.prefix}" if config.keep
                 else f"deleted {deleted} object(s) under the run's prefix")
        print(f"# {where}; results: {outcome.path}")
        write_outputs(args, outcome)
        wrong = sum(r["nwrong"] or 0 for r in outcome.rows)
        if wrong:
            print(f"microbench: {wrong} wrong object(s)/chunk(s) read back (see #wrong)", file=sys.stderr)
            return 1
    return 0


def print_report(record: dict, config: s3p.Config) -> None:
    impl = record["implementation"]
    if impl["target"] == "embedded":
        target = f"embedded {impl['server']} {impl.get('server_version') or ''} at {impl['endpoint']}"
    else:
        target = impl["endpoint"]
    print(f"# microbench storage s3: {target}, bucket {config.bucket}, credentials: "
          f"{impl['credentials_source']}; {impl['engine']} (botocore {impl['botocore']})")
    summary = record["summary"]
    expected = summary.get("expected")
    known = bool(expected and expected.get("gbps"))
    table = []
    for row in record["rows"]:
        pooled = summary.get(row["op"], {})
        table.append((row["op"], format_size(row["size_bytes"]), format_size(row["part_size_bytes"]),
                      row["concurrency"], row["objects"], row["iters"], f"{row['throughput_gbps']:.3f}",
                      f"{row['throughput_gbps'] * 1e9 / (1 << 20):.0f}",
                      _ms(pooled.get("request_ms_p50")), _ms(pooled.get("request_ms_p99")),
                      _ms(pooled.get("ttfb_ms_p50")), _ms(pooled.get("ttfb_ms_p99")),
                      "N/A" if row["nwrong"] is None else row["nwrong"])
                     + ((expectations.pct_cell(row["throughput_gbps"], expected),) if known else ()))
    print(tabulate(table, headers=["op", "object", "part", "conc", "objects", "iters", "GB/s", "MiB/s",
                                   "req p50 ms", "req p99 ms", "ttfb p50 ms", "ttfb p99 ms", "#wrong"]
                   + (["% of expected"] if known else []), tablefmt="simple", disable_numparse=True))
    if expected:
        print(f"# {expectations.describe(expected)}")
    if "peak_rss_bytes" in summary:
        grown = summary["peak_rss_bytes"] - summary.get("peak_rss_before_first_request_bytes", 0)
        print(f"# peak RSS {format_bytes_human(summary['peak_rss_bytes'])}, {format_bytes_human(grown)} above the "
              f"peak before the first request (bound: concurrency x part size + 200 MiB = "
              f"{format_bytes_human(summary['memory_bound_bytes'])})")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"

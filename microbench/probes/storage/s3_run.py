"""Running the S3 probe against an endpoint, or an embedded server for the run, and its table."""

from __future__ import annotations

import contextlib
from typing import Any

from ...core.units import format_bytes_human, format_size
from ...expect import overrides as expectations
from ...run import provision
from ...run.runner import RunOutcome, run_probe
from ...targets.s3client import Target, preflight


def run_s3(spec: Any, config: Any, inv: Any) -> RunOutcome:
    provision.check_s3_client()
    with contextlib.ExitStack() as stack:
        if config.endpoint is None:
            # A multipart upload briefly keeps a temporary copy of the object beside the others.
            server = provision.embedded_s3(stack, config.bucket, (config.objects + 1) * config.object_size,
                                           "smaller --object-size/--objects")
            target = Target.for_embedded(server)
        else:
            target = Target(config.endpoint, region=config.region, addressing_style=config.addressing_style)
        target.timeout_s = config.timeout_s
        source = preflight(target, config.bucket)
        probe = spec.build(config, provision.Context(s3=target, cred_source=source))
        expect = expectations.for_s3(target.endpoint_url, config.endpoint is None, config.expected)
        try:
            outcome = run_probe(probe, inv.settings, config=config, json_path=inv.json_path,
                                results_dir=inv.results_dir, extra_summary=expect)
        except BaseException:
            with contextlib.suppress(Exception):
                probe.close()  # the run's own error is the one worth reporting
            raise
        outcome.notes["deleted"] = probe.close()
    return outcome


def print_report(outcome: RunOutcome, config: Any) -> str | None:
    """The table; a failure line (wrong objects read back) for the command to raise, or None."""
    from ...core.tables import text_table

    record = outcome.record
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
        single = row.get("stream") == "single"
        pooled = summary.get("put_single_stream" if single else row["op"], {})
        table.append(
            (
                row["op"] + (" 1 stream" if single else ""),
                format_size(row["size_bytes"]),
                format_size(row["part_size_bytes"]),
                row["concurrency"],
                row["objects"],
                row["iters"],
                f"{row['throughput_gbps']:.3f}",
                f"{row['throughput_gbps'] * 1e9 / (1 << 20):.0f}",
                _ms(pooled.get("request_ms_p50")),
                _ms(pooled.get("request_ms_p99")),
                _ms(pooled.get("ttfb_ms_p50")),
                _ms(pooled.get("ttfb_ms_p99")),
                "N/A" if row["nwrong"] is None else row["nwrong"],
            )
            + ((expectations.pct_cell(row["throughput_gbps"], expected),) if known else ())
        )
    print(text_table(table, headers=["op", "object", "part", "conc", "objects", "iters", "GB/s", "MiB/s",
                                   "req p50 ms", "req p99 ms", "ttfb p50 ms", "ttfb p99 ms", "#wrong"]
                   + (["% of expected"] if known else []), tablefmt="simple"))
    if any(row.get("stream") == "single" for row in record["rows"]):
        print("# put 1 stream: one object, its parts uploaded one after another by one thread, then completed (how "
              "torch.save through s3fs writes a full state dict); `microbench compose` takes it as the single-stream "
              "bandwidth")
    if expected:
        print(f"# {expectations.describe(expected)}")
    if "peak_rss_bytes" in summary:
        grown = summary["peak_rss_bytes"] - summary.get("peak_rss_before_first_request_bytes", 0)
        print(f"# peak RSS {format_bytes_human(summary['peak_rss_bytes'])}, {format_bytes_human(grown)} above the "
              f"peak before the first request (bound: concurrency x part size + 200 MiB = "
              f"{format_bytes_human(summary['memory_bound_bytes'])})")
    where = (f"kept under s3://{config.bucket}/{config.prefix}" if config.keep
             else f"deleted {outcome.notes.get('deleted')} object(s) under the run's prefix")
    print(f"# {where}; results: {outcome.path}")
    wrong = sum(r["nwrong"] or 0 for r in outcome.rows)
    return f"{wrong} wrong object(s)/chunk(s) read back (see #wrong)" if wrong else None


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"

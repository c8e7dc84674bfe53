"""Running the link probe between two ranks (local, launched, or two lab hosts), and its tables."""

from __future__ import annotations

import os
import socket
from typing import Any

from ...core.units import format_size
from ...expect import overrides as expectations
from ...expect.formulas import describe as describe_expected
from ...run import provision
from ...run.runner import RunOutcome, run_probe
from ...world.backends import BackendChoice
from ...world.dist import World
from ...world.policy import in_world


def run(spec: Any, config: Any, inv: Any) -> RunOutcome | None:
    choice = BackendChoice("gloo", "cpu", "tcp", {}, "the link probe exchanges only metadata over gloo")
    placement = inv.placement
    outcomes: list[RunOutcome] = []

    def body(world: World) -> int:
        me = os.environ.get("MICROBENCH_LAB_HOST") or socket.gethostname()
        config.hosts = world.all_gather_object(me)
        probe = spec.build(config, provision.Context(world=world))
        probe.diagnose = inv.diagnose
        expect = world.broadcast_object(expectations.for_link(config.hosts, config.expected)
                                        if world.rank == 0 else None)
        probe.expected = expect["expected"]
        try:
            with inv.named(world):
                outcome = run_probe(probe, inv.settings, config=config, world=world, json_path=inv.json_path,
                                    results_dir=inv.results_dir, extra_summary=expect)
        finally:
            probe.close()
        if world.rank == 0:
            outcomes.append(outcome)
        return 0

    inv.exit_code = in_world(nproc=2, timeout_s=config.timeout_s, choice=choice, body=body, argv=inv.argv,
             per_rank=placement.per_rank if placement else None,
             master_addr=placement.master_addr if placement else "127.0.0.1")
    return outcomes[0] if outcomes else None


def print_report(outcome: RunOutcome, config: Any) -> None:
    from ...core.tables import text_table

    record = outcome.record
    impl = record["implementation"]
    hosts = impl.get("hosts") or []
    print(f"# microbench link: {' <-> '.join(hosts)}, {impl['streams']} stream(s), implementation {impl['name']} "
          f"({impl['engine']})")
    expected = record["summary"].get("expected")
    known = bool(expected and expected.get("gbps"))
    bw = [(r["op"], format_size(r["size_bytes"]), r["streams"], f"{r['time_us']['p50']:.0f}", f"{r['bw_gbps']:.3f}",
           f"{r['bw_gbit_s']:.2f}", f"{r['total_gbps']:.3f}" if "total_gbps" in r else "-")
          + ((expectations.pct_cell(r["bw_gbps"], expected),) if known else ())
          for r in record["rows"] if r["op"] != "rtt"]
    if bw:
        print(text_table(bw, headers=["op", "size", "streams", "time p50 (us)", "GB/s", "Gbit/s", "both ways GB/s"]
                       + (["% of expected"] if known else []), tablefmt="simple"))
    lat = [(format_size(r["size_bytes"]), r["rtt_samples"], f"{r['rtt_us_p50']:.1f}", f"{r['rtt_us_p99']:.1f}")
           for r in record["rows"] if r["op"] == "rtt"]
    if lat:
        print()
        print(text_table(lat, headers=["rtt size", "samples", "p50 (us)", "p99 (us)"], tablefmt="simple"))
    if record["summary"].get("link_gbps"):
        print(f"# link ceiling (one way, largest size): {record['summary']['link_gbps']:.3f} GB/s = "
              f"{record['summary']['link_gbps'] * 8:.2f} Gbit/s")
    if expected:
        # Per direction: bidir's GB/s is each direction's, so it is held against the same line.
        print(f"# {describe_expected(expected)}")
    print(f"# results: {outcome.path}")

"""Running a file workload (storage posix and storage fio) and printing what it measured."""

from __future__ import annotations

from typing import Any

from ...core.units import format_size
from ...expect import overrides as expectations
from ...run.runner import RunOutcome, run_probe
from ...world import interrupts


def run_storage(probe_cls: Any, target_cls: Any, config: Any, inv: Any, *, tools: tuple[str, ...] | None = None,
                compare_fio: bool = False) -> RunOutcome:
    skipped = None
    if compare_fio:
        from .fio_engine import fio_unavailable_reason

        skipped = fio_unavailable_reason()
        tools = ("posix",) if skipped else ("posix", "fio")
    # SIGTERM unwinds like Ctrl-C (for a library caller too), so the test directory is removed.
    previous = interrupts.take()
    try:
        with target_cls(config) as target:
            probe = probe_cls(config, target, tools)
            expect = expectations.for_storage(target.workdir.facts(), config.expected)
            outcome = run_probe(probe, inv.settings, config=config, json_path=inv.json_path,
                                results_dir=inv.results_dir, extra_summary=expect)
    finally:
        interrupts.restore(previous)
    outcome.notes.update(tools=tools or (probe_cls.name.replace("storage_", ""),), fio_skipped=skipped)
    return outcome


def _gbps(row: dict[str, Any]) -> str:
    value = f"{row[row['op'] + '_gbps']:.2f}"
    return value + " (memory!)" if row.get("served_from_memory") else value


def _us(value: Any) -> str:
    return "-" if value is None else f"{value:.0f}"


def print_report(outcome: RunOutcome, config: Any) -> None:
    from ...core.tables import text_table

    tools = tuple(outcome.notes.get("tools") or ("posix",))
    impl = outcome.record["implementation"]
    mode = "O_DIRECT" if impl["direct_in_effect"] else "buffered (page cache dropped before reads)"
    print(f"# microbench storage {'/'.join(tools)}: {impl['workdir']} on {impl['filesystem']} ({impl['device']}), "
          f"{mode}, engine {impl['engine']} ({impl['name']}), {config.threads} thread(s) x qd {config.qd}, "
          f"{config.pattern}, file {format_size(config.size)}")
    if impl.get("on_mount"):
        print(f"# bucket mount {impl['mount_point']} ({impl['mount_mode']}) on {impl['backing_store']}; rclone "
              f"{impl['rclone_version']}; writes timed until fsync returns (on a cached mount: into its cache)")
    rows = outcome.rows
    expected = outcome.record["summary"].get("expected")
    known = bool(expected and expected.get("gbps"))
    pct = ["% of expected"] if known else []
    if tools == ("posix", "fio"):
        pairs: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
        for r in rows:
            if r.get("stream") != "single":   # printed below: fio has no such case
                pairs.setdefault((r["op"], r["size_bytes"]), {})[r["tool"]] = r
        table = []
        for (op, bs), pair in pairs.items():
            mine, fio = pair.get("posix"), pair.get("fio")
            ratio = (f"{mine[op + '_gbps'] / fio[op + '_gbps']:.2f}x" if mine and fio and fio[op + "_gbps"] else "-")
            table.append((op, format_size(bs), _gbps(mine) if mine else "-", _gbps(fio) if fio else "-", ratio,
                          _us(mine and mine.get("lat_us_p99")), _us(fio and fio.get("lat_us_p99")))
                         + ((expectations.pct_cell(mine[op + "_gbps"] if mine else None, expected),) if known else ()))
        print(text_table(table, headers=["rw", "bs", "posix GB/s", "fio GB/s", "posix/fio", "posix p99 us",
                                       "fio p99 us"] + pct, tablefmt="simple"))
        for r in rows:
            if r.get("stream") == "single":
                print(f"# posix 1 stream, write {format_size(r['bs_bytes'])} blocks: {_gbps(r)} GB/s")
        # Where the CPU, not the device, is the limit, buffer paging decides the ratio: say so.
        print("# buffers: posix uses transparent-huge-page buffers, fio its default malloc; where the CPU is the "
              "limit (VMs, fast NVMe) that alone moves the ratio (docs/BENCHMARKS.md)")
    else:
        table = [(r["op"], format_size(r["bs_bytes"]), r["tool"] + (" 1 stream" if r.get("stream") == "single" else ""),
                  _gbps(r), f"{r.get('iops', 0):.0f}",
                  _us(r.get("lat_us_p50")), _us(r.get("lat_us_p99")), _us(r.get("lat_us_p999")), r["iters"])
                 + ((expectations.pct_cell(r[r["op"] + "_gbps"], expected),) if known else ())
                 for r in rows]
        print(text_table(table, headers=["rw", "bs", "tool", "GB/s", "IOPS", "p50 us", "p99 us", "p99.9 us", "iters"]
                       + pct, tablefmt="simple"))
    if any(r.get("stream") == "single" for r in rows):
        print("# posix 1 stream: one buffered sequential writer, fsync at the end (how torch.save writes a full state "
              "dict); `microbench compose` takes it as the tier's single-stream bandwidth")
    if expected:
        print(f"# {expectations.describe(expected)}")
    if impl.get("direct_note"):
        print(f"# O_DIRECT not in effect: {impl['direct_note']}")
    notes = sorted({r["note"] for r in rows if r.get("note")})
    if notes:
        print(f"# (memory!): {'; '.join(notes)} (memcpy {impl['memory_ceiling_gbps']:.2f} GB/s)")
    if config.keep:
        print(f"# kept {impl['workdir']}")
    print(f"# results: {outcome.path}")
    if outcome.notes.get("fio_skipped"):
        print(f"# --compare-fio skipped: {outcome.notes['fio_skipped']}")

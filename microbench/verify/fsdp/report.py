"""The verdict and the tables of `verify fsdp`: pure functions of the record's rows."""

from __future__ import annotations

from typing import Any

from tabulate import tabulate

from ...compose.report import format_time


def verdict(rows: list[dict[str, Any]], tolerance_pct: float, ckpt_tolerance_pct: float) -> dict[str, Any]:
    """Every row judged; `outside` names each configuration whose |error| exceeds its tolerance."""
    outside, checked = [], 0
    for row in rows:
        if row.get("kind") == "step":
            checked += 1
            if not abs(row["error_pct"]) <= tolerance_pct:
                outside.append(f"{_where(row)} {row['model']} {row['tokens']} tokens {row['error_pct']:+.1f}% "
                               f"(> {tolerance_pct:g}%)")
        elif row.get("kind") == "checkpoint":
            copies = _copies_stored(row)
            if copies is not None and copies > 1.1:
                checked += 1
                outside.append(f"checkpoint save to {row['target']} {row.get('sharding')}: the {row['replicas']} "
                               f"replicas' shards stored {copies:.2f} times, not once")
            for op in ("save", "load"):
                checked += 1
                err = row[op]["error_pct"]
                if not abs(err) <= ckpt_tolerance_pct:
                    outside.append(f"checkpoint {op} to {row['target']} {err:+.1f}% (> {ckpt_tolerance_pct:g}%)")
                if op == "load" and row.get("wrong_loads"):
                    outside.append(f"checkpoint load from {row['target']} returned other values than were saved")
    return {"tolerance_pct": tolerance_pct, "ckpt_tolerance_pct": ckpt_tolerance_pct, "checked": checked,
            "outside": outside, "pass": not outside and checked > 0}


def _copies_stored(row: dict[str, Any]) -> float | None:
    """An HSDP save's stored bytes over one copy of the state (DCP writes replicated shards once)."""
    if not row.get("replicas") or not row.get("written_bytes") or not row.get("bytes"):
        return None
    return row["written_bytes"] / row["bytes"]


def _where(row: dict[str, Any]) -> str:
    """The link profile, and the sharding where it is not full (rows before it: full)."""
    sharding = row.get("sharding", "full")
    return row["profile"] if sharding == "full" else f"{row['profile']} {sharding}"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else format_time(seconds)


def step_table(rows: list[dict[str, Any]], tolerance_pct: float) -> str:
    table = []
    for r in rows:
        p = r["parts"]
        table.append((_where(r), r["model"], r["tokens"], _ms(r["predicted_s"]), _ms(r["measured_s"]),
                      f"{r['spread_pct']:.0f}%", f"{r['error_pct']:+.1f}%",
                      "ok" if abs(r["error_pct"]) <= tolerance_pct else "OUTSIDE",
                      f"{p['compute']['error_pct']:+.0f}%",
                      "-" if p["collectives"]["error_pct"] is None else f"{p['collectives']['error_pct']:+.0f}%",
                      "-" if p["overlap"]["implied_by_step"] is None
                      else f"{p['overlap']['used']:.2f}/{p['overlap']['implied_by_step']:.2f}"))
    return tabulate(table, headers=["profile", "model", "tokens", "predicted", "measured p50", "spread", "error",
                                    "verdict", "compute err", "comm err", "overlap used/implied"],
                    tablefmt="simple", disable_numparse=True)


def overlap_note(rows: list[dict[str, Any]]) -> str | None:
    """What the implied overlap means, said where a reader needs it: it is the share of the
    hideable time the real step hid, (compute alone + collectives alone + optimizer + overhead
    - step) / (the composer's serial bound - its pipelined step). Below 0 the step took longer
    than its parts run one after another: they slowed each other down (on CPUs, gloo's threads
    and the matmuls share cores), so nothing was hidden and time was lost besides. Above 1 it
    hid more than the composer's pipeline can."""
    implied = [r["parts"]["overlap"].get("implied_by_step") for r in rows]
    implied = [v for v in implied if v is not None]
    if not implied:
        return None
    low, high = min(implied), max(implied)
    note = ("# overlap used/implied: implied = the share of the hideable time the real step hid, "
            "(compute alone + collectives alone + optimizer + overhead - step) / (serial bound - pipelined step); "
            "0 = nothing hidden, 1 = as much as the composer's pipeline hides")
    if low < 0:
        note += (f"; below 0 ({low:.2f}) the step took longer than its parts run one after another: they "
                 f"slowed each other down (contention, e.g. gloo's threads and the matmuls sharing CPU cores), "
                 f"so nothing was hidden and time was lost besides")
    if high > 1:
        note += f"; above 1 ({high:.2f}) the step hid more than the composer's pipeline can"
    return note


def checkpoint_table(rows: list[dict[str, Any]], tolerance_pct: float) -> str:
    table = []
    for r in rows:
        for op in ("save", "load"):
            part = r[op]
            copies = _copies_stored(r)
            stored = f" (stored x{copies:.2f})" if copies is not None and op == "save" else ""
            table.append((_where({"profile": r["target"], "sharding": r.get("sharding", "full")}), op,
                          f"{r['bytes'] / 1e6:.1f} MB{stored}", _ms(part["predicted_s"]),
                          _ms(part["measured_s"]), f"{part['spread_pct']:.0f}%", f"{part['error_pct']:+.1f}%",
                          "ok" if abs(part["error_pct"]) <= tolerance_pct else "OUTSIDE"))
    return tabulate(table, headers=["target", "op", "bytes", "predicted", "measured p50", "spread", "error", "verdict"],
                    tablefmt="simple", disable_numparse=True)


def _overlap_range(cal: dict[str, Any]) -> str:
    """The middle half of the calibration steps' own readings: how well this run pinned the overlap
    down (on a shared CPU box one step's noise spans more than the whole 0..1 range)."""
    overlap = (cal.get("details") or {}).get("overlap") or {}
    iqr = overlap.get("raw_iqr")
    if not iqr:
        return ""
    # A CPU calibration's overlap is 0 by FSDP2's mechanism; its steps' readings stay a diagnostic
    # (records since then also hold beyond_serial_s; an older CPU record read its overlap from them).
    cpu = cal.get("device") == "cpu" and "beyond_serial_s" in overlap
    return f" ({'FSDP2 on a CPU hides nothing; ' if cpu else ''}steps read {iqr[0]:.2f} to {iqr[1]:.2f}, middle half)"


def print_report(record: dict[str, Any], calibrate_only: bool) -> None:
    summary = record.get("summary") or {}
    for profile, cal in (summary.get("calibration_by_profile") or {}).items():
        print(f"# calibration [{profile}] on {cal['model']['name']} ({cal['model']['tokens']} tokens): overlap "
              f"{cal['overlap']:.2f}{_overlap_range(cal)}, FSDP per-unit cost {format_time(cal['unit_overhead_s'])}, compute efficiency "
              f"{cal['compute_efficiency']:.2f} (kernel replay / real forward+backward)")
    if calibrate_only:
        return
    verdict_ = summary.get("verdict") or {}
    steps = [r for r in record["rows"] if r.get("kind") == "step"]
    ckpts = [r for r in record["rows"] if r.get("kind") == "checkpoint"]
    if steps:
        print(step_table(steps, verdict_.get("tolerance_pct", 10)))
        note = overlap_note(steps)
        if note:
            print(note)
        print("# inputs, each read right before every step (a step against its own, the row from their medians): "
              "compute = the step's kernels (matmuls forward and backward, attention) replayed / calibrated "
              "efficiency; collectives = the probe at the unit sizes; optimizer = AdamW at the shard size")
    if ckpts:
        print(checkpoint_table(ckpts, verdict_.get("ckpt_tolerance_pct", 15)))
        print("# checkpoint inputs: the checkpoint probe on each target in this run (synthetic values in the "
              "real state's layout: top-level keys, tensor shapes, sharding, order), a probe save and load "
              "right before each real one, medians; a sharded load adds get_state_dict + set_state_dict timed "
              "on the model, a full load is the probe's read on rank 0 plus the model's own scatter "
              "(set_model/optimizer_state_dict, broadcast_from_rank0) timed without a file")
    if any("error_of_medians_pct" in r or "error_of_medians_pct" in (r.get("save") or {}) for r in steps + ckpts):
        print("# error: the median of the pairs' errors, each measured step, save or load against the prediction "
              "from the probe sample taken right before it (the machine's drift is in both); predicted and "
              "measured p50 are each side's own median, so their ratio can differ (the record keeps both: "
              "error_pct, error_of_medians_pct)")
    if verdict_:
        print(f"# verdict: {'PASS' if verdict_['pass'] else 'FAIL'} ({verdict_['checked']} checked, "
              f"{len(verdict_['outside'])} outside |step error| <= {verdict_['tolerance_pct']:g}%, "
              f"|checkpoint error| <= {verdict_['ckpt_tolerance_pct']:g}%)")

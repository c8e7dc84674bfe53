"""The verdict and the tables of `verify fsdp`: pure functions of the record's rows."""

from __future__ import annotations

from typing import Any

from tabulate import tabulate

from ...compose.report import format_time
from .. import noise


def judgements(rows: list[dict[str, Any]], tolerance_pct: float, ckpt_tolerance_pct: float,
               loads: dict[str, Any] | None = None) -> list[tuple[int, str | None, noise.Judgement]]:
    """(row index, part: None for a step, save or load for a checkpoint, its judgement): each
    row's error against its tolerance with the noise of its paired readings and the load its
    phase saw (verify/noise.py)."""
    loads = loads or {}
    out: list[tuple[int, str | None, noise.Judgement]] = []
    for i, row in enumerate(rows):
        if row.get("kind") == "step":
            errors = noise.paired(row.get("predicted_steps_s"), row.get("measured_steps_s"), row["error_pct"])
            out.append((i, None, noise.judge(errors, row["error_pct"], tolerance_pct, loads.get(_where(row)))))
        elif row.get("kind") == "checkpoint":
            for op in ("save", "load"):
                part = row[op]
                errors = noise.paired(part.get("predicted_s_each"), part.get("measured_s_each"), part["error_pct"])
                out.append((i, op, noise.judge(errors, part["error_pct"], ckpt_tolerance_pct, loads.get("checkpoint"))))
    return out


def verdict(rows: list[dict[str, Any]], tolerance_pct: float, ckpt_tolerance_pct: float,
            loads: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every row judged: `outside` names each configuration the measurement shows beyond its
    tolerance (FAIL), `inconclusive` each one that noise alone could have moved across it."""
    outside, unsure, checked = [], [], 0
    judged = judgements(rows, tolerance_pct, ckpt_tolerance_pct, loads)
    by_row = {(i, part): j for i, part, j in judged}

    def count(j: noise.Judgement, name: str, tol: float) -> None:
        if j.verdict == noise.FAIL:
            outside.append(f"{name} {j.error_pct:+.1f}% (> {tol:g}%)")
        elif j.verdict == noise.INCONCLUSIVE:
            unsure.append(f"{name}: {noise.why(j, tol)}")

    for i, row in enumerate(rows):
        if row.get("kind") == "step":
            checked += 1
            count(by_row[(i, None)], f"{_where(row)} {row['model']} {row['tokens']} tokens", tolerance_pct)
        elif row.get("kind") == "checkpoint":
            copies = _copies_stored(row)
            if copies is not None and copies > 1.1:
                checked += 1
                outside.append(f"checkpoint save to {row['target']} {row.get('sharding')}: the {row['replicas']} "
                               f"replicas' shards stored {copies:.2f} times, not once")
            for op in ("save", "load"):
                checked += 1
                count(by_row[(i, op)], f"checkpoint {op} to {row['target']}", ckpt_tolerance_pct)
                if op == "load" and row.get("wrong_loads"):
                    outside.append(f"checkpoint load from {row['target']} returned other values than were saved")
    return {"tolerance_pct": tolerance_pct, "ckpt_tolerance_pct": ckpt_tolerance_pct, "checked": checked,
            "outside": outside, "inconclusive": unsure, "pass": not outside and not unsure and checked > 0,
            "verdict": noise.FAIL if outside or not checked else noise.INCONCLUSIVE if unsure else noise.PASS,
            "rule": noise.RULE, "clean": noise.how_to_get_clean([j for _, _, j in judged]) if unsure else None,
            "rows": [{"row": i, "part": part, **j.as_dict()} for i, part, j in judged]}


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
        shown, band = noise.cells(r, tolerance_pct)
        table.append((_where(r), r["model"], r["tokens"], _ms(r["predicted_s"]), _ms(r["measured_s"]),
                      f"{r['spread_pct']:.0f}%", f"{r['error_pct']:+.1f}%", band, shown,
                      f"{p['compute']['error_pct']:+.0f}%",
                      "-" if p["collectives"]["error_pct"] is None else f"{p['collectives']['error_pct']:+.0f}%",
                      "-" if p["overlap"]["implied_by_step"] is None
                      else f"{p['overlap']['used']:.2f}/{p['overlap']['implied_by_step']:.2f}"))
    return tabulate(table, headers=["profile", "model", "tokens", "predicted", "measured p50", "spread", "error",
                                    "with noise", "verdict", "compute err", "comm err", "overlap used/implied"],
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
            shown, band = noise.cells(part, tolerance_pct)
            table.append((_where({"profile": r["target"], "sharding": r.get("sharding", "full")}), op,
                          f"{r['bytes'] / 1e6:.1f} MB{stored}", _ms(part["predicted_s"]),
                          _ms(part["measured_s"]), f"{part['spread_pct']:.0f}%", f"{part['error_pct']:+.1f}%",
                          band, shown))
    return tabulate(table, headers=["target", "op", "bytes", "predicted", "measured p50", "spread", "error",
                                    "with noise", "verdict"],
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
        print(
            f"# calibration [{profile}] on {cal['model']['name']} ({cal['model']['tokens']} tokens): overlap "
            f"{cal['overlap']:.2f}{_overlap_range(cal)}, FSDP per-unit cost {format_time(cal['unit_overhead_s'])}, "
            f"compute efficiency "
            f"{cal['compute_efficiency']:.2f} (kernel replay / real forward+backward)"
        )
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
        noise.print_verdict(verdict_, f"|step error| <= {verdict_['tolerance_pct']:g}%, "
                                f"|checkpoint error| <= {verdict_['ckpt_tolerance_pct']:g}%")


def attach(record: dict[str, Any], verdict_: dict[str, Any]) -> None:
    """Each row (each checkpoint save and load) keeps its judgement beside its error."""
    for judged in verdict_.get("rows") or []:
        row = record["rows"][judged["row"]]
        target = row if judged["part"] is None else row[judged["part"]]
        target["noise"] = {k: v for k, v in judged.items() if k not in ("row", "part")}

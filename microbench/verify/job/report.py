"""The verdict and the table of `verify job`: pure functions of the record's rows."""

from __future__ import annotations

import statistics
from typing import Any

from tabulate import tabulate

from ...compose.report import format_time
from .. import noise

NAMES = {"model_load": "model load", "train": "train", "data_stall": "data stall", "ckpt_blocking": "ckpt blocking",
         "ckpt_wait": "ckpt wait", "final_save": "final save (durable)"}


def _relative(readings: list[float]) -> tuple[float, float, float] | None:
    """The order-statistic interval of the readings' median, relative to it: (low, high, coverage)."""
    values = [v for v in readings if v > 0]
    if len(values) < 2:
        return None
    low, high, cov = noise.median_interval(values)
    mid = statistics.median(values)
    return low / mid - 1, high / mid - 1, cov


def judge_job(row: dict[str, Any], tolerance_pct: float, load: dict[str, Any] | None) -> noise.Judgement:
    """A job runs once: its total's noise comes from the readings inside it. Each phase with
    repeated readings moves its side of the total by its share times the relative interval of
    their median: the predicted step by the compute replays read before and after the job, the
    measured total by the real steps and the periodic saves. Interval arithmetic over those
    (each side at its own extremes), then the load (verify/noise.py)."""
    total, phases, measured = row["total"], row.get("phases") or {}, row.get("measured") or {}
    step = (row.get("inputs") or {}).get("step") or {}
    pred_total, meas_total = total.get("predicted_s") or 0.0, total.get("measured_s") or 0.0
    sides: dict[str, list[tuple[float, tuple[float, float, float] | None]]] = {"predicted": [], "measured": []}
    if pred_total > 0 and meas_total > 0:
        train = phases.get("train") or {}
        sides["predicted"].append(
            (
                train.get("predicted_s", 0.0) / pred_total,
                _relative(list(step.get("replay_before_s") or []) + list(step.get("replay_after_s") or [])),
            )
        )
        sides["measured"].append((train.get("measured_s", 0.0) / meas_total, _relative(measured.get("steps_s") or [])))
        blocking = phases.get("ckpt_blocking") or {}
        sides["measured"].append(
            (blocking.get("measured_s", 0.0) / meas_total, _relative(measured.get("saves_s") or []))
        )
    used = [(side, w, r) for side, parts in sides.items() for w, r in parts if r is not None and w > 0]
    if not used:
        return noise.judge_interval(total["error_pct"], total["error_pct"], total["error_pct"], 0.0, 1,
                                    tolerance_pct, load)

    def scale(side: str, end: int) -> float:
        return 1 + sum(w * r[end] for s, w, r in used if s == side)

    ratio = 1 + total["error_pct"] / 100
    low = 100 * (ratio * scale("predicted", 0) / scale("measured", 1) - 1)
    high = 100 * (ratio * scale("predicted", 1) / scale("measured", 0) - 1)
    readings = len(step.get("replay_before_s") or []) + len(step.get("replay_after_s") or []) + \
        len(measured.get("steps_s") or []) + len(measured.get("saves_s") or [])
    return noise.judge_interval(total["error_pct"], low, high, min(r[2] for _, _, r in used), readings,
                                tolerance_pct, load)


def verdict(rows: list[dict[str, Any]], tolerance_pct: float, loads: dict[str, Any] | None = None) -> dict[str, Any]:
    """The total of every finished configuration judged with its noise (judge_job): `outside`
    names each one the measurement shows beyond the tolerance, `inconclusive` each one noise alone
    could have moved across it."""
    outside, unsure, judged = [], [], []
    loads = loads or {}
    for i, row in enumerate(rows):
        if row.get("kind") != "job" or row.get("status") == "partial":
            continue
        j = judge_job(row, tolerance_pct, loads.get(row["profile"]))
        judged.append((i, j))
        name = f"{row['profile']} {row['assignment']}"
        if j.verdict == noise.FAIL:
            outside.append(f"{name} total {j.error_pct:+.1f}% (> {tolerance_pct:g}%)")
        elif j.verdict == noise.INCONCLUSIVE:
            unsure.append(f"{name}: {noise.why(j, tolerance_pct)}")
        if row["measured"].get("model_wrong"):
            outside.append(f"{name}: the loaded model differs from the one written")
        if row["measured"].get("data_wrong"):
            outside.append(f"{name}: {row['measured']['data_wrong']} sample(s) read back wrong")
    checked = len(judged)
    return {"tolerance_pct": tolerance_pct, "checked": checked, "outside": outside, "inconclusive": unsure,
            "pass": not outside and not unsure and checked > 0,
            "verdict": noise.FAIL if outside or not checked else noise.INCONCLUSIVE if unsure else noise.PASS,
            "rule": noise.RULE + "; a job's readings: the compute replays, the real steps and the periodic saves, "
                                 "each by its phase's share of the total",
            "clean": noise.how_to_get_clean([j for _, j in judged]) if unsure else None,
            "rows": [{"row": i, "part": "total", **j.as_dict()} for i, j in judged]}


def attach(record: dict[str, Any], verdict_: dict[str, Any]) -> None:
    """Each configuration's total keeps its judgement beside its error."""
    for judged in verdict_.get("rows") or []:
        record["rows"][judged["row"]]["total"]["noise"] = {k: v for k, v in judged.items() if k not in ("row", "part")}


def _err(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}%"


def table(rows: list[dict[str, Any]], tolerance_pct: float) -> str:
    out = []
    for r in rows:
        if r.get("kind") != "job" or r.get("status") == "partial":
            continue
        config = f"{r['profile']} {r['assignment']}"
        for kind, p in r["phases"].items():
            if p["predicted_s"] == 0 and p["measured_s"] == 0:
                continue
            out.append((config, NAMES.get(kind, kind), format_time(p["predicted_s"]), format_time(p["measured_s"]),
                        _err(p["error_pct"]), f"{100 * p['share_measured']:.0f}%", "", ""))
            config = ""
        t = r["total"]
        shown, band = noise.cells(t, tolerance_pct)
        out.append(("", "TOTAL", format_time(t["predicted_s"]), format_time(t["measured_s"]), _err(t["error_pct"]),
                    "100%", band, shown))
    return tabulate(out, headers=["configuration", "phase", "predicted", "measured", "error", "share", "with noise",
                                  "verdict"],
                    tablefmt="simple", disable_numparse=True)


def print_report(record: dict[str, Any]) -> None:
    summary = record.get("summary") or {}
    for profile, cal in (summary.get("calibration_by_profile") or {}).items():
        print(f"# calibration [{profile}] on {cal['model']['name']} ({cal['model']['tokens']} tokens): overlap "
              f"{cal['overlap']:.2f}, FSDP per-unit cost {format_time(cal['unit_overhead_s'])}, compute efficiency "
              f"{cal['compute_efficiency']:.2f}")
    verdict_ = summary.get("verdict") or {}
    rows = record["rows"]
    if rows:
        print(table(rows, verdict_.get("tolerance_pct", 15)))
        unaccounted = [r["total"]["unaccounted_s"] for r in rows if r.get("kind") == "job" and "total" in r]
        print("# prediction: compose/job.timeline over costs from probes run in this run on each configuration's "
              "tiers (modelload, dataload, checkpoint) and verify fsdp's step prediction (compute, collectives, "
              "AdamW probes + the calibration); phases are the slowest rank's sums, share = of the measured total"
              + (f"; time outside the phases (loop, batch to ids): up to {format_time(max(unaccounted))}"
                 if unaccounted else ""))
    if verdict_:
        noise.print_verdict(verdict_, f"|total error| <= {verdict_['tolerance_pct']:g}%", "configuration(s) checked")

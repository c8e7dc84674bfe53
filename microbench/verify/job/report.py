"""The verdict and the table of `verify job`: pure functions of the record's rows."""

from __future__ import annotations

from typing import Any

from tabulate import tabulate

from ...compose.report import format_time

NAMES = {"model_load": "model load", "train": "train", "data_stall": "data stall", "ckpt_blocking": "ckpt blocking",
         "ckpt_wait": "ckpt wait", "final_save": "final save (durable)"}


def verdict(rows: list[dict[str, Any]], tolerance_pct: float) -> dict[str, Any]:
    """The total of every finished configuration judged; `outside` names each one beyond the tolerance."""
    outside, checked = [], 0
    for row in rows:
        if row.get("kind") != "job" or row.get("status") == "partial":
            continue
        checked += 1
        err = row["total"]["error_pct"]
        if not abs(err) <= tolerance_pct:
            outside.append(f"{row['profile']} {row['assignment']} total {err:+.1f}% (> {tolerance_pct:g}%)")
        if row["measured"].get("model_wrong"):
            outside.append(f"{row['profile']} {row['assignment']}: the loaded model differs from the one written")
        if row["measured"].get("data_wrong"):
            outside.append(f"{row['profile']} {row['assignment']}: {row['measured']['data_wrong']} sample(s) read "
                           f"back wrong")
    return {"tolerance_pct": tolerance_pct, "checked": checked, "outside": outside, "pass": not outside and checked > 0}


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
                        _err(p["error_pct"]), f"{100 * p['share_measured']:.0f}%", ""))
            config = ""
        t = r["total"]
        out.append(("", "TOTAL", format_time(t["predicted_s"]), format_time(t["measured_s"]), _err(t["error_pct"]),
                    "100%", "ok" if abs(t["error_pct"]) <= tolerance_pct else "OUTSIDE"))
    return tabulate(out, headers=["configuration", "phase", "predicted", "measured", "error", "share", "verdict"],
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
        print(f"# verdict: {'PASS' if verdict_['pass'] else 'FAIL'} ({verdict_['checked']} configuration(s) checked, "
              f"{len(verdict_['outside'])} outside |total error| <= {verdict_['tolerance_pct']:g}%)")

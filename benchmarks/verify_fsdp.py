"""Predicted vs measured FSDP2 steps and DCP checkpoints: the figures for docs/BENCHMARKS.md.

Runs the acceptance command of the verify issue on a lab of two hosts (made here, removed
afterwards unless it already existed), then prints its record as markdown tables: one row per
step configuration (predicted, measured median, spread, error, and the per-part comparison that
explains a miss) and one per checkpoint save/load, with the calibration each profile used.

    sudo python benchmarks/verify_fsdp.py [--lab h10v] [--tolerance 10] [--ckpt-tolerance 15] [-- EXTRA VERIFY ARGS]

The calibration runs on its own model (`calib`, 384 tokens) and tiny units; the matrix checks
the `small` and `medium` models at 256 and 512 tokens, none of which the calibration saw. The
load average is printed beside the figures: on a shared 2-core box other work moves them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"


def markdown(record: dict) -> str:
    out = []
    for profile, cal in (record["summary"].get("calibration_by_profile") or {}).items():
        d = cal["details"]
        ov, bo = d["overlap"], d["backend_overlap"]
        out.append(f"- calibration [{profile}]: overlap {cal['overlap']:.2f} (calib step {ov['measured_s'] * 1e3:.1f} ms "
                   f"between serial {ov['predicted_serial_s'] * 1e3:.1f} and pipelined {ov['predicted_pipelined_s'] * 1e3:.1f} ms; "
                   f"the backend alone could hide {bo['overlap']:.2f}); per-unit cost {cal['unit_overhead_s'] * 1e3:.2f} ms; "
                   f"compute efficiency {cal['compute_efficiency']:.3f}")
    out.append("")
    out.append("| profile | model | tokens | predicted | measured p50 | spread | error | compute pred/alone | "
               "collectives pred/alone | overlap used/implied |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for r in record["rows"]:
        if r.get("kind") != "step":
            continue
        p = r["parts"]
        implied = p["overlap"]["implied_by_step"]
        out.append(f"| {r['profile']} | {r['model']} | {r['tokens']} | {_ms(r['predicted_s'])} | {_ms(r['measured_s'])} | "
                   f"{r['spread_pct']:.0f}% | {r['error_pct']:+.1f}% | {_ms(p['compute']['predicted_s'])} / "
                   f"{_ms(p['compute']['measured_alone_s'])} | {_ms(p['collectives']['predicted_s'])} / "
                   f"{_ms(p['collectives']['measured_alone_s'])} | {p['overlap']['used']:.2f} / "
                   f"{'-' if implied is None else f'{implied:.2f}'} |")
    ckpts = [r for r in record["rows"] if r.get("kind") == "checkpoint"]
    if ckpts:
        out.append("")
        out.append("| target | op | bytes | predicted | measured p50 | spread | error | probe |")
        out.append("|---|---|---|---|---|---|---|---|")
        for r in ckpts:
            storage = r["inputs"]["storage"]
            for op in ("save", "load"):
                part = r[op]
                gbps = storage["write_gbps"] if op == "save" else storage["read_gbps"]
                out.append(f"| {r['target']} | {op} | {r['bytes'] / 1e6:.1f} MB | {_ms(part['predicted_s'])} | "
                           f"{_ms(part['measured_s'])} | {part['spread_pct']:.0f}% | {part['error_pct']:+.1f}% | "
                           f"{gbps:.3f} GB/s |")
    verdict = record["summary"].get("verdict") or {}
    out.append("")
    shown = verdict.get("verdict") or ("PASS" if verdict.get("pass") else "FAIL")
    out.append(f"verdict: {shown}; outside: {verdict.get('outside') or 'none'}; "
               f"inconclusive: {verdict.get('inconclusive') or 'none'}")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lab", default="h10v")
    parser.add_argument("--tolerance", default="10")
    parser.add_argument("--ckpt-tolerance", default="15")
    parser.add_argument("extra", nargs="*", help="more `verify fsdp` arguments (after --)")
    args = parser.parse_args()
    from microbench.lab import namespaces as labmod
    from microbench.world.launch import package_env

    created = False
    if labmod.find(args.lab) is None:
        labmod.up(args.lab, 2, None)
        created = True
    out = Path(tempfile.mkdtemp(prefix="verify-bench-")) / "verify.json"
    cmd = [sys.executable, "-m", "microbench", "verify", "fsdp", "--matrix", "--lab", args.lab,
           "--link-profiles", "unlimited,1gbit", "--tolerance", args.tolerance, "--ckpt-tolerance",
           args.ckpt_tolerance, "--json", str(out), *args.extra]
    started = time.time()
    load_before = os.getloadavg()
    try:
        code = subprocess.run(cmd, env=package_env()).returncode
    finally:
        if created:
            labmod.down(args.lab)
    wall = time.time() - started
    print()
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}: `microbench {' '.join(cmd[3:])}` "
          f"exit {code}, {wall:.0f} s; load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}")
    if out.exists():
        print(markdown(json.loads(out.read_text())))
        print(f"# record: {out}")
    return code


if __name__ == "__main__":
    sys.exit(main())

"""The compute term of `verify fsdp`, side by side: the old input (the matmul probe's forward
shapes, each case timed alone for about a second, FLOP-weighted rate) and the new one (a replay
of the step's kernels, forward and backward with attention, every rank at once from a barrier),
each against the model's real forward+backward (unsharded, both ranks at once) taken right
after it, on the calibration model and on the matrix's four configurations, in rounds.

Each method's efficiency is calibrated as `verify` does it (on `calib` at 384 tokens, the median
over rounds of prediction / real); the figure per configuration is prediction / efficiency /
real - 1, per round, so its spread over rounds is what that input adds to a step's error.

    python benchmarks/verify_compute_terms.py [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONFIGS = [("calib", 384), ("small", 256), ("small", 512), ("medium", 256), ("medium", 512)]


def old_rate(world, shape, tokens):
    from microbench.probes import compute as cm
    from microbench.run.runner import SweepSettings, measure_case

    config = cm.Config(model=shape.name, hidden=shape.hidden, q_dim=shape.heads * shape.head_dim,
                       kv_dim=shape.kv_heads * shape.head_dim, ffn=shape.ffn, vocab=shape.vocab, layers=shape.layers,
                       tokens=tokens)
    probe = cm.ComputeProbe(config)
    settings = SweepSettings(warmup=2, iters=12, budget_s_per_case=1.0, min_iters=3, check=False, progress=False)
    rows = [measure_case(probe, case, settings, world) for case in probe.cases()]
    return cm.achieved_tflops(rows) * 1e12


def rank_main(rounds: int, out: str) -> int:
    import torch

    from microbench.verify import model as fm
    from microbench.verify.fsdp import steps as vf
    from microbench.verify.fsdp.measure import compute_alone_sampler
    from microbench.world.dist import World
    from microbench.world.launch import detect_world
    from microbench.core.stats import percentile

    torch.set_num_threads(1)
    world = World(detect_world(), "gloo", 300)
    precision = fm.precision_for("cpu")
    samples = {f"{m} {t}": [] for m, t in CONFIGS}
    for r in range(rounds):
        for name, tokens in CONFIGS:
            shape = fm.PRESETS[name]
            flops = vf.step_flops(shape, tokens)
            old = flops / old_rate(world, shape, tokens)
            probe = vf.replay(shape, tokens, "cpu", "float32")
            model = compute_alone_sampler(world, shape, tokens, "cpu", precision)
            model()
            new, real = [], []
            for _ in range(3):
                new.append(probe.time_once(world))
                real.append(model())
            samples[f"{name} {tokens}"].append({"old_s": old, "new_s": percentile(new, 50),
                                                "real_s": percentile(real, 50), "load": os.getloadavg()[0]})
            if world.rank == 0:
                s = samples[f"{name} {tokens}"][-1]
                print(f"round {r} {name} {tokens}: old {s['old_s'] * 1e3:.0f} ms, new {s['new_s'] * 1e3:.0f} ms, "
                      f"real {s['real_s'] * 1e3:.0f} ms, load {s['load']:.1f}", flush=True)
    if world.rank == 0:
        Path(out).write_text(json.dumps(samples, indent=1))
    world.close()
    return 0


def report(samples: dict) -> str:
    from microbench.core.stats import percentile

    lines = ["| configuration | old: error per round | old spread | new: error per round | new spread |",
             "|---|---|---|---|---|"]
    eff = {m: percentile([s[f"{m}_s"] / s["real_s"] for s in samples["calib 384"]], 50) for m in ("old", "new")}
    for key, rows in samples.items():
        cells = []
        for m in ("old", "new"):
            errs = [100 * (s[f"{m}_s"] / eff[m] / s["real_s"] - 1) for s in rows]
            cells += [", ".join(f"{e:+.0f}%" for e in errs), f"{max(errs) - min(errs):.0f} pts"]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    loads = [s["load"] for rows in samples.values() for s in rows]
    lines.append(f"\nefficiency: old {eff['old']:.3f}, new {eff['new']:.3f}; load average {min(loads):.1f}-{max(loads):.1f}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default="verify-compute-terms.json")
    args = parser.parse_args()
    if os.environ.get("RANK") is not None:
        return rank_main(args.rounds, args.json)
    from microbench.world.launch import free_port

    port = free_port()
    procs = [subprocess.Popen([sys.executable, __file__, "--rounds", str(args.rounds), "--json", args.json],
                              env={**os.environ, "RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r),
                                   "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
             for r in range(2)]
    codes = [p.wait() for p in procs]
    if any(codes):
        return 1
    print(report(json.loads(Path(args.json).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())

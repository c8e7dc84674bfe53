"""The composer against published FSDP training runs (benchmarks/published/published_fsdp_dev.csv,
MosaicML's llm-foundry tables): every row composed in two modes, through the composer's own
library path (the MPT layout, compute priced per kernel, the two-level network, fsdp.predict_step):

  described   the GPU's shipped kernel tables and described networks, nothing measured;
  calibrated  per model and GPU, the run with the fewest GPUs gives the compute scale that
              reproduces its published step (compose --measured-step); the model's other rows on
              that GPU are predicted with it (compose --calibration). The calibration row is left
              out of that mode's statistics, and a model with one row on a GPU has nothing to check.

Networks as the issue describes them: NVLink busbw 360 GB/s (H100) or 230 GB/s (A100) inside a
node; across nodes the node's NICs as the row states (1600 Gbps RoCE for the A100 rows), else
8 x 400 Gbps. Prints per row the predicted and published step and the error, then MAPE, max and
mean per mode. Nothing here is tuned to these step times: the tables come from kernel
measurements (microbench/compose/kernels/data/*.json name each source).

    python benchmarks/published_fsdp.py [--csv PATH] [--json OUT]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

from microbench.compose import fsdp, kernels
from microbench.compose.sharding import inputs as two_level
from microbench.compose.model.gpt import mpt
from microbench.compose.hardware import GPUS, Gpu

HERE = Path(__file__).resolve().parent
CSV = HERE / "published" / "published_fsdp_dev.csv"

# The CSV's GPU column -> the composer's GPU, its kernel table and the described networks.
A100_40 = Gpu("a100-40gb", 312.0, 40e9, 1555.0, 32.0, "NVIDIA A100 SXM4 40GB datasheet: 312 TFLOPS bf16, 1555 GB/s")
GPU_OF = {"h100-sxm-80g": (GPUS["h100"], "h100", "360GB/s"), "a100-80g": (GPUS["a100"], "a100", "230GB/s"),
          "a100-40g": (A100_40, "a100", "230GB/s")}
NICS_DEFAULT = "400GB/s"          # 8 x 400 Gbps per node
NICS_ROCE_1600 = "200GB/s"        # 1600 Gbps per node


@dataclass
class Row:
    index: int
    csv: dict
    predicted_s: float = math.nan

    @property
    def published_s(self) -> float:
        return float(self.csv["measured_step_s"])

    @property
    def error(self) -> float:
        return self.predicted_s / self.published_s - 1

    def label(self) -> str:
        r = self.csv
        gpus = int(r["nodes"]) * int(r["gpus_per_node"])
        return (f"{r['model']:9s} {r['gpu']:12s} {gpus:4d} GPUs  seq {int(r['seq_len']):6d}  mb {int(r['micro_batch']):3d}  "
                f"accum {int(r['grad_accum']):3d}  ckpt {r['act_ckpt']:5s}")


def configuration(r: dict) -> tuple:
    gpu, table_name, intra = GPU_OF[r["gpu"]]
    nodes, per_node = int(r["nodes"]), int(r["gpus_per_node"])
    inter = NICS_ROCE_1600 if "1600Gbps" in r["network"] else NICS_DEFAULT
    model = mpt(r["model"], int(r["d_model"]), int(r["n_heads"]), int(r["layers"]), int(r["vocab"]),
                max_seq_len=int(r["seq_len"]), source="benchmarks/published (MPT layout)")
    # amp_bf16 runs Composer's FSDP mixed precision DEFAULT (fp32 gradient reduction); bf16, PURE.
    pure = "mp=PURE" in r["notes"]
    train = fsdp.TrainSpec(ranks=nodes * per_node, micro_batch=int(r["micro_batch"]), seq_len=int(r["seq_len"]),
                           flops_per_rank=gpu.peak_bf16_tflops * 1e12, grad_accum=int(r["grad_accum"]),
                           param_dtype="bfloat16", reduce_dtype="bfloat16" if pure else "float32",
                           activation_checkpointing="full" if r["act_ckpt"] == "full" else "none",
                           reshard_after_forward=r["sharding"] == "FULL_SHARD", memory_gbps=gpu.memory_gbps)
    net = two_level.for_job(two_level.described([two_level.parse_level(intra, "--net-intra")],
                                                [two_level.parse_level(inter, "--net-inter")]), nodes * per_node, nodes)[0]
    rates = kernels.TableRates(kernels.shipped(table_name), gpu.memory_gbps)
    return model, kernels.priced_train(model, train, rates), net, gpu


def predict(r: dict, scale: float = 1.0) -> float:
    model, train, net, _ = configuration(r)
    return fsdp.predict_step(model, replace(train, compute_scale=scale), net.all_gather, net.reduce_scatter).step_s


def stats(rows: list[Row]) -> dict:
    errs = [abs(x.error) for x in rows]
    return {"rows": len(rows), "mape_pct": 100 * sum(errs) / len(errs), "max_pct": 100 * max(errs),
            "mean_pct": 100 * sum(x.error for x in rows) / len(rows)}


def table(title: str, rows: list[Row], extra: dict[int, str] | None = None) -> None:
    print(f"\n## {title}")
    for x in rows:
        tail = f"  {extra[x.index]}" if extra and x.index in extra else ""
        print(f"{x.label()}  predicted {x.predicted_s:9.3f} s  published {x.published_s:9.3f} s  "
              f"error {100 * x.error:+6.1f}%{tail}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", default=str(CSV), help="the published runs (default: benchmarks/published/...)")
    p.add_argument("--json", help="also write the per-row results and statistics here")
    args = p.parse_args(argv)
    with open(args.csv, newline="") as fh:
        source = list(csv.DictReader(fh))

    described = [Row(i, r, predict(r)) for i, r in enumerate(source)]
    table("described: shipped kernel tables, described networks", described)

    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, r in enumerate(source):
        groups[(r["model"], r["gpu"])].append(i)
    calibrated, notes = [], {}
    for (model_name, gpu_name), members in groups.items():
        anchor = min(members, key=lambda i: (int(source[i]["nodes"]) * int(source[i]["gpus_per_node"]), i))
        r = source[anchor]
        cal = kernels.calibrate(float(r["measured_step_s"]), GPU_OF[gpu_name][0].name,
                                {"row": anchor, "model": model_name}, lambda s, r=r: predict(r, s))
        for i in members:
            if i == anchor:
                continue
            kernels.check_gpu(cal, GPU_OF[source[i]["gpu"]][0].name, f"row {anchor}")
            calibrated.append(Row(i, source[i], predict(source[i], cal.scale)))
            notes[i] = f"scale {cal.scale:.3f} from row {anchor} ({int(r['nodes']) * int(r['gpus_per_node'])} GPUs)"
    table("calibrated: one measured step per model and GPU (its row left out)", calibrated, notes)

    summary = {"described": stats(described), "calibrated": stats(calibrated)}
    print("\n## summary")
    for mode, s in summary.items():
        print(f"{mode:10s} rows {s['rows']:2d}  MAPE {s['mape_pct']:5.1f}%  max {s['max_pct']:5.1f}%  "
              f"mean {s['mean_pct']:+5.1f}%")
    if args.json:
        out = {"summary": summary,
               "described": [{"row": x.index, "predicted_s": x.predicted_s, "published_s": x.published_s,
                              "error": x.error} for x in described],
               "calibrated": [{"row": x.index, "predicted_s": x.predicted_s, "published_s": x.published_s,
                               "error": x.error} for x in calibrated]}
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

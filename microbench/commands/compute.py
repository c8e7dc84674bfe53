"""`microbench compute`: matmul TFLOP/s at a model's own shapes, for `compose --compute`."""

from __future__ import annotations

import argparse

from tabulate import tabulate

from ..compose.models import CrudeModel, from_hf_config, preset
from ..compose.report import format_time
from ..errors import ProbeUnavailable, UsageError
from ..probes import compute as cm
from ..units import parse_positive_int
from ..runner import run_probe
from .common import add_sweep_options, settings_from_args, write_outputs

# A CPU takes seconds per matmul at 4096 tokens. 256 reads low (here, a shared 2-core VM: 39 GFLOP/s
# at 256 rows vs 55 at 2048 for a 4096 x 4096 weight), so --tokens with the real shape is better.
CPU_TOKENS = 256


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="llama-3.1-8b", help="a composer preset whose shapes to time "
                   "(default llama-3.1-8b)")
    p.add_argument("--model-config", metavar="FILE", help="a Hugging Face config.json instead of --model")
    p.add_argument("--tokens", help=f"tokens per matmul (micro-batch x sequence; default 4096 on a GPU, "
                   f"{CPU_TOKENS} on a CPU)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="auto: cuda when torch sees a GPU, else cpu")
    p.add_argument("--dtype", choices=sorted(cm.DTYPE_BYTES), help="default bfloat16 on a GPU, float32 on a CPU")
    add_sweep_options(p, warmup=2, iters=10)


def _device(choice: str) -> tuple[str, str | None]:
    try:
        import torch
    except ImportError:
        raise ProbeUnavailable("compute: torch is not installed") from None
    from ..backends import cuda_usable

    have = cuda_usable()
    if choice == "cuda" and not have:
        raise ProbeUnavailable("compute: --device cuda but no CUDA device is visible to torch")
    if choice == "auto":
        return ("cuda", None) if have else ("cpu", "no CUDA device visible to torch: timing the CPU in float32")
    return choice, None


def run(args: argparse.Namespace) -> int:
    shape = from_hf_config(args.model_config) if args.model_config else preset(args.model)
    if isinstance(shape, CrudeModel):  # pragma: no cover - presets always have shapes
        raise UsageError("compute needs real shapes: --model NAME or --model-config FILE")
    device, why_cpu = _device(args.device)
    dtype = args.dtype or ("bfloat16" if device == "cuda" else "float32")
    tokens = (parse_positive_int(args.tokens, what="--tokens", example="4096") if args.tokens
              else (4096 if device == "cuda" else CPU_TOKENS))
    config = cm.Config(model=shape.name, hidden=shape.hidden, q_dim=shape.heads * shape.head_dim,
                       kv_dim=shape.kv_heads * shape.head_dim, ffn=shape.ffn, vocab=shape.vocab,
                       layers=shape.layers, experts=shape.experts, top_k=shape.top_k, tokens=tokens,
                       device=device, dtype=dtype)
    probe = cm.ComputeProbe(config)
    outcome = run_probe(probe, settings_from_args(args), config=config, json_path=args.json,
                        results_dir=args.results_dir)
    table = [(r["op"], r["m"], r["n"], r["k"], format_time(r["time_us"]["p50"] * 1e-6), f"{r['tflops']:.2f}",
              f"{r['per_block']:g}") for r in outcome.rows]
    print(tabulate(table, headers=["matmul", "m", "n", "k", "time p50", "TFLOP/s", "per block"], tablefmt="simple",
                   disable_numparse=True))
    impl = outcome.record["implementation"]
    achieved = outcome.record["summary"]["achieved_tflops"]
    print(f"# {shape.name} at {tokens} tokens, {dtype} on {impl.get('gpu') or device} ({impl['library']}): "
          f"{achieved:.2f} TFLOP/s weighted by a step's mix")
    if why_cpu:
        print(f"# {why_cpu}")
    if device == "cpu" and not args.tokens:
        print(f"# {CPU_TOKENS} tokens per matmul (the CPU default, which reads low): --tokens sets the training shape")
    print(f"# results: {outcome.path}  (use: microbench compose --compute {outcome.path} ...)")
    write_outputs(args, outcome)
    return 0

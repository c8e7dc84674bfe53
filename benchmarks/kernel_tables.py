"""Write a kernel efficiency table for the GPU this runs on: the file compose's per-kernel pricing
reads (microbench/compose/kernels/data/<gpu>.json has the same form), every value measured here.

    python benchmarks/kernel_tables.py --out h100.json [--gpu-name h100] [--peak-tflops 989 --memory-gbps 3350]

Measures, in bf16 with CUDA events (median of --iters after --warmup):
  matmul     torch.matmul at every (m, n, k) of the grid (m up to 16384, n and k up to 4096);
  attention  scaled_dot_product_attention forward and backward, causal and not, at head dims 64
             and 128 and sequences 512-16k, batch x sequence = 16k tokens, 2048 / head_dim heads
             (the FlashAttention papers' setup);
  memory     a device-to-device copy of 1 GiB: bytes read + written over time, as a fraction of
             --memory-gbps;
  overlap    a bf16 matmul (8192^3 and an MPT-13B MLP shape) alone, then while a copy kernel holds
             N SMs for its whole run, as NCCL's CTAs do beside FSDP's compute (one CTA per
             channel, never sharing an SM): N = --overlap-sms, NCCL's ring CTAs on one node and
             across nodes (24 and 16 on a DGX A100/H100 class node); the matmul's rate beside it
             over its rate alone is the table's overlap.compute_rate. Needs a CUDA device and Triton
             (the copy kernel is a Triton program per held SM); without them it is not measured,
             the table has no overlap section and the output says so.
Without a GPU it runs the same code on the CPU in float32 on a small grid and says so: a table
of this machine's CPU, for the tests, not one to ship. Nothing here looks at a training step.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

GPU_MATMUL = ([1024, 2048, 4096, 8192, 16384], [1024, 2048, 4096], [1024, 2048, 4096])
CPU_MATMUL = ([64, 128], [64, 128], [64, 128])
GPU_SEQ, CPU_SEQ = [512, 1024, 2048, 4096, 8192, 16384], [64, 128]
HEAD_DIMS = [64, 128]


def _sig(value: float) -> float:
    return float(f"{value:.4g}")


def timer(device: str, warmup: int, iters: int) -> Callable[[Callable[[], Any]], float]:
    import torch

    def seconds(fn: Callable[[], Any]) -> float:
        for _ in range(warmup):
            fn()
        samples = []
        for _ in range(iters):
            if device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - t0)
        return statistics.median(samples)
    return seconds


def measure(device: str, dtype: Any, grid: tuple, seqs: list[int], tokens: int, hidden: int,
            copy_bytes: int, seconds: Callable) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    ms, ns, ks = grid
    tflops = []
    for m in ms:
        plane = []
        for n in ns:
            row = []
            for k in ks:
                a, b = torch.randn(m, k, device=device, dtype=dtype), torch.randn(k, n, device=device, dtype=dtype)
                row.append(_sig(2 * m * n * k / seconds(lambda: torch.matmul(a, b)) / 1e12))
            plane.append(row)
        tflops.append(plane)
    att: dict[str, list[list[float]]] = {key: [] for key in ("fwd_tflops", "fwd_causal_tflops", "bwd_tflops",
                                                              "bwd_causal_tflops")}
    for d in HEAD_DIMS:
        lines: dict[str, list[float]] = {key: [] for key in att}
        for s in seqs:
            heads, batch = max(1, hidden // d), max(1, tokens // s)
            q, k, v = (torch.randn(batch, heads, s, d, device=device, dtype=dtype, requires_grad=True)
                       for _ in range(3))
            for causal in (False, True):
                flops = 4 * batch * heads * s * s * d / (2 if causal else 1)
                with torch.no_grad():
                    fwd = seconds(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                grad = torch.randn_like(out)
                bwd = seconds(lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True))
                tag = "_causal" if causal else ""
                lines[f"fwd{tag}_tflops"].append(_sig(flops / fwd / 1e12))
                lines[f"bwd{tag}_tflops"].append(_sig(2.5 * flops / bwd / 1e12))
        for key in att:
            att[key].append(lines[key])
    src = torch.empty(copy_bytes // 2, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy_gbps = 2 * copy_bytes / seconds(lambda: dst.copy_(src)) / 1e9
    return {"matmul": {"m": ms, "n": ns, "k": ks, "tflops": tflops}, "attention": {"head_dim": HEAD_DIMS,
            "seq_len": seqs, **att}, "copy_read_write_gbps": copy_gbps}


OVERLAP_SHAPES = ((8192, 8192, 8192), (16384, 20480, 5120))   # (m, n, k): a square GEMM, MPT-13B's MLP up


def measure_overlap(held_sms: list[int], warmup: int, iters: int) -> tuple[dict[int, float] | None, str]:
    """{SMs held: the matmuls' rate beside the holder / alone}, or None and why not. The holder
    is a Triton copy kernel of one program per held SM, launched first on its own stream and
    long enough to outlast the timed matmuls; each program is 32 warps moving 64 KiB per step,
    whose registers (16 values a thread and their addresses) leave an SM no room for a second
    program or a matmul's CTA (its registers per thread are printed to check)."""
    import torch

    if not torch.cuda.is_available():
        return None, "no CUDA device"
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None, "Triton is not installed (the SM-holding copy kernel is a Triton program)"

    @triton.jit
    def hold(src, dst, n_per_program, steps, BLOCK: tl.constexpr):
        base = tl.program_id(0) * n_per_program
        offs = tl.arange(0, BLOCK)
        for step in range(steps):
            start = (step * BLOCK) % n_per_program
            x = tl.load(src + base + start + offs)
            tl.store(dst + base + start + offs, x)

    block = 16384                                   # fp32: 64 KiB per step
    results: dict[int, float] = {}
    mats = [(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), torch.randn(k, n, device="cuda",
             dtype=torch.bfloat16)) for m, n, k in OVERLAP_SHAPES]

    def matmuls_s() -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            for a, b in mats:
                torch.matmul(a, b)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    for _ in range(warmup):
        matmuls_s()
    alone = min(matmuls_s() for _ in range(3))
    side = torch.cuda.Stream()
    for n in held_sms:
        per_program = block * 256
        src = torch.randn(n * per_program, device="cuda")
        dst = torch.empty_like(src)
        # long enough to outlast the timed matmuls several times over: a step per program moves
        # 128 KiB (read + write); at ~25 GB/s per SM that is ~5 us.
        steps = max(1000, int(4 * alone / 5e-6))
        with torch.cuda.stream(side):
            launched = hold[(n,)](src, dst, per_program, steps, BLOCK=block, num_warps=32)
        print(f"# overlap: copy kernel {n} programs x 32 warps, {getattr(launched, 'n_regs', '?')} registers a thread")
        beside = matmuls_s()
        still_running = not side.query()
        side.synchronize()
        if not still_running:
            return None, f"the copy kernel holding {n} SMs ended before the matmuls did; not measured"
        results[n] = round(alone / beside, 4)
    return results, ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="where to write the table (JSON)")
    p.add_argument("--gpu-name", help="the table's gpu key (default: from the device name, e.g. h100)")
    p.add_argument("--peak-tflops", type=float, help="datasheet dense bf16 TFLOP/s (default: compose's --gpu entry)")
    p.add_argument("--memory-gbps", type=float, help="datasheet memory bandwidth GB/s (default: compose's entry)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--overlap-sms", default="24,16",
                   help="SMs NCCL's CTAs hold on one node and across nodes (default 24,16: a DGX A100/H100 class "
                        "node's ring channels), the copy kernel holds each while the matmuls run")
    args = p.parse_args(argv)
    out = Path(args.out)
    if out.exists():
        print(f"kernel_tables: {out} exists; give a new --out", file=sys.stderr)
        return 2
    import torch

    from microbench.compose.hardware import GPUS
    from microbench.compose.kernels import parse_table

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda":
        name = torch.cuda.get_device_name(0)
        key = args.gpu_name or next((g for g in GPUS if g in name.lower().replace(" ", "")), name.lower())
        grid, seqs, tokens, hidden, copy_bytes, dtype = GPU_MATMUL, GPU_SEQ, 16384, 2048, 1 << 30, torch.bfloat16
    else:
        name, key = "CPU", args.gpu_name or "cpu"
        grid, seqs, tokens, hidden, copy_bytes, dtype = CPU_MATMUL, CPU_SEQ, 256, 256, 1 << 24, torch.float32
        print("# no CUDA device: measuring this CPU in float32 on a small grid (a table for the tests, not a GPU's)")
    gpu = GPUS.get(key)
    peak = args.peak_tflops or (gpu.peak_bf16_tflops if gpu else None)
    bandwidth = args.memory_gbps or (gpu.memory_gbps if gpu else None)
    data = measure(device, dtype, grid, seqs, tokens, hidden, copy_bytes, timer(device, args.warmup, args.iters))
    if peak is None or bandwidth is None:
        peak = peak or max(v for plane in data["matmul"]["tflops"] for row in plane for v in row)
        bandwidth = bandwidth or data["copy_read_write_gbps"]
        print(f"# {name}: no datasheet figures known, so peak {peak:.3g} TFLOP/s and bandwidth {bandwidth:.3g} GB/s "
              f"are the largest measured here (give --peak-tflops and --memory-gbps)")
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    source = (f"benchmarks/kernel_tables.py on {name} ({device}, {str(dtype).replace('torch.', '')}), torch "
              f"{torch.__version__}, {when}: median of {args.iters} after {args.warmup} warm-up")
    fraction = min(1.0, data["copy_read_write_gbps"] / bandwidth)
    table = {"gpu": key, "description": f"measured on {name}", "peak_bf16_tflops": peak, "memory_gbps": bandwidth,
             "matmul": {**data["matmul"], "source": source},
             "attention": {"default": "sdpa", "sdpa": {**data["attention"], "source": f"{source}; torch "
                                                       f"scaled_dot_product_attention, whichever backend it picked"}},
             "memory": {"fraction_of_peak": round(fraction, 4),
                        "source": f"{source}; a 1 GiB device copy at {data['copy_read_write_gbps']:.0f} GB/s read + "
                                  f"written"}}
    one_node, multi_node = (int(x) for x in args.overlap_sms.split(","))
    if device == "cuda":
        rates, why = measure_overlap([one_node, multi_node], args.warmup, args.iters)
    else:
        rates, why = None, "no CUDA device"
    if rates:
        table["overlap"] = {"compute_rate": {"one_node": rates[one_node], "multi_node": rates[multi_node]},
                            "source": f"{source}; bf16 matmuls {OVERLAP_SHAPES} beside a copy kernel holding "
                                      f"{one_node} (one node) and {multi_node} (across nodes) SMs, over alone"}
        print(f"# overlap: matmuls keep {rates[one_node]:.3f} of their rate beside {one_node} held SMs, "
              f"{rates[multi_node]:.3f} beside {multi_node}")
    else:
        print(f"# overlap: not measured ({why}); the table prices no compute lost beside collectives")
    parse_table(table, str(out))    # the loader's checks: no hole, nothing non-finite
    out.write_text(json.dumps(table, indent=1))
    att = data["attention"]
    print(f"# {name}: matmul {min(v for p in data['matmul']['tflops'] for r in p for v in r):.3g}-"
          f"{max(v for p in data['matmul']['tflops'] for r in p for v in r):.3g} TFLOP/s; attention causal fwd "
          f"{att['fwd_causal_tflops'][-1][0]:.3g}-{att['fwd_causal_tflops'][-1][-1]:.3g} TFLOP/s (head dim "
          f"{HEAD_DIMS[-1]}); copies {fraction:.3f} of {bandwidth:.0f} GB/s")
    print(f"# table: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

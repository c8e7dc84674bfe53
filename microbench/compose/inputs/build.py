"""What `microbench compose` is asked (ComposeOptions: the flags, parsed) turned into the
composer's inputs (ComposeInputs), each with where it came from: the records the flags name are
read and checked here, for their kind and their numbers, in the order the command's errors come in."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from ...core import registry
from ...core.errors import UsageError
from ...core.jsonfile import json_object
from ...results import load_record
from .. import fsdp, kernels
from ..calibration import Calibration, from_record
from ..checkpoint.full import DEFAULT_SERIALIZE_GBPS, serialize_from_record
from ..curves import Network, record_rows, synthetic_network
from ..hardware import Gpu, gpu as gpu_by_name
from ..model import CrudeModel, ModelShape, from_hf_config, preset
from ..sharding import inputs as two_level
from ..sharding.inputs import ShardingPlan
from ..tiers import Tier, described
from ..tiers.records import measured
from .parsers import DEFAULT_MFU
from .sections import ComposeOptions, Compute, Model, Training

Load = Callable[[str], dict[str, Any]]


def model(m: Model) -> ModelShape | CrudeModel:
    if m.params is not None and m.layers is not None:
        return CrudeModel("custom", m.params, m.layers)
    if m.model_config:
        return from_hf_config(m.model_config)
    return preset(m.model)


def ranks(t: Training, networks: list[Network]) -> tuple[int, int | None]:
    """(world size, nodes or None)."""
    nodes, per_node, world = t.nodes, t.gpus_per_node, t.ranks
    if world is not None and per_node is not None and world != (nodes or 1) * per_node:
        raise UsageError(f"--ranks {world} disagrees with --nodes {nodes or 1} x --gpus-per-node {per_node}; "
                         f"give one of them, e.g. --nodes 2 --gpus-per-node 8")
    if world is None and (nodes or per_node):
        world = (nodes or 1) * (per_node or 8)
    if world is not None and nodes and world % nodes:
        raise UsageError(f"--ranks {world} does not divide into --nodes {nodes}; expected a multiple, "
                         f"e.g. --ranks {nodes * max(1, world // nodes)} --nodes {nodes}")
    if world is None:
        measured_ranks = [n.all_gather.ranks for n in networks if n.all_gather.ranks]
        if not measured_ranks:
            raise UsageError("no world size: give --nodes and --gpus-per-node (e.g. --nodes 2 --gpus-per-node 8) "
                             "or --ranks 16")
        world = measured_ranks[0]
    return world, nodes


def _suite_record(directory: Path, use: str) -> Path | None:
    """The record in a suite directory whose step's probe feeds `use`, under the step's current
    or a former name (collectives.json in older suites)."""
    for path in sorted(directory.glob("*.json")):
        found = registry.suite_step(path.stem)
        if found and use in found[0].feeds:
            return path
    return None


def assumed_node(opts: ComposeOptions, gpu: Gpu | None) -> list[two_level.Level] | None:
    """(intra, inter) levels of the GPU's usual node, when a job of whole nodes (--nodes or
    --gpus-per-node) names no network at all; None otherwise (a network is then required)."""
    n, s, t = opts.network, opts.sharding, opts.training
    if n.nccl or n.net or s.net_intra or s.net_inter or gpu is None or not gpu.node_intra_gbps:
        return None
    if t.nodes is None and t.gpus_per_node is None:
        return None
    intra, inter = f"{gpu.node_intra_gbps:g}GB/s", f"{gpu.node_inter_gbps:g}GB/s"
    return [
        two_level.parse_level(intra, "--net-intra"),
        two_level.parse_level(f"{gpu.name}-node={inter}", "--net-inter"),
    ]


def networks(opts: ComposeOptions, for_gpus: bool, load: Load, gpu: Gpu | None = None) -> list[Network]:
    assumed = assumed_node(opts, gpu)
    if assumed is not None:
        return two_level.described(assumed[:1], assumed[1:])
    out: list[Network] = []
    for ref in opts.network.nccl:
        path = ref.path
        if Path(path).is_dir():
            path = str(_suite_record(Path(path), "network") or path)   # a suite's results directory
        out.append(two_level.record_network(load(path), ref.name or Path(path).stem, path,
                                            allow_partial=opts.network.allow_partial, for_gpus=for_gpus))
    out += [synthetic_network(n.name, n.busbw_gbps, n.latency_s, n.text) for n in opts.network.net]
    out += two_level.described(opts.sharding.net_intra, opts.sharding.net_inter)
    if not out:
        raise UsageError(
            "no network to predict over: give --net NAME=BUSBW (e.g. --net ib=40GB/s) or "
            "--nccl RECORD (a collective record or a suite directory, e.g. results/suite-20261122-031100), "
            "or --nodes with an h100/h200 --gpu for its usual node"
        )
    names = [n.name for n in out]
    if len(set(names)) != len(names):
        raise UsageError(
            f"network names repeat ({', '.join(names)}); name each, e.g. --nccl ib=results/suite-20261122-031100"
        )
    return out


@dataclass(frozen=True)
class ComputeRate:
    flops_per_rank: float
    source: str
    gpu: Gpu | None
    warning: str | None = None
    measured_model: str | None = None
    on_cpu: bool = False             # a compute record timed on a CPU, and no --gpu: predicting that CPU
    kernel_rows: list[dict[str, Any]] | None = None   # a GPU record's rows, for per-kernel rates


def compute_rate(c: Compute, allow_partial: bool, load: Load) -> ComputeRate:
    device = gpu_by_name(c.gpu) if c.gpu else None
    if c.compute:
        record = load(c.compute)
        spec = registry.for_record(record)
        if spec is None or "compute" not in spec.feeds:
            feeders = registry.feeding("compute")
            raise UsageError(f"--compute {c.compute!r} is a {record.get('kind')!r} record; expected one from "
                             + " or ".join(f"`microbench {' '.join(f.command)}` (kind {f.name!r})" for f in feeders))
        if record.get("status") != "complete" and not allow_partial:
            raise UsageError(f"--compute {c.compute!r} is a {record.get('status')!r} record; re-run "
                             f"`microbench compute`, or pass --allow-partial")
        record_rows(record, c.compute)
        tflops = (record.get("summary") or {}).get("achieved_tflops")
        if not isinstance(tflops, (int, float)) or not tflops > 0:
            raise UsageError(f"--compute {c.compute!r} has no summary.achieved_tflops; re-run `microbench compute`")
        impl = json_object(record.get("implementation"))
        dev = str(impl.get("gpu") or impl.get("device", "?"))
        warning = None
        if device is not None and impl.get("device") != "cuda":
            warning = (f"--compute {c.compute} was measured on {dev}, not on a {device.name}: its rate is what "
                       f"the prediction uses (--gpu only sizes memory and the optimizer step)")
        return ComputeRate(tflops * 1e12, f"measured: {c.compute} ({tflops:.3g} TFLOP/s on {dev})", device,
                           warning, str((record.get("summary") or {}).get("model") or ""),
                           on_cpu=device is None and impl.get("device") == "cpu",
                           kernel_rows=record.get("rows") if impl.get("device") == "cuda" else None)
    if c.tflops is not None:
        return ComputeRate(c.tflops * 1e12, f"--tflops {c.tflops:g}", device)
    if device is None:
        raise UsageError("no compute rate: give --gpu NAME (e.g. --gpu h100), --tflops 400, or --compute RECORD")
    mfu = DEFAULT_MFU if c.mfu is None else c.mfu
    return ComputeRate(device.peak_bf16_tflops * mfu * 1e12,
                       f"{device.name} peak {device.peak_bf16_tflops:g} TFLOP/s x MFU {mfu:g}", device)


def calibration(c: Compute, load: Load, gpu: Gpu | None) -> Calibration | None:
    """The --calibration record's numbers; a flag given on the command line wins over them. A
    compute scale measured on one GPU kind is refused for another, naming both."""
    if not c.calibration:
        return None
    cal = from_record(load(c.calibration), c.calibration)
    if cal.measured is not None:
        kernels.check_gpu(cal.measured, gpu.name if gpu else None, c.calibration)
    return cal


def train_spec(opts: ComposeOptions, world: int, rate: ComputeRate, cal: Calibration | None = None) -> fsdp.TrainSpec:
    # Predicting a CPU run (a CPU compute record, no --gpu): gloo shares the cores compute uses
    # and FSDP on a CPU reduces in float32. Anything else is a GPU with NCCL beside compute.
    t, c = opts.training, opts.compute
    cpu = rate.on_cpu
    if c.overlap is not None:
        overlap = c.overlap
    elif cal is not None and cal.overlap is not None:
        overlap = cal.overlap
    else:
        overlap = 0.0 if cpu else 1.0
    if c.unit_overhead is not None:
        unit_overhead = c.unit_overhead
    else:
        unit_overhead = cal.unit_overhead_s if cal is not None and cal.unit_overhead_s is not None else 0.0
    flops = rate.flops_per_rank
    if cal is not None and cal.compute_efficiency and c.compute and cal.device == ("cpu" if cpu else "cuda"):
        # A measured kernel rate on the calibration's kind of device: a real step also runs norms,
        # activations and the loss, which the calibration measured as this share of its time.
        flops *= cal.compute_efficiency
    return fsdp.TrainSpec(
        ranks=world, micro_batch=t.micro_batch, seq_len=t.seq_len, flops_per_rank=flops, grad_accum=t.grad_accum,
        param_dtype=t.param_dtype, reduce_dtype=t.reduce_dtype or ("float32" if cpu else "bfloat16"),
        activation_checkpointing=t.activation_checkpointing, reshard_after_forward=not t.no_reshard_after_forward,
        sync_every_microbatch=not t.defer_grad_sync, overlap=overlap, unit_overhead_s=unit_overhead,
        memory_gbps=rate.gpu.memory_gbps if rate.gpu else None)


def priced(opts: ComposeOptions, shape: Any, train: fsdp.TrainSpec, rate: ComputeRate, nodes: int,
           cal: Calibration | None) -> tuple[fsdp.TrainSpec, Any, Any]:
    """Compute priced per kernel on a GPU (kernels.priced_for, as the published-runs check prices
    it): (train, rates, table); a CPU's measured rate, a CPU record beside --gpu or a model
    without shapes keep the single rate (rates None)."""
    c = opts.compute
    if c.kernel_table and rate.gpu is None:
        raise UsageError(f"--kernel-table {c.kernel_table} prices a GPU's kernels: name the GPU, e.g. --gpu h100")
    table = kernels.load_table(c.kernel_table) if c.kernel_table else None
    if rate.gpu is None or (c.compute and rate.kernel_rows is None):
        return train, None, None
    scale = cal.compute_scale if cal is not None and cal.compute_scale else 1.0
    # the code around the attention kernel, whose copies the eager count prices: torch's SDPA,
    # or llm-foundry's call for the Triton kernel only its MPT runs
    train = replace(train, attention_call=kernels.attention_call(c.attention_impl, shape))
    return kernels.priced_for(shape, train, rate.gpu, nodes, tflops=c.tflops, mfu=c.mfu, record_rows=rate.kernel_rows,
                              record_path=c.compute or "", attention_impl=c.attention_impl, table=table, scale=scale)


def tiers(opts: ComposeOptions, load: Load) -> list[Tier]:
    """The described tiers (--tier), then the measured ones (--storage)."""
    out = described.resolve(opts.storage.tier)
    for ref in opts.storage.storage:
        out.append(measured(load(ref.path), ref.name, ref.path, allow_partial=opts.network.allow_partial))
    return out


def serialization(opts: ComposeOptions, load: Load) -> tuple[float, str]:
    """One process's serialization GB/s for a full save, and where it came from."""
    given = opts.storage.serialize_rate
    if given is not None and given.path is not None:
        return serialize_from_record(load(given.path), given.path)
    if given is not None and given.gbps is not None:
        return given.gbps, f"--serialize-rate {given.text}"
    return DEFAULT_SERIALIZE_GBPS, (f"assumed {DEFAULT_SERIALIZE_GBPS:g} GB/s (give --serialize-rate GB/S or a "
                                    f"`checkpoint --state-dict full` record)")


@dataclass
class ComposeInputs:
    """Everything the composer predicts from, parsed and checked."""
    options: ComposeOptions              # as asked, typed (the record's resolved options)
    model: ModelShape | CrudeModel
    rate: ComputeRate
    networks: list[Network]
    world: int
    nodes: int | None
    calibration: Calibration | None
    train: fsdp.TrainSpec
    tiers: list[Tier]
    mtbf_s: float | None
    interval_s: float
    overhead: float
    # Saves as trainers write them (compose/checkpoint/full.py): which state dicts, one process's
    # serialization rate and its source, host memory on rank 0's node.
    state_dicts: list[str]
    serialize_gbps: float
    serialize_source: str
    host_memory_bytes: float | None
    sharding: ShardingPlan | None        # the sharding what-if, when asked
    load: Load = load_record             # how the records named by the loading and job flags are read
    rates: Any = None                    # compute priced per kernel (kernels.Rates), or None: one rate
    kernel_table: Any = None             # the kernel table behind the rates
    assumed_network: str | None = None   # the GPU's usual node, when no network was named


def build(opts: ComposeOptions, load: Load = load_record) -> ComposeInputs:
    """The inputs of `opts`, read and checked in the order the command's errors come in."""
    shape = model(opts.model)
    rate = compute_rate(opts.compute, opts.network.allow_partial, load)
    nets = networks(opts, not rate.on_cpu, load, rate.gpu)
    world, nodes = ranks(opts.training, nets)
    nets = two_level.for_job(nets, world, nodes)   # the full-sharding view at this job's ranks per node
    cal = calibration(opts.compute, load, rate.gpu)
    train = train_spec(opts, world, rate, cal)
    train, rates, table = priced(opts, shape, train, rate, nodes or max(1, world // 8), cal)
    tier_list = tiers(opts, load)
    s = opts.storage
    mtbf_s = s.mtbf_hours * 3600 if s.mtbf_hours is not None else None
    serialize_gbps, serialize_source = serialization(opts, load)
    plan = two_level.plan(opts.sharding.sharding, opts.sharding.scale_nodes, nets, world, nodes)
    assumed = assumed_node(opts, rate.gpu)
    return ComposeInputs(opts, shape, rate, nets, world, nodes, cal, train, tier_list, mtbf_s, s.ckpt_interval,
                         s.ckpt_overhead, list(s.state_dict), serialize_gbps, serialize_source,
                         s.host_memory, plan, load, rates, table,
                         rate.gpu.node_source if assumed is not None and rate.gpu else None)

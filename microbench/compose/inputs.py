"""What `microbench compose` is asked (ComposeRequest: the values as described, each a flag of the
command) turned into the composer's inputs (ComposeInputs), each with where it came from.
Every number goes through core/units (no NaN, no inf); every file is checked for its kind."""

from __future__ import annotations

import re
from pathlib import Path
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import compose as cp
from ..core import registry
from .calibration import Calibration, from_record
from .curves import Network, record_rows, synthetic_network
from .sharding import inputs as two_level  # issue 24: two networks and sharding
from .hardware import Gpu, gpu as gpu_by_name
from .model import CrudeModel, ModelShape, from_hf_config, preset
from .tiers.records import tier_bandwidths, tier_stream_gbps
from .checkpoint.full import split_stream
from .checkpoint import mount as mount_tier
from .tiers import options as tier_options
from ..core.errors import UsageError
from ..results import load_record
from ..core.units import (parse_bandwidth_bytes_per_s, parse_duration_s, parse_number, parse_positive, parse_positive_int)

MAX_PARAMS = 1e15     # a thousand times today's largest models; beyond it a typo, not a plan
MAX_TFLOPS = 1e5      # 100 PFLOP/s per rank
DEFAULT_MFU = 0.4


@dataclass
class ComposeRequest:
    """A prediction's inputs as described: values as text (parsed here, so every caller gets the
    same checks and messages), paths of records, or both. Field names are compose's flags."""
    model: str = "llama-3.1-8b"
    model_config: str | None = None
    params: str | None = None
    layers: str | None = None
    nodes: str | None = None
    gpus_per_node: str | None = None
    ranks: str | None = None
    micro_batch: str = "1"
    seq_len: str = "4096"
    grad_accum: str = "1"
    param_dtype: str = "bfloat16"
    reduce_dtype: str | None = None
    activation_checkpointing: bool = False
    no_reshard_after_forward: bool = False
    gpu: str | None = None
    mfu: str = str(DEFAULT_MFU)
    tflops: str | None = None
    compute: str | None = None          # a compute record's path
    overlap: str | None = None
    unit_overhead: str | None = None
    calibration: str | None = None      # a calibration record's path
    nccl: list[str] = field(default_factory=list)
    net: list[str] = field(default_factory=list)
    # issue 24: two networks and sharding (compose/sharding/inputs.py)
    net_intra: list[str] = field(default_factory=list)    # [NAME=]BUSBW[@LATENCY] inside a node
    net_inter: list[str] = field(default_factory=list)    # [NAME=]BW[@LATENCY]: one node's NICs
    sharding: str | None = None                           # full,hybrid,hybrid:G
    scale_nodes: str | None = None                        # 2,8,64
    allow_partial: bool = False
    tier: list[str] = field(default_factory=list)
    storage: list[str] = field(default_factory=list)
    state_dict: str = "sharded"
    save_format: str | None = None
    serialize_rate: str | None = None
    host_memory: str | None = None
    mtbf_hours: str | None = None
    ckpt_interval: str = "30min"
    ckpt_overhead: str = "5%"
    dataload: list[str] = field(default_factory=list)     # dataload records' paths, [NAME=]PATH
    data_rate: list[str] = field(default_factory=list)    # described loader rates, NAME=SAMPLES/S
    sample_bytes: str | None = None
    modelload: list[str] = field(default_factory=list)    # modelload records' paths, [NAME=]PATH
    # issue 23: the whole job (compose/job/inputs.py); no --steps/--tokens: no job
    steps: str | None = None
    tokens: str | None = None
    ckpt_every: str | None = None
    async_ckpt: bool = False
    data: str | None = None             # comma lists of tier names; None: every tier the inputs allow
    model_from: str | None = None
    ckpt_to: str | None = None


def model(req: ComposeRequest) -> ModelShape | CrudeModel:
    if req.params or req.layers:
        if not (req.params and req.layers):
            raise UsageError("--params and --layers go together, e.g. --params 7e9 --layers 32")
        if req.model_config:
            raise UsageError("--model-config and --params/--layers describe the model twice; give one")
        return CrudeModel("custom", parse_positive(req.params, what="--params", example="7e9", maximum=MAX_PARAMS),
                          parse_positive_int(req.layers, what="--layers", example="32"))
    if req.model_config:
        return from_hf_config(req.model_config)
    return preset(req.model)


def ranks(req: ComposeRequest, networks: list[Network]) -> tuple[int, int | None]:
    """(world size, nodes or None)."""
    nodes = parse_positive_int(req.nodes, what="--nodes", example="2") if req.nodes else None
    per_node = parse_positive_int(req.gpus_per_node, what="--gpus-per-node", example="8") if req.gpus_per_node else None
    world = parse_positive_int(req.ranks, what="--ranks", example="16") if req.ranks else None
    if world is not None and per_node is not None and world != (nodes or 1) * per_node:
        raise UsageError(f"--ranks {world} disagrees with --nodes {nodes or 1} x --gpus-per-node {per_node}; "
                         f"give one of them, e.g. --nodes 2 --gpus-per-node 8")
    if world is None and (nodes or per_node):
        world = (nodes or 1) * (per_node or 8)
    if world is not None and nodes and world % nodes:
        raise UsageError(f"--ranks {world} does not divide into --nodes {nodes}; expected a multiple, "
                         f"e.g. --ranks {nodes * max(1, world // nodes)} --nodes {nodes}")
    if world is None:
        measured = [n.all_gather.ranks for n in networks if n.all_gather.ranks]
        if not measured:
            raise UsageError("no world size: give --nodes and --gpus-per-node (e.g. --nodes 2 --gpus-per-node 8) "
                             "or --ranks 16")
        world = measured[0]
    return world, nodes


def _suite_record(directory: Path, use: str) -> Path | None:
    """The record in a suite directory whose step's probe feeds `use`, under the step's current
    or a former name (collectives.json in older suites)."""
    for path in sorted(directory.glob("*.json")):
        found = registry.suite_step(path.stem)
        if found and use in found[0].feeds:
            return path
    return None


def networks(req: ComposeRequest, for_gpus: bool) -> list[Network]:
    out: list[Network] = []
    for text in req.nccl:
        name, sep, path = text.partition("=")
        if not sep or "/" in name or name.endswith(".json"):
            name, path = "", text
        if Path(path).is_dir():
            path = str(_suite_record(Path(path), "network") or path)   # a suite's results directory
        record = load_record(path)
        out.append(two_level.record_network(record, name or Path(path).stem, path,   # node, cross groups: issue 24
                                            allow_partial=req.allow_partial, for_gpus=for_gpus))
    for text in req.net:
        name, sep, spec = text.partition("=")
        if not sep or not name or not spec:
            raise UsageError(f"invalid --net {text!r}: expected NAME=BUSBW[@LATENCY], e.g. --net ib=40GB/s@30us")
        rate, _, latency = spec.partition("@")
        busbw = parse_bandwidth_bytes_per_s(rate, what=f"--net {name} bus bandwidth") / 1e9
        lat = parse_duration_s(latency, what=f"--net {name} latency", example="30us") if latency else 0.0
        out.append(synthetic_network(name, busbw, lat, text))
    out += two_level.described(req.net_intra, req.net_inter)   # issue 24
    if not out:
        raise UsageError("no network to predict over: give --net NAME=BUSBW (e.g. --net ib=40GB/s) or "
                         "--nccl RECORD (a collective record or a suite directory, e.g. results/suite-20261122-031100)")
    names = [n.name for n in out]
    if len(set(names)) != len(names):
        raise UsageError(f"network names repeat ({', '.join(names)}); name each, e.g. --nccl ib=results/suite-20261122-031100")
    return out


@dataclass(frozen=True)
class ComputeRate:
    flops_per_rank: float
    source: str
    gpu: Gpu | None
    warning: str | None = None
    measured_model: str | None = None
    on_cpu: bool = False             # a compute record timed on a CPU, and no --gpu: predicting that CPU


def compute_rate(req: ComposeRequest) -> ComputeRate:
    device = gpu_by_name(req.gpu) if req.gpu else None
    if req.compute:
        record = load_record(req.compute)
        spec = registry.for_record(record)
        if spec is None or "compute" not in spec.feeds:
            feeders = registry.feeding("compute")
            raise UsageError(f"--compute {req.compute!r} is a {record.get('kind')!r} record; expected one from "
                             + " or ".join(f"`microbench {' '.join(f.command)}` (kind {f.name!r})" for f in feeders))
        if record.get("status") != "complete" and not req.allow_partial:
            raise UsageError(f"--compute {req.compute!r} is a {record.get('status')!r} record; re-run "
                             f"`microbench compute`, or pass --allow-partial")
        record_rows(record, req.compute)
        tflops = (record.get("summary") or {}).get("achieved_tflops")
        if not isinstance(tflops, (int, float)) or not tflops > 0:
            raise UsageError(f"--compute {req.compute!r} has no summary.achieved_tflops; re-run `microbench compute`")
        impl = record.get("implementation") if isinstance(record.get("implementation"), dict) else {}
        dev = str(impl.get("gpu") or impl.get("device", "?"))
        warning = None
        if device is not None and impl.get("device") != "cuda":
            warning = (f"--compute {req.compute} was measured on {dev}, not on a {device.name}: its rate is what "
                       f"the prediction uses (--gpu only sizes memory and the optimizer step)")
        return ComputeRate(tflops * 1e12, f"measured: {req.compute} ({tflops:.3g} TFLOP/s on {dev})", device,
                           warning, str((record.get("summary") or {}).get("model") or ""),
                           on_cpu=device is None and impl.get("device") == "cpu")
    if req.tflops:
        tflops = parse_positive(req.tflops, what="--tflops", example="400", maximum=MAX_TFLOPS)
        return ComputeRate(tflops * 1e12, f"--tflops {tflops:g}", device)
    if device is None:
        raise UsageError("no compute rate: give --gpu NAME (e.g. --gpu h100), --tflops 400, or --compute RECORD")
    mfu = parse_number(req.mfu, what="--mfu", example="0.4", minimum=0, allow_minimum=False, maximum=1)
    return ComputeRate(device.peak_bf16_tflops * mfu * 1e12,
                       f"{device.name} peak {device.peak_bf16_tflops:g} TFLOP/s x MFU {mfu:g}", device)


def _tier_rate(text: str, rate: str, which: str) -> float:
    try:
        if re.search(r"[a-zA-Z/]", rate) and not re.fullmatch(r"\s*[0-9.eE+-]+\s*", rate):
            return parse_bandwidth_bytes_per_s(rate, what="--tier") / 1e9
        return parse_positive(rate, what="--tier", example="nvme=6:12")
    except UsageError:
        raise UsageError(f"invalid --tier {text!r}: the {which} bandwidth {rate!r} must be a positive finite "
                         f"number of GB/s, e.g. --tier nvme=6:12") from None


def tiers(req: ComposeRequest) -> list[dict[str, Any]]:
    out, mounts = [], []
    for text in req.tier:
        base, stream = split_stream(text)   # ,stream=GB/S: one writer's rate (compose/checkpoint/full.py)
        base, durable = tier_options.split_durability(text, base)   # issue 23: ,ephemeral
        name, _, rates = base.partition("=")
        rates, _, mount_options = rates.partition(",")   # a bucket mount: ,cached,drain=GB/S (compose/checkpoint/mount.py)
        write, _, read = rates.partition(":")
        if not name or not write:
            raise UsageError(f"invalid --tier {text!r}: expected NAME=WRITE_GBPS[:READ_GBPS][,stream=GB/S], e.g. nvme=6:12")
        out.append({"tier": name, "write_gbps": _tier_rate(text, write, "write"),
                    "read_gbps": _tier_rate(text, read, "read") if read else None, "source": f"--tier {text}",
                    "stream_gbps": _tier_rate(text, stream, "single-stream") if stream else None,
                    "rated_only": stream is None and not mount_options, "aggregate_is_job": True, "durable": durable})
        if mount_options:
            mounts.append((out[-1], text, mount_options))
    local = tier_options.local_cache(out)   # where a cached mount without drain= caches (compose/tiers/options.py)
    for tier, text, mount_options in mounts:
        tier_options.attach_mount(tier, text, mount_options, local)
    for text in req.storage:
        name, sep, path = text.partition("=")
        if not sep or "/" in name or name.endswith(".json"):
            name, path = "", text
        record = load_record(path)
        record_rows(record, path)
        if record.get("status") != "complete" and not req.allow_partial:
            raise UsageError(f"--storage {path!r} is a {record.get('status')!r} record; re-run it, or pass --allow-partial")
        write, read = tier_bandwidths(record, path)
        out.append({"tier": name or str(record.get("kind")), "write_gbps": write, "read_gbps": read,
                    "source": f"measured: {path}", "stream_gbps": tier_stream_gbps(record), "rated_only": False,
                    "aggregate_is_job": False})
        measured_mount = mount_tier.from_record(record, out[-1]["tier"], path)
        if measured_mount is not None:
            out[-1]["mount"] = asdict(measured_mount)
    return out


def overhead_fraction(text: str) -> float:
    raw = str(text).strip()
    value = parse_number(raw.rstrip("%"), what="--ckpt-overhead", example="5%", minimum=0, allow_minimum=False,
                         maximum=100 if raw.endswith("%") else 1, allow_maximum=False)
    return value / 100 if raw.endswith("%") else value


def calibration(req: ComposeRequest) -> Calibration | None:
    """The --calibration record's numbers; a flag given on the command line wins over them."""
    return from_record(load_record(req.calibration), req.calibration) if req.calibration else None


def train_spec(req: ComposeRequest, world: int, rate: ComputeRate,
               cal: Calibration | None = None) -> cp.TrainSpec:
    # Predicting a CPU run (a CPU compute record, no --gpu): gloo shares the cores compute uses
    # and FSDP on a CPU reduces in float32. Anything else is a GPU with NCCL beside compute.
    cpu = rate.on_cpu
    if req.overlap is not None:
        overlap = parse_number(req.overlap, what="--overlap", example="1", minimum=0, maximum=1)
    elif cal is not None and cal.overlap is not None:
        overlap = cal.overlap
    else:
        overlap = 0.0 if cpu else 1.0
    if req.unit_overhead is not None:
        unit_overhead = parse_duration_s(req.unit_overhead, what="--unit-overhead", example="200us")
    else:
        unit_overhead = cal.unit_overhead_s if cal is not None and cal.unit_overhead_s is not None else 0.0
    reduce_dtype = req.reduce_dtype or ("float32" if cpu else "bfloat16")
    flops = rate.flops_per_rank
    if cal is not None and cal.compute_efficiency and req.compute and cal.device == ("cpu" if cpu else "cuda"):
        # A measured kernel rate on the calibration's kind of device: a real step also runs norms,
        # activations and the loss, which the calibration measured as this share of its time.
        flops *= cal.compute_efficiency
    return cp.TrainSpec(
        ranks=world,
        micro_batch=parse_positive_int(req.micro_batch, what="--micro-batch", example="1"),
        seq_len=parse_positive_int(req.seq_len, what="--seq-len", example="4096"),
        flops_per_rank=flops,
        grad_accum=parse_positive_int(req.grad_accum, what="--grad-accum", example="4"),
        param_dtype=req.param_dtype, reduce_dtype=reduce_dtype,
        activation_checkpointing=req.activation_checkpointing,
        reshard_after_forward=not req.no_reshard_after_forward,
        overlap=overlap, unit_overhead_s=unit_overhead, memory_gbps=rate.gpu.memory_gbps if rate.gpu else None)


def save_inputs(req: "ComposeRequest") -> tuple[list[str], float, str, float | None]:
    """(state dicts, serialization GB/s, its source, host memory bytes or None) for the saves table."""
    from .checkpoint.full import DEFAULT_SERIALIZE_GBPS, parse_state_dicts, save_format, serialize_from_record
    from ..core.units import parse_size

    state_dicts = parse_state_dicts(req.state_dict)
    for sd in state_dicts:
        save_format(sd, req.save_format)
    text = req.serialize_rate
    if text and Path(text).is_file():
        gbps, source = serialize_from_record(load_record(text), text)
    elif text:
        try:
            gbps = _tier_rate(text, text, "serialization")
        except UsageError:
            raise UsageError(f"invalid --serialize-rate {text!r}: expected GB/s (e.g. 2 or 2GB/s) or a "
                             f"`microbench checkpoint --state-dict full` record") from None
        source = f"--serialize-rate {text}"
    else:
        gbps, source = DEFAULT_SERIALIZE_GBPS, (f"assumed {DEFAULT_SERIALIZE_GBPS:g} GB/s (give --serialize-rate "
                                                f"GB/S or a `checkpoint --state-dict full` record)")
    host = parse_size(req.host_memory, what="--host-memory") if req.host_memory else None
    return state_dicts, gbps, source, host


@dataclass
class ComposeInputs:
    """Everything the composer predicts from, parsed and checked."""
    model: ModelShape | CrudeModel
    rate: ComputeRate
    networks: list[Network]
    world: int
    nodes: int | None
    calibration: Calibration | None
    train: cp.TrainSpec
    tiers: list[dict[str, Any]]
    mtbf_s: float | None
    interval_s: float
    overhead: float
    # Saves as trainers write them (compose/checkpoint/full.py): which state dicts, one process's
    # serialization rate and its source, host memory on rank 0's node.
    state_dicts: list[str]
    serialize_gbps: float
    serialize_source: str
    host_memory_bytes: float | None


def build(req: ComposeRequest) -> ComposeInputs:
    """The inputs of `req`, read and checked in the order the command's errors come in."""
    shape = model(req)
    rate = compute_rate(req)
    nets = networks(req, for_gpus=not rate.on_cpu)
    world, nodes = ranks(req, nets)
    nets = two_level.for_job(nets, world, nodes)   # issue 24: the full-sharding view at this job's ranks per node
    cal = calibration(req)
    train = train_spec(req, world, rate, cal)
    tier_list = tiers(req)
    mtbf_s = parse_positive(req.mtbf_hours, what="--mtbf-hours", example="24") * 3600 if req.mtbf_hours else None
    interval_s = parse_duration_s(req.ckpt_interval, what="--ckpt-interval", example="30min", allow_zero=False)
    overhead = overhead_fraction(req.ckpt_overhead)
    state_dicts, serialize_gbps, serialize_source, host_memory = save_inputs(req)
    return ComposeInputs(shape, rate, nets, world, nodes, cal, train, tier_list, mtbf_s, interval_s, overhead,
                         state_dicts, serialize_gbps, serialize_source, host_memory)

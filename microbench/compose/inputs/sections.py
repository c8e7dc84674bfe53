"""`microbench compose`'s flags, declared once (core/sections.py): one section per --help group,
each field a flag with its default, its help and its parser (parsers.py). Every value is parsed
when argv is read, so misuse is refused before anything is read or printed; the files a flag
names are read by build.py. A new composer input is one field here and its parser.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ...core.errors import UsageError
from ...core.options import option
from ...core.units import DTYPE_BYTES
from ..checkpoint import full as fs
from ..dataload import DataRate
from ..hardware import GPUS
from ..model import PRESETS
from ..sharding.inputs import Level, parse_level
from ..sharding.predict import Strategy
from ..tiers import described
from .parsers import (
    DEFAULT_MFU,
    MAX_GPUS_PER_NODE,
    MAX_GRAD_ACCUM,
    MAX_LAYERS,
    MAX_MICRO_BATCH,
    MAX_NODES,
    MAX_RANKS,
    MAX_SEQ_LEN,
    MAX_STEPS,
    DescribedNet,
    NamedRecord,
    SerializeRate,
    Typed,
    checkpointing,
    count,
    data_rate,
    duration,
    fraction,
    gpu_name,
    hours,
    mfu,
    model_name,
    named_record,
    net,
    node_counts,
    overhead_fraction,
    params,
    sample_bytes,
    save_format,
    serialize_rate,
    sharding,
    size,
    state_dicts,
    step_seconds,
    tflops,
    tier_names,
    tokens,
)


@dataclass
class Model:
    TITLE: ClassVar[str] = "model"
    model: str = option("llama-3.1-8b", parse=model_name, help=f"a preset with real shapes: {', '.join(PRESETS)}")
    model_config: str | None = option(None, metavar="FILE", shown="none: --model's preset",
                                      help="a Hugging Face config.json or its model directory (text_config inside is "
                                           "read too); read from disk, no network")
    params: float | None = option(None, parse=params, shown="none: the model's shapes",
                                  help="crude escape hatch: total parameters, e.g. 7e9 (with --layers)")
    layers: int | None = option(None, parse=count("32", MAX_LAYERS), shown="none: the model's shapes",
                                help="crude escape hatch: blocks (FSDP units), e.g. 32 (with --params)")

    def check(self) -> None:
        if self.params is not None or self.layers is not None:
            if self.params is None or self.layers is None:
                raise UsageError("--params and --layers go together, e.g. --params 7e9 --layers 32")
            if self.model_config:
                raise UsageError("--model-config and --params/--layers describe the model twice; give one")


@dataclass
class Training:
    TITLE: ClassVar[str] = "training"
    nodes: int | None = option(None, parse=count("2", MAX_NODES), shown="1 with --gpus-per-node", help="nodes")
    gpus_per_node: int | None = option(None, parse=count("8", MAX_GPUS_PER_NODE), shown="8 with --nodes",
                                       help="ranks per node")
    ranks: int | None = option(None, parse=count("16", MAX_RANKS), shown="the record's",
                               help="world size, instead of --nodes x --gpus-per-node")
    micro_batch: int = option(1, parse=count("1", MAX_MICRO_BATCH), help="sequences per rank per micro-batch")
    seq_len: int = option(4096, parse=count("4096", MAX_SEQ_LEN), help="tokens per sequence")
    grad_accum: int = option(1, parse=count("4", MAX_GRAD_ACCUM), help="micro-batches per optimizer step")
    param_dtype: str = option("bfloat16", choices=tuple(sorted(DTYPE_BYTES)),
                              help="what AllGather moves and compute uses")
    reduce_dtype: str | None = option(
        None,
        choices=tuple(sorted(DTYPE_BYTES)),
        shown="bfloat16, as FSDP2 mixed precision is usually set; float32 when predicting "
        "a CPU: a --compute record timed on a CPU and no --gpu",
        help="what ReduceScatter moves",
    )
    activation_checkpointing: str = option("none", parse=checkpointing, bare="full", metavar="MODE",
                                           help="none; full (each block's forward again in backward: the bare flag); "
                                                "blocks:F (a fraction F of the blocks, torchtitan's selective layer "
                                                "every second block is blocks:0.5); ops (torchtitan's op-level policy: "
                                                "matmul and attention outputs kept, but every second matmul)")
    defer_grad_sync: bool = option(False, switch=True, shown="off",
                                   help="reduce-scatter the gradients once, on the last micro-batch (FSDP2's "
                                        "set_requires_gradient_sync(False) on the others; the unsharded gradients "
                                        "stay in memory)")
    no_reshard_after_forward: bool = option(False, switch=True, shown="off",
                                            help="keep blocks gathered from forward to backward (no second AllGather, "
                                                 "more memory)")


@dataclass
class Compute:
    TITLE: ClassVar[str] = "compute (optimizer: AdamW)"
    gpu: str | None = option(None, parse=gpu_name, shown="none: give --tflops or --compute",
                             help=f"accelerator: {', '.join(GPUS)} (peak dense bf16, memory size and bandwidth for the "
                                  f"memory check and the optimizer step; with a model of real shapes, compute priced "
                                  f"per kernel at its kernel table's rates, h100 and a100)")
    mfu: float | None = option(None, parse=mfu, shown=f"{DEFAULT_MFU:g} where --gpu has no kernel table; h100 and a100 "
                                                      f"price each kernel at its table's rate",
                               help="achieved fraction of --gpu's peak, for every matmul and attention")
    tflops: float | None = option(None, parse=tflops, shown="none: --gpu x --mfu",
                                  help="achieved TFLOP/s per rank, instead of --gpu x --mfu, e.g. 400")
    compute: str | None = option(None, metavar="RECORD", shown="none: --gpu x --mfu or --tflops",
                                 help="a `microbench compute` record: the rate measured for the model's matmuls on a "
                                      "device, instead of --tflops or --mfu")
    overlap: float | None = option(None, parse=fraction,
                                   shown="1 on GPUs, where NCCL runs beside compute; 0 when predicting a CPU, where "
                                         "gloo competes for the cores; or the --calibration's",
                                   help="fraction of communication that can run beside compute, 0..1")
    unit_overhead: float | None = option(None, parse=duration("200us"), metavar="DURATION",
                                         shown="0, or the calibration's",
                                         help="FSDP's own cost per unit per pass (copy-in/out, hooks), never hidden, "
                                              "e.g. 200us")
    calibration: str | None = option(None, metavar="RECORD", shown="none",
                                     help="a `microbench compose ... --measured-step` record (its scale on compute "
                                          "rates, for the same --gpu kind) or a `microbench verify --calibrate-only` "
                                          "record (its measured overlap and per-unit overhead; flags given here win)")
    measured_step: float | None = option(None, parse=step_seconds, metavar="SECONDS", shown="none",
                                         help="the optimizer step a trainer measured on this configuration (its "
                                              "--gpu, nodes, micro-batch, sequence, network): prints the scale on "
                                              "compute rates that reproduces it and keeps it in the record, for "
                                              "--calibration elsewhere, e.g. 2.8")
    attention_impl: str | None = option(None, choices=("flash2", "flash1", "triton"),
                                        shown="the kernel table's default (flash2)",
                                        help="the attention kernel the trainer runs, priced at its own rates: flash2 "
                                             "(FlashAttention-2, SDPA's flash backend), flash1, triton (llm-foundry's "
                                             "Triton FlashAttention)")
    kernel_table: str | None = option(None, metavar="FILE", shown="the one shipped for --gpu",
                                      help="a kernel efficiency table measured with benchmarks/kernel_tables.py on "
                                           "the GPU, instead of the shipped one")

    def check(self) -> None:
        if self.measured_step is not None and self.calibration:
            raise UsageError(f"--measured-step {self.measured_step:g} makes a calibration and --calibration "
                             f"{self.calibration} applies one; give one of them")
        given = [f for f, v in (("--compute", self.compute), ("--tflops", self.tflops), ("--mfu", self.mfu))
                 if v is not None]
        if len(given) > 1:
            raise UsageError(f"{' and '.join(given)} both set the compute rate; give one, e.g. --gpu h100 --mfu 0.4, "
                             f"or --tflops 400, or --compute RECORD")


@dataclass
class Network:
    TITLE: ClassVar[str] = "network (one or more; several give a what-if table)"
    nccl: list[NamedRecord] = option([], parse=named_record, repeat=True, metavar="[NAME=]RECORD", shown="none",
                                     help="a `microbench nccl` record with all_gather and reduce_scatter rows (or a "
                                          "suite directory), e.g. results/suite-*/collectives.json; at another world "
                                          "size it is rescaled (repeatable)")
    net: list[DescribedNet] = option([], parse=net, repeat=True, metavar="NAME=BUSBW[@LATENCY]", shown="none",
                                     help="a described network: the bus bandwidth (nccl-tests busbw) the job's "
                                          "collectives reach, with units, and the per-collective latency (default 0), "
                                          "e.g. --net ib=40GB/s@30us")
    allow_partial: bool = option(False, switch=True, shown="off", help="accept records whose run did not finish")


@dataclass
class Sharding:
    TITLE: ClassVar[str] = "two networks and sharding (a node's GPUs, and the nodes)"
    net_intra: list[Level] = option([], parse=parse_level, repeat=True, metavar="[NAME=]BUSBW[@LATENCY]", shown="none",
                                    help="the bus bandwidth of a collective among one node's GPUs (NVLink), e.g. "
                                         "360GB/s; with --net-inter, full sharding across nodes is costed on both")
    net_inter: list[Level] = option([], parse=parse_level, repeat=True, metavar="[NAME=]BW[@LATENCY]", shown="none",
                                    help="one node's bandwidth to the others, all its NICs together, e.g. eth=1.25GB/s "
                                         "(10 Gbit Ethernet) or ib=400GB/s@10us (8 x 400G); repeatable: a what-if "
                                         "over the NICs")
    sharding: tuple[Strategy, ...] | None = option(None, parse=sharding, metavar="full|hybrid|hybrid:G",
                                                   shown="none: the step table's full sharding alone",
                                                   help="the what-if over strategies, comma-separated: full (every "
                                                        "rank shards), hybrid (shard inside a node, replicate across "
                                                        "nodes: HSDP), hybrid:G (shard over G ranks), e.g. full,hybrid")
    scale_nodes: tuple[int, ...] | None = option(None, parse=node_counts, metavar="N,N,...",
                                                 shown="none: the job's node count alone",
                                                 help="the sharding what-if also at these node counts, from the same "
                                                      "curves (fitted latency and bandwidth per level), e.g. 2,8,64")


@dataclass
class Storage:
    TITLE: ClassVar[str] = "checkpoint"
    tier: list[described.DescribedTier] = option(
        [], parse=described.parse, repeat=True, metavar="NAME=WRITE[:READ]", shown="none",
        help="a storage tier by the aggregate GB/s the job gets, e.g. --tier nvme=6:12; ,ephemeral: not durable (a "
             "node-local disk); a bucket mount adds ,direct or ,cached,drain=GB/S[,delay=5s], or ,cached alone: "
             "WRITE:READ are the bucket's, the cache is cache=GB/S or the fastest ephemeral tier (repeatable)")
    storage: list[NamedRecord] = option([], parse=named_record, repeat=True, metavar="[NAME=]RECORD", shown="none",
                                        help="a storage or checkpoint record as a tier (its best write and read), e.g. "
                                             "results/suite-*/storage-posix.json (repeatable)")
    state_dict: list[str] = option(["sharded"], parse=state_dicts, metavar="STATE_DICT",
                                   help="sharded (a DCP save, every rank at once), full (gathered to rank 0, one "
                                        "process writes: Accelerate/Trainer's FULL_STATE_DICT) or full,sharded")
    save_format: str | None = option(None, parse=save_format, shown="dcp for sharded, torch for full",
                                     help="dcp (sharded), torch or safetensors (full)")
    serialize_rate: SerializeRate | None = option(None, parse=serialize_rate, metavar="GB/S|RECORD",
                                                  shown="2 GB/s, assumed",
                                                  help="one process's torch.save rate, or a `checkpoint --state-dict "
                                                       "full` record")
    host_memory: int | None = option(None, parse=size, metavar="SIZE", shown="none: not checked",
                                     help="host memory free on rank 0's node, for a full save, e.g. 1T")
    mtbf_hours: float | None = option(None, parse=hours, shown="none: no Young/Daly interval",
                                      help="the job's mean time between failures, for the Young/Daly interval, e.g. 24")
    ckpt_interval: float = option(1800.0, parse=duration("30min", allow_zero=False), shown="30min",
                                  help="checkpoint interval for the bandwidth needed, and the job's (--steps) without "
                                       "--ckpt-every")
    ckpt_overhead: float = option(0.05, parse=overhead_fraction, shown="5%",
                                  help="share of time a blocking save may cost")

    def check(self) -> None:
        for sd in self.state_dict:
            fs.save_format(sd, self.save_format)


@dataclass
class Loading:
    TITLE: ClassVar[str] = "data and model loading"
    dataload: list[NamedRecord] = option([], parse=named_record, repeat=True, metavar="[NAME=]RECORD", shown="none",
                                         help="a `microbench dataload` record: the loader's rate per rank (repeatable)")
    data_rate: list[DataRate] = option([], parse=data_rate, repeat=True, metavar="NAME=SAMPLES/S",
                                                shown="none",
                                                help="a described loader rate per rank, prefetching, e.g. --data-rate "
                                                     "s3=900 (repeatable)")
    sample_bytes: Typed | None = option(None, parse=sample_bytes, metavar="SIZE", shown="the record's",
                                        help="bytes per training sample")
    modelload: list[NamedRecord] = option([], parse=named_record, repeat=True, metavar="[NAME=]RECORD", shown="none",
                                          help="a `microbench modelload` record: model load time at start and each "
                                               "restart (repeatable); every --tier/--storage with a read rate gives "
                                               "one too")


@dataclass
class Job:
    TITLE: ClassVar[str] = "the whole job (a timeline, the what-if per storage assignment, a recommendation)"
    steps: int | None = option(None, parse=count("80", MAX_STEPS), shown="none: no job",
                               help="train this many optimizer steps, e.g. 80 (asks for the job)")
    tokens: Typed | None = option(None, parse=tokens, shown="none: no job",
                                  help="or train this many tokens, e.g. 1e9 (steps rounded up)")
    ckpt_every: int | None = option(None, parse=count("5", MAX_STEPS), metavar="K", shown="from --ckpt-interval",
                                    help="a checkpoint every K steps")
    async_ckpt: bool = option(False, switch=True, shown="off",
                              help="async DCP saves: the staging copy blocks, the write drains")
    data: list[str] | None = option(None, parse=tier_names, metavar="TIER[,TIER]", shown="every tier the inputs allow",
                                    help="where batches come from: tier names, a comma list")
    model_from: list[str] | None = option(None, parse=tier_names, metavar="TIER[,TIER]",
                                          shown="every tier the inputs allow",
                                          help="where the model at start and after a restart comes from: tier names, "
                                               "a comma list")
    ckpt_to: list[str] | None = option(None, parse=tier_names, metavar="TIER[,TIER]",
                                       shown="every tier the inputs allow",
                                       help="where checkpoints go to: tier names, a comma list")

    @property
    def asked(self) -> bool:
        return self.steps is not None or self.tokens is not None

    def check(self) -> None:
        if not self.asked:
            given = [f for f, v in (("--ckpt-every", self.ckpt_every), ("--data", self.data),
                                    ("--model-from", self.model_from), ("--ckpt-to", self.ckpt_to),
                                    ("--async-ckpt", self.async_ckpt or None)) if v is not None]
            if given:
                raise UsageError(f"{given[0]} describes a job: give its length too, e.g. --steps 80 (or --tokens 1e9)")
        elif self.steps is not None and self.tokens is not None:
            raise UsageError(f"--steps {self.steps} and --tokens {self.tokens.text} both give the job's length; give "
                             f"one, e.g. --steps 80")


@dataclass
class Output:
    TITLE: ClassVar[str] = "output"
    json: str | None = option(None, metavar="PATH", record=False, shown="results/compose-TIME.json",
                              help="write the compose record here")
    csv: str | None = option(None, metavar="PATH", record=False, shown="none",
                             help="also write the predictions as CSV rows")
    results_dir: str = option("results", metavar="DIR", record=False, help="where the record goes without --json")


@dataclass
class ComposeOptions:
    """Everything `microbench compose` is asked, typed."""
    model: Model = field(default_factory=Model)
    training: Training = field(default_factory=Training)
    compute: Compute = field(default_factory=Compute)
    network: Network = field(default_factory=Network)
    sharding: Sharding = field(default_factory=Sharding)
    storage: Storage = field(default_factory=Storage)
    loading: Loading = field(default_factory=Loading)
    job: Job = field(default_factory=Job)
    output: Output = field(default_factory=Output)

    def check(self) -> None:
        c, t = self.compute, self.training
        if c.measured_step is None:
            return
        if c.gpu is None:
            raise UsageError(f"--measured-step {c.measured_step:g} scales a GPU's kernel rates: name the GPU it was "
                             f"measured on, e.g. --gpu h100")
        if t.nodes is None and t.gpus_per_node is None and t.ranks is None:
            raise UsageError(
                f"--measured-step {c.measured_step:g} needs the configuration it was measured on: give "
                f"its --nodes and --gpus-per-node (and --micro-batch, --seq-len as it ran), e.g. --nodes 1 "
                f"--gpus-per-node 8"
            )

"""Real torch.distributed.checkpoint (DCP) saves and loads of a synthetic sharded state dict.

The state dict looks like an FSDP2 model's: `ceil(size / 64 MiB)` 2-D tensors, each a DTensor
sharded by rows (Shard(0)) over every rank, plus a small non-tensor entry. `--size` is the total
across ranks, split evenly, so each rank writes and reads size / N bytes (rounded down to whole
rows). Element values follow a known pattern, so a load can be checked element by element.
With `items` (checkpoint_layout.Item, e.g. verify's FSDP model and optimizer state) the state
instead mirrors that layout item by item: the same top-level keys, tensor shapes, sharding and
order, with synthetic values, because what an S3 load costs depends on them (see that module).

Cases, each timed from a barrier to this rank's return; the runner reports the slowest rank:
  save        dcp.save into a fresh directory (the previous one is removed first, untimed).
  async_save  dcp.async_save: `blocked` is until the call returns (staging copy; training could
              go on), `durable` until its future completes (files written and synced).
  load        dcp.load into preallocated tensors after evicting the checkpoint's cached pages.
write_gbps / read_gbps = total checkpoint bytes (all ranks) / slowest rank's time, 1e9 B/s.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from ...core.errors import RunError, UsageError
from ...core.probe import Case, Probe, Timed
from ...core.registry import Needs, ProbeSpec, SuiteStep, SweepDefaults
from ...core.units import DTYPE_BYTES, DTYPES
from ...results.schema import ProbeRow
from ...targets.mount import facts as mount_facts
from ...world.dist import World
from .config import ROW_ELEMS, Config, layout, validate
from .dcp_errors import _dcp_cause, _local, _result, _was_interrupted
from .durable import timed_save
from .run import print_report, run as run_command
from .staging_clock import StagingClock
from .state_layout import Item, layout_bytes, shard_rows, tensor_count

PATTERN_PERIOD = 251       # values 0..250 are exact in float32, bfloat16 and float16
ELEM = DTYPE_BYTES         # bytes per element, by dtype name (commands/checkpoint.py reads it)


class _CheckpointRequired(ProbeRow):
    ranks: int
    bytes_per_rank: int
    tensors: int
    dtype: str


class CheckpointRow(_CheckpointRequired, total=False):
    write_gbps: float               # save, async_save
    read_gbps: float                # load
    blocked_time_us: float          # async_save: the training loop's wait
    durable_time_us: float          # async_save, or a save through a bucket mount: until storage held it all
    staging_time_us: float          # async_save: of the blocked time, DCP's copy of the state into CPU memory
    staging_make_time_us: float     # of which making the staged tensors (torch's _create_cpu_state_dict)
    staging_copy_time_us: float     # of which copying the state into them (torch's _copy_state_dict)
    checked_by: str                 # save: the load case right after reads (and checks) its checkpoint
    # --state-dict full (probes/checkpoint/full.py), rank 0's parts, medians over iterations:
    gather_time_us: float           # save: get_model_state_dict(full_state_dict, cpu_offload)
    serialize_write_time_us: float  # save: torch.save / safetensors into the file
    fsync_time_us: float            # save: fsync (directory) or the upload's completion (S3)
    read_time_us: float             # load: rank 0 reads the file
    scatter_time_us: float          # load: set_model_state_dict(broadcast_from_rank0)
    durable_gbps: float             # save through a mount: total bytes / durable time
    blocked_is_durable: bool        # a direct mount: close returned after the upload


def effective_size(size_bytes: int, nranks: int, elem: int) -> int:
    return sum(layout(size_bytes, nranks, elem)) * ROW_ELEMS * elem * nranks


class CheckpointProbe(Probe):
    name = "checkpoint"

    def __init__(self, config: Config, world: World, run_dir: Any):
        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.device_mesh import init_device_mesh

        if config.dtype not in DTYPES:
            raise UsageError(f"invalid --dtype {config.dtype!r}: expected one of {', '.join(DTYPES)}")
        self.config, self.world, self.run_dir = config, world, run_dir
        # DCP logs every failure with a traceback per rank; the one-line RunError carries the cause.
        logging.getLogger("torch.distributed.checkpoint").setLevel(logging.CRITICAL)
        self.torch, self.dcp = torch, dcp
        self.dtype = getattr(torch, config.dtype)
        self.elem = ELEM[config.dtype]
        self.n, self.rank = world.size, world.rank
        self.entries = self._entries()
        self.size = layout_bytes([item for _group, _key, item in self.entries], self.n)
        self.device = torch.device(f"cuda:{torch.cuda.current_device()}" if config.device == "cuda" else "cpu")
        self.mesh = init_device_mesh(self.device.type, (self.n,))
        # DCP's planning exchanges small objects; the gloo control group keeps them off NCCL.
        self.group = world.control
        self.state = self._make_state(fill=True)
        self.dest: dict[str, Any] | None = None
        self.step = 0
        self.last_step: str | None = None
        self.cache_note = "not applicable"
        self.full = None
        if config.state_dict == "full":
            from .full import FullState

            self.full = FullState(self)
        # A bucket mount under a local target: the record says so, and saves also time durability.
        self.mount = mount_facts.facts_for_path(run_dir.root) if run_dir.target.kind == "local" else None
        if self.mount and self.mount.get("mount_name") and self.rank == 0:
            mount_facts.store_client(self.mount["mount_point"])   # made now, not inside a timed drain

    # ------------------------------------------------------------------ state dicts
    def _entries(self) -> list[tuple[str | None, str, Item]]:
        """(top-level key or None, key, item) for each entry of the state dict, in its order."""
        if self.config.items:
            return [(item.group, f"{i:05d}", item) for i, item in enumerate(self.config.items)]
        rows = layout(self.config.size_bytes, self.n, self.elem, self.config.tensors)
        # Zero-padded: dcp.load reads top-level keys sorted, dcp.save writes them in insertion
        # order; "layers.10" sorting before "layers.2" made S3 loads read out of file order.
        width = len(str(len(rows) - 1))
        head: list[tuple[str | None, str, Item]] = [(None, "step", Item("", "object"))]
        return head + [
            (None, f"layers.{i:0{width}d}.weight", Item("", "shard", (r * self.n, ROW_ELEMS), self.config.dtype))
            for i, r in enumerate(rows)]

    def _pattern(self, index: int, first: int, count: int, dtype: Any) -> Any:
        """Element e of entry `index` (global flat position first + e) holds
        (first + e + 7 * index) mod PATTERN_PERIOD: one period tiled in the target dtype (an int64
        arange and modulo over 128 MiB took seconds)."""
        torch = self.torch
        offset = (first + 7 * index) % PATTERN_PERIOD
        period = torch.arange(PATTERN_PERIOD, dtype=torch.float32).to(dtype)
        tiled = period.repeat(-(-(count + offset) // PATTERN_PERIOD))[offset:offset + count]
        # clone: its own storage, exactly the shard (a view would carry the whole tiled buffer).
        return tiled.clone().to(self.device)

    def _leaf(self, index: int, item: Item, fill: bool) -> Any:
        from torch.distributed.tensor import DTensor, Shard

        torch = self.torch
        if item.kind == "object":
            return 1000 + index if fill else 0
        dtype = getattr(torch, item.dtype)
        if item.kind == "replicate":
            count, first, shape = math.prod(item.shape), 0, item.shape
        else:
            start, rows = shard_rows(item.shape[0], self.n, self.rank)
            inner = math.prod(item.shape[1:])
            count, first, shape = rows * inner, start * inner, (rows, *item.shape[1:])
        local = (self._pattern(index, first, count, dtype) if fill
                 else torch.zeros(count, dtype=dtype, device=self.device)).view(shape)
        if item.kind == "replicate":
            return local
        stride = tuple(math.prod(item.shape[d + 1:]) for d in range(len(item.shape)))
        return DTensor.from_local(local, self.mesh, [Shard(0)], run_check=False,
                                  shape=torch.Size(item.shape), stride=stride)

    def _make_state(self, fill: bool) -> dict[str, Any]:
        state: dict[str, Any] = {}
        for index, (group, key, item) in enumerate(self.entries):
            holder = state if group is None else state.setdefault(group, {})
            holder[key] = self._leaf(index, item, fill)
        return state

    def _zero(self, state: dict[str, Any]) -> None:
        for group, key, item in self.entries:
            holder = state if group is None else state[group]
            if item.kind == "object":
                holder[key] = 0
            else:
                _local(holder[key]).zero_()

    def _count_wrong(self, state: dict[str, Any]) -> int:
        # self.state holds the pattern (remade after async_save's scribble test), so it is the
        # reference: regenerating the pattern cost ~1 s per check for 128 MiB per rank.
        wrong = 0
        for group, key, item in self.entries:
            got = (state if group is None else state[group])[key]
            want = (self.state if group is None else self.state[group])[key]
            if item.kind == "object":
                wrong += int(got != want)
                continue
            got, want = _local(got), _local(want)
            if not self.torch.equal(got, want):
                wrong += int((got != want).sum().item())
        return wrong

    @property
    def tensors(self) -> int:
        return tensor_count([item for _g, _k, item in self.entries])

    # ------------------------------------------------------------------ the contract
    def implementation(self) -> dict[str, Any]:
        return {"engine": "torch.distributed.checkpoint", "backend": self.config.backend, "device": self.device.type,
                "state_dict": (f"{self.tensors} tensors mirroring a given state's layout (shapes, sharding, order)"
                               if self.config.items
                               else f"{self.tensors} DTensors sharded Shard(0) over {self.n} ranks"),
                "size_meaning": "total bytes across all ranks, split evenly",
                "bytes_per_rank": self.size // self.n, "thread_count": self.config.thread_count,
                "async_checkpointer": "thread (dcp.async_save default)" if self.config.async_save else None,
                "state_dict_type": "sharded", "save_format": "dcp",
                **self.run_dir.implementation(), **(self.mount or {}),
                **(self.full.implementation() if self.full else {})}

    def cases(self) -> list[Case]:
        ops = ["save"] + (["async_save"] if self.config.async_save else []) + ["load"]
        return [Case(op, self.size) for op in ops]

    def row_fields(self, case: Case) -> dict[str, Any]:
        return {"ranks": self.n, "bytes_per_rank": self.size // self.n, "tensors": self.tensors,
                "dtype": self.config.dtype}

    def prepare(self, case: Case) -> None:
        if case.op == "load":
            # The save case before keeps its last checkpoint (release); only without one is a
            # checkpoint written here (untimed) to load from.
            if self.last_step is None:
                self._fresh_step()
                if self.full:
                    self.full.save()
                    self.full.prepare_load()
                    return
                self._guard("save", lambda: self.dcp.save(self.state, storage_writer=self._writer(),
                                                          process_group=self.group))
            if self.full:
                self.full.prepare_load()
            else:
                self.dest = self._make_state(fill=False)

    def run_once(self, case: Case) -> Timed:
        if self.full:
            if case.op == "load":
                return Timed(*self.full.load())
            self._fresh_step()
            return Timed(*self.full.save())
        if case.op == "load":
            return self._timed_load()
        self._fresh_step()
        writer = self._writer()
        self.world.barrier()
        start = time.perf_counter()
        if case.op == "save":
            self._guard("save", lambda: self.dcp.save(self.state, storage_writer=writer, process_group=self.group))
            if self.mount is not None and self.mount.get("mount_name"):
                return timed_save(self.world, self.run_dir.sub(self.last_step), self.mount, start,
                                  time.perf_counter() - start, case.size_bytes, self.config.timeout_s)
            return Timed(time.perf_counter() - start)
        with StagingClock(writer) as staging:
            future = self._guard("async_save", lambda: self.dcp.async_save(
                self.state, storage_writer=writer, process_group=self.group))
        blocked = time.perf_counter() - start
        self._guard("async_save", lambda: _result(future))
        durable = time.perf_counter() - start
        every = self.world.all_gather_object({"blocked": blocked, "durable": durable, **staging.spent})
        # Training waits for the rank that returns last: its blocked time and what it spent it on.
        slowest = max(every, key=lambda one: one["blocked"])
        names = {"blocked": "blocked_time_us", "stage": "staging_time_us", "make": "staging_make_time_us",
                 "copy": "staging_copy_time_us"}
        return Timed(durable, {"durable_time_us": max(one["durable"] for one in every) * 1e6,
                               **{column: slowest[key] * 1e6 for key, column in names.items() if key in slowest}})

    def _timed_load(self) -> Timed:
        assert self.dest is not None and self.last_step is not None
        self._zero(self.dest)
        self.sync()
        if self.rank == 0:
            self.cache_note = self.run_dir.drop_page_cache(self.last_step)
        reader = self.run_dir.reader(self.last_step)
        self.world.barrier()
        start = time.perf_counter()
        self._guard("load", lambda: self.dcp.load(self.dest, storage_reader=reader, process_group=self.group))
        self.sync()
        return Timed(time.perf_counter() - start)

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def checked_by(self, case: Case) -> str | None:
        # The load case right after a save reads that save's last checkpoint (release keeps it)
        # and checks every byte it loaded: a full DCP load here first would read the same
        # objects once more, seconds on S3, to learn nothing new.
        ops = [c.op for c in self.cases()]
        after = ops.index(case.op) + 1
        return "load" if case.op == "save" and after < len(ops) and ops[after] == "load" else None

    def check(self, case: Case) -> int:
        if case.op == "load":
            # The last timed load's own result: the bytes that were measured are the ones checked.
            assert self.dest is not None
            return self._count_wrong(self.dest)
        if case.op == "async_save":
            # Training goes on while the save drains: scribble over the live tensors right after
            # async_save returns. The checkpoint must still hold the values from the call.
            self._fresh_step()
            future = self._guard("async_save", lambda: self.dcp.async_save(
                self.state, storage_writer=self._writer(), process_group=self.group))
            for group, key, item in self.entries:
                value = (self.state if group is None else self.state[group])[key]
                if item.kind != "object":
                    _local(value).fill_(-1)
            self._guard("async_save", lambda: _result(future))
            self.state = self._make_state(fill=True)
        dest = self._make_state(fill=False)
        self._guard("load", lambda: self.dcp.load(dest, storage_reader=self.run_dir.reader(self.last_step),
                                                  process_group=self.group))
        return self._count_wrong(dest)

    def release(self, case: Case) -> None:
        self.dest = None
        if case.op != "load" and self.cases()[-1].op == "load" and self.last_step is not None:
            return  # the load case reads this checkpoint instead of writing its own
        self.world.barrier()
        if self.rank == 0 and self.last_step is not None:
            self.run_dir.remove_sub(self.last_step)
        self.last_step = None
        self.world.barrier()

    def abandon(self, case: Case) -> None:
        # No barrier: a peer still inside DCP's load (where a Ctrl-C during the load case can
        # leave it) would wait on it until --timeout. The step left on the target goes with the
        # run directory, which rank 0 removes on the way out.
        self.dest = None
        self.last_step = None

    def metrics(self, case: Case, time_s: float) -> dict[str, Any]:
        gbps = case.size_bytes / time_s / 1e9
        return {"read_gbps": gbps} if case.op == "load" else {"write_gbps": gbps}

    def summarize(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {"page_cache_before_load": self.cache_note}
        by_op = {row["op"]: row for row in rows}
        if "async_save" in by_op:
            row = by_op["async_save"]
            out["async_blocked_fraction"] = row["blocked_time_us"] / max(row["durable_time_us"], 1e-9)
        return out

    # ------------------------------------------------------------------ helpers
    def _fresh_step(self) -> None:
        """Each save goes to a new directory, as training writes step_N; the previous one is
        removed first (untimed) so the run never holds more than one checkpoint."""
        self.world.barrier()
        if self.rank == 0 and self.last_step is not None:
            self.run_dir.remove_sub(self.last_step)
        self.step += 1
        self.last_step = f"step-{self.step}"
        self.world.barrier()

    def _writer(self) -> Any:
        assert self.last_step is not None
        return self.run_dir.writer(self.last_step, self.config.thread_count)

    def _guard(self, what: str, fn: Any) -> Any:
        """DCP gathers every rank's exception into one CheckpointException; report the first
        cause as one line naming the target. CheckpointException is a BaseException, and a
        Ctrl-C inside DCP comes back wrapped in one (from this rank or a peer): that is an
        interrupt, not a storage failure."""
        try:
            return fn()
        except (RunError, KeyboardInterrupt, SystemExit, GeneratorExit):
            raise
        except BaseException as exc:
            if _was_interrupted(exc):
                raise KeyboardInterrupt from None
            raise RunError(f"checkpoint {what} to {self.run_dir.display} failed: {_dcp_cause(exc)}") from None




SPEC = ProbeSpec(
    name="checkpoint", command=("checkpoint",), order=60,
    help="torch.distributed.checkpoint save/load (and async save) throughput",
    description="Save and load a synthetic sharded state dict with torch.distributed.checkpoint across N ranks (gloo "
                "on CPU, NCCL with CUDA tensors on GPUs) to a directory or an s3:// prefix; time the slowest rank "
                "and report GB/s. --size is the total across ranks, split evenly.",
    metrics=("write_gbps", "read_gbps"), config=Config,
    build=lambda config, context: CheckpointProbe(config, context.world, context.run_dir),
    row_schema=CheckpointRow, validate=validate, run=run_command, printer=print_report,
    sweep=SweepDefaults(warmup=1, iters=3, budget_s=30.0, check=True, check_flag=True),
    needs=Needs(world=True, target=True, s3=True), aliases=(),
    case_keys=("dtype",), identity_keys=("backend", "storage"), feeds=("tier",),
    # No --nproc: the default is 2 CPU ranks, or one rank per GPU (a 1-GPU host cannot run 2 GPU ranks).
    suite=(SuiteStep("checkpoint", ("--size", "256M", "--target", "{path}"), ops=("save", "load")),
           SuiteStep("checkpoint s3", ("--size", "256M", "--target", "s3://microbench/ckpt"), ops=("save", "load"))),
)

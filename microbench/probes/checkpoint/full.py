"""The checkpoint probe's full state dict path: a save as Hugging Face Accelerate/Trainer writes
one with `fsdp_state_dict_type: FULL_STATE_DICT`, and its load.

Save (timed from a barrier to the moment rank 0's file is durable and every rank knows it):
  gather           get_model_state_dict(full_state_dict=True, cpu_offload=True): every shard
                   sent to rank 0, which holds the whole state in host memory; the other ranks
                   get nothing (that is what cpu_offload does in torch).
  serialize_write  rank 0 alone: torch.save of the whole dict to one file (or, --format
                   safetensors, safetensors of its tensors), buffered, the way a trainer writes.
  fsync            rank 0: fsync of the file (a directory), or the close that completes the
                   multipart upload (S3): until then the bytes are not durable.
Load: rank 0 reads the file (torch.load / safetensors), then set_model_state_dict
(full_state_dict=True, broadcast_from_rank0=True) scatters each tensor to its owners' shards.

The state is the probe's own sharded state (the same DTensors a DCP save writes), wrapped in a
module as parameters so the trainer's own call gathers it. Non-tensor entries ride along in the
file (safetensors: as JSON in its metadata). This module holds no probe class: the probe
(probes/checkpoint/__init__.py) hands itself over, so nothing here imports the package back.
"""

from __future__ import annotations

import io
import json
import os
import signal
import time
from typing import Any

from ...core.errors import RunError

FILE = {"torch": "state.pt", "safetensors": "model.safetensors"}
# A test hook: the rank named here is killed (SIGKILL) right before the first gather, as a rank
# that dies mid-save is; the fault tests use it to hit the gather exactly.
DIE_IN_GATHER_ENV = "MICROBENCH_TEST_DIE_IN_GATHER"


class FullState:
    """The full-state save and load of one CheckpointProbe (`probe`: its world, run directory,
    entries, state and pattern check)."""

    def __init__(self, probe: Any):
        import torch

        self.probe, self.torch = probe, torch
        self.format = probe.config.save_format or "torch"
        self.source = self._module(probe.state)
        self.dest_state: dict[str, Any] | None = None
        self.dest: Any = None

    # ------------------------------------------------------------------ the state as a module
    def _module(self, state: dict[str, Any]) -> Any:
        """A module whose parameters (sharded) and buffers (replicated) are the state's tensors,
        sharing their storage: a load into it writes straight into `state`."""
        torch = self.torch
        module = torch.nn.Module()
        for index, (group, key, item) in enumerate(self.probe.entries):
            if item.kind == "object":
                continue
            value = (state if group is None else state[group])[key]
            if item.kind == "replicate":
                module.register_buffer(_name(index), value)
            else:
                module.register_parameter(_name(index), torch.nn.Parameter(value, requires_grad=False))
        return module

    def _objects(self, state: dict[str, Any]) -> dict[str, Any]:
        return {_name(i): (state if g is None else state[g])[k]
                for i, (g, k, item) in enumerate(self.probe.entries) if item.kind == "object"}

    def _set_objects(self, state: dict[str, Any], objects: dict[str, Any]) -> None:
        for i, (g, k, item) in enumerate(self.probe.entries):
            if item.kind == "object":
                (state if g is None else state[g])[k] = objects[_name(i)]

    # ------------------------------------------------------------------ where the file goes
    def _path(self, sub: str) -> str:
        run_dir = self.probe.run_dir
        if run_dir.target.kind == "local":
            return os.path.join(run_dir.sub(sub), FILE[self.format])
        return f"{run_dir.root}/{sub}/{FILE[self.format]}"

    def implementation(self) -> dict[str, Any]:
        local = self.probe.run_dir.target.kind == "local"
        return {"engine": f"get_model_state_dict(full_state_dict, cpu_offload) + "
                          f"{'torch.save' if self.format == 'torch' else 'safetensors'} on rank 0",
                "state_dict_type": "full", "save_format": self.format,
                "storage": "one buffered file (open/write)" if local else "one s3fs object (multipart upload)",
                "durable_when": "fsync of the file" if local else "the object's upload completed at close",
                "load": "rank 0 reads the file, set_model_state_dict(full_state_dict, broadcast_from_rank0)"}

    # ------------------------------------------------------------------ save
    def save(self) -> tuple[float, dict[str, Any]]:
        """One timed save into the probe's current step; (seconds, rank 0's parts)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        probe, world = self.probe, self.probe.world
        path = self._path(probe.last_step)
        if world.rank == 0 and probe.run_dir.target.kind == "local":
            os.makedirs(os.path.dirname(path), exist_ok=True)
        world.barrier()
        die = os.environ.get(DIE_IN_GATHER_ENV)
        if die is not None and int(die) == world.rank:
            os.kill(os.getpid(), signal.SIGKILL)
        start = time.perf_counter()
        full = get_model_state_dict(self.source, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        gathered = time.perf_counter()
        parts: dict[str, Any] = {}
        if world.rank == 0:
            written, durable = self._write(full, path)
            parts = {"gather_time_us": (gathered - start) * 1e6, "serialize_write_time_us": (written - gathered) * 1e6,
                     "fsync_time_us": (durable - written) * 1e6}
        del full
        world.barrier()   # the others wait for rank 0's file, as a trainer's ranks do
        return time.perf_counter() - start, parts

    def _write(self, full: dict[str, Any], path: str) -> tuple[float, float]:
        objects = self._objects(self.probe.state)
        if self.probe.run_dir.target.kind == "local":
            try:
                if self.format == "torch":
                    self.torch.save({"tensors": full, "objects": objects}, path)
                else:
                    from safetensors.torch import save_file

                    save_file(full, path, metadata={"objects": json.dumps(objects)})
                written = time.perf_counter()
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as exc:
                raise RunError(f"full state dict save to {path} failed: {exc.strerror or exc}") from None
            return written, time.perf_counter()
        fs = self.probe.run_dir.fs()
        try:
            handle = fs.open(path, "wb")
            if self.format == "torch":
                self.torch.save({"tensors": full, "objects": objects}, handle)
            else:
                from safetensors.torch import save

                handle.write(save(full, metadata={"objects": json.dumps(objects)}))
            written = time.perf_counter()
            handle.close()    # the last part's upload and the multipart completion
        except Exception as exc:
            raise RunError(f"full state dict save to s3://{path} failed: {type(exc).__name__}: "
                           f"{str(exc).strip()[:200]}") from None
        return written, time.perf_counter()

    # ------------------------------------------------------------------ load
    def prepare_load(self) -> None:
        self.dest_state = self.probe._make_state(fill=False)
        self.dest = self._module(self.dest_state)
        self.probe.dest = self.dest_state   # the probe's check counts wrong elements in it

    def load(self) -> tuple[float, dict[str, Any]]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        probe, world = self.probe, self.probe.world
        assert self.dest_state is not None and probe.last_step is not None
        probe._zero(self.dest_state)
        if world.rank == 0:
            probe.cache_note = probe.run_dir.drop_page_cache(probe.last_step)
        world.barrier()
        start = time.perf_counter()
        full, objects = self._read(self._path(probe.last_step)) if world.rank == 0 else ({}, None)
        read = time.perf_counter()
        set_model_state_dict(self.dest, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        del full
        self._set_objects(self.dest_state, world.broadcast_object(objects))
        probe.sync()
        done = time.perf_counter()
        parts = (
            {"read_time_us": (read - start) * 1e6, "scatter_time_us": (done - read) * 1e6} if world.rank == 0 else {}
        )
        return done - start, parts

    def _read(self, path: str) -> tuple[dict[str, Any], dict[str, Any]]:
        local = self.probe.run_dir.target.kind == "local"
        try:
            if local:
                if self.format == "torch":
                    saved = self.torch.load(path, map_location="cpu", weights_only=True)
                    return saved["tensors"], saved["objects"]
                from safetensors import safe_open

                with safe_open(path, framework="pt") as handle:
                    objects = json.loads(handle.metadata()["objects"])
                    return {k: handle.get_tensor(k) for k in handle.keys()}, objects
            data = self.probe.run_dir.fs().cat_file(path)
            if self.format == "torch":
                saved = self.torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
                return saved["tensors"], saved["objects"]
            from safetensors.torch import load

            header = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])
            return load(data), json.loads(header["__metadata__"]["objects"])
        except (OSError, RuntimeError, KeyError, ValueError) as exc:
            where = path if local else f"s3://{path}"
            raise RunError(f"full state dict load from {where} failed: {type(exc).__name__}: "
                           f"{str(exc).strip()[:200]}") from None


def _name(index: int) -> str:
    return f"t{index:05d}"

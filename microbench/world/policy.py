"""Running a command's body across a world: the policy on top of launch.py's and dist.py's mechanics.

What belongs here: what a measuring command decides about its world — how many local ranks by
default (one per GPU, else 2), how much memory they may plan on, which device each rank sets,
the backend's environment, when start-up checks run (`in_world`'s `before_launch`), and what
the record says about the transport. It knows `BackendChoice` and torch devices.

What belongs in launch.py and dist.py: the world itself, with no opinion on devices or commands —
reading a launcher's variables and launching local ranks (launch.py, supervised by supervisor.py),
joining (dist.py's `World`: process group, gloo control group, heartbeats), bounded waits. The
runner's needs (a world among them) come here through `in_world`; nothing else calls
launch.launch_local or builds a World.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

from ..core.errors import Interrupted, RunError, UsageError
from . import interrupts
from .backends import BackendChoice
from .dist import World
from .launch import RankLaunch, check_local_world, detect_world, launch_local


def local_ranks(default_gpus: bool = True) -> int:
    """Default --nproc: one rank per GPU, else 2."""
    count = gpu_count() if default_gpus else 0
    return count if count > 0 else 2


def gpu_count() -> int:
    """GPUs torch can see here, 0 without CUDA. torch.cuda.device_count() asks NVML or the
    runtime's device count, neither of which creates a CUDA context in this process."""
    from .backends import cuda_usable

    if not cuda_usable():
        return 0
    import torch

    return torch.cuda.device_count()


def check_gpu_ranks(local_world: int, gpus: int) -> None:
    """One local rank per GPU at most (exit 2): two ranks on one GPU share its memory and
    copy engines, and NCCL before 2.30 aborts them ("Duplicate GPU detected")."""
    if local_world > gpus:
        raise UsageError(f"invalid --nproc {local_world}: this host has {gpus} GPU(s) and each local rank needs "
                         f"its own; use --nproc {max(gpus, 1)} (the default: one rank per GPU), "
                         f"or --backend gloo for CPU ranks")


def local_gpu(local_rank: int, local_world: int, gpus: int) -> int:
    """The CUDA index of this rank's own GPU: its local rank, once the local world fits."""
    check_gpu_ranks(max(local_world, local_rank + 1), gpus)
    return local_rank


# Test-only: host memory read as this size free (e.g. 2G), so that a test can run a sweep whose
# largest cases do not fit without allocating gigabytes; as MICROBENCH_TEST_GPU hides a GPU.
TEST_FREE_MEMORY_ENV = "MICROBENCH_TEST_FREE_MEMORY"


def free_memory_bytes(device: str) -> int:
    """Free memory for one rank. A GPU's is read where a context already exists (in the rank,
    for its own `cuda:<i>`); the launcher uses gpu_free_bytes_without_context."""
    override = os.environ.get(TEST_FREE_MEMORY_ENV)
    if override and not device.startswith("cuda"):
        from ..core.units import parse_size

        return parse_size(override, what=TEST_FREE_MEMORY_ENV)
    if device.startswith("cuda"):
        import torch

        dev = torch.device(device)
        return int(torch.cuda.mem_get_info(dev.index if dev.index is not None else torch.cuda.current_device())[0])
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def gpu_free_bytes_without_context(count: int) -> list[int] | None:
    """Free bytes of CUDA devices 0..count-1 read through NVML, which creates no CUDA context: a
    context the launcher kept on GPU 0 for the whole run would hold ~500 MiB there and stop rank 0
    from starting under EXCLUSIVE_PROCESS. None when NVML cannot say (not installed, or
    CUDA_VISIBLE_DEVICES names devices NVML cannot map); each rank still checks its own GPU."""
    try:
        import pynvml
    except ImportError:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        pynvml.nvmlInit()
        try:
            names = [v.strip() for v in visible.split(",")][:count] if visible is not None else None
            out = []
            for index in range(count):
                if names is None:
                    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                elif index < len(names) and names[index].isdigit():
                    handle = pynvml.nvmlDeviceGetHandleByIndex(int(names[index]))
                elif index < len(names) and names[index].startswith(("GPU-", "MIG-")):
                    handle = pynvml.nvmlDeviceGetHandleByUUID(names[index])
                else:
                    return None
                out.append(int(pynvml.nvmlDeviceGetMemoryInfo(handle).free))
            return out
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVML raises its own error classes; any means "NVML cannot say"
        return None


def in_world(*, nproc: int, timeout_s: float, choice: BackendChoice,
             body: Callable[[World], int], before_launch: Callable[[], None] | None = None,
             per_rank: Callable[[int], RankLaunch] | None = None, master_addr: str = "127.0.0.1",
             argv: list[str] | None = None) -> int:
    """Run `body` on every rank. Outside a world, first launch `nproc` local ranks that re-run
    this same command line (they then take the world branch below)."""
    spec = detect_world()
    if spec is None:
        check_local_world(nproc)  # before the memory check, which scales with nproc
        if choice.device == "cuda" and per_rank is None:
            check_gpu_ranks(nproc, gpu_count())
        if before_launch:
            before_launch()
        return launch_local(nproc, argv if argv is not None else sys.argv[1:], timeout_s=timeout_s,
                            per_rank=per_rank, master_addr=master_addr, extra_env=choice.env)
    os.environ.update(choice.env)
    device = choice.device
    if choice.device == "cuda":
        import torch

        # The rank's own GPU, set before the world starts: NCCL binds its communicator to it, and
        # torch's init_process_group refuses a device_id without an index ("Please use a
        # device_id with index.", torch/distributed/distributed_c10d.py).
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE") or spec.local_rank + 1)
        index = local_gpu(spec.local_rank, local_world, torch.cuda.device_count())
        # On a lab every rank runs on this one machine, whatever its emulated node: its own GPU
        # is its index among them (lab/placement.py sets it).
        machine_index = os.environ.get("MICROBENCH_DEVICE_INDEX")
        if machine_index:
            index = local_gpu(int(machine_index), int(os.environ.get("MICROBENCH_MACHINE_RANKS") or 0),
                              torch.cuda.device_count())
        torch.cuda.set_device(index)
        device = f"cuda:{index}"
    try:
        world = World(spec, choice.backend, timeout_s, device=device)
    except RunError as exc:
        raise _with_hint(exc, choice) from None
    try:
        interrupts.check()  # a signal during start-up whose first raise a library swallowed
        code = body(world)
    except RunError as exc:
        world.close(failed=True)
        raise _with_hint(exc, choice) from None
    except BaseException:
        world.close(failed=True)
        raise
    world.close()
    return code


def _with_hint(exc: RunError, choice: BackendChoice) -> RunError:
    from .backends import transport_failure_hint

    hint = transport_failure_hint(choice)
    if not hint or hint in str(exc) or isinstance(exc, Interrupted):
        return exc
    return type(exc)(f"{exc}; {hint}")


def transport_note(choice: BackendChoice, nccl_log_dir: str | None) -> dict[str, Any]:
    """What the record says about the transport: asked for vs really used."""
    used = "tcp" if choice.backend == "gloo" else None
    if choice.backend == "nccl" and nccl_log_dir and os.path.isdir(nccl_log_dir):
        from .backends import nccl_transport_from_log

        text = ""
        for name in sorted(os.listdir(nccl_log_dir)):
            with open(os.path.join(nccl_log_dir, name), errors="replace") as handle:
                text += handle.read()
        used = nccl_transport_from_log(text)
    return {"transport_requested": choice.transport, "transport_used": used or "unknown",
            "socket_ifname": os.environ.get("GLOO_SOCKET_IFNAME") or os.environ.get("NCCL_SOCKET_IFNAME")}

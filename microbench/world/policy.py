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

from . import interrupts
from .backends import BackendChoice
from .dist import World
from .launch import RankLaunch, check_local_world, detect_world, launch_local


def local_ranks(default_gpus: bool = True) -> int:
    """Default --nproc: one rank per GPU, else 2."""
    from .backends import gpu_possible

    if default_gpus and gpu_possible():
        try:
            import torch

            if torch.cuda.is_available() and torch.cuda.device_count() > 0:
                return torch.cuda.device_count()
        except ImportError:
            pass
    return 2


def free_memory_bytes(device: str) -> int:
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info()[0])
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def in_world(*, nproc: int, timeout_s: float, choice: BackendChoice,
             body: Callable[[World], int], before_launch: Callable[[], None] | None = None,
             per_rank: Callable[[int], RankLaunch] | None = None, master_addr: str = "127.0.0.1",
             argv: list[str] | None = None) -> int:
    """Run `body` on every rank. Outside a world, first launch `nproc` local ranks that re-run
    this same command line (they then take the world branch below)."""
    spec = detect_world()
    if spec is None:
        check_local_world(nproc)  # before the memory check, which scales with nproc
        if before_launch:
            before_launch()
        return launch_local(nproc, argv if argv is not None else sys.argv[1:], timeout_s=timeout_s,
                            per_rank=per_rank, master_addr=master_addr, extra_env=choice.env)
    os.environ.update(choice.env)
    if choice.device == "cuda":
        import torch

        torch.cuda.set_device(spec.local_rank % max(1, torch.cuda.device_count()))
    world = World(spec, choice.backend, timeout_s, device=choice.device)
    try:
        interrupts.check()  # a signal during start-up whose first raise a library swallowed
        code = body(world)
    except BaseException:
        world.close(failed=True)
        raise
    world.close()
    return code


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

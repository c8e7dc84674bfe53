"""Saves through a bucket mount: the time training is blocked (dcp.save returns, every file
closed and fsynced through the mount) and the time until the store holds every byte (polled
over the S3 API by rank 0, never through the mount). On a cached mount the second is the one a
lost node cares about; on a direct mount close returns after the upload, so the two agree."""

from __future__ import annotations

from typing import Any

from ...core.errors import Interrupted, RunError
from ...core.probe import Timed
from ...targets.mount import facts as mount_facts
from ...world.dist import World


def timed_save(
    world: World,
    directory: str,
    mount: dict[str, Any],
    started_at: float,
    blocked_s: float,
    size_bytes: int,
    timeout_s: float,
) -> Timed:
    blocked = max(world.all_gather_object(blocked_s))
    outcome: tuple[str, Any] = ("ok", None)
    if world.rank == 0:
        try:
            durable = mount_facts.wait_durable(directory, started_at=started_at, timeout_s=timeout_s)
            outcome = ("ok", (durable.seconds, durable.durable_bytes))
        except Interrupted:
            raise
        except RunError as exc:
            outcome = ("error", str(exc))
    outcome = world.broadcast_object(outcome)
    if outcome[0] == "error":
        raise RunError(outcome[1] if world.rank == 0 else "rank 0 could not confirm the checkpoint durable")
    durable_s, durable_bytes = outcome[1]
    durable_s = max(durable_s, blocked)
    extra = {
        "blocked_time_us": blocked * 1e6,
        "durable_time_us": durable_s * 1e6,
        "durable_gbps": size_bytes / durable_s / 1e9,
        "blocked_is_durable": mount.get("mount_mode") == "direct",
    }
    return Timed(blocked_s, extra)

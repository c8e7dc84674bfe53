"""Checkpoint time per storage tier, and the bandwidth a checkpoint interval needs.

Bytes: parameters in the master dtype plus optimizer state (AdamW: two moments in float32)
plus a small fixed amount of other state. A save costs a fixed overhead plus bytes over the
tier's measured aggregate write bandwidth (the slowest rank finishes last, so per-rank shards
are assumed even). Async save blocks training only for the staging copy to host memory; the
drain to the tier must finish within the interval. Optimal interval by Young/Daly:
sqrt(2 x save time x MTBF).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ...core.errors import UsageError

OPTIMIZER_STATE_BYTES_PER_PARAM = {"adamw": 8, "sgd": 4, "none": 0}


@dataclass(frozen=True)
class CheckpointSpec:
    params: float
    master_dtype_bytes: int = 4
    optimizer: str = "adamw"
    extra_bytes: float = 0.0


def checkpoint_parts(params: float, param_dtype_bytes: int = 2, optimizer: str = "adamw") -> dict[str, float]:
    """What a training checkpoint holds, and the weights alone for comparison. The fp32 master
    weights are the sharded parameters FSDP2 keeps under mixed precision, so a DCP save of the
    training state is master + optimizer; `weights_bytes` (param dtype) is an inference export."""
    if optimizer not in OPTIMIZER_STATE_BYTES_PER_PARAM:
        raise UsageError(f"invalid optimizer {optimizer!r}: expected one of "
                         f"{', '.join(OPTIMIZER_STATE_BYTES_PER_PARAM)} (e.g. adamw)")
    master = 4.0 * params
    state = OPTIMIZER_STATE_BYTES_PER_PARAM[optimizer] * params
    return {"weights_bytes": param_dtype_bytes * params, "master_weights_bytes": master,
            "optimizer_state_bytes": state, "training_checkpoint_bytes": master + state}


def checkpoint_bytes(spec: CheckpointSpec) -> float:
    if spec.optimizer not in OPTIMIZER_STATE_BYTES_PER_PARAM:
        raise UsageError(f"invalid optimizer {spec.optimizer!r}: expected one of "
                         f"{', '.join(OPTIMIZER_STATE_BYTES_PER_PARAM)} (e.g. adamw)")
    per_param = spec.master_dtype_bytes + OPTIMIZER_STATE_BYTES_PER_PARAM[spec.optimizer]
    return spec.params * per_param + spec.extra_bytes


@dataclass(frozen=True)
class TierPrediction:
    tier: str
    write_gbps: float
    read_gbps: float | None
    save_s: float
    load_s: float | None
    async_blocked_s: float | None
    young_daly_interval_s: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def predict_tier(
    tier: str,
    total_bytes: float,
    write_gbps: float,
    read_gbps: float | None = None,
    fixed_s: float = 0.0,
    staging_gbps: float | None = None,
    mtbf_s: float | None = None,
) -> TierPrediction:
    if not (write_gbps > 0 and math.isfinite(write_gbps)) or (read_gbps is not None and not (
            read_gbps > 0 and math.isfinite(read_gbps))):
        raise UsageError(f"tier {tier!r} has bandwidth {write_gbps!r}:{read_gbps!r} GB/s; expected positive "
                         f"finite numbers, e.g. nvme=6:12")
    if mtbf_s is not None and not (mtbf_s > 0 and math.isfinite(mtbf_s)):
        raise UsageError(f"invalid MTBF {mtbf_s!r} s: expected a positive number of hours, e.g. --mtbf-hours 24")
    save = fixed_s + total_bytes / (write_gbps * 1e9)
    load = fixed_s + total_bytes / (read_gbps * 1e9) if read_gbps else None
    blocked = total_bytes / (staging_gbps * 1e9) if staging_gbps else None
    interval = math.sqrt(2 * save * mtbf_s) if mtbf_s else None
    return TierPrediction(tier, write_gbps, read_gbps, save, load, blocked, interval)


def required_write_gbps(total_bytes: float, interval_s: float, overhead_fraction: float) -> float:
    """Bandwidth so a blocking save every interval_s costs at most overhead_fraction of time."""
    if not interval_s > 0 or not 0 < overhead_fraction < 1:
        raise UsageError("interval must be positive and the overhead a fraction in (0, 1), e.g. 1800 s and 0.05")
    return total_bytes / (interval_s * overhead_fraction) / 1e9

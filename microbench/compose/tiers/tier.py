"""A storage tier as the composer uses it: where checkpoints are saved, batches read and the model
loaded from. Either described (`--tier NAME=WRITE[:READ][,...]`: a rated aggregate the whole job
gets) or measured (a storage or checkpoint record: its best write and read). It is a directory,
an object store (S3) or a bucket mount; durable unless it says ephemeral (a node-local disk a
restart on another node cannot read); a bucket mount says whether it is cached and how it drains.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..checkpoint.mount import MountTier

MEDIA = ("directory", "s3", "mount")


@dataclass(frozen=True)
class Tier:
    name: str
    write_gbps: float  # what a save sees: the aggregate write (a cached mount: its cache disk)
    read_gbps: float | None
    source: str  # "--tier ..." as typed, or "measured: PATH"
    stream_gbps: float | None = None  # one writer's rate (a full state dict's torch.save), when known
    rated_only: bool = False  # described by its rated aggregate alone (no stream=, not a mount)
    aggregate_is_job: bool = True  # write_gbps is what the whole job gets (described), not one run's own
    durable: bool = True
    described: bool = True  # False: measured by a record
    mount: MountTier | None = None  # a bucket mount: cached or direct, its drain
    note: str | None = None  # an assumption made reading it, said under the tables
    medium: str = ""  # one of MEDIA; "" when a described tier does not say

    @property
    def cached(self) -> bool:
        return self.mount is not None and self.mount.cached

    def as_dict(self) -> dict[str, Any]:
        """As compose's record keeps a tier ("durable" written for the described ones)."""
        out: dict[str, Any] = {
            "tier": self.name,
            "write_gbps": self.write_gbps,
            "read_gbps": self.read_gbps,
            "source": self.source,
            "stream_gbps": self.stream_gbps,
            "rated_only": self.rated_only,
            "aggregate_is_job": self.aggregate_is_job,
        }
        if self.described:
            out["durable"] = self.durable
        if self.note:
            out["note"] = self.note
        if self.mount is not None:
            out["mount"] = asdict(self.mount)
        return out

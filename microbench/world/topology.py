"""Which ranks share a node: the launcher's local world size gives the nodes.

Every launcher numbers a node's ranks consecutively (torchrun, srun's block distribution, mpirun
--map-by node:... aside), so with L ranks per node rank r is on node r // L and is the (r mod L)th
of it. The node groups are then [0..L), [L..2L), ... and the cross-node groups take one rank of
each node: {l, l+L, l+2L, ...} for every local index l. HSDP's 2-D mesh (replicate, shard) is
exactly this layout: shard within a row, replicate down a column.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..core.errors import UsageError

# Where each launcher states the ranks per node, first found wins. torchrun (and microbench's own
# local launch and lab) set LOCAL_WORLD_SIZE; Slurm sets SLURM_NTASKS_PER_NODE when the job asked
# for --ntasks-per-node; Open MPI OMPI_COMM_WORLD_LOCAL_SIZE; MPICH and Intel MPI MPI_LOCALNRANKS.
LOCAL_SIZE_VARIABLES = ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")


@dataclass(frozen=True)
class Topology:
    nodes: int
    ranks_per_node: int
    source: str  # the variable that gave ranks_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def node_groups(self) -> list[list[int]]:
        """One group per node: its ranks."""
        per = self.ranks_per_node
        return [list(range(n * per, (n + 1) * per)) for n in range(self.nodes)]

    def cross_groups(self) -> list[list[int]]:
        """One group per local index: that rank of every node."""
        per = self.ranks_per_node
        return [[n * per + local for n in range(self.nodes)] for local in range(per)]

    def to_dict(self) -> dict[str, object]:
        return {"nodes": self.nodes, "ranks_per_node": self.ranks_per_node, "from": self.source}


def topology(world_size: int, env: dict[str, str] | None = None) -> Topology:
    """The nodes of a world of `world_size` ranks from the launcher's local world size; a
    UsageError naming the variable to set when no launcher said, or when it does not divide."""
    env = dict(os.environ if env is None else env)
    for name in LOCAL_SIZE_VARIABLES:
        text = env.get(name, "").strip()
        if not text:
            continue
        try:
            per_node = int(text)
        except ValueError:
            raise UsageError(
                f"environment variable {name}={text!r} is not a whole number of ranks per node; expected e.g. {name}=8"
            ) from None
        if per_node < 1 or world_size % per_node:
            raise UsageError(
                f"{name}={per_node} ranks per node does not divide the world of {world_size} ranks "
                f"into whole nodes; set it to the ranks each node runs, e.g. LOCAL_WORLD_SIZE=8"
            )
        return Topology(world_size // per_node, per_node, name)
    raise UsageError(
        f"cannot tell the nodes of this world of {world_size} ranks: the launcher set none of "
        f"{', '.join(LOCAL_SIZE_VARIABLES)}; set the ranks per node, e.g. LOCAL_WORLD_SIZE=8 "
        f"(torchrun sets it; under srun use --ntasks-per-node)"
    )


def machine_ranks(env: dict[str, str] | None = None) -> int:
    """Ranks sharing this machine's cores and memory: every rank microbench launched here (on a
    lab, all hosts' ranks), else the launcher's local world size."""
    env = dict(os.environ if env is None else env)
    for name in ("MICROBENCH_MACHINE_RANKS", "LOCAL_WORLD_SIZE"):
        text = env.get(name, "").strip()
        if text.isdigit() and int(text) > 0:
            return int(text)
    return 1

"""The lab's own flags, each parsed and checked in one place: --hosts, --ranks-per-host, --delay."""

from __future__ import annotations

from typing import Any

from ..core.errors import UsageError
from ..core.units import parse_number
from .namespaces import MAX_HOSTS


def parse_hosts(text: Any) -> int:
    try:
        hosts = int(str(text).strip())
    except ValueError:
        raise UsageError(
            f"invalid --hosts {text!r}: expected a whole number of hosts from 2 to {MAX_HOSTS}, e.g. --hosts 2"
        ) from None
    if not 2 <= hosts <= MAX_HOSTS:
        raise UsageError(
            f"invalid --hosts {text!r}: a lab needs 2 to {MAX_HOSTS} hosts to have a link between them, e.g. --hosts 2"
        )
    return hosts


def parse_ranks_per_host(text: Any, hosts: int) -> int:
    """--ranks-per-host: a whole number >= 1 whose world (hosts x ranks) this machine can run."""
    from ..world.supervisor import local_world_limit

    try:
        per_host = int(str(text).strip())
    except ValueError:
        per_host = 0
    if per_host < 1:
        raise UsageError(
            f"invalid --ranks-per-host {text!r}: expected a whole number of ranks per host, 1 or "
            f"more, e.g. --ranks-per-host 2"
        )
    limit, rule = local_world_limit()
    if hosts * per_host > limit:
        raise UsageError(
            f"invalid --ranks-per-host {per_host}: {hosts} hosts x {per_host} = {hosts * per_host} "
            f"ranks, but this machine runs at most {limit} local ranks ({rule}); use "
            f"--ranks-per-host {max(1, limit // hosts)} or fewer"
        )
    return per_host


def parse_delay(text: Any) -> float:
    # A minute of one-way delay is far past any network worth emulating, and what tc accepts.
    return parse_number(
        str(text).strip().removesuffix("ms"),
        what="--delay",
        example="0.5",
        minimum=0.0,
        maximum=60_000.0,
        typed=str(text),
    )

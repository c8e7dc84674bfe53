"""What a failure in a world means, said in one line: the rank that died or froze (named by its
silent heartbeat), or the error of ours that a library wrapped in its own. Used by the runner's
sweep and by every command that runs collectives itself (hunt)."""

from __future__ import annotations

from ..core.errors import MicrobenchError
from ..world.dist import World


def dead_peers(world: World, reason: str) -> str | None:
    """'rank 1 died or stopped responding' when peers went silent (killed, frozen), else None.
    This rank leaves its own note first, so peers that merely saw the same failure are told
    apart from the dead one by theirs."""
    noted = world.note_failure(reason)
    missing = world.missing_ranks() if noted or world.rank == 0 else [0]
    if not missing:
        return None
    return f"rank {', '.join(str(r) for r in missing)} died or stopped responding"


def wrapped(exc: BaseException) -> MicrobenchError | None:
    """An error of ours that a library caught and wrapped in its own (botocore's HTTPClientError
    around an S3 request deadline): it says what happened better than the wrapper."""
    seen = exc.__cause__ or exc.__context__
    while seen is not None:
        if isinstance(seen, MicrobenchError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def diagnose(exc: BaseException, world: World | None, where: str = "") -> str:
    """What an error that is not ours (a gloo collective that broke, a socket) means in a
    world: the rank that died or froze, named by its silent heartbeat, else the error itself.
    `where`: " during <what>" for the message. Any command that runs collectives uses it."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    if world is None:
        return f"{type(exc).__name__}{where}: {first}"
    noted = world.note_failure(first)
    # A store (in rank 0) that does not take a note is a silent rank 0: nothing to settle.
    missing = world.missing_ranks() if noted or world.rank == 0 else [0]
    if missing:
        names = ", ".join(str(r) for r in missing)
        own = world.own_link_down()
        if own:  # the others went quiet because this rank is cut off
            return f"rank {world.rank} lost its own network link ({own}): rank {names} unreachable{where}"
        return f"rank {names} died or stopped responding{where} (no heartbeat, no error reported)"
    return f"collective failed{where}: {first}"
